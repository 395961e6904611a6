//! Harness for the balancer's tests with real processes in real namespaces: a private daemon
//! (own run directory on tmpfs, own socket), containers started with `docknet run`, their
//! output read by threads, every child ended by pid and everything removed on drop.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const NATLB: &str = env!("CARGO_BIN_EXE_docknet-natlb");
static SEQ: AtomicU32 = AtomicU32::new(0);
/// The container tests run one at a time: their health timings assume the two cores are not
/// shared with several other balancers.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// A program built next to `docknet-natlb` (`docknet`, `dnperf`, or an example).
pub fn beside(name: &str) -> String {
    let p = Path::new(NATLB).parent().expect("a directory").join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace's binaries and this crate's examples first \
         (cargo test --workspace does; or cargo build --workspace --bins --examples)",
        p.display()
    );
    p.to_string_lossy().into_owned()
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

/// A started process: its stdin (if asked for) and its output lines.
pub struct Proc {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub out: Receiver<String>,
    pub err: Receiver<String>,
}

fn lines(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

impl Proc {
    /// The next stdout line, within `t`.
    pub fn line(&mut self, t: Duration) -> String {
        self.out
            .recv_timeout(t)
            .unwrap_or_else(|_| panic!("no output line within {t:?}; stderr: {}", self.stderr()))
    }

    /// Waits for a stderr line containing `s`.
    pub fn wait_err(&mut self, s: &str, t: Duration) {
        let end = Instant::now() + t;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.err.recv_timeout(left) {
                Ok(l) if l.contains(s) => return,
                Ok(_) => {}
                Err(_) => panic!("no {s:?} on stderr within {t:?}"),
            }
        }
    }

    /// What is on stderr so far.
    pub fn stderr(&self) -> String {
        self.err.try_iter().collect::<Vec<_>>().join("\n")
    }

    /// Sends one command line and returns the JSON line that answers it.
    pub fn ask(&mut self, cmd: &str, t: Duration) -> serde_json::Value {
        let w = self.stdin.as_mut().expect("stdin piped");
        writeln!(w, "{cmd}").expect("write command");
        w.flush().unwrap();
        let l = self.line(t);
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))
    }

    /// Waits for the process to end, within `t`.
    pub fn wait(&mut self, t: Duration) -> ExitStatus {
        let end = Instant::now() + t;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < end,
                "process {} did not end",
                self.child.id()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits.
    pub fn term(&mut self, t: Duration) -> ExitStatus {
        signal(self.child.id(), nix::sys::signal::Signal::SIGTERM);
        self.wait(t)
    }

    /// SIGKILL (a container's supervisor: the container dies with it), then reaps.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    /// A process still running is killed (by its own handle: never a pid reaped already).
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

fn signal(pid: u32, s: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), s);
}

/// A private daemon and what runs on it.
pub struct Lab {
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// Unique to this lab (in container names' arguments, so leftovers can be found).
    pub tag: String,
    daemon: Option<Child>,
}

impl Lab {
    pub fn start() -> Lab {
        let tag = format!(
            "natlb{}x{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = PathBuf::from("/dev/shm").join(format!("docknet-test-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        let socket = dir.join("ctl.sock");
        let daemon = Command::new(beside("docknet"))
            .args([
                "--log",
                "warn",
                "daemon",
                "--idle",
                "adaptive",
                "--ephemeral",
                "--run-dir",
            ])
            .arg(&dir)
            .arg("--socket")
            .arg(&socket)
            .stdout(Stdio::null())
            .spawn()
            .expect("start daemon");
        let lab = Lab {
            dir,
            socket,
            tag,
            daemon: Some(daemon),
        };
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&lab.socket).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        lab
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(beside("docknet"));
        c.arg("--socket").arg(&self.socket);
        c
    }

    /// Runs a client command that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.cmd().args(args).output().expect("run docknet");
        assert!(
            o.status.success(),
            "docknet {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// Starts `docknet run --pipe PIPE [--cpu N] -- ARGS`, output read by threads.
    pub fn spawn(&self, pipe: &str, cpu: Option<usize>, args: &[&str], stdin: bool) -> Proc {
        let mut c = self.cmd();
        c.args(["run", "--pipe", pipe]);
        if let Some(n) = cpu {
            c.args(["--cpu", &n.to_string()]);
        }
        c.arg("--")
            .args(args)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn container");
        Proc {
            stdin: child.stdin.take(),
            out: lines(child.stdout.take().unwrap()),
            err: lines(child.stderr.take().unwrap()),
            child,
        }
    }

    /// Runs a container to its end; (status, stdout, stderr).
    pub fn run(&self, pipe: &str, args: &[&str]) -> (ExitStatus, String, String) {
        let o = self
            .cmd()
            .args(["run", "--pipe", pipe, "--"])
            .args(args)
            .output()
            .expect("run container");
        (
            o.status,
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// Removes every pipe and checks the daemon holds nothing more.
    pub fn remove_pipes(&self, pipes: &[&str]) {
        for p in pipes {
            self.ok(&["pipe", "rm", p]);
        }
        let left: serde_json::Value =
            serde_json::from_str(&self.ok(&["pipe", "ls", "--json"])).unwrap();
        assert_eq!(left.as_array().map(Vec::len), Some(0), "pipes left: {left}");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        // the daemon's fd holder outlives a killed daemon on purpose; end it by its pid
        if let Some(pid) = std::fs::read_to_string(self.dir.join("holder.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
            // it is not our child, so there is no wait(): it has gone once its command line
            // reads empty (a zombie's does) or its /proc entry is gone; the nothing-left-behind
            // checks run right after this (one CI run listed a process of this lab there, most
            // likely this one)
            let t = std::time::Instant::now();
            while std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
                && t.elapsed() < std::time::Duration::from_secs(5)
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Processes whose command line contains `needle` (for the nothing-left-behind checks).
pub fn processes_with(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}
