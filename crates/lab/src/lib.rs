//! The DockNet lab: DockNet measured side by side with the kernel's container networks, as a
//! library (the `docknet bench` and `docknet report` commands are thin wrappers).
//!
//! Data flows one way, and each layer imports only from the layers below it:
//!
//! ```text
//!  bench        options → plan → run → rows → summary, verdicts → files → report
//!  report       figures, HTML, Markdown, tables            (reads rows and verdicts)
//!  workload     runs a plan's points on a topology: dnperf, pairs, cross-check, raw
//!  topology     builds and removes a mode: kernel (ip, CNI, OVS), DockNet (daemon, pipes), probe
//!  proc, progress                                         processes; the progress bar
//!  mode, row, plan, summary, verdict, rate                pure data and pure functions
//! ```
//!
//! The bottom layer does no I/O: [`plan`] decides what runs, [`summary`] merges runs into
//! points, [`verdict`] judges them; their tests need no root.

#![deny(unsafe_code)]

pub mod bench;
pub mod cpustat;
pub mod http;
pub mod mode;
pub mod plan;
pub mod proc;
pub mod progress;
pub mod rate;
pub mod report;
pub mod row;
pub mod summary;
pub mod topology;
pub mod verdict;
pub mod workload;
pub mod xcore;

pub use mode::Mode;
pub use row::{Results, Row, Tool, Workload};
