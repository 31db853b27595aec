//! The `mttp` scenario through the `loadtest` binary at a tiny size: its own control plane
//! (with the audit log), one and two replicas of the real `module-manager`, bursts of 5 and 10
//! Manifests, the baselines, a short idle window and a cold restart; the report must carry
//! every figure. Needs the `module-manager` binary built next to the test (`cargo test
//! --workspace` builds it).

mod common;

use serde_json::Value;

fn positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: not a number: {v}"));
    assert!(x > 0.0, "{what}: {x}");
    x
}

fn check_burst(b: &Value) {
    let what = format!("burst {}×{}", b["replicas"], b["manifests"]);
    for field in [
        "all_ready_seconds",
        "per_second",
        "fleet_cpu_seconds",
        "cpu_seconds_per_manifest",
        "control_plane_cpu_seconds_per_manifest",
        "api_requests_per_manifest",
        "operator_requests_per_manifest",
        "passes_per_manifest",
    ] {
        positive(&b[field], &format!("{what} {field}"));
    }
    positive(&b["create_to_ready_seconds"]["p99"], &what);
    let clients = &b["requests_by_client"];
    positive(
        &clients["module-manager"],
        &format!("{what}: the fleet's requests"),
    );
    positive(
        &clients["loadtest"],
        &format!("{what}: the harness's requests"),
    );
    positive(
        &b["operator_by_resource_per_manifest"]["manifests/status"],
        &format!("{what}: status writes"),
    );
    let rss = b["peak_rss_mib"].as_object().unwrap();
    assert_eq!(
        rss.len() as u64,
        b["replicas"].as_u64().unwrap(),
        "{what}: {rss:?}"
    );
    for (replica, mib) in rss {
        positive(mib, &format!("{what}: RSS of {replica}"));
    }
}

#[test]
fn the_mttp_scenario_reports_every_figure() {
    let (_out, dir, result) = common::run_short_passed(
        "mttp --manifests 5,10 --settle-seconds 90 --drift-interval 1m --idle-seconds 5 --cold-restart",
    );
    let mttp = &result["mttp"];
    let bursts = mttp["bursts"].as_array().unwrap();
    // One replica (the baseline) and two, each with 5 and 10.
    let shape: Vec<(u64, u64)> = bursts
        .iter()
        .map(|b| {
            (
                b["replicas"].as_u64().unwrap(),
                b["manifests"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shape, [(1, 5), (1, 10), (2, 5), (2, 10)]);
    bursts.iter().for_each(check_burst);
    assert_eq!(bursts[3]["manifests_held"], 15, "the earlier burst stays");
    for b in mttp["baselines"].as_array().unwrap() {
        assert!(b["error"].is_null(), "{b}");
        positive(&b["bare_apply"]["per_second"], "bare apply");
        positive(
            &b["bare_with_manifest_writes"]["per_second"],
            "bare apply with the Manifest's writes",
        );
        positive(
            &b["bare_with_minimum_writes"]["per_second"],
            "bare apply with the minimum writes",
        );
        positive(&b["helm"]["per_second"], "helm");
        let cpu = b["control_plane_cpu_seconds_per_manifest"]
            .as_object()
            .unwrap();
        assert_eq!(cpu.len(), 4, "{b}");
        for v in cpu.values() {
            positive(v, "control plane CPU");
        }
    }
    let ratios = mttp["ratios"].as_array().unwrap();
    assert_eq!(ratios.len(), 2);
    for r in ratios {
        for field in [
            "fleet_over_bare_apply",
            "fleet_over_manifest_writes",
            "fleet_over_minimum_writes",
            "fleet_over_single_replica",
            "fleet_over_helm",
        ] {
            positive(&r[field], field);
        }
    }
    let idle = &mttp["idle"];
    assert_eq!(idle["manifests"], 15);
    positive(&idle["seconds"], "idle seconds");
    positive(&idle["api_requests_per_second"], "idle requests");
    // Lease renewals at least: once a second per replica.
    positive(
        &idle["operator_requests_per_second"],
        "the idle fleet's requests",
    );
    assert_eq!(idle["peak_rss_mib"].as_object().unwrap().len(), 2);
    let restart = &mttp["cold_restart"];
    assert_eq!(restart["manifests"], 15);
    assert_eq!(restart["checked"], 15, "{restart}");
    positive(&restart["all_checked_seconds"], "cold restart");
    positive(&restart["ready_seconds"], "cold restart: ready");
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    for heading in [
        "## MTTP",
        "### Baselines",
        "### Ratios",
        "### Idle",
        "### Cold restart",
    ] {
        assert!(summary.contains(heading), "{heading} in {summary}");
    }
    let bytes = std::fs::read(dir.join("mttp.png")).unwrap();
    assert!(bytes.starts_with(b"\x89PNG"));
}
