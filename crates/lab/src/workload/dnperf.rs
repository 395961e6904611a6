//! dnperf as the lab runs it: its arguments, and its typed report turned into a row.

use super::Timing;
use crate::mode::{Builder, Mode};
use crate::plan::Point;
use crate::row::{Row, Tool, Workload};
use docknet_perf::report::ClientReport;
use docknet_perf::workload::Workload as Perf;

/// Which side of a measurement a dnperf process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The server (one connection, then exit).
    Server,
    /// The client, with the workload and message size.
    Client(Workload, usize),
}

impl Side {
    /// For error messages.
    pub fn what(self) -> &'static str {
        match self {
            Side::Server => "dnperf server",
            Side::Client(..) => "dnperf client",
        }
    }
}

/// What dnperf runs for a lab workload: pairs measure rr and stream in turn.
pub fn perf_workload(w: Workload) -> Perf {
    match w {
        Workload::Rr | Workload::Cpuquota => Perf::Rr,
        Workload::Stream
        | Workload::Startup
        | Workload::Chain
        | Workload::Pairs
        | Workload::Rate
        | Workload::Idle
        | Workload::Http
        | Workload::Nat => Perf::Stream,
    }
}

/// dnperf's arguments on `stack` at `addr` (bind or connect), pinned to `cpu`, waiting per
/// `idle`.
pub fn args(
    stack: &str,
    addr: &str,
    cpu: Option<usize>,
    idle: &str,
    side: Side,
    t: Timing,
) -> Vec<String> {
    let role = match side {
        Side::Server => "server",
        Side::Client(..) => "client",
    };
    let mut v: Vec<String> = vec![role.into(), "--stack".into(), stack.into()];
    if let Some(c) = cpu {
        v.extend(["--cpu".into(), c.to_string()]);
    }
    // no policy given: the program's default, as a user runs it
    if !idle.is_empty() {
        v.extend(["--idle".into(), idle.into()]);
    }
    match side {
        Side::Client(w, size) => v.extend(
            [
                "--connect".into(),
                addr.into(),
                "--workload".into(),
                match w {
                    Workload::Rr => "rr",
                    _ => "stream",
                }
                .into(),
                "--size".into(),
                size.to_string(),
                "--duration".into(),
                t.duration.to_string(),
                "--warmup".into(),
                t.warmup.to_string(),
                "--json".into(),
            ]
            .into_iter()
            .chain(t.start_at.map(|ns| format!("--start-at={ns}"))),
        ),
        Side::Server => v.extend(["--bind".into(), addr.into(), "--conns".into(), "1".into()]),
    }
    v
}

/// A row from a dnperf client's report for point `p` of `mode`.
pub fn row(r: &ClientReport, mode: Mode, workload: Workload, p: &Point, builder: Builder) -> Row {
    let o = &r.result;
    let us = |ns: u64| ns as f64 / 1e3;
    let ow = o.one_way_ns.as_ref();
    Row {
        placement: p.placement().description.clone(),
        cores: p.placement().cores(),
        mtu: r.env.mtu,
        repeat: p.repeat,
        p50_us: ow.map(|s| us(s.p50)),
        p99_us: ow.map(|s| us(s.p99)),
        p999_us: ow.map(|s| us(s.p999)),
        mean_us: ow.map(|s| s.mean / 1e3),
        half_rtt_p50_us: o.half_rtt_ns.as_ref().map(|s| us(s.p50)),
        tps: (r.workload == Perf::Rr).then_some(o.tps),
        gbps: o.gbps,
        msgs_per_s: o.msgs_per_s,
        cpu_s_per_op: Some(o.cpu_s_per_op),
        builder: Some(builder.name().into()),
        one_way_hist: o.one_way_hist.clone(),
        ..Row::new(mode, Tool::Dnperf, workload, p.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Measure, Placement};

    #[test]
    fn arguments_say_what_each_side_does() {
        let t = Timing {
            duration: 1.5,
            warmup: 0.2,
            start_at: None,
        };
        let s = args("kernel", "10.0.0.2:80", Some(1), "spin", Side::Server, t);
        assert_eq!(
            s.join(" "),
            "server --stack kernel --cpu 1 --idle spin --bind 10.0.0.2:80 --conns 1"
        );
        let c = args(
            "docknet",
            "10.0.0.2:80",
            None,
            "adaptive:0",
            Side::Client(Workload::Pairs, 64),
            t,
        );
        assert_eq!(
            c.join(" "),
            "client --stack docknet --idle adaptive:0 --connect 10.0.0.2:80 --workload stream --size 64 --duration 1.5 --warmup 0.2 --json"
        );
    }

    #[test]
    fn a_report_becomes_a_row() {
        let line = r#"{"env":{"kernel":"6.18","cores":2,"pinned_core":0,"stack":"kernel","idle":"spin","mtu":1500,"command":"dnperf","version":"0.1.0"},
            "workload":"rr","proto":"tcp","size":64,"duration_s":1.0,"warmup_s":0.1,
            "result":{"transactions":10,"tps":10.0,"one_way_ns":{"count":20,"mean":1500.0,"p50":1000,"p90":2000,"p99":3000,"p999":4000,"max":5000},
            "half_rtt_ns":{"count":10,"mean":1500.0,"p50":1200,"p90":2000,"p99":3000,"p999":4000,"max":5000},
            "one_way_hist":[[1000,20]],"gbps":null,"msgs_per_s":null,"bytes":null,"cpu_s_per_op":0.000002}}"#;
        let r: ClientReport = serde_json::from_str(line).unwrap();
        let p = Point {
            measure: Measure::Dnperf(Placement {
                client: Some(0),
                server: Some(1),
                master: None,
                master_b: None,
                idle: "spin",
                pairs_cores: Vec::new(),
                description: "d".into(),
            }),
            size: 64,
            repeat: 1,
        };
        let row = row(&r, Mode::Veth, Workload::Rr, &p, Builder::Ip);
        assert_eq!(
            (row.p50_us, row.p999_us, row.half_rtt_p50_us),
            (Some(1.0), Some(4.0), Some(1.2))
        );
        assert_eq!((row.tps, row.mtu, row.repeat), (Some(10.0), Some(1500), 1));
        assert_eq!(
            (row.cores.as_str(), row.builder.as_deref()),
            ("c0 s1", Some("ip"))
        );
        assert_eq!(row.one_way_hist, Some(vec![[1000, 20]]));
    }
}
