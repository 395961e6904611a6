//! The HTTP/1.1 server: a per-connection [`Session`] (bytes in, responses out; pure, no I/O)
//! and [`serve`], the event loop that runs every connection of a listener in one thread over
//! any [`Io`].
//!
//! Requests are parsed with `httparse` as they arrive; several requests in one read
//! (pipelining) are answered in order. Keep-alive is HTTP/1.1's default (HTTP/1.0 asks for it
//! with `Connection: keep-alive`); `Connection: close` closes after the response. Limits: a
//! request head of at most [`MAX_HEAD`] bytes and [`MAX_HEADERS`] headers (431), a request
//! body of at most [`MAX_BODY`] bytes (413; a GET body is read and dropped), no
//! `Transfer-Encoding` in requests (501), methods GET and HEAD (405), a malformed request
//! (400) closes the connection after its answer. A connection stops reading while
//! [`MAX_QUEUED`] bytes of responses wait to be written (pipelined clients cannot make the
//! server buffer without bound).
//!
//! Content: the files under `static/` compiled in (the paper's makefsdata), `GET /bytes/N`
//! (N bytes of `x`, up to [`MAX_BYTES`]), `GET /work/US` (spends US microseconds of CPU, up to
//! one second, then answers `ok`).

use crate::io::{Io, Item};
use docknet_lib::{Interest, Ready};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Longest request head (request line and headers).
pub const MAX_HEAD: usize = 8192;
/// Most headers in a request.
pub const MAX_HEADERS: usize = 64;
/// Longest request body (read and dropped).
pub const MAX_BODY: usize = 64 * 1024;
/// Largest `/bytes/N`.
pub const MAX_BYTES: u64 = 1 << 30;
/// Longest `/work/US`.
pub const MAX_WORK_US: u64 = 1_000_000;
/// Responses queued per connection before it stops reading.
pub const MAX_QUEUED: usize = 1 << 20;

/// The files compiled into the server: path, content type, bytes.
pub static FILES: &[(&str, &str, &[u8])] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_bytes!("../static/index.html"),
    ),
    (
        "/index.html",
        "text/html; charset=utf-8",
        include_bytes!("../static/index.html"),
    ),
    (
        "/hello.txt",
        "text/plain; charset=utf-8",
        include_bytes!("../static/hello.txt"),
    ),
];

/// The body of `/bytes/N`, repeated.
static PATTERN: [u8; 65536] = [b'x'; 65536];

/// Part of a connection's output.
#[derive(Debug)]
enum Chunk {
    Owned(Vec<u8>),
    Static(&'static [u8]),
    /// `n` more bytes of [`PATTERN`].
    Pattern(u64),
}

impl Chunk {
    fn len(&self) -> u64 {
        match self {
            Chunk::Owned(v) => v.len() as u64,
            Chunk::Static(s) => s.len() as u64,
            Chunk::Pattern(n) => *n,
        }
    }
}

/// A connection's responses waiting to be written.
#[derive(Debug, Default)]
struct OutQueue {
    chunks: VecDeque<Chunk>,
    /// Bytes of the first chunk already written.
    head: usize,
    queued: u64,
}

impl OutQueue {
    fn push(&mut self, c: Chunk) {
        if c.len() > 0 {
            self.queued += c.len();
            self.chunks.push_back(c);
        }
    }

    fn front(&self) -> Option<&[u8]> {
        Some(match self.chunks.front()? {
            Chunk::Owned(v) => &v[self.head..],
            Chunk::Static(s) => &s[self.head..],
            Chunk::Pattern(n) => &PATTERN[..(*n).min(PATTERN.len() as u64) as usize],
        })
    }

    fn advance(&mut self, mut n: usize) {
        self.queued = self.queued.saturating_sub(n as u64);
        while n > 0 {
            let Some(c) = self.chunks.front_mut() else {
                return;
            };
            match c {
                Chunk::Pattern(left) => {
                    let k = (n as u64).min(*left);
                    *left -= k;
                    n -= k as usize;
                    if *left == 0 {
                        self.chunks.pop_front();
                    }
                }
                _ => {
                    let left = c.len() as usize - self.head;
                    if n < left {
                        self.head += n;
                        return;
                    }
                    n -= left;
                    self.head = 0;
                    self.chunks.pop_front();
                }
            }
        }
    }
}

/// What a server counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStats {
    /// Connections accepted.
    pub connections: u64,
    /// Requests answered, by status class.
    pub responses_2xx: u64,
    /// 4xx answers.
    pub responses_4xx: u64,
    /// 5xx answers.
    pub responses_5xx: u64,
    /// Response bytes written (heads and bodies).
    pub bytes_out: u64,
}

impl ServerStats {
    /// Every answer.
    pub fn responses(&self) -> u64 {
        self.responses_2xx + self.responses_4xx + self.responses_5xx
    }

    fn add(&mut self, o: &ServerStats) {
        self.connections += o.connections;
        self.responses_2xx += o.responses_2xx;
        self.responses_4xx += o.responses_4xx;
        self.responses_5xx += o.responses_5xx;
        self.bytes_out += o.bytes_out;
    }
}

/// One connection's HTTP state: bytes in, responses out.
#[derive(Debug, Default)]
pub struct Session {
    buf: Vec<u8>,
    out: OutQueue,
    /// Request body bytes still to drop.
    skip: usize,
    /// Close once the queued output is written (no more requests are read).
    closing: bool,
    /// Counters of this connection.
    pub stats: ServerStats,
}

/// A response about to be queued.
struct Answer {
    status: u16,
    ctype: &'static str,
    body: Chunk,
    extra: &'static str,
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        _ => "Error",
    }
}

fn error(status: u16) -> Answer {
    let body: &'static [u8] = match status {
        400 => b"bad request\n",
        404 => b"not found\n",
        405 => b"method not allowed\n",
        413 => b"request body too large\n",
        431 => b"request head too large\n",
        _ => b"not implemented\n",
    };
    Answer {
        status,
        ctype: "text/plain; charset=utf-8",
        body: Chunk::Static(body),
        extra: if status == 405 {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        },
    }
}

/// Spends `us` microseconds of CPU.
fn work(us: u64) {
    let end = Instant::now() + Duration::from_micros(us);
    let mut x = 0u64;
    while Instant::now() < end {
        for i in 0..64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
}

/// The answer to `GET path`.
fn route(path: &str) -> Answer {
    let path = path.split('?').next().unwrap_or(path);
    if let Some((_, ctype, body)) = FILES.iter().find(|(p, _, _)| *p == path) {
        return Answer {
            status: 200,
            ctype,
            body: Chunk::Static(body),
            extra: "",
        };
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        return match n.parse::<u64>() {
            Ok(n) if n <= MAX_BYTES => Answer {
                status: 200,
                ctype: "application/octet-stream",
                body: Chunk::Pattern(n),
                extra: "",
            },
            _ => error(400),
        };
    }
    if let Some(us) = path.strip_prefix("/work/") {
        return match us.parse::<u64>() {
            Ok(us) if us <= MAX_WORK_US => {
                work(us);
                Answer {
                    status: 200,
                    ctype: "text/plain; charset=utf-8",
                    body: Chunk::Static(b"ok\n"),
                    extra: "",
                }
            }
            _ => error(400),
        };
    }
    error(404)
}

impl Session {
    /// Takes bytes read from the connection and queues the answers to every complete request
    /// in them.
    pub fn input(&mut self, data: &[u8]) {
        if self.closing {
            return;
        }
        self.buf.extend_from_slice(data);
        let mut at = 0;
        while !self.closing && at < self.buf.len() {
            if self.skip > 0 {
                let k = self.skip.min(self.buf.len() - at);
                self.skip -= k;
                at += k;
                continue;
            }
            match self.request(at) {
                Some(n) => at += n,
                None => break,
            }
        }
        self.buf.drain(..at);
        if !self.closing && self.buf.len() > MAX_HEAD {
            self.answer(error(431), false, true);
        }
    }

    /// Parses and answers one request at `buf[at..]`; its length, or `None` if incomplete.
    fn request(&mut self, at: usize) -> Option<usize> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let n = match req.parse(&self.buf[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return None,
            Err(httparse::Error::TooManyHeaders) => {
                self.answer(error(431), false, true);
                return Some(self.buf.len() - at);
            }
            Err(_) => {
                self.answer(error(400), false, true);
                return Some(self.buf.len() - at);
            }
        };
        if n > MAX_HEAD {
            self.answer(error(431), false, true);
            return Some(self.buf.len() - at);
        }
        let (method, path, minor) = (
            req.method.unwrap_or(""),
            req.path.unwrap_or(""),
            req.version.unwrap_or(1),
        );
        let header = |name: &str| {
            req.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
        };
        let conn = header("connection").unwrap_or_default();
        let keep = if minor == 0 {
            conn.split(',').any(|t| t.trim() == "keep-alive")
        } else {
            !conn.split(',').any(|t| t.trim() == "close")
        };
        let head = method == "HEAD";
        if header("transfer-encoding").is_some() {
            self.answer(error(501), head, true);
            return Some(n);
        }
        let body = match header("content-length").map(|v| v.parse::<usize>()) {
            None => 0,
            Some(Ok(b)) if b <= MAX_BODY => b,
            Some(Ok(_)) => {
                self.answer(error(413), head, true);
                return Some(n);
            }
            Some(Err(_)) => {
                self.answer(error(400), head, true);
                return Some(n);
            }
        };
        self.skip = body;
        if minor == 1 && header("host").is_none() {
            self.answer(error(400), head, true);
            return Some(n);
        }
        let a = match method {
            "GET" | "HEAD" => route(path),
            _ => error(405),
        };
        self.answer(a, head, !keep);
        Some(n)
    }

    /// Queues a response (`head`: without its body); `close`: the last on this connection.
    fn answer(&mut self, a: Answer, head: bool, close: bool) {
        let mut h = format!(
            "HTTP/1.1 {} {}\r\nServer: docknet-httpd\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}",
            a.status,
            reason(a.status),
            a.ctype,
            a.body.len(),
            a.extra
        );
        if close {
            h += "Connection: close\r\n";
            self.closing = true;
        }
        h += "\r\n";
        match a.status {
            200..=299 => self.stats.responses_2xx += 1,
            400..=499 => self.stats.responses_4xx += 1,
            _ => self.stats.responses_5xx += 1,
        }
        self.out.push(Chunk::Owned(h.into_bytes()));
        if !head {
            self.out.push(a.body);
        }
    }

    /// Whether the connection should read more (not closing, not too much output queued).
    pub fn wants_read(&self) -> bool {
        !self.closing && self.out.queued < MAX_QUEUED as u64
    }

    /// The next bytes to write, if any.
    pub fn output(&self) -> Option<&[u8]> {
        self.out.front()
    }

    /// `n` bytes of [`Session::output`] were written.
    pub fn wrote(&mut self, n: usize) {
        self.stats.bytes_out += n as u64;
        self.out.advance(n);
    }

    /// Everything is written and the connection is to be closed.
    pub fn finished(&self) -> bool {
        self.closing && self.out.chunks.is_empty()
    }
}

/// What [`serve`] runs with.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Connections at most; beyond, new ones are closed at once.
    pub max_conns: usize,
    /// Longest a wait lasts (the stop flag is checked between waits).
    pub tick: Duration,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            max_conns: 10_000,
            tick: Duration::from_millis(100),
        }
    }
}

/// Serves every connection of `l` in this thread until `stop` is set; what it counted.
pub fn serve<I: Io>(
    io: &I,
    mut l: I::Listener,
    opts: ServeOptions,
    stop: &AtomicBool,
) -> io::Result<ServerStats> {
    let mut conns: Vec<(I::Conn, Session)> = Vec::new();
    let mut total = ServerStats::default();
    let mut ready: Vec<(usize, Ready)> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        {
            let mut items = Vec::with_capacity(conns.len() + 1);
            items.push(Item::Listener(&l));
            for (c, s) in &conns {
                let i = Interest {
                    read: s.wants_read(),
                    write: s.output().is_some(),
                };
                items.push(Item::Conn(c, i));
            }
            io.wait(&items, Some(opts.tick), &mut ready)?;
        }
        let mut gone = Vec::new();
        for &(i, r) in &ready {
            if i == 0 {
                accept_all(io, &mut l, &mut conns, &mut total, opts.max_conns);
                continue;
            }
            let (c, s) = &mut conns[i - 1];
            if !pump(io, c, s, r, &mut buf) {
                gone.push(i - 1);
            }
        }
        // highest first, so swap_remove keeps the other indices valid
        gone.sort_unstable_by(|a, b| b.cmp(a));
        for i in gone {
            let (_, s) = conns.swap_remove(i);
            total.add(&s.stats);
        }
    }
    for (_, s) in &conns {
        total.add(&s.stats);
    }
    Ok(total)
}

fn accept_all<I: Io>(
    io: &I,
    l: &mut I::Listener,
    conns: &mut Vec<(I::Conn, Session)>,
    total: &mut ServerStats,
    max: usize,
) {
    for _ in 0..256 {
        match io.accept(l) {
            Ok(c) => {
                total.connections += 1;
                if conns.len() < max {
                    conns.push((c, Session::default()));
                }
            }
            Err(_) => return,
        }
    }
}

/// Reads, answers and writes what a ready connection allows; false when it is done.
fn pump<I: Io>(io: &I, c: &mut I::Conn, s: &mut Session, r: Ready, buf: &mut [u8]) -> bool {
    if r.read && s.wants_read() {
        for _ in 0..4 {
            match io.read(c, buf) {
                Ok(0) => {
                    // the peer is done sending: answer what was asked, then close
                    s.closing = true;
                    break;
                }
                Ok(n) => {
                    s.input(&buf[..n]);
                    // a short read took everything there was: the next wait says if more came
                    if n < buf.len() || !s.wants_read() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
    } else if r.error {
        return false;
    }
    while let Some(out) = s.output() {
        match io.write(c, out) {
            Ok(0) => return false,
            Ok(n) => s.wrote(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => return false,
        }
    }
    !s.finished()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(reqs: &[u8]) -> (Vec<u8>, Session) {
        let mut s = Session::default();
        s.input(reqs);
        let mut out = Vec::new();
        while let Some(b) = s.output() {
            let k = b.len().min(1000);
            out.extend_from_slice(&b[..k]);
            s.wrote(k);
        }
        (out, s)
    }

    #[test]
    fn pipelined_requests_are_answered_in_order_with_keep_alive() {
        let (out, s) = run(
            b"GET /hello.txt HTTP/1.1\r\nHost: a\r\n\r\nGET /bytes/5 HTTP/1.1\r\nHost: a\r\n\r\nHEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
        );
        let text = String::from_utf8(out).unwrap();
        let parts: Vec<&str> = text.split("HTTP/1.1 200 OK").collect();
        assert_eq!(parts.len(), 4, "{text}");
        assert!(
            parts[1].contains("Content-Length: 25\r\n")
                && parts[1].ends_with("hello from docknet-httpd\n")
        );
        assert!(parts[2].contains("Content-Length: 5\r\n") && parts[2].ends_with("\r\n\r\nxxxxx"));
        assert!(
            parts[3].contains("Content-Length: 451\r\n") && parts[3].ends_with("\r\n\r\n"),
            "HEAD has no body"
        );
        assert!(!text.contains("Connection: close"));
        assert!(!s.finished() && s.wants_read());
        assert_eq!(s.stats.responses_2xx, 3);
    }

    #[test]
    fn a_request_split_anywhere_is_answered_once_complete() {
        let req = b"GET /bytes/3 HTTP/1.1\r\nHost: a\r\n\r\n";
        for cut in 1..req.len() {
            let mut s = Session::default();
            s.input(&req[..cut]);
            assert!(s.output().is_none(), "answered before complete at {cut}");
            s.input(&req[cut..]);
            assert!(s.output().is_some(), "not answered at {cut}");
        }
    }

    #[test]
    fn bad_requests_get_their_status_and_close_where_they_must() {
        let cases: [(&[u8], &str, bool); 9] = [
            (b"GARBAGE\r\n\r\n", "400 Bad Request", true),
            (
                b"GET /nope HTTP/1.1\r\nHost: a\r\n\r\n",
                "404 Not Found",
                false,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
                "405 Method Not Allowed",
                false,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                "501 Not Implemented",
                true,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 999999999\r\n\r\n",
                "413 Content Too Large",
                true,
            ),
            (b"GET / HTTP/1.1\r\n\r\n", "400 Bad Request", true),
            (
                b"GET /bytes/x HTTP/1.1\r\nHost: a\r\n\r\n",
                "400 Bad Request",
                false,
            ),
            (
                b"GET /work/99999999 HTTP/1.1\r\nHost: a\r\n\r\n",
                "400 Bad Request",
                false,
            ),
            (b"GET / HTTP/1.0\r\n\r\n", "200 OK", true),
        ];
        for (req, want, closes) in cases {
            let (out, s) = run(req);
            let text = String::from_utf8_lossy(&out);
            assert!(text.starts_with(&format!("HTTP/1.1 {want}")), "{text}");
            assert_eq!(s.finished(), closes, "{text}");
            assert_eq!(text.contains("Connection: close"), closes, "{text}");
        }
        let (out, _) = run(b"PUT / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(String::from_utf8_lossy(&out).contains("Allow: GET, HEAD\r\n"));
    }

    #[test]
    fn oversized_heads_and_too_many_headers_get_431_and_bounded_memory() {
        let mut s = Session::default();
        let mut big = b"GET / HTTP/1.1\r\nHost: a\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        s.input(&big);
        let text = String::from_utf8_lossy(s.output().unwrap()).to_string();
        assert!(text.starts_with("HTTP/1.1 431"), "{text}");
        assert!(s.buf.len() <= MAX_HEAD + 64 * 1024);
        s.input(b"more bytes are ignored once closing");
        let mut many = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        for i in 0..MAX_HEADERS + 1 {
            many.extend(format!("H{i}: v\r\n").bytes());
        }
        many.extend(b"\r\n");
        let (out, s) = run(&many);
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 431"));
        assert!(s.finished());
    }

    #[test]
    fn a_get_body_is_dropped_and_the_next_request_still_parsed() {
        let (out, s) = run(
            b"GET /hello.txt HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nabcdGET /bytes/2 HTTP/1.1\r\nHost: a\r\n\r\n",
        );
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("200 OK").count(), 2, "{text}");
        assert!(text.ends_with("xx"));
        assert_eq!(s.stats.responses(), 2);
    }

    #[test]
    fn large_bodies_stream_in_pieces_and_stop_reading_while_queued() {
        let (out, _) = run(b"GET /bytes/200000 HTTP/1.1\r\nHost: a\r\n\r\n");
        let body = out.split(|b| *b == b'\n').next_back().unwrap();
        assert!(out.ends_with(&[b'x'; 100]));
        assert!(body.len() >= 200_000 - 1);
        let mut s = Session::default();
        s.input(b"GET /bytes/2000000 HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(!s.wants_read(), "2 MB queued: stop reading");
    }
}
