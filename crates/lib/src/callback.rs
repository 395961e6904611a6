//! The paper's callback style (DockNet §3.3, Fig. 6-7) for run-to-completion applications: the
//! calling thread becomes the packet engine and the application's code runs inside it, with
//! no hand-off to another thread.
//!
//! - [`run_frames`]: `stack_rx` — a callback per received Ethernet frame (raw endpoint).
//! - [`serve_tcp`]: `tcp_recved` — a callback per chunk of bytes received on any connection
//!   of a listening port, with a handle to answer on that connection.

use crate::raw::Endpoint;
use crate::stack::{Inner, Stack};
use crate::TcpListener;
use docknet_pipe::Idler;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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

/// Serves `port` on this thread until `stop` is set: accepts connections (through the stack's
/// listener on `port`, as [`TcpListener::accept`] does), calls `handler.tcp_recved` for
/// received bytes and sends its replies.
pub fn serve_tcp(
    stack: &Stack,
    port: u16,
    handler: &mut impl TcpHandler,
    stop: &AtomicBool,
) -> io::Result<()> {
    // the stack's listener: its pool, backlog and defences against half-open connections
    // (per-source share, oldest out, deadline) serve this loop as they serve `accept`
    let listener = TcpListener::bind(stack, port)?;
    let port = listener.port();
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut idler = Idler::new(stack.config().idle);
    while !stop.load(Ordering::Relaxed) {
        let mut events: Vec<(ConnId, Event)> = Vec::new();
        let moved = stack.with_inner(|g: &mut Inner| -> io::Result<bool> {
            let mut moved = g.poll();
            // newly established connections (oldest first)
            while let Some(got) = crate::tcp::accept_step(g, port) {
                let (h, _peer) = got?;
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
                // (a look first: a connection with nothing to do is not touched, so the poll
                // does not send for it)
                let s = g.tcp_ref(c.h);
                let work = (!c.out.is_empty() && s.can_send()) || s.can_recv() || !s.may_recv();
                if !work {
                    continue;
                }
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
            for c in conns.iter_mut().flatten().filter(|c| !c.out.is_empty()) {
                let s = g.tcp(c.h);
                if s.can_send() {
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
    drop(listener);
    stack.with_inner(|g: &mut Inner| {
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
