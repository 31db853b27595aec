//! The counter gate (issue 37 item 6) as CI runs it: a small `mttp` whose per-Manifest counters
//! (the fleet's requests by verb and resource, passes, renders, watch events) and peak memory must stay
//! within ±5 % of the baseline committed in `loadtest/gate/mttp.json` (`loadtest/src/gate.rs`).
//! A change that moves them on purpose measures the baseline again with the command this test
//! prints and commits it. Needs the `module-manager` binary built next to the test.

mod common;

/// The run the baseline was measured with, apart from the gate's own options: two replicas
/// with a 15 s lease and a 10 s renew deadline, so that a machine busy for a few seconds does
/// not lapse a replica's fence (a lapse restarts its shard watch and disturbs the counts; the
/// gate refuses such a run rather than judge it).
const RUN: &str = "--replicas 2 --shards 16 --lease-duration-seconds 15 --renew-interval-seconds 2 --renew-deadline-seconds 10 --manifests 200 --no-baselines --settle-seconds 180";

#[test]
fn a_small_mttp_keeps_its_counters() {
    let baseline = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gate/mttp.json");
    let out = tempfile::tempdir().unwrap();
    let update = std::env::var_os("LOADTEST_GATE_UPDATE").is_some();
    let options = format!(
        "{RUN} --gate {}{}",
        baseline.display(),
        if update { " --gate-update" } else { "" }
    );
    eprintln!(
        "measure the baseline again: LOADTEST_GATE_UPDATE=1 cargo test -p loadtest --test gate"
    );
    let args: Vec<&str> = options.split_whitespace().collect();
    let dir = common::run_loadtest(&[&["mttp"], &args[..]].concat(), out.path());
    let result = common::passed_results(&dir);
    let gate = &result["mttp"]["gate"];
    assert_eq!(gate["updated"], update, "{gate}");
    // The burst's counters: passes, renders, watch events, requests in all and at least three
    // kinds (create manifests, patch deployments, patch manifests/status…), memory.
    assert!(gate["counters"].as_u64().unwrap() >= 8, "{gate}");
    assert_eq!(gate["findings"], serde_json::json!([]), "{gate}");
}
