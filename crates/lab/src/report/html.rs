//! `index.html`: the environment, a one-screen summary, the targets, the figures and a table
//! per workload. Every text from a results file is escaped.

use super::table::{headline_cells, headline_columns, COLUMNS};
use super::Report;
use crate::row::Workload;
use std::fmt::Write as _;

/// HTML-escapes `s`.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn table_html<S: AsRef<str>>(heads: &[S], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut h = String::from("<table>\n<tr>");
    for c in heads {
        let _ = write!(h, "<th>{}</th>", esc(c.as_ref()));
    }
    h += "</tr>\n";
    for r in rows {
        h += "<tr>";
        for c in r {
            let _ = write!(h, "<td>{}</td>", esc(&c));
        }
        h += "</tr>\n";
    }
    h + "</table>\n"
}

/// One figure: the SVG, its title, links to both files.
pub(crate) fn figure(c: &super::charts::Chart) -> String {
    format!(
        "<figure><img class=\"figure\" src=\"figures/{f}.svg\" alt=\"{t}\" width=\"1200\" height=\"600\">\
         <figcaption>{t} (<a href=\"figures/{f}.png\">PNG</a>, <a href=\"figures/{f}.svg\">SVG</a>)</figcaption></figure>\n",
        f = esc(&c.file),
        t = esc(&c.title)
    )
}

/// The page.
pub fn page(r: &Report) -> String {
    let env = r.env();
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>DockNet lab report</title>\n<style>\n\
         body{{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}\n\
         table{{border-collapse:collapse;font-size:13px;margin:1em 0}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}\n\
         td:first-child,th:first-child,td:nth-child(2),td:nth-child(3){{text-align:left}}th{{background:#eee}}\n\
         figure{{margin:1.5em 0}}img{{max-width:100%;border:1px solid #ddd}}.met{{color:#070}}.notmet{{color:#a00}}\n\
         </style></head>\n<body>\n<h1>DockNet lab report</h1>\n"
    );
    let _ = writeln!(
        h,
        "<p>Kernel {}, {} cores; {} s measured per point after {} s warm-up, {} run(s) per point. \
         One-way latency from CLOCK_MONOTONIC timestamps in the payload; goodput counted at the receiver. \
         Latency percentiles over runs come from merged histograms. sockperf rows report RTT/2.</p>",
        esc(env.kernel.as_deref().unwrap_or("?")),
        env.cores,
        env.duration_s,
        env.warmup_s,
        env.repeat
    );
    if let Some(w) = r.envs.iter().find_map(|e| e.wire.as_deref()) {
        let _ = writeln!(h, "<p>Two hosts: the wire is shaped: {}.</p>", esc(w));
    }
    if let Some(x) = r.xcore_line() {
        let _ = writeln!(h, "<p>{}</p>", esc(&x));
    }
    let many = r.sections.len() > 1;
    for sec in &r.sections {
        let base = sec.topology.baseline();
        if many {
            let _ = writeln!(h, "<h2>{}</h2>", esc(&sec.heading()));
        }
        let _ = writeln!(
            h,
            "<h2>Summary{}</h2>\n<p>Each mode's best figures over its placements (dnperf), best against \
             {base}'s best; the tables below have every placement.</p>",
            if many { format!(" ({})", sec.topology.describe()) } else { String::new() }
        );
        for (mtu, lines) in &sec.headlines {
            if let Some(m) = mtu {
                let _ = writeln!(h, "<h3>MTU {m}</h3>");
            }
            h += &table_html(
                &headline_columns(base),
                lines.iter().map(|l| headline_cells(l).to_vec()),
            );
        }
        if !sec.targets.is_empty() {
            h += "<h3>Targets</h3>\n<ul>\n";
            for t in &sec.targets {
                let class = if t.met { "met" } else { "notmet" };
                let _ = writeln!(h, "<li class=\"{class}\">{}</li>", esc(&t.line()));
            }
            h += "</ul>\n";
        }
        h += "<h3>Figures</h3>\n";
        for c in &sec.charts {
            h += &figure(c);
        }
        for (wl, rows) in sec.tables() {
            let _ = writeln!(h, "<h3>Results: {wl} (ratio to {base})</h3>");
            h += &table_html(&COLUMNS, rows.into_iter());
        }
    }
    if let Some(x) = &r.http {
        let _ = writeln!(
            h,
            "<h2>HTTP under load</h2>\n<p>{}</p>",
            esc(super::HTTP_TEXT)
        );
        h += &table_html(&super::HTTP_COLUMNS, super::http_cells(&x.rows).into_iter());
        if x.rows.iter().any(|r| r.backends.is_some()) {
            h += "<h3>Web cluster: backends behind the load balancer</h3>\n<pre>";
            h += &esc(&crate::http::cluster_table(&x.rows));
            h += "</pre>\n";
            let _ = writeln!(h, "<p>{}</p>", esc(crate::http::CLUSTER_CEILING));
        }
        if x.rows.iter().any(|r| r.workload == Workload::Nat) {
            h += "<h3>NAT load balancer: the one-way latency it adds (64 B rr)</h3>\n<pre>";
            h += &esc(&crate::http::nat_table(&x.rows));
            h += "</pre>\n";
        }
        h += "<ul>\n";
        for t in &x.targets {
            let class = if t.met { "met" } else { "notmet" };
            let _ = writeln!(h, "<li class=\"{class}\">{}</li>", esc(&t.line()));
        }
        h += "</ul>\n";
        for c in &x.charts {
            h += &figure(c);
        }
    }
    if let Some(sd) = &r.seeds {
        h += &sd.html();
    }
    if !r.idle.is_empty() {
        let _ = writeln!(h, "<h2>An idle host</h2>\n<p>{}</p>", esc(super::IDLE_TEXT));
        h += &table_html(&super::IDLE_COLUMNS, super::idle_cells(&r.idle).into_iter());
    }
    if let Some(rate) = &r.rate {
        h += "<h2>Rate limits</h2>\n<p>One TCP flow while its limit steps down, then a TCP flow \
              with a UDP flow beside it (no limits, the UDP flow limited, both limited), on the \
              kernel's bridge with the CNI bandwidth plugin (TBF) and on DockNet's limiter. \
              Throughput at the receivers in 100 ms bins, frames with their headers.</p>\n<pre>";
        h += &esc(&crate::rate::table(&rate.phases));
        h += "</pre>\n<ul>\n";
        for t in &rate.targets {
            let class = if t.met { "met" } else { "notmet" };
            let _ = writeln!(h, "<li class=\"{class}\">{}</li>", esc(&t.line()));
        }
        let _ = writeln!(h, "</ul>\n<p>{}</p>", esc(crate::rate::FAST_CHANNELS));
        for c in &rate.charts {
            h += &figure(c);
        }
    }
    h += "<p>Commands:</p><ul>\n";
    for e in &r.envs {
        let _ = writeln!(h, "<li><code>{}</code></li>", esc(&e.command));
    }
    h += "</ul>\n";
    if !r.missing.is_empty() {
        h += "<h2>Not available here, or skipped</h2>\n<ul>\n";
        for m in &r.missing {
            let _ = writeln!(h, "<li>{}</li>", esc(m));
        }
        h += "</ul>\n";
    }
    // the page says how many figures loaded, so a headless browser can check them
    h += "<script>\nwindow.addEventListener('load', function () {\n  var imgs = document.querySelectorAll('img.figure');\n  var ok = 0;\n  imgs.forEach(function (i) { if (i.complete && i.naturalWidth > 0) ok++; });\n  document.body.setAttribute('data-figures', imgs.length);\n  document.body.setAttribute('data-figures-loaded', ok);\n});\n</script>\n</body></html>\n";
    h
}
