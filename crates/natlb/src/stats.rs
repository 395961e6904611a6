//! The balancer's counters and the JSON it prints (on SIGTERM/SIGINT) and writes (`--stats`).

use crate::backend::{BackendCounters, Policy};
use crate::balancer::Balancer;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// Why a frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Headers cut short or inconsistent.
    Malformed,
    /// Not IPv4.
    NotIpv4,
    /// Not TCP.
    NotTcp,
    /// An IPv4 fragment.
    Fragment,
    /// Not addressed to the VIP.
    NotForVip,
    /// SYN together with RST or FIN.
    BadFlags,
    /// To a VIP port nobody serves.
    NoService,
    /// Belongs to no connection (answered with RST unless it was one).
    NoConnection,
    /// A SYN while no backend was available (answered with RST).
    NoBackend,
    /// A SYN while the table was full.
    TableFull,
    /// A SYN while no balancer port was free.
    NoPort,
    /// From a backend, for a connection pinned to another one.
    WrongBackend,
    /// For a connection whose backend was taken out.
    BackendOut,
    /// A backend's fast channel was full.
    BackendRingFull,
    /// The way to a client was full.
    ClientRingFull,
    /// Longer than the way out takes.
    TooBig,
    /// An answer to no probe in flight.
    StrayProbe,
}

impl Reason {
    /// Number of reasons.
    pub const COUNT: usize = 17;
    /// Every reason, in order.
    pub const ALL: [Reason; Reason::COUNT] = [
        Reason::Malformed,
        Reason::NotIpv4,
        Reason::NotTcp,
        Reason::Fragment,
        Reason::NotForVip,
        Reason::BadFlags,
        Reason::NoService,
        Reason::NoConnection,
        Reason::NoBackend,
        Reason::TableFull,
        Reason::NoPort,
        Reason::WrongBackend,
        Reason::BackendOut,
        Reason::BackendRingFull,
        Reason::ClientRingFull,
        Reason::TooBig,
        Reason::StrayProbe,
    ];

    /// Its name in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Malformed => "malformed",
            Reason::NotIpv4 => "not_ipv4",
            Reason::NotTcp => "not_tcp",
            Reason::Fragment => "fragment",
            Reason::NotForVip => "not_for_vip",
            Reason::BadFlags => "bad_flags",
            Reason::NoService => "no_service",
            Reason::NoConnection => "no_connection",
            Reason::NoBackend => "no_backend",
            Reason::TableFull => "table_full",
            Reason::NoPort => "no_port",
            Reason::WrongBackend => "wrong_backend",
            Reason::BackendOut => "backend_out",
            Reason::BackendRingFull => "backend_ring_full",
            Reason::ClientRingFull => "client_ring_full",
            Reason::TooBig => "too_big",
            Reason::StrayProbe => "stray_probe",
        }
    }
}

/// Counters of the balancer as a whole.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counters {
    /// Frames from clients.
    pub from_clients: u64,
    /// Frames forwarded to backends.
    pub to_backends: u64,
    /// Frames from backends.
    pub from_backends: u64,
    /// Frames forwarded to clients.
    pub to_clients: u64,
    /// RSTs the balancer wrote itself.
    pub resets_sent: u64,
    /// Connections opened.
    pub conns_total: u64,
    /// Connections removed after FIN or RST (or replaced).
    pub conns_closed: u64,
    /// Connections removed by a timeout.
    pub conns_expired: u64,
    /// New connections on a client port the table still held.
    pub port_reused: u64,
    /// Unanswered SYNs sent again to another backend.
    pub syn_moved: u64,
}

/// One backend in the JSON.
#[derive(Debug, Clone, Serialize)]
pub struct BackendStats {
    /// `IP:PORT`.
    pub addr: String,
    /// `up`, `down` or `no-channel`.
    pub state: &'static str,
    /// Open connections.
    pub active: u32,
    /// Its counters.
    #[serde(flatten)]
    pub counters: BackendCounters,
}

/// The JSON the balancer prints and writes.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// The VIP.
    pub vip: String,
    /// Spreading policy.
    pub policy: Policy,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Connections in the table now.
    pub active: usize,
    /// Largest table.
    pub max_conns: usize,
    /// Frame and connection counters.
    pub counters: Counters,
    /// Per backend.
    pub backends: Vec<BackendStats>,
    /// Dropped frames by reason (every reason, zeros too).
    pub drops: BTreeMap<&'static str, u64>,
}

impl Snapshot {
    /// The counters of `lb` now.
    pub fn new(lb: &Balancer, now: Instant) -> Snapshot {
        let (cfg, counters, drops, started) = lb.parts();
        Snapshot {
            vip: cfg.vip.to_string(),
            policy: cfg.policy,
            uptime_s: now.saturating_duration_since(started).as_secs_f64(),
            active: lb.table().len(),
            max_conns: lb.table().limits().max_conns,
            counters: *counters,
            backends: lb
                .backends()
                .iter()
                .map(|b| BackendStats {
                    addr: b.addr.to_string(),
                    state: b.state(),
                    active: b.active,
                    counters: b.counters,
                })
                .collect(),
            drops: Reason::ALL
                .iter()
                .map(|r| (r.name(), drops[*r as usize]))
                .collect(),
        }
    }
}
