//! The paper's callback style (DockNet §3.3, Fig. 6-7) for run-to-completion applications: the
//! calling thread becomes the packet engine and the application's code runs inside it, with
//! no hand-off to another thread.
//!
//! - [`run_frames`]: `stack_rx` — a callback per received Ethernet frame (raw endpoint).
//! - [`serve_tcp`]: `tcp_recved` — a callback per chunk of bytes received on any connection
//!   of a listening port, with a handle to answer on that connection.

use crate::raw::Endpoint;
use crate::stack::HALF_OPEN_MIN_AGE;
use crate::stack::{Inner, Stack};
use docknet_pipe::Idler;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Runs the endpoint's receive loop on this thread until `stop` is set, calling
/// `stack_rx(frame, endpoint)` for every frame (fast channels first, then the rx ring); the
/// callback may send with `endpoint.send` (flushed after each callback).
pub fn run_frames(
    ep: &mut Endpoint,
    stop: &AtomicBool,
    mut stack_rx: impl FnMut(&[u8], &mut Endpoint),
) {
    let mut buf = vec![0u8; ep.frame_size().max(65600)];
    while !stop.load(Ordering::Relaxed) {
        match ep.recv(&mut buf) {
            Some((n, _)) => {
                ep.busy();
                stack_rx(&buf[..n], ep);
                ep.flush();
            }
            None => ep.idle(Duration::from_millis(20)),
        }
    }
}

/// A connection handed to a [`TcpHandler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId(usize);

/// What the application does with a connection's bytes.
pub trait TcpHandler {
    /// A connection was accepted.
    fn accepted(&mut self, _conn: ConnId) {}
    /// `data` arrived on `conn`; bytes pushed into `reply` are sent on the same connection.
    fn tcp_recved(&mut self, conn: ConnId, data: &[u8], reply: &mut Vec<u8>);
    /// The peer closed `conn` (or it was reset); it is gone after this call.
    fn closed(&mut self, _conn: ConnId) {}
}

struct Conn {
    h: SocketHandle,
    out: Vec<u8>,
}

/// Serves `port` on this thread until `stop` is set: accepts connections (keeping `backlog`
/// listening sockets), calls `handler.tcp_recved` for received bytes and sends its replies.
pub fn serve_tcp(
    stack: &Stack,
    port: u16,
    handler: &mut impl TcpHandler,
    stop: &AtomicBool,
) -> io::Result<()> {
    let backlog = stack.config().backlog.max(1);
    let deadline = crate::stack::smol(stack.config().half_open_timeout);
    let mut listening: Vec<SocketHandle> = Vec::new();
    // when each half-open listening socket was first seen so
    let mut since: std::collections::HashMap<SocketHandle, Instant> = Default::default();
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut idler = Idler::new(stack.config().idle);
    while !stop.load(Ordering::Relaxed) {
        let mut events: Vec<(ConnId, Event)> = Vec::new();
        let moved = stack.with_inner(|g: &mut Inner| -> io::Result<bool> {
            // half-open connections past their deadline are gone; all sockets half-open (SYNs
            // never completed): the oldest makes room, so new SYNs still find a listener
            listening.retain(|h| {
                let closed = g.tcp(*h).state() == tcp::State::Closed;
                if closed {
                    since.remove(h);
                    g.sockets_remove(*h);
                }
                !closed
            });
            let now = Instant::now();
            let mut oldest: Option<(Instant, usize)> = None;
            for (i, h) in listening.iter().enumerate() {
                if g.tcp(*h).state() == tcp::State::SynReceived {
                    let t = *since.entry(*h).or_insert(now);
                    if oldest.is_none_or(|(o, _)| t < o) {
                        oldest = Some((t, i));
                    }
                } else {
                    since.remove(h);
                }
            }
            let all_half_open = listening
                .iter()
                .all(|h| g.tcp(*h).state() == tcp::State::SynReceived);
            match oldest {
                Some((t, i))
                    if listening.len() >= backlog
                        && all_half_open
                        && now.duration_since(t) >= HALF_OPEN_MIN_AGE =>
                {
                    let h = listening.remove(i);
                    since.remove(&h);
                    g.sockets_remove(h);
                    g.count_syn_evicted();
                }
                _ => {}
            }
            while listening.len() < backlog {
                let h = g.new_tcp_socket();
                let s = g.tcp(h);
                s.set_timeout(Some(deadline));
                s.listen(port).map_err(|e| {
                    io::Error::new(io::ErrorKind::AddrInUse, format!("listen on {port}: {e}"))
                })?;
                listening.push(h);
            }
            let mut moved = g.poll();
            // newly established connections (oldest first)
            let mut i = 0;
            while i < listening.len() {
                let st = g.tcp(listening[i]).state();
                if matches!(
                    st,
                    tcp::State::Listen | tcp::State::SynReceived | tcp::State::Closed
                ) {
                    i += 1;
                    continue;
                }
                let h = listening.remove(i);
                since.remove(&h);
                g.tcp(h).set_timeout(None);
                let id = ConnId(
                    conns
                        .iter()
                        .position(Option::is_none)
                        .unwrap_or(conns.len()),
                );
                let c = Conn { h, out: Vec::new() };
                if id.0 == conns.len() {
                    conns.push(Some(c));
                } else {
                    conns[id.0] = Some(c);
                }
                events.push((id, Event::Accepted));
                moved = true;
            }
            // received bytes, pending replies, closes
            for (i, slot) in conns.iter_mut().enumerate() {
                let Some(c) = slot else { continue };
                let s = g.tcp(c.h);
                if !c.out.is_empty() && s.can_send() {
                    let n = s.send_slice(&c.out).unwrap_or(0);
                    c.out.drain(..n);
                    moved |= n > 0;
                }
                while s.can_recv() {
                    let n = s.recv_slice(&mut buf).unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    events.push((ConnId(i), Event::Data(buf[..n].to_vec())));
                    moved = true;
                }
                if !s.may_recv()
                    && c.out.is_empty()
                    && !matches!(
                        s.state(),
                        tcp::State::Listen | tcp::State::SynReceived | tcp::State::SynSent
                    )
                {
                    s.close();
                    g.retire(c.h);
                    *slot = None;
                    events.push((ConnId(i), Event::Closed));
                }
            }
            Ok(moved)
        })?;
        for (id, ev) in events {
            match ev {
                Event::Accepted => handler.accepted(id),
                Event::Closed => handler.closed(id),
                Event::Data(d) => {
                    let mut reply = Vec::new();
                    handler.tcp_recved(id, &d, &mut reply);
                    if let Some(Some(c)) = conns.get_mut(id.0) {
                        c.out.extend_from_slice(&reply);
                    }
                }
            }
        }
        // send replies at once (run to completion)
        stack.with_inner(|g: &mut Inner| {
            for c in conns.iter_mut().flatten() {
                let s = g.tcp(c.h);
                if !c.out.is_empty() && s.can_send() {
                    let n = s.send_slice(&c.out).unwrap_or(0);
                    c.out.drain(..n);
                }
            }
            g.poll();
        });
        if moved {
            idler.busy();
        } else if idler.step() {
            stack.sleep_once(Duration::from_millis(20));
        }
    }
    stack.with_inner(|g: &mut Inner| {
        for h in listening.drain(..) {
            g.tcp(h).abort();
            g.sockets_remove(h);
        }
        for c in conns.iter().flatten() {
            g.tcp(c.h).close();
            g.retire(c.h);
        }
        g.poll();
    });
    Ok(())
}

enum Event {
    Accepted,
    Data(Vec<u8>),
    Closed,
}
