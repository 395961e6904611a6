//! N pairs at once: first all ping-pong (per-pair latency from the N clients' merged
//! histograms, and the machine's CPU per transaction), then all stream (aggregate goodput);
//! memory per pair from MemAvailable.

use super::dnperf::Side;
use super::{Fleet, Runner, SERVER_START};
use crate::cpustat::CpuTimes;
use crate::plan::{ModeRun, Placement, Point};
use crate::row::{Row, Tool, Workload};
use anyhow::{Context, Result};
use docknet_perf::report::ClientReport;
use docknet_perf::stats::{buckets, histogram, merge_buckets, now_ns, Summary};
use std::time::Duration;

/// MemAvailable from /proc/meminfo, KiB.
pub fn mem_available_kib() -> Option<f64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The fall in MemAvailable since `before` (KiB), per `n`; never negative.
pub fn fall_per(before: Option<f64>, n: usize) -> Option<f64> {
    Some(((before? - mem_available_kib()?) / n as f64).max(0.0))
}

/// What the whole machine spent while the N pairs ping-ponged: busy jiffies of every core over
/// the middle of the measured window, and that window's length.
#[derive(Debug, Clone, Copy)]
pub struct MachineCpu {
    /// CPU time by kind over the window.
    pub times: CpuTimes,
    /// The window, seconds.
    pub seconds: f64,
}

/// The pairs row from the N clients' reports of both phases, and the machine's CPU during the
/// ping-pong (`cpu_s_per_op`: every process's and the kernel's busy time per transaction;
/// without it, the clients' own CPU per transaction).
pub fn pairs_row(
    rr: &[ClientReport],
    st: &[ClientReport],
    n: usize,
    cpu: Option<MachineCpu>,
) -> Row {
    let mut h = histogram();
    for r in rr {
        merge_buckets(&mut h, r.result.one_way_hist.as_deref().unwrap_or(&[]));
    }
    let s = Summary::of(&h);
    let lat = |ns: f64| (!h.is_empty()).then_some(ns / 1e3);
    let sum = |f: fn(&ClientReport) -> Option<f64>, rs: &[ClientReport]| {
        rs.iter().filter_map(f).sum::<f64>()
    };
    let tps = sum(|r| Some(r.result.tps), rr);
    let clients_cpu = sum(|r| Some(r.result.cpu_s_per_op), rr) / rr.len().max(1) as f64;
    let machine = cpu.filter(|c| c.seconds > 0.0 && tps > 0.0);
    Row {
        pairs: Some(n),
        p50_us: lat(s.p50 as f64),
        p99_us: lat(s.p99 as f64),
        p999_us: lat(s.p999 as f64),
        mean_us: lat(s.mean),
        tps: Some(tps),
        gbps: Some(sum(|r| r.result.gbps, st)),
        msgs_per_s: Some(sum(|r| r.result.msgs_per_s, st)),
        cpu_s_per_op: Some(machine.map_or(clients_cpu, |c| {
            CpuTimes::seconds(c.times.busy()) / (tps * c.seconds)
        })),
        cpu_cores: machine.map(|c| CpuTimes::seconds(c.times.busy()) / c.seconds),
        // the service demand of the ping-pong phase (the stream phase's is set beside it)
        cpu_s_per_kreq: machine
            .and_then(|c| crate::cpustat::demand(&c.times, tps * c.seconds / 1000.0)),
        one_way_hist: Some(buckets(&h)),
        pair_fairness: fairness(rr),
        slowest_pair: slowest(rr),
        ..Row::new(crate::mode::Mode::Bridge, Tool::Dnperf, Workload::Pairs, 0)
    }
}

/// Jain's index of the clients' transactions per second (see [`Row::pair_fairness`]).
fn fairness(rr: &[ClientReport]) -> Option<f64> {
    let x: Vec<f64> = rr.iter().map(|r| r.result.tps).collect();
    let (sum, sq) = (x.iter().sum::<f64>(), x.iter().map(|v| v * v).sum::<f64>());
    (sq > 0.0).then(|| sum * sum / (x.len() as f64 * sq))
}

/// The slowest client's transactions per second over the mean client's.
fn slowest(rr: &[ClientReport]) -> Option<f64> {
    let x: Vec<f64> = rr.iter().map(|r| r.result.tps).collect();
    let mean = x.iter().sum::<f64>() / x.len().max(1) as f64;
    (mean > 0.0).then(|| x.iter().copied().fold(f64::INFINITY, f64::min) / mean)
}

impl Runner {
    /// One point of a pairs sweep: N pairs rr together, then stream together.
    pub(super) fn pairs(
        &mut self,
        run: &ModeRun,
        fleet: &Fleet,
        p: &Point,
        n: usize,
        pl: &Placement,
        topo_kib: f64,
    ) -> Result<()> {
        self.progress
            .start(&format!("{} {n} pairs {} B", run.mode, p.size));
        let (rr, _, cpu) = self.fleet_run(fleet, n, Workload::Rr, p.size, pl)?;
        let (st, mem, st_cpu) = self.fleet_run(fleet, n, Workload::Stream, p.size, pl)?;
        let row = Row {
            mode: run.mode,
            size: p.size,
            repeat: p.repeat,
            placement: pl.description.clone(),
            cores: pl.cores(),
            mtu: Some(fleet.mtu()),
            mem_kib_per_pair: mem.map(|m| m + topo_kib),
            builder: Some(fleet.builder().name().into()),
            idle: run.mode.is_docknet().then(|| pl.idle.to_string()),
            ..pairs_row(&rr, &st, n, cpu)
        };
        let row = Row {
            cpu_s_per_gb: st_cpu.and_then(|c| {
                let gbps: f64 = st.iter().filter_map(|r| r.result.gbps).sum();
                crate::cpustat::demand(&c.times, gbps / 8.0 * c.seconds)
            }),
            ..row
        };
        self.push(row);
        Ok(())
    }

    /// Runs `w` on the first `n` pairs at once; the clients' reports, the memory per pair
    /// (the fall in MemAvailable, sampled mid-run, over n) and the machine's CPU over the
    /// middle 80% of the measured window.
    fn fleet_run(
        &mut self,
        fleet: &Fleet,
        n: usize,
        w: Workload,
        size: usize,
        pl: &Placement,
    ) -> Result<(Vec<ClientReport>, Option<f64>, Option<MachineCpu>)> {
        let idle = pl.idle;
        let mem0 = mem_available_kib();
        let port = match fleet {
            Fleet::Docknet(_) => self.next_port(),
            Fleet::Kernel(_) => 0,
        };
        let spawning = std::time::Instant::now();
        let mut servers = Vec::with_capacity(n);
        for i in 0..n {
            servers.push(self.spawn(fleet, i, port, pl.pair_core(i), idle, Side::Server)?);
        }
        if let Fleet::Docknet(l) = fleet {
            l.wait_servers(n, Duration::from_secs(60))?;
        }
        std::thread::sleep(SERVER_START + Duration::from_millis(5 * n as u64));
        // clients start one after another (a container each) and then begin together: give
        // them as long as the servers took, and half as long again
        let lead = spawning.elapsed().mul_f64(1.5) + Duration::from_millis(300);
        let begin = std::time::Instant::now() + lead;
        let timing = self.timing;
        self.timing.start_at = Some(now_ns() + lead.as_nanos() as u64);
        let mut clients = Vec::with_capacity(n);
        for i in 0..n {
            let side = Side::Client(w, size);
            let c = self.spawn(fleet, i, port, pl.pair_core(i), idle, side);
            match c {
                Ok(c) => clients.push(c),
                Err(e) => {
                    self.timing = timing;
                    return Err(e);
                }
            }
        }
        self.timing = timing;
        let d = self.timing.duration;
        let measuring = begin + Duration::from_secs_f64(self.timing.warmup + d * 0.1);
        std::thread::sleep(measuring.saturating_duration_since(std::time::Instant::now()));
        let t0 = (CpuTimes::now(), std::time::Instant::now());
        std::thread::sleep(Duration::from_secs_f64(d * 0.4));
        let mem = fall_per(mem0, n);
        std::thread::sleep(Duration::from_secs_f64(d * 0.4));
        let cpu = match (t0.0, CpuTimes::now()) {
            (Some(a), Some(b)) => Some(MachineCpu {
                times: b.since(&a),
                seconds: t0.1.elapsed().as_secs_f64(),
            }),
            _ => None,
        };
        let mut out: Vec<ClientReport> = Vec::with_capacity(n);
        for (i, c) in clients.into_iter().enumerate() {
            out.push(
                c.result(self.timeout(n), &self.stop)
                    .with_context(|| format!("pair {i} of {n}"))?,
            );
        }
        for s in servers {
            s.finish(&self.stop);
        }
        let late = out
            .iter()
            .filter_map(|r| r.result.late_ms)
            .fold(0.0f64, f64::max);
        if late > self.timing.warmup * 1e3 / 2.0 {
            self.progress.line(&format!(
                "  warning: {n} pairs: a client began {late:.0} ms after the others (the \
                 windows overlap less)"
            ));
        }
        Ok((out, mem, cpu))
    }
}
