//! The measuring code every DockNet benchmark uses: one code path, two stacks behind one
//! trait ([`net::Net`]): kernel sockets and DockLib sockets. [`report`] has the typed lines
//! `dnperf` prints; [`raw`] is the raw-frame peer with its typed [`raw::RawOutcome`].
//!
//! Wire format of a measurement connection: the client sends one mode byte (`r` ping-pong,
//! `s` stream), the message size and the warm-up in ms (u32 LE each). Ping-pong messages carry
//! `seq u32 | pad u32 | t0 u64 | t1 u64` at their start (t0: client's CLOCK_MONOTONIC at send,
//! t1: server's at receipt; all namespaces share the clock, so t1 - t0 and t2 - t1 are one-way
//! latencies). A stream ends with the client's FIN; the server answers with the bytes it
//! received and the nanoseconds between its first and last read, so goodput is measured at the
//! receiver.

#![deny(unsafe_code)]

pub mod net;
pub mod raw;
pub mod reach;
pub mod report;
pub mod stats;
pub mod workload;
