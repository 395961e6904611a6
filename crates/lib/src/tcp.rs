//! TCP sockets over a [`Stack`]: std-like, blocking, run to completion.

use crate::stack::{from_ep, to_ip, Inner, Stack};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

/// A TCP listener (std-like).
#[derive(Debug)]
pub struct TcpListener {
    stack: Stack,
    port: u16,
    pool: Vec<SocketHandle>,
}

impl TcpListener {
    /// Listens on `port` of the stack's address.
    pub fn bind(stack: &Stack, port: u16) -> io::Result<TcpListener> {
        if port == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "port 0"));
        }
        let mut l = TcpListener {
            stack: stack.clone(),
            port,
            pool: Vec::new(),
        };
        let mut g = stack.lock();
        for _ in 0..stack.shared.cfg.backlog.max(1) {
            let h = l.listening(&mut g)?;
            l.pool.push(h);
        }
        Ok(l)
    }

    fn listening(&self, g: &mut Inner) -> io::Result<SocketHandle> {
        let h = g.new_tcp_socket();
        g.tcp(h).listen(self.port).map_err(|e| {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("listen on {}: {e}", self.port),
            )
        })?;
        Ok(h)
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.stack.ip(), self.port)
    }

    /// Waits for a connection.
    pub fn accept(&mut self) -> io::Result<(TcpStream, SocketAddrV4)> {
        self.accept_timeout(None)
    }

    /// Waits for a connection, at most `timeout`.
    pub fn accept_timeout(
        &mut self,
        timeout: Option<Duration>,
    ) -> io::Result<(TcpStream, SocketAddrV4)> {
        let stack = self.stack.clone();
        let pool = &mut self.pool;
        let port = self.port;
        let (h, peer) = stack.block_on(timeout, |g| {
            let i = pool.iter().position(|h| {
                let s = g.tcp(*h);
                !matches!(
                    s.state(),
                    tcp::State::Listen | tcp::State::SynReceived | tcp::State::Closed
                )
            })?;
            let h = pool.swap_remove(i);
            let peer = g.tcp(h).remote_endpoint().map(from_ep);
            // refill the pool
            let n = g.new_tcp_socket();
            if g.tcp(n).listen(port).is_ok() {
                pool.push(n);
            }
            Some(Ok((h, peer)))
        })?;
        let peer = peer.unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
        Ok((TcpStream::wrap(&self.stack, h), peer))
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        let mut g = self.stack.lock();
        for h in self.pool.drain(..) {
            g.tcp(h).abort();
            g.sockets.remove(h);
        }
    }
}

/// A TCP connection (std-like, implements [`Read`] and [`Write`]).
#[derive(Debug)]
pub struct TcpStream {
    stack: Stack,
    h: SocketHandle,
    fin_seen: bool,
    closed_by_us: bool,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
}

impl TcpStream {
    fn wrap(stack: &Stack, h: SocketHandle) -> TcpStream {
        TcpStream {
            stack: stack.clone(),
            h,
            fin_seen: false,
            closed_by_us: false,
            read_timeout: None,
            write_timeout: None,
        }
    }

    /// Connects to `addr`. A closed port gives `ConnectionRefused`; no answer within the
    /// stack's connect timeout gives `TimedOut`.
    pub fn connect(stack: &Stack, addr: SocketAddrV4) -> io::Result<TcpStream> {
        let h = {
            let mut g = stack.lock();
            let h = g.new_tcp_socket();
            let local = g.ephemeral_port();
            let Inner { iface, sockets, .. } = &mut *g;
            let r = sockets.get_mut::<tcp::Socket>(h).connect(
                iface.context(),
                (to_ip(*addr.ip()), addr.port()),
                local,
            );
            if let Err(e) = r {
                sockets.remove(h);
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("connect to {addr}: {e}"),
                ));
            }
            h
        };
        let r = stack.block_on(Some(stack.shared.cfg.connect_timeout), |g| {
            match g.tcp(h).state() {
                tcp::State::Established | tcp::State::CloseWait => Some(Ok(())),
                tcp::State::Closed => Some(Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("connection to {addr} refused"),
                ))),
                _ => None,
            }
        });
        match r {
            Ok(()) => Ok(TcpStream::wrap(stack, h)),
            Err(e) => {
                let mut g = stack.lock();
                g.tcp(h).abort();
                g.sockets.remove(h);
                Err(e)
            }
        }
    }

    /// The TCP state of the connection (`ESTABLISHED`, `FIN-WAIT-1`, ...), for diagnostics.
    pub fn tcp_state(&self) -> String {
        self.stack.lock().tcp(self.h).state().to_string()
    }

    /// Remote address.
    pub fn peer_addr(&self) -> Option<SocketAddrV4> {
        self.stack.lock().tcp(self.h).remote_endpoint().map(from_ep)
    }

    /// Disables (true) or enables (false) Nagle's algorithm, like `std`'s `set_nodelay`. The
    /// stack's default comes from [`crate::StackConfig::nagle`] (off: request/response latency);
    /// bulk senders writing small messages gain throughput with Nagle on.
    pub fn set_nodelay(&mut self, nodelay: bool) {
        self.stack.lock().tcp(self.h).set_nagle_enabled(!nodelay);
    }

    /// Sets the read timeout (`None`: wait forever).
    pub fn set_read_timeout(&mut self, t: Option<Duration>) {
        self.read_timeout = t;
    }

    /// Sets the write timeout.
    pub fn set_write_timeout(&mut self, t: Option<Duration>) {
        self.write_timeout = t;
    }

    /// Sends FIN: the peer reads end-of-stream after what was written.
    pub fn shutdown_write(&mut self) {
        self.closed_by_us = true;
        self.stack.lock().tcp(self.h).close();
        let _ = self
            .stack
            .block_on(Some(Duration::from_millis(1)), |_| None::<io::Result<()>>);
    }

    /// Resets the connection (RST) at once.
    pub fn abort(mut self) {
        self.closed_by_us = true;
        let mut g = self.stack.lock();
        g.tcp(self.h).abort();
        g.poll();
    }

    /// Waits until everything written has been acknowledged by the peer.
    pub fn flush_acked(&mut self, timeout: Duration) -> io::Result<()> {
        let h = self.h;
        self.stack.block_on(Some(timeout), |g| {
            let s = g.tcp(h);
            (s.send_queue() == 0 || !s.may_send()).then_some(Ok(()))
        })
    }
}

impl Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let h = self.h;
        let (fin_seen, closed_by_us) = (&mut self.fin_seen, self.closed_by_us);
        self.stack.block_on(self.read_timeout, |g| {
            let s = g.tcp(h);
            if s.can_recv() {
                return Some(
                    s.recv_slice(buf)
                        .map_err(|e| io::Error::other(e.to_string())),
                );
            }
            if s.may_recv() {
                return None;
            }
            match s.state() {
                tcp::State::Closed if !*fin_seen && !closed_by_us => Some(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "connection reset by peer",
                ))),
                tcp::State::Listen | tcp::State::SynSent | tcp::State::SynReceived => None,
                _ => {
                    *fin_seen = true;
                    Some(Ok(0))
                }
            }
        })
    }
}

impl Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let h = self.h;
        self.stack.block_on(self.write_timeout, |g| {
            let s = g.tcp(h);
            if s.can_send() {
                return Some(
                    s.send_slice(buf)
                        .map_err(|e| io::Error::other(e.to_string())),
                );
            }
            if !s.may_send() {
                let kind = if s.state() == tcp::State::Closed {
                    io::ErrorKind::ConnectionReset
                } else {
                    io::ErrorKind::BrokenPipe
                };
                return Some(Err(io::Error::new(kind, "connection closed for writing")));
            }
            None
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        // Data is handed to the stack by `write`; nothing is buffered in front of it.
        Ok(())
    }
}

impl Drop for TcpStream {
    fn drop(&mut self) {
        let mut g = self.stack.lock();
        let s = g.tcp(self.h);
        if s.state() == tcp::State::Closed {
            g.sockets.remove(self.h);
        } else {
            s.close();
            g.closing.push(self.h);
        }
        g.poll();
    }
}
