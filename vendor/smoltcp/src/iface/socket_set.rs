use core::fmt;
use managed::ManagedSlice;

use super::socket_meta::Meta;
use crate::socket::{AnySocket, Socket};
use crate::time::{Duration, Instant};

/// Opaque struct with space for storing one socket.
///
/// This is public so you can use it to allocate space for storing
/// sockets when creating an Interface.
#[derive(Debug, Default)]
pub struct SocketStorage<'a> {
    inner: Option<Item<'a>>,
}

impl<'a> SocketStorage<'a> {
    pub const EMPTY: Self = Self { inner: None };
}

/// An item of a socket set.
#[derive(Debug)]
pub(crate) struct Item<'a> {
    pub(crate) meta: Meta,
    pub(crate) socket: Socket<'a>,
}

/// A handle, identifying a socket in an Interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SocketHandle(usize);

impl fmt::Display for SocketHandle {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// An extensible set of sockets.
///
/// The lifetime `'a` is used when storing a `Socket<'a>`.  If you're using
/// owned buffers for your sockets (passed in as `Vec`s) you can use
/// `SocketSet<'static>`.
#[derive(Debug)]
pub struct SocketSet<'a> {
    sockets: ManagedSlice<'a, SocketStorage<'a>>,
    /// DockNet patch: see [`SocketSet::set_egress_scope`].
    sweep_every: Option<Duration>,
    /// DockNet patch: when the next egress visits every socket.
    next_sweep: Instant,
}

impl<'a> SocketSet<'a> {
    /// Create a socket set using the provided storage.
    pub fn new<SocketsT>(sockets: SocketsT) -> SocketSet<'a>
    where
        SocketsT: Into<ManagedSlice<'a, SocketStorage<'a>>>,
    {
        let sockets = sockets.into();
        SocketSet {
            sockets,
            sweep_every: None,
            next_sweep: Instant::from_millis(0),
        }
    }

    /// DockNet patch. With `Some(every)`, an egress visits only the sockets that may have
    /// something to send: those the application reached through [`SocketSet::get_mut`],
    /// [`SocketSet::iter_mut`] or [`SocketSet::add`], those that took in a segment, and those
    /// whose last visit sent something or waited for a neighbor; and every socket at most
    /// `every` apart, for their timers (retransmission, delayed ACK, keep-alive, close). With
    /// `None` (the default) every egress visits every socket, as smoltcp does.
    pub fn set_egress_scope(&mut self, every: Option<Duration>) {
        self.sweep_every = every;
    }

    /// DockNet patch: the egress at `at` or after visits every socket (a timer of one is due
    /// then).
    pub fn sweep_by(&mut self, at: Instant) {
        if at < self.next_sweep {
            self.next_sweep = at;
        }
    }

    /// DockNet patch: whether the egress at `now` visits every socket (and when the next one
    /// does, if so).
    pub(crate) fn sweep_due(&mut self, now: Instant) -> bool {
        match self.sweep_every {
            None => true,
            Some(every) if now >= self.next_sweep => {
                self.next_sweep = now + every;
                true
            }
            Some(_) => false,
        }
    }

    /// Add a socket to the set, and return its handle.
    ///
    /// # Panics
    /// This function panics if the storage is fixed-size (not a `Vec`) and is full.
    pub fn add<T: AnySocket<'a>>(&mut self, socket: T) -> SocketHandle {
        fn put<'a>(index: usize, slot: &mut SocketStorage<'a>, socket: Socket<'a>) -> SocketHandle {
            net_trace!("[{}]: adding", index);
            let handle = SocketHandle(index);
            let mut meta = Meta::default();
            meta.handle = handle;
            meta.touched = true;
            *slot = SocketStorage {
                inner: Some(Item { meta, socket }),
            };
            handle
        }

        let socket = socket.upcast();

        for (index, slot) in self.sockets.iter_mut().enumerate() {
            if slot.inner.is_none() {
                return put(index, slot, socket);
            }
        }

        match &mut self.sockets {
            ManagedSlice::Borrowed(_) => panic!("adding a socket to a full SocketSet"),
            #[cfg(feature = "alloc")]
            ManagedSlice::Owned(sockets) => {
                sockets.push(SocketStorage { inner: None });
                let index = sockets.len() - 1;
                put(index, &mut sockets[index], socket)
            }
        }
    }

    /// Get a socket from the set by its handle, as mutable.
    ///
    /// # Panics
    /// This function may panic if the handle does not belong to this socket set
    /// or the socket has the wrong type.
    pub fn get<T: AnySocket<'a>>(&self, handle: SocketHandle) -> &T {
        match self.sockets[handle.0].inner.as_ref() {
            Some(item) => {
                T::downcast(&item.socket).expect("handle refers to a socket of a wrong type")
            }
            None => panic!("handle does not refer to a valid socket"),
        }
    }

    /// Get a mutable socket from the set by its handle, as mutable.
    ///
    /// # Panics
    /// This function may panic if the handle does not belong to this socket set
    /// or the socket has the wrong type.
    pub fn get_mut<T: AnySocket<'a>>(&mut self, handle: SocketHandle) -> &mut T {
        match self.sockets[handle.0].inner.as_mut() {
            Some(item) => {
                item.meta.touched = true;
                T::downcast_mut(&mut item.socket)
                    .expect("handle refers to a socket of a wrong type")
            }
            None => panic!("handle does not refer to a valid socket"),
        }
    }

    /// Remove a socket from the set, without changing its state.
    ///
    /// # Panics
    /// This function may panic if the handle does not belong to this socket set.
    pub fn remove(&mut self, handle: SocketHandle) -> Socket<'a> {
        net_trace!("[{}]: removing", handle.0);
        match self.sockets[handle.0].inner.take() {
            Some(item) => item.socket,
            None => panic!("handle does not refer to a valid socket"),
        }
    }

    /// Get an iterator to the inner sockets.
    pub fn iter(&self) -> impl Iterator<Item = (SocketHandle, &Socket<'a>)> {
        self.items().map(|i| (i.meta.handle, &i.socket))
    }

    /// Get a mutable iterator to the inner sockets.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (SocketHandle, &mut Socket<'a>)> {
        self.items_mut().map(|i| {
            i.meta.touched = true;
            (i.meta.handle, &mut i.socket)
        })
    }

    /// Iterate every socket in this set.
    pub(crate) fn items(&self) -> impl Iterator<Item = &Item<'a>> + '_ {
        self.sockets.iter().filter_map(|x| x.inner.as_ref())
    }

    /// Iterate every socket in this set.
    pub(crate) fn items_mut(&mut self) -> impl Iterator<Item = &mut Item<'a>> + '_ {
        self.sockets.iter_mut().filter_map(|x| x.inner.as_mut())
    }
}

/// DockNet patch: what marks a socket for a scoped egress, and when an egress visits them all.
#[cfg(all(test, feature = "socket-tcp"))]
mod test_docknet {
    use super::*;
    use crate::socket::tcp;
    use alloc::vec;

    fn socket() -> tcp::Socket<'static> {
        tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; 64]),
            tcp::SocketBuffer::new(vec![0; 64]),
        )
    }

    fn touched(set: &SocketSet, h: SocketHandle) -> bool {
        set.sockets[h.0].inner.as_ref().unwrap().meta.touched
    }

    fn clear(set: &mut SocketSet, h: SocketHandle) {
        set.sockets[h.0].inner.as_mut().unwrap().meta.touched = false;
    }

    #[test]
    fn test_docknet_a_socket_is_touched_by_mutable_access_only() {
        let mut set = SocketSet::new(vec![]);
        let h = set.add(socket());
        assert!(touched(&set, h), "a new socket");
        clear(&mut set, h);
        let _ = set.get::<tcp::Socket>(h).state();
        assert_eq!(set.iter().count(), 1);
        assert!(!touched(&set, h), "looked at");
        let _ = set.get_mut::<tcp::Socket>(h);
        assert!(touched(&set, h), "get_mut");
        clear(&mut set, h);
        assert_eq!(set.iter_mut().count(), 1);
        assert!(touched(&set, h), "iter_mut");
    }

    #[test]
    fn test_docknet_an_egress_visits_every_socket_when_a_sweep_is_due() {
        let mut set = SocketSet::new(vec![]);
        assert!(set.sweep_due(Instant::from_millis(5)), "no scope: every egress");
        assert!(set.sweep_due(Instant::from_millis(5)));
        set.set_egress_scope(Some(Duration::from_millis(1)));
        assert!(set.sweep_due(Instant::from_millis(10)));
        assert!(!set.sweep_due(Instant::from_micros(10_500)));
        assert!(set.sweep_due(Instant::from_millis(11)));
        // a timer due before the next sweep brings it forward
        set.sweep_by(Instant::from_micros(11_200));
        assert!(!set.sweep_due(Instant::from_micros(11_100)));
        assert!(set.sweep_due(Instant::from_micros(11_200)));
    }
}
