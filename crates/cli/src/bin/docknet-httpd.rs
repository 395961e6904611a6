//! docknet-httpd: an HTTP/1.1 server (keep-alive, pipelining, content compiled in,
//! `/bytes/N`, `/work/US`) in one event loop, over kernel sockets or DockLib sockets.
//!
//!   docknet-httpd --stack kernel --bind 10.0.0.2:80
//!   docknet run --pipe web -- docknet-httpd --stack docknet --bind 10.0.0.2:80
//!
//! SIGTERM or SIGINT stops it; it then prints what it served as one JSON line.

use anyhow::{Context, Result};
use clap::Parser;
use docknet_http::io::{DockIo, Io, KernelIo, StackKind};
use docknet_http::server::{serve, ServeOptions, ServerStats};
use std::net::SocketAddrV4;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// An HTTP/1.1 server over kernel sockets or DockNet.
#[derive(Debug, Parser)]
#[command(
    name = "docknet-httpd",
    version,
    after_help = "Content: / and /index.html, /hello.txt (compiled in); /bytes/N (N bytes, up \
to 1 GiB); /work/US (US microseconds of CPU, up to 1 s, then `ok`). HTTP/1.1 keep-alive and \
pipelining; GET and HEAD. SIGTERM or SIGINT stops the server, which then prints its counts \
as one JSON line (connections, answers by status class, bytes written).\n\nExamples:\n  \
docknet-httpd --stack kernel --bind 0.0.0.0:8080\n  docknet run --pipe web -- docknet-httpd \
--stack docknet --bind 10.0.0.2:80"
)]
struct Cli {
    /// Which network stack to serve on.
    #[arg(long, value_enum, default_value = "kernel")]
    stack: StackKind,
    /// Address to listen on (DockNet: the pipe's address, or 0.0.0.0).
    #[arg(long, default_value = "0.0.0.0:8080")]
    bind: SocketAddrV4,
    /// DockNet: what a waiting loop does (spin, adaptive, adaptive:SPIN_US, adaptive:SPIN_US:YIELD_US, block).
    #[arg(long, default_value = "adaptive")]
    idle: String,
    /// Pin to this core.
    #[arg(long)]
    cpu: Option<usize>,
    /// Connections at most (beyond, new ones are closed at once).
    #[arg(long, default_value_t = 10_000)]
    max_conns: usize,
}

fn run<I: Io>(io: I, cli: &Cli, stop: &AtomicBool) -> Result<ServerStats> {
    let l = io
        .listen(cli.bind)
        .with_context(|| format!("listening on {}", cli.bind))?;
    eprintln!("docknet-httpd: serving http://{} ({})", cli.bind, io.name());
    let opts = ServeOptions {
        max_conns: cli.max_conns,
        ..ServeOptions::default()
    };
    Ok(serve(&io, l, opts, stop)?)
}

fn main_inner(cli: Cli) -> Result<()> {
    if let Some(c) = cli.cpu {
        docknet_perf::stats::pin(c)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let stats = match cli.stack {
        StackKind::Kernel => run(KernelIo, &cli, &stop)?,
        StackKind::Docknet => run(DockIo::attach(&cli.idle)?, &cli, &stop)?,
    };
    println!("{}", serde_json::to_string(&stats)?);
    Ok(())
}

fn main() -> ExitCode {
    match main_inner(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("docknet-httpd: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
