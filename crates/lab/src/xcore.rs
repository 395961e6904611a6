//! The machine's cross-core handoff cost: how long one core takes to write 32 KiB that
//! another core has just read, the step every frame through the daemon takes twice (a
//! container writes its tx ring, which the master read last time round; the master writes an
//! rx ring, which a container read last time round).
//!
//! On a virtual machine this cost is not the machine's alone: it depends on where the host
//! has placed the two vCPUs (sharing a cache, or not), and the host moves them. On this
//! project's 2-core VM the probe finds levels that hold for seconds at a time (mostly 3.5-6
//! us per 32 KiB, at times 25-31 us, rarely about 1 us), and the daemon path's 64 KiB
//! ping-pong was slow in every run that followed a reading above 25 us and in one of 16 that
//! followed a reading below 6 (docs/benchmarks.md, "Where the slow regime is"). The lab
//! measures it just before each rr, stream and chain point (`xcore_us` in the row), so a
//! reader can tell such a run from a slower program.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes handed over per round: one 32 KiB segment, what DockLib sends within the host.
pub const BYTES: usize = 32 * 1024;
const WORDS: usize = BYTES / 8;
/// Rounds per sample, and samples (the median is reported).
const ROUNDS: u64 = 300;
const SAMPLES: usize = 5;
/// The probe gives up (and reports nothing) past this, e.g. on a machine too busy to run it.
const LIMIT: Duration = Duration::from_millis(500);
/// A sample counts when both threads were on their cores this share of its time.
const MIN_ON_CPU: f64 = 0.9;

/// Median over five samples (300 rounds each) of the mean time, in microseconds, for a thread
/// on core `a` to write [`BYTES`] that a thread on core `b` read in the round before. A sample
/// in which either thread was off its core for more than a tenth of the time (another thread
/// there, e.g. a daemon's master spinning) measures the scheduler, not the caches: it is left
/// out. `None` when the cores cannot be pinned (fewer than two), fewer than three samples are
/// left, or the probe ran out of time.
pub fn handoff_us(a: usize, b: usize) -> Option<f64> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if a == b || a >= cores || b >= cores {
        return None;
    }
    let buf: Vec<AtomicU64> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
    let (turn, give_up) = (AtomicU64::new(0), AtomicBool::new(false));
    let deadline = Instant::now() + LIMIT;
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        turn.store(0, Ordering::SeqCst);
        let (spent, read) = std::thread::scope(|s| {
            let reader = s.spawn(|| -> Option<f64> {
                docknet_perf::stats::pin(b).ok()?;
                let clock = OnCpu::start();
                let mut sum = 0u64;
                for i in 0..ROUNDS {
                    wait_for(&turn, 2 * i + 1, &give_up, deadline)?;
                    for w in &buf {
                        sum = sum.wrapping_add(w.load(Ordering::Relaxed));
                    }
                    turn.store(2 * i + 2, Ordering::Release);
                }
                std::hint::black_box(sum);
                Some(clock.share())
            });
            let writer = s.spawn(|| -> Option<(Duration, f64)> {
                docknet_perf::stats::pin(a).ok()?;
                let clock = OnCpu::start();
                let mut spent = Duration::ZERO;
                for i in 0..ROUNDS {
                    wait_for(&turn, 2 * i, &give_up, deadline)?;
                    let t = Instant::now();
                    for (k, w) in buf.iter().enumerate() {
                        w.store(i ^ k as u64, Ordering::Relaxed);
                    }
                    spent += t.elapsed();
                    turn.store(2 * i + 1, Ordering::Release);
                    if Instant::now() > deadline {
                        give_up.store(true, Ordering::Relaxed);
                        return None;
                    }
                }
                Some((spent, clock.share()))
            });
            let spent = writer.join().ok().flatten();
            if spent.is_none() {
                give_up.store(true, Ordering::Relaxed);
            }
            (spent, reader.join().ok().flatten())
        });
        match (spent, read) {
            (Some((s, w)), Some(r)) => {
                if w >= MIN_ON_CPU && r >= MIN_ON_CPU {
                    samples.push(s.as_secs_f64() * 1e6 / ROUNDS as f64);
                }
            }
            _ => return None,
        }
    }
    if samples.len() < 3 {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied()
}

/// A thread's time on its core against the time passed, from when it was started.
struct OnCpu {
    wall: Instant,
    cpu: Duration,
}

impl OnCpu {
    fn start() -> OnCpu {
        OnCpu {
            wall: Instant::now(),
            cpu: thread_cpu(),
        }
    }

    /// The share of the time since `start` that the thread was on a core (0 when unknown).
    fn share(&self) -> f64 {
        let wall = self.wall.elapsed().as_secs_f64();
        let cpu = thread_cpu().saturating_sub(self.cpu).as_secs_f64();
        if wall > 0.0 {
            cpu / wall
        } else {
            0.0
        }
    }
}

/// The calling thread's CPU time (zero if the clock cannot be read).
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

/// A reading as the progress line shows it after a point's figure (empty: none).
pub fn label(us: Option<f64>) -> String {
    us.map_or(String::new(), |x| format!(" (cross-core 32 KiB {x:.2} us)"))
}

/// Spins until `turn` reaches `want`; `None` if the other side gave up first or the probe ran
/// out of time (the other side may never have started: a core it could not be pinned to).
fn wait_for(turn: &AtomicU64, want: u64, give_up: &AtomicBool, deadline: Instant) -> Option<()> {
    let mut spins = 0u32;
    while turn.load(Ordering::Acquire) != want {
        if give_up.load(Ordering::Relaxed) {
            return None;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) && Instant::now() > deadline {
            give_up.store(true, Ordering::Relaxed);
            return None;
        }
        std::hint::spin_loop();
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that spin: the probe spins on both cores of a two-core machine, so
    /// beside the spinner of `time_off_the_core_is_seen` (libtest runs two tests at once there)
    /// three spinners shared two cores, and both tests failed together.
    static SPINNERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn spinning_alone() -> std::sync::MutexGuard<'static, ()> {
        SPINNERS.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn a_side_that_never_comes_ends_the_wait_at_the_deadline() {
        let (turn, give_up) = (AtomicU64::new(0), AtomicBool::new(false));
        let t = Instant::now();
        let deadline = t + Duration::from_millis(30);
        assert_eq!(wait_for(&turn, 1, &give_up, deadline), None);
        assert!(t.elapsed() >= Duration::from_millis(30) && t.elapsed() < Duration::from_secs(5));
        assert!(give_up.load(Ordering::Relaxed), "the other side is told");
        let (turn, give_up) = (AtomicU64::new(1), AtomicBool::new(false));
        assert_eq!(wait_for(&turn, 1, &give_up, deadline), Some(()));
    }

    #[test]
    fn time_off_the_core_is_seen() {
        let _alone = spinning_alone();
        let c = OnCpu::start();
        std::thread::sleep(Duration::from_millis(20));
        assert!(c.share() < 0.5, "asleep: {}", c.share());
        let c = OnCpu::start();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        // a spinner on a busy machine may share its core, but not give most of it away
        assert!(c.share() > 0.3, "spinning: {}", c.share());
    }

    #[test]
    fn the_probe_measures_two_distinct_cores_only() {
        let _alone = spinning_alone();
        assert_eq!(handoff_us(0, 0), None);
        assert_eq!(handoff_us(0, usize::MAX), None);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores >= 2 {
            // a busy machine can make one try run out of time; three in a row would not
            let us = (0..3)
                .find_map(|_| handoff_us(0, 1))
                .expect("two cores: a figure");
            // 32 KiB written takes at least a few ns per line and well under the limit
            assert!(us > 0.01 && us < 500_000.0 / ROUNDS as f64, "{us}");
        }
    }
}
