//! Waiting on many sockets at once: the event loop's side of DockLib.
//!
//! A server with many connections in one thread (an HTTP server, a load generator) asks
//! [`Stack::wait`] which of its sockets are ready, then reads, writes and accepts with the
//! non-blocking calls ([`TcpStream::try_read`], [`TcpStream::try_write`],
//! [`TcpListener::try_accept`], [`TcpStream::connect_start`]). Readiness is level-triggered,
//! like `poll(2)`: a socket is reported for as long as it is ready. The wait polls the stack
//! itself (run to completion, as a blocking call does) and sleeps on the rings between polls,
//! so one thread serves every connection of the stack without a hand-off.
//!
//! Cost: each check looks at every watched socket (smoltcp's socket set is scanned the same
//! way), which is fine for the hundreds of connections a container holds.

use crate::stack::Stack;
use crate::tcp::{TcpListener, TcpStream};
use crate::udp::UdpSocket;
use docknet_pipe::IdlePolicy;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Wakes a [`Stack::wait_wakeable`] from another thread (or from a signal handler: waking is
/// one atomic add and one futex wake, both async-signal-safe).
///
/// A waiter reads [`Waker::token`] before it decides to wait and passes it in; a
/// [`Waker::wake`] after that read ends the wait (or keeps it from starting), so no wake-up is
/// lost between the decision and the sleep. It wakes threads of its own process only (its word
/// is a private futex): a `Waker` in memory shared with another process does not reach it.
#[derive(Debug, Default)]
pub struct Waker {
    word: AtomicU32,
}

impl Waker {
    /// A waker nobody has woken yet.
    pub const fn new() -> Waker {
        Waker {
            word: AtomicU32::new(0),
        }
    }

    /// The current token: a wait given it ends at the next [`Waker::wake`].
    pub fn token(&self) -> u32 {
        self.word.load(Ordering::Acquire)
    }

    /// Ends every wait given a token older than this call.
    pub fn wake(&self) {
        self.word.fetch_add(1, Ordering::AcqRel);
        // (the word is this process's own memory: waited on and woken as private)
        docknet_pipe::wake::wake_private(&self.word);
    }

    /// Sleeps (outside any stack) until woken after `token` was read, or `timeout` passes.
    pub fn wait(&self, token: u32, timeout: Option<Duration>) {
        let _ = docknet_pipe::wake::wait_mixed(&[], &[(&self.word, token)], timeout);
    }

    /// Sleeps (outside any stack) until woken after `token` was read, or until a signal's
    /// handler interrupts the sleep (then `false`), as `pause(2)` would end.
    pub fn wait_or_signal(&self, token: u32) -> bool {
        docknet_pipe::wake::wait_private_or_signal(&self.word, token).is_ok()
    }
}

/// How a [`Stack::wait_wakeable`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Sockets are ready (in `out`).
    Ready,
    /// The time ran out.
    TimedOut,
    /// The waker was woken.
    Woken,
}

/// What a watched socket should be reported for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    /// Data (or end of stream, or an error) to read; for a listener, a connection to accept.
    pub read: bool,
    /// Room to write (or an error).
    pub write: bool,
}

impl Interest {
    /// Reading only.
    pub const READ: Interest = Interest {
        read: true,
        write: false,
    };
    /// Writing only.
    pub const WRITE: Interest = Interest {
        read: false,
        write: true,
    };
    /// Both.
    pub const BOTH: Interest = Interest {
        read: true,
        write: true,
    };
}

/// What a socket is ready for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ready {
    /// A read would not wait (data, end of stream or an error); a listener has a connection.
    pub read: bool,
    /// A write would not wait (room, or an error).
    pub write: bool,
    /// The peer will send nothing more (end of stream, or the connection is gone).
    pub hup: bool,
    /// The connection was refused or reset.
    pub error: bool,
}

impl Ready {
    fn any(self, i: Interest) -> bool {
        (i.read && self.read) || (i.write && self.write) || self.error
    }
}

/// A socket to watch, and for what.
#[derive(Debug, Clone, Copy)]
pub enum Watch<'a> {
    /// A TCP connection (or one being connected).
    Stream(&'a TcpStream, Interest),
    /// A listener: ready to read when a connection can be accepted.
    Listener(&'a TcpListener),
    /// A UDP socket.
    Udp(&'a UdpSocket, Interest),
}

impl Stack {
    /// Waits until at least one of `watches` is ready for what it is watched for, or `timeout`
    /// passes (`None`: no limit), and puts `(index in watches, what is ready)` into `out`
    /// (cleared first; empty after a timeout). Sockets of other stacks are never ready.
    /// The wait polls the stack first, so what deferred writes queued leaves now.
    /// Fails only when the pipe is gone (removed, or the daemon silent for 2 s).
    pub fn wait(
        &self,
        watches: &[Watch<'_>],
        timeout: Option<Duration>,
        out: &mut Vec<(usize, Ready)>,
    ) -> io::Result<()> {
        self.wait_woken(watches, timeout, &[], None, out)
            .map(|_| ())
    }

    /// [`Stack::wait`] that also ends when one of `wakers` is woken after its token was read
    /// ([`Waker::token`]): how a thread that waits for sockets is told that something else
    /// (a signal, a change of what to watch) needs it.
    pub fn wait_wakeable(
        &self,
        watches: &[Watch<'_>],
        timeout: Option<Duration>,
        wakers: &[(&Waker, u32)],
        out: &mut Vec<(usize, Ready)>,
    ) -> io::Result<Waited> {
        self.wait_woken(watches, timeout, wakers, None, out)
    }

    /// [`Stack::wait_wakeable`] that sleeps as soon as nothing is ready, whatever the stack's
    /// idle policy: for a helper thread that only hands readiness on to another thread (the
    /// preload library's notifier and relay), whose spinning or yielding would take a core
    /// from the threads it serves.
    pub fn wait_wakeable_blocking(
        &self,
        watches: &[Watch<'_>],
        timeout: Option<Duration>,
        wakers: &[(&Waker, u32)],
        out: &mut Vec<(usize, Ready)>,
    ) -> io::Result<Waited> {
        self.wait_woken(watches, timeout, wakers, Some(IdlePolicy::Block), out)
    }

    fn wait_woken(
        &self,
        watches: &[Watch<'_>],
        timeout: Option<Duration>,
        wakers: &[(&Waker, u32)],
        policy: Option<IdlePolicy>,
        out: &mut Vec<(usize, Ready)>,
    ) -> io::Result<Waited> {
        out.clear();
        self.wait_for(timeout, wakers, policy, |g| {
            collect(self, g, watches, out);
            !out.is_empty()
        })
    }

    /// What `watches` are ready for now, from the sockets' state alone, into `out` (cleared
    /// first): no poll of the interface, so frames still in the rings are not seen. A busy
    /// event loop looks here first and waits ([`Stack::wait`]) only when nothing is ready,
    /// saving the poll of every socket that a zero-timeout wait makes.
    pub fn ready_now(&self, watches: &[Watch<'_>], out: &mut Vec<(usize, Ready)>) {
        out.clear();
        self.ready_now_into(watches, out);
    }

    /// [`Stack::ready_now`] appending to any collection (nothing cleared): a `SmallVec` on the
    /// caller's stack makes a look that allocates nothing, as a `poll` or `select` of a few
    /// sockets wants on every call.
    pub fn ready_now_into(&self, watches: &[Watch<'_>], out: &mut impl Extend<(usize, Ready)>) {
        collect(self, &mut self.lock(), watches, out);
    }

    /// Polls the stack, then waits until `ready` (asked under the stack's lock after each
    /// poll) says so, `timeout` passes, or one of `wakers` is woken after its token was read:
    /// every wait of an event loop ([`Stack::wait_wakeable`], [`Stack::wait_changes`]).
    pub(crate) fn wait_for(
        &self,
        timeout: Option<Duration>,
        wakers: &[(&Waker, u32)],
        policy: Option<IdlePolicy>,
        mut ready: impl FnMut(&mut crate::stack::Inner) -> bool,
    ) -> io::Result<Waited> {
        // (on the stack for the usual one or two wakers: a wait allocates nothing)
        let words = waker_words(wakers);
        // the first poll also sends what try_write_deferred left for it
        self.lock().poll();
        let r = self.block_on_woken(timeout, &words, policy, |g| ready(g).then_some(Ok(())));
        match r {
            Ok(()) => Ok(Waited::Ready),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(Waited::TimedOut),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Waited::Woken),
            Err(e) => Err(e),
        }
    }
}

/// The words behind `wakers` with the tokens read of them, as [`Stack::block_on_woken`]
/// takes them (on the stack for the usual one or two: a wait allocates nothing).
pub(crate) fn waker_words<'w>(
    wakers: &[(&'w Waker, u32)],
) -> smallvec::SmallVec<[(&'w AtomicU32, u32); 2]> {
    wakers.iter().map(|(w, t)| (&w.word, *t)).collect()
}

/// The ready ones of `watches` (`g`: the stack, locked) into `out`.
fn collect(
    stack: &Stack,
    g: &mut crate::stack::Inner,
    watches: &[Watch<'_>],
    out: &mut impl Extend<(usize, Ready)>,
) {
    for (i, w) in watches.iter().enumerate() {
        let (ready, interest) = match w {
            Watch::Stream(s, int) if s.stack_is(stack) => (s.readiness(g), *int),
            Watch::Listener(l) if l.stack_is(stack) => (
                Ready {
                    read: l.acceptable(g),
                    ..Ready::default()
                },
                Interest::READ,
            ),
            Watch::Udp(u, int) if u.stack_is(stack) => (u.readiness(g), *int),
            _ => continue,
        };
        if ready.any(interest) {
            out.extend([(i, ready)]);
        }
    }
}
