//! Watchers: the master's doorbell for pipes beyond what one futex wait can hold.
//!
//! `futex_waitv` sleeps on at most 128 words, and reading every pipe's ring index on every
//! round costs a shared-memory cache miss per pipe. So when a master serves more pipes than fit
//! in its own wait, the pipes that have sent nothing for a while go *cold*: their tx sleep word
//! stays armed, the master stops reading their rings, and a watcher thread sleeps on up to 127
//! such words at once. A container that sends into a cold pipe kicks its word (as it would kick
//! a sleeping master); the watcher wakes, notes the pipe in the master's [`Bell`] and wakes the
//! master with one futex. The master takes the pipe back into its rounds. Finding work then
//! costs one atomic load per round for all cold pipes together, and no pipe count needs
//! polling.
//!
//! Every word a watcher sleeps on lives in the region of the pipe it belongs to, so a container
//! can only ring for itself; a pipe that rings with nothing to send is muted by the master like
//! any other spurious wake-up (see `master.rs`).

use crate::registry::Snapshot;
use docknet_pipe::wake::{self, Woke, MAX_WAITERS};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Pipes one watcher sleeps on (its own epoch word takes the last place).
pub const PER_WATCHER: usize = MAX_WAITERS - 1;
/// Longest sleep of a watcher before it re-reads its set (a safety net: changes are woken).
const WATCH_TIMEOUT: Duration = Duration::from_millis(250);

/// Where watchers report the pipes that rang; the master sleeps on `word` among its others.
#[derive(Debug, Default)]
pub struct Bell {
    /// Bumped and futex-woken on every ring.
    pub word: AtomicU32,
    /// Pipes (by id) that rang since the master last looked.
    rung: Mutex<Vec<u64>>,
    /// Rings in total (for `status` and tests).
    pub rings: AtomicU64,
}

impl Bell {
    fn ring(&self, ids: &[u64]) {
        if let Ok(mut g) = self.rung.lock() {
            g.extend_from_slice(ids);
        }
        self.rings.fetch_add(1, Ordering::Relaxed);
        // SYNC: Release pairs with the master's Acquire load of `word`: the ids pushed above
        // are there when it sees the new value.
        self.word.fetch_add(1, Ordering::Release);
        wake::wake(&self.word);
    }

    /// Moves the pipes that rang into `out`.
    pub fn take(&self, out: &mut Vec<u64>) {
        if let Ok(mut g) = self.rung.lock() {
            out.append(&mut g);
        }
    }
}

/// What one watcher thread watches, as the master last published it.
#[derive(Debug, Default)]
struct Job {
    /// Bumped (and woken) when the set changes or the watcher must stop.
    epoch: AtomicU32,
    stop: AtomicBool,
    set: Mutex<(Option<Arc<Snapshot>>, Vec<usize>)>,
}

#[derive(Debug)]
struct Slot {
    job: Arc<Job>,
    /// The master's copy of the set (indices into its snapshot).
    pipes: Vec<usize>,
    changed: bool,
    thread: Option<JoinHandle<()>>,
}

/// A master's watcher threads, grown as cold pipes need them.
#[derive(Debug)]
pub struct Watchers {
    bell: Arc<Bell>,
    pool: Vec<Slot>,
}

impl Watchers {
    /// No watchers yet; they will ring `bell`.
    pub fn new(bell: Arc<Bell>) -> Watchers {
        Watchers {
            bell,
            pool: Vec::new(),
        }
    }

    /// Watcher threads running.
    pub fn threads(&self) -> usize {
        self.pool.len()
    }

    /// Pipes watched in total.
    pub fn watched(&self) -> usize {
        self.pool.iter().map(|s| s.pipes.len()).sum()
    }

    /// Gives pipe `i` (whose tx sleep word is armed) to a watcher with room, starting one if
    /// none has. Returns the watcher, or `None` if no thread could be started.
    pub fn add(&mut self, i: usize) -> Option<usize> {
        let w = match self.pool.iter().position(|s| s.pipes.len() < PER_WATCHER) {
            Some(w) => w,
            None => {
                let job = Arc::new(Job::default());
                let (j, b) = (job.clone(), self.bell.clone());
                let thread = std::thread::Builder::new()
                    .name("docknet-watch".into())
                    .spawn(move || watch(&j, &b));
                let thread = match thread {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!("cannot start a watcher thread: {e}");
                        return None;
                    }
                };
                self.pool.push(Slot {
                    job,
                    pipes: Vec::with_capacity(PER_WATCHER),
                    changed: false,
                    thread: Some(thread),
                });
                self.pool.len() - 1
            }
        };
        let s = &mut self.pool[w];
        s.pipes.push(i);
        s.changed = true;
        Some(w)
    }

    /// Takes pipe `i` from watcher `w`.
    pub fn remove(&mut self, w: usize, i: usize) {
        if let Some(s) = self.pool.get_mut(w) {
            s.pipes.retain(|&p| p != i);
            s.changed = true;
        }
    }

    /// Takes every pipe from every watcher (the snapshot changed: indices mean other pipes).
    pub fn clear(&mut self) {
        for s in &mut self.pool {
            s.changed |= !s.pipes.is_empty();
            s.pipes.clear();
        }
    }

    /// Hands the changed sets to their watchers.
    pub fn publish(&mut self, snap: &Arc<Snapshot>) {
        for s in self.pool.iter_mut().filter(|s| s.changed) {
            if let Ok(mut g) = s.job.set.lock() {
                *g = (Some(snap.clone()), s.pipes.clone());
            }
            s.changed = false;
            s.job.epoch.fetch_add(1, Ordering::Release);
            wake::wake(&s.job.epoch);
        }
    }
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for s in &self.pool {
            s.job.stop.store(true, Ordering::Release);
            s.job.epoch.fetch_add(1, Ordering::Release);
            wake::wake(&s.job.epoch);
        }
        for s in &mut self.pool {
            if let Some(t) = s.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// A watcher thread: sleeps on its pipes' armed tx sleep words and rings `bell` for each pipe
/// whose word was kicked (or changed, or woken at all: the master judges whether it had work).
/// A reported pipe is dropped from the wait until the master publishes a new set.
fn watch(job: &Job, bell: &Bell) {
    let mut rung: Vec<u64> = Vec::new();
    while !job.stop.load(Ordering::Acquire) {
        let e = job.epoch.load(Ordering::Acquire);
        let (snap, mut live) = match job.set.lock() {
            Ok(g) => (g.0.clone(), g.1.clone()),
            Err(_) => return,
        };
        loop {
            // (pipe index, its word): pipes without a readable word are skipped
            let words: Vec<(usize, &AtomicU32)> = snap.as_deref().map_or(Vec::new(), |s| {
                live.iter()
                    .filter_map(|&i| {
                        let p = s.pipes.get(i)?;
                        Some((i, p.region.u32_at(p.info.rings[0].sleep_off())?))
                    })
                    .collect()
            });
            let mut wait: Vec<(&AtomicU32, u32)> = Vec::with_capacity(words.len() + 1);
            wait.push((&job.epoch, e));
            wait.extend(words.iter().map(|(_, w)| (*w, 1)));
            let woke = wake::wait_any(&wait, Some(WATCH_TIMEOUT));
            if job.epoch.load(Ordering::Acquire) != e {
                break;
            }
            let hit: Vec<usize> = match woke {
                Ok(Woke::Woken(k)) if k > 0 => vec![words[k - 1].0],
                Ok(Woke::Changed) => words
                    .iter()
                    .filter(|(_, w)| w.load(Ordering::Relaxed) != 1)
                    .map(|(i, _)| *i)
                    .collect(),
                Ok(_) => Vec::new(),
                Err(e) => {
                    tracing::warn!("watcher: futex_waitv failed: {e}");
                    std::thread::sleep(Duration::from_millis(1));
                    Vec::new()
                }
            };
            if hit.is_empty() {
                continue;
            }
            let Some(s) = snap.as_deref() else { break };
            rung.clear();
            rung.extend(hit.iter().filter_map(|&i| s.pipes.get(i).map(|p| p.id)));
            live.retain(|i| !hit.contains(i));
            bell.ring(&rung);
        }
    }
}
