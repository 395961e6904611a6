//! A stack across `fork`: it moves whole to the first process of the family that uses it.
//!
//! A pipe's rings have one producer and one consumer, and a stack's state (smoltcp's sockets)
//! lives in its process's memory. After `fork` both processes hold a copy of that state and map
//! the same rings, so only one of them may drive them. Servers as deployed fork after they
//! listen and then never use the listener in the parent again (nginx's master, gunicorn,
//! Apache prefork, a program that daemonizes): for them the stack can move to the child whole.
//!
//! - Before the fork (the caller's `pthread_atfork` prepare handler, [`crate::Stack::fork_prepare`])
//!   the stack's lock is held, so the child's copy is whole, and the fork is recorded: the
//!   parent is *quiet* if no call of it was in progress. Its engine then stops driving the
//!   stack for [`CLAIM_WINDOW`], so that nothing moves on in the parent's copy.
//! - The first process that uses the stack after the fork settles who owns it, under a lock
//!   in a page shared by the family: the parent, by a call, keeps it (and from then
//!   on no child can take it); a child takes it if the parent was quiet and still is. A child
//!   that took it drives it as its own (its engine thread starts); the parent's stack is then
//!   *moved*: its calls fail, its engine ends, and it never touches the rings again.
//! - A process that finds the stack taken by another also gets a moved stack.
//!
//! The page is shared by the processes of one container only, which trust each other as far
//! as Linux lets them (they may ptrace each other): a process that writes nonsense there hurts
//! its own family's sockets only. What the daemon sees does not change: one pipe, one family.
//! design.md, "Sockets across fork", has the whole story and what is not covered (both
//! processes using the stack: one of them gets a moved stack).

use crate::stack::{Inner, Stack};
use docknet_pipe::region::Region;
use docknet_pipe::wake;
use smoltcp::socket::tcp;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a parent's engine leaves its stack alone after a fork, for a child to take it.
/// After that the parent keeps it (its engine's next round settles it so): a late child's use
/// is refused. nginx's workers, gunicorn's and a daemonizing program's child use their
/// sockets within milliseconds of the fork.
pub const CLAIM_WINDOW: Duration = Duration::from_secs(2);

/// The lock word: 0 when free, else the pid of the process that holds it.
const LOCK: usize = 0;
/// The pid of the process that drives the stack.
const OWNER: usize = 4;
/// 1 while the owner has not used the stack since it last forked (a child may take it).
const QUIET: usize = 8;
/// How many times the stack moved to another process.
const MOVES: usize = 12;
const PAGE: usize = 4096;

/// The page a process shares with every process forked from it (anonymous, `MAP_SHARED`).
#[derive(Debug)]
pub(crate) struct Family {
    page: Region,
}

impl Family {
    /// A new family whose stack `owner` drives.
    fn new(owner: u32) -> Option<Family> {
        let page = Region::anonymous(PAGE).ok()?;
        page.store_u32(OWNER, owner, Ordering::Release);
        Some(Family { page })
    }

    fn word(&self, off: usize) -> Option<&AtomicU32> {
        self.page.u32_at(off)
    }

    /// Takes the family's lock. It is held for a few loads and stores only; a holder that died
    /// holding it (killed at that moment) is found gone and the lock taken over.
    fn lock(&self, me: u32) {
        let Some(w) = self.word(LOCK) else { return };
        let mut tries = 0u32;
        loop {
            match w.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return,
                Err(holder) => {
                    tries += 1;
                    if tries.is_multiple_of(64)
                        && !alive(holder)
                        && w.compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                    {
                        return;
                    }
                    if tries < 64 {
                        std::hint::spin_loop();
                    } else {
                        let _ = wake::wait_any(&[(w, holder)], Some(Duration::from_millis(1)));
                    }
                }
            }
        }
    }

    fn unlock(&self) {
        if let Some(w) = self.word(LOCK) {
            w.store(0, Ordering::Release);
            wake::wake(w);
        }
    }

    fn get(&self, off: usize) -> u32 {
        self.page.load_u32(off, Ordering::Acquire)
    }

    fn set(&self, off: usize, v: u32) {
        self.page.store_u32(off, v, Ordering::Release);
    }
}

/// Whether process `pid` still exists (in this pid namespace).
pub fn alive(pid: u32) -> bool {
    let Ok(p) = i32::try_from(pid) else {
        return false;
    };
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// What a settlement is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// A call of the application: the owner's ends the quiet; a child's takes the stack.
    Call,
    /// Any other use of the stack's state (the engine's, say): only who owns it is checked.
    Section,
    /// The parent's engine after [`CLAIM_WINDOW`]: the owner keeps the stack.
    Expired,
}

/// What a settlement found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// This process drives the stack (and nothing was to be done).
    Mine,
    /// This process just took the stack from the process it was forked from.
    Taken,
    /// Another process drives the stack: this one must never touch the rings again.
    Moved,
}

/// A stack's side of fork: process-local state beside the family's page.
#[derive(Debug)]
pub(crate) struct Forks {
    family: Option<Family>,
    /// The pid this copy of the stack belongs to (its creator's, or the process that took it):
    /// in a forked child it is still the parent's until the child settles.
    pid: AtomicU32,
    /// A fork happened since this process last settled.
    pending: AtomicBool,
    /// When the last fork happened (the start of the parent's engine pause).
    at: Mutex<Option<Instant>>,
    /// The stack is another process's now (permanent).
    moved: AtomicBool,
}

impl Forks {
    pub(crate) fn new() -> Forks {
        let pid = std::process::id();
        Forks {
            family: Family::new(pid),
            pid: AtomicU32::new(pid),
            pending: AtomicBool::new(false),
            at: Mutex::new(None),
            moved: AtomicBool::new(false),
        }
    }

    /// Whether a fork happened that this process has not settled yet (one relaxed load: it is
    /// asked on every lock).
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Whether the stack moved to another process (this one's copy is dead).
    #[inline]
    pub(crate) fn moved(&self) -> bool {
        self.moved.load(Ordering::Relaxed)
    }

    /// Records a fork about to happen (called with the stack's lock held, in the parent).
    /// `idle`: no call of the application is in progress.
    pub(crate) fn prepare(&self, idle: bool) {
        if self.moved() {
            return;
        }
        let me = std::process::id();
        if let Some(f) = &self.family {
            f.lock(me);
            if f.get(OWNER) == me {
                f.set(QUIET, u32::from(idle));
            }
            f.unlock();
        }
        *self.at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.pending.store(true, Ordering::Release);
    }

    /// In the parent after a fork no child can take the stack from (a call was in progress):
    /// nothing to settle.
    pub(crate) fn keep(&self) {
        self.pending.store(false, Ordering::Release);
    }

    /// Whether the engine must leave the stack alone: a fork is pending in the parent and the
    /// window for a child to take the stack is still open.
    pub(crate) fn paused(&self) -> bool {
        self.pending()
            && self
                .at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|t| t.elapsed() < CLAIM_WINDOW)
    }

    /// Settles who drives the stack (called with the stack's lock held, when [`Forks::pending`]).
    pub(crate) fn settle(&self, why: Why) -> Settled {
        let me = std::process::id();
        let Some(f) = &self.family else {
            // no family page (mmap failed): only the creator drives the stack
            return if self.pid.load(Ordering::Relaxed) == me {
                self.pending.store(false, Ordering::Relaxed);
                Settled::Mine
            } else {
                self.lose()
            };
        };
        f.lock(me);
        let owner = f.get(OWNER);
        let r = if owner == me {
            if why != Why::Section {
                f.set(QUIET, 0);
                self.pending.store(false, Ordering::Relaxed);
            }
            Settled::Mine
        } else if why != Why::Expired && self.pid.load(Ordering::Relaxed) != me && f.get(QUIET) == 1
        {
            // a forked copy whose owner has not used the stack since the fork: take it
            f.set(OWNER, me);
            f.set(QUIET, 0);
            f.set(MOVES, f.get(MOVES).wrapping_add(1));
            self.pid.store(me, Ordering::Relaxed);
            self.pending.store(false, Ordering::Relaxed);
            Settled::Taken
        } else {
            Settled::Moved
        };
        f.unlock();
        if r == Settled::Moved {
            return self.lose();
        }
        r
    }

    fn lose(&self) -> Settled {
        self.moved.store(true, Ordering::Release);
        self.pending.store(false, Ordering::Relaxed);
        Settled::Moved
    }

    /// The pid of the process that drives the stack (as the family's page says).
    pub(crate) fn owner(&self) -> Option<u32> {
        self.family.as_ref().map(|f| f.get(OWNER))
    }

    /// How many times the family's stack moved to another process.
    pub(crate) fn moves(&self) -> u32 {
        self.family.as_ref().map_or(0, |f| f.get(MOVES))
    }
}

/// Holds a stack's lock across `fork` ([`Stack::fork_prepare`]); end it in the parent
/// ([`ForkHold::parent`]) and in the child ([`ForkHold::child`]) right after.
#[must_use = "dropping it at once releases the stack before the fork"]
pub struct ForkHold {
    _held: MutexGuard<'static, Inner>,
    forks: &'static Forks,
    /// No call was in progress at the fork (a child may take the stack).
    idle: bool,
}

impl ForkHold {
    /// In the parent after the fork. If a call was in progress at the fork no child can take
    /// the stack, so the parent carries on as if there had been none.
    pub fn parent(self) {
        if !self.idle {
            self.forks.keep();
        }
    }

    /// In the child after the fork: its first use of the stack settles who drives it.
    pub fn child(self) {}
}

impl std::fmt::Debug for ForkHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkHold").finish_non_exhaustive()
    }
}

/// What the rest of the library and the preload library ask of a stack about fork.
impl Stack {
    /// Call in the `pthread_atfork` prepare handler, right before `fork`: holds the stack's
    /// lock until [`ForkHold`] is dropped (in the parent and in the child handlers), so the
    /// child's copy of the stack is whole, and records the fork. The first process to use the
    /// stack afterwards drives it: the parent, by any call of it; else the first child that
    /// uses it, if no call of the parent was in progress at the fork (see [`crate::fork`]).
    /// The parent's engine leaves the stack alone meanwhile, at most [`crate::fork::CLAIM_WINDOW`].
    pub fn fork_prepare(&'static self) -> ForkHold {
        let g = self.shared.inner.lock().unwrap_or_else(|e| e.into_inner());
        let idle = self.shared.callers.load(Ordering::Acquire) == 0;
        self.shared.forks.prepare(idle);
        ForkHold {
            _held: g,
            forks: &self.shared.forks,
            idle,
        }
    }

    /// Whether this process drives the stack. A forked child takes the stack here (as with its
    /// first call) when the process it was forked from has not used it since the fork; `false`
    /// when another process of the family drives it: then this copy is dead (every call
    /// fails, nothing it does touches the pipe).
    pub fn claim(&self) -> bool {
        self.shared.settle_pending(Why::Call);
        !self.shared.forks.moved()
    }

    /// Before the process exits: closes every TCP connection of the stack (FIN after what it
    /// holds, as the kernel closes the sockets of an exiting process) and polls until every
    /// byte and FIN is acknowledged, or `deadline` passes. A stack ends with its process, where
    /// the kernel sends on what an exiting process left in its sockets. The stack's lock is
    /// only taken when free, a millisecond apart: an `exit` from a signal handler that
    /// interrupted a call of this very thread (which holds the lock) gives up at the deadline
    /// instead of waiting for itself. Whether everything was acknowledged.
    pub fn close_all_at_exit(&self, deadline: Instant) -> bool {
        let mut closed = false;
        loop {
            let g = match self.shared.inner.try_lock() {
                Ok(g) => Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            };
            if let Some(mut g) = g {
                if !std::mem::replace(&mut closed, true) {
                    for (_, s) in g.sockets.iter_mut() {
                        if let smoltcp::socket::Socket::Tcp(t) = s {
                            if matches!(
                                t.state(),
                                tcp::State::SynReceived
                                    | tcp::State::Established
                                    | tcp::State::CloseWait
                            ) {
                                t.close();
                            }
                        }
                    }
                }
                g.poll();
                let pending = g.sockets.iter().any(|(_, s)| match s {
                    smoltcp::socket::Socket::Tcp(t) => {
                        t.send_queue() > 0
                            || matches!(
                                t.state(),
                                tcp::State::FinWait1 | tcp::State::Closing | tcp::State::LastAck
                            )
                    }
                    _ => false,
                });
                if !pending {
                    return true;
                }
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether a fork happened that no use of the stack has settled yet (a child may still
    /// take it: see [`crate::fork`]).
    pub fn fork_pending(&self) -> bool {
        self.shared.forks.pending()
    }

    /// Whether the stack moved to another process at a fork (this copy is dead).
    pub fn moved(&self) -> bool {
        self.shared.forks.moved()
    }

    /// The pid of the process that drives the stack, as the family's shared page says (`None`
    /// when there is no such page).
    pub fn owner(&self) -> Option<u32> {
        self.shared.forks.owner()
    }

    /// How many times the stack moved to another process of the family.
    pub fn moves(&self) -> u32 {
        self.shared.forks.moves()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of the stack as a forked child sees it: recorded for `parent`, which owns it,
    /// quiet or not, a fork pending.
    fn child_of(parent: u32, quiet: bool) -> Forks {
        let f = Forks::new();
        f.pid.store(parent, Ordering::Relaxed);
        let fam = f.family.as_ref().unwrap();
        fam.set(OWNER, parent);
        fam.set(QUIET, u32::from(quiet));
        f.pending.store(true, Ordering::Relaxed);
        f
    }

    /// A pid no process has (above the kernel's limit of 2^22).
    const NOBODY: u32 = 0x7fff_fff0;

    #[test]
    fn a_child_takes_the_stack_only_from_a_quiet_owner() {
        let f = child_of(NOBODY, true);
        assert_eq!(f.settle(Why::Call), Settled::Taken);
        assert_eq!(f.owner(), Some(std::process::id()));
        assert_eq!(f.moves(), 1);
        assert!(!f.pending() && !f.moved());
        // once taken, the quiet is over: nobody else takes it
        assert_eq!(f.family.as_ref().unwrap().get(QUIET), 0);

        let f = child_of(NOBODY, false);
        assert_eq!(f.settle(Why::Call), Settled::Moved);
        assert!(f.moved() && !f.pending());
        assert_eq!(f.owner(), Some(NOBODY));
    }

    #[test]
    fn the_owner_keeps_the_stack_by_a_call_and_the_engine_only_looks() {
        let f = Forks::new();
        f.prepare(true);
        assert!(f.pending() && f.paused());
        assert_eq!(f.family.as_ref().unwrap().get(QUIET), 1);
        // the engine's look leaves the quiet alone (a child may still take the stack)
        assert_eq!(f.settle(Why::Section), Settled::Mine);
        assert!(f.pending());
        assert_eq!(f.family.as_ref().unwrap().get(QUIET), 1);
        // a call keeps it: the quiet is over
        assert_eq!(f.settle(Why::Call), Settled::Mine);
        assert!(!f.pending());
        assert_eq!(f.family.as_ref().unwrap().get(QUIET), 0);
        // a fork with a call in progress: no child may take it
        f.prepare(false);
        assert_eq!(f.family.as_ref().unwrap().get(QUIET), 0);
        f.keep();
        assert!(!f.pending());
    }

    #[test]
    fn a_parent_whose_child_took_the_stack_finds_it_moved() {
        let f = Forks::new();
        f.prepare(true);
        // a child (another pid) took it meanwhile
        f.family.as_ref().unwrap().set(OWNER, NOBODY);
        f.family.as_ref().unwrap().set(QUIET, 0);
        assert_eq!(f.settle(Why::Expired), Settled::Moved);
        assert!(f.moved());
        // and the parent never takes it back, whatever the page says later
        let g = Forks::new();
        g.prepare(true);
        g.family.as_ref().unwrap().set(OWNER, NOBODY);
        assert_eq!(g.settle(Why::Call), Settled::Moved, "quiet or not");
    }

    #[test]
    fn the_family_lock_is_taken_over_from_a_holder_that_died() {
        let f = Forks::new();
        let fam = f.family.as_ref().unwrap();
        fam.set(LOCK, NOBODY);
        let t = Instant::now();
        fam.lock(std::process::id());
        assert_eq!(fam.get(LOCK), std::process::id());
        fam.unlock();
        assert_eq!(fam.get(LOCK), 0);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
}
