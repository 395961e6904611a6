//! The report's "Seed studies" section: each study's question, its published figures where
//! they compare, and this machine's beside them, with the command that regenerates each.

use super::charts::{seed_charts, Chart};
use crate::mode::Mode;
use crate::row::{Row, Workload};

/// The seed studies' rows and figures.
#[derive(Debug)]
pub struct SeedSection {
    /// Start-up and CPU-quota rows.
    pub rows: Vec<Row>,
    /// The bridge's (and DockNet's) fixed cost from the rr rows of the same report.
    pub fixed_cost: Vec<String>,
    /// The CPU service demand of the rr and stream rows, as a text table.
    pub demand: String,
    /// The figures.
    pub charts: Vec<Chart>,
}

impl SeedSection {
    /// The section from the report's rows (`None`: no seed study and no rr rows).
    pub fn of(seeds: Vec<Row>, rr: &[Row]) -> Option<SeedSection> {
        let fixed_cost = fixed_cost(rr);
        let demand = demand_table(rr);
        if seeds.is_empty() && fixed_cost.is_empty() && demand.is_empty() {
            return None;
        }
        Some(SeedSection {
            charts: seed_charts(&seeds),
            rows: seeds,
            fixed_cost,
            demand,
        })
    }

    /// The section as Markdown (the HTML page shows the same text, tables and figures).
    pub fn markdown(&self) -> String {
        let mut m = String::from("\n# Seed studies\n\n");
        let chain: Vec<Row> = self
            .rows
            .iter()
            .filter(|r| r.workload == Workload::Chain)
            .cloned()
            .collect();
        m += CHAIN_TEXT;
        if chain.is_empty() {
            m += "\n\nNot measured in these results.\n";
        } else {
            m += &format!(
                "\n\n```text\n{}```\n\n",
                crate::workload::chain::table(&chain)
            );
            for l in crate::workload::chain::ratios(&chain) {
                m += &format!("- {l}\n");
            }
        }
        m += "\n";
        let startup: Vec<Row> = self
            .rows
            .iter()
            .filter(|r| r.workload == Workload::Startup)
            .cloned()
            .collect();
        m += STARTUP_TEXT;
        if startup.is_empty() {
            m += "\n\nNot measured in these results.\n";
        } else {
            m += &format!(
                "\n\n```text\n{}```\n",
                crate::workload::startup::table(&startup)
            );
        }
        let quota: Vec<Row> = self
            .rows
            .iter()
            .filter(|r| r.workload == Workload::Cpuquota)
            .cloned()
            .collect();
        m += "\n";
        m += QUOTA_TEXT;
        if quota.is_empty() {
            m += "\n\nNot measured in these results.\n";
        } else {
            m += &format!(
                "\n\n```text\n{}```\n",
                crate::workload::cpuquota::table(&quota)
            );
        }
        m += "\n";
        m += FIXED_TEXT;
        if self.fixed_cost.is_empty() {
            m += "\n\nNo rr rows of bridge or DockNet beside loopback in these results.\n";
        } else {
            m += "\n\n";
            for l in &self.fixed_cost {
                m += &format!("- {l}\n");
            }
        }
        m += "\n";
        m += DEMAND_TEXT;
        if self.demand.is_empty() {
            m += "\n\nNo rr or stream rows with the machine's CPU in these results.\n";
        } else {
            m += &format!("\n\n```text\n{}```\n", self.demand);
        }
        m += "\n";
        m += MISSING_TEXT;
        m += "\n";
        m
    }
}

impl SeedSection {
    /// The section as HTML: the same text and tables as [`SeedSection::markdown`], and the
    /// figures.
    pub fn html(&self) -> String {
        use super::html::esc;
        let mut h = String::from("<h2>Seed studies</h2>\n");
        for block in self.markdown().split("\n## ").skip(1) {
            let (head, body) = block.split_once("\n\n").unwrap_or((block, ""));
            h += &format!("<h3>{}</h3>\n", esc(head.trim()));
            for part in body.split("```").enumerate() {
                let (i, text) = part;
                let text = text.strip_prefix("text\n").unwrap_or(text).trim();
                if text.is_empty() {
                    continue;
                }
                if i % 2 == 1 {
                    h += &format!("<pre>{}</pre>\n", esc(text));
                } else {
                    h += &format!("<p>{}</p>\n", esc(text).replace('\n', "<br>\n"));
                }
            }
        }
        for c in &self.charts {
            h += &super::html::figure(c);
        }
        h
    }
}

/// Suo et al.'s start-up question, their figures and the command.
pub const STARTUP_TEXT: &str = "## Start-up time (Suo et al., network start-up table)\n\n\
    How long from creating a container's network until it answers? Published (Docker, create \
    to answering a ping): bridge 663 ms, container 239 ms, NAT 675 ms, Docker overlay 10,980 ms. \
    Ours: create to the first answered TCP connect (CONNECT) and ping (PING), p50/p99 over the \
    repetitions; CREATE is the create step alone; LAUNCH how DockNet's programs started. \
    Regenerate: `docknet bench startup --reps 20 --report DIR` and `docknet bench startup \
    --topology two-host --reps 20 --report DIR` (NAT and the overlays across two hosts).";

/// The thesis's CPU-quota question, its figures and the command.
pub const QUOTA_TEXT: &str = "## Tail latency under a CPU quota (thesis, Table 3.2 and Fig. \
    3.3)\n\nDoes a cgroup CPU quota turn into tail latency? Published (Thrift server, \
    period 10000 us; round trip mean / median / p99 / count over 1 ms of 1,000,000 requests): \
    quota 1000: 1035 / 307 / 7556 us / 104,996; 2000: 489 / 281 / 4765 / 50,187; 3000: 292 / \
    259 / 1741 / 14,273; 4000: 258 / 253 / 331 / 39; 10000: 263 / 255 / 333 / 0. Ours: dnperf \
    rr (64 B, back to back) with the server under the quota; the server spends a few \
    microseconds per request, not the Thrift server's ~80, so the quota binds at lower \
    fractions. Regenerate: `docknet bench cpuquota --report DIR`.";

/// The thesis's fixed-cost claim and the command.
pub const FIXED_TEXT: &str = "## The bridge's fixed cost (thesis, Sect. 3.5)\n\nDoes the \
    bridge add a fixed latency rather than a percentage? One-way rr p50 of the bridge minus \
    loopback's (the host's own stack) by message size, and the same for DockNet, from the rr \
    rows of this report. Published: the bridge's latency within 110% of net=host's, the \
    difference the same at every size. Regenerate: `docknet bench rr --modes \
    loopback,bridge,docknet,docknet-fc --sizes 64,1024,16384,65536 --report DIR`.";

/// Suo et al.'s service-demand question and the command.
pub const DEMAND_TEXT: &str = "## CPU service demand (Suo et al.)\n\nWhat does a unit of \
    work cost the machine's CPU per mode? Published: the overlay costs most, mostly in \
    softirq. Ours: the whole machine's CPU (every process, the daemon and the kernel's \
    softirq work) from /proc/stat over the middle 80% of each measured window, in CPU \
    seconds per 1000 transactions (rr) and per GB delivered (stream), split by kind; a pairs \
    point (LOAD `Np rr`, `Np st`) has both, from its ping-pong and its stream phase with N \
    pairs at once; tick-sampled, so short windows are coarse. Regenerate: `docknet bench \
    rr|stream --modes loopback,bridge,docknet,docknet-fc --report DIR`, and `docknet bench \
    pairs` for the pairs points.";

/// What of the seed studies is not reproduced yet.
pub const MISSING_TEXT: &str = "## Not reproduced as published\n\nKratzke's overlay was weave's \
    userspace router in a container; the lab's overlay is the kernel's VXLAN, and its \
    encryption OpenVPN's (weave Net is not a Debian package). Suo et al. timed Docker creating \
    a container; the lab times the container's network and its programs' start on hosts that \
    exist (their start-up of a host's Docker engine and overlay store is not in it).";

/// Kratzke's chain question, his figures and the command.
pub const CHAIN_TEXT: &str = "## HTTP chain (Kratzke, Fig. 2-3, Eq. 1-5)\n\nHow much of \
    the transfer rate of an HTTP service chain does each network layer cost? Published \
    (apachebench -> ping -> pong, 10 B to 500 kB): container/reference ~0.8-0.9, overlay \
    (weave)/container 0.6 down to 0.25, encryption/overlay ~0.9. Ours: transfer rate of \
    payload at the siege, and the ratio to the reference: on one host loopback (the three \
    services in one namespace); on two hosts (siege and pong on host A, ping on host B) the \
    services as processes on the hosts, beside routed containers, the VXLAN overlay and the \
    overlay through an OpenVPN tunnel. The modes take turns at each size (`--repeat` runs, 3 \
    by default), and a row is the median of its runs. Regenerate: `docknet bench chain --report DIR` and \
    `docknet bench chain --topology two-host --report DIR`.";

/// The service demand of every dnperf rr and stream row that has one, as a text table.
pub fn demand_table(rows: &[Row]) -> String {
    let mut s = String::new();
    for r in rows.iter().filter(|r| r.tool == crate::row::Tool::Dnperf) {
        // rr and stream points; a pairs point has both (its ping-pong and its stream phase)
        let cells: Vec<(String, &str, _)> = match r.workload {
            Workload::Rr => r
                .cpu_s_per_kreq
                .iter()
                .map(|d| ("rr".into(), "s/1000 tx", d))
                .collect(),
            Workload::Stream => r
                .cpu_s_per_gb
                .iter()
                .map(|d| ("stream".into(), "s/GB", d))
                .collect(),
            Workload::Pairs => {
                let n = r.pairs.unwrap_or(0);
                let rr = r
                    .cpu_s_per_kreq
                    .iter()
                    .map(|d| (format!("{n}p rr"), "s/1000 tx", d));
                let st = r
                    .cpu_s_per_gb
                    .iter()
                    .map(|d| (format!("{n}p st"), "s/GB", d));
                rr.chain(st).collect()
            }
            _ => continue,
        };
        for (load, unit, d) in cells {
            if s.is_empty() {
                s = format!(
                    "{:<11} {:<9} {:<9} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}\n",
                    "MODE", "CORES", "LOAD", "SIZE", "UNIT", "TOTAL", "USER", "SYSTEM", "SOFTIRQ"
                );
            }
            let g = |k: &str| d.get(k).copied().unwrap_or(0.0);
            s += &format!(
                "{:<11} {:<9} {:<9} {:>7} {:>10} {:>9.4} {:>9.4} {:>9.4} {:>9.4}\n",
                r.mode.name(),
                r.cores,
                load,
                r.size,
                unit,
                g("total"),
                g("user"),
                g("system"),
                g("softirq")
            );
        }
    }
    s
}

/// rr p50 of `mode` minus loopback's, by size, as lines.
pub fn fixed_cost(rr: &[Row]) -> Vec<String> {
    let p50 = |mode: Mode, size: usize| {
        let v: Vec<f64> = rr
            .iter()
            .filter(|r| {
                r.workload == Workload::Rr
                    && r.mode == mode
                    && r.size == size
                    && r.tool == crate::row::Tool::Dnperf
            })
            .filter_map(|r| r.p50_us)
            .collect();
        // several placements: the best (lowest) median of each mode
        v.into_iter().min_by(f64::total_cmp)
    };
    let mut sizes: Vec<usize> = rr
        .iter()
        .filter(|r| r.workload == Workload::Rr && r.mode == Mode::Loopback)
        .map(|r| r.size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = Vec::new();
    for mode in [Mode::Bridge, Mode::Veth, Mode::Docknet, Mode::DocknetFc] {
        let cells: Vec<String> = sizes
            .iter()
            .filter_map(|&s| {
                let (lo, m) = (p50(Mode::Loopback, s)?, p50(mode, s)?);
                Some(format!(
                    "{s} B: {:+.2} us ({:.0}% of loopback)",
                    m - lo,
                    m / lo * 100.0
                ))
            })
            .collect();
        if !cells.is_empty() {
            out.push(format!(
                "{mode} minus loopback (one-way p50): {}",
                cells.join("; ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::Tool;

    #[test]
    fn the_fixed_cost_is_the_difference_to_loopback_by_size() {
        let r = |mode, size, p50| Row {
            p50_us: Some(p50),
            ..Row::new(mode, Tool::Dnperf, Workload::Rr, size)
        };
        let rows = vec![
            r(Mode::Loopback, 64, 5.0),
            r(Mode::Loopback, 1024, 6.0),
            r(Mode::Bridge, 64, 8.0),
            r(Mode::Bridge, 1024, 9.0),
            r(Mode::Bridge, 1024, 12.0),
        ];
        let l = fixed_cost(&rows);
        assert_eq!(l.len(), 1);
        assert!(l[0].contains("64 B: +3.00 us (160% of loopback)"), "{l:?}");
        assert!(
            l[0].contains("1024 B: +3.00 us (150% of loopback)"),
            "{l:?}"
        );
        assert!(SeedSection::of(Vec::new(), &[]).is_none());
        let s = SeedSection::of(Vec::new(), &rows).unwrap();
        assert!(s.markdown().contains("# Seed studies") && s.charts.is_empty());
    }
}
