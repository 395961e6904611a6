//! `docknet bench idle`: what an idle DockNet host costs, and how fast it wakes.
//!
//! A daemon and N containers, each running a DockLib server (`dnperf server --stack docknet`)
//! that waits for a connection that never comes. After a settling pause the CPU time of the
//! daemon and of every process of the containers is summed over a window, exactly, from each
//! task's `schedstat` (`/proc/stat` is tick-sampled and misses threads that wake between ticks).
//! Then one more pair exchanges a 64-byte message after every pause of `--pause-ms` (1 s): the
//! one-way latency of each request is the latency of the first packet after an idle second,
//! with the daemon's master and both peers asleep when it is sent. The same exchange over the
//! kernel's loopback in a namespace of its own is the machine's reference: a sleeping thread's
//! wake-up costs what it costs here. The pair is measured three ways: through the daemon (its
//! fast channels made by hand only), over a fast channel made by hand, and with the daemon at
//! its defaults (automatic fast channels: the pair's first exchange, in the warm-up, goes
//! through the master, which joins the two pipes; the measured ones take the channel).

use crate::mode::Mode;
use crate::proc::{CpuMeter, Proc, Stop};
use crate::row::{Env, Row, Tool, Workload};
use crate::topology::daemon::Daemon;
use crate::workload::dnperf_path;
use anyhow::{bail, Context, Result};
use docknet_perf::report::ClientReport;
use serde::Serialize;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Options of `docknet bench idle`.
#[derive(Debug, Clone, clap::Args)]
pub struct IdleArgs {
    /// Idle containers, each a DockLib server waiting in accept.
    #[arg(long, default_value_t = 32)]
    pub containers: usize,
    /// Seconds over which the CPU time is measured.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Messages sent after an idle pause, for the wake-up latency.
    #[arg(long, default_value_t = 20)]
    pub wakes: usize,
    /// The pause before each of those messages, in milliseconds.
    #[arg(long, default_value_t = 1000.0)]
    pub pause_ms: f64,
    /// Idle policy of the daemon and of every container (spin, adaptive, adaptive:SPIN_US,
    /// block); `spin` shows what busy-polling costs (the paper's design).
    #[arg(long, default_value = "adaptive")]
    pub idle: String,
    /// Write the result as JSON here (its figures at the top, and the same as result rows
    /// that `docknet report` reads).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write idle.json into this directory and (re)build its HTML report.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// What `docknet bench idle` measured.
#[derive(Debug, Clone, Serialize)]
pub struct IdleResult {
    /// Idle containers.
    pub containers: usize,
    /// Idle policy of the daemon and the containers.
    pub idle: String,
    /// Seconds measured.
    pub seconds: f64,
    /// CPU of the daemon and all containers together, in percent of one core.
    pub cpu_pct_of_core: f64,
    /// The same per container.
    pub per_container_pct: f64,
    /// Voluntary context switches of the containers' DockLib engine threads, per second and
    /// container (how often an idle engine wakes).
    pub engine_wakeups_per_s: f64,
    /// One-way latency of a message sent after `pause_ms` of idle (the request; its reply
    /// finds the path awake): median and 99th percentile, microseconds.
    pub wake_p50_us: f64,
    /// See `wake_p50_us`.
    pub wake_p99_us: f64,
    /// Samples behind the wake-up percentiles.
    pub wake_samples: u64,
    /// The same exchange between two containers joined by a fast channel (no master on the
    /// path): median and 99th percentile, microseconds.
    pub fc_wake_p50_us: f64,
    /// See `fc_wake_p50_us`.
    pub fc_wake_p99_us: f64,
    /// The same exchange with the daemon at its defaults (automatic fast channels; what a user
    /// gets): median and 99th percentile, microseconds.
    pub auto_wake_p50_us: f64,
    /// See `auto_wake_p50_us`.
    pub auto_wake_p99_us: f64,
    /// Fast channels that daemon made for the pair (1 when it joined them).
    pub auto_channels_made: u64,
    /// The same exchange over the kernel's loopback in a namespace of its own (one wake-up per
    /// message: the receiver's), measured in the same run as the reference for this machine.
    pub kernel_wake_p50_us: f64,
    /// See `kernel_wake_p50_us`.
    pub kernel_wake_p99_us: f64,
    /// The pause before each of them, milliseconds.
    pub pause_ms: f64,
    /// The run's environment.
    pub env: Env,
    /// The same figures as result rows (`workload: "idle"`): the daemon path (with the CPU
    /// figures), the fast channel and the kernel's loopback.
    pub results: Vec<Row>,
}

impl IdleResult {
    /// The result's rows.
    fn rows(&self) -> Vec<Row> {
        let row = |mode, p50, p99| Row {
            p50_us: Some(p50),
            p99_us: Some(p99),
            idle: (mode != Mode::Loopback).then(|| self.idle.clone()),
            placement: format!(
                "{} waiting containers; first packet after {} ms idle",
                self.containers, self.pause_ms
            ),
            cores: "-".into(),
            ..Row::new(mode, Tool::Dnperf, Workload::Idle, 64)
        };
        vec![
            Row {
                containers: Some(self.containers),
                cpu_pct_of_core: Some(self.cpu_pct_of_core),
                ..row(Mode::Docknet, self.wake_p50_us, self.wake_p99_us)
            },
            row(Mode::DocknetFc, self.fc_wake_p50_us, self.fc_wake_p99_us),
            row(
                Mode::DocknetAuto,
                self.auto_wake_p50_us,
                self.auto_wake_p99_us,
            ),
            row(
                Mode::Loopback,
                self.kernel_wake_p50_us,
                self.kernel_wake_p99_us,
            ),
        ]
    }
}

fn ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 91, (i / 250) as u8, (i % 250) as u8 + 1)
}

/// Voluntary context switches of every `docklib-engine` thread of `pids`.
fn engine_switches(pids: &[u32]) -> u64 {
    let mut sum = 0;
    for p in pids {
        for t in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() != "docklib-engine" {
                continue;
            }
            sum += std::fs::read_to_string(t.path().join("status"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    sum
}

/// A `docknet run --pipe PIPE -- dnperf ARGS` on `d`.
fn run_in(d: &Daemon, exe: &Path, dnperf: &Path, pipe: &str, args: &[String]) -> Result<Proc> {
    let mut c = d.cmd(exe);
    c.args(["run", "--pipe", pipe, "--"]).arg(dnperf).args(args);
    Proc::spawn(c, &format!("dnperf in pipe {pipe}"))
}

fn server_args(idle: &str, bind: Ipv4Addr) -> Vec<String> {
    [
        "server", "--stack", "docknet", "--idle", idle, "--conns", "1", "--bind",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("{bind}:7000")])
    .collect()
}

/// Waits until pipes `names` are attached to their containers.
fn wait_attached(d: &Daemon, names: &[String], stop: &Stop) -> Result<()> {
    let t = Instant::now();
    loop {
        stop.check()?;
        let pipes = d.client()?.pipe_ls()?;
        let up = names
            .iter()
            .filter(|n| pipes.iter().any(|p| &p.name == *n && p.socket.is_some()))
            .count();
        if up == names.len() {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(60) {
            bail!("{up} of {} containers attached after 60 s", names.len());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// dnperf's arguments for the wake-up client on `stack` towards `server`.
fn wake_client(args: &IdleArgs, stack: &str, server: Ipv4Addr) -> Vec<String> {
    let pause = args.pause_ms / 1000.0;
    [
        "client",
        "--stack",
        stack,
        "--idle",
        &args.idle,
        "--connect",
        &format!("{server}:7000"),
        "--workload",
        "rr",
        "--size",
        "64",
        "--interval",
        &args.pause_ms.to_string(),
        // one exchange in the warm-up (the connection's first), then `wakes` measured
        "--warmup",
        &format!("{:.3}", pause * 0.5),
        "--duration",
        &format!("{:.3}", pause * (args.wakes as f64 - 0.5).max(0.5)),
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn wake_timeout(args: &IdleArgs) -> Duration {
    Duration::from_secs_f64(args.pause_ms / 1000.0 * args.wakes as f64 + 30.0)
}

/// The wake-up exchange with a daemon of its own at its defaults (automatic fast channels, the
/// master's policy `--idle`), and the channels that daemon made.
fn auto_wake(
    args: &IdleArgs,
    exe: &Path,
    dnperf: &Path,
    stop: &Stop,
) -> Result<(docknet_perf::stats::Summary, u64)> {
    let d = Daemon::start_auto_idle(exe, &args.idle)?;
    let mut c = d.client()?;
    let s = Ipv4Addr::new(10, 91, 253, 2);
    c.pipe_create("awake-s", &format!("{s}/16"), None, None)?;
    c.pipe_create("awake-c", "10.91.253.1/16", None, None)?;
    let server = run_in(&d, exe, dnperf, "awake-s", &server_args(&args.idle, s))?;
    wait_attached(&d, &["awake-s".to_string()], stop)?;
    std::thread::sleep(Duration::from_millis(200));
    let report: ClientReport =
        run_in(&d, exe, dnperf, "awake-c", &wake_client(args, "docknet", s))?
            .result(wake_timeout(args), stop)
            .context("the wake-up client at the daemon's defaults")?;
    server.finish(stop);
    let made = c.status()?.auto_channels_made;
    let ow = report
        .result
        .request_ns
        .context("the wake-up client at the daemon's defaults reported no latency")?;
    Ok((ow, made))
}

/// The wake-up exchange over the loopback of a new namespace (kernel TCP).
fn kernel_wake(
    args: &IdleArgs,
    dnperf: &Path,
    stop: &Stop,
) -> Result<docknet_perf::stats::Summary> {
    let ns = crate::proc::Netns::add("idle")?;
    let lo = Ipv4Addr::LOCALHOST;
    let mut sargs = server_args("block", lo);
    sargs[2] = "kernel".into();
    let server = Proc::spawn(
        crate::proc::in_ns(&ns.0, dnperf, sargs),
        "kernel wake-up server",
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let report: ClientReport = Proc::spawn(
        crate::proc::in_ns(&ns.0, dnperf, wake_client(args, "kernel", lo)),
        "kernel wake-up client",
    )?
    .result(wake_timeout(args), stop)
    .context("the kernel wake-up client")?;
    server.finish(stop);
    report
        .result
        .request_ns
        .context("the kernel wake-up client reported no latency")
}

/// Runs the measurement (root).
pub fn measure(args: &IdleArgs, stop: &Stop) -> Result<IdleResult> {
    if args.containers == 0 || args.containers > 2000 {
        bail!("--containers must be 1..=2000");
    }
    if args.seconds <= 0.0 || args.wakes == 0 || args.pause_ms < 0.0 {
        bail!("--seconds and --wakes must be positive, --pause-ms not negative");
    }
    let exe = std::env::current_exe()?;
    let dnperf = dnperf_path(&exe)?;
    let d = Daemon::start_on(&exe, &args.idle, None, 0, None)?;
    let mut c = d.client()?;
    let names: Vec<String> = (0..args.containers).map(|i| format!("i{i}")).collect();
    let mut servers = Vec::with_capacity(args.containers);
    for (i, n) in names.iter().enumerate() {
        stop.check()?;
        c.pipe_create(n, &format!("{}/16", ip(i)), None, None)?;
        servers.push(run_in(
            &d,
            &exe,
            &dnperf,
            n,
            &server_args(&args.idle, ip(i)),
        )?);
    }
    wait_attached(&d, &names, stop)?;
    eprintln!(
        "idle: {} containers up; settling 3 s, then measuring {} s",
        args.containers, args.seconds
    );
    std::thread::sleep(Duration::from_secs(3));
    stop.check()?;
    let mut roots: Vec<u32> = servers.iter().map(Proc::pid).collect();
    roots.extend(d.pid());
    let mut meter = CpuMeter::default();
    meter.refresh(&roots);
    let (ns0, w0, t0) = (
        meter.ns_by_task(),
        engine_switches(&meter.pids),
        Instant::now(),
    );
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    let (ns1, w1, secs) = (
        meter.ns_by_task(),
        engine_switches(&meter.pids),
        t0.elapsed().as_secs_f64(),
    );
    stop.check()?;
    // the wake-up pair
    let (ws, wc) = (Ipv4Addr::new(10, 91, 255, 2), Ipv4Addr::new(10, 91, 255, 1));
    c.pipe_create("wake-s", &format!("{ws}/16"), None, None)?;
    c.pipe_create("wake-c", &format!("{wc}/16"), None, None)?;
    let server = run_in(&d, &exe, &dnperf, "wake-s", &server_args(&args.idle, ws))?;
    wait_attached(&d, &["wake-s".to_string()], stop)?;
    std::thread::sleep(Duration::from_millis(200));
    let client_args = wake_client(args, "docknet", ws);
    eprintln!(
        "idle: {} messages, each after {} ms of idle",
        args.wakes, args.pause_ms
    );
    let report: ClientReport = run_in(&d, &exe, &dnperf, "wake-c", &client_args)?
        .result(wake_timeout(args), stop)
        .context("the wake-up client")?;
    server.finish(stop);
    let ow = report
        .result
        .request_ns
        .context("the wake-up client reported no latency")?;
    // the same over a fast channel: no master on the path
    c.pipe_create("fwake-s", "10.91.254.2/16", None, None)?;
    c.pipe_create("fwake-c", "10.91.254.1/16", None, None)?;
    c.fc_connect("fwake-c", "fwake-s", None)?;
    let fs = Ipv4Addr::new(10, 91, 254, 2);
    let fserver = run_in(&d, &exe, &dnperf, "fwake-s", &server_args(&args.idle, fs))?;
    wait_attached(&d, &["fwake-s".to_string()], stop)?;
    std::thread::sleep(Duration::from_millis(200));
    eprintln!("idle: the same over a fast channel");
    let freport: ClientReport = run_in(
        &d,
        &exe,
        &dnperf,
        "fwake-c",
        &wake_client(args, "docknet", fs),
    )?
    .result(wake_timeout(args), stop)
    .context("the fast-channel wake-up client")?;
    fserver.finish(stop);
    let fc = freport
        .result
        .request_ns
        .context("the fast-channel wake-up client reported no latency")?;
    drop(servers);
    drop(d);
    eprintln!("idle: the same with the daemon at its defaults (automatic fast channels)");
    let (auto, auto_made) = auto_wake(args, &exe, &dnperf, stop)?;
    eprintln!("idle: the same over the kernel's loopback");
    let kernel = kernel_wake(args, &dnperf, stop)?;
    let cpu = CpuMeter::delta(&ns0, &ns1) as f64 / 1e9 / secs * 100.0;
    let mut env = Env::here(args.seconds, 3.0, 1);
    env.workload = Some(Workload::Idle);
    let mut r = IdleResult {
        containers: args.containers,
        idle: args.idle.clone(),
        seconds: (secs * 100.0).round() / 100.0,
        cpu_pct_of_core: cpu,
        per_container_pct: cpu / args.containers as f64,
        engine_wakeups_per_s: w1.saturating_sub(w0) as f64 / secs / args.containers as f64,
        wake_p50_us: ow.p50 as f64 / 1000.0,
        wake_p99_us: ow.p99 as f64 / 1000.0,
        wake_samples: ow.count,
        fc_wake_p50_us: fc.p50 as f64 / 1000.0,
        fc_wake_p99_us: fc.p99 as f64 / 1000.0,
        auto_wake_p50_us: auto.p50 as f64 / 1000.0,
        auto_wake_p99_us: auto.p99 as f64 / 1000.0,
        auto_channels_made: auto_made,
        kernel_wake_p50_us: kernel.p50 as f64 / 1000.0,
        kernel_wake_p99_us: kernel.p99 as f64 / 1000.0,
        pause_ms: args.pause_ms,
        env,
        results: Vec::new(),
    };
    r.results = r.rows();
    Ok(r)
}

/// Runs `docknet bench idle`: measures, prints a table and, with `--json`, writes the result.
pub fn run(args: IdleArgs) -> Result<()> {
    let stop = Stop::on_signals()?;
    let r = measure(&args, &stop)?;
    println!(
        "{:<10} {:>10} {:>8} {:>11} {:>13} {:>13} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12}",
        "IDLE",
        "CONTAINERS",
        "SECONDS",
        "CPU%CORE",
        "PER-CONT%",
        "ENGINE-WAKE/S",
        "WAKE-p50",
        "WAKE-p99",
        "FC-p50",
        "FC-p99",
        "AUTO-p50",
        "AUTO-p99",
        "KERNEL-p50",
        "KERNEL-p99"
    );
    println!(
        "{:<10} {:>10} {:>8.1} {:>11.3} {:>13.4} {:>13.1} {:>8.1}us {:>8.1}us {:>8.1}us {:>8.1}us {:>8.1}us {:>8.1}us {:>10.1}us {:>10.1}us",
        r.idle,
        r.containers,
        r.seconds,
        r.cpu_pct_of_core,
        r.per_container_pct,
        r.engine_wakeups_per_s,
        r.wake_p50_us,
        r.wake_p99_us,
        r.fc_wake_p50_us,
        r.fc_wake_p99_us,
        r.auto_wake_p50_us,
        r.auto_wake_p99_us,
        r.kernel_wake_p50_us,
        r.kernel_wake_p99_us
    );
    let mut out: Vec<PathBuf> = args.json.iter().cloned().collect();
    if let Some(dir) = &args.report {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        out.push(dir.join("idle.json"));
    }
    for p in &out {
        std::fs::write(p, serde_json::to_string_pretty(&r)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
        println!("wrote {}", p.display());
    }
    if let Some(dir) = &args.report {
        let index = crate::report::build_dir(dir)?;
        println!("report: {}", index.display());
    }
    Ok(())
}
