//! VXLAN (RFC 7348) at the edge, as pure functions over bytes: the daemon's tunnels between
//! nodes that share no link, in the kernel's wire format (UDP port 4789), so `tcpdump` reads
//! them and a Linux VXLAN device can be the other end.
//!
//! A tunnelled frame leaves as: outer Ethernet (the link's MAC to the neighbour that reaches
//! the far end), outer IPv4 (the link's address to the far end's, TTL 64, no options, DF clear as
//! Linux sends by default), UDP (source port from a hash of the inner flow, so the underlay
//! spreads flows; checksum 0, as IPv4 allows and Linux sends by default), the VXLAN header (the
//! I flag and the network identifier), then the inner frame. The inner frame's Ethernet
//! addresses are [`tunnel_mac`] of the two ends' addresses: a DockNet daemon ignores them, and a
//! Linux VXLAN device takes the frames when it carries its end's (`ip link add ... type vxlan
//! ... address 02:00:A:B:C:D`).
//!
//! An arriving datagram is taken only whole (no outer fragments, no outer IPv4 options: the flow
//! director redirects exactly these), to this link's address and port 4789, with a right outer
//! IPv4 checksum, the I flag set and a network identifier some route uses. The outer UDP
//! checksum is not verified (RFC 7348 lets the receiver choose; the inner frame's are). Its inner frame then goes through the same checks as a frame
//! from the wire ([`super::wire::from_wire`]).

use super::wire::{self, WireDrop, ETH};
use smoltcp::wire::{Ipv4Packet, UdpPacket};
use std::net::Ipv4Addr;

/// VXLAN's UDP port (IANA).
pub const PORT: u16 = 4789;
/// Bytes a tunnel adds before the inner frame: outer Ethernet, IPv4, UDP and VXLAN headers.
pub const OVERHEAD: usize = ETH + IPV4 + UDP + VXLAN;
/// Bytes of the wire's MTU the tunnel takes from the inner IPv4 packet: outer IPv4, UDP and
/// VXLAN headers and the inner Ethernet header.
pub const MTU_COST: u32 = (IPV4 + UDP + VXLAN + ETH) as u32;

const IPV4: usize = 20;
const UDP: usize = 8;
const VXLAN: usize = 8;
/// The I flag: the network identifier is valid.
const FLAG_I: u8 = 0x08;

/// One end of a tunnel as a frame leaves: from `local` to `remote`, network `vni`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunnel {
    /// The link's address.
    pub local: Ipv4Addr,
    /// The far end's.
    pub remote: Ipv4Addr,
    /// The network identifier (24 bits).
    pub vni: u32,
}

/// The inner Ethernet address of the tunnel end at `ip`: `02:00` and the address's four bytes
/// (locally administered, unicast).
pub fn tunnel_mac(ip: Ipv4Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

/// The outer UDP source port for an inner IPv4 frame: a hash of its addresses, protocol and
/// (for TCP and UDP) ports, in 49152-65535.
fn source_port(inner: &[u8]) -> u16 {
    let mut h: u32 = 0x811c_9dc5;
    let ip = inner.get(ETH..).unwrap_or(&[]);
    let ihl = usize::from(ip.first().copied().unwrap_or(0) & 0x0f) * 4;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h = (h ^ u32::from(x)).wrapping_mul(0x0100_0193);
        }
    };
    eat(ip.get(12..20).unwrap_or(&[]));
    let proto = ip.get(9).copied().unwrap_or(0);
    eat(&[proto]);
    if proto == 6 || proto == 17 {
        eat(ip.get(ihl..ihl + 4).unwrap_or(&[]));
    }
    0xc000 | (h ^ (h >> 16)) as u16 & 0x3fff
}

/// Wraps the inner frame a pipe sent, at `buf[OVERHEAD..OVERHEAD + inner_len]`, for tunnel `t`:
/// the inner frame is readied as [`wire::to_wire`] does for an MTU of `wire_mtu -`
/// [`MTU_COST`], then the outer headers are written before it, addressed from `link_mac` to
/// `hop_mac`. Returns the length to send.
pub fn encap(
    buf: &mut [u8],
    inner_len: usize,
    t: &Tunnel,
    link_mac: [u8; 6],
    hop_mac: [u8; 6],
    wire_mtu: u32,
) -> Result<usize, WireDrop> {
    let end = OVERHEAD
        .checked_add(inner_len)
        .filter(|&e| e <= buf.len())
        .ok_or(WireDrop::Malformed)?;
    let (outer, inner) = buf[..end].split_at_mut(OVERHEAD);
    let n = wire::to_wire(
        inner,
        tunnel_mac(t.local),
        tunnel_mac(t.remote),
        wire_mtu.saturating_sub(MTU_COST),
    )?;
    let sport = source_port(&inner[..n]);
    let ip_len = u16::try_from(IPV4 + UDP + VXLAN + n).map_err(|_| WireDrop::TooBig)?;
    let udp_len = ip_len - IPV4 as u16;

    outer[0..6].copy_from_slice(&hop_mac);
    outer[6..12].copy_from_slice(&link_mac);
    outer[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut outer[ETH..ETH + IPV4];
    ip.copy_from_slice(&[
        0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[12..16].copy_from_slice(&t.local.octets());
    ip[16..20].copy_from_slice(&t.remote.octets());
    Ipv4Packet::new_unchecked(&mut *ip).fill_checksum();
    let udp = &mut outer[ETH + IPV4..ETH + IPV4 + UDP];
    udp[0..2].copy_from_slice(&sport.to_be_bytes());
    udp[2..4].copy_from_slice(&PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    let vx = &mut outer[ETH + IPV4 + UDP..];
    vx.copy_from_slice(&[FLAG_I, 0, 0, 0, 0, 0, 0, 0]);
    vx[4..7].copy_from_slice(&t.vni.to_be_bytes()[1..4]);
    Ok(OVERHEAD + n)
}

/// What an arriving frame is, as far as tunnels go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrived {
    /// Not a VXLAN datagram to `local` (the caller handles it as any frame).
    NotTunnelled,
    /// A tunnelled frame at `frame[start..start + len]`, from `from`, network `vni`.
    Inner {
        /// Where the inner frame starts.
        start: usize,
        /// Its length.
        len: usize,
        /// The far end's address.
        from: Ipv4Addr,
        /// Its network identifier.
        vni: u32,
    },
    /// A VXLAN datagram to `local` that is refused.
    Refused(Refusal),
}

/// Why a VXLAN datagram was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Outer headers that do not parse, lengths that disagree, a fragment, or no I flag.
    Malformed,
    /// A wrong outer IPv4 checksum.
    BadChecksum,
    /// A network identifier no route uses.
    UnknownVni,
}

/// Looks at a frame from the wire: is it a VXLAN datagram to `local` for one of `vnis`
/// (sorted)? Only reads; the inner frame is checked by the caller.
pub fn decap(frame: &[u8], local: Ipv4Addr, vnis: &[u32]) -> Arrived {
    if frame.len() < ETH + IPV4 || frame[12..14] != [0x08, 0x00] {
        return Arrived::NotTunnelled;
    }
    let ip = &frame[ETH..];
    // the flow director takes only option-less headers to port 4789; so does this
    if ip[0] != 0x45 || ip[9] != 17 || ip[16..20] != local.octets() {
        return Arrived::NotTunnelled;
    }
    let Some(udp_hdr) = ip.get(IPV4..IPV4 + UDP) else {
        return Arrived::NotTunnelled;
    };
    if udp_hdr[2..4] != PORT.to_be_bytes() {
        return Arrived::NotTunnelled;
    }
    let refuse = Arrived::Refused;
    let Ok(p) = Ipv4Packet::new_checked(ip) else {
        return refuse(Refusal::Malformed);
    };
    let total = usize::from(p.total_len());
    if p.more_frags() || p.frag_offset() != 0 || total < IPV4 + UDP + VXLAN + ETH {
        return refuse(Refusal::Malformed);
    }
    if !p.verify_checksum() {
        return refuse(Refusal::BadChecksum);
    }
    let from = p.src_addr();
    let Ok(u) = UdpPacket::new_checked(&ip[IPV4..total]) else {
        return refuse(Refusal::Malformed);
    };
    if usize::from(u.len()) != total - IPV4 {
        return refuse(Refusal::Malformed);
    }
    // the outer UDP checksum is not verified (RFC 7348 leaves that to the receiver): Linux
    // sends none by default, and over a virtual link one it sends is left to an offload that
    // never happens; the inner frame's own checksums are checked as any frame's from the wire
    let vx = &ip[IPV4 + UDP..IPV4 + UDP + VXLAN];
    if vx[0] & FLAG_I == 0 {
        return refuse(Refusal::Malformed);
    }
    let vni = u32::from_be_bytes([0, vx[4], vx[5], vx[6]]);
    if vnis.binary_search(&vni).is_err() {
        return refuse(Refusal::UnknownVni);
    }
    Arrived::Inner {
        start: OVERHEAD,
        len: total - IPV4 - UDP - VXLAN,
        from,
        vni,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::{EthernetFrame, IpAddress, TcpPacket};

    const LINK: [u8; 6] = [2, 0, 0, 0, 0, 0xaa];
    const HOP: [u8; 6] = [2, 0, 0, 0, 0, 0xbb];

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    /// A TCP segment with `payload` bytes from 10.244.1.5:40000 to 10.244.2.5:5001, as a pipe
    /// sends it (no checksums).
    fn inner(payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; ETH + 20 + 20 + payload];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let total = (40 + payload) as u16;
        f[ETH..ETH + 20].copy_from_slice(&[
            0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 244, 1, 5, 10, 244, 2, 5,
        ]);
        f[ETH + 2..ETH + 4].copy_from_slice(&total.to_be_bytes());
        let t = &mut f[ETH + 20..ETH + 40];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&5001u16.to_be_bytes());
        t[12] = 0x50;
        t[13] = 0x18;
        for (i, b) in f[ETH + 40..].iter_mut().enumerate() {
            *b = i as u8;
        }
        f
    }

    fn tunnel() -> Tunnel {
        Tunnel {
            local: ip("192.168.77.1"),
            remote: ip("192.168.77.2"),
            vni: 0x12_3456,
        }
    }

    fn wrapped(payload: usize) -> Vec<u8> {
        let f = inner(payload);
        let mut buf = vec![0u8; OVERHEAD + f.len()];
        buf[OVERHEAD..].copy_from_slice(&f);
        let n = encap(&mut buf, f.len(), &tunnel(), LINK, HOP, 1500).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn a_wrapped_frame_has_the_kernels_headers_and_unwraps_to_the_checked_inner_frame() {
        let b = wrapped(100);
        let eth = EthernetFrame::new_checked(&b[..]).unwrap();
        assert_eq!(eth.dst_addr().0, HOP);
        assert_eq!(eth.src_addr().0, LINK);
        let outer = Ipv4Packet::new_checked(&b[ETH..]).unwrap();
        assert!(outer.verify_checksum());
        assert_eq!(outer.src_addr(), ip("192.168.77.1"));
        assert_eq!(outer.dst_addr(), ip("192.168.77.2"));
        assert_eq!(outer.hop_limit(), 64);
        assert_eq!(usize::from(outer.total_len()), b.len() - ETH);
        let udp = UdpPacket::new_checked(outer.payload()).unwrap();
        assert_eq!(udp.dst_port(), PORT);
        assert!(udp.src_port() >= 49152, "{}", udp.src_port());
        assert_eq!(udp.checksum(), 0);
        assert_eq!(&udp.payload()[..8], &[0x08, 0, 0, 0, 0x12, 0x34, 0x56, 0]);
        // the inner frame: the tunnel ends' MACs and the checksums a wire needs
        let i = &b[OVERHEAD..];
        assert_eq!(&i[0..6], &tunnel_mac(ip("192.168.77.2")));
        assert_eq!(&i[6..12], &tunnel_mac(ip("192.168.77.1")));
        let ipi = Ipv4Packet::new_checked(&i[ETH..]).unwrap();
        assert!(ipi.verify_checksum());
        let tcp = TcpPacket::new_checked(ipi.payload()).unwrap();
        assert!(tcp.verify_checksum(
            &IpAddress::Ipv4(ipi.src_addr()),
            &IpAddress::Ipv4(ipi.dst_addr())
        ));

        match decap(&b, ip("192.168.77.2"), &[1, 0x12_3456]) {
            Arrived::Inner {
                start,
                len,
                from,
                vni,
            } => {
                assert_eq!((start, len), (OVERHEAD, b.len() - OVERHEAD));
                assert_eq!(from, ip("192.168.77.1"));
                assert_eq!(vni, 0x12_3456);
                let mut f = b[start..start + len].to_vec();
                let (info, n) = wire::from_wire(&mut f, LINK, HOP, 1500).unwrap();
                assert_eq!(info.dst, ip("10.244.2.5"));
                assert_eq!(n, len);
            }
            other => panic!("{other:?}"),
        }
        // one flow keeps its source port; another flow may not
        assert_eq!(wrapped(100)[ETH + 20..ETH + 22], b[ETH + 20..ETH + 22]);
    }

    #[test]
    fn the_tunnel_takes_fifty_bytes_of_the_mtu_and_clamps_a_syns_mss_to_what_is_left() {
        // 1450 bytes of inner IPv4 fit a 1500-byte wire; 1451 do not
        let f = inner(1450 - 40);
        let mut buf = vec![0u8; OVERHEAD + f.len()];
        buf[OVERHEAD..].copy_from_slice(&f);
        assert_eq!(
            encap(&mut buf, f.len(), &tunnel(), LINK, HOP, 1500),
            Ok(1500 + ETH)
        );
        let f = inner(1451 - 40);
        let mut buf = vec![0u8; OVERHEAD + f.len()];
        buf[OVERHEAD..].copy_from_slice(&f);
        assert_eq!(
            encap(&mut buf, f.len(), &tunnel(), LINK, HOP, 1500),
            Err(WireDrop::TooBig)
        );
        // a SYN asking for a 1460-byte MSS leaves asking for 1410
        let mut f = inner(0);
        f.truncate(ETH + 40);
        f.extend_from_slice(&[2, 4, 0x05, 0xb4]);
        f[ETH + 2..ETH + 4].copy_from_slice(&44u16.to_be_bytes());
        f[ETH + 20 + 12] = 0x60;
        f[ETH + 20 + 13] = 0x02;
        let mut buf = vec![0u8; OVERHEAD + f.len()];
        buf[OVERHEAD..].copy_from_slice(&f);
        let n = encap(&mut buf, f.len(), &tunnel(), LINK, HOP, 1500).unwrap();
        assert_eq!(&buf[n - 2..n], &1410u16.to_be_bytes());
        // a buffer too short for the headers
        assert_eq!(
            encap(&mut [0u8; 10], 5, &tunnel(), LINK, HOP, 1500),
            Err(WireDrop::Malformed)
        );
    }

    #[test]
    fn datagrams_not_for_this_end_pass_and_bad_ones_are_refused_with_the_reason() {
        let b = wrapped(64);
        let here = ip("192.168.77.2");
        assert_eq!(
            decap(&b, ip("192.168.77.3"), &[0x12_3456]),
            Arrived::NotTunnelled
        );
        assert_eq!(
            decap(&b, here, &[1, 2]),
            Arrived::Refused(Refusal::UnknownVni)
        );
        let mut other_port = b.clone();
        other_port[ETH + 22..ETH + 24].copy_from_slice(&4790u16.to_be_bytes());
        assert_eq!(
            decap(&other_port, here, &[0x12_3456]),
            Arrived::NotTunnelled
        );
        let mut bad = b.clone();
        bad[ETH + 8] = 63; // TTL changed, checksum not
        assert_eq!(
            decap(&bad, here, &[0x12_3456]),
            Arrived::Refused(Refusal::BadChecksum)
        );
        let mut frag = b.clone();
        frag[ETH + 6] = 0x20; // more fragments
        let mut p = Ipv4Packet::new_unchecked(&mut frag[ETH..]);
        p.fill_checksum();
        assert_eq!(
            decap(&frag, here, &[0x12_3456]),
            Arrived::Refused(Refusal::Malformed)
        );
        let mut no_i = b.clone();
        no_i[ETH + 28] = 0;
        assert_eq!(
            decap(&no_i, here, &[0x12_3456]),
            Arrived::Refused(Refusal::Malformed)
        );
        // a UDP length that disagrees with the IPv4 length
        let mut short = b.clone();
        short[ETH + 24..ETH + 26].copy_from_slice(&20u16.to_be_bytes());
        assert_eq!(
            decap(&short, here, &[0x12_3456]),
            Arrived::Refused(Refusal::Malformed)
        );
        // an outer UDP checksum is not looked at (the inner frame's are, by the caller)
        let mut summed = b.clone();
        summed[ETH + 26..ETH + 28].copy_from_slice(&[0x12, 0x34]);
        assert!(matches!(
            decap(&summed, here, &[0x12_3456]),
            Arrived::Inner { .. }
        ));
        // every truncation either passes or is refused, never read past its end
        for n in 0..b.len() {
            let _ = decap(&b[..n], here, &[0x12_3456]);
        }
    }
}
