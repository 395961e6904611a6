//! What a `docknet bench` run will do, decided before anything is built: for every mode, the
//! MTUs it runs at, the topology it needs, and its points in order (placement, size, repeat).
//! Pure data, no I/O: the workload runners execute a plan; the tests check one without root.

use crate::mode::{Mode, Topology, LO_MTU};
use crate::row::{Tool, Workload};

/// Where the parties of one measurement run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Client's core (`None`: unpinned).
    pub client: Option<usize>,
    /// Server's core.
    pub server: Option<usize>,
    /// The daemon's master core, when the daemon is on the path and pinned (host A's on two
    /// hosts).
    pub master: Option<usize>,
    /// Two hosts: host B's daemon's master core.
    pub master_b: Option<usize>,
    /// The peers' idle policy (DockNet peers; kernel peers always block in the kernel); empty:
    /// none given, the programs' default.
    pub idle: &'static str,
    /// Pairs: the cores every pair's containers are pinned to, pair `i` on
    /// `pairs_cores[i % len]` (empty: unpinned).
    pub pairs_cores: Vec<usize>,
    /// In words, for results and reports.
    pub description: String,
}

impl Placement {
    /// Short form: `c1 s1`, `c1 s1 m0`, `c0 s1 m0 m1` (two daemons), or `-` when nothing is
    /// pinned.
    pub fn cores(&self) -> String {
        if !self.pairs_cores.is_empty() {
            let on: Vec<String> = self.pairs_cores.iter().map(|c| c.to_string()).collect();
            let m = self.master.map_or(String::new(), |m| format!(" m{m}"));
            return format!("p{}{m}", on.join("+"));
        }
        match (self.client, self.server) {
            (Some(c), Some(s)) => match (self.master, self.master_b) {
                (Some(m), Some(n)) => format!("c{c} s{s} m{m} m{n}"),
                (Some(m), None) => format!("c{c} s{s} m{m}"),
                _ => format!("c{c} s{s}"),
            },
            _ => "-".into(),
        }
    }

    /// Pairs: the core of pair `i`'s containers (`None`: unpinned).
    pub fn pair_core(&self, i: usize) -> Option<usize> {
        (!self.pairs_cores.is_empty()).then(|| self.pairs_cores[i % self.pairs_cores.len()])
    }
}

/// The kernel placements: client and server on one core, and on two cores.
pub const KERNEL_PLACEMENTS: [(usize, usize); 2] = [(1, 1), (0, 1)];

/// How the parties of an rr or stream run are placed (`--placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementKind {
    /// Hand-placed and pinned, with chosen idle policies (the paper's setting): kernel modes on
    /// one core and on two; DockNet's peers and daemon master as docs/lab.md says.
    Pinned,
    /// What a user gets: no affinity for any process of any mode, every DockNet program
    /// (peers, daemon) at its defaults. Rows carry `"placement": "unpinned"`.
    Unpinned,
    /// A pod with one CPU: client and server confined to core 1, every DockNet program at its
    /// defaults, the daemon not pinned; kernel modes on core 1 (`c1 s1`). Rows carry
    /// `"placement": "one core, defaults"`.
    OneCore,
}

/// The description, and so the `placement` field, of every unpinned row.
pub const UNPINNED: &str = "unpinned";

/// The unpinned placement: nothing pinned, no idle policy given (every program's default).
fn unpinned_placement() -> Placement {
    Placement {
        client: None,
        server: None,
        master: None,
        master_b: None,
        idle: "",
        pairs_cores: Vec::new(),
        description: UNPINNED.into(),
    }
}

/// The description, and so the `placement` field, of every DockNet row confined to one core at
/// its defaults.
pub const ONE_CORE: &str = "one core, defaults";

/// Client and server on core 1, no idle policy given (every program's default).
fn one_core_placement() -> Placement {
    Placement {
        client: Some(1),
        server: Some(1),
        description: ONE_CORE.into(),
        ..unpinned_placement()
    }
}

/// The daemon of an unpinned or one-core run: its defaults (the `adaptive` idle policy, not pinned, nice 0).
pub(crate) const UNPINNED_DAEMON: DaemonSetup = DaemonSetup {
    idle: "adaptive",
    master_core: None,
    master_core_b: None,
    master_nice: 0,
};

/// How a DockNet mode's daemon runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSetup {
    /// `--idle` of the daemon.
    pub idle: &'static str,
    /// `--master-core` of the daemon (host A's on two hosts).
    pub master_core: Option<usize>,
    /// Two hosts: `--master-core` of host B's daemon.
    pub master_core_b: Option<usize>,
    /// `--master-nice` of the daemons.
    pub master_nice: i32,
}

impl DaemonSetup {
    /// A daemon whose master spins on core `core`, at normal priority (one host).
    pub fn spinning_on(core: usize) -> DaemonSetup {
        DaemonSetup {
            idle: "spin",
            master_core: Some(core),
            master_core_b: None,
            master_nice: 0,
        }
    }

    /// A daemon waiting as `idle`, its masters on no core of their own, at normal priority.
    pub fn unpinned(idle: &'static str) -> DaemonSetup {
        DaemonSetup {
            idle,
            master_core: None,
            master_core_b: None,
            master_nice: 0,
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measure {
    /// dnperf client and server, one pair, pinned as given.
    Dnperf(Placement),
    /// The cross-check tool on one pair (client core 0, server core 1).
    Crosscheck(Tool, Placement),
    /// N pairs at once, rr then stream.
    Pairs(usize, Placement),
}

/// One point of a plan: a measurement at a message size, in a run of its point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    /// What to run.
    pub measure: Measure,
    /// Message size in bytes.
    pub size: usize,
    /// Run index.
    pub repeat: usize,
}

impl Point {
    /// Where the parties run.
    pub fn placement(&self) -> &Placement {
        match &self.measure {
            Measure::Dnperf(p) | Measure::Crosscheck(_, p) | Measure::Pairs(_, p) => p,
        }
    }

    /// The tool that measures.
    pub fn tool(&self) -> Tool {
        match self.measure {
            Measure::Crosscheck(t, _) => t,
            _ => Tool::Dnperf,
        }
    }
}

/// One topology build and what runs on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeRun {
    /// The mode.
    pub mode: Mode,
    /// The MTU of its links or pipes (the `lo` modes: the lab's first MTU, recorded as what the
    /// measurement reports).
    pub mtu: u32,
    /// Client/server pairs to build (the largest N of a pairs sweep, else 1).
    pub pairs: usize,
    /// The daemon's setup, for DockNet modes.
    pub daemon: Option<DaemonSetup>,
    /// The points, in the order they run.
    pub points: Vec<Point>,
}

/// What a run was asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The workload.
    pub workload: Workload,
    /// Modes in the order given.
    pub modes: Vec<Mode>,
    /// Message sizes.
    pub sizes: Vec<usize>,
    /// Link MTUs.
    pub mtus: Vec<u32>,
    /// Numbers of pairs (pairs workload).
    pub pairs: Vec<usize>,
    /// Runs per point.
    pub repeat: usize,
    /// Cross-check kernel modes with sockperf / iperf3 (rr, stream).
    pub crosscheck: bool,
    /// One host or two.
    pub topology: Topology,
    /// Pairs: the idle policies of DockNet's peers, each a placement of its own.
    pub peer_idle: Vec<&'static str>,
    /// Pairs: cores to pin the pairs' containers to (empty: unpinned).
    pub pairs_cores: Vec<usize>,
    /// Cores of this machine.
    pub machine_cores: usize,
    /// rr and stream on one host: the placements to measure, side by side.
    pub placements: Vec<PlacementKind>,
}

/// A bad request, said in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// The default sizes of a workload.
pub fn default_sizes(w: Workload) -> Vec<usize> {
    match w {
        Workload::Rr => vec![64, 1024, 65536],
        Workload::Stream => vec![64, 256, 1024, 4096, 16384, 65536, 409600],
        Workload::Pairs | Workload::Rate => vec![1024],
        Workload::Idle | Workload::Http | Workload::Nat | Workload::Cpuquota => vec![64],
        Workload::Startup => vec![1],
        Workload::Chain => vec![10, 100, 1000, 10_000, 100_000, 500_000],
    }
}

impl Request {
    /// Checks the request's numbers.
    pub fn check(&self) -> Result<(), BadRequest> {
        let bad = |s: String| Err(BadRequest(s));
        if let Some(s) = self.sizes.iter().find(|s| **s < 24 || **s > 16 << 20) {
            return bad(format!("size {s} out of range (24 B .. 16 MiB)"));
        }
        if let Some(m) = self.mtus.iter().find(|m| !(576..=65535).contains(*m)) {
            return bad(format!("MTU {m} out of range (576 .. 65535)"));
        }
        if self.mtus.is_empty() || self.sizes.is_empty() || self.modes.is_empty() {
            return bad("--modes, --sizes and --mtus each need at least one value".into());
        }
        if self.pairs.is_empty() || self.pairs.iter().any(|n| *n == 0 || *n > 250) {
            return bad("--pairs takes numbers from 1 to 250".into());
        }
        if self.repeat == 0 {
            return bad("--repeat must be at least 1".into());
        }
        if self.peer_idle.is_empty() {
            return bad("--peer-idle needs at least one policy".into());
        }
        if self.placements.is_empty() {
            return bad("--placement needs pinned, unpinned or one-core".into());
        }
        if self.placements != [PlacementKind::Pinned]
            && (self.topology == Topology::TwoHost
                || !matches!(self.workload, Workload::Rr | Workload::Stream))
        {
            return bad(
                "--placement applies to rr and stream on one host (pairs are unpinned unless --cores)"
                    .into(),
            );
        }
        if let Some(c) = self.pairs_cores.iter().find(|c| **c >= self.machine_cores) {
            return bad(format!(
                "--cores: no core {c} here (cores 0 to {})",
                self.machine_cores.saturating_sub(1)
            ));
        }
        if self.workload != Workload::Pairs
            && (!self.pairs_cores.is_empty() || self.peer_idle != [PEER_IDLE[3]])
        {
            return bad("--cores and --peer-idle apply to the pairs workload".into());
        }
        if let Some(m) = self
            .modes
            .iter()
            .find(|m| !m.topologies().contains(&self.topology))
        {
            let names: Vec<&str> = self.topology.modes().iter().map(|m| m.name()).collect();
            return bad(format!(
                "{m} is not a {} mode; {} modes: {}",
                self.topology,
                self.topology,
                names.join(", ")
            ));
        }
        if self.topology == Topology::TwoHost
            && self.workload == Workload::Pairs
            && self.pairs.iter().any(|n| *n > 120)
        {
            return bad("two hosts: --pairs takes numbers from 1 to 120".into());
        }
        Ok(())
    }
}

/// The plan: the runs, and the modes left out with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Topology builds in order, each with its points.
    pub runs: Vec<ModeRun>,
    /// Modes this machine cannot have, with the reason (from the probe).
    pub unavailable: Vec<(Mode, String)>,
}

fn kernel_placement(mode: Mode, (c, s): (usize, usize), topology: Topology) -> Placement {
    let two = topology == Topology::TwoHost;
    Placement {
        client: Some(c),
        server: Some(s),
        master: None,
        master_b: None,
        idle: "spin",
        pairs_cores: Vec::new(),
        description: format!(
            "client{} core {c}, server{} core {s}, kernel TCP ({mode}, built with {})",
            if two { " (host A)" } else { "" },
            if two { " (host B)" } else { "" },
            mode.builder().name()
        ),
    }
}

fn crosscheck_placement(mode: Mode, tool: Tool) -> Placement {
    Placement {
        client: Some(0),
        server: Some(1),
        master: None,
        master_b: None,
        idle: "spin",
        pairs_cores: Vec::new(),
        description: format!(
            "client core 0, server core 1, kernel TCP ({mode}), measured by {tool}"
        ),
    }
}

/// The single-pair placement of a DockNet mode and its daemon: the fast channel spins on two
/// cores with the daemon off the path; through the daemon, the master spins on core 0 and both
/// containers share core 1, yielding when idle.
fn docknet_placement(mode: Mode) -> (Placement, DaemonSetup) {
    if mode.link() == crate::mode::Link::FastChannel {
        (
            Placement {
                client: Some(0),
                server: Some(1),
                master: None,
                master_b: None,
                idle: "spin",
                pairs_cores: Vec::new(),
                description:
                    "client core 0, server core 1, both spin; daemon idle (not on the path)".into(),
            },
            DaemonSetup {
                idle: "adaptive",
                master_core: None,
                master_core_b: None,
                master_nice: 0,
            },
        )
    } else {
        (
            Placement {
                client: Some(1),
                server: Some(1),
                master: Some(0),
                master_b: None,
                idle: "adaptive:0",
                pairs_cores: Vec::new(),
                description:
                    "client and server share core 1 (yield when idle), daemon master core 0 spin"
                        .into(),
            },
            DaemonSetup::spinning_on(0),
        )
    }
}

/// The pairs placement: nothing pinned. DockNet peers outnumber cores, so a waiting peer
/// sleeps at once (`block`): a spinning or yielding peer stays runnable and takes CPU from the
/// peers and the master it waits for (at 16 pairs, p50 through the daemon fell from 438 us with
/// yielding peers to 111 us, and over fast channels from 478 us with a 50 us spin to 100 us;
/// docs/benchmarks.md, "Density"). The daemon is adaptive.
/// The daemon's master runs at nice -10 in the pairs workload: at the containers' weight it
/// gets 1/N of a core with N of them busy (benchmarks.md, "Density": at 128 pairs, 3.4 Gbps at
/// nice 0, 6.8 at -15).
pub const PAIRS_MASTER_NICE: i32 = -10;

/// The idle policies a DockNet peer may be given in a pairs sweep (`--peer-idle`).
pub const PEER_IDLE: [&str; 4] = ["spin", "adaptive", "adaptive:0", "block"];

/// The pairs placements of a mode: one per DockNet peer idle policy (kernel peers block in the
/// kernel: one), and the daemon's setup.
///
/// Unpinned (`cores` empty): the daemon is adaptive at [`PAIRS_MASTER_NICE`]. Pinned (the
/// paper's Fig. 10): every container on the given cores, and the daemon's master on a core of
/// its own where one is left (spinning at nice 0, as the paper's dedicated master core), else
/// adaptive at [`PAIRS_MASTER_NICE`] beside them.
fn pairs_placements(
    mode: Mode,
    idles: &[&'static str],
    cores: &[usize],
    machine_cores: usize,
) -> (Vec<Placement>, Option<DaemonSetup>) {
    let free = (0..machine_cores).find(|c| !cores.contains(c));
    let daemon = mode.is_docknet().then_some(match (cores.is_empty(), free) {
        (false, Some(m)) => DaemonSetup {
            idle: "spin",
            master_core: Some(m),
            master_core_b: None,
            master_nice: 0,
        },
        _ => DaemonSetup {
            idle: "adaptive",
            master_core: None,
            master_core_b: None,
            master_nice: PAIRS_MASTER_NICE,
        },
    });
    let on = if cores.is_empty() {
        "unpinned".to_string()
    } else {
        let c: Vec<String> = cores.iter().map(|c| c.to_string()).collect();
        format!(
            "pinned to core {} (pair i on the i-th, round robin)",
            c.join(", ")
        )
    };
    let idles: Vec<&'static str> = if mode.is_docknet() {
        idles.to_vec()
    } else {
        vec!["spin"]
    };
    let placements = idles
        .into_iter()
        .map(|idle| {
            let how = match &daemon {
                Some(d) => format!(
                    "DockLib TCP, peers {idle}, daemon {}{} at nice {}",
                    d.idle,
                    d.master_core
                        .map_or(String::new(), |m| format!(" on core {m}")),
                    d.master_nice
                ),
                None => format!("kernel TCP, built with {}", mode.builder().name()),
            };
            Placement {
                client: None,
                server: None,
                master: daemon.as_ref().and_then(|d| d.master_core),
                master_b: None,
                idle,
                pairs_cores: cores.to_vec(),
                description: format!(
                    "{mode}: N client/server pairs, each in containers of their own, {on}; {how}"
                ),
            }
        })
        .collect();
    (placements, daemon)
}

/// Two hosts: DockNet's placements, each with its daemons' cores. "One core per host": host A's
/// client and daemon share core 0, host B's server and daemon core 1 (the kernel's `c0 s1`
/// gives each host one core the same way). "Daemons on core 0": both daemons share core 0,
/// client and server core 1 (as the one-host daemon placement). Everything waits by yielding
/// (`adaptive:0`): a spinning thread would starve the other on its core.
fn two_host_docknet_placements(mode: Mode) -> Vec<(Placement, DaemonSetup)> {
    [((0, 1), (0, 1), "one core per host: client and host A's daemon core 0, server and host B's daemon core 1"),
     ((1, 1), (0, 0), "client and server core 1, both hosts' daemons core 0")]
        .into_iter()
        .map(|((c, s), (ma, mb), what)| {
            (
                Placement {
                    client: Some(c),
                    server: Some(s),
                    master: Some(ma),
                    master_b: Some(mb),
                    idle: "adaptive:0",
                    pairs_cores: Vec::new(),
                    description: format!("{what}; all yield when idle ({mode})"),
                },
                DaemonSetup {
                    idle: "adaptive:0",
                    master_core: Some(ma),
                    master_core_b: Some(mb),
                    master_nice: 0,
                },
            )
        })
        .collect()
}

/// The cross-check tool of a workload, if it has one.
pub fn crosscheck_tool(w: Workload) -> Option<Tool> {
    match w {
        Workload::Rr => Some(Tool::Sockperf),
        Workload::Stream => Some(Tool::Iperf3),
        Workload::Pairs
        | Workload::Rate
        | Workload::Idle
        | Workload::Http
        | Workload::Nat
        | Workload::Startup
        | Workload::Chain
        | Workload::Cpuquota => None,
    }
}

impl ModeRun {
    /// A run of this one's mode and MTU with a daemon of its own, measuring `p` by dnperf at
    /// every repeat and size of `req`.
    fn own(&self, daemon: DaemonSetup, p: &Placement, req: &Request) -> ModeRun {
        let points = (0..req.repeat)
            .flat_map(|repeat| {
                req.sizes.iter().map(move |&size| Point {
                    measure: Measure::Dnperf(p.clone()),
                    size,
                    repeat,
                })
            })
            .collect();
        ModeRun {
            daemon: Some(daemon),
            points,
            ..self.clone()
        }
    }
}

impl Plan {
    /// Plans `req`; `unavailable` says why a mode cannot run here (`None`: it can).
    pub fn new(req: &Request, unavailable: impl Fn(Mode) -> Option<String>) -> Plan {
        let mut plan = Plan {
            runs: Vec::new(),
            unavailable: Vec::new(),
        };
        let mut ns = req.pairs.clone();
        ns.sort_unstable();
        // --placement applies to rr and stream on one host; pairs and two hosts place their own
        let placed = req.workload != Workload::Pairs && req.topology == Topology::OneHost;
        let unpinned = placed && req.placements.contains(&PlacementKind::Unpinned);
        let one_core = placed && req.placements.contains(&PlacementKind::OneCore);
        let pinned = !placed || req.placements.contains(&PlacementKind::Pinned);
        for &mode in &req.modes {
            if let Some(why) = unavailable(mode) {
                plan.unavailable.push((mode, why));
                continue;
            }
            // modes over `lo` ignore the MTU: run once
            let mtus: Vec<u32> = if mode.crosses_lo() {
                req.mtus.iter().take(1).copied().collect()
            } else {
                req.mtus.clone()
            };
            for mtu in mtus {
                let mut run = ModeRun {
                    mode,
                    mtu,
                    pairs: 1,
                    daemon: None,
                    points: Vec::new(),
                };
                let point = |measure, size, repeat| Point {
                    measure,
                    size,
                    repeat,
                };
                for repeat in 0..req.repeat {
                    if req.workload == Workload::Pairs {
                        let (ps, daemon) = pairs_placements(
                            mode,
                            &req.peer_idle,
                            &req.pairs_cores,
                            req.machine_cores,
                        );
                        run.daemon = daemon;
                        run.pairs = ns.last().copied().unwrap_or(1);
                        for p in &ps {
                            for &size in &req.sizes {
                                for &n in &ns {
                                    run.points.push(point(
                                        Measure::Pairs(n, p.clone()),
                                        size,
                                        repeat,
                                    ));
                                }
                            }
                        }
                    } else if mode.is_docknet() && req.topology == Topology::TwoHost {
                        // one run per placement: each needs its own daemons
                        continue;
                    } else if mode.is_docknet() && !pinned {
                        // only the unpinned run below
                    } else if mode.is_docknet() {
                        let (p, daemon) = docknet_placement(mode);
                        run.daemon = Some(daemon);
                        for &size in &req.sizes {
                            run.points
                                .push(point(Measure::Dnperf(p.clone()), size, repeat));
                        }
                        // unmodified kernel tools run over DockNet too, placed as dnperf is
                        // on this mode (the daemon's master keeps its core)
                        let tool = crosscheck_tool(req.workload)
                            .filter(|_| req.crosscheck && mode.is_preload());
                        for tool in tool.into_iter() {
                            for &size in &req.sizes {
                                let p = Placement {
                                    description: format!(
                                        "{}; kernel sockets on DockLib by the preload library, \
                                         measured by {tool}",
                                        p.description
                                    ),
                                    ..p.clone()
                                };
                                run.points
                                    .push(point(Measure::Crosscheck(tool, p), size, repeat));
                            }
                        }
                    } else {
                        // one core is the pinned placements' first (c1 s1) for the kernel
                        let placements = unpinned.then(unpinned_placement).into_iter().chain(
                            KERNEL_PLACEMENTS
                                .iter()
                                .filter(|&&c| pinned || (one_core && c == KERNEL_PLACEMENTS[0]))
                                .map(|&cores| kernel_placement(mode, cores, req.topology)),
                        );
                        for p in placements {
                            for &size in &req.sizes {
                                run.points
                                    .push(point(Measure::Dnperf(p.clone()), size, repeat));
                            }
                        }
                        let tool =
                            crosscheck_tool(req.workload).filter(|_| req.crosscheck && pinned);
                        for tool in tool.into_iter() {
                            for &size in &req.sizes {
                                let p = crosscheck_placement(mode, tool);
                                run.points
                                    .push(point(Measure::Crosscheck(tool, p), size, repeat));
                            }
                        }
                    }
                }
                if mode.is_docknet()
                    && req.topology == Topology::TwoHost
                    && req.workload != Workload::Pairs
                {
                    for (p, daemon) in two_host_docknet_placements(mode) {
                        plan.runs.push(run.own(daemon, &p, req));
                    }
                } else {
                    // the DockNet runs at defaults: the daemon at its own, not pinned
                    let at_defaults: Vec<ModeRun> = [
                        (unpinned, unpinned_placement as fn() -> Placement),
                        (one_core, one_core_placement),
                    ]
                    .into_iter()
                    .filter(|(asked, _)| mode.is_docknet() && *asked)
                    .map(|(_, p)| run.own(UNPINNED_DAEMON, &p(), req))
                    .collect();
                    if !run.points.is_empty() {
                        plan.runs.push(run);
                    }
                    plan.runs.extend(at_defaults);
                }
            }
        }
        plan
    }

    /// Points in the whole plan (the progress bar's length).
    pub fn total_points(&self) -> usize {
        self.runs.iter().map(|r| r.points.len()).sum()
    }
}

/// The MTU a mode's rows carry when it crosses only `lo`.
pub fn row_mtu(mode: Mode, link_mtu: u32) -> u32 {
    if mode.crosses_lo() {
        LO_MTU
    } else {
        link_mtu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(workload: Workload, modes: &[Mode]) -> Request {
        Request {
            workload,
            modes: modes.to_vec(),
            sizes: vec![64, 1024],
            mtus: vec![1500, 9000],
            pairs: vec![4, 1, 16],
            repeat: 2,
            crosscheck: true,
            topology: Topology::OneHost,
            peer_idle: vec!["block"],
            pairs_cores: Vec::new(),
            machine_cores: 2,
            placements: vec![PlacementKind::Pinned],
        }
    }

    #[test]
    fn kernel_modes_get_two_placements_and_a_crosscheck_per_size_and_run() {
        let p = Plan::new(&req(Workload::Rr, &[Mode::Bridge, Mode::Loopback]), |_| {
            None
        });
        // bridge at both MTUs, loopback (over lo) once
        let shape: Vec<(Mode, u32, usize)> = p
            .runs
            .iter()
            .map(|r| (r.mode, r.mtu, r.points.len()))
            .collect();
        assert_eq!(
            shape,
            [
                (Mode::Bridge, 1500, 12),
                (Mode::Bridge, 9000, 12),
                (Mode::Loopback, 1500, 12)
            ]
        );
        assert_eq!(p.total_points(), 36);
        let first: Vec<(String, usize, usize, Tool)> = p.runs[0]
            .points
            .iter()
            .take(6)
            .map(|x| (x.placement().cores(), x.size, x.repeat, x.tool()))
            .collect();
        assert_eq!(
            first,
            [
                ("c1 s1".into(), 64, 0, Tool::Dnperf),
                ("c1 s1".into(), 1024, 0, Tool::Dnperf),
                ("c0 s1".into(), 64, 0, Tool::Dnperf),
                ("c0 s1".into(), 1024, 0, Tool::Dnperf),
                ("c0 s1".into(), 64, 0, Tool::Sockperf),
                ("c0 s1".into(), 1024, 0, Tool::Sockperf),
            ]
        );
        assert_eq!(
            p.runs[0].points[0].placement().description,
            "client core 1, server core 1, kernel TCP (bridge, built with cni)"
        );
        assert!(p.runs.iter().all(|r| r.daemon.is_none() && r.pairs == 1));
    }

    #[test]
    fn docknet_modes_get_their_daemon_and_placement() {
        let mut r = req(Workload::Stream, &[Mode::Docknet, Mode::DocknetFc]);
        r.mtus = vec![1500];
        let p = Plan::new(&r, |_| None);
        assert_eq!(p.runs.len(), 2);
        let d = &p.runs[0];
        assert_eq!(d.points.len(), 4, "no crosscheck on DockNet modes");
        assert_eq!(d.points[0].placement().cores(), "c1 s1 m0");
        assert_eq!(d.points[0].placement().idle, "adaptive:0");
        assert_eq!(
            d.daemon,
            Some(DaemonSetup {
                idle: "spin",
                master_core: Some(0),
                master_core_b: None,
                master_nice: 0
            })
        );
        let fc = &p.runs[1];
        assert_eq!(fc.points[0].placement().cores(), "c0 s1");
        assert_eq!(fc.daemon.as_ref().unwrap().idle, "adaptive");
    }

    #[test]
    fn preload_modes_run_dnperf_on_kernel_sockets_and_the_cross_check_tools() {
        let mut r = req(
            Workload::Rr,
            &[Mode::DocknetPreload, Mode::DocknetFcPreload],
        );
        r.mtus = vec![1500];
        r.repeat = 1;
        let p = Plan::new(&r, |_| None);
        assert_eq!(p.runs.len(), 2);
        let tools = |run: &ModeRun| -> Vec<(String, usize, Tool)> {
            run.points
                .iter()
                .map(|x| (x.placement().cores(), x.size, x.tool()))
                .collect()
        };
        // through the daemon: the placement of `docknet` for dnperf and sockperf alike (the
        // master keeps core 0); over a fast channel that of `docknet-fc`
        assert_eq!(p.runs[0].points[0].placement().cores(), "c1 s1 m0");
        assert_eq!(p.runs[0].points[3].placement().cores(), "c1 s1 m0");
        assert_eq!(p.runs[0].points[3].tool(), Tool::Sockperf);
        assert_eq!(
            tools(&p.runs[1]),
            [
                ("c0 s1".into(), 64, Tool::Dnperf),
                ("c0 s1".into(), 1024, Tool::Dnperf),
                ("c0 s1".into(), 64, Tool::Sockperf),
                ("c0 s1".into(), 1024, Tool::Sockperf),
            ]
        );
        assert!(p.runs[1].points[2]
            .placement()
            .description
            .contains("preload library"));
        assert!(p.runs.iter().all(|r| r.daemon.is_some()));
        // without --crosscheck, dnperf only; the stream workload takes iperf3
        r.crosscheck = false;
        assert!(Plan::new(&r, |_| None).runs[1]
            .points
            .iter()
            .all(|x| x.tool() == Tool::Dnperf));
        r.crosscheck = true;
        r.workload = Workload::Stream;
        assert_eq!(
            Plan::new(&r, |_| None).runs[1].points[3].tool(),
            Tool::Iperf3
        );
    }

    #[test]
    fn pairs_sweep_ascending_n_on_one_build_for_the_largest() {
        let mut r = req(Workload::Pairs, &[Mode::Bridge, Mode::Docknet]);
        r.mtus = vec![1500];
        r.repeat = 1;
        r.sizes = vec![1024];
        let p = Plan::new(&r, |_| None);
        for run in &p.runs {
            assert_eq!(run.pairs, 16);
            let ns: Vec<usize> = run
                .points
                .iter()
                .map(|x| match x.measure {
                    Measure::Pairs(n, _) => n,
                    _ => panic!("pairs points only"),
                })
                .collect();
            assert_eq!(ns, [1, 4, 16]);
            assert_eq!(run.points[0].placement().cores(), "-");
        }
        assert_eq!(p.runs[1].points[0].placement().idle, "block");
        assert_eq!(p.runs[1].daemon.as_ref().unwrap().master_core, None);
    }

    #[test]
    fn pinned_pairs_give_the_master_a_core_of_its_own_and_a_sweep_per_peer_policy() {
        let mut r = req(Workload::Pairs, &[Mode::Bridge, Mode::Docknet]);
        r.mtus = vec![1500];
        r.repeat = 1;
        r.sizes = vec![1024];
        r.peer_idle = vec!["spin", "block"];
        r.pairs_cores = vec![1];
        assert!(r.check().is_ok());
        let p = Plan::new(&r, |_| None);
        let bridge = &p.runs[0];
        assert_eq!(bridge.points.len(), 3, "kernel peers: one sweep");
        assert_eq!(bridge.points[0].placement().cores(), "p1");
        assert_eq!(bridge.points[0].placement().pair_core(5), Some(1));
        let dn = &p.runs[1];
        let idles: Vec<&str> = dn.points.iter().map(|x| x.placement().idle).collect();
        assert_eq!(idles, ["spin", "spin", "spin", "block", "block", "block"]);
        assert_eq!(dn.points[0].placement().cores(), "p1 m0");
        let d = dn.daemon.as_ref().unwrap();
        assert_eq!((d.idle, d.master_core, d.master_nice), ("spin", Some(0), 0));
        // every core taken: the master shares them, adaptive and favoured
        r.pairs_cores = vec![0, 1];
        let p = Plan::new(&r, |_| None);
        let d = p.runs[1].daemon.as_ref().unwrap();
        assert_eq!((d.idle, d.master_core), ("adaptive", None));
        assert_eq!(p.runs[1].points[0].placement().pair_core(3), Some(1));
        r.pairs_cores = vec![2];
        assert!(r.check().unwrap_err().to_string().contains("no core 2"));
        let mut rr = req(Workload::Rr, &[Mode::Docknet]);
        rr.peer_idle = vec!["spin"];
        assert!(rr.check().is_err(), "pairs only");
    }

    #[test]
    fn two_hosts_get_their_placements_and_refuse_one_host_modes() {
        let mut r = req(Workload::Rr, &[Mode::Routed, Mode::Docknet]);
        r.topology = Topology::TwoHost;
        r.mtus = vec![1500];
        r.repeat = 1;
        r.crosscheck = false;
        assert!(r.check().is_ok());
        let p = Plan::new(&r, |_| None);
        let shape: Vec<(Mode, String, Option<DaemonSetup>)> = p
            .runs
            .iter()
            .map(|x| (x.mode, x.points[0].placement().cores(), x.daemon.clone()))
            .collect();
        assert_eq!(shape.len(), 3, "routed, then docknet once per placement");
        assert_eq!(shape[0].1, "c1 s1");
        assert_eq!(p.runs[0].points.len(), 4);
        assert_eq!(shape[1].1, "c0 s1 m0 m1");
        assert_eq!(
            shape[1].2,
            Some(DaemonSetup {
                idle: "adaptive:0",
                master_core: Some(0),
                master_core_b: Some(1),
                master_nice: 0
            })
        );
        assert_eq!(shape[2].1, "c1 s1 m0 m0");
        assert!(p.runs[0].points[0]
            .placement()
            .description
            .contains("host A"));
        let mut bad = r.clone();
        bad.modes = vec![Mode::Bridge];
        let e = bad.check().unwrap_err().to_string();
        assert!(
            e.contains("bridge is not a two-host mode") && e.contains("vxlan"),
            "{e}"
        );
        let mut bad = r.clone();
        bad.topology = Topology::OneHost;
        bad.modes = vec![Mode::Vxlan];
        assert!(bad.check().is_err());
    }

    #[test]
    fn unavailable_modes_are_left_out_with_their_reason() {
        let p = Plan::new(&req(Workload::Rr, &[Mode::Ipvlan, Mode::Veth]), |m| {
            (m == Mode::Ipvlan).then(|| "no module".to_string())
        });
        assert_eq!(p.unavailable, [(Mode::Ipvlan, "no module".to_string())]);
        assert!(p.runs.iter().all(|r| r.mode == Mode::Veth));
    }

    #[test]
    fn bad_requests_are_one_line() {
        let ok = req(Workload::Rr, &[Mode::Bridge]);
        assert!(ok.check().is_ok());
        for (f, want) in [
            (
                Box::new(|r: &mut Request| r.sizes = vec![1]) as Box<dyn Fn(&mut Request)>,
                "size 1",
            ),
            (Box::new(|r: &mut Request| r.mtus = vec![100]), "MTU 100"),
            (Box::new(|r: &mut Request| r.pairs = vec![0]), "--pairs"),
            (Box::new(|r: &mut Request| r.repeat = 0), "--repeat"),
        ] {
            let mut r = ok.clone();
            f(&mut r);
            let e = r.check().unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{e}");
        }
        assert_eq!(row_mtu(Mode::Container, 1500), LO_MTU);
        assert_eq!(row_mtu(Mode::Veth, 9000), 9000);
    }

    #[test]
    fn unpinned_runs_pin_nothing_and_give_no_idle_policy() {
        let mut r = req(
            Workload::Rr,
            &[Mode::Bridge, Mode::Docknet, Mode::DocknetFc],
        );
        r.mtus = vec![1500];
        r.repeat = 1;
        r.crosscheck = true;
        r.placements = vec![PlacementKind::Pinned, PlacementKind::Unpinned];
        let p = Plan::new(&r, |_| None);
        // bridge: one run with both; each DockNet mode: its pinned run, then its unpinned one
        let modes: Vec<Mode> = p.runs.iter().map(|r| r.mode).collect();
        assert_eq!(
            modes,
            [
                Mode::Bridge,
                Mode::Docknet,
                Mode::Docknet,
                Mode::DocknetFc,
                Mode::DocknetFc
            ]
        );
        let unpinned: Vec<&Point> = p
            .runs
            .iter()
            .flat_map(|r| &r.points)
            .filter(|x| x.placement().description == UNPINNED)
            .collect();
        assert_eq!(unpinned.len(), 3 * r.sizes.len());
        for x in &unpinned {
            let pl = x.placement();
            assert_eq!(
                (pl.client, pl.server, pl.master, pl.idle),
                (None, None, None, "")
            );
            assert_eq!(x.tool(), Tool::Dnperf, "no cross-check unpinned");
        }
        for run in p.runs.iter().filter(|r| r.mode.is_docknet()) {
            let un = run.points[0].placement().description == UNPINNED;
            assert!(run
                .points
                .iter()
                .all(|x| (x.placement().description == UNPINNED) == un));
            let d = run.daemon.as_ref().unwrap();
            if un {
                assert_eq!(
                    (d.idle, d.master_core, d.master_nice),
                    ("adaptive", None, 0)
                );
            }
        }
        // unpinned alone: no pinned point anywhere
        r.placements = vec![PlacementKind::Unpinned];
        let p = Plan::new(&r, |_| None);
        assert_eq!(p.runs.len(), 3);
        assert!(p
            .runs
            .iter()
            .flat_map(|r| &r.points)
            .all(|x| x.placement().description == UNPINNED));
        // one core: DockNet confined to core 1 at its defaults, the kernel on core 1
        r.placements = vec![PlacementKind::OneCore];
        let p = Plan::new(&r, |_| None);
        assert_eq!(p.runs.len(), 3);
        for run in &p.runs {
            for x in &run.points {
                let pl = x.placement();
                assert_eq!((pl.client, pl.server, pl.master), (Some(1), Some(1), None));
                assert_eq!(x.tool(), Tool::Dnperf);
                if run.mode.is_docknet() {
                    assert_eq!((pl.idle, pl.description.as_str()), ("", ONE_CORE));
                    assert_eq!(run.daemon, Some(UNPINNED_DAEMON));
                }
            }
        }
        // not for the other workloads or two hosts
        let mut pairs = req(Workload::Pairs, &[Mode::Bridge]);
        pairs.placements = vec![PlacementKind::Unpinned];
        assert!(pairs.check().is_err());
    }
}
