//! Harness for tests with real processes in real namespaces: a private daemon per test
//! (own run directory on tmpfs, own socket), children ended by pid, everything removed on drop.

#![allow(dead_code)]

pub mod wire;

use docknet_lab::topology::daemon::Daemon;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const EXE: &str = env!("CARGO_BIN_EXE_docknet");
pub const HTTPD: &str = env!("CARGO_BIN_EXE_docknet-httpd");
pub const LOAD: &str = env!("CARGO_BIN_EXE_docknet-load");
pub const DNATTACK: &str = env!("CARGO_BIN_EXE_dnattack");
static SEQ: AtomicU32 = AtomicU32::new(0);
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held by the tests of a binary that must run one at a time: on two cores, daemons, floods
/// and benches beside each other starve the assertions that count what a short window did (a
/// raw stream pinned beside another test's daemon master sent nothing; a 0.3 s raw ping-pong
/// whose server came up late measured nothing; a 0.2 s point without samples has no
/// histogram; a 0.5 s ping-pong after a daemon restart made 95 transactions beside the attack
/// tests). A test that failed while holding it does not block the others.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// True when the test may run: root is needed for namespaces. Without root the test is
/// skipped with a message, unless DOCKNET_REQUIRE_ROOT_TESTS=1 (CI), where it fails.
pub fn root_or_skip(name: &str) -> bool {
    if nix::unistd::Uid::effective().is_root() {
        return true;
    }
    if std::env::var("DOCKNET_REQUIRE_ROOT_TESTS").as_deref() == Ok("1") {
        panic!("{name} needs root (DOCKNET_REQUIRE_ROOT_TESTS=1)");
    }
    eprintln!("skipping {name}: needs root");
    false
}

/// `bin/` of the checkout, where scripts/setup.sh puts the Go binaries (the CNI plugin, its
/// installer, the node agent, host-local, bridge, loopback, cnitool); `$DOCKNET_CNI_BIN`
/// elsewhere.
pub fn bin_dir() -> PathBuf {
    match std::env::var_os("DOCKNET_CNI_BIN") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bin"),
    }
}

/// True when the test may run: root, and `bins` in [`bin_dir`]. Where they are missing the test
/// is skipped with the reason, unless DOCKNET_REQUIRE_ROOT_TESTS=1 (CI), where it fails.
pub fn bins_or_skip(name: &str, bins: &[&str]) -> bool {
    if !root_or_skip(name) {
        return false;
    }
    let missing: Vec<&str> = bins
        .iter()
        .copied()
        .filter(|b| !bin_dir().join(b).is_file())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "{name}: {missing:?} missing in {} (scripts/setup.sh builds them)",
        bin_dir().display()
    );
    if std::env::var("DOCKNET_REQUIRE_ROOT_TESTS").as_deref() == Ok("1") {
        panic!("{why}");
    }
    eprintln!("skipping {why}");
    false
}

/// The preload library beside the docknet binary. `cargo test` builds it into `deps/`
/// (`cargo build` puts it beside the binary): the newer of the two is put beside the binary.
pub fn preload_library() -> PathBuf {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(find_library).clone()
}

fn find_library() -> PathBuf {
    let dir = Path::new(EXE).parent().unwrap();
    let lib = dir.join("libdocknet_preload.so");
    let deps = dir.join("deps/libdocknet_preload.so");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let Some(d) = mtime(&deps) {
        if mtime(&lib).is_none_or(|l| l < d) {
            // copied to a temporary name and renamed: a program loading it never sees half a file
            let tmp = dir.join(format!(".libdocknet_preload.so.{}", std::process::id()));
            std::fs::copy(&deps, &tmp).unwrap();
            std::fs::rename(&tmp, &lib).unwrap();
        }
    }
    assert!(
        lib.is_file(),
        "{} missing: cargo build -p docknet-preload",
        lib.display()
    );
    lib
}

pub struct Lab {
    pub dir: PathBuf,
    pub socket: PathBuf,
    daemon: Option<Child>,
    children: Vec<Child>,
    idle: String,
    extra: Vec<String>,
}

impl Lab {
    pub fn start(idle: &str) -> Lab {
        Lab::start_with(idle, &[])
    }

    /// A lab whose daemon gets `extra` arguments too.
    pub fn start_with(idle: &str, extra: &[&str]) -> Lab {
        let dir = PathBuf::from("/dev/shm").join(format!(
            "docknet-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let socket = dir.join("ctl.sock");
        let mut lab = Lab {
            dir,
            socket,
            daemon: None,
            children: Vec::new(),
            idle: idle.into(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        lab.start_daemon();
        lab
    }

    pub fn start_daemon(&mut self) {
        let child = Command::new(EXE)
            .args(["--log", "warn", "daemon", "--idle", &self.idle, "--run-dir"])
            .arg(&self.dir)
            .arg("--socket")
            .arg(&self.socket)
            .args(&self.extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("start daemon");
        self.daemon = Some(child);
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The pid of the daemon's fd holder.
    pub fn holder_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("holder.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Whether the daemon still runs: one that crashed has exited, even before it is reaped
    /// (a signal 0 to its pid would still reach the zombie).
    pub fn daemon_alive(&mut self) -> bool {
        self.daemon
            .as_mut()
            .is_some_and(|d| matches!(d.try_wait(), Ok(None)))
    }

    pub fn daemon_pid(&self) -> u32 {
        self.daemon.as_ref().expect("daemon running").id()
    }

    /// Sends `sig` to the daemon and waits (at most `within`) for it to exit; its status.
    pub fn signal_daemon(
        &mut self,
        sig: nix::sys::signal::Signal,
        within: Duration,
    ) -> Option<std::process::ExitStatus> {
        let d = self.daemon.as_mut()?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.id() as i32), sig).unwrap();
        let t = Instant::now();
        while t.elapsed() < within {
            if let Some(st) = d.try_wait().unwrap() {
                self.daemon = None;
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// SIGKILL the daemon (no clean shutdown).
    pub fn kill_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.kill().unwrap();
            d.wait().unwrap();
        }
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(EXE);
        c.arg("--socket").arg(&self.socket);
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("run docknet")
    }

    /// Runs a client command that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "docknet {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).expect("JSON output")
    }

    /// Starts `docknet run --pipe PIPE [--cpu N] -- ARGS` in the background (stdout piped).
    pub fn spawn_in(&mut self, pipe: &str, cpu: Option<usize>, args: &[&str]) -> usize {
        let mut c = self.cmd();
        c.args(["run", "--pipe", pipe]);
        if let Some(n) = cpu {
            c.args(["--cpu", &n.to_string()]);
        }
        c.arg("--")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.children.push(c.spawn().expect("spawn container"));
        self.children.len() - 1
    }

    /// Whether a container attaches to `pipe` within `within` (the pipe shows its socket).
    pub fn attached_within(&self, pipe: &str, within: Duration) -> bool {
        let t = Instant::now();
        loop {
            if !self.json(&["pipe", "show", pipe, "--json"])["socket"].is_null() {
                return true;
            }
            if t.elapsed() >= within {
                return false;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Starts docknet-httpd over DockLib (blocking waits) in a container on `pipe`, listening
    /// on `bind`; returns once it is attached.
    pub fn httpd_in(&mut self, pipe: &str, bind: &str) -> usize {
        let srv = self.spawn_in(
            pipe,
            None,
            &[
                HTTPD, "--stack", "docknet", "--idle", "block", "--bind", bind,
            ],
        );
        assert!(
            self.attached_within(pipe, Duration::from_secs(5)),
            "the server attached to its pipe"
        );
        srv
    }

    /// Runs docknet-load over DockLib (blocking waits) in a container on `pipe` with `args`
    /// (requests, connections, the URL...): it must succeed; its JSON report.
    pub fn load_in(&self, pipe: &str, args: &[&str]) -> serde_json::Value {
        let mut a = vec![LOAD, "--stack", "docknet", "--idle", "block", "--json"];
        a.extend_from_slice(args);
        let o = self.in_container(pipe, &a);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("docknet-load's JSON report")
    }

    /// Whether background container `idx` is still running.
    pub fn running(&mut self, idx: usize) -> bool {
        self.children[idx].try_wait().unwrap().is_none()
    }

    /// Panics, with its exit status and stderr and `context`, unless background container
    /// `idx` (a server under attack) is still running.
    pub fn assert_alive(&mut self, idx: usize, context: &dyn std::fmt::Display) {
        if !self.running(idx) {
            let out = self.wait(idx, Duration::from_secs(5));
            panic!(
                "the server died under the attack: {context}\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Host pid of the `docknet run` process of background container `idx`.
    pub fn child_pid(&self, idx: usize) -> u32 {
        self.children[idx].id()
    }

    /// Waits for a background container and returns its output.
    pub fn wait(&mut self, idx: usize, timeout: Duration) -> Output {
        let t = Instant::now();
        loop {
            if let Some(_s) = self.children[idx].try_wait().unwrap() {
                let c = std::mem::replace(
                    &mut self.children[idx],
                    Command::new("true").spawn().unwrap(),
                );
                return c.wait_with_output().unwrap();
            }
            assert!(
                t.elapsed() < timeout,
                "container {idx} did not finish in {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs a command in a container to completion.
    pub fn in_container(&self, pipe: &str, args: &[&str]) -> Output {
        self.cmd()
            .args(["run", "--pipe", pipe, "--"])
            .args(args)
            .output()
            .expect("run container")
    }

    /// dnperf's server in pipe `server` at `addr` (one connection) and, 300 ms later, a client
    /// in pipe `client` sending it `bytes` checked bytes in 16 KiB writes, both at idle policy
    /// `idle`, started: (server, client) for [`Lab::intact`].
    pub fn checked_stream(
        &mut self,
        client: &str,
        server: &str,
        addr: &str,
        bytes: u64,
        idle: &str,
    ) -> (usize, usize) {
        let srv = self.spawn_in(
            server,
            None,
            &[
                dnperf(),
                "server",
                "--stack",
                "docknet",
                "--idle",
                idle,
                "--bind",
                addr,
                "--conns",
                "1",
            ],
        );
        std::thread::sleep(Duration::from_millis(300));
        let bytes = bytes.to_string();
        let cli = self.spawn_in(
            client,
            None,
            &[
                dnperf(),
                "client",
                "--stack",
                "docknet",
                "--idle",
                idle,
                "--connect",
                addr,
                "--workload",
                "check",
                "--bytes",
                &bytes,
                "--size",
                "16384",
                "--json",
            ],
        );
        (srv, cli)
    }

    /// Waits (at most `limit`) for the client of a [`Lab::checked_stream`], then its server;
    /// asserts the client succeeded with every byte intact (`what` names the stream) and
    /// returns its report.
    pub fn intact(
        &mut self,
        (srv, cli): (usize, usize),
        limit: Duration,
        what: &str,
    ) -> serde_json::Value {
        let out = self.wait(cli, limit);
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = peer_json(&out);
        assert_eq!(v["result"]["corrupt_bytes"], 0, "{what}: {v}");
        let _ = self.wait(srv, Duration::from_secs(20));
        v
    }

    pub fn counter(&self, pipe: &str, name: &str) -> u64 {
        self.json(&["pipe", "show", pipe, "--json"])["counters"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter {name}"))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.kill_daemon();
        // the daemon's fd holder outlives a killed daemon on purpose; end it by its pid
        if let Some(pid) = self.holder_pid() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Last JSON line of a peer's stdout.
pub fn peer_json(o: &Output) -> serde_json::Value {
    let s = String::from_utf8_lossy(&o.stdout);
    let line = s
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "no JSON from peer; stdout {s:?} stderr {:?}",
                String::from_utf8_lossy(&o.stderr)
            )
        });
    serde_json::from_str(line).unwrap()
}

pub fn path_of(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// CPU seconds (user + system) used so far by process `pid`, from /proc.
pub fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// A child ended by its pid and reaped when dropped, so a server a failed assertion leaves
/// waiting does not outlive its test.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.0.try_wait().is_ok_and(|s| s.is_none()) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// dnperf, built beside docknet.
pub fn dnperf() -> &'static str {
    env!("CARGO_BIN_EXE_dnperf")
}

/// `docknet --socket S ARGS...` on daemon `d`.
pub fn ctl(d: &Daemon, args: &[&str]) -> Output {
    d.cmd(Path::new(EXE)).args(args).output().unwrap()
}

/// [`ctl`], which must succeed: its standard output.
pub fn ok(d: &Daemon, args: &[&str]) -> String {
    let o = ctl(d, args);
    assert!(
        o.status.success(),
        "docknet {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `docknet status --json` of daemon `d`.
pub fn status(d: &Daemon) -> serde_json::Value {
    serde_json::from_str(&ok(d, &["status", "--json"])).unwrap()
}

/// The JSON line a dnperf client printed last, after checking it succeeded (`what` names it in
/// the failure).
pub fn result_of(o: Output, what: &str) -> serde_json::Value {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let line = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(line.lines().last().unwrap_or("")).unwrap()
}

/// A dnperf client's checked transfer (`--workload check`): it succeeded, and all `bytes`
/// arrived, none wrong.
pub fn checked(o: Output, bytes: u64, what: &str) {
    let r = result_of(o, what);
    assert_eq!(r["result"]["bytes"], bytes, "{what}: {r}");
    assert_eq!(r["result"]["corrupt_bytes"], 0, "{what}: {r}");
}
