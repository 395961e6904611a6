//! The forwarder of `docknet-forward` (the "ping" service of Kratzke's chain): every client
//! connection gets a keep-alive connection of its own to the upstream server; requests go up as
//! they came, answers come back byte for byte. One thread, one event loop over [`Io`] (kernel
//! sockets or DockLib), so a hop costs a wake-up of this loop and nothing else: no thread per
//! connection handing work to another.
//!
//! The client's bytes are read as HTTP/1.1 requests ([`Requests`]: heads parsed by httparse,
//! `Content-Length` bodies; chunked bodies and heads over [`MAX_HEAD`] end the connection), so
//! the forwarder counts what it forwarded and never relays garbage upstream. Each direction
//! buffers at most [`MAX_PENDING`] bytes (and one read more): a side that cannot keep up stops the other side's
//! reads instead of growing memory.

use crate::io::{Io, Item};
use docknet_lib::{Interest, Ready};
use std::io;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Largest request head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most bytes buffered per direction and connection.
pub const MAX_PENDING: usize = 128 * 1024;
/// Most client connections served at once (more are accepted and closed).
pub const MAX_CONNS: usize = 4096;

/// Why a client's request stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    /// The head grew past [`MAX_HEAD`] without ending.
    #[error("a request head longer than {MAX_HEAD} bytes")]
    HeadTooLong,
    /// httparse refused the head.
    #[error("a malformed request head: {0}")]
    Malformed(String),
    /// A body the forwarder cannot delimit.
    #[error("chunked request bodies are not forwarded")]
    Chunked,
    /// A Content-Length that is not a number.
    #[error("a bad Content-Length")]
    BadLength,
}

/// Follows a client's byte stream request by request: where heads end and bodies stop. Linear
/// in the bytes fed, however they are cut and however many requests one read holds.
#[derive(Debug, Default)]
pub struct Requests {
    /// The head being read (bytes since the last request ended).
    head: Vec<u8>,
    /// How much of the blank line (`\r\n\r\n`) the head's last bytes match.
    matched: u8,
    /// Body bytes of the current request still to come.
    body_left: u64,
    /// Requests whose head was complete.
    pub count: u64,
}

impl Requests {
    /// Takes the next bytes of the stream.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), BadRequest> {
        let mut at = 0;
        while at < data.len() {
            if self.body_left > 0 {
                let k = self.body_left.min((data.len() - at) as u64) as usize;
                self.body_left -= k as u64;
                at += k;
                continue;
            }
            let mut end = None;
            for (i, &b) in data[at..].iter().enumerate() {
                self.matched = match (self.matched, b) {
                    (0 | 2, b'\r') => self.matched + 1,
                    (1 | 3, b'\n') => self.matched + 1,
                    (_, b'\r') => 1,
                    _ => 0,
                };
                if self.matched == 4 {
                    end = Some(at + i + 1);
                    break;
                }
                if self.head.len() + i >= MAX_HEAD {
                    return Err(BadRequest::HeadTooLong);
                }
            }
            let Some(end) = end else {
                self.head.extend_from_slice(&data[at..]);
                return Ok(());
            };
            self.head.extend_from_slice(&data[at..end]);
            self.body_left = body_length(&self.head)?;
            self.count += 1;
            self.head.clear();
            self.matched = 0;
            at = end;
        }
        Ok(())
    }
}

/// The body length a request head announces.
fn body_length(head: &[u8]) -> Result<u64, BadRequest> {
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut hs);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return Err(BadRequest::Malformed("incomplete".into()));
        }
        Err(e) => return Err(BadRequest::Malformed(e.to_string())),
    }
    let mut len = 0;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(BadRequest::Chunked);
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            len = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or(BadRequest::BadLength)?;
        }
    }
    Ok(len)
}

/// Bytes waiting to be written, read straight into it from one socket and written from it
/// to the other (no copy in between). Grows to at most [`MAX_PENDING`] and keeps its memory.
#[derive(Debug, Default)]
struct Pending {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

/// Bytes asked of a socket per read.
const CHUNK: usize = 64 * 1024;

impl Pending {
    fn len(&self) -> usize {
        self.end - self.start
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn has_room(&self) -> bool {
        self.len() < MAX_PENDING
    }

    /// Room for one read at the end: moves what is left to the front or grows.
    fn room(&mut self) -> &mut [u8] {
        if self.buf.len() - self.end < CHUNK && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < CHUNK {
            self.buf.resize(self.end + CHUNK, 0);
        }
        &mut self.buf[self.end..self.end + CHUNK]
    }

    fn filled(&mut self, n: usize) -> &[u8] {
        self.end += n;
        &self.buf[self.end - n..self.end]
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn wrote(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }
}

/// One client connection and its upstream connection.
struct Relay<C> {
    client: C,
    up: C,
    connected: bool,
    to_up: Pending,
    to_client: Pending,
    client_eof: bool,
    up_shut: bool,
    up_eof: bool,
    requests: Requests,
}

impl<C> Relay<C> {
    fn client_interest(&self) -> Interest {
        Interest {
            read: !self.client_eof && self.to_up.has_room(),
            write: !self.to_client.is_empty(),
        }
    }

    fn up_interest(&self) -> Interest {
        Interest {
            read: self.connected && !self.up_eof && self.to_client.has_room(),
            write: !self.connected || !self.to_up.is_empty(),
        }
    }
}

/// What [`forward`] counted.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ForwardStats {
    /// Client connections accepted.
    pub connections: u64,
    /// Requests forwarded.
    pub forwarded: u64,
    /// Connections ended because the client sent something that is not a request.
    pub bad_requests: u64,
    /// Connections ended because the upstream could not be reached or failed.
    pub upstream_errors: u64,
    /// Connections refused because [`MAX_CONNS`] were open.
    pub refused: u64,
}

/// How a relay's turn ended.
enum Turn {
    Alive,
    Done,
    BadRequest,
    UpstreamError,
}

/// Forwards every connection of `l` to `to` in this thread until `stop` is set.
pub fn forward<I: Io>(
    io: &I,
    mut l: I::Listener,
    to: SocketAddrV4,
    tick: Duration,
    stop: &AtomicBool,
) -> io::Result<ForwardStats> {
    let mut relays: Vec<Relay<I::Conn>> = Vec::new();
    let mut stats = ForwardStats::default();
    let mut ready: Vec<(usize, Ready)> = Vec::new();
    let mut touched: Vec<usize> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        {
            let mut items = Vec::with_capacity(2 * relays.len() + 1);
            items.push(Item::Listener(&l));
            for r in &relays {
                items.push(Item::Conn(&r.client, r.client_interest()));
                items.push(Item::Conn(&r.up, r.up_interest()));
            }
            io.wait(&items, Some(tick), &mut ready)?;
        }
        touched.clear();
        for &(i, _) in &ready {
            if i == 0 {
                accept_all(io, &mut l, to, &mut relays, &mut stats);
            } else {
                touched.push((i - 1) / 2);
            }
        }
        touched.dedup();
        let mut gone = Vec::new();
        for &k in &touched {
            let r = &mut relays[k];
            match pump(io, r) {
                Turn::Alive => continue,
                Turn::Done => {}
                Turn::BadRequest => stats.bad_requests += 1,
                Turn::UpstreamError => stats.upstream_errors += 1,
            }
            gone.push(k);
        }
        // highest first, so swap_remove keeps the other indices valid
        gone.sort_unstable_by(|a, b| b.cmp(a));
        gone.dedup();
        for k in gone {
            let r = relays.swap_remove(k);
            stats.forwarded += r.requests.count;
        }
    }
    stats.forwarded += relays.iter().map(|r| r.requests.count).sum::<u64>();
    Ok(stats)
}

fn accept_all<I: Io>(
    io: &I,
    l: &mut I::Listener,
    to: SocketAddrV4,
    relays: &mut Vec<Relay<I::Conn>>,
    stats: &mut ForwardStats,
) {
    for _ in 0..256 {
        let Ok(client) = io.accept(l) else { return };
        stats.connections += 1;
        if relays.len() >= MAX_CONNS {
            stats.refused += 1;
            continue;
        }
        let Ok(up) = io.connect(to) else {
            stats.upstream_errors += 1;
            continue;
        };
        relays.push(Relay {
            client,
            up,
            connected: false,
            to_up: Pending::default(),
            to_client: Pending::default(),
            client_eof: false,
            up_shut: false,
            up_eof: false,
            requests: Requests::default(),
        });
    }
}

/// Reads from `c` into `p` while it has room, showing each read to `check`; true at the end
/// of the stream.
fn read_side<I: Io>(
    io: &I,
    c: &mut I::Conn,
    p: &mut Pending,
    mut check: impl FnMut(&[u8]) -> Result<(), BadRequest>,
) -> Result<bool, Turn> {
    for _ in 0..4 {
        if !p.has_room() {
            break;
        }
        match io.read(c, p.room()) {
            Ok(0) => return Ok(true),
            Ok(n) => {
                check(p.filled(n)).map_err(|_| Turn::BadRequest)?;
                if n < CHUNK {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => return Err(Turn::Done),
        }
    }
    Ok(false)
}

/// Writes what `p` holds to `c` as far as it goes.
fn write_side<I: Io>(io: &I, c: &mut I::Conn, p: &mut Pending) -> Result<(), ()> {
    while !p.is_empty() {
        match io.write(c, p.bytes()) {
            Ok(0) => return Err(()),
            Ok(n) => p.wrote(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => return Err(()),
        }
    }
    Ok(())
}

/// Moves what a relay's sockets allow, both ways.
fn pump<I: Io>(io: &I, r: &mut Relay<I::Conn>) -> Turn {
    if !r.connected {
        match io.connected(&mut r.up) {
            None => {}
            Some(Ok(())) => r.connected = true,
            Some(Err(_)) => return Turn::UpstreamError,
        }
    }
    // client -> upstream
    if !r.client_eof {
        let requests = &mut r.requests;
        match read_side(io, &mut r.client, &mut r.to_up, |d| requests.feed(d)) {
            Ok(eof) => r.client_eof = eof,
            Err(t) => return t,
        }
    }
    if r.connected {
        if write_side(io, &mut r.up, &mut r.to_up).is_err() {
            return Turn::UpstreamError;
        }
        if r.client_eof && r.to_up.is_empty() && !r.up_shut {
            // the client is done asking: the upstream answers what it has, then closes
            io.shutdown_write(&mut r.up);
            r.up_shut = true;
        }
        // upstream -> client
        if !r.up_eof {
            match read_side(io, &mut r.up, &mut r.to_client, |_| Ok(())) {
                Ok(eof) => r.up_eof = eof,
                Err(_) => return Turn::UpstreamError,
            }
        }
    }
    if write_side(io, &mut r.client, &mut r.to_client).is_err() {
        return Turn::Done;
    }
    if r.up_eof && r.to_client.is_empty() {
        return Turn::Done;
    }
    Turn::Alive
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_are_counted_across_bodies_and_pipelining() {
        let mut r = Requests::default();
        r.feed(
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
        )
        .unwrap();
        assert_eq!(r.count, 2);
        // the body's last bytes look like a head's end: still body
        r.feed(b"\r\n\r").unwrap();
        assert_eq!(r.count, 2);
        r.feed(b"GET /c HTTP/1.1\r\n").unwrap();
        assert_eq!(r.count, 2);
        r.feed(b"\r\n").unwrap();
        assert_eq!(r.count, 3);
    }

    #[test]
    fn what_is_not_a_request_is_refused() {
        for (bytes, want) in [
            (
                &b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
                BadRequest::Chunked,
            ),
            (
                b"GET / HTTP/1.1\r\nContent-Length: ten\r\n\r\n",
                BadRequest::BadLength,
            ),
        ] {
            assert_eq!(Requests::default().feed(bytes), Err(want));
        }
        assert!(matches!(
            Requests::default().feed(b"\x00\x01 nonsense\r\n\r\n"),
            Err(BadRequest::Malformed(_))
        ));
        let mut r = Requests::default();
        let long = vec![b'a'; MAX_HEAD + 1];
        assert_eq!(r.feed(&long), Err(BadRequest::HeadTooLong));
    }

    proptest! {
        /// However the stream is cut, the same requests are counted.
        #[test]
        fn cuts_do_not_change_the_count(cuts in proptest::collection::vec(1usize..40, 1..20)) {
            let stream = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 12\r\n\r\n\r\n\r\n\r\n\r\n\r\nGET /c HTTP/1.1\r\n\r\n".repeat(3);
            let mut r = Requests::default();
            let mut at = 0;
            for c in cuts.iter().cycle() {
                if at >= stream.len() {
                    break;
                }
                let end = (at + c).min(stream.len());
                r.feed(&stream[at..end]).unwrap();
                at = end;
            }
            prop_assert_eq!(r.count, 9);
        }
    }
}
