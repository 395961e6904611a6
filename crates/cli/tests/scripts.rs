//! The README's two commands as a newcomer meets them: `--help` works for anyone, a normal
//! user is re-run under sudo with the arguments and the toolchain's homes kept, and a normal
//! user without sudo is told what to do. Run as the unprivileged `nobody` (via setpriv) on a
//! copy of the scripts, with `sudo` either a stub that records its arguments or absent.

mod common;
use common::{one_at_a_time, root_or_skip};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SCRIPTS: [&str; 4] = ["common.sh", "setup.sh", "bench.sh", "test.sh"];

/// A world-readable copy of scripts/ in a temp dir, and a bin dir holding only the tools the
/// elevation path needs (so no real sudo is on PATH).
fn sandbox() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts");
    let dst = d.path().join("scripts");
    std::fs::create_dir(&dst).unwrap();
    for f in SCRIPTS {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let bin = d.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["bash", "id", "basename", "dirname", "sed", "env", "cat"] {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|p| Path::new(p).join(tool))
            .find(|p| p.exists())
            .unwrap();
        std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
    }
    (d, bin)
}

/// Runs `script args` as `nobody` (when we are root; else as ourselves, who is not root) with
/// PATH = `bin`.
fn as_user(dir: &Path, bin: &Path, script: &str, args: &[&str]) -> Output {
    let path = dir.join("scripts").join(script);
    let mut c = if nix::unistd::Uid::effective().is_root() {
        let mut c = Command::new("/usr/bin/setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&path);
        c
    } else {
        Command::new(&path)
    };
    c.args(args)
        .env_clear()
        .env("PATH", bin)
        .env("HOME", dir)
        .output()
        .unwrap()
}

#[test]
fn help_works_for_anyone_and_names_the_command() {
    let (d, bin) = sandbox();
    for (script, usage) in [
        ("bench.sh", "./scripts/bench.sh [--help]"),
        ("test.sh", "./scripts/test.sh [--help]"),
    ] {
        let o = as_user(d.path(), &bin, script, &["--help"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{script}: {o:?}");
        assert!(out.contains(usage) && out.contains("sudo"), "{out}");
        assert!(
            !out.contains("#!"),
            "the shebang is not part of the help: {out}"
        );
    }
}

#[test]
fn a_user_without_sudo_is_told_what_to_do() {
    let (d, bin) = sandbox();
    for script in ["bench.sh", "test.sh"] {
        let o = as_user(d.path(), &bin, script, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{script}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("{script}: needs root")) && err.contains("install sudo"),
            "{err}"
        );
    }
}

#[test]
fn a_user_with_sudo_is_re_run_under_it_with_arguments_and_toolchain_kept() {
    let (d, bin) = sandbox();
    let record = d.path().join("sudo-args");
    std::fs::write(&record, "").unwrap();
    std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o666)).unwrap();
    let stub = bin.join("sudo");
    std::fs::write(
        &stub,
        format!(
            "#!/bin/bash\nfor a in \"$@\"; do echo \"$a\"; done > {}\n",
            record.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = as_user(d.path(), &bin, "bench.sh", &["--modes", "bridge,docknet"]);
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("re-running under sudo"), "{err}");
    let args: Vec<String> = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let script = d.path().join("scripts/bench.sh");
    assert_eq!(args[0], "env");
    assert!(
        args.contains(&format!("PATH={}", bin.display())),
        "{args:?}"
    );
    assert!(args.contains(&format!("CARGO_HOME={}/.cargo", d.path().display())));
    assert!(args.contains(&format!("RUSTUP_HOME={}/.rustup", d.path().display())));
    assert!(
        args.iter().any(|a| a.starts_with("DOCKNET_OWNER=")),
        "{args:?}"
    );
    let tail = &args[args.len() - 3..];
    assert_eq!(
        tail,
        [
            script.display().to_string(),
            "--modes".into(),
            "bridge,docknet".into()
        ]
    );
}

/// Runs `scripts/NAME` with `args` and `env`, this build's binaries in `DOCKNET_BIN`; its
/// standard output, after checking that it succeeded.
fn run_script(name: &str, args: &[&str], env: &[(&str, &Path)]) -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_docknet")).parent().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name);
    let o = Command::new(&script)
        .args(args)
        .env("DOCKNET_BIN", bin)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{name}: {text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    text
}

/// A script's TSV output: the whole text (for messages) and its rows after the header, split
/// into fields.
fn tsv_rows(path: &Path) -> (String, Vec<Vec<String>>) {
    let tsv = std::fs::read_to_string(path).unwrap();
    let rows = tsv
        .lines()
        .skip(1)
        .map(|l| l.split('\t').map(String::from).collect())
        .collect();
    (tsv, rows)
}

/// The idle-policy sweep's smoke version: the bridge, the daemon path, a fast channel and the
/// daemon building its own channel, at their defaults, a short line each, with this build's
/// binaries; nothing left behind.
#[test]
fn the_idle_sweep_measures_its_lines_and_leaves_nothing_behind() {
    if !root_or_skip("the idle sweep") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    run_script(
        "idle-sweep.sh",
        &[],
        &[("QUICK", Path::new("1")), ("OUT", out.path())],
    );
    let (tsv, lines) = tsv_rows(&out.path().join("idle-sweep.tsv"));
    let paths: Vec<&str> = lines.iter().map(|l| l[1].as_str()).collect();
    assert_eq!(paths, ["bridge", "daemon", "fc", "auto"], "{tsv}");
    for l in &lines {
        let tx: u64 = l[7].parse().unwrap();
        assert!(tx > 0, "no transactions: {l:?}");
    }
    let left = run_dirs_left("docknet-sweep-");
    assert!(left.is_empty(), "run directories left: {left:?}");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    assert!(!netns.contains("dnsw"), "namespaces left: {netns}");
}

/// The unpinned two-host comparison's smoke version: one short 64 B ping-pong per path (the
/// kernel, daemons on AF_XDP, daemons at the default `auto`, daemons with host links and the
/// hosts' kernels routing, daemons routing through VXLAN tunnels, which the script checks
/// carried the traffic) with this build's binaries; nothing left behind (the host links go
/// with their namespaces).
#[test]
fn the_unpinned_wire_comparison_measures_every_path_and_leaves_nothing_behind() {
    if !root_or_skip("the unpinned wire comparison") {
        return;
    }
    let _one = one_at_a_time();
    let out = tempfile::tempdir().unwrap();
    run_script(
        "wire-unpinned.sh",
        &[],
        &[("QUICK", Path::new("1")), ("OUT", out.path())],
    );
    let (tsv, lines) = tsv_rows(&out.path().join("wire-unpinned.tsv"));
    let paths: Vec<&str> = lines.iter().map(|l| l[1].as_str()).collect();
    assert_eq!(paths, ["kernel", "xdp", "auto", "host", "vxlan"], "{tsv}");
    for l in &lines {
        let p50: f64 = l[4].parse().unwrap();
        assert!(p50 > 0.0, "no latency: {l:?}");
    }
    let left = run_dirs_left("docknet-wire-");
    assert!(left.is_empty(), "run directories left: {left:?}");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    assert!(!netns.contains("dnwu"), "namespaces left: {netns}");
}

/// The instruction count's smoke version: one second of ping-pong under callgrind with this
/// build's binaries, a count that makes sense, nothing left behind.
#[test]
fn the_instruction_count_counts_round_trips_and_leaves_nothing_behind() {
    if !root_or_skip("the instruction count") {
        return;
    }
    let text = run_script("instructions.sh", &["--seconds", "1", "--json"], &[]);
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert!(v["round_trips"].as_u64().unwrap() > 50, "{v}");
    // a poll that moves a frame is hundreds of instructions at least, and a round trip is two
    // of them on this side plus the copies
    assert!(v["per_poll"].as_u64().unwrap() > 300, "{v}");
    let all = v["per_round_trip"]["all"].as_u64().unwrap();
    let write = v["per_round_trip"]["write"].as_u64().unwrap();
    assert!(write > 0 && all > write, "{v}");
    let left = run_dirs_left("docknet-dnin");
    assert!(left.is_empty(), "run directories left: {left:?}");
}

#[test]
fn the_doorbell_comparison_runs_every_wake_up_and_counts_round_trips() {
    let text = run_script(
        "doorbell.sh",
        &["--pairs", "1,2", "--seconds", "0.2", "--repeat", "1"],
        &[],
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    for (line, (mode, pairs)) in lines.iter().zip([
        ("futex", 1),
        ("pipe", 1),
        ("yield", 1),
        ("futex", 2),
        ("pipe", 2),
        ("yield", 2),
    ]) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((f[0], f[1]), (mode, pairs.to_string().as_str()), "{line}");
        let rate: f64 = f[9].parse().unwrap();
        assert!(rate > 100.0, "{line}");
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/doorbell.sh");
    let bad = Command::new(&script).arg("--nonsense").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn the_connection_set_up_comparison_times_every_path_and_leaves_nothing_behind() {
    if !root_or_skip("the connection set-up comparison") {
        return;
    }
    let text = run_script("connects.sh", &["--count", "50", "--repeat", "1"], &[]);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    for (row, path) in rows
        .iter()
        .zip(["bridge:", "docknet-preload:", "docknet-fc-preload:"])
    {
        // "path: connect_us: P50 MEAN rr_us: P50 MEAN", each time positive
        assert_eq!(
            (row[0], row[1], row[4]),
            (path, "connect_us:", "rr_us:"),
            "{text}"
        );
        for f in [row[2], row[3], row[5], row[6]] {
            let us: f64 = f.parse().unwrap();
            assert!(us > 0.0, "{text}");
        }
    }
    let left = run_dirs_left("dncn");
    assert!(left.is_empty(), "run directories left: {left:?}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/connects.sh");
    let bad = Command::new(&script).arg("--nonsense").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn the_epoll_comparison_measures_each_mode_and_count_and_leaves_nothing_behind() {
    if !root_or_skip("the epoll comparison") {
        return;
    }
    let text = run_script("epoll-idlers.sh", &["0.3", "0", "40"], &[]);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.contains("round trips/s"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 4, "{text}");
    for (row, (mode, idle)) in rows.iter().zip([
        ("bridge", "0:"),
        ("bridge", "40:"),
        ("docknet", "0:"),
        ("docknet", "40:"),
    ]) {
        assert_eq!((row[0], row[2]), (mode, idle), "{row:?}");
        let rate: f64 = row[3].parse().unwrap();
        assert!(rate > 100.0, "{row:?}");
    }
    let left = run_dirs_left("dnepi");
    assert!(left.is_empty(), "run directories left: {left:?}");
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let ns = String::from_utf8_lossy(&ns.stdout);
    assert!(!ns.contains("dnepi"), "namespaces left: {ns}");
}

/// The daemon run directories on /dev/shm whose names start with `prefix`.
fn run_dirs_left(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}
