//! The members of an epoll instance that are DockNet's, and what the instance knows of
//! them: which to look at when it is waited on.
//!
//! A member whose connection did not change since the last look is ready for what it was
//! ready for then. So a wait looks only at the members the stack's change log names
//! ([`Stack::changes`]: reached by a call, a segment in, a timer), the level-triggered ones
//! ready at the last look (reported again while ready; an edge-triggered one is reported
//! again only after a call on its side, and a read, a write or a shutdown reaches its
//! socket, which the log then names; a call that fails before it does, a send after
//! shutdown, changes nothing Linux would report either), those added or modified since, and those the log cannot name (listeners, UDP
//! sockets, sockets not yet on DockNet): an `epoll_wait` costs O(ready), not O(members). A
//! first look and a log the set fell behind look at every member once.

use crate::event::check_now;
use crate::sock::{Conn, Sock};
use docknet_lib::{SocketKey, Stack};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// One DockNet member of an epoll set.
#[derive(Debug, Clone)]
pub struct Member {
    /// Its descriptor.
    pub fd: i32,
    /// Its socket's id (the descriptor may be closed and reused).
    pub id: u64,
    /// The socket.
    pub sock: Weak<Sock>,
    /// EPOLLIN | EPOLLET | ...
    pub events: u32,
    /// The user's data.
    pub data: u64,
    /// `rd_gen` / `wr_gen` of the socket at the last edge-triggered report.
    pub seen: (u32, u32),
    /// One-shot and already reported.
    pub disabled: bool,
    /// In [`Members::look`].
    queued: bool,
    /// Its connection's name in the stack's change log, once it is a connection on DockNet.
    key: Option<SocketKey>,
}

impl Member {
    pub(crate) fn new(fd: i32, s: &Arc<Sock>, events: u32, data: u64) -> Member {
        Member {
            fd,
            id: s.id,
            sock: Arc::downgrade(s),
            events,
            data,
            seen: (u32::MAX, u32::MAX),
            disabled: false,
            queued: false,
            key: key_of(s),
        }
    }

    pub(crate) fn et(&self) -> bool {
        self.events & libc::EPOLLET as u32 != 0
    }

    /// Whether the member's socket is still open (a descriptor refers to it).
    pub(crate) fn live(&self) -> bool {
        self.sock.upgrade().is_some_and(|s| s.open())
    }

    /// Which of read (0) and write (1) may still be reported edge-triggered, given the
    /// socket's call counters now.
    pub fn edge_ok(&self, gens: (u32, u32)) -> (bool, bool) {
        if !self.et() {
            return (true, true);
        }
        (gens.0 != self.seen.0, gens.1 != self.seen.1)
    }

    /// The events to report for `bits` (what the socket is ready for), updating the
    /// edge-triggered and one-shot state. 0: nothing.
    pub fn report(&mut self, bits: u32, gens: (u32, u32)) -> u32 {
        if self.disabled {
            return 0;
        }
        let mut ev = bits & (self.events | ALWAYS);
        let (r_ok, w_ok) = self.edge_ok(gens);
        if !r_ok {
            ev &= !(RD | ALWAYS);
        }
        if !w_ok {
            ev &= !WR;
        }
        if ev == 0 {
            return 0;
        }
        if self.et() {
            if ev & (RD | ALWAYS) != 0 {
                self.seen.0 = gens.0;
            }
            if ev & WR != 0 {
                self.seen.1 = gens.1;
            }
        }
        if self.events & libc::EPOLLONESHOT as u32 != 0 {
            self.disabled = true;
        }
        ev
    }
}

/// The key of `s`'s connection, if it is one on DockNet.
fn key_of(s: &Sock) -> Option<SocketKey> {
    match s.conn.get()? {
        Conn::Stream(t) => Some(t.key()),
        _ => None,
    }
}

/// Read-side and write-side poll bits.
const RD: u32 = (libc::EPOLLIN | libc::EPOLLRDNORM | libc::EPOLLRDHUP | libc::EPOLLPRI) as u32;
const WR: u32 = (libc::EPOLLOUT | libc::EPOLLWRNORM) as u32;
/// Reported whatever was asked.
const ALWAYS: u32 = (libc::EPOLLERR | libc::EPOLLHUP) as u32;

/// An epoll instance's DockNet members (and sockets not yet decided, mirrored while the
/// kernel's epoll holds them).
#[derive(Debug, Default)]
pub struct Members {
    list: Vec<Member>,
    /// Where the set last read the stack's change log (0: never).
    cursor: u64,
    /// Members that are connections on DockNet, by key (a connection's descriptor and its
    /// `dup` are two members with one key).
    by_key: HashMap<SocketKey, smallvec::SmallVec<[usize; 1]>>,
    /// Members the next look takes whatever the log says: not named by the log, ready at
    /// the last look (level-triggered), added or modified since.
    look: Vec<usize>,
}

impl std::ops::Deref for Members {
    type Target = [Member];
    fn deref(&self) -> &[Member] {
        &self.list
    }
}

impl Members {
    fn queue(&mut self, i: usize) {
        if !self.list[i].queued {
            self.list[i].queued = true;
            self.look.push(i);
        }
    }

    fn index(&mut self, k: SocketKey, i: usize) {
        self.by_key.entry(k).or_default().push(i);
    }

    fn unindex(&mut self, k: SocketKey, i: usize) {
        if let Some(v) = self.by_key.get_mut(&k) {
            v.retain(|x| *x != i);
            if v.is_empty() {
                self.by_key.remove(&k);
            }
        }
    }

    /// Adds a member (to be looked at).
    pub fn push(&mut self, m: Member) {
        let i = self.list.len();
        if let Some(k) = m.key {
            self.index(k, i);
        }
        self.list.push(m);
        self.queue(i);
    }

    /// Replaces member `i` (`EPOLL_CTL_MOD`; to be looked at).
    pub fn replace(&mut self, i: usize, m: Member) {
        let queued = self.list[i].queued;
        if let Some(k) = self.list[i].key.take() {
            self.unindex(k, i);
        }
        if let Some(k) = m.key {
            self.index(k, i);
        }
        self.list[i] = Member { queued, ..m };
        self.queue(i);
    }

    /// Removes member `i` (the last member takes its place).
    pub fn remove(&mut self, i: usize) {
        if let Some(k) = self.list[i].key {
            self.unindex(k, i);
        }
        if self.list[i].queued {
            self.look.retain(|x| *x != i);
        }
        let last = self.list.len() - 1;
        self.list.swap_remove(i);
        if i != last {
            // the member that was last is at `i` now
            if let Some(k) = self.list[i].key {
                if let Some(v) = self.by_key.get_mut(&k) {
                    for x in v.iter_mut().filter(|x| **x == last) {
                        *x = i;
                    }
                }
            }
            if self.list[i].queued {
                for x in self.look.iter_mut().filter(|x| **x == last) {
                    *x = i;
                }
            }
        }
    }

    /// Keeps the members `f` keeps.
    pub fn retain(&mut self, mut f: impl FnMut(&Member) -> bool) {
        let mut i = 0;
        while i < self.list.len() {
            if f(&self.list[i]) {
                i += 1;
            } else {
                self.remove(i);
            }
        }
    }

    /// Where the set read the stack's change log to.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Every member goes to the next look.
    fn look_at_all(&mut self) {
        for i in 0..self.list.len() {
            self.queue(i);
        }
    }

    /// Queues the members of the connections in `keys` (what the change log named).
    pub fn named(&mut self, keys: &[SocketKey]) {
        for k in keys {
            if let Some(v) = self.by_key.get(k) {
                for i in v.clone() {
                    self.queue(i);
                }
            }
        }
    }

    /// Looks at the members that may be ready (see the module's note) and writes the events
    /// to report into `out`; their edge-triggered and one-shot state moves on. Returns how
    /// many. No poll of the stack: what the rings hold is not seen. The change log is read
    /// by the caller first ([`Members::named`], [`Members::read_to`]).
    pub fn look(&mut self, st: &Stack, out: &mut [libc::epoll_event]) -> usize {
        if out.is_empty() || self.list.is_empty() {
            return 0;
        }
        let mut idx: smallvec::SmallVec<[usize; 16]> = smallvec::SmallVec::new();
        let mut socks: smallvec::SmallVec<[(Arc<Sock>, u32); 16]> = smallvec::SmallVec::new();
        for i in std::mem::take(&mut self.look) {
            let m = &mut self.list[i];
            m.queued = false;
            if m.disabled {
                // until EPOLL_CTL_MOD
                continue;
            }
            let Some(s) = m.sock.upgrade() else {
                continue;
            };
            if m.key.is_none() {
                // a connection now (made or accepted after it was added): named from now on
                if let Some(k) = key_of(&s) {
                    m.key = Some(k);
                    self.index(k, i);
                }
            }
            let m = &self.list[i];
            if !s.adopted() || m.events & (RD | WR) == 0 {
                if m.key.is_none() {
                    self.queue(i);
                }
                continue;
            }
            idx.push(i);
            socks.push((s, m.events));
        }
        let mut again: smallvec::SmallVec<[bool; 16]> = smallvec::smallvec![false; idx.len()];
        let mut n = 0;
        for (j, bits) in check_now(st, &socks) {
            let m = &mut self.list[idx[j]];
            if n == out.len() {
                // no room to report it: looked at again next time
                again[j] = true;
                continue;
            }
            // ready: a level-triggered member is reported again while it stays so; an
            // edge-triggered one again only after a call on its side, which the log names
            again[j] = !m.et();
            let s = &socks[j].0;
            let gens = (
                s.rd_gen.load(Ordering::Relaxed),
                s.wr_gen.load(Ordering::Relaxed),
            );
            let ev = m.report(bits, gens);
            if ev != 0 {
                out[n] = libc::epoll_event {
                    events: ev,
                    u64: m.data,
                };
                n += 1;
            }
        }
        // and those the log cannot name, always
        for (j, &i) in idx.iter().enumerate() {
            if again[j] || self.list[i].key.is_none() {
                self.queue(i);
            }
        }
        n
    }

    /// Notes that the set read the change log to `cursor` (having queued what it named), or
    /// that it must look at every member (`whole` false).
    pub fn read_to(&mut self, cursor: u64, whole: bool) {
        self.cursor = self.cursor.max(cursor);
        if !whole {
            self.look_at_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock::Proto;

    fn set(n: usize) -> (Vec<Arc<Sock>>, Members) {
        let socks: Vec<_> = (0..n)
            .map(|_| Arc::new(Sock::new(Proto::Tcp, true)))
            .collect();
        let mut m = Members::default();
        for (i, s) in socks.iter().enumerate() {
            m.push(Member::new(
                i as i32 + 10,
                s,
                libc::EPOLLIN as u32,
                i as u64,
            ));
        }
        (socks, m)
    }

    /// The look list as the members' data, sorted; and every queued flag matches it.
    fn looked(m: &Members) -> Vec<u64> {
        let mut v: Vec<u64> = m.look.iter().map(|&i| m.list[i].data).collect();
        v.sort_unstable();
        for (i, x) in m.list.iter().enumerate() {
            assert_eq!(x.queued, m.look.contains(&i), "member {i}'s flag");
        }
        v
    }

    fn taken(m: &mut Members) {
        for i in std::mem::take(&mut m.look) {
            m.list[i].queued = false;
        }
    }

    #[test]
    fn added_and_modified_members_are_looked_at_once_each() {
        let (socks, mut m) = set(3);
        assert_eq!(looked(&m), [0, 1, 2]);
        taken(&mut m);
        m.replace(1, Member::new(11, &socks[1], libc::EPOLLOUT as u32, 7));
        m.replace(1, Member::new(11, &socks[1], libc::EPOLLOUT as u32, 7));
        assert_eq!(looked(&m), [7]);
    }

    #[test]
    fn a_removed_member_leaves_the_look_list_and_the_last_takes_its_place() {
        let (_socks, mut m) = set(4);
        taken(&mut m);
        m.queue(0);
        m.queue(3);
        m.remove(0);
        assert_eq!(m.len(), 3);
        assert_eq!(m.list[0].data, 3, "the last member moved to 0");
        assert_eq!(looked(&m), [3], "still queued, at its new place");
        m.retain(|x| x.data != 1);
        assert_eq!(m.iter().map(|x| x.data).collect::<Vec<_>>(), [3, 2]);
        assert_eq!(looked(&m), [3]);
        m.read_to(5, false);
        assert_eq!(looked(&m), [2, 3], "a reader that must look at all");
        assert_eq!(m.cursor(), 5);
        m.read_to(3, true);
        assert_eq!(m.cursor(), 5, "a cursor never goes back");
    }
}
