//! Rate limits end to end: a limited pipe's transfer takes the time its limit implies, bad
//! input changes nothing, limits survive a daemon restart, and the master sleeps between the
//! runs of a flow held at its limit.

mod common;
use common::*;
use std::time::Duration;

fn pipes(lab: &Lab) {
    lab.ok(&["pipe", "create", "a", "--ip", "10.61.0.1/24"]);
    lab.ok(&["pipe", "create", "b", "--ip", "10.61.0.2/24"]);
}

/// dnperf's server in pipe b and a client in pipe a sending it `total` checked bytes, started.
fn check_transfer(lab: &mut Lab, port: u16, total: u64) -> (usize, usize) {
    lab.checked_stream("a", "b", &format!("10.61.0.2:{port}"), total, "block")
}

#[test]
fn a_limited_pipe_takes_the_time_its_limit_implies() {
    if !root_or_skip("rate transfer") {
        return;
    }
    let mut lab = Lab::start("block");
    pipes(&lab);
    let set = lab.json(&["rate", "set", "a", "--egress", "400mbit", "--json"]);
    assert_eq!(set["egress_bps"], 400_000_000, "{set}");
    let total: u64 = 100_000_000;
    let (srv, cli) = check_transfer(&mut lab, 7000, total);
    let v = lab.intact((srv, cli), Duration::from_secs(120), "the limited transfer");
    // the receiver's time from first to last byte
    let secs = total as f64 * 8.0 / (v["result"]["gbps"].as_f64().unwrap() * 1e9);
    // the limit counts frames with their headers: 1514 bytes per 1460 of payload
    let payload_time = total as f64 * 8.0 / 400e6;
    let frame_time = payload_time * 1514.0 / 1460.0;
    // one bucket (10 ms at the rate) may go at once, plus at most a coarse interval's credit
    // (another 10 ms: the limiter cuts the excess only at coarse boundaries); and the window
    // from the first byte to the last leaves out the first segment's own time (at most 64 KiB,
    // 1.3 ms at the rate)
    let first_segment = 65536.0 * 8.0 / 400e6;
    assert!(
        secs >= payload_time - 0.020 - first_segment,
        "{secs:.3} s: faster than the limit allows"
    );
    assert!(
        secs <= frame_time * 1.10,
        "{secs:.3} s: more than 10% over the {frame_time:.3} s the limit implies"
    );
    let show = lab.json(&["rate", "show", "a", "--json"]);
    let waits = show["egress"]["waits"].as_u64().unwrap();
    assert!(waits > 0, "the frames waited for tokens: {show}");
    assert_eq!(lab.counter("a", "rate_limited"), 0, "egress never drops");
}

#[test]
fn bad_rates_and_unknown_pipes_get_one_line_and_change_nothing() {
    if !root_or_skip("rate errors") {
        return;
    }
    let lab = Lab::start("block");
    pipes(&lab);
    lab.ok(&["rate", "set", "a", "--egress", "300mbit"]);
    for args in [
        &["rate", "set", "nope", "--egress", "1mbit"][..],
        &["rate", "set", "a", "--egress", "fast"],
        &["rate", "set", "a", "--egress", "0"],
        &["rate", "set", "a", "--egress", "5tbit"],
        &["rate", "set", "a", "--ingress-burst", "1000"],
        &["rate", "show", "nope"],
        &["rate", "clear", "nope"],
    ] {
        let o = lab.run(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let show = lab.json(&["rate", "show", "a", "--json"]);
    assert_eq!(show["egress_bps"], 300_000_000, "{show}");
    assert!(show["ingress_bps"].is_null(), "{show}");
    let b = lab.json(&["rate", "show", "b", "--json"]);
    assert!(
        b["egress_bps"].is_null() && b["ingress_bps"].is_null(),
        "{b}"
    );
}

#[test]
fn limits_survive_a_daemon_restart() {
    if !root_or_skip("rate restart") {
        return;
    }
    let mut lab = Lab::start("block");
    pipes(&lab);
    lab.ok(&[
        "rate",
        "set",
        "a",
        "--egress",
        "300mbit",
        "--ingress",
        "200mbit",
        "--ingress-burst",
        "4mbit",
    ]);
    lab.kill_daemon();
    lab.start_daemon();
    let show = lab.json(&["rate", "show", "a", "--json"]);
    assert_eq!(show["egress_bps"], 300_000_000, "{show}");
    assert_eq!(show["ingress_bps"], 200_000_000, "{show}");
    assert_eq!(show["ingress"]["burst_bits"], 4_000_000, "{show}");
    lab.ok(&["rate", "clear", "a"]);
    let show = lab.json(&["rate", "show", "a", "--json"]);
    assert!(show["egress_bps"].is_null(), "{show}");
}

/// A flow held at its limit moves in runs its tokens release, at times the daemon knows: the
/// master sleeps between them, at the daemon's default idle policy too (which yields for a
/// while after work before it sleeps), rather than polling for the tokens. Egress and ingress.
#[test]
fn a_master_sleeps_between_the_runs_of_a_paced_flow() {
    if !root_or_skip("paced master") {
        return;
    }
    let mut lab = Lab::start("adaptive");
    pipes(&lab);
    for (k, (pipe, dir)) in [("a", "--egress"), ("b", "--ingress")]
        .into_iter()
        .enumerate()
    {
        lab.ok(&["rate", "set", pipe, dir, "200mbit"]);
        // 2.4 s at the limit
        let total: u64 = 60_000_000;
        let (srv, cli) = check_transfer(&mut lab, 7100 + k as u16, total);
        // past the first bucket and the idle policy's first spell
        std::thread::sleep(Duration::from_millis(600));
        let top = lab.json(&["top", "--once", "--json", "--interval", "1"]);
        lab.intact((srv, cli), Duration::from_secs(60), "the paced transfer");
        let m = &top["masters"][0];
        let flowing = top["pipes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["rate_waits_per_s"].as_f64().unwrap_or(0.0) > 0.0);
        assert!(flowing, "the sample saw the flow held at its limit: {top}");
        let asleep = m["asleep_pct"].as_f64().unwrap();
        assert!(
            asleep > 50.0,
            "{dir}: the master slept {asleep:.1}% of the paced flow's time: {m}"
        );
        lab.ok(&["rate", "clear", pipe]);
    }
}
