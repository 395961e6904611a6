//! Which connections may have changed: what lets an event loop over many connections look
//! only at those (an `epoll_wait` in O(ready) rather than O(members)).
//!
//! smoltcp's socket set (patched: `SocketSet::set_change_log`) lists the sockets that were
//! reached mutably, took in a segment, or had their TCP state changed by a timer; a socket
//! not in the list has the state it had when the list was last taken, so what it is ready for
//! is unchanged too. The stack moves that list into a log here with sequence numbers, so any
//! number of readers (each epoll instance) read it from where they left off. The log is
//! bounded: a reader that fell behind further than it holds, or one reading for the first
//! time, is told to look at every socket.

use crate::stack::Stack;
use crate::tcp::TcpStream;
use crate::{Waited, Waker};
use smoltcp::iface::{SocketHandle, SocketSet};
use std::collections::VecDeque;
use std::io;
use std::time::Duration;

/// At most this many changes are kept for readers that have not read them.
const KEEP: usize = 4096;

/// Names a connection in the change log ([`TcpStream::key`]): unique among the stack's live
/// sockets (a key may come back for a later socket after this one is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketKey(SocketHandle);

/// The stack's change log.
#[derive(Debug)]
pub(crate) struct ChangeLog {
    /// Whether smoltcp keeps its list (from the first reader on: a program without readers
    /// pays nothing).
    on: bool,
    /// The sequence number of `keys[0]` (numbers start at 1: a reader at 0 never read).
    base: u64,
    /// What changed; `None` marks where changes were lost.
    keys: VecDeque<Option<SocketHandle>>,
    /// The end of the log when changes were last lost: a reader from before looks at all.
    lost_at: u64,
}

impl Default for ChangeLog {
    fn default() -> ChangeLog {
        ChangeLog {
            on: false,
            base: 1,
            keys: VecDeque::new(),
            lost_at: 0,
        }
    }
}

impl ChangeLog {
    /// The sequence number the next change gets.
    fn end(&self) -> u64 {
        self.base + self.keys.len() as u64
    }

    /// Moves smoltcp's list into the log (turning the list on at the first call).
    pub(crate) fn take(&mut self, sockets: &mut SocketSet<'static>) {
        if !self.on {
            self.on = true;
            sockets.set_change_log(true);
            self.lost_at = self.end();
        }
        let keys = &mut self.keys;
        let whole = sockets.take_changes(|h| keys.push_back(Some(h)));
        if !whole {
            // an entry of its own, so the log's end moves even when none of what smoltcp
            // kept is left: a reader from before it looks at everything
            self.keys.push_back(None);
            self.lost_at = self.end();
        }
        while self.keys.len() > KEEP {
            self.keys.pop_front();
            self.base += 1;
        }
    }

    /// Reads the log from `cursor` (see [`Stack::changes`]).
    fn read(&self, cursor: &mut u64, mut f: impl FnMut(SocketKey)) -> bool {
        let whole = *cursor != 0 && *cursor >= self.lost_at.max(self.base);
        if whole {
            let from = (*cursor - self.base) as usize;
            for h in self.keys.range(from.min(self.keys.len())..).flatten() {
                f(SocketKey(*h));
            }
        }
        *cursor = self.end();
        whole
    }
}

impl TcpStream {
    /// How the change log names this connection ([`Stack::changes`]).
    pub fn key(&self) -> SocketKey {
        SocketKey(self.handle())
    }
}

impl Stack {
    /// The connections that may have changed since `cursor` (0 for a reader that never
    /// read): `f` gets each one's key ([`TcpStream::key`]; a key may come more than once, or
    /// name a socket the reader does not hold), and `cursor` moves to the end of the log.
    /// Returns false when the reader must look at every socket instead: its first read, or
    /// changes it did not read were dropped (the log keeps a few thousand). Only connections
    /// have keys: a listener (whose connections wait in sockets of its own) and a UDP socket
    /// are to be looked at every time, and the log moving says that they may have changed.
    pub fn changes(&self, cursor: &mut u64, f: impl FnMut(SocketKey)) -> bool {
        let mut g = self.lock();
        let g = &mut *g;
        g.changes.take(&mut g.sockets);
        g.changes.read(cursor, f)
    }

    /// Waits until the change log moves past `cursor` (a connection may have changed), the
    /// timeout passes, or one of `wakers` is woken after its token was read; polls the stack
    /// first and while it waits, with the stack's idle policy, as [`Stack::wait_wakeable`]
    /// does.
    pub fn wait_changes(
        &self,
        cursor: u64,
        timeout: Option<Duration>,
        wakers: &[(&Waker, u32)],
    ) -> io::Result<Waited> {
        self.wait_for(timeout, wakers, None, |g| {
            g.changes.take(&mut g.sockets);
            g.changes.end() > cursor
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(log: &ChangeLog, cursor: &mut u64) -> (bool, Vec<SocketKey>) {
        let mut v = Vec::new();
        let whole = log.read(cursor, |k| v.push(k));
        (whole, v)
    }

    fn log_of(keys: &[usize]) -> ChangeLog {
        let mut set = SocketSet::new(Vec::new());
        let mut log = ChangeLog::default();
        log.take(&mut set);
        for _ in 0..keys.iter().max().map_or(0, |m| m + 1) {
            set.add(smoltcp::socket::udp::Socket::new(
                smoltcp::socket::udp::PacketBuffer::new(vec![], vec![]),
                smoltcp::socket::udp::PacketBuffer::new(vec![], vec![]),
            ));
        }
        set.take_changes(|_| {});
        for &k in keys {
            let h = set.iter().nth(k).unwrap().0;
            let _ = set.get_mut::<smoltcp::socket::udp::Socket>(h);
            log.take(&mut set);
        }
        log
    }

    #[test]
    fn a_first_read_looks_at_everything_and_later_reads_at_what_changed() {
        let log = log_of(&[1, 0, 1]);
        let mut c = 0;
        assert!(!read(&log, &mut c).0, "a reader that never read");
        let (whole, keys) = read(&log, &mut c);
        assert!(whole);
        assert!(keys.is_empty(), "nothing since");
        let mut c = 2;
        let (whole, keys) = read(&log, &mut c);
        assert!(whole);
        assert_eq!(keys.len(), 2, "the last two changes");
        assert_eq!(c, 4);
    }

    #[test]
    fn a_reader_that_fell_behind_the_log_looks_at_everything() {
        let keys: Vec<usize> = (0..KEEP + 10).map(|i| i % 2).collect();
        let log = log_of(&keys);
        let mut c = 1;
        assert!(!read(&log, &mut c).0, "its changes were dropped");
        let mut c = log.end() - 3;
        let (whole, got) = read(&log, &mut c);
        assert!(whole);
        assert_eq!(got.len(), 3);
    }
}
