//! Connections handed to a forked child: the process that drives the stack serves them for
//! the child through a Unix socket.
//!
//! A server that accepts and then forks a process per connection (PostgreSQL's postmaster,
//! inetd-style servers, a supervisor's `fork` after `accept`) leaves the connection in the
//! parent's stack, which alone drives the pipe's rings. So:
//!
//! - At a `fork` of the process that drives the stack, while it holds DockNet connections, the
//!   library makes a *link*: a `SOCK_SEQPACKET` pair, one end kept by the parent (a thread
//!   waits on it), the other inherited by the child. The parent notes which connections the
//!   child inherited (by descriptor and socket id) and holds them: its own `close` of one of
//!   them no longer ends it while a child may still take it over, as Linux keeps a socket
//!   open while any process holds a descriptor of it.
//! - A child's first use of an inherited connection *claims* it: the child makes a
//!   `SOCK_STREAM` pair, sends one end over the link with the descriptor number and socket id,
//!   and the parent answers on that end with the connection's addresses. The child puts its
//!   end in place of the descriptor (`dup3`, flags kept) and from then on its calls on it are
//!   the kernel's, on the Unix socket: reads, writes, `poll`, `epoll`, `select`, blocking or
//!   not, all as the program expects of a stream socket. `getsockname`, `getpeername` and the
//!   TCP options are answered from what the library knows of the connection ([`Relayed`]).
//! - The parent relays bytes between the DockNet connection and its end (`Relay`): the
//!   child's bytes in a thread of the connection's own, blocked in a read of the Unix socket;
//!   the peer's in one thread for all relayed connections, waiting on the stack. The child's
//!   end of stream (its `shutdown` or its last `close`) sends FIN, the peer's FIN ends the
//!   child's reads, a reset ends both. The relay ends when both directions have ended; then
//!   the connection is closed, unless the parent still holds a descriptor of it.
//! - When every process that inherited the link has exited (or `exec`ed: the link is
//!   close-on-exec), the parent lets go of the connections nobody claimed: those it closed
//!   itself meanwhile end then.
//!
//! The link's messages come from the container's own processes, which trust each other as far
//! as Linux lets them; they are checked all the same (size, magic, a known descriptor and id),
//! and what does not fit is refused and dropped. A connection claimed twice goes to the first
//! claim; the second is refused and the child's call fails as before (`EOPNOTSUPP`, one line).

use crate::ops::{self, TABLE};
use crate::sock::{Conn, Opts, Sock};
use crate::sys::{self, R};
use crate::table::{Entry, TableHold};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A claim: magic, descriptor (i32), socket id (u64), in native byte order.
const CLAIM_MAGIC: u32 = 0x444e_5243;
const CLAIM_LEN: usize = 16;
/// A reply: status (0, else an errno), local address and port, peer address and port.
const REPLY_LEN: usize = 16;
/// How long a child waits for its parent's answer to a claim.
const CLAIM_WAIT: Duration = Duration::from_secs(5);
/// Bytes a relay moves per read, each way.
const CHUNK: usize = 64 * 1024;

/// The child's end of the link to the process that serves its inherited connections (-1:
/// none). Inherited by its own children too: a grandchild claims from the same process.
static LINK: AtomicI32 = AtomicI32::new(-1);
/// One claim at a time per process (the link's answers come on each claim's own socket, so
/// this only keeps two threads from claiming one descriptor twice).
static CLAIMING: Mutex<()> = Mutex::new(());
/// The parent's ends of the links of its living children, and of the Unix sockets of its
/// relays: closed in each new child (a copy there would be no use, and would hold them open).
static LINKS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Relays whose child may still send (their up side has not ended).
static UP_LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Claims refused or malformed, as counted by the process that serves them.
pub static REFUSED: AtomicU64 = AtomicU64::new(0);
/// Connections relayed for a child so far.
pub static RELAYED: AtomicU64 = AtomicU64::new(0);

/// A connection of the parent's stack that this forked child uses through the parent.
#[derive(Debug)]
pub struct Relayed {
    /// The connection's local address.
    pub local: SocketAddrV4,
    /// Its peer.
    pub peer: SocketAddrV4,
    /// The options as inherited, and as set since (TCP and IP levels).
    pub opts: Mutex<Opts>,
    /// A listener whose connections the process that drives the stack hands to this one
    /// (`share`), not a connection.
    pub listening: bool,
    /// A listening one: this worker told the owner it waits for a connection, and none came
    /// since (`share`).
    pub credit: std::sync::atomic::AtomicBool,
}

impl Relayed {
    /// The options, locked.
    pub fn opts(&self) -> MutexGuard<'_, Opts> {
        self.opts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The parent's ends of the links and its relays, held across a `fork` (so no thread of the
/// parent holds their locks in the child).
pub struct LinksHold(
    MutexGuard<'static, Vec<i32>>,
    MutexGuard<'static, Vec<Arc<Relay>>>,
);

impl std::fmt::Debug for LinksHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinksHold").finish_non_exhaustive()
    }
}

/// Holds the list of links across a `fork`.
pub fn hold() -> LinksHold {
    LinksHold(LINKS.lock().unwrap_or_else(|e| e.into_inner()), down_lock())
}

/// A link made for one `fork`.
#[derive(Debug)]
pub struct Prepared {
    parent_end: i32,
    child_end: i32,
    conns: Inherited,
}

/// The connections a child inherited, by descriptor, held for it until it claims them or no
/// longer can: dropping the rest lets them go ([`let_go`]), however the holder ends.
#[derive(Debug)]
struct Inherited(Vec<(i32, Arc<Sock>)>);

impl Drop for Inherited {
    fn drop(&mut self) {
        for (_, s) in self.0.drain(..) {
            let_go(s);
        }
    }
}

/// Before a `fork` of the process that drives the stack (`table` held): a link for the
/// child, when this process holds connections it could hand over.
pub fn prepare(table: &TableHold) -> Option<Prepared> {
    if ops::forked() {
        return None;
    }
    let conns = table.connections();
    if conns.is_empty() {
        return None;
    }
    let (parent_end, child_end) = sys::socketpair(libc::SOCK_SEQPACKET).ok()?;
    for (_, s) in &conns {
        s.forks.fetch_add(1, Ordering::AcqRel);
    }
    Some(Prepared {
        parent_end,
        child_end,
        conns: Inherited(conns),
    })
}

/// In the parent after the `fork`: serves the child's claims until no process holds the
/// child's end any more.
pub fn parent(links: LinksHold, p: Option<Prepared>) {
    let mut links = links;
    let Some(p) = p else { return };
    let _ = sys::close(p.child_end);
    links.0.push(p.parent_end);
    drop(links);
    let (fd, conns) = (p.parent_end, p.conns);
    // (a thread that must not take the program's signals)
    let old = sys::block_all_signals();
    let spawned = std::thread::Builder::new()
        .name("docknet-relay".into())
        .spawn(move || serve(fd, conns));
    sys::sigmask_set(old.as_ref());
    if spawned.is_err() {
        // no one answers (the connections went with the thread's closure): the child's claims
        // find the link closed and are refused
        forget_link(fd);
    }
}

/// In the child after the `fork`: keeps its end of the new link (if any) and closes the
/// parent's ends of its siblings' links.
pub fn child(links: LinksHold, p: Option<Prepared>) {
    let mut links = links;
    for fd in links.0.drain(..) {
        let _ = sys::close(fd);
    }
    // (the parent's relays: their sockets are the parent's, never touched here)
    std::mem::forget(std::mem::take(&mut *links.1));
    drop(links);
    if let Some(p) = p {
        let _ = sys::close(p.parent_end);
        // (the child's copies of the sockets are dead memory: never let go here)
        std::mem::forget(p.conns);
        let old = LINK.swap(p.child_end, Ordering::AcqRel);
        if old >= 0 {
            let _ = sys::close(old);
        }
    }
}

fn forget_link(fd: i32) {
    LINKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|f| *f != fd);
    let _ = sys::close(fd);
}

/// The parent's side of one link: answers claims, then lets go of what nobody claimed.
fn serve(link: i32, mut conns: Inherited) {
    let mut buf = [0u8; 64];
    loop {
        match sys::recv_with_fd(link, &mut buf) {
            // every process that held the child's end is gone
            Ok((0, None)) => break,
            Ok((n, data)) => {
                let Some(data) = data else {
                    REFUSED.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                // (what came with the claim must be a Unix stream socket: anything else, a
                // file or a pipe, is dropped unanswered)
                if !sys::is_unix_stream(data) {
                    REFUSED.fetch_add(1, Ordering::Relaxed);
                    let _ = sys::close(data);
                    continue;
                }
                match parse_claim(&buf[..n])
                    .and_then(|(fd, id)| conns.0.iter().position(|(f, s)| *f == fd && s.id == id))
                {
                    Some(i) if !ops::forked() => {
                        let (_, s) = conns.0.swap_remove(i);
                        start_relay(s, data);
                    }
                    _ => {
                        REFUSED.fetch_add(1, Ordering::Relaxed);
                        let _ = sys::send_nosignal(data, &reply(libc::EOPNOTSUPP, None), true);
                        let _ = sys::close(data);
                    }
                }
            }
            Err(libc::EINTR) => {}
            Err(_) => break,
        }
    }
    forget_link(link);
    drop(conns);
}

fn parse_claim(b: &[u8]) -> Option<(i32, u64)> {
    if b.len() != CLAIM_LEN || u32::from_ne_bytes(b[0..4].try_into().ok()?) != CLAIM_MAGIC {
        return None;
    }
    Some((
        i32::from_ne_bytes(b[4..8].try_into().ok()?),
        u64::from_ne_bytes(b[8..16].try_into().ok()?),
    ))
}

fn reply(status: i32, addrs: Option<(SocketAddrV4, SocketAddrV4)>) -> [u8; REPLY_LEN] {
    let mut r = [0u8; REPLY_LEN];
    r[0..4].copy_from_slice(&status.to_ne_bytes());
    if let Some((l, p)) = addrs {
        r[4..8].copy_from_slice(&l.ip().octets());
        r[8..10].copy_from_slice(&l.port().to_be_bytes());
        r[10..14].copy_from_slice(&p.ip().octets());
        r[14..16].copy_from_slice(&p.port().to_be_bytes());
    }
    r
}

fn parse_reply(r: &[u8; REPLY_LEN]) -> Result<(SocketAddrV4, SocketAddrV4), i32> {
    let status = i32::from_ne_bytes([r[0], r[1], r[2], r[3]]);
    if status != 0 {
        return Err(status);
    }
    let ip = |o: usize| Ipv4Addr::new(r[o], r[o + 1], r[o + 2], r[o + 3]);
    let port = |o: usize| u16::from_be_bytes([r[o], r[o + 1]]);
    Ok((
        SocketAddrV4::new(ip(4), port(8)),
        SocketAddrV4::new(ip(10), port(14)),
    ))
}

/// A fork record lets go of a connection: if this process closed it meanwhile and nothing
/// else holds it, it ends now, as the kernel's would once the last process holding it let go.
fn let_go(s: Arc<Sock>) {
    if s.forks.fetch_sub(1, Ordering::AcqRel) == 1 && !s.open() && !ops::forked() {
        if let Some(Conn::Stream(t)) = s.conn.get() {
            s.shut_write(t);
        }
    }
    drop(s);
}

fn start_relay(s: Arc<Sock>, data: i32) {
    let Some(Conn::Stream(t)) = s.conn.get() else {
        let _ = sys::send_nosignal(data, &reply(libc::EOPNOTSUPP, None), true);
        let _ = sys::close(data);
        let_go(s);
        return;
    };
    let v4 =
        |a: Option<SocketAddr>| a.map_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), ops::as_v4);
    let addrs = (v4(t.local_addr()), v4(t.peer_addr()));
    if sys::send_nosignal(data, &reply(0, Some(addrs)), true) != Ok(REPLY_LEN) {
        let _ = sys::close(data);
        let_go(s);
        return;
    }
    run(s, data);
}

/// For a `sendmsg` that passes the DockNet connection `s` to another process (`SCM_RIGHTS`):
/// a Unix socket to pass in its place, whose other end this process relays to the connection
/// from now on, as it relays a connection a forked child claimed. The receiver reads and writes
/// the connection's bytes on it (its addresses are the Unix socket's: nothing else of the
/// connection travels). `EOPNOTSUPP` for anything but a connection of the stack this process
/// drives (a listener or a UDP socket cannot be relayed).
pub fn pass(s: &Arc<Sock>) -> R<i32> {
    if ops::forked() || !matches!(s.conn.get(), Some(Conn::Stream(_))) {
        return Err(libc::EOPNOTSUPP);
    }
    let (mine, theirs) = sys::socketpair(libc::SOCK_STREAM)?;
    // held as an inherited connection is: this process's own `close` no longer ends it
    s.forks.fetch_add(1, Ordering::AcqRel);
    run(s.clone(), mine);
    Ok(theirs)
}

/// Relays `s` to the Unix socket `data` until both ways end.
fn run(s: Arc<Sock>, data: i32) {
    let Some(Conn::Stream(t)) = s.conn.get() else {
        let _ = sys::close(data);
        let_go(s);
        return;
    };
    // the child's writes are its messages: each goes out as it comes
    t.set_nodelay(true);
    RELAYED.fetch_add(1, Ordering::Relaxed);
    LINKS.lock().unwrap_or_else(|e| e.into_inner()).push(data);
    let r = Arc::new(Relay {
        s,
        data,
        state: Mutex::new(State::default()),
    });
    let up = r.clone();
    UP_LIVE.fetch_add(1, Ordering::AcqRel);
    // (threads that must not take the program's signals)
    let old = sys::block_all_signals();
    let spawned = std::thread::Builder::new()
        .name("docknet-relay".into())
        .spawn(move || up.up());
    sys::sigmask_set(old.as_ref());
    if spawned.is_ok() {
        down_lock().push(r);
        crate::event::kick_notifier();
    } else {
        UP_LIVE.fetch_sub(1, Ordering::AcqRel);
        r.end();
    }
}

/// Where a relayed connection stands.
#[derive(Default)]
struct State {
    /// The child's socket buffer was full when the peer's bytes last tried to go down: they
    /// wait in the stack, and the down side looks again within a millisecond.
    slow: bool,
    /// The peer sent FIN (or the connection failed): nothing more comes down.
    peer_done: bool,
    /// The child's end is gone (a send failed, or it closed both ways): nothing can go
    /// down any more.
    child_gone: bool,
    /// The up thread ended (the child's end of stream, or the peer gone).
    up_done: bool,
    /// The down side is finished (the peer's end delivered, or no child to take it).
    down_done: bool,
    /// Its socket and descriptor were let go.
    ended: bool,
}

/// A connection the parent serves for a child: the DockNet socket and the parent's end of
/// the Unix socket the child uses. Bytes from the child go up in a thread of the connection's
/// own, which sleeps in a blocking read of the Unix socket (the kernel wakes it when the child
/// writes, on the child's core if it can); bytes from the peer go down in one thread for all
/// relayed connections of the process (the notifier's, [`down_round`]), which sleeps on the
/// stack as a blocked DockNet call does. One wake-up each way, besides the child's own.
struct Relay {
    s: Arc<Sock>,
    data: i32,
    state: Mutex<State>,
}

impl Relay {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stream(&self) -> Option<&docknet_lib::TcpStream> {
        match self.s.conn.get() {
            Some(Conn::Stream(t)) => Some(t),
            _ => None,
        }
    }

    /// The child's side: its bytes go up to the peer as they come; its end of stream sends
    /// FIN (unless this process still holds the connection and may write on).
    fn up(self: Arc<Relay>) {
        let Some(t) = self.stream() else {
            self.finish_up();
            return;
        };
        let mut chunk = vec![0u8; CHUNK];
        loop {
            let n = match sys::read(self.data, &mut chunk) {
                Ok(n) => n,
                Err(libc::EINTR) => continue,
                Err(_) => 0,
            };
            if n == 0 {
                if hung_up(self.data) {
                    self.state().child_gone = true;
                    crate::event::kick_notifier();
                }
                if !self.s.open() {
                    self.s.shut_write(t);
                }
                break;
            }
            if write_all(t, &chunk[..n]).is_err() {
                // the peer is gone: what the child still sends goes nowhere
                let _ = sys::shutdown(self.data, libc::SHUT_RDWR);
                let mut g = self.state();
                g.peer_done = true;
                g.child_gone = true;
                drop(g);
                crate::event::kick_notifier();
                break;
            }
        }
        self.finish_up();
    }

    fn finish_up(&self) {
        UP_LIVE.fetch_sub(1, Ordering::AcqRel);
        self.side_done(true);
        crate::event::kick_notifier();
    }

    /// One side (`up`, else down) finished: the relay ends when the other has too.
    fn side_done(&self, up: bool) {
        let mut g = self.state();
        if up {
            g.up_done = true;
        } else {
            g.down_done = true;
        }
        let last = g.up_done && g.down_done;
        drop(g);
        if last {
            self.end();
        }
    }

    /// Moves what the peer sent down to the child, without waiting; whether the down side is
    /// finished now. The bytes leave the stack only once the child's socket took them: they are
    /// copied out (a peek), sent, and as many as the send took are then consumed. A child that
    /// closed its end before the up side noticed refuses them, and they stay for this process,
    /// which may still hold the connection and read it. (The send runs outside the stack's
    /// lock: under it, every relay thread and the engine waited for the syscall and the
    /// child's wake-up.) `chunk`: the caller's buffer.
    fn down(&self, chunk: &mut [u8]) -> bool {
        let Some(t) = self.stream() else { return true };
        let mut g = self.state();
        g.slow = false;
        loop {
            if g.child_gone || g.peer_done {
                return true;
            }
            match t.try_peek(chunk) {
                Ok(0) => {
                    g.peer_done = true;
                    let _ = sys::shutdown(self.data, libc::SHUT_WR);
                }
                Ok(n) => match sys::send_nosignal(self.data, &chunk[..n], false) {
                    Ok(k) if k > 0 => consume(t, k),
                    Ok(_) | Err(libc::EAGAIN) | Err(libc::EINTR) => {
                        g.slow = true;
                        return false;
                    }
                    Err(_) => {
                        g.child_gone = true;
                        return true;
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(_) => {
                    // reset: both ways end
                    g.peer_done = true;
                    g.child_gone = true;
                    let _ = sys::shutdown(self.data, libc::SHUT_RDWR);
                }
            }
        }
    }

    /// Whether the down thread waits for the peer's bytes on this connection (the child could
    /// take more when last tried).
    fn wants_peer(&self) -> bool {
        let g = self.state();
        !g.down_done && !g.slow && !g.peer_done && !g.child_gone
    }

    fn has_pending(&self) -> bool {
        let g = self.state();
        g.slow && !g.child_gone
    }

    /// The down side finished: ends the relay if the up side did too.
    fn finish_down(&self) {
        self.side_done(false);
    }

    /// Both sides finished (or the relay could not start): the Unix socket closes and the
    /// connection is let go.
    fn end(&self) {
        let mut g = self.state();
        if std::mem::replace(&mut g.ended, true) {
            return;
        }
        drop(g);
        let _ = sys::shutdown(self.data, libc::SHUT_RDWR);
        forget_link(self.data);
        let_go(self.s.clone());
    }
}

/// Consumes the first `n` bytes that arrived on `t` (the ones a peek copied and the child
/// took).
fn consume(t: &docknet_lib::TcpStream, mut n: usize) {
    while n > 0 {
        match t.try_read_with(|b| Ok(b.len().min(n))) {
            Ok(k) if k > 0 => n -= k,
            _ => return,
        }
    }
}

/// Writes all of `b` to the connection, waiting for room as long as it takes.
fn write_all(t: &docknet_lib::TcpStream, mut b: &[u8]) -> std::io::Result<()> {
    while !b.is_empty() {
        match t.write_timeout(b, None) {
            Ok(k) => b = &b[k..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The relayed connections whose peers' bytes still go down to their children. The library's
/// notifier thread, which waits on the stack for the DockNet sockets of mixed waits, moves them
/// too ([`down_round`]): one thread of the library wakes for a frame, not two.
static DOWN: Mutex<Vec<Arc<Relay>>> = Mutex::new(Vec::new());

fn down_lock() -> MutexGuard<'static, Vec<Arc<Relay>>> {
    DOWN.lock().unwrap_or_else(|e| e.into_inner())
}

/// One round of the down side of every relayed connection (in the notifier's thread, each
/// time it wakes): moves what can move without waiting. Returns the sockets to wait for the
/// peers' bytes on, and whether a child is slow to take its bytes (the caller then looks again
/// within a millisecond). `chunk`: the caller's buffer, sized here on first use.
pub(crate) fn down_round(chunk: &mut Vec<u8>) -> (Vec<Arc<Sock>>, bool) {
    let relays: Vec<Arc<Relay>> = down_lock().clone();
    if relays.is_empty() {
        return (Vec::new(), false);
    }
    if chunk.len() < CHUNK {
        chunk.resize(CHUNK, 0);
    }
    let (done, live): (Vec<Arc<Relay>>, Vec<Arc<Relay>>) =
        relays.into_iter().partition(|r| r.down(chunk));
    if !done.is_empty() {
        down_lock().retain(|r| !done.iter().any(|d| Arc::ptr_eq(d, r)));
        for r in done {
            r.finish_down();
        }
    }
    let watch = live
        .iter()
        .filter(|r| r.wants_peer())
        .map(|r| r.s.clone())
        .collect();
    (watch, live.iter().any(|r| r.has_pending()))
}

/// A forked child's first use of the inherited connection `fd` (its copy `s`): asks the
/// process that drives the stack to serve it, and on its answer puts the Unix socket it
/// serves it on in place of `fd`. Whether `fd` is now relayed.
pub fn claim(fd: i32, s: &Sock) -> bool {
    let link = LINK.load(Ordering::Acquire);
    if link < 0 || !matches!(s.conn.get(), Some(Conn::Stream(_))) {
        return false;
    }
    let _one = CLAIMING.lock().unwrap_or_else(|e| e.into_inner());
    if TABLE.relayed(fd).is_some() {
        return true;
    }
    let Ok((mine, theirs)) = sys::socketpair(libc::SOCK_STREAM) else {
        return false;
    };
    let mut msg = [0u8; CLAIM_LEN];
    msg[0..4].copy_from_slice(&CLAIM_MAGIC.to_ne_bytes());
    msg[4..8].copy_from_slice(&fd.to_ne_bytes());
    msg[8..16].copy_from_slice(&s.id.to_ne_bytes());
    let sent = sys::send_with_fd(link, &msg, theirs);
    let _ = sys::close(theirs);
    let answer = sent.ok().and_then(|_| read_reply(mine));
    let Some(Ok((local, peer))) = answer else {
        let _ = sys::close(mine);
        return false;
    };
    let _ = sys::set_recv_timeout(mine, Duration::ZERO);
    if s.nonblock.load(Ordering::Relaxed) {
        let _ = sys::fcntl_int(mine, libc::F_SETFL, libc::O_RDWR | libc::O_NONBLOCK);
    }
    let r = Relayed {
        local,
        peer,
        opts: Mutex::new(s.opts().clone()),
        listening: false,
        credit: std::sync::atomic::AtomicBool::new(false),
    };
    if sys::dup_over(mine, fd).is_err() {
        return false;
    }
    drop(TABLE.insert(fd, Entry::Relayed(Arc::new(r))));
    true
}

/// At the parent's `exit`: waits (until `deadline`) for the relays to pass on everything their
/// children sent, and their ends of stream, to the stack, which sends it before the process
/// ends. A child still running when its parent exits loses its connection, as the parent's
/// stack ends.
pub fn finish_at_exit(deadline: std::time::Instant) {
    while UP_LIVE.load(Ordering::Acquire) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether the Unix socket `fd`'s other end is closed both ways (its process let go of it).
fn hung_up(fd: i32) -> bool {
    let mut p = [libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    }];
    sys::poll(&mut p, 0).is_ok() && p[0].revents & (libc::POLLHUP | libc::POLLERR) != 0
}

/// The parent's answer on our end of the claim's socket, waited for at most [`CLAIM_WAIT`].
fn read_reply(fd: i32) -> Option<Result<(SocketAddrV4, SocketAddrV4), i32>> {
    sys::set_recv_timeout(fd, CLAIM_WAIT).ok()?;
    let mut r = [0u8; REPLY_LEN];
    let mut got = 0;
    while got < REPLY_LEN {
        match sys::read(fd, &mut r[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(libc::EINTR) => {}
            Err(_) => return None,
        }
    }
    Some(parse_reply(&r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_and_replies_read_back_and_malformed_ones_are_refused() {
        let mut m = [0u8; CLAIM_LEN];
        m[0..4].copy_from_slice(&CLAIM_MAGIC.to_ne_bytes());
        m[4..8].copy_from_slice(&7i32.to_ne_bytes());
        m[8..16].copy_from_slice(&99u64.to_ne_bytes());
        assert_eq!(parse_claim(&m), Some((7, 99)));
        assert_eq!(parse_claim(&m[..15]), None);
        let mut bad = m;
        bad[0] ^= 1;
        assert_eq!(parse_claim(&bad), None);
        let l: SocketAddrV4 = "10.0.0.2:5432".parse().unwrap();
        let p: SocketAddrV4 = "10.0.0.3:40000".parse().unwrap();
        assert_eq!(parse_reply(&reply(0, Some((l, p)))), Ok((l, p)));
        assert_eq!(
            parse_reply(&reply(libc::EOPNOTSUPP, None)),
            Err(libc::EOPNOTSUPP)
        );
    }

    /// What a child sends on its link is refused unless it names a connection it inherited:
    /// a claim without its socket or with something else (a pipe), a short or foreign
    /// message, an unknown descriptor or id.
    /// Each refusal is counted, answered on the claim's own socket where it came with one, and
    /// the link's end (every child gone) ends the parent's side.
    #[test]
    fn a_link_refuses_what_is_not_a_claim_on_an_inherited_connection_and_ends_with_its_children() {
        let (parent_end, child_end) = sys::socketpair(libc::SOCK_SEQPACKET).unwrap();
        let before = REFUSED.load(Ordering::Relaxed);
        let t = std::thread::spawn(move || serve(parent_end, Inherited(Vec::new())));
        let claim = |msg: &[u8]| -> i32 {
            let (mine, theirs) = sys::socketpair(libc::SOCK_STREAM).unwrap();
            sys::send_with_fd(child_end, msg, theirs).unwrap();
            sys::close(theirs).unwrap();
            let r = read_reply(mine);
            sys::close(mine).unwrap();
            match r {
                Some(Err(e)) => e,
                other => panic!("{other:?}"),
            }
        };
        let mut m = [0u8; CLAIM_LEN];
        m[0..4].copy_from_slice(&CLAIM_MAGIC.to_ne_bytes());
        m[4..8].copy_from_slice(&3i32.to_ne_bytes());
        m[8..16].copy_from_slice(&1u64.to_ne_bytes());
        assert_eq!(claim(&m), libc::EOPNOTSUPP, "no such connection");
        assert_eq!(claim(&m[..7]), libc::EOPNOTSUPP, "short");
        assert_eq!(claim(&[0xffu8; CLAIM_LEN]), libc::EOPNOTSUPP, "not a claim");
        // a pipe instead of a socket: dropped unanswered (its reader sees the end of it)
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let (mut r, w) = std::io::pipe().unwrap();
        sys::send_with_fd(child_end, &m, w.as_raw_fd()).unwrap();
        drop(w);
        let mut b = Vec::new();
        assert_eq!(
            r.read_to_end(&mut b).unwrap(),
            0,
            "the parent let go of the pipe"
        );
        // no socket with it: nothing to answer on, counted all the same
        assert_eq!(sys::send_nosignal(child_end, &m, true), Ok(CLAIM_LEN));
        sys::close(child_end).unwrap();
        t.join().unwrap();
        assert!(REFUSED.load(Ordering::Relaxed) >= before + 5);
    }
}
