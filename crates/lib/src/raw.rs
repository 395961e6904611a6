//! The raw-frame endpoint: a container's view of its DockPipe and fast channels.
//!
//! Call order: [`Endpoint::attach_default`] (or [`Endpoint::connect`], or
//! [`Endpoint::from_connection`]) once; then any mix of [`Endpoint::send`] (queues, returns
//! which path it took) and [`Endpoint::flush`] (publishes queued frames, kicks sleepers), and
//! [`Endpoint::recv`] (fast channels first, then the rx ring). [`Endpoint::idle`] applies the
//! idle policy between empty polls; with `adaptive` or `block` it ends in a futex sleep on every
//! ring this endpoint reads plus the pipe's channel generation, so a new fast channel or any
//! frame wakes it.
//!
//! **How the pipe arrives.** The daemon binds an abstract Unix socket in the container's network
//! namespace (`@docknet/pipe`, or `$DOCKNET_PIPE`); connecting to it yields the pipe's region
//! and then every fast channel, as sealed memfds with their descriptions
//! ([`docknet_pipe::delivery`]). The connection stays open: channel changes arrive on it (the
//! daemon bumps the pipe's generation word to say so), and after a daemon restart the endpoint
//! reconnects. The ring layout is computed from what the daemon says, never read from a region's
//! header, and a channel's partner is who the daemon says it is: frames arriving on a channel
//! must carry the partner's MAC and IPv4 source address (IPv6: the partner's IPv6 or link-local
//! address), or they are dropped and counted. IPv6 frames go through a channel when their
//! destination is the partner's IPv6 or link-local address.

use crate::frame;
use docknet_pipe::delivery::{self, ChannelDesc, Msg, PipeDesc, Side};
use docknet_pipe::fdpass;
use docknet_pipe::layout::{self, Identity, Kind, RegionInfo};
use docknet_pipe::ring::RingStats;
use docknet_pipe::services::{self, Table};
use docknet_pipe::wake;
use docknet_pipe::{Consumer, IdlePolicy, Idler, Producer, PushError, Region};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable naming the pipe's socket (`@NAME` or `NAME`, abstract); default
/// [`delivery::DEFAULT_SOCKET`].
pub const PIPE_ENV: &str = "DOCKNET_PIPE";
/// Release the rx ring to the producer at least every this many frames.
const RELEASE_EVERY: u32 = 32;
/// How long the daemon may take to hand out a pipe.
const HANDSHAKE: Duration = Duration::from_secs(5);
/// Least time between two reconnection attempts.
const RECONNECT_EVERY: Duration = Duration::from_millis(100);
/// Least time between two looks at the daemon's connection after sleeps that ended by their
/// timeout ([`Endpoint::after_timeout`]).
const LOOK_EVERY: Duration = Duration::from_millis(100);
/// How long a message found by such a look may wait for the generation's bump that goes with
/// it (the daemon sends, then bumps) before it counts as one no bump announced.
const BUMP_WAIT: Duration = Duration::from_millis(5);

/// Why attaching failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// Nothing answers at the socket: not started by `docknet run`, or the pipe was removed.
    #[error("no DockPipe at @{socket} (run the program with `docknet run --pipe NAME`, or set {PIPE_ENV}=@SOCKET): {source}")]
    NotAttached {
        /// Where we looked.
        socket: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The daemon's hand-over was not what the protocol says.
    #[error("the DockNet daemon's hand-over of the pipe failed: {0}")]
    Handshake(String),
    /// The region that came is not usable.
    #[error("the pipe's region is not usable: {0}")]
    BadRegion(#[source] io::Error),
}

/// Why a send failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The ring (pipe tx or fast channel) is full; try again after the peer drains it.
    #[error("ring full")]
    Full,
    /// Frame empty or longer than every path's frame size.
    #[error("frame length {0} not accepted")]
    BadLength(usize),
    /// The daemon removed this pipe.
    #[error("pipe closed by the daemon")]
    Closed,
}

/// The path a frame took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Through the daemon (pipe tx/rx rings).
    Daemon,
    /// Through a fast channel.
    FastChannel,
}

/// Room reserved in the pipe's transmit ring ([`Endpoint::reserve_on_pipe`]).
#[derive(Debug)]
#[must_use]
pub struct PipeRoom {
    off: usize,
    len: usize,
}

/// The ring a frame goes out on ([`Endpoint::path_limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The pipe's tx ring, to the daemon.
    Daemon,
    /// The fast channel with this id.
    FastChannel(u64),
}

#[derive(Debug)]
struct FcLink {
    id: u64,
    peer_ip: Ipv4Addr,
    peer_mac: [u8; 6],
    /// The partner's IPv6 addresses (global, link-local), when it has IPv6.
    peer_ip6: Option<(Ipv6Addr, Ipv6Addr)>,
    /// The channel's MTU (its frames carry this much beyond the Ethernet header).
    mtu: u32,
    region: Arc<Region>,
    tx: Producer,
    rx: Consumer,
    rx_unreleased: u32,
    /// A channel that came while frames to the partner may still be queued for the daemon:
    /// not sent on until the daemon took every frame queued in the pipe before it came (the
    /// index), or until the deadline, so frames do not overtake each other.
    hold: Option<(u32, Instant)>,
    /// A channel whose partner may still have frames on their way through the daemon: until
    /// its first frame is seen, the pipe's rx ring is read first (see [`Endpoint::recv`]).
    fresh: bool,
    /// A channel the daemon removed: nothing more is sent on it, but what the partner wrote
    /// before it learnt of the removal is still read, until this deadline ([`DRAIN`]) and
    /// after it until the ring is empty (at most [`DRAIN_MAX`] more).
    closing: Option<Instant>,
}

impl FcLink {
    /// Whether frames may be sent on it now.
    fn open(&self) -> bool {
        self.hold.is_none() && self.closing.is_none()
    }

    /// Marks it removed, read until `until` (a removal already marked keeps its deadline);
    /// whether this removal is new ([`Endpoint::channel_epoch`] counts it).
    fn remove_by(&mut self, until: Instant) -> bool {
        let new = self.closing.is_none();
        self.closing.get_or_insert(until);
        new
    }
}

/// Longest a new fast channel waits for the daemon to take the frames queued before it.
const HOLD_MAX: Duration = Duration::from_millis(5);

/// How long a removed fast channel is still read. Both partners learn of the removal from the
/// daemon at about the same moment, but each only at its next call: frames the partner wrote
/// meanwhile, or that this end had not read yet, would otherwise be lost, and a TCP sender
/// whose whole window was lost waits out its retransmission timeout (1 s in smoltcp) before it
/// sends them again through the daemon. Past it the channel is still read until its ring is
/// empty (at most [`DRAIN_MAX`] more): a record (`frame::Record`) counts as delivered once
/// written, so none may be left.
const DRAIN: Duration = Duration::from_millis(500);

/// How long past [`DRAIN`] a removed channel is still read while frames wait in it. A partner
/// stops writing once it learns of the removal, so only one that lies keeps it that long; a
/// stack that reads nothing for longer (a stopped process) may lose what waited, and a record
/// lost is a connection reset at its next record (design.md §8, "Records").
const DRAIN_MAX: Duration = Duration::from_secs(10);

/// The largest TCP frame sent within the host beyond a path's MTU: 32 KiB of payload with
/// Ethernet, IPv4 and TCP headers. The rings carry 64 KiB, but a 256 KiB window holds only four
/// such segments, and a stream between blocking peers through the daemon then ran at 9.4-11.0
/// Gbps against 17.6-19.5 with 32 KiB (and 14.1-14.3 with 1460-byte segments); the HTTP chain
/// did no worse with 32 KiB (docs/benchmarks.md, "Segment offload").
pub const HOST_TCP_FRAME: usize = 32 * 1024 + frame::ETH + 40;

/// The largest frame a path carries: a TCP segment (`tcp`) up to [`HOST_TCP_FRAME`] (or the
/// MTU's frame if that is larger), within the ring's largest frame; anything else the MTU's
/// frame.
fn path_frame(tcp: bool, mtu: u32, ring: usize) -> usize {
    let mtu = (mtu as usize + frame::ETH).min(ring);
    if tcp {
        HOST_TCP_FRAME.max(mtu).min(ring)
    } else {
        mtu
    }
}

impl FcLink {
    /// The largest frame the channel carries, TCP or not ([`path_frame`]).
    fn limit(&self, tcp: bool) -> usize {
        path_frame(tcp, self.mtu, self.tx.layout().frame_size as usize)
    }
}

/// Counters of an endpoint (local to the container).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Frames received through the daemon.
    pub rx_daemon: u64,
    /// Frames received through fast channels.
    pub rx_fc: u64,
    /// Frames sent through the daemon.
    pub tx_daemon: u64,
    /// Frames sent through fast channels.
    pub tx_fc: u64,
    /// Refused descriptors and impossible indices seen on the rings this endpoint reads.
    pub bad_desc: u64,
    /// Fast channels the daemon announced that could not be used.
    pub bad_fc: u64,
    /// Services tables the daemon sent that could not be read (the previous one stays).
    pub bad_services: u64,
    /// Frames from a fast channel that did not come from the partner (dropped).
    pub fc_spoofed: u64,
    /// Futex sleeps.
    pub sleeps: u64,
    /// Connections to the daemon made again (after it restarted).
    pub reconnects: u64,
    /// Messages of the daemon that no change of the generation announced, found on the
    /// connection after a sleep that ended by its timeout ([`Endpoint::after_timeout`]): each
    /// is a lost notification, which without that look would have stayed unread (a channel
    /// never used, its partner's frames never read). Zero unless something is wrong.
    pub unannounced: u64,
    /// Messages of a type this DockLib does not know (a newer daemon's), skipped.
    pub unknown_msgs: u64,
}

/// A container's attachment to its DockPipe.
#[derive(Debug)]
pub struct Endpoint {
    conn: Option<OwnedFd>,
    socket: Option<String>,
    last_try: Option<Instant>,
    /// The last look at the connection after a sleep's timeout.
    last_look: Option<Instant>,
    /// Messages of the daemon taken in so far.
    handled: u64,
    /// After a reconnect: the channels announced so far, and whether a services table came,
    /// until `Synced`.
    resync: Option<(Vec<u64>, bool)>,
    name: String,
    /// The pipe's IPv6 address and prefix length, when it has one.
    ip6: Option<(Ipv6Addr, u8)>,
    region: Arc<Region>,
    info: RegionInfo,
    tx: Producer,
    rx: Consumer,
    rx_unreleased: u32,
    /// The last frame taken from `rx` was lent in place ([`Endpoint::recv_lending`]): its slot
    /// is released when the next frame is asked for or the endpoint flushes.
    rx_lent: bool,
    /// The channel (its id) whose last frame was split ([`Got::Split`]): its slot is released
    /// at the next take or flush.
    fc_split: Option<u64>,
    fcs: Vec<FcLink>,
    generation: u32,
    /// Fast channels removed since this endpoint opened ([`Endpoint::channel_epoch`]).
    removals: u32,
    idler: Idler,
    stats: EndpointStats,
    /// The services the daemon announced (connects to their addresses go to a backend).
    services: Arc<Table>,
    /// Where frames beyond the pipe's network go, when the daemon drives a link.
    gateway: Option<Ipv4Addr>,
    /// Threads of this process sleeping on the rings' words right now (armed with
    /// [`Endpoint::arm_sleep`], not yet [`Endpoint::disarm_sleep`]ed). The words are cleared only
    /// when the last one leaves: a thread that woke and cleared them under another thread still
    /// asleep would leave that one without a kick (it slept out its timeout).
    sleepers: u32,
    /// The rings' sleep words as of the last sleep (see [`SleepPlan`]).
    sleep_plan: Option<Arc<SleepPlan>>,
    /// Another process drives the pipe now (the stack moved at a fork): this copy never touches
    /// the rings, the sleep words or the daemon's connection again.
    inert: bool,
}

/// The futex words an endpoint sleeps on, armed by [`Endpoint::arm_sleep`]. Holds its regions
/// alive, so a thread can wait on it without holding the endpoint (e.g. outside a lock).
#[derive(Debug)]
pub struct SleepSet {
    plan: Arc<SleepPlan>,
    /// The offset of the tx ring's room word in the pipe's region, when the sleep waits for
    /// room there too.
    space: Option<usize>,
}

/// The rings' sleep words of an endpoint, as (region, offset): the receive ring's first, then
/// each channel's. Kept while the endpoint's channels stay the same, so that arming a sleep
/// takes one reference to the regions, not one per ring: each is an atomic write to a counter
/// that a process waking with cold caches misses on, and dropping them again showed in the
/// profile of many pairs taking turns on two cores.
#[derive(Debug)]
struct SleepPlan {
    words: Vec<(Arc<Region>, usize)>,
}

impl SleepSet {
    /// Sleeps until a producer kicks one of the rings (the daemon kicks the receive ring when
    /// the fast channels change), any of `private` (word, expected value) changes, or `timeout`
    /// passes. True when the timeout ended it (or a signal did). The words of `private` are
    /// this process's own memory, woken by [`wake::wake_private`] (a word other processes wake
    /// would not end the sleep).
    pub fn wait(&self, private: &[(&AtomicU32, u32)], timeout: Duration) -> bool {
        // (on the stack for the usual few rings: a sleep allocates nothing)
        let mut words: smallvec::SmallVec<[(&AtomicU32, u32); 8]> = self
            .plan
            .words
            .iter()
            .filter_map(|(r, off)| r.u32_at(*off).map(|w| (w, 1)))
            .collect();
        if let Some(off) = self.space {
            words.extend(self.plan.words[0].0.u32_at(off).map(|w| (w, 1)));
        }
        match wake::wait_mixed(&words, private, Some(timeout)) {
            Ok(w) => w == wake::Woke::TimedOut,
            Err(_) => {
                std::thread::sleep(Duration::from_micros(100));
                false
            }
        }
    }
}

impl Endpoint {
    /// Attaches to the pipe whose socket `$DOCKNET_PIPE` names, or `@docknet/pipe`.
    pub fn attach_default(policy: IdlePolicy) -> Result<Endpoint, AttachError> {
        let name = std::env::var(PIPE_ENV)
            .ok()
            .map(|s| s.trim_start_matches('@').to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| delivery::DEFAULT_SOCKET.into());
        Endpoint::connect(&name, policy)
    }

    /// Attaches to the pipe handed out at the abstract socket `name` (without `@`).
    pub fn connect(name: &str, policy: IdlePolicy) -> Result<Endpoint, AttachError> {
        let conn = fdpass::connect_abstract(name).map_err(|source| AttachError::NotAttached {
            socket: name.into(),
            source,
        })?;
        Endpoint::from_connection(conn, policy, Some(name.into()))
    }

    /// Attaches over a connection the daemon hands pipes out on (the other end of
    /// [`docknet_pipe::fdpass::pair`] in-process). With `socket`, the endpoint reconnects there
    /// after the daemon restarts.
    pub fn from_connection(
        conn: OwnedFd,
        policy: IdlePolicy,
        socket: Option<String>,
    ) -> Result<Endpoint, AttachError> {
        let hs = |e: String| AttachError::Handshake(e);
        nix::sys::socket::setsockopt(
            &conn,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(HANDSHAKE.as_secs() as i64, 0),
        )
        .map_err(|e| hs(e.to_string()))?;
        let Some((first, fd)) = recv_msg(&conn).map_err(|e| hs(e.to_string()))? else {
            return Err(hs("the first message is not the pipe".into()));
        };
        let (Msg::Hello(p), Some(fd)) = (first, fd) else {
            return Err(hs("the first message is not the pipe".into()));
        };
        let info = pipe_info(&p).map_err(|e| hs(e.to_string()))?;
        let region = Region::map_sealed(fd.as_fd(), info.size).map_err(AttachError::BadRegion)?;
        let region = Arc::new(region);
        let mut ep = Endpoint {
            conn: None,
            socket,
            last_try: None,
            last_look: None,
            handled: 0,
            resync: None,
            name: p.name.clone(),
            ip6: p.ip6,
            generation: layout::generation(&region),
            removals: 0,
            tx: Producer::adopt(&region, info.rings[0]),
            rx: Consumer::adopt(&region, info.rings[1]),
            region,
            info,
            rx_unreleased: 0,
            rx_lent: false,
            fc_split: None,
            fcs: Vec::new(),
            idler: Idler::new(policy),
            stats: EndpointStats::default(),
            services: Arc::default(),
            gateway: None,
            sleepers: 0,
            sleep_plan: None,
            inert: false,
        };
        loop {
            match recv_msg(&conn).map_err(|e| hs(e.to_string()))? {
                Some((Msg::Synced, _)) => break,
                Some((m, fd)) => ep.handle(m, fd),
                None => ep.stats.unknown_msgs += 1,
            }
        }
        fdpass::set_nonblocking(conn.as_fd(), true).map_err(|e| hs(e.to_string()))?;
        ep.conn = Some(conn);
        // A channel made since the daemon sent `Synced` came after it on the connection, and
        // its bump of the generation may be in the value read above already: then no change of
        // the generation would ever make this endpoint read it (its partner's frames would wait
        // in a channel it does not know). What came after `Synced` is read now.
        ep.sync();
        Ok(ep)
    }

    /// Threads of this process sleeping on the rings right now (armed, not yet disarmed).
    pub fn sleepers(&self) -> u32 {
        self.sleepers
    }

    /// The services the daemon announced: a connect to one of their addresses goes to one of
    /// its backends ([`docknet_pipe::services`]).
    pub fn services(&self) -> &Arc<Table> {
        &self.services
    }

    /// The pipe's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Where frames for addresses beyond the pipe's network go: the gateway the daemon gave
    /// (it drives a link), or `None` (the pipe reaches its own network only).
    pub fn gateway(&self) -> Option<Ipv4Addr> {
        self.gateway
    }
    /// This pipe's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.info.id.ip_a
    }
    /// Prefix length of its subnet.
    pub fn prefix(&self) -> u32 {
        self.info.id.ip_b_or_prefix
    }
    /// This pipe's IPv6 address and prefix length, when it has one (dual stack).
    pub fn ip6(&self) -> Option<(Ipv6Addr, u8)> {
        self.ip6
    }
    /// This pipe's MAC.
    pub fn mac(&self) -> [u8; 6] {
        self.info.id.mac_a
    }
    /// The pipe's MTU.
    pub fn mtu(&self) -> u32 {
        self.info.id.mtu
    }
    /// Largest frame the pipe carries.
    pub fn frame_size(&self) -> usize {
        self.info.rings[0].frame_size as usize
    }
    /// The path `frame` takes, and the largest frame that path carries: the fast channel to
    /// its destination, unless the frame is too large for the channel and not for the pipe
    /// (then the pipe, to the daemon). A frame longer than the limit goes nowhere as it is;
    /// what fits goes with [`Endpoint::send_parts_on`].
    /// Also says whether `frame` is a TCP SYN (whose MSS the sender clamps to the limit).
    pub fn path_limit(&self, frame: &[u8]) -> (Route, usize, bool) {
        let syn = crate::segment::tcp_syn(frame);
        let (route, max) = self.route_for(self.channel_to(frame), syn.is_some(), frame.len());
        (route, max, syn == Some(true))
    }

    /// [`Endpoint::path_limit`] for a frame of `len` bytes to `dst` before it is built (`tcp`:
    /// it carries a TCP segment).
    pub fn path_to(&self, dst: IpAddr, tcp: bool, len: usize) -> (Route, usize) {
        let channel = match dst {
            IpAddr::V4(ip) => self.channel_of(Some(ip), || None),
            IpAddr::V6(ip) => self.channel_of(None, || Some(ip)),
        };
        self.route_for(channel, tcp, len)
    }

    /// The path of a frame of `len` bytes towards fast channel `channel` (or none), and the
    /// largest frame it carries: the channel unless the frame is too large for it and not for
    /// the pipe.
    fn route_for(&self, channel: Option<usize>, tcp: bool, len: usize) -> (Route, usize) {
        let daemon = self.pipe_limit(tcp);
        match channel {
            Some(i) => {
                let l = &self.fcs[i];
                let fc = l.limit(tcp);
                if len > fc && len <= daemon {
                    (Route::Daemon, daemon)
                } else {
                    (Route::FastChannel(l.id), fc)
                }
            }
            None => (Route::Daemon, daemon),
        }
    }
    /// The largest frame the path back to `frame`'s sender carries (by its source address), for
    /// frames like `frame` (TCP or not).
    pub fn reply_limit(&self, frame: &[u8]) -> usize {
        let tcp = crate::segment::is_tcp(frame);
        let src4 = frame::ipv4_src(frame).map(|(ip, _)| ip);
        match self.channel_of(src4, || frame::ipv6_src(frame)) {
            Some(i) => self.fcs[i].limit(tcp),
            None => self.pipe_limit(tcp),
        }
    }
    /// The largest frame the pipe to the daemon carries, TCP or not ([`path_frame`]; the
    /// daemon clamps the MSS of connections that leave through the wire to the wire's MTU).
    fn pipe_limit(&self, tcp: bool) -> usize {
        path_frame(tcp, self.mtu(), self.frame_size())
    }
    /// Addresses of current fast-channel partners, with their largest frame.
    pub fn fc_peers(&self) -> Vec<(Ipv4Addr, usize)> {
        self.fcs
            .iter()
            .filter(|f| f.closing.is_none())
            .map(|f| (f.peer_ip, f.tx.layout().frame_size as usize))
            .collect()
    }
    /// Whether any fast channel may be sent on now.
    pub fn has_open_channel(&self) -> bool {
        self.fcs.iter().any(|l| l.open())
    }
    /// MAC of a fast-channel partner, known without ARP.
    pub fn fc_peer_mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.fcs
            .iter()
            .find(|f| f.peer_ip == ip && f.closing.is_none())
            .map(|f| f.peer_mac)
    }
    /// Counters.
    pub fn stats(&self) -> EndpointStats {
        let mut s = self.stats;
        let ring = |r: &RingStats| r.bad_desc + r.oversize + r.ring_overrun;
        s.bad_desc = ring(&self.rx.stats)
            + self.tx.stats.ring_overrun
            + self
                .fcs
                .iter()
                .map(|f| ring(&f.rx.stats) + f.tx.stats.ring_overrun)
                .sum::<u64>();
        s
    }
    /// How long ago the daemon last wrote its heartbeat (every 200 ms while it runs), or
    /// `None` if it never did. All namespaces share CLOCK_MONOTONIC, so this is comparable.
    pub fn daemon_silence(&self) -> Option<Duration> {
        let hb = layout::heartbeat(&self.region);
        if hb == 0 {
            return None;
        }
        let now_ms = wake::monotonic_ns() / 1_000_000;
        Some(Duration::from_millis(now_ms.saturating_sub(hb)))
    }

    /// True once the daemon has removed the pipe.
    pub fn is_closed(&self) -> bool {
        layout::flags(&self.region) & layout::FLAG_CLOSED != 0
    }

    /// The next ephemeral port (49152..=65000) of this pipe, shared by every process of the
    /// container: a process that starts anew does not pick a port another one used a moment
    /// ago, whose connection a peer may still hold in TIME-WAIT (its SYN would be answered
    /// only once that ends). The first taker starts the sequence at a random place.
    pub fn next_port(&self, seed: u64) -> u16 {
        const FIRST: u32 = 49152;
        const SPAN: u32 = 65000 - FIRST + 1;
        let Some(w) = layout::port_word(&self.region) else {
            return (FIRST + (seed % u64::from(SPAN)) as u32) as u16;
        };
        if w.load(Ordering::Relaxed) == 0 {
            let start = (seed % u64::from(SPAN)) as u32 | 0x8000_0000;
            let _ = w.compare_exchange(0, start, Ordering::Relaxed, Ordering::Relaxed);
        }
        let v = w.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff;
        (FIRST + v % SPAN) as u16
    }

    /// Takes in what the daemon said about channels if it said anything (the generation word
    /// changed). Cheap otherwise: one load. Called by `recv` and `idle`.
    pub fn refresh(&mut self) {
        if self.inert {
            return;
        }
        let g = layout::generation(&self.region);
        if g != self.generation || self.resync.is_some() {
            // (after a reconnect, until the daemon's hand-over has been read whole: the daemon
            // bumps nothing for it)
            self.generation = g;
            self.sync();
        }
        if self
            .fcs
            .iter()
            .any(|l| l.hold.is_some() || l.closing.is_some())
        {
            self.tend_channels();
        }
    }

    /// Lets new channels carry frames once the daemon took what was queued before them, and
    /// unmaps removed ones whose drain is over.
    fn tend_channels(&mut self) {
        let now = Instant::now();
        let before = self.fcs.len();
        // (a removed channel is read until it is empty: its records were taken as delivered
        // when they were written; its partner stopped writing once it learnt of the removal,
        // and one that goes on keeps it at most `DRAIN_MAX`)
        self.fcs.retain(|l| {
            l.closing.is_none_or(|until| {
                now < until || (l.rx.ready(&l.region) && now < until + DRAIN_MAX)
            })
        });
        if self.fcs.len() != before {
            // (the plan holds the removed regions mapped; the next sleep makes it again)
            self.sleep_plan = None;
        }
        for l in &mut self.fcs {
            if let Some((at, until)) = l.hold {
                if now >= until || self.tx.consumed(&self.region, at) {
                    l.hold = None;
                }
            }
        }
    }

    /// Reads every message waiting on the daemon connection; reconnects if it closed.
    fn sync(&mut self) {
        for _ in 0..2 {
            if self.conn.is_none() && !self.reconnect() {
                return;
            }
            // a hostile daemon is not in the threat model, but the loop is bounded anyway
            for _ in 0..4096 {
                let Some(conn) = &self.conn else { break };
                match recv_msg(conn) {
                    Ok(Some((m, fd))) => self.handle(m, fd),
                    Ok(None) => self.stats.unknown_msgs += 1,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(_) => self.conn = None,
                }
            }
        }
    }

    /// Connects to the pipe's socket again (at most every [`RECONNECT_EVERY`]).
    fn reconnect(&mut self) -> bool {
        let Some(name) = &self.socket else {
            return false;
        };
        if self.last_try.is_some_and(|t| t.elapsed() < RECONNECT_EVERY) {
            return false;
        }
        self.last_try = Some(Instant::now());
        let Ok(conn) = fdpass::connect_abstract(name) else {
            return false;
        };
        if fdpass::set_nonblocking(conn.as_fd(), true).is_err() {
            return false;
        }
        self.conn = Some(conn);
        self.resync = Some((Vec::new(), false));
        self.stats.reconnects += 1;
        true
    }

    /// Acts on one message from the daemon.
    fn handle(&mut self, m: Msg, fd: Option<OwnedFd>) {
        self.handled += 1;
        match m {
            Msg::Channel(c) => {
                if let Some((r, _)) = self.resync.as_mut() {
                    r.push(c.id);
                }
                if self.fcs.iter().any(|f| f.id == c.id) {
                    return;
                }
                match fd.and_then(|fd| open_fc(&c, fd).ok()) {
                    Some(mut l) => {
                        let at = self.tx.position();
                        if !self.tx.consumed(&self.region, at) {
                            l.hold = Some((at, Instant::now() + HOLD_MAX));
                        }
                        self.fcs.push(l);
                    }
                    None => self.stats.bad_fc += 1,
                }
            }
            Msg::Closed { id } => {
                if let Some(l) = self.fcs.iter_mut().find(|f| f.id == id) {
                    // what was queued on it goes out, and is read by the partner's drain
                    l.tx.publish(&l.region);
                    if l.remove_by(Instant::now() + DRAIN) {
                        self.removals = self.removals.wrapping_add(1);
                    }
                }
            }
            Msg::Synced => {
                if let Some((ids, services)) = self.resync.take() {
                    // channels the daemon no longer has are drained as removed ones are (their
                    // records count as delivered)
                    let until = Instant::now() + DRAIN;
                    for f in self.fcs.iter_mut().filter(|f| !ids.contains(&f.id)) {
                        if f.remove_by(until) {
                            self.removals = self.removals.wrapping_add(1);
                        }
                    }
                    self.sleep_plan = None;
                    // a daemon that sent no table has no services (any more)
                    if !services {
                        self.services = Arc::default();
                    }
                }
            }
            Msg::Services { len } => match fd.map(|fd| services::read_sealed(fd, len as usize)) {
                Some(Ok(t)) => self.services = Arc::new(t),
                _ => self.stats.bad_services += 1,
            },
            Msg::Gateway { ip } => self.gateway = Some(ip),
            // the pipe again, after a reconnect: the region we have is the one; the new daemon
            // says again whether it drives a link
            Msg::Hello(_) => self.gateway = None,
        }
    }

    /// Queues one Ethernet frame: through the fast channel to its destination IP if there is
    /// one and the frame fits, else through the daemon. Not visible until [`Endpoint::flush`].
    pub fn send(&mut self, frame: &[u8]) -> Result<Via, SendError> {
        self.send_parts(&[frame])
    }

    /// The fast channel a frame of `len` bytes that starts with `head` would take.
    fn channel_for_len(&self, head: &[u8], len: usize) -> Option<usize> {
        let i = self.channel_to(head)?;
        (len <= self.fcs[i].tx.layout().frame_size as usize).then_some(i)
    }

    /// The fast channel to `frame`'s destination (its index), if any, whatever the size.
    fn channel_to(&self, frame: &[u8]) -> Option<usize> {
        self.channel_of(frame::ipv4_dst(frame), || frame::ipv6_dst(frame))
    }

    /// How many fast channels were removed since this endpoint opened (wrapping): what a
    /// connection learnt about its peer over a channel (that it takes records) holds only
    /// until the next removal, after which another container may have the peer's address.
    #[inline]
    pub fn channel_epoch(&self) -> u32 {
        self.removals
    }

    /// Whether this endpoint has fast channels (open or not).
    #[inline]
    pub fn has_channels(&self) -> bool {
        !self.fcs.is_empty()
    }

    /// The fast channel whose partner has IPv4 address `ip4`, or (with none) the IPv6 address
    /// `ip6` gives (global or link-local).
    fn channel_of(
        &self,
        ip4: Option<Ipv4Addr>,
        ip6: impl FnOnce() -> Option<Ipv6Addr>,
    ) -> Option<usize> {
        match ip4 {
            Some(ip) => self.fcs.iter().position(|l| l.peer_ip == ip && l.open()),
            None => ip6().and_then(|ip| {
                self.fcs
                    .iter()
                    .position(|l| l.open() && l.peer_ip6.is_some_and(|(g, ll)| g == ip || ll == ip))
            }),
        }
    }

    /// [`Endpoint::send`] for the frame that is the concatenation of `parts` (the first holds
    /// its headers up to the destination address): it is written into the ring part by part.
    pub fn send_parts(&mut self, parts: &[&[u8]]) -> Result<Via, SendError> {
        let (head, len) = (
            parts.first().copied().unwrap_or(&[]),
            parts.iter().map(|p| p.len()).sum::<usize>(),
        );
        let route = match self.channel_for_len(head, len) {
            Some(i) => Route::FastChannel(self.fcs[i].id),
            None => Route::Daemon,
        };
        self.send_parts_on(route, parts)
    }

    /// Queues the frame that is the concatenation of `parts` on the path `route` (as
    /// [`Endpoint::path_limit`] chose it); a channel gone since goes through the daemon.
    pub fn send_parts_on(&mut self, route: Route, parts: &[&[u8]]) -> Result<Via, SendError> {
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        if len == 0 {
            return Err(SendError::BadLength(0));
        }
        if self.inert {
            return Err(SendError::Closed);
        }
        let fc = match route {
            Route::FastChannel(id) => self
                .fcs
                .iter()
                .position(|l| l.id == id && l.closing.is_none()),
            Route::Daemon => None,
        };
        if let Some(i) = fc {
            let l = &mut self.fcs[i];
            return match l.tx.push_parts(&l.region, parts, 0) {
                Ok(()) => {
                    self.stats.tx_fc += 1;
                    Ok(Via::FastChannel)
                }
                Err(PushError::Full) => Err(SendError::Full),
                Err(PushError::BadLength) => Err(SendError::BadLength(len)),
            };
        }
        if self.is_closed() {
            return Err(SendError::Closed);
        }
        match self.tx.push_parts(&self.region, parts, 0) {
            Ok(()) => {
                self.stats.tx_daemon += 1;
                Ok(Via::Daemon)
            }
            Err(PushError::Full) => Err(SendError::Full),
            Err(PushError::BadLength) => Err(SendError::BadLength(len)),
        }
    }

    /// Room for a frame of `len` bytes in the pipe's transmit ring (the path to the daemon), to
    /// build the frame in place with [`Endpoint::build_on_pipe`]. `Err` as
    /// [`Endpoint::send_parts_on`] would fail for such a frame; nothing is reserved then.
    pub fn reserve_on_pipe(&mut self, len: usize) -> Result<PipeRoom, SendError> {
        if len == 0 || len > self.tx.layout().frame_size as usize {
            return Err(SendError::BadLength(len));
        }
        if self.inert || self.is_closed() {
            return Err(SendError::Closed);
        }
        let slot = self
            .tx
            .reserve_len(&self.region, len)
            .ok_or(SendError::Full)?;
        Ok(PipeRoom { off: slot.off, len })
    }

    /// Builds the frame in `room` with `f` and queues it (published by the next
    /// [`Endpoint::flush`]), as [`Endpoint::send_parts_on`] queues a copied one. The frame is
    /// built in shared memory: the pipe's ring, which only the daemon reads and only this
    /// container writes ([`docknet_pipe::region::Region::lend_mut`]), never a fast channel's.
    pub fn build_on_pipe<R>(&mut self, room: PipeRoom, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match self.region.lend_mut(room.off, room.len, f) {
            Ok(r) => {
                if self.tx.commit(&self.region, room.len, 0).is_ok() {
                    self.stats.tx_daemon += 1;
                }
                r
            }
            // a room reserve gave is inside the region; were it not, the frame is not sent
            Err(f) => f(&mut vec![0; room.len]),
        }
    }

    /// Publishes queued frames on every path and kicks sleeping consumers.
    pub fn flush(&mut self) {
        if self.inert {
            return;
        }
        self.end_lend();
        self.tx.publish(&self.region);
        for l in &mut self.fcs {
            l.tx.publish(&l.region);
        }
    }

    /// Sends and flushes, retrying (with the idle policy) while the ring is full, until
    /// `deadline`.
    pub fn send_blocking(&mut self, frame: &[u8], deadline: Instant) -> Result<Via, SendError> {
        // fast path: no clock read, no idler, when there is room
        if let Ok(v) = self.send(frame) {
            self.flush();
            return Ok(v);
        }
        let mut idler = Idler::new(self.idler.policy());
        loop {
            match self.send(frame) {
                Ok(v) => {
                    self.flush();
                    return Ok(v);
                }
                Err(SendError::Full) if Instant::now() < deadline => {
                    self.flush();
                    if idler.step() {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Copies the next received frame into `buf` (fast channels first, then the rx ring) and
    /// returns its length and path, or `None` when nothing is waiting. Frames longer than
    /// `buf` are truncated to it. A frame from a channel that does not carry the partner's MAC
    /// and IPv4 source is dropped and counted (`fc_spoofed`).
    pub fn recv(&mut self, buf: &mut [u8]) -> Option<(usize, Via)> {
        match self.recv_lending(buf, usize::MAX, usize::MAX)? {
            (Got::Copied(n), via) => Some((n, via)),
            // nothing is lent above usize::MAX bytes
            (Got::Lent(..) | Got::Split(..), _) => None,
        }
    }

    /// [`Endpoint::recv`], except that a TCP segment longer than `over` bytes from the daemon's
    /// ring, not a SYN, is left in the ring and lent ([`Got::Lent`]) instead of copied: its
    /// headers are copied into `buf` and the whole frame is read in place through the
    /// [`LentFrame`], until the next call or [`Endpoint::flush`] releases it. Only the daemon's
    /// frames are lent (the daemon writes a slot of the pipe's ring only once the endpoint
    /// released it). A fast channel's partner is another container, so such a segment of a
    /// channel's, or a record ([`crate::frame::Record`]), longer than `split_over` bytes, is
    /// left in place the same way but split ([`Got::Split`]): its headers copied into `buf`
    /// and checked, its payload copied out later, once, never read in place. It is split only
    /// when `buf` could have held it whole.
    pub fn recv_lending(
        &mut self,
        buf: &mut [u8],
        over: usize,
        split_over: usize,
    ) -> Option<(Got, Via)> {
        if self.inert {
            return None;
        }
        self.end_lend();
        self.refresh();
        if self.fcs.iter().any(|l| l.fresh) {
            // A new channel's partner sends on it once the daemon took its earlier frames, and
            // the daemon puts a frame in this rx ring before it lets the partner see it taken:
            // so once a frame shows in the channel, the partner's earlier frames are in the rx
            // ring, and are read first.
            // (whether each shows a frame is looked at before the rx ring is found empty)
            let seen = self
                .fcs
                .iter()
                .take(64)
                .enumerate()
                .fold(0u64, |m, (k, l)| {
                    m | (u64::from(l.rx.ready(&l.region)) << k)
                });
            if let Some(got) = self.take_daemon(buf, over) {
                self.stats.rx_daemon += 1;
                return Some((got, Via::Daemon));
            }
            for (k, l) in self.fcs.iter_mut().take(64).enumerate() {
                l.fresh &= seen & (1 << k) == 0;
            }
        }
        for l in &mut self.fcs {
            // bounded: at most a ring's worth of refused frames per call
            for _ in 0..l.rx.layout().depth {
                let mut split = None;
                let Some(n) = take_with(&l.region, &mut l.rx, &mut l.rx_unreleased, |f| {
                    let head = f.len.min(crate::segment::MAX_HEADERS);
                    if f.len > split_over
                        && f.len <= buf.len()
                        && l.region.read(f.off, &mut buf[..head])
                    {
                        // (the bytes copied past the headers are the partner's to rewrite:
                        // only the headers count as read)
                        // a plain TCP segment's headers, or a record's
                        let record = crate::frame::Record::is_one(&buf[..head])
                            && head >= crate::frame::RECORD_HEAD;
                        if let Some(payload) =
                            crate::segment::plain_tcp_payload(&buf[..head], f.len)
                                .or(record.then_some(crate::frame::RECORD_HEAD))
                        {
                            split = Some(LentFrame {
                                region: l.region.clone(),
                                off: f.off,
                                len: f.len,
                                partner: true,
                            });
                            return (payload, true);
                        }
                    }
                    let n = f.len.min(buf.len());
                    l.region.read(f.off, &mut buf[..n]);
                    (n, false)
                }) else {
                    break;
                };
                if from_partner(&buf[..n], l.peer_ip, l.peer_mac, l.peer_ip6) {
                    self.stats.rx_fc += 1;
                    return Some(match split {
                        Some(s) => {
                            self.fc_split = Some(l.id);
                            (Got::Split(s, n), Via::FastChannel)
                        }
                        None => (Got::Copied(n), Via::FastChannel),
                    });
                }
                if split.is_some() {
                    l.rx.release(&l.region);
                    l.rx_unreleased = 0;
                }
                self.stats.fc_spoofed += 1;
            }
        }
        let got = self.take_daemon(buf, over)?;
        self.stats.rx_daemon += 1;
        Some((got, Via::Daemon))
    }

    /// The next frame of the daemon's ring, lent when [`Endpoint::recv_lending`] says so.
    fn take_daemon(&mut self, buf: &mut [u8], over: usize) -> Option<Got> {
        let (region, c) = (&self.region, &mut self.rx);
        let mut lent = None;
        let n = take_with(region, c, &mut self.rx_unreleased, |f| {
            let head = f.len.min(crate::segment::MAX_HEADERS).min(buf.len());
            if f.len > over
                && region.read(f.off, &mut buf[..head])
                && crate::segment::plain_tcp_head(&buf[..head], f.len)
            {
                lent = Some(LentFrame {
                    region: region.clone(),
                    off: f.off,
                    len: f.len,
                    partner: false,
                });
                return (head, true);
            }
            let n = f.len.min(buf.len());
            region.read(f.off, &mut buf[..n]);
            (n, false)
        })?;
        self.rx_lent = lent.is_some();
        Some(match lent {
            Some(l) => Got::Lent(l, n),
            None => Got::Copied(n),
        })
    }

    /// Releases the slot of a frame lent by the last [`Endpoint::recv_lending`].
    #[inline]
    fn end_lend(&mut self) {
        if std::mem::take(&mut self.rx_lent) {
            self.rx.release(&self.region);
            self.rx_unreleased = 0;
        }
        if self.fc_split.is_some() {
            self.end_split();
        }
    }

    /// Ends the loan of a fast channel's frame split by the last [`Endpoint::recv_lending`]:
    /// its slot is released as a copied frame's is, with the slots taken before it, every
    /// [`RELEASE_EVERY`] frames or once the ring is empty (each release is a write the partner's
    /// core reads).
    fn end_split(&mut self) {
        if let Some(id) = self.fc_split.take() {
            if let Some(l) = self.fcs.iter_mut().find(|l| l.id == id) {
                if l.rx_unreleased >= RELEASE_EVERY || !l.rx.ready(&l.region) {
                    l.rx.release(&l.region);
                    l.rx_unreleased = 0;
                }
            }
        }
    }

    /// Discards every frame queued for this endpoint and returns how many there were. A server
    /// calls it once on start so that frames left by an earlier run are not taken as new. At
    /// most one ring's worth per ring: a producer that keeps refilling cannot hold it here.
    pub fn drain(&mut self) -> u64 {
        let mut buf = vec![0u8; 64];
        let most = u64::from(self.rx.layout().depth)
            + self
                .fcs
                .iter()
                .map(|f| u64::from(f.rx.layout().depth))
                .sum::<u64>();
        let mut n = 0;
        while n < most && self.recv(&mut buf).is_some() {
            n += 1;
        }
        n
    }

    /// Resolves `ip` to a MAC: a fast-channel partner's is known; otherwise asks the daemon
    /// with ARP. Frames other than the answer that arrive meanwhile are discarded, so call
    /// this before traffic starts.
    pub fn resolve(&mut self, ip: Ipv4Addr, timeout: Duration) -> Option<[u8; 6]> {
        if let Some(m) = self.fc_peer_mac(ip) {
            return Some(m);
        }
        let deadline = Instant::now() + timeout;
        let req = frame::arp_request(self.mac(), self.ip(), ip);
        let mut buf = vec![0u8; self.frame_size()];
        let mut next_ask = Instant::now();
        while Instant::now() < deadline {
            if Instant::now() >= next_ask {
                if self.send(&req).is_ok() {
                    self.flush();
                }
                next_ask = Instant::now() + Duration::from_millis(200);
            }
            match self.recv(&mut buf) {
                Some((n, _)) => {
                    if let Some((from, mac)) = frame::arp_reply_sender(&buf[..n]) {
                        if from == ip {
                            return Some(mac);
                        }
                    }
                }
                None => self.idle(Duration::from_millis(20)),
            }
        }
        None
    }

    /// Call after a poll that found nothing: spins, yields or sleeps per the idle policy.
    /// A sleep ends on a kick from any producer, a fast-channel change, or `max_sleep`.
    pub fn idle(&mut self, max_sleep: Duration) {
        if self.idler.step() {
            self.sleep(max_sleep);
        }
    }

    /// Resets the idle policy after useful work.
    pub fn busy(&mut self) {
        self.idler.busy();
    }

    fn sleep(&mut self, max_sleep: Duration) {
        if let Some(set) = self.arm_sleep() {
            self.stats.sleeps += 1;
            let timed_out = set.wait(&[], max_sleep);
            self.disarm_sleep();
            if timed_out {
                self.after_timeout();
            }
        }
    }

    /// After a sleep that ended by its timeout: reads the daemon's connection (at most every
    /// 100 ms, one system call) for a message that no change of the generation
    /// announced, and counts each such one ([`EndpointStats::unannounced`]). Messages are read
    /// when the generation changes; one whose bump this endpoint never sees (as when a channel
    /// was made while the pipe was handed over, or read off a connection shared with a forked
    /// process) would otherwise stay unread for good, with a partner's frames waiting in a
    /// channel this end does not know. The look bounds any such loss by the sleep's timeout.
    pub fn after_timeout(&mut self) {
        if self.inert || self.conn.is_none() {
            return;
        }
        let now = Instant::now();
        if self
            .last_look
            .is_some_and(|t| now.duration_since(t) < LOOK_EVERY)
        {
            return;
        }
        self.last_look = Some(now);
        let (seen, before) = (self.generation, self.handled);
        self.sync();
        if self.handled == before {
            return;
        }
        // The daemon sends a message, then bumps: one read in between is announced a moment
        // later and is not lost.
        while layout::generation(&self.region) == seen && now.elapsed() < BUMP_WAIT {
            std::thread::yield_now();
        }
        if layout::generation(&self.region) == seen {
            self.stats.unannounced += self.handled - before;
        }
    }

    /// Whether the tx ring to the daemon is full (the daemon has not taken what was sent).
    pub fn tx_full(&mut self) -> bool {
        !self.inert && self.tx.space(&self.region) == 0
    }

    /// Arms the sleep words of every ring this endpoint reads and returns them, or `None`
    /// when work arrived meanwhile (nothing to undo then). After waiting on `Some`, call
    /// [`Endpoint::disarm_sleep`] once. Several threads may sleep at once (each arms, each
    /// disarms): the words stay armed until the last of them disarms.
    pub fn arm_sleep(&mut self) -> Option<SleepSet> {
        if self.inert {
            return None;
        }
        let mut pending = self.rx.arm(&self.region);
        for l in &mut self.fcs {
            pending |= l.rx.arm(&l.region);
        }
        // A change of the channels since the last look: the daemon bumps the generation and
        // then kicks the receive ring if armed, so it is seen here (after the ring's arming
        // and its fence) or wakes the sleep (see `layout::bump_generation`).
        pending |= layout::generation(&self.region) != self.generation;
        // a full tx ring (e.g. held back by a rate limit): the daemon kicks when it frees room
        let full = self.tx.space(&self.region) == 0;
        if full {
            pending |= self.tx.arm_space(&self.region);
        }
        if pending {
            if self.sleepers == 0 {
                self.clear_sleep_words();
            }
            self.refresh();
            return None;
        }
        self.sleepers += 1;
        Some(SleepSet {
            plan: self.sleep_plan(),
            space: full.then(|| self.info.rings[0].space_off()),
        })
    }

    /// The rings' sleep words ([`SleepPlan`]), made again only when the channels changed.
    fn sleep_plan(&mut self) -> Arc<SleepPlan> {
        let rx = self.info.rings[1].sleep_off();
        let same = |p: &SleepPlan| {
            p.words.len() == 1 + self.fcs.len()
                && Arc::ptr_eq(&p.words[0].0, &self.region)
                && p.words[0].1 == rx
                && p.words[1..].iter().zip(&self.fcs).all(|((r, off), l)| {
                    Arc::ptr_eq(r, &l.region) && *off == l.rx.layout().sleep_off()
                })
        };
        match &self.sleep_plan {
            Some(p) if same(p) => p.clone(),
            _ => {
                let mut words = vec![(self.region.clone(), rx)];
                words.extend(
                    self.fcs
                        .iter()
                        .map(|l| (l.region.clone(), l.rx.layout().sleep_off())),
                );
                let p = Arc::new(SleepPlan { words });
                self.sleep_plan = Some(p.clone());
                p
            }
        }
    }

    /// Ends one sleep armed by [`Endpoint::arm_sleep`]: the last sleeper out clears the sleep
    /// words; picks up fast-channel changes.
    pub fn disarm_sleep(&mut self) {
        self.sleepers = self.sleepers.saturating_sub(1);
        if self.inert {
            return;
        }
        if self.sleepers == 0 {
            self.clear_sleep_words();
        }
        self.refresh();
    }

    /// Ends one sleep armed by [`Endpoint::arm_sleep`] without touching the words or the
    /// daemon's connection: this process may no longer drive the pipe (a fork not settled).
    pub(crate) fn leave_sleep(&mut self) {
        self.sleepers = self.sleepers.saturating_sub(1);
    }

    /// Makes this endpoint inert: another process drives the pipe now (see the `fork` module).
    /// Nothing it does afterwards touches the rings, their words or the daemon's connection.
    pub(crate) fn set_inert(&mut self) {
        self.inert = true;
    }

    /// Whether another process drives the pipe now.
    pub fn is_inert(&self) -> bool {
        self.inert
    }

    /// After this process took the pipe over at a fork: the sleepers counted were the other
    /// process's threads, so none sleeps here; their words are cleared (this process's
    /// threads arm them afresh).
    pub(crate) fn taken_over(&mut self) {
        self.sleepers = 0;
        self.clear_sleep_words();
        self.refresh();
    }

    fn clear_sleep_words(&mut self) {
        self.rx.disarm(&self.region);
        self.tx.disarm_space(&self.region);
        for l in &self.fcs {
            l.rx.disarm(&l.region);
        }
    }
}

impl Drop for Endpoint {
    /// Publishes how far this endpoint has read (so a later attachment does not see the same
    /// frames again) and what it has queued.
    fn drop(&mut self) {
        if self.inert {
            return;
        }
        self.rx.release(&self.region);
        self.tx.publish(&self.region);
        for l in &mut self.fcs {
            l.rx.release(&l.region);
            l.tx.publish(&l.region);
        }
    }
}

/// Whether a frame from a fast channel comes from the partner: its MAC, and its IPv4 source
/// address, or for IPv6 (from a partner that has IPv6) its IPv6 or link-local source address.
/// (ARP and neighbour discovery are never sent over a channel: they go to the daemon.)
fn from_partner(f: &[u8], ip: Ipv4Addr, mac: [u8; 6], ip6: Option<(Ipv6Addr, Ipv6Addr)>) -> bool {
    if f.len() < frame::ETH + frame::IPV4 || f[6..12] != mac {
        return false;
    }
    if f[12..14] == frame::ETHERTYPE_IPV4.to_be_bytes() {
        return f[frame::ETH + 12..frame::ETH + 16] == ip.octets();
    }
    if frame::Record::is_one(f) {
        return f[frame::ETH..frame::ETH + 4] == ip.octets();
    }
    match (frame::ipv6_src(f), ip6) {
        (Some(src), Some((g, ll))) => src == g || src == ll,
        _ => false,
    }
}

/// One message from the daemon (with its fd, if one came).
/// One message from the daemon; `None`: one of a type this DockLib does not know (a newer
/// daemon's), skipped with its descriptor.
fn recv_msg(conn: &OwnedFd) -> io::Result<Option<(Msg, Option<OwnedFd>)>> {
    let mut buf = [0u8; delivery::MAX_MSG];
    match fdpass::recv(conn.as_fd(), &mut buf)? {
        Some((n, fd)) => match Msg::decode(&buf[..n]) {
            Ok(m) => Ok(Some((m, fd))),
            Err(delivery::DecodeError::Unknown(_)) => Ok(None),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        },
        None => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the daemon hung up",
        )),
    }
}

/// The planned layout of a pipe as the daemon describes it.
fn pipe_info(p: &PipeDesc) -> Result<RegionInfo, layout::LayoutError> {
    let id = Identity {
        ip_a: p.ip,
        ip_b_or_prefix: u32::from(p.prefix),
        mac_a: p.mac,
        mac_b: [0; 6],
        mtu: p.mtu,
    };
    RegionInfo::planned(Kind::Pipe, id, p.depth)
}

/// Maps a fast channel the daemon announced, with the rings of our side.
fn open_fc(c: &ChannelDesc, fd: OwnedFd) -> io::Result<FcLink> {
    let id = Identity {
        ip_a: Ipv4Addr::UNSPECIFIED,
        ip_b_or_prefix: 0,
        mac_a: [0; 6],
        mac_b: [0; 6],
        mtu: c.mtu,
    };
    let info = RegionInfo::planned(Kind::FastChannel, id, c.depth)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let region = Arc::new(Region::map_sealed(fd.as_fd(), info.size)?);
    // ring 0 carries A -> B
    let (tx, rx) = match c.side {
        Side::A => (info.rings[0], info.rings[1]),
        Side::B => (info.rings[1], info.rings[0]),
    };
    Ok(FcLink {
        id: c.id,
        peer_ip: c.peer_ip,
        peer_mac: c.peer_mac,
        peer_ip6: c.peer_ip6.map(|g| (g, delivery::link_local(c.peer_mac))),
        mtu: c.mtu,
        tx: Producer::adopt(&region, tx),
        rx: Consumer::adopt(&region, rx),
        region,
        rx_unreleased: 0,
        hold: None,
        fresh: true,
        closing: None,
    })
}

/// Takes the next frame of `c` and hands it to `got`, which says how many bytes it copied and
/// whether it keeps the frame in place (then its slot, and those after the last release, stay
/// unreleased: the caller releases them once done with it). Refused descriptors (counted by
/// the ring) are skipped, a ring's depth of them at most.
fn take_with(
    region: &Region,
    c: &mut Consumer,
    unreleased: &mut u32,
    mut got: impl FnMut(docknet_pipe::ring::Frame) -> (usize, bool),
) -> Option<usize> {
    for _ in 0..=c.layout().depth {
        let r = c.pop(region)?;
        *unreleased += 1;
        let out = r.ok().map(&mut got);
        let kept = out.is_some_and(|(_, kept)| kept);
        if !kept && (*unreleased >= RELEASE_EVERY || !c.ready(region)) {
            c.release(region);
            *unreleased = 0;
        }
        if let Some((n, _)) = out {
            return Some(n);
        }
    }
    None
}

/// What [`Endpoint::recv_lending`] took.
#[derive(Debug)]
pub enum Got {
    /// The frame, copied into the caller's buffer: its length there.
    Copied(usize),
    /// The frame, left in place, and how many of its first bytes (its headers) were copied
    /// into the caller's buffer.
    Lent(LentFrame, usize),
    /// A fast channel's TCP segment, not a SYN, left in place as [`Got::Lent`], except that its
    /// partner, another container, may rewrite it at any time: it is never read in place
    /// ([`LentFrame::read`] refuses it), only copied out ([`LentFrame::copy_at`]): its headers,
    /// checked, are in the caller's buffer (the number is their length), its payload is copied
    /// once, where it is to go.
    Split(LentFrame, usize),
}

/// A frame left in the pipe's receive ring ([`Got::Lent`]), readable until the endpoint's
/// next [`Endpoint::recv_lending`] or [`Endpoint::flush`].
#[derive(Debug)]
pub struct LentFrame {
    region: Arc<Region>,
    off: usize,
    len: usize,
    /// In a fast channel's ring, which the partner can write: never read in place.
    partner: bool,
}

impl LentFrame {
    /// The frame's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it may be read in place ([`LentFrame::read`]): the daemon's, not a fast
    /// channel's ([`Got::Split`]).
    pub fn in_place(&self) -> bool {
        !self.partner
    }

    /// Never true: an empty frame is refused by the ring.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads the frame in place with `f` (an empty frame, were its place out of the region,
    /// or were it a fast channel's, [`Got::Split`]).
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        if self.partner {
            return f(&[]);
        }
        match self.region.lend(self.off, self.len, f) {
            Ok(r) => r,
            Err(f) => f(&[]),
        }
    }

    /// Copies the frame's bytes from `at` on into `dst` (`dst.len()` of them); false, `dst`
    /// untouched, when they lie beyond the frame.
    pub fn copy_at(&self, at: usize, dst: &mut [u8]) -> bool {
        at.checked_add(dst.len()).is_some_and(|end| end <= self.len)
            && self.region.read(self.off + at, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_of_a_newer_daemon_is_skipped_and_a_broken_one_is_an_error() {
        let (daemon, container) = fdpass::pair().unwrap();
        let send = |b: &[u8]| fdpass::send(daemon.as_fd(), b, None).unwrap();
        send(&[99, delivery::VERSION, 1, 2, 3]);
        send(&Msg::Synced.encode());
        send(&[4, delivery::VERSION + 1]);
        assert!(recv_msg(&container).unwrap().is_none(), "an unknown type");
        assert!(matches!(
            recv_msg(&container).unwrap(),
            Some((Msg::Synced, None))
        ));
        let e = recv_msg(&container).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "another version");
    }
}
