//! `docknet raw bench`: raw frames through a fast channel and through the daemon, beside
//! kernel TCP over a Linux bridge, measured in one run. Every process it starts is its own
//! child, ended by pid; every daemon gets a private run directory and socket on tmpfs;
//! every namespace is removed at the end, also on error or Ctrl-C.

use crate::netns::{unique, KernelLab};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time given to a server to attach (and drain stale frames) before its client starts.
pub(crate) const SERVER_START: Duration = Duration::from_millis(200);

/// Options of `raw bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Paths to measure: fc (fast channel), daemon (through DockDaemon), kernel (TCP over a
    /// Linux bridge between two namespaces).
    #[arg(long, value_delimiter = ',', default_value = "fc,daemon,kernel")]
    pub paths: Vec<String>,
    /// Frame sizes for ping-pong (bytes, Ethernet header included; at least 58).
    #[arg(long, value_delimiter = ',', default_value = "64,1024")]
    pub rr_sizes: Vec<usize>,
    /// Frame sizes for streaming.
    #[arg(long, value_delimiter = ',', default_value = "64,1500,65536")]
    pub stream_sizes: Vec<usize>,
    /// Measured seconds per point.
    #[arg(long, default_value_t = 3.0)]
    pub duration: f64,
    /// Warm-up seconds per point (excluded).
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Runs per point (the table shows the median over runs; every run is in the JSON).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Core of the daemon's master thread (daemon path).
    #[arg(long, default_value_t = 0)]
    pub daemon_core: usize,
    /// Idle policy of the peers on the daemon path (they share a core).
    #[arg(long, default_value = "adaptive:0")]
    pub daemon_peer_idle: String,
    /// Write all results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write raw-bench.json and raw-bench.md (medians, ratios, targets) into this directory.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// One measured point. Field names in JSON follow the lab's results schema (`mode`,
/// `msg_size`, `tool`, ...).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The path or mode measured (raw bench: fc | daemon | kernel-bridge-tcp; TCP bench: the
    /// mode names).
    #[serde(rename = "mode")]
    pub path: String,
    /// Program that measured: dnperf, or the raw bench's own peers.
    pub tool: String,
    /// Where each party ran.
    pub placement: String,
    /// Short form of the placement: client core, server core, daemon master core.
    pub cores: String,
    /// rr | stream.
    pub workload: String,
    /// Frame (raw) or message (TCP) size.
    #[serde(rename = "msg_size")]
    pub size: usize,
    /// MTU of the link, where known.
    pub mtu: Option<u32>,
    /// Run index.
    pub repeat: usize,
    /// One-way latency percentiles (µs), rr only.
    pub p50_us: Option<f64>,
    /// 99th percentile.
    pub p99_us: Option<f64>,
    /// 99.9th percentile.
    pub p999_us: Option<f64>,
    /// Mean.
    pub mean_us: Option<f64>,
    /// RTT/2 median (µs), rr only.
    pub half_rtt_p50_us: Option<f64>,
    /// Transactions per second (rr).
    pub tps: Option<f64>,
    /// Goodput at the receiver (stream).
    pub gbps: Option<f64>,
    /// Messages per second at the receiver (stream).
    pub msgs_per_s: Option<f64>,
    /// Client CPU seconds per operation.
    pub cpu_s_per_op: Option<f64>,
    /// Frames the receiver did not get (raw stream: dropped in full rings) or rr timeouts.
    pub lost: u64,
    /// Whether every frame took the path being measured.
    pub path_ok: bool,
    /// Concurrent client/server pairs (the `pairs` workload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pairs: Option<usize>,
    /// Memory per pair (KiB): the fall in MemAvailable while the pairs ran, divided by the
    /// pairs, plus the topology's own cost per pair (`pairs` workload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_kib_per_pair: Option<f64>,
    /// How the topology was built: `cni` (reference plugins), `ip`, or `docknet`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub builder: Option<String>,
    /// rr: the one-way latency histogram as `[ns, count]` buckets (merged over runs in the
    /// summary; the report draws the CDF from it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_way_hist: Option<Vec<[u64; 2]>>,
}

impl Row {
    /// A row with only its identity filled in.
    pub(crate) fn new(
        path: &str,
        placement: &str,
        cores: &str,
        workload: &str,
        size: usize,
        repeat: usize,
    ) -> Row {
        Row {
            path: path.into(),
            tool: if path.starts_with("kernel") {
                "dnperf"
            } else {
                "raw peer"
            }
            .into(),
            mtu: None,
            placement: placement.into(),
            cores: cores.into(),
            workload: workload.into(),
            size,
            repeat,
            p50_us: None,
            p99_us: None,
            p999_us: None,
            mean_us: None,
            half_rtt_p50_us: None,
            tps: None,
            gbps: None,
            msgs_per_s: None,
            cpu_s_per_op: None,
            lost: 0,
            path_ok: true,
            pairs: None,
            mem_kib_per_pair: None,
            builder: None,
            one_way_hist: None,
        }
    }
}

pub(crate) struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    pub(crate) fn spawn(mut cmd: Command, what: &str) -> Result<Proc> {
        cmd.stdout(Stdio::piped()).stdin(Stdio::null());
        let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        Ok(Proc {
            child,
            what: what.into(),
        })
    }

    /// Waits up to `timeout` and parses the last stdout line as JSON.
    pub(crate) fn json(mut self, timeout: Duration, stop: &AtomicBool) -> Result<Value> {
        let t = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            if t.elapsed() > timeout {
                bail!("{} did not finish within {:?}", self.what, timeout);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            o.read_to_string(&mut out)?;
        }
        if !status.success() {
            bail!("{} failed ({status})", self.what);
        }
        let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap_or("");
        serde_json::from_str(line)
            .with_context(|| format!("{} printed no result: {out:?}", self.what))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A daemon of our own: private run directory and socket on tmpfs, ended by pid on drop.
pub struct Daemon {
    proc: Option<Child>,
    /// Run directory.
    pub run_dir: PathBuf,
    /// Control socket.
    pub socket: PathBuf,
}

impl Daemon {
    /// Starts `docknet daemon` with `extra` arguments and waits until it answers.
    pub fn start(exe: &Path, extra: &[&str]) -> Result<Daemon> {
        let base = if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        let run_dir = PathBuf::from(base).join(format!("docknet-{}", unique("run")));
        let socket = run_dir.join("ctl.sock");
        let child = Command::new(exe)
            .arg("--log")
            .arg("warn")
            .arg("daemon")
            .arg("--run-dir")
            .arg(&run_dir)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting docknet daemon")?;
        let mut d = Daemon {
            proc: Some(child),
            run_dir,
            socket,
        };
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&d.socket).is_err() {
            if let Some(Ok(Some(st))) = d.proc.as_mut().map(|c| c.try_wait()) {
                bail!("docknet daemon exited during start-up ({st})");
            }
            if t.elapsed() > Duration::from_secs(10) {
                bail!("docknet daemon did not open its socket within 10 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    /// `docknet --socket S ARGS...` as a command.
    pub fn cmd(&self, exe: &Path) -> Command {
        let mut c = Command::new(exe);
        c.arg("--socket").arg(&self.socket);
        c
    }

    /// Runs a client command and fails on a non-zero exit.
    pub fn ctl(&self, exe: &Path, args: &[&str]) -> Result<()> {
        crate::netns::checked(
            self.cmd(exe).args(args),
            &format!("docknet {}", args.join(" ")),
        )
        .map(drop)
    }

    /// Stops the daemon (SIGTERM, then SIGKILL) and removes its run directory.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.proc.take() {
            crate::netns::terminate(&mut c);
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) fn us(v: &Value, k: &str) -> Option<f64> {
    v[k].as_f64().map(|ns| ns / 1000.0)
}

fn rr_row(
    path: &str,
    placement: &str,
    cores: &str,
    size: usize,
    rep: usize,
    v: &Value,
    path_ok: bool,
) -> Row {
    let ow = &v["one_way_ns"];
    Row {
        p50_us: us(ow, "p50"),
        p99_us: us(ow, "p99"),
        p999_us: us(ow, "p999"),
        mean_us: us(ow, "mean"),
        half_rtt_p50_us: us(&v["half_rtt_ns"], "p50"),
        tps: v["tps"].as_f64(),
        cpu_s_per_op: v["cpu_s_per_op"].as_f64(),
        lost: v["lost"].as_u64().unwrap_or(0),
        path_ok,
        ..Row::new(path, placement, cores, "rr", size, rep)
    }
}

struct Ctx {
    exe: PathBuf,
    args: BenchArgs,
    stop: Arc<AtomicBool>,
    rows: Vec<Row>,
    total: usize,
    done: usize,
}

impl Ctx {
    fn progress(&mut self, what: &str) {
        self.done += 1;
        eprintln!("[{}/{}] {what}", self.done, self.total);
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.args.duration + self.args.warmup + 20.0)
    }

    fn peer(&self, d: &Daemon, pipe: &str, cpu: usize, args: &[String]) -> Result<Proc> {
        let mut c = d.cmd(&self.exe);
        c.args(["run", "--pipe", pipe, "--cpu", &cpu.to_string(), "--"])
            .arg(&self.exe)
            .args(["raw", "peer"])
            .args(args);
        Proc::spawn(c, &format!("raw peer in {pipe}"))
    }

    fn common(&self, size: usize) -> Vec<String> {
        vec![
            "--size".into(),
            size.to_string(),
            "--duration".into(),
            self.args.duration.to_string(),
            "--warmup".into(),
            self.args.warmup.to_string(),
        ]
    }

    /// One measurement: a server peer in pipe `b` (given time to attach), then a client peer in
    /// pipe `a` against it. Returns the client's result and the server's.
    fn point(
        &self,
        d: &Daemon,
        cores: (usize, usize),
        idle: &str,
        (server_role, client_role): (&str, &str),
        size: usize,
    ) -> Result<(Value, Result<Value>)> {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        let srv = args(&["--role", server_role, "--idle", idle, "--quiet-exit", "5"]);
        let server = self.peer(d, "b", cores.1, &srv)?;
        std::thread::sleep(SERVER_START);
        let mut cli = args(&["--role", client_role, "--dst", "10.77.0.2", "--idle", idle]);
        cli.extend(self.common(size));
        let c = self
            .peer(d, "a", cores.0, &cli)?
            .json(self.timeout(), &self.stop)?;
        Ok((c, server.json(Duration::from_secs(15), &self.stop)))
    }

    /// rr and stream points for one DockNet path on a daemon already set up.
    fn docknet_path(
        &mut self,
        d: &Daemon,
        path: &str,
        idle: &str,
        cores: (usize, usize),
    ) -> Result<()> {
        let placement = format!(
            "client core {}, server core {}, peers {idle}{}",
            cores.0,
            cores.1,
            if path == "daemon" {
                format!(", daemon master core {} spin", self.args.daemon_core)
            } else {
                ", daemon idle (not on the path)".into()
            }
        );
        let short = if path == "daemon" {
            format!("c{} s{} m{}", cores.0, cores.1, self.args.daemon_core)
        } else {
            format!("c{} s{}", cores.0, cores.1)
        };
        let want_fc = path == "fc";
        for rep in 0..self.args.repeat {
            for &size in &self.args.rr_sizes.clone() {
                let (v, _) = self.point(d, cores, idle, ("echo", "rr"), size)?;
                let n = v["transactions"].as_u64().unwrap_or(0);
                let via = if want_fc {
                    &v["rx_via"]["fc"]
                } else {
                    &v["rx_via"]["daemon"]
                };
                let ok = n > 0 && via.as_u64() == Some(n);
                self.rows
                    .push(rr_row(path, &placement, &short, size, rep, &v, ok));
                self.progress(&format!(
                    "{path} rr {size} B: p50 {:.2} us",
                    v["one_way_ns"]["p50"].as_f64().unwrap_or(0.0) / 1e3
                ));
            }
            for &size in &self.args.stream_sizes.clone() {
                let (c, s) = self.point(d, cores, idle, ("sink", "stream"), size)?;
                let s = s?;
                let sent = c["sent"].as_u64().unwrap_or(0);
                let got = s["frames"].as_u64().unwrap_or(0);
                let via = if want_fc {
                    &c["tx_via"]["fc"]
                } else {
                    &c["tx_via"]["daemon"]
                };
                self.rows.push(Row {
                    gbps: s["gbps"].as_f64(),
                    msgs_per_s: s["mpps"].as_f64().map(|m| m * 1e6),
                    cpu_s_per_op: c["cpu_s_per_op"].as_f64(),
                    lost: sent.saturating_sub(got),
                    path_ok: sent > 0 && via.as_u64() == Some(sent),
                    ..Row::new(path, &placement, &short, "stream", size, rep)
                });
                self.progress(&format!(
                    "{path} stream {size} B: {:.2} Gbps",
                    s["gbps"].as_f64().unwrap_or(0.0)
                ));
            }
        }
        Ok(())
    }

    fn kernel(&mut self) -> Result<()> {
        let lab = KernelLab::create().context("building the bridge topology")?;
        let pair = &lab.pairs[0];
        let mut port = 20000u16;
        for rep in 0..self.args.repeat {
            for (cc, sc) in [(1usize, 1usize), (0, 1)] {
                let placement = format!(
                    "client core {cc}, server core {sc}, kernel TCP over a Linux bridge (rr: Nagle off; stream: Nagle on)"
                );
                let short = format!("c{cc} s{sc}");
                let sizes: Vec<(&str, usize)> = self
                    .args
                    .rr_sizes
                    .iter()
                    .map(|s| ("rr", *s))
                    .chain(
                        self.args
                            .stream_sizes
                            .iter()
                            .map(|s| ("stream", *s))
                            .filter(|_| cc != sc),
                    )
                    .collect();
                for (wl, size) in sizes {
                    port += 1;
                    let addr = format!("{}:{port}", pair.target);
                    // the kernel rows are measured by dnperf --stack kernel (cross-checked
                    // against sockperf and iperf3, docs/benchmarks.md)
                    let dnperf = |ns: &str, args: &[&str]| {
                        let mut c = Command::new("ip");
                        c.args(["netns", "exec", ns])
                            .arg(self.exe.with_file_name("dnperf"))
                            .args(args);
                        c
                    };
                    let (cs, ss, n) = (cc.to_string(), sc.to_string(), size.to_string());
                    let (d, w) = (self.args.duration.to_string(), self.args.warmup.to_string());
                    let server = Proc::spawn(
                        dnperf(
                            &pair.server_ns,
                            &[
                                "server", "--stack", "kernel", "--bind", &addr, "--conns", "1",
                                "--cpu", &ss,
                            ],
                        ),
                        "dnperf server",
                    )?;
                    let v = Proc::spawn(
                        dnperf(
                            &pair.client_ns,
                            &[
                                "client",
                                "--stack",
                                "kernel",
                                "--connect",
                                &addr,
                                "--workload",
                                wl,
                                "--size",
                                &n,
                                "--duration",
                                &d,
                                "--warmup",
                                &w,
                                "--cpu",
                                &cs,
                                "--json",
                            ],
                        ),
                        "dnperf client",
                    )?
                    .json(self.timeout(), &self.stop)?;
                    let _ = server.json(Duration::from_secs(10), &self.stop);
                    let r = &v["result"];
                    let row = if wl == "rr" {
                        rr_row("kernel-bridge-tcp", &placement, &short, size, rep, r, true)
                    } else {
                        Row {
                            gbps: r["gbps"].as_f64(),
                            msgs_per_s: r["msgs_per_s"].as_f64(),
                            cpu_s_per_op: r["cpu_s_per_op"].as_f64(),
                            ..Row::new("kernel-bridge-tcp", &placement, &short, "stream", size, rep)
                        }
                    };
                    self.progress(&format!(
                        "kernel {wl} {size} B (cores {cc}/{sc}): {}",
                        row.p50_us.map_or_else(
                            || format!("{:.2} Gbps", row.gbps.unwrap_or(0.0)),
                            |p| format!("p50 {p:.2} us")
                        )
                    ));
                    self.rows.push(row);
                }
            }
        }
        Ok(())
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

/// Formats rows as an aligned text table (also used, fenced, in the Markdown report).
pub fn table(rows: &[Row]) -> String {
    let line = |c: [&str; 16]| {
        format!(
            "{:<11} {:<8} {:<6} {:>4} {:>6} {:>5} {:<8} {:>3} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>5} {:>5}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13],
            c[14], c[15]
        )
    };
    let mut out = line([
        "MODE", "CORES", "LOAD", "N", "SIZE", "MTU", "TOOL", "REP", "p50(us)", "p99(us)", "p99.9",
        "rtt/2", "Gbps", "Mmsg/s", "lost", "path",
    ]);
    for r in rows {
        out += &line([
            &r.path,
            &r.cores,
            &r.workload,
            &r.pairs.map_or("-".into(), |n| n.to_string()),
            &r.size.to_string(),
            &r.mtu.map_or("-".into(), |m| m.to_string()),
            &r.tool,
            &r.repeat.to_string(),
            &opt(r.p50_us, 2),
            &opt(r.p99_us, 2),
            &opt(r.p999_us, 2),
            &opt(r.half_rtt_p50_us, 2),
            &opt(r.gbps, 2),
            &opt(r.msgs_per_s.or(r.tps).map(|m| m / 1e6), 3),
            &r.lost.to_string(),
            if r.path_ok { "ok" } else { "WRONG" },
        ]);
    }
    out
}

/// One row per (mode, cores, workload, size, MTU, tool, pairs) over its repeats. Where the
/// runs carry latency histograms, p50/p99/p99.9 and the mean come from the merged histogram
/// (never from averaged percentiles) and the merged buckets are kept for the CDF; every other
/// figure is the median over the runs.
pub fn summarize(rows: &[Row]) -> Vec<Row> {
    type Key = (
        String,
        String,
        String,
        usize,
        Option<u32>,
        String,
        Option<usize>,
    );
    let key = |r: &Row| -> Key {
        (
            r.path.clone(),
            r.cores.clone(),
            r.workload.clone(),
            r.size,
            r.mtu,
            r.tool.clone(),
            r.pairs,
        )
    };
    let mut keys: Vec<Key> = Vec::new();
    for r in rows {
        let k = key(r);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|k| {
            let g: Vec<&Row> = rows.iter().filter(|r| key(r) == k).collect();
            let med = |f: &dyn Fn(&Row) -> Option<f64>| {
                let mut v: Vec<f64> = g.iter().filter_map(|r| f(r)).collect();
                v.sort_by(|a, b| a.total_cmp(b));
                v.get(v.len() / 2).copied()
            };
            let mut lost: Vec<u64> = g.iter().map(|r| r.lost).collect();
            lost.sort_unstable();
            let first = g[0];
            let mut row = Row {
                repeat: g.len(),
                p50_us: med(&|r| r.p50_us),
                p99_us: med(&|r| r.p99_us),
                p999_us: med(&|r| r.p999_us),
                mean_us: med(&|r| r.mean_us),
                half_rtt_p50_us: med(&|r| r.half_rtt_p50_us),
                tps: med(&|r| r.tps),
                gbps: med(&|r| r.gbps),
                msgs_per_s: med(&|r| r.msgs_per_s),
                cpu_s_per_op: med(&|r| r.cpu_s_per_op),
                mem_kib_per_pair: med(&|r| r.mem_kib_per_pair),
                lost: lost[lost.len() / 2],
                path_ok: g.iter().all(|r| r.path_ok),
                one_way_hist: None,
                ..first.clone()
            };
            if g.iter().all(|r| r.one_way_hist.is_some()) {
                let mut h = docknet_perf::stats::histogram();
                for r in &g {
                    docknet_perf::stats::merge_buckets(
                        &mut h,
                        r.one_way_hist.as_deref().unwrap_or(&[]),
                    );
                }
                if !h.is_empty() {
                    let s = docknet_perf::stats::Summary::of(&h);
                    row.p50_us = Some(s.p50 as f64 / 1e3);
                    row.p99_us = Some(s.p99 as f64 / 1e3);
                    row.p999_us = Some(s.p999 as f64 / 1e3);
                    row.mean_us = Some(s.mean / 1e3);
                    row.one_way_hist = Some(docknet_perf::stats::buckets(&h));
                }
            }
            row
        })
        .collect()
}

pub(crate) fn env_json(duration: f64, warmup: f64, repeat: usize) -> Value {
    let uname = nix::sys::utsname::uname().ok();
    json!({
        "kernel": uname.as_ref().map(|u| u.release().to_string_lossy().into_owned()),
        "machine": uname.as_ref().map(|u| u.machine().to_string_lossy().into_owned()),
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "version": env!("CARGO_PKG_VERSION"),
        "duration_s": duration,
        "warmup_s": warmup,
        "repeat": repeat,
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    })
}

/// The median row for (path, workload, size) whose cores start with `cores`.
pub(crate) fn find<'a>(
    med: &'a [Row],
    path: &str,
    wl: &str,
    size: usize,
    cores: &str,
) -> Option<&'a Row> {
    med.iter().find(|r| {
        r.path == path && r.workload == wl && r.size == size && r.cores.starts_with(cores)
    })
}

/// Ratios between paths measured in this run (from the medians).
fn ratio_lines(med: &[Row]) -> Vec<String> {
    let p50 = |path, size, cores| find(med, path, "rr", size, cores).and_then(|r| r.p50_us);
    let gbps = |path, size| find(med, path, "stream", size, "").and_then(|r| r.gbps);
    let mut out = Vec::new();
    let mut rr_sizes: Vec<usize> = med
        .iter()
        .filter(|r| r.workload == "rr")
        .map(|r| r.size)
        .collect();
    rr_sizes.sort_unstable();
    rr_sizes.dedup();
    for size in rr_sizes {
        let (k_same, k_cross) = (
            p50("kernel-bridge-tcp", size, "c1 s1"),
            p50("kernel-bridge-tcp", size, "c0 s1"),
        );
        if let (Some(d), Some(k1), Some(k0)) = (p50("daemon", size, ""), k_same, k_cross) {
            out.push(format!(
                "rr {size} B one-way p50, kernel bridge TCP / DockNet daemon: {:.1}x (same core), {:.1}x (cross core)",
                k1 / d,
                k0 / d
            ));
        }
        if let (Some(f), Some(k1), Some(k0)) = (p50("fc", size, ""), k_same, k_cross) {
            out.push(format!(
                "rr {size} B one-way p50, kernel bridge TCP / DockNet fast channel: {:.0}x (same core), {:.0}x (cross core)",
                k1 / f,
                k0 / f
            ));
        }
    }
    let mut st_sizes: Vec<usize> = med
        .iter()
        .filter(|r| r.workload == "stream")
        .map(|r| r.size)
        .collect();
    st_sizes.sort_unstable();
    st_sizes.dedup();
    for size in st_sizes {
        let Some(k) = gbps("kernel-bridge-tcp", size) else {
            continue;
        };
        for (path, name) in [("fc", "fast channel"), ("daemon", "daemon")] {
            if let Some(g) = gbps(path, size) {
                out.push(format!(
                    "stream {size} B goodput, DockNet {name} / kernel bridge TCP: {:.1}x ({g:.1} vs {k:.1} Gbps)",
                    g / k
                ));
            }
        }
    }
    out
}

/// Issue #2's targets, checked against this run's medians. Each line says the target, the
/// figure measured and whether it holds.
pub fn targets(med: &[Row]) -> Vec<String> {
    let find = |path: &str, wl: &str, size: usize, cores: &str| find(med, path, wl, size, cores);
    let verdict = |ok: bool| if ok { "MET" } else { "NOT MET" };
    let mut out = Vec::new();
    if let Some(p) = find("fc", "rr", 64, "").and_then(|r| r.p50_us) {
        out.push(format!(
            "fast channel 64 B one-way p50 <= 0.3 us: {p:.3} us, {}",
            verdict(p <= 0.3)
        ));
    }
    if let Some(d) = find("daemon", "rr", 64, "").and_then(|r| r.p50_us) {
        for (cores, what) in [("c1 s1", "same core"), ("c0 s1", "cross core")] {
            if let Some(k) = find("kernel-bridge-tcp", "rr", 64, cores).and_then(|r| r.p50_us) {
                out.push(format!(
                    "daemon 64 B one-way p50 >= 5x lower than kernel bridge TCP ({what}, {cores}): {:.1}x ({d:.2} vs {k:.2} us), {}",
                    k / d,
                    verdict(k / d >= 5.0)
                ));
            }
        }
    }
    if let Some(g) = find("fc", "stream", 65536, "").and_then(|r| r.gbps) {
        out.push(format!(
            "fast channel 64 KiB frames >= 15 Gbps: {g:.1} Gbps, {}",
            verdict(g >= 15.0)
        ));
    }
    out
}

fn markdown(doc: &Value, med: &[Row], ratios: &[String], checks: &[String]) -> String {
    let mut m = md_header("DockNet raw-frame benchmark", doc, "");
    m += "DockNet rows move raw Ethernet frames (no TCP); kernel rows are TCP measured by dnperf \
          over a Linux bridge between two network namespaces. One-way latency \
          comes from CLOCK_MONOTONIC timestamps carried in the payload (every namespace shares that \
          clock); rtt/2 is beside it. Stream goodput is counted at the receiver; `lost` counts raw \
          frames dropped because a receiver's ring was full (raw frames have no flow control).\n\n";
    m += &md_results(med, ratios);
    m += "\n## Targets of issue #2\n\n";
    for c in checks {
        m += &format!("- {c}\n");
    }
    m += &md_placement(med);
    m
}

/// Markdown: the title, the command and the run's environment (from `doc["env"]`), then `note`.
pub(crate) fn md_header(title: &str, doc: &Value, note: &str) -> String {
    let env = &doc["env"];
    format!(
        "# {title}\n\nCommand: `{}`  \nKernel {}, {} cores, {} s per point after {} s warm-up, {} run(s) per point{note}.\n\n",
        env["command"].as_str().unwrap_or(""),
        env["kernel"].as_str().unwrap_or("?"),
        env["cores"],
        env["duration_s"],
        env["warmup_s"],
        env["repeat"]
    )
}

/// Each (mode, cores) placement once, in table order.
pub(crate) fn placements(med: &[Row]) -> Vec<&Row> {
    let mut seen = std::collections::BTreeSet::new();
    med.iter()
        .filter(|r| seen.insert((r.path.clone(), r.cores.clone())))
        .collect()
}

/// Markdown: the table of medians and the list of ratios.
pub(crate) fn md_results(med: &[Row], ratios: &[String]) -> String {
    let mut m = String::from(
        "## Results\n\nOver all runs of a point: latency percentiles from the runs' merged \
         histograms where the tool provides them, every other figure the median of the runs.\n\n```text\n",
    );
    m += &table(med);
    m += "```\n\n## Ratios (same run)\n\n";
    for r in ratios {
        m += &format!("- {r}\n");
    }
    m
}

/// Markdown: where each party ran, per mode.
pub(crate) fn md_placement(med: &[Row]) -> String {
    let mut m = String::from("\n## Placement\n\n");
    for r in placements(med) {
        m += &format!("- `{}` `{}`: {}\n", r.path, r.cores, r.placement);
    }
    m
}

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("docknet raw bench needs root (it creates namespaces)");
    }
    if let Some(s) = args
        .rr_sizes
        .iter()
        .chain(args.stream_sizes.iter())
        .find(|s| **s < crate::peer::MIN_RAW || **s > 65549)
    {
        bail!(
            "size {s} out of range: raw frames are {}..=65549 bytes",
            crate::peer::MIN_RAW
        );
    }
    for p in &args.paths {
        if !["fc", "daemon", "kernel"].contains(&p.as_str()) {
            bail!("unknown path {p:?}: use fc, daemon, kernel");
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    for s in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(s, stop.clone())?;
    }
    let n_pts = args.rr_sizes.len() + args.stream_sizes.len();
    let total: usize = args
        .paths
        .iter()
        .map(|p| {
            if p == "kernel" {
                2 * args.rr_sizes.len() + args.stream_sizes.len()
            } else {
                n_pts
            }
        })
        .sum::<usize>()
        * args.repeat;
    let mut ctx = Ctx {
        exe: std::env::current_exe()?,
        args: args.clone(),
        stop: stop.clone(),
        rows: Vec::new(),
        total,
        done: 0,
    };
    for path in &args.paths {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        match path.as_str() {
            "kernel" => ctx.kernel()?,
            p => {
                let daemon_core = args.daemon_core.to_string();
                let extra: Vec<&str> = if p == "daemon" {
                    vec!["--idle", "spin", "--master-core", &daemon_core]
                } else {
                    vec!["--idle", "adaptive"]
                };
                let d = Daemon::start(&ctx.exe, &extra)?;
                d.ctl(
                    &ctx.exe,
                    &[
                        "pipe",
                        "create",
                        "a",
                        "--ip",
                        "10.77.0.1/24",
                        "--mtu",
                        "65535",
                    ],
                )?;
                d.ctl(
                    &ctx.exe,
                    &[
                        "pipe",
                        "create",
                        "b",
                        "--ip",
                        "10.77.0.2/24",
                        "--mtu",
                        "65535",
                    ],
                )?;
                if p == "fc" {
                    d.ctl(&ctx.exe, &["fc", "connect", "a", "b"])?;
                    ctx.docknet_path(&d, "fc", "spin", (0, 1))?;
                } else {
                    let other = if args.daemon_core == 0 { 1 } else { 0 };
                    let idle = args.daemon_peer_idle.clone();
                    ctx.docknet_path(&d, "daemon", &idle, (other, other))?;
                }
            }
        }
    }
    let med = summarize(&ctx.rows);
    print!("{}", table(&med));
    if args.repeat > 1 {
        println!(
            "(each row: median of {} runs; every run is in the JSON)",
            args.repeat
        );
    }
    let ratios = ratio_lines(&med);
    for l in &ratios {
        println!("{l}");
    }
    let checks = targets(&med);
    for c in &checks {
        println!("target: {c}");
    }
    println!("placements (CORES: c = client, s = server, m = daemon master):");
    for r in placements(&med) {
        println!("  {:<18} {:<9} {}", r.path, r.cores, r.placement);
    }
    let doc = json!({
        "env": env_json(args.duration, args.warmup, args.repeat), "results": ctx.rows, "summary": med,
        "ratios": ratios, "targets": checks,
    });
    let mut outputs = Vec::new();
    if let Some(f) = &args.json {
        outputs.push(f.clone());
    }
    if let Some(dir) = &args.report {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        outputs.push(dir.join("raw-bench.json"));
        let md = dir.join("raw-bench.md");
        std::fs::write(&md, markdown(&doc, &med, &ratios, &checks))
            .with_context(|| format!("writing {}", md.display()))?;
        eprintln!("wrote {}", md.display());
    }
    for f in outputs {
        std::fs::write(&f, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", f.display()))?;
        eprintln!("wrote {}", f.display());
    }
    if ctx.rows.iter().any(|r| !r.path_ok) {
        bail!("some frames took the wrong path (see the 'path' column)");
    }
    Ok(())
}
