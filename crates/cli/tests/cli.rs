//! The control interface as a user meets it: commands, JSON output, errors, permissions.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;

fn err_line(o: &std::process::Output) -> String {
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "expected failure, got success: {e}");
    let lines: Vec<&str> = e.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one clear line on stderr, got {lines:?}");
    lines[0].to_string()
}

#[test]
fn bad_input_is_refused_with_one_line_and_changes_nothing() {
    if !root_or_skip("bad_input") {
        return;
    }
    let lab = Lab::start("adaptive");
    lab.ok(&[
        "pipe",
        "create",
        "a",
        "--ip",
        "10.60.0.1/24",
        "--ip6",
        "fd00:60::1/64",
    ]);
    let before = lab.json(&["pipe", "ls", "--json"]);
    assert_eq!(before[0]["ip6"], "fd00:60::1/64", "{before}");
    let cases: &[(&[&str], &str)] = &[
        (
            &["pipe", "create", "a", "--ip", "10.60.0.9/24"],
            "already exists",
        ),
        (
            &["pipe", "create", "b", "--ip", "10.60.0.1/24"],
            "already used",
        ),
        (
            &["pipe", "create", "b", "--ip", "10.60.0/24"],
            "invalid address",
        ),
        (
            &["pipe", "create", "b", "--ip", "10.60.0.2"],
            "invalid address",
        ),
        (
            &["pipe", "create", "b", "--ip", "10.60.0.2/24", "--mtu", "50"],
            "mtu",
        ),
        (
            &[
                "pipe",
                "create",
                "b",
                "--ip",
                "10.60.0.2/24",
                "--ip6",
                "fd00:60::1/64",
            ],
            "already used",
        ),
        (
            &[
                "pipe",
                "create",
                "b",
                "--ip",
                "10.60.0.2/24",
                "--ip6",
                "fe80::2/64",
            ],
            "invalid IPv6 address",
        ),
        (
            &[
                "pipe",
                "create",
                "b",
                "--ip",
                "10.60.0.2/24",
                "--ip6",
                "fd00:60::2",
            ],
            "invalid IPv6 address",
        ),
        (
            &[
                "pipe",
                "create",
                "b",
                "--ip",
                "10.60.0.2/24",
                "--ip6",
                "10.60.0.2/24",
            ],
            "invalid IPv6 address",
        ),
        (
            &["pipe", "create", "../x", "--ip", "10.60.0.2/24"],
            "invalid pipe name",
        ),
        (&["pipe", "rm", "nope"], "no pipe named"),
        (&["pipe", "show", "nope", "--json"], "no pipe named"),
        (&["fc", "connect", "a", "nope"], "no pipe named"),
        (&["fc", "connect", "a", "a"], "two different pipes"),
        (&["fc", "rm", "a", "a"], "no fast channel"),
        (&["run", "--pipe", "nope", "--", "true"], "no pipe named"),
        (
            &["run", "--pipe", "a", "--dns-search", "x.y", "--", "true"],
            "--dns <ADDR>",
        ),
        (
            &[
                "run",
                "--pipe",
                "a",
                "--dns",
                "10.0.0.1",
                "--dns-search",
                "a b",
                "--",
                "true",
            ],
            "not a domain name",
        ),
        (
            &[
                "run", "--pipe", "a", "--dns", "10.0.0.1", "--dns", "10.0.0.2", "--dns",
                "10.0.0.3", "--dns", "10.0.0.4", "--", "true",
            ],
            "at most 3 servers",
        ),
        (
            &["pipe", "attach", "a", "--netns", "/etc/passwd"],
            "not a namespace file",
        ),
        (
            &["pipe", "attach", "nope", "--netns", "/proc/self/ns/net"],
            "no pipe named",
        ),
        (&["pipe", "detach", "a"], "not attached"),
    ];
    for (args, want) in cases {
        let line = err_line(&lab.run(args));
        assert!(line.starts_with("docknet: error: "), "{line}");
        assert!(line.contains(want), "{args:?}: {line:?} lacks {want:?}");
    }
    assert_eq!(
        lab.json(&["pipe", "ls", "--json"]),
        before,
        "nothing changed"
    );
    assert_eq!(
        files(&lab.dir),
        [
            "ctl.sock",
            "holder.pid",
            "holder.sock",
            "lock",
            "state.json"
        ],
        "a refused request leaves no file behind"
    );
}

/// The names in a directory, sorted.
fn files(d: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn daemon_not_running_is_one_clear_line() {
    let o = std::process::Command::new(EXE)
        .args(["--socket", "/nonexistent/docknet.sock", "pipe", "ls"])
        .output()
        .unwrap();
    let l = err_line(&o);
    assert!(l.contains("daemon not running"), "{l}");
}

#[test]
fn pipes_list_show_and_remove_with_json_and_permissions() {
    if !root_or_skip("pipes_list_show") {
        return;
    }
    let lab = Lab::start("adaptive");
    let a = lab.json(&["pipe", "create", "a", "--ip", "10.61.0.1/24", "--json"]);
    assert_eq!(a["mac"], "02:dc:0a:3d:00:01");
    lab.ok(&[
        "pipe",
        "create",
        "b",
        "--ip",
        "10.61.0.2/24",
        "--mtu",
        "9000",
    ]);
    // a channel's MTU is its pipes' smaller one unless asked
    let fc = lab.json(&["fc", "connect", "a", "b", "--json"]);
    assert_eq!(fc["mtu"], 1500);
    let ls = lab.json(&["pipe", "ls", "--json"]);
    assert_eq!(ls.as_array().unwrap().len(), 2);
    assert_eq!(ls[1]["mtu"], 9000);
    assert_eq!(ls[0]["fast_channels"][0], "b");
    let show = lab.json(&["pipe", "show", "a", "--json"]);
    for c in [
        "tx_packets",
        "rx_packets",
        "bad_desc",
        "ring_overrun",
        "drop_rx_full",
    ] {
        assert_eq!(show["counters"][c], 0, "{c}");
    }
    let human = lab.ok(&["pipe", "ls"]);
    assert!(
        human.contains("10.61.0.2/24") && human.contains("NAME"),
        "{human}"
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&lab.socket), 0o600);
    assert_eq!(
        mode(&lab.dir),
        0o700,
        "the run directory is the daemon's only"
    );
    // regions are sealed memfds: no file a container could open exists anywhere
    assert_eq!(
        files(&lab.dir),
        [
            "ctl.sock",
            "holder.pid",
            "holder.sock",
            "lock",
            "state.json"
        ]
    );
    // two rings of 1024 frames of 1536 bytes, allocated whole
    assert!(show["region_bytes"].as_u64().unwrap() > 2 * 1024 * 1536);
    // pipe a's region came from the spare ones, which are made again (regions of that size)
    let t = std::time::Instant::now();
    let st = loop {
        let st = lab.json(&["status", "--json"]);
        if st["spare_regions_ready"] == st["spare_regions"] {
            break st;
        }
        assert!(
            t.elapsed().as_secs() < 10,
            "the spares were not made again: {st}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(st["spare_regions"], 4, "{st}");
    assert_eq!(st["spare_region_bytes"], show["region_bytes"], "{st}");
    assert!(lab.ok(&["status"]).contains("4 of 4 ready"));
    assert!(show["socket"].is_null() && show["connections"] == 0);
    lab.ok(&["fc", "rm", "b", "a"]);
    assert!(lab.json(&["pipe", "show", "a", "--json"])["fast_channels"]
        .as_array()
        .unwrap()
        .is_empty());
    lab.ok(&["pipe", "rm", "a"]);
    assert_eq!(
        lab.json(&["pipe", "ls", "--json"])
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn malformed_control_lines_get_errors_and_the_daemon_carries_on() {
    if !root_or_skip("malformed_control") {
        return;
    }
    let lab = Lab::start("adaptive");
    let mut s = std::os::unix::net::UnixStream::connect(&lab.socket).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut ask = |line: &str| {
        s.write_all(line.as_bytes()).unwrap();
        s.write_all(b"\n").unwrap();
        let mut out = String::new();
        r.read_line(&mut out).unwrap();
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    for (line, code) in [
        ("garbage", "bad_request"),
        (
            "{\"v\":1,\"op\":\"pipe_create\",\"name\":\"x\"}",
            "bad_request",
        ),
        ("{\"v\":9,\"op\":\"pipe_ls\"}", "unsupported_version"),
        ("{\"v\":1,\"op\":\"pipe_ls\",\"extra\":1}", "bad_request"),
        (
            "{\"v\":1,\"op\":\"pipe_create\",\"name\":\"x\",\"ip\":\"1.2.3.4/8\",\"mtu\":99999}",
            "bad_params",
        ),
    ] {
        let rep = ask(line);
        assert_eq!(rep["ok"], false, "{line}");
        assert_eq!(rep["error"]["code"], code, "{line}: {rep}");
    }
    let ok = ask("{\"v\":1,\"op\":\"pipe_ls\"}");
    assert_eq!(ok["ok"], true);
    // an oversized line is refused and the connection closed; the daemon still answers others
    let mut big = std::os::unix::net::UnixStream::connect(&lab.socket).unwrap();
    let _ = big.write_all(&vec![b'x'; 200 * 1024]);
    let _ = big.write_all(b"\n");
    let mut rep = String::new();
    let _ = BufReader::new(big).read_line(&mut rep);
    assert!(rep.contains("longer than"), "{rep}");
    assert_eq!(lab.json(&["status", "--json"])["pipes"], 0);
}

#[test]
fn a_second_daemon_on_the_same_run_dir_or_socket_is_refused() {
    if !root_or_skip("second_daemon") {
        return;
    }
    let lab = Lab::start("adaptive");
    let o = std::process::Command::new(EXE)
        .args(["daemon", "--run-dir", path_of(&lab.dir), "--socket"])
        .arg(lab.dir.join("other.sock"))
        .output()
        .unwrap();
    assert!(err_line(&o).contains("in use by another docknet daemon"));
    let other = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(EXE)
        .args([
            "daemon",
            "--run-dir",
            path_of(other.path()),
            "--socket",
            path_of(&lab.socket),
        ])
        .output()
        .unwrap();
    assert!(err_line(&o).contains("already listening"));
}

#[test]
fn the_control_socket_bounds_its_clients_and_sigterm_still_stops_the_daemon() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};
    if !root_or_skip("control_bounds") {
        return;
    }
    let mut lab = Lab::start("adaptive");
    // the harness's readiness probe holds a place until the daemon sees it close
    std::thread::sleep(Duration::from_millis(300));
    let busy_reply = |s: UnixStream| {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        line
    };
    // 63 idle clients and one that sends requests but never reads the replies
    let mut held: Vec<UnixStream> = (0..63)
        .map(|_| UnixStream::connect(&lab.socket).unwrap())
        .collect();
    let mut deaf = UnixStream::connect(&lab.socket).unwrap();
    deaf.set_write_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // every place is taken: one more gets `busy` at once, and nothing waits for it
    let t = Instant::now();
    let line = busy_reply(UnixStream::connect(&lab.socket).unwrap());
    assert!(line.contains("\"busy\""), "{line}");
    assert!(t.elapsed() < Duration::from_secs(2));
    // the deaf client's replies fill its socket; the daemon gives up on it within the write
    // deadline and its place is free again
    let req = b"{\"v\":1,\"op\":\"status\"}\n";
    let t = Instant::now();
    while deaf.write_all(req).is_ok() && t.elapsed() < Duration::from_secs(20) {}
    let t = Instant::now();
    loop {
        let s = UnixStream::connect(&lab.socket).unwrap();
        let mut w = s.try_clone().unwrap();
        // while every place is taken the daemon answers `busy` and closes at once, which can
        // beat this write (EPIPE); the answer is still there to read
        let _ = w.write_all(req);
        let line = busy_reply(s);
        if line.contains("\"ok\":true") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "no place came free: {line}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // fill every place again, then SIGTERM: the daemon stops anyway
    held.extend((0..4).map(|_| UnixStream::connect(&lab.socket).unwrap()));
    std::thread::sleep(Duration::from_millis(200));
    let st = lab
        .signal_daemon(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(5))
        .expect("the daemon stopped on SIGTERM with every place held");
    assert!(st.success(), "{st}");
    drop(held);
}

#[test]
fn a_container_killed_without_detaching_does_not_keep_its_pipe() {
    use std::time::{Duration, Instant};
    if !root_or_skip("stale_attachment") {
        return;
    }
    let mut lab = Lab::start("adaptive");
    lab.ok(&["pipe", "create", "a", "--ip", "10.62.0.1/24"]);
    let c = lab.spawn_in("a", None, &["sleep", "30"]);
    assert!(
        lab.attached_within("a", Duration::from_secs(10)),
        "never attached"
    );
    // a second container for the same pipe is refused while the first lives
    let e = err_line(&lab.run(&["run", "--pipe", "a", "--", "true"]));
    assert!(e.contains("already attached to a running container"), "{e}");
    // A process of the killed container still in its namespace for a moment (a container's
    // processes leave it some milliseconds after their supervisor dies; this one, entered from
    // outside, stays 0.8 s)
    let mut straggler = std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{}/ns/net", lab.child_pid(c)))
        .args(["sleep", "0.8"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // SIGKILL: the supervisor cannot detach (its init and command die with it)
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(lab.child_pid(c) as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = lab.wait(c, Duration::from_secs(10));
    assert!(!lab.json(&["pipe", "show", "a", "--json"])["socket"].is_null());
    // the next container, started at once, waits for the killed one's processes to leave its
    // namespace (here a straggler that stays 0.8 s), finds it empty and takes the pipe
    let t = Instant::now();
    let o = lab.run(&["run", "--pipe", "a", "--", "true"]);
    assert!(o.status.success(), "{}", err_line(&o));
    let _ = straggler.wait();
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn docknet_run_takes_a_relative_command_path_as_a_shell_would() {
    use std::path::Path;
    use std::time::Duration;
    if !root_or_skip("relative_command_path") {
        return;
    }
    let _serial = one_at_a_time();
    let mut lab = Lab::start("adaptive");
    lab.ok(&["pipe", "create", "s", "--ip", "10.63.0.2/24"]);
    lab.ok(&["pipe", "create", "c", "--ip", "10.63.0.3/24"]);
    let dnperf = env!("CARGO_BIN_EXE_dnperf");
    let server = lab.spawn_in(
        "s",
        None,
        &[
            dnperf,
            "server",
            "--stack",
            "docknet",
            "--bind",
            "10.63.0.2:7000",
            "--conns",
            "1",
        ],
    );
    assert!(lab.attached_within("s", Duration::from_secs(10)));
    // from the binaries' directory, by `./dnperf`; and from above it, by `debug/dnperf`
    let bin_dir = Path::new(dnperf).parent().unwrap();
    let (above, last) = (bin_dir.parent().unwrap(), bin_dir.file_name().unwrap());
    let relative = Path::new(last).join("dnperf");
    let o = lab
        .cmd()
        .current_dir(above)
        .args(["run", "--pipe", "c", "--"])
        .arg(&relative)
        .args([
            "client",
            "--stack",
            "docknet",
            "--connect",
            "10.63.0.2:7000",
        ])
        .args([
            "--workload",
            "rr",
            "--duration",
            "0.2",
            "--warmup",
            "0",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}: {}",
        relative.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        peer_json(&o)["result"]["transactions"]
            .as_u64()
            .unwrap_or(0)
            > 0
    );
    let _ = lab.wait(server, Duration::from_secs(10));
    // a directory the container shows is where the command starts, as in a shell; one it does
    // not show leaves it in /
    let pwd = |dir: &Path, bind: bool| {
        let mut c = lab.cmd();
        c.current_dir(dir).args(["run", "--pipe", "c"]);
        if bind {
            c.arg("--bind").arg(dir);
        }
        let o = c.args(["--", "/bin/sh", "-c", "pwd"]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(pwd(dir.path(), true), dir.path().to_str().unwrap());
    assert_eq!(pwd(dir.path(), false), "/");
    // a relative path to nothing says where it looked, in one line
    let o = lab
        .cmd()
        .current_dir(dir.path())
        .args(["run", "--pipe", "c", "--", "./no-such-server"])
        .output()
        .unwrap();
    let e = err_line(&o);
    assert!(
        e.contains("no-such-server") && e.contains(dir.path().to_str().unwrap()),
        "{e}"
    );
}

#[test]
fn a_stopped_daemon_s_holder_waits_out_its_grace_and_leaves_with_its_run_directory() {
    use std::time::{Duration, Instant};
    if !root_or_skip("holder_grace") {
        return;
    }
    // a zombie has exited (nothing may reap it at once: its parent was the daemon)
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
    };
    let mut lab = Lab::start_with("adaptive", &["--holder-grace", "1h"]);
    lab.ok(&["pipe", "create", "a", "--ip", "10.64.0.1/24"]);
    lab.ok(&["pipe", "create", "b", "--ip", "10.64.0.2/24"]);
    let holder = lab.holder_pid().expect("the daemon started a holder");
    let stop = |lab: &mut Lab| {
        let st = lab.signal_daemon(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(5));
        assert!(st.is_some_and(|s| s.success()), "{st:?}");
    };
    // stopped: status says what is held and for how long
    stop(&mut lab);
    let o = lab.run(&["status"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success());
    assert!(
        text.contains("held with no daemon") && text.contains("keeps 2 regions"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_slice(&lab.run(&["status", "--json"]).stdout)
        .expect("status --json with no daemon");
    assert!(v["daemon"].is_null(), "{v}");
    assert_eq!(v["held"]["kept"], 2, "{v}");
    assert_eq!(v["held"]["pid"], holder, "{v}");
    assert!(
        v["held"]["seconds_left"].as_u64().is_some_and(|s| s > 3500),
        "{v}"
    );
    // a restart within the grace adopts every pipe, from the same holder
    lab.start_daemon();
    let names: Vec<String> = lab
        .json(&["pipe", "ls", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(lab.holder_pid(), Some(holder));
    // stopped again, and its run directory removed (as scripts and tests do): the holder goes
    stop(&mut lab);
    assert!(alive(holder));
    std::fs::remove_dir_all(&lab.dir).unwrap();
    let t = Instant::now();
    while alive(holder) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the holder outlived its run directory"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // a short grace with the directory kept: gone when it passes
    let mut lab = Lab::start_with("adaptive", &["--holder-grace", "2s"]);
    lab.ok(&["pipe", "create", "a", "--ip", "10.64.0.1/24"]);
    let holder = lab.holder_pid().unwrap();
    stop(&mut lab);
    let t = Instant::now();
    while alive(holder) {
        assert!(t.elapsed() < Duration::from_secs(6), "the grace passed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(lab.dir.exists());
}

/// The nice value in `/proc/PID/autogroup` ("/autogroup-N nice V").
fn group_nice(pid: u32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).ok()?;
    s.split_whitespace().last()?.parse().ok()
}

/// A thread's nice value and scheduling policy (fields 19 and 41 of its stat, counted after
/// the command's closing parenthesis as 3 and on).
fn thread_sched(pid: u32, tid: u32) -> (i32, u32) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
    let f: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split_whitespace().collect();
    (f[16].parse().unwrap(), f[38].parse().unwrap())
}

/// The ids of a process's threads named `comm`.
fn threads_named(pid: u32, comm: &str) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|tid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .is_ok_and(|c| c.trim() == comm)
        })
        .collect()
}

#[test]
fn the_daemon_s_control_plane_runs_ahead_of_containers_and_nothing_else_of_it_does() {
    if !root_or_skip("daemon_priority") {
        return;
    }
    const FIFO: u32 = libc::SCHED_FIFO as u32;
    const OTHER: u32 = libc::SCHED_OTHER as u32;
    // started as a service manager starts it, in a session of its own
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let mut d = Reaped(
        std::process::Command::new("setsid")
            .arg(EXE)
            .args(["--log", "warn", "daemon", "--idle", "block", "--ephemeral"])
            .args(["--run-dir", path_of(dir.path()), "--socket", path_of(&sock)])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t = std::time::Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "daemon did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let pid = d.0.id();
    assert_eq!(thread_sched(pid, pid).1, FIFO, "the control plane's thread");
    // (the masters may start just after the control socket answers)
    let mut masters = threads_named(pid, "docknet-master");
    while masters.is_empty() && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
        masters = threads_named(pid, "docknet-master");
    }
    assert!(!masters.is_empty(), "no master thread");
    for tid in masters.iter().chain(&threads_named(pid, "docknet-attach")) {
        assert_eq!(
            thread_sched(pid, *tid),
            (0, OTHER),
            "a master or the accept thread: the containers' class and nice value"
        );
    }
    let holder: u32 = std::fs::read_to_string(dir.path().join("holder.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(thread_sched(holder, holder).1, FIFO, "the fd holder");
    // the session's scheduling group is left as it was: raising it would lift the masters
    if let Some(n) = group_nice(pid) {
        assert_eq!(n, 0, "the daemon's session group");
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = d.0.wait();
}
