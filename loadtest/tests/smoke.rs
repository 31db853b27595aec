//! The `smoke` scenario through the `loadtest` binary, as a user runs it: its own control plane,
//! two replicas of the real `module-manager`, a basic load, a rolling update, small baselines;
//! exit code 0 and the report's files. Needs the `module-manager` binary built next to the
//! test (`cargo test --workspace` builds it).

mod common;

#[test]
fn the_smoke_scenario_passes_and_writes_its_report() {
    let out = tempfile::tempdir().unwrap();
    let dir = common::run_short(
        "smoke",
        "--duration-seconds 25 --warmup-seconds 8 --update-period-seconds 20 --burst 20",
        out.path(),
    );
    assert!(
        dir.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("smoke-")
    );
    let result = common::passed_results(&dir);
    assert!(result["throughput"]["converged"].as_u64().unwrap() > 0);
    assert_eq!(result["fleet"]["moves"].as_array().unwrap().len(), 2);
    for path in ["fleet", "single_replica", "bare_apply", "helm"] {
        assert!(
            result["baselines"][path]["per_second"].as_f64().unwrap() > 0.0,
            "baseline {path}: {}",
            result["baselines"]
        );
    }
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(summary.contains("PASSED"), "{summary}");
    for chart in ["timeline.png", "replicas.png", "baselines.png"] {
        let bytes = std::fs::read(dir.join(chart)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{chart}");
    }
}
