//! DockLib's userspace TCP/IP: one smoltcp interface per pipe, and blocking std-like sockets.
//!
//! **Who polls.** A blocking call (`read`, `write`, `accept`, `connect`, …) polls the stack
//! itself until it can complete: run-to-completion, so a request/response never waits for a
//! hand-off between threads. Between polls it follows the stack's idle policy (spin, yield,
//! then sleep on the rings' futex words). When no call is in progress, a background engine
//! thread polls instead, so ACKs, retransmissions and incoming connections make progress while
//! the application computes; it steps aside (sleeps) while any call is active.
//!
//! **smoltcp's limits and how they are met here.** No listen backlog: a listener keeps a pool
//! of `backlog` listening sockets on its port and replaces each one it hands out. Linear socket
//! scans: one stack (one interface) per container keeps the set small. Small neighbour cache:
//! built with room for 64 entries. One MTU per interface: the pipe's (create pipes with a
//! large MTU to get large segments over fast channels). Nagle and delayed ACKs are off by
//! default (RPC latency); window scaling follows the buffer sizes (256 KiB default), and CUBIC
//! congestion control is on.

use crate::device::{DeviceStats, Faults, PipeDevice};
use crate::raw::{AttachError, Endpoint};
use docknet_pipe::{IdlePolicy, Idler};
use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpEndpoint, Ipv4Address};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// How a stack is set up.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// What a waiting call does between polls.
    pub idle: IdlePolicy,
    /// Receive buffer per TCP socket (bytes; above 64 KiB enables window scaling).
    pub tcp_rx_buffer: usize,
    /// Send buffer per TCP socket.
    pub tcp_tx_buffer: usize,
    /// Nagle's algorithm (off: lowest latency for request/response).
    pub nagle: bool,
    /// Delayed ACK (off by default).
    pub ack_delay: Option<Duration>,
    /// CUBIC congestion control (on) or none.
    pub congestion_control: bool,
    /// Listening sockets kept ready per listener (smoltcp has no backlog).
    pub backlog: usize,
    /// Compute and check checksums (off: every path is plain memory today).
    pub checksums: bool,
    /// How long `connect` waits.
    pub connect_timeout: Duration,
    /// Faults to inject into received frames (tests and experiments).
    pub faults: Option<Faults>,
}

impl Default for StackConfig {
    fn default() -> StackConfig {
        StackConfig {
            idle: IdlePolicy::ADAPTIVE,
            tcp_rx_buffer: 256 * 1024,
            tcp_tx_buffer: 256 * 1024,
            nagle: false,
            ack_delay: None,
            congestion_control: true,
            backlog: 8,
            checksums: false,
            connect_timeout: Duration::from_secs(10),
            faults: None,
        }
    }
}

pub(crate) struct Inner {
    iface: Interface,
    sockets: SocketSet<'static>,
    dev: PipeDevice,
    epoch: Instant,
    next_port: u16,
    /// Sockets closed by the application, removed once their state reaches Closed.
    closing: Vec<SocketHandle>,
    cfg: StackConfig,
}

impl Inner {
    fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    /// Polls the interface; true when anything moved.
    pub(crate) fn poll(&mut self) -> bool {
        let now = self.now();
        let before = self.dev.stats;
        let changed = self.iface.poll(now, &mut self.dev, &mut self.sockets)
            == PollResult::SocketStateChanged;
        self.dev.ep.flush();
        if !self.closing.is_empty() {
            let sockets = &mut self.sockets;
            self.closing.retain(|h| {
                let done = sockets.get::<tcp::Socket>(*h).state() == tcp::State::Closed;
                if done {
                    sockets.remove(*h);
                }
                !done
            });
        }
        changed || self.dev.stats != before
    }

    /// How long until something needs a poll without new frames: a TCP timer, or a frame
    /// held back by fault injection.
    fn delay(&mut self) -> Option<Duration> {
        let now = self.now();
        let timer = self
            .iface
            .poll_delay(now, &self.sockets)
            .map(|d| Duration::from_micros(d.total_micros()));
        match (timer, self.dev.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn tcp(&mut self, h: SocketHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(h)
    }

    /// A new TCP socket with the stack's settings.
    pub(crate) fn new_tcp_socket(&mut self) -> SocketHandle {
        let c = self.cfg.clone();
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; c.tcp_rx_buffer]),
            tcp::SocketBuffer::new(vec![0; c.tcp_tx_buffer]),
        );
        s.set_nagle_enabled(c.nagle);
        s.set_ack_delay(
            c.ack_delay
                .map(|d| smoltcp::time::Duration::from_micros(d.as_micros() as u64)),
        );
        s.set_congestion_control(if c.congestion_control {
            tcp::CongestionControl::Cubic
        } else {
            tcp::CongestionControl::None
        });
        self.sockets.add(s)
    }

    /// Removes a socket once it has finished closing.
    pub(crate) fn retire(&mut self, h: SocketHandle) {
        self.closing.push(h);
    }

    /// Removes a socket now.
    pub(crate) fn sockets_remove(&mut self, h: SocketHandle) {
        self.sockets.remove(h);
    }

    fn ephemeral_port(&mut self) -> u16 {
        let p = self.next_port;
        self.next_port = if p >= 65000 { 49152 } else { p + 1 };
        p
    }
}

struct Shared {
    inner: Mutex<Inner>,
    /// Calls in progress; the engine thread stays away while this is not zero.
    callers: AtomicU32,
    /// Calls started so far (wrapping): tells the engine whether the application is active.
    calls: AtomicU32,
    cfg: StackConfig,
    ip: Ipv4Addr,
}

/// A userspace TCP/IP stack over one DockPipe. Cheap to clone (shared).
#[derive(Clone)]
pub struct Stack {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("ip", &self.shared.ip)
            .finish()
    }
}

/// Holds `callers` up while a call runs. No wake-up on the way out: the engine re-checks on
/// its own within a millisecond, which keeps a syscall off every call.
struct CallGuard<'a>(&'a AtomicU32);

impl<'a> CallGuard<'a> {
    fn new(s: &'a Shared) -> CallGuard<'a> {
        s.callers.fetch_add(1, Ordering::AcqRel);
        s.calls.fetch_add(1, Ordering::Relaxed);
        CallGuard(&s.callers)
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn to_ip(a: Ipv4Addr) -> IpAddress {
    IpAddress::Ipv4(Ipv4Address::from_octets(a.octets()))
}

fn from_ep(e: IpEndpoint) -> SocketAddrV4 {
    let IpAddress::Ipv4(a) = e.addr;
    SocketAddrV4::new(Ipv4Addr::from(a.octets()), e.port)
}

/// The error for a call that ran out of time: says so plainly, unless the reason is that the
/// daemon removed the pipe or is not running (no heartbeat for 2 s).
fn timed_out(ep: &Endpoint) -> io::Error {
    if ep.is_closed() {
        return io::Error::new(
            io::ErrorKind::NotConnected,
            "the pipe was removed by the docknet daemon",
        );
    }
    match ep.daemon_silence() {
        Some(s) if s > Duration::from_secs(2) => io::Error::new(
            io::ErrorKind::NotConnected,
            format!(
                "the docknet daemon is gone (no heartbeat for {} s)",
                s.as_secs()
            ),
        ),
        _ => io::Error::new(io::ErrorKind::TimedOut, "timed out"),
    }
}

impl Stack {
    /// Attaches to the pipe at `$DOCKNET_PIPE` or `/run/docknet/pipe` and starts the engine.
    pub fn attach_default(cfg: StackConfig) -> Result<Stack, AttachError> {
        Ok(Stack::new(Endpoint::attach_default(cfg.idle)?, cfg))
    }

    /// Builds a stack over `ep` and starts its engine thread.
    pub fn new(ep: Endpoint, cfg: StackConfig) -> Stack {
        let ip = ep.ip();
        let prefix = ep.prefix() as u8;
        let mac = ep.mac();
        let mut dev = PipeDevice::new(ep, cfg.checksums);
        if let Some(f) = cfg.faults {
            dev.set_faults(f);
        }
        let epoch = Instant::now();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
        config.random_seed = u64::from(std::process::id())
            ^ epoch.elapsed().as_nanos() as u64
            ^ 0x9e37_79b9_7f4a_7c15;
        let mut iface = Interface::new(config, &mut dev, smoltcp::time::Instant::from_micros(0));
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(to_ip(ip), prefix));
        });
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                iface,
                sockets: SocketSet::new(Vec::new()),
                dev,
                epoch,
                next_port: 49152 + (std::process::id() % 8000) as u16,
                closing: Vec::new(),
                cfg: cfg.clone(),
            }),
            callers: AtomicU32::new(0),
            calls: AtomicU32::new(0),
            cfg,
            ip,
        });
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("docklib-engine".into())
            .spawn(move || engine(weak))
            .expect("spawning the DockLib engine thread");
        Stack { shared }
    }

    /// This stack's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.shared.ip
    }

    /// Device counters.
    pub fn device_stats(&self) -> DeviceStats {
        self.lock().dev.stats
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves smoltcp's state as it was; carry on with it.
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Polls until `f` returns `Some`, or `timeout` passes.
    fn block_on<T>(
        &self,
        timeout: Option<Duration>,
        mut f: impl FnMut(&mut Inner) -> Option<io::Result<T>>,
    ) -> io::Result<T> {
        let _call = CallGuard::new(&self.shared);
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut idler = Idler::new(self.shared.cfg.idle);
        {
            // Try first: often the data or the buffer space is already there, and one poll
            // (to transmit) is all the call needs.
            let mut g = self.lock();
            if let Some(r) = f(&mut g) {
                g.poll();
                return r;
            }
        }
        loop {
            {
                let mut g = self.lock();
                let moved = g.poll();
                if let Some(r) = f(&mut g) {
                    g.poll();
                    return r;
                }
                if moved {
                    idler.busy();
                    continue;
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timed_out(&self.lock().dev.ep));
            }
            if !idler.step() {
                continue;
            }
            let (set, delay) = {
                let mut g = self.lock();
                let d = g.delay();
                (g.dev.ep.arm_sleep(), d)
            };
            if let Some(set) = set {
                let mut t = delay
                    .unwrap_or(Duration::from_millis(100))
                    .min(Duration::from_millis(100));
                if let Some(d) = deadline {
                    t = t.min(d.saturating_duration_since(Instant::now()));
                }
                set.wait(&[], t.max(Duration::from_micros(50)));
            }
            self.lock().dev.ep.disarm_sleep();
        }
    }

    /// The stack's configuration.
    pub fn config(&self) -> &StackConfig {
        &self.shared.cfg
    }

    /// Runs `f` on the stack's state as one call (the engine stays out of the way).
    pub(crate) fn with_inner<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let _call = CallGuard::new(&self.shared);
        f(&mut self.lock())
    }

    /// Sleeps once on the rings (armed under the lock, waited on outside it), at most `max`.
    pub(crate) fn sleep_once(&self, max: Duration) {
        let (set, delay) = {
            let mut g = self.lock();
            let d = g.delay();
            (g.dev.ep.arm_sleep(), d)
        };
        if let Some(set) = set {
            let t = delay.unwrap_or(max).min(max).max(Duration::from_micros(50));
            set.wait(&[], t);
        }
        self.lock().dev.ep.disarm_sleep();
    }
}

/// The engine thread: keeps TCP going (ACKs, retransmissions, handshakes) while the
/// application is not calling, and exits when the stack is dropped. It never spins. While the
/// application is active (a call in progress, or one started within the last nap) it naps in
/// 10 ms steps without arming the rings, so producers do not kick it and it rarely competes
/// with the caller for its core (1 ms naps put a 1 ms stall at p99.9 of a spinning ping-pong:
/// the woken engine can take the caller's core for a scheduler slice). Once the application has been quiet for a nap, it
/// polls, arms the rings and sleeps until a frame or a timer needs it.
fn engine(shared: Weak<Shared>) {
    const NAP: Duration = Duration::from_millis(10);
    loop {
        let Some(s) = shared.upgrade() else { return };
        let calls = s.calls.load(Ordering::Relaxed);
        drop(s);
        std::thread::sleep(NAP);
        let Some(s) = shared.upgrade() else { return };
        if s.callers.load(Ordering::Acquire) > 0 || s.calls.load(Ordering::Relaxed) != calls {
            continue;
        }
        loop {
            let calls = s.calls.load(Ordering::Relaxed);
            let (moved, set, delay) = {
                let mut g = s.inner.lock().unwrap_or_else(|e| e.into_inner());
                let moved = g.poll();
                let d = g.delay();
                let set = if moved { None } else { g.dev.ep.arm_sleep() };
                (moved, set, d)
            };
            if moved {
                continue;
            }
            if let Some(set) = set {
                let t = delay
                    .unwrap_or(Duration::from_millis(250))
                    .clamp(Duration::from_micros(50), Duration::from_millis(250));
                set.wait(&[], t);
            }
            let active =
                s.callers.load(Ordering::Acquire) > 0 || s.calls.load(Ordering::Relaxed) != calls;
            if !active {
                s.inner
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .dev
                    .ep
                    .disarm_sleep();
                continue;
            }
            // the application is back: leave the rings to it (its own sleeps arm and disarm
            // them) and go back to napping
            break;
        }
    }
}

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
    /// stack's default comes from [`StackConfig::nagle`] (off: request/response latency);
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

/// A UDP socket (std-like).
#[derive(Debug)]
pub struct UdpSocket {
    stack: Stack,
    h: SocketHandle,
    port: u16,
    read_timeout: Option<Duration>,
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
        })
    }

    /// Local address.
    pub fn local_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.stack.ip(), self.port)
    }

    /// Sets the receive timeout.
    pub fn set_read_timeout(&mut self, t: Option<Duration>) {
        self.read_timeout = t;
    }

    /// Sends one datagram (waits while the send buffer is full).
    pub fn send_to(&self, buf: &[u8], to: SocketAddrV4) -> io::Result<usize> {
        let h = self.h;
        let dst = IpEndpoint::new(to_ip(*to.ip()), to.port());
        self.stack.block_on(Some(Duration::from_secs(5)), |g| {
            let s = g.sockets.get_mut::<udp::Socket>(h);
            if !s.can_send() {
                return None;
            }
            Some(
                s.send_slice(buf, dst)
                    .map(|_| buf.len())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string())),
            )
        })
    }

    /// Receives one datagram.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddrV4)> {
        let h = self.h;
        self.stack.block_on(self.read_timeout, |g| {
            let s = g.sockets.get_mut::<udp::Socket>(h);
            if !s.can_recv() {
                return None;
            }
            Some(
                s.recv_slice(buf)
                    .map(|(n, meta)| (n, from_ep(meta.endpoint)))
                    .map_err(|e| io::Error::other(e.to_string())),
            )
        })
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        self.stack.lock().sockets.remove(self.h);
    }
}
