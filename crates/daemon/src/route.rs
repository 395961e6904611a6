//! Routes to the wire: networks beyond this host reached through a next hop on the link (another
//! node's address), as flannel's host-gw or Calico without BGP do when nodes share a link; or,
//! for nodes that share no link, through a VXLAN tunnel to the other node's address (flannel's
//! vxlan backend: the kernel's wire format, UDP port 4789, see [`crate::nic::vxlan`]).
//!
//! A frame from a pipe to an address no pipe owns leaves through the link. Without a route its
//! destination is its own next hop (one flat subnet, the daemon resolving it by ARP). With a
//! route covering the destination, the daemon resolves and sends to the route's next hop
//! instead; the longest prefix wins. IPv4 only (IPv6 does not go to the wire).
//!
//! Routes come from the operator (the control socket) or the daemon's state file: both are
//! checked here. A table holds at most [`MAX_ROUTES`]; a network must have no host bits set;
//! a next hop must be a unicast address that no route but the default route covers (a next hop
//! is on the link, resolved by ARP, never routed itself). A VXLAN route's next hop is the far
//! end of the tunnel (its VTEP), which may itself lie behind a plain route (the underlay's
//! gateway) but never inside a VXLAN route: tunnels do not nest. A look-up costs one hash probe
//! per prefix length in use.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::Ipv4Addr;

/// Most routes a daemon holds (a cluster of this many nodes, one pod network each).
pub const MAX_ROUTES: usize = 4096;

/// Largest VXLAN network identifier (24 bits).
pub const MAX_VNI: u32 = (1 << 24) - 1;

/// One route: `net/prefix` is reached through `via`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Route {
    /// The network (no host bits set).
    pub net: Ipv4Addr,
    /// Its prefix length, 0-32.
    pub prefix: u8,
    /// The next hop on the link; for a VXLAN route, the tunnel's far end.
    pub via: Ipv4Addr,
    /// Through a VXLAN tunnel with this network identifier (`None`: plain, on the link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vxlan: Option<u32>,
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} via {}", self.net, self.prefix, self.via)?;
        match self.vxlan {
            Some(vni) => write!(f, " vxlan {vni}"),
            None => Ok(()),
        }
    }
}

/// Where a frame for some address goes on the link: [`Routes::next_hop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hop {
    /// The neighbour on the link the frame (or its tunnel's datagram) is sent to.
    pub link: Ipv4Addr,
    /// Encapsulated for this tunnel end with this VNI, when a VXLAN route covered it.
    pub vxlan: Option<(Ipv4Addr, u32)>,
}

/// Why a route was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// Prefix length above 32.
    #[error("prefix length {0} is above 32")]
    Prefix(u8),
    /// The network has host bits set.
    #[error("{net}/{prefix} has host bits set: the network is {canonical}/{prefix}")]
    HostBits {
        /// As given.
        net: Ipv4Addr,
        /// Prefix length.
        prefix: u8,
        /// With the host bits cleared.
        canonical: Ipv4Addr,
    },
    /// The next hop is not a unicast address.
    #[error("next hop {0} is not a unicast address")]
    Via(Ipv4Addr),
    /// The next hop is itself reached through a route.
    #[error("next hop {via} lies inside {route}: a next hop must be on the link itself")]
    Recursive {
        /// The next hop.
        via: Ipv4Addr,
        /// The route covering it.
        route: Route,
    },
    /// A VXLAN network identifier above 24 bits.
    #[error("VXLAN network identifier {0} is above {MAX_VNI}")]
    Vni(u32),
    /// The network is already routed (remove it first).
    #[error("{0} already exists: remove it first")]
    Exists(Route),
    /// No such route.
    #[error("no route to {0}/{1}")]
    Missing(Ipv4Addr, u8),
    /// The table is full.
    #[error("the daemon holds {MAX_ROUTES} routes already")]
    Full,
}

fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// Whether `via` can be a next hop at all (before looking at other routes).
fn unicast(via: Ipv4Addr) -> bool {
    !(via.is_unspecified()
        || via.is_broadcast()
        || via.is_multicast()
        || via.is_loopback()
        || via.octets()[0] >= 240)
}

impl Route {
    /// Checks a route on its own: prefix, host bits, next hop.
    pub fn check(&self) -> Result<(), RouteError> {
        if self.prefix > 32 {
            return Err(RouteError::Prefix(self.prefix));
        }
        let canonical = Ipv4Addr::from(u32::from(self.net) & mask(self.prefix));
        if canonical != self.net {
            return Err(RouteError::HostBits {
                net: self.net,
                prefix: self.prefix,
                canonical,
            });
        }
        if !unicast(self.via) {
            return Err(RouteError::Via(self.via));
        }
        if let Some(vni) = self.vxlan.filter(|&v| v > MAX_VNI) {
            return Err(RouteError::Vni(vni));
        }
        if self.holds_hop(self.via) {
            return Err(RouteError::Recursive {
                via: self.via,
                route: *self,
            });
        }
        Ok(())
    }

    /// Whether `ip` lies inside this route's network.
    pub fn covers(&self, ip: Ipv4Addr) -> bool {
        self.prefix <= 32 && u32::from(ip) & mask(self.prefix) == u32::from(self.net)
    }

    /// Whether this route claims next hop `ip` for itself: it covers it and is not the default
    /// route (which covers every address, the link's too).
    fn holds_hop(&self, ip: Ipv4Addr) -> bool {
        self.prefix > 0 && self.covers(ip)
    }

    /// Whether `self`'s next hop may not lie inside `other`: a plain next hop is on the link,
    /// inside no route; a tunnel's far end may be reached through a plain route, not a tunnel.
    fn refuses_hop_inside(&self, other: &Route) -> bool {
        other.holds_hop(self.via) && (self.vxlan.is_none() || other.vxlan.is_some())
    }
}

/// The routing table: immutable once built, shared with the masters through the snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    /// Every route, sorted (for listing and saving).
    list: Vec<Route>,
    /// Prefix lengths in use, longest first.
    lengths: Vec<u8>,
    /// (masked network, prefix length) -> the route.
    by_net: HashMap<(u32, u8), Route>,
    /// The VXLAN network identifiers in use, sorted (what the link accepts tunnelled).
    vnis: Vec<u32>,
}

impl Routes {
    /// A table of `routes`, each checked on its own and against the others (what a state file
    /// holds is checked again this way on load).
    pub fn new(routes: impl IntoIterator<Item = Route>) -> Result<Routes, RouteError> {
        let mut t = Routes::default();
        for r in routes {
            t = t.with(r)?;
        }
        Ok(t)
    }

    fn build(mut list: Vec<Route>) -> Routes {
        list.sort();
        let by_net: HashMap<(u32, u8), Route> = list
            .iter()
            .map(|r| ((u32::from(r.net), r.prefix), *r))
            .collect();
        let mut lengths: Vec<u8> = list.iter().map(|r| r.prefix).collect();
        lengths.sort_unstable_by(|a, b| b.cmp(a));
        lengths.dedup();
        let mut vnis: Vec<u32> = list.iter().filter_map(|r| r.vxlan).collect();
        vnis.sort_unstable();
        vnis.dedup();
        Routes {
            list,
            lengths,
            by_net,
            vnis,
        }
    }

    /// This table with `r` added.
    pub fn with(&self, r: Route) -> Result<Routes, RouteError> {
        r.check()?;
        if let Some(&old) = self.by_net.get(&(u32::from(r.net), r.prefix)) {
            return Err(RouteError::Exists(old));
        }
        if self.list.len() >= MAX_ROUTES {
            return Err(RouteError::Full);
        }
        // no next hop (old or new) may be reached through a route (old or new), but for a
        // tunnel's far end behind a plain route
        for (hop, route) in self
            .list
            .iter()
            .map(|o| (o, &r))
            .chain(self.list.iter().map(|o| (&r, o)))
        {
            if hop.refuses_hop_inside(route) {
                return Err(RouteError::Recursive {
                    via: hop.via,
                    route: *route,
                });
            }
        }
        let mut list = self.list.clone();
        list.push(r);
        Ok(Routes::build(list))
    }

    /// This table without the route to `net/prefix`.
    pub fn without(&self, net: Ipv4Addr, prefix: u8) -> Result<Routes, RouteError> {
        if self.get(net, prefix).is_none() {
            return Err(RouteError::Missing(net, prefix));
        }
        Ok(Routes::build(
            self.list
                .iter()
                .filter(|r| !(r.net == net && r.prefix == prefix))
                .copied()
                .collect(),
        ))
    }

    /// The longest route covering `dst` (only plain ones with `plain`).
    fn longest(&self, dst: Ipv4Addr, plain: bool) -> Option<&Route> {
        let d = u32::from(dst);
        self.lengths.iter().find_map(|&len| {
            self.by_net
                .get(&(d & mask(len), len))
                .filter(|r| !plain || r.vxlan.is_none())
        })
    }

    /// Where a frame for `dst` goes on the link: the longest matching route's next hop, or
    /// `dst` itself; for a VXLAN route, the tunnel and the neighbour its far end is reached
    /// through (the far end itself, or a plain route's next hop).
    pub fn next_hop(&self, dst: Ipv4Addr) -> Hop {
        let Some(r) = self.longest(dst, false) else {
            return Hop {
                link: dst,
                vxlan: None,
            };
        };
        match r.vxlan {
            None => Hop {
                link: r.via,
                vxlan: None,
            },
            Some(vni) => Hop {
                link: self.longest(r.via, true).map_or(r.via, |p| p.via),
                vxlan: Some((r.via, vni)),
            },
        }
    }

    /// The VXLAN network identifiers the routes use, sorted.
    pub fn vnis(&self) -> &[u32] {
        &self.vnis
    }

    /// The route to exactly `net/prefix`, if there is one.
    pub fn get(&self, net: Ipv4Addr, prefix: u8) -> Option<Route> {
        self.by_net.get(&(u32::from(net), prefix)).copied()
    }

    /// Every route, sorted by network.
    pub fn list(&self) -> &[Route] {
        &self.list
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True without routes.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(net: &str, prefix: u8, via: &str) -> Route {
        Route {
            net: net.parse().unwrap(),
            prefix,
            via: via.parse().unwrap(),
            vxlan: None,
        }
    }

    fn vx(net: &str, prefix: u8, via: &str, vni: u32) -> Route {
        Route {
            vxlan: Some(vni),
            ..r(net, prefix, via)
        }
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn the_longest_prefix_wins_and_unrouted_addresses_are_their_own_next_hop() {
        let t = Routes::new([
            r("10.0.0.0", 8, "192.168.1.1"),
            r("10.1.0.0", 16, "192.168.1.2"),
            r("10.1.2.0", 24, "192.168.1.3"),
            r("0.0.0.0", 0, "192.168.1.254"),
        ])
        .unwrap();
        assert_eq!(t.next_hop(ip("10.1.2.9")).link, ip("192.168.1.3"));
        assert_eq!(t.next_hop(ip("10.1.3.9")).link, ip("192.168.1.2"));
        assert_eq!(t.next_hop(ip("10.200.0.1")).link, ip("192.168.1.1"));
        assert_eq!(t.next_hop(ip("8.8.8.8")).link, ip("192.168.1.254"));
        let empty = Routes::default();
        assert_eq!(empty.next_hop(ip("10.1.2.9")).link, ip("10.1.2.9"));
        // a /32
        let t = t.with(r("10.1.2.7", 32, "192.168.1.4")).unwrap();
        assert_eq!(t.next_hop(ip("10.1.2.7")).link, ip("192.168.1.4"));
        assert_eq!(t.next_hop(ip("10.1.2.8")).link, ip("192.168.1.3"));
        assert_eq!(t.len(), 5);
    }

    #[test]
    fn bad_routes_are_refused_with_the_reason() {
        let t = Routes::default();
        assert_eq!(
            t.with(r("10.1.2.3", 24, "192.168.1.1")),
            Err(RouteError::HostBits {
                net: ip("10.1.2.3"),
                prefix: 24,
                canonical: ip("10.1.2.0")
            })
        );
        assert_eq!(
            t.with(r("10.1.2.0", 33, "192.168.1.1")),
            Err(RouteError::Prefix(33))
        );
        for via in [
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "127.0.0.1",
            "240.0.0.1",
        ] {
            assert_eq!(
                t.with(r("10.1.2.0", 24, via)),
                Err(RouteError::Via(ip(via))),
                "{via}"
            );
        }
        // the next hop inside the route's own network
        assert!(matches!(
            t.with(r("10.1.2.0", 24, "10.1.2.1")),
            Err(RouteError::Recursive { .. })
        ));
        let t = t.with(r("10.1.2.0", 24, "192.168.1.1")).unwrap();
        assert!(matches!(
            t.with(r("10.1.2.0", 24, "192.168.1.2")),
            Err(RouteError::Exists(_))
        ));
        // a next hop reached through another route, either way round
        assert!(matches!(
            t.with(r("10.9.0.0", 16, "10.1.2.5")),
            Err(RouteError::Recursive { .. })
        ));
        assert!(matches!(
            t.with(r("192.168.0.0", 16, "172.16.0.1")),
            Err(RouteError::Recursive { .. })
        ));
        assert_eq!(
            t.without(ip("10.1.3.0"), 24),
            Err(RouteError::Missing(ip("10.1.3.0"), 24))
        );
        // refusals changed nothing
        assert_eq!(t.list(), &[r("10.1.2.0", 24, "192.168.1.1")]);
        let t = t.without(ip("10.1.2.0"), 24).unwrap();
        assert!(t.is_empty());
        assert_eq!(t.next_hop(ip("10.1.2.9")).link, ip("10.1.2.9"));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = Routes::default();
        for i in 0..MAX_ROUTES as u32 {
            let net = Ipv4Addr::from(0x0a00_0000 | (i << 8));
            t = t
                .with(Route {
                    net,
                    prefix: 24,
                    via: ip("192.168.1.1"),
                    vxlan: None,
                })
                .unwrap();
        }
        assert_eq!(
            t.with(r("172.16.0.0", 16, "192.168.1.1")),
            Err(RouteError::Full)
        );
        assert_eq!(t.next_hop(ip("10.0.5.1")).link, ip("192.168.1.1"));
    }

    #[test]
    fn a_vxlan_route_tunnels_to_its_far_end_reached_on_the_link_or_through_a_plain_route() {
        let t = Routes::new([
            vx("10.244.2.0", 24, "172.16.5.2", 7),
            r("172.16.0.0", 16, "192.168.1.254"),
            r("10.244.3.0", 24, "192.168.1.3"),
            vx("10.244.4.0", 24, "192.168.1.4", 7),
            vx("10.244.5.0", 24, "192.168.1.5", 9),
        ])
        .unwrap();
        // the far end behind the underlay's gateway
        assert_eq!(
            t.next_hop(ip("10.244.2.9")),
            Hop {
                link: ip("192.168.1.254"),
                vxlan: Some((ip("172.16.5.2"), 7))
            }
        );
        // the far end on the link
        assert_eq!(
            t.next_hop(ip("10.244.4.9")),
            Hop {
                link: ip("192.168.1.4"),
                vxlan: Some((ip("192.168.1.4"), 7))
            }
        );
        assert_eq!(
            t.next_hop(ip("10.244.3.9")),
            Hop {
                link: ip("192.168.1.3"),
                vxlan: None
            }
        );
        assert_eq!(t.vnis(), &[7, 9]);
        assert_eq!(
            t.get(ip("10.244.2.0"), 24).unwrap().to_string(),
            "10.244.2.0/24 via 172.16.5.2 vxlan 7"
        );
        // tunnels do not nest, and a plain next hop is never tunnelled
        assert!(matches!(
            t.with(vx("10.50.0.0", 16, "10.244.2.7", 1)),
            Err(RouteError::Recursive { .. })
        ));
        assert!(matches!(
            t.with(r("10.50.0.0", 16, "10.244.4.7")),
            Err(RouteError::Recursive { .. })
        ));
        assert!(matches!(
            t.with(vx("10.60.0.0", 16, "10.60.0.1", 1)),
            Err(RouteError::Recursive { .. })
        ));
        assert_eq!(
            t.with(vx("10.70.0.0", 16, "192.168.1.7", MAX_VNI + 1)),
            Err(RouteError::Vni(MAX_VNI + 1))
        );
        let json = serde_json::to_string(t.list()).unwrap();
        assert!(json.contains(r#""vxlan":7"#), "{json}");
        // a plain route saves as before (no vxlan field)
        assert!(
            json.contains(r#"{"net":"10.244.3.0","prefix":24,"via":"192.168.1.3"}"#),
            "{json}"
        );
        let t = t.without(ip("10.244.5.0"), 24).unwrap();
        assert_eq!(t.vnis(), &[7]);
    }
}
