//! The cross-check: sockperf (rr) and iperf3 (stream) on the kernel modes beside dnperf, so
//! dnperf's figures are checked by the tools people know, and on the preload modes, where the
//! same unmodified tools run over DockNet (`docknet run --preload`). Their output is parsed by
//! pure functions tested on real output.

use super::{Fleet, Runner};
use crate::plan::{ModeRun, Placement, Point};
use crate::proc::{in_ns, Proc};
use crate::row::{NotAvailable, Row, Status, Tool};
use crate::topology::{DocknetLab, Pair};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::Path;
use std::process::Command;

/// What sockperf's ping-pong reports, as one-way figures (its RTTs halved, in µs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sockperf {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: Option<f64>,
    /// 99.9th percentile.
    pub p999_us: Option<f64>,
    /// Mean.
    pub mean_us: Option<f64>,
    /// Messages sent over the whole run (warm-up included).
    pub sent: Option<f64>,
}

/// Parses `sockperf pp --full-rtt` output (stdout and stderr together). ANSI colour codes are
/// tolerated.
pub fn parse_sockperf(text: &str) -> Option<Sockperf> {
    let pct = |q: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.contains(&format!("percentile {q} =")))
            .and_then(|l| l.rsplit('=').next())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|rtt| rtt / 2.0)
    };
    let sent = text
        .lines()
        .find(|l| l.contains("[Total Run]"))
        .and_then(|l| l.split("SentMessages=").nth(1))
        .and_then(|v| v.split(';').next()?.trim().parse::<f64>().ok());
    let mean_us = text
        .lines()
        .find_map(|l| l.split("Round trip is ").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map(|rtt| rtt / 2.0);
    Some(Sockperf {
        p50_us: pct("50.000")?,
        p99_us: pct("99.000"),
        p999_us: pct("99.900"),
        mean_us,
        sent,
    })
}

#[derive(Debug, Deserialize)]
struct Iperf3Json {
    #[serde(default)]
    end: Option<Iperf3End>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Iperf3End {
    sum_received: Option<Iperf3Sum>,
    sum_sent: Option<Iperf3Sum>,
}

#[derive(Debug, Deserialize)]
struct Iperf3Sum {
    #[serde(default)]
    bits_per_second: Option<f64>,
    #[serde(default)]
    bytes: Option<f64>,
}

/// What iperf3 reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Iperf3 {
    /// Goodput at the receiver, bits per second.
    pub bps: f64,
    /// Bytes the client sent (omitted seconds excluded).
    pub sent_bytes: Option<f64>,
}

/// Parses `iperf3 -c ... -J` output; an iperf3 error is the error.
pub fn parse_iperf3(json: &[u8]) -> Result<Iperf3> {
    let v: Iperf3Json = serde_json::from_slice(json).context("iperf3 printed no JSON")?;
    let end = v.end.as_ref();
    match end.and_then(|e| e.sum_received.as_ref()?.bits_per_second) {
        Some(bps) => Ok(Iperf3 {
            bps,
            sent_bytes: end.and_then(|e| e.sum_sent.as_ref()?.bytes),
        }),
        None => bail!("iperf3: {}", v.error.as_deref().unwrap_or("no result")),
    }
}

/// The largest message a tool takes.
pub fn max_size(tool: Tool) -> usize {
    match tool {
        Tool::Sockperf => 65000,
        _ => usize::MAX,
    }
}

impl Runner {
    /// Records that the cross-check of `run`'s mode with `tool` did not run, and why.
    fn skip_tool(&mut self, run: &ModeRun, tool: Tool, size: usize, why: String) {
        self.progress.done(&format!(
            "  {:<11} c0 s1    {tool:<8} {size} B: skipped ({why})",
            run.mode.name()
        ));
        let name = format!("{} ({tool})", run.mode);
        if !self
            .skipped
            .iter()
            .any(|s| s.reason == why && s.mode == name)
        {
            self.skipped.push(NotAvailable {
                mtu: Some(run.mtu),
                ..NotAvailable::new(name, Status::Skipped, why).on(self.topology)
            });
        }
    }

    /// sockperf (rr) or iperf3 (stream) on pair 0, placed as `pl`.
    pub(super) fn crosscheck(
        &mut self,
        run: &ModeRun,
        fleet: &Fleet,
        p: &Point,
        tool: Tool,
        pl: &Placement,
    ) -> Result<()> {
        let size = p.size;
        if Command::new(tool.name()).arg("--version").output().is_err() {
            let why = format!("{tool} is not installed (apt-get install {tool})");
            self.skip_tool(run, tool, size, why);
            return Ok(());
        }
        if size > max_size(tool) {
            let why = format!("{tool} messages are at most {} B", max_size(tool));
            self.skip_tool(run, tool, size, why);
            return Ok(());
        }
        self.progress
            .start(&format!("{} {tool} {size} B", run.mode));
        let docknet_pair;
        let (pair, at) = match fleet {
            Fleet::Kernel(lab) => (&lab.pairs[0], At::Kernel),
            Fleet::Docknet(lab) if lab.mode.is_preload() => {
                let ip = DocknetLab::server_ip(0).to_string();
                docknet_pair = Pair {
                    client_ns: DocknetLab::client_pipe(0),
                    server_ns: DocknetLab::server_pipe(0),
                    bind: ip.clone(),
                    target: ip,
                    port: self.next_port(),
                    target6: None,
                };
                (&docknet_pair, At::Docknet(lab))
            }
            Fleet::Docknet(_) => bail!("the cross-check runs on kernel and preload modes only"),
        };
        let mut row = Row {
            placement: pl.description.clone(),
            cores: pl.cores(),
            mtu: Some(fleet.mtu()),
            repeat: p.repeat,
            builder: Some(fleet.builder().name().into()),
            ..Row::new(run.mode, tool, self.workload, size)
        };
        if tool == Tool::Sockperf {
            self.sockperf(pair, &at, pl, &mut row)?;
        } else {
            self.iperf3(pair, &at, pl, &mut row)?;
        }
        self.push(row);
        Ok(())
    }

    /// sockperf ping-pong into `row`.
    fn sockperf(&self, pair: &Pair, at: &At, pl: &Placement, row: &mut Row) -> Result<()> {
        let (port, m) = (pair.port.to_string(), row.size.to_string());
        let secs = (self.timing.duration.ceil() as u64).max(1).to_string();
        let (out, cpu) = self.tool_pair(
            pair,
            at,
            Tool::Sockperf,
            pl,
            &["sr", "--tcp", "-i", &pair.bind, "-p", &port],
            &[
                "pp",
                "--tcp",
                "-i",
                &pair.target,
                "-p",
                &port,
                "-m",
                &m,
                "-t",
                &secs,
                // (sockperf sizes its table of sent messages from this rate and fails,
                // "_seqN > m_maxSequenceNo", when a ping-pong outruns its default: round
                // trips near 1 us over a few seconds do)
                "--mps",
                "10000000",
                "--full-rtt",
            ],
        )?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let s = parse_sockperf(&text)
            .with_context(|| format!("sockperf printed no percentiles: {}", text.trim()))?;
        row.p50_us = Some(s.p50_us);
        row.p99_us = s.p99_us;
        row.p999_us = s.p999_us;
        row.half_rtt_p50_us = Some(s.p50_us);
        row.mean_us = s.mean_us;
        // CPU of the client over every message it sent (warm-up included)
        row.cpu_s_per_op = s.sent.filter(|n| *n > 0.0).map(|n| cpu / n);
        Ok(())
    }

    /// iperf3 into `row`.
    fn iperf3(&self, pair: &Pair, at: &At, pl: &Placement, row: &mut Row) -> Result<()> {
        let (port, l) = (pair.port.to_string(), row.size.to_string());
        let secs = (self.timing.duration.ceil() as u64).max(1).to_string();
        let warm = (self.timing.warmup.ceil() as u64).to_string();
        let (out, cpu) = self.tool_pair(
            pair,
            at,
            Tool::Iperf3,
            pl,
            &["-s", "-1", "-B", &pair.bind, "-p", &port],
            &[
                "-c",
                &pair.target,
                "-p",
                &port,
                "-t",
                &secs,
                "-O",
                &warm,
                "-l",
                &l,
                "-J",
            ],
        )?;
        let r = parse_iperf3(&out.stdout)?;
        let size = row.size as f64;
        row.gbps = Some(r.bps / 1e9);
        // CPU of the client over the messages it wrote (omitted warm-up seconds included in
        // the CPU, not in the count: a slight overestimate)
        let msgs = r.sent_bytes.map(|b| b / size);
        row.cpu_s_per_op = msgs.filter(|n| *n > 0.0).map(|n| cpu / n);
        row.msgs_per_s = Some(r.bps / 8.0 / size);
        Ok(())
    }

    /// A cross-check tool on `pair`: its server (`server` arguments) pinned in the server's
    /// namespace (or container, on a preload mode), given time to start, then its client in the
    /// client's, run to completion. Returns the client's output and CPU seconds; the server is
    /// ended on return.
    fn tool_pair(
        &self,
        pair: &Pair,
        at: &At,
        tool: Tool,
        pl: &Placement,
        server: &[&str],
        client: &[&str],
    ) -> Result<(std::process::Output, f64)> {
        let pinned = |ns: &str, core: Option<usize>, args: &[&str]| match at {
            At::Kernel => {
                let core = core.unwrap_or(0).to_string();
                let argv = [&["-c", &core, tool.name()][..], args].concat();
                in_ns(
                    ns,
                    Path::new("taskset"),
                    argv.iter().map(|s| s.to_string()).collect(),
                )
            }
            // `ns` is the pipe: the unmodified tool in a container with the preload library
            At::Docknet(lab) => {
                let mut c = lab.run_in(
                    &self.exe,
                    ns,
                    core,
                    Path::new(tool.name()),
                    args.iter().map(|s| s.to_string()).collect(),
                );
                c.env("DOCKNET_IDLE", pl.idle);
                c
            }
        };
        let _server = Proc::spawn(
            pinned(&pair.server_ns, pl.server, server),
            &format!("{tool} server"),
        )?;
        std::thread::sleep(super::SERVER_START);
        let cpu0 = docknet_perf::stats::children_cpu_seconds();
        let out = pinned(&pair.client_ns, pl.client, client)
            .output()
            .with_context(|| format!("running {tool}"))?;
        Ok((out, docknet_perf::stats::children_cpu_seconds() - cpu0))
    }
}

/// Where a cross-check tool runs.
#[derive(Debug)]
enum At<'a> {
    /// In a kernel mode's namespaces.
    Kernel,
    /// In containers on a preload mode's pipes.
    Docknet(&'a DocknetLab),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real output of sockperf 3.7 (`sockperf pp --tcp -m 64 -t 1 --full-rtt`), colour codes
    /// included.
    const SOCKPERF: &str = "sockperf: \u{1b}[2;35m== version #3.7-no.git == \u{1b}[0m
sockperf: [Total Run] RunTime=1.000 sec; Warm up time=400 msec; SentMessages=51241; ReceivedMessages=51240
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=0.550 sec; SentMessages=28048; ReceivedMessages=28048
sockperf: \u{1b}[2;35m====> avg-rtt=19.530 (std-dev=9.618)\u{1b}[0m
sockperf: Summary: Round trip is 19.530 usec
sockperf: ---> percentile 99.999 = 1454.494
sockperf: ---> percentile 99.900 =   65.387
sockperf: ---> percentile 99.000 =   30.733
sockperf: ---> percentile 90.000 =   21.189
sockperf: ---> percentile 50.000 =   18.750
sockperf: ---> <MIN> observation =   15.132
";

    #[test]
    fn sockperf_rtts_become_one_way_figures() {
        let s = parse_sockperf(SOCKPERF).unwrap();
        assert_eq!(s.p50_us, 9.375);
        assert_eq!(s.p99_us, Some(15.3665));
        assert_eq!(s.p999_us, Some(32.6935));
        assert_eq!(s.mean_us, Some(9.765));
        assert_eq!(
            s.sent,
            Some(51241.0),
            "the whole run's, not the valid duration's"
        );
        assert_eq!(parse_sockperf("sockperf: ERROR: connection refused"), None);
        assert_eq!(parse_sockperf("---> percentile 50.000 = fast"), None);
    }

    #[test]
    fn iperf3_json_and_its_errors() {
        let ok = br#"{"start": {}, "end": {"sum_sent": {"bytes": 1000000, "bits_per_second": 8e9},
            "sum_received": {"bytes": 999000, "bits_per_second": 7.99e9}}}"#;
        let r = parse_iperf3(ok).unwrap();
        assert_eq!((r.bps, r.sent_bytes), (7.99e9, Some(1e6)));
        let e = parse_iperf3(br#"{"start": {}, "end": {}, "error": "unable to connect to server: Connection refused"}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "iperf3: unable to connect to server: Connection refused");
        assert!(parse_iperf3(b"iperf3: error").is_err());
        assert!(parse_iperf3(br#"{"end": {"sum_received": {"bits_per_second": "x"}}}"#).is_err());
    }
}
