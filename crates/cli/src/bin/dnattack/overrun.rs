//! `dnattack window-overrun`: a hostile TCP peer, segments crafted by hand on the raw endpoint.
//! It opens a connection to a DockLib server, sends pipelined HTTP requests and never
//! acknowledges an answer, so the server stops reading and its receive window fills; then it
//! keeps sending odd-sized segments that run past the furthest window edge the server ever
//! offered. The server must live on (its DockLib, a debug build in the tests, asserts that what
//! it accepts fits its buffer). Every acknowledgement is also checked against the edges seen
//! before it (`acked_beyond_offer`); an advertisement dropped on the way (this side's ring full)
//! hides an edge the server did offer, so that count is evidence to read, not a verdict.

use anyhow::{bail, Context, Result};
use docknet_lib::frame::{write_ipv4_headers, ETH, IPV4};
use docknet_lib::Endpoint;
use serde_json::json;
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{IpAddress, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

/// The request the stream repeats: each asks for an answer the attacker will never take.
const REQUEST: &[u8] = b"GET /bytes/65536 HTTP/1.1\r\nHost: victim\r\n\r\n";
/// Most bytes sent past the furthest edge offered.
const PAST_EDGE: usize = 64;

/// What the attacker reads of a segment from the server.
pub(crate) struct Seg {
    pub(crate) control: TcpControl,
    seq: TcpSeqNumber,
    pub(crate) ack: Option<TcpSeqNumber>,
    /// The window field (scaled, except in a SYN).
    window: u16,
    scale: Option<u8>,
    mss: Option<u16>,
    /// Bytes of payload.
    pub(crate) payload: usize,
}

pub(crate) struct Peer {
    pub(crate) ep: Endpoint,
    mac: [u8; 6],
    to: SocketAddrV4,
    pub(crate) port: u16,
    buf: Vec<u8>,
    pub(crate) sent: u64,
}

impl Peer {
    /// A peer of the server at `to` on `port`: the server's MAC from the fast channel to it, or
    /// by ARP through the daemon.
    pub(crate) fn new(mut ep: Endpoint, to: SocketAddrV4, port: u16) -> Result<Peer> {
        let mac = match ep.fc_peer_mac(*to.ip()) {
            Some(m) => m,
            None => ep
                .resolve(*to.ip(), Duration::from_secs(2))
                .context("no MAC for the server")?,
        };
        Ok(Peer {
            buf: vec![0u8; ep.frame_size()],
            ep,
            mac,
            to,
            port,
            sent: 0,
        })
    }

    /// Sends one segment; false when the ring had no room for it.
    pub(crate) fn send(
        &mut self,
        control: TcpControl,
        seq: TcpSeqNumber,
        ack: Option<TcpSeqNumber>,
        payload: &[u8],
    ) -> bool {
        let repr = TcpRepr {
            src_port: self.port,
            dst_port: self.to.port(),
            control,
            seq_number: seq,
            ack_number: ack,
            window_len: 65535,
            window_scale: (control == TcpControl::Syn).then_some(7),
            max_seg_size: (control == TcpControl::Syn).then_some(1460),
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload,
        };
        let total = ETH + IPV4 + repr.buffer_len();
        let mut f = vec![0u8; total];
        write_ipv4_headers(
            &mut f,
            self.ep.mac(),
            self.mac,
            self.ep.ip(),
            *self.to.ip(),
            6,
            total,
        );
        repr.emit(
            &mut TcpPacket::new_unchecked(&mut f[ETH + IPV4..]),
            &IpAddress::Ipv4(self.ep.ip()),
            &IpAddress::Ipv4(*self.to.ip()),
            &ChecksumCapabilities::default(),
        );
        let sent = self.ep.send(&f).is_ok();
        if sent {
            self.sent += 1;
        }
        self.ep.flush();
        sent
    }

    /// The server's MAC.
    pub(crate) fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The next segment from the server to this connection.
    pub(crate) fn recv(&mut self) -> Option<Seg> {
        let (n, _) = self.ep.recv(&mut self.buf)?;
        let f = std::mem::take(&mut self.buf);
        let seg = self.parse(&f[..n]);
        self.buf = f;
        seg
    }

    /// The segment `f` is, if it is one from the server to this connection.
    pub(crate) fn parse(&self, f: &[u8]) -> Option<Seg> {
        let n = f.len();
        if n < ETH + IPV4 + 20 || f[12..14] != [0x08, 0x00] || f[ETH + 9] != 6 {
            return None;
        }
        if f[ETH + 12..ETH + 16] != self.to.ip().octets() {
            return None;
        }
        let ip_len = u16::from_be_bytes([f[ETH + 2], f[ETH + 3]]) as usize;
        let end = (ETH + ip_len).min(n);
        // (a length that lies, as in frames `channel-rewrite --their-frames` wrote over, is
        // no segment)
        let p = TcpPacket::new_checked(f.get(ETH + IPV4..end)?).ok()?;
        let r = TcpRepr::parse(
            &p,
            &IpAddress::Ipv4(*self.to.ip()),
            &IpAddress::Ipv4(self.ep.ip()),
            &ChecksumCapabilities::ignored(),
        )
        .ok()?;
        (r.dst_port == self.port && r.src_port == self.to.port()).then_some(Seg {
            control: r.control,
            seq: r.seq_number,
            ack: r.ack_number,
            window: r.window_len,
            scale: r.window_scale,
            mss: r.max_seg_size,
            payload: r.payload.len(),
        })
    }
}

/// What a handshake learnt of the server.
pub(crate) struct Opened {
    /// Its initial sequence number.
    pub(crate) irs: TcpSeqNumber,
    /// Its window scale.
    pub(crate) shift: u8,
    pub(crate) mss: u16,
    /// The right edge of the window its SYN offered.
    pub(crate) syn_edge: TcpSeqNumber,
}

/// Opens the peer's connection by hand (SYN from `iss`, the server's SYN-ACK, the ACK), within
/// `within`.
pub(crate) fn handshake(peer: &mut Peer, iss: TcpSeqNumber, within: Duration) -> Result<Opened> {
    let opened = half_open(peer, iss, within)?;
    peer.send(TcpControl::None, iss + 1, Some(opened.irs + 1), &[]);
    Ok(opened)
}

/// Sends SYNs from `iss` until the server answers one, within `within`; leaves the connection
/// half open (no ACK).
fn half_open(peer: &mut Peer, iss: TcpSeqNumber, within: Duration) -> Result<Opened> {
    let deadline = Instant::now() + within;
    let opened = 'hs: loop {
        if Instant::now() > deadline {
            bail!("no SYN-ACK from {}", peer.to);
        }
        peer.send(TcpControl::Syn, iss, None, &[]);
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(200) {
            if let Some(g) = peer.recv() {
                if g.control == TcpControl::Syn && g.ack == Some(iss + 1) {
                    // a SYN's window is not scaled
                    break 'hs Opened {
                        irs: g.seq,
                        shift: g.scale.unwrap_or(0),
                        mss: g.mss.unwrap_or(536),
                        syn_edge: iss + 1 + g.window as usize,
                    };
                }
            }
            peer.ep.idle(Duration::from_millis(1));
        }
    };
    Ok(opened)
}

/// How far before the first connection's numbers the second's start (`stale_edge`).
const STALE_BEFORE: usize = 300_000;
/// DockLib's receive buffer.
const ROOM: usize = 256 * 1024;

/// `dnattack stale-edge`: `rounds` times, a half-open connection ended by a RST, then a
/// connection from the same port whose numbers start [`STALE_BEFORE`] bytes before the first's,
/// which sends segments from within its buffer's reach ([`ROOM`]) up to where the first
/// connection's window ended, and is then reset at its first byte. A listener that kept the
/// first connection's window edge for the second took those bytes past its buffer's room
/// (smoltcp asserts in a debug build, and the server dies): it must live on. Reports the rounds
/// whose two handshakes completed and the segments that left past the room.
pub fn stale_edge(ep: Endpoint, to: SocketAddrV4, rounds: u32) -> Result<serde_json::Value> {
    let seed = std::process::id() as u64 ^ 0x5eed_ed9e;
    let mut x = seed | 1;
    let mut peer = Peer::new(ep, to, 30000)?;
    let (mut completed, mut sent_past) = (0u64, 0u64);
    let mut payload = Vec::new();
    for k in 0..rounds {
        peer.port = 30000 + (k % 20000) as u16;
        let first = TcpSeqNumber(super::xorshift(&mut x) as i32);
        let Ok(o) = half_open(&mut peer, first, Duration::from_secs(2)) else {
            continue;
        };
        peer.send(TcpControl::Rst, first + 1, None, &[]);
        let stale = o.syn_edge;
        let second = first - STALE_BEFORE;
        let Ok(o2) = handshake(&mut peer, second, Duration::from_secs(2)) else {
            continue;
        };
        completed += 1;
        let start = second + 1;
        let ack = Some(o2.irs + 1);
        // from a little inside the room to the old edge, odd sizes: beyond the room, only a
        // stale edge lets them in
        let mut at = start + (ROOM - 4096);
        let give_up = Instant::now() + Duration::from_secs(5);
        while at < stale {
            let len = (1 + super::xorshift(&mut x) as usize % 1400).min(stale - at);
            stream(at - start, &mut payload, len);
            if !peer.send(TcpControl::Psh, at, ack, &payload) {
                // the ring is full: the same segment again once the server took some (not
                // for ever: a server that died takes nothing)
                if Instant::now() > give_up {
                    break;
                }
                peer.ep.idle(Duration::from_micros(100));
                continue;
            }
            if at + len > start + ROOM {
                sent_past += 1;
            }
            at += len;
            while peer.recv().is_some() {}
        }
        // (the server's answers to what it refused, then the end: a RST at the byte it waits
        // for, inside its window)
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            if peer.recv().is_none() {
                peer.ep.idle(Duration::from_millis(1));
            }
        }
        peer.send(TcpControl::Rst, start, None, &[]);
    }
    Ok(json!({
        "attack": "stale-edge",
        "rounds": rounds,
        "completed": completed,
        "segments": peer.sent,
        "segments_past_room": sent_past,
    }))
}

/// The byte at `offset` of the request stream.
fn stream(offset: usize, out: &mut Vec<u8>, len: usize) {
    out.clear();
    out.extend((offset..offset + len).map(|k| REQUEST[k % REQUEST.len()]));
}

pub fn run(ep: Endpoint, to: SocketAddrV4, seconds: f64) -> Result<serde_json::Value> {
    let seed = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64;
    let mut peer = Peer::new(ep, to, 40000 + (seed % 20000) as u16)?;
    let iss = TcpSeqNumber(seed as i32);
    let Opened {
        irs,
        shift,
        mss,
        syn_edge,
    } = handshake(&mut peer, iss, Duration::from_secs(3))?;
    let ack = Some(irs + 1);
    let start = iss + 1;
    let seg = usize::from(mss).clamp(64, 1400);
    // what the server offered and acknowledged, relative to `start`
    let (mut una, mut furthest) = (start, syn_edge);
    let (mut acks, mut beyond, mut shrinks, mut zero_windows) = (0u64, 0u64, 0u64, 0u64);
    let (mut nxt, mut x) = (start, seed | 1);
    let mut payload = Vec::new();
    let mut last_resend = Instant::now();
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        while let Some(g) = peer.recv() {
            if g.control == TcpControl::Rst {
                bail!("the server reset the connection");
            }
            let (Some(a), win) = (g.ack, g.window) else {
                continue;
            };
            acks += 1;
            if a > furthest {
                beyond += 1;
            }
            let edge = a + ((win as usize) << shift);
            if edge < furthest {
                shrinks += 1;
            }
            if win == 0 {
                zero_windows += 1;
            }
            furthest = furthest.max(edge);
            una = una.max(a);
        }
        // resend from what was acknowledged now and then: bytes past the edge were dropped
        if last_resend.elapsed() > Duration::from_millis(5) {
            nxt = una;
            last_resend = Instant::now();
        }
        // odd-sized segments up to a little past the furthest edge offered
        let limit = furthest + 1 + (super::xorshift(&mut x) as usize % PAST_EDGE);
        let mut budget = 64;
        while nxt < limit && budget > 0 {
            let len = (1 + super::xorshift(&mut x) as usize % seg).min(limit - nxt);
            stream(nxt - start, &mut payload, len);
            peer.send(TcpControl::Psh, nxt, ack, &payload);
            nxt += len;
            budget -= 1;
        }
        peer.ep.idle(Duration::from_micros(200));
    }
    peer.send(TcpControl::Rst, nxt, None, &[]);
    Ok(json!({
        "attack": "window-overrun",
        "segments": peer.sent,
        "acks": acks,
        "window_shift": shift,
        "offered_bytes": furthest - start,
        "acked_bytes": una - start,
        "acked_beyond_offer": beyond,
        "window_shrinks": shrinks,
        "zero_windows": zero_windows,
    }))
}

/// `dnattack syn-options`: SYNs whose options and lengths lie (a zero or overrunning option
/// length, two MSS options, a data offset past the frame, an IP length shorter than its
/// headers, and `mutations` random byte changes of a SYN), each from a port of its own and
/// never completed; then one connection opened with two MSS options (536, then 65,495: stacks
/// take the last) that fetches `GET /bytes/N` and reports the largest segment it got. The
/// server reads every SYN's options (DockLib clamps the MSS to the path): it must live on.
pub fn syn_options(
    ep: Endpoint,
    to: SocketAddrV4,
    mutations: u32,
    bytes: usize,
) -> Result<serde_json::Value> {
    let seed = std::process::id() as u64 ^ 0x9e37_79b9;
    let mut peer = Peer::new(ep, to, 20000)?;
    let two_mss: &[u8] = &[2, 4, 0x02, 0x18, 2, 4, 0xff, 0xd7, 3, 3, 7];
    let mut crafted: Vec<Vec<u8>> = vec![
        crafted_syn(&peer, 20001, 1, &[2, 0, 0xff, 0xff]),
        crafted_syn(&peer, 20002, 1, &[2, 1, 0xff, 0xff]),
        crafted_syn(&peer, 20003, 1, &[3, 40, 7, 2, 4, 0xff, 0xff]),
        crafted_syn(&peer, 20004, 1, &[2, 3, 0xff, 0xff]),
        crafted_syn(&peer, 20005, 1, &[2, 4, 0, 0]),
        crafted_syn(&peer, 20006, 1, two_mss),
    ];
    let mut f = crafted_syn(&peer, 20007, 1, two_mss);
    f[ETH + IPV4 + 12] = 0xf0; // a data offset of 60 bytes in a shorter frame
    crafted.push(f);
    let mut f = crafted_syn(&peer, 20008, 1, two_mss);
    f[ETH + 2..ETH + 4].copy_from_slice(&30u16.to_be_bytes()); // shorter than its headers
    crafted.push(f);
    let mut x = seed | 1;
    for k in 0..mutations {
        let mut f = crafted_syn(&peer, 21000 + (k % 20000) as u16, k, two_mss);
        for _ in 0..1 + super::xorshift(&mut x) % 4 {
            let i = ETH + (super::xorshift(&mut x) as usize % (f.len() - ETH));
            f[i] = super::xorshift(&mut x) as u8;
        }
        crafted.push(f);
    }
    // each SYN is followed by the same frame as a reset (its sequence number plus one), so no
    // half-open connection it made holds one of the listener's sockets
    for f in &crafted {
        let mut rst = f.clone();
        if let Ok(mut p) = TcpPacket::new_checked(&mut rst[ETH + IPV4..]) {
            p.clear_flags();
            p.set_rst(true);
            p.set_seq_number(p.seq_number() + 1);
        }
        for g in [f, &rst] {
            while peer.ep.send(g).is_err() {
                peer.ep.flush();
                peer.ep.idle(Duration::from_micros(100));
            }
            peer.sent += 1;
        }
        peer.ep.flush();
        // what the server answered is read and dropped
        while peer.ep.recv(&mut peer.buf).is_some() {}
    }
    peer.ep.flush();
    // the connection with two MSS options, completed
    peer.port = 45000 + (seed % 10000) as u16;
    let iss = TcpSeqNumber(seed as i32);
    let deadline = Instant::now() + Duration::from_secs(5);
    let irs = 'hs: loop {
        if Instant::now() > deadline {
            bail!("no SYN-ACK from {to}");
        }
        let f = crafted_syn(&peer, peer.port, iss.0 as u32, two_mss);
        let _ = peer.ep.send(&f);
        peer.ep.flush();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(200) {
            match peer.recv() {
                Some(g) if g.control == TcpControl::Syn && g.ack == Some(iss + 1) => {
                    break 'hs g.seq
                }
                Some(_) => {}
                None => peer.ep.idle(Duration::from_millis(1)),
            }
        }
    };
    let mut rcv = irs + 1;
    let request =
        format!("GET /bytes/{bytes} HTTP/1.1\r\nHost: victim\r\nConnection: close\r\n\r\n");
    peer.send(TcpControl::Psh, iss + 1, Some(rcv), request.as_bytes());
    let (mut got, mut largest, mut fin) = (0usize, 0usize, false);
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && !fin {
        let Some((n, _)) = peer.ep.recv(&mut peer.buf) else {
            peer.ep.idle(Duration::from_micros(200));
            continue;
        };
        let f = &peer.buf[..n];
        if n < ETH + IPV4 + 20 || f[12..14] != [0x08, 0x00] || f[ETH + 9] != 6 {
            continue;
        }
        let ip_len = (u16::from_be_bytes([f[ETH + 2], f[ETH + 3]]) as usize).min(n - ETH);
        let Ok(p) = TcpPacket::new_checked(&f[ETH + IPV4..ETH + ip_len]) else {
            continue;
        };
        if p.dst_port() != peer.port {
            continue;
        }
        let len = p.payload().len();
        largest = largest.max(len);
        // in order only: anything else is acknowledged as what came before it
        if p.seq_number() == rcv {
            got += len;
            rcv += len;
            if p.fin() {
                rcv += 1;
                fin = true;
            }
        }
        peer.send(TcpControl::None, iss + 1 + request.len(), Some(rcv), &[]);
    }
    peer.send(TcpControl::Rst, iss + 1 + request.len(), None, &[]);
    Ok(json!({
        "attack": "syn-options",
        "syns": crafted.len(),
        "answer_bytes": got,
        "answer_complete": fin,
        "largest_segment": largest,
    }))
}

/// A SYN from `port` with `opts` as its options (padded with NOPs to a multiple of four).
fn crafted_syn(peer: &Peer, port: u16, iss: u32, opts: &[u8]) -> Vec<u8> {
    let olen = opts.len().div_ceil(4) * 4;
    let total = ETH + IPV4 + 20 + olen;
    let mut f = vec![0u8; total];
    write_ipv4_headers(
        &mut f,
        peer.ep.mac(),
        peer.mac,
        peer.ep.ip(),
        *peer.to.ip(),
        6,
        total,
    );
    let t = &mut f[ETH + IPV4..];
    t[0..2].copy_from_slice(&port.to_be_bytes());
    t[2..4].copy_from_slice(&peer.to.port().to_be_bytes());
    t[4..8].copy_from_slice(&iss.to_be_bytes());
    t[12] = (((20 + olen) / 4) << 4) as u8;
    t[13] = 0x02;
    t[14..16].copy_from_slice(&65535u16.to_be_bytes());
    t[20..20 + olen].fill(1);
    t[20..20 + opts.len()].copy_from_slice(opts);
    let mut p = TcpPacket::new_unchecked(&mut f[ETH + IPV4..]);
    p.fill_checksum(
        &IpAddress::Ipv4(peer.ep.ip()),
        &IpAddress::Ipv4(*peer.to.ip()),
    );
    f
}

/// `dnattack syn-flood`: SYNs at a DockLib server from every port of this container's
/// address in turn, for `seconds`, never completed (the server's SYN-ACKs are read and
/// dropped; no reset goes back). Each one makes a half-open connection on the server's
/// listener. Reports the SYNs sent and the SYN-ACKs seen.
pub fn syn_flood(ep: Endpoint, to: SocketAddrV4, seconds: f64) -> Result<serde_json::Value> {
    let mut peer = Peer::new(ep, to, 0)?;
    let mut x = std::process::id() as u64 ^ 0x5bd1_e995;
    let mss: &[u8] = &[2, 4, 0x05, 0xb4];
    let (mut syn_acks, mut k) = (0u64, 0u32);
    let end = Instant::now() + Duration::from_secs_f64(seconds.max(0.0));
    while Instant::now() < end {
        let port = 1024 + (k % 64000) as u16;
        k = k.wrapping_add(1);
        let f = crafted_syn(&peer, port, super::xorshift(&mut x) as u32, mss);
        if peer.ep.send(&f).is_ok() {
            peer.sent += 1;
        } else {
            peer.ep.flush();
            peer.ep.idle(Duration::from_micros(50));
        }
        if k.is_multiple_of(32) {
            peer.ep.flush();
            while let Some((n, _)) = peer.ep.recv(&mut peer.buf) {
                let f = &peer.buf[..n];
                // a SYN-ACK: flags SYN and ACK in a TCP frame
                if n >= ETH + IPV4 + 20 && f[ETH + 9] == 6 && f[ETH + IPV4 + 13] & 0x12 == 0x12 {
                    syn_acks += 1;
                }
            }
        }
    }
    peer.ep.flush();
    Ok(json!({
        "attack": "syn-flood",
        "syns": peer.sent,
        "syn_acks": syn_acks,
        "seconds": seconds,
    }))
}
