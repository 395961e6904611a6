//! Markdown: the report (`report.md`), and the per-run summaries `docknet bench --report`
//! writes (`tcp-WORKLOAD.md`, `raw-bench.md`).

use super::table::{headline_cells, headline_columns, text, COLUMNS};
use super::Report;
use crate::row::{Results, Row};
use std::fmt::Write as _;

fn md_table<S: AsRef<str>>(heads: &[S], rows: impl Iterator<Item = Vec<String>>) -> String {
    let heads: Vec<&str> = heads.iter().map(|h| h.as_ref()).collect();
    let mut m = format!(
        "| {} |\n|{}\n",
        heads.join(" | "),
        "---|".repeat(heads.len())
    );
    for r in rows {
        let _ = writeln!(m, "| {} |", r.join(" | "));
    }
    m
}

/// The README's summary: the one-host opening table (at MTU 1500 when the run had several),
/// under a line that says when and by which commands it was measured. `None` without one-host
/// rr or stream rows.
pub fn readme_summary(r: &Report) -> Option<String> {
    let sec = r
        .sections
        .iter()
        .find(|s| s.topology == crate::mode::Topology::OneHost)?;
    let (_, lines) = sec
        .headlines
        .iter()
        .find(|(m, _)| m.is_none_or(|m| m == 1500))
        .or(sec.headlines.first())?;
    if lines.is_empty() {
        return None;
    }
    let mut commands: Vec<&str> = Vec::new();
    for e in &r.envs {
        if !e.command.is_empty() && !commands.contains(&e.command.as_str()) {
            commands.push(&e.command);
        }
    }
    let first = r.envs.iter().map(|e| e.unix_time).filter(|t| *t > 0).min();
    let date = first
        .and_then(|t| chrono::DateTime::from_timestamp(t as i64, 0))
        .map_or("an unknown date".into(), |d| {
            d.format("%Y-%m-%d").to_string()
        });
    let env = r.env();
    let mut m = format!(
        "Measured on {date} (kernel {}, {} cores, {} s per point after {} s warm-up, {} run(s) \
         per point) by:\n\n",
        env.kernel.as_deref().unwrap_or("?"),
        env.cores,
        env.duration_s,
        env.warmup_s,
        env.repeat
    );
    for c in commands {
        let _ = writeln!(m, "- `{c}`");
    }
    m += "\nEach mode's best figures over its placements (dnperf), against the bridge's best. \
          This block is written by `docknet report --readme README.md FILES`.\n\n";
    m += &md_table(
        &headline_columns(sec.topology.baseline()),
        lines.iter().map(|l| headline_cells(l).to_vec()),
    );
    Some(m)
}

/// `report.md`.
pub fn report(r: &Report) -> String {
    let env = r.env();
    let mut m = String::from("# DockNet lab report\n\n");
    let _ = writeln!(
        m,
        "Kernel {}, {} cores; {} s per point after {} s warm-up, {} run(s) per point.\n",
        env.kernel.as_deref().unwrap_or("?"),
        env.cores,
        env.duration_s,
        env.warmup_s,
        env.repeat
    );
    if let Some(w) = r.envs.iter().find_map(|e| e.wire.as_deref()) {
        let _ = writeln!(m, "Two hosts: the wire is shaped: {w}.\n");
    }
    if let Some(x) = r.xcore_line() {
        let _ = writeln!(m, "{x}\n");
    }
    let many = r.sections.len() > 1;
    for sec in &r.sections {
        let base = sec.topology.baseline();
        if many {
            let _ = writeln!(m, "# {}\n", sec.heading());
        }
        let _ = writeln!(
            m,
            "## Summary\n\nEach mode's best figures over its placements (dnperf), best against {base}'s best.\n"
        );
        for (mtu, lines) in &sec.headlines {
            if let Some(x) = mtu {
                let _ = writeln!(m, "MTU {x}:\n");
            }
            m += &md_table(
                &headline_columns(base),
                lines.iter().map(|l| headline_cells(l).to_vec()),
            );
            m += "\n";
        }
        if !sec.targets.is_empty() {
            m += "## Targets\n\n";
            for t in &sec.targets {
                let _ = writeln!(m, "- {}", t.line());
            }
        }
        for (wl, rows) in sec.tables() {
            let _ = writeln!(m, "\n## {wl} (ratio to {base})\n");
            m += &md_table(&COLUMNS, rows.into_iter());
        }
        m += "\n## Figures\n\n";
        for c in &sec.charts {
            let _ = writeln!(m, "![{}](figures/{}.png)\n", c.title, c.file);
        }
    }
    if let Some(x) = &r.http {
        let _ = writeln!(m, "\n# HTTP under load\n\n{}\n", super::HTTP_TEXT);
        m += &md_table(&super::HTTP_COLUMNS, super::http_cells(&x.rows).into_iter());
        if x.rows
            .iter()
            .any(|r| r.workload == crate::row::Workload::Nat)
        {
            m += "\nNAT load balancer, the one-way latency it adds (64 B rr):\n\n```text\n";
            m += &crate::http::nat_table(&x.rows);
            m += "```\n";
        }
        m += "\n";
        for t in &x.targets {
            let _ = writeln!(m, "- {}", t.line());
        }
        for c in &x.charts {
            let _ = writeln!(m, "\n![{}](figures/{}.png)", c.title, c.file);
        }
    }
    if let Some(sd) = &r.seeds {
        m += &sd.markdown();
        for c in &sd.charts {
            let _ = writeln!(m, "\n![{}](figures/{}.png)", c.title, c.file);
        }
    }
    if !r.idle.is_empty() {
        let _ = writeln!(m, "\n# An idle host\n\n{}\n", super::IDLE_TEXT);
        m += &md_table(&super::IDLE_COLUMNS, super::idle_cells(&r.idle).into_iter());
    }
    if let Some(rate) = &r.rate {
        m += "\n# Rate limits\n\n```text\n";
        m += &crate::rate::table(&rate.phases);
        m += "```\n\n";
        for t in &rate.targets {
            let _ = writeln!(m, "- {}", t.line());
        }
        let _ = writeln!(m, "\n{}\n", crate::rate::FAST_CHANNELS);
        for c in &rate.charts {
            let _ = writeln!(m, "![{}](figures/{}.png)\n", c.title, c.file);
        }
    }
    m += "\nCommands:\n\n";
    for e in &r.envs {
        let _ = writeln!(m, "- `{}`", e.command);
    }
    if !r.missing.is_empty() {
        m += "\n## Not available here, or skipped\n\n";
        for x in &r.missing {
            let _ = writeln!(m, "- {x}");
        }
    }
    m
}

/// A run's target lines and what it left out, as Markdown sections (empty ones omitted).
fn targets_and_missing(res: &Results) -> String {
    let mut m = String::new();
    if !res.targets.is_empty() {
        m += "\n## Targets\n\n";
        for t in &res.targets {
            let _ = writeln!(m, "- {t}");
        }
    }
    if !res.not_available.is_empty() {
        m += "\n## Not available here, or skipped\n\n";
        for x in &res.not_available {
            let _ = writeln!(m, "- {}", x.line());
        }
    }
    m
}

/// The Markdown summary of one `docknet bench` run: title, command and environment, `note`,
/// the table of its summary rows, ratios, targets, what was left out, and placements.
pub fn bench(title: &str, note: &str, res: &Results) -> String {
    let env = &res.env;
    let mut m = format!(
        "# {title}\n\nCommand: `{}`  \nKernel {}, {} cores, {} s per point after {} s warm-up, {} run(s) per point.\n\n{note}\n\n",
        env.command,
        env.kernel.as_deref().unwrap_or("?"),
        env.cores,
        env.duration_s,
        env.warmup_s,
        env.repeat
    );
    m += "## Results\n\nOver all runs of a point: latency percentiles from the runs' merged \
          histograms where the tool provides them, every other figure the median of the runs.\n\n```text\n";
    m += &text(&res.summary);
    m += "```\n\n## Ratios (same run)\n\n";
    for r in &res.ratios {
        let _ = writeln!(m, "- {r}");
    }
    m += &targets_and_missing(res);
    m += "\n## Placement\n\n";
    for r in placements(&res.summary) {
        let _ = writeln!(m, "- `{}` `{}`: {}", r.mode, r.cores, r.placement);
    }
    m
}

/// The Markdown of one `docknet bench http` run: command, table, targets, placements.
pub fn http(res: &Results) -> String {
    let env = &res.env;
    let mut m = format!(
        "# HTTP under load side by side\n\nCommand: `{}`  \nKernel {}, {} cores, {} s per point after {} s warm-up, {} run(s) per point.\n\n{}\n\n```text\n",
        env.command,
        env.kernel.as_deref().unwrap_or("?"),
        env.cores,
        env.duration_s,
        env.warmup_s,
        env.repeat,
        super::HTTP_TEXT
    );
    m += &crate::http::table(&res.summary);
    m += "```\n";
    m += &targets_and_missing(res);
    m += "\n## Placement\n\n";
    for r in placements(&res.summary) {
        let _ = writeln!(m, "- `{}` `{}`: {}", r.mode, r.cores, r.placement);
    }
    m
}

/// Each (mode, cores) placement once, in table order.
pub fn placements(rows: &[Row]) -> Vec<&Row> {
    let mut seen = std::collections::BTreeSet::new();
    rows.iter()
        .filter(|r| seen.insert((r.mode, r.cores.clone())))
        .collect()
}

/// The Markdown of one `docknet bench rate` run: command, the phases' table, targets, what
/// was left out, and what limits mean for fast channels.
pub fn rate(res: &Results, phases: &[crate::rate::Phase]) -> String {
    let env = &res.env;
    let mut m = format!(
        "# Rate limits side by side\n\nCommand: `{}`  \nKernel {}, {} cores.\n\n\
         One TCP flow while its limit steps down, then a TCP flow with a UDP flow beside it \
         (no limits, the UDP flow limited, both limited). Throughput at the receivers in \
         {} ms bins (frames with their headers, as both limiters count them); each phase \
         leaves out its first {} s; accuracy over whole 1 s windows; CPU of the experiment's \
         processes per KiB delivered.\n\n```text\n",
        env.command,
        env.kernel.as_deref().unwrap_or("?"),
        env.cores,
        crate::rate::BIN_S * 1e3,
        crate::rate::SETTLE_S,
    );
    m += &crate::rate::table(phases);
    m += "```\n";
    m += &targets_and_missing(res);
    let _ = writeln!(m, "\n{}", crate::rate::FAST_CHANNELS);
    m
}
