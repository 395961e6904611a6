//! `docknet report FILE.json... --out DIR`: the lab's report from `docknet bench` results.
//! Writes `DIR/index.html` (a one-screen summary, the targets, the figures and the tables),
//! `DIR/report.md` (the same in Markdown) and the figures as PNG and SVG in `DIR/figures/`.
//!
//! A results file is untrusted input: it is read leniently ([`Results::parse`]), and every text
//! from it is escaped in the page and the figures.

pub mod charts;
pub mod html;
pub mod markdown;
pub mod seeds;
pub mod table;

use crate::mode::Topology;
use crate::row::{Env, Results, Row, Workload};
use crate::verdict::{headlines, targets, Headline, Verdict};
use anyhow::{bail, Context, Result};
use charts::{at_mtu, link_mtus, Chart};
use std::path::{Path, PathBuf};

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
    #[arg(long, env = "DOCKNET_FONT", default_value = charts::DEFAULT_FONT)]
    pub font: PathBuf,
    /// Also write the one-host summary table (each mode's best figures) into FILE, between
    /// the lines `<!-- docknet report: summary -->` and `<!-- /docknet report: summary -->`,
    /// with the date and the commands of the runs behind it. Run on README.md after
    /// `FULL=1 ./scripts/bench.sh`, so the README's table is that run's.
    #[arg(long, value_name = "FILE")]
    pub readme: Option<PathBuf>,
}

/// The line that opens the generated block in a README.
pub const README_BEGIN: &str = "<!-- docknet report: summary -->";
/// The line that closes it.
pub const README_END: &str = "<!-- /docknet report: summary -->";

/// `text` with the lines between [`README_BEGIN`] and [`README_END`] replaced by `block`;
/// the markers stay, everything outside them is kept byte for byte.
pub fn splice(text: &str, block: &str) -> Result<String> {
    let begin = text
        .find(README_BEGIN)
        .with_context(|| format!("no line {README_BEGIN} to write the summary after"))?;
    let from = begin + README_BEGIN.len();
    let end = text[from..]
        .find(README_END)
        .map(|e| from + e)
        .with_context(|| format!("no line {README_END} after {README_BEGIN}"))?;
    let block = block.trim_end_matches('\n');
    Ok(format!("{}\n{block}\n{}", &text[..from], &text[end..]))
}

/// What a report shows of one topology (one host, or two hosts).
#[derive(Debug)]
pub struct Section {
    /// The topology.
    pub topology: Topology,
    /// Its summary rows.
    pub rows: Vec<Row>,
    /// The targets judged on them.
    pub targets: Vec<Verdict>,
    /// The opening table, per link MTU (`None`: the run had one).
    pub headlines: Vec<(Option<u32>, Vec<Headline>)>,
    /// The figures.
    pub charts: Vec<Chart>,
}

impl Section {
    fn of(topology: Topology, rows: Vec<Row>, wire_gbps: Option<f64>) -> Section {
        let mtus = link_mtus(&rows);
        let headlines = if mtus.len() <= 1 {
            vec![(None, headlines(&rows))]
        } else {
            mtus.iter()
                .map(|m| (Some(*m), headlines(&at_mtu(&rows, *m))))
                .collect()
        };
        let mut charts = charts::charts(&rows);
        if topology == Topology::TwoHost {
            for c in &mut charts {
                c.file = format!("two-host-{}", c.file);
                c.title = format!("Two hosts: {}", c.title);
            }
        }
        Section {
            topology,
            targets: targets(&rows, wire_gbps),
            charts,
            headlines,
            rows,
        }
    }

    /// The workloads present, in order.
    pub fn workloads(&self) -> Vec<Workload> {
        [Workload::Rr, Workload::Stream, Workload::Pairs]
            .into_iter()
            .filter(|w| self.rows.iter().any(|r| r.workload == *w))
            .collect()
    }

    /// The result tables: per workload present, every row's cells under
    /// [`table::COLUMNS`].
    pub fn tables(&self) -> Vec<(Workload, Vec<Vec<String>>)> {
        self.workloads()
            .into_iter()
            .map(|wl| {
                let cells = self
                    .rows
                    .iter()
                    .filter(|x| x.workload == wl)
                    .map(|x| table::cells(&self.rows, x).to_vec())
                    .collect();
                (wl, cells)
            })
            .collect()
    }

    /// The section's heading.
    pub fn heading(&self) -> String {
        match self.topology {
            Topology::OneHost => "One host".into(),
            Topology::TwoHost => "Two hosts".into(),
        }
    }
}

/// What a report shows of the rate-limit experiment.
#[derive(Debug)]
pub struct RateSection {
    /// Its phases.
    pub phases: Vec<crate::rate::Phase>,
    /// The targets judged on them.
    pub targets: Vec<Verdict>,
    /// A timeline per mode and scenario.
    pub charts: Vec<Chart>,
}

impl RateSection {
    fn of(rows: &[Row]) -> Option<RateSection> {
        let phases = crate::rate::phases(rows);
        (!phases.is_empty()).then(|| RateSection {
            targets: crate::rate::targets(&phases),
            charts: charts::rate_charts(rows),
            phases,
        })
    }
}

/// What a report shows of the HTTP benchmark.
#[derive(Debug)]
pub struct HttpSection {
    /// Its summary rows.
    pub rows: Vec<Row>,
    /// The targets judged on them.
    pub targets: Vec<Verdict>,
    /// Requests/s against connections, latency CDFs.
    pub charts: Vec<Chart>,
}

/// Everything a report shows, computed from the results before anything is written.
#[derive(Debug)]
pub struct Report {
    /// One section per topology present (one host first).
    pub sections: Vec<Section>,
    /// The rate-limit experiment, if the results have it.
    pub rate: Option<RateSection>,
    /// The idle host's rows (`docknet bench idle`), if any.
    pub idle: Vec<Row>,
    /// The HTTP rows (`docknet bench http`), with their targets and figures.
    pub http: Option<HttpSection>,
    /// The seed studies (start-up, CPU quota, the bridge's fixed cost), if any.
    pub seeds: Option<seeds::SeedSection>,
    /// The files' environments (the first is the report's).
    pub envs: Vec<Env>,
    /// Modes without figures, as lines (each once).
    pub missing: Vec<String>,
    /// The cross-core handoff probe's readings before every run's point (`xcore_us`), sorted.
    pub xcore: Vec<f64>,
}

impl Report {
    /// The report of several results files.
    pub fn of(files: &[Results]) -> Report {
        let all: Vec<Row> = files.iter().flat_map(|f| f.rows().to_vec()).collect();
        let (rate, rows): (Vec<Row>, Vec<Row>) =
            all.into_iter().partition(|r| r.workload == Workload::Rate);
        let (idle, rows): (Vec<Row>, Vec<Row>) =
            rows.into_iter().partition(|r| r.workload == Workload::Idle);
        let (http, rows): (Vec<Row>, Vec<Row>) = rows
            .into_iter()
            .partition(|r| matches!(r.workload, Workload::Http | Workload::Nat));
        let (seed_rows, rows): (Vec<Row>, Vec<Row>) = rows.into_iter().partition(|r| {
            matches!(
                r.workload,
                Workload::Startup | Workload::Cpuquota | Workload::Chain
            )
        });
        let seeds = seeds::SeedSection::of(
            seed_rows,
            &rows
                .iter()
                .filter(|r| r.topology == Topology::OneHost)
                .cloned()
                .collect::<Vec<_>>(),
        );
        let mut missing: Vec<String> = Vec::new();
        for line in files
            .iter()
            .flat_map(|f| &f.not_available)
            .map(|x| x.line())
        {
            if !missing.contains(&line) {
                missing.push(line);
            }
        }
        let wire_gbps = files.iter().find_map(|f| f.env.wire_gbps);
        let sections = [Topology::OneHost, Topology::TwoHost]
            .into_iter()
            .filter_map(|t| {
                let of: Vec<Row> = rows.iter().filter(|r| r.topology == t).cloned().collect();
                (!of.is_empty()).then(|| Section::of(t, of, wire_gbps))
            })
            .collect();
        Report {
            sections,
            rate: RateSection::of(&rate),
            idle,
            http: (!http.is_empty()).then(|| HttpSection {
                targets: [
                    crate::http::targets(&http),
                    crate::http::nat_targets(&http),
                    crate::http::cluster_targets(&http),
                ]
                .concat(),
                charts: charts::http_charts(&http),
                rows: http,
            }),
            seeds,
            envs: files.iter().map(|f| f.env.clone()).collect(),
            missing,
            xcore: {
                let mut x: Vec<f64> = files
                    .iter()
                    .flat_map(|f| f.results.iter().filter_map(|r| r.xcore_us))
                    .collect();
                x.sort_by(f64::total_cmp);
                x
            },
        }
    }

    /// The cross-core handoff probe's readings in one sentence (none: no reading).
    pub fn xcore_line(&self) -> Option<String> {
        let x = &self.xcore;
        let (lo, hi) = (x.first()?, x.last()?);
        Some(format!(
            "The machine's cross-core handoff (a core writing 32 KiB another core has just \
             read), probed before each rr, stream and chain point: {lo:.2} to {hi:.2} us, \
             median {:.2}, over {} points. Every frame through DockNet's daemon takes this \
             step twice; on a VM its cost moves with the host's placement of the vCPUs, and \
             the daemon path's large messages with it.",
            x[x.len() / 2],
            x.len()
        ))
    }

    /// Every section's figures.
    pub fn charts(&self) -> impl Iterator<Item = &Chart> {
        self.sections
            .iter()
            .flat_map(|s| s.charts.iter())
            .chain(self.rate.iter().flat_map(|r| r.charts.iter()))
            .chain(self.http.iter().flat_map(|h| h.charts.iter()))
            .chain(self.seeds.iter().flat_map(|s| s.charts.iter()))
    }

    /// Every section's targets.
    pub fn targets(&self) -> impl Iterator<Item = &Verdict> {
        self.sections
            .iter()
            .flat_map(|s| s.targets.iter())
            .chain(self.rate.iter().flat_map(|r| r.targets.iter()))
            .chain(self.http.iter().flat_map(|h| h.targets.iter()))
    }

    /// The report's environment: the first file's.
    pub fn env(&self) -> Env {
        self.envs.first().cloned().unwrap_or_default()
    }
}

/// Rebuilds the report of a `--report DIR` directory from every `tcp-*.json` in it,
/// `rate.json` and `idle.json`.
pub fn build_dir(dir: &Path) -> Result<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            // IPv6 runs (`--ipv6`) stay out: the report's tables and figures are keyed by mode
            // and would mix the two families; their own tcp-*-ipv6.md has their table
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                (n.starts_with("tcp-") && n.ends_with(".json") && !n.ends_with("-ipv6.json"))
                    || n == "rate.json"
                    || n == "idle.json"
            })
        })
        .collect();
    files.sort();
    run(&ReportArgs {
        files,
        out: dir.to_path_buf(),
        font: std::env::var_os("DOCKNET_FONT")
            .map(PathBuf::from)
            .unwrap_or_else(|| charts::DEFAULT_FONT.into()),
        readme: None,
    })
}

/// What the HTTP table says, in words.
pub const HTTP_TEXT: &str = "docknet-httpd (the project's HTTP/1.1 server, one event loop, one \
    program for kernel and DockLib sockets) loaded by docknet-load (likewise) on every mode; on \
    kernel modes also by wrk (the cross-check of the generator), and nginx (a master and one \
    worker per core, as Debian ships it; static file, keep-alive) loaded by wrk: the server \
    people deploy, on kernel modes and, unmodified under the preload library, in the preload modes. Keep-alive connections, one \
    request outstanding each; latency per request from the generator (wrk reports no p99.9); \
    CPU per request is the whole machine's, from /proc/stat.";

/// Column heads of the HTTP table.
pub const HTTP_COLUMNS: [&str; 10] = [
    "mode",
    "server",
    "load generator",
    "cores",
    "connections",
    "requests/s",
    "p50 (us)",
    "p99 (us)",
    "p99.9 (us)",
    "CPU us/request",
];

/// The HTTP rows as cells under [`HTTP_COLUMNS`].
pub fn http_cells(rows: &[Row]) -> Vec<Vec<String>> {
    let opt = |v: Option<f64>, p: usize| v.map_or("-".into(), |x| format!("{x:.p$}"));
    rows.iter()
        .filter(|r| r.workload == Workload::Http && r.backends.is_none())
        .map(|r| {
            vec![
                r.mode.name().to_string(),
                r.server.clone().unwrap_or_else(|| "-".into()),
                r.tool.name().to_string(),
                r.cores.clone(),
                r.connections.map_or("-".into(), |c| c.to_string()),
                opt(r.req_per_s, 0),
                opt(r.p50_us, 1),
                opt(r.p99_us, 1),
                opt(r.p999_us, 1),
                opt(r.cpu_s_per_op.map(|c| c * 1e6), 2),
            ]
        })
        .collect()
}

/// Column heads of the idle host's table.
pub const IDLE_COLUMNS: [&str; 6] = [
    "path",
    "idle policy",
    "waiting containers",
    "CPU, % of one core",
    "first packet p50 (us)",
    "p99 (us)",
];

/// The idle host's rows as cells under [`IDLE_COLUMNS`].
pub fn idle_cells(rows: &[Row]) -> Vec<Vec<String>> {
    let opt = |v: Option<f64>, p: usize| v.map_or("-".into(), |x| format!("{x:.p$}"));
    rows.iter()
        .map(|r| {
            vec![
                match r.mode {
                    crate::mode::Mode::Docknet => "docknet (through the daemon)".into(),
                    crate::mode::Mode::DocknetFc => "docknet-fc (fast channel)".into(),
                    m => format!("{m} (kernel, reference)"),
                },
                r.idle.clone().unwrap_or_else(|| "-".into()),
                r.containers.map_or("-".into(), |n| n.to_string()),
                opt(r.cpu_pct_of_core, 2),
                opt(r.p50_us, 1),
                opt(r.p99_us, 1),
            ]
        })
        .collect()
}

/// What the idle host's table says, in words.
pub const IDLE_TEXT: &str = "A daemon and N containers, each a DockLib server waiting in accept:     CPU of all of them together over the window (exact, from each task's schedstat), then the     one-way latency of a 64-byte request sent after one second of idle, through the daemon, over     a fast channel, and over the kernel's loopback in a namespace of its own (the machine's cost     of waking a sleeping thread).";

/// Runs `docknet report`; returns the path of `index.html`.
pub fn run(args: &ReportArgs) -> Result<PathBuf> {
    if args.files.is_empty() {
        bail!("no results files given");
    }
    let mut files = Vec::new();
    for f in &args.files {
        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        files.push(Results::parse(&bytes).with_context(|| format!("{}", f.display()))?);
    }
    let report = Report::of(&files);
    charts::register_font(&args.font)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    for c in report.charts() {
        charts::render(&args.out, c)?;
    }
    let index = args.out.join("index.html");
    std::fs::write(&index, html::page(&report))
        .with_context(|| format!("writing {}", index.display()))?;
    let md = args.out.join("report.md");
    std::fs::write(&md, markdown::report(&report))
        .with_context(|| format!("writing {}", md.display()))?;
    if let Some(readme) = &args.readme {
        let block = markdown::readme_summary(&report)
            .context("--readme: the results have no one-host rr or stream rows to summarize")?;
        let text = std::fs::read_to_string(readme)
            .with_context(|| format!("reading {}", readme.display()))?;
        let new = splice(&text, &block).with_context(|| format!("{}", readme.display()))?;
        if new != text {
            std::fs::write(readme, new).with_context(|| format!("writing {}", readme.display()))?;
        }
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(mode: &str, cores: &str, wl: &str, size: u64, p50: f64) -> serde_json::Value {
        json!({"mode": mode, "cores": cores, "tool": "dnperf", "workload": wl, "msg_size": size,
               "mtu": 1500, "p50_us": p50, "p99_us": p50 * 2.0, "gbps": 1.0,
               "one_way_hist": [[1000, 5], [2000, 5]]})
    }

    #[test]
    fn text_from_results_is_escaped_in_the_page() {
        let font = PathBuf::from(charts::DEFAULT_FONT);
        if !font.exists() {
            eprintln!("skipping: no DejaVu font (scripts/setup.sh installs fonts-dejavu-core)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("r.json");
        let doc = json!({"env": {"command": "<script>alert(1)</script>"},
            "results": [], "summary": [row("bridge", "<b>evil</b>", "rr", 64, 1.0)],
            "not_available": [{"mode": "x", "status": "skipped", "reason": "<img src=x>"}]});
        std::fs::write(&f, doc.to_string()).unwrap();
        let out = dir.path().join("out");
        let index = run(&ReportArgs {
            files: vec![f],
            out: out.clone(),
            font,
            readme: None,
        })
        .unwrap();
        let html = std::fs::read_to_string(index).unwrap();
        assert!(html.contains("&lt;b&gt;evil&lt;/b&gt;") && !html.contains("<b>evil"));
        assert!(!html.contains("<script>alert") && !html.contains("<img src=x>"));
        let svg = std::fs::read_to_string(out.join("figures/cdf-rr-64.svg")).unwrap();
        assert!(svg.contains("&lt;b&gt;evil") && !svg.contains("<b>evil"));
    }

    #[test]
    fn the_readme_block_is_replaced_between_its_markers_and_nowhere_else() {
        let text = format!("# Title\n\nbefore\n{README_BEGIN}\nold table\n{README_END}\nafter\n");
        let once = splice(&text, "new table\n").unwrap();
        assert_eq!(
            once,
            format!("# Title\n\nbefore\n{README_BEGIN}\nnew table\n{README_END}\nafter\n")
        );
        assert_eq!(splice(&once, "new table").unwrap(), once, "idempotent");
        assert!(splice("no markers\n", "x").is_err());
        assert!(splice(&format!("{README_END}\n{README_BEGIN}\n"), "x").is_err());
    }

    #[test]
    fn the_readme_summary_says_when_and_how_it_was_measured() {
        let mut env = json!({"command": "docknet bench rr --modes bridge,docknet-fc",
            "unix_time": 1_795_000_000u64, "cores": 2, "duration_s": 1.0, "warmup_s": 0.2,
            "repeat": 1, "kernel": "6.18.0"});
        let rr = json!({"env": env.clone(), "results": [],
            "summary": [row("bridge", "c1 s1", "rr", 64, 4.0), row("docknet-fc", "c0 s1", "rr", 64, 1.0)]});
        env["command"] = "docknet bench stream --modes bridge".into();
        env["unix_time"] = 1_795_000_300u64.into();
        let st = json!({"env": env, "results": [], "summary": [row("bridge", "c0 s1", "stream", 1024, 0.0)]});
        let r = Report::of(&[
            Results::parse(rr.to_string().as_bytes()).unwrap(),
            Results::parse(st.to_string().as_bytes()).unwrap(),
        ]);
        let m = markdown::readme_summary(&r).unwrap();
        assert!(
            m.starts_with("Measured on 2026-11-18 (kernel 6.18.0, 2 cores"),
            "{m}"
        );
        assert!(
            m.contains("- `docknet bench rr --modes bridge,docknet-fc`"),
            "{m}"
        );
        assert!(m.contains("- `docknet bench stream --modes bridge`"), "{m}");
        assert!(m.contains("1.00 us [c0 s1]") && m.contains("4.00x"), "{m}");
        let empty = json!({"env": {}, "results": [], "summary": []});
        let r = Report::of(&[Results::parse(empty.to_string().as_bytes()).unwrap()]);
        assert_eq!(markdown::readme_summary(&r), None);
    }

    #[test]
    fn the_cross_core_probe_is_summed_up_from_every_run() {
        let mut a = row("docknet", "c1 s1 m0", "rr", 65536, 14.0);
        let mut b = row("docknet", "c1 s1 m0", "rr", 65536, 38.0);
        let c = row("bridge", "c1 s1", "rr", 65536, 19.0);
        a["xcore_us"] = 4.2.into();
        b["xcore_us"] = 27.5.into();
        let doc = json!({"env": {}, "results": [a, b, c.clone()], "summary": [c.clone()]});
        let r = Report::of(&[Results::parse(doc.to_string().as_bytes()).unwrap()]);
        assert_eq!(r.xcore, [4.2, 27.5]);
        let line = r.xcore_line().unwrap();
        assert!(
            line.contains("4.20 to 27.50 us") && line.contains("over 2 points"),
            "{line}"
        );
        assert!(markdown::report(&r).contains(&line));
        let none = json!({"env": {}, "results": [c.clone()], "summary": [c]});
        let r = Report::of(&[Results::parse(none.to_string().as_bytes()).unwrap()]);
        assert_eq!(r.xcore_line(), None);
    }

    #[test]
    fn two_host_rows_get_a_section_of_their_own_against_host() {
        let mut h = row("host", "c0 s1", "rr", 64, 8.0);
        h["topology"] = "two-host".into();
        let mut d = row("docknet", "c0 s1 m0 m1", "rr", 64, 4.0);
        d["topology"] = "two-host".into();
        let b = row("bridge", "c0 s1", "rr", 64, 6.0);
        let one = row("docknet", "c0 s1", "rr", 64, 2.0);
        let doc = json!({"env": {}, "results": [], "summary": [h, d, b, one]});
        let r = Report::of(&[Results::parse(doc.to_string().as_bytes()).unwrap()]);
        let t: Vec<Topology> = r.sections.iter().map(|s| s.topology).collect();
        assert_eq!(t, [Topology::OneHost, Topology::TwoHost]);
        let two = &r.sections[1];
        assert_eq!(two.rows.len(), 2);
        let dh = two.headlines[0]
            .1
            .iter()
            .find(|x| x.mode.name() == "docknet")
            .unwrap();
        assert_eq!(dh.p50_ratio, Some(2.0), "against host, not bridge");
        assert!(two.charts.iter().all(|c| c.file.starts_with("two-host-")));
        let one_dn = r.sections[0].headlines[0]
            .1
            .iter()
            .find(|x| x.mode.name() == "docknet")
            .unwrap();
        assert_eq!(one_dn.p50_ratio, Some(3.0));
        let page = html::page(&r);
        assert!(page.contains("Two hosts") && page.contains("vs host"));
    }

    #[test]
    fn the_report_opens_with_a_summary_table_per_mtu() {
        let mut a = row("bridge", "c0 s1", "rr", 64, 8.0);
        let b = row("docknet-fc", "c0 s1", "rr", 64, 1.0);
        let mut c = row("bridge", "c0 s1", "rr", 64, 9.0);
        c["mtu"] = 9000.into();
        let d = row("loopback", "c1 s1", "rr", 64, 3.0);
        a["cores"] = "c0 s1".into();
        let doc = json!({"env": {}, "results": [], "summary": [a, b, c, d]});
        let r = Report::of(&[Results::parse(doc.to_string().as_bytes()).unwrap()]);
        assert_eq!(r.sections.len(), 1);
        let h = &r.sections[0].headlines;
        let mtus: Vec<Option<u32>> = h.iter().map(|h| h.0).collect();
        assert_eq!(mtus, [Some(1500), Some(9000)]);
        let at1500: Vec<&str> = h[0].1.iter().map(|h| h.mode.name()).collect();
        assert_eq!(at1500, ["bridge", "docknet-fc", "loopback"]);
        assert_eq!(h[0].1[1].p50_ratio, Some(8.0));
        let page = html::page(&r);
        let summary = page.find("Summary").unwrap();
        assert!(
            summary < page.find("Figures").unwrap(),
            "the summary comes first"
        );
    }
}
