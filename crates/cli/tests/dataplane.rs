//! The data plane with real processes in real namespaces: containers exchanging frames through
//! the daemon and through fast channels, isolation, a hostile container, daemon restart, idle.

mod common;
use common::*;

const ATTACK: &str = env!("CARGO_BIN_EXE_dnattack");
const DNPERF: &str = env!("CARGO_BIN_EXE_dnperf");
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
    let _one = one_at_a_time();
    // the daemon's path, then a channel built by hand: none built by the daemon
    let mut lab = Lab::start_with("adaptive", &["--fast-channels", "manual"]);
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
    let _one = one_at_a_time();
    let lab = Lab::start("adaptive");
    pair(&lab, "a", "b", 41);
    lab.ok(&["pipe", "create", "c", "--ip", "10.41.0.3/24"]);
    lab.ok(&["fc", "connect", "a", "b"]);
    let inspect = |pipe: &str| {
        let o = lab.in_container(pipe, &[ATTACK, "inspect"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        peer_json(&o)
    };
    // each container is handed its own pipe, and a channel only if it is a partner
    assert_eq!(
        inspect("a"),
        serde_json::json!({"pipe": "a", "channels": ["b"]})
    );
    assert_eq!(
        inspect("b"),
        serde_json::json!({"pipe": "b", "channels": ["a"]})
    );
    assert_eq!(
        inspect("c"),
        serde_json::json!({"pipe": "c", "channels": []})
    );
    let dir = path_of(&lab.dir).to_string();
    let sh = |pipe: &str, script: &str| {
        let o = lab.in_container(pipe, &["sh", "-c", script]);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    // nothing of DockNet's on the filesystem: no run directory, no socket, no region file
    let (code, out) = sh(
        "c",
        &format!(
            "ls -A /run; ls {dir} 2>/dev/null && echo LEAK; test -e {} && echo LEAK; echo $DOCKNET_PIPE; echo end",
            path_of(&lab.socket)
        ),
    );
    assert_eq!(code, Some(0));
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["@docknet/pipe", "end"],
        "{out}"
    );
    // mounts cannot be changed, the host's processes are not visible, and the network
    // namespace holds only lo
    let (_, out) = sh(
        "c",
        "umount /proc 2>/dev/null && echo UNMOUNTED; mount -t tmpfs x /tmp 2>/dev/null && echo MOUNTED; ls /proc | grep -c '^[0-9]'",
    );
    assert!(!out.contains("MOUNTED"), "{out}");
    assert!(
        out.trim().parse::<u32>().unwrap() < 10,
        "own PID namespace: {out}"
    );
    let (_, out) = sh("c", "ls /sys/class/net");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["lo"]);
    // after the containers are gone, their sockets are too
    assert!(lab.json(&["pipe", "show", "c", "--json"])["socket"].is_null());
}

#[test]
fn the_sandbox_holds_from_inside() {
    if !root_or_skip("sandbox") {
        return;
    }
    let _one = one_at_a_time();
    let lab = Lab::start("adaptive");
    lab.ok(&["pipe", "create", "x", "--ip", "10.45.0.1/24"]);
    // a host Unix socket outside the container's view, and the control socket
    let host = tempfile::tempdir().unwrap();
    let host_sock = host.path().join("host.sock");
    let _l = std::os::unix::net::UnixListener::bind(&host_sock).unwrap();
    // a directory shown to the container with a file only root may read and a device node
    // anyone may open (a zero device, as an image's /dev would hold one)
    use std::os::unix::fs::PermissionsExt;
    let shown = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shown.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = shown.path().join("secret");
    std::fs::write(&secret, "root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let zero = shown.path().join("zero");
    nix::sys::stat::mknod(
        &zero,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 5),
    )
    .unwrap();
    std::fs::set_permissions(&zero, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert!(
        std::fs::File::open(&zero).is_ok(),
        "the node opens on the host"
    );
    // started the way a shell with a directory open on descriptor 9 starts it
    let escape = |user: &str| {
        let cmd = format!(
            "exec 9</ && exec {} --socket {} run --pipe x --bind {} {user} -- {ATTACK} escape --secret {} --device {} --socket {} --socket {}",
            EXE,
            path_of(&lab.socket),
            path_of(shown.path()),
            path_of(&secret),
            path_of(&zero),
            path_of(&host_sock),
            path_of(&lab.socket),
        );
        let o = std::process::Command::new("sh")
            .args(["-c", &cmd])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        peer_json(&o)
    };
    let holes = [
        "write_etc",
        "write_usr",
        "write_root",
        "write_proc_sys",
        "write_sysrq",
        "read_kcore",
        "read_shadow",
        "block_device",
        "open_device",
        "chmod_host_inode",
        "mount",
        "unshare_user",
        "ptrace_init",
        "tty",
    ];
    let holds = |v: &serde_json::Value| {
        for hole in holes {
            assert_eq!(v[hole], false, "{hole}: {v}");
        }
        assert_eq!(v["cap_eff"], "0000000000000000", "no capabilities: {v}");
        assert_eq!(v["inherited_fds"], serde_json::json!([]), "{v}");
        for s in v["host_sockets"].as_array().unwrap() {
            assert_eq!(s["connected"], false, "{s}");
        }
    };
    // as root (without capabilities) every wall holds, but the container owns the host's
    // root-only files and reads them
    let v = escape("--user 0");
    holds(&v);
    assert_eq!(
        (v["uid"].as_u64(), &v["read_secret"]),
        (Some(0), &true.into())
    );
    // by default it runs as a user of its own, one no other container has: no file the host
    // keeps from everyone
    let own = |o: std::process::Output| -> u64 {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let ids: Vec<u64> = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(ids.len(), 2, "{ids:?}");
        assert_eq!(ids[0], ids[1], "its own group too");
        assert!(ids[0] >= 0x7000_0000, "{ids:?}");
        ids[0]
    };
    // two containers at once (the second on a pipe of its own), two users
    lab.ok(&["pipe", "create", "y", "--ip", "10.45.0.2/24"]);
    let (first, line) = background(
        &lab,
        "y",
        &[],
        &["sh", "-c", "echo $(id -u) $(id -g); sleep 30"],
    );
    let ids: Vec<u64> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(
        ids.len() == 2 && ids[0] == ids[1] && ids[0] >= 0x7000_0000,
        "{line:?}"
    );
    let u2 = own(lab.in_container("x", &["sh", "-c", "id -u; id -g"]));
    first.end();
    assert_ne!(ids[0], u2, "two containers at once, two users");
    let v = escape("");
    holds(&v);
    assert!(v["uid"].as_u64().unwrap() >= 0x7000_0000, "{v}");
    assert_eq!(v["read_secret"], false, "{v}");
    // nobody, asked for, as the default was before
    let v = escape("--user 65534");
    holds(&v);
    assert_eq!(
        (v["uid"].as_u64(), &v["read_secret"]),
        (Some(65534), &false.into())
    );
    // and the things an application needs still work: /tmp, /dev/null, /dev/urandom
    let o = lab.in_container(
        "x",
        &["sh", "-c", "echo ok > /tmp/f && cat /tmp/f && head -c 8 /dev/urandom | wc -c && echo x > /dev/null && echo fine"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["ok", "8", "fine"],
        "{out}"
    );
    // lo is up (the init brings it up), and the command's exit status is the container's
    let o = lab.in_container("x", &["sh", "-c", "cat /sys/class/net/lo/flags; exit 7"]);
    let flags = String::from_utf8_lossy(&o.stdout);
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & 1, 1, "lo is not up: {flags:#x}");
    assert_eq!(o.status.code(), Some(7));
}

/// A fork bomb inside one container takes its own processes, not another container's: each
/// container's user is its own, and its processes are limited (RLIMIT_NPROC).
#[test]
fn a_fork_bomb_stays_in_its_container() {
    if !root_or_skip("fork bomb") {
        return;
    }
    let _one = one_at_a_time();
    let lab = Lab::start("adaptive");
    lab.ok(&["pipe", "create", "a", "--ip", "10.46.0.1/24"]);
    lab.ok(&["pipe", "create", "b", "--ip", "10.46.0.2/24"]);
    // a bomb that holds what it got; its first line says how far it came
    let bomb = |pipe: &str, run: &[&str], max: &str| {
        let (c, line) = background(
            &lab,
            pipe,
            run,
            &[ATTACK, "fork-bomb", "--max", max, "--hold", "30"],
        );
        match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(v) => (c, v),
            Err(_) => panic!("{line:?}: {}", c.stderr()),
        }
    };
    // the bomb stops at its limit (the init and the bomb itself count too)
    let (a, v) = bomb("a", &["--pids-limit", "16"], "500");
    assert_eq!(v["holding"], true, "{v}");
    let forks = v["forks"].as_u64().unwrap();
    assert!((10..16).contains(&forks), "{v}");
    assert_eq!(v["errno"], nix::errno::Errno::EAGAIN as i32, "{v}");
    a.end();
    // with the defaults it stops at 1024; while it holds them, a container beside it, with
    // the defaults too, forks freely: its user, and so its count, is its own
    let (a, v) = bomb("a", &[], "5000");
    let forks = v["forks"].as_u64().unwrap();
    assert!((1000..1024).contains(&forks), "{v}");
    let o = lab.in_container("b", &[ATTACK, "fork-bomb", "--max", "200"]);
    a.end();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let w = peer_json(&o);
    assert_eq!(
        (w["forks"].as_u64(), &w["errno"]),
        (Some(200), &serde_json::Value::Null),
        "{w}"
    );
    // two containers given one user share its count, which is why each has its own by
    // default: beside a bomb of one user at its limit, a second container of that user
    // cannot even start its command (an id no host account and no container has)
    let shared = "2147483646";
    let (a, v) = bomb("a", &["--user", shared, "--pids-limit", "16"], "500");
    assert!(v["forks"].as_u64().unwrap() < 16, "{v}");
    let o = lab
        .cmd()
        .args(["run", "--pipe", "b", "--user", shared, "--pids-limit", "16"])
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    a.end();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("Resource temporarily unavailable"),
        "{err}"
    );
    // a limit the init and the command cannot both fit under is refused
    let o = lab
        .cmd()
        .args(["run", "--pipe", "b", "--pids-limit", "1", "--", "/bin/true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("the init and the command are two processes"),
        "--pids-limit 1: {err}"
    );
}

/// Inside a user namespace that maps only root (as a rootless runtime's maps fewer ids than a
/// container's own would need), `docknet run` refuses to choose the container's own id and
/// says to choose one with --user, instead of failing at the change of user.
#[test]
fn an_own_id_outside_the_user_namespace_s_map_is_refused() {
    if !root_or_skip("user namespace") {
        return;
    }
    let _one = one_at_a_time();
    let lab = Lab::start("adaptive");
    lab.ok(&["pipe", "create", "u", "--ip", "10.47.0.1/24"]);
    let o = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--"])
        .arg(EXE)
        .arg("--socket")
        .arg(&lab.socket)
        .args(["run", "--pipe", "u", "--", "/bin/true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("is not mapped in this user namespace"),
        "{:?}: {err}",
        o.status
    );
    // the pipe was never handed out: it is free for a run that can take it
    let o = lab
        .cmd()
        .args(["run", "--pipe", "u", "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A container started in the background. Ended when dropped (SIGKILL to its supervisor,
/// whose death takes the container with it), so a failed assertion leaves nothing running.
struct Background(Option<std::process::Child>);

impl Background {
    /// Ends it the graceful way: SIGTERM, which the supervisor passes on to the command.
    fn end(mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
    }

    /// What it printed on stderr, once ended.
    fn stderr(mut self) -> String {
        let Some(mut c) = self.0.take() else {
            return String::new();
        };
        let _ = c.kill();
        let o = c.wait_with_output().unwrap();
        String::from_utf8_lossy(&o.stderr).into_owned()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `docknet run --pipe PIPE RUN... -- CMD...` in the background, once it printed its first
/// line (returned).
fn background(lab: &Lab, pipe: &str, run: &[&str], cmd: &[&str]) -> (Background, String) {
    let mut c = lab.cmd();
    c.args(["run", "--pipe", pipe])
        .args(run)
        .arg("--")
        .args(cmd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let out = child.stdout.take().unwrap();
    let bg = Background(Some(child));
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
    (bg, line)
}

/// A checked stream of `mb` MB from pipe `client` to pipe `server` at `server_ip` port 7000,
/// peers at `adaptive`, started: (server, client).
fn checked(lab: &mut Lab, client: &str, server: &str, server_ip: &str, mb: u64) -> (usize, usize) {
    let addr = format!("{server_ip}:7000");
    lab.checked_stream(client, server, &addr, mb * 1_000_000, "adaptive")
}

/// Waits for a checked stream; asserts every byte arrived intact.
fn intact(lab: &mut Lab, stream: (usize, usize), what: &str) {
    lab.intact(stream, Duration::from_secs(120), what);
}

#[test]
fn a_hostile_container_hurts_only_itself() {
    if !root_or_skip("hostile") {
        return;
    }
    let _one = one_at_a_time();
    let mut lab = Lab::start("adaptive");
    let (_, ib) = pair(&lab, "a", "b", 42);
    pair(&lab, "c", "d", 46);
    lab.ok(&["fc", "connect", "c", "d"]);
    lab.ok(&["pipe", "create", "evil", "--ip", "10.42.0.66/24"]);
    lab.ok(&["pipe", "create", "flood", "--ip", "10.42.0.67/24"]);
    // the region cannot be taken away
    for attack in ["truncate", "grow"] {
        let o = lab.in_container("evil", &[ATTACK, attack]);
        let v = peer_json(&o);
        assert_eq!(v["refused"], true, "{attack}: {v}");
    }
    let o = lab.in_container("evil", &[ATTACK, "punch"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // two checked streams, through the daemon and over a fast channel, while the offender
    // scribbles, floods broadcasts, storms its wake-up word and its socket, all at once
    let through = checked(&mut lab, "a", "b", &ib, 200);
    let channel = checked(&mut lab, "c", "d", "10.46.0.2", 400);
    // the connection storm starts last: it uses up the pipe's own connections; the flood comes
    // from a second container (the scribbler wrecks its own rings, so its frames never leave)
    let script = format!(
        "{ATTACK} scribble --seconds 4 & {ATTACK} wake-storm --seconds 4 & \
         sleep 0.5; {ATTACK} connect-storm --seconds 3 & wait"
    );
    let evil = lab.spawn_in("evil", None, &["sh", "-c", &script]);
    let flood = lab.spawn_in("flood", None, &[ATTACK, "flood", "--seconds", "4"]);
    intact(&mut lab, through, "through the daemon");
    intact(&mut lab, channel, "over the fast channel");
    let out = lab.wait(evil, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let flooded = lab.wait(flood, Duration::from_secs(30));
    assert!(flooded.status.success());
    assert_eq!(
        stdout.lines().count(),
        3,
        "every attack ran: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // the daemon lives and the offender's counters show what it did
    assert!(lab.daemon_alive(), "the daemon lives");
    let counters = |p: &str| lab.json(&["pipe", "show", p, "--json"])["counters"].clone();
    let (c, f) = (counters("evil"), counters("flood"));
    let n = |c: &serde_json::Value, k: &str| c[k].as_u64().unwrap_or_else(|| panic!("no {k}"));
    let bad = n(&c, "bad_desc") + n(&c, "oversize") + n(&c, "ring_overrun");
    assert!(bad > 0, "scribbling counted: {c}");
    assert!(n(&c, "spurious_wakes") > 0, "wake storm damped: {c}");
    assert!(n(&c, "attach_refused") > 0, "connection storm refused: {c}");
    let limited = n(&f, "drop_flood_limited");
    assert!(limited > 0 && n(&f, "flooded") > 0, "flooding limited: {f}");
    for p in ["a", "b", "c", "d"] {
        assert_eq!(lab.counter(p, "bad_desc"), 0, "{p}");
        assert_eq!(
            lab.counter(p, "drop_rx_full"),
            0,
            "floods are charged to the sender: {p}"
        );
    }
    let v = rr(&mut lab, "a", "b", &ib, "0.3");
    assert!(v["transactions"].as_u64().unwrap() > 100);
}

/// A daemon that restarts resumes producing into each container's rx ring from indices and
/// descriptors the container can write: it must bound what it reads back, keep serving
/// everyone else, and still deliver into the offender's ring as far as the lies leave room.
#[test]
fn a_daemon_restarted_under_a_forging_container_serves_the_others() {
    if !root_or_skip("restart under forged rings") {
        return;
    }
    let _one = one_at_a_time();
    let mut lab = Lab::start("adaptive");
    let (_, ib) = pair(&lab, "a", "b", 50);
    lab.ok(&["pipe", "create", "evil", "--ip", "10.50.0.66/24"]);
    lab.ok(&["pipe", "create", "flood", "--ip", "10.50.0.67/24"]);
    // the offender's rx ring claims frames at places past its area, then the daemon restarts
    let v = peer_json(&lab.in_container("evil", &[ATTACK, "forge-rx"]));
    assert!(v["queued"].as_u64().unwrap() > 0, "{v}");
    lab.kill_daemon();
    lab.start_daemon();
    // broadcasts go into the forged ring while a checked stream runs through the daemon
    let through = checked(&mut lab, "a", "b", &ib, 200);
    let flood = lab.spawn_in("flood", None, &[ATTACK, "flood", "--seconds", "2"]);
    intact(&mut lab, through, "through the restarted daemon");
    assert!(lab.wait(flood, Duration::from_secs(30)).status.success());
    assert!(
        lab.counter("evil", "rx_packets") > 0,
        "the daemon delivered into the forged ring"
    );
    // and again while the offender writes random words over its whole region
    let evil = lab.spawn_in("evil", None, &[ATTACK, "scribble", "--seconds", "3"]);
    std::thread::sleep(Duration::from_millis(500));
    lab.kill_daemon();
    lab.start_daemon();
    let v = rr(&mut lab, "a", "b", &ib, "0.5");
    assert!(v["transactions"].as_u64().unwrap() > 100, "{v}");
    assert_eq!(v["lost"], 0, "{v}");
    let out = lab.wait(evil, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(lab.daemon_alive(), "the daemon lives");
    for p in ["a", "b"] {
        assert_eq!(lab.counter(p, "bad_desc"), 0, "{p}");
    }
    // the offender's pipe is still the daemon's to show and to remove
    lab.ok(&["pipe", "show", "evil"]);
    lab.ok(&["pipe", "rm", "evil"]);
}

#[test]
fn a_restarted_daemon_adopts_live_pipes() {
    if !root_or_skip("restart") {
        return;
    }
    let _one = one_at_a_time();
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
    let _one = one_at_a_time();
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

/// Voluntary context switches of every `docklib-engine` thread of the processes `pids`.
fn engine_switches(pids: &[u32]) -> (usize, u64) {
    let mut n = (0, 0);
    for p in pids {
        for t in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() != "docklib-engine" {
                continue;
            }
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            let v: u64 = status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            n = (n.0 + 1, n.1 + v);
        }
    }
    n
}

#[test]
fn a_docklib_server_waiting_in_accept_does_not_wake_on_a_tick() {
    if !root_or_skip("idle engine") {
        return;
    }
    let _one = one_at_a_time();
    let mut lab = Lab::start("adaptive");
    pair(&lab, "a", "b", 45);
    let srv = lab.spawn_in(
        "b",
        None,
        &[
            DNPERF,
            "server",
            "--stack",
            "docknet",
            "--idle",
            "adaptive",
            "--bind",
            "10.45.0.2:7000",
            "--conns",
            "1",
        ],
    );
    std::thread::sleep(Duration::from_millis(800));
    let pids = tree(lab.child_pid(srv));
    let (engines, before) = engine_switches(&pids);
    assert_eq!(engines, 1, "one DockLib engine in {pids:?}");
    std::thread::sleep(Duration::from_secs(3));
    let (_, after) = engine_switches(&pids);
    // parked on the call in progress: about one wake a second, not one per 10 ms nap
    assert!(
        after - before <= 10,
        "the engine woke {} times in 3 s while the server waited in accept",
        after - before
    );
    // and it still serves: a client connects and streams
    let cli = lab.spawn_in(
        "a",
        None,
        &[
            DNPERF,
            "client",
            "--stack",
            "docknet",
            "--idle",
            "adaptive",
            "--connect",
            "10.45.0.2:7000",
            "--workload",
            "stream",
            "--size",
            "1024",
            "--duration",
            "0.3",
            "--warmup",
            "0",
            "--json",
        ],
    );
    let out = lab.wait(cli, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(peer_json(&out)["result"]["gbps"].as_f64().unwrap() > 0.0);
    let _ = lab.wait(srv, Duration::from_secs(20));
}

/// At its defaults the daemon joins two containers that talk by a fast channel of its own: a
/// checked stream carries on intact across the switch, a rate limit takes the channel away
/// again (the limit holds on the daemon's path), and a container that talks to many pipes gets
/// no more than its share of channels.
#[test]
fn the_daemon_joins_containers_that_talk_by_a_channel_and_bounds_what_one_can_claim() {
    if !root_or_skip("automatic fast channels") {
        return;
    }
    let _one = one_at_a_time();
    let mut lab = Lab::start("adaptive");
    let (_, ib) = pair(&lab, "a", "b", 52);
    let stream = checked(&mut lab, "a", "b", &ib, 300);
    intact(&mut lab, stream, "a stream that moved to a channel");
    let status = lab.json(&["status", "--json"]);
    assert_eq!(status["fast_channels"], "auto", "{status}");
    assert!(status["auto_channels_made"].as_u64() >= Some(1), "{status}");
    let peers =
        |lab: &Lab, p: &str| lab.json(&["pipe", "show", p, "--json"])["fast_channels"].clone();
    assert_eq!(peers(&lab, "a"), serde_json::json!(["b"]));
    let forwarded = |lab: &Lab| {
        lab.json(&["status", "--json"])["forwarded"]
            .as_u64()
            .unwrap()
    };
    let before = forwarded(&lab);
    let stream = checked(&mut lab, "a", "b", &ib, 100);
    intact(&mut lab, stream, "a stream over the channel");
    assert!(
        forwarded(&lab) - before < 5_000,
        "100 MB went past the daemon, not through it"
    );
    // a limit: the channel goes, and the limit holds on the daemon's path
    lab.ok(&["rate", "set", "a", "--egress", "200mbit"]);
    assert_eq!(peers(&lab, "a"), serde_json::json!([]));
    let stream = checked(&mut lab, "a", "b", &ib, 20);
    intact(&mut lab, stream, "a limited stream");
    assert_eq!(
        peers(&lab, "a"),
        serde_json::json!([]),
        "no channel for a limited pipe"
    );
    assert!(lab.counter("a", "rate_waits") > 0, "the limit held");

    // one container talks to ten: it gets at most its share, the rest stay on the daemon's path
    let victims: Vec<String> = (0..10).map(|k| format!("10.52.1.{}", k + 2)).collect();
    let mut sinks = Vec::new();
    for (k, ip) in victims.iter().enumerate() {
        let name = format!("v{k}");
        lab.ok(&["pipe", "create", &name, "--ip", &format!("{ip}/16")]);
        sinks.push(server(&mut lab, &name, "sink", "2"));
    }
    lab.ok(&["pipe", "create", "grabber", "--ip", "10.52.1.100/16"]);
    for k in 0..victims.len() {
        assert!(lab.attached_within(&format!("v{k}"), Duration::from_secs(10)));
    }
    // the control thread that serves its asks runs ahead of every container (real-time): what
    // the attack makes it do stays a small part of a core
    let control = |lab: &Lab| -> f64 {
        let pid = lab.daemon_pid();
        let s = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/schedstat")).unwrap();
        s.split_whitespace().next().unwrap().parse::<f64>().unwrap() / 1e9
    };
    let (cpu0, t0) = (control(&lab), std::time::Instant::now());
    let o = lab.in_container(
        "grabber",
        &[ATTACK, "channel-grab", "--to", &victims.join(",")],
    );
    let share = (control(&lab) - cpu0) / t0.elapsed().as_secs_f64();
    assert!(share < 0.2, "the control thread took {share:.2} of a core");
    let v = peer_json(&o);
    assert_eq!(v["channels"], 8, "its share and no more: {v}");
    assert_eq!(peers(&lab, "grabber").as_array().unwrap().len(), 8);
    let status = lab.json(&["status", "--json"]);
    assert!(
        status["auto_channels_skipped"].as_u64() >= Some(2),
        "{status}"
    );
    // the same with one SYN to each: a frame that opens a connection asks at once, within the
    // same bounds
    lab.ok(&["pipe", "create", "syngrab", "--ip", "10.52.1.101/16"]);
    let (cpu0, t0) = (control(&lab), std::time::Instant::now());
    let o = lab.in_container(
        "syngrab",
        &[
            ATTACK,
            "channel-grab",
            "--syn",
            "--frames",
            "1",
            "--to",
            &victims.join(","),
        ],
    );
    let share = (control(&lab) - cpu0) / t0.elapsed().as_secs_f64();
    assert!(share < 0.2, "the control thread took {share:.2} of a core");
    let v = peer_json(&o);
    assert_eq!(v["channels"], 8, "one SYN each: its share and no more: {v}");
    for s in sinks {
        let _ = lab.wait(s, Duration::from_secs(20));
    }
    assert!(lab.daemon_alive());
}
