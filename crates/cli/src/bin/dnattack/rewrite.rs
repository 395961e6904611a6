//! `dnattack channel-rewrite`: a fast-channel partner that rewrites its frames after it
//! published them, while its partner reads them. It opens TCP connections to a DockLib server
//! over the channel, by hand (as `window-overrun` does), and streams segments of requests into
//! each; a second thread, holding a mapping of the channel of its own (from a second
//! connection to the pipe's socket, which any process of the container may make), rewrites
//! random bytes of the last frames this side published, headers and payload alike, as fast as
//! it can. The partner copies a segment's headers once into memory of its own and checks them
//! there, and its payload once, where it goes: a rewrite can change only what this container
//! says to it. With `--their-frames` the thread instead writes random bytes where the server
//! writes its frames to this side (its answers and acknowledgements), while it writes them:
//! the server builds a frame's headers in its own memory and copies them and the payload (from
//! its send buffer) into the ring, and never reads the ring back, so that changes only what
//! this container receives. The server must live on and serve everyone else.

use crate::overrun::{handshake, Peer};
use crate::xorshift;
use anyhow::{bail, Context, Result};
use docknet_lib::Endpoint;
use docknet_pipe::delivery::{Msg, Side, MAX_MSG};
use docknet_pipe::layout::{plan, RingLayout, RingParams, DESC_LEN, DESC_OFFSET};
use docknet_pipe::{fdpass, Region};
use serde_json::json;
use smoltcp::wire::{TcpControl, TcpSeqNumber};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What each connection sends: requests, pipelined, without end.
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: victim\r\n\r\n";
/// Segments sent beyond the last one acknowledged, at most.
const AHEAD: usize = 16;
/// How long one connection streams before it is reset and the next opened.
const PER_CONNECTION: Duration = Duration::from_millis(300);

pub fn run(
    ep: Endpoint,
    name: &str,
    to: SocketAddrV4,
    seconds: f64,
    their_frames: bool,
) -> Result<serde_json::Value> {
    let mut x = std::process::id() as u64 ^ 0x51ed_2701_f3a5_c9b1;
    let mut peer = Peer::new(ep, to, 0)?;
    let (region, [ring, theirs], _conn) = channel_to(name, *to.ip())?;
    let theirs = their_frames.then_some(theirs);
    let (stop, rewrites, their_writes) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    // rewriting while a connection streams: a handshake's frames are left alone, or few would
    // be opened
    let streaming = Arc::new(AtomicBool::new(false));
    let scribbler = {
        let (stop, streaming, seed) = (stop.clone(), streaming.clone(), x);
        let counts = [rewrites.clone(), their_writes.clone()];
        std::thread::spawn(move || {
            scribble(&region, ring, theirs, &stop, &streaming, &counts, seed)
        })
    };
    let (mut connections, mut refused, mut resets, mut payload) = (0u64, 0u64, 0u64, 0u64);
    // the server's segments with a payload (its answers) that came through, and their bytes
    let (mut answers, mut answer_bytes) = (0u64, 0u64);
    let mut longest = 0;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut bytes = Vec::new();
    while Instant::now() < end {
        peer.port = 20000 + (xorshift(&mut x) % 40000) as u16;
        let iss = TcpSeqNumber(xorshift(&mut x) as i32);
        let Ok(o) = handshake(&mut peer, iss, Duration::from_secs(1)) else {
            // a rewritten SYN, or its answer lost: another port
            refused += 1;
            continue;
        };
        connections += 1;
        streaming.store(true, Ordering::Relaxed);
        let ack = Some(o.irs + 1);
        // as long as the path takes (the server's MSS), up to 1,400 bytes: a channel's frame
        // of more than 1,280 bytes is split by its reader
        let seg = usize::from(o.mss).clamp(600, 1400);
        longest = longest.max(seg);
        let (start, mut una, mut nxt) = (iss + 1, iss + 1, iss + 1);
        let (opened, mut progress) = (Instant::now(), Instant::now());
        'conn: while opened.elapsed() < PER_CONNECTION && Instant::now() < end {
            while let Some(g) = peer.recv() {
                answers += u64::from(g.payload > 0);
                answer_bytes += g.payload as u64;
                if g.control == TcpControl::Rst {
                    resets += 1;
                    break 'conn;
                }
                if let Some(a) = g.ack {
                    if a > una && a <= nxt {
                        una = a;
                        progress = Instant::now();
                    }
                }
            }
            if progress.elapsed() > Duration::from_millis(20) {
                // nothing acknowledged for a while: again from what was
                nxt = una;
                progress = Instant::now();
            }
            while nxt < una + AHEAD * seg {
                bytes.clear();
                let from = nxt - start;
                bytes.extend((from..from + seg).map(|k| REQUEST[k % REQUEST.len()]));
                peer.send(TcpControl::Psh, nxt, ack, &bytes);
                payload += seg as u64;
                nxt += seg;
            }
            peer.ep.idle(Duration::from_micros(100));
        }
        streaming.store(false, Ordering::Relaxed);
        peer.send(TcpControl::Rst, nxt, None, &[]);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = scribbler.join();
    if connections == 0 {
        bail!("no connection to {to} was opened ({refused} tries)");
    }
    Ok(json!({
        "attack": "channel-rewrite",
        "connections": connections,
        "failed_handshakes": refused,
        "resets": resets,
        "segments": peer.sent,
        "payload_bytes": payload,
        "segment_payload": longest,
        "rewrites": rewrites.load(Ordering::Relaxed),
        "their_writes": their_writes.load(Ordering::Relaxed),
        "answer_segments": answers,
        "answer_bytes": answer_bytes,
    }))
}

/// The channel to `ip`, mapped from a connection of its own to the pipe's socket: the region,
/// the ring this side produces on and the one the partner produces on, and the connection
/// (kept open while the mapping is used).
fn channel_to(name: &str, ip: Ipv4Addr) -> Result<(Region, [RingLayout; 2], OwnedFd)> {
    let conn = fdpass::connect_abstract(name).with_context(|| format!("connecting to @{name}"))?;
    let mut buf = [0u8; MAX_MSG];
    loop {
        let (n, fd) = fdpass::recv(conn.as_fd(), &mut buf)?.context("the daemon hung up")?;
        match Msg::decode(&buf[..n])? {
            Msg::Channel(c) if c.peer_ip == ip => {
                let p = RingParams::for_mtu(c.mtu, Some(c.depth))?;
                let (rings, size) = plan([p, p])?;
                let fd = fd.context("a channel without its memfd")?;
                let region = Region::map_sealed(fd.as_fd(), size)?;
                let [a, b] = rings;
                let ours = if c.side == Side::A { [a, b] } else { [b, a] };
                return Ok((region, ours, conn));
            }
            Msg::Synced => bail!("no fast channel to {ip}"),
            _ => {}
        }
    }
}

/// Rewrites each of the last four frames published on `ring`, over and over while
/// `streaming`, until `stop`: half the time a length a reader checks (the IPv4 total length or
/// the TCP data offset), made to lie and put back on alternate visits, else one random byte
/// of the headers (the first 74) or of the frame. With `theirs` (the ring the partner
/// produces on), each pass instead writes a random byte where the partner's next frame goes:
/// just past the last frame it published, or at the front of the area, where a producer
/// starts again once its consumer took everything, tens of thousands of times a second.
/// Counts go to `counts` (rewrites, writes into the partner's frames).
fn scribble(
    region: &Region,
    ring: RingLayout,
    theirs: Option<RingLayout>,
    stop: &AtomicBool,
    streaming: &AtomicBool,
    counts: &[Arc<AtomicU64>; 2],
    seed: u64,
) {
    let mut x = seed | 1;
    // what each length was before it lied, by the frame's place and the field
    let mut truth = vec![[[0u8; 2]; 2]; 4096];
    while !stop.load(Ordering::Relaxed) {
        if !streaming.load(Ordering::Relaxed) {
            std::thread::yield_now();
            continue;
        }
        let prod = region.load_u32(ring.prod_off(), Ordering::Acquire);
        for k in (1..=4u32).filter(|_| theirs.is_none()) {
            let d = ring.desc_off(prod.wrapping_sub(k));
            let off = region.load_u32(d + DESC_OFFSET, Ordering::Relaxed) as usize;
            let len = region.load_u32(d + DESC_LEN, Ordering::Relaxed) as usize;
            if len == 0 || off + len > ring.area_len {
                continue;
            }
            let (f, r) = (ring.area + off, xorshift(&mut x));
            let done = match r % 4 {
                // a length a reader checks, lying on every other pass and true on the next:
                // the IPv4 total length (bytes 16 and 17) or the TCP data offset (byte 46)
                0 | 1 if len > 64 => {
                    let (field, at) = if r % 4 == 0 { (0, 16) } else { (1, 46) };
                    let slot = (off / 64) % truth.len();
                    let was = &mut truth[slot][field];
                    let mut now = [0u8; 2];
                    region.read(f + at, &mut now);
                    if now == [0xff, 0xff] {
                        region.write(f + at, was)
                    } else {
                        *was = now;
                        region.write(f + at, &[0xff, 0xff])
                    }
                }
                // any header byte, or any byte
                2 => region.write(f + (r >> 8) as usize % len.min(74), &[(r >> 32) as u8]),
                _ => region.write(f + (r >> 8) as usize % len, &[(r >> 32) as u8]),
            };
            if done {
                counts[0].fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(t) = theirs {
            let r = xorshift(&mut x);
            let at = if r.is_multiple_of(2) {
                let prod = region.load_u32(t.prod_off(), Ordering::Acquire);
                let d = t.desc_off(prod.wrapping_sub(1));
                let off = region.load_u32(d + DESC_OFFSET, Ordering::Relaxed) as usize;
                let len = region.load_u32(d + DESC_LEN, Ordering::Relaxed) as usize;
                off.saturating_add(len)
                    .saturating_add((r >> 8) as usize % 4096)
            } else {
                (r >> 8) as usize % 32768
            };
            if at < t.area_len && region.write(t.area + at, &[(r >> 32) as u8]) {
                counts[1].fetch_add(1, Ordering::Relaxed);
            }
            // paced: written over without pause, nearly every answer and acknowledgement
            // this side reads was garbled, and its connections barely moved
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}
