//! The report from synthetic runs: one with every section filled, one nearly empty.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::charts::render;
use super::font::Text;
use super::{markdown, write};
use crate::results::*;

fn quantiles(count: u64, p50: f64) -> Quantiles {
    Quantiles {
        count,
        p50: Some(p50),
        p90: Some(p50 * 2.0),
        p99: Some(p50 * 3.0),
        max: Some(p50 * 4.0),
    }
}

fn step(create_rate: f64, objects: u64, ops: f64, queue_p99: f64, ready_p99: f64) -> CapacityStep {
    CapacityStep {
        create_rate,
        objects,
        operations_per_second: ops,
        queue_wait_p99_seconds: Some(queue_p99),
        ready_p99_seconds: Some(ready_p99),
        passed: queue_p99 < 1.0 && ready_p99 < 5.0,
    }
}

fn burst(parallelism: u32, seconds: f64, manifests: u64) -> Burst {
    Burst {
        parallelism,
        seconds,
        per_second: manifests as f64 / seconds,
    }
}

fn replica(name: &str, passes: u64, total: u64, shards_owned: u32) -> ReplicaFigures {
    ReplicaFigures {
        name: name.to_owned(),
        passes,
        share: passes as f64 / total as f64,
        shards_owned,
        cpu_seconds: passes as f64 * 0.01,
        cpu_cores_mean: passes as f64 * 0.01 / 120.0,
        rss_mib_mean: 40.0 + shards_owned as f64,
        rss_mib_max: 55.5 + shards_owned as f64,
    }
}

fn sample(i: usize) -> Sample {
    let t = i as f64 * 5.0;
    let names = ["member-0", "member-1", "member-2"];
    let cpu_cores: BTreeMap<String, f64> = names
        .iter()
        .enumerate()
        .map(|(r, n)| (n.to_string(), 0.1 + 0.05 * r as f64 + 0.01 * (i % 4) as f64))
        .collect();
    let rss_mib = names
        .iter()
        .enumerate()
        .map(|(r, n)| (n.to_string(), 40.0 + r as f64 * 3.0 + i as f64 * 0.5))
        .collect();
    let events = match i {
        6 => vec!["kill member-1".to_owned()],
        12 => vec!["scale 3→5".to_owned(), "restart member-0".to_owned()],
        _ => Vec::new(),
    };
    Sample {
        t,
        operations_per_second: 20.0 + (i % 5) as f64,
        converged_per_second: 18.0 + (i % 3) as f64,
        queue_depth: (i % 7) as f64 * 3.0,
        manifests: 50 * i as u64,
        unowned_shards: u32::from(i == 7),
        cpu_cores,
        rss_mib,
        events,
    }
}

/// Every section filled.
fn full() -> RunResult {
    let total_passes = 600 + 300 + 100;
    RunResult {
        scenario: "scale-out".to_owned(),
        baselines_error: None,
        started_at: "2026-05-01T10:00:00Z".to_owned(),
        parameters: serde_json::json!({ "shards": 16, "create_rate": 10 }),
        environment: Environment {
            target: "local".to_owned(),
            replicas: 3,
            shards: 16,
            lease_duration_seconds: 10.0,
            cpu_limit_per_replica: Some(1.5),
            concurrency: 4,
            cores: 2,
            chart: "podinfo-shaped".to_owned(),
            kubernetes_version: "v1.36.0".to_owned(),
            module_manager_version: "0.1.0".to_owned(),
        },
        duration_seconds: 120.0,
        passed: false,
        violations: vec![
            Violation {
                checker: "overlap".to_owned(),
                detail: "Manifest default/m-17 reconciled by member-0 and member-1".to_owned(),
            },
            Violation {
                checker: "unowned-shard".to_owned(),
                detail: "shard 5 unowned for 31 s".to_owned(),
            },
        ],
        throughput: Throughput {
            failed_requests: 2,
            superseded: 3,
            operations: 2400,
            operations_per_second: 20.0,
            converged: 2280,
            converged_per_second: 19.0,
            reconcile_passes: total_passes,
            manifests_at_end: 731,
        },
        latency: Latencies {
            create_to_ready_seconds: quantiles(800, 0.25),
            update_to_ready_seconds: quantiles(1200, 0.125),
            delete_to_gone_seconds: Quantiles::default(),
            queue_wait_seconds: quantiles(3000, 0.005),
        },
        replicas: vec![
            replica("member-0", 600, total_passes, 8),
            replica("member-1", 300, total_passes, 5),
            replica("member-2", 100, total_passes, 3),
        ],
        apiserver: ApiServerFigures {
            requests_per_second: 312.5,
            by_verb: [
                ("GET", 40.0),
                ("APPLY", 150.0),
                ("WATCH", 2.5),
                ("PATCH", 120.0),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
            by_resource: (0..10)
                .map(|i| (format!("resource-{i}"), 100.0 - 10.0 * i as f64))
                .collect(),
        },
        fleet: FleetFigures {
            handover_gap_seconds: quantiles(14, 0.02),
            takeover_seconds: quantiles(1, 11.0),
            max_unowned_seconds: 12.5,
            takeovers_unfinished: 1,
            faults: vec![
                FaultRecord {
                    fault: "apiserver".to_owned(),
                    label: "apiserver".to_owned(),
                    at_seconds: 40.0,
                    outage_seconds: 9.5,
                    recovered_seconds: Some(4.25),
                    steady_requests_per_second: Some(20.0),
                    requests_per_second_after: Some(50.0),
                    ..Default::default()
                },
                FaultRecord {
                    fault: "etcd".to_owned(),
                    label: "etcd".to_owned(),
                    at_seconds: 80.0,
                    outage_seconds: 7.0,
                    stuck: vec!["Create m-1 (130 s ago)".to_owned()],
                    ..Default::default()
                },
            ],
            moves: vec![
                MoveStep {
                    step: "3→5".to_owned(),
                    shards_moved: 8,
                    shards_ideal: 6.4,
                    manifests_moved: 300,
                    ratio: Some(8.0 / 6.4),
                    settled_seconds: 4.5,
                },
                MoveStep {
                    step: "restart member-0".to_owned(),
                    shards_moved: 0,
                    shards_ideal: 0.0,
                    manifests_moved: 0,
                    ratio: None,
                    settled_seconds: 2.0,
                },
            ],
        },
        capacity: vec![
            // Deliberately out of order: the report sorts by replicas.
            Capacity {
                replicas: 3,
                steps: vec![
                    step(10.0, 600, 20.0, 0.05, 0.8),
                    step(20.0, 1200, 40.0, 0.2, 1.9),
                    step(40.0, 2400, 75.0, 0.6, 3.5),
                    step(80.0, 4000, 90.0, 2.5, 9.0),
                ],
                last_passing: Some(2),
            },
            Capacity {
                replicas: 1,
                steps: vec![
                    step(10.0, 600, 20.0, 0.1, 1.2),
                    step(20.0, 1100, 32.0, 0.7, 4.1),
                    step(40.0, 1500, 35.0, 3.0, 12.0),
                ],
                last_passing: Some(1),
            },
            Capacity {
                replicas: 5,
                steps: vec![step(10.0, 500, 20.0, 1.5, 6.0)],
                last_passing: None,
            },
        ],
        baselines: Some(Baselines {
            manifests: 200,
            objects_per_manifest: 4,
            fleet: burst(3, 16.0, 200),
            single_replica: Some(burst(1, 40.0, 200)),
            bare_apply: Some(burst(8, 5.0, 200)),
            helm: Some(burst(8, 100.0, 200)),
        }),
        timeline: (0..24).map(sample).collect(),
        mttp: None,
        remote: None,
        hostile: None,
        monitoring: None,
    }
}

/// An `mttp` run: two fleet sizes, two burst sizes, baselines, idle, cold restart.
fn mttp_run() -> RunResult {
    let fleet_burst = |replicas: u32, manifests: u64, seconds: f64| MttpBurst {
        replicas,
        cpu_per_replica: Some(0.5),
        manifests,
        manifests_held: manifests,
        ready: ReadyTiming {
            all_ready_seconds: seconds,
            per_second: manifests as f64 / seconds,
            create_to_ready_seconds: quantiles(manifests, seconds / 2.0),
            first_ready_seconds: Some(seconds / 50.0),
            half_ready_seconds: Some(seconds / 2.0 + 1.0),
        },
        cpu_seconds_per_manifest: 0.052,
        control_plane_cpu_seconds_per_manifest: Some(0.081),
        api_requests_per_manifest: 31.5,
        operator_requests_per_manifest: Some(22.3),
        operator_by_verb_per_manifest: BTreeMap::from([
            ("patch".into(), 9.0),
            ("get".into(), 13.25),
        ]),
        operator_by_resource_per_manifest: BTreeMap::from([("manifests/status".into(), 3.0)]),
        passes_per_manifest: 2.5,
        peak_rss_mib: BTreeMap::from([("mm1-0".into(), 61.5), ("mm1-1".into(), 77.3)]),
        ..Default::default()
    };
    let path = |seconds| Some(burst(12, seconds, 100));
    let mut mttp = Mttp {
        bursts: vec![
            fleet_burst(1, 100, 40.0),
            fleet_burst(1, 500, 230.0),
            fleet_burst(3, 100, 16.0),
            fleet_burst(3, 500, 100.0),
        ],
        baselines: vec![MttpBaseline {
            manifests: 100,
            objects_per_manifest: 4,
            bare_apply: path(4.0),
            bare_with_manifest_writes: path(8.0),
            bare_with_minimum_writes: path(5.0),
            helm: path(25.0),
            control_plane_cpu_seconds_per_manifest: BTreeMap::from([
                (PATH_BARE_APPLY.into(), 0.04),
                (PATH_MANIFEST_WRITES.into(), 0.063),
            ]),
            error: None,
        }],
        idle: Some(IdleFigures {
            replicas: 3,
            manifests: 600,
            drift_interval: "10m".into(),
            seconds: 60.0,
            api_requests_per_second: 12.5,
            operator_requests_per_second: Some(3.75),
            requests_by_client: BTreeMap::from([("module-manager".into(), 225)]),
            passes_per_second: 1.0,
            fleet_cores: 0.02,
            peak_rss_mib: BTreeMap::from([("mm1-0".into(), 88.0)]),
            ..Default::default()
        }),
        cold_restart: Some(ColdRestart {
            replicas: 3,
            manifests: 600,
            ready_seconds: 4.5,
            all_checked_seconds: Some(41.0),
            checked: 600,
            passes: 600,
        }),
        ..Default::default()
    };
    mttp.ratios = crate::mttp::ratios(&mttp, 3);
    RunResult {
        scenario: "mttp".to_owned(),
        passed: true,
        mttp: Some(mttp),
        ..RunResult::default()
    }
}

#[test]
fn markdown_has_the_mttp_bursts_baselines_ratios_idle_and_restart() {
    let md = markdown(&mttp_run());
    assert_contains(&md, "## MTTP");
    assert_contains(
        &md,
        "| 3 × 0.5 core | 500 | 500 | 2.0 | 51.0 | 100.0 | 5.0 | 50.000 | 150.000 | 0.052 | 0.081 | 31.5 | 22.3 | 2.50 | 77.3 |",
    );
    assert_contains(
        &md,
        "by verb get 13.25, patch 9.00; by resource manifests/status 3.00",
    );
    assert_contains(&md, "| 100 | bare apply | 4.0 | 25.0 | 12 | 0.040 |");
    assert_contains(
        &md,
        "| 100 | bare apply with the Manifest's writes | 8.0 | 12.5 | 12 | 0.063 |",
    );
    assert_contains(
        &md,
        "| 100 | bare apply with the minimum writes | 5.0 | 20.0 | 12 | – |",
    );
    assert_contains(
        &md,
        "| 100 | `helm upgrade --install` | 25.0 | 4.0 | 12 | – |",
    );
    // 100 on 3 replicas: 6.25/s; bare 25/s, with the writes 12.5/s, the minimum 20/s, one
    // replica 2.5/s, helm 4/s.
    assert_contains(
        &md,
        "| 100 | 3 | **0.25×** | **0.50×** | **0.31×** | **2.50×** | **1.56×** |",
    );
    assert_contains(&md, "| 500 | 3 | – | – | – | **2.30×** | – |");
    assert_contains(
        &md,
        "### Idle: 600 Manifests on 3 replicas for 60 s (drift interval 10m)",
    );
    assert_contains(&md, "| the fleet's requests/s (audit log) | 3.75 |");
    assert_contains(&md, "after 41.0 s; 600 of 600 checked, 600 passes.");
    assert_contains(&md, "![MTTP](mttp.png)");
    assert!(
        !md.contains("## Throughput"),
        "no steady load to report:\n{md}"
    );
}

#[test]
fn the_mttp_chart_is_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let written = render(&mttp_run(), dir.path(), Text::Omitted).unwrap();
    assert_eq!(file_names(&written), ["mttp.png"]);
    assert_png(&written[0], 1200);
}

/// A `hostile` run: two repeats of the arm without a hostile chart, `memory` and `loop`.
fn hostile_run() -> RunResult {
    let arm = |repeat, hostile: Option<&str>, p99: f64, starts, seconds| HostileArm {
        repeat,
        hostile: hostile.map(str::to_owned),
        innocents: 20,
        innocents_ready: 20,
        create_to_ready_seconds: Quantiles {
            count: 20,
            p50: Some(p99 / 2.0),
            p99: Some(p99),
            ..Default::default()
        },
        renderer_starts: Some(starts),
        renders_resent: Some(0),
        seconds,
        hostile_status: hostile.map(|chart| HostileStatus {
            state: Some("Error".into()),
            ready: Some("False".into()),
            ready_reason: Some("RenderError".into()),
            stalled: Some((chart == "memory").to_string()),
            message: format!("render: {chart} | failed"),
            expected: "x".into(),
            names_failure: chart == "memory",
            named_after_seconds: Some(1.25),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut arms = vec![
        arm(1, None, 1.0, 0, 3.0),
        arm(1, Some("memory"), 1.5, 2, 620.0),
        arm(1, Some("loop"), 2.5, 11, 640.0),
        arm(2, None, 2.0, 0, 3.0),
        arm(2, Some("memory"), 2.0, 1, 610.0),
        arm(2, Some("loop"), 3.0, 10, 630.0),
    ];
    arms[3].innocents_ready = 19;
    crate::hostile::judge::set_ratios(&mut arms);
    RunResult {
        scenario: "hostile".to_owned(),
        hostile: Some(Hostile {
            replicas: 3,
            innocents: 20,
            chart: "loadtest/charts/podinfo-like".into(),
            repeats: 2,
            hostile_seconds: 600,
            arms,
        }),
        ..RunResult::default()
    }
}

#[test]
fn markdown_has_every_hostile_arm_and_the_targets() {
    let md = markdown(&hostile_run());
    assert_contains(&md, "## Hostile charts beside innocent Manifests");
    assert_contains(
        &md,
        "| 1 | none | 20/20 | 0.500 | 1.000 | 1.00× | 0 | 0 | 3 | – | – | – | – |",
    );
    assert_contains(
        &md,
        "| 1 | memory | 20/20 | 0.750 | 1.500 | 1.50× | 2 | 0 | 620 | Error · Ready False RenderError · Stalled true · – | `render: memory \\| failed` | 1.250 | yes |",
    );
    assert_contains(&md, "| 2 | none | 19/20 **not all** |");
    assert_contains(
        &md,
        "| 2 | loop | 20/20 | 1.500 | 3.000 | 1.50× | 10 | 0 | 630 |",
    );
    assert_contains(&md, "| **no** |");
    // memory: 1.5 and 1.0, within 2×; loop: 2.5 and 1.5, not; 11 starts in a 640 s arm.
    assert_contains(&md, "| memory | 1.50×, 1.00× | 1.50× | yes | 2, 1 | yes |");
    assert_contains(
        &md,
        "| loop | 2.50×, 1.50× | 2.50× | **no** | 11, 10 | **no** |",
    );
    assert!(!md.contains("## Throughput"), "no steady load:\n{md}");
}

#[test]
fn the_restart_target_is_judged_only_on_arms_of_ten_minutes() {
    let mut run = hostile_run();
    run.hostile.as_mut().unwrap().arms[1].seconds = 40.0;
    let md = markdown(&run);
    assert_contains(
        &md,
        "| memory | 1.50×, 1.00× | 1.50× | yes | 2, 1 | – (arms of 40 s: needs `--hostile-seconds 600`) |",
    );
}

/// What a run that measured nothing looks like.
fn nearly_empty() -> RunResult {
    RunResult {
        scenario: "smoke".to_owned(),
        passed: true,
        ..RunResult::default()
    }
}

fn assert_contains(haystack: &str, needle: &str) {
    assert!(
        haystack.contains(needle),
        "expected {needle:?} in:\n{haystack}"
    );
}

#[test]
fn markdown_has_verdict_environment_and_violations() {
    let r = full();
    let md = markdown(&r);
    assert!(md.starts_with("# Load test `scale-out`: FAILED"), "{md}");
    for v in &r.violations {
        assert_contains(&md, &format!("**{}**: {}", v.checker, v.detail));
    }
    assert_contains(&md, "| CPU limit per replica | 1.50 cores |");
    assert_contains(&md, "| Shards | 16 |");
    assert_contains(&md, "| Kubernetes | v1.36.0 |");
    assert_contains(&md, "4 reconcile workers per replica");
    assert_contains(&md, "\"create_rate\":10");
}

#[test]
fn markdown_has_throughput_latency_and_replicas() {
    let r = full();
    let md = markdown(&r);
    let t = &r.throughput;
    assert_contains(
        &md,
        &format!("| Operations sent | {} | {:.1} |", t.operations, 20.0),
    );
    assert_contains(
        &md,
        &format!(
            "Reconcile passes (all replicas): {}, {:.2} per converged Manifest.",
            t.reconcile_passes,
            t.reconcile_passes as f64 / t.converged as f64
        ),
    );
    let create = &r.latency.create_to_ready_seconds;
    assert_contains(
        &md,
        &format!(
            "| create → Ready | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
            create.count,
            create.p50.unwrap(),
            create.p90.unwrap(),
            create.p99.unwrap(),
            create.max.unwrap()
        ),
    );
    assert_contains(&md, "| delete → gone | 0 | – | – | – | – |");
    for replica in &r.replicas {
        let share = format!("{:.1} %", replica.passes as f64 * 100.0 / 1000.0);
        assert_contains(
            &md,
            &format!(
                "| `{}` | {} | {share} | {} |",
                replica.name, replica.passes, replica.shards_owned
            ),
        );
    }
}

#[test]
fn markdown_ranks_api_server_requests() {
    let r = full();
    let md = markdown(&r);
    assert_contains(&md, "312.5 requests/s");
    // Verbs highest first.
    let apply = md.find("| APPLY | 150.0 |").expect("APPLY row");
    let patch = md.find("| PATCH | 120.0 |").expect("PATCH row");
    assert!(apply < patch);
    // The top 8 resources in the table, the other two summed up.
    assert_contains(&md, "| resource-7 | 30.0 |");
    assert!(!md.contains("| resource-8 |"), "{md}");
    assert_contains(&md, &format!("2 more resources: {:.1} req/s", 20.0 + 10.0));
}

#[test]
fn markdown_has_fleet_figures_and_moves() {
    let r = full();
    let md = markdown(&r);
    let takeover = &r.fleet.takeover_seconds;
    assert_contains(
        &md,
        &format!(
            "| takeover after a fault | 1 | {:.3} |",
            takeover.p50.unwrap()
        ),
    );
    // Each fault with its recovery and its request rates; the summary per fault type.
    assert_contains(&md, "| apiserver | 40 | 9.5 | 4.2 | 20.0 | 50.0 | 2.50× |");
    assert_contains(&md, "| etcd | 80 | 7.0 | not recovered | – | – | – |");
    assert_contains(&md, "| apiserver | 1 | 4.2 | 0 | 2.50× |");
    assert_contains(&md, "| etcd | 1 | – | 1 | – |");
    assert_contains(
        &md,
        &format!(
            "unowned: 12.5 s (the checker allows {:.1} s",
            2.0 * r.environment.lease_duration_seconds
        ),
    );
    let moved = &r.fleet.moves[0];
    let ratio = f64::from(moved.shards_moved) / moved.shards_ideal;
    assert_contains(&md, &format!("| 3→5 | 8 | 6.4 | {ratio:.2}× | 300 | 4.5 |"));
    assert_contains(&md, "| restart member-0 | 0 | 0.0 | – | 0 | 2.0 |");
}

#[test]
fn markdown_has_capacity_steps_and_curve() {
    let r = full();
    let md = markdown(&r);
    let one = md.find("### 1 replica\n").expect("1 replica section");
    let three = md.find("### 3 replicas").expect("3 replicas section");
    let five = md.find("### 5 replicas").expect("5 replicas section");
    assert!(one < three && three < five, "sorted by replicas");
    assert_contains(
        &md,
        "| 2 | 20.0 | 1100 | 32.0 | 0.700 | 4.100 | ✓ ← capacity |",
    );
    assert_contains(&md, "| 3 | 40.0 | 1500 | 35.0 | 3.000 | 12.000 | ✗ |");
    assert_contains(&md, "No step met the SLOs.");

    let point = |n: u32| {
        r.capacity
            .iter()
            .find(|c| c.replicas == n)
            .and_then(Capacity::point)
            .unwrap()
    };
    let (p1, p3) = (point(1), point(3));
    let objects_ratio = p3.objects as f64 / p1.objects as f64;
    let ops_ratio = p3.operations_per_second / p1.operations_per_second;
    let efficiency = ops_ratio / 3.0 * 100.0;
    assert_contains(&md, "ratios against 1 replica");
    assert_contains(
        &md,
        &format!(
            "| 3 | {} | {:.1} | {objects_ratio:.2}× | {ops_ratio:.2}× | {efficiency:.0} % |",
            p3.objects, p3.operations_per_second
        ),
    );
    assert_contains(&md, "| 1 | 1100 | 32.0 | 1.00× | 1.00× | 100 % |");
    assert_contains(&md, "| 5 | – | – | – | – | – |");
}

#[test]
fn capacity_curve_is_relative_to_the_smallest_size_measured() {
    let mut r = full();
    r.capacity.retain(|c| c.replicas != 1);
    let md = markdown(&r);
    assert_contains(&md, "ratios against 3 replicas");
    assert_contains(&md, "| 3 | 2400 | 75.0 | 1.00× | 1.00× | 100 % |");
}

#[test]
fn markdown_has_baselines_and_their_ratios() {
    let r = full();
    let md = markdown(&r);
    let b = r.baselines.as_ref().unwrap();
    let (fleet, single, bare, helm) = (
        b.fleet.per_second,
        b.single_replica.as_ref().unwrap().per_second,
        b.bare_apply.as_ref().unwrap().per_second,
        b.helm.as_ref().unwrap().per_second,
    );
    assert_contains(&md, &format!("| fleet | 3 | 16.0 | {fleet:.1} |"));
    assert_contains(&md, &format!("| helm | 8 | 100.0 | {helm:.1} |"));
    assert_contains(
        &md,
        &format!(
            "fleet ÷ bare apply: **{:.2}×** (fraction of the API server's ceiling)",
            fleet / bare
        ),
    );
    assert_contains(
        &md,
        &format!("fleet ÷ single replica: **{:.2}×**", fleet / single),
    );
    assert_contains(&md, &format!("fleet ÷ helm: **{:.2}×**", fleet / helm));
}

#[test]
fn baselines_without_other_paths_have_no_ratios() {
    let mut r = full();
    r.baselines = Some(Baselines {
        manifests: 10,
        objects_per_manifest: 4,
        fleet: burst(3, 2.0, 10),
        ..Baselines::default()
    });
    let md = markdown(&r);
    assert_contains(&md, "## Baselines");
    assert!(!md.contains("fleet ÷"), "{md}");
}

#[test]
fn markdown_links_the_charts() {
    let md = markdown(&full());
    for chart in ["timeline", "replicas", "capacity", "baselines"] {
        assert_contains(&md, &format!("({chart}.png)"));
    }
}

#[test]
fn markdown_of_a_nearly_empty_run_has_only_the_verdict_sections() {
    let md = markdown(&nearly_empty());
    assert!(md.starts_with("# Load test `smoke`: PASSED"), "{md}");
    assert_contains(&md, "## Violations\n\nnone");
    assert_contains(&md, "| CPU limit per replica | unlimited |");
    for absent in [
        "## Latency",
        "## Replicas",
        "## API server",
        "## Fleet",
        "## Capacity",
        "## Baselines",
        "## Charts",
        "Parameters:",
    ] {
        assert!(!md.contains(absent), "unexpected {absent:?} in:\n{md}");
    }
}

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

/// A PNG of the given width with more than a blank page's worth of content.
fn assert_png(path: &Path, width: u32) {
    let bytes = std::fs::read(path).unwrap();
    assert!(
        bytes.starts_with(PNG_MAGIC),
        "{} is not a PNG",
        path.display()
    );
    // IHDR follows the signature: length (4), type (4), width (4, big-endian).
    let ihdr_width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    assert_eq!(ihdr_width, width, "{}", path.display());
    assert!(
        bytes.len() > 8 * 1024,
        "{} has only {} bytes",
        path.display(),
        bytes.len()
    );
}

fn file_names(paths: &[PathBuf]) -> Vec<String> {
    paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn write_produces_json_summary_and_every_chart() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let r = full();
    let written = write(&r, &out).unwrap();
    assert_eq!(
        file_names(&written),
        [
            "results.json",
            "summary.md",
            "timeline.png",
            "replicas.png",
            "capacity.png",
            "baselines.png"
        ]
    );
    let json: RunResult =
        serde_json::from_str(&std::fs::read_to_string(&written[0]).unwrap()).unwrap();
    assert_eq!(json.scenario, r.scenario);
    assert_eq!(json.timeline.len(), r.timeline.len());
    assert_eq!(std::fs::read_to_string(&written[1]).unwrap(), markdown(&r));
    for (path, width) in written[2..].iter().zip([1200, 1200, 1200, 900]) {
        assert_png(path, width);
    }
}

#[test]
fn charts_are_written_without_a_font() {
    // Text::Omitted is what `charts` falls back to when no font file is found; nothing in it
    // may ask plotters for a font (an unregistered family is an error with ab_glyph).
    let dir = tempfile::tempdir().unwrap();
    let written = render(&full(), dir.path(), Text::Omitted).unwrap();
    assert_eq!(written.len(), 4);
    for (path, width) in written.iter().zip([1200, 1200, 1200, 900]) {
        assert_png(path, width);
    }
}

#[test]
fn charts_skip_what_has_no_data() {
    let mut r = full();
    r.capacity.clear();
    r.baselines = None;
    for s in &mut r.timeline {
        s.cpu_cores.clear();
        s.rss_mib.clear();
    }
    let dir = tempfile::tempdir().unwrap();
    let written = render(&r, dir.path(), Text::Omitted).unwrap();
    assert_eq!(file_names(&written), ["timeline.png"]);
    let md = markdown(&r);
    assert!(!md.contains("replicas.png") && !md.contains("capacity.png"));
}

#[test]
fn charts_survive_degenerate_data() {
    // One sample, all zero; a capacity with no passing step; a baseline of zero rates.
    let mut r = nearly_empty();
    r.timeline = vec![Sample::default()];
    r.capacity = vec![Capacity {
        replicas: 1,
        steps: vec![CapacityStep::default()],
        last_passing: None,
    }];
    r.baselines = Some(Baselines::default());
    let dir = tempfile::tempdir().unwrap();
    for text in [Text::Omitted, Text::Drawn] {
        if text == Text::Drawn && super::font::font().is_none() {
            continue;
        }
        let written = render(&r, dir.path(), text).unwrap();
        assert_eq!(
            file_names(&written),
            ["timeline.png", "capacity.png", "baselines.png"]
        );
    }
}

#[test]
fn write_of_a_nearly_empty_run_writes_no_charts() {
    let dir = tempfile::tempdir().unwrap();
    let written = write(&nearly_empty(), dir.path()).unwrap();
    assert_eq!(file_names(&written), ["results.json", "summary.md"]);
    let mut on_disk: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    assert_eq!(on_disk, ["results.json", "summary.md"]);
}

#[test]
fn a_burst_s_timing_stands_at_the_burst_s_level_in_results_json() {
    let timing = ReadyTiming {
        all_ready_seconds: 8.0,
        per_second: 12.5,
        first_ready_seconds: Some(0.5),
        half_ready_seconds: Some(4.0),
        ..Default::default()
    };
    let mttp = MttpBurst {
        ready: timing.clone(),
        ..Default::default()
    };
    let remote = RemoteBurst {
        ready: timing,
        ..Default::default()
    };
    for json in [
        serde_json::to_value(&mttp).unwrap(),
        serde_json::to_value(&remote).unwrap(),
    ] {
        assert_eq!(json["all_ready_seconds"], 8.0, "{json}");
        assert_eq!(json["per_second"], 12.5, "{json}");
        assert_eq!(json["first_ready_seconds"], 0.5, "{json}");
        assert_eq!(json["half_ready_seconds"], 4.0, "{json}");
        assert!(json["create_to_ready_seconds"].is_object(), "{json}");
        assert!(json.get("ready").is_none(), "{json}");
    }
    // A results.json written before ReadyTiming reads back the same.
    let before = serde_json::json!({"replicas": 2, "manifests": 100, "manifests_held": 100,
        "all_ready_seconds": 8.0, "per_second": 12.5,
        "create_to_ready_seconds": {"count": 100, "p50": 1.0, "p90": null, "p99": null, "max": null},
        "first_ready_seconds": 0.5, "fleet_cpu_seconds": 3.0, "cpu_seconds_per_manifest": 0.03,
        "control_plane_cpu_seconds_per_manifest": null, "api_requests_per_manifest": 30.0,
        "api_by_verb_per_manifest": {}, "api_by_resource_per_manifest": {},
        "requests_by_client": {}, "operator_requests_per_manifest": null,
        "operator_by_verb_per_manifest": {}, "operator_by_resource_per_manifest": {},
        "passes_per_manifest": 1.0, "peak_rss_mib": {}});
    let read: MttpBurst = serde_json::from_value(before).unwrap();
    assert_eq!(read.ready.all_ready_seconds, 8.0);
    assert_eq!(read.ready.create_to_ready_seconds.count, 100);
    assert_eq!(read.ready.first_ready_seconds, Some(0.5));
    assert_eq!(read.ready.half_ready_seconds, None);
}
