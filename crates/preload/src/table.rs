//! Which descriptors are DockNet's: a bitmap read without locks (every `read` and `write` of
//! the program asks, most about files and kernel sockets) in front of a vector indexed by
//! descriptor (descriptor numbers are small and dense) holding the socket or epoll instance.

use crate::event::Epoll;
use crate::sock::Sock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

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
}

/// The descriptor table.
#[derive(Debug)]
pub struct Table {
    bits: Box<[AtomicU64]>,
    map: RwLock<Vec<Option<Entry>>>,
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

    /// The entry of `fd`.
    pub fn get(&self, fd: i32) -> Option<Entry> {
        if !self.maybe(fd) {
            return None;
        }
        self.read().get(fd as usize).and_then(Clone::clone)
    }

    /// The socket at `fd`.
    pub fn sock(&self, fd: i32) -> Option<Arc<Sock>> {
        match self.get(fd)? {
            Entry::Sock(s) => Some(s),
            Entry::Epoll(_) => None,
        }
    }

    /// The epoll instance at `fd`.
    pub fn epoll(&self, fd: i32) -> Option<Arc<Epoll>> {
        match self.get(fd)? {
            Entry::Epoll(e) => Some(e),
            Entry::Sock(_) => None,
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
        let old = m[i].replace(e);
        self.mark(fd, true);
        old
    }

    /// Takes `fd` out of the table; the caller drops what comes back (outside the lock).
    pub fn remove(&self, fd: i32) -> Option<Entry> {
        if !self.maybe(fd) {
            return None;
        }
        let mut m = self.write();
        let old = m.get_mut(fd as usize).and_then(Option::take);
        self.mark(fd, false);
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
}
