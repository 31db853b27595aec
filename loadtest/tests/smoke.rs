//! The `smoke` scenario through the `loadtest` binary, as a user runs it: its own control plane,
//! two replicas of the real `module-manager`, a basic load, a rolling update, small baselines;
//! exit code 0 and the report's files. Needs the `module-manager` binary built next to the
//! test (`cargo test --workspace` builds it).

use std::process::Command;

#[test]
fn the_smoke_scenario_passes_and_writes_its_report() {
    let out = tempfile::tempdir().unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_loadtest"))
        .parent()
        .unwrap()
        .join("module-manager");
    let status = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .arg("smoke")
        .args(["--replicas", "2", "--shards", "16"])
        .args([
            "--lease-duration-seconds",
            "4",
            "--renew-interval-seconds",
            "1",
        ])
        .args(["--renew-deadline-seconds", "3"])
        .args(["--duration-seconds", "25", "--warmup-seconds", "8"])
        .args(["--update-period-seconds", "20", "--burst", "20", "--quiet"])
        .arg("--binary")
        .arg(&binary)
        .arg("--repo")
        .arg(&repo)
        .arg("--out")
        .arg(out.path())
        .status()
        .expect("run loadtest");
    assert!(status.success(), "loadtest smoke exited with {status}");
    let dir = std::fs::read_dir(out.path())
        .unwrap()
        .next()
        .expect("a run directory")
        .unwrap()
        .path();
    assert!(
        dir.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("smoke-")
    );
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(result["passed"], true);
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
