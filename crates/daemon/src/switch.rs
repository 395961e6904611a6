//! The daemon's forwarding decision: a pure function of a frame's first bytes, its source pipe
//! and the flow table. No I/O, no clock; unit tests drive it directly.
//!
//! Rules, in order: frames shorter than an Ethernet header are malformed. ARP requests for a
//! pipe's address are answered by the daemon itself (proxy ARP, built here), never flooded.
//! IPv4 frames must carry the source pipe's own address as source (anti-spoofing); they go to
//! the pipe that owns the destination address (the flow director), or to every other pipe when
//! the destination is a broadcast or multicast address. With a link to the wire (the daemon
//! drives a NIC), the daemon is every other address's next hop: ARP requests for any other
//! address are answered with the link's MAC, and unicast IPv4 to any other address goes to the
//! wire. Broadcasts stay among the pipes. Everything else is dropped with a reason.
//!
//! IPv6 (pipes that have an IPv6 address): the header is checked against the frame's length,
//! extension headers are walked (at most [`MAX_EXT_HEADERS`], each inside the payload and the
//! first [`HEADER_PEEK`] bytes; routing headers and longer chains are dropped), the source must
//! be the pipe's IPv6 address or its link-local address, and the destination selects the pipe
//! as for IPv4 (global and link-local addresses alike); multicast floods. Neighbour
//! solicitations for a pipe's address are answered by the daemon (proxy NDP, the IPv6 twin of
//! proxy ARP); other neighbour-discovery messages (router solicitations and advertisements,
//! neighbour advertisements, redirects) are never forwarded: the daemon answers for every
//! pipe, and no container may announce itself as a router or as someone else. IPv6 does not
//! go to the wire.

use docknet_pipe::delivery::link_local;
use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Bytes of a frame's start that [`decide`] needs (Ethernet + ARP, Ethernet + IPv4 header, or
/// Ethernet + IPv6 header + a neighbour solicitation with its link-layer option, or + up to two
/// short extension headers).
pub const HEADER_PEEK: usize = 96;
use docknet_pipe::ETH_HDR as ETH;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Length of an Ethernet + ARP (IPv4 over Ethernet) frame.
pub const ARP_FRAME_LEN: usize = 42;
/// IPv6 fixed header length.
const IP6: usize = 40;
/// Length of an Ethernet + IPv6 + neighbour advertisement with a target link-layer address.
pub const NA_FRAME_LEN: usize = ETH + IP6 + 24 + 8;
/// Most IPv6 extension headers a frame may carry before its upper-layer header.
pub const MAX_EXT_HEADERS: usize = 2;
const NH_HOP_BY_HOP: u8 = 0;
const NH_TCP: u8 = 6;
const NH_UDP: u8 = 17;
const NH_ROUTING: u8 = 43;
const NH_FRAGMENT: u8 = 44;
const NH_ICMPV6: u8 = 58;
const NH_NONE: u8 = 59;
const NH_DEST_OPTS: u8 = 60;
const ICMP6_ROUTER_SOLICIT: u8 = 133;
const ICMP6_REDIRECT: u8 = 137;
const ICMP6_NEIGHBOR_SOLICIT: u8 = 135;
const ICMP6_NEIGHBOR_ADVERT: u8 = 136;

/// The MAC address the daemon assigns to a pipe: locally administered, derived from its IP.
pub fn mac_for(ip: Ipv4Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x02, 0xdc, o[0], o[1], o[2], o[3]]
}

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn fmt_mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// One row of the flow table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    /// The pipe's address.
    pub ip: Ipv4Addr,
    /// Prefix length of its subnet.
    pub prefix: u8,
    /// The pipe's MAC.
    pub mac: [u8; 6],
    /// The pipe's IPv6 address, if it has one (its link-local address follows from its MAC).
    pub ip6: Option<Ipv6Addr>,
}

impl Port {
    /// An IPv4-only port with the daemon's MAC for `ip`.
    pub fn v4(ip: Ipv4Addr, prefix: u8) -> Port {
        Port {
            ip,
            prefix,
            mac: mac_for(ip),
            ip6: None,
        }
    }
    /// The pipe's IPv6 link-local address, when it speaks IPv6.
    pub fn link_local(&self) -> Option<Ipv6Addr> {
        self.ip6.map(|_| link_local(self.mac))
    }
    /// Whether `a` is one of the pipe's own IPv6 addresses (global or link-local).
    fn owns6(&self, a: Ipv6Addr) -> bool {
        self.ip6
            .is_some_and(|g| g == a || link_local(self.mac) == a)
    }
}

/// Destination IP → port index, plus the ports themselves (index = position in the snapshot).
#[derive(Debug, Clone, Default)]
pub struct FlowTable {
    ports: Vec<Port>,
    by_ip: HashMap<Ipv4Addr, usize>,
    by_ip6: HashMap<Ipv6Addr, usize>,
    gateway: Option<[u8; 6]>,
}

impl FlowTable {
    /// Builds the table; port `i` is `ports[i]`.
    pub fn new(ports: Vec<Port>) -> FlowTable {
        let by_ip = ports.iter().enumerate().map(|(i, p)| (p.ip, i)).collect();
        let mut by_ip6 = HashMap::new();
        for (i, p) in ports.iter().enumerate() {
            if let (Some(g), Some(ll)) = (p.ip6, p.link_local()) {
                by_ip6.insert(g, i);
                by_ip6.insert(ll, i);
            }
        }
        FlowTable {
            ports,
            by_ip,
            by_ip6,
            gateway: None,
        }
    }
    /// Port index owning the IPv6 address `ip` (global or link-local).
    pub fn lookup6(&self, ip: Ipv6Addr) -> Option<usize> {
        self.by_ip6.get(&ip).copied()
    }
    /// The same table with a link to the wire whose MAC is `mac`: addresses no pipe owns are
    /// reached through it.
    pub fn with_gateway(mut self, mac: Option<[u8; 6]>) -> FlowTable {
        self.gateway = mac;
        self
    }
    /// The link's MAC, when there is a link to the wire.
    pub fn gateway(&self) -> Option<[u8; 6]> {
        self.gateway
    }
    /// Port index owning `ip`.
    pub fn lookup(&self, ip: Ipv4Addr) -> Option<usize> {
        self.by_ip.get(&ip).copied()
    }
    /// Number of ports.
    pub fn len(&self) -> usize {
        self.ports.len()
    }
    /// True when there are no ports.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }
    /// Port `i`.
    pub fn port(&self, i: usize) -> Option<&Port> {
        self.ports.get(i)
    }
}

/// Why a frame was dropped. Each reason has its own per-pipe counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Too short, or a header that does not parse.
    Malformed,
    /// Source IP (or ARP sender IP) is not the sending pipe's address.
    Spoofed,
    /// No pipe owns the destination address.
    NoRoute,
    /// Neither IPv4, IPv6 nor ARP, IPv6 from a pipe without an IPv6 address, an upper-layer
    /// protocol other than TCP, UDP and ICMPv6, or an ARP operation or neighbour-discovery
    /// message the daemon does not forward.
    Unsupported,
    /// IPv6 extension headers the daemon does not pass: a routing header, a hop-by-hop header
    /// not first, more than [`MAX_EXT_HEADERS`], or a chain reaching beyond [`HEADER_PEEK`].
    ExtHeader,
}

/// What to do with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Copy to this port's rx ring.
    Unicast(usize),
    /// Copy to every port's rx ring except the source's.
    Flood,
    /// Send this frame back to the source (ARP reply built by the daemon).
    Reply([u8; ARP_FRAME_LEN]),
    /// Send this frame back to the source (neighbour advertisement built by the daemon).
    NdpReply([u8; NA_FRAME_LEN]),
    /// Send it to the wire, for this address.
    Wire(Ipv4Addr),
    /// Drop and count.
    Drop(DropReason),
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn ip_at(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

fn ip6_at(b: &[u8], at: usize) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[at..at + 16]);
    Ipv6Addr::from(o)
}

/// The solicited-node multicast address of `a` (`ff02::1:ffXX:XXXX`, RFC 4291 2.7.1).
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    let mut m = [0u8; 16];
    m[0] = 0xff;
    m[1] = 0x02;
    m[11] = 0x01;
    m[12] = 0xff;
    m[13..].copy_from_slice(&o[13..]);
    Ipv6Addr::from(m)
}

fn is_broadcast_for(dst: Ipv4Addr, p: &Port) -> bool {
    if dst.is_broadcast() || dst.is_multicast() {
        return true;
    }
    if p.prefix >= 31 || p.prefix == 0 {
        return false;
    }
    let mask = u32::MAX.checked_shl(32 - u32::from(p.prefix)).unwrap_or(0);
    u32::from(dst) == (u32::from(p.ip) & mask) | !mask
}

/// Decides the fate of a frame of `len` bytes whose first bytes are `hdr` (at most
/// [`HEADER_PEEK`] of them, fewer if the frame is shorter), sent by port `src`. A `len` shorter
/// than `hdr` is taken as `hdr.len()`.
pub fn decide(hdr: &[u8], len: usize, src: usize, table: &FlowTable) -> Decision {
    let Some(me) = table.port(src) else {
        return Decision::Drop(DropReason::NoRoute);
    };
    if hdr.len() < ETH {
        return Decision::Drop(DropReason::Malformed);
    }
    match be16(hdr, 12) {
        ETHERTYPE_ARP => decide_arp(hdr, me, table),
        ETHERTYPE_IPV4 => {
            if hdr.len() < ETH + 20 || hdr[ETH] >> 4 != 4 || hdr[ETH] & 0x0f < 5 {
                return Decision::Drop(DropReason::Malformed);
            }
            if ip_at(hdr, ETH + 12) != me.ip {
                return Decision::Drop(DropReason::Spoofed);
            }
            let dst = ip_at(hdr, ETH + 16);
            match table.lookup(dst) {
                Some(d) => Decision::Unicast(d),
                None if is_broadcast_for(dst, me) => Decision::Flood,
                None if table.gateway.is_some() => Decision::Wire(dst),
                None => Decision::Drop(DropReason::NoRoute),
            }
        }
        ETHERTYPE_IPV6 => decide_ipv6(hdr, len.max(hdr.len()), me, table),
        _ => Decision::Drop(DropReason::Unsupported),
    }
}

/// The upper-layer protocol of an IPv6 packet and the offset of its header in the frame, after
/// at most [`MAX_EXT_HEADERS`] extension headers, each inside the payload (`end`) and `hdr`.
fn upper_layer(hdr: &[u8], end: usize) -> Result<(u8, usize), DropReason> {
    let mut nh = hdr[ETH + 6];
    let mut off = ETH + IP6;
    for n in 0..=MAX_EXT_HEADERS {
        let len = match nh {
            NH_TCP | NH_UDP | NH_ICMPV6 | NH_NONE => return Ok((nh, off)),
            // hop-by-hop options may only come first (RFC 8200 4.1)
            NH_HOP_BY_HOP if n > 0 => return Err(DropReason::ExtHeader),
            NH_HOP_BY_HOP | NH_DEST_OPTS | NH_FRAGMENT if n < MAX_EXT_HEADERS => {
                if off + 2 > hdr.len() {
                    return Err(DropReason::ExtHeader);
                }
                if nh == NH_FRAGMENT {
                    8
                } else {
                    (usize::from(hdr[off + 1]) + 1) * 8
                }
            }
            NH_HOP_BY_HOP | NH_DEST_OPTS | NH_FRAGMENT | NH_ROUTING => {
                return Err(DropReason::ExtHeader)
            }
            _ => return Err(DropReason::Unsupported),
        };
        if off + len > end {
            return Err(DropReason::Malformed);
        }
        nh = hdr[off];
        off += len;
    }
    Err(DropReason::ExtHeader)
}

fn decide_ipv6(hdr: &[u8], len: usize, me: &Port, table: &FlowTable) -> Decision {
    if me.ip6.is_none() {
        return Decision::Drop(DropReason::Unsupported);
    }
    if hdr.len() < ETH + IP6 || hdr[ETH] >> 4 != 6 {
        return Decision::Drop(DropReason::Malformed);
    }
    // the payload must lie inside the frame (Ethernet padding after it is allowed)
    let end = ETH + IP6 + usize::from(be16(hdr, ETH + 4));
    if end > len {
        return Decision::Drop(DropReason::Malformed);
    }
    let (proto, off) = match upper_layer(hdr, end) {
        Ok(x) => x,
        Err(r) => return Decision::Drop(r),
    };
    let src = ip6_at(hdr, ETH + 8);
    let dst = ip6_at(hdr, ETH + 24);
    if proto == NH_ICMPV6 {
        if off + 4 > end || off + 4 > hdr.len() {
            return Decision::Drop(DropReason::Malformed);
        }
        if (ICMP6_ROUTER_SOLICIT..=ICMP6_REDIRECT).contains(&hdr[off]) {
            if off != ETH + IP6 {
                // neighbour discovery behind extension headers is not what a stack sends
                return Decision::Drop(DropReason::ExtHeader);
            }
            if hdr[off] != ICMP6_NEIGHBOR_SOLICIT {
                return Decision::Drop(DropReason::Unsupported);
            }
            return decide_ns(hdr, end, src, dst, me, table);
        }
    }
    if !me.owns6(src) {
        return Decision::Drop(DropReason::Spoofed);
    }
    match table.lookup6(dst) {
        Some(d) => Decision::Unicast(d),
        None if dst.is_multicast() => Decision::Flood,
        None => Decision::Drop(DropReason::NoRoute),
    }
}

/// A neighbour solicitation (RFC 4861 4.3, checked as 7.1.1 says) from `me`: answered with
/// the target pipe's MAC when the target is another pipe's address.
fn decide_ns(
    hdr: &[u8],
    end: usize,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    me: &Port,
    table: &FlowTable,
) -> Decision {
    let off = ETH + IP6;
    if hdr[ETH + 7] != 255 || hdr[off + 1] != 0 || end < off + 24 || hdr.len() < off + 24 {
        return Decision::Drop(DropReason::Malformed);
    }
    let target = ip6_at(hdr, off + 8);
    if target.is_multicast() || (dst != target && dst != solicited_node(target)) {
        return Decision::Drop(DropReason::Malformed);
    }
    if src.is_unspecified() {
        // duplicate address detection: the daemon hands out unique addresses, nobody answers
        return Decision::Drop(DropReason::NoRoute);
    }
    if !me.owns6(src) {
        return Decision::Drop(DropReason::Spoofed);
    }
    if me.owns6(target) {
        return Decision::Drop(DropReason::NoRoute);
    }
    match table.lookup6(target).and_then(|i| table.port(i)) {
        Some(t) => Decision::NdpReply(na_frame(t.mac, target, me.mac, src)),
        None => Decision::Drop(DropReason::NoRoute),
    }
}

/// Builds an Ethernet + IPv6 + neighbour advertisement (solicited, override) saying that
/// `target` is at `target_mac`, from `target` to (`dst_mac`, `dst`), with its checksum.
pub fn na_frame(
    target_mac: [u8; 6],
    target: Ipv6Addr,
    dst_mac: [u8; 6],
    dst: Ipv6Addr,
) -> [u8; NA_FRAME_LEN] {
    let mut f = [0u8; NA_FRAME_LEN];
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&target_mac);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let plen = (NA_FRAME_LEN - ETH - IP6) as u16;
    f[ETH] = 0x60;
    f[ETH + 4..ETH + 6].copy_from_slice(&plen.to_be_bytes());
    f[ETH + 6] = NH_ICMPV6;
    f[ETH + 7] = 255;
    f[ETH + 8..ETH + 24].copy_from_slice(&target.octets());
    f[ETH + 24..ETH + 40].copy_from_slice(&dst.octets());
    let o = ETH + IP6;
    f[o] = ICMP6_NEIGHBOR_ADVERT;
    f[o + 4] = 0x60; // solicited, override
    f[o + 8..o + 24].copy_from_slice(&target.octets());
    f[o + 24] = 2; // target link-layer address option, 8 bytes
    f[o + 25] = 1;
    f[o + 26..o + 32].copy_from_slice(&target_mac);
    let c = icmp6_checksum(target, dst, &f[o..]);
    f[o + 2..o + 4].copy_from_slice(&c.to_be_bytes());
    f
}

/// The ICMPv6 checksum of `msg` (its checksum field zero) from `src` to `dst` (RFC 8200 8.1).
pub fn icmp6_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> u16 {
    let mut sum = 0u32;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(msg.len() as u32).to_be_bytes());
    add(&[0, 0, 0, NH_ICMPV6]);
    add(msg);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn decide_arp(hdr: &[u8], me: &Port, table: &FlowTable) -> Decision {
    if hdr.len() < ARP_FRAME_LEN
        || be16(hdr, ETH) != 1
        || be16(hdr, ETH + 2) != ETHERTYPE_IPV4
        || hdr[ETH + 4] != 6
        || hdr[ETH + 5] != 4
    {
        return Decision::Drop(DropReason::Malformed);
    }
    let sender_ip = ip_at(hdr, ETH + 14);
    if sender_ip != me.ip {
        return Decision::Drop(DropReason::Spoofed);
    }
    if be16(hdr, ETH + 6) != 1 {
        // replies and gratuitous announcements: the daemon answers for every pipe itself
        return Decision::Drop(DropReason::Unsupported);
    }
    let target_ip = ip_at(hdr, ETH + 24);
    let mut sender_mac = [0u8; 6];
    sender_mac.copy_from_slice(&hdr[ETH + 8..ETH + 14]);
    if target_ip == me.ip {
        // a probe for its own address (duplicate address detection): nobody else has it
        return Decision::Drop(DropReason::NoRoute);
    }
    let target_mac = match table.lookup(target_ip).and_then(|i| table.port(i)) {
        Some(t) => t.mac,
        // the daemon is the next hop to every address beyond the pipes
        None if !target_ip.is_unspecified() => match table.gateway {
            Some(g) => g,
            None => return Decision::Drop(DropReason::NoRoute),
        },
        None => return Decision::Drop(DropReason::NoRoute),
    };
    Decision::Reply(arp_frame(
        2, target_mac, target_ip, sender_mac, sender_ip, sender_mac,
    ))
}

/// Builds an Ethernet + ARP frame. `op` 1 = request, 2 = reply.
pub fn arp_frame(
    op: u16,
    sha: [u8; 6],
    spa: Ipv4Addr,
    tha: [u8; 6],
    tpa: Ipv4Addr,
    eth_dst: [u8; 6],
) -> [u8; ARP_FRAME_LEN] {
    let mut f = [0u8; ARP_FRAME_LEN];
    f[0..6].copy_from_slice(&eth_dst);
    f[6..12].copy_from_slice(&sha);
    f[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    f[14..16].copy_from_slice(&1u16.to_be_bytes());
    f[16..18].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    f[18] = 6;
    f[19] = 4;
    f[20..22].copy_from_slice(&op.to_be_bytes());
    f[22..28].copy_from_slice(&sha);
    f[28..32].copy_from_slice(&spa.octets());
    f[32..38].copy_from_slice(&tha);
    f[38..42].copy_from_slice(&tpa.octets());
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> FlowTable {
        let p = |d| {
            let ip = Ipv4Addr::new(10, 1, 0, d);
            Port::v4(ip, 24)
        };
        FlowTable::new(vec![p(1), p(2), p(3)])
    }

    fn ipv4(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[14] = 0x45;
        f[26..30].copy_from_slice(&src.octets());
        f[30..34].copy_from_slice(&dst.octets());
        f
    }

    const A: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);

    #[test]
    fn unicast_by_destination_ip() {
        let t = table();
        assert_eq!(decide(&ipv4(A, B), 0, 0, &t), Decision::Unicast(1));
        assert_eq!(decide(&ipv4(B, A), 0, 1, &t), Decision::Unicast(0));
        assert_eq!(
            decide(&ipv4(A, Ipv4Addr::new(10, 1, 0, 9)), 0, 0, &t),
            Decision::Drop(DropReason::NoRoute)
        );
    }

    #[test]
    fn broadcast_and_multicast_flood() {
        let t = table();
        for d in [
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(10, 1, 0, 255),
            Ipv4Addr::new(224, 0, 0, 1),
        ] {
            assert_eq!(decide(&ipv4(A, d), 0, 0, &t), Decision::Flood);
        }
    }

    #[test]
    fn spoofed_and_malformed_are_dropped() {
        let t = table();
        assert_eq!(
            decide(&ipv4(B, A), 0, 0, &t),
            Decision::Drop(DropReason::Spoofed)
        );
        assert_eq!(
            decide(&[0u8; 5], 0, 0, &t),
            Decision::Drop(DropReason::Malformed)
        );
        let mut f = ipv4(A, B);
        f[14] = 0x65;
        assert_eq!(decide(&f, 0, 0, &t), Decision::Drop(DropReason::Malformed));
        assert_eq!(
            decide(&ipv4(A, B)[..20], 0, 0, &t),
            Decision::Drop(DropReason::Malformed)
        );
        let mut v6 = ipv4(A, B);
        v6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        assert_eq!(
            decide(&v6, 0, 0, &t),
            Decision::Drop(DropReason::Unsupported)
        );
        assert_eq!(
            decide(&ipv4(A, B), 0, 7, &t),
            Decision::Drop(DropReason::NoRoute)
        );
    }

    #[test]
    fn arp_request_is_answered_by_the_daemon() {
        let t = table();
        let req = arp_frame(1, mac_for(A), A, [0; 6], B, [0xff; 6]);
        let Decision::Reply(rep) = decide(&req, 0, 0, &t) else {
            panic!("expected a reply")
        };
        assert_eq!(&rep[0..6], &mac_for(A));
        assert_eq!(&rep[6..12], &mac_for(B));
        assert_eq!(be16(&rep, 20), 2);
        assert_eq!(&rep[22..28], &mac_for(B));
        assert_eq!(ip_at(&rep, 28), B);
        assert_eq!(ip_at(&rep, 38), A);
        // unknown target, spoofed sender, replies
        let unknown = arp_frame(
            1,
            mac_for(A),
            A,
            [0; 6],
            Ipv4Addr::new(10, 1, 0, 77),
            [0xff; 6],
        );
        assert_eq!(
            decide(&unknown, 0, 0, &t),
            Decision::Drop(DropReason::NoRoute)
        );
        assert_eq!(decide(&req, 0, 1, &t), Decision::Drop(DropReason::Spoofed));
        let rep = arp_frame(2, mac_for(A), A, mac_for(B), B, mac_for(B));
        assert_eq!(
            decide(&rep, 0, 0, &t),
            Decision::Drop(DropReason::Unsupported)
        );
        assert_eq!(
            decide(&req[..30], 0, 0, &t),
            Decision::Drop(DropReason::Malformed)
        );
    }

    #[test]
    fn with_a_wire_other_addresses_go_to_it() {
        let gw = [2, 0, 0, 0, 0, 0x77];
        let t = table().with_gateway(Some(gw));
        let far = Ipv4Addr::new(10, 2, 0, 9);
        assert_eq!(decide(&ipv4(A, far), 0, 0, &t), Decision::Wire(far));
        // pipes and broadcasts are unchanged
        assert_eq!(decide(&ipv4(A, B), 0, 0, &t), Decision::Unicast(1));
        assert_eq!(
            decide(&ipv4(A, Ipv4Addr::BROADCAST), 0, 0, &t),
            Decision::Flood
        );
        assert_eq!(
            decide(&ipv4(B, far), 0, 0, &t),
            Decision::Drop(DropReason::Spoofed)
        );
        // ARP for a far address is answered with the link's MAC
        let req = arp_frame(1, mac_for(A), A, [0; 6], far, [0xff; 6]);
        let Decision::Reply(rep) = decide(&req, 0, 0, &t) else {
            panic!("expected a reply")
        };
        assert_eq!(&rep[22..28], &gw);
        assert_eq!(ip_at(&rep, 28), far);
        // but not for the asker's own address (duplicate address detection)
        let own = arp_frame(1, mac_for(A), A, [0; 6], A, [0xff; 6]);
        assert_eq!(decide(&own, 0, 0, &t), Decision::Drop(DropReason::NoRoute));
        assert_eq!(t.gateway(), Some(gw));
    }

    #[test]
    fn any_prefix_is_safe() {
        for prefix in [0u8, 1, 30, 31, 32, 33, 255] {
            let t = FlowTable::new(vec![Port::v4(A, prefix)]);
            let _ = decide(&ipv4(A, Ipv4Addr::new(10, 1, 255, 255)), 0, 0, &t);
        }
    }

    fn ip6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// Pipes 0 and 1 dual-stack, pipe 2 IPv4 only.
    fn table6() -> FlowTable {
        let mut ports: Vec<Port> = table().ports;
        ports[0].ip6 = Some(ip6("fd00::1"));
        ports[1].ip6 = Some(ip6("fd00::2"));
        FlowTable::new(ports)
    }

    fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, nh: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; ETH + IP6];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        f[ETH] = 0x60;
        f[ETH + 4..ETH + 6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
        f[ETH + 6] = nh;
        f[ETH + 7] = 64;
        f[ETH + 8..ETH + 24].copy_from_slice(&src.octets());
        f[ETH + 24..ETH + 40].copy_from_slice(&dst.octets());
        f.extend_from_slice(payload);
        f
    }

    fn ns(src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
        let mut m = vec![0u8; 32];
        m[0] = ICMP6_NEIGHBOR_SOLICIT;
        m[8..24].copy_from_slice(&target.octets());
        m[24] = 1;
        m[25] = 1;
        m[26..32].copy_from_slice(&mac);
        let c = icmp6_checksum(src, dst, &m);
        m[2..4].copy_from_slice(&c.to_be_bytes());
        let mut f = ipv6(src, dst, NH_ICMPV6, &m);
        f[ETH + 7] = 255;
        f
    }

    fn d6(f: &[u8], src: usize, t: &FlowTable) -> Decision {
        decide(&f[..f.len().min(HEADER_PEEK)], f.len(), src, t)
    }

    #[test]
    fn ipv6_unicast_by_destination_and_multicast_floods() {
        let t = table6();
        let (a, b) = (ip6("fd00::1"), ip6("fd00::2"));
        let ll_a = link_local(mac_for(A));
        let ll_b = link_local(mac_for(B));
        assert_eq!(
            d6(&ipv6(a, b, NH_TCP, &[0; 20]), 0, &t),
            Decision::Unicast(1)
        );
        assert_eq!(
            d6(&ipv6(b, a, NH_UDP, &[0; 8]), 1, &t),
            Decision::Unicast(0)
        );
        // link-local addresses are the pipes' too
        assert_eq!(
            d6(&ipv6(ll_a, ll_b, NH_UDP, &[0; 8]), 0, &t),
            Decision::Unicast(1)
        );
        assert_eq!(
            d6(&ipv6(ll_a, b, NH_UDP, &[0; 8]), 0, &t),
            Decision::Unicast(1)
        );
        assert_eq!(
            d6(&ipv6(a, ip6("ff02::1"), NH_UDP, &[0; 8]), 0, &t),
            Decision::Flood
        );
        assert_eq!(
            d6(&ipv6(a, ip6("fd00::9"), NH_TCP, &[0; 20]), 0, &t),
            Decision::Drop(DropReason::NoRoute)
        );
        // the IPv4-only pipe has no IPv6 route, and even a wire does not take IPv6
        let w = table6().with_gateway(Some([2, 0, 0, 0, 0, 7]));
        assert_eq!(
            d6(&ipv6(a, ip6("2001:db8::1"), NH_TCP, &[0; 20]), 0, &w),
            Decision::Drop(DropReason::NoRoute)
        );
        // Ethernet padding after the payload is fine
        let mut padded = ipv6(a, b, NH_UDP, &[0; 8]);
        padded.extend_from_slice(&[0; 6]);
        assert_eq!(d6(&padded, 0, &t), Decision::Unicast(1));
    }

    #[test]
    fn ipv6_sources_are_checked() {
        let t = table6();
        let (a, b) = (ip6("fd00::1"), ip6("fd00::2"));
        // another pipe's global or link-local address, or anything else
        for src in [
            b,
            link_local(mac_for(B)),
            ip6("fd00::77"),
            Ipv6Addr::UNSPECIFIED,
        ] {
            assert_eq!(
                d6(&ipv6(src, b, NH_TCP, &[0; 20]), 0, &t),
                Decision::Drop(DropReason::Spoofed),
                "{src}"
            );
        }
        // a pipe without an IPv6 address sends no IPv6 at all
        assert_eq!(
            d6(
                &ipv6(
                    link_local(mac_for(Ipv4Addr::new(10, 1, 0, 3))),
                    a,
                    NH_TCP,
                    &[0; 20]
                ),
                2,
                &t
            ),
            Decision::Drop(DropReason::Unsupported)
        );
    }

    #[test]
    fn ipv6_headers_are_checked_against_the_frame() {
        let t = table6();
        let (a, b) = (ip6("fd00::1"), ip6("fd00::2"));
        // payload length beyond the frame
        let mut f = ipv6(a, b, NH_TCP, &[0; 20]);
        f[ETH + 4..ETH + 6].copy_from_slice(&21u16.to_be_bytes());
        assert_eq!(d6(&f, 0, &t), Decision::Drop(DropReason::Malformed));
        f[ETH + 4..ETH + 6].copy_from_slice(&0xffffu16.to_be_bytes());
        assert_eq!(d6(&f, 0, &t), Decision::Drop(DropReason::Malformed));
        // wrong version, short header
        let mut f = ipv6(a, b, NH_TCP, &[0; 20]);
        f[ETH] = 0x40;
        assert_eq!(d6(&f, 0, &t), Decision::Drop(DropReason::Malformed));
        assert_eq!(
            d6(&ipv6(a, b, NH_TCP, &[])[..ETH + 30], 0, &t),
            Decision::Drop(DropReason::Malformed)
        );
        // an upper layer the daemon does not pass (ESP)
        assert_eq!(
            d6(&ipv6(a, b, 50, &[0; 16]), 0, &t),
            Decision::Drop(DropReason::Unsupported)
        );
    }

    #[test]
    fn ipv6_extension_headers_are_bounded() {
        let t = table6();
        let (a, b) = (ip6("fd00::1"), ip6("fd00::2"));
        let ext = |next: u8| {
            let mut e = [0u8; 8];
            e[0] = next;
            e
        };
        let with = |nh: u8, exts: &[[u8; 8]]| {
            let mut p: Vec<u8> = exts.iter().flatten().copied().collect();
            p.extend_from_slice(&[0; 20]);
            ipv6(a, b, nh, &p)
        };
        // hop-by-hop then a fragment header: two, allowed
        let ok = with(NH_HOP_BY_HOP, &[ext(NH_FRAGMENT), ext(NH_TCP)]);
        assert_eq!(d6(&ok, 0, &t), Decision::Unicast(1));
        assert_eq!(
            d6(&with(NH_DEST_OPTS, &[ext(NH_UDP)]), 0, &t),
            Decision::Unicast(1)
        );
        // three are too many; routing headers are never passed; hop-by-hop only first
        let three = with(
            NH_DEST_OPTS,
            &[ext(NH_DEST_OPTS), ext(NH_FRAGMENT), ext(NH_TCP)],
        );
        assert_eq!(d6(&three, 0, &t), Decision::Drop(DropReason::ExtHeader));
        assert_eq!(
            d6(&with(NH_ROUTING, &[ext(NH_TCP)]), 0, &t),
            Decision::Drop(DropReason::ExtHeader)
        );
        assert_eq!(
            d6(
                &with(NH_DEST_OPTS, &[ext(NH_HOP_BY_HOP), ext(NH_TCP)]),
                0,
                &t
            ),
            Decision::Drop(DropReason::ExtHeader)
        );
        // a header longer than the payload, and one reaching beyond what the daemon reads
        let mut long = ext(NH_TCP);
        long[1] = 200;
        assert_eq!(
            d6(&with(NH_DEST_OPTS, &[long]), 0, &t),
            Decision::Drop(DropReason::Malformed)
        );
        let mut big = vec![0u8; 8 * 6 + 20];
        big[0] = NH_DEST_OPTS;
        big[1] = 5; // 48 bytes: the next header starts beyond the first 96
        let f = ipv6(a, b, NH_DEST_OPTS, &big);
        assert_eq!(d6(&f, 0, &t), Decision::Drop(DropReason::ExtHeader));
    }

    #[test]
    fn neighbour_solicitations_are_answered_by_the_daemon() {
        let t = table6();
        let (a, b) = (ip6("fd00::1"), ip6("fd00::2"));
        let (ma, mb) = (mac_for(A), mac_for(B));
        for (src, target, dst) in [
            (a, b, solicited_node(b)),
            (link_local(ma), b, solicited_node(b)),
            (a, link_local(mb), solicited_node(link_local(mb))),
            (a, b, b), // unicast (reachability confirmation)
        ] {
            let Decision::NdpReply(na) = d6(&ns(src, dst, target, ma), 0, &t) else {
                panic!("expected an advertisement for {target} from {src}")
            };
            assert_eq!(&na[0..6], &ma);
            assert_eq!(&na[6..12], &mb);
            assert_eq!(be16(&na, 12), ETHERTYPE_IPV6);
            assert_eq!(ip6_at(&na, ETH + 8), target);
            assert_eq!(ip6_at(&na, ETH + 24), src);
            assert_eq!(na[ETH + 7], 255);
            let o = ETH + IP6;
            assert_eq!(na[o], ICMP6_NEIGHBOR_ADVERT);
            assert_eq!(na[o + 4], 0x60);
            assert_eq!(ip6_at(&na, o + 8), target);
            assert_eq!(&na[o + 24..o + 26], &[2, 1]);
            assert_eq!(&na[o + 26..o + 32], &mb);
            // a checksum over the pseudo-header that verifies
            assert_eq!(icmp6_checksum(target, src, &na[o..]), 0);
        }
        // own address, duplicate address detection, nobody's, spoofed, hop limit, wrong dst
        let own = ns(a, solicited_node(a), a, ma);
        assert_eq!(d6(&own, 0, &t), Decision::Drop(DropReason::NoRoute));
        let dad = ns(Ipv6Addr::UNSPECIFIED, solicited_node(b), b, ma);
        assert_eq!(d6(&dad, 0, &t), Decision::Drop(DropReason::NoRoute));
        let nobody = ns(a, solicited_node(ip6("fd00::9")), ip6("fd00::9"), ma);
        assert_eq!(d6(&nobody, 0, &t), Decision::Drop(DropReason::NoRoute));
        let spoofed = ns(ip6("fd00::2"), solicited_node(a), a, mb);
        assert_eq!(d6(&spoofed, 0, &t), Decision::Drop(DropReason::Spoofed));
        let mut hops = ns(a, solicited_node(b), b, ma);
        hops[ETH + 7] = 64;
        assert_eq!(d6(&hops, 0, &t), Decision::Drop(DropReason::Malformed));
        let wrong = ns(a, solicited_node(ip6("fd00::9")), b, ma);
        assert_eq!(d6(&wrong, 0, &t), Decision::Drop(DropReason::Malformed));
        let short = ns(a, solicited_node(b), b, ma);
        assert_eq!(
            d6(&short[..ETH + IP6 + 20], 0, &t),
            Decision::Drop(DropReason::Malformed)
        );
        // routers, advertisements and redirects from a pipe are never passed
        for ty in [133u8, 134, 136, 137] {
            let mut f = ns(a, ip6("ff02::1"), b, ma);
            f[ETH + IP6] = ty;
            assert_eq!(
                d6(&f, 0, &t),
                Decision::Drop(DropReason::Unsupported),
                "{ty}"
            );
        }
        // other ICMPv6 (echo) is switched like any packet
        let mut echo = ns(a, b, b, ma);
        echo[ETH + IP6] = 128;
        assert_eq!(d6(&echo, 0, &t), Decision::Unicast(1));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let t = table();
        let t6 = table6();
        let mut x = 0x243f6a8885a308d3u64;
        for n in 0..20000usize {
            let len = n % (HEADER_PEEK + 1);
            let mut f = vec![0u8; len];
            for b in f.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            if len >= 14 && n % 3 == 0 {
                f[12] = 0x08;
                f[13] = if n % 2 == 0 { 0x00 } else { 0x06 };
            }
            if len >= ETH + IP6 && n % 3 == 1 {
                f[12] = 0x86;
                f[13] = 0xdd;
                f[ETH] = 0x60;
                f[ETH + 6] = [0, 6, 17, 43, 44, 58, 60][n % 7];
                if n % 5 == 0 {
                    f[ETH + 8..ETH + 24].copy_from_slice(&ip6("fd00::1").octets());
                }
            }
            let _ = decide(&f, 0, n % 4, &t);
            let _ = decide(&f, (x as usize) % 70000, n % 4, &t6);
        }
    }
}
