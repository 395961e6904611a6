//! The daemon's control-plane state: pipes, fast channels, attachments, container connections,
//! and `state.json`.
//!
//! Regions are sealed memfds ([`Region::create_sealed`]): no file a container could open,
//! truncate, grow or replace exists anywhere. The daemon keeps every memfd (and every socket it
//! bound in a container's namespace) in its fd holder ([`crate::holder`]), so a restarted daemon
//! gets them back without asking a container; `state.json` says what they are and is checked
//! again, field by field, when it is read.
//!
//! ```text
//! <run-dir>/      0700, the daemon's only (never mounted into a container)
//!   lock          flock held by the running daemon
//!   state.json    pipes, channels, attachments; rewritten atomically before every change
//!   holder.sock   the fd holder's socket; holder.pid its pid
//! ```
//!
//! Every change is all-or-nothing: inputs are checked first, then the new state is written
//! (write-ahead), and only then is memory changed; if a step fails, the steps before it are
//! undone and the request changes nothing.

mod attachments;
mod auto;
mod channels;
mod rates;
mod routes;
mod services;
mod state;
#[cfg(test)]
mod tests;
mod validate;

pub use auto::{AutoOutcome, AUTO_IDLE, AUTO_MAX_BYTES, AUTO_PER_PIPE};
pub use channels::FcTraffic;
pub use validate::{
    parse_cidr, parse_cidr6, validate_labels, validate_name, validate_socket, MAX_LABELS,
    MAX_LABEL_KEY, MAX_LABEL_VALUE,
};

use crate::holder::Keeper;
use crate::proto::{ApiError, ErrorCode, PipeInfo};
use crate::rate::{Limits, Timers};
use crate::route::Routes;
use crate::switch::{fmt_mac, mac_for, FlowTable, Port};
use docknet_pipe::layout::{self, Identity, Kind, RegionInfo};
use docknet_pipe::Region;
use state::{FcRec, PipeRec};
use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

macro_rules! counters {
    ($($variant:ident => $name:literal: $doc:literal,)*) => {
        /// Per-pipe counters, in the order they are mirrored into the region header.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Counter { $(#[doc = $doc] $variant,)* }
        /// Counter names, as reported by `pipe show`.
        pub const COUNTER_NAMES: &[&str] = &[$($name,)*];
        impl Counter {
            /// Every counter, in order.
            pub const ALL: &[Counter] = &[$(Counter::$variant,)*];
            /// The counter at index `k` of the block.
            pub fn from_index(k: usize) -> Option<Counter> {
                Counter::ALL.get(k).copied()
            }
        }
    };
}

counters! {
    TxPackets => "tx_packets": "Frames taken from the pipe's tx ring (valid descriptors).",
    TxBytes => "tx_bytes": "Bytes of those frames.",
    RxPackets => "rx_packets": "Frames delivered into the pipe's rx ring.",
    RxBytes => "rx_bytes": "Bytes of those frames.",
    DropRxFull => "drop_rx_full": "Frames for this pipe dropped because its rx ring was full.",
    DropNoRoute => "drop_no_route": "Frames from this pipe to an address no pipe owns.",
    DropSpoofed => "drop_spoofed": "Frames from this pipe with a source address not its own.",
    DropMalformed => "drop_malformed": "Frames from this pipe whose headers do not parse.",
    DropUnsupported => "drop_unsupported": "Frames from this pipe of a protocol not forwarded.",
    DropTooBig => "drop_too_big": "Frames for this pipe longer than its frame size.",
    BadDesc => "bad_desc": "Descriptors on the tx ring outside the frame area or empty.",
    Oversize => "oversize": "Descriptors on the tx ring longer than the frame size.",
    RingOverrun => "ring_overrun": "Impossible ring indices written by the container.",
    ArpReplies => "arp_replies": "ARP requests answered by the daemon.",
    Flooded => "flooded": "Broadcast or multicast frames from this pipe copied to others.",
    Kicks => "kicks": "Futex wake-ups sent to the container (its consumer asleep on an empty rx ring, or its producer on a full tx ring).",
    DropFloodLimited => "drop_flood_limited": "Broadcast or multicast frames from this pipe over its flood budget.",
    FloodRxFull => "flood_rx_full": "Copies of this pipe's floods a full receiver could not take (charged to the sender).",
    SpuriousWakes => "spurious_wakes": "Times this pipe woke the daemon with no work (each one mutes its wake-ups for longer).",
    RateWaits => "rate_waits": "Times a frame of this pipe waited for its rate limit's tokens (in its tx ring, or in the daemon's queue for its rx ring).",
    RateLimited => "rate_limited": "Frames for this pipe dropped because the queue in front of its ingress limit was full.",
    WireTx => "wire_tx": "Frames from this pipe sent to the wire (the daemon's NIC).",
    WireRx => "wire_rx": "Frames from the wire delivered into this pipe.",
    DropWire => "drop_wire": "Frames from this pipe for the wire dropped: longer than the wire's MTU, next hop silent, or no room.",
    NdpReplies => "ndp_replies": "IPv6 neighbour solicitations answered by the daemon.",
    DropExtHeader => "drop_ext_header": "IPv6 frames from this pipe with extension headers the daemon does not pass (routing headers, chains longer than two or beyond its first 96 bytes).",
}

/// Number of counters.
pub const NCOUNTERS: usize = COUNTER_NAMES.len();

/// Counters the master thread publishes and the control plane reads.
#[derive(Debug, Default)]
pub struct Counters([AtomicU64; NCOUNTERS]);

impl Counters {
    /// Publishes the master's private values.
    pub fn store_all(&self, v: &[u64; NCOUNTERS]) {
        for (a, x) in self.0.iter().zip(v) {
            a.store(*x, Ordering::Relaxed);
        }
    }
    /// Reads all values.
    pub fn load_all(&self) -> [u64; NCOUNTERS] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }
}

/// A live pipe.
#[derive(Debug)]
pub struct Pipe {
    /// Unique within this daemon's lifetime (for carrying master state across snapshots).
    pub id: u64,
    /// Name.
    pub name: String,
    /// Address.
    pub ip: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
    /// MAC assigned by the daemon.
    pub mac: [u8; 6],
    /// IPv6 address and prefix length, if it has one (dual stack).
    pub ip6: Option<(Ipv6Addr, u8)>,
    /// MTU.
    pub mtu: u32,
    /// The region's sealed memfd.
    pub memfd: OwnedFd,
    /// The mapped region.
    pub region: Region,
    /// Its layout, as planned by the daemon (never read back from the region).
    pub info: RegionInfo,
    /// Counters published by the master thread.
    pub counters: Counters,
    /// Connections to its socket refused (too many at once).
    pub attach_refused: AtomicU64,
    /// Its rate limiters' state, published by the master thread.
    pub rate: RateShared,
}

/// A pipe's rate limiters as the master last saw them (for `rate show`).
#[derive(Debug, Default)]
pub struct RateShared {
    /// Egress: credit in bits, bytes let through, waits.
    pub egress: [AtomicU64; 3],
    /// Ingress: credit in bits, bytes let through, waits, bytes queued.
    pub ingress: [AtomicU64; 4],
}

/// What the master thread works from: an immutable view, swapped whole on every change.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Pipes; port `i` of the table is `pipes[i]`.
    pub pipes: Vec<Arc<Pipe>>,
    /// Flow table over the same indices.
    pub table: FlowTable,
    /// Rate limits over the same indices.
    pub limits: Vec<Limits>,
    /// The rate limiters' timers.
    pub timers: Timers,
    /// Routes to networks beyond the link.
    pub routes: Arc<Routes>,
}

/// A fast channel.
#[derive(Debug)]
struct Channel {
    rec: FcRec,
    memfd: OwnedFd,
    /// Mapped to read its producer indices for the metrics (never trusted for anything else).
    region: Region,
    /// Ring 0 carries `lo` to the other partner, ring 1 back.
    rings: [layout::RingLayout; 2],
    lo: String,
    /// For an automatic channel: when its rings last moved.
    moved: Option<auto::Movement>,
}

impl Channel {
    /// Its rings' producer indices: frames each partner published, as the partners claim.
    fn producers(&self) -> (u32, u32) {
        let prod = |k: usize| {
            self.region.load_u32(
                self.rings[k].prod_off(),
                std::sync::atomic::Ordering::Relaxed,
            )
        };
        (prod(0), prod(1))
    }
}

/// A socket bound in a container's network namespace, where its pipe is handed out.
#[derive(Debug)]
pub struct Attachment {
    /// The abstract name (without `@`).
    pub socket: String,
    /// The listening socket.
    pub listener: Arc<OwnedFd>,
    /// The namespace's inode (0: not known), to tell whether a container still lives in it.
    pub netns: u64,
}

/// Most connections a pipe's socket keeps at once (a container has one per attached process).
pub const MAX_CONNS: usize = 16;

/// Pipes, channels and attachments of one daemon.
#[derive(Debug)]
pub struct Registry {
    run_dir: PathBuf,
    holder: Option<Box<dyn Keeper>>,
    pipes: BTreeMap<String, Arc<Pipe>>,
    depth: BTreeMap<String, u32>,
    fcs: BTreeMap<(String, String), Channel>,
    attached: BTreeMap<String, Attachment>,
    conns: BTreeMap<String, Vec<OwnedFd>>,
    next_id: u64,
    next_channel: u64,
    /// The MAC of the daemon's link to the wire, when it drives one.
    gateway: Option<[u8; 6]>,
    /// The link's IPv4 address (where VXLAN datagrams leave from), if it has one.
    link_addr: Option<std::net::Ipv4Addr>,
    /// The link is the node's own kernel (`--host-link`): its routing carries what leaves.
    host_link: bool,
    /// Rate limits of the pipes that have any.
    limits: BTreeMap<String, Limits>,
    /// Labels of the pipes that have any.
    labels: BTreeMap<String, BTreeMap<String, String>>,
    /// The rate limiters' timers.
    timers: Timers,
    /// Regions made ahead of the creates that take them.
    pool: Option<Arc<crate::pool::Pool>>,
    /// Routes to networks beyond the link.
    routes: Arc<Routes>,
    /// Automatic fast channels.
    auto: auto::AutoState,
    /// Services and the table handed to containers.
    services: services::Services,
}

fn err(code: ErrorCode, msg: impl Into<String>) -> ApiError {
    ApiError::new(code, msg)
}

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    err(ErrorCode::Internal, format!("{what}: {e}"))
}

fn fc_key(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.into(), b.into())
    } else {
        (b.into(), a.into())
    }
}

fn pipe_key(name: &str) -> String {
    format!("pipe/{name}")
}
fn fc_holder_key(id: u64) -> String {
    format!("fc/{id}")
}
fn sock_key(pipe: &str) -> String {
    format!("sock/{pipe}")
}

/// The planned layout of a pipe region.
fn pipe_layout(
    ip: Ipv4Addr,
    prefix: u8,
    mtu: u32,
    depth: Option<u32>,
) -> Result<RegionInfo, ApiError> {
    let id = Identity {
        ip_a: ip,
        ip_b_or_prefix: u32::from(prefix),
        mac_a: mac_for(ip),
        mac_b: [0; 6],
        mtu,
    };
    let depth = match depth {
        Some(d) => d,
        None => {
            layout::RingParams::for_mtu(mtu, None)
                .map_err(|e| err(ErrorCode::BadParams, e.to_string()))?
                .depth
        }
    };
    RegionInfo::planned(Kind::Pipe, id, depth).map_err(|e| err(ErrorCode::BadParams, e.to_string()))
}

/// A pipe's frame at its MTU (what a rate limit's smallest burst is counted in; its rings
/// also carry TCP segments up to 64 KiB, which a bucket lets through on credit).
fn mtu_frame(info: &RegionInfo) -> u32 {
    (info.id.mtu + layout::ETH_HDR as u32).min(info.rings[0].frame_size)
}

/// The region size of a pipe at the default MTU and ring depth (what the pool keeps ready).
pub fn default_region_size() -> usize {
    layout::RingParams::for_mtu(1500, None)
        .and_then(|p| layout::plan([p, p]))
        .map_or(0, |(_, size)| size)
}

impl Registry {
    fn insert_pipe(
        &mut self,
        rec: &PipeRec,
        memfd: OwnedFd,
        region: Region,
        info: RegionInfo,
    ) -> Arc<Pipe> {
        let id = self.next_id;
        self.next_id += 1;
        let pipe = Arc::new(Pipe {
            id,
            name: rec.name.clone(),
            ip: rec.ip,
            prefix: rec.prefix,
            mac: mac_for(rec.ip),
            ip6: rec.ip6.as_deref().and_then(|a| parse_cidr6(a).ok()),
            mtu: rec.mtu,
            memfd,
            region,
            info,
            counters: Counters::default(),
            attach_refused: AtomicU64::new(0),
            rate: RateShared::default(),
        });
        self.pipes.insert(rec.name.clone(), pipe.clone());
        self.depth.insert(rec.name.clone(), rec.ring_depth);
        if !rec.limits.is_empty() {
            self.limits.insert(rec.name.clone(), rec.limits);
        }
        if !rec.labels.is_empty() {
            self.labels.insert(rec.name.clone(), rec.labels.clone());
        }
        pipe
    }

    /// The pipe called `name`.
    pub fn get(&self, name: &str) -> Result<&Arc<Pipe>, ApiError> {
        self.pipes
            .get(name)
            .ok_or_else(|| err(ErrorCode::NotFound, format!("no pipe named {name:?}")))
    }

    /// Creates a pipe: checks everything, creates its sealed region, keeps it in the holder,
    /// records it, and only then makes it live.
    pub fn create_pipe(
        &mut self,
        name: &str,
        ip: &str,
        mtu: Option<u32>,
        ring_depth: Option<u32>,
    ) -> Result<Arc<Pipe>, ApiError> {
        self.create_pipe_labeled(name, ip, mtu, ring_depth, BTreeMap::new())
    }

    /// [`Registry::create_pipe`] with labels recorded with the pipe (and reported with it).
    pub fn create_pipe_labeled(
        &mut self,
        name: &str,
        ip: &str,
        mtu: Option<u32>,
        ring_depth: Option<u32>,
        labels: BTreeMap<String, String>,
    ) -> Result<Arc<Pipe>, ApiError> {
        self.create_pipe_dual(name, ip, None, mtu, ring_depth, labels)
    }

    /// [`Registry::create_pipe_labeled`] with an IPv6 address too (`X::Y/LEN`): a dual-stack
    /// pipe.
    pub fn create_pipe_dual(
        &mut self,
        name: &str,
        ip: &str,
        ip6: Option<&str>,
        mtu: Option<u32>,
        ring_depth: Option<u32>,
        labels: BTreeMap<String, String>,
    ) -> Result<Arc<Pipe>, ApiError> {
        validate_name(name)?;
        validate_labels(&labels)?;
        let (ip, prefix) = parse_cidr(ip)?;
        let ip6 = ip6.map(parse_cidr6).transpose()?;
        if self.pipes.contains_key(name) {
            return Err(err(
                ErrorCode::Exists,
                format!("pipe {name:?} already exists"),
            ));
        }
        if let Some(other) = self.pipes.values().find(|p| p.ip == ip) {
            return Err(err(
                ErrorCode::IpInUse,
                format!("address {ip} is already used by pipe {:?}", other.name),
            ));
        }
        if let Some(svc) = self.is_service_address(ip) {
            return Err(err(
                ErrorCode::IpInUse,
                format!("address {ip} is service {svc:?}'s: a pipe cannot have it"),
            ));
        }
        if let Some(r) = self.routes.list().iter().find(|r| r.via == ip) {
            return Err(err(
                ErrorCode::IpInUse,
                format!("address {ip} is the next hop of route {r}: a pipe cannot be one"),
            ));
        }
        if let Some((a, _)) = ip6 {
            if let Some(other) = self.pipes.values().find(|p| p.ip6.map(|x| x.0) == Some(a)) {
                return Err(err(
                    ErrorCode::IpInUse,
                    format!("address {a} is already used by pipe {:?}", other.name),
                ));
            }
        }
        let mtu = mtu.unwrap_or(1500);
        let info = pipe_layout(ip, prefix, mtu, ring_depth)?;
        let (fd, region) = self
            .region(&format!("docknet-pipe-{name}"), info.size)
            .map_err(|e| internal("creating the pipe region", e))?;
        layout::init(&region, Kind::Pipe, info.id, info.rings, info.size)
            .map_err(|e| internal("writing the region header", e))?;
        self.hold(&pipe_key(name), fd.as_fd())?;
        let rec = PipeRec {
            name: name.into(),
            ip,
            prefix,
            ip6: ip6.map(|(a, l)| format!("{a}/{l}")),
            mtu,
            ring_depth: info.rings[0].depth,
            limits: Limits::default(),
            labels,
        };
        let mut st = self.state();
        st.pipes.push(rec.clone());
        if let Err(e) = self.write(&st) {
            self.unhold(&pipe_key(name));
            return Err(internal("saving state", e));
        }
        Ok(self.insert_pipe(&rec, fd, region, info))
    }

    /// Deletes a pipe with its fast channels and attachment.
    pub fn remove_pipe(&mut self, name: &str) -> Result<(), ApiError> {
        self.get(name)?;
        let mut st = self.state();
        st.pipes.retain(|p| p.name != name);
        st.fcs.retain(|f| f.a != name && f.b != name);
        st.attached.retain(|a| a.pipe != name);
        self.write(&st).map_err(|e| internal("saving state", e))?;
        let chans: Vec<(String, String)> = self
            .fcs
            .keys()
            .filter(|(a, b)| a == name || b == name)
            .cloned()
            .collect();
        for key in chans {
            self.drop_channel(&key);
        }
        if self.attached.remove(name).is_some() {
            self.unhold(&sock_key(name));
        }
        self.conns.remove(name);
        self.depth.remove(name);
        self.limits.remove(name);
        self.labels.remove(name);
        if let Some(pipe) = self.pipes.remove(name) {
            layout::set_flags(&pipe.region, layout::FLAG_CLOSED);
        }
        self.unhold(&pipe_key(name));
        Ok(())
    }

    /// All pipes, by name.
    pub fn pipes(&self) -> impl Iterator<Item = &Arc<Pipe>> {
        self.pipes.values()
    }

    /// The view the master thread forwards from.
    pub fn snapshot(&self) -> Snapshot {
        let pipes: Vec<Arc<Pipe>> = self.pipes.values().cloned().collect();
        let table = FlowTable::new(
            pipes
                .iter()
                .map(|p| Port {
                    ip: p.ip,
                    prefix: p.prefix,
                    mac: p.mac,
                    ip6: p.ip6.map(|x| x.0),
                })
                .collect(),
        )
        .with_gateway(self.gateway);
        let limits = pipes
            .iter()
            .map(|p| self.limits.get(&p.name).copied().unwrap_or_default())
            .collect();
        Snapshot {
            pipes,
            table,
            limits,
            timers: self.timers,
            routes: self.routes.clone(),
        }
    }

    /// Gives the registry a pool of spare regions to take from ([`crate::pool`]).
    /// (`None`: stops the pool it had.)
    pub fn set_pool(&mut self, pool: Option<Arc<crate::pool::Pool>>) {
        if let Some(old) = std::mem::replace(&mut self.pool, pool) {
            old.stop();
        }
    }

    /// The spare regions: (kept, ready now, bytes each); zeroes without a pool.
    pub fn spare_regions(&self) -> (usize, usize, usize) {
        self.pool
            .as_ref()
            .map_or((0, 0, 0), |p| (p.spares(), p.ready(), p.size()))
    }

    /// A sealed region of `size` bytes: a spare one if the pool has it, else made now.
    fn region(&self, name: &str, size: usize) -> io::Result<(OwnedFd, Region)> {
        match self.pool.as_ref().and_then(|p| p.take(size)) {
            Some(r) => Ok(r),
            None => Region::create_sealed(name, size),
        }
    }

    /// Sets the MAC of the daemon's link to the wire (addresses no pipe owns go through it).
    pub fn set_gateway(&mut self, mac: Option<[u8; 6]>) {
        self.gateway = mac;
    }

    /// Tells the registry its link is the node's own kernel (`--host-link`): routes are then
    /// the node's to keep, and `route add` is refused.
    pub fn set_host_link(&mut self, yes: bool) {
        self.host_link = yes;
    }

    /// Tells the registry the link's IPv4 address (VXLAN routes need one).
    pub fn set_link_addr(&mut self, addr: Option<std::net::Ipv4Addr>) {
        self.link_addr = addr;
    }

    /// Removes every pipe (a daemon that leaves nothing behind when it stops).
    pub fn remove_all(&mut self) {
        let names: Vec<String> = self.pipes.keys().cloned().collect();
        for n in names {
            if let Err(e) = self.remove_pipe(&n) {
                tracing::warn!("removing pipe {n}: {e}");
            }
        }
    }

    /// How a pipe is reported to clients (with counters when `counters` is set).
    pub fn pipe_info(&mut self, name: &str, counters: bool) -> Result<PipeInfo, ApiError> {
        let p = self.get(name)?.clone();
        let connections = self.connections(name);
        Ok(PipeInfo {
            name: p.name.clone(),
            ip: format!("{}/{}", p.ip, p.prefix),
            ip6: p.ip6.map(|(a, l)| format!("{a}/{l}")),
            mac: fmt_mac(p.mac),
            mtu: p.mtu,
            ring_depth: p.info.rings[0].depth,
            frame_size: p.info.rings[0].frame_size,
            region_bytes: p.info.size,
            socket: self.attached.get(name).map(|a| format!("@{}", a.socket)),
            connections,
            fast_channels: self.fc_peers(&p.name),
            labels: self.labels.get(name).cloned().unwrap_or_default(),
            counters: counters.then(|| {
                let mut m: BTreeMap<String, u64> = COUNTER_NAMES
                    .iter()
                    .zip(p.counters.load_all())
                    .map(|(n, x)| ((*n).to_string(), x))
                    .collect();
                m.insert(
                    "attach_refused".into(),
                    p.attach_refused.load(Ordering::Relaxed),
                );
                m
            }),
        })
    }
}
