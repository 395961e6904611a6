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
    /// DockNet patch: see [`SocketSet::set_change_log`].
    changes: ChangeLog,
    /// DockNet patch: the sockets an egress between sweeps visits
    /// ([`SocketSet::set_egress_scope`]).
    touched: TouchList,
    /// DockNet patch: see [`SocketSet::set_tcp_lookup`].
    lookup: TcpLookup,
}

/// DockNet patch: which socket last took a TCP segment of a 4-tuple, by a hash of it
/// ([`SocketSet::set_tcp_lookup`]): a slot holds a handle plus one, 0 when empty.
#[derive(Debug, Default)]
pub(crate) struct TcpLookup {
    #[cfg(feature = "alloc")]
    slots: alloc::vec::Vec<u32>,
}

impl TcpLookup {
    /// Slots in the table (a power of two).
    const SLOTS: usize = 4096;
}

/// DockNet patch: the touched sockets (`Meta::touched`), so that an egress between sweeps
/// visits them without walking every socket. A socket is listed once, when its flag is set.
/// Below [`TouchList::FEW`] slots an egress walks them as smoltcp does (cheaper than keeping the
/// list), and nothing is listed.
#[derive(Debug, Default)]
pub(crate) struct TouchList {
    /// Whether the list is kept (the set has many slots).
    listed: bool,
    #[cfg(feature = "alloc")]
    list: alloc::vec::Vec<SocketHandle>,
}

impl TouchList {
    /// Sets with fewer slots than this are walked.
    pub(crate) const FEW: usize = 32;

    /// Marks the socket of `meta` as touched (listing it if it was not).
    #[inline]
    pub(crate) fn touch(&mut self, meta: &mut Meta) {
        if !meta.touched {
            meta.touched = true;
            if self.listed {
                self.list_it(meta.handle);
            }
        }
    }

    /// Unmarks the socket of `meta` outside an egress (it has nothing left to send), taking
    /// it off the list too, so that a socket is listed once at most.
    #[inline]
    pub(crate) fn untouch(&mut self, meta: &mut Meta) {
        if meta.touched {
            meta.touched = false;
            #[cfg(feature = "alloc")]
            if self.listed
                && let Some(i) = self.list.iter().rposition(|&h| h == meta.handle)
            {
                self.list.swap_remove(i);
            }
        }
    }

    #[inline(never)]
    fn list_it(&mut self, _h: SocketHandle) {
        #[cfg(feature = "alloc")]
        self.list.push(_h);
    }

    /// Lists again a touched socket that an egress took from the list and did not visit.
    #[inline]
    pub(crate) fn relist(&mut self, _h: SocketHandle) {
        #[cfg(feature = "alloc")]
        self.list.push(_h);
    }
}

/// DockNet patch: the sockets whose state may have changed since the owner last took the
/// list ([`SocketSet::set_change_log`]).
#[derive(Debug, Default)]
pub(crate) struct ChangeLog {
    on: bool,
    /// More changes came than the list holds: the owner looks at every socket.
    lost: bool,
    #[cfg(feature = "alloc")]
    list: alloc::vec::Vec<SocketHandle>,
}

impl ChangeLog {
    /// At most this many entries wait to be taken; beyond, the list says it lost some.
    const CAP: usize = if cfg!(test) { 4 } else { 1 << 16 };

    /// Notes that the socket of `meta` may have changed.
    #[inline]
    pub(crate) fn note(&mut self, meta: &mut Meta) {
        if self.on && !meta.changed {
            self.add(meta);
        }
    }

    #[inline(never)]
    fn add(&mut self, meta: &mut Meta) {
        meta.changed = true;
        #[cfg(feature = "alloc")]
        {
            if self.list.len() >= Self::CAP {
                self.lost = true;
            } else {
                self.list.push(meta.handle);
            }
        }
        #[cfg(not(feature = "alloc"))]
        {
            self.lost = true;
        }
    }
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
            changes: ChangeLog::default(),
            touched: TouchList::default(),
            lookup: TcpLookup::default(),
        }
    }

    /// DockNet patch. With `true`, a TCP segment that carries an ACK or a RST (which only the
    /// socket of its own 4-tuple accepts: a listening socket takes a SYN alone) is offered
    /// first to the socket that last took a segment of its 4-tuple, found in a table of 4,096
    /// slots by a hash of the 4-tuple; the walk over every socket is made only when that
    /// socket does not accept it (a new connection, two 4-tuples in one slot, a socket gone).
    /// The taker is the walk's, but where two sockets hold one 4-tuple (an old connection
    /// never closed, and a new one from the same port): the segments after a SYN go where
    /// the SYN went. Only in a set of 32 slots or more. With `false` (the default) every
    /// segment walks the sockets, as smoltcp does.
    pub fn set_tcp_lookup(&mut self, on: bool) {
        #[cfg(feature = "alloc")]
        {
            self.lookup.slots = if on {
                alloc::vec![0; TcpLookup::SLOTS]
            } else {
                alloc::vec::Vec::new()
            };
        }
        #[cfg(not(feature = "alloc"))]
        let _ = on;
    }

    /// DockNet patch: whether the TCP lookup is on and worth it (a walk over a few slots
    /// costs less than the hash).
    pub(crate) fn tcp_lookup_worth(&self) -> bool {
        #[cfg(feature = "alloc")]
        {
            !self.lookup.slots.is_empty() && self.sockets.len() >= TouchList::FEW
        }
        #[cfg(not(feature = "alloc"))]
        {
            false
        }
    }

    /// DockNet patch: the socket that last took a segment whose 4-tuple hashes to `hash`.
    pub(crate) fn tcp_hint(&self, hash: usize) -> Option<SocketHandle> {
        #[cfg(feature = "alloc")]
        {
            let v = *self.lookup.slots.get(hash & (TcpLookup::SLOTS - 1))?;
            (v != 0).then(|| SocketHandle(v as usize - 1))
        }
        #[cfg(not(feature = "alloc"))]
        {
            let _ = hash;
            None
        }
    }

    /// DockNet patch: notes that socket `h` took a segment whose 4-tuple hashes to `hash`.
    pub(crate) fn set_tcp_hint(&mut self, hash: usize, h: SocketHandle) {
        #[cfg(feature = "alloc")]
        if let Some(slot) = self.lookup.slots.get_mut(hash & (TcpLookup::SLOTS - 1)) {
            *slot = u32::try_from(h.0 + 1).unwrap_or(0);
        }
        #[cfg(not(feature = "alloc"))]
        let _ = (hash, h);
    }

    /// DockNet patch. With `true`, the set keeps a list of the sockets whose state may have
    /// changed: those the application reached through [`SocketSet::get_mut`],
    /// [`SocketSet::iter_mut`] or [`SocketSet::add`], TCP sockets that took in a segment, UDP
    /// sockets that took in a datagram, and sockets whose egress visit changed their TCP state
    /// (a timer that closed them) or sent a datagram. [`SocketSet::take_changes`] hands it out. A socket that is not in it has the
    /// same state as when the list was last taken, so an event loop over many connections
    /// need look only at those in it. Off by default: smoltcp as published keeps no list.
    pub fn set_change_log(&mut self, on: bool) {
        self.changes.on = on;
    }

    /// DockNet patch: calls `f` with each socket in the change list (once each; a socket
    /// removed since is skipped, a handle reused since may come) and empties it. Returns
    /// false when changes were lost (more than the list holds came between two takes): then
    /// any socket may have changed.
    pub fn take_changes(&mut self, mut f: impl FnMut(SocketHandle)) -> bool {
        let whole = !core::mem::take(&mut self.changes.lost);
        #[cfg(feature = "alloc")]
        {
            let list = core::mem::take(&mut self.changes.list);
            for &h in &list {
                if let Some(item) = self.sockets.get_mut(h.0).and_then(|s| s.inner.as_mut()) {
                    if item.meta.changed {
                        item.meta.changed = false;
                        f(h);
                    }
                }
            }
            let mut list = list;
            list.clear();
            // keep the allocation for the next changes
            if self.changes.list.is_empty() {
                self.changes.list = list;
            }
        }
        if !whole {
            for item in self.items_mut() {
                item.meta.changed = false;
            }
        }
        whole
    }

    /// DockNet patch: every socket, with the touched list and the change log beside it (to
    /// mark sockets while visiting them).
    pub(crate) fn items_mut_all(
        &mut self,
    ) -> (
        impl Iterator<Item = &mut Item<'a>> + '_,
        &mut TouchList,
        &mut ChangeLog,
    ) {
        (
            self.sockets.iter_mut().filter_map(|x| x.inner.as_mut()),
            &mut self.touched,
            &mut self.changes,
        )
    }

    /// DockNet patch: socket `h` if it exists, with the touched list and the change log.
    pub(crate) fn item_touch(
        &mut self,
        h: SocketHandle,
    ) -> Option<(&mut Item<'a>, &mut TouchList, &mut ChangeLog)> {
        let item = self.sockets.get_mut(h.0)?.inner.as_mut()?;
        Some((item, &mut self.touched, &mut self.changes))
    }

    /// DockNet patch: takes the touched list (an egress between sweeps visits it).
    pub(crate) fn take_touched(&mut self) -> alloc::vec::Vec<SocketHandle> {
        #[cfg(feature = "alloc")]
        {
            core::mem::take(&mut self.touched.list)
        }
        #[cfg(not(feature = "alloc"))]
        {
            alloc::vec::Vec::new()
        }
    }

    /// DockNet patch: hands back a list taken by [`SocketSet::take_touched`], for its memory.
    pub(crate) fn give_back_touched(&mut self, mut list: alloc::vec::Vec<SocketHandle>) {
        #[cfg(feature = "alloc")]
        if self.touched.list.is_empty() {
            list.clear();
            self.touched.list = list;
        }
        #[cfg(not(feature = "alloc"))]
        let _ = &mut list;
    }

    /// DockNet patch: whether an egress between sweeps takes the touched list (the set has
    /// many slots; the list is kept from the first such egress on, and dropped while the
    /// set is small again) or walks every slot.
    pub(crate) fn egress_by_list(&mut self) -> bool {
        let many = self.sockets.len() >= TouchList::FEW;
        if many && !self.touched.listed {
            self.touched.listed = true;
            self.relist_touched();
        } else if !many && self.touched.listed {
            self.touched.listed = false;
            #[cfg(feature = "alloc")]
            self.touched.list.clear();
        }
        many
    }

    /// DockNet patch: after a sweep, the list is exactly the sockets still touched.
    pub(crate) fn relist_touched(&mut self) {
        if !self.touched.listed {
            return;
        }
        #[cfg(feature = "alloc")]
        {
            let mut list = core::mem::take(&mut self.touched.list);
            list.clear();
            list.extend(
                self.sockets
                    .iter()
                    .filter_map(|x| x.inner.as_ref())
                    .filter(|i| i.meta.touched)
                    .map(|i| i.meta.handle),
            );
            self.touched.list = list;
        }
    }

    /// DockNet patch. With `Some(every)`, an egress visits only the sockets that may have
    /// something to send: those the application reached through [`SocketSet::get_mut`],
    /// [`SocketSet::iter_mut`] or [`SocketSet::add`], those that took in a segment, and those
    /// whose last visit sent something or waited for a neighbor; and every socket at most
    /// `every` apart, for their timers (retransmission, delayed ACK, keep-alive, close). With
    /// `None` (the default) every egress visits every socket, as smoltcp does. Between sweeps
    /// an egress takes the touched sockets from a list kept as they are marked, so it costs
    /// what they need, not a walk over every socket (an event loop with a thousand idle
    /// connections spent half its time in that walk).
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

    /// DockNet patch: whether an egress at `now` would visit any socket: a sweep is due, or a
    /// socket is marked for it (see [`SocketSet::set_egress_scope`]; without a scope, always).
    pub fn egress_wanted(&self, now: Instant) -> bool {
        if self.sweep_every.is_none() || now >= self.next_sweep {
            return true;
        }
        if self.touched.listed {
            #[cfg(feature = "alloc")]
            return self.touched.list.iter().any(|h| {
                self.sockets
                    .get(h.0)
                    .and_then(|s| s.inner.as_ref())
                    .is_some_and(|i| i.meta.touched)
            });
        }
        self.sockets
            .iter()
            .filter_map(|s| s.inner.as_ref())
            .any(|i| i.meta.touched)
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

    /// DockNet patch: [`SocketSet::get_mut`] without marking the socket for the egress
    /// ([`SocketSet::set_egress_scope`]; it is noted in the change log all the same): for an
    /// owner whose change makes no segment due (a read that opened no window worth
    /// announcing, a reader's buffer lent or taken back), or that marks it itself
    /// ([`SocketSet::touch`]) when one is.
    ///
    /// # Panics
    /// As [`SocketSet::get_mut`].
    #[inline]
    pub fn get_mut_quiet<T: AnySocket<'a>>(&mut self, handle: SocketHandle) -> &mut T {
        match self.sockets[handle.0].inner.as_mut() {
            Some(item) => {
                self.changes.note(&mut item.meta);
                T::downcast_mut(&mut item.socket)
                    .expect("handle refers to a socket of a wrong type")
            }
            None => panic!("handle does not refer to a valid socket"),
        }
    }

    /// DockNet patch: marks socket `h` for the egress, as [`SocketSet::get_mut`] does.
    pub fn touch(&mut self, h: SocketHandle) {
        if let Some(item) = self.sockets.get_mut(h.0).and_then(|s| s.inner.as_mut()) {
            self.touched.touch(&mut item.meta);
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
            *slot = SocketStorage {
                inner: Some(Item { meta, socket }),
            };
            handle
        }

        let socket = socket.upcast();

        let free = self.sockets.iter().position(|slot| slot.inner.is_none());
        let handle = match free {
            Some(index) => put(index, &mut self.sockets[index], socket),
            None => match &mut self.sockets {
                ManagedSlice::Borrowed(_) => panic!("adding a socket to a full SocketSet"),
                #[cfg(feature = "alloc")]
                ManagedSlice::Owned(sockets) => {
                    sockets.push(SocketStorage { inner: None });
                    let index = sockets.len() - 1;
                    put(index, &mut sockets[index], socket)
                }
            },
        };
        // DockNet patch: a new socket is touched (set_egress_scope) and a change
        // (set_change_log)
        if let Some(item) = self.sockets[handle.0].inner.as_mut() {
            self.touched.touch(&mut item.meta);
            self.changes.note(&mut item.meta);
        }
        handle
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
    #[inline]
    pub fn get_mut<T: AnySocket<'a>>(&mut self, handle: SocketHandle) -> &mut T {
        match self.sockets[handle.0].inner.as_mut() {
            Some(item) => {
                self.touched.touch(&mut item.meta);
                self.changes.note(&mut item.meta);
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
        let (items, touch, log) = self.items_mut_all();
        items.map(|i| {
            touch.touch(&mut i.meta);
            log.note(&mut i.meta);
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
        assert!(
            set.sweep_due(Instant::from_millis(5)),
            "no scope: every egress"
        );
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

    fn changes(set: &mut SocketSet) -> (bool, vec::Vec<SocketHandle>) {
        let mut v = vec::Vec::new();
        let whole = set.take_changes(|h| v.push(h));
        (whole, v)
    }

    #[test]
    fn test_docknet_the_change_log_lists_what_was_reached_mutably_once_each() {
        let mut set = SocketSet::new(vec![]);
        let a = set.add(socket());
        assert_eq!(changes(&mut set), (true, vec![]), "off by default");
        set.set_change_log(true);
        let b = set.add(socket());
        let _ = set.get_mut::<tcp::Socket>(a);
        let _ = set.get_mut::<tcp::Socket>(a);
        assert_eq!(
            changes(&mut set),
            (true, vec![b, a]),
            "added, reached; once each"
        );
        assert_eq!(changes(&mut set), (true, vec![]), "taken");
        let _ = set.get::<tcp::Socket>(a).state();
        assert_eq!(set.iter().count(), 2);
        assert_eq!(changes(&mut set), (true, vec![]), "looked at");
        assert_eq!(set.iter_mut().count(), 2);
        assert_eq!(changes(&mut set), (true, vec![a, b]), "iter_mut");
        let _ = set.get_mut::<tcp::Socket>(b);
        set.remove(b);
        assert_eq!(changes(&mut set), (true, vec![]), "removed since");
    }

    #[test]
    fn test_docknet_a_change_log_that_overflows_says_so_once() {
        let mut set = SocketSet::new(vec![]);
        set.set_change_log(true);
        let hs: vec::Vec<_> = (0..6).map(|_| set.add(socket())).collect();
        let (whole, got) = changes(&mut set);
        assert!(!whole, "six changes, room for four");
        assert_eq!(got, hs[..4]);
        let _ = set.get_mut::<tcp::Socket>(hs[5]);
        assert_eq!(
            changes(&mut set),
            (true, vec![hs[5]]),
            "every flag was cleared"
        );
    }

    #[test]
    fn test_docknet_touched_sockets_are_listed_once_and_a_sweep_relists_what_stays_touched() {
        let mut set = SocketSet::new(vec![]);
        assert!(!set.egress_by_list(), "a set of few slots is walked");
        // as a set of many slots is
        set.touched.listed = true;
        let a = set.add(socket());
        let b = set.add(socket());
        let _ = set.get_mut::<tcp::Socket>(a);
        assert_eq!(set.take_touched(), vec![a, b], "added; listed once");
        assert!(set.take_touched().is_empty());
        // touched again while still flagged: not listed again
        let _ = set.get_mut::<tcp::Socket>(b);
        assert!(set.take_touched().is_empty(), "b was still flagged");
        clear(&mut set, a);
        let _ = set.get_mut::<tcp::Socket>(a);
        assert_eq!(set.take_touched(), vec![a]);
        set.relist_touched();
        assert_eq!(set.take_touched(), vec![a, b], "what a sweep left touched");
        clear(&mut set, b);
        set.relist_touched();
        assert_eq!(set.take_touched(), vec![a]);
    }

    #[test]
    fn test_docknet_the_tcp_lookup_remembers_a_socket_per_slot_when_on() {
        let mut set = SocketSet::new(vec![]);
        let a = set.add(socket());
        set.set_tcp_hint(7, a);
        assert_eq!(set.tcp_hint(7), None, "off by default");
        set.set_tcp_lookup(true);
        assert_eq!(set.tcp_hint(7), None);
        set.set_tcp_hint(7, a);
        assert_eq!(set.tcp_hint(7), Some(a));
        assert_eq!(
            set.tcp_hint(7 + TcpLookup::SLOTS),
            Some(a),
            "one slot per hash"
        );
        let b = set.add(socket());
        set.set_tcp_hint(7 + TcpLookup::SLOTS, b);
        assert_eq!(set.tcp_hint(7), Some(b), "the last taker");
        set.set_tcp_lookup(false);
        assert_eq!(set.tcp_hint(7), None);
    }

    #[test]
    fn test_docknet_a_set_takes_the_list_from_many_slots_on_and_lists_what_was_touched() {
        let mut set = SocketSet::new(vec![]);
        let hs: vec::Vec<_> = (0..TouchList::FEW).map(|_| set.add(socket())).collect();
        for h in &hs[1..] {
            clear(&mut set, *h);
        }
        assert!(set.egress_by_list(), "many slots");
        assert_eq!(set.take_touched(), vec![hs[0]], "what was touched before");
        let _ = set.get_mut::<tcp::Socket>(hs[3]);
        assert_eq!(set.take_touched(), vec![hs[3]]);
        assert!(
            set.tcp_hint(0).is_none() && !set.tcp_lookup_worth(),
            "lookup off"
        );
        set.set_tcp_lookup(true);
        assert!(set.tcp_lookup_worth());
    }
}
