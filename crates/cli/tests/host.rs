//! The node and beyond: a daemon with `--host-link` on host A of the lab's wire (the node), its
//! pods' only network DockNet. Checked: the node's kernel reaches a pod (a readiness probe), a
//! NodePort rule of the node's brings a client from host B to it, pods reach host B through the
//! node's NAT (a DockLib program and an unmodified one under the preload library), a pod that
//! forges its source is stopped at the daemon, a second daemon cannot take the link, and the
//! link and its routes go with the daemon, also after kill -9. A running pod's stack takes the
//! gateway of a daemon that adopts its pipe.

mod common;
use common::*;
use docknet_lab::topology::daemon::Daemon;
use docknet_lab::topology::wire::{Shape, Wire, HOST_B, WIRE_DEV};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const WEB: &str = "10.244.1.5";
const CLI: &str = "10.244.1.6";
const LINK: &str = "docknet0";

/// `ip netns exec NS ARGS...`.
fn in_ns(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(args);
    c
}

fn run_ok(mut c: Command, what: &str) -> Output {
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// The HTTP status `curl` got from `url` in namespace `ns` (or under `docknet run` when
/// `pod` names a pipe of `d`).
fn http_status(ns: &str, pod: Option<(&Daemon, &str)>, url: &str) -> String {
    let curl = [
        "curl",
        "-s",
        "-m",
        "5",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        url,
    ];
    let o = match pod {
        Some((d, pipe)) => d
            .cmd(Path::new(EXE))
            .args(["run", "--pipe", pipe, "--preload", "--"])
            .args(curl)
            .output()
            .unwrap(),
        None => in_ns(ns, &curl).output().unwrap(),
    };
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The node's routes through the host link.
fn routes_through_link(ns: &str) -> String {
    let o = Command::new("ip")
        .args(["-n", ns, "route", "show", "dev", LINK])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether the host link, or the nftables table that guards its daemon's end, is in `ns`.
fn link_exists(ns: &str) -> bool {
    let link = Command::new("ip")
        .args(["-n", ns, "link", "show", LINK])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let tables = in_ns(ns, &["nft", "list", "tables"]).output().unwrap();
    link || String::from_utf8_lossy(&tables.stdout).contains("docknet_guard")
}

/// Host A as a node: pods' traffic beyond masqueraded behind its address on the wire, a route
/// on host B to the pods through it, and kube-proxy's NodePort rule for port 30080 to the web
/// pod (as its nftables mode writes it, reduced to the one endpoint).
fn make_node(wire: &Wire) {
    let ns = &wire.host_a;
    let nft = |rule: &str| {
        run_ok(in_ns(ns, &["nft", rule]), rule);
    };
    nft("add table ip node");
    nft("add chain ip node post { type nat hook postrouting priority srcnat; }");
    nft(&format!(
        "add rule ip node post ip saddr 10.244.0.0/16 oifname {WIRE_DEV} masquerade"
    ));
    nft("add chain ip node pre { type nat hook prerouting priority dstnat; }");
    nft(&format!(
        "add rule ip node pre tcp dport 30080 dnat to {WEB}:8080"
    ));
    // host B reaches the pods through the node, as another node reaches this one's pods
    wire.ip_in(
        &wire.host_b,
        &["route", "add", "10.244.0.0/16", "via", "192.168.77.1"],
    )
    .unwrap();
}

/// The lab's two hosts with host A made a node ([`make_node`]); `None` (the test skipped,
/// `what` said why) without root. Both tests run pods under the preload library, which is
/// put beside the binary first.
fn node_wire(what: &str) -> Option<Wire> {
    if !root_or_skip(what) {
        return None;
    }
    preload_library();
    let wire = Wire::build(1500, &Shape::default()).unwrap();
    make_node(&wire);
    Some(wire)
}

/// A web server on host B, port 9000 (the kernel's: Python's `http.server`).
fn web_on_b(wire: &Wire) -> Reaped {
    let web = Reaped(
        in_ns(&wire.host_b, &["python3", "-m", "http.server"])
            .args(["--bind", HOST_B, "9000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // python takes a while to start on a loaded machine: wait until it answers on its own
    // namespace, so a failure later is the path's, not a server that was not up yet
    let url = format!("http://{HOST_B}:9000/");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while http_status(&wire.host_b, None, &url) != "200" {
        assert!(
            std::time::Instant::now() < deadline,
            "python's web server on host B never answered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    web
}

#[test]
fn the_node_reaches_its_pods_and_they_reach_beyond_it_through_the_host_link() {
    let Some(wire) = node_wire("host link") else {
        return;
    };
    let node = &wire.host_a;
    let d = Daemon::start_host_link(Path::new(EXE), "adaptive", None, 0, node, LINK).unwrap();
    // forwarding turned on after the daemon made its link, as a node's other software may at
    // any time: it turns it on on every device, the daemon's end of the link too
    wire.sysctl(node, "net.ipv4.ip_forward=1").unwrap();
    ok(&d, &["pipe", "create", "web", "--ip", &format!("{WEB}/24")]);
    ok(&d, &["pipe", "create", "cli", "--ip", &format!("{CLI}/24")]);
    // a /32 route to each pipe, on the node's end, which carries the pods' gateway
    let routes = routes_through_link(node);
    assert!(
        routes.contains(&format!("{WEB} ")) && routes.contains(&format!("{CLI} ")),
        "{routes}"
    );
    let addr = Command::new("ip")
        .args(["-n", node, "-4", "addr", "show", LINK])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&addr.stdout).contains("169.254.1.1/32"));

    let _web = Reaped(
        d.cmd(Path::new(EXE))
            .args(["run", "--pipe", "web", "--", HTTPD])
            .args(["--stack", "docknet", "--bind", &format!("{WEB}:8080")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // the readiness probe: the node's kernel (kubelet) to the pod
    let url = format!("http://{WEB}:8080/");
    let t = Instant::now();
    let mut probe = http_status(node, None, &url);
    while probe != "200" && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
        probe = http_status(node, None, &url);
    }
    assert_eq!(probe, "200", "probe from the node");
    // a NodePort: a client beyond the node, to the node's address, translated by the node.
    // Its frames reach the pod once each: none comes round again through the node's kernel
    // (which, forwarding, would route its own copy of each back to the link)
    let delivered = || status(&d)["nic"]["counters"]["delivered"].as_u64().unwrap();
    let before = delivered();
    let nodeport = http_status(&wire.host_b, None, "http://192.168.77.1:30080/");
    assert_eq!(nodeport, "200", "NodePort from host B");
    let frames = delivered() - before;
    assert!(frames <= 12, "{frames} frames delivered for one request");

    // egress: a DockLib program to a kernel server beyond the node (through the node's NAT),
    // and back: host B to a pod, routed by the node
    let bytes = (64u64 << 20).to_string();
    let mut kernel_server = Reaped(
        in_ns(&wire.host_b, &[dnperf(), "server", "--stack", "kernel"])
            .args(["--bind", &format!("{HOST_B}:7000"), "--conns", "1"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let o = d
        .cmd(Path::new(EXE))
        .args(["run", "--pipe", "cli", "--", dnperf(), "client"])
        .args(["--stack", "docknet", "--connect", &format!("{HOST_B}:7000")])
        .args([
            "--workload",
            "check",
            "--bytes",
            &bytes,
            "--size",
            "65536",
            "--json",
        ])
        .output()
        .unwrap();
    let _ = kernel_server.0.wait();
    checked(o, 64 << 20, "pod to host B");
    let mut pod_server = Reaped(
        d.cmd(Path::new(EXE))
            .args(["run", "--pipe", "cli", "--", dnperf(), "server"])
            .args(["--stack", "docknet", "--bind", &format!("{CLI}:7000")])
            .args(["--conns", "1"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let o = in_ns(&wire.host_b, &[dnperf(), "client", "--stack", "kernel"])
        .args(["--connect", &format!("{CLI}:7000"), "--workload", "check"])
        .args(["--bytes", &bytes, "--size", "65536", "--json"])
        .output()
        .unwrap();
    let _ = pod_server.0.wait();
    checked(o, 64 << 20, "host B to the pod");
    // and an unmodified program under the preload library (its container's kernel has no
    // network, so every address goes to DockNet)
    let mut py = web_on_b(&wire);
    let beyond = http_status("", Some((&d, "cli")), &format!("http://{HOST_B}:9000/"));
    let _ = py.0.kill();
    assert_eq!(beyond, "200", "curl under the preload library to host B");

    // a pod that forges its source: another pod's address, the node's, host B's. Only its
    // own address reaches the node; the rest is dropped and counted at the daemon.
    // (it ends by itself, 4 s at most after it last heard something)
    let listener = in_ns(node, &["python3", "-c", LISTEN])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let forged = [WEB, "169.254.1.1", HOST_B, "10.244.9.9"];
    let mut attack = d.cmd(Path::new(EXE));
    attack.args(["run", "--pipe", "cli", "--", DNATTACK, "spoof"]);
    attack.args(["--to", "169.254.1.1", "--port", "9999", "--count", "40"]);
    for s in forged.iter().chain([&CLI]) {
        attack.args(["--src", s]);
    }
    let o = run_ok(attack, "dnattack spoof");
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"spoof\""));
    let heard = listener.wait_with_output().unwrap();
    let heard: serde_json::Value = serde_json::from_slice(&heard.stdout).unwrap();
    let mut want = serde_json::Map::new();
    want.insert(CLI.into(), 40.into());
    assert_eq!(
        heard,
        serde_json::Value::Object(want),
        "what the node heard"
    );
    let st: serde_json::Value =
        serde_json::from_str(&ok(&d, &["pipe", "show", "cli", "--json"])).unwrap();
    assert!(
        st["counters"]["drop_spoofed"].as_u64().unwrap() >= 4 * 40,
        "{st}"
    );

    // a second daemon is refused the link the first drives
    let second = Daemon::start_host_link(Path::new(EXE), "adaptive", None, 0, node, LINK);
    let refused = match second {
        Ok(_) => panic!("a second daemon took the link the first drives"),
        Err(e) => format!("{e:#}"),
    };
    assert!(refused.contains("another daemon"), "{refused}");
    assert_eq!(http_status(node, None, &url), "200", "after the refusal");

    // the link and its routes go with the daemon; after kill -9 the next daemon replaces it
    drop(d);
    assert!(!link_exists(node), "host link left after a stop");
    let mut d = Daemon::start_host_link(Path::new(EXE), "adaptive", None, 0, node, LINK).unwrap();
    ok(&d, &["pipe", "create", "web", "--ip", &format!("{WEB}/24")]);
    if let Some(pid) = d.pid() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    d.stop();
    assert!(link_exists(node), "the kernel keeps a killed daemon's link");
    let d = Daemon::start_host_link(Path::new(EXE), "adaptive", None, 0, node, LINK).unwrap();
    assert_eq!(
        routes_through_link(node).trim(),
        "",
        "routes of the killed daemon"
    );
    drop(d);
    assert!(!link_exists(node));
}

/// A pod's stack follows its daemon: started while the node's daemon drives no link (nothing
/// beyond the pipe's network reachable), the same process reaches host B through the node once
/// a daemon with the host link takes its pipe over, without a restart of its own (the new
/// daemon's gateway becomes its stack's default route).
#[test]
fn a_running_pod_reaches_beyond_the_node_once_a_daemon_with_the_host_link_adopts_its_pipe() {
    let Some(wire) = node_wire("host link adoption") else {
        return;
    };
    let node = wire.host_a.clone();
    wire.sysctl(&node, "net.ipv4.ip_forward=1").unwrap();
    let run = tempfile::Builder::new()
        .prefix("docknet-adopt")
        .tempdir_in("/dev/shm")
        .unwrap();
    let socket = run.path().join("ctl.sock");
    let (run_dir, sock) = (
        run.path().to_str().unwrap().to_string(),
        socket.to_str().unwrap().to_string(),
    );
    // a daemon on the node that keeps its pipes for the next one (not ephemeral)
    let daemon = |link: bool| -> Reaped {
        let _ = std::fs::remove_file(&socket);
        let mut c = in_ns(
            &node,
            &[EXE, "--log", "warn", "daemon", "--run-dir", &run_dir],
        );
        c.args(["--socket", &sock, "--holder-grace", "2s"]);
        if link {
            c.args(["--host-link", LINK]);
        }
        let d = Reaped(
            c.stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "daemon start");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    };
    let docknet = |args: &[&str]| -> Command {
        let mut c = Command::new(EXE);
        c.args(["--socket", &sock]).args(args);
        c
    };
    let first = daemon(false);
    run_ok(
        docknet(&["pipe", "create", "cli", "--ip", &format!("{CLI}/24")]),
        "pipe create",
    );
    let _web = web_on_b(&wire);
    let pod = docknet(&["run", "--pipe", "cli", "--preload", "--", PY, "-c", TRY])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // it tries while nothing beyond its network is reachable
    std::thread::sleep(Duration::from_millis(1500));
    let mut first = first;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = first.0.wait();
    let _second = daemon(true);
    let o = pod.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let failures: u32 = out
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(failures > 0, "it reached host B before the link: {out}");
}

/// The system's Python (a container sees the system's directories, not a user's shims).
const PY: &str = "/usr/bin/python3";

/// Connects to host B's web server every 200 ms for 20 s, one process (one stack) throughout;
/// prints how many tries failed before the first answer.
const TRY: &str = r#"
import socket, sys, time
t, fails = time.time(), 0
while time.time() - t < 20:
    try:
        s = socket.create_connection(("192.168.77.2", 9000), timeout=1)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        if s.recv(8).startswith(b"HTTP/1"):
            print("reached after failures", fails)
            sys.exit(0)
    except OSError as e:
        fails += 1
        err = e
    time.sleep(0.2)
print("never reached:", fails, err)
sys.exit(1)
"#;

/// Counts UDP datagrams on port 9999 by source until 1.5 s pass without one; prints a JSON
/// object of source -> count.
const LISTEN: &str = r#"
import json, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9999))
s.settimeout(4.0)
heard = {}
try:
    while True:
        _, (src, _) = s.recvfrom(2048)
        heard[src] = heard.get(src, 0) + 1
        s.settimeout(1.5)
except socket.timeout:
    pass
print(json.dumps(heard))
"#;
