//! DockDaemon: owns the pipes, moves every frame between them (master thread), builds fast
//! channels, and answers the control socket.
//!
//! Threads: the master thread ([`master`]) forwards; a tokio runtime on the calling thread
//! serves the control socket ([`control`]) and mirrors counters into each region's header.
//! The forwarding decision ([`switch`]) is a pure function unit tests drive without root.

#![deny(unsafe_code)]

pub mod attach;
pub mod autofc;
pub mod capture;
pub mod control;
pub mod holder;
pub mod master;
pub mod metrics;
pub mod nic;
pub mod pool;
pub mod proto;
pub mod rate;
pub mod registry;
pub mod route;
pub mod switch;
pub mod watch;

use docknet_pipe::layout;
use docknet_pipe::IdlePolicy;
use nix::fcntl::{Flock, FlockArg};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Why the daemon could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The link to the wire cannot be driven.
    #[error(transparent)]
    Nic(#[from] nic::NicError),
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
    /// Another daemon holds the run directory.
    #[error("run directory {0} is in use by another docknet daemon")]
    Locked(String),
    /// Something already listens on the socket.
    #[error("a daemon is already listening on {0}")]
    SocketInUse(String),
    /// I/O failure, with context.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The nice value the master threads run at unless told otherwise: the containers' own. A
/// higher priority helps when many containers are busy (docs/benchmarks.md, "Density"), but a
/// master that spins or yields at a higher priority than a container on its core can keep it
/// off the core, so it is the operator's choice (`--master-nice`).
pub const MASTER_NICE: i32 = 0;

/// The scheduling of the daemon's control plane: the thread that answers the control socket and
/// builds automatic fast channels, and the fd holder's. When containers keep the cores busy, a
/// control plane at their priority gets one share among hundreds: an automatic channel then
/// took 50-300 ms to build instead of 1 ms, and its pair paid the daemon's path meanwhile
/// (docs/benchmarks.md, "Automatic channels at density"). A nice value does not lift it where
/// the kernel groups tasks by session (autogroup, the default of most distributions' kernels)
/// or by cgroup: it ranks a thread only inside its own group, and each container is a group of
/// its own. Raising the daemon's whole group would lift its masters too, and a master kept busy
/// by one container's excess (a rate-limited hog) would then take CPU from the others
/// (measured: TCP beside a limited UDP hog 7.6-7.9 Gbps against 11.7-13.5). So the control
/// thread alone runs in the real-time class at its lowest priority (`SCHED_FIFO` 1, with
/// `SCHED_RESET_ON_FORK`, so nothing it starts inherits it): it runs as soon as it has work,
/// ahead of every container and of the masters, as the kernel's own networking runs in softirq
/// context ahead of every task. Its work is bounded: what a container can make it do
/// (attachments, asks for channels, channels) is limited per pipe, and the kernel keeps 5% of
/// every second for other classes whatever a real-time thread does. Without the privilege (or in
/// a cgroup without real-time runtime) it falls back to nice [`CONTROL_NICE`].
pub const CONTROL_RT_PRIORITY: i32 = 1;

/// The control plane's nice value where the real-time class is refused.
pub const CONTROL_NICE: i32 = -10;

/// Puts the calling thread in the real-time class at [`CONTROL_RT_PRIORITY`], reset on fork;
/// falls back to nice [`CONTROL_NICE`].
pub(crate) fn raise_control_plane() {
    let param = libc::sched_param {
        sched_priority: CONTROL_RT_PRIORITY,
    };
    // SAFETY: plain syscall; pid 0 is the calling thread and `param` outlives the call.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc == 0 {
        return;
    }
    let e = std::io::Error::last_os_error();
    tracing::debug!("the control plane is not real-time ({e}); nice {CONTROL_NICE} instead");
    if let Err(e) = set_thread_nice(CONTROL_NICE) {
        tracing::debug!("the control plane keeps its nice value (not {CONTROL_NICE}): {e}");
    }
}

/// Sets the calling thread's nice value (Linux: `setpriority` on a thread id is per thread).
pub(crate) fn set_thread_nice(nice: i32) -> std::io::Result<()> {
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: plain syscall on integers; `tid` is this thread.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Puts the calling thread in the SCHED_IDLE class: it runs only when no other thread wants
/// its core, and any that wakes preempts it at once.
pub(crate) fn set_thread_sched_idle() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscall; pid 0 is the calling thread and `param` outlives the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// Daemon configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Run directory (pipes, state, lock). tmpfs recommended.
    pub run_dir: PathBuf,
    /// Control socket path.
    pub socket: PathBuf,
    /// Master threads (pipes are shared out among them by id). 1..=[`master::MAX_MASTERS`].
    pub masters: usize,
    /// Cores to pin the master threads to, master `k` on `master_cores[k % len]` (empty: not
    /// pinned).
    pub master_cores: Vec<usize>,
    /// Idle policy of the master thread.
    pub idle: IdlePolicy,
    /// Nice value of the master threads (-20..19; 0 leaves it as the daemon's).
    pub master_nice: i32,
    /// The program that runs the fd holder as `PROGRAM __holder --socket PATH` (the `docknet`
    /// binary); `None`: no holder, so nothing survives the daemon.
    pub holder: Option<PathBuf>,
    /// How long the fd holder keeps the pipes with no daemon connected (`None`: without limit);
    /// it also ends when the run directory is removed.
    pub holder_grace: Option<std::time::Duration>,
    /// Remove every pipe when stopping (SIGINT/SIGTERM), leaving nothing behind; otherwise the
    /// pipes stay (in the fd holder) for the next daemon to adopt.
    pub ephemeral: bool,
    /// A link to drive: frames for addresses no pipe owns leave through it, frames arriving on
    /// it for a pipe are delivered.
    pub nic: Option<nic::NicConfig>,
    /// Make a link to the node's own kernel of this name and drive it ([`nic::host`]); not
    /// with `nic`.
    pub host_link: Option<String>,
    /// The rate limiters' fine and coarse timers.
    pub rate_timers: rate::Timers,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (`None`: no metrics server).
    pub metrics: Option<std::net::SocketAddr>,
    /// Regions of the default pipe's size kept ready ([`pool`]); 0: each create makes its own.
    pub spare_regions: usize,
    /// Join pipes that talk by fast channels of the daemon's own ([`autofc`]).
    pub auto_channels: bool,
}

/// Binds the control socket at `path` with mode 0600 from the start: bound inside a private
/// (0700) directory beside it, then renamed into place, so no other user ever finds it open.
fn bind_private(path: &std::path::Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    let parent = path.parent().unwrap_or(std::path::Path::new("."));
    let tmp_dir = parent.join(format!(".docknet-sock-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp_dir);
    fs::DirBuilder::new().mode(0o700).create(&tmp_dir)?;
    let tmp = tmp_dir.join("s");
    let r = (|| {
        let l = std::os::unix::net::UnixListener::bind(&tmp)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))?;
        fs::rename(&tmp, path)?;
        Ok(l)
    })();
    let _ = fs::remove_dir_all(&tmp_dir);
    r
}

/// Runs the daemon until SIGINT or SIGTERM. Unless `ephemeral`, pipes stay (in the fd holder)
/// for the next start to adopt.
pub fn run(cfg: Config) -> Result<(), Error> {
    fs::create_dir_all(&cfg.run_dir).map_err(io(format!("creating {}", cfg.run_dir.display())))?;
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(cfg.run_dir.join("lock"))
        .map_err(io("opening the lock file"))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock)
        .map_err(|_| Error::Locked(cfg.run_dir.display().to_string()))?;

    // this thread becomes the control plane (what it starts from now on, the fd holder and the
    // masters included, begins in the ordinary class; the holder raises itself)
    raise_control_plane();
    let holder: Option<Box<dyn holder::Keeper>> = match &cfg.holder {
        Some(exe) => Some(Box::new(
            holder::Holder::connect_or_start(&cfg.run_dir, exe, cfg.holder_grace)
                .map_err(io("starting the fd holder"))?,
        )),
        None => None,
    };
    // the link first: a daemon asked to drive one that it cannot starts not at all
    let host_link = match (&cfg.host_link, &cfg.nic) {
        (Some(_), Some(_)) => {
            return Err(Error::Config(
                "a daemon drives one link: --host-link or --nic, not both".into(),
            ))
        }
        (Some(name), None) => Some(nic::host::HostLink::create(name)?),
        (None, _) => None,
    };
    let nic_cfg = match &host_link {
        // a veth: AF_PACKET, whose segment offload moves the node's 64 KiB segments whole
        Some(h) => Some(nic::NicConfig {
            iface: h.daemon_end.clone(),
            mode: nic::NicMode::Packet,
            queues: None,
        }),
        None => cfg.nic.clone(),
    };
    let edge = match &nic_cfg {
        Some(n) => {
            let (link, port) = nic::open(n)?;
            let mut e = nic::Edge::new(link, port);
            // the node routes what is not a pipe's (egress, other nodes)
            e.set_default_via(host_link.as_ref().map(|_| nic::host::GATEWAY));
            Some(e)
        }
        None => None,
    };
    // a --nic link taken through a packet socket: the host's kernel must not take the pipes'
    // frames in too (nic::guard); the host link has its own
    let link_guard = match &edge {
        Some(e) if host_link.is_none() && e.shared.port.mode == "packet" => {
            match nic::guard::Guard::pipes(&e.shared.link.name) {
                Ok(g) => Some(g),
                Err(e) => {
                    tracing::warn!(
                        "no guard on the link ({e}): with forwarding on, this host's kernel \
                         routes its own copy of every frame for a pipe on"
                    );
                    None
                }
            }
        }
        _ => None,
    };
    let (mut registry, warnings) =
        registry::Registry::open(&cfg.run_dir, holder).map_err(io("opening the run directory"))?;
    registry.set_gateway(edge.as_ref().map(|e| e.mac()));
    registry.set_host_link(host_link.is_some());
    if host_link.is_some() && !registry.routes().is_empty() {
        tracing::warn!(
            routes = registry.routes().len(),
            "routes kept from an earlier daemon are not used over a host link: the host's own \
             routes carry what leaves the pipes (docknet route rm them)"
        );
    }
    registry.set_link_addr(edge.as_ref().and_then(|e| e.link_addr()));
    if edge.as_ref().is_some_and(|e| e.link_addr().is_none()) {
        for r in registry.routes().iter().filter(|r| r.vxlan.is_some()) {
            tracing::warn!(
                route = %r,
                "the link has no IPv4 address for this tunnel's datagrams to leave from: its \
                 frames are dropped (counted drop_malformed) until the link has one and the \
                 daemon restarts"
            );
        }
    }
    registry.set_timers(cfg.rate_timers);
    registry.set_auto_channels(cfg.auto_channels);
    registry.set_pool(pool::Pool::start(
        registry::default_region_size(),
        cfg.spare_regions,
    ));
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let adopted = registry.pipes().count();
    let masters = cfg.masters.clamp(1, master::MAX_MASTERS);
    if masters > 1 && edge.is_some() {
        return Err(Error::Config(
            "a daemon that drives a link runs one master thread (--masters 1)".into(),
        ));
    }
    let shared = Arc::new(master::MasterShared::with_masters(
        registry.snapshot(),
        masters,
    ));
    shared
        .auto_channels
        .store(cfg.auto_channels, Ordering::Relaxed);
    if let Some(e) = &edge {
        let _ = shared.edge.set(e.shared.clone());
        tracing::info!(
            link = %e.shared.link.name,
            mode = e.shared.port.mode,
            queues = e.shared.port.queues,
            attach = %e.shared.port.attach,
            "driving the link"
        );
    }

    if cfg.socket.exists() {
        if std::os::unix::net::UnixStream::connect(&cfg.socket).is_ok() {
            return Err(Error::SocketInUse(cfg.socket.display().to_string()));
        }
        fs::remove_file(&cfg.socket).map_err(io("removing the stale socket"))?;
    }
    if let Some(parent) = cfg.socket.parent() {
        fs::create_dir_all(parent).map_err(io("creating the socket directory"))?;
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("starting the control runtime"))?;
    let listener = {
        let _g = rt.enter();
        let l = bind_private(&cfg.socket)
            .and_then(|l| {
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .map_err(io(format!("binding {}", cfg.socket.display())))?;
        tokio::net::UnixListener::from_std(l)
            .map_err(io(format!("binding {}", cfg.socket.display())))?
    };

    let metrics_listener = match cfg.metrics {
        Some(addr) => {
            let _g = rt.enter();
            let l = std::net::TcpListener::bind(addr)
                .and_then(|l| {
                    l.set_nonblocking(true)?;
                    Ok(l)
                })
                .map_err(io(format!("binding the metrics address {addr}")))?;
            Some(
                tokio::net::TcpListener::from_std(l)
                    .map_err(io(format!("binding the metrics address {addr}")))?,
            )
        }
        None => None,
    };

    let mut edge = edge;
    let mut master_threads = Vec::with_capacity(masters);
    for k in 0..masters {
        let m = shared.clone();
        let policy = cfg.idle;
        let core =
            (!cfg.master_cores.is_empty()).then(|| cfg.master_cores[k % cfg.master_cores.len()]);
        let nice = cfg.master_nice;
        let edge = if k == 0 { edge.take() } else { None };
        let t = std::thread::Builder::new()
            .name(if masters == 1 {
                "docknet-master".into()
            } else {
                format!("docknet-master{k}")
            })
            .spawn(move || {
                if let Some(c) = core {
                    let mut set = nix::sched::CpuSet::new();
                    if set.set(c).is_ok() {
                        if let Err(e) =
                            nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
                        {
                            tracing::warn!("cannot pin master {k} to core {c}: {e}");
                        }
                    }
                }
                // (always: a thread starts at the control plane's nice value where the
                // real-time class was refused)
                if let Err(e) = set_thread_nice(nice) {
                    tracing::warn!("cannot set master {k}'s nice value to {nice}: {e}");
                }
                master::run_shard(m, k, policy, edge)
            })
            .map_err(io("starting a master thread"))?;
        master_threads.push(t);
    }

    let ctx = Arc::new(control::Ctx {
        registry: Mutex::new(registry),
        master: shared.clone(),
        info: proto::Status {
            protocol: proto::PROTOCOL_VERSION,
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            run_dir: cfg.run_dir.display().to_string(),
            socket: cfg.socket.display().to_string(),
            idle: cfg.idle.to_string(),
            master_core: cfg.master_cores.first().copied(),
            masters,
            master_cores: cfg.master_cores.clone(),
            master_nice: cfg.master_nice,
            fast_channels: if cfg.auto_channels { "auto" } else { "manual" }.into(),
            // the totals are filled in per request
            ..Default::default()
        },
        attach: std::sync::OnceLock::new(),
        ops: metrics::OpStats::default(),
        captures: Mutex::new(Vec::new()),
        host_link: Mutex::new(host_link),
        link_guard: Mutex::new(link_guard),
    });
    if let Ok(reg) = ctx.registry.lock() {
        // the pipes adopted from a previous daemon
        ctx.follow_pipes(&reg);
    }
    let waker = attach::start(ctx.clone()).map_err(io("starting the accept thread"))?;
    let _ = ctx.attach.set(waker);
    tracing::info!(
        socket = %cfg.socket.display(),
        run_dir = %cfg.run_dir.display(),
        idle = %cfg.idle,
        adopted,
        "docknet daemon ready"
    );
    // Tell a supervisor (or a test) we are ready: one line on stdout.
    println!("ready {}", cfg.socket.display());

    rt.block_on(async {
        let stop = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
            }
        };
        // Every 200 ms: the counters into each region's header, and a heartbeat that tells
        // containers the daemon is alive.
        let mirror_ctx = ctx.clone();
        let mirror = tokio::spawn(async move {
            let mut iv = tokio::time::interval(Duration::from_millis(200));
            loop {
                iv.tick().await;
                if let Ok(reg) = mirror_ctx.registry.lock() {
                    let now_ms = docknet_pipe::wake::monotonic_ns() / 1_000_000;
                    for p in reg.pipes() {
                        layout::set_heartbeat(&p.region, now_ms);
                        for (i, v) in p.counters.load_all().iter().enumerate() {
                            layout::mirror_counter(&p.region, i, *v);
                        }
                    }
                }
            }
        });
        let metrics = metrics_listener.map(|l| {
            if let Ok(a) = l.local_addr() {
                tracing::info!(addr = %a, "serving metrics at http://{a}/metrics");
            }
            tokio::spawn(metrics::serve(ctx.clone(), l))
        });
        let auto = tokio::spawn(autofc::serve(ctx.clone()));
        control::serve(ctx.clone(), listener, stop).await;
        auto.abort();
        mirror.abort();
        if let Some(m) = metrics {
            m.abort();
        }
    });
    tracing::info!("shutting down");
    shared.shutdown.store(true, Ordering::Release);
    shared.poke();
    for t in master_threads {
        let _ = t.join();
    }
    if let Ok(mut reg) = ctx.registry.lock() {
        if cfg.ephemeral {
            reg.remove_all();
        }
        // the spare regions' thread ends and lets go of them
        reg.set_pool(None);
    }
    // the host link goes, and the node's routes through it with it; the link's guard too
    if let Ok(mut h) = ctx.host_link.lock() {
        drop(h.take());
    }
    if let Ok(mut g) = ctx.link_guard.lock() {
        drop(g.take());
    }
    let _ = fs::remove_file(&cfg.socket);
    Ok(())
}
