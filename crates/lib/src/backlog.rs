//! A listener's backlog over smoltcp, which has none: a pool of sockets per listening port,
//! topped up before every poll, and the rules that keep half-open connections from holding it
//! (a per-source share, the oldest given up for a new SYN, a deadline).

use crate::device::SynRoom;
use crate::stack::{smol, Inner};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use smoltcp::wire::IpAddress;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// A listener's sockets: smoltcp has no backlog, so a listener owns a pool of sockets on its
/// port. Before every poll the pool gets `spare` sockets in `Listen` again (as long as fewer
/// than `backlog` connections wait to be accepted), and a SYN that finds none free waits in the
/// device for that refill instead of being answered with a reset.
#[derive(Debug)]
pub(crate) struct Listening {
    pub(crate) port: u16,
    /// Sockets listening, connecting or connected and not yet accepted, oldest first.
    pub(crate) pool: Vec<SocketHandle>,
    /// Connections that may wait to be accepted.
    pub(crate) backlog: usize,
    /// When each half-open socket of the pool was first seen so.
    pub(crate) half_open_since: std::collections::HashMap<SocketHandle, Instant>,
    /// Connections accepted so far.
    pub(crate) accepted: u64,
}

/// How long a half-open connection (its SYN answered, the handshake not completed) may hold
/// one of a listener's sockets by default: then it is dropped, as a kernel gives up after its SYN-ACK
/// retries. A pool full when a new SYN comes drops its oldest half-open connection sooner, so
/// SYNs that are never completed (a flood from a partner) cannot shut a listener to others.
pub const HALF_OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// How old a half-open connection must be before a new SYN may take its place: as long as
/// a SYN-ACK waits before its first retransmission, so a connection whose peer answers at all
/// completes first.
pub const HALF_OPEN_MIN_AGE: Duration = Duration::from_secs(1);

/// Listening sockets kept free per listener (a burst of SYNs larger than this within one
/// poll waits for the next refill; every poll visits each of them, so few).
const SPARE: usize = 2;

impl Inner {
    /// Tops up every listener's pool to [`SPARE`] listening sockets while fewer than its
    /// backlog wait to be accepted (dropping pooled sockets that closed before being
    /// accepted), and tells the device how many SYNs each port can take now. A pool full with
    /// a SYN waiting and a half-open connection in it drops the oldest half-open one for the
    /// new SYN ([`HALF_OPEN_TIMEOUT`]); and a source holding a quarter of the backlog in half-open
    /// connections gets no more SYNs in until it has fewer.
    pub(crate) fn refill_listeners(&mut self) {
        let mut room = std::mem::take(&mut self.dev.syn_room);
        room.clear();
        let held = self.dev.held_syn_port();
        let mut heavy = std::mem::take(&mut self.dev.syn_heavy);
        heavy.clear();
        // read once, and only when a half-open socket needs it (this runs before every poll)
        let mut now = None;
        let mut listeners = std::mem::take(&mut self.listeners);
        let mut sources: Vec<(IpAddress, usize)> = Vec::new();
        for l in &mut listeners {
            let sockets = &mut self.sockets;
            let since = &mut l.half_open_since;
            let (mut listening, mut oldest) = (0, None::<(Instant, usize)>);
            let mut i = 0;
            sources.clear();
            l.pool.retain(|h| {
                // (looked at, not touched: see `Inner::tcp_ref`)
                let s = sockets.get::<tcp::Socket>(*h);
                let state = s.state();
                if state != tcp::State::SynReceived && !since.is_empty() {
                    since.remove(h);
                }
                match state {
                    tcp::State::Closed => {
                        crate::buffers::recycle(sockets.remove(*h));
                        return false;
                    }
                    tcp::State::Listen => listening += 1,
                    tcp::State::SynReceived => {
                        let t = *since
                            .entry(*h)
                            .or_insert_with(|| *now.get_or_insert_with(Instant::now));
                        if oldest.is_none_or(|(o, _)| t < o) {
                            oldest = Some((t, i));
                        }
                        if let Some(ep) = s.remote_endpoint() {
                            match sources.iter_mut().find(|(a, _)| *a == ep.addr) {
                                Some((_, k)) => *k += 1,
                                None => sources.push((ep.addr, 1)),
                            }
                        }
                    }
                    // past the handshake: no deadline any more (only half-open ones have it)
                    _ if s.timeout().is_some() => {
                        sockets.get_mut::<tcp::Socket>(*h).set_timeout(None);
                    }
                    _ => {}
                }
                i += 1;
                true
            });
            let mut waiting = l.pool.len() - listening;
            let share = (l.backlog / 4).max(2);
            if waiting >= share {
                // pressed: a source holding a quarter of the backlog half-open gets no more
                heavy.extend(
                    sources
                        .iter()
                        .filter(|(_, k)| *k >= share)
                        .map(|(a, _)| (l.port, IpAddr::from(*a))),
                );
            }
            if waiting >= l.backlog {
                let old = oldest.filter(|(t, _)| {
                    now.get_or_insert_with(Instant::now).duration_since(*t) >= HALF_OPEN_MIN_AGE
                });
                match old {
                    Some((_, i)) if held == Some(l.port) => {
                        // a SYN waits for a full pool: the oldest half-open connection makes
                        // room for it, as a SYN cache drops its oldest entry
                        let h = l.pool.remove(i);
                        l.half_open_since.remove(&h);
                        crate::buffers::recycle(self.sockets.remove(h));
                        self.dev.stats.syn_evicted += 1;
                        waiting -= 1;
                    }
                    Some(_) => {
                        room.push((l.port, SynRoom::Evict));
                        continue;
                    }
                    None => {
                        room.push((l.port, SynRoom::Full));
                        continue;
                    }
                }
            }
            while listening < SPARE.min(l.backlog - waiting) {
                let h = self.new_tcp_socket();
                let deadline = smol(self.cfg.half_open_timeout);
                let s = self.tcp(h);
                s.set_timeout(Some(deadline));
                if s.listen(l.port).is_err() {
                    crate::buffers::recycle(self.sockets.remove(h));
                    break;
                }
                l.pool.push(h);
                listening += 1;
            }
            room.push((l.port, SynRoom::Free(listening)));
        }
        self.listeners = listeners;
        self.dev.syn_room = room;
        self.dev.syn_heavy = heavy;
    }
}
