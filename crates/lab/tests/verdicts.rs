//! The verdicts of a stored run replayed through the verdict module: the quick main job
//! (`./scripts/bench.sh`) was run once with the lab as it was before it became a library, and
//! its results files (summary rows, with the ratio and target lines that code printed) are
//! stored here without their histograms. The library must judge the same rows the same way.

use docknet_lab::row::Results;
use docknet_lab::verdict::{ratio_lines, targets, Verdict};
use docknet_lab::Workload;

fn replay(file: &str, w: Workload) -> Results {
    let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
    let r = Results::parse(&std::fs::read(&path).unwrap()).unwrap();
    assert!(!r.summary.is_empty(), "{path}: no rows read");
    let lines: Vec<String> = targets(&r.summary, None)
        .iter()
        .map(Verdict::line)
        .collect();
    assert_eq!(lines, r.targets, "{path}: targets");
    assert_eq!(ratio_lines(&r.summary, w), r.ratios, "{path}: ratios");
    r
}

#[test]
fn the_quick_main_job_is_judged_as_before() {
    let rr = replay("quick-main-job-rr.json", Workload::Rr);
    assert_eq!(
        rr.targets.len(),
        4,
        "fc vs bridge, and docknet at three sizes"
    );
    assert!(rr.summary.iter().all(|r| r.workload == Workload::Rr));
    let st = replay("quick-main-job-stream.json", Workload::Stream);
    assert_eq!(st.targets.len(), 2);
    let pairs = replay("quick-main-job-pairs.json", Workload::Pairs);
    assert!(pairs.targets.is_empty() && pairs.ratios.len() == 6);
    // the not-available lines come through too
    assert!(rr.not_available.iter().any(|x| x.mode == "ipvlan"));
}
