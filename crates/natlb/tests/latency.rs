//! The one-way latency the balancer adds: `dnperf` rr, 64 B, through the balancer (client ->
//! fast channel -> balancer -> fast channel -> server) against the same client and server
//! talking directly over a fast channel, alternated in one run. A measurement, not a check:
//! ignored by default; run it with release binaries and nothing else busy:
//!
//! ```sh
//! cargo build --release
//! flock -o /tmp/dn-cpu.lock cargo test --release -p docknet-natlb --test latency -- --ignored --nocapture
//! ```
//!
//! Placement: a 2-core machine cannot give client, balancer and server a core each, so
//! `NATLB_PLACEMENT` chooses who shares (docs/benchmarks.md, "NAT load balancer", has the
//! figures of each): `lb-core` (default: the balancer spins alone on core 1, client and server
//! share core 0 and poll with a `sched_yield` between empty polls, `--idle adaptive:0`),
//! `yield` (the client spins alone on core 0, server and balancer share core 1 with
//! `adaptive:0`) or `block` (client and server share core 0 and sleep between messages, the
//! balancer spins on core 1), or `unpinned` (what a user gets: nothing pinned, every program at
//! its default `adaptive`); `NATLB_LB_IDLE` gives the balancer another idle policy in any
//! placement. `NATLB_ROUNDS` (default 3) and `NATLB_SECONDS` (default 3) set
//! the repeats and the length of each run; the added p50 printed is the median over rounds of
//! (through the balancer - direct), each pair measured back to back.

mod lab;
use lab::*;
use serde_json::Value;
use std::time::Duration;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Cores and idle policies of (client, server, balancer).
struct Placement {
    client: (&'static str, &'static str),
    server: (&'static str, &'static str),
    lb: (&'static str, &'static str),
}

/// `NATLB_PLACEMENT`: `lb-core`, `yield`, `block` or `unpinned` (see the file's doc).
fn placement() -> (String, Placement) {
    let name = std::env::var("NATLB_PLACEMENT").unwrap_or_else(|_| "lb-core".into());
    let p = match name.as_str() {
        "unpinned" => Placement {
            client: ("", "adaptive"),
            server: ("", "adaptive"),
            lb: ("", "adaptive"),
        },
        "block" => Placement {
            client: ("0", "block"),
            server: ("0", "block"),
            lb: ("1", "spin"),
        },
        "lb-core" => Placement {
            client: ("0", "adaptive:0"),
            server: ("0", "adaptive:0"),
            lb: ("1", "spin"),
        },
        _ => Placement {
            client: ("0", "spin"),
            server: ("1", "adaptive:0"),
            lb: ("1", "adaptive:0"),
        },
    };
    let mut p = p;
    if let Ok(idle) = std::env::var("NATLB_LB_IDLE") {
        p.lb.1 = Box::leak(idle.into_boxed_str());
    }
    (name, p)
}

/// One dnperf rr run from pipe `c` to `dst`: (one-way p50 ns, one-way p99 ns, transactions).
fn rr(lab: &Lab, dst: &str, secs: u64, (cpu, idle): (&str, &str)) -> (u64, u64, u64) {
    let dnperf = beside("dnperf");
    let secs = secs.to_string();
    let args = [
        dnperf.as_str(),
        "client",
        "--stack",
        "docknet",
        "--idle",
        idle,
        "--connect",
        dst,
        "--workload",
        "rr",
        "--size",
        "64",
        "--duration",
        &secs,
        "--warmup",
        "0.5",
        "--json",
    ];
    let mut c = lab.cmd();
    c.args(["run", "--pipe", "c"]);
    if !cpu.is_empty() {
        c.args(["--cpu", cpu]);
    }
    c.arg("--").args(args);
    let o = c.output().expect("run client");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "client: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_str(out.lines().rev().find(|l| l.starts_with('{')).unwrap())
        .expect("dnperf JSON");
    let ow = &v["result"]["one_way_ns"];
    (
        ow["p50"].as_u64().unwrap(),
        ow["p99"].as_u64().unwrap(),
        v["result"]["transactions"].as_u64().unwrap(),
    )
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

#[test]
#[ignore = "a measurement: run it on purpose (see the file's doc)"]
fn measure_the_latency_the_balancer_adds() {
    if !root_or_skip("measure") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::start();
    for (p, ip) in [("lb", "10.78.0.1"), ("s", "10.78.0.2"), ("c", "10.78.0.3")] {
        lab.ok(&["pipe", "create", p, "--ip", &format!("{ip}/24")]);
    }
    for (a, b) in [("lb", "s"), ("c", "lb"), ("c", "s")] {
        lab.ok(&["fc", "connect", a, b]);
    }
    let dnperf = beside("dnperf");
    let (pname, pl) = placement();
    let core = |c: &str| c.parse::<usize>().ok();
    let mut server = lab.spawn(
        "s",
        core(pl.server.0),
        &[
            &dnperf,
            "server",
            "--stack",
            "docknet",
            "--idle",
            pl.server.1,
            "--bind",
            "10.78.0.2:5000",
        ],
        false,
    );
    let mut lb = lab.spawn(
        "lb",
        core(pl.lb.0),
        &[
            NATLB,
            "--backend",
            "10.78.0.2:5000",
            "--port",
            "5000",
            "--idle",
            pl.lb.1,
        ],
        false,
    );
    lb.wait_err("serving", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    let (rounds, secs) = (env("NATLB_ROUNDS", 3), env("NATLB_SECONDS", 3));
    let (mut direct, mut via, mut added) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let d = rr(&lab, "10.78.0.2:5000", secs, pl.client);
        let v = rr(&lab, "10.78.0.1:5000", secs, pl.client);
        assert!(
            d.2 > 1000 && v.2 > 1000,
            "too few transactions: {d:?} {v:?}"
        );
        eprintln!(
            "round {round}: direct p50 {} ns p99 {} ns ({} tx); via balancer p50 {} ns p99 {} ns ({} tx); added p50 {} ns",
            d.0, d.1, d.2, v.0, v.1, v.2, v.0 as i64 - d.0 as i64
        );
        direct.push(d.0);
        via.push(v.0);
        added.push(v.0.saturating_sub(d.0));
    }
    let st = lb.term(Duration::from_secs(10));
    let mut lines = Vec::new();
    while let Ok(l) = lb.out.recv_timeout(Duration::from_secs(2)) {
        lines.push(l);
    }
    assert!(st.success());
    let stats: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    server.kill();
    println!(
        "{}",
        serde_json::json!({
            "workload": "nat",
            "placement": pname,
            "direct_p50_us": median(direct) as f64 / 1000.0,
            "via_p50_us": median(via) as f64 / 1000.0,
            "added_p50_us": median(added) as f64 / 1000.0,
            "rounds": rounds,
            "seconds": secs,
            "balancer_drops": stats["drops"],
        })
    );
    drop(lb);
    drop(server);
    lab.remove_pipes(&["lb", "s", "c"]);
}
