//! The raw-frame benchmark peer (`docknet raw peer`), run inside a DockNet container. It carries the
//! same timestamps as `dnperf`, so their one-way latencies compare directly:
//!
//! ```text
//!  payload (after the Ethernet and IPv4 headers)
//!  +0 magic u8 = 0xD7 | +1 kind u8 | +2 session u16 | +4 seq u32 | +8 t0 u64 | +16 t1 u64 |
//!  Servers follow the session of the newest data frame and honour only that session's STOP
//!  (frames of an earlier run may still sit in a ring).
//!  t0 = client's CLOCK_MONOTONIC at send, t1 = server's at receipt; the client reads t2 on
//!  the reply: one-way samples are t1 - t0 and t2 - t1.
//! ```

use crate::stats::{cpu_seconds, histogram, now_ns, Summary, Window};
use anyhow::{bail, Context, Result};
use docknet_lib::frame::{write_ipv4_headers, ETH, IPV4, PROTO_EXPERIMENT};
use docknet_lib::{Endpoint, SendError, Via};
use docknet_pipe::IdlePolicy;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const MAGIC: u8 = 0xD7;
const DATA: u8 = 1;
const STOP: u8 = 2;
const WARM: u8 = 3;
/// Bytes of the benchmark header inside the payload.
pub const HDR: usize = 24;
/// Smallest raw frame the benchmark sends.
pub const MIN_RAW: usize = ETH + IPV4 + HDR;

#[derive(Debug, Clone, Copy)]
struct Hdr {
    kind: u8,
    session: u16,
    seq: u32,
    t0: u64,
    t1: u64,
}

fn put(b: &mut [u8], h: Hdr) {
    b[0] = MAGIC;
    b[1] = h.kind;
    b[2..4].copy_from_slice(&h.session.to_le_bytes());
    b[4..8].copy_from_slice(&h.seq.to_le_bytes());
    b[8..16].copy_from_slice(&h.t0.to_le_bytes());
    b[16..24].copy_from_slice(&h.t1.to_le_bytes());
}

fn get(b: &[u8]) -> Option<Hdr> {
    if b.len() < HDR || b[0] != MAGIC {
        return None;
    }
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    Some(Hdr {
        kind: b[1],
        session: u16::from_le_bytes([b[2], b[3]]),
        seq: u32::from_le_bytes(b[4..8].try_into().unwrap_or([0; 4])),
        t0: u64_at(8),
        t1: u64_at(16),
    })
}

/// A random non-zero session id.
fn new_session() -> u16 {
    let x = now_ns() ^ u64::from(std::process::id()).rotate_left(32);
    ((x ^ (x >> 16) ^ (x >> 32)) as u16).max(1)
}

/// Whether a server should act on a frame. Data frames define the session (the newest client
/// wins; a sink restarts its count when the session changes); a STOP counts only for the
/// current session, so STOPs left in a ring by an earlier run are ignored.
fn same_session(h: &Hdr, session: &mut Option<u16>) -> bool {
    if h.kind == STOP {
        *session == Some(h.session)
    } else {
        *session = Some(h.session);
        true
    }
}

/// Size and timing, shared by both peer commands.
#[derive(Debug, Clone, clap::Args)]
pub struct Timing {
    /// Raw peers: whole frame size in bytes, Ethernet header included. TCP peers: message size.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 3.0)]
    pub duration: f64,
    /// Seconds before measuring starts.
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
}

/// Options of `raw peer`.
#[derive(Debug, Clone, clap::Args)]
pub struct PeerArgs {
    /// echo | sink (servers); rr | stream (clients).
    #[arg(long)]
    pub role: String,
    /// Server's address (clients).
    #[arg(long)]
    pub dst: Option<Ipv4Addr>,
    #[command(flatten)]
    pub t: Timing,
    /// Idle policy while waiting: spin, adaptive, adaptive:SPIN_US, or block.
    #[arg(long, default_value = "spin", value_parser = IdlePolicy::parse)]
    pub idle: IdlePolicy,
    /// Servers exit after this many seconds without traffic (once traffic has started), or
    /// twice this long if none ever comes.
    #[arg(long, default_value_t = 10.0)]
    pub quiet_exit: f64,
}

/// Frames counted by the path they took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViaCounts {
    /// Through a fast channel.
    pub fc: u64,
    /// Through the daemon.
    pub daemon: u64,
}

impl ViaCounts {
    fn of(fc: u64, daemon: u64) -> ViaCounts {
        ViaCounts { fc, daemon }
    }
}

/// What a raw peer prints: one JSON line, tagged by its role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum RawOutcome {
    /// Echo server.
    Echo {
        /// Frames echoed.
        echoed: u64,
        /// Frames received, by path.
        rx_via: ViaCounts,
        /// Refused descriptors and impossible indices seen.
        bad_desc: u64,
    },
    /// Sink server.
    Sink {
        /// Data frames received in the measured session.
        frames: u64,
        /// Their bytes.
        bytes: u64,
        /// Seconds between the first and the last.
        secs: f64,
        /// Goodput.
        gbps: f64,
        /// Million frames per second.
        mpps: f64,
        /// Frames the client says it sent (from its STOP), if one came.
        sent: Option<u64>,
        /// Frames received, by path.
        rx_via: ViaCounts,
        /// Refused descriptors and impossible indices seen.
        bad_desc: u64,
    },
    /// Ping-pong client.
    Rr {
        /// Frame size.
        size: usize,
        /// Transactions measured.
        transactions: u64,
        /// Per second.
        tps: f64,
        /// One-way latency (both directions' samples).
        one_way_ns: Summary,
        /// RTT / 2.
        half_rtt_ns: Summary,
        /// Replies received, by path.
        rx_via: ViaCounts,
        /// Transactions given up after 1 s.
        lost: u64,
        /// CPU seconds per transaction.
        cpu_s_per_op: f64,
        /// Idle policy.
        idle: String,
        /// Refused descriptors and impossible indices seen.
        bad_desc: u64,
    },
    /// Streaming client.
    Stream {
        /// Frame size.
        size: usize,
        /// Data frames sent.
        sent: u64,
        /// Their bytes.
        sent_bytes: u64,
        /// Measured seconds.
        secs: f64,
        /// Sends refused by a full ring (retried).
        full_retries: u64,
        /// Frames sent, by path.
        tx_via: ViaCounts,
        /// CPU seconds per frame.
        cpu_s_per_op: f64,
    },
}

/// `docknet raw peer`: runs one role and prints one JSON line ([`RawOutcome`]).
pub fn raw_peer(a: &PeerArgs) -> Result<()> {
    let mut ep = Endpoint::attach_default(a.idle)?;
    if matches!(a.role.as_str(), "echo" | "sink") {
        // frames left in the rings by an earlier run are not for this server
        let _stale = ep.drain();
    }
    let out = match a.role.as_str() {
        "echo" => raw_echo(&mut ep, a)?,
        "sink" => raw_sink(&mut ep, a)?,
        "rr" => raw_rr(&mut ep, a)?,
        "stream" => raw_stream(&mut ep, a)?,
        r => bail!("unknown role {r:?}: use echo, sink, rr or stream"),
    };
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

fn quiet_deadline(a: &PeerArgs, started: bool) -> Duration {
    Duration::from_secs_f64(if started {
        a.quiet_exit
    } else {
        a.quiet_exit * 2.0
    })
}

/// The receive loop both raw servers share: waits (per the idle policy) for the next benchmark
/// frame of the current session; `None` once nothing came for the quiet period.
struct ServerLoop {
    last: Instant,
    started: bool,
    session: Option<u16>,
}

/// A frame handed to a server: its length, header, receipt time, and whether it opened a new
/// session.
struct Arrival {
    len: usize,
    hdr: Hdr,
    at_ns: u64,
    new_session: bool,
}

impl ServerLoop {
    fn new() -> ServerLoop {
        ServerLoop {
            last: Instant::now(),
            started: false,
            session: None,
        }
    }

    fn next(&mut self, ep: &mut Endpoint, buf: &mut [u8], a: &PeerArgs) -> Option<Arrival> {
        loop {
            let Some((n, _)) = ep.recv(buf) else {
                if self.last.elapsed() > quiet_deadline(a, self.started) {
                    return None;
                }
                ep.idle(Duration::from_millis(50));
                continue;
            };
            let at_ns = now_ns();
            ep.busy();
            self.last = Instant::now();
            let Some(hdr) = (n >= MIN_RAW).then(|| get(&buf[ETH + IPV4..n])).flatten() else {
                continue;
            };
            let before = self.session;
            if !same_session(&hdr, &mut self.session) {
                continue;
            }
            self.started = true;
            return Some(Arrival {
                len: n,
                hdr,
                at_ns,
                new_session: before.is_some() && before != self.session,
            });
        }
    }
}

fn raw_echo(ep: &mut Endpoint, a: &PeerArgs) -> Result<RawOutcome> {
    let mut buf = vec![0u8; 65600];
    let mut echoed = 0u64;
    let mut srv = ServerLoop::new();
    while let Some(Arrival {
        len: n,
        hdr: mut h,
        at_ns,
        ..
    }) = srv.next(ep, &mut buf, a)
    {
        if h.kind == STOP {
            break;
        }
        h.t1 = at_ns;
        put(&mut buf[ETH + IPV4..], h);
        // swap Ethernet and IPv4 addresses (the IPv4 checksum is unchanged by the swap)
        let f = &mut buf[..n];
        for i in 0..6 {
            f.swap(i, 6 + i);
        }
        for i in 0..4 {
            f.swap(ETH + 12 + i, ETH + 16 + i);
        }
        if ep.send(f).is_ok() {
            ep.flush();
        } else {
            ep.send_blocking(f, Instant::now() + Duration::from_secs(1))
                .context("echoing a frame")?;
        }
        echoed += 1;
    }
    let s = ep.stats();
    Ok(RawOutcome::Echo {
        echoed,
        rx_via: ViaCounts::of(s.rx_fc, s.rx_daemon),
        bad_desc: s.bad_desc,
    })
}

fn raw_sink(ep: &mut Endpoint, a: &PeerArgs) -> Result<RawOutcome> {
    let mut buf = vec![0u8; 65600];
    let (mut frames, mut bytes, mut first, mut last_ns) = (0u64, 0u64, 0u64, 0u64);
    let mut announced = None;
    let mut srv = ServerLoop::new();
    while let Some(arr) = srv.next(ep, &mut buf, a) {
        if arr.new_session {
            (frames, bytes, first, last_ns) = (0, 0, 0, 0);
        }
        match arr.hdr.kind {
            DATA => {
                if first == 0 {
                    first = arr.at_ns;
                }
                last_ns = arr.at_ns;
                frames += 1;
                bytes += arr.len as u64;
            }
            STOP => {
                announced = Some(arr.hdr.t0);
                break;
            }
            _ => {}
        }
    }
    let secs = (last_ns.saturating_sub(first)) as f64 / 1e9;
    let s = ep.stats();
    let per_s = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
    Ok(RawOutcome::Sink {
        frames,
        bytes,
        secs,
        gbps: per_s(bytes as f64 * 8.0 / 1e9),
        mpps: per_s(frames as f64 / 1e6),
        sent: announced,
        rx_via: ViaCounts::of(s.rx_fc, s.rx_daemon),
        bad_desc: s.bad_desc,
    })
}

fn client_frame(ep: &mut Endpoint, a: &PeerArgs) -> Result<(Vec<u8>, Ipv4Addr)> {
    let dst = a.dst.context("--dst is required for client roles")?;
    if a.t.size < MIN_RAW {
        bail!("--size must be at least {MIN_RAW} bytes for raw frames");
    }
    let max = ep
        .fc_peers()
        .iter()
        .find(|(ip, _)| *ip == dst)
        .map_or(ep.frame_size(), |(_, f)| *f)
        .max(ep.frame_size());
    if a.t.size > max {
        bail!(
            "--size {} exceeds the largest frame this path carries ({max})",
            a.t.size
        );
    }
    let mac = ep
        .resolve(dst, Duration::from_secs(3))
        .with_context(|| format!("no ARP answer for {dst}: is a pipe with that address up?"))?;
    let mut f = vec![0u8; a.t.size];
    write_ipv4_headers(
        &mut f,
        ep.mac(),
        mac,
        ep.ip(),
        dst,
        PROTO_EXPERIMENT,
        a.t.size,
    );
    Ok((f, dst))
}

fn stop(ep: &mut Endpoint, f: &mut [u8], session: u16, count: u64) {
    for _ in 0..3 {
        put(
            &mut f[ETH + IPV4..],
            Hdr {
                kind: STOP,
                session,
                seq: 0,
                t0: count,
                t1: 0,
            },
        );
        let _ = ep.send_blocking(f, Instant::now() + Duration::from_millis(200));
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn raw_rr(ep: &mut Endpoint, a: &PeerArgs) -> Result<RawOutcome> {
    let (mut f, _) = client_frame(ep, a)?;
    let session = new_session();
    let mut rbuf = vec![0u8; 65600];
    let (mut one_way, mut half_rtt) = (histogram(), histogram());
    let (mut via_fc, mut via_daemon, mut lost, mut seq) = (0u64, 0u64, 0u64, 0u32);
    let mut win = Window::new(
        Duration::from_secs_f64(a.t.warmup),
        Duration::from_secs_f64(a.t.duration),
    );
    loop {
        let now = Instant::now();
        let Some(measuring) = win.tick_at(now) else {
            break;
        };
        seq = seq.wrapping_add(1);
        let t0 = now_ns();
        put(
            &mut f[ETH + IPV4..],
            Hdr {
                kind: DATA,
                session,
                seq,
                t0,
                t1: 0,
            },
        );
        ep.send_blocking(&f, now + Duration::from_secs(1))
            .context("sending")?;
        let give_up = Instant::now() + Duration::from_secs(1);
        let mut polls = 0u32;
        loop {
            match ep.recv(&mut rbuf) {
                Some((n, via)) => {
                    let t2 = now_ns();
                    ep.busy();
                    let Some(h) = (n >= MIN_RAW).then(|| get(&rbuf[ETH + IPV4..n])).flatten()
                    else {
                        continue;
                    };
                    if h.seq != seq || h.session != session {
                        continue;
                    }
                    if measuring {
                        let _ = one_way.record(h.t1.saturating_sub(t0).max(1));
                        let _ = one_way.record(t2.saturating_sub(h.t1).max(1));
                        let _ = half_rtt.record((t2.saturating_sub(t0) / 2).max(1));
                        match via {
                            Via::FastChannel => via_fc += 1,
                            Via::Daemon => via_daemon += 1,
                        }
                    }
                    break;
                }
                None => {
                    polls = polls.wrapping_add(1);
                    // reading the clock costs ~30 ns: check the deadline now and then
                    if polls.is_multiple_of(1024) && Instant::now() > give_up {
                        lost += 1;
                        break;
                    }
                    ep.idle(Duration::from_millis(10));
                }
            }
        }
    }
    let cpu = win.cpu();
    stop(ep, &mut f, session, 0);
    let n = half_rtt.len();
    Ok(RawOutcome::Rr {
        size: a.t.size,
        transactions: n,
        tps: n as f64 / a.t.duration,
        one_way_ns: Summary::of(&one_way),
        half_rtt_ns: Summary::of(&half_rtt),
        rx_via: ViaCounts::of(via_fc, via_daemon),
        lost,
        cpu_s_per_op: if n > 0 { cpu / n as f64 } else { 0.0 },
        idle: a.idle.to_string(),
        bad_desc: ep.stats().bad_desc,
    })
}

fn raw_stream(ep: &mut Endpoint, a: &PeerArgs) -> Result<RawOutcome> {
    let (mut f, _) = client_frame(ep, a)?;
    let session = new_session();
    let start = Instant::now();
    let warm_end = start + Duration::from_secs_f64(a.t.warmup);
    let end = warm_end + Duration::from_secs_f64(a.t.duration);
    let (mut sent, mut full, mut seq) = (0u64, 0u64, 0u32);
    let (mut via_fc, mut via_daemon) = (0u64, 0u64);
    let mut cpu0 = None;
    let mut now = Instant::now();
    while now < end {
        let kind = if now >= warm_end { DATA } else { WARM };
        if kind == DATA && cpu0.is_none() {
            cpu0 = Some(cpu_seconds());
        }
        // 32 frames between clock reads and publications
        for _ in 0..32 {
            seq = seq.wrapping_add(1);
            put(
                &mut f[ETH + IPV4..],
                Hdr {
                    kind,
                    session,
                    seq,
                    t0: 0,
                    t1: 0,
                },
            );
            match ep.send(&f) {
                Ok(via) => {
                    if kind == DATA {
                        sent += 1;
                        match via {
                            Via::FastChannel => via_fc += 1,
                            Via::Daemon => via_daemon += 1,
                        }
                    }
                }
                Err(SendError::Full) => {
                    full += 1;
                    ep.flush();
                    ep.idle(Duration::from_millis(1));
                }
                Err(e) => bail!("sending: {e}"),
            }
        }
        ep.flush();
        now = Instant::now();
    }
    let cpu = cpu_seconds() - cpu0.unwrap_or(0.0);
    std::thread::sleep(Duration::from_millis(20));
    stop(ep, &mut f, session, sent);
    Ok(RawOutcome::Stream {
        size: a.t.size,
        sent,
        sent_bytes: sent * a.t.size as u64,
        secs: a.t.duration,
        full_retries: full,
        tx_via: ViaCounts::of(via_fc, via_daemon),
        cpu_s_per_op: if sent > 0 { cpu / sent as f64 } else { 0.0 },
    })
}
