//! Wake-ups across processes: futexes on words inside shared regions, and the idle policy that
//! decides when a poller stops spinning and sleeps.
//!
//! A consumer that found nothing to do for a while arms the sleep word of every ring it reads
//! ([`crate::ring::Consumer::arm`]), re-checks them, and only then calls [`wait_any`]. A producer
//! kicks ([`wake`]) only when it sees the word armed, so busy traffic costs no syscalls.
//! `futex_waitv` (Linux 5.16) lets one thread sleep on the words of many rings at once, which is
//! what the daemon needs: each pipe's word lives in that pipe's own region, so a container can
//! only disturb its own word.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Set once `futex_waitv` failed for want of the call itself (a kernel older than 5.16, or a
/// seccomp filter that refuses it): from then on [`wait_any`] sleeps on one word at a time.
static NO_WAITV: AtomicBool = AtomicBool::new(false);

/// The word that last ended a one-word wait (its index in the caller's list): the next wait
/// sleeps on it, since traffic tends to keep to one ring.
static LAST_WOKEN: AtomicUsize = AtomicUsize::new(0);

/// How long a wait on the first word alone sleeps at most, so that the other words (another
/// ring, a control word) are still looked at every millisecond.
const ONE_WORD_SLICE: Duration = Duration::from_millis(1);

/// Most words one `futex_waitv` call takes (kernel's `FUTEX_WAITV_MAX`).
pub const MAX_WAITERS: usize = 128;

#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

const FUTEX2_SIZE_U32: u32 = 0x02;

/// CLOCK_MONOTONIC in nanoseconds: the clock every namespace on the machine shares, which the
/// daemon's heartbeat and the benchmarks' timestamps use.
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes into the local `t`; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Wakes every thread sleeping on `word` (in any process that maps it): a shared futex, so
/// that other processes mapping the same file are reached.
pub fn wake(word: &AtomicU32) {
    futex_wake(word, libc::FUTEX_WAKE);
}

/// Wakes every thread of this process sleeping on `word`, a word of the process's own memory
/// that every wait names as private ([`wait_mixed`]'s `private` words). The kernel finds a
/// private futex by its address alone; a shared one costs a lookup of the page behind it on
/// every wait and wake, which showed where many containers take turns on a core.
pub fn wake_private(word: &AtomicU32) {
    futex_wake(word, libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG);
}

/// `FUTEX_WAKE` (`op`, shared or private) of every sleeper on `word`.
fn futex_wake(word: &AtomicU32, op: libc::c_int) {
    // SAFETY: FUTEX_WAKE only reads the address as a key; `word` is a live, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// The producer's side of arm, check, sleep: wakes whoever sleeps on `word` if a sleeper armed
/// it (non-zero), and clears it. Call after a SeqCst fence that follows the store the sleeper
/// checks after arming (an index, a generation). True when it woke (a system call).
pub fn kick_if_armed(word: &AtomicU32) -> bool {
    if word.load(Ordering::Relaxed) != 0 && word.swap(0, Ordering::Relaxed) != 0 {
        wake(word);
        return true;
    }
    false
}

/// Why [`wait_any`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// Word `i` was woken (`FUTEX_WAKE`).
    Woken(usize),
    /// A word did not hold its expected value (at the call, or it changed).
    Changed,
    /// The timeout passed (or a signal interrupted the wait).
    TimedOut,
}

/// Run around every sleep of [`wait_any`], with `true` before and `false` after (see
/// [`set_sleep_hook`]).
static SLEEP_HOOK: std::sync::OnceLock<fn(bool)> = std::sync::OnceLock::new();

/// Sets the hook run around every sleep of [`wait_any`] (once per process; later calls are
/// ignored). The preload library runs the program's signal handlers that waited while the
/// library worked there: a sleep is the one place inside a call where it holds nothing.
pub fn set_sleep_hook(hook: fn(bool)) {
    let _ = SLEEP_HOOK.set(hook);
}

/// Sleeps until any of `words` (each with the value it is expected to hold) is woken or no
/// longer holds its value, or `timeout` passes. Returns at once if any word already differs.
/// Takes at most [`MAX_WAITERS`] words; with more, it sleeps on the first ones only, so callers
/// with more rings than that must pass a short timeout. Where `futex_waitv` is not available it
/// sleeps on one word for at most a millisecond at a time, looking at the others around it
/// (see `wait_first`), and says so once on stderr.
pub fn wait_any(words: &[(&AtomicU32, u32)], timeout: Option<Duration>) -> io::Result<Woke> {
    wait_mixed(words, &[], timeout)
}

/// [`wait_any`] on `shared` words (in memory other processes map, woken by [`wake`]) and
/// `private` ones (in this process's own memory, woken by [`wake_private`]); an index in
/// [`Woke::Woken`] counts the shared words first. A word must be waited on and woken the same
/// way every time: a private wake does not reach a shared sleeper, nor the other way round.
pub fn wait_mixed(
    shared: &[(&AtomicU32, u32)],
    private: &[(&AtomicU32, u32)],
    timeout: Option<Duration>,
) -> io::Result<Woke> {
    let hook = SLEEP_HOOK.get().copied();
    if let Some(h) = hook {
        h(true);
    }
    let r = sleep_on(shared, private, timeout);
    if let Some(h) = hook {
        h(false);
    }
    r
}

/// Sleeps on one private word (woken by [`wake_private`]) while it holds `expected`, with no
/// time limit, the sleep hook around the sleep (as [`wait_mixed`]). `Err` of kind
/// `Interrupted` when a signal's handler ended the sleep (one installed without `SA_RESTART`:
/// the kernel restarts the sleep after the others), as `pause(2)` ends.
pub fn wait_private_or_signal(word: &AtomicU32, expected: u32) -> io::Result<()> {
    let hook = SLEEP_HOOK.get().copied();
    if let Some(h) = hook {
        h(true);
    }
    // SAFETY: FUTEX_WAIT reads the live, aligned u32 `word` and sleeps while it holds
    // `expected`; a null timeout is no limit. Private, as its wakes are.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        )
    };
    let e = (rc != 0).then(io::Error::last_os_error);
    if let Some(h) = hook {
        h(false);
    }
    match e {
        Some(e) if e.raw_os_error() == Some(libc::EINTR) => Err(e),
        _ => Ok(()),
    }
}

/// A word to sleep on: the word, the value it is expected to hold, and whether it is private
/// (this process's own memory).
type Word<'a> = (&'a AtomicU32, u32, bool);

/// The `futex_waitv` flag of a private word (the kernel's `FUTEX2_PRIVATE`).
const FUTEX2_PRIVATE: u32 = 128;

/// [`wait_mixed`] without its hook.
fn sleep_on(
    shared: &[(&AtomicU32, u32)],
    private: &[(&AtomicU32, u32)],
    timeout: Option<Duration>,
) -> io::Result<Woke> {
    // (past the kernel's limit the last shared words are left out, never a private one: a
    // ring is looked at again after the sleep's timeout, while nothing else wakes a waker)
    let shared = &shared[..shared.len().min(MAX_WAITERS.saturating_sub(private.len()))];
    let words = || {
        let s = shared.iter().map(|&(w, v)| (w, v, false));
        s.chain(private.iter().map(|&(w, v)| (w, v, true)))
    };
    let one_word = || {
        wait_first(
            &words().collect::<smallvec::SmallVec<[Word<'_>; 8]>>(),
            timeout,
        )
    };
    if shared.is_empty() && private.is_empty() {
        std::thread::sleep(timeout.unwrap_or(Duration::from_millis(100)));
        return Ok(Woke::TimedOut);
    }
    if NO_WAITV.load(Ordering::Relaxed) {
        return one_word();
    }
    // (on the stack for the usual few words: a sleep allocates nothing)
    let w: smallvec::SmallVec<[FutexWaitv; 8]> = words()
        .take(MAX_WAITERS)
        .map(|(a, expected, private)| FutexWaitv {
            val: u64::from(expected),
            uaddr: a.as_ptr() as u64,
            flags: FUTEX2_SIZE_U32 | if private { FUTEX2_PRIVATE } else { 0 },
            reserved: 0,
        })
        .collect();
    let n = w.len();
    let deadline = timeout.map(|t| {
        // (in u64: nanoseconds since boot fit for 584 years, and a 128-bit division showed
        // in the profile of every sleep)
        let ns = monotonic_ns().saturating_add(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX));
        libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        }
    });
    let ts = deadline
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `w` is a valid array of `n` futex_waitv entries whose addresses are live aligned
    // u32 words borrowed for the duration of the call; `ts` is null or a valid absolute time.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            w.as_ptr(),
            n as libc::c_uint,
            0u32,
            ts,
            libc::CLOCK_MONOTONIC,
        )
    };
    if rc >= 0 {
        return Ok(Woke::Woken(rc as usize));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) => Ok(Woke::Changed),
        Some(libc::ETIMEDOUT) | Some(libc::EINTR) => Ok(Woke::TimedOut),
        Some(libc::ENOSYS) | Some(libc::EPERM) => {
            if !NO_WAITV.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "docknet: futex_waitv is not available ({e}: a kernel older than 5.16, or a \
                     seccomp filter that refuses it); waiting on one ring at a time and looking \
                     at the others every millisecond"
                );
            }
            one_word()
        }
        _ => Err(e),
    }
}

/// [`wait_any`] without `futex_waitv`: `FUTEX_WAIT` on one word (the one that ended the last
/// such wait, else the first) for at most [`ONE_WORD_SLICE`], after checking that none of the
/// others changed.
fn wait_first(words: &[Word<'_>], timeout: Option<Duration>) -> io::Result<Woke> {
    let changed = |words: &[Word<'_>]| {
        let k = words
            .iter()
            .position(|(w, v, _)| w.load(Ordering::SeqCst) != *v)?;
        LAST_WOKEN.store(k, Ordering::Relaxed);
        Some(k)
    };
    if changed(words).is_some() {
        return Ok(Woke::Changed);
    }
    let at = LAST_WOKEN.load(Ordering::Relaxed);
    let at = if at < words.len() { at } else { 0 };
    let t = timeout.map_or(ONE_WORD_SLICE, |t| t.min(ONE_WORD_SLICE));
    let ts = libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    };
    let (word, expected, private) = words[at];
    let op = if private {
        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG
    } else {
        libc::FUTEX_WAIT
    };
    // SAFETY: FUTEX_WAIT reads the live, aligned u32 `word` and sleeps while it holds
    // `expected`; `ts` is a valid relative timeout. Shared or private as its wakes are.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            expected,
            &ts as *const libc::timespec,
        )
    };
    if rc == 0 {
        return Ok(Woke::Woken(at));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) => Ok(Woke::Changed),
        // a slice ended: did one of the other words change meanwhile?
        Some(libc::ETIMEDOUT) | Some(libc::EINTR) => Ok(match changed(words) {
            Some(_) => Woke::Changed,
            None => Woke::TimedOut,
        }),
        _ => Err(e),
    }
}

/// How a poller behaves when it finds no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Busy-poll forever: lowest latency while the poller has a core of its own, one core at
    /// 100%, and a scheduler slice lost whenever it shares one.
    Spin,
    /// Spin for `spin`, then yield the core until `yield_for` has passed too (or until the core
    /// was contended [`MAX_CONTENDED_YIELDS`] times), then sleep on a futex until a producer
    /// kicks. An idle system burns no CPU.
    Adaptive {
        /// Busy-poll budget after the last work.
        spin: Duration,
        /// Further budget spent yielding before sleeping.
        yield_for: Duration,
    },
    /// Sleep as soon as there is no work.
    Block,
}

/// A yield that kept this poller off its core for longer than this gave the core to someone
/// else: a contended yield.
pub const CONTENDED_YIELD: Duration = Duration::from_micros(5);

/// Contended yields a waiter makes, with no work coming, before it sleeps, at most. A yielding
/// waiter stays runnable: beside one partner on its core it hands the core over and is back for
/// the reply without a wake-up (one-core ping-pong costs one contended yield per message), but
/// beside many runnable waiters every yield of its own is a context switch the busy ones pay
/// for. So the budget learns: it halves each time it ran out with no work coming (the waiter
/// then slept anyway), and doubles, up to this, each time work came while it yielded on a
/// contended core. Among many waiters it settles at one yield; beside one partner it stays here.
pub const MAX_CONTENDED_YIELDS: u32 = 8;

impl IdlePolicy {
    /// The default of every DockNet program: no spinning, yield the core for up to 1 ms (fewer
    /// when the core is contended), then sleep. Measured best with nothing pinned and waiters
    /// outnumbering cores (docs/benchmarks.md, "Shared cores"): a yielding waiter gives its
    /// core to whatever is runnable at once, and is still awake, so no cross-core wake-up, when
    /// its next frame comes.
    pub const ADAPTIVE: IdlePolicy = IdlePolicy::Adaptive {
        spin: Duration::ZERO,
        yield_for: Duration::from_millis(1),
    };

    /// Parses `spin`, `adaptive` ([`IdlePolicy::ADAPTIVE`]), `adaptive:SPIN_US` (then 1 ms of
    /// yielding), `adaptive:SPIN_US:YIELD_US`, or `block`.
    pub fn parse(s: &str) -> Result<IdlePolicy, String> {
        match s {
            "spin" => Ok(IdlePolicy::Spin),
            "adaptive" => Ok(IdlePolicy::ADAPTIVE),
            "block" => Ok(IdlePolicy::Block),
            _ => {
                let us = |t: &str| t.parse::<u64>().ok().map(Duration::from_micros);
                let mut parts = s.strip_prefix("adaptive:").unwrap_or_default().split(':');
                match (
                    s.starts_with("adaptive:"),
                    parts.next(),
                    parts.next(),
                    parts.next(),
                ) {
                    (true, Some(a), b, None) => match (us(a), b.map(us)) {
                        (Some(spin), None) => Ok(IdlePolicy::Adaptive {
                            spin,
                            yield_for: Duration::from_millis(1),
                        }),
                        (Some(spin), Some(Some(yield_for))) => {
                            Ok(IdlePolicy::Adaptive { spin, yield_for })
                        }
                        _ => Err(bad_idle(s)),
                    },
                    _ => Err(bad_idle(s)),
                }
            }
        }
    }
}

impl std::fmt::Display for IdlePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdlePolicy::Spin => f.write_str("spin"),
            IdlePolicy::Block => f.write_str("block"),
            p if *p == IdlePolicy::ADAPTIVE => f.write_str("adaptive"),
            IdlePolicy::Adaptive { spin, yield_for } if *yield_for == Duration::from_millis(1) => {
                write!(f, "adaptive:{}", spin.as_micros())
            }
            IdlePolicy::Adaptive { spin, yield_for } => {
                write!(f, "adaptive:{}:{}", spin.as_micros(), yield_for.as_micros())
            }
        }
    }
}

fn bad_idle(s: &str) -> String {
    format!(
        "unknown idle policy {s:?}: use spin, adaptive, adaptive:SPIN_US, \
         adaptive:SPIN_US:YIELD_US or block"
    )
}

/// What an idle poller should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleStep {
    /// Poll again at once (with a spin-loop hint).
    Spin,
    /// Give the core away, then poll again.
    Yield,
    /// Arm sleep words, re-check, and sleep.
    Sleep,
}

/// Tracks how long a poller has been idle and applies its [`IdlePolicy`].
#[derive(Debug, Clone)]
pub struct Idler {
    policy: IdlePolicy,
    idle_since: Option<Instant>,
    /// When the last yield was handed out (its length tells whether the core was contended).
    yielded_at: Option<Instant>,
    /// Contended yields since the last work.
    contended: u32,
    /// Contended yields allowed before sleeping (1..=[`MAX_CONTENDED_YIELDS`]), learned.
    budget: u32,
    /// Whether the last idle spell ended in sleep.
    slept: bool,
}

impl Idler {
    /// A poller with `policy`.
    pub fn new(policy: IdlePolicy) -> Idler {
        Idler {
            policy,
            idle_since: None,
            yielded_at: None,
            contended: 0,
            budget: MAX_CONTENDED_YIELDS,
            slept: false,
        }
    }

    /// A poller with `policy` that goes on from a budget of contended yields learned before
    /// (see [`Idler::budget`]): waits that each make an idler of their own keep what the
    /// thread's earlier waits learned.
    pub fn with_budget(policy: IdlePolicy, budget: u32) -> Idler {
        Idler {
            budget: budget.clamp(1, MAX_CONTENDED_YIELDS),
            ..Idler::new(policy)
        }
    }

    /// The contended yields this poller now allows before it sleeps, as learned.
    pub fn budget(&self) -> u32 {
        self.budget
    }

    /// The policy in force.
    pub fn policy(&self) -> IdlePolicy {
        self.policy
    }

    /// Call after a round whose work says nothing about more work soon (it came when the
    /// caller knew it would, e.g. when a rate limit's tokens let it): the spell of idleness
    /// goes on as if the round had found nothing, and the yield handed out before the round
    /// is not counted as contended (the round, not another thread, kept the poller busy).
    pub fn aside(&mut self) {
        self.yielded_at = None;
    }

    /// Call after a round that did work.
    pub fn busy(&mut self) {
        // (a clock read only when the last step was a yield)
        if self.yielded_at.is_some() {
            self.count_yield(Instant::now());
        }
        if self.contended > 0 && !self.slept {
            // work came while this waiter yielded a contended core: yielding paid
            self.budget = (self.budget * 2).min(MAX_CONTENDED_YIELDS);
        }
        self.idle_since = None;
        self.yielded_at = None;
        self.contended = 0;
        self.slept = false;
    }

    /// Ends the yield handed out last, if any: it counts as contended when it kept this poller
    /// off its core for more than [`CONTENDED_YIELD`].
    fn count_yield(&mut self, now: Instant) {
        if let Some(y) = self.yielded_at.take() {
            if now.duration_since(y) > CONTENDED_YIELD {
                self.contended += 1;
            }
        }
    }

    /// Call after a round that found nothing; says what to do.
    pub fn idle(&mut self) -> IdleStep {
        match self.policy {
            IdlePolicy::Spin => IdleStep::Spin,
            IdlePolicy::Block => IdleStep::Sleep,
            IdlePolicy::Adaptive { spin, yield_for } => {
                let now = Instant::now();
                let since = *self.idle_since.get_or_insert(now);
                self.count_yield(now);
                let idle = now.duration_since(since);
                if idle < spin {
                    IdleStep::Spin
                } else if idle < spin + yield_for && self.contended < self.budget {
                    self.yielded_at = Some(now);
                    IdleStep::Yield
                } else {
                    if self.contended >= self.budget && !self.slept {
                        // the budget ran out on a contended core with no work coming
                        self.budget = (self.budget / 2).max(1);
                    }
                    self.slept = true;
                    IdleStep::Sleep
                }
            }
        }
    }

    /// Runs the non-sleeping steps; returns true when the caller must sleep now.
    pub fn step(&mut self) -> bool {
        match self.idle() {
            IdleStep::Spin => {
                std::hint::spin_loop();
                false
            }
            IdleStep::Yield => {
                std::thread::yield_now();
                false
            }
            IdleStep::Sleep => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    /// Without `futex_waitv`: a changed word answers at once, a wake of the first word ends
    /// the sleep, a change of another word is seen within a slice, and the timeout holds.
    #[test]
    fn waits_on_the_first_word_alone_still_see_every_word() {
        let (a, b) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(7)));
        assert_eq!(
            wait_first(&[(&a, 0, false), (&b, 8, false)], None).unwrap(),
            Woke::Changed
        );
        // a kick of the first word
        let a2 = a.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            a2.store(1, Ordering::SeqCst);
            wake(&a2);
        });
        let t0 = Instant::now();
        let mut woke = false;
        while t0.elapsed() < Duration::from_secs(5) {
            match wait_first(
                &[(&a, 0, false), (&b, 7, false)],
                Some(Duration::from_secs(5)),
            )
            .unwrap()
            {
                Woke::TimedOut => continue,
                _ => {
                    woke = true;
                    break;
                }
            }
        }
        t.join().unwrap();
        assert!(woke && a.load(Ordering::SeqCst) == 1);
        // a change of the second word, without a wake of the first
        let b2 = b.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            b2.store(9, Ordering::SeqCst);
        });
        let t0 = Instant::now();
        let r = loop {
            let r = wait_first(
                &[(&a, 1, false), (&b, 7, false)],
                Some(Duration::from_secs(5)),
            )
            .unwrap();
            if r != Woke::TimedOut || t0.elapsed() > Duration::from_secs(5) {
                break r;
            }
        };
        t.join().unwrap();
        assert_eq!(r, Woke::Changed);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        // nothing happens: one slice at most, whatever the timeout asked
        let t0 = Instant::now();
        let r = wait_first(
            &[(&a, 1, false), (&b, 9, false)],
            Some(Duration::from_secs(5)),
        )
        .unwrap();
        assert_eq!(r, Woke::TimedOut);
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "{:?}",
            t0.elapsed()
        );
    }

    /// A private word sleeps and wakes by private calls, beside a shared one, both with
    /// `futex_waitv` and without it; the index of a woken private word counts the shared first.
    #[test]
    fn a_private_word_is_woken_by_a_private_wake() {
        let (a, b) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        for one_word in [false, true] {
            let (b2, done) = (b.clone(), Arc::new(AtomicBool::new(false)));
            let done2 = done.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                // the value stays: only a wake can end the sleep (again and again, in case
                // the waiter was not asleep yet or was between two of the fallback's slices)
                while !done2.load(Ordering::SeqCst) {
                    wake_private(&b2);
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
            let t0 = Instant::now();
            let (r, private_at) = if one_word {
                // (the private word alone: the fallback sleeps on it slice after slice, and
                // only its wake can end the loop)
                let r = loop {
                    match wait_first(&[(&b, 0, true)], None).unwrap() {
                        Woke::TimedOut if t0.elapsed() < Duration::from_secs(5) => continue,
                        r => break r,
                    }
                };
                (r, 0)
            } else {
                let r = wait_mixed(&[(&a, 0)], &[(&b, 0)], Some(Duration::from_secs(5)));
                (r.unwrap(), 1)
            };
            done.store(true, Ordering::SeqCst);
            t.join().unwrap();
            assert_eq!(r, Woke::Woken(private_at), "one word: {one_word}");
            assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        }
    }

    #[test]
    fn policy_parse() {
        assert_eq!(IdlePolicy::parse("spin"), Ok(IdlePolicy::Spin));
        assert_eq!(IdlePolicy::parse("block"), Ok(IdlePolicy::Block));
        assert!(matches!(
            IdlePolicy::parse("adaptive:20"),
            Ok(IdlePolicy::Adaptive { .. })
        ));
        assert!(IdlePolicy::parse("fast").is_err());
        assert_eq!(IdlePolicy::ADAPTIVE.to_string(), "adaptive");
        assert_eq!(IdlePolicy::parse("adaptive:0"), Ok(IdlePolicy::ADAPTIVE));
        assert_eq!(
            IdlePolicy::parse("adaptive:50").unwrap().to_string(),
            "adaptive:50"
        );
        let y = IdlePolicy::parse("adaptive:0:200").unwrap();
        assert_eq!(
            y,
            IdlePolicy::Adaptive {
                spin: Duration::ZERO,
                yield_for: Duration::from_micros(200)
            }
        );
        assert_eq!(y.to_string(), "adaptive:0:200");
        assert_eq!(IdlePolicy::parse(&y.to_string()), Ok(y));
        for bad in [
            "adaptive:",
            "adaptive:1:",
            "adaptive:1:2:3",
            "adaptive:x",
            "adaptive::5",
        ] {
            assert!(IdlePolicy::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn adaptive_goes_spin_yield_sleep() {
        // Each phase is checked with the others far away, so a test preempted for a while on
        // a loaded machine (a 6 ms sleep that took 12) still sees the phase it expects: a
        // long yield phase after a short spin, and a short one that is surely over.
        let mut i = Idler::new(IdlePolicy::Adaptive {
            spin: Duration::from_millis(5),
            yield_for: Duration::from_secs(60),
        });
        assert_eq!(i.idle(), IdleStep::Spin);
        std::thread::sleep(Duration::from_millis(6));
        assert_eq!(i.idle(), IdleStep::Yield);
        let mut j = Idler::new(IdlePolicy::Adaptive {
            spin: Duration::from_millis(1),
            yield_for: Duration::from_millis(1),
        });
        assert_eq!(j.idle(), IdleStep::Spin);
        std::thread::sleep(Duration::from_millis(3));
        assert_eq!(j.idle(), IdleStep::Sleep);
        j.busy();
        assert_eq!(j.idle(), IdleStep::Spin);
    }

    #[test]
    fn a_yielding_waiter_sleeps_after_enough_contended_yields() {
        let mut i = Idler::new(IdlePolicy::Adaptive {
            spin: Duration::ZERO,
            yield_for: Duration::from_secs(60),
        });
        // yields that come straight back (nobody else wanted the core) do not count (a
        // preemption of this test on a loaded machine may count one or two)
        for _ in 0..20 {
            assert_eq!(i.idle(), IdleStep::Yield);
        }
        let before = i.contended;
        assert!(
            before <= 2,
            "{before} of 20 quick yields counted as contended"
        );
        // yields that kept it off its core do: a sleep after MAX_CONTENDED_YIELDS of them
        let mut yields = 0;
        loop {
            std::thread::sleep(CONTENDED_YIELD * 2);
            match i.idle() {
                IdleStep::Yield => yields += 1,
                IdleStep::Sleep => break,
                IdleStep::Spin => panic!("no spin budget"),
            }
        }
        assert_eq!(yields + 1 + before, MAX_CONTENDED_YIELDS);
        // that spell ran out: the next gets half the budget, and a spell where work came while
        // yielding a contended core doubles it again
        i.busy();
        let spell = |i: &mut Idler| {
            let mut n = 0;
            loop {
                std::thread::sleep(CONTENDED_YIELD * 2);
                match i.idle() {
                    IdleStep::Yield => n += 1,
                    _ => return n,
                }
            }
        };
        assert_eq!(spell(&mut i), MAX_CONTENDED_YIELDS / 2);
        i.busy();
        for _ in 0..10 {
            spell(&mut i);
            i.busy();
        }
        assert_eq!(i.budget(), 1, "many waiters: one yield, then sleep");
        // a later wait, with an idler of its own, goes on from there
        assert_eq!(Idler::with_budget(i.policy(), i.budget()).budget(), 1);
        assert_eq!(Idler::with_budget(i.policy(), 0).budget(), 1);
        assert_eq!(
            Idler::with_budget(i.policy(), 99).budget(),
            MAX_CONTENDED_YIELDS
        );
        assert_eq!(i.idle(), IdleStep::Yield);
        std::thread::sleep(CONTENDED_YIELD * 2);
        i.busy(); // work came during a contended yield
        assert_eq!(i.budget, 2);
    }

    #[test]
    fn waitv_returns_on_mismatch_timeout_and_wake() {
        let a = Arc::new(AtomicU32::new(1));
        let b = AtomicU32::new(0);
        // b != expected: immediate return
        let t = Instant::now();
        assert_eq!(
            wait_any(&[(&a, 1), (&b, 1)], Some(Duration::from_secs(5))).unwrap(),
            Woke::Changed
        );
        assert!(t.elapsed() < Duration::from_secs(1));
        // timeout
        let t = Instant::now();
        assert_eq!(
            wait_any(&[(&a, 1)], Some(Duration::from_millis(20))).unwrap(),
            Woke::TimedOut
        );
        assert!(t.elapsed() >= Duration::from_millis(19));
        // wake from another thread
        let a2 = a.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            a2.store(0, Ordering::SeqCst);
            wake(&a2);
        });
        let c = AtomicU32::new(5);
        // woken (index 1), or the store seen first (changed): either way, the wait ends
        let w = wait_any(&[(&c, 5), (&a, 1)], Some(Duration::from_secs(10))).unwrap();
        assert!(matches!(w, Woke::Woken(1) | Woke::Changed), "{w:?}");
        assert_eq!(a.load(Ordering::SeqCst), 0);
        h.join().unwrap();
    }
}
