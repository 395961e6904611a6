//! TCP sockets over a [`Stack`]: std-like, blocking, run to completion.

use crate::stack::{from_ep, to_ip, Inner, Listening, Stack};
use docknet_pipe::services::Proto;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A TCP listener (std-like). Connections wait to be accepted up to the stack's backlog
/// ([`crate::StackConfig::backlog`]); beyond it, connection requests are dropped (the client
/// retries), as with a kernel listener.
#[derive(Debug)]
pub struct TcpListener {
    stack: Stack,
    port: u16,
}

impl TcpListener {
    /// Listens on `port` of the stack's address (0: an ephemeral port, as the kernel picks one
    /// for `listen` on an unbound socket).
    pub fn bind(stack: &Stack, port: u16) -> io::Result<TcpListener> {
        let mut g = stack.lock();
        let port = if port == 0 {
            let mut p = g.ephemeral_port();
            for _ in 0..16_000 {
                if !g.listeners.iter().any(|l| l.port == p) {
                    break;
                }
                p = g.ephemeral_port();
            }
            p
        } else {
            port
        };
        let taken = g.listeners.iter().any(|l| l.port == port);
        if taken {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("port {port} is in use"),
            ));
        }
        g.listeners.push(Listening {
            port,
            pool: Vec::new(),
            backlog: stack.shared.cfg.backlog.max(1),
            half_open_since: std::collections::HashMap::new(),
            accepted: 0,
        });
        g.poll();
        Ok(TcpListener {
            stack: stack.clone(),
            port,
        })
    }

    /// The address listened on (its IPv4 address; a listener takes connections to every
    /// address of the stack, IPv6 too on a dual-stack pipe).
    pub fn local_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.stack.ip(), self.port)
    }

    /// The IPv6 address listened on, when the pipe has one.
    pub fn local_addr6(&self) -> Option<SocketAddrV6> {
        self.stack
            .ip6()
            .map(|(a, _)| SocketAddrV6::new(a, self.port, 0, 0))
    }

    /// Waits for a connection; returns it and the peer's address (IPv4 or IPv6).
    pub fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        self.accept_timeout(None)
    }

    /// The port listened on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits for a connection, at most `timeout`.
    pub fn accept_timeout(&self, timeout: Option<Duration>) -> io::Result<(TcpStream, SocketAddr)> {
        let port = self.port;
        let (h, peer) = self.stack.block_on(timeout, |g| accept_step(g, port))?;
        Ok(self.accepted(h, peer))
    }

    /// Takes a connection that has arrived, or fails with `WouldBlock` at once.
    pub fn try_accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let port = self.port;
        let (h, peer) = self.stack.try_now(true, |g| accept_step(g, port))?;
        Ok(self.accepted(h, peer))
    }

    fn accepted(&self, h: SocketHandle, peer: Option<SocketAddr>) -> (TcpStream, SocketAddr) {
        let peer = peer.unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
        (TcpStream::wrap(&self.stack, h), peer)
    }

    pub(crate) fn stack_is(&self, stack: &Stack) -> bool {
        self.stack.same(stack)
    }

    /// How many connections have been accepted from this port so far, by any of the
    /// process's threads (0 once the listener is closed).
    pub fn accepts(&self) -> u64 {
        let g = self.stack.lock();
        g.listeners
            .iter()
            .find(|l| l.port == self.port)
            .map_or(0, |l| l.accepted)
    }

    /// Whether a connection is waiting to be accepted (`g`: the stack, locked).
    pub(crate) fn acceptable(&self, g: &mut Inner) -> bool {
        let Some(l) = g.listeners.iter().find(|l| l.port == self.port) else {
            return false;
        };
        // (every poll and select of an event loop with its listener among the sockets asks:
        // looked at in place, nothing copied)
        l.pool.iter().any(|h| established(g, *h))
    }
}

/// A pooled socket that has a connection.
fn established(g: &Inner, h: SocketHandle) -> bool {
    !matches!(
        g.tcp_ref(h).state(),
        tcp::State::Listen | tcp::State::SynReceived | tcp::State::Closed
    )
}

/// Hands out the oldest pooled socket that has a connection (the next poll refills the pool).
pub(crate) fn accept_step(
    g: &mut Inner,
    port: u16,
) -> Option<io::Result<(SocketHandle, Option<SocketAddr>)>> {
    let li = g.listeners.iter().position(|l| l.port == port)?;
    let i = g.listeners[li]
        .pool
        .iter()
        .position(|h| established(g, *h))?;
    let h = g.listeners[li].pool.remove(i);
    g.listeners[li].half_open_since.remove(&h);
    g.listeners[li].accepted += 1;
    // the handshake's deadline does not follow the connection (an idle one would be aborted)
    g.tcp(h).set_timeout(None);
    let peer = g.tcp(h).remote_endpoint().map(from_ep);
    Some(Ok((h, peer)))
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        let mut g = self.stack.lock();
        if let Some(i) = g.listeners.iter().position(|l| l.port == self.port) {
            let l = g.listeners.swap_remove(i);
            for h in l.pool {
                g.tcp(h).abort();
                crate::buffers::recycle(g.sockets.remove(h));
            }
        }
        g.poll();
    }
}

/// A TCP connection (std-like, implements [`Read`] and [`Write`], also through `&TcpStream`:
/// every call takes `&self`, so threads may share one stream, e.g. in an `Arc`).
#[derive(Debug)]
pub struct TcpStream {
    stack: Stack,
    h: SocketHandle,
    fin_seen: AtomicBool,
    closed_by_us: AtomicBool,
    /// Shut for reading ([`TcpStream::shutdown_read`]).
    read_shut: AtomicBool,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    /// The service address the program connected to, when a backend serves the connection:
    /// what [`TcpStream::peer_addr`] says, as `getpeername` does behind kube-proxy.
    service: Option<SocketAddr>,
}

impl TcpStream {
    /// Its socket in the stack's set.
    pub(crate) fn handle(&self) -> SocketHandle {
        self.h
    }

    fn wrap(stack: &Stack, h: SocketHandle) -> TcpStream {
        TcpStream {
            stack: stack.clone(),
            h,
            fin_seen: AtomicBool::new(false),
            closed_by_us: AtomicBool::new(false),
            read_shut: AtomicBool::new(false),
            read_timeout: None,
            write_timeout: None,
            service: None,
        }
    }

    /// Connects to `addr` (a `SocketAddrV4`, a `SocketAddrV6` on a dual-stack pipe, or a
    /// `SocketAddr`). A closed port gives `ConnectionRefused`; no answer within the stack's
    /// connect timeout gives `TimedOut`. A service's address (announced by the daemon) is
    /// served by one of its backends, and a service without any refuses the connection.
    pub fn connect(stack: &Stack, addr: impl Into<SocketAddr>) -> io::Result<TcpStream> {
        TcpStream::connect_within(stack, addr, stack.shared.cfg.connect_timeout)
    }

    /// [`TcpStream::connect`] that gives up (`TimedOut`) after `timeout` when that is shorter
    /// than the stack's connect timeout (a resolver's question has a time of its own).
    pub fn connect_within(
        stack: &Stack,
        addr: impl Into<SocketAddr>,
        timeout: Duration,
    ) -> io::Result<TcpStream> {
        let s = TcpStream::connect_start(stack, addr)?;
        let (h, addr) = (s.h, s.backend_addr());
        let wait = timeout.min(stack.shared.cfg.connect_timeout);
        stack.block_on(Some(wait), |g| connect_step(g, h, addr))?;
        Ok(s)
    }

    /// Starts connecting to `addr` and returns at once (the SYN is sent): a non-blocking
    /// connect. The stream is writable once connected; [`TcpStream::connect_result`] tells
    /// how it went.
    pub fn connect_start(stack: &Stack, addr: impl Into<SocketAddr>) -> io::Result<TcpStream> {
        TcpStream::start(stack, None, addr.into())
    }

    /// [`TcpStream::connect_start`] from local port `port` (a program that binds its port
    /// before it connects). A port another connection of this stack to the same peer uses is
    /// refused by the peer's stack, not here.
    pub fn connect_start_from(
        stack: &Stack,
        port: u16,
        addr: impl Into<SocketAddr>,
    ) -> io::Result<TcpStream> {
        if port == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "local port 0"));
        }
        TcpStream::start(stack, Some(port), addr.into())
    }

    fn start(stack: &Stack, port: Option<u16>, asked: SocketAddr) -> io::Result<TcpStream> {
        let _call = crate::stack::CallGuard::new(&stack.shared);
        let mut g = stack.lock();
        let addr = g.service_target(asked, Proto::Tcp)?;
        let h = g.new_tcp_socket();
        let local = match port {
            Some(p) => p,
            None => g.ephemeral_port(),
        };
        let Inner { iface, sockets, .. } = &mut *g;
        let r = sockets.get_mut::<tcp::Socket>(h).connect(
            iface.context(),
            (to_ip(addr.ip()), addr.port()),
            local,
        );
        if let Err(e) = r {
            crate::buffers::recycle(sockets.remove(h));
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("connect to {addr}: {e}"),
            ));
        }
        g.poll();
        drop(g);
        let mut s = TcpStream::wrap(stack, h);
        s.service = (asked != addr).then_some(asked);
        Ok(s)
    }

    /// The address the connection goes to: the backend's for a service's connection.
    fn backend_addr(&self) -> SocketAddr {
        self.stack
            .lock()
            .tcp(self.h)
            .remote_endpoint()
            .map(from_ep)
            .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
    }

    /// How a connect started with [`TcpStream::connect_start`] went: `None` while it is in
    /// progress, `Some(Ok(()))` once connected, `Some(Err(..))` when refused or reset.
    pub fn connect_result(&self) -> Option<io::Result<()>> {
        let addr = self
            .peer_addr()
            .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
        connect_step(&mut self.stack.lock(), self.h, addr)
    }

    /// The backend serving this connection, when it was made to a service's address
    /// ([`TcpStream::peer_addr`] says the service's).
    pub fn backend(&self) -> Option<SocketAddr> {
        self.service.map(|_| self.backend_addr())
    }

    /// The TCP state of the connection (`ESTABLISHED`, `FIN-WAIT-1`, ...), for diagnostics.
    pub fn tcp_state(&self) -> String {
        self.stack.lock().tcp_ref(self.h).state().to_string()
    }

    /// Remote address (for a connection made to a service's address: that address).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        let remote = self
            .stack
            .lock()
            .tcp_ref(self.h)
            .remote_endpoint()
            .map(from_ep);
        remote.and(self.service).or(remote)
    }

    /// Local address (the stack's address and this connection's port).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.stack
            .lock()
            .tcp_ref(self.h)
            .local_endpoint()
            .map(from_ep)
    }

    /// Disables (true) or enables (false) Nagle's algorithm, like `std`'s `set_nodelay`. The
    /// stack's default comes from [`crate::StackConfig::nagle`] (off: request/response latency);
    /// bulk senders writing small messages gain throughput with Nagle on.
    pub fn set_nodelay(&self, nodelay: bool) {
        self.stack.lock().tcp(self.h).set_nagle_enabled(!nodelay);
    }

    /// Whether Nagle's algorithm is off.
    pub fn nodelay(&self) -> bool {
        !self.stack.lock().tcp_ref(self.h).nagle_enabled()
    }

    /// Sends keep-alive probes after `interval` of silence (`None`: none, the default).
    pub fn set_keepalive(&self, interval: Option<Duration>) {
        let d = interval.map(|d| smoltcp::time::Duration::from_micros(d.as_micros() as u64));
        self.stack.lock().tcp(self.h).set_keep_alive(d);
    }

    /// Bytes written and not yet acknowledged by the peer.
    pub fn bytes_unacked(&self) -> usize {
        self.stack.lock().tcp_ref(self.h).send_queue()
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
    pub fn shutdown_write(&self) {
        self.closed_by_us.store(true, Ordering::Relaxed);
        self.stack.lock().tcp(self.h).close();
        let _ = self
            .stack
            .block_on(Some(Duration::from_millis(1)), |_| None::<io::Result<()>>);
    }

    /// Shuts the connection for reading, as `shutdown(SHUT_RD)` does in Linux: reads return
    /// what had arrived and then end of stream (0), at once, and the socket is ready to read
    /// at end of stream. Nothing goes to the peer. A read or an event loop that waits
    /// meanwhile, in any thread, ends and looks again.
    pub fn shutdown_read(&self) {
        self.read_shut.store(true, Ordering::Release);
        let mut g = self.stack.lock();
        // noted in the change log (an event loop looks at it again), and the waiters woken
        let _ = g.tcp_quiet(self.h);
        g.wake_waiters();
    }

    /// Resets the connection (RST) at once.
    pub fn abort(self) {
        self.abort_ref();
    }

    /// Resets the connection (RST) at once, through a shared reference (reads then give end
    /// of stream, writes `BrokenPipe`).
    pub fn abort_ref(&self) {
        self.closed_by_us.store(true, Ordering::Relaxed);
        let mut g = self.stack.lock();
        g.tcp(self.h).abort();
        g.poll();
    }

    /// Waits until everything written has been acknowledged by the peer.
    pub fn flush_acked(&self, timeout: Duration) -> io::Result<()> {
        let h = self.h;
        self.stack.block_on(Some(timeout), |g| {
            let s = g.tcp(h);
            (s.send_queue() == 0 || !s.may_send()).then_some(Ok(()))
        })
    }
}

impl TcpStream {
    /// Reads what has arrived, or fails with `WouldBlock` at once (0: end of stream).
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let (h, closed_by_us) = (self.h, self.closed_by_us.load(Ordering::Relaxed));
        let (fin_seen, read_shut) = (&self.fin_seen, self.read_shut.load(Ordering::Acquire));
        self.stack.try_now(false, |g| {
            read_step(g, h, buf, fin_seen, closed_by_us, read_shut)
        })
    }

    /// Copies what has arrived without consuming it, or fails with `WouldBlock` at once (0:
    /// end of stream): `recv` with `MSG_PEEK`.
    pub fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let (h, closed_by_us) = (self.h, self.closed_by_us.load(Ordering::Relaxed));
        let (fin_seen, read_shut) = (&self.fin_seen, self.read_shut.load(Ordering::Acquire));
        self.stack.try_now(false, |g| {
            let s = g.tcp(h);
            if s.can_recv() {
                return Some(
                    s.peek_slice(buf)
                        .map_err(|e| io::Error::other(e.to_string())),
                );
            }
            // nothing buffered: the same outcome as a read (end of stream, reset, or wait)
            read_step(g, h, &mut [], fin_seen, closed_by_us, read_shut)
        })
    }

    /// Hands what has arrived to `take`, which answers how many of those bytes it took: they
    /// leave the socket, the rest stay for the next read. `take` runs under the stack's lock,
    /// so another reader of the connection never sees the bytes it looks at, and bytes it
    /// refuses (an error) are not lost; it must not wait or call into the stack. Fails with
    /// `WouldBlock` at once when nothing has arrived, or with `take`'s error (`Ok(0)`: end of
    /// stream). The slice may be part of what arrived (the buffer is a ring): call again.
    pub fn try_read_with(
        &self,
        mut take: impl FnMut(&[u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let (h, closed_by_us) = (self.h, self.closed_by_us.load(Ordering::Relaxed));
        let (fin_seen, read_shut) = (&self.fin_seen, self.read_shut.load(Ordering::Acquire));
        self.stack.try_now(false, |g| {
            let s = g.tcp_quiet(h);
            if !s.can_recv() {
                return read_step(g, h, &mut [], fin_seen, closed_by_us, read_shut);
            }
            let r = s
                .recv(|b| match take(b) {
                    Ok(0) => (0, Err(io::Error::from(io::ErrorKind::WouldBlock))),
                    Ok(n) => (n.min(b.len()), Ok(n.min(b.len()))),
                    Err(e) => (0, Err(e)),
                })
                .unwrap_or_else(|e| Err(io::Error::other(e.to_string())));
            // (marked for the egress only when the read opened a window worth announcing)
            g.nothing_to_send = !g.tcp_ref(h).window_update_due();
            if !g.nothing_to_send {
                g.sockets.touch(h);
            }
            Some(r)
        })
    }

    /// [`TcpStream::read_timeout`] that also ends, failing with `Interrupted` when nothing
    /// came, when one of `wakers` is woken after its token was read ([`crate::Waker::token`]):
    /// a blocking read that a signal must be able to interrupt (the preload library's
    /// `recv`), waiting in the stack's own read rather than in a readiness wait followed by a
    /// read. A timeout fails with `TimedOut`. Nothing is lent while it waits: a signal
    /// handler that runs in the wait may read the same socket, or leave the call by a long
    /// jump that no loan would survive.
    pub fn read_wakeable(
        &self,
        buf: &mut [u8],
        timeout: Option<Duration>,
        wakers: &[(&crate::Waker, u32)],
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let words = crate::poll::waker_words(wakers);
        let (h, fin_seen, closed_by_us) = (self.h, &self.fin_seen, &self.closed_by_us);
        let read_shut = &self.read_shut;
        self.stack.block_on_woken(timeout, &words, None, |g| {
            // (closed by this side meanwhile: another thread's shutdown or close)
            let r = read_step(
                g,
                h,
                buf,
                fin_seen,
                closed_by_us.load(Ordering::Relaxed),
                read_shut.load(Ordering::Acquire),
            );
            match r {
                Some(Ok(n)) if n > 0 => g.answering(h),
                None => g.not_answering(h),
                _ => {}
            }
            r
        })
    }

    /// Reads, waiting at most `timeout` (`None`: no limit) for something to arrive.
    ///
    /// While it waits, `buf` is lent to the socket (`tcp::Socket::set_direct`,
    /// vendor/smoltcp/DOCKNET-PATCH.md): the next bytes to arrive in order are copied from
    /// the frame straight into it, not into the socket's receive buffer first, so a reader
    /// that waits costs one copy of each byte fewer. The loan ends before the call returns, on
    /// every path.
    #[allow(unsafe_code)]
    pub fn read_timeout(&self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let (h, closed_by_us) = (self.h, &self.closed_by_us);
        let (fin_seen, read_shut) = (&self.fin_seen, &self.read_shut);
        let lent = Lent {
            stack: &self.stack,
            h,
            buf: buf.as_ptr(),
            on: std::cell::Cell::new(false),
        };
        let r = self.stack.block_on(timeout, |g| {
            if lent.on.replace(false) {
                // (the loan's end makes nothing due: what the bytes called for was marked as
                // they came)
                let n = g.tcp_quiet(h).take_direct(lent.buf);
                if n > 0 {
                    g.nothing_to_send = !g.tcp_ref(h).window_update_due();
                    g.answering(h);
                    return Some(Ok(n));
                }
            }
            let r = read_step(
                g,
                h,
                buf,
                fin_seen,
                closed_by_us.load(Ordering::Relaxed),
                read_shut.load(Ordering::Acquire),
            );
            if matches!(r, Some(Ok(n)) if n > 0) {
                g.answering(h);
            }
            if r.is_none() {
                // SAFETY: `buf` is this call's and nothing else touches it until the loan
                // ends: at this closure's next run (under the stack's lock, before `buf` is
                // used again) or in `lent`'s `finish` or drop, before the call returns or
                // unwinds. Whoever polls the stack meanwhile writes it under that lock. (A
                // second reader of the socket finds the loan taken and waits as before.)
                let on = unsafe { g.tcp_quiet(h).set_direct(buf.as_mut_ptr(), buf.len()) };
                lent.on.set(on);
                if on {
                    // the reader waits again (a second reader, refused the loan, leaves the
                    // first one's mark alone)
                    g.not_answering(h);
                }
            }
            r
        });
        lent.finish(r)
    }

    /// Writes, waiting at most `timeout` for room in the send buffer.
    pub fn write_timeout(&self, buf: &[u8], timeout: Option<Duration>) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let h = self.h;
        self.stack.block_on(timeout, |g| write_step(g, h, buf))
    }

    /// Writes what fits in the send buffer, or fails with `WouldBlock` at once.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let h = self.h;
        self.stack.try_now(true, |g| write_step(g, h, buf))
    }

    /// Like [`TcpStream::try_write`], but the bytes leave at the stack's next poll rather than
    /// now: an event loop that writes to many connections and then calls
    /// [`crate::Stack::wait`] (which polls first) sends them all in one poll, instead of one
    /// poll per write (each poll visits every socket of the stack). Bytes that go as a record
    /// over a fast channel (`records`) leave at once: a record needs no poll.
    pub fn try_write_deferred(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let h = self.h;
        self.stack.try_now(false, |g| write_step(g, h, buf))
    }

    /// Bytes that can be read now without waiting.
    pub fn bytes_readable(&self) -> usize {
        self.stack.lock().tcp_ref(self.h).recv_queue()
    }

    /// What this stream is ready for (`g`: the stack, locked).
    pub(crate) fn readiness(&self, g: &mut Inner) -> crate::poll::Ready {
        let s = g.tcp_ref(self.h);
        let state = s.state();
        let connecting = matches!(state, tcp::State::SynSent | tcp::State::SynReceived);
        let closed = state == tcp::State::Closed;
        // (shut for reading: readable, at end of stream, as Linux's `tcp_poll` says)
        let rd_end = (!s.may_recv() && !connecting) || self.read_shut.load(Ordering::Acquire);
        crate::poll::Ready {
            read: s.can_recv() || rd_end,
            write: s.can_send() || (!s.may_send() && !connecting),
            hup: rd_end,
            error: closed
                && !self.fin_seen.load(Ordering::Relaxed)
                && !self.closed_by_us.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn stack_is(&self, stack: &Stack) -> bool {
        self.stack.same(stack)
    }
}

/// A connect's outcome so far (see [`TcpStream::connect_result`]).
fn connect_step(g: &mut Inner, h: SocketHandle, addr: SocketAddr) -> Option<io::Result<()>> {
    match g.tcp_ref(h).state() {
        tcp::State::Established | tcp::State::CloseWait => Some(Ok(())),
        tcp::State::Closed => Some(Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("connection to {addr} refused"),
        ))),
        tcp::State::SynSent | tcp::State::SynReceived => None,
        // connected, and already closing: the connect itself succeeded
        _ => Some(Ok(())),
    }
}

/// One attempt at a read: `None` when it would wait.
fn read_step(
    g: &mut Inner,
    h: SocketHandle,
    buf: &mut [u8],
    fin_seen: &AtomicBool,
    closed_by_us: bool,
    read_shut: bool,
) -> Option<io::Result<usize>> {
    // (a read makes a segment due only when it opened the window enough to announce: the
    // socket is marked for the egress then, and only then)
    let s = g.tcp_quiet(h);
    if s.can_recv() && !buf.is_empty() {
        let r = s
            .recv_slice(buf)
            .map_err(|e| io::Error::other(e.to_string()));
        // and only then it needs a poll after it
        g.nothing_to_send = !g.tcp_ref(h).window_update_due();
        if !g.nothing_to_send {
            g.sockets.touch(h);
        }
        return Some(r);
    }
    if read_shut {
        // (shut for reading: end of stream once what had arrived is read, as in Linux)
        return Some(Ok(0));
    }
    if s.may_recv() {
        return None;
    }
    match s.state() {
        tcp::State::Closed if !fin_seen.load(Ordering::Relaxed) && !closed_by_us => Some(Err(
            io::Error::new(io::ErrorKind::ConnectionReset, "connection reset by peer"),
        )),
        tcp::State::Listen | tcp::State::SynSent | tcp::State::SynReceived => None,
        _ => {
            fin_seen.store(true, Ordering::Relaxed);
            Some(Ok(0))
        }
    }
}

/// A reader's buffer lent to its socket by [`TcpStream::read_timeout`]; the loan ends with
/// [`Lent::finish`], or when dropped (a panic).
struct Lent<'s> {
    stack: &'s Stack,
    h: SocketHandle,
    /// The buffer (which loan is this reader's).
    buf: *const u8,
    on: std::cell::Cell<bool>,
}

impl Lent<'_> {
    /// Ends the loan, if it is on: the bytes put in the buffer since the last look.
    fn end(&self) -> usize {
        if !self.on.replace(false) {
            return 0;
        }
        self.stack.lock().tcp_quiet(self.h).take_direct(self.buf)
    }

    /// Ends the loan; what arrived in the buffer since the last look is the read's result
    /// whatever ended the wait (a timeout, an interruption, an error).
    fn finish(self, r: io::Result<usize>) -> io::Result<usize> {
        match self.end() {
            0 => r,
            n => Ok(n),
        }
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        self.end();
    }
}

/// One attempt at a write: `None` when it would wait.
fn write_step(g: &mut Inner, h: SocketHandle, buf: &[u8]) -> Option<io::Result<usize>> {
    // as a record over a fast channel, where the connection allows one (`records`)
    if let Some(n) = g.try_record(h, buf) {
        g.nothing_to_send = true;
        return Some(Ok(n));
    }
    let s = g.tcp(h);
    if s.can_send() {
        let r = s
            .send_slice(buf)
            .map_err(|e| io::Error::other(e.to_string()));
        g.wrote = Some(h);
        return Some(r);
    }
    if !s.may_send() {
        let state = s.state();
        if matches!(state, tcp::State::SynSent | tcp::State::SynReceived) {
            return None;
        }
        let kind = if state == tcp::State::Closed {
            io::ErrorKind::ConnectionReset
        } else {
            io::ErrorKind::BrokenPipe
        };
        return Some(Err(io::Error::new(kind, "connection closed for writing")));
    }
    None
}

impl Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        TcpStream::read_timeout(self, buf, self.read_timeout)
    }
}

impl Read for &TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        TcpStream::read_timeout(self, buf, self.read_timeout)
    }
}

impl Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        TcpStream::write_timeout(self, buf, self.write_timeout)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Data is handed to the stack by `write`; nothing is buffered in front of it.
        Ok(())
    }
}

impl Write for &TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        TcpStream::write_timeout(self, buf, self.write_timeout)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for TcpStream {
    fn drop(&mut self) {
        let mut g = self.stack.lock();
        // (its handle may be given to another connection)
        g.not_answering(self.h);
        let s = g.tcp(self.h);
        if s.state() == tcp::State::Closed {
            crate::buffers::recycle(g.sockets.remove(self.h));
        } else {
            s.close();
            g.retire(self.h);
        }
        g.poll();
    }
}
