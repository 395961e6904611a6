//! `docknet report FILE.json... --out DIR`: the lab's report from `docknet bench` results.
//! Writes `DIR/index.html` (tables and figures), `DIR/report.md` (the Markdown summary) and
//! the figures as PNG and SVG in `DIR/figures/` (plotters):
//!
//! - the one-way latency CDF per mode, one figure per message size (rr);
//! - p50 and p99 one-way latency against message size (rr);
//! - goodput against message size, the paper's Fig. 8 style (stream);
//! - aggregate goodput and per-pair latency against N pairs (pairs);
//! - each mode's ratio to `bridge` (per workload).
//!
//! The input is untrusted JSON in the results schema: missing or mistyped fields drop a point,
//! never the report.

use anyhow::{bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The figures' font unless `--font` or `DOCKNET_FONT` says otherwise (fonts-dejavu-core).
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// One entry of a results file's `not_available` list as a line: "MODE (MTU m): status:
/// reason".
pub(crate) fn not_available_line(x: &Value) -> String {
    format!(
        "{}{}: {}: {}",
        x["mode"].as_str().unwrap_or("?"),
        x["mtu"]
            .as_u64()
            .map_or(String::new(), |m| format!(" (MTU {m})")),
        x["status"].as_str().unwrap_or("not available here"),
        x["reason"].as_str().unwrap_or("?")
    )
}

/// Options of `docknet report`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Results written by `docknet bench ... --json FILE` (one or more; rr, stream and pairs
    /// results are combined).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Directory to write index.html, report.md and figures/ into.
    #[arg(long, default_value = "report")]
    pub out: PathBuf,
    /// TrueType font for the figures' text.
    #[arg(
        long,
        env = "DOCKNET_FONT",
        default_value = DEFAULT_FONT
    )]
    pub font: PathBuf,
}

/// One summary row, read leniently from JSON.
#[derive(Debug, Clone)]
struct R {
    mode: String,
    cores: String,
    tool: String,
    workload: String,
    size: u64,
    mtu: Option<u64>,
    pairs: Option<u64>,
    p50: Option<f64>,
    p99: Option<f64>,
    p999: Option<f64>,
    mean: Option<f64>,
    gbps: Option<f64>,
    mmsgs: Option<f64>,
    cpu_us: Option<f64>,
    mem_kib: Option<f64>,
    hist: Vec<(f64, u64)>,
}

impl R {
    fn from(v: &Value) -> Option<R> {
        let f = |k: &str| v[k].as_f64().filter(|x| x.is_finite());
        let hist = v["one_way_hist"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|b| Some((b[0].as_f64()?, b[1].as_u64()?)))
                    .filter(|(x, c)| *x > 0.0 && x.is_finite() && *c > 0)
                    .collect()
            })
            .unwrap_or_default();
        Some(R {
            mode: v["mode"].as_str()?.to_string(),
            cores: v["cores"].as_str().unwrap_or("-").to_string(),
            tool: v["tool"].as_str().unwrap_or("dnperf").to_string(),
            workload: v["workload"].as_str()?.to_string(),
            size: v["msg_size"].as_u64()?,
            mtu: v["mtu"].as_u64(),
            pairs: v["pairs"].as_u64(),
            p50: f("p50_us"),
            p99: f("p99_us"),
            p999: f("p999_us"),
            mean: f("mean_us"),
            gbps: f("gbps"),
            mmsgs: f("msgs_per_s").or(f("tps")).map(|m| m / 1e6),
            cpu_us: f("cpu_s_per_op").map(|c| c * 1e6),
            mem_kib: f("mem_kib_per_pair"),
            hist,
        })
    }

    /// The series this row belongs to: mode, placement and tool.
    fn series(&self) -> String {
        let mut s = self.mode.clone();
        if self.cores != "-" {
            let _ = write!(s, " [{}]", self.cores);
        }
        if self.tool != "dnperf" {
            let _ = write!(s, " ({})", self.tool);
        }
        s
    }
}

/// The summary rows (or, from older files, the results) and the not-available list of a doc.
fn rows_of(doc: &Value) -> Vec<R> {
    let rows = doc["summary"]
        .as_array()
        .or_else(|| doc["medians"].as_array())
        .or_else(|| doc["results"].as_array());
    rows.map(|a| a.iter().filter_map(R::from).collect())
        .unwrap_or_default()
}

/// The bridge row a mode's row is compared with: same workload, size, MTU and pairs, and the
/// placement whose cores the row's start with ("c1 s1 m0" → bridge "c1 s1").
fn bridge_of<'a>(rows: &'a [R], r: &R) -> Option<&'a R> {
    rows.iter().find(|b| {
        b.mode == "bridge"
            && b.tool == "dnperf"
            && b.workload == r.workload
            && b.size == r.size
            && b.mtu == r.mtu
            && b.pairs == r.pairs
            && (r.cores.starts_with(&b.cores) || b.cores == "-")
    })
}

/// The ratio to bridge: lower latency (rr: bridge p50 / p50) or goodput (mode / bridge).
fn ratio(rows: &[R], r: &R) -> Option<f64> {
    let b = bridge_of(rows, r)?;
    if r.workload == "rr" {
        Some(b.p50? / r.p50?)
    } else {
        Some(r.gbps? / b.gbps?)
    }
}

/// Lines like "rr 64 B: docknet-fc [c0 s1] vs bridge [c0 s1]: 21.3x lower p50" for the
/// DockNet modes of a run's summary (the table under it has every mode's).
pub fn ratio_lines(summary: &[crate::bench::Row], workload: &str) -> Vec<String> {
    let rows = from_bench(summary);
    let mut out = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.mode.starts_with("docknet") && r.workload == workload)
    {
        let (Some(x), Some(b)) = (ratio(&rows, r), bridge_of(&rows, r)) else {
            continue;
        };
        let what = if workload == "rr" {
            "lower p50"
        } else {
            "goodput"
        };
        let at = match r.pairs {
            Some(n) => format!("{n} pairs, {} B", r.size),
            None => format!("{} B", r.size),
        };
        out.push(format!(
            "{workload} {at} mtu {}: {} [{}] vs bridge [{}]: {x:.2}x {what}",
            r.mtu.unwrap_or(0),
            r.mode,
            r.cores,
            b.cores
        ));
    }
    out
}

/// Issue #4's targets, checked against a run's summary. Each line says the target, the
/// figures and MET / NOT MET.
pub fn targets(summary: &[crate::bench::Row]) -> Vec<String> {
    targets_of(&from_bench(summary))
}

/// The report's view of a run's rows (through their JSON, as a results file would give them).
fn from_bench(summary: &[crate::bench::Row]) -> Vec<R> {
    summary
        .iter()
        .filter_map(|r| serde_json::to_value(r).ok())
        .filter_map(|v| R::from(&v))
        .collect()
}

fn targets_of(rows: &[R]) -> Vec<String> {
    let verdict = |ok: bool| if ok { "MET" } else { "NOT MET" };
    let dn = |mode: &'static str, wl: &'static str, size: u64| {
        rows.iter().filter(move |r| {
            r.mode == mode && r.workload == wl && r.size == size && r.tool == "dnperf"
        })
    };
    let mut out = Vec::new();
    for fc in dn("docknet-fc", "rr", 64) {
        if let (Some(x), Some(b)) = (ratio(rows, fc), bridge_of(rows, fc)) {
            out.push(format!(
                "docknet-fc 64 B rr p50 >= 15x lower than bridge [{}] (mtu {}): {x:.1}x ({:.2} vs {:.2} us), {}",
                b.cores,
                fc.mtu.unwrap_or(0),
                fc.p50.unwrap_or(0.0),
                b.p50.unwrap_or(0.0),
                verdict(x >= 15.0)
            ));
        }
    }
    let mut sizes: Vec<u64> = rows
        .iter()
        .filter(|r| r.mode == "docknet" && r.workload == "rr")
        .map(|r| r.size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    for size in sizes {
        for d in dn("docknet", "rr", size) {
            let best = rows
                .iter()
                .filter(|k| {
                    !k.mode.starts_with("docknet")
                        && k.workload == "rr"
                        && k.size == size
                        && k.tool == "dnperf"
                        && k.mtu.is_some_and(|m| m == d.mtu.unwrap_or(0) || m == 65536)
                })
                .filter(|k| k.p50.is_some())
                .min_by(|a, b| a.p50.unwrap_or(0.0).total_cmp(&b.p50.unwrap_or(0.0)));
            if let (Some(k), Some(p)) = (best, d.p50) {
                let kp = k.p50.unwrap_or(0.0);
                out.push(format!(
                    "docknet {size} B rr p50 lower than every kernel mode (mtu {}): {p:.2} us vs best kernel {} [{}] {kp:.2} us, {}",
                    d.mtu.unwrap_or(0),
                    k.mode,
                    k.cores,
                    verdict(p < kp)
                ));
            }
        }
    }
    for (size, want) in [(65536u64, 1.0), (1024, 3.0)] {
        for fc in dn("docknet-fc", "stream", size) {
            if let (Some(x), Some(b)) = (ratio(rows, fc), bridge_of(rows, fc)) {
                out.push(format!(
                    "docknet-fc stream {size} B goodput >= {want}x bridge [{}] (mtu {}): {x:.2}x ({:.2} vs {:.2} Gbps), {}",
                    b.cores,
                    fc.mtu.unwrap_or(0),
                    fc.gbps.unwrap_or(0.0),
                    b.gbps.unwrap_or(0.0),
                    verdict(x >= want)
                ));
            }
        }
    }
    out
}

/// Rebuilds the report of a `--report DIR` directory from every `tcp-*.json` in it.
pub fn build_dir(dir: &Path) -> Result<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("tcp-") && n.ends_with(".json"))
        })
        .collect();
    files.sort();
    run(&ReportArgs {
        files,
        out: dir.to_path_buf(),
        font: std::env::var_os("DOCKNET_FONT")
            .map(PathBuf::from)
            .unwrap_or_else(|| DEFAULT_FONT.into()),
    })
}

fn register_font(path: &Path) -> Result<()> {
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
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    /// Draw dashed (the p99 of a p50/p99 pair).
    dashed: bool,
    /// Colour index (a p50/p99 pair shares one).
    color: usize,
}

struct Chart {
    file: String,
    title: String,
    x: &'static str,
    y: &'static str,
    logx: bool,
    logy: bool,
    series: Vec<Series>,
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
        // a dashed twin (p99 beside p50) shares its solid line's entry
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
fn render(out: &Path, c: &Chart) -> Result<()> {
    let dir = out.join("figures");
    std::fs::create_dir_all(&dir)?;
    let size = (1200, 600);
    let svg = dir.join(format!("{}.svg", c.file));
    draw(SVGBackend::new(&svg, size).into_drawing_area(), c)?;
    let png = dir.join(format!("{}.png", c.file));
    draw(BitMapBackend::new(&png, size).into_drawing_area(), c)?;
    Ok(())
}

/// Modes in a fixed order, so a mode has the same hue in every figure.
const HUES: [&str; 10] = [
    "bridge",
    "docknet",
    "docknet-fc",
    "loopback",
    "bridge-nat",
    "macvlan",
    "ovs",
    "veth",
    "container",
    "ipvlan",
];

/// The charts: dnperf rows only (the cross-check tools are in the tables), one set per MTU
/// when the run has several (loopback and container, which cross `lo`, are in every set).
fn charts(rows: &[R]) -> Vec<Chart> {
    let rows: Vec<R> = rows
        .iter()
        .filter(|r| r.tool == "dnperf")
        .cloned()
        .collect();
    let mut mtus: Vec<u64> = rows
        .iter()
        .filter_map(|r| r.mtu)
        .filter(|m| *m != 65536)
        .collect();
    mtus.sort_unstable();
    mtus.dedup();
    if mtus.len() <= 1 {
        return charts_for(&rows);
    }
    let mut out = Vec::new();
    for m in mtus {
        let sub: Vec<R> = rows
            .iter()
            .filter(|r| r.mtu.is_none_or(|x| x == m || x == 65536))
            .cloned()
            .collect();
        for c in charts_for(&sub) {
            out.push(Chart {
                file: format!("{}-mtu{m}", c.file),
                title: format!("{} (MTU {m})", c.title),
                ..c
            });
        }
    }
    out
}

/// The charts for rows of one MTU.
fn charts_for(rows: &[R]) -> Vec<Chart> {
    // a hue per mode; a strong shade for its first placement, a light one for the second
    let mut placements: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.cores != "-") {
        let v = placements.entry(r.mode.clone()).or_default();
        if !v.contains(&r.cores) {
            v.push(r.cores.clone());
        }
    }
    let color = |r: &R| {
        let hue = HUES
            .iter()
            .position(|h| *h == r.mode)
            .unwrap_or_else(|| r.mode.bytes().map(usize::from).sum::<usize>() % HUES.len());
        let shade = placements
            .get(&r.mode)
            .and_then(|v| v.iter().position(|c| *c == r.cores))
            .unwrap_or(0);
        hue * 2 + shade.min(1)
    };
    let of = |wl: &'static str| rows.iter().filter(move |r| r.workload == wl);
    let group = |it: Vec<&R>, x: &dyn Fn(&R) -> Option<f64>, y: &dyn Fn(&R) -> Option<f64>| {
        let mut m: Vec<Series> = Vec::new();
        for r in it {
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
    };
    let mut out = Vec::new();
    // rr: CDF per size
    let mut rr_sizes: Vec<u64> = of("rr").map(|r| r.size).collect();
    rr_sizes.sort_unstable();
    rr_sizes.dedup();
    for size in &rr_sizes {
        let mut series = Vec::new();
        for r in of("rr").filter(|r| r.size == *size && !r.hist.is_empty()) {
            let total: u64 = r.hist.iter().map(|b| b.1).sum();
            let mut acc = 0u64;
            let points = r
                .hist
                .iter()
                .map(|&(ns, c)| {
                    acc += c;
                    (ns / 1e3, acc as f64 / total as f64)
                })
                .collect();
            series.push(Series {
                color: color(r),
                name: r.series(),
                points,
                dashed: false,
            });
        }
        if !series.is_empty() {
            out.push(Chart {
                file: format!("cdf-rr-{size}"),
                title: format!("One-way latency CDF, TCP rr {size} B"),
                x: "one-way latency (us, log)",
                y: "fraction of messages",
                logx: true,
                logy: false,
                series,
            });
        }
    }
    if !rr_sizes.is_empty() {
        let it: Vec<&R> = of("rr").collect();
        let mut series = group(it.clone(), &|r| Some(r.size as f64), &|r| r.p50);
        series.extend(
            group(it, &|r| Some(r.size as f64), &|r| r.p99)
                .into_iter()
                .map(|s| Series { dashed: true, ..s }),
        );
        out.push(Chart {
            file: "rr-latency-vs-size".into(),
            title: "One-way latency vs message size (p50 solid, p99 dashed)".into(),
            x: "message size (bytes, log)",
            y: "one-way latency (us, log)",
            logx: true,
            logy: true,
            series,
        });
    }
    if of("stream").next().is_some() {
        let series = group(of("stream").collect(), &|r| Some(r.size as f64), &|r| {
            r.gbps
        });
        out.push(Chart {
            file: "stream-goodput-vs-size".into(),
            title: "Goodput vs message size (TCP stream)".into(),
            x: "message size (bytes, log)",
            y: "goodput (Gbps, log)",
            logx: true,
            logy: true,
            series,
        });
    }
    if of("pairs").next().is_some() {
        let series = group(
            of("pairs").collect(),
            &|r| r.pairs.map(|n| n as f64),
            &|r| r.gbps,
        );
        out.push(Chart {
            file: "pairs-goodput-vs-n".into(),
            title: "Aggregate goodput vs concurrent pairs".into(),
            x: "pairs (log)",
            y: "aggregate goodput (Gbps)",
            logx: true,
            logy: false,
            series,
        });
        let it: Vec<&R> = of("pairs").collect();
        let mut series = group(it.clone(), &|r| r.pairs.map(|n| n as f64), &|r| r.p50);
        series.extend(
            group(it, &|r| r.pairs.map(|n| n as f64), &|r| r.p99)
                .into_iter()
                .map(|s| Series { dashed: true, ..s }),
        );
        out.push(Chart {
            file: "pairs-latency-vs-n".into(),
            title: "Per-pair one-way latency vs concurrent pairs (p50 solid, p99 dashed)".into(),
            x: "pairs (log)",
            y: "one-way latency (us, log)",
            logx: true,
            logy: true,
            series,
        });
    }
    for (wl, what, xname) in [
        (
            "rr",
            "bridge p50 / mode p50 (higher is faster)",
            "message size (bytes, log)",
        ),
        (
            "stream",
            "mode goodput / bridge goodput",
            "message size (bytes, log)",
        ),
        ("pairs", "mode goodput / bridge goodput", "pairs (log)"),
    ] {
        let it: Vec<&R> = of(wl)
            .filter(|r| r.mode != "bridge" && r.tool == "dnperf")
            .collect();
        let x = |r: &R| {
            if wl == "pairs" {
                r.pairs.map(|n| n as f64)
            } else {
                Some(r.size as f64)
            }
        };
        let series = group(it, &x, &|r| ratio(rows, r));
        if !series.is_empty() {
            out.push(Chart {
                file: format!("ratio-to-bridge-{wl}"),
                title: format!("Ratio to bridge, {wl}: {what}"),
                x: xname,
                y: "ratio to bridge (log)",
                logx: true,
                logy: true,
                series,
            });
        }
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn o(v: Option<f64>, p: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.p$}"))
}

const COLUMNS: [&str; 15] = [
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
    "ratio to bridge",
];

fn cells(rows: &[R], r: &R) -> [String; 15] {
    [
        r.mode.clone(),
        r.cores.clone(),
        r.tool.clone(),
        r.pairs.map_or("-".into(), |n| n.to_string()),
        r.size.to_string(),
        r.mtu.map_or("-".into(), |m| m.to_string()),
        o(r.p50, 2),
        o(r.p99, 2),
        o(r.p999, 2),
        o(r.mean, 2),
        o(r.gbps, 2),
        o(r.mmsgs, 3),
        o(r.cpu_us, 2),
        o(r.mem_kib, 0),
        ratio(rows, r).map_or("-".into(), |x| format!("{x:.2}x")),
    ]
}

/// Runs `docknet report`.
pub fn run(args: &ReportArgs) -> Result<PathBuf> {
    if args.files.is_empty() {
        bail!("no results files given");
    }
    let mut rows = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    let mut envs: Vec<Value> = Vec::new();
    for f in &args.files {
        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let doc: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not JSON", f.display()))?;
        if !doc["results"].is_array() {
            bail!(
                "{} is not a docknet bench results file (no \"results\" array)",
                f.display()
            );
        }
        rows.extend(rows_of(&doc));
        for x in doc["not_available"].as_array().into_iter().flatten() {
            let line = not_available_line(x);
            if !missing.contains(&line) {
                missing.push(line);
            }
        }
        envs.push(doc["env"].clone());
    }
    register_font(&args.font)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let charts = charts(&rows);
    for c in &charts {
        render(&args.out, c)?;
    }
    let targets = targets_of(&rows);
    let env = envs.first().cloned().unwrap_or(Value::Null);
    let workloads: Vec<&str> = ["rr", "stream", "pairs"]
        .into_iter()
        .filter(|w| rows.iter().any(|r| r.workload == *w))
        .collect();

    // index.html
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>DockNet lab report</title>\n<style>\n\
         body{{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}\n\
         table{{border-collapse:collapse;font-size:13px;margin:1em 0}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}\n\
         td:first-child,th:first-child,td:nth-child(2),td:nth-child(3){{text-align:left}}th{{background:#eee}}\n\
         figure{{margin:1.5em 0}}img{{max-width:100%;border:1px solid #ddd}}.met{{color:#070}}.notmet{{color:#a00}}\n\
         </style></head>\n<body>\n<h1>DockNet lab report</h1>\n"
    );
    let _ = writeln!(
        h,
        "<p>Kernel {}, {} cores; {} s measured per point after {} s warm-up, {} run(s) per point. \
         One-way latency from CLOCK_MONOTONIC timestamps in the payload; goodput counted at the receiver. \
         Latency percentiles over runs come from merged histograms. sockperf rows report RTT/2.</p>",
        esc(env["kernel"].as_str().unwrap_or("?")),
        env["cores"],
        env["duration_s"],
        env["warmup_s"],
        env["repeat"]
    );
    h += "<p>Commands:</p><ul>\n";
    for e in &envs {
        let _ = writeln!(
            h,
            "<li><code>{}</code></li>",
            esc(e["command"].as_str().unwrap_or("?"))
        );
    }
    h += "</ul>\n";
    if !targets.is_empty() {
        h += "<h2>Targets</h2>\n<ul>\n";
        for t in &targets {
            let class = if t.ends_with("NOT MET") {
                "notmet"
            } else {
                "met"
            };
            let _ = writeln!(h, "<li class=\"{class}\">{}</li>", esc(t));
        }
        h += "</ul>\n";
    }
    h += "<h2>Figures</h2>\n";
    for c in &charts {
        let _ = writeln!(
            h,
            "<figure><img class=\"figure\" src=\"figures/{f}.svg\" alt=\"{t}\" width=\"1200\" height=\"600\">\
             <figcaption>{t} (<a href=\"figures/{f}.png\">PNG</a>, <a href=\"figures/{f}.svg\">SVG</a>)</figcaption></figure>",
            f = c.file,
            t = esc(&c.title)
        );
    }
    for wl in &workloads {
        let _ = writeln!(h, "<h2>Results: {wl}</h2>\n<table>\n<tr>");
        for c in COLUMNS {
            let _ = write!(h, "<th>{c}</th>");
        }
        h += "</tr>\n";
        for r in rows.iter().filter(|r| r.workload == *wl) {
            h += "<tr>";
            for c in cells(&rows, r) {
                let _ = write!(h, "<td>{}</td>", esc(&c));
            }
            h += "</tr>\n";
        }
        h += "</table>\n";
    }
    if !missing.is_empty() {
        h += "<h2>Not available here, or skipped</h2>\n<ul>\n";
        for m in &missing {
            let _ = writeln!(h, "<li>{}</li>", esc(m));
        }
        h += "</ul>\n";
    }
    // the page says how many figures loaded, so a headless browser can check them
    h += "<script>\nwindow.addEventListener('load', function () {\n  var imgs = document.querySelectorAll('img.figure');\n  var ok = 0;\n  imgs.forEach(function (i) { if (i.complete && i.naturalWidth > 0) ok++; });\n  document.body.setAttribute('data-figures', imgs.length);\n  document.body.setAttribute('data-figures-loaded', ok);\n});\n</script>\n</body></html>\n";
    let index = args.out.join("index.html");
    std::fs::write(&index, h).with_context(|| format!("writing {}", index.display()))?;

    // report.md
    let mut m = String::from("# DockNet lab report\n\n");
    let _ = writeln!(
        m,
        "Kernel {}, {} cores; {} s per point after {} s warm-up, {} run(s) per point.\n",
        env["kernel"].as_str().unwrap_or("?"),
        env["cores"],
        env["duration_s"],
        env["warmup_s"],
        env["repeat"]
    );
    for e in &envs {
        let _ = writeln!(m, "- `{}`", e["command"].as_str().unwrap_or("?"));
    }
    if !targets.is_empty() {
        m += "\n## Targets\n\n";
        for t in &targets {
            let _ = writeln!(m, "- {t}");
        }
    }
    for wl in &workloads {
        let _ = writeln!(m, "\n## {wl}\n");
        let _ = writeln!(m, "| {} |", COLUMNS.join(" | "));
        let _ = writeln!(m, "|{}", "---|".repeat(COLUMNS.len()));
        for r in rows.iter().filter(|r| r.workload == *wl) {
            let _ = writeln!(m, "| {} |", cells(&rows, r).join(" | "));
        }
    }
    if !missing.is_empty() {
        m += "\n## Not available here, or skipped\n\n";
        for x in &missing {
            let _ = writeln!(m, "- {x}");
        }
    }
    m += "\n## Figures\n\n";
    for c in &charts {
        let _ = writeln!(m, "![{}](figures/{}.png)\n", c.title, c.file);
    }
    std::fs::write(args.out.join("report.md"), m)?;
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(mode: &str, cores: &str, wl: &str, size: u64, p50: f64, gbps: f64) -> Value {
        json!({"mode": mode, "cores": cores, "tool": "dnperf", "workload": wl, "msg_size": size,
               "mtu": 1500, "p50_us": p50, "p99_us": p50 * 2.0, "gbps": gbps,
               "one_way_hist": [[1000, 5], [2000, 5]]})
    }

    #[test]
    fn ratios_match_placements_and_targets_judge() {
        let rows: Vec<R> = [
            row("bridge", "c1 s1", "rr", 64, 6.0, 0.0),
            row("bridge", "c0 s1", "rr", 64, 30.0, 0.0),
            row("docknet", "c1 s1 m0", "rr", 64, 3.0, 0.0),
            row("docknet-fc", "c0 s1", "rr", 64, 1.5, 0.0),
            row("loopback", "c1 s1", "rr", 64, 2.0, 0.0),
        ]
        .iter()
        .filter_map(R::from)
        .collect();
        assert_eq!(ratio(&rows, &rows[2]), Some(2.0), "docknet vs bridge c1 s1");
        assert_eq!(ratio(&rows, &rows[3]), Some(20.0), "fc vs bridge c0 s1");
        let t = targets_of(&rows);
        assert!(
            t.iter()
                .any(|l| l.starts_with("docknet-fc 64 B") && l.ends_with(", MET")),
            "{t:?}"
        );
        // loopback (2.0) beats the daemon path (3.0)
        assert!(
            t.iter()
                .any(|l| l.contains("every kernel mode") && l.ends_with("NOT MET")),
            "{t:?}"
        );
    }

    #[test]
    fn text_from_results_is_escaped_in_the_page() {
        let font = PathBuf::from(DEFAULT_FONT);
        if !font.exists() {
            eprintln!("skipping: no DejaVu font (scripts/setup.sh installs fonts-dejavu-core)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("r.json");
        let doc = json!({"env": {"command": "<script>alert(1)</script>"},
            "results": [], "summary": [row("<b>evil</b>", "c0 s1", "rr", 64, 1.0, 0.0)],
            "not_available": [{"mode": "x", "status": "skipped", "reason": "<img src=x>"}]});
        std::fs::write(&f, doc.to_string()).unwrap();
        let out = dir.path().join("out");
        let index = run(&ReportArgs {
            files: vec![f],
            out: out.clone(),
            font,
        })
        .unwrap();
        let html = std::fs::read_to_string(index).unwrap();
        assert!(html.contains("&lt;b&gt;evil&lt;/b&gt;") && !html.contains("<b>evil"));
        assert!(!html.contains("<script>alert") && !html.contains("<img src=x>"));
        let svg = std::fs::read_to_string(out.join("figures/cdf-rr-64.svg")).unwrap();
        assert!(svg.contains("&lt;b&gt;evil") && !svg.contains("<b>evil"));
    }

    #[test]
    fn hostile_rows_are_dropped_not_fatal() {
        let doc = json!({"results": [], "summary": [
            {"mode": 3}, {"mode": "x", "workload": "rr"}, "junk",
            {"mode": "bridge", "workload": "rr", "msg_size": 64, "p50_us": "fast",
             "one_way_hist": [[-1, 2], ["a", 1], [5]]}
        ]});
        let rows = rows_of(&doc);
        assert_eq!(rows.len(), 1);
        assert!(rows[0].p50.is_none() && rows[0].hist.is_empty());
        // charts of such rows are empty, not a panic
        let _ = charts(&rows);
    }
}
