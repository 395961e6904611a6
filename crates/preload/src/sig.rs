//! Signals and blocked calls: the library wraps the program's signal handlers (`sigaction`
//! and `signal` are interposed) so that a handler that runs also wakes every wait on DockNet
//! sockets; the waiting thread then sees that a handler ran on it and fails with `EINTR` as
//! Linux does (a socket call only when the handler was installed without `SA_RESTART`, or
//! when the socket has a timeout; `poll`, `select` and `epoll_wait` always).

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
