//! The smoltcp device over an [`Endpoint`]: the packet engine's bottom half.
//!
//! `receive` hands smoltcp the next frame (fast channels first, then the rx ring); `transmit`
//! gives it a buffer whose frame [`Endpoint::send`] routes by destination IP (fast channel to a
//! partner, else the pipe's tx ring). Frames are copied once each way between the rings and
//! these buffers, the copy the shared-memory boundary needs anyway (no slice into shared memory
//! is ever lent out; see `docknet_pipe::region`).
//!
//! smoltcp is told the largest MTU any path can have ([`STACK_MTU`]), and the MSS of every SYN
//! that comes or goes is clamped to the path it takes: a connection to a fast-channel partner
//! with 64 KiB frames moves 64 KiB segments (one pass through the stack where 45 were needed),
//! one through the daemon keeps the pipe's 1460 bytes. A TCP segment still too large for its
//! path (its channel went away under it) is cut to fit on its way into the ring
//! ([`crate::segment`]).

use crate::fastpath::Heads;
use crate::raw::{Endpoint, Got, LentFrame, Route, SendError, Via};
use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

/// Faults injected on received frames (for tests and experiments; none by default).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Percent of frames dropped.
    pub drop_pct: u8,
    /// Percent of frames delivered twice.
    pub dup_pct: u8,
    /// Percent of frames held back and delivered after later ones.
    pub reorder_pct: u8,
    /// Largest added delay (each frame gets a uniform delay up to this).
    pub max_delay: Duration,
    /// Seed of the generator (runs are reproducible).
    pub seed: u64,
}

#[derive(Debug)]
struct Injector {
    f: Faults,
    rng: u64,
    held: VecDeque<(std::time::Instant, Vec<u8>)>,
}

impl Injector {
    fn roll(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn pct(&mut self, p: u8) -> bool {
        p > 0 && self.roll() % 100 < u64::from(p)
    }
}

/// Counters of the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Frames handed to the stack.
    pub rx: u64,
    /// Of those, a fast channel's TCP segments whose payload stayed in the partner's ring
    /// until a socket took it, copied once, straight to where it went.
    pub rx_split: u64,
    /// Frames sent.
    pub tx: u64,
    /// TCP segments handed to a fast channel's ring as headers built apart and their payload
    /// straight from the socket's send buffer (one copy, not two); counted as `tx` is, also
    /// when the frame then waited in the backlog or was dropped there.
    pub tx_tail: u64,
    /// Of those, segments of an established connection written from the headers of its last
    /// one on the same channel, without smoltcp's egress (`fastpath`); counted as `tx` is.
    pub tx_fast: u64,
    /// Records sent: an established connection's bytes written to a fast channel's ring
    /// outside TCP's segments (`frame::Record`); counted as `tx` is.
    pub tx_records: u64,
    /// Questions sent whether a connection's peer takes records (`frame::RecordKind::Ask`:
    /// once a connection, and again after a channel's removal); counted as `tx` is.
    pub tx_record_asks: u64,
    /// Records of bytes taken by their connection's socket; counted as `rx` is.
    pub rx_records: u64,
    /// Records refused and dropped: not from a fast channel, malformed, for no connection of
    /// this stack, or one that could not take them (out of sequence, past its window, closed).
    /// Only a partner that lies sends such records; counted as `rx` is.
    pub rx_records_refused: u64,
    /// Of the records taken, those whose payload stayed in the partner's ring until the
    /// socket took it, copied once (as `rx_split` counts segments).
    pub rx_records_split: u64,
    /// Frames dropped because their ring stayed full (the stack retransmits): more than
    /// [`BACKLOG_FRAMES`] waiting for it, or one waiting longer than [`BACKLOG_WAIT`].
    pub tx_dropped: u64,
    /// Frames that found their ring full and waited in the device's backlog for room.
    pub tx_waited: u64,
    /// TCP segments larger than their path carries, cut into frames that fit.
    pub tx_segmented: u64,
    /// Frames larger than their path carries that could not be cut (not TCP): dropped.
    pub tx_too_big: u64,
    /// Frames dropped, duplicated, reordered or delayed by fault injection.
    pub injected: u64,
    /// Connection requests (SYNs) dropped because a listener's backlog was full (the client
    /// retries, as with a kernel listener's full backlog).
    pub syn_dropped: u64,
    /// Half-open connections (SYN answered, never completed) dropped to make room for a new
    /// SYN when a listener's backlog was full of them.
    pub syn_evicted: u64,
    /// Of `syn_dropped`: SYNs dropped because their source already held a quarter of a
    /// listener's backlog in half-open connections (one peer cannot take it all).
    pub syn_limited: u64,
}

/// What a listening port can take in this poll: SYNs it has listening sockets for, or none
/// because its backlog is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SynRoom {
    /// This many more SYNs; the next one waits for the listener's pool to be refilled.
    Free(usize),
    /// The backlog is full but holds half-open connections older than
    /// [`crate::stack::HALF_OPEN_MIN_AGE`]: a SYN waits for the refill, which drops the oldest
    /// of them for it.
    Evict,
    /// The backlog is full: SYNs are dropped.
    Full,
}

/// The MTU smoltcp is told: the largest a path can have (a fast channel's 64 KiB frames). What
/// each connection uses is its path's, through the MSS clamp.
pub const STACK_MTU: usize = 65535;

/// Frames that may wait for room in one ring (beyond, they are dropped and TCP retransmits).
pub const BACKLOG_FRAMES: usize = 64;
/// How long a frame waits for room in its ring at most: a consumer that does not make room in
/// that time has stopped reading (or is gone), and its frames are dropped.
pub const BACKLOG_WAIT: Duration = Duration::from_millis(20);
/// How soon a stack with frames waiting in its backlog polls again.
const BACKLOG_RETRY: Duration = Duration::from_micros(100);

/// Frames waiting for room in one ring, oldest first.
#[derive(Debug)]
struct Backlog {
    route: Route,
    frames: VecDeque<(std::time::Instant, Vec<u8>)>,
}

/// Frames one poll of the interface takes at most: a producer that keeps a ring full cannot
/// hold a poll (and the stack's lock) forever; the next poll takes the rest.
pub const RX_BUDGET: u32 = 256;

/// Frames from the daemon longer than this are read in place in the pipe's ring rather than
/// copied out first ([`Endpoint::recv_lending`]); shorter ones cost less to copy than to lend.
const LEND_OVER: usize = 512;

/// A fast channel's TCP segments longer than this have their payload copied once, from the
/// ring to where a socket takes it, rather than copied out whole first
/// ([`Endpoint::recv_lending`]): a full frame of a 1500-byte MTU and longer ones are split; a
/// 1 KiB message's frame is copied, which measured faster (docs/benchmarks.md, "A channel's
/// payload copied once").
const SPLIT_OVER: usize = 1280;

/// A smoltcp [`phy::Device`] over a DockPipe endpoint.
#[derive(Debug)]
pub struct PipeDevice {
    /// The endpoint.
    pub ep: Endpoint,
    /// Frames this poll may still take ([`RX_BUDGET`] at the start of every poll).
    pub rx_left: u32,
    pub(crate) rx_buf: Vec<u8>,
    /// Where the frame in `rx_buf` came from.
    via: Via,
    /// A frame taken from a ring for smoltcp's next `receive` (in `rx_buf`, its length): one
    /// that is not a record, met while looking for records ([`PipeDevice::next_record`]), or
    /// a record met by `receive`, for the next look.
    pending: Option<usize>,
    /// The look for records of this poll found every ring empty: smoltcp's `receive` in the
    /// same poll does not look again (a frame that comes meanwhile is the next poll's).
    drained: bool,
    /// The frame being received, when it is not copied whole into `rx_buf` (which then holds
    /// its headers): read in place, or a fast channel's, whose payload smoltcp copies where a
    /// socket takes it (`phy::PayloadFill`).
    lent: Option<LentFrame>,
    tx_buf: Vec<u8>,
    checksums: bool,
    faults: Option<Injector>,
    /// Counters.
    pub stats: DeviceStats,
    /// Listening ports and the SYNs each can take in this poll (set before each poll).
    pub(crate) syn_room: Vec<(u16, SynRoom)>,
    /// Listening ports and sources whose SYNs are dropped in this poll: the source holds its
    /// share of the port's backlog in half-open connections while that backlog is pressed.
    pub(crate) syn_heavy: Vec<(u16, IpAddr)>,
    /// A SYN that found no listening socket free: it waits here (in `rx_buf`) until the
    /// listener's pool has been refilled, and is the next frame received.
    pub(crate) held_syn: Option<usize>,
    /// Neighbours told to smoltcp (see [`PipeDevice::learn`]): address, MAC, when.
    learned: std::collections::HashMap<IpAddr, ([u8; 6], Instant)>,
    /// The last of them (most frames come from the one peer a connection talks to: it is
    /// checked without hashing).
    last_learnt: Option<(IpAddr, [u8; 6], Instant)>,
    /// The time of the poll in progress (smoltcp's, read once per poll).
    now: Instant,
    /// A received frame that waits (in `rx_buf`) behind the ARP reply (neighbour
    /// advertisement) announcing its sender.
    after_arp: Option<usize>,
    /// That announcement, `arp_len` bytes.
    arp_buf: [u8; crate::frame::NA_LEN],
    arp_len: usize,
    /// Frames that found their ring full: a consumer off its core for a scheduler slice does
    /// not cost a drop (and a retransmission timeout). Sent in order ahead of newer frames for
    /// the same ring; bounded by [`BACKLOG_FRAMES`] and [`BACKLOG_WAIT`].
    backlog: Vec<Backlog>,
    /// Connections' last headers sent on a channel, for their next segment (`fastpath`).
    heads: Heads,
}

/// How long smoltcp is trusted to remember a neighbour it was told of (it forgets after 60 s).
const LEARN_FOR: smoltcp::time::Duration = smoltcp::time::Duration::from_secs(30);
/// Neighbours remembered at most (the table is emptied beyond).
const LEARN_MAX: usize = 1024;

impl PipeDevice {
    /// Wraps `ep`. With `checksums` false, IPv4/TCP/UDP checksums are neither computed nor
    /// checked: every path today is plain memory (daemon copy or fast channel), where a
    /// checksum protects nothing.
    pub fn new(ep: Endpoint, checksums: bool) -> PipeDevice {
        // any ring's largest frame: a channel that appears later truncates nothing
        let frame = docknet_pipe::layout::MAX_FRAME as usize;
        PipeDevice {
            rx_left: RX_BUDGET,
            rx_buf: vec![0; frame],
            via: Via::Daemon,
            pending: None,
            drained: false,
            lent: None,
            tx_buf: vec![0; 2048],
            ep,
            checksums,
            faults: None,
            stats: DeviceStats::default(),
            syn_room: Vec::new(),
            syn_heavy: Vec::new(),
            held_syn: None,
            learned: std::collections::HashMap::new(),
            last_learnt: None,
            now: Instant::from_micros(0),
            after_arp: None,
            arp_buf: [0; crate::frame::NA_LEN],
            arp_len: 0,
            backlog: Vec::new(),
            heads: Heads::default(),
        }
    }

    /// Sends `seg` from the headers kept of its connection's last segment, if they were sent
    /// on the channel the connection takes now, nothing waits for that channel's ring, and the
    /// ring has room; false (nothing sent) otherwise, for smoltcp's own egress.
    pub(crate) fn send_fast(&mut self, seg: &smoltcp::socket::tcp::FastSegment<'_>) -> bool {
        let Some((route, head)) = self.heads.head_for(seg) else {
            return false;
        };
        let len = head.len() + seg.payload.len();
        let (path, max) = self.ep.path_to(seg.remote.addr.into(), true, len);
        if path != route || len > max || self.backlog.iter().any(|b| b.route == route) {
            return false;
        }
        if self.ep.send_parts_on(route, &[&head, seg.payload]).is_err() {
            return false;
        }
        self.stats.tx += 1;
        self.stats.tx_tail += 1;
        self.stats.tx_fast += 1;
        true
    }

    /// The next frame, when it is a record from a fast channel: its length (it is in
    /// `rx_buf`). Records from anywhere else are dropped and counted; any other frame is left
    /// for smoltcp's next `receive`, and `None` returned, as when nothing waits or this poll's
    /// budget is spent.
    pub(crate) fn next_record(&mut self) -> Option<usize> {
        loop {
            if self.held_syn.is_some() || self.after_arp.is_some() {
                return None;
            }
            let n = match self.pending.take() {
                Some(n) => n,
                None if self.rx_left == 0 || self.drained => return None,
                None => match self.next_frame() {
                    Some(n) => n,
                    None => {
                        self.drained = true;
                        return None;
                    }
                },
            };
            // a record split in its ring: its header here, its payload copied from the ring
            // by `record_fill` (the frame is as long as the ring's copy)
            let split = self
                .lent
                .as_ref()
                .filter(|l| !l.in_place())
                .map(|l| l.len());
            if (self.lent.is_some() && split.is_none())
                || !crate::frame::Record::is_one(&self.rx_buf[..n])
            {
                self.pending = Some(n);
                return None;
            }
            self.rx_left = self.rx_left.saturating_sub(1);
            self.stats.rx += 1;
            if self.via == Via::FastChannel {
                self.stats.rx_records_split += u64::from(split.is_some());
                return Some(split.map_or(n, |len| len.min(self.rx_buf.len())));
            }
            self.stats.rx_records_refused += 1;
        }
    }

    /// The fill of the record [`PipeDevice::next_record`] gave (`n` bytes long), when its
    /// payload was left in its ring: the bytes after its header come from there, once, as
    /// the socket takes them.
    pub(crate) fn record_fill(&self, n: usize) -> Option<impl phy::PayloadFill + '_> {
        let lent = self.lent.as_ref().filter(|l| !l.in_place())?;
        Some(SplitFill {
            base: self.rx_buf.as_ptr() as usize,
            len: n,
            head: crate::frame::RECORD_HEAD,
            lent,
        })
    }

    /// Ends a poll's receiving: a frame left for smoltcp's next `receive` that is still read
    /// in place (in the daemon's ring, or a channel's payload) is copied into `rx_buf` first,
    /// since the flush that follows gives its slot back.
    pub(crate) fn settle_pending(&mut self) {
        let (Some(n), Some(l)) = (self.pending, self.lent.take()) else {
            return;
        };
        let n = if l.in_place() {
            l.read(|f| {
                let n = f.len().min(self.rx_buf.len());
                self.rx_buf[..n].copy_from_slice(&f[..n]);
                n
            })
        } else {
            // its headers are in `rx_buf` already
            let len = l.len().min(self.rx_buf.len());
            copy_lent(&l, n, &mut self.rx_buf[n..len]);
            len
        };
        self.pending = Some(n);
    }

    /// Starts a poll's receiving: `budget` frames at most, and the rings looked at afresh.
    pub(crate) fn start_poll(&mut self, budget: u32) {
        self.rx_left = budget;
        self.drained = false;
    }

    /// Whether a frame waits for smoltcp's next `receive`.
    pub(crate) fn frame_pending(&self) -> bool {
        self.pending.is_some() || self.held_syn.is_some() || self.after_arp.is_some()
    }

    /// Whether frames wait in the backlog for `route`'s ring.
    pub(crate) fn backlogged_on(&self, route: Route) -> bool {
        self.backlog.iter().any(|b| b.route == route)
    }

    /// Sends what waits in the backlog while its rings have room, oldest first; drops what
    /// waited longer than [`BACKLOG_WAIT`]. Called before every poll of the interface.
    pub fn flush_backlog(&mut self) {
        if self.backlog.is_empty() {
            return; // the common case: no clock read
        }
        let now = std::time::Instant::now();
        let (ep, stats) = (&mut self.ep, &mut self.stats);
        for b in &mut self.backlog {
            while let Some((t, f)) = b.frames.front() {
                match ep.send(f) {
                    Ok(_) => stats.tx += 1,
                    Err(SendError::Full) if now.duration_since(*t) < BACKLOG_WAIT => break,
                    Err(_) => stats.tx_dropped += 1,
                }
                b.frames.pop_front();
            }
        }
        self.backlog.retain(|b| !b.frames.is_empty());
    }

    /// Whether frames wait in the backlog.
    pub fn backlogged(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// Tells smoltcp the sender of an IPv4 frame from its own subnet, before the frame: an ARP
    /// reply built from the frame's source address and MAC. smoltcp learns neighbours only from
    /// ARP, and sends one ARP request per second at most: a server answering a new client
    /// soon after asking for another waited a whole second for the client's address. The
    /// daemon's proxy ARP would answer with the same MAC (the sender's pipe, a fast-channel
    /// partner already checked for it, or the link towards the wire), so nothing is learnt
    /// that asking would not have given. Returns true when an ARP reply is to be delivered
    /// first (it is in `arp_buf`). IPv6 the same way: a neighbour advertisement for the
    /// sender of an IPv6 frame from the pipe's IPv6 network or a link-local address.
    fn learn(&mut self, n: usize) -> bool {
        if let Some(src) = crate::frame::ipv6_src(&self.rx_buf[..n]) {
            return self.learn6(src);
        }
        let Some((ip, mac)) = crate::frame::ipv4_src(&self.rx_buf[..n]) else {
            return false;
        };
        let (me, prefix) = (self.ep.ip(), self.ep.prefix());
        let mask = u32::MAX.checked_shl(32 - prefix.min(32)).unwrap_or(0);
        if ip == me
            || u32::from(ip) & mask != u32::from(me) & mask
            || ip.is_broadcast()
            || ip.is_multicast()
            || ip.is_unspecified()
            || mac[0] & 1 == 1
        {
            return false;
        }
        if !self.remember(IpAddr::V4(ip), mac) {
            return false;
        }
        self.arp_buf[..42].copy_from_slice(&crate::frame::arp_reply(mac, ip, self.ep.mac(), me));
        self.arp_len = 42;
        true
    }

    /// [`PipeDevice::learn`] for an IPv6 frame from `src`.
    fn learn6(&mut self, src: std::net::Ipv6Addr) -> bool {
        let Some((me, prefix)) = self.ep.ip6() else {
            return false;
        };
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.rx_buf[6..12]);
        let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
        let link_local = src.segments()[0] & 0xffc0 == 0xfe80;
        let on_link = u128::from(src) & mask == u128::from(me) & mask;
        if src == me
            || src == docknet_pipe::delivery::link_local(self.ep.mac())
            || !(on_link || link_local)
            || src.is_multicast()
            || src.is_unspecified()
            || mac[0] & 1 == 1
        {
            return false;
        }
        if !self.remember(IpAddr::V6(src), mac) {
            return false;
        }
        let to = if link_local {
            docknet_pipe::delivery::link_local(self.ep.mac())
        } else {
            me
        };
        self.arp_buf = crate::frame::neighbor_advert(mac, src, self.ep.mac(), to);
        self.arp_len = crate::frame::NA_LEN;
        true
    }

    /// Records that `ip` is at `mac`; false when smoltcp was told so recently.
    fn remember(&mut self, ip: IpAddr, mac: [u8; 6]) -> bool {
        let now = self.now;
        let fresh = |t: Instant| now >= t && now - t < LEARN_FOR;
        if let Some((i, m, t)) = self.last_learnt {
            if i == ip && m == mac && fresh(t) {
                return false;
            }
        }
        if let Some(&(m, t)) = self.learned.get(&ip) {
            if m == mac && fresh(t) {
                self.last_learnt = Some((ip, mac, t));
                return false;
            }
        }
        if self.learned.len() >= LEARN_MAX {
            self.learned.clear();
        }
        self.learned.insert(ip, (mac, now));
        self.last_learnt = Some((ip, mac, now));
        true
    }

    /// The port of the SYN waiting for a listening socket, if one waits.
    pub(crate) fn held_syn_port(&self) -> Option<u16> {
        self.held_syn
            .and_then(|n| Self::syn_of(self.rx_buf.get(..n)?))
            .map(|(port, _)| port)
    }

    /// The destination port and the source address of a TCP SYN (without ACK) frame over
    /// IPv4 or IPv6 (after any hop-by-hop, routing and destination-options headers, which
    /// smoltcp walks too), if `f` is one.
    fn syn_of(f: &[u8]) -> Option<(u16, IpAddr)> {
        const ETH: usize = 14;
        let (tcp, src) = if f.len() >= ETH + 40 && f[12..14] == [0x86, 0xdd] {
            let a: [u8; 16] = f[ETH + 8..ETH + 24].try_into().ok()?;
            let (mut next, mut at) = (f[ETH + 6], ETH + 40);
            // at most 8 extension headers: a longer chain is not a SYN smoltcp would take
            for _ in 0..8 {
                if !matches!(next, 0 | 43 | 60) {
                    break;
                }
                next = *f.get(at)?;
                at += (usize::from(*f.get(at + 1)?) + 1) * 8;
            }
            if next != 6 {
                return None;
            }
            (at, IpAddr::from(a))
        } else if f.len() >= ETH + 20
            && f[12..14] == [0x08, 0x00]
            && f[ETH] >> 4 == 4
            && f[ETH + 9] == 6
        {
            let a: [u8; 4] = f[ETH + 12..ETH + 16].try_into().ok()?;
            (ETH + usize::from(f[ETH] & 0x0f) * 4, IpAddr::from(a))
        } else {
            return None;
        };
        let flags = *f.get(tcp + 13)?;
        (flags & 0x12 == 0x02).then(|| {
            let port = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
            (port(tcp + 2), src)
        })
    }

    /// Admits a received frame: a SYN to a listening port takes one of its free listening
    /// sockets; with none free it is held until the next poll refills the pool, or dropped and
    /// counted when the backlog is full or its source holds its share of a pressed backlog.
    fn admit(&mut self, n: usize) -> Admit {
        let Some((port, src)) = Self::syn_of(&self.rx_buf[..n]) else {
            return Admit::Pass;
        };
        let Some(room) = self.syn_room.iter_mut().find(|(p, _)| *p == port) else {
            return Admit::Pass; // nobody listens: smoltcp answers with a reset
        };
        if self.syn_heavy.contains(&(port, src)) {
            self.stats.syn_dropped += 1;
            self.stats.syn_limited += 1;
            return Admit::Drop;
        }
        match &mut room.1 {
            SynRoom::Free(0) | SynRoom::Evict => Admit::Hold,
            SynRoom::Free(k) => {
                *k -= 1;
                Admit::Pass
            }
            SynRoom::Full => {
                self.stats.syn_dropped += 1;
                Admit::Drop
            }
        }
    }

    /// Injects `f` into every received frame from now on.
    pub fn set_faults(&mut self, f: Faults) {
        self.faults = Some(Injector {
            f,
            rng: f.seed | 1,
            held: VecDeque::new(),
        });
    }

    /// Time until a held-back frame is due (for the caller's sleep), if any is held.
    pub fn next_due(&self) -> Option<Duration> {
        let retry = self.backlogged().then_some(BACKLOG_RETRY);
        // (the clock is read only when frames are held back: every sleep asks)
        let held = self
            .faults
            .as_ref()
            .filter(|inj| !inj.held.is_empty())
            .and_then(|inj| {
                let now = std::time::Instant::now();
                inj.held
                    .iter()
                    .map(|(t, _)| t.saturating_duration_since(now))
                    .min()
            });
        match (retry, held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Next frame into `rx_buf` after fault injection; its length.
    fn next_frame(&mut self) -> Option<usize> {
        self.lent = None;
        let Some(inj) = self.faults.as_mut() else {
            let (got, via) = self
                .ep
                .recv_lending(&mut self.rx_buf, LEND_OVER, SPLIT_OVER)?;
            self.via = via;
            return match got {
                Got::Copied(n) => Some(n),
                Got::Split(frame, head) if self.checksums => {
                    // a checksum is checked over the payload: the frame is copied whole
                    let n = frame.len().min(self.rx_buf.len());
                    copy_lent(&frame, head, &mut self.rx_buf[head..n]);
                    Some(n)
                }
                Got::Lent(frame, head) | Got::Split(frame, head) => {
                    self.lent = Some(frame);
                    Some(head)
                }
            };
        };
        let now = std::time::Instant::now();
        if let Some(i) = inj.held.iter().position(|(t, _)| *t <= now) {
            let (_, f) = inj.held.remove(i)?;
            self.rx_buf[..f.len()].copy_from_slice(&f);
            // (only a channel's records are held behind others)
            self.via = if crate::frame::Record::is_one(&f) {
                Via::FastChannel
            } else {
                Via::Daemon
            };
            return Some(f.len());
        }
        loop {
            let (n, via) = self.ep.recv(&mut self.rx_buf)?;
            self.via = via;
            let frame = &self.rx_buf[..n];
            if via == Via::FastChannel && crate::frame::Record::is_one(frame) {
                // faults are a network's, and records do not cross one: a record is never
                // dropped, and, as in its ring, overtakes none of the frames before it (it
                // waits behind those held back, and comes after them)
                if let Some(last) = inj.held.iter().map(|(t, _)| *t).max() {
                    inj.held.push_back((last, frame.to_vec()));
                    continue;
                }
                return Some(n);
            }
            if inj.pct(inj.f.drop_pct) {
                self.stats.injected += 1;
                continue;
            }
            if inj.pct(inj.f.dup_pct) {
                self.stats.injected += 1;
                inj.held.push_back((now, frame.to_vec()));
            }
            let delay = if inj.f.max_delay.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_nanos(inj.roll() % inj.f.max_delay.as_nanos().max(1) as u64)
            };
            if inj.pct(inj.f.reorder_pct) || !delay.is_zero() {
                // held back: later frames overtake it
                self.stats.injected += 1;
                let extra = if delay.is_zero() {
                    Duration::from_micros(200)
                } else {
                    delay
                };
                inj.held.push_back((now + extra, frame.to_vec()));
                continue;
            }
            return Some(n);
        }
    }
}

/// What becomes of a received frame.
enum Admit {
    Pass,
    Hold,
    Drop,
}

/// A received frame: in the device's buffer, or read in place in the pipe's ring.
#[derive(Debug)]
pub struct PipeRxToken<'a>(RxFrame<'a>);

#[derive(Debug)]
enum RxFrame<'a> {
    Buf(&'a [u8]),
    Lent(&'a LentFrame),
    /// A fast channel's segment: `buf` (the frame's length) holds its first `head` bytes, the
    /// rest is in the partner's ring.
    Split {
        buf: &'a mut [u8],
        head: usize,
        lent: &'a LentFrame,
    },
}

impl phy::RxToken for PipeRxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        match self.0 {
            RxFrame::Buf(b) => f(b),
            RxFrame::Lent(l) => l.read(f),
            RxFrame::Split { buf, head, lent } => {
                copy_lent(lent, head, &mut buf[head..]);
                f(buf)
            }
        }
    }

    fn consume_with_fill<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8], Option<&dyn phy::PayloadFill>) -> R,
    {
        match self.0 {
            RxFrame::Split { buf, head, lent } => {
                let fill = SplitFill {
                    base: buf.as_ptr() as usize,
                    len: buf.len(),
                    head,
                    lent,
                };
                // what lies past `head` in `buf` is stale: smoltcp reads a TCP segment's
                // payload only through the fill
                f(buf, Some(&fill))
            }
            frame => PipeRxToken(frame).consume(|b| f(b, None)),
        }
    }
}

/// Copies `lent`'s bytes from `at` on into `dst`, or zeroes `dst` where they would lie beyond
/// the frame (never: a frame lies in its ring), so that nothing stale is handed on.
fn copy_lent(lent: &LentFrame, at: usize, dst: &mut [u8]) {
    if !lent.copy_at(at, dst) {
        dst.fill(0);
    }
}

/// Where a split frame's payload is ([`RxFrame::Split`]): the headers in the device's buffer,
/// the rest in the partner's ring, copied from it once, straight to where a socket takes it.
struct SplitFill<'a> {
    /// The address and length of the frame as handed to smoltcp.
    base: usize,
    len: usize,
    /// How many of its first bytes are in that buffer.
    head: usize,
    lent: &'a LentFrame,
}

impl phy::PayloadFill for SplitFill<'_> {
    fn fill(&self, src: &[u8], dst: &mut [u8]) -> bool {
        let at = (src.as_ptr() as usize).wrapping_sub(self.base);
        if at > self.len || src.len() > self.len - at || dst.len() != src.len() {
            return false;
        }
        // a payload starts where the headers end (`head`): all of it from the ring
        let k = self.head.saturating_sub(at).min(src.len());
        if k > 0 {
            dst[..k].copy_from_slice(&src[..k]);
        }
        copy_lent(self.lent, at + k, &mut dst[k..]);
        true
    }
}

/// A frame to send.
#[derive(Debug)]
pub struct PipeTxToken<'a> {
    ep: &'a mut Endpoint,
    buf: &'a mut Vec<u8>,
    stats: &'a mut DeviceStats,
    backlog: &'a mut Vec<Backlog>,
    checksums: bool,
    /// Where the frame goes and whether it carries TCP, when smoltcp said so before building it.
    dst: Option<(IpAddr, bool)>,
    /// The fast channel [`phy::TxToken::wants_tail`] found for the frame.
    tail_route: Option<Route>,
    heads: &'a mut Heads,
}

impl PipeTxToken<'_> {
    /// Builds a frame bound for the daemon (`path`, as [`Endpoint::path_to`] gave it) straight
    /// into the pipe's ring, saving the copy from a buffer of its own; `Err(f)` when the frame
    /// takes a fast channel (a partner's ring is written only by copy, see
    /// [`Endpoint::build_on_pipe`]), must queue behind earlier frames, is larger than the path
    /// carries (it is cut first), or finds no room.
    fn in_place<R, F: FnOnce(&mut [u8]) -> R>(
        &mut self,
        (route, max): (Route, usize),
        len: usize,
        f: F,
    ) -> Result<R, F> {
        if route != Route::Daemon || len > max || !self.backlog.is_empty() {
            return Err(f);
        }
        let Ok(room) = self.ep.reserve_on_pipe(len) else {
            return Err(f);
        };
        let checksums = self.checksums;
        let r = self.ep.build_on_pipe(room, |frame| {
            let r = f(frame);
            if crate::segment::tcp_syn(frame) == Some(true) {
                crate::segment::clamp_mss(frame, max, checksums);
            }
            r
        });
        self.stats.tx += 1;
        Ok(r)
    }

    /// [`phy::TxToken::consume`] on `path` (from [`Endpoint::path_to`], and whether the frame
    /// is TCP), or on the path the frame's own addresses give once built.
    #[inline]
    fn consume_on<R, F: FnOnce(&mut [u8]) -> R>(
        mut self,
        path: Option<((Route, usize), bool)>,
        len: usize,
        f: F,
    ) -> R {
        let f = match path {
            Some((path, _)) => match self.in_place(path, len, f) {
                Ok(r) => return r,
                Err(f) => f,
            },
            None => f,
        };
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        let r = f(&mut self.buf[..len]);
        let (route, max, syn) = match path {
            Some(((route, max), tcp)) => (
                route,
                max,
                tcp && crate::segment::tcp_syn(&self.buf[..len]) == Some(true),
            ),
            None => self.ep.path_limit(&self.buf[..len]),
        };
        if syn && len <= max {
            crate::segment::clamp_mss(&mut self.buf[..len], max, self.checksums);
        }
        let frame = &self.buf[..len];
        let mut out = Out {
            ep: self.ep,
            stats: self.stats,
            backlog: self.backlog,
            route,
        };
        if len <= max {
            out.send(&[frame]);
        } else if crate::segment::segment(frame, max, self.checksums, |h, p| out.send(&[h, p]))
            .is_some()
        {
            out.stats.tx_segmented += 1;
        } else {
            out.stats.tx_too_big += 1;
        }
        r
    }
}

impl phy::TxToken for PipeTxToken<'_> {
    fn set_destination(
        &mut self,
        dst: smoltcp::wire::IpAddress,
        protocol: smoltcp::wire::IpProtocol,
    ) {
        self.dst = Some((dst.into(), protocol == smoltcp::wire::IpProtocol::Tcp));
    }

    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        // the path from the destination smoltcp told, else from the frame once built
        let path = self
            .dst
            .map(|(dst, tcp)| (self.ep.path_to(dst, tcp, len), tcp));
        self.consume_on(path, len, f)
    }

    /// A TCP segment whose payload is `tail` takes a fast channel whole: its headers are built
    /// apart and its payload copied once, from the socket's send buffer into the partner's
    /// ring ([`phy::TxToken::consume_with_tail`]), which is written only by copy, so the whole
    /// frame would otherwise be built in the token's buffer and copied again. Through the
    /// daemon the frame is built in its ring in place, one copy already; a frame to be cut
    /// and frames with checksums are built whole.
    #[inline]
    fn wants_tail(&mut self, len: usize) -> bool {
        let Some((dst, true)) = self.dst else {
            return false;
        };
        if self.checksums || !self.ep.has_channels() {
            return false;
        }
        self.tail_route = match self.ep.path_to(dst, true, len) {
            (r @ Route::FastChannel(_), max) if len <= max => Some(r),
            _ => None,
        };
        self.tail_route.is_some()
    }

    fn consume_with_tail<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, tail: &[u8], f: F) -> R {
        debug_assert!(tail.len() < len, "a payload without headers");
        let Some(route) = self.tail_route else {
            // (never: only after wants_tail found a channel) built whole
            return self.consume(len, |buf| {
                let head = len - tail.len();
                let r = f(&mut buf[..head]);
                buf[head..len].copy_from_slice(tail);
                r
            });
        };
        let head = len - tail.len();
        if self.buf.len() < head {
            self.buf.resize(head, 0);
        }
        let r = f(&mut self.buf[..head]);
        // whole headers of a frame of `len` bytes, and not a SYN (smoltcp sends no payload
        // with one): no MSS to clamp in the frame
        debug_assert!(crate::segment::plain_tcp_head(&self.buf[..head], len));
        self.heads.keep(route, &self.buf[..head]);
        let mut out = Out {
            ep: self.ep,
            stats: self.stats,
            backlog: self.backlog,
            route,
        };
        out.send(&[&self.buf[..head], tail]);
        out.stats.tx_tail += 1;
        r
    }
}

/// Sends frames on one path: behind frames already waiting for its ring, or on it now.
struct Out<'a> {
    ep: &'a mut Endpoint,
    stats: &'a mut DeviceStats,
    backlog: &'a mut Vec<Backlog>,
    route: Route,
}

impl Out<'_> {
    /// Sends the frame that is the concatenation of `parts`.
    fn send(&mut self, parts: &[&[u8]]) {
        let queued = self.backlog.iter().position(|b| b.route == self.route);
        let sent = match queued {
            Some(_) => Err(SendError::Full),
            None => self.ep.send_parts_on(self.route, parts),
        };
        match sent {
            Ok(_) => self.stats.tx += 1,
            Err(SendError::Full) => {
                // the consumer may be off its core for a moment: wait (bounded), do not drop
                let i = queued.unwrap_or_else(|| {
                    self.backlog.push(Backlog {
                        route: self.route,
                        frames: VecDeque::new(),
                    });
                    self.backlog.len() - 1
                });
                let b = &mut self.backlog[i];
                if b.frames.len() < BACKLOG_FRAMES {
                    b.frames
                        .push_back((std::time::Instant::now(), parts.concat()));
                    self.stats.tx_waited += 1;
                } else {
                    self.stats.tx_dropped += 1;
                }
            }
            Err(_) => self.stats.tx_dropped += 1,
        }
    }
}

impl phy::Device for PipeDevice {
    type RxToken<'a> = PipeRxToken<'a>;
    type TxToken<'a> = PipeTxToken<'a>;

    fn receive(&mut self, now: Instant) -> Option<(PipeRxToken<'_>, PipeTxToken<'_>)> {
        self.now = now;
        // a frame behind its sender's announcement goes in the same poll, whatever the budget
        let n = if let Some(n) = self.after_arp.take() {
            n
        } else {
            if self.rx_left == 0 {
                return None;
            }
            let n = loop {
                let n = match self.held_syn.take().or_else(|| self.pending.take()) {
                    Some(n) => n,
                    None if self.drained => return None,
                    None => match self.next_frame() {
                        Some(n) => n,
                        None => {
                            // (and the next look for records in this poll does not look again)
                            self.drained = true;
                            return None;
                        }
                    },
                };
                if crate::frame::Record::is_one(&self.rx_buf[..n]) {
                    // for the stack's next look for records, which comes before this poll ends
                    // (a record split in its ring too: its header is here, its payload stays
                    // lent until that look, or until the poll's end copies it out)
                    self.pending = Some(n);
                    return None;
                }
                match self.admit(n) {
                    Admit::Pass => {
                        let f = &mut self.rx_buf[..n];
                        if crate::segment::is_syn(f) {
                            // our segments to the sender: no larger than the path back carries
                            let max = self.ep.reply_limit(f);
                            crate::segment::clamp_mss(f, max, self.checksums);
                        }
                        break n;
                    }
                    Admit::Hold => {
                        self.held_syn = Some(n);
                        return None;
                    }
                    Admit::Drop => {}
                }
            };
            if self.learn(n) {
                // it waits for a later call, which the frame's place may not outlive: copied
                let n = match self.lent.take() {
                    Some(l) if l.in_place() => l.read(|f| {
                        let n = f.len().min(self.rx_buf.len());
                        self.rx_buf[..n].copy_from_slice(&f[..n]);
                        n
                    }),
                    Some(l) => {
                        // its headers are in `rx_buf` already
                        let len = l.len().min(self.rx_buf.len());
                        copy_lent(&l, n, &mut self.rx_buf[n..len]);
                        len
                    }
                    None => n,
                };
                self.after_arp = Some(n);
                self.stats.rx += 1;
                return Some((
                    PipeRxToken(RxFrame::Buf(&self.arp_buf[..self.arp_len])),
                    PipeTxToken {
                        ep: &mut self.ep,
                        buf: &mut self.tx_buf,
                        stats: &mut self.stats,
                        backlog: &mut self.backlog,
                        checksums: self.checksums,
                        dst: None,
                        tail_route: None,
                        heads: &mut self.heads,
                    },
                ));
            }
            n
        };
        self.rx_left -= 1;
        self.stats.rx += 1;
        let frame = match &self.lent {
            Some(l) if l.in_place() => RxFrame::Lent(l),
            Some(l) => {
                self.stats.rx_split += 1;
                RxFrame::Split {
                    buf: &mut self.rx_buf[..l.len()],
                    head: n,
                    lent: l,
                }
            }
            None => RxFrame::Buf(&self.rx_buf[..n]),
        };
        Some((
            PipeRxToken(frame),
            PipeTxToken {
                ep: &mut self.ep,
                buf: &mut self.tx_buf,
                stats: &mut self.stats,
                backlog: &mut self.backlog,
                checksums: self.checksums,
                dst: None,
                tail_route: None,
                heads: &mut self.heads,
            },
        ))
    }

    fn transmit(&mut self, _now: Instant) -> Option<PipeTxToken<'_>> {
        Some(PipeTxToken {
            ep: &mut self.ep,
            buf: &mut self.tx_buf,
            stats: &mut self.stats,
            backlog: &mut self.backlog,
            checksums: self.checksums,
            dst: None,
            tail_route: None,
            heads: &mut self.heads,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = STACK_MTU + crate::frame::ETH;
        caps.max_burst_size = Some(64);
        if !self.checksums {
            let mut c = ChecksumCapabilities::ignored();
            c.ipv4 = Checksum::None;
            caps.checksum = c;
        }
        caps
    }
}

#[cfg(test)]
mod tests {
    use super::PipeDevice;
    use std::net::IpAddr;

    /// An Ethernet + IPv6 frame from `src` whose first next header is `next`, with `ext`
    /// (extension headers) before a TCP header with `flags` to port 80.
    fn v6(next: u8, ext: &[u8], flags: u8) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        let mut ip = [0u8; 40];
        ip[0] = 0x60;
        ip[6] = next;
        ip[8..24].copy_from_slice(&"fd00::7".parse::<std::net::Ipv6Addr>().unwrap().octets());
        f.extend(ip);
        f.extend(ext);
        let mut tcp = [0u8; 20];
        tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = flags;
        f.extend(tcp);
        f
    }

    #[test]
    fn a_syn_is_found_behind_ipv6_extension_headers() {
        let src: IpAddr = "fd00::7".parse().unwrap();
        assert_eq!(PipeDevice::syn_of(&v6(6, &[], 0x02)), Some((80, src)));
        // hop-by-hop (8 bytes) then destination options (16 bytes), then TCP
        let mut ext = vec![60, 0, 1, 4, 0, 0, 0, 0];
        ext.extend([6, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(PipeDevice::syn_of(&v6(0, &ext, 0x02)), Some((80, src)));
        // a SYN-ACK is not a connection request; nor is UDP behind the headers
        assert_eq!(PipeDevice::syn_of(&v6(0, &ext, 0x12)), None);
        let mut udp = ext.clone();
        udp[8] = 17;
        assert_eq!(PipeDevice::syn_of(&v6(0, &udp, 0x02)), None);
        // a header running past the frame, and a chain longer than eight: not taken, no panic
        assert_eq!(PipeDevice::syn_of(&v6(0, &[60, 200], 0x02)), None);
        let long: Vec<u8> = (0..9).flat_map(|_| [0u8, 0, 0, 0, 0, 0, 0, 0]).collect();
        assert_eq!(PipeDevice::syn_of(&v6(0, &long, 0x02)), None);
        for cut in 0..v6(0, &ext, 0x02).len() {
            let _ = PipeDevice::syn_of(&v6(0, &ext, 0x02)[..cut]);
        }
    }
}
