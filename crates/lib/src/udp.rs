//! UDP sockets over a [`Stack`].

use crate::stack::{from_ep, to_ip, Inner, Stack};
use docknet_pipe::services::Proto;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::udp;
use smoltcp::wire::IpEndpoint;
use std::io;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::Mutex;
use std::time::Duration;

/// Services a socket remembers sending to (each with the backend it chose): later datagrams
/// to the service go to the same backend while the service lists it, and datagrams from that
/// backend are shown as coming from the service, as kube-proxy's connection tracking does.
const SERVICE_FLOWS: usize = 16;

/// How long a dropped socket waits for its queued datagrams to leave (the peer's address may
/// need resolving, and a lost ARP request is repeated after a second).
const LINGER: Duration = Duration::from_secs(2);

/// A UDP socket (std-like).
#[derive(Debug)]
pub struct UdpSocket {
    stack: Stack,
    h: SocketHandle,
    port: u16,
    read_timeout: Option<Duration>,
    /// (service address, backend) of the services this socket sent to, newest last.
    flows: Mutex<Vec<(SocketAddr, SocketAddr)>>,
}

impl UdpSocket {
    /// Binds `port` (0: an ephemeral port) with room for `slots` datagrams each way.
    pub fn bind(stack: &Stack, port: u16) -> io::Result<UdpSocket> {
        const SLOTS: usize = 256;
        let mut g = stack.lock();
        let port = if port == 0 { g.ephemeral_port() } else { port };
        let mut s = udp::Socket::new(
            udp::PacketBuffer::new(
                vec![udp::PacketMetadata::EMPTY; SLOTS],
                vec![0; SLOTS * 2048],
            ),
            udp::PacketBuffer::new(
                vec![udp::PacketMetadata::EMPTY; SLOTS],
                vec![0; SLOTS * 2048],
            ),
        );
        s.bind(port)
            .map_err(|e| io::Error::new(io::ErrorKind::AddrInUse, format!("bind {port}: {e}")))?;
        let h = g.sockets.add(s);
        Ok(UdpSocket {
            stack: stack.clone(),
            h,
            port,
            read_timeout: None,
            flows: Mutex::default(),
        })
    }

    /// Local address (its IPv4 address; the socket takes datagrams to every address of the
    /// stack, IPv6 too on a dual-stack pipe).
    pub fn local_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.stack.ip(), self.port)
    }

    /// Local IPv6 address, when the pipe has one.
    pub fn local_addr6(&self) -> Option<SocketAddrV6> {
        self.stack
            .ip6()
            .map(|(a, _)| SocketAddrV6::new(a, self.port, 0, 0))
    }

    /// Sets the receive timeout.
    pub fn set_read_timeout(&mut self, t: Option<Duration>) {
        self.read_timeout = t;
    }

    /// Sends one datagram (waits while the send buffer is full).
    pub fn send_to(&self, buf: &[u8], to: impl Into<SocketAddr>) -> io::Result<usize> {
        let to = to.into();
        let h = self.h;
        let mut dst = None;
        self.stack.block_on(Some(Duration::from_secs(5)), |g| {
            let d = match dst {
                Some(d) => d,
                None => match self.target(g, to) {
                    Ok(d) => *dst.insert(d),
                    Err(e) => return Some(Err(e)),
                },
            };
            send_step(g, h, buf, d)
        })
    }

    /// Where a datagram to `to` goes: `to`, or for a service the backend this socket sends
    /// that service's datagrams to.
    fn target(&self, g: &mut Inner, to: SocketAddr) -> io::Result<IpEndpoint> {
        let ep = |a: SocketAddr| IpEndpoint::new(to_ip(a.ip()), a.port());
        let SocketAddr::V4(v4) = to else {
            return Ok(ep(to));
        };
        let Some(svc) = g.dev.ep.services().get(*v4.ip(), v4.port(), Proto::Udp) else {
            return Ok(ep(to));
        };
        let mut flows = self.flows.lock().unwrap_or_else(|e| e.into_inner());
        let kept = flows.iter().position(|(s, b)| {
            *s == to && matches!(b, SocketAddr::V4(b) if svc.backends.contains(b))
        });
        let backend = match kept {
            Some(i) => flows.remove(i).1,
            None => g.service_target(to, Proto::Udp)?,
        };
        if flows.len() >= SERVICE_FLOWS {
            flows.remove(0);
        }
        flows.push((to, backend));
        Ok(ep(backend))
    }

    /// The sender a datagram from `from` is shown to come from: the service, when `from` is a
    /// backend this socket sent that service's datagrams to.
    fn shown(&self, from: SocketAddr) -> SocketAddr {
        let flows = self.flows.lock().unwrap_or_else(|e| e.into_inner());
        flows
            .iter()
            .rev()
            .find(|(_, b)| *b == from)
            .map_or(from, |(s, _)| *s)
    }

    /// Sends one datagram, or fails with `WouldBlock` at once when the buffer is full.
    pub fn try_send_to(&self, buf: &[u8], to: impl Into<SocketAddr>) -> io::Result<usize> {
        let to = to.into();
        let h = self.h;
        self.stack.try_now(true, |g| match self.target(g, to) {
            Ok(d) => send_step(g, h, buf, d),
            Err(e) => Some(Err(e)),
        })
    }

    /// Receives one datagram.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let h = self.h;
        self.stack
            .block_on(self.read_timeout, |g| recv_step(g, h, buf))
            .map(|(n, from)| (n, self.shown(from)))
    }

    /// Receives one datagram that has arrived, or fails with `WouldBlock` at once.
    pub fn try_recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let h = self.h;
        self.stack
            .try_now(false, |g| recv_step(g, h, buf))
            .map(|(n, from)| (n, self.shown(from)))
    }

    /// Receives (or with `peek`, looks at) one datagram that has arrived, or fails with
    /// `WouldBlock` at once: `(bytes copied, the datagram's whole length, sender)`. A
    /// datagram longer than `buf` is cut to fit and the rest dropped, as `recvmsg` does.
    pub fn try_recv_msg(
        &self,
        buf: &mut [u8],
        peek: bool,
    ) -> io::Result<(usize, usize, SocketAddr)> {
        let h = self.h;
        self.stack
            .try_now(false, |g| {
                let s = g.sockets.get_mut::<udp::Socket>(h);
                let r = if peek {
                    s.peek().map(|(d, m)| (d, *m))
                } else {
                    s.recv()
                };
                match r {
                    Ok((data, meta)) => {
                        let n = data.len().min(buf.len());
                        buf[..n].copy_from_slice(&data[..n]);
                        Some(Ok((n, data.len(), from_ep(meta.endpoint))))
                    }
                    Err(_) => None,
                }
            })
            .map(|(n, len, from)| (n, len, self.shown(from)))
    }

    /// The length of the next datagram waiting, if one is (`FIONREAD` on a UDP socket).
    pub fn next_len(&self) -> Option<usize> {
        let mut g = self.stack.lock();
        let s = g.sockets.get_mut::<udp::Socket>(self.h);
        s.peek().ok().map(|(d, _)| d.len())
    }

    pub(crate) fn stack_is(&self, stack: &Stack) -> bool {
        self.stack.same(stack)
    }

    /// What this socket is ready for (`g`: the stack, locked).
    pub(crate) fn readiness(&self, g: &mut Inner) -> crate::poll::Ready {
        let s = g.sockets.get::<udp::Socket>(self.h);
        crate::poll::Ready {
            read: s.can_recv(),
            write: s.can_send(),
            ..crate::poll::Ready::default()
        }
    }
}

fn send_step(
    g: &mut Inner,
    h: SocketHandle,
    buf: &[u8],
    dst: IpEndpoint,
) -> Option<io::Result<usize>> {
    let s = g.sockets.get_mut::<udp::Socket>(h);
    if !s.can_send() {
        return None;
    }
    match s.send_slice(buf, dst) {
        Ok(()) => Some(Ok(buf.len())),
        // a free slot, but not enough room for this payload yet
        Err(udp::SendError::BufferFull) if buf.len() <= s.payload_send_capacity() => None,
        Err(e) => Some(Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            e.to_string(),
        ))),
    }
}

fn recv_step(
    g: &mut Inner,
    h: SocketHandle,
    buf: &mut [u8],
) -> Option<io::Result<(usize, SocketAddr)>> {
    let s = g.sockets.get_mut::<udp::Socket>(h);
    if !s.can_recv() {
        return None;
    }
    match s.recv_slice(buf) {
        Ok((n, meta)) => Some(Ok((n, from_ep(meta.endpoint)))),
        // the buffer held only the padding at its wrap-around
        Err(udp::RecvError::Exhausted) => None,
        Err(e) => Some(Err(io::Error::other(e.to_string()))),
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        // Linger, as a kernel socket's datagrams outlive it: what is still queued (e.g.
        // waiting for the peer's address to resolve) gets up to LINGER to leave.
        let h = self.h;
        let _ = self.stack.block_on(Some(LINGER), |g| {
            (g.sockets.get::<udp::Socket>(h).send_queue() == 0).then_some(Ok(()))
        });
        self.stack.lock().sockets.remove(self.h);
    }
}
