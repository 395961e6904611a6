//! `docknet run`: starts a command as a container in the kernel sense (new mount, network, PID,
//! UTS and IPC namespaces) that sees exactly one DockPipe.
//!
//! Inside, the daemon's run directory and `/run/docknet` are covered by empty tmpfs mounts, the
//! control socket is covered too, and only the pipe's own directory is bind-mounted at
//! `/run/docknet/pipe` (its fast-channel files are hard links inside it, so a channel is visible
//! to exactly its two partners). The network namespace has only `lo`: the pipe is the only way
//! out. A small init (pid 1) mounts a fresh `/proc` and `/sys`, drops the capabilities that could undo the
//! mounts from the bounding set, runs the command, forwards signals and reaps orphans.

use anyhow::{bail, Context, Result};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::fs::{self, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Where the pipe appears inside the container.
pub const PIPE_MOUNT: &str = "/run/docknet/pipe";

/// Capabilities removed from the container's bounding set: the ones that could unmount the
/// covering tmpfs, reach raw devices or other processes, or load kernel code.
const DROPPED: &[caps::Capability] = &[
    caps::Capability::CAP_SYS_ADMIN,
    caps::Capability::CAP_SYS_PTRACE,
    caps::Capability::CAP_SYS_MODULE,
    caps::Capability::CAP_SYS_RAWIO,
    caps::Capability::CAP_MKNOD,
    caps::Capability::CAP_SYS_BOOT,
    caps::Capability::CAP_SYS_TIME,
    caps::Capability::CAP_DAC_READ_SEARCH,
];

fn tmpfs(at: &Path) -> Result<()> {
    mount(
        Some("tmpfs"),
        at,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=1m"),
    )
    .with_context(|| format!("mounting tmpfs over {}", at.display()))
}

/// Runs `cmd` in a new container attached to pipe `pipe`. Returns the command's exit status.
pub fn run(socket: &Path, pipe: &str, cpu: Option<usize>, cmd: &[String]) -> Result<ExitCode> {
    if cmd.is_empty() {
        bail!("no command given: docknet run --pipe NAME -- CMD [ARGS...]");
    }
    let mut client = crate::ctl::client(socket)?;
    let dir = PathBuf::from(client.pipe_show(pipe)?.dir);
    let run_dir = PathBuf::from(client.status()?.run_dir);
    let exe = std::env::current_exe().context("locating the docknet binary")?;
    if let Some(c) = cpu {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        if c >= n {
            bail!("--cpu {c}: this machine has cores 0..{}", n - 1);
        }
    }

    // Must happen while this process has a single thread.
    unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWPID
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWIPC,
    )
    .context("creating namespaces (docknet run needs root)")?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("making mounts private")?;
    // Keep a handle on the pipe directory before it is hidden. Opened after unshare so that
    // it refers to a mount of the new namespace (a bind mount across namespaces is refused).
    let dir_fd = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(&dir)
        .with_context(|| format!("opening pipe directory {}", dir.display()))?;

    tmpfs(&run_dir)?;
    let pub_dir = Path::new("/run/docknet");
    fs::create_dir_all(pub_dir).context("creating /run/docknet")?;
    if run_dir != pub_dir {
        tmpfs(pub_dir)?;
    }
    if fs::symlink_metadata(socket).is_ok() {
        // the socket lives outside both covered directories: cover the socket itself
        mount(
            Some("/dev/null"),
            socket,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .with_context(|| format!("covering the control socket {}", socket.display()))?;
    }
    let target = Path::new(PIPE_MOUNT);
    fs::create_dir_all(target).context("creating the pipe mount point")?;
    let src = format!("/proc/self/fd/{}", dir_fd.as_raw_fd());
    mount(
        Some(src.as_str()),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .context("bind-mounting the pipe")?;
    drop(dir_fd);
    let _ = nix::unistd::sethostname(pipe);

    // The first child of this process becomes pid 1 of the new PID namespace; when it exits
    // the namespace dies, so nothing but the container's init may be spawned from here on.
    let mut init = Command::new(exe);
    init.arg("__init");
    if let Some(c) = cpu {
        init.arg("--cpu").arg(c.to_string());
    }
    init.arg("--").args(cmd).env("DOCKNET_PIPE", PIPE_MOUNT);
    let child = init.spawn().context("starting the container's init")?;
    block_signals()?;
    supervise(Pid::from_raw(child.id() as i32))
}

/// Signals forwarded to the container; SIGCHLD tells us a child exited.
fn supervised_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGCHLD,
    ] {
        set.add(sig);
    }
    set
}

/// Blocks the supervised signals in this thread. Call right *after* spawning the child: a
/// spawned child inherits the mask (std does not reset it), and a child that exits before the
/// block is still reaped by the `waitpid` that `supervise` runs before its first `sigwait`.
fn block_signals() -> Result<()> {
    supervised_signals()
        .thread_block()
        .context("blocking signals")
}

/// Waits for `pid` without threads (a process that unshared its PID namespace cannot create
/// any): reaps every child that exits (we may be pid 1), forwards SIGINT, SIGTERM, SIGHUP and
/// SIGQUIT to `pid`, and returns its exit status as ours.
fn supervise(pid: Pid) -> Result<ExitCode> {
    let set = supervised_signals();
    loop {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(p, code)) if p == pid => {
                    return Ok(ExitCode::from(code as u8))
                }
                Ok(WaitStatus::Signaled(p, sig, _)) if p == pid => {
                    return Ok(ExitCode::from(128u8.wrapping_add(sig as u8)))
                }
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => bail!("waiting for the container: {e}"),
            }
        }
        let sig = set.wait().context("waiting for signals")?;
        if sig != Signal::SIGCHLD {
            let _ = kill(pid, sig);
        }
    }
}

/// The container's pid 1 (`docknet __init`).
pub fn init(cpu: Option<usize>, cmd: &[String]) -> Result<ExitCode> {
    if cmd.is_empty() {
        bail!("__init: no command");
    }
    // If the supervisor dies (even by SIGKILL), so does the container: killing pid 1 ends
    // every process of its PID namespace.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).context("setting the parent-death signal")?;
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .context("mounting /proc for the container")?;
    // sysfs shows the network namespace of whoever mounted it: mount the container's own
    mount(
        Some("sysfs"),
        "/sys",
        Some("sysfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .context("mounting /sys for the container")?;
    match Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
    {
        Ok(s) if s.success() => {}
        _ => eprintln!(
            "docknet: warning: could not bring up lo in the container (is iproute2 installed?)"
        ),
    }
    if let Some(c) = cpu {
        let mut set = nix::sched::CpuSet::new();
        set.set(c)?;
        nix::sched::sched_setaffinity(Pid::from_raw(0), &set).context("pinning the container")?;
    }
    // A root command's permitted set after exec is its inheritable set plus the bounding set,
    // so both lose the dropped capabilities, and the ambient set is cleared.
    for cap in DROPPED {
        caps::drop(None, caps::CapSet::Bounding, *cap)
            .with_context(|| format!("dropping {cap} from the bounding set"))?;
        caps::drop(None, caps::CapSet::Inheritable, *cap)
            .with_context(|| format!("dropping {cap} from the inheritable set"))?;
    }
    let _ = caps::clear(None, caps::CapSet::Ambient);
    // The kernel discards signals sent to a PID namespace's init from outside unless the init
    // has a handler for them (blocking is not enough), so install handlers; `supervise` then
    // takes the signals from the pending set with sigwait and forwards them.
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        signal_hook::flag::register(sig as i32, flag.clone())
            .context("installing signal handlers")?;
    }
    let child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .spawn()
        .with_context(|| format!("starting {:?}", cmd[0]))?;
    block_signals()?;
    supervise(Pid::from_raw(child.id() as i32))
}
