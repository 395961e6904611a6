//! Packet capture: the master threads mirror one pipe's frames into a bounded tap that the
//! control plane streams to a `docknet capture` client.
//!
//! Off, it costs one branch on an `Option` per frame. On, the master copies at most the
//! snap length of each frame into a queue bounded in frames ([`QUEUE`]) and in bytes
//! ([`BUDGET`]); a frame that finds the tap full is dropped from the capture (counted in
//! [`Tap::dropped`]), never from the data path. Fast channels carry frames between the
//! partners without the daemon, so their frames are not in a capture.
//!
//! On the control socket a capture is one request, `{"op": "capture", "name": ..}`; after
//! its JSON reply line the connection carries [`Record`]s, each as an 18-byte header
//! (kind 1, direction 0 out or 1 in, realtime timestamp in ns, length on the pipe, captured
//! length, all little-endian `u8`/`u8`/`u64`/`u32`/`u32`) and the captured bytes, and ends with one summary (kind 2, a
//! length-prefixed JSON [`Summary`]).

use crossbeam_queue::ArrayQueue;
use docknet_pipe::region::Region;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

/// Frames a tap holds before it drops from the capture.
pub const QUEUE: usize = 4096;
/// Bytes a tap holds before it drops from the capture.
pub const BUDGET: i64 = 16 << 20;
/// Captures running at once (on all pipes together).
pub const MAX_CAPTURES: usize = 8;
/// Default and largest snap length.
pub const MAX_SNAPLEN: u32 = 65535;
/// Smallest snap length (an Ethernet, IPv4 and TCP header).
pub const MIN_SNAPLEN: u32 = 64;
/// Record kinds on the wire.
pub const KIND_FRAME: u8 = 1;
/// The final summary.
pub const KIND_SUMMARY: u8 = 2;
/// Bytes before a record's data.
pub const RECORD_HEADER: usize = 18;

/// Which way a frame went, seen from the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Sent by the container (taken from its tx ring).
    Out,
    /// Delivered to the container (put into its rx ring).
    In,
}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// CLOCK_REALTIME when the master handled it, ns.
    pub ts_ns: u64,
    /// Its length on the pipe.
    pub orig_len: u32,
    /// Which way it went.
    pub dir: Dir,
    /// Its first bytes (up to the snap length).
    pub data: Vec<u8>,
}

impl Record {
    /// The record as the control socket carries it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(KIND_FRAME);
        out.push(u8::from(self.dir == Dir::In));
        out.extend_from_slice(&self.ts_ns.to_le_bytes());
        out.extend_from_slice(&self.orig_len.to_le_bytes());
        out.extend_from_slice(&(self.data.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.data);
    }
}

/// What a capture saw, sent last.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Frames sent to the client.
    pub captured: u64,
    /// Frames dropped from the capture (the tap was full: the client read too slowly).
    pub dropped: u64,
    /// Why it ended: `count` (as many as asked), `removed` (the pipe went away) or `stopped`
    /// (the client shut its sending side, as `docknet capture` does on Ctrl-C: what the tap
    /// held then was sent first). A daemon that stops closes the stream without a summary.
    pub ended: String,
}

/// A capture point on one pipe, shared by the master threads (producers) and the control
/// plane (the consumer).
#[derive(Debug)]
pub struct Tap {
    /// The pipe's id.
    pub pipe: u64,
    /// Bytes kept of each frame.
    pub snaplen: usize,
    queue: ArrayQueue<Record>,
    budget: AtomicI64,
    /// Frames dropped from the capture.
    pub dropped: AtomicU64,
    /// Set when the capture ends: the masters stop offering.
    pub closed: AtomicBool,
}

impl Tap {
    /// A tap on pipe `pipe` keeping `snaplen` bytes of each frame.
    pub fn new(pipe: u64, snaplen: u32) -> Tap {
        Tap {
            pipe,
            snaplen: snaplen.clamp(MIN_SNAPLEN, MAX_SNAPLEN) as usize,
            queue: ArrayQueue::new(QUEUE),
            budget: AtomicI64::new(BUDGET),
            dropped: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Room for `n` more bytes? Takes them from the budget if so; counts a drop if not.
    fn reserve(&self, n: usize) -> bool {
        if self.closed.load(Ordering::Relaxed) {
            return false;
        }
        let n = n as i64;
        if self.queue.is_full() || self.budget.fetch_sub(n, Ordering::Relaxed) < n {
            if !self.queue.is_full() {
                // the budget was short: give back what was taken
                self.budget.fetch_add(n, Ordering::Relaxed);
            }
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn push(&self, r: Record) {
        let n = r.data.len() as i64;
        if self.queue.push(r).is_err() {
            self.budget.fetch_add(n, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Offers the frame at `off..off + len` of `region` (with `hdr` over its start, as the
    /// master checked it).
    pub fn offer_region(&self, region: &Region, off: usize, len: usize, hdr: &[u8], dir: Dir) {
        let keep = len.min(self.snaplen);
        if !self.reserve(keep) {
            return;
        }
        let mut data = vec![0u8; keep];
        if !region.read(off, &mut data) {
            self.budget.fetch_add(keep as i64, Ordering::Relaxed);
            return;
        }
        let h = hdr.len().min(keep);
        data[..h].copy_from_slice(&hdr[..h]);
        self.push(Record {
            ts_ns: realtime_ns(),
            orig_len: len as u32,
            dir,
            data,
        });
    }

    /// Offers a frame the master holds as bytes.
    pub fn offer_bytes(&self, bytes: &[u8], dir: Dir) {
        let keep = bytes.len().min(self.snaplen);
        if !self.reserve(keep) {
            return;
        }
        self.push(Record {
            ts_ns: realtime_ns(),
            orig_len: bytes.len() as u32,
            dir,
            data: bytes[..keep].to_vec(),
        });
    }

    /// Takes the next record, returning its bytes to the budget.
    pub fn pop(&self) -> Option<Record> {
        let r = self.queue.pop()?;
        self.budget
            .fetch_add(r.data.len() as i64, Ordering::Relaxed);
        Some(r)
    }
}

fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Reads one record (or the summary) from a capture stream: `Ok(None)` at a clean end.
/// Everything is checked: a kind other than the two, a captured length over
/// [`MAX_SNAPLEN`] or over the frame's own length is an error.
pub fn read_record(r: &mut impl std::io::Read) -> std::io::Result<Option<Result<Record, Summary>>> {
    use std::io::{Error, ErrorKind};
    let mut kind = [0u8; 1];
    match r.read_exact(&mut kind) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let bad = |m: &str| Error::new(ErrorKind::InvalidData, m.to_string());
    match kind[0] {
        KIND_FRAME => {
            let mut h = [0u8; RECORD_HEADER - 1];
            r.read_exact(&mut h)?;
            let dir = match h[0] {
                0 => Dir::Out,
                1 => Dir::In,
                _ => return Err(bad("an unknown direction")),
            };
            let ts_ns = u64::from_le_bytes(h[1..9].try_into().unwrap_or_default());
            let orig_len = u32::from_le_bytes(h[9..13].try_into().unwrap_or_default());
            let cap = u32::from_le_bytes(h[13..17].try_into().unwrap_or_default());
            if cap > MAX_SNAPLEN || cap > orig_len {
                return Err(bad(
                    "a captured length longer than the snap length or the frame",
                ));
            }
            let mut data = vec![0u8; cap as usize];
            r.read_exact(&mut data)?;
            Ok(Some(Ok(Record {
                ts_ns,
                orig_len,
                dir,
                data,
            })))
        }
        KIND_SUMMARY => {
            let mut n = [0u8; 4];
            r.read_exact(&mut n)?;
            let n = u32::from_le_bytes(n) as usize;
            if n > 4096 {
                return Err(bad("a summary longer than 4 KiB"));
            }
            let mut b = vec![0u8; n];
            r.read_exact(&mut b)?;
            let s = serde_json::from_slice(&b).map_err(|e| bad(&e.to_string()))?;
            Ok(Some(Err(s)))
        }
        _ => Err(bad("an unknown record kind")),
    }
}

/// Encodes the summary record.
pub fn encode_summary(s: &Summary, out: &mut Vec<u8>) {
    let j = serde_json::to_vec(s).unwrap_or_default();
    out.push(KIND_SUMMARY);
    out.extend_from_slice(&(j.len() as u32).to_le_bytes());
    out.extend_from_slice(&j);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_lies_are_refused() {
        let r = Record {
            ts_ns: 1_700_000_000_123_456_789,
            orig_len: 1514,
            dir: Dir::In,
            data: vec![7; 96],
        };
        let mut b = Vec::new();
        r.encode(&mut b);
        let s = Summary {
            captured: 1,
            dropped: 2,
            ended: "count".into(),
        };
        encode_summary(&s, &mut b);
        let mut rd = &b[..];
        assert_eq!(read_record(&mut rd).unwrap(), Some(Ok(r)));
        assert_eq!(read_record(&mut rd).unwrap(), Some(Err(s)));
        assert_eq!(read_record(&mut rd).unwrap(), None);
        // captured more than the frame's length
        let mut lie = vec![KIND_FRAME, 0];
        lie.extend_from_slice(&0u64.to_le_bytes());
        lie.extend_from_slice(&10u32.to_le_bytes());
        lie.extend_from_slice(&20u32.to_le_bytes());
        assert!(read_record(&mut &lie[..]).is_err());
        assert!(read_record(&mut &[9u8][..]).is_err());
    }

    #[test]
    fn a_full_tap_drops_from_the_capture_and_counts() {
        let t = Tap::new(1, 100);
        for _ in 0..QUEUE + 10 {
            t.offer_bytes(&[0u8; 60], Dir::Out);
        }
        assert_eq!(t.dropped.load(Ordering::Relaxed), 10);
        let mut n = 0;
        while t.pop().is_some() {
            n += 1;
        }
        assert_eq!(n, QUEUE);
        // the budget came back whole
        t.offer_bytes(&[1u8; 200], Dir::In);
        let r = t.pop().unwrap();
        assert_eq!((r.orig_len, r.data.len()), (200, 100));
        t.closed.store(true, Ordering::Relaxed);
        t.offer_bytes(&[1u8; 20], Dir::In);
        assert!(t.pop().is_none());
    }
}
