//! The members of an epoll instance that are DockNet's, and what the instance knows of
//! them: which to look at when it is waited on.
//!
//! A member whose connection did not change since the last look is ready for what it was
//! ready for then. So a wait looks only at the members the stack's change log names
//! ([`Stack::changes`]: reached by a call, a segment in, a timer), those ready at the last
//! look (level-triggered: reported again while ready), those added or modified since, and
//! those the log cannot name (listeners, UDP sockets, sockets not yet on DockNet): an
//! `epoll_wait` costs O(ready), not O(members). A first look, a log the set fell behind,
//! and a member removed look at every member once.

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
    /// Members that are connections on DockNet, by key.
    by_key: HashMap<SocketKey, usize>,
    /// Members the next look takes whatever the log says: not named by the log, ready at
    /// the last look, added or modified since.
    look: Vec<usize>,
    /// `by_key` and `look` do not follow `list` (a member left): the next look rebuilds them
    /// and takes every member.
    stale: bool,
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

    /// Adds a member (to be looked at).
    pub fn push(&mut self, m: Member) {
        let i = self.list.len();
        if let Some(k) = m.key {
            self.by_key.insert(k, i);
        }
        self.list.push(m);
        self.queue(i);
    }

    /// Replaces member `i` (`EPOLL_CTL_MOD`; to be looked at).
    pub fn replace(&mut self, i: usize, m: Member) {
        let queued = self.list[i].queued;
        if let Some(k) = self.list[i].key.take() {
            self.by_key.remove(&k);
        }
        if let Some(k) = m.key {
            self.by_key.insert(k, i);
        }
        self.list[i] = Member { queued, ..m };
        self.queue(i);
    }

    /// Removes member `i`.
    pub fn remove(&mut self, i: usize) {
        self.list.remove(i);
        self.stale = true;
    }

    /// Keeps the members `f` keeps.
    pub fn retain(&mut self, f: impl FnMut(&Member) -> bool) {
        let n = self.list.len();
        self.list.retain(f);
        if self.list.len() != n {
            self.stale = true;
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

    fn rebuild(&mut self) {
        self.stale = false;
        self.by_key.clear();
        self.look.clear();
        for (i, m) in self.list.iter_mut().enumerate() {
            m.queued = false;
            if let Some(k) = m.key {
                self.by_key.insert(k, i);
            }
        }
        self.look_at_all();
    }

    /// Looks at the members that may be ready (see the module's note) and writes the events
    /// to report into `out`; their edge-triggered and one-shot state moves on. Returns how
    /// many. No poll of the stack: what the rings hold is not seen.
    pub fn look(&mut self, st: &Stack, out: &mut [libc::epoll_event]) -> usize {
        if out.is_empty() || self.list.is_empty() {
            return 0;
        }
        if self.stale {
            self.rebuild();
        }
        let mut named: smallvec::SmallVec<[usize; 16]> = smallvec::SmallVec::new();
        let by_key = &self.by_key;
        let whole = st.changes(&mut self.cursor, |k| {
            if let Some(&i) = by_key.get(&k) {
                named.push(i);
            }
        });
        if whole {
            for i in named {
                self.queue(i);
            }
        } else {
            self.look_at_all();
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
                    self.by_key.insert(k, i);
                }
            }
            if !s.adopted() || m.events & (RD | WR) == 0 {
                if m.key.is_none() {
                    self.queue(i);
                }
                continue;
            }
            idx.push(i);
            socks.push((s, m.events));
        }
        let mut ready: smallvec::SmallVec<[bool; 16]> = smallvec::smallvec![false; idx.len()];
        let mut n = 0;
        for (j, bits) in check_now(st, &socks) {
            ready[j] = true;
            let s = &socks[j].0;
            let gens = (
                s.rd_gen.load(Ordering::Relaxed),
                s.wr_gen.load(Ordering::Relaxed),
            );
            let m = &mut self.list[idx[j]];
            let ev = m.report(bits, gens);
            if ev != 0 && n < out.len() {
                out[n] = libc::epoll_event {
                    events: ev,
                    u64: m.data,
                };
                n += 1;
            }
        }
        // ready ones are looked at again (reported while ready, or once a call on an
        // edge-triggered one's side came); those the log cannot name, always
        for (j, &i) in idx.iter().enumerate() {
            if ready[j] || self.list[i].key.is_none() {
                self.queue(i);
            }
        }
        n
    }
}
