//! `docknet bench rr|stream|pairs` and `docknet raw bench`: the top of the lab. Data flows one
//! way: the options become a [`Plan`]; the [`Runner`] executes it into rows; the rows are
//! summarised and judged ([`summarize`], [`crate::verdict`]); the results are printed, written
//! as JSON and Markdown, and drawn into the report.

use crate::mode::{Mode, Topology};
use crate::plan::{default_sizes, Plan, Request, PEER_IDLE};
use crate::proc::Stop;
use crate::report::{self, markdown, table};
use crate::row::{Env, NotAvailable, Results, Status, Workload};
use crate::summary::summarize;
use crate::topology::probe;
use crate::topology::wire::Shape;
use crate::verdict::{ratio_lines, raw_ratio_lines, raw_targets, targets, Verdict};
use crate::workload::rate::{Lim, RateRun, Schedule};
use crate::workload::raw::RawArgs;
use crate::workload::{ipv6_unsupported, Runner, Timing};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

mod services;
pub use services::{run_http, run_nat, HttpArgs};

/// Options of `docknet bench rr|stream|pairs`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Modes to compare. One host, kernel: loopback, container (shared netns), veth, bridge,
    /// bridge-nat (port mapping), macvlan, ipvlan (where the kernel has it), ovs (Open vSwitch
    /// userspace datapath, where installed); DockNet: docknet (through the daemon), docknet-fc
    /// (fast channel), docknet-preload and docknet-fc-preload (the same, with dnperf's kernel
    /// sockets and the cross-check tools unmodified under the preload library); sriov is probed and reported as not available where it cannot run.
    /// Two hosts, kernel: host, routed, nat, macvlan, vxlan; DockNet: docknet (daemons on the
    /// wire with AF_XDP), docknet-packet (AF_PACKET), docknet-vxlan (AF_XDP, the hosts' pipes
    /// routed through the daemons' VXLAN tunnels), docknet-host (each daemon on a link to its
    /// host's kernel, which routes between the hosts as in routed), docknet-pods (pods that the
    /// CNI plugin attaches, routed by the node agent, as on two Kubernetes nodes) [default: one host
    /// bridge,docknet,docknet-fc; two hosts host,routed,nat,vxlan,docknet,docknet-packet].
    #[arg(long, value_delimiter = ',')]
    pub modes: Option<Vec<String>>,
    /// one-host, or two-host: host A (clients) and host B (servers) in namespaces of their own
    /// joined by a wire (a veth to a switch namespace), a DockNet daemon per host driving its
    /// end of the wire.
    #[arg(long, default_value = "one-host")]
    pub topology: Topology,
    /// Two hosts: shape the wire to this rate per direction (tc syntax: 10gbit).
    #[arg(long, value_name = "RATE")]
    pub wire_rate: Option<String>,
    /// Two hosts: add this one-way delay on the wire (tc syntax: 10us).
    #[arg(long, value_name = "TIME")]
    pub wire_delay: Option<String>,
    /// Message sizes in bytes [default: rr 64,1024,65536; stream
    /// 64,256,1024,4096,16384,65536,409600; pairs 1024].
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// Numbers of concurrent pairs (pairs workload) [default: 1,2,4,8,16,32,64,128; two hosts
    /// up to 64].
    #[arg(long, value_delimiter = ',')]
    pub pairs: Option<Vec<usize>>,
    /// Pairs: the idle policy of DockNet's peers (spin, adaptive, adaptive:0, block, or any
    /// `adaptive:SPIN_US:YIELD_US`), one sweep per policy side by side; `spin` is the paper's
    /// busy polling [default: block].
    #[arg(long, value_delimiter = ',', value_name = "POLICY")]
    pub peer_idle: Option<Vec<String>>,
    /// Pairs: pin the pairs' containers to these cores, pair i on the i-th (round robin); the
    /// daemon's master then spins on a core not listed, as in the paper's Fig. 10 (`--cores 1`:
    /// every container on core 1, the master on core 0) [default: unpinned].
    #[arg(long, value_delimiter = ',', value_name = "CORE")]
    pub cores: Option<Vec<usize>>,
    /// rr and stream: where the parties run. pinned: hand-placed on chosen cores with chosen
    /// idle policies (kernel modes on one core and on two; DockNet as docs/lab.md says).
    /// unpinned: what a user gets, no process pinned in any mode and every DockNet program at
    /// its defaults. one-core: a pod with one CPU, client and server on core 1 at their defaults
    /// (the daemon not pinned). Several: side by side.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "pinned")]
    pub placement: Vec<crate::plan::PlacementKind>,
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
    /// rr and stream: also measure the kernel modes and the preload modes with sockperf (rr) and
    /// iperf3 (stream), client core 0 and server core 1, as a cross-check of dnperf (rows with
    /// `tool` sockperf / iperf3).
    #[arg(long)]
    pub crosscheck: bool,
    /// rr and stream over IPv6: docknet and docknet-fc on dual-stack pipes, loopback and
    /// container over `::1`; the other modes are reported as skipped, with the reason
    /// (results: tcp-WORKLOAD-ipv6.json).
    #[arg(long)]
    pub ipv6: bool,
    /// Write all results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write tcp-WORKLOAD.json and tcp-WORKLOAD.md into this directory, and (re)build its HTML
    /// report from every tcp-*.json there (index.html, report.md, figures/).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

impl BenchArgs {
    /// The plan's request (refuses unknown modes).
    pub fn request(&self, workload: Workload) -> Result<Request> {
        let default = match self.topology {
            Topology::OneHost => "bridge,docknet,docknet-fc",
            Topology::TwoHost => "host,routed,nat,vxlan,docknet,docknet-packet",
        };
        let modes: Vec<String> = self
            .modes
            .clone()
            .unwrap_or_else(|| default.split(',').map(String::from).collect());
        if self.topology == Topology::OneHost
            && (self.wire_rate.is_some() || self.wire_delay.is_some())
        {
            bail!("--wire-rate and --wire-delay shape the two-host wire: add --topology two-host");
        }
        self.shape().check()?;
        let peer_idle = match &self.peer_idle {
            None => vec![PEER_IDLE[3]],
            Some(v) => v
                .iter()
                .map(|p| match PEER_IDLE.into_iter().find(|k| k == p) {
                    Some(k) => Ok(k),
                    // any other policy the programs take (`adaptive:SPIN_US:YIELD_US`), kept
                    // for the run's life like the named ones
                    None => docknet_pipe::IdlePolicy::parse(p)
                        .map(|_| &*Box::leak(p.clone().into_boxed_str()))
                        .map_err(|e| anyhow::anyhow!("--peer-idle: {e}")),
                })
                .collect::<Result<_>>()?,
        };
        Ok(Request {
            workload,
            modes: modes
                .iter()
                .map(|m| m.parse::<Mode>())
                .collect::<Result<_, _>>()?,
            sizes: self
                .sizes
                .clone()
                .unwrap_or_else(|| default_sizes(workload)),
            mtus: self.mtus.clone(),
            pairs: self.pairs.clone().unwrap_or_else(|| match self.topology {
                Topology::OneHost => vec![1, 2, 4, 8, 16, 32, 64, 128],
                Topology::TwoHost => vec![1, 2, 4, 8, 16, 32, 64],
            }),
            repeat: self.repeat,
            crosscheck: self.crosscheck,
            topology: self.topology,
            peer_idle,
            pairs_cores: self.cores.clone().unwrap_or_default(),
            machine_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            placements: self.placement.clone(),
        })
    }

    /// The wire's shaping.
    pub fn shape(&self) -> Shape {
        Shape {
            rate: self.wire_rate.clone(),
            delay: self.wire_delay.clone(),
        }
    }
}

fn need_root(what: &str) -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("{what} needs root (it creates namespaces and containers): run it with sudo");
    }
    Ok(())
}

fn lines(v: &[Verdict]) -> Vec<String> {
    v.iter().map(Verdict::line).collect()
}

/// Writes `res` as JSON to `json` and into `report_dir` as `NAME.json` and `NAME.md` (`md`).
fn write_outputs(
    res: &Results,
    json: Option<&PathBuf>,
    report_dir: Option<&PathBuf>,
    name: &str,
    md: impl FnOnce() -> String,
) -> Result<()> {
    let mut outputs: Vec<PathBuf> = json.into_iter().cloned().collect();
    if let Some(dir) = report_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        outputs.push(dir.join(format!("{name}.json")));
        let path = dir.join(format!("{name}.md"));
        std::fs::write(&path, md()).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    for f in &outputs {
        std::fs::write(f, serde_json::to_vec_pretty(res)?)
            .with_context(|| format!("writing {}", f.display()))?;
        eprintln!("wrote {}", f.display());
    }
    Ok(())
}

/// [`write_outputs`], then the report of `report_dir` rebuilt (`index.html`, `report.md`) over
/// every results file in it.
fn publish(
    res: &Results,
    json: Option<&PathBuf>,
    report_dir: Option<&PathBuf>,
    name: &str,
    md: impl FnOnce() -> String,
) -> Result<()> {
    write_outputs(res, json, report_dir, name, md)?;
    if let Some(dir) = report_dir {
        let index = report::build_dir(dir)?;
        eprintln!("wrote {}", index.display());
    }
    Ok(())
}

/// Runs `docknet bench rr|stream|pairs`.
pub fn run(workload: Workload, args: BenchArgs) -> Result<()> {
    let mut req = args.request(workload)?;
    req.check()?;
    // over IPv6, the modes that cannot run are taken out here and reported with the reason
    let mut v6_skipped = Vec::new();
    if args.ipv6 {
        if !matches!(workload, Workload::Rr | Workload::Stream) {
            bail!("--ipv6 measures rr and stream");
        }
        if args.crosscheck {
            bail!("--ipv6 does not run the cross-check (sockperf and iperf3 are given IPv4 addresses)");
        }
        req.modes
            .retain(|m| match ipv6_unsupported(*m, req.topology) {
                Some(why) => {
                    v6_skipped.push((*m, why));
                    false
                }
                None => true,
            });
    }
    if args.duration <= 0.0 || args.warmup < 0.0 {
        bail!("--duration must be positive, --warmup not negative");
    }
    need_root("docknet bench")?;
    args.shape().probe()?;
    let stop = Stop::on_signals()?;
    let plan = Plan::new(&req, probe::unavailable);
    let timing = Timing {
        duration: args.duration,
        warmup: args.warmup,
        start_at: None,
    };
    let exe = std::env::current_exe()?;
    let mut runner = Runner::new(exe, workload, timing, stop.clone(), plan.total_points())?;
    runner.topology = req.topology;
    runner.shape = args.shape();
    runner.ipv6 = args.ipv6;
    for (mode, why) in v6_skipped {
        runner
            .progress
            .line(&format!("{mode}: skipped over IPv6: {why}"));
        runner.skipped.push(
            NotAvailable::new(
                mode.name(),
                Status::Skipped,
                format!("not over IPv6: {why}"),
            )
            .on(req.topology),
        );
    }
    for (mode, reason) in &plan.unavailable {
        runner
            .progress
            .line(&format!("{mode}: not available here: {reason}"));
        runner
            .skipped
            .push(NotAvailable::here(mode.name(), reason.clone()).on(req.topology));
    }
    for run in &plan.runs {
        stop.check()?;
        let before = runner.rows.len();
        if let Err(e) = runner.run_mode(run) {
            if stop.raised() {
                return Err(e);
            }
            // a failing mode is reported and skipped; the others still run
            let done = runner.rows.len() - before;
            runner
                .progress
                .skip(run.points.len().saturating_sub(done) as u64);
            runner
                .progress
                .line(&format!("{} (MTU {}): skipped: {e:#}", run.mode, run.mtu));
            runner
                .skipped
                .push(NotAvailable::failed(run.mode.name(), run.mtu, &e).on(req.topology));
        }
    }
    runner.progress.finish();
    let summary = summarize(&runner.rows);
    print!("{}", table::text(&summary));
    for s in &runner.skipped {
        println!("{:<18} {}: {}", s.mode, s.status.text(), s.reason);
    }
    let ratios = ratio_lines(&summary, workload);
    let targets = lines(&targets(&summary, args.shape().gbps()));
    for r in ratios.iter().chain(targets.iter()) {
        println!("{r}");
    }
    let mut env = Env::here(args.duration, args.warmup, args.repeat);
    env.workload = Some(workload);
    env.mtus = Some(args.mtus.clone());
    env.topology = Some(req.topology);
    env.wire = args.shape().describe();
    env.wire_gbps = args.shape().gbps();
    env.ipv6 = args.ipv6;
    let res = Results {
        env,
        results: runner.rows,
        summary,
        ratios,
        targets,
        not_available: runner.skipped,
    };
    let title = match (workload, req.topology) {
        (Workload::Rr, Topology::OneHost) => "TCP request/response latency side by side",
        (Workload::Stream, Topology::OneHost) => "TCP streaming goodput side by side",
        (Workload::Pairs, Topology::OneHost) => "TCP with N concurrent pairs side by side",
        (Workload::Rr, Topology::TwoHost) => "Two hosts: TCP request/response latency side by side",
        (Workload::Stream, Topology::TwoHost) => "Two hosts: TCP streaming goodput side by side",
        (Workload::Pairs, Topology::TwoHost) => {
            "Two hosts: TCP with N concurrent pairs side by side"
        }
        (Workload::Rate, _) => "Rate limits side by side",
        (Workload::Idle, _) => "An idle host",
        (Workload::Http, _) => "HTTP under load",
        (Workload::Nat, _) => "NAT load balancer",
        (Workload::Chain, _) => "HTTP chain",
        (Workload::Startup, _) => "Start-up time",
        (Workload::Cpuquota, _) => "Latency under a CPU quota",
    };
    let title = if args.ipv6 {
        match workload {
            Workload::Rr => "TCP request/response latency over IPv6 side by side",
            _ => "TCP streaming goodput over IPv6 side by side",
        }
    } else {
        title
    };
    let note = "Measured by `dnperf` (one program for kernel and DockLib sockets); sockperf / \
                iperf3 rows are the cross-check.";
    let mut name = match req.topology {
        Topology::OneHost => format!("tcp-{workload}"),
        Topology::TwoHost => format!("tcp-{workload}-two-host"),
    };
    if args.ipv6 {
        name.push_str("-ipv6");
    }
    publish(
        &res,
        args.json.as_ref(),
        args.report.as_ref(),
        &name,
        || markdown::bench(title, note, &res),
    )?;
    Ok(())
}

/// Runs `docknet raw bench`.
pub fn run_raw(args: RawArgs) -> Result<()> {
    let total = args.check()?;
    need_root("docknet raw bench")?;
    let stop = Stop::on_signals()?;
    let timing = Timing {
        duration: args.duration,
        warmup: args.warmup,
        start_at: None,
    };
    let exe = std::env::current_exe()?;
    let mut runner = Runner::new(exe, Workload::Rr, timing, stop, total)?;
    runner.raw_bench(&args)?;
    runner.progress.finish();
    let summary = summarize(&runner.rows);
    print!("{}", table::text(&summary));
    if args.repeat > 1 {
        println!(
            "(each row: median of {} runs; every run is in the JSON)",
            args.repeat
        );
    }
    let ratios = raw_ratio_lines(&summary);
    for l in &ratios {
        println!("{l}");
    }
    let targets = lines(&raw_targets(&summary));
    for c in &targets {
        println!("target: {c}");
    }
    println!("placements (CORES: c = client, s = server, m = daemon master):");
    for r in markdown::placements(&summary) {
        println!("  {:<18} {:<9} {}", r.mode, r.cores, r.placement);
    }
    let path_ok = runner.rows.iter().all(|r| r.path_ok);
    let res = Results {
        env: Env::here(args.duration, args.warmup, args.repeat),
        results: runner.rows,
        summary,
        ratios,
        targets,
        not_available: Vec::new(),
    };
    let note = "DockNet rows move raw Ethernet frames (no TCP); kernel rows are TCP measured by dnperf \
          over a Linux bridge between two network namespaces. One-way latency \
          comes from CLOCK_MONOTONIC timestamps carried in the payload (every namespace shares that \
          clock); rtt/2 is beside it. Stream goodput is counted at the receiver; `lost` counts raw \
          frames dropped because a receiver's ring was full (raw frames have no flow control).";
    write_outputs(
        &res,
        args.json.as_ref(),
        args.report.as_ref(),
        "raw-bench",
        || markdown::bench("DockNet raw-frame benchmark", note, &res),
    )?;
    if !path_ok {
        bail!("some frames took the wrong path (see the 'path' column)");
    }
    Ok(())
}

/// Options of `docknet bench rate`.
#[derive(Debug, Clone, clap::Args)]
pub struct RateArgs {
    /// Modes to compare: bridge (the kernel: the reference CNI bandwidth plugin, a TBF) and
    /// docknet (the daemon's limiter).
    #[arg(long, value_delimiter = ',', default_value = "bridge,docknet")]
    pub modes: Vec<String>,
    /// The step experiment's limits on one TCP flow, each for --step seconds, between an
    /// unlimited step (the capacity) and one with a limit far above it before and after them:
    /// shares of the capacity (80%) or rates (10mbit, 2gbit).
    #[arg(long, value_delimiter = ',', default_value = "80%,60%,40%,20%,10mbit")]
    pub steps: Vec<String>,
    /// Seconds per step.
    #[arg(long, default_value_t = 3.0)]
    pub step: f64,
    /// The contention experiments' timeline in seconds: UDP starts, UDP stops, TCP ends.
    #[arg(long, value_delimiter = ',', default_value = "5,17,22")]
    pub timeline: Vec<f64>,
    /// The UDP flow's limit in the udp-limited and both-limited runs.
    #[arg(long, default_value = "20%")]
    pub udp_limit: String,
    /// The TCP flow's limit in the both-limited run.
    #[arg(long, default_value = "40%")]
    pub tcp_limit: String,
    /// Bucket size of every limit, as milliseconds at its rate (the same for both limiters).
    #[arg(long, default_value_t = 10.0)]
    pub burst_ms: f64,
    /// UDP datagram size in bytes.
    #[arg(long, default_value_t = 1400)]
    pub udp_size: usize,
    /// Write all results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write rate.json and rate.md into this directory and (re)build its HTML report.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

impl RateArgs {
    /// The modes and the schedule (refuses what cannot run).
    pub fn schedule(&self) -> Result<(Vec<Mode>, Schedule)> {
        let modes = self
            .modes
            .iter()
            .map(|m| m.parse::<Mode>())
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(m) = modes
            .iter()
            .find(|m| !matches!(m, Mode::Bridge | Mode::Docknet))
        {
            bail!("{m}: the rate experiment runs on bridge (CNI bandwidth) and docknet");
        }
        let [from, to, end] = self.timeline[..] else {
            bail!("--timeline takes three times: UDP starts, UDP stops, TCP ends (5,17,22)");
        };
        if !(0.0 < from && from < to && to <= end && end <= 600.0) {
            bail!("--timeline must be 0 < UDP start < UDP stop <= end <= 600 s");
        }
        if !(0.5..=60.0).contains(&self.step) {
            bail!("--step must be 0.5 .. 60 s");
        }
        if !(1.0..=1000.0).contains(&self.burst_ms) {
            bail!("--burst-ms must be 1 .. 1000");
        }
        if !(24..=1472).contains(&self.udp_size) {
            bail!("--udp-size must be 24 .. 1472 (one datagram per frame at MTU 1500)");
        }
        let steps = self
            .steps
            .iter()
            .map(|s| Lim::parse(s))
            .collect::<Result<Vec<_>>>()?;
        Ok((
            modes,
            Schedule {
                steps,
                step_s: self.step,
                udp_from: from,
                udp_to: to,
                end,
                udp_limit: Lim::parse(&self.udp_limit)?,
                tcp_limit: Lim::parse(&self.tcp_limit)?,
                burst_ms: self.burst_ms,
                udp_size: self.udp_size,
            },
        ))
    }
}

/// Runs `docknet bench rate`.
pub fn run_rate(args: RateArgs) -> Result<()> {
    let (modes, schedule) = args.schedule()?;
    need_root("docknet bench rate")?;
    let stop = Stop::on_signals()?;
    let exe = std::env::current_exe()?;
    let mut progress = crate::progress::Progress::new(4 * modes.len() as u64);
    let (mut rows, mut skipped) = (Vec::new(), Vec::new());
    for mode in modes {
        stop.check()?;
        let why = if mode == Mode::Bridge {
            crate::topology::cni::plugin_dir()
                .ok()
                .filter(|d| !d.join("bandwidth").is_file())
                .map(|d| format!("no CNI bandwidth plugin in {}", d.display()))
                .or_else(|| probe::unavailable(mode))
        } else {
            probe::unavailable(mode)
        };
        if let Some(reason) = why {
            progress.line(&format!("{mode}: not available here: {reason}"));
            progress.skip(4);
            skipped.push(NotAvailable::here(mode.name(), reason));
            continue;
        }
        let mut run = RateRun::build(&exe, mode, &stop)
            .with_context(|| format!("building the {mode} topology"))?;
        let r = run.all(&schedule, &mut progress);
        rows.append(&mut run.rows);
        drop(run);
        if let Err(e) = r {
            if stop.raised() {
                return Err(e);
            }
            progress.line(&format!("{mode}: skipped: {e:#}"));
            skipped.push(NotAvailable::failed(mode.name(), 1500, &e));
        }
    }
    progress.finish();
    let phases = crate::rate::phases(&rows);
    print!("{}", crate::rate::table(&phases));
    for s in &skipped {
        println!("{:<18} {}: {}", s.mode, s.status.text(), s.reason);
    }
    let targets = lines(&crate::rate::targets(&phases));
    for t in &targets {
        println!("{t}");
    }
    println!("{}", crate::rate::FAST_CHANNELS);
    let mut env = Env::here(schedule.end, 0.0, 1);
    env.workload = Some(Workload::Rate);
    env.mtus = Some(vec![1500]);
    env.topology = Some(Topology::OneHost);
    let res = Results {
        env,
        results: rows,
        summary: Vec::new(),
        ratios: Vec::new(),
        targets,
        not_available: skipped,
    };
    publish(
        &res,
        args.json.as_ref(),
        args.report.as_ref(),
        "rate",
        || markdown::rate(&res, &phases),
    )?;
    Ok(())
}

/// A seed study's results: printed, written as JSON and Markdown, drawn into the report.
#[allow(clippy::too_many_arguments)]
fn study_outputs(
    workload: Workload,
    title: &str,
    about: &str,
    table: fn(&[crate::row::Row]) -> String,
    (ratios, targets): (Vec<String>, Vec<String>),
    (results, summary): (Vec<crate::row::Row>, Vec<crate::row::Row>),
    skipped: Vec<NotAvailable>,
    (duration, warmup, repeat): (f64, f64, usize),
    json: Option<&PathBuf>,
    report_dir: Option<&PathBuf>,
) -> Result<()> {
    print!("{}", table(&summary));
    for s in &skipped {
        println!("{}", s.line());
    }
    for r in &ratios {
        println!("{r}");
    }
    for t in &targets {
        println!("target: {t}");
    }
    let mut env = Env::here(duration, warmup, repeat);
    env.workload = Some(workload);
    env.topology = Some(Topology::OneHost);
    let res = Results {
        env,
        results,
        summary,
        ratios,
        targets,
        not_available: skipped,
    };
    publish(&res, json, report_dir, &format!("tcp-{workload}"), || {
        format!(
            "# {title}\n\nCommand: `{}`\n\n{about}\n\n```text\n{}```\n\n{}\n",
            res.env.command,
            table(&res.summary),
            res.ratios
                .iter()
                .chain(res.targets.iter())
                .cloned()
                .chain(res.not_available.iter().map(NotAvailable::line))
                .map(|t| format!("- {t}\n"))
                .collect::<String>()
        )
    })?;
    Ok(())
}

/// Runs `docknet bench startup`.
pub fn run_startup(args: crate::workload::startup::StartupArgs) -> Result<()> {
    use crate::workload::startup;
    let modes = startup::modes(&args)?;
    need_root("docknet bench startup")?;
    let stop = Stop::on_signals()?;
    let mut total = 0;
    for m in &modes {
        total += startup::steps(*m, &args)?;
    }
    let mut progress = crate::progress::Progress::new(total);
    let (rows, skipped) = startup::measure(&args, &stop, &mut progress)?;
    progress.finish();
    let targets = startup::targets(&rows);
    study_outputs(
        Workload::Startup,
        "Network start-up time",
        startup::ABOUT,
        startup::table,
        (Vec::new(), targets),
        (rows.clone(), rows),
        skipped,
        (1.0, 0.0, args.reps),
        args.json.as_ref(),
        args.report.as_ref(),
    )
}

/// Runs `docknet bench cpuquota`.
pub fn run_cpuquota(args: crate::workload::cpuquota::CpuquotaArgs) -> Result<()> {
    use crate::workload::cpuquota;
    let modes = cpuquota::modes(&args)?;
    need_root("docknet bench cpuquota")?;
    let stop = Stop::on_signals()?;
    let total: usize = modes.iter().map(|m| cpuquota::points(&args, *m)).sum();
    let mut progress = crate::progress::Progress::new(total as u64);
    let (rows, skipped) = cpuquota::measure(&args, &stop, &mut progress)?;
    progress.finish();
    let targets = cpuquota::targets(&rows);
    study_outputs(
        Workload::Cpuquota,
        "Round trips under a CPU quota",
        cpuquota::ABOUT,
        cpuquota::table,
        (Vec::new(), targets),
        (rows.clone(), rows),
        skipped,
        (args.duration, args.warmup, 1),
        args.json.as_ref(),
        args.report.as_ref(),
    )
}

/// Runs `docknet bench chain`.
pub fn run_chain(args: crate::workload::chain::ChainArgs) -> Result<()> {
    use crate::workload::chain;
    let modes = chain::modes(&args)?;
    need_root("docknet bench chain")?;
    let stop = Stop::on_signals()?;
    crate::workload::http::beside(&std::env::current_exe()?, "docknet-forward")?;
    let mut progress =
        crate::progress::Progress::new((modes.len() * args.sizes.len() * args.repeat) as u64);
    let (rows, skipped) = chain::measure(&args, &stop, &mut progress)?;
    progress.finish();
    // the modes took turns: the table shows them in the order asked for, each by size
    let mut summary = summarize(&rows);
    summary.sort_by_key(|r| (modes.iter().position(|m| *m == r.mode), r.size));
    let (ratios, targets) = (chain::ratios(&summary), chain::targets(&summary));
    study_outputs(
        Workload::Chain,
        "Kratzke's HTTP chain",
        chain::ABOUT,
        chain::table,
        (ratios, targets),
        (rows, summary),
        skipped,
        (args.duration, args.warmup, args.repeat),
        args.json.as_ref(),
        args.report.as_ref(),
    )
}
