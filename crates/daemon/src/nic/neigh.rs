//! The daemon's neighbours on the wire: IPv4 address → MAC, learnt from ARP, with a few frames
//! held per address while it is being asked for. Bounded in entries and held frames; what is
//! asked for too long is given up and its frames dropped (counted by the caller).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Addresses remembered at most (the oldest is forgotten first).
pub const MAX_ENTRIES: usize = 4096;
/// Frames held per address while it is being resolved.
pub const MAX_HELD: usize = 16;
/// Interval between ARP requests for an unresolved address.
pub const RETRY: Duration = Duration::from_secs(1);
/// Requests sent before giving up.
pub const TRIES: u8 = 3;
/// A resolved address is asked for again (while still used) when not confirmed for this long.
pub const STALE: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Entry {
    mac: Option<[u8; 6]>,
    /// When the MAC was last learnt or confirmed.
    seen: Instant,
    /// When it was last asked for, and how often.
    asked: Option<Instant>,
    tries: u8,
    /// The address asked from (a pipe's): requests are repeated from it.
    from: Ipv4Addr,
    held: Vec<Vec<u8>>,
}

/// What to do with a frame for an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Send it to this MAC.
    Send([u8; 6]),
    /// Send it to this MAC, and ask for the address again (the entry is stale).
    SendAndAsk([u8; 6]),
    /// It is held; send an ARP request for the address now.
    HeldAsk,
    /// It is held; a request is already out.
    Held,
    /// Too many frames are held for the address: dropped.
    Dropped,
}

/// The table.
#[derive(Debug, Default)]
pub struct Neighbours {
    entries: HashMap<Ipv4Addr, Entry>,
}

impl Neighbours {
    /// An empty table.
    pub fn new() -> Neighbours {
        Neighbours::default()
    }

    /// Number of addresses known or being asked for.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of resolved addresses.
    pub fn resolved(&self) -> usize {
        self.entries.values().filter(|e| e.mac.is_some()).count()
    }

    /// The MAC of `ip`, if known.
    pub fn mac(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.entries.get(&ip).and_then(|e| e.mac)
    }

    fn make_room(&mut self) {
        if self.entries.len() < MAX_ENTRIES {
            return;
        }
        // forget the entry seen longest ago (rare: only a sweep of addresses gets here)
        if let Some(ip) = self
            .entries
            .iter()
            .min_by_key(|(_, e)| e.seen)
            .map(|(ip, _)| *ip)
        {
            self.entries.remove(&ip);
        }
    }

    /// Where a frame for `ip` goes. When the answer is [`Next::HeldAsk`] or [`Next::Held`],
    /// `frame()` was called and its bytes are kept until [`learn`](Self::learn) hands them
    /// back.
    pub fn route(
        &mut self,
        ip: Ipv4Addr,
        from: Ipv4Addr,
        now: Instant,
        frame: impl FnOnce() -> Vec<u8>,
    ) -> Next {
        if !self.entries.contains_key(&ip) {
            self.make_room();
        }
        let e = self.entries.entry(ip).or_insert(Entry {
            mac: None,
            seen: now,
            asked: None,
            tries: 0,
            from,
            held: Vec::new(),
        });
        e.from = from;
        if let Some(mac) = e.mac {
            let stale = now.saturating_duration_since(e.seen) > STALE;
            let due = e
                .asked
                .is_none_or(|t| now.saturating_duration_since(t) >= RETRY);
            if stale && due {
                e.asked = Some(now);
                return Next::SendAndAsk(mac);
            }
            return Next::Send(mac);
        }
        if e.held.len() >= MAX_HELD {
            return Next::Dropped;
        }
        e.held.push(frame());
        if e.asked.is_none() {
            e.asked = Some(now);
            e.tries = 1;
            Next::HeldAsk
        } else {
            Next::Held
        }
    }

    /// Learns `ip` at `mac`. Returns the frames held for it (to send now).
    pub fn learn(&mut self, ip: Ipv4Addr, mac: [u8; 6], now: Instant) -> Vec<Vec<u8>> {
        if !self.entries.contains_key(&ip) {
            self.make_room();
        }
        let e = self.entries.entry(ip).or_insert(Entry {
            mac: None,
            seen: now,
            asked: None,
            tries: 0,
            from: Ipv4Addr::UNSPECIFIED,
            held: Vec::new(),
        });
        e.mac = Some(mac);
        e.seen = now;
        e.asked = None;
        e.tries = 0;
        std::mem::take(&mut e.held)
    }

    /// Addresses to ask for again now (with the address to ask from); gives up on those asked
    /// [`TRIES`] times, returning how many held frames were dropped with them.
    pub fn tick(&mut self, now: Instant) -> (Vec<(Ipv4Addr, Ipv4Addr)>, usize) {
        let mut ask = Vec::new();
        let mut dropped = 0;
        self.entries.retain(|ip, e| {
            let Some(t) = e.asked else { return true };
            if now.saturating_duration_since(t) < RETRY {
                return true;
            }
            if e.mac.is_some() {
                // a stale entry nobody answered for: keep using it, ask again on next use
                e.asked = None;
                return true;
            }
            if e.tries >= TRIES {
                dropped += e.held.len();
                return false;
            }
            e.tries += 1;
            e.asked = Some(now);
            ask.push((*ip, e.from));
            true
        });
        (ask, dropped)
    }

    /// Whether any address is being asked for (the caller ticks while so).
    pub fn asking(&self) -> bool {
        self.entries.values().any(|e| e.asked.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: [u8; 6] = [2, 0, 0, 0, 0, 9];
    const F: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

    #[test]
    fn frames_wait_for_the_answer_then_go() {
        let mut n = Neighbours::new();
        let ip = Ipv4Addr::new(10, 0, 0, 9);
        let t = Instant::now();
        assert_eq!(n.route(ip, F, t, || vec![1]), Next::HeldAsk);
        assert_eq!(n.route(ip, F, t, || vec![2]), Next::Held);
        assert_eq!(n.learn(ip, M, t), vec![vec![1], vec![2]]);
        assert_eq!(n.route(ip, F, t, || unreachable!()), Next::Send(M));
        assert_eq!(n.mac(ip), Some(M));
        assert_eq!(n.resolved(), 1);
        // stale: still sent, asked again once
        let later = t + STALE + Duration::from_secs(1);
        assert_eq!(
            n.route(ip, F, later, || unreachable!()),
            Next::SendAndAsk(M)
        );
        assert_eq!(n.route(ip, F, later, || unreachable!()), Next::Send(M));
    }

    #[test]
    fn unanswered_addresses_are_retried_then_given_up() {
        let mut n = Neighbours::new();
        let ip = Ipv4Addr::new(10, 0, 0, 8);
        let t = Instant::now();
        for i in 0..MAX_HELD {
            n.route(ip, F, t, || vec![i as u8]);
        }
        assert_eq!(n.route(ip, F, t, || vec![0]), Next::Dropped);
        assert!(n.asking());
        assert_eq!(n.tick(t).0, vec![]);
        let mut at = t;
        for _ in 1..TRIES {
            at += RETRY;
            assert_eq!(n.tick(at), (vec![(ip, F)], 0));
        }
        at += RETRY;
        assert_eq!(n.tick(at), (vec![], MAX_HELD));
        assert!(n.is_empty());
    }

    #[test]
    fn the_table_is_bounded() {
        let mut n = Neighbours::new();
        let t = Instant::now();
        for i in 0..(MAX_ENTRIES as u32 + 100) {
            n.learn(Ipv4Addr::from(i), M, t + Duration::from_millis(i.into()));
        }
        assert_eq!(n.len(), MAX_ENTRIES);
        // the oldest went first
        assert_eq!(n.mac(Ipv4Addr::from(0)), None);
        assert_eq!(n.mac(Ipv4Addr::from(MAX_ENTRIES as u32 + 99)), Some(M));
    }
}
