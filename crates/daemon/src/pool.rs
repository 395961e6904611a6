//! Spare regions, made ahead of the requests that need them.
//!
//! Every page of a region is allocated when it is made (`fallocate`, so nobody mapping it can
//! fault later): about 1 ms for the 3 MB of a pipe at the default MTU and ring depth, most of a
//! pipe create. The pool keeps a few regions of that one size ready, made by a thread of its
//! own in the SCHED_IDLE class; a create of that size takes one and the thread makes the next
//! while the new container starts. A region leaves the pool once and is never given back (a container may still map
//! a removed pipe's region), so what a container finds in a fresh pipe is zero pages, as with
//! a region made on the spot. The thread sleeps on a condition variable whenever the pool is
//! full: an idle daemon spends nothing on it.

use docknet_pipe::Region;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// What the pool holds and whether it should stop.
#[derive(Default)]
struct State {
    /// Sealed memfds, not mapped: the thread never takes this process's address-space lock
    /// (a SCHED_IDLE thread preempted holding it would stall every page fault of the daemon).
    ready: Vec<OwnedFd>,
    stop: bool,
    /// The last attempt to make a region failed: wait for the next take before trying again
    /// (no retry loop while memory is short).
    failed: bool,
}

/// Regions of one size made ahead ([module docs](self)).
pub struct Pool {
    size: usize,
    spares: usize,
    state: Mutex<State>,
    wake: Condvar,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("size", &self.size)
            .field("spares", &self.spares)
            .field("ready", &self.lock().ready.len())
            .finish()
    }
}

impl Pool {
    /// Starts a pool keeping `spares` regions of `size` bytes ready. `None` when `spares` is 0
    /// or the thread cannot start (creates then make their regions on the spot).
    pub fn start(size: usize, spares: usize) -> Option<Arc<Pool>> {
        if spares == 0 || size == 0 {
            return None;
        }
        let pool = Arc::new(Pool {
            size,
            spares,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let p = pool.clone();
        match std::thread::Builder::new()
            .name("docknet-pool".into())
            .spawn(move || p.fill())
        {
            Ok(_) => Some(pool),
            Err(e) => {
                tracing::warn!("spare regions: cannot start the thread: {e}");
                None
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // a panic while holding the lock leaves plain data behind: still usable
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The size of the regions kept.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Regions it keeps ready when it can.
    pub fn spares(&self) -> usize {
        self.spares
    }

    /// Regions ready now.
    pub fn ready(&self) -> usize {
        self.lock().ready.len()
    }

    /// A ready region of `len` bytes (mapped now), if the pool keeps that size and has one.
    /// Never waits for the pool's thread: when it holds the pool's lock (it may be off its
    /// core, in the SCHED_IDLE class, for long), the caller makes its own region.
    pub fn take(&self, len: usize) -> Option<(OwnedFd, Region)> {
        if len != self.size {
            return None;
        }
        let mut st = match self.state.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let fd = st.ready.pop();
        st.failed = false;
        self.wake.notify_one();
        drop(st);
        let fd = fd?;
        match Region::map_own(&fd, self.size) {
            Ok(r) => Some((fd, r)),
            Err(e) => {
                tracing::warn!("spare regions: mapping one: {e}");
                None
            }
        }
    }

    /// Stops the thread (it ends once it sees the flag) and lets go of the regions kept.
    pub fn stop(&self) {
        let mut st = self.lock();
        st.stop = true;
        st.ready.clear();
        self.wake.notify_one();
    }

    /// The thread: makes regions while fewer than `spares` are ready, sleeps otherwise. It
    /// runs in the SCHED_IDLE class: making a spare must not delay the control thread or a
    /// container (a create that finds the pool empty makes its own region).
    fn fill(&self) {
        if let Err(e) = crate::set_thread_sched_idle() {
            tracing::debug!("spare regions: SCHED_IDLE: {e}");
        }
        loop {
            {
                let mut st = self.lock();
                while !st.stop && (st.ready.len() >= self.spares || st.failed) {
                    st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.stop {
                    return;
                }
            }
            // made without the lock: a take meanwhile is not held up
            let made = Region::sealed_memfd("docknet-region", self.size);
            let mut st = self.lock();
            match made {
                Ok(r) if !st.stop => st.ready.push(r),
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!("spare regions: making one of {} bytes: {e}", self.size);
                    st.failed = true;
                }
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn until(what: &str, f: impl Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn the_pool_refills_after_a_take_and_gives_only_its_size() {
        let pool = Pool::start(8192, 2).unwrap();
        until("filled", || pool.ready() == 2);
        assert!(pool.take(4096).is_none(), "another size is never given");
        let (fd, r) = pool.take(8192).unwrap();
        assert_eq!(r.len(), 8192);
        // a region from the pool is sealed and zeroed like one made on the spot
        let again = Region::map_sealed(std::os::fd::AsFd::as_fd(&fd), 8192).unwrap();
        assert!((0..8192)
            .step_by(512)
            .all(|o| again.load_u64(o, std::sync::atomic::Ordering::Relaxed) == 0));
        until("refilled", || pool.ready() == 2);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(pool.ready(), 2, "never more than asked for");
        pool.stop();
        assert_eq!(pool.ready(), 0);
        assert!(Pool::start(8192, 0).is_none());
    }
}
