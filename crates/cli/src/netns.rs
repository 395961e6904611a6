//! Kernel network topologies for baselines, built only inside namespaces this process creates.
//! Names carry the pid and a per-process counter, so parallel or leftover runs never collide;
//! everything is deleted on drop (deleting a namespace removes its links).
//!
//! The container-facing parts of `bridge`, `bridge-nat`, `container` and `macvlan` are built the
//! way a container runtime builds them: by calling the reference CNI plugins (`bridge`,
//! `portmap`, `macvlan`, with `host-local` IPAM) with the CNI 1.0 protocol, run inside the lab's
//! own "host" namespace, and torn down with CNI `DEL` in reverse order. `loopback` and the direct
//! `veth` pair have no CNI plugin that fits (`ptp` routes through the host) and are built with
//! `ip`.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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

/// Runs `cmd` to completion; fails with `what` and its stderr unless it exits 0. Returns its
/// stdout.
pub fn checked(cmd: &mut Command, what: &str) -> Result<Vec<u8>> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out.stdout)
}

/// Runs `ip ARGS...`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    checked(
        Command::new("ip").args(args),
        &format!("ip {}", args.join(" ")),
    )
    .map(drop)
}

/// Kernel modes this lab can build.
pub const KERNEL_MODES: &[&str] = &[
    "loopback",
    "container",
    "veth",
    "bridge",
    "bridge-nat",
    "macvlan",
    "ipvlan",
    "ovs",
];

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
}

/// What to build.
#[derive(Debug, Clone, Copy)]
pub struct LabOpts {
    /// Client/server pairs, each in namespaces of their own (except `loopback`).
    pub pairs: usize,
    /// MTU of the links (ignored by `loopback` and `container`, whose traffic crosses `lo`).
    pub mtu: u32,
}

impl Default for LabOpts {
    fn default() -> Self {
        LabOpts {
            pairs: 1,
            mtu: 1500,
        }
    }
}

/// A kernel container network between client and server namespaces, built inside namespaces
/// this process creates (never touching the machine's interfaces).
#[derive(Debug)]
pub struct KernelLab {
    /// All namespaces created, in creation order.
    pub namespaces: Vec<String>,
    /// The pairs (at least one).
    pub pairs: Vec<Pair>,
    /// How the container links were built: `cni` (reference plugins) or `ip`.
    pub builder: &'static str,
    /// MTU of the links, or of `lo` where traffic crosses only `lo`.
    pub mtu: u32,
    cni: Option<Cni>,
    ovs: Option<Ovs>,
}

/// The lab's subnet (host-local hands out addresses from it; the gateway is the host side).
const SUBNET: &str = "10.66.0.0/16";
const GATEWAY: &str = "10.66.0.254";
const LO_MTU: u32 = 65536;

impl KernelLab {
    /// Address of A in the direct `veth` topology.
    pub const IP_A: &'static str = "10.66.0.1";
    /// Address of B in the direct `veth` topology.
    pub const IP_B: &'static str = "10.66.0.2";

    /// The bridge topology with one pair at MTU 1500 (Docker's default network without port
    /// mapping).
    pub fn create() -> Result<KernelLab> {
        Self::build("bridge", LabOpts::default())
    }

    /// Builds `mode`; on error, removes whatever was built.
    ///
    /// - `loopback`: one namespace, every pair on its `lo`.
    /// - `container`: Docker's container mode: client and server share one container's
    ///   namespace (attached to a bridge with CNI, as Docker would) and talk over its `lo`.
    /// - `veth`: a veth pair straight between client and server.
    /// - `bridge`: every container attached by the CNI `bridge` plugin to one Linux bridge in
    ///   the lab's host namespace, addresses from `host-local`.
    /// - `bridge-nat`: the bridge, plus Docker's `-p` port mapping by the CNI `portmap` plugin on
    ///   each server: the client connects to the host's address and port, which is DNATed to the
    ///   server, and the hairpin is masqueraded.
    /// - `macvlan`: CNI `macvlan` links in bridge mode on a lab-owned parent (one end of a veth
    ///   pair in the host namespace).
    /// - `ipvlan`: the same with CNI `ipvlan` (L2), where the kernel has the module.
    /// - `ovs`: veth pairs from each container to an Open vSwitch bridge with the userspace
    ///   datapath (`datapath_type=netdev`), run by an `ovsdb-server` and `ovs-vswitchd` of the
    ///   lab's own (private database, sockets and logs; in the lab's host namespace).
    pub fn build(mode: &str, opts: LabOpts) -> Result<KernelLab> {
        if !KERNEL_MODES.contains(&mode) {
            bail!("unknown kernel mode {mode:?}: {}", KERNEL_MODES.join(", "));
        }
        if opts.pairs == 0 || opts.pairs > 1000 {
            bail!("pairs must be 1 ..= 1000");
        }
        let base = unique("");
        let mut lab = KernelLab {
            namespaces: Vec::new(),
            pairs: Vec::new(),
            builder: "ip",
            mtu: opts.mtu,
            cni: None,
            ovs: None,
        };
        lab.populate(mode, &base, opts)?;
        Ok(lab)
    }

    fn addns(&mut self, ns: &str) -> Result<()> {
        ip(&["netns", "add", ns])?;
        self.namespaces.push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"])
    }

    fn populate(&mut self, mode: &str, base: &str, opts: LabOpts) -> Result<()> {
        let mtu = opts.mtu.to_string();
        let host = format!("{base}h");
        let port = |i: usize| PORT_BASE + i as u16;
        match mode {
            "loopback" => {
                let ns = format!("{base}a");
                self.addns(&ns)?;
                self.mtu = LO_MTU;
                for i in 0..opts.pairs {
                    self.pairs.push(Pair {
                        client_ns: ns.clone(),
                        server_ns: ns.clone(),
                        target: "127.0.0.1".into(),
                        bind: "127.0.0.1".into(),
                        port: port(i),
                    });
                }
            }
            "veth" => {
                for i in 0..opts.pairs {
                    let (a, b) = (format!("{base}a{i}"), format!("{base}b{i}"));
                    self.addns(&a)?;
                    self.addns(&b)?;
                    ip(&[
                        "-n", &a, "link", "add", "eth0", "mtu", &mtu, "type", "veth", "peer",
                        "name", "eth0", "mtu", &mtu, "netns", &b,
                    ])?;
                    for (ns, ip4) in [(&a, Self::IP_A), (&b, Self::IP_B)] {
                        ip(&["-n", ns, "addr", "add", &format!("{ip4}/24"), "dev", "eth0"])?;
                        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
                    }
                    self.pairs.push(Pair {
                        client_ns: a,
                        server_ns: b,
                        target: Self::IP_B.into(),
                        bind: Self::IP_B.into(),
                        port: port(i),
                    });
                }
            }
            "ovs" => {
                self.addns(&host)?;
                self.builder = "ovs-vsctl";
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
                for i in 0..opts.pairs {
                    let (a, b) = (format!("{base}a{i}"), format!("{base}b{i}"));
                    let (ia, ib) = (
                        format!("10.66.{}.{}", 1 + i / 250, 1 + i % 250),
                        format!("10.66.{}.{}", 101 + i / 250, 1 + i % 250),
                    );
                    for (ns, port, ip4) in
                        [(&a, format!("pa{i}"), &ia), (&b, format!("pb{i}"), &ib)]
                    {
                        self.addns(ns)?;
                        ip(&[
                            "-n", &host, "link", "add", &port, "mtu", &mtu, "type", "veth", "peer",
                            "name", "eth0", "mtu", &mtu, "netns", ns,
                        ])?;
                        ip(&["-n", &host, "link", "set", &port, "up"])?;
                        ip(&["-n", ns, "addr", "add", &format!("{ip4}/16"), "dev", "eth0"])?;
                        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
                        // the userspace datapath forwards through AF_PACKET and does not
                        // finish checksums a veth left to "hardware": compute them in the
                        // container (as OVS's documentation advises for veth ports)
                        checked(
                            Command::new("ip")
                                .args(["netns", "exec", ns, "ethtool", "-K", "eth0", "tx", "off"]),
                            "ethtool -K eth0 tx off (apt-get install ethtool)",
                        )?;
                        ovs.vsctl(&["add-port", "br0", &port])?;
                    }
                    self.pairs.push(Pair {
                        client_ns: a,
                        server_ns: b,
                        target: ib.clone(),
                        bind: ib,
                        port: port(i),
                    });
                }
                self.ovs = Some(ovs);
            }
            "bridge" | "bridge-nat" | "container" | "macvlan" | "ipvlan" => {
                self.addns(&host)?;
                let mut cni = Cni::new(&host, base)?;
                self.builder = "cni";
                let link = if mode == "macvlan" || mode == "ipvlan" {
                    // the lab's own parent link: one end of a veth pair in the host namespace
                    ip(&[
                        "-n", &host, "link", "add", "parent0", "mtu", &mtu, "type", "veth", "peer",
                        "name", "parent1", "mtu", &mtu,
                    ])?;
                    ip(&["-n", &host, "link", "set", "parent0", "up"])?;
                    ip(&["-n", &host, "link", "set", "parent1", "up"])?;
                    let mut c = json!({"type": mode, "master": "parent0", "mtu": opts.mtu,
                        "ipam": cni.ipam()});
                    if mode == "macvlan" {
                        c["mode"] = "bridge".into();
                    } else {
                        c["mode"] = "l2".into();
                    }
                    c
                } else {
                    json!({"type": "bridge", "bridge": "dnbr0", "isGateway": true,
                        "ipMasq": false, "hairpinMode": true, "mtu": opts.mtu,
                        "ipam": cni.ipam()})
                };
                let result = (|| -> Result<()> {
                    for i in 0..opts.pairs {
                        if mode == "container" {
                            let ns = format!("{base}c{i}");
                            self.addns(&ns)?;
                            cni.add(&ns, std::slice::from_ref(&link))?;
                            self.mtu = LO_MTU;
                            self.pairs.push(Pair {
                                client_ns: ns.clone(),
                                server_ns: ns,
                                target: "127.0.0.1".into(),
                                bind: "127.0.0.1".into(),
                                port: port(i),
                            });
                            continue;
                        }
                        let (a, b) = (format!("{base}a{i}"), format!("{base}b{i}"));
                        self.addns(&a)?;
                        cni.add(&a, std::slice::from_ref(&link))?;
                        self.addns(&b)?;
                        let mut chain = vec![link.clone()];
                        if mode == "bridge-nat" {
                            chain.push(json!({"type": "portmap", "snat": true,
                                "capabilities": {"portMappings": true},
                                "runtimeConfig": {"portMappings": [
                                    {"hostPort": port(i), "containerPort": port(i), "protocol": "tcp"}]}}));
                        }
                        let res = cni.add(&b, &chain)?;
                        let server_ip = res["ips"][0]["address"]
                            .as_str()
                            .and_then(|a| a.split('/').next())
                            .context("the CNI result has no address")?
                            .to_string();
                        self.pairs.push(Pair {
                            client_ns: a,
                            server_ns: b,
                            target: if mode == "bridge-nat" {
                                GATEWAY.into()
                            } else {
                                server_ip.clone()
                            },
                            bind: server_ip,
                            port: port(i),
                        });
                    }
                    Ok(())
                })();
                self.cni = Some(cni);
                result?;
            }
            m => bail!("unknown kernel mode {m:?}"),
        }
        Ok(())
    }
}

impl Drop for KernelLab {
    fn drop(&mut self) {
        drop(self.ovs.take());
        if let Some(cni) = self.cni.as_mut() {
            cni.del_all();
        }
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("docknet: warning: removing namespace {ns}: {e:#}");
            }
        }
        if let Some(cni) = self.cni.take() {
            let _ = std::fs::remove_dir_all(&cni.dir);
        }
    }
}

/// An Open vSwitch of the lab's own: `ovsdb-server` and `ovs-vswitchd` as children of this
/// process, with a private directory for the database, sockets, pid files and logs (never
/// /var/run/openvswitch), ended by pid on drop.
#[derive(Debug)]
struct Ovs {
    dir: PathBuf,
    db: PathBuf,
    procs: Vec<std::process::Child>,
}

impl Ovs {
    fn start(host_ns: &str, base: &str) -> Result<Ovs> {
        let dir = std::env::temp_dir().join(format!("{base}-ovs"));
        std::fs::create_dir_all(&dir)?;
        let mut ovs = Ovs {
            db: dir.join("db.sock"),
            dir,
            procs: Vec::new(),
        };
        let d = ovs.dir.clone();
        let conf = d.join("conf.db");
        let schema = ["/usr/share/openvswitch/vswitch.ovsschema"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .context("the Open vSwitch schema is missing (apt-get install openvswitch-switch)")?;
        checked(
            Command::new("ovsdb-tool")
                .arg("create")
                .arg(&conf)
                .arg(schema),
            "ovsdb-tool create",
        )?;
        let opt = |k: &str, f: &str| format!("--{k}={}", d.join(f).display());
        let spawn = |cmd: &mut Command| -> Result<std::process::Child> {
            cmd.env("OVS_RUNDIR", &d)
                .env("OVS_DBDIR", &d)
                .env("OVS_LOGDIR", &d)
                .env("OVS_SYSCONFDIR", &d)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting Open vSwitch")
        };
        ovs.procs.push(spawn(
            Command::new("ovsdb-server")
                .arg(&conf)
                .arg(format!("--remote=punix:{}", ovs.db.display()))
                .arg(opt("unixctl", "ovsdb.ctl"))
                .arg(opt("log-file", "ovsdb.log")),
        )?);
        let t = std::time::Instant::now();
        while !ovs.db.exists() {
            if t.elapsed() > std::time::Duration::from_secs(10) {
                bail!("ovsdb-server did not open {} within 10 s", ovs.db.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        ovs.vsctl(&["--no-wait", "init"])?;
        // in the lab's host namespace, so the bridge's ports are the lab's veths
        ovs.procs.push(spawn(
            Command::new("ip")
                .args(["netns", "exec", host_ns, "ovs-vswitchd"])
                .arg(format!("unix:{}", ovs.db.display()))
                .arg(opt("unixctl", "vswitchd.ctl"))
                .arg(opt("log-file", "vswitchd.log")),
        )?);
        Ok(ovs)
    }

    fn vsctl(&self, args: &[&str]) -> Result<()> {
        checked(
            Command::new("ovs-vsctl")
                .arg(format!("--db=unix:{}", self.db.display()))
                .arg("--timeout=20")
                .args(args)
                .env("OVS_RUNDIR", &self.dir),
            &format!("ovs-vsctl {}", args.join(" ")),
        )
        .map(drop)
    }
}

impl Drop for Ovs {
    fn drop(&mut self) {
        for c in self.procs.iter_mut().rev() {
            terminate(c);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Ends a child of ours: SIGTERM, up to 3 s to exit, then SIGKILL; reaps it.
pub fn terminate(c: &mut std::process::Child) {
    if let Ok(Some(_)) = c.try_wait() {
        return;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(c.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(3) {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// Where the reference CNI plugins live: `$CNI_PATH`, Debian's `/usr/lib/cni`, or the
/// upstream `/opt/cni/bin`.
pub fn cni_plugin_dir() -> Result<PathBuf> {
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

/// A CNI "runtime": calls plugins with the CNI 1.0 protocol inside the lab's host namespace
/// and remembers every attachment, so [`Cni::del_all`] can undo them in reverse order.
#[derive(Debug)]
struct Cni {
    host_ns: String,
    name: String,
    plugins: PathBuf,
    /// Private directory: host-local's leases and nothing else (never /var/lib/cni).
    dir: PathBuf,
    /// (namespace, plugin configurations, results) of each attachment.
    added: Vec<(String, Vec<Value>, Vec<Value>)>,
}

impl Cni {
    fn new(host_ns: &str, base: &str) -> Result<Cni> {
        let plugins = cni_plugin_dir()?;
        let dir = std::env::temp_dir().join(format!("{base}-cni"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Cni {
            host_ns: host_ns.into(),
            name: format!("{base}net"),
            plugins,
            dir,
            added: Vec::new(),
        })
    }

    fn ipam(&self) -> Value {
        json!({"type": "host-local", "dataDir": self.dir.join("ipam"),
            "ranges": [[{"subnet": SUBNET, "gateway": GATEWAY}]]})
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
    fn add(&mut self, ns: &str, confs: &[Value]) -> Result<Value> {
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

    /// CNI DEL of every attachment, newest first, each chain in reverse.
    fn del_all(&mut self) {
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

/// Why a mode cannot be measured on this machine, if it cannot (checked, not assumed).
pub fn unavailable(mode: &str) -> Option<String> {
    match mode {
        "bridge" | "bridge-nat" | "container" | "macvlan" | "ipvlan" => {
            if let Err(e) = cni_plugin_dir() {
                return Some(format!("{e:#}"));
            }
            if mode == "bridge-nat" && Command::new("iptables").arg("-V").output().is_err() {
                return Some(
                    "the CNI portmap plugin needs iptables (apt-get install iptables)".into(),
                );
            }
            if mode != "ipvlan" {
                return None;
            }
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
        "ovs" => [
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
