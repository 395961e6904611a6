//! poll, select and epoll over DockNet sockets and kernel descriptors mixed.
//!
//! * **DockNet only**: served in userspace by [`Stack::wait_wakeable`] (spins, then sleeps on
//!   the pipe's rings), the kernel never involved.
//! * **Kernel only**: passed to libc.
//! * **Mixed**: first a check of both without waiting; if nothing is ready, the thread
//!   sleeps in the kernel on its kernel descriptors plus one eventfd, and registers the
//!   DockNet sockets it waits for with the **notifier**, a thread that waits for them on the
//!   stack and signals the eventfd when one is ready.
//!
//! An epoll instance keeps its DockNet members beside the kernel's epoll (which holds the
//! kernel members), by descriptor and socket id: a socket closed without `EPOLL_CTL_DEL`
//! leaves the set once its last descriptor is closed, as the kernel's epoll forgets a file
//! (by the socket's count of descriptors, not by who holds it: a wait in progress and the
//! notifier hold the sockets they watch, and a closed socket kept in the set by them would be
//! watched again by the next wait, and so held for as long as that wait lasts, its FIN never
//! sent). Edge-triggered members report
//! a direction again only after a read-side (write-side) call on the socket since the last
//! report (see [`Member::edge_ok`]); one-shot members are disabled after a report until
//! `EPOLL_CTL_MOD`.

use crate::epoll_set::{Member, Members};
use crate::ops::{self, stack_if_attached, TABLE};
use crate::sock::Sock;
use crate::sys::{self, R};
use docknet_lib::{Ready, Stack, Waited, Waker, Watch};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// The epoll data our wake-up eventfd carries in a kernel epoll (filtered out of results).
const WAKE_DATA: u64 = 0xd0c4_7e70_0000_0001;

/// Held (shared) by every use of an epoll set's lock here (a look takes the set's lock and
/// then the stack's); `fork`'s prepare handler takes it whole before it takes the stack's
/// lock, so no thread holds a set's lock across a fork (the child would find it held for
/// good).
static LOOKS: RwLock<()> = RwLock::new(());

/// Holds off every look at an epoll set until the result is dropped (across a `fork`).
pub fn hold_looks() -> RwLockWriteGuard<'static, ()> {
    LOOKS.write().unwrap_or_else(|e| e.into_inner())
}

/// An epoll instance.
#[derive(Debug)]
pub struct Epoll {
    /// The kernel's epoll descriptor (the program's).
    pub kfd: i32,
    /// DockNet members (and sockets not yet decided, mirrored here while the kernel's epoll
    /// holds them).
    pub members: Mutex<Members>,
    /// Kernel descriptors added (an upper bound: a closed one leaves the kernel's set
    /// silently).
    pub kernel_members: AtomicUsize,
    /// Wakes this instance's waits when its set changes.
    pub waker: Waker,
    /// The eventfd in the kernel's epoll that the notifier signals (-1: not yet made).
    wake_fd: AtomicI32,
    /// The descriptor table's generation when closed members were last dropped.
    pruned_at: AtomicU64,
}

impl Drop for Epoll {
    fn drop(&mut self) {
        let fd = self.wake_fd.load(Ordering::Relaxed);
        if fd >= 0 && !ops::forked() {
            let _ = sys::close(fd);
        }
    }
}

impl Epoll {
    /// The record of the kernel epoll `kfd`.
    pub fn new(kfd: i32) -> Epoll {
        Epoll {
            kfd,
            members: Mutex::new(Members::default()),
            kernel_members: AtomicUsize::new(0),
            waker: Waker::new(),
            wake_fd: AtomicI32::new(-1),
            pruned_at: AtomicU64::new(u64::MAX),
        }
    }

    fn members(&self) -> std::sync::MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the members whose socket closed (`m`: the locked members). A socket closes only
    /// by a change of the descriptor table, so the look at every member is skipped while the
    /// table is as it was at the last one: a program that changes its interest per request
    /// (wrk: `EPOLL_CTL_MOD` twice) and waits once per request paid it three times a request.
    fn prune(&self, m: &mut Members) {
        let g = TABLE.generation();
        if self.pruned_at.swap(g, Ordering::AcqRel) != g {
            m.retain(Member::live);
        }
    }

    /// `epoll_ctl`: `None` when the kernel's epoll takes it (a kernel descriptor; for a socket
    /// not yet decided the caller passes it to the kernel as well and mirrors it here).
    pub fn ctl(&self, op: i32, fd: i32, ev: Option<(u32, u64)>) -> Option<R<()>> {
        let s = TABLE.sock(fd)?;
        if fd == self.kfd {
            return Some(Err(libc::EINVAL));
        }
        let looking = LOOKS.read().unwrap_or_else(|e| e.into_inner());
        let mut m = self.members();
        self.prune(&mut m);
        let pos = m.iter().position(|x| x.fd == fd && x.id == s.id);
        let r = match op {
            libc::EPOLL_CTL_ADD => match (pos, ev) {
                (Some(_), _) => Err(libc::EEXIST),
                (None, None) => Err(libc::EFAULT),
                (None, Some((e, d))) => {
                    m.push(Member::new(fd, &s, e, d));
                    Ok(())
                }
            },
            libc::EPOLL_CTL_MOD => match (pos, ev) {
                (None, _) => Err(libc::ENOENT),
                (Some(_), None) => Err(libc::EFAULT),
                (Some(i), Some((e, _))) if e & libc::EPOLLEXCLUSIVE as u32 != 0 => {
                    let _ = i;
                    Err(libc::EINVAL)
                }
                (Some(i), Some((e, d))) => {
                    m.replace(i, Member::new(fd, &s, e, d));
                    Ok(())
                }
            },
            libc::EPOLL_CTL_DEL => match pos {
                None => Err(libc::ENOENT),
                Some(i) => {
                    m.remove(i);
                    Ok(())
                }
            },
            _ => Err(libc::EINVAL),
        };
        drop(m);
        drop(looking);
        self.waker.wake();
        if s.adopted() {
            Some(r)
        } else {
            // the kernel's epoll holds it until it goes to DockNet; its answer counts
            None
        }
    }

    /// `epoll_wait` with DockNet members: events into `out` (at most its length).
    pub fn wait(&self, out: &mut [libc::epoll_event], timeout_ms: i32) -> R<usize> {
        let Some(st) = stack_if_attached() else {
            return sys::epoll_wait(self.kfd, out, timeout_ms);
        };
        let deadline = deadline_of(timeout_ms);
        let mut mark = crate::sig::mark();
        loop {
            let token = self.waker.token();
            let stoken = crate::sig::SIG_WAKER.token();
            let (mut n, cursor, any) = self.collect(st, out);
            let kernel = self.kernel_members.load(Ordering::Relaxed) > 0
                || self.wake_fd.load(Ordering::Relaxed) >= 0;
            if kernel && n < out.len() {
                n += self.kernel_events(&mut out[n..], 0)?;
            }
            if n > 0 {
                return Ok(n);
            }
            let left = remaining(deadline);
            if left == Some(Duration::ZERO) {
                return Ok(0);
            }
            if !any && !kernel {
                // nothing to wait for but time (or a change of the set)
                self.waker.wait(token, left);
                if remaining(deadline) == Some(Duration::ZERO) {
                    return Ok(0);
                }
                continue;
            }
            if self.kernel_members.load(Ordering::Relaxed) == 0 {
                // DockNet only: wait in userspace until a connection changes (or a member
                // the change log cannot name may have: anything the stack takes in)
                let wakers = [(&self.waker, token), (&crate::sig::SIG_WAKER, stoken)];
                match st.wait_changes(cursor, left, &wakers) {
                    Ok(Waited::TimedOut) => return Ok(0),
                    // epoll_wait is never restarted after a handler
                    Ok(Waited::Woken) if mark.take().is_some() => return Err(libc::EINTR),
                    Ok(_) => continue,
                    Err(e) => return Err(crate::errno::of(&e, crate::errno::Op::Io)),
                }
            }
            // mixed: look at both for the idle policy's spin and yield time, then sleep in the
            // kernel, the notifier signals our eventfd
            let mut spin = Spin::new(deadline);
            let mut n = 0;
            while spin.next() {
                n = self.collect(st, out).0;
                n += self.kernel_events(&mut out[n..], 0)?;
                if n > 0 {
                    break;
                }
                if mark.take().is_some() {
                    spin.interrupted = true;
                    break;
                }
            }
            if n > 0 {
                return Ok(n);
            }
            if spin.interrupted {
                return Err(libc::EINTR);
            }
            let socks = self.active();
            let wfd = self.wake_fd()?;
            let id = NOTIFIER.register(&socks, wfd);
            let r = self.kernel_events(out, ms(left));
            NOTIFIER.deregister(id);
            sys::eventfd_drain(wfd);
            let k = r?;
            let d = self.collect(st, &mut out[k..]).0;
            if k + d > 0 {
                return Ok(k + d);
            }
            if remaining(deadline) == Some(Duration::ZERO) {
                return Ok(0);
            }
        }
    }

    /// The live, enabled DockNet members as (socket, events they want now). A member whose
    /// socket is gone (its last descriptor closed) leaves the set here; one whose descriptor
    /// was closed while a `dup` keeps the socket open stays, as in the kernel's epoll.
    fn active(&self) -> Vec<(Arc<Sock>, u32)> {
        let _looking = LOOKS.read().unwrap_or_else(|e| e.into_inner());
        let mut m = self.members();
        self.prune(&mut m);
        m.iter()
            .filter(|x| !x.disabled)
            .filter_map(|x| {
                let s = x.sock.upgrade()?;
                if !s.adopted() {
                    return None;
                }
                let gens = (
                    s.rd_gen.load(Ordering::Relaxed),
                    s.wr_gen.load(Ordering::Relaxed),
                );
                let (r, w) = x.edge_ok(gens);
                let mut ev = x.events;
                if !r {
                    ev &= !((libc::EPOLLIN | libc::EPOLLRDNORM | libc::EPOLLRDHUP | libc::EPOLLPRI)
                        as u32);
                }
                if !w {
                    ev &= !((libc::EPOLLOUT | libc::EPOLLWRNORM) as u32);
                }
                (ev & (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLPRI) as u32
                    != 0)
                    .then_some((s, ev))
            })
            .collect()
    }

    /// Looks at the DockNet members that may be ready (`Members::look`), polling the stack
    /// once when none is, and writes their events. Returns how many, where the set read the
    /// stack's change log to, and whether any member can report at all (not all one-shot
    /// and spent).
    fn collect(&self, st: &Stack, out: &mut [libc::epoll_event]) -> (usize, u64, bool) {
        // (no fork while a look holds the set's lock and waits for the stack's)
        let _looking = LOOKS.read().unwrap_or_else(|e| e.into_inner());
        let mut m = self.members();
        let mut n = self.look(st, &mut m, out);
        if n == 0 && !m.is_empty() && !out.is_empty() {
            // what the rings hold: one poll, and a look at what it changed
            st.poll_now();
            n = self.look(st, &mut m, out);
        }
        (n, m.cursor(), m.iter().any(|x| !x.disabled))
    }

    /// One look (`m`: the members, locked): what the change log names since the last, then
    /// the members that may be ready.
    fn look(&self, st: &Stack, m: &mut Members, out: &mut [libc::epoll_event]) -> usize {
        self.prune(m);
        let mut cursor = m.cursor();
        let mut keys: Few<docknet_lib::SocketKey> = Few::new();
        let whole = st.changes(&mut cursor, |k| keys.push(k));
        m.named(&keys);
        m.read_to(cursor, whole);
        m.look(st, out)
    }

    fn kernel_events(&self, out: &mut [libc::epoll_event], timeout_ms: i32) -> R<usize> {
        let n = sys::epoll_wait(self.kfd, out, timeout_ms)?;
        // our wake-up eventfd is not the program's
        let mut k = 0;
        for i in 0..n {
            let (ev, data) = (out[i].events, out[i].u64);
            if data != WAKE_DATA {
                out[k] = libc::epoll_event {
                    events: ev,
                    u64: data,
                };
                k += 1;
            }
        }
        Ok(k)
    }

    fn wake_fd(&self) -> R<i32> {
        let fd = self.wake_fd.load(Ordering::Acquire);
        if fd >= 0 {
            return Ok(fd);
        }
        let e = sys::eventfd(true)?;
        let ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: WAKE_DATA,
        };
        if let Err(err) = sys::epoll_ctl(self.kfd, libc::EPOLL_CTL_ADD, e, Some(ev)) {
            let _ = sys::close(e);
            return Err(err);
        }
        match self
            .wake_fd
            .compare_exchange(-1, e, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(e),
            Err(other) => {
                let _ = sys::close(e);
                Ok(other)
            }
        }
    }
}

/// The busy phase of a mixed wait: rounds while the idle policy's spin time lasts, then
/// rounds that yield the core until its yield time has passed too (the deadline permitting).
struct Spin {
    start: Instant,
    spin: Duration,
    total: Duration,
    deadline: Option<Instant>,
    /// Set by a caller that stopped its rounds for a signal.
    interrupted: bool,
}

impl Spin {
    fn new(deadline: Option<Instant>) -> Spin {
        let (spin, total) = match ops::idle_policy() {
            docknet_pipe::IdlePolicy::Spin => (Duration::MAX, Duration::MAX),
            docknet_pipe::IdlePolicy::Adaptive { spin, yield_for } => (spin, spin + yield_for),
            docknet_pipe::IdlePolicy::Block => (Duration::ZERO, Duration::ZERO),
        };
        Spin {
            start: Instant::now(),
            spin,
            total,
            deadline,
            interrupted: false,
        }
    }

    /// Whether to take another round (yielding first once the spin time is over).
    fn next(&mut self) -> bool {
        let e = self.start.elapsed();
        if e >= self.total || self.deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        if e >= self.spin {
            std::thread::yield_now();
        }
        true
    }
}

/// A short list kept on the stack (what one `poll` or `select` call looks at, usually a
/// handful of descriptors).
pub(crate) type Few<T> = smallvec::SmallVec<[T; 8]>;

fn deadline_of(timeout_ms: i32) -> Option<Instant> {
    (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64))
}

fn remaining(d: Option<Instant>) -> Option<Duration> {
    d.map(|d| d.saturating_duration_since(Instant::now()))
}

fn ms(d: Option<Duration>) -> i32 {
    match d {
        None => -1,
        Some(d) => {
            d.as_millis().min(i32::MAX as u128) as i32
                + i32::from(d.subsec_nanos() % 1_000_000 != 0)
        }
    }
}

/// One look at `socks` (one poll of the stack when none is ready): (index, poll bits) of
/// those ready for what they are watched for (errors always count).
fn check(st: &Stack, socks: &[(Arc<Sock>, u32)]) -> Few<(usize, u32)> {
    let r = check_now(st, socks);
    if !r.is_empty() {
        return r;
    }
    st.poll_now();
    check_now(st, socks)
}

/// [`check`] from the sockets' state alone (no poll of the stack).
pub(crate) fn check_now(st: &Stack, socks: &[(Arc<Sock>, u32)]) -> Few<(usize, u32)> {
    let mut idx: Few<usize> = Few::new();
    let mut watches: Few<Watch<'_>> = Few::new();
    let mut res = Few::new();
    for (i, (s, ev)) in socks.iter().enumerate() {
        match s.watch(*ev) {
            Some(w) => {
                idx.push(i);
                watches.push(w);
            }
            // bound, neither connected nor listening
            None => {
                let b = s.idle_bits() & (*ev | (libc::POLLHUP | libc::POLLERR) as u32);
                if b != 0 {
                    res.push((i, b));
                }
            }
        }
    }
    if !watches.is_empty() {
        let mut out: Few<(usize, Ready)> = Few::new();
        st.ready_now_into(&watches, &mut out);
        for (j, r) in out {
            let i = idx[j];
            res.push((i, socks[i].0.bits(r)));
        }
    }
    res
}

// ---------------------------------------------------------------------------------------
// poll and select

/// `poll` over `fds` where at least one is a DockNet socket; `None` when none is.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> Option<R<usize>> {
    poll_timed(fds, timeout_ms, &mut None)
}

/// [`poll`], leaving in `deadline` the deadline it set when it first had to wait (`None`: it
/// answered at once, so none of the timeout went by, and no clock was read).
pub fn poll_timed(
    fds: &mut [libc::pollfd],
    timeout_ms: i32,
    deadline: &mut Option<Option<Instant>>,
) -> Option<R<usize>> {
    for p in fds.iter() {
        ops::take_for(p.fd);
    }
    if ops::forked() {
        return poll_inherited(fds, timeout_ms);
    }
    // (index in `fds`, and the socket with the events asked for; built in place, as every
    // call of a busy loop's poll or select does)
    let mut at: Few<usize> = Few::new();
    let mut socks: Few<(Arc<Sock>, u32)> = Few::new();
    for (i, p) in fds.iter().enumerate() {
        if TABLE.maybe(p.fd) {
            if let Some(s) = TABLE.sock(p.fd).filter(|s| s.adopted()) {
                at.push(i);
                socks.push((s, p.events as u16 as u32));
            }
        }
    }
    if at.is_empty() {
        return None;
    }
    let st = stack_if_attached()?;
    let kidx: Few<usize> = (0..fds.len()).filter(|i| !at.contains(i)).collect();
    let mut kfds: Few<libc::pollfd> = kidx.iter().map(|&i| fds[i]).collect();
    // The deadline and the spin start with the first look that finds nothing: a call that
    // finds something at once (most of them, in a busy loop) reads no clock.
    *deadline = None;
    let mut mark = crate::sig::mark();
    let mut spin: Option<Spin> = None;
    Some(loop {
        for p in fds.iter_mut() {
            p.revents = 0;
        }
        let mut n = 0;
        for (j, bits) in check(st, &socks) {
            let i = at[j];
            let want = fds[i].events as u16 as u32 | (libc::POLLERR | libc::POLLHUP) as u32;
            let b = bits & want;
            if b != 0 {
                fds[i].revents = b as i16;
                n += 1;
            }
        }
        if !kfds.is_empty() {
            match sys::poll(&mut kfds, 0) {
                Ok(k) if k > 0 => {
                    for (j, &i) in kidx.iter().enumerate() {
                        fds[i].revents = kfds[j].revents;
                    }
                    n += k;
                }
                Ok(_) => {}
                Err(e) => break Err(e),
            }
        }
        if n > 0 {
            break Ok(n);
        }
        let deadline = *deadline.get_or_insert_with(|| deadline_of(timeout_ms));
        let left = remaining(deadline);
        if left == Some(Duration::ZERO) {
            break Ok(0);
        }
        if kfds.is_empty() {
            let watches: Few<Watch<'_>> = socks.iter().filter_map(|(s, ev)| s.watch(*ev)).collect();
            let mut ready = Vec::new();
            let token = crate::sig::SIG_WAKER.token();
            if mark.take().is_some() {
                break Err(libc::EINTR);
            }
            let wakers = [(&crate::sig::SIG_WAKER, token)];
            match st.wait_wakeable(&watches, left, &wakers, &mut ready) {
                // poll and select are never restarted after a handler
                Ok(Waited::Woken) if mark.take().is_some() => break Err(libc::EINTR),
                Ok(_) => continue,
                Err(e) => break Err(crate::errno::of(&e, crate::errno::Op::Io)),
            }
        }
        // mixed: look at both for the idle policy's spin and yield time (the loop's next
        // rounds), then sleep on the kernel descriptors plus our eventfd, which the notifier
        // signals
        if spin.get_or_insert_with(|| Spin::new(deadline)).next() {
            continue;
        }
        if mark.take().is_some() {
            break Err(libc::EINTR);
        }
        let wfd = match thread_wake_fd() {
            Ok(f) => f,
            Err(e) => break Err(e),
        };
        let mut all: Vec<libc::pollfd> = kfds.to_vec();
        all.push(libc::pollfd {
            fd: wfd,
            events: libc::POLLIN,
            revents: 0,
        });
        let id = NOTIFIER.register(&socks, wfd);
        let r = sys::poll(&mut all, ms(left));
        NOTIFIER.deregister(id);
        sys::eventfd_drain(wfd);
        if let Err(e) = r {
            break Err(e);
        }
    })
}

/// `poll` where the DockNet stack is another process's (see [`ops::forked`]): inherited
/// connections are reported invalid (`POLLNVAL`) at once, with one line on stderr, instead of
/// never becoming ready; inherited listeners are never ready (another process takes their
/// connections), and the wait goes on for the kernel's descriptors beside them, `timeout_ms`
/// as given. `None` when it inherited none.
fn poll_inherited(fds: &mut [libc::pollfd], timeout_ms: i32) -> Option<R<usize>> {
    // 0: the kernel's; 1: a dormant listener; 2: a dead connection
    let kind: Few<u8> = fds
        .iter()
        .map(|p| {
            if ops::dormant_listener(p.fd) {
                1
            } else {
                2 * u8::from(ops::inherited(p.fd))
            }
        })
        .collect();
    if kind.iter().all(|k| *k == 0) {
        return None;
    }
    let dead = kind.contains(&2);
    if dead {
        let _ = ops::inherited_error();
    }
    let mut kfds: Few<libc::pollfd> = fds
        .iter()
        .zip(&kind)
        .filter(|(_, k)| **k == 0)
        .map(|(p, _)| *p)
        .collect();
    let k = match sys::poll(&mut kfds, if dead { 0 } else { timeout_ms }) {
        Ok(k) => k,
        Err(e) => return Some(Err(e)),
    };
    let mut kernel = kfds.iter();
    let mut n = k;
    for (p, k) in fds.iter_mut().zip(&kind) {
        match k {
            2 => {
                p.revents = libc::POLLNVAL;
                n += 1;
            }
            1 => p.revents = 0,
            _ => {
                if let Some(q) = kernel.next() {
                    p.revents = q.revents;
                }
            }
        }
    }
    Some(Ok(n))
}

thread_local! {
    static WAKE_FD: WakeFd = const { WakeFd(AtomicI32::new(-1)) };
}

struct WakeFd(AtomicI32);

impl Drop for WakeFd {
    fn drop(&mut self) {
        let fd = self.0.load(Ordering::Relaxed);
        if fd >= 0 {
            let _ = sys::close(fd);
        }
    }
}

/// This thread's eventfd for mixed poll/select waits.
fn thread_wake_fd() -> R<i32> {
    WAKE_FD.with(|w| {
        let fd = w.0.load(Ordering::Relaxed);
        if fd >= 0 {
            return Ok(fd);
        }
        let fd = sys::eventfd(true)?;
        w.0.store(fd, Ordering::Relaxed);
        Ok(fd)
    })
}

// ---------------------------------------------------------------------------------------
// the notifier

/// Sockets a waiter waits for, with the poll bits it wants.
type Watched = Vec<(Arc<Sock>, u32)>;

struct Waiter {
    id: u64,
    socks: Vec<(Arc<Sock>, u32)>,
    fd: i32,
}

/// Waits on the stack for the DockNet sockets of threads that sleep in the kernel (mixed
/// sets) and signals their eventfds.
pub struct Notifier {
    waiters: Mutex<Vec<Waiter>>,
    waker: Waker,
    next: AtomicU64,
    started: AtomicBool,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier").finish_non_exhaustive()
    }
}

static NOTIFIER: LazyLock<Notifier> = LazyLock::new(|| Notifier {
    waiters: Mutex::new(Vec::new()),
    waker: Waker::new(),
    next: AtomicU64::new(1),
    started: AtomicBool::new(false),
});

/// The notifier's list held across a `fork` (the child's copy is whole and unlocked).
pub struct NotifierHold(#[allow(dead_code)] std::sync::MutexGuard<'static, Vec<Waiter>>);

impl std::fmt::Debug for NotifierHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifierHold").finish_non_exhaustive()
    }
}

/// Holds the notifier's list, if the notifier was ever used.
pub fn hold_notifier() -> Option<NotifierHold> {
    LazyLock::get(&NOTIFIER).map(|n| NotifierHold(n.lock()))
}

/// Wakes the notifier (starting it if needed): a relay has bytes to move down, or ended.
pub(crate) fn kick_notifier() {
    NOTIFIER.start();
    NOTIFIER.waker.wake();
}

/// After this process took the pipe's stack at a fork: the notifier thread was the other
/// process's, and the waits it served were that process's threads'. It starts again with the
/// first mixed wait here.
pub fn after_take() {
    if let Some(n) = LazyLock::get(&NOTIFIER) {
        n.lock().clear();
        n.started.store(false, Ordering::Release);
    }
}

impl Notifier {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the notifier's thread if it is not running.
    fn start(&'static self) {
        if !self.started.swap(true, Ordering::AcqRel) {
            // the notifier must not take the program's signals
            let old = sys::block_all_signals();
            let _ = std::thread::Builder::new()
                .name("docknet-notify".into())
                .spawn(move || self.run());
            sys::sigmask_set(old.as_ref());
        }
    }

    fn register(&'static self, socks: &[(Arc<Sock>, u32)], fd: i32) -> u64 {
        self.start();
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().push(Waiter {
            id,
            socks: socks.to_vec(),
            fd,
        });
        self.waker.wake();
        id
    }

    fn deregister(&self, id: u64) {
        let mut g = self.lock();
        let before = g.len();
        g.retain(|w| w.id != id);
        let changed = g.len() != before;
        drop(g);
        if changed {
            self.waker.wake();
        }
    }

    fn run(&self) {
        let mut ready = Vec::new();
        let mut chunk = Vec::new();
        loop {
            if ops::forked() {
                return;
            }
            let token = self.waker.token();
            // the relays' bytes for their children first (see `relay`)
            let (relayed, slow) = crate::relay::down_round(&mut chunk);
            let snap: Vec<(u64, Watched)> = self
                .lock()
                .iter()
                .map(|w| (w.id, w.socks.clone()))
                .collect();
            let Some(st) = stack_if_attached() else {
                return;
            };
            if snap.is_empty() && relayed.is_empty() {
                self.waker.wait(token, Some(Duration::from_secs(1)));
                continue;
            }
            let mut owner = Vec::new();
            let mut watches = Vec::new();
            for (id, socks) in &snap {
                for (s, ev) in socks {
                    if let Some(w) = s.watch(*ev) {
                        owner.push(*id);
                        watches.push(w);
                    }
                }
            }
            // (index at and above `served`: a relay's socket, moved by the next round)
            let served = watches.len();
            watches.extend(relayed.iter().filter_map(|s| s.watch(libc::POLLIN as u32)));
            // a child slow to take its bytes is looked at again within a millisecond
            let timeout = Duration::from_millis(if slow { 1 } else { 1000 });
            // (the notifier only hands readiness on: it sleeps at once rather than take a
            // core from the threads it serves by yielding)
            match st.wait_wakeable_blocking(
                &watches,
                Some(timeout),
                &[(&self.waker, token)],
                &mut ready,
            ) {
                Ok(Waited::Ready) => {
                    let mut ids: Vec<u64> = ready
                        .iter()
                        .filter(|(i, _)| *i < served)
                        .map(|(i, _)| owner[*i])
                        .collect();
                    ids.dedup();
                    let mut g = self.lock();
                    // signalled waiters leave the set (their sockets stay ready until they look)
                    g.retain(|w| {
                        if ids.contains(&w.id) {
                            sys::eventfd_signal(w.fd);
                            false
                        } else {
                            true
                        }
                    });
                }
                Ok(_) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
            let _: &[(usize, Ready)] = &ready;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock::Proto;

    fn member(events: u32) -> (Arc<Sock>, Member) {
        let s = Arc::new(Sock::new(Proto::Tcp, true));
        let m = Member::new(3, &s, events, 42);
        (s, m)
    }

    const IN: u32 = libc::EPOLLIN as u32;
    const OUT: u32 = libc::EPOLLOUT as u32;
    const ET: u32 = libc::EPOLLET as u32;

    #[test]
    fn level_triggered_reports_while_ready() {
        let (_s, mut m) = member(IN);
        assert_eq!(m.report(IN | OUT, (0, 0)), IN);
        assert_eq!(m.report(IN | OUT, (0, 0)), IN);
        assert_eq!(m.report(OUT, (0, 0)), 0);
        // errors and hang-ups are reported whatever was asked
        let hup = libc::EPOLLHUP as u32;
        assert_eq!(m.report(hup, (0, 0)), hup);
    }

    #[test]
    fn edge_triggered_reports_again_only_after_a_call_on_that_side() {
        let (_s, mut m) = member(IN | OUT | ET);
        assert_eq!(m.report(IN | OUT, (0, 0)), IN | OUT);
        // still ready, no call since: nothing
        assert_eq!(m.report(IN | OUT, (0, 0)), 0);
        assert_eq!(m.edge_ok((0, 0)), (false, false));
        // a read: the read side may report again, the write side not
        assert_eq!(m.edge_ok((1, 0)), (true, false));
        assert_eq!(m.report(IN | OUT, (1, 0)), IN);
        assert_eq!(m.report(IN | OUT, (1, 1)), OUT);
    }

    #[test]
    fn one_shot_reports_once_until_modified() {
        let (_s, mut m) = member(IN | libc::EPOLLONESHOT as u32);
        assert_eq!(m.report(IN, (0, 0)), IN);
        assert_eq!(m.report(IN, (1, 0)), 0);
        assert!(m.disabled);
    }

    #[test]
    fn a_socket_closed_while_a_waiter_holds_it_leaves_the_set_and_a_dup_keeps_it() {
        use crate::table::Entry;
        // descriptor numbers no other test of this binary uses
        let (fd, dup) = (9001, 9002);
        let e = Epoll::new(-1);
        let s = Arc::new(Sock::new(Proto::Tcp, true));
        TABLE.insert(fd, Entry::Sock(s.clone()));
        TABLE.insert(dup, Entry::Sock(s.clone()));
        assert!(e.ctl(libc::EPOLL_CTL_ADD, fd, Some((IN, 7))).is_none());
        // what a wait in progress, or the notifier, holds
        let held = s.clone();
        ops::closing(dup);
        let _ = e.active();
        assert_eq!(e.members().len(), 1, "a descriptor still refers to it");
        ops::closing(fd);
        assert!(!s.open());
        let _ = e.active();
        assert!(
            e.members().is_empty(),
            "closed, but kept in the set by whoever holds it"
        );
        drop(held);
    }

    #[test]
    fn timeouts_round_up_to_milliseconds() {
        assert_eq!(ms(None), -1);
        assert_eq!(ms(Some(Duration::ZERO)), 0);
        assert_eq!(ms(Some(Duration::from_micros(1))), 1);
        assert_eq!(ms(Some(Duration::from_millis(5))), 5);
    }
}
