//! The `remote` scenario through the `loadtest` binary at a small size: 20 targets (simulated
//! clusters) on two real API servers, 5 Manifests each, two replicas of the real
//! `module-manager`, a short idle window and the bare client per target. The report must show
//! that every target was reached through its own endpoint with its own credential: a run in
//! which the targets shared a client, an address or a token would leave some target with no
//! connection or no request of its own. One more target is blackholed from the start: its
//! Manifests hold at most one worker of each replica at any moment, and the others all become
//! Ready beside it. Ten spec edits after the idle window are each seen to start a pass (in the
//! replicas' logs) and to become Ready; five ConfigMaps changed on their targets are each seen
//! put back by the fleet (drift passes every 20 s). Last the whole fleet restarts, and every
//! Manifest is checked again by the new processes, each target reached again. The baselines:
//! the bare client per target, and the same with the Manifest's minimum writes.

mod common;

use serde_json::Value;

fn number(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what}: not a number: {v}"))
}

#[test]
fn the_remote_scenario_reaches_every_target_as_its_own_cluster() {
    let (_out, dir, result) = common::run_short_passed(
        "remote --targets 21 --blackholed-targets 1 --modules-per-target 5 --target-apiservers 2 --target-latency-ms 10 --settle-seconds 120 --idle-seconds 5 --edits 10 --edit-rate 5 --drift-interval 20s --drift-changes 5 --cold-restart",
    );
    let remote = &result["remote"];
    assert_eq!(remote["manifests"], 105);
    let burst = &remote["burst"];
    assert!(number(&burst["all_ready_seconds"], "all Ready") > 0.0);
    assert_eq!(burst["create_to_ready_seconds"]["count"], 100);
    // Every target: requests by its own ServiceAccount, connections to its own endpoint, and
    // at least the applies of its 5 modules' 4 objects each.
    assert!(number(&burst["requests_per_target"]["min"], "requests") > 0.0);
    assert!(
        number(
            &burst["connections_opened_per_target"]["min"],
            "connections"
        ) >= 1.0
    );
    assert!(number(&burst["writes_per_target"]["min"], "writes") >= 20.0);
    assert_eq!(burst["peak_rss_mib"].as_object().unwrap().len(), 2);
    assert_eq!(burst["sockets"].as_object().unwrap().len(), 2);
    assert_eq!(burst["blackholed_targets"], 1);
    let held = burst["target_passes_held_max"].as_object().unwrap();
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(
        held.values().all(|n| n == 1),
        "one target held more than one worker of a replica: {held:?}"
    );
    let idle = &remote["idle"];
    assert!(number(&idle["seconds"], "idle") >= 5.0);
    assert!(
        number(
            &idle["requests_per_target_per_minute"]["mean"],
            "idle requests"
        ) >= 0.0
    );
    // Ten edits, each seen to start a pass and to become Ready at its new generation.
    let steady = &remote["steady"];
    assert_eq!(steady["edits"], 10, "{steady}");
    assert_eq!(steady["not_started"], 0, "{steady}");
    assert_eq!(steady["not_ready"], 0, "{steady}");
    assert_eq!(
        steady["edit_to_pass_start_seconds"]["count"], 10,
        "{steady}"
    );
    assert_eq!(steady["edit_to_ready_seconds"]["count"], 10, "{steady}");
    // A pass after its edit, Ready at the new generation after that (not the old one's Ready).
    let start = number(&steady["edit_to_pass_start_seconds"]["p50"], "pass start");
    let ready = number(&steady["edit_to_ready_seconds"]["p50"], "Ready");
    assert!(start >= 0.0 && ready > start, "{steady}");
    // Five ConfigMaps changed on their targets, each put back by the next drift pass.
    let drift = &remote["drift"];
    assert_eq!(drift["requested"], 5, "{drift}");
    assert_eq!(drift["changes"], 5, "{drift}");
    let repair = number(&drift["change_to_repair_seconds"]["p50"], "repair");
    assert!(repair > 0.0, "{drift}");
    assert_eq!(drift["not_repaired"], 0, "{drift}");
    assert_eq!(drift["change_to_repair_seconds"]["count"], 5, "{drift}");
    // Each target's client on the replicas that met it: 2 replicas, 21 targets of 5 Manifests
    // hashed by UID, so together they hold at least one client per target.
    let clients = burst["target_clients"].as_object().unwrap();
    let held: Vec<f64> = clients.values().map(|n| number(n, "clients")).collect();
    assert_eq!(held.len(), 2, "{clients:?}");
    assert!(held.iter().all(|n| *n <= 21.0), "{clients:?}");
    assert!(held.iter().sum::<f64>() >= 21.0, "{clients:?}");
    // The cold restart: every Manifest (the blackholed target's too: their passes end when
    // their requests time out) has a pass in the new processes, and every answering target was reached.
    let cold = &remote["cold_restart"];
    assert_eq!(cold["restart"]["checked"], 105, "{cold}");
    assert!(number(&cold["restart"]["all_checked_seconds"], "checked") > 0.0);
    assert!(number(&cold["requests_per_target"]["min"], "restart requests") > 0.0);
    assert!(remote["bare_error"].is_null(), "{}", remote["bare_error"]);
    assert!(number(&remote["bare"]["per_second"], "bare") > 0.0);
    assert!(number(&remote["fleet_over_bare"], "ratio") > 0.0);
    // The second baseline: the applies with the Manifest's minimum writes on the local cluster.
    let writes = &remote["bare_with_manifest_writes_error"];
    assert!(writes.is_null(), "{writes}");
    assert!(
        number(
            &remote["bare_with_manifest_writes"]["per_second"],
            "minimum"
        ) > 0.0
    );
    assert!(number(&remote["fleet_over_minimum"], "fleet / minimum") > 0.0);
    assert!(number(&remote["minimum_over_bare"], "minimum / bare") > 0.0);
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(
        summary.contains("## Remote: 105 Manifests on 21 targets"),
        "{summary}"
    );
    assert!(summary.contains("### Steady state"), "{summary}");
    assert!(
        summary.contains("### Drift repair on the targets"),
        "{summary}"
    );
    assert!(
        summary.contains("### Cold restart of 2 replicas"),
        "{summary}"
    );
}
