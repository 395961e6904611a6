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
use std::io;
use std::time::Duration;

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
        out.clear();
        self.lock().poll();
        let r = self.block_on(timeout, |g| {
            for (i, w) in watches.iter().enumerate() {
                let (ready, interest) = match w {
                    Watch::Stream(s, int) if s.stack_is(self) => (s.readiness(g), *int),
                    Watch::Listener(l) if l.stack_is(self) => (
                        Ready {
                            read: l.acceptable(g),
                            ..Ready::default()
                        },
                        Interest::READ,
                    ),
                    Watch::Udp(u, int) if u.stack_is(self) => (u.readiness(g), *int),
                    _ => continue,
                };
                if ready.any(interest) {
                    out.push((i, ready));
                }
            }
            (!out.is_empty()).then_some(Ok(()))
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(()),
            r => r,
        }
    }
}
