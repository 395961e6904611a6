//! How a region reaches a container: messages on a `SOCK_SEQPACKET` Unix socket, each with at
//! most one file descriptor ([`crate::fdpass`]). The daemon speaks first:
//!
//! ```text
//!  Hello   {pipe: name, ip, prefix, mac, mtu, depth [, ip6, prefix6]}  + the pipe's memfd
//!  Gateway {ip}                  (only when the daemon drives a link: the way beyond the pipe's network)
//!  Channel {id, side A|B, mtu, depth, peer name/ip/mac [, peer ip6]}  + the channel's memfd (0..n)
//!  Synced                                               (the list of channels is complete)
//!  ... later, whenever channels change:
//!  Channel {...} + memfd   |   Closed {id}
//!  Services {len}                 + a sealed memfd: the services table (crate::services)
//! ```
//!
//! `Gateway` follows `Hello` when the daemon drives a link (`--nic`): frames for addresses beyond
//! the pipe's network then have somewhere to go, and DockLib routes them to `ip`, an address the
//! daemon answers ARP for with the link's MAC ([`GATEWAY`]). Without it, the pipe reaches its own
//! network only.
//!
//! `Services` comes before `Synced` when the daemon has services, and again whenever they
//! change (the daemon bumps the generation word so that a container reads it).
//!
//! Everything a container needs to use a region comes from these messages, never from the
//! region's shared header: the ring layout is computed from (mtu, depth) by
//! [`crate::layout::plan`] on both sides, and a fast channel's partner is who the daemon says.
//! A header a partner can write is therefore never trusted. The encoding is fixed-size and
//! little-endian; [`Msg::decode`] checks every field. A message of this version whose type the
//! reader does not know ([`DecodeError::Unknown`]: a newer daemon's) is skipped by DockLib and
//! counted, so a daemon can add messages without cutting off older containers; a message of
//! another version ends the connection.
//!
//! **IPv6.** A pipe with an IPv6 address (and a channel whose partner has one) carries it after
//! the name: 16 address bytes, and for a pipe its prefix length. The trailer is there only when
//! the address is, so a pipe without IPv6 is described byte for byte as before.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Version of the delivery messages.
pub const VERSION: u8 = 1;
/// Longest message.
pub const MAX_MSG: usize = 256;
/// Longest pipe name (as the daemon accepts them): room for a container runtime's IDs (64 hex
/// digits from containerd and CRI-O) with a prefix.
pub const MAX_NAME: usize = 128;
/// The abstract socket name a container finds its pipe at, unless told otherwise.
pub const DEFAULT_SOCKET: &str = "docknet/pipe";

const T_HELLO: u8 = 1;
const T_CHANNEL: u8 = 2;
const T_CLOSED: u8 = 3;
const T_SYNCED: u8 = 4;
const T_SERVICES: u8 = 5;
const T_GATEWAY: u8 = 6;

/// The gateway address the daemon gives its pipes when it drives a link: link-local, so it is
/// no pipe's and no pod network's, and the same on every node. The daemon answers ARP for it
/// with the link's MAC; the host's end of a link made for the node's own kernel
/// (docs/kubernetes.md, "The node and beyond") carries it too, so frames to it reach the node.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// A pipe as the daemon describes it to its container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipeDesc {
    /// Its name.
    pub name: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Prefix length of its subnet.
    pub prefix: u8,
    /// Its MAC.
    pub mac: [u8; 6],
    /// MTU (the ring layout follows from it and the depth).
    pub mtu: u32,
    /// Ring depth.
    pub depth: u32,
    /// Its IPv6 address and prefix length, if it has one (dual stack).
    pub ip6: Option<(Ipv6Addr, u8)>,
}

/// Which end of a fast channel the receiver is: A sends on ring 0, B on ring 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Sends on ring 0, receives on ring 1.
    A,
    /// Sends on ring 1, receives on ring 0.
    B,
}

/// A fast channel as the daemon describes it to one of its partners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelDesc {
    /// The channel's id (unique within the daemon's state).
    pub id: u64,
    /// Which end the receiver is.
    pub side: Side,
    /// Channel MTU.
    pub mtu: u32,
    /// Ring depth.
    pub depth: u32,
    /// The partner pipe's name.
    pub peer: String,
    /// The partner's address: frames from the channel must carry it.
    pub peer_ip: Ipv4Addr,
    /// The partner's MAC: frames from the channel must carry it.
    pub peer_mac: [u8; 6],
    /// The partner's IPv6 address, if it has one: IPv6 frames from the channel must carry it
    /// (or the partner's link-local address, [`link_local`]).
    pub peer_ip6: Option<Ipv6Addr>,
}

/// The link-local address of the interface with MAC `mac`: `fe80::/64` with the modified EUI-64
/// interface identifier (RFC 4291, appendix A). The daemon and DockLib derive a pipe's
/// link-local address this way, so both agree on it without telling each other.
pub fn link_local(mac: [u8; 6]) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o[0] = 0xfe;
    o[1] = 0x80;
    o[8] = mac[0] ^ 0x02;
    o[9] = mac[1];
    o[10] = mac[2];
    o[11] = 0xff;
    o[12] = 0xfe;
    o[13] = mac[3];
    o[14] = mac[4];
    o[15] = mac[5];
    Ipv6Addr::from(o)
}

/// A delivery message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// The pipe (with its memfd).
    Hello(PipeDesc),
    /// A fast channel (with its memfd).
    Channel(ChannelDesc),
    /// A fast channel is gone.
    Closed {
        /// Its id.
        id: u64,
    },
    /// Every current channel has been sent.
    Synced,
    /// Addresses beyond the pipe's network are reached through `ip` (the daemon drives a
    /// link).
    Gateway {
        /// The next hop to give them.
        ip: Ipv4Addr,
    },
    /// The services table (with its sealed memfd of `len` bytes).
    Services {
        /// Its length in bytes.
        len: u32,
    },
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than its type requires, or longer than [`MAX_MSG`].
    #[error("message of {0} bytes has the wrong length")]
    Length(usize),
    /// Unknown version.
    #[error("unknown message type {0} or version")]
    Type(u8),
    /// A message of this version whose type this side does not know (a newer daemon's): a
    /// reader may skip it.
    #[error("unknown message type {0}")]
    Unknown(u8),
    /// A field out of range.
    #[error("message field out of range: {0}")]
    Field(&'static str),
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    let b = &name.as_bytes()[..name.len().min(MAX_NAME)];
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

/// A little cursor over a received message: every read is bounds-checked.
struct Rd<'a>(&'a [u8]);

impl Rd<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Length(n));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from(self.u32()?) | u64::from(self.u32()?) << 32)
    }
    fn ip6(&mut self) -> Result<Ipv6Addr, DecodeError> {
        let b = self.take(16)?;
        let mut o = [0u8; 16];
        o.copy_from_slice(b);
        let a = Ipv6Addr::from(o);
        if a.is_unspecified() || a.is_multicast() || a.is_loopback() {
            return Err(DecodeError::Field("ipv6 address"));
        }
        Ok(a)
    }
    fn mac(&mut self) -> Result<[u8; 6], DecodeError> {
        let b = self.take(6)?;
        Ok([b[0], b[1], b[2], b[3], b[4], b[5]])
    }
    fn name(&mut self) -> Result<String, DecodeError> {
        let n = self.u8()? as usize;
        if n == 0 || n > MAX_NAME {
            return Err(DecodeError::Field("name length"));
        }
        let b = self.take(n)?;
        let ok = b
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'));
        if !ok {
            return Err(DecodeError::Field("name"));
        }
        Ok(String::from_utf8_lossy(b).into_owned())
    }
}

fn check_ring(mtu: u32, depth: u32) -> Result<(), DecodeError> {
    crate::layout::RingParams::for_mtu(mtu, Some(depth))
        .map(drop)
        .map_err(|_| DecodeError::Field("mtu or depth"))
}

impl Msg {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(64);
        match self {
            Msg::Hello(p) => {
                o.extend([T_HELLO, VERSION]);
                o.extend(u32::from(p.ip).to_le_bytes());
                o.push(p.prefix);
                o.extend(p.mac);
                o.extend(p.mtu.to_le_bytes());
                o.extend(p.depth.to_le_bytes());
                put_name(&mut o, &p.name);
                if let Some((a, len)) = p.ip6 {
                    o.extend(a.octets());
                    o.push(len);
                }
            }
            Msg::Channel(c) => {
                o.extend([T_CHANNEL, VERSION]);
                o.extend((c.id as u32).to_le_bytes());
                o.extend(((c.id >> 32) as u32).to_le_bytes());
                o.push(match c.side {
                    Side::A => 0,
                    Side::B => 1,
                });
                o.extend(c.mtu.to_le_bytes());
                o.extend(c.depth.to_le_bytes());
                o.extend(u32::from(c.peer_ip).to_le_bytes());
                o.extend(c.peer_mac);
                put_name(&mut o, &c.peer);
                if let Some(a) = c.peer_ip6 {
                    o.extend(a.octets());
                }
            }
            Msg::Closed { id } => {
                o.extend([T_CLOSED, VERSION]);
                o.extend((*id as u32).to_le_bytes());
                o.extend(((*id >> 32) as u32).to_le_bytes());
            }
            Msg::Synced => o.extend([T_SYNCED, VERSION]),
            Msg::Gateway { ip } => {
                o.extend([T_GATEWAY, VERSION]);
                o.extend(u32::from(*ip).to_le_bytes());
            }
            Msg::Services { len } => {
                o.extend([T_SERVICES, VERSION]);
                o.extend(len.to_le_bytes());
            }
        }
        o
    }

    /// Parses and checks a message.
    pub fn decode(b: &[u8]) -> Result<Msg, DecodeError> {
        if b.len() < 2 || b.len() > MAX_MSG {
            return Err(DecodeError::Length(b.len()));
        }
        if b[1] != VERSION {
            return Err(DecodeError::Type(b[1]));
        }
        let mut r = Rd(&b[2..]);
        let m = match b[0] {
            T_HELLO => {
                let ip = Ipv4Addr::from(r.u32()?);
                let prefix = r.u8()?;
                if !(1..=32).contains(&prefix) {
                    return Err(DecodeError::Field("prefix"));
                }
                let mac = r.mac()?;
                let (mtu, depth) = (r.u32()?, r.u32()?);
                check_ring(mtu, depth)?;
                let name = r.name()?;
                let ip6 = if r.0.is_empty() {
                    None
                } else {
                    let a = r.ip6()?;
                    let len = r.u8()?;
                    if !(1..=128).contains(&len) {
                        return Err(DecodeError::Field("ipv6 prefix"));
                    }
                    Some((a, len))
                };
                Msg::Hello(PipeDesc {
                    name,
                    ip,
                    prefix,
                    mac,
                    mtu,
                    depth,
                    ip6,
                })
            }
            T_CHANNEL => {
                let id = r.u64()?;
                let side = match r.u8()? {
                    0 => Side::A,
                    1 => Side::B,
                    _ => return Err(DecodeError::Field("side")),
                };
                let (mtu, depth) = (r.u32()?, r.u32()?);
                check_ring(mtu, depth)?;
                let peer_ip = Ipv4Addr::from(r.u32()?);
                let peer_mac = r.mac()?;
                let peer = r.name()?;
                let peer_ip6 = if r.0.is_empty() { None } else { Some(r.ip6()?) };
                Msg::Channel(ChannelDesc {
                    id,
                    side,
                    mtu,
                    depth,
                    peer,
                    peer_ip,
                    peer_mac,
                    peer_ip6,
                })
            }
            T_CLOSED => Msg::Closed { id: r.u64()? },
            T_SYNCED => Msg::Synced,
            T_GATEWAY => {
                let ip = Ipv4Addr::from(r.u32()?);
                if !crate::services::usable(ip) {
                    return Err(DecodeError::Field("gateway"));
                }
                Msg::Gateway { ip }
            }
            T_SERVICES => {
                let len = r.u32()?;
                if !(16..=crate::services::MAX_TABLE as u32).contains(&len) {
                    return Err(DecodeError::Field("services table length"));
                }
                Msg::Services { len }
            }
            t => return Err(DecodeError::Unknown(t)),
        };
        if !r.0.is_empty() {
            return Err(DecodeError::Length(b.len()));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs() -> Vec<Msg> {
        vec![
            Msg::Hello(PipeDesc {
                name: "web-1".into(),
                ip: Ipv4Addr::new(10, 0, 0, 2),
                prefix: 24,
                mac: [2, 0xdc, 10, 0, 0, 2],
                mtu: 9000,
                depth: 1024,
                ip6: None,
            }),
            Msg::Channel(ChannelDesc {
                id: 0x1_0000_0007,
                side: Side::B,
                mtu: 65535,
                depth: 256,
                peer: "db".into(),
                peer_ip: Ipv4Addr::new(10, 0, 0, 3),
                peer_mac: [2, 0xdc, 10, 0, 0, 3],
                peer_ip6: None,
            }),
            Msg::Closed { id: 7 },
            Msg::Synced,
            Msg::Hello(PipeDesc {
                name: "dual".into(),
                ip: Ipv4Addr::new(10, 0, 0, 4),
                prefix: 24,
                mac: [2, 0xdc, 10, 0, 0, 4],
                mtu: 1500,
                depth: 1024,
                ip6: Some(("fd00:dc::4".parse().unwrap(), 64)),
            }),
            Msg::Channel(ChannelDesc {
                id: 9,
                side: Side::A,
                mtu: 65535,
                depth: 256,
                peer: "dual".into(),
                peer_ip: Ipv4Addr::new(10, 0, 0, 4),
                peer_mac: [2, 0xdc, 10, 0, 0, 4],
                peer_ip6: Some("fd00:dc::4".parse().unwrap()),
            }),
            Msg::Services { len: 4096 },
            Msg::Gateway { ip: GATEWAY },
        ]
    }

    #[test]
    fn a_gateway_must_be_a_unicast_address() {
        for bad in [
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "127.0.0.1",
            "0.1.2.3",
        ] {
            let m = Msg::Gateway {
                ip: bad.parse().unwrap(),
            };
            assert_eq!(
                Msg::decode(&m.encode()),
                Err(DecodeError::Field("gateway")),
                "{bad}"
            );
        }
    }

    #[test]
    fn ipv6_trailers_are_checked() {
        let m = msgs();
        let n = m[0].encode().len();
        let mut h = m[4].encode();
        assert_eq!(h.len(), n - "web-1".len() + "dual".len() + 17);
        let last = h.len() - 1;
        h[last] = 0; // prefix 0
        assert_eq!(Msg::decode(&h), Err(DecodeError::Field("ipv6 prefix")));
        h[last] = 129;
        assert_eq!(Msg::decode(&h), Err(DecodeError::Field("ipv6 prefix")));
        let mut c = m[5].encode();
        let at = c.len() - 16;
        c[at..].copy_from_slice(&Ipv6Addr::UNSPECIFIED.octets());
        assert_eq!(Msg::decode(&c), Err(DecodeError::Field("ipv6 address")));
        c[at] = 0xff; // multicast
        assert_eq!(Msg::decode(&c), Err(DecodeError::Field("ipv6 address")));
    }

    #[test]
    fn link_local_is_the_modified_eui64() {
        assert_eq!(
            link_local([0x02, 0xdc, 10, 0, 0, 2]),
            "fe80::dc:aff:fe00:2".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn messages_round_trip() {
        for m in msgs() {
            let b = m.encode();
            assert!(b.len() <= MAX_MSG);
            assert_eq!(Msg::decode(&b), Ok(m));
        }
    }

    #[test]
    fn every_truncation_and_bad_field_is_refused() {
        for m in msgs() {
            let b = m.encode();
            // a message cut right before its IPv6 trailer is the same message without IPv6
            let v4_only = match &m {
                Msg::Hello(p) if p.ip6.is_some() => b.len() - 17,
                Msg::Channel(c) if c.peer_ip6.is_some() => b.len() - 16,
                _ => usize::MAX,
            };
            for n in (0..b.len()).filter(|&n| n != v4_only) {
                assert!(Msg::decode(&b[..n]).is_err(), "{m:?} cut at {n}");
            }
            let mut long = b.clone();
            long.push(0);
            assert!(Msg::decode(&long).is_err(), "trailing byte");
        }
        let mut h = msgs()[0].encode();
        h[1] = 9;
        assert_eq!(Msg::decode(&h), Err(DecodeError::Type(9)));
        // a type of a newer daemon, of this version: known to be unknown, so it can be skipped
        assert_eq!(
            Msg::decode(&[99, VERSION, 1, 2]),
            Err(DecodeError::Unknown(99))
        );
        let mut h = msgs()[0].encode();
        h[6] = 0; // prefix 0
        assert_eq!(Msg::decode(&h), Err(DecodeError::Field("prefix")));
        let mut h = msgs()[0].encode();
        h[13..17].copy_from_slice(&7u32.to_le_bytes()); // MTU 7
        assert_eq!(Msg::decode(&h), Err(DecodeError::Field("mtu or depth")));
        let mut h = msgs()[0].encode();
        let n = h.len();
        h[n - 1] = b'/';
        assert_eq!(Msg::decode(&h), Err(DecodeError::Field("name")));
        for len in [0u32, 15, crate::services::MAX_TABLE as u32 + 1] {
            assert_eq!(
                Msg::decode(&Msg::Services { len }.encode()),
                Err(DecodeError::Field("services table length"))
            );
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x = 0x9e3779b97f4a7c15u64;
        for n in 0..20000usize {
            let mut b = vec![0u8; n % (MAX_MSG + 8)];
            for v in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x as u8;
            }
            if b.len() >= 2 {
                b[0] = (n % 6) as u8;
                b[1] = VERSION;
            }
            let _ = Msg::decode(&b);
        }
    }
}
