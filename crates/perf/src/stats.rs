//! Measurement helpers shared by every benchmark: the clock, histograms, CPU time.

use hdrhistogram::Histogram;
use serde::Serialize;

/// CLOCK_MONOTONIC in nanoseconds. All namespaces on one machine share this clock, so a
/// timestamp written by one container can be compared with one read by another.
pub fn now_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// A latency histogram in nanoseconds (1 ns .. 100 s, 3 significant digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static bounds are valid")
}

/// Percentiles of a histogram, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Summary {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest sample.
    pub max: u64,
}

impl Summary {
    /// Summarises `h`.
    pub fn of(h: &Histogram<u64>) -> Summary {
        Summary {
            count: h.len(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// The recorded buckets of `h` as `[value, count]` pairs (value: the highest value equivalent
/// to the bucket, as HdrHistogram reports it). A few hundred pairs for a typical latency run.
pub fn buckets(h: &Histogram<u64>) -> Vec<[u64; 2]> {
    h.iter_recorded()
        .map(|v| [v.value_iterated_to(), v.count_at_value()])
        .collect()
}

/// Adds `[value, count]` buckets (from [`buckets`], possibly of another run, possibly
/// untrusted JSON) into `h`; values outside the histogram's range are clamped, zero counts
/// skipped. Returns how many buckets were recorded.
pub fn merge_buckets(h: &mut Histogram<u64>, b: &[[u64; 2]]) -> usize {
    let mut n = 0;
    for &[v, c] in b {
        if c == 0 {
            continue;
        }
        h.saturating_record_n(v.max(1), c);
        n += 1;
    }
    n
}

/// User + system CPU seconds of this process so far.
pub fn cpu_seconds() -> f64 {
    rusage_seconds(nix::sys::resource::UsageWho::RUSAGE_SELF)
}

/// User + system CPU seconds of this process's reaped children so far (a tool run through
/// `ip netns exec` and `taskset` is one process: both exec).
pub fn children_cpu_seconds() -> f64 {
    rusage_seconds(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
}

fn rusage_seconds(who: nix::sys::resource::UsageWho) -> f64 {
    match nix::sys::resource::getrusage(who) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => 0.0,
    }
}

/// A measurement window: warm-up, then the measured period. Call [`Window::tick`] once per
/// operation; it says whether the operation counts, and starts the CPU clock when measuring
/// begins.
#[derive(Debug, Clone)]
pub struct Window {
    warm_end: std::time::Instant,
    end: std::time::Instant,
    cpu0: Option<f64>,
}

impl Window {
    /// A window starting now.
    pub fn new(warmup: std::time::Duration, duration: std::time::Duration) -> Window {
        let warm_end = std::time::Instant::now() + warmup;
        Window {
            warm_end,
            end: warm_end + duration,
            cpu0: None,
        }
    }

    /// `None` once the window is over; else whether this operation is measured.
    pub fn tick(&mut self) -> Option<bool> {
        self.tick_at(std::time::Instant::now())
    }

    /// [`Window::tick`] with a time the caller has already read.
    pub fn tick_at(&mut self, now: std::time::Instant) -> Option<bool> {
        if now >= self.end {
            return None;
        }
        let measuring = now >= self.warm_end;
        if measuring && self.cpu0.is_none() {
            self.cpu0 = Some(cpu_seconds());
        }
        Some(measuring)
    }

    /// CPU seconds used since measuring began.
    pub fn cpu(&self) -> f64 {
        cpu_seconds() - self.cpu0.unwrap_or_else(cpu_seconds)
    }
}

/// Pins the calling thread to `core`.
pub fn pin(core: usize) -> anyhow::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(core)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_clock() {
        let mut h = histogram();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let s = Summary::of(&h);
        assert_eq!(s.count, 1000);
        assert!((499_000..=501_000).contains(&s.p50), "{}", s.p50);
        assert!(s.p99 >= 989_000 && s.p99 <= 991_000);
        assert!(s.max >= 999_000);
        // merging the buckets of two runs gives the histogram of both
        let mut m = histogram();
        assert_eq!(merge_buckets(&mut m, &buckets(&h)), buckets(&h).len());
        merge_buckets(&mut m, &buckets(&h));
        assert_eq!(m.len(), 2000);
        assert_eq!(Summary::of(&m).p50, s.p50);
        merge_buckets(&mut m, &[[0, 5], [u64::MAX, 1], [7, 0]]);
        assert_eq!(m.len(), 2006);
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a);
    }
}
