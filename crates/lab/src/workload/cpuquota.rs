//! `docknet bench cpuquota`: the thesis's Table 3.2. A server container under a cgroup CPU
//! quota (period 10000 us, quota 1000 ... 10000 us) answers back-to-back 64-byte requests of a
//! client on another core; the round trips' mean, median, 99th percentile and the count above
//! 1 ms, per quota. On the kernel's bridge the server sleeps in the kernel between requests; on
//! DockNet it waits as its idle policy says: `spin` (the paper's busy polling) burns its quota
//! and is then throttled for the rest of the period, `adaptive` spins briefly and sleeps.
//!
//! The quota is the cgroup v1 `cpu` controller's `cpu.cfs_period_us` / `cpu.cfs_quota_us`, or
//! cgroup v2's `cpu.max`, whichever this machine has. The server enters its cgroup before it
//! starts (a shell writes its own pid into the cgroup, then execs the server), so every thread
//! it makes (DockLib's engine too) is under the quota.

use crate::mode::{Mode, Topology};
use crate::plan::DaemonSetup;
use crate::proc::{in_ns, unique, Proc, Stop};
use crate::progress::Progress;
use crate::row::{NotAvailable, Row, Status, Tool, Workload};
use crate::topology::{probe, DocknetLab, KernelLab};
use crate::workload::{dnperf_path, SERVER_START};
use anyhow::{bail, Context, Result};
use docknet_perf::report::ClientReport;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Options of `docknet bench cpuquota`.
#[derive(Debug, Clone, clap::Args)]
pub struct CpuquotaArgs {
    /// Modes: bridge (or another one-host kernel mode), docknet, docknet-fc.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bridge,docknet,docknet-fc"
    )]
    pub modes: Vec<String>,
    /// The server's CPU quotas per period, microseconds.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000,1500,2000,2500,3000,4000,5000,7000,10000"
    )]
    pub quotas: Vec<u64>,
    /// The quota's period, microseconds (the thesis: 10000).
    #[arg(long, default_value_t = 10_000)]
    pub period: u64,
    /// DockNet: the server's idle policies, each measured at every quota.
    #[arg(long, value_delimiter = ',', default_value = "spin,adaptive")]
    pub idle: Vec<String>,
    /// Measured seconds per quota.
    #[arg(long, default_value_t = 3.0)]
    pub duration: f64,
    /// Warm-up seconds per quota (excluded).
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write tcp-cpuquota.json and tcp-cpuquota.md into this directory and (re)build its HTML
    /// report.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// The server's core and the client's.
const SERVER_CORE: usize = 1;
const CLIENT_CORE: usize = 0;

/// What the figures are, in words.
pub const ABOUT: &str = "dnperf rr, 64-byte requests back to back over one connection; the \
    server (core 1) under a cgroup CPU quota per 10000 us period, the client (core 0; through \
    DockNet's daemon, with the daemon's master, both yielding) without. \
    Latency is the round trip (the thesis's measure): mean, median, p99 and the number above \
    1 ms. Kernel modes: the server sleeps in the kernel between requests. DockNet: the server \
    waits as its idle policy says (spin: busy polling; adaptive: spin briefly, then sleep).";

/// A CPU controller this machine offers.
#[derive(Debug, Clone)]
pub enum Controller {
    /// cgroup v1: the `cpu` hierarchy's directory.
    V1(PathBuf),
    /// cgroup v2: the unified hierarchy's directory (with `cpu` in its controllers).
    V2(PathBuf),
}

impl Controller {
    /// The CPU controller here, or why there is none.
    pub fn find() -> Result<Controller, String> {
        for d in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"] {
            if Path::new(d).join("cpu.cfs_quota_us").exists() {
                return Ok(Controller::V1(d.into()));
            }
        }
        for d in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            let c = std::fs::read_to_string(Path::new(d).join("cgroup.controllers"))
                .unwrap_or_default();
            if c.split_whitespace().any(|x| x == "cpu") {
                return Ok(Controller::V2(d.into()));
            }
        }
        Err("no cgroup CPU controller (neither v1 cpu.cfs_quota_us nor v2 cpu.max)".into())
    }

    /// Its name in results.
    pub fn name(&self) -> &'static str {
        match self {
            Controller::V1(_) => "cgroup v1 cpu.cfs_quota_us",
            Controller::V2(_) => "cgroup v2 cpu.max",
        }
    }
}

/// A cgroup of the run's own with a CPU quota, removed on drop.
#[derive(Debug)]
pub struct Cgroup {
    /// Its directory.
    pub dir: PathBuf,
}

impl Cgroup {
    /// A new cgroup under `c` limited to `quota` us per `period` us.
    pub fn new(c: &Controller, quota: u64, period: u64) -> Result<Cgroup> {
        let w = |p: PathBuf, v: String| {
            std::fs::write(&p, &v).with_context(|| format!("writing {v} to {}", p.display()))
        };
        let g = match c {
            Controller::V1(root) => {
                let g = Cgroup {
                    dir: root.join(unique("quota")),
                };
                std::fs::create_dir(&g.dir)
                    .with_context(|| format!("creating {}", g.dir.display()))?;
                w(g.dir.join("cpu.cfs_period_us"), period.to_string())?;
                w(g.dir.join("cpu.cfs_quota_us"), quota.to_string())?;
                g
            }
            Controller::V2(root) => {
                // the controller must be enabled for the children of the root
                let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
                let g = Cgroup {
                    dir: root.join(unique("quota")),
                };
                std::fs::create_dir(&g.dir)
                    .with_context(|| format!("creating {}", g.dir.display()))?;
                w(g.dir.join("cpu.max"), format!("{quota} {period}"))?;
                g
            }
        };
        Ok(g)
    }

    /// `cmd`, run so that it enters this cgroup before it starts (a shell writes its pid into
    /// `cgroup.procs`, then execs the command with its arguments and environment).
    pub fn wrap(&self, cmd: &Command) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(self.dir.join("cgroup.procs"))
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }

    /// Periods in which the cgroup was throttled so far.
    pub fn throttled(&self) -> Option<u64> {
        std::fs::read_to_string(self.dir.join("cpu.stat"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|v| v.trim().parse().ok())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // empty once its processes are gone (they may take a moment to be reaped)
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("docknet: warning: could not remove {}", self.dir.display());
    }
}

/// Round trips from a client's report: mean, p50, p99 (us), the count above 1 ms and all.
pub fn round_trips(r: &ClientReport) -> Option<(f64, f64, f64, u64, u64)> {
    let h = r.result.half_rtt_hist.as_ref()?;
    let total: u64 = h.iter().map(|b| b[1]).sum();
    if total == 0 {
        return None;
    }
    let at = |q: f64| {
        let want = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for b in h {
            seen += b[1];
            if seen >= want {
                return 2.0 * b[0] as f64 / 1e3;
            }
        }
        2.0 * h.last().map_or(0, |b| b[0]) as f64 / 1e3
    };
    let mean = h
        .iter()
        .map(|b| 2.0 * b[0] as f64 * b[1] as f64)
        .sum::<f64>()
        / total as f64
        / 1e3;
    let over = h
        .iter()
        .filter(|b| 2 * b[0] > 1_000_000)
        .map(|b| b[1])
        .sum();
    Some((mean, at(0.5), at(0.99), over, total))
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The modes of `args`, checked.
pub fn modes(args: &CpuquotaArgs) -> Result<Vec<Mode>> {
    let modes = args
        .modes
        .iter()
        .map(|m| m.parse::<Mode>())
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(m) = modes.iter().find(|m| {
        !m.topologies().contains(&Topology::OneHost)
            || m.is_preload()
            || matches!(m, Mode::Sriov | Mode::Loopback | Mode::Container)
    }) {
        bail!("{m}: bench cpuquota runs on one-host modes with two containers (bridge, veth, macvlan, ..., docknet, docknet-fc)");
    }
    if args.quotas.is_empty() || args.quotas.iter().any(|q| *q < 1000 || *q > 1_000_000) {
        bail!("--quotas: 1000 ..= 1000000 us each (the kernel's minimum is 1000)");
    }
    if !(1000..=1_000_000).contains(&args.period) {
        bail!("--period: 1000 ..= 1000000 us");
    }
    if let Some(i) = args
        .idle
        .iter()
        .find(|i| !crate::plan::PEER_IDLE.contains(&i.as_str()))
    {
        bail!(
            "--idle: {i:?} is not one of {}",
            crate::plan::PEER_IDLE.join(", ")
        );
    }
    if args.duration <= 0.0 || args.warmup < 0.0 {
        bail!("--duration must be positive, --warmup not negative");
    }
    Ok(modes)
}

/// Points per mode (for the progress bar).
pub fn points(args: &CpuquotaArgs, mode: Mode) -> usize {
    args.quotas.len()
        * if mode.is_docknet() {
            args.idle.len()
        } else {
            1
        }
}

/// One quota on a built topology: the row.
#[allow(clippy::too_many_arguments)]
fn point(
    args: &CpuquotaArgs,
    ctl: &Controller,
    exe: &Path,
    dnperf: &Path,
    mode: Mode,
    k: &Option<KernelLab>,
    d: &Option<DocknetLab>,
    idle: Option<&str>,
    quota: u64,
    port: u16,
    stop: &Stop,
) -> Result<Row> {
    let cg = Cgroup::new(ctl, quota, args.period)?;
    let timing = [
        "--duration".to_string(),
        args.duration.to_string(),
        "--warmup".into(),
        args.warmup.to_string(),
        "--json".into(),
    ];
    let (server_cmd, client_cmd) = match (k, d) {
        (Some(k), _) => {
            let p = &k.pairs[0];
            let s = in_ns(
                &p.server_ns,
                dnperf,
                strs(&[
                    "server",
                    "--stack",
                    "kernel",
                    "--cpu",
                    &SERVER_CORE.to_string(),
                    "--conns",
                    "1",
                    "--bind",
                    &format!("{}:{}", p.bind, p.port),
                ]),
            );
            let mut a = strs(&[
                "client",
                "--stack",
                "kernel",
                "--cpu",
                &CLIENT_CORE.to_string(),
                "--connect",
                &format!("{}:{}", p.target, p.port),
                "--workload",
                "rr",
                "--size",
                "64",
            ]);
            a.extend(timing.iter().cloned());
            (s, in_ns(&p.client_ns, dnperf, a))
        }
        (_, Some(l)) => {
            let idle = idle.unwrap_or("adaptive");
            let addr = format!("{}:{port}", DocknetLab::server_ip(0));
            let s = l.run_in(
                exe,
                &DocknetLab::server_pipe(0),
                Some(SERVER_CORE),
                dnperf,
                strs(&[
                    "server", "--stack", "docknet", "--idle", idle, "--conns", "1", "--bind", &addr,
                ]),
            );
            let mut a = strs(&[
                "client",
                "--stack",
                "docknet",
                "--idle",
                client_idle(mode),
                "--connect",
                &addr,
                "--workload",
                "rr",
                "--size",
                "64",
            ]);
            a.extend(timing.iter().cloned());
            (
                s,
                l.run_in(
                    exe,
                    &DocknetLab::client_pipe(0),
                    Some(CLIENT_CORE),
                    dnperf,
                    a,
                ),
            )
        }
        _ => bail!("no topology"),
    };
    let server = Proc::spawn(cg.wrap(&server_cmd), "dnperf server (under the quota)")?;
    std::thread::sleep(SERVER_START);
    let t0 = cg.throttled().unwrap_or(0);
    let report: ClientReport = Proc::spawn(client_cmd, "dnperf client")?.result(
        Duration::from_secs_f64(args.duration + args.warmup + 60.0),
        stop,
    )?;
    let throttled = cg.throttled().unwrap_or(0).saturating_sub(t0);
    server.finish(stop);
    drop(cg);
    let (mean, p50, p99, over, n) =
        round_trips(&report).context("the client reported no round trips")?;
    Ok(Row {
        quota_us: Some(quota),
        mean_us: Some(mean),
        p50_us: Some(p50),
        p99_us: Some(p99),
        over_1ms: Some(over),
        samples: Some(n),
        tps: Some(report.result.tps),
        cpu_s_per_op: Some(report.result.cpu_s_per_op),
        idle: idle.map(String::from),
        cores: format!("c{CLIENT_CORE} s{SERVER_CORE}"),
        placement: format!(
            "server on core {SERVER_CORE} under {quota}/{} us ({}; throttled in {throttled} \
             periods), client on core {CLIENT_CORE}{}; round trips",
            args.period,
            ctl.name(),
            if through_daemon(mode) {
                " with the daemon's master, both yielding"
            } else {
                ""
            }
        ),
        mtu: Some(1500),
        builder: Some(mode.builder().name().into()),
        ..Row::new(mode, Tool::Dnperf, Workload::Cpuquota, 64)
    })
}

/// Whether `mode`'s frames cross the daemon's master (pipes on one host).
fn through_daemon(mode: Mode) -> bool {
    mode.link() == crate::mode::Link::Pipe
}

/// How the client waits: it spins on its own core; through the daemon it shares that core with
/// the master and yields to it (a spinning client would hold the core for a scheduler slice
/// while the master waits to carry its request), so the server's core stays the server's alone.
fn client_idle(mode: Mode) -> &'static str {
    if through_daemon(mode) {
        "adaptive:0"
    } else {
        "spin"
    }
}

/// How the daemon waits: over a fast channel it is off the path; through it, its master
/// shares the client's core and yields between frames as the client does.
fn daemon_idle(mode: Mode) -> &'static str {
    if through_daemon(mode) {
        "adaptive:0"
    } else {
        "adaptive"
    }
}

/// Measures every mode and quota: the rows and what was left out.
pub fn measure(
    args: &CpuquotaArgs,
    stop: &Stop,
    progress: &mut Progress,
) -> Result<(Vec<Row>, Vec<NotAvailable>)> {
    let exe = std::env::current_exe()?;
    let dnperf = dnperf_path(&exe)?;
    let modes = modes(args)?;
    let (mut rows, mut skipped) = (Vec::new(), Vec::new());
    let mut skip = |mode: String, status, reason: String, progress: &mut Progress| {
        let na = NotAvailable::new(mode, status, reason);
        progress.line(&na.line());
        skipped.push(na);
    };
    let ctl = match Controller::find() {
        Ok(c) => c,
        Err(why) => {
            for m in &modes {
                progress.skip(points(args, *m) as u64);
                skip(m.name().into(), Status::NotAvailable, why.clone(), progress);
            }
            return Ok((rows, skipped));
        }
    };
    let mut port = 23000;
    for mode in modes {
        stop.check()?;
        let n = points(args, mode);
        if let Some(why) = probe::unavailable(mode) {
            progress.skip(n as u64);
            skip(mode.name().into(), Status::NotAvailable, why, progress);
            continue;
        }
        let built = if mode.is_docknet() {
            let setup = DaemonSetup {
                idle: daemon_idle(mode),
                master_core: through_daemon(mode).then_some(CLIENT_CORE),
                master_core_b: None,
                master_nice: 0,
            };
            DocknetLab::build(&exe, mode, &setup, 1, 1500).map(|l| (None, Some(l)))
        } else {
            KernelLab::build(mode, 1, 1500).map(|l| (Some(l), None))
        };
        let (k, d) = match built {
            Ok(x) => x,
            Err(e) => {
                progress.skip(n as u64);
                skip(
                    mode.name().into(),
                    Status::Skipped,
                    format!("building it failed: {e:#}"),
                    progress,
                );
                continue;
            }
        };
        let idles: Vec<Option<&str>> = if mode.is_docknet() {
            args.idle.iter().map(|i| Some(i.as_str())).collect()
        } else {
            vec![None]
        };
        for idle in idles {
            for &q in &args.quotas {
                stop.check()?;
                let what = format!(
                    "{mode}{} quota {q} us",
                    idle.map_or(String::new(), |i| format!(" {i}"))
                );
                progress.start(&what);
                port += 1;
                match point(args, &ctl, &exe, &dnperf, mode, &k, &d, idle, q, port, stop) {
                    Ok(r) => {
                        progress.done(&format!(
                            "  {what}: round trip mean {:.1} us, p50 {:.1} us, p99 {:.1} us, {} over 1 ms",
                            r.mean_us.unwrap_or(0.0),
                            r.p50_us.unwrap_or(0.0),
                            r.p99_us.unwrap_or(0.0),
                            r.over_1ms.unwrap_or(0)
                        ));
                        rows.push(r);
                    }
                    Err(e) => {
                        if stop.raised() {
                            return Err(e);
                        }
                        progress.done(&format!("  {what}: failed: {e:#}"));
                        skip(what, Status::Skipped, format!("failed: {e:#}"), progress);
                    }
                }
            }
        }
    }
    Ok((rows, skipped))
}

/// The table: one line per mode, policy and quota.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<11} {:<9} {:>9} {:>10} {:>10} {:>10} {:>9} {:>9}\n",
        "MODE", "IDLE", "QUOTA-us", "MEAN-us", "p50-us", "p99-us", "> 1 ms", "SAMPLES"
    );
    for r in rows.iter().filter(|r| r.workload == Workload::Cpuquota) {
        s += &format!(
            "{:<11} {:<9} {:>9} {:>10.1} {:>10.1} {:>10.1} {:>9} {:>9}\n",
            r.mode.name(),
            r.idle.as_deref().unwrap_or("-"),
            r.quota_us.unwrap_or(0),
            r.mean_us.unwrap_or(0.0),
            r.p50_us.unwrap_or(0.0),
            r.p99_us.unwrap_or(0.0),
            r.over_1ms.unwrap_or(0),
            r.samples.unwrap_or(0)
        );
    }
    s
}

/// The target: at the smallest quota measured, DockNet (adaptive) p99 no worse than the kernel
/// bridge's.
pub fn targets(rows: &[Row]) -> Vec<String> {
    let cq: Vec<&Row> = rows
        .iter()
        .filter(|r| r.workload == Workload::Cpuquota)
        .collect();
    let Some(q) = cq.iter().filter_map(|r| r.quota_us).min() else {
        return Vec::new();
    };
    let at = |m: Mode, idle: Option<&str>| {
        cq.iter()
            .find(|r| r.mode == m && r.quota_us == Some(q) && r.idle.as_deref() == idle)
            .and_then(|r| r.p99_us)
    };
    let Some(bridge) = at(Mode::Bridge, None) else {
        return Vec::new();
    };
    [Mode::Docknet, Mode::DocknetFc]
        .into_iter()
        .filter_map(|m| {
            let p = at(m, Some("adaptive"))?;
            Some(format!(
                "{m} (adaptive) p99 under a {q} us quota {p:.0} us <= bridge's {bridge:.0} us: {}",
                if p <= bridge { "met" } else { "MISSED" }
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_come_from_the_halved_histogram() {
        let mut r: ClientReport = serde_json::from_value(serde_json::json!({
            "env": {"kernel": null, "cores": 2, "pinned_core": null, "stack": "kernel",
                "idle": "spin", "mtu": null, "command": "", "version": ""},
            "workload": "rr", "proto": "tcp", "size": 64, "duration_s": 1.0, "warmup_s": 0.0,
            "result": {"transactions": 0, "tps": 0.0, "one_way_ns": null, "half_rtt_ns": null,
                "gbps": null, "msgs_per_s": null, "bytes": null, "cpu_s_per_op": 0.0}
        }))
        .unwrap();
        assert!(round_trips(&r).is_none());
        r.result.half_rtt_hist = Some(vec![[10_000, 98], [400_000, 1], [2_000_000, 1]]);
        let (mean, p50, p99, over, n) = round_trips(&r).unwrap();
        assert_eq!((p50, p99, over, n), (20.0, 800.0, 1, 100));
        assert!((mean - (98.0 * 20.0 + 800.0 + 4000.0) / 100.0).abs() < 1e-9);
    }
}
