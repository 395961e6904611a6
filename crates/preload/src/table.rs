//! Which descriptors are DockNet's: a bitmap read without locks (every `read` and `write` of
//! the program asks, most about files and kernel sockets) in front of a vector indexed by
//! descriptor (descriptor numbers are small and dense) holding the socket or epoll instance.

use crate::event::Epoll;
use crate::relay::Relayed;
use crate::sock::{Conn, Sock};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

/// Descriptors below this are answered by the bitmap alone; above it the map is asked.
const BITMAP_FDS: usize = 1 << 16;

/// What a descriptor in the table is.
#[derive(Debug, Clone)]
pub enum Entry {
    /// An AF_INET TCP or UDP socket (still a kernel socket until it is bound or connected
    /// to a DockNet address).
    Sock(Arc<Sock>),
    /// An epoll instance (a kernel epoll descriptor with DockNet members kept beside it).
    Epoll(Arc<Epoll>),
    /// In a forked child: a connection of the parent's stack that the parent serves for this
    /// process through a Unix socket (the descriptor is that socket now; see `relay`).
    Relayed(Arc<Relayed>),
}

/// The descriptor table.
#[derive(Debug)]
pub struct Table {
    bits: Box<[AtomicU64]>,
    map: RwLock<Vec<Option<Entry>>>,
    /// Bumped by every change of `map`: a thread's cached look-ups hold while it is unchanged.
    generation: AtomicU64,
}

/// A cached look-up: weak, so a socket closed by another thread is not kept alive (its close
/// takes effect when the last strong reference goes, as before).
#[derive(Debug)]
enum Seen {
    Absent,
    Sock(Weak<Sock>),
    Epoll(Weak<Epoll>),
    Relayed(Weak<Relayed>),
}

/// The table held (written) across a `fork`, so that the child's copy is whole and unlocked.
#[derive(Debug)]
pub struct TableHold(std::sync::RwLockWriteGuard<'static, Vec<Option<Entry>>>);

impl TableHold {
    /// The TCP connections on DockNet in the held table, by descriptor.
    pub fn connections(&self) -> Vec<(i32, Arc<Sock>)> {
        self.0
            .iter()
            .enumerate()
            .filter_map(|(fd, e)| match e {
                Some(Entry::Sock(s)) if matches!(s.conn.get(), Some(Conn::Stream(_))) => {
                    Some((fd as i32, s.clone()))
                }
                _ => None,
            })
            .collect()
    }
}

/// Slots in a thread's cache (a program's thread mostly works a handful of descriptors).
const CACHED: usize = 8;

/// A thread's last look-ups in one table at one generation. A hit costs no lock (the read
/// lock's two atomic operations), only the weak reference's upgrade.
#[derive(Debug)]
struct Cache {
    table: usize,
    generation: u64,
    next: usize,
    slots: [(i32, Seen); CACHED],
}

thread_local! {
    static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache {
            table: 0,
            generation: 0,
            next: 0,
            slots: [const { (-1, Seen::Absent) }; CACHED],
        })
    };
}

impl Default for Table {
    fn default() -> Table {
        Table::new()
    }
}

impl Table {
    /// An empty table.
    pub fn new() -> Table {
        Table {
            bits: (0..BITMAP_FDS / 64).map(|_| AtomicU64::new(0)).collect(),
            map: RwLock::new(Vec::new()),
            generation: AtomicU64::new(0),
        }
    }

    /// Whether `fd` may be in the table (false: surely not). Lock-free and signal-safe.
    pub fn maybe(&self, fd: i32) -> bool {
        if fd < 0 {
            return false;
        }
        let fd = fd as usize;
        if fd >= BITMAP_FDS {
            return true;
        }
        self.bits[fd / 64].load(Ordering::Acquire) & (1 << (fd % 64)) != 0
    }

    fn mark(&self, fd: i32, on: bool) {
        let fd = fd as usize;
        if fd < BITMAP_FDS {
            let bit = 1u64 << (fd % 64);
            if on {
                self.bits[fd / 64].fetch_or(bit, Ordering::AcqRel);
            } else {
                self.bits[fd / 64].fetch_and(!bit, Ordering::AcqRel);
            }
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Option<Entry>>> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Option<Entry>>> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds the table until the result is dropped (across a `fork`: see [`TableHold`]).
    pub fn hold(&'static self) -> TableHold {
        TableHold(self.write())
    }

    /// The entry of `fd`.
    pub fn get(&self, fd: i32) -> Option<Entry> {
        if !self.maybe(fd) {
            return None;
        }
        // SYNC: Acquire pairs with the Release bump in `changed`: a change that happened
        // before this call (in this thread, or in one that told this one about it) shows as a
        // new generation, and the cache is not used for it.
        let generation = self.generation.load(Ordering::Acquire);
        let me = self as *const Table as usize;
        // The cache is skipped where it cannot be borrowed (a signal handler that interrupted
        // a look-up in this thread, a thread being torn down).
        let hit = CACHE
            .try_with(|c| {
                let c = c.try_borrow().ok()?;
                if c.table != me || c.generation != generation {
                    return None;
                }
                let (_, seen) = c.slots.iter().find(|(f, _)| *f == fd)?;
                match seen {
                    Seen::Absent => Some(None),
                    Seen::Sock(w) => w.upgrade().map(|s| Some(Entry::Sock(s))),
                    Seen::Epoll(w) => w.upgrade().map(|e| Some(Entry::Epoll(e))),
                    Seen::Relayed(w) => w.upgrade().map(|r| Some(Entry::Relayed(r))),
                }
            })
            .ok()
            .flatten();
        if let Some(e) = hit {
            return e;
        }
        let e = self.read().get(fd as usize).and_then(Clone::clone);
        let seen = match &e {
            None => Seen::Absent,
            Some(Entry::Sock(s)) => Seen::Sock(Arc::downgrade(s)),
            Some(Entry::Epoll(x)) => Seen::Epoll(Arc::downgrade(x)),
            Some(Entry::Relayed(r)) => Seen::Relayed(Arc::downgrade(r)),
        };
        let _ = CACHE.try_with(|c| {
            let Ok(mut c) = c.try_borrow_mut() else {
                return;
            };
            if c.table != me || c.generation != generation {
                // (read before the look-up: what was looked up is at least that new)
                c.table = me;
                c.generation = generation;
                for slot in c.slots.iter_mut() {
                    *slot = (-1, Seen::Absent);
                }
            }
            let at = match c.slots.iter().position(|(f, _)| *f == fd) {
                Some(i) => i,
                None => {
                    let i = c.next;
                    c.next = (i + 1) % CACHED;
                    i
                }
            };
            c.slots[at] = (fd, seen);
        });
        e
    }

    /// The table's generation: it moves with every insert and removal, so with every close of
    /// a socket's last descriptor.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Marks a change of the map (called with the write lock held).
    fn changed(&self) {
        // SYNC: Release pairs with the Acquire load in `get`.
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The socket at `fd`.
    pub fn sock(&self, fd: i32) -> Option<Arc<Sock>> {
        match self.get(fd)? {
            Entry::Sock(s) => Some(s),
            _ => None,
        }
    }

    /// The epoll instance at `fd`.
    pub fn epoll(&self, fd: i32) -> Option<Arc<Epoll>> {
        match self.get(fd)? {
            Entry::Epoll(e) => Some(e),
            _ => None,
        }
    }

    /// The relayed connection at `fd` (a forked child's, served by its parent).
    pub fn relayed(&self, fd: i32) -> Option<Arc<Relayed>> {
        match self.get(fd)? {
            Entry::Relayed(r) => Some(r),
            _ => None,
        }
    }

    /// Puts `e` at `fd` (replacing what was there), returning what was there.
    pub fn insert(&self, fd: i32, e: Entry) -> Option<Entry> {
        if fd < 0 {
            return None;
        }
        let mut m = self.write();
        let i = fd as usize;
        if m.len() <= i {
            m.resize(i + 1, None);
        }
        if let Entry::Sock(s) = &e {
            s.descriptors.fetch_add(1, Ordering::AcqRel);
        }
        let old = m[i].replace(e);
        if let Some(Entry::Sock(s)) = &old {
            s.descriptors.fetch_sub(1, Ordering::AcqRel);
        }
        self.mark(fd, true);
        self.changed();
        old
    }

    /// Takes `fd` out of the table; the caller drops what comes back (outside the lock).
    pub fn remove(&self, fd: i32) -> Option<Entry> {
        if !self.maybe(fd) {
            return None;
        }
        let mut m = self.write();
        let old = m.get_mut(fd as usize).and_then(Option::take);
        if let Some(Entry::Sock(s)) = &old {
            s.descriptors.fetch_sub(1, Ordering::AcqRel);
        }
        self.mark(fd, false);
        self.changed();
        old
    }

    /// How many descriptors are in the table.
    pub fn len(&self) -> usize {
        self.read().iter().filter(|e| e.is_some()).count()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock::{Proto, Sock};

    #[test]
    fn the_bitmap_follows_the_map() {
        let t = Table::new();
        assert!(!t.maybe(5));
        assert!(t.get(5).is_none());
        let s = Arc::new(Sock::new(Proto::Tcp, false));
        assert!(t.insert(5, Entry::Sock(s.clone())).is_none());
        assert!(t.maybe(5));
        assert!(!t.maybe(4) && !t.maybe(6) && !t.maybe(-1));
        assert_eq!(t.sock(5).unwrap().id, s.id);
        assert!(t.epoll(5).is_none());
        // a descriptor beyond the bitmap is always looked up
        t.insert(70_000, Entry::Sock(s.clone()));
        assert!(t.maybe(70_001));
        assert!(t.get(70_001).is_none());
        assert!(t.get(70_000).is_some());
        assert!(t.remove(5).is_some());
        assert!(!t.maybe(5));
        assert!(t.remove(5).is_none());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_cached_look_up_follows_changes_and_keeps_nothing_alive() {
        let t = Table::new();
        let a = Arc::new(Sock::new(Proto::Tcp, false));
        t.insert(7, Entry::Sock(a.clone()));
        assert_eq!(t.sock(7).unwrap().id, a.id);
        // again, from the cache
        assert_eq!(t.sock(7).unwrap().id, a.id);
        // replaced: the next look-up sees the new socket, not the cached one
        let b = Arc::new(Sock::new(Proto::Tcp, false));
        t.insert(7, Entry::Sock(b.clone()));
        assert_eq!(t.sock(7).unwrap().id, b.id);
        // removed: gone at once, and the cache held no strong reference
        let w = Arc::downgrade(&b);
        drop(b);
        drop(t.remove(7));
        assert!(t.get(7).is_none());
        assert!(
            w.upgrade().is_none(),
            "the cache kept a closed socket alive"
        );
        // another table's entries are not taken for this one's
        let u = Table::new();
        u.insert(7, Entry::Sock(a.clone()));
        assert!(t.get(7).is_none());
        assert_eq!(u.sock(7).unwrap().id, a.id);
        // a change made by another thread is seen by this one's next look-up
        let c = Arc::new(Sock::new(Proto::Udp, false));
        let c2 = c.clone();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                u.insert(7, Entry::Sock(c2));
            });
        });
        assert_eq!(u.sock(7).unwrap().id, c.id);
    }
}
