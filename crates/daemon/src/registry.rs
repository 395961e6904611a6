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

use crate::holder::Keeper;
use crate::proto::{ApiError, ErrorCode, FcInfo, PipeInfo, RateChange, RateDir, RateInfo};
use crate::rate::{Limit, Limits, Timers};
use crate::switch::{fmt_mac, mac_for, FlowTable, Port};
use docknet_pipe::delivery::{self, ChannelDesc, Msg, PipeDesc, Side};
use docknet_pipe::fdpass;
use docknet_pipe::layout::{self, Identity, Kind, RegionInfo};
use docknet_pipe::Region;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
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
}

/// A fast channel's traffic as its rings' producer indices tell it: frames each partner has
/// published, modulo 2^32. The partners write these words, so they say only what the
/// partners claim; the daemon never sees the frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FcTraffic {
    /// The partner with the lower address.
    pub a: String,
    /// The other.
    pub b: String,
    /// The channel's MTU.
    pub mtu: u32,
    /// Frames `a` published to `b`.
    pub a_to_b: u32,
    /// Frames `b` published to `a`.
    pub b_to_a: u32,
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PipeRec {
    name: String,
    ip: Ipv4Addr,
    prefix: u8,
    /// IPv6 address and prefix, `X::Y/LEN` (checked again on load).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip6: Option<String>,
    mtu: u32,
    ring_depth: u32,
    /// Rate limits (checked again on load).
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    limits: Limits,
    /// Labels from whoever created it (checked again on load).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FcRec {
    #[serde(default)]
    id: u64,
    a: String,
    b: String,
    mtu: u32,
    ring_depth: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct AttachRec {
    pipe: String,
    socket: String,
    #[serde(default)]
    netns: u64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    pipes: Vec<PipeRec>,
    fcs: Vec<FcRec>,
    #[serde(default)]
    attached: Vec<AttachRec>,
    #[serde(default)]
    next_channel: u64,
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
    /// Rate limits of the pipes that have any.
    limits: BTreeMap<String, Limits>,
    /// Labels of the pipes that have any.
    labels: BTreeMap<String, BTreeMap<String, String>>,
    /// The rate limiters' timers.
    timers: Timers,
    /// Regions made ahead of the creates that take them.
    pool: Option<Arc<crate::pool::Pool>>,
}

fn err(code: ErrorCode, msg: impl Into<String>) -> ApiError {
    ApiError::new(code, msg)
}

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    err(ErrorCode::Internal, format!("{what}: {e}"))
}

/// Checks a pipe name: 1–128 ([`delivery::MAX_NAME`]) of `[A-Za-z0-9_.-]`, not starting with
/// `.` or `-`.
pub fn validate_name(name: &str) -> Result<(), ApiError> {
    let ok = (1..=delivery::MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        && !name.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(err(
            ErrorCode::BadName,
            format!(
                "invalid pipe name {name:?}: use 1-{} of A-Z a-z 0-9 _ . - (not starting with . or -)",
                delivery::MAX_NAME
            ),
        ))
    }
}

/// Most labels on one pipe.
pub const MAX_LABELS: usize = 16;
/// Longest label key.
pub const MAX_LABEL_KEY: usize = 128;
/// Longest label value.
pub const MAX_LABEL_VALUE: usize = 1024;

/// Checks a pipe's labels (what a creator such as the CNI plugin records with it, e.g. its
/// owner): at most [`MAX_LABELS`]; keys 1-128 of `[A-Za-z0-9_./-]` starting with a letter or
/// digit; values up to 1024 printable ASCII characters.
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let bad = |why: String| err(ErrorCode::BadParams, format!("invalid labels: {why}"));
    if labels.len() > MAX_LABELS {
        return Err(bad(format!(
            "{} labels, at most {MAX_LABELS}",
            labels.len()
        )));
    }
    for (k, v) in labels {
        let key_ok = (1..=MAX_LABEL_KEY).contains(&k.len())
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-'))
            && k.as_bytes()[0].is_ascii_alphanumeric();
        if !key_ok {
            return Err(bad(format!(
                "key {k:?}: use 1-{MAX_LABEL_KEY} of A-Z a-z 0-9 _ . / - (starting with a letter or digit)"
            )));
        }
        if v.len() > MAX_LABEL_VALUE || !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(bad(format!(
                "value of {k:?}: at most {MAX_LABEL_VALUE} printable ASCII characters"
            )));
        }
    }
    Ok(())
}

/// Parses `A.B.C.D/LEN` and refuses addresses a pipe cannot own.
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), ApiError> {
    let bad = |why: &str| err(ErrorCode::BadIp, format!("invalid address {s:?}: {why}"));
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| bad("expected A.B.C.D/LEN"))?;
    let ip: Ipv4Addr = ip.parse().map_err(|_| bad("not an IPv4 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| (1..=32).contains(l))
        .ok_or_else(|| bad("prefix length must be 1..=32"))?;
    if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback() {
        return Err(bad("not a unicast host address"));
    }
    if len <= 30 {
        let mask = u32::MAX << (32 - u32::from(len));
        let host = u32::from(ip) & !mask;
        if host == 0 || host == !mask {
            return Err(bad("network or broadcast address of its subnet"));
        }
    }
    Ok((ip, len))
}

/// Parses `X::Y/LEN` and refuses IPv6 addresses a pipe cannot own: the unspecified, loopback,
/// multicast, link-local (a pipe's link-local address follows from its MAC) and IPv4-mapped
/// addresses.
pub fn parse_cidr6(s: &str) -> Result<(Ipv6Addr, u8), ApiError> {
    let bad = |why: &str| {
        err(
            ErrorCode::BadIp,
            format!("invalid IPv6 address {s:?}: {why}"),
        )
    };
    let (ip, len) = s.split_once('/').ok_or_else(|| bad("expected X::Y/LEN"))?;
    let ip: Ipv6Addr = ip.parse().map_err(|_| bad("not an IPv6 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| (1..=128).contains(l))
        .ok_or_else(|| bad("prefix length must be 1..=128"))?;
    let o = ip.octets();
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return Err(bad("not a unicast host address"));
    }
    if o[0] == 0xfe && o[1] & 0xc0 == 0x80 {
        return Err(bad(
            "link-local (a pipe's link-local address is derived from its MAC)",
        ));
    }
    if ip.to_ipv4_mapped().is_some() {
        return Err(bad("an IPv4-mapped address (give IPv4 with --ip)"));
    }
    Ok((ip, len))
}

/// Checks an abstract socket name for an attachment: 1-64 of `[A-Za-z0-9/_.-]`.
pub fn validate_socket(name: &str) -> Result<(), ApiError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(err(
            ErrorCode::BadParams,
            format!("invalid socket name {name:?}: use 1-64 of A-Z a-z 0-9 / _ . -"),
        ))
    }
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

/// Checks a pipe record from `state.json` as strictly as a request.
fn check_pipe_rec(p: &PipeRec) -> Result<RegionInfo, String> {
    validate_name(&p.name).map_err(|e| e.message)?;
    validate_labels(&p.labels).map_err(|e| e.message)?;
    parse_cidr(&format!("{}/{}", p.ip, p.prefix)).map_err(|e| e.message)?;
    if let Some(a) = &p.ip6 {
        parse_cidr6(a).map_err(|e| e.message)?;
    }
    pipe_layout(p.ip, p.prefix, p.mtu, Some(p.ring_depth)).map_err(|e| e.message)
}

/// Opens a network namespace file given by a trusted client (the control socket is root's) and
/// checks that it is one. `/proc/PID/ns/net` is a magic link, so links are followed; what is
/// opened must be a namespace (nsfs), whatever the path was.
fn open_netns(path: &str) -> Result<OwnedFd, ApiError> {
    let bad = |why: String| {
        err(
            ErrorCode::BadParams,
            format!("network namespace {path:?}: {why}"),
        )
    };
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| bad(e.to_string()))?;
    let st = nix::sys::statfs::fstatfs(&f).map_err(|e| bad(e.to_string()))?;
    if st.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return Err(bad("not a namespace file".into()));
    }
    Ok(OwnedFd::from(f))
}

/// Whether any process lives in the network namespace with inode `ino` (a scan of /proc: only
/// when an attachment is contested).
fn netns_in_use(ino: u64) -> bool {
    let want = format!("net:[{ino}]");
    fs::read_dir("/proc").is_ok_and(|rd| {
        rd.flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .any(|e| {
                fs::read_link(e.path().join("ns/net"))
                    .is_ok_and(|l| l.as_os_str() == std::ffi::OsStr::new(&want))
            })
    })
}

/// A listening socket bound to the abstract name `socket` inside the network namespace `ns`:
/// a short-lived thread enters the namespace, binds, and ends.
fn bind_in_netns(ns: &OwnedFd, socket: &str) -> io::Result<OwnedFd> {
    let ns = ns.try_clone()?;
    let socket = socket.to_string();
    std::thread::spawn(move || -> io::Result<OwnedFd> {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
        fdpass::listen_abstract(&socket)
    })
    .join()
    .map_err(|_| io::Error::other("the binding thread panicked"))?
}

/// Whether a container connection is still open (no hang-up or error pending).
fn alive(fd: &OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    // hang-up and errors are always reported; a peer that closed leaves a SEQPACKET socket
    // hung up
    let mut p = [PollFd::new(fd.as_fd(), PollFlags::empty())];
    match poll(&mut p, PollTimeout::ZERO) {
        Ok(0) => true,
        Ok(_) => !p[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL)
        }),
        Err(_) => false,
    }
}

impl Registry {
    /// Opens (creating if needed) the run directory and adopts what `state.json` records and the
    /// holder still keeps, each record checked again. Returns the registry and warnings about
    /// anything not adopted. Without a holder (tests, in-process use) nothing can be adopted.
    pub fn open(
        run_dir: &Path,
        holder: Option<Box<dyn Keeper>>,
    ) -> io::Result<(Registry, Vec<String>)> {
        fs::create_dir_all(run_dir)?;
        fs::set_permissions(run_dir, fs::Permissions::from_mode(0o700))?;
        let mut kept = match &holder {
            Some(h) => h.list()?,
            None => BTreeMap::new(),
        };
        let mut reg = Registry {
            run_dir: run_dir.to_path_buf(),
            holder,
            pipes: BTreeMap::new(),
            depth: BTreeMap::new(),
            fcs: BTreeMap::new(),
            attached: BTreeMap::new(),
            conns: BTreeMap::new(),
            next_id: 1,
            next_channel: 1,
            gateway: None,
            limits: BTreeMap::new(),
            labels: BTreeMap::new(),
            timers: Timers::default(),
            pool: None,
        };
        let mut warnings = Vec::new();
        let state: StateFile = match fs::read(reg.state_path()) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                warnings.push(format!("state.json unreadable ({e}); starting empty"));
                StateFile::default()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => StateFile::default(),
            Err(e) => return Err(e),
        };
        reg.next_channel = state.next_channel.max(1);
        for p in &state.pipes {
            match reg.adopt_pipe(p, &mut kept) {
                Ok(Some(w)) => warnings.push(format!("pipe {:?}: {w}", p.name)),
                Ok(None) => {}
                Err(e) => warnings.push(format!("pipe {:?} not adopted: {e}", p.name)),
            }
        }
        for f in &state.fcs {
            if let Err(e) = reg.adopt_fc(f, &mut kept) {
                warnings.push(format!(
                    "fast channel {:?}<->{:?} not adopted: {e}",
                    f.a, f.b
                ));
            }
        }
        for a in &state.attached {
            if let Err(e) = reg.adopt_attachment(a, &mut kept) {
                warnings.push(format!("attachment of {:?} not adopted: {e}", a.pipe));
            }
        }
        // whatever the holder keeps that the state does not name is stale
        if let Some(h) = &reg.holder {
            for k in kept.keys() {
                let _ = h.drop_key(k);
            }
        }
        reg.save()?;
        // endpoints that were connected to the last daemon reconnect on this
        for p in reg.pipes.values() {
            layout::bump_generation(&p.region);
        }
        Ok((reg, warnings))
    }

    /// Adopts a pipe the state names; `Ok(Some(warning))` when it came back without a part of
    /// its record that did not hold (its rate limits).
    fn adopt_pipe(
        &mut self,
        p: &PipeRec,
        kept: &mut BTreeMap<String, OwnedFd>,
    ) -> Result<Option<String>, String> {
        let info = check_pipe_rec(p)?;
        // limits are checked again as if set now (the file is not trusted)
        let frame = mtu_frame(&info);
        let check = |l: Option<Limit>| match l {
            Some(l) => Limit::new(l.rate_bps, Some(l.burst_bits), frame, self.timers.coarse)
                .map(Some)
                .map_err(|e| e.to_string()),
            None => Ok(None),
        };
        let (mut rec, mut warning) = (p.clone(), None);
        match (check(p.limits.egress), check(p.limits.ingress)) {
            (Ok(e), Ok(i)) => {
                rec.limits = Limits {
                    egress: e,
                    ingress: i,
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                rec.limits = Limits::default();
                warning = Some(format!("rate limits dropped ({e})"));
            }
        }
        let p = &rec;
        let ip6 = p.ip6.as_deref().and_then(|a| parse_cidr6(a).ok());
        if self.pipes.contains_key(&p.name)
            || self.pipes.values().any(|x| x.ip == p.ip)
            || ip6.is_some_and(|a| self.pipes.values().any(|x| x.ip6.map(|b| b.0) == Some(a.0)))
        {
            return Err("duplicate name or address".into());
        }
        let fd = kept
            .remove(&pipe_key(&p.name))
            .ok_or("its region is gone (no fd holder kept it)")?;
        let region = Region::map_sealed(fd.as_fd(), info.size).map_err(|e| e.to_string())?;
        self.insert_pipe(p, fd, region, info);
        Ok(warning)
    }

    fn adopt_fc(&mut self, f: &FcRec, kept: &mut BTreeMap<String, OwnedFd>) -> Result<(), String> {
        let (pa, pb) = (self.get(&f.a), self.get(&f.b));
        if pa.is_err() || pb.is_err() || f.a == f.b || self.fcs.contains_key(&fc_key(&f.a, &f.b)) {
            return Err("its pipes are not both there, or it is a duplicate".into());
        }
        let p =
            layout::RingParams::offload(f.mtu, Some(f.ring_depth)).map_err(|e| e.to_string())?;
        let (rings, size) = layout::plan([p, p]).map_err(|e| e.to_string())?;
        let lo = match (pa, pb) {
            (Ok(a), Ok(b)) if b.ip < a.ip => f.b.clone(),
            _ => f.a.clone(),
        };
        let fd = kept
            .remove(&fc_holder_key(f.id))
            .ok_or("its region is gone")?;
        let region = Region::map_sealed(fd.as_fd(), size).map_err(|e| e.to_string())?;
        self.next_channel = self.next_channel.max(f.id + 1);
        self.fcs.insert(
            fc_key(&f.a, &f.b),
            Channel {
                rec: f.clone(),
                memfd: fd,
                region,
                rings,
                lo,
            },
        );
        Ok(())
    }

    fn adopt_attachment(
        &mut self,
        a: &AttachRec,
        kept: &mut BTreeMap<String, OwnedFd>,
    ) -> Result<(), String> {
        self.get(&a.pipe).map_err(|e| e.message)?;
        validate_socket(&a.socket).map_err(|e| e.message)?;
        let fd = kept
            .remove(&sock_key(&a.pipe))
            .ok_or("its socket is gone")?;
        let listening = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::AcceptConn)
            .unwrap_or(false);
        if !listening {
            return Err("the kept socket is not listening".into());
        }
        fdpass::set_nonblocking(fd.as_fd(), true).map_err(|e| e.to_string())?;
        self.attached.insert(
            a.pipe.clone(),
            Attachment {
                socket: a.socket.clone(),
                listener: Arc::new(fd),
                netns: a.netns,
            },
        );
        Ok(())
    }

    fn state_path(&self) -> PathBuf {
        self.run_dir.join("state.json")
    }

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

    /// The state as it stands.
    fn state(&self) -> StateFile {
        StateFile {
            version: 2,
            pipes: self
                .pipes
                .values()
                .map(|p| PipeRec {
                    name: p.name.clone(),
                    ip: p.ip,
                    prefix: p.prefix,
                    ip6: p.ip6.map(|(a, l)| format!("{a}/{l}")),
                    mtu: p.mtu,
                    ring_depth: self.depth.get(&p.name).copied().unwrap_or(0),
                    limits: self.limits.get(&p.name).copied().unwrap_or_default(),
                    labels: self.labels.get(&p.name).cloned().unwrap_or_default(),
                })
                .collect(),
            fcs: self.fcs.values().map(|c| c.rec.clone()).collect(),
            attached: self
                .attached
                .iter()
                .map(|(p, a)| AttachRec {
                    pipe: p.clone(),
                    socket: a.socket.clone(),
                    netns: a.netns,
                })
                .collect(),
            next_channel: self.next_channel,
        }
    }

    /// Writes `st` as `state.json`, atomically (temporary file, then rename), in one order
    /// whatever the order of changes that led to it (pipes by name, channels by partners), so
    /// the same state is always the same file.
    ///
    /// Not synced to disk: the state serves a daemon that restarts on a running host (the
    /// rename is atomic against its crash, and the page cache outlives it). After the host
    /// restarts, the fd holder and every namespace are gone and nothing of the state could be
    /// adopted anyway. An fsync cost each create, attach and detach 0.3 ms here, and 10-60 ms
    /// on a busy ext4.
    fn write(&self, st: &StateFile) -> io::Result<()> {
        let sorted;
        let st = if st.pipes.is_sorted_by(|a, b| a.name <= b.name)
            && st
                .fcs
                .is_sorted_by(|x, y| fc_key(&x.a, &x.b) <= fc_key(&y.a, &y.b))
        {
            st
        } else {
            let mut c = st.clone();
            c.pipes.sort_by(|a, b| a.name.cmp(&b.name));
            c.fcs.sort_by_key(|f| fc_key(&f.a, &f.b));
            sorted = c;
            &sorted
        };
        let tmp = self.run_dir.join("state.json.tmp");
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(st).map_err(io::Error::other)?)?;
        fs::rename(tmp, self.state_path())
    }

    /// Writes the current state.
    pub fn save(&self) -> io::Result<()> {
        self.write(&self.state())
    }

    fn hold(&self, key: &str, fd: std::os::fd::BorrowedFd<'_>) -> Result<(), ApiError> {
        match &self.holder {
            Some(h) => h
                .put(key, fd)
                .map_err(|e| internal("keeping the region in the fd holder", e)),
            None => Ok(()),
        }
    }

    fn unhold(&self, key: &str) {
        if let Some(h) = &self.holder {
            if let Err(e) = h.drop_key(key) {
                tracing::warn!("fd holder: dropping {key}: {e}");
            }
        }
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

    /// Builds a fast channel between `a` and `b`.
    pub fn connect_fc(&mut self, a: &str, b: &str, mtu: Option<u32>) -> Result<FcInfo, ApiError> {
        let pa = self.get(a)?.clone();
        let pb = self.get(b)?.clone();
        if a == b {
            return Err(err(
                ErrorCode::BadParams,
                "a fast channel needs two different pipes",
            ));
        }
        if self.fcs.contains_key(&fc_key(a, b)) {
            return Err(err(
                ErrorCode::Exists,
                format!("fast channel {a}<->{b} already exists"),
            ));
        }
        // the pipes' MTU by default: TCP segments of up to 64 KiB pass either way
        let mtu = mtu.unwrap_or(pa.mtu.min(pb.mtu));
        let params = layout::RingParams::offload(mtu, None)
            .map_err(|e| err(ErrorCode::BadParams, e.to_string()))?;
        let (rings, size) =
            layout::plan([params, params]).map_err(|e| err(ErrorCode::BadParams, e.to_string()))?;
        // Endpoint A is the lower address: ring 0 carries A -> B.
        let (lo, hi) = if pa.ip < pb.ip {
            (&pa, &pb)
        } else {
            (&pb, &pa)
        };
        let id = self.next_channel;
        let (fd, region) = self
            .region(&format!("docknet-fc-{id}"), size)
            .map_err(|e| internal("creating the fast channel", e))?;
        let ident = Identity {
            ip_a: lo.ip,
            ip_b_or_prefix: u32::from(hi.ip),
            mac_a: lo.mac,
            mac_b: hi.mac,
            mtu,
        };
        layout::init(&region, Kind::FastChannel, ident, rings, size)
            .map_err(|e| internal("writing the channel header", e))?;
        let lo_name = lo.name.clone();
        self.hold(&fc_holder_key(id), fd.as_fd())?;
        let rec = FcRec {
            id,
            a: a.into(),
            b: b.into(),
            mtu,
            ring_depth: params.depth,
        };
        let mut st = self.state();
        st.fcs.push(rec.clone());
        st.next_channel = id + 1;
        if let Err(e) = self.write(&st) {
            self.unhold(&fc_holder_key(id));
            return Err(internal("saving state", e));
        }
        self.next_channel = id + 1;
        self.fcs.insert(
            fc_key(a, b),
            Channel {
                rec,
                memfd: fd,
                region,
                rings,
                lo: lo_name,
            },
        );
        for p in [a, b] {
            self.announce(p, &fc_key(a, b));
        }
        layout::bump_generation(&pa.region);
        layout::bump_generation(&pb.region);
        Ok(FcInfo {
            a: a.into(),
            b: b.into(),
            mtu,
            ring_depth: params.depth,
            region_bytes: size,
        })
    }

    /// Removes the fast channel between `a` and `b`.
    pub fn remove_fc(&mut self, a: &str, b: &str) -> Result<(), ApiError> {
        self.get(a)?;
        self.get(b)?;
        let key = fc_key(a, b);
        if !self.fcs.contains_key(&key) {
            return Err(err(
                ErrorCode::NotFound,
                format!("no fast channel {a}<->{b}"),
            ));
        }
        let mut st = self.state();
        st.fcs.retain(|f| fc_key(&f.a, &f.b) != key);
        self.write(&st).map_err(|e| internal("saving state", e))?;
        self.drop_channel(&key);
        Ok(())
    }

    /// Forgets a channel (already gone from the state): tells both partners, drops it from
    /// the holder.
    fn drop_channel(&mut self, key: &(String, String)) {
        let Some(c) = self.fcs.remove(key) else {
            return;
        };
        let msg = Msg::Closed { id: c.rec.id }.encode();
        for p in [&c.rec.a, &c.rec.b] {
            self.send_all(p, &msg, None);
            if let Some(pipe) = self.pipes.get(p) {
                layout::bump_generation(&pipe.region);
            }
        }
        self.unhold(&fc_holder_key(c.rec.id));
    }

    /// Binds pipe `name`'s socket (abstract name `socket`) inside the network namespace at
    /// `netns` (a path from a trusted client: `/proc/PID/ns/net`, `/var/run/netns/NAME`).
    /// Returns the listening socket, for the caller to accept on. A pipe is handed to one
    /// container at a time; an attachment whose namespace no process lives in any more (its
    /// container died without detaching) is replaced.
    pub fn attach(
        &mut self,
        name: &str,
        netns: &str,
        socket: Option<&str>,
    ) -> Result<Arc<OwnedFd>, ApiError> {
        self.get(name)?;
        let socket = socket.unwrap_or(delivery::DEFAULT_SOCKET);
        validate_socket(socket)?;
        let ns = open_netns(netns)?;
        let ino = nix::sys::stat::fstat(&ns).map(|st| st.st_ino).unwrap_or(0);
        if let Some(old) = self.attached.get(name) {
            if old.netns != ino && (old.netns == 0 || netns_in_use(old.netns)) {
                return Err(err(
                    ErrorCode::Exists,
                    format!("pipe {name:?} is already attached to a running container (if it is gone: docknet pipe detach {name})"),
                ));
            }
            // the same namespace again, or one no process lives in: replace it
            self.detach(name)?;
        }
        let listener = bind_in_netns(&ns, socket).map_err(|e| {
            let code = if e.kind() == io::ErrorKind::AddrInUse {
                ErrorCode::Exists
            } else {
                ErrorCode::Internal
            };
            err(code, format!("binding @{socket} in {netns}: {e}"))
        })?;
        self.hold(&sock_key(name), listener.as_fd())?;
        let mut st = self.state();
        st.attached.push(AttachRec {
            pipe: name.into(),
            socket: socket.into(),
            netns: ino,
        });
        if let Err(e) = self.write(&st) {
            self.unhold(&sock_key(name));
            return Err(internal("saving state", e));
        }
        let listener = Arc::new(listener);
        self.attached.insert(
            name.into(),
            Attachment {
                socket: socket.into(),
                listener: listener.clone(),
                netns: ino,
            },
        );
        Ok(listener)
    }

    /// Closes pipe `name`'s socket in its container (connections already made stay).
    pub fn detach(&mut self, name: &str) -> Result<(), ApiError> {
        self.get(name)?;
        if !self.attached.contains_key(name) {
            return Err(err(
                ErrorCode::NotFound,
                format!("pipe {name:?} is not attached"),
            ));
        }
        let mut st = self.state();
        st.attached.retain(|a| a.pipe != name);
        self.write(&st).map_err(|e| internal("saving state", e))?;
        self.attached.remove(name);
        self.unhold(&sock_key(name));
        Ok(())
    }

    /// The attachments (pipe, listening socket), e.g. to accept on after a restart.
    pub fn attachments(&self) -> Vec<(String, Arc<OwnedFd>)> {
        self.attached
            .iter()
            .map(|(p, a)| (p.clone(), a.listener.clone()))
            .collect()
    }

    /// Whether `listener` is still pipe `name`'s socket.
    pub fn is_attached(&self, name: &str, listener: &Arc<OwnedFd>) -> bool {
        self.attached
            .get(name)
            .is_some_and(|a| Arc::ptr_eq(&a.listener, listener))
    }

    /// Hands pipe `name` to a new connection: its region, its channels, then `Synced`; the
    /// connection then gets every change of its channels. Refused (and counted) beyond
    /// [`MAX_CONNS`] live connections.
    pub fn add_conn(&mut self, name: &str, conn: OwnedFd) -> Result<(), ApiError> {
        let pipe = self.get(name)?.clone();
        let conns = self.conns.entry(name.into()).or_default();
        conns.retain(alive);
        if conns.len() >= MAX_CONNS {
            pipe.attach_refused.fetch_add(1, Ordering::Relaxed);
            return Err(err(
                ErrorCode::Busy,
                format!("pipe {name:?} has {MAX_CONNS} connections"),
            ));
        }
        let hello = Msg::Hello(PipeDesc {
            name: pipe.name.clone(),
            ip: pipe.ip,
            prefix: pipe.prefix,
            mac: pipe.mac,
            mtu: pipe.mtu,
            depth: pipe.info.rings[0].depth,
            ip6: pipe.ip6,
        });
        let mut msgs: Vec<(Vec<u8>, Option<&OwnedFd>)> = vec![(hello.encode(), Some(&pipe.memfd))];
        for c in self
            .fcs
            .values()
            .filter(|c| c.rec.a == name || c.rec.b == name)
        {
            msgs.push((self.channel_msg(name, &c.rec).encode(), Some(&c.memfd)));
        }
        msgs.push((Msg::Synced.encode(), None));
        for (m, fd) in &msgs {
            fdpass::send(conn.as_fd(), m, fd.map(|f| f.as_fd()))
                .map_err(|e| internal("handing out the pipe", e))?;
        }
        self.conns.entry(name.into()).or_default().push(conn);
        Ok(())
    }

    /// A channel as partner `me` is told about it.
    fn channel_msg(&self, me: &str, c: &FcRec) -> Msg {
        let peer_name = if c.a == me { &c.b } else { &c.a };
        let (mine, peer) = (self.pipes.get(me), self.pipes.get(peer_name));
        let (my_ip, peer_ip, peer_mac, peer_ip6) = match (mine, peer) {
            (Some(m), Some(p)) => (m.ip, p.ip, p.mac, p.ip6.map(|x| x.0)),
            _ => (Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED, [0; 6], None),
        };
        Msg::Channel(ChannelDesc {
            id: c.id,
            side: if my_ip < peer_ip { Side::A } else { Side::B },
            mtu: c.mtu,
            depth: c.ring_depth,
            peer: peer_name.clone(),
            peer_ip,
            peer_mac,
            peer_ip6,
        })
    }

    /// Tells pipe `me`'s connections about the channel at `key`.
    fn announce(&mut self, me: &str, key: &(String, String)) {
        let Some(c) = self.fcs.get(key) else { return };
        let msg = self.channel_msg(me, &c.rec).encode();
        let fd = c.memfd.try_clone().ok();
        self.send_all(me, &msg, fd.as_ref());
    }

    /// Sends a message to every connection of `pipe`, dropping those that do not take it (gone,
    /// or not reading: a container's own loss).
    fn send_all(&mut self, pipe: &str, msg: &[u8], fd: Option<&OwnedFd>) {
        if let Some(conns) = self.conns.get_mut(pipe) {
            conns.retain(|c| fdpass::send(c.as_fd(), msg, fd.map(|f| f.as_fd())).is_ok());
        }
    }

    /// Live connections of a pipe.
    pub fn connections(&mut self, name: &str) -> usize {
        self.conns.get_mut(name).map_or(0, |c| {
            c.retain(alive);
            c.len()
        })
    }

    /// Every fast channel's traffic, by its producer indices.
    pub fn fc_traffic(&self) -> Vec<FcTraffic> {
        self.fcs
            .values()
            .map(|c| {
                let hi = if c.lo == c.rec.a {
                    c.rec.b.clone()
                } else {
                    c.rec.a.clone()
                };
                let prod = |k: usize| c.region.load_u32(c.rings[k].prod_off(), Ordering::Relaxed);
                FcTraffic {
                    a: c.lo.clone(),
                    b: hi,
                    mtu: c.rec.mtu,
                    a_to_b: prod(0),
                    b_to_a: prod(1),
                }
            })
            .collect()
    }

    /// Peers pipe `name` has a fast channel with.
    pub fn fc_peers(&self, name: &str) -> Vec<String> {
        self.fcs
            .values()
            .filter_map(|c| {
                if c.rec.a == name {
                    Some(c.rec.b.clone())
                } else if c.rec.b == name {
                    Some(c.rec.a.clone())
                } else {
                    None
                }
            })
            .collect()
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
        }
    }

    /// Sets the rate limiters' timers (the daemon's `--rate-fine` and `--rate-coarse`).
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

    /// Sets the rate limiters' timers (the daemon's `--rate-fine` and `--rate-coarse`).
    pub fn set_timers(&mut self, timers: Timers) {
        self.timers = timers;
    }

    /// Changes pipe `name`'s limits: each direction given is set (rate in bits/s, burst in
    /// bits; `None` burst: the default), the others are kept. Checked first; written ahead.
    pub fn set_rate(&mut self, name: &str, change: &RateChange) -> Result<RateInfo, ApiError> {
        let pipe = self.get(name)?.clone();
        let frame = mtu_frame(&pipe.info);
        let mut l = self.limits.get(name).copied().unwrap_or_default();
        let make = |rate: Option<u64>, burst: Option<u64>, what: &str| {
            rate.map(|r| {
                Limit::new(r, burst, frame, self.timers.coarse)
                    .map_err(|e| err(ErrorCode::BadParams, format!("{what}: {e}")))
            })
            .transpose()
        };
        if change.egress_bps.is_none() && change.ingress_bps.is_none() {
            return Err(err(
                ErrorCode::BadParams,
                "give an egress or an ingress rate (or clear the limits)",
            ));
        }
        if (change.egress_burst_bits.is_some() && change.egress_bps.is_none())
            || (change.ingress_burst_bits.is_some() && change.ingress_bps.is_none())
        {
            return Err(err(ErrorCode::BadParams, "a burst needs its rate"));
        }
        if let Some(e) = make(change.egress_bps, change.egress_burst_bits, "egress")? {
            l.egress = Some(e);
        }
        if let Some(i) = make(change.ingress_bps, change.ingress_burst_bits, "ingress")? {
            l.ingress = Some(i);
        }
        self.write_limits(name, l)?;
        self.rate_info(name)
    }

    /// Removes pipe `name`'s limits.
    pub fn clear_rate(&mut self, name: &str) -> Result<RateInfo, ApiError> {
        self.get(name)?;
        self.write_limits(name, Limits::default())?;
        self.rate_info(name)
    }

    fn write_limits(&mut self, name: &str, l: Limits) -> Result<(), ApiError> {
        let mut st = self.state();
        for p in st.pipes.iter_mut().filter(|p| p.name == name) {
            p.limits = l;
        }
        self.write(&st).map_err(|e| internal("saving state", e))?;
        if l.is_empty() {
            self.limits.remove(name);
        } else {
            self.limits.insert(name.into(), l);
        }
        Ok(())
    }

    /// Pipe `name`'s limits and its limiters' state.
    pub fn rate_info(&self, name: &str) -> Result<RateInfo, ApiError> {
        let p = self.get(name)?;
        let l = self.limits.get(name).copied().unwrap_or_default();
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let dir = |lim: Option<Limit>, st: &[AtomicU64]| {
            lim.map(|lim| RateDir {
                rate_bps: lim.rate_bps,
                burst_bits: lim.burst_bits,
                tokens_bits: ld(&st[0]),
                passed_bytes: ld(&st[1]),
                waits: ld(&st[2]),
                queued_bytes: st.get(3).map(ld),
            })
        };
        Ok(RateInfo {
            pipe: name.into(),
            egress_bps: l.egress.map(|x| x.rate_bps),
            ingress_bps: l.ingress.map(|x| x.rate_bps),
            egress: dir(l.egress, &p.rate.egress),
            ingress: dir(l.ingress, &p.rate.ingress),
            fine_us: self.timers.fine.as_micros() as u64,
            coarse_ms: self.timers.coarse.as_millis() as u64,
        })
    }

    /// Sets the MAC of the daemon's link to the wire (addresses no pipe owns go through it).
    pub fn set_gateway(&mut self, mac: Option<[u8; 6]>) {
        self.gateway = mac;
    }

    /// An in-process connection to pipe `name` (tests, and programs that run the daemon's
    /// registry themselves): the other end of a socket pair handed to [`Registry::add_conn`].
    pub fn connect_local(&mut self, name: &str) -> Result<OwnedFd, ApiError> {
        let (mine, theirs) = fdpass::pair().map_err(|e| internal("socketpair", e))?;
        fdpass::set_nonblocking(mine.as_fd(), true).map_err(|e| internal("socketpair", e))?;
        self.add_conn(name, mine)?;
        Ok(theirs)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        for ok in ["a", "web-1", "db_2.x", &"n".repeat(32), &"f".repeat(128)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", ".x", "a/b", "../x", "a b", &"n".repeat(129), "é"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_cidr("10.0.0.1/24").unwrap(),
            (Ipv4Addr::new(10, 0, 0, 1), 24)
        );
        assert!(parse_cidr("10.0.0.1/32").is_ok());
        for bad in [
            "10.0.0.1",
            "10.0.0.1/0",
            "10.0.0.1/33",
            "10.0.0.0/24",
            "10.0.0.255/24",
            "0.0.0.0/8",
            "127.0.0.1/8",
            "224.0.0.1/4",
            "x/24",
            "10.0.0.1/x",
        ] {
            assert_eq!(parse_cidr(bad).unwrap_err().code, ErrorCode::BadIp, "{bad}");
        }
    }

    #[test]
    fn ipv6_addresses_are_parsed_checked_recorded_and_handed_out() {
        assert_eq!(
            parse_cidr6("fd00:dc::2/64").unwrap(),
            ("fd00:dc::2".parse().unwrap(), 64)
        );
        for bad in [
            "fd00::1",
            "fd00::1/0",
            "fd00::1/129",
            "::/64",
            "::1/128",
            "ff02::1/64",
            "fe80::1/64",
            "::ffff:10.0.0.1/96",
            "10.0.0.1/24",
            "fd00::1/x",
        ] {
            let e = parse_cidr6(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::BadIp, "{bad}");
            assert!(!e.message.contains('\n'), "one line: {}", e.message);
        }
        let d = tempfile::tempdir().unwrap();
        let keeper = crate::holder::MemoryKeeper::default();
        let (mut r, _) = Registry::open(d.path(), Some(Box::new(keeper.clone()))).unwrap();
        let none = BTreeMap::new;
        r.create_pipe_dual("a", "10.9.0.1/24", Some("fd00:9::1/64"), None, None, none())
            .unwrap();
        let code = |e: ApiError| e.code;
        assert_eq!(
            code(
                r.create_pipe_dual("b", "10.9.0.2/24", Some("fd00:9::1/64"), None, None, none())
                    .unwrap_err()
            ),
            ErrorCode::IpInUse
        );
        assert_eq!(
            code(
                r.create_pipe_dual("b", "10.9.0.2/24", Some("fe80::2/64"), None, None, none())
                    .unwrap_err()
            ),
            ErrorCode::BadIp
        );
        r.create_pipe("b", "10.9.0.2/24", None, None).unwrap();
        let info = r.pipe_info("a", false).unwrap();
        assert_eq!(info.ip6.as_deref(), Some("fd00:9::1/64"));
        assert_eq!(r.pipe_info("b", false).unwrap().ip6, None);
        // the flow table knows a's global and link-local addresses, b has none
        let snap = r.snapshot();
        let ia = snap.pipes.iter().position(|p| p.name == "a").unwrap();
        let ll = docknet_pipe::delivery::link_local(mac_for(Ipv4Addr::new(10, 9, 0, 1)));
        assert_eq!(snap.table.lookup6("fd00:9::1".parse().unwrap()), Some(ia));
        assert_eq!(snap.table.lookup6(ll), Some(ia));
        // a's container is told its IPv6 address; b's channel partner learns a's
        r.connect_fc("a", "b", None).unwrap();
        let conn = r.connect_local("b").unwrap();
        let mut buf = [0u8; delivery::MAX_MSG];
        let mut peer6 = None;
        while let Ok(Some((n, _))) = fdpass::recv(conn.as_fd(), &mut buf) {
            match Msg::decode(&buf[..n]).unwrap() {
                Msg::Hello(p) => assert_eq!(p.ip6, None),
                Msg::Channel(c) => peer6 = c.peer_ip6,
                Msg::Synced => break,
                Msg::Closed { .. } => {}
            }
        }
        assert_eq!(peer6, Some("fd00:9::1".parse().unwrap()));
        // recorded, and adopted again after a restart
        drop(r);
        let (mut r, w) = Registry::open(d.path(), Some(Box::new(keeper))).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(r.pipe_info("a", false).unwrap().ip6, info.ip6);
        assert!(r.snapshot().table.lookup6(ll).is_some());
    }

    #[test]
    fn create_refusals_change_nothing_and_the_state_records_what_lives() {
        let d = tempfile::tempdir().unwrap();
        let (mut r, w) = Registry::open(d.path(), None).unwrap();
        assert!(w.is_empty());
        r.create_pipe("a", "10.9.0.1/24", None, None).unwrap();
        r.create_pipe("b", "10.9.0.2/24", Some(9000), None).unwrap();
        let code = |e: ApiError| e.code;
        let before = fs::read(d.path().join("state.json")).unwrap();
        assert_eq!(
            code(r.create_pipe("a", "10.9.0.3/24", None, None).unwrap_err()),
            ErrorCode::Exists
        );
        assert_eq!(
            code(r.create_pipe("c", "10.9.0.1/24", None, None).unwrap_err()),
            ErrorCode::IpInUse
        );
        assert_eq!(
            code(
                r.create_pipe("c", "10.9.0.3/24", Some(10), None)
                    .unwrap_err()
            ),
            ErrorCode::BadParams
        );
        assert_eq!(
            code(
                r.create_pipe("c", "10.9.0.3/24", None, Some(3))
                    .unwrap_err()
            ),
            ErrorCode::BadParams
        );
        assert_eq!(
            code(r.connect_fc("a", "a", None).unwrap_err()),
            ErrorCode::BadParams
        );
        assert_eq!(
            code(r.connect_fc("a", "zz", None).unwrap_err()),
            ErrorCode::NotFound
        );
        assert_eq!(
            code(r.remove_fc("a", "b").unwrap_err()),
            ErrorCode::NotFound
        );
        assert_eq!(
            code(r.attach("a", "/proc/self/status", None).unwrap_err()),
            ErrorCode::BadParams
        );
        assert_eq!(
            fs::read(d.path().join("state.json")).unwrap(),
            before,
            "refusals write nothing"
        );
        r.connect_fc("a", "b", Some(9000)).unwrap();
        assert_eq!(
            code(r.connect_fc("b", "a", None).unwrap_err()),
            ErrorCode::Exists
        );
        let st: StateFile =
            serde_json::from_slice(&fs::read(d.path().join("state.json")).unwrap()).unwrap();
        assert_eq!(st.pipes.len(), 2);
        assert_eq!((st.fcs.len(), st.fcs[0].id, st.next_channel), (1, 1, 2));
        let mode = fs::metadata(d.path()).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o700,
            "the run directory is the daemon's only"
        );
        r.remove_pipe("b").unwrap();
        assert!(r.fc_peers("a").is_empty());
        assert_eq!(code(r.remove_pipe("b").unwrap_err()), ErrorCode::NotFound);
        let st: StateFile =
            serde_json::from_slice(&fs::read(d.path().join("state.json")).unwrap()).unwrap();
        assert_eq!((st.pipes.len(), st.fcs.len()), (1, 0));
    }

    #[test]
    fn a_failed_save_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (mut r, _) = Registry::open(d.path(), None).unwrap();
        r.create_pipe("a", "10.9.0.1/24", None, None).unwrap();
        r.create_pipe("b", "10.9.0.2/24", None, None).unwrap();
        // state.json.tmp cannot be created: every change must fail whole
        fs::create_dir(d.path().join("state.json.tmp")).unwrap();
        assert!(r.create_pipe("c", "10.9.0.3/24", None, None).is_err());
        assert!(r.get("c").is_err());
        assert!(r.connect_fc("a", "b", None).is_err());
        assert!(r.fc_peers("a").is_empty());
        assert!(r.remove_pipe("a").is_err());
        assert!(r.get("a").is_ok(), "a refused removal keeps the pipe");
        fs::remove_dir(d.path().join("state.json.tmp")).unwrap();
        r.connect_fc("a", "b", None).unwrap();
    }

    #[test]
    fn a_reopened_registry_adopts_what_its_keeper_kept() {
        let d = tempfile::tempdir().unwrap();
        let keeper = crate::holder::MemoryKeeper::default();
        let (mut r, _) = Registry::open(d.path(), Some(Box::new(keeper.clone()))).unwrap();
        r.create_pipe("a", "10.9.0.1/24", None, None).unwrap();
        let labels = BTreeMap::from([("docknet.io/owner".to_string(), "cni".to_string())]);
        r.create_pipe_labeled("b", "10.9.0.2/24", Some(9000), Some(64), labels)
            .unwrap();
        r.connect_fc("a", "b", None).unwrap();
        let ns = format!("/proc/{}/ns/net", std::process::id());
        r.attach(
            "a",
            &ns,
            Some(&format!("docknet-test/{}", std::process::id())),
        )
        .unwrap();
        let before = fs::read(d.path().join("state.json")).unwrap();
        let mem = r.pipe_info("b", false).unwrap();
        drop(r); // the daemon dies; the keeper keeps
        let (mut r, w) = Registry::open(d.path(), Some(Box::new(keeper.clone()))).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(fs::read(d.path().join("state.json")).unwrap(), before);
        assert_eq!(r.pipe_info("b", false).unwrap(), mem);
        assert_eq!(r.fc_peers("a"), ["b"]);
        assert_eq!(r.attachments().len(), 1);
        assert_eq!(
            keeper.list().unwrap().len(),
            4,
            "pipe a, pipe b, channel, socket"
        );
        r.remove_pipe("a").unwrap();
        assert_eq!(
            keeper.list().unwrap().keys().collect::<Vec<_>>(),
            ["pipe/b"]
        );
    }

    #[test]
    fn long_names_and_labels_are_checked_recorded_and_reported() {
        let d = tempfile::tempdir().unwrap();
        let (mut r, _) = Registry::open(d.path(), None).unwrap();
        let id = "0123456789abcdef".repeat(4); // a container ID from containerd
        let labels = BTreeMap::from([
            ("docknet.io/owner".to_string(), "cni".to_string()),
            ("cni.dev/ifname".to_string(), "eth0".to_string()),
        ]);
        r.create_pipe_labeled(&id, "10.9.0.1/24", None, None, labels.clone())
            .unwrap();
        assert_eq!(r.pipe_info(&id, false).unwrap().labels, labels);
        let st: serde_json::Value =
            serde_json::from_slice(&fs::read(d.path().join("state.json")).unwrap()).unwrap();
        assert_eq!(st["pipes"][0]["labels"]["cni.dev/ifname"], "eth0");
        let mut code = |l: BTreeMap<String, String>| {
            r.create_pipe_labeled("x", "10.9.0.2/24", None, None, l)
                .unwrap_err()
                .code
        };
        let many: BTreeMap<String, String> =
            (0..17).map(|i| (format!("k{i}"), String::new())).collect();
        for bad in [
            many,
            BTreeMap::from([("/k".to_string(), "v".to_string())]),
            BTreeMap::from([("k y".to_string(), "v".to_string())]),
            BTreeMap::from([("k".to_string(), "new\nline".to_string())]),
            BTreeMap::from([("k".to_string(), "v".repeat(1025))]),
        ] {
            assert_eq!(code(bad), ErrorCode::BadParams);
        }
        assert!(r.get("x").is_err(), "a refused pipe is not created");
        r.remove_pipe(&id).unwrap();
        assert!(r.labels.is_empty());
    }

    #[test]
    fn state_records_are_checked_again_on_load() {
        let d = tempfile::tempdir().unwrap();
        let bad = r#"{"version": 2, "pipes": [
            {"name": "../x", "ip": "10.0.0.1", "prefix": 24, "mtu": 1500, "ring_depth": 1024},
            {"name": "p0", "ip": "10.0.0.2", "prefix": 0, "mtu": 1500, "ring_depth": 1024},
            {"name": "huge", "ip": "10.0.0.3", "prefix": 24, "mtu": 65535, "ring_depth": 65536},
            {"name": "mtu", "ip": "10.0.0.4", "prefix": 24, "mtu": 5, "ring_depth": 1024},
            {"name": "lab", "ip": "10.0.0.5", "prefix": 24, "mtu": 1500, "ring_depth": 1024,
             "labels": {"-x": "y"}}],
            "fcs": [{"id": 1, "a": "x", "b": "x", "mtu": 1500, "ring_depth": 2}],
            "attached": [{"pipe": "p0", "socket": "@@"}]}"#;
        fs::write(d.path().join("state.json"), bad).unwrap();
        let (r, w) = Registry::open(d.path(), None).unwrap();
        assert_eq!(r.pipes().count(), 0);
        assert_eq!(w.len(), 7, "{w:?}");
        assert!(w[4].contains("labels"), "{w:?}");
        assert!(w[1].contains("prefix"), "{w:?}");
    }

    #[test]
    fn a_connection_gets_its_pipe_and_channels_and_every_change() {
        let d = tempfile::tempdir().unwrap();
        let (mut r, _) = Registry::open(d.path(), None).unwrap();
        r.create_pipe("a", "10.9.0.1/24", None, None).unwrap();
        r.create_pipe("b", "10.9.0.2/24", None, None).unwrap();
        r.connect_fc("a", "b", None).unwrap();
        let c = r.connect_local("b").unwrap();
        let mut buf = [0u8; delivery::MAX_MSG];
        let mut next = || {
            let (n, fd) = fdpass::recv(c.as_fd(), &mut buf).unwrap().unwrap();
            (Msg::decode(&buf[..n]).unwrap(), fd.is_some())
        };
        let (hello, fd) = next();
        assert!(fd && matches!(hello, Msg::Hello(ref p) if p.name == "b" && p.depth == 1024));
        let (ch, fd) = next();
        let Msg::Channel(ch) = ch else {
            panic!("{ch:?}")
        };
        assert!(fd);
        assert_eq!(
            (ch.side, ch.peer.as_str(), ch.peer_ip),
            (Side::B, "a", Ipv4Addr::new(10, 9, 0, 1))
        );
        assert_eq!(ch.peer_mac, mac_for(Ipv4Addr::new(10, 9, 0, 1)));
        assert_eq!(next(), (Msg::Synced, false));
        r.remove_fc("a", "b").unwrap();
        assert_eq!(next(), (Msg::Closed { id: ch.id }, false));
        assert_eq!(r.connections("b"), 1);
        drop(c);
        assert_eq!(r.connections("b"), 0, "a closed connection is pruned");
        for _ in 0..MAX_CONNS {
            std::mem::forget(r.connect_local("a").unwrap());
        }
        assert_eq!(r.connect_local("a").unwrap_err().code, ErrorCode::Busy);
        assert_eq!(
            r.pipe_info("a", true).unwrap().counters.unwrap()["attach_refused"],
            1
        );
    }
}
