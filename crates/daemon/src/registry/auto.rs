//! Automatic fast channels: the masters notice pipes that talk ([`crate::master`]), and the
//! registry joins them by a fast channel when that loses nothing the daemon's path gives.
//!
//! A pair is joined only when both pipes have a container reading their connection (a channel
//! nobody reads would swallow frames), neither has a rate limit nor a running capture (a
//! channel passes the daemon by, so it would escape both), and neither takes part in
//! [`AUTO_PER_PIPE`] automatic channels already (each channel costs its partners a look per
//! poll and a region of memory, so a container that sends to many pipes cannot load them with
//! channels), nor when all automatic channels together would hold more than [`AUTO_MAX_BYTES`]. An automatic channel whose rings moved nothing for [`AUTO_IDLE`] goes, and so do
//! a pipe's automatic channels when it gets a rate limit or a capture. Channels made by hand
//! (`fc connect`) are never touched.

use super::{fc_key, Registry};
use crate::proto::{ApiError, FcInfo};
use std::time::{Duration, Instant};

/// Automatic channels one pipe takes part in, at most.
pub const AUTO_PER_PIPE: usize = 8;
/// Bytes of the regions of all automatic channels, at most (every page of a region is
/// allocated when it is made: 3 MB for a channel at MTU 1500, 32 MB at 64 KiB).
pub const AUTO_MAX_BYTES: usize = 512 << 20;
/// An automatic channel that moved no frame for this long is removed.
pub const AUTO_IDLE: Duration = Duration::from_secs(30);

/// What came of an ask for an automatic channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AutoOutcome {
    /// The channel was made.
    Made(FcInfo),
    /// Not made, and why (for the debug log and the counters).
    Skipped(&'static str),
}

/// The registry's state for automatic channels.
#[derive(Debug, Default)]
pub(super) struct AutoState {
    /// Whether asks are served.
    pub(super) enabled: bool,
    /// Channels made.
    pub(super) made: u64,
    /// Asks not served.
    pub(super) skipped: u64,
    /// Channels removed because they were idle.
    pub(super) reaped: u64,
}

/// When an automatic channel's rings last moved, and what they said then.
#[derive(Debug, Clone, Copy)]
pub(super) struct Movement {
    pub(super) seen: (u32, u32),
    pub(super) at: Instant,
}

impl Registry {
    /// Turns automatic fast channels on or off (the daemon's `--fast-channels`).
    pub fn set_auto_channels(&mut self, on: bool) {
        self.auto.enabled = on;
    }

    /// Whether automatic fast channels are on.
    pub fn auto_channels(&self) -> bool {
        self.auto.enabled
    }

    /// Automatic channels now, made, asks not served, removed as idle.
    pub fn auto_stats(&self) -> (usize, u64, u64, u64) {
        let now = self.fcs.values().filter(|c| c.rec.auto).count();
        (now, self.auto.made, self.auto.skipped, self.auto.reaped)
    }

    /// Serves a master's ask: pipe `from` (id) sent a run of frames to pipe `to`. `captured`:
    /// ids of the pipes being captured.
    pub fn auto_connect(&mut self, from: u64, to: u64, captured: &[u64]) -> AutoOutcome {
        let out = self.try_auto(from, to, captured);
        match &out {
            AutoOutcome::Made(_) => self.auto.made += 1,
            AutoOutcome::Skipped(_) => self.auto.skipped += 1,
        }
        out
    }

    fn try_auto(&mut self, from: u64, to: u64, captured: &[u64]) -> AutoOutcome {
        if !self.auto.enabled {
            return AutoOutcome::Skipped("automatic channels are off");
        }
        let name = |id: u64| {
            self.pipes
                .values()
                .find(|p| p.id == id)
                .map(|p| p.name.clone())
        };
        let (Some(a), Some(b)) = (name(from), name(to)) else {
            return AutoOutcome::Skipped("a pipe is gone");
        };
        if a == b {
            return AutoOutcome::Skipped("one pipe");
        }
        if self.fcs.contains_key(&fc_key(&a, &b)) {
            return AutoOutcome::Skipped("a channel exists");
        }
        if captured.contains(&from) || captured.contains(&to) {
            return AutoOutcome::Skipped("a capture runs");
        }
        let limited = |n: &str| self.limits.get(n).is_some_and(|l| !l.is_empty());
        if limited(&a) || limited(&b) {
            return AutoOutcome::Skipped("a rate limit");
        }
        if self.connections(&a) == 0 || self.connections(&b) == 0 {
            return AutoOutcome::Skipped("a pipe nobody reads");
        }
        let autos = |n: &str| {
            self.fcs
                .values()
                .filter(|c| c.rec.auto && (c.rec.a == n || c.rec.b == n))
                .count()
        };
        if autos(&a) >= AUTO_PER_PIPE || autos(&b) >= AUTO_PER_PIPE {
            return AutoOutcome::Skipped("a pipe has its most automatic channels");
        }
        let held: usize = self
            .fcs
            .values()
            .filter(|c| c.rec.auto)
            .map(|c| c.region.len())
            .sum();
        let mtu = self.pipes[&a].mtu.min(self.pipes[&b].mtu);
        let need = super::channels::channel_plan(mtu, None).map_or(usize::MAX, |(_, _, size)| size);
        if held.saturating_add(need) > AUTO_MAX_BYTES {
            return AutoOutcome::Skipped("automatic channels hold their most memory");
        }
        match self.make_fc(&a, &b, None, true) {
            Ok(info) => AutoOutcome::Made(info),
            Err(ApiError { .. }) => AutoOutcome::Skipped("the channel could not be made"),
        }
    }

    /// Removes pipe `name`'s automatic channels (it got a rate limit or a capture). Returns how
    /// many.
    pub fn drop_auto_channels(&mut self, name: &str) -> usize {
        let keys: Vec<_> = self
            .fcs
            .iter()
            .filter(|(_, c)| c.rec.auto && (c.rec.a == name || c.rec.b == name))
            .map(|(k, _)| k.clone())
            .collect();
        self.forget_channels(&keys);
        keys.len()
    }

    /// Removes the automatic channels whose rings moved nothing for [`AUTO_IDLE`] before
    /// `now`; returns their partners.
    pub fn reap_auto_channels(&mut self, now: Instant) -> Vec<(String, String)> {
        let traffic: Vec<_> = self
            .fcs
            .iter_mut()
            .filter(|(_, c)| c.rec.auto)
            .filter_map(|(k, c)| {
                let seen = c.producers();
                match &mut c.moved {
                    Some(m) if m.seen == seen => {
                        (now.saturating_duration_since(m.at) >= AUTO_IDLE).then(|| k.clone())
                    }
                    m => {
                        *m = Some(Movement { seen, at: now });
                        None
                    }
                }
            })
            .collect();
        self.forget_channels(&traffic);
        self.auto.reaped += traffic.len() as u64;
        traffic
    }

    /// Removes channels from the state and tells their partners.
    fn forget_channels(&mut self, keys: &[(String, String)]) {
        if keys.is_empty() {
            return;
        }
        let mut st = self.state();
        st.fcs.retain(|f| !keys.contains(&fc_key(&f.a, &f.b)));
        if let Err(e) = self.write(&st) {
            tracing::warn!("saving state after removing fast channels: {e}");
        }
        for k in keys {
            self.drop_channel(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::RateChange;
    use std::os::fd::OwnedFd;

    /// A registry with pipes `p0..pN`, each with a reader (a connection kept by the test).
    fn pipes(n: usize) -> (tempfile::TempDir, Registry, Vec<u64>, Vec<OwnedFd>) {
        let d = tempfile::tempdir().unwrap();
        let (mut r, _) = Registry::open(d.path(), None).unwrap();
        r.set_auto_channels(true);
        let mut conns = Vec::new();
        for k in 0..n {
            let name = format!("p{k}");
            r.create_pipe(&name, &format!("10.9.0.{}/24", k + 2), None, None)
                .unwrap();
            conns.push(r.connect_local(&name).unwrap());
        }
        let ids = (0..n)
            .map(|k| r.get(&format!("p{k}")).unwrap().id)
            .collect();
        (d, r, ids, conns)
    }

    fn made(o: AutoOutcome) -> bool {
        matches!(o, AutoOutcome::Made(_))
    }

    #[test]
    fn pipes_that_talk_get_one_channel_marked_automatic() {
        let (_d, mut r, id, _c) = pipes(2);
        let AutoOutcome::Made(f) = r.auto_connect(id[0], id[1], &[]) else {
            panic!("no channel")
        };
        assert!(f.auto);
        assert_eq!(r.fc_peers("p0"), ["p1"]);
        assert_eq!(
            r.auto_connect(id[1], id[0], &[]),
            AutoOutcome::Skipped("a channel exists")
        );
        assert_eq!(r.auto_stats(), (1, 1, 1, 0));
        let st: super::super::state::StateFile =
            serde_json::from_slice(&std::fs::read(_d.path().join("state.json")).unwrap()).unwrap();
        assert!(st.fcs[0].auto, "kept as automatic across a restart");
    }

    #[test]
    fn nothing_is_made_when_off_for_one_pipe_unknown_ids_or_a_pipe_nobody_reads() {
        let (_d, mut r, id, mut c) = pipes(3);
        r.set_auto_channels(false);
        assert!(!made(r.auto_connect(id[0], id[1], &[])));
        r.set_auto_channels(true);
        assert!(!made(r.auto_connect(id[0], id[0], &[])));
        assert!(!made(r.auto_connect(id[0], 999, &[])));
        drop(c.remove(2)); // p2's reader is gone
        assert_eq!(
            r.auto_connect(id[0], id[2], &[]),
            AutoOutcome::Skipped("a pipe nobody reads")
        );
        assert!(r.fc_peers("p0").is_empty());
    }

    #[test]
    fn a_rate_limit_or_a_capture_keeps_pipes_on_the_daemons_path() {
        let (_d, mut r, id, _c) = pipes(3);
        assert!(made(r.auto_connect(id[0], id[1], &[])));
        r.connect_fc("p0", "p2", None).unwrap(); // by hand
        let limit = RateChange {
            egress_bps: Some(10_000_000),
            ..Default::default()
        };
        r.set_rate("p0", &limit).unwrap();
        assert_eq!(
            r.fc_peers("p0"),
            ["p2"],
            "the automatic one went, the hand-made stays"
        );
        assert_eq!(
            r.auto_connect(id[1], id[0], &[]),
            AutoOutcome::Skipped("a rate limit")
        );
        assert_eq!(
            r.auto_connect(id[1], id[2], &[id[2]]),
            AutoOutcome::Skipped("a capture runs")
        );
        assert!(made(r.auto_connect(id[1], id[2], &[])));
        assert_eq!(r.drop_auto_channels("p2"), 1);
        assert_eq!(r.fc_peers("p2"), ["p0"]);
    }

    #[test]
    fn one_pipe_takes_part_in_at_most_its_share_of_automatic_channels() {
        let n = AUTO_PER_PIPE + 3;
        let (_d, mut r, id, _c) = pipes(n + 1);
        let mut got = 0;
        for k in 1..=n {
            got += usize::from(made(r.auto_connect(id[k], id[0], &[])));
        }
        assert_eq!(got, AUTO_PER_PIPE);
        assert_eq!(r.fc_peers("p0").len(), AUTO_PER_PIPE);
        // and hand-made channels are the operator's: not counted, not refused
        r.connect_fc("p0", &format!("p{n}"), None).unwrap();
    }

    #[test]
    fn an_idle_automatic_channel_goes_and_a_busy_one_stays() {
        let (_d, mut r, id, _c) = pipes(4);
        assert!(made(r.auto_connect(id[0], id[1], &[])));
        assert!(made(r.auto_connect(id[2], id[3], &[])));
        r.connect_fc("p0", "p3", None).unwrap();
        let t0 = Instant::now();
        assert!(r.reap_auto_channels(t0).is_empty(), "the first look notes");
        // p2 -> p3 moves a frame: its producer index changes
        let key = fc_key("p2", "p3");
        let c = &r.fcs[&key];
        c.region.store_u32(
            c.rings[0].prod_off(),
            1,
            std::sync::atomic::Ordering::Relaxed,
        );
        let gone = r.reap_auto_channels(t0 + AUTO_IDLE);
        assert_eq!(gone, [fc_key("p0", "p1")]);
        assert_eq!(
            r.fc_peers("p0"),
            ["p3"],
            "the hand-made channel is never reaped"
        );
        assert_eq!(r.fc_peers("p2"), ["p3"]);
        assert_eq!(r.auto_stats(), (1, 2, 0, 1));
        let gone = r.reap_auto_channels(t0 + AUTO_IDLE * 2);
        assert_eq!(gone, [key]);
    }
}
