//! The link's guard: keeps the host's kernel from taking in frames that are the daemon's, on a
//! link the daemon drives through a packet socket (AF_PACKET: the `--nic` link in `packet`
//! mode, and the host link).
//!
//! A packet socket is a tap, not a diversion: the host's kernel receives its own copy of every
//! frame the daemon takes. For a frame addressed to a pipe that copy is not the kernel's, and a
//! host with forwarding on (a Kubernetes node has it on) routes it on: on a node's NIC to its
//! default gateway, which may route it back to the node (the pods' network is there), once per
//! hop of its TTL; on the host link back out of the node's end to the daemon. The guard is an
//! nftables chain on the link's ingress hook (table `netdev docknet_guard_DEV`): taps see a
//! frame before that hook, so the daemon still gets everything, and the kernel does not.
//!
//! - [`Guard::all`] drops every frame (the daemon's end of the host link is the daemon's alone);
//! - [`Guard::pipes`] drops IPv4 frames to the pipes' addresses, a set the control plane keeps
//!   equal to the pipes ([`Guard::set_pipes`]); the rest of the link's traffic stays the
//!   host's.
//!
//! AF_XDP needs none: its flow director redirects the pipes' frames, so the kernel never sees
//! them. Turning forwarding off on the device is not enough: writing `net.ipv4.ip_forward`, as
//! a node's other software does at any time, turns it on again on every device.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// Runs `prog args...` (from the Debian package `package`); its error output on failure.
pub(super) fn run(prog: &str, package: &str, args: &[&str]) -> Result<(), String> {
    run_with(prog, package, args, None)
}

/// Runs an nftables script (`nft -f -`): applied whole or not at all.
fn nft_script(script: &str) -> Result<(), String> {
    run_with("nft", "nftables", &["-f", "-"], Some(script))
}

/// [`run`], with `input` on its standard input.
fn run_with(prog: &str, package: &str, args: &[&str], input: Option<&str>) -> Result<(), String> {
    let line = format!("{prog} {}", args.join(" "));
    let mut c = Command::new(prog)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {line}: {e} (apt-get install {package})"))?;
    if let (Some(text), Some(mut i)) = (input, c.stdin.take()) {
        i.write_all(text.as_bytes())
            .map_err(|e| format!("writing to {prog}: {e}"))?;
    }
    let o = c.wait_with_output().map_err(|e| format!("{line}: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{line}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// The table that guards link `dev`.
fn table(dev: &str) -> String {
    let safe: String = dev
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("docknet_guard_{safe}")
}

/// A link's guard, removed when dropped.
#[derive(Debug)]
pub struct Guard {
    table: String,
    /// The pipes' addresses in the set (`None`: the chain drops everything).
    pipes: Option<BTreeSet<Ipv4Addr>>,
}

impl Guard {
    /// Drops every frame the kernel would take in on `dev`.
    pub fn all(dev: &str) -> Result<Guard, String> {
        Guard::make(dev, false)
    }

    /// Drops IPv4 frames to the pipes' addresses on `dev` (none until [`Guard::set_pipes`]).
    pub fn pipes(dev: &str) -> Result<Guard, String> {
        Guard::make(dev, true)
    }

    fn make(dev: &str, pipes: bool) -> Result<Guard, String> {
        let table = table(dev);
        // one a killed daemon left
        let _ = run("nft", "nftables", &["delete", "table", "netdev", &table]);
        let body = if pipes {
            "set pipes { type ipv4_addr; }\n    chain in { type filter hook ingress device \
             \"DEV\" priority 0; ip daddr @pipes drop; }"
        } else {
            "chain in { type filter hook ingress device \"DEV\" priority 0; policy drop; }"
        }
        .replace("DEV", dev);
        nft_script(&format!("table netdev {table} {{\n    {body}\n}}\n"))?;
        Ok(Guard {
            table,
            pipes: pipes.then(BTreeSet::new),
        })
    }

    /// Keeps the set equal to `ips` (nothing to do for a guard that drops everything). A
    /// failure is logged and the change tried again at the next call.
    pub fn set_pipes(&mut self, ips: impl IntoIterator<Item = Ipv4Addr>) {
        let Some(have) = &self.pipes else { return };
        let want: BTreeSet<Ipv4Addr> = ips.into_iter().collect();
        if &want == have {
            return;
        }
        let mut script = format!("flush set netdev {} pipes\n", self.table);
        if !want.is_empty() {
            let list: Vec<String> = want.iter().map(Ipv4Addr::to_string).collect();
            script += &format!(
                "add element netdev {} pipes {{ {} }}\n",
                self.table,
                list.join(", ")
            );
        }
        match nft_script(&script) {
            Ok(()) => self.pipes = Some(want),
            Err(e) => tracing::warn!("the link's guard: {e}"),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Err(e) = run(
            "nft",
            "nftables",
            &["delete", "table", "netdev", &self.table],
        ) {
            tracing::warn!("removing the link's guard: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_name_is_the_devices_in_letters_nftables_takes() {
        assert_eq!(table("dn-0.x"), "docknet_guard_dn_0_x");
        assert_eq!(table("eth0"), "docknet_guard_eth0");
    }
}
