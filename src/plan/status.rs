//! Status (pure): the next `ManifestStatus` from the previous one and a reconcile's outcome,
//! with Kubernetes-convention conditions whose transition times move only on a change.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::ownership;
use crate::api::{
    HookOperation, HookRun, HookRunPhase, InventoryEntry, LastOperation, ManifestStatus,
    ScheduledUpgrade, State,
};
use crate::telemetry::events::{MESSAGE_LIMIT, shorten};

/// What one reconcile pass found.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The summary state.
    pub state: State,
    /// CamelCase reason for the conditions (and the Event, if any).
    pub reason: Reason,
    /// Human-readable message.
    pub message: String,
    /// Whether the render succeeded; `None` when the pass did not get that far.
    pub rendered: Option<bool>,
    /// Whether the apply succeeded; `None` when the pass did not get that far.
    pub applied: Option<bool>,
    /// A permanent error: nothing changes until the spec does.
    pub stalled: bool,
    /// The operation to record in `lastOperation` (install, upgrade, delete …), if one finished
    /// or failed in this pass.
    pub operation: Option<Operation>,
}

impl Outcome {
    /// A pass that waits (a hook, objects going, a dependency, dependents): nothing rendered,
    /// applied or failed in it.
    pub fn waiting(state: State, reason: Reason, message: String) -> Self {
        Self {
            state,
            reason,
            message,
            rendered: None,
            applied: None,
            stalled: false,
            operation: None,
        }
    }
}

/// Why a pass ended as it did: the reason of the conditions and of the Event, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A hook (a Job) runs; the pass looks at it again shortly.
    HookRunning,
    /// Applied objects are still rolling out.
    Progressing,
    /// Every object is applied and ready.
    Ready,
    /// The prune guard refused to delete what the new render lacks.
    PruneRefused,
    /// The module's objects are being deleted.
    Deleting,
    /// The module's objects are deleted (the Manifest is released).
    Deleted,
    /// The module's objects were left on the cluster (`deletionPolicy: Orphan`).
    Orphaned,
    /// Objects are still not ready when `spec.timeout` has passed since they were applied.
    ReadinessTimeout,
    /// An object failed by its readiness rule (a Deployment past its progress deadline, a
    /// crash-looping Pod, a custom resource that is `Stalled` …).
    ObjectFailed,
    /// A dependency (`spec.dependsOn`) is not Ready: nothing is installed or upgraded yet.
    DependencyNotReady,
    /// Deleting waits until no dependent that installed something exists.
    DependentsExist,
    /// Deleting waits for its turn under the fleet's cap on module deletions
    /// (`--max-module-deletions-per-minute`).
    DeletionRateLimited,
    /// An upgrade to a new chart waits for its rollout group's batch
    /// (`modulemanager.io/rollout-group`).
    RolloutWaiting,
    /// An upgrade to a new chart waits: its rollout is paused (by a person, or halted by a
    /// failed batch).
    RolloutPaused,
    /// A pass failed: the error's category (`RenderError` …).
    Failed(&'static str),
}

/// The reason of `Reconciling=True` while a pass that failed transiently is retried (the
/// fluxcd/pkg `runtime/conditions` convention).
pub const PROGRESSING_WITH_RETRY: &str = "ProgressingWithRetry";

impl Reason {
    /// The CamelCase string written to the conditions and the Event.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::HookRunning => "HookRunning",
            Self::Progressing => "Progressing",
            Self::Ready => "Ready",
            Self::PruneRefused => "PruneRefused",
            Self::Deleting => "Deleting",
            Self::Deleted => "Deleted",
            Self::Orphaned => "Orphaned",
            Self::ReadinessTimeout => "ReadinessTimeout",
            Self::ObjectFailed => "ObjectFailed",
            Self::DependencyNotReady => "DependencyNotReady",
            Self::DependentsExist => "DependentsExist",
            Self::DeletionRateLimited => "DeletionRateLimited",
            Self::RolloutWaiting => "RolloutWaiting",
            Self::RolloutPaused => "RolloutPaused",
            Self::Failed(category) => category,
        }
    }
}

/// The operation recorded in `lastOperation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Nothing was applied before.
    Install,
    /// Objects were applied before.
    Upgrade,
    /// The Manifest is being deleted.
    Delete,
}

impl Operation {
    /// The string written to `lastOperation.operation`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Install => "Install",
            Self::Upgrade => "Upgrade",
            Self::Delete => "Delete",
        }
    }
}

impl From<HookOperation> for Operation {
    fn from(operation: HookOperation) -> Self {
        match operation {
            HookOperation::Install => Self::Install,
            HookOperation::Upgrade => Self::Upgrade,
            HookOperation::Delete => Self::Delete,
        }
    }
}

/// The operation of a pass that failed before it knew its hook run, from the status it started
/// from: `Delete` while deleting; the recorded hook run's while it is not done (an install
/// whose inventory was recorded, then the replica stopped, its status was left to a look, or
/// its rollout is still awaited, is still an install); else `Install` when nothing was applied
/// yet, `Upgrade` after.
pub fn operation_of(status: Option<&ManifestStatus>, deleting: bool) -> Operation {
    let unfinished_run = status
        .and_then(|s| s.hook_run.as_ref())
        .filter(|run| run.phase != HookRunPhase::Done);
    match (deleting, unfinished_run) {
        (true, _) => Operation::Delete,
        (false, Some(run)) if run.operation != HookOperation::Delete => run.operation.into(),
        _ if status.is_none_or(|s| s.inventory.is_empty()) => Operation::Install,
        _ => Operation::Upgrade,
    }
}

/// Facts a successful render/apply contributes to the status; `None` keeps the previous value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Facts {
    /// Chart digest.
    pub chart_digest: Option<String>,
    /// Rendered digest.
    pub rendered_digest: Option<String>,
    /// Values digest.
    pub values_digest: Option<String>,
    /// The generation whose render was applied; `None` keeps the previous value.
    pub applied_generation: Option<i64>,
    /// The inventory.
    pub inventory: Option<Vec<InventoryEntry>>,
    /// The UIDs of objects this pass created or took over, by [`ownership::uid_key`]; merged
    /// into `status.inventoryUids` (kept for objects still in the inventory).
    pub learned_uids: BTreeMap<String, String>,
    /// On a remote target, the stamps of the apply records held after this pass, by
    /// [`ownership::uid_key`] (`None`: applied with nothing to keep; [`super::applied_stamps`]);
    /// merged into `status.appliedStamps`.
    pub applied_stamps: BTreeMap<String, Option<String>>,
    /// The target cluster's identity, once read (`None` keeps the previous value).
    pub target_identity: Option<String>,
    /// The hook run's progress.
    pub hook_run: Option<HookRun>,
    /// The hook objects that may exist.
    pub hook_objects: Option<Vec<InventoryEntry>>,
    /// When the wait for the applied objects' readiness began: `Some(None)` clears it (they
    /// are ready), `None` keeps the previous value.
    pub readiness_started: Option<Option<Time>>,
    /// The `Drifted` condition this pass leaves (`spec.drift`); `None` keeps the previous one.
    pub drift: Option<DriftCondition>,
    /// A spread upgrade's start, scheduled by this pass; `None` keeps the previous one.
    pub upgrade_after: Option<ScheduledUpgrade>,
}

/// The `Drifted` condition: whether a drift pass found drift, why, and which objects and
/// fields (a bounded message, `plan::drift_report::message`).
#[derive(Clone, Debug, PartialEq)]
pub struct DriftCondition {
    /// `True` when drift was found.
    pub drifted: bool,
    /// `DriftDetected`, `DriftRepaired`, `NoDrift`, `Applied`, `DriftDisabled`.
    pub reason: &'static str,
    /// What differs, or why there is nothing to say.
    pub message: String,
}

impl DriftCondition {
    /// A `Drifted=False` condition.
    pub fn clear(reason: &'static str, message: &str) -> Self {
        Self {
            drifted: false,
            reason,
            message: message.to_owned(),
        }
    }
}

/// The status after a pass. Unchanged inputs give an equal status (so the caller can skip the
/// write): times are carried over unless the thing they time changed. The message is shortened
/// to [`MESSAGE_LIMIT`] bytes, keeping its beginning and its end.
pub fn next_status(
    previous: Option<&ManifestStatus>,
    generation: Option<i64>,
    outcome: &Outcome,
    facts: Facts,
    shard: Option<u32>,
    owner: &str,
    now: &Time,
) -> ManifestStatus {
    let previous = previous.cloned().unwrap_or_default();
    let message = shorten(&outcome.message, MESSAGE_LIMIT);
    let mut conditions = previous.conditions.clone();
    let set = |conditions: &mut Vec<Condition>, kind: &str, value: bool| {
        set_condition(
            conditions,
            kind,
            value,
            outcome.reason.as_str(),
            &message,
            generation,
            now,
        );
    };
    set(&mut conditions, "Ready", outcome.state == State::Ready);
    // kstatus reads only `Reconciling=True` (in progress) and `Stalled=True` (failed): a pass
    // that failed transiently is retried, so it is still in progress.
    let retrying = outcome.state == State::Error && !outcome.stalled;
    if retrying {
        set_condition(
            &mut conditions,
            "Reconciling",
            true,
            PROGRESSING_WITH_RETRY,
            &message,
            generation,
            now,
        );
    } else {
        set(
            &mut conditions,
            "Reconciling",
            matches!(outcome.state, State::Processing | State::Deleting),
        );
    }
    set(&mut conditions, "Stalled", outcome.stalled);
    if let Some(rendered) = outcome.rendered {
        set(&mut conditions, "Rendered", rendered);
    }
    if let Some(applied) = outcome.applied {
        set(&mut conditions, "Applied", applied);
    }
    set_drifted(&mut conditions, facts.drift.as_ref(), generation, now);

    let last_operation = last_operation(&previous, outcome, &message, now);

    let inventory = facts.inventory.unwrap_or(previous.inventory);
    ManifestStatus {
        state: Some(outcome.state),
        observed_generation: generation,
        conditions,
        chart_digest: facts.chart_digest.or(previous.chart_digest),
        rendered_digest: facts.rendered_digest.or(previous.rendered_digest),
        values_digest: facts.values_digest.or(previous.values_digest),
        applied_generation: facts.applied_generation.or(previous.applied_generation),
        inventory_uids: inventory_uids(previous.inventory_uids, facts.learned_uids, &inventory),
        applied_stamps: super::applied_stamps::next(
            previous.applied_stamps,
            facts.applied_stamps,
            &inventory,
        ),
        target_identity: facts.target_identity.or(previous.target_identity),
        inventory,
        shard: shard.or(previous.shard),
        owner: Some(owner.to_owned()),
        last_operation,
        history: previous.history,
        hook_run: facts.hook_run.or(previous.hook_run),
        hook_objects: facts.hook_objects.unwrap_or(previous.hook_objects),
        readiness_started: facts
            .readiness_started
            .unwrap_or(previous.readiness_started),
        last_handled_reconcile_at: previous.last_handled_reconcile_at,
        last_handled_reset_at: previous.last_handled_reset_at,
        upgrade_after: facts.upgrade_after.or(previous.upgrade_after),
    }
}

/// Sets the `Drifted` condition a pass leaves, if any. `Drifted=False` only replaces a
/// condition that is there: a module never found drifted has none, and its passes write no
/// status for it.
fn set_drifted(
    conditions: &mut Vec<Condition>,
    drift: Option<&DriftCondition>,
    generation: Option<i64>,
    now: &Time,
) {
    let drift =
        drift.filter(|drift| drift.drifted || conditions.iter().any(|c| c.type_ == "Drifted"));
    if let Some(drift) = drift {
        let message = shorten(&drift.message, MESSAGE_LIMIT);
        let (value, reason) = (drift.drifted, drift.reason);
        set_condition(
            conditions, "Drifted", value, reason, &message, generation, now,
        );
    }
}

/// The last operation: a new one when this pass performed one (and it or its message differs),
/// else the previous one.
fn last_operation(
    previous: &ManifestStatus,
    outcome: &Outcome,
    message: &str,
    now: &Time,
) -> Option<LastOperation> {
    match outcome.operation {
        Some(operation) => {
            let operation = operation.as_str();
            let same = previous
                .last_operation
                .as_ref()
                .is_some_and(|last| last.operation == operation && last.message == message);
            if same {
                previous.last_operation.clone()
            } else {
                Some(LastOperation {
                    operation: operation.to_owned(),
                    time: now.clone(),
                    message: message.to_owned(),
                })
            }
        }
        None => previous.last_operation.clone(),
    }
}

/// The recorded UIDs with the ones a pass learned, of the objects `inventory` still holds.
fn inventory_uids(
    mut recorded: BTreeMap<String, String>,
    learned: BTreeMap<String, String>,
    inventory: &[InventoryEntry],
) -> BTreeMap<String, String> {
    recorded.extend(learned);
    let held: std::collections::HashSet<String> =
        inventory.iter().map(ownership::uid_key).collect();
    recorded.retain(|key, _| held.contains(key));
    recorded
}

/// Whether writing `next` over `previous` (for `outcome`) publishes an Event: when the state
/// changes, or a problem's message does (`ready_message`: the `Ready` condition's). Not on
/// entering the rollout wait (`Processing`, reason `Progressing`): an install or upgrade whose
/// objects roll out announces itself when the wait ends (`Ready`, or the error), not also when
/// it begins — each Event is an API write (issue 14's budget). Hooks and dependency waits,
/// other reasons of `Processing`, still publish theirs.
pub fn publishes_event(
    previous: Option<&ManifestStatus>,
    next: &ManifestStatus,
    outcome: &Outcome,
) -> bool {
    let problem = matches!(outcome.state, State::Error | State::Warning);
    let state_changed = previous.and_then(|s| s.state) != next.state;
    if state_changed && outcome.state == State::Processing && outcome.reason == Reason::Progressing
    {
        return false;
    }
    state_changed || (problem && previous.and_then(ready_message) != ready_message(next))
}

/// Whether `status` shows objects rolling out: `Processing`, `Ready` reason `Progressing`.
pub fn rolling_out(status: Option<&ManifestStatus>) -> bool {
    status.is_some_and(|status| {
        status.state == Some(State::Processing)
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == Reason::Progressing.as_str())
    })
}

/// The `Ready` condition's message, if the status has that condition.
pub fn ready_message(status: &ManifestStatus) -> Option<String> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.message.clone())
}

/// The JSON merge patch (RFC 7386) that turns the status `previous` into `next`: `next` whole,
/// plus `null` for every map key `previous` has and `next` lacks (a pruned object's
/// `inventoryUids` entry, a field `next` leaves out) — a merge patch keeps any key it does not
/// name, so without them removed keys would stay stored for good.
pub fn status_patch(previous: Option<&ManifestStatus>, next: &ManifestStatus) -> serde_json::Value {
    let next = serde_json::to_value(next).unwrap_or(serde_json::Value::Null);
    match previous.and_then(|p| serde_json::to_value(p).ok()) {
        Some(previous) => with_removals(&previous, next),
        None => next,
    }
}

/// `next` with `null` for each key of `previous`'s maps that `next` lacks, at any depth of
/// maps present in both (lists are replaced whole by a merge patch).
fn with_removals(previous: &serde_json::Value, next: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    let (Value::Object(previous), Value::Object(mut next)) = (previous, next.clone()) else {
        return next;
    };
    for (key, old) in previous {
        match next.remove(key) {
            None => {
                next.insert(key.clone(), Value::Null);
            }
            Some(new) => {
                next.insert(key.clone(), with_removals(old, new));
            }
        }
    }
    Value::Object(next)
}

/// Sets a condition, keeping its `lastTransitionTime` unless its status flips.
fn set_condition(
    conditions: &mut Vec<Condition>,
    kind: &str,
    value: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = if value { "True" } else { "False" }.to_owned();
    let transition = match conditions.iter().find(|c| c.type_ == kind) {
        Some(existing) if existing.status == status => existing.last_transition_time.clone(),
        _ => now.clone(),
    };
    let condition = Condition {
        type_: kind.to_owned(),
        status,
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time: transition,
    };
    match conditions.iter_mut().find(|c| c.type_ == kind) {
        Some(existing) => *existing = condition,
        None => conditions.push(condition),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_status_patch_removes_what_the_next_status_no_longer_has() {
        use crate::api::ManifestStatus;
        let previous = ManifestStatus {
            inventory_uids: [("ConfigMap/ns/a", "u1"), ("ConfigMap/ns/b", "u2")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            target_identity: Some("cluster".into()),
            ..Default::default()
        };
        let mut next = previous.clone();
        next.inventory_uids.remove("ConfigMap/ns/b");
        let patch = super::status_patch(Some(&previous), &next);
        assert_eq!(patch["inventoryUids"]["ConfigMap/ns/a"], "u1");
        assert!(patch["inventoryUids"]["ConfigMap/ns/b"].is_null());
        assert!(
            patch["inventoryUids"]
                .as_object()
                .unwrap()
                .contains_key("ConfigMap/ns/b"),
            "the removed key is named, with null"
        );
        // The last entry gone: the field (left out by serde) is removed as a whole.
        next.inventory_uids.clear();
        let patch = super::status_patch(Some(&previous), &next);
        assert!(patch.as_object().unwrap()["inventoryUids"].is_null());
        assert_eq!(patch["targetIdentity"], "cluster");
        // No previous status: the next one as it is.
        let first = super::status_patch(None, &previous);
        assert_eq!(first, serde_json::to_value(&previous).unwrap());
    }

    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn uids_learned_replace_recorded_ones_and_leave_with_their_objects() {
        let entry = |name: &str| crate::plan::tests::id("ConfigMap", "ns", name);
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            let key = |name: &str| ownership::uid_key(&entry(name));
            pairs
                .iter()
                .map(|(n, u)| (key(n), (*u).to_owned()))
                .collect()
        };
        let recorded = map(&[("kept", "u1"), ("recreated", "u2"), ("pruned", "u3")]);
        let learned = map(&[("recreated", "u4"), ("new", "u5")]);
        let inventory = [entry("kept"), entry("recreated"), entry("new")];
        assert_eq!(
            inventory_uids(recorded, learned, &inventory),
            map(&[("kept", "u1"), ("recreated", "u4"), ("new", "u5")])
        );
    }

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn ready() -> Outcome {
        Outcome {
            state: State::Ready,
            reason: Reason::Ready,
            message: "all 2 objects are ready".into(),
            rendered: Some(true),
            applied: Some(true),
            stalled: false,
            operation: Some(Operation::Install),
        }
    }

    fn deployment(name: &str) -> InventoryEntry {
        InventoryEntry {
            name: name.into(),
            ..crate::plan::test_object("apps", "Deployment")
        }
    }

    /// The status of a new Manifest after its claim and the inventory record of its install
    /// (with the hook run): what a pass that crashed after the applies left.
    fn recorded() -> ManifestStatus {
        let run = HookRun {
            operation: crate::api::HookOperation::Install,
            inputs_digest: "sha256:i".into(),
            generation: Some(1),
            id: "run-1".into(),
            phase: crate::api::HookRunPhase::Objects,
            completed: Vec::new(),
            running: None,
            message: None,
        };
        ManifestStatus {
            inventory: vec![deployment("web")],
            hook_run: Some(run),
            ..Default::default()
        }
    }

    #[test]
    fn a_failed_pass_reports_the_recorded_run_until_a_pass_finishes() {
        let recorded = &recorded();
        assert_eq!(operation_of(None, false), Operation::Install);
        assert_eq!(operation_of(None, true), Operation::Delete);
        // The inventory and the install run recorded, no pass finished (a crash): still the
        // install.
        assert_eq!(operation_of(Some(recorded), false), Operation::Install);
        assert_eq!(operation_of(Some(recorded), true), Operation::Delete);
        // Rolling out (`Processing` written): the run is not done, still the install.
        let rolling = ManifestStatus {
            state: Some(State::Processing),
            ..recorded.clone()
        };
        assert_eq!(operation_of(Some(&rolling), false), Operation::Install);
        // After the run is done the recorded objects make it an upgrade.
        let mut finished = ManifestStatus {
            state: Some(State::Ready),
            ..recorded.clone()
        };
        if let Some(run) = finished.hook_run.as_mut() {
            run.phase = HookRunPhase::Done;
        }
        assert_eq!(operation_of(Some(&finished), false), Operation::Upgrade);
        let without_run = ManifestStatus {
            hook_run: None,
            ..recorded.clone()
        };
        assert_eq!(operation_of(Some(&without_run), false), Operation::Upgrade);
    }

    #[test]
    fn an_operation_publishes_one_event_when_it_ends_not_when_its_rollout_wait_begins() {
        let status_of = |previous: Option<&ManifestStatus>, outcome: &Outcome, time: i64| {
            next_status(
                previous,
                Some(1),
                outcome,
                Facts::default(),
                None,
                "r0",
                &at(time),
            )
        };
        let rolling_out = Outcome {
            state: State::Processing,
            reason: Reason::Progressing,
            message: "waiting for Deployment ns/web".into(),
            ..ready()
        };
        let failing = |message: &str| Outcome {
            state: State::Error,
            reason: Reason::Failed("ApplyError"),
            message: message.into(),
            stalled: false,
            ..ready()
        };
        let waiting = status_of(None, &rolling_out, 100);
        assert!(
            !publishes_event(None, &waiting, &rolling_out),
            "the wait begins"
        );
        let done = status_of(Some(&waiting), &ready(), 110);
        assert!(publishes_event(Some(&waiting), &done, &ready()), "Ready");
        assert!(
            !publishes_event(Some(&done), &done, &ready()),
            "nothing new"
        );
        // Another wait of the same state with another message: still no Event.
        let later = Outcome {
            message: "waiting for Deployment ns/api".into(),
            ..rolling_out.clone()
        };
        let waiting_more = status_of(Some(&waiting), &later, 105);
        assert!(!publishes_event(Some(&waiting), &waiting_more, &later));
        // Problems: on entering, and when their message changes.
        let broken = status_of(Some(&done), &failing("no route"), 120);
        assert!(publishes_event(Some(&done), &broken, &failing("no route")));
        let same = status_of(Some(&broken), &failing("no route"), 130);
        assert!(!publishes_event(Some(&broken), &same, &failing("no route")));
        let other = status_of(Some(&broken), &failing("forbidden"), 140);
        assert!(publishes_event(
            Some(&broken),
            &other,
            &failing("forbidden")
        ));
        // Other Processing reasons (a dependency, a hook) still announce themselves.
        let blocked = Outcome {
            state: State::Processing,
            reason: Reason::DependencyNotReady,
            message: "waiting for ns/db".into(),
            ..ready()
        };
        let waiting_for_db = status_of(Some(&done), &blocked, 150);
        assert!(publishes_event(Some(&done), &waiting_for_db, &blocked));
    }

    #[test]
    fn the_drifted_condition_follows_a_drift_fact_and_stays_without_one() {
        let with = |previous: Option<&ManifestStatus>, drift, time| {
            let facts = Facts {
                drift,
                ..Facts::default()
            };
            next_status(previous, Some(1), &ready(), facts, None, "r0", &at(time))
        };
        let drifted = |status: &ManifestStatus| {
            let c = status.conditions.iter().find(|c| c.type_ == "Drifted");
            c.map(|c| {
                (
                    c.status.clone(),
                    c.reason.clone(),
                    c.last_transition_time.clone(),
                )
            })
        };
        let first = with(None, None, 100);
        assert_eq!(drifted(&first), None, "no drift pass yet: no condition");
        let nothing = with(
            Some(&first),
            Some(DriftCondition::clear("NoDrift", "none")),
            105,
        );
        assert_eq!(
            drifted(&nothing),
            None,
            "never drifted: no condition, no write"
        );
        let found = DriftCondition {
            drifted: true,
            reason: "DriftDetected",
            message: "1 object(s) differ".into(),
        };
        let second = with(Some(&first), Some(found), 110);
        assert_eq!(
            drifted(&second),
            Some(("True".into(), "DriftDetected".into(), at(110)))
        );
        // A pass that did not check (asked for, not Ready) keeps it as it was.
        let third = with(Some(&second), None, 120);
        assert_eq!(drifted(&third), drifted(&second));
        let clear = DriftCondition::clear("NoDrift", "none");
        let fourth = with(Some(&third), Some(clear), 130);
        assert_eq!(
            drifted(&fourth),
            Some(("False".into(), "NoDrift".into(), at(130)))
        );
    }

    #[test]
    fn an_unchanged_outcome_gives_an_equal_status() {
        let first = next_status(
            None,
            Some(1),
            &ready(),
            Facts::default(),
            Some(3),
            "r0",
            &at(100),
        );
        let second = next_status(
            Some(&first),
            Some(1),
            &ready(),
            Facts::default(),
            None,
            "r0",
            &at(200),
        );
        assert_eq!(first, second, "times do not move when nothing changed");
        let ready_condition = first
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready_condition.status, "True");
        assert_eq!(first.shard, Some(3));
        assert_eq!(first.last_operation.as_ref().unwrap().time, at(100));
    }

    #[test]
    fn transitions_move_only_the_flipped_conditions() {
        let first = next_status(
            None,
            Some(1),
            &ready(),
            Facts::default(),
            None,
            "r0",
            &at(100),
        );
        let failing = Outcome {
            state: State::Error,
            reason: Reason::Failed("RenderError"),
            message: "template: boom".into(),
            rendered: Some(false),
            applied: None,
            stalled: true,
            operation: Some(Operation::Upgrade),
        };
        let second = next_status(
            Some(&first),
            Some(2),
            &failing,
            Facts::default(),
            None,
            "r0",
            &at(200),
        );
        let by_type = |kind: &str| {
            second
                .conditions
                .iter()
                .find(|c| c.type_ == kind)
                .unwrap()
                .clone()
        };
        assert_eq!(
            (
                by_type("Ready").status.as_str(),
                by_type("Ready").last_transition_time.clone()
            ),
            ("False", at(200))
        );
        assert_eq!(
            by_type("Applied").status,
            "True",
            "not touched by a pass that did not apply"
        );
        assert_eq!(by_type("Applied").last_transition_time, at(100));
        assert_eq!(
            by_type("Reconciling").last_transition_time,
            at(100),
            "False before and after"
        );
        assert_eq!(by_type("Stalled").status, "True");
        assert_eq!(second.observed_generation, Some(2));
        assert_eq!(second.last_operation.unwrap().operation, "Upgrade");
    }

    #[test]
    fn reasons_and_operations_are_the_strings_written_to_the_status() {
        let reasons = [
            (Reason::HookRunning, "HookRunning"),
            (Reason::Progressing, "Progressing"),
            (Reason::Ready, "Ready"),
            (Reason::PruneRefused, "PruneRefused"),
            (Reason::Deleting, "Deleting"),
            (Reason::Deleted, "Deleted"),
            (Reason::Orphaned, "Orphaned"),
            (Reason::DependencyNotReady, "DependencyNotReady"),
            (Reason::DependentsExist, "DependentsExist"),
            (Reason::DeletionRateLimited, "DeletionRateLimited"),
            (Reason::RolloutWaiting, "RolloutWaiting"),
            (Reason::RolloutPaused, "RolloutPaused"),
            (Reason::Failed("ApplyError"), "ApplyError"),
        ];
        for (reason, text) in reasons {
            assert_eq!(reason.as_str(), text);
        }
        assert_eq!(Operation::from(HookOperation::Install).as_str(), "Install");
        assert_eq!(Operation::from(HookOperation::Upgrade).as_str(), "Upgrade");
        assert_eq!(Operation::from(HookOperation::Delete).as_str(), "Delete");
    }

    #[test]
    fn a_long_message_is_shortened_keeping_its_cause_and_stays_equal() {
        let failing = Outcome {
            state: State::Error,
            reason: Reason::Failed("RenderError"),
            message: format!("template: x.yaml:{}the cause", " nested:".repeat(20_000)),
            rendered: Some(false),
            applied: None,
            stalled: true,
            operation: Some(Operation::Install),
        };
        let first = next_status(
            None,
            Some(1),
            &failing,
            Facts::default(),
            None,
            "r0",
            &at(1),
        );
        let second = next_status(
            Some(&first),
            Some(1),
            &failing,
            Facts::default(),
            None,
            "r0",
            &at(2),
        );
        assert_eq!(
            first, second,
            "a shortened message compares equal on the next pass"
        );
        for condition in &first.conditions {
            assert!(
                condition.message.len() <= MESSAGE_LIMIT,
                "{}",
                condition.type_
            );
            assert!(condition.message.starts_with("template: x.yaml:"));
            assert!(
                condition.message.ends_with("the cause"),
                "{}",
                condition.type_
            );
        }
        let last = first.last_operation.unwrap();
        assert!(last.message.len() <= MESSAGE_LIMIT && last.message.ends_with("the cause"));
    }

    #[test]
    fn facts_replace_and_absent_facts_keep() {
        let entry = InventoryEntry {
            group: "".into(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: "a".into(),
            name: "b".into(),
        };
        let facts = Facts {
            chart_digest: Some("sha256:1".into()),
            inventory: Some(vec![entry.clone()]),
            ..Default::default()
        };
        let first = next_status(None, Some(1), &ready(), facts, None, "r0", &at(100));
        let second = next_status(
            Some(&first),
            Some(1),
            &ready(),
            Facts::default(),
            None,
            "r1",
            &at(100),
        );
        assert_eq!(second.chart_digest.as_deref(), Some("sha256:1"));
        assert_eq!(second.inventory, [entry]);
        assert_eq!(second.owner.as_deref(), Some("r1"));
    }
}
