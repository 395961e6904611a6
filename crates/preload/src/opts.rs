//! Socket options and control calls on DockNet sockets (`setsockopt`, `getsockopt`, `fcntl`,
//! `ioctl`, `sendfile`), in safe code, as [`crate::ops`] serves the socket calls.

use crate::ops::*;
use crate::relay::Relayed;
use crate::sock::{Conn, Opts, Proto, Sock};
use crate::sys::{self, R};
use docknet_lib::StackConfig;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a `getsockopt` returns: an int or a raw value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptVal {
    /// An int option.
    Int(i32),
    /// `struct linger`: on, seconds.
    Linger(bool, i32),
    /// `struct timeval`.
    Time(Option<Duration>),
    /// Raw bytes (TCP_INFO, TCP_CONGESTION).
    Bytes(Vec<u8>),
}

/// `setsockopt(2)`. `val`: the option's value as an int (None when shorter than one),
/// `time`/`linger` parsed by the caller where the option takes one.
pub fn setsockopt(
    fd: i32,
    level: i32,
    name: i32,
    val: Option<i32>,
    time: Option<Option<Duration>>,
    linger: Option<(bool, i32)>,
) -> Option<R<()>> {
    if let Some(r) = crate::ops::relayed(fd) {
        return set_relayed(&r, level, name, val);
    }
    let s = ours!(fd);
    if !s.adopted() {
        // still the kernel's socket: the kernel applies it too (the caller passes it on),
        // and it is recorded for the DockNet socket it may become
        let _ = record_opt(&s, level, name, val, time, linger);
        return None;
    }
    Some(record_opt(&s, level, name, val, time, linger))
}

fn record_opt(
    s: &Sock,
    level: i32,
    name: i32,
    val: Option<i32>,
    time: Option<Option<Duration>>,
    linger: Option<(bool, i32)>,
) -> R<()> {
    let int = || val.ok_or(libc::EINVAL);
    let mut o = s.opts();
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => o.reuseaddr = int()? != 0,
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => o.reuseport = int()? != 0,
        (libc::SOL_SOCKET, libc::SO_BROADCAST) => o.broadcast = int()? != 0,
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => o.rcvbuf = Some(int()?),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => o.sndbuf = Some(int()?),
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => o.rcvtimeo = time.ok_or(libc::EINVAL)?,
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => o.sndtimeo = time.ok_or(libc::EINVAL)?,
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            let (on, secs) = linger.ok_or(libc::EINVAL)?;
            o.linger = on.then_some(secs.max(0));
        }
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => {
            o.keepalive = int()? != 0;
            if let Some(Conn::Stream(t)) = s.conn.get() {
                t.set_keepalive(o.keepalive.then_some(Duration::from_secs(7200)));
            }
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) if s.proto == Proto::Tcp => {
            o.nodelay = int()? != 0;
            if let Some(Conn::Stream(t)) = s.conn.get() {
                t.set_nodelay(o.nodelay);
            }
        }
        // accepted and recorded; DockNet has no use for them
        (
            libc::SOL_SOCKET,
            libc::SO_PRIORITY | libc::SO_OOBINLINE | libc::SO_RCVLOWAT | libc::SO_SNDLOWAT,
        )
        | (
            libc::IPPROTO_IP,
            libc::IP_TOS | libc::IP_TTL | libc::IP_BIND_ADDRESS_NO_PORT | libc::IP_RECVERR,
        )
        | (
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK
            | libc::TCP_CORK
            | libc::TCP_KEEPIDLE
            | libc::TCP_KEEPINTVL
            | libc::TCP_KEEPCNT
            | libc::TCP_DEFER_ACCEPT
            | libc::TCP_MAXSEG
            | libc::TCP_USER_TIMEOUT
            | libc::TCP_FASTOPEN
            | libc::TCP_NOTSENT_LOWAT,
        ) => {
            record_other(&mut o, level, name, int()?);
        }
        (libc::IPPROTO_TCP, libc::TCP_CONGESTION) => {}
        _ => {
            return Err(unsupported(
                &format!("setsockopt(level {level}, option {name})"),
                libc::ENOPROTOOPT,
            ))
        }
    }
    Ok(())
}

/// `getsockopt(2)`.
pub fn getsockopt(fd: i32, level: i32, name: i32) -> Option<R<OptVal>> {
    if let Some(r) = crate::ops::relayed(fd) {
        return get_relayed(&r, level, name);
    }
    let s = ours!(fd);
    if !s.adopted() {
        return None;
    }
    let o = s.opts().clone();
    let st = stack_if_attached()?;
    let buf = StackConfig::default().tcp_rx_buffer as i32;
    Some(Ok(match (level, name) {
        (libc::SOL_SOCKET, libc::SO_ERROR) => OptVal::Int(so_error(&s)),
        (libc::SOL_SOCKET, libc::SO_TYPE) => OptVal::Int(match s.proto {
            Proto::Tcp => libc::SOCK_STREAM,
            Proto::Udp => libc::SOCK_DGRAM,
        }),
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => OptVal::Int(libc::AF_INET),
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => OptVal::Int(match s.proto {
            Proto::Tcp => libc::IPPROTO_TCP,
            Proto::Udp => libc::IPPROTO_UDP,
        }),
        (libc::SOL_SOCKET, libc::SO_ACCEPTCONN) => {
            OptVal::Int(matches!(s.conn.get(), Some(Conn::Listener(..))) as i32)
        }
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => OptVal::Int(o.reuseaddr as i32),
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => OptVal::Int(o.reuseport as i32),
        (libc::SOL_SOCKET, libc::SO_BROADCAST) => OptVal::Int(o.broadcast as i32),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => OptVal::Int(o.keepalive as i32),
        // Linux doubles what was set (bookkeeping overhead); unset: DockLib's buffer
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            OptVal::Int(o.rcvbuf.map_or(buf, |v| v.saturating_mul(2)))
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            OptVal::Int(o.sndbuf.map_or(buf, |v| v.saturating_mul(2)))
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            OptVal::Linger(o.linger.is_some(), o.linger.unwrap_or(0))
        }
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => OptVal::Time(o.rcvtimeo),
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => OptVal::Time(o.sndtimeo),
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) if s.proto == Proto::Tcp => {
            OptVal::Int(o.nodelay as i32)
        }
        (libc::IPPROTO_TCP, libc::TCP_CONGESTION) if s.proto == Proto::Tcp => {
            OptVal::Bytes(CONGESTION.to_vec())
        }
        (libc::IPPROTO_TCP, libc::TCP_INFO) if s.proto == Proto::Tcp => {
            OptVal::Bytes(tcp_info(tcp_state(&s)))
        }
        _ => {
            let _ = st;
            return Some(recorded_or_default(&o, level, name, s.proto == Proto::Tcp));
        }
    }))
}

/// The congestion control `TCP_CONGESTION` reads back (Linux's default).
const CONGESTION: &[u8] = b"cubic\0";

/// Records option `(level, name)` as set to `v`, for `getsockopt` to read back.
fn record_other(o: &mut Opts, level: i32, name: i32, v: i32) {
    o.other.retain(|(k, _)| *k != (level, name));
    o.other.push(((level, name), v));
}

/// `getsockopt` of an option that is only recorded: what was set, else what Linux has for a
/// socket that never set it (TCP's options on a TCP socket only, `tcp`), else `ENOPROTOOPT`
/// with one line.
fn recorded_or_default(o: &Opts, level: i32, name: i32, tcp: bool) -> R<OptVal> {
    o.other
        .iter()
        .find(|(k, _)| *k == (level, name))
        .map(|(_, v)| *v)
        .or_else(|| linux_default(level, name).filter(|_| level != libc::IPPROTO_TCP || tcp))
        .map(OptVal::Int)
        .ok_or_else(|| {
            unsupported(
                &format!("getsockopt(level {level}, option {name})"),
                libc::ENOPROTOOPT,
            )
        })
}

/// `setsockopt` on a connection the parent serves for this forked child (the descriptor is a
/// Unix socket): socket-level options are the kernel's (they apply to that socket: timeouts,
/// buffers), TCP and IP options are recorded and read back, as the connection's.
fn set_relayed(r: &Relayed, level: i32, name: i32, val: Option<i32>) -> Option<R<()>> {
    if level != libc::IPPROTO_TCP && level != libc::IPPROTO_IP {
        return None;
    }
    let Some(v) = val else {
        return Some(Err(libc::EINVAL));
    };
    let mut o = r.opts();
    if (level, name) == (libc::IPPROTO_TCP, libc::TCP_NODELAY) {
        o.nodelay = v != 0;
    } else {
        record_other(&mut o, level, name, v);
    }
    Some(Ok(()))
}

/// `getsockopt` on a connection the parent serves for this forked child: what a TCP socket
/// answers (its type, domain and protocol, the TCP and IP options recorded); other
/// socket-level options are the kernel's, of the Unix socket the bytes go through.
fn get_relayed(r: &Relayed, level: i32, name: i32) -> Option<R<OptVal>> {
    let o = r.opts().clone();
    Some(Ok(match (level, name) {
        (libc::SOL_SOCKET, libc::SO_TYPE) => OptVal::Int(libc::SOCK_STREAM),
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => OptVal::Int(libc::AF_INET),
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => OptVal::Int(libc::IPPROTO_TCP),
        (libc::SOL_SOCKET, libc::SO_ACCEPTCONN) => OptVal::Int(r.listening as i32),
        (libc::SOL_SOCKET, _) => return None,
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => OptVal::Int(o.nodelay as i32),
        (libc::IPPROTO_TCP, libc::TCP_CONGESTION) => OptVal::Bytes(CONGESTION.to_vec()),
        (libc::IPPROTO_TCP, libc::TCP_INFO) if r.listening => OptVal::Bytes(tcp_info(TCP_LISTEN)),
        (libc::IPPROTO_TCP, libc::TCP_INFO) => OptVal::Bytes(tcp_info(TCP_ESTABLISHED)),
        _ => return Some(recorded_or_default(&o, level, name, true)),
    }))
}

/// What Linux answers for an option DockNet accepts and records but that was never set on
/// the socket (programs query them: nginx TCP_FASTOPEN and TCP_DEFER_ACCEPT, libpq the
/// keepalive timers).
fn linux_default(level: i32, name: i32) -> Option<i32> {
    Some(match (level, name) {
        (libc::SOL_SOCKET, libc::SO_PRIORITY | libc::SO_OOBINLINE) => 0,
        (libc::SOL_SOCKET, libc::SO_RCVLOWAT | libc::SO_SNDLOWAT) => 1,
        (libc::IPPROTO_IP, libc::IP_TOS | libc::IP_BIND_ADDRESS_NO_PORT | libc::IP_RECVERR) => 0,
        (libc::IPPROTO_IP, libc::IP_TTL) => 64,
        (libc::IPPROTO_TCP, libc::TCP_QUICKACK) => 1,
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => 7200,
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) => 75,
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => 9,
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => 1460,
        (
            libc::IPPROTO_TCP,
            libc::TCP_CORK
            | libc::TCP_DEFER_ACCEPT
            | libc::TCP_USER_TIMEOUT
            | libc::TCP_FASTOPEN
            | libc::TCP_NOTSENT_LOWAT,
        ) => 0,
        _ => return None,
    })
}

/// SO_ERROR: the pending error (refused, reset), reported once.
fn so_error(s: &Sock) -> i32 {
    let Some(Conn::Stream(t)) = s.conn.get() else {
        return 0;
    };
    match t.connect_result() {
        Some(Err(_)) if !s.err_taken.swap(true, Ordering::Relaxed) => {
            if s.established.load(Ordering::Relaxed) {
                libc::ECONNRESET
            } else {
                libc::ECONNREFUSED
            }
        }
        Some(Ok(())) => {
            s.established.store(true, Ordering::Relaxed);
            0
        }
        _ => 0,
    }
}

/// A `struct tcp_info` with the fields DockNet knows (the state given, the MSS); the rest
/// zero.
fn tcp_info(state: u8) -> Vec<u8> {
    let mut v = vec![0u8; 232];
    v[0] = state;
    // tcpi_snd_mss at offset 16, tcpi_rcv_mss at 20
    v[16..20].copy_from_slice(&1460u32.to_ne_bytes());
    v[20..24].copy_from_slice(&1460u32.to_ne_bytes());
    v
}

/// Linux's `tcpi_state` for `TCP_ESTABLISHED`.
const TCP_ESTABLISHED: u8 = 1;
/// Linux's `tcpi_state` for `TCP_LISTEN`.
const TCP_LISTEN: u8 = 10;

/// The TCP state of `s`, as `tcp_info` reports it.
fn tcp_state(s: &Sock) -> u8 {
    match s.conn.get() {
        Some(Conn::Listener(..)) => TCP_LISTEN,
        Some(Conn::Stream(t)) => match t.connect_result() {
            None => 2, // SYN_SENT
            Some(Ok(())) => TCP_ESTABLISHED,
            Some(Err(_)) => 7, // TCP_CLOSE
        },
        _ => 7,
    }
}

/// `fcntl(2)` commands that concern a socket's status flags.
pub fn fcntl_flags(fd: i32, cmd: i32, arg: i32) -> Option<R<i32>> {
    let s = TABLE.sock(fd)?;
    if forked() {
        // the descriptor's flags are the kernel's here; the socket's copy is kept in step
        // (it is this process's own memory: a listener that is never ready here still answers
        // `accept` by it)
        if cmd == libc::F_SETFL {
            s.nonblock
                .store(arg & libc::O_NONBLOCK != 0, Ordering::Relaxed);
        }
        return None;
    }
    match cmd {
        libc::F_GETFL if s.adopted() => Some(Ok(libc::O_RDWR
            | if s.nonblock.load(Ordering::Relaxed) {
                libc::O_NONBLOCK
            } else {
                0
            })),
        libc::F_SETFL => {
            s.nonblock
                .store(arg & libc::O_NONBLOCK != 0, Ordering::Relaxed);
            if s.adopted() {
                Some(Ok(0))
            } else {
                None
            }
        }
        _ => None,
    }
}

/// `ioctl(2)` on a socket: FIONBIO (`arg`: the int), FIONREAD, SIOCOUTQ; FIOCLEX and FIONCLEX
/// go to the kernel.
pub fn ioctl(fd: i32, req: u64, arg: Option<i32>) -> Option<R<Option<i32>>> {
    // close-on-exec (Python's `os.set_inheritable`): a flag of the descriptor, the kernel's
    if req == libc::FIOCLEX || req == libc::FIONCLEX {
        return None;
    }
    if req == libc::FIONBIO && forked() {
        // only a flag, as `fcntl` is: the kernel's, on the descriptor itself (and the socket's
        // copy kept in step)
        if let Some(s) = TABLE.sock(fd) {
            s.nonblock.store(arg.unwrap_or(0) != 0, Ordering::Relaxed);
        }
        return None;
    }
    let s = ours!(fd);
    if req == libc::FIONBIO {
        s.nonblock.store(arg.unwrap_or(0) != 0, Ordering::Relaxed);
        return if s.adopted() { Some(Ok(None)) } else { None };
    }
    if !s.adopted() {
        return None;
    }
    Some(match (req, s.conn.get()) {
        (r, Some(Conn::Stream(t))) if r == libc::FIONREAD => Ok(Some(t.bytes_readable() as i32)),
        (r, Some(Conn::Udp(u))) if r == libc::FIONREAD => {
            Ok(Some(u.sock.next_len().unwrap_or(0) as i32))
        }
        (r, Some(Conn::Stream(t))) if r == libc::TIOCOUTQ => Ok(Some(t.bytes_unacked() as i32)),
        (r, Some(Conn::Listener(..))) if r == libc::FIONREAD => Err(libc::EINVAL),
        (r, _) => Err(unsupported(&format!("ioctl {r:#x}"), libc::ENOTTY)),
    })
}

/// `sendfile(2)` to a DockNet socket: read from `in_fd` and write to the socket. `off`:
/// the file offset to read at (updated), or `None` to use and advance the file position.
pub fn sendfile(out_fd: i32, in_fd: i32, off: Option<&mut i64>, count: usize) -> Option<R<usize>> {
    if TABLE.sock(in_fd).is_some_and(|s| s.adopted()) {
        return Some(Err(libc::EINVAL));
    }
    let s = ours!(out_fd);
    if !s.adopted() {
        return None;
    }
    let nonblock = s.nonblocking(0);
    let mut pos = match &off {
        Some(o) => **o,
        None => match sys::lseek(in_fd, 0, libc::SEEK_CUR) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        },
    };
    let mut buf = vec![0u8; count.min(64 * 1024)];
    let mut sent = 0usize;
    let mut result = Ok(());
    while sent < count {
        let want = (count - sent).min(buf.len());
        let n = match sys::pread(in_fd, &mut buf[..want], pos) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        let flags = if nonblock { libc::MSG_DONTWAIT } else { 0 };
        match send(out_fd, &buf[..n], flags, None)? {
            Ok(w) => {
                sent += w;
                pos += w as i64;
                if w < n {
                    break;
                }
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        if nonblock {
            break;
        }
    }
    match off {
        Some(o) => *o = pos,
        None => {
            let _ = sys::lseek(in_fd, pos, libc::SEEK_SET);
        }
    }
    Some(match result {
        Err(e) if sent == 0 => Err(e),
        _ => Ok(sent),
    })
}
