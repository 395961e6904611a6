//! `docknet bench chain`: Kratzke's HTTP chain. A load generator (the siege) requests
//! `/bytes/N` from a forwarder (the "ping" service, `docknet-forward`), which requests it from
//! a server (the "pong" service, `docknet-httpd`) and passes the answer back; three containers
//! on the mode's network. The transfer rate (payload bits per second at the load generator)
//! per message size, and its ratio to the reference (all three in one namespace over `lo`):
//! Kratzke's container/reference ratio, and the same for DockNet.
//!
//! With `--topology two-host` the chain spans the lab's two hosts as Kratzke's spanned his
//! machines: the siege and pong on host A, ping on host B, so both hops cross the wire; the
//! reference is `host` (processes on the hosts), the container layer `routed`, the overlay
//! `vxlan`, the encrypted overlay `vxlan-openvpn` (the overlay through an OpenVPN tunnel), and
//! DockNet's daemons drive the wire.

use crate::mode::{Mode, Topology};
use crate::plan::DaemonSetup;
use crate::proc::{in_ns, Proc, Stop};
use crate::progress::Progress;
use crate::row::{NotAvailable, Row, Tool, Workload};
use crate::topology::wire::Shape;
use crate::topology::{probe, DocknetLab, KernelLab};
use crate::workload::http::beside;
use anyhow::{bail, Context, Result};
use docknet_http::client::LoadReport;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Options of `docknet bench chain`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChainArgs {
    /// Modes. One host: loopback (the reference: the three services in one namespace),
    /// bridge (Docker's default, Kratzke's "container"), docknet, docknet-fc [default: those
    /// four]. Two hosts: host (the reference), routed (Kratzke's "container"), macvlan, vxlan
    /// (the overlay), vxlan-openvpn (the encrypted overlay), docknet, docknet-packet,
    /// docknet-vxlan [default:
    /// host,routed,vxlan,vxlan-openvpn,docknet].
    #[arg(long, value_delimiter = ',')]
    pub modes: Option<Vec<String>>,
    /// one-host, or two-host: siege and pong on host A, ping on host B (both hops cross the
    /// wire).
    #[arg(long, default_value = "one-host")]
    pub topology: Topology,
    /// Message sizes (the body of each answer), bytes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10,100,1000,10000,100000,500000"
    )]
    pub sizes: Vec<usize>,
    /// The load generator's connections.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// MTU of the containers' links and pipes (the reference keeps lo's 65536); on two hosts,
    /// of the wire (the overlays' containers get less). 1500 is Docker's default; 65535 shows
    /// what one host allows for both the bridge and DockNet.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    pub mtu: u32,
    /// How DockNet's three containers wait (spin, adaptive, adaptive:SPIN_US, adaptive:SPIN_US:YIELD_US,
    /// block). Three containers and the daemon share this machine's two cores with a
    /// closed-loop load: a waiter that spins takes the CPU the next hop needs, one that sleeps
    /// must be woken (a futex wake, and on a VM an idle vCPU's wake-up); one that yields for a
    /// moment gives its core to the next hop and is still awake when its answer comes.
    /// [default: one host adaptive:0:50 (no spin, 50 us of yielding, then sleep); two hosts
    /// block (the two daemons on the wire need the cores more); measured in
    /// docs/benchmarks.md]
    #[arg(long)]
    pub peer_idle: Option<String>,
    /// How DockNet's daemon waits [default: adaptive:0:200 (no spin, 200 us of yielding,
    /// then sleep); spin or block when the peers spin or block].
    #[arg(long)]
    pub daemon_idle: Option<String>,
    /// Measured seconds per size and run.
    #[arg(long, default_value_t = 1.0)]
    pub duration: f64,
    /// Warm-up seconds per size and run (excluded).
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Runs of each mode at each size. The modes take turns (each mode's chain stays up),
    /// and each row is the median of its runs; every run is in the JSON.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write tcp-chain.json and tcp-chain.md into this directory and (re)build its HTML report.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// What the figures are, in words.
pub const ABOUT: &str = "Kratzke's chain: docknet-load (the siege, keep-alive connections, \
    closed loop) -> docknet-forward (the ping service: one event loop, an upstream keep-alive \
    connection per client connection) -> docknet-httpd (the pong service, /bytes/N). Three \
    containers on the mode's network, unpinned. Every mode's chain is up at once and the modes \
    take turns at each size and run (each row: the median of its runs; the ratios: medians over \
    the reference's median). DockNet's peers wait as --peer-idle says \
    (one host: no spin, 50 us of yielding, then sleep; two hosts: block; unless said) and \
    its daemon as --daemon-idle (no spin, 200 us of yielding, then sleep; block with \
    blocking peers). Transfer rate: \
    payload bits per second at the load generator (answers/s x N x 8). loopback, the reference, \
    runs all three in one namespace over lo (Kratzke's reference ran them on hosts without \
    containers). On two hosts (HOSTS 2) the siege and pong run on host A and ping on host B, \
    so both hops cross the wire as they crossed Kratzke's machines; the reference is host \
    (the services as processes on the hosts), the container layer routed (a bridge per host, \
    routed: Kratzke's Docker mapped ports instead), the overlay vxlan, the encrypted overlay \
    vxlan-openvpn (the overlay through an OpenVPN static-key tunnel, AES-256-CBC and \
    HMAC-SHA256, in userspace as weave's encryption was).";

/// The default modes of a topology.
pub fn default_modes(t: Topology) -> &'static str {
    match t {
        Topology::OneHost => "loopback,bridge,docknet,docknet-fc",
        Topology::TwoHost => "host,routed,vxlan,vxlan-openvpn,docknet",
    }
}

/// The mode every other is compared with: the three services without containers.
pub fn reference(t: Topology) -> Mode {
    match t {
        Topology::OneHost => Mode::Loopback,
        Topology::TwoHost => Mode::Host,
    }
}

const PING_PORT: u16 = 8081;
const PONG_PORT: u16 = 8082;

/// The modes of `args`, checked.
pub fn modes(args: &ChainArgs) -> Result<Vec<Mode>> {
    let names: Vec<String> = args.modes.clone().unwrap_or_else(|| {
        default_modes(args.topology)
            .split(',')
            .map(String::from)
            .collect()
    });
    let mut ms = Vec::new();
    for m in &names {
        if m == "overlay" || m == "overlay-encrypted" {
            bail!(
                "{m}: the overlays span two hosts: --topology two-host --modes vxlan,vxlan-openvpn"
            );
        }
        let mode: Mode = m.parse()?;
        match args.topology {
            Topology::OneHost => {
                if !mode.topologies().contains(&Topology::OneHost)
                    || mode.is_preload()
                    || matches!(mode, Mode::Sriov | Mode::Container)
                {
                    bail!("{mode}: bench chain on one host runs on loopback, the one-host kernel modes with a container each (bridge, veth is a pair only: not it), docknet and docknet-fc (two-host modes: --topology two-host)");
                }
                if mode == Mode::Veth {
                    bail!("veth joins two containers only: the chain needs three");
                }
            }
            Topology::TwoHost => {
                if mode == Mode::Nat {
                    bail!("nat: pong runs on host A, which maps no port to it (the lab's nat maps ports on host B only)");
                }
                if !mode.topologies().contains(&Topology::TwoHost) {
                    bail!("{mode}: bench chain on two hosts runs on host, routed, macvlan, vxlan, vxlan-openvpn, docknet, docknet-packet and docknet-vxlan");
                }
            }
        }
        if !ms.contains(&mode) {
            ms.push(mode);
        }
    }
    if args.sizes.is_empty() || args.sizes.iter().any(|s| *s == 0 || *s > 64 << 20) {
        bail!("--sizes: 1 B ..= 64 MiB each");
    }
    if args.connections == 0 || args.connections > 1000 {
        bail!("--connections: 1 ..= 1000");
    }
    if args.duration <= 0.0 || args.warmup < 0.0 {
        bail!("--duration must be positive, --warmup not negative");
    }
    if args.repeat == 0 || args.repeat > 100 {
        bail!("--repeat: 1 ..= 100");
    }
    Ok(ms)
}

/// The three containers' commands on a built topology: (pong, ping, siege of one size).
struct Chain<'a> {
    exe: &'a Path,
    idle: String,
    k: Option<KernelLab>,
    d: Option<DocknetLab>,
    /// Two hosts: pong runs in pair 1's client container (host A), not its server's.
    two: bool,
}

impl Chain<'_> {
    /// (ping's address, pong's address): where each binds and is reached.
    fn addrs(&self) -> Result<(String, String)> {
        let (ping, pong) = match (&self.k, &self.d) {
            (Some(k), _) => {
                // pair 0: siege (client) and ping (server); pong: pair 1's server, or on two
                // hosts its client (host A)
                let pong = if self.two {
                    k.client_addr(1)?
                } else {
                    k.pairs[1].bind.clone()
                };
                (k.pairs[0].bind.clone(), pong)
            }
            _ => {
                let pong = if self.two {
                    DocknetLab::client_ip(1)
                } else {
                    DocknetLab::server_ip(1)
                };
                (DocknetLab::server_ip(0).to_string(), pong.to_string())
            }
        };
        Ok((format!("{ping}:{PING_PORT}"), format!("{pong}:{PONG_PORT}")))
    }

    /// The pipe of container `who` (DockNet).
    fn pipe(&self, who: usize) -> String {
        match who {
            0 => DocknetLab::client_pipe(0),
            1 => DocknetLab::server_pipe(0),
            _ if self.two => DocknetLab::client_pipe(1),
            _ => DocknetLab::server_pipe(1),
        }
    }

    /// `prog args` in container `who` (0: siege, 1: ping, 2: pong).
    fn cmd(&self, who: usize, prog: &Path, mut args: Vec<String>) -> Command {
        match (&self.k, &self.d) {
            (Some(k), _) => {
                let ns = match who {
                    0 => &k.pairs[0].client_ns,
                    1 => &k.pairs[0].server_ns,
                    _ if self.two => &k.pairs[1].client_ns,
                    _ => &k.pairs[1].server_ns,
                };
                args.splice(0..0, ["--stack".to_string(), "kernel".into()]);
                in_ns(ns, prog, args)
            }
            (_, Some(l)) => {
                let pipe = self.pipe(who);
                args.splice(
                    0..0,
                    [
                        "--stack".to_string(),
                        "docknet".into(),
                        "--idle".into(),
                        self.idle.clone(),
                    ],
                );
                l.run_in(self.exe, &pipe, None, prog, args)
            }
            _ => unreachable!("one of them is built"),
        }
    }
}

/// The daemon's idle policy for `args` (see `--daemon-idle`): unless said, the peers' when
/// they spin or block.
fn daemon_idle(args: &ChainArgs) -> String {
    match (args.daemon_idle.as_deref(), peer_idle(args)) {
        (Some(d), _) => d,
        (None, "spin") => "spin",
        (None, "block") => "block",
        (None, _) => DAEMON_IDLE,
    }
    .to_string()
}

/// The peers' idle policy for `args` (see `--peer-idle`).
fn peer_idle(args: &ChainArgs) -> &str {
    match (&args.peer_idle, args.topology) {
        (Some(p), _) => p,
        (None, Topology::OneHost) => "adaptive:0:50",
        (None, Topology::TwoHost) => "block",
    }
}

/// The daemon's idle policy when the peers neither spin nor block.
pub const DAEMON_IDLE: &str = "adaptive:0:200";

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// One mode's chain, up: pong and ping started and answering through it.
struct Up<'a> {
    mode: Mode,
    /// Ended before the topology they run on (fields drop in order).
    _services: [Proc; 2],
    chain: Chain<'a>,
    ping_url: String,
}

/// Builds `mode`'s topology, starts pong and ping, and waits until the chain answers.
fn bring_up<'a>(args: &ChainArgs, exe: &'a Path, mode: Mode, stop: &Stop) -> Result<Up<'a>> {
    let (httpd, fwd, load) = (
        beside(exe, "docknet-httpd")?,
        beside(exe, "docknet-forward")?,
        beside(exe, "docknet-load")?,
    );
    let two = args.topology == Topology::TwoHost;
    let setup = DaemonSetup {
        // once per mode: the setup takes the policy for the daemon's life
        idle: Box::leak(daemon_idle(args).into_boxed_str()),
        master_core: None,
        master_core_b: None,
        master_nice: 0,
    };
    let (k, d) = match (mode.is_docknet(), two) {
        (true, false) => {
            let l = DocknetLab::build(exe, mode, &setup, 2, args.mtu)?;
            if mode == Mode::DocknetFc {
                // ping -> pong too (the lab's pairs have siege <-> ping already)
                l.daemon
                    .client()?
                    .fc_connect(
                        &DocknetLab::server_pipe(0),
                        &DocknetLab::server_pipe(1),
                        None,
                    )
                    .context("connecting ping and pong")?;
            }
            (None, Some(l))
        }
        (true, true) => {
            let shape = Shape::default();
            let l = DocknetLab::build_two_host(exe, mode, &setup, 2, args.mtu, &shape)?;
            (None, Some(l))
        }
        (false, false) => (Some(KernelLab::build(mode, 2, args.mtu)?), None),
        (false, true) => {
            let k = KernelLab::build_two_host(mode, 2, args.mtu, &Shape::default())?;
            (Some(k), None)
        }
    };
    let chain = Chain {
        exe,
        idle: peer_idle(args).to_string(),
        k,
        d,
        two,
    };
    // each service binds the address the one before it reaches
    let (ping_url, pong_addr) = chain.addrs()?;
    let mut pong = chain.cmd(2, &httpd, strs(&["--bind", &pong_addr]));
    pong.stderr(std::process::Stdio::null());
    let pong = Proc::spawn(pong, "docknet-httpd (pong)")?;
    let mut ping = chain.cmd(1, &fwd, strs(&["--bind", &ping_url, "--to", &pong_addr]));
    ping.stderr(std::process::Stdio::null());
    let ping = Proc::spawn(ping, "docknet-forward (ping)")?;
    if let Some(l) = &chain.d {
        l.wait_attached(&[chain.pipe(1), chain.pipe(2)], Duration::from_secs(20))?;
    }
    // the chain answers end to end (handshakes and neighbours resolved) before any size is
    // timed: a first connection that waited out a retransmission would otherwise eat a short
    // window
    let probe = || -> Result<LoadReport> {
        let c = chain.cmd(
            0,
            &load,
            vec![
                "--requests".into(),
                "4".into(),
                "--connections".into(),
                "1".into(),
                "--json".into(),
                format!("http://{ping_url}/bytes/10"),
            ],
        );
        Proc::spawn(c, "docknet-load (probe)")?.result(Duration::from_secs(5), stop)
    };
    let mut answered = false;
    for _ in 0..6 {
        stop.check()?;
        if probe().is_ok_and(|r| r.ok > 0) {
            answered = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if !answered {
        bail!("the chain did not answer a probe within 30 s");
    }
    Ok(Up {
        mode,
        _services: [pong, ping],
        chain,
        ping_url,
    })
}

/// One run of the siege at `size` through `up`: its row.
fn siege(
    args: &ChainArgs,
    up: &Up,
    (size, repeat): (usize, usize),
    stop: &Stop,
    progress: &mut Progress,
) -> Result<Row> {
    let (mode, two) = (up.mode, up.chain.two);
    let load = beside(up.chain.exe, "docknet-load")?;
    let run = if args.repeat > 1 {
        format!(", run {}/{}", repeat + 1, args.repeat)
    } else {
        String::new()
    };
    progress.start(&format!("{mode} chain {size} B{run}"));
    // the cross-core handoff cost of the moment (the chain's programs are idle here)
    let xcore = crate::xcore::handoff_us(0, 1);
    let c = up.chain.cmd(
        0,
        &load,
        vec![
            "--connections".into(),
            args.connections.to_string(),
            "--duration".into(),
            format!("{}s", args.duration),
            "--warmup".into(),
            format!("{}s", args.warmup),
            "--json".into(),
            format!("http://{}/bytes/{size}", up.ping_url),
        ],
    );
    let r: LoadReport = Proc::spawn(c, "docknet-load (siege)")?.result(
        Duration::from_secs_f64(args.duration + args.warmup + 60.0),
        stop,
    )?;
    let errors: u64 = r.errors.values().sum();
    if r.ok == 0 {
        bail!("no answer came through the chain at {size} B ({errors} errors)");
    }
    let row = Row {
        transfer_bps: Some(r.req_per_s * size as f64 * 8.0),
        req_per_s: Some(r.req_per_s),
        p50_us: Some(r.p50_us),
        p99_us: Some(r.p99_us),
        mean_us: Some(r.mean_us),
        connections: Some(args.connections),
        errors: Some(errors),
        placement: if two {
            "siege (host A) -> ping (host B) -> pong (host A): docknet-load -> docknet-forward -> docknet-httpd, both hops across the wire, unpinned"
        } else {
            "siege -> ping -> pong (docknet-load -> docknet-forward -> docknet-httpd), unpinned"
        }
        .into(),
        topology: args.topology,
        mtu: Some(if mode.crosses_lo() {
            crate::mode::LO_MTU
        } else {
            args.mtu
        }),
        builder: Some(mode.builder().name().into()),
        idle: mode.is_docknet().then(|| peer_idle(args).to_string()),
        daemon_idle: mode.is_docknet().then(|| daemon_idle(args)),
        xcore_us: xcore,
        repeat,
        ..Row::new(mode, Tool::DocknetLoad, Workload::Chain, size)
    };
    progress.done(&format!(
        "  {mode}{} {size} B{run}: {:.1} Mbit/s payload, {:.0} answers/s{}",
        if two { " (two hosts)" } else { "" },
        row.transfer_bps.unwrap_or(0.0) / 1e6,
        r.req_per_s,
        crate::xcore::label(xcore)
    ));
    Ok(row)
}

/// The order the modes take their turns in at one (run, size): each turn starts one mode later
/// than the last, so no mode always runs first (after the machine's quiet moment) or last.
fn turns(modes: usize, turn: usize) -> impl Iterator<Item = usize> {
    (0..modes).map(move |k| (k + turn) % modes.max(1))
}

/// Measures every mode: every run's rows and what was left out. Every mode's chain is up at
/// once (idle between its turns), and the modes take turns at each size and run, so a drift
/// of the machine's speed during the run falls on all of them alike.
pub fn measure(
    args: &ChainArgs,
    stop: &Stop,
    progress: &mut Progress,
) -> Result<(Vec<Row>, Vec<NotAvailable>)> {
    let exe = std::env::current_exe()?;
    let modes = modes(args)?;
    // the chains stay up between their turns: a spinning one shares the machine with others
    let shared = modes.len() > 1 && modes.iter().any(|m| m.is_docknet());
    for (what, p) in [
        ("--peer-idle", peer_idle(args).to_string()),
        ("--daemon-idle", daemon_idle(args)),
    ] {
        let policy =
            docknet_pipe::IdlePolicy::parse(&p).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        if shared && policy == docknet_pipe::IdlePolicy::Spin {
            // the chains stay up between their turns, so a spinning one holds a core
            // through every other mode's turn
            progress.line(&format!(
                "warning: {what} spin: DockNet's chains spin while the other modes take their \
                 turns and take a core from them; measure spin with one mode at a time"
            ));
        }
    }
    let points = (args.sizes.len() * args.repeat) as u64;
    let mut skipped: Vec<NotAvailable> = Vec::new();
    let mut ups: Vec<Option<Up>> = Vec::new();
    for mode in modes {
        stop.check()?;
        if let Some(why) = probe::unavailable(mode) {
            progress.skip(points);
            skipped.push(NotAvailable::here(mode.name(), why));
            continue;
        }
        progress.line(&format!("{mode}: building the chain"));
        match bring_up(args, &exe, mode, stop) {
            Ok(up) => ups.push(Some(up)),
            Err(e) => {
                if stop.raised() {
                    return Err(e);
                }
                progress.skip(points);
                progress.line(&format!("{mode}: skipped: {e:#}"));
                skipped.push(NotAvailable::failed(mode.name(), args.mtu, &e));
            }
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    for repeat in 0..args.repeat {
        for (i, &size) in args.sizes.iter().enumerate() {
            for k in turns(ups.len(), repeat + i) {
                stop.check()?;
                let Some(up) = &ups[k] else {
                    progress.skip(1);
                    continue;
                };
                match siege(args, up, (size, repeat), stop, progress) {
                    Ok(row) => rows.push(row),
                    Err(e) => {
                        if stop.raised() {
                            return Err(e);
                        }
                        // a mode that failed once is left out whole: its runs so far go too
                        // (its later turns count themselves as skipped)
                        let mode = up.mode;
                        progress.skip(1);
                        progress.line(&format!("{mode}: skipped: {e:#}"));
                        skipped.push(NotAvailable::failed(mode.name(), args.mtu, &e));
                        rows.retain(|r| r.mode != mode);
                        ups[k] = None;
                    }
                }
            }
        }
    }
    drop(ups);
    Ok((rows, skipped))
}

/// Transfer rate of `mode` on `t` at `size`.
fn rate(rows: &[Row], mode: Mode, t: Topology, size: usize) -> Option<f64> {
    rows.iter()
        .find(|r| {
            r.workload == Workload::Chain && r.mode == mode && r.topology == t && r.size == size
        })
        .and_then(|r| r.transfer_bps)
}

/// A row's transfer rate over its topology's reference's at its size.
pub fn to_reference(rows: &[Row], r: &Row) -> Option<f64> {
    let b = rate(rows, reference(r.topology), r.topology, r.size)?;
    let a = r.transfer_bps?;
    (b > 0.0).then(|| a / b)
}

/// The table: transfer rate per mode and size, and the ratio to the reference (loopback on
/// one host, host on two).
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<14} {:>5} {:>8} {:>14} {:>11} {:>10} {:>12}\n",
        "MODE", "HOSTS", "SIZE", "TRANSFER-Mbps", "ANSWERS/s", "p50-us", "/REFERENCE"
    );
    for r in rows.iter().filter(|r| r.workload == Workload::Chain) {
        let ratio = to_reference(rows, r).map_or("-".into(), |x| format!("{x:.2}"));
        s += &format!(
            "{:<14} {:>5} {:>8} {:>14.2} {:>11.0} {:>10.1} {:>12}\n",
            r.mode.name(),
            if r.topology == Topology::TwoHost {
                2
            } else {
                1
            },
            r.size,
            r.transfer_bps.unwrap_or(0.0) / 1e6,
            r.req_per_s.unwrap_or(0.0),
            r.p50_us.unwrap_or(0.0),
            ratio
        );
    }
    s
}

/// Kratzke's ratios (his Eq. 1-5 where this machine has the layers), by size, as lines. One
/// host: container/reference (bridge/loopback), DockNet's/reference. Two hosts:
/// container/reference (routed/host), overlay/container (vxlan/routed), encryption/overlay
/// (vxlan-openvpn/vxlan), overlay/reference, DockNet's/reference.
pub fn ratios(rows: &[Row]) -> Vec<String> {
    let mut sizes: Vec<usize> = rows
        .iter()
        .filter(|r| r.workload == Workload::Chain)
        .map(|r| r.size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let (one, two) = (Topology::OneHost, Topology::TwoHost);
    let mut out = Vec::new();
    for (t, m, base, what) in [
        (
            one,
            Mode::Bridge,
            Mode::Loopback,
            "container/reference (Kratzke: ~0.8-0.9)",
        ),
        (one, Mode::Docknet, Mode::Loopback, "docknet/reference"),
        (one, Mode::DocknetFc, Mode::Loopback, "docknet-fc/reference"),
        (
            two,
            Mode::Routed,
            Mode::Host,
            "two hosts: container/reference, routed/host (Kratzke: ~0.8-0.9)",
        ),
        (
            two,
            Mode::Vxlan,
            Mode::Routed,
            "two hosts: overlay/container, vxlan/routed (Kratzke, weave: 0.6 down to 0.25)",
        ),
        (
            two,
            Mode::VxlanOpenvpn,
            Mode::Vxlan,
            "two hosts: encryption/overlay, vxlan-openvpn/vxlan (Kratzke: ~0.9)",
        ),
        (
            two,
            Mode::Vxlan,
            Mode::Host,
            "two hosts: overlay/reference, vxlan/host",
        ),
        (
            two,
            Mode::VxlanOpenvpn,
            Mode::Host,
            "two hosts: encrypted overlay/reference, vxlan-openvpn/host",
        ),
        (
            two,
            Mode::Docknet,
            Mode::Host,
            "two hosts: docknet/reference, docknet/host",
        ),
        (
            two,
            Mode::DocknetPacket,
            Mode::Host,
            "two hosts: docknet-packet/reference, docknet-packet/host",
        ),
    ] {
        let cells: Vec<String> = sizes
            .iter()
            .filter_map(|&s| {
                let (a, b) = (rate(rows, m, t, s)?, rate(rows, base, t, s)?);
                (b > 0.0).then(|| format!("{s} B {:.2}", a / b))
            })
            .collect();
        if !cells.is_empty() {
            out.push(format!("{what}: {}", cells.join(", ")));
        }
    }
    out
}

/// The target: DockNet's transfer rate at least the reference's at every size (on each
/// topology measured).
pub fn targets(rows: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    for t in [Topology::OneHost, Topology::TwoHost] {
        for m in [
            Mode::Docknet,
            Mode::DocknetFc,
            Mode::DocknetPacket,
            Mode::DocknetVxlan,
        ] {
            let r: Vec<(usize, f64)> = rows
                .iter()
                .filter(|r| r.workload == Workload::Chain && r.mode == m && r.topology == t)
                .filter_map(|r| Some((r.size, to_reference(rows, r)?)))
                .collect();
            let Some(worst) = r.into_iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
                continue;
            };
            let (on, base) = match t {
                Topology::OneHost => ("", "loopback"),
                Topology::TwoHost => (" on two hosts", "host"),
            };
            out.push(format!(
                "{m}{on} chain transfer rate >= the reference ({base}) at every size: lowest {:.2} at {} B: {}",
                worst.1,
                worst.0,
                if worst.1 >= 1.0 { "met" } else { "MISSED" }
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_take_turns_each_once_per_size_and_run() {
        for n in 1..5 {
            for turn in 0..2 * n {
                let mut t: Vec<usize> = turns(n, turn).collect();
                assert_eq!(t[0], turn % n, "turn {turn} starts one mode later");
                t.sort_unstable();
                assert_eq!(t, (0..n).collect::<Vec<_>>(), "each mode once");
            }
        }
        assert_eq!(turns(0, 3).count(), 0);
    }
}
