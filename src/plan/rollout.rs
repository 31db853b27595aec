//! Rollouts in batches (pure): the Manifests of one rollout group (label
//! `modulemanager.io/rollout-group`) in one namespace that move to the same new chart upgrade a
//! batch at a time — 1 × the first batch's size, then twice as many each batch — and a batch
//! with more failures than allowed halts the rest. The fleet shares a rollout's state through one
//! small object per (namespace, group, chart) ([`RolloutState`], kept by
//! `reconcile::rollout`); these functions decide from it and from the group's Manifests.
//!
//! Only an upgrade that moves a module off the chart it runs waits ([`chart_move`]): an install,
//! a values change and a retry of a release already started go on at once.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::api::{Manifest, Release, ReleaseOutcome, ScheduledUpgrade};
use crate::plan::history::chart_reference;

/// The label that puts a Manifest into a rollout group (its value names the group).
pub const GROUP_LABEL: &str = "modulemanager.io/rollout-group";
/// The rollout object's annotation that holds its rollout: set by the operator when a batch
/// failed (the message says why), or by a person; removing it resumes the rollout.
pub const PAUSED_ANNOTATION: &str = "modulemanager.io/rollout-paused";

/// How rollouts go (`--rollout-first-batch`, `--rollout-max-failures`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RolloutSettings {
    /// Manifests in the first batch; each later batch is twice the one before.
    pub first_batch: usize,
    /// Failures a batch may have; one more halts the rollout.
    pub max_failures: usize,
}

impl Default for RolloutSettings {
    fn default() -> Self {
        Self {
            first_batch: 10,
            max_failures: 0,
        }
    }
}

/// The size of batch `index` (from 0).
pub fn batch_size(settings: RolloutSettings, index: usize) -> usize {
    let doubled = u32::try_from(index)
        .ok()
        .and_then(|i| 1usize.checked_shl(i));
    settings
        .first_batch
        .max(1)
        .saturating_mul(doubled.unwrap_or(usize::MAX))
}

/// Whether a pass on inputs naming the chart `to` would move the module off the chart it runs:
/// a release succeeded on another chart, and no release of `to` started since. An install
/// (nothing succeeded yet), a change of values only, a chart moved back to the one that runs,
/// and an upgrade already started (its release recorded) do not wait.
pub fn chart_move(to: &str, history: &[Release]) -> bool {
    let Some(newest) = history.first() else {
        return false;
    };
    newest.chart != to && running_release(history).is_some_and(|r| r.chart != to)
}

/// The release that runs: the newest that succeeded.
fn running_release(history: &[Release]) -> Option<&Release> {
    history
        .iter()
        .find(|r| r.outcome == ReleaseOutcome::Succeeded)
}

/// The name of the rollout object of the Manifests of `group` in `namespace` moving to the chart
/// `to`, in the fleet `fleet`'s namespace: a digest of all three, so a group of the same name in
/// another namespace (another tenant) never shares a rollout.
pub fn object_name(fleet: &str, namespace: &str, group: &str, to: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}\n{group}\n{to}"));
    let hash: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{fleet}-rollout-{hash}")
}

/// How long past its start a spread upgrade's schedule still holds: a pass that comes this much
/// later (the operator was down, the queue was long) still starts it; later, the move is taken
/// for one made again, and scheduled anew.
const SCHEDULE_KEPT: Duration = Duration::from_secs(3600);

/// When the upgrade of the Manifest `uid` to the chart `to` may start, spread over `window`
/// (`--upgrade-spread-seconds`): as the status scheduled it if it did for `to`, else `now` plus
/// an offset within the window that every replica works out alike (a digest of the UID and
/// the chart), so that many Manifests moved at once start spread evenly over the window.
pub fn spread_start(
    uid: &str,
    to: &str,
    window: Duration,
    scheduled: Option<&ScheduledUpgrade>,
    now: Timestamp,
) -> ScheduledUpgrade {
    // A schedule of this chart is kept, unless its start is more than a window and an hour
    // past: the move was undone and is made again: schedule anew.
    let recent = |s: &&ScheduledUpgrade| {
        let age = s.at.0.duration_until(now);
        Duration::try_from(age).map_or(true, |age| age <= window + SCHEDULE_KEPT)
    };
    if let Some(scheduled) = scheduled.filter(|s| s.chart == to).filter(recent) {
        return scheduled.clone();
    }
    let digest = Sha256::digest(format!("{uid}\n{to}"));
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let millis = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    // At least 1 ms, so that every spread upgrade is scheduled (and shows in the status).
    let offset = u64::from_be_bytes(first) % millis + 1;
    let offset = SignedDuration::from_millis(i64::try_from(offset).unwrap_or(1));
    let at = now.checked_add(offset).unwrap_or(now);
    ScheduledUpgrade {
        chart: to.to_owned(),
        at: Time(at),
    }
}

/// What the rollout object keeps: the Manifests (names) admitted, batch by batch, and the
/// last look at the newest batch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutState {
    /// The admitted Manifests, one list per batch, in order.
    #[serde(default)]
    pub batches: Vec<Vec<String>>,
    /// The newest batch's progress when a waiting Manifest last looked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<Checked>,
    /// The batch (index) whose failures halted the rollout: once resumed, the next batch opens
    /// without looking at it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<usize>,
    /// When a pass last wrote the state, in seconds since the Unix epoch.
    #[serde(default)]
    pub updated: i64,
    /// The revision of the release each admitted Manifest ran when it was admitted: an
    /// admission holds only while that release still runs (a Manifest moved back and then to
    /// this chart again is admitted anew).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub running: BTreeMap<String, u32>,
}

/// A Manifest asking the rollout: its name, and the revision of the release that runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asking<'a> {
    pub name: &'a str,
    pub running: Option<u32>,
}

/// The revision of the release that runs (the newest that succeeded), if any.
pub fn running_revision(history: &[Release]) -> Option<u32> {
    running_release(history).map(|r| r.revision)
}

/// Whether `asking` is admitted by `state`: listed, with the release that ran then still running.
fn is_admitted(state: &RolloutState, asking: Asking<'_>) -> bool {
    let listed = state.batches.iter().flatten().any(|n| n == asking.name);
    listed && state.running.get(asking.name).copied() == asking.running
}

/// A rollout not written for this long (seconds), nor for four check periods, is over: its
/// state is not used again (a later move to the same chart starts a new rollout with a first
/// batch), unless it is paused (its waiters keep a paused one written).
pub const IDLE_SECONDS: i64 = 3600;

/// How long a rollout looked at every `check_every` seconds may go unwritten before it is over.
pub fn idle_after(check_every: u64) -> i64 {
    IDLE_SECONDS.max(i64::try_from(check_every.saturating_mul(4)).unwrap_or(i64::MAX))
}

/// The state a pass works from at `now` (seconds since the epoch): `state`, or an empty one if
/// the rollout is over (not written for `idle` seconds) and not `paused`.
pub fn current(state: RolloutState, paused: bool, now: i64, idle: i64) -> RolloutState {
    if !paused && now.saturating_sub(state.updated) > idle {
        return RolloutState::default();
    }
    state
}

/// `state` after a look at its newest batch at `now`: the look stands for the check period.
pub fn looked(state: RolloutState, check: &BatchCheck, now: i64) -> RolloutState {
    let admitted = state.batches.last().map_or(0, Vec::len);
    let message = progress_message(state.batches.len(), admitted, check);
    RolloutState {
        checked: Some(Checked { at: now, message }),
        ..state
    }
}

/// One look at the newest batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checked {
    /// When, in seconds since the Unix epoch.
    pub at: i64,
    /// What it found.
    pub message: String,
}

/// Where one admitted Manifest is in the rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberProgress {
    /// Its upgrade goes on.
    Running,
    /// Its release of the new chart succeeded.
    Succeeded,
    /// Its release of the new chart failed, or it stalled on it (a render error, a permanent
    /// apply error).
    Failed,
    /// It left the rollout: deleted, out of the group, or moved to another chart.
    Left,
}

/// Where the admitted Manifest `manifest` (`None`: not found) is in the rollout of `group` to
/// the chart `to`.
pub fn member_progress(manifest: Option<&Manifest>, group: &str, to: &str) -> MemberProgress {
    let Some(manifest) = manifest else {
        return MemberProgress::Left;
    };
    let labels = manifest.metadata.labels.as_ref();
    let in_group = labels.and_then(|l| l.get(GROUP_LABEL)).map(String::as_str) == Some(group);
    let deleting = manifest.metadata.deletion_timestamp.is_some();
    // A suspended Manifest runs no pass: it cannot hold the batch.
    let suspended = manifest.spec.suspend;
    if !in_group || deleting || suspended || chart_reference(&manifest.spec.chart) != to {
        return MemberProgress::Left;
    }
    let status = manifest.status.clone().unwrap_or_default();
    match status.history.first() {
        Some(r) if r.chart == to && r.outcome == ReleaseOutcome::Succeeded => {
            return MemberProgress::Succeeded;
        }
        Some(r) if r.chart == to && r.outcome == ReleaseOutcome::Failed => {
            return MemberProgress::Failed;
        }
        _ => {}
    }
    let current = status.observed_generation == manifest.metadata.generation;
    let stalled = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Stalled" && c.status == "True");
    if current && stalled {
        MemberProgress::Failed
    } else {
        MemberProgress::Running
    }
}

/// The newest batch as the group's Manifests show it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchCheck {
    /// Members still upgrading.
    pub running: usize,
    /// Members whose upgrade succeeded.
    pub succeeded: usize,
    /// Members that left the rollout.
    pub left: usize,
    /// Members whose upgrade failed, by name.
    pub failed: Vec<String>,
}

/// Looks at the members of the newest batch of `state`, found by `find` (name → Manifest).
pub fn check_batch<'a>(
    state: &RolloutState,
    group: &str,
    to: &str,
    find: impl Fn(&str) -> Option<&'a Manifest>,
) -> BatchCheck {
    let mut check = BatchCheck::default();
    for name in state.batches.last().into_iter().flatten() {
        match member_progress(find(name), group, to) {
            MemberProgress::Running => check.running += 1,
            MemberProgress::Succeeded => check.succeeded += 1,
            MemberProgress::Left => check.left += 1,
            MemberProgress::Failed => check.failed.push(name.clone()),
        }
    }
    check
}

/// What a Manifest that moves to the rollout's chart does now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// It is admitted already: upgrade.
    Proceed,
    /// Admit it into batch `index` (a new batch when it is `batches.len()`), then upgrade.
    Admit(usize),
    /// The newest batch is full and must be looked at before another opens.
    Check,
    /// Wait, for the reason given.
    Wait(String),
    /// Halt the rollout (set the paused annotation to this message) and wait.
    Halt(String),
}

/// The decision for the Manifest `asking` from the rollout object's `state` and paused
/// annotation, the look at the newest batch if one was taken (`check`) and whether the last
/// look is recent enough to stand for one (`fresh_check`).
pub fn decide(
    state: &RolloutState,
    paused: Option<&str>,
    asking: Asking<'_>,
    settings: RolloutSettings,
    (check, fresh_check): (Option<&BatchCheck>, bool),
) -> Decision {
    if is_admitted(state, asking) {
        return Decision::Proceed;
    }
    if let Some(why) = paused {
        return Decision::Wait(format!("the rollout is paused: {why}"));
    }
    let index = state.batches.len().saturating_sub(1);
    let Some(newest) = state.batches.last() else {
        return Decision::Admit(0);
    };
    let batch = index + 1;
    if state.halted == Some(index) {
        // Resumed after this batch halted the rollout (full or not): the next one opens.
        return Decision::Admit(index + 1);
    }
    if newest.len() < batch_size(settings, index) {
        // A batch still filling is looked at once a check period too: failures known while it
        // fills halt it before more are admitted.
        return match check {
            None if !newest.is_empty() && !fresh_check => Decision::Check,
            Some(check) if check.failed.len() > settings.max_failures => {
                Decision::Halt(halt_message(batch, newest.len(), check, settings))
            }
            _ => Decision::Admit(index),
        };
    }
    let Some(check) = check else {
        return match (&state.checked, fresh_check) {
            (Some(last), true) => Decision::Wait(last.message.clone()),
            _ => Decision::Check,
        };
    };
    if check.failed.len() > settings.max_failures {
        return Decision::Halt(halt_message(batch, newest.len(), check, settings));
    }
    if check.running > 0 {
        return Decision::Wait(progress_message(batch, newest.len(), check));
    }
    Decision::Admit(index + 1)
}

/// What a look found of batch `batch` (of `admitted` Manifests) while it goes on.
fn progress_message(batch: usize, admitted: usize, check: &BatchCheck) -> String {
    format!(
        "batch {batch} goes on: {} of {admitted} upgraded, {} running, {} failed, {} left the rollout",
        check.succeeded,
        check.running,
        check.failed.len(),
        check.left
    )
}

/// Why batch `batch` (of `admitted` Manifests) halts the rollout.
fn halt_message(
    batch: usize,
    admitted: usize,
    check: &BatchCheck,
    settings: RolloutSettings,
) -> String {
    let named = check.failed.iter().take(5).cloned().collect::<Vec<_>>();
    format!(
        "batch {batch}: {} of {admitted} failed ({}); more than the {} allowed (--rollout-max-failures)",
        check.failed.len(),
        named.join(", "),
        settings.max_failures
    )
}

/// `state` once the newest batch halted the rollout.
pub fn halted(state: RolloutState) -> RolloutState {
    let index = state.batches.len().checked_sub(1);
    RolloutState {
        halted: index,
        checked: None,
        ..state
    }
}

/// `state` with `asking` admitted into batch `index` (an earlier admission of the same name,
/// from a run of the rollout it moved away from since, is dropped).
pub fn admitted(mut state: RolloutState, asking: Asking<'_>, index: usize) -> RolloutState {
    for batch in &mut state.batches {
        batch.retain(|n| n != asking.name);
    }
    if index >= state.batches.len() {
        state.batches.push(Vec::new());
        state.checked = None;
    }
    if let Some(batch) = state.batches.last_mut() {
        batch.push(asking.name.to_owned());
    }
    match asking.running {
        Some(revision) => state.running.insert(asking.name.to_owned(), revision),
        None => state.running.remove(asking.name),
    };
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::HookOperation;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn release(chart: &str, outcome: ReleaseOutcome) -> Release {
        Release {
            revision: 1,
            operation: HookOperation::Upgrade,
            chart: chart.into(),
            chart_digest: None,
            values_digest: None,
            generation: Some(1),
            run_id: "r".into(),
            started: Time(Timestamp::UNIX_EPOCH),
            ended: None,
            outcome,
            message: None,
        }
    }

    const SETTINGS: RolloutSettings = RolloutSettings {
        first_batch: 2,
        max_failures: 0,
    };

    #[test]
    fn a_spread_start_is_within_the_window_alike_everywhere_and_kept() {
        let window = Duration::from_secs(300);
        let now = Timestamp::UNIX_EPOCH;
        let starts: Vec<ScheduledUpgrade> = (0..200)
            .map(|i| spread_start(&format!("uid-{i}"), "web 2.0.0", window, None, now))
            .collect();
        let offsets: Vec<i64> = starts.iter().map(|s| s.at.0.as_second()).collect();
        assert!(offsets.iter().all(|s| (0..=300).contains(s)), "{offsets:?}");
        // Spread: each fifth of the window holds some of the 200 starts.
        for fifth in 0..5 {
            let within = offsets.iter().filter(|s| **s / 60 == fifth).count();
            assert!(within > 10, "{within} starts in minute {fifth}");
        }
        // The same on every replica, and kept once scheduled (a later pass keeps the time).
        let again = spread_start("uid-7", "web 2.0.0", window, None, now);
        assert_eq!(again, starts[7]);
        let later = now.checked_add(SignedDuration::from_secs(100)).unwrap();
        let kept = spread_start("uid-7", "web 2.0.0", window, Some(&starts[7]), later);
        assert_eq!(kept, starts[7]);
        // Another chart is scheduled anew.
        let other = spread_start("uid-7", "web 3.0.0", window, Some(&starts[7]), later);
        assert_eq!(other.chart, "web 3.0.0");
        assert!(other.at.0 >= later);
    }

    #[test]
    fn a_rollout_object_belongs_to_one_namespace_group_and_chart() {
        let name = object_name("mm", "tenant-a", "edge", "web 2.0.0");
        assert!(name.starts_with("mm-rollout-") && name.len() == "mm-rollout-".len() + 16);
        assert_eq!(name, object_name("mm", "tenant-a", "edge", "web 2.0.0"));
        assert_ne!(name, object_name("mm", "tenant-b", "edge", "web 2.0.0"));
        assert_ne!(name, object_name("mm", "tenant-a", "core", "web 2.0.0"));
        assert_ne!(name, object_name("mm", "tenant-a", "edge", "web 2.0.1"));
    }

    #[test]
    fn batches_double() {
        let sizes: Vec<usize> = (0..5).map(|i| batch_size(SETTINGS, i)).collect();
        assert_eq!(sizes, [2, 4, 8, 16, 32]);
        assert_eq!(batch_size(SETTINGS, 200), usize::MAX, "no overflow");
    }

    #[test]
    fn only_a_move_off_the_running_chart_waits() {
        use ReleaseOutcome::*;
        let running = [release("repo web 1.0.0", Succeeded)];
        assert!(
            chart_move("repo web 2.0.0", &running),
            "an upgrade to a new chart"
        );
        assert!(!chart_move("repo web 1.0.0", &running), "values only");
        assert!(
            !chart_move("repo web 2.0.0", &[]),
            "an install, or no history yet"
        );
        let failed_install = [release("repo web 1.0.0", Failed)];
        assert!(
            !chart_move("repo web 2.0.0", &failed_install),
            "nothing runs"
        );
        let started = [
            release("repo web 2.0.0", Pending),
            release("repo web 1.0.0", Succeeded),
        ];
        assert!(!chart_move("repo web 2.0.0", &started), "started: goes on");
        assert!(
            !chart_move("repo web 1.0.0", &started),
            "back to the one that runs"
        );
        assert!(chart_move("repo web 3.0.0", &started), "another new chart");
    }

    fn member(
        name: &str,
        group: &str,
        chart: &str,
        history: &[Release],
        stalled: bool,
    ) -> Manifest {
        let conditions = if stalled {
            json!([{"type": "Stalled", "status": "True", "reason": "RenderError", "message": "x",
                    "lastTransitionTime": "2026-12-01T00:00:00Z"}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1", "kind": "Manifest",
            "metadata": {"name": name, "namespace": "ns", "generation": 2,
                         "labels": {GROUP_LABEL: group}},
            "spec": {"module": "m", "chart": {"path": chart}},
            "status": {"observedGeneration": 2, "history": history, "conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn a_member_is_judged_by_its_release_of_the_new_chart() {
        use ReleaseOutcome::*;
        let progress = |m: &Manifest| member_progress(Some(m), "g", "v2");
        let old = release("v1", Succeeded);
        let ok = member(
            "a",
            "g",
            "v2",
            &[release("v2", Succeeded), old.clone()],
            false,
        );
        assert_eq!(progress(&ok), MemberProgress::Succeeded);
        let bad = member("a", "g", "v2", &[release("v2", Failed), old.clone()], false);
        assert_eq!(progress(&bad), MemberProgress::Failed);
        let render_error = member("a", "g", "v2", std::slice::from_ref(&old), true);
        assert_eq!(progress(&render_error), MemberProgress::Failed);
        let going = member(
            "a",
            "g",
            "v2",
            &[release("v2", Pending), old.clone()],
            false,
        );
        assert_eq!(progress(&going), MemberProgress::Running);
        let elsewhere = member("a", "other", "v2", std::slice::from_ref(&old), false);
        assert_eq!(progress(&elsewhere), MemberProgress::Left);
        let moved_on = member("a", "g", "v3", &[old], false);
        assert_eq!(progress(&moved_on), MemberProgress::Left);
        assert_eq!(member_progress(None, "g", "v2"), MemberProgress::Left);
    }

    fn state(batches: &[&[&str]]) -> RolloutState {
        RolloutState {
            batches: batches
                .iter()
                .map(|b| b.iter().map(ToString::to_string).collect())
                .collect(),
            checked: None,
            halted: None,
            updated: 0,
            running: batches
                .iter()
                .flat_map(|b| b.iter().map(|n| (n.to_string(), 1)))
                .collect(),
        }
    }

    /// A Manifest asking, running revision 1.
    fn ask(name: &str) -> Asking<'_> {
        Asking {
            name,
            running: Some(1),
        }
    }

    #[test]
    fn batches_fill_then_wait_for_a_look() {
        let decide = |s: &RolloutState, name| decide(s, None, ask(name), SETTINGS, (None, false));
        assert_eq!(decide(&RolloutState::default(), "a"), Decision::Admit(0));
        // A batch still filling is looked at once a check period, then admits.
        assert_eq!(decide(&state(&[&["a"]]), "b"), Decision::Check);
        let fresh =
            |s: &RolloutState, check| super::decide(s, None, ask("b"), SETTINGS, (check, true));
        assert_eq!(fresh(&state(&[&["a"]]), None), Decision::Admit(0));
        let clean = BatchCheck {
            running: 1,
            ..Default::default()
        };
        let filling = super::decide(
            &state(&[&["a"]]),
            None,
            ask("b"),
            SETTINGS,
            (Some(&clean), false),
        );
        assert_eq!(filling, Decision::Admit(0));
        // Failures known while it fills halt it before more are admitted.
        let failing = BatchCheck {
            failed: vec!["a".into()],
            ..Default::default()
        };
        let halted = super::decide(
            &state(&[&["a"]]),
            None,
            ask("b"),
            SETTINGS,
            (Some(&failing), false),
        );
        assert!(
            matches!(halted, Decision::Halt(why) if why.starts_with("batch 1: 1 of 1 failed (a)"))
        );
        assert_eq!(decide(&state(&[&["a", "b"]]), "a"), Decision::Proceed);
        assert_eq!(decide(&state(&[&["a", "b"]]), "c"), Decision::Check);
        let mut looked = state(&[&["a", "b"]]);
        looked.checked = Some(Checked {
            at: 0,
            message: "batch 1 goes on".into(),
        });
        let fresh = super::decide(&looked, None, ask("c"), SETTINGS, (None, true));
        assert_eq!(fresh, Decision::Wait("batch 1 goes on".into()));
        assert_eq!(
            decide(&looked, "c"),
            Decision::Check,
            "an old look is looked again"
        );
    }

    #[test]
    fn a_look_opens_the_next_batch_waits_or_halts() {
        let full = state(&[&["a", "b"]]);
        let decide =
            |check: &BatchCheck| decide(&full, None, ask("c"), SETTINGS, (Some(check), false));
        let done = BatchCheck {
            succeeded: 1,
            left: 1,
            ..Default::default()
        };
        assert_eq!(decide(&done), Decision::Admit(1));
        let going = BatchCheck {
            succeeded: 1,
            running: 1,
            ..Default::default()
        };
        assert!(matches!(decide(&going), Decision::Wait(m) if m.contains("1 of 2 upgraded")));
        let failed = BatchCheck {
            succeeded: 1,
            failed: vec!["b".into()],
            ..Default::default()
        };
        let Decision::Halt(why) = decide(&failed) else {
            panic!("a failure halts");
        };
        assert!(why.contains("batch 1: 1 of 2 failed (b)"), "{why}");
        // With one failure allowed, the same look opens the next batch.
        let lenient = RolloutSettings {
            max_failures: 1,
            ..SETTINGS
        };
        let opened = super::decide(&full, None, ask("c"), lenient, (Some(&failed), false));
        assert_eq!(opened, Decision::Admit(1));
        // Halted, then resumed (the annotation removed): the next batch opens without a look.
        let stopped = halted(full.clone());
        assert_eq!(stopped.halted, Some(0));
        let resumed = super::decide(&stopped, None, ask("c"), SETTINGS, (None, false));
        assert_eq!(resumed, Decision::Admit(1));
        // The next batch is looked at as any other.
        let next = ["c", "d", "e", "f"]
            .into_iter()
            .fold(stopped, |s, name| admitted(s, ask(name), 1));
        assert_eq!(
            super::decide(&next, None, ask("g"), SETTINGS, (None, false)),
            Decision::Check
        );
    }

    #[test]
    fn a_batch_that_halted_before_it_filled_is_closed_on_resume() {
        let one_failed = halted(state(&[&["a"]]));
        let resumed = decide(&one_failed, None, ask("b"), SETTINGS, (None, false));
        assert_eq!(
            resumed,
            Decision::Admit(1),
            "the next batch, not the halted one"
        );
    }

    #[test]
    fn an_admission_holds_only_while_the_release_that_ran_then_runs() {
        let s = state(&[&["a"]]);
        assert_eq!(
            decide(&s, None, ask("a"), SETTINGS, (None, false)),
            Decision::Proceed
        );
        // a moved back to the old chart (a new release runs) and to this one again.
        let again = Asking {
            name: "a",
            running: Some(3),
        };
        assert_ne!(
            decide(&s, None, again, SETTINGS, (None, false)),
            Decision::Proceed
        );
        // Admitted anew, it is listed once, with the release that runs now.
        let readmitted = admitted(s, again, 0);
        assert_eq!(readmitted.batches, [vec!["a".to_owned()]]);
        assert_eq!(readmitted.running.get("a"), Some(&3));
        assert_eq!(
            decide(&readmitted, None, again, SETTINGS, (None, false)),
            Decision::Proceed
        );
    }

    #[test]
    fn the_idle_limit_follows_a_long_check_period() {
        assert_eq!(idle_after(30), IDLE_SECONDS);
        assert_eq!(idle_after(3600), 4 * 3600);
    }

    #[test]
    fn a_rollout_left_idle_is_over_unless_paused() {
        let mut old = state(&[&["a", "b"]]);
        old.updated = 100;
        let now = 100 + IDLE_SECONDS + 1;
        assert_eq!(
            current(old.clone(), false, now, IDLE_SECONDS),
            RolloutState::default()
        );
        assert_eq!(
            current(old.clone(), true, now, IDLE_SECONDS),
            old,
            "a halt stays until resumed"
        );
        assert_eq!(
            current(old.clone(), false, 100 + IDLE_SECONDS, IDLE_SECONDS),
            old
        );
    }

    #[test]
    fn a_suspended_member_cannot_hold_its_batch() {
        let old = release("v1", ReleaseOutcome::Succeeded);
        let mut asleep = member("a", "g", "v2", std::slice::from_ref(&old), false);
        asleep.spec.suspend = true;
        assert_eq!(
            member_progress(Some(&asleep), "g", "v2"),
            MemberProgress::Left
        );
    }

    #[test]
    fn a_schedule_older_than_a_window_is_made_anew() {
        let window = Duration::from_secs(300);
        let start = spread_start("u", "web 2", window, None, Timestamp::UNIX_EPOCH);
        let day = Timestamp::UNIX_EPOCH
            .checked_add(SignedDuration::from_hours(24))
            .unwrap();
        let again = spread_start("u", "web 2", window, Some(&start), day);
        assert!(
            again.at.0 > day,
            "the move made again a day later waits again"
        );
    }

    #[test]
    fn a_paused_rollout_admits_no_one_but_lets_the_admitted_go_on() {
        let s = state(&[&["a"]]);
        let paused = |name| decide(&s, Some("by hand"), ask(name), SETTINGS, (None, false));
        assert_eq!(paused("a"), Decision::Proceed);
        assert_eq!(
            paused("b"),
            Decision::Wait("the rollout is paused: by hand".into())
        );
    }

    #[test]
    fn admitting_opens_a_batch_and_forgets_the_last_look() {
        let mut s = state(&[&["a", "b"]]);
        s.checked = Some(Checked {
            at: 1,
            message: "m".into(),
        });
        let next = admitted(s, ask("c"), 1);
        assert_eq!(next, state(&[&["a", "b"], &["c"]]));
        assert_eq!(
            admitted(next, ask("d"), 1),
            state(&[&["a", "b"], &["c", "d"]])
        );
    }
}
