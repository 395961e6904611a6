//! The web cluster (`docknet bench http --backends 1,2,3,4`, the paper's Fig. 11): one load
//! generator, a load balancer, N `docknet-httpd` backends each spending `--work-us` of CPU per
//! request.
//!
//! - DockNet (`docknet-fc`): `docknet-natlb` in a container of its own at the VIP, the
//!   generator and every backend its fast-channel partners.
//! - Kernel (`bridge`): the backends on a CNI bridge, the balancing done by the kernel as
//!   kube-proxy does it: iptables DNAT of the VIP in the generator's namespace, round robin
//!   with `statistic --mode nth` (IPVS is not in this kernel).
//!
//! Placement, the same for both: the generator on core 0 (with the balancer, on DockNet),
//! backend i on core (i + 1) mod 2. With two cores there is no free core for a second backend:
//! the scaling from one to two backends is the share of core 0 the generator (and balancer)
//! leave. Where the cores go is measured per component over the middle of the window (each
//! process tree's exact CPU time from schedstat), the rest (the kernel's softirq outside those
//! processes, anything else) from `/proc/stat`.

use crate::cpustat::CpuTimes;
use crate::mode::Mode;
use crate::plan::DaemonSetup;
use crate::proc::{checked, in_ns, CpuMeter, Proc, Stop};
use crate::row::{Row, Tool, Workload};
use crate::topology::daemon::Daemon;
use crate::topology::KernelLab;
use crate::workload::http::beside;
use anyhow::Result;
use docknet_http::client::LoadReport;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The VIP the generator connects to.
pub const VIP: &str = "10.80.255.10";
/// The port served.
const PORT: u16 = 80;

/// What one cluster point runs.
#[derive(Debug, Clone)]
pub struct ClusterPoint {
    /// Backends.
    pub backends: usize,
    /// Connections of the generator.
    pub connections: usize,
    /// CPU microseconds each request costs a backend.
    pub work_us: u64,
    /// Measured seconds.
    pub duration: f64,
    /// Warm-up seconds.
    pub warmup: f64,
    /// Run index.
    pub repeat: usize,
    /// DockNet: how the generator, the balancer and the backends wait.
    pub idle: &'static str,
}

/// The core of backend `i`.
pub fn backend_core(i: usize) -> usize {
    (i + 1) % 2
}

/// The placement in words.
pub fn placement(mode: Mode) -> String {
    match mode {
        Mode::Bridge => "load generator core 0; backend i on core (i+1) mod 2; the kernel \
                         balances (iptables DNAT, nth) in the generator's namespace"
            .into(),
        _ => "load generator and docknet-natlb core 0; backend i on core (i+1) mod 2; every hop \
              a fast channel"
            .into(),
    }
}

/// CPU of some process trees over a window, in microseconds per request.
struct Parts {
    groups: Vec<(String, Vec<u32>)>,
}

impl Parts {
    fn new(groups: Vec<(String, Vec<u32>)>) -> Parts {
        Parts { groups }
    }

    /// Samples every group and the machine; after `len`, the CPU seconds of each group and of
    /// the machine over it, and the window's length. The trees are looked up now, when every
    /// container's processes have started.
    fn measure(&self, len: Duration) -> (Vec<(String, f64)>, Option<f64>, f64) {
        let meters: Vec<(String, CpuMeter)> = self
            .groups
            .iter()
            .map(|(name, roots)| {
                let mut m = CpuMeter::default();
                m.refresh(roots);
                // the kernel's softirq threads count in "kernel, other" only
                m.pids.retain(|p| !is_ksoftirqd(*p));
                (name.clone(), m)
            })
            .collect();
        let this = Measured { meters };
        this.over(len)
    }
}

/// Process trees found, ready to be measured.
struct Measured {
    meters: Vec<(String, CpuMeter)>,
}

impl Measured {
    fn over(&self, len: Duration) -> (Vec<(String, f64)>, Option<f64>, f64) {
        let before: Vec<_> = self.meters.iter().map(|(_, m)| m.ns_by_task()).collect();
        let (m0, t0) = (CpuTimes::now(), Instant::now());
        std::thread::sleep(len);
        let after: Vec<_> = self.meters.iter().map(|(_, m)| m.ns_by_task()).collect();
        let m1 = CpuTimes::now();
        let secs = t0.elapsed().as_secs_f64();
        let parts = self
            .meters
            .iter()
            .zip(before.iter().zip(&after))
            .map(|((n, _), (b, a))| (n.clone(), CpuMeter::delta(b, a) as f64 / 1e9))
            .collect();
        let machine = match (m0, m1) {
            (Some(a), Some(b)) => Some(CpuTimes::seconds(b.since(&a).busy())),
            _ => None,
        };
        (parts, machine, secs)
    }
}

fn is_ksoftirqd(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with("ksoftirqd"))
}

/// The generator's arguments.
fn load_args(p: &ClusterPoint, stack: &str, idle: &str, core: usize) -> Vec<String> {
    vec![
        "--stack".into(),
        stack.into(),
        "--idle".into(),
        idle.into(),
        "--cpu".into(),
        core.to_string(),
        "--connections".into(),
        p.connections.to_string(),
        "--duration".into(),
        format!("{}s", p.duration),
        "--warmup".into(),
        format!("{}s", p.warmup),
        "--json".into(),
        format!("http://{VIP}:{PORT}/work/{}", p.work_us),
    ]
}

/// Measures while the generator runs, then fills the row from its report and the CPU split.
fn finish_row(load: Proc, parts: Parts, p: &ClusterPoint, mode: Mode, stop: &Stop) -> Result<Row> {
    std::thread::sleep(Duration::from_secs_f64(p.warmup + p.duration * 0.1));
    let (split, machine, secs) = parts.measure(Duration::from_secs_f64(p.duration * 0.8));
    let r: LoadReport = load.result(Duration::from_secs_f64(p.duration + p.warmup + 30.0), stop)?;
    let per_req = |cpu_s: f64| cpu_s / (r.req_per_s * secs).max(1.0) * 1e6;
    let mut cpu: BTreeMap<String, f64> = BTreeMap::new();
    let mut attributed = 0.0;
    for (n, s) in &split {
        attributed += s;
        *cpu.entry(n.clone()).or_default() += per_req(*s);
    }
    if let Some(m) = machine {
        cpu.insert("kernel, other".into(), per_req((m - attributed).max(0.0)));
    }
    Ok(Row {
        server: Some("docknet-httpd".into()),
        backends: Some(p.backends),
        work_us: Some(p.work_us),
        connections: Some(p.connections),
        req_per_s: Some(r.req_per_s),
        p50_us: Some(r.p50_us),
        p99_us: Some(r.p99_us),
        p999_us: Some(r.p999_us),
        mean_us: Some(r.mean_us),
        errors: Some(r.errors.values().sum()),
        one_way_hist: Some(r.latency_hist),
        cpu_s_per_op: machine.map(|m| m / (r.req_per_s * secs).max(1.0)),
        cpu_us_per_req: Some(cpu),
        placement: placement(mode),
        cores: "c0 b(i+1)%2".into(),
        repeat: p.repeat,
        mtu: Some(1500),
        builder: Some(mode.builder().name().into()),
        ..Row::new(mode, Tool::DocknetLoad, Workload::Http, 3)
    })
}

/// One DockNet cluster point: a daemon, the generator, the balancer and the backends.
pub fn docknet(exe: &Path, p: &ClusterPoint, stop: &Stop) -> Result<Row> {
    let httpd = beside(exe, "docknet-httpd")?;
    let load = beside(exe, "docknet-load")?;
    let natlb = beside(exe, "docknet-natlb")?;
    let d = Daemon::start(exe, &DaemonSetup::unpinned("adaptive"))?;
    let mut c = d.client()?;
    c.pipe_create("lb", &format!("{VIP}/16"), None, None)?;
    c.pipe_create("c", "10.80.0.2/16", None, None)?;
    c.fc_connect("c", "lb", None)?;
    let ip = |i: usize| format!("10.80.1.{}", i + 1);
    for i in 0..p.backends {
        let b = format!("b{i}");
        c.pipe_create(&b, &format!("{}/16", ip(i)), None, None)?;
        c.fc_connect("lb", &b, None)?;
    }
    let spawn = |pipe: &str, core: usize, prog: &Path, args: Vec<String>| {
        let mut cmd = d.cmd(exe);
        cmd.args(["run", "--pipe", pipe, "--cpu", &core.to_string(), "--"])
            .arg(prog)
            .args(args)
            .stderr(std::process::Stdio::null());
        Proc::spawn(cmd, &format!("{} in {pipe}", prog.display()))
    };
    let mut backends = Vec::new();
    for i in 0..p.backends {
        backends.push(spawn(
            &format!("b{i}"),
            backend_core(i),
            &httpd,
            ["--stack", "docknet", "--idle", p.idle, "--bind"]
                .iter()
                .map(|s| s.to_string())
                .chain([format!("{}:{PORT}", ip(i))])
                .collect(),
        )?);
    }
    let mut lb_args = vec![
        "--idle".to_string(),
        p.idle.into(),
        "--port".into(),
        PORT.to_string(),
    ];
    for i in 0..p.backends {
        lb_args.extend(["--backend".into(), format!("{}:{PORT}", ip(i))]);
    }
    let lb = spawn("lb", 0, &natlb, lb_args)?;
    let t = Instant::now();
    loop {
        let ls = c.pipe_ls()?;
        let up = ls.iter().filter(|x| x.socket.is_some()).count();
        if up == p.backends + 1 {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(20),
            "backends or balancer did not attach"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let gen = {
        let mut cmd = d.cmd(exe);
        cmd.args(["run", "--pipe", "c", "--cpu", "0", "--"])
            .arg(&load)
            .args(load_args(p, "docknet", p.idle, 0));
        Proc::spawn(cmd, "docknet-load")?
    };
    let mut groups = vec![
        ("load generator".to_string(), vec![gen.pid()]),
        ("balancer".to_string(), vec![lb.pid()]),
        (
            "backends".to_string(),
            backends.iter().map(Proc::pid).collect(),
        ),
    ];
    groups.extend(d.pid().map(|p| ("daemon".to_string(), vec![p])));
    let parts = Parts::new(groups);
    let row = finish_row(gen, parts, p, Mode::DocknetFc, stop);
    drop((lb, backends, d));
    row
}

/// One kernel cluster point on `lab` (a bridge built with at least `p.backends` pairs): the
/// backends in the pairs' server namespaces, the generator in pair 0's client namespace,
/// iptables DNAT of the VIP there.
pub fn kernel(exe: &Path, lab: &KernelLab, p: &ClusterPoint, stop: &Stop) -> Result<Row> {
    let httpd = beside(exe, "docknet-httpd")?;
    let load = beside(exe, "docknet-load")?;
    let client_ns = &lab.pairs[0].client_ns;
    let mut backends = Vec::new();
    for (i, pair) in lab.pairs.iter().take(p.backends).enumerate() {
        let args = vec![
            "--stack".into(),
            "kernel".into(),
            "--cpu".into(),
            backend_core(i).to_string(),
            "--bind".into(),
            format!("{}:{PORT}", pair.bind),
        ];
        let mut c = in_ns(&pair.server_ns, &httpd, args);
        c.stderr(std::process::Stdio::null());
        backends.push(Proc::spawn(c, "docknet-httpd")?);
    }
    // round robin over the backends, as kube-proxy's iptables mode does it
    let ipt = |args: &[String]| -> Result<()> {
        let what = format!("iptables {}", args.join(" "));
        checked(
            &mut in_ns(client_ns, Path::new("iptables"), args.to_vec()),
            &what,
        )
        .map(drop)
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    ipt(&s(&["-w", "-t", "nat", "-F", "OUTPUT"]))?;
    // the VIP is on no link: a route out of the container's interface, DNAT then picks the
    // backend (the CNI containers have routes to their subnet only)
    crate::proc::ip(&[
        "-n",
        client_ns,
        "route",
        "replace",
        &format!("{VIP}/32"),
        "dev",
        "eth0",
    ])?;
    for (i, pair) in lab.pairs.iter().take(p.backends).enumerate() {
        let every = (p.backends - i).to_string();
        let to = format!("{}:{PORT}", pair.bind);
        ipt(&s(&[
            "-w",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-d",
            VIP,
            "-p",
            "tcp",
            "--dport",
            "80",
            "-m",
            "statistic",
            "--mode",
            "nth",
            "--every",
            &every,
            "--packet",
            "0",
            "-j",
            "DNAT",
            "--to-destination",
            &to,
        ]))?;
    }
    std::thread::sleep(Duration::from_millis(300));
    let gen = {
        let mut c = in_ns(client_ns, &load, load_args(p, "kernel", "spin", 0));
        c.stderr(std::process::Stdio::null());
        Proc::spawn(c, "docknet-load")?
    };
    let parts = Parts::new(vec![
        ("load generator".to_string(), vec![gen.pid()]),
        (
            "backends".to_string(),
            backends.iter().map(Proc::pid).collect(),
        ),
    ]);
    let row = finish_row(gen, parts, p, Mode::Bridge, stop);
    ipt(&s(&["-w", "-t", "nat", "-F", "OUTPUT"]))?;
    drop(backends);
    row
}

/// `docknet-natlb` next to `exe`, if built.
pub fn natlb_built(exe: &Path) -> Option<PathBuf> {
    beside(exe, "docknet-natlb").ok()
}
