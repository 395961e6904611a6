//! The daemon on the wire: two hosts in namespaces of their own joined by a wire, a daemon on
//! each driving its end (AF_XDP or AF_PACKET), containers behind them. Checked: a 1 GiB TCP
//! transfer arrives intact over both NIC modes (and the one `auto` picks), and checked streams
//! over a jumbo wire in both (AF_XDP's frames in several buffers), a pipe and a kernel
//! socket on the far host exchange checked streams through segment offload, a container lying
//! in large segments' headers hurts only itself, the host keeps its own traffic while the
//! daemon runs, the XDP program is gone after a clean stop and after kill -9, and a missing or down
//! link gets its one-line error; routes send pods' frames through another node's address,
//! plainly or through VXLAN tunnels. (The node agent's tests are in `node_agent.rs`.)

mod common;
use common::wire::*;
use common::*;
use docknet_lab::topology::daemon::Daemon;
use docknet_lab::topology::wire::{Shape, Wire, HOST_A, HOST_B, WIRE_DEV};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Datagrams the kernel of namespace `ns` forwarded (`Ip: ForwDatagrams`).
fn forwarded(ns: &str) -> u64 {
    let o = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&o.stdout);
    let mut ip = t.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (ip.next().unwrap(), ip.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == "ForwDatagrams")
        .unwrap();
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// Whether `host`'s end of the wire has an XDP program attached.
fn xdp_attached(host: &str) -> bool {
    let o = Command::new("ip")
        .args(["-n", host, "-d", "link", "show", WIRE_DEV])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).contains("prog/xdp")
}

/// Whether the switch's `port` has TCP segment offload on (`ethtool -k`).
fn port_tso(wire: &Wire, port: &str) -> bool {
    let o = Command::new("ip")
        .args(["netns", "exec", &wire.switch, "ethtool", "-k", port])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .any(|l| l.trim() == "tcp-segmentation-offload: on")
}

fn ping(from: &str, to: &str) -> bool {
    Command::new("ip")
        .args([
            "netns", "exec", from, "ping", "-c", "2", "-W", "2", "-i", "0.2", to,
        ])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A checked transfer of `bytes` from a container on host A to one on host B.
fn transfer(a: &Daemon, b: &Daemon, bytes: u64) -> serde_json::Value {
    transfer_between((a, "c0"), (b, "s0", "10.78.2.1"), bytes)
}

fn pipe_show(d: &Daemon, pipe: &str) -> serde_json::Value {
    serde_json::from_str(&ok(d, &["pipe", "show", pipe, "--json"])).unwrap()
}

/// `dnattack ARGS` in a container on pipe `pipe` of `node`; its output.
fn attack(node: &Daemon, pipe: &str, args: &[&str]) -> Output {
    node.cmd(Path::new(EXE))
        .args(["run", "--pipe", pipe, "--", DNATTACK])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_gib_crosses_hosts_intact_over_both_nic_modes() {
    if !root_or_skip("nic transfer") {
        return;
    }
    // auto: a veth has no AF_XDP zero-copy, so AF_PACKET with segment offload
    for (mode, port) in [("xdp", "xdp"), ("packet", "packet"), ("auto", "packet")] {
        let (wire, a, b) = two_nodes(mode, "10.78.1.1/16", "10.78.2.1/16");
        if mode == "xdp" {
            assert!(xdp_attached(&wire.host_a) && xdp_attached(&wire.host_b));
        }
        // the hosts' own traffic still reaches their kernels while the daemons run
        assert!(ping(&wire.host_b, HOST_A), "{mode}: host ping");

        let r = transfer(&a, &b, 1 << 30);
        assert_eq!(r["result"]["bytes"], 1u64 << 30, "{mode}: {r}");
        assert_eq!(r["result"]["corrupt_bytes"], 0, "{mode}: {r}");

        let st = status(&a);
        let nic = &st["nic"];
        assert_eq!(nic["mode"], port, "{st}");
        assert_eq!(nic["iface"], WIRE_DEV);
        // AF_PACKET sends 32 KiB segments whole, to be cut by the kernel; AF_XDP sends frames
        // of the wire's MTU
        let offload = port == "packet";
        assert_eq!(nic["offload"], offload, "{st}");
        let min_frames = if offload { 16_000 } else { 700_000 };
        let sent = nic["counters"]["sent"].as_u64().unwrap();
        assert!(sent > min_frames, "{st}");
        if offload {
            assert!(sent < 200_000, "segments went out cut: {st}");
            // the data segments left with their payload copied by the kernel straight from
            // the pipe's ring
            let split = nic["port"]["tx_split"].as_u64().unwrap();
            assert!(split > min_frames, "{st}");
        }
        assert_eq!(nic["counters"]["drop_bad_checksum"], 0, "{st}");
        if mode == "xdp" {
            assert!(["native", "generic"].contains(&nic["attach"].as_str().unwrap()));
        }
        let p = pipe_show(&a, "c0");
        let c = &p["counters"];
        assert!(c["wire_tx"].as_u64().unwrap() > min_frames, "{p}");
        assert!(c["wire_rx"].as_u64().unwrap() > 0, "{p}");
        assert!(
            ping(&wire.host_a, "192.168.77.2"),
            "{mode}: host ping after"
        );
        let (host_a, host_b) = (wire.host_a.clone(), wire.host_b.clone());
        drop(a);
        drop(b);
        assert!(
            !xdp_attached(&host_a) && !xdp_attached(&host_b),
            "{mode}: the XDP program is detached when the daemon stops"
        );
    }
}

/// A jumbo wire (MTU 9000) carries checked streams intact over both NIC modes: 1 GiB in
/// writes of 64 KiB, and 16 MiB in writes of 1,001 bytes, whose segments come in every size the
/// stream makes. AF_PACKET (what `auto` runs on a veth) cuts large segments to the jumbo MTU
/// and coalesces them again; AF_XDP carries each jumbo frame in several 4 KiB buffers
/// (multi-buffer XDP), gathered on receipt.
#[test]
fn a_jumbo_wire_carries_checked_streams_intact() {
    if !root_or_skip("nic jumbo") {
        return;
    }
    for (mode, port) in [("auto", "packet"), ("xdp", "xdp")] {
        let (_wire, a, b) = two_nodes_at(9000, mode, "10.79.1.1/16", "10.79.2.1/16");
        for (bytes, size) in [(1u64 << 30, 65536), (16 << 20, 1001)] {
            let r = transfer_sized((&a, "c0"), (&b, "s0", "10.79.2.1"), bytes, size);
            assert_eq!(r["result"]["bytes"], bytes, "{mode} {size}: {r}");
            assert_eq!(r["result"]["corrupt_bytes"], 0, "{mode} {size}: {r}");
        }
        let st = status(&a);
        let nic = &st["nic"];
        assert_eq!(nic["mode"], port, "{st}");
        assert_eq!(nic["offload"], port == "packet", "{st}");
        assert_eq!(nic["counters"]["drop_bad_checksum"], 0, "{st}");
        assert_eq!(nic["counters"]["drop_too_big"], 0, "{st}");
        let far = status(&b);
        assert_eq!(far["nic"]["counters"]["drop_bad_checksum"], 0, "{far}");
        assert!(
            far["nic"]["counters"]["delivered"].as_u64() > Some(4096),
            "{far}"
        );
        if port == "xdp" {
            // frames of the wire's MTU, most of them larger than one buffer (3,840 bytes)
            assert_eq!(nic["max_frame"], 9014, "{st}");
            let p = &nic["port"];
            let (bytes, frames) = (
                p["tx_bytes"].as_u64().unwrap(),
                p["tx_frames"].as_u64().unwrap(),
            );
            assert!(frames > 0 && bytes / frames > 3840, "{st}");
            assert_eq!(p["tx_bad_completion"], 0, "{st}");
            assert_eq!(p["xsk_tx_invalid"], 0, "{st}");
            // slots came back as their frames were sent: a leak would have emptied the pool
            // of 682 slots and dropped frames for want of one
            assert_eq!(p["tx_ring_full"], 0, "{st}");
            let back = p["tx_completed"].as_u64().unwrap();
            assert!(back <= frames && frames - back < 682, "{st}");
            assert_eq!(far["nic"]["port"]["rx_bad_desc"], 0, "{far}");
            assert_eq!(far["nic"]["port"]["xsk_rx_dropped"], 0, "{far}");
        }
    }
}

#[test]
fn a_pipe_and_a_kernel_socket_on_the_far_host_exchange_checked_streams_both_ways() {
    if !root_or_skip("nic kernel peer") {
        return;
    }
    // Segment offload meets the kernel's own TCP: DockLib's 32 KiB segments leave whole with
    // their checksums left to the link and are cut by the kernel on the far host; the far
    // kernel's TSO segments arrive whole. The far host runs no daemon.
    let wire = Wire::build(1500, &Shape::default()).unwrap();
    // Host A's end finishes nothing in "hardware": its kernel cuts the segments and computes
    // their checksums in software before the veth, as for a NIC without offloads, so a wrong
    // checksum left to the link is dropped by the far kernel (a veth that passed it through
    // would hand it over unchecked).
    let off = Command::new("ip")
        .args(["netns", "exec", &wire.host_a, "ethtool", "-K", WIRE_DEV])
        .args(["tx", "off", "tso", "off"])
        .status()
        .unwrap();
    assert!(off.success(), "ethtool -K (apt-get install ethtool)");
    let a = host_daemon(&wire, &wire.host_a, "packet");
    ok(&a, &["pipe", "create", "c0", "--ip", "10.78.1.1/16"]);
    // host A forwards, with a default route back to host B, as a node routes to its gateway:
    // its kernel's copy of a frame for the pipe (the packet socket is a tap) must not be
    // routed on (the daemon's guard drops it at the link's ingress)
    wire.sysctl(&wire.host_a, "net.ipv4.ip_forward=1").unwrap();
    wire.ip_in(&wire.host_a, &["route", "add", "default", "via", HOST_B])
        .unwrap();
    let far = "10.78.2.9";
    let added = Command::new("ip")
        .args(["-n", &wire.host_b, "addr", "add", &format!("{far}/16")])
        .args(["dev", WIRE_DEV])
        .status()
        .unwrap();
    assert!(added.success());
    let kernel = |role: &str, addr: &str| {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &wire.host_b,
            dnperf(),
            role,
            "--stack",
            "kernel",
        ]);
        if role == "server" {
            c.args(["--bind", addr, "--conns", "1"]);
        } else {
            c.args(["--connect", addr, "--workload", "check", "--json"]);
            c.args(["--bytes", &(256u64 << 20).to_string(), "--size", "65536"]);
        }
        c
    };
    // the pipe sends to the far kernel
    let mut srv = Reaped(
        kernel("server", &format!("{far}:7000"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    checked(
        client(&a, "c0", far, 256 << 20).output().unwrap(),
        256 << 20,
        "pipe to kernel",
    );
    let _ = srv.0.wait();
    // the far kernel sends to the pipe
    let mut srv = Reaped(server(&a, "c0", "10.78.1.1"));
    std::thread::sleep(Duration::from_millis(300));
    checked(
        kernel("client", "10.78.1.1:7000").output().unwrap(),
        256 << 20,
        "kernel to pipe",
    );
    let _ = srv.0.wait();
    assert_eq!(
        forwarded(&wire.host_a),
        0,
        "host A's kernel routed frames for the pipe on"
    );
    let st = status(&a);
    let nic = &st["nic"];
    assert_eq!(nic["offload"], true, "{st}");
    assert_eq!(nic["counters"]["drop_too_big"], 0, "{st}");
    assert_eq!(nic["counters"]["drop_malformed"], 0, "{st}");
    // 256 MiB each way: in frames of the wire's MTU, about 370,000 in all
    let c = &nic["counters"];
    let frames = c["sent"].as_u64().unwrap() + c["delivered"].as_u64().unwrap();
    assert!(frames < 200_000, "segments moved whole: {st}");
}

#[test]
fn a_container_lying_in_large_segments_to_the_wire_hurts_only_itself() {
    if !root_or_skip("nic offload lies") {
        return;
    }
    // A container sends 60 KiB TCP segments to an address on the wire, most with a lie in a
    // header segment offload reads (lengths, fragment bits, truncation, flipped bytes): the
    // lies are dropped and counted, the truthful ones leave whole, and the daemon goes on
    // moving other containers' traffic intact.
    let (st, r) = lies_to_the_wire("packet", 1500, 60 * 1024);
    let sent = |k: &str| r["sent"][k].as_u64().unwrap_or(0);
    // fragments are never cut: too big for the wire
    assert!(
        st["nic"]["counters"]["drop_too_big"].as_u64().unwrap()
            >= sent("more-fragments") + sent("fragment-offset"),
        "{r} {st}"
    );
}

#[test]
fn a_container_lying_in_jumbo_frames_to_an_af_xdp_wire_hurts_only_itself() {
    if !root_or_skip("nic jumbo lies") {
        return;
    }
    // The same lies in segments that fill a jumbo frame, on a wire driven by AF_XDP, whose
    // frames of 9,000 bytes leave in three 4 KiB buffers each (multi-buffer XDP): the lies
    // about lengths are dropped and counted before any buffer is taken, the frames that leave
    // take their buffers back, and the daemon goes on moving others' traffic intact.
    let (st, _) = lies_to_the_wire("xdp", 9000, 8900);
    let p = &st["nic"]["port"];
    assert_eq!(st["nic"]["mode"], "xdp", "{st}");
    assert_eq!(p["tx_bad_completion"], 0, "{st}");
    assert_eq!(p["xsk_tx_invalid"], 0, "{st}");
    assert_eq!(p["tx_ring_full"], 0, "{st}");
    let (bytes, frames) = (
        p["tx_bytes"].as_u64().unwrap(),
        p["tx_frames"].as_u64().unwrap(),
    );
    assert!(frames > 0 && bytes / frames > 3840, "{st}");
}

/// `dnattack gso-lies` from a container on host A's daemon (wire driven in `mode`, MTU `mtu`)
/// with segments of `payload` bytes: every segment sent, the lies about lengths dropped and
/// counted, the truthful ones sent, and a checked transfer between two other containers intact
/// after. Host A's status and the attack's report.
fn lies_to_the_wire(mode: &str, mtu: u32, payload: u32) -> (serde_json::Value, serde_json::Value) {
    let (_wire, a, b) = two_nodes_at(mtu, mode, "10.78.1.1/16", "10.78.2.1/16");
    let m = mtu.to_string();
    let evil = ["pipe", "create", "evil", "--ip", "10.78.1.66/16", "--mtu"];
    ok(&a, &[&evil[..], &[m.as_str()]].concat());
    let size = payload.to_string();
    let lies = ["gso-lies", "--to", HOST_B, "--count", "200", "--payload"];
    let args = [&lies[..], &[size.as_str()]].concat();
    let r = result_of(attack(&a, "evil", &args), "gso-lies");
    let sent = |k: &str| r["sent"][k].as_u64().unwrap_or(0);
    assert_eq!(
        r["sent"]
            .as_object()
            .unwrap()
            .values()
            .filter_map(|v| v.as_u64())
            .sum::<u64>(),
        200,
        "{r}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let st = status(&a);
    let c = &st["nic"]["counters"];
    let n = |k: &str| c[k].as_u64().unwrap();
    let evil = pipe_show(&a, "evil");
    let dropped_by_master = evil["counters"]["drop_malformed"].as_u64().unwrap();
    // lengths past the frame or short of the headers: malformed, at the edge or before it
    let lies = sent("ip-length-past") + sent("ip-length-short") + sent("truncated");
    assert!(
        n("drop_malformed") + dropped_by_master >= lies + sent("tcp-offset-small"),
        "{r} {st} {evil}"
    );
    // the truthful ones left, whole
    assert!(n("sent") >= sent("truthful"), "{r} {st}");
    // and the daemon still moves others' traffic, intact
    let t = transfer(&a, &b, 64 << 20);
    assert_eq!(t["result"]["corrupt_bytes"], 0, "{t}");
    assert_eq!(t["result"]["bytes"], 64u64 << 20, "{t}");
    (status(&a), r)
}

#[test]
fn routes_send_pods_on_other_nodes_through_those_nodes_addresses() {
    if !root_or_skip("nic routes") {
        return;
    }
    for mode in ["xdp", "packet"] {
        // a pod network per node inside one cluster network: each pipe's prefix is the
        // cluster's, and each node reaches the other's pods through the other's address
        let (wire, a, b) = two_nodes(mode, "10.244.1.1/16", "10.244.2.1/16");
        ok(&a, &["pipe", "create", "c1", "--ip", "10.244.1.2/16"]);
        ok(&b, &["pipe", "create", "s1", "--ip", "10.244.2.2/16"]);
        ok(&b, &["route", "add", "10.244.1.0/24", "--via", HOST_A]);

        // a next hop that does not answer: nothing reaches node B
        let r = ok(
            &a,
            &["route", "add", "10.244.2.0/24", "--via", "192.168.77.9"],
        );
        assert!(r.contains("10.244.2.0/24 via 192.168.77.9"), "{r}");
        let mut srv = server(&b, "s0", "10.244.2.1");
        let mut cli = client(&a, "c0", "10.244.2.1", 1 << 20)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        let nic = &status(&a)["nic"];
        assert!(
            nic["counters"]["arp_requests"].as_u64().unwrap() >= 2,
            "{mode}: {nic}"
        );
        assert_eq!(nic["counters"]["sent"], 0, "{mode}: {nic}");
        let s0 = pipe_show(&b, "s0");
        assert_eq!(s0["counters"]["wire_rx"], 0, "{mode}: {s0}");
        let _ = cli.kill();
        let _ = cli.wait();
        let _ = srv.kill();
        let _ = srv.wait();

        // through node B's address: ARP asks node B's kernel, which learns the pod's address
        // from the request; the transfer arrives intact
        let e = ctl(&a, &["route", "add", "10.244.2.0/24", "--via", HOST_B]);
        assert!(!e.status.success(), "{mode}: a second route to one network");
        ok(&a, &["route", "rm", "10.244.2.0/24"]);
        ok(&a, &["route", "add", "10.244.2.0/24", "--via", HOST_B]);
        let ls: serde_json::Value =
            serde_json::from_str(&ok(&a, &["route", "ls", "--json"])).unwrap();
        assert_eq!(
            ls,
            serde_json::json!([{"net": "10.244.2.0/24", "via": HOST_B}]),
            "{mode}"
        );
        let r = transfer_between((&a, "c1"), (&b, "s1", "10.244.2.2"), 64 << 20);
        assert_eq!(r["result"]["bytes"], 64u64 << 20, "{mode}: {r}");
        assert_eq!(r["result"]["corrupt_bytes"], 0, "{mode}: {r}");
        let neigh = Command::new("ip")
            .args(["-n", &wire.host_b, "neigh", "show", "10.244.1.2"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&neigh.stdout).contains("lladdr"),
            "{mode}: node B's kernel was not asked for its address: {}",
            String::from_utf8_lossy(&neigh.stdout)
        );
        let nic = &status(&a)["nic"];
        assert!(nic["counters"]["sent"].as_u64().unwrap() > 1000, "{nic}");
    }
}

/// `tcpdump` in namespace `ns` on `dev`, writing VXLAN datagrams to `file` (killed when
/// dropped).
fn capture_vxlan(ns: &str, dev: &str, file: &Path) -> Reaped {
    let c = Command::new("ip")
        .args([
            "netns", "exec", ns, "tcpdump", "-i", dev, "-nn", "-U", "-s", "200",
        ])
        .arg("-w")
        .arg(file)
        .args(["udp", "port", "4789"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    Reaped(c)
}

/// What `tcpdump -r` makes of a capture, one line per frame, VXLAN's inner frames decoded.
fn read_capture(file: &Path) -> String {
    let o = Command::new("tcpdump")
        .args(["-nn", "-r"])
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `docknet route add NET --via VIA --vxlan VNI` on daemon `d`, which must work.
fn tunnel(d: &Daemon, net: &str, via: &str, vni: &str) -> String {
    ok(d, &["route", "add", net, "--via", via, "--vxlan", vni])
}

#[test]
fn vxlan_routes_tunnel_pods_between_nodes_in_the_kernels_wire_format() {
    if !root_or_skip("nic vxlan") {
        return;
    }
    for mode in ["xdp", "packet"] {
        let (wire, a, b) = two_nodes(mode, "10.244.1.1/16", "10.244.2.1/16");
        let own = ctl(
            &b,
            &[
                "route",
                "add",
                "10.244.1.0/24",
                "--via",
                HOST_B,
                "--vxlan",
                "42",
            ],
        );
        let why = String::from_utf8_lossy(&own.stderr);
        assert!(
            !own.status.success() && why.contains("own address"),
            "{why}"
        );
        let r = tunnel(&a, "10.244.2.0/24", HOST_B, "42");
        assert!(r.contains("vxlan 42"), "{r}");
        tunnel(&b, "10.244.1.0/24", HOST_A, "42");
        let ls: serde_json::Value =
            serde_json::from_str(&ok(&a, &["route", "ls", "--json"])).unwrap();
        assert_eq!(
            ls,
            serde_json::json!([{"net": "10.244.2.0/24", "via": HOST_B, "vxlan": 42}]),
            "{mode}"
        );

        // the transfer arrives intact, and what crossed the wire is VXLAN tcpdump reads
        let dir = tempfile::tempdir().unwrap();
        let pcap = dir.path().join("vxlan.pcap");
        let cap = capture_vxlan(&wire.switch, "pb", &pcap);
        let r = transfer_between((&a, "c0"), (&b, "s0", "10.244.2.1"), 16 << 20);
        assert_eq!(r["result"]["bytes"], 16u64 << 20, "{mode}: {r}");
        assert_eq!(r["result"]["corrupt_bytes"], 0, "{mode}: {r}");
        std::thread::sleep(Duration::from_millis(300));
        drop(cap);
        let text = read_capture(&pcap);
        let head: String = text.chars().take(2000).collect();
        assert!(
            text.contains(&format!("{HOST_A}."))
                && text.contains(&format!("{HOST_B}.4789: VXLAN, flags [I] (0x08), vni 42")),
            "{mode}: {head}"
        );
        assert!(text.contains("> 10.244.2.1.7000: Flags"), "{mode}: {head}");
        let (na, nb) = (status(&a)["nic"].clone(), status(&b)["nic"].clone());
        let sent = na["counters"]["vxlan_sent"].as_u64().unwrap();
        assert!(sent > 100, "{mode}: {na}");
        assert!(na["counters"]["sent"].as_u64().unwrap() >= sent, "{na}");
        assert!(
            nb["counters"]["vxlan_received"].as_u64().unwrap() > 100,
            "{mode}: {nb}"
        );
        assert_eq!(nb["counters"]["drop_vxlan_bad_checksum"], 0, "{nb}");

        // a hostile pod on node A sends node B datagrams that wrap frames claiming another
        // pod's address: node B takes tunnelled frames only from the tunnel's far end
        ok(&a, &["pipe", "create", "evil", "--ip", "10.244.1.66/16"]);
        let rx_before = pipe_show(&b, "s0")["counters"]["wire_rx"].clone();
        let o = attack(
            &a,
            "evil",
            &[
                "vxlan-inject",
                "--to",
                HOST_B,
                "--vni",
                "42",
                "--inner-src",
                "10.244.1.1",
                "--inner-dst",
                "10.244.2.1",
                "--count",
                "50",
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::thread::sleep(Duration::from_millis(300));
        let nb = status(&b)["nic"].clone();
        assert!(
            nb["counters"]["drop_vxlan_spoofed"].as_u64().unwrap() >= 50,
            "{mode}: {nb}"
        );
        assert_eq!(
            pipe_show(&b, "s0")["counters"]["wire_rx"],
            rx_before,
            "{mode}: a wrapped frame from a pod reached the server's pipe"
        );

        // a network identifier node B does not use: refused there and counted
        ok(&b, &["route", "rm", "10.244.1.0/24"]);
        tunnel(&b, "10.244.1.0/24", HOST_A, "43");
        let rx_before = pipe_show(&b, "s0")["counters"]["wire_rx"].clone();
        let mut cli = client(&a, "c0", "10.244.2.1", 1 << 20)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let _ = cli.kill();
        let _ = cli.wait();
        let nb = status(&b)["nic"].clone();
        assert!(
            nb["counters"]["drop_vxlan_unknown_vni"].as_u64().unwrap() > 0,
            "{mode}: {nb}"
        );
        assert_eq!(
            pipe_show(&b, "s0")["counters"]["wire_rx"],
            rx_before,
            "{mode}"
        );
    }
}

/// The inner MAC a DockNet tunnel end at `ip` uses (`02:00` and the address's bytes).
fn tunnel_mac(ip: &str) -> String {
    let ip: std::net::Ipv4Addr = ip.parse().unwrap();
    let o = ip.octets();
    format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
}

#[test]
fn a_linux_vxlan_device_and_a_docknet_daemon_are_the_two_ends_of_one_tunnel() {
    if !root_or_skip("nic vxlan with the kernel") {
        return;
    }
    for mode in ["xdp", "packet"] {
        let wire = Wire::build(1500, &Shape::default()).unwrap();
        let a = host_daemon(&wire, &wire.host_a, mode);
        ok(&a, &["pipe", "create", "c0", "--ip", "10.244.1.1/16"]);
        tunnel(&a, "10.244.2.0/24", HOST_B, "42");
        // node B: the kernel's VXLAN device, set up as flannel's vxlan backend sets it up
        let hb = wire.host_b.as_str();
        let vx_mac = tunnel_mac(HOST_B);
        ip_in(
            hb,
            &[
                "ip",
                "link",
                "add",
                "vx0",
                "address",
                &vx_mac,
                "type",
                "vxlan",
                "id",
                "42",
                "dstport",
                "4789",
                "local",
                HOST_B,
                "dev",
                WIRE_DEV,
                "nolearning",
            ],
        );
        ip_in(hb, &["ip", "addr", "add", "10.244.2.1/24", "dev", "vx0"]);
        ip_in(hb, &["ip", "link", "set", "vx0", "up"]);
        // a virtual link leaves the kernel's checksums to an offload that never happens, and
        // AF_XDP cannot tell (a NIC computes them before the wire): computed in software here
        ip_in(hb, &["ethtool", "-K", "vx0", "tx", "off"]);
        ip_in(hb, &["ip", "route", "add", "10.244.1.0/24", "dev", "vx0"]);
        let a_mac = tunnel_mac(HOST_A);
        ip_in(
            hb,
            &[
                "ip",
                "neigh",
                "add",
                "10.244.1.1",
                "lladdr",
                &a_mac,
                "dev",
                "vx0",
                "nud",
                "permanent",
            ],
        );
        ip_in(
            hb,
            &[
                "bridge", "fdb", "append", &a_mac, "dev", "vx0", "dst", HOST_A,
            ],
        );
        // a kernel server on node B, a DockNet client on node A
        let mut srv = Reaped(
            Command::new("ip")
                .args(["netns", "exec", hb, dnperf()])
                .args(["server", "--stack", "kernel", "--bind", "10.244.2.1:7000"])
                .args(["--conns", "1"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        std::thread::sleep(Duration::from_millis(300));
        let o = client(&a, "c0", "10.244.2.1", 16 << 20).output().unwrap();
        assert!(
            o.status.success(),
            "{mode}: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            status(&a)["nic"]
        );
        let r: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().last().unwrap())
                .unwrap();
        assert_eq!(r["result"]["bytes"], 16u64 << 20, "{mode}: {r}");
        assert_eq!(r["result"]["corrupt_bytes"], 0, "{mode}: {r}");
        let _ = srv.0.wait();
        let na = status(&a)["nic"].clone();
        assert!(
            na["counters"]["vxlan_received"].as_u64().unwrap() > 100,
            "{mode}: {na}"
        );
    }
}

#[test]
fn a_killed_daemon_leaves_no_xdp_program_and_a_new_one_starts() {
    if !root_or_skip("nic kill") {
        return;
    }
    let wire = Wire::build(1500, &Shape::default()).unwrap();
    let run = tempfile::tempdir().unwrap();
    let sock = run.path().join("ctl.sock");
    let start = || {
        let mut c = Command::new("ip")
            .args(["netns", "exec", &wire.host_a, EXE, "--socket"])
            .arg(&sock)
            .args(["daemon", "--run-dir"])
            .arg(run.path().join("run"))
            .args(["--nic", WIRE_DEV, "--nic-mode", "xdp"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // it says "ready" once it serves
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(c.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert!(line.starts_with("ready"), "{line}");
        c
    };
    // the link's offload: an XDP program on host A's end turns off its peer's segment offload
    // (the switch's port sends it frames of the MTU), and gives it back when it goes
    assert!(port_tso(&wire, "pa"), "before the daemon");
    let mut d = start();
    assert!(xdp_attached(&wire.host_a));
    assert!(!port_tso(&wire, "pa"), "while XDP runs");
    d.kill().unwrap();
    d.wait().unwrap();
    // the program was attached through a BPF link the daemon's process held
    let t = std::time::Instant::now();
    while xdp_attached(&wire.host_a) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "XDP still attached after kill -9"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(port_tso(&wire, "pa"), "segment offload back after kill -9");
    let mut d = start();
    assert!(xdp_attached(&wire.host_a));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(d.wait().unwrap().success());
    assert!(!xdp_attached(&wire.host_a));
    assert!(port_tso(&wire, "pa"), "segment offload back after a stop");
    // the fd holder of that run directory leaves once it holds nothing; end it if not
    if let Ok(p) = std::fs::read_to_string(run.path().join("run/holder.pid")) {
        if let Ok(pid) = p.trim().parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[test]
fn a_missing_or_down_link_gets_one_line() {
    if !root_or_skip("nic errors") {
        return;
    }
    let run = tempfile::tempdir().unwrap();
    // (a daemon that starts where it should have refused runs until `timeout` ends it: the
    // test fails on its output instead of hanging)
    let daemon = |ns: Option<&str>, link: &str, mode: &str| {
        let mut c = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "timeout", "-s", "KILL", "20", EXE]);
                c
            }
            None => {
                let mut c = Command::new("timeout");
                c.args(["-s", "KILL", "20", EXE]);
                c
            }
        };
        c.arg("--socket")
            .arg(run.path().join("s"))
            .args(["daemon", "--ephemeral", "--run-dir"])
            .arg(run.path().join("r"))
            .args(["--nic", link, "--nic-mode", mode])
            .output()
            .unwrap()
    };
    let o = daemon(None, "dn-no-such-link", "auto");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("dn-no-such-link does not exist") && err.trim().lines().count() == 1,
        "{err}"
    );
    let wire = Wire::build(1500, &Shape::default()).unwrap();
    let _ = Command::new("ip")
        .args(["-n", &wire.host_a, "link", "set", WIRE_DEV, "down"])
        .status();
    let o = daemon(Some(&wire.host_a), WIRE_DEV, "auto");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("is down") && err.contains("ip link set") && err.trim().lines().count() == 1,
        "{err}"
    );
    // an MTU AF_XDP cannot take (more than 16 buffers a frame) says what to do instead
    // (auto would take AF_PACKET)
    let _ = Command::new("ip")
        .args([
            "-n",
            &wire.host_a,
            "link",
            "set",
            WIRE_DEV,
            "mtu",
            "65535",
            "up",
        ])
        .status();
    let o = daemon(Some(&wire.host_a), WIRE_DEV, "xdp");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("--nic-mode packet"), "{err}");
}
