//! A socket as this library keeps it: before it is bound or connected it is a kernel socket
//! (its address decides where it goes); once it goes to DockNet, its descriptor is an eventfd
//! reserved for it and the DockLib socket lives here. Also: where an address goes, what the
//! socket options hold, and readiness as poll bits.

use docknet_lib::{Interest, Ready, TcpListener, TcpStream, UdpSocket, Watch};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// TCP or UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// SOCK_STREAM.
    Tcp,
    /// SOCK_DGRAM.
    Udp,
}

/// Where an address goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// DockNet: the pipe's network (or, for `bind`, the wildcard or the pipe's own address).
    DockNet,
    /// The kernel: loopback, and every address outside the pipe's network.
    Kernel,
}

/// Where a `connect` or `sendto` to `a` goes, for a pipe with address `ip`/`prefix`.
pub fn route_to(a: Ipv4Addr, ip: Ipv4Addr, prefix: u8) -> Route {
    if a.is_loopback() || a.is_unspecified() || a.is_broadcast() || a.is_multicast() {
        return Route::Kernel;
    }
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    if u32::from(a) & mask == u32::from(ip) & mask {
        Route::DockNet
    } else {
        Route::Kernel
    }
}

/// Where traffic to `a` goes: DockNet for the pipe's network and for the services the daemon
/// announced (their addresses lie outside it, as a ClusterIP lies outside the pod network);
/// every other unicast address too when the pipe has a way out (the daemon drives a link) and
/// the container's kernel has no network of its own (a pod whose only network is DockNet);
/// else the kernel.
pub fn route_for(st: &docknet_lib::Stack, a: Ipv4Addr) -> Route {
    match route_to(a, st.ip(), st.prefix()) {
        Route::Kernel if st.is_service(a) => Route::DockNet,
        Route::Kernel
            if docknet_pipe::services::usable(a)
                && st.gateway().is_some()
                && !kernel_has_network() =>
        {
            Route::DockNet
        }
        r => r,
    }
}

/// Whether the container's network namespace routes anything through an interface of its own
/// (a kernel network beside the pipe, as a chained pod's `eth0`): its main routing table
/// (`/proc/net/route`) lists a route through an interface other than `lo`. Read once.
fn kernel_has_network() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::fs::read_to_string("/proc/net/route")
            .map(|t| routes_beyond_lo(&t))
            // unreadable: assume the kernel has a network, as before a gateway existed
            .unwrap_or(true)
    })
}

/// Whether a `/proc/net/route` text lists a route through an interface other than `lo`.
fn routes_beyond_lo(table: &str) -> bool {
    table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .any(|iface| iface != "lo")
}

/// Where a `bind` to `a` goes: the wildcard and the pipe's own address are DockNet's (the
/// container's network namespace has nothing but `lo` besides the pipe).
pub fn route_bind(a: Ipv4Addr, ip: Ipv4Addr) -> Route {
    if a.is_unspecified() || a == ip {
        Route::DockNet
    } else {
        Route::Kernel
    }
}

/// Socket options recorded (applied to the DockLib socket where DockLib has them, and read
/// back by `getsockopt`).
#[derive(Debug, Clone, Default)]
pub struct Opts {
    /// TCP_NODELAY (off by default, as in Linux: Nagle on).
    pub nodelay: bool,
    /// SO_KEEPALIVE.
    pub keepalive: bool,
    /// SO_REUSEADDR.
    pub reuseaddr: bool,
    /// SO_REUSEPORT.
    pub reuseport: bool,
    /// SO_BROADCAST.
    pub broadcast: bool,
    /// SO_RCVBUF as set.
    pub rcvbuf: Option<i32>,
    /// SO_SNDBUF as set.
    pub sndbuf: Option<i32>,
    /// SO_LINGER: `Some(secs)` when on (0: close resets the connection).
    pub linger: Option<i32>,
    /// SO_RCVTIMEO.
    pub rcvtimeo: Option<Duration>,
    /// SO_SNDTIMEO.
    pub sndtimeo: Option<Duration>,
    /// Other options accepted and recorded as set: (level, name) -> value.
    pub other: Vec<((i32, i32), i32)>,
}

/// A UDP socket on DockNet.
#[derive(Debug)]
pub struct Udp {
    /// The DockLib socket.
    pub sock: UdpSocket,
    /// The address bound (the wildcard or the pipe's).
    pub bound_ip: Ipv4Addr,
    /// The peer of a connected UDP socket.
    pub peer: Mutex<Option<SocketAddrV4>>,
}

/// What a socket on DockNet is.
#[derive(Debug)]
pub enum Conn {
    /// A connection (or one being made).
    Stream(TcpStream),
    /// A listener, with the address it was bound to (the wildcard or the pipe's).
    Listener(TcpListener, Ipv4Addr),
    /// A UDP socket.
    Udp(Udp),
}

/// Before the socket is a connection, listener or UDP socket.
#[derive(Debug, Default)]
pub struct Pre {
    /// The descriptor is ours (an eventfd) rather than the kernel socket.
    pub adopted: bool,
    /// The TCP address bound (on DockNet) before `listen`.
    pub bound: Option<SocketAddrV4>,
}

/// One socket, shared by every descriptor that refers to it (after `dup`).
#[derive(Debug)]
pub struct Sock {
    /// Unique for the process's life (an epoll member names its socket by it).
    pub id: u64,
    /// TCP or UDP.
    pub proto: Proto,
    /// Set once the socket is on DockNet; never changes after.
    pub conn: OnceLock<Conn>,
    /// State before `conn`.
    pub pre: Mutex<Pre>,
    /// O_NONBLOCK.
    pub nonblock: AtomicBool,
    /// Options.
    pub opts: Mutex<Opts>,
    /// shutdown(SHUT_WR) was called.
    pub shut_wr: AtomicBool,
    /// A non-blocking connect is (or was) in progress and has not been seen to succeed.
    pub connecting: AtomicBool,
    /// The connection has been seen established (a later error is a reset, not a refusal).
    pub established: AtomicBool,
    /// The socket's pending error (a refusal or a reset) has been reported once (by
    /// SO_ERROR or a failed call); Linux reports it once, then end of stream / EPIPE.
    pub err_taken: AtomicBool,
    /// Counts read-side calls (read, recv, accept): an edge-triggered epoll member reports
    /// again only after one.
    pub rd_gen: AtomicU32,
    /// Counts write-side calls.
    pub wr_gen: AtomicU32,
    /// Descriptors that refer to it (the table's entries). A socket with none is closed, as
    /// far as the program is concerned, even while a waiter (the notifier, an epoll wait in
    /// progress) still holds it: it leaves every epoll set at once.
    pub descriptors: AtomicU32,
    /// Forked children that may still take this connection over (see `relay`): while one may,
    /// the last `close` here does not end it.
    pub forks: AtomicU32,
}

impl Sock {
    /// A new socket, not yet bound or connected.
    pub fn new(proto: Proto, nonblock: bool) -> Sock {
        Sock {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            proto,
            conn: OnceLock::new(),
            pre: Mutex::new(Pre::default()),
            nonblock: AtomicBool::new(nonblock),
            opts: Mutex::new(Opts::default()),
            shut_wr: AtomicBool::new(false),
            connecting: AtomicBool::new(false),
            established: AtomicBool::new(false),
            err_taken: AtomicBool::new(false),
            rd_gen: AtomicU32::new(0),
            wr_gen: AtomicU32::new(0),
            descriptors: AtomicU32::new(0),
            forks: AtomicU32::new(0),
        }
    }

    /// Whether a descriptor still refers to it.
    pub fn open(&self) -> bool {
        self.descriptors.load(Ordering::Acquire) > 0
    }

    /// Shuts down the write side of its connection `t` (sends FIN), once whoever asks.
    pub fn shut_write(&self, t: &TcpStream) {
        if !self.shut_wr.swap(true, Ordering::Relaxed) {
            t.shutdown_write();
        }
    }

    /// A socket that is already `conn` (an accepted connection).
    pub fn with_conn(proto: Proto, nonblock: bool, conn: Conn) -> Sock {
        let s = Sock::new(proto, nonblock);
        let _ = s.conn.set(conn);
        s.pre().adopted = true;
        s.established.store(true, Ordering::Relaxed);
        s
    }

    /// The pre-connection state, locked.
    pub fn pre(&self) -> MutexGuard<'_, Pre> {
        self.pre.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The options, locked.
    pub fn opts(&self) -> MutexGuard<'_, Opts> {
        self.opts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the descriptor is DockNet's (an eventfd), not a kernel socket.
    pub fn adopted(&self) -> bool {
        self.conn.get().is_some() || self.pre().adopted
    }

    /// Whether the socket is non-blocking for this call (`MSG_DONTWAIT` in `flags`).
    pub fn nonblocking(&self, flags: i32) -> bool {
        self.nonblock.load(Ordering::Relaxed) || flags & libc::MSG_DONTWAIT != 0
    }

    /// What to watch for `events` (poll/epoll bits), or `None` when the socket is not (yet)
    /// on DockNet.
    pub fn watch(&self, events: u32) -> Option<Watch<'_>> {
        let i = Interest {
            read: events
                & (libc::POLLIN | libc::POLLPRI | libc::POLLRDNORM | libc::POLLRDHUP) as u32
                != 0,
            write: events & (libc::POLLOUT | libc::POLLWRNORM) as u32 != 0,
        };
        Some(match self.conn.get()? {
            Conn::Stream(s) => Watch::Stream(s, i),
            Conn::Listener(l, _) => Watch::Listener(l),
            Conn::Udp(u) => Watch::Udp(&u.sock, i),
        })
    }

    /// Poll bits for `r` (what DockLib says the socket is ready for).
    pub fn bits(&self, r: Ready) -> u32 {
        if r.write && !r.error {
            self.established.store(true, Ordering::Relaxed);
        }
        poll_bits(
            r,
            self.shut_wr.load(Ordering::Relaxed),
            self.err_taken.load(Ordering::Relaxed),
        )
    }

    /// Whether it is a listening socket.
    pub fn is_listener(&self) -> bool {
        matches!(self.conn.get(), Some(Conn::Listener(..)))
    }

    /// Poll bits of a socket adopted but neither connected nor listening (bound only): as
    /// Linux reports an unconnected TCP socket.
    pub fn idle_bits(&self) -> u32 {
        (libc::POLLOUT | libc::POLLWRNORM | libc::POLLHUP) as u32
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        if crate::ops::forked() {
            // the stack belongs to the parent: touching it from the child would corrupt the
            // rings both processes map; the child only lets go of the memory
            if let Some(c) = self.conn.take() {
                std::mem::forget(c);
            }
            return;
        }
        let linger0 = self.opts().linger == Some(0);
        match self.conn.get() {
            Some(Conn::Stream(s)) if linger0 => s.abort_ref(),
            Some(Conn::Listener(l, _)) => crate::ops::release_port(l.port()),
            _ => {}
        }
        if self.conn.get().is_none() {
            if let Some(b) = self.pre().bound {
                crate::ops::release_port(b.port());
            }
        }
    }
}

/// Poll bits (POLLIN, ...; the same values as EPOLLIN, ...) for readiness `r` of a socket
/// whose write side is shut down (`shut_wr`) and whose error was already reported once
/// (`err_taken`), as Linux's `tcp_poll` sets them.
pub fn poll_bits(r: Ready, shut_wr: bool, err_taken: bool) -> u32 {
    let mut m = 0;
    if r.read {
        m |= libc::POLLIN | libc::POLLRDNORM;
    }
    if r.hup {
        m |= libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP;
    }
    if r.write {
        m |= libc::POLLOUT | libc::POLLWRNORM;
    }
    if r.error {
        m |= libc::POLLHUP;
        if !err_taken {
            m |= libc::POLLERR;
        }
    }
    if r.hup && shut_wr {
        m |= libc::POLLHUP;
    }
    m as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let ip = Ipv4Addr::new(10, 0, 0, 2);
        assert_eq!(route_to(Ipv4Addr::new(10, 0, 0, 3), ip, 24), Route::DockNet);
        assert_eq!(route_to(Ipv4Addr::new(10, 0, 1, 3), ip, 24), Route::Kernel);
        assert_eq!(route_to(Ipv4Addr::new(10, 0, 1, 3), ip, 16), Route::DockNet);
        assert_eq!(route_to(Ipv4Addr::LOCALHOST, ip, 24), Route::Kernel);
        assert_eq!(route_to(Ipv4Addr::new(127, 0, 0, 53), ip, 8), Route::Kernel);
        assert_eq!(route_to(Ipv4Addr::UNSPECIFIED, ip, 24), Route::Kernel);
        assert_eq!(route_to(Ipv4Addr::new(8, 8, 8, 8), ip, 0), Route::DockNet);
        assert_eq!(route_bind(Ipv4Addr::UNSPECIFIED, ip), Route::DockNet);
        assert_eq!(route_bind(ip, ip), Route::DockNet);
        assert_eq!(route_bind(Ipv4Addr::LOCALHOST, ip), Route::Kernel);
        assert_eq!(route_bind(Ipv4Addr::new(10, 0, 0, 9), ip), Route::Kernel);
    }

    #[test]
    fn a_kernel_network_is_a_route_through_an_interface_of_its_own() {
        let head =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";
        assert!(!routes_beyond_lo(head));
        assert!(!routes_beyond_lo(""));
        let lo = format!("{head}lo\t0000007F\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n");
        assert!(!routes_beyond_lo(&lo));
        let eth = format!("{lo}eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n");
        assert!(routes_beyond_lo(&eth));
    }

    #[test]
    fn poll_bits_follow_tcp_poll() {
        let r = |read, write, hup, error| Ready {
            read,
            write,
            hup,
            error,
        };
        let (pin, pout) = (
            (libc::POLLIN | libc::POLLRDNORM) as u32,
            (libc::POLLOUT | libc::POLLWRNORM) as u32,
        );
        let (rdhup, hup, err) = (
            libc::POLLRDHUP as u32,
            libc::POLLHUP as u32,
            libc::POLLERR as u32,
        );
        assert_eq!(poll_bits(r(false, false, false, false), false, false), 0);
        assert_eq!(
            poll_bits(r(true, true, false, false), false, false),
            pin | pout
        );
        // the peer's FIN: readable (end of stream) and RDHUP; HUP once we shut down too
        assert_eq!(
            poll_bits(r(true, true, true, false), false, false),
            pin | pout | rdhup
        );
        assert_eq!(
            poll_bits(r(true, true, true, false), true, false),
            pin | pout | rdhup | hup
        );
        // refused or reset: everything, ERR until reported once
        assert_eq!(
            poll_bits(r(true, true, true, true), false, false),
            pin | pout | rdhup | hup | err
        );
        assert_eq!(
            poll_bits(r(true, true, true, true), false, true),
            pin | pout | rdhup | hup
        );
    }
}
