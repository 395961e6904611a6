//! Kernel network modes, one function each, built only inside namespaces this process creates
//! and removed on drop (deleting a namespace removes its links).
//!
//! The container-facing parts of `bridge`, `bridge-nat`, `container`, `macvlan` and `ipvlan`
//! are built the way a container runtime builds them: by the reference CNI plugins
//! ([`super::cni`]). `loopback` and the direct `veth` pair have no plugin that fits (`ptp`
//! routes through the host) and are built with `ip`; `ovs` with `ovs-vsctl`
//! ([`super::ovs`]).

use super::cni::{first_address, first_address6, Cni, Range, GATEWAY};
use super::ovs::Ovs;
use super::tunnel::{Tunnel, TUNNEL_A, TUNNEL_B, TUNNEL_DEV};
use super::wire::{Shape, Wire, HOST_A, HOST_B, WIRE_DEV};
use crate::mode::{Builder, Mode, LO_MTU};
use crate::proc::{checked, ip, unique};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::process::Command;

/// First TCP port of the pairs: pair `i` serves on `PORT_BASE + i` (also the mapped host port
/// in `bridge-nat`).
pub const PORT_BASE: u16 = 20000;

/// One client/server pair of a topology.
#[derive(Debug, Clone)]
pub struct Pair {
    /// Namespace of the client.
    pub client_ns: String,
    /// Namespace of the server (the client's in `loopback` and `container`).
    pub server_ns: String,
    /// Address the client connects to (the server's, or the host's mapped port for NAT).
    pub target: String,
    /// Address the server binds.
    pub bind: String,
    /// TCP port of this pair.
    pub port: u16,
    /// The server's IPv6 address (bind and target), where the lab gave it one (`--ipv6`:
    /// `::1` on `lo`, and the veth and bridge modes built with IPv6).
    pub target6: Option<String>,
}

/// A kernel container network between client and server namespaces.
#[derive(Debug)]
pub struct KernelLab {
    /// The mode built.
    pub mode: Mode,
    /// All namespaces created, in creation order.
    pub namespaces: Vec<String>,
    /// The pairs (at least one).
    pub pairs: Vec<Pair>,
    /// MTU of the links, or of `lo` where traffic crosses only `lo`.
    pub mtu: u32,
    cnis: Vec<Cni>,
    ovs: Option<Ovs>,
    /// Two hosts: the hosts and the wire (removed after the containers).
    pub wire: Option<Wire>,
    /// `vxlan-openvpn`: the encrypted tunnel between the hosts (removed first).
    tunnel: Option<Tunnel>,
    /// Give the veth and bridge modes IPv6 addresses too (duplicate address detection off in
    /// the lab's namespaces, so the addresses are usable at once).
    ipv6: bool,
}

/// Address of A in the direct `veth` topology.
pub const VETH_A: &str = "10.66.0.1";
/// Address of B in the direct `veth` topology.
pub const VETH_B: &str = "10.66.0.2";
/// IPv6 address of A in the direct `veth` topology (`--ipv6`).
pub const VETH_A6: &str = "fd00:66::1";
/// IPv6 address of B in the direct `veth` topology (`--ipv6`).
pub const VETH_B6: &str = "fd00:66::2";
/// The lab's IPv6 subnet for the bridge (`--ipv6`; host-local hands out addresses from it).
pub const SUBNET6: &str = "fd00:66::/64";

fn port(i: usize) -> u16 {
    PORT_BASE + i as u16
}

impl KernelLab {
    /// Builds `mode` with `pairs` client/server pairs at `mtu`; on error, removes whatever was
    /// built.
    pub fn build(mode: Mode, pairs: usize, mtu: u32) -> Result<KernelLab> {
        Self::build_with(mode, pairs, mtu, false)
    }

    /// [`KernelLab::build`]; with `ipv6`, the veth and bridge modes get IPv6 addresses beside
    /// their IPv4 ones ([`Pair::target6`]).
    pub fn build_with(mode: Mode, pairs: usize, mtu: u32, ipv6: bool) -> Result<KernelLab> {
        if !mode.is_kernel() {
            bail!("{mode} is not a kernel mode the lab can build");
        }
        if pairs == 0 || pairs > 1000 {
            bail!("pairs must be 1 ..= 1000");
        }
        let base = unique("");
        let mut lab = KernelLab {
            mode,
            namespaces: Vec::new(),
            pairs: Vec::new(),
            mtu,
            cnis: Vec::new(),
            ovs: None,
            wire: None,
            tunnel: None,
            ipv6,
        };
        match mode {
            Mode::Loopback => lab.loopback(&base, pairs)?,
            Mode::Veth => lab.veth(&base, pairs)?,
            Mode::Ovs => lab.ovs(&base, pairs)?,
            Mode::Container => lab.container(&base, pairs)?,
            Mode::Bridge | Mode::BridgeNat => lab.bridge(&base, pairs, mode == Mode::BridgeNat)?,
            Mode::Macvlan | Mode::Ipvlan => lab.vlan(&base, pairs)?,
            _ => unreachable!("checked above"),
        }
        Ok(lab)
    }

    /// How the container links were built.
    pub fn builder(&self) -> Builder {
        self.mode.builder()
    }

    /// Chains one more CNI plugin onto container `ns`'s attachment (e.g. `bandwidth`).
    pub fn chain(&mut self, ns: &str, conf: &Value) -> Result<Value> {
        match self.cnis.iter_mut().find(|c| c.has(ns)) {
            Some(c) => c.add_more(ns, conf),
            None => bail!("{ns} was not attached with CNI"),
        }
    }

    /// Removes the plugin [`KernelLab::chain`] added last on `ns`.
    pub fn unchain(&mut self, ns: &str) -> Result<()> {
        match self.cnis.iter_mut().find(|c| c.has(ns)) {
            Some(c) => c.del_last(ns),
            None => bail!("{ns} was not attached with CNI"),
        }
    }

    fn addns(&mut self, ns: &str) -> Result<()> {
        ip(&["netns", "add", ns])?;
        self.namespaces.push(ns.to_string());
        if self.ipv6 {
            // links made here from now on skip duplicate address detection: their IPv6
            // addresses are usable at once (the lab hands out unique ones)
            checked(
                Command::new("ip").args([
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-qw",
                    "net.ipv6.conf.all.accept_dad=0",
                    "net.ipv6.conf.default.accept_dad=0",
                ]),
                "sysctl in the lab's namespace (apt-get install procps)",
            )?;
        }
        ip(&["-n", ns, "link", "set", "lo", "up"])
    }

    /// `loopback`: one namespace, every pair on its `lo`.
    fn loopback(&mut self, base: &str, pairs: usize) -> Result<()> {
        let ns = format!("{base}a");
        self.addns(&ns)?;
        self.mtu = LO_MTU;
        for i in 0..pairs {
            self.pairs.push(Pair {
                client_ns: ns.clone(),
                server_ns: ns.clone(),
                target: "127.0.0.1".into(),
                bind: "127.0.0.1".into(),
                port: port(i),
                target6: Some("::1".into()),
            });
        }
        Ok(())
    }

    /// `veth`: a veth pair straight between client and server.
    fn veth(&mut self, base: &str, pairs: usize) -> Result<()> {
        let mtu = self.mtu.to_string();
        for i in 0..pairs {
            let (a, b) = (format!("{base}a{i}"), format!("{base}b{i}"));
            self.addns(&a)?;
            self.addns(&b)?;
            ip(&[
                "-n", &a, "link", "add", "eth0", "mtu", &mtu, "type", "veth", "peer", "name",
                "eth0", "mtu", &mtu, "netns", &b,
            ])?;
            for (ns, ip4, ip6) in [(&a, VETH_A, VETH_A6), (&b, VETH_B, VETH_B6)] {
                ip(&["-n", ns, "addr", "add", &format!("{ip4}/24"), "dev", "eth0"])?;
                if self.ipv6 {
                    let a6 = format!("{ip6}/64");
                    ip(&["-n", ns, "addr", "add", &a6, "dev", "eth0", "nodad"])?;
                }
                ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            }
            self.pairs.push(Pair {
                client_ns: a,
                server_ns: b,
                target: VETH_B.into(),
                bind: VETH_B.into(),
                port: port(i),
                target6: self.ipv6.then(|| VETH_B6.into()),
            });
        }
        Ok(())
    }

    /// `ovs`: veth pairs from each container to an Open vSwitch bridge with the userspace
    /// datapath (`datapath_type=netdev`), run by an OVS of the lab's own in its host namespace.
    fn ovs(&mut self, base: &str, pairs: usize) -> Result<()> {
        let host = format!("{base}h");
        self.addns(&host)?;
        let mtu = self.mtu.to_string();
        // on error, dropping `ovs` ends its daemons before the namespaces go
        let ovs = Ovs::start(&host, base)?;
        ovs.vsctl(&[
            "add-br",
            "br0",
            "--",
            "set",
            "bridge",
            "br0",
            "datapath_type=netdev",
        ])?;
        for i in 0..pairs {
            let (a, b) = (format!("{base}a{i}"), format!("{base}b{i}"));
            let (ia, ib) = (
                format!("10.66.{}.{}", 1 + i / 250, 1 + i % 250),
                format!("10.66.{}.{}", 101 + i / 250, 1 + i % 250),
            );
            for (ns, portname, ip4) in [(&a, format!("pa{i}"), &ia), (&b, format!("pb{i}"), &ib)] {
                self.addns(ns)?;
                ip(&[
                    "-n", &host, "link", "add", &portname, "mtu", &mtu, "type", "veth", "peer",
                    "name", "eth0", "mtu", &mtu, "netns", ns,
                ])?;
                ip(&["-n", &host, "link", "set", &portname, "up"])?;
                ip(&["-n", ns, "addr", "add", &format!("{ip4}/16"), "dev", "eth0"])?;
                ip(&["-n", ns, "link", "set", "eth0", "up"])?;
                // the userspace datapath forwards through AF_PACKET and does not finish
                // checksums a veth left to "hardware": compute them in the container (as OVS's
                // documentation advises for veth ports)
                checked(
                    Command::new("ip")
                        .args(["netns", "exec", ns, "ethtool", "-K", "eth0", "tx", "off"]),
                    "ethtool -K eth0 tx off (apt-get install ethtool)",
                )?;
                ovs.vsctl(&["add-port", "br0", &portname])?;
            }
            self.pairs.push(Pair {
                client_ns: a,
                server_ns: b,
                target: ib.clone(),
                bind: ib,
                port: port(i),
                target6: None,
            });
        }
        self.ovs = Some(ovs);
        Ok(())
    }

    /// The lab's host namespace with a CNI runtime in it; the runtime is kept (for DEL on drop)
    /// even when `attach` fails.
    fn with_cni(
        &mut self,
        base: &str,
        attach: impl FnOnce(&mut KernelLab, &mut Cni) -> Result<()>,
    ) -> Result<()> {
        let host = format!("{base}h");
        self.addns(&host)?;
        let range = Range {
            subnet6: self.ipv6.then(|| SUBNET6.into()),
            ..Range::lab()
        };
        let mut cni = Cni::with_range(&host, base, range)?;
        let r = attach(self, &mut cni);
        self.cnis.push(cni);
        r
    }

    /// The CNI `bridge` plugin's configuration: Docker's default network.
    fn bridge_conf(&self, cni: &Cni) -> Value {
        json!({"type": "bridge", "bridge": "dnbr0", "isGateway": true, "ipMasq": false,
            "hairpinMode": true, "mtu": self.mtu, "ipam": cni.ipam()})
    }

    /// Client in a namespace attached with `client`, server with `server`; the server's
    /// address comes from its CNI result, the client connects to `target` (or that address).
    fn cni_pair(
        &mut self,
        cni: &mut Cni,
        base: &str,
        i: usize,
        client: &[Value],
        server: &[Value],
        target: Option<&str>,
    ) -> Result<()> {
        let (a, b) = (format!("{base}a{i}"), format!("{base}b{i}"));
        self.addns(&a)?;
        cni.add(&a, client)?;
        self.addns(&b)?;
        let result = cni.add(&b, server)?;
        let server_ip = first_address(&result)?;
        self.pairs.push(Pair {
            client_ns: a,
            server_ns: b,
            target: target.map_or_else(|| server_ip.clone(), String::from),
            bind: server_ip,
            port: port(i),
            // only the bridge without port mapping is measured over IPv6
            target6: target.is_none().then(|| first_address6(&result)).flatten(),
        });
        Ok(())
    }

    /// `bridge`: every container attached by the CNI `bridge` plugin to one Linux bridge in the
    /// lab's host namespace. With `nat` (`bridge-nat`), Docker's `-p` too: the CNI `portmap`
    /// plugin maps the host's port to each server, the client connects to the host's address
    /// and port, and the hairpin is masqueraded.
    fn bridge(&mut self, base: &str, pairs: usize, nat: bool) -> Result<()> {
        self.with_cni(base, |lab, cni| {
            let link = lab.bridge_conf(cni);
            for i in 0..pairs {
                let mut chain = vec![link.clone()];
                if nat {
                    chain.push(json!({"type": "portmap", "snat": true,
                        "capabilities": {"portMappings": true},
                        "runtimeConfig": {"portMappings": [
                            {"hostPort": port(i), "containerPort": port(i), "protocol": "tcp"}]}}));
                }
                let target = nat.then_some(GATEWAY);
                lab.cni_pair(cni, base, i, std::slice::from_ref(&link), &chain, target)?;
            }
            Ok(())
        })
    }

    /// `container`: Docker's container mode. Client and server share one container's namespace
    /// (attached to a bridge with CNI, as Docker would) and talk over its `lo`.
    fn container(&mut self, base: &str, pairs: usize) -> Result<()> {
        self.with_cni(base, |lab, cni| {
            let link = lab.bridge_conf(cni);
            lab.mtu = LO_MTU;
            for i in 0..pairs {
                let ns = format!("{base}c{i}");
                lab.addns(&ns)?;
                cni.add(&ns, std::slice::from_ref(&link))?;
                lab.pairs.push(Pair {
                    client_ns: ns.clone(),
                    server_ns: ns,
                    target: "127.0.0.1".into(),
                    bind: "127.0.0.1".into(),
                    port: port(i),
                    target6: Some("::1".into()),
                });
            }
            Ok(())
        })
    }

    /// `macvlan` (bridge mode) or `ipvlan` (L2) links by the CNI plugin of that name, on a
    /// lab-owned parent: one end of a veth pair in the lab's host namespace.
    fn vlan(&mut self, base: &str, pairs: usize) -> Result<()> {
        let mode = self.mode;
        self.with_cni(base, |lab, cni| {
            let host = format!("{base}h");
            let mtu = lab.mtu.to_string();
            ip(&[
                "-n", &host, "link", "add", "parent0", "mtu", &mtu, "type", "veth", "peer", "name",
                "parent1", "mtu", &mtu,
            ])?;
            ip(&["-n", &host, "link", "set", "parent0", "up"])?;
            ip(&["-n", &host, "link", "set", "parent1", "up"])?;
            let link = json!({"type": mode.name(), "master": "parent0", "mtu": lab.mtu,
                "mode": if mode == Mode::Macvlan { "bridge" } else { "l2" },
                "ipam": cni.ipam()});
            let chain = std::slice::from_ref(&link);
            for i in 0..pairs {
                lab.cni_pair(cni, base, i, chain, chain, None)?;
            }
            Ok(())
        })
    }
}

/// Two hosts: the routed mode's container subnets (host A, host B).
pub const ROUTED_NETS: [(&str, &str); 2] =
    [("10.79.1.0/24", "10.79.1.1"), ("10.79.2.0/24", "10.79.2.1")];
/// Two hosts: Docker's default private network, the same on both hosts (`nat`).
pub const NAT_NET: (&str, &str) = ("172.17.0.0/16", "172.17.0.1");
/// Two hosts: the overlay's subnet and each host's share of it (`vxlan`).
pub const OVERLAY_NET: &str = "10.80.0.0/16";
/// VXLAN's encapsulation: outer IPv4 + UDP + VXLAN + inner Ethernet.
pub const VXLAN_OVERHEAD: u32 = 50;

impl KernelLab {
    /// Builds a two-host `mode` with `pairs` pairs (clients on host A, servers on host B)
    /// over a wire of `mtu`, shaped as `shape` says; on error, removes whatever was built.
    pub fn build_two_host(mode: Mode, pairs: usize, mtu: u32, shape: &Shape) -> Result<KernelLab> {
        Self::check_two_host(mode, pairs)?;
        Self::build_two_host_on(Wire::build(mtu, shape)?, mode, pairs)
    }

    fn check_two_host(mode: Mode, pairs: usize) -> Result<()> {
        if !mode.is_kernel() || !mode.topologies().contains(&crate::mode::Topology::TwoHost) {
            bail!("{mode} is not a two-host kernel mode");
        }
        if pairs == 0 || pairs > 120 {
            bail!("two hosts: pairs must be 1 ..= 120");
        }
        Ok(())
    }

    /// [`KernelLab::build_two_host`] on hosts and a wire built already (whose MTU the mode
    /// takes); the lab owns them from here on and removes them with the rest.
    pub fn build_two_host_on(wire: Wire, mode: Mode, pairs: usize) -> Result<KernelLab> {
        Self::check_two_host(mode, pairs)?;
        let mtu = wire.mtu;
        let base = unique("");
        let mut lab = KernelLab {
            mode,
            namespaces: Vec::new(),
            pairs: Vec::new(),
            mtu,
            cnis: Vec::new(),
            ovs: None,
            wire: None,
            tunnel: None,
            ipv6: false,
        };
        let (a, b) = (wire.host_a.clone(), wire.host_b.clone());
        lab.wire = Some(wire);
        for h in [&a, &b] {
            lab.wire_ref().sysctl(h, "net.ipv4.ip_forward=1")?;
        }
        match mode {
            Mode::Host => {
                for i in 0..pairs {
                    lab.pairs.push(Pair {
                        client_ns: a.clone(),
                        server_ns: b.clone(),
                        target: HOST_B.into(),
                        bind: HOST_B.into(),
                        port: port(i),
                        target6: None,
                    });
                }
            }
            Mode::Routed => lab.routed(&base, &a, &b, pairs)?,
            Mode::Nat => lab.nat(&base, &a, &b, pairs)?,
            Mode::Macvlan => lab.macvlan_two(&base, &a, &b, pairs)?,
            Mode::Vxlan => {
                let mtu = lab.mtu;
                lab.vxlan(&base, (&a, HOST_A), (&b, HOST_B), WIRE_DEV, mtu, pairs)?
            }
            Mode::VxlanOpenvpn => {
                let t = Tunnel::build(lab.wire_ref(), lab.mtu)?;
                let mtu = t.mtu;
                lab.tunnel = Some(t);
                lab.vxlan(
                    &base,
                    (&a, TUNNEL_A),
                    (&b, TUNNEL_B),
                    TUNNEL_DEV,
                    mtu,
                    pairs,
                )?
            }
            _ => bail!("{mode} is not a two-host kernel mode"),
        }
        Ok(lab)
    }

    fn wire_ref(&self) -> &Wire {
        self.wire.as_ref().expect("two-host lab has a wire")
    }

    /// The address of pair `i`'s client (its container's `eth0`, or host A's address where
    /// the clients run on the host): for a service placed in the client's namespace.
    pub fn client_addr(&self, i: usize) -> Result<String> {
        let Some(p) = self.pairs.get(i) else {
            bail!("no pair {i}");
        };
        if self.mode == Mode::Host {
            return Ok(HOST_A.into());
        }
        let out = checked(
            Command::new("ip").args([
                "-n",
                &p.client_ns,
                "-4",
                "-o",
                "addr",
                "show",
                "dev",
                "eth0",
            ]),
            "reading a container's address",
        )?;
        // `2: eth0    inet 10.80.1.2/16 brd ... scope global eth0`
        String::from_utf8_lossy(&out)
            .split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .and_then(|a| a.split('/').next())
            .map(String::from)
            .ok_or_else(|| anyhow::anyhow!("{} has no IPv4 address on eth0", p.client_ns))
    }

    /// A CNI runtime in host `h` over `range` (kept for DEL on drop).
    fn cni_in(&mut self, h: &str, base: &str, tag: &str, range: Range) -> Result<usize> {
        let cni = Cni::with_range(h, &format!("{base}{tag}"), range)?;
        self.cnis.push(cni);
        Ok(self.cnis.len() - 1)
    }

    /// Attaches client `i` on runtime `ca` with `client`, server `i` on `cb` with `server`;
    /// the client connects to `target` (or the server's address).
    #[allow(clippy::too_many_arguments)]
    fn two_host_pair(
        &mut self,
        base: &str,
        i: usize,
        (ca, client): (usize, &[Value]),
        (cb, server): (usize, &[Value]),
        target: Option<&str>,
    ) -> Result<()> {
        let (na, nb) = (format!("{base}a{i}"), format!("{base}b{i}"));
        self.addns(&na)?;
        self.cnis[ca].add(&na, client)?;
        self.addns(&nb)?;
        let server_ip = first_address(&self.cnis[cb].add(&nb, server)?)?;
        self.pairs.push(Pair {
            client_ns: na,
            server_ns: nb,
            target: target.map_or_else(|| server_ip.clone(), String::from),
            bind: server_ip,
            port: port(i),
            target6: None,
        });
        Ok(())
    }

    fn bridge_on(&self, bridge: &str, gateway: bool, masq: bool, mtu: u32, cni: usize) -> Value {
        json!({"type": "bridge", "bridge": bridge, "isGateway": gateway, "ipMasq": masq,
            "mtu": mtu, "ipam": self.cnis[cni].ipam()})
    }

    /// `routed`: a CNI bridge per host with its own subnet, the host as the containers'
    /// gateway, and a route on each host to the other's subnet through the wire.
    fn routed(&mut self, base: &str, a: &str, b: &str, pairs: usize) -> Result<()> {
        let range = |(net, gw): (&str, &str)| Range {
            subnet: net.into(),
            gateway: Some(gw.into()),
            span: None,
            default_route: true,
            subnet6: None,
        };
        let ca = self.cni_in(a, base, "ca", range(ROUTED_NETS[0]))?;
        let cb = self.cni_in(b, base, "cb", range(ROUTED_NETS[1]))?;
        let (la, lb) = (
            self.bridge_on("cbr0", true, false, self.mtu, ca),
            self.bridge_on("cbr0", true, false, self.mtu, cb),
        );
        for i in 0..pairs {
            self.two_host_pair(
                base,
                i,
                (ca, std::slice::from_ref(&la)),
                (cb, std::slice::from_ref(&lb)),
                None,
            )?;
        }
        let w = self.wire_ref();
        w.ip_in(a, &["route", "add", ROUTED_NETS[1].0, "via", HOST_B])?;
        w.ip_in(b, &["route", "add", ROUTED_NETS[0].0, "via", HOST_A])?;
        Ok(())
    }

    /// `nat`: the same private network behind each host (Docker's default), masqueraded on
    /// the way out; on the server's host, `portmap` maps the host's port to the server.
    fn nat(&mut self, base: &str, a: &str, b: &str, pairs: usize) -> Result<()> {
        let range = || Range {
            subnet: NAT_NET.0.into(),
            gateway: Some(NAT_NET.1.into()),
            span: None,
            default_route: true,
            subnet6: None,
        };
        let ca = self.cni_in(a, base, "ca", range())?;
        let cb = self.cni_in(b, base, "cb", range())?;
        let la = self.bridge_on("docker0", true, true, self.mtu, ca);
        let lb = self.bridge_on("docker0", true, true, self.mtu, cb);
        for i in 0..pairs {
            let chain = vec![
                lb.clone(),
                json!({"type": "portmap", "snat": true,
                    "capabilities": {"portMappings": true},
                    "runtimeConfig": {"portMappings": [
                        {"hostPort": port(i), "containerPort": port(i), "protocol": "tcp"}]}}),
            ];
            self.two_host_pair(
                base,
                i,
                (ca, std::slice::from_ref(&la)),
                (cb, &chain),
                Some(HOST_B),
            )?;
        }
        Ok(())
    }

    /// `macvlan`: containers on macvlan links (bridge mode) over each host's end of the wire,
    /// in the wire's own subnet.
    fn macvlan_two(&mut self, base: &str, a: &str, b: &str, pairs: usize) -> Result<()> {
        let range = |first: &str, last: &str| Range {
            subnet: "192.168.77.0/24".into(),
            gateway: None,
            span: Some((first.into(), last.into())),
            default_route: false,
            subnet6: None,
        };
        let ca = self.cni_in(a, base, "ca", range("192.168.77.11", "192.168.77.130"))?;
        let cb = self.cni_in(b, base, "cb", range("192.168.77.131", "192.168.77.250"))?;
        let conf = |c: usize| {
            json!({"type": "macvlan", "master": WIRE_DEV, "mode": "bridge", "mtu": self.mtu,
                "ipam": self.cnis[c].ipam()})
        };
        let (la, lb) = (conf(ca), conf(cb));
        for i in 0..pairs {
            self.two_host_pair(
                base,
                i,
                (ca, std::slice::from_ref(&la)),
                (cb, std::slice::from_ref(&lb)),
                None,
            )?;
        }
        Ok(())
    }

    /// `vxlan`: a VXLAN device on each host (VNI 42, to the other host over `dev`, whose MTU
    /// is `under_mtu`: the wire, or the OpenVPN tunnel in `vxlan-openvpn`) enslaved to a
    /// bridge the CNI `bridge` plugin attaches the containers to; one overlay subnet, each
    /// host handing out its own part. The containers' MTU leaves room for the encapsulation.
    fn vxlan(
        &mut self,
        base: &str,
        (a, addr_a): (&str, &str),
        (b, addr_b): (&str, &str),
        dev: &str,
        under_mtu: u32,
        pairs: usize,
    ) -> Result<()> {
        let inner = under_mtu.saturating_sub(VXLAN_OVERHEAD);
        let mtu = inner.to_string();
        for (h, local, remote) in [(a, addr_a, addr_b), (b, addr_b, addr_a)] {
            let w = self.wire_ref();
            w.ip_in(
                h,
                &[
                    "link", "add", "vx0", "mtu", &mtu, "type", "vxlan", "id", "42", "local", local,
                    "remote", remote, "dstport", "4789", "dev", dev,
                ],
            )?;
            w.ip_in(h, &["link", "add", "vbr0", "mtu", &mtu, "type", "bridge"])?;
            w.ip_in(h, &["link", "set", "vx0", "master", "vbr0"])?;
            w.ip_in(h, &["link", "set", "vx0", "up"])?;
            w.ip_in(h, &["link", "set", "vbr0", "up"])?;
        }
        let range = |first: &str, last: &str| Range {
            subnet: OVERLAY_NET.into(),
            gateway: None,
            span: Some((first.into(), last.into())),
            default_route: false,
            subnet6: None,
        };
        let ca = self.cni_in(a, base, "ca", range("10.80.1.1", "10.80.1.250"))?;
        let cb = self.cni_in(b, base, "cb", range("10.80.2.1", "10.80.2.250"))?;
        let la = self.bridge_on("vbr0", false, false, inner, ca);
        let lb = self.bridge_on("vbr0", false, false, inner, cb);
        for i in 0..pairs {
            self.two_host_pair(
                base,
                i,
                (ca, std::slice::from_ref(&la)),
                (cb, std::slice::from_ref(&lb)),
                None,
            )?;
        }
        Ok(())
    }
}

impl Drop for KernelLab {
    fn drop(&mut self) {
        drop(self.tunnel.take());
        drop(self.ovs.take());
        for cni in self.cnis.iter_mut().rev() {
            cni.del_all();
        }
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("docknet: warning: removing namespace {ns}: {e:#}");
            }
        }
        for cni in self.cnis.drain(..) {
            let _ = std::fs::remove_dir_all(&cni.dir);
        }
        // the hosts and the wire go last (the `wire` field drops after this)
    }
}
