//! docknet-forward: an HTTP/1.1 forwarder, the "ping" service of Kratzke's chain (siege ->
//! ping -> pong). Each client connection gets a keep-alive connection of its own to the upstream
//! server; requests are passed on as they came and the upstream's answers back. One thread and
//! one event loop (`docknet_http::forward`) over kernel sockets or DockLib sockets.
//!
//!   docknet-forward --stack kernel --bind 10.0.0.2:8080 --to 10.0.0.3:8080
//!   docknet run --pipe ping -- docknet-forward --stack docknet --bind 10.0.0.2:80 --to 10.0.0.3:80
//!
//! SIGTERM or SIGINT stops it; it then prints what it counted as one JSON line.

use anyhow::{Context, Result};
use clap::Parser;
use docknet_http::forward::forward;
use docknet_http::io::{DockIo, Io, KernelIo, StackKind};
use std::net::SocketAddrV4;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// An HTTP/1.1 forwarder (Kratzke's "ping" service) over kernel sockets or DockNet.
#[derive(Debug, Parser)]
#[command(name = "docknet-forward", version)]
struct Cli {
    /// Which network stack to use (both sides).
    #[arg(long, value_enum, default_value = "kernel")]
    stack: StackKind,
    /// Address to listen on.
    #[arg(long)]
    bind: SocketAddrV4,
    /// The upstream server every request goes to.
    #[arg(long)]
    to: SocketAddrV4,
    /// DockNet: what a waiting call does (spin, adaptive, adaptive:SPIN_US, adaptive:SPIN_US:YIELD_US, block).
    #[arg(long, default_value = "adaptive")]
    idle: String,
}

fn run<I: Io>(io: I, cli: &Cli, stop: &AtomicBool) -> Result<()> {
    let l = io
        .listen(cli.bind)
        .with_context(|| format!("listening on {}", cli.bind))?;
    eprintln!(
        "docknet-forward: {} -> {} ({})",
        cli.bind,
        cli.to,
        io.name()
    );
    let stats = forward(&io, l, cli.to, Duration::from_millis(100), stop)?;
    println!("{}", serde_json::to_string(&stats)?);
    Ok(())
}

fn main_inner(cli: Cli) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    match cli.stack {
        StackKind::Kernel => run(KernelIo, &cli, &stop),
        StackKind::Docknet => run(DockIo::attach(&cli.idle)?, &cli, &stop),
    }
}

fn main() -> ExitCode {
    match main_inner(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("docknet-forward: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
