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

/// Two container namespaces joined by veth pairs to a Linux bridge in a host namespace
/// (Docker's default network, minus NAT).
#[derive(Debug)]
pub struct BridgeLab {
    /// All namespaces created, in creation order.
    pub namespaces: Vec<String>,
    /// Namespace of container A (address [`BridgeLab::IP_A`]).
    pub a: String,
    /// Namespace of container B (address [`BridgeLab::IP_B`]).
    pub b: String,
}

impl BridgeLab {
    /// Address of A.
    pub const IP_A: &'static str = "10.66.0.1";
    /// Address of B.
    pub const IP_B: &'static str = "10.66.0.2";

    /// Builds the topology; on error, removes whatever was built.
    pub fn create() -> Result<BridgeLab> {
        let base = unique("");
        let (h, a, b) = (format!("{base}h"), format!("{base}a"), format!("{base}b"));
        let mut lab = BridgeLab {
            namespaces: Vec::new(),
            a: a.clone(),
            b: b.clone(),
        };
        for ns in [&h, &a, &b] {
            ip(&["netns", "add", ns])?;
            lab.namespaces.push(ns.clone());
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        ip(&["-n", &h, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &h, "link", "set", "br0", "up"])?;
        for (ns, port, addr) in [(&a, "va", Self::IP_A), (&b, "vb", Self::IP_B)] {
            ip(&[
                "-n", &h, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns,
            ])?;
            ip(&["-n", &h, "link", "set", port, "master", "br0", "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(lab)
    }
}

impl Drop for BridgeLab {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("docknet: warning: removing namespace {ns}: {e:#}");
            }
        }
    }
}
