//! `docknet bench nat`: the one-way latency the NAT load balancer adds (the paper measured
//! about 1.05 us). dnperf rr with 64-byte messages from a client container to a server
//! container, directly over a fast channel and through `docknet-natlb` (client -> fast channel
//! -> balancer -> fast channel -> server), alternated round by round in one run; the added
//! latency is through minus direct, from the merged histograms of every round.
//!
//! Placement: a 2-core machine cannot give client, balancer and server a core each. The
//! balancer spins alone on core 1 (it is meant to own a core, like the paper's); client and
//! server share core 0 and yield between empty polls (`adaptive:0`), in both paths alike.

use crate::mode::Mode;
use crate::plan::DaemonSetup;
use crate::proc::{Proc, Stop};
use crate::progress::Progress;
use crate::row::{Row, Tool, Workload};
use crate::topology::daemon::Daemon;
use crate::workload::dnperf_path;
use crate::workload::http::beside;
use anyhow::{Context, Result};
use docknet_perf::report::ClientReport;
use docknet_perf::stats::{buckets, histogram, merge_buckets, Summary};
use std::path::Path;
use std::time::Duration;

/// Options of `docknet bench nat`.
#[derive(Debug, Clone, clap::Args)]
pub struct NatArgs {
    /// Rounds; each measures the direct path, then the path through the balancer.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Measured seconds per path and round.
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Warm-up seconds per run (excluded).
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Write tcp-nat.json and tcp-nat.md into this directory and (re)build its HTML report.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

const SERVER: &str = "10.79.0.2";
const VIP: &str = "10.79.0.10";
const CLIENT: &str = "10.79.0.3";
const PORT: u16 = 5000;
const VPORT: u16 = 6000;

/// The placement in words.
pub const PLACEMENT: &str = "balancer spins alone on core 1; client and server share core 0 and \
    yield between empty polls (adaptive:0); every hop a fast channel";

fn rr_client(
    d: &Daemon,
    exe: &Path,
    dnperf: &Path,
    target: &str,
    a: &NatArgs,
    stop: &Stop,
) -> Result<ClientReport> {
    let mut c = d.cmd(exe);
    c.args(["run", "--pipe", "c", "--cpu", "0", "--"])
        .arg(dnperf)
        .args([
            "client",
            "--stack",
            "docknet",
            "--idle",
            "adaptive:0",
            "--connect",
            target,
            "--workload",
            "rr",
            "--size",
            "64",
            "--duration",
            &a.duration.to_string(),
            "--warmup",
            &a.warmup.to_string(),
            "--json",
        ]);
    Proc::spawn(c, "dnperf client")?
        .result(Duration::from_secs_f64(a.duration + a.warmup + 30.0), stop)
}

/// Measures both paths; the rows (direct, then through the balancer with the added latency).
pub fn measure(a: &NatArgs, stop: &Stop, progress: &mut Progress) -> Result<Vec<Row>> {
    let exe = std::env::current_exe()?;
    let dnperf = dnperf_path(&exe)?;
    let natlb = beside(&exe, "docknet-natlb")?;
    let d = Daemon::start(&exe, &DaemonSetup::unpinned("adaptive"))?;
    let mut c = d.client()?;
    for (p, ip) in [("lb", VIP), ("s", SERVER), ("c", CLIENT)] {
        c.pipe_create(p, &format!("{ip}/24"), None, None)
            .with_context(|| format!("creating pipe {p}"))?;
    }
    for (x, y) in [("lb", "s"), ("c", "lb"), ("c", "s")] {
        c.fc_connect(x, y, None)
            .with_context(|| format!("connecting {x} and {y}"))?;
    }
    let spawn = |pipe: &str, core: &str, prog: &Path, args: &[String]| {
        let mut cmd = d.cmd(&exe);
        cmd.args(["run", "--pipe", pipe, "--cpu", core, "--"])
            .arg(prog)
            .args(args)
            .stderr(std::process::Stdio::null());
        Proc::spawn(cmd, &format!("{} in pipe {pipe}", prog.display()))
    };
    let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let _server = spawn(
        "s",
        "0",
        &dnperf,
        &strs(&[
            "server",
            "--stack",
            "docknet",
            "--idle",
            "adaptive:0",
            "--conns",
            "0",
            "--bind",
            &format!("{SERVER}:{PORT}"),
        ]),
    )?;
    let _lb = spawn(
        "lb",
        "1",
        &natlb,
        &strs(&[
            "--backend",
            &format!("{SERVER}:{PORT}"),
            "--port",
            &format!("{VPORT}:{PORT}"),
            "--idle",
            "spin",
        ]),
    )?;
    // both attached before the first client
    let t = std::time::Instant::now();
    loop {
        let ls = c.pipe_ls()?;
        if ["s", "lb"]
            .iter()
            .all(|p| ls.iter().any(|x| x.name == *p && x.socket.is_some()))
        {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(20),
            "server or balancer did not attach"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (mut direct, mut through) = (histogram(), histogram());
    let mut rounds = Vec::new();
    for r in 0..a.rounds {
        stop.check()?;
        progress.start(&format!("nat round {} direct", r + 1));
        let dr = rr_client(&d, &exe, &dnperf, &format!("{SERVER}:{PORT}"), a, stop)?;
        progress.done(&format!(
            "  round {}: direct p50 {:.2} us",
            r + 1,
            dr.result
                .one_way_ns
                .as_ref()
                .map_or(0.0, |s| s.p50 as f64 / 1e3)
        ));
        progress.start(&format!("nat round {} through the balancer", r + 1));
        let tr = rr_client(&d, &exe, &dnperf, &format!("{VIP}:{VPORT}"), a, stop)?;
        progress.done(&format!(
            "  round {}: through the balancer p50 {:.2} us",
            r + 1,
            tr.result
                .one_way_ns
                .as_ref()
                .map_or(0.0, |s| s.p50 as f64 / 1e3)
        ));
        merge_buckets(&mut direct, tr_hist(&dr));
        merge_buckets(&mut through, tr_hist(&tr));
        rounds.push((dr, tr));
    }
    let (sd, st) = (Summary::of(&direct), Summary::of(&through));
    let us = |ns: u64| ns as f64 / 1e3;
    let base = |h: &Vec<[u64; 2]>, s: &Summary| Row {
        p50_us: Some(us(s.p50)),
        p99_us: Some(us(s.p99)),
        p999_us: Some(us(s.p999)),
        mean_us: Some(s.mean / 1e3),
        one_way_hist: Some(h.clone()),
        placement: PLACEMENT.into(),
        cores: "c0 s0 lb1".into(),
        mtu: Some(1500),
        repeat: a.rounds,
        builder: Some("docknet".into()),
        ..Row::new(Mode::DocknetFc, Tool::Dnperf, Workload::Nat, 64)
    };
    // the client's CPU per transaction, averaged over the rounds
    let cpu = |f: fn(&(ClientReport, ClientReport)) -> f64| {
        Some(rounds.iter().map(f).sum::<f64>() / rounds.len().max(1) as f64)
    };
    let d_row = Row {
        server: Some("direct".into()),
        cpu_s_per_op: cpu(|r| r.0.result.cpu_s_per_op),
        ..base(&buckets(&direct), &sd)
    };
    let t_row = Row {
        server: Some("docknet-natlb".into()),
        direct_p50_us: Some(us(sd.p50)),
        added_p50_us: Some(us(st.p50) - us(sd.p50)),
        added_p99_us: Some(us(st.p99) - us(sd.p99)),
        cpu_s_per_op: cpu(|r| r.1.result.cpu_s_per_op),
        ..base(&buckets(&through), &st)
    };
    Ok(vec![d_row, t_row])
}

fn tr_hist(r: &ClientReport) -> &[[u64; 2]] {
    r.result.one_way_hist.as_deref().unwrap_or(&[])
}
