//! `docknet-natlb`: the NAT load balancer as a program. It attaches to its container's DockPipe,
//! checks that every backend is a fast-channel partner, and then loops: frames in, through the
//! [`Balancer`], frames out, timers, and every 10 ms a look at the fast channels and the
//! signals. Everything it decides is in the library; this file is the I/O.

#![deny(unsafe_code)]

use clap::Parser;
use docknet_lib::{Endpoint, SendError};
use docknet_natlb::backend::Params;
use docknet_natlb::config::{self, BackendSpec, PortSpec};
use docknet_natlb::table::Limits;
use docknet_natlb::{Balancer, Config, Dest, Policy, Sent, Tx};
use docknet_pipe::IdlePolicy;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Frames handled before the queued ones are published.
const BATCH: usize = 32;
/// Channels, signals and stats are looked at this often.
const HOUSEKEEPING: Duration = Duration::from_millis(10);
/// Largest frame taken in (a fast channel's default MTU is 65535).
const MAX_FRAME: usize = 65_535 + 14 + 64;

/// NAT load balancer for DockNet: spreads TCP connections to this container's address (the
/// VIP) over backend containers reached by fast channels.
#[derive(Debug, Parser)]
#[command(name = "docknet-natlb", version, after_help = HELP)]
struct Cli {
    /// A backend, IP[:PORT] (repeatable). It must be a fast-channel partner of this
    /// container's pipe (`docknet fc connect LB_PIPE BACKEND_PIPE`).
    #[arg(long = "backend", value_name = "IP[:PORT]", required = true)]
    backends: Vec<BackendSpec>,
    /// A port served on the VIP (repeatable); VPORT:BPORT sends it to port BPORT of the
    /// backends, plain VPORT to the backend's own PORT, or else to VPORT.
    #[arg(long = "port", value_name = "VPORT[:BPORT]", required = true)]
    ports: Vec<PortSpec>,
    /// How new connections are spread: rr (in turn) or least-conn (fewest open connections).
    #[arg(long, value_enum, default_value = "rr")]
    policy: Policy,
    /// What the loop does when no frame waits: adaptive (yield the core for up to 1 ms, fewer
    /// yields when others want it, then sleep: the default of every DockNet program, which
    /// measured best where cores are shared), adaptive:SPIN_US (spin first), spin (owns a core:
    /// lowest latency when it has one to itself), or block (sleep at once).
    #[arg(long, default_value = "adaptive", value_parser = IdlePolicy::parse)]
    idle: IdlePolicy,
    /// Write the counters as JSON to FILE every second (atomically: a new file renamed over).
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
    /// Most connections at once (at most 63976).
    #[arg(long, default_value_t = 32_768)]
    max_conns: usize,
    /// Seconds an established connection may stay silent before it is forgotten.
    #[arg(long, default_value_t = 300.0)]
    idle_timeout: f64,
    /// Milliseconds a backend has to answer a SYN before it counts as a failure.
    #[arg(long, default_value_t = 1000)]
    syn_deadline_ms: u64,
    /// Failures in a row (unanswered SYNs, failed probes) that take a backend out.
    #[arg(long, default_value_t = 3)]
    fail_after: u32,
    /// Milliseconds between health probes of a backend that is up (0: probe only backends
    /// that are out).
    #[arg(long, default_value_t = 1000)]
    probe_interval_ms: u64,
    /// Milliseconds a probe may take.
    #[arg(long, default_value_t = 1000)]
    probe_timeout_ms: u64,
    /// Longest wait, in milliseconds, between probes of a backend that is out (the wait
    /// starts at 250 ms and doubles).
    #[arg(long, default_value_t = 8000)]
    backoff_max_ms: u64,
    /// Clamp the MSS of SYNs to fit this container's pipe MTU.
    #[arg(long)]
    clamp_mss: bool,
}

const HELP: &str = "How it works:
  Clients connect to VIP:VPORT, where the VIP is this container's own pipe address. For each new
  connection (a SYN) the balancer picks an available backend and a balancer-side port, and
  rewrites the frames both ways (full NAT): client -> backend frames leave as
  VIP:port -> backend, backend -> client frames as VIP:VPORT -> client, with the IPv4 and TCP
  checksums updated. A connection stays on its backend until FIN both ways, RST or an idle
  timeout. Backends are reached over fast channels only; one whose channel goes, or that leaves
  SYNs or health probes unanswered, is taken out (its connections are reset towards their
  clients) and probed again with backoff.

  On SIGTERM or SIGINT it prints its counters as one JSON line (per backend: state, active,
  total, failures...; dropped frames by reason) and exits 0.

Example:
  docknet pipe create lb --ip 10.0.0.1/24;  docknet pipe create web1 --ip 10.0.0.11/24 ...
  docknet fc connect lb web1;  docknet fc connect lb web2
  docknet run --pipe lb --cpu 1 -- docknet-natlb --backend 10.0.0.11:80 --backend 10.0.0.12:80 --port 80
  docknet run --pipe client -- dnperf client --stack docknet --connect 10.0.0.1:80 --workload rr";

/// The way out over the container's endpoint; `queued` says whether a flush is due.
struct EpTx<'a> {
    ep: &'a mut Endpoint,
    queued: &'a mut bool,
}

impl Tx for EpTx<'_> {
    fn send(&mut self, frame: &[u8], dest: Dest) -> Sent {
        // a backend is reached over its fast channel or not at all (the endpoint would
        // otherwise route it through the daemon)
        if let Dest::Backend(ip) = dest {
            if self.ep.fc_peer_mac(ip).is_none() {
                return Sent::NoChannel;
            }
        }
        match self.ep.send(frame) {
            Ok(_) => {
                *self.queued = true;
                Sent::Ok
            }
            Err(SendError::Full) => Sent::Full,
            Err(SendError::BadLength(_)) => Sent::TooBig,
            // the pipe is gone: the loop notices and ends
            Err(SendError::Closed) => Sent::Full,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("docknet-natlb: {e}");
            ExitCode::from(1)
        }
    }
}

fn config(cli: &Cli, ep: &Endpoint) -> Result<Config, String> {
    let (backends, services) = config::plan(ep.ip(), &cli.backends, &cli.ports)?;
    let peers: Vec<_> = ep.fc_peers().into_iter().map(|(ip, _)| ip).collect();
    if let Some(b) = backends.iter().find(|b| !peers.contains(&b.ip)) {
        return Err(format!(
            "backend {b} is not a fast-channel partner of pipe {} (connect them first: docknet fc connect {} PIPE_OF_{})",
            ep.name(),
            ep.name(),
            b.ip
        ));
    }
    if !(0.0..=1e9).contains(&cli.idle_timeout) {
        return Err(format!("bad --idle-timeout {}", cli.idle_timeout));
    }
    let ms = Duration::from_millis;
    Ok(Config {
        vip: ep.ip(),
        mac: ep.mac(),
        mss: cli
            .clamp_mss
            .then(|| ep.mtu().saturating_sub(40).min(65_535) as u16),
        policy: cli.policy,
        backends,
        services,
        limits: Limits {
            max_conns: cli.max_conns,
            idle_timeout: Duration::from_secs_f64(cli.idle_timeout),
            ..Limits::default()
        },
        health: Params {
            syn_deadline: ms(cli.syn_deadline_ms.max(1)),
            fail_after: cli.fail_after.max(1),
            probe_interval: (cli.probe_interval_ms > 0).then(|| ms(cli.probe_interval_ms)),
            probe_timeout: ms(cli.probe_timeout_ms.max(1)),
            backoff_max: ms(cli.backoff_max_ms.max(250)),
            ..Params::default()
        },
        seed: seed(),
    })
}

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9e37_79b9_7f4a_7c15)
        ^ u64::from(std::process::id()) << 32
}

fn run(cli: Cli) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| e.to_string())?;
    }
    let mut ep = Endpoint::attach_default(cli.idle).map_err(|e| e.to_string())?;
    let cfg = config(&cli, &ep)?;
    let now = Instant::now();
    let mut lb = Balancer::new(cfg, |ip| ep.fc_peer_mac(ip), now);
    eprintln!(
        "docknet-natlb: {} serving port(s) {} over {} backend(s), policy {:?}, idle {}",
        ep.ip(),
        cli.ports
            .iter()
            .map(|p| p.vport.to_string())
            .collect::<Vec<_>>()
            .join(","),
        lb.backends().len(),
        cli.policy,
        cli.idle
    );
    if let Some(p) = &cli.stats {
        let json = serde_json::to_string(&lb.snapshot(now)).map_err(|e| e.to_string())?;
        write_atomically(p, &json).map_err(|e| format!("--stats {}: {e}", p.display()))?;
    }
    let end = serve(&mut ep, &mut lb, &stop, cli.stats.as_deref());
    let snap = lb.snapshot(Instant::now());
    let json = serde_json::to_string(&snap).map_err(|e| e.to_string())?;
    if let Some(p) = &cli.stats {
        write_atomically(p, &json).map_err(|e| format!("--stats {}: {e}", p.display()))?;
    }
    println!("{json}");
    end
}

/// The loop, until a signal (Ok) or the pipe's removal (Err).
fn serve(
    ep: &mut Endpoint,
    lb: &mut Balancer,
    stop: &AtomicBool,
    stats: Option<&Path>,
) -> Result<(), String> {
    let mut buf = vec![0u8; MAX_FRAME];
    let mut next_house = Instant::now();
    let mut next_stats = Instant::now() + Duration::from_secs(1);
    loop {
        let now = Instant::now();
        let mut got = 0;
        let mut queued = false;
        while got < BATCH {
            let Some((n, _)) = ep.recv(&mut buf) else {
                break;
            };
            let mut tx = EpTx {
                ep,
                queued: &mut queued,
            };
            lb.handle(&mut buf[..n], now, &mut tx);
            got += 1;
        }
        let mut tx = EpTx {
            ep,
            queued: &mut queued,
        };
        lb.tick(now, &mut tx);
        // publishing costs a fence per ring: only when something was queued
        if queued {
            ep.flush();
        }
        if now >= next_house {
            next_house = now + HOUSEKEEPING;
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            if ep.is_closed() {
                return Err(format!("pipe {} was removed", ep.name()));
            }
            lb.refresh_channels(|ip| ep.fc_peer_mac(ip), now);
            if let (Some(p), true) = (stats, now >= next_stats) {
                next_stats = now + Duration::from_secs(1);
                let json = serde_json::to_string(&lb.snapshot(now)).unwrap_or_default();
                if let Err(e) = write_atomically(p, &json) {
                    return Err(format!("--stats {}: {e}", p.display()));
                }
            }
        }
        if got == 0 {
            ep.idle(HOUSEKEEPING);
        } else {
            ep.busy();
        }
    }
}

/// Writes `text` to a new file beside `path` and renames it over `path`: a reader sees the old
/// file or the new one, never half of one.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, format!("{text}\n"))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_are_replaced_whole_and_leave_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("stats.json");
        write_atomically(&p, r#"{"a":1}"#).unwrap();
        write_atomically(&p, r#"{"a":2}"#).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"a\":2}\n");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["stats.json"]);
        assert!(write_atomically(&dir.path().join("no/such/dir"), "x").is_err());
    }

    #[test]
    fn the_command_line_parses_and_refuses_in_clap_terms() {
        let c = Cli::try_parse_from([
            "docknet-natlb",
            "--backend",
            "10.0.0.2:80",
            "--port",
            "8080:80",
            "--policy",
            "least-conn",
            "--idle",
            "block",
        ])
        .unwrap();
        assert_eq!(c.policy, Policy::LeastConn);
        assert_eq!(c.idle, IdlePolicy::Block);
        assert!(Cli::try_parse_from(["docknet-natlb", "--port", "80"]).is_err());
        assert!(Cli::try_parse_from(["docknet-natlb", "--backend", "x", "--port", "80"]).is_err());
    }
}
