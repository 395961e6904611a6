//! The engine thread: keeps TCP alive while the application is not calling.

use crate::fork::Why;
use crate::stack::Shared;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Weak;
use std::time::Duration;

/// The engine thread: keeps TCP going (ACKs, retransmissions, handshakes) while the
/// application is not calling, and exits when the stack is dropped. It never spins. While the
/// application is active (calls starting within the last nap) it naps in 10 ms steps without
/// arming the rings, so producers do not kick it and it rarely competes
/// with the caller for its core (1 ms naps put a 1 ms stall at p99.9 of a spinning ping-pong:
/// the woken engine can take the caller's core for a scheduler slice). While one call lasts
/// longer than a nap it sleeps until that call ends (the call keeps TCP going meanwhile). Once
/// the application has been quiet for a nap, it polls, arms the rings and sleeps until a frame
/// or a timer needs it.
///
/// After a fork (see [`crate::fork`]) it leaves the stack alone while a child may still take
/// it, then settles that this process keeps it; it ends when the stack moved to another process.
pub(crate) fn engine(shared: Weak<Shared>) {
    const NAP: Duration = Duration::from_millis(10);
    const IDLE_SLEEP: Duration = Duration::from_millis(250);
    loop {
        let Some(s) = shared.upgrade() else { return };
        if s.forks.moved() {
            return;
        }
        if s.forks.pending() {
            if s.forks.paused() {
                drop(s);
                std::thread::sleep(NAP);
            } else {
                s.settle_pending(Why::Expired);
            }
            continue;
        }
        let calls = s.calls.load(Ordering::Relaxed);
        drop(s);
        std::thread::sleep(NAP);
        let Some(s) = shared.upgrade() else { return };
        if s.calls.load(Ordering::Relaxed) != calls {
            continue; // calls come and go: keep napping beside them
        }
        if s.callers.load(Ordering::Acquire) > 0 {
            // one call has lasted the whole nap (a server in accept, a client waiting for a
            // reply): it polls the stack itself, so sleep until it ends instead of napping
            park(&s, calls);
            continue;
        }
        loop {
            let calls = s.calls.load(Ordering::Relaxed);
            {
                let mut g = s.lock();
                // (asked under the lock, which a fork's prepare handler holds: a fork that
                // came since is seen here, before anything moves on in this process's copy)
                if s.forks.pending() || s.forks.moved() {
                    break; // the outer loop pauses or ends
                }
                if g.poll() {
                    continue;
                }
            }
            if let Some(armed) = s.arm(IDLE_SLEEP, None) {
                let timed_out = armed.wait(&[]);
                // ends this sleep only: a call asleep on the same words keeps them armed
                s.disarm(timed_out);
            }
            let active =
                s.callers.load(Ordering::Acquire) > 0 || s.calls.load(Ordering::Relaxed) != calls;
            if !active {
                continue;
            }
            // the application is back: leave the rings to it and go back to napping
            break;
        }
    }
}

/// Sleeps on `callers` while the call that was in progress at `calls` goes on (at most a second
/// at a time, so a dropped stack is noticed).
fn park(s: &Arc<Shared>, calls: u32) {
    const PARK_MAX: Duration = Duration::from_secs(1);
    s.engine_parked.store(true, Ordering::SeqCst);
    loop {
        let n = s.callers.load(Ordering::SeqCst);
        if n == 0 || s.calls.load(Ordering::Relaxed) != calls {
            break;
        }
        // returns when `callers` changes from `n`, is woken, or the time is up
        let _ = docknet_pipe::wake::wait_mixed(&[], &[(&s.callers, n)], Some(PARK_MAX));
        if Arc::strong_count(s) == 1 {
            break; // only the engine holds the stack now
        }
    }
    s.engine_parked.store(false, Ordering::SeqCst);
}
