//! A listener shared by forked workers: the connections its stack's process does not take in
//! time go to the other workers, which it then serves through Unix sockets.
//!
//! A server that listens and then forks its workers (gunicorn, Apache's prefork, nginx) leaves
//! one listener in every worker, and Linux hands each new connection to whichever worker
//! accepts. Over DockNet the pipe's stack goes whole to the first worker that uses the
//! listener (`family`), and the others' copies are dead. Without more, that one worker served
//! every connection while the others slept: a pool of four synchronous workers answered as
//! one. So:
//!
//! - The worker that took the stack (the *owner*) opens a Unix listener in the abstract
//!   namespace (`docknet-share-PID`, scoped to the container's network namespace) and writes
//!   its pid and a random token into the family's shared page, which only processes forked
//!   from the family have.
//! - Another worker's first use of its listener finds the stack taken and *adopts* the
//!   listener instead: it connects to the owner, shows the token and the listener's
//!   descriptor number (the same in every worker: inherited from the parent), and puts the
//!   Unix socket in the descriptor's place. From then on `poll`, `select` and `epoll` on it
//!   are the kernel's, and `accept` takes a connection from it ([`accept`]).
//! - Two threads of the owner serve them: one (`docknet-share`) waits in the kernel for
//!   workers and their messages, the other (`docknet-share-out`) looks at the listeners some
//!   worker waits on, every [`AGE`] while a connection waits and less often while none does. A
//!   connection that waited from one look to the next while the owner's own program accepted
//!   nothing from that listener goes to a waiting worker, in turn: the owner relays it (as it relays a connection passed with
//!   `SCM_RIGHTS`, `relay::pass`) and sends the worker its Unix socket with the connection's
//!   addresses.
//! - A worker gets a connection only while it waits for one, as Linux wakes a process that
//!   waits in `accept`: it sends a *credit* when it adopts the listener, and again whenever its
//!   `accept` finds nothing handed over, and none is out.
//! - A worker whose owner refused it, dropped it or exited finds end of stream: its listener
//!   goes dormant again (never ready; a blocking `accept` waits for a signal), rather than
//!   readable for ever.
//!
//! An owner that keeps up accepts every connection itself within microseconds, so an
//! event-driven server (nginx) keeps its direct path; a busy synchronous worker's queue
//! spills over to its siblings, as the kernel spreads it. What it costs a handed connection:
//! the relay's two thread hand-offs per exchange (benchmarks.md, "Connections handed to
//! workers").
//!
//! The workers are processes of the same container, which trust each other as far as Linux
//! lets them; the owner checks them all the same: the same user (`SO_PEERCRED`), the token
//! within a second, the descriptor of one of its own listeners, a bounded number of workers
//! and of credits, messages of the sizes expected, and nothing handed to a worker that has not
//! read what it was sent. Anything else is dropped and counted.

use crate::ops::{self, stack_if_attached, TABLE};
use crate::relay::Relayed;
use crate::sock::{Conn, Sock};
use crate::sys::{self, R};
use crate::table::Entry;
use docknet_lib::Waker;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a connection waits for the owner's own `accept` before it goes to another worker.
pub const AGE: Duration = Duration::from_micros(500);
/// The longest time between two looks at a listener that had no connection waiting.
const LOOK_MAX: Duration = Duration::from_millis(50);
/// The longest time between two looks at a listener whose program keeps accepting: how long
/// it must then stop before a connection is handed on.
const KEEP_UP: Duration = Duration::from_millis(5);
/// A worker's hello: magic, the listener's descriptor (i32), the token (u64).
const HELLO_MAGIC: u32 = 0x444e_5348;
const HELLO_LEN: usize = 16;
/// How long a worker may take over its hello, and an adopting worker waits for the answer.
const HELLO_WAIT: Duration = Duration::from_secs(1);
/// The owner's answer to a hello it took.
const ACK: u8 = 0xac;
/// A connection handed over: magic, local address and port, peer port and address.
const CONN_MAGIC: u32 = 0x444e_5343;
const CONN_LEN: usize = 16;
/// A worker's connection made by the owner for it ([`dial`]): magic, the token (u64), the
/// peer's address and port.
const DIAL_MAGIC: u32 = 0x444e_5344;
const DIAL_LEN: usize = 20;
/// The owner's answer to a connection it could not make: magic, the errno (i32), padding to a
/// connection message's length.
const FAIL_MAGIC: u32 = 0x444e_5346;
/// Connections the owner makes for workers at once (a thread each, while it waits for the
/// peer's answer).
const MAX_DIALS: usize = 32;
/// Workers served at once, and the credits one may hold.
const MAX_WORKERS: usize = 256;
const MAX_CREDITS: u32 = 2;
/// How long an adopting worker waits for an owner that has just taken the stack to open its
/// service (once per process).
const SERVICE_WAIT: Duration = Duration::from_millis(200);

/// Connections handed to other workers so far (the owner's count).
pub static HANDED: AtomicU64 = AtomicU64::new(0);
/// Connections made for other workers so far (the owner's count).
pub static DIALED: AtomicU64 = AtomicU64::new(0);
/// Connections the owner is making for workers now.
static DIALING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Workers refused or dropped for what they did (the owner's count).
pub static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Whether this process's service runs.
static SERVING: AtomicBool = AtomicBool::new(false);
/// An adopting worker of this process has waited for the service once already.
static WAITED: AtomicBool = AtomicBool::new(false);
/// An adoption is under way in this process (one at a time; reset in a forked child, whose
/// copy of it may be a thread's that is not there).
static ADOPTING: AtomicBool = AtomicBool::new(false);
/// The kept peers of the sockets that adopted listeners whose owner is gone became ([`dormant`]).
static NEVER: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn name(pid: u32) -> String {
    format!("docknet-share-{pid}")
}

/// The thread of the owner's program that last accepted from a listener (0: none yet).
static ACCEPTOR: AtomicI32 = AtomicI32::new(0);

thread_local! {
    static TID: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// In the owner, at each `accept` of its program: notes which thread accepts.
pub fn accepting() {
    if SERVING.load(Ordering::Relaxed) {
        let tid = TID.with(|t| {
            if t.get() == 0 {
                t.set(sys::gettid());
            }
            t.get()
        });
        ACCEPTOR.store(tid, Ordering::Relaxed);
    }
}

/// Whether the thread of the owner's program that accepts is asleep (waiting for something
/// else: a database's answer, a timer), as opposed to running or waiting for a core. Handing a
/// connection to another worker pays then; while the owner computes, the other workers would
/// only take cores it needs (on a machine whose cores are all busy, handing on cost a
/// fifth of gunicorn's requests/s).
fn acceptor_asleep() -> bool {
    let tid = ACCEPTOR.load(Ordering::Relaxed);
    if tid == 0 {
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        // (the thread is gone)
        return true;
    };
    // "tid (comm) S ...": the state follows the last ')'
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    matches!(state, Some('S' | 'D'))
}

/// In a forked child: the parent's service is not this process's.
pub fn forked_child() {
    SERVING.store(false, Ordering::Relaxed);
    ADOPTING.store(false, Ordering::Relaxed);
    ACCEPTOR.store(0, Ordering::Relaxed);
    // (the thread that forked is a new thread here)
    TID.with(|t| t.set(0));
    WAITED.store(false, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------------------
// the owner

/// In the process that has just taken the pipe's stack at a fork: opens the service the other
/// workers adopt their listeners through (once).
pub fn serve() {
    if SERVING.swap(true, Ordering::AcqRel) {
        return;
    }
    let me = std::process::id();
    let (Some(token), Ok(lfd)) = (
        sys::random_u64().filter(|t| *t != 0),
        sys::unix_listen_abstract(&name(me), 64),
    ) else {
        SERVING.store(false, Ordering::Release);
        return;
    };
    let shared = Arc::new(Shared {
        workers: Mutex::new(Vec::new()),
        waker: Waker::new(),
    });
    let (a, b) = (shared.clone(), shared);
    // (threads that must not take the program's signals)
    let old = sys::block_all_signals();
    let spawned = std::thread::Builder::new()
        .name("docknet-share".into())
        .spawn(move || Door::new(lfd, token, a).run())
        .and_then(|_| {
            std::thread::Builder::new()
                .name("docknet-share-out".into())
                .spawn(move || hand_loop(&b))
        });
    sys::sigmask_set(old.as_ref());
    // (a thread that did start keeps its listener: nobody finds it, and nobody connects)
    if spawned.is_ok() {
        crate::family::set_share_service(me, token);
    }
}

/// A worker connected to the service.
struct Worker {
    fd: i32,
    /// The listener it waits on, by descriptor (`None` until its hello came).
    listener: Option<i32>,
    /// That listener's port (a descriptor number closed and reused for another listener is
    /// not the worker's).
    port: u16,
    /// Connections it will take now.
    credits: u32,
    /// When it connected (its hello is due within [`HELLO_WAIT`]).
    since: Instant,
}

/// What the owner's two threads share: the workers (locked while a thread sends to one or
/// closes one, so a descriptor is never reused under the other), and the waker of the thread
/// that sleeps on the stack, woken when a worker's credit changes.
struct Shared {
    workers: Mutex<Vec<Worker>>,
    waker: Waker,
}

impl Shared {
    fn workers(&self) -> MutexGuard<'_, Vec<Worker>> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Drops worker `i` of `ws` (its end of stream sends its listener dormant).
fn drop_worker(ws: &mut Vec<Worker>, i: usize) {
    let w = ws.swap_remove(i);
    let _ = sys::close(w.fd);
}

/// The kernel side: the Unix listener and the workers' messages.
struct Door {
    lfd: i32,
    token: u64,
    uid: u32,
    shared: Arc<Shared>,
}

impl Door {
    fn new(lfd: i32, token: u64, shared: Arc<Shared>) -> Door {
        Door {
            lfd,
            token,
            uid: sys::uid(),
            shared,
        }
    }

    fn run(self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            let now = Instant::now();
            fds.clear();
            fds.push(pollfd(self.lfd));
            let mut timeout: i32 = -1;
            {
                let mut ws = self.shared.workers();
                // a hello that did not come in time drops its worker
                for i in (0..ws.len()).rev() {
                    if ws[i].listener.is_none() && now.duration_since(ws[i].since) >= HELLO_WAIT {
                        REFUSED.fetch_add(1, Ordering::Relaxed);
                        drop_worker(&mut ws, i);
                    }
                }
                for w in ws.iter() {
                    fds.push(pollfd(w.fd));
                    if w.listener.is_none() {
                        let left = HELLO_WAIT.saturating_sub(now.duration_since(w.since));
                        let ms = left.as_millis() as i32 + 1;
                        timeout = if timeout < 0 { ms } else { timeout.min(ms) };
                    }
                }
            }
            match sys::poll(&mut fds, timeout) {
                Ok(_) | Err(libc::EINTR) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
            if fds[0].revents != 0 {
                self.admit();
            }
            for p in &fds[1..] {
                if p.revents != 0 {
                    self.hear(p.fd);
                }
            }
        }
    }

    /// New workers on the Unix listener: the same user as this process, or dropped.
    fn admit(&self) {
        loop {
            match sys::unix_accept(self.lfd) {
                Ok((c, uid)) => {
                    let mut ws = self.shared.workers();
                    if uid != self.uid || ws.len() >= MAX_WORKERS {
                        REFUSED.fetch_add(1, Ordering::Relaxed);
                        let _ = sys::close(c);
                        continue;
                    }
                    ws.push(Worker {
                        fd: c,
                        listener: None,
                        port: 0,
                        credits: 0,
                        since: Instant::now(),
                    });
                }
                Err(libc::EAGAIN | libc::ECONNABORTED | libc::EINTR) => return,
                // out of descriptors, or worse: try again later, not at once
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            }
        }
    }

    /// What the worker at `fd` sent: its hello, then one credit per byte; its end drops it.
    fn hear(&self, fd: i32) {
        // (looked up first, under the lock: a worker the other thread dropped since the poll
        // may have left its number to another descriptor of the process; a worker's socket
        // is non-blocking)
        let mut ws = self.shared.workers();
        let Some(i) = ws.iter().position(|w| w.fd == fd) else {
            return;
        };
        let mut b = [0u8; 64];
        let ok = match sys::read(fd, &mut b) {
            Ok(0) => false,
            Ok(DIAL_LEN) if ws[i].listener.is_none() => {
                // (the socket goes to the thread that makes the connection, or is closed)
                let w = ws.swap_remove(i);
                drop(ws);
                self.dial_for(w.fd, &b[..DIAL_LEN]);
                return;
            }
            Ok(n) if ws[i].listener.is_none() => n == HELLO_LEN && self.hello(&mut ws[i], &b[..n]),
            Ok(n) => {
                let w = &mut ws[i];
                w.credits = (w.credits + n as u32).min(MAX_CREDITS);
                true
            }
            Err(libc::EAGAIN | libc::EINTR) => return,
            Err(_) => false,
        };
        if ok {
            self.shared.waker.wake();
        } else {
            drop_worker(&mut ws, i);
        }
    }

    /// A worker's request for a connection (see [`dial`]), on its socket `fd`: with the token,
    /// to an address this stack reaches, made by a thread of its own (at most [`MAX_DIALS`]
    /// at once) that answers with the connection's relayed Unix socket, or with the error.
    fn dial_for(&self, fd: i32, b: &[u8]) {
        let magic = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        let mut t = [0u8; 8];
        t.copy_from_slice(&b[4..12]);
        if magic != DIAL_MAGIC || u64::from_ne_bytes(t) != self.token {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            let _ = sys::close(fd);
            return;
        }
        let to = SocketAddrV4::new(
            Ipv4Addr::new(b[12], b[13], b[14], b[15]),
            u16::from_be_bytes([b[16], b[17]]),
        );
        if DIALING.fetch_add(1, Ordering::AcqRel) >= MAX_DIALS {
            DIALING.fetch_sub(1, Ordering::AcqRel);
            answer_failed(fd, libc::EAGAIN);
            return;
        }
        let old = sys::block_all_signals();
        let spawned = std::thread::Builder::new()
            .name("docknet-dial".into())
            .spawn(move || {
                let msg = match connect_for_worker(to) {
                    Ok((theirs, local, peer)) => {
                        let sent = sys::send_with_fd(fd, &conn_msg(local, peer), theirs);
                        let _ = sys::close(theirs);
                        if sent == Ok(CONN_LEN) {
                            DIALED.fetch_add(1, Ordering::Relaxed);
                        }
                        None
                    }
                    Err(e) => Some(e),
                };
                match msg {
                    Some(e) => answer_failed(fd, e),
                    None => {
                        let _ = sys::close(fd);
                    }
                }
                DIALING.fetch_sub(1, Ordering::AcqRel);
            });
        sys::sigmask_set(old.as_ref());
        if spawned.is_err() {
            DIALING.fetch_sub(1, Ordering::AcqRel);
            answer_failed(fd, libc::EAGAIN);
        }
    }

    /// A worker's hello: the token, and the descriptor of one of this process's listeners.
    /// Answered when taken.
    fn hello(&self, w: &mut Worker, b: &[u8]) -> bool {
        let magic = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        let fd = i32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
        let mut t = [0u8; 8];
        t.copy_from_slice(&b[8..16]);
        let port = TABLE.sock(fd).as_deref().and_then(listener_port);
        let (Some(port), true) = (
            port,
            magic == HELLO_MAGIC && u64::from_ne_bytes(t) == self.token,
        ) else {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        if sys::send_nosignal(w.fd, &[ACK], false) != Ok(1) {
            return false;
        }
        w.listener = Some(fd);
        w.port = port;
        w.credits = 1;
        true
    }
}

/// The stack side: looks at the listeners some worker waits on, and hands on the connections
/// of one whose program left a connection waiting from one look to the next (it accepted
/// nothing from it meanwhile) while the thread that accepts sleeps on something else. Looks
/// come every [`AGE`] while the program leaves connections waiting, every [`KEEP_UP`] at most
/// while it keeps accepting, every [`LOOK_MAX`] at most while nothing waits. It never waits on
/// the stack itself: a waiter there wakes for every frame of the pipe, and one that did took a
/// fifth of a core beside a busy worker.
fn hand_loop(shared: &Shared) {
    let Some(st) = stack_if_attached() else {
        return;
    };
    // per listener with a connection waiting at the last look: how many connections the
    // program had accepted from it then
    let mut seen: Vec<(i32, u64)> = Vec::new();
    let mut out = Vec::new();
    let mut interval = AGE;
    loop {
        let token = shared.waker.token();
        let wanted = wanted(shared);
        let watches: Vec<docknet_lib::Watch<'_>> = wanted
            .iter()
            .filter_map(|(_, s)| s.watch(libc::POLLIN as u32))
            .collect();
        st.ready_now(&watches, &mut out);
        let mut now_seen = Vec::new();
        let mut stuck = false;
        for (k, _) in out.iter() {
            let Some((l, s)) = wanted.get(*k) else {
                continue;
            };
            let acc = accepts(s);
            // waiting since the last look, the program took nothing meanwhile, and it waits
            // for something else
            if seen.iter().any(|(f, a)| f == l && *a == acc) {
                stuck = true;
                if acceptor_asleep() {
                    hand_out(shared, *l, s);
                }
            }
            // (counted after the hand-out, whose accepts are not the program's)
            now_seen.push((*l, accepts(s)));
        }
        seen = now_seen;
        // looked at every AGE while the program leaves a connection waiting; less and less
        // often while it keeps up (down to every KEEP_UP), or while nothing waits
        interval = if stuck {
            AGE
        } else if seen.is_empty() {
            (interval * 2).min(LOOK_MAX)
        } else {
            (interval * 2).min(KEEP_UP)
        };
        // (a worker's new credit ends the wait: its listener is looked at again soon)
        if wanted.is_empty() {
            shared.waker.wait(token, None);
            interval = AGE;
        } else {
            shared.waker.wait(token, Some(interval));
        }
    }
}

/// The listeners (descriptor and socket) that a worker with credit waits on. A worker whose
/// listener is no longer one here is dropped.
fn wanted(shared: &Shared) -> Vec<(i32, Arc<Sock>)> {
    let mut v: Vec<(i32, Arc<Sock>)> = Vec::new();
    let mut ws = shared.workers();
    for i in (0..ws.len()).rev() {
        let Some(l) = ws[i].listener else {
            continue;
        };
        match TABLE
            .sock(l)
            .filter(|s| listener_port(s) == Some(ws[i].port))
        {
            Some(s) => {
                if ws[i].credits > 0 && !v.iter().any(|(f, _)| *f == l) {
                    v.push((l, s));
                }
            }
            None => drop_worker(&mut ws, i),
        }
    }
    v
}

/// The port of the listener `s`, `None` if it is no listener.
fn listener_port(s: &Sock) -> Option<u16> {
    match s.conn.get() {
        Some(Conn::Listener(l, _)) => Some(l.port()),
        _ => None,
    }
}

/// How many connections this process has accepted from the listener `s`.
fn accepts(s: &Sock) -> u64 {
    match s.conn.get() {
        Some(Conn::Listener(l, _)) => l.accepts(),
        _ => 0,
    }
}

/// The connections waiting on listener `l` (socket `s`) go to the workers with credit, in
/// turn, each to a worker that has read everything it was sent.
fn hand_out(shared: &Shared, l: i32, s: &Arc<Sock>) {
    let Some(Conn::Listener(listener, _)) = s.conn.get() else {
        return;
    };
    let mut ws = shared.workers();
    let mut next = 0;
    loop {
        let n = ws.len();
        let Some(k) = (0..n).map(|j| (next + j) % n).find(|&j| {
            ws[j].listener == Some(l) && ws[j].credits > 0 && sys::unread_by_peer(ws[j].fd) == Ok(0)
        }) else {
            return;
        };
        let Ok((t, peer)) = listener.try_accept() else {
            return;
        };
        next = k + 1;
        let c = Arc::new(ops::accepted(s, t, false));
        let Some(Conn::Stream(t)) = c.conn.get() else {
            return;
        };
        let local = t
            .local_addr()
            .map_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), ops::as_v4);
        let peer = ops::as_v4(peer);
        // the worker's end of a Unix socket this process relays to the connection from now
        // on (a connection that cannot be relayed, or sent, is closed: FIN)
        // (out of descriptors: that connection ends, and the rest wait for the program)
        let Ok(theirs) = crate::relay::pass(&c) else {
            return;
        };
        let sent = sys::send_with_fd(ws[k].fd, &conn_msg(local, peer), theirs);
        let _ = sys::close(theirs);
        if sent == Ok(CONN_LEN) {
            ws[k].credits -= 1;
            HANDED.fetch_add(1, Ordering::Relaxed);
        } else {
            drop_worker(&mut ws, k);
        }
    }
}

/// Makes a connection to `to` in this process's stack for another worker, waiting for the
/// peer's answer as a blocking `connect` would (at most the stack's connect timeout), and
/// relays it: the worker's end of its Unix socket, the local address, the peer's.
fn connect_for_worker(to: SocketAddrV4) -> R<(i32, SocketAddrV4, SocketAddrV4)> {
    let st = stack_if_attached().ok_or(libc::ENETUNREACH)?;
    if crate::sock::route_for(st, *to.ip()) == crate::sock::Route::Kernel {
        return Err(libc::ENETUNREACH);
    }
    let t = docknet_lib::TcpStream::connect_start(st, to)
        .map_err(|e| crate::errno::of(&e, crate::errno::Op::Connect))?;
    let s = Arc::new(Sock::with_conn(
        crate::sock::Proto::Tcp,
        false,
        Conn::Stream(t),
    ));
    let Some(Conn::Stream(t)) = s.conn.get() else {
        return Err(libc::EIO);
    };
    let deadline = Instant::now() + st.config().connect_timeout;
    let mut out = Vec::new();
    loop {
        match t.connect_result() {
            Some(Ok(())) => break,
            Some(Err(e)) => return Err(crate::errno::of(&e, crate::errno::Op::Connect)),
            None => {}
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Err(libc::ETIMEDOUT);
        };
        let Some(w) = s.watch(libc::POLLOUT as u32) else {
            return Err(libc::EIO);
        };
        st.wait_wakeable_blocking(&[w], Some(left), &[], &mut out)
            .map_err(|e| crate::errno::of(&e, crate::errno::Op::Connect))?;
    }
    s.established.store(true, Ordering::Relaxed);
    let local = t
        .local_addr()
        .map_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), ops::as_v4);
    let theirs = crate::relay::pass(&s)?;
    Ok((theirs, local, to))
}

/// Tells a worker on `fd` that its connection could not be made (`errno`), and lets it go.
fn answer_failed(fd: i32, errno: i32) {
    let mut m = [0u8; CONN_LEN];
    m[0..4].copy_from_slice(&FAIL_MAGIC.to_ne_bytes());
    m[4..8].copy_from_slice(&errno.to_ne_bytes());
    let _ = sys::send_nosignal(fd, &m, false);
    let _ = sys::close(fd);
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn conn_msg(local: SocketAddrV4, peer: SocketAddrV4) -> [u8; CONN_LEN] {
    let mut m = [0u8; CONN_LEN];
    m[0..4].copy_from_slice(&CONN_MAGIC.to_ne_bytes());
    m[4..8].copy_from_slice(&local.ip().octets());
    m[8..10].copy_from_slice(&local.port().to_be_bytes());
    m[10..12].copy_from_slice(&peer.port().to_be_bytes());
    m[12..16].copy_from_slice(&peer.ip().octets());
    m
}

/// The addresses of a connection message, `None` if it is not one.
fn parse_conn(m: &[u8]) -> Option<(SocketAddrV4, SocketAddrV4)> {
    if m.len() != CONN_LEN || u32::from_ne_bytes([m[0], m[1], m[2], m[3]]) != CONN_MAGIC {
        return None;
    }
    let ip = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    let port = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
    Some((
        SocketAddrV4::new(ip(&m[4..8]), port(&m[8..10])),
        SocketAddrV4::new(ip(&m[12..16]), port(&m[10..12])),
    ))
}

// ---------------------------------------------------------------------------------------
// the other workers

/// In a forked worker whose sibling drives the stack: turns its listener `fd` (the dead copy
/// `s`) into a Unix socket connected to the owner's service, if the owner runs one and takes
/// it. Nothing changes when it does not (the listener stays as it was: never ready).
pub fn adopt(fd: i32, s: &Sock) {
    // (another thread's adoption finishes first: it may be of this very listener)
    let start = Instant::now();
    while ADOPTING.swap(true, Ordering::AcqRel) {
        if start.elapsed() > HELLO_WAIT + SERVICE_WAIT {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            ADOPTING.store(false, Ordering::Release);
        }
    }
    let _done = Done;
    if TABLE.relayed(fd).is_some() {
        return;
    }
    let Some(Conn::Listener(l, ip)) = s.conn.get() else {
        return;
    };
    let Some(owner) = stack_if_attached().and_then(docknet_lib::Stack::owner) else {
        return;
    };
    // (a parent that kept the stack offers nothing: only a worker that took it does)
    if owner == std::process::id() || owner == std::os::unix::process::parent_id() {
        return;
    }
    // an owner that has just taken the stack may be opening its service right now
    let start = Instant::now();
    let (pid, token) = loop {
        match crate::family::share_service() {
            Some((p, t)) if p == owner => break (p, t),
            _ if !WAITED.load(Ordering::Relaxed) && start.elapsed() < SERVICE_WAIT => {
                std::thread::sleep(Duration::from_millis(1));
            }
            _ => {
                WAITED.store(true, Ordering::Relaxed);
                return;
            }
        }
    };
    let Ok(u) = sys::unix_connect_abstract(&name(pid)) else {
        return;
    };
    let mut hello = [0u8; HELLO_LEN];
    hello[0..4].copy_from_slice(&HELLO_MAGIC.to_ne_bytes());
    hello[4..8].copy_from_slice(&fd.to_ne_bytes());
    hello[8..16].copy_from_slice(&token.to_ne_bytes());
    let mut ack = [0u8; 1];
    let taken = sys::send_nosignal(u, &hello, true) == Ok(HELLO_LEN)
        && sys::set_recv_timeout(u, HELLO_WAIT).is_ok()
        && sys::read(u, &mut ack) == Ok(1)
        && ack[0] == ACK
        && sys::set_recv_timeout(u, Duration::ZERO).is_ok();
    if !taken {
        let _ = sys::close(u);
        return;
    }
    if s.nonblock.load(Ordering::Relaxed) {
        let _ = sys::fcntl_int(u, libc::F_SETFL, libc::O_RDWR | libc::O_NONBLOCK);
    }
    let local = SocketAddrV4::new(*ip, l.port());
    if sys::dup_over(u, fd).is_err() {
        return;
    }
    let r = Relayed {
        local,
        peer: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
        opts: Mutex::new(s.opts().clone()),
        listening: true,
        // (the hello counts as one)
        credit: AtomicBool::new(true),
    };
    // (the dead copy is forgotten, never dropped: its stack is another process's)
    if let Some(old) = TABLE.insert(fd, Entry::Relayed(Arc::new(r))) {
        std::mem::forget(old);
    }
}

/// In a forked worker whose sibling drives the stack: that sibling's service (its pid and the
/// family's token), where it offers one (so a connection to DockNet can be made there:
/// [`dial`]).
fn owner_service() -> Option<(u32, u64)> {
    let owner = stack_if_attached().and_then(docknet_lib::Stack::owner)?;
    crate::family::share_service().filter(|(p, _)| *p == owner && *p != std::process::id())
}

/// `connect(2)` of the kernel's TCP socket `fd` to `to`, in a forked worker whose sibling
/// drives the stack: where `to` is on DockNet, the owner makes the connection for it
/// (`Door::dial_for`) and relays it, and the socket becomes the Unix socket it relays on, its
/// addresses and TCP options answered as the connection's (as an accepted connection handed
/// over). `None` where the owner offers no service or `to` is the kernel's (the kernel's call,
/// as before). The call returns once the peer answered (at most the stack's connect timeout),
/// also for a non-blocking socket (0 rather than `EINPROGRESS`: Linux may do so too, and
/// programs take it as connected); signal handlers run meanwhile and the wait goes on, so the
/// socket is never left half made.
pub fn dial(fd: i32, to: SocketAddrV4) -> Option<R<()>> {
    let st = stack_if_attached()?;
    if crate::sock::route_for(st, *to.ip()) == crate::sock::Route::Kernel {
        return None;
    }
    let (pid, token) = owner_service()?;
    // a TCP socket of the kernel, not connected yet (a Unix socket, a UDP socket, or one of
    // another family are not for DockNet; a connected one answers as the kernel does)
    let opt = |level, name| sys::get_int_opt(fd, level, name).ok();
    if opt(libc::SOL_SOCKET, libc::SO_DOMAIN) != Some(libc::AF_INET)
        || opt(libc::SOL_SOCKET, libc::SO_TYPE) != Some(libc::SOCK_STREAM)
        || sys::has_peer(fd)
    {
        return None;
    }
    let deadline = Instant::now() + st.config().connect_timeout + HELLO_WAIT;
    let (c, local, peer) = loop {
        match ask_owner(pid, token, to, deadline) {
            // (the owner was making as many connections as it makes at once)
            Err(libc::EAGAIN) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(libc::EAGAIN) => return Some(Err(libc::ETIMEDOUT)),
            Err(e) => return Some(Err(e)),
            Ok(x) => break x,
        }
    };
    // the descriptor's status flags (O_NONBLOCK) stay the program's, and so do the options it
    // set before the connect, on the kernel's socket: its timeouts and keepalive on the Unix
    // socket (a relayed connection's socket-level options are that socket's), TCP_NODELAY as
    // the connection's
    let fl = sys::fcntl_int(fd, libc::F_GETFL, 0).unwrap_or(libc::O_RDWR);
    for name in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO, libc::SO_KEEPALIVE] {
        let _ = sys::copy_opt(fd, c, libc::SOL_SOCKET, name);
    }
    let opts = crate::sock::Opts {
        nodelay: opt(libc::IPPROTO_TCP, libc::TCP_NODELAY).is_some_and(|v| v != 0),
        keepalive: opt(libc::SOL_SOCKET, libc::SO_KEEPALIVE).is_some_and(|v| v != 0),
        ..Default::default()
    };
    if let Err(e) = sys::dup_over(c, fd) {
        return Some(Err(e));
    }
    let _ = sys::fcntl_int(fd, libc::F_SETFL, fl);
    let conn = Relayed {
        local,
        peer,
        opts: Mutex::new(opts),
        listening: false,
        credit: AtomicBool::new(false),
    };
    if let Some(old) = TABLE.insert(fd, Entry::Relayed(Arc::new(conn))) {
        drop(old);
    }
    Some(Ok(()))
}

/// One request to the owner (`pid`, `token`) for a connection to `to`: the relayed Unix
/// socket, the local address and the peer's; the owner's error, `EAGAIN` when it makes as
/// many as it does at once, `ETIMEDOUT` past `deadline`.
fn ask_owner(
    pid: u32,
    token: u64,
    to: SocketAddrV4,
    deadline: Instant,
) -> R<(i32, SocketAddrV4, SocketAddrV4)> {
    let u = sys::unix_connect_abstract(&name(pid)).map_err(|_| libc::ECONNREFUSED)?;
    let mut m = [0u8; DIAL_LEN];
    m[0..4].copy_from_slice(&DIAL_MAGIC.to_ne_bytes());
    m[4..12].copy_from_slice(&token.to_ne_bytes());
    m[12..16].copy_from_slice(&to.ip().octets());
    m[16..18].copy_from_slice(&to.port().to_be_bytes());
    let wait = deadline.saturating_duration_since(Instant::now());
    if sys::send_nosignal(u, &m, true) != Ok(DIAL_LEN)
        || wait.is_zero()
        || sys::set_recv_timeout(u, wait).is_err()
    {
        let _ = sys::close(u);
        return Err(libc::ECONNREFUSED);
    }
    let mut a = [0u8; CONN_LEN];
    // (handlers run while it waits; a signal does not end the wait, which is bounded)
    let got = loop {
        match crate::sig::asleep(|_| sys::recv_with_fd(u, &mut a)) {
            Err(libc::EINTR) if Instant::now() < deadline => {}
            r => break r,
        }
    };
    let _ = sys::close(u);
    let (n, c) = match got {
        Ok(x) => x,
        Err(libc::EAGAIN | libc::EINTR) => return Err(libc::ETIMEDOUT),
        Err(e) => return Err(e),
    };
    let Some(c) = c else {
        let failed = n == CONN_LEN && u32::from_ne_bytes([a[0], a[1], a[2], a[3]]) == FAIL_MAGIC;
        let e = i32::from_ne_bytes([a[4], a[5], a[6], a[7]]);
        return Err(if failed && e > 0 {
            e
        } else {
            libc::ECONNREFUSED
        });
    };
    match parse_conn(&a[..n]) {
        Some((local, peer)) => Ok((c, local, peer)),
        None => {
            let _ = sys::close(c);
            Err(libc::ECONNREFUSED)
        }
    }
}

/// `accept4(2)` on a listener adopted from the owner ([`adopt`]): the next connection the owner
/// handed this worker, as a descriptor of the Unix socket it relays it on (its addresses and
/// TCP options answered as the connection's). `None` when `fd` is no such listener.
pub fn accept(fd: i32, flags: i32) -> Option<R<(i32, SocketAddrV4)>> {
    let r = TABLE.relayed(fd).filter(|r| r.listening)?;
    let nonblocking = sys::fcntl_int(fd, libc::F_GETFL, 0).is_ok_and(|f| f & libc::O_NONBLOCK != 0);
    let mut mark = crate::sig::mark();
    loop {
        let mut m = [0u8; CONN_LEN];
        // what was handed over already
        match took(
            fd,
            &r,
            sys::recv_with_fd_flags(fd, &mut m, libc::MSG_DONTWAIT),
            &m,
            flags,
        ) {
            Some(Err(libc::EAGAIN)) => {}
            Some(x) => return Some(x),
            None => continue,
        }
        // nothing: this worker waits for one now
        if !r.credit.swap(true, Ordering::AcqRel) {
            let _ = sys::send_nosignal(fd, &[1], false);
        }
        if nonblocking {
            return Some(Err(libc::EAGAIN));
        }
        // (a sleep where the program's signal handlers run, as in the kernel's accept; a
        // handler that waited for it ends the call unless it has SA_RESTART, and so does the
        // kernel's receive for one that comes while it waits)
        let got = crate::sig::asleep(|_| {
            if mark.take() == Some(false) {
                Err(libc::EINTR)
            } else {
                sys::recv_with_fd_flags(fd, &mut m, 0)
            }
        });
        match took(fd, &r, got, &m, flags) {
            Some(x) => return Some(x),
            None => continue,
        }
    }
}

/// What a receive on an adopted listener brought: a connection (made this process's
/// descriptor), an error, or `None` for a message to skip.
fn took(
    fd: i32,
    r: &Relayed,
    got: R<(usize, Option<i32>)>,
    m: &[u8; CONN_LEN],
    flags: i32,
) -> Option<R<(i32, SocketAddrV4)>> {
    let (n, c) = match got {
        Ok(x) => x,
        // the owner is gone, or dropped this worker, with a credit of it unread
        Err(libc::ECONNRESET | libc::EPIPE | libc::ENOTCONN) => (0, None),
        Err(e) => return Some(Err(e)),
    };
    let Some(c) = c else {
        if n == 0 {
            // the owner is gone (or dropped this worker): no connection comes any more, and
            // the listener waits as a dormant one (the caller looks again)
            return if dormant(fd, r) {
                None
            } else {
                Some(Err(libc::EAGAIN))
            };
        }
        // a connection whose descriptor did not fit here (the process is out of them):
        // the kernel closed it, as Linux's accept fails
        r.credit.store(false, Ordering::Release);
        return Some(Err(libc::EMFILE));
    };
    r.credit.store(false, Ordering::Release);
    let Some((local, peer)) = parse_conn(&m[..n]) else {
        let _ = sys::close(c);
        return None;
    };
    // (received close-on-exec; the caller's flags decide)
    if flags & libc::SOCK_CLOEXEC == 0 {
        let _ = sys::fcntl_int(c, libc::F_SETFD, 0);
    }
    if flags & libc::SOCK_NONBLOCK != 0 {
        let _ = sys::fcntl_int(c, libc::F_SETFL, libc::O_RDWR | libc::O_NONBLOCK);
    }
    let conn = Relayed {
        local,
        peer,
        opts: Mutex::new(r.opts().clone()),
        listening: false,
        credit: AtomicBool::new(false),
    };
    if let Some(old) = TABLE.insert(c, Entry::Relayed(Arc::new(conn))) {
        std::mem::forget(old);
    }
    Some(Ok((c, peer)))
}

/// An adopted listener whose owner is gone becomes a socket nothing is ever sent to (its peer
/// is kept, never written): never ready, as a dormant listener, rather than readable at end of
/// stream for ever.
fn dormant(fd: i32, r: &Relayed) -> bool {
    // (no credit is sent any more)
    r.credit.store(true, Ordering::Release);
    let Ok((mine, kept)) = sys::socketpair(libc::SOCK_STREAM) else {
        return false;
    };
    let fl = sys::fcntl_int(fd, libc::F_GETFL, 0).unwrap_or(libc::O_RDWR);
    let done = sys::dup_over(mine, fd).is_ok();
    if done {
        let _ = sys::fcntl_int(fd, libc::F_SETFL, fl);
        NEVER.lock().unwrap_or_else(|e| e.into_inner()).push(kept);
    } else {
        let _ = sys::close(kept);
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_message_reads_back_and_nothing_else_does() {
        let local = SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 8000);
        let peer = SocketAddrV4::new(Ipv4Addr::new(10, 9, 8, 7), 40123);
        let m = conn_msg(local, peer);
        assert_eq!(parse_conn(&m), Some((local, peer)));
        assert_eq!(parse_conn(&m[..CONN_LEN - 1]), None);
        let mut bad = m;
        bad[0] ^= 1;
        assert_eq!(parse_conn(&bad), None);
    }
}
