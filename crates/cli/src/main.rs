//! `docknet`: DockNet's command line — the daemon, its clients, containers and benchmarks.

#![deny(unsafe_code)]

mod container;
mod ctl;
mod ops;
mod sandbox;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use docknet_daemon::proto::DEFAULT_SOCKET;
use docknet_lab::bench::BenchArgs;
use docknet_lab::report::ReportArgs;
use docknet_lab::workload::raw::RawArgs;
use docknet_lab::Workload;
use docknet_perf::raw::PeerArgs;
use docknet_pipe::IdlePolicy;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const EXAMPLES: &str =
    "Start a daemon, create a pipe per container, run each container attached to its pipe:

  docknet daemon --run-dir /run/docknet --socket /run/docknet/docknetd.sock &
  docknet pipe create web --ip 10.0.0.2/24 --ip6 fd00:dc::2/64
  docknet pipe create db  --ip 10.0.0.3/24 --ip6 fd00:dc::3/64
  docknet fc connect web db            # optional: partners bypass the daemon
  docknet run --pipe web -- ./server

Measure DockNet against the kernel's container networks (root; the lab builds and removes its
own namespaces):

  docknet bench rr --modes bridge,docknet,docknet-fc --report out
  docknet report out/tcp-rr.json --out report";

/// Userspace networking for containers: shared-memory pipes switched by a host daemon, and
/// fast channels between partner containers.
#[derive(Debug, Parser)]
#[command(
    name = "docknet",
    version,
    propagate_version = true,
    after_help = EXAMPLES
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

/// The options every subcommand takes.
#[derive(Debug, clap::Args)]
struct Global {
    /// Control socket of the daemon.
    #[arg(long, global = true, env = "DOCKNET_SOCKET", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Log filter for the daemon (e.g. info, debug); also RUST_LOG.
    #[arg(long, global = true, default_value = "info")]
    log: String,
}

/// `docknet run` alone. Building the whole command tree (every subcommand's options, the global
/// ones propagated into each) takes about 0.5 ms, a tenth of a container's start; a command
/// line this parser accepts is one the full parser reads the same way (its only subcommand is
/// `run`, with the same options), and anything else, help and errors included, goes to the
/// full parser.
#[derive(Debug, Parser)]
#[command(name = "docknet")]
struct RunCli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: RunOnly,
}

#[derive(Debug, Subcommand)]
enum RunOnly {
    Run(container::RunArgs),
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the daemon (DockDaemon) in the foreground until SIGINT/SIGTERM.
    Daemon {
        /// The daemon's own directory: state, lock, the fd holder's socket (never shown to a
        /// container).
        #[arg(long, default_value = "/run/docknet")]
        run_dir: PathBuf,
        /// Core to pin the master (forwarding) thread to (one master).
        #[arg(long, conflicts_with_all = ["master_cores", "masters"])]
        master_core: Option<usize>,
        /// One master thread per core in this list (e.g. 0,1), each pinned to its core; pipes
        /// are shared out among the masters by id, and frames between pipes of different
        /// masters pass through lock-free queues.
        #[arg(long, value_delimiter = ',', conflicts_with = "masters")]
        master_cores: Vec<usize>,
        /// Master threads, not pinned. Default 1: on this project's 2-core test machine one
        /// master beside the containers measured best (docs/benchmarks.md, "Density"); a
        /// daemon driving a link (--nic) runs one.
        #[arg(long, env = "DOCKNET_MASTERS", value_parser = clap::value_parser!(u16).range(1..=64))]
        masters: Option<u16>,
        /// Nice value of the master threads, -20 (most CPU when contended) to 19. The master
        /// moves every container's frames; at the containers' weight it gets 1/N of a core
        /// when N containers are busy, so many busy containers want it lower (-10 measured
        /// well for 128 pairs on 2 cores). While it spins or yields at a higher priority, a
        /// container on its core waits, so the default is the containers' own. Where the
        /// kernel groups tasks by session or cgroup this ranks the masters inside the daemon's
        /// own group only (the control plane runs in the real-time class instead; docs/design.md,
        /// "The daemon's priority").
        #[arg(long, env = "DOCKNET_MASTER_NICE", default_value_t = docknet_daemon::MASTER_NICE, allow_negative_numbers = true,
              value_parser = clap::value_parser!(i32).range(-20..=19))]
        master_nice: i32,
        /// What the master thread does when idle: adaptive (yield the core for up to 1 ms,
        /// fewer yields when others want the core, then sleep on a futex: no CPU when idle),
        /// adaptive:SPIN_US or adaptive:SPIN_US:YIELD_US (spin first), spin (lowest latency with a core of its
        /// own, one core busy), block.
        #[arg(long, default_value = "adaptive", value_parser = IdlePolicy::parse)]
        idle: IdlePolicy,
        /// Remove every pipe when stopping (SIGINT/SIGTERM). Without it, pipes stay with the
        /// daemon's fd holder for the next daemon on this run directory to adopt.
        #[arg(long)]
        ephemeral: bool,
        /// How long the fd holder keeps the pipes once this daemon has stopped, for the next
        /// daemon on this run directory to adopt: seconds, 90s, 10m, 2h, or forever. It gives
        /// them up sooner when the run directory is removed. `docknet status` shows what is
        /// held while no daemon runs.
        #[arg(long, default_value = "5m", value_parser = docknet_daemon::holder::parse_grace, conflicts_with = "ephemeral")]
        holder_grace: docknet_daemon::holder::Grace,
        /// Drive this link (in the daemon's network namespace) as the pipes' way to the wire:
        /// frames for addresses no pipe owns leave through it, and frames arriving on it for a
        /// pipe's address are delivered (the daemon answers ARP for the pipes and resolves
        /// neighbours itself). The rest of the link's traffic stays the host's.
        #[arg(long, value_name = "IFACE")]
        nic: Option<String>,
        /// How to drive --nic: auto (AF_XDP where the driver has zero-copy, else AF_PACKET),
        /// xdp (AF_XDP sockets behind an XDP flow director; frames up to the link's MTU, in
        /// several 4 KiB buffers above about 3.8 KiB (jumbo frames: multi-buffer XDP, Linux 6.6),
        /// each copied on links without zero-copy, veth among them) or packet (AF_PACKET, any link and
        /// MTU, with segment offload: TCP segments of up to 64 KiB leave whole for the kernel or
        /// the NIC to cut, and coalesced ones arrive whole). `docknet status` shows which runs.
        #[arg(long, default_value = "auto", requires = "nic")]
        nic_mode: docknet_daemon::nic::NicMode,
        /// AF_XDP sockets to bind, for queues 0..N [default: every receive queue of the link].
        #[arg(long, value_name = "N", requires = "nic", value_parser = clap::value_parser!(u32).range(1..=64))]
        nic_queues: Option<u32>,
        /// Make a link to this host's own kernel and drive it instead of --nic: a veth pair,
        /// NAME on the host's side with 169.254.1.1/32 and a /32 route to every pipe, NAME-d on
        /// the daemon's. The host then reaches the pipes (kubelet's probes, NodePort rules,
        /// port-forward) and the pipes reach whatever the host routes to (other nodes, and
        /// addresses beyond with the host's own NAT), their gateway being the host's end. For
        /// pods whose only network is DockNet. Removed when the daemon stops (docs/kubernetes.md,
        /// "The node and beyond").
        #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "docknet0", conflicts_with = "nic")]
        host_link: Option<String>,
        /// Rate limits: the fine timer, which adds a quantum of tokens each interval (10us to
        /// 10ms).
        #[arg(long, default_value = "100us", value_parser = parse_interval)]
        rate_fine: Duration,
        /// Rate limits: the coarse timer, which every interval cuts credit above one burst
        /// so a silent container cannot hoard it; also the default burst (one interval at the
        /// rate). 1ms to 1s, at least the fine timer.
        #[arg(long, default_value = "10ms", value_parser = parse_interval)]
        rate_coarse: Duration,
        /// Serve Prometheus metrics at http://ADDR:PORT/metrics (a bare PORT binds to
        /// 127.0.0.1): per pipe packets, bytes and drops by reason, fast channels, the master
        /// threads' busy, idle and sleeping time, the link's counters, control requests.
        #[arg(long, value_name = "ADDR:PORT", value_parser = docknet_daemon::metrics::parse_addr)]
        metrics: Option<std::net::SocketAddr>,
        /// Regions of a pipe at the default MTU and ring depth (3 MB each; also a fast channel
        /// built at MTU 1500) to keep made ahead: every page of a region is allocated when it
        /// is made, most of a create's time, so a low-priority thread makes the next while a
        /// new container starts. 4 covers two pods with a fast channel starting at once.
        /// 0: each create makes its own
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(0..=64))]
        spare_regions: u16,
        /// auto: when two pipes of this daemon exchange a run of frames, join them by a fast
        /// channel so their frames stop passing through the daemon (one hand-off per message
        /// instead of two); it goes again after 30 s without traffic. Not for a pipe with a rate
        /// limit or under capture (either removes its automatic channels), nor beyond 8 per
        /// pipe and 512 MiB of regions in all. manual: only the channels `fc connect` builds
        #[arg(long, env = "DOCKNET_FAST_CHANNELS", default_value = "auto", value_parser = ["auto", "manual"])]
        fast_channels: String,
    },
    /// Mirror a pipe's frames into a pcap file (tcpdump -r and Wireshark read it).
    Capture(ops::CaptureArgs),
    /// Pipes by traffic, drops and limits, and the master threads' load, live.
    Top(ops::TopArgs),
    /// Show the daemon's status. With no daemon answering, says whether a stopped daemon's fd
    /// holder still keeps its pipes for the next daemon (and for how long), and exits 1.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The daemon's run directory, where a stopped daemon's holder is looked for [default:
        /// the directory of --socket].
        #[arg(long)]
        run_dir: Option<PathBuf>,
    },
    /// Create, remove, list and inspect pipes.
    #[command(subcommand)]
    Pipe(PipeCmd),
    /// Build and remove fast channels between partner pipes.
    #[command(subcommand)]
    Fc(FcCmd),
    /// Limit what a pipe sends (egress) and what is delivered to it (ingress): token buckets
    /// in the daemon, rates in bits/s and bursts in bits as Kubernetes writes them. Frames over
    /// the limit wait (in the pipe's tx ring, or in the daemon's queue in front of its rx
    /// ring); fast channels are not limited (the daemon is not on their path).
    #[command(subcommand)]
    Rate(RateCmd),
    /// Reach networks beyond the link through next hops on it (another node's address), as
    /// flannel's host-gw does: a frame from a pipe to an address no pipe owns goes to the
    /// longest matching route's next hop, or, without one, to its destination itself (one flat
    /// subnet). Needs a daemon driving a link (--nic). Kept across daemon restarts.
    #[command(subcommand)]
    Route(RouteCmd),
    /// Services: a virtual address and port balanced over backends, as a Kubernetes ClusterIP
    /// Service is. The daemon hands every container the table of services; DockLib (and the
    /// preload library) connects to a backend in place of the service's address, so a service
    /// call costs no address translation on the frame path and takes a fast channel like any
    /// other. Kept across daemon restarts.
    #[command(subcommand)]
    Service(ServiceCmd),
    /// Run a command as a container attached to a pipe: new mount, network, PID, UTS and IPC
    /// namespaces, a read-only root of the host's system directories (or --rootfs), a private
    /// /dev, /proc and /tmp, a user of the container's own (--user) with at most 1024
    /// processes and threads (--pids-limit), no capabilities, no_new_privs and a seccomp
    /// filter. The pipe is handed out on @docknet/pipe inside the container ($DOCKNET_PIPE).
    Run(container::RunArgs),
    /// TCP side by side over network modes, measured by dnperf (needs root).
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Build the HTML/Markdown report with figures from `docknet bench` results.
    Report(ReportArgs),
    /// Raw-frame tools: the ring benchmark and its peers.
    #[command(subcommand)]
    Raw(RawCmd),
    /// Internal: the daemon's fd holder.
    #[command(name = "__holder", hide = true)]
    Holder {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long, default_value = "forever", value_parser = docknet_daemon::holder::parse_grace)]
        grace: docknet_daemon::holder::Grace,
    },
}

#[derive(Debug, Subcommand)]
enum PipeCmd {
    /// Create a pipe.
    Create {
        /// Name (1-128 of A-Z a-z 0-9 _ . -).
        name: String,
        /// Address and prefix, A.B.C.D/LEN.
        #[arg(long)]
        ip: String,
        /// IPv6 address and prefix, X::Y/LEN: a dual-stack pipe (its link-local address
        /// follows from its MAC).
        #[arg(long)]
        ip6: Option<String>,
        /// MTU (68-65535); frames up to MTU + 14 bytes.
        #[arg(long)]
        mtu: Option<u32>,
        /// Ring depth (power of two; default 1024 up to MTU 9000, else 256).
        #[arg(long)]
        ring_depth: Option<u32>,
        /// A label recorded with the pipe, KEY=VALUE (repeatable; at most 16).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a pipe (and its fast channels).
    Rm {
        /// Name.
        name: String,
    },
    /// List pipes.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Hand a pipe to the container whose network namespace is NETNS: the daemon binds an
    /// abstract Unix socket there (default @docknet/pipe) and gives the pipe to whoever in that
    /// namespace connects (`docknet run` does this itself).
    Attach {
        /// Name.
        name: String,
        /// The container's network namespace: /proc/PID/ns/net or /var/run/netns/NAME.
        #[arg(long)]
        netns: String,
        /// Abstract socket name (without @).
        #[arg(long)]
        socket_name: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Close a pipe's socket in its container.
    Detach {
        /// Name.
        name: String,
    },
    /// Show one pipe with its counters.
    Show {
        /// Name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum FcCmd {
    /// Connect two pipes with a fast channel.
    Connect {
        /// One partner.
        a: String,
        /// The other partner.
        b: String,
        /// MTU of the channel (default: the smaller of the two pipes' MTUs). TCP segments of up
        /// to 64 KiB pass whatever the MTU, as on the pipes
        #[arg(long)]
        mtu: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove the fast channel between two pipes.
    Rm {
        /// One partner.
        a: String,
        /// The other partner.
        b: String,
    },
}

#[derive(Debug, Subcommand)]
enum ServiceCmd {
    /// Add a service, or replace it (its backends, for example) when NAME exists: connections
    /// already made stay with their backends; new ones see the change within milliseconds.
    Set {
        /// The service's name (1-128 of A-Z a-z 0-9 _ . -).
        name: String,
        /// Its address and port, VIP:PORT (e.g. 10.96.0.10:80): an address no pipe has.
        address: String,
        /// A ready backend, IP:PORT (repeat for more). None: connects are refused, as for a
        /// Service without ready endpoints.
        #[arg(long = "backend", value_name = "IP:PORT")]
        backends: Vec<String>,
        /// A UDP service (datagrams and connected UDP sockets) instead of TCP.
        #[arg(long)]
        udp: bool,
        /// Keep each client address on one backend (Kubernetes' sessionAffinity: ClientIP).
        #[arg(long, value_enum, default_value = "none")]
        affinity: AffinityArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a service.
    Rm {
        /// Its name.
        name: String,
    },
    /// List the services.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `--affinity`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum AffinityArg {
    /// Each connection to any backend, at random.
    None,
    /// One client address, one backend.
    ClientIp,
}

#[derive(Debug, Subcommand)]
enum RouteCmd {
    /// Add a route: NET is reached through --via, on the link or through a VXLAN tunnel.
    Add {
        /// The network, A.B.C.D/LEN with no host bits set (0.0.0.0/0: the default route).
        net: String,
        /// The next hop: an address on the link (the daemon resolves it by ARP), not itself
        /// inside a routed network. With --vxlan: the tunnel's far end (another node's address,
        /// on the link or behind a plain route).
        #[arg(long)]
        via: String,
        /// Tunnel NET's frames to --via in VXLAN (UDP port 4789, the kernel's format) with this
        /// network identifier (0-16777215), for nodes that share no link. Datagrams leave from
        /// the link's IPv4 address; frames lose 50 bytes of MTU to the tunnel.
        #[arg(long, value_name = "VNI")]
        vxlan: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove the route to NET.
    Rm {
        /// The network, as added.
        net: String,
    },
    /// List the routes.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum RateCmd {
    /// Set a pipe's limits; a direction not given keeps its limit. Takes effect at once.
    Set {
        /// The pipe.
        name: String,
        /// What the container may send: bits/s with an optional unit (500mbit, 5gbit,
        /// 100kbit, 1000000).
        #[arg(long, value_parser = parse_rate)]
        egress: Option<u64>,
        /// What may be delivered to the container.
        #[arg(long, value_parser = parse_rate)]
        ingress: Option<u64>,
        /// Egress bucket size in bits (units as for rates) [default: 10 ms at the rate;
        /// clamped to between two frames and one second at the rate].
        #[arg(long, value_parser = parse_rate, requires = "egress")]
        egress_burst: Option<u64>,
        /// Ingress bucket size in bits.
        #[arg(long, value_parser = parse_rate, requires = "ingress")]
        ingress_burst: Option<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a pipe's limits.
    Clear {
        /// The pipe.
        name: String,
    },
    /// A pipe's limits and its limiters' state: credit, bytes through, waits, bytes queued.
    Show {
        /// The pipe.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_rate(s: &str) -> Result<u64, String> {
    docknet_daemon::rate::parse_bits(s).map_err(|e| e.to_string())
}

/// `100us`, `10ms`, `1s`.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: use a whole number and us, ms or s (100us)"))?;
    match unit {
        "us" => Ok(Duration::from_micros(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(format!("{s:?}: use a whole number and us, ms or s (100us)")),
    }
}

#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// Request/response latency (ping-pong of fixed-size messages).
    Rr(BenchArgs),
    /// Streaming goodput, counted at the receiver.
    Stream(BenchArgs),
    /// N = 1, 2, 4, ... concurrent pairs: aggregate goodput, per-pair latency, memory per pair.
    Pairs(BenchArgs),
    /// Rate limits side by side: one TCP flow while its limit steps down, then TCP beside a UDP
    /// hog with no limits, the UDP flow limited, and both limited; on the kernel's bridge with
    /// the CNI bandwidth plugin (TBF) and on DockNet's limiter (the paper's Fig. 9).
    Rate(docknet_lab::bench::RateArgs),
    /// HTTP under load side by side (the paper's Fig. 11): docknet-httpd under docknet-load on
    /// every mode, wrk and nginx beside them on the kernel's.
    Http(docknet_lab::bench::HttpArgs),
    /// The one-way latency the NAT load balancer (docknet-natlb) adds: rr through it against
    /// rr direct, alternated in one run.
    Nat(docknet_lab::workload::nat::NatArgs),
    /// What an idle host costs and how fast it wakes: a daemon and N containers each waiting
    /// in accept, their CPU time together (exact, from schedstat), then the one-way latency of
    /// messages sent after a second of idle.
    Idle(docknet_lab::workload::idle::IdleArgs),
    /// Network start-up time per mode (Suo et al.): from creating a container's network
    /// (namespaces and CNI ADD; DockNet: pipe create) until the container answers a TCP
    /// connect and a ping, p50/p99 over the repetitions.
    Startup(docknet_lab::workload::startup::StartupArgs),
    /// Round trips to a server under a cgroup CPU quota (the thesis's Table 3.2): mean, p50,
    /// p99 and the count above 1 ms per quota, on kernel modes and on DockNet with the
    /// server spinning or adaptive.
    Cpuquota(docknet_lab::workload::cpuquota::CpuquotaArgs),
    /// Kratzke's HTTP chain: load generator -> forwarder (ping) -> server (pong) on every mode,
    /// the transfer rate by message size and its ratio to the reference (loopback).
    Chain(docknet_lab::workload::chain::ChainArgs),
}

#[derive(Debug, Subcommand)]
enum RawCmd {
    /// Benchmark raw frames through a fast channel and through the daemon, beside kernel TCP
    /// over a Linux bridge, in one run (needs root; builds and removes its own namespaces).
    Bench(RawArgs),
    /// A raw-frame benchmark peer (runs inside a container started by `docknet run`).
    Peer(PeerArgs),
}

fn init_logging(filter: &str) {
    let f = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(f)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main_inner(cli: Cli) -> Result<ExitCode> {
    let sock = cli.global.socket.as_path();
    match cli.cmd {
        Cmd::Daemon {
            run_dir,
            master_core,
            master_cores,
            masters,
            master_nice,
            idle,
            ephemeral,
            holder_grace,
            nic,
            nic_mode,
            nic_queues,
            host_link,
            rate_fine,
            rate_coarse,
            metrics,
            spare_regions,
            fast_channels,
        } => {
            init_logging(&cli.global.log);
            if !(Duration::from_micros(10)..=Duration::from_millis(10)).contains(&rate_fine)
                || !(Duration::from_millis(1)..=Duration::from_secs(1)).contains(&rate_coarse)
                || rate_coarse < rate_fine
            {
                bail!("--rate-fine takes 10us to 10ms, --rate-coarse 1ms to 1s and at least --rate-fine");
            }
            docknet_daemon::run(docknet_daemon::Config {
                run_dir,
                socket: cli.global.socket.clone(),
                masters: if master_cores.is_empty() {
                    masters.map_or(1, usize::from)
                } else {
                    master_cores.len()
                },
                master_cores: if master_cores.is_empty() {
                    master_core.into_iter().collect()
                } else {
                    master_cores
                },
                master_nice,
                idle,
                holder: Some(std::env::current_exe().context("locating the docknet binary")?),
                holder_grace: holder_grace.0,
                ephemeral,
                nic: nic.map(|iface| docknet_daemon::nic::NicConfig {
                    iface,
                    mode: nic_mode,
                    queues: nic_queues,
                }),
                host_link,
                rate_timers: docknet_daemon::rate::Timers {
                    fine: rate_fine,
                    coarse: rate_coarse,
                },
                metrics,
                spare_regions: usize::from(spare_regions),
                auto_channels: fast_channels == "auto",
            })
            .context("docknet daemon")?;
        }
        Cmd::Capture(a) => ops::capture(sock, a)?,
        Cmd::Top(a) => ops::top(sock, a)?,
        Cmd::Status { json, run_dir } => return ctl::status(sock, run_dir.as_deref(), json),
        Cmd::Pipe(PipeCmd::Create {
            name,
            ip,
            ip6,
            mtu,
            ring_depth,
            labels,
            json,
        }) => {
            let p = ctl::client(sock)?.pipe_create_dual(
                &name,
                &ip,
                ip6.as_deref(),
                mtu,
                ring_depth,
                labels.into_iter().collect(),
            )?;
            ctl::print(&p, json, ctl::print_created)?;
        }
        Cmd::Pipe(PipeCmd::Rm { name }) => {
            ctl::client(sock)?.pipe_rm(&name)?;
            println!("removed pipe {name}");
        }
        Cmd::Pipe(PipeCmd::Ls { json }) => {
            ctl::print(&ctl::client(sock)?.pipe_ls()?, json, ctl::print_pipes)?
        }
        Cmd::Pipe(PipeCmd::Show { name, json }) => {
            ctl::print(&ctl::client(sock)?.pipe_show(&name)?, json, ctl::print_pipe)?
        }
        Cmd::Pipe(PipeCmd::Attach {
            name,
            netns,
            socket_name,
            json,
        }) => {
            let r = ctl::client(sock)?.pipe_attach(&name, &netns, socket_name.as_deref())?;
            ctl::print(&r, json, |r| {
                println!("pipe {} handed out at {} in {netns}", r.pipe, r.socket)
            })?;
        }
        Cmd::Pipe(PipeCmd::Detach { name }) => {
            ctl::client(sock)?.pipe_detach(&name)?;
            println!("detached pipe {name}");
        }
        Cmd::Fc(FcCmd::Connect { a, b, mtu, json }) => {
            let f = ctl::client(sock)?.fc_connect(&a, &b, mtu)?;
            ctl::print(&f, json, ctl::print_fc)?;
        }
        Cmd::Fc(FcCmd::Rm { a, b }) => {
            ctl::client(sock)?.fc_rm(&a, &b)?;
            println!("removed fast channel {a} <-> {b}");
        }
        Cmd::Rate(RateCmd::Set {
            name,
            egress,
            ingress,
            egress_burst,
            ingress_burst,
            json,
        }) => {
            if egress.is_none() && ingress.is_none() {
                bail!("give --egress RATE or --ingress RATE (or use `docknet rate clear {name}`)");
            }
            let c = docknet_daemon::proto::RateChange {
                egress_bps: egress,
                ingress_bps: ingress,
                egress_burst_bits: egress_burst,
                ingress_burst_bits: ingress_burst,
            };
            ctl::print(
                &ctl::client(sock)?.rate_set(&name, &c)?,
                json,
                ctl::print_rate,
            )?;
        }
        Cmd::Rate(RateCmd::Clear { name }) => {
            ctl::client(sock)?.rate_clear(&name)?;
            println!("cleared the rate limits of {name}");
        }
        Cmd::Rate(RateCmd::Show { name, json }) => {
            ctl::print(&ctl::client(sock)?.rate_show(&name)?, json, ctl::print_rate)?
        }
        Cmd::Route(RouteCmd::Add {
            net,
            via,
            vxlan,
            json,
        }) => {
            let r = ctl::client(sock)?.route_add(&net, &via, vxlan)?;
            ctl::print(&r, json, |r| match r.vxlan {
                Some(vni) => println!("route {} via {} vxlan {vni} added", r.net, r.via),
                None => println!("route {} via {} added", r.net, r.via),
            })?;
        }
        Cmd::Route(RouteCmd::Rm { net }) => {
            let r = ctl::client(sock)?.route_rm(&net)?;
            println!("route {} via {} removed", r.net, r.via);
        }
        Cmd::Route(RouteCmd::Ls { json }) => {
            ctl::print(&ctl::client(sock)?.route_ls()?, json, ctl::print_routes)?
        }
        Cmd::Service(ServiceCmd::Set {
            name,
            address,
            backends,
            udp,
            affinity,
            json,
        }) => {
            use docknet_daemon::proto::{ServiceAffinity, ServiceInfo, ServiceProto};
            let s = ctl::client(sock)?.service_set(&ServiceInfo {
                name,
                address,
                proto: if udp {
                    ServiceProto::Udp
                } else {
                    ServiceProto::Tcp
                },
                backends,
                affinity: match affinity {
                    AffinityArg::None => ServiceAffinity::None,
                    AffinityArg::ClientIp => ServiceAffinity::ClientIp,
                },
            })?;
            ctl::print(&s, json, |s| {
                println!(
                    "service {} {} {} set, {} backends",
                    s.name,
                    ctl::service_proto(s.proto),
                    s.address,
                    s.backends.len()
                )
            })?;
        }
        Cmd::Service(ServiceCmd::Rm { name }) => {
            let s = ctl::client(sock)?.service_rm(&name)?;
            println!("service {} ({}) removed", s.name, s.address);
        }
        Cmd::Service(ServiceCmd::Ls { json }) => {
            ctl::print(&ctl::client(sock)?.service_ls()?, json, ctl::print_services)?
        }
        Cmd::Run(a) => return container::run(sock, &a),
        Cmd::Holder { socket, grace } => docknet_daemon::holder::serve(&socket, grace.0)
            .with_context(|| format!("fd holder on {}", socket.display()))?,
        Cmd::Bench(BenchCmd::Rr(a)) => docknet_lab::bench::run(Workload::Rr, a)?,
        Cmd::Bench(BenchCmd::Stream(a)) => docknet_lab::bench::run(Workload::Stream, a)?,
        Cmd::Bench(BenchCmd::Pairs(a)) => docknet_lab::bench::run(Workload::Pairs, a)?,
        Cmd::Bench(BenchCmd::Rate(a)) => docknet_lab::bench::run_rate(a)?,
        Cmd::Bench(BenchCmd::Http(a)) => docknet_lab::bench::run_http(a)?,
        Cmd::Bench(BenchCmd::Nat(a)) => docknet_lab::bench::run_nat(a)?,
        Cmd::Bench(BenchCmd::Startup(a)) => docknet_lab::bench::run_startup(a)?,
        Cmd::Bench(BenchCmd::Cpuquota(a)) => docknet_lab::bench::run_cpuquota(a)?,
        Cmd::Bench(BenchCmd::Chain(a)) => docknet_lab::bench::run_chain(a)?,
        Cmd::Bench(BenchCmd::Idle(a)) => {
            if !nix::unistd::geteuid().is_root() {
                anyhow::bail!("docknet bench idle needs root (it builds containers)");
            }
            docknet_lab::workload::idle::run(a)?
        }
        Cmd::Report(a) => {
            let index = docknet_lab::report::run(&a)?;
            println!("wrote {}", index.display());
        }
        Cmd::Raw(RawCmd::Bench(a)) => docknet_lab::bench::run_raw(a)?,
        Cmd::Raw(RawCmd::Peer(a)) => docknet_perf::raw::raw_peer(&a)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// A usage error as one line: clap's message without its usage block and hint.
fn usage_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let lines: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    format!("docknet: {} (see --help)", lines.join(" "))
}

/// The command line: `docknet run` by the small parser when it reads it (see [`RunCli`]),
/// anything else by the full one.
fn parse(args: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
    if args.iter().any(|a| a == "run") {
        if let Ok(RunCli {
            global,
            cmd: RunOnly::Run(a),
        }) = RunCli::try_parse_from(&args)
        {
            return Ok(Cli {
                global,
                cmd: Cmd::Run(a),
            });
        }
    }
    Cli::try_parse_from(args)
}

fn main() -> ExitCode {
    let cli = match parse(std::env::args_os().collect()) {
        Ok(c) => c,
        Err(e) if e.use_stderr() => {
            eprintln!("{}", usage_line(&e));
            return ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    match main_inner(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("docknet: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `KEY=VALUE` of `pipe create --label`.
fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<std::ffi::OsString> {
        line.split(' ').map(Into::into).collect()
    }

    #[test]
    fn the_small_parser_reads_run_as_the_full_one_does() {
        let read = [
            "docknet run --pipe a -- /bin/true",
            "docknet --socket /s run --pipe a --cpu 1 -- sh -c run",
            "docknet run --pipe a --bind /opt --bind /srv --preload --rootfs /r -- x --pipe b",
            "docknet --log debug run --socket /t --pipe a --socket-name s -- x y",
            "docknet run --pipe a --user 4242:4243 --pids-limit 64 -- x",
        ];
        // no --user: the container's own, chosen when it starts; no --pids-limit: the run
        // chooses (1024 for the container's own user, none for a user given)
        let Ok(Cmd::Run(r)) = parse(args(read[0])).map(|c| c.cmd) else {
            panic!("run");
        };
        assert_eq!((r.user, r.pids_limit), (None, None));
        for line in read {
            // the small parser reads it, so `parse` answers with what it read
            assert!(RunCli::try_parse_from(args(line)).is_ok(), "{line}");
            let full = Cli::try_parse_from(args(line)).expect(line);
            assert_eq!(
                format!("{:?}", parse(args(line)).unwrap()),
                format!("{full:?}"),
                "{line}"
            );
        }
        // help, version, errors and other commands are the full parser's
        for line in [
            "docknet run --help",
            "docknet run -V",
            "docknet run",
            "docknet run --pipe a --bogus -- x",
            "docknet pipe create run --ip 10.0.0.1/24",
        ] {
            assert!(RunCli::try_parse_from(args(line)).is_err(), "{line}");
            let full = Cli::try_parse_from(args(line)).map(|c| format!("{c:?}"));
            let ours = parse(args(line)).map(|c| format!("{c:?}"));
            match (full, ours) {
                (Ok(f), Ok(o)) => assert_eq!(f, o, "{line}"),
                (Err(f), Err(o)) => assert_eq!(f.render().to_string(), o.render().to_string()),
                (f, o) => panic!("{line}: {f:?} against {o:?}"),
            }
        }
    }
}
