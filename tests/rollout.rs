//! Rollout groups (`modulemanager.io/rollout-group`) on a fleet of two replica processes of the
//! real binary against a real kube-apiserver: a bad chart version moved to 200 Manifests at once
//! is tried by the first batch only and halts the rest; removing the pause resumes it (one more
//! batch, which fails again); a good version then goes to every Manifest batch by batch. The
//! replicas share the rollout's state through its object in the fleet's namespace. Without a
//! group, `--upgrade-spread-seconds` spreads the upgrades over its window.
#![allow(clippy::too_many_lines, reason = "a scenario test reads top to bottom")]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use module_manager::api::{Manifest, State};
use module_manager::plan::rollout::{GROUP_LABEL, PAUSED_ANNOTATION, RolloutState};
use serde_json::json;
use test_support::fleet::{ShortFleet, start_short};
use test_support::objects;

const MANIFESTS: usize = 200;
const FIRST_BATCH: usize = 10;

/// The reason of the Manifest's Ready condition at its current generation, if reconciled.
fn reason(manifest: &Manifest) -> Option<String> {
    let status = manifest.status.as_ref()?;
    if status.observed_generation != manifest.metadata.generation {
        return None;
    }
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some(ready.reason.clone())
}

/// The Manifests by the reason of their Ready condition (`-` while not reconciled).
async fn by_reason(api: &Api<Manifest>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for manifest in objects::list(api).await {
        let reason = reason(&manifest).unwrap_or_else(|| "-".into());
        *counts.entry(reason).or_default() += 1;
    }
    counts
}

/// Waits (at most `limit`) until `done` holds for the counts by reason.
async fn wait_reasons(
    fleet: &ShortFleet,
    what: &str,
    limit: Duration,
    done: impl Fn(&BTreeMap<String, usize>) -> bool,
) -> BTreeMap<String, usize> {
    let api = Api::<Manifest>::namespaced(fleet.client.clone(), &fleet.namespace);
    let deadline = Instant::now() + limit;
    loop {
        let counts = by_reason(&api).await;
        if done(&counts) {
            return counts;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {counts:?}\n{}",
            fleet.local.tails()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The fleet's rollout objects (ConfigMaps labelled with the group).
async fn rollouts(fleet: &ShortFleet) -> Vec<ConfigMap> {
    let api = Api::<ConfigMap>::namespaced(fleet.client.clone(), &fleet.namespace);
    objects::list(&api)
        .await
        .into_iter()
        .filter(|c| c.labels().contains_key(GROUP_LABEL))
        .collect()
}

/// The rollout object of the chart `path`, with its state.
async fn rollout_of(fleet: &ShortFleet, path: &str) -> Option<(ConfigMap, RolloutState)> {
    let object = rollouts(fleet).await.into_iter().find(|c| {
        c.data
            .as_ref()
            .and_then(|d| d.get("chart"))
            .map(String::as_str)
            == Some(path)
    })?;
    let state = serde_json::from_str(&object.data.as_ref()?["state"]).unwrap();
    Some((object, state))
}

/// Waits (at most `limit`) until the bad version's rollout is halted with exactly `batches`
/// batches (a batch opened after a halt makes this time out),
/// every Manifest it admitted failed and the others are held; answers the counts by reason, the
/// rollout object and its state.
async fn wait_halted(
    fleet: &ShortFleet,
    batches: usize,
    limit: Duration,
) -> (BTreeMap<String, usize>, ConfigMap, RolloutState) {
    let api = Api::<Manifest>::namespaced(fleet.client.clone(), &fleet.namespace);
    let deadline = Instant::now() + limit;
    loop {
        let counts = by_reason(&api).await;
        if let Some((object, state)) = rollout_of(fleet, BAD).await {
            let admitted: usize = state.batches.iter().map(Vec::len).sum();
            let failed = counts.get("RenderError").copied().unwrap_or(0);
            let held = counts.get("RolloutPaused").copied().unwrap_or(0);
            let paused = object.annotations().contains_key(PAUSED_ANNOTATION);
            let settled = failed == admitted && failed + held == MANIFESTS;
            if paused && state.batches.len() == batches && settled {
                return (counts, object, state);
            }
        }
        assert!(
            Instant::now() < deadline,
            "never halted with {batches} batches: {counts:?}\n{}",
            fleet.local.tails()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Moves the Manifests `m0`… `m<count - 1>` to the chart `path`.
async fn move_all(api: &Api<Manifest>, path: &str, count: usize) {
    for i in 0..count {
        common::patch_spec(api, &format!("m{i}"), json!({"chart": {"path": path}})).await;
    }
}

const BAD: &str = "tests/fixtures/charts/template-error";
const GOOD: &str = "tests/fixtures/charts/tiny-v2";

/// The tests of this binary start a fleet each; on a 2-core machine they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Creates the Manifests `m0`… `m<count - 1>` on the tiny chart, in `group` if given.
async fn create_tiny(fleet: &ShortFleet, count: usize, group: Option<&str>) {
    let api = Api::<Manifest>::namespaced(fleet.client.clone(), &fleet.namespace);
    for i in 0..count {
        let mut labels = json!({"fleet-test": fleet.name});
        if let Some(group) = group {
            labels[GROUP_LABEL] = json!(group);
        }
        let manifest: Manifest = serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": format!("m{i}"), "labels": labels},
            "spec": {"module": "tiny", "chart": {"path": "tests/fixtures/charts/tiny"},
                     "interval": "1h"}
        }))
        .unwrap();
        api.create(&PostParams::default(), &manifest).await.unwrap();
    }
}

/// A fleet of `replicas` replica processes with `args`.
async fn fleet(name: &str, replicas: u32, args: &[&str]) -> ShortFleet {
    let control_plane = common::control_plane_with(None).await;
    start_short(
        control_plane,
        env!("CARGO_BIN_EXE_module-manager").into(),
        ("rollout", name),
        (replicas, 64),
        args.iter().map(ToString::to_string).collect(),
    )
    .await
}

/// Without a rollout group, with `--upgrade-spread-seconds 20`: 20 Manifests moved to a new chart
/// at once are each scheduled within the 20 s after the move (`status.upgradeAfter`), spread
/// over the window; none upgrades before its time, and all end on the new chart. Without the
/// spread there is no schedule and the upgrades start at once.
#[tokio::test]
async fn upgrades_to_a_new_chart_are_spread_over_the_window() {
    const COUNT: usize = 20;
    let _serial = SERIAL.lock().await;
    let fleet = fleet("spread", 1, &["--upgrade-spread-seconds", "20"]).await;
    create_tiny(&fleet, COUNT, None).await;
    let limit = Duration::from_secs(120);
    wait_reasons(&fleet, "all installed", limit, |c| {
        c.get("Ready") == Some(&COUNT)
    })
    .await;
    let api = Api::<Manifest>::namespaced(fleet.client.clone(), &fleet.namespace);
    let moved = Timestamp::now();
    move_all(&api, GOOD, COUNT).await;
    let waiting = wait_reasons(&fleet, "some wait for their start", limit, |c| {
        c.get("RolloutWaiting").is_some_and(|n| *n > 0)
    })
    .await;
    eprintln!("SPREAD waiting: {waiting:?}");
    wait_reasons(&fleet, "all upgraded", limit, |c| {
        c.get("Ready") == Some(&COUNT)
    })
    .await;
    let configmaps = Api::<ConfigMap>::namespaced(fleet.client.clone(), &fleet.namespace);
    let mut starts = Vec::new();
    for manifest in objects::list(&api).await {
        let name = manifest.name_any();
        let status = manifest.status.unwrap();
        let scheduled = status.upgrade_after.expect("the upgrade was scheduled");
        assert_eq!(scheduled.chart, GOOD, "{name}");
        let after_move = scheduled.at.0.duration_since(moved).as_secs_f64();
        assert!(
            // Within the window after the pass that saw the move (the patches take a moment,
            // and the status keeps whole seconds).
            (-1.0..23.0).contains(&after_move),
            "{name}: at {after_move} s after the move"
        );
        let release = &status.history[0];
        assert_eq!(release.chart, GOOD, "{name}");
        assert!(
            release.started.0 >= scheduled.at.0,
            "{name} started before its time"
        );
        let module = configmaps.get(&name).await.unwrap();
        assert_eq!(
            module.data.unwrap().get("version").map(String::as_str),
            Some("2")
        );
        starts.push(after_move);
    }
    starts.sort_by(f64::total_cmp);
    let span = starts[COUNT - 1] - starts[0];
    eprintln!("SPREAD starts {starts:?} s after the move (span {span:.1} s)");
    assert!(
        span >= 10.0,
        "20 starts spread over at least half the window: {starts:?}"
    );
}

#[tokio::test]
async fn a_bad_version_halts_after_the_first_batch_and_a_good_one_goes_everywhere_in_batches() {
    let _serial = SERIAL.lock().await;
    let args = [
        "--rollout-first-batch",
        "10",
        "--rollout-check-seconds",
        "2",
    ];
    let fleet = fleet("batches", 2, &args).await;
    let api = Api::<Manifest>::namespaced(fleet.client.clone(), &fleet.namespace);
    create_tiny(&fleet, MANIFESTS, Some("edge")).await;
    let limit = Duration::from_secs(300);
    wait_reasons(&fleet, "all installed", limit, |c| {
        c.get("Ready") == Some(&MANIFESTS)
    })
    .await;

    // A bad version for all at once: the first batch tries it and fails; the rest wait, then
    // see the rollout halted.
    move_all(&api, BAD, MANIFESTS).await;
    let (halted, object, state) = wait_halted(&fleet, 1, limit).await;
    eprintln!("ROLLOUT halted: {halted:?}");
    // Halted by the first failures seen: the batch may not have filled (failures known while
    // it fills halt it), and every Manifest it admitted failed.
    let first = state.batches[0].len();
    assert!((1..=FIRST_BATCH).contains(&first), "{state:?}");
    assert_eq!(halted.get("RenderError"), Some(&first));
    let why = object
        .annotations()
        .get(PAUSED_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    assert!(
        why.starts_with("batch 1: ") && why.contains(" failed ("),
        "{why}"
    );
    // The held Manifests' modules are untouched: still the first version's ConfigMap.
    let configmaps = Api::<ConfigMap>::namespaced(fleet.client.clone(), &fleet.namespace);
    let held = objects::list(&api)
        .await
        .into_iter()
        .find(|m| reason(m).as_deref() == Some("RolloutPaused"))
        .unwrap();
    let module = configmaps.get(&held.name_any()).await.unwrap();
    assert_eq!(module.data.unwrap().get("n").map(String::as_str), Some("0"));
    // A few more looks change nothing.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(by_reason(&api).await, halted, "still halted");

    // Resumed by removing the annotation: one more batch (at most twice the first) tries and
    // fails.
    let rollout_name = object.name_any();
    let patch = json!({"metadata": {"annotations": {PAUSED_ANNOTATION: null}}});
    objects::merge(&configmaps, &rollout_name, patch).await;
    let (again, _, state) = wait_halted(&fleet, 2, limit).await;
    eprintln!("ROLLOUT resumed and halted again: {again:?}");
    let second = state.batches[1].len();
    assert!((1..=2 * FIRST_BATCH).contains(&second), "{state:?}");
    assert_eq!(again.get("RenderError"), Some(&(first + second)));

    // A good version: batch by batch (10, 20, 40, 80, 50) to every Manifest.
    move_all(&api, GOOD, MANIFESTS).await;
    wait_reasons(&fleet, "the good version everywhere", limit, |c| {
        c.get("Ready") == Some(&MANIFESTS)
    })
    .await;
    let (object, state) = rollout_of(&fleet, GOOD)
        .await
        .expect("the good version's rollout");
    let sizes: Vec<usize> = state.batches.iter().map(Vec::len).collect();
    eprintln!("ROLLOUT good version: batches {sizes:?}");
    assert_eq!(sizes, [10, 20, 40, 80, 50]);
    assert!(!object.annotations().contains_key(PAUSED_ANNOTATION));
    // Each batch started only once the one before had succeeded (times in whole seconds).
    let listed = objects::list(&api).await;
    let release = |name: &str| {
        let manifest = listed.iter().find(|m| m.name_any() == name).unwrap();
        let status = manifest.status.as_ref().unwrap();
        status
            .history
            .iter()
            .find(|r| r.chart == GOOD)
            .cloned()
            .unwrap()
    };
    for pair in state.batches.windows(2) {
        let done = pair[0]
            .iter()
            .map(|n| release(n).ended.expect("ended").0)
            .max()
            .unwrap();
        let started = pair[1].iter().map(|n| release(n).started.0).min().unwrap();
        assert!(
            started >= done,
            "a batch started at {started} before the one before ended at {done}"
        );
    }
    for manifest in listed {
        let module = configmaps.get(&manifest.name_any()).await.unwrap();
        assert_eq!(
            module.data.unwrap().get("version").map(String::as_str),
            Some("2"),
            "{}",
            manifest.name_any()
        );
        assert_eq!(manifest.status.unwrap().state, Some(State::Ready));
    }
}
