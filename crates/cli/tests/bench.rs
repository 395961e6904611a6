//! The benchmarks as a user runs them, shortened: they produce results in the schema, measure
//! the path they claim, and leave no namespace, run directory or process behind.

mod common;
use common::*;
use std::process::Command;

/// Namespaces, run directories (daemons on /dev/shm; CNI and OVS state in the temp dir) and
/// processes made by process `pid` (their names and command lines carry `dn<pid>x`) that still
/// exist.
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
    let tag = format!("dn{pid}x");
    let mut dirs = list("/dev/shm", format!("docknet-{tag}"));
    dirs.extend(list(std::env::temp_dir().to_str().unwrap(), tag.clone()));
    // processes whose command line names one of the run's namespaces or directories
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(&tag) {
                dirs.push(format!("process {}: {c}", e.file_name().to_string_lossy()));
            }
        }
    }
    (list("/run/netns", tag), dirs)
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

/// Runs docknet with `args` (and `extra`): it must succeed and leave nothing behind.
fn run_clean(args: &[&str], extra: &std::path::Path) -> std::process::Output {
    let (o, pid) = run(args, extra);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(leftovers(pid), (vec![], vec![]), "nothing left behind");
    o
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
    let _one = one_at_a_time();
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
        assert!(report.join("index.html").exists() && report.join("report.md").exists());
        let v = valid(&json);
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
            // the machine's CPU per unit of work, by kind (Suo et al.'s service demand)
            let d = &r[if wl == "rr" {
                "cpu_s_per_kreq"
            } else {
                "cpu_s_per_gb"
            }];
            assert!(d["total"].as_f64().unwrap() > 0.0, "{r}");
            let parts: f64 = ["user", "system", "irq", "softirq"]
                .iter()
                .map(|k| d[k].as_f64().unwrap())
                .sum();
            assert!((parts - d["total"].as_f64().unwrap()).abs() < 1e-9, "{d}");
        }
        // the cross-core handoff probe before each point (it may give up on a busy machine,
        // not before all eight; a figure is microseconds per 32 KiB, under its 500 ms limit)
        let probed: Vec<f64> = rows.iter().filter_map(|r| r["xcore_us"].as_f64()).collect();
        if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
            assert!(!probed.is_empty(), "no xcore_us in {rows:?}");
        }
        assert!(probed.iter().all(|&x| x > 0.0 && x < 2_000.0), "{probed:?}");
    }
}

#[test]
fn rr_over_ipv6_measures_the_modes_that_can_and_says_why_not_for_the_others() {
    let _one = one_at_a_time();
    // loopback over ::1, veth and bridge with IPv6 addresses, DockNet on dual-stack pipes
    if !root_or_skip("bench_ipv6") || !dnperf_built() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("v6.json");
    run_clean(
        &[
            "bench",
            "rr",
            "--ipv6",
            "--modes",
            "loopback,veth,bridge,bridge-nat,docknet,docknet-fc,docknet-preload",
            "--sizes",
            "64",
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "--json",
        ],
        &json,
    );
    let v = valid(&json);
    assert_eq!(v["env"]["ipv6"], true);
    let rows = rows_of(&json, "rr");
    let mut modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    modes.sort();
    modes.dedup();
    assert_eq!(
        modes,
        ["bridge", "docknet", "docknet-fc", "loopback", "veth"],
        "{rows:?}"
    );
    for r in &rows {
        assert!(r["p50_us"].as_f64().unwrap() > 0.0, "{r}");
    }
    let skipped = v["not_available"].as_array().unwrap();
    for m in ["bridge-nat", "docknet-preload"] {
        let s = skipped
            .iter()
            .find(|s| s["mode"] == m)
            .unwrap_or_else(|| panic!("{m} not reported: {skipped:?}"));
        assert_eq!(s["status"], "skipped");
        assert!(s["reason"].as_str().unwrap().contains("IPv6"), "{s}");
    }
    // only rr and stream, and not with the cross-check
    let (o, _) = run(&["bench", "pairs", "--ipv6", "--json"], &json);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--ipv6"));
}

#[test]
fn raw_bench_reports_targets_and_cleans_up() {
    if !root_or_skip("raw_bench") {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let o = run_clean(
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
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("target: fast channel 64 B one-way p50"),
        "{out}"
    );
    let md = std::fs::read_to_string(dir.path().join("raw-bench.md")).unwrap();
    assert!(md.contains("## Targets") && md.contains("## Results"));
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
        &["bench", "chain", "--modes", "overlay"][..],
        &["bench", "chain", "--modes", "vxlan"][..],
        &["bench", "chain", "--topology", "two-host", "--modes", "nat"][..],
        &[
            "bench",
            "chain",
            "--topology",
            "two-host",
            "--modes",
            "docknet-fc",
        ][..],
        &["bench", "startup", "--launch", "exec"][..],
        &["bench", "http", "--placement", "one-core"][..],
        &[
            "bench",
            "http",
            "--backends",
            "1,2",
            "--placement",
            "unpinned",
        ][..],
    ] {
        let o = Command::new(EXE).args(args).output().unwrap();
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.starts_with("docknet: error: "), "{e}");
    }
    // an overlay is asked for where it exists
    let o = Command::new(EXE)
        .args(["bench", "chain", "--modes", "overlay"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("--topology two-host"));
}

#[test]
fn kernel_modes_are_built_measured_and_removed_and_missing_ones_explained() {
    if !root_or_skip("kernel_modes") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("k.json");
    let links = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let links_before = links();
    run_clean(
        &[
            "bench",
            "rr",
            "--modes",
            "loopback,container,veth,bridge-nat,macvlan,ipvlan,ovs,sriov",
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
    assert_eq!(
        links(),
        links_before,
        "no link left in the host's namespace"
    );
    let v = valid(&json);
    for mode in ["loopback", "container", "veth", "bridge-nat", "macvlan"] {
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
    for mode in ["ipvlan", "ovs", "sriov"] {
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

/// Checks a results file against docs/results.schema.json; returns it.
fn valid(json: &std::path::Path) -> serde_json::Value {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../../docs/results.schema.json")).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&v)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{}: {errors:#?}", json.display());
    v
}

#[test]
fn the_schema_rejects_what_it_should() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.json");
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../../docs/results.schema.json")).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let good = serde_json::json!({"env": {"kernel": "6", "cores": 2, "command": "x", "duration_s": 1,
        "warmup_s": 0, "repeat": 1}, "results": [{"workload": "stream", "mode": "bridge",
        "msg_size": 64, "mtu": 1500, "repeat": 0, "tool": "iperf3", "cpu_s_per_op": null,
        "p50_us": null, "p99_us": null, "p999_us": null, "mean_us": null, "gbps": 1.0,
        "msgs_per_s": 2.0}]});
    assert!(validator.is_valid(&good));
    for (k, bad) in [
        ("tool", serde_json::json!("netperf")),
        ("gbps", serde_json::json!(null)),
        ("msg_size", serde_json::json!(0)),
        ("pairs", serde_json::json!(4)),
    ] {
        let mut v = good.clone();
        v["results"][0][k] = bad;
        assert!(!validator.is_valid(&v), "{k}");
    }
    std::fs::write(&f, "{}").unwrap();
    assert!(!validator.is_valid(&serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap()));
}

/// Every row of a results file, validated against the schema.
fn rows_of(json: &std::path::Path, workload: &str) -> Vec<serde_json::Value> {
    let v = valid(json);
    assert!(v["env"]["kernel"].is_string() && v["env"]["cores"].is_u64());
    let rows = v["results"].as_array().unwrap().clone();
    for r in &rows {
        assert_eq!(r["workload"], workload);
        for k in ["mode", "msg_size", "mtu", "repeat", "tool", "cpu_s_per_op"] {
            assert!(!r[k].is_null(), "{k} in {r}");
        }
    }
    rows
}

#[test]
fn pairs_run_concurrently_and_report_memory_per_pair() {
    if !root_or_skip("pairs") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    run_clean(
        &[
            "bench",
            "pairs",
            "--modes",
            "bridge,docknet-fc",
            "--pairs",
            "1,3",
            "--sizes",
            "1024",
            "--duration",
            "0.4",
            "--warmup",
            "0.1",
            "--json",
        ],
        &json,
    );
    let rows = rows_of(&json, "pairs");
    assert_eq!(rows.len(), 4, "{rows:?}");
    for r in &rows {
        assert!([1, 3].contains(&r["pairs"].as_u64().unwrap()), "{r}");
        assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["p50_us"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["mem_kib_per_pair"].as_f64().is_some(), "{r}");
        // service demand of both phases, the whole machine's CPU by kind
        for k in ["cpu_s_per_kreq", "cpu_s_per_gb"] {
            assert!(r[k]["total"].as_f64().is_some_and(|t| t >= 0.0), "{k}: {r}");
        }
        // per-pair latency comes from every pair's histogram: 3 pairs, 3x the samples of one
        let n: u64 = r["one_way_hist"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b[1].as_u64().unwrap())
            .sum();
        assert!(n > 0);
    }
}

#[test]
fn a_failing_mode_is_skipped_with_its_error_and_the_others_still_run() {
    if !root_or_skip("failing_mode") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    // CNI plugins that exist but fail, as a broken installation would
    let dir = tempfile::tempdir().unwrap();
    let cni = dir.path().join("cni");
    std::fs::create_dir(&cni).unwrap();
    for p in ["bridge", "host-local"] {
        let f = cni.join(p);
        std::fs::write(
            &f,
            "#!/bin/sh\necho '{\"code\":999,\"msg\":\"plugin broken on purpose\"}'\nexit 1\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let json = dir.path().join("f.json");
    let child = Command::new(EXE)
        .args([
            "bench",
            "rr",
            "--modes",
            "bridge,loopback,docknet-fc",
            "--sizes",
            "64",
            "--duration",
            "0.2",
            "--warmup",
            "0.1",
            "--json",
        ])
        .arg(&json)
        .env("CNI_PATH", &cni)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(leftovers(pid), (vec![], vec![]));
    let v = valid(&json);
    let skipped = v["not_available"].as_array().unwrap();
    let b = skipped
        .iter()
        .find(|x| x["mode"] == "bridge")
        .expect("bridge skipped");
    assert_eq!(b["status"], "skipped");
    assert!(
        b["reason"]
            .as_str()
            .unwrap()
            .contains("plugin broken on purpose"),
        "{b}"
    );
    let modes: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["mode"].as_str().unwrap())
        .collect();
    assert!(
        modes.contains(&"loopback") && modes.contains(&"docknet-fc"),
        "{modes:?}"
    );
    assert!(!modes.contains(&"bridge"));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("bridge") && out.contains("skipped"), "{out}");
}

#[test]
fn crosscheck_rows_come_from_sockperf_and_iperf3() {
    if !root_or_skip("crosscheck") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    for (wl, tool) in [("rr", "sockperf"), ("stream", "iperf3")] {
        let json = dir.path().join(format!("{wl}.json"));
        let (o, _) = run(
            &[
                "bench",
                wl,
                "--modes",
                "veth",
                "--sizes",
                "1024",
                "--duration",
                "1",
                "--warmup",
                "0.1",
                "--crosscheck",
                "--json",
            ],
            &json,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let rows = rows_of(&json, wl);
        let x: Vec<_> = rows.iter().filter(|r| r["tool"] == tool).collect();
        assert_eq!(x.len(), 1, "{rows:?}");
        let k = if wl == "rr" { "p50_us" } else { "gbps" };
        assert!(x[0][k].as_f64().unwrap() > 0.0, "{}", x[0]);
        assert_eq!(rows.iter().filter(|r| r["tool"] == "dnperf").count(), 2);
    }
}

#[test]
fn the_report_renders_in_headless_chromium_with_every_figure() {
    if !root_or_skip("report") || !dnperf_built() {
        return;
    }
    // every point must measure something (the schema wants each rr point's histogram): not
    // beside the raw and pairs benches' pinned, prioritized peers
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let rep = dir.path().join("rep");
    for wl in ["rr", "stream"] {
        let (o, _) = run(
            &[
                "bench",
                wl,
                "--modes",
                "loopback,docknet-fc",
                "--sizes",
                "64,1024",
                "--duration",
                "0.2",
                "--warmup",
                "0.1",
                "--report",
            ],
            &rep,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    valid(&rep.join("tcp-rr.json"));
    valid(&rep.join("tcp-stream.json"));
    // docknet report rebuilds the same report from the JSON files
    let out = dir.path().join("out");
    let o = Command::new(EXE)
        .arg("report")
        .arg(rep.join("tcp-rr.json"))
        .arg(rep.join("tcp-stream.json"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut figures = 0;
    for f in [
        "cdf-rr-64",
        "cdf-rr-1024",
        "rr-latency-vs-size",
        "stream-goodput-vs-size",
        "ratio-to-bridge-rr",
    ] {
        let png = out.join("figures").join(format!("{f}.png"));
        let svg = out.join("figures").join(format!("{f}.svg"));
        if f.starts_with("ratio") {
            // no bridge in this run: no ratio figure
            assert!(!png.exists());
            continue;
        }
        assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"), "{f}");
        assert!(
            std::fs::read_to_string(&svg).unwrap().starts_with("<svg"),
            "{f}"
        );
        figures += 1;
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("figures/cdf-rr-64.png") && md.contains("| docknet-fc |"),
        "{md}"
    );
    let chromium = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    let Some(chromium) = chromium else {
        if std::env::var("DOCKNET_REQUIRE_ROOT_TESTS").as_deref() == Ok("1") {
            panic!("no chromium to render the report (scripts/test.sh installs it)");
        }
        eprintln!("skipping the browser check: no chromium");
        return;
    };
    let url = format!("file://{}", out.join("index.html").display());
    let o = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--allow-file-access-from-files",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && dom.contains("DockNet lab report"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // the page counts its figures and the ones the browser decoded
    let attr = |name: &str| -> usize {
        let k = format!("{name}=\"");
        let i = dom
            .find(&k)
            .unwrap_or_else(|| panic!("{name} missing: {dom}"))
            + k.len();
        dom[i..].split('"').next().unwrap().parse().unwrap()
    };
    assert_eq!(attr("data-figures"), figures, "{dom}");
    assert_eq!(
        attr("data-figures-loaded"),
        figures,
        "every figure loaded: {dom}"
    );
    assert!(dom.contains("<table>") && dom.contains("docknet-fc"));
}

#[test]
fn ctrl_c_stops_the_bench_and_removes_everything() {
    if !root_or_skip("interrupt") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(EXE)
        .args([
            "bench",
            "rr",
            "--modes",
            "bridge-nat,ovs,docknet",
            "--sizes",
            "64",
            "--duration",
            "2",
            "--warmup",
            "0.1",
            "--repeat",
            "5",
            "--json",
        ])
        .arg(dir.path().join("never.json"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // wait until the topology exists and a measurement is running
    let t = std::time::Instant::now();
    while leftovers(pid).0.len() < 3 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "no topology appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "did not stop on SIGINT"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(err.contains("interrupted"), "{err}");
    assert_eq!(leftovers(pid), (vec![], vec![]), "{err}");
    assert!(!dir.path().join("never.json").exists());
}

#[test]
fn two_host_bench_measures_every_mode_and_cleans_up() {
    if !root_or_skip("two-host bench") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let (o, pid) = run(
        &[
            "bench",
            "rr",
            "--topology",
            "two-host",
            "--modes",
            "host,routed,nat,macvlan,vxlan,docknet,docknet-packet,docknet-pods",
            "--sizes",
            "64",
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
            "--json",
        ],
        &json,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(leftovers(pid), (vec![], vec![]), "{err}");
    let v = valid(&json);
    assert_eq!(v["env"]["topology"], "two-host");
    let rows = v["results"].as_array().unwrap();
    let mut modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    modes.dedup();
    assert_eq!(
        modes,
        [
            "host",
            "routed",
            "nat",
            "macvlan",
            "vxlan",
            "docknet",
            "docknet-packet",
            "docknet-pods"
        ],
        "every mode measured: {err}"
    );
    for r in rows {
        assert_eq!(r["topology"], "two-host", "{r}");
        assert_eq!(r["mtu"], 1500, "rows carry the wire's MTU: {r}");
        assert!(r["p50_us"].as_f64().unwrap() > 0.0, "{r}");
    }
    // DockNet in both of its placements, each daemon on its host's core or both on core 0
    let cores: Vec<&str> = rows
        .iter()
        .filter(|r| r["mode"] == "docknet")
        .map(|r| r["cores"].as_str().unwrap())
        .collect();
    assert_eq!(cores, ["c0 s1 m0 m1", "c1 s1 m0 m0"]);
    // every mode's ratio to host, and the two-host targets
    let ratios: Vec<&str> = v["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert!(
        ratios
            .iter()
            .any(|l| l.contains("vxlan") && l.contains("vs host")),
        "{ratios:?}"
    );
    assert!(v["targets"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t.as_str().unwrap().contains("than routed")));
    // pods made by the CNI plugin and routed by the node agent, judged against the kernel's
    // routed pods in both placements
    let pods: Vec<&str> = v["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str())
        .filter(|t| t.contains("docknet-pods 64 B rr p50 at most routed's"))
        .collect();
    assert_eq!(pods.len(), 2, "{pods:?}");

    // a mode that fails to build (AF_XDP takes frames of at most 16 buffers, not a
    // 65535-byte MTU) is skipped and leaves nothing behind either
    let (o, pid) = run(
        &[
            "bench",
            "rr",
            "--topology",
            "two-host",
            "--modes",
            "docknet,docknet-packet",
            "--mtus",
            "65535",
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
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(leftovers(pid), (vec![], vec![]), "{err}");
    let v = valid(&json);
    let skipped = v["not_available"].as_array().unwrap();
    assert!(
        skipped.iter().any(|s| s["mode"] == "docknet"
            && s["reason"].as_str().unwrap().contains("--nic-mode packet")),
        "{skipped:?}"
    );
    assert!(v["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["mode"] == "docknet-packet" && r["mtu"] == 65535));
}

#[test]
fn ctrl_c_removes_both_hosts_and_the_wire() {
    if !root_or_skip("two-host interrupt") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let mut child = Command::new(EXE)
        .args([
            "bench",
            "stream",
            "--topology",
            "two-host",
            "--modes",
            "docknet",
            "--wire-rate",
            "1gbit",
            "--sizes",
            "1024",
            "--duration",
            "3",
            "--repeat",
            "5",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let t = std::time::Instant::now();
    // the wire's switch and both hosts exist, and a daemon runs in each host
    while leftovers(pid).0.len() < 3 || leftovers(pid).1.len() < 2 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "no topology appeared: {:?}",
            leftovers(pid)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "did not stop on SIGINT"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert_eq!(leftovers(pid), (vec![], vec![]), "{err}");
}

#[test]
fn the_rate_experiment_limits_both_modes_and_cleans_up() {
    if !root_or_skip("bench rate") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("rate.json");
    let o = run_clean(
        &[
            "bench",
            "rate",
            "--steps",
            "30%",
            "--step",
            "1.5",
            "--timeline",
            "1,2.5,3",
            "--json",
        ],
        &json,
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Fast channels bypass"), "{out}");
    let v = valid(&json);
    let rows = v["results"].as_array().unwrap();
    for mode in ["bridge", "docknet"] {
        let mean = |scenario: &str, phase: &str, flow: &str| {
            let g: Vec<f64> = rows
                .iter()
                .filter(|r| {
                    r["mode"] == mode
                        && r["scenario"] == scenario
                        && r["phase"] == phase
                        && r["flow"] == flow
                        && r["t_s"].as_f64().is_some()
                })
                .map(|r| r["gbps"].as_f64().unwrap())
                .collect();
            assert!(!g.is_empty(), "{mode}: no {scenario}/{phase}/{flow} bins");
            g.iter().sum::<f64>() / g.len() as f64
        };
        let limit = rows
            .iter()
            .find(|r| r["mode"] == mode && r["phase"] == "30%")
            .and_then(|r| r["limit_bps"].as_f64())
            .unwrap_or_else(|| panic!("{mode}: the 30% step has its limit"));
        let (free, held) = (
            mean("steps", "unlimited", "tcp"),
            mean("steps", "30%", "tcp"),
        );
        // the limit holds (with room for the burst and the first bins), and it is the limit
        // that holds the flow back, not the flow's own pace
        assert!(
            held * 1e9 < limit * 1.25,
            "{mode}: {held} Gbps over {limit}"
        );
        assert!(
            free > held * 1.5,
            "{mode}: unlimited {free} vs limited {held}"
        );
        for sc in ["none", "udp-limited", "both-limited"] {
            assert!(
                mean(sc, "udp", "udp") > 0.0,
                "{mode} {sc}: the UDP flow ran"
            );
        }
    }
}

#[test]
fn http_bench_runs_its_servers_and_tools_and_cleans_up() {
    if !root_or_skip("http bench") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("http.json");
    let (o, pid) = run(
        &[
            "bench",
            "http",
            "--modes",
            "bridge,docknet-fc",
            "--connections",
            "4",
            "--placement",
            "pinned,unpinned",
            "--duration",
            "0.5",
            "--warmup",
            "0.2",
            "--json",
        ],
        &json,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(leftovers(pid), (vec![], vec![]), "nothing left behind");
    let rows = rows_of(&json, "http");
    // each mode also as a user gets it: nothing pinned, every program at its defaults
    for mode in ["bridge", "docknet-fc"] {
        assert!(
            rows.iter().any(|r| r["mode"] == mode
                && r["placement"] == "unpinned"
                && r["cores"] == "-"
                && r["req_per_s"].as_f64().unwrap() > 100.0),
            "{mode} unpinned: {rows:?}"
        );
    }
    let v = valid(&json);
    assert!(
        v["targets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t.to_string().contains("unpinned at defaults")),
        "the unpinned rows are judged on their own: {}",
        v["targets"]
    );
    let has = |mode: &str, server: &str, tool: &str| {
        rows.iter().any(|r| {
            r["mode"] == mode
                && r["server"] == server
                && r["tool"] == tool
                && r["req_per_s"].as_f64().unwrap() > 100.0
                && r["errors"] == 0
        })
    };
    assert!(has("bridge", "docknet-httpd", "docknet-load"), "{rows:?}");
    assert!(
        has("docknet-fc", "docknet-httpd", "docknet-load"),
        "{rows:?}"
    );
    // wrk and nginx where Debian's packages are installed (scripts/setup.sh installs them)
    for (prog, server, tool) in [("wrk", "docknet-httpd", "wrk"), ("nginx", "nginx", "wrk")] {
        let there = Command::new("sh")
            .args(["-c", &format!("command -v {prog}")])
            .status()
            .unwrap()
            .success();
        let brief: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} {} req/s {} errors",
                    r["mode"], r["server"], r["tool"], r["req_per_s"], r["errors"]
                )
            })
            .collect();
        assert_eq!(has("bridge", server, tool), there, "{prog}: {brief:?}");
    }
    let v = valid(&json);
    assert!(v["not_available"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["mode"] == "docknet-fc (nginx)"));
}

#[test]
fn nat_and_cluster_benches_measure_through_the_balancers_and_clean_up() {
    if !root_or_skip("nat and cluster") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let nat = dir.path().join("nat.json");
    run_clean(
        &[
            "bench",
            "nat",
            "--rounds",
            "1",
            "--duration",
            "0.5",
            "--warmup",
            "0.2",
            "--json",
        ],
        &nat,
    );
    let rows = rows_of(&nat, "nat");
    let through = rows
        .iter()
        .find(|r| r["server"] == "docknet-natlb")
        .expect("a row through the balancer");
    assert!(through["added_p50_us"].is_number() && through["p50_us"].as_f64().unwrap() > 0.0);
    let cl = dir.path().join("cluster.json");
    run_clean(
        &[
            "bench",
            "http",
            "--backends",
            "1,2",
            "--work-us",
            "5",
            "--connections",
            "8",
            "--duration",
            "0.5",
            "--warmup",
            "0.2",
            "--json",
        ],
        &cl,
    );
    let rows = rows_of(&cl, "http");
    for mode in ["bridge", "docknet-fc"] {
        for b in [1, 2] {
            let r = rows
                .iter()
                .find(|r| r["mode"] == mode && r["backends"] == b)
                .unwrap_or_else(|| panic!("{mode} with {b} backends: {rows:?}"));
            assert!(
                r["req_per_s"].as_f64().unwrap() > 100.0 && r["errors"] == 0,
                "{r}"
            );
            assert!(
                r["cpu_us_per_req"]["backends"].as_f64().unwrap() > 0.0,
                "{r}"
            );
        }
    }
}

#[test]
fn service_bench_measures_docknet_and_kube_proxy_rules_and_cleans_up() {
    if !root_or_skip("service bench") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("service.json");
    run_clean(
        &[
            "bench",
            "http",
            "--service",
            "--backends",
            "2",
            "--connections",
            "4",
            "--duration",
            "0.4",
            "--warmup",
            "0.2",
            "--json",
        ],
        &out,
    );
    let rows = rows_of(&out, "http");
    let mut want = vec![
        ("docknet-auto", "direct", 1),
        ("docknet-auto", "docknet service", 2),
        ("bridge", "direct", 1),
        ("bridge", "kube-proxy iptables", 2),
    ];
    if std::path::Path::new("/usr/sbin/nft").exists() {
        want.push(("bridge", "kube-proxy nftables", 2));
    }
    for (mode, via, b) in want {
        let r = rows
            .iter()
            .find(|r| r["mode"] == mode && r["scenario"] == via && r["backends"] == b)
            .unwrap_or_else(|| panic!("{mode} {via}: {rows:?}"));
        assert!(
            r["req_per_s"].as_f64().unwrap() > 100.0 && r["errors"] == 0,
            "{r}"
        );
    }
    let v = valid(&out);
    let targets = v["targets"].as_array().unwrap();
    assert!(
        targets
            .iter()
            .any(|t| t.as_str().unwrap().contains("kube-proxy iptables")),
        "{targets:?}"
    );
}

#[test]
fn seed_studies_measure_render_and_clean_up() {
    if !root_or_skip("seed studies") || !dnperf_built() {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("rep");
    let json = dir.path().join("startup.json");
    run_clean(
        &[
            "bench",
            "startup",
            "--modes",
            "bridge,docknet",
            "--reps",
            "3",
            "--report",
            report.to_str().unwrap(),
            "--json",
        ],
        &json,
    );
    let v = valid(&json);
    let rows = v["results"].as_array().unwrap();
    for (mode, launch) in [
        ("bridge", "netns"),
        ("docknet", "netns"),
        ("docknet", "run"),
    ] {
        let r = rows
            .iter()
            .find(|r| r["mode"] == mode && r["workload"] == "startup" && r["launch"] == launch)
            .unwrap_or_else(|| panic!("{mode} {launch}: {rows:?}"));
        let (p50, p99) = (r["p50_ms"].as_f64().unwrap(), r["p99_ms"].as_f64().unwrap());
        assert!(p50 > 0.0 && p99 >= p50, "{r}");
        assert!(r["ping_p50_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["create_p50_ms"].as_f64().unwrap() <= p50, "{r}");
    }
    // across two hosts: the encrypted overlay (its tunnel in the create step) and DockNet's
    // daemons on the wire
    let json2 = dir.path().join("startup2.json");
    run_clean(
        &[
            "bench",
            "startup",
            "--topology",
            "two-host",
            "--modes",
            "vxlan-openvpn,docknet",
            "--launch",
            "netns",
            "--reps",
            "2",
            "--json",
        ],
        &json2,
    );
    let v = valid(&json2);
    for mode in ["vxlan-openvpn", "docknet"] {
        let r = v["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["mode"] == mode)
            .unwrap_or_else(|| panic!("{mode}: {v}"));
        assert_eq!(r["topology"], "two-host", "{r}");
        assert!(r["p50_ms"].as_f64().unwrap() >= r["create_p50_ms"].as_f64().unwrap());
    }
    let cq = dir.path().join("cpuquota.json");
    let (o, pid) = run(
        &[
            "bench",
            "cpuquota",
            "--modes",
            "bridge,docknet,docknet-fc",
            "--quotas",
            "1000,10000",
            "--idle",
            "adaptive",
            "--duration",
            "0.5",
            "--warmup",
            "0.1",
            "--report",
            report.to_str().unwrap(),
            "--json",
        ],
        &cq,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(leftovers(pid), (vec![], vec![]), "nothing left behind");
    let cgroups: Vec<String> = std::fs::read_dir("/sys/fs/cgroup/cpu")
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&format!("dn{pid}x")))
                .collect()
        })
        .unwrap_or_default();
    assert!(cgroups.is_empty(), "cgroups left behind: {cgroups:?}");
    let v = valid(&cq);
    let rows = v["results"].as_array().unwrap();
    for mode in ["bridge", "docknet", "docknet-fc"] {
        for q in [1000, 10000] {
            let r = rows
                .iter()
                .find(|r| r["mode"] == mode && r["quota_us"] == q)
                .unwrap_or_else(|| panic!("{mode} {q}: {rows:?}"));
            assert!(r["samples"].as_u64().unwrap() > 0, "{r}");
            assert!(r["p99_us"].as_f64().unwrap() >= r["p50_us"].as_f64().unwrap());
            assert!(r["over_1ms"].is_u64(), "{r}");
            // through the daemon, its master shares the client's core, not the server's
            let shared = r["placement"]
                .as_str()
                .unwrap()
                .contains("with the daemon's master");
            assert_eq!(shared, mode == "docknet", "{r}");
        }
    }
    // a chain run: every mode and size measured, on its topology, by docknet-load
    let chain = |name: &str, topology: &str, modes: [&str; 2], sizes: [usize; 2], runs: u64| {
        let out = dir.path().join(name);
        let (m, z) = (modes.join(","), format!("{},{}", sizes[0], sizes[1]));
        run_clean(
            &[
                "bench",
                "chain",
                "--topology",
                topology,
                "--modes",
                &m,
                "--sizes",
                &z,
                // long enough that one retransmission timeout (smoltcp's minimum is 1 s),
                // met when the full suite loads the machine, still leaves answers to count
                "--duration",
                "1.5",
                "--warmup",
                "0.2",
                "--repeat",
                &runs.to_string(),
                "--report",
                report.to_str().unwrap(),
                "--json",
            ],
            &out,
        );
        let v = valid(&out);
        let point = |rows: &str, mode: &str, size: usize| -> Vec<serde_json::Value> {
            v[rows]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["mode"] == mode && r["msg_size"] == size && r["workload"] == "chain")
                .cloned()
                .collect()
        };
        for mode in modes {
            for size in sizes {
                // every run in the results, numbered; one row of their medians in the summary
                let runs_of = point("results", mode, size);
                let mut seen: Vec<u64> = runs_of
                    .iter()
                    .map(|r| r["repeat"].as_u64().unwrap())
                    .collect();
                seen.sort_unstable();
                assert_eq!(
                    seen,
                    (0..runs).collect::<Vec<_>>(),
                    "{mode} {size}: {}",
                    v["not_available"]
                );
                let [r] = &point("summary", mode, size)[..] else {
                    panic!("{mode} {size}: one summary row: {}", v["summary"]);
                };
                assert_eq!(r["repeat"], runs, "{r}");
                assert_eq!(r["topology"], topology, "{r}");
                assert!(r["transfer_bps"].as_f64().unwrap() > 0.0, "{r}");
                assert_eq!(r["tool"], "docknet-load");
            }
        }
        v
    };
    let v = chain(
        "chain.json",
        "one-host",
        ["loopback", "docknet-fc"],
        [10, 100000],
        2,
    );
    assert!(v["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l.as_str().unwrap().starts_with("docknet-fc/reference")));
    // one host: the peers yield a moment before sleeping, and the row says how they waited
    let fc = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["mode"] == "docknet-fc")
        .unwrap();
    assert_eq!(fc["idle"], "adaptive:0:50", "{fc}");
    assert_eq!(fc["daemon_idle"], "adaptive:0:200", "{fc}");
    // across two hosts: the reference and the encrypted overlay (VXLAN through OpenVPN)
    let v = chain(
        "chain2.json",
        "two-host",
        ["host", "vxlan-openvpn"],
        [100, 10000],
        1,
    );
    assert!(
        v["ratios"].as_array().unwrap().iter().any(|l| l
            .as_str()
            .unwrap()
            .starts_with("two hosts: encrypted overlay/reference")),
        "{}",
        v["ratios"]
    );
    // the report: its seed section with every study and their figures
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(
        md.contains("# Seed studies") && md.contains("Table 3.2") && md.contains("Suo"),
        "{md}"
    );
    assert!(md.contains("Kratzke"), "{md}");
    for f in [
        "seed-startup",
        "seed-cpuquota-p99",
        "seed-cpuquota-over-1ms",
        "seed-chain",
        "seed-chain-ratio",
    ] {
        assert!(
            report.join("figures").join(format!("{f}.png")).exists(),
            "{f}"
        );
    }
    let html = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(html.contains("<h2>Seed studies</h2>"));
}
