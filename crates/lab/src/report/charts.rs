//! The report's figures, drawn with plotters as PNG and SVG:
//!
//! - `cdf-rr-SIZE`: the one-way latency CDF per mode, one figure per message size (rr);
//! - `rr-latency-vs-size`: p50 and p99 one-way latency against message size (rr);
//! - `stream-goodput-vs-size`: goodput against message size, the paper's Fig. 8 style;
//! - `pairs-goodput-vs-n`, `pairs-latency-vs-n`, `pairs-tail-vs-n`, `pairs-cpu-vs-n`:
//!   aggregate goodput, per-pair latency (p50/p99, and p99/p99.9) and the machine's CPU per
//!   transaction against N pairs;
//! - `ratio-to-bridge-WORKLOAD`: each mode's ratio to `bridge`;
//! - `rate-MODE-SCENARIO`: the rate experiment's flows over time beside their limits.
//!
//! Which figures exist and what they hold is decided by [`charts`], a pure function of the
//! rows; [`render`] only draws.

use crate::mode::{Topology, LO_MTU};
use crate::row::{Row, Tool, Workload};
use crate::verdict::ratio;
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// The figures' font unless `--font` or `DOCKNET_FONT` says otherwise (fonts-dejavu-core).
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Registers the TrueType font plotters draws text with (once per process).
pub fn register_font(path: &Path) -> Result<()> {
    static DONE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let bytes = std::fs::read(path).map_err(|e| {
            format!(
                "reading the font {} ({e}); install fonts-dejavu-core or pass --font",
                path.display()
            )
        })?;
        // plotters keeps fonts for the life of the process
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a TrueType font", path.display()))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// One line on a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points (x, y) in data units.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (the p99 of a p50/p99 pair).
    pub dashed: bool,
    /// Colour index (a p50/p99 pair shares one).
    pub color: usize,
}

/// One figure.
#[derive(Debug, Clone)]
pub struct Chart {
    /// File name without extension.
    pub file: String,
    /// Title.
    pub title: String,
    /// X axis label.
    pub x: &'static str,
    /// Y axis label.
    pub y: &'static str,
    /// Logarithmic x.
    pub logx: bool,
    /// Logarithmic y.
    pub logy: bool,
    /// The lines.
    pub series: Vec<Series>,
}

fn tf(v: f64, log: bool) -> f64 {
    if log {
        v.max(1e-9).log10()
    } else {
        v
    }
}

fn label(v: f64, log: bool) -> String {
    let x = if log { 10f64.powf(v) } else { v };
    if x >= 1e6 {
        format!("{:.0}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.0}k", x / 1e3)
    } else if x >= 10.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// Tableau's 20 colours: pairs of a strong and a light shade of one hue, so a mode's two
/// placements share a hue.
const TAB20: [(u8, u8, u8); 20] = [
    (31, 119, 180),
    (174, 199, 232),
    (255, 127, 14),
    (255, 187, 120),
    (44, 160, 44),
    (152, 223, 138),
    (214, 39, 40),
    (255, 152, 150),
    (148, 103, 189),
    (197, 176, 213),
    (140, 86, 75),
    (196, 156, 148),
    (227, 119, 194),
    (247, 182, 210),
    (127, 127, 127),
    (199, 199, 199),
    (188, 189, 34),
    (219, 219, 141),
    (23, 190, 207),
    (158, 218, 229),
];

fn rgb(i: usize) -> RGBColor {
    let (r, g, b) = TAB20[i % TAB20.len()];
    RGBColor(r, g, b)
}

/// The axis range of values `lo..hi` (transformed): whole decades on a log axis, else padded.
fn axis(lo: f64, hi: f64, log: bool, from_zero: bool) -> (f64, f64, usize) {
    if log {
        let (a, b) = (lo.floor(), hi.ceil().max(lo.floor() + 1.0));
        (a, b, (b - a) as usize + 1)
    } else {
        let pad = if (hi - lo).abs() < 1e-9 {
            0.5
        } else {
            (hi - lo) * 0.05
        };
        let a = if from_zero {
            (lo - pad).min(0.0)
        } else {
            lo - pad
        };
        (a, hi + pad, 10)
    }
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Chart) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing {}: {e:?}", c.file);
    root.fill(&WHITE).map_err(err)?;
    let (w, _) = root.dim_in_pixel();
    let (plot, legend) = root.split_horizontally(w * 3 / 4);
    let data: Vec<Vec<(f64, f64)>> = c
        .series
        .iter()
        .map(|s| {
            s.points
                .iter()
                .map(|&(x, y)| (tf(x, c.logx), tf(y, c.logy)))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect()
        })
        .collect();
    let all = data.iter().flatten();
    let (mut x0, mut x1, mut y0, mut y1) = all.fold(
        (f64::MAX, f64::MIN, f64::MAX, f64::MIN),
        |(a, b, c, d), &(x, y)| (a.min(x), b.max(x), c.min(y), d.max(y)),
    );
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let (xa, xb, nx) = axis(x0, x1, c.logx, false);
    let (ya, yb, ny) = axis(y0, y1, c.logy, true);
    let mut chart = ChartBuilder::on(&plot)
        .caption(&c.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(xa..xb, ya..yb)
        .map_err(err)?;
    let (lx, ly) = (c.logx, c.logy);
    let fx = move |v: &f64| label(*v, lx);
    let fy = move |v: &f64| label(*v, ly);
    chart
        .configure_mesh()
        .x_desc(c.x)
        .y_desc(c.y)
        .x_labels(nx)
        .y_labels(ny)
        .x_label_formatter(&fx)
        .y_label_formatter(&fy)
        .label_style(("sans-serif", 14))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;
    for (s, d) in c.series.iter().zip(&data) {
        let color = rgb(s.color);
        let style = ShapeStyle::from(&color).stroke_width(2);
        if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(d.clone(), 6, 4, style))
                .map_err(err)?;
        } else {
            chart
                .draw_series(LineSeries::new(d.clone(), style))
                .map_err(err)?;
        }
        if d.len() <= 12 {
            chart
                .draw_series(d.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err)?;
        }
    }
    // the legend, beside the plot: one entry per colour (a dashed twin shares its entry)
    let mut y = 40;
    let mut seen = Vec::new();
    for s in &c.series {
        if seen.contains(&&s.name) {
            continue;
        }
        seen.push(&s.name);
        let style = ShapeStyle::from(&rgb(s.color)).stroke_width(3);
        legend
            .draw(&PathElement::new(vec![(4, y), (30, y)], style))
            .map_err(err)?;
        legend
            .draw(&Text::new(
                s.name.clone(),
                (36, y - 7),
                ("sans-serif", 13).into_font(),
            ))
            .map_err(err)?;
        y += 20;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Draws `c` as `figures/FILE.svg` and `figures/FILE.png` under `out`.
pub fn render(out: &Path, c: &Chart) -> Result<()> {
    let dir = out.join("figures");
    std::fs::create_dir_all(&dir)?;
    let size = (1200, 600);
    let svg = dir.join(format!("{}.svg", c.file));
    draw(SVGBackend::new(&svg, size).into_drawing_area(), c)?;
    let png = dir.join(format!("{}.png", c.file));
    draw(BitMapBackend::new(&png, size).into_drawing_area(), c)?;
    Ok(())
}

/// The link MTUs of `rows` (not `lo`'s), each once, ascending.
pub fn link_mtus(rows: &[Row]) -> Vec<u32> {
    let mut mtus: Vec<u32> = rows
        .iter()
        .filter_map(|r| r.mtu)
        .filter(|m| *m != LO_MTU)
        .collect();
    mtus.sort_unstable();
    mtus.dedup();
    mtus
}

/// The rows of one link MTU, with the `lo` modes (and rows without an MTU) in every set.
pub fn at_mtu(rows: &[Row], m: u32) -> Vec<Row> {
    rows.iter()
        .filter(|r| r.mtu.is_none_or(|x| x == m || x == LO_MTU))
        .cloned()
        .collect()
}

/// The charts: dnperf rows only (the cross-check tools are in the tables), one set per MTU
/// when the run has several (the `lo` modes are in every set).
pub fn charts(rows: &[Row]) -> Vec<Chart> {
    let rows: Vec<Row> = rows
        .iter()
        .filter(|r| r.tool == Tool::Dnperf)
        .cloned()
        .collect();
    let mtus = link_mtus(&rows);
    if mtus.len() <= 1 {
        return charts_for(&rows);
    }
    let mut out = Vec::new();
    for m in mtus {
        for c in charts_for(&at_mtu(&rows, m)) {
            out.push(Chart {
                file: format!("{}-mtu{m}", c.file),
                title: format!("{} (MTU {m})", c.title),
                ..c
            });
        }
    }
    out
}

/// Colour of a row: a hue per mode, a strong shade for its first placement, a light one for
/// the second.
fn colors(rows: &[Row]) -> impl Fn(&Row) -> usize {
    // a mode's variants: its placements, and its peers' idle policies
    let variant = |r: &Row| {
        format!(
            "{} {} {} {} {} {}",
            r.cores,
            r.idle.as_deref().unwrap_or(""),
            r.server.as_deref().unwrap_or(""),
            r.tool,
            r.launch.as_deref().unwrap_or(""),
            r.topology
        )
    };
    let mut placements: BTreeMap<crate::mode::Mode, Vec<String>> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.cores != "-" || r.idle.is_some() || r.server.is_some() || r.launch.is_some())
    {
        let v = placements.entry(r.mode).or_default();
        if !v.contains(&variant(r)) {
            v.push(variant(r));
        }
    }
    // a mode's first two variants take its hue's strong and light shade; further ones take
    // hues no mode of these rows has
    let hues = TAB20.len() / 2;
    // a mode keeps its hue unless a mode before it in the report's order has it already (19
    // modes, 10 hues): then it takes the first hue no mode of these rows has
    let mut present: Vec<crate::mode::Mode> = rows.iter().map(|r| r.mode).collect();
    present.sort_by_key(|m| m.hue());
    present.dedup();
    let mut hue_of: BTreeMap<crate::mode::Mode, usize> = BTreeMap::new();
    for m in &present {
        let h = m.hue() % hues;
        if !hue_of.values().any(|v| *v == h) {
            hue_of.insert(*m, h);
        }
    }
    for m in &present {
        if !hue_of.contains_key(m) {
            let h = (0..hues)
                .find(|h| !hue_of.values().any(|v| v == h))
                .unwrap_or(m.hue() % hues);
            hue_of.insert(*m, h);
        }
    }
    let used: Vec<usize> = hue_of.values().copied().collect();
    let free: Vec<usize> = (0..hues).filter(|h| !used.contains(h)).collect();
    let mut extra: BTreeMap<(crate::mode::Mode, usize), usize> = BTreeMap::new();
    for (m, v) in &placements {
        for k in 2..v.len() {
            let n = extra.len();
            extra.insert(
                (*m, k),
                free.get(n % free.len().max(1)).copied().unwrap_or(n) * 2,
            );
        }
    }
    move |r: &Row| {
        let shade = placements
            .get(&r.mode)
            .and_then(|v| v.iter().position(|c| *c == variant(r)))
            .unwrap_or(0);
        match extra.get(&(r.mode, shade)) {
            Some(c) => *c,
            None => hue_of.get(&r.mode).copied().unwrap_or(0) * 2 + shade.min(1),
        }
    }
}

/// Series from rows: one per mode/placement/tool, points (x, y) sorted by x.
fn group(
    rows: &[&Row],
    color: &dyn Fn(&Row) -> usize,
    x: &dyn Fn(&Row) -> Option<f64>,
    y: &dyn Fn(&Row) -> Option<f64>,
) -> Vec<Series> {
    let mut m: Vec<Series> = Vec::new();
    for r in rows {
        let (Some(x), Some(y)) = (x(r), y(r)) else {
            continue;
        };
        let name = r.series();
        match m.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((x, y)),
            None => m.push(Series {
                name,
                points: vec![(x, y)],
                dashed: false,
                color: color(r),
            }),
        }
    }
    for s in &mut m {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    m
}

/// p50 solid and p99 dashed, as one set of series.
fn p50_p99(
    rows: &[&Row],
    color: &dyn Fn(&Row) -> usize,
    x: &dyn Fn(&Row) -> Option<f64>,
) -> Vec<Series> {
    let mut s = group(rows, color, x, &|r| r.p50_us);
    s.extend(
        group(rows, color, x, &|r| r.p99_us)
            .into_iter()
            .map(|s| Series { dashed: true, ..s }),
    );
    s
}

/// p99 solid and p99.9 dashed, as one set of series.
fn tail(
    rows: &[&Row],
    color: &dyn Fn(&Row) -> usize,
    x: &dyn Fn(&Row) -> Option<f64>,
) -> Vec<Series> {
    let mut s = group(rows, color, x, &|r| r.p99_us);
    s.extend(
        group(rows, color, x, &|r| r.p999_us)
            .into_iter()
            .map(|s| Series { dashed: true, ..s }),
    );
    s
}

/// The CDF of a row's histogram: (µs, fraction at or below).
fn cdf(hist: &[[u64; 2]]) -> Vec<(f64, f64)> {
    let total: u64 = hist.iter().map(|b| b[1]).sum();
    let mut acc = 0u64;
    hist.iter()
        .map(|&[ns, c]| {
            acc += c;
            (ns as f64 / 1e3, acc as f64 / total.max(1) as f64)
        })
        .collect()
}

/// A chart with a logarithmic x axis.
fn chart(
    file: String,
    title: String,
    x: &'static str,
    y: &'static str,
    logy: bool,
    series: Vec<Series>,
) -> Chart {
    Chart {
        file,
        title,
        x,
        y,
        logx: true,
        logy,
        series,
    }
}

type ColorOf<'a> = &'a dyn Fn(&Row) -> usize;

fn by_size(r: &Row) -> Option<f64> {
    Some(r.size as f64)
}

fn by_pairs(r: &Row) -> Option<f64> {
    r.pairs.map(|n| n as f64)
}

/// rr: a CDF per message size, then p50/p99 against size.
fn rr_charts(rr: &[&Row], color: ColorOf) -> Vec<Chart> {
    let mut out = Vec::new();
    let mut sizes: Vec<usize> = rr.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for s in sizes {
        let series: Vec<Series> = rr
            .iter()
            .filter(|r| r.size == s)
            .filter_map(|r| {
                let h = r.one_way_hist.as_deref().filter(|h| !h.is_empty())?;
                Some(Series {
                    color: color(r),
                    name: r.series(),
                    points: cdf(h),
                    dashed: false,
                })
            })
            .collect();
        if !series.is_empty() {
            out.push(chart(
                format!("cdf-rr-{s}"),
                format!("One-way latency CDF, TCP rr {s} B"),
                "one-way latency (us, log)",
                "fraction of messages",
                false,
                series,
            ));
        }
    }
    if !rr.is_empty() {
        out.push(chart(
            "rr-latency-vs-size".into(),
            "One-way latency vs message size (p50 solid, p99 dashed)".into(),
            "message size (bytes, log)",
            "one-way latency (us, log)",
            true,
            p50_p99(rr, color, &by_size),
        ));
    }
    out
}

/// pairs: aggregate goodput and per-pair latency against N.
fn pairs_charts(pairs: &[&Row], color: ColorOf) -> Vec<Chart> {
    if pairs.is_empty() {
        return Vec::new();
    }
    vec![
        chart(
            "pairs-goodput-vs-n".into(),
            "Aggregate goodput vs concurrent pairs".into(),
            "pairs (log)",
            "aggregate goodput (Gbps)",
            false,
            group(pairs, color, &by_pairs, &|r| r.gbps),
        ),
        chart(
            "pairs-latency-vs-n".into(),
            "Per-pair one-way latency vs concurrent pairs (p50 solid, p99 dashed)".into(),
            "pairs (log)",
            "one-way latency (us, log)",
            true,
            p50_p99(pairs, color, &by_pairs),
        ),
        chart(
            "pairs-tail-vs-n".into(),
            "Per-pair tail latency vs concurrent pairs (p99 solid, p99.9 dashed)".into(),
            "pairs (log)",
            "one-way latency (us, log)",
            true,
            tail(pairs, color, &by_pairs),
        ),
        chart(
            "pairs-cpu-vs-n".into(),
            "CPU per transaction vs concurrent pairs (the whole machine while the pairs ping-pong)"
                .into(),
            "pairs (log)",
            "CPU per transaction (us, log)",
            true,
            group(pairs, color, &by_pairs, &|r| {
                r.cpu_s_per_op.map(|c| c * 1e6)
            }),
        ),
    ]
}

/// Each mode's ratio to bridge, per workload (`rows`: where bridge is looked up).
fn ratio_charts(rows: &[Row], color: ColorOf) -> Vec<Chart> {
    let mut out = Vec::new();
    let base = rows
        .first()
        .map_or(crate::mode::Mode::Bridge, |r| r.topology.baseline());
    for (w, what, xname) in [
        (
            Workload::Rr,
            format!("{base} p50 / mode p50 (higher is faster)"),
            "message size (bytes, log)",
        ),
        (
            Workload::Stream,
            format!("mode goodput / {base} goodput"),
            "message size (bytes, log)",
        ),
        (
            Workload::Pairs,
            format!("mode goodput / {base} goodput"),
            "pairs (log)",
        ),
    ] {
        let it: Vec<&Row> = rows
            .iter()
            .filter(|r| r.workload == w && r.mode != base)
            .collect();
        let x = if w == Workload::Pairs {
            by_pairs
        } else {
            by_size
        };
        let series = group(&it, color, &x, &|r| ratio(rows, r));
        if !series.is_empty() {
            out.push(chart(
                format!("ratio-to-{base}-{w}"),
                format!("Ratio to {base}, {w}: {what}"),
                xname,
                "ratio to baseline (log)",
                true,
                series,
            ));
        }
    }
    out
}

/// The charts for rows of one MTU.
fn charts_for(rows: &[Row]) -> Vec<Chart> {
    let color = colors(rows);
    let of = |w: Workload| -> Vec<&Row> { rows.iter().filter(|r| r.workload == w).collect() };
    let mut out = rr_charts(&of(Workload::Rr), &color);
    let st = of(Workload::Stream);
    if !st.is_empty() {
        out.push(chart(
            "stream-goodput-vs-size".into(),
            "Goodput vs message size (TCP stream)".into(),
            "message size (bytes, log)",
            "goodput (Gbps, log)",
            true,
            group(&st, &color, &by_size, &|r| r.gbps),
        ));
    }
    out.extend(pairs_charts(&of(Workload::Pairs), &color));
    out.extend(ratio_charts(rows, &color));
    out
}

/// The HTTP figures: requests/s against connections, p50/p99 against connections, and a
/// latency CDF per connection count (rows of docknet-load, which reports histograms).
pub fn http_charts(rows: &[Row]) -> Vec<Chart> {
    let color = colors(rows);
    let cluster: Vec<&Row> = rows
        .iter()
        .filter(|r| r.workload == Workload::Http && r.backends.is_some())
        .collect();
    let mut out = Vec::new();
    if !cluster.is_empty() {
        let by_backends = |r: &Row| r.backends.map(|b| b as f64);
        out.push(chart(
            "cluster-req-per-s".into(),
            "Web cluster: requests/s vs backends behind the load balancer".into(),
            "backends (log)",
            "requests/s (log)",
            true,
            group(&cluster, &color, &by_backends, &|r| r.req_per_s),
        ));
    }
    let http: Vec<&Row> = rows
        .iter()
        .filter(|r| r.workload == Workload::Http && r.backends.is_none())
        .collect();
    if http.is_empty() {
        return out;
    }
    let by_conns = |r: &Row| r.connections.map(|c| c as f64);
    out.extend([
        chart(
            "http-req-per-s".into(),
            "HTTP requests/s vs connections (the paper's Fig. 11)".into(),
            "connections (log)",
            "requests/s (log)",
            true,
            group(&http, &color, &by_conns, &|r| r.req_per_s),
        ),
        chart(
            "http-latency".into(),
            "HTTP latency vs connections (p50 solid, p99 dashed)".into(),
            "connections (log)",
            "latency per request (us, log)",
            true,
            p50_p99(&http, &color, &by_conns),
        ),
    ]);
    let mut conns: Vec<usize> = http.iter().filter_map(|r| r.connections).collect();
    conns.sort_unstable();
    conns.dedup();
    for c in conns {
        let series: Vec<Series> = http
            .iter()
            .filter(|r| r.connections == Some(c))
            .filter_map(|r| {
                let h = r.one_way_hist.as_deref().filter(|h| !h.is_empty())?;
                Some(Series {
                    color: color(r),
                    name: r.series(),
                    points: cdf(h),
                    dashed: false,
                })
            })
            .collect();
        if !series.is_empty() {
            out.push(chart(
                format!("cdf-http-{c}"),
                format!("HTTP latency CDF under load, {c} connections"),
                "latency per request (us, log)",
                "fraction of requests",
                false,
                series,
            ));
        }
    }
    out
}

/// The rate experiment's timelines: per mode and scenario, each flow's throughput in its bins
/// and its limit (dashed, in the flow's colour).
pub fn rate_charts(rows: &[Row]) -> Vec<Chart> {
    let rate: Vec<&Row> = rows
        .iter()
        .filter(|r| r.workload == Workload::Rate && r.t_s.is_some())
        .collect();
    let mut keys: Vec<(crate::mode::Mode, String)> = Vec::new();
    for r in &rate {
        let k = (r.mode, r.scenario.clone().unwrap_or_default());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(mode, sc)| {
            let of = |flow: &str| -> Vec<&&Row> {
                rate.iter()
                    .filter(|r| {
                        r.mode == mode
                            && r.scenario.as_deref() == Some(sc.as_str())
                            && r.flow.as_deref() == Some(flow)
                    })
                    .collect()
            };
            let mut series = Vec::new();
            for (k, flow) in ["tcp", "udp"].into_iter().enumerate() {
                let bins = of(flow);
                if bins.is_empty() {
                    continue;
                }
                let pts = |f: &dyn Fn(&Row) -> Option<f64>| -> Vec<(f64, f64)> {
                    bins.iter().filter_map(|r| Some((r.t_s?, f(r)?))).collect()
                };
                series.push(Series {
                    name: flow.to_uppercase(),
                    points: pts(&|r| r.gbps),
                    dashed: false,
                    color: 2 * k,
                });
                // the limit as segments where one holds, left out where it is far above
                // every flow (the limiter's presence), so the axis stays readable
                let top = rate
                    .iter()
                    .filter(|r| r.mode == mode)
                    .filter_map(|r| r.gbps)
                    .fold(0.0, f64::max);
                let mut segment: Vec<(f64, f64)> = Vec::new();
                for r in &bins {
                    match (r.t_s, r.limit_bps.map(|b| b / 1e9)) {
                        (Some(t), Some(l)) if l <= 2.0 * top.max(0.001) => segment.push((t, l)),
                        _ if !segment.is_empty() => series.push(Series {
                            name: format!("{} limit", flow.to_uppercase()),
                            points: std::mem::take(&mut segment),
                            dashed: true,
                            color: 2 * k + 1,
                        }),
                        _ => {}
                    }
                }
                if !segment.is_empty() {
                    series.push(Series {
                        name: format!("{} limit", flow.to_uppercase()),
                        points: segment,
                        dashed: true,
                        color: 2 * k + 1,
                    });
                }
            }
            Chart {
                file: format!("rate-{}-{sc}", mode.name()),
                title: format!("Rate limits, {sc}: {mode}"),
                x: "time (s)",
                y: "Gbps at the receiver",
                logx: false,
                logy: false,
                series,
            }
        })
        .collect()
}

/// The seed studies' figures: start-up time per mode (p50 and p99 of the repetitions), and
/// under a CPU quota the round trips' p99 and the count above 1 ms by quota.
pub fn seed_charts(rows: &[Row]) -> Vec<Chart> {
    let color = colors(rows);
    let mut out = Vec::new();
    let startup: Vec<&Row> = rows
        .iter()
        .filter(|r| r.workload == Workload::Startup)
        .collect();
    if !startup.is_empty() {
        let series = startup
            .iter()
            .filter_map(|r| {
                Some(Series {
                    name: match r.topology {
                        Topology::TwoHost => format!("{}, two hosts", r.series()),
                        Topology::OneHost => r.series(),
                    },
                    points: vec![(50.0, r.p50_ms?), (99.0, r.p99_ms?)],
                    dashed: false,
                    color: color(r),
                })
            })
            .collect();
        out.push(Chart {
            file: "seed-startup".into(),
            title: "Start-up: create to answered TCP connect (Suo et al.), p50 and p99".into(),
            x: "percentile of the repetitions",
            y: "ms (log)",
            logx: false,
            logy: true,
            series,
        });
    }
    for (t, file, on) in [
        (Topology::OneHost, "seed-chain", ""),
        (Topology::TwoHost, "seed-chain-two-host", ", two hosts"),
    ] {
        let chain: Vec<&Row> = rows
            .iter()
            .filter(|r| r.workload == Workload::Chain && r.topology == t)
            .collect();
        if chain.is_empty() {
            continue;
        }
        let base = crate::workload::chain::reference(t);
        out.push(chart(
            file.into(),
            format!("HTTP chain siege -> ping -> pong{on}: payload transfer rate by message size (Kratzke Fig. 2)"),
            "message size (bytes, log)",
            "Mbit/s (log)",
            true,
            group(&chain, &color, &by_size, &|r| r.transfer_bps.map(|b| b / 1e6)),
        ));
        out.push(Chart {
            logy: false,
            ..chart(
                format!("{file}-ratio"),
                format!("HTTP chain{on}: transfer rate relative to the reference ({base}), Kratzke Fig. 3"),
                "message size (bytes, log)",
                "ratio to the reference",
                false,
                group(&chain, &color, &by_size, &|r| {
                    crate::workload::chain::to_reference(rows, r)
                }),
            )
        });
    }
    let quota: Vec<&Row> = rows
        .iter()
        .filter(|r| r.workload == Workload::Cpuquota)
        .collect();
    if !quota.is_empty() {
        let by_quota = |r: &Row| r.quota_us.map(|q| q as f64);
        out.push(chart(
            "seed-cpuquota-p99".into(),
            "Round trips under a CPU quota of 10000 us periods (thesis Table 3.2): p50 solid, p99 dashed".into(),
            "quota per period (us, log)",
            "round trip (us, log)",
            true,
            p50_p99(&quota, &color, &by_quota),
        ));
        out.push(Chart {
            logy: false,
            ..chart(
                "seed-cpuquota-over-1ms".into(),
                "Round trips above 1 ms, per 1000 measured, by quota (thesis Fig. 3.3)".into(),
                "quota per period (us, log)",
                "round trips > 1 ms per 1000",
                false,
                group(&quota, &color, &by_quota, &|r| {
                    Some(r.over_1ms? as f64 * 1000.0 / r.samples.filter(|n| *n > 0)? as f64)
                }),
            )
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mode::Mode;

    #[test]
    fn rate_timelines_draw_limits_only_where_they_hold() {
        let bin = |t: f64, g: f64, l: Option<f64>| Row {
            scenario: Some("steps".into()),
            phase: Some("x".into()),
            flow: Some("tcp".into()),
            t_s: Some(t),
            gbps: Some(g),
            limit_bps: l,
            ..Row::new(Mode::Docknet, Tool::Dnperf, Workload::Rate, 16384)
        };
        let rows = vec![
            bin(0.0, 10.0, None),
            bin(0.1, 10.0, Some(100e9)), // far above: the limiter's presence
            bin(0.2, 5.0, Some(5e9)),
            bin(0.3, 5.0, Some(5e9)),
            bin(0.4, 10.0, None),
            bin(0.5, 2.0, Some(2e9)),
        ];
        let c = rate_charts(&rows);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].file, "rate-docknet-steps");
        let limits: Vec<&Series> = c[0].series.iter().filter(|s| s.dashed).collect();
        assert_eq!(limits.len(), 2, "two segments, none across the gap");
        assert_eq!(limits[0].points, vec![(0.2, 5.0), (0.3, 5.0)]);
        assert_eq!(limits[1].points, vec![(0.5, 2.0)]);
        assert_eq!(c[0].series.iter().filter(|s| !s.dashed).count(), 1);
    }

    fn row(mode: Mode, cores: &str, w: Workload, size: usize, mtu: u32) -> Row {
        Row {
            cores: cores.into(),
            mtu: Some(mtu),
            p50_us: Some(2.0),
            p99_us: Some(4.0),
            gbps: Some(1.0),
            one_way_hist: Some(vec![[1000, 5], [2000, 5]]),
            ..Row::new(mode, Tool::Dnperf, w, size)
        }
    }

    #[test]
    fn figures_per_mtu_with_lo_in_each_and_hues_per_mode() {
        let rows = [
            row(Mode::Bridge, "c1 s1", Workload::Rr, 64, 1500),
            row(Mode::Bridge, "c0 s1", Workload::Rr, 64, 1500),
            row(Mode::Bridge, "c1 s1", Workload::Rr, 64, 9000),
            row(Mode::Loopback, "c1 s1", Workload::Rr, 64, LO_MTU),
            row(Mode::DocknetFc, "c0 s1", Workload::Stream, 1024, 1500),
            Row {
                tool: Tool::Sockperf,
                ..row(Mode::Veth, "c0 s1", Workload::Rr, 64, 1500)
            },
        ];
        let c = charts(&rows);
        let files: Vec<&str> = c.iter().map(|c| c.file.as_str()).collect();
        assert!(files.contains(&"cdf-rr-64-mtu1500") && files.contains(&"cdf-rr-64-mtu9000"));
        assert!(files.contains(&"stream-goodput-vs-size-mtu1500"));
        assert!(!files.iter().any(|f| f.contains("pairs")));
        let cdf9000 = c.iter().find(|c| c.file == "cdf-rr-64-mtu9000").unwrap();
        let names: Vec<&str> = cdf9000.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["bridge [c1 s1]", "loopback [c1 s1]"],
            "lo in every set, no sockperf"
        );
        let cdf1500 = c.iter().find(|c| c.file == "cdf-rr-64-mtu1500").unwrap();
        let colors: Vec<usize> = cdf1500.series.iter().map(|s| s.color).collect();
        // bridge's two placements share hue 0 (strong, light), loopback has its own
        assert_eq!(colors, [0, 1, Mode::Loopback.hue() * 2]);
        assert_eq!(cdf1500.series[0].points, [(1.0, 0.5), (2.0, 1.0)]);
    }

    #[test]
    fn modes_whose_hues_collide_get_colours_of_their_own() {
        // docknet's and host's hues are the same modulo the palette's ten
        assert_eq!(Mode::Docknet.hue() % 10, Mode::Host.hue() % 10);
        let rows = [
            row(Mode::Host, "-", Workload::Rr, 64, 1500),
            row(Mode::Docknet, "-", Workload::Rr, 64, 1500),
            row(Mode::Bridge, "-", Workload::Rr, 64, 1500),
        ];
        let color = colors(&rows);
        let c: Vec<usize> = rows.iter().map(&color).collect();
        assert_eq!(
            c[1],
            Mode::Docknet.hue() * 2,
            "the earlier mode keeps its hue"
        );
        assert!(c[0] != c[1] && c[0] != c[2] && c[1] != c[2], "{c:?}");
    }

    #[test]
    fn charts_of_hostile_rows_are_empty_not_a_panic() {
        let r = Row {
            one_way_hist: Some(vec![]),
            p50_us: None,
            ..Row::new(Mode::Bridge, Tool::Dnperf, Workload::Rr, 64)
        };
        let c = charts(&[r]);
        assert!(c
            .iter()
            .all(|c| c.series.iter().all(|s| s.points.is_empty())));
    }
}
