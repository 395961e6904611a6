//! docknet-load: a wrk-like HTTP load generator over kernel sockets or DockLib sockets.
//!
//!   docknet-load -c 64 -d 10s http://10.0.0.2:80/
//!   docknet run --pipe client -- docknet-load --stack docknet -c 64 -d 10s http://10.0.0.2/

use anyhow::{bail, Context, Result};
use clap::Parser;
use docknet_http::client::{run, LoadOptions, LoadReport};
use docknet_http::io::{DockIo, KernelIo, StackKind};
use std::net::SocketAddrV4;
use std::process::ExitCode;
use std::time::Duration;

/// A wrk-like HTTP/1.1 load generator (keep-alive GET requests) over kernel sockets or DockNet.
#[derive(Debug, Parser)]
#[command(
    name = "docknet-load",
    version,
    after_help = "Closed loop by default: every connection sends its next request (or keeps \
--pipeline requests outstanding) as soon as an answer arrives. With --rate R the requests are \
due at R per second in all, and latency counts from when a request was due, not when it was \
sent (the coordinated-omission correction of wrk2). Latency percentiles come from an HDR \
histogram; errors are counted by kind (connect, read, write, timeout, parse, status, closed).\n\n\
Examples:\n  docknet-load -c 64 -t 2 -d 10s http://10.0.0.2:8080/\n  docknet-load --rate 20000 \
-c 32 -d 10s --json http://10.0.0.2:8080/bytes/1024\n  docknet run --pipe client -- \
docknet-load --stack docknet -c 64 -d 5s http://10.0.0.2/"
)]
struct Cli {
    /// The URL: `http://A.B.C.D[:PORT]/PATH` (an IPv4 address: no name resolution).
    url: String,
    /// Which network stack to load from.
    #[arg(long, value_enum, default_value = "kernel")]
    stack: StackKind,
    /// Connections in all.
    #[arg(short = 'c', long, default_value_t = 10)]
    connections: usize,
    /// Threads (each runs its share of the connections).
    #[arg(short = 't', long, default_value_t = 1)]
    threads: usize,
    /// Measured time (10s, 500ms, or seconds).
    #[arg(short = 'd', long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Time before measuring, not counted.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// Requests per second in all (open loop, latency from when each request was due).
    #[arg(long)]
    rate: Option<f64>,
    /// Requests outstanding per connection (closed loop; HTTP pipelining).
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    /// An answer not complete after this long is a `timeout` error.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    timeout: Duration,
    /// Send exactly this many requests in all and stop when they are answered (no warm-up).
    #[arg(long)]
    requests: Option<u64>,
    /// DockNet: what a waiting loop does (spin, adaptive, adaptive:SPIN_US, adaptive:SPIN_US:YIELD_US, block).
    #[arg(long, default_value = "adaptive")]
    idle: String,
    /// Pin to this core.
    #[arg(long)]
    cpu: Option<usize>,
    /// Print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = n
        .parse()
        .map_err(|_| format!("{s:?}: expected a duration like 10s, 500ms or 2"))?;
    let secs = match unit {
        "s" => n,
        "ms" => n / 1e3,
        "us" => n / 1e6,
        "m" => n * 60.0,
        _ => return Err(format!("{s:?}: unit must be s, ms, us or m")),
    };
    if !(0.0..=86_400.0).contains(&secs) {
        return Err(format!("{s:?}: out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Splits `http://A.B.C.D[:PORT]/PATH`.
fn parse_url(url: &str) -> Result<(SocketAddrV4, String)> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("{url:?}: only http:// URLs are supported");
    };
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    let addr = if host.contains(':') {
        host.parse::<SocketAddrV4>()
    } else {
        format!("{host}:80").parse()
    }
    .with_context(|| format!("{host:?}: expected an IPv4 address with an optional port"))?;
    Ok((addr, path.to_string()))
}

fn print(r: &LoadReport) {
    println!(
        "docknet-load ({}) {}: {} threads, {} connections{}, {:.1} s",
        r.stack,
        r.url,
        r.threads,
        r.connections,
        r.rate
            .map_or(String::new(), |x| format!(", {x:.0} req/s due")),
        r.duration_s
    );
    println!(
        "  requests/s {:.1}   transfer/s {:.2} MB   answers {} ({} ok)",
        r.req_per_s,
        r.transfer_bytes_per_s / 1e6,
        r.requests,
        r.ok
    );
    println!(
        "  latency (us)  p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}  mean {:.1}",
        r.p50_us, r.p90_us, r.p99_us, r.p999_us, r.max_us, r.mean_us
    );
    if r.errors.is_empty() {
        println!("  errors: none; reconnects {}", r.reconnects);
    } else {
        let e: Vec<String> = r.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("  errors: {}; reconnects {}", e.join(", "), r.reconnects);
    }
}

fn main_inner(cli: Cli) -> Result<()> {
    let (addr, path) = parse_url(&cli.url)?;
    if let Some(c) = cli.cpu {
        docknet_perf::stats::pin(c)?;
    }
    let o = LoadOptions {
        addr,
        path,
        connections: cli.connections,
        threads: cli.threads,
        duration: cli.duration,
        warmup: cli.warmup,
        rate: cli.rate,
        pipeline: cli.pipeline,
        timeout: cli.timeout,
        requests: cli.requests,
    };
    let r = match cli.stack {
        StackKind::Kernel => run(&KernelIo, &o)?,
        StackKind::Docknet => run(&DockIo::attach(&cli.idle)?, &o)?,
    };
    if cli.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print(&r);
    }
    Ok(())
}

fn main() -> ExitCode {
    match main_inner(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("docknet-load: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
