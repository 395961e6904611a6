//! A DockNet daemon of the lab's own: a private run directory and socket on tmpfs, ended by pid
//! and removed on drop. Its control socket is spoken with the daemon's typed client.

use crate::plan::DaemonSetup;
use crate::proc::{terminate, unique, Stop};
use anyhow::{bail, Context, Result};
use docknet_daemon::proto::Client;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The link mode [`Daemon::launch`] reads as `--host-link` (the link's name in its place).
const HOST_LINK: &str = "host-link";

/// A running daemon.
#[derive(Debug)]
pub struct Daemon {
    proc: Option<Child>,
    /// Run directory.
    pub run_dir: PathBuf,
    /// Control socket.
    pub socket: PathBuf,
}

impl Daemon {
    /// Starts `EXE daemon` (the `docknet` binary) as `setup` says and waits until it answers.
    pub fn start(exe: &Path, setup: &DaemonSetup) -> Result<Daemon> {
        Daemon::start_on(exe, setup.idle, setup.master_core, setup.master_nice, None)
    }

    /// The same, with the master's idle policy and core given, and, for a host of a two-host
    /// topology, inside that host's namespace driving its end of the wire: `(netns, link,
    /// nic mode)`.
    pub fn start_on(
        exe: &Path,
        idle: &str,
        master_core: Option<usize>,
        master_nice: i32,
        host: Option<(&str, &str, &str)>,
    ) -> Result<Daemon> {
        Daemon::launch(exe, idle, master_core, master_nice, host, false)
    }

    /// A daemon in network namespace `ns` that makes a link to that namespace's kernel named
    /// `name` and drives it (`--host-link`), automatic fast channels on; its master's idle
    /// policy, core and nice value as for [`Daemon::start_on`].
    pub fn start_host_link(
        exe: &Path,
        idle: &str,
        master_core: Option<usize>,
        master_nice: i32,
        ns: &str,
        name: &str,
    ) -> Result<Daemon> {
        let host = Some((ns, name, HOST_LINK));
        Daemon::launch(exe, idle, master_core, master_nice, host, true)
    }

    /// [`Daemon::start`], with the daemon's automatic fast channels on (`docknet-auto`: the
    /// daemon at its defaults).
    pub fn start_auto(exe: &Path, setup: &DaemonSetup) -> Result<Daemon> {
        let s = setup;
        Daemon::launch(exe, s.idle, s.master_core, s.master_nice, None, true)
    }

    /// One host, the master's idle policy `idle`, nothing pinned, automatic fast channels on.
    pub fn start_auto_idle(exe: &Path, idle: &str) -> Result<Daemon> {
        Daemon::launch(exe, idle, None, 0, None, true)
    }

    fn launch(
        exe: &Path,
        idle: &str,
        master_core: Option<usize>,
        master_nice: i32,
        host: Option<(&str, &str, &str)>,
        auto_channels: bool,
    ) -> Result<Daemon> {
        let base = if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        let run_dir = PathBuf::from(base).join(format!("docknet-{}", unique("run")));
        let socket = run_dir.join("ctl.sock");
        // in a session of its own, as a service manager or a container runtime starts it: where
        // the kernel groups tasks by session, it then competes as one group beside each
        // container's (docs/lab.md, "Sessions")
        let mut cmd = Command::new("setsid");
        match host {
            Some((ns, _, _)) => cmd.args(["ip", "netns", "exec", ns]).arg(exe),
            None => cmd.arg(exe),
        };
        cmd.args(["--log", "warn", "daemon", "--run-dir"])
            .arg(&run_dir)
            .arg("--socket")
            .arg(&socket)
            .args(["--idle", idle, "--ephemeral"])
            // the lab's modes say which path they measure: `docknet` the daemon's, `docknet-fc`
            // the channel the lab builds, `docknet-auto` the channel the daemon builds
            .args([
                "--fast-channels",
                if auto_channels { "auto" } else { "manual" },
            ]);
        if let Some(c) = master_core {
            cmd.args(["--master-core", &c.to_string()]);
        }
        cmd.args(["--master-nice", &master_nice.to_string()]);
        match host {
            Some((_, name, HOST_LINK)) => cmd.args(["--host-link", name]),
            Some((_, link, mode)) => cmd.args(["--nic", link, "--nic-mode", mode]),
            None => &mut cmd,
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting docknet daemon")?;
        // its stderr: passed on, and the first error line kept for a failed start
        let first_error = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        if let Some(err) = child.stderr.take() {
            let keep = first_error.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                    eprintln!("{line}");
                    if let Ok(mut k) = keep.lock() {
                        if k.is_none() && line.contains("error") {
                            *k = Some(line.trim().to_string());
                        }
                    }
                }
            });
        }
        let mut d = Daemon {
            proc: Some(child),
            run_dir,
            socket,
        };
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&d.socket).is_err() {
            if let Some(Ok(Some(st))) = d.proc.as_mut().map(|c| c.try_wait()) {
                std::thread::sleep(Duration::from_millis(50));
                let why = first_error.lock().ok().and_then(|k| k.clone());
                bail!(
                    "docknet daemon exited during start-up ({st}){}",
                    why.map_or(String::new(), |w| format!(": {w}"))
                );
            }
            if t.elapsed() > Duration::from_secs(10) {
                bail!("docknet daemon did not open its socket within 10 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    /// A client of this daemon's control socket.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::connect(&self.socket)?)
    }

    /// Waits until a process in pipe `pipe`'s container has connected to it (its DockLib is
    /// up and takes frames), so a peer started next finds it: a raw request sent before is
    /// lost, and the client gives it up only after a second. Fails after `timeout` or at a
    /// signal.
    pub fn wait_connected(&self, pipe: &str, timeout: Duration, stop: &Stop) -> Result<()> {
        let t = Instant::now();
        let mut c = self.client()?;
        loop {
            stop.check()?;
            if c.pipe_show(pipe)?.connections > 0 {
                return Ok(());
            }
            if t.elapsed() > timeout {
                bail!("nothing in pipe {pipe}'s container connected to it within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `EXE --socket S` as a command (for `docknet run` in this daemon's pipes).
    pub fn cmd(&self, exe: &Path) -> Command {
        let mut c = Command::new(exe);
        c.arg("--socket").arg(&self.socket);
        c
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Child::id)
    }

    /// Stops the daemon (SIGTERM, then SIGKILL; an ephemeral daemon removes its pipes), waits
    /// for its fd holder to leave (it does once it keeps nothing; it is ended by its pid after
    /// 3 s), and removes the run directory.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.proc.take() {
            terminate(&mut c);
        }
        let holder = std::fs::read_to_string(docknet_daemon::holder::pid_path(&self.run_dir))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .map(nix::unistd::Pid::from_raw);
        if let Some(pid) = holder {
            let t = Instant::now();
            while nix::sys::signal::kill(pid, None).is_ok() {
                if t.elapsed() > Duration::from_secs(3) {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}
