//! The machine's CPU time by kind, from `/proc/stat`'s first line: what every process and the
//! kernel's softirq work together cost over a window. Tick-sampled (USER_HZ), so meaningful over
//! windows of many ticks with busy cores; [`crate::proc::CpuMeter`] is exact for chosen
//! processes.

/// Jiffies of all cores together, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// User time (with nice).
    pub user: u64,
    /// System time.
    pub system: u64,
    /// Hard and soft interrupts.
    pub irq: u64,
    /// Softirq alone (network receive work lands here).
    pub softirq: u64,
    /// Idle and I/O wait.
    pub idle: u64,
    /// Stolen by the hypervisor.
    pub steal: u64,
}

impl CpuTimes {
    /// Parses the `cpu ` line of `/proc/stat` (`None`: no such line or too few fields).
    pub fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if v.len() < 8 {
            return None;
        }
        Some(CpuTimes {
            user: v[0] + v[1],
            system: v[2],
            idle: v[3] + v[4],
            irq: v[5] + v[6],
            softirq: v[6],
            steal: v[7],
        })
    }

    /// Reads `/proc/stat` now.
    pub fn now() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Busy jiffies: everything but idle and steal.
    pub fn busy(&self) -> u64 {
        self.user + self.system + self.irq
    }

    /// What passed from `before` to `self` (zero where a counter went back).
    pub fn since(&self, before: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_sub(before.user),
            system: self.system.saturating_sub(before.system),
            irq: self.irq.saturating_sub(before.irq),
            softirq: self.softirq.saturating_sub(before.softirq),
            idle: self.idle.saturating_sub(before.idle),
            steal: self.steal.saturating_sub(before.steal),
        }
    }

    /// Jiffies to seconds.
    pub fn seconds(jiffies: u64) -> f64 {
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|h| *h > 0)
            .unwrap_or(100);
        jiffies as f64 / hz as f64
    }
}

/// CPU seconds per `units` of work, by kind (`user`, `system`, `irq`, `softirq`) and in all
/// (`total`): a service demand (`None` without work).
pub fn demand(d: &CpuTimes, units: f64) -> Option<std::collections::BTreeMap<String, f64>> {
    if !(units.is_finite() && units > 0.0) {
        return None;
    }
    let per = |j: u64| CpuTimes::seconds(j) / units;
    Some(
        [
            ("user", per(d.user)),
            ("system", per(d.system)),
            ("irq", per(d.irq - d.softirq.min(d.irq))),
            ("softirq", per(d.softirq)),
            ("total", per(d.busy())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_cpu_line_and_takes_differences() {
        let a = CpuTimes::parse("cpu  10 1 20 300 4 5 6 7 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
            .expect("parses");
        assert_eq!(
            a,
            CpuTimes {
                user: 11,
                system: 20,
                idle: 304,
                irq: 11,
                softirq: 6,
                steal: 7
            }
        );
        assert_eq!(a.busy(), 42);
        let b = CpuTimes::parse("cpu  20 1 30 400 4 5 16 7 0 0\n").unwrap();
        let d = b.since(&a);
        assert_eq!((d.user, d.system, d.softirq, d.busy()), (10, 10, 10, 30));
        assert_eq!(a.since(&b).busy(), 0, "never negative");
        assert!(CpuTimes::parse("cpu 1 2\n").is_none());
        assert!(CpuTimes::parse("intr 1 2 3\n").is_none());
        assert!(CpuTimes::parse("cpu  a b c d e f g h\n").is_none());
        let per = demand(&d, 2.0).unwrap();
        let hz = CpuTimes::seconds(1);
        assert_eq!(per["total"], 30.0 * hz / 2.0);
        assert_eq!(per["softirq"], 10.0 * hz / 2.0);
        assert_eq!(per["irq"], 0.0);
        assert!(demand(&d, 0.0).is_none());
    }
}
