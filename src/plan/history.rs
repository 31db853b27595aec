//! Release history (`status.history`): one entry per install or upgrade run — a hook run of new
//! inputs (chart, values, release name, target namespace) — and how it ended, newest first,
//! decided from the status a pass writes (docs/api.md § Release history).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::hooks;
use super::status::Outcome;
use crate::api::{
    ChartSource, HookOperation, HookRun, HookRunPhase, ManifestStatus, Release, ReleaseOutcome,
    State,
};
use crate::telemetry::events::shorten;

/// Releases kept when `spec.maxHistory` is not set.
pub const DEFAULT_MAX_HISTORY: usize = 5;

/// The longest failure message a release keeps (the status message has the whole one).
const MESSAGE_LIMIT: usize = 256;

/// What a release is run for, as the Manifest names it.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The chart, as [`chart_reference`] names it.
    pub chart: &'a str,
    /// The Helm release name.
    pub release: &'a str,
    /// The target namespace.
    pub namespace: &'a str,
    /// `spec.maxHistory` (or [`DEFAULT_MAX_HISTORY`]).
    pub max: usize,
}

/// The chart as the spec names it: `oci://…`, `<repository> <name> <version>`, or its path.
pub fn chart_reference(chart: &ChartSource) -> String {
    if let Some(oci) = &chart.oci {
        return oci.clone();
    }
    if let Some(repository) = &chart.repository {
        let name = chart.name.as_deref().unwrap_or_default();
        let version = chart.version.as_deref().unwrap_or_default();
        return format!("{repository} {name} {version}");
    }
    chart.path.clone().unwrap_or_default()
}

/// The history after a pass that worked on `pass_run` (the hook run it recorded; `None` when
/// it ended before one, e.g. at a render error) and leaves `next` (its status, whose `history`
/// is still the previous one) with `outcome`, at `now`. Only a pass that worked on an install
/// or upgrade run changes the history. A run not in it starts a release (`Pending`; a pending
/// one before it is `Superseded`); the newest release then follows its run: `Failed` when the
/// run failed, or when the pass stalled before the release succeeded; `Succeeded` when the
/// module is Ready (a later drift pass that stalls does not fail a release that succeeded).
/// The chart and values digests are set once the status holds those of the release's own
/// inputs. Unchanged facts give an unchanged history (no status write).
pub fn next(
    next: &ManifestStatus,
    pass_run: Option<&HookRun>,
    outcome: &Outcome,
    inputs: &Inputs<'_>,
    now: &Time,
) -> Vec<Release> {
    let mut history = next.history.clone();
    let run = pass_run.filter(|run| run.operation != HookOperation::Delete && !run.id.is_empty());
    if let Some(run) = run {
        if history.first().is_none_or(|newest| newest.run_id != run.id) {
            start(&mut history, run, inputs.chart, now);
        }
        let newest = &mut history[0];
        if digests_are_the_runs(next, run, inputs) {
            newest.chart_digest.clone_from(&next.chart_digest);
            newest.values_digest.clone_from(&next.values_digest);
        }
        follow(newest, run, outcome, now);
    }
    history.truncate(inputs.max.max(1));
    history
}

/// Puts a new release for `run` first; a pending one before it was superseded.
fn start(history: &mut Vec<Release>, run: &HookRun, chart: &str, now: &Time) {
    if let Some(newest) = history.first_mut()
        && newest.outcome == ReleaseOutcome::Pending
    {
        newest.outcome = ReleaseOutcome::Superseded;
        newest.ended = Some(now.clone());
    }
    let revision = history.first().map_or(1, |newest| newest.revision + 1);
    history.insert(
        0,
        Release {
            revision,
            operation: run.operation,
            chart: chart.to_owned(),
            chart_digest: None,
            values_digest: None,
            generation: run.generation,
            run_id: run.id.clone(),
            started: now.clone(),
            ended: None,
            outcome: ReleaseOutcome::Pending,
            message: None,
        },
    );
}

/// Whether the status's chart and values digests are those the run was started for.
fn digests_are_the_runs(next: &ManifestStatus, run: &HookRun, inputs: &Inputs<'_>) -> bool {
    let (Some(chart), Some(values)) = (&next.chart_digest, &next.values_digest) else {
        return false;
    };
    hooks::inputs_digest(chart, values, inputs.release, inputs.namespace) == run.inputs_digest
}

/// Moves the newest release to where its run and the pass left it.
fn follow(release: &mut Release, run: &HookRun, outcome: &Outcome, now: &Time) {
    let (ended, message) = if run.phase == HookRunPhase::Failed {
        let message = run.message.clone().unwrap_or_default();
        (
            ReleaseOutcome::Failed,
            Some(shorten(&message, MESSAGE_LIMIT).into_owned()),
        )
    } else if outcome.state == State::Ready {
        (ReleaseOutcome::Succeeded, None)
    } else if outcome.stalled && release.outcome != ReleaseOutcome::Succeeded {
        (
            ReleaseOutcome::Failed,
            Some(shorten(&outcome.message, MESSAGE_LIMIT).into_owned()),
        )
    } else {
        return;
    };
    if release.outcome != ended {
        release.outcome = ended;
        release.ended = Some(now.clone());
    }
    release.message = message;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::status::Reason;
    use k8s_openapi::jiff::Timestamp;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap())
    }

    /// A pass that worked on the run its status holds.
    fn pass(
        status: &ManifestStatus,
        outcome: &Outcome,
        inputs: &Inputs<'_>,
        now: &Time,
    ) -> Vec<Release> {
        next(status, status.hook_run.as_ref(), outcome, inputs, now)
    }

    const INPUTS: Inputs<'static> = Inputs {
        chart: "charts/web",
        release: "web",
        namespace: "apps",
        max: 3,
    };

    fn run(id: &str, operation: HookOperation, phase: HookRunPhase) -> HookRun {
        HookRun {
            operation,
            inputs_digest: hooks::inputs_digest(
                &format!("c-{id}"),
                &format!("v-{id}"),
                "web",
                "apps",
            ),
            generation: Some(1),
            id: id.into(),
            phase,
            completed: vec![],
            running: None,
            message: (phase == HookRunPhase::Failed).then(|| "hook db-migrate failed".into()),
        }
    }

    /// The status a pass leaves: `run`, the digests of run `digests` (if any), `history`.
    fn status(run: HookRun, digests: Option<&str>, history: Vec<Release>) -> ManifestStatus {
        ManifestStatus {
            hook_run: Some(run),
            chart_digest: digests.map(|id| format!("c-{id}")),
            values_digest: digests.map(|id| format!("v-{id}")),
            history,
            ..ManifestStatus::default()
        }
    }

    fn outcome(state: State, stalled: bool) -> Outcome {
        Outcome {
            state,
            reason: Reason::Ready,
            message: "the message".into(),
            rendered: None,
            applied: None,
            stalled,
            operation: None,
        }
    }

    #[test]
    fn an_install_starts_pending_and_succeeds_when_ready_with_its_own_digests() {
        let pending = pass(
            &status(
                run("a", HookOperation::Install, HookRunPhase::PreHooks),
                Some("old"),
                vec![],
            ),
            &outcome(State::Processing, false),
            &INPUTS,
            &at(10),
        );
        assert_eq!(pending.len(), 1);
        let first = &pending[0];
        assert_eq!(
            (first.revision, first.operation),
            (1, HookOperation::Install)
        );
        assert_eq!(first.outcome, ReleaseOutcome::Pending);
        assert_eq!(
            first.chart_digest, None,
            "another run's digests are not this one's"
        );
        assert_eq!((first.started.clone(), first.ended.clone()), (at(10), None));
        let ready = pass(
            &status(
                run("a", HookOperation::Install, HookRunPhase::Done),
                Some("a"),
                pending,
            ),
            &outcome(State::Ready, false),
            &INPUTS,
            &at(20),
        );
        assert_eq!(ready[0].outcome, ReleaseOutcome::Succeeded);
        assert_eq!(ready[0].chart_digest.as_deref(), Some("c-a"));
        assert_eq!(ready[0].values_digest.as_deref(), Some("v-a"));
        assert_eq!(
            (ready[0].started.clone(), ready[0].ended.clone()),
            (at(10), Some(at(20)))
        );
        // A drift pass later changes nothing: no status write.
        let again = pass(
            &status(
                run("a", HookOperation::Install, HookRunPhase::Done),
                Some("a"),
                ready.clone(),
            ),
            &outcome(State::Ready, false),
            &INPUTS,
            &at(30),
        );
        assert_eq!(again, ready);
    }

    #[test]
    fn upgrades_count_on_a_failed_one_keeps_its_message_and_the_oldest_fall_off() {
        let mut history = vec![];
        for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
            let at_start = i64::try_from(i).unwrap() * 100;
            let operation = if i == 0 {
                HookOperation::Install
            } else {
                HookOperation::Upgrade
            };
            history = pass(
                &status(run(id, operation, HookRunPhase::Done), Some(id), history),
                &outcome(State::Ready, false),
                &INPUTS,
                &at(at_start),
            );
        }
        assert_eq!(
            history.iter().map(|r| r.revision).collect::<Vec<_>>(),
            [3, 2, 1]
        );
        let failed = pass(
            &status(
                run("d", HookOperation::Upgrade, HookRunPhase::Failed),
                None,
                history,
            ),
            &outcome(State::Error, true),
            &INPUTS,
            &at(400),
        );
        assert_eq!(failed.len(), 3, "at most max");
        assert_eq!(
            failed.iter().map(|r| r.revision).collect::<Vec<_>>(),
            [4, 3, 2]
        );
        assert_eq!(failed[0].outcome, ReleaseOutcome::Failed);
        assert_eq!(failed[0].message.as_deref(), Some("hook db-migrate failed"));
        assert_eq!(failed[0].ended, Some(at(400)));
        assert_eq!(
            failed[1].outcome,
            ReleaseOutcome::Succeeded,
            "the one before stays"
        );
    }

    #[test]
    fn a_pending_release_replaced_by_newer_inputs_is_superseded_and_a_stall_fails_it() {
        let pending = pass(
            &status(
                run("a", HookOperation::Upgrade, HookRunPhase::Objects),
                Some("a"),
                vec![],
            ),
            &outcome(State::Processing, false),
            &INPUTS,
            &at(10),
        );
        let replaced = pass(
            &status(
                run("b", HookOperation::Upgrade, HookRunPhase::Objects),
                Some("a"),
                pending,
            ),
            &outcome(State::Processing, false),
            &INPUTS,
            &at(20),
        );
        assert_eq!(replaced[1].outcome, ReleaseOutcome::Superseded);
        assert_eq!(replaced[1].ended, Some(at(20)));
        assert_eq!(replaced[0].outcome, ReleaseOutcome::Pending);
        // A stall (the readiness timeout) fails it; Ready later on the same run succeeds it.
        let stalled = pass(
            &status(
                run("b", HookOperation::Upgrade, HookRunPhase::Objects),
                Some("b"),
                replaced,
            ),
            &outcome(State::Error, true),
            &INPUTS,
            &at(30),
        );
        assert_eq!(stalled[0].outcome, ReleaseOutcome::Failed);
        assert_eq!(stalled[0].message.as_deref(), Some("the message"));
        // A transient error changes nothing.
        let retrying = pass(
            &status(
                run("b", HookOperation::Upgrade, HookRunPhase::Objects),
                Some("b"),
                stalled.clone(),
            ),
            &outcome(State::Error, false),
            &INPUTS,
            &at(35),
        );
        assert_eq!(retrying, stalled);
        let ready = pass(
            &status(
                run("b", HookOperation::Upgrade, HookRunPhase::Done),
                Some("b"),
                stalled,
            ),
            &outcome(State::Ready, false),
            &INPUTS,
            &at(40),
        );
        assert_eq!(ready[0].outcome, ReleaseOutcome::Succeeded);
        assert_eq!(
            (ready[0].ended.clone(), ready[0].message.clone()),
            (Some(at(40)), None)
        );
    }

    #[test]
    fn a_deletion_run_adds_nothing_and_chart_references_name_the_source() {
        let kept = vec![];
        let deleting = pass(
            &status(
                run("x", HookOperation::Delete, HookRunPhase::PreHooks),
                None,
                kept,
            ),
            &outcome(State::Deleting, false),
            &INPUTS,
            &at(1),
        );
        assert!(deleting.is_empty());
        let repository = ChartSource {
            repository: Some("https://charts.example.com".into()),
            name: Some("web".into()),
            version: Some("1.2.3".into()),
            ..ChartSource::default()
        };
        assert_eq!(
            chart_reference(&repository),
            "https://charts.example.com web 1.2.3"
        );
        let oci = ChartSource {
            oci: Some("oci://registry.example.com/charts/web:1.2.3".into()),
            ..ChartSource::default()
        };
        assert_eq!(
            chart_reference(&oci),
            "oci://registry.example.com/charts/web:1.2.3"
        );
    }

    #[test]
    fn a_pass_without_a_run_and_a_later_stall_leave_a_succeeded_release_alone() {
        let done = || run("a", HookOperation::Install, HookRunPhase::Done);
        let ready = pass(
            &status(done(), Some("a"), vec![]),
            &outcome(State::Ready, false),
            &INPUTS,
            &at(10),
        );
        // A render error of a new chart version: the pass ends before it has a run; the
        // status keeps the last one.
        let unrendered = next(
            &status(done(), Some("a"), ready.clone()),
            None,
            &outcome(State::Error, true),
            &INPUTS,
            &at(20),
        );
        assert_eq!(unrendered, ready, "not the succeeded release's failure");
        // A drift pass on the same run stalls days later (a broken pod): still succeeded.
        let drifted = pass(
            &status(done(), Some("a"), ready.clone()),
            &outcome(State::Error, true),
            &INPUTS,
            &at(30),
        );
        assert_eq!(drifted, ready);
        // A release still rolling out when a render error of newer inputs stops the passes:
        // the error is not its failure (it is superseded once the next inputs render).
        let waiting = run("b", HookOperation::Upgrade, HookRunPhase::Done);
        let pending = pass(
            &status(waiting.clone(), Some("b"), ready),
            &outcome(State::Processing, false),
            &INPUTS,
            &at(40),
        );
        let stopped = next(
            &status(waiting, Some("b"), pending.clone()),
            None,
            &outcome(State::Error, true),
            &INPUTS,
            &at(50),
        );
        assert_eq!(stopped, pending);
        assert_eq!(stopped[0].outcome, ReleaseOutcome::Pending);
    }
}
