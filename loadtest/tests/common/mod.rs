//! Running the `loadtest` binary as a user does, for the tests that go through it.
//! Each test file uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// A small fleet with short timings: 2 replicas, 16 shards, a 4 s lease (renew 1 s, deadline
/// 3 s).
pub const SHORT_FLEET: &[&str] = &[
    "--replicas",
    "2",
    "--shards",
    "16",
    "--lease-duration-seconds",
    "4",
    "--renew-interval-seconds",
    "1",
    "--renew-deadline-seconds",
    "3",
];

/// Runs `loadtest <args>` against the repository and the `module-manager` built next to this
/// test, writing into `out`; asserts it exits 0 and returns the run's directory.
pub fn run_loadtest(args: &[&str], out: &std::path::Path) -> PathBuf {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_loadtest"))
        .parent()
        .unwrap()
        .join("module-manager");
    let status = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args(args)
        .arg("--quiet")
        .arg("--binary")
        .arg(&binary)
        .arg("--repo")
        .arg(&repo)
        .arg("--out")
        .arg(out)
        .status()
        .expect("run loadtest");
    if !status.success() {
        // The violations, when the run got as far as writing its results.
        let violations = std::fs::read_dir(out)
            .ok()
            .and_then(|mut dirs| dirs.next())
            .and_then(|dir| std::fs::read_to_string(dir.ok()?.path().join("results.json")).ok())
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .map(|result| result["violations"].to_string());
        panic!("loadtest {args:?} exited with {status}; violations: {violations:?}");
    }
    std::fs::read_dir(out)
        .unwrap()
        .next()
        .expect("a run directory")
        .unwrap()
        .path()
}

/// Runs `loadtest <scenario>` on a [`SHORT_FLEET`] with `options` (a command line, split at
/// white space) into `out` (see [`run_loadtest`]); returns the run's directory.
pub fn run_short(scenario: &str, options: &str, out: &std::path::Path) -> PathBuf {
    let options: Vec<&str> = options.split_whitespace().collect();
    run_loadtest(&[&[scenario], SHORT_FLEET, &options].concat(), out)
}

/// [`run_short`] of `<scenario> <options>` into a fresh directory, then [`passed_results`]:
/// the output directory (removed when dropped), the run's directory in it and its results.
pub fn run_short_passed(command: &str) -> (tempfile::TempDir, PathBuf, serde_json::Value) {
    let (scenario, options) = command.split_once(' ').unwrap_or((command, ""));
    let out = tempfile::tempdir().unwrap();
    let dir = run_short(scenario, options, out.path());
    let result = passed_results(&dir);
    (out, dir, result)
}

/// The `results.json` of the run in `dir`, asserting that the run passed.
pub fn passed_results(dir: &std::path::Path) -> serde_json::Value {
    let results = std::fs::read_to_string(dir.join("results.json")).unwrap();
    let result: serde_json::Value = serde_json::from_str(&results).unwrap();
    assert_eq!(result["passed"], true, "{}", result["violations"]);
    result
}
