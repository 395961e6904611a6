//! `docknet raw bench`: raw frames through a fast channel and through the daemon, beside kernel
//! TCP over a Linux bridge (measured by dnperf), in one run. The DockNet rows move raw Ethernet
//! frames between `docknet raw peer`s (no TCP): they measure the rings themselves.

use super::dnperf::Side;
use super::{Fleet, Runner};
use crate::mode::{Builder, Mode};
use crate::plan::{DaemonSetup, Placement};
use crate::proc::Proc;
use crate::row::{Row, Tool, Workload};
use crate::topology::{Daemon, KernelLab};
use anyhow::{bail, Context, Result};
use docknet_perf::raw::{RawOutcome, MIN_RAW};
use docknet_perf::report::ClientReport;
use docknet_perf::stats::Summary;
use std::time::Duration;

/// The paths the raw bench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawPath {
    /// Raw frames over a fast channel.
    Fc,
    /// Raw frames through the daemon.
    Daemon,
    /// Kernel TCP over a Linux bridge between two namespaces (measured by dnperf).
    Kernel,
}

/// Options of `docknet raw bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct RawArgs {
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
    pub json: Option<std::path::PathBuf>,
    /// Write raw-bench.json and raw-bench.md (medians, ratios, targets) into this directory.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

impl RawPath {
    fn parse(s: &str) -> Result<RawPath> {
        match s {
            "fc" => Ok(RawPath::Fc),
            "daemon" => Ok(RawPath::Daemon),
            "kernel" => Ok(RawPath::Kernel),
            _ => bail!("unknown path {s:?}: use fc, daemon, kernel"),
        }
    }
}

impl RawArgs {
    /// The paths asked for (refuses unknown ones).
    pub fn paths(&self) -> Result<Vec<RawPath>> {
        self.paths.iter().map(|p| RawPath::parse(p)).collect()
    }

    /// Checks paths, sizes and counts; the number of points the run will have.
    pub fn check(&self) -> Result<usize> {
        if let Some(s) = self
            .rr_sizes
            .iter()
            .chain(self.stream_sizes.iter())
            .find(|s| **s < MIN_RAW || **s > 65549)
        {
            bail!("size {s} out of range: raw frames are {MIN_RAW}..=65549 bytes");
        }
        if self.repeat == 0 || self.duration <= 0.0 || self.warmup < 0.0 {
            bail!("--repeat must be at least 1, --duration positive, --warmup not negative");
        }
        let (rr, st) = (self.rr_sizes.len(), self.stream_sizes.len());
        let per_rep: usize = self
            .paths()?
            .iter()
            .map(|p| match p {
                RawPath::Kernel => 2 * rr + st,
                _ => rr + st,
            })
            .sum();
        Ok(per_rep * self.repeat)
    }
}

const A: &str = "10.77.0.1";
const B: &str = "10.77.0.2";

impl Runner {
    /// Runs every path of `a`.
    pub fn raw_bench(&mut self, a: &RawArgs) -> Result<()> {
        for path in a.paths()? {
            self.stop.check()?;
            match path {
                RawPath::Kernel => self.raw_kernel(a)?,
                RawPath::Fc | RawPath::Daemon => self.raw_docknet(a, path)?,
            }
        }
        Ok(())
    }

    /// A raw peer in pipe `pipe` of daemon `d`, pinned to `core`.
    fn raw_peer(&self, d: &Daemon, pipe: &str, core: usize, args: &[String]) -> Result<Proc> {
        let mut c = d.cmd(&self.exe);
        c.args(["run", "--pipe", pipe, "--cpu", &core.to_string(), "--"])
            .arg(&self.exe)
            .args(["raw", "peer"])
            .args(args);
        Proc::spawn(c, &format!("raw peer in {pipe}"))
    }

    /// One raw measurement: a server peer in pipe `b` (once it is connected), then a client
    /// peer in pipe `a` against it. Returns the client's outcome and the server's.
    fn raw_point(
        &self,
        d: &Daemon,
        cores: (usize, usize),
        idle: &str,
        (server_role, client_role): (&str, &str),
        size: usize,
    ) -> Result<(RawOutcome, Result<RawOutcome>)> {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        let srv = owned(&["--role", server_role, "--idle", idle, "--quiet-exit", "5"]);
        let server = self.raw_peer(d, "b", cores.1, &srv)?;
        d.wait_connected("b", Duration::from_secs(20), &self.stop)?;
        let mut cli = owned(&["--role", client_role, "--dst", B, "--idle", idle]);
        cli.extend(owned(&[
            "--size",
            &size.to_string(),
            "--duration",
            &self.timing.duration.to_string(),
            "--warmup",
            &self.timing.warmup.to_string(),
        ]));
        let timeout = Duration::from_secs_f64(self.timing.duration + self.timing.warmup + 20.0);
        let c = self
            .raw_peer(d, "a", cores.0, &cli)?
            .result(timeout, &self.stop)?;
        Ok((c, server.result(Duration::from_secs(15), &self.stop)))
    }

    fn raw_docknet(&mut self, a: &RawArgs, path: RawPath) -> Result<()> {
        let fc = path == RawPath::Fc;
        let setup = if fc {
            DaemonSetup::unpinned("adaptive")
        } else {
            DaemonSetup {
                idle: "spin",
                master_core: Some(a.daemon_core),
                master_core_b: None,
                master_nice: 0,
            }
        };
        let d = Daemon::start(&self.exe, &setup)?;
        let mut c = d.client()?;
        c.pipe_create("a", &format!("{A}/24"), Some(65535), None)?;
        c.pipe_create("b", &format!("{B}/24"), Some(65535), None)?;
        let other = if a.daemon_core == 0 { 1 } else { 0 };
        let (mode, idle, cores) = if fc {
            c.fc_connect("a", "b", None)?;
            (Mode::DocknetFc, "spin".to_string(), (0, 1))
        } else {
            (Mode::Docknet, a.daemon_peer_idle.clone(), (other, other))
        };
        let pl = Placement {
            client: Some(cores.0),
            server: Some(cores.1),
            master: (!fc).then_some(a.daemon_core),
            master_b: None,
            idle: "",
            pairs_cores: Vec::new(),
            description: format!(
                "client core {}, server core {}, peers {idle}{}",
                cores.0,
                cores.1,
                if fc {
                    ", daemon idle (not on the path)".to_string()
                } else {
                    format!(", daemon master core {} spin", a.daemon_core)
                }
            ),
        };
        let base = |w, size, repeat| Row {
            placement: pl.description.clone(),
            cores: pl.cores(),
            repeat,
            ..Row::new(mode, Tool::RawPeer, w, size)
        };
        for rep in 0..a.repeat {
            for &size in &a.rr_sizes {
                let (out, _) = self.raw_point(&d, cores, &idle, ("echo", "rr"), size)?;
                let row = raw_rr_row(&out, fc, base(Workload::Rr, size, rep))?;
                self.raw_done(row);
            }
            for &size in &a.stream_sizes {
                let (client, server) =
                    self.raw_point(&d, cores, &idle, ("sink", "stream"), size)?;
                let row = raw_stream_row(&client, &server?, fc, base(Workload::Stream, size, rep))?;
                self.raw_done(row);
            }
        }
        Ok(())
    }

    fn raw_kernel(&mut self, a: &RawArgs) -> Result<()> {
        let lab =
            KernelLab::build(Mode::Bridge, 1, 1500).context("building the bridge topology")?;
        let fleet = Fleet::Kernel(&lab);
        for rep in 0..a.repeat {
            for (cc, sc) in [(1usize, 1usize), (0, 1)] {
                let pl = Placement {
                    client: Some(cc),
                    server: Some(sc),
                    master: None,
                    master_b: None,
                    idle: "spin",
                    pairs_cores: Vec::new(),
                    description: format!(
                        "client core {cc}, server core {sc}, kernel TCP over a Linux bridge (rr: Nagle off; stream: Nagle on)"
                    ),
                };
                let sizes: Vec<(Workload, usize)> = a
                    .rr_sizes
                    .iter()
                    .map(|s| (Workload::Rr, *s))
                    .chain(
                        a.stream_sizes
                            .iter()
                            .map(|s| (Workload::Stream, *s))
                            .filter(|_| cc != sc),
                    )
                    .collect();
                for (w, size) in sizes {
                    self.stop.check()?;
                    let server = self.spawn(&fleet, 0, 0, pl.server, "spin", Side::Server)?;
                    let report: ClientReport = self
                        .spawn(&fleet, 0, 0, pl.client, "spin", Side::Client(w, size))?
                        .result(self.timeout(1), &self.stop)?;
                    server.finish(&self.stop);
                    let o = &report.result;
                    let mut row = Row {
                        placement: pl.description.clone(),
                        cores: pl.cores(),
                        repeat: rep,
                        builder: Some(Builder::Cni.name().into()),
                        gbps: o.gbps,
                        msgs_per_s: o.msgs_per_s,
                        cpu_s_per_op: Some(o.cpu_s_per_op),
                        tps: (w == Workload::Rr).then_some(o.tps),
                        ..Row::new(Mode::Bridge, Tool::Dnperf, w, size)
                    };
                    if let (Some(ow), Some(half)) = (&o.one_way_ns, &o.half_rtt_ns) {
                        set_latency(&mut row, ow, half);
                    }
                    self.raw_done(row);
                }
            }
        }
        Ok(())
    }

    fn raw_done(&mut self, row: Row) {
        let what = match row.p50_us {
            Some(p) => format!("p50 {p:.3} us"),
            None => format!("{:.2} Gbps", row.gbps.unwrap_or(0.0)),
        };
        self.progress.done(&format!(
            "{} {} {} B ({}): {what}",
            row.mode, row.workload, row.size, row.cores
        ));
        self.rows.push(row);
    }
}

fn set_latency(row: &mut Row, ow: &Summary, half: &Summary) {
    let us = |ns: u64| Some(ns as f64 / 1e3);
    row.p50_us = us(ow.p50);
    row.p99_us = us(ow.p99);
    row.p999_us = us(ow.p999);
    row.mean_us = Some(ow.mean / 1e3);
    row.half_rtt_p50_us = us(half.p50);
}

/// A raw rr row from the client's outcome; `path_ok` when every reply came over the path
/// measured.
fn raw_rr_row(out: &RawOutcome, fc: bool, mut row: Row) -> Result<Row> {
    let RawOutcome::Rr {
        transactions,
        tps,
        one_way_ns,
        half_rtt_ns,
        rx_via,
        lost,
        cpu_s_per_op,
        ..
    } = out
    else {
        bail!("the rr peer printed another role's result");
    };
    set_latency(&mut row, one_way_ns, half_rtt_ns);
    let via = if fc { rx_via.fc } else { rx_via.daemon };
    row.tps = Some(*tps);
    row.cpu_s_per_op = Some(*cpu_s_per_op);
    row.lost = *lost;
    row.path_ok = *transactions > 0 && via == *transactions;
    Ok(row)
}

/// A raw stream row from the client's and the sink's outcomes.
fn raw_stream_row(client: &RawOutcome, server: &RawOutcome, fc: bool, mut row: Row) -> Result<Row> {
    let (
        RawOutcome::Stream {
            sent,
            tx_via,
            cpu_s_per_op,
            ..
        },
        RawOutcome::Sink {
            frames, gbps, mpps, ..
        },
    ) = (client, server)
    else {
        bail!("the stream peers printed other roles' results");
    };
    let via = if fc { tx_via.fc } else { tx_via.daemon };
    row.gbps = Some(*gbps);
    row.msgs_per_s = Some(mpps * 1e6);
    row.cpu_s_per_op = Some(*cpu_s_per_op);
    row.lost = sent.saturating_sub(*frames);
    row.path_ok = *sent > 0 && via == *sent;
    Ok(row)
}
