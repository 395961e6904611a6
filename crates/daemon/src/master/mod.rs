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

mod cold;
mod forward;
mod link;
mod local;
mod run_loop;
mod shared;
mod sleep;
mod talk;

pub use run_loop::{run, run_shard};
pub use shared::{shard_of, MasterShared, MasterStats, Parcel, Shard};
pub use talk::{TALK_FRAMES, TALK_NEW_NS, TALK_RETRY_NS};

use crate::nic::Edge;
use crate::registry::{Counter, Snapshot};
use crate::watch::{Bell, Watchers};
use docknet_pipe::wake::{self, MAX_WAITERS};
use forward::{deliver_bytes, mark, pump, Cross};
use link::link_round;
use local::{rebuild, Local};
use sleep::sleep;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
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
/// How long a pipe counts as held at its limits after it last waited for tokens.
const PACED_FOR: Duration = Duration::from_millis(10);
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
    /// The last round's frames were all of traffic held at a rate limit (see
    /// [`Master::round_was_paced`]).
    paced: bool,
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
            paced: false,
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
    /// Delivers what the other masters queued for this one's pipes (at most [`INBOX`] from
    /// each). Returns (parcels taken, those not for a pipe held at its limits).
    fn take_inbox(&mut self, now_ns: u64) -> (usize, usize) {
        let (mut n, mut unpaced) = (0, 0);
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
                if !l.paced(now_ns) {
                    unpaced += 1;
                }
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
        (n, unpaced)
    }
    /// Tells the link's flow director the pipes' addresses and the tunnels' identifiers.
    fn sync_edge(&mut self) {
        if let Some(e) = &mut self.edge {
            let ips: Vec<_> = self.snap.pipes.iter().map(|p| p.ip).collect();
            e.set_pipes(&ips);
            e.set_routes(&self.snap.routes);
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

    /// Whether the last [`Master::round`] moved only frames of traffic held at a rate limit:
    /// those a limit's tokens let go, and the frames sent to a pipe held at its limit (a paced
    /// sender's acknowledgements). Such work comes at times the master knows (it sleeps until
    /// the tokens are there), so it is no sign of more work soon, and the master's idle policy
    /// does not start over for it: a master that yielded between the runs of a paced flow kept
    /// a core busy doing nothing (its whole wait between runs).
    pub fn round_was_paced(&self) -> bool {
        self.paced
    }

    /// One round: up to [`BATCH`] frames from every pipe's tx ring. Returns the frames taken.
    pub fn round(&mut self) -> usize {
        let now = Instant::now();
        let now_ns = wake::monotonic_ns();
        self.round_ns = now_ns;
        // `unpaced`: the frames of traffic no rate limit holds
        let (mut work, mut delivered, mut unpaced) = (0, 0, 0);
        self.take_rung(now);
        if self.masters > 1 {
            let (n, u) = self.take_inbox(now_ns);
            work += n;
            unpaced += u;
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
            let p = pump(
                &self.snap,
                &mut self.local,
                i,
                &mut self.dirty,
                self.edge.as_mut(),
                now,
                now_ns,
                &mut cross,
            );
            work += p.taken;
            delivered += p.forwarded;
            unpaced += p.unpaced;
            if p.taken > 0 {
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
            unpaced += n;
            if now.saturating_duration_since(self.last_tick) >= Duration::from_millis(100) {
                self.last_tick = now;
                e.tick(now);
            }
            e.flush();
        }
        self.paced = work > 0 && unpaced == 0;
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
