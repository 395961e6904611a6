//! The accept thread: one thread waits (poll) on every socket the daemon bound in a
//! container's network namespace, accepts container processes there and hands them their pipe
//! ([`crate::registry::Registry::add_conn`]). A container that connects faster than [`RATE`] times a second has
//! its socket left out of the wait for a while (doubling up to 5 s): it can only slow down its
//! own attachments.

use crate::control::Ctx;
use docknet_pipe::fdpass;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections a second a pipe's socket takes before it is muted.
pub const RATE: u32 = 20;

/// Wakes the accept thread so it sees a changed set of sockets.
#[derive(Debug)]
pub struct Waker(OwnedFd);

impl Waker {
    /// Says the set changed.
    pub fn wake(&self) {
        let _ = nix::unistd::write(&self.0, &[1]);
    }
}

/// Per-socket bookkeeping of the connection rate.
#[derive(Debug, Default)]
struct Rate {
    window: Option<Instant>,
    count: u32,
    pause: Duration,
    muted_until: Option<Instant>,
}

/// Starts the accept thread; returns its waker.
pub fn start(ctx: Arc<Ctx>) -> std::io::Result<Waker> {
    let (rx, tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
    std::thread::Builder::new()
        .name("docknet-attach".into())
        .spawn(move || run(&ctx, rx))?;
    Ok(Waker(tx))
}

fn run(ctx: &Arc<Ctx>, wake: OwnedFd) {
    let mut rates: HashMap<String, Rate> = HashMap::new();
    loop {
        let now = Instant::now();
        let all = match ctx.registry.lock() {
            Ok(r) => r.attachments(),
            Err(_) => return,
        };
        rates.retain(|n, _| all.iter().any(|(m, _)| m == n));
        let live: Vec<(String, Arc<OwnedFd>)> = all
            .into_iter()
            .filter(|(n, _)| {
                rates
                    .get(n)
                    .and_then(|r| r.muted_until)
                    .is_none_or(|t| t <= now)
            })
            .collect();
        let mut fds = vec![PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
        fds.extend(
            live.iter()
                .map(|(_, l)| PollFd::new(l.as_fd(), PollFlags::POLLIN)),
        );
        // muted sockets come back within a second at the latest
        match poll(&mut fds, PollTimeout::from(1000u16)) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!("accept thread: poll: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        if ready[0] {
            let mut b = [0u8; 64];
            while matches!(nix::unistd::read(&wake, &mut b), Ok(n) if n > 0) {}
            if ctx.registry.lock().is_err() {
                return;
            }
        }
        for ((name, l), _) in live.iter().zip(&ready[1..]).filter(|(_, r)| **r) {
            let conn = match fdpass::accept(l.as_fd()) {
                Ok(c) => c,
                Err(_) => continue,
            };
            if let Ok(mut reg) = ctx.registry.lock() {
                if !reg.is_attached(name, l) {
                    continue;
                }
                if let Err(e) = reg.add_conn(name, conn) {
                    tracing::debug!(pipe = %name, "connection refused: {e}");
                }
            }
            let r = rates.entry(name.clone()).or_default();
            let now = Instant::now();
            if r.window
                .is_none_or(|w| now.duration_since(w) > Duration::from_secs(1))
            {
                (r.window, r.count) = (Some(now), 0);
            }
            r.count += 1;
            if r.count > RATE {
                r.pause = (r.pause * 2).clamp(Duration::from_millis(10), Duration::from_secs(5));
                r.muted_until = Some(now + r.pause);
            } else if r.count == 1 && r.muted_until.is_some_and(|t| t <= now) {
                r.pause = Duration::ZERO;
                r.muted_until = None;
            }
        }
    }
}
