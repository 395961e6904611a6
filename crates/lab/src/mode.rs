//! The network modes the lab compares: one closed set, parsed once, used everywhere.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A network mode: how two containers are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Both ends in one namespace, over its `lo`.
    Loopback,
    /// Docker's container mode: two processes share one container's namespace (`lo`).
    Container,
    /// A veth pair straight between two namespaces.
    Veth,
    /// Each container on a Linux bridge: Docker's default network.
    Bridge,
    /// The bridge plus Docker's `-p` port mapping (DNAT, hairpin masquerade).
    BridgeNat,
    /// macvlan links in bridge mode on a lab-owned parent.
    Macvlan,
    /// ipvlan (L2) links on a lab-owned parent, where the kernel has the module.
    Ipvlan,
    /// Open vSwitch with the userspace datapath.
    Ovs,
    /// SR-IOV virtual functions: probed, never built (no such NIC in a lab VM).
    Sriov,
    /// DockLib through the DockNet daemon.
    Docknet,
    /// DockLib over a fast channel (the daemon is not on the path).
    DocknetFc,
    /// Two hosts: processes in the hosts' own namespaces (the inter-host baseline).
    Host,
    /// Two hosts: a bridge per host and routes between the hosts (Calico's routed mode
    /// without BGP).
    Routed,
    /// Two hosts: private container networks behind each host's address, port mapping on the
    /// server's host and masquerading on the client's (Docker's `-p`).
    Nat,
    /// Two hosts: a kernel VXLAN overlay between them, a bridge per host (Docker overlay,
    /// Flannel).
    Vxlan,
    /// Two hosts: DockLib through daemons that drive the wire with AF_PACKET (the daemons'
    /// AF_XDP path is `docknet`).
    DocknetPacket,
    /// Unmodified kernel-socket programs through the DockNet daemon, by the preload library
    /// (`docknet run --preload`).
    DocknetPreload,
    /// Unmodified kernel-socket programs over a fast channel, by the preload library.
    DocknetFcPreload,
    /// Two hosts: the `vxlan` overlay carried by an OpenVPN tunnel between the hosts (a static
    /// key, AES-256-CBC and HMAC-SHA256 on TUN devices): an encrypted overlay in userspace, as
    /// weave's encrypted mode was (this kernel has no ESP or WireGuard).
    VxlanOpenvpn,
    /// Two hosts: DockLib through daemons that drive the wire with AF_XDP and route each
    /// host's pipes through VXLAN tunnels (the daemons' overlay, for nodes that share no link).
    DocknetVxlan,
    /// DockLib at the daemon's defaults: through the daemon until the pair has talked, then
    /// over the fast channel the daemon builds for it by itself (no `fc connect`).
    DocknetAuto,
    /// Two hosts: DockLib pods behind daemons with a link to their host's own kernel
    /// (`--host-link`), the hosts' kernels routing each other's pods over the wire as `routed`
    /// routes kernel pods (flannel's host-gw, Calico's routes).
    DocknetHost,
    /// Two hosts: pods made as Kubernetes makes them on DockNet nodes: each host's daemon at
    /// its defaults on the wire, the node agent routing the other host's pod network and
    /// writing the CNI configuration, and the CNI plugin attaching each pod.
    DocknetPods,
}

/// How many hosts a topology spans.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// Client and server on one host.
    #[default]
    OneHost,
    /// Client on host A, server on host B, the hosts joined by a wire.
    TwoHost,
}

impl Topology {
    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Topology::OneHost => "one-host",
            Topology::TwoHost => "two-host",
        }
    }

    /// The mode every other is compared with: Docker's default bridge on one host, plain
    /// processes on the hosts across two (Suo's relative figures).
    pub fn baseline(self) -> Mode {
        match self {
            Topology::OneHost => Mode::Bridge,
            Topology::TwoHost => Mode::Host,
        }
    }

    /// In a few words (report headings).
    pub fn describe(self) -> &'static str {
        match self {
            Topology::OneHost => "one host",
            Topology::TwoHost => "two hosts joined by a wire",
        }
    }

    /// The modes of this topology, in the report's order.
    pub fn modes(self) -> Vec<Mode> {
        Mode::ALL
            .into_iter()
            .filter(|m| m.topologies().contains(&self))
            .collect()
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Topology {
    type Err = String;
    fn from_str(s: &str) -> Result<Topology, String> {
        match s {
            "one-host" => Ok(Topology::OneHost),
            "two-host" => Ok(Topology::TwoHost),
            _ => Err(format!("unknown topology {s:?}: use one-host or two-host")),
        }
    }
}

/// What a mode's traffic crosses between the two ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// The loopback device of one namespace (MTU 65536 whatever the lab's MTU).
    Lo,
    /// A veth pair.
    Veth,
    /// Veths to a Linux bridge.
    Bridge,
    /// macvlan links on one parent.
    Macvlan,
    /// ipvlan links on one parent.
    Ipvlan,
    /// Veths to an OVS bridge (userspace datapath).
    Ovs,
    /// A virtual function of a NIC.
    Vf,
    /// DockPipes switched by the daemon.
    Pipe,
    /// A fast-channel region between two pipes.
    FastChannel,
    /// The wire between two hosts, through the kernel's stack on each.
    Wire,
    /// The wire between two hosts, driven by DockNet daemons.
    Nic,
}

/// Who builds a mode's topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Builder {
    /// `ip` commands.
    Ip,
    /// The reference CNI plugins.
    Cni,
    /// `ovs-vsctl` on an Open vSwitch of the lab's own.
    OvsVsctl,
    /// DockNet's own control plane.
    Docknet,
}

impl Builder {
    /// The name written into results (`builder`).
    pub fn name(self) -> &'static str {
        match self {
            Builder::Ip => "ip",
            Builder::Cni => "cni",
            Builder::OvsVsctl => "ovs-vsctl",
            Builder::Docknet => "docknet",
        }
    }
}

/// MTU of `lo`: what modes that cross only `lo` run at, whatever the lab's MTU.
pub const LO_MTU: u32 = 65536;

impl Mode {
    /// Every mode, in the order the report gives them a hue.
    pub const ALL: [Mode; 23] = [
        Mode::Bridge,
        Mode::Docknet,
        Mode::DocknetFc,
        Mode::Loopback,
        Mode::BridgeNat,
        Mode::Macvlan,
        Mode::Ovs,
        Mode::Veth,
        Mode::Container,
        Mode::Ipvlan,
        Mode::Sriov,
        Mode::Host,
        Mode::Routed,
        Mode::Nat,
        Mode::Vxlan,
        Mode::DocknetPacket,
        Mode::DocknetPreload,
        Mode::DocknetFcPreload,
        Mode::VxlanOpenvpn,
        Mode::DocknetVxlan,
        Mode::DocknetAuto,
        Mode::DocknetHost,
        Mode::DocknetPods,
    ];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Loopback => "loopback",
            Mode::Container => "container",
            Mode::Veth => "veth",
            Mode::Bridge => "bridge",
            Mode::BridgeNat => "bridge-nat",
            Mode::Macvlan => "macvlan",
            Mode::Ipvlan => "ipvlan",
            Mode::Ovs => "ovs",
            Mode::Sriov => "sriov",
            Mode::Docknet => "docknet",
            Mode::DocknetFc => "docknet-fc",
            Mode::Host => "host",
            Mode::Routed => "routed",
            Mode::Nat => "nat",
            Mode::Vxlan => "vxlan",
            Mode::DocknetPacket => "docknet-packet",
            Mode::DocknetPreload => "docknet-preload",
            Mode::DocknetFcPreload => "docknet-fc-preload",
            Mode::VxlanOpenvpn => "vxlan-openvpn",
            Mode::DocknetVxlan => "docknet-vxlan",
            Mode::DocknetAuto => "docknet-auto",
            Mode::DocknetHost => "docknet-host",
            Mode::DocknetPods => "docknet-pods",
        }
    }

    /// What the mode is, in a few words (help texts and the report).
    pub fn describe(self) -> &'static str {
        match self {
            Mode::Loopback => "kernel loopback, one namespace",
            Mode::Container => "kernel container mode, shared netns",
            Mode::Veth => "kernel veth pair",
            Mode::Bridge => "kernel bridge, Docker's default",
            Mode::BridgeNat => "kernel bridge + port mapping, Docker's -p",
            Mode::Macvlan => "kernel macvlan",
            Mode::Ipvlan => "kernel ipvlan",
            Mode::Ovs => "Open vSwitch, userspace datapath",
            Mode::Sriov => "SR-IOV",
            Mode::Docknet => "DockNet through the daemon (two hosts: AF_XDP on the wire)",
            Mode::DocknetFc => "DockNet fast channel",
            Mode::Host => "processes on the hosts (two hosts)",
            Mode::Routed => "bridge per host, routed between hosts",
            Mode::Nat => "private networks, port mapping + masquerade",
            Mode::Vxlan => "kernel VXLAN overlay, bridge per host",
            Mode::DocknetPacket => "DockNet daemons on the wire with AF_PACKET",
            Mode::DocknetPreload => "unmodified programs through DockNet's daemon (preload)",
            Mode::DocknetFcPreload => "unmodified programs over a DockNet fast channel (preload)",
            Mode::VxlanOpenvpn => "VXLAN overlay through an OpenVPN tunnel (encrypted)",
            Mode::DocknetVxlan => "DockNet daemons on the wire (AF_XDP), VXLAN between hosts",
            Mode::DocknetAuto => "DockNet at its defaults: the daemon builds the fast channel",
            Mode::DocknetHost => "DockNet pods on host links, the hosts' kernels route between",
            Mode::DocknetPods => "DockNet pods by the CNI plugin, routed by the node agent",
        }
    }

    /// The topologies the mode exists in.
    pub fn topologies(self) -> &'static [Topology] {
        match self {
            Mode::Macvlan | Mode::Docknet => &[Topology::OneHost, Topology::TwoHost],
            Mode::Host
            | Mode::Routed
            | Mode::Nat
            | Mode::Vxlan
            | Mode::VxlanOpenvpn
            | Mode::DocknetPacket
            | Mode::DocknetVxlan
            | Mode::DocknetHost
            | Mode::DocknetPods => &[Topology::TwoHost],
            _ => &[Topology::OneHost],
        }
    }

    /// A DockNet mode (DockLib sockets over pipes)?
    pub fn is_docknet(self) -> bool {
        matches!(
            self,
            Mode::Docknet
                | Mode::DocknetFc
                | Mode::DocknetAuto
                | Mode::DocknetPacket
                | Mode::DocknetVxlan
                | Mode::DocknetHost
                | Mode::DocknetPods
                | Mode::DocknetPreload
                | Mode::DocknetFcPreload
        )
    }

    /// A DockNet mode whose programs use kernel sockets under the preload library?
    pub fn is_preload(self) -> bool {
        matches!(self, Mode::DocknetPreload | Mode::DocknetFcPreload)
    }

    /// A kernel mode the lab builds in namespaces?
    pub fn is_kernel(self) -> bool {
        !self.is_docknet() && self != Mode::Sriov
    }

    /// What the traffic crosses.
    pub fn link(self) -> Link {
        match self {
            Mode::Loopback | Mode::Container => Link::Lo,
            Mode::Veth => Link::Veth,
            Mode::Bridge | Mode::BridgeNat => Link::Bridge,
            Mode::Macvlan => Link::Macvlan,
            Mode::Ipvlan => Link::Ipvlan,
            Mode::Ovs => Link::Ovs,
            Mode::Sriov => Link::Vf,
            Mode::Docknet | Mode::DocknetPreload => Link::Pipe,
            Mode::DocknetFc | Mode::DocknetFcPreload | Mode::DocknetAuto => Link::FastChannel,
            Mode::Host
            | Mode::Routed
            | Mode::Nat
            | Mode::Vxlan
            | Mode::VxlanOpenvpn
            | Mode::DocknetHost => Link::Wire,
            Mode::DocknetPacket | Mode::DocknetVxlan | Mode::DocknetPods => Link::Nic,
        }
    }

    /// Whether the traffic crosses only `lo`, so the lab's MTU does not apply.
    pub fn crosses_lo(self) -> bool {
        self.link() == Link::Lo
    }

    /// Who builds the topology.
    pub fn builder(self) -> Builder {
        match self {
            Mode::Loopback | Mode::Veth | Mode::Sriov | Mode::Host => Builder::Ip,
            Mode::Container
            | Mode::Bridge
            | Mode::BridgeNat
            | Mode::Macvlan
            | Mode::Ipvlan
            | Mode::Routed
            | Mode::Nat
            | Mode::Vxlan
            | Mode::VxlanOpenvpn => Builder::Cni,
            Mode::Ovs => Builder::OvsVsctl,
            Mode::Docknet
            | Mode::DocknetFc
            | Mode::DocknetAuto
            | Mode::DocknetPacket
            | Mode::DocknetVxlan
            | Mode::DocknetHost
            | Mode::DocknetPods
            | Mode::DocknetPreload
            | Mode::DocknetFcPreload => Builder::Docknet,
        }
    }

    /// Position in the report's colour order: a mode keeps its hue in every figure.
    pub fn hue(self) -> usize {
        Mode::ALL.iter().position(|m| *m == self).unwrap_or(0)
    }

    /// Every mode name, comma-separated (for error messages and help).
    pub fn names() -> String {
        Mode::ALL.map(Mode::name).join(", ")
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown mode name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown mode {0:?}: use {names}", names = Mode::names())]
pub struct UnknownMode(pub String);

impl FromStr for Mode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Mode, UnknownMode> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| UnknownMode(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_text_and_json() {
        for m in Mode::ALL {
            assert_eq!(m.name().parse::<Mode>(), Ok(m));
            let j = serde_json::to_string(&m).unwrap();
            assert_eq!(j, format!("\"{}\"", m.name()));
            assert_eq!(serde_json::from_str::<Mode>(&j).unwrap(), m);
        }
        let e = "nonsense".parse::<Mode>().unwrap_err().to_string();
        assert!(e.contains("nonsense") && e.contains("docknet-fc") && e.contains("bridge-nat"));
        assert!(serde_json::from_str::<Mode>("\"<b>\"").is_err());
    }

    #[test]
    fn kinds_links_and_hues() {
        assert!(Mode::Docknet.is_docknet() && !Mode::Docknet.is_kernel());
        assert!(Mode::Bridge.is_kernel() && !Mode::Sriov.is_kernel() && !Mode::Sriov.is_docknet());
        assert!(Mode::Loopback.crosses_lo() && Mode::Container.crosses_lo());
        assert!(!Mode::Veth.crosses_lo() && !Mode::Docknet.crosses_lo());
        assert_eq!(Mode::Bridge.builder(), Builder::Cni);
        assert_eq!(Mode::Veth.builder().name(), "ip");
        assert_eq!(Mode::Ovs.builder().name(), "ovs-vsctl");
        // the hues of the first three never change: bridge, docknet, docknet-fc
        assert_eq!(
            [
                Mode::Bridge.hue(),
                Mode::Docknet.hue(),
                Mode::DocknetFc.hue()
            ],
            [0, 1, 2]
        );
        let mut hues: Vec<usize> = Mode::ALL.iter().map(|m| m.hue()).collect();
        hues.dedup();
        assert_eq!(hues.len(), Mode::ALL.len(), "one hue per mode");
    }

    #[test]
    fn topologies_have_their_modes_and_baselines() {
        let two = Topology::TwoHost.modes();
        for m in [
            Mode::Host,
            Mode::Routed,
            Mode::Nat,
            Mode::Macvlan,
            Mode::Vxlan,
            Mode::VxlanOpenvpn,
            Mode::Docknet,
            Mode::DocknetPacket,
            Mode::DocknetVxlan,
            Mode::DocknetHost,
            Mode::DocknetPods,
        ] {
            assert!(two.contains(&m), "{m}");
        }
        assert!(!two.contains(&Mode::DocknetFc) && !two.contains(&Mode::Bridge));
        assert!(!Topology::OneHost.modes().contains(&Mode::Host));
        assert_eq!(Topology::TwoHost.baseline(), Mode::Host);
        assert_eq!(Topology::OneHost.baseline(), Mode::Bridge);
        for t in [Topology::OneHost, Topology::TwoHost] {
            assert_eq!(t.name().parse::<Topology>(), Ok(t));
            assert!(t.modes().contains(&t.baseline()));
        }
        assert!("three-host".parse::<Topology>().is_err());
        assert!(Mode::DocknetPacket.is_docknet() && !Mode::Vxlan.is_docknet());
        assert!(Mode::Vxlan.is_kernel());
    }
}
