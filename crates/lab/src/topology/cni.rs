//! A CNI "runtime": calls the reference plugins with the CNI 1.0 protocol inside the lab's
//! host namespace and remembers every attachment, so [`Cni::del_all`] can undo them in reverse
//! order. `host-local` keeps its leases in a private directory, never /var/lib/cni.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The lab's subnet (host-local hands out addresses from it; the gateway is the host side).
pub const SUBNET: &str = "10.66.0.0/16";
/// The host side of the lab's subnet (bridge-nat's clients connect to it).
pub const GATEWAY: &str = "10.66.0.254";

/// Where the reference CNI plugins live: `$CNI_PATH`, Debian's `/usr/lib/cni`, or the
/// upstream `/opt/cni/bin`.
pub fn plugin_dir() -> Result<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("CNI_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend([PathBuf::from("/usr/lib/cni"), PathBuf::from("/opt/cni/bin")]);
    dirs.into_iter()
        .find(|d| d.join("bridge").is_file() && d.join("host-local").is_file())
        .context(
            "the reference CNI plugins are not installed (apt-get install containernetworking-plugins)",
        )
}

/// One attachment: its namespace, plugin chain and the results of its ADDs.
type Attachment = (String, Vec<Value>, Vec<Value>);

/// The addresses host-local hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// Subnet (`10.66.0.0/16`).
    pub subnet: String,
    /// Gateway, if the subnet has one.
    pub gateway: Option<String>,
    /// First and last address handed out, if not the whole subnet.
    pub span: Option<(String, String)>,
    /// Give the containers a default route through the gateway.
    pub default_route: bool,
    /// An IPv6 subnet to hand out addresses from as well (dual stack), if any.
    pub subnet6: Option<String>,
}

impl Range {
    /// The lab's one-host subnet, with the host side as gateway.
    pub fn lab() -> Range {
        Range {
            subnet: SUBNET.into(),
            gateway: Some(GATEWAY.into()),
            span: None,
            default_route: false,
            subnet6: None,
        }
    }
}

/// The runtime.
#[derive(Debug)]
pub struct Cni {
    host_ns: String,
    name: String,
    plugins: PathBuf,
    /// Private directory: host-local's leases and nothing else.
    pub dir: PathBuf,
    added: Vec<Attachment>,
    range: Range,
}

impl Cni {
    /// A runtime calling plugins inside `host_ns`, with a private directory named after `base`.
    pub fn new(host_ns: &str, base: &str) -> Result<Cni> {
        Cni::with_range(host_ns, base, Range::lab())
    }

    /// The same, handing out addresses from `range`.
    pub fn with_range(host_ns: &str, base: &str, range: Range) -> Result<Cni> {
        let plugins = plugin_dir()?;
        let dir = std::env::temp_dir().join(format!("{base}-cni"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Cni {
            host_ns: host_ns.into(),
            name: format!("{base}net"),
            plugins,
            dir,
            added: Vec::new(),
            range,
        })
    }

    /// A runtime calling the plugins in `plugins` (the ones a node installed, not the reference
    /// plugins) for the network `network` (a conflist's name), with each plugin's configuration
    /// given whole to [`Cni::add`].
    pub fn with_plugins(host_ns: &str, base: &str, plugins: PathBuf, network: &str) -> Result<Cni> {
        let dir = std::env::temp_dir().join(format!("{base}-cni"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Cni {
            host_ns: host_ns.into(),
            name: network.into(),
            plugins,
            dir,
            added: Vec::new(),
            range: Range::lab(),
        })
    }

    /// host-local IPAM over the runtime's range.
    pub fn ipam(&self) -> Value {
        let mut r = json!({"subnet": self.range.subnet});
        if let Some(g) = &self.range.gateway {
            r["gateway"] = g.clone().into();
        }
        if let Some((a, b)) = &self.range.span {
            r["rangeStart"] = a.clone().into();
            r["rangeEnd"] = b.clone().into();
        }
        let mut ranges = vec![json!([r])];
        if let Some(s6) = &self.range.subnet6 {
            ranges.push(json!([{ "subnet": s6 }]));
        }
        let mut ipam =
            json!({"type": "host-local", "dataDir": self.dir.join("ipam"), "ranges": ranges});
        if self.range.default_route {
            ipam["routes"] = json!([{"dst": "0.0.0.0/0"}]);
        }
        ipam
    }

    /// Runs `plugin` for `command` on `ns` with `conf` on stdin; returns its JSON result.
    fn exec(&self, command: &str, ns: &str, conf: &Value) -> Result<Value> {
        let plugin = conf["type"].as_str().unwrap_or_default();
        let path = self.plugins.join(plugin);
        if !path.is_file() {
            bail!(
                "CNI plugin {plugin} not found in {}",
                self.plugins.display()
            );
        }
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.host_ns])
            .arg(&path)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", ns)
            .env("CNI_NETNS", Path::new("/var/run/netns").join(ns))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.plugins)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running CNI plugin {plugin}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(&serde_json::to_vec(conf)?)?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            let err: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            bail!(
                "CNI {plugin} {command} for {ns}: {} {}",
                err["msg"].as_str().unwrap_or(""),
                err["details"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string())
            );
        }
        if out.stdout.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&out.stdout)
            .with_context(|| format!("CNI {plugin} printed no JSON result"))
    }

    fn full(&self, conf: &Value, prev: Option<&Value>) -> Value {
        let mut c = conf.clone();
        c["cniVersion"] = "1.0.0".into();
        c["name"] = self.name.clone().into();
        if let Some(p) = prev.filter(|p| !p.is_null()) {
            c["prevResult"] = p.clone();
        }
        c
    }

    /// Attaches `ns` with the plugin chain `confs` (ADD in order, each given the previous
    /// result); returns the last result.
    pub fn add(&mut self, ns: &str, confs: &[Value]) -> Result<Value> {
        let mut results: Vec<Value> = Vec::new();
        let mut prev = Value::Null;
        for c in confs {
            let full = self.full(c, Some(&prev));
            match self.exec("ADD", ns, &full) {
                Ok(r) => {
                    results.push(r.clone());
                    prev = r;
                }
                Err(e) => {
                    // record what was added, so drop deletes it
                    self.added
                        .push((ns.into(), confs[..results.len()].to_vec(), results));
                    return Err(e);
                }
            }
        }
        self.added.push((ns.into(), confs.to_vec(), results));
        Ok(prev)
    }

    /// Whether `ns` has an attachment of this runtime.
    pub fn has(&self, ns: &str) -> bool {
        self.added.iter().any(|(n, _, _)| n == ns)
    }

    /// Chains one more plugin onto `ns`'s attachment (ADD with the attachment's last result as
    /// `prevResult`), as a runtime would have had it been in the chain from the start.
    pub fn add_more(&mut self, ns: &str, conf: &Value) -> Result<Value> {
        let i = self
            .added
            .iter()
            .rposition(|(n, _, _)| n == ns)
            .with_context(|| format!("{ns} has no CNI attachment"))?;
        let prev = self.added[i].2.last().cloned().unwrap_or(Value::Null);
        let full = self.full(conf, Some(&prev));
        let r = self.exec("ADD", ns, &full)?;
        // DEL of a chained plugin is given the chain's last result
        let r = if r.is_null() { prev } else { r };
        self.added[i].1.push(conf.clone());
        self.added[i].2.push(r.clone());
        Ok(r)
    }

    /// Undoes the last [`Cni::add_more`] on `ns` (DEL of that plugin alone).
    pub fn del_last(&mut self, ns: &str) -> Result<()> {
        let i = self
            .added
            .iter()
            .rposition(|(n, _, _)| n == ns)
            .with_context(|| format!("{ns} has no CNI attachment"))?;
        let entry = &mut self.added[i];
        if entry.1.len() < 2 {
            anyhow::bail!("{ns}: nothing chained to remove");
        }
        let conf = entry.1.pop().unwrap_or_default();
        let last = entry.2.pop();
        let full = self.full(&conf, last.as_ref());
        self.exec("DEL", ns, &full)?;
        if conf["type"] == "bandwidth" {
            // its DEL removes the ifb but leaves the ingress qdisc that redirects the host
            // veth to it (a runtime deletes the veth next); the next ADD needs it gone
            let host_links = last
                .iter()
                .flat_map(|r| r["interfaces"].as_array().cloned().unwrap_or_default())
                .filter(|i| i.get("sandbox").is_none())
                .filter_map(|i| i["name"].as_str().map(String::from));
            for dev in host_links {
                let _ = Command::new("ip")
                    .args(["netns", "exec", &self.host_ns, "tc", "qdisc", "del", "dev"])
                    .args([dev.as_str(), "ingress"])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        Ok(())
    }

    /// CNI DEL of every attachment, newest first, each chain in reverse.
    pub fn del_all(&mut self) {
        while let Some((ns, confs, results)) = self.added.pop() {
            let last = results.last().cloned();
            for c in confs.iter().rev() {
                let full = self.full(c, last.as_ref());
                if let Err(e) = self.exec("DEL", &ns, &full) {
                    eprintln!("docknet: warning: {e:#}");
                }
            }
        }
    }
}

/// The first IPv6 address of a CNI result, without its prefix, if it has one.
pub fn first_address6(result: &Value) -> Option<String> {
    result["ips"]
        .as_array()?
        .iter()
        .filter_map(|ip| ip["address"].as_str()?.split('/').next())
        .find(|a| a.contains(':'))
        .map(String::from)
}

/// The first address of a CNI result, without its prefix.
pub fn first_address(result: &Value) -> Result<String> {
    result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .map(String::from)
        .context("the CNI result has no address")
}
