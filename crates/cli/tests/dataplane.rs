//! The data plane with real processes in real namespaces: containers exchanging frames through
//! the daemon and through fast channels, isolation, a hostile container, daemon restart, idle.

mod common;
use common::*;
use std::time::{Duration, Instant};

const RR: &[&str] = &[
    "raw", "peer", "--role", "rr", "--size", "64", "--warmup", "0.1",
];

fn pair(lab: &Lab, a: &str, b: &str, net: u8) -> (String, String) {
    let (ia, ib) = (format!("10.{net}.0.1"), format!("10.{net}.0.2"));
    lab.ok(&["pipe", "create", a, "--ip", &format!("{ia}/24")]);
    lab.ok(&["pipe", "create", b, "--ip", &format!("{ib}/24")]);
    (ia, ib)
}

/// Starts a raw peer server (`echo` or `sink`) in `pipe` that exits after `quiet` idle seconds.
fn server(lab: &mut Lab, pipe: &str, role: &str, quiet: &str) -> usize {
    lab.spawn_in(
        pipe,
        None,
        &[
            EXE,
            "raw",
            "peer",
            "--role",
            role,
            "--idle",
            "adaptive",
            "--quiet-exit",
            quiet,
        ],
    )
}

/// Runs an echo server in `server_pipe` and an rr client in `client` against `dst`.
fn rr(lab: &mut Lab, client: &str, server_pipe: &str, dst: &str, secs: &str) -> serde_json::Value {
    let srv = server(lab, server_pipe, "echo", "5");
    std::thread::sleep(Duration::from_millis(200));
    let mut args: Vec<&str> = vec![EXE];
    args.extend_from_slice(RR);
    args.extend_from_slice(&["--dst", dst, "--duration", secs, "--idle", "adaptive"]);
    let c = lab.spawn_in(client, None, &args);
    let out = lab.wait(c, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = lab.wait(srv, Duration::from_secs(20));
    peer_json(&out)
}

#[test]
fn two_containers_exchange_frames_through_the_daemon_and_through_a_fast_channel() {
    if !root_or_skip("exchange") {
        return;
    }
    let mut lab = Lab::start("adaptive");
    let (_, ib) = pair(&lab, "a", "b", 40);
    let v = rr(&mut lab, "a", "b", &ib, "0.5");
    let n = v["transactions"].as_u64().unwrap();
    assert!(n > 100, "{v}");
    assert_eq!(v["lost"], 0);
    assert_eq!(v["rx_via"]["daemon"], n);
    assert_eq!(v["rx_via"]["fc"], 0);
    assert!(lab.counter("a", "tx_packets") >= n);
    assert!(lab.counter("b", "rx_packets") >= n);
    assert_eq!(lab.counter("a", "arp_replies"), 1);

    lab.ok(&["fc", "connect", "a", "b"]);
    let before = lab.counter("a", "tx_packets");
    let v = rr(&mut lab, "a", "b", &ib, "0.5");
    let n = v["transactions"].as_u64().unwrap();
    assert!(n > 100, "{v}");
    assert_eq!(
        v["rx_via"]["fc"], n,
        "replies came over the fast channel: {v}"
    );
    assert_eq!(v["rx_via"]["daemon"], 0);
    // the daemon saw none of it (beyond the STOP frames the client sends at the end)
    assert!(lab.counter("a", "tx_packets") - before < 10);
}

#[test]
fn a_container_sees_only_its_own_pipe_and_a_channel_only_its_partners() {
    if !root_or_skip("isolation") {
        return;
    }
    let lab = Lab::start("adaptive");
    pair(&lab, "a", "b", 41);
    lab.ok(&["pipe", "create", "c", "--ip", "10.41.0.3/24"]);
    lab.ok(&["fc", "connect", "a", "b"]);
    let dir = path_of(&lab.dir).to_string();
    let sh = |pipe: &str, script: &str| {
        let o = lab.in_container(pipe, &["sh", "-c", script]);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    // own pipe visible, nothing else of DockNet's
    let (code, out) = sh(
        "c",
        "ls -A /run/docknet; ls -A /run/docknet/pipe; ls -A /run/docknet/pipe/fc; echo end",
    );
    assert_eq!(code, Some(0));
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["pipe", "dp.map", "fc", "end"],
        "{out}"
    );
    let (_, out) = sh(
        "c",
        &format!("ls -A {dir}; cat {dir}/pipes/a/dp.map >/dev/null 2>&1 && echo LEAK; echo end"),
    );
    assert_eq!(out.trim(), "end", "the run directory is covered: {out}");
    let (_, out) = sh(
        "c",
        &format!("test -e {} && echo LEAK; echo end", path_of(&lab.socket)),
    );
    assert!(!out.contains("LEAK"), "the control socket is covered");
    // a channel is visible to exactly its two partners
    let (_, out) = sh("a", "ls /run/docknet/pipe/fc");
    assert_eq!(out.trim(), "b.map");
    let (_, out) = sh("b", "ls /run/docknet/pipe/fc");
    assert_eq!(out.trim(), "a.map");
    // the covering mounts cannot be undone, and the host's processes are not visible
    let (_, out) = sh("c", &format!("umount {dir} 2>/dev/null && echo UNMOUNTED; umount /run/docknet/pipe 2>/dev/null && echo UNMOUNTED; ls /proc | grep -c '^[0-9]'"));
    assert!(!out.contains("UNMOUNTED"), "{out}");
    assert!(
        out.trim().parse::<u32>().unwrap() < 10,
        "own PID namespace: {out}"
    );
    // and the network namespace holds only lo
    let (_, out) = sh("c", "ls /sys/class/net");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["lo"]);
}

#[test]
fn a_container_scribbling_over_its_whole_region_hurts_only_itself() {
    if !root_or_skip("hostile") {
        return;
    }
    let mut lab = Lab::start("adaptive");
    let (_, ib) = pair(&lab, "a", "b", 42);
    lab.ok(&["pipe", "create", "evil", "--ip", "10.42.0.66/24"]);
    let size = std::fs::metadata(lab.dir.join("pipes/evil/dp.map"))
        .unwrap()
        .len();
    let mib = size.div_ceil(1 << 20).to_string();
    // random bytes over the whole region, again and again, plus a flood of bursts
    let script = format!(
        "end=$(( $(date +%s) + 4 )); while [ $(date +%s) -lt $end ]; do \
         dd if=/dev/urandom of=/run/docknet/pipe/dp.map bs=1M count={mib} conv=notrunc status=none; \
         done"
    );
    let evil = lab.spawn_in("evil", None, &["sh", "-c", &script]);
    std::thread::sleep(Duration::from_millis(300));
    let v = rr(&mut lab, "a", "b", &ib, "2");
    let out = lab.wait(evil, Duration::from_secs(30));
    assert!(out.status.success());
    let n = v["transactions"].as_u64().unwrap();
    assert!(n > 1000, "the others kept working: {v}");
    assert_eq!(v["lost"], 0, "{v}");
    let bad = lab.counter("evil", "bad_desc")
        + lab.counter("evil", "oversize")
        + lab.counter("evil", "ring_overrun");
    assert!(bad > 0, "the corruption was seen and counted");
    // the daemon is alive and still correct for everyone
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(lab.daemon_pid() as i32), None).is_ok()
    );
    assert_eq!(lab.counter("a", "bad_desc"), 0);
    assert_eq!(lab.counter("b", "bad_desc"), 0);
    let v = rr(&mut lab, "a", "b", &ib, "0.3");
    assert!(v["transactions"].as_u64().unwrap() > 100);
}

#[test]
fn a_restarted_daemon_adopts_live_pipes() {
    if !root_or_skip("restart") {
        return;
    }
    let mut lab = Lab::start("adaptive");
    let (_, ib) = pair(&lab, "a", "b", 43);
    lab.ok(&["pipe", "create", "c", "--ip", "10.43.0.3/24"]);
    lab.ok(&["fc", "connect", "a", "c"]);
    // a server attached before the crash keeps its mapping across it
    let srv = server(&mut lab, "b", "echo", "20");
    std::thread::sleep(Duration::from_millis(300));
    lab.kill_daemon();
    lab.start_daemon();
    let ls = lab.json(&["pipe", "ls", "--json"]);
    let names: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(ls[0]["fast_channels"][0], "c", "channels adopted too");
    let mut args: Vec<&str> = vec![EXE];
    args.extend_from_slice(RR);
    args.extend_from_slice(&["--dst", &ib, "--duration", "0.5", "--idle", "adaptive"]);
    let c = lab.spawn_in("a", None, &args);
    let out = lab.wait(c, Duration::from_secs(60));
    let v = peer_json(&out);
    assert!(v["transactions"].as_u64().unwrap() > 100, "{v}");
    assert_eq!(v["lost"], 0);
    let _ = lab.wait(srv, Duration::from_secs(30));
    // and new pipes can be created next to the adopted ones
    lab.ok(&["pipe", "create", "d", "--ip", "10.43.0.4/24"]);
}

#[test]
fn an_idle_adaptive_system_burns_no_cpu() {
    if !root_or_skip("idle") {
        return;
    }
    let mut lab = Lab::start("adaptive");
    pair(&lab, "a", "b", 44);
    lab.ok(&["fc", "connect", "a", "b"]);
    // two attached servers waiting for traffic that never comes
    let a = server(&mut lab, "a", "echo", "30");
    let b = server(&mut lab, "b", "sink", "30");
    std::thread::sleep(Duration::from_millis(500));
    let mut pids = vec![lab.daemon_pid()];
    pids.extend(tree(lab.child_pid(a)));
    pids.extend(tree(lab.child_pid(b)));
    // daemon + (docknet run, its init, the peer) per container
    assert_eq!(pids.len(), 7, "all processes found: {pids:?}");
    let cpu = |ps: &[u32]| ps.iter().map(|p| cpu_seconds(*p)).sum::<f64>();
    let t0 = Instant::now();
    let c0 = cpu(&pids);
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu(&pids) - c0;
    let share = used / t0.elapsed().as_secs_f64();
    assert!(
        share < 0.01,
        "idle daemon + containers used {:.2}% of a core",
        share * 100.0
    );
}

/// `pid` and all its descendants, from the parent links in /proc.
fn tree(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_string_lossy().parse().ok()?;
            let st = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let ppid = st[st.rfind(')')? + 2..]
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((p, ppid))
        })
        .collect();
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let cur = out[i];
        out.extend(parents.iter().filter(|(_, pp)| *pp == cur).map(|(p, _)| *p));
        i += 1;
    }
    out
}
