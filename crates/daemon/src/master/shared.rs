//! State shared between the control plane and the master threads, and between the masters.

use super::{INBOX, MAX_MASTERS};
use crate::capture::Tap;
use crate::nic::EdgeShared;
use crate::registry::Snapshot;
use arc_swap::ArcSwap;
use crossbeam_queue::ArrayQueue;
use docknet_pipe::wake;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Asks for fast channels waiting for the control plane.
const TALKERS: usize = 256;

/// A frame on its way to a pipe another master owns.
#[derive(Debug)]
pub struct Parcel {
    /// The destination pipe's id.
    pub(super) pipe: u64,
    /// The frame, as checked by the sending master.
    pub(super) bytes: Vec<u8>,
}

/// What the other masters share with one master.
#[derive(Debug)]
pub struct Shard {
    /// Bumped and futex-woken when another master queued frames while this one slept.
    pub(super) bell: AtomicU32,
    /// Set while this master is asleep or about to be.
    pub(super) asleep: AtomicU32,
    /// `inbox[j]`: frames from master `j` for pipes of this one.
    pub(super) inbox: Vec<ArrayQueue<Parcel>>,
}

impl Shard {
    fn new(masters: usize) -> Shard {
        Shard {
            bell: AtomicU32::new(0),
            asleep: AtomicU32::new(0),
            inbox: (0..masters).map(|_| ArrayQueue::new(INBOX)).collect(),
        }
    }

    pub(super) fn pending(&self) -> bool {
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
    /// Whether the masters look for pipes that talk (automatic fast channels).
    pub auto_channels: AtomicBool,
    /// Pairs of pipes (ids: sender, receiver) a master saw talk, for the control plane to join
    /// by a fast channel. Bounded: an ask that finds it full is dropped (and asked again a
    /// second later while the pair still talks).
    pub talkers: ArrayQueue<(u64, u64)>,
    /// Wakes the control plane when `talkers` has something.
    pub talk_bell: tokio::sync::Notify,
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
            auto_channels: AtomicBool::new(false),
            talkers: ArrayQueue::new(TALKERS),
            talk_bell: tokio::sync::Notify::new(),
        }
    }

    /// A master saw pipe `from` send a run of frames to pipe `to`.
    pub(super) fn talked(&self, from: u64, to: u64) {
        if self.talkers.push((from, to)).is_ok() {
            self.talk_bell.notify_one();
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
