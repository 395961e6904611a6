//! Rows as text: the aligned table `docknet bench` prints (and fences in its Markdown), and
//! the cells of the report's HTML and Markdown tables.

use crate::row::Row;
use crate::verdict::{ratio, Headline};

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

/// The mode, with its peers' idle policy where the row has one (pairs on DockNet).
fn mode_cell(r: &Row) -> String {
    match &r.idle {
        Some(i) => format!("{} {i}", r.mode.name()),
        None => r.mode.name().to_string(),
    }
}

/// Rows as an aligned text table.
pub fn text(rows: &[Row]) -> String {
    let line = |c: [&str; 16]| {
        format!(
            "{:<11} {:<8} {:<6} {:>4} {:>6} {:>5} {:<8} {:>3} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>5} {:>5}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13],
            c[14], c[15]
        )
    };
    let mut out = line([
        "MODE", "CORES", "LOAD", "N", "SIZE", "MTU", "TOOL", "REP", "p50(us)", "p99(us)", "p99.9",
        "rtt/2", "Gbps", "Mmsg/s", "lost", "path",
    ]);
    for r in rows {
        out += &line([
            &mode_cell(r),
            &r.cores,
            r.workload.name(),
            &r.pairs.map_or("-".into(), |n| n.to_string()),
            &r.size.to_string(),
            &r.mtu.map_or("-".into(), |m| m.to_string()),
            r.tool.name(),
            &r.repeat.to_string(),
            &opt(r.p50_us, 2),
            &opt(r.p99_us, 2),
            &opt(r.p999_us, 2),
            &opt(r.half_rtt_p50_us, 2),
            &opt(r.gbps, 2),
            &opt(r.msgs_per_s.or(r.tps).map(|m| m / 1e6), 3),
            &r.lost.to_string(),
            if r.path_ok { "ok" } else { "WRONG" },
        ]);
    }
    out
}

/// Column heads of the report's result tables.
pub const COLUMNS: [&str; 15] = [
    "mode",
    "cores",
    "tool",
    "N",
    "size (B)",
    "MTU",
    "p50 (us)",
    "p99 (us)",
    "p99.9 (us)",
    "mean (us)",
    "Gbps",
    "Mmsg/s",
    "CPU us/op",
    "KiB/pair",
    "ratio to baseline",
];

/// A row's cells under [`COLUMNS`] (`rows`: where its baseline, bridge or host, is looked up).
pub fn cells(rows: &[Row], r: &Row) -> [String; 15] {
    [
        mode_cell(r),
        r.cores.clone(),
        r.tool.name().to_string(),
        r.pairs.map_or("-".into(), |n| n.to_string()),
        r.size.to_string(),
        r.mtu.map_or("-".into(), |m| m.to_string()),
        opt(r.p50_us, 2),
        opt(r.p99_us, 2),
        opt(r.p999_us, 2),
        opt(r.mean_us, 2),
        opt(r.gbps, 2),
        opt(r.msgs_per_s.or(r.tps).map(|m| m / 1e6), 3),
        opt(r.cpu_s_per_op.map(|c| c * 1e6), 2),
        opt(r.mem_kib_per_pair, 0),
        ratio(rows, r).map_or("-".into(), |x| format!("{x:.2}x")),
    ]
}

/// Column heads of the opening summary table, against `baseline`.
pub fn headline_columns(baseline: crate::mode::Mode) -> [String; 5] {
    [
        "mode".into(),
        "64 B rr one-way p50 (best placement)".into(),
        "1 KiB stream".into(),
        "64 KiB stream".into(),
        format!("vs {baseline} (p50; 1 KiB; 64 KiB)"),
    ]
}

/// A headline's cells under [`headline_columns`].
pub fn headline_cells(h: &Headline) -> [String; 5] {
    let x = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.2}x"));
    [
        format!("{} ({})", h.mode, h.mode.describe()),
        h.p50_64
            .as_ref()
            .map_or("-".into(), |(p, c)| format!("{p:.2} us [{c}]")),
        opt(h.gbps_1k, 2) + if h.gbps_1k.is_some() { " Gbps" } else { "" },
        opt(h.gbps_64k, 2) + if h.gbps_64k.is_some() { " Gbps" } else { "" },
        format!(
            "{}; {}; {}",
            x(h.p50_ratio),
            x(h.gbps_1k_ratio),
            x(h.gbps_64k_ratio)
        ),
    ]
}
