//! What happens to a frame at the host's edge, as pure functions over bytes (no I/O, no clock
//! beyond what callers pass in): unit tests and the fuzz targets drive them directly.
//!
//! - Leaving for the wire ([`to_wire`]): the Ethernet addresses become the link's and the
//!   neighbour's, a TCP SYN's MSS is clamped to the wire's MTU, and the IPv4 and TCP/UDP
//!   checksums are computed (pipes move frames in memory and skip them). A datagram longer than
//!   the wire's MTU is refused.
//! - Arriving from the wire ([`from_wire`]): the header must parse, the lengths must agree, and
//!   the checksums must be right; a SYN's MSS is clamped to the pipe's MTU. Then the addresses
//!   become the pipe's and the link's (the daemon is every remote address's next hop).
//! - ARP on the wire: [`arp`] parses, [`arp_frame`] builds.
//! - Through a port that offloads, TCP segments larger than the wire's MTU pass both ways:
//!   [`super::offload`].
//!
//! Parsing and checksums are smoltcp's wire module.

use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, IpAddress,
    IpProtocol, Ipv4Packet, TcpPacket, UdpPacket,
};
use std::net::Ipv4Addr;

pub use super::offload::Inbound;

/// Ethernet header length.
pub const ETH: usize = 14;
/// Length of an ARP frame (Ethernet + ARP for IPv4).
pub const ARP_LEN: usize = 42;
/// IPv4 + TCP headers without options: what an MSS leaves of an MTU.
const IP_TCP: u32 = 40;

/// Why a frame was not sent to the wire or not taken from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireDrop {
    /// Not IPv4, or a header that does not parse, or lengths that disagree.
    Malformed,
    /// A datagram longer than the MTU of where it goes.
    TooBig,
    /// A wrong IPv4, TCP or UDP checksum (arriving frames).
    BadChecksum,
}

/// An IPv4 frame's addresses, read while it was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Info {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Source MAC of the frame as it arrived.
    pub src_mac: [u8; 6],
}

/// The destination IPv4 address of an Ethernet frame carrying IPv4, if it is one.
pub fn ipv4_dst(frame: &[u8]) -> Option<Ipv4Addr> {
    if frame.len() < ETH + 20 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let b = &frame[ETH + 16..ETH + 20];
    Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
}

/// The source IPv4 address of an Ethernet frame carrying IPv4, if it is one.
pub fn ipv4_src(frame: &[u8]) -> Option<Ipv4Addr> {
    if frame.len() < ETH + 20 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let b = &frame[ETH + 12..ETH + 16];
    Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
}

fn set_macs(frame: &mut [u8], src: [u8; 6], dst: [u8; 6]) {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
}

/// The IPv4 packet inside `frame`, with the total length checked against the frame: the
/// frame may carry padding after it (short frames on a wire), never less than it.
pub(super) fn ipv4(frame: &mut [u8]) -> Result<Ipv4Packet<&mut [u8]>, WireDrop> {
    let eth = EthernetFrame::new_checked(&*frame).map_err(|_| WireDrop::Malformed)?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return Err(WireDrop::Malformed);
    }
    let ip = Ipv4Packet::new_checked(&frame[ETH..]).map_err(|_| WireDrop::Malformed)?;
    if ip.version() != 4 {
        return Err(WireDrop::Malformed);
    }
    let total = usize::from(ip.total_len());
    Ok(Ipv4Packet::new_unchecked(&mut frame[ETH..ETH + total]))
}

/// Whether the packet is a fragment (its L4 checksum covers bytes not in this frame).
fn is_fragment<T: AsRef<[u8]>>(ip: &Ipv4Packet<T>) -> bool {
    ip.more_frags() || ip.frag_offset() != 0
}

/// Clamps the MSS option of a TCP SYN to `max`. The caller fixes the checksum.
pub(super) fn clamp_mss(tcp: &mut TcpPacket<&mut [u8]>, max: u16) {
    set_syn_mss(tcp, |mss| mss.min(max));
}

/// Rewrites the MSS option of a TCP SYN to `f(offered)`. The caller fixes the checksum.
fn set_syn_mss(tcp: &mut TcpPacket<&mut [u8]>, f: impl FnOnce(u16) -> u16) {
    if !tcp.syn() {
        return;
    }
    let opts = tcp.options_mut();
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            0 => return,
            1 => i += 1,
            kind => {
                let Some(&len) = opts.get(i + 1) else { return };
                let len = usize::from(len);
                if len < 2 || i + len > opts.len() {
                    return;
                }
                if kind == 2 && len == 4 {
                    let mss = u16::from_be_bytes([opts[i + 2], opts[i + 3]]);
                    opts[i + 2..i + 4].copy_from_slice(&f(mss).to_be_bytes());
                    return;
                }
                i += len;
            }
        }
    }
}

/// The MSS a given MTU allows.
pub fn mss_for(mtu: u32) -> u16 {
    mtu.saturating_sub(IP_TCP).clamp(536, 65495) as u16
}

/// Readies a frame a pipe sent for the wire, in place: Ethernet source `link_mac`, destination
/// `next_hop`; a SYN's MSS clamped to what `wire_mtu` allows; IPv4 and TCP/UDP checksums
/// computed. Returns the length to send (the IPv4 total length plus the Ethernet header).
pub fn to_wire(
    frame: &mut [u8],
    link_mac: [u8; 6],
    next_hop: [u8; 6],
    wire_mtu: u32,
) -> Result<usize, WireDrop> {
    let len = fill_checksums(frame, wire_mtu)?;
    set_macs(frame, link_mac, next_hop);
    Ok(len)
}

/// Computes the IPv4 and TCP/UDP checksums of an IPv4 frame in place (and clamps a SYN's MSS
/// to what `mtu` allows). Returns the frame's length without padding.
pub fn fill_checksums(frame: &mut [u8], mtu: u32) -> Result<usize, WireDrop> {
    let mut ip = ipv4(frame)?;
    let total = ip.total_len() as usize;
    if total as u32 > mtu {
        return Err(WireDrop::TooBig);
    }
    ip.fill_checksum();
    let (src, dst) = (
        IpAddress::Ipv4(ip.src_addr()),
        IpAddress::Ipv4(ip.dst_addr()),
    );
    let proto = ip.next_header();
    let (first, whole) = (ip.frag_offset() == 0, !is_fragment(&ip));
    let payload = ip.payload_mut();
    match proto {
        IpProtocol::Tcp if whole => {
            let mut tcp = TcpPacket::new_checked(payload).map_err(|_| WireDrop::Malformed)?;
            clamp_mss(&mut tcp, mss_for(mtu));
            tcp.fill_checksum(&src, &dst);
        }
        IpProtocol::Udp if first => {
            let mut udp = UdpPacket::new_checked(payload).map_err(|_| WireDrop::Malformed)?;
            if whole {
                udp.fill_checksum(&src, &dst);
            } else {
                // the checksum would cover bytes in later fragments: say "none" (IPv4 allows)
                udp.set_checksum(0);
            }
        }
        _ => {}
    }
    Ok(ETH + total)
}

/// Checks a frame from the wire for a pipe, in place: header, lengths and checksums; a SYN's
/// MSS clamped to what `pipe_mtu` allows (the pipe side skips checksums, so none is redone);
/// Ethernet source `link_mac`, destination `pipe_mac`. Returns the frame's addresses and the
/// length to deliver (padding after the IPv4 packet dropped).
pub fn from_wire(
    frame: &mut [u8],
    link_mac: [u8; 6],
    pipe_mac: [u8; 6],
    pipe_mtu: u32,
) -> Result<(Ipv4Info, usize), WireDrop> {
    let plain = Inbound {
        pipe_mtu,
        checked: false,
        large_tcp_from: None,
    };
    from_wire_with(frame, link_mac, pipe_mac, plain)
}

/// [`from_wire`], taking what a port that offloads vouches for and allows ([`Inbound`]).
pub fn from_wire_with(
    frame: &mut [u8],
    link_mac: [u8; 6],
    pipe_mac: [u8; 6],
    how: Inbound,
) -> Result<(Ipv4Info, usize), WireDrop> {
    let pipe_mtu = how.pipe_mtu;
    let src_mac: [u8; 6] = frame
        .get(6..12)
        .and_then(|s| s.try_into().ok())
        .ok_or(WireDrop::Malformed)?;
    let (info, len) = {
        let mut ip = ipv4(frame)?;
        let total = ip.total_len() as usize;
        if ip.header_len() as usize > total {
            return Err(WireDrop::Malformed);
        }
        if !ip.verify_checksum() {
            return Err(WireDrop::BadChecksum);
        }
        let (s, d) = (ip.src_addr(), ip.dst_addr());
        let (src, dst) = (IpAddress::Ipv4(s), IpAddress::Ipv4(d));
        let proto = ip.next_header();
        let frag = is_fragment(&ip);
        let large_tcp = how
            .large_tcp_from
            .filter(|_| proto == IpProtocol::Tcp && !frag);
        if total as u32 > pipe_mtu && large_tcp.is_none() {
            return Err(WireDrop::TooBig);
        }
        let payload = ip.payload_mut();
        match proto {
            IpProtocol::Tcp if !frag => {
                let mut tcp = TcpPacket::new_checked(payload).map_err(|_| WireDrop::Malformed)?;
                if !how.checked && !tcp.verify_checksum(&src, &dst) {
                    return Err(WireDrop::BadChecksum);
                }
                let pipe_mss = mss_for(pipe_mtu);
                match large_tcp {
                    // a peer that takes the wire's full segments: DockLib may send large
                    // ones, which the link cuts to the wire's MTU
                    Some(wire_mtu) => set_syn_mss(&mut tcp, |m| {
                        if m >= mss_for(wire_mtu) {
                            super::offload::LARGE_MSS
                        } else {
                            m.min(pipe_mss)
                        }
                    }),
                    None => clamp_mss(&mut tcp, pipe_mss),
                }
            }
            IpProtocol::Udp if !frag => {
                let udp = UdpPacket::new_checked(&*payload).map_err(|_| WireDrop::Malformed)?;
                // checksum 0: the sender computed none (allowed over IPv4)
                if !how.checked && udp.checksum() != 0 && !udp.verify_checksum(&src, &dst) {
                    return Err(WireDrop::BadChecksum);
                }
            }
            _ => {}
        }
        let info = Ipv4Info {
            src: s,
            dst: d,
            src_mac,
        };
        (info, ETH + total)
    };
    set_macs(frame, link_mac, pipe_mac);
    Ok((info, len))
}

/// An ARP message for IPv4 over Ethernet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arp {
    /// True for a request, false for a reply.
    pub request: bool,
    /// Sender's MAC.
    pub sha: [u8; 6],
    /// Sender's address.
    pub spa: Ipv4Addr,
    /// Target's MAC (zero in requests).
    pub tha: [u8; 6],
    /// Target's address.
    pub tpa: Ipv4Addr,
}

/// Parses an ARP frame (requests and replies for IPv4 over Ethernet only).
pub fn arp(frame: &[u8]) -> Option<Arp> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Arp {
        return None;
    }
    let pkt = ArpPacket::new_checked(eth.payload()).ok()?;
    match ArpRepr::parse(&pkt).ok()? {
        ArpRepr::EthernetIpv4 {
            operation,
            source_hardware_addr,
            source_protocol_addr,
            target_hardware_addr,
            target_protocol_addr,
        } => {
            let request = match operation {
                ArpOperation::Request => true,
                ArpOperation::Reply => false,
                _ => return None,
            };
            Some(Arp {
                request,
                sha: source_hardware_addr.0,
                spa: source_protocol_addr,
                tha: target_hardware_addr.0,
                tpa: target_protocol_addr,
            })
        }
        _ => None,
    }
}

/// Builds an ARP frame: a request (broadcast) or a reply to `a.tha`.
pub fn arp_frame(a: &Arp) -> [u8; ARP_LEN] {
    let mut b = [0u8; ARP_LEN];
    let dst = if a.request { [0xff; 6] } else { a.tha };
    set_macs(&mut b, a.sha, dst);
    b[12..14].copy_from_slice(&[0x08, 0x06]);
    let repr = ArpRepr::EthernetIpv4 {
        operation: if a.request {
            ArpOperation::Request
        } else {
            ArpOperation::Reply
        },
        source_hardware_addr: EthernetAddress(a.sha),
        source_protocol_addr: a.spa,
        target_hardware_addr: EthernetAddress(if a.request { [0; 6] } else { a.tha }),
        target_protocol_addr: a.tpa,
    };
    repr.emit(&mut ArpPacket::new_unchecked(&mut b[ETH..]));
    b
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use smoltcp::wire::{Ipv4Address, TcpControl, TcpRepr, TcpSeqNumber, UdpRepr};

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
    const LINK: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const HOP: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn ip(a: [u8; 4]) -> Ipv4Address {
        Ipv4Address::new(a[0], a[1], a[2], a[3])
    }

    /// An Ethernet/IPv4/TCP frame from 10.0.0.1 to 10.0.1.1 with zero checksums (as a pipe
    /// sends it), carrying `payload`, a SYN with MSS `mss` if given.
    fn tcp_frame(payload: &[u8], mss: Option<u16>) -> Vec<u8> {
        tcp_frame_with(payload, mss, None)
    }

    /// [`tcp_frame`], with the timestamps option when given (12 more header bytes).
    pub(in crate::nic) fn tcp_frame_with(
        payload: &[u8],
        mss: Option<u16>,
        timestamp: Option<smoltcp::wire::TcpTimestampRepr>,
    ) -> Vec<u8> {
        let (s, d) = (ip([10, 0, 0, 1]), ip([10, 0, 1, 1]));
        let repr = TcpRepr {
            src_port: 1000,
            dst_port: 2000,
            control: if mss.is_some() {
                TcpControl::Syn
            } else {
                TcpControl::None
            },
            seq_number: TcpSeqNumber(7),
            ack_number: None,
            window_len: 1000,
            window_scale: None,
            max_seg_size: mss,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp,
            payload,
        };
        let tl = repr.header_len() + payload.len();
        let mut f = vec![0u8; ETH + 20 + tl];
        set_macs(&mut f, A, B);
        f[12..14].copy_from_slice(&[8, 0]);
        {
            let mut p = Ipv4Packet::new_unchecked(&mut f[ETH..]);
            p.set_version(4);
            p.set_header_len(20);
            p.set_total_len((20 + tl) as u16);
            p.set_hop_limit(64);
            p.set_next_header(IpProtocol::Tcp);
            p.set_src_addr(s);
            p.set_dst_addr(d);
            p.set_dont_frag(true);
        }
        let mut t = TcpPacket::new_unchecked(&mut f[ETH + 20..]);
        repr.emit(
            &mut t,
            &IpAddress::Ipv4(s),
            &IpAddress::Ipv4(d),
            &smoltcp::phy::ChecksumCapabilities::ignored(),
        );
        t.set_checksum(0);
        f
    }

    /// A UDP datagram from 10.0.0.1 to 10.0.1.1 with zero checksums, carrying `payload`.
    pub(in crate::nic) fn udp_frame(payload: &[u8]) -> Vec<u8> {
        let (s, d) = (ip([10, 0, 0, 1]), ip([10, 0, 1, 1]));
        let repr = UdpRepr {
            src_port: 53,
            dst_port: 5353,
        };
        let ul = 8 + payload.len();
        let mut f = vec![0u8; ETH + 20 + ul];
        set_macs(&mut f, A, B);
        f[12..14].copy_from_slice(&[8, 0]);
        {
            let mut p = Ipv4Packet::new_unchecked(&mut f[ETH..]);
            p.set_version(4);
            p.set_header_len(20);
            p.set_total_len((20 + ul) as u16);
            p.set_hop_limit(64);
            p.set_next_header(IpProtocol::Udp);
            p.set_src_addr(s);
            p.set_dst_addr(d);
        }
        let mut u = UdpPacket::new_unchecked(&mut f[ETH + 20..]);
        repr.emit(
            &mut u,
            &IpAddress::Ipv4(s),
            &IpAddress::Ipv4(d),
            payload.len(),
            |b| b.copy_from_slice(payload),
            &smoltcp::phy::ChecksumCapabilities::ignored(),
        );
        u.set_checksum(0);
        f
    }

    fn mss_of(f: &[u8]) -> Option<u16> {
        let t = TcpPacket::new_checked(&f[ETH + 20..]).unwrap();
        t.options_summary().unwrap().max_segment_size
    }

    #[test]
    fn frames_leave_with_checksums_and_the_wire_addresses() {
        let mut f = tcp_frame(b"hello wire", None);
        let n = to_wire(&mut f, LINK, HOP, 1500).unwrap();
        assert_eq!(n, f.len());
        assert_eq!(&f[0..6], &HOP);
        assert_eq!(&f[6..12], &LINK);
        let p = Ipv4Packet::new_checked(&f[ETH..]).unwrap();
        assert!(p.verify_checksum());
        let (s, d) = (IpAddress::Ipv4(p.src_addr()), IpAddress::Ipv4(p.dst_addr()));
        assert!(TcpPacket::new_checked(p.payload())
            .unwrap()
            .verify_checksum(&s, &d));
        // and the other side takes it, addressed to its pipe
        let (info, len) = from_wire(&mut f, HOP, A, 1500).unwrap();
        assert_eq!(len, n);
        assert_eq!(info.src, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(info.src_mac, LINK);
        assert_eq!((&f[0..6], &f[6..12]), (&A[..], &HOP[..]));

        let mut u = udp_frame(b"datagram");
        to_wire(&mut u, LINK, HOP, 1500).unwrap();
        assert!(from_wire(&mut u.clone(), HOP, A, 1500).is_ok());
        // a flipped bit is refused
        u[ETH + 28] ^= 1;
        assert_eq!(from_wire(&mut u, HOP, A, 1500), Err(WireDrop::BadChecksum));
    }

    #[test]
    fn bad_checksums_and_lengths_are_refused_on_entry() {
        let mut f = tcp_frame(b"payload", None);
        to_wire(&mut f, LINK, HOP, 1500).unwrap();
        let mut g = f.clone();
        g[ETH + 20 + 20] ^= 0x40; // payload bit
        assert_eq!(from_wire(&mut g, HOP, A, 1500), Err(WireDrop::BadChecksum));
        let mut g = f.clone();
        g[ETH + 8] ^= 1; // TTL: header checksum
        assert_eq!(from_wire(&mut g, HOP, A, 1500), Err(WireDrop::BadChecksum));
        // total length beyond the frame
        let mut g = f.clone();
        g.truncate(g.len() - 1);
        assert_eq!(from_wire(&mut g, HOP, A, 1500), Err(WireDrop::Malformed));
        // padding after the packet is dropped, not delivered
        let mut g = f.clone();
        g.extend_from_slice(&[0; 6]);
        assert_eq!(from_wire(&mut g, HOP, A, 1500).unwrap().1, f.len());
        // not IPv4, and garbage
        let mut g = f.clone();
        g[12] = 0x86;
        assert_eq!(from_wire(&mut g, HOP, A, 1500), Err(WireDrop::Malformed));
        assert!(from_wire(&mut [0u8; 5], HOP, A, 1500).is_err());
        assert!(to_wire(&mut [0u8; 40], HOP, A, 1500).is_err());
        // a UDP datagram without checksum (0) is accepted
        let mut u = udp_frame(b"x");
        to_wire(&mut u, LINK, HOP, 1500).unwrap();
        u[ETH + 26..ETH + 28].copy_from_slice(&[0, 0]);
        assert!(from_wire(&mut u, HOP, A, 1500).is_ok());
    }

    #[test]
    fn syn_mss_is_clamped_both_ways_and_big_datagrams_stay_home() {
        let mut f = tcp_frame(&[], Some(8960));
        to_wire(&mut f, LINK, HOP, 1500).unwrap();
        assert_eq!(mss_of(&f), Some(1460));
        let (s, d) = (
            IpAddress::Ipv4(ip([10, 0, 0, 1])),
            IpAddress::Ipv4(ip([10, 0, 1, 1])),
        );
        assert!(TcpPacket::new_checked(&f[ETH + 20..])
            .unwrap()
            .verify_checksum(&s, &d));
        // an MSS already small enough stays
        let mut f = tcp_frame(&[], Some(1000));
        to_wire(&mut f, LINK, HOP, 1500).unwrap();
        assert_eq!(mss_of(&f), Some(1000));
        // entering a pipe with a smaller MTU
        let mut f = tcp_frame(&[], Some(1460));
        to_wire(&mut f, LINK, HOP, 1500).unwrap();
        from_wire(&mut f, HOP, A, 1280).unwrap();
        assert_eq!(mss_of(&f), Some(1240));
        // a datagram longer than the wire's MTU is refused
        let mut u = udp_frame(&[7u8; 2000]);
        assert_eq!(to_wire(&mut u, LINK, HOP, 1500), Err(WireDrop::TooBig));
        assert!(to_wire(&mut u, LINK, HOP, 9000).is_ok());
        assert_eq!(mss_for(100), 536);
    }

    #[test]
    fn arp_round_trips() {
        let req = Arp {
            request: true,
            sha: LINK,
            spa: Ipv4Addr::new(10, 0, 0, 1),
            tha: [0; 6],
            tpa: Ipv4Addr::new(10, 0, 1, 1),
        };
        let f = arp_frame(&req);
        assert_eq!(&f[0..6], &[0xff; 6]);
        assert_eq!(arp(&f), Some(req));
        let rep = Arp {
            request: false,
            sha: HOP,
            spa: req.tpa,
            tha: LINK,
            tpa: req.spa,
        };
        let f = arp_frame(&rep);
        assert_eq!(&f[0..6], &LINK);
        assert_eq!(arp(&f), Some(rep));
        assert_eq!(arp(&f[..30]), None);
        assert_eq!(arp(&tcp_frame(b"", None)), None);
        assert_eq!(
            ipv4_dst(&tcp_frame(b"", None)),
            Some(Ipv4Addr::new(10, 0, 1, 1))
        );
        assert_eq!(
            ipv4_src(&tcp_frame(b"", None)),
            Some(Ipv4Addr::new(10, 0, 0, 1))
        );
        assert_eq!(ipv4_dst(&f), None);
    }
}
