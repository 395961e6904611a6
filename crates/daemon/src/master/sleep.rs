//! Putting a master to sleep on its futexes until something wakes it.

use super::local::Local;
use super::{MasterShared, Shard, IDLE_TIMEOUT};
use crate::nic::Edge;
use crate::registry::Snapshot;
use docknet_pipe::wake::{self, Woke, MAX_WAITERS};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Arms every unmuted pipe's tx sleep word, re-checks, and sleeps on them and the control
/// word. Returns the pipes that may have woken it (the woken word's pipe, or every pipe whose
/// word changed), for [`run`](super::run) to mute if the next round finds no work.
pub(super) fn sleep(
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
