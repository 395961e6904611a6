//! The socket calls on DockNet sockets, in safe code. Each returns `None` when the call is
//! not DockNet's (the entry point then passes it to libc unchanged) or `Some(result)`, the
//! error being the errno Linux gives.

use crate::errno::{self, Op};
use crate::event::Epoll;
pub(crate) use crate::family::relayed;
use crate::family::{self, may_attach, unforked_if_nothing_attached, FORKED};
pub use crate::family::{
    before_dup, dormant_listener, forked, inherited, inherited_error, take_for,
};
pub use crate::opts::{fcntl_flags, getsockopt, ioctl, sendfile, setsockopt, OptVal};
use crate::sig;
use crate::sock::{route_bind, route_for, Conn, Proto, Route, Sock, Udp};
use crate::sys::{self, Errno, R};
use crate::table::{Entry, Table};
use docknet_lib::{Stack, StackConfig, TcpListener, TcpStream, UdpSocket};
use std::collections::HashSet;
use std::io::{self, ErrorKind};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

static ENABLED: AtomicBool = AtomicBool::new(false);
pub(crate) static STACK: OnceLock<Option<Stack>> = OnceLock::new();
static IDLE: OnceLock<docknet_pipe::IdlePolicy> = OnceLock::new();
static PORTS: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
static LOGGED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// The descriptor table.
pub static TABLE: LazyLock<Table> = LazyLock::new(Table::new);

/// Called by the library's constructor: reads `DOCKNET_PRELOAD` and registers the fork
/// handler.
pub fn init() {
    let off = matches!(
        std::env::var("DOCKNET_PRELOAD").as_deref(),
        Ok("off") | Ok("0") | Ok("false") | Ok("no")
    );
    LazyLock::force(&TABLE);
    family::init();
    ENABLED.store(!off, Ordering::Release);
}

/// Whether the library is enabled at all (`DOCKNET_PRELOAD` not off).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether the library takes new sockets (enabled, and the pipe's stack is this process's to
/// use, or no process of its family attached one before this one was forked).
pub fn active() -> bool {
    if !ENABLED.load(Ordering::Relaxed) {
        return false;
    }
    unforked_if_nothing_attached();
    !forked()
}

/// One line on stderr, once per distinct message.
pub fn log_once(msg: &str) {
    let mut g = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    if g.get_or_insert_with(HashSet::new).insert(msg.to_string()) {
        sys::log_line(msg);
    }
}

/// Logs an unsupported call on a DockNet socket and returns its errno.
pub fn unsupported(what: &str, e: Errno) -> Errno {
    log_once(&format!("{what} is not supported on a DockNet socket"));
    e
}

/// The process's stack, attached at the first AF_INET socket; `None` when there is no pipe
/// (every socket then stays the kernel's).
pub fn stack() -> Option<&'static Stack> {
    STACK
        .get_or_init(|| {
            let cfg = StackConfig {
                idle: idle_policy(),
                ..StackConfig::default()
            };
            if let Err(p) = may_attach() {
                log_once(&format!(
                    "sockets stay the kernel's: process {p}, of this process's family (fork), \
                     uses the pipe; one process per pipe uses DockNet at a time"
                ));
                return None;
            }
            // the engine thread DockLib starts must not take the program's signals
            let old = sys::block_all_signals();
            let r = Stack::attach_default(cfg);
            sys::sigmask_set(old.as_ref());
            match r {
                Ok(s) => Some(s),
                Err(e) => {
                    log_once(&format!("sockets stay the kernel's: {e}"));
                    None
                }
            }
        })
        .as_ref()
}

/// The idle policy of waits (`DOCKNET_IDLE`, default adaptive).
pub fn idle_policy() -> docknet_pipe::IdlePolicy {
    *IDLE.get_or_init(|| match std::env::var("DOCKNET_IDLE") {
        Ok(s) => docknet_pipe::IdlePolicy::parse(&s).unwrap_or_else(|e| {
            log_once(&format!("DOCKNET_IDLE: {e}"));
            docknet_pipe::IdlePolicy::ADAPTIVE
        }),
        Err(_) => docknet_pipe::IdlePolicy::ADAPTIVE,
    })
}

/// The stack, once attached (never attaches).
pub fn stack_if_attached() -> Option<&'static Stack> {
    STACK.get().and_then(Option::as_ref)
}

fn ports<T>(f: impl FnOnce(&mut HashSet<u16>) -> T) -> T {
    let mut g = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashSet::new))
}

/// Frees a TCP port bound on DockNet.
pub fn release_port(p: u16) {
    ports(|s| s.remove(&p));
}

fn take_port(p: u16) -> R<u16> {
    ports(|s| {
        if p == 0 {
            // an ephemeral port nobody holds
            for _ in 0..16_000 {
                let c = 49152 + (rand16() % 16_000);
                if s.insert(c) {
                    return Ok(c);
                }
            }
            return Err(libc::EADDRINUSE);
        }
        if s.insert(p) {
            Ok(p)
        } else {
            Err(libc::EADDRINUSE)
        }
    })
}

fn rand16() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u16
}

/// The socket at `fd` for an operation. `None`: not DockNet's, the kernel's call (in a forked
/// child also a socket still undecided: the child's sockets are the kernel's). `Err`: a DockNet
/// socket a forked child inherited, which it must not drive (see [`inherited`]).
pub(crate) fn sock(fd: i32) -> Option<R<Arc<Sock>>> {
    take_for(fd);
    let s = TABLE.sock(fd)?;
    if !forked() {
        return Some(Ok(s));
    }
    s.adopted().then(|| Err(inherited_error()))
}

/// The socket at `fd` for an operation, or a return from the calling operation: with `None`
/// (the kernel's call) or with the error of an inherited socket.
macro_rules! ours {
    ($fd:expr) => {
        match sock($fd)? {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        }
    };
}
pub(crate) use ours;

// ---------------------------------------------------------------------------------------
// creation, addresses

/// `socket(2)`: an AF_INET TCP or UDP socket is recorded (it stays the kernel socket until
/// an address decides); everything else is not ours.
pub fn socket_created(fd: i32, domain: i32, ty: i32, proto: i32) {
    if !active() || domain != libc::AF_INET || fd < 0 {
        return;
    }
    let p = match (ty & 0xf, proto) {
        (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => Proto::Tcp,
        (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => Proto::Udp,
        _ => return,
    };
    if stack().is_none() {
        return;
    }
    let s = Sock::new(p, ty & libc::SOCK_NONBLOCK != 0);
    TABLE.insert(fd, Entry::Sock(Arc::new(s)));
}

/// Replaces the kernel socket at `fd` by an eventfd of ours (keeping close-on-exec).
fn adopt(fd: i32, s: &Sock) -> R<()> {
    let mut pre = s.pre();
    if pre.adopted {
        return Ok(());
    }
    let cloexec = sys::fcntl_int(fd, libc::F_GETFD, 0)? & libc::FD_CLOEXEC != 0;
    let e = sys::eventfd(true)?;
    let r = sys::dup3(e, fd, cloexec);
    let _ = sys::close(e);
    r?;
    pre.adopted = true;
    Ok(())
}

/// The socket goes to the kernel: forget it (its descriptor is the kernel socket).
fn to_kernel(fd: i32, s: &Arc<Sock>) {
    if let Some(Entry::Sock(t)) = TABLE.get(fd) {
        if t.id == s.id {
            drop(TABLE.remove(fd));
        }
    }
}

fn v4(addr: Option<SocketAddrV4>) -> R<SocketAddrV4> {
    addr.ok_or(libc::EAFNOSUPPORT)
}

/// `bind(2)`. `addr`: the address if it is AF_INET (`None`: another family).
pub fn bind(fd: i32, addr: Option<SocketAddrV4>) -> Option<R<()>> {
    let s = ours!(fd);
    if s.adopted() {
        return Some(Err(libc::EINVAL));
    }
    let a = match v4(addr) {
        Ok(a) => a,
        Err(e) => return Some(Err(e)),
    };
    let st = stack()?;
    if route_bind(*a.ip(), st.ip()) == Route::Kernel {
        to_kernel(fd, &s);
        return None;
    }
    Some(bind_docknet(fd, &s, st, a))
}

fn bind_docknet(fd: i32, s: &Sock, st: &Stack, a: SocketAddrV4) -> R<()> {
    match s.proto {
        Proto::Tcp => {
            let port = take_port(a.port())?;
            if let Err(e) = adopt(fd, s) {
                release_port(port);
                return Err(e);
            }
            s.pre().bound = Some(SocketAddrV4::new(*a.ip(), port));
            Ok(())
        }
        Proto::Udp => {
            let u = UdpSocket::bind(st, a.port()).map_err(|e| errno::of(&e, Op::Bind))?;
            adopt(fd, s)?;
            let _ = s.conn.set(Conn::Udp(Udp {
                sock: u,
                bound_ip: *a.ip(),
                peer: Mutex::new(None),
            }));
            Ok(())
        }
    }
}

/// `listen(2)`.
pub fn listen(fd: i32) -> Option<R<()>> {
    let s = ours!(fd);
    if s.proto == Proto::Udp {
        return if s.adopted() {
            Some(Err(libc::EOPNOTSUPP))
        } else {
            None
        };
    }
    match s.conn.get() {
        Some(Conn::Listener(..)) => return Some(Ok(())),
        Some(_) => return Some(Err(libc::EINVAL)),
        None => {}
    }
    let st = stack()?;
    let bound = s.pre().bound;
    let a = match bound {
        Some(a) => a,
        // listen on an unbound socket binds the wildcard and an ephemeral port
        None => match bind_docknet(fd, &s, st, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)) {
            Ok(()) => s
                .pre()
                .bound
                .unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
            Err(e) => return Some(Err(e)),
        },
    };
    let l = match TcpListener::bind(st, a.port()) {
        Ok(l) => l,
        Err(e) => return Some(Err(errno::of(&e, Op::Bind))),
    };
    let _ = s.conn.set(Conn::Listener(l, *a.ip()));
    s.pre().bound = None; // the listener holds the port now
    Some(Ok(()))
}

/// `connect(2)`. `addr`: `Some(Some(a))` AF_INET, `Some(None)` AF_UNSPEC, `None` other.
pub fn connect(fd: i32, addr: Option<Option<SocketAddrV4>>) -> Option<R<()>> {
    let s = ours!(fd);
    if let Some(c) = s.conn.get() {
        return Some(connect_again(&s, c, addr));
    }
    let a = match addr {
        Some(Some(a)) => a,
        Some(None) if !s.adopted() => return None,
        Some(None) => return Some(Ok(())),
        None => return Some(Err(libc::EAFNOSUPPORT)),
    };
    let st = stack()?;
    if route_for(st, *a.ip()) == Route::Kernel {
        if s.adopted() {
            // bound on DockNet, so it cannot reach the kernel's addresses
            return Some(Err(libc::ENETUNREACH));
        }
        to_kernel(fd, &s);
        return None;
    }
    if let Err(e) = adopt(fd, &s) {
        return Some(Err(e));
    }
    match s.proto {
        Proto::Udp => {
            let u = match UdpSocket::bind(st, 0) {
                Ok(u) => u,
                Err(e) => return Some(Err(errno::of(&e, Op::Bind))),
            };
            let _ = s.conn.set(Conn::Udp(Udp {
                sock: u,
                bound_ip: Ipv4Addr::UNSPECIFIED,
                peer: Mutex::new(Some(a)),
            }));
            Some(Ok(()))
        }
        Proto::Tcp => {
            // a port bound before the connect is the connection's, as in Linux (the
            // reservation goes: the connection holds the port in the stack from now on)
            let from = s.pre().bound.take().map(|b| {
                release_port(b.port());
                b.port()
            });
            let nonblock = s.nonblocking(0);
            let started = match from {
                Some(port) => TcpStream::connect_start_from(st, port, a),
                None => TcpStream::connect_start(st, a),
            };
            let t = match started {
                Ok(t) => t,
                Err(e) => return Some(Err(errno::of(&e, Op::Connect))),
            };
            apply_stream_opts(&s, &t);
            let _ = s.conn.set(Conn::Stream(t));
            s.connecting.store(true, Ordering::Relaxed);
            if nonblock {
                return Some(Err(libc::EINPROGRESS));
            }
            let Some(Conn::Stream(t)) = s.conn.get() else {
                return Some(Err(libc::EIO));
            };
            let limit = Some(st.config().connect_timeout);
            let r = blocking(&s, libc::POLLOUT as u32, limit, false, || {
                t.connect_result()
                    .unwrap_or(Err(io::Error::from(ErrorKind::WouldBlock)))
            });
            Some(match r {
                Ok(()) => {
                    s.connecting.store(false, Ordering::Relaxed);
                    s.established.store(true, Ordering::Relaxed);
                    Ok(())
                }
                // interrupted: the connection goes on being made (EALREADY, then EISCONN)
                Err(e) if e.kind() == ErrorKind::Interrupted => Err(libc::EINTR),
                Err(e) if e.kind() == ErrorKind::WouldBlock => Err(libc::ETIMEDOUT),
                Err(e) => {
                    s.err_taken.store(true, Ordering::Relaxed);
                    Err(errno::of(&e, Op::Connect))
                }
            })
        }
    }
}

fn connect_again(s: &Sock, c: &Conn, addr: Option<Option<SocketAddrV4>>) -> R<()> {
    match c {
        Conn::Udp(u) => {
            *u.peer.lock().unwrap_or_else(|e| e.into_inner()) = addr.flatten();
            Ok(())
        }
        Conn::Listener(..) => Err(libc::EINVAL),
        Conn::Stream(t) => match t.connect_result() {
            None => Err(libc::EALREADY),
            // the first connect after a non-blocking one completed returns 0, as in Linux
            Some(Ok(())) => {
                s.established.store(true, Ordering::Relaxed);
                if s.connecting.swap(false, Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err(libc::EISCONN)
                }
            }
            Some(Err(e)) => {
                if s.err_taken.swap(true, Ordering::Relaxed) {
                    Err(libc::ECONNABORTED)
                } else {
                    Err(errno::of(&e, Op::Connect))
                }
            }
        },
    }
}

fn apply_stream_opts(s: &Sock, t: &TcpStream) {
    let o = s.opts();
    t.set_nodelay(o.nodelay);
    if o.keepalive {
        t.set_keepalive(Some(Duration::from_secs(7200)));
    }
}

/// `accept4(2)`: the new connection's descriptor and its peer.
pub fn accept(fd: i32, flags: i32) -> Option<R<(i32, SocketAddrV4)>> {
    if dormant_listener(fd) {
        // another process took the stack (a sibling worker): no connection ever comes here
        return Some(Err(match TABLE.sock(fd) {
            Some(s) if !s.nonblocking(0) => sys::pause_for_signal(),
            _ => libc::EAGAIN,
        }));
    }
    // (a forked worker's first use of its listener, in the look above, may have adopted it:
    // see `share`)
    if let Some(r) = crate::share::accept(fd, flags) {
        return Some(r);
    }
    let s = ours!(fd);
    crate::share::accepting();
    let Some(Conn::Listener(l, _)) = s.conn.get() else {
        return if s.adopted() {
            Some(Err(libc::EINVAL))
        } else {
            None
        };
    };
    s.rd_gen.fetch_add(1, Ordering::Relaxed);
    let r = if s.nonblocking(0) {
        l.try_accept()
    } else {
        let t = s.opts().rcvtimeo;
        blocking(&s, libc::POLLIN as u32, t, t.is_some(), || l.try_accept())
    };
    let (t, peer) = match r {
        Ok(x) => x,
        Err(e) => return Some(Err(errno::of(&e, Op::Io))),
    };
    let n = accepted(&s, t, flags & libc::SOCK_NONBLOCK != 0);
    let nfd = match sys::eventfd(flags & libc::SOCK_CLOEXEC != 0) {
        Ok(x) => x,
        Err(e) => return Some(Err(e)),
    };
    TABLE.insert(nfd, Entry::Sock(Arc::new(n)));
    Some(Ok((nfd, as_v4(peer))))
}

/// The socket of a connection `t` accepted from the listener `l`: as in Linux, it inherits
/// TCP_NODELAY and SO_KEEPALIVE, not O_NONBLOCK (`nonblock` is the accept's own flag).
pub(crate) fn accepted(l: &Sock, t: TcpStream, nonblock: bool) -> Sock {
    let inherited = l.opts().clone();
    let n = Sock::with_conn(Proto::Tcp, nonblock, Conn::Stream(t));
    *n.opts() = crate::sock::Opts {
        nodelay: inherited.nodelay,
        keepalive: inherited.keepalive,
        ..Default::default()
    };
    if let Some(Conn::Stream(t)) = n.conn.get() {
        apply_stream_opts(&n, t);
    }
    n
}

/// An address as an AF_INET socket can report it. A wildcard listener on a dual-stack pipe
/// takes IPv6 clients too; their addresses (unless IPv4-mapped) have no AF_INET form and are
/// reported as `0.0.0.0` with their port.
pub(crate) fn as_v4(a: std::net::SocketAddr) -> SocketAddrV4 {
    match a {
        std::net::SocketAddr::V4(v) => v,
        std::net::SocketAddr::V6(v) => SocketAddrV4::new(
            v.ip().to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
            v.port(),
        ),
    }
}

/// `getsockname(2)`.
pub fn local_name(fd: i32) -> Option<R<SocketAddrV4>> {
    if let Some(r) = relayed(fd) {
        return Some(Ok(r.local));
    }
    let s = ours!(fd);
    let st = stack_if_attached()?;
    Some(match s.conn.get() {
        Some(Conn::Stream(t)) => Ok(t
            .local_addr()
            .map_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), as_v4)),
        Some(Conn::Listener(l, ip)) => Ok(SocketAddrV4::new(*ip, l.port())),
        Some(Conn::Udp(u)) => {
            let ip = if u.peer.lock().map(|p| p.is_some()).unwrap_or(false) {
                st.ip()
            } else {
                u.bound_ip
            };
            Ok(SocketAddrV4::new(ip, u.sock.local_addr().port()))
        }
        None => match s.pre().bound {
            Some(b) => Ok(b),
            None if s.adopted() => Ok(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
            None => return None,
        },
    })
}

/// `getpeername(2)`.
pub fn peer_name(fd: i32) -> Option<R<SocketAddrV4>> {
    if let Some(r) = relayed(fd) {
        return Some(if r.listening {
            Err(libc::ENOTCONN)
        } else {
            Ok(r.peer)
        });
    }
    let s = ours!(fd);
    Some(match s.conn.get() {
        Some(Conn::Stream(t)) => match t.connect_result() {
            Some(Ok(())) => t.peer_addr().map(as_v4).ok_or(libc::ENOTCONN),
            _ => Err(libc::ENOTCONN),
        },
        Some(Conn::Udp(u)) => u.peer.lock().ok().and_then(|p| *p).ok_or(libc::ENOTCONN),
        Some(Conn::Listener(..)) => Err(libc::ENOTCONN),
        None if s.adopted() => Err(libc::ENOTCONN),
        None => return None,
    })
}

// ---------------------------------------------------------------------------------------
// data

fn stream_err(s: &Sock, e: io::Error, write: bool, flags: i32) -> Errno {
    let k = e.kind();
    if matches!(k, ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused) {
        // reported once; afterwards the connection reads as ended and writes as broken
        if s.err_taken.swap(true, Ordering::Relaxed) {
            if write {
                if flags & libc::MSG_NOSIGNAL == 0 {
                    sys::raise_sigpipe();
                }
                return libc::EPIPE;
            }
            return 0;
        }
        if s.established.load(Ordering::Relaxed) {
            return libc::ECONNRESET;
        }
        return libc::ECONNREFUSED;
    }
    if write && k == ErrorKind::BrokenPipe && flags & libc::MSG_NOSIGNAL == 0 {
        sys::raise_sigpipe();
    }
    errno::of(&e, Op::Io)
}

/// `recvfrom(2)` and friends: bytes read into `buf`, the datagram's whole length (UDP) and
/// the sender.
pub fn recv(
    fd: i32,
    buf: &mut [u8],
    flags: i32,
) -> Option<R<(usize, usize, Option<SocketAddrV4>)>> {
    let s = match sock(fd) {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Some(Err(e)),
        // a listener adopted from the worker that drives the stack: its Unix socket carries
        // the connections handed over, which a read must not take
        None if is_shared_listener(fd) => return Some(Err(libc::ENOTCONN)),
        None => return None,
    };
    let Some(c) = s.conn.get() else {
        return if s.adopted() {
            Some(Err(libc::ENOTCONN))
        } else {
            None
        };
    };
    if flags & libc::MSG_OOB != 0 {
        return Some(Err(unsupported("MSG_OOB", libc::EOPNOTSUPP)));
    }
    s.rd_gen.fetch_add(1, Ordering::Relaxed);
    let nonblock = s.nonblocking(flags);
    let peek = flags & libc::MSG_PEEK != 0;
    Some(match c {
        Conn::Listener(..) => Err(libc::ENOTCONN),
        Conn::Stream(t) => {
            let to = s.opts().rcvtimeo;
            let pin = libc::POLLIN as u32;
            let r = if nonblock {
                if peek {
                    t.try_peek(buf)
                } else {
                    t.try_read(buf)
                }
            } else if peek {
                blocking(&s, pin, to, to.is_some(), || t.try_peek(buf))
            } else if flags & libc::MSG_WAITALL != 0 {
                read_all(&s, t, buf, to)
            } else {
                read_blocking(t, buf, to)
            };
            match r {
                Ok(n) => {
                    if n > 0 {
                        s.established.store(true, Ordering::Relaxed);
                    }
                    Ok((n, n, None))
                }
                Err(e) => match stream_err(&s, e, false, flags) {
                    0 => Ok((0, 0, None)),
                    n => Err(n),
                },
            }
        }
        Conn::Udp(u) => {
            let peer = *u.peer.lock().unwrap_or_else(|e| e.into_inner());
            let to = s.opts().rcvtimeo;
            let mut once = || loop {
                let (n, whole, from) = u.sock.try_recv_msg(buf, peek)?;
                let from = as_v4(from);
                match peer {
                    // a connected UDP socket hears only its peer
                    Some(p) if p != from => {
                        if peek {
                            let _ = u.sock.try_recv_msg(&mut [], false);
                        }
                        continue;
                    }
                    _ => return Ok((n, whole, Some(from))),
                }
            };
            if nonblock {
                once()
            } else {
                blocking(&s, libc::POLLIN as u32, to, to.is_some(), once)
            }
            .map_err(|e| errno::of(&e, Op::Io))
        }
    })
}

fn read_all(s: &Sock, t: &TcpStream, buf: &mut [u8], to: Option<Duration>) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let rest = &mut buf[got..];
        match blocking(s, libc::POLLIN as u32, to, to.is_some(), || {
            t.try_read(rest)
        }) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(_) if got > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A blocking read of a stream: waits in DockLib's read itself
/// ([`TcpStream::read_wakeable`]), not in a readiness wait followed by a read; a signal ends
/// it as it ends [`blocking`], and `shutdown(SHUT_RD)` (from another thread) with end of
/// stream once what had arrived is read, as in Linux (DockLib's read sees the shutdown).
fn read_blocking(t: &TcpStream, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<usize> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    // the token before the look at the mark, each time: a signal that comes between is seen
    // by the one or wakes the wait
    let mut token = sig::SIG_WAKER.token();
    let mut mark = sig::mark();
    loop {
        let left = time_left(deadline)?;
        match t.read_wakeable(buf, left, &[(&sig::SIG_WAKER, token)]) {
            // woken: by a handler of this thread (below), or one of another thread's
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::TimedOut => {
                return Err(io::Error::from(ErrorKind::WouldBlock))
            }
            r => return r,
        }
        token = sig::SIG_WAKER.token();
        after_handler(&mut mark, timeout.is_some())?;
    }
}

/// What a blocked call does once woken: when a handler ran on this thread since `mark`, it
/// ends with `Interrupted` unless the handler has `SA_RESTART` and the socket no timeout
/// (`timed`), as in Linux; otherwise the handler runs now, before the call waits again, as the
/// kernel runs it.
fn after_handler(mark: &mut sig::Mark, timed: bool) -> io::Result<()> {
    if let Some(restart) = mark.take() {
        if !restart || timed {
            return Err(io::Error::from(ErrorKind::Interrupted));
        }
        sig::safe_point();
    }
    Ok(())
}

/// What is left of a blocked call's time (`None`: no limit), or `WouldBlock` when it is up.
fn time_left(deadline: Option<std::time::Instant>) -> io::Result<Option<Duration>> {
    match deadline {
        None => Ok(None),
        Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
            Some(l) if !l.is_zero() => Ok(Some(l)),
            _ => Err(io::Error::from(ErrorKind::WouldBlock)),
        },
    }
}

/// A blocking call: runs `op` until it does not fail with `WouldBlock`, waiting between tries
/// until `s` is ready for `events` (poll bits), at most `timeout` (then `WouldBlock`). A signal
/// handler that runs on this thread meanwhile ends it with `Interrupted` unless the handler
/// has `SA_RESTART` and the socket no timeout (`timed`), as in Linux.
fn blocking<T>(
    s: &Sock,
    events: u32,
    timeout: Option<Duration>,
    timed: bool,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    let mut mark = sig::mark();
    let mut out = Vec::new();
    loop {
        let token = sig::SIG_WAKER.token();
        match op() {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            r => return r,
        }
        after_handler(&mut mark, timed)?;
        let left = time_left(deadline)?;
        let Some(st) = stack_if_attached() else {
            return Err(io::Error::from(ErrorKind::NotConnected));
        };
        let Some(w) = s.watch(events) else {
            return Err(io::Error::from(ErrorKind::NotConnected));
        };
        st.wait_wakeable(&[w], left, &[(&sig::SIG_WAKER, token)], &mut out)?;
    }
}

/// `sendto(2)` and friends: bytes taken from `buf`. `to`: the destination given, if any.
pub fn send(fd: i32, buf: &[u8], flags: i32, to: Option<SocketAddrV4>) -> Option<R<usize>> {
    let s = match sock(fd) {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Some(Err(e)),
        None if is_shared_listener(fd) => return Some(Err(listener_send(flags))),
        None => return None,
    };
    let c = match s.conn.get() {
        Some(c) => c,
        None if s.proto == Proto::Udp && to.is_some() => {
            // an unbound UDP socket sending: its destination decides where it goes
            let a = to?;
            let st = stack()?;
            if route_for(st, *a.ip()) == Route::Kernel {
                if s.adopted() {
                    return Some(Err(libc::ENETUNREACH));
                }
                to_kernel(fd, &s);
                return None;
            }
            if let Err(e) = bind_docknet(fd, &s, st, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)) {
                return Some(Err(e));
            }
            s.conn.get()?
        }
        None if s.adopted() => return Some(Err(libc::ENOTCONN)),
        None => return None,
    };
    s.wr_gen.fetch_add(1, Ordering::Relaxed);
    let nonblock = s.nonblocking(flags);
    Some(match c {
        Conn::Listener(..) => Err(listener_send(flags)),
        Conn::Stream(t) => {
            if s.shut_wr.load(Ordering::Relaxed) {
                if flags & libc::MSG_NOSIGNAL == 0 {
                    sys::raise_sigpipe();
                }
                return Some(Err(libc::EPIPE));
            }
            if nonblock {
                t.try_write(buf).map_err(|e| stream_err(&s, e, true, flags))
            } else {
                // a blocking send returns when everything is in the send buffer
                let to = s.opts().sndtimeo;
                let pout = libc::POLLOUT as u32;
                let mut sent = 0;
                while sent < buf.len() {
                    let rest = &buf[sent..];
                    match blocking(&s, pout, to, to.is_some(), || t.try_write(rest)) {
                        Ok(n) => sent += n,
                        Err(_) if sent > 0 => break,
                        Err(e) => return Some(Err(stream_err(&s, e, true, flags))),
                    }
                }
                Ok(sent)
            }
        }
        Conn::Udp(u) => {
            let dst = match to.or(*u.peer.lock().unwrap_or_else(|e| e.into_inner())) {
                Some(d) => d,
                None => return Some(Err(libc::EDESTADDRREQ)),
            };
            let st = stack_if_attached()?;
            if route_for(st, *dst.ip()) == Route::Kernel {
                return Some(Err(libc::ENETUNREACH));
            }
            if buf.len() > 65_507 {
                return Some(Err(libc::EMSGSIZE));
            }
            let to = s.opts().sndtimeo;
            if nonblock {
                u.sock.try_send_to(buf, dst)
            } else {
                blocking(&s, libc::POLLOUT as u32, to, to.is_some(), || {
                    u.sock.try_send_to(buf, dst)
                })
            }
            .map_err(|e| errno::of(&e, Op::Io))
        }
    })
}

/// A send on a listening socket: `EPIPE`, with `SIGPIPE` unless `MSG_NOSIGNAL`, as Linux's TCP
/// answers a socket that is not connected and not connecting.
fn listener_send(flags: i32) -> Errno {
    if flags & libc::MSG_NOSIGNAL == 0 {
        sys::raise_sigpipe();
    }
    libc::EPIPE
}

/// `shutdown(2)`.
pub fn shutdown(fd: i32, how: i32) -> Option<R<()>> {
    let s = ours!(fd);
    let c = match s.conn.get() {
        Some(c) => c,
        None if s.adopted() => return Some(Err(libc::ENOTCONN)),
        None => return None,
    };
    if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
        return Some(Err(libc::EINVAL));
    }
    Some(match c {
        Conn::Stream(t) => {
            if t.connect_result().is_none() {
                return Some(Err(libc::ENOTCONN));
            }
            if how != libc::SHUT_WR {
                // reads end once what had arrived is read, and the socket is readable at end
                // of stream for poll, select and epoll; reads and waits meanwhile end
                t.shutdown_read();
            }
            if how != libc::SHUT_RD {
                s.shut_write(t);
            }
            Ok(())
        }
        Conn::Listener(..) => Ok(()),
        Conn::Udp(u) => {
            if u.peer.lock().map(|p| p.is_none()).unwrap_or(true) {
                Err(libc::ENOTCONN)
            } else {
                Ok(())
            }
        }
    })
}

/// `close(2)` of anything: takes `fd` out of the table first (so a descriptor number the
/// kernel hands out again is never mistaken for the old one). The caller closes `fd` in the
/// kernel afterwards.
pub fn closing(fd: i32) {
    if let Some(e) = TABLE.remove(fd) {
        if forked() && !matches!(e, Entry::Relayed(_)) {
            // (a socket or epoll instance of the stack another process drives: nothing of it
            // is this process's to end; a relayed connection holds nothing of the stack)
            std::mem::forget(e);
            return;
        }
        if let Entry::Sock(s) = &e {
            // the last descriptor of a connection that a waiter still holds (the notifier,
            // another thread's epoll wait): the connection ends now, as the kernel's would,
            // not when that wait lets go of it
            // (not while a forked child may still take it over: see `relay`)
            if !s.open() && Arc::strong_count(s) > 1 && s.forks.load(Ordering::Acquire) == 0 {
                if let Some(Conn::Stream(t)) = s.conn.get() {
                    if t.connect_result().is_some() {
                        s.shut_write(t);
                    }
                }
            }
        }
        drop(e);
    }
}

/// `connect(2)` of a kernel socket (one not in the table) in a forked worker whose sibling
/// drives the stack: to a DockNet address, that sibling makes the connection for it
/// (`share::dial`); `None` otherwise (the kernel's call).
pub fn worker_connect(fd: i32, addr: Option<Option<SocketAddrV4>>) -> Option<R<()>> {
    if !ENABLED.load(Ordering::Relaxed) || !forked() {
        return None;
    }
    let Some(Some(to)) = addr else {
        return None;
    };
    crate::share::dial(fd, to)
}

/// After the kernel duplicated `old` to `new` (`dup`, `dup2`, `dup3`, `F_DUPFD`): `new`
/// refers to the same socket or epoll instance.
pub fn duplicated(old: i32, new: i32) {
    if old == new {
        return;
    }
    closing(new);
    if let Some(e) = TABLE.get(old) {
        TABLE.insert(new, e);
    }
}

/// An epoll instance was created at `fd`.
pub fn epoll_created(fd: i32) {
    // (tracked in a forked child too: making an epoll instance is no use of the stack)
    if enabled() && !lost_stack() && fd >= 0 {
        TABLE.insert(fd, Entry::Epoll(Arc::new(Epoll::new(fd))));
    }
}

/// Whether this process lost its stack to a forked child (its own copy is dead).
pub(crate) fn lost_stack() -> bool {
    !FORKED.load(Ordering::Relaxed) && stack_if_attached().is_some_and(Stack::moved)
}

/// Whether `fd` is a socket on DockNet (its descriptor is ours).
pub fn is_docknet(fd: i32) -> bool {
    TABLE.maybe(fd) && TABLE.sock(fd).is_some_and(|s| s.adopted())
}

/// Whether `fd` is a listener whose connections another worker hands this one (`share`).
pub fn is_shared_listener(fd: i32) -> bool {
    TABLE.maybe(fd) && TABLE.relayed(fd).is_some_and(|r| r.listening)
}

/// Whether `fd` is a TCP socket of ours (decided or not).
pub fn is_tcp(fd: i32) -> bool {
    TABLE.maybe(fd) && TABLE.sock(fd).is_some_and(|s| s.proto == Proto::Tcp)
}
