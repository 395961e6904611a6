//! `docknet bench startup`: Suo et al.'s network start-up time. For every repetition, a fresh
//! container network is created (kernel: the namespaces and the CNI ADDs of the mode's
//! topology; DockNet: two pipes on a running daemon, and their fast channel in
//! `docknet-fc`), a server is started in it (`dnperf server`) and a client in the other
//! container (`dnperf reach`) connects and pings until both are answered. The times are
//! CLOCK_MONOTONIC (one clock for every namespace) from just before the create step: create
//! to the first answered connect, and to the first echo reply (DockNet: answered by the
//! server's DockLib stack).

use crate::mode::{Mode, Topology};
use crate::plan::DaemonSetup;
use crate::proc::{in_ns, Proc, Stop};
use crate::progress::Progress;
use crate::row::{NotAvailable, Row, Status, Tool, Workload};
use crate::topology::daemon::Daemon;
use crate::topology::{probe, KernelLab};
use crate::workload::dnperf_path;
use anyhow::{bail, Context, Result};
use docknet_perf::report::ReachReport;
use docknet_perf::stats::now_ns;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Options of `docknet bench startup`.
#[derive(Debug, Clone, clap::Args)]
pub struct StartupArgs {
    /// Modes (one host): loopback, container, veth, bridge, bridge-nat, macvlan, ipvlan, ovs,
    /// docknet, docknet-fc [default: all of them].
    #[arg(long, value_delimiter = ',')]
    pub modes: Option<Vec<String>>,
    /// Repetitions per mode (each builds the network anew).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// DockNet: the idle policy of the daemon, the server and the client.
    #[arg(long, default_value = "adaptive")]
    pub idle: String,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write tcp-startup.json and tcp-startup.md into this directory and (re)build its HTML
    /// report.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// What the start-up figures are, in words (report and Markdown).
pub const ABOUT: &str = "Each repetition creates a fresh network for two containers and starts \
    a server (`dnperf server`) in one and `dnperf reach` in the other, which connects (a fresh \
    connect every 1 ms until one is answered) and pings (the kernel's raw ICMP socket; on \
    DockNet an echo answered by the server's DockLib stack). Times are CLOCK_MONOTONIC from \
    just before the create step: kernel modes create their namespaces and run the CNI ADDs \
    (ip or ovs-vsctl where no plugin fits) and start both programs with `ip netns exec`; \
    DockNet modes create two pipes (and their fast channel) on a running daemon and start both \
    programs with `docknet run`. Both include the programs' process start. Percentiles are over \
    the repetitions answered; UNANSWERED counts those not answered within 5 s.";

/// The modes start-up is measured on by default.
pub const DEFAULT_MODES: &str =
    "loopback,container,veth,bridge,bridge-nat,macvlan,ipvlan,ovs,docknet,docknet-fc";

/// One repetition: milliseconds from create to the end of create, to the answered connect and
/// to the answered ping.
#[derive(Debug, Clone, Copy)]
struct Sample {
    create: f64,
    connect: f64,
    ping: f64,
}

const PORT: u16 = 7400;

fn ms(from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1e6
}

fn reach_args(stack: &str, idle: &str, target: &str, ping: &str) -> Vec<String> {
    [
        "reach",
        "--stack",
        stack,
        "--idle",
        idle,
        "--connect",
        target,
        "--ping",
        ping,
        "--retry-us",
        "1000",
        "--timeout",
        "5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn server_args(stack: &str, idle: &str, bind: &str) -> Vec<String> {
    [
        "server", "--stack", stack, "--idle", idle, "--conns", "0", "--bind", bind,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// One repetition on a kernel mode.
fn kernel_once(mode: Mode, dnperf: &Path, stop: &Stop) -> Result<Sample> {
    let t0 = now_ns();
    let lab = KernelLab::build(mode, 1, 1500)?;
    let built = now_ns();
    let p = lab.pairs[0].clone();
    let server = Proc::spawn(
        in_ns(
            &p.server_ns,
            dnperf,
            server_args("kernel", "spin", &format!("{}:{}", p.bind, p.port)),
        ),
        "dnperf server",
    )?;
    // bridge-nat: the connect goes through the mapped host port; the ping to the server
    let r: ReachReport = Proc::spawn(
        in_ns(
            &p.client_ns,
            dnperf,
            reach_args(
                "kernel",
                "spin",
                &format!("{}:{}", p.target, p.port),
                &p.bind,
            ),
        ),
        "dnperf reach",
    )?
    .result(Duration::from_secs(30), stop)?;
    // it serves forever: ended now
    drop(server);
    drop(lab);
    sample(t0, built, &r)
}

fn sample(t0: u64, built: u64, r: &ReachReport) -> Result<Sample> {
    let Some(ping) = r.ping_ns else {
        bail!("dnperf reach did not ping");
    };
    Ok(Sample {
        create: ms(t0, built),
        connect: ms(t0, r.connect_ns),
        ping: ms(t0, ping),
    })
}

/// One repetition on a DockNet mode: pipes `s<i>` and `c<i>` on the running daemon `d`.
fn docknet_once(
    d: &Daemon,
    exe: &Path,
    dnperf: &Path,
    mode: Mode,
    i: usize,
    idle: &str,
    stop: &Stop,
) -> Result<Sample> {
    let mut c = d.client()?;
    let (sp, cp) = (format!("s{i}"), format!("c{i}"));
    let (sip, cip) = (
        format!("10.77.{}.{}", 1 + i / 250, 1 + i % 250),
        format!("10.77.{}.{}", 101 + i / 250, 1 + i % 250),
    );
    let t0 = now_ns();
    c.pipe_create(&sp, &format!("{sip}/16"), Some(1500), None)
        .with_context(|| format!("creating pipe {sp}"))?;
    c.pipe_create(&cp, &format!("{cip}/16"), Some(1500), None)
        .with_context(|| format!("creating pipe {cp}"))?;
    if mode == Mode::DocknetFc {
        c.fc_connect(&cp, &sp, None)
            .with_context(|| format!("connecting {cp} and {sp}"))?;
    }
    let built = now_ns();
    let run = |pipe: &str, args: Vec<String>, what: &str| {
        let mut cmd = d.cmd(exe);
        cmd.args(["run", "--pipe", pipe, "--"])
            .arg(dnperf)
            .args(args);
        Proc::spawn(cmd, what)
    };
    let bind = format!("{sip}:{PORT}");
    let server = run(&sp, server_args("docknet", idle, &bind), "dnperf server")?;
    let r: ReachReport = run(
        &cp,
        reach_args("docknet", idle, &bind, &sip),
        "dnperf reach",
    )?
    .result(Duration::from_secs(30), stop)?;
    // it serves forever: ended now
    drop(server);
    for p in [&cp, &sp] {
        c.pipe_rm(p).with_context(|| format!("removing pipe {p}"))?;
    }
    sample(t0, built, &r)
}

/// Nearest-rank percentile of sorted `v`.
fn pct(v: &[f64], p: f64) -> f64 {
    let k = ((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[k - 1]
}

/// The row of a mode from its samples.
fn row(mode: Mode, idle: &str, s: &[Sample]) -> Row {
    let sorted = |f: fn(&Sample) -> f64| {
        let mut v: Vec<f64> = s.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (create, connect, ping) = (
        sorted(|x| x.create),
        sorted(|x| x.connect),
        sorted(|x| x.ping),
    );
    let what = if mode.is_docknet() {
        "pipe create (+ fast channel) on a running daemon; server and client started by `docknet run`"
    } else {
        "namespaces and CNI ADD (or ip/ovs-vsctl); server and client started by `ip netns exec`"
    };
    Row {
        p50_ms: Some(pct(&connect, 50.0)),
        p99_ms: Some(pct(&connect, 99.0)),
        ping_p50_ms: Some(pct(&ping, 50.0)),
        ping_p99_ms: Some(pct(&ping, 99.0)),
        create_p50_ms: Some(pct(&create, 50.0)),
        mean_us: None,
        repeat: s.len(),
        idle: mode.is_docknet().then(|| idle.to_string()),
        placement: what.into(),
        mtu: Some(if mode.crosses_lo() {
            crate::mode::LO_MTU
        } else {
            1500
        }),
        builder: Some(mode.builder().name().into()),
        ..Row::new(mode, Tool::Dnperf, Workload::Startup, 1)
    }
}

/// Measures every mode of `args`: the rows and the modes left out.
pub fn measure(
    args: &StartupArgs,
    stop: &Stop,
    progress: &mut Progress,
) -> Result<(Vec<Row>, Vec<NotAvailable>)> {
    let exe = std::env::current_exe()?;
    let dnperf = dnperf_path(&exe)?;
    let modes = modes(args)?;
    let (mut rows, mut skipped) = (Vec::new(), Vec::new());
    let mut skip = |mode: Mode, status, reason: String, progress: &mut Progress| {
        let na = NotAvailable::new(mode.name(), status, reason);
        progress.line(&na.line());
        skipped.push(na);
    };
    for mode in modes {
        stop.check()?;
        if let Some(why) = probe::unavailable(mode) {
            progress.skip(args.reps as u64);
            skip(mode, Status::NotAvailable, why, progress);
            continue;
        }
        let daemon = if mode.is_docknet() {
            let setup = DaemonSetup {
                idle: leak(&args.idle),
                master_core: None,
                master_core_b: None,
                master_nice: 0,
            };
            Some(Daemon::start(&exe, &setup)?)
        } else {
            None
        };
        let mut samples = Vec::with_capacity(args.reps);
        let (mut failed, mut unanswered) = (None, 0u64);
        for i in 0..args.reps {
            stop.check()?;
            progress.start(&format!("{mode} start-up {}/{}", i + 1, args.reps));
            let r = match &daemon {
                Some(d) => docknet_once(d, &exe, &dnperf, mode, i, &args.idle, stop),
                None => kernel_once(mode, &dnperf, stop),
            };
            match r {
                Ok(s) => {
                    progress.done(&format!(
                        "  {mode}: create {:.2} ms, connect {:.2} ms, ping {:.2} ms",
                        s.create, s.connect, s.ping
                    ));
                    samples.push(s);
                }
                Err(e) => {
                    if stop.raised() {
                        return Err(e);
                    }
                    // a container that never answered: counted, and the next repetition
                    // goes on (a failure to build stops the mode)
                    let msg = format!("{e:#}");
                    if msg.contains("dnperf reach failed") {
                        progress.done(&format!("  {mode}: not answered within 5 s"));
                        unanswered += 1;
                        continue;
                    }
                    progress.skip((args.reps - i) as u64);
                    failed = Some(e);
                    break;
                }
            }
        }
        drop(daemon);
        match failed {
            Some(e) => skip(mode, Status::Skipped, format!("failed: {e:#}"), progress),
            None if samples.is_empty() => skip(
                mode,
                Status::Skipped,
                format!("no repetition answered within 5 s ({unanswered} tried)"),
                progress,
            ),
            None => rows.push(Row {
                lost: unanswered,
                ..row(mode, &args.idle, &samples)
            }),
        }
    }
    Ok((rows, skipped))
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// The modes of `args`, checked.
pub fn modes(args: &StartupArgs) -> Result<Vec<Mode>> {
    let names: Vec<String> = args
        .modes
        .clone()
        .unwrap_or_else(|| DEFAULT_MODES.split(',').map(String::from).collect());
    let modes = names
        .iter()
        .map(|m| m.parse::<Mode>())
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(m) = modes.iter().find(|m| {
        !m.topologies().contains(&Topology::OneHost)
            || m.is_preload()
            || **m == Mode::Sriov
            || **m == Mode::DocknetPacket
    }) {
        bail!("{m}: bench startup measures the one-host modes (loopback, container, veth, bridge, bridge-nat, macvlan, ipvlan, ovs, docknet, docknet-fc)");
    }
    if args.reps == 0 || args.reps > 1000 {
        bail!("--reps must be 1 ..= 1000");
    }
    if !crate::plan::PEER_IDLE.contains(&args.idle.as_str()) {
        bail!(
            "--idle: {:?} is not one of {}",
            args.idle,
            crate::plan::PEER_IDLE.join(", ")
        );
    }
    Ok(modes)
}

/// The start-up table, one line per mode.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<12} {:>5} {:>10} {:>12} {:>12} {:>11} {:>11} {:>10}\n",
        "MODE",
        "REPS",
        "CREATE-p50",
        "CONNECT-p50",
        "CONNECT-p99",
        "PING-p50",
        "PING-p99",
        "UNANSWERED"
    );
    for r in rows.iter().filter(|r| r.workload == Workload::Startup) {
        let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.2}ms"));
        s += &format!(
            "{:<12} {:>5} {:>10} {:>12} {:>12} {:>11} {:>11} {:>10}\n",
            r.mode.name(),
            r.repeat,
            f(r.create_p50_ms),
            f(r.p50_ms),
            f(r.p99_ms),
            f(r.ping_p50_ms),
            f(r.ping_p99_ms),
            r.lost
        );
    }
    s
}

/// The start-up target: DockNet's pipe create to answered connect within 5 ms (median).
pub fn targets(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .filter(|r| r.workload == Workload::Startup && r.mode.is_docknet())
        .filter_map(|r| {
            let p = r.p50_ms?;
            Some(format!(
                "{} start-up (pipe create to answered connect) p50 {p:.2} ms <= 5 ms: {}",
                r.mode,
                if p <= 5.0 { "met" } else { "MISSED" }
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_and_modes_are_checked() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(pct(&v, 50.0), 10.0);
        assert_eq!(pct(&v, 99.0), 20.0);
        assert_eq!(pct(&[3.0], 99.0), 3.0);
        let a = |m: &str| StartupArgs {
            modes: Some(vec![m.into()]),
            reps: 3,
            idle: "adaptive".into(),
            json: None,
            report: None,
        };
        assert!(modes(&a("bridge")).is_ok());
        assert!(modes(&a("vxlan")).is_err());
        assert!(modes(&a("sriov")).is_err());
    }
}
