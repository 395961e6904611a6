//! From runs to points: one summary row per point over its repeats.

use crate::row::Row;
use docknet_perf::stats::{buckets, histogram, merge_buckets, Summary};

/// What makes two rows runs of the same point.
fn same_point(a: &Row, b: &Row) -> bool {
    (
        a.mode, &a.cores, a.workload, a.size, a.mtu, a.tool, a.pairs, &a.idle,
    ) == (
        b.mode, &b.cores, b.workload, b.size, b.mtu, b.tool, b.pairs, &b.idle,
    ) && (&a.server, a.connections, a.backends) == (&b.server, b.connections, b.backends)
        && a.scenario == b.scenario
}

/// The median of the values present (the upper median for an even count), if any.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

/// One row per (mode, cores, workload, size, MTU, tool, pairs, peers' idle policy) over its repeats, in the order
/// points first appear. Where every run carries a latency histogram, p50/p99/p99.9 and the mean
/// come from the merged histogram (never from averaged percentiles) and the merged buckets are
/// kept for the CDF; errors are the sum over the runs; every other figure is the median over
/// the runs.
pub fn summarize(rows: &[Row]) -> Vec<Row> {
    let mut firsts: Vec<&Row> = Vec::new();
    for r in rows {
        if !firsts.iter().any(|f| same_point(f, r)) {
            firsts.push(r);
        }
    }
    firsts
        .into_iter()
        .map(|first| {
            let g: Vec<&Row> = rows.iter().filter(|r| same_point(first, r)).collect();
            let med = |f: fn(&Row) -> Option<f64>| median(g.iter().filter_map(|r| f(r)).collect());
            let mut lost: Vec<u64> = g.iter().map(|r| r.lost).collect();
            lost.sort_unstable();
            let mut row = Row {
                repeat: g.len(),
                p50_us: med(|r| r.p50_us),
                p99_us: med(|r| r.p99_us),
                p999_us: med(|r| r.p999_us),
                mean_us: med(|r| r.mean_us),
                half_rtt_p50_us: med(|r| r.half_rtt_p50_us),
                tps: med(|r| r.tps),
                gbps: med(|r| r.gbps),
                msgs_per_s: med(|r| r.msgs_per_s),
                cpu_s_per_op: med(|r| r.cpu_s_per_op),
                cpu_cores: med(|r| r.cpu_cores),
                req_per_s: med(|r| r.req_per_s),
                transfer_bps: med(|r| r.transfer_bps),
                // every run's errors count: one bad run must not vanish in a median
                errors: g
                    .iter()
                    .map(|r| r.errors)
                    .reduce(|a, b| match (a, b) {
                        (Some(a), Some(b)) => Some(a + b),
                        (a, b) => a.or(b),
                    })
                    .flatten(),
                mem_kib_per_pair: med(|r| r.mem_kib_per_pair),
                pair_fairness: med(|r| r.pair_fairness),
                slowest_pair: med(|r| r.slowest_pair),
                lost: lost[lost.len() / 2],
                path_ok: g.iter().all(|r| r.path_ok),
                one_way_hist: None,
                ..first.clone()
            };
            if g.iter().all(|r| r.one_way_hist.is_some()) {
                let mut h = histogram();
                for r in &g {
                    merge_buckets(&mut h, r.one_way_hist.as_deref().unwrap_or(&[]));
                }
                if !h.is_empty() {
                    let s = Summary::of(&h);
                    row.p50_us = Some(s.p50 as f64 / 1e3);
                    row.p99_us = Some(s.p99 as f64 / 1e3);
                    row.p999_us = Some(s.p999 as f64 / 1e3);
                    row.mean_us = Some(s.mean / 1e3);
                    row.one_way_hist = Some(buckets(&h));
                }
            }
            row
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mode::Mode;
    use crate::row::{Tool, Workload};

    fn run(mode: Mode, cores: &str, gbps: f64, hist: Option<Vec<[u64; 2]>>) -> Row {
        Row {
            cores: cores.into(),
            gbps: Some(gbps),
            p50_us: Some(99.0),
            one_way_hist: hist,
            ..Row::new(mode, Tool::Dnperf, Workload::Rr, 64)
        }
    }

    #[test]
    fn points_are_grouped_medians_taken_and_histograms_merged() {
        let h1 = vec![[1000, 10]];
        let h2 = vec![[3000, 10]];
        let rows = vec![
            run(Mode::Bridge, "c1 s1", 1.0, Some(h1.clone())),
            run(Mode::Bridge, "c0 s1", 5.0, None),
            run(Mode::Bridge, "c1 s1", 3.0, Some(h2)),
            run(Mode::Bridge, "c1 s1", 2.0, Some(h1)),
            run(Mode::Bridge, "c0 s1", 7.0, None),
        ];
        let s = summarize(&rows);
        assert_eq!(s.len(), 2, "two placements");
        assert_eq!((s[0].cores.as_str(), s[0].repeat), ("c1 s1", 3));
        assert_eq!(s[0].gbps, Some(2.0), "median of 1, 3, 2");
        // 20 samples at ~1 us and 10 at ~3 us: p50 from the merge, not the runs' 99 us
        assert!(
            (s[0].p50_us.unwrap() - 1.0).abs() < 0.01,
            "{:?}",
            s[0].p50_us
        );
        assert!((s[0].p99_us.unwrap() - 3.0).abs() < 0.01);
        let n: u64 = s[0]
            .one_way_hist
            .as_ref()
            .unwrap()
            .iter()
            .map(|b| b[1])
            .sum();
        assert_eq!(n, 30);
        // without histograms, the percentiles are medians of the runs
        assert_eq!(
            (s[1].gbps, s[1].p50_us, s[1].repeat),
            (Some(7.0), Some(99.0), 2)
        );
        assert!(s[1].one_way_hist.is_none());
    }

    #[test]
    fn chain_runs_keep_their_transfer_rate_and_every_error() {
        let chain = |bps: f64, errors: Option<u64>| Row {
            transfer_bps: Some(bps),
            errors,
            ..Row::new(Mode::Docknet, Tool::DocknetLoad, Workload::Chain, 500_000)
        };
        let s = summarize(&[
            chain(3e9, Some(0)),
            chain(1e9, Some(2)),
            chain(2e9, None),
            chain(9e9, Some(1)),
        ]);
        assert_eq!(s.len(), 1);
        // the upper median of 1, 2, 3, 9
        assert_eq!((s[0].transfer_bps, s[0].repeat), (Some(3e9), 4));
        assert_eq!(
            s[0].errors,
            Some(3),
            "the sum, not a median that hides a bad run"
        );
        let none = summarize(&[chain(1e9, None), chain(2e9, None)]);
        assert_eq!(none[0].errors, None);
    }
}
