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
struct Seg {
    control: TcpControl,
    seq: TcpSeqNumber,
    ack: Option<TcpSeqNumber>,
    /// The window field (scaled, except in a SYN).
    window: u16,
    scale: Option<u8>,
    mss: Option<u16>,
}

struct Peer {
    ep: Endpoint,
    mac: [u8; 6],
    to: SocketAddrV4,
    port: u16,
    buf: Vec<u8>,
    sent: u64,
}

impl Peer {
    fn send(
        &mut self,
        control: TcpControl,
        seq: TcpSeqNumber,
        ack: Option<TcpSeqNumber>,
        payload: &[u8],
    ) {
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
        if self.ep.send(&f).is_ok() {
            self.sent += 1;
        }
        self.ep.flush();
    }

    /// The next segment from the server to this connection.
    fn recv(&mut self) -> Option<Seg> {
        let (n, _) = self.ep.recv(&mut self.buf)?;
        let f = &self.buf[..n];
        if n < ETH + IPV4 + 20 || f[12..14] != [0x08, 0x00] || f[ETH + 9] != 6 {
            return None;
        }
        if f[ETH + 12..ETH + 16] != self.to.ip().octets() {
            return None;
        }
        let ip_len = u16::from_be_bytes([f[ETH + 2], f[ETH + 3]]) as usize;
        let end = (ETH + ip_len).min(n);
        let p = TcpPacket::new_checked(&f[ETH + IPV4..end]).ok()?;
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
        })
    }
}

/// The byte at `offset` of the request stream.
fn stream(offset: usize, out: &mut Vec<u8>, len: usize) {
    out.clear();
    out.extend((offset..offset + len).map(|k| REQUEST[k % REQUEST.len()]));
}

pub fn run(mut ep: Endpoint, to: SocketAddrV4, seconds: f64) -> Result<serde_json::Value> {
    let mac = match ep.fc_peer_mac(*to.ip()) {
        Some(m) => m,
        None => ep
            .resolve(*to.ip(), Duration::from_secs(2))
            .context("no MAC for the server")?,
    };
    let seed = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64;
    let mut peer = Peer {
        buf: vec![0u8; ep.frame_size()],
        ep,
        mac,
        to,
        port: 40000 + (seed % 20000) as u16,
        sent: 0,
    };
    // the handshake, by hand
    let iss = TcpSeqNumber(seed as i32);
    let deadline = Instant::now() + Duration::from_secs(3);
    let (irs, shift, mss, syn_edge) = 'hs: loop {
        if Instant::now() > deadline {
            bail!("no SYN-ACK from {to}");
        }
        peer.send(TcpControl::Syn, iss, None, &[]);
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(200) {
            if let Some(g) = peer.recv() {
                if g.control == TcpControl::Syn && g.ack == Some(iss + 1) {
                    // a SYN's window is not scaled
                    break 'hs (
                        g.seq,
                        g.scale.unwrap_or(0),
                        g.mss.unwrap_or(536),
                        iss + 1 + g.window as usize,
                    );
                }
            }
            peer.ep.idle(Duration::from_millis(1));
        }
    };
    let ack = Some(irs + 1);
    let start = iss + 1;
    peer.send(TcpControl::None, start, ack, &[]);
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
