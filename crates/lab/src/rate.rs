//! The rate-limit experiment's figures, from its rows: pure functions, no I/O.
//!
//! `docknet bench rate` records, per mode, scenario and flow, the receiver's throughput in
//! 100 ms bins ([`Row`]s with `workload: "rate"`, `t_s`, `gbps`, `limit_bps`, `phase`,
//! `cpu_cores`). Here they become [`Phase`]s (one per mode, scenario and phase: mean
//! throughput per flow after a settling time, the worst 1-second window against the limit,
//! CPU per byte) and [`Verdict`]s against the targets.

use crate::mode::Mode;
use crate::row::{Row, Workload};
use crate::verdict::Verdict;
use std::collections::BTreeMap;

/// The length of one bin, seconds.
pub const BIN_S: f64 = 0.1;
/// Bins per accuracy window (1 s).
pub const WINDOW_BINS: usize = 10;
/// Seconds at the start of a phase left out (TCP finding its new rate, a limit being set).
pub const SETTLE_S: f64 = 0.5;
/// The step scenario.
pub const STEPS: &str = "steps";
/// Contention, no limits.
pub const NONE: &str = "none";
/// Contention, the UDP flow limited.
pub const UDP_LIMITED: &str = "udp-limited";
/// Contention, both flows limited.
pub const BOTH_LIMITED: &str = "both-limited";
/// The step phases without a limit: the capacity.
pub const UNLIMITED: [&str; 2] = ["unlimited", "unlimited again"];
/// The step phases with a limit far above the capacity: what the limiter's presence costs
/// (each beside an unlimited one, so drift over the run cancels).
pub const PRESENT: [&str; 2] = ["limit present", "limit present again"];
/// The contention phase while the UDP flow runs.
pub const UDP_ON: &str = "udp";

/// What limits mean for fast channels, as the report states it.
pub const FAST_CHANNELS: &str = "Fast channels bypass the daemon, and so its limits: a pipe's \
    limits hold for everything it sends and receives through the daemon (other pipes, the wire), \
    not for traffic with a channel partner. Partners on a channel are trusted with each \
    other's bandwidth; limit such a pair by not connecting it.";

/// One flow during one phase.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowFigures {
    /// Mean throughput after settling, Gbps (frames with their headers, at the receiver).
    pub gbps: f64,
    /// The limit during the phase, bits/s.
    pub limit_bps: Option<f64>,
    /// The worst whole 1-second window's relative error against the limit (0.01 = 1%).
    pub worst_error: Option<f64>,
    /// Whole 1-second windows measured.
    pub windows: usize,
}

/// One phase of one scenario of one mode.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// The mode.
    pub mode: Mode,
    /// The scenario.
    pub scenario: String,
    /// The phase.
    pub phase: String,
    /// Start, seconds from the scenario's start.
    pub start_s: f64,
    /// The flows, by name (`tcp`, `udp`).
    pub flows: BTreeMap<String, FlowFigures>,
    /// CPU nanoseconds (the experiment's processes) per KiB delivered (all flows), after
    /// settling.
    pub cpu_ns_per_kib: Option<f64>,
    /// CPU seconds after settling.
    pub cpu_s: f64,
    /// KiB delivered after settling.
    pub kib: f64,
}

impl Phase {
    /// A flow's figures.
    pub fn flow(&self, f: &str) -> Option<&FlowFigures> {
        self.flows.get(f)
    }
}

/// The worst relative error of whole windows of `bins` (Gbps) against `limit_bps`.
pub fn worst_window(bins: &[f64], limit_bps: f64) -> (Option<f64>, usize) {
    let windows: Vec<f64> = bins
        .chunks_exact(WINDOW_BINS)
        .map(|w| w.iter().sum::<f64>() / w.len() as f64)
        .collect();
    let worst = windows
        .iter()
        .map(|g| (g * 1e9 - limit_bps).abs() / limit_bps)
        .fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))));
    (worst, windows.len())
}

/// The phases of the rate rows in `rows`, in the order they ran.
pub fn phases(rows: &[Row]) -> Vec<Phase> {
    // (mode, scenario, phase) in order of first appearance
    let mut keys: Vec<(Mode, String, String)> = Vec::new();
    let rate: Vec<&Row> = rows
        .iter()
        .filter(|r| r.workload == Workload::Rate && r.t_s.is_some())
        .collect();
    for r in &rate {
        let k = (
            r.mode,
            r.scenario.clone().unwrap_or_default(),
            r.phase.clone().unwrap_or_default(),
        );
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(mode, scenario, phase)| {
            let of: Vec<&&Row> = rate
                .iter()
                .filter(|r| {
                    r.mode == mode
                        && r.scenario.as_deref() == Some(scenario.as_str())
                        && r.phase.as_deref() == Some(phase.as_str())
                })
                .collect();
            let start_s = of
                .iter()
                .filter_map(|r| r.t_s)
                .fold(f64::INFINITY, f64::min);
            let settled: Vec<&&&Row> = of
                .iter()
                .filter(|r| r.t_s.unwrap_or(0.0) >= start_s + SETTLE_S - 1e-9)
                .collect();
            let mut flows = BTreeMap::new();
            let mut names: Vec<String> = settled.iter().filter_map(|r| r.flow.clone()).collect();
            names.sort();
            names.dedup();
            for f in &names {
                let mut bins: Vec<(f64, f64, Option<f64>)> = settled
                    .iter()
                    .filter(|r| r.flow.as_deref() == Some(f.as_str()))
                    .map(|r| (r.t_s.unwrap_or(0.0), r.gbps.unwrap_or(0.0), r.limit_bps))
                    .collect();
                bins.sort_by(|a, b| a.0.total_cmp(&b.0));
                let g: Vec<f64> = bins.iter().map(|b| b.1).collect();
                let limit = bins.iter().find_map(|b| b.2);
                let binding = !PRESENT.contains(&phase.as_str());
                let (worst, windows) = match limit {
                    Some(l) if l > 0.0 && binding => worst_window(&g, l),
                    _ => (None, g.len() / WINDOW_BINS),
                };
                flows.insert(
                    f.clone(),
                    FlowFigures {
                        gbps: g.iter().sum::<f64>() / g.len().max(1) as f64,
                        limit_bps: limit,
                        worst_error: worst,
                        windows,
                    },
                );
            }
            // CPU per KiB: each bin's busy cores over what every flow delivered in it
            let mut by_t: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
            for r in &settled {
                let e = by_t
                    .entry((r.t_s.unwrap_or(0.0) * 1e3).round() as u64)
                    .or_default();
                e.0 = r.cpu_cores.unwrap_or(e.0);
                e.1 += r.gbps.unwrap_or(0.0);
            }
            let cpu_s: f64 = by_t.values().map(|(c, _)| c * BIN_S).sum();
            let kib: f64 = by_t
                .values()
                .map(|(_, g)| g * 1e9 / 8.0 * BIN_S / 1024.0)
                .sum();
            Phase {
                mode,
                scenario,
                phase,
                start_s,
                flows,
                cpu_ns_per_kib: (kib > 0.0 && cpu_s > 0.0).then(|| cpu_s * 1e9 / kib),
                cpu_s,
                kib,
            }
        })
        .collect()
}

/// The modes of `phases`, in order.
fn modes(phases: &[Phase]) -> Vec<Mode> {
    let mut m: Vec<Mode> = phases.iter().map(|p| p.mode).collect();
    m.sort();
    m.dedup();
    m
}

/// A mode's capacity: the TCP flow's mean over the unlimited step phases, Gbps.
pub fn capacity(phases: &[Phase], mode: Mode) -> Option<f64> {
    let v: Vec<f64> = phases
        .iter()
        .filter(|p| p.mode == mode && p.scenario == STEPS && UNLIMITED.contains(&p.phase.as_str()))
        .filter_map(|p| p.flow("tcp").map(|f| f.gbps))
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// A mode's limited step phases (a limit at most 80% of its capacity).
fn limited_steps(phases: &[Phase], mode: Mode) -> Vec<&Phase> {
    let cap = capacity(phases, mode).unwrap_or(0.0);
    phases
        .iter()
        .filter(|p| p.mode == mode && p.scenario == STEPS && !PRESENT.contains(&p.phase.as_str()))
        .filter(|p| {
            p.flow("tcp")
                .and_then(|f| f.limit_bps)
                .is_some_and(|l| l <= cap * 1e9 * 0.8 + 1.0)
        })
        .collect()
}

/// A mode's worst window error over its limited steps, and the step it happened at.
pub fn accuracy(phases: &[Phase], mode: Mode) -> Option<(f64, String)> {
    limited_steps(phases, mode)
        .into_iter()
        .filter_map(|p| {
            p.flow("tcp")
                .and_then(|f| f.worst_error)
                .map(|e| (e, p.phase.clone()))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// A mode's CPU per KiB over its limited steps from 20% of capacity up (all their CPU over
/// all their bytes; a trickle's figure is the machine's idle cost, not the limiter's).
pub fn limited_cpu(phases: &[Phase], mode: Mode) -> Option<f64> {
    let cap = capacity(phases, mode).unwrap_or(0.0);
    let (cpu, kib) = limited_steps(phases, mode)
        .iter()
        .filter(|p| {
            p.flow("tcp")
                .and_then(|f| f.limit_bps)
                .is_some_and(|l| l >= cap * 1e9 * 0.2 - 1.0)
        })
        .fold((0.0, 0.0), |(c, k), p| (c + p.cpu_s, k + p.kib));
    (kib > 0.0 && cpu > 0.0).then(|| cpu * 1e9 / kib)
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The targets, judged on `phases`.
pub fn targets(phases: &[Phase]) -> Vec<Verdict> {
    let mut out = Vec::new();
    for mode in modes(phases) {
        if let Some((e, at)) = accuracy(phases, mode) {
            out.push(Verdict {
                target: format!(
                    "{mode}: achieved rate within 2% of the limit over 1 s windows (10 Mbit/s \
                     to 80% of capacity)"
                ),
                value: e,
                threshold: 0.02,
                measured: format!("worst window {} off (at {at})", pct(e)),
                met: e <= 0.02,
            });
        }
        let cap = capacity(phases, mode);
        let hog = phases
            .iter()
            .find(|p| p.mode == mode && p.scenario == UDP_LIMITED && p.phase == UDP_ON);
        if let (Some(c), Some(p)) = (cap, hog) {
            if let (Some(t), Some(x)) = (p.flow("tcp"), p.flow("udp").and_then(|u| u.limit_bps)) {
                let want = 0.9 * (c - x / 1e9);
                out.push(Verdict {
                    target: format!(
                        "{mode}: a UDP hog limited to X leaves TCP at least 0.9 x (capacity - X)"
                    ),
                    value: t.gbps,
                    threshold: want,
                    measured: format!(
                        "TCP {:.2} Gbps beside UDP limited to {:.2} Gbps (capacity {c:.2} Gbps, \
                         so at least {want:.2})",
                        t.gbps,
                        x / 1e9
                    ),
                    met: t.gbps >= want,
                });
            }
        }
        let present: Vec<f64> = phases
            .iter()
            .filter(|p| {
                p.mode == mode && p.scenario == STEPS && PRESENT.contains(&p.phase.as_str())
            })
            .filter_map(|p| p.flow("tcp").map(|f| f.gbps))
            .collect();
        if let (Some(c), false) = (cap, present.is_empty()) {
            let p = present.iter().sum::<f64>() / present.len() as f64;
            if mode.is_docknet() && c > 0.0 {
                let loss = 1.0 - p / c;
                out.push(Verdict {
                    target: format!(
                        "{mode}: an unlimited pipe loses < 3% goodput to the limiter's presence"
                    ),
                    value: loss,
                    threshold: 0.03,
                    measured: format!(
                        "{p:.2} Gbps under a limit far above it against {c:.2} Gbps without one \
                         (means of the two phases each; {} lost)",
                        pct(loss)
                    ),
                    met: loss < 0.03,
                });
            }
        }
    }
    // DockNet's limiter against the kernel's TBF in the same run
    let kernel = modes(phases).into_iter().find(|m| m.is_kernel());
    for mode in modes(phases).into_iter().filter(|m| m.is_docknet()) {
        let Some(k) = kernel else { break };
        let (Some((ed, _)), Some((ek, _))) = (accuracy(phases, mode), accuracy(phases, k)) else {
            continue;
        };
        let (cd, ck) = (limited_cpu(phases, mode), limited_cpu(phases, k));
        let cheaper = matches!((cd, ck), (Some(d), Some(k)) if d < k);
        out.push(Verdict {
            target: format!(
                "{mode}'s limiter at least as accurate as {k}'s TBF, at lower CPU per byte"
            ),
            value: ed,
            threshold: ek,
            measured: format!(
                "worst window {} against {}; CPU {} against {} ns per KiB",
                pct(ed),
                pct(ek),
                cd.map_or("-".into(), |c| format!("{c:.0}")),
                ck.map_or("-".into(), |c| format!("{c:.0}"))
            ),
            met: ed <= ek && cheaper,
        });
    }
    out
}

/// The phases as a table: one line per phase.
pub fn table(phases: &[Phase]) -> String {
    let mut s = format!(
        "{:<11} {:<13} {:<16} {:>9} {:>10} {:>9} {:>10} {:>8} {:>11}\n",
        "mode",
        "scenario",
        "phase",
        "TCP Gbps",
        "TCP limit",
        "UDP Gbps",
        "UDP limit",
        "worst 1s",
        "CPU ns/KiB"
    );
    let lim = |f: Option<&FlowFigures>| {
        f.and_then(|f| f.limit_bps)
            .map_or("-".into(), |l| format!("{:.3}", l / 1e9))
    };
    let g = |f: Option<&FlowFigures>| f.map_or("-".into(), |f| format!("{:.3}", f.gbps));
    for p in phases {
        let (t, u) = (p.flow("tcp"), p.flow("udp"));
        let worst = [t, u]
            .into_iter()
            .flatten()
            .filter_map(|f| f.worst_error)
            .fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))));
        s.push_str(&format!(
            "{:<11} {:<13} {:<16} {:>9} {:>10} {:>9} {:>10} {:>8} {:>11}\n",
            p.mode.name(),
            p.scenario,
            p.phase,
            g(t),
            lim(t),
            g(u),
            lim(u),
            worst.map_or("-".into(), pct),
            p.cpu_ns_per_kib.map_or("-".into(), |c| format!("{c:.0}"))
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::Tool;

    fn bin(mode: Mode, sc: &str, ph: &str, flow: &str, t: f64, g: f64, l: Option<f64>) -> Row {
        Row {
            scenario: Some(sc.into()),
            phase: Some(ph.into()),
            flow: Some(flow.into()),
            t_s: Some(t),
            gbps: Some(g),
            limit_bps: l,
            cpu_cores: Some(1.0),
            ..Row::new(mode, Tool::Dnperf, Workload::Rate, 0)
        }
    }

    /// `secs` of bins at `g` Gbps starting at `t0`.
    #[allow(clippy::too_many_arguments)] // a test's table of bins reads best flat
    fn run(
        mode: Mode,
        sc: &str,
        ph: &str,
        flow: &str,
        t0: f64,
        secs: f64,
        g: f64,
        l: Option<f64>,
    ) -> Vec<Row> {
        (0..(secs / BIN_S).round() as usize)
            .map(|i| bin(mode, sc, ph, flow, t0 + i as f64 * BIN_S, g, l))
            .collect()
    }

    #[test]
    fn windows_are_whole_seconds_and_the_worst_counts() {
        let mut bins = vec![1.0; 10];
        bins.extend(vec![1.05; 10]);
        bins.extend(vec![0.5; 5]); // not a whole window
        let (w, n) = worst_window(&bins, 1e9);
        assert_eq!(n, 2);
        assert!((w.unwrap() - 0.05).abs() < 1e-9);
    }

    #[test]
    fn phases_leave_out_the_settling_time_and_judge_the_targets() {
        let d = Mode::Docknet;
        let mut rows = Vec::new();
        rows.extend(run(d, STEPS, "unlimited", "tcp", 0.0, 3.0, 10.0, None));
        rows.extend(run(d, STEPS, PRESENT[0], "tcp", 3.0, 3.0, 9.9, Some(100e9)));
        // a slow start at 8 Gbps inside the settling time is left out
        let mut step = run(d, STEPS, "50%", "tcp", 6.0, 3.0, 5.0, Some(5e9));
        for r in step.iter_mut().take(5) {
            r.gbps = Some(8.0);
        }
        rows.extend(step);
        rows.extend(run(
            d,
            STEPS,
            "unlimited again",
            "tcp",
            9.0,
            3.0,
            10.0,
            None,
        ));
        rows.extend(run(d, UDP_LIMITED, UDP_ON, "tcp", 5.0, 3.0, 6.5, None));
        rows.extend(run(d, UDP_LIMITED, UDP_ON, "udp", 5.0, 3.0, 3.0, Some(3e9)));
        let ph = phases(&rows);
        assert_eq!(ph.len(), 5);
        let step = &ph[2];
        assert_eq!((step.phase.as_str(), step.start_s), ("50%", 6.0));
        let t = step.flow("tcp").unwrap();
        assert_eq!((t.gbps, t.windows), (5.0, 2));
        assert_eq!(t.worst_error, Some(0.0));
        // 1 core busy, 5 Gbps delivered: 1e9 ns / (5e9/8/1024 KiB)
        let c = step.cpu_ns_per_kib.unwrap();
        assert!((c - 1e9 / (5e9 / 8.0 / 1024.0)).abs() < 1e-6, "{c}");
        assert_eq!(capacity(&ph, d), Some(10.0));
        let v = targets(&ph);
        let line = |s: &str| v.iter().find(|x| x.target.contains(s)).unwrap().clone();
        assert!(line("within 2%").met);
        // TCP 6.5 >= 0.9 x (10 - 3) = 6.3
        let hog = line("UDP hog");
        assert!(hog.met && (hog.threshold - 6.3).abs() < 1e-9, "{hog:?}");
        // 1% lost to the limiter's presence
        let p = line("presence");
        assert!(p.met && (p.value - 0.01).abs() < 1e-9);
        // no kernel mode in the run: no comparison line
        assert!(!v.iter().any(|x| x.target.contains("TBF")));
    }

    #[test]
    fn an_inaccurate_limiter_and_a_starved_flow_are_not_met() {
        let (d, b) = (Mode::Docknet, Mode::Bridge);
        let mut rows = Vec::new();
        for m in [d, b] {
            rows.extend(run(m, STEPS, "unlimited", "tcp", 0.0, 2.0, 10.0, None));
        }
        rows.extend(run(d, STEPS, "20%", "tcp", 2.0, 2.5, 2.1, Some(2e9)));
        rows.extend(run(b, STEPS, "20%", "tcp", 2.0, 2.5, 2.02, Some(2e9)));
        rows.extend(run(d, UDP_LIMITED, UDP_ON, "tcp", 5.0, 2.0, 1.0, None));
        rows.extend(run(d, UDP_LIMITED, UDP_ON, "udp", 5.0, 2.0, 3.0, Some(3e9)));
        let v = targets(&phases(&rows));
        let get = |s: &str, m: &str| {
            v.iter()
                .find(|x| x.target.contains(s) && x.target.starts_with(m))
                .unwrap()
                .clone()
        };
        assert!(!get("within 2%", "docknet").met); // 5% off
        assert!(get("within 2%", "bridge").met); // 1% off
        assert!(!get("UDP hog", "docknet").met);
        assert!(!get("TBF", "docknet").met);
        assert!(table(&phases(&rows)).contains("udp-limited"));
    }
}
