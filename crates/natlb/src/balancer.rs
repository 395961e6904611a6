//! The balancer's logic: frames in, rewritten frames out, through a [`Tx`] the caller provides.
//! No I/O and no clock of its own (every call gets `now`), so the tests drive it frame by frame.
//!
//! **Full NAT.** A client's SYN to `VIP:port` picks a backend ([`crate::backend::pick`]) and a
//! balancer-side port (the connection's index, [`crate::table`]). Client → backend frames are
//! rewritten `(client, VIP:port)` → `(VIP:lbport, backend)`; backend → client frames
//! `(backend, VIP:lbport)` → `(VIP:port, client)`. The balancer is both ends' peer, because
//! DockLib (and the daemon) route by destination address: a backend answering the client's own
//! address directly would send around the balancer, and the client would drop a reply from an
//! address it never connected to.
//!
//! Work per frame is bounded: a parse, at most two hash-map operations, one rewrite, one send.
//! Timers ([`Balancer::tick`]) do bounded work per call too.

use crate::backend::{self, Backend, Change, Params, Policy};
use crate::packet::{self, build, Addr, ParseError, Rewrite, Segment, BUILT_LEN};
use crate::stats::{Counters, Reason, Snapshot};
use crate::table::{self, ClientKey, Conn, InsertError, Phase, Table};
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// First balancer-side port of the health probes: backend `i` is probed from `PROBE_BASE + i`.
pub const PROBE_BASE: u16 = table::LAST_PORT + 1;
/// Most backends.
pub const MAX_BACKENDS: usize = 256;
/// Resets sent per [`Balancer::tick`] at most (the rest wait for the next call).
const RESETS_PER_TICK: usize = 64;
/// Timers run at most this often.
const TICK: Duration = Duration::from_millis(10);

/// Where a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// To this backend, over its fast channel only.
    Backend(Ipv4Addr),
    /// To a client (routed by its address: the daemon, or a fast channel to it).
    Client,
}

/// What became of a frame handed to [`Tx::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Queued.
    Ok,
    /// The ring is full.
    Full,
    /// The backend has no fast channel (now).
    NoChannel,
    /// Longer than the path takes.
    TooBig,
}

/// The way out: the I/O layer implements it over a DockLib endpoint, the tests over a `Vec`.
pub trait Tx {
    /// Queues one frame.
    fn send(&mut self, frame: &[u8], dest: Dest) -> Sent;
}

/// One VIP port and the backends that serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Port on the VIP.
    pub vport: u16,
    /// Indices into the backend list.
    pub backends: Vec<u16>,
}

/// Everything the balancer is told at start.
#[derive(Debug, Clone)]
pub struct Config {
    /// The balancer's own address (clients connect to it).
    pub vip: Ipv4Addr,
    /// The balancer's MAC.
    pub mac: [u8; 6],
    /// Clamp the MSS of SYNs to this (so segments fit the balancer's own pipe).
    pub mss: Option<u16>,
    /// How new connections are spread.
    pub policy: Policy,
    /// Backend addresses (at most [`MAX_BACKENDS`]).
    pub backends: Vec<Addr>,
    /// Served ports.
    pub services: Vec<Service>,
    /// Table sizes and timeouts.
    pub limits: table::Limits,
    /// Health timing.
    pub health: Params,
    /// Seed of the probes' sequence numbers.
    pub seed: u64,
}

#[derive(Debug, Clone, Copy)]
struct SynCheck {
    until: Instant,
    port: u16,
    isn: u32,
    backend: u16,
}

/// The balancer.
#[derive(Debug)]
pub struct Balancer {
    cfg: Config,
    backends: Vec<Backend>,
    cursors: Vec<usize>,
    table: Table,
    syn_checks: VecDeque<SynCheck>,
    resets: VecDeque<(u16, u16)>,
    counters: Counters,
    drops: [u64; Reason::COUNT],
    buf: [u8; BUILT_LEN],
    next_tick: Instant,
    rng: u64,
    started: Instant,
}

impl Balancer {
    /// A balancer; `macs` says which backends have a fast channel now (and their MACs).
    pub fn new(
        mut cfg: Config,
        macs: impl Fn(Ipv4Addr) -> Option<[u8; 6]>,
        now: Instant,
    ) -> Balancer {
        cfg.backends.truncate(MAX_BACKENDS);
        let backends = cfg
            .backends
            .iter()
            .map(|a| Backend::new(*a, macs(a.ip), now))
            .collect();
        Balancer {
            cursors: vec![0; cfg.services.len()],
            table: Table::new(cfg.limits),
            backends,
            syn_checks: VecDeque::new(),
            resets: VecDeque::new(),
            counters: Counters::default(),
            drops: [0; Reason::COUNT],
            buf: [0; BUILT_LEN],
            next_tick: now,
            rng: cfg.seed | 1,
            started: now,
            cfg,
        }
    }

    /// The backends.
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// The connection table.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Frames dropped for `r`.
    pub fn dropped(&self, r: Reason) -> u64 {
        self.drops[r as usize]
    }

    fn drop_for(&mut self, r: Reason) {
        self.drops[r as usize] += 1;
    }

    /// Handles one received frame (rewritten in place and sent, answered, or dropped).
    pub fn handle(&mut self, frame: &mut [u8], now: Instant, tx: &mut impl Tx) {
        let seg = match Segment::parse(frame) {
            Ok(s) => s,
            Err(e) => {
                self.drop_for(match e {
                    ParseError::Malformed => Reason::Malformed,
                    ParseError::NotIpv4 => Reason::NotIpv4,
                    ParseError::NotTcp => Reason::NotTcp,
                    ParseError::Fragment => Reason::Fragment,
                });
                return;
            }
        };
        if seg.dst != self.cfg.vip {
            return self.drop_for(Reason::NotForVip);
        }
        if seg.flags.syn && (seg.flags.rst || seg.flags.fin) {
            return self.drop_for(Reason::BadFlags);
        }
        let from = Addr::new(seg.src, seg.sport);
        match self.backends.iter().position(|b| b.addr == from) {
            Some(b) => self.on_backend(b as u16, frame, &seg, now, tx),
            None => self.on_client(frame, &seg, now, tx),
        }
    }

    fn service(&self, vport: u16) -> Option<usize> {
        self.cfg.services.iter().position(|s| s.vport == vport)
    }

    fn on_client(&mut self, frame: &mut [u8], seg: &Segment, now: Instant, tx: &mut impl Tx) {
        self.counters.from_clients += 1;
        let Some(svc) = self.service(seg.dport) else {
            return self.drop_for(Reason::NoService);
        };
        let key = ClientKey {
            client: Addr::new(seg.src, seg.sport),
            vport: seg.dport,
        };
        let syn = seg.flags.syn && !seg.flags.ack;
        let port = match (self.table.find(&key), syn) {
            (Some(p), false) => p,
            (Some(p), true) => match self.repeated_syn(p, key, seg, svc, now, tx) {
                Some(p) => p,
                None => return,
            },
            (None, true) => match self.open(key, seg, svc, now, tx) {
                Some(p) => p,
                None => return,
            },
            (None, false) => return self.no_connection(seg, Dest::Client, tx),
        };
        self.forward_to_backend(port, frame, seg, now, tx);
    }

    /// A SYN from a client that already has an entry: a retransmission (same ISN), re-sent to
    /// another backend if its own was taken out before answering; or a new connection on a
    /// client port the table still holds, which ends the old one.
    fn repeated_syn(
        &mut self,
        port: u16,
        key: ClientKey,
        seg: &Segment,
        svc: usize,
        now: Instant,
        tx: &mut impl Tx,
    ) -> Option<u16> {
        let c = self.table.get(port)?;
        if c.client_isn != seg.seq {
            self.counters.port_reused += 1;
            self.reset_backend_side(port, tx);
            self.close(port, now);
            return self.open(key, seg, svc, now, tx);
        }
        let old = c.backend;
        if c.phase != Phase::SynSent || self.backends[usize::from(old)].available() {
            return Some(port);
        }
        let Some(b) = backend::pick(
            &self.backends,
            &self.cfg.services[svc].backends,
            self.cfg.policy,
            &mut self.cursors[svc],
        ) else {
            self.close(port, now);
            self.drop_for(Reason::NoBackend);
            self.no_connection(seg, Dest::Client, tx);
            return None;
        };
        release(&mut self.backends[usize::from(old)]);
        self.assign(b, port, seg.seq, now);
        if let Some(c) = self.table.get_mut(port) {
            c.backend = b;
        }
        self.counters.syn_moved += 1;
        Some(port)
    }

    /// A new connection: picks a backend and a port. `None` (and the SYN dropped, or
    /// answered with RST when no backend is available) if it cannot be had.
    fn open(
        &mut self,
        key: ClientKey,
        seg: &Segment,
        svc: usize,
        now: Instant,
        tx: &mut impl Tx,
    ) -> Option<u16> {
        let Some(b) = backend::pick(
            &self.backends,
            &self.cfg.services[svc].backends,
            self.cfg.policy,
            &mut self.cursors[svc],
        ) else {
            self.drop_for(Reason::NoBackend);
            self.no_connection(seg, Dest::Client, tx);
            return None;
        };
        let conn = Conn {
            key,
            client_mac: seg.src_mac,
            backend: b,
            client_isn: seg.seq,
            c2b_next: seg.seq_end(),
            b2c_next: 0,
            fin_c2b: false,
            fin_b2c: false,
            phase: Phase::SynSent,
            last_seen: now,
        };
        match self.table.insert(conn, now) {
            Ok(port) => {
                self.counters.conns_total += 1;
                self.assign(b, port, seg.seq, now);
                Some(port)
            }
            Err(InsertError::Full) => {
                self.drop_for(Reason::TableFull);
                None
            }
            Err(InsertError::NoPort) => {
                self.drop_for(Reason::NoPort);
                None
            }
        }
    }

    /// Counts a connection on backend `b` and arms its SYN deadline.
    fn assign(&mut self, b: u16, port: u16, isn: u32, now: Instant) {
        let be = &mut self.backends[usize::from(b)];
        be.active += 1;
        be.counters.total += 1;
        if self.syn_checks.len() >= 2 * self.table.limits().max_conns {
            self.syn_checks.pop_front();
        }
        self.syn_checks.push_back(SynCheck {
            until: now + self.cfg.health.syn_deadline,
            port,
            isn,
            backend: b,
        });
    }

    fn forward_to_backend(
        &mut self,
        port: u16,
        frame: &mut [u8],
        seg: &Segment,
        now: Instant,
        tx: &mut impl Tx,
    ) {
        let Some((bi, phase)) = self
            .table
            .get(port)
            .map(|c| (usize::from(c.backend), c.phase))
        else {
            return;
        };
        let (Some(mac), true) = (self.backends[bi].mac, self.backends[bi].available()) else {
            // taken out: the connection ends here (its reset may still be queued)
            if phase != Phase::SynSent && self.reset_client_side(port, now, tx) {
                self.backends[bi].counters.conns_reset += 1;
            }
            return self.drop_for(Reason::BackendOut);
        };
        let Some(c) = self.table.get_mut(port) else {
            return;
        };
        c.last_seen = now;
        if table::seq_after(seg.seq_end(), c.c2b_next) {
            c.c2b_next = seg.seq_end();
        }
        c.fin_c2b |= seg.flags.fin;
        let ended = closing(c, now);
        let to = Rewrite {
            src_mac: self.cfg.mac,
            dst_mac: mac,
            src: Addr::new(self.cfg.vip, port),
            dst: self.backends[bi].addr,
        };
        if ended {
            release(&mut self.backends[bi]);
        }
        packet::rewrite(frame, seg, &to);
        if let Some(mss) = self.cfg.mss {
            packet::clamp_mss(frame, seg, mss);
        }
        self.send(frame, Dest::Backend(to.dst.ip), Some(bi), now, tx);
        self.counters.to_backends += 1;
        if seg.flags.rst {
            self.close(port, now);
        }
    }

    fn on_backend(
        &mut self,
        b: u16,
        frame: &mut [u8],
        seg: &Segment,
        now: Instant,
        tx: &mut impl Tx,
    ) {
        self.counters.from_backends += 1;
        if seg.dport >= PROBE_BASE {
            return self.probe_reply(b, seg, now, tx);
        }
        let Some(c) = self.table.get_mut(seg.dport) else {
            let ip = seg.src;
            return self.no_connection(seg, Dest::Backend(ip), tx);
        };
        if c.backend != b {
            return self.drop_for(Reason::WrongBackend);
        }
        c.last_seen = now;
        let mut answered = false;
        if seg.flags.syn {
            answered = c.phase == Phase::SynSent;
            c.b2c_next = seg.seq_end();
            if answered {
                c.phase = Phase::Established;
            }
        } else if table::seq_after(seg.seq_end(), c.b2c_next) {
            c.b2c_next = seg.seq_end();
        }
        c.fin_b2c |= seg.flags.fin;
        let ended = closing(c, now);
        let to = Rewrite {
            src_mac: self.cfg.mac,
            dst_mac: c.client_mac,
            src: Addr::new(self.cfg.vip, c.key.vport),
            dst: c.key.client,
        };
        let port = seg.dport;
        if ended {
            release(&mut self.backends[usize::from(b)]);
        }
        if answered {
            // a SYN-ACK proves the backend alive
            let _ = self.backends[usize::from(b)].success(now, &self.cfg.health);
        }
        packet::rewrite(frame, seg, &to);
        if let Some(mss) = self.cfg.mss {
            packet::clamp_mss(frame, seg, mss);
        }
        self.send(frame, Dest::Client, None, now, tx);
        self.counters.to_clients += 1;
        if seg.flags.rst {
            self.close(port, now);
        }
    }

    /// Sends and counts what went wrong; a backend found without its channel is taken out.
    fn send(
        &mut self,
        frame: &[u8],
        dest: Dest,
        backend: Option<usize>,
        now: Instant,
        tx: &mut impl Tx,
    ) {
        match tx.send(frame, dest) {
            Sent::Ok => {}
            Sent::Full => match backend {
                Some(b) => {
                    self.backends[b].counters.ring_full += 1;
                    self.drop_for(Reason::BackendRingFull);
                }
                None => self.drop_for(Reason::ClientRingFull),
            },
            Sent::TooBig => self.drop_for(Reason::TooBig),
            Sent::NoChannel => {
                self.drop_for(Reason::BackendOut);
                if let Some(b) = backend {
                    self.set_channel(b, None, now);
                }
            }
        }
    }

    /// Answers a frame that belongs to no connection with a RST (never a RST to a RST).
    fn no_connection(&mut self, seg: &Segment, dest: Dest, tx: &mut impl Tx) {
        self.drop_for(Reason::NoConnection);
        if seg.flags.rst {
            return;
        }
        let mac = match dest {
            Dest::Backend(ip) => match self
                .backends
                .iter()
                .find(|b| b.addr.ip == ip)
                .and_then(|b| b.mac)
            {
                Some(m) => m,
                None => return,
            },
            Dest::Client => seg.src_mac,
        };
        let mut s = *seg;
        s.src_mac = mac;
        let f = build::reset_reply(&mut self.buf, self.cfg.mac, &s);
        if tx.send(f, dest) == Sent::Ok {
            self.counters.resets_sent += 1;
        }
    }

    /// Removes the connection on `port` (its backend's count goes down).
    fn close(&mut self, port: u16, now: Instant) {
        if let Some(c) = self.table.remove(port, now) {
            if !matches!(c.phase, Phase::Closing { .. }) {
                release(&mut self.backends[usize::from(c.backend)]);
            }
            self.counters.conns_closed += 1;
        }
    }

    /// Sends the client of the connection on `port` a RST (as if from the backend) and removes
    /// the connection. `false` if the client's ring was full (the connection stays).
    fn reset_client_side(&mut self, port: u16, now: Instant, tx: &mut impl Tx) -> bool {
        let Some(c) = self.table.get(port) else {
            return true;
        };
        let f = build::segment(
            &mut self.buf,
            (self.cfg.mac, c.client_mac),
            Addr::new(self.cfg.vip, c.key.vport),
            c.key.client,
            build::Kind::Rst {
                seq: c.b2c_next,
                ack: Some(c.c2b_next),
            },
        );
        if tx.send(f, Dest::Client) == Sent::Full {
            return false;
        }
        self.counters.resets_sent += 1;
        self.close(port, now);
        true
    }

    /// Sends the backend of the connection on `port` a RST (as if from the client), if it can
    /// be reached.
    fn reset_backend_side(&mut self, port: u16, tx: &mut impl Tx) {
        let Some(c) = self.table.get(port) else {
            return;
        };
        let b = &self.backends[usize::from(c.backend)];
        let (Some(mac), true) = (b.mac, b.available()) else {
            return;
        };
        let f = build::segment(
            &mut self.buf,
            (self.cfg.mac, mac),
            Addr::new(self.cfg.vip, port),
            b.addr,
            build::Kind::Rst {
                seq: c.c2b_next,
                ack: None,
            },
        );
        if tx.send(f, Dest::Backend(b.addr.ip)) == Sent::Ok {
            self.counters.resets_sent += 1;
        }
    }

    /// Tells the balancer whether backend `b`'s fast channel is there (its MAC) or gone.
    pub fn set_channel(&mut self, b: usize, mac: Option<[u8; 6]>, now: Instant) {
        let Some(be) = self.backends.get_mut(b) else {
            return;
        };
        match (be.mac.is_some(), mac.is_some()) {
            (true, false) => {
                be.mac = None;
                if be.health == backend::Health::Up {
                    be.take_out(now, self.cfg.health.backoff_min);
                }
                self.taken_out(b);
            }
            (false, true) => {
                be.mac = mac;
                // back on probation: probed at once, up when it answers
                be.health = backend::Health::Down {
                    retry_at: now,
                    backoff: self.cfg.health.backoff_min,
                };
                be.probe = None;
            }
            _ => be.mac = mac.or(be.mac),
        }
    }

    /// Re-reads every backend's channel through `macs`.
    pub fn refresh_channels(&mut self, macs: impl Fn(Ipv4Addr) -> Option<[u8; 6]>, now: Instant) {
        for b in 0..self.backends.len() {
            let m = macs(self.backends[b].addr.ip);
            self.set_channel(b, m, now);
        }
    }

    /// Queues a reset for every connection pinned to backend `b` that got past its SYN (one
    /// still waiting for its SYN-ACK moves to another backend when the client sends it again).
    fn taken_out(&mut self, b: usize) {
        let b = b as u16;
        for port in self.table.ports_of(b) {
            self.resets.push_back((port, b));
        }
    }

    /// Timers: queued resets (a bounded number per call), and every 10 ms the SYN deadlines,
    /// the probes and a slice of the table's expiry sweep. Call it after every batch of frames.
    pub fn tick(&mut self, now: Instant, tx: &mut impl Tx) {
        self.drain_resets(now, tx);
        if now < self.next_tick {
            return;
        }
        self.next_tick = now + TICK;
        self.syn_deadlines(now);
        self.probes(now, tx);
        let budget = table::PORTS / 100 + 1;
        let backends = &mut self.backends;
        let counters = &mut self.counters;
        self.table.sweep(now, budget, |_, c| {
            if !matches!(c.phase, Phase::Closing { .. }) {
                release(&mut backends[usize::from(c.backend)]);
            }
            counters.conns_expired += 1;
        });
    }

    fn drain_resets(&mut self, now: Instant, tx: &mut impl Tx) {
        for _ in 0..RESETS_PER_TICK {
            let Some(&(port, b)) = self.resets.front() else {
                return;
            };
            let pinned = self
                .table
                .get(port)
                .is_some_and(|c| c.backend == b && c.phase != Phase::SynSent);
            if pinned {
                if !self.reset_client_side(port, now, tx) {
                    return;
                }
                self.backends[usize::from(b)].counters.conns_reset += 1;
            }
            self.resets.pop_front();
        }
    }

    fn syn_deadlines(&mut self, now: Instant) {
        while let Some(ch) = self.syn_checks.front().copied() {
            if ch.until > now {
                return;
            }
            self.syn_checks.pop_front();
            let unanswered = self.table.get(ch.port).is_some_and(|c| {
                c.phase == Phase::SynSent && c.client_isn == ch.isn && c.backend == ch.backend
            });
            if unanswered {
                let b = usize::from(ch.backend);
                self.backends[b].counters.syn_timeouts += 1;
                self.fail(b, now);
            }
        }
    }

    fn fail(&mut self, b: usize, now: Instant) {
        if self.backends[b].failure(now, &self.cfg.health) == Change::TakenOut {
            self.taken_out(b);
        }
    }

    fn probes(&mut self, now: Instant, tx: &mut impl Tx) {
        for b in 0..self.backends.len() {
            if let Some(p) = self.backends[b].probe {
                if now >= p.until {
                    self.backends[b].probe = None;
                    self.backends[b].counters.probe_failures += 1;
                    self.after_probe(b, now);
                    self.fail(b, now);
                }
            }
            if self.backends[b].probe_due(now, &self.cfg.health) {
                self.send_probe(b, now, tx);
            }
        }
    }

    fn after_probe(&mut self, b: usize, now: Instant) {
        if let Some(i) = self.cfg.health.probe_interval {
            self.backends[b].next_probe = now + i;
        }
    }

    /// A SYN from the balancer's probe port for `b` to the backend; its SYN-ACK is answered
    /// with a RST, so the backend's listener is back where it was.
    fn send_probe(&mut self, b: usize, now: Instant, tx: &mut impl Tx) {
        let Some(mac) = self.backends[b].mac else {
            return;
        };
        // xorshift64: probe sequence numbers nobody else predicts by accident
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let isn = self.rng as u32;
        let dst = self.backends[b].addr;
        let f = build::segment(
            &mut self.buf,
            (self.cfg.mac, mac),
            Addr::new(self.cfg.vip, PROBE_BASE + b as u16),
            dst,
            build::Kind::Syn { isn },
        );
        // a probe that finds the ring full stays "in flight" and times out: a failure
        if tx.send(f, Dest::Backend(dst.ip)) == Sent::NoChannel {
            return self.set_channel(b, None, now);
        }
        let be = &mut self.backends[b];
        be.counters.probes += 1;
        be.probe = Some(backend::Probe {
            isn,
            until: now + self.cfg.health.probe_timeout,
        });
    }

    fn probe_reply(&mut self, b: u16, seg: &Segment, now: Instant, tx: &mut impl Tx) {
        let bi = usize::from(b);
        let mine = seg.dport == PROBE_BASE.wrapping_add(b);
        let probe = self.backends[bi].probe;
        let answers =
            mine && seg.flags.ack && probe.is_some_and(|p| seg.ack == p.isn.wrapping_add(1));
        if answers && seg.flags.syn {
            self.backends[bi].probe = None;
            self.after_probe(bi, now);
            let _ = self.backends[bi].success(now, &self.cfg.health);
        } else if answers && seg.flags.rst {
            self.backends[bi].probe = None;
            self.backends[bi].counters.probe_failures += 1;
            self.after_probe(bi, now);
            self.fail(bi, now);
            return;
        } else {
            self.drop_for(Reason::StrayProbe);
        }
        // close the half-open probe connection on the backend (answered or late)
        if seg.flags.syn && seg.flags.ack && mine {
            if let Some(mac) = self.backends[bi].mac {
                let f = build::segment(
                    &mut self.buf,
                    (self.cfg.mac, mac),
                    Addr::new(self.cfg.vip, seg.dport),
                    Addr::new(seg.src, seg.sport),
                    build::Kind::Rst {
                        seq: seg.ack,
                        ack: None,
                    },
                );
                let _ = tx.send(f, Dest::Backend(seg.src));
            }
        }
    }

    /// Counters, per backend and per drop reason.
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        Snapshot::new(self, now)
    }

    pub(crate) fn parts(&self) -> (&Config, &Counters, &[u64; Reason::COUNT], Instant) {
        (&self.cfg, &self.counters, &self.drops, self.started)
    }
}

/// Enters the closing linger once FIN has passed both ways; `true` when it just did. A
/// connection that lingers no longer counts as active on its backend (least-conn would
/// otherwise avoid a backend for the linger after its connections ended).
fn closing(c: &mut Conn, now: Instant) -> bool {
    if c.fin_c2b && c.fin_b2c && !matches!(c.phase, Phase::Closing { .. }) {
        c.phase = Phase::Closing { since: now };
        return true;
    }
    false
}

/// One connection fewer on backend `b`.
fn release(b: &mut Backend) {
    b.active = b.active.saturating_sub(1);
}
