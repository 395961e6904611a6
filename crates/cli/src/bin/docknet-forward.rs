//! docknet-forward: an HTTP/1.1 forwarder, the "ping" service of Kratzke's chain (siege ->
//! ping -> pong). Each client connection gets a thread and a keep-alive connection of its own to
//! the upstream server; every request is passed on as it came and the upstream's answer
//! (headers and a Content-Length body) back, over kernel sockets or DockLib sockets.
//!
//!   docknet-forward --stack kernel --bind 10.0.0.2:8080 --to 10.0.0.3:8080
//!   docknet run --pipe ping -- docknet-forward --stack docknet --bind 10.0.0.2:80 --to 10.0.0.3:80
//!
//! SIGTERM or SIGINT stops it; it then prints the requests it forwarded as one JSON line.

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use docknet_lib::{Stack, StackConfig};
use docknet_pipe::IdlePolicy;
use std::io::{Read, Write};
use std::net::SocketAddrV4;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StackKind {
    /// The kernel's TCP/IP (std sockets).
    Kernel,
    /// DockLib over the container's DockPipe (run it under `docknet run --pipe NAME`).
    Docknet,
}

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
    /// DockNet: what a waiting call does (spin, adaptive, adaptive:SPIN_US, block).
    #[arg(long, default_value = "adaptive")]
    idle: String,
}

/// Largest request or response head accepted.
const MAX_HEAD: usize = 64 * 1024;

/// Reads one HTTP head (up to and with the blank line) into `buf`, keeping bytes after it in
/// `rest`; `None` at a clean end of stream.
fn read_head(s: &mut impl Read, rest: &mut Vec<u8>) -> Result<Option<Vec<u8>>> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(i) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
            let tail = rest.split_off(i + 4);
            return Ok(Some(std::mem::replace(rest, tail)));
        }
        if rest.len() > MAX_HEAD {
            bail!("a head longer than {MAX_HEAD} bytes");
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            if rest.is_empty() {
                return Ok(None);
            }
            bail!("the stream ended inside a head");
        }
        rest.extend_from_slice(&chunk[..n]);
    }
}

/// The Content-Length of a head (0 without one).
fn content_length(head: &[u8]) -> Result<u64> {
    let text = std::str::from_utf8(head).context("a head that is not text")?;
    for line in text.split("\r\n").skip(1) {
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                return v.trim().parse().context("a bad Content-Length");
            }
            if k.trim().eq_ignore_ascii_case("transfer-encoding") {
                bail!("chunked bodies are not forwarded");
            }
        }
    }
    Ok(0)
}

/// Copies exactly `n` bytes from `from` (what `rest` holds first) to `to`.
fn copy_body(from: &mut impl Read, rest: &mut Vec<u8>, to: &mut impl Write, n: u64) -> Result<()> {
    let mut left = n;
    let take = (rest.len() as u64).min(left) as usize;
    to.write_all(&rest[..take])?;
    rest.drain(..take);
    left -= take as u64;
    let mut buf = vec![0u8; 64 * 1024];
    while left > 0 {
        let want = (buf.len() as u64).min(left) as usize;
        let k = from.read(&mut buf[..want])?;
        if k == 0 {
            bail!("the stream ended inside a body");
        }
        to.write_all(&buf[..k])?;
        left -= k as u64;
    }
    Ok(())
}

/// Serves one client connection with its own upstream connection.
fn relay<C: Read + Write, U: Read + Write>(mut c: C, mut u: U, done: &AtomicU64) -> Result<()> {
    let (mut crest, mut urest) = (Vec::new(), Vec::new());
    while let Some(req) = read_head(&mut c, &mut crest)? {
        let body = content_length(&req)?;
        u.write_all(&req)?;
        copy_body(&mut c, &mut crest, &mut u, body)?;
        u.flush()?;
        let head = read_head(&mut u, &mut urest)?.context("the upstream closed")?;
        let n = if req.starts_with(b"HEAD ") {
            0
        } else {
            content_length(&head)?
        };
        c.write_all(&head)?;
        copy_body(&mut u, &mut urest, &mut c, n)?;
        c.flush()?;
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

fn main_inner(cli: Cli) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let done = Arc::new(AtomicU64::new(0));
    let to = cli.to;
    match cli.stack {
        StackKind::Kernel => {
            let l = std::net::TcpListener::bind(cli.bind)
                .with_context(|| format!("listening on {}", cli.bind))?;
            l.set_nonblocking(true)?;
            eprintln!("docknet-forward: {} -> {to} (kernel)", cli.bind);
            while !stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((c, _)) => {
                        c.set_nonblocking(false)?;
                        let _ = c.set_nodelay(true);
                        let done = done.clone();
                        std::thread::spawn(move || {
                            let u = std::net::TcpStream::connect(to)?;
                            let _ = u.set_nodelay(true);
                            relay(c, u, &done)
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        StackKind::Docknet => {
            let idle = IdlePolicy::parse(&cli.idle).map_err(|e| anyhow::anyhow!("--idle: {e}"))?;
            let stack = Stack::attach_default(StackConfig {
                idle,
                ..StackConfig::default()
            })?;
            let l = docknet_lib::TcpListener::bind(&stack, cli.bind.port())
                .with_context(|| format!("listening on {}", cli.bind))?;
            eprintln!("docknet-forward: {} -> {to} (docknet)", cli.bind);
            while !stop.load(Ordering::Relaxed) {
                match l.accept_timeout(Some(Duration::from_millis(100))) {
                    Ok((c, _)) => {
                        c.set_nodelay(true);
                        let (done, stack) = (done.clone(), stack.clone());
                        std::thread::spawn(move || {
                            let u = docknet_lib::TcpStream::connect(&stack, to)?;
                            u.set_nodelay(true);
                            relay(c, u, &done)
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    println!("{{\"forwarded\": {}}}", done.load(Ordering::Relaxed));
    Ok(())
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
