//! The one result row of the lab, and the results file that carries rows.
//!
//! Written by `docknet bench`, read back by `docknet report`: the same types both ways. Reading
//! is lenient, because a results file is untrusted input: a row without a known mode, workload
//! or size is dropped (not the file), and a figure that is missing, of the wrong type,
//! negative or not finite reads as "not measured". The schema is `docs/results.schema.json`.

use crate::mode::{Mode, Topology};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// What a row measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Ping-pong of fixed-size messages: latency.
    Rr,
    /// One-way stream of fixed-size writes: goodput.
    Stream,
    /// N pairs at once: aggregate goodput, per-pair latency, memory per pair.
    Pairs,
    /// Rate limits over time: flows' throughput in 100 ms bins while limits change.
    Rate,
    /// An idle host: CPU of a daemon and N waiting containers, and the first packet after an
    /// idle second.
    Idle,
    /// HTTP requests under a load generator: requests/s and latency (the paper's Fig. 11).
    Http,
    /// The one-way latency a NAT load balancer adds.
    Nat,
    /// Kratzke's HTTP chain: a load generator -> a forwarder -> a server, transfer rate by
    /// message size.
    Chain,
    /// Start-up: from creating a container's network until it answers a TCP connect and a
    /// ping (Suo et al.).
    Startup,
    /// Request/response round trips to a server under a cgroup CPU quota (the thesis's
    /// Table 3.2).
    Cpuquota,
}

impl Workload {
    /// The name used in results and file names.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Rr => "rr",
            Workload::Stream => "stream",
            Workload::Pairs => "pairs",
            Workload::Rate => "rate",
            Workload::Idle => "idle",
            Workload::Http => "http",
            Workload::Nat => "nat",
            Workload::Chain => "chain",
            Workload::Startup => "startup",
            Workload::Cpuquota => "cpuquota",
        }
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The program that measured a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tool {
    /// `dnperf`: one code path over kernel and DockLib sockets (every figure of the report).
    Dnperf,
    /// sockperf ping-pong (cross-check of rr on kernel modes).
    Sockperf,
    /// iperf3 (cross-check of stream on kernel modes).
    Iperf3,
    /// The raw-frame peer of `docknet raw bench` (no TCP).
    RawPeer,
    /// `docknet-load`: the project's HTTP load generator (kernel and DockLib sockets).
    DocknetLoad,
    /// `wrk` (Debian's), the HTTP load generator people use.
    Wrk,
}

impl Tool {
    /// The name used in results.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Dnperf => "dnperf",
            Tool::Sockperf => "sockperf",
            Tool::Iperf3 => "iperf3",
            Tool::RawPeer => "raw-peer",
            Tool::DocknetLoad => "docknet-load",
            Tool::Wrk => "wrk",
        }
    }
}

impl std::fmt::Display for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn default_tool() -> Tool {
    Tool::Dnperf
}
fn default_cores() -> String {
    "-".into()
}
fn default_true() -> bool {
    true
}

/// A figure: any finite, non-negative number, else "not measured".
fn figure<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(v.as_f64().filter(|x| x.is_finite() && *x >= 0.0))
}

/// Named figures (at most 16 names of at most 64 bytes; other entries are dropped).
fn parts<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<std::collections::BTreeMap<String, f64>>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(v.as_object().map(|o| {
        o.iter()
            .filter(|(k, _)| k.len() <= 64)
            .filter_map(|(k, v)| {
                Some((
                    k.clone(),
                    v.as_f64().filter(|x| x.is_finite() && *x >= 0.0)?,
                ))
            })
            .take(16)
            .collect()
    }))
}

/// A finite number that may be negative (a difference of two figures).
fn signed<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(v.as_f64().filter(|x| x.is_finite()))
}

fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(Value::deserialize(d)?.as_u64())
}

fn small<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    Ok(count(d)?.and_then(|n| T::try_from(n).ok()))
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Value::deserialize(d)?.as_str().map(String::from))
}

/// Histogram buckets `[ns, count]`: malformed buckets, zero values and zero counts are dropped.
fn buckets<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<[u64; 2]>>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(v.as_array().map(|a| {
        a.iter()
            .filter_map(|b| Some([b.get(0)?.as_u64()?, b.get(1)?.as_u64()?]))
            .filter(|[ns, c]| *ns > 0 && *c > 0)
            .collect()
    }))
}

/// One measured point (or, in a summary, one point over its runs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The network mode measured.
    pub mode: Mode,
    /// One host, or two hosts joined by a wire (missing: one host).
    #[serde(default)]
    pub topology: Topology,
    /// The program that measured.
    #[serde(default = "default_tool")]
    pub tool: Tool,
    /// Where each party ran, in words.
    #[serde(default)]
    pub placement: String,
    /// Short form of the placement: `c1 s1` (client core 1, server core 1), `m0` (daemon master
    /// core 0), `-` (unpinned).
    #[serde(default = "default_cores")]
    pub cores: String,
    /// What was measured.
    pub workload: Workload,
    /// Message size in bytes (raw bench: whole frame).
    #[serde(rename = "msg_size")]
    pub size: usize,
    /// MTU of the link, where known.
    #[serde(default, deserialize_with = "small")]
    pub mtu: Option<u32>,
    /// Run index (in a summary: the number of runs).
    #[serde(default)]
    pub repeat: usize,
    /// One-way latency p50 (µs).
    #[serde(default, deserialize_with = "figure")]
    pub p50_us: Option<f64>,
    /// One-way latency p99 (µs).
    #[serde(default, deserialize_with = "figure")]
    pub p99_us: Option<f64>,
    /// One-way latency p99.9 (µs).
    #[serde(default, deserialize_with = "figure")]
    pub p999_us: Option<f64>,
    /// Mean one-way latency (µs).
    #[serde(default, deserialize_with = "figure")]
    pub mean_us: Option<f64>,
    /// RTT/2 median (µs).
    #[serde(default, deserialize_with = "figure")]
    pub half_rtt_p50_us: Option<f64>,
    /// Transactions per second (rr).
    #[serde(default, deserialize_with = "figure")]
    pub tps: Option<f64>,
    /// Goodput at the receiver (stream, pairs).
    #[serde(default, deserialize_with = "figure")]
    pub gbps: Option<f64>,
    /// Messages per second at the receiver.
    #[serde(default, deserialize_with = "figure")]
    pub msgs_per_s: Option<f64>,
    /// Client CPU seconds per operation.
    #[serde(default, deserialize_with = "figure")]
    pub cpu_s_per_op: Option<f64>,
    /// Raw frames the receiver did not get, or rr transactions given up.
    #[serde(default)]
    pub lost: u64,
    /// Whether every frame took the path being measured.
    #[serde(default = "default_true")]
    pub path_ok: bool,
    /// Concurrent pairs (pairs).
    #[serde(
        default,
        deserialize_with = "small",
        skip_serializing_if = "Option::is_none"
    )]
    pub pairs: Option<usize>,
    /// Memory per pair, KiB (pairs).
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub mem_kib_per_pair: Option<f64>,
    /// How evenly the pairs shared the machine in the ping-pong (pairs): Jain's index of their
    /// transactions per second, `(sum x)^2 / (n * sum x^2)`, 1 when every pair did as many, 1/n
    /// when one did them all. The latency percentiles are of all messages merged, so pairs that
    /// ran faster weigh more in them.
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub pair_fairness: Option<f64>,
    /// The slowest pair's transactions per second over the mean pair's (pairs).
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub slowest_pair: Option<f64>,
    /// Who built the topology: `cni`, `ip`, `ovs-vsctl`, `docknet`.
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub builder: Option<String>,
    /// HTTP: the server (`docknet-httpd`, `nginx`).
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub server: Option<String>,
    /// HTTP: answers per second.
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub req_per_s: Option<f64>,
    /// HTTP: the load generator's connections.
    #[serde(
        default,
        deserialize_with = "small",
        skip_serializing_if = "Option::is_none"
    )]
    pub connections: Option<usize>,
    /// HTTP: errors the load generator counted (any kind).
    #[serde(
        default,
        deserialize_with = "small",
        skip_serializing_if = "Option::is_none"
    )]
    pub errors: Option<u64>,
    /// Web cluster: backends behind the balancer.
    #[serde(
        default,
        deserialize_with = "small",
        skip_serializing_if = "Option::is_none"
    )]
    pub backends: Option<usize>,
    /// Web cluster: CPU microseconds each request costs a backend (`/work/US`).
    #[serde(
        default,
        deserialize_with = "small",
        skip_serializing_if = "Option::is_none"
    )]
    pub work_us: Option<u64>,
    /// Web cluster: CPU microseconds per request by component (load generator, balancer,
    /// backends, daemon, kernel and other).
    #[serde(
        default,
        deserialize_with = "parts",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_us_per_req: Option<std::collections::BTreeMap<String, f64>>,
    /// NAT: the direct path's one-way p50 (us), measured in the same run.
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub direct_p50_us: Option<f64>,
    /// NAT: one-way p50 through the balancer minus direct (us).
    #[serde(
        default,
        deserialize_with = "signed",
        skip_serializing_if = "Option::is_none"
    )]
    pub added_p50_us: Option<f64>,
    /// NAT: the same at p99 (us).
    #[serde(
        default,
        deserialize_with = "signed",
        skip_serializing_if = "Option::is_none"
    )]
    pub added_p99_us: Option<f64>,
    /// Idle: containers waiting, each a DockLib server.
    #[serde(
        default,
        deserialize_with = "small",
        skip_serializing_if = "Option::is_none"
    )]
    pub containers: Option<usize>,
    /// Idle: CPU of the daemon and every container together, percent of one core.
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_pct_of_core: Option<f64>,
    /// Pairs, idle and chain on DockNet: the peers' idle policy (`spin`, `adaptive`,
    /// `adaptive:SPIN_US`, `adaptive:SPIN_US:YIELD_US`, `block`).
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub idle: Option<String>,
    /// Chain on DockNet: the daemon's idle policy.
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub daemon_idle: Option<String>,
    /// Rate: the experiment (`steps`, `none`, `udp-limited`, `both-limited`).
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub scenario: Option<String>,
    /// Rate: the flow (`tcp`, `udp`).
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub flow: Option<String>,
    /// Rate: start of the bin, seconds from the experiment's start.
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub t_s: Option<f64>,
    /// Rate: the flow's limit during the bin, bits/s (`null`: unlimited).
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub limit_bps: Option<f64>,
    /// Rate: the part of the experiment (`unlimited`, `80%`, `udp`, ...).
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub phase: Option<String>,
    /// Rate: cores busy during the bin with the experiment's processes (the daemon, the
    /// containers, ksoftirqd), from their tasks' schedstat.
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_cores: Option<f64>,
    /// Stream: the whole machine's CPU seconds per GB delivered, by kind (`user`, `system`,
    /// `irq`, `softirq`) and in all (`total`), from `/proc/stat` over the measured window
    /// (Suo et al.'s service demand).
    #[serde(
        default,
        deserialize_with = "parts",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_s_per_gb: Option<std::collections::BTreeMap<String, f64>>,
    /// Rr: the whole machine's CPU seconds per 1000 transactions, by kind, as `cpu_s_per_gb`.
    #[serde(
        default,
        deserialize_with = "parts",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_s_per_kreq: Option<std::collections::BTreeMap<String, f64>>,
    /// Rr, stream and chain: the machine's cross-core handoff cost just before the point,
    /// in microseconds to write 32 KiB that another core has just read (`crate::xcore`). On a
    /// VM it moves with the host's placement of the vCPUs, and the daemon path with it.
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub xcore_us: Option<f64>,
    /// Chain: payload bits per second through the chain, at the load generator.
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub transfer_bps: Option<f64>,
    /// Start-up: create to the first answered TCP connect, median over the repetitions (ms).
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub p50_ms: Option<f64>,
    /// Start-up: the same, 99th percentile (ms).
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub p99_ms: Option<f64>,
    /// Start-up: create to the first answered ping, median (ms).
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub ping_p50_ms: Option<f64>,
    /// Start-up: create to the first answered ping, 99th percentile (ms).
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub ping_p99_ms: Option<f64>,
    /// Start-up: the create step alone (namespaces and CNI ADD, or pipe create), median (ms).
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub create_p50_ms: Option<f64>,
    /// Start-up: how the containers' programs were started: `netns` (`ip netns exec` into
    /// namespaces made beforehand) or `run` (`docknet run`, a container with its walls).
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub launch: Option<String>,
    /// CPU quota: the server's quota per 10000 us period (us).
    #[serde(
        default,
        deserialize_with = "count",
        skip_serializing_if = "Option::is_none"
    )]
    pub quota_us: Option<u64>,
    /// CPU quota: round trips longer than 1 ms.
    #[serde(
        default,
        deserialize_with = "count",
        skip_serializing_if = "Option::is_none"
    )]
    pub over_1ms: Option<u64>,
    /// CPU quota: round trips measured.
    #[serde(
        default,
        deserialize_with = "count",
        skip_serializing_if = "Option::is_none"
    )]
    pub samples: Option<u64>,
    /// One-way latency histogram as `[ns, count]` buckets (rr, pairs).
    #[serde(
        default,
        deserialize_with = "buckets",
        skip_serializing_if = "Option::is_none"
    )]
    pub one_way_hist: Option<Vec<[u64; 2]>>,
}

impl Row {
    /// A row with only its identity filled in.
    pub fn new(mode: Mode, tool: Tool, workload: Workload, size: usize) -> Row {
        Row {
            mode,
            topology: Topology::OneHost,
            tool,
            placement: String::new(),
            cores: default_cores(),
            workload,
            size,
            mtu: None,
            repeat: 0,
            p50_us: None,
            p99_us: None,
            p999_us: None,
            mean_us: None,
            half_rtt_p50_us: None,
            tps: None,
            gbps: None,
            msgs_per_s: None,
            cpu_s_per_op: None,
            lost: 0,
            path_ok: true,
            pairs: None,
            mem_kib_per_pair: None,
            pair_fairness: None,
            slowest_pair: None,
            builder: None,
            server: None,
            req_per_s: None,
            connections: None,
            errors: None,
            backends: None,
            work_us: None,
            cpu_us_per_req: None,
            direct_p50_us: None,
            added_p50_us: None,
            added_p99_us: None,
            containers: None,
            cpu_pct_of_core: None,
            idle: None,
            daemon_idle: None,
            scenario: None,
            flow: None,
            t_s: None,
            limit_bps: None,
            phase: None,
            cpu_cores: None,
            cpu_s_per_gb: None,
            cpu_s_per_kreq: None,
            xcore_us: None,
            transfer_bps: None,
            p50_ms: None,
            p99_ms: None,
            ping_p50_ms: None,
            ping_p99_ms: None,
            create_p50_ms: None,
            launch: None,
            quota_us: None,
            over_1ms: None,
            samples: None,
            one_way_hist: None,
        }
    }

    /// The series this row belongs to in a figure: mode, placement and tool.
    pub fn series(&self) -> String {
        let mut s = self.mode.name().to_string();
        // an HTTP run has one placement per mode: its server and generator say more
        if self.cores != "-" && self.server.is_none() {
            s += &format!(" [{}]", self.cores);
        }
        if let Some(srv) = &self.server {
            s += &format!(" {srv}");
        }
        if self.tool != Tool::Dnperf {
            s += &format!(" ({})", self.tool);
        }
        if let Some(i) = &self.idle {
            s += &format!(" {i}");
        }
        if let Some(l) = &self.launch {
            s += &format!(" ({l})");
        }
        s
    }

    /// Rows from a JSON array, dropping those that are not rows.
    pub fn parse_all(v: &Value) -> Vec<Row> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|r| serde_json::from_value(r.clone()).ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Where and how a run happened: written with every results file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Env {
    /// Kernel release.
    #[serde(default, deserialize_with = "text")]
    pub kernel: Option<String>,
    /// Machine (`x86_64`, ...).
    #[serde(default, deserialize_with = "text")]
    pub machine: Option<String>,
    /// Cores.
    #[serde(default)]
    pub cores: usize,
    /// The command line.
    #[serde(default)]
    pub command: String,
    /// DockNet's version.
    #[serde(default)]
    pub version: String,
    /// Measured seconds per point.
    #[serde(default)]
    pub duration_s: f64,
    /// Warm-up seconds per point.
    #[serde(default)]
    pub warmup_s: f64,
    /// Runs per point.
    #[serde(default)]
    pub repeat: usize,
    /// Seconds since the epoch at the start.
    #[serde(default)]
    pub unix_time: u64,
    /// The workload of a `docknet bench` run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
    /// The MTUs of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtus: Option<Vec<u32>>,
    /// The topology of a `docknet bench` run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    /// Two hosts: the wire's shaping (`tc`), in words; `None`: unshaped.
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub wire: Option<String>,
    /// Two hosts: the wire's shaped rate in Gbps, if it was shaped.
    #[serde(
        default,
        deserialize_with = "figure",
        skip_serializing_if = "Option::is_none"
    )]
    pub wire_gbps: Option<f64>,
    /// The run measured over IPv6 (`docknet bench --ipv6`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ipv6: bool,
}

impl Env {
    /// This machine and command line, with the run's timing.
    pub fn here(duration_s: f64, warmup_s: f64, repeat: usize) -> Env {
        let uname = nix::sys::utsname::uname().ok();
        Env {
            kernel: uname
                .as_ref()
                .map(|u| u.release().to_string_lossy().into_owned()),
            machine: uname
                .as_ref()
                .map(|u| u.machine().to_string_lossy().into_owned()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            version: env!("CARGO_PKG_VERSION").into(),
            duration_s,
            warmup_s,
            repeat,
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            workload: None,
            mtus: None,
            topology: None,
            wire: None,
            wire_gbps: None,
            ipv6: false,
        }
    }
}

/// Whether a mode was left out because this machine cannot have it, or failed while running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    /// The machine lacks what the mode needs (a module, a NIC, a program).
    #[serde(rename = "not available here")]
    NotAvailable,
    /// It failed while being built or measured; the other modes still ran.
    #[serde(rename = "skipped")]
    Skipped,
}

impl Status {
    /// The text written into results and reports.
    pub fn text(self) -> &'static str {
        match self {
            Status::NotAvailable => "not available here",
            Status::Skipped => "skipped",
        }
    }
}

/// A mode (or a mode's cross-check tool) without figures, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotAvailable {
    /// The mode, or `mode (tool)` for a cross-check.
    pub mode: String,
    /// Where the mode was to run.
    #[serde(default)]
    pub topology: Topology,
    /// The MTU it was to run at, if it got that far.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Not available, or skipped.
    pub status: Status,
    /// Why, in one line.
    pub reason: String,
}

impl NotAvailable {
    /// `mode` (or `mode (tool)`) on one host, at no particular MTU.
    pub fn new(mode: impl Into<String>, status: Status, reason: impl Into<String>) -> NotAvailable {
        NotAvailable {
            mode: mode.into(),
            topology: Topology::OneHost,
            mtu: None,
            status,
            reason: reason.into(),
        }
    }

    /// A mode this machine cannot run (one host).
    pub fn here(mode: impl Into<String>, reason: impl Into<String>) -> NotAvailable {
        NotAvailable::new(mode, Status::NotAvailable, reason)
    }

    /// A mode tried at `mtu` that failed with `e` (one host).
    pub fn failed(mode: impl Into<String>, mtu: u32, e: &anyhow::Error) -> NotAvailable {
        NotAvailable {
            mtu: Some(mtu),
            ..NotAvailable::new(mode, Status::Skipped, format!("failed: {e:#}"))
        }
    }

    /// The same, where the mode was to run on `topology`.
    pub fn on(self, topology: Topology) -> NotAvailable {
        NotAvailable { topology, ..self }
    }

    /// "MODE (MTU m): status: reason" (with "two-host" for the two-host modes).
    pub fn line(&self) -> String {
        format!(
            "{}{}{}: {}: {}",
            self.mode,
            if self.topology == Topology::TwoHost {
                " (two-host)"
            } else {
                ""
            },
            self.mtu.map_or(String::new(), |m| format!(" (MTU {m})")),
            self.status.text(),
            self.reason
        )
    }
}

/// A results file: what `docknet bench --json FILE` writes and `docknet report` reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Results {
    /// The run's environment.
    pub env: Env,
    /// Every run of every point.
    pub results: Vec<Row>,
    /// One row per point over its runs.
    #[serde(default)]
    pub summary: Vec<Row>,
    /// Ratios between modes, as lines.
    #[serde(default)]
    pub ratios: Vec<String>,
    /// Targets with their verdicts, as lines.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Modes without figures, and why.
    #[serde(default)]
    pub not_available: Vec<NotAvailable>,
}

/// Why a results file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// Not JSON at all.
    #[error("not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    /// JSON, but not a results file.
    #[error("not a docknet bench results file (no \"results\" array)")]
    NotResults,
}

impl Results {
    /// Reads a results file leniently: rows that are not rows are dropped, figures that are
    /// not figures read as not measured, a broken `env` or `not_available` entry is ignored.
    pub fn parse(bytes: &[u8]) -> Result<Results, ResultsError> {
        let doc: Value = serde_json::from_slice(bytes)?;
        if !doc["results"].is_array() {
            return Err(ResultsError::NotResults);
        }
        let strings = |k: &str| -> Vec<String> {
            doc[k]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(Results {
            env: serde_json::from_value(doc["env"].clone()).unwrap_or_default(),
            results: Row::parse_all(&doc["results"]),
            summary: Row::parse_all(&doc["summary"]),
            ratios: strings("ratios"),
            targets: strings("targets"),
            not_available: doc["not_available"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| serde_json::from_value(x.clone()).ok())
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// The rows a report draws: the summary, or the results of a file without one.
    pub fn rows(&self) -> &[Row] {
        if self.summary.is_empty() {
            &self.results
        } else {
            &self.summary
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_round_trip_and_keep_their_field_names() {
        let mut r = Row::new(Mode::DocknetFc, Tool::Dnperf, Workload::Rr, 64);
        r.p50_us = Some(1.5);
        r.one_way_hist = Some(vec![[1000, 3]]);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["mode"], "docknet-fc");
        assert_eq!(v["msg_size"], 64);
        assert_eq!(v["workload"], "rr");
        assert_eq!(v["tool"], "dnperf");
        assert!(v.get("pairs").is_none(), "absent, not null");
        assert_eq!(serde_json::from_value::<Row>(v).unwrap(), r);
    }

    #[test]
    fn hostile_rows_are_dropped_or_cleaned_never_fatal() {
        let rows = Row::parse_all(&json!([
            {"mode": 3}, {"mode": "x", "workload": "rr", "msg_size": 1}, "junk",
            {"mode": "bridge", "workload": "rr"},
            {"mode": "bridge", "workload": "rr", "msg_size": 64, "p50_us": "fast",
             "p99_us": -1.0, "gbps": [1.0], "mtu": 99999999999u64, "pairs": -3,
             "one_way_hist": [[-1, 2], ["a", 1], [5], [0, 9], [7, 0], [1000, 4]]}
        ]));
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert!(r.p50_us.is_none() && r.p99_us.is_none() && r.gbps.is_none());
        assert!(r.mtu.is_none() && r.pairs.is_none());
        assert_eq!(r.one_way_hist.as_deref(), Some(&[[1000, 4]][..]));
        assert_eq!(r.tool, Tool::Dnperf);
        assert_eq!(r.cores, "-");
    }

    #[test]
    fn results_files_are_refused_or_read_leniently() {
        assert!(matches!(
            Results::parse(b"nope"),
            Err(ResultsError::NotJson(_))
        ));
        assert!(matches!(
            Results::parse(b"{}"),
            Err(ResultsError::NotResults)
        ));
        let r = Results::parse(
            br#"{"env": {"kernel": 5, "cores": "x"}, "results": [],
                "ratios": ["a", 1], "not_available": [{"mode": "ipvlan",
                "status": "not available here", "reason": "no module"}, {"mode": 1}]}"#,
        )
        .unwrap();
        assert_eq!(r.env, Env::default());
        assert_eq!(r.ratios, vec!["a".to_string()]);
        assert_eq!(r.not_available.len(), 1);
        assert_eq!(
            r.not_available[0].line(),
            "ipvlan: not available here: no module"
        );
    }
}
