//! `docknet bench startup`: Suo et al.'s network start-up time. For every repetition, a fresh
//! container network is created (kernel: the namespaces and the CNI ADDs of the mode's
//! topology; DockNet: two pipes on a running daemon, and their fast channel in
//! `docknet-fc`), a server is started in it (`dnperf server`) and a client in the other
//! container (`dnperf reach`) connects and pings until both are answered. The times are
//! CLOCK_MONOTONIC (one clock for every namespace) from just before the create step: create
//! to the first answered connect, and to the first echo reply (DockNet: answered by the
//! server's DockLib stack).
//!
//! The programs enter their network namespace themselves (`dnperf --netns`: no launcher
//! program's start is counted). DockNet's programs start one of two ways ([`Launch`]): in
//! network namespaces that exist before the pipes, as a pod's exist before its CNI ADD, with
//! the pipes attached in them as DockNet's CNI plugin does; or as `docknet run` containers,
//! whose namespaces and walls (mount namespace, root, seccomp) are part of the time.

use crate::mode::{Mode, Topology};
use crate::plan::DaemonSetup;
use crate::proc::{Netns, Proc, Stop};
use crate::progress::Progress;
use crate::row::{NotAvailable, Row, Status, Tool, Workload};
use crate::topology::daemon::Daemon;
use crate::topology::wire::{Shape, Wire};
use crate::topology::{probe, DocknetLab, KernelLab};
use crate::workload::dnperf_path;
use anyhow::{bail, Context, Result};
use docknet_perf::report::ReachReport;
use docknet_perf::stats::now_ns;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Options of `docknet bench startup`.
#[derive(Debug, Clone, clap::Args)]
pub struct StartupArgs {
    /// Modes. One host: loopback, container, veth, bridge, bridge-nat, macvlan, ipvlan, ovs,
    /// docknet, docknet-fc [default: all of them]. Two hosts: host, routed, nat, macvlan,
    /// vxlan, vxlan-openvpn, docknet, docknet-packet, docknet-vxlan [default: all of them but
    /// docknet-vxlan].
    #[arg(long, value_delimiter = ',')]
    pub modes: Option<Vec<String>>,
    /// one-host, or two-host: the server's container on host B, the client's on host A. The
    /// hosts and the wire exist before the clock starts (as machines do); what is timed is
    /// the containers' network on them (CNI ADDs, the overlay's devices and tunnel, DockNet's
    /// pipes on the running daemons that drive the wire).
    #[arg(long, default_value = "one-host")]
    pub topology: Topology,
    /// Repetitions per mode (each builds the network anew).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// DockNet: the idle policy of the daemon, the server and the client.
    #[arg(long, default_value = "adaptive")]
    pub idle: String,
    /// DockNet: how the programs start, one row each: netns (in network namespaces made
    /// before the clock starts, the pipes attached in them, as DockNet's CNI plugin does)
    /// and/or run (`docknet run`: containers with their walls, which make their namespaces
    /// inside the measured time).
    #[arg(long, value_delimiter = ',', default_value = "netns,run")]
    pub launch: Vec<String>,
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
    just before the create step. Kernel modes create their namespaces and run the CNI ADDs \
    (ip or ovs-vsctl where no plugin fits). DockNet modes create two pipes (and their fast \
    channel, at the pipes' MTU of 1500) on a running daemon; LAUNCH netns attaches them in two \
    network namespaces made before the clock starts (as a pod's exist before its CNI ADD; \
    DockNet's CNI plugin attaches the same way), LAUNCH run starts the programs with \
    `docknet run` (containers: their namespaces, root and seccomp inside the time). Everywhere \
    else the programs enter their namespace themselves (`dnperf --netns`, no launcher's start \
    counted); every time includes the programs' own start. Percentiles are over the \
    repetitions answered; UNANSWERED counts those not answered within 5 s.";

/// How DockNet's programs are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// In namespaces made beforehand, the pipes attached in them.
    Netns,
    /// `docknet run`: a container with its walls.
    Run,
}

impl Launch {
    /// The name in rows and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Launch::Netns => "netns",
            Launch::Run => "run",
        }
    }

    fn parse(s: &str) -> Result<Launch> {
        match s {
            "netns" => Ok(Launch::Netns),
            "run" => Ok(Launch::Run),
            _ => bail!("--launch: {s:?} is not netns or run"),
        }
    }
}

/// The modes start-up is measured on by default.
pub const DEFAULT_MODES: &str =
    "loopback,container,veth,bridge,bridge-nat,macvlan,ipvlan,ovs,docknet,docknet-fc";
/// The modes start-up is measured on by default across two hosts.
pub const DEFAULT_TWO_HOST_MODES: &str =
    "host,routed,nat,macvlan,vxlan,vxlan-openvpn,docknet,docknet-packet";

/// One repetition: milliseconds from create to the end of create, to the answered connect and
/// to the answered ping.
#[derive(Debug, Clone, Copy)]
struct Sample {
    create: f64,
    connect: f64,
    ping: f64,
    /// Making the namespaces before the clock started (DockNet, launch netns).
    before: Option<f64>,
}

const PORT: u16 = 7400;

/// `dnperf ARGS` in network namespace `ns` (dnperf enters it itself: no launcher program's
/// start is counted, for any mode).
fn dnperf_in(ns: &str, dnperf: &Path, args: Vec<String>) -> Command {
    let mut c = Command::new(dnperf);
    c.arg("--netns").arg(format!("/run/netns/{ns}")).args(args);
    c
}

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
fn kernel_once(mode: Mode, topology: Topology, dnperf: &Path, stop: &Stop) -> Result<Sample> {
    // two hosts: the hosts and the wire first, not timed (fresh ones each repetition, so no
    // host keeps what the last repetition's network left on it)
    let wire = match topology {
        Topology::TwoHost => Some(Wire::build(1500, &Shape::default())?),
        Topology::OneHost => None,
    };
    let t0 = now_ns();
    let lab = match wire {
        Some(w) => KernelLab::build_two_host_on(w, mode, 1)?,
        None => KernelLab::build(mode, 1, 1500)?,
    };
    let built = now_ns();
    let p = lab.pairs[0].clone();
    let server = Proc::spawn(
        dnperf_in(
            &p.server_ns,
            dnperf,
            server_args("kernel", "spin", &format!("{}:{}", p.bind, p.port)),
        ),
        "dnperf server",
    )?;
    // bridge-nat: the connect goes through the mapped host port; the ping to the server
    let r: ReachReport = Proc::spawn(
        dnperf_in(
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
        before: None,
    })
}

/// One repetition on a DockNet mode: pipes `s<i>` and `c<i>` on the running daemon `d`,
/// the programs started the `launch` way.
#[allow(clippy::too_many_arguments)]
fn docknet_once(
    (ds, dc): (&Daemon, &Daemon),
    exe: &Path,
    dnperf: &Path,
    mode: Mode,
    launch: Launch,
    i: usize,
    idle: &str,
    stop: &Stop,
) -> Result<Sample> {
    // the server's pipe on `ds`, the client's on `dc` (the same daemon on one host)
    let (mut c, mut cc) = (ds.client()?, dc.client()?);
    let (sp, cp) = (format!("s{i}"), format!("c{i}"));
    let (sip, cip) = (
        format!("10.77.{}.{}", 1 + i / 250, 1 + i % 250),
        format!("10.77.{}.{}", 101 + i / 250, 1 + i % 250),
    );
    // launch netns: the namespaces exist before the clock starts, as a pod's do before its
    // CNI ADD (removed when this returns, after the pipes)
    let t_ns = now_ns();
    let namespaces = match launch {
        Launch::Netns => Some((Netns::add("su")?, Netns::add("su")?)),
        Launch::Run => None,
    };
    let t0 = now_ns();
    let before = namespaces.as_ref().map(|_| ms(t_ns, t0));
    c.pipe_create(&sp, &format!("{sip}/16"), Some(1500), None)
        .with_context(|| format!("creating pipe {sp}"))?;
    cc.pipe_create(&cp, &format!("{cip}/16"), Some(1500), None)
        .with_context(|| format!("creating pipe {cp}"))?;
    if mode == Mode::DocknetFc {
        // the pipes' MTU (the default; a channel at MTU 65535 would be a 33 MB region whose
        // pages are all allocated at once: ~10 ms here)
        c.fc_connect(&cp, &sp, None)
            .with_context(|| format!("connecting {cp} and {sp}"))?;
    }
    if let Some((sns, cns)) = &namespaces {
        c.pipe_attach(&sp, &sns.path(), None)
            .with_context(|| format!("attaching pipe {sp} in {}", sns.0))?;
        cc.pipe_attach(&cp, &cns.path(), None)
            .with_context(|| format!("attaching pipe {cp} in {}", cns.0))?;
    }
    let built = now_ns();
    let start = |pipe: &str, args: Vec<String>, what: &str| {
        let cmd = match &namespaces {
            Some((sns, cns)) => dnperf_in(if pipe == sp { &sns.0 } else { &cns.0 }, dnperf, args),
            None => {
                let mut cmd = if pipe == sp { ds } else { dc }.cmd(exe);
                cmd.args(["run", "--pipe", pipe, "--"])
                    .arg(dnperf)
                    .args(args);
                cmd
            }
        };
        Proc::spawn(cmd, what)
    };
    let bind = format!("{sip}:{PORT}");
    let server = start(&sp, server_args("docknet", idle, &bind), "dnperf server")?;
    let r = start(
        &cp,
        reach_args("docknet", idle, &bind, &sip),
        "dnperf reach",
    )?
    .result::<ReachReport>(Duration::from_secs(30), stop);
    // it serves forever: ended now
    drop(server);
    cc.pipe_rm(&cp)
        .with_context(|| format!("removing pipe {cp}"))?;
    c.pipe_rm(&sp)
        .with_context(|| format!("removing pipe {sp}"))?;
    drop(namespaces);
    Ok(Sample {
        before,
        ..sample(t0, built, &r?)?
    })
}

/// Nearest-rank percentile of sorted `v`.
fn pct(v: &[f64], p: f64) -> f64 {
    let k = ((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[k - 1]
}

/// The row of a mode (started the `launch` way) from its samples.
fn row(mode: Mode, launch: Launch, idle: &str, s: &[Sample]) -> Row {
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
    let before: Vec<f64> = s.iter().filter_map(|x| x.before).collect();
    let what = match (mode.is_docknet(), launch) {
        (true, Launch::Run) => "pipe create (+ fast channel at the pipes' MTU) on a running daemon; server and client started by `docknet run`".to_string(),
        (true, Launch::Netns) => {
            let mut v = before.clone();
            v.sort_by(f64::total_cmp);
            format!(
                "two network namespaces made before the clock started (ip netns add, lo up: {} p50 for both, not counted); pipe create (+ fast channel at the pipes' MTU) on a running daemon, each attached in its namespace; server and client enter their namespaces themselves (`dnperf --netns`)",
                if v.is_empty() { "-".to_string() } else { format!("{:.2} ms", pct(&v, 50.0)) }
            )
        }
        (false, _) => "namespaces and CNI ADD (or ip/ovs-vsctl); server and client enter their namespaces themselves (`dnperf --netns`)".to_string(),
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
        launch: Some(launch.name().into()),
        placement: what,
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
            progress.skip(steps(mode, args)?);
            skip(mode, Status::NotAvailable, why, progress);
            continue;
        }
        let launches = if mode.is_docknet() {
            launches(args)?
        } else {
            vec![Launch::Netns]
        };
        for launch in launches {
            // DockNet: the daemon (two hosts: the hosts, the wire and a daemon on each
            // driving it) runs before the clock starts, as a host's daemon does
            let setup = DaemonSetup {
                idle: leak(&args.idle),
                master_core: None,
                master_core_b: None,
                master_nice: 0,
            };
            let daemon = match (mode.is_docknet(), args.topology) {
                (false, _) => None,
                (true, Topology::OneHost) => Some(Daemons::One(Daemon::start(&exe, &setup)?)),
                (true, Topology::TwoHost) => Some(Daemons::Two(DocknetLab::build_two_host(
                    &exe,
                    mode,
                    &setup,
                    0,
                    1500,
                    &Shape::default(),
                )?)),
            };
            let label = if mode.is_docknet() {
                format!("{mode} ({})", launch.name())
            } else {
                mode.to_string()
            };
            let mut samples = Vec::with_capacity(args.reps);
            let (mut failed, mut unanswered) = (None, 0u64);
            for i in 0..args.reps {
                stop.check()?;
                progress.start(&format!("{label} start-up {}/{}", i + 1, args.reps));
                let r = match &daemon {
                    Some(d) => {
                        docknet_once(d.pair(), &exe, &dnperf, mode, launch, i, &args.idle, stop)
                    }
                    None => kernel_once(mode, args.topology, &dnperf, stop),
                };
                match r {
                    Ok(s) => {
                        progress.done(&format!(
                            "  {label}: create {:.2} ms, connect {:.2} ms, ping {:.2} ms",
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
                            progress.done(&format!("  {label}: not answered within 5 s"));
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
                Some(e) => skip(
                    mode,
                    Status::Skipped,
                    format!("{label}: failed: {e:#}"),
                    progress,
                ),
                None if samples.is_empty() => skip(
                    mode,
                    Status::Skipped,
                    format!("{label}: no repetition answered within 5 s ({unanswered} tried)"),
                    progress,
                ),
                None => {
                    let mut r = row(mode, launch, &args.idle, &samples);
                    if args.topology == Topology::TwoHost {
                        r.placement += "; two hosts, the server's container on B, the client's on A: the hosts, the wire and DockNet's daemons on them made before the clock";
                    }
                    rows.push(Row {
                        lost: unanswered,
                        topology: args.topology,
                        ..r
                    })
                }
            }
        }
    }
    Ok((rows, skipped))
}

/// The running daemon(s) of a DockNet mode.
enum Daemons {
    One(Daemon),
    Two(DocknetLab),
}

impl Daemons {
    /// (the server's daemon, the client's): host B's and host A's on two hosts.
    fn pair(&self) -> (&Daemon, &Daemon) {
        match self {
            Daemons::One(d) => (d, d),
            Daemons::Two(l) => (l.daemon_b.as_ref().unwrap_or(&l.daemon), &l.daemon),
        }
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// The launches of `args`, checked.
fn launches(args: &StartupArgs) -> Result<Vec<Launch>> {
    let mut v = Vec::new();
    for l in &args.launch {
        let l = Launch::parse(l)?;
        if !v.contains(&l) {
            v.push(l);
        }
    }
    if v.is_empty() {
        bail!("--launch: give netns, run or both");
    }
    Ok(v)
}

/// Repetitions `mode` makes under `args` (one set per launch on DockNet).
pub fn steps(mode: Mode, args: &StartupArgs) -> Result<u64> {
    let n = if mode.is_docknet() {
        launches(args)?.len()
    } else {
        1
    };
    Ok((n * args.reps) as u64)
}

/// The modes of `args`, checked.
pub fn modes(args: &StartupArgs) -> Result<Vec<Mode>> {
    let default = match args.topology {
        Topology::OneHost => DEFAULT_MODES,
        Topology::TwoHost => DEFAULT_TWO_HOST_MODES,
    };
    let names: Vec<String> = args
        .modes
        .clone()
        .unwrap_or_else(|| default.split(',').map(String::from).collect());
    let modes = names
        .iter()
        .map(|m| m.parse::<Mode>())
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(m) = modes.iter().find(|m| {
        !m.topologies().contains(&args.topology)
            || m.is_preload()
            || **m == Mode::Sriov
            // (its pods are the pairs workloads'; a start-up here would make plain pipes)
            || **m == Mode::DocknetPods
            || (args.topology == Topology::OneHost
                && matches!(
                    **m,
                    Mode::DocknetPacket | Mode::DocknetVxlan | Mode::DocknetHost
                ))
    }) {
        bail!(
            "{m}: bench startup measures {} ({default})",
            match args.topology {
                Topology::OneHost => "the one-host modes (two-host ones: --topology two-host)",
                Topology::TwoHost => "these modes across two hosts",
            }
        );
    }
    if args.reps == 0 || args.reps > 1000 {
        bail!("--reps must be 1 ..= 1000");
    }
    launches(args)?;
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
        "{:<19} {:<6} {:>5} {:>10} {:>12} {:>12} {:>11} {:>11} {:>10}\n",
        "MODE",
        "LAUNCH",
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
            "{:<19} {:<6} {:>5} {:>10} {:>12} {:>12} {:>11} {:>11} {:>10}\n",
            match r.topology {
                Topology::TwoHost => format!("{} (2h)", r.mode.name()),
                Topology::OneHost => r.mode.name().to_string(),
            },
            r.launch.as_deref().unwrap_or("-"),
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
            let how = match r.launch.as_deref() {
                Some("run") => "started by docknet run",
                _ => "programs entering namespaces made before",
            };
            Some(format!(
                "{}{} start-up (pipe create to answered connect, {how}) p50 {p:.2} ms <= 5 ms: {}",
                r.mode,
                if r.topology == Topology::TwoHost {
                    " (two hosts)"
                } else {
                    ""
                },
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
            launch: vec!["netns".into(), "run".into()],
            topology: Topology::OneHost,
            json: None,
            report: None,
        };
        assert!(modes(&a("bridge")).is_ok());
        assert!(modes(&a("vxlan")).is_err());
        let two = |m: &str| StartupArgs {
            topology: Topology::TwoHost,
            ..a(m)
        };
        assert!(modes(&two("vxlan-openvpn")).is_ok() && modes(&two("docknet-packet")).is_ok());
        assert!(modes(&two("bridge")).is_err() && modes(&a("docknet-packet")).is_err());
        assert!(modes(&a("sriov")).is_err());
        let mut bad = a("docknet");
        bad.launch = vec!["exec".into()];
        assert!(modes(&bad).is_err());
        assert_eq!(steps(Mode::Docknet, &a("docknet")).unwrap(), 6);
        assert_eq!(steps(Mode::Bridge, &a("bridge")).unwrap(), 3);
    }
}
