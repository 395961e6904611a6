//! `docknet bench rr|stream|pairs --modes ...`: TCP measured by `dnperf` (one program, one code
//! path for kernel and DockLib sockets) over each network mode, side by side in one run, with
//! sockperf and iperf3 beside it on the kernel modes when asked (`--crosscheck`).
//!
//! Every topology is built fresh in namespaces of its own ([`crate::netns`]) or on a daemon of
//! its own with a private run directory ([`Daemon`]), and removed afterwards, also on failure
//! or Ctrl-C. A mode that cannot exist here is reported as "not available here" with the reason;
//! a mode that fails while being built or measured is reported as skipped with the error, and
//! the other modes still run.

use crate::bench::{
    env_json, md_header, md_placement, md_results, summarize, table, us, Daemon, Proc, Row,
    SERVER_START,
};
use crate::netns::{unavailable, KernelLab, LabOpts, Pair, KERNEL_MODES};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// DockNet modes.
pub const DOCKNET_MODES: &[&str] = &["docknet", "docknet-fc"];
/// Modes that need what this machine may not have; checked at run time and reported as "not
/// available here" with the reason, never as a number.
pub const CHECKED_MODES: &[&str] = &["sriov"];

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Ping-pong latency over a size sweep.
    Rr,
    /// Goodput over a size sweep.
    Stream,
    /// N concurrent pairs: aggregate goodput, per-pair latency, memory per pair.
    Pairs,
}

impl Load {
    /// The name used in results (`workload`).
    pub fn name(self) -> &'static str {
        match self {
            Load::Rr => "rr",
            Load::Stream => "stream",
            Load::Pairs => "pairs",
        }
    }

    fn default_sizes(self) -> Vec<usize> {
        match self {
            Load::Rr => vec![64, 1024, 65536],
            Load::Stream => vec![64, 256, 1024, 4096, 16384, 65536, 409600],
            Load::Pairs => vec![1024],
        }
    }
}

/// Options of `docknet bench rr|stream|pairs`.
#[derive(Debug, Clone, clap::Args)]
pub struct TcpBenchArgs {
    /// Modes to compare. Kernel: loopback, container (shared netns), veth, bridge, bridge-nat
    /// (port mapping), macvlan, ipvlan (where the kernel has it), ovs (Open vSwitch userspace
    /// datapath, where installed). DockNet: docknet (through the daemon), docknet-fc (fast
    /// channel). sriov is probed and reported as not available where it cannot run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bridge,docknet,docknet-fc"
    )]
    pub modes: Vec<String>,
    /// Message sizes in bytes [default: rr 64,1024,65536; stream
    /// 64,256,1024,4096,16384,65536,409600; pairs 1024].
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// Numbers of concurrent pairs (pairs workload).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64,128")]
    pub pairs: Vec<usize>,
    /// Measured seconds per point.
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Warm-up seconds per point (excluded).
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Runs per point (the table shows all runs together; every run is in the JSON).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Link MTUs to measure at (DockNet: the pipes' MTU). loopback and container cross `lo`
    /// (MTU 65536) and run once.
    #[arg(long, value_delimiter = ',', default_value = "1500")]
    pub mtus: Vec<u32>,
    /// rr and stream: also measure the kernel modes with sockperf (rr) and iperf3 (stream),
    /// client core 0 and server core 1, as a cross-check of dnperf (rows with `tool` sockperf /
    /// iperf3).
    #[arg(long)]
    pub crosscheck: bool,
    /// Write all results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write tcp-WORKLOAD.json and tcp-WORKLOAD.md into this directory, and (re)build its HTML
    /// report from every tcp-*.json there (index.html, report.md, figures/).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// A mode that did not run, and why.
#[derive(Debug, Clone)]
struct Skip {
    mode: String,
    mtu: Option<u32>,
    status: &'static str,
    reason: String,
}

/// The progress over the sweep: a bar on a terminal, one line per point otherwise (logs).
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    done: u64,
}

impl Progress {
    fn new(total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:30.cyan/blue} {pos}/{len} points, {elapsed} (eta {eta}) {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        });
        Progress {
            bar,
            total,
            done: 0,
        }
    }

    fn start(&self, what: &str) {
        if let Some(b) = &self.bar {
            b.set_message(what.to_string());
        }
    }

    fn line(&self, s: &str) {
        match &self.bar {
            Some(b) => b.println(s),
            None => eprintln!("{s}"),
        }
    }

    fn done(&mut self, s: &str) {
        self.done += 1;
        match &self.bar {
            Some(b) => {
                b.inc(1);
                b.println(s);
            }
            None => eprintln!("[{}/{}] {s}", self.done, self.total),
        }
    }

    fn skip(&mut self, n: u64) {
        self.done += n;
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

struct Ctx {
    exe: PathBuf,
    dnperf: PathBuf,
    args: TcpBenchArgs,
    load: Load,
    sizes: Vec<usize>,
    stop: Arc<AtomicBool>,
    rows: Vec<Row>,
    port: u16,
    skipped: Vec<Skip>,
    progress: Progress,
}

/// The two kernel placements: client and server on one core, and on two cores.
const KERNEL_PLACEMENTS: [(usize, usize); 2] = [(1, 1), (0, 1)];

/// MemAvailable from /proc/meminfo, KiB.
fn mem_available_kib() -> Option<f64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The fall in MemAvailable since `before` (KiB), per `n`; never negative.
fn fall_per(before: Option<f64>, n: usize) -> Option<f64> {
    Some(((before? - mem_available_kib()?) / n as f64).max(0.0))
}

/// Whether `mode` crosses only `lo` (its MTU is fixed).
fn lo_only(mode: &str) -> bool {
    mode == "loopback" || mode == "container"
}

impl Ctx {
    fn timeout(&self, n: usize) -> Duration {
        Duration::from_secs_f64(self.args.duration + self.args.warmup + 30.0 + n as f64 * 0.2)
    }

    fn check_stop(&self) -> Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    }

    /// The MTUs `mode` runs at.
    fn mtus(&self, mode: &str) -> Vec<u32> {
        if lo_only(mode) {
            self.args.mtus.iter().take(1).copied().collect()
        } else {
            self.args.mtus.clone()
        }
    }

    /// How many points `mode` contributes per MTU (for the progress bar).
    fn points(&self, mode: &str) -> usize {
        let sizes = self.sizes.len();
        let per_rep = match self.load {
            Load::Pairs => self.args.pairs.len() * sizes,
            _ if KERNEL_MODES.contains(&mode) => {
                KERNEL_PLACEMENTS.len() * sizes + if self.args.crosscheck { sizes } else { 0 }
            }
            _ => sizes,
        };
        per_rep * self.args.repeat
    }

    /// dnperf's arguments: a server, or (with `client` = workload and size) a client.
    fn dnperf_args(
        &self,
        stack: &str,
        addr: &str,
        cpu: Option<usize>,
        idle: &str,
        client: Option<(&str, usize)>,
    ) -> Vec<String> {
        let role = if client.is_some() { "client" } else { "server" };
        let mut v: Vec<String> = vec![role.into(), "--stack".into(), stack.into()];
        if let Some(c) = cpu {
            v.extend(["--cpu".into(), c.to_string()]);
        }
        v.extend(["--idle".into(), idle.into()]);
        if let Some((wl, size)) = client {
            v.extend([
                "--connect".into(),
                addr.into(),
                "--workload".into(),
                wl.into(),
                "--size".into(),
                size.to_string(),
                "--duration".into(),
                self.args.duration.to_string(),
                "--warmup".into(),
                self.args.warmup.to_string(),
                "--json".into(),
            ]);
        } else {
            v.extend(["--bind".into(), addr.into(), "--conns".into(), "1".into()]);
        }
        v
    }

    /// A row from a dnperf client's JSON.
    fn dnperf_row(
        &self,
        mode: &str,
        placement: &str,
        cores: &str,
        size: usize,
        rep: usize,
        v: &Value,
    ) -> Row {
        let r = &v["result"];
        let ow = &r["one_way_ns"];
        let hist: Option<Vec<[u64; 2]>> = serde_json::from_value(r["one_way_hist"].clone()).ok();
        Row {
            tool: "dnperf".into(),
            mtu: v["env"]["mtu"].as_u64().map(|m| m as u32),
            p50_us: us(ow, "p50"),
            p99_us: us(ow, "p99"),
            p999_us: us(ow, "p999"),
            mean_us: us(ow, "mean"),
            half_rtt_p50_us: us(&r["half_rtt_ns"], "p50"),
            tps: r["tps"].as_f64().filter(|_| v["workload"] == "rr"),
            gbps: r["gbps"].as_f64(),
            msgs_per_s: r["msgs_per_s"].as_f64(),
            cpu_s_per_op: r["cpu_s_per_op"].as_f64(),
            one_way_hist: hist,
            ..Row::new(mode, placement, cores, self.load.name(), size, rep)
        }
    }

    fn push(&mut self, row: Row) {
        let what = match (row.pairs, row.p50_us, row.gbps) {
            (Some(n), p, g) => format!(
                "{n} pairs: {:.2} Gbps total, p50 {:.2} us, {:.0} KiB/pair",
                g.unwrap_or(0.0),
                p.unwrap_or(0.0),
                row.mem_kib_per_pair.unwrap_or(0.0)
            ),
            (None, Some(p), _) => format!("p50 {p:.2} us"),
            (None, None, g) => format!("{:.2} Gbps", g.unwrap_or(0.0)),
        };
        self.progress.done(&format!(
            "  {:<11} {:<8} {:<8} {} {:>6} B mtu {}: {what}",
            row.path,
            row.cores,
            row.tool,
            row.workload,
            row.size,
            row.mtu.map_or("-".into(), |m| m.to_string())
        ));
        self.rows.push(row);
    }

    // ----- kernel modes -----

    fn in_ns(&self, ns: &str, prog: &Path, args: Vec<String>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(prog).args(args);
        c
    }

    fn kernel(&mut self, mode: &str, mtu: u32) -> Result<()> {
        let npairs = match self.load {
            Load::Pairs => self.args.pairs.iter().copied().max().unwrap_or(1),
            _ => 1,
        };
        // the topology's own memory counts only for pairs
        let mem0 = (self.load == Load::Pairs).then(mem_available_kib).flatten();
        let lab = KernelLab::build(mode, LabOpts { pairs: npairs, mtu })
            .with_context(|| format!("building the {mode} topology"))?;
        if self.load == Load::Pairs {
            let topo_kib = fall_per(mem0, npairs).unwrap_or(0.0);
            return self.pairs_sweep(mode, &Fleet::Kernel(&lab), topo_kib);
        }
        let p = lab.pairs[0].clone();
        for rep in 0..self.args.repeat {
            for (cc, sc) in KERNEL_PLACEMENTS {
                let placement = format!(
                    "client core {cc}, server core {sc}, kernel TCP ({mode}, built with {})",
                    lab.builder
                );
                let short = format!("c{cc} s{sc}");
                for size in self.sizes.clone() {
                    self.check_stop()?;
                    self.progress.start(&format!("{mode} {short} {size} B"));
                    let v = self.kernel_point(&p, Some((cc, sc)), self.load.name(), size)?;
                    let mut row = self.dnperf_row(mode, &placement, &short, size, rep, &v);
                    row.builder = Some(lab.builder.into());
                    self.push(row);
                }
            }
            if self.args.crosscheck {
                for size in self.sizes.clone() {
                    self.check_stop()?;
                    self.crosscheck(mode, &lab, &p, size, rep)?;
                }
            }
        }
        Ok(())
    }

    /// One dnperf measurement on a kernel pair: server, then client; the client's JSON.
    fn kernel_point(
        &self,
        p: &Pair,
        cores: Option<(usize, usize)>,
        wl: &str,
        size: usize,
    ) -> Result<Value> {
        let server = self.kernel_server(p, cores.map(|c| c.1))?;
        let v = self
            .kernel_client(p, cores.map(|c| c.0), wl, size)?
            .json(self.timeout(1), &self.stop)?;
        let _ = server.json(Duration::from_secs(10), &self.stop);
        Ok(v)
    }

    fn kernel_server(&self, p: &Pair, core: Option<usize>) -> Result<Proc> {
        let bind = format!("{}:{}", p.bind, p.port);
        let args = self.dnperf_args("kernel", &bind, core, "spin", None);
        Proc::spawn(
            self.in_ns(&p.server_ns, &self.dnperf, args),
            "dnperf server",
        )
    }

    fn kernel_client(&self, p: &Pair, core: Option<usize>, wl: &str, size: usize) -> Result<Proc> {
        let target = format!("{}:{}", p.target, p.port);
        let args = self.dnperf_args("kernel", &target, core, "spin", Some((wl, size)));
        Proc::spawn(
            self.in_ns(&p.client_ns, &self.dnperf, args),
            "dnperf client",
        )
    }

    /// sockperf (rr) or iperf3 (stream) on pair `p`, client core 0, server core 1.
    fn crosscheck(
        &mut self,
        mode: &str,
        lab: &KernelLab,
        p: &Pair,
        size: usize,
        rep: usize,
    ) -> Result<()> {
        let (tool, max) = if self.load == Load::Rr {
            ("sockperf", 65000)
        } else {
            ("iperf3", usize::MAX)
        };
        let skip = |me: &mut Self, why: String| {
            me.progress.done(&format!(
                "  {mode:<11} c0 s1    {tool:<8} {size} B: skipped ({why})"
            ));
            let name = format!("{mode} ({tool})");
            if !me.skipped.iter().any(|s| s.reason == why && s.mode == name) {
                me.skipped.push(Skip {
                    mode: name,
                    mtu: Some(lab.mtu),
                    status: "skipped",
                    reason: why,
                });
            }
        };
        if Command::new(tool).arg("--version").output().is_err() {
            skip(
                self,
                format!("{tool} is not installed (apt-get install {tool})"),
            );
            return Ok(());
        }
        if size > max {
            skip(self, format!("{tool} messages are at most {max} B"));
            return Ok(());
        }
        self.progress.start(&format!("{mode} {tool} {size} B"));
        let secs = (self.args.duration.ceil() as u64).max(1).to_string();
        let warm = (self.args.warmup.ceil() as u64).to_string();
        let port = p.port.to_string();
        let placement =
            format!("client core 0, server core 1, kernel TCP ({mode}), measured by {tool}");
        let mut row = Row {
            tool: tool.into(),
            mtu: Some(lab.mtu),
            builder: Some(lab.builder.into()),
            ..Row::new(mode, &placement, "c0 s1", self.load.name(), size, rep)
        };
        if tool == "sockperf" {
            let m = size.to_string();
            let (out, cpu) = self.tool_pair(
                p,
                tool,
                &["sr", "--tcp", "-i", &p.bind, "-p", &port],
                &[
                    "pp",
                    "--tcp",
                    "-i",
                    &p.target,
                    "-p",
                    &port,
                    "-m",
                    &m,
                    "-t",
                    &secs,
                    "--full-rtt",
                ],
            )?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            let pct = |q: &str| -> Option<f64> {
                text.lines()
                    .find(|l| l.contains(&format!("percentile {q} =")))
                    .and_then(|l| l.rsplit('=').next())
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .map(|rtt| rtt / 2.0)
            };
            row.p50_us = pct("50.000");
            row.p99_us = pct("99.000");
            row.p999_us = pct("99.900");
            row.half_rtt_p50_us = row.p50_us;
            // CPU of the client over every message it sent (warm-up included)
            let sent = text
                .lines()
                .find(|l| l.contains("[Total Run]"))
                .and_then(|l| l.split("SentMessages=").nth(1))
                .and_then(|v| v.split(';').next()?.trim().parse::<f64>().ok());
            row.cpu_s_per_op = sent.filter(|n| *n > 0.0).map(|n| cpu / n);
            row.mean_us = text
                .lines()
                .find_map(|l| l.split("Round trip is ").nth(1))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                .map(|rtt| rtt / 2.0);
            if row.p50_us.is_none() {
                bail!("sockperf printed no percentiles: {}", text.trim());
            }
        } else {
            let l = size.to_string();
            let (out, cpu) = self.tool_pair(
                p,
                tool,
                &["-s", "-1", "-B", &p.bind, "-p", &port],
                &[
                    "-c", &p.target, "-p", &port, "-t", &secs, "-O", &warm, "-l", &l, "-J",
                ],
            )?;
            let v: Value = serde_json::from_slice(&out.stdout).context("iperf3 printed no JSON")?;
            let bps = v["end"]["sum_received"]["bits_per_second"].as_f64();
            if bps.is_none() {
                bail!("iperf3: {}", v["error"].as_str().unwrap_or("no result"));
            }
            row.gbps = bps.map(|b| b / 1e9);
            // CPU of the client over the messages it wrote (omitted warm-up seconds included
            // in the CPU, not in the count: a slight overestimate)
            let msgs = v["end"]["sum_sent"]["bytes"]
                .as_f64()
                .map(|b| b / size as f64);
            row.cpu_s_per_op = msgs.filter(|n| *n > 0.0).map(|n| cpu / n);
            row.msgs_per_s = bps.map(|b| b / 8.0 / size as f64);
        }
        self.push(row);
        Ok(())
    }

    /// A cross-check tool on pair `p`: its server (`server` arguments) on core 1 in the server's
    /// namespace, given time to start, then its client (`client` arguments) on core 0 in the
    /// client's, run to completion. Returns the client's output and CPU seconds; the server is
    /// ended on return.
    fn tool_pair(
        &self,
        p: &Pair,
        tool: &str,
        server: &[&str],
        client: &[&str],
    ) -> Result<(std::process::Output, f64)> {
        let pinned = |ns: &str, core: &str, args: &[&str]| {
            let argv = ["-c", core, tool]
                .iter()
                .chain(args)
                .map(|s| s.to_string())
                .collect();
            self.in_ns(ns, Path::new("taskset"), argv)
        };
        let _server = Proc::spawn(pinned(&p.server_ns, "1", server), &format!("{tool} server"))?;
        std::thread::sleep(SERVER_START);
        let cpu0 = docknet_perf::stats::children_cpu_seconds();
        let out = pinned(&p.client_ns, "0", client)
            .output()
            .with_context(|| format!("running {tool}"))?;
        Ok((out, docknet_perf::stats::children_cpu_seconds() - cpu0))
    }

    // ----- DockNet modes -----

    fn docknet(&mut self, mode: &str, mtu: u32) -> Result<()> {
        let fc = mode == "docknet-fc";
        let pairs = self.load == Load::Pairs;
        let npairs = if pairs {
            self.args.pairs.iter().copied().max().unwrap_or(1)
        } else {
            1
        };
        // pairs: nothing pinned, everybody yields when idle (many containers share 2 cores)
        let extra: Vec<&str> = if fc || pairs {
            vec!["--idle", "adaptive"]
        } else {
            vec!["--idle", "spin", "--master-core", "0"]
        };
        let mem0 = pairs.then(mem_available_kib).flatten();
        let d = Daemon::start(&self.exe, &extra)?;
        let mtu_s = mtu.to_string();
        for i in 0..npairs {
            for (name, ip4) in [
                (format!("c{i}"), format!("10.78.1.{}/16", i + 1)),
                (format!("s{i}"), format!("10.78.2.{}/16", i + 1)),
            ] {
                d.ctl(
                    &self.exe,
                    &["pipe", "create", &name, "--ip", &ip4, "--mtu", &mtu_s],
                )?;
            }
            if fc {
                d.ctl(
                    &self.exe,
                    &["fc", "connect", &format!("c{i}"), &format!("s{i}")],
                )?;
            }
        }
        if pairs {
            let topo_kib = fall_per(mem0, npairs).unwrap_or(0.0);
            // Peers outnumber cores. Through the daemon every hop also needs the master, so a
            // waiting peer yields at once (a 50 us spin starves the peer it waits for when the
            // scheduler put both on one core: 54 us instead of 4.7 us p50 with one pair, see
            // benchmarks.md); fast-channel partners keep the default spin, which catches a
            // reply from the other core.
            let idle = if fc { "adaptive" } else { "adaptive:0" };
            return self.pairs_sweep(mode, &Fleet::Docknet(&d, mtu, idle), topo_kib);
        }
        let (cores, idle, placement, short) = if fc {
            (
                (0, 1),
                "spin",
                "client core 0, server core 1, both spin; daemon idle (not on the path)",
                "c0 s1",
            )
        } else {
            (
                (1, 1),
                "adaptive:0",
                "client and server share core 1 (yield when idle), daemon master core 0 spin",
                "c1 s1 m0",
            )
        };
        for rep in 0..self.args.repeat {
            for size in self.sizes.clone() {
                self.check_stop()?;
                self.progress.start(&format!("{mode} {size} B"));
                let v = self.docknet_point(&d, 0, Some(cores), idle, self.load.name(), size)?;
                let mut row = self.dnperf_row(mode, placement, short, size, rep, &v);
                row.builder = Some("docknet".into());
                row.mtu = Some(mtu);
                self.push(row);
            }
        }
        Ok(())
    }

    /// A dnperf in pair `i`'s container on daemon `d`: its server (in pipe `s{i}`), or with
    /// `client` = workload and size its client (in pipe `c{i}`), both using the server's
    /// address and `port`.
    fn docknet_peer(
        &self,
        d: &Daemon,
        i: usize,
        port: u16,
        core: Option<usize>,
        idle: &str,
        client: Option<(&str, usize)>,
    ) -> Result<Proc> {
        let addr = format!("10.78.2.{}:{port}", i + 1);
        let args = self.dnperf_args("docknet", &addr, core, idle, client);
        let (pipe, what) = match client {
            Some(_) => (format!("c{i}"), "dnperf client"),
            None => (format!("s{i}"), "dnperf server"),
        };
        Proc::spawn(self.in_pipe(d, &pipe, core, args), what)
    }

    fn in_pipe(&self, d: &Daemon, pipe: &str, core: Option<usize>, args: Vec<String>) -> Command {
        let mut c = d.cmd(&self.exe);
        c.args(["run", "--pipe", pipe]);
        if let Some(core) = core {
            c.args(["--cpu", &core.to_string()]);
        }
        c.arg("--").arg(&self.dnperf).args(args);
        c
    }

    fn docknet_point(
        &mut self,
        d: &Daemon,
        i: usize,
        cores: Option<(usize, usize)>,
        idle: &str,
        wl: &str,
        size: usize,
    ) -> Result<Value> {
        self.port += 1;
        let server = self.docknet_peer(d, i, self.port, cores.map(|c| c.1), idle, None)?;
        std::thread::sleep(SERVER_START);
        let v = self
            .docknet_peer(d, i, self.port, cores.map(|c| c.0), idle, Some((wl, size)))?
            .json(self.timeout(1), &self.stop)?;
        let _ = server.json(Duration::from_secs(10), &self.stop);
        Ok(v)
    }

    // ----- pairs -----

    /// For each N: N pairs run rr together (per-pair latency from the merged histograms), then
    /// N pairs stream together (aggregate goodput); memory per pair from MemAvailable.
    fn pairs_sweep(&mut self, mode: &str, fleet: &Fleet, topo_kib: f64) -> Result<()> {
        let placement = format!(
            "{mode}: N client/server pairs, each in containers of their own, unpinned; {}",
            match fleet {
                Fleet::Kernel(l) => format!("kernel TCP, built with {}", l.builder),
                Fleet::Docknet(_, _, idle) => format!("DockLib TCP, peers {idle}, daemon adaptive"),
            }
        );
        let mut ns = self.args.pairs.clone();
        ns.sort_unstable();
        for rep in 0..self.args.repeat {
            for size in self.sizes.clone() {
                for &n in &ns {
                    self.check_stop()?;
                    self.progress.start(&format!("{mode} {n} pairs {size} B"));
                    let (rr, _) = self.fleet_run(fleet, n, "rr", size)?;
                    let (st, mem) = self.fleet_run(fleet, n, "stream", size)?;
                    let mut h = docknet_perf::stats::histogram();
                    for v in &rr {
                        let b: Vec<[u64; 2]> =
                            serde_json::from_value(v["result"]["one_way_hist"].clone())
                                .unwrap_or_default();
                        docknet_perf::stats::merge_buckets(&mut h, &b);
                    }
                    let s = docknet_perf::stats::Summary::of(&h);
                    let sum = |vs: &[Value], k: &str| {
                        vs.iter()
                            .filter_map(|v| v["result"][k].as_f64())
                            .sum::<f64>()
                    };
                    let cpu = rr
                        .iter()
                        .filter_map(|v| v["result"]["cpu_s_per_op"].as_f64())
                        .sum::<f64>()
                        / rr.len().max(1) as f64;
                    let mtu = match fleet {
                        Fleet::Kernel(l) => l.mtu,
                        Fleet::Docknet(_, m, _) => *m,
                    };
                    let row = Row {
                        tool: "dnperf".into(),
                        mtu: Some(mtu),
                        pairs: Some(n),
                        p50_us: (!h.is_empty()).then(|| s.p50 as f64 / 1e3),
                        p99_us: (!h.is_empty()).then(|| s.p99 as f64 / 1e3),
                        p999_us: (!h.is_empty()).then(|| s.p999 as f64 / 1e3),
                        mean_us: (!h.is_empty()).then(|| s.mean / 1e3),
                        tps: Some(sum(&rr, "tps")),
                        gbps: Some(sum(&st, "gbps")),
                        msgs_per_s: Some(sum(&st, "msgs_per_s")),
                        cpu_s_per_op: Some(cpu),
                        mem_kib_per_pair: mem.map(|m| m + topo_kib),
                        builder: Some(match fleet {
                            Fleet::Kernel(l) => l.builder.into(),
                            Fleet::Docknet(..) => "docknet".into(),
                        }),
                        one_way_hist: Some(docknet_perf::stats::buckets(&h)),
                        ..Row::new(mode, &placement, "-", "pairs", size, rep)
                    };
                    self.push(row);
                }
            }
        }
        Ok(())
    }

    /// Runs `wl` on the first `n` pairs at once; the clients' JSON and the memory per pair
    /// (fall in MemAvailable, sampled mid-run, over n).
    fn fleet_run(
        &mut self,
        fleet: &Fleet,
        n: usize,
        wl: &str,
        size: usize,
    ) -> Result<(Vec<Value>, Option<f64>)> {
        let mem0 = mem_available_kib();
        let (port, idle) = match fleet {
            Fleet::Kernel(_) => (0, "spin"),
            Fleet::Docknet(_, _, idle) => {
                self.port += 1;
                (self.port, *idle)
            }
        };
        let mut servers = Vec::with_capacity(n);
        for i in 0..n {
            servers.push(match fleet {
                Fleet::Kernel(l) => self.kernel_server(&l.pairs[i], None)?,
                Fleet::Docknet(d, ..) => self.docknet_peer(d, i, port, None, idle, None)?,
            });
        }
        std::thread::sleep(SERVER_START + Duration::from_millis(5 * n as u64));
        let mut clients = Vec::with_capacity(n);
        for i in 0..n {
            clients.push(match fleet {
                Fleet::Kernel(l) => self.kernel_client(&l.pairs[i], None, wl, size)?,
                Fleet::Docknet(d, ..) => {
                    self.docknet_peer(d, i, port, None, idle, Some((wl, size)))?
                }
            });
        }
        std::thread::sleep(Duration::from_secs_f64(
            self.args.warmup + self.args.duration / 2.0,
        ));
        let mem = fall_per(mem0, n);
        let mut out = Vec::with_capacity(n);
        for (i, c) in clients.into_iter().enumerate() {
            out.push(
                c.json(self.timeout(n), &self.stop)
                    .with_context(|| format!("pair {i} of {n}"))?,
            );
        }
        for s in servers {
            let _ = s.json(Duration::from_secs(10), &self.stop);
        }
        Ok((out, mem))
    }
}

/// The pairs of a topology: kernel namespaces, or pipes on a daemon (with their MTU and the
/// peers' idle policy).
enum Fleet<'a> {
    Kernel(&'a KernelLab),
    Docknet(&'a Daemon, u32, &'static str),
}

fn dnperf_path(exe: &Path) -> Result<PathBuf> {
    let p = exe.with_file_name("dnperf");
    if p.exists() {
        Ok(p)
    } else {
        bail!(
            "dnperf not found next to {} (cargo build --release builds both)",
            exe.display()
        )
    }
}

/// Runs `docknet bench rr|stream|pairs`.
pub fn run(load: Load, args: TcpBenchArgs) -> Result<()> {
    for m in &args.modes {
        let m = m.as_str();
        if !KERNEL_MODES.contains(&m) && !DOCKNET_MODES.contains(&m) && !CHECKED_MODES.contains(&m)
        {
            bail!(
                "unknown mode {m:?}: use {}, {} (or {}, reported when not available)",
                KERNEL_MODES.join(", "),
                DOCKNET_MODES.join(", "),
                CHECKED_MODES.join(", ")
            );
        }
    }
    let sizes = args.sizes.clone().unwrap_or_else(|| load.default_sizes());
    if let Some(s) = sizes.iter().find(|s| **s < 24 || **s > 16 << 20) {
        bail!("size {s} out of range (24 B .. 16 MiB)");
    }
    if let Some(m) = args.mtus.iter().find(|m| !(576..=65535).contains(*m)) {
        bail!("MTU {m} out of range (576 .. 65535)");
    }
    if args.pairs.is_empty() || args.pairs.iter().any(|n| *n == 0 || *n > 250) {
        bail!("--pairs takes numbers from 1 to 250");
    }
    if args.repeat == 0 || args.duration <= 0.0 || args.warmup < 0.0 {
        bail!("--repeat must be at least 1, --duration positive, --warmup not negative");
    }
    if !nix::unistd::Uid::effective().is_root() {
        bail!("docknet bench needs root (it creates namespaces and containers)");
    }
    let stop = Arc::new(AtomicBool::new(false));
    for s in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(s, stop.clone())?;
    }
    let exe = std::env::current_exe()?;
    let mut ctx = Ctx {
        dnperf: dnperf_path(&exe)?,
        exe,
        args: args.clone(),
        load,
        sizes,
        stop: stop.clone(),
        rows: Vec::new(),
        port: 21000,
        skipped: Vec::new(),
        progress: Progress::new(0),
    };
    // decide what runs before starting, so the progress bar knows the sweep
    let mut plan: Vec<(String, Option<String>)> = Vec::new();
    let mut total = 0;
    for m in &args.modes {
        let why = unavailable(m);
        if why.is_none() {
            total += ctx.points(m) * ctx.mtus(m).len();
        }
        plan.push((m.clone(), why));
    }
    ctx.progress = Progress::new(total as u64);
    for (m, why) in plan {
        if let Some(reason) = why {
            ctx.progress
                .line(&format!("{m}: not available here: {reason}"));
            ctx.skipped.push(Skip {
                mode: m,
                mtu: None,
                status: "not available here",
                reason,
            });
            continue;
        }
        for mtu in ctx.mtus(&m) {
            ctx.check_stop()?;
            let before = ctx.rows.len();
            let r = if KERNEL_MODES.contains(&m.as_str()) {
                ctx.kernel(&m, mtu)
            } else {
                ctx.docknet(&m, mtu)
            };
            if let Err(e) = r {
                if stop.load(Ordering::Relaxed) {
                    return Err(e);
                }
                // a failing mode is reported and skipped; the others still run
                let done = ctx.rows.len() - before;
                ctx.progress
                    .skip(ctx.points(&m).saturating_sub(done) as u64);
                ctx.progress
                    .line(&format!("{m} (MTU {mtu}): skipped: {e:#}"));
                ctx.skipped.push(Skip {
                    mode: m.clone(),
                    mtu: Some(mtu),
                    status: "skipped",
                    reason: format!("failed: {e:#}"),
                });
            }
        }
    }
    ctx.progress.finish();
    let summary = summarize(&ctx.rows);
    print!("{}", table(&summary));
    for s in &ctx.skipped {
        println!("{:<18} {}: {}", s.mode, s.status, s.reason);
    }
    let ratios = crate::report::ratio_lines(&summary, load.name());
    let targets = crate::report::targets(&summary);
    for r in ratios.iter().chain(targets.iter()) {
        println!("{r}");
    }
    let not_available: Vec<Value> = ctx
        .skipped
        .iter()
        .map(|s| json!({"mode": s.mode, "mtu": s.mtu, "status": s.status, "reason": s.reason}))
        .collect();
    let mut env = env_json(args.duration, args.warmup, args.repeat);
    env["workload"] = load.name().into();
    env["mtus"] = json!(args.mtus);
    let doc = json!({"env": env, "results": ctx.rows, "summary": summary, "ratios": ratios,
        "targets": targets, "not_available": not_available});
    let mut outputs: Vec<PathBuf> = args.json.iter().cloned().collect();
    if let Some(dir) = &args.report {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        outputs.push(dir.join(format!("tcp-{}.json", load.name())));
        let md = dir.join(format!("tcp-{}.md", load.name()));
        std::fs::write(&md, markdown(load, &doc, &summary, &ratios, &targets))
            .with_context(|| format!("writing {}", md.display()))?;
        eprintln!("wrote {}", md.display());
    }
    for f in &outputs {
        std::fs::write(f, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", f.display()))?;
        eprintln!("wrote {}", f.display());
    }
    if let Some(dir) = &args.report {
        let index = crate::report::build_dir(dir)?;
        eprintln!("wrote {}", index.display());
    }
    Ok(())
}

fn markdown(load: Load, doc: &Value, med: &[Row], ratios: &[String], targets: &[String]) -> String {
    let title = match load {
        Load::Rr => "TCP request/response latency side by side",
        Load::Stream => "TCP streaming goodput side by side",
        Load::Pairs => "TCP with N concurrent pairs side by side",
    };
    let mut m = md_header(
        title,
        doc,
        "; measured by `dnperf` (one program for kernel and DockLib sockets), sockperf / iperf3 rows are the cross-check",
    );
    m += &md_results(med, ratios);
    if !targets.is_empty() {
        m += "\n## Targets of issue #4\n\n";
        for t in targets {
            m += &format!("- {t}\n");
        }
    }
    if let Some(na) = doc["not_available"].as_array().filter(|a| !a.is_empty()) {
        m += "\n## Not available here, or skipped\n\n";
        for x in na {
            m += &format!("- {}\n", crate::report::not_available_line(x));
        }
    }
    m += &md_placement(med);
    m
}
