//! Signals and blocked calls: the library wraps the program's signal handlers (`sigaction`
//! and `signal` are interposed) so that a handler that runs also wakes every wait on DockNet
//! sockets; the waiting thread then sees that a handler ran on it and fails with `EINTR` as
//! Linux does (a socket call only when the handler was installed without `SA_RESTART`, or
//! when the socket has a timeout; `poll`, `select` and `epoll_wait` always).
//!
//! A handler runs where the kernel would run it for a system call: when the call sleeps, or
//! when it returns to the program; never in the middle of the library's work. A signal that
//! comes while a call of this thread works in the library (holding its locks, or inside
//! `malloc`) is noted at once (its waits wake) and its handler runs at the next of those
//! points ([`within`], [`asleep`]). Otherwise a handler that forks (PostgreSQL 15's
//! postmaster starts its workers from its handlers, which run while it waits in `select`)
//! would wait forever for a lock that the interrupted call holds. Signals of a fault
//! (`SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE`, `SIGTRAP`, `SIGSYS`, `SIGABRT`) run at once. Two
//! of one signal that wait are run once, as the kernel merges two of a standard signal.

use docknet_lib::Waker;
use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Woken by every wrapped handler.
pub static SIG_WAKER: Waker = Waker::new();

/// Signals the library keeps handlers for (1..=64).
pub const NSIG: usize = 65;

/// The program's own handler per signal (0: none wrapped) and its `sa_flags`.
pub static HANDLERS: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
/// `sa_flags` of the program's handler per signal.
pub static FLAGS: [AtomicI32; NSIG] = [const { AtomicI32::new(0) }; NSIG];

thread_local! {
    // const-initialised, no destructor: plain thread-local memory, safe in a signal handler
    static COUNT: Cell<u32> = const { Cell::new(0) };
    static RESTART: Cell<bool> = const { Cell::new(true) };
    /// Calls of the program into the library in progress on this thread (nested in handlers).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Of them, the ones asleep (where a handler may run).
    static ASLEEP: Cell<u32> = const { Cell::new(0) };
    /// Signals whose handlers wait for the thread to leave the library (bit per signal).
    static PENDING: Cell<u128> = const { Cell::new(0) };
    /// Their `siginfo`, per signal.
    static INFO: [Cell<libc::siginfo_t>; NSIG] =
        const { [const { Cell::new(crate::sys::NO_SIGINFO) }; NSIG] };
}

/// Runs `f`, a call of the program into the library: handlers of signals that come meanwhile
/// run when it sleeps or at its end.
pub fn within<T>(f: impl FnOnce() -> T) -> T {
    DEPTH.with(|d| d.set(d.get() + 1));
    let r = f();
    let left = DEPTH.with(|d| {
        d.set(d.get().saturating_sub(1));
        d.get()
    });
    if left == 0 {
        run_pending();
    }
    r
}

/// Runs `f`, a sleep inside a call (the library holds nothing there): handlers that waited
/// run first (`f` is told whether any did), and those of signals that come meanwhile run at
/// once.
pub fn asleep<T>(f: impl FnOnce(bool) -> T) -> T {
    let r = f(fall_asleep());
    wake_up();
    r
}

/// The hook DockLib runs around its sleeps (`docknet_pipe::wake::set_sleep_hook`): as
/// [`asleep`], in two halves.
pub fn sleep_hook(enter: bool) {
    if enter {
        fall_asleep();
    } else {
        wake_up();
    }
}

/// The start of a sleep: signals now run their handlers at once, and those that waited run
/// first; whether any did.
fn fall_asleep() -> bool {
    ASLEEP.with(|a| a.set(a.get() + 1));
    run_pending()
}

/// The end of a sleep.
fn wake_up() {
    ASLEEP.with(|a| a.set(a.get().saturating_sub(1)));
}

/// A point inside a call where the library holds nothing (a blocked call about to wait
/// again after a handler with `SA_RESTART`): handlers that waited run now.
pub fn safe_point() {
    run_pending();
}

/// Signals of a fault in the code they interrupt: their handlers cannot wait.
fn synchronous(sig: usize) -> bool {
    [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
        libc::SIGSYS,
        libc::SIGABRT,
    ]
    .contains(&(sig as i32))
}

/// In the wrapper, after [`note`]: whether the program's handler for `sig` waits, because a
/// call of this thread works in the library (then it is recorded, with `info`, and runs at
/// the call's next sleep or end).
pub fn defer(sig: usize, info: impl FnOnce() -> libc::siginfo_t) -> bool {
    if sig == 0
        || sig >= NSIG
        || synchronous(sig)
        || DEPTH.with(Cell::get) == 0
        || ASLEEP.with(Cell::get) > 0
    {
        return false;
    }
    let i = info();
    INFO.with(|s| s[sig].set(i));
    PENDING.with(|p| p.set(p.get() | 1u128 << sig));
    true
}

/// Runs the handlers that waited, as the kernel runs a handler: its signal (unless
/// `SA_NODEFER`) and its `sa_mask` blocked meanwhile, and `errno` kept.
fn run_pending() -> bool {
    let mut ran = false;
    loop {
        let p = PENDING.with(Cell::get);
        if p == 0 {
            return ran;
        }
        ran = true;
        let sig = p.trailing_zeros() as usize;
        PENDING.with(|c| c.set(p & !(1u128 << sig)));
        let info = INFO.with(|s| s[sig].get());
        let (h, flags) = (
            HANDLERS[sig].load(Ordering::Acquire),
            FLAGS[sig].load(Ordering::Acquire),
        );
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            continue;
        }
        let old = crate::sys::block_for_handler(sig as i32, flags & libc::SA_NODEFER == 0);
        let e = crate::sys::errno();
        crate::sys::call_handler_later(sig, h, flags, info);
        crate::sys::set_errno(e);
        crate::sys::sigmask_set(old.as_ref());
    }
}

/// In a child after `fork`: signals sent to the parent are not the child's.
pub fn forget_pending() {
    PENDING.with(|p| p.set(0));
}

/// Called by the wrapper before the program's handler runs on this thread.
pub fn note(sig: usize) {
    let restart = FLAGS
        .get(sig)
        .map(|f| f.load(Ordering::Relaxed) & libc::SA_RESTART != 0)
        .unwrap_or(true);
    COUNT.with(|c| c.set(c.get().wrapping_add(1)));
    RESTART.with(|r| r.set(restart));
    SIG_WAKER.wake();
}

/// Handlers run on this thread since the mark was taken.
#[derive(Debug)]
pub struct Mark(u32);

/// A mark now.
pub fn mark() -> Mark {
    Mark(COUNT.with(Cell::get))
}

impl Mark {
    /// `Some(restart)` when a handler ran on this thread since the mark (and moves the mark):
    /// `restart` says whether it was installed with `SA_RESTART`.
    pub fn take(&mut self) -> Option<bool> {
        let now = COUNT.with(Cell::get);
        if now == self.0 {
            return None;
        }
        self.0 = now;
        Some(RESTART.with(Cell::get))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static RAN: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn counted(_: libc::c_int) {
        RAN.fetch_add(1, Ordering::SeqCst);
    }

    /// A handler waits while a call works in the library, and runs as the call sleeps or
    /// returns (the outermost call, not a nested one); outside a call, asleep, or for a fault,
    /// it runs at once.
    #[test]
    fn a_handler_waits_for_the_call_to_sleep_or_return() {
        let sig = 40;
        let info = || crate::sys::NO_SIGINFO;
        HANDLERS[sig].store(counted as *const () as usize, Ordering::Release);
        FLAGS[sig].store(0, Ordering::Release);
        assert!(!defer(sig, info), "outside a call");
        within(|| {
            assert!(defer(sig, info), "inside a call");
            assert!(!defer(libc::SIGSEGV as usize, info), "a fault");
            assert_eq!(RAN.load(Ordering::SeqCst), 0);
            asleep(|ran| {
                assert!(ran);
                assert_eq!(RAN.load(Ordering::SeqCst), 1, "ran as the call sleeps");
                assert!(!defer(sig, info), "asleep");
            });
            assert!(defer(sig, info));
            assert!(defer(sig, info), "twice: run once");
            within(|| {});
            assert_eq!(RAN.load(Ordering::SeqCst), 1, "a nested call's end");
        });
        assert_eq!(RAN.load(Ordering::SeqCst), 2, "ran at the call's return");
        // a call that waits only for a signal (`accept` on a listener another process took)
        // ends for one that came while it worked in the library: its handler runs as the wait
        // begins, and the wait does not begin
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let e = within(|| {
                assert!(defer(sig, info));
                crate::sys::pause_for_signal()
            });
            let _ = tx.send(e);
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("the wait began after the handler ran");
        assert_eq!(e, libc::EINTR);
        assert_eq!(RAN.load(Ordering::SeqCst), 3);
        HANDLERS[sig].store(0, Ordering::Release);
    }

    #[test]
    fn a_mark_sees_handlers_of_its_own_thread_only() {
        FLAGS[10].store(libc::SA_RESTART, Ordering::Relaxed);
        let mut m = mark();
        assert_eq!(m.take(), None);
        let token = SIG_WAKER.token();
        note(10);
        assert_ne!(SIG_WAKER.token(), token, "waits are woken");
        assert_eq!(m.take(), Some(true));
        assert_eq!(m.take(), None);
        std::thread::spawn(|| note(12)).join().unwrap();
        assert_eq!(m.take(), None, "another thread's handler");
        note(12);
        assert_eq!(m.take(), Some(false), "no SA_RESTART for signal 12");
    }
}
