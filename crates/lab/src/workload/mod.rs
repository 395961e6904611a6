//! Running a plan: each [`ModeRun`] builds its topology, runs its points in order and turns
//! what the measuring programs print (typed) into [`Row`]s.
//!
//! - [`dnperf`]: dnperf's arguments, and its typed result turned into a row;
//! - [`pairs`]: N pairs at once;
//! - [`crosscheck`]: sockperf and iperf3 beside dnperf, with pure parsers of their output;
//! - [`raw`]: the raw-frame bench (`docknet raw bench`);
//! - [`rate`]: the rate-limit experiment (`docknet bench rate`).

pub mod chain;
pub mod cluster;
pub mod cpuquota;
pub mod crosscheck;
pub mod dnperf;
pub mod http;
pub mod idle;
pub mod nat;
pub mod pairs;
pub mod rate;
pub mod raw;
pub mod service;
pub mod startup;

use crate::mode::{Builder, Topology};
use crate::plan::{Measure, ModeRun, Placement, Point};
use crate::proc::{in_ns, Proc, Stop};
use crate::progress::Progress;
use crate::row::{NotAvailable, Row, Workload};
use crate::topology::wire::Shape;
use crate::topology::{DocknetLab, KernelLab};
use anyhow::{bail, Context, Result};
use dnperf::Side;
use docknet_perf::report::ClientReport;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Time given to a DockNet server to attach (and drain stale frames) before its client starts.
pub const SERVER_START: Duration = Duration::from_millis(200);

/// Measured and warm-up seconds of every point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Measured seconds.
    pub duration: f64,
    /// Warm-up seconds (excluded).
    pub warmup: f64,
    /// Clients begin at this CLOCK_MONOTONIC time (ns) after connecting (pairs: all clients
    /// measure together however long starting them took).
    pub start_at: Option<u64>,
}

/// The pairs of a topology, however it was built.
#[derive(Debug)]
pub enum Fleet<'a> {
    /// Kernel namespaces.
    Kernel(&'a KernelLab),
    /// Pipes on a daemon.
    Docknet(&'a DocknetLab),
}

impl Fleet<'_> {
    /// MTU of the links or pipes.
    pub fn mtu(&self) -> u32 {
        match self {
            Fleet::Kernel(l) => l.mtu,
            Fleet::Docknet(l) => l.mtu,
        }
    }

    /// Who built it.
    pub fn builder(&self) -> Builder {
        match self {
            Fleet::Kernel(l) => l.builder(),
            Fleet::Docknet(_) => Builder::Docknet,
        }
    }
}

/// Executes plans; collects rows and what was skipped.
#[derive(Debug)]
pub struct Runner {
    /// The `docknet` binary (runs daemons and containers).
    pub exe: PathBuf,
    /// The `dnperf` binary next to it.
    pub dnperf: PathBuf,
    /// The workload of the run.
    pub workload: Workload,
    /// Seconds per point.
    pub timing: Timing,
    /// Ctrl-C.
    pub stop: Stop,
    /// Progress over the plan.
    pub progress: Progress,
    /// Every measured run of every point.
    pub rows: Vec<Row>,
    /// Modes and tools without figures, and why.
    pub skipped: Vec<NotAvailable>,
    /// One host or two.
    pub topology: Topology,
    /// Two hosts: the wire's shaping.
    pub shape: Shape,
    /// Two hosts: the wire's MTU in the run being measured (every row carries it, whatever the
    /// containers' own links have, e.g. under VXLAN).
    wire_mtu: Option<u32>,
    port: u16,
    /// Measure over IPv6: DockNet's pipes get IPv6 addresses, loopback and container use
    /// `::1`, veth and bridge get IPv6 addresses (the modes [`ipv6_unsupported`] lets through).
    pub ipv6: bool,
}

/// Why `mode` cannot be measured over IPv6 on `topology`, or `None` when it can.
pub fn ipv6_unsupported(mode: crate::mode::Mode, topology: Topology) -> Option<&'static str> {
    use crate::mode::Mode::*;
    if topology == Topology::TwoHost {
        return Some(
            "the daemon's wire (AF_XDP, AF_PACKET) and the lab's two-host networks are IPv4 only",
        );
    }
    match mode {
        Loopback | Container | Veth | Bridge | Docknet | DocknetFc | DocknetAuto => None,
        DocknetPreload | DocknetFcPreload => {
            Some("the preload library serves AF_INET sockets only")
        }
        Sriov => Some("never built"),
        BridgeNat => Some("the lab maps ports (portmap) for IPv4 only"),
        _ => Some("the lab gives this kernel network IPv4 addresses only"),
    }
}

/// dnperf next to `exe`.
pub fn dnperf_path(exe: &Path) -> Result<PathBuf> {
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

impl Runner {
    /// A runner for `workload` using the binaries next to `exe`.
    pub fn new(
        exe: PathBuf,
        workload: Workload,
        timing: Timing,
        stop: Stop,
        total: usize,
    ) -> Result<Runner> {
        Ok(Runner {
            dnperf: dnperf_path(&exe)?,
            exe,
            workload,
            timing,
            stop,
            progress: Progress::new(total as u64),
            rows: Vec::new(),
            skipped: Vec::new(),
            topology: Topology::OneHost,
            shape: Shape::default(),
            wire_mtu: None,
            port: 21000,
            ipv6: false,
        })
    }

    /// How long a point with `n` pairs may take.
    fn timeout(&self, n: usize) -> Duration {
        Duration::from_secs_f64(self.timing.duration + self.timing.warmup + 30.0 + n as f64 * 0.2)
    }

    /// A fresh port for DockNet servers (their pipes outlive one point; kernel pairs reuse
    /// their own port).
    fn next_port(&mut self) -> u16 {
        self.port += 1;
        self.port
    }

    /// Builds the topology of `run` and runs its points.
    pub fn run_mode(&mut self, run: &ModeRun) -> Result<()> {
        // the topology's own memory counts only for pairs
        let mem0 = (self.workload == Workload::Pairs)
            .then(pairs::mem_available_kib)
            .flatten();
        let two = self.topology == Topology::TwoHost;
        self.wire_mtu = two.then_some(run.mtu);
        if let Some(setup) = &run.daemon {
            let lab = if two {
                DocknetLab::build_two_host(
                    &self.exe,
                    run.mode,
                    setup,
                    run.pairs,
                    run.mtu,
                    &self.shape,
                )?
            } else {
                DocknetLab::build_with(&self.exe, run.mode, setup, run.pairs, run.mtu, self.ipv6)?
            };
            let topo_kib = pairs::fall_per(mem0, run.pairs).unwrap_or(0.0);
            self.points(run, &Fleet::Docknet(&lab), topo_kib)
        } else {
            let lab = if two {
                KernelLab::build_two_host(run.mode, run.pairs, run.mtu, &self.shape)
            } else {
                KernelLab::build_with(run.mode, run.pairs, run.mtu, self.ipv6)
            }
            .with_context(|| format!("building the {} topology", run.mode))?;
            let topo_kib = pairs::fall_per(mem0, run.pairs).unwrap_or(0.0);
            self.points(run, &Fleet::Kernel(&lab), topo_kib)
        }
    }

    /// Runs the points of `run` on its topology; `topo_kib` is the topology's own memory per
    /// pair (pairs).
    fn points(&mut self, run: &ModeRun, fleet: &Fleet, topo_kib: f64) -> Result<()> {
        for p in &run.points {
            self.stop.check()?;
            match &p.measure {
                Measure::Dnperf(pl) => self.single(run, fleet, p, pl)?,
                Measure::Crosscheck(tool, pl) => self.crosscheck(run, fleet, p, *tool, pl)?,
                Measure::Pairs(n, pl) => self.pairs(run, fleet, p, *n, pl, topo_kib)?,
            }
        }
        Ok(())
    }

    /// A dnperf process of pair `i`: its server, or its client.
    fn spawn(
        &self,
        fleet: &Fleet,
        i: usize,
        port: u16,
        core: Option<usize>,
        idle: &str,
        side: Side,
    ) -> Result<Proc> {
        let what = side.what();
        match fleet {
            Fleet::Kernel(l) => {
                let p = &l.pairs[i];
                let (ns, ip) = match side {
                    Side::Server => (&p.server_ns, p.bind.as_str()),
                    Side::Client(..) => (&p.client_ns, p.target.as_str()),
                };
                // over IPv6 only the modes with an IPv6 address run (ipv6_unsupported)
                let addr = match (self.ipv6, &p.target6) {
                    (true, Some(a)) => format!("[{a}]:{}", p.port),
                    (true, None) => bail!("{ip} has no IPv6 address in this lab"),
                    (false, _) => format!("{ip}:{}", p.port),
                };
                let args = dnperf::args("kernel", &addr, core, idle, side, self.timing);
                Proc::spawn(in_ns(ns, &self.dnperf, args), what)
            }
            Fleet::Docknet(l) => {
                let addr = if self.ipv6 {
                    format!("[{}]:{port}", DocknetLab::server_ip6(i))
                } else {
                    format!("{}:{port}", DocknetLab::server_ip(i))
                };
                let pipe = match side {
                    Side::Server => DocknetLab::server_pipe(i),
                    Side::Client(..) => DocknetLab::client_pipe(i),
                };
                // the preload modes: dnperf's kernel sockets, on DockLib by the preload library
                let stack = if l.mode.is_preload() {
                    "kernel"
                } else {
                    "docknet"
                };
                let args = dnperf::args(stack, &addr, core, idle, side, self.timing);
                let mut c = l.run_in(&self.exe, &pipe, core, &self.dnperf, args);
                if !idle.is_empty() {
                    c.env("DOCKNET_IDLE", idle);
                }
                Proc::spawn(c, what)
            }
        }
    }

    /// One dnperf measurement on pair 0: its server, then its client; the client's report.
    fn measure(&mut self, fleet: &Fleet, pl: &Placement, size: usize) -> Result<ClientReport> {
        let port = match fleet {
            Fleet::Docknet(_) => self.next_port(),
            Fleet::Kernel(_) => 0,
        };
        let server = self.spawn(fleet, 0, port, pl.server, pl.idle, Side::Server)?;
        if let Fleet::Docknet(_) = fleet {
            std::thread::sleep(SERVER_START);
        }
        let side = Side::Client(self.workload, size);
        let report = self
            .spawn(fleet, 0, port, pl.client, pl.idle, side)?
            .result(self.timeout(1), &self.stop)?;
        server.finish(&self.stop);
        Ok(report)
    }

    /// A single-pair dnperf point.
    fn single(&mut self, run: &ModeRun, fleet: &Fleet, p: &Point, pl: &Placement) -> Result<()> {
        self.progress
            .start(&format!("{} {} {} B", run.mode, pl.cores(), p.size));
        // the cross-core handoff cost of the moment, before anything of the point runs
        let xcore = crate::xcore::handoff_us(0, 1);
        // the machine's CPU over the middle 80% of the measured window (the client starts
        // after the server, DockNet's after SERVER_START, and warms up first)
        let lead = match fleet {
            Fleet::Docknet(_) => SERVER_START.as_secs_f64(),
            Fleet::Kernel(_) => 0.0,
        } + 0.05;
        let cpu = crate::workload::http::sample_cpu(
            Duration::from_secs_f64(lead + self.timing.warmup + self.timing.duration * 0.1),
            Duration::from_secs_f64(self.timing.duration * 0.8),
        );
        let report = self.measure(fleet, pl, p.size)?;
        let mut row = dnperf::row(&report, run.mode, self.workload, p, fleet.builder());
        row.xcore_us = xcore;
        if let Ok(Some((d, secs))) = cpu.join() {
            let r = &report.result;
            match self.workload {
                Workload::Rr => {
                    row.cpu_s_per_kreq = crate::cpustat::demand(&d, r.tps * secs / 1000.0)
                }
                Workload::Stream => {
                    row.cpu_s_per_gb =
                        crate::cpustat::demand(&d, r.gbps.unwrap_or(0.0) / 8.0 * secs)
                }
                _ => {}
            }
        }
        if let Fleet::Docknet(l) = fleet {
            row.mtu = Some(l.mtu);
        }
        self.push(row);
        Ok(())
    }

    /// Records a row and says so on the progress.
    pub fn push(&mut self, mut row: Row) {
        row.topology = self.topology;
        if let Some(m) = self.wire_mtu {
            row.mtu = Some(m);
        }
        let what = match (row.pairs, row.p50_us, row.gbps) {
            (Some(n), p, g) => format!(
                "{n} pairs: {:.2} Gbps total, p50 {:.2} us, {:.0} KiB/pair, fairness {:.3} \
                 (slowest pair {:.2} of the mean)",
                g.unwrap_or(0.0),
                p.unwrap_or(0.0),
                row.mem_kib_per_pair.unwrap_or(0.0),
                row.pair_fairness.unwrap_or(0.0),
                row.slowest_pair.unwrap_or(0.0)
            ),
            (None, Some(p), _) => format!("p50 {p:.2} us"),
            (None, None, g) => format!("{:.2} Gbps", g.unwrap_or(0.0)),
        };
        let what = what + &crate::xcore::label(row.xcore_us);
        self.progress.done(&format!(
            "  {:<11} {:<8} {:<8} {} {:>6} B mtu {}: {what}",
            row.mode.name(),
            row.cores,
            row.tool.name(),
            row.workload,
            row.size,
            row.mtu.map_or("-".into(), |m| m.to_string())
        ));
        self.rows.push(row);
    }
}
