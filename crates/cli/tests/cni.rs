//! The CNI plugin (`bin/docknet-cni`, built by scripts/setup.sh from `cni/`) under `cnitool`
//! and called directly as a runtime would: every verb, the error codes, a daemon restart, GC
//! with a partial list, the bandwidth capability, fast channels between pods that ask for
//! them, the chained mode after `bridge`, and TCP between pods over their pipes.
//!
//! Each test runs a private daemon, makes its own network namespaces (unique names), keeps
//! host-local's leases, the configuration and device-info files in a private directory, and
//! runs the plugins inside a "host" namespace of its own, so `bridge` never touches the real
//! host. Everything is removed on drop, also when a test fails.

mod common;
use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const DNPERF: &str = env!("CARGO_BIN_EXE_dnperf");
static SEQ: AtomicU32 = AtomicU32::new(0);

/// True when the CNI tests can run: root, and the binaries scripts/setup.sh builds.
fn ready(name: &str) -> bool {
    bins_or_skip(
        name,
        &["docknet", "docknet-cni", "host-local", "bridge", "cnitool"],
    )
}

/// A CNI runtime for one test: a daemon, a host namespace, pod namespaces, a network.
struct Runtime {
    lab: Lab,
    /// Private directory: conflists, host-local's leases, device-info files, libcni's cache.
    dir: PathBuf,
    host: String,
    pods: Vec<String>,
    net: String,
    tag: String,
}

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("ip");
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

impl Runtime {
    fn new(idle: &str) -> Runtime {
        Runtime::with_daemon(idle, &[])
    }

    /// A runtime whose daemon gets `extra` arguments too.
    fn with_daemon(idle: &str, extra: &[&str]) -> Runtime {
        let tag = format!(
            "{}{}",
            std::process::id() % 100_000,
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(format!("dncni-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("conf")).unwrap();
        let host = format!("dncni-h{tag}");
        ip(&["netns", "add", &host]);
        ip(&["-n", &host, "link", "set", "lo", "up"]);
        let rt = Runtime {
            lab: Lab::start_with(idle, extra),
            dir,
            host,
            pods: Vec::new(),
            net: format!("dn{tag}"),
            tag,
        };
        rt.write_conf(&rt.docknet_entry(), None);
        rt
    }

    /// The plugin's entry in a conflist.
    fn docknet_entry(&self) -> Value {
        json!({
            "type": "docknet",
            "daemonSocket": path_of(&self.lab.socket),
            "deviceInfoDir": path_of(&self.dir.join("devinfo")),
            "capabilities": {"bandwidth": true, "io.kubernetes.cri.pod-annotations": true,
                             "CNIDeviceInfoFile": true},
            "ipam": {"type": "host-local", "dataDir": path_of(&self.dir.join("ipam")),
                     "ranges": [[{"subnet": "10.71.0.0/24"}]]}
        })
    }

    /// Writes the network's conflist (DockNet alone, or after `before`).
    fn write_conf(&self, docknet: &Value, before: Option<Value>) {
        let mut plugins: Vec<Value> = before.into_iter().collect();
        plugins.push(docknet.clone());
        let conf = json!({"cniVersion": "1.1.0", "name": self.net, "plugins": plugins});
        std::fs::write(
            self.dir.join("conf").join(format!("{}.conflist", self.net)),
            conf.to_string(),
        )
        .unwrap();
    }

    /// A fresh pod namespace; its path.
    fn pod(&mut self) -> String {
        let name = format!("dncni-p{}-{}", self.tag, self.pods.len());
        ip(&["netns", "add", &name]);
        self.pods.push(name.clone());
        format!("/var/run/netns/{name}")
    }

    /// The container ID cnitool gives a namespace (a hash of its path).
    fn container_id(netns: &str) -> String {
        let mut c = Command::new("sha512sum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(netns.as_bytes()).unwrap();
        let o = c.wait_with_output().unwrap();
        format!("cnitool-{}", &String::from_utf8(o.stdout).unwrap()[..20])
    }

    fn env(&self, c: &mut Command) {
        c.env("CNI_PATH", bin_dir())
            .env("NETCONFPATH", self.dir.join("conf"))
            .env_remove("CNI_ARGS")
            .env_remove("CAP_ARGS");
    }

    /// `cnitool VERB NET NETNS` in the host namespace, with extra environment.
    fn cnitool(&self, verb: &str, netns: &str, extra: &[(&str, &str)]) -> Output {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.host])
            .arg(bin_dir().join("cnitool"))
            .args([verb, &self.net, netns]);
        self.env(&mut c);
        for (k, v) in extra {
            c.env(k, v);
        }
        c.output().expect("cnitool")
    }

    fn cnitool_ok(&self, verb: &str, netns: &str, extra: &[(&str, &str)]) -> String {
        let o = self.cnitool(verb, netns, extra);
        assert!(
            o.status.success(),
            "cnitool {verb} {netns}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// Runs the plugin as a runtime would, with exactly `env` (plus CNI_PATH unless given) and
    /// `stdin`; its exit status and stdout as JSON (null when empty).
    fn plugin(&self, env: &[(&str, &str)], stdin: &[u8]) -> (bool, Value) {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.host])
            .arg(bin_dir().join("docknet-cni"))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !env.iter().any(|(k, _)| *k == "CNI_PATH") {
            c.env("CNI_PATH", bin_dir());
        }
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap();
        let mut w = child.stdin.take().unwrap();
        // the plugin may refuse before reading everything
        let _ = w.write_all(stdin);
        drop(w);
        let o = child.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let v = if out.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&out)
                .unwrap_or_else(|e| panic!("plugin stdout is not JSON ({e}): {out:?}"))
        };
        (o.status.success(), v)
    }

    /// The plugin's configuration as a runtime hands it over (one plugin of the conflist).
    fn plugin_conf(&self, extra: Value) -> Vec<u8> {
        let mut c = self.docknet_entry();
        c["cniVersion"] = json!("1.1.0");
        c["name"] = json!(self.net);
        if let (Some(o), Some(e)) = (c.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                o.insert(k.clone(), v.clone());
            }
        }
        c.to_string().into_bytes()
    }

    /// The CNI error code of a failed plugin run.
    fn code(&self, env: &[(&str, &str)], stdin: &[u8]) -> u64 {
        let (ok, v) = self.plugin(env, stdin);
        assert!(!ok, "expected a failure for {env:?}, got {v}");
        v["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {v}"))
    }

    fn pipes(&self) -> Vec<Value> {
        self.lab
            .json(&["pipe", "ls", "--json"])
            .as_array()
            .unwrap()
            .clone()
    }

    fn pipe(&self, name: &str) -> Option<Value> {
        self.pipes().into_iter().find(|p| p["name"] == name)
    }

    /// The address host-local leased for a container, if any.
    fn leases(&self) -> Vec<String> {
        let d = self.dir.join("ipam").join(&self.net);
        let mut v: Vec<String> = std::fs::read_dir(d)
            .map(|r| {
                r.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("10."))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn devinfo_files(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.join("devinfo"))
            .map(|r| {
                r.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        for p in self.pods.iter().chain([&self.host]) {
            let _ = Command::new("ip").args(["netns", "del", p]).output();
        }
        // libcni keeps results under /var/lib/cni/results/NET-ID-IFNAME
        if let Ok(r) = std::fs::read_dir("/var/lib/cni/results") {
            for e in r.flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{}-", self.net))
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        // and the directories, if libcni made them for us and nobody else keeps anything there
        let _ = std::fs::remove_dir("/var/lib/cni/results");
        let _ = std::fs::remove_dir("/var/lib/cni");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A command of the ADD/DEL/CHECK kind for the plugin, by hand.
fn verb_env<'a>(verb: &'a str, id: &'a str, netns: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("CNI_COMMAND", verb),
        ("CNI_CONTAINERID", id),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
    ]
}

#[test]
fn cnitool_add_check_del_status_and_repeated_del() {
    if !ready("cnitool ADD/CHECK/DEL/STATUS") {
        return;
    }
    let mut rt = Runtime::new("adaptive");
    let ns = rt.pod();
    let id = Runtime::container_id(&ns);
    rt.cnitool_ok("status", &ns, &[]);
    let res: Value = serde_json::from_str(&rt.cnitool_ok("add", &ns, &[])).unwrap();
    assert_eq!(res["cniVersion"], "1.1.0", "{res}");
    let ifc = &res["interfaces"][0];
    assert_eq!(ifc["name"], "eth0", "{res}");
    assert_eq!(ifc["sandbox"], ns.as_str(), "{res}");
    assert_eq!(ifc["socketPath"], "@docknet/pipe", "{res}");
    let addr = res["ips"][0]["address"].as_str().unwrap().to_string();
    assert!(addr.starts_with("10.71.0."), "{res}");
    assert_eq!(res["ips"][0]["interface"], 0, "{res}");

    // the pipe is named after the container, carries the plugin's labels, is attached
    let p = rt
        .pipe(&id)
        .unwrap_or_else(|| panic!("no pipe {id}: {:?}", rt.pipes()));
    assert_eq!(p["ip"], addr.as_str(), "{p}");
    assert_eq!(p["mac"], ifc["mac"], "{p}");
    assert_eq!(p["socket"], "@docknet/pipe", "{p}");
    assert_eq!(p["labels"]["docknet.io/owner"], "docknet-cni", "{p}");
    assert_eq!(p["labels"]["cni.dev/network"], rt.net.as_str(), "{p}");
    assert_eq!(p["labels"]["cni.dev/ifname"], "eth0", "{p}");
    assert_eq!(rt.leases(), [addr.split('/').next().unwrap()]);

    // the NPWG device-info record
    let files = rt.devinfo_files();
    assert_eq!(files, [format!("{}-{id}-eth0-device.json", rt.net)]);
    let rec: Value =
        serde_json::from_slice(&std::fs::read(rt.dir.join("devinfo").join(&files[0])).unwrap())
            .unwrap();
    assert_eq!(
        rec,
        json!({"type": "memif", "version": "1.1.0",
               "memif": {"role": "slave", "path": "@docknet/pipe", "mode": "ethernet"}})
    );

    // a second ADD of the attachment is refused and leaves the live one as it was
    let conf = rt.plugin_conf(json!({}));
    assert_eq!(rt.code(&verb_env("ADD", &id, &ns), &conf), 102);
    assert_eq!(rt.leases(), [addr.split('/').next().unwrap()]);
    rt.cnitool_ok("check", &ns, &[]);
    // a CHECK against a result that does not match fails with DockNet's code
    let mut forged = res.clone();
    forged["ips"][0]["address"] = json!("10.71.0.200/24");
    let conf = rt.plugin_conf(json!({"prevResult": forged}));
    assert_eq!(rt.code(&verb_env("CHECK", &id, &ns), &conf), 104);

    rt.cnitool_ok("del", &ns, &[]);
    assert!(
        rt.pipe(&id).is_none(),
        "DEL left the pipe: {:?}",
        rt.pipes()
    );
    assert!(rt.leases().is_empty(), "DEL left the lease");
    assert!(
        rt.devinfo_files().is_empty(),
        "DEL left the device-info file"
    );
    // DEL again, through cnitool and by hand with and without an (empty) prevResult
    rt.cnitool_ok("del", &ns, &[]);
    for extra in [json!({}), json!({"prevResult": {"cniVersion": "1.1.0"}})] {
        let (ok, out) = rt.plugin(&verb_env("DEL", &id, &ns), &rt.plugin_conf(extra));
        assert!(ok, "repeated DEL failed: {out}");
    }
    // CHECK now: no pipe
    let conf = rt.plugin_conf(json!({"prevResult": res}));
    assert_eq!(rt.code(&verb_env("CHECK", &id, &ns), &conf), 103);
    // ADD again in the same namespace at once: its socket name is free again
    rt.cnitool_ok("add", &ns, &[]);
    rt.cnitool_ok("del", &ns, &[]);
    assert!(rt.pipes().is_empty());
}

#[test]
fn del_after_a_daemon_restart_and_codes_while_it_is_down() {
    if !ready("DEL after a daemon restart") {
        return;
    }
    let mut rt = Runtime::new("adaptive");
    let ns = rt.pod();
    let id = Runtime::container_id(&ns);
    rt.cnitool_ok("add", &ns, &[]);
    rt.lab.kill_daemon();
    // the daemon is down: ADD and DEL say "try again later", STATUS "not available";
    // nothing is released meanwhile
    let ns2 = rt.pod();
    let conf = rt.plugin_conf(json!({}));
    assert_eq!(rt.code(&verb_env("ADD", "other", &ns2), &conf), 11);
    assert_eq!(rt.code(&verb_env("DEL", &id, &ns), &conf), 11);
    assert_eq!(rt.code(&[("CNI_COMMAND", "STATUS")], &conf), 50);
    assert_eq!(
        rt.leases().len(),
        1,
        "a lease was released while the daemon was down"
    );
    let st = rt.cnitool("status", &ns, &[]);
    assert!(!st.status.success());
    // the restarted daemon adopts the pipe; CHECK holds, DEL removes it
    rt.lab.start_daemon();
    assert!(rt.pipe(&id).is_some(), "pipe not adopted: {:?}", rt.pipes());
    rt.cnitool_ok("check", &ns, &[]);
    rt.cnitool_ok("del", &ns, &[]);
    assert!(rt.pipes().is_empty(), "{:?}", rt.pipes());
    assert!(rt.leases().is_empty());
    rt.cnitool_ok("del", &ns, &[]);
}

#[test]
fn gc_removes_only_this_networks_pipes_missing_from_the_valid_list() {
    if !ready("GC") {
        return;
    }
    let mut rt = Runtime::new("adaptive");
    let nss: Vec<String> = (0..3).map(|_| rt.pod()).collect();
    let ids: Vec<String> = nss.iter().map(|n| Runtime::container_id(n)).collect();
    for n in &nss {
        rt.cnitool_ok("add", n, &[]);
    }
    // pipes that are not this plugin's for this network: made by hand, and another network's
    rt.lab
        .ok(&["pipe", "create", "by-hand", "--ip", "10.72.0.1/24"]);
    rt.lab.ok(&[
        "pipe",
        "create",
        "other-net",
        "--ip",
        "10.72.0.2/24",
        "--label",
        "docknet.io/owner=docknet-cni",
        "--label",
        "cni.dev/network=somebody-else",
        "--label",
        "cni.dev/ifname=eth0",
    ]);
    // GC with a partial list: the first attachment stays (and one on another interface of the
    // second container does not make it valid)
    let valid = json!([{"containerID": ids[0], "ifname": "eth0"},
                       {"containerID": ids[1], "ifname": "net1"}]);
    let conf = rt.plugin_conf(json!({"cni.dev/valid-attachments": valid}));
    let (ok, out) = rt.plugin(&[("CNI_COMMAND", "GC")], &conf);
    assert!(ok, "GC failed: {out}");
    let mut names: Vec<String> = rt
        .pipes()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    let mut want = vec![ids[0].clone(), "by-hand".into(), "other-net".into()];
    want.sort();
    assert_eq!(names, want);
    assert_eq!(
        rt.leases().len(),
        1,
        "host-local kept leases of collected attachments"
    );
    assert_eq!(rt.devinfo_files().len(), 1);
    // cnitool's GC passes no valid attachments: everything of this network goes
    rt.cnitool_ok("gc", &nss[0], &[]);
    let mut names: Vec<String> = rt
        .pipes()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["by-hand", "other-net"]);
    assert!(rt.leases().is_empty());
    assert!(rt.devinfo_files().is_empty());
    // GC needs a 1.1.0 configuration
    let mut old = rt.plugin_conf(json!({}));
    old = String::from_utf8(old)
        .unwrap()
        .replace("\"1.1.0\"", "\"1.0.0\"")
        .into_bytes();
    assert_eq!(rt.code(&[("CNI_COMMAND", "GC")], &old), 1);
}

#[test]
fn bad_configurations_and_environments_get_their_cni_codes() {
    if !ready("CNI error codes") {
        return;
    }
    let mut rt = Runtime::new("adaptive");
    let ns = rt.pod();
    let good = rt.plugin_conf(json!({}));
    let add = verb_env("ADD", "c1", &ns);

    // VERSION
    let (ok, v) = rt.plugin(&[("CNI_COMMAND", "VERSION")], b"");
    assert!(ok);
    assert!(v["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("1.1.0")));

    // the environment (4)
    let without =
        |k: &str| -> Vec<(&str, &str)> { add.iter().copied().filter(|(n, _)| *n != k).collect() };
    for missing in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
        assert_eq!(rt.code(&without(missing), &good), 4, "without {missing}");
    }
    let mut no_path = add.clone();
    no_path.push(("CNI_PATH", ""));
    assert_eq!(rt.code(&no_path, &good), 4, "without CNI_PATH");
    let long_id = "c".repeat(200);
    for (k, v) in [
        ("CNI_COMMAND", "EXPLODE"),
        ("CNI_CONTAINERID", "a/b"),
        ("CNI_CONTAINERID", long_id.as_str()),
        ("CNI_NETNS", "/tmp"),
        ("CNI_NETNS", "/nonexistent/ns"),
        ("CNI_IFNAME", "a-name-far-too-long"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAME=Bad_Name;K8S_POD_NAMESPACE=default",
        ),
        ("CNI_ARGS", "not-a-pair"),
    ] {
        let mut e: Vec<(&str, &str)> = add.iter().copied().filter(|(n, _)| *n != k).collect();
        e.push((k, v));
        assert_eq!(rt.code(&e, &good), 4, "{k}={v}");
    }

    // the configuration (7; 6 when it is not JSON, 1 for a version not spoken)
    let big = format!(
        "{{\"pad\": \"{}\"}}",
        "x".repeat(usize::try_from(1u32 << 20).unwrap())
    );
    let cases: Vec<(Value, u64)> = vec![
        (json!({"type": "bridge"}), 7),
        (json!({"mtu": 10}), 7),
        (json!({"mtu": 70000}), 7),
        (json!({"ipam": {}}), 7),
        (json!({"ipam": {"type": "../../bin/sh"}}), 7),
        (json!({"daemonSocket": "relative.sock"}), 7),
        (json!({"daemonSocket": format!("/{}", "s".repeat(120))}), 7),
        (json!({"socketName": "no spaces"}), 7),
        (json!({"deviceInfoDir": "/a/../b"}), 7),
        (
            json!({"runtimeConfig": {"bandwidth": {"ingressBurst": 1000}}}),
            7,
        ),
        (
            json!({"runtimeConfig": {"CNIDeviceInfoFile": "/etc/passwd"}}),
            7,
        ),
        (
            json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations":
                   {"docknet.io/fast-channel-peers": "web"}}}),
            7,
        ),
        (
            json!({"prevResult": {"cniVersion": "1.1.0", "ips": [
            {"address": "10.1.0.2/24", "interface": 5}]}}),
            7,
        ),
        (json!({"cniVersion": "9.9.9"}), 1),
    ];
    for (extra, want) in cases {
        let conf = rt.plugin_conf(extra.clone());
        assert_eq!(rt.code(&add, &conf), want, "{extra}");
    }
    assert_eq!(rt.code(&add, b"{not json"), 6);
    assert_eq!(
        rt.code(&add, big.as_bytes()),
        7,
        "a configuration over 1 MiB"
    );
    // IPAM's own error comes through as IPAM gave it: no address left in a range of one
    let tiny = rt.plugin_conf(json!({"ipam": {"type": "host-local",
        "dataDir": path_of(&rt.dir.join("ipam")),
        "ranges": [[{"subnet": "10.73.0.0/29", "rangeStart": "10.73.0.2",
                     "rangeEnd": "10.73.0.2"}]]}}));
    let ns2 = rt.pod();
    let (ok, v) = rt.plugin(&verb_env("ADD", "c2", &ns2), &tiny);
    assert!(ok, "{v}");
    let ns3 = rt.pod();
    let (ok, v) = rt.plugin(&verb_env("ADD", "c3", &ns3), &tiny);
    assert!(
        !ok && v["msg"].as_str().unwrap().contains("no IP addresses"),
        "{v}"
    );
    // the same container twice on another interface: DockNet's own code
    let mut net1 = verb_env("ADD", "c2", &ns2);
    net1[3] = ("CNI_IFNAME", "net1");
    let other = rt.plugin_conf(json!({"ipam": {"type": "host-local",
        "dataDir": path_of(&rt.dir.join("ipam")), "ranges": [[{"subnet": "10.74.0.0/24"}]]}}));
    assert_eq!(rt.code(&net1, &other), 102);
    let (ok, v) = rt.plugin(&verb_env("DEL", "c2", &ns2), &tiny);
    assert!(ok, "{v}");
    // nothing of the refused ADDs is left: no pipe, no lease
    assert!(rt.pipes().is_empty(), "{:?}", rt.pipes());
    assert!(rt.leases().is_empty(), "{:?}", rt.leases());

    // no daemon at the configured socket: ADD 11, STATUS 50
    let gone = rt.plugin_conf(json!({"daemonSocket": "/run/docknet-nonexistent/ctl.sock"}));
    assert_eq!(rt.code(&add, &gone), 11);
    assert_eq!(rt.code(&[("CNI_COMMAND", "STATUS")], &gone), 50);
    assert!(rt.leases().is_empty(), "a refused ADD kept its lease");
}

#[test]
fn the_bandwidth_capability_sets_the_pipes_limits() {
    if !ready("bandwidth capability") {
        return;
    }
    let mut rt = Runtime::new("adaptive");
    let ns = rt.pod();
    let id = Runtime::container_id(&ns);
    let caps = json!({"bandwidth": {"ingressRate": 100_000_000u64, "ingressBurst": 400_000u64,
                                    "egressRate": 50_000_000u64, "egressBurst": 200_000u64}})
    .to_string();
    rt.cnitool_ok("add", &ns, &[("CAP_ARGS", &caps)]);
    let r = rt.lab.json(&["rate", "show", &id, "--json"]);
    assert_eq!(r["egress_bps"], 50_000_000, "{r}");
    assert_eq!(r["ingress_bps"], 100_000_000, "{r}");
    assert_eq!(r["egress"]["burst_bits"], 200_000, "{r}");
    assert_eq!(r["ingress"]["burst_bits"], 400_000, "{r}");
    rt.cnitool_ok("check", &ns, &[("CAP_ARGS", &caps)]);
    // limits changed behind the plugin's back: CHECK says so
    rt.lab.ok(&["rate", "clear", &id]);
    let o = rt.cnitool("check", &ns, &[("CAP_ARGS", &caps)]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("limited to"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    rt.cnitool_ok("del", &ns, &[("CAP_ARGS", &caps)]);
    assert!(rt.pipes().is_empty());
}

/// A dnperf server in namespace `netns` (as a pod's process would run: in the namespace,
/// attaching through the socket the daemon bound there).
fn serve_in(netns: &str, bind: &str) -> std::process::Child {
    Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args([
            DNPERF, "server", "--stack", "docknet", "--idle", "adaptive", "--bind", bind,
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// A 64-byte ping-pong of one second from namespace `netns`; dnperf's JSON report. A run with
/// fewer than `RR_ENOUGH` transactions is run again, up to three runs, and the best is returned:
/// the suite's other tests can starve one second of a 2-core machine, but not three in a row,
/// while a path that stalls does so every time.
fn rr_from(netns: &str, to: &str) -> Value {
    let mut best: Option<Value> = None;
    for _ in 0..3 {
        let r = rr_once(netns, to);
        let n = |v: &Value| v["result"]["transactions"].as_u64().unwrap_or(0);
        if best.as_ref().is_none_or(|b| n(&r) > n(b)) {
            best = Some(r);
        }
        if best.as_ref().is_some_and(|b| n(b) > RR_ENOUGH) {
            break;
        }
    }
    best.unwrap()
}

/// What the callers of [`rr_from`] ask of one second of ping-pong.
const RR_ENOUGH: u64 = 100;

fn rr_once(netns: &str, to: &str) -> Value {
    let t = Instant::now();
    loop {
        let o = Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .args([
                DNPERF,
                "client",
                "--stack",
                "docknet",
                // not spin: two spinning peers and the daemon's master on two cores (and a
                // test beside) wait for each other's time slices, 4 ms a round trip
                "--idle",
                "adaptive",
                "--connect",
                to,
                "--workload",
                "rr",
                "--size",
                "64",
                "--duration",
                "1",
                "--warmup",
                "0.2",
                "--json",
            ])
            .output()
            .unwrap();
        if o.status.success() {
            return peer_json(&o);
        }
        // the server may still be starting
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "dnperf client from {netns}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Killed(std::process::Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn pods_exchange_tcp_over_their_pipes_and_over_a_fast_channel_they_both_asked_for() {
    if !ready("TCP between pods") {
        return;
    }
    // channels the pods ask for, only: the daemon's own for pods that talk would join cache
    // and db too
    let mut rt = Runtime::with_daemon("adaptive", &["--fast-channels", "manual"]);
    let pods: Vec<(String, &str, &str)> = vec![
        (rt.pod(), "web", "db"),       // asks for db
        (rt.pod(), "db", "web,cache"), // asks for web and cache
        (rt.pod(), "cache", ""),       // asks for nobody: no channel to db
    ];
    let mut ips = Vec::new();
    for (ns, name, peers) in &pods {
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME={name}");
        let caps = json!({"io.kubernetes.cri.pod-annotations":
                          {"docknet.io/fast-channel-peers": peers}})
        .to_string();
        let res: Value = serde_json::from_str(&rt.cnitool_ok(
            "add",
            ns,
            &[("CNI_ARGS", &args), ("CAP_ARGS", &caps)],
        ))
        .unwrap();
        let a = res["ips"][0]["address"].as_str().unwrap();
        ips.push(a.split('/').next().unwrap().to_string());
    }
    let ids: Vec<String> = pods.iter().map(|p| Runtime::container_id(&p.0)).collect();
    let fc = |i: usize| rt.pipe(&ids[i]).unwrap()["fast_channels"].clone();
    assert_eq!(fc(0), json!([ids[1]]), "web and db asked for each other");
    assert_eq!(fc(2), json!([]), "cache asked for nobody");
    assert_eq!(rt.pipe(&ids[1]).unwrap()["labels"]["k8s.io/pod"], "shop/db");

    // db serves; web (fast channel) and cache (through the daemon) exchange TCP with it
    let _srv = Killed(serve_in(&pods[1].0, &format!("{}:7100", ips[1])));
    for client in [0, 2] {
        let r = rr_from(&pods[client].0, &format!("{}:7100", ips[1]));
        let n = r["result"]["transactions"].as_u64().unwrap_or(0);
        assert!(n > RR_ENOUGH, "pod {client}: {r}");
    }
    let sent_via_daemon = |i: usize| rt.json_counter(&ids[i], "tx_packets");
    assert!(
        sent_via_daemon(2) > 100,
        "cache's frames go through the daemon"
    );
    assert!(
        sent_via_daemon(0) < 50,
        "web's frames take the fast channel (only ARP and the like through the daemon)"
    );
    drop(_srv);
    for (ns, _, _) in &pods {
        rt.cnitool_ok("del", ns, &[]);
    }
    assert!(rt.pipes().is_empty(), "{:?}", rt.pipes());
    assert!(rt.leases().is_empty());
}

#[test]
fn dual_stack_pods_get_ipv6_beside_ipv4_and_exchange_tcp_over_it() {
    if !ready("dual-stack pods") {
        return;
    }
    let mut rt = Runtime::new("adaptive");
    let mut entry = rt.docknet_entry();
    entry["ipam"]["ranges"] = json!([[{"subnet": "10.71.0.0/24"}], [{"subnet": "fd00:71::/64"}]]);
    rt.write_conf(&entry, None);
    let (a, b) = (rt.pod(), rt.pod());
    let mut v6 = Vec::new();
    let mut results = Vec::new();
    for ns in [&a, &b] {
        let res: Value = serde_json::from_str(&rt.cnitool_ok("add", ns, &[])).unwrap();
        let ips = res["ips"].as_array().unwrap();
        assert_eq!(ips.len(), 2, "{res}");
        let addr6 = ips[1]["address"].as_str().unwrap().to_string();
        assert!(addr6.starts_with("fd00:71::"), "{res}");
        assert_eq!(ips[1]["interface"], 0, "{res}");
        let p = rt.pipe(&Runtime::container_id(ns)).unwrap();
        assert_eq!(p["ip6"], addr6.as_str(), "{p}");
        v6.push(addr6.split('/').next().unwrap().to_string());
        rt.cnitool_ok("check", ns, &[]);
        results.push(res);
    }
    // a CHECK against a result whose IPv6 address is not the pipe's fails with DockNet's code
    let id = Runtime::container_id(&a);
    let mut forged = results[0].clone();
    forged["ips"][1]["address"] = json!("fd00:71::99/64");
    let conf = rt.plugin_conf(json!({"ipam": entry["ipam"], "prevResult": forged}));
    assert_eq!(rt.code(&verb_env("CHECK", &id, &a), &conf), 104);
    // TCP between the pods over IPv6, through the daemon
    let _srv = Killed(serve_in(&b, &format!("[{}]:7300", v6[1])));
    let r = rr_from(&a, &format!("[{}]:7300", v6[1]));
    assert!(
        r["result"]["transactions"].as_u64().unwrap_or(0) > RR_ENOUGH,
        "{r}"
    );
    drop(_srv);
    for ns in [&a, &b] {
        rt.cnitool_ok("del", ns, &[]);
    }
    assert!(rt.pipes().is_empty(), "{:?}", rt.pipes());
    assert!(rt.leases().is_empty(), "{:?}", rt.leases());
}

impl Runtime {
    fn json_counter(&self, pipe: &str, name: &str) -> u64 {
        self.lab.counter(pipe, name)
    }
}

#[test]
fn chained_after_bridge_the_pod_keeps_eth0_and_gets_the_pipe_beside_it() {
    if !ready("chained after bridge") {
        return;
    }
    let mut rt = Runtime::new("adaptive");
    let br = format!("dncb{}", rt.tag);
    let bridge = json!({"type": "bridge", "bridge": br, "isGateway": true,
        "ipam": {"type": "host-local", "dataDir": path_of(&rt.dir.join("ipam-br")),
                 "ranges": [[{"subnet": "10.75.0.0/24"}]]}});
    rt.write_conf(&rt.docknet_entry(), Some(bridge));
    let a = rt.pod();
    let b = rt.pod();
    let mut pipe_ips = Vec::new();
    for ns in [&a, &b] {
        let res: Value = serde_json::from_str(&rt.cnitool_ok("add", ns, &[])).unwrap();
        let names: Vec<&str> = res["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"eth0") && names.contains(&"docknet0"),
            "{res}"
        );
        // the pipe is the second interface; its address is the pipe's (not in "ips": bridge's
        // CHECK wants every address there on eth0)
        let ifc = res["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == "docknet0")
            .unwrap();
        assert_eq!(ifc["socketPath"], "@docknet/pipe", "{res}");
        let pipe = rt.pipe(&Runtime::container_id(ns)).unwrap();
        assert_eq!(pipe["mac"], ifc["mac"]);
        let pipe_ip = pipe["ip"].as_str().unwrap().to_string();
        assert!(pipe_ip.starts_with("10.71.0."), "{pipe}");
        pipe_ips.push(pipe_ip.split('/').next().unwrap().to_string());
        // the kernel interface from bridge is there
        let o = Command::new("ip")
            .args([
                "-n",
                ns.rsplit('/').next().unwrap(),
                "-j",
                "addr",
                "show",
                "eth0",
            ])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("10.75.0."),
            "eth0 lacks bridge's address"
        );
        rt.cnitool_ok("check", ns, &[]);
    }
    // TCP over the pipes, beside the kernel network
    let _srv = Killed(serve_in(&b, &format!("{}:7200", pipe_ips[1])));
    let r = rr_from(&a, &format!("{}:7200", pipe_ips[1]));
    assert!(
        r["result"]["transactions"].as_u64().unwrap_or(0) > RR_ENOUGH,
        "{r}"
    );
    drop(_srv);
    for ns in [&a, &b] {
        rt.cnitool_ok("del", ns, &[]);
        let o = Command::new("ip")
            .args(["-n", ns.rsplit('/').next().unwrap(), "link", "show", "eth0"])
            .output()
            .unwrap();
        assert!(!o.status.success(), "bridge's DEL left eth0");
    }
    assert!(rt.pipes().is_empty(), "{:?}", rt.pipes());
}

fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// ADD to first packet: a runtime runs the plugin's ADD (timed from just before it starts the
/// plugin to its exit: process start, host-local, the daemon's pipe, socket and state), then
/// the pod's program, already waiting in the namespace, attaches to its pipe and completes a
/// TCP handshake with a pod that serves (timed by `dnperf probe` on the same clock). The
/// DockNet part is all of it but host-local's run, which is timed alone the same way.
/// DOCKNET_CNI_ROUNDS sets the rounds (default 10); the figures are printed.
///
/// Ignored in the suite: the target is not met yet (docs/benchmarks.md, "ADD to first
/// packet", has the figures and the two causes found: a first handshake that waits about 1 s,
/// and an ADD of about 25 ms).
#[test]
#[ignore = "the 5 ms target is not met yet; run it with --ignored to measure"]
fn add_to_first_packet_takes_at_most_5_ms_for_the_docknet_part() {
    if !ready("ADD to first packet") {
        return;
    }
    let rounds: usize = std::env::var("DOCKNET_CNI_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let mut rt = Runtime::new("adaptive");
    let conf = rt.plugin_conf(json!({}));
    let server_ns = rt.pod();
    let (ok, res) = rt.plugin(&verb_env("ADD", "first-server", &server_ns), &conf);
    assert!(ok, "{res}");
    let server_ip = res["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let _srv = Killed(serve_in(&server_ns, &format!("{server_ip}:7300")));
    std::thread::sleep(Duration::from_millis(300));
    let run_plugin = |bin: &str, verb: &str, id: &str, ns: &str| {
        let mut c = Command::new(bin_dir().join(bin))
            .env_clear()
            .envs(verb_env(verb, id, ns))
            .env("CNI_PATH", bin_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(&conf).unwrap();
        assert!(c.wait().unwrap().success(), "{bin} {verb} {id}");
    };
    let (mut add, mut after, mut total, mut ipam) = (vec![], vec![], vec![], vec![]);
    for i in 0..rounds {
        let ns = rt.pod();
        let id = format!("first-{i}");
        let mut probe = Command::new("nsenter")
            .arg(format!("--net={ns}"))
            .args([DNPERF, "probe", "--connect", &format!("{server_ip}:7300")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(100)); // it is waiting for its go line
        let t0 = mono_ns();
        run_plugin("docknet-cni", "ADD", &id, &ns);
        let t_add = mono_ns();
        probe.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let o = probe.wait_with_output().unwrap();
        assert!(o.status.success(), "probe failed");
        let r = peer_json(&o);
        let connected = r["connected_ns"].as_u64().unwrap();
        add.push((t_add - t0) as f64 / 1e6);
        after.push((connected - r["go_ns"].as_u64().unwrap()) as f64 / 1e6);
        total.push((connected - t0) as f64 / 1e6);
        run_plugin("docknet-cni", "DEL", &id, &ns);
        // host-local alone, as the plugin runs it
        let t = mono_ns();
        run_plugin("host-local", "ADD", &format!("ipam-{i}"), &ns);
        ipam.push((mono_ns() - t) as f64 / 1e6);
        run_plugin("host-local", "DEL", &format!("ipam-{i}"), &ns);
    }
    let (add, after, total, ipam) = (
        median(&mut add),
        median(&mut after),
        median(&mut total),
        median(&mut ipam),
    );
    let docknet = add - ipam + after;
    eprintln!(
        "ADD to first packet, median of {rounds}: {total:.2} ms = ADD {add:.2} ms (host-local {ipam:.2} ms of it) \
         + attach and TCP handshake {after:.2} ms; DockNet part {docknet:.2} ms"
    );
    assert!(docknet <= 5.0, "DockNet part {docknet:.2} ms > 5 ms");
    run_plugin("docknet-cni", "DEL", "first-server", &server_ns);
}
