//! The connection table: one entry per balanced connection, indexed both ways.
//!
//! - **Balancer side**: the balancer-side port *is* the entry's index (`slots[port - FIRST_PORT]`),
//!   so a frame from a backend finds its connection with one bounds-checked array access.
//! - **Client side**: a hash map from (client address, VIP port) to that port (SipHash with a
//!   random key: clients choose the keys, so no predictable collisions).
//!
//! Ports are handed out least-recently-freed first and a freed port waits [`Limits::reuse_after`]
//! before it is used again, so a backend still holding the previous connection on that port
//! (TIME-WAIT, or a FIN it keeps retransmitting) does not see the new SYN as part of the old one.
//! The table holds at most [`Limits::max_conns`] entries. Expiry is a sweep over a bounded
//! number of slots per call ([`Table::sweep`]), so no call does unbounded work.

use crate::packet::Addr;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// First balancer-side port for connections.
pub const FIRST_PORT: u16 = 1024;
/// Last balancer-side port for connections (the ports above are the health probes').
pub const LAST_PORT: u16 = 64_999;
/// Number of connection ports.
pub const PORTS: usize = (LAST_PORT - FIRST_PORT) as usize + 1;

/// The client side of a connection: who, and which VIP port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientKey {
    /// Client address and port.
    pub client: Addr,
    /// VIP port the client connected to.
    pub vport: u16,
}

/// Where a connection is in its life, as far as the balancer can tell from the headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The client's SYN went to the backend; no SYN-ACK yet.
    SynSent,
    /// The backend answered the SYN.
    Established,
    /// FIN seen both ways: kept for a short linger (the last ACK, retransmitted FINs).
    Closing {
        /// When the second FIN passed.
        since: Instant,
    },
}

/// One balanced connection.
#[derive(Debug, Clone)]
pub struct Conn {
    /// Client side.
    pub key: ClientKey,
    /// The client's MAC (replies are addressed to it).
    pub client_mac: [u8; 6],
    /// Index of the backend it is pinned to.
    pub backend: u16,
    /// The client's initial sequence number (tells a retransmitted SYN from a new connection
    /// that reuses the client port).
    pub client_isn: u32,
    /// Next sequence number the client will send, as far as seen (for RSTs towards the backend).
    pub c2b_next: u32,
    /// Next sequence number the backend will send, as far as seen (for RSTs towards the client).
    pub b2c_next: u32,
    /// Client FIN seen.
    pub fin_c2b: bool,
    /// Backend FIN seen.
    pub fin_b2c: bool,
    /// Life phase.
    pub phase: Phase,
    /// Last frame either way.
    pub last_seen: Instant,
}

/// Sizes and timeouts of the table.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most connections at once (at most [`PORTS`]).
    pub max_conns: usize,
    /// An established connection with no frame for this long is removed.
    pub idle_timeout: Duration,
    /// A connection whose SYN was never answered is removed after this long.
    pub syn_timeout: Duration,
    /// After FIN both ways, the entry stays this long.
    pub fin_linger: Duration,
    /// A freed balancer port is not used again before this.
    pub reuse_after: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_conns: 32_768,
            idle_timeout: Duration::from_secs(300),
            syn_timeout: Duration::from_secs(10),
            fin_linger: Duration::from_secs(2),
            reuse_after: Duration::from_secs(15),
        }
    }
}

/// Why a connection could not be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// [`Limits::max_conns`] entries already.
    Full,
    /// Every port is in use or freed too recently.
    NoPort,
}

/// The table.
#[derive(Debug)]
pub struct Table {
    limits: Limits,
    slots: Vec<Option<Conn>>,
    by_client: HashMap<ClientKey, u16>,
    /// Free ports, least recently freed first, with when they were freed.
    free: VecDeque<(u16, Option<Instant>)>,
    cursor: usize,
}

impl Table {
    /// An empty table.
    pub fn new(mut limits: Limits) -> Table {
        limits.max_conns = limits.max_conns.clamp(1, PORTS);
        Table {
            limits,
            slots: vec![None; PORTS],
            by_client: HashMap::with_capacity(limits.max_conns.min(4096)),
            free: (FIRST_PORT..=LAST_PORT).map(|p| (p, None)).collect(),
            cursor: 0,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Connections in the table.
    pub fn len(&self) -> usize {
        self.by_client.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.by_client.is_empty()
    }

    fn index(port: u16) -> Option<usize> {
        (FIRST_PORT..=LAST_PORT)
            .contains(&port)
            .then(|| usize::from(port - FIRST_PORT))
    }

    /// The balancer port of the connection a client's frame belongs to.
    pub fn find(&self, key: &ClientKey) -> Option<u16> {
        self.by_client.get(key).copied()
    }

    /// The connection on balancer port `port`.
    pub fn get(&self, port: u16) -> Option<&Conn> {
        self.slots.get(Self::index(port)?)?.as_ref()
    }

    /// The connection on balancer port `port`, to update.
    pub fn get_mut(&mut self, port: u16) -> Option<&mut Conn> {
        self.slots.get_mut(Self::index(port)?)?.as_mut()
    }

    /// Adds a connection and returns the balancer port it got.
    pub fn insert(&mut self, conn: Conn, now: Instant) -> Result<u16, InsertError> {
        if self.by_client.len() >= self.limits.max_conns {
            return Err(InsertError::Full);
        }
        let port = match self.free.front() {
            Some(&(p, None)) => p,
            Some(&(p, Some(t))) if now.saturating_duration_since(t) >= self.limits.reuse_after => p,
            _ => return Err(InsertError::NoPort),
        };
        self.free.pop_front();
        self.by_client.insert(conn.key, port);
        if let Some(i) = Self::index(port) {
            self.slots[i] = Some(conn);
        }
        Ok(port)
    }

    /// Removes the connection on `port` and returns it; its port is free again after
    /// [`Limits::reuse_after`].
    pub fn remove(&mut self, port: u16, now: Instant) -> Option<Conn> {
        let c = self.slots.get_mut(Self::index(port)?)?.take()?;
        self.by_client.remove(&c.key);
        self.free.push_back((port, Some(now)));
        Some(c)
    }

    /// Whether `c` should be removed at `now`.
    pub fn expired(&self, c: &Conn, now: Instant) -> bool {
        let quiet = now.saturating_duration_since(c.last_seen);
        match c.phase {
            Phase::SynSent => quiet >= self.limits.syn_timeout,
            Phase::Established => quiet >= self.limits.idle_timeout,
            Phase::Closing { since } => {
                now.saturating_duration_since(since) >= self.limits.fin_linger
            }
        }
    }

    /// Looks at the next `budget` slots (round the table) and removes the expired connections,
    /// handing each to `removed`.
    pub fn sweep(&mut self, now: Instant, budget: usize, mut removed: impl FnMut(u16, Conn)) {
        for _ in 0..budget.min(PORTS) {
            let i = self.cursor;
            self.cursor = (self.cursor + 1) % PORTS;
            let Some(c) = &self.slots[i] else { continue };
            if self.expired(c, now) {
                let port = FIRST_PORT + i as u16;
                if let Some(c) = self.remove(port, now) {
                    removed(port, c);
                }
            }
        }
    }

    /// Every connection with its balancer port (a whole scan: for stats and tests).
    pub fn iter(&self) -> impl Iterator<Item = (u16, &Conn)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|c| (FIRST_PORT + i as u16, c)))
    }

    /// Balancer ports of every connection pinned to `backend` (a whole scan: for the rare
    /// moment a backend is taken out).
    pub fn ports_of(&self, backend: u16) -> Vec<u16> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                s.as_ref()
                    .filter(|c| c.backend == backend)
                    .map(|_| FIRST_PORT + i as u16)
            })
            .collect()
    }
}

/// `a` is after `b` in sequence space (RFC 1982 serial arithmetic).
pub fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(port: u16, now: Instant) -> Conn {
        Conn {
            key: ClientKey {
                client: Addr::new("10.0.0.9".parse().unwrap(), port),
                vport: 80,
            },
            client_mac: [9; 6],
            backend: 0,
            client_isn: 1,
            c2b_next: 2,
            b2c_next: 0,
            fin_c2b: false,
            fin_b2c: false,
            phase: Phase::SynSent,
            last_seen: now,
        }
    }

    #[test]
    fn both_indexes_agree_and_ports_are_not_reused_at_once() {
        let now = Instant::now();
        let mut t = Table::new(Limits {
            max_conns: 2,
            ..Limits::default()
        });
        let p1 = t.insert(conn(5000, now), now).unwrap();
        let p2 = t.insert(conn(5001, now), now).unwrap();
        assert_ne!(p1, p2);
        assert_eq!(t.insert(conn(5002, now), now), Err(InsertError::Full));
        let k = conn(5001, now).key;
        assert_eq!(t.find(&k), Some(p2));
        assert_eq!(t.get(p2).unwrap().key, k);
        assert!(t.remove(p2, now).is_some());
        assert_eq!(t.find(&k), None);
        assert!(t.get(p2).is_none());
        // the freed port goes to the back of the queue
        let p3 = t.insert(conn(5003, now), now).unwrap();
        assert_ne!(p3, p2);
        assert!(t.get(0).is_none(), "out of range is just absent");
        assert!(t.get(65_500).is_none());
    }

    #[test]
    fn a_recently_freed_port_waits() {
        let now = Instant::now();
        let mut t = Table::new(Limits::default());
        // use up every never-used port, free one
        let mut last = 0;
        for i in 0..PORTS {
            t.free.pop_front();
            last = i;
        }
        assert_eq!(last, PORTS - 1);
        t.free.push_back((2000, Some(now)));
        assert_eq!(t.insert(conn(1, now), now), Err(InsertError::NoPort));
        let later = now + t.limits().reuse_after;
        assert_eq!(t.insert(conn(1, later), later), Ok(2000));
    }

    #[test]
    fn sweep_removes_what_expired_within_its_budget() {
        let now = Instant::now();
        let mut t = Table::new(Limits::default());
        let p = t.insert(conn(1, now), now).unwrap();
        let q = t.insert(conn(2, now), now).unwrap();
        t.get_mut(q).unwrap().phase = Phase::Established;
        let later = now + t.limits().syn_timeout;
        let mut gone = Vec::new();
        t.sweep(later, PORTS, |port, _| gone.push(port));
        assert_eq!(
            gone,
            vec![p],
            "the unanswered SYN went, the established stayed"
        );
        t.get_mut(q).unwrap().phase = Phase::Closing { since: later };
        t.sweep(later + Duration::from_secs(1), PORTS, |port, _| {
            gone.push(port)
        });
        assert_eq!(gone.len(), 1, "still lingering");
        t.sweep(later + t.limits().fin_linger, PORTS, |port, _| {
            gone.push(port)
        });
        assert_eq!(gone, vec![p, q]);
        assert!(t.is_empty());
    }

    #[test]
    fn serial_arithmetic() {
        assert!(seq_after(1, 0));
        assert!(seq_after(0, u32::MAX));
        assert!(!seq_after(5, 5));
        assert!(!seq_after(0, 1));
    }
}
