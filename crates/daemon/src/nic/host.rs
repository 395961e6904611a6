//! The host link: a veth pair between the daemon and the node's own kernel, for a node whose
//! pods have no network but DockNet (`docknet daemon --host-link`).
//!
//! The node's end (`NAME`, in the daemon's network namespace) carries [`GATEWAY`] and a /32
//! route to every pipe's address; the daemon drives the other end (`NAME-d`) as its link
//! (AF_PACKET with segment offload). So the node's kernel reaches the pods as it reaches any
//! neighbour (kubelet's probes, `kubectl port-forward`, kube-proxy's NodePort and
//! externalIPs rules), and the pods reach the node and, through its routing and NAT, whatever
//! the node reaches (egress, other nodes): the pods' gateway is the node's end itself.
//!
//! The node's kernel takes nothing in on the daemon's end ([`Guard::all`]): a packet socket is
//! a tap, and with forwarding on (as on any node) the node routed its own copy of every frame
//! it sent to a pipe back out of its end, to the daemon and to itself again, once per hop of
//! its TTL. IPv6 is off there too, so the kernel sends nothing out of it.
//!
//! Everything is made with `ip` and `nft`, as an operator would, and removed when the daemon
//! stops (deleting one end of a veth deletes both, and the routes through it). A link of that
//! name left by a daemon that was killed is replaced at start; one that a running daemon
//! drives is not (`claim`).

use super::guard::{run, Guard};
use super::NicError;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;

pub use docknet_pipe::delivery::GATEWAY;

/// The longest interface name Linux takes (`IFNAMSIZ` - 1), less the `-d` of the daemon's end.
pub const MAX_NAME: usize = 13;

/// The host link, removed when dropped.
#[derive(Debug)]
pub struct HostLink {
    /// The node's end.
    pub name: String,
    /// The daemon's end (the link it drives).
    pub daemon_end: String,
    /// Pipe addresses routed through it now.
    routed: BTreeSet<Ipv4Addr>,
    /// Held while the link is this daemon's ([`claim`]).
    _claim: std::os::unix::net::UnixListener,
    /// Drops everything the node's kernel would take in on the daemon's end.
    _guard: Guard,
}

/// Claims link `name` for this daemon: an abstract Unix socket bound under the link's name.
/// Abstract names live in the network namespace, as link names do, and go with the process
/// that bound them, so a link a killed daemon left can be replaced and one a running daemon
/// drives cannot be taken from it.
fn claim(name: &str) -> Result<std::os::unix::net::UnixListener, String> {
    use std::os::linux::net::SocketAddrExt;
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(format!("docknet/host-link/{name}"))
            .map_err(|e| e.to_string())?;
    std::os::unix::net::UnixListener::bind_addr(&addr).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "another daemon in this network namespace drives host link {name}: give this one \
             another name (--host-link NAME)"
        ),
        _ => format!("claiming host link {name}: {e}"),
    })
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", "iproute2", args)
}

fn sysctl(path: &str, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value} to {path}: {e}"))
}

/// Whether `name` can name the node's end (and `name-d` the daemon's).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(format!(
            "host link name {name:?}: 1 to {MAX_NAME} letters, digits, '-', '_' or '.'"
        ))
    }
}

impl HostLink {
    /// Makes the pair (replacing one of the same name a killed daemon left).
    pub fn create(name: &str) -> Result<HostLink, NicError> {
        check_name(name).map_err(NicError::Setup)?;
        let held = claim(name).map_err(NicError::Setup)?;
        let daemon_end = format!("{name}-d");
        let setup = || -> Result<Guard, String> {
            // a pair a killed daemon left (deleting either end removes both)
            let _ = ip(&["link", "del", name]);
            ip(&[
                "link",
                "add",
                name,
                "type",
                "veth",
                "peer",
                "name",
                &daemon_end,
            ])?;
            sysctl(
                &format!("/proc/sys/net/ipv6/conf/{daemon_end}/disable_ipv6"),
                "1",
            )?;
            let guard = Guard::all(&daemon_end)?;
            ip(&["addr", "add", &format!("{GATEWAY}/32"), "dev", name])?;
            ip(&["link", "set", &daemon_end, "up"])?;
            ip(&["link", "set", name, "up"])?;
            Ok(guard)
        };
        match setup() {
            Ok(guard) => Ok(HostLink {
                name: name.into(),
                daemon_end,
                routed: BTreeSet::new(),
                _claim: held,
                _guard: guard,
            }),
            Err(e) => {
                let _ = ip(&["link", "del", name]);
                Err(NicError::Setup(format!("making the host link {name}: {e}")))
            }
        }
    }

    /// Keeps the node's routes through the link equal to the pipes' addresses: one /32 each.
    /// A route that fails is logged and tried again at the next change.
    pub fn route_pipes(&mut self, ips: impl IntoIterator<Item = Ipv4Addr>) {
        let want: BTreeSet<Ipv4Addr> = ips.into_iter().collect();
        for a in self.routed.difference(&want).copied().collect::<Vec<_>>() {
            if let Err(e) = ip(&["route", "del", &format!("{a}/32"), "dev", &self.name]) {
                tracing::warn!("host link: {e}");
            }
            self.routed.remove(&a);
        }
        for a in want.difference(&self.routed).copied().collect::<Vec<_>>() {
            match ip(&["route", "replace", &format!("{a}/32"), "dev", &self.name]) {
                Ok(()) => {
                    self.routed.insert(a);
                }
                Err(e) => tracing::warn!("host link: {e}"),
            }
        }
    }
}

impl Drop for HostLink {
    fn drop(&mut self) {
        if let Err(e) = ip(&["link", "del", &self.name]) {
            tracing::warn!("removing the host link: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_kernels_limit_with_the_daemons_suffix() {
        assert!(check_name("docknet0").is_ok());
        assert!(check_name("a234567890123").is_ok());
        assert!(check_name("a2345678901234").is_err());
        for bad in ["", ".", "..", "a b", "a/b", "x;y"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_link_name_is_claimed_by_one_daemon_at_a_time() {
        let name = format!("t{}", std::process::id());
        let first = claim(&name).unwrap();
        let again = claim(&name).unwrap_err();
        assert!(again.contains("another daemon"), "{again}");
        drop(first);
        claim(&name).unwrap();
    }
}
