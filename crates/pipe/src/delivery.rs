//! How a region reaches a container: messages on a `SOCK_SEQPACKET` Unix socket, each with at
//! most one file descriptor ([`crate::fdpass`]). The daemon speaks first:
//!
//! ```text
//!  Hello   {pipe: name, ip, prefix, mac, mtu, depth}   + the pipe's memfd
//!  Channel {id, side A|B, mtu, depth, peer name/ip/mac} + the channel's memfd   (0..n)
//!  Synced                                               (the list of channels is complete)
//!  ... later, whenever channels change:
//!  Channel {...} + memfd   |   Closed {id}
//! ```
//!
//! Everything a container needs to use a region comes from these messages, never from the
//! region's shared header: the ring layout is computed from (mtu, depth) by
//! [`crate::layout::plan`] on both sides, and a fast channel's partner is who the daemon says.
//! A header a partner can write is therefore never trusted. The encoding is fixed-size and
//! little-endian; [`Msg::decode`] checks every field.

use std::net::Ipv4Addr;

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
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than its type requires, or longer than [`MAX_MSG`].
    #[error("message of {0} bytes has the wrong length")]
    Length(usize),
    /// Unknown type or version.
    #[error("unknown message type {0} or version")]
    Type(u8),
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
            }
            Msg::Closed { id } => {
                o.extend([T_CLOSED, VERSION]);
                o.extend((*id as u32).to_le_bytes());
                o.extend(((*id >> 32) as u32).to_le_bytes());
            }
            Msg::Synced => o.extend([T_SYNCED, VERSION]),
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
                Msg::Hello(PipeDesc {
                    name: r.name()?,
                    ip,
                    prefix,
                    mac,
                    mtu,
                    depth,
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
                Msg::Channel(ChannelDesc {
                    id,
                    side,
                    mtu,
                    depth,
                    peer: r.name()?,
                    peer_ip,
                    peer_mac,
                })
            }
            T_CLOSED => Msg::Closed { id: r.u64()? },
            T_SYNCED => Msg::Synced,
            t => return Err(DecodeError::Type(t)),
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
            }),
            Msg::Channel(ChannelDesc {
                id: 0x1_0000_0007,
                side: Side::B,
                mtu: 65535,
                depth: 256,
                peer: "db".into(),
                peer_ip: Ipv4Addr::new(10, 0, 0, 3),
                peer_mac: [2, 0xdc, 10, 0, 0, 3],
            }),
            Msg::Closed { id: 7 },
            Msg::Synced,
        ]
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
            for n in 0..b.len() {
                assert!(Msg::decode(&b[..n]).is_err(), "{m:?} cut at {n}");
            }
            let mut long = b.clone();
            long.push(0);
            assert!(Msg::decode(&long).is_err(), "trailing byte");
        }
        let mut h = msgs()[0].encode();
        h[1] = 9;
        assert_eq!(Msg::decode(&h), Err(DecodeError::Type(9)));
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
                b[0] = (n % 5) as u8;
                b[1] = VERSION;
            }
            let _ = Msg::decode(&b);
        }
    }
}
