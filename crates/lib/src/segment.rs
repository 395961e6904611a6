//! TCP segmentation in software (what a NIC's TSO does): a TCP frame larger than its path
//! carries is cut into frames that fit, each with its own copy of the headers.
//!
//! Why: smoltcp builds packets up to one interface MTU. A container with a fast channel of
//! 64 KiB frames and a pipe of 1500-byte frames tells smoltcp the larger MTU, so connections to
//! the partner move 64 KiB segments (one pass through the stack where 45 were needed); a segment
//! that ends up on the smaller path (a peer through the daemon that also advertised a large
//! MSS, or a channel gone while its connection lives on) is cut here instead of being lost.
//!
//! Each piece keeps the original's headers and options, with the sequence number advanced by
//! its offset, the IP length (and IPv4 identification) its own, FIN and PSH on the last piece
//! only and CWR on the first only (as Linux's GSO does). Checksums are computed when the stack
//! computes them; otherwise left as smoltcp left them (the daemon fills them at the wire).

use crate::frame::ETH;
use smoltcp::wire::{checksum, IpProtocol};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Headers of one frame are at most this long (Ethernet, IPv4 with options, TCP with options).
pub const MAX_HEADERS: usize = ETH + 60 + 60;

/// Smallest payload a piece may carry: a path too small for this is refused.
const MIN_CHUNK: usize = 8;

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const CWR: u8 = 0x80;

/// Where the parts of a TCP frame are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tcp {
    /// IPv4 (false: IPv6).
    v4: bool,
    /// Offset of the TCP header.
    tcp: usize,
    /// End of the headers (start of the payload).
    payload: usize,
    /// End of the payload (the IP packet's end; padding beyond is ignored).
    end: usize,
}

/// Whether `frame` is a TCP segment this module can cut (and a path carries beyond its MTU).
pub fn is_tcp(frame: &[u8]) -> bool {
    parse(frame).is_some()
}

/// The layout of `frame` if it is a TCP segment this module can cut: IPv4 (not a fragment) or
/// IPv6 with TCP as its first next header, lengths consistent with the frame.
fn parse(frame: &[u8]) -> Option<Tcp> {
    parse_head(frame, frame.len())
}

/// Whether `head`, the first bytes of a frame of `len` bytes, holds all the headers of a TCP
/// segment this module can cut ([`is_tcp`]), with lengths consistent with `len`, and the
/// segment is not a SYN: a frame with no work before smoltcp (no SYN to admit or clamp).
pub fn plain_tcp_head(head: &[u8], len: usize) -> bool {
    plain_tcp_payload(head, len).is_some()
}

/// [`plain_tcp_head`], saying where the payload starts (the length of the headers).
pub fn plain_tcp_payload(head: &[u8], len: usize) -> Option<usize> {
    parse_head(head, len)
        .filter(|t| t.payload <= head.len() && head[t.tcp + 13] & SYN == 0)
        .map(|t| t.payload)
}

/// [`parse`] of a frame of `len` bytes from its first bytes `frame` (all of it, or its headers).
fn parse_head(frame: &[u8], len: usize) -> Option<Tcp> {
    let be16 = |i: usize| Some(u16::from_be_bytes([*frame.get(i)?, *frame.get(i + 1)?]) as usize);
    let (v4, tcp, end) = match be16(12)? {
        0x0800 => {
            let ihl = usize::from(frame.get(ETH)? & 0x0f) * 4;
            let frag = be16(ETH + 6)? & 0x3fff;
            if frame[ETH] >> 4 != 4 || ihl < 20 || frag != 0 || *frame.get(ETH + 9)? != 6 {
                return None;
            }
            (true, ETH + ihl, ETH + be16(ETH + 2)?)
        }
        0x86dd => {
            if frame.get(ETH)? >> 4 != 6 || *frame.get(ETH + 6)? != 6 {
                return None;
            }
            (false, ETH + 40, ETH + 40 + be16(ETH + 4)?)
        }
        _ => return None,
    };
    let doff = usize::from(frame.get(tcp + 12)? >> 4) * 4;
    let payload = tcp + doff;
    if doff < 20 || payload > end || end > len || payload > MAX_HEADERS {
        return None;
    }
    Some(Tcp {
        v4,
        tcp,
        payload,
        end,
    })
}

/// Cuts `frame` into frames of at most `max` bytes and hands each to `emit` as its headers and
/// its payload (in order). Returns how many pieces were made, or `None` (and emits nothing)
/// when `frame` is not a TCP segment that can be cut to `max` (a SYN or RST carrying data is
/// not cut; the urgent pointer, which smoltcp never sets, is copied as it is). With `checksums`, the IPv4
/// header and TCP checksums of every piece are computed.
pub fn segment(
    frame: &[u8],
    max: usize,
    checksums: bool,
    mut emit: impl FnMut(&[u8], &[u8]),
) -> Option<usize> {
    let t = parse(frame)?;
    let chunk = max.checked_sub(t.payload).filter(|c| *c >= MIN_CHUNK)?;
    let data = &frame[t.payload..t.end];
    if frame[t.tcp + 13] & (SYN | RST) != 0 && !data.is_empty() {
        // a SYN takes a sequence number of its own; neither it nor a reset is cut
        return None;
    }
    let seq = u32::from_be_bytes(frame[t.tcp + 4..t.tcp + 8].try_into().ok()?);
    let flags = frame[t.tcp + 13];
    let id = u16::from_be_bytes([frame[ETH + 4], frame[ETH + 5]]);
    let mut hdr = [0u8; MAX_HEADERS];
    let h = &mut hdr[..t.payload];
    let pieces = data.len().div_ceil(chunk).max(1);
    // a segment without payload is one piece (its headers)
    let empty: &[u8] = &[];
    let chunks = data
        .chunks(chunk)
        .chain((pieces == 1 && data.is_empty()).then_some(empty));
    for (i, piece) in chunks.enumerate() {
        h.copy_from_slice(&frame[..t.payload]);
        let off = i * chunk;
        let last = i + 1 == pieces;
        let tcp_len = t.payload - t.tcp + piece.len();
        if t.v4 {
            let total = (t.payload - ETH + piece.len()) as u16;
            h[ETH + 2..ETH + 4].copy_from_slice(&total.to_be_bytes());
            h[ETH + 4..ETH + 6].copy_from_slice(&id.wrapping_add(i as u16).to_be_bytes());
        } else {
            h[ETH + 4..ETH + 6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
        }
        h[t.tcp + 4..t.tcp + 8].copy_from_slice(&seq.wrapping_add(off as u32).to_be_bytes());
        let mut f = flags;
        if !last {
            f &= !(FIN | PSH);
        }
        if i > 0 {
            f &= !CWR;
        }
        h[t.tcp + 13] = f;
        if checksums {
            fill_checksums(h, &t, piece, tcp_len);
        }
        emit(h, piece);
    }
    Some(pieces)
}

/// Whether `frame` is a TCP SYN (or SYN-ACK) this module can read.
pub fn is_syn(frame: &[u8]) -> bool {
    tcp_syn(frame) == Some(true)
}

/// Whether `frame` is a TCP segment this module can cut ([`is_tcp`]), and if so whether it is a
/// SYN ([`is_syn`]): one parse for both.
pub fn tcp_syn(frame: &[u8]) -> Option<bool> {
    parse(frame).map(|t| frame[t.tcp + 13] & SYN != 0)
}

/// Offsets of the values of a SYN's MSS options (a peer may send several; stacks take the last),
/// if `frame` is a TCP SYN this module can read. The walk stops where a stack's parser would:
/// at the end-of-options kind, or at an option whose length is impossible.
fn mss_offsets(frame: &[u8]) -> Option<(Tcp, Vec<usize>)> {
    let t = parse(frame)?;
    if frame[t.tcp + 13] & 0x02 == 0 {
        return None;
    }
    let mut at = Vec::new();
    // the options: kind 0 ends them, 1 is one byte of padding, others carry their length
    let mut i = t.tcp + 20;
    while i + 1 < t.payload {
        match frame[i] {
            0 => break,
            1 => i += 1,
            kind => {
                let len = usize::from(frame[i + 1]);
                if len < 2 || i + len > t.payload {
                    break;
                }
                if kind == 2 && len == 4 {
                    at.push(i + 2);
                }
                i += len;
            }
        }
    }
    Some((t, at))
}

/// The MSS a SYN offers (its last MSS option), if `frame` is a TCP SYN with one.
pub fn offered_mss(frame: &[u8]) -> Option<u16> {
    let (_, at) = mss_offsets(frame)?;
    at.last()
        .map(|&o| u16::from_be_bytes([frame[o], frame[o + 1]]))
}

/// Lowers the MSS options of a TCP SYN (or SYN-ACK) in `frame` to what a path carrying frames
/// of at most `max` bytes fits, as a router clamping the MSS to the path MTU does. True when one
/// was lowered (with `checksums`, the TCP checksum is updated for the bytes changed, RFC 1624:
/// a checksum that was wrong stays wrong).
///
/// The stack offers the MSS of the largest path (see the module's text); clamping a SYN that
/// comes or goes over a smaller path keeps that connection's segments, and so its
/// retransmissions, at the path's size instead of cutting every segment. Every MSS option is
/// clamped: a peer sending two cannot slip a large one past the first.
pub fn clamp_mss(frame: &mut [u8], max: usize, checksums: bool) -> bool {
    let Some((t, at)) = mss_offsets(frame) else {
        return false;
    };
    let Some(limit) = max
        .checked_sub(t.tcp + 20)
        .map(|l| l.min(usize::from(u16::MAX)) as u16)
    else {
        return false;
    };
    let mut changed = false;
    for o in at {
        if u16::from_be_bytes([frame[o], frame[o + 1]]) <= limit {
            continue;
        }
        let new = limit.to_be_bytes();
        if checksums {
            let c = t.tcp + 16;
            let mut sum = u16::from_be_bytes([frame[c], frame[c + 1]]);
            for (k, byte) in new.iter().enumerate() {
                let shift = if (o + k - t.tcp) % 2 == 0 { 8 } else { 0 };
                sum = adjust(
                    sum,
                    u16::from(frame[o + k]) << shift,
                    u16::from(*byte) << shift,
                );
            }
            frame[c..c + 2].copy_from_slice(&sum.to_be_bytes());
        }
        frame[o..o + 2].copy_from_slice(&new);
        changed = true;
    }
    changed
}

/// A checksum `csum` after one of the 16-bit words it covers changed from `old` to `new`.
fn adjust(csum: u16, old: u16, new: u16) -> u16 {
    let mut s = u32::from(!csum) + u32::from(!old) + u32::from(new);
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Computes the IPv4 header checksum (IPv4) and the TCP checksum of a piece whose headers are
/// `h` and payload `piece`.
fn fill_checksums(h: &mut [u8], t: &Tcp, piece: &[u8], tcp_len: usize) {
    let pseudo = if t.v4 {
        h[ETH + 10..ETH + 12].fill(0);
        let c = !checksum::data(&h[ETH..t.tcp]);
        h[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
        let ip = |o: usize| Ipv4Addr::new(h[o], h[o + 1], h[o + 2], h[o + 3]);
        checksum::pseudo_header_v4(
            &ip(ETH + 12),
            &ip(ETH + 16),
            IpProtocol::Tcp,
            tcp_len as u32,
        )
    } else {
        let ip = |o: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&h[o..o + 16]).unwrap_or([0; 16]));
        checksum::pseudo_header_v6(&ip(ETH + 8), &ip(ETH + 24), IpProtocol::Tcp, tcp_len as u32)
    };
    h[t.tcp + 16..t.tcp + 18].fill(0);
    // the TCP header is a multiple of four bytes long: its sum and the payload's combine
    let c = !checksum::combine(&[pseudo, checksum::data(&h[t.tcp..]), checksum::data(piece)]);
    h[t.tcp + 16..t.tcp + 18].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpAddress, Ipv4Packet,
        Ipv4Repr, Ipv6Packet, Ipv6Repr, TcpControl, TcpOption, TcpPacket, TcpRepr, TcpSeqNumber,
    };

    const A4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// A TCP frame over IPv4 or IPv6 with timestamps, PSH and `control`, checksums filled.
    fn tcp_frame(v6: bool, data: &[u8], control: TcpControl) -> Vec<u8> {
        tcp_frame_with(v6, data, control, None)
    }

    /// [`tcp_frame`], offering `mss` (with window scaling and SACK) when given.
    fn tcp_frame_with(v6: bool, data: &[u8], control: TcpControl, mss: Option<u16>) -> Vec<u8> {
        let (src, dst): (IpAddress, IpAddress) = if v6 {
            (
                IpAddress::Ipv6("fd00::1".parse().unwrap()),
                IpAddress::Ipv6("fd00::2".parse().unwrap()),
            )
        } else {
            (IpAddress::Ipv4(A4), IpAddress::Ipv4(B4))
        };
        let tcp = TcpRepr {
            src_port: 4000,
            dst_port: 80,
            control,
            seq_number: TcpSeqNumber(-5),
            ack_number: Some(TcpSeqNumber(1000)),
            window_len: 512,
            window_scale: mss.map(|_| 3),
            max_seg_size: mss,
            sack_permitted: mss.is_some(),
            sack_ranges: [None; 3],
            timestamp: Some(smoltcp::wire::TcpTimestampRepr::new(11, 22)),
            payload: data,
        };
        let caps = ChecksumCapabilities::default();
        let ip_len = if v6 { 40 } else { 20 };
        let mut f = vec![0u8; ETH + ip_len + tcp.buffer_len()];
        let eth = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: if v6 {
                EthernetProtocol::Ipv6
            } else {
                EthernetProtocol::Ipv4
            },
        };
        eth.emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
        match (src, dst) {
            (IpAddress::Ipv4(s), IpAddress::Ipv4(d)) => {
                let ip = Ipv4Repr {
                    src_addr: s,
                    dst_addr: d,
                    next_header: IpProtocol::Tcp,
                    payload_len: tcp.buffer_len(),
                    hop_limit: 64,
                };
                let mut p = Ipv4Packet::new_unchecked(&mut f[ETH..]);
                ip.emit(&mut p, &caps);
                p.set_ident(0xfffe);
                p.fill_checksum();
            }
            (IpAddress::Ipv6(s), IpAddress::Ipv6(d)) => {
                let ip = Ipv6Repr {
                    src_addr: s,
                    dst_addr: d,
                    next_header: IpProtocol::Tcp,
                    payload_len: tcp.buffer_len(),
                    hop_limit: 64,
                };
                ip.emit(&mut Ipv6Packet::new_unchecked(&mut f[ETH..]));
            }
            _ => unreachable!(),
        }
        let mut p = TcpPacket::new_unchecked(&mut f[ETH + ip_len..]);
        tcp.emit(&mut p, &src, &dst, &caps);
        p.set_psh(true);
        p.fill_checksum(&src, &dst);
        f
    }

    /// Pieces of `f` cut to `max`, each joined into one frame.
    fn cut(f: &[u8], max: usize, checksums: bool) -> Option<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        let n = segment(f, max, checksums, |h, p| out.push([h, p].concat()))?;
        assert_eq!(n, out.len());
        Some(out)
    }

    #[test]
    fn pieces_fit_carry_the_payload_in_order_and_check_out() {
        for v6 in [false, true] {
            for (len, control) in [
                (60_000, TcpControl::Fin),
                (2_897, TcpControl::None),
                (1, TcpControl::None),
                (0, TcpControl::Fin),
            ] {
                let data = payload(len);
                let f = tcp_frame(v6, &data, control);
                let pieces = cut(&f, 1514, true).unwrap();
                let (mut joined, mut seq) = (Vec::new(), TcpSeqNumber(-5));
                for (i, p) in pieces.iter().enumerate() {
                    assert!(p.len() <= 1514, "piece {i} is {} bytes", p.len());
                    let last = i + 1 == pieces.len();
                    let (src, dst, tcp): (IpAddress, IpAddress, &[u8]) = if v6 {
                        let ip = Ipv6Packet::new_checked(&p[ETH..]).unwrap();
                        assert_eq!(usize::from(ip.payload_len()) + 40 + ETH, p.len());
                        (ip.src_addr().into(), ip.dst_addr().into(), &p[ETH + 40..])
                    } else {
                        let ip = Ipv4Packet::new_checked(&p[ETH..]).unwrap();
                        assert!(ip.verify_checksum(), "piece {i}: IPv4 checksum");
                        assert_eq!(usize::from(ip.total_len()) + ETH, p.len());
                        assert_eq!(ip.ident(), 0xfffe_u16.wrapping_add(i as u16));
                        (ip.src_addr().into(), ip.dst_addr().into(), &p[ETH + 20..])
                    };
                    let t = TcpPacket::new_checked(tcp).unwrap();
                    assert!(t.verify_checksum(&src, &dst), "piece {i}: TCP checksum");
                    assert_eq!(t.seq_number(), seq);
                    assert_eq!(t.ack_number(), TcpSeqNumber(1000));
                    assert_eq!(t.fin(), last && control == TcpControl::Fin);
                    assert_eq!(t.psh(), last);
                    let opts: Vec<_> = t.options().to_vec();
                    assert!(
                        !opts.is_empty() && TcpOption::parse(&opts).is_ok(),
                        "options kept"
                    );
                    seq += t.payload().len();
                    joined.extend_from_slice(t.payload());
                }
                assert!(joined == data, "v6 {v6}, {len} bytes: the payload differs");
                assert_eq!(pieces.len(), len.div_ceil(1514 - (f.len() - len)).max(1));
            }
        }
    }

    /// A SYN over IPv4 or IPv6 offering `mss`, with the options smoltcp sends.
    fn syn(v6: bool, mss: u16) -> Vec<u8> {
        tcp_frame_with(v6, &[], TcpControl::Syn, Some(mss))
    }

    fn mss_of(f: &[u8]) -> (Option<u16>, bool) {
        let v6 = f[12..14] == [0x86, 0xdd];
        let (ip_len, src, dst): (usize, IpAddress, IpAddress) = if v6 {
            let ip = Ipv6Packet::new_checked(&f[ETH..]).unwrap();
            (40, ip.src_addr().into(), ip.dst_addr().into())
        } else {
            let ip = Ipv4Packet::new_checked(&f[ETH..]).unwrap();
            (20, ip.src_addr().into(), ip.dst_addr().into())
        };
        let t = TcpPacket::new_checked(&f[ETH + ip_len..]).unwrap();
        let ok = t.verify_checksum(&src, &dst);
        let repr = TcpRepr::parse(&t, &src, &dst, &ChecksumCapabilities::ignored()).unwrap();
        (repr.max_seg_size, ok)
    }

    #[test]
    fn a_syn_offering_more_than_the_path_carries_is_clamped_to_it() {
        for v6 in [false, true] {
            let ip_len = if v6 { 40 } else { 20 };
            let mut f = syn(v6, 65495);
            assert!(clamp_mss(&mut f, 1514, true));
            assert_eq!(mss_of(&f), (Some((1500 - ip_len - 20) as u16), true));
            // already small enough: untouched
            let before = f.clone();
            assert!(!clamp_mss(&mut f, 1514, true));
            assert!(!clamp_mss(&mut f, 9014, true));
            assert_eq!(f, before);
            // without checksums only the option changes
            let mut g = syn(v6, 65495);
            let orig = g.clone();
            assert!(clamp_mss(&mut g, 1514, false));
            let diff: Vec<_> = (0..g.len()).filter(|i| g[*i] != orig[*i]).collect();
            assert!(diff.len() <= 2, "{diff:?}");
        }
        // behind a one-byte NOP (the option at an odd offset) the checksum still checks out;
        // a SYN whose checksum was wrong stays wrong
        for v6 in [false, true] {
            let ip_len = if v6 { 40 } else { 20 };
            let mut f = syn(v6, 65495);
            let o = ETH + ip_len + 20;
            assert_eq!(f[o], 2, "MSS is the first option");
            // [MSS(4) WS(3) ...] -> [NOP MSS(4) WS(3)...] taking the NOP from the padding
            let opts_end = ETH + ip_len + usize::from(f[ETH + ip_len + 12] >> 4) * 4;
            assert!(f[opts_end - 1] <= 1, "the options end in a byte of padding");
            f[o..opts_end].rotate_right(1);
            f[o] = 1;
            assert_eq!(f[o + 1], 2);
            let (src, dst): (IpAddress, IpAddress) = if v6 {
                let ip = Ipv6Packet::new_checked(&f[ETH..]).unwrap();
                (ip.src_addr().into(), ip.dst_addr().into())
            } else {
                let ip = Ipv4Packet::new_checked(&f[ETH..]).unwrap();
                (ip.src_addr().into(), ip.dst_addr().into())
            };
            let mut p = TcpPacket::new_unchecked(&mut f[ETH + ip_len..]);
            p.fill_checksum(&src, &dst);
            assert_eq!(mss_of(&f), (Some(65495), true));
            assert!(clamp_mss(&mut f, 1514, true));
            assert_eq!(mss_of(&f), (Some((1500 - ip_len - 20) as u16), true));
            let mut bad = syn(v6, 65495);
            bad[ETH + ip_len + 16] ^= 0x40;
            assert!(clamp_mss(&mut bad, 1514, true));
            assert!(!mss_of(&bad).1, "a wrong checksum was mended");
        }
        // two MSS options: both are clamped (stacks take the last)
        let mut two = syn(false, 65495);
        let o = ETH + 20 + 20;
        assert_eq!(&two[o..o + 2], &[2, 4]);
        two[o + 2..o + 4].copy_from_slice(&536u16.to_be_bytes());
        // the window scale (3 bytes) and SACK-permitted (2) options become an MSS and a NOP
        let ws = (o + 4..two.len() - 5)
            .find(|k| two[*k..*k + 2] == [3, 3] && two[*k + 3..*k + 5] == [4, 2])
            .expect("window scale, then SACK permitted");
        two[ws..ws + 5].copy_from_slice(&[2, 4, 0xff, 0xd7, 1]);
        let mut p = TcpPacket::new_unchecked(&mut two[ETH + 20..]);
        p.fill_checksum(&IpAddress::Ipv4(A4), &IpAddress::Ipv4(B4));
        assert_eq!(offered_mss(&two), Some(65495));
        assert!(clamp_mss(&mut two, 1514, true));
        assert_eq!(offered_mss(&two), Some(1460));
        assert_eq!(
            &two[o + 2..o + 4],
            &536u16.to_be_bytes(),
            "a smaller one stays"
        );
        assert!(mss_of(&two).1, "checksum");
        // a SYN with data is not cut
        let mut syn_data = tcp_frame(false, &payload(3000), TcpControl::Syn);
        assert!(cut(&syn_data, 1514, true).is_none());
        syn_data[ETH + 20 + 13] = 0x04 | 0x10;
        assert!(
            cut(&syn_data, 1514, true).is_none(),
            "nor a reset with data"
        );
        // not a SYN, no MSS option, garbage options: untouched
        let mut data = tcp_frame(false, &[1, 2, 3], TcpControl::None);
        let d0 = data.clone();
        assert!(!clamp_mss(&mut data, 100, true));
        assert_eq!(data, d0);
        let mut plain = tcp_frame(false, &[], TcpControl::Syn);
        assert!(!clamp_mss(&mut plain, 100, true));
        let mut bad = syn(false, 65495);
        bad[ETH + 20 + 21] = 0; // the first option's length
        assert!(!clamp_mss(&mut bad, 100, true));
    }

    #[test]
    fn without_checksums_only_lengths_and_sequence_change() {
        let data = payload(5000);
        let f = tcp_frame(false, &data, TcpControl::None);
        let a = cut(&f, 1514, false).unwrap();
        let b = cut(&f, 1514, true).unwrap();
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.len(), y.len());
            // the checksum fields are the original's
            assert_eq!(x[ETH + 10..ETH + 12], f[ETH + 10..ETH + 12]);
            assert_eq!(
                x[ETH + 20 + 16..ETH + 20 + 18],
                f[ETH + 20 + 16..ETH + 20 + 18]
            );
            assert_eq!(x[ETH + 20 + 20..], y[ETH + 20 + 20..]);
        }
    }

    #[test]
    fn what_cannot_be_cut_is_refused() {
        let data = payload(3000);
        let f = tcp_frame(false, &data, TcpControl::None);
        // a path too small for the headers and a few bytes
        let hdrs = f.len() - data.len();
        assert!(cut(&f, hdrs + MIN_CHUNK - 1, true).is_none());
        assert!(cut(&f, hdrs + MIN_CHUNK, true).is_some());
        // an IPv4 fragment, UDP, a truncated frame, a lying length, garbage
        let mut frag = f.clone();
        frag[ETH + 6] |= 0x20;
        let mut udp = f.clone();
        udp[ETH + 9] = 17;
        let mut long = f.clone();
        long[ETH + 2..ETH + 4].copy_from_slice(&60000u16.to_be_bytes());
        let mut short_doff = f.clone();
        short_doff[ETH + 20 + 12] = 0x40;
        for bad in [
            &frag[..],
            &udp,
            &f[..60],
            &long,
            &short_doff,
            &[0u8; 3],
            &[],
        ] {
            assert!(cut(bad, 1514, true).is_none());
        }
        // every prefix and every single-byte change either cuts cleanly or is refused
        for n in 0..120 {
            let _ = cut(&f[..n], 100, true);
        }
        for i in 0..100 {
            let mut g = f.clone();
            g[i] ^= 0xff;
            if let Some(pieces) = cut(&g, 1514, false) {
                assert!(pieces.iter().all(|p| p.len() <= 1514));
            }
        }
    }
}
