//! The link to the wire: frames from it into the pipes, and its waker thread.

use super::forward::deliver_bytes;
use super::local::Local;
use super::{MasterShared, BATCH, IDLE_TIMEOUT};
use crate::nic::Edge;
use crate::registry::{Counter, Snapshot};
use docknet_pipe::wake;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The waker thread of a master that drives a link: while the master sleeps (`link_armed`),
/// waits for the link's descriptors to become readable and rings `link_bell`. Ends on shutdown.
pub(super) fn waker(shared: Arc<MasterShared>, fds: Vec<OwnedFd>) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    while !shared.shutdown.load(Ordering::Acquire) {
        if shared.link_armed.load(Ordering::Acquire) == 0 {
            let _ = wake::wait_any(&[(&shared.link_armed, 0)], Some(IDLE_TIMEOUT));
            continue;
        }
        let mut pfds: Vec<PollFd> = fds
            .iter()
            .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN))
            .collect();
        match poll(&mut pfds, PollTimeout::from(250u16)) {
            Ok(n) if n > 0 => {
                if shared.link_armed.swap(0, Ordering::AcqRel) == 1 {
                    shared.link_bell.fetch_add(1, Ordering::Release);
                    wake::wake(&shared.link_bell);
                }
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::warn!("waiting on the link: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Up to [`BATCH`] frames from the link into the pipes. Returns (frames received, frames
/// delivered).
pub(super) fn link_round(
    edge: &mut Edge,
    snap: &Snapshot,
    local: &mut [Local],
    dirty: &mut Vec<usize>,
    now: Instant,
    now_ns: u64,
) -> (usize, u64) {
    let mut delivered = 0u64;
    let mtu_of = |d: usize| snap.pipes.get(d).map_or(0, |p| p.mtu);
    let n = edge.recv(
        BATCH,
        &snap.table,
        &mtu_of,
        &mut |d, bytes| {
            let (Some(p), Some(l)) = (snap.pipes.get(d), local.get_mut(d)) else {
                return false;
            };
            if bytes.len() > l.rx.layout().frame_size as usize {
                l.count(Counter::DropTooBig, 1);
                return true;
            }
            let ok = deliver_bytes(p, l, bytes, dirty, d, now_ns);
            if ok {
                l.count(Counter::WireRx, 1);
                delivered += 1;
            }
            ok
        },
        now,
    );
    for &d in dirty.iter() {
        local[d].rx.publish(&snap.pipes[d].region);
        local[d].rx_dirty = false;
    }
    dirty.clear();
    (n, delivered)
}
