//! Kernel network topologies for baselines, built only inside namespaces this process creates.
//! Names carry the pid and a per-process counter, so parallel or leftover runs never collide;
//! everything is deleted on drop (deleting a namespace removes its links).

use anyhow::{bail, Context, Result};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process and call: `dn<pid>x<n><tag>`.
pub fn unique(tag: &str) -> String {
    format!(
        "dn{}x{}{tag}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `ip ARGS...`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (install iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A kernel container network between a client namespace `a` and a server namespace `b`,
/// built inside namespaces this process creates (never touching the machine's interfaces).
#[derive(Debug)]
pub struct KernelLab {
    /// All namespaces created, in creation order.
    pub namespaces: Vec<String>,
    /// Namespace of the client.
    pub a: String,
    /// Namespace of the server.
    pub b: String,
    /// Address the client connects to (the server's, or the host's mapped port for NAT).
    pub target: String,
    /// Address the server binds.
    pub bind: String,
}

/// Backwards-compatible name for the bridge topology.
pub type BridgeLab = KernelLab;

/// Kernel modes this lab can build.
pub const KERNEL_MODES: &[&str] = &[
    "loopback",
    "veth",
    "bridge",
    "bridge-nat",
    "macvlan",
    "ipvlan",
];

impl KernelLab {
    /// Address of A on the lab subnet.
    pub const IP_A: &'static str = "10.66.0.1";
    /// Address of B.
    pub const IP_B: &'static str = "10.66.0.2";
    /// The "host" address (on the bridge) for port mapping.
    pub const IP_HOST: &'static str = "10.66.0.254";

    /// The bridge topology (Docker's default network without NAT).
    pub fn create() -> Result<KernelLab> {
        Self::create_mode("bridge")
    }

    /// Builds `mode`; on error, removes whatever was built.
    ///
    /// - `loopback`: one namespace, both ends on its `lo`.
    /// - `veth`: a veth pair straight between A and B.
    /// - `bridge`: veth pairs from A and B to a Linux bridge in a host namespace.
    /// - `bridge-nat`: the bridge, plus Docker's `-p` port mapping: the client connects to the
    ///   host's address, nftables DNATs to B, and masquerades the hairpin as Docker does.
    /// - `macvlan`: macvlan devices in bridge mode on a lab-owned parent (one end of a veth pair
    ///   in the host namespace), one in A and one in B.
    /// - `ipvlan`: the same with ipvlan (L2 mode), where the kernel has the module.
    pub fn create_mode(mode: &str) -> Result<KernelLab> {
        let base = unique("");
        let (h, a, b) = (format!("{base}h"), format!("{base}a"), format!("{base}b"));
        let mut lab = KernelLab {
            namespaces: Vec::new(),
            a: a.clone(),
            b: b.clone(),
            target: Self::IP_B.into(),
            bind: Self::IP_B.into(),
        };
        let addns = |lab: &mut KernelLab, ns: &str| -> Result<()> {
            ip(&["netns", "add", ns])?;
            lab.namespaces.push(ns.to_string());
            ip(&["-n", ns, "link", "set", "lo", "up"])
        };
        let addr = |ns: &str, ip4: &str| -> Result<()> {
            ip(&["-n", ns, "addr", "add", &format!("{ip4}/24"), "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])
        };
        match mode {
            "loopback" => {
                addns(&mut lab, &a)?;
                lab.b = a.clone();
                lab.target = "127.0.0.1".into();
                lab.bind = "127.0.0.1".into();
            }
            "veth" => {
                addns(&mut lab, &a)?;
                addns(&mut lab, &b)?;
                ip(&[
                    "-n", &a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
                    "netns", &b,
                ])?;
                addr(&a, Self::IP_A)?;
                addr(&b, Self::IP_B)?;
            }
            "bridge" | "bridge-nat" => {
                for ns in [&h, &a, &b] {
                    addns(&mut lab, ns)?;
                }
                ip(&["-n", &h, "link", "add", "br0", "type", "bridge"])?;
                ip(&["-n", &h, "link", "set", "br0", "up"])?;
                for (ns, port, ip4) in [(&a, "va", Self::IP_A), (&b, "vb", Self::IP_B)] {
                    ip(&[
                        "-n", &h, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                        "netns", ns,
                    ])?;
                    ip(&["-n", &h, "link", "set", port, "master", "br0", "up"])?;
                    addr(ns, ip4)?;
                }
                if mode == "bridge-nat" {
                    ip(&[
                        "-n",
                        &h,
                        "addr",
                        "add",
                        &format!("{}/24", Self::IP_HOST),
                        "dev",
                        "br0",
                    ])?;
                    run_in(&h, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
                    let rules = format!(
                        "table ip docknet {{\n\
                         chain pre {{ type nat hook prerouting priority dstnat; ip daddr {host} tcp dport 20000-29999 dnat to {b}; }}\n\
                         chain post {{ type nat hook postrouting priority srcnat; ip saddr 10.66.0.0/24 ip daddr {b} masquerade; }}\n\
                         }}\n",
                        host = Self::IP_HOST,
                        b = Self::IP_B
                    );
                    let f = std::env::temp_dir().join(format!("{base}.nft"));
                    std::fs::write(&f, rules)?;
                    let r = run_in(&h, "nft", &["-f", f.to_str().unwrap_or_default()]);
                    let _ = std::fs::remove_file(&f);
                    r.context("port mapping needs nftables (apt-get install nftables)")?;
                    lab.target = Self::IP_HOST.into();
                }
            }
            "macvlan" | "ipvlan" => {
                for ns in [&h, &a, &b] {
                    addns(&mut lab, ns)?;
                }
                ip(&[
                    "-n", &h, "link", "add", "parent0", "type", "veth", "peer", "name", "parent1",
                ])?;
                ip(&["-n", &h, "link", "set", "parent0", "up"])?;
                ip(&["-n", &h, "link", "set", "parent1", "up"])?;
                let kind: &[&str] = if mode == "macvlan" {
                    &["type", "macvlan", "mode", "bridge"]
                } else {
                    &["type", "ipvlan", "mode", "l2"]
                };
                for (ns, dev, ip4) in [(&a, "mva", Self::IP_A), (&b, "mvb", Self::IP_B)] {
                    let mut args = vec!["-n", h.as_str(), "link", "add", dev, "link", "parent0"];
                    args.extend_from_slice(kind);
                    ip(&args)?;
                    ip(&["-n", &h, "link", "set", dev, "netns", ns, "name", "eth0"])?;
                    addr(ns, ip4)?;
                }
            }
            m => bail!("unknown kernel mode {m:?}: {}", KERNEL_MODES.join(", ")),
        }
        Ok(lab)
    }
}

/// Runs a command inside namespace `ns`, failing with its stderr.
fn run_in(ns: &str, cmd: &str, args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, cmd])
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Why a mode cannot be measured on this machine, if it cannot (checked, not assumed).
pub fn unavailable(mode: &str) -> Option<String> {
    match mode {
        "ipvlan" => {
            let ns = unique("p");
            let probe = ip(&["netns", "add", &ns]).and_then(|_| {
                ip(&[
                    "-n", &ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1",
                ])?;
                ip(&[
                    "-n", &ns, "link", "add", "iv0", "link", "p0", "type", "ipvlan", "mode", "l2",
                ])
            });
            let _ = ip(&["netns", "del", &ns]);
            probe
                .err()
                .map(|e| format!("the kernel cannot create ipvlan links ({e:#}): no ipvlan module"))
        }
        "ovs" => {
            let ok = Command::new("ovs-vsctl")
                .arg("show")
                .output()
                .is_ok_and(|o| o.status.success());
            (!ok).then(|| {
                "Open vSwitch is not running here (ovs-vsctl missing or no ovs-vswitchd); the lab has no OVS mode yet".to_string()
            })
        }
        "sriov" => {
            let vfs = std::fs::read_dir("/sys/class/net")
                .map(|rd| {
                    rd.flatten()
                        .any(|e| e.path().join("device/sriov_totalvfs").exists())
                })
                .unwrap_or(false);
            (!vfs).then(|| "no SR-IOV capable NIC on this machine".to_string())
        }
        _ => None,
    }
}

impl Drop for KernelLab {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("docknet: warning: removing namespace {ns}: {e:#}");
            }
        }
    }
}
