//! The master thread: the only thread that moves frames. It takes frames from every pipe's tx
//! ring, decides with [`crate::switch::decide`], and copies them into the destination pipes' rx
//! rings (one copy, shared memory to shared memory). A container therefore never writes into
//! memory another container reads; it can only fill its own rings with garbage, which is
//! refused and counted here.
//!
//! With several masters (`--masters N`), each owns the pipes whose id falls to it (id mod N):
//! only it reads their tx rings and writes their rx rings. A frame for another master's pipe is
//! copied into a lock-free queue from this master to that one ([`Shard`]), which the
//! owner drains into the pipe at the start of its next round; a sleeping owner is woken through
//! its shard bell. Nothing on the frame path takes a lock.
//!
//! With a link to the wire ([`crate::nic::Edge`]), the master also moves frames between the
//! pipes and the link: frames for addresses no pipe owns leave through it, and frames arriving
//! for a pipe are checked and delivered like any other. While the master sleeps, a small waker
//! thread waits on the link's descriptors and rings the master's futex when frames arrive.

use crate::capture::{Dir, Tap};
use crate::nic::{Edge, EdgeShared, Sent};
use crate::rate::{Bucket, Limit, Timers};
use crate::registry::{Counter, Pipe, Snapshot, NCOUNTERS};
use crate::switch::{decide, Decision, DropReason, HEADER_PEEK};
use crate::watch::{Bell, Watchers};
use arc_swap::ArcSwap;
use crossbeam_queue::ArrayQueue;
use docknet_pipe::region::copy_between;
use docknet_pipe::wake::{self, Woke, MAX_WAITERS};
use docknet_pipe::{Consumer, Frame, IdlePolicy, Idler, Producer};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Frames taken from one tx ring before moving to the next pipe (fairness between pipes).
pub const BATCH: usize = 32;
/// Longest sleep when idle; bounds how stale anything time-driven can get.
const IDLE_TIMEOUT: Duration = Duration::from_millis(250);
/// Broadcast and multicast frames a pipe may flood per second (each costs a copy per pipe).
pub const FLOOD_RATE: f64 = 1000.0;
/// Floods a pipe may send in a burst.
pub const FLOOD_BURST: f64 = 64.0;
/// Bytes the daemon queues in front of a pipe's ingress limit; more is dropped (`rate_limited`).
pub const INGRESS_QUEUE: usize = 1 << 20;
/// First and longest mute of a pipe whose wake-ups found no work.
const MUTE_MIN: Duration = Duration::from_millis(1);
const MUTE_MAX: Duration = Duration::from_millis(128);
/// Pipe words a master sleeps on itself (the rest of its 128: the control word, the link's
/// bell, the watchers' bell and its shard bell). With more pipes than this, idle ones go cold
/// ([`crate::watch`]).
pub const ROOM: usize = MAX_WAITERS - 4;
/// A pipe that sent nothing for this long goes cold (when the master has more than [`ROOM`]).
const COLD_AFTER: Duration = Duration::from_millis(20);
/// How often the master looks for pipes to cool.
const COOL_EVERY: Duration = Duration::from_millis(2);

/// Frames one master's inbox holds from each other master; more are dropped (`cross_drops`).
pub const INBOX: usize = 1024;
/// Most master threads.
pub const MAX_MASTERS: usize = 64;

/// A frame on its way to a pipe another master owns.
#[derive(Debug)]
pub struct Parcel {
    /// The destination pipe's id.
    pipe: u64,
    /// The frame, as checked by the sending master.
    bytes: Vec<u8>,
}

/// What the other masters share with one master.
#[derive(Debug)]
pub struct Shard {
    /// Bumped and futex-woken when another master queued frames while this one slept.
    bell: AtomicU32,
    /// Set while this master is asleep or about to be.
    asleep: AtomicU32,
    /// `inbox[j]`: frames from master `j` for pipes of this one.
    inbox: Vec<ArrayQueue<Parcel>>,
}

impl Shard {
    fn new(masters: usize) -> Shard {
        Shard {
            bell: AtomicU32::new(0),
            asleep: AtomicU32::new(0),
            inbox: (0..masters).map(|_| ArrayQueue::new(INBOX)).collect(),
        }
    }

    fn pending(&self) -> bool {
        self.inbox.iter().any(|q| !q.is_empty())
    }
}

/// What one master thread did, for the metrics: written by that master alone (a line of its
/// own, so the readers' loads never slow it).
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct MasterStats {
    /// Rounds over its pipes.
    pub rounds: AtomicU64,
    /// Nanoseconds in rounds that moved frames.
    pub busy_ns: AtomicU64,
    /// Nanoseconds awake without work (rounds that found none, spinning, yielding).
    pub idle_ns: AtomicU64,
    /// Nanoseconds asleep on its futexes.
    pub asleep_ns: AtomicU64,
    /// Times it went to sleep.
    pub sleeps: AtomicU64,
    /// Frames it took from tx rings, inboxes and the link.
    pub frames: AtomicU64,
    /// Pipes it owns.
    pub pipes: AtomicU64,
}

/// The master that owns pipe `id` among `masters`.
pub fn shard_of(id: u64, masters: usize) -> usize {
    (id % masters.max(1) as u64) as usize
}

/// State shared between the control plane and the master threads.
#[derive(Debug)]
pub struct MasterShared {
    /// The current snapshot.
    pub snap: ArcSwap<Snapshot>,
    /// Bumped (and futex-woken) whenever `snap` changes or on shutdown.
    pub version: AtomicU32,
    /// Ask the master to exit.
    pub shutdown: AtomicBool,
    /// Times the master went to sleep (for tests and `status`).
    pub sleeps: AtomicU64,
    /// Frames forwarded in total.
    pub forwarded: AtomicU64,
    /// Pipes cold now (watched by watcher threads, not read by the master's rounds).
    pub cold: AtomicU64,
    /// Watcher threads running.
    pub watchers: AtomicU64,
    /// Set by a master about to sleep while it drives a link: the waker thread watches the
    /// link only then.
    pub link_armed: AtomicU32,
    /// Rung (and futex-woken) by the waker thread when frames arrive while the master sleeps.
    pub link_bell: AtomicU32,
    /// The link, as the control plane sees it.
    pub edge: std::sync::OnceLock<Arc<EdgeShared>>,
    /// One per master thread.
    pub shards: Vec<Shard>,
    /// Frames passed from one master to another.
    pub cross: AtomicU64,
    /// Frames dropped because the owning master's inbox was full, or their pipe was gone.
    pub cross_drops: AtomicU64,
    /// One per master thread.
    pub stats: Vec<MasterStats>,
    /// Running captures (the masters pick them up with the next snapshot version).
    pub taps: ArcSwap<Vec<Arc<Tap>>>,
}

impl MasterShared {
    /// Shared state starting from `snap`, for one master thread.
    pub fn new(snap: Snapshot) -> MasterShared {
        MasterShared::with_masters(snap, 1)
    }

    /// Shared state starting from `snap`, for `masters` master threads (1..=[`MAX_MASTERS`]).
    pub fn with_masters(snap: Snapshot, masters: usize) -> MasterShared {
        let masters = masters.clamp(1, MAX_MASTERS);
        MasterShared {
            shards: (0..masters).map(|_| Shard::new(masters)).collect(),
            stats: (0..masters).map(|_| MasterStats::default()).collect(),
            taps: ArcSwap::from_pointee(Vec::new()),
            cross: AtomicU64::new(0),
            cross_drops: AtomicU64::new(0),
            snap: ArcSwap::from_pointee(snap),
            version: AtomicU32::new(0),
            shutdown: AtomicBool::new(false),
            sleeps: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            cold: AtomicU64::new(0),
            watchers: AtomicU64::new(0),
            link_armed: AtomicU32::new(0),
            link_bell: AtomicU32::new(0),
            edge: std::sync::OnceLock::new(),
        }
    }

    /// Installs a new snapshot and wakes the master.
    pub fn publish(&self, snap: Snapshot) {
        self.snap.store(Arc::new(snap));
        self.poke();
    }

    /// What each master thread did so far, as `stats` and the metrics report it.
    pub fn loads(&self) -> Vec<crate::proto::MasterLoad> {
        self.stats
            .iter()
            .enumerate()
            .map(|(k, s)| crate::proto::MasterLoad {
                master: k,
                pipes: s.pipes.load(Ordering::Relaxed),
                rounds: s.rounds.load(Ordering::Relaxed),
                frames: s.frames.load(Ordering::Relaxed),
                busy_ns: s.busy_ns.load(Ordering::Relaxed),
                idle_ns: s.idle_ns.load(Ordering::Relaxed),
                asleep_ns: s.asleep_ns.load(Ordering::Relaxed),
                sleeps: s.sleeps.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Installs the running captures and wakes the masters to pick them up.
    pub fn set_taps(&self, taps: Vec<Arc<Tap>>) {
        self.taps.store(Arc::new(taps));
        self.poke();
    }

    /// Wakes the master (after a snapshot change or a shutdown request).
    pub fn poke(&self) {
        // SYNC: Release pairs with the master's Acquire load of `version`; the snapshot store
        // above happens before it.
        self.version.fetch_add(1, Ordering::Release);
        wake::wake(&self.version);
        // and the waker thread, so it sees a shutdown
        self.link_armed.store(1, Ordering::Release);
        wake::wake(&self.link_armed);
    }
}

/// A token bucket over a coarse clock (the flood budget).
#[derive(Debug, Clone, Copy)]
struct Budget {
    tokens: f64,
    last: Instant,
}

impl Budget {
    fn full() -> Budget {
        Budget {
            tokens: FLOOD_BURST,
            last: Instant::now(),
        }
    }

    /// Spends one token if there is one.
    fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * FLOOD_RATE).min(FLOOD_BURST);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Master-private state of one pipe.
#[derive(Debug)]
struct Local {
    id: u64,
    tx: Consumer,
    rx: Producer,
    c: [u64; NCOUNTERS],
    dirty_counters: bool,
    /// Frames went into the rx ring this batch: publish it.
    rx_dirty: bool,
    flood: Budget,
    /// While set, this pipe's sleep word is left out of the master's wait (it woke the master
    /// for nothing); `pause` doubles on every repeat.
    muted_until: Option<Instant>,
    pause: Duration,
    /// What the container may send (frames over it wait in its tx ring).
    egress: Option<Bucket>,
    /// What may be delivered to it (frames over it wait in `inq`).
    ingress: Option<Bucket>,
    inq: VecDeque<Vec<u8>>,
    inq_bytes: usize,
    /// Its tx ring is not read before this (ns), waiting for egress tokens.
    egress_until: u64,
    /// Cold: its tx ring is not read; watcher `w` sleeps on its armed sleep word.
    cold: Option<usize>,
    /// When its tx ring last had frames.
    last_tx: Instant,
    /// This master owns it: only then are its rings and counters touched.
    owned: bool,
    /// A capture of its frames, while one runs.
    tap: Option<Arc<Tap>>,
}

/// Whether a frame for a pipe may go into its rx ring now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    Now,
    Queue,
    Drop,
}

impl Local {
    fn new(p: &Pipe) -> Local {
        let mut c = [0; NCOUNTERS];
        // carry over what the control plane last saw (e.g. after a snapshot swap)
        c.copy_from_slice(&p.counters.load_all());
        let mut tx = Consumer::adopt(&p.region, p.info.rings[0]);
        let mut rx = Producer::adopt(&p.region, p.info.rings[1]);
        // ring stats continue from the published counters (e.g. after a snapshot swap)
        tx.stats.frames = c[Counter::TxPackets as usize];
        tx.stats.bytes = c[Counter::TxBytes as usize];
        tx.stats.bad_desc = c[Counter::BadDesc as usize];
        tx.stats.oversize = c[Counter::Oversize as usize];
        tx.stats.ring_overrun += c[Counter::RingOverrun as usize];
        rx.stats.kicks = c[Counter::Kicks as usize];
        Local {
            id: p.id,
            tx,
            rx,
            c,
            dirty_counters: false,
            rx_dirty: false,
            flood: Budget::full(),
            muted_until: None,
            pause: Duration::ZERO,
            egress: None,
            ingress: None,
            inq: VecDeque::new(),
            inq_bytes: 0,
            egress_until: 0,
            cold: None,
            last_tx: Instant::now(),
            owned: true,
            tap: None,
        }
    }

    /// Brings the limiters in line with `egress` and `ingress` (a new snapshot): a new limit
    /// starts with a full bucket, a changed one keeps its credit (cut to the new burst), a
    /// removed ingress limit lets its queue through.
    fn set_limits(&mut self, egress: Option<Limit>, ingress: Option<Limit>, t: Timers, now: u64) {
        let sync = |b: &mut Option<Bucket>, l: Option<Limit>| match (b.as_mut(), l) {
            (Some(x), Some(l)) if x.limit() != l => x.set(l, now),
            (Some(_), Some(_)) => {}
            (None, Some(l)) => *b = Some(Bucket::new(l, t, now)),
            (_, None) => *b = None,
        };
        sync(&mut self.egress, egress);
        sync(&mut self.ingress, ingress);
        if self.egress.is_none() {
            self.egress_until = 0;
        }
        self.dirty_counters = true;
    }

    /// Whether a `len`-byte frame for this pipe goes into its rx ring now, waits in the
    /// daemon's queue (its ingress limit), or is dropped (the queue is full).
    fn admit(&mut self, len: usize, now: u64) -> Admit {
        let Some(b) = self.ingress.as_mut() else {
            return Admit::Now;
        };
        if self.inq.is_empty() && b.take(len, now) {
            return Admit::Now;
        }
        if self.inq_bytes + len > INGRESS_QUEUE {
            self.count(Counter::RateLimited, 1);
            return Admit::Drop;
        }
        self.count(Counter::RateWaits, 1);
        Admit::Queue
    }

    fn enqueue(&mut self, frame: Vec<u8>) {
        self.inq_bytes += frame.len();
        self.inq.push_back(frame);
    }

    /// Moves queued frames into the rx ring as the ingress limit allows. Returns how many.
    fn drain(&mut self, p: &Pipe, now: u64) -> usize {
        let mut n = 0;
        while let Some(f) = self.inq.front() {
            let len = f.len();
            let fits = self.rx.fits(&p.region, len);
            if !fits || !self.ingress.as_mut().is_some_and(|b| b.take(len, now)) {
                break;
            }
            let f = self.inq.pop_front().unwrap_or_default();
            self.inq_bytes -= len;
            if self.rx.push(&p.region, &f, 0).is_ok() {
                if let Some(t) = &self.tap {
                    t.offer_bytes(&f, Dir::In);
                }
                self.count(Counter::RxPackets, 1);
                self.count(Counter::RxBytes, len as u64);
                n += 1;
            }
        }
        n
    }

    /// Nanoseconds until this pipe's limiters let something move (`None`: nothing waits).
    fn rate_wait(&self, now: u64) -> Option<u64> {
        let e = (self.egress_until > now).then(|| self.egress_until - now);
        let i = match (self.inq.front(), &self.ingress) {
            (Some(f), Some(b)) => Some(b.wait_for(f.len(), now)),
            _ => None,
        };
        match (e, i) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn muted(&self, now: Instant) -> bool {
        self.muted_until.is_some_and(|t| t > now)
    }

    /// It woke the master with no work: leave it out of the wait for longer each time.
    fn mute(&mut self, now: Instant) {
        self.pause = (self.pause * 2).clamp(MUTE_MIN, MUTE_MAX);
        self.muted_until = Some(now + self.pause);
        self.count(Counter::SpuriousWakes, 1);
    }

    fn count(&mut self, k: Counter, n: u64) {
        self.c[k as usize] += n;
        self.dirty_counters = true;
    }

    fn flush(&mut self, p: &Pipe) {
        if !self.dirty_counters {
            return;
        }
        let t = self.tx.stats;
        self.c[Counter::TxPackets as usize] = t.frames;
        self.c[Counter::TxBytes as usize] = t.bytes;
        self.c[Counter::BadDesc as usize] = t.bad_desc;
        self.c[Counter::Oversize as usize] = t.oversize;
        self.c[Counter::RingOverrun as usize] = t.ring_overrun + self.rx.stats.ring_overrun;
        self.c[Counter::Kicks as usize] = self.rx.stats.kicks;
        p.counters.store_all(&self.c);
        if self.egress.is_some() || self.ingress.is_some() {
            let now = wake::monotonic_ns();
            let st = |b: &Bucket| [b.tokens_bits(now), b.passed, b.waits];
            if let Some(b) = &self.egress {
                for (a, v) in p.rate.egress.iter().zip(st(b)) {
                    a.store(v, Ordering::Relaxed);
                }
            }
            if let Some(b) = &self.ingress {
                let v = st(b);
                for (a, v) in p
                    .rate
                    .ingress
                    .iter()
                    .zip(v.iter().chain([&(self.inq_bytes as u64)]))
                {
                    a.store(*v, Ordering::Relaxed);
                }
            }
        }
        self.dirty_counters = false;
    }
}

fn rebuild(
    snap: &Snapshot,
    old: Vec<Local>,
    me: usize,
    masters: usize,
    taps: &[Arc<Tap>],
) -> Vec<Local> {
    let mut old: HashMap<u64, Local> = old.into_iter().map(|l| (l.id, l)).collect();
    let now = wake::monotonic_ns();
    snap.pipes
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut l = old.remove(&p.id).unwrap_or_else(|| Local::new(p));
            l.owned = shard_of(p.id, masters) == me;
            l.tap = taps.iter().find(|t| t.pipe == p.id).cloned();
            if !l.owned {
                return l;
            }
            let lim = snap.limits.get(i).copied().unwrap_or_default();
            l.set_limits(lim.egress, lim.ingress, snap.timers, now);
            if l.ingress.is_none() && !l.inq.is_empty() {
                // the limit is gone: what waited goes in as the ring allows
                for f in std::mem::take(&mut l.inq) {
                    if l.rx.push(&p.region, &f, 0).is_err() {
                        l.count(Counter::DropRxFull, 1);
                    }
                }
                l.inq_bytes = 0;
                l.rx.publish(&p.region);
            }
            l
        })
        .collect()
}

/// The way to the other masters, for one round.
struct Cross<'a> {
    shared: &'a MasterShared,
    me: usize,
    /// Masters that got frames this round (to wake if they sleep).
    notify: &'a mut [bool],
}

impl Cross<'_> {
    /// Queues a copy of `frame` (from `src`, with `hdr` over its start) for pipe `dst`'s master.
    fn send(&mut self, snap: &Snapshot, src: usize, dst: usize, frame: Frame, hdr: &[u8]) -> bool {
        let masters = self.shared.shards.len();
        let dp = &snap.pipes[dst];
        let j = shard_of(dp.id, masters);
        let mut bytes = vec![0u8; frame.len];
        if !snap.pipes[src].region.read(frame.off, &mut bytes) {
            return false;
        }
        bytes[..hdr.len()].copy_from_slice(hdr);
        let parcel = Parcel { pipe: dp.id, bytes };
        if self.shared.shards[j].inbox[self.me].push(parcel).is_err() {
            self.shared.cross_drops.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.shared.cross.fetch_add(1, Ordering::Relaxed);
        self.notify[j] = true;
        true
    }

    /// Wakes the masters that got frames and sleep.
    fn ring(&mut self) {
        // SYNC: SeqCst fence between our pushes and our load of `asleep`; the sleeper has the
        // mirror-image fence between its store of `asleep` and its check of the inboxes.
        fence(Ordering::SeqCst);
        for (j, n) in self.notify.iter_mut().enumerate() {
            if std::mem::take(n) {
                let sh = &self.shared.shards[j];
                if sh.asleep.load(Ordering::Relaxed) != 0 {
                    sh.bell.fetch_add(1, Ordering::Release);
                    wake::wake(&sh.bell);
                }
            }
        }
    }
}

/// Copies `frame` from pipe `src` into pipe `dst`'s rx ring, with `hdr` (the bytes the decision
/// was made on) written over the start, so what arrives is what was checked. A flood copy that
/// finds the receiver full is charged to the sender (`flood_rx_full`), not the receiver. A pipe
/// of another master gets a copy through that master's inbox.
#[allow(clippy::too_many_arguments)]
fn deliver(
    snap: &Snapshot,
    local: &mut [Local],
    src: usize,
    dst: usize,
    frame: Frame,
    hdr: &[u8],
    dirty: &mut Vec<usize>,
    flood: bool,
    now_ns: u64,
    cross: &mut Cross<'_>,
) -> bool {
    let dp = &snap.pipes[dst];
    if !local[dst].owned {
        return cross.send(snap, src, dst, frame, hdr);
    }
    let dl = &mut local[dst];
    if frame.len > dl.rx.layout().frame_size as usize {
        dl.count(Counter::DropTooBig, 1);
        return false;
    }
    if dl.ingress.is_some() && dl.inq.is_empty() && !dl.rx.fits(&dp.region, frame.len) {
        // no room: dropped as below, but before the limit takes tokens for it (a 64 KiB
        // segment would leave the receiver owing what it never got)
        count_rx_full(local, src, dst, flood);
        return false;
    }
    match dl.admit(frame.len, now_ns) {
        Admit::Now => {}
        Admit::Drop => return false,
        Admit::Queue => {
            // over the receiver's ingress limit: a copy waits in the daemon's queue
            let mut v = vec![0u8; frame.len];
            if snap.pipes[src].region.read(frame.off, &mut v) {
                v[..hdr.len()].copy_from_slice(hdr);
                local[dst].enqueue(v);
            }
            return false;
        }
    }
    let dl = &mut local[dst];
    let Some(slot) = dl.rx.reserve_len(&dp.region, frame.len) else {
        count_rx_full(local, src, dst, flood);
        return false;
    };
    let sp = &snap.pipes[src];
    if !copy_between(&sp.region, frame.off, &dp.region, slot.off, frame.len)
        || !dp.region.write(slot.off, hdr)
        || dl.rx.commit(&dp.region, frame.len, 0).is_err()
    {
        return false;
    }
    if let Some(t) = &dl.tap {
        t.offer_region(&dp.region, slot.off, frame.len, hdr, Dir::In);
    }
    dl.count(Counter::RxPackets, 1);
    dl.count(Counter::RxBytes, frame.len as u64);
    mark(dl, dst, dirty);
    true
}

/// Counts a frame from `src` that found `dst`'s rx ring full: a flooded copy is charged to the
/// sender, never to the receiver.
fn count_rx_full(local: &mut [Local], src: usize, dst: usize, flood: bool) {
    if flood {
        local[src].count(Counter::FloodRxFull, 1);
    } else {
        local[dst].count(Counter::DropRxFull, 1);
    }
}

/// Notes that pipe `idx`'s rx ring has frames to publish (once per batch).
fn mark(l: &mut Local, idx: usize, dirty: &mut Vec<usize>) {
    if !l.rx_dirty {
        l.rx_dirty = true;
        dirty.push(idx);
    }
}

/// Copies `bytes` into pipe `idx`'s rx ring (subject to its ingress limit). True when it was
/// taken: delivered, or queued for the limit.
fn deliver_bytes(
    p: &Pipe,
    l: &mut Local,
    bytes: &[u8],
    dirty: &mut Vec<usize>,
    idx: usize,
    now_ns: u64,
) -> bool {
    match l.admit(bytes.len(), now_ns) {
        Admit::Now => {}
        Admit::Drop => return false,
        Admit::Queue => {
            // taken: it waits for the ingress limit in the daemon's queue
            l.enqueue(bytes.to_vec());
            return true;
        }
    }
    match l.rx.push(&p.region, bytes, 0) {
        Ok(()) => {
            if let Some(t) = &l.tap {
                t.offer_bytes(bytes, Dir::In);
            }
            l.count(Counter::RxPackets, 1);
            l.count(Counter::RxBytes, bytes.len() as u64);
            mark(l, idx, dirty);
            true
        }
        Err(_) => {
            l.count(Counter::DropRxFull, 1);
            false
        }
    }
}

/// Moves up to [`BATCH`] frames from pipe `i`'s tx ring. Returns (frames taken, frames
/// delivered into rx rings or sent to the wire).
#[allow(clippy::too_many_arguments)]
fn pump(
    snap: &Snapshot,
    local: &mut [Local],
    i: usize,
    dirty: &mut Vec<usize>,
    edge: Option<&mut Edge>,
    now: Instant,
    now_ns: u64,
    cross: &mut Cross<'_>,
) -> (usize, u64) {
    let mut edge = edge;
    let sp = &snap.pipes[i];
    let stats_before = (local[i].tx.stats, local[i].rx.stats);
    let mut taken = 0;
    let mut forwarded = 0u64;
    let mut hdr_buf = [0u8; HEADER_PEEK];
    while taken < BATCH {
        let Some(r) = local[i].tx.pop(&sp.region) else {
            break;
        };
        taken += 1;
        let Ok(frame) = r else {
            local[i].dirty_counters = true;
            continue;
        };
        if let Some(b) = local[i].egress.as_mut() {
            if !b.take(frame.len, now_ns) {
                // over its egress limit: the frame stays in its ring (the container's TCP
                // feels the back-pressure) and the ring is not read until the tokens are there
                let wait = b.wait_for(frame.len, now_ns).max(1);
                local[i].tx.unpop(&frame);
                local[i].egress_until = now_ns + wait;
                local[i].count(Counter::RateWaits, 1);
                taken -= 1;
                break;
            }
        }
        let hl = frame.len.min(HEADER_PEEK);
        let hdr = &mut hdr_buf[..hl];
        if !sp.region.read(frame.off, hdr) {
            continue;
        }
        if let Some(t) = &local[i].tap {
            t.offer_region(&sp.region, frame.off, frame.len, hdr, Dir::Out);
        }
        match decide(hdr, frame.len, i, &snap.table) {
            Decision::Unicast(d) => {
                forwarded += u64::from(deliver(
                    snap, local, i, d, frame, hdr, dirty, false, now_ns, cross,
                ));
            }
            Decision::Flood if !local[i].flood.take(now) => {
                local[i].count(Counter::DropFloodLimited, 1);
            }
            Decision::Flood => {
                local[i].count(Counter::Flooded, 1);
                for d in (0..snap.pipes.len()).filter(|&d| d != i) {
                    forwarded += u64::from(deliver(
                        snap, local, i, d, frame, hdr, dirty, true, now_ns, cross,
                    ));
                }
            }
            Decision::Reply(bytes) => {
                local[i].count(Counter::ArpReplies, 1);
                forwarded += u64::from(deliver_bytes(sp, &mut local[i], &bytes, dirty, i, now_ns));
            }
            Decision::NdpReply(bytes) => {
                local[i].count(Counter::NdpReplies, 1);
                forwarded += u64::from(deliver_bytes(sp, &mut local[i], &bytes, dirty, i, now_ns));
            }
            Decision::Wire(dst) => match edge.as_deref_mut() {
                Some(e) => match e.send(
                    &sp.region,
                    frame.off,
                    frame.len,
                    hdr,
                    snap.routes.next_hop(dst),
                    now,
                ) {
                    Sent::Sent => {
                        local[i].count(Counter::WireTx, 1);
                        forwarded += 1;
                    }
                    Sent::Held => local[i].count(Counter::WireTx, 1),
                    Sent::TooBig | Sent::Dropped => local[i].count(Counter::DropWire, 1),
                },
                None => local[i].count(Counter::DropNoRoute, 1),
            },
            Decision::Drop(reason) => local[i].count(
                match reason {
                    DropReason::Malformed => Counter::DropMalformed,
                    DropReason::Spoofed => Counter::DropSpoofed,
                    DropReason::NoRoute => Counter::DropNoRoute,
                    DropReason::Unsupported => Counter::DropUnsupported,
                    DropReason::ExtHeader => Counter::DropExtHeader,
                },
                1,
            ),
        }
    }
    if taken > 0 {
        if local[i].tx.release_and_kick(&sp.region) {
            local[i].rx.stats.kicks += 1;
        }
        local[i].dirty_counters = true;
    } else if (local[i].tx.stats, local[i].rx.stats) != stats_before {
        // nothing moved, but something was counted (an impossible index from the container)
        local[i].dirty_counters = true;
    }
    for &d in dirty.iter() {
        local[d].rx.publish(&snap.pipes[d].region);
        local[d].rx_dirty = false;
    }
    dirty.clear();
    (taken, forwarded)
}

/// Arms every unmuted pipe's tx sleep word, re-checks, and sleeps on them and the control
/// word. Returns the pipes that may have woken it (the woken word's pipe, or every pipe whose
/// word changed), for [`run`] to mute if the next round finds no work.
fn sleep(
    shared: &MasterShared,
    snap: &Snapshot,
    local: &mut [Local],
    seen: u32,
    edge: Option<&Edge>,
    doorbell: (&AtomicU32, u32),
    shard: &Shard,
) -> Vec<usize> {
    let now = Instant::now();
    let shard_bell = shard.bell.load(Ordering::Acquire);
    shard.asleep.store(1, Ordering::Relaxed);
    // SYNC: SeqCst fence between our store of `asleep` and our check of the inboxes; pairs with
    // the fence in `Cross::ring`.
    fence(Ordering::SeqCst);
    let mut pending = shard.pending();
    let bell = shared.link_bell.load(Ordering::Acquire);
    if let Some(e) = edge {
        // SYNC: the waker reads `link_armed` before it polls; arming first and then checking
        // the rx ring means a frame landing in between either is seen here or makes the
        // waker's poll return and ring the bell.
        shared.link_armed.store(1, Ordering::SeqCst);
        wake::wake(&shared.link_armed);
        pending |= e.rx_ready() || e.tx_backlog();
    }
    let now_ns = wake::monotonic_ns();
    // pipes waiting for their rate limits' tokens are polled when the tokens are there
    let mut rate_wait: Option<u64> = None;
    for (l, p) in local.iter_mut().zip(snap.pipes.iter()) {
        if let Some(w) = l.rate_wait(now_ns) {
            rate_wait = Some(rate_wait.map_or(w, |x| x.min(w)));
        }
        if l.owned && !l.muted(now) && l.egress_until <= now_ns && l.cold.is_none() {
            pending |= l.tx.arm(&p.region);
        }
    }
    if rate_wait.is_some_and(|w| w < 2_000) {
        // too short to sleep for
        pending = true;
    }
    let mut suspects = Vec::new();
    if !pending && shared.version.load(Ordering::Acquire) == seen {
        // word 0 is the control word; word k is pipe index[k]
        let mut words = Vec::with_capacity(snap.pipes.len() + 1);
        let mut index = vec![usize::MAX];
        words.push((&shared.version, seen));
        if edge.is_some() {
            words.push((&shared.link_bell, bell));
            index.push(usize::MAX);
        }
        words.push(doorbell);
        index.push(usize::MAX);
        words.push((&shard.bell, shard_bell));
        index.push(usize::MAX);
        let mut timeout = IDLE_TIMEOUT;
        if let Some(w) = rate_wait {
            timeout = timeout.min(Duration::from_nanos(w));
        }
        for (i, (l, p)) in local.iter().zip(snap.pipes.iter()).enumerate() {
            if let Some(t) = l.muted_until.filter(|t| *t > now) {
                // a muted pipe is polled when its mute ends
                timeout = timeout.min(t - now);
            } else if !l.owned || l.egress_until > now_ns || l.cold.is_some() {
                // waiting for tokens: polled when they are there (above); cold: a watcher
                // sleeps on it
            } else if let Some(w) = l.tx.sleep_word(&p.region) {
                words.push((w, 1));
                index.push(i);
            }
        }
        // futex_waitv takes 128 words; the master cools pipes to stay within them, and polls
        // the rest every millisecond only if no watcher thread could be started.
        if words.len() > MAX_WAITERS {
            timeout = timeout.min(Duration::from_millis(1));
        }
        shared.sleeps.fetch_add(1, Ordering::Relaxed);
        match wake::wait_any(&words, Some(timeout)) {
            Ok(Woke::Woken(k)) => suspects.extend(index.get(k).filter(|i| **i != usize::MAX)),
            Ok(Woke::Changed) => suspects.extend(
                words
                    .iter()
                    .zip(&index)
                    .skip(1)
                    .filter(|((w, v), i)| **i != usize::MAX && w.load(Ordering::Relaxed) != *v)
                    .map(|(_, i)| *i),
            ),
            Ok(Woke::TimedOut) => {}
            Err(e) => {
                tracing::warn!("futex_waitv failed: {e}; polling");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    for (l, p) in local.iter().zip(snap.pipes.iter()) {
        if l.owned && l.cold.is_none() {
            l.tx.disarm(&p.region);
        }
    }
    shard.asleep.store(0, Ordering::Relaxed);
    if edge.is_some() {
        shared.link_armed.store(0, Ordering::Release);
    }
    suspects
}

/// The waker thread of a master that drives a link: while the master sleeps (`link_armed`),
/// waits for the link's descriptors to become readable and rings `link_bell`. Ends on shutdown.
fn waker(shared: Arc<MasterShared>, fds: Vec<OwnedFd>) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    while !shared.shutdown.load(Ordering::Acquire) {
        if shared.link_armed.load(Ordering::Acquire) == 0 {
            let _ = wake::wait_any(&[(&shared.link_armed, 0)], Some(IDLE_TIMEOUT));
            continue;
        }
        let mut pfds: Vec<PollFd> = fds
            .iter()
            .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN))
            .collect();
        match poll(&mut pfds, PollTimeout::from(250u16)) {
            Ok(n) if n > 0 => {
                if shared.link_armed.swap(0, Ordering::AcqRel) == 1 {
                    shared.link_bell.fetch_add(1, Ordering::Release);
                    wake::wake(&shared.link_bell);
                }
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::warn!("waiting on the link: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The master's state between rounds. [`run`] drives it; tests and the fuzz targets drive it
/// a round at a time.
#[derive(Debug)]
pub struct Master {
    shared: Arc<MasterShared>,
    seen: u32,
    snap: Arc<Snapshot>,
    local: Vec<Local>,
    dirty: Vec<usize>,
    /// Pipes that may have woken the last sleep.
    suspects: Vec<usize>,
    /// The link to the wire, if the daemon drives one.
    edge: Option<Edge>,
    last_tick: Instant,
    /// Where watchers report cold pipes that rang, and the value last seen.
    bell: Arc<Bell>,
    bell_seen: u32,
    watchers: Watchers,
    /// Pipe id to index in `snap` (to find a pipe that rang).
    ids: HashMap<u64, usize>,
    rung: Vec<u64>,
    last_cool: Instant,
    /// Which master this is, of how many.
    me: usize,
    masters: usize,
    /// Masters to wake after this round (frames went into their inboxes).
    notify: Vec<bool>,
    /// Cold pipes and watcher threads last added to the shared gauges.
    gauges: (u64, u64),
    /// Pipes this master owns.
    owned: usize,
    /// When the last round began (its clock read, reused for the time split).
    round_ns: u64,
}

impl Master {
    /// A master working from `shared`'s current snapshot.
    pub fn new(shared: Arc<MasterShared>) -> Master {
        Master::with_edge(shared, None)
    }

    /// A master that also drives a link to the wire.
    pub fn with_edge(shared: Arc<MasterShared>, edge: Option<Edge>) -> Master {
        Master::shard(shared, 0, edge)
    }

    /// Master `me` of `shared.shards.len()` (only one of them may drive a link).
    pub fn shard(shared: Arc<MasterShared>, me: usize, edge: Option<Edge>) -> Master {
        // SYNC: the version is read before the snapshot: a snapshot published in between is
        // picked up by the first `refresh` (its version differs) instead of being missed.
        let seen = shared.version.load(Ordering::Acquire);
        let snap = shared.snap.load_full();
        let bell = Arc::new(Bell::default());
        let masters = shared.shards.len();
        let me = me.min(masters - 1);
        let mut m = Master {
            me,
            masters,
            notify: vec![false; masters],
            gauges: (0, 0),
            owned: 0,
            round_ns: 0,
            seen,
            local: rebuild(&snap, Vec::new(), me, masters, &shared.taps.load()),
            ids: snap
                .pipes
                .iter()
                .enumerate()
                .map(|(i, p)| (p.id, i))
                .collect(),
            snap,
            shared,
            dirty: Vec::with_capacity(8),
            suspects: Vec::new(),
            edge,
            last_tick: Instant::now(),
            watchers: Watchers::new(bell.clone()),
            bell,
            bell_seen: 0,
            rung: Vec::new(),
            last_cool: Instant::now(),
        };
        m.owned = m.local.iter().filter(|l| l.owned).count();
        m.shared.stats[me]
            .pipes
            .store(m.owned as u64, Ordering::Relaxed);
        m.sync_edge();
        m
    }

    /// Hands changed sets to the watchers and publishes how many pipes are cold.
    fn publish_watch(&mut self) {
        self.watchers.publish(&self.snap);
        let s = &self.shared;
        let now = (
            self.watchers.watched() as u64,
            self.watchers.threads() as u64,
        );
        // each master adds its change, so the gauges are totals over the masters
        s.cold
            .fetch_add(now.0.wrapping_sub(self.gauges.0), Ordering::Relaxed);
        s.watchers
            .fetch_add(now.1.wrapping_sub(self.gauges.1), Ordering::Relaxed);
        self.gauges = now;
    }

    /// Delivers what the other masters queued for this one's pipes (at most [`INBOX`] from
    /// each). Returns the frames taken.
    fn take_inbox(&mut self, now_ns: u64) -> usize {
        let mut n = 0;
        let shared = self.shared.clone();
        for q in &shared.shards[self.me].inbox {
            for _ in 0..INBOX {
                let Some(parcel) = q.pop() else { break };
                n += 1;
                let found = self.ids.get(&parcel.pipe).copied();
                let Some(d) = found.filter(|&d| self.local[d].owned) else {
                    // removed meanwhile
                    shared.cross_drops.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let (p, l) = (&self.snap.pipes[d], &mut self.local[d]);
                if parcel.bytes.len() > l.rx.layout().frame_size as usize {
                    l.count(Counter::DropTooBig, 1);
                    continue;
                }
                deliver_bytes(p, l, &parcel.bytes, &mut self.dirty, d, now_ns);
            }
        }
        for &d in self.dirty.iter() {
            self.local[d].rx.publish(&self.snap.pipes[d].region);
            self.local[d].rx_dirty = false;
        }
        self.dirty.clear();
        n
    }

    /// Takes the pipes that rang their cold sleep words back into the rounds; they are suspects
    /// until a round finds work.
    fn take_rung(&mut self, now: Instant) {
        // SYNC: Acquire pairs with the Release increment in `Bell::ring`.
        let v = self.bell.word.load(Ordering::Acquire);
        if v == self.bell_seen {
            return;
        }
        self.bell_seen = v;
        self.bell.take(&mut self.rung);
        for id in self.rung.drain(..) {
            let Some(&i) = self.ids.get(&id) else {
                continue;
            };
            let l = &mut self.local[i];
            if let Some(w) = l.cold.take() {
                self.watchers.remove(w, i);
                l.tx.disarm(&self.snap.pipes[i].region);
                l.last_tx = now;
                self.suspects.push(i);
            }
        }
        self.publish_watch();
    }

    /// Makes pipe `i` cold: arms its sleep word and hands it to a watcher. Stays hot if frames
    /// arrived meanwhile or no watcher could take it.
    fn demote(&mut self, i: usize, now: Instant) {
        let (l, p) = (&mut self.local[i], &self.snap.pipes[i]);
        if l.tx.arm(&p.region) {
            l.tx.disarm(&p.region);
            l.last_tx = now;
            return;
        }
        match self.watchers.add(i) {
            Some(w) => l.cold = Some(w),
            None => l.tx.disarm(&p.region),
        }
    }

    /// With more pipes than the master sleeps on itself: cools the pipes idle for
    /// [`COLD_AFTER`] and, before a sleep (`fit`), also the least recently busy beyond
    /// [`ROOM`].
    fn cool(&mut self, now: Instant, fit: bool) {
        if self.owned <= ROOM {
            return;
        }
        let now_ns = wake::monotonic_ns();
        let coolable =
            |l: &Local| l.owned && l.cold.is_none() && !l.muted(now) && l.egress_until <= now_ns;
        let mut hot: Vec<usize> = Vec::new();
        for i in 0..self.local.len() {
            let l = &self.local[i];
            if !coolable(l) {
                continue;
            }
            if now.saturating_duration_since(l.last_tx) >= COLD_AFTER {
                self.demote(i, now);
            } else if fit {
                hot.push(i);
            }
        }
        if hot.len() > ROOM {
            hot.sort_unstable_by_key(|&i| std::cmp::Reverse(self.local[i].last_tx));
            for &i in &hot[ROOM..] {
                self.demote(i, now);
            }
        }
        self.publish_watch();
    }

    /// Tells the link's flow director the pipes' addresses.
    fn sync_edge(&mut self) {
        if let Some(e) = &mut self.edge {
            let ips: Vec<_> = self.snap.pipes.iter().map(|p| p.ip).collect();
            e.set_pipes(&ips);
        }
    }

    /// Picks up a snapshot the control plane published; false once shutdown is asked.
    pub fn refresh(&mut self) -> bool {
        // SYNC: Acquire pairs with the Release increment in `MasterShared::poke`.
        let v = self.shared.version.load(Ordering::Acquire);
        if v == self.seen {
            return true;
        }
        self.seen = v;
        if self.shared.shutdown.load(Ordering::Acquire) {
            return false;
        }
        self.flush_all(false);
        self.snap = self.shared.snap.load_full();
        self.local = rebuild(
            &self.snap,
            std::mem::take(&mut self.local),
            self.me,
            self.masters,
            &self.shared.taps.load(),
        );
        self.owned = self.local.iter().filter(|l| l.owned).count();
        self.shared.stats[self.me]
            .pipes
            .store(self.owned as u64, Ordering::Relaxed);
        // every pipe starts hot in the new snapshot (indices changed)
        self.watchers.clear();
        for (l, p) in self.local.iter_mut().zip(self.snap.pipes.iter()) {
            if l.cold.take().is_some() {
                l.tx.disarm(&p.region);
            }
        }
        self.publish_watch();
        self.ids = self
            .snap
            .pipes
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id, i))
            .collect();
        self.suspects.clear();
        self.sync_edge();
        true
    }

    /// One round: up to [`BATCH`] frames from every pipe's tx ring. Returns the frames taken.
    pub fn round(&mut self) -> usize {
        let now = Instant::now();
        let now_ns = wake::monotonic_ns();
        self.round_ns = now_ns;
        let (mut work, mut delivered) = (0, 0);
        self.take_rung(now);
        if self.masters > 1 {
            work += self.take_inbox(now_ns);
        }
        let mut cross = Cross {
            shared: &self.shared,
            me: self.me,
            notify: &mut self.notify,
        };
        for i in 0..self.snap.pipes.len() {
            if !self.local[i].owned {
                continue;
            }
            if !self.local[i].inq.is_empty() {
                // what waited for this pipe's ingress limit, as far as it allows now
                let n = self.local[i].drain(&self.snap.pipes[i], now_ns);
                if n > 0 {
                    work += n;
                    delivered += n as u64;
                    mark(&mut self.local[i], i, &mut self.dirty);
                }
            }
            if self.local[i].egress_until > now_ns || self.local[i].cold.is_some() {
                continue;
            }
            let (t, d) = pump(
                &self.snap,
                &mut self.local,
                i,
                &mut self.dirty,
                self.edge.as_mut(),
                now,
                now_ns,
                &mut cross,
            );
            work += t;
            delivered += d;
            if t > 0 {
                // it had work: a wake-up from it was real
                self.local[i].pause = Duration::ZERO;
                self.local[i].muted_until = None;
                self.local[i].last_tx = now;
            }
        }
        cross.ring();
        for &d in self.dirty.iter() {
            self.local[d].rx.publish(&self.snap.pipes[d].region);
            self.local[d].rx_dirty = false;
        }
        self.dirty.clear();
        if let Some(e) = &mut self.edge {
            let (n, d) = link_round(e, &self.snap, &mut self.local, &mut self.dirty, now, now_ns);
            work += n;
            delivered += d;
            if now.saturating_duration_since(self.last_tick) >= Duration::from_millis(100) {
                self.last_tick = now;
                e.tick(now);
            }
            e.flush();
        }
        if work == 0 {
            // woken for nothing: whoever woke us waits longer next time
            for &i in &self.suspects {
                self.local[i].mute(now);
            }
        }
        self.suspects.clear();
        if now.saturating_duration_since(self.last_cool) >= COOL_EVERY {
            self.last_cool = now;
            self.cool(now, false);
        }
        self.flush_all(false);
        self.shared
            .forwarded
            .fetch_add(delivered, Ordering::Relaxed);
        work
    }

    /// Sleeps until a pipe or the control plane wakes it (a futex wait on every bell).
    pub fn sleep(&mut self) {
        if let Some(e) = &mut self.edge {
            // what the control plane reads while the master sleeps is current
            e.publish(true);
        }
        self.cool(Instant::now(), true);
        self.suspects = sleep(
            &self.shared,
            &self.snap,
            &mut self.local,
            self.seen,
            self.edge.as_ref(),
            (&self.bell.word, self.bell_seen),
            &self.shared.shards[self.me],
        );
    }

    /// Publishes the counters (all of them with `force`, else those that changed).
    pub fn flush_all(&mut self, force: bool) {
        for (l, p) in self.local.iter_mut().zip(self.snap.pipes.iter()) {
            if !l.owned {
                continue;
            }
            l.dirty_counters |= force;
            l.flush(p);
        }
        if let Some(e) = &mut self.edge {
            e.publish(force);
        }
    }
}

/// Up to [`BATCH`] frames from the link into the pipes. Returns (frames received, frames
/// delivered).
fn link_round(
    edge: &mut Edge,
    snap: &Snapshot,
    local: &mut [Local],
    dirty: &mut Vec<usize>,
    now: Instant,
    now_ns: u64,
) -> (usize, u64) {
    let mut delivered = 0u64;
    let mtu_of = |d: usize| snap.pipes.get(d).map_or(0, |p| p.mtu);
    let n = edge.recv(
        BATCH,
        &snap.table,
        &mtu_of,
        &mut |d, bytes| {
            let (Some(p), Some(l)) = (snap.pipes.get(d), local.get_mut(d)) else {
                return false;
            };
            if bytes.len() > l.rx.layout().frame_size as usize {
                l.count(Counter::DropTooBig, 1);
                return true;
            }
            let ok = deliver_bytes(p, l, bytes, dirty, d, now_ns);
            if ok {
                l.count(Counter::WireRx, 1);
                delivered += 1;
            }
            ok
        },
        now,
    );
    for &d in dirty.iter() {
        local[d].rx.publish(&snap.pipes[d].region);
        local[d].rx_dirty = false;
    }
    dirty.clear();
    (n, delivered)
}

/// Runs the master loop until `shared.shutdown` is set (driving `edge`, if given; a waker
/// thread watches it while the master sleeps).
pub fn run(shared: Arc<MasterShared>, policy: IdlePolicy, edge: Option<Edge>) {
    run_shard(shared, 0, policy, edge)
}

/// Runs master `me` of `shared.shards.len()` until shutdown (see [`run`]).
pub fn run_shard(shared: Arc<MasterShared>, me: usize, policy: IdlePolicy, edge: Option<Edge>) {
    // the waker polls copies of the link's descriptors: they stay valid while it runs
    let fds: Vec<OwnedFd> = edge.iter().flat_map(|e| e.waker_fds()).collect();
    let waker_thread = (!fds.is_empty()).then(|| {
        let s = shared.clone();
        std::thread::Builder::new()
            .name("docknet-link-waker".into())
            .spawn(move || waker(s, fds))
    });
    let mut m = Master::shard(shared.clone(), me, edge);
    let mut idler = Idler::new(policy);
    let st = &shared.stats[m.me];
    // The time split costs no clock read of its own on the busy path: the span from one
    // round's start (its own clock read) to the next is busy if the round moved frames, idle
    // if not, less any sleep in between (timed around the sleep). Published every
    // `PUBLISH_EVERY` rounds and around each sleep; this thread is the only writer.
    const PUBLISH_EVERY: u64 = 64;
    let (mut rounds, mut frames, mut busy, mut idle, mut asleep, mut sleeps) =
        (0u64, 0, 0, 0, 0, 0);
    let mut prev: Option<(u64, bool)> = None;
    let mut slept_ns = 0u64;
    let publish = |r, f, b, i, a, s| {
        st.rounds.store(r, Ordering::Relaxed);
        st.frames.store(f, Ordering::Relaxed);
        st.busy_ns.store(b, Ordering::Relaxed);
        st.idle_ns.store(i, Ordering::Relaxed);
        st.asleep_ns.store(a, Ordering::Relaxed);
        st.sleeps.store(s, Ordering::Relaxed);
    };
    // SYNC: a shutdown asked before `Master::shard` read the version bumped no version this
    // master will ever see change, so it is checked once here (after that read: a later
    // shutdown's poke changes the version, and `refresh` sees it).
    let asked_before = shared.shutdown.load(Ordering::Acquire);
    while !asked_before && m.refresh() {
        let n = m.round();
        rounds += 1;
        frames += n as u64;
        if let Some((start, worked)) = prev {
            let span = m.round_ns.saturating_sub(start).saturating_sub(slept_ns);
            if worked {
                busy += span;
            } else {
                idle += span;
            }
        }
        prev = Some((m.round_ns, n > 0));
        slept_ns = 0;
        if rounds % PUBLISH_EVERY == 0 {
            publish(rounds, frames, busy, idle, asleep, sleeps);
        }
        if n > 0 {
            idler.busy();
            continue;
        }
        if idler.step() {
            // No `idler.busy()` after it: a timeout with no work goes straight back to sleep;
            // work found in the next round resets the idler.
            publish(rounds, frames, busy, idle, asleep, sleeps);
            let t0 = wake::monotonic_ns();
            m.sleep();
            slept_ns = wake::monotonic_ns().saturating_sub(t0);
            asleep += slept_ns;
            sleeps += 1;
            publish(rounds, frames, busy, idle, asleep, sleeps);
        }
    }
    publish(rounds, frames, busy, idle, asleep, sleeps);
    m.flush_all(true);
    drop(m);
    if let Some(Ok(t)) = waker_thread {
        shared.shutdown.store(true, Ordering::Release);
        shared.poke();
        let _ = t.join();
    }
}
