//! `docknet bench http`: an HTTP server under load on each mode (the paper's Fig. 11).
//!
//! On every mode the project's own server (`docknet-httpd`) is loaded by the project's own
//! generator (`docknet-load`), one program each for kernel and DockLib sockets. On the kernel
//! modes the same server is also loaded by Debian's `wrk` (the cross-check of the generator:
//! requests/s should agree within 15%), and Debian's `nginx` (static file, keep-alive, a master
//! and one worker per core) is loaded by `wrk`: the server people deploy, on the same network.
//! In the preload modes nginx and wrk run unmodified over DockNet (`docknet run --preload`); in
//! the DockLib modes nginx is reported as not available.
//!
//! Placement (`--placement pinned`): the load generator on core 0, the server on core 1; through
//! the daemon, the master spins on core 0 and both containers share core 1 (as the lab's rr).
//! `--placement unpinned`: nothing pinned in any mode, no idle policy given to any DockNet
//! program (each at its default), the daemon at its defaults. The machine's CPU per answer
//! comes from `/proc/stat` over the middle of the measured window.

use crate::cpustat::CpuTimes;
use crate::mode::Mode;
use crate::plan::DaemonSetup;
use crate::proc::{in_ns, wait_listening, Proc, Stop};
use crate::progress::Progress;
use crate::row::{Row, Tool, Workload};
use crate::topology::{DocknetLab, KernelLab};
use anyhow::{bail, Context, Result};
use docknet_http::client::LoadReport;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The servers `--server` takes.
pub const SERVERS: [&str; 2] = ["docknet-httpd", "nginx"];

/// How long a server has to come up before its run fails.
const SERVER_UP: Duration = Duration::from_secs(20);

/// What one measurement runs.
#[derive(Debug, Clone)]
pub struct HttpPoint {
    /// `docknet-httpd` or `nginx`.
    pub server: &'static str,
    /// The load generator.
    pub tool: Tool,
    /// Connections.
    pub connections: usize,
    /// Run index.
    pub repeat: usize,
}

/// How long a point measures and warms up, and what it asks for.
#[derive(Debug, Clone)]
pub struct HttpTiming {
    /// Measured seconds.
    pub duration: f64,
    /// Warm-up seconds.
    pub warmup: f64,
    /// The request path.
    pub path: String,
}

/// The size of the body `path` answers with (the files `docknet-httpd` compiles in, which
/// the lab also gives nginx, or `/bytes/N`); 1 when unknown.
pub fn body_size(path: &str) -> usize {
    if let Some((_, _, b)) = docknet_http::server::FILES
        .iter()
        .find(|(p, _, _)| *p == path)
    {
        return b.len();
    }
    path.strip_prefix("/bytes/")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// What `wrk --latency` printed, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WrkOut {
    /// Requests/sec.
    pub req_per_s: f64,
    /// Latency percentiles (us): 50, 90, 99.
    pub p50_us: Option<f64>,
    /// 90th.
    pub p90_us: Option<f64>,
    /// 99th.
    pub p99_us: Option<f64>,
    /// Mean latency (us).
    pub mean_us: Option<f64>,
    /// Socket errors and non-2xx/3xx answers together.
    pub errors: u64,
}

/// `123.45us`, `1.20ms`, `2.00s` in microseconds.
fn wrk_time(s: &str) -> Option<f64> {
    let s = s.trim();
    let (n, mult) = if let Some(x) = s.strip_suffix("us") {
        (x, 1.0)
    } else if let Some(x) = s.strip_suffix("ms") {
        (x, 1e3)
    } else if let Some(x) = s.strip_suffix('s') {
        (x, 1e6)
    } else if let Some(x) = s.strip_suffix('m') {
        (x, 60e6)
    } else {
        return None;
    };
    n.parse::<f64>().ok().map(|v| v * mult)
}

/// Parses `wrk --latency` output (untrusted text: anything unexpected is left out).
pub fn parse_wrk(out: &str) -> Option<WrkOut> {
    let mut w = WrkOut::default();
    let mut seen = false;
    for line in out.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            w.req_per_s = v.trim().parse().ok()?;
            seen = true;
        } else if let Some(v) = t.strip_prefix("Latency ") {
            // "Latency   139.47us  356.07us ..." (not "Latency Distribution")
            if let Some(m) = v.split_whitespace().next().and_then(wrk_time) {
                w.mean_us = Some(m);
            }
        } else if let Some(v) = t.strip_prefix("50%") {
            w.p50_us = wrk_time(v);
        } else if let Some(v) = t.strip_prefix("90%") {
            w.p90_us = wrk_time(v);
        } else if let Some(v) = t.strip_prefix("99%") {
            w.p99_us = wrk_time(v);
        } else if let Some(v) = t.strip_prefix("Non-2xx or 3xx responses:") {
            w.errors += v.trim().parse::<u64>().unwrap_or(0);
        } else if let Some(v) = t.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            w.errors += v
                .split(',')
                .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    seen.then_some(w)
}

/// Where the parties of a mode run, and its daemon.
#[derive(Debug, Clone)]
pub struct HttpPlacement {
    /// The load generator's core (`None`: not pinned).
    pub client: Option<usize>,
    /// The server's core (`None`: not pinned).
    pub server: Option<usize>,
    /// DockNet peers' idle policy (`None`: none given, each program's default).
    pub idle: Option<&'static str>,
    /// The daemon, for DockNet modes.
    pub daemon: Option<DaemonSetup>,
    /// Short form.
    pub cores: String,
    /// In words.
    pub description: String,
}

/// The placement of `mode`: unpinned (a user's defaults; the rows' placement reads
/// [`crate::plan::UNPINNED`]) or pinned (the paper's setting).
pub fn placement(mode: Mode, unpinned: bool) -> HttpPlacement {
    if !unpinned {
        return pinned(mode);
    }
    HttpPlacement {
        client: None,
        server: None,
        idle: None,
        daemon: mode.is_docknet().then_some(crate::plan::UNPINNED_DAEMON),
        cores: "-".into(),
        description: crate::plan::UNPINNED.into(),
    }
}

/// The pinned placement of `mode`.
fn pinned(mode: Mode) -> HttpPlacement {
    match mode {
        Mode::Docknet => HttpPlacement {
            client: Some(1),
            server: Some(1),
            idle: Some("adaptive:0"),
            daemon: Some(DaemonSetup::spinning_on(0)),
            cores: "c1 s1 m0".into(),
            description: "load generator and server share core 1 (yield when idle), daemon master \
                          core 0 spin"
                .into(),
        },
        Mode::DocknetFc | Mode::DocknetAuto => HttpPlacement {
            client: Some(0),
            server: Some(1),
            idle: Some("spin"),
            daemon: Some(DaemonSetup::unpinned("adaptive")),
            cores: "c0 s1".into(),
            description: "load generator core 0, server core 1, both spin; daemon idle (not on \
                          the path)"
                .into(),
        },
        // unmodified programs (nginx, wrk) at the preload library's defaults
        Mode::DocknetPreload => HttpPlacement {
            client: Some(1),
            server: Some(1),
            idle: None,
            daemon: Some(DaemonSetup::spinning_on(0)),
            cores: "c1 s1 m0".into(),
            description: "load generator and server share core 1 (the preload library's \
                          defaults), daemon master core 0 spin"
                .into(),
        },
        Mode::DocknetFcPreload => HttpPlacement {
            client: Some(0),
            server: Some(1),
            idle: None,
            daemon: Some(DaemonSetup::unpinned("adaptive")),
            cores: "c0 s1".into(),
            description: "load generator core 0, server core 1 (the preload library's \
                          defaults); daemon idle (not on the path)"
                .into(),
        },
        m => HttpPlacement {
            client: Some(0),
            server: Some(1),
            idle: None,
            daemon: None,
            cores: "c0 s1".into(),
            description: format!(
                "load generator core 0, server core 1, kernel TCP ({m}, built with {})",
                m.builder().name()
            ),
        },
    }
}

/// A program next to `exe`.
pub fn beside(exe: &Path, name: &str) -> Result<PathBuf> {
    let p = exe.with_file_name(name);
    if p.exists() {
        Ok(p)
    } else {
        bail!(
            "{name} not found next to {} (cargo build --release builds it)",
            exe.display()
        )
    }
}

/// A topology an HTTP point runs on.
#[derive(Debug)]
pub enum HttpNet<'a> {
    /// Kernel namespaces (pair 0).
    Kernel(&'a KernelLab),
    /// Pipes `c0` and `s0` on a daemon.
    Docknet(&'a DocknetLab),
}

/// nginx of the lab's own: a prefix directory with its configuration, logs and the same
/// content `docknet-httpd` serves.
#[derive(Debug)]
pub struct Nginx {
    dir: tempfile::TempDir,
}

impl Nginx {
    /// Writes a configuration listening on `listen` (`IP:PORT`) with nginx's own process model
    /// as Debian ships it: a master and `worker_processes auto` (one worker per core).
    /// `in_container`: nginx runs in a DockNet container (`docknet run --preload`, this
    /// directory bound read-only), so its pid, log and temporary files go to the container's
    /// private /tmp and it runs as the container's user.
    pub fn prepare(listen: &str, in_container: bool) -> Result<Nginx> {
        let dir = tempfile::Builder::new()
            .prefix("docknet-nginx-")
            .tempdir()
            .context("making nginx's directory")?;
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www)?;
        for (path, _, body) in docknet_http::server::FILES {
            if *path != "/" {
                std::fs::write(www.join(path.trim_start_matches('/')), body)?;
            }
        }
        let d = dir.path().display().to_string();
        let (w, user) = if in_container {
            // readable by the container's user
            use std::os::unix::fs::PermissionsExt;
            for p in [dir.path(), &www] {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))?;
            }
            ("/tmp".to_string(), "")
        } else {
            (d.clone(), "user root;\n")
        };
        let conf = format!(
            "worker_processes auto;\n{user}daemon off;\npid {w}/nginx.pid;\n\
             error_log {w}/error.log;\nevents {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  keepalive_requests 100000000;\n  \
             keepalive_timeout 65;\n  types {{ text/html html; text/plain txt; }}\n  \
             default_type application/octet-stream;\n  client_body_temp_path {w}/body;\n  \
             proxy_temp_path {w}/proxy;\n  fastcgi_temp_path {w}/fastcgi;\n  \
             uwsgi_temp_path {w}/uwsgi;\n  scgi_temp_path {w}/scgi;\n  \
             server {{\n    listen {listen};\n    root {d}/www;\n    index index.html;\n  }}\n}}\n"
        );
        let f = dir.path().join("nginx.conf");
        std::fs::write(&f, conf)?;
        if in_container {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644))?;
        }
        Ok(Nginx { dir })
    }

    /// Its directory (configuration and site).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `nginx -c CONF -p DIR`.
    pub fn args(&self) -> Vec<String> {
        let d = self.dir.path();
        vec![
            "-c".into(),
            d.join("nginx.conf").display().to_string(),
            "-p".into(),
            d.display().to_string(),
        ]
    }
}

/// The machine's CPU over a window, sampled by a thread while a point runs.
pub(crate) fn sample_cpu(
    from: Duration,
    len: Duration,
) -> std::thread::JoinHandle<Option<(CpuTimes, f64)>> {
    std::thread::spawn(move || {
        std::thread::sleep(from);
        let (a, t) = (CpuTimes::now()?, Instant::now());
        std::thread::sleep(len);
        let b = CpuTimes::now()?;
        Some((b.since(&a), t.elapsed().as_secs_f64()))
    })
}

/// Ends a server with SIGTERM and returns what it printed last, if it was JSON.
fn stop_server(p: Proc, stop: &Stop) -> Option<serde_json::Value> {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(p.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    p.result::<serde_json::Value>(Duration::from_secs(10), stop)
        .ok()
}

/// Runs one point: a server, a load generator against it, the row.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    exe: &Path,
    net: &HttpNet<'_>,
    mode: Mode,
    pl: &HttpPlacement,
    pt: &HttpPoint,
    t: &HttpTiming,
    stop: &Stop,
    progress: &mut Progress,
) -> Result<Row> {
    let (server_addr, target) = match net {
        HttpNet::Kernel(l) => {
            let p = &l.pairs[0];
            (
                format!("{}:{}", p.bind, p.port),
                format!("{}:{}", p.target, p.port),
            )
        }
        HttpNet::Docknet(_) => {
            let ip = DocknetLab::server_ip(0);
            (format!("{ip}:80"), format!("{ip}:80"))
        }
    };
    let httpd = beside(exe, "docknet-httpd")?;
    let load = beside(exe, "docknet-load")?;
    let pin = |core: Option<usize>, prog: &Path, args: Vec<String>| -> (PathBuf, Vec<String>) {
        let Some(core) = core else {
            return (prog.to_path_buf(), args);
        };
        let mut v = vec![
            "-c".to_string(),
            core.to_string(),
            prog.display().to_string(),
        ];
        v.extend(args);
        (PathBuf::from("taskset"), v)
    };
    // DockNet programs get an idle policy only where the placement chooses one
    let idle_args = |v: &mut Vec<String>| {
        if let Some(i) = pl.idle {
            v.extend(["--idle".into(), i.into()]);
        }
    };
    // a server in the kernel lab's server namespace, once it listens
    let kernel_server = |l: &KernelLab, prog: &Path, args: Vec<String>, what: &str| {
        let (p, a) = pin(pl.server, prog, args);
        let mut c = in_ns(&l.pairs[0].server_ns, &p, a);
        c.stderr(std::process::Stdio::null());
        let s = Proc::spawn(c, what)?;
        let pair = &l.pairs[0];
        wait_listening(s.pid(), &pair.server_ns, pair.port, SERVER_UP, stop)?;
        anyhow::Ok(s)
    };
    // the server
    let nginx;
    let server = match (net, pt.server) {
        (HttpNet::Kernel(l), "docknet-httpd") => {
            let args = vec![
                "--stack".into(),
                "kernel".into(),
                "--bind".into(),
                server_addr.clone(),
            ];
            kernel_server(l, &httpd, args, "docknet-httpd")?
        }
        (HttpNet::Kernel(l), "nginx") => {
            nginx = Nginx::prepare(&server_addr, false)?;
            kernel_server(l, Path::new("nginx"), nginx.args(), "nginx")?
        }
        (HttpNet::Docknet(l), "nginx") if mode.is_preload() => {
            // unmodified, its workers forked after it listens (the first to use the
            // listener takes the pipe's stack: docs/preload.md, "fork")
            nginx = Nginx::prepare(&server_addr, true)?;
            let c = l.run_bound(
                exe,
                &DocknetLab::server_pipe(0),
                pl.server,
                &[nginx.dir()],
                Path::new("nginx"),
                nginx.args(),
            );
            let p = Proc::spawn(c, "nginx in its container")?;
            l.wait_servers(1, SERVER_UP)?;
            p
        }
        (HttpNet::Docknet(l), "docknet-httpd") => {
            let mut args = vec!["--stack".into(), "docknet".into()];
            idle_args(&mut args);
            args.extend(["--bind".into(), server_addr.clone()]);
            let c = l.run_in(exe, &DocknetLab::server_pipe(0), pl.server, &httpd, args);
            let p = Proc::spawn(c, "docknet-httpd in its container")?;
            l.wait_servers(1, SERVER_UP)?;
            p
        }
        (_, s) => bail!("{s} does not run on {mode} here"),
    };
    std::thread::sleep(Duration::from_millis(300));
    let url = format!("http://{target}{}", t.path);
    let total = Duration::from_secs_f64(t.warmup + t.duration);
    let cpu = sample_cpu(
        Duration::from_secs_f64(t.warmup + t.duration * 0.1),
        Duration::from_secs_f64(t.duration * 0.8),
    );
    let timeout = total + Duration::from_secs(30);
    let mut row = Row {
        server: Some(pt.server.into()),
        connections: Some(pt.connections),
        repeat: pt.repeat,
        cores: pl.cores.clone(),
        placement: pl.description.clone(),
        mtu: Some(match net {
            HttpNet::Kernel(l) => l.mtu,
            HttpNet::Docknet(l) => l.mtu,
        }),
        builder: Some(mode.builder().name().into()),
        ..Row::new(mode, pt.tool, Workload::Http, body_size(&t.path))
    };
    let requests = match pt.tool {
        Tool::Wrk => {
            let wrk_args = vec![
                "-t1".into(),
                format!("-c{}", pt.connections),
                format!("-d{}s", (t.warmup + t.duration).ceil() as u64),
                "--latency".into(),
                url.clone(),
            ];
            let mut c = match net {
                HttpNet::Kernel(l) => {
                    let (p, a) = pin(pl.client, Path::new("wrk"), wrk_args);
                    in_ns(&l.pairs[0].client_ns, &p, a)
                }
                // unmodified, under the preload library
                HttpNet::Docknet(l) if mode.is_preload() => l.run_in(
                    exe,
                    &DocknetLab::client_pipe(0),
                    pl.client,
                    Path::new("wrk"),
                    wrk_args,
                ),
                HttpNet::Docknet(_) => bail!("wrk runs on kernel and preload modes"),
            };
            let out = c.output().context("running wrk")?;
            let text = String::from_utf8_lossy(&out.stdout);
            let w = parse_wrk(&text).with_context(|| format!("wrk printed no result: {text:?}"))?;
            row.req_per_s = Some(w.req_per_s);
            row.p50_us = w.p50_us;
            row.p99_us = w.p99_us;
            row.mean_us = w.mean_us;
            row.errors = Some(w.errors);
            w.req_per_s * (t.warmup + t.duration).ceil()
        }
        _ => {
            let mut args = vec![
                "--connections".into(),
                pt.connections.to_string(),
                "--duration".into(),
                format!("{}s", t.duration),
                "--warmup".into(),
                format!("{}s", t.warmup),
                "--json".into(),
            ];
            let c = match net {
                HttpNet::Kernel(l) => {
                    args.extend(["--stack".into(), "kernel".into(), url.clone()]);
                    let (p, a) = pin(pl.client, &load, args);
                    in_ns(&l.pairs[0].client_ns, &p, a)
                }
                HttpNet::Docknet(l) => {
                    args.extend(["--stack".into(), "docknet".into()]);
                    idle_args(&mut args);
                    args.push(url.clone());
                    l.run_in(exe, &DocknetLab::client_pipe(0), pl.client, &load, args)
                }
            };
            let r: LoadReport = Proc::spawn(c, "docknet-load")?.result(timeout, stop)?;
            row.req_per_s = Some(r.req_per_s);
            row.p50_us = Some(r.p50_us);
            row.p99_us = Some(r.p99_us);
            row.p999_us = Some(r.p999_us);
            row.mean_us = Some(r.mean_us);
            row.errors = Some(r.errors.values().sum());
            row.one_way_hist = Some(r.latency_hist.clone());
            row.gbps = Some(r.transfer_bytes_per_s * 8.0 / 1e9);
            r.requests as f64
        }
    };
    if let Ok(Some((c, secs))) = cpu.join() {
        let rps = row.req_per_s.unwrap_or(0.0);
        if rps > 0.0 && secs > 0.0 {
            row.cpu_s_per_op = Some(CpuTimes::seconds(c.busy()) / (rps * secs));
            row.cpu_cores = Some(CpuTimes::seconds(c.busy()) / secs);
        }
    }
    let served = stop_server(server, stop);
    if let Some(s) = served
        .as_ref()
        .and_then(|v| v.get("responses_2xx")?.as_f64())
    {
        // the server answered at least what the generator counted (warm-up comes on top)
        if pt.tool == Tool::DocknetLoad && s + 1.0 < requests {
            progress.line(&format!(
                "  warning: {mode} {}: the server counted {s} answers, the generator {requests}",
                pt.server
            ));
        }
    }
    Ok(row)
}

/// Whether a program is on the PATH.
pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog} >/dev/null 2>&1")])
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real output of wrk 4.1.0 (`wrk -t1 -c8 -d3s --latency`).
    const WRK: &str = "Running 3s test @ http://127.0.0.1:18080/hello.txt
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   139.47us  356.07us   8.45ms   97.50%
    Req/Sec    75.67k     4.52k   81.29k    70.00%
  Latency Distribution
     50%   83.00us
     75%   99.00us
     90%  125.00us
     99%    1.58ms
  226032 requests in 3.00s, 27.59MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:  75289.58
Transfer/sec:      9.19MB
";

    #[test]
    fn wrk_output_is_parsed_and_garbage_is_not_a_result() {
        let w = parse_wrk(WRK).unwrap();
        assert_eq!(w.req_per_s, 75289.58);
        assert_eq!(w.p50_us, Some(83.0));
        assert_eq!(w.p90_us, Some(125.0));
        assert_eq!(w.p99_us, Some(1580.0));
        assert_eq!(w.mean_us, Some(139.47));
        assert_eq!(w.errors, 7);
        assert!(parse_wrk("unable to connect to 10.0.0.1:80 Connection refused").is_none());
        assert!(parse_wrk("Requests/sec: lots").is_none());
    }

    #[test]
    fn body_sizes_follow_the_served_content() {
        assert_eq!(body_size("/hello.txt"), 25);
        assert_eq!(body_size("/bytes/4096"), 4096);
        assert_eq!(body_size("/"), docknet_http::server::FILES[0].2.len());
        assert_eq!(body_size("/unknown"), 1);
    }
}
