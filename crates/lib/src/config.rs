//! How a stack is set up: [`StackConfig`] and its defaults.

use crate::device::Faults;
use crate::stack::HALF_OPEN_TIMEOUT;
use docknet_pipe::IdlePolicy;
use std::time::Duration;

/// How a stack is set up.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// What a waiting call does between polls.
    pub idle: IdlePolicy,
    /// Receive buffer per TCP socket (bytes; above 64 KiB enables window scaling).
    pub tcp_rx_buffer: usize,
    /// Send buffer per TCP socket.
    pub tcp_tx_buffer: usize,
    /// Nagle's algorithm (off: lowest latency for request/response).
    pub nagle: bool,
    /// How long an acknowledgement may wait for data to ride on ([`ACK_DELAY`] by default;
    /// `None`: every segment is acknowledged at once). It never waits while the application
    /// sleeps: the stack sends what it held back before any wait ends in a sleep, so a reply
    /// made without sleeping carries the ACK and saves a frame each way.
    pub ack_delay: Option<Duration>,
    /// CUBIC congestion control (on) or none.
    pub congestion_control: bool,
    /// Connections that may wait to be accepted per listener (beyond it, connection requests
    /// are dropped and the client retries).
    pub backlog: usize,
    /// How long a half-open connection (its SYN answered, the handshake not completed) may
    /// hold one of a listener's sockets ([`HALF_OPEN_TIMEOUT`] by default; taken within 1 ms
    /// and a day).
    pub half_open_timeout: Duration,
    /// Compute and check checksums (off: every path is plain memory today).
    pub checksums: bool,
    /// How long `connect` waits.
    pub connect_timeout: Duration,
    /// Faults to inject into received frames (tests and experiments).
    pub faults: Option<Faults>,
    /// Send an established connection's bytes over a fast channel as records, outside TCP's
    /// segments, where the connection allows it (on by default: `DOCKNET_RECORDS=off` in the
    /// environment turns the default off; docs/design.md §8 "Records"). A stack takes records
    /// whatever this says.
    pub records: bool,
}

/// The default [`StackConfig::ack_delay`]: the longest an acknowledgement waits while the
/// application is busy without calling (a stream's every other full segment is acknowledged at
/// once, as RFC 9293 asks, and nothing waits while the application sleeps).
pub const ACK_DELAY: Duration = Duration::from_millis(1);

impl Default for StackConfig {
    fn default() -> StackConfig {
        StackConfig {
            idle: IdlePolicy::ADAPTIVE,
            tcp_rx_buffer: 256 * 1024,
            tcp_tx_buffer: 256 * 1024,
            nagle: false,
            ack_delay: Some(ACK_DELAY),
            congestion_control: true,
            backlog: 128,
            half_open_timeout: HALF_OPEN_TIMEOUT,
            checksums: false,
            connect_timeout: Duration::from_secs(10),
            faults: None,
            records: records_by_default(),
        }
    }
}

/// [`StackConfig::records`] by default: on, unless `DOCKNET_RECORDS` says `off` (or `0`).
fn records_by_default() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("DOCKNET_RECORDS").as_deref(),
            Ok("off" | "0" | "no" | "false")
        )
    })
}
