//! The load generator: keep-alive connections that send GET requests and time the responses,
//! in one event loop per thread over any [`Io`], like `wrk`.
//!
//! Closed loop (the default): each connection keeps `pipeline` requests outstanding and sends
//! the next as soon as an answer arrives; latency is from sending to the last byte of the
//! answer. Open loop (`rate`): requests are due at a fixed rate spread over the connections,
//! and latency is measured from when a request was *due*, not from when it was sent, so a
//! server that stalls is charged for the requests it kept from being sent (the coordinated
//! omission correction of wrk2). Answers are parsed with `httparse`; a body needs a
//! `Content-Length`. Errors are counted by kind; a connection that fails or is closed is
//! opened again.

use crate::io::{Io, Item};
use docknet_lib::{Interest, Ready};
use docknet_perf::stats::{buckets, cpu_seconds, histogram, now_ns, Summary};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::SocketAddrV4;
use std::time::Duration;

/// What to load, and how hard.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The server.
    pub addr: SocketAddrV4,
    /// The request path (`/`, `/bytes/1024`, ...).
    pub path: String,
    /// Connections in all.
    pub connections: usize,
    /// Threads (each runs its share of the connections).
    pub threads: usize,
    /// Measured time.
    pub duration: Duration,
    /// Time before measuring (its answers are not counted).
    pub warmup: Duration,
    /// Requests per second in all (open loop); `None`: closed loop.
    pub rate: Option<f64>,
    /// Requests outstanding per connection (closed loop).
    pub pipeline: usize,
    /// An answer not complete after this long is an error (`timeout`), and its connection is
    /// opened again.
    pub timeout: Duration,
    /// Send exactly this many requests in all, then stop once all are answered (no warm-up,
    /// no duration): for checking counts against the server's.
    pub requests: Option<u64>,
}

/// What a load run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoadReport {
    /// `kernel` or `docknet`.
    pub stack: String,
    /// The URL loaded.
    pub url: String,
    /// Connections, threads, pipeline depth.
    pub connections: usize,
    /// Threads.
    pub threads: usize,
    /// Requests outstanding per connection.
    pub pipeline: usize,
    /// Target rate (open loop), requests/s.
    pub rate: Option<f64>,
    /// Measured seconds.
    pub duration_s: f64,
    /// Answers completed while measuring (any status).
    pub requests: u64,
    /// Of those, with a 2xx status.
    pub ok: u64,
    /// Answers per second.
    pub req_per_s: f64,
    /// Bytes of answers (heads and bodies) per second.
    pub transfer_bytes_per_s: f64,
    /// Latency (us): median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// The latency histogram as `[ns, count]` buckets.
    pub latency_hist: Vec<[u64; 2]>,
    /// Errors by kind: `connect`, `read`, `write`, `timeout`, `parse`, `status` (not 2xx),
    /// `closed` (the server closed with answers outstanding).
    pub errors: BTreeMap<String, u64>,
    /// Connections opened again after the server closed them or they failed.
    pub reconnects: u64,
    /// CPU seconds of this process per answer.
    pub cpu_s_per_request: f64,
}

/// Parses answers from a byte stream, one after another.
#[derive(Debug, Default)]
pub struct ResponseParser {
    buf: Vec<u8>,
    body: Option<Body>,
}

/// The answer whose body is arriving.
#[derive(Debug, Clone, Copy)]
struct Body {
    status: u16,
    left: u64,
    bytes: u64,
    close: bool,
}

/// One complete answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Bytes (head and body).
    pub bytes: u64,
    /// The server will close after it.
    pub close: bool,
}

/// Longest answer head accepted.
const MAX_HEAD: usize = 16 * 1024;

impl ResponseParser {
    /// Takes bytes; pushes every answer they complete into `out`. An error ends the stream.
    pub fn input(&mut self, mut data: &[u8], out: &mut Vec<Answer>) -> Result<(), &'static str> {
        // body bytes straight from `data`, without copying them
        while self.buf.is_empty() {
            let Some(b) = &mut self.body else { break };
            let k = b.left.min(data.len() as u64);
            b.left -= k;
            b.bytes += k;
            data = &data[k as usize..];
            if b.left > 0 {
                return Ok(());
            }
            out.push(b.answer());
            self.body = None;
        }
        self.buf.extend_from_slice(data);
        let mut at = 0;
        let r = self.parse(&mut at, out);
        self.buf.drain(..at);
        r
    }

    fn parse(&mut self, at: &mut usize, out: &mut Vec<Answer>) -> Result<(), &'static str> {
        loop {
            if let Some(b) = &mut self.body {
                let k = b.left.min((self.buf.len() - *at) as u64);
                b.left -= k;
                b.bytes += k;
                *at += k as usize;
                if b.left > 0 {
                    return Ok(());
                }
                out.push(b.answer());
                self.body = None;
            }
            if *at == self.buf.len() {
                return Ok(());
            }
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut headers);
            let n = match r.parse(&self.buf[*at..]) {
                Ok(httparse::Status::Complete(n)) => n,
                Ok(httparse::Status::Partial) if self.buf.len() - *at > MAX_HEAD => {
                    return Err("answer head too large")
                }
                Ok(httparse::Status::Partial) => return Ok(()),
                Err(_) => return Err("malformed answer"),
            };
            let status = r.code.unwrap_or(0);
            let header = |name: &str| {
                r.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
            };
            if header("transfer-encoding").is_some() {
                return Err("chunked answers are not supported");
            }
            let left: u64 = match header("content-length") {
                Some(v) => v.parse().map_err(|_| "bad Content-Length")?,
                None if status == 204 || status == 304 => 0,
                None => return Err("answer without Content-Length"),
            };
            let close =
                header("connection").is_some_and(|c| c.contains("close")) || r.version == Some(0);
            *at += n;
            self.body = Some(Body {
                status,
                left,
                bytes: n as u64,
                close,
            });
        }
    }
}

impl Body {
    fn answer(&self) -> Answer {
        Answer {
            status: self.status,
            bytes: self.bytes,
            close: self.close,
        }
    }
}

/// One connection of the generator.
#[derive(Debug)]
struct Conn<C> {
    sock: Option<C>,
    connecting: bool,
    parser: ResponseParser,
    /// Outstanding requests, oldest first: (the time latency is measured from, when sent).
    starts: VecDeque<(u64, u64)>,
    /// Requests queued for writing, and the bytes of the first already written.
    queued: usize,
    out_off: usize,
    /// Open loop: when this connection's next request is due.
    next_due: u64,
    /// No new connection before this time (after a failure).
    retry_at: u64,
}

impl<C> Conn<C> {
    fn new(next_due: u64) -> Conn<C> {
        Conn {
            sock: None,
            connecting: false,
            parser: ResponseParser::default(),
            starts: VecDeque::new(),
            queued: 0,
            out_off: 0,
            next_due,
            retry_at: 0,
        }
    }

    /// Drops the socket (and everything outstanding on it).
    fn reset(&mut self, retry_at: u64) {
        self.sock = None;
        self.connecting = false;
        self.parser = ResponseParser::default();
        self.starts.clear();
        self.queued = 0;
        self.out_off = 0;
        self.retry_at = retry_at;
    }
}

/// What one thread counted.
#[derive(Debug)]
struct Tally {
    hist: Histogram<u64>,
    requests: u64,
    ok: u64,
    bytes: u64,
    errors: BTreeMap<String, u64>,
    reconnects: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            hist: histogram(),
            requests: 0,
            ok: 0,
            bytes: 0,
            errors: BTreeMap::new(),
            reconnects: 0,
        }
    }

    fn error(&mut self, kind: &str) {
        *self.errors.entry(kind.into()).or_default() += 1;
    }
}

/// When a thread measures, and what it may send.
#[derive(Debug, Clone)]
struct Plan {
    warm_end: u64,
    end: u64,
    /// Open loop: ns between two requests of one connection.
    interval: Option<u64>,
    /// Requests left to send in all (exact-count runs).
    budget: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl Plan {
    /// Takes one request from the budget (always granted without one).
    fn take(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.budget.as_ref().is_none_or(|b| {
            b.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        })
    }

    fn spent(&self) -> bool {
        self.budget
            .as_ref()
            .is_some_and(|b| b.load(std::sync::atomic::Ordering::Acquire) == 0)
    }
}

const RETRY_NS: u64 = 10_000_000;

/// Runs `n` connections until the plan's end (or its budget is spent and answered).
fn run_thread<I: Io>(io: &I, o: &LoadOptions, n: usize, plan: &Plan) -> Tally {
    let req = format!("GET {} HTTP/1.1\r\nHost: {}\r\n\r\n", o.path, o.addr).into_bytes();
    let t0 = now_ns();
    let mut conns: Vec<Conn<I::Conn>> = (0..n)
        .map(|k| {
            // spread the open loop's first requests over one interval
            let off = plan
                .interval
                .map_or(0, |iv| iv * k as u64 / n.max(1) as u64);
            Conn::new(t0 + off)
        })
        .collect();
    let mut tally = Tally::new();
    let mut ready = Vec::new();
    let mut answers = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    let timeout = o.timeout.as_nanos() as u64;
    loop {
        let now = now_ns();
        if plan.budget.is_none() && now >= plan.end {
            break;
        }
        if plan.spent() && conns.iter().all(|c| c.starts.is_empty()) {
            break;
        }
        let mut next_due = u64::MAX;
        for c in &mut conns {
            if c.sock.is_none() {
                if now < c.retry_at || plan.spent() {
                    continue;
                }
                match io.connect(o.addr) {
                    Ok(s) => {
                        c.sock = Some(s);
                        c.connecting = true;
                    }
                    Err(_) => {
                        tally.error("connect");
                        c.retry_at = now + RETRY_NS;
                    }
                }
                continue;
            }
            if let Some(&(_, sent)) = c.starts.front() {
                if now.saturating_sub(sent) > timeout {
                    tally.error("timeout");
                    c.reset(now);
                    continue;
                }
            }
            if !c.connecting {
                issue(c, o, plan, now, &mut next_due);
                if c.queued > 0 && !write_out(io, c, &req) {
                    tally.error("write");
                    c.reset(now + RETRY_NS);
                }
            }
        }
        let wait = {
            let items: Vec<Item<'_, I::Listener, I::Conn>> = conns
                .iter()
                .filter_map(|c| {
                    let s = c.sock.as_ref()?;
                    Some(Item::Conn(
                        s,
                        Interest {
                            read: !c.connecting,
                            write: c.connecting || c.queued > 0,
                        },
                    ))
                })
                .collect();
            let idx: Vec<usize> = conns
                .iter()
                .enumerate()
                .filter(|(_, c)| c.sock.is_some())
                .map(|(i, _)| i)
                .collect();
            let until = next_due
                .min(if plan.budget.is_none() {
                    plan.end
                } else {
                    u64::MAX
                })
                .saturating_sub(now);
            let t = Duration::from_nanos(until.min(10_000_000));
            if io.wait(&items, Some(t), &mut ready).is_err() {
                tally.error("wait");
                std::thread::sleep(Duration::from_millis(1));
            }
            idx
        };
        for &(i, r) in &ready {
            let c = &mut conns[wait[i]];
            step(io, o, plan, c, r, &req, &mut buf, &mut answers, &mut tally);
        }
    }
    tally
}

/// Queues the requests a connection may send now.
fn issue<C>(c: &mut Conn<C>, o: &LoadOptions, plan: &Plan, now: u64, next_due: &mut u64) {
    let depth = o.pipeline.max(1);
    match plan.interval {
        None => {
            while c.starts.len() < depth && plan.take() {
                c.starts.push_back((now, now));
                c.queued += 1;
            }
        }
        Some(iv) => {
            while c.starts.len() < depth && c.next_due <= now && plan.take() {
                c.starts.push_back((c.next_due, now));
                c.queued += 1;
                c.next_due += iv;
            }
            *next_due = (*next_due).min(c.next_due);
        }
    }
}

/// Writes queued requests until the socket would block; false on an error.
fn write_out<I: Io>(io: &I, c: &mut Conn<I::Conn>, req: &[u8]) -> bool {
    let Some(s) = c.sock.as_mut() else {
        return true;
    };
    while c.queued > 0 {
        match io.write(s, &req[c.out_off..]) {
            Ok(0) => return false,
            Ok(n) => {
                c.out_off += n;
                if c.out_off == req.len() {
                    c.out_off = 0;
                    c.queued -= 1;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
    true
}

/// Handles a ready connection: its connect, its answers, and the requests that follow.
#[allow(clippy::too_many_arguments)]
fn step<I: Io>(
    io: &I,
    o: &LoadOptions,
    plan: &Plan,
    c: &mut Conn<I::Conn>,
    r: Ready,
    req: &[u8],
    buf: &mut [u8],
    answers: &mut Vec<Answer>,
    tally: &mut Tally,
) {
    let Some(s) = c.sock.as_mut() else { return };
    let now = now_ns();
    if c.connecting {
        match io.connected(s) {
            None => return,
            Some(Ok(())) => c.connecting = false,
            Some(Err(_)) => {
                tally.error("connect");
                c.reset(now + RETRY_NS);
                return;
            }
        }
    }
    if r.read || r.error {
        for _ in 0..8 {
            let Some(s) = c.sock.as_mut() else { return };
            match io.read(s, buf) {
                Ok(0) => {
                    if !c.starts.is_empty() {
                        tally.error("closed");
                    }
                    tally.reconnects += 1;
                    c.reset(now);
                    return;
                }
                Ok(k) => {
                    answers.clear();
                    let parsed = c.parser.input(&buf[..k], answers);
                    let done = now_ns();
                    let mut close = false;
                    for a in answers.iter() {
                        let Some((from, _)) = c.starts.pop_front() else {
                            tally.error("parse"); // an answer nobody asked for
                            break;
                        };
                        let counted =
                            plan.budget.is_some() || (done >= plan.warm_end && done < plan.end);
                        if counted {
                            tally.requests += 1;
                            tally.bytes += a.bytes;
                            if (200..300).contains(&a.status) {
                                tally.ok += 1;
                            } else {
                                tally.error("status");
                            }
                            let _ = tally.hist.record(done.saturating_sub(from).max(1));
                        }
                        close |= a.close;
                    }
                    if parsed.is_err() {
                        tally.error("parse");
                        c.reset(now + RETRY_NS);
                        return;
                    }
                    if close {
                        tally.reconnects += 1;
                        c.reset(now);
                        return;
                    }
                    if k < buf.len() {
                        break; // everything there was; the next wait says if more came
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    tally.error("read");
                    c.reset(now + RETRY_NS);
                    return;
                }
            }
        }
    }
    let mut due = u64::MAX;
    issue(c, o, plan, now_ns(), &mut due);
    if c.queued > 0 && !write_out(io, c, req) {
        tally.error("write");
        c.reset(now + RETRY_NS);
    }
}

/// Runs the load and reports what it measured.
pub fn run<I: Io>(io: &I, o: &LoadOptions) -> anyhow::Result<LoadReport> {
    anyhow::ensure!(o.connections > 0, "--connections must be at least 1");
    anyhow::ensure!(
        o.threads > 0 && o.threads <= o.connections,
        "--threads must be between 1 and the number of connections"
    );
    anyhow::ensure!(
        o.pipeline > 0 && o.pipeline <= 1024,
        "--pipeline must be 1..=1024"
    );
    if let Some(r) = o.rate {
        anyhow::ensure!(r > 0.0 && r.is_finite(), "--rate must be positive");
    }
    let t0 = now_ns();
    let counted = o.requests.is_some();
    let warm_end = t0
        + if counted {
            0
        } else {
            o.warmup.as_nanos() as u64
        };
    let end = warm_end + o.duration.as_nanos() as u64;
    let budget = o
        .requests
        .map(|n| std::sync::Arc::new(std::sync::atomic::AtomicU64::new(n)));
    let mut handles = Vec::new();
    for t in 0..o.threads {
        let n = o.connections / o.threads + usize::from(t < o.connections % o.threads);
        let plan = Plan {
            warm_end,
            end,
            interval: o
                .rate
                .map(|r| (1e9 * o.connections as f64 / r).max(1.0) as u64),
            budget: budget.clone(),
        };
        let (io, o) = (io.clone(), o.clone());
        handles.push(std::thread::spawn(move || run_thread(&io, &o, n, &plan)));
    }
    // this process's CPU over the measured time
    let sleep_until = |t: u64| {
        let now = now_ns();
        if t > now {
            std::thread::sleep(Duration::from_nanos(t - now));
        }
    };
    let (cpu0, cpu1) = if counted {
        (cpu_seconds(), None)
    } else {
        sleep_until(warm_end);
        let a = cpu_seconds();
        sleep_until(end);
        (a, Some(cpu_seconds()))
    };
    let mut all = Tally::new();
    for h in handles {
        let t = h
            .join()
            .map_err(|_| anyhow::anyhow!("a load thread panicked"))?;
        all.hist.add(&t.hist).ok();
        all.requests += t.requests;
        all.ok += t.ok;
        all.bytes += t.bytes;
        all.reconnects += t.reconnects;
        for (k, v) in t.errors {
            *all.errors.entry(k).or_default() += v;
        }
    }
    let cpu = cpu1.unwrap_or_else(cpu_seconds) - cpu0;
    let secs = if counted {
        (now_ns() - t0) as f64 / 1e9
    } else {
        o.duration.as_secs_f64()
    };
    let s = Summary::of(&all.hist);
    let us = |ns: u64| ns as f64 / 1e3;
    Ok(LoadReport {
        stack: io.name().into(),
        url: format!("http://{}{}", o.addr, o.path),
        connections: o.connections,
        threads: o.threads,
        pipeline: o.pipeline,
        rate: o.rate,
        duration_s: secs,
        requests: all.requests,
        ok: all.ok,
        req_per_s: all.requests as f64 / secs,
        transfer_bytes_per_s: all.bytes as f64 / secs,
        p50_us: us(s.p50),
        p90_us: us(s.p90),
        p99_us: us(s.p99),
        p999_us: us(s.p999),
        max_us: us(s.max),
        mean_us: s.mean / 1e3,
        latency_hist: buckets(&all.hist),
        errors: all.errors,
        reconnects: all.reconnects,
        cpu_s_per_request: cpu / all.requests.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_parsed_however_the_bytes_are_cut() {
        let stream = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc";
        for cut in 1..stream.len() {
            let mut p = ResponseParser::default();
            let mut out = Vec::new();
            p.input(&stream[..cut], &mut out).unwrap();
            p.input(&stream[cut..], &mut out).unwrap();
            let got: Vec<(u16, bool)> = out.iter().map(|a| (a.status, a.close)).collect();
            assert_eq!(
                got,
                [(200, false), (404, false), (200, true)],
                "cut at {cut}"
            );
            assert_eq!(
                out.iter().map(|a| a.bytes).sum::<u64>(),
                stream.len() as u64
            );
        }
    }

    #[test]
    fn bad_answers_are_errors_not_panics() {
        for bad in [
            &b"NOT HTTP\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        ] {
            let mut out = Vec::new();
            assert!(ResponseParser::default().input(bad, &mut out).is_err());
        }
        let mut p = ResponseParser::default();
        let mut out = Vec::new();
        let huge = vec![b'a'; MAX_HEAD + 10];
        assert!(p.input(b"HTTP/1.1 200 OK\r\nX: ", &mut out).is_ok());
        assert!(p.input(&huge, &mut out).is_err());
    }
}
