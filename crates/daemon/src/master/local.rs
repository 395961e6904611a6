//! Master-private state of each pipe: its rings, counters, flood budget and rate limiters.

use super::talk::Talk;
use super::{shard_of, FLOOD_BURST, FLOOD_RATE, INGRESS_QUEUE, MUTE_MAX, MUTE_MIN, PACED_FOR};
use crate::capture::{Dir, Tap};
use crate::rate::{Bucket, Limit, Timers};
use crate::registry::{Counter, Pipe, Snapshot, NCOUNTERS};
use docknet_pipe::wake;
use docknet_pipe::{Consumer, Producer};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A token bucket over a coarse clock (the flood budget).
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
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
    pub(super) fn take(&mut self, now: Instant) -> bool {
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
pub(super) struct Local {
    id: u64,
    pub(super) tx: Consumer,
    pub(super) rx: Producer,
    c: [u64; NCOUNTERS],
    pub(super) dirty_counters: bool,
    /// Frames went into the rx ring this batch: publish it.
    pub(super) rx_dirty: bool,
    pub(super) flood: Budget,
    /// While set, this pipe's sleep word is left out of the master's wait (it woke the master
    /// for nothing); `pause` doubles on every repeat.
    pub(super) muted_until: Option<Instant>,
    pub(super) pause: Duration,
    /// What the container may send (frames over it wait in its tx ring).
    pub(super) egress: Option<Bucket>,
    /// What may be delivered to it (frames over it wait in `inq`).
    pub(super) ingress: Option<Bucket>,
    pub(super) inq: VecDeque<Vec<u8>>,
    inq_bytes: usize,
    /// Its tx ring is not read before this (ns), waiting for egress tokens.
    pub(super) egress_until: u64,
    /// Its ingress queue is not drained before this (ns), waiting for a run's tokens.
    pub(super) ingress_until: u64,
    /// When it last waited for its limits' tokens (ns), in either direction.
    pub(super) paced_at: Option<u64>,
    /// Cold: its tx ring is not read; watcher `w` sleeps on its armed sleep word.
    pub(super) cold: Option<usize>,
    /// When its tx ring last had frames.
    pub(super) last_tx: Instant,
    /// This master owns it: only then are its rings and counters touched.
    pub(super) owned: bool,
    /// A capture of its frames, while one runs.
    pub(super) tap: Option<Arc<Tap>>,
    /// Its current run of frames to one other pipe (automatic fast channels).
    pub(super) talk: Talk,
}

/// Whether a frame for a pipe may go into its rx ring now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
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
            ingress_until: 0,
            paced_at: None,
            cold: None,
            last_tx: Instant::now(),
            owned: true,
            tap: None,
            talk: Talk::default(),
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
        if self.ingress.is_none() {
            self.ingress_until = 0;
        }
        if self.egress.is_none() && self.ingress.is_none() {
            self.paced_at = None;
        }
        self.dirty_counters = true;
    }

    /// Whether a `len`-byte frame for this pipe goes into its rx ring now, waits in the
    /// daemon's queue (its ingress limit), or is dropped (the queue is full).
    pub(super) fn admit(&mut self, len: usize, now: u64) -> Admit {
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
        self.paced_at = Some(now);
        Admit::Queue
    }

    pub(super) fn enqueue(&mut self, frame: Vec<u8>) {
        self.inq_bytes += frame.len();
        self.inq.push_back(frame);
    }

    /// Moves queued frames into the rx ring as the ingress limit allows. Returns how many.
    /// Once held at the limit, the queue waits for a run's tokens (see
    /// [`Bucket::wait_for_run`]) before it moves again.
    pub(super) fn drain(&mut self, p: &Pipe, now: u64) -> usize {
        if self.ingress_until > now {
            return 0;
        }
        let mut n = 0;
        while let Some(f) = self.inq.front() {
            let len = f.len();
            if !self.rx.fits(&p.region, len) {
                break;
            }
            let Some(b) = self.ingress.as_mut() else {
                break;
            };
            if !b.take(len, now) {
                self.ingress_until = now + b.wait_for_run(len, now).max(1);
                self.paced_at = Some(now);
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
    pub(super) fn rate_wait(&self, now: u64) -> Option<u64> {
        let e = (self.egress_until > now).then(|| self.egress_until - now);
        let i = match (self.inq.front(), &self.ingress) {
            (Some(_), Some(_)) if self.ingress_until > now => Some(self.ingress_until - now),
            (Some(f), Some(b)) => Some(b.wait_for(f.len(), now)),
            _ => None,
        };
        match (e, i) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether this pipe's traffic is held at one of its limits: it waited for tokens within
    /// the last [`PACED_FOR`]. Its frames, and the frames sent to it (a paced sender's
    /// acknowledgements), come when its tokens let them, which the master knows.
    pub(super) fn paced(&self, now: u64) -> bool {
        self.paced_at
            .is_some_and(|t| u128::from(now.saturating_sub(t)) < PACED_FOR.as_nanos())
    }

    pub(super) fn muted(&self, now: Instant) -> bool {
        self.muted_until.is_some_and(|t| t > now)
    }

    /// It woke the master with no work: leave it out of the wait for longer each time.
    pub(super) fn mute(&mut self, now: Instant) {
        self.pause = (self.pause * 2).clamp(MUTE_MIN, MUTE_MAX);
        self.muted_until = Some(now + self.pause);
        self.count(Counter::SpuriousWakes, 1);
    }

    pub(super) fn count(&mut self, k: Counter, n: u64) {
        self.c[k as usize] += n;
        self.dirty_counters = true;
    }

    pub(super) fn flush(&mut self, p: &Pipe) {
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

pub(super) fn rebuild(
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
