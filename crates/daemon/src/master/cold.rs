//! Cold pipes: handing idle pipes to watcher threads and taking them back when they ring.

use super::local::Local;
use super::{Master, COLD_AFTER, ROOM};
use docknet_pipe::wake;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Master {
    /// Hands changed sets to the watchers and publishes how many pipes are cold.
    pub(super) fn publish_watch(&mut self) {
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
    /// Takes the pipes that rang their cold sleep words back into the rounds; they are suspects
    /// until a round finds work.
    pub(super) fn take_rung(&mut self, now: Instant) {
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
    pub(super) fn cool(&mut self, now: Instant, fit: bool) {
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
}
