//! TCP/IPv4 frames as the balancer sees them: a checked view ([`Segment::parse`]), the address
//! rewrite with incremental checksum updates ([`rewrite`], RFC 1624), MSS clamping, and the
//! frames the balancer writes itself ([`build`]: RSTs and health-probe SYNs).
//!
//! Everything here is pure and works on untrusted bytes: [`Segment::parse`] checks every length
//! through smoltcp's `wire` module before anything is read, and [`rewrite`] only touches a frame
//! that parsed.

use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Packet, TcpPacket,
    TcpSeqNumber,
};
use std::net::Ipv4Addr;

/// Ethernet header length.
pub const ETH: usize = 14;
/// Length of the frames [`build`] writes: Ethernet + IPv4 + TCP, no options.
pub const BUILT_LEN: usize = ETH + 20 + 20;

/// Why a frame was not a TCP segment the balancer can handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// A header is cut short or its lengths contradict each other.
    Malformed,
    /// Not IPv4 (ARP, IPv6, anything else).
    NotIpv4,
    /// IPv4 but not TCP.
    NotTcp,
    /// An IPv4 fragment (DockLib never fragments; a fragment cannot be rewritten alone).
    Fragment,
}

/// TCP flags the balancer acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags {
    /// SYN.
    pub syn: bool,
    /// ACK.
    pub ack: bool,
    /// FIN.
    pub fin: bool,
    /// RST.
    pub rst: bool,
}

/// The parsed headers of one TCP/IPv4 frame (copied out: the frame may be rewritten later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Ethernet source.
    pub src_mac: [u8; 6],
    /// IPv4 source.
    pub src: Ipv4Addr,
    /// IPv4 destination.
    pub dst: Ipv4Addr,
    /// TCP source port.
    pub sport: u16,
    /// TCP destination port.
    pub dport: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgement number (meaningful when `flags.ack`).
    pub ack: u32,
    /// Flags.
    pub flags: Flags,
    /// TCP payload bytes.
    pub payload: u32,
    /// IPv4 header length (bytes), so the TCP header starts at `ETH + ip_hl`.
    pub ip_hl: u8,
}

impl Segment {
    /// Checks and reads the headers of `frame`. Never panics, whatever the bytes.
    pub fn parse(frame: &[u8]) -> Result<Segment, ParseError> {
        let eth = EthernetFrame::new_checked(frame).map_err(|_| ParseError::Malformed)?;
        if eth.ethertype() != EthernetProtocol::Ipv4 {
            return Err(ParseError::NotIpv4);
        }
        let ip = Ipv4Packet::new_checked(&frame[ETH..]).map_err(|_| ParseError::Malformed)?;
        if ip.version() != 4 {
            return Err(ParseError::Malformed);
        }
        if ip.more_frags() || ip.frag_offset() != 0 {
            return Err(ParseError::Fragment);
        }
        if ip.next_header() != IpProtocol::Tcp {
            return Err(ParseError::NotTcp);
        }
        let tcp = TcpPacket::new_checked(ip.payload()).map_err(|_| ParseError::Malformed)?;
        let payload = ip.payload().len() - usize::from(tcp.header_len());
        Ok(Segment {
            src_mac: eth.src_addr().0,
            src: ip.src_addr(),
            dst: ip.dst_addr(),
            sport: tcp.src_port(),
            dport: tcp.dst_port(),
            seq: tcp.seq_number().0 as u32,
            ack: tcp.ack_number().0 as u32,
            flags: Flags {
                syn: tcp.syn(),
                ack: tcp.ack(),
                fin: tcp.fin(),
                rst: tcp.rst(),
            },
            payload: payload as u32,
            ip_hl: ip.header_len(),
        })
    }

    /// Sequence space the segment takes: payload, plus one each for SYN and FIN.
    pub fn seq_len(&self) -> u32 {
        self.payload + u32::from(self.flags.syn) + u32::from(self.flags.fin)
    }

    /// The sequence number just after this segment.
    pub fn seq_end(&self) -> u32 {
        self.seq.wrapping_add(self.seq_len())
    }
}

/// One end of a TCP connection: address and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    /// IPv4 address.
    pub ip: Ipv4Addr,
    /// TCP port.
    pub port: u16,
}

impl Addr {
    /// `ip:port`.
    pub fn new(ip: Ipv4Addr, port: u16) -> Addr {
        Addr { ip, port }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.ip, self.port)
    }
}

/// What a frame is rewritten to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rewrite {
    /// New Ethernet source.
    pub src_mac: [u8; 6],
    /// New Ethernet destination.
    pub dst_mac: [u8; 6],
    /// New IPv4 source and TCP source port.
    pub src: Addr,
    /// New IPv4 destination and TCP destination port.
    pub dst: Addr,
}

/// RFC 1624 (eqn. 3) incremental update of a one's-complement checksum `hc` when the 16-bit
/// words `old` become `new` (both of even, equal length): `HC' = ~(~HC + ~m + m')`.
pub fn csum_update(hc: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    let mut sum = u32::from(!hc);
    for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
        sum += u32::from(!u16::from_be_bytes([o[0], o[1]]));
        sum += u32::from(u16::from_be_bytes([n[0], n[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The 12 bytes of a TCP connection's identity as the checksums see them: source address,
/// destination address, source port, destination port.
fn ident(src: Addr, dst: Addr) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0..4].copy_from_slice(&src.ip.octets());
    b[4..8].copy_from_slice(&dst.ip.octets());
    b[8..10].copy_from_slice(&src.port.to_be_bytes());
    b[10..12].copy_from_slice(&dst.port.to_be_bytes());
    b
}

/// Rewrites a frame that [`Segment::parse`] accepted as `seg`: MACs, addresses and ports, with
/// the IPv4 header checksum and the TCP checksum (whose pseudo-header covers the addresses)
/// updated incrementally. A checksum that was right stays right; one that was wrong (DockLib
/// does not fill them in) stays wrong by the same amount.
pub fn rewrite(frame: &mut [u8], seg: &Segment, to: &Rewrite) {
    let old = ident(Addr::new(seg.src, seg.sport), Addr::new(seg.dst, seg.dport));
    let new = ident(to.src, to.dst);
    let mut eth = EthernetFrame::new_unchecked(&mut *frame);
    eth.set_src_addr(EthernetAddress(to.src_mac));
    eth.set_dst_addr(EthernetAddress(to.dst_mac));
    let mut ip = Ipv4Packet::new_unchecked(&mut frame[ETH..]);
    ip.set_checksum(csum_update(ip.checksum(), &old[..8], &new[..8]));
    ip.set_src_addr(to.src.ip);
    ip.set_dst_addr(to.dst.ip);
    let start = ETH + usize::from(seg.ip_hl);
    let mut tcp = TcpPacket::new_unchecked(&mut frame[start..]);
    tcp.set_checksum(csum_update(tcp.checksum(), &old, &new));
    tcp.set_src_port(to.src.port);
    tcp.set_dst_port(to.dst.port);
}

/// Lowers the MSS option of a SYN to `mss` if it announces more, with the TCP checksum updated.
/// Returns whether it changed anything. Options are walked with a bound (at most 40 bytes) and
/// a malformed option list is left alone.
pub fn clamp_mss(frame: &mut [u8], seg: &Segment, mss: u16) -> bool {
    if !seg.flags.syn {
        return false;
    }
    let start = ETH + usize::from(seg.ip_hl);
    let Ok(mut tcp) = TcpPacket::new_checked(&mut frame[start..]) else {
        return false;
    };
    let Some(at) = mss_offset(tcp.options_mut()) else {
        return false;
    };
    let opts = tcp.options_mut();
    let old = [opts[at], opts[at + 1]];
    if u16::from_be_bytes(old) <= mss {
        return false;
    }
    let new = mss.to_be_bytes();
    opts[at..at + 2].copy_from_slice(&new);
    // the MSS value sits at an even offset from the TCP header's start only if its option
    // does; pad the words so the update always adds aligned 16-bit words
    let hdr_off = 20 + at;
    let (o, n) = if hdr_off % 2 == 0 {
        ([old[0], old[1], 0, 0], [new[0], new[1], 0, 0])
    } else {
        ([0, old[0], old[1], 0], [0, new[0], new[1], 0])
    };
    let c = csum_update(tcp.checksum(), &o, &n);
    tcp.set_checksum(c);
    true
}

/// Offset of the MSS value (2 bytes) inside a TCP option list, if there is a well-formed one.
fn mss_offset(opts: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            0 => return None,
            1 => i += 1,
            kind => {
                let len = usize::from(*opts.get(i + 1)?);
                if len < 2 || i + len > opts.len() {
                    return None;
                }
                if kind == 2 && len == 4 {
                    return Some(i + 2);
                }
                i += len;
            }
        }
    }
    None
}

/// Frames the balancer writes itself: complete Ethernet + IPv4 + TCP headers with correct
/// checksums, no payload and no options ([`BUILT_LEN`] bytes).
pub mod build {
    use super::*;

    /// Control bits of a built segment.
    #[derive(Debug, Clone, Copy)]
    pub enum Kind {
        /// A SYN with sequence number `isn` (health probe).
        Syn {
            /// Initial sequence number.
            isn: u32,
        },
        /// A RST with sequence number `seq`, and an ACK of `ack` if given.
        Rst {
            /// Sequence number.
            seq: u32,
            /// Acknowledged sequence number.
            ack: Option<u32>,
        },
    }

    /// Writes a segment from `src` to `dst` into `buf[..BUILT_LEN]` and returns that slice.
    pub fn segment(
        buf: &mut [u8; BUILT_LEN],
        macs: ([u8; 6], [u8; 6]),
        src: Addr,
        dst: Addr,
        kind: Kind,
    ) -> &[u8] {
        buf.fill(0);
        docknet_lib::frame::write_ipv4_headers(
            &mut buf[..],
            macs.0,
            macs.1,
            src.ip,
            dst.ip,
            6,
            BUILT_LEN,
        );
        let mut tcp = TcpPacket::new_unchecked(&mut buf[ETH + 20..]);
        tcp.set_src_port(src.port);
        tcp.set_dst_port(dst.port);
        tcp.set_header_len(20);
        match kind {
            Kind::Syn { isn } => {
                tcp.set_seq_number(TcpSeqNumber(isn as i32));
                tcp.set_syn(true);
                tcp.set_window_len(1024);
            }
            Kind::Rst { seq, ack } => {
                tcp.set_seq_number(TcpSeqNumber(seq as i32));
                tcp.set_rst(true);
                if let Some(a) = ack {
                    tcp.set_ack(true);
                    tcp.set_ack_number(TcpSeqNumber(a as i32));
                }
            }
        }
        tcp.fill_checksum(&IpAddress::Ipv4(src.ip), &IpAddress::Ipv4(dst.ip));
        &buf[..]
    }

    /// The RST that answers `seg` when no connection owns it (RFC 9293 §3.10.7.1): with its
    /// ACK's number as sequence, or else acknowledging everything it carried.
    pub fn reset_reply<'a>(
        buf: &'a mut [u8; BUILT_LEN],
        my_mac: [u8; 6],
        seg: &Segment,
    ) -> &'a [u8] {
        let kind = if seg.flags.ack {
            Kind::Rst {
                seq: seg.ack,
                ack: None,
            }
        } else {
            Kind::Rst {
                seq: 0,
                ack: Some(seg.seq_end()),
            }
        };
        segment(
            buf,
            (my_mac, seg.src_mac),
            Addr::new(seg.dst, seg.dport),
            Addr::new(seg.src, seg.sport),
            kind,
        )
    }
}

/// Whether the IPv4 header checksum and the TCP checksum of a parsed frame verify.
pub fn checksums_ok(frame: &[u8], seg: &Segment) -> bool {
    let Ok(ip) = Ipv4Packet::new_checked(&frame[ETH..]) else {
        return false;
    };
    let Ok(tcp) = TcpPacket::new_checked(ip.payload()) else {
        return false;
    };
    ip.verify_checksum()
        && tcp.verify_checksum(&IpAddress::Ipv4(seg.src), &IpAddress::Ipv4(seg.dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Addr {
        let (ip, port) = s.split_once(':').unwrap();
        Addr::new(ip.parse().unwrap(), port.parse().unwrap())
    }

    #[test]
    fn built_frames_parse_and_verify() {
        let mut buf = [0u8; BUILT_LEN];
        let f = build::segment(
            &mut buf,
            ([1; 6], [2; 6]),
            a("10.0.0.1:4000"),
            a("10.0.0.2:80"),
            build::Kind::Syn { isn: 77 },
        )
        .to_vec();
        let s = Segment::parse(&f).unwrap();
        assert!(s.flags.syn && !s.flags.ack);
        assert_eq!((s.sport, s.dport, s.seq, s.payload), (4000, 80, 77, 0));
        assert_eq!(s.src_mac, [1; 6]);
        assert!(checksums_ok(&f, &s));
        let mut buf2 = [0u8; BUILT_LEN];
        let r = build::reset_reply(&mut buf2, [2; 6], &s).to_vec();
        let rs = Segment::parse(&r).unwrap();
        assert!(rs.flags.rst && rs.flags.ack);
        assert_eq!(rs.ack, 78, "acknowledges the SYN");
        assert_eq!((rs.src, rs.sport), (s.dst, s.dport));
        assert!(checksums_ok(&r, &rs));
    }

    #[test]
    fn rewrite_keeps_checksums_valid() {
        let mut buf = [0u8; BUILT_LEN];
        let mut f = build::segment(
            &mut buf,
            ([1; 6], [2; 6]),
            a("10.0.0.9:50000"),
            a("10.0.0.1:80"),
            build::Kind::Rst {
                seq: 5,
                ack: Some(9),
            },
        )
        .to_vec();
        let s = Segment::parse(&f).unwrap();
        let to = Rewrite {
            src_mac: [3; 6],
            dst_mac: [4; 6],
            src: a("10.0.0.1:1024"),
            dst: a("10.0.0.5:8080"),
        };
        rewrite(&mut f, &s, &to);
        let t = Segment::parse(&f).unwrap();
        assert_eq!(
            (t.src, t.sport, t.dst, t.dport),
            (to.src.ip, 1024, to.dst.ip, 8080)
        );
        assert_eq!(&f[0..6], &[4; 6]);
        assert!(checksums_ok(&f, &t));
    }

    #[test]
    fn garbage_is_refused_not_panicked_on() {
        assert_eq!(Segment::parse(&[]), Err(ParseError::Malformed));
        let mut f = [0u8; 60];
        f[12] = 0x08;
        f[13] = 0x06;
        assert_eq!(Segment::parse(&f), Err(ParseError::NotIpv4));
        f[13] = 0x00;
        assert_eq!(Segment::parse(&f), Err(ParseError::Malformed), "IHL 0");
        f[14] = 0x45;
        f[16..18].copy_from_slice(&46u16.to_be_bytes());
        f[23] = 17;
        assert_eq!(Segment::parse(&f), Err(ParseError::NotTcp));
        f[23] = 6;
        f[20] = 0x20; // more fragments
        assert_eq!(Segment::parse(&f), Err(ParseError::Fragment));
        f[20] = 0;
        assert_eq!(
            Segment::parse(&f),
            Err(ParseError::Malformed),
            "TCP cut short"
        );
        f[16..18].copy_from_slice(&200u16.to_be_bytes());
        assert_eq!(
            Segment::parse(&f),
            Err(ParseError::Malformed),
            "IPv4 length past the frame"
        );
    }

    #[test]
    fn mss_is_clamped_with_a_valid_checksum() {
        for pad in [0usize, 1] {
            // SYN with options: `pad` NOPs, then MSS 9000
            let mut f = vec![0u8; BUILT_LEN + 8];
            let mut opts = vec![1u8; pad];
            opts.extend_from_slice(&[2, 4, 0x23, 0x28]);
            while opts.len() % 4 != 0 {
                opts.push(1);
            }
            f.truncate(BUILT_LEN + opts.len());
            let total = f.len();
            docknet_lib::frame::write_ipv4_headers(
                &mut f,
                [1; 6],
                [2; 6],
                "10.0.0.2".parse().unwrap(),
                "10.0.0.1".parse().unwrap(),
                6,
                total,
            );
            let mut tcp = TcpPacket::new_unchecked(&mut f[ETH + 20..]);
            tcp.set_header_len(20 + opts.len() as u8);
            tcp.set_syn(true);
            tcp.options_mut().copy_from_slice(&opts);
            tcp.fill_checksum(
                &IpAddress::Ipv4("10.0.0.2".parse().unwrap()),
                &IpAddress::Ipv4("10.0.0.1".parse().unwrap()),
            );
            let s = Segment::parse(&f).unwrap();
            assert!(checksums_ok(&f, &s));
            assert!(clamp_mss(&mut f, &s, 1460));
            assert!(checksums_ok(&f, &s), "pad {pad}");
            let tcp = TcpPacket::new_checked(&f[ETH + 20..]).unwrap();
            assert_eq!(tcp.options_summary().unwrap().max_segment_size, Some(1460));
            assert!(!clamp_mss(&mut f, &s, 1460), "already low enough");
        }
    }
}
