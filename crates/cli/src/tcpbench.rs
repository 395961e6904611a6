//! `docknet bench rr|stream --modes ...`: TCP measured by `dnperf` (one program, one code path)
//! over each network mode, side by side in one run. Modes available so far: `bridge` (kernel
//! TCP over a Linux bridge between two namespaces, with both ends on one core and across
//! cores), `docknet` (DockLib TCP through the daemon), `docknet-fc` (DockLib TCP over a fast
//! channel). The lab issue adds the other kernel modes, pairs, plots and the HTML report.

use crate::bench::{
    env_json, find, md_header, md_placement, md_results, medians, table, us, Daemon, Proc, Row,
    SERVER_START,
};
use crate::netns::{unavailable, KernelLab, KERNEL_MODES};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// DockNet modes.
pub const DOCKNET_MODES: &[&str] = &["docknet", "docknet-fc"];
/// Modes that need what this machine may not have; checked at run time and reported as "not
/// available here" with the reason, never as a number.
pub const CHECKED_MODES: &[&str] = &["ipvlan", "ovs", "sriov"];

/// Options of `docknet bench rr|stream`.
#[derive(Debug, Clone, clap::Args)]
pub struct TcpBenchArgs {
    /// Modes to compare: loopback, veth, bridge, bridge-nat, macvlan (kernel), docknet,
    /// docknet-fc; ipvlan, ovs and sriov are checked and reported as not available here.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bridge,docknet,docknet-fc"
    )]
    pub modes: Vec<String>,
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "64,1024,65536")]
    pub sizes: Vec<usize>,
    /// Measured seconds per point.
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Warm-up seconds per point (excluded).
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Runs per point (the table shows medians; every run is in the JSON).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// MTU of the DockNet pipes (the bridge's links keep 1500).
    #[arg(long, default_value_t = 9000)]
    pub mtu: u32,
    /// Write all results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write tcp-WORKLOAD.json and tcp-WORKLOAD.md (medians, ratios, placement) into this
    /// directory.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

struct Ctx {
    exe: PathBuf,
    dnperf: PathBuf,
    args: TcpBenchArgs,
    workload: &'static str,
    stop: Arc<AtomicBool>,
    rows: Vec<Row>,
    port: u16,
    /// (mode, reason) for modes that cannot run here.
    missing: Vec<(String, String)>,
}

impl Ctx {
    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.args.duration + self.args.warmup + 30.0)
    }

    fn dnperf_args(
        &self,
        role: &str,
        stack: &str,
        addr: &str,
        size: usize,
        cpu: usize,
        idle: &str,
    ) -> Vec<String> {
        let mut v: Vec<String> = [
            role,
            "--stack",
            stack,
            "--cpu",
            &cpu.to_string(),
            "--idle",
            idle,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if role == "server" {
            v.extend(["--bind".into(), addr.into(), "--conns".into(), "1".into()]);
        } else {
            v.extend(
                [
                    "--connect",
                    addr,
                    "--workload",
                    self.workload,
                    "--size",
                    &size.to_string(),
                    "--duration",
                    &self.args.duration.to_string(),
                    "--warmup",
                    &self.args.warmup.to_string(),
                    "--json",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
        }
        v
    }

    fn row(
        &mut self,
        mode: &str,
        placement: &str,
        cores: &str,
        size: usize,
        rep: usize,
        v: &Value,
    ) {
        let r = &v["result"];
        let ow = &r["one_way_ns"];
        let row = Row {
            tool: "dnperf".into(),
            mtu: v["env"]["mtu"].as_u64().map(|m| m as u32).or(Some(1500)),
            p50_us: us(ow, "p50"),
            p99_us: us(ow, "p99"),
            p999_us: us(ow, "p999"),
            mean_us: us(ow, "mean"),
            half_rtt_p50_us: us(&r["half_rtt_ns"], "p50"),
            tps: r["tps"].as_f64().filter(|_| self.workload == "rr"),
            gbps: r["gbps"].as_f64(),
            msgs_per_s: r["msgs_per_s"].as_f64(),
            cpu_s_per_op: r["cpu_s_per_op"].as_f64(),
            ..Row::new(mode, placement, cores, self.workload, size, rep)
        };
        eprintln!(
            "  {mode:<11} {cores:<9} {} {size:>6} B: {}",
            self.workload,
            row.p50_us.map_or_else(
                || format!("{:.2} Gbps", row.gbps.unwrap_or(0.0)),
                |p| format!("p50 {p:.2} us")
            )
        );
        self.rows.push(row);
    }

    fn docknet(&mut self, mode: &str) -> Result<()> {
        let fc = mode == "docknet-fc";
        let extra: Vec<&str> = if fc {
            vec!["--idle", "adaptive"]
        } else {
            vec!["--idle", "spin", "--master-core", "0"]
        };
        let d = Daemon::start(&self.exe, &extra)?;
        let mtu = self.args.mtu.to_string();
        d.ctl(
            &self.exe,
            &["pipe", "create", "a", "--ip", "10.78.0.1/24", "--mtu", &mtu],
        )?;
        d.ctl(
            &self.exe,
            &["pipe", "create", "b", "--ip", "10.78.0.2/24", "--mtu", &mtu],
        )?;
        let (cores, idle, placement) = if fc {
            d.ctl(&self.exe, &["fc", "connect", "a", "b"])?;
            (
                (0, 1),
                "spin",
                "client core 0, server core 1, both spin; daemon idle (not on the path)",
            )
        } else {
            (
                (1, 1),
                "adaptive:0",
                "client and server share core 1 (yield when idle), daemon master core 0 spin",
            )
        };
        let short = if fc {
            "c0 s1".to_string()
        } else {
            "c1 s1 m0".to_string()
        };
        for rep in 0..self.args.repeat {
            for size in self.args.sizes.clone() {
                self.check_stop()?;
                self.port += 1;
                let addr = format!("10.78.0.2:{}", self.port);
                let in_pipe = |pipe: &str, cpu: usize, args: Vec<String>| {
                    let mut c = d.cmd(&self.exe);
                    c.args(["run", "--pipe", pipe, "--cpu", &cpu.to_string(), "--"])
                        .arg(&self.dnperf)
                        .args(args);
                    c
                };
                let server = Proc::spawn(
                    in_pipe(
                        "b",
                        cores.1,
                        self.dnperf_args("server", "docknet", &addr, size, cores.1, idle),
                    ),
                    "dnperf server",
                )?;
                std::thread::sleep(SERVER_START);
                let v = Proc::spawn(
                    in_pipe(
                        "a",
                        cores.0,
                        self.dnperf_args("client", "docknet", &addr, size, cores.0, idle),
                    ),
                    "dnperf client",
                )?
                .json(self.timeout(), &self.stop)?;
                let _ = server.json(Duration::from_secs(10), &self.stop);
                self.row(mode, placement, &short, size, rep, &v);
            }
        }
        Ok(())
    }

    fn kernel(&mut self, mode: &str) -> Result<()> {
        let lab = KernelLab::create_mode(mode)
            .with_context(|| format!("building the {mode} topology"))?;
        for rep in 0..self.args.repeat {
            for (cc, sc) in [(1usize, 1usize), (0, 1)] {
                let placement = format!("client core {cc}, server core {sc}, kernel TCP ({mode})");
                let short = format!("c{cc} s{sc}");
                for size in self.args.sizes.clone() {
                    self.check_stop()?;
                    self.port += 1;
                    let bind = format!("{}:{}", lab.bind, self.port);
                    let target = format!("{}:{}", lab.target, self.port);
                    let in_ns = |ns: &str, args: Vec<String>| {
                        let mut c = Command::new("ip");
                        c.args(["netns", "exec", ns]).arg(&self.dnperf).args(args);
                        c
                    };
                    let server = Proc::spawn(
                        in_ns(
                            &lab.b,
                            self.dnperf_args("server", "kernel", &bind, size, sc, "spin"),
                        ),
                        "dnperf server",
                    )?;
                    let v = Proc::spawn(
                        in_ns(
                            &lab.a,
                            self.dnperf_args("client", "kernel", &target, size, cc, "spin"),
                        ),
                        "dnperf client",
                    )?
                    .json(self.timeout(), &self.stop)?;
                    let _ = server.json(Duration::from_secs(10), &self.stop);
                    self.row(mode, &placement, &short, size, rep, &v);
                }
            }
        }
        Ok(())
    }

    fn check_stop(&self) -> Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    }
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

/// Runs `docknet bench rr|stream`.
pub fn run(workload: &'static str, args: TcpBenchArgs) -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("docknet bench needs root (it creates namespaces and containers)");
    }
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
    if let Some(s) = args.sizes.iter().find(|s| **s < 24 || **s > 16 << 20) {
        bail!("size {s} out of range (24 B .. 16 MiB)");
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
        workload,
        stop,
        rows: Vec::new(),
        port: 21000,
        missing: Vec::new(),
    };
    for m in &args.modes {
        eprintln!("{m}:");
        let missing = if CHECKED_MODES.contains(&m.as_str()) {
            unavailable(m)
        } else {
            None
        };
        if let Some(reason) = missing {
            eprintln!("  not available here: {reason}");
            ctx.missing.push((m.clone(), reason));
        } else if KERNEL_MODES.contains(&m.as_str()) {
            ctx.kernel(m)?;
        } else if DOCKNET_MODES.contains(&m.as_str()) {
            ctx.docknet(m)?;
        } else {
            bail!("mode {m} is available on this machine but the lab cannot build it yet");
        }
    }
    let med = medians(&ctx.rows);
    print!("{}", table(&med));
    for (m, why) in &ctx.missing {
        println!("{m:<18} not available here: {why}");
    }
    let mut ratios = Vec::new();
    let metric = |r: &Row| if workload == "rr" { r.p50_us } else { r.gbps };
    for size in &args.sizes {
        for (m, cores) in [("docknet", "c1 s1 m0"), ("docknet-fc", "c0 s1")] {
            let Some(x) = find(&med, m, workload, *size, cores).and_then(metric) else {
                continue;
            };
            for bc in ["c1 s1", "c0 s1"] {
                let Some(b) = find(&med, "bridge", workload, *size, bc).and_then(metric) else {
                    continue;
                };
                let (ratio, what) = if workload == "rr" {
                    (b / x, "lower p50")
                } else {
                    (x / b, "goodput")
                };
                ratios.push(format!(
                    "{workload} {size} B: {m} vs bridge ({bc}): {ratio:.2}x {what}"
                ));
            }
        }
    }
    for r in &ratios {
        println!("{r}");
    }
    let missing: Vec<Value> = ctx
        .missing
        .iter()
        .map(|(m, why)| json!({"mode": m, "status": "not available here", "reason": why}))
        .collect();
    let doc = json!({"env": env_json(args.duration, args.warmup, args.repeat), "results": ctx.rows, "medians": med, "ratios": ratios, "not_available": missing});
    let mut outputs: Vec<PathBuf> = args.json.iter().cloned().collect();
    if let Some(dir) = &args.report {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        outputs.push(dir.join(format!("tcp-{workload}.json")));
        let md = dir.join(format!("tcp-{workload}.md"));
        std::fs::write(&md, markdown(workload, &doc, &med, &ratios))
            .with_context(|| format!("writing {}", md.display()))?;
        eprintln!("wrote {}", md.display());
    }
    for f in outputs {
        std::fs::write(&f, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", f.display()))?;
        eprintln!("wrote {}", f.display());
    }
    Ok(())
}

fn markdown(workload: &str, doc: &Value, med: &[Row], ratios: &[String]) -> String {
    let title = if workload == "rr" {
        "TCP request/response latency side by side"
    } else {
        "TCP streaming goodput side by side"
    };
    let mut m = md_header(
        title,
        doc,
        "; every figure measured by `dnperf` (one program for kernel and DockLib sockets)",
    );
    m += &md_results(med, ratios);
    if let Some(na) = doc["not_available"].as_array().filter(|a| !a.is_empty()) {
        m += "\n## Not available here\n\n";
        for x in na {
            m += &format!(
                "- `{}`: {}\n",
                x["mode"].as_str().unwrap_or("?"),
                x["reason"].as_str().unwrap_or("?")
            );
        }
    }
    m += &md_placement(med);
    m
}
