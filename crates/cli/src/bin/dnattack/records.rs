//! `dnattack lying-records`: a fast-channel partner that sends records (an established
//! connection's bytes outside TCP's segments, `docknet_lib::frame::Record`) that lie. Each
//! round opens a connection to a DockLib server by hand and sends one kind of record:
//! - `behind`, `ahead`: on its connection, not at the next byte the server expects;
//! - `past_window`: on its connection, more bytes than the window the server offered;
//! - `no_connection`: for a port that holds no connection;
//! - `bad_version`, `empty`, `truncated`: malformed;
//! - `spoofed`: from an address that is not the partner's;
//! - `unasked_confirm`: a confirmation that the partner takes records, never asked for;
//! - `asked`: the question whether the server takes records on the connection, which it
//!   answers with a confirmation;
//! - `honest`: an HTTP request as a record at the right place, which the server answers;
//! - `long_ahead`, `long_spoofed`, `long_asked`, `long_honest`: the same with a payload long
//!   enough (over 1,280 bytes) that the server splits the record (its header copied out of the
//!   ring and checked, its payload copied once from the ring where the socket takes it): not
//!   at the next byte expected, from another address, a question that carries bytes (which no
//!   question does), and 45 HTTP requests in one record.
//!
//! The server must refuse every lie (a lie on a connection resets it: its sender would count
//! the bytes as delivered), take the honest ones, and live on. Reports, per kind, the rounds,
//! the resets seen on the round's connection, the answers, and the confirmations.

use super::overrun::{handshake, Peer};
use anyhow::Result;
use docknet_lib::frame::{Record, RecordKind, ETH, RECORD_HEAD};
use docknet_lib::Endpoint;
use serde_json::json;
use smoltcp::wire::{TcpControl, TcpSeqNumber};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

const KINDS: [&str; 15] = [
    "behind",
    "ahead",
    "past_window",
    "no_connection",
    "bad_version",
    "empty",
    "truncated",
    "spoofed",
    "unasked_confirm",
    "asked",
    "honest",
    "long_ahead",
    "long_spoofed",
    "long_asked",
    "long_honest",
];

/// The payload of the `long_` kinds' lies: a record of this many bytes is split on receive.
const LONG: usize = 2000;

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: victim\r\n\r\n";

/// What came back on a round's connection.
#[derive(Default)]
struct Seen {
    resets: u64,
    /// Answer bytes, in segments or records.
    answered: u64,
    /// Confirmations that the server takes records on the connection.
    confirms: u64,
}

pub fn run(ep: Endpoint, to: SocketAddrV4, rounds: u32) -> Result<serde_json::Value> {
    let mut x = (std::process::id() as u64 ^ 0x7ec0_4d5e) | 1;
    let mut peer = Peer::new(ep, to, 40000)?;
    let mut table: BTreeMap<&str, (u64, u64, u64, u64)> = BTreeMap::new();
    let mut opened = 0u64;
    for k in 0..rounds {
        let kind = KINDS[k as usize % KINDS.len()];
        peer.port = 40000 + (k % 20000) as u16;
        let iss = TcpSeqNumber(super::xorshift(&mut x) as i32);
        let Ok(o) = handshake(&mut peer, iss, Duration::from_secs(2)) else {
            continue;
        };
        opened += 1;
        // the server takes records once it has seen a segment without SYN: the ACK above
        let next = iss + 1;
        let me = peer.ep.ip();
        let mut rec = Record {
            src: me,
            dst: *to.ip(),
            src_port: peer.port,
            dst_port: to.port(),
            seq: next.0 as u32,
            kind: RecordKind::Data,
        };
        let mut payload = REQUEST.to_vec();
        let mut head_cut = 0;
        let mut version = None;
        match kind {
            "behind" => rec.seq = (next - 10).0 as u32,
            "ahead" => rec.seq = (next + 5000).0 as u32,
            "past_window" => {
                let window = o.syn_edge - next;
                let room = peer.ep.frame_size().saturating_sub(RECORD_HEAD);
                payload = vec![b'x'; (window + 1).min(room)];
            }
            "no_connection" => rec.src_port = peer.port.wrapping_add(20000),
            "bad_version" => version = Some(9u8),
            "empty" => payload.clear(),
            "truncated" => head_cut = 6,
            "spoofed" => rec.src = Ipv4Addr::from(u32::from(me) ^ 0x0000_00ff),
            "unasked_confirm" | "asked" => {
                payload.clear();
                rec.kind = if kind == "asked" {
                    RecordKind::Ask
                } else {
                    RecordKind::Confirm
                };
            }
            "long_ahead" => {
                rec.seq = (next + 5000).0 as u32;
                payload = vec![b'x'; LONG];
            }
            "long_spoofed" => {
                rec.src = Ipv4Addr::from(u32::from(me) ^ 0x0000_00ff);
                payload = vec![b'x'; LONG];
            }
            "long_asked" => {
                rec.kind = RecordKind::Ask;
                payload = vec![b'x'; LONG];
            }
            "long_honest" => payload = REQUEST.repeat(45),
            _ => {}
        }
        let mut f = rec.head(peer.mac(), peer.ep.mac()).to_vec();
        if let Some(v) = version {
            f[ETH + 16] = v;
        }
        f.truncate(f.len() - head_cut);
        f.extend_from_slice(&payload);
        // (on the channel: the daemon's ring takes no record)
        let (route, _) = peer
            .ep
            .path_to(std::net::IpAddr::V4(*to.ip()), true, f.len());
        let _ = peer.ep.send_parts_on(route, &[&f]);
        peer.ep.flush();
        let seen = watch(&mut peer, Duration::from_millis(150));
        let e = table.entry(kind).or_default();
        e.0 += 1;
        e.1 += seen.resets;
        e.2 += seen.answered;
        e.3 += seen.confirms;
        // this side ends the connection (it was not reset if the record was taken)
        peer.send(TcpControl::Rst, next, None, &[]);
    }
    let kinds: serde_json::Map<String, serde_json::Value> = table
        .iter()
        .map(|(k, (n, resets, answered, confirms))| {
            (
                k.to_string(),
                json!({"rounds": n, "resets": resets, "answered": answered,
                       "confirms": confirms}),
            )
        })
        .collect();
    Ok(json!({"attack": "lying-records", "opened": opened, "kinds": kinds}))
}

/// What the server sends on the peer's connection within `within`: resets, and answer bytes
/// (segments' payload or records').
fn watch(peer: &mut Peer, within: Duration) -> Seen {
    let mut seen = Seen::default();
    let until = Instant::now() + within;
    let mut buf = vec![0u8; peer.ep.frame_size()];
    while Instant::now() < until {
        let Some((n, _)) = peer.ep.recv(&mut buf) else {
            peer.ep.idle(Duration::from_millis(1));
            continue;
        };
        let f = &buf[..n];
        if let Some(r) = Record::parse(f) {
            if r.dst_port == peer.port {
                seen.answered += (n - RECORD_HEAD) as u64;
                seen.confirms += u64::from(r.kind == RecordKind::Confirm);
            }
            continue;
        }
        if let Some(s) = peer.parse(f) {
            if s.control == TcpControl::Rst {
                seen.resets += 1;
            }
            seen.answered += s.payload as u64;
        }
    }
    seen
}
