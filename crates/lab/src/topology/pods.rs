//! DockNet pods on two hosts as a Kubernetes node makes them (`docknet-pods`). On each host the
//! lab runs what the DaemonSet runs: the CNI plugin installed by `docknet-cni-install`, and the
//! node agent (`docknet-agent --nodes --kernel-routes`, one pass), which routes the other
//! host's pod network through that host's address (in the daemon, and in the host's kernel) and
//! writes the node's conflist (addresses from the node's own pod network). Each pod is a network namespace of its own that the plugin attaches (ADD, as
//! containerd calls it, with the conflist the agent wrote). Removed on drop: DEL of every pod,
//! its namespace, the hosts' files; the daemons go after.

use super::cni::{first_address, Cni};
use super::daemon::Daemon;
use super::wire::{Wire, HOST_A, HOST_B};
use crate::proc::{checked, unique, Netns};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The cluster's pod network: host A's pods take 10.78.1.0/24, host B's 10.78.2.0/24 (the
/// addresses of the lab's other DockNet modes, so the workloads find them where they look).
pub const CLUSTER: &str = "10.78.0.0/16";

/// The Go programs a node runs.
const PROGRAMS: [&str; 4] = [
    "docknet-cni",
    "docknet-cni-install",
    "docknet-agent",
    "host-local",
];

/// Where the Go programs are: `$DOCKNET_CNI_BIN`, else `bin/` of the checkout the `docknet`
/// binary `exe` was built in (`target/release/docknet` beside `bin/`, where
/// `scripts/setup.sh` puts them).
pub fn bin_dir(exe: &Path) -> PathBuf {
    match std::env::var_os("DOCKNET_CNI_BIN") {
        Some(d) => PathBuf::from(d),
        None => exe
            .parent()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .unwrap_or(Path::new("."))
            .join("bin"),
    }
}

/// Why the mode cannot be built here: a program missing.
pub fn missing(exe: &Path) -> Option<String> {
    let dir = bin_dir(exe);
    PROGRAMS.iter().find(|p| !dir.join(p).is_file()).map(|p| {
        format!(
            "{} is missing (scripts/setup.sh builds the CNI plugin and the node agent; \
                 DOCKNET_CNI_BIN says where they are)",
            dir.join(p).display()
        )
    })
}

/// One pod: its namespace (the plugin's container ID, so its pipe's name) and its address.
#[derive(Debug)]
pub struct Pod {
    /// Its network namespace.
    pub ns: Netns,
    /// Its address, as the plugin's result gave it.
    pub ip: Ipv4Addr,
}

/// The pods of both hosts, and each host's CNI runtime.
#[derive(Debug)]
pub struct Pods {
    runtimes: Vec<Cni>,
    /// The lab's pipe names (`c0`, `s0`, ...) to the pods that stand for them.
    pods: HashMap<String, Pod>,
    dir: PathBuf,
}

impl Pods {
    /// Sets both hosts up as nodes of one cluster and attaches `pairs` client pods on host A
    /// (`daemons[0]`'s) and server pods on host B; pod `i` of each side must get the address
    /// `want(side, i)` gives (host-local hands them out in order).
    pub fn build(
        exe: &Path,
        wire: &Wire,
        daemons: [&Daemon; 2],
        pairs: usize,
        mtu: u32,
        want: impl Fn(bool, usize) -> Ipv4Addr,
    ) -> Result<Pods> {
        if pairs > 250 {
            bail!("docknet-pods: at most 250 pairs (one /24 per host)");
        }
        if let Some(why) = missing(exe) {
            bail!("{why}");
        }
        let bins = bin_dir(exe);
        let dir = std::env::temp_dir().join(unique("pods"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut pods = Pods {
            runtimes: Vec::new(),
            pods: HashMap::new(),
            dir: dir.clone(),
        };
        let nodes = [
            ("a", &wire.host_a, HOST_A, "10.78.1.0/24", daemons[0]),
            ("b", &wire.host_b, HOST_B, "10.78.2.0/24", daemons[1]),
        ];
        let list: Vec<Value> = nodes
            .iter()
            .map(|(name, _, addr, cidr, _)| json!({"name": name, "address": addr, "podCIDRs": [cidr]}))
            .collect();
        let nodes_file = dir.join("nodes.json");
        std::fs::write(&nodes_file, Value::Array(list).to_string())?;
        for (name, ns, _, _, daemon) in nodes {
            let node = dir.join(name);
            let conf = node.join("conf/10-docknet.conflist");
            // the DaemonSet's init container: the plugin and host-local into the node's bin dir
            let mut install = Command::new(bins.join("docknet-cni-install"));
            install
                .arg("--from")
                .arg(&bins)
                .arg("--bin-dir")
                .arg(node.join("bin"))
                .arg("--conf-dir")
                .arg(node.join("conf"))
                .args(["--plugins", "docknet-cni,host-local", "--subnet", CLUSTER])
                .arg("--daemon-socket")
                .arg(&daemon.socket)
                .arg("--no-conf");
            checked(&mut install, &format!("docknet-cni-install on host {name}"))?;
            // the node agent, in the node's namespace as the DaemonSet runs it: the daemon's
            // routes to the other node's pods, the node's own kernel routes to them, and this
            // node's conflist
            let mut agent = Command::new("ip");
            agent
                .args(["netns", "exec", ns])
                .arg(bins.join("docknet-agent"))
                .args(["--once", "--kernel-routes", "--node-name", name])
                .args(["--cluster-cidr", CLUSTER])
                .arg("--nodes")
                .arg(&nodes_file)
                .arg("--socket")
                .arg(&daemon.socket)
                .arg("--cni-conf")
                .arg(&conf)
                .args(["--mtu", &mtu.to_string()])
                .arg("--ipam-data-dir")
                .arg(node.join("ipam"))
                .arg("--device-info-dir")
                .arg(node.join("devinfo"));
            checked(&mut agent, &format!("docknet-agent on host {name}"))?;
            let list: Value = serde_json::from_slice(
                &std::fs::read(&conf).with_context(|| format!("the agent's {}", conf.display()))?,
            )
            .with_context(|| format!("reading {}", conf.display()))?;
            let entry = list["plugins"][0].clone();
            if entry["type"] != "docknet" {
                bail!("{}: no docknet plugin in it", conf.display());
            }
            let network = list["name"].as_str().unwrap_or("docknet");
            pods.runtimes.push(Cni::with_plugins(
                ns,
                &unique(&format!("pods{name}")),
                node.join("bin"),
                network,
            )?);
            let client = name == "a";
            for i in 0..pairs {
                let pod = Netns::add("pod")?;
                let rt = pods.runtimes.last_mut().context("a runtime")?;
                let result = rt
                    .add(&pod.0, std::slice::from_ref(&entry))
                    .with_context(|| format!("CNI ADD of pod {i} on host {name}"))?;
                let ip: Ipv4Addr = first_address(&result)?.parse()?;
                if ip != want(client, i) {
                    bail!(
                        "pod {i} on host {name} got {ip}, the lab expected {}",
                        want(client, i)
                    );
                }
                let pipe = format!("{}{i}", if client { 'c' } else { 's' });
                pods.pods.insert(pipe, Pod { ns: pod, ip });
            }
        }
        Ok(pods)
    }

    /// The pod that stands for the lab's pipe `name` (`c0`, `s0`, ...).
    pub fn pod(&self, name: &str) -> Option<&Pod> {
        self.pods.get(name)
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        // DEL first (the plugin asks the daemon to remove each pipe), then the namespaces
        for rt in &mut self.runtimes {
            rt.del_all();
            let _ = std::fs::remove_dir_all(&rt.dir);
        }
        self.pods.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_go_programs_are_found_beside_the_checkout_or_where_told() {
        let exe = Path::new("/src/dn/target/release/docknet");
        if std::env::var_os("DOCKNET_CNI_BIN").is_none() {
            assert_eq!(bin_dir(exe), Path::new("/src/dn/bin"));
            let why = missing(exe).unwrap();
            assert!(why.contains("/src/dn/bin/docknet-cni") && why.contains("setup.sh"));
        }
    }
}
