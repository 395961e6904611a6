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

use std::collections::HashMap;
use std::net::Ipv4Addr;

/// Bytes of a frame's start that [`decide`] needs (Ethernet + ARP, or Ethernet + IPv4 header).
pub const HEADER_PEEK: usize = 64;
use docknet_pipe::ETH_HDR as ETH;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
/// Length of an Ethernet + ARP (IPv4 over Ethernet) frame.
pub const ARP_FRAME_LEN: usize = 42;

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
}

/// Destination IP → port index, plus the ports themselves (index = position in the snapshot).
#[derive(Debug, Clone, Default)]
pub struct FlowTable {
    ports: Vec<Port>,
    by_ip: HashMap<Ipv4Addr, usize>,
    gateway: Option<[u8; 6]>,
}

impl FlowTable {
    /// Builds the table; port `i` is `ports[i]`.
    pub fn new(ports: Vec<Port>) -> FlowTable {
        let by_ip = ports.iter().enumerate().map(|(i, p)| (p.ip, i)).collect();
        FlowTable {
            ports,
            by_ip,
            gateway: None,
        }
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
    /// Neither IPv4 nor ARP, or an ARP operation the daemon does not forward.
    Unsupported,
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

/// Decides the fate of a frame whose first bytes are `hdr` (at most [`HEADER_PEEK`] of them,
/// fewer if the frame is shorter), sent by port `src`.
pub fn decide(hdr: &[u8], src: usize, table: &FlowTable) -> Decision {
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
        _ => Decision::Drop(DropReason::Unsupported),
    }
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
            Port {
                ip,
                prefix: 24,
                mac: mac_for(ip),
            }
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
        assert_eq!(decide(&ipv4(A, B), 0, &t), Decision::Unicast(1));
        assert_eq!(decide(&ipv4(B, A), 1, &t), Decision::Unicast(0));
        assert_eq!(
            decide(&ipv4(A, Ipv4Addr::new(10, 1, 0, 9)), 0, &t),
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
            assert_eq!(decide(&ipv4(A, d), 0, &t), Decision::Flood);
        }
    }

    #[test]
    fn spoofed_and_malformed_are_dropped() {
        let t = table();
        assert_eq!(
            decide(&ipv4(B, A), 0, &t),
            Decision::Drop(DropReason::Spoofed)
        );
        assert_eq!(
            decide(&[0u8; 5], 0, &t),
            Decision::Drop(DropReason::Malformed)
        );
        let mut f = ipv4(A, B);
        f[14] = 0x65;
        assert_eq!(decide(&f, 0, &t), Decision::Drop(DropReason::Malformed));
        assert_eq!(
            decide(&ipv4(A, B)[..20], 0, &t),
            Decision::Drop(DropReason::Malformed)
        );
        let mut v6 = ipv4(A, B);
        v6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        assert_eq!(decide(&v6, 0, &t), Decision::Drop(DropReason::Unsupported));
        assert_eq!(
            decide(&ipv4(A, B), 7, &t),
            Decision::Drop(DropReason::NoRoute)
        );
    }

    #[test]
    fn arp_request_is_answered_by_the_daemon() {
        let t = table();
        let req = arp_frame(1, mac_for(A), A, [0; 6], B, [0xff; 6]);
        let Decision::Reply(rep) = decide(&req, 0, &t) else {
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
        assert_eq!(decide(&unknown, 0, &t), Decision::Drop(DropReason::NoRoute));
        assert_eq!(decide(&req, 1, &t), Decision::Drop(DropReason::Spoofed));
        let rep = arp_frame(2, mac_for(A), A, mac_for(B), B, mac_for(B));
        assert_eq!(decide(&rep, 0, &t), Decision::Drop(DropReason::Unsupported));
        assert_eq!(
            decide(&req[..30], 0, &t),
            Decision::Drop(DropReason::Malformed)
        );
    }

    #[test]
    fn with_a_wire_other_addresses_go_to_it() {
        let gw = [2, 0, 0, 0, 0, 0x77];
        let t = table().with_gateway(Some(gw));
        let far = Ipv4Addr::new(10, 2, 0, 9);
        assert_eq!(decide(&ipv4(A, far), 0, &t), Decision::Wire(far));
        // pipes and broadcasts are unchanged
        assert_eq!(decide(&ipv4(A, B), 0, &t), Decision::Unicast(1));
        assert_eq!(
            decide(&ipv4(A, Ipv4Addr::BROADCAST), 0, &t),
            Decision::Flood
        );
        assert_eq!(
            decide(&ipv4(B, far), 0, &t),
            Decision::Drop(DropReason::Spoofed)
        );
        // ARP for a far address is answered with the link's MAC
        let req = arp_frame(1, mac_for(A), A, [0; 6], far, [0xff; 6]);
        let Decision::Reply(rep) = decide(&req, 0, &t) else {
            panic!("expected a reply")
        };
        assert_eq!(&rep[22..28], &gw);
        assert_eq!(ip_at(&rep, 28), far);
        // but not for the asker's own address (duplicate address detection)
        let own = arp_frame(1, mac_for(A), A, [0; 6], A, [0xff; 6]);
        assert_eq!(decide(&own, 0, &t), Decision::Drop(DropReason::NoRoute));
        assert_eq!(t.gateway(), Some(gw));
    }

    #[test]
    fn any_prefix_is_safe() {
        for prefix in [0u8, 1, 30, 31, 32, 33, 255] {
            let t = FlowTable::new(vec![Port {
                ip: A,
                prefix,
                mac: mac_for(A),
            }]);
            let _ = decide(&ipv4(A, Ipv4Addr::new(10, 1, 255, 255)), 0, &t);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let t = table();
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
            let _ = decide(&f, n % 4, &t);
        }
    }
}
