//! Rate limits per pipe and direction: the paper's timer-based token bucket (§3.2). A fine
//! timer adds a quantum of tokens every `fine` interval; a coarse timer, every `coarse`
//! interval, cuts whatever exceeds one burst, so a container that was silent cannot hoard
//! credit and then send at line rate. Limits use Kubernetes' bandwidth semantics: rates in
//! bits/s, bursts in bits.
//!
//! Pure and clock-free: every call takes the time (nanoseconds of CLOCK_MONOTONIC), so the
//! tests drive it with a simulated clock. The timers are evaluated lazily: a call works out
//! how many fine ticks and coarse boundaries passed since the last one.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One direction's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    /// Rate in bits per second (> 0).
    pub rate_bps: u64,
    /// Bucket size in bits (after clamping, see [`Limit::new`]).
    pub burst_bits: u64,
}

/// The limits of one pipe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// What the container sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Limit>,
    /// What is delivered to the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Limit>,
}

impl Limits {
    /// No limit in either direction.
    pub fn is_empty(&self) -> bool {
        self.egress.is_none() && self.ingress.is_none()
    }
}

/// Smallest rate accepted (bits/s).
pub const MIN_RATE: u64 = 1_000;
/// Largest rate accepted (bits/s): 1 Tbit/s.
pub const MAX_RATE: u64 = 1_000_000_000_000;
/// The most credit a bucket may hold: one second at its rate (Kubernetes passes 2^32-1 bits
/// when a pod sets a rate without a burst; a bucket that size would let a silent container
/// send half a gigabyte at line rate).
pub const MAX_BURST_SECONDS: u64 = 1;

/// Why a limit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Out of range.
    #[error("rate {0} bit/s is out of range (1 kbit/s to 1 Tbit/s)")]
    Rate(u64),
    /// Not a number with a known unit.
    #[error("{0:?} is not a rate or size: use bits with an optional unit (500mbit, 5gbit, 100kbit, 1000000)")]
    Syntax(String),
}

impl Limit {
    /// A limit of `rate_bps`, burst `burst_bits` (default: one coarse interval at the rate),
    /// clamped to at least two frames of `frame_bytes` (a smaller bucket could never pass a
    /// full frame) and at most [`MAX_BURST_SECONDS`] at the rate.
    pub fn new(
        rate_bps: u64,
        burst_bits: Option<u64>,
        frame_bytes: u32,
        coarse: Duration,
    ) -> Result<Limit, LimitError> {
        if !(MIN_RATE..=MAX_RATE).contains(&rate_bps) {
            return Err(LimitError::Rate(rate_bps));
        }
        let default = (u128::from(rate_bps) * coarse.as_nanos() / 1_000_000_000) as u64;
        let floor = 2 * 8 * u64::from(frame_bytes.max(64));
        let ceiling = rate_bps.saturating_mul(MAX_BURST_SECONDS).max(floor);
        Ok(Limit {
            rate_bps,
            burst_bits: burst_bits.unwrap_or(default).clamp(floor, ceiling),
        })
    }
}

/// Parses a rate or a size in bits: a plain number, or one with a unit `bit`, `kbit`, `mbit`,
/// `gbit`, `tbit` (powers of 1000, as `tc` and Kubernetes write them); `k`, `m`, `g` and `t`
/// alone mean the same.
pub fn parse_bits(s: &str) -> Result<u64, LimitError> {
    let t = s.trim().to_ascii_lowercase();
    let bad = || LimitError::Syntax(s.to_string());
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.trim_end_matches("bit").trim_end_matches("/s") {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        _ => return Err(bad()),
    };
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bits = v * mult;
    if !bits.is_finite() || bits < 0.0 || bits > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok(bits.round() as u64)
}

/// The two timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// Tokens arrive every `fine`.
    pub fine: Duration,
    /// Every `coarse`, credit above one burst is cut.
    pub coarse: Duration,
}

impl Default for Timers {
    fn default() -> Timers {
        Timers {
            fine: Duration::from_micros(100),
            coarse: Duration::from_millis(10),
        }
    }
}

/// How much a flow held at its limit gathers before it moves on (see [`Bucket::wait_for_run`]).
pub const PACE: Duration = Duration::from_millis(1);

/// Nanobits (bits x 10^9): a rate in bits/s times nanoseconds, with no rounding.
type Nanobits = u128;
const NANO: u128 = 1_000_000_000;

/// One direction's bucket.
#[derive(Debug, Clone)]
pub struct Bucket {
    limit: Limit,
    timers: Timers,
    tokens: Nanobits,
    /// Credit owed by a frame larger than the bucket (let through when the bucket was full):
    /// repaid from the next quanta before any credit builds up again.
    debt: Nanobits,
    /// Start of the current fine tick.
    fine_at: u64,
    /// Start of the current coarse interval.
    coarse_at: u64,
    /// Bytes let through.
    pub passed: u64,
    /// Times a frame had to wait for tokens.
    pub waits: u64,
}

impl Bucket {
    /// A full bucket at `now` (ns).
    pub fn new(limit: Limit, timers: Timers, now: u64) -> Bucket {
        Bucket {
            limit,
            timers,
            tokens: u128::from(limit.burst_bits) * NANO,
            debt: 0,
            fine_at: now,
            coarse_at: now,
            passed: 0,
            waits: 0,
        }
    }

    /// The limit in force.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// Changes the limit at once; the credit held is kept, cut to the new burst.
    pub fn set(&mut self, limit: Limit, now: u64) {
        self.advance(now);
        self.limit = limit;
        self.tokens = self.tokens.min(self.cap());
    }

    fn cap(&self) -> Nanobits {
        u128::from(self.limit.burst_bits) * NANO
    }

    /// Runs the timers up to `now`: a quantum per fine tick passed, the cut at every coarse
    /// boundary passed. A clock that goes backwards adds nothing.
    fn advance(&mut self, now: u64) {
        let fine = self.timers.fine.as_nanos().max(1) as u64;
        let coarse = self.timers.coarse.as_nanos().max(1) as u64;
        if now > self.fine_at {
            let ticks = (now - self.fine_at) / fine;
            if ticks > 0 {
                let quantum = u128::from(self.limit.rate_bps) * u128::from(fine);
                // more than the debt, a burst and a coarse interval's worth is cut below anyway
                let most =
                    (self.cap() + self.debt) / quantum.max(1) + u128::from(coarse / fine) + 1;
                let ticks = u128::from(ticks).min(most);
                let mut credit = quantum * ticks;
                let repaid = credit.min(self.debt);
                self.debt -= repaid;
                credit -= repaid;
                self.tokens = self.tokens.saturating_add(credit);
                self.fine_at += ((now - self.fine_at) / fine) * fine;
            }
        }
        if now >= self.coarse_at.saturating_add(coarse) {
            self.tokens = self.tokens.min(self.cap());
            self.coarse_at += ((now - self.coarse_at) / coarse) * coarse;
        }
    }

    /// Lets `bytes` through at `now` if the bucket holds enough; else counts a wait. A frame
    /// larger than the whole bucket (a 64 KiB TCP segment under a small burst) goes when the
    /// bucket is full, and what it lacked is owed: the rate holds over time, and such a frame
    /// never waits forever.
    pub fn take(&mut self, bytes: usize, now: u64) -> bool {
        self.advance(now);
        let need = bytes as u128 * 8 * NANO;
        if self.tokens >= need {
            self.tokens -= need;
            self.passed += bytes as u64;
            true
        } else if need > self.cap() && self.debt == 0 && self.tokens >= self.cap() {
            self.debt = need - self.tokens;
            self.tokens = 0;
            self.passed += bytes as u64;
            true
        } else {
            self.waits += 1;
            false
        }
    }

    /// Nanoseconds from `now` until `bytes` can pass (0: now), assuming nothing else is taken.
    pub fn wait_for(&self, bytes: usize, now: u64) -> u64 {
        let mut b = self.clone();
        b.advance(now);
        // a frame larger than the bucket waits for a full one
        let need = (bytes as u128 * 8 * NANO).min(b.cap());
        if b.tokens >= need && b.debt == 0 {
            return 0;
        }
        let fine = b.timers.fine.as_nanos().max(1);
        let quantum = u128::from(b.limit.rate_bps) * fine;
        let ticks = (need + b.debt - b.tokens.min(need))
            .div_ceil(quantum.max(1))
            .max(1);
        let next_tick = u128::from(b.fine_at) + fine - u128::from(now.max(b.fine_at));
        (next_tick + (ticks - 1) * fine).min(u128::from(u64::MAX)) as u64
    }

    /// Nanoseconds from `now` until a frame of `bytes` can pass together with what follows it:
    /// until [`PACE`] at the rate has built up (at most half the bucket), or the frame's own
    /// tokens if it is larger. A flow held at its limit then moves in runs of a few frames a
    /// [`PACE`] apart rather than one frame every time a frame's tokens are there: the daemon,
    /// the sender and the receiver each wake once per run instead of once per frame (a 32 KiB
    /// segment at 1 Gbit/s is one wake-up every 260 us on each of them). The rate is the same;
    /// only the grain of its delivery is coarser, well within the bucket.
    pub fn wait_for_run(&self, bytes: usize, now: u64) -> u64 {
        let run = u128::from(self.limit.rate_bps) * PACE.as_nanos() / (8 * NANO);
        let half_bucket = self.limit.burst_bits / 8 / 2;
        let run = run.min(u128::from(half_bucket)) as usize;
        self.wait_for(bytes.max(run), now)
    }

    /// Credit held now, in bits.
    pub fn tokens_bits(&self, now: u64) -> u64 {
        let mut b = self.clone();
        b.advance(now);
        (b.tokens / NANO).min(u128::from(u64::MAX)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const T: Timers = Timers {
        fine: Duration::from_micros(100),
        coarse: Duration::from_millis(10),
    };

    fn lim(rate: u64, burst: Option<u64>) -> Limit {
        Limit::new(rate, burst, 1514, T.coarse).unwrap()
    }

    /// Sends `frame`-byte frames as fast as the bucket allows for `secs` of simulated time,
    /// polling every `step` ns; returns the bytes passed.
    fn run(b: &mut Bucket, frame: usize, start: u64, secs: f64, step: u64) -> u64 {
        let before = b.passed;
        let end = start + (secs * 1e9) as u64;
        let mut t = start;
        while t < end {
            while b.take(frame, t) {}
            t += step;
        }
        b.passed - before
    }

    #[test]
    fn a_held_flow_waits_for_a_run_of_tokens_and_keeps_its_rate() {
        // 1 Gbit/s, a 10 ms bucket: a run is 1 ms at the rate (125,000 bytes)
        let l = lim(1_000_000_000, None);
        let mut b = Bucket::new(l, T, 0);
        while b.take(32 * 1024, 0) {}
        // one 32 KiB segment's tokens come within 300 us; a run's within 1.1 ms
        let one = b.wait_for(32 * 1024, 0);
        let run = b.wait_for_run(32 * 1024, 0);
        assert!(one <= 300_000, "{one}");
        assert!((900_000..=1_100_000).contains(&run), "{run}");
        // and a run's tokens let several segments go at once
        let mut n = 0;
        while b.take(32 * 1024, run) {
            n += 1;
        }
        assert!(n >= 3, "{n} segments in a run");
        // a frame larger than a run waits for its own tokens, not for a run on top of them
        let big = 8 * 125_000;
        assert_eq!(b.wait_for_run(big, run), b.wait_for(big, run));
        // a small bucket: a run is at most half of it
        let small = lim(1_000_000_000, Some(200_000));
        let b = Bucket::new(small, T, 0);
        let mut empty = b.clone();
        while empty.take(1514, 0) {}
        // (the whole bucket would be 200 us away)
        assert_eq!(
            empty.wait_for_run(1514, 0),
            100_000,
            "half of 200 kbit is 100 us away"
        );
        // paced in runs, the rate holds over a second as before
        let mut b = Bucket::new(l, T, 0);
        let (mut t, mut passed) = (0u64, 0u64);
        while t < 1_000_000_000 {
            while b.take(32 * 1024, t) {
                passed += 32 * 1024;
            }
            t += b.wait_for_run(32 * 1024, t).max(1);
        }
        let burst = l.burst_bits / 8;
        let want = 125_000_000 + burst;
        let err = (passed as f64 - want as f64).abs() / want as f64;
        assert!(err < 0.01, "{passed} bytes in a second against {want}");
    }

    #[test]
    fn the_rate_holds_over_a_second_at_any_rate() {
        for rate in [10_000_000u64, 100_000_000, 1_000_000_000, 5_000_000_000] {
            let l = lim(rate, None);
            let mut b = Bucket::new(l, T, 0);
            // drain the initial burst, then measure a steady second
            run(&mut b, 1514, 0, 0.1, 10_000);
            let bits = run(&mut b, 1514, 100 * MS, 1.0, 10_000) * 8;
            let err = (bits as f64 - rate as f64).abs() / rate as f64;
            assert!(err < 0.005, "rate {rate}: {bits} bits/s ({err:.4})");
        }
    }

    #[test]
    fn bursts_are_bounded_and_silence_is_not_hoarded() {
        let l = lim(100_000_000, Some(1_000_000));
        assert_eq!(l.burst_bits, 1_000_000);
        let mut b = Bucket::new(l, T, 0);
        // a full bucket lets one burst through at once
        let first = run(&mut b, 1000, 0, 0.000_001, 1);
        assert_eq!(first * 8, 1_000_000);
        // ten silent seconds later: still one burst (plus at most a coarse interval's credit)
        let later = run(&mut b, 1000, 10_000 * MS, 0.000_001, 1) * 8;
        assert!(
            later <= 1_000_000 + 100_000_000 / 100 + 8000,
            "hoarded {later} bits"
        );
        // the default burst is one coarse interval at the rate
        assert_eq!(lim(100_000_000, None).burst_bits, 1_000_000);
    }

    #[test]
    fn a_new_limit_applies_at_once_and_cuts_the_credit() {
        let mut b = Bucket::new(lim(1_000_000_000, None), T, 0);
        run(&mut b, 1514, 0, 0.5, 10_000);
        b.set(lim(100_000_000, None), 500 * MS);
        assert!(b.tokens_bits(500 * MS) <= 1_000_000);
        let bits = run(&mut b, 1514, 500 * MS, 1.0, 10_000) * 8;
        assert!(
            (bits as f64 / 1e8 - 1.0).abs() < 0.02,
            "{bits} bits/s after the change"
        );
    }

    #[test]
    fn frames_larger_than_the_bucket_pass_on_credit_and_the_rate_holds() {
        // 10 Mbit/s, burst 100 kbit: a 64 KiB segment (524 kbit) is five buckets
        let l = lim(10_000_000, Some(100_000));
        let mut b = Bucket::new(l, T, 0);
        assert!(b.take(65_535, 0), "a full bucket lets it through");
        assert!(!b.take(65_535, 0));
        assert!(
            !b.take(100, MS),
            "the debt is repaid before anything else passes"
        );
        let w = MS + b.wait_for(65_535, MS);
        // 424 kbit owed and a full bucket again (100 kbit) at 10 Mbit/s: 52.4 ms after the
        // first (in whole fine ticks)
        assert!((52 * MS..=53 * MS).contains(&w), "waits {w} ns");
        assert!(!b.take(65_535, w - 200_000));
        assert!(b.take(65_535, w));
        // sent back to back for a second: the rate holds
        let mut b = Bucket::new(l, T, 0);
        let bits = run(&mut b, 65_535, 0, 1.0, 100_000) * 8;
        assert!(
            (bits as f64 / 1e7 - 1.0).abs() < 0.07,
            "{bits} bits in a second"
        );
    }

    #[test]
    fn odd_values_and_clocks() {
        // too small and too large rates are refused; bursts are clamped
        assert!(Limit::new(0, None, 1514, T.coarse).is_err());
        assert!(Limit::new(999, None, 1514, T.coarse).is_err());
        assert!(Limit::new(MAX_RATE + 1, None, 1514, T.coarse).is_err());
        // Kubernetes' "no burst" (2^32 - 1 bits) becomes one second at the rate
        assert_eq!(
            lim(10_000_000, Some(u32::MAX.into())).burst_bits,
            10_000_000
        );
        // a burst below two frames could never pass a frame
        assert_eq!(lim(10_000_000, Some(1)).burst_bits, 2 * 8 * 1514);
        // a tiny rate still passes frames, slowly
        let mut b = Bucket::new(lim(MIN_RATE, None), T, 0);
        assert!(b.take(1514, 0));
        assert!(b.take(1514, 0));
        assert!(!b.take(1514, 0));
        let w = b.wait_for(1514, 0);
        assert!(w > 10_000 * MS && w < 13_000 * MS, "{w}");
        assert!(!b.take(1514, w - 200_000));
        assert!(b.take(1514, w));
        // a clock that goes backwards adds nothing; a huge jump adds at most the burst
        let mut b = Bucket::new(lim(1_000_000_000, None), T, 5_000 * MS);
        while b.take(1514, 5_000 * MS) {}
        assert!(!b.take(1514, 1_000 * MS));
        assert!(
            b.tokens_bits(u64::MAX / 2)
                <= lim(1_000_000_000, None).burst_bits + 1_000_000_000 / 100
        );
        // the waits are counted, the bytes passed too
        assert!(b.waits >= 1 && b.passed > 0);
    }

    #[test]
    fn rates_and_sizes_parse_like_tc_and_kubernetes() {
        for (s, v) in [
            ("500mbit", 500_000_000),
            ("5gbit", 5_000_000_000),
            ("100kbit", 100_000),
            ("1000000", 1_000_000),
            ("1.5gbit", 1_500_000_000),
            ("10M", 10_000_000),
            ("2g", 2_000_000_000),
            ("64bit", 64),
            ("1tbit", 1_000_000_000_000),
        ] {
            assert_eq!(parse_bits(s), Ok(v), "{s}");
        }
        for s in [
            "",
            "fast",
            "5 gbit",
            "-1",
            "1.2.3",
            "5gbps",
            "kbit",
            "1e9",
            "9999999999999999999999",
        ] {
            let e = parse_bits(s).unwrap_err().to_string();
            assert!(e.contains("500mbit"), "{s}: {e}");
        }
    }
}
