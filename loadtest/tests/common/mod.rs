//! Running the `loadtest` binary as a user does, for the tests that go through it.

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
    assert!(status.success(), "loadtest {args:?} exited with {status}");
    std::fs::read_dir(out)
        .unwrap()
        .next()
        .expect("a run directory")
        .unwrap()
        .path()
}
