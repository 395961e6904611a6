//! The benchmarks as a user runs them, shortened: they produce results in the schema, measure
//! the path they claim, and leave no namespace, run directory or process behind.

mod common;
use common::*;
use std::process::Command;

/// Namespaces and run directories made by process `pid` (their names carry it) that still exist.
fn leftovers(pid: u32) -> (Vec<String>, Vec<String>) {
    let list = |d: &str, pre: String| -> Vec<String> {
        std::fs::read_dir(d)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with(&pre))
                    .collect()
            })
            .unwrap_or_default()
    };
    (
        list("/run/netns", format!("dn{pid}x")),
        list("/dev/shm", format!("docknet-dn{pid}x")),
    )
}

/// Runs docknet with `args`; returns its output and pid.
fn run(args: &[&str], extra: &std::path::Path) -> (std::process::Output, u32) {
    let child = Command::new(EXE)
        .args(args)
        .arg(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    (child.wait_with_output().unwrap(), pid)
}

/// `docknet bench` runs the dnperf built next to it.
fn dnperf_built() -> bool {
    let p = std::path::Path::new(EXE).with_file_name("dnperf");
    assert!(p.exists(), "{} missing", p.display());
    assert_eq!(p, std::path::Path::new(env!("CARGO_BIN_EXE_dnperf")));
    true
}

#[test]
fn tcp_bench_measures_every_mode_and_cleans_up() {
    if !root_or_skip("tcp_bench") || !dnperf_built() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    for wl in ["rr", "stream"] {
        let (o, pid) = run(
            &[
                "bench",
                wl,
                "--sizes",
                "64,1024",
                "--duration",
                "0.3",
                "--warmup",
                "0.1",
                "--json",
            ],
            &json,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            leftovers(pid),
            (vec![], vec![]),
            "no namespace or run directory left behind"
        );
        let report = dir.path().join(format!("rep-{wl}"));
        let (o2, _) = run(
            &[
                "bench",
                wl,
                "--sizes",
                "64",
                "--modes",
                "docknet-fc",
                "--duration",
                "0.2",
                "--warmup",
                "0.1",
                "--report",
            ],
            &report,
        );
        assert!(
            o2.status.success(),
            "{}",
            String::from_utf8_lossy(&o2.stderr)
        );
        let md = std::fs::read_to_string(report.join(format!("tcp-{wl}.md"))).unwrap();
        assert!(
            md.contains("## Results") && md.contains("docknet-fc"),
            "{md}"
        );
        assert!(report.join(format!("tcp-{wl}.json")).exists());
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert!(v["env"]["kernel"].is_string());
        let rows = v["results"].as_array().unwrap();
        // bridge in two placements, docknet, docknet-fc; two sizes each
        assert_eq!(rows.len(), 8, "{rows:?}");
        for r in rows {
            assert_eq!(r["tool"], "dnperf");
            assert_eq!(r["workload"], wl);
            for k in ["mode", "msg_size", "mtu", "repeat", "cpu_s_per_op"] {
                assert!(!r[k].is_null(), "{k} in {r}");
            }
            if wl == "rr" {
                let p50 = r["p50_us"].as_f64().unwrap();
                assert!(p50 > 0.0 && p50 <= r["p99_us"].as_f64().unwrap());
                assert!(r["p99_us"].as_f64().unwrap() <= r["p999_us"].as_f64().unwrap());
            } else {
                assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
            }
        }
    }
}

#[test]
fn raw_bench_reports_targets_and_cleans_up() {
    if !root_or_skip("raw_bench") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (o, pid) = run(
        &[
            "raw",
            "bench",
            "--rr-sizes",
            "64",
            "--stream-sizes",
            "65536",
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "--report",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(leftovers(pid), (vec![], vec![]));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("target: fast channel 64 B one-way p50"),
        "{out}"
    );
    let md = std::fs::read_to_string(dir.path().join("raw-bench.md")).unwrap();
    assert!(md.contains("## Targets of issue #2") && md.contains("## Results"));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("raw-bench.json")).unwrap()).unwrap();
    assert!(v["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["path_ok"] == true));
}

#[test]
fn benches_refuse_unknown_modes_and_sizes_with_one_line() {
    for args in [
        &["bench", "rr", "--modes", "nonsense"][..],
        &["bench", "rr", "--sizes", "1"][..],
        &["raw", "bench", "--paths", "nope"][..],
    ] {
        let o = Command::new(EXE).args(args).output().unwrap();
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.starts_with("docknet: error: "), "{e}");
    }
}

#[test]
fn kernel_modes_are_built_measured_and_removed_and_missing_ones_explained() {
    if !root_or_skip("kernel_modes") || !dnperf_built() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("k.json");
    let (o, pid) = run(
        &[
            "bench",
            "rr",
            "--modes",
            "loopback,veth,bridge-nat,macvlan,ipvlan,sriov",
            "--sizes",
            "64",
            "--duration",
            "0.2",
            "--warmup",
            "0.1",
            "--json",
        ],
        &json,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(leftovers(pid), (vec![], vec![]));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for mode in ["loopback", "veth", "bridge-nat", "macvlan"] {
        let n = v["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["mode"] == mode && r["p50_us"].as_f64().is_some_and(|p| p > 0.0))
            .count();
        assert_eq!(n, 2, "{mode}: one row per placement");
    }
    // ipvlan needs a kernel module, sriov a NIC: each is either measured or reported with a
    // reason, never both and never neither
    let na = v["not_available"].as_array().unwrap();
    for mode in ["ipvlan", "sriov"] {
        let missing = na.iter().find(|x| x["mode"] == mode);
        let rows = v["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["mode"] == mode)
            .count();
        match missing {
            Some(e) => {
                assert!(e["reason"].as_str().unwrap().len() > 10);
                assert_eq!(rows, 0, "{mode}: not available, so no figures");
            }
            None => assert_eq!(rows, 2, "{mode}: available, so measured"),
        }
    }
}
