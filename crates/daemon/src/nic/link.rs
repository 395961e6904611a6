//! What the daemon needs to know about the link it drives, asked of the kernel by interface
//! name in the daemon's own network namespace (ioctls on a datagram socket; not sysfs, which
//! shows whatever namespace it was mounted in).

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A link's facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// Interface name.
    pub name: String,
    /// Interface index.
    pub index: u32,
    /// Hardware address.
    pub mac: [u8; 6],
    /// MTU.
    pub mtu: u32,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Carrier present (IFF_RUNNING).
    pub running: bool,
    /// Receive queues (ethtool channels; 1 where the driver does not say).
    pub rx_queues: u32,
    /// The link's (primary) IPv4 address, if it has one: where VXLAN tunnels start and end.
    pub ipv4: Option<std::net::Ipv4Addr>,
}

/// Why a link cannot be used, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// No such interface in this network namespace.
    #[error("link {0} does not exist in the daemon's network namespace (see `ip link`)")]
    Missing(String),
    /// The interface is down.
    #[error("link {0} is down: bring it up first (`ip link set {0} up`)")]
    Down(String),
    /// Not an Ethernet link.
    #[error("link {0} is not an Ethernet link")]
    NotEthernet(String),
    /// Another failure.
    #[error("link {name}: {what}: {source}")]
    Io {
        /// Interface.
        name: String,
        /// What was asked.
        what: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    r
}

fn ioctl(fd: &OwnedFd, req: libc::c_ulong, r: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: `r` is a valid, writable ifreq for the whole call; the requests used here read
    // and write only within it (or, for SIOCETHTOOL, within the buffer its data points at,
    // which the caller keeps alive).
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, r as *mut libc::ifreq) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// ETHTOOL_GCHANNELS's argument (linux/ethtool.h).
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}
const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// Brings link `name` of this network namespace up (what `ip link set NAME up` does, without
/// starting a program).
pub fn set_up(name: &str) -> io::Result<()> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad link name"));
    }
    // SAFETY: plain socket(2); the result is checked before it is owned.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut r = ifreq(name);
    ioctl(&fd, libc::SIOCGIFFLAGS, &mut r)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe { r.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    ioctl(&fd, libc::SIOCSIFFLAGS, &mut r)
}

impl LinkInfo {
    /// Reads `name`'s facts; refuses a link that is missing, down or not Ethernet.
    pub fn read(name: &str) -> Result<LinkInfo, LinkError> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('/') {
            return Err(LinkError::Missing(name.into()));
        }
        let err = |what| {
            let name = name.to_string();
            move |source| LinkError::Io { name, what, source }
        };
        let index =
            nix::net::if_::if_nametoindex(name).map_err(|_| LinkError::Missing(name.into()))?;
        // SAFETY: plain socket(2); the result is checked before it is owned.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(err("opening a socket")(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let mut r = ifreq(name);
        ioctl(&fd, libc::SIOCGIFFLAGS, &mut r).map_err(err("reading flags"))?;
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        let flags = i32::from(unsafe { r.ifr_ifru.ifru_flags });
        let mut r = ifreq(name);
        ioctl(&fd, libc::SIOCGIFMTU, &mut r).map_err(err("reading the MTU"))?;
        // SAFETY: SIOCGIFMTU filled the mtu member.
        let mtu = unsafe { r.ifr_ifru.ifru_mtu } as u32;
        let mut r = ifreq(name);
        ioctl(&fd, libc::SIOCGIFHWADDR, &mut r).map_err(err("reading the MAC"))?;
        // SAFETY: SIOCGIFHWADDR filled the hwaddr member.
        let hw = unsafe { r.ifr_ifru.ifru_hwaddr };
        if hw.sa_family != libc::ARPHRD_ETHER {
            return Err(LinkError::NotEthernet(name.into()));
        }
        let mut mac = [0u8; 6];
        for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
            *d = *s as u8;
        }
        let mut ch = EthtoolChannels {
            cmd: ETHTOOL_GCHANNELS,
            ..Default::default()
        };
        let mut r = ifreq(name);
        r.ifr_ifru.ifru_data = (&mut ch as *mut EthtoolChannels).cast();
        let rx_queues = match ioctl(&fd, libc::SIOCETHTOOL, &mut r) {
            Ok(()) => ch.rx_count.max(ch.combined_count).max(1),
            Err(_) => 1,
        };
        let mut r = ifreq(name);
        let ipv4 = match ioctl(&fd, libc::SIOCGIFADDR, &mut r) {
            Ok(()) => {
                // SAFETY: SIOCGIFADDR filled the addr member.
                let a = unsafe { r.ifr_ifru.ifru_addr };
                // AF_INET: a port's two bytes, then the address
                let d = a.sa_data.map(|b| b as u8);
                (a.sa_family == libc::AF_INET as libc::sa_family_t)
                    .then(|| std::net::Ipv4Addr::new(d[2], d[3], d[4], d[5]))
            }
            Err(_) => None,
        };
        let info = LinkInfo {
            ipv4,
            name: name.into(),
            index,
            mac,
            mtu,
            up: flags & libc::IFF_UP != 0,
            running: flags & libc::IFF_RUNNING != 0,
            rx_queues,
        };
        if !info.up {
            return Err(LinkError::Down(name.into()));
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_not_ethernet_and_nonsense_is_missing() {
        assert!(matches!(
            LinkInfo::read("lo"),
            Err(LinkError::NotEthernet(_)) | Err(LinkError::Down(_))
        ));
        let e = LinkInfo::read("no-such-link0").unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        assert!(LinkInfo::read("").is_err());
        assert!(LinkInfo::read("a-name-far-too-long-for-a-link").is_err());
    }
}
