//! Unit tests of the registry.

use super::state::StateFile;
use super::*;
use docknet_pipe::delivery::{self, Msg, Side};
use docknet_pipe::fdpass;
use std::fs;
use std::os::unix::fs::PermissionsExt;

#[test]
fn names_and_addresses() {
    for ok in ["a", "web-1", "db_2.x", &"n".repeat(32), &"f".repeat(128)] {
        assert!(validate_name(ok).is_ok(), "{ok}");
    }
    for bad in ["", "-x", ".x", "a/b", "../x", "a b", &"n".repeat(129), "é"] {
        assert!(validate_name(bad).is_err(), "{bad}");
    }
    assert_eq!(
        parse_cidr("10.0.0.1/24").unwrap(),
        (Ipv4Addr::new(10, 0, 0, 1), 24)
    );
    assert!(parse_cidr("10.0.0.1/32").is_ok());
    for bad in [
        "10.0.0.1",
        "10.0.0.1/0",
        "10.0.0.1/33",
        "10.0.0.0/24",
        "10.0.0.255/24",
        "0.0.0.0/8",
        "127.0.0.1/8",
        "224.0.0.1/4",
        "x/24",
        "10.0.0.1/x",
    ] {
        assert_eq!(parse_cidr(bad).unwrap_err().code, ErrorCode::BadIp, "{bad}");
    }
}

#[test]
fn ipv6_addresses_are_parsed_checked_recorded_and_handed_out() {
    assert_eq!(
        parse_cidr6("fd00:dc::2/64").unwrap(),
        ("fd00:dc::2".parse().unwrap(), 64)
    );
    for bad in [
        "fd00::1",
        "fd00::1/0",
        "fd00::1/129",
        "::/64",
        "::1/128",
        "ff02::1/64",
        "fe80::1/64",
        "::ffff:10.0.0.1/96",
        "10.0.0.1/24",
        "fd00::1/x",
    ] {
        let e = parse_cidr6(bad).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadIp, "{bad}");
        assert!(!e.message.contains('\n'), "one line: {}", e.message);
    }
    let d = tempfile::tempdir().unwrap();
    let keeper = crate::holder::MemoryKeeper::default();
    let (mut r, _) = Registry::open(d.path(), Some(Box::new(keeper.clone()))).unwrap();
    let none = BTreeMap::new;
    r.create_pipe_dual("a", "10.9.0.1/24", Some("fd00:9::1/64"), None, None, none())
        .unwrap();
    let code = |e: ApiError| e.code;
    assert_eq!(
        code(
            r.create_pipe_dual("b", "10.9.0.2/24", Some("fd00:9::1/64"), None, None, none())
                .unwrap_err()
        ),
        ErrorCode::IpInUse
    );
    assert_eq!(
        code(
            r.create_pipe_dual("b", "10.9.0.2/24", Some("fe80::2/64"), None, None, none())
                .unwrap_err()
        ),
        ErrorCode::BadIp
    );
    r.create_pipe("b", "10.9.0.2/24", None, None).unwrap();
    let info = r.pipe_info("a", false).unwrap();
    assert_eq!(info.ip6.as_deref(), Some("fd00:9::1/64"));
    assert_eq!(r.pipe_info("b", false).unwrap().ip6, None);
    // the flow table knows a's global and link-local addresses, b has none
    let snap = r.snapshot();
    let ia = snap.pipes.iter().position(|p| p.name == "a").unwrap();
    let ll = docknet_pipe::delivery::link_local(mac_for(Ipv4Addr::new(10, 9, 0, 1)));
    assert_eq!(snap.table.lookup6("fd00:9::1".parse().unwrap()), Some(ia));
    assert_eq!(snap.table.lookup6(ll), Some(ia));
    // a's container is told its IPv6 address; b's channel partner learns a's
    r.connect_fc("a", "b", None).unwrap();
    let conn = r.connect_local("b").unwrap();
    let mut buf = [0u8; delivery::MAX_MSG];
    let mut peer6 = None;
    while let Ok(Some((n, _))) = fdpass::recv(conn.as_fd(), &mut buf) {
        match Msg::decode(&buf[..n]).unwrap() {
            Msg::Hello(p) => assert_eq!(p.ip6, None),
            Msg::Channel(c) => peer6 = c.peer_ip6,
            Msg::Synced => break,
            Msg::Closed { .. } | Msg::Services { .. } | Msg::Gateway { .. } => {}
        }
    }
    assert_eq!(peer6, Some("fd00:9::1".parse().unwrap()));
    // recorded, and adopted again after a restart
    drop(r);
    let (mut r, w) = Registry::open(d.path(), Some(Box::new(keeper))).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(r.pipe_info("a", false).unwrap().ip6, info.ip6);
    assert!(r.snapshot().table.lookup6(ll).is_some());
}

#[test]
fn create_refusals_change_nothing_and_the_state_records_what_lives() {
    let d = tempfile::tempdir().unwrap();
    let (mut r, w) = Registry::open(d.path(), None).unwrap();
    assert!(w.is_empty());
    r.create_pipe("a", "10.9.0.1/24", None, None).unwrap();
    r.create_pipe("b", "10.9.0.2/24", Some(9000), None).unwrap();
    let code = |e: ApiError| e.code;
    let before = fs::read(d.path().join("state.json")).unwrap();
    assert_eq!(
        code(r.create_pipe("a", "10.9.0.3/24", None, None).unwrap_err()),
        ErrorCode::Exists
    );
    assert_eq!(
        code(r.create_pipe("c", "10.9.0.1/24", None, None).unwrap_err()),
        ErrorCode::IpInUse
    );
    assert_eq!(
        code(
            r.create_pipe("c", "10.9.0.3/24", Some(10), None)
                .unwrap_err()
        ),
        ErrorCode::BadParams
    );
    assert_eq!(
        code(
            r.create_pipe("c", "10.9.0.3/24", None, Some(3))
                .unwrap_err()
        ),
        ErrorCode::BadParams
    );
    assert_eq!(
        code(r.connect_fc("a", "a", None).unwrap_err()),
        ErrorCode::BadParams
    );
    assert_eq!(
        code(r.connect_fc("a", "zz", None).unwrap_err()),
        ErrorCode::NotFound
    );
    assert_eq!(
        code(r.remove_fc("a", "b").unwrap_err()),
        ErrorCode::NotFound
    );
    assert_eq!(
        code(r.attach("a", "/proc/self/status", None).unwrap_err()),
        ErrorCode::BadParams
    );
    assert_eq!(
        fs::read(d.path().join("state.json")).unwrap(),
        before,
        "refusals write nothing"
    );
    r.connect_fc("a", "b", Some(9000)).unwrap();
    assert_eq!(
        code(r.connect_fc("b", "a", None).unwrap_err()),
        ErrorCode::Exists
    );
    let st: StateFile =
        serde_json::from_slice(&fs::read(d.path().join("state.json")).unwrap()).unwrap();
    assert_eq!(st.pipes.len(), 2);
    assert_eq!((st.fcs.len(), st.fcs[0].id, st.next_channel), (1, 1, 2));
    let mode = fs::metadata(d.path()).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777,
        0o700,
        "the run directory is the daemon's only"
    );
    r.remove_pipe("b").unwrap();
    assert!(r.fc_peers("a").is_empty());
    assert_eq!(code(r.remove_pipe("b").unwrap_err()), ErrorCode::NotFound);
    let st: StateFile =
        serde_json::from_slice(&fs::read(d.path().join("state.json")).unwrap()).unwrap();
    assert_eq!((st.pipes.len(), st.fcs.len()), (1, 0));
}

#[test]
fn a_failed_save_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(d.path(), None).unwrap();
    r.create_pipe("a", "10.9.0.1/24", None, None).unwrap();
    r.create_pipe("b", "10.9.0.2/24", None, None).unwrap();
    // state.json.tmp cannot be created: every change must fail whole
    fs::create_dir(d.path().join("state.json.tmp")).unwrap();
    assert!(r.create_pipe("c", "10.9.0.3/24", None, None).is_err());
    assert!(r.get("c").is_err());
    assert!(r.connect_fc("a", "b", None).is_err());
    assert!(r.fc_peers("a").is_empty());
    assert!(r.remove_pipe("a").is_err());
    assert!(r.get("a").is_ok(), "a refused removal keeps the pipe");
    fs::remove_dir(d.path().join("state.json.tmp")).unwrap();
    r.connect_fc("a", "b", None).unwrap();
}

#[test]
fn a_reopened_registry_adopts_what_its_keeper_kept() {
    let d = tempfile::tempdir().unwrap();
    let keeper = crate::holder::MemoryKeeper::default();
    let (mut r, _) = Registry::open(d.path(), Some(Box::new(keeper.clone()))).unwrap();
    r.create_pipe("a", "10.9.0.1/24", None, None).unwrap();
    let labels = BTreeMap::from([("docknet.io/owner".to_string(), "cni".to_string())]);
    r.create_pipe_labeled("b", "10.9.0.2/24", Some(9000), Some(64), labels)
        .unwrap();
    r.connect_fc("a", "b", None).unwrap();
    let ns = format!("/proc/{}/ns/net", std::process::id());
    r.attach(
        "a",
        &ns,
        Some(&format!("docknet-test/{}", std::process::id())),
    )
    .unwrap();
    let before = fs::read(d.path().join("state.json")).unwrap();
    let mem = r.pipe_info("b", false).unwrap();
    drop(r); // the daemon dies; the keeper keeps
    let (mut r, w) = Registry::open(d.path(), Some(Box::new(keeper.clone()))).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(fs::read(d.path().join("state.json")).unwrap(), before);
    assert_eq!(r.pipe_info("b", false).unwrap(), mem);
    assert_eq!(r.fc_peers("a"), ["b"]);
    assert_eq!(r.attachments().len(), 1);
    assert_eq!(
        keeper.list().unwrap().len(),
        4,
        "pipe a, pipe b, channel, socket"
    );
    r.remove_pipe("a").unwrap();
    assert_eq!(
        keeper.list().unwrap().keys().collect::<Vec<_>>(),
        ["pipe/b"]
    );
}

#[test]
fn long_names_and_labels_are_checked_recorded_and_reported() {
    let d = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(d.path(), None).unwrap();
    let id = "0123456789abcdef".repeat(4); // a container ID from containerd
    let labels = BTreeMap::from([
        ("docknet.io/owner".to_string(), "cni".to_string()),
        ("cni.dev/ifname".to_string(), "eth0".to_string()),
    ]);
    r.create_pipe_labeled(&id, "10.9.0.1/24", None, None, labels.clone())
        .unwrap();
    assert_eq!(r.pipe_info(&id, false).unwrap().labels, labels);
    let st: serde_json::Value =
        serde_json::from_slice(&fs::read(d.path().join("state.json")).unwrap()).unwrap();
    assert_eq!(st["pipes"][0]["labels"]["cni.dev/ifname"], "eth0");
    let mut code = |l: BTreeMap<String, String>| {
        r.create_pipe_labeled("x", "10.9.0.2/24", None, None, l)
            .unwrap_err()
            .code
    };
    let many: BTreeMap<String, String> =
        (0..17).map(|i| (format!("k{i}"), String::new())).collect();
    for bad in [
        many,
        BTreeMap::from([("/k".to_string(), "v".to_string())]),
        BTreeMap::from([("k y".to_string(), "v".to_string())]),
        BTreeMap::from([("k".to_string(), "new\nline".to_string())]),
        BTreeMap::from([("k".to_string(), "v".repeat(1025))]),
    ] {
        assert_eq!(code(bad), ErrorCode::BadParams);
    }
    assert!(r.get("x").is_err(), "a refused pipe is not created");
    r.remove_pipe(&id).unwrap();
    assert!(r.labels.is_empty());
}

#[test]
fn state_records_are_checked_again_on_load() {
    let d = tempfile::tempdir().unwrap();
    let bad = r#"{"version": 2, "pipes": [
        {"name": "../x", "ip": "10.0.0.1", "prefix": 24, "mtu": 1500, "ring_depth": 1024},
        {"name": "p0", "ip": "10.0.0.2", "prefix": 0, "mtu": 1500, "ring_depth": 1024},
        {"name": "huge", "ip": "10.0.0.3", "prefix": 24, "mtu": 65535, "ring_depth": 65536},
        {"name": "mtu", "ip": "10.0.0.4", "prefix": 24, "mtu": 5, "ring_depth": 1024},
        {"name": "lab", "ip": "10.0.0.5", "prefix": 24, "mtu": 1500, "ring_depth": 1024,
         "labels": {"-x": "y"}}],
        "fcs": [{"id": 1, "a": "x", "b": "x", "mtu": 1500, "ring_depth": 2}],
        "attached": [{"pipe": "p0", "socket": "@@"}]}"#;
    fs::write(d.path().join("state.json"), bad).unwrap();
    let (r, w) = Registry::open(d.path(), None).unwrap();
    assert_eq!(r.pipes().count(), 0);
    assert_eq!(w.len(), 7, "{w:?}");
    assert!(w[4].contains("labels"), "{w:?}");
    assert!(w[1].contains("prefix"), "{w:?}");
}

#[test]
fn a_connection_gets_its_pipe_and_channels_and_every_change() {
    let d = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(d.path(), None).unwrap();
    r.create_pipe("a", "10.9.0.1/24", None, None).unwrap();
    r.create_pipe("b", "10.9.0.2/24", None, None).unwrap();
    r.connect_fc("a", "b", None).unwrap();
    let c = r.connect_local("b").unwrap();
    let mut buf = [0u8; delivery::MAX_MSG];
    let mut next = || {
        let (n, fd) = fdpass::recv(c.as_fd(), &mut buf).unwrap().unwrap();
        (Msg::decode(&buf[..n]).unwrap(), fd.is_some())
    };
    let (hello, fd) = next();
    assert!(fd && matches!(hello, Msg::Hello(ref p) if p.name == "b" && p.depth == 1024));
    let (ch, fd) = next();
    let Msg::Channel(ch) = ch else {
        panic!("{ch:?}")
    };
    assert!(fd);
    assert_eq!(
        (ch.side, ch.peer.as_str(), ch.peer_ip),
        (Side::B, "a", Ipv4Addr::new(10, 9, 0, 1))
    );
    assert_eq!(ch.peer_mac, mac_for(Ipv4Addr::new(10, 9, 0, 1)));
    assert_eq!(next(), (Msg::Synced, false));
    r.remove_fc("a", "b").unwrap();
    assert_eq!(next(), (Msg::Closed { id: ch.id }, false));
    assert_eq!(r.connections("b"), 1);
    drop(c);
    assert_eq!(r.connections("b"), 0, "a closed connection is pruned");
    for _ in 0..MAX_CONNS {
        std::mem::forget(r.connect_local("a").unwrap());
    }
    assert_eq!(r.connect_local("a").unwrap_err().code, ErrorCode::Busy);
    assert_eq!(
        r.pipe_info("a", true).unwrap().counters.unwrap()["attach_refused"],
        1
    );
}

#[test]
fn a_daemon_with_a_link_gives_each_connection_the_gateway_after_its_pipe() {
    let d = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(d.path(), None).unwrap();
    r.create_pipe("a", "10.9.0.1/24", None, None).unwrap();
    let first_two = |r: &mut Registry| {
        let c = r.connect_local("a").unwrap();
        let mut buf = [0u8; delivery::MAX_MSG];
        let mut next = || {
            let (n, _) = fdpass::recv(c.as_fd(), &mut buf).unwrap().unwrap();
            Msg::decode(&buf[..n]).unwrap()
        };
        (next(), next())
    };
    let (hello, then) = first_two(&mut r);
    assert!(matches!(hello, Msg::Hello(_)));
    assert_eq!(then, Msg::Synced, "no link, no gateway");
    r.set_gateway(Some([2, 0, 0, 0, 0, 1]));
    let (hello, then) = first_two(&mut r);
    assert!(matches!(hello, Msg::Hello(_)));
    assert_eq!(
        then,
        Msg::Gateway {
            ip: delivery::GATEWAY
        }
    );
    // over a host link the node routes: the daemon keeps no routes of its own
    r.set_host_link(true);
    let e = r.add_route("10.9.2.0/24", "192.168.1.2", None).unwrap_err();
    assert!(e.message.contains("--host-link"), "{e:?}");
    assert!(r.routes().is_empty());
}

#[test]
fn routes_are_checked_saved_adopted_again_and_refused_without_a_link() {
    let d = tempfile::tempdir().unwrap();
    let (mut r, _) = Registry::open(d.path(), None).unwrap();
    r.create_pipe("a", "10.9.1.1/16", None, None).unwrap();
    let no_link = r.add_route("10.9.2.0/24", "192.168.1.2", None).unwrap_err();
    assert!(no_link.message.contains("--nic"), "{no_link:?}");
    r.set_gateway(Some([2, 0, 0, 0, 0, 1]));
    r.add_route("10.9.2.0/24", "192.168.1.2", None).unwrap();
    r.add_route("0.0.0.0/0", "192.168.1.254", None).unwrap();
    for (net, via, code) in [
        ("10.9.2.0/24", "192.168.1.3", ErrorCode::Exists),
        ("10.9.3.1/24", "192.168.1.3", ErrorCode::BadIp),
        ("10.9.3.0/33", "192.168.1.3", ErrorCode::BadIp),
        ("10.9.3.0", "192.168.1.3", ErrorCode::BadIp),
        ("10.9.3.0/24", "10.9.2.7", ErrorCode::BadIp),
        ("10.9.3.0/24", "10.9.1.1", ErrorCode::BadIp),
        ("10.9.3.0/24", "x", ErrorCode::BadIp),
        ("10.9.3.0/24", "224.0.0.1", ErrorCode::BadIp),
    ] {
        let e = r.add_route(net, via, None).unwrap_err();
        assert_eq!(e.code, code, "{net} via {via}: {e:?}");
    }
    assert_eq!(
        r.remove_route("10.9.4.0/24").unwrap_err().code,
        ErrorCode::NotFound
    );
    // a failed save changes nothing
    fs::create_dir(d.path().join("state.json.tmp")).unwrap();
    assert!(r.add_route("10.9.5.0/24", "192.168.1.5", None).is_err());
    assert!(r.remove_route("10.9.2.0/24").is_err());
    fs::remove_dir(d.path().join("state.json.tmp")).unwrap();
    let want = vec![
        crate::route::Route {
            net: Ipv4Addr::UNSPECIFIED,
            prefix: 0,
            via: Ipv4Addr::new(192, 168, 1, 254),
            vxlan: None,
        },
        crate::route::Route {
            net: Ipv4Addr::new(10, 9, 2, 0),
            prefix: 24,
            via: Ipv4Addr::new(192, 168, 1, 2),
            vxlan: None,
        },
    ];
    assert_eq!(r.routes(), want);
    let snap = r.snapshot();
    assert_eq!(
        snap.routes.next_hop(Ipv4Addr::new(10, 9, 2, 9)).link,
        Ipv4Addr::new(192, 168, 1, 2)
    );
    drop(r);
    let (mut r, w) = Registry::open(d.path(), None).unwrap();
    assert!(w.iter().all(|w| !w.contains("route")), "{w:?}");
    assert_eq!(r.routes(), want);
    r.set_gateway(Some([2, 0, 0, 0, 0, 1]));
    r.remove_route("0.0.0.0/0").unwrap();
    assert_eq!(r.routes(), want[1..]);

    // a pipe cannot take a route's next hop, as a route cannot take a pipe's address
    let e = r
        .create_pipe("hop", "192.168.1.2/24", None, None)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::IpInUse, "{e:?}");
    assert!(e.message.contains("next hop"), "{e:?}");

    // a tunnel needs the link's own address to leave from, and goes to another node
    let e = r
        .add_route("10.9.6.0/24", "192.168.1.6", Some(1))
        .unwrap_err();
    assert!(e.message.contains("no IPv4 address"), "{e:?}");
    r.set_link_addr(Some(Ipv4Addr::new(192, 168, 1, 1)));
    let e = r
        .add_route("10.9.6.0/24", "192.168.1.1", Some(1))
        .unwrap_err();
    assert!(e.message.contains("own address"), "{e:?}");
    let e = r
        .add_route("10.9.6.0/24", "192.168.1.6", Some(1 << 24))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::BadIp, "{e:?}");
    let t = r.add_route("10.9.6.0/24", "192.168.1.6", Some(42)).unwrap();
    assert_eq!(t.to_string(), "10.9.6.0/24 via 192.168.1.6 vxlan 42");
    drop(r);
    let (r, w) = Registry::open(d.path(), None).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert!(r.routes().contains(&t), "{:?}", r.routes());
    assert_eq!(r.snapshot().routes.vnis(), &[42]);
}

#[test]
fn route_records_are_checked_again_on_load() {
    let d = tempfile::tempdir().unwrap();
    let st = r#"{"version": 2, "pipes": [], "fcs": [], "routes": [
        {"net": "10.1.0.0", "prefix": 16, "via": "192.168.1.1"},
        {"net": "10.2.0.1", "prefix": 16, "via": "192.168.1.1"},
        {"net": "10.3.0.0", "prefix": 40, "via": "192.168.1.1"},
        {"net": "10.4.0.0", "prefix": 16, "via": "10.1.2.3"},
        {"net": "10.5.0.0", "prefix": 16, "via": "255.255.255.255"},
        {"net": "10.6.0.0", "prefix": 16, "via": "192.168.1.6", "vxlan": 16777216},
        {"net": "10.1.0.0", "prefix": 16, "via": "192.168.1.2"}]}"#;
    fs::write(d.path().join("state.json"), st).unwrap();
    let (r, w) = Registry::open(d.path(), None).unwrap();
    assert_eq!(w.len(), 6, "{w:?}");
    assert!(w.iter().all(|w| w.starts_with("route ")), "{w:?}");
    assert_eq!(r.routes().len(), 1);
    assert_eq!(r.routes()[0].via, Ipv4Addr::new(192, 168, 1, 1));
}
