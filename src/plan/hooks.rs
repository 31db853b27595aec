//! Hooks (pure): Helm hooks as migration steps. Which run a pass works on (and whether it is an
//! install, an upgrade or a deletion), which hooks a phase runs and in which order, what state a
//! hook object is in, and what a phase does next. `reconcile.rs` carries the steps out.
//!
//! A run's progress lives in `status.hookRun`, so a pass never blocks on a hook: it applies the
//! next hook, looks at it, records where it is and requeues while a Job runs; the next pass
//! continues from there.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use crate::api::{HookOperation, HookRun, HookRunPhase, InventoryEntry};
use crate::plan::{DeletePolicy, Hook, HookEvent, describe};

/// How long a hook may run when its `modulemanager.io/hook-timeout` does not say.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(300);

/// The inputs an install or upgrade run belongs to: the chart, the values, the release name and
/// the target namespace — not the render itself, so that neither `--is-upgrade` nor a template
/// that renders differently each time (`randAlphaNum` after a restart emptied the render cache)
/// nor a changed cluster capability runs the hooks again.
pub fn inputs_digest(
    chart_digest: &str,
    values_digest: &str,
    release: &str,
    namespace: &str,
) -> String {
    crate::render::sha256(
        json!([chart_digest, values_digest, release, namespace])
            .to_string()
            .as_bytes(),
    )
}

/// The annotation stamped on every hook object a run applies: `<event>/<run id>`.
pub const RUN_ANNOTATION: &str = "modulemanager.io/hook-run";

/// The stamp of the hook objects `run` applies for `event` (the event tells a hook that runs
/// both before and after the objects of one run apart).
pub fn stamp(run: &HookRun, event: HookEvent) -> String {
    format!("{}/{}", event.as_str(), run.id)
}

/// A run's id: its operation, inputs digest and starting generation, chained to the previous
/// run's id — so that going back to earlier inputs (a values ConfigMap edited back, at the same
/// generation) is a new run, while a pass that recomputes the same new run after its first pass
/// failed to record it finds the same id.
pub fn run_id(
    operation: HookOperation,
    inputs_digest: &str,
    generation: Option<i64>,
    previous: Option<&str>,
) -> String {
    let hash = crate::render::sha256(
        json!([
            format!("{operation:?}"),
            inputs_digest,
            generation,
            previous
        ])
        .to_string()
        .as_bytes(),
    );
    let hex = hash.trim_start_matches("sha256:");
    hex[..hex.len().min(16)].to_owned()
}

/// Whether the module counts as installed for a new run (an upgrade, not an install): once an
/// install run got past its objects (`PostHooks`, `Done`), or an upgrade run was started. A
/// run that failed says no more where it stopped: then, as before hook runs were recorded
/// (no previous run), objects in the inventory count.
pub fn installed(previous: Option<&HookRun>, inventory_empty: bool) -> bool {
    match previous {
        Some(run) => match (run.operation, run.phase) {
            (HookOperation::Upgrade, _) => true,
            (HookOperation::Install, HookRunPhase::PostHooks | HookRunPhase::Done) => true,
            (HookOperation::Install, HookRunPhase::Failed) | (HookOperation::Delete, _) => {
                !inventory_empty
            }
            (HookOperation::Install, _) => false,
        },
        None => !inventory_empty,
    }
}

/// The run a pass works on. The previous run continues when it is of the same kind (deleting
/// or not) and belongs to the same inputs — unless it failed at another generation: a failed
/// run is retried only when the spec changes after the failure (or the inputs do). Otherwise a
/// new run starts: a deletion; an install when nothing was installed yet (`installed`, see
/// [`installed`]); else an upgrade.
pub fn current_run(
    previous: Option<&HookRun>,
    deleting: bool,
    inputs_digest: &str,
    generation: Option<i64>,
    installed: bool,
) -> HookRun {
    let same_kind = |run: &HookRun| (run.operation == HookOperation::Delete) == deleting;
    if let Some(run) = previous
        && same_kind(run)
        && run.inputs_digest == inputs_digest
        && !(run.phase == HookRunPhase::Failed && run.generation != generation)
    {
        let mut run = run.clone();
        if run.id.is_empty() {
            // A run recorded before runs had ids: one derived from what it recorded.
            run.id = run_id(run.operation, &run.inputs_digest, run.generation, None);
        }
        return run;
    }
    let operation = if deleting {
        HookOperation::Delete
    } else if installed {
        HookOperation::Upgrade
    } else {
        HookOperation::Install
    };
    new_run(
        operation,
        inputs_digest,
        generation,
        previous.map(|p| p.id.as_str()),
    )
}

/// A run that starts now with its `pre-*` hooks, its id chained to the previous run's.
fn new_run(
    operation: HookOperation,
    inputs_digest: &str,
    generation: Option<i64>,
    previous: Option<&str>,
) -> HookRun {
    HookRun {
        id: run_id(operation, inputs_digest, generation, previous),
        operation,
        inputs_digest: inputs_digest.to_owned(),
        generation,
        phase: HookRunPhase::PreHooks,
        completed: Vec::new(),
        running: None,
        message: None,
    }
}

/// A failed run started again by a reset (`reconcile.modulemanager.io/resetAt`): a new run for
/// the same inputs, from its `pre-*` hooks, whose id is chained to the failed one's (so its hook
/// objects carry a new stamp: the failed instances are replaced or refused by their delete
/// policy, never adopted). A deletion stays a deletion; otherwise an upgrade once the module
/// counts as installed ([`installed`]), else an install. `None` when `run` has not failed.
pub fn restart(run: &HookRun, generation: Option<i64>, inventory_empty: bool) -> Option<HookRun> {
    if run.phase != HookRunPhase::Failed {
        return None;
    }
    let operation = match run.operation {
        HookOperation::Delete => HookOperation::Delete,
        _ if installed(Some(run), inventory_empty) => HookOperation::Upgrade,
        _ => HookOperation::Install,
    };
    Some(new_run(
        operation,
        &run.inputs_digest,
        generation,
        Some(&run.id),
    ))
}

/// The event a phase of an operation runs; `None` for the phases that run no hooks.
pub fn event(operation: HookOperation, phase: HookRunPhase) -> Option<HookEvent> {
    use HookOperation::*;
    use HookRunPhase::*;
    Some(match (operation, phase) {
        (Install, PreHooks) => HookEvent::PreInstall,
        (Install, PostHooks) => HookEvent::PostInstall,
        (Upgrade, PreHooks) => HookEvent::PreUpgrade,
        (Upgrade, PostHooks) => HookEvent::PostUpgrade,
        (Delete, PreHooks) => HookEvent::PreDelete,
        (Delete, PostHooks) => HookEvent::PostDelete,
        (_, Objects | Done | Failed) => return None,
    })
}

/// Moves a run to its next phase (`PreHooks` → `Objects` → `PostHooks` → `Done`), forgetting
/// the completed hooks of the phase it leaves.
pub fn advance(run: &mut HookRun) {
    run.phase = match run.phase {
        HookRunPhase::PreHooks => HookRunPhase::Objects,
        HookRunPhase::Objects => HookRunPhase::PostHooks,
        HookRunPhase::PostHooks | HookRunPhase::Done => HookRunPhase::Done,
        HookRunPhase::Failed => HookRunPhase::Failed,
    };
    run.completed.clear();
    run.running = None;
}

/// Marks a run failed at `generation` (it is retried once the generation differs from it).
pub fn fail(run: &mut HookRun, message: &str, generation: Option<i64>) {
    run.phase = HookRunPhase::Failed;
    run.generation = generation;
    run.running = None;
    run.message = Some(message.to_owned());
}

/// The hooks that run on `event`, in the plan's (Helm's) order: weight, kind, name.
pub fn hooks_for(hooks: &[Hook], event: HookEvent) -> Vec<Hook> {
    hooks.iter().filter(|h| h.runs_on(event)).cloned().collect()
}

/// Kinds that run to completion: a hook of one of them is waited for; any other kind is done
/// once applied (as Helm's `WatchUntilReady` does for hooks).
pub fn runs_to_completion(id: &InventoryEntry) -> bool {
    matches!(
        (id.group.as_str(), id.kind.as_str()),
        ("batch", "Job") | ("", "Pod")
    )
}

/// What a hook object's state is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookState {
    /// Still running; what is awaited.
    Running(String),
    /// Done.
    Succeeded,
    /// Failed for good; why.
    Failed(String),
}

/// The state of a hook object as the server returned it: a Job is done when `Complete` and
/// failed when `Failed`; a Pod when `Succeeded` or `Failed`; anything else once applied.
pub fn hook_state(id: &InventoryEntry, object: &Value) -> HookState {
    let condition = |kind: &str| {
        object
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| {
                c.iter()
                    .find(|c| c["type"] == kind && c["status"] == "True")
            })
    };
    match (id.group.as_str(), id.kind.as_str()) {
        ("batch", "Job") => {
            if let Some(failed) = condition("Failed") {
                let why = [failed["reason"].as_str(), failed["message"].as_str()]
                    .into_iter()
                    .flatten()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(": ");
                HookState::Failed(format!("Job {} failed: {why}", id.name))
            } else if condition("Complete").is_some() {
                HookState::Succeeded
            } else {
                HookState::Running(format!("Job {} is not complete", id.name))
            }
        }
        ("", "Pod") => match object.pointer("/status/phase").and_then(Value::as_str) {
            Some("Succeeded") => HookState::Succeeded,
            Some("Failed") => {
                let why = object
                    .pointer("/status/message")
                    .or_else(|| object.pointer("/status/reason"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                HookState::Failed(format!("Pod {} failed: {why}", id.name))
            }
            phase => {
                HookState::Running(format!("Pod {} is {}", id.name, phase.unwrap_or("Pending")))
            }
        },
        _ => HookState::Succeeded,
    }
}

/// Whether a hook started at `started` has run longer than `timeout` at `now`.
pub fn timed_out(started: &Time, timeout: Duration, now: &Time) -> bool {
    let elapsed = now.0.as_millisecond() - started.0.as_millisecond();
    u128::try_from(elapsed).is_ok_and(|ms| ms >= timeout.as_millis())
}

/// What a phase does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Step<'a> {
    /// Start this hook: delete its previous instance if its policy says so, apply it.
    Start(&'a Hook),
    /// Look at this hook: it is the run's running one.
    Watch(&'a Hook),
    /// Every hook of the phase succeeded: delete these (`hook-succeeded`), in this order (the
    /// reverse of the run order, as Helm does), then move on.
    Finish(Vec<&'a Hook>),
}

/// The next step of the phase whose hooks are `hooks` (in run order): the first hook not
/// completed yet is watched when it is the running one, else started; once all completed, the
/// phase finishes.
pub fn next_step<'a>(hooks: &'a [Hook], run: &HookRun) -> Step<'a> {
    match hooks.iter().find(|h| !run.completed.contains(&h.object.id)) {
        Some(hook) => match &run.running {
            Some(running) if running.object == hook.object.id => Step::Watch(hook),
            _ => Step::Start(hook),
        },
        None => Step::Finish(
            hooks
                .iter()
                .rev()
                .filter(|h| deletable(h) && h.has_policy(DeletePolicy::HookSucceeded))
                .collect(),
        ),
    }
}

/// What to do with a hook that is about to start and already exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Existing {
    /// It was applied by this very run (its stamp says so) in a pass that could not record
    /// it: it is the running (or finished) hook, neither deleted nor applied again.
    Adopt,
    /// Delete it and wait until it is gone, then apply (`before-hook-creation`).
    Replace,
    /// Apply over it (a kind that does not run to completion: updated in place).
    Update,
    /// Refuse: a Job or Pod cannot run again in place; the message says what to do.
    Refuse(String),
}

/// Decides about an existing instance of a hook that is about to start; `this_run`: it carries
/// this run's stamp for this event and is not being deleted.
pub fn existing(hook: &Hook, this_run: bool) -> Existing {
    if this_run {
        Existing::Adopt
    } else if deletable(hook) && hook.has_policy(DeletePolicy::BeforeHookCreation) {
        Existing::Replace
    } else if runs_to_completion(&hook.object.id) {
        Existing::Refuse(format!(
            "{} exists from an earlier run and its helm.sh/hook-delete-policy lacks before-hook-creation; delete it to run the hook again",
            describe(&hook.object.id)
        ))
    } else {
        Existing::Update
    }
}

/// Whether a failed hook is deleted (`hook-failed`).
pub fn delete_on_failure(hook: &Hook) -> bool {
    deletable(hook) && hook.has_policy(DeletePolicy::HookFailed)
}

/// Hook CRDs are never deleted by a policy (deleting one deletes every custom resource of its
/// kind; Helm never does either).
fn deletable(hook: &Hook) -> bool {
    !(hook.object.id.kind == "CustomResourceDefinition"
        && hook.object.id.group == "apiextensions.k8s.io")
}

/// The timeout of a hook: its annotation, else the default.
pub fn timeout(hook: &Hook, default: Duration) -> Duration {
    hook.timeout.unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RunningHook;
    use crate::plan::{parse_documents, plan};
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    const CHART: &str = r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: migrate
  annotations: {helm.sh/hook: "pre-upgrade", helm.sh/hook-weight: "5", helm.sh/hook-delete-policy: "before-hook-creation,hook-succeeded"}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: seed
  annotations: {helm.sh/hook: "pre-install,pre-upgrade", helm.sh/hook-weight: "-1"}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: backup
  annotations: {helm.sh/hook: "pre-upgrade", helm.sh/hook-delete-policy: hook-failed}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: smoke
  annotations: {helm.sh/hook: "post-install,post-upgrade", helm.sh/hook-delete-policy: hook-succeeded}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: drain
  annotations: {helm.sh/hook: pre-delete}
"#;

    fn hooks() -> Vec<Hook> {
        plan(parse_documents(CHART).unwrap()).unwrap().hooks
    }

    fn names(hooks: &[Hook]) -> Vec<&str> {
        hooks.iter().map(|h| h.object.id.name.as_str()).collect()
    }

    fn run(operation: HookOperation, phase: HookRunPhase) -> HookRun {
        HookRun {
            id: "r1".into(),
            operation,
            inputs_digest: "sha256:a".into(),
            generation: Some(1),
            phase,
            completed: vec![],
            running: None,
            message: None,
        }
    }

    #[test]
    fn a_new_run_is_an_install_until_something_was_applied() {
        let install = current_run(None, false, "sha256:a", Some(1), false);
        assert_eq!(install.operation, HookOperation::Install);
        assert_eq!(install.phase, HookRunPhase::PreHooks);
        let upgrade = current_run(None, false, "sha256:a", Some(1), true);
        assert_eq!(upgrade.operation, HookOperation::Upgrade);
        let delete = current_run(Some(&upgrade), true, "", Some(1), true);
        assert_eq!(delete.operation, HookOperation::Delete);
    }

    #[test]
    fn a_run_continues_for_the_same_inputs_and_restarts_for_new_ones() {
        // An install that got as far as its objects: the next pass continues it, even though
        // the inventory is no longer empty (it stays an install: post-install hooks follow).
        let mut install = run(HookOperation::Install, HookRunPhase::Objects);
        install.completed = vec![];
        assert_eq!(
            current_run(Some(&install), false, "sha256:a", Some(2), true),
            install,
            "a spec change that leaves the inputs alone does not restart a run"
        );
        let next = current_run(Some(&install), false, "sha256:b", Some(2), true);
        assert_eq!(
            (next.operation, next.phase, next.inputs_digest.as_str()),
            (HookOperation::Upgrade, HookRunPhase::PreHooks, "sha256:b")
        );
        // A failed run stays failed for its generation, and is retried at a new one.
        let mut failed = run(HookOperation::Upgrade, HookRunPhase::Failed);
        failed.message = Some("Job migrate failed".into());
        assert_eq!(
            current_run(Some(&failed), false, "sha256:a", Some(1), true),
            failed
        );
        let retry = current_run(Some(&failed), false, "sha256:a", Some(2), true);
        assert_eq!(retry.phase, HookRunPhase::PreHooks);
        assert_eq!(retry.generation, Some(2));
        // A deletion never continues an install run, and continues its own.
        let delete = current_run(Some(&install), true, "", Some(2), true);
        assert_eq!(delete.operation, HookOperation::Delete);
        let mut deleting = delete.clone();
        deleting.phase = HookRunPhase::PostHooks;
        assert_eq!(
            current_run(Some(&deleting), true, "", Some(2), true),
            deleting
        );
    }

    #[test]
    fn a_reset_starts_a_failed_run_again_for_the_same_inputs() {
        let mut failed = run(HookOperation::Upgrade, HookRunPhase::Failed);
        failed.message = Some("Job migrate failed".into());
        failed.completed = vec![];
        let again = restart(&failed, Some(1), false).expect("a failed run restarts");
        assert_eq!(
            (again.operation, again.phase, again.generation),
            (HookOperation::Upgrade, HookRunPhase::PreHooks, Some(1))
        );
        assert_eq!(again.inputs_digest, failed.inputs_digest);
        assert_eq!(again.message, None);
        assert_ne!(
            again.id, failed.id,
            "a new stamp: the failed Job is not adopted"
        );
        assert_eq!(
            restart(&failed, Some(1), false),
            Some(again.clone()),
            "the same reset gives the same run (a pass that repeats it adopts its hooks)"
        );
        // The pass then continues the restarted run, at the same generation.
        assert_eq!(
            current_run(Some(&again), false, "sha256:a", Some(1), true),
            again
        );
        // An install that failed before its objects stays an install; a deletion a deletion.
        let install = run(HookOperation::Install, HookRunPhase::Failed);
        let reinstall = restart(&install, Some(1), true).unwrap();
        assert_eq!(reinstall.operation, HookOperation::Install);
        let delete = run(HookOperation::Delete, HookRunPhase::Failed);
        assert_eq!(
            restart(&delete, Some(1), false).unwrap().operation,
            HookOperation::Delete
        );
        // Only a failed run restarts: a running or finished one is left alone.
        for phase in [
            HookRunPhase::PreHooks,
            HookRunPhase::Objects,
            HookRunPhase::PostHooks,
            HookRunPhase::Done,
        ] {
            assert_eq!(
                restart(&run(HookOperation::Upgrade, phase), Some(1), false),
                None
            );
        }
    }

    #[test]
    fn phases_select_the_hooks_of_their_operation_in_weight_order() {
        let hooks = hooks();
        let of = |op, phase| event(op, phase).map(|e| hooks_for(&hooks, e));
        use HookOperation::*;
        use HookRunPhase::*;
        assert_eq!(names(&of(Install, PreHooks).unwrap()), ["seed"]);
        assert_eq!(
            names(&of(Upgrade, PreHooks).unwrap()),
            ["seed", "backup", "migrate"],
            "weight -1, then 0, then 5"
        );
        assert_eq!(names(&of(Install, PostHooks).unwrap()), ["smoke"]);
        assert_eq!(names(&of(Upgrade, PostHooks).unwrap()), ["smoke"]);
        assert_eq!(names(&of(Delete, PreHooks).unwrap()), ["drain"]);
        assert!(of(Delete, PostHooks).unwrap().is_empty());
        assert_eq!(of(Upgrade, Objects), None);
        assert_eq!(of(Install, Done), None);
    }

    #[test]
    fn a_phase_starts_watches_and_finishes_its_hooks_one_at_a_time() {
        let phase = hooks_for(&hooks(), HookEvent::PreUpgrade);
        let mut run = run(HookOperation::Upgrade, HookRunPhase::PreHooks);
        assert_eq!(next_step(&phase, &run), Step::Start(&phase[0]));
        run.completed.push(phase[0].object.id.clone());
        assert_eq!(next_step(&phase, &run), Step::Start(&phase[1]));
        let running = RunningHook {
            object: phase[1].object.id.clone(),
            uid: "u1".into(),
            started: at(100),
        };
        run.running = Some(running);
        assert_eq!(next_step(&phase, &run), Step::Watch(&phase[1]));
        run.completed.push(phase[1].object.id.clone());
        run.running = None;
        run.completed.push(phase[2].object.id.clone());
        // Only `migrate` asked for hook-succeeded; `backup` has hook-failed, `seed` the default.
        assert_eq!(next_step(&phase, &run), Step::Finish(vec![&phase[2]]));

        advance(&mut run);
        assert_eq!(run.phase, HookRunPhase::Objects);
        assert!(run.completed.is_empty());
        advance(&mut run);
        advance(&mut run);
        assert_eq!(run.phase, HookRunPhase::Done);
        fail(&mut run, "boom", Some(1));
        advance(&mut run);
        assert_eq!(run.phase, HookRunPhase::Failed, "a failed run stays failed");
    }

    #[test]
    fn succeeded_hooks_are_deleted_in_reverse_order() {
        let two = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: a, annotations: {helm.sh/hook: post-install, helm.sh/hook-delete-policy: hook-succeeded, helm.sh/hook-weight: "1"}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: b, annotations: {helm.sh/hook: post-install, helm.sh/hook-delete-policy: hook-succeeded, helm.sh/hook-weight: "2"}}
"#;
        let hooks = plan(parse_documents(two).unwrap()).unwrap().hooks;
        let mut run = run(HookOperation::Install, HookRunPhase::PostHooks);
        run.completed = hooks.iter().map(|h| h.object.id.clone()).collect();
        let Step::Finish(delete) = next_step(&hooks, &run) else {
            panic!("not finished")
        };
        assert_eq!(
            delete
                .iter()
                .map(|h| h.object.id.name.as_str())
                .collect::<Vec<_>>(),
            ["b", "a"]
        );
    }

    #[test]
    fn delete_policies_decide_about_earlier_instances_and_failures() {
        let hooks = hooks();
        let by_name = |n: &str| hooks.iter().find(|h| h.object.id.name == n).unwrap();
        assert_eq!(existing(by_name("migrate"), false), Existing::Replace);
        assert_eq!(
            existing(by_name("drain"), false),
            Existing::Replace,
            "no annotation: before-hook-creation"
        );
        assert!(
            matches!(existing(by_name("backup"), false), Existing::Refuse(m) if m.contains("Job/backup"))
        );
        let mut config_map = by_name("seed").clone();
        config_map.delete_policies = vec![DeletePolicy::HookSucceeded];
        assert_eq!(existing(&config_map, false), Existing::Update);
        for name in ["migrate", "drain", "backup", "seed"] {
            assert_eq!(
                existing(by_name(name), true),
                Existing::Adopt,
                "{name}: applied by this run: adopted, whatever the policy"
            );
        }
        assert!(delete_on_failure(by_name("backup")));
        assert!(!delete_on_failure(by_name("migrate")));
        let crd = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: a.b.c, annotations: {helm.sh/hook: pre-install, helm.sh/hook-delete-policy: "hook-succeeded,hook-failed"}}
"#;
        let crd = &plan(parse_documents(crd).unwrap()).unwrap().hooks;
        let mut run = run(HookOperation::Install, HookRunPhase::PreHooks);
        run.completed = vec![crd[0].object.id.clone()];
        assert_eq!(
            next_step(crd, &run),
            Step::Finish(vec![]),
            "a CRD is never deleted"
        );
        assert!(!delete_on_failure(&crd[0]));
        assert_eq!(existing(&crd[0], false), Existing::Update);
    }

    #[test]
    fn jobs_and_pods_are_waited_for_and_the_rest_is_done_once_applied() {
        let id = crate::plan::test_object;
        let job = id("batch", "Job");
        assert!(matches!(
            hook_state(&job, &json!({})),
            HookState::Running(_)
        ));
        let complete = json!({"status": {"conditions": [
            {"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]}});
        assert_eq!(hook_state(&job, &complete), HookState::Succeeded);
        let not_yet = json!({"status": {"conditions": [{"type": "Complete", "status": "False"}]}});
        assert!(matches!(hook_state(&job, &not_yet), HookState::Running(_)));
        let failed = json!({"status": {"conditions": [{"type": "Failed", "status": "True",
            "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}});
        assert_eq!(
            hook_state(&job, &failed),
            HookState::Failed(
                "Job x failed: BackoffLimitExceeded: Job has reached the specified backoff limit"
                    .into()
            )
        );
        let pod = id("", "Pod");
        assert!(
            matches!(hook_state(&pod, &json!({"status": {"phase": "Running"}})), HookState::Running(m) if m.contains("Running"))
        );
        assert_eq!(
            hook_state(&pod, &json!({"status": {"phase": "Succeeded"}})),
            HookState::Succeeded
        );
        assert!(matches!(
            hook_state(&pod, &json!({"status": {"phase": "Failed"}})),
            HookState::Failed(_)
        ));
        assert_eq!(
            hook_state(&id("", "ConfigMap"), &json!({})),
            HookState::Succeeded
        );
        assert!(runs_to_completion(&job) && runs_to_completion(&pod));
        assert!(!runs_to_completion(&id("apps", "Job")));
    }

    #[test]
    fn timeouts_count_from_the_start() {
        let five = Duration::from_secs(5);
        assert!(!timed_out(&at(100), five, &at(104)));
        assert!(timed_out(&at(100), five, &at(105)));
        assert!(
            !timed_out(&at(100), five, &at(90)),
            "a clock behind the start is not a timeout"
        );
        let hooks = hooks();
        assert_eq!(
            timeout(&hooks[0], DEFAULT_HOOK_TIMEOUT),
            DEFAULT_HOOK_TIMEOUT
        );
        let mut with = hooks[0].clone();
        with.timeout = Some(five);
        assert_eq!(timeout(&with, DEFAULT_HOOK_TIMEOUT), five);
    }

    #[test]
    fn the_inputs_digest_covers_each_input() {
        let base = inputs_digest("sha256:c", "sha256:v", "r", "ns");
        assert!(base.starts_with("sha256:"));
        assert_eq!(base, inputs_digest("sha256:c", "sha256:v", "r", "ns"));
        for other in [
            inputs_digest("sha256:C", "sha256:v", "r", "ns"),
            inputs_digest("sha256:c", "sha256:V", "r", "ns"),
            inputs_digest("sha256:c", "sha256:v", "R", "ns"),
            inputs_digest("sha256:c", "sha256:v", "r", "NS"),
            inputs_digest("sha256:c", "sha256:vr", "", "ns"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn a_run_id_is_the_same_when_recomputed_and_new_for_every_new_run() {
        let first = current_run(None, false, "sha256:a", Some(1), false);
        // The pass that started it could not record it: the next pass computes the same run.
        assert_eq!(first, current_run(None, false, "sha256:a", Some(1), false));
        assert_eq!(first.id.len(), 16);
        let mut done = first.clone();
        done.phase = HookRunPhase::Done;
        let b = current_run(Some(&done), false, "sha256:b", Some(1), true);
        assert_ne!(b.id, first.id);
        let mut b_done = b.clone();
        b_done.phase = HookRunPhase::Done;
        // Back to the first inputs at the same generation (a values ConfigMap edited back): a
        // new run, with a new id, so the first run's hook objects are not taken as its own.
        let again = current_run(Some(&b_done), false, "sha256:a", Some(1), true);
        assert_eq!(again.phase, HookRunPhase::PreHooks);
        assert_ne!(again.id, first.id);
        assert_ne!(again.id, b.id);
        // A run recorded without an id gets one derived from what it recorded.
        let mut legacy = done.clone();
        legacy.id = String::new();
        let continued = current_run(Some(&legacy), false, "sha256:a", Some(2), true);
        assert!(!continued.id.is_empty());
        assert_eq!(
            continued.id,
            current_run(Some(&legacy), false, "sha256:a", Some(3), true).id
        );
        // Stamps tell the events of one run apart.
        assert_eq!(
            stamp(&first, HookEvent::PreInstall),
            format!("pre-install/{}", first.id)
        );
        assert_ne!(
            stamp(&first, HookEvent::PreInstall),
            stamp(&first, HookEvent::PostInstall)
        );
    }

    #[test]
    fn a_failed_run_is_retried_only_after_a_change_made_after_the_failure() {
        // Started at generation 1; `interval` edited during the run (generation 2); failed then.
        let mut run = run(HookOperation::Upgrade, HookRunPhase::PreHooks);
        fail(&mut run, "Job migrate failed", Some(2));
        assert_eq!(
            current_run(Some(&run), false, "sha256:a", Some(2), true),
            run,
            "no retry nobody asked for"
        );
        let retry = current_run(Some(&run), false, "sha256:a", Some(3), true);
        assert_eq!(
            (retry.phase, retry.generation),
            (HookRunPhase::PreHooks, Some(3))
        );
        assert_ne!(retry.id, run.id);
    }

    #[test]
    fn an_install_stays_an_install_until_its_objects_were_applied() {
        use HookOperation::*;
        use HookRunPhase::*;
        assert!(!installed(None, true));
        assert!(installed(None, false), "recorded before hook runs existed");
        // The first apply was rejected (the inventory was recorded before it): still an install.
        assert!(!installed(Some(&run(Install, Objects)), false));
        assert!(!installed(Some(&run(Install, PreHooks)), false));
        assert!(installed(Some(&run(Install, PostHooks)), false));
        assert!(installed(Some(&run(Install, Done)), true));
        assert!(installed(Some(&run(Upgrade, PreHooks)), true));
        assert!(installed(Some(&run(Install, Failed)), false));
        assert!(!installed(Some(&run(Install, Failed)), true));
    }
}
