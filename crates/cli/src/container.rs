//! `docknet run`: a command as a container that reaches the network only through its pipe.
//!
//! The supervisor (`docknet run`, in the host's mount namespace) makes new network, PID, UTS
//! and IPC namespaces, asks the daemon to hand the pipe out in that network namespace
//! (`pipe_attach`: an abstract socket `@docknet/pipe` the container connects to, so no host path
//! is shared), starts the container's init, forwards signals, and detaches the pipe when the
//! command ends. The init (pid 1 of the new PID namespace) builds the container's walls
//! ([`crate::sandbox`]): nothing the caller left open; its own root, `/dev`, `/proc`; the
//! command's user (one of the container's own by default) and a limit on its processes; no
//! capabilities; `no_new_privs`; a seccomp filter; a
//! new session without a controlling terminal. Then it runs the command,
//! forwards signals, reaps orphans, and exits with the command's status.

use crate::sandbox;
use anyhow::{bail, Context, Result};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// What `docknet run` was asked for.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Pipe to attach. A pipe serves one container at a time: while another container that
    /// still has processes holds it, the run waits up to 3 s for them to exit (a container
    /// restarted right after it was killed) and then fails.
    #[arg(long)]
    pub pipe: String,
    /// Pin the container to this core.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Abstract socket name the pipe is handed out at inside the container (without `@`).
    #[arg(long, default_value = docknet_pipe::delivery::DEFAULT_SOCKET)]
    pub socket_name: String,
    /// Use this directory as the container's root (read-only) instead of the host's system
    /// directories.
    #[arg(long)]
    pub rootfs: Option<PathBuf>,
    /// Also show this host directory, read-only, at the same path (repeatable).
    #[arg(long = "bind")]
    pub binds: Vec<PathBuf>,
    /// Who the command runs as: UID or UID:GID, numbers or the host's names (a user alone: its
    /// group in /etc/passwd, or the same number). By default a user and group of the
    /// container's own, from 1879048192 up, numbered by its network namespace, so that no other
    /// running container has it: it reads only what the host lets everyone read, and the
    /// kernel's limits per user (processes, inotify, pipe buffers) are this container's alone.
    /// The id has no name (whoami and the like find none; --user 65534 runs it as nobody).
    /// Containers given the same user share those limits. `--user 0` runs the command as root,
    /// still without capabilities, but owning, and so able to read, the host's root-only files
    /// in the directories the container shows (/etc, /usr, the command's directory, --bind).
    #[arg(long, value_parser = sandbox::parse_user)]
    pub user: Option<sandbox::User>,
    /// The most processes and threads the container's user may have (RLIMIT_NPROC; the init
    /// and the command count, so at least 2; the command cannot raise it). 0 keeps the
    /// caller's limit. The kernel counts every process of the user on the host: with --user,
    /// the host's own processes of that user count too, so there is no limit unless this is
    /// given; the container's own user is limited to 1024 unless this says otherwise. Root is
    /// exempt (--user 0), and containers given the same user share one count.
    #[arg(long, value_parser = pids_limit)]
    pub pids_limit: Option<u64>,
    /// Run the command unmodified over the pipe: LD_PRELOAD the socket library built beside
    /// the docknet binary (libdocknet_preload.so). AF_INET TCP and UDP sockets on the pipe's
    /// network go to DockNet, everything else to the kernel (docs/preload.md).
    #[arg(long)]
    pub preload: bool,
    /// A DNS server for the container's resolver (repeatable, at most 3, as glibc reads): the
    /// container's /etc/resolv.conf lists these instead of the host's. With --preload, a server
    /// on the pipe's network (a cluster's DNS Service address too) is asked over DockNet.
    #[arg(long = "dns", value_name = "ADDR")]
    pub dns: Vec<std::net::IpAddr>,
    /// A search domain for the container's resolver (repeatable, at most 6), with --dns.
    #[arg(long = "dns-search", value_name = "DOMAIN", requires = "dns", value_parser = dns_domain)]
    pub dns_search: Vec<String>,
    /// The command and its arguments (after --): a name on PATH, an absolute path, or a path
    /// relative to this directory (`./server`), as in a shell. It starts in this directory
    /// where the container shows it (a system directory, or one given with --bind), else in /.
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

/// `--dns-search`: a domain name (letters, digits, `-`, `.`; at most 253 bytes).
fn dns_domain(s: &str) -> std::result::Result<String, String> {
    let d = s.trim_end_matches('.');
    let ok = !d.is_empty()
        && d.len() <= 253
        && d.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if ok {
        Ok(d.to_string())
    } else {
        Err(format!("{s:?} is not a domain name"))
    }
}

/// The container's /etc/resolv.conf for `--dns` and `--dns-search`, or `None` without `--dns`.
fn resolv_conf(a: &RunArgs) -> Result<Option<String>> {
    if a.dns.is_empty() {
        return Ok(None);
    }
    if a.dns.len() > 3 {
        bail!("--dns: at most 3 servers (the resolver reads no more)");
    }
    if a.dns_search.len() > 6 {
        bail!("--dns-search: at most 6 domains");
    }
    let mut t = String::from("# written by docknet run --dns\n");
    for s in &a.dns {
        t.push_str(&format!("nameserver {s}\n"));
    }
    if !a.dns_search.is_empty() {
        t.push_str(&format!("search {}\n", a.dns_search.join(" ")));
    }
    Ok(Some(t))
}

/// The process limit of a container that runs as its own user, unless `--pids-limit` says.
pub const OWN_PIDS_LIMIT: u64 = 1024;

/// `--pids-limit`: 0 (the caller's), or room for the init and the command at least.
fn pids_limit(s: &str) -> std::result::Result<u64, String> {
    match s.parse::<u64>() {
        Ok(1) => Err("1: the init and the command are two processes already".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The command's program on the host's PATH (its directory is shown in the container).
fn resolve(cmd: &str) -> Option<PathBuf> {
    if cmd.contains('/') {
        return std::fs::canonicalize(cmd).ok();
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

/// Whether `p` lies under one of the directories the root shows anyway.
fn under_system(p: &Path) -> bool {
    ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"]
        .iter()
        .any(|s| p.starts_with(s))
}

/// Runs `a.cmd` in a new container attached to pipe `a.pipe`; returns the command's status.
pub fn run(socket: &Path, a: &RunArgs) -> Result<ExitCode> {
    // the daemon is asked for the pipe only once the namespaces exist (an unknown pipe is
    // refused then, as clearly); connecting first fails early when no daemon runs
    let mut client = crate::ctl::client(socket)?;
    if let Some(c) = a.cpu {
        // the cores this process may run on (not available_parallelism, which a cgroup's CPU
        // quota lowers: a container under a quota of one core still picks its core)
        let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .map(|set| {
                (0..nix::sched::CpuSet::count())
                    .filter(|i| set.is_set(*i).unwrap_or(false))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        if !allowed.is_empty() && !allowed.contains(&c) {
            bail!("--cpu {c}: this process may run on cores {allowed:?} only");
        }
    }
    let exe = std::env::current_exe().context("locating the docknet binary")?;
    let preload = if a.preload {
        Some(preload_library(&exe)?)
    } else {
        None
    };
    let resolv = resolv_conf(a)?;
    let mut cmd = a.cmd.clone();
    let mut binds = a.binds.clone();
    let prog = resolve(&cmd[0]);
    // a relative path (`./server`, `target/release/x`) means the caller's directory, as in a
    // shell; the container starts in its own root, so the path is made absolute here
    if cmd[0].contains('/') && !cmd[0].starts_with('/') {
        if a.rootfs.is_some() {
            bail!(
                "{:?}: a relative command path with --rootfs is ambiguous; give the path inside the root, from /",
                cmd[0]
            );
        }
        let Some(abs) = &prog else {
            bail!(
                "{:?}: no such file in {}",
                cmd[0],
                std::env::current_dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_else(|_| "the current directory".into())
            );
        };
        cmd[0] = abs.to_string_lossy().into_owned();
    }
    if a.rootfs.is_none() {
        for prog in [prog, Some(exe.clone())].into_iter().flatten() {
            if let Some(d) = prog.parent().filter(|d| !under_system(d)) {
                if !binds.iter().any(|b| b == d) {
                    binds.push(d.to_path_buf());
                }
            }
        }
    }
    // the command starts in the caller's directory where the container shows it, else in /
    let cwd = std::env::current_dir().ok().filter(|d| {
        a.rootfs.is_none() && (under_system(d) || binds.iter().any(|b| d.starts_with(b)))
    });
    // the container's own user is numbered by its network namespace, and the host's users
    // and groups are looked up (for one that has that id) in the host's
    let host_net =
        std::fs::File::open("/proc/self/ns/net").context("opening the host's network namespace")?;
    // Must happen while this process has a single thread.
    unshare(
        CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWPID
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWIPC,
    )
    .context("creating namespaces (docknet run needs root)")?;
    let _ = nix::unistd::sethostname(&a.pipe);
    let user = match a.user {
        Some(u) => u,
        None => sandbox::User::own_here()?,
    };
    if let Some(lib) = &preload {
        // the dynamic loader skips a library it cannot read with a warning, and the command
        // would then run on the kernel's sockets
        if !sandbox::reachable_by(lib, user) {
            bail!(
                "--preload: {} cannot be read by the container's user {} (the file, or a directory above it)",
                lib.display(),
                user
            );
        }
    }

    // The first child of this process becomes pid 1 of the new PID namespace; when it exits
    // the namespace dies, so nothing but the container's init may be started from here on. The
    // init is this process forked (not docknet executed again: a second start of this binary
    // was a third of a container's start-up time). It builds the walls while this process
    // asks the daemon for the pipe, and starts the command once told where the pipe is.
    let init_args = Init {
        cpu: a.cpu,
        walls: sandbox::Walls {
            rootfs: a.rootfs.clone(),
            binds,
            user,
            resolv,
        },
        pids_limit: a.pids_limit.unwrap_or(match a.user {
            None => OWN_PIDS_LIMIT,
            Some(_) => 0,
        }),
        preload,
        cmd,
        cwd,
    };
    let (go_r, go_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("a pipe to the init")?;
    // SAFETY: this process has a single thread (unshare above needed that too), so the child
    // may allocate and run any code; it leaves only through `exit`.
    #[allow(unsafe_code)]
    let forked = unsafe { nix::unistd::fork() };
    let child = match forked.context("starting the container's init")? {
        nix::unistd::ForkResult::Child => {
            drop((go_w, client, host_net));
            let code = match init(&init_args, go_r) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("docknet: error: {e:#}");
                    1
                }
            };
            std::process::exit(i32::from(code))
        }
        nix::unistd::ForkResult::Parent { child } => child,
    };
    drop(go_r);
    let netns = format!("/proc/{}/ns/net", std::process::id());
    let attached = attach_when_free(&mut client, &a.pipe, &netns, &a.socket_name)
        .context("handing the pipe to the container");
    drop(client);
    // while the init builds the walls: the container's own id must be no host account's (the
    // look-up can take a while: the user database's modules are loaded for it). After the
    // attach: the daemon found the container's network namespace through this process's, which
    // the look-up leaves for the host's and enters again.
    let free = match a.user {
        Some(_) => Ok(()),
        None => sandbox::no_account_has(user, &host_net),
    };
    drop(host_net);
    // The init reads the socket's name up to its NUL, then starts the command. The pipe stays
    // open while this process lives: the init, once it is no longer root, checks that it is
    // still open (its parent-death signal, reset by the change of user, may have come too late).
    // When the daemon refused the pipe, the init reads nothing and exits.
    let _alive = match (&attached, &free) {
        (Ok(at), Ok(())) => {
            let mut w = std::fs::File::from(go_w);
            let _ = std::io::Write::write_all(&mut w, format!("{}\0", at.socket).as_bytes());
            Some(w)
        }
        _ => {
            drop(go_w);
            None
        }
    };
    block_signals()?;
    let code = supervise(child).map(ExitCode::from);
    attached?;
    // (refused: the pipe is detached below, then the reason is the error)
    let code = free.and(code);
    // the container is gone: close the pipe's socket in its (dead) namespace. A daemon that is
    // restarting gets 10 s; after that the attachment stays until the next `docknet run` of the
    // pipe sees its namespace empty and replaces it.
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(10) {
        match crate::ctl::client(socket).map(|mut c| c.pipe_detach(&a.pipe)) {
            Ok(_) => break,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    }
    code
}

/// How long `docknet run` waits for the pipe's previous container to leave its network
/// namespace. A container killed a moment ago (its supervisor SIGKILLed, as a restart does)
/// still has processes exiting there for a few milliseconds, and the daemon hands a pipe to one
/// container at a time.
const ATTACH_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Asks the daemon for the pipe; while it is attached to a container whose namespace still has
/// processes, asks again every 20 ms for up to [`ATTACH_WAIT`], then returns the refusal.
fn attach_when_free(
    client: &mut docknet_daemon::proto::Client,
    pipe: &str,
    netns: &str,
    socket: &str,
) -> Result<docknet_daemon::proto::Attached, docknet_daemon::proto::ClientError> {
    use docknet_daemon::proto::{ClientError, ErrorCode};
    let t = std::time::Instant::now();
    loop {
        match client.pipe_attach(pipe, netns, Some(socket)) {
            Err(ClientError::Api(e))
                if e.code == ErrorCode::Exists && t.elapsed() < ATTACH_WAIT =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// The file name of the preload library, beside the `docknet` binary.
pub const PRELOAD_LIB: &str = "libdocknet_preload.so";

/// The preload library beside `exe` (the container shows the binary's directory, so the
/// library is visible inside at the same path).
fn preload_library(exe: &Path) -> Result<PathBuf> {
    let p = exe
        .parent()
        .map(|d| d.join(PRELOAD_LIB))
        .context("the docknet binary has no directory")?;
    if !p.is_file() {
        bail!(
            "--preload: {} not found (build it beside docknet: cargo build --release -p docknet-preload)",
            p.display()
        );
    }
    Ok(p)
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
fn supervise(pid: Pid) -> Result<u8> {
    let set = supervised_signals();
    loop {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(p, code)) if p == pid => return Ok(code as u8),
                Ok(WaitStatus::Signaled(p, sig, _)) if p == pid => {
                    return Ok(128u8.wrapping_add(sig as u8))
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

/// The name of the pipe's socket, as the supervisor writes it on `go` (up to a NUL; at most
/// 256 bytes, a socket name being at most 108), once the supervisor is known to be alive: `None`
/// when it wrote nothing (the daemon refused the pipe) or is gone.
fn pipe_socket(go: std::os::fd::OwnedFd) -> Result<Option<String>> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut f = std::fs::File::from(go);
    let mut name = Vec::new();
    let mut buf = [0u8; 256];
    while !name.contains(&0) && name.len() < buf.len() {
        let room = buf.len() - name.len();
        let n = std::io::Read::read(&mut f, &mut buf[..room]).context("waiting for the pipe")?;
        if n == 0 {
            return Ok(None);
        }
        name.extend_from_slice(&buf[..n]);
    }
    let Some(end) = name.iter().position(|b| *b == 0) else {
        bail!("the pipe's socket name is too long");
    };
    name.truncate(end);
    // the supervisor keeps its end open for its life: a hang-up means it is gone
    let mut fds = [PollFd::new(f.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).context("checking on the supervisor")?;
    if fds[0]
        .revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
    {
        return Ok(None);
    }
    Ok(Some(
        String::from_utf8(name).context("the pipe's socket name is not UTF-8")?,
    ))
}

/// What the container's init is given.
struct Init {
    cpu: Option<usize>,
    /// RLIMIT_NPROC of the container (0: the caller's).
    pids_limit: u64,
    walls: sandbox::Walls,
    preload: Option<PathBuf>,
    cmd: Vec<String>,
    /// Where the command starts (the caller's directory, where the container shows it).
    cwd: Option<PathBuf>,
}

/// The container's pid 1 (forked by `run`): builds the walls, waits for the name of the pipe's
/// socket on `go` (nothing comes when the daemon refused the pipe: the supervisor reports
/// why), runs the command, forwards signals to it and returns its exit status.
fn init(a: &Init, go: std::os::fd::OwnedFd) -> Result<u8> {
    let (cpu, walls, cmd) = (a.cpu, &a.walls, &a.cmd);
    if cmd.is_empty() {
        bail!("no command");
    }
    // If the supervisor dies (even by SIGKILL), so does the container: killing pid 1 ends
    // every process of its PID namespace.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).context("setting the parent-death signal")?;
    // nothing the caller of `docknet run` left open reaches the container (a directory's
    // descriptor would lead out of the root built below)
    close_inherited(std::os::fd::AsRawFd::as_raw_fd(&go))?;
    // the directories the walls make let the user through, whatever the caller's umask
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    docknet_daemon::nic::link::set_up("lo").context("bringing up lo in the container")?;
    sandbox::build_root(walls)?;
    if let Some(c) = cpu {
        let mut set = nix::sched::CpuSet::new();
        set.set(c)?;
        nix::sched::sched_setaffinity(Pid::from_raw(0), &set).context("pinning the container")?;
    }
    // a new session: no controlling terminal to inject keystrokes into
    let _ = nix::unistd::setsid();
    sandbox::drop_privileges()?;
    if a.pids_limit > 0 {
        // soft and hard: the command cannot raise it; it holds across the change of user
        nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_NPROC,
            a.pids_limit,
            a.pids_limit,
        )
        .context("limiting the container's processes")?;
    }
    sandbox::become_user(walls.user)?;
    // a change of user clears the parent-death signal
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).context("setting the parent-death signal")?;
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
    sandbox::install_seccomp()?;
    let Some(pipe_socket) = pipe_socket(go)? else {
        return Ok(1);
    };
    let mut command = Command::new(&cmd[0]);
    command.args(&cmd[1..]);
    command.env("DOCKNET_PIPE", &pipe_socket);
    if let Some(d) = &a.cwd {
        command.current_dir(d);
    }
    if let Some(p) = &a.preload {
        // only the command: the init itself stays free of it
        command.env("LD_PRELOAD", p);
    }
    let child = command.spawn().map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
            format!(
                " (it runs as {}: the program and its directories must let that user in; --user 0 runs it as root)",
                walls.user
            )
        } else {
            String::new()
        };
        anyhow::anyhow!("starting {:?}: {e}{hint}", cmd[0])
    })?;
    let child = Pid::from_raw(child.id() as i32);
    block_signals()?;
    // a signal that came before the command existed only raised the flag: it ends the command
    if flag.load(std::sync::atomic::Ordering::SeqCst) {
        let _ = kill(child, Signal::SIGTERM);
    }
    supervise(child)
}

/// Closes every descriptor from 3 up but `keep`.
#[allow(unsafe_code)]
fn close_inherited(keep: std::os::fd::RawFd) -> Result<()> {
    let keep = libc::c_uint::try_from(keep).context("a negative descriptor")?;
    for (first, last) in [(3, keep.saturating_sub(1)), (keep + 1, libc::c_uint::MAX)] {
        if first > last {
            continue;
        }
        // SAFETY: no Rust object of this process owns these descriptors: the init is a fork of
        // a single-threaded supervisor that dropped its own (the control connection, its end
        // of `go` and the host's network namespace) in the child, so what is open from 3 up
        // besides `keep` was inherited from whoever started `docknet run`. Closing them
        // invalidates no memory.
        if unsafe { libc::close_range(first, last, 0) } != 0 {
            return Err(std::io::Error::last_os_error()).context("closing inherited descriptors");
        }
    }
    Ok(())
}
