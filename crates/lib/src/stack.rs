//! DockLib's userspace TCP/IP: one smoltcp interface per pipe, and blocking std-like sockets.
//!
//! **Who polls.** A blocking call (`read`, `write`, `accept`, `connect`, …) polls the stack
//! itself until it can complete: run-to-completion, so a request/response never waits for a
//! hand-off between threads. Between polls it follows the stack's idle policy (spin, yield,
//! then sleep on the rings' futex words). When no call is in progress, a background engine
//! thread polls instead, so ACKs, retransmissions and incoming connections make progress while
//! the application computes; it steps aside (sleeps) while any call is active.
//!
//! **smoltcp's limits and how they are met here.** No listen backlog: a listener owns a pool
//! of sockets on its port, topped up to a few listening ones before every poll while fewer
//! than `backlog` connections wait, and a SYN that finds none free waits in the device for
//! the refill instead of being reset; half-open connections cannot hold it (a per-source
//! share, the oldest given up for a new SYN, a deadline: [`HALF_OPEN_TIMEOUT`]). Socket
//! scans: an egress between sweeps visits a list of the sockets that may send, an event loop
//! reads which connections changed ([`crate::changes`]), and a connection's segment goes
//! first to the socket that last took its 4-tuple. One stack (one interface) per container. Small neighbour cache:
//! built with room for 64 entries. One MTU per interface: the pipe's (create pipes with a
//! large MTU to get large segments over fast channels). Nagle and delayed ACKs are off by
//! default (RPC latency); window scaling follows the buffer sizes (256 KiB default), and CUBIC
//! congestion control is on.

pub(crate) use crate::backlog::Listening;
pub use crate::backlog::{HALF_OPEN_MIN_AGE, HALF_OPEN_TIMEOUT};
pub use crate::config::{StackConfig, ACK_DELAY};
use crate::device::{DeviceStats, PipeDevice};
pub use crate::fork::ForkHold;
use crate::fork::{Forks, Settled, Why};
use crate::raw::{AttachError, Endpoint, SleepSet};
use docknet_pipe::services::Proto;
use docknet_pipe::{IdlePolicy, Idler};
use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::socket::tcp;
use smoltcp::wire::{
    EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpEndpoint, Ipv4Address, Ipv6Address,
};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// How often a poll sends for every socket, for their timers: the others only send for the
/// sockets the application or a frame touched since (smoltcp's egress otherwise visits every
/// socket on every poll: a third of an nginx worker's time at 64 connections). A poll when the
/// stack's next timer is due visits them all too.
const SWEEP: Duration = Duration::from_millis(1);

pub(crate) struct Inner {
    pub(crate) iface: Interface,
    pub(crate) sockets: SocketSet<'static>,
    pub(crate) dev: PipeDevice,
    epoch: Instant,
    /// Where the pipe's shared port sequence starts, if this stack is its first taker.
    port_seed: u64,
    /// State of the draws that pick a service's backend.
    draw: u64,
    /// Bumped by every poll that moved anything ([`Shared::events`]).
    events: Arc<AtomicU32>,
    /// Sockets closed by the application, removed once their state reaches Closed.
    closing: Vec<Closing>,
    /// Listeners by port: their listening sockets and the connections not yet accepted.
    pub(crate) listeners: Vec<Listening>,
    pub(crate) cfg: StackConfig,
    /// Set by a call step that changed nothing a poll would send (a read that left the window
    /// as announced): the blocking call skips its poll after the step. Taken there, and reset
    /// whenever the lock is taken, so it never outlives its step.
    pub(crate) nothing_to_send: bool,
    /// Set by a write step: the connection whose bytes the poll after it sends first, from
    /// the headers of its last segment where it can (`fastpath`). Taken by that poll.
    pub(crate) wrote: Option<SocketHandle>,
    /// Connections a blocking read returned data from, whose reader has not come back to wait
    /// for more: it is answering, and the answer will carry the ACK, which another thread
    /// going to sleep then leaves held ([`Inner::release_delayed_acks`]). A connection leaves
    /// the list when its ACK leaves or its reader waits again.
    answering: smallvec::SmallVec<[SocketHandle; 4]>,
    /// Set by a poll that left nothing to send, and kept by a call's step that queued nothing
    /// (a record written, a read that owes no window update); taken by the next
    /// [`Shared::lock`] into `was_clean`. Whatever else holds the lock and changes a socket
    /// ends with it unset.
    clean: bool,
    /// Whether the critical section before this one ended with a poll that left nothing to
    /// do: a blocking call whose first try finds nothing then skips its first poll (it would
    /// find nothing either) and goes on to wait; the sleep is armed only if no frame came.
    was_clean: bool,
    /// Whether a poll ran since the lock was taken (its `clean` then says what it left).
    polled: bool,
    /// The gateway the interface's default route goes through: the daemon's, as last seen
    /// ([`Inner::follow_gateway`]).
    gateway: Option<Ipv4Addr>,
    /// Which connections may have changed, for event loops ([`Stack::changes`]).
    pub(crate) changes: crate::changes::ChangeLog,
}

/// A socket closed by the application, until it reaches Closed.
struct Closing {
    h: SocketHandle,
}

/// A deadline as smoltcp takes it: within 1 ms and a day (smoltcp adds it to a signed
/// microsecond clock, where a larger one would wrap to the past and abort at once).
pub(crate) fn smol(d: Duration) -> smoltcp::time::Duration {
    let d = d.clamp(Duration::from_millis(1), Duration::from_secs(86_400));
    smoltcp::time::Duration::from_micros(d.as_micros() as u64)
}

impl Inner {
    pub(crate) fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    /// The poll after a call's step succeeded, so what it queued leaves now; skipped when the
    /// step said it changed nothing to send.
    fn poll_after_step(&mut self) {
        if std::mem::take(&mut self.nothing_to_send) {
            // the step queued nothing: the stack stays as clean as the last poll left it (this
            // call's, or the one before the lock), so the next call's wait may skip its first
            // poll as it would after a poll here
            if !self.polled {
                self.clean = self.was_clean;
            }
        } else {
            self.poll_out();
        }
    }

    /// The poll after a step: sends what the step queued (and anything else due), without
    /// looking for frames to receive. The step has just run on what the last poll took in; a
    /// frame that came since is taken by the caller's next poll, and one that comes while it
    /// sleeps shows in the ring it arms. Skips an empty look at every ring this endpoint reads
    /// per write. True when anything moved.
    pub(crate) fn poll_out(&mut self) -> bool {
        let now = self.now();
        let before = self.dev.stats;
        self.dev.flush_backlog();
        let mut changed = false;
        // the connection just written, first: one plain segment goes out from the headers of
        // its last one; then the egress only if anything else waits for it
        if let Some(h) = self.wrote.take() {
            let dev = &mut self.dev;
            if self
                .iface
                .tcp_fast_send(now, &mut self.sockets, h, |seg| dev.send_fast(seg))
                .is_some()
            {
                changed = true;
                if !self.sockets.egress_wanted(now) {
                    self.dev.ep.flush();
                    return self.finish_poll(changed, before);
                }
            }
        }
        while self
            .iface
            .poll_egress(now, &mut self.dev, &mut self.sockets)
            == PollResult::SocketStateChanged
        {
            changed = true;
        }
        self.dev.ep.flush();
        self.finish_poll(changed, before)
    }

    /// Polls the interface; true when anything moved.
    pub(crate) fn poll(&mut self) -> bool {
        // (the egress below sends for the connection just written, if it has not yet)
        self.wrote = None;
        self.follow_gateway();
        let now = self.now();
        let before = self.dev.stats;
        self.dev.start_poll(crate::device::RX_BUDGET);
        // what waited for room in a ring goes first
        self.dev.flush_backlog();
        // records a fast channel's partner sent, first: where nothing else came and nothing
        // waits to be sent, smoltcp's poll is skipped
        let mut changed = self.take_records(now);
        if changed && !self.dev.frame_pending() && !self.sockets.egress_wanted(now) {
            self.dev.ep.flush();
            return self.finish_poll(changed, before);
        }
        // a SYN held for want of a listening socket is taken once the pool is refilled, and a
        // record met by smoltcp's look at the rings once smoltcp is done with what came before it
        for _ in 0..8 {
            self.refill_listeners();
            changed |= self.iface.poll(now, &mut self.dev, &mut self.sockets)
                == PollResult::SocketStateChanged;
            changed |= self.take_records(now);
            if self.dev.held_syn.is_none() && !self.dev.frame_pending() {
                break;
            }
        }
        // (a frame left for the next poll must not be read where the flush gives it back)
        self.dev.settle_pending();
        self.dev.ep.flush();
        self.finish_poll(changed, before)
    }

    /// Keeps the default route on the daemon's gateway: a daemon that took the pipe over after
    /// a restart may drive a link where the last one drove none, or none where it did.
    fn follow_gateway(&mut self) {
        let gw = self.dev.ep.gateway();
        if gw != self.gateway {
            self.gateway = gw;
            set_gateway(&mut self.iface, gw);
        }
    }

    /// What every poll ends with: connections closed by the application and done with are
    /// dropped, and other threads learn that something moved. True when anything did.
    fn finish_poll(&mut self, changed: bool, before: DeviceStats) -> bool {
        if !self.closing.is_empty() {
            let sockets = &mut self.sockets;
            // A closed connection goes once it is closed, or as soon as it is in TIME-WAIT
            // (its last ACK went out in the poll that took it there) rather than after
            // smoltcp's 10 s. A socket in TIME-WAIT keeps its buffers and is visited by every
            // poll: a server that closes first (a connection per request: gunicorn's workers,
            // inetd's children) held one per request for 10 s, thousands at a thousand
            // requests a second, and each poll walked them all (gunicorn answered 1.1k
            // requests/s instead of 7.9k, benchmarks.md). A late copy of the peer's FIN now
            // meets no connection and is answered with RST, which ends the peer's LAST-ACK as
            // the lost ACK would have; a new SYN for the 4-tuple finds it free at once.
            self.closing.retain(|c| {
                let state = sockets.get::<tcp::Socket>(c.h).state();
                let gone = matches!(state, tcp::State::Closed | tcp::State::TimeWait);
                if gone {
                    crate::buffers::recycle(sockets.remove(c.h));
                }
                !gone
            });
        }
        self.clean = !self.dev.backlogged();
        self.polled = true;
        let moved = changed || self.dev.stats != before;
        if moved {
            // Another thread's wait may hang on what this poll changed (a connection to
            // accept, data, room)
            self.wake_waiters();
        }
        moved
    }

    /// Tells the stack's waiters that something changed: a wait rechecks when the events
    /// word moved since its check, and one asleep is woken (only then a system call).
    pub(crate) fn wake_waiters(&self) {
        self.events.fetch_add(1, Ordering::Release);
        if self.dev.ep.sleepers() > 0 {
            docknet_pipe::wake::wake_private(&self.events);
        }
    }

    /// How long until something needs a poll without new frames: a TCP timer, or a frame
    /// held back by fault injection.
    fn delay(&mut self) -> Option<Duration> {
        let now = self.now();
        let due = self.iface.poll_delay(now, &self.sockets);
        if let Some(d) = due {
            // the poll when it is due visits every socket, the one whose timer it is too
            self.sockets.sweep_by(now + d);
        }
        let timer = due.map(|d| Duration::from_micros(d.total_micros()));
        match (timer, self.dev.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sends the acknowledgements the ACK delay holds back (a poll, only when one is held)
    /// before a thread sleeps, so that a peer does not wait for an ACK while this side waits
    /// for the peer; but not those of connections with data nobody has read yet (in the
    /// receive buffer, or in a waiting reader's lent buffer, `TcpStream::read_timeout`), nor
    /// those whose reader took data and is answering ([`Inner::answering`]). A thread woken by
    /// the same frame reads it and answers, and the answer carries the ACK: a server's accept
    /// thread, woken with the thread that answers, used to send a bare ACK ahead of a third of
    /// the answers (and of half of them once the reader took the bytes straight from the
    /// frame, sooner). If the reader goes to sleep instead, it sends the ACK then; the ACK
    /// delay's timer bounds the rest.
    fn release_delayed_acks(&mut self) {
        // (looked at without touching, in one pass: only the sockets whose ACK leaves are
        // sent for)
        let mut answering = smallvec::SmallVec::<[SocketHandle; 4]>::new();
        let was = std::mem::take(&mut self.answering);
        let held: smallvec::SmallVec<[SocketHandle; 8]> = self
            .sockets
            .iter()
            .filter_map(|(h, s)| match s {
                smoltcp::socket::Socket::Tcp(t) if t.ack_delayed() && was.contains(&h) => {
                    answering.push(h);
                    None
                }
                smoltcp::socket::Socket::Tcp(t)
                    if t.ack_delayed() && t.recv_queue() == 0 && t.direct_pending() == 0 =>
                {
                    Some(h)
                }
                _ => None,
            })
            .collect();
        self.answering = answering;
        for &h in &held {
            self.sockets.get_mut::<tcp::Socket>(h).expire_ack_delay();
        }
        if !held.is_empty() {
            self.poll();
        }
    }

    /// Notes that a blocking read returned data of `h` ([`Inner::answering`]).
    pub(crate) fn answering(&mut self, h: SocketHandle) {
        if !self.answering.contains(&h) {
            self.answering.push(h);
        }
    }

    /// Notes that the reader of `h` waits again ([`Inner::answering`]).
    pub(crate) fn not_answering(&mut self, h: SocketHandle) {
        self.answering.retain(|a| *a != h);
    }

    pub(crate) fn tcp(&mut self, h: SocketHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(h)
    }

    /// The TCP socket `h`, to change in a way that makes no segment due (a read that opened
    /// no window worth announcing, a reader's buffer lent or taken back): unlike
    /// [`Inner::tcp`] it does not mark the socket as one the next poll sends for.
    pub(crate) fn tcp_quiet(&mut self, h: SocketHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut_quiet::<tcp::Socket>(h)
    }

    /// The TCP socket `h`, to look at: unlike [`Inner::tcp`] it does not mark the socket as
    /// one the next poll sends for (`SocketSet::set_egress_scope`).
    pub(crate) fn tcp_ref(&self, h: SocketHandle) -> &tcp::Socket<'static> {
        self.sockets.get::<tcp::Socket>(h)
    }

    /// A new TCP socket with the stack's settings.
    pub(crate) fn new_tcp_socket(&mut self) -> SocketHandle {
        let c = self.cfg.clone();
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(crate::buffers::take(c.tcp_rx_buffer)),
            tcp::SocketBuffer::new(crate::buffers::take(c.tcp_tx_buffer)),
        );
        s.set_nagle_enabled(c.nagle);
        s.set_ack_delay(
            c.ack_delay
                .map(|d| smoltcp::time::Duration::from_micros(d.as_micros() as u64)),
        );
        s.set_congestion_control(if c.congestion_control {
            tcp::CongestionControl::Cubic
        } else {
            tcp::CongestionControl::None
        });
        self.sockets.add(s)
    }

    /// Removes a socket once it has finished closing.
    pub(crate) fn retire(&mut self, h: SocketHandle) {
        self.closing.push(Closing { h });
    }

    /// The next ephemeral port: the pipe's, shared with the container's other processes
    /// ([`crate::Endpoint::next_port`]).
    pub(crate) fn ephemeral_port(&mut self) -> u16 {
        self.dev.ep.next_port(self.port_seed)
    }

    /// Where a connection (or a datagram) to `to` over `proto` goes: `to` itself, unless it is
    /// a service's address and port (then one of its backends, or `ConnectionRefused` when it
    /// has none, as kube-proxy rejects a Service without endpoints).
    pub(crate) fn service_target(
        &mut self,
        to: SocketAddr,
        proto: Proto,
    ) -> io::Result<SocketAddr> {
        let SocketAddr::V4(v4) = to else {
            return Ok(to);
        };
        // the table as the daemon last sent it (one load when nothing changed)
        self.dev.ep.refresh();
        let Some(s) = self.dev.ep.services().get(*v4.ip(), v4.port(), proto) else {
            return Ok(to);
        };
        // xorshift64: a draw per connection, never the same sequence in two stacks
        self.draw ^= self.draw << 13;
        self.draw ^= self.draw >> 7;
        self.draw ^= self.draw << 17;
        match s.pick(self.dev.ep.ip(), self.draw) {
            Some(b) => Ok(SocketAddr::V4(b)),
            None => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("service {to} ({proto}) has no ready backend"),
            )),
        }
    }
}

pub(crate) struct Shared {
    pub(crate) inner: Mutex<Inner>,
    /// Bumped under the lock by every poll that moved anything; a blocked call waits on it
    /// with the value it saw when it last checked its condition, so a change made by another
    /// thread's poll in between (after the frame that caused it was taken off the ring, so the
    /// rings' words no longer show it) ends its sleep.
    pub(crate) events: Arc<AtomicU32>,
    /// Calls in progress; the engine thread stays away while this is not zero.
    pub(crate) callers: AtomicU32,
    /// The engine sleeps on `callers` until the call in progress ends (it does so only when a
    /// call has lasted longer than its nap, e.g. a server blocked in `accept`).
    pub(crate) engine_parked: AtomicBool,
    /// Calls started so far (wrapping): tells the engine whether the application is active.
    pub(crate) calls: AtomicU32,
    /// The contended yields a blocking call's wait allows before it sleeps, as the calls before
    /// it learned ([`Idler::budget`]): each call's wait is short, the learning is not.
    idle_budget: AtomicU32,
    pub(crate) cfg: StackConfig,
    ip: Ipv4Addr,
    prefix: u8,
    ip6: Option<(Ipv6Addr, u8)>,
    /// Who drives the stack across `fork` ([`crate::fork`]).
    pub(crate) forks: Forks,
    /// This stack itself, for the engine a process starts when it takes the stack at a fork.
    me: Weak<Shared>,
}

/// Rings armed for one sleep: the futex words, and how long the sleep may last.
pub(crate) struct Armed {
    set: SleepSet,
    timeout: Duration,
}

impl Armed {
    /// Sleeps until a producer kicks a ring, the fast channels change, any of `extra` (word,
    /// expected value) changes, or the timeout passes. True when the timeout ended it.
    pub(crate) fn wait(self, extra: &[(&AtomicU32, u32)]) -> bool {
        self.set.wait(extra, self.timeout)
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves smoltcp's state as it was; carry on with it.
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if self.forks.pending() {
            self.settle_cold(&mut g);
        }
        // a step's word holds for the step it follows, under the same lock only
        g.nothing_to_send = false;
        g.was_clean = std::mem::take(&mut g.clean);
        g.polled = false;
        g
    }

    #[cold]
    fn settle_cold(&self, g: &mut Inner) {
        self.settle(g, Why::Section);
    }

    /// Settles who drives the stack after a fork ([`crate::fork`]), under the lock: a process
    /// that takes it starts its engine; one that lost it makes its endpoint inert.
    fn settle(&self, g: &mut Inner, why: Why) {
        match self.forks.settle(why) {
            Settled::Mine => {}
            Settled::Taken => {
                // a buffer lent by a reader of the process that forked is not this one's
                for (_, s) in g.sockets.iter_mut() {
                    if let smoltcp::socket::Socket::Tcp(t) = s {
                        t.drop_direct();
                    }
                }
                g.dev.ep.taken_over();
                self.engine_parked.store(false, Ordering::SeqCst);
                spawn_engine(self.me.clone());
            }
            Settled::Moved => g.dev.ep.set_inert(),
        }
    }

    /// [`Shared::settle`] when a fork is pending, taking the lock for it (one load otherwise).
    #[inline]
    pub(crate) fn settle_pending(&self, why: Why) {
        if self.forks.pending() {
            self.settle_locked(why);
        }
    }

    #[cold]
    fn settle_locked(&self, why: Why) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if self.forks.pending() {
            self.settle(&mut g, why);
        }
    }

    /// Arms the rings' sleep words under the lock. The sleep may last until the stack's next
    /// timer (a TCP timer, or a frame held back by fault injection), `max`, or `deadline`,
    /// whichever is first, and at least 50 us. `None` when work arrived meanwhile (the words
    /// are disarmed again), or while a fork is not settled. Wait outside the lock
    /// ([`Armed::wait`]), then [`Shared::disarm`].
    pub(crate) fn arm(&self, max: Duration, deadline: Option<Instant>) -> Option<Armed> {
        let mut g = self.lock();
        if self.forks.pending() {
            // A fork this process has not settled (the parent's engine between the fork and
            // its claim window's end): a child may be taking the stack over, so the daemon's
            // connection and the rings' words are not this copy's to touch.
            return None;
        }
        // nothing waits for a reply to ride on while this side sleeps
        g.release_delayed_acks();
        // with the tx ring full, smoltcp's "send now" is not a reason to wake: the daemon
        // kicks when it takes frames, and the peer's frames wake the rx side
        let mut t = if g.dev.ep.tx_full() && !g.dev.backlogged() {
            max
        } else {
            g.delay().unwrap_or(max).min(max)
        };
        if let Some(d) = deadline {
            t = t.min(d.saturating_duration_since(Instant::now()));
        }
        let set = g.dev.ep.arm_sleep()?;
        Some(Armed {
            set,
            timeout: t.max(Duration::from_micros(50)),
        })
    }

    /// Ends a sleep armed by [`Shared::arm`] (call once per `Some`); `timed_out`: its timeout
    /// ended it (then the daemon's connection is looked at,
    /// [`crate::raw::Endpoint::after_timeout`]).
    pub(crate) fn disarm(&self, timed_out: bool) {
        let mut g = self.lock();
        if self.forks.pending() {
            // Asleep across a fork not settled yet (a parent's engine woken by a kick meant for
            // the child): the daemon's connection is the family's, one file description, and a
            // message read here is lost to a child that takes the stack (a new fast channel it
            // would never read); the words may be the child's, armed for its own sleep.
            g.dev.ep.leave_sleep();
        } else {
            g.dev.ep.disarm_sleep();
            if timed_out {
                g.dev.ep.after_timeout();
            }
        }
    }

    /// One sleep on the rings (and on `extra` words): arm, wait, disarm.
    pub(crate) fn sleep(
        &self,
        max: Duration,
        deadline: Option<Instant>,
        extra: &[(&AtomicU32, u32)],
    ) {
        if self.forks.moved() {
            // nothing can arrive here any more: sleep instead of spinning on a dead stack
            let t = deadline.map_or(max, |d| d.saturating_duration_since(Instant::now()));
            let _ = docknet_pipe::wake::wait_any(&[], Some(t.min(max)));
            return;
        }
        if let Some(armed) = self.arm(max, deadline) {
            let timed_out = armed.wait(extra);
            self.disarm(timed_out);
        }
    }
}

/// A userspace TCP/IP stack over one DockPipe. Cheap to clone (shared).
#[derive(Clone)]
pub struct Stack {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("ip", &self.shared.ip)
            .finish()
    }
}

/// The longest a blocked call sleeps before it polls again on its own.
const CALL_SLEEP_MAX: Duration = Duration::from_secs(1);

/// Holds `callers` up while a call runs. On the way out it wakes the engine only if the engine
/// sleeps on `callers` (after a long call), so a busy ping-pong pays no syscall for it.
pub(crate) struct CallGuard<'a>(&'a Shared);

impl<'a> CallGuard<'a> {
    pub(crate) fn new(s: &'a Shared) -> CallGuard<'a> {
        // the first call after a fork settles who drives the stack (one load otherwise)
        s.settle_pending(Why::Call);
        s.callers.fetch_add(1, Ordering::AcqRel);
        s.calls.fetch_add(1, Ordering::Relaxed);
        CallGuard(s)
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        // SYNC: SeqCst pairs with the engine's SeqCst store of `engine_parked` and load of
        // `callers`: either it sees this decrement and does not sleep, or we see it parked
        // (and a wake that finds nobody asleep is harmless).
        if self.0.callers.fetch_sub(1, Ordering::SeqCst) == 1
            && self.0.engine_parked.load(Ordering::SeqCst)
        {
            docknet_pipe::wake::wake_private(&self.0.callers);
        }
    }
}

pub(crate) fn to_ip(a: impl Into<IpAddr>) -> IpAddress {
    match a.into() {
        IpAddr::V4(a) => IpAddress::Ipv4(Ipv4Address::from_octets(a.octets())),
        IpAddr::V6(a) => IpAddress::Ipv6(Ipv6Address::from_octets(a.octets())),
    }
}

pub(crate) fn from_ep(e: IpEndpoint) -> SocketAddr {
    match e.addr {
        IpAddress::Ipv4(a) => SocketAddr::new(IpAddr::V4(Ipv4Addr::from(a.octets())), e.port),
        IpAddress::Ipv6(a) => SocketAddr::new(IpAddr::V6(Ipv6Addr::from(a.octets())), e.port),
    }
}

/// The error for a call that ran out of time: says so plainly, unless the reason is that the
/// daemon removed the pipe or is not running (no heartbeat for 2 s).
fn timed_out(ep: &Endpoint) -> io::Error {
    if ep.is_closed() {
        return io::Error::new(
            io::ErrorKind::NotConnected,
            "the pipe was removed by the docknet daemon",
        );
    }
    match ep.daemon_silence() {
        Some(s) if s > Duration::from_secs(2) => io::Error::new(
            io::ErrorKind::NotConnected,
            format!(
                "the docknet daemon is gone (no heartbeat for {} s)",
                s.as_secs()
            ),
        ),
        _ => io::Error::new(io::ErrorKind::TimedOut, "timed out"),
    }
}

/// The error of a call on a stack that moved to another process at a fork.
fn moved_error(f: &Forks) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        match f.owner() {
            Some(p) => format!("the DockNet stack moved to process {p} at a fork"),
            None => "the DockNet stack moved to another process at a fork".into(),
        },
    )
}

/// The interface's default route: through `gw` when the daemon drives a link (addresses beyond
/// the pipe's network are reached through it; the daemon answers ARP for the gateway with the
/// link's MAC), none otherwise.
fn set_gateway(iface: &mut Interface, gw: Option<Ipv4Addr>) {
    let routes = iface.routes_mut();
    match gw {
        Some(gw) => {
            let _ = routes.add_default_ipv4_route(gw);
        }
        None => {
            routes.remove_default_ipv4_route();
        }
    }
}

/// Starts a stack's engine thread. The engine must take none of the program's signals: a
/// process-directed signal may go to any thread that does not block it, and a handler run on
/// the engine would not interrupt the thread that waits for it (nginx, told to stop, slept on
/// in epoll_wait). A thread inherits its creator's mask: all blocked while it is made.
fn spawn_engine(weak: Weak<Shared>) {
    let old = nix::sys::signal::SigSet::all()
        .thread_swap_mask(nix::sys::signal::SigmaskHow::SIG_SETMASK)
        .ok();
    let spawned = std::thread::Builder::new()
        .name("docklib-engine".into())
        .spawn(move || crate::engine::engine(weak));
    if let Some(old) = old {
        let _ = old.thread_set_mask();
    }
    spawned.expect("spawning the DockLib engine thread");
}

impl Stack {
    /// Attaches to the pipe at `$DOCKNET_PIPE` or `/run/docknet/pipe` and starts the engine.
    pub fn attach_default(cfg: StackConfig) -> Result<Stack, AttachError> {
        Ok(Stack::new(Endpoint::attach_default(cfg.idle)?, cfg))
    }

    /// Builds a stack over `ep` and starts its engine thread.
    pub fn new(ep: Endpoint, cfg: StackConfig) -> Stack {
        let ip = ep.ip();
        let prefix = ep.prefix().min(32) as u8;
        let ip6 = ep.ip6();
        let mac = ep.mac();
        let gateway = ep.gateway();
        let mut dev = PipeDevice::new(ep, cfg.checksums);
        if let Some(f) = cfg.faults {
            dev.set_faults(f);
        }
        let epoch = Instant::now();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
        // pids repeat from one container to the next (each has its own pid namespace): mix
        // in the wall clock, so a restarted program neither starts with the same sequence
        // numbers nor reuses the source ports its previous run left behind
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let seed = (u64::from(std::process::id()) << 32 ^ wall ^ 0x9e37_79b9_7f4a_7c15)
            .wrapping_mul(0x2545_f491_4f6c_dd1d);
        config.random_seed = seed;
        let mut iface = Interface::new(config, &mut dev, smoltcp::time::Instant::from_micros(0));
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(to_ip(ip), prefix));
            // dual stack: the pipe's IPv6 address and its link-local address
            if let Some((ip6, prefix6)) = ip6 {
                let _ = a.push(IpCidr::new(to_ip(ip6), prefix6));
                let ll = docknet_pipe::delivery::link_local(mac);
                let _ = a.push(IpCidr::new(to_ip(ll), 64));
            }
        });
        set_gateway(&mut iface, gateway);
        let events = Arc::new(AtomicU32::new(0));
        let shared = Arc::new_cyclic(|me| Shared {
            events: events.clone(),
            inner: Mutex::new(Inner {
                iface,
                sockets: {
                    let mut s = SocketSet::new(Vec::new());
                    s.set_egress_scope(Some(smol(SWEEP)));
                    s.set_tcp_lookup(true);
                    s
                },
                dev,
                epoch,
                port_seed: seed >> 40,
                draw: seed | 1,
                events: events.clone(),
                closing: Vec::new(),
                listeners: Vec::new(),
                cfg: cfg.clone(),
                nothing_to_send: false,
                wrote: None,
                answering: smallvec::SmallVec::new(),
                clean: false,
                was_clean: false,
                polled: false,
                gateway,
                changes: Default::default(),
            }),
            callers: AtomicU32::new(0),
            idle_budget: AtomicU32::new(docknet_pipe::wake::MAX_CONTENDED_YIELDS),
            engine_parked: AtomicBool::new(false),
            calls: AtomicU32::new(0),
            cfg,
            ip,
            prefix,
            ip6,
            forks: Forks::new(),
            me: me.clone(),
        });
        spawn_engine(Arc::downgrade(&shared));
        Stack { shared }
    }

    /// How many sockets the stack holds: connections, listeners' pools of listening sockets,
    /// and connections closed by the program that are still closing.
    pub fn sockets(&self) -> usize {
        self.lock().sockets.iter().count()
    }

    /// Whether `other` is this stack (a clone of it).
    pub fn same(&self, other: &Stack) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// This stack's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.shared.ip
    }

    /// The prefix length of the pipe's network (`ip()/prefix()`).
    pub fn prefix(&self) -> u8 {
        self.shared.prefix
    }

    /// The gateway the daemon gave the pipe when it drives a link: addresses beyond the pipe's
    /// network are reached through it. `None`: the pipe reaches its own network only.
    pub fn gateway(&self) -> Option<Ipv4Addr> {
        self.lock().dev.ep.gateway()
    }

    /// Whether `a` lies in the pipe's network.
    pub fn on_link(&self, a: Ipv4Addr) -> bool {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.shared.prefix))
            .unwrap_or(0);
        u32::from(a) & mask == u32::from(self.shared.ip) & mask
    }

    /// This stack's IPv6 address and its prefix length, when the pipe has one (dual stack).
    /// Its link-local address is [`docknet_pipe::delivery::link_local`] of its MAC.
    pub fn ip6(&self) -> Option<(Ipv6Addr, u8)> {
        self.shared.ip6
    }

    /// Whether the IPv6 address `a` lies in the pipe's IPv6 network or is link-local (false
    /// without IPv6).
    pub fn on_link6(&self, a: Ipv6Addr) -> bool {
        let Some((me, prefix)) = self.shared.ip6 else {
            return false;
        };
        if a.segments()[0] & 0xffc0 == 0xfe80 {
            return true;
        }
        let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
        u128::from(a) & mask == u128::from(me) & mask
    }

    /// Whether `a` is the address of a service the daemon announced: connects to it go to
    /// one of the service's backends.
    pub fn is_service(&self, a: Ipv4Addr) -> bool {
        let mut g = self.lock();
        // the table as the daemon last sent it (one load when nothing changed)
        g.dev.ep.refresh();
        g.dev.ep.services().has_address(a)
    }

    /// Device counters.
    pub fn device_stats(&self) -> DeviceStats {
        self.lock().dev.stats
    }

    /// The endpoint's counters (frames by path, refused descriptors, lost notifications);
    /// `None` when the stack is busy right now (it waits for no lock: callable at exit).
    pub fn endpoint_stats(&self) -> Option<crate::raw::EndpointStats> {
        match self.shared.inner.try_lock() {
            Ok(g) => Some(g.dev.ep.stats()),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner().dev.ep.stats()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.lock()
    }

    /// Polls the stack once, as a call of the application (after a fork, it settles who
    /// drives the stack as any call does): what the rings hold is taken in, what waits to be
    /// sent leaves. An event loop's look that found nothing ready makes one.
    pub fn poll_now(&self) {
        let _call = CallGuard::new(&self.shared);
        if self.shared.forks.moved() {
            return;
        }
        self.lock().poll();
    }

    /// Runs `f` once as a call, and once more after a poll if it had nothing: `WouldBlock`
    /// when it still has nothing (the non-blocking calls). `transmit`: poll once more after a
    /// success so what `f` queued leaves now (writes); a read leaves its window update to the
    /// next poll, which an event loop makes soon anyway (one poll fewer per request).
    pub(crate) fn try_now<T>(
        &self,
        transmit: bool,
        mut f: impl FnMut(&mut Inner) -> Option<io::Result<T>>,
    ) -> io::Result<T> {
        let _call = CallGuard::new(&self.shared);
        let mut g = self.lock();
        if let Some(r) = f(&mut g) {
            if transmit {
                g.poll_after_step();
            }
            return r;
        }
        g.poll();
        if let Some(r) = f(&mut g) {
            if transmit {
                g.poll_after_step();
            } else {
                g.clean = false; // the step may have queued something for the next poll
            }
            return r;
        }
        Err(io::Error::from(io::ErrorKind::WouldBlock))
    }

    /// Polls until `f` returns `Some`, or `timeout` passes.
    pub(crate) fn block_on<T>(
        &self,
        timeout: Option<Duration>,
        f: impl FnMut(&mut Inner) -> Option<io::Result<T>>,
    ) -> io::Result<T> {
        self.block_on_woken(timeout, &[], None, f)
    }

    /// [`Stack::block_on`] that also ends, failing with `Interrupted`, when a word of `woken`
    /// no longer holds its value.
    pub(crate) fn block_on_woken<T>(
        &self,
        timeout: Option<Duration>,
        woken: &[(&AtomicU32, u32)],
        policy: Option<IdlePolicy>,
        mut f: impl FnMut(&mut Inner) -> Option<io::Result<T>>,
    ) -> io::Result<T> {
        let _call = CallGuard::new(&self.shared);
        if self.shared.forks.moved() {
            return Err(moved_error(&self.shared.forks));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        // Try first: often the data or the buffer space is already there, and one poll
        // (to transmit) is all the call needs.
        let mut polled = {
            let mut g = self.lock();
            if let Some(r) = f(&mut g) {
                g.poll_after_step();
                return r;
            }
            g.was_clean
        };
        let budget = &self.shared.idle_budget;
        let mut idler = Idler::with_budget(
            policy.unwrap_or(self.shared.cfg.idle),
            budget.load(Ordering::Relaxed),
        );
        let r = loop {
            // the events word as of the last check of `f` (read under the lock: polls bump it
            // under the lock)
            let seen;
            {
                let mut g = self.lock();
                // the first poll is skipped when the last one, just before, left nothing
                let moved = !std::mem::take(&mut polled) && g.poll();
                if let Some(r) = f(&mut g) {
                    g.poll_after_step();
                    // what the wait was for came: whether yielding paid is learned here too
                    idler.busy();
                    break r;
                }
                if moved {
                    idler.busy();
                    continue;
                }
                seen = self.shared.events.load(Ordering::Acquire);
            }
            if woken.iter().any(|(w, v)| w.load(Ordering::Acquire) != *v) {
                break Err(io::Error::from(io::ErrorKind::Interrupted));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break Err(timed_out(&self.lock().dev.ep));
            }
            if !idler.step() {
                continue;
            }
            // the sleep ends early for a frame, a kick, a channel change, the waker, another
            // thread's poll that changed something, or the stack's next timer; the cap only
            // bounds how long a lost wake-up could cost
            let mut words: smallvec::SmallVec<[(&AtomicU32, u32); 4]> = woken.into();
            words.push((&self.shared.events, seen));
            self.shared.sleep(CALL_SLEEP_MAX, deadline, &words);
        };
        budget.store(idler.budget(), Ordering::Relaxed);
        r
    }

    /// The stack's configuration.
    pub fn config(&self) -> &StackConfig {
        &self.shared.cfg
    }

    /// Runs `f` on the stack's state as one call (the engine stays out of the way).
    pub(crate) fn with_inner<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let _call = CallGuard::new(&self.shared);
        let mut g = self.lock();
        let r = f(&mut g);
        g.clean = false;
        r
    }

    /// Sleeps once on the rings (armed under the lock, waited on outside it), at most `max`.
    pub(crate) fn sleep_once(&self, max: Duration) {
        self.shared.sleep(max, None, &[]);
    }
}
