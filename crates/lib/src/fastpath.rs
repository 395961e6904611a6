//! An established connection's next segment over a fast channel, sent from the headers of its
//! last one.
//!
//! A request or an answer that fits one segment is, once its connection is established, the
//! same headers as the segment before it but for the IPv4 length, the sequence and
//! acknowledgement numbers and the window. smoltcp's egress builds them anew for every segment
//! (its walk over the sockets to send for, the socket's dispatch, the IP and Ethernet emitting,
//! the route's look-up): about 1,850 instructions of a 64 B ping-pong's round trip over a
//! channel. So after a `write`, when smoltcp says the connection's queued bytes are one plain
//! segment ([`smoltcp::socket::tcp::Socket::fast_segment`]: established, nothing else due), the
//! device writes that segment from the headers it kept of the connection's last one sent on the
//! same channel, and smoltcp records it as its dispatch would have
//! ([`smoltcp::socket::tcp::Socket::fast_sent`]). Anything else (no headers kept, another path
//! now, frames waiting for the ring, checksums on, options) goes the usual way.
//!
//! The kept headers are what smoltcp itself emitted for the connection, so every field not
//! named above is smoltcp's own; nothing in them is read from shared memory.

use crate::frame::{ETH, ETHERTYPE_IPV4};
use crate::raw::Route;
use smoltcp::socket::tcp::FastSegment;
use std::net::Ipv4Addr;

const IP: usize = ETH;
const TCP: usize = ETH + 20;
/// Ethernet, IPv4 and TCP headers, without options.
pub(crate) const HEAD: usize = ETH + 20 + 20;
/// Connections whose headers are kept (the one least recently sent on is forgotten beyond).
const KEPT: usize = 64;

/// The headers of a connection's last segment sent on a channel.
#[derive(Debug, Clone)]
struct Kept {
    remote: Ipv4Addr,
    remote_port: u16,
    local_port: u16,
    route: Route,
    head: [u8; HEAD],
}

/// Headers kept, per connection, for its next segment; the most recently used last.
#[derive(Debug, Default)]
pub(crate) struct Heads {
    kept: Vec<Kept>,
}

impl Heads {
    /// Keeps `head`, the headers of a TCP segment with a payload that left on `route` (a fast
    /// channel), when they are plain: IPv4 and TCP without options, checksums left at zero
    /// (the stack computes none). Others are not kept.
    pub(crate) fn keep(&mut self, route: Route, head: &[u8]) {
        let Ok(head) = <[u8; HEAD]>::try_from(head) else {
            return;
        };
        if head[12..14] != ETHERTYPE_IPV4.to_be_bytes()
            || head[IP] != 0x45
            || head[IP + 9] != 6
            || head[IP + 10..IP + 12] != [0, 0]
            || head[TCP + 12] != 0x50
            || head[TCP + 16..TCP + 18] != [0, 0]
        {
            return;
        }
        let remote = Ipv4Addr::new(head[30], head[31], head[32], head[33]);
        let local_port = u16::from_be_bytes([head[TCP], head[TCP + 1]]);
        let remote_port = u16::from_be_bytes([head[TCP + 2], head[TCP + 3]]);
        let k = Kept {
            remote,
            remote_port,
            local_port,
            route,
            head,
        };
        match self.find(remote, remote_port, local_port) {
            Some(i) => {
                self.kept[i] = k;
                self.kept[i..].rotate_left(1);
            }
            None => {
                if self.kept.len() >= KEPT {
                    self.kept.remove(0);
                }
                self.kept.push(k);
            }
        }
    }

    /// Where the headers of a connection are, looked for from the most recently used.
    fn find(&self, remote: Ipv4Addr, remote_port: u16, local_port: u16) -> Option<usize> {
        self.kept.iter().rposition(|t| {
            t.remote == remote && t.remote_port == remote_port && t.local_port == local_port
        })
    }

    /// The headers of `seg` from those kept of its connection, and the channel they went on;
    /// `None` when none are kept (or `seg` is not IPv4, or too long for one IPv4 packet).
    pub(crate) fn head_for(&mut self, seg: &FastSegment<'_>) -> Option<(Route, [u8; HEAD])> {
        let smoltcp::wire::IpAddress::Ipv4(remote) = seg.remote.addr else {
            return None;
        };
        let i = self.find(remote, seg.remote.port, seg.local.port)?;
        let total = u16::try_from(HEAD - ETH + seg.payload.len()).ok()?;
        // the most recently used last: the one forgotten first is the one least used
        self.kept[i..].rotate_left(1);
        let t = self.kept.last()?;
        let mut h = t.head;
        h[IP + 2..IP + 4].copy_from_slice(&total.to_be_bytes());
        h[TCP + 4..TCP + 8].copy_from_slice(&(seg.seq.0 as u32).to_be_bytes());
        h[TCP + 8..TCP + 12].copy_from_slice(&(seg.ack.0 as u32).to_be_bytes());
        h[TCP + 13] = 0x18; // PSH, ACK
        h[TCP + 14..TCP + 16].copy_from_slice(&seg.window.to_be_bytes());
        Some((t.route, h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::{IpEndpoint, TcpSeqNumber};

    fn head(seq: u32, flags: u8) -> [u8; HEAD] {
        let mut h = [0u8; HEAD];
        h[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        h[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        h[12..14].copy_from_slice(&[0x08, 0x00]);
        h[IP] = 0x45;
        h[IP + 2..IP + 4].copy_from_slice(&104u16.to_be_bytes());
        h[IP + 6] = 0x40;
        h[IP + 8] = 64;
        h[IP + 9] = 6;
        h[IP + 12..IP + 16].copy_from_slice(&[10, 0, 0, 1]);
        h[IP + 16..IP + 20].copy_from_slice(&[10, 0, 0, 2]);
        h[TCP..TCP + 2].copy_from_slice(&40000u16.to_be_bytes());
        h[TCP + 2..TCP + 4].copy_from_slice(&7000u16.to_be_bytes());
        h[TCP + 4..TCP + 8].copy_from_slice(&seq.to_be_bytes());
        h[TCP + 12] = 0x50;
        h[TCP + 13] = flags;
        h
    }

    fn seg(payload: &[u8], port: u16) -> FastSegment<'_> {
        FastSegment {
            local: IpEndpoint::new(Ipv4Addr::new(10, 0, 0, 1).into(), 40000),
            remote: IpEndpoint::new(Ipv4Addr::new(10, 0, 0, 2).into(), port),
            seq: TcpSeqNumber(1064),
            ack: TcpSeqNumber(-7),
            window: 2048,
            payload,
        }
    }

    #[test]
    fn the_next_segment_differs_only_in_length_numbers_and_window() {
        let mut heads = Heads::default();
        let last = head(1000, 0x10);
        heads.keep(Route::FastChannel(3), &last);
        let (route, h) = heads.head_for(&seg(&[7; 10], 7000)).unwrap();
        assert_eq!(route, Route::FastChannel(3));
        let mut want = last;
        want[IP + 2..IP + 4].copy_from_slice(&50u16.to_be_bytes());
        want[TCP + 4..TCP + 8].copy_from_slice(&1064u32.to_be_bytes());
        want[TCP + 8..TCP + 12].copy_from_slice(&u32::MAX.wrapping_sub(6).to_be_bytes());
        want[TCP + 13] = 0x18;
        want[TCP + 14..TCP + 16].copy_from_slice(&2048u16.to_be_bytes());
        assert_eq!(h, want);
        // another connection's segment: nothing kept for it
        assert!(heads.head_for(&seg(&[7; 10], 7001)).is_none());
    }

    #[test]
    fn only_plain_headers_are_kept_and_the_least_used_goes_first() {
        let mut heads = Heads::default();
        // options, a checksum, IPv6, IP options, a short header
        let mut opts = head(1, 0x18);
        opts[TCP + 12] = 0x80;
        let mut sum = head(1, 0x18);
        sum[TCP + 16] = 1;
        let mut ipsum = head(1, 0x18);
        ipsum[IP + 10] = 1;
        let mut v6 = head(1, 0x18);
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        let mut ihl = head(1, 0x18);
        ihl[IP] = 0x46;
        for h in [
            &opts[..],
            &sum,
            &ipsum,
            &v6,
            &ihl,
            &head(1, 0x18)[..HEAD - 1],
        ] {
            heads.keep(Route::FastChannel(1), h);
        }
        assert!(heads.kept.is_empty());
        for port in 0..KEPT as u16 + 1 {
            let mut h = head(1, 0x18);
            h[TCP + 2..TCP + 4].copy_from_slice(&port.to_be_bytes());
            heads.keep(Route::FastChannel(1), &h);
        }
        assert_eq!(heads.kept.len(), KEPT);
        assert!(heads.head_for(&seg(b"x", 0)).is_none());
        assert!(heads.head_for(&seg(b"x", KEPT as u16)).is_some());
        // a connection used again is kept over those not used since
        assert!(heads.head_for(&seg(b"x", 1)).is_some());
        let mut h = head(1, 0x18);
        h[TCP + 2..TCP + 4].copy_from_slice(&999u16.to_be_bytes());
        heads.keep(Route::FastChannel(1), &h);
        assert!(heads.head_for(&seg(b"x", 1)).is_some());
        assert!(heads.head_for(&seg(b"x", 2)).is_none());
        assert!(heads.head_for(&seg(b"x", 999)).is_some());
        // a payload that no IPv4 packet holds
        let big = vec![0u8; 65536];
        assert!(heads.head_for(&seg(&big, 1)).is_none());
    }
}
