//! Segment offload at the edge: large TCP segments leave for the wire whole, and segments the
//! kernel coalesced arrive whole, as pure functions over bytes.
//!
//! Within the host DockLib sends TCP segments of up to 32 KiB. Without offload, a connection
//! that leaves through the wire has its MSS clamped to the wire's MTU, so a 64 KiB message is
//! 45 frames, each copied out of its pipe, checksummed, queued on the port and, on the far side,
//! received, checked and delivered one by one. The kernel's own stack hands 64 KiB segments to
//! its link and lets the NIC (TSO) or the kernel at the last moment (GSO) cut them, and
//! coalesces what arrives (GRO). A port that offloads (AF_PACKET with `PACKET_VNET_HDR`: the
//! virtio-net header QEMU's and vhost's tap devices use) lets DockNet do the same:
//!
//! - [`to_wire`]: a TCP segment longer than the wire's MTU leaves whole, with a header saying
//!   where to cut it (`gso_size`: what the MTU leaves of each segment after its IPv4 and TCP
//!   headers). Its TCP checksum is left to the link (`NEEDS_CSUM`, the pseudo-header's sum in
//!   the field, as the kernel's stack leaves it), so no pass over the payload is made for it.
//! - [`Inbound`]: what the port's kernel coalesced (GRO), or a TSO sender's whole segment on a
//!   virtual link, is delivered to its pipe whole (pipes carry 64 KiB TCP segments), and a
//!   SYN from the wire that offers the wire's full MSS is delivered offering 64 KiB, so DockLib
//!   sends large segments to the daemon. Each segment cut from them is then no longer than the
//!   MSS the peer offered: the wire's MTU less the segment's own headers.
//!
//! Everything a header asks of the kernel is checked here against the frame (a container wrote
//! it): the lengths, that it is whole TCP over IPv4, and that a cut leaves room for payload. The
//! kernel checks the virtio-net header again when it builds the segment.

use super::wire::{self, WireDrop, ETH};
use smoltcp::wire::{IpProtocol, Ipv4Packet, TcpPacket};

/// Bytes of the virtio-net header (`struct virtio_net_hdr`, without `num_buffers`) that
/// precedes every frame on a socket with `PACKET_VNET_HDR`.
pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start + csum_offset` is to be finished.
const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
const GSO_TCPV4: u8 = 1;
/// Offset of the checksum in a TCP header.
const TCP_CSUM_AT: u16 = 16;
/// The MSS a SYN from the wire is delivered with when the port offloads: the largest IPv4
/// allows (DockLib sends no more than its own path limit within it).
pub const LARGE_MSS: u16 = 65495;

/// What the link is asked to finish in a frame that leaves (the virtio-net header's content).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offload {
    /// `(csum_start, csum_offset)` from the frame's first byte, when the link computes the
    /// transport checksum.
    pub csum: Option<(u16, u16)>,
    /// Payload bytes per segment when the link cuts the frame (0: sent as it is).
    pub gso_size: u16,
    /// Bytes of Ethernet, IPv4 and TCP headers (what each cut segment repeats).
    pub hdr_len: u16,
}

impl Offload {
    /// Nothing to finish: the frame leaves as it is.
    pub const NONE: Offload = Offload {
        csum: None,
        gso_size: 0,
        hdr_len: 0,
    };

    /// The virtio-net header for it, in the host's byte order (a packet socket's legacy
    /// header).
    pub fn vnet_hdr(&self) -> [u8; VNET_HDR_LEN] {
        let mut h = [0u8; VNET_HDR_LEN];
        let (start, off) = self.csum.unwrap_or((0, 0));
        h[0] = if self.csum.is_some() { F_NEEDS_CSUM } else { 0 };
        h[1] = if self.gso_size > 0 { GSO_TCPV4 } else { 0 };
        h[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        h[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        h[6..8].copy_from_slice(&start.to_ne_bytes());
        h[8..10].copy_from_slice(&off.to_ne_bytes());
        h
    }
}

/// The one's-complement sum of the IPv4 pseudo-header of a TCP segment of `tcp_len` bytes,
/// folded and not inverted: what a checksum left to offload holds.
fn pseudo_sum(src: [u8; 4], dst: [u8; 4], tcp_len: usize) -> u16 {
    let words = [
        u16::from_be_bytes([src[0], src[1]]),
        u16::from_be_bytes([src[2], src[3]]),
        u16::from_be_bytes([dst[0], dst[1]]),
        u16::from_be_bytes([dst[2], dst[3]]),
        u16::from(u8::from(IpProtocol::Tcp)),
        tcp_len as u16,
    ];
    let mut s: u32 = words.iter().map(|&w| u32::from(w)).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// Readies a frame a pipe sent for the wire through a port that offloads: as
/// [`wire::to_wire`] does, except that a whole TCP segment's checksum is left to the link and
/// a TCP segment longer than `wire_mtu` leaves whole, to be cut there. Returns the length to
/// send and what the link must finish.
pub fn to_wire(
    frame: &mut [u8],
    link_mac: [u8; 6],
    next_hop: [u8; 6],
    wire_mtu: u32,
) -> Result<(usize, Offload), WireDrop> {
    let len = frame.len();
    match to_wire_head(frame, len, link_mac, next_hop, wire_mtu) {
        Some(r) => r.map(|w| (w.len, w.offload)),
        None => wire::to_wire(frame, link_mac, next_hop, wire_mtu).map(|n| (n, Offload::NONE)),
    }
}

/// A whole TCP segment readied for the wire by [`to_wire_head`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireTcp {
    /// Bytes to send: Ethernet, IPv4 and TCP headers and the payload (the IPv4 total length
    /// and the Ethernet header; what the frame holds beyond it is padding).
    pub len: usize,
    /// Bytes of those headers, all of them in the head that was readied.
    pub head: usize,
    /// What the link must finish.
    pub offload: Offload,
}

/// [`to_wire`] for a whole TCP segment over IPv4 of which only the first bytes, `head`, are at
/// hand: the frame is `frame_len` bytes long and its headers lie within `head`, which is readied
/// in place (addresses, IPv4 checksum, MSS, the pseudo-header's sum). The payload is not read:
/// its checksum is left to the link. So a port can send the readied headers from the daemon's
/// memory and the payload straight from the pipe's ring. `None` when the frame is not a whole
/// TCP segment over IPv4 whose headers fit in `head` (ready it whole instead).
pub fn to_wire_head(
    head: &mut [u8],
    frame_len: usize,
    link_mac: [u8; 6],
    next_hop: [u8; 6],
    wire_mtu: u32,
) -> Option<Result<WireTcp, WireDrop>> {
    if head.len() < ETH + 20 || frame_len < head.len() || head[12..14] != [0x08, 0x00] {
        return None;
    }
    let (hl, total) = {
        let ip = Ipv4Packet::new_unchecked(&head[ETH..]);
        let (hl, total) = (usize::from(ip.header_len()), usize::from(ip.total_len()));
        if ip.version() != 4
            || hl < 20
            || hl > total
            || ETH + total > frame_len
            || ip.next_header() != IpProtocol::Tcp
            || ip.more_frags()
            || ip.frag_offset() != 0
        {
            return None;
        }
        (hl, total)
    };
    if ETH + hl + 20 > head.len() {
        return (ETH + hl + 20 > frame_len).then_some(Err(WireDrop::Malformed));
    }
    let th = usize::from(TcpPacket::new_unchecked(&head[ETH + hl..]).header_len());
    if th < 20 || hl + th > total {
        return Some(Err(WireDrop::Malformed));
    }
    if ETH + hl + th > head.len() {
        return None;
    }
    let (ip_part, tcp_part) = head[ETH..ETH + hl + th].split_at_mut(hl);
    let mut ip = Ipv4Packet::new_unchecked(ip_part);
    ip.fill_checksum();
    let (src, dst) = (ip.src_addr().octets(), ip.dst_addr().octets());
    let mut tcp = TcpPacket::new_unchecked(tcp_part);
    wire::clamp_mss(&mut tcp, wire::mss_for(wire_mtu));
    tcp.set_checksum(pseudo_sum(src, dst, total - hl));
    let mut off = Offload {
        csum: Some(((ETH + hl) as u16, TCP_CSUM_AT)),
        gso_size: 0,
        hdr_len: (ETH + hl + th) as u16,
    };
    if total as u32 > wire_mtu {
        // each cut segment repeats these headers and must fit the MTU with some payload
        let room = (wire_mtu as usize).saturating_sub(hl + th);
        if room < 8 {
            return Some(Err(WireDrop::TooBig));
        }
        off.gso_size = room as u16;
    }
    head[0..6].copy_from_slice(&next_hop);
    head[6..12].copy_from_slice(&link_mac);
    Some(Ok(WireTcp {
        len: ETH + total,
        head: ETH + hl + th,
        offload: off,
    }))
}

/// How a frame from the wire is checked and sized for its pipe ([`wire::from_wire_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inbound {
    /// The pipe's MTU.
    pub pipe_mtu: u32,
    /// The kernel vouched for the transport checksum (it verified it, or the frame was made on
    /// this host with its checksum left to an offload that never happened): not checked again.
    pub checked: bool,
    /// The wire's MTU, when the port offloads: whole TCP segments longer than the pipe's MTU
    /// (coalesced, or cut nowhere on a virtual link) are delivered, and a SYN offering the
    /// wire's full MSS is delivered offering [`LARGE_MSS`].
    pub large_tcp_from: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::IpAddress;

    const LINK: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const HOP: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const PIPE: [u8; 6] = [2, 0, 0, 0, 0, 0xa];

    /// A TCP frame from 10.0.0.1 to 10.0.1.1 with zero checksums (as a pipe sends it): `len`
    /// payload bytes, a SYN offering `mss` if given, with timestamps (12 option bytes).
    fn tcp(len: usize, mss: Option<u16>) -> Vec<u8> {
        let payload: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        let ts = smoltcp::wire::TcpTimestampRepr::new(1, 2);
        wire::tests::tcp_frame_with(&payload, mss, Some(ts))
    }

    fn udp(len: usize) -> Vec<u8> {
        wire::tests::udp_frame(&(0..len).map(|i| i as u8).collect::<Vec<u8>>())
    }

    fn mss_of(f: &[u8]) -> Option<u16> {
        let t = TcpPacket::new_checked(&f[ETH + 20..]).unwrap();
        t.options_summary().unwrap().max_segment_size
    }

    /// Finishes a checksum left to offload as the link would: the sum over the segment with
    /// the pseudo-header's sum in the field.
    fn finish(f: &mut [u8], o: &Offload) {
        let (start, at) = o.csum.unwrap();
        let (start, at) = (usize::from(start), usize::from(at));
        let mut s: u32 = 0;
        for c in f[start..].chunks(2) {
            s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        f[start + at..start + at + 2].copy_from_slice(&(!(s as u16)).to_be_bytes());
    }

    fn tcp_checksum_ok(f: &[u8]) -> bool {
        let p = Ipv4Packet::new_checked(&f[ETH..]).unwrap();
        let (s, d) = (IpAddress::Ipv4(p.src_addr()), IpAddress::Ipv4(p.dst_addr()));
        p.verify_checksum()
            && TcpPacket::new_checked(p.payload())
                .unwrap()
                .verify_checksum(&s, &d)
    }

    #[test]
    fn a_large_segment_leaves_whole_with_the_cut_and_the_checksum_left_to_the_link() {
        let mut f = tcp(32 * 1024, None);
        let n = f.len();
        let (len, o) = to_wire(&mut f, LINK, HOP, 1500).unwrap();
        assert_eq!(len, n);
        assert_eq!((&f[0..6], &f[6..12]), (&HOP[..], &LINK[..]));
        // 20 bytes of IPv4, 32 of TCP with timestamps: 1448 bytes a segment, the MSS's
        // 1460 less the options, as Linux cuts
        assert_eq!(o.gso_size, 1448);
        assert_eq!(o.hdr_len as usize, ETH + 20 + 32);
        assert_eq!(o.csum, Some(((ETH + 20) as u16, 16)));
        let h = o.vnet_hdr();
        assert_eq!((h[0], h[1]), (F_NEEDS_CSUM, GSO_TCPV4));
        assert_eq!(u16::from_ne_bytes([h[4], h[5]]), 1448);
        // what the link finishes is the right checksum
        assert!(!tcp_checksum_ok(&f));
        finish(&mut f, &o);
        assert!(tcp_checksum_ok(&f));
        // at MTU 9000 the cut is larger; a segment within the MTU is not cut
        let (_, o) = to_wire(&mut tcp(32 * 1024, None), LINK, HOP, 9000).unwrap();
        assert_eq!(o.gso_size, 9000 - 52);
        let mut small = tcp(100, None);
        let (_, o) = to_wire(&mut small, LINK, HOP, 1500).unwrap();
        assert_eq!(o.gso_size, 0);
        assert_eq!(o.vnet_hdr()[1], 0);
        finish(&mut small, &o);
        assert!(tcp_checksum_ok(&small));
    }

    #[test]
    fn headers_readied_alone_are_the_headers_of_the_frame_readied_whole() {
        // the daemon readies only the first bytes it checked (96) and leaves the payload in
        // the pipe's ring: what leaves must be what readying the whole frame gives
        for (payload, mss, mtu) in [
            (32 * 1024, None, 1500),
            (60 * 1024, None, 9000),
            (9000, None, 1500),
            (100, None, 1500),
            (0, Some(8960), 1500),
        ] {
            let frame = tcp(payload, mss);
            let mut whole = frame.clone();
            let (len, o) = to_wire(&mut whole, LINK, HOP, mtu).unwrap();
            let mut head = frame[..frame.len().min(96)].to_vec();
            let w = to_wire_head(&mut head, frame.len(), LINK, HOP, mtu)
                .expect("whole TCP with its headers in the head")
                .unwrap();
            assert_eq!((w.len, w.offload), (len, o), "{payload}");
            assert_eq!(w.head, usize::from(o.hdr_len));
            assert_eq!(head[..w.head], whole[..w.head], "{payload}");
            assert_eq!(
                frame[w.head..len],
                whole[w.head..len],
                "the payload is untouched"
            );
        }
        // the same refusals as the whole frame's
        let mut frag = tcp(20_000, None);
        frag[ETH + 6] |= 0x20;
        assert_eq!(
            to_wire_head(&mut frag[..96], 20_000 + 66, LINK, HOP, 1500),
            None
        );
        let f = tcp(20_000, None);
        let n = f.len();
        assert_eq!(
            to_wire_head(&mut f[..96].to_vec(), n, LINK, HOP, 56),
            Some(Err(WireDrop::TooBig))
        );
        // an IPv4 length past the frame, or a TCP header past the IPv4 length
        assert_eq!(
            to_wire_head(&mut f[..96].to_vec(), n - 1, LINK, HOP, 1500),
            None
        );
        let mut bad = f[..96].to_vec();
        bad[ETH + 2..ETH + 4].copy_from_slice(&30u16.to_be_bytes());
        assert_eq!(
            to_wire_head(&mut bad, n, LINK, HOP, 1500),
            Some(Err(WireDrop::Malformed))
        );
        // TCP options past the head: readied whole instead
        assert_eq!(
            to_wire_head(&mut f[..60].to_vec(), n, LINK, HOP, 1500),
            None
        );
        // not IPv4 at all
        assert_eq!(
            to_wire_head(&mut udp(3000)[..96].to_vec(), 3042, LINK, HOP, 1500),
            None
        );
    }

    #[test]
    fn what_is_not_whole_tcp_leaves_as_without_offload() {
        // a UDP datagram: full checksums, no header asks for anything, the MTU holds
        let mut u = udp(10);
        let (_, o) = to_wire(&mut u, LINK, HOP, 1500).unwrap();
        assert_eq!(o, Offload::NONE);
        assert_eq!(o.vnet_hdr(), [0; VNET_HDR_LEN]);
        let mut big = udp(2000);
        assert_eq!(to_wire(&mut big, LINK, HOP, 1500), Err(WireDrop::TooBig));
        // a fragment is never cut again
        let mut frag = tcp(2000, None);
        frag[ETH + 6] |= 0x20; // more fragments
        assert_eq!(to_wire(&mut frag, LINK, HOP, 1500), Err(WireDrop::TooBig));
        // an MTU that leaves no room for payload after the headers refuses the cut
        assert_eq!(
            to_wire(&mut tcp(200, None), LINK, HOP, 56),
            Err(WireDrop::TooBig)
        );
        // garbage and lengths that disagree
        assert!(to_wire(&mut [0u8; 40], LINK, HOP, 1500).is_err());
        let mut short = tcp(3000, None);
        short.truncate(2000);
        assert_eq!(
            to_wire(&mut short, LINK, HOP, 1500),
            Err(WireDrop::Malformed)
        );
    }

    #[test]
    fn a_syn_offering_the_wires_mss_enters_offering_64_kib_and_large_segments_enter_whole() {
        let plain = |checked| Inbound {
            pipe_mtu: 1500,
            checked,
            large_tcp_from: None,
        };
        let offload = |checked| Inbound {
            large_tcp_from: Some(1500),
            ..plain(checked)
        };
        // the far end's SYN, readied for the wire by its daemon (MSS clamped to 1460)
        let mut syn = tcp(0, Some(8960));
        wire::to_wire(&mut syn, LINK, HOP, 1500).unwrap();
        assert_eq!(mss_of(&syn), Some(1460));
        let mut s = syn.clone();
        wire::from_wire_with(&mut s, HOP, PIPE, plain(false)).unwrap();
        assert_eq!(mss_of(&s), Some(1460));
        let mut s = syn.clone();
        wire::from_wire_with(&mut s, HOP, PIPE, offload(false)).unwrap();
        assert_eq!(mss_of(&s), Some(LARGE_MSS));
        // a peer that offers less than the wire's MTU allows keeps its MSS
        let mut small = tcp(0, Some(1400));
        wire::to_wire(&mut small, LINK, HOP, 1500).unwrap();
        wire::from_wire_with(&mut small, HOP, PIPE, offload(false)).unwrap();
        assert_eq!(mss_of(&small), Some(1400));

        // a coalesced 60 KiB segment: too big without offload, whole with it
        let mut big = tcp(60 * 1024, None);
        wire::to_wire(&mut big, LINK, HOP, 65535).unwrap();
        let n = big.len();
        assert_eq!(
            wire::from_wire_with(&mut big.clone(), HOP, PIPE, plain(false)),
            Err(WireDrop::TooBig)
        );
        let (_, len) = wire::from_wire_with(&mut big.clone(), HOP, PIPE, offload(false)).unwrap();
        assert_eq!(len, n);
        // its checksum is checked unless the kernel vouched for it
        big[ETH + 100] ^= 1;
        assert_eq!(
            wire::from_wire_with(&mut big.clone(), HOP, PIPE, offload(false)),
            Err(WireDrop::BadChecksum)
        );
        assert!(wire::from_wire_with(&mut big.clone(), HOP, PIPE, offload(true)).is_ok());
        // the IPv4 header's is always checked
        big[ETH + 8] ^= 1;
        assert_eq!(
            wire::from_wire_with(&mut big, HOP, PIPE, offload(true)),
            Err(WireDrop::BadChecksum)
        );
        // a UDP datagram beyond the pipe's MTU is still too big
        let mut u = udp(3000);
        wire::to_wire(&mut u, LINK, HOP, 65535).unwrap();
        assert_eq!(
            wire::from_wire_with(&mut u, HOP, PIPE, offload(true)),
            Err(WireDrop::TooBig)
        );
    }
}
