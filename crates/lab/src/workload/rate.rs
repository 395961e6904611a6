//! The rate-limit experiment (the paper's Fig. 9) on one mode: a TCP flow on pair 0 and a UDP
//! flow on pair 1, limits set on the senders' egress while they run, and the receivers'
//! throughput sampled every 100 ms.
//!
//! - DockNet: `rate set` on the client pipes; the receivers' bytes from the daemon's `rx_bytes`
//!   counters.
//! - Kernel (`bridge`): the reference CNI `bandwidth` plugin chained onto the client's
//!   attachment, as a runtime would for Kubernetes' bandwidth annotations (a TBF on an ifb the
//!   container's egress is redirected to); a new limit is a DEL and an ADD of that plugin. The
//!   receivers' bytes from their namespace's IP counters (`/proc/PID/net/{snmp,netstat}`).
//!
//! Both count frames with their Ethernet headers, as both limiters do. CPU is the experiment's
//! processes' (and the kernel's softirq threads'), from each task's `schedstat`.

use super::SERVER_START;
use crate::mode::Mode;
use crate::plan::DaemonSetup;
use crate::proc::{in_ns, Proc, Stop};
use crate::progress::Progress;
use crate::rate::{self, BIN_S};
use crate::row::{Row, Tool, Workload};
use crate::topology::{DocknetLab, KernelLab};
use anyhow::{bail, Context, Result};
use docknet_daemon::proto::{Client, RateChange};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How the daemon and DockLib wait here: on futexes at once. Streams lose nothing by it
/// (measured: more goodput than spinning or yielding first, on two cores), and a flow held back
/// by its limit then costs no CPU while it waits, as a kernel socket would not.
pub const IDLE: &str = "block";

/// The TCP flow's write size.
const TCP_WRITE: usize = 16384;

/// A limit as the experiment states it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lim {
    /// No limit.
    Off,
    /// Bits per second.
    Bps(u64),
    /// A fraction of the mode's capacity (measured in the first step).
    Share(f64),
    /// Far above the capacity (10x): the limiter present but never binding.
    Present,
}

impl Lim {
    /// Parses `80%` or a rate (`10mbit`, `2gbit`, bits/s).
    pub fn parse(s: &str) -> Result<Lim> {
        if let Some(p) = s.trim().strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .with_context(|| format!("{s:?} is not a percentage"))?;
            if !(0.1..=100.0).contains(&v) {
                bail!("{s}: a share of the capacity must be 0.1% .. 100%");
            }
            return Ok(Lim::Share(v / 100.0));
        }
        let b = docknet_daemon::rate::parse_bits(s)?;
        if b < docknet_daemon::rate::MIN_RATE {
            bail!(
                "{s}: below the smallest rate ({} bit/s)",
                docknet_daemon::rate::MIN_RATE
            );
        }
        Ok(Lim::Bps(b))
    }

    /// How the phase of this limit is named.
    pub fn phase(self) -> String {
        match self {
            Lim::Off => "unlimited".into(),
            Lim::Bps(b) => human(b as f64),
            Lim::Share(f) => format!("{}%", (f * 100.0 * 10.0).round() / 10.0),
            Lim::Present => rate::PRESENT[0].into(),
        }
    }

    /// Bits/s, given the capacity in Gbps.
    pub fn bps(self, capacity_gbps: f64) -> Option<u64> {
        match self {
            Lim::Off => None,
            Lim::Bps(b) => Some(b),
            Lim::Share(f) => Some(((capacity_gbps * 1e9 * f) as u64).max(1_000_000)),
            Lim::Present => Some(((capacity_gbps * 1e10) as u64).clamp(1_000_000_000, 1 << 39)),
        }
    }
}

/// `10mbit`, `2.50gbit`.
pub fn human(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2}gbit", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.0}mbit", bps / 1e6)
    } else {
        format!("{:.0}kbit", bps / 1e3)
    }
}

/// What the experiment does, and when.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The step limits, after an unlimited step and one with the limiter present; an
    /// unlimited step ends the series.
    pub steps: Vec<Lim>,
    /// Seconds per step.
    pub step_s: f64,
    /// Contention: UDP starts, UDP stops, the TCP flow ends (seconds).
    pub udp_from: f64,
    /// See `udp_from`.
    pub udp_to: f64,
    /// See `udp_from`.
    pub end: f64,
    /// Contention: the UDP flow's limit.
    pub udp_limit: Lim,
    /// Contention, both limited: the TCP flow's limit.
    pub tcp_limit: Lim,
    /// Bucket size: this many milliseconds at the rate.
    pub burst_ms: f64,
    /// UDP datagram size.
    pub udp_size: usize,
}

/// The limiter of one mode and how to read its receivers.
#[derive(Debug)]
enum Net {
    Kernel(KernelLab),
    Docknet(DocknetLab, Client),
}

/// One mode's run of the experiment.
#[derive(Debug)]
pub struct RateRun<'a> {
    exe: &'a Path,
    dnperf: PathBuf,
    mode: Mode,
    net: Net,
    stop: &'a Stop,
    /// The bins.
    pub rows: Vec<Row>,
    /// The mode's capacity, Gbps (after the first step).
    pub capacity: f64,
    chained: [bool; 2],
    port: u16,
    /// Write size of each flow (the rows' `msg_size`).
    sizes: [usize; 2],
}

/// The live processes of one scenario.
#[derive(Debug, Default)]
struct Flows {
    servers: [Option<Proc>; 2],
    clients: [Option<Proc>; 2],
}

/// The value under `field` of the `group:` table in a /proc/net/{snmp,netstat} text (a line of
/// names, then a line of values).
fn proc_net_field(text: &str, group: &str, field: &str) -> Option<u64> {
    let mut rows = text.lines().filter(|l| l.starts_with(group));
    let (names, values) = (rows.next()?, rows.next()?);
    let i = names.split_whitespace().position(|n| n == field)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// Bytes received for this host in process `pid`'s network namespace, as frames with their
/// Ethernet headers: IP octets plus 14 bytes per IP packet (what reached the stack, not
/// whatever crossed the link).
fn ip_rx_l2(pid: u32) -> Option<u64> {
    let netstat = std::fs::read_to_string(format!("/proc/{pid}/net/netstat")).ok()?;
    let snmp = std::fs::read_to_string(format!("/proc/{pid}/net/snmp")).ok()?;
    let octets = proc_net_field(&netstat, "IpExt:", "InOctets")?;
    let packets = proc_net_field(&snmp, "Ip:", "InReceives")?;
    Some(octets + 14 * packets)
}

impl<'a> RateRun<'a> {
    /// Builds `mode` with two pairs.
    pub fn build(exe: &'a Path, mode: Mode, stop: &'a Stop) -> Result<RateRun<'a>> {
        let net = if mode.is_docknet() {
            let setup = DaemonSetup {
                idle: IDLE,
                master_core: None,
                master_core_b: None,
                master_nice: 0,
            };
            let lab = DocknetLab::build(exe, mode, &setup, 2, 1500)?;
            let c = lab.daemon.client()?;
            Net::Docknet(lab, c)
        } else {
            Net::Kernel(KernelLab::build(mode, 2, 1500)?)
        };
        Ok(RateRun {
            exe,
            dnperf: super::dnperf_path(exe)?,
            mode,
            net,
            stop,
            rows: Vec::new(),
            capacity: 0.0,
            chained: [false; 2],
            port: 23000,
            sizes: [TCP_WRITE, 1400],
        })
    }

    /// Sets pair `i`'s sender's egress limit (`None`: none).
    fn limit(&mut self, i: usize, bps: Option<u64>, burst_ms: f64) -> Result<()> {
        let burst = bps.map(|b| ((b as f64 * burst_ms / 1e3) as u64).max(12_000 * 8));
        match &mut self.net {
            Net::Docknet(_, c) => {
                let pipe = DocknetLab::client_pipe(i);
                match bps {
                    Some(b) => c.rate_set(
                        &pipe,
                        &RateChange {
                            egress_bps: Some(b),
                            egress_burst_bits: burst,
                            ..RateChange::default()
                        },
                    ),
                    None => c.rate_clear(&pipe),
                }
                .map_err(|e| anyhow::anyhow!("rate on {pipe}: {e}"))?;
            }
            Net::Kernel(lab) => {
                let ns = lab.pairs[i].client_ns.clone();
                if self.chained[i] {
                    lab.unchain(&ns)?;
                    self.chained[i] = false;
                }
                if let (Some(b), Some(burst)) = (bps, burst) {
                    lab.chain(&ns, &bandwidth_conf(b, burst))?;
                    self.chained[i] = true;
                }
            }
        }
        Ok(())
    }

    /// The receivers' byte counters (pairs 0 and 1).
    fn received(&mut self, f: &Flows) -> [Option<u64>; 2] {
        match &mut self.net {
            Net::Docknet(_, c) => [0, 1].map(|i| {
                c.pipe_show(&DocknetLab::server_pipe(i))
                    .ok()
                    .and_then(|p| p.counters?.get("rx_bytes").copied())
            }),
            Net::Kernel(_) => [0, 1].map(|i| f.servers[i].as_ref().and_then(|p| ip_rx_l2(p.pid()))),
        }
    }

    fn dnperf(
        &self,
        i: usize,
        port: u16,
        proto: &str,
        side: Result<(f64, usize), ()>,
    ) -> Result<Proc> {
        let mut args: Vec<String> = match side {
            Err(()) => vec!["server".into()],
            Ok(_) => vec!["client".into()],
        };
        let stack = if self.mode.is_docknet() {
            "docknet"
        } else {
            "kernel"
        };
        args.extend(["--stack", stack, "--proto", proto, "--idle", IDLE].map(String::from));
        let (bind, target) = match &self.net {
            Net::Docknet(..) => {
                let a = format!("{}:{port}", DocknetLab::server_ip(i));
                (a.clone(), a)
            }
            Net::Kernel(l) => {
                let p = &l.pairs[i];
                (
                    format!("{}:{}", p.bind, p.port),
                    format!("{}:{}", p.target, p.port),
                )
            }
        };
        match side {
            Err(()) => args.extend(["--bind".into(), bind, "--conns".into(), "1".into()]),
            Ok((secs, size)) => args.extend([
                "--connect".into(),
                target,
                "--workload".into(),
                "stream".into(),
                "--size".into(),
                size.to_string(),
                "--duration".into(),
                format!("{secs:.3}"),
                "--warmup".into(),
                "0".into(),
                "--json".into(),
            ]),
        }
        let what = format!(
            "dnperf {proto} {}",
            if side.is_ok() { "client" } else { "server" }
        );
        let cmd = match &self.net {
            Net::Docknet(lab, _) => {
                let pipe = if side.is_ok() {
                    DocknetLab::client_pipe(i)
                } else {
                    DocknetLab::server_pipe(i)
                };
                lab.run_in(self.exe, &pipe, None, &self.dnperf, args)
            }
            Net::Kernel(l) => {
                let p = &l.pairs[i];
                let ns = if side.is_ok() {
                    &p.client_ns
                } else {
                    &p.server_ns
                };
                in_ns(ns, &self.dnperf, args)
            }
        };
        Proc::spawn(cmd, &what)
    }

    /// Runs one scenario: `events` (time, what) in order over `end` seconds, sampling every
    /// bin; `flows` says which flows get bins.
    fn scenario(
        &mut self,
        name: &str,
        end: f64,
        events: &[(f64, Event)],
        flows: &[usize],
        burst_ms: f64,
        progress: &mut Progress,
    ) -> Result<()> {
        progress.start(&format!("{} {name}", self.mode));
        self.port += 1;
        let port = self.port;
        let mut live = Flows::default();
        for &i in flows {
            let proto = if i == 0 { "tcp" } else { "udp" };
            live.servers[i] = Some(self.dnperf(i, port, proto, Err(()))?);
        }
        std::thread::sleep(SERVER_START);
        let mut limits: [Option<u64>; 2] = [None, None];
        let first = if name == rate::STEPS {
            "unlimited"
        } else {
            "before"
        };
        let mut phase: [String; 2] = [first.into(), "off".into()];
        let mut next = 0;
        let mut started = false;
        let t0 = Instant::now();
        let mut meter = crate::proc::CpuMeter::default();
        meter.refresh(&self.roots(&live));
        let mut prev = (self.received(&live), meter.ns(), 0.0f64);
        let mut bin = 1u64;
        loop {
            let now = t0.elapsed().as_secs_f64();
            // one phase change per bin: a pass that fell behind (a slow control call on a
            // loaded host) takes the next change after a bin, so no phase goes without one
            let mut changed = false;
            while !changed && next < events.len() && events[next].0 <= now + 1e-6 {
                match &events[next].1 {
                    Event::Start(i, secs, size) => {
                        let proto = if *i == 0 { "tcp" } else { "udp" };
                        live.clients[*i] =
                            Some(self.dnperf(*i, port, proto, Ok((*secs, *size)))?);
                        if *i == 1 {
                            phase[0] = rate::UDP_ON.into();
                            phase[1] = rate::UDP_ON.into();
                            changed = true;
                        }
                    }
                    Event::Stop(i) => {
                        if *i == 1 {
                            phase[0] = "after".into();
                            phase[1] = "off".into();
                            changed = true;
                        }
                    }
                    Event::Limit(i, lim) => {
                        if matches!(lim, Lim::Share(_) | Lim::Present) && self.capacity <= 0.0 {
                            self.capacity = self.measured_capacity(name);
                        }
                        let bps = lim.bps(self.capacity);
                        self.limit(*i, bps, burst_ms)?;
                        limits[*i] = bps;
                        if name == rate::STEPS {
                            // the second unlimited and present phases are named apart
                            let again = usize::from(next > 2);
                            phase[*i] = match lim {
                                Lim::Off => rate::UNLIMITED[again].into(),
                                Lim::Present => rate::PRESENT[again].into(),
                                l => l.phase(),
                            };
                            changed = true;
                        }
                    }
                }
                next += 1;
            }
            if now >= end {
                break;
            }
            self.stop.check()?;
            let target = bin as f64 * BIN_S;
            let wait = target - t0.elapsed().as_secs_f64();
            if wait > 0.0 {
                std::thread::sleep(Duration::from_secs_f64(wait));
            }
            // the time after the counters: a reading delayed by the load is not one bin late
            let counters = self.received(&live);
            let got = (counters, meter.ns(), t0.elapsed().as_secs_f64());
            let dt = (got.2 - prev.2).max(1e-3);
            let cores = Some(got.1.saturating_sub(prev.1) as f64 / 1e9 / dt);
            for &i in flows {
                if phase[i] == "off" {
                    continue; // the UDP flow before it starts and after it stops
                }
                let bytes = match (prev.0[i], got.0[i]) {
                    (Some(a), Some(b)) => b.saturating_sub(a),
                    _ => 0,
                };
                self.rows.push(Row {
                    scenario: Some(name.into()),
                    phase: Some(phase[i].clone()),
                    flow: Some(if i == 0 { "tcp" } else { "udp" }.into()),
                    t_s: Some((prev.2 * 1e3).round() / 1e3),
                    gbps: Some(bytes as f64 * 8.0 / dt / 1e9),
                    limit_bps: limits[i].map(|b| b as f64),
                    cpu_cores: cores,
                    mtu: Some(1500),
                    builder: Some(
                        if self.mode.is_docknet() {
                            "docknet"
                        } else {
                            "cni"
                        }
                        .into(),
                    ),
                    ..Row::new(self.mode, Tool::Dnperf, Workload::Rate, self.sizes[i])
                });
            }
            // a reading that failed keeps the last good one
            for i in 0..2 {
                if got.0[i].is_some() {
                    prev.0[i] = got.0[i];
                }
            }
            // the processes change as flows start and end: find them again each second (the
            // next bin's baseline is read over the new set, so a bin compares like with like)
            let base = if bin.is_multiple_of(10) || std::mem::take(&mut started) {
                meter.refresh(&self.roots(&live));
                meter.ns()
            } else {
                got.1
            };
            prev = (prev.0, base, got.2);
            bin += 1;
        }
        for (i, l) in limits.iter().enumerate() {
            if l.is_some() {
                self.limit(i, None, burst_ms)?;
            }
        }
        let timeout = Duration::from_secs(30);
        for (i, c) in live.clients.iter_mut().enumerate() {
            if let Some(c) = c.take() {
                let _: Value = c
                    .result(timeout, self.stop)
                    .with_context(|| format!("{} {name}: flow {i}", self.mode))?;
            }
        }
        for s in live.servers.iter_mut() {
            if let Some(s) = s.take() {
                s.finish(self.stop);
            }
        }
        let udp = if flows.contains(&1) {
            format!(", UDP {:.2} Gbps", self.mean(name, "udp"))
        } else {
            String::new()
        };
        progress.done(&format!(
            "  {:<11} {name:<13} TCP {:.2} Gbps{udp} (means over the run)",
            self.mode.name(),
            self.mean(name, "tcp")
        ));
        Ok(())
    }

    /// The processes whose CPU counts: the daemon and every process this run started.
    fn roots(&self, f: &Flows) -> Vec<u32> {
        let mut r: Vec<u32> = f
            .servers
            .iter()
            .chain(f.clients.iter())
            .flatten()
            .map(Proc::pid)
            .collect();
        if let Net::Docknet(lab, _) = &self.net {
            r.extend(lab.daemon.pid());
        }
        r
    }

    /// Mean of a flow's bins in scenario `name`.
    fn mean(&self, name: &str, flow: &str) -> f64 {
        let v: Vec<f64> = self
            .rows
            .iter()
            .filter(|r| r.scenario.as_deref() == Some(name) && r.flow.as_deref() == Some(flow))
            .filter_map(|r| r.gbps)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    }

    /// The capacity from the unlimited bins of `name` so far (after settling).
    fn measured_capacity(&self, name: &str) -> f64 {
        let v: Vec<f64> = self
            .rows
            .iter()
            .filter(|r| r.scenario.as_deref() == Some(name) && r.flow.as_deref() == Some("tcp"))
            .filter(|r| r.limit_bps.is_none() && r.t_s.unwrap_or(0.0) >= rate::SETTLE_S)
            .filter_map(|r| r.gbps)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    }

    /// Runs every scenario of `s`.
    pub fn all(&mut self, s: &Schedule, progress: &mut Progress) -> Result<()> {
        self.sizes[1] = s.udp_size;
        // (a) one TCP flow through the steps
        let mut steps = vec![Lim::Off, Lim::Present];
        steps.extend(s.steps.iter().copied());
        steps.extend([Lim::Off, Lim::Present]);
        let total = s.step_s * steps.len() as f64;
        let mut events = vec![(0.0, Event::Start(0, total + 0.5, TCP_WRITE))];
        for (k, l) in steps.iter().enumerate() {
            events.push((k as f64 * s.step_s, Event::Limit(0, *l)));
        }
        self.scenario(rate::STEPS, total, &events, &[0], s.burst_ms, progress)?;
        // (b)-(d) TCP all along, UDP in the middle
        for (name, tcp, udp) in [
            (rate::NONE, Lim::Off, Lim::Off),
            (rate::UDP_LIMITED, Lim::Off, s.udp_limit),
            (rate::BOTH_LIMITED, s.tcp_limit, s.udp_limit),
        ] {
            let events = vec![
                (0.0, Event::Limit(0, tcp)),
                (0.0, Event::Limit(1, udp)),
                (0.0, Event::Start(0, s.end + 0.5, TCP_WRITE)),
                (
                    s.udp_from,
                    Event::Start(1, s.udp_to - s.udp_from, s.udp_size),
                ),
                (s.udp_to, Event::Stop(1)),
            ];
            self.scenario(name, s.end, &events, &[0, 1], s.burst_ms, progress)?;
        }
        Ok(())
    }
}

/// Something the experiment does at a time.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    /// Starts pair `i`'s client for so many seconds with writes of so many bytes.
    Start(usize, f64, usize),
    /// Pair `i`'s client stops (it was started for that long).
    Stop(usize),
    /// Sets pair `i`'s sender's limit.
    Limit(usize, Lim),
}

/// The CNI `bandwidth` plugin limiting a container's egress to `bps` with a bucket of `burst`
/// bits, as `runtimeConfig` carries it from a runtime.
pub fn bandwidth_conf(bps: u64, burst: u64) -> Value {
    json!({"type": "bandwidth", "capabilities": {"bandwidth": true},
        "runtimeConfig": {"bandwidth": {"egressRate": bps, "egressBurst": burst}}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_as_shares_or_rates_and_name_their_phase() {
        assert_eq!(Lim::parse("80%").unwrap(), Lim::Share(0.8));
        assert_eq!(Lim::parse("10mbit").unwrap(), Lim::Bps(10_000_000));
        assert!(Lim::parse("0%").is_err() && Lim::parse("fast").is_err());
        assert!(Lim::parse("10bit").is_err(), "below the smallest rate");
        assert_eq!(Lim::Share(0.6).phase(), "60%");
        assert_eq!(Lim::Bps(10_000_000).phase(), "10mbit");
        assert_eq!(Lim::Share(0.5).bps(10.0), Some(5_000_000_000));
        assert_eq!(Lim::Present.bps(10.0), Some(100_000_000_000));
        assert_eq!(Lim::Off.bps(10.0), None);
    }

    #[test]
    fn ip_counters_are_read_by_name() {
        let snmp = "Ip: Forwarding DefaultTTL InReceives\nIp: 1 64 1000\nIcmp: InMsgs\nIcmp: 3\n";
        assert_eq!(proc_net_field(snmp, "Ip:", "InReceives"), Some(1000));
        assert_eq!(proc_net_field(snmp, "Ip:", "Nope"), None);
        assert_eq!(proc_net_field(snmp, "Tcp:", "InReceives"), None);
        // the lab's own namespace has them
        assert!(ip_rx_l2(std::process::id()).is_some());
    }
}
