//! Minimal Ethernet/IPv4/IPv6/ARP helpers for raw frames (the TCP/IP stack proper is smoltcp's
//! job).

use std::net::{Ipv4Addr, Ipv6Addr};

/// Ethernet header length (the workspace's one definition, from `docknet-pipe`).
pub const ETH: usize = docknet_pipe::ETH_HDR;
/// IPv4 header length without options.
pub const IPV4: usize = 20;
/// Ethertype IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// Ethertype IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// IPv6 header length.
pub const IPV6: usize = 40;
/// IP protocol number used for raw benchmark frames ("use for experimentation", RFC 3692).
pub const PROTO_EXPERIMENT: u8 = 253;

/// Destination IPv4 address of an Ethernet frame carrying IPv4, if it does.
pub fn ipv4_dst(frame: &[u8]) -> Option<Ipv4Addr> {
    if frame.len() < ETH + IPV4 || frame[12..14] != ETHERTYPE_IPV4.to_be_bytes() {
        return None;
    }
    Some(Ipv4Addr::new(frame[30], frame[31], frame[32], frame[33]))
}

fn ipv6_at(frame: &[u8], at: usize) -> Option<Ipv6Addr> {
    if frame.len() < ETH + IPV6 || frame[12..14] != ETHERTYPE_IPV6.to_be_bytes() {
        return None;
    }
    let mut o = [0u8; 16];
    o.copy_from_slice(&frame[at..at + 16]);
    Some(Ipv6Addr::from(o))
}

/// Destination IPv6 address of an Ethernet frame carrying IPv6, if it does.
pub fn ipv6_dst(frame: &[u8]) -> Option<Ipv6Addr> {
    ipv6_at(frame, ETH + 24)
}

/// Source IPv6 address of an Ethernet frame carrying IPv6, if it does.
pub fn ipv6_src(frame: &[u8]) -> Option<Ipv6Addr> {
    ipv6_at(frame, ETH + 8)
}

/// An Ethernet + IPv6 neighbour advertisement (solicited, override, with the target's
/// link-layer address) saying that `target` is at `target_mac`, sent to (`dst_mac`, `dst`).
pub fn neighbor_advert(
    target_mac: [u8; 6],
    target: Ipv6Addr,
    dst_mac: [u8; 6],
    dst: Ipv6Addr,
) -> [u8; NA_LEN] {
    let mut f = [0u8; NA_LEN];
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&target_mac);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    f[ETH] = 0x60;
    f[ETH + 4..ETH + 6].copy_from_slice(&32u16.to_be_bytes());
    f[ETH + 6] = 58;
    f[ETH + 7] = 255;
    f[ETH + 8..ETH + 24].copy_from_slice(&target.octets());
    f[ETH + 24..ETH + 40].copy_from_slice(&dst.octets());
    let o = ETH + IPV6;
    f[o] = 136;
    f[o + 4] = 0x60;
    f[o + 8..o + 24].copy_from_slice(&target.octets());
    f[o + 24] = 2;
    f[o + 25] = 1;
    f[o + 26..o + 32].copy_from_slice(&target_mac);
    // the ICMPv6 checksum over the pseudo-header
    let mut pseudo = Vec::with_capacity(40 + 32);
    pseudo.extend_from_slice(&target.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&32u32.to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(&f[o..]);
    let c = checksum(&pseudo);
    f[o + 2..o + 4].copy_from_slice(&c.to_be_bytes());
    f
}

/// Length of [`neighbor_advert`]'s frame.
pub const NA_LEN: usize = ETH + IPV6 + 32;

/// RFC 1071 checksum of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from_be_bytes([c[0], 0])
        };
        sum += u32::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Writes Ethernet + IPv4 headers for a frame of `total_len` bytes into `buf[..34]`.
/// `total_len` must be at least 34 and at most 65549.
pub fn write_ipv4_headers(
    buf: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    total_len: usize,
) {
    buf[0..6].copy_from_slice(&dst_mac);
    buf[6..12].copy_from_slice(&src_mac);
    buf[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip = &mut buf[ETH..ETH + IPV4];
    ip.fill(0);
    ip[0] = 0x45;
    let ip_len = (total_len - ETH).min(65535) as u16;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[8] = 64;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// An ARP request from (`mac`, `ip`) for `target`, broadcast.
pub fn arp_request(mac: [u8; 6], ip: Ipv4Addr, target: Ipv4Addr) -> [u8; 42] {
    let mut f = [0u8; 42];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    f[14..16].copy_from_slice(&1u16.to_be_bytes());
    f[16..18].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    f[18] = 6;
    f[19] = 4;
    f[20..22].copy_from_slice(&1u16.to_be_bytes());
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&ip.octets());
    f[38..42].copy_from_slice(&target.octets());
    f
}

/// An ARP reply telling (`to_mac`, `to_ip`) that `ip` is at `mac`.
pub fn arp_reply(mac: [u8; 6], ip: Ipv4Addr, to_mac: [u8; 6], to_ip: Ipv4Addr) -> [u8; 42] {
    let mut f = arp_request(mac, ip, to_ip);
    f[0..6].copy_from_slice(&to_mac);
    f[20..22].copy_from_slice(&2u16.to_be_bytes());
    f[32..38].copy_from_slice(&to_mac);
    f
}

/// Source IPv4 address and source MAC of an Ethernet frame carrying IPv4, if it does.
pub fn ipv4_src(frame: &[u8]) -> Option<(Ipv4Addr, [u8; 6])> {
    if frame.len() < ETH + IPV4 || frame[12..14] != ETHERTYPE_IPV4.to_be_bytes() {
        return None;
    }
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&frame[6..12]);
    Some((
        Ipv4Addr::new(frame[26], frame[27], frame[28], frame[29]),
        mac,
    ))
}

/// If `frame` is an ARP reply, the (sender IP, sender MAC) it announces.
pub fn arp_reply_sender(frame: &[u8]) -> Option<(Ipv4Addr, [u8; 6])> {
    if frame.len() < 42
        || frame[12..14] != ETHERTYPE_ARP.to_be_bytes()
        || frame[20..22] != 2u16.to_be_bytes()
    {
        return None;
    }
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&frame[22..28]);
    Some((
        Ipv4Addr::new(frame[28], frame[29], frame[30], frame[31]),
        mac,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_and_checksum() {
        let mut b = [0u8; 64];
        let (s, d) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        write_ipv4_headers(&mut b, [1; 6], [2; 6], s, d, PROTO_EXPERIMENT, 64);
        assert_eq!(ipv4_dst(&b), Some(d));
        assert_eq!(
            checksum(&b[ETH..ETH + IPV4]),
            0,
            "a valid header sums to zero"
        );
        assert_eq!(u16::from_be_bytes([b[16], b[17]]), 50);
        assert_eq!(ipv4_dst(&b[..20]), None);
        let a = arp_request([1; 6], s, d);
        assert_eq!(ipv4_dst(&a), None);
        assert_eq!(arp_reply_sender(&a), None);
    }
}

/// Ethertype of a record: an established TCP connection's bytes sent over a fast channel
/// outside TCP's segments (the IEEE's first local experimental ethertype). Nothing but a fast
/// channel's partner sends one, and only a fast channel's frames are taken as one.
pub const ETHERTYPE_RECORD: u16 = 0x88b5;
/// A record's headers: Ethernet, then the connection's source and destination IPv4 addresses
/// and ports, the sequence number of its first byte, a version byte (1), a kind byte
/// ([`RecordKind`]) and two zero bytes. A data record's payload follows, to the frame's end;
/// the others have none.
pub const RECORD_HEAD: usize = ETH + 20;
const RECORD_VERSION: u8 = 1;

/// What a record is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// The connection's bytes, from `seq` on (at least one).
    Data,
    /// No bytes: its sender holds the connection and takes records for it, and asks whether
    /// the receiver does too. Only a stack that ends the connection answers; a partner that
    /// forwards it (a balancer) does not know records and drops the question, and the sender
    /// goes on with segments.
    Ask,
    /// No bytes: the answer to an [`RecordKind::Ask`]: its sender holds the connection and
    /// takes records for it.
    Confirm,
}

impl RecordKind {
    fn byte(self) -> u8 {
        match self {
            RecordKind::Data => 0,
            RecordKind::Ask => 1,
            RecordKind::Confirm => 2,
        }
    }
}

/// A record's connection, its kind, and where its bytes start ([`ETHERTYPE_RECORD`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub kind: RecordKind,
}

impl Record {
    /// The headers of a record from `src_mac` to `dst_mac`.
    pub fn head(&self, dst_mac: [u8; 6], src_mac: [u8; 6]) -> [u8; RECORD_HEAD] {
        let mut h = [0u8; RECORD_HEAD];
        h[..6].copy_from_slice(&dst_mac);
        h[6..12].copy_from_slice(&src_mac);
        h[12..14].copy_from_slice(&ETHERTYPE_RECORD.to_be_bytes());
        h[ETH..ETH + 4].copy_from_slice(&self.src.octets());
        h[ETH + 4..ETH + 8].copy_from_slice(&self.dst.octets());
        h[ETH + 8..ETH + 10].copy_from_slice(&self.src_port.to_be_bytes());
        h[ETH + 10..ETH + 12].copy_from_slice(&self.dst_port.to_be_bytes());
        h[ETH + 12..ETH + 16].copy_from_slice(&self.seq.to_be_bytes());
        h[ETH + 16] = RECORD_VERSION;
        h[ETH + 17] = self.kind.byte();
        h
    }

    /// The record `frame` is, if it is one: its ethertype, its version, a kind it knows and zero
    /// bytes, and a payload of at least one byte for data, none for the others.
    pub fn parse(frame: &[u8]) -> Option<Record> {
        if frame.len() < RECORD_HEAD
            || frame[12..14] != ETHERTYPE_RECORD.to_be_bytes()
            || frame[ETH + 16] != RECORD_VERSION
            || frame[ETH + 18..RECORD_HEAD] != [0, 0]
        {
            return None;
        }
        let kind = match (frame[ETH + 17], frame.len() > RECORD_HEAD) {
            (0, true) => RecordKind::Data,
            (1, false) => RecordKind::Ask,
            (2, false) => RecordKind::Confirm,
            _ => return None,
        };
        let ip = |i: usize| Ipv4Addr::new(frame[i], frame[i + 1], frame[i + 2], frame[i + 3]);
        let be16 = |i: usize| u16::from_be_bytes([frame[i], frame[i + 1]]);
        Some(Record {
            src: ip(ETH),
            dst: ip(ETH + 4),
            src_port: be16(ETH + 8),
            dst_port: be16(ETH + 10),
            seq: u32::from_be_bytes([
                frame[ETH + 12],
                frame[ETH + 13],
                frame[ETH + 14],
                frame[ETH + 15],
            ]),
            kind,
        })
    }

    /// Whether `frame` is marked as a record (valid or not).
    pub fn is_one(frame: &[u8]) -> bool {
        frame.len() >= 14 && frame[12..14] == ETHERTYPE_RECORD.to_be_bytes()
    }
}

#[cfg(test)]
mod record_tests {
    use super::*;

    #[test]
    fn a_record_is_parsed_as_written_and_nothing_else_is_one() {
        let r = Record {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            src_port: 40000,
            dst_port: 80,
            seq: 0xdead_beef,
            kind: RecordKind::Data,
        };
        let mut f = r.head([2; 6], [3; 6]).to_vec();
        assert_eq!(f.len(), RECORD_HEAD);
        assert!(Record::is_one(&f));
        assert_eq!(Record::parse(&f), None, "no payload");
        f.push(7);
        assert_eq!(Record::parse(&f), Some(r));
        // a question and its answer carry no bytes
        for kind in [RecordKind::Ask, RecordKind::Confirm] {
            let q = Record { kind, ..r };
            let mut g = q.head([2; 6], [3; 6]).to_vec();
            assert_eq!(Record::parse(&g), Some(q));
            g.push(7);
            assert_eq!(Record::parse(&g), None, "{kind:?} with a payload");
        }
        // another version, an unknown kind, a byte not zero, another ethertype, too short
        for (at, v) in [(ETH + 16, 2u8), (ETH + 17, 3), (ETH + 19, 1), (12, 0x08)] {
            let mut g = f.clone();
            g[at] = v;
            assert_eq!(Record::parse(&g), None, "byte {at}");
        }
        assert_eq!(Record::parse(&f[..RECORD_HEAD - 1]), None);
        assert!(!Record::is_one(&f[..13]));
    }
}
