//! A process's family: what `fork`, `exec` and `exit` do to its DockNet sockets. Who drives
//! the pipe's stack after a fork (it moves whole to a child that uses an inherited listener
//! while its parent does not use it: `docknet_lib::fork`), connections a forked child uses
//! (its parent serves them: `relay`), and what an exiting process still has to send.
//! design.md, "Sockets across fork".

use crate::ops::{enabled, log_once, lost_stack, stack_if_attached, STACK, TABLE};
use crate::sys::{self, Errno};
use crate::table::Entry;
use docknet_lib::Stack;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

/// Set in a forked child until it takes the stack (or finds no stack was attached).
pub(crate) static FORKED: AtomicBool = AtomicBool::new(false);

/// Registers the fork and exit handlers (the library's constructor, through `ops::init`).
pub(crate) fn init() {
    LazyLock::force(&FAMILY);
    sys::at_fork(before_fork, after_fork_parent, after_fork_child);
    sys::at_exit(at_exit);
}

/// How long an exiting process waits, at most, for what its connections still have to send.
const EXIT_LINGER: Duration = Duration::from_secs(1);

/// At `exit`: what the program's connections still hold goes out before the stack ends with
/// the process, as the kernel sends what an exiting process left in its sockets. The relays of
/// its forked children first pass on what those children sent; then every connection is shut
/// down (FIN after its bytes) and the stack polled until everything is acknowledged, for at
/// most [`EXIT_LINGER`] in all. A process that drives no stack (a forked child that did not
/// take it) has nothing of its own to send, and one that forked and has not used the stack
/// since leaves it alone (a child may take it: a program that daemonizes). Nothing here waits
/// on a lock that this thread may hold (an `exit` from a signal handler).
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if !enabled() || forked() {
            return;
        }
        let Some(st) = stack_if_attached() else {
            return;
        };
        if st.fork_pending() {
            return;
        }
        let deadline = Instant::now() + EXIT_LINGER;
        crate::relay::finish_at_exit(deadline);
        st.close_all_at_exit(deadline);
        // (a lost notification was mended by a look after a sleep's timeout, but it is a
        // defect: say so, so a test or a user sees it)
        let lost = st.endpoint_stats().map_or(0, |s| s.unannounced);
        if lost > 0 {
            crate::sys::log_line(&format!(
                "{lost} message(s) of the daemon came without their notification and waited \
                 for a timeout (a fast channel used late); please report this"
            ));
        }
    });
}

/// What the library holds across a `fork` (released in this order: the stack, the notifier's
/// list, the descriptor table), so that the child's copies are whole and unlocked.
struct Held {
    stack: Option<docknet_lib::ForkHold>,
    /// No look at an epoll set in progress (see `event::hold_looks`).
    looks: std::sync::RwLockWriteGuard<'static, ()>,
    notifier: Option<crate::event::NotifierHold>,
    table: crate::table::TableHold,
    /// The parent's ends of its children's links, and the link made for this fork.
    links: crate::relay::LinksHold,
    link: Option<crate::relay::Prepared>,
}

thread_local! {
    static HELD: std::cell::RefCell<Option<Held>> = const { std::cell::RefCell::new(None) };
}

/// `pthread_atfork` prepare: takes the table, the epoll looks, the notifier's list and the
/// stack (in the order every other path takes them) and records the fork in the stack ([`Stack::fork_prepare`]);
/// makes the child's link to this process for the connections it inherits (`relay`).
extern "C" fn before_fork() {
    let _ = std::panic::catch_unwind(|| {
        let table = TABLE.hold();
        let looks = crate::event::hold_looks();
        let notifier = crate::event::hold_notifier();
        let stack = stack_if_attached().map(Stack::fork_prepare);
        let links = crate::relay::hold();
        let link = crate::relay::prepare(&table);
        HELD.with(|h| {
            *h.borrow_mut() = Some(Held {
                stack,
                looks,
                notifier,
                table,
                links,
                link,
            })
        });
    });
}

fn release_held(child: bool) {
    let _ = std::panic::catch_unwind(|| {
        if let Some(h) = HELD.with(|h| h.borrow_mut().take()) {
            let Held {
                stack,
                looks,
                notifier,
                table,
                links,
                link,
            } = h;
            match stack {
                Some(s) if child => s.child(),
                Some(s) => s.parent(),
                None => {}
            }
            drop(notifier);
            drop(looks);
            drop(table);
            if child {
                crate::relay::child(links, link);
            } else {
                crate::relay::parent(links, link);
            }
        }
    });
}

extern "C" fn after_fork_parent() {
    release_held(false);
}

extern "C" fn after_fork_child() {
    crate::sig::forget_pending();
    release_held(true);
    crate::share::forked_child();
    FORKED.store(true, Ordering::Release);
}

/// A page shared by this process and every process forked from it: which of them attached
/// the pipe when none had before the fork (`0`: none yet). Replaced at `exec`.
static FAMILY: LazyLock<Option<docknet_pipe::Region>> =
    LazyLock::new(|| docknet_pipe::Region::anonymous(64).ok());

/// The family page's words that say which process serves the connections of its listeners to
/// the other processes of the family (`share`): its pid (0: none), then its token's halves.
const SHARE_PID: usize = 4;
const SHARE_TOKEN: usize = 8;

/// The process of the family that hands connections of its listeners to the others, and the
/// token they show it (`share`), if one does.
pub(crate) fn share_service() -> Option<(u32, u64)> {
    let r = FAMILY.as_ref()?;
    let pid = r.u32_at(SHARE_PID)?.load(Ordering::Acquire);
    if pid == 0 {
        return None;
    }
    let lo = u64::from(r.u32_at(SHARE_TOKEN)?.load(Ordering::Relaxed));
    let hi = u64::from(r.u32_at(SHARE_TOKEN + 4)?.load(Ordering::Relaxed));
    Some((pid, lo | hi << 32))
}

/// Says that this process (`pid`) hands connections to the family, to those who show `token`.
pub(crate) fn set_share_service(pid: u32, token: u64) -> bool {
    let Some(r) = FAMILY.as_ref() else {
        return false;
    };
    let (Some(p), Some(lo), Some(hi)) = (
        r.u32_at(SHARE_PID),
        r.u32_at(SHARE_TOKEN),
        r.u32_at(SHARE_TOKEN + 4),
    ) else {
        return false;
    };
    lo.store(token as u32, Ordering::Relaxed);
    hi.store((token >> 32) as u32, Ordering::Relaxed);
    p.store(pid, Ordering::Release);
    true
}

/// Whether this process may attach the pipe: no other living process of its family has.
/// Records it as the one that did.
pub(crate) fn may_attach() -> Result<(), u32> {
    let Some(w) = FAMILY.as_ref().and_then(|r| r.u32_at(0)) else {
        return Ok(());
    };
    let me = std::process::id();
    loop {
        match w.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(p) if p == me => return Ok(()),
            Err(p) if docknet_lib::fork::alive(p) => return Err(p),
            // it exited: its stack went with it, and the rings are anyone's again
            Err(p) => {
                if w.compare_exchange(p, me, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Ok(());
                }
            }
        }
    }
}

/// Whether this process's DockNet sockets are another process's now: it is a forked child
/// that has not taken the pipe's stack (or could not), or a process whose stack a forked child
/// took.
pub fn forked() -> bool {
    FORKED.load(Ordering::Relaxed) || stack_if_attached().is_some_and(Stack::moved)
}

/// A forked child's use of `fd`: when it is a listening DockNet socket the child inherited,
/// the child takes the pipe's stack (the whole of it, [`Stack::claim`]), which it gets when the
/// process it was forked from has not used the stack since the fork. That is a worker of a
/// server that listens and then forks its workers (nginx, gunicorn, Apache prefork) or a
/// program that daemonizes. A child's use of an inherited connection takes nothing: a process
/// that hands connections to children keeps listening itself; the child claims the connection
/// instead, and the parent serves it for the child (`relay`; where it cannot, the child is
/// refused, see [`inherited_error`]).
pub fn take_for(fd: i32) {
    if !FORKED.load(Ordering::Acquire) || !TABLE.maybe(fd) {
        return;
    }
    // (a socket made before a fork that attached nothing: the child's to decide, as any)
    unforked_if_nothing_attached();
    let listener = match TABLE.get(fd) {
        Some(Entry::Sock(s)) => s.is_listener(),
        // an epoll instance made before the fork, watching a listener
        // (try: a lock a parent's thread held at the fork stays held in the child forever)
        Some(Entry::Epoll(e)) => e.members.try_lock().is_ok_and(|m| {
            m.iter()
                .any(|m| m.sock.upgrade().is_some_and(|s| s.is_listener()))
        }),
        Some(Entry::Relayed(_)) | None => false,
    };
    if listener {
        take();
        if FORKED.load(Ordering::Acquire) {
            // a sibling drives the stack: it hands this worker connections, if it can
            if let Some(s) = TABLE.sock(fd) {
                crate::share::adopt(fd, &s);
            }
        }
    } else if let Some(s) = TABLE.sock(fd).filter(|s| s.adopted()) {
        // an inherited connection: this process's parent serves it here from now on
        crate::relay::claim(fd, &s);
    }
}

/// Takes the pipe's stack if it is this process's to take; see [`take_for`].
fn take() {
    let mine = match STACK.get() {
        Some(Some(s)) => s.claim(),
        _ => true,
    };
    if mine && FORKED.swap(false, Ordering::AcqRel) {
        // the parent's threads are gone: the notifier starts again when needed
        crate::event::after_take();
        crate::share::serve();
    }
}

/// A forked child whose parent had attached no stack before the fork is a process like any
/// other: it may attach the pipe itself, if no other process of its family has (decided when
/// it attaches).
pub(crate) fn unforked_if_nothing_attached() {
    if FORKED.load(Ordering::Relaxed) && !STACK.get().is_some_and(Option::is_some) {
        FORKED.store(false, Ordering::Release);
    }
}

/// The connection at `fd` that this process's parent serves for it (a forked child's, after
/// its first use claimed it: see `relay`).
pub(crate) fn relayed(fd: i32) -> Option<Arc<crate::relay::Relayed>> {
    if !TABLE.maybe(fd) {
        return None;
    }
    take_for(fd);
    TABLE.relayed(fd)
}

/// Whether `fd` is a DockNet socket (or an epoll instance with DockNet members) that this
/// process inherited through `fork`. Its connection lives in the parent's stack, and that
/// stack alone drives the pipe's rings (single producer, single consumer): the child's copy of
/// it must never touch them, so every call on such a descriptor but `close` fails at once.
pub fn inherited(fd: i32) -> bool {
    if !TABLE.maybe(fd) {
        return false;
    }
    take_for(fd);
    if !forked() {
        return false;
    }
    match TABLE.get(fd) {
        Some(Entry::Sock(s)) => s.adopted(),
        // (try: a lock a parent's thread held at the fork stays held in the child forever)
        Some(Entry::Epoll(e)) => e.members.try_lock().map(|m| !m.is_empty()).unwrap_or(true),
        Some(Entry::Relayed(_)) | None => false,
    }
}

/// Whether `fd` is a listening DockNet socket whose stack is another process's (see
/// [`inherited`]): a worker whose sibling took the stack at the fork. It never becomes ready
/// here, as a listener whose connections all go to another process.
pub fn dormant_listener(fd: i32) -> bool {
    inherited(fd) && TABLE.sock(fd).is_some_and(|s| s.is_listener())
}

/// The error of a call on an inherited DockNet descriptor, with one line on stderr (once).
pub fn inherited_error() -> Errno {
    let me = std::process::id();
    let owner = stack_if_attached()
        .and_then(Stack::owner)
        .filter(|p| *p != me);
    log_once(&match owner {
        Some(p) if lost_stack() => format!(
            "the DockNet sockets of process {me} moved at a fork to process {p}, which used \
             them first: they cannot be used here any more"
        ),
        Some(p) => format!(
            "a DockNet socket cannot be used in this process ({me}): process {p} drives the \
             pipe's stack (after a fork the stack goes whole to the first process that uses \
             it, and to a child only while its parent does not use it)"
        ),
        None => format!(
            "a DockNet socket cannot be used in a child process after fork (pid {me}): it \
             belongs to the parent, whose stack drives the pipe"
        ),
    });
    libc::EOPNOTSUPP
}

/// Before the kernel duplicates `fd`: in a forked child, an inherited connection is claimed
/// first (see `relay`), so that the copy is the Unix socket its parent serves it on. That is
/// how an inetd-style server hands a connection to a program: `dup2` onto 0 and 1 in the
/// child, then `exec` (the new program's reads and writes are the kernel's, on that socket).
/// An inherited listener is left as it is: a duplicate is no use of it.
pub fn before_dup(fd: i32) {
    if !FORKED.load(Ordering::Acquire) {
        return;
    }
    if let Some(s) = TABLE.sock(fd).filter(|s| s.adopted() && !s.is_listener()) {
        crate::relay::claim(fd, &s);
    }
}
