//! `docknet bench http` and `docknet bench nat`: the paper's services (an HTTP server under
//! load, the web cluster behind a balancer, and the latency the NAT load balancer adds).

use super::*;
use crate::row::Row;

/// Options of `docknet bench http`.
#[derive(Debug, Clone, clap::Args)]
pub struct HttpArgs {
    /// Modes to compare (one host): kernel modes run docknet-httpd under docknet-load and under
    /// wrk, and nginx under wrk; DockNet modes run docknet-httpd under docknet-load.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bridge,docknet,docknet-fc"
    )]
    pub modes: Vec<String>,
    /// Servers: docknet-httpd (the project's, one program for both stacks; kernel and DockLib
    /// modes), nginx (Debian's, a master and one worker per core, static file, keep-alive;
    /// kernel and preload modes, loaded by wrk).
    #[arg(long, value_delimiter = ',', default_value = "docknet-httpd,nginx")]
    pub server: Vec<String>,
    /// Connections of the load generator (several: one point each).
    #[arg(long, value_delimiter = ',', default_value = "64")]
    pub connections: Vec<usize>,
    /// The request path: / (the 451-byte index compiled into docknet-httpd, which nginx gets
    /// too), /hello.txt, /bytes/N.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// Where the parties run. pinned: load generator core 0, server core 1 (through the
    /// daemon both on core 1, its master spinning on core 0), with chosen idle policies.
    /// unpinned: what a user gets, nothing pinned in any mode and every DockNet program at its
    /// defaults. Both: side by side, each judged against the bridge in the same placement.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "pinned")]
    pub placement: Vec<crate::plan::PlacementKind>,
    /// Measured seconds per point.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Warm-up seconds per point (excluded).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Runs per point.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// The web cluster instead: this many docknet-httpd backends behind a load balancer
    /// (docknet-natlb on docknet-fc; iptables DNAT on bridge), each request spending --work-us
    /// of a backend's CPU; requests/s and the scaling against one backend.
    #[arg(long, value_delimiter = ',', value_name = "N")]
    pub backends: Option<Vec<usize>>,
    /// Services instead: the generator calls a ClusterIP-like service of --backends backends
    /// [default: 1,2,4]: DockNet's service (`docknet service set`, the daemon at its defaults)
    /// against kube-proxy's iptables and nftables rules on the bridge, and calling one backend
    /// directly on each; nothing pinned, every program at its defaults.
    #[arg(long)]
    pub service: bool,
    /// Web cluster: CPU microseconds per request in a backend (GET /work/US).
    #[arg(long, default_value_t = 10)]
    pub work_us: u64,
    /// Web cluster: how DockNet's generator, balancer and backends wait (spin, adaptive,
    /// adaptive:0, block). They share two cores: waiting without spinning or yielding leaves
    /// the CPU to whoever has work (measured: 1.42x from one to three backends with block,
    /// 0.86x with adaptive).
    #[arg(long, default_value = "block")]
    pub peer_idle: String,
    /// Write all results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write tcp-http.json and tcp-http.md into this directory and (re)build its HTML report.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// The end of a one-host HTTP bench: summarises `rows`, prints the summary as `table` writes
/// it, what was not available and the targets `targets` judges, and gathers the results.
fn http_results(
    args: &HttpArgs,
    rows: Vec<Row>,
    skipped: Vec<NotAvailable>,
    table: fn(&[Row]) -> String,
    targets: fn(&[Row]) -> Vec<Verdict>,
) -> Results {
    let summary = summarize(&rows);
    print!("{}", table(&summary));
    for s in &skipped {
        println!("{}", s.line());
    }
    let targets = lines(&targets(&summary));
    for t in &targets {
        println!("target: {t}");
    }
    let mut env = Env::here(args.duration, args.warmup, args.repeat);
    env.workload = Some(Workload::Http);
    env.mtus = Some(vec![1500]);
    env.topology = Some(Topology::OneHost);
    Results {
        env,
        results: rows,
        summary,
        ratios: Vec::new(),
        targets,
        not_available: skipped,
    }
}

/// Runs `docknet bench http --backends ...`: the web cluster.
fn run_cluster(args: &HttpArgs, backends: &[usize]) -> Result<()> {
    use crate::workload::cluster::{self, ClusterPoint};
    let modes = args
        .modes
        .iter()
        .map(|m| match m.parse::<Mode>()? {
            Mode::Docknet | Mode::DocknetFc => Ok(Mode::DocknetFc),
            Mode::Bridge => Ok(Mode::Bridge),
            m => bail!("{m}: the web cluster runs on bridge (iptables DNAT) and docknet-fc (docknet-natlb)"),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut modes = modes;
    modes.dedup();
    if backends.is_empty() || backends.iter().any(|b| !(1..=16).contains(b)) {
        bail!("--backends takes numbers from 1 to 16");
    }
    if !(1..=1_000_000).contains(&args.work_us) {
        bail!("--work-us must be 1 .. 1000000");
    }
    let connections = *args.connections.first().unwrap_or(&64);
    let idle = crate::plan::PEER_IDLE
        .into_iter()
        .find(|p| *p == args.peer_idle)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--peer-idle: {:?} is not one of {}",
                args.peer_idle,
                crate::plan::PEER_IDLE.join(", ")
            )
        })?;
    need_root("docknet bench http")?;
    let stop = Stop::on_signals()?;
    let exe = std::env::current_exe()?;
    let mut progress =
        crate::progress::Progress::new((modes.len() * backends.len() * args.repeat) as u64);
    let (mut rows, mut skipped) = (Vec::new(), Vec::new());
    let most = backends.iter().copied().max().unwrap_or(1);
    for mode in modes {
        stop.check()?;
        let why = match mode {
            Mode::DocknetFc if cluster::natlb_built(&exe).is_none() => {
                Some("docknet-natlb is not built next to docknet".to_string())
            }
            Mode::Bridge if !crate::workload::http::have("iptables") => {
                Some("no iptables (apt-get install iptables)".to_string())
            }
            m => probe::unavailable(m),
        };
        if let Some(reason) = why {
            progress.skip((backends.len() * args.repeat) as u64);
            skipped.push(NotAvailable::here(mode.name(), reason));
            continue;
        }
        let lab = if mode == Mode::Bridge {
            Some(
                crate::topology::KernelLab::build(mode, most, 1500)
                    .context("building the bridge")?,
            )
        } else {
            None
        };
        for repeat in 0..args.repeat {
            for &n in backends {
                stop.check()?;
                let p = ClusterPoint {
                    backends: n,
                    connections,
                    work_us: args.work_us,
                    duration: args.duration,
                    warmup: args.warmup,
                    repeat,
                    idle,
                };
                progress.start(&format!("{mode} cluster, {n} backends"));
                let r = match &lab {
                    Some(l) => cluster::kernel(&exe, l, &p, &stop),
                    None => cluster::docknet(&exe, &p, &stop),
                };
                match r {
                    Ok(row) => {
                        progress.done(&format!(
                            "  {mode} cluster, {n} backends: {:.0} req/s, p99 {:.0} us",
                            row.req_per_s.unwrap_or(0.0),
                            row.p99_us.unwrap_or(0.0)
                        ));
                        rows.push(row);
                    }
                    Err(e) => {
                        if stop.raised() {
                            return Err(e);
                        }
                        progress.done(&format!("  {mode} cluster, {n} backends: failed: {e:#}"));
                        skipped.push(NotAvailable::failed(
                            format!("{mode} ({n} backends)"),
                            1500,
                            &e,
                        ));
                    }
                }
            }
        }
    }
    progress.finish();
    let res = http_results(
        args,
        rows,
        skipped,
        crate::http::cluster_table,
        crate::http::cluster_targets,
    );
    println!("{}", crate::http::CLUSTER_CEILING);
    publish(
        &res,
        args.json.as_ref(),
        args.report.as_ref(),
        "tcp-cluster",
        || {
            format!(
                "# Web cluster\n\nCommand: `{}`\n\n```text\n{}```\n\n{}\n{}\n",
                res.env.command,
                crate::http::cluster_table(&res.summary),
                res.targets
                    .iter()
                    .map(|t| format!("- {t}\n"))
                    .collect::<String>(),
                crate::http::CLUSTER_CEILING
            )
        },
    )?;
    Ok(())
}

/// Runs `docknet bench http --service`.
fn run_service(args: &HttpArgs) -> Result<()> {
    use crate::workload::service::{self as svc, ServicePoint, Via};
    let backends = args.backends.clone().unwrap_or_else(|| vec![1, 2, 4]);
    if backends.is_empty() || backends.iter().any(|b| !(1..=16).contains(b)) {
        bail!("--backends takes numbers from 1 to 16");
    }
    let modes = args
        .modes
        .iter()
        .map(|m| match m.parse::<Mode>()? {
            Mode::Bridge => Ok(Mode::Bridge),
            Mode::Docknet | Mode::DocknetFc | Mode::DocknetAuto => Ok(Mode::DocknetAuto),
            m => {
                bail!("{m}: services run on bridge (kube-proxy's rules) and docknet (its service)")
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let mut modes = modes;
    modes.dedup();
    if args.duration <= 0.0 || args.warmup < 0.0 || args.repeat == 0 {
        bail!("--duration must be positive, --warmup not negative, --repeat at least 1");
    }
    if args.connections.is_empty() || args.connections.iter().any(|c| !(1..=10_000).contains(c)) {
        bail!("--connections takes numbers from 1 to 10000");
    }
    need_root("docknet bench http --service")?;
    let stop = Stop::on_signals()?;
    let exe = std::env::current_exe()?;
    let most = backends.iter().copied().max().unwrap_or(1);
    // (mode, how, backends, connections) in the order they run
    let mut points: Vec<(Mode, Via, usize, usize)> = Vec::new();
    let mut skipped = Vec::new();
    for &mode in &modes {
        let vias: Vec<Via> = match mode {
            Mode::Bridge => {
                let mut v = Vec::new();
                for (via, tool, pkg) in [
                    (Via::Iptables, "iptables", "iptables"),
                    (Via::Nftables, "nft", "nftables"),
                ] {
                    if crate::workload::http::have(tool) {
                        v.push(via);
                    } else {
                        skipped.push(NotAvailable::here(
                            format!("{} ({})", mode.name(), via.name()),
                            format!("no {tool} (apt-get install {pkg})"),
                        ));
                    }
                }
                v
            }
            _ => vec![Via::Docknet],
        };
        if let Some(reason) = probe::unavailable(mode) {
            skipped.push(NotAvailable::here(mode.name(), reason));
            continue;
        }
        for &c in &args.connections {
            points.push((mode, Via::Direct, 1, c));
            for &n in &backends {
                for &v in &vias {
                    points.push((mode, v, n, c));
                }
            }
        }
    }
    let mut progress = crate::progress::Progress::new((points.len() * args.repeat) as u64);
    let lab = if modes.contains(&Mode::Bridge) && probe::unavailable(Mode::Bridge).is_none() {
        Some(
            crate::topology::KernelLab::build(Mode::Bridge, most, 1500)
                .context("building the bridge")?,
        )
    } else {
        None
    };
    let mut rows = Vec::new();
    for repeat in 0..args.repeat {
        for &(mode, via, n, connections) in &points {
            stop.check()?;
            let p = ServicePoint {
                via,
                backends: n,
                connections,
                path: args.path.clone(),
                duration: args.duration,
                warmup: args.warmup,
                repeat,
            };
            let what = format!(
                "{} {}, {n} backends, {connections} connections",
                mode.name(),
                via.name()
            );
            progress.start(&what);
            let r = match (mode, &lab) {
                (Mode::Bridge, Some(l)) => svc::kernel(&exe, l, &p, &stop),
                _ => svc::docknet(&exe, &p, &stop),
            };
            match r {
                Ok(row) => {
                    progress.done(&format!(
                        "  {what}: {:.0} req/s, p50 {:.1} us, p99 {:.1} us",
                        row.req_per_s.unwrap_or(0.0),
                        row.p50_us.unwrap_or(0.0),
                        row.p99_us.unwrap_or(0.0)
                    ));
                    rows.push(row);
                }
                Err(e) => {
                    if stop.raised() {
                        return Err(e);
                    }
                    progress.done(&format!("  {what}: failed: {e:#}"));
                    skipped.push(NotAvailable::failed(what, 1500, &e));
                }
            }
        }
    }
    drop(lab);
    progress.finish();
    let res = http_results(args, rows, skipped, svc::table, svc::targets);
    publish(
        &res,
        args.json.as_ref(),
        args.report.as_ref(),
        "tcp-service",
        || {
            format!(
                "# Services\n\nCommand: `{}`\n\n```text\n{}```\n\n{}",
                res.env.command,
                svc::table(&res.summary),
                res.targets
                    .iter()
                    .map(|t| format!("- {t}\n"))
                    .collect::<String>()
            )
        },
    )?;
    Ok(())
}

/// Runs `docknet bench http`.
pub fn run_http(args: HttpArgs) -> Result<()> {
    if args.service {
        if args.placement != [crate::plan::PlacementKind::Pinned] {
            bail!("--placement applies to the single server; services run unpinned");
        }
        return run_service(&args);
    }
    if let Some(b) = args.backends.clone() {
        if args.placement != [crate::plan::PlacementKind::Pinned] {
            bail!(
                "--placement applies to the single server; the web cluster places its own parties"
            );
        }
        return run_cluster(&args, &b);
    }
    use crate::row::Tool;
    use crate::workload::http::{self as h, HttpNet, HttpPoint, HttpTiming, SERVERS};
    let modes = args
        .modes
        .iter()
        .map(|m| m.parse::<Mode>())
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(m) = modes
        .iter()
        .find(|m| !m.topologies().contains(&Topology::OneHost) || **m == Mode::Sriov)
    {
        bail!("{m}: bench http runs on one-host modes");
    }
    let servers: Vec<&'static str> = args
        .server
        .iter()
        .map(|s| {
            SERVERS.into_iter().find(|k| k == s).ok_or_else(|| {
                anyhow::anyhow!("--server: {s:?} is not one of {}", SERVERS.join(", "))
            })
        })
        .collect::<Result<_>>()?;
    if args.connections.is_empty() || args.connections.iter().any(|c| !(1..=10_000).contains(c)) {
        bail!("--connections takes numbers from 1 to 10000");
    }
    if args.duration <= 0.0 || args.warmup < 0.0 || args.repeat == 0 {
        bail!("--duration must be positive, --warmup not negative, --repeat at least 1");
    }
    if !args.path.starts_with('/')
        || args.path.len() > 1024
        || args.path.contains(char::is_whitespace)
    {
        bail!("--path must start with / and hold no spaces");
    }
    let mut placements = args.placement.clone();
    placements.dedup();
    if placements.is_empty() || placements.contains(&crate::plan::PlacementKind::OneCore) {
        bail!("--placement for bench http takes pinned, unpinned or both (one-core is for rr and stream)");
    }
    need_root("docknet bench http")?;
    let stop = Stop::on_signals()?;
    let exe = std::env::current_exe()?;
    h::beside(&exe, "docknet-httpd")?;
    h::beside(&exe, "docknet-load")?;
    let timing = HttpTiming {
        duration: args.duration,
        warmup: args.warmup,
        path: args.path.clone(),
    };
    // the points of every mode, decided first (the progress bar's length)
    let points_of = |m: Mode| -> Vec<HttpPoint> {
        let mut v = Vec::new();
        for repeat in 0..args.repeat {
            for &connections in &args.connections {
                for &server in &servers {
                    let tools: &[Tool] = match (m.is_kernel(), server) {
                        (true, "docknet-httpd") => &[Tool::DocknetLoad, Tool::Wrk],
                        (true, _) => &[Tool::Wrk],
                        // unmodified nginx and wrk under the preload library
                        (false, "nginx") if m.is_preload() => &[Tool::Wrk],
                        (false, "docknet-httpd") if !m.is_preload() => &[Tool::DocknetLoad],
                        (false, _) => &[],
                    };
                    for &tool in tools {
                        v.push(HttpPoint {
                            server,
                            tool,
                            connections,
                            repeat,
                        });
                    }
                }
            }
        }
        v
    };
    let total: usize = modes.iter().map(|m| points_of(*m).len()).sum::<usize>() * placements.len();
    let mut progress = crate::progress::Progress::new(total as u64);
    let (mut rows, mut skipped) = (Vec::new(), Vec::new());
    let mut note =
        |progress: &mut crate::progress::Progress, mode: &str, status, reason: String| {
            let na = NotAvailable::new(mode, status, reason);
            progress.line(&na.line());
            skipped.push(na);
        };
    let runs = modes
        .iter()
        .flat_map(|&m| placements.iter().map(move |&k| (m, k)));
    for (mode, kind) in runs {
        stop.check()?;
        let points = points_of(mode);
        // one-core is refused above
        let pl = h::placement(mode, kind == crate::plan::PlacementKind::Unpinned);
        if mode.is_docknet()
            && !mode.is_preload()
            && servers.contains(&"nginx")
            && kind == placements[0]
        {
            note(
                &mut progress,
                &format!("{mode} (nginx)"),
                Status::NotAvailable,
                "nginx is an unmodified program: on DockNet it runs in the preload modes \
                 (docknet-preload, docknet-fc-preload)"
                    .into(),
            );
        }
        if let Some(why) = probe::unavailable(mode) {
            progress.skip(points.len() as u64);
            note(&mut progress, mode.name(), Status::NotAvailable, why);
            continue;
        }
        let built: Result<(
            Option<crate::topology::KernelLab>,
            Option<crate::topology::DocknetLab>,
        )> = match &pl.daemon {
            Some(setup) => crate::topology::DocknetLab::build(&exe, mode, setup, 1, 1500)
                .map(|l| (None, Some(l))),
            None => crate::topology::KernelLab::build(mode, 1, 1500).map(|l| (Some(l), None)),
        };
        let (kl, dl) = match built {
            Ok(x) => x,
            Err(e) => {
                progress.skip(points.len() as u64);
                note(
                    &mut progress,
                    mode.name(),
                    Status::Skipped,
                    format!("building it failed: {e:#}"),
                );
                continue;
            }
        };
        let net = match (&kl, &dl) {
            (Some(k), _) => HttpNet::Kernel(k),
            (_, Some(d)) => HttpNet::Docknet(d),
            _ => unreachable!("one of them is built"),
        };
        for pt in points {
            stop.check()?;
            let what = format!(
                "{mode} [{}] {} ({}) {} conns",
                pl.cores, pt.server, pt.tool, pt.connections
            );
            progress.start(&what);
            let missing = match (pt.server, pt.tool) {
                ("nginx", _) if !h::have("nginx") => Some("no nginx (apt-get install nginx-light)"),
                (_, Tool::Wrk) if !h::have("wrk") => Some("no wrk (apt-get install wrk)"),
                _ => None,
            };
            if let Some(why) = missing {
                progress.done(&format!("  {what}: not available: {why}"));
                note(
                    &mut progress,
                    &format!("{mode} ({} {})", pt.server, pt.tool),
                    Status::NotAvailable,
                    why.into(),
                );
                continue;
            }
            match h::measure(&exe, &net, mode, &pl, &pt, &timing, &stop, &mut progress) {
                Ok(r) => {
                    progress.done(&format!(
                        "  {what}: {:.0} req/s, p50 {:.1} us, p99 {:.1} us",
                        r.req_per_s.unwrap_or(0.0),
                        r.p50_us.unwrap_or(0.0),
                        r.p99_us.unwrap_or(0.0)
                    ));
                    rows.push(r);
                }
                Err(e) => {
                    if stop.raised() {
                        return Err(e);
                    }
                    progress.done(&format!("  {what}: failed: {e:#}"));
                    note(
                        &mut progress,
                        &format!("{mode} ({} {})", pt.server, pt.tool),
                        Status::Skipped,
                        format!("failed: {e:#}"),
                    );
                }
            }
        }
    }
    progress.finish();
    let res = http_results(
        &args,
        rows,
        skipped,
        crate::http::table,
        crate::http::targets,
    );
    publish(
        &res,
        args.json.as_ref(),
        args.report.as_ref(),
        "tcp-http",
        || markdown::http(&res),
    )?;
    Ok(())
}

/// Runs `docknet bench nat`.
pub fn run_nat(args: crate::workload::nat::NatArgs) -> Result<()> {
    if args.rounds == 0 || args.duration <= 0.0 || args.warmup < 0.0 {
        bail!("--rounds must be at least 1, --duration positive, --warmup not negative");
    }
    need_root("docknet bench nat")?;
    let stop = Stop::on_signals()?;
    let mut progress = crate::progress::Progress::new(2 * args.rounds as u64);
    let rows = crate::workload::nat::measure(&args, &stop, &mut progress)?;
    progress.finish();
    let targets = lines(&crate::http::nat_targets(&rows));
    print!("{}", crate::http::nat_table(&rows));
    for t in &targets {
        println!("target: {t}");
    }
    let mut env = Env::here(args.duration, args.warmup, args.rounds);
    env.workload = Some(Workload::Nat);
    env.topology = Some(Topology::OneHost);
    let res = Results {
        env,
        results: rows.clone(),
        summary: rows,
        ratios: Vec::new(),
        targets,
        not_available: Vec::new(),
    };
    publish(
        &res,
        args.json.as_ref(),
        args.report.as_ref(),
        "tcp-nat",
        || {
            format!(
            "# NAT load balancer: the latency it adds\n\nCommand: `{}`\n\n```text\n{}```\n\n{}\n",
            res.env.command,
            crate::http::nat_table(&res.summary),
            res.targets.iter().map(|t| format!("- {t}\n")).collect::<String>()
        )
        },
    )?;
    Ok(())
}
