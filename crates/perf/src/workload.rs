//! The workloads, written once over [`Net`].

use crate::net::{Datagram, Net};
use crate::stats::{buckets, cpu_seconds, histogram, now_ns, Summary, Window};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Bytes of the ping-pong header inside a message.
pub const RR_HDR: usize = 24;

/// What a client measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Ping-pong of fixed-size messages.
    Rr,
    /// One-way stream of fixed-size writes.
    Stream,
    /// A checked stream: `--bytes` of a known pattern, every byte verified by the receiver.
    Check,
}

/// Result of a client run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// rr: transactions completed while measuring.
    pub transactions: u64,
    /// rr: per second.
    pub tps: f64,
    /// rr: one-way latency (both directions' samples).
    pub one_way_ns: Option<Summary>,
    /// rr: RTT / 2.
    pub half_rtt_ns: Option<Summary>,
    /// rr: the one-way histogram as `[value_ns, count]` buckets, so runs can be merged and
    /// plotted as a CDF (percentiles of several runs come from the merged histogram, never
    /// from averaged percentiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_way_hist: Option<Vec<[u64; 2]>>,
    /// rr: the RTT/2 histogram as `[value_ns, count]` buckets (round trips, halved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_rtt_hist: Option<Vec<[u64; 2]>>,
    /// rr with a pause between transactions: the request's one-way latency alone (the first
    /// packet after the pause; the reply finds the path awake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_ns: Option<Summary>,
    /// stream: goodput at the receiver.
    pub gbps: Option<f64>,
    /// stream: messages per second at the receiver.
    pub msgs_per_s: Option<f64>,
    /// stream: bytes the receiver got.
    pub bytes: Option<u64>,
    /// checked stream: bytes the receiver found wrong or missing (0 when all arrived intact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrupt_bytes: Option<u64>,
    /// CPU seconds of this process per operation (transaction or message).
    pub cpu_s_per_op: f64,
    /// With a start time: how late the client was ready for it, in milliseconds (0: on time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_ms: Option<f64>,
}

impl Outcome {
    /// A ping-pong result from its histograms (one-way samples, RTT/2 per transaction), the
    /// CPU seconds used while measuring and the measured duration.
    fn rr(
        one_way: &hdrhistogram::Histogram<u64>,
        half: &hdrhistogram::Histogram<u64>,
        cpu: f64,
        duration: Duration,
    ) -> Outcome {
        let n = half.len();
        Outcome {
            transactions: n,
            tps: n as f64 / duration.as_secs_f64(),
            one_way_ns: Some(Summary::of(one_way)),
            half_rtt_ns: Some(Summary::of(half)),
            one_way_hist: Some(buckets(one_way)),
            half_rtt_hist: Some(buckets(half)),
            cpu_s_per_op: if n > 0 { cpu / n as f64 } else { 0.0 },
            ..Outcome::default()
        }
    }
}

/// Serves measurement connections on `addr`, each on its own thread; returns after `conns`
/// connections have finished (0: never).
pub fn serve<N: Net>(net: &N, addr: SocketAddr, conns: usize) -> Result<u64> {
    let mut l = net
        .listen(addr)
        .with_context(|| format!("listening on {addr}"))?;
    let mut handles = Vec::new();
    let mut n = 0usize;
    loop {
        let s = net.accept(&mut l).context("accepting")?;
        let net2 = net.clone();
        handles.push(std::thread::spawn(move || serve_one(&net2, s)));
        n += 1;
        if conns != 0 && n >= conns {
            break;
        }
    }
    let mut total = 0;
    for h in handles {
        total += h
            .join()
            .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    }
    Ok(total)
}

fn serve_one<N: Net>(_net: &N, mut s: N::Stream) -> Result<u64> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).context("reading the mode")?;
    let size = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let warmup_ns = u64::from(u32::from_le_bytes([head[5], head[6], head[7], head[8]])) * 1_000_000;
    if !(RR_HDR..=64 << 20).contains(&size) {
        bail!("message size {size} out of range");
    }
    match head[0] {
        b'r' => {
            let mut m = vec![0u8; size];
            let mut n = 0;
            while s.read_exact(&mut m).is_ok() {
                m[16..24].copy_from_slice(&now_ns().to_le_bytes());
                s.write_all(&m)?;
                n += 1;
            }
            Ok(n)
        }
        b's' => {
            let mut buf = vec![0u8; size.max(64 * 1024)];
            // count from the end of the client's warm-up (measured from the first byte)
            let (mut bytes, mut start, mut first, mut last) = (0u64, 0u64, 0u64, 0u64);
            loop {
                let k = s.read(&mut buf)?;
                if k == 0 {
                    break;
                }
                let now = now_ns();
                if start == 0 {
                    start = now;
                }
                if now.saturating_sub(start) < warmup_ns {
                    continue;
                }
                last = now;
                if first == 0 {
                    first = now;
                } else {
                    bytes += k as u64;
                }
            }
            let mut rep = [0u8; 16];
            rep[..8].copy_from_slice(&bytes.to_le_bytes());
            rep[8..].copy_from_slice(&last.saturating_sub(first).to_le_bytes());
            s.write_all(&rep)?;
            Ok(bytes)
        }
        b'v' => {
            // a checked stream: every byte against the pattern, in order
            let mut buf = vec![0u8; size.max(64 * 1024)];
            let (mut at, mut bad) = (0u64, 0u64);
            let t0 = now_ns();
            loop {
                let k = s.read(&mut buf)?;
                if k == 0 {
                    break;
                }
                bad += mismatches(&buf[..k], at);
                at += k as u64;
            }
            let mut rep = [0u8; 24];
            rep[..8].copy_from_slice(&at.to_le_bytes());
            rep[8..16].copy_from_slice(&now_ns().saturating_sub(t0).to_le_bytes());
            rep[16..].copy_from_slice(&bad.to_le_bytes());
            s.write_all(&rep)?;
            Ok(at)
        }
        m => bail!("unknown mode byte {m:#x}"),
    }
}

/// Period of the checked stream's byte pattern (a prime, so it never lines up with a write
/// size).
const PATTERN: usize = 65521;

/// The checked stream's pattern, one period.
fn pattern() -> &'static [u8] {
    static P: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        (0..PATTERN)
            .map(|i| ((i as u64).wrapping_mul(2654435761) >> 13) as u8)
            .collect()
    })
}

/// Fills `m` with the pattern from stream offset `at`.
fn fill_pattern(m: &mut [u8], at: u64) {
    let p = pattern();
    let mut o = (at % PATTERN as u64) as usize;
    let mut i = 0;
    while i < m.len() {
        let n = (m.len() - i).min(PATTERN - o);
        m[i..i + n].copy_from_slice(&p[o..o + n]);
        (i, o) = (i + n, 0);
    }
}

/// Bytes of `b` (at stream offset `at`) that differ from the pattern.
fn mismatches(b: &[u8], at: u64) -> u64 {
    let p = pattern();
    let mut o = (at % PATTERN as u64) as usize;
    let (mut i, mut bad) = (0, 0u64);
    while i < b.len() {
        let n = (b.len() - i).min(PATTERN - o);
        if b[i..i + n] != p[o..o + n] {
            bad += b[i..i + n]
                .iter()
                .zip(&p[o..o + n])
                .filter(|(x, y)| x != y)
                .count() as u64;
        }
        (i, o) = (i + n, 0);
    }
    bad
}

/// A checked stream: `total` bytes of the pattern in writes of `size`; returns the bytes and
/// mismatches the receiver counted.
pub fn checked<N: Net>(net: &N, addr: SocketAddr, size: usize, total: u64) -> Result<Outcome> {
    let mut s = net
        .connect(addr, false)
        .with_context(|| format!("connecting to {addr}"))?;
    let mut head = [0u8; 9];
    head[0] = b'v';
    head[1..5].copy_from_slice(&(size.max(RR_HDR) as u32).to_le_bytes());
    s.write_all(&head)?;
    let mut m = vec![0u8; size.max(1)];
    let cpu0 = cpu_seconds();
    let mut sent = 0u64;
    while sent < total {
        let k = m.len().min((total - sent) as usize);
        fill_pattern(&mut m[..k], sent);
        s.write_all(&m[..k])?;
        sent += k as u64;
    }
    net.shutdown_write(&mut s)?;
    let mut rep = [0u8; 24];
    s.read_exact(&mut rep)
        .context("reading the receiver's report")?;
    let got = u64::from_le_bytes(rep[..8].try_into().unwrap_or([0; 8]));
    let ns = u64::from_le_bytes(rep[8..16].try_into().unwrap_or([0; 8])).max(1);
    let bad = u64::from_le_bytes(rep[16..].try_into().unwrap_or([0; 8]));
    Ok(Outcome {
        gbps: Some(got as f64 * 8.0 / ns as f64),
        bytes: Some(got),
        corrupt_bytes: Some(bad + sent.abs_diff(got)),
        cpu_s_per_op: (cpu_seconds() - cpu0) / (sent / size.max(1) as u64).max(1) as f64,
        ..Outcome::default()
    })
}

/// When a client measures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pace {
    /// Measured time.
    pub duration: Duration,
    /// Time before measuring (excluded).
    pub warmup: Duration,
    /// rr: a pause between transactions (zero: none), so each one finds both ends (and the
    /// network between them) idle.
    pub interval: Duration,
    /// Begin (warm-up first) at this CLOCK_MONOTONIC time in nanoseconds, after connecting:
    /// clients started one after another then measure together.
    pub start_at: Option<u64>,
}

/// Runs a client: connects, waits for `pace.start_at` if given, then warms up and measures.
// (never inlined: scripts/instructions.sh counts what runs inside it)
#[inline(never)]
pub fn client<N: Net>(
    net: &N,
    addr: SocketAddr,
    workload: Workload,
    size: usize,
    pace: Pace,
) -> Result<Outcome> {
    let Pace {
        duration,
        warmup,
        interval,
        start_at,
    } = pace;
    if size < RR_HDR && workload == Workload::Rr {
        bail!("--size must be at least {RR_HDR} for rr");
    }
    if workload == Workload::Check {
        bail!("a checked stream is run by workload::checked");
    }
    let mut s = net
        .connect(addr, workload == Workload::Rr)
        .with_context(|| format!("connecting to {addr}"))?;
    let late_ms = start_at.map(wait_until);
    let mut head = [0u8; 9];
    head[0] = if workload == Workload::Rr { b'r' } else { b's' };
    head[1..5].copy_from_slice(&(size.max(RR_HDR) as u32).to_le_bytes());
    head[5..].copy_from_slice(&(warmup.as_millis().min(u128::from(u32::MAX)) as u32).to_le_bytes());
    s.write_all(&head)?;
    let mut out = match workload {
        Workload::Rr => rr(&mut s, size, duration, warmup, interval),
        Workload::Stream => stream(net, s, size, duration, warmup),
        Workload::Check => bail!("a checked stream is run by workload::checked"),
    }?;
    out.late_ms = late_ms;
    Ok(out)
}

/// Sleeps until CLOCK_MONOTONIC reaches `t` (ns); how late it already was, in milliseconds
/// (0 when on time).
fn wait_until(t: u64) -> f64 {
    let now = now_ns();
    if now < t {
        std::thread::sleep(Duration::from_nanos(t - now));
        0.0
    } else {
        (now - t) as f64 / 1e6
    }
}

fn rr<S: Read + Write>(
    s: &mut S,
    size: usize,
    duration: Duration,
    warmup: Duration,
    interval: Duration,
) -> Result<Outcome> {
    let mut m = vec![0u8; size];
    let (mut one_way, mut half, mut request) = (histogram(), histogram(), histogram());
    let mut win = Window::new(warmup, duration);
    let mut seq = 0u32;
    while let Some(measuring) = win.tick() {
        seq = seq.wrapping_add(1);
        let t0 = now_ns();
        m[0..4].copy_from_slice(&seq.to_le_bytes());
        m[8..16].copy_from_slice(&t0.to_le_bytes());
        s.write_all(&m)?;
        s.read_exact(&mut m).context("reading the reply")?;
        let t2 = now_ns();
        if u32::from_le_bytes([m[0], m[1], m[2], m[3]]) != seq {
            bail!("reply out of order");
        }
        let t1 = u64::from_le_bytes(m[16..24].try_into().unwrap_or([0; 8]));
        if measuring {
            let _ = one_way.record(t1.saturating_sub(t0).max(1));
            let _ = one_way.record(t2.saturating_sub(t1).max(1));
            let _ = half.record((t2.saturating_sub(t0) / 2).max(1));
            let _ = request.record(t1.saturating_sub(t0).max(1));
        }
        if !interval.is_zero() {
            std::thread::sleep(interval);
        }
    }
    let mut out = Outcome::rr(&one_way, &half, win.cpu(), duration);
    if !interval.is_zero() {
        out.request_ns = Some(Summary::of(&request));
    }
    Ok(out)
}

fn stream<N: Net>(
    net: &N,
    mut s: N::Stream,
    size: usize,
    duration: Duration,
    warmup: Duration,
) -> Result<Outcome> {
    let m = vec![0x5au8; size.max(1)];
    let warm_end = Instant::now() + warmup;
    while Instant::now() < warm_end {
        s.write_all(&m)?;
    }
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let mut sent = 0u64;
    while t.elapsed() < duration {
        for _ in 0..8 {
            s.write_all(&m)?;
        }
        sent += 8;
    }
    net.shutdown_write(&mut s)?;
    let mut rep = [0u8; 16];
    s.read_exact(&mut rep)
        .context("reading the receiver's report")?;
    let cpu = cpu_seconds() - cpu0;
    let bytes = u64::from_le_bytes(rep[..8].try_into().unwrap_or([0; 8]));
    let ns = u64::from_le_bytes(rep[8..].try_into().unwrap_or([0; 8])).max(1);
    let secs = ns as f64 / 1e9;
    Ok(Outcome {
        gbps: Some(bytes as f64 * 8.0 / secs / 1e9),
        msgs_per_s: Some(bytes as f64 / size as f64 / secs),
        bytes: Some(bytes),
        cpu_s_per_op: cpu / sent.max(1) as f64,
        ..Outcome::default()
    })
}

/// Datagram kinds of the UDP protocol (first byte): `r` ping-pong, `s` stream data (warm-up
/// in ms at bytes 4..8), `e` end of stream (the server answers `R` + bytes + ns), `q` end of a
/// ping-pong session.
const U_RR: u8 = b'r';
const U_DATA: u8 = b's';
const U_END: u8 = b'e';
const U_QUIT: u8 = b'q';
const U_REPORT: u8 = b'R';

/// Serves UDP measurement sessions on `addr`; returns after `sessions` sessions (0: never).
pub fn serve_udp<N: Net>(net: &N, addr: SocketAddr, sessions: usize) -> Result<u64> {
    let s = net
        .udp_bind(addr)
        .with_context(|| format!("binding UDP {addr}"))?;
    let mut buf = vec![0u8; 65536];
    let (mut bytes, mut start, mut first, mut last, mut done, mut total) =
        (0u64, 0u64, 0u64, 0u64, 0usize, 0u64);
    let mut last_quit = 0u64;
    loop {
        let (n, from) = s.recv_from(&mut buf)?;
        if n < RR_HDR {
            continue;
        }
        let now = now_ns();
        match buf[0] {
            U_RR => {
                buf[16..24].copy_from_slice(&now.to_le_bytes());
                s.send_to(&buf[..n], from)?;
                total += 1;
            }
            U_DATA => {
                let warm =
                    u64::from(u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]])) * 1_000_000;
                if start == 0 {
                    start = now;
                }
                if now.saturating_sub(start) >= warm {
                    if first == 0 {
                        first = now;
                    } else {
                        bytes += n as u64;
                    }
                    last = now;
                }
            }
            U_END | U_QUIT => {
                if buf[0] == U_QUIT {
                    // sent several times in case one is lost: count each session once
                    let id = u64::from_le_bytes(buf[8..16].try_into().unwrap_or([0; 8]));
                    if id == last_quit {
                        continue;
                    }
                    last_quit = id;
                }
                if buf[0] == U_END {
                    let mut rep = [0u8; RR_HDR];
                    rep[0] = U_REPORT;
                    rep[8..16].copy_from_slice(&bytes.to_le_bytes());
                    rep[16..24].copy_from_slice(&last.saturating_sub(first).to_le_bytes());
                    s.send_to(&rep, from)?;
                    if start == 0 {
                        continue; // a repeated END after the report
                    }
                    total += bytes;
                    (bytes, start, first, last) = (0, 0, 0, 0);
                }
                done += 1;
                if sessions != 0 && done >= sessions {
                    return Ok(total);
                }
            }
            _ => {}
        }
    }
}

/// Runs a UDP client. rr: one datagram at a time, a reply lost for 1 s counts as lost. stream:
/// datagrams as fast as the socket takes them; goodput is what the server counted.
pub fn client_udp<N: Net>(
    net: &N,
    addr: SocketAddr,
    workload: Workload,
    size: usize,
    duration: Duration,
    warmup: Duration,
) -> Result<Outcome> {
    if size < RR_HDR {
        bail!("--size must be at least {RR_HDR} for UDP");
    }
    let mut s = net
        .udp_bind(match addr {
            SocketAddr::V4(_) => SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)),
        })
        .context("binding a UDP socket")?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut m = vec![0u8; size];
    let warm_end = Instant::now() + warmup;
    let end = warm_end + duration;
    match workload {
        Workload::Check => bail!("the checked stream runs over TCP"),
        Workload::Rr => {
            let (mut one_way, mut half) = (histogram(), histogram());
            let (mut seq, mut lost) = (0u32, 0u64);
            let mut r = vec![0u8; size.max(64)];
            let mut win = Window::new(warmup, duration);
            while let Some(measuring) = win.tick() {
                seq = seq.wrapping_add(1);
                m[0] = U_RR;
                m[4..8].copy_from_slice(&seq.to_le_bytes());
                let t0 = now_ns();
                m[8..16].copy_from_slice(&t0.to_le_bytes());
                s.send_to(&m, addr)?;
                loop {
                    match s.recv_from(&mut r) {
                        Ok((n, _))
                            if n >= RR_HDR && r[0] == U_RR && r[4..8] == seq.to_le_bytes() =>
                        {
                            let t2 = now_ns();
                            let t1 = u64::from_le_bytes(r[16..24].try_into().unwrap_or([0; 8]));
                            if measuring {
                                let _ = one_way.record(t1.saturating_sub(t0).max(1));
                                let _ = one_way.record(t2.saturating_sub(t1).max(1));
                                let _ = half.record((t2.saturating_sub(t0) / 2).max(1));
                            }
                            break;
                        }
                        Ok(_) => continue, // a late reply to an earlier datagram
                        Err(_) => {
                            lost += 1;
                            break;
                        }
                    }
                }
            }
            m[0] = U_QUIT;
            m[8..16].copy_from_slice(&now_ns().max(1).to_le_bytes());
            for _ in 0..3 {
                let _ = s.send_to(&m[..RR_HDR], addr);
            }
            if lost > 0 {
                eprintln!("dnperf: {lost} datagrams lost");
            }
            Ok(Outcome::rr(&one_way, &half, win.cpu(), duration))
        }
        Workload::Stream => {
            m[0] = U_DATA;
            m[4..8].copy_from_slice(
                &(warmup.as_millis().min(u128::from(u32::MAX)) as u32).to_le_bytes(),
            );
            let cpu0 = cpu_seconds();
            let mut sent = 0u64;
            while Instant::now() < end {
                for _ in 0..16 {
                    s.send_to(&m, addr)?;
                }
                sent += 16;
            }
            let cpu = cpu_seconds() - cpu0;
            s.set_read_timeout(Some(Duration::from_millis(200)))?;
            let mut r = [0u8; 64];
            for _ in 0..25 {
                m[0] = U_END;
                s.send_to(&m[..RR_HDR], addr)?;
                if let Ok((n, _)) = s.recv_from(&mut r) {
                    if n >= RR_HDR && r[0] == U_REPORT {
                        let bytes = u64::from_le_bytes(r[8..16].try_into().unwrap_or([0; 8]));
                        let secs = u64::from_le_bytes(r[16..24].try_into().unwrap_or([0; 8])).max(1)
                            as f64
                            / 1e9;
                        return Ok(Outcome {
                            gbps: Some(bytes as f64 * 8.0 / secs / 1e9),
                            msgs_per_s: Some(bytes as f64 / size as f64 / secs),
                            bytes: Some(bytes),
                            cpu_s_per_op: cpu / sent.max(1) as f64,
                            ..Outcome::default()
                        });
                    }
                }
            }
            bail!("the server never reported (is it running with --proto udp?)")
        }
    }
}
