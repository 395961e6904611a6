//! Services: virtual addresses balanced over backends, as the daemon hands them to containers.
//!
//! The daemon keeps a table of services (a virtual IPv4 address and port, TCP or UDP, and the
//! backends that serve it: Kubernetes' ClusterIP Services) and sends every container a copy as a
//! sealed memfd ([`crate::delivery::Msg::Services`]) whenever it changes. DockLib looks a
//! connect's destination up in its copy and connects to a backend instead (socket-level load
//! balancing, as Cilium's kube-proxy replacement does in eBPF): no frame to a virtual address
//! ever leaves the container, so nothing on the frame path translates addresses, and a fast
//! channel to the chosen backend carries the connection like any other.
//!
//! ```text
//!  offset 0   magic "DNSVC\0\0\x01" (8 bytes)   8 count u32   12 reserved u32 (0)
//!  16         count × service:
//!               vip u32 (network order)  port u16 LE  proto u8 (6 TCP, 17 UDP)
//!               affinity u8 (0 none, 1 client IP)  backends u16 LE  reserved u16 (0)
//!               backends × {ip u32 (network order), port u16 LE, reserved u16 (0)}
//! ```
//!
//! [`Table::decode`] checks every field and the bounds below; an entry that does not hold
//! refuses the whole table (the previous copy stays in use).

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};

/// First bytes of a table.
pub const MAGIC: [u8; 8] = *b"DNSVC\0\0\x01";
/// Most services a table holds.
pub const MAX_SERVICES: usize = 4096;
/// Most backends one service has.
pub const MAX_BACKENDS: usize = 1024;
/// Most backends of all services together.
pub const MAX_TOTAL_BACKENDS: usize = 65536;
/// Largest table in bytes (what the bounds above allow).
pub const MAX_TABLE: usize = HEADER + MAX_SERVICES * ENTRY + MAX_TOTAL_BACKENDS * BACKEND;

const HEADER: usize = 16;
const ENTRY: usize = 12;
const BACKEND: usize = 8;

/// A service's transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// TCP: connects are balanced.
    Tcp,
    /// UDP: connected sockets and datagrams sent to the service are balanced.
    Udp,
}

impl Proto {
    fn code(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
        }
    }
}

impl std::fmt::Display for Proto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        })
    }
}

/// How a client's connections spread over the backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Affinity {
    /// Each connection to any backend (chosen at random).
    #[default]
    None,
    /// Every connection of one client address to one backend (Kubernetes' `ClientIP`), chosen
    /// by rendezvous hashing: removing a backend moves only the clients that were on it.
    ClientIp,
}

/// One service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Its virtual address.
    pub vip: Ipv4Addr,
    /// Its port.
    pub port: u16,
    /// TCP or UDP.
    pub proto: Proto,
    /// How connections spread.
    pub affinity: Affinity,
    /// The ready backends (none: connects are refused).
    pub backends: Vec<SocketAddrV4>,
}

/// Why a table was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// Not a table, or cut short, or with bytes after its last entry.
    #[error("services table: bad length or magic")]
    Format,
    /// More than the bounds allow.
    #[error("services table: more than {MAX_SERVICES} services or too many backends")]
    TooLarge,
    /// A field out of range.
    #[error("services table: {0} out of range")]
    Field(&'static str),
    /// Two entries for one address, port and protocol.
    #[error("services table: {0} appears twice")]
    Duplicate(String),
}

/// Whether `a` may be a service's or a backend's address (or a gateway's, or where a gateway
/// takes frames): a unicast address outside `0.0.0.0/8` and loopback, and not the limited
/// broadcast.
pub fn usable(a: Ipv4Addr) -> bool {
    !(a.octets()[0] == 0 || a.is_loopback() || a.is_multicast() || a.is_broadcast())
}

/// A decoded table, looked up by (address, port, protocol).
#[derive(Debug, Clone, Default)]
pub struct Table {
    map: HashMap<(Ipv4Addr, u16, Proto), Service>,
    addrs: std::collections::HashSet<Ipv4Addr>,
}

impl Table {
    /// The bytes of a table of `services` (the caller has checked them; see [`Table::decode`]).
    pub fn encode(services: &[Service]) -> Vec<u8> {
        let n: usize = services.iter().map(|s| s.backends.len()).sum();
        let mut o = Vec::with_capacity(HEADER + services.len() * ENTRY + n * BACKEND);
        o.extend(MAGIC);
        o.extend((services.len() as u32).to_le_bytes());
        o.extend(0u32.to_le_bytes());
        for s in services {
            o.extend(s.vip.octets());
            o.extend(s.port.to_le_bytes());
            o.push(s.proto.code());
            o.push(match s.affinity {
                Affinity::None => 0,
                Affinity::ClientIp => 1,
            });
            o.extend((s.backends.len() as u16).to_le_bytes());
            o.extend(0u16.to_le_bytes());
            for b in &s.backends {
                o.extend(b.ip().octets());
                o.extend(b.port().to_le_bytes());
                o.extend(0u16.to_le_bytes());
            }
        }
        o
    }

    /// Parses and checks a table.
    pub fn decode(b: &[u8]) -> Result<Table, TableError> {
        if b.len() < HEADER || b.len() > MAX_TABLE || b[..8] != MAGIC {
            return Err(TableError::Format);
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let ip_at = |i: usize| Ipv4Addr::new(b[i], b[i + 1], b[i + 2], b[i + 3]);
        let count = u32_at(8) as usize;
        if count > MAX_SERVICES {
            return Err(TableError::TooLarge);
        }
        if u32_at(12) != 0 {
            return Err(TableError::Field("reserved"));
        }
        let (mut at, mut total) = (HEADER, 0usize);
        let mut map = HashMap::with_capacity(count);
        for _ in 0..count {
            if b.len() < at + ENTRY {
                return Err(TableError::Format);
            }
            let vip = ip_at(at);
            let port = u16_at(at + 4);
            let proto = match b[at + 6] {
                6 => Proto::Tcp,
                17 => Proto::Udp,
                _ => return Err(TableError::Field("protocol")),
            };
            let affinity = match b[at + 7] {
                0 => Affinity::None,
                1 => Affinity::ClientIp,
                _ => return Err(TableError::Field("affinity")),
            };
            let n = u16_at(at + 8) as usize;
            if !usable(vip) {
                return Err(TableError::Field("service address"));
            }
            if port == 0 {
                return Err(TableError::Field("service port"));
            }
            if u16_at(at + 10) != 0 {
                return Err(TableError::Field("reserved"));
            }
            total += n;
            if n > MAX_BACKENDS || total > MAX_TOTAL_BACKENDS {
                return Err(TableError::TooLarge);
            }
            at += ENTRY;
            if b.len() < at + n * BACKEND {
                return Err(TableError::Format);
            }
            let mut backends = Vec::with_capacity(n);
            for k in 0..n {
                let e = at + k * BACKEND;
                let (ip, p) = (ip_at(e), u16_at(e + 4));
                if !usable(ip) || p == 0 || u16_at(e + 6) != 0 {
                    return Err(TableError::Field("backend"));
                }
                backends.push(SocketAddrV4::new(ip, p));
            }
            at += n * BACKEND;
            let s = Service {
                vip,
                port,
                proto,
                affinity,
                backends,
            };
            if map.insert((vip, port, proto), s).is_some() {
                return Err(TableError::Duplicate(format!("{proto} {vip}:{port}")));
            }
        }
        if at != b.len() {
            return Err(TableError::Format);
        }
        let addrs = map.keys().map(|k| k.0).collect();
        Ok(Table { map, addrs })
    }

    /// Whether `a` is any service's address.
    pub fn has_address(&self, a: Ipv4Addr) -> bool {
        !self.addrs.is_empty() && self.addrs.contains(&a)
    }

    /// The service at `vip`:`port` over `proto`, if there is one.
    pub fn get(&self, vip: Ipv4Addr, port: u16, proto: Proto) -> Option<&Service> {
        if self.map.is_empty() {
            return None;
        }
        self.map.get(&(vip, port, proto))
    }

    /// Every service, in no particular order.
    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.map.values()
    }

    /// Number of services.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the table has no service.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// A sealed memfd holding `bytes`: nobody, the daemon included, can change it, so every
/// container that receives it reads the same table.
pub fn sealed(bytes: &[u8]) -> io::Result<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MFdFlags};
    use std::io::Write;
    let noexec = MFdFlags::from_bits_retain(0x0008); // MFD_NOEXEC_SEAL (kernels from 6.3)
    let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
    let name = "docknet-services";
    let fd = memfd_create(name, flags | noexec).or_else(|_| memfd_create(name, flags))?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)?;
    let fd = OwnedFd::from(f);
    let seals = SealFlag::F_SEAL_WRITE
        | SealFlag::F_SEAL_SHRINK
        | SealFlag::F_SEAL_GROW
        | SealFlag::F_SEAL_SEAL;
    fcntl(&fd, FcntlArg::F_ADD_SEALS(seals))?;
    Ok(fd)
}

/// Reads and checks the table in a memfd of `len` bytes received from the daemon: it must be
/// sealed against writing, shrinking and growing, and `len` bytes long.
pub fn read_sealed(fd: impl AsFd, len: usize) -> io::Result<Table> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use std::os::unix::fs::FileExt;
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
    let fd = fd.as_fd();
    let seals = SealFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GET_SEALS)?);
    if !seals.contains(SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW) {
        return Err(bad("services table is not sealed".into()));
    }
    let size = nix::sys::stat::fstat(fd)?.st_size;
    if len > MAX_TABLE || usize::try_from(size).ok() != Some(len) {
        return Err(bad(format!(
            "services table of {size} bytes, {len} announced"
        )));
    }
    let mut b = vec![0u8; len];
    std::fs::File::from(fd.try_clone_to_owned()?).read_exact_at(&mut b, 0)?;
    Table::decode(&b).map_err(|e| bad(e.to_string()))
}

/// A 64-bit mix (SplitMix64's finaliser): spreads nearby inputs apart.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Service {
    /// The backend a new connection from `client` goes to: with [`Affinity::ClientIp`] the one
    /// rendezvous hashing gives `client`, else the one `random` picks. `None` when the service
    /// has no backend.
    pub fn pick(&self, client: Ipv4Addr, random: u64) -> Option<SocketAddrV4> {
        match self.affinity {
            Affinity::None => {
                let n = self.backends.len() as u64;
                (n > 0).then(|| self.backends[(mix(random) % n) as usize])
            }
            Affinity::ClientIp => {
                let c = u64::from(u32::from(client)) << 16;
                self.backends.iter().copied().max_by_key(|b| {
                    let key = u64::from(u32::from(*b.ip())) << 16 | u64::from(b.port());
                    mix(c ^ mix(key))
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_addresses_are_unicast_outside_0_8_and_loopback() {
        assert!(usable(Ipv4Addr::new(8, 8, 8, 8)));
        assert!(usable(Ipv4Addr::new(169, 254, 1, 1)));
        assert!(!usable(Ipv4Addr::LOCALHOST));
        assert!(!usable(Ipv4Addr::UNSPECIFIED));
        assert!(!usable(Ipv4Addr::new(0, 1, 2, 3)));
        assert!(!usable(Ipv4Addr::new(224, 0, 0, 1)));
        assert!(!usable(Ipv4Addr::BROADCAST));
    }

    fn svc(vip: [u8; 4], port: u16, proto: Proto, n: u8) -> Service {
        Service {
            vip: vip.into(),
            port,
            proto,
            affinity: Affinity::None,
            backends: (1..=n)
                .map(|k| SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, k), 8000 + u16::from(k)))
                .collect(),
        }
    }

    fn sample() -> Vec<Service> {
        let mut a = svc([10, 96, 0, 10], 53, Proto::Udp, 2);
        a.affinity = Affinity::ClientIp;
        vec![
            svc([10, 96, 0, 1], 80, Proto::Tcp, 3),
            a,
            svc([10, 96, 0, 10], 53, Proto::Tcp, 2),
            svc([10, 96, 0, 2], 443, Proto::Tcp, 0),
        ]
    }

    #[test]
    fn a_table_round_trips_and_is_looked_up_by_address_port_and_protocol() {
        let s = sample();
        let t = Table::decode(&Table::encode(&s)).unwrap();
        assert_eq!(t.len(), 4);
        for x in &s {
            assert_eq!(t.get(x.vip, x.port, x.proto), Some(x));
        }
        assert!(t.get([10, 96, 0, 1].into(), 81, Proto::Tcp).is_none());
        assert!(t.get([10, 96, 0, 1].into(), 80, Proto::Udp).is_none());
        assert!(t.has_address([10, 96, 0, 10].into()));
        assert!(!t.has_address([10, 96, 0, 11].into()));
        let empty = Table::decode(&Table::encode(&[])).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn every_truncation_and_bad_field_is_refused() {
        let b = Table::encode(&sample());
        for n in 0..b.len() {
            assert!(Table::decode(&b[..n]).is_err(), "cut at {n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(Table::decode(&long).unwrap_err(), TableError::Format);
        let field = |at: usize, v: u8| {
            let mut c = b.clone();
            c[at] = v;
            Table::decode(&c).unwrap_err()
        };
        assert_eq!(field(0, b'X'), TableError::Format);
        assert_eq!(field(12, 1), TableError::Field("reserved"));
        assert_eq!(field(16, 127), TableError::Field("service address"));
        assert_eq!(field(16, 224), TableError::Field("service address"));
        assert_eq!(field(22, 1), TableError::Field("protocol"));
        assert_eq!(field(23, 2), TableError::Field("affinity"));
        assert_eq!(field(28, 0), TableError::Field("backend"));
        let mut c = b.clone();
        c[20..22].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(
            Table::decode(&c).unwrap_err(),
            TableError::Field("service port")
        );
        let mut c = b.clone();
        c[8..12].copy_from_slice(&(MAX_SERVICES as u32 + 1).to_le_bytes());
        assert_eq!(Table::decode(&c).unwrap_err(), TableError::TooLarge);
        let dup = Table::encode(&[sample()[0].clone(), sample()[0].clone()]);
        assert!(matches!(Table::decode(&dup), Err(TableError::Duplicate(_))));
        let big = svc([10, 96, 0, 3], 80, Proto::Tcp, 0);
        let mut big = big.clone();
        big.backends = vec![SocketAddrV4::new([10, 0, 0, 1].into(), 1); MAX_BACKENDS + 1];
        assert_eq!(
            Table::decode(&Table::encode(&[big])).unwrap_err(),
            TableError::TooLarge
        );
    }

    #[test]
    fn a_sealed_table_reads_back_and_an_unsealed_or_misannounced_one_does_not() {
        let b = Table::encode(&sample());
        let fd = sealed(&b).unwrap();
        assert_eq!(read_sealed(&fd, b.len()).unwrap().len(), 4);
        assert!(read_sealed(&fd, b.len() - 1).is_err());
        // the daemon cannot change a table it sent
        let f = std::fs::File::from(fd.try_clone().unwrap());
        assert!(std::os::unix::fs::FileExt::write_at(&f, b"X", 0).is_err());
        let open =
            nix::sys::memfd::memfd_create("t", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
        let mut o = std::fs::File::from(open);
        std::io::Write::write_all(&mut o, &b).unwrap();
        assert!(read_sealed(&o, b.len()).is_err(), "not sealed");
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let good = Table::encode(&sample());
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for n in 0..20000usize {
            let mut b = good.clone();
            for _ in 0..1 + n % 4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x as usize) % b.len();
                b[at] = (x >> 32) as u8;
            }
            b.truncate(b.len() - n % 3);
            let _ = Table::decode(&b);
        }
    }

    #[test]
    fn picks_spread_over_every_backend_and_stay_within_them() {
        let s = svc([10, 96, 0, 1], 80, Proto::Tcp, 3);
        let mut seen = HashMap::new();
        for r in 0..3000u64 {
            let b = s.pick([10, 1, 0, 2].into(), r).unwrap();
            assert!(s.backends.contains(&b));
            *seen.entry(b).or_insert(0) += 1;
        }
        assert_eq!(seen.len(), 3);
        assert!(seen.values().all(|&n| n > 800), "{seen:?}");
        assert_eq!(
            svc([10, 96, 0, 1], 80, Proto::Tcp, 0).pick([10, 1, 0, 2].into(), 1),
            None
        );
    }

    #[test]
    fn client_affinity_keeps_a_client_on_one_backend_and_moves_only_those_of_a_removed_one() {
        let mut s = svc([10, 96, 0, 1], 80, Proto::Tcp, 4);
        s.affinity = Affinity::ClientIp;
        let clients: Vec<Ipv4Addr> = (0..200u32)
            .map(|k| Ipv4Addr::from(0x0a01_0000 + k))
            .collect();
        let before: Vec<_> = clients.iter().map(|c| s.pick(*c, 1).unwrap()).collect();
        for (c, b) in clients.iter().zip(&before) {
            assert_eq!(s.pick(*c, 99).unwrap(), *b, "one client, one backend");
        }
        let used: std::collections::HashSet<_> = before.iter().collect();
        assert_eq!(used.len(), 4, "clients spread over all backends");
        let gone = s.backends.remove(1);
        for (c, b) in clients.iter().zip(&before) {
            let now = s.pick(*c, 1).unwrap();
            if *b != gone {
                assert_eq!(now, *b, "a client of a backend that stayed keeps it");
            } else {
                assert_ne!(now, gone);
            }
        }
    }
}
