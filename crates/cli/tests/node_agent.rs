//! The node agent on the wire: two hosts in namespaces of their own joined by a wire, a daemon
//! on each, and `docknet-agent` keeping each daemon's routes (and with `--kernel-routes` the
//! node's kernel routes) equal to the cluster's nodes, as the nodes file lists them.

mod common;
use common::wire::*;
use common::*;
use docknet_lab::topology::daemon::Daemon;
use docknet_lab::topology::wire::{Shape, Wire, HOST_A, HOST_B};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `docknet-agent` for node `name` of daemon `d`, reading `nodes`, writing `cni` (host-local's
/// leases and the plugin's device-info files beside it, not in /var/lib/cni and /var/run).
fn agent(d: &Daemon, name: &str, nodes: &Path, cni: &Path, once: bool) -> Command {
    let mut c = Command::new(bin_dir().join("docknet-agent"));
    c.args(["--cluster-cidr", "10.244.0.0/16", "--node-name", name])
        .arg("--nodes")
        .arg(nodes)
        .arg("--cni-conf")
        .arg(cni)
        .arg("--ipam-data-dir")
        .arg(cni.with_extension("ipam"))
        .arg("--device-info-dir")
        .arg(cni.with_extension("devinfo"))
        .arg("--socket")
        .arg(&d.socket);
    if once {
        c.args(["--once", "--json"]);
    }
    c
}

/// Waits up to a second for daemon `d`'s routes to equal `want` (JSON, as `route ls --json`).
fn routes_become(d: &Daemon, want: serde_json::Value, what: &str) {
    let t = std::time::Instant::now();
    loop {
        let ls: serde_json::Value =
            serde_json::from_str(&ok(d, &["route", "ls", "--json"])).unwrap();
        if ls == want {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{what}: routes {ls}, want {want} within 1 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A node as the agent's `--nodes` file lists it.
fn node(name: &str, addr: &str, cidr: &str) -> serde_json::Value {
    serde_json::json!({"name": name, "address": addr, "podCIDRs": [cidr]})
}

/// `nodes.json` in `dir` with nodes a (host A, 10.244.1.0/24) and b (host B, 10.244.2.0/24).
fn two_nodes_file(dir: &Path) -> PathBuf {
    let nodes = dir.join("nodes.json");
    write_nodes(
        &nodes,
        serde_json::json!([
            node("a", HOST_A, "10.244.1.0/24"),
            node("b", HOST_B, "10.244.2.0/24")
        ]),
    );
    nodes
}

fn write_nodes(path: &Path, nodes: serde_json::Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, nodes.to_string()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn the_node_agent_keeps_each_nodes_routes_equal_to_the_cluster() {
    if !bins_or_skip("node agent", &["docknet-agent"]) {
        return;
    }
    let wire = Wire::build(1500, &Shape::default()).unwrap();
    let a = host_daemon(&wire, &wire.host_a, "xdp");
    let b = host_daemon(&wire, &wire.host_b, "xdp");
    let dir = tempfile::tempdir().unwrap();
    let nodes = two_nodes_file(dir.path());
    // an operator's route outside the cluster's pod network stays as it is
    ok(
        &a,
        &["route", "add", "10.99.0.0/16", "--via", "192.168.77.50"],
    );
    let operator = serde_json::json!({"net": "10.99.0.0/16", "via": "192.168.77.50"});
    let cni_a = dir.path().join("a.conflist");
    let cni_b = dir.path().join("b.conflist");
    let mut agent_a = Reaped(
        agent(&a, "a", &nodes, &cni_a, false)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let _agent_b = Reaped(
        agent(&b, "b", &nodes, &cni_b, false)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    routes_become(
        &a,
        serde_json::json!([operator, {"net": "10.244.2.0/24", "via": HOST_B}]),
        "node a at start",
    );
    routes_become(
        &b,
        serde_json::json!([{"net": "10.244.1.0/24", "via": HOST_A}]),
        "node b at start",
    );
    // each node's CNI configuration hands out addresses from its own pod network
    for (conf, n) in [(&cni_a, 1), (&cni_b, 2)] {
        let conf: serde_json::Value =
            serde_json::from_slice(&std::fs::read(conf).unwrap()).unwrap();
        let range = &conf["plugins"][0]["ipam"]["ranges"][0][0];
        assert_eq!(range["subnet"], "10.244.0.0/16", "{conf}");
        assert_eq!(range["rangeStart"], format!("10.244.{n}.1"), "{conf}");
        assert_eq!(range["rangeEnd"], format!("10.244.{n}.254"), "{conf}");
    }
    for cni in [&cni_a, &cni_b] {
        let conf: serde_json::Value = serde_json::from_slice(&std::fs::read(cni).unwrap()).unwrap();
        assert_eq!(
            conf["plugins"][0]["ipam"]["dataDir"],
            cni.with_extension("ipam").to_str().unwrap(),
            "{conf}"
        );
        assert_eq!(
            conf["plugins"][0]["deviceInfoDir"],
            cni.with_extension("devinfo").to_str().unwrap(),
            "{conf}"
        );
    }

    // pods on the two nodes talk through the routes the agents made
    ok(&a, &["pipe", "create", "c0", "--ip", "10.244.1.5/16"]);
    ok(&b, &["pipe", "create", "s0", "--ip", "10.244.2.5/16"]);
    let r = transfer_between((&a, "c0"), (&b, "s0", "10.244.2.5"), 16 << 20);
    assert_eq!(r["result"]["corrupt_bytes"], 0, "{r}");
    assert_eq!(r["result"]["bytes"], 16u64 << 20, "{r}");

    // a node added, a node's address changed, a node removed: each within a second
    write_nodes(
        &nodes,
        serde_json::json!([
            node("a", HOST_A, "10.244.1.0/24"),
            node("b", "192.168.77.22", "10.244.2.0/24"),
            node("c", "192.168.77.3", "10.244.3.0/24")
        ]),
    );
    routes_become(
        &a,
        serde_json::json!([
            operator,
            {"net": "10.244.2.0/24", "via": "192.168.77.22"},
            {"net": "10.244.3.0/24", "via": "192.168.77.3"}
        ]),
        "changed and added",
    );
    write_nodes(
        &nodes,
        serde_json::json!([
            node("a", HOST_A, "10.244.1.0/24"),
            node("b", HOST_B, "10.244.2.0/24"),
            // a node claiming this node's pod network is skipped, not routed
            node("d", "192.168.77.4", "10.244.1.0/25")
        ]),
    );
    routes_become(
        &a,
        serde_json::json!([operator, {"net": "10.244.2.0/24", "via": HOST_B}]),
        "removed",
    );
    // a restarted agent finds nothing to change
    let _ = agent_a.0.kill();
    let _ = agent_a.0.wait();
    let mut log = String::new();
    std::io::Read::read_to_string(agent_a.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(
        log.contains("route add 10.244.2.0/24 via 192.168.77.2\n")
            && log.contains("node \"d\": pod network 10.244.1.0/25 overlaps"),
        "{log}"
    );
    let o = agent(&a, "a", &nodes, &cni_a, true).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");

    // the same cluster through VXLAN tunnels: one pass of each agent replaces the routes, and
    // the pods still talk
    drop(_agent_b);
    for (d, name, cni) in [(&a, "a", &cni_a), (&b, "b", &cni_b)] {
        let o = agent(d, name, &nodes, cni, true)
            .args(["--vxlan", "9"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    routes_become(
        &a,
        serde_json::json!([operator, {"net": "10.244.2.0/24", "via": HOST_B, "vxlan": 9}]),
        "tunnelled",
    );
    let r = transfer_between((&a, "c0"), (&b, "s0", "10.244.2.5"), 16 << 20);
    assert_eq!(r["result"]["corrupt_bytes"], 0, "{r}");
    assert_eq!(r["result"]["bytes"], 16u64 << 20, "{r}");
    let na = status(&a)["nic"].clone();
    assert!(na["counters"]["vxlan_sent"].as_u64().unwrap() > 100, "{na}");
}

/// Nodes whose reverse-path filter is strict (`rp_filter` 1, the default of some
/// distributions) ignore the daemons' ARP requests, which carry a pod's address as sender,
/// until they have a kernel route back to that pod's network: `docknet-agent --kernel-routes`
/// keeps those routes (protocol 78) in the node's namespace, and the pods talk; a node gone
/// takes its kernel route with it.
#[test]
fn strict_reverse_path_filters_let_pods_through_once_the_agent_keeps_kernel_routes() {
    if !bins_or_skip("kernel routes", &["docknet-agent"]) {
        return;
    }
    let (wire, a, b) = two_nodes("packet", "10.244.1.5/16", "10.244.2.5/16");
    for host in [&wire.host_a, &wire.host_b] {
        for dev in ["all", "eth0"] {
            ip_in(
                host,
                &["sysctl", "-qw", &format!("net.ipv4.conf.{dev}.rp_filter=1")],
            );
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let nodes = two_nodes_file(dir.path());
    // one pass of a node's agent in the node's namespace
    let pass = |host: &str, d: &Daemon, name: &str, more: &[&str]| {
        let o = Command::new("ip")
            .args(["netns", "exec", host])
            .arg(bin_dir().join("docknet-agent"))
            .args([
                "--once",
                "--cluster-cidr",
                "10.244.0.0/16",
                "--node-name",
                name,
            ])
            .arg("--nodes")
            .arg(&nodes)
            .arg("--socket")
            .arg(&d.socket)
            .args(more)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let kernel_routes = |host: &str| {
        let o = Command::new("ip")
            .args(["-n", host, "route", "show", "proto", "78"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };

    // the daemons' routes alone: the other node's kernel does not answer the pod's ARP request
    for (h, d, n) in [(&wire.host_a, &a, "a"), (&wire.host_b, &b, "b")] {
        let (ok, log) = pass(h, d, n, &[]);
        assert!(ok, "{log}");
    }
    assert_eq!(kernel_routes(&wire.host_a), "");
    let o = a
        .cmd(Path::new(EXE))
        .args(["run", "--pipe", "c0", "--", "timeout", "3", dnperf()])
        .args([
            "client",
            "--stack",
            "docknet",
            "--connect",
            "10.244.2.5:7000",
        ])
        .args(["--workload", "rr", "--duration", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "the pods talked without a route back");
    let c = status(&a)["nic"]["counters"].clone();
    assert!(
        c["arp_requests"].as_u64().unwrap() >= 2 && c["arp_replies"] == 0 && c["sent"] == 0,
        "{c}"
    );

    // refused where they make no sense
    let (ok, log) = pass(&wire.host_a, &a, "a", &["--kernel-routes", "--vxlan", "5"]);
    assert!(!ok && log.contains("--kernel-routes"), "{log}");

    // with the agents' kernel routes the nodes answer, and the pods talk
    for (h, d, n) in [(&wire.host_a, &a, "a"), (&wire.host_b, &b, "b")] {
        let (ok, log) = pass(h, d, n, &["--kernel-routes"]);
        assert!(ok && log.contains("kernel route added"), "{log}");
    }
    assert!(
        kernel_routes(&wire.host_a).starts_with("10.244.2.0/24 via 192.168.77.2 dev eth0"),
        "{}",
        kernel_routes(&wire.host_a)
    );
    let r = transfer_between((&a, "c0"), (&b, "s0", "10.244.2.5"), 16 << 20);
    assert_eq!(r["result"]["corrupt_bytes"], 0, "{r}");
    assert_eq!(r["result"]["bytes"], 16u64 << 20, "{r}");

    // node b gone: its kernel route too
    write_nodes(
        &nodes,
        serde_json::json!([node("a", HOST_A, "10.244.1.0/24")]),
    );
    let (ok, log) = pass(&wire.host_a, &a, "a", &["--kernel-routes"]);
    assert!(ok && log.contains("kernel route removed"), "{log}");
    assert_eq!(kernel_routes(&wire.host_a), "");
    // a route to a node's pod network that is not the agent's (the operator's, or another
    // network's) is left as it is, and said
    ip_in(
        &wire.host_a,
        &[
            "ip",
            "route",
            "add",
            "10.244.2.0/24",
            "via",
            "192.168.77.9",
            "proto",
            "static",
        ],
    );
    write_nodes(
        &nodes,
        serde_json::json!([
            node("a", HOST_A, "10.244.1.0/24"),
            node("b", HOST_B, "10.244.2.0/24")
        ]),
    );
    let (ok, log) = pass(&wire.host_a, &a, "a", &["--kernel-routes"]);
    assert!(
        !ok && log.contains("refused: kernel route 10.244.2.0/24 via 192.168.77.2")
            && log.contains("not the agent's"),
        "{log}"
    );
    let o = Command::new("ip")
        .args(["-n", &wire.host_a, "route", "show", "10.244.2.0/24"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "10.244.2.0/24 via 192.168.77.9 dev eth0 proto static"
    );
    assert_eq!(kernel_routes(&wire.host_a), "");
}
