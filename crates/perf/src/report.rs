//! What `dnperf` prints with `--json`: typed, so the lab reads it as types, never by key.

use crate::workload::{Outcome, Workload};
use serde::{Deserialize, Serialize};

/// Transport protocol of a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// Where and how a measurement ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnv {
    /// Kernel release.
    pub kernel: Option<String>,
    /// Cores of the machine.
    pub cores: usize,
    /// Core this process was pinned to.
    pub pinned_core: Option<usize>,
    /// `kernel` or `docknet`.
    pub stack: String,
    /// Idle policy (DockNet).
    pub idle: String,
    /// MTU of the link the measurement sent on, if known.
    pub mtu: Option<u32>,
    /// The command line.
    pub command: String,
    /// dnperf's version.
    pub version: String,
}

impl RunEnv {
    /// This process's environment.
    pub fn here(stack: &str, idle: &str, pinned_core: Option<usize>, mtu: Option<u32>) -> RunEnv {
        let u = nix::sys::utsname::uname().ok();
        RunEnv {
            kernel: u
                .as_ref()
                .map(|u| u.release().to_string_lossy().into_owned()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            pinned_core,
            stack: stack.into(),
            idle: idle.into(),
            mtu,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// A client's result line (`dnperf client ... --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientReport {
    /// Where it ran.
    pub env: RunEnv,
    /// What it measured.
    pub workload: Workload,
    /// Over which protocol.
    pub proto: Proto,
    /// Message size.
    pub size: usize,
    /// Measured seconds.
    pub duration_s: f64,
    /// Warm-up seconds (excluded).
    pub warmup_s: f64,
    /// The figures.
    pub result: Outcome,
}

/// `dnperf probe`'s line: CLOCK_MONOTONIC times in nanoseconds (one clock for every
/// namespace of the machine, so a caller compares them with its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// The go line arrived.
    pub go_ns: u64,
    /// The pipe was attached (its region mapped).
    pub attached_ns: u64,
    /// The TCP handshake through the pipe completed.
    pub connected_ns: u64,
}

/// A server's closing line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerReport {
    /// Always `server`.
    pub role: String,
    /// `kernel` or `docknet`.
    pub stack: String,
    /// Transactions (rr) or bytes (stream) handled.
    pub handled: u64,
}

/// `dnperf reach`'s line: CLOCK_MONOTONIC times in nanoseconds of the first answered TCP
/// connect and ICMP echo (one clock for every namespace of the machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReachReport {
    /// dnperf started trying (after attaching, on DockNet).
    pub start_ns: u64,
    /// The first TCP handshake completed.
    pub connect_ns: u64,
    /// The first echo reply arrived (`None`: not asked to ping).
    pub ping_ns: Option<u64>,
    /// Connects tried, the answered one included.
    pub connect_tries: u64,
    /// Echo requests sent, the answered one included.
    pub ping_tries: u64,
}
