//! Whether this machine can have a mode at all: checked, not assumed. A mode it cannot have is
//! reported as "not available here" with the reason, never as a number.

use super::cni::plugin_dir;
use crate::mode::Mode;
use crate::proc::{ip, unique};
use std::process::Command;

/// Why an OpenVPN tunnel cannot be built here: the program or the TUN device missing.
fn openvpn() -> Option<String> {
    let runs = Command::new("openvpn")
        .arg("--version")
        .output()
        // `openvpn --version` exits 1 after printing its version
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).starts_with("OpenVPN "));
    if !runs {
        return Some("openvpn is missing (apt-get install openvpn)".into());
    }
    (!std::path::Path::new("/dev/net/tun").exists())
        .then(|| "no /dev/net/tun: the kernel has no TUN devices".to_string())
}

/// Why `mode` cannot be measured on this machine, or `None` when it can.
pub fn unavailable(mode: Mode) -> Option<String> {
    match mode {
        Mode::Bridge
        | Mode::BridgeNat
        | Mode::Container
        | Mode::Macvlan
        | Mode::Routed
        | Mode::Nat => cni(mode),
        Mode::Vxlan => cni(mode).or_else(|| {
            link_probe(
                &[
                    "vx0", "type", "vxlan", "id", "42", "dstport", "4789", "dev", "p0",
                ],
                "vxlan",
            )
        }),
        Mode::VxlanOpenvpn => unavailable(Mode::Vxlan).or_else(openvpn),
        Mode::Ipvlan => cni(mode).or_else(ipvlan),
        Mode::Ovs => [
            "ovsdb-server",
            "ovs-vswitchd",
            "ovs-vsctl",
            "ovsdb-tool",
            "ethtool",
        ]
        .iter()
        .find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .map_or(true, |o| !o.status.success())
        })
        .map(|p| format!("{p} is missing (apt-get install openvswitch-switch ethtool)")),
        Mode::Sriov => {
            let vfs = std::fs::read_dir("/sys/class/net")
                .map(|rd| {
                    rd.flatten()
                        .any(|e| e.path().join("device/sriov_totalvfs").exists())
                })
                .unwrap_or(false);
            (!vfs).then(|| "no SR-IOV capable NIC on this machine".to_string())
        }
        Mode::DocknetPreload | Mode::DocknetFcPreload => preload_library(),
        Mode::DocknetPods => super::pods::missing(&std::env::current_exe().ok()?),
        Mode::Loopback
        | Mode::Veth
        | Mode::Docknet
        | Mode::DocknetFc
        | Mode::DocknetAuto
        | Mode::Host
        | Mode::DocknetPacket
        | Mode::DocknetVxlan
        | Mode::DocknetHost => None,
    }
}

/// The preload library must sit beside the `docknet` binary (`docknet run --preload` loads it
/// from there).
fn preload_library() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let lib = exe.with_file_name("libdocknet_preload.so");
    (!lib.is_file()).then(|| {
        format!(
            "{} is missing (cargo build --release -p docknet-preload)",
            lib.display()
        )
    })
}

/// The CNI plugins, and iptables for `bridge-nat`'s port mapping.
fn cni(mode: Mode) -> Option<String> {
    if let Err(e) = plugin_dir() {
        return Some(format!("{e:#}"));
    }
    if matches!(mode, Mode::BridgeNat | Mode::Nat)
        && Command::new("iptables").arg("-V").output().is_err()
    {
        return Some("the CNI portmap plugin needs iptables (apt-get install iptables)".into());
    }
    None
}

/// Whether the kernel can make ipvlan links, tried in a namespace of our own.
fn ipvlan() -> Option<String> {
    link_probe(
        &["iv0", "link", "p0", "type", "ipvlan", "mode", "l2"],
        "ipvlan",
    )
}

/// Whether the kernel can make the link `ip link add ARGS...` describes (beside a veth `p0`),
/// tried in a namespace of our own.
fn link_probe(args: &[&str], kind: &str) -> Option<String> {
    let ns = unique("p");
    let probe = ip(&["netns", "add", &ns]).and_then(|_| {
        ip(&[
            "-n", &ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1",
        ])?;
        let mut a = vec!["-n", ns.as_str(), "link", "add"];
        a.extend_from_slice(args);
        ip(&a)
    });
    let _ = ip(&["netns", "del", &ns]);
    probe
        .err()
        .map(|e| format!("the kernel cannot create {kind} links ({e:#}): no {kind} module"))
}
