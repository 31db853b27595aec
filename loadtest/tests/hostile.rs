//! The `hostile` scenario through the `loadtest` binary at a small size (issue 31's isolation
//! target on whole Manifests): one replica, so that every render shares its one renderer
//! child; 24 innocent Manifests of the `slow` fixture chart (each render about a second, so the
//! memory bomb, which grows for some seconds, dies beside innocent renders in flight rather
//! than by chance: with 8, all of them were once rendered before it died — a CI run of
//! 2026-12-07, `renders_resent` 0; the default chart renders in milliseconds); an arm without
//! a hostile chart, then one beside a `memory`
//! Manifest. The run's checkers must pass: every innocent Ready, the hostile Manifest's status
//! naming the memory limit. No time is asserted. Needs the `module-manager` binary built next
//! to the test (`cargo test --workspace` builds it).

mod common;

use serde_json::Value;

fn arm<'a>(result: &'a Value, hostile: Option<&str>) -> &'a Value {
    result["hostile"]["arms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["hostile"].as_str() == hostile)
        .unwrap_or_else(|| panic!("no arm beside {hostile:?}: {}", result["hostile"]))
}

#[test]
fn innocents_beside_a_memory_bomb_all_become_ready_and_the_bomb_is_named() {
    // `hostile` plays the last of `--replicas`: one replica, after the short fleet's 2.
    let (_out, dir, result) = common::run_short_passed(
        "hostile --replicas 1 --innocents 24 --hostile memory --repeats 1 \
         --chart tests/fixtures/charts/slow --settle-seconds 60",
    );
    // The checkers: `not-converged` (an innocent not Ready, a Manifest not deleted) and
    // `hostile-status` would have failed the run.
    assert_eq!(result["hostile"]["arms"].as_array().unwrap().len(), 2);
    for hostile in [None, Some("memory")] {
        let arm = arm(&result, hostile);
        assert_eq!(arm["innocents_ready"], 24, "{arm}");
        assert!(arm["create_to_ready_seconds"]["p99"].as_f64().unwrap() > 0.0);
    }
    let memory = arm(&result, Some("memory"));
    let status = &memory["hostile_status"];
    assert_eq!(status["names_failure"], true, "{status}");
    assert_eq!(status["stalled"], "True", "{status}");
    assert_eq!(status["ready_reason"], "RenderError", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("exceeded the renderer's memory limit"),
        "{message}"
    );
    // The bomb died with innocent renders in flight beside it (each of them and the bomb sent
    // again, alone): the arm tested the isolation, not a lucky moment without neighbours.
    let resent = memory["renders_resent"].as_u64().unwrap();
    assert!(resent >= 2, "renders re-sent beside the bomb: {memory}");
    assert!(memory["renderer_starts"].as_u64().unwrap() >= 1, "{memory}");
    let none = arm(&result, None);
    assert_eq!(none["renderer_starts"], 0, "{none}");
    assert!(none["hostile_status"].is_null());
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(summary.contains("## Hostile charts beside innocent Manifests"));
    assert!(summary.contains("### Against issue 31's targets"));
}
