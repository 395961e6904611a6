//! Processes the lab starts: checked commands, children ended by pid, typed result lines,
//! names unique to the run, and the interrupt flag every long step checks.

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process and call: `dn<pid>x<n><tag>`. Namespaces, links and private
/// directories of a run carry it, so parallel or leftover runs never collide and the tests can
/// find anything left behind.
pub fn unique(tag: &str) -> String {
    format!(
        "dn{}x{}{tag}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A network namespace of the run's own with `lo` up (`ip netns add`), removed when dropped.
#[derive(Debug)]
pub struct Netns(pub String);

impl Netns {
    /// Adds namespace `unique(tag)` and brings its `lo` up.
    pub fn add(tag: &str) -> Result<Netns> {
        let ns = Netns(unique(tag));
        ip(&["netns", "add", &ns.0])?;
        ip(&["-n", &ns.0, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Its path, for those who take a namespace file.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

/// Runs `cmd` to completion; fails with `what` and its stderr unless it exits 0. Returns its
/// stdout.
pub fn checked(cmd: &mut Command, what: &str) -> Result<Vec<u8>> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out.stdout)
}

/// Runs `ip ARGS...`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    checked(
        Command::new("ip").args(args),
        &format!("ip {}", args.join(" ")),
    )
    .map(drop)
}

/// `prog ARGS...` inside network namespace `ns` (`ip netns exec`), in a session of its own as a
/// container runtime starts a container's process (and as `docknet run` does): where the kernel
/// groups tasks by session for scheduling (autogroup), each kernel-mode peer then competes as
/// DockNet's containers do, not inside one group with every other peer of the run.
pub fn in_ns(ns: &str, prog: &Path, args: Vec<String>) -> Command {
    let mut c = Command::new("setsid");
    c.args(["ip", "netns", "exec", ns]).arg(prog).args(args);
    c
}

/// Ends a child of ours: SIGTERM, up to 3 s to exit, then SIGKILL; reaps it.
pub fn terminate(c: &mut Child) {
    if let Ok(Some(_)) = c.try_wait() {
        return;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(c.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// Set by SIGINT or SIGTERM: the run stops at the next point and removes what it built.
#[derive(Debug, Clone)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// A flag raised by SIGINT and SIGTERM from now on.
    pub fn on_signals() -> Result<Stop> {
        let flag = Arc::new(AtomicBool::new(false));
        for s in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(s, flag.clone()).context("installing signal handlers")?;
        }
        Ok(Stop(flag))
    }

    /// Whether a signal came.
    pub fn raised(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Fails with "interrupted" once a signal came.
    pub fn check(&self) -> Result<()> {
        if self.raised() {
            bail!("interrupted");
        }
        Ok(())
    }
}

/// Whether a `/proc/net/tcp`-format table lists a socket listening on `port`.
fn lists_listener(table: &str, port: u16) -> bool {
    // "  0: 0100007F:1F90 00000000:0000 0A ...": local address:port (hex), remote, state (0A)
    table.lines().skip(1).any(|l| {
        let mut f = l.split_whitespace().skip(1);
        let local = f.next().and_then(|a| a.rsplit(':').next());
        let state = f.nth(1);
        local.and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port) && state == Some("0A")
    })
}

/// Waits until process `pid` is in namespace `ns` and a socket there listens on TCP `port`,
/// for a server started with [`in_ns`]: a client started before would count refused
/// connections as errors. Fails when `timeout` passes, the process ends or a signal comes.
pub fn wait_listening(pid: u32, ns: &str, port: u16, timeout: Duration, stop: &Stop) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let want = std::fs::metadata(format!("/run/netns/{ns}"))
        .with_context(|| format!("namespace {ns}"))?
        .ino();
    let t = Instant::now();
    loop {
        stop.check()?;
        let inside = std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .with_context(|| format!("process {pid} ended before it listened on port {port}"))?
            .ino()
            == want;
        let listens = || {
            ["tcp", "tcp6"].iter().any(|t| {
                std::fs::read_to_string(format!("/proc/{pid}/net/{t}"))
                    .is_ok_and(|s| lists_listener(&s, port))
            })
        };
        if inside && listens() {
            return Ok(());
        }
        if t.elapsed() > timeout {
            bail!("nothing listened on port {port} in {ns} within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A child process whose last JSON line on stdout is its result; killed on drop if still
/// running. Its stdout is read from the start by a thread of its own: a result larger than the
/// pipe's buffer (a dnperf report with a wide histogram is 70 KB) would otherwise block the
/// child in `write` while we wait for it to exit.
#[derive(Debug)]
pub struct Proc {
    child: Child,
    what: String,
    stdout: Option<std::thread::JoinHandle<String>>,
}

impl Proc {
    /// Starts `cmd` with stdout piped.
    pub fn spawn(mut cmd: Command, what: &str) -> Result<Proc> {
        cmd.stdout(Stdio::piped()).stdin(Stdio::null());
        let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        let stdout = child.stdout.take().map(|mut o| {
            std::thread::spawn(move || {
                let mut out = String::new();
                let _ = o.read_to_string(&mut out);
                out
            })
        });
        Ok(Proc {
            child,
            what: what.into(),
            stdout,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits up to `timeout` (or until interrupted) and parses the last stdout line that is a
    /// JSON object as `T`.
    pub fn result<T: DeserializeOwned>(mut self, timeout: Duration, stop: &Stop) -> Result<T> {
        let t = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            stop.check()?;
            if t.elapsed() > timeout {
                bail!("{} did not finish within {:?}", self.what, timeout);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // the child has exited: its stdout ends once any grandchild holding it has too
        let out = self
            .stdout
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        if !status.success() {
            bail!("{} failed ({status})", self.what);
        }
        let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap_or("");
        serde_json::from_str(line)
            .with_context(|| format!("{} printed no result: {out:?}", self.what))
    }

    /// Waits for a server to finish on its own (its result is not needed), then ends it.
    pub fn finish(self, stop: &Stop) {
        let _ = self.result::<serde_json::Value>(Duration::from_secs(10), stop);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_tagged_with_the_pid() {
        let (a, b) = (unique("h"), unique("h"));
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("dn{}x", std::process::id())) && a.ends_with('h'));
    }

    #[test]
    fn a_listener_is_found_by_its_port_and_state_only() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue\n\
           0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000\n\
           1: 0100007F:0050 0100007F:9C40 01 00000000:00000000 00:00000000 00000000\n";
        assert!(lists_listener(table, 8080));
        assert!(
            !lists_listener(table, 80),
            "an established socket is not a listener"
        );
        assert!(!lists_listener(table, 40000), "a remote port is not ours");
        let v6 = "  sl  local_address                         remote_address                        st\n\
           0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 0\n";
        assert!(lists_listener(v6, 80));
        assert!(!lists_listener("header only\n", 80));
    }

    #[test]
    fn a_result_larger_than_the_pipe_buffer_does_not_block_its_writer() {
        let stop = Stop(Arc::new(AtomicBool::new(false)));
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "printf '{\"h\": \"'; head -c 300000 /dev/zero | tr '\\0' x; printf '\"}\\n'",
        ]);
        let v: serde_json::Value = Proc::spawn(c, "a big result")
            .unwrap()
            .result(Duration::from_secs(20), &stop)
            .unwrap();
        assert_eq!(v["h"].as_str().map(str::len), Some(300_000));
    }

    #[test]
    fn results_are_the_last_json_line_and_failures_say_what() {
        let stop = Stop(Arc::new(AtomicBool::new(false)));
        let mut c = Command::new("sh");
        c.args(["-c", "echo noise; echo '{\"a\": 1}'; echo '{\"a\": 2}'"]);
        let v: serde_json::Value = Proc::spawn(c, "echo")
            .unwrap()
            .result(Duration::from_secs(5), &stop)
            .unwrap();
        assert_eq!(v["a"], 2);
        let mut c = Command::new("sh");
        c.args(["-c", "exit 3"]);
        let e = Proc::spawn(c, "the tool")
            .unwrap()
            .result::<serde_json::Value>(Duration::from_secs(5), &stop)
            .unwrap_err();
        assert!(e.to_string().contains("the tool failed"), "{e}");
        let e = checked(
            Command::new("sh").args(["-c", "echo oops >&2; exit 1"]),
            "sh",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "sh: oops");
        stop.0.store(true, Ordering::Relaxed);
        let mut c = Command::new("sleep");
        c.arg("5");
        let e = Proc::spawn(c, "sleep")
            .unwrap()
            .result::<serde_json::Value>(Duration::from_secs(5), &stop)
            .unwrap_err();
        assert_eq!(e.to_string(), "interrupted");
    }
}

/// The CPU time of the experiment's processes: its roots (the daemon, every `docknet run` or
/// `ip netns exec` it started), their descendants, and the kernel's softirq threads. Read from
/// each task's `schedstat` (nanoseconds on a CPU, exact), not `/proc/stat`, whose tick samples
/// miss threads that run between ticks and sleep at them.
#[derive(Debug, Default)]
pub struct CpuMeter {
    /// The processes found by the last [`CpuMeter::refresh`].
    pub pids: Vec<u32>,
}

impl CpuMeter {
    /// Finds the processes under `roots` (and ksoftirqd) anew.
    pub fn refresh(&mut self, roots: &[u32]) {
        let mut parent: Vec<(u32, u32)> = Vec::new();
        let mut soft = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // "pid (comm) state ppid ...": comm may hold spaces and parentheses
            let Some((head, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            if head.contains("(ksoftirqd/") {
                soft.push(pid);
            }
            if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|x| x.parse().ok()) {
                parent.push((pid, ppid));
            }
        }
        let mut set: Vec<u32> = roots.to_vec();
        let mut i = 0;
        while i < set.len() {
            let p = set[i];
            set.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
            i += 1;
        }
        set.extend(soft);
        set.sort_unstable();
        set.dedup();
        self.pids = set;
    }

    /// Nanoseconds on a CPU of each task (thread id) of the processes found.
    pub fn ns_by_task(&self) -> std::collections::HashMap<u32, u64> {
        let mut out = std::collections::HashMap::new();
        for p in &self.pids {
            for t in std::fs::read_dir(format!("/proc/{p}/task"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                if let Some(v) = std::fs::read_to_string(t.path().join("schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                {
                    out.insert(tid, v);
                }
            }
        }
        out
    }

    /// CPU nanoseconds between two [`CpuMeter::ns_by_task`] samples, over the tasks in both
    /// (a task that ended between them takes its time with it).
    pub fn delta(
        before: &std::collections::HashMap<u32, u64>,
        after: &std::collections::HashMap<u32, u64>,
    ) -> u64 {
        after
            .iter()
            .filter_map(|(t, v)| Some(v.saturating_sub(*before.get(t)?)))
            .sum()
    }

    /// Nanoseconds on a CPU of every task of the processes found.
    pub fn ns(&self) -> u64 {
        let mut sum = 0;
        for p in &self.pids {
            for t in std::fs::read_dir(format!("/proc/{p}/task"))
                .into_iter()
                .flatten()
                .flatten()
            {
                sum += std::fs::read_to_string(t.path().join("schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        sum
    }
}
