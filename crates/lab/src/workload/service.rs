//! Services (`docknet bench http --service`): a load generator calling a ClusterIP-like
//! service of N `docknet-httpd` backends, against calling one backend directly.
//!
//! - DockNet (`docknet-auto`): a daemon at its defaults (automatic fast channels), the service
//!   set with `service set`; DockLib connects to a backend in place of the service's address.
//! - Kernel (`bridge`): the backends on a CNI bridge and the service as kube-proxy programs it,
//!   in the generator's namespace (its `OUTPUT` hook: no hop through a host namespace, which
//!   spares the kernel a routing step a real node has):
//!   - `kube-proxy iptables`: `KUBE-SERVICES` -> `KUBE-SVC-*` choosing an endpoint with
//!     `statistic --mode random --probability 1/(N-i)` -> `KUBE-SEP-*` with the DNAT, as
//!     kube-proxy's iptables mode writes them;
//!   - `kube-proxy nftables`: a service chain with `numgen random mod N vmap` to endpoint
//!     chains with the DNAT, as kube-proxy's nftables mode writes them.
//!
//! Nothing is pinned and every program runs at its defaults (what a user gets).

use crate::mode::Mode;
use crate::plan::DaemonSetup;
use crate::proc::{checked, in_ns, Proc, Stop};
use crate::row::{Row, Tool, Workload};
use crate::topology::daemon::Daemon;
use crate::topology::KernelLab;
use crate::workload::http::beside;
use anyhow::Result;
use docknet_http::client::LoadReport;
use std::path::Path;
use std::time::{Duration, Instant};

/// The service's address.
pub const VIP: &str = "10.96.0.10";
/// The service's port, and the backends'.
const PORT: u16 = 80;

/// How the generator reaches the backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Straight to backend 0's address (the baseline a service adds to).
    Direct,
    /// DockNet's service (DockLib picks the backend at connect).
    Docknet,
    /// kube-proxy's iptables rules.
    Iptables,
    /// kube-proxy's nftables rules.
    Nftables,
}

impl Via {
    /// The row's scenario.
    pub fn name(self) -> &'static str {
        match self {
            Via::Direct => "direct",
            Via::Docknet => "docknet service",
            Via::Iptables => "kube-proxy iptables",
            Via::Nftables => "kube-proxy nftables",
        }
    }
}

/// One point.
#[derive(Debug, Clone)]
pub struct ServicePoint {
    /// How the generator reaches the backends.
    pub via: Via,
    /// Backends.
    pub backends: usize,
    /// Connections of the generator.
    pub connections: usize,
    /// The path requested.
    pub path: String,
    /// Measured seconds.
    pub duration: f64,
    /// Warm-up seconds.
    pub warmup: f64,
    /// Run index.
    pub repeat: usize,
}

fn load_args(p: &ServicePoint, stack: &str, target: &str) -> Vec<String> {
    vec![
        "--stack".into(),
        stack.into(),
        "--connections".into(),
        p.connections.to_string(),
        "--duration".into(),
        format!("{}s", p.duration),
        "--warmup".into(),
        format!("{}s", p.warmup),
        "--json".into(),
        format!("http://{target}:{PORT}{}", p.path),
    ]
}

/// The row of a finished generator.
fn row(mode: Mode, p: &ServicePoint, r: LoadReport, cpu: Option<f64>) -> Row {
    Row {
        server: Some("docknet-httpd".into()),
        backends: Some(p.backends),
        connections: Some(p.connections),
        req_per_s: Some(r.req_per_s),
        p50_us: Some(r.p50_us),
        p99_us: Some(r.p99_us),
        p999_us: Some(r.p999_us),
        mean_us: Some(r.mean_us),
        errors: Some(r.errors.values().sum()),
        one_way_hist: Some(r.latency_hist),
        cpu_s_per_op: cpu.map(|c| c / (r.req_per_s * p.duration).max(1.0)),
        scenario: Some(p.via.name().into()),
        placement: "unpinned, every program at its defaults".into(),
        cores: "unpinned".into(),
        repeat: p.repeat,
        mtu: Some(1500),
        builder: Some(mode.builder().name().into()),
        ..Row::new(mode, Tool::DocknetLoad, Workload::Http, p.path.len())
    }
}

/// Runs the generator to its end, with the machine's CPU over its measured window.
fn measure(gen: Proc, p: &ServicePoint, stop: &Stop) -> Result<(LoadReport, Option<f64>)> {
    std::thread::sleep(Duration::from_secs_f64(p.warmup));
    let c0 = crate::cpustat::CpuTimes::now();
    std::thread::sleep(Duration::from_secs_f64(p.duration));
    let c1 = crate::cpustat::CpuTimes::now();
    let r: LoadReport = gen.result(Duration::from_secs_f64(p.duration + p.warmup + 30.0), stop)?;
    let cpu = match (c0, c1) {
        (Some(a), Some(b)) => Some(crate::cpustat::CpuTimes::seconds(b.since(&a).busy())),
        _ => None,
    };
    Ok((r, cpu))
}

/// One DockNet point: a daemon at its defaults, the backends, the service, the generator.
pub fn docknet(exe: &Path, p: &ServicePoint, stop: &Stop) -> Result<Row> {
    let httpd = beside(exe, "docknet-httpd")?;
    let load = beside(exe, "docknet-load")?;
    let d = Daemon::start_auto(exe, &DaemonSetup::unpinned("adaptive"))?;
    let mut c = d.client()?;
    c.pipe_create("c", "10.81.0.2/16", None, None)?;
    let ip = |i: usize| format!("10.81.1.{}", i + 1);
    let mut backends = Vec::new();
    for i in 0..p.backends {
        let b = format!("b{i}");
        c.pipe_create(&b, &format!("{}/16", ip(i)), None, None)?;
        let mut cmd = d.cmd(exe);
        cmd.args(["run", "--pipe", &b, "--"])
            .arg(&httpd)
            .args(["--stack", "docknet", "--bind", &format!("{}:{PORT}", ip(i))])
            .stderr(std::process::Stdio::null());
        backends.push(Proc::spawn(cmd, &format!("docknet-httpd in {b}"))?);
    }
    if p.via == Via::Docknet {
        c.service_set(&docknet_daemon::proto::ServiceInfo {
            name: "web".into(),
            address: format!("{VIP}:{PORT}"),
            proto: docknet_daemon::proto::ServiceProto::Tcp,
            backends: (0..p.backends)
                .map(|i| format!("{}:{PORT}", ip(i)))
                .collect(),
            affinity: docknet_daemon::proto::ServiceAffinity::None,
        })?;
    }
    let t = Instant::now();
    while c.pipe_ls()?.iter().filter(|x| x.socket.is_some()).count() < p.backends {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(20),
            "backends did not attach"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let target = if p.via == Via::Direct {
        ip(0)
    } else {
        VIP.into()
    };
    let gen = {
        let mut cmd = d.cmd(exe);
        cmd.args(["run", "--pipe", "c", "--"])
            .arg(&load)
            .args(load_args(p, "docknet", &target));
        Proc::spawn(cmd, "docknet-load")?
    };
    let (r, cpu) = measure(gen, p, stop)?;
    drop((backends, d));
    Ok(row(Mode::DocknetAuto, p, r, cpu))
}

/// `prog ARGS...` in `ns`, which must succeed.
fn run_in(ns: &str, prog: &str, args: &[String]) -> Result<()> {
    let what = format!("{prog} {}", args.join(" "));
    checked(&mut in_ns(ns, Path::new(prog), args.to_vec()), &what).map(drop)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// kube-proxy's iptables rules for one service over `backends`, in `ns`.
fn iptables_rules(ns: &str, backends: &[String]) -> Result<()> {
    let ipt = |v: &[&str]| {
        let mut a = strings(&["-w", "-t", "nat"]);
        a.extend(strings(v));
        run_in(ns, "iptables", &a)
    };
    ipt(&["-N", "KUBE-SERVICES"])?;
    ipt(&["-A", "OUTPUT", "-j", "KUBE-SERVICES"])?;
    ipt(&["-N", "KUBE-SVC-WEB"])?;
    let vip = format!("{VIP}/32");
    let port = PORT.to_string();
    ipt(&[
        "-A",
        "KUBE-SERVICES",
        "-d",
        &vip,
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        &port,
        "-j",
        "KUBE-SVC-WEB",
    ])?;
    let n = backends.len();
    for (i, b) in backends.iter().enumerate() {
        let sep = format!("KUBE-SEP-{i}");
        ipt(&["-N", &sep])?;
        ipt(&[
            "-A",
            &sep,
            "-p",
            "tcp",
            "-m",
            "tcp",
            "-j",
            "DNAT",
            "--to-destination",
            b,
        ])?;
        if i + 1 < n {
            let prob = format!("{:.11}", 1.0 / (n - i) as f64);
            ipt(&[
                "-A",
                "KUBE-SVC-WEB",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &prob,
                "-j",
                &sep,
            ])?;
        } else {
            ipt(&["-A", "KUBE-SVC-WEB", "-j", &sep])?;
        }
    }
    Ok(())
}

/// Removes what [`iptables_rules`] wrote.
fn iptables_clear(ns: &str, n: usize) {
    let ipt = |v: &[&str]| {
        let mut a = strings(&["-w", "-t", "nat"]);
        a.extend(strings(v));
        let _ = run_in(ns, "iptables", &a);
    };
    ipt(&["-F", "OUTPUT"]);
    for c in ["KUBE-SERVICES", "KUBE-SVC-WEB"] {
        ipt(&["-F", c]);
        ipt(&["-X", c]);
    }
    for i in 0..n {
        let sep = format!("KUBE-SEP-{i}");
        ipt(&["-F", &sep]);
        ipt(&["-X", &sep]);
    }
}

/// kube-proxy's nftables rules for one service over `backends`, in `ns`.
fn nft_rules(ns: &str, backends: &[String]) -> Result<()> {
    let mut s = String::from("table ip kube-proxy {\n");
    s += "  chain nat-output { type nat hook output priority -100; policy accept; jump services; }\n";
    s += &format!("  chain services {{ ip daddr {VIP} tcp dport {PORT} goto service-web; }}\n");
    let map: Vec<String> = (0..backends.len())
        .map(|i| format!("{i} : goto endpoint-{i}"))
        .collect();
    s += &format!(
        "  chain service-web {{ numgen random mod {} vmap {{ {} }}; }}\n",
        backends.len(),
        map.join(", ")
    );
    for (i, b) in backends.iter().enumerate() {
        s += &format!("  chain endpoint-{i} {{ meta l4proto tcp dnat to {b}; }}\n");
    }
    s += "}\n";
    // nft reads a ruleset given as its argument as it reads a file
    run_in(ns, "nft", &[s])
}

/// One kernel point on `lab` (a bridge with at least `p.backends` pairs): the backends in the
/// pairs' server namespaces, the generator in pair 0's client namespace with the service's
/// rules there.
pub fn kernel(exe: &Path, lab: &KernelLab, p: &ServicePoint, stop: &Stop) -> Result<Row> {
    let httpd = beside(exe, "docknet-httpd")?;
    let load = beside(exe, "docknet-load")?;
    let ns = &lab.pairs[0].client_ns;
    let mut backends = Vec::new();
    let mut addrs = Vec::new();
    for pair in lab.pairs.iter().take(p.backends) {
        let a = format!("{}:{PORT}", pair.bind);
        let args = strings(&["--stack", "kernel", "--bind", &a]);
        let mut c = in_ns(&pair.server_ns, &httpd, args);
        c.stderr(std::process::Stdio::null());
        backends.push(Proc::spawn(c, "docknet-httpd")?);
        addrs.push(a);
    }
    // the VIP is on no link: a route out of the container's interface, DNAT then picks the
    // backend (the CNI containers have routes to their subnet only)
    crate::proc::ip(&[
        "-n",
        ns,
        "route",
        "replace",
        &format!("{VIP}/32"),
        "dev",
        "eth0",
    ])?;
    let rules = match p.via {
        Via::Iptables => iptables_rules(ns, &addrs),
        Via::Nftables => nft_rules(ns, &addrs),
        Via::Direct | Via::Docknet => Ok(()),
    };
    let r = rules.and_then(|()| {
        std::thread::sleep(Duration::from_millis(300));
        let target = if p.via == Via::Direct {
            lab.pairs[0].bind.clone()
        } else {
            VIP.into()
        };
        let mut c = in_ns(ns, &load, load_args(p, "kernel", &target));
        c.stderr(std::process::Stdio::null());
        measure(Proc::spawn(c, "docknet-load")?, p, stop)
    });
    match p.via {
        Via::Iptables => iptables_clear(ns, p.backends),
        Via::Nftables => {
            let _ = run_in(
                ns,
                "nft",
                &strings(&["delete", "table", "ip", "kube-proxy"]),
            );
        }
        _ => {}
    }
    drop(backends);
    let (r, cpu) = r?;
    Ok(row(Mode::Bridge, p, r, cpu))
}

/// The rows as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let opt = |v: Option<f64>, p: usize| v.map_or("-".into(), |x| format!("{x:.p$}"));
    let mut s = format!(
        "{:<20} {:<13} {:>8} {:>6} {:>11} {:>9} {:>9} {:>6} {:>12}\n",
        "BALANCER", "MODE", "BACKENDS", "CONNS", "REQ/S", "p50(us)", "p99(us)", "ERR", "CPU us/req"
    );
    for r in rows {
        s += &format!(
            "{:<20} {:<13} {:>8} {:>6} {:>11} {:>9} {:>9} {:>6} {:>12}\n",
            r.scenario.as_deref().unwrap_or("-"),
            r.mode.name(),
            r.backends.map_or("-".into(), |b| b.to_string()),
            r.connections.map_or("-".into(), |c| c.to_string()),
            opt(r.req_per_s, 0),
            opt(r.p50_us, 1),
            opt(r.p99_us, 1),
            r.errors.map_or("-".into(), |e| e.to_string()),
            opt(r.cpu_s_per_op.map(|c| c * 1e6), 2),
        );
    }
    s
}

fn find(rows: &[Row], via: Via, mode: Mode, n: usize, conns: Option<usize>) -> Option<&Row> {
    rows.iter().find(|r| {
        r.scenario.as_deref() == Some(via.name())
            && r.mode == mode
            && r.backends == Some(n)
            && r.connections == conns
    })
}

/// The targets: a DockNet service call adds at most 1.5 us p50 over calling the backend
/// directly; DockNet's service beats kube-proxy's (iptables and nftables) at p50, p99 and
/// requests/s with as many backends.
pub fn targets(rows: &[Row]) -> Vec<crate::verdict::Verdict> {
    use crate::verdict::Verdict;
    let mut v = Vec::new();
    let mut conns: Vec<Option<usize>> = rows.iter().map(|r| r.connections).collect();
    conns.sort_unstable();
    conns.dedup();
    let mut ns: Vec<usize> = rows.iter().filter_map(|r| r.backends).collect();
    ns.sort_unstable();
    ns.dedup();
    for c in conns {
        let cs = c.map_or("-".into(), |c| c.to_string());
        if let (Some(s), Some(d)) = (
            find(rows, Via::Docknet, Mode::DocknetAuto, 1, c),
            find(rows, Via::Direct, Mode::DocknetAuto, 1, c),
        ) {
            if let (Some(a), Some(b)) = (s.p50_us, d.p50_us) {
                v.push(Verdict {
                    target: format!(
                        "{cs} connections: a DockNet service call adds <= 1.5 us p50 over \
                         calling its one backend directly"
                    ),
                    value: a - b,
                    threshold: 1.5,
                    measured: format!("{:+.2} us ({a:.2} against {b:.2})", a - b),
                    met: a - b <= 1.5,
                });
            }
        }
        for &n in &ns {
            compare(rows, n, c, &cs, &mut v);
        }
    }
    v
}

/// DockNet's service against kube-proxy's with `n` backends and `c` connections.
fn compare(
    rows: &[Row],
    n: usize,
    c: Option<usize>,
    cs: &str,
    v: &mut Vec<crate::verdict::Verdict>,
) {
    use crate::verdict::Verdict;
    let Some(d) = find(rows, Via::Docknet, Mode::DocknetAuto, n, c) else {
        return;
    };
    for k in [Via::Iptables, Via::Nftables] {
        let Some(b) = find(rows, k, Mode::Bridge, n, c) else {
            continue;
        };
        let (Some(dp50), Some(dp99), Some(drps), Some(kp50), Some(kp99), Some(krps)) = (
            d.p50_us,
            d.p99_us,
            d.req_per_s,
            b.p50_us,
            b.p99_us,
            b.req_per_s,
        ) else {
            continue;
        };
        v.push(Verdict {
            target: format!(
                "{n} backends, {cs} connections: DockNet's service beats {} at p50, p99 \
                 and requests/s",
                k.name()
            ),
            value: drps / krps,
            threshold: 1.0,
            measured: format!(
                "p50 {dp50:.1} against {kp50:.1} us, p99 {dp99:.1} against {kp99:.1} us, \
                 {drps:.0} against {krps:.0} req/s ({:.2}x)",
                drps / krps
            ),
            met: dp50 < kp50 && dp99 < kp99 && drps > krps,
        });
    }
}
