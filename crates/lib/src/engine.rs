//! The engine thread: keeps TCP alive while the application is not calling.

use crate::stack::Shared;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

/// The engine thread: keeps TCP going (ACKs, retransmissions, handshakes) while the
/// application is not calling, and exits when the stack is dropped. It never spins. While the
/// application is active (a call in progress, or one started within the last nap) it naps in
/// 10 ms steps without arming the rings, so producers do not kick it and it rarely competes
/// with the caller for its core (1 ms naps put a 1 ms stall at p99.9 of a spinning ping-pong:
/// the woken engine can take the caller's core for a scheduler slice). Once the application has been quiet for a nap, it
/// polls, arms the rings and sleeps until a frame or a timer needs it.
pub(crate) fn engine(shared: Weak<Shared>) {
    const NAP: Duration = Duration::from_millis(10);
    const IDLE_SLEEP: Duration = Duration::from_millis(250);
    loop {
        let Some(s) = shared.upgrade() else { return };
        let calls = s.calls.load(Ordering::Relaxed);
        drop(s);
        std::thread::sleep(NAP);
        let Some(s) = shared.upgrade() else { return };
        if s.callers.load(Ordering::Acquire) > 0 || s.calls.load(Ordering::Relaxed) != calls {
            continue;
        }
        loop {
            let calls = s.calls.load(Ordering::Relaxed);
            if s.lock().poll() {
                continue;
            }
            if let Some(armed) = s.arm(IDLE_SLEEP, None) {
                armed.wait();
            }
            let active =
                s.callers.load(Ordering::Acquire) > 0 || s.calls.load(Ordering::Relaxed) != calls;
            if !active {
                s.disarm();
                continue;
            }
            // the application is back: leave the rings to it (its own sleeps arm and disarm
            // them) and go back to napping
            break;
        }
    }
}
