//! Backends: where they are, whether they may take connections, and which one takes the next.
//!
//! A backend is *available* when its fast channel is there and its health is [`Health::Up`].
//! Health comes from what the balancer sees: a SYN-ACK (for a client's connection or for the
//! balancer's own probe) is a success; a SYN left unanswered past its deadline, a probe
//! unanswered or refused, is a failure. [`Params::fail_after`] failures in a row take an up
//! backend out; a backend that is out is probed again after a backoff that doubles up to
//! [`Params::backoff_max`], and the first answered probe brings it back.

use crate::packet::Addr;
use serde::Serialize;
use std::time::{Duration, Instant};

/// How new connections are spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Each new connection to the next available backend in turn.
    Rr,
    /// To the available backend with the fewest open connections (ties in turn).
    LeastConn,
}

/// Health timing.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// A SYN the backend has not answered by then counts as a failure.
    pub syn_deadline: Duration,
    /// Failures in a row that take an up backend out.
    pub fail_after: u32,
    /// Probe an up backend this often (`None`: only probe backends that are out).
    pub probe_interval: Option<Duration>,
    /// A probe not answered by then is a failure.
    pub probe_timeout: Duration,
    /// First wait before probing a backend that was taken out.
    pub backoff_min: Duration,
    /// Longest wait between probes of a backend that is out.
    pub backoff_max: Duration,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            syn_deadline: Duration::from_secs(1),
            fail_after: 3,
            probe_interval: Some(Duration::from_secs(1)),
            probe_timeout: Duration::from_secs(1),
            backoff_min: Duration::from_millis(250),
            backoff_max: Duration::from_secs(8),
        }
    }
}

/// Health of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Takes new connections.
    Up,
    /// Taken out; probed at `retry_at`, then after twice `backoff`.
    Down {
        /// Next probe.
        retry_at: Instant,
        /// Current wait between probes.
        backoff: Duration,
    },
}

/// A probe in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// Its initial sequence number.
    pub isn: u32,
    /// Deadline.
    pub until: Instant,
}

/// Counters of one backend.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct BackendCounters {
    /// Connections given to it, ever.
    pub total: u64,
    /// Failures seen (unanswered SYNs, failed probes).
    pub failures: u64,
    /// Client SYNs it did not answer in time.
    pub syn_timeouts: u64,
    /// Probes sent.
    pub probes: u64,
    /// Probes unanswered or refused.
    pub probe_failures: u64,
    /// Times it was taken out.
    pub taken_out: u64,
    /// Connections reset towards their clients when it was taken out.
    pub conns_reset: u64,
    /// Frames to it dropped because its fast channel was full.
    pub ring_full: u64,
}

/// One backend.
#[derive(Debug, Clone)]
pub struct Backend {
    /// Address and port.
    pub addr: Addr,
    /// Its MAC, while its fast channel is there.
    pub mac: Option<[u8; 6]>,
    /// Health.
    pub health: Health,
    /// Failures in a row.
    pub streak: u32,
    /// Open connections pinned to it.
    pub active: u32,
    /// The probe in flight.
    pub probe: Option<Probe>,
    /// When to probe next while up.
    pub next_probe: Instant,
    /// Counters.
    pub counters: BackendCounters,
}

/// What a health event did to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing visible.
    None,
    /// It was taken out: its connections must be reset.
    TakenOut,
    /// It came back.
    Back,
}

impl Backend {
    /// A backend at `addr`, up if its channel is there (`mac`).
    pub fn new(addr: Addr, mac: Option<[u8; 6]>, now: Instant) -> Backend {
        Backend {
            addr,
            mac,
            health: Health::Up,
            streak: 0,
            active: 0,
            probe: None,
            next_probe: now,
            counters: BackendCounters::default(),
        }
    }

    /// Whether it may take connections and frames.
    pub fn available(&self) -> bool {
        self.mac.is_some() && self.health == Health::Up
    }

    /// State as the stats show it.
    pub fn state(&self) -> &'static str {
        match (self.mac, self.health) {
            (None, _) => "no-channel",
            (Some(_), Health::Up) => "up",
            (Some(_), Health::Down { .. }) => "down",
        }
    }

    /// It answered a SYN.
    pub fn success(&mut self, now: Instant, p: &Params) -> Change {
        self.streak = 0;
        match self.health {
            Health::Up => Change::None,
            Health::Down { .. } => {
                self.health = Health::Up;
                self.next_probe = now + p.probe_interval.unwrap_or(Duration::ZERO);
                Change::Back
            }
        }
    }

    /// It failed to answer.
    pub fn failure(&mut self, now: Instant, p: &Params) -> Change {
        self.streak = self.streak.saturating_add(1);
        self.counters.failures += 1;
        match self.health {
            Health::Up if self.streak >= p.fail_after.max(1) => {
                self.take_out(now, p.backoff_min);
                Change::TakenOut
            }
            Health::Up => Change::None,
            Health::Down { backoff, .. } => {
                let backoff = (backoff * 2).min(p.backoff_max);
                self.health = Health::Down {
                    retry_at: now + backoff,
                    backoff,
                };
                Change::None
            }
        }
    }

    /// Takes it out now, to be probed after `backoff`.
    pub fn take_out(&mut self, now: Instant, backoff: Duration) {
        self.health = Health::Down {
            retry_at: now + backoff,
            backoff,
        };
        self.probe = None;
        self.counters.taken_out += 1;
    }

    /// Whether a probe should be sent now.
    pub fn probe_due(&self, now: Instant, p: &Params) -> bool {
        if self.mac.is_none() || self.probe.is_some() {
            return false;
        }
        match self.health {
            Health::Up => p.probe_interval.is_some() && now >= self.next_probe,
            Health::Down { retry_at, .. } => now >= retry_at,
        }
    }
}

/// Picks a backend among `candidates` (indices into `all`) that is available: `cursor` is the
/// round-robin position, advanced past the pick. `None` when none is available.
pub fn pick(
    all: &[Backend],
    candidates: &[u16],
    policy: Policy,
    cursor: &mut usize,
) -> Option<u16> {
    let n = candidates.len();
    if n == 0 {
        return None;
    }
    let start = *cursor % n;
    let mut best: Option<(usize, u32)> = None;
    for k in 0..n {
        let i = (start + k) % n;
        let b = &all[usize::from(candidates[i])];
        if !b.available() {
            continue;
        }
        match policy {
            Policy::Rr => {
                best = Some((i, 0));
                break;
            }
            Policy::LeastConn => {
                if best.is_none() || best.is_some_and(|(_, a)| b.active < a) {
                    best = Some((i, b.active));
                }
            }
        }
    }
    let (i, _) = best?;
    *cursor = i + 1;
    Some(candidates[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backends(n: usize, now: Instant) -> Vec<Backend> {
        (0..n)
            .map(|i| {
                Backend::new(
                    Addr::new([10, 0, 0, 10 + i as u8].into(), 80),
                    Some([1; 6]),
                    now,
                )
            })
            .collect()
    }

    #[test]
    fn round_robin_skips_what_is_out() {
        let now = Instant::now();
        let mut b = backends(3, now);
        let c = [0, 1, 2];
        let mut cur = 0;
        let picks: Vec<_> = (0..6)
            .map(|_| pick(&b, &c, Policy::Rr, &mut cur).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        b[1].take_out(now, Duration::from_secs(1));
        b[2].mac = None;
        let picks: Vec<_> = (0..3)
            .map(|_| pick(&b, &c, Policy::Rr, &mut cur).unwrap())
            .collect();
        assert_eq!(picks, [0, 0, 0]);
        b[0].take_out(now, Duration::from_secs(1));
        assert_eq!(pick(&b, &c, Policy::Rr, &mut cur), None);
        assert_eq!(pick(&b, &[], Policy::Rr, &mut cur), None);
    }

    #[test]
    fn least_connections_takes_the_emptiest_and_rotates_ties() {
        let now = Instant::now();
        let mut b = backends(3, now);
        b[0].active = 5;
        b[1].active = 2;
        b[2].active = 2;
        let c = [0, 1, 2];
        let mut cur = 0;
        assert_eq!(pick(&b, &c, Policy::LeastConn, &mut cur), Some(1));
        assert_eq!(
            pick(&b, &c, Policy::LeastConn, &mut cur),
            Some(2),
            "tie: in turn"
        );
        b[2].active = 0;
        assert_eq!(pick(&b, &c, Policy::LeastConn, &mut cur), Some(2));
    }

    #[test]
    fn failures_take_out_and_backoff_doubles_until_a_success() {
        let now = Instant::now();
        let p = Params::default();
        let mut b = backends(1, now).remove(0);
        assert_eq!(b.failure(now, &p), Change::None);
        assert_eq!(
            b.success(now, &p),
            Change::None,
            "a success ends the streak"
        );
        assert_eq!(b.failure(now, &p), Change::None);
        assert_eq!(b.failure(now, &p), Change::None);
        assert_eq!(b.failure(now, &p), Change::TakenOut);
        assert!(!b.available());
        assert_eq!(b.state(), "down");
        assert!(!b.probe_due(now, &p));
        assert!(b.probe_due(now + p.backoff_min, &p));
        b.failure(now, &p);
        assert_eq!(
            b.health,
            Health::Down {
                retry_at: now + p.backoff_min * 2,
                backoff: p.backoff_min * 2
            }
        );
        for _ in 0..20 {
            b.failure(now, &p);
        }
        assert!(matches!(b.health, Health::Down { backoff, .. } if backoff == p.backoff_max));
        assert_eq!(b.success(now, &p), Change::Back);
        assert!(b.available());
        assert_eq!(b.counters.taken_out, 1);
    }
}
