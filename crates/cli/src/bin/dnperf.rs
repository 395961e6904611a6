//! dnperf: the measuring program. One code path, two stacks:
//!
//!   dnperf server --stack kernel|docknet --bind IP:PORT
//!   dnperf client --stack kernel|docknet --connect IP:PORT --workload rr|stream --size BYTES
//!                 --duration SECS [--warmup SECS] --json
//!
//! `--stack docknet` attaches to the container's DockPipe (/run/docknet/pipe or $DOCKNET_PIPE):
//! run it under `docknet run --pipe NAME -- dnperf ...`.

#![deny(unsafe_code)]

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use docknet_lib::{Endpoint, Stack, StackConfig};
use docknet_perf::net::{DockNet, KernelNet, Net};
use docknet_perf::report::{ClientReport, ProbeReport, Proto, RunEnv, ServerReport};
use docknet_perf::stats::{now_ns, pin};
use docknet_perf::workload::{self, Pace, Workload};
use docknet_pipe::IdlePolicy;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// dnperf: measures TCP/UDP request/response latency and streaming goodput, with one code path
/// over kernel sockets and over DockLib (DockNet's userspace stack).
#[derive(Debug, Parser)]
#[command(
    name = "dnperf",
    version,
    about = "Measures TCP/UDP request/response latency and streaming goodput, with one code path over kernel sockets and over DockLib (DockNet's userspace stack)",
    after_help = EXAMPLES
)]
struct Cli {
    /// Enter this network namespace first (a file such as /run/netns/NAME): what
    /// `ip netns exec` does for the network, without a second program starting.
    #[arg(long, global = true)]
    netns: Option<std::path::PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StackKind {
    /// std sockets over the kernel's network stack.
    Kernel,
    /// DockLib (smoltcp over the container's DockPipe).
    Docknet,
}

#[derive(Debug, clap::Args)]
struct Common {
    /// Which network stack to measure.
    #[arg(long, value_enum)]
    stack: StackKind,
    /// Transport protocol.
    #[arg(long, value_enum, default_value = "tcp")]
    proto: Proto,
    /// Pin to this core.
    #[arg(long)]
    cpu: Option<usize>,
    /// DockNet: what a waiting call does: adaptive (yield the core up to 1 ms, then sleep; the
    /// default of every DockNet program), adaptive:SPIN_US or adaptive:SPIN_US:YIELD_US (spin first), spin (the
    /// paper's busy polling: fastest with a core of one's own, slowest sharing one), block.
    #[arg(long, default_value = "adaptive", value_parser = IdlePolicy::parse)]
    idle: IdlePolicy,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve measurement connections.
    Server {
        #[command(flatten)]
        c: Common,
        /// Address to listen on.
        #[arg(long)]
        bind: SocketAddr,
        /// Exit after this many connections (TCP) or sessions (UDP) (0: serve forever).
        #[arg(long, default_value_t = 0)]
        conns: usize,
    },
    /// Measure against a server.
    Client {
        #[command(flatten)]
        c: Common,
        /// Server address.
        #[arg(long)]
        connect: SocketAddr,
        /// rr (ping-pong), stream, or check (a stream of --bytes whose every byte the server
        /// verifies; exits 1 if any arrives wrong or missing).
        #[arg(long, value_enum)]
        workload: Workload,
        /// check: bytes to send.
        #[arg(long, default_value_t = 100_000_000)]
        bytes: u64,
        /// Message size in bytes.
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Measured seconds.
        #[arg(long, default_value_t = 3.0)]
        duration: f64,
        /// Seconds before measuring (excluded).
        #[arg(long, default_value_t = 0.5)]
        warmup: f64,
        /// rr: milliseconds to pause between transactions (0: none). With a pause, every
        /// message finds the path idle: its latency is the wake-up latency.
        #[arg(long, default_value_t = 0.0)]
        interval: f64,
        /// Begin (warm-up first) at this CLOCK_MONOTONIC time in nanoseconds, after
        /// connecting (the clock every namespace shares): clients started one after another
        /// then measure together. The result says how late the client was (`late_ms`).
        #[arg(long, value_name = "NS")]
        start_at: Option<u64>,
        /// Print the result as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// A pod's first exchange (ADD to first packet): waits for a line on stdin, then attaches
    /// to the container's DockPipe and completes a TCP handshake with --connect; prints the
    /// CLOCK_MONOTONIC times of the line, the attachment and the handshake as one JSON line.
    Probe {
        /// Server address.
        #[arg(long)]
        connect: SocketAddr,
        /// Pin to this core.
        #[arg(long)]
        cpu: Option<usize>,
        /// What a waiting call does (adaptive, adaptive:SPIN_US or adaptive:SPIN_US:YIELD_US, spin, block).
        #[arg(long, default_value = "adaptive", value_parser = IdlePolicy::parse)]
        idle: IdlePolicy,
    },
    /// Start-up time: reaches a server the moment it answers. Fresh TCP connects to
    /// --connect (each refused or unanswered within --retry-us tried again) and, with --ping,
    /// ICMP echo requests, side by side; prints the CLOCK_MONOTONIC times of the first
    /// answered connect and echo as one JSON line.
    Reach {
        #[command(flatten)]
        c: Common,
        /// Server address.
        #[arg(long)]
        connect: std::net::SocketAddrV4,
        /// Ping this address too.
        #[arg(long)]
        ping: Option<std::net::Ipv4Addr>,
        /// A try unanswered for this many microseconds is tried again.
        #[arg(long, default_value_t = 1000)]
        retry_us: u64,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
    },
}

const EXAMPLES: &str = "Examples:
  dnperf server --stack kernel --bind 10.0.0.2:5000
  dnperf client --stack kernel --connect 10.0.0.2:5000 --workload rr --size 64 --duration 2 --json
  docknet run --pipe db  -- dnperf server --stack docknet --bind 10.0.0.3:5000
  docknet run --pipe web -- dnperf client --stack docknet --connect 10.0.0.3:5000 --workload stream
  echo go | docknet run --pipe web -- dnperf probe --connect 10.0.0.3:5000
  dnperf reach --stack kernel --connect 10.0.0.3:5000 --ping 10.0.0.3

--stack docknet attaches to the container's DockPipe (/run/docknet/pipe or $DOCKNET_PIPE), so
run it under `docknet run --pipe NAME`. With --json a client prints one JSON line: the
environment, the workload and the result (one-way latency percentiles and histogram, RTT/2,
transactions/s, goodput at the receiver, CPU seconds per operation).";

fn env(c: &Common, mtu: Option<u32>) -> RunEnv {
    let stack = match c.stack {
        StackKind::Kernel => "kernel",
        StackKind::Docknet => "docknet",
    };
    RunEnv::here(stack, &c.idle.to_string(), c.cpu, mtu)
}

/// The local address the kernel would use to reach `dst` (a connected UDP socket sends nothing).
fn local_ip_towards(dst: SocketAddr) -> std::net::IpAddr {
    let any = if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    std::net::UdpSocket::bind(any)
        .and_then(|s| {
            s.connect(dst)?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
}

fn docknet(c: &Common) -> Result<DockNet> {
    let ep = Endpoint::attach_default(c.idle)?;
    let mtu = ep.mtu();
    let cfg = StackConfig {
        idle: c.idle,
        ..StackConfig::default()
    };
    Ok(DockNet {
        stack: Stack::new(ep, cfg),
        mtu,
    })
}

fn run_server<N: Net>(net: N, proto: Proto, bind: SocketAddr, conns: usize) -> Result<()> {
    let n = match proto {
        Proto::Tcp => workload::serve(&net, bind, conns)?,
        Proto::Udp => workload::serve_udp(&net, bind, conns)?,
    };
    let report = ServerReport {
        role: "server".into(),
        stack: net.name().into(),
        handled: n,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_client<N: Net>(
    net: N,
    c: &Common,
    addr: SocketAddr,
    wl: Workload,
    size: usize,
    pace: Pace,
    bytes: u64,
    as_json: bool,
) -> Result<()> {
    let (d, w) = (pace.duration, pace.warmup);
    let (duration, warmup) = (d.as_secs_f64(), w.as_secs_f64());
    let out = match (c.proto, wl) {
        (Proto::Tcp, Workload::Check) => workload::checked(&net, addr, size, bytes)?,
        (Proto::Udp, Workload::Check) => anyhow::bail!("the checked stream runs over TCP"),
        (Proto::Tcp, _) => workload::client(&net, addr, wl, size, pace)?,
        (Proto::Udp, _) => workload::client_udp(&net, addr, wl, size, d, w)?,
    };
    let mtu = net
        .mtu()
        .or_else(|| docknet_perf::net::kernel_mtu(local_ip_towards(addr)));
    let corrupt = out.corrupt_bytes.unwrap_or(0);
    if as_json {
        let report = ClientReport {
            env: env(c, mtu),
            workload: wl,
            proto: c.proto,
            size,
            duration_s: duration,
            warmup_s: warmup,
            result: out,
        };
        println!("{}", serde_json::to_string(&report)?);
    } else if let Some(ow) = out.one_way_ns {
        println!(
            "{} rr {size} B: one-way p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us; {:.0} transactions/s; {:.2} us CPU per transaction",
            net.name(),
            ow.p50 as f64 / 1e3,
            ow.p99 as f64 / 1e3,
            ow.p999 as f64 / 1e3,
            out.tps,
            out.cpu_s_per_op * 1e6
        );
    } else {
        println!(
            "{} stream {size} B: {:.2} Gbps, {:.0} messages/s at the receiver",
            net.name(),
            out.gbps.unwrap_or(0.0),
            out.msgs_per_s.unwrap_or(0.0)
        );
    }
    if corrupt > 0 {
        anyhow::bail!("checked stream: {corrupt} bytes arrived wrong or not at all");
    }
    Ok(())
}

/// `dnperf probe`: the times are taken around the calls a pod's program makes first.
fn run_probe(connect: SocketAddr, idle: IdlePolicy) -> Result<()> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("waiting for the go line on stdin")?;
    let go_ns = now_ns();
    let ep = Endpoint::attach_default(idle)?;
    let attached_ns = now_ns();
    let stack = Stack::new(
        ep,
        StackConfig {
            idle,
            ..StackConfig::default()
        },
    );
    let conn = docknet_lib::TcpStream::connect(&stack, connect)
        .with_context(|| format!("connecting to {connect}"))?;
    let connected_ns = now_ns();
    drop(conn);
    let r = ProbeReport {
        go_ns,
        attached_ns,
        connected_ns,
    };
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

fn main_inner(cli: Cli) -> Result<()> {
    if let Some(ns) = &cli.netns {
        let f = std::fs::File::open(ns)
            .with_context(|| format!("--netns: opening {}", ns.display()))?;
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("--netns: entering {}", ns.display()))?;
    }
    let cpu = match &cli.cmd {
        Cmd::Server { c, .. } | Cmd::Client { c, .. } => c.cpu,
        Cmd::Probe { cpu, .. } => *cpu,
        Cmd::Reach { c, .. } => c.cpu,
    };
    if let Some(core) = cpu {
        pin(core).with_context(|| format!("pinning to core {core}"))?;
    }
    match &cli.cmd {
        Cmd::Server { c, bind, conns } => match c.stack {
            StackKind::Kernel => run_server(KernelNet, c.proto, *bind, *conns),
            StackKind::Docknet => run_server(docknet(c)?, c.proto, *bind, *conns),
        },
        Cmd::Client {
            c,
            connect,
            workload,
            size,
            duration,
            warmup,
            interval,
            start_at,
            bytes,
            json,
        } => {
            let pace = Pace {
                duration: Duration::from_secs_f64(*duration),
                warmup: Duration::from_secs_f64(*warmup),
                interval: Duration::from_secs_f64(interval.max(0.0) / 1000.0),
                start_at: *start_at,
            };
            match c.stack {
                StackKind::Kernel => run_client(
                    KernelNet, c, *connect, *workload, *size, pace, *bytes, *json,
                ),
                StackKind::Docknet => run_client(
                    docknet(c)?,
                    c,
                    *connect,
                    *workload,
                    *size,
                    pace,
                    *bytes,
                    *json,
                ),
            }
        }
        Cmd::Probe { connect, idle, .. } => run_probe(*connect, *idle),
        Cmd::Reach {
            c,
            connect,
            ping,
            retry_us,
            timeout,
        } => {
            let r = docknet_perf::reach::Reach {
                connect: *connect,
                ping: *ping,
                retry: Duration::from_micros((*retry_us).max(50)),
                timeout: Duration::from_secs_f64(timeout.clamp(0.01, 600.0)),
            };
            let report = match c.stack {
                StackKind::Kernel => docknet_perf::reach::kernel(r)?,
                StackKind::Docknet => docknet_perf::reach::docknet(&docknet(c)?.stack, r)?,
            };
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match main_inner(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dnperf: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
