//! Delete: removes the module when its Manifest is deleted — pre-delete hooks, the inventory in
//! reverse install order, post-delete hooks, the remaining hook objects — then releases the
//! Manifest.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use super::context::Context;
use super::error::ReconcileError;
use super::hook_runner::{HookScope, PhaseOutcome, prepare_hooks};
use super::inputs::{render_request, vetted_render};
use super::objects::{delete_object, still_there};
use super::pass::{HOOK_REQUEUE, Pass, Progress, progress_requeue};
use super::records::publish;
use super::{dependencies, finalizer, target};
use crate::api::State;
use crate::api::{
    DeletionPolicy, HookOperation, HookRun, HookRunPhase, InventoryEntry, Manifest, ManifestStatus,
};
use crate::apply::Cluster;
use crate::apply::target::TargetError;
use crate::plan::hooks::{self, HookState};
use crate::plan::ownership;
use crate::plan::status::{Outcome, Reason};
use crate::plan::{self, Hook, HookEvent, PlanError};
use crate::shard::fence::Fence;

/// [`progress_requeue`] for a Manifest being deleted: waited since its deletion timestamp.
fn deletion_requeue(manifest: &Manifest) -> Duration {
    let waited = manifest
        .metadata
        .deletion_timestamp
        .as_ref()
        .and_then(|t| Duration::try_from(Timestamp::now().duration_since(t.0)).ok())
        .unwrap_or_default();
    progress_requeue(waited)
}

/// Deletes the module (unless `deletionPolicy: Orphan` or nothing was ever applied), then
/// releases the Manifest. `Some(pass)` while a hook runs or an object is still terminating.
pub(super) async fn delete(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
    progress: &mut Progress,
) -> Result<Option<Pass>, ReconcileError> {
    if !finalizer::held(manifest) {
        return Ok(None);
    }
    let previous = manifest.status.clone().unwrap_or_default();
    // Nothing was ever applied (no object, no hook object): nothing to remove, no target to
    // contact, no delete hooks to run.
    let applied = !previous.inventory.is_empty() || !previous.hook_objects.is_empty();
    if manifest.spec.deletion_policy == DeletionPolicy::Delete && applied {
        // Dependents that installed something may still need this module (their own deletion's
        // hooks, its CRDs): they go first.
        if let Some(held) = dependencies::held_by_dependents(manifest, ctx).await? {
            return Ok(Some(held));
        }
        if let Some(turn) = waits_for_its_turn(manifest, ctx, &previous) {
            return Ok(Some(turn));
        }
        let (cluster, _) = match target::resolve(manifest, ctx).await {
            // The target cannot be named any more (or is another cluster than the module's):
            // release rather than wait forever, touching nothing there.
            Err(ReconcileError::Target(gone)) if gone.target_gone() => {
                let objects = previous.inventory.len() + previous.hook_objects.len();
                return release_target_gone(manifest, ctx, fence, &gone, objects).await;
            }
            result => result?,
        };
        let removal = Removal {
            manifest,
            ctx,
            cluster: &cluster,
            fence,
            previous: &previous,
        };
        let removed = removal.delete_on(progress).await;
        if let Some(pass) = target::observe(&cluster, ctx, removed)? {
            return Ok(Some(pass));
        }
    }
    let (reason, note) = match manifest.spec.deletion_policy {
        DeletionPolicy::Delete => (
            Reason::Deleted,
            "the module's objects are deleted (CRDs, the Manifest's namespace, objects it does not manage and those marked helm.sh/resource-policy: keep stay)"
                .to_owned(),
        ),
        DeletionPolicy::Orphan => (
            Reason::Orphaned,
            format!(
                "left {} on the cluster (deletionPolicy: Orphan)",
                plan::counted(previous.inventory.len(), "object")
            ),
        ),
    };
    fence.check()?;
    publish(manifest, ctx, EventType::Normal, reason.as_str(), &note).await;
    finalizer::release(manifest, ctx, fence).await?;
    ctx.deletions.forget(&manifest.uid().unwrap_or_default());
    Ok(None)
}

/// The fleet's cap on module deletions ([`DeletionCap`](super::DeletionCap)): `Some(pass)`
/// while this deletion waits for its turn. Asked only before the deletion's first step: one
/// whose status records the deletion's hook run goes on to its end, and so does one this
/// replica let start lately (its pass failed before the status recorded the start).
fn waits_for_its_turn(
    manifest: &Manifest,
    ctx: &Context,
    previous: &ManifestStatus,
) -> Option<Pass> {
    let started = previous
        .hook_run
        .as_ref()
        .is_some_and(|run| run.operation == HookOperation::Delete);
    if started {
        return None;
    }
    let turn = ctx.deletions.admit(&manifest.uid()?)?;
    Some(Pass {
        outcome: Outcome::waiting(State::Deleting, Reason::DeletionRateLimited, turn.message),
        facts: Default::default(),
        // A little after the turn, so that the pass finds it come — or sooner: the turn moves
        // forward when those before it leave the queue, and nothing else wakes this pass.
        requeue: (turn.wait + Duration::from_millis(10)).min(TURN_RECHECK),
    })
}

/// The longest a deletion waiting for its turn sleeps before it asks again.
const TURN_RECHECK: Duration = Duration::from_secs(15);

/// Releases a Manifest being deleted whose target can no longer be named (its kubeconfig Secret or
/// key is gone, or the kubeconfig is refused): the module's objects on the target are left, with a
/// Warning Event `TargetGone`, instead of keeping the Manifest forever.
async fn release_target_gone(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
    gone: &TargetError,
    objects: usize,
) -> Result<Option<Pass>, ReconcileError> {
    let note = format!(
        "{gone}: released without deleting; {objects} objects may be left on the target cluster (labelled {}={})",
        crate::apply::MANIFEST_UID_LABEL,
        manifest.uid().unwrap_or_default()
    );
    tracing::warn!("{note}");
    fence.check()?;
    publish(manifest, ctx, EventType::Warning, "TargetGone", &note).await;
    finalizer::release(manifest, ctx, fence).await?;
    ctx.deletions.forget(&manifest.uid().unwrap_or_default());
    Ok(None)
}

/// One deletion pass on one cluster: what every step needs.
struct Removal<'a> {
    manifest: &'a Manifest,
    ctx: &'a Context,
    cluster: &'a Cluster,
    fence: &'a Fence,
    /// The status as read at the start of the pass.
    previous: &'a ManifestStatus,
}

impl Removal<'_> {
    /// The deletion on the cluster: the pre-delete hooks, the inventory (reverse install order),
    /// the post-delete hooks, then every hook object still recorded. `Some(pass)` while a hook
    /// runs or an object is still terminating; `None` once everything is gone.
    async fn delete_on(&self, progress: &mut Progress) -> Result<Option<Pass>, ReconcileError> {
        let scope = HookScope {
            manifest: self.manifest,
            ctx: self.ctx,
            cluster: self.cluster,
            fence: self.fence,
            uid: self.manifest.uid().unwrap_or_default(),
            manifest_namespace: self.manifest.namespace().unwrap_or_default(),
            previous_hook_objects: &self.previous.hook_objects,
        };
        let run = progress.hook_run.insert(hooks::current_run(
            self.previous.hook_run.as_ref(),
            true,
            "",
            self.manifest.meta().generation,
            true,
        ));
        if run.phase == HookRunPhase::Failed {
            return Err(ReconcileError::HookFailed(
                run.message.clone().unwrap_or_default(),
            ));
        }
        let hook_objects = &mut progress.hook_objects;
        let mut waiting = None;
        // Pre-delete hooks, before any object is deleted (the phase moves on once they are done).
        if run.phase == HookRunPhase::PreHooks {
            let message = scope.delete_hooks(run, hook_objects, HookEvent::PreDelete);
            waiting = message
                .await?
                .map(|m| (Reason::HookRunning, m, HOOK_REQUEUE));
        }
        if waiting.is_none() && run.phase == HookRunPhase::Objects {
            waiting = self.delete_inventory(&scope).await?;
            if waiting.is_none() {
                hooks::advance(run);
            }
        }
        // Post-delete hooks, once the objects are gone.
        if waiting.is_none() && run.phase == HookRunPhase::PostHooks {
            let message = scope.delete_hooks(run, hook_objects, HookEvent::PostDelete);
            waiting = message
                .await?
                .map(|m| (Reason::HookRunning, m, HOOK_REQUEUE));
        }
        if waiting.is_none() {
            waiting = self.delete_hook_objects(&scope, hook_objects).await?;
        }
        Ok(waiting.map(|(reason, message, requeue)| deleting(reason, message, requeue, progress)))
    }

    /// Deletes the inventory in reverse install order; `Some` while objects are still
    /// terminating (the next pass looks again, without deleting them twice).
    async fn delete_inventory(
        &self,
        scope: &HookScope<'_>,
    ) -> Result<Option<(Reason, String, Duration)>, ReconcileError> {
        let mut inventory = self.previous.inventory.clone();
        plan::sort_for_deletion(&mut inventory);
        let mut remaining = Vec::new();
        for id in &inventory {
            let (ctx, cluster, fence) = (self.ctx, self.cluster, self.fence);
            let namespace = &scope.manifest_namespace;
            let recorded = self.previous.inventory_uids.get(&ownership::uid_key(id));
            let recorded = recorded.map(String::as_str);
            let outcome =
                delete_object(ctx, cluster, fence, id, namespace, &scope.uid, recorded).await?;
            if still_there(&outcome) {
                remaining.push(plan::describe(id));
            }
        }
        Ok(remaining.first().map(|first| {
            let message = format!(
                "waiting for {} to be deleted: {first}",
                plan::counted(remaining.len(), "object")
            );
            (Reason::Deleting, message, deletion_requeue(self.manifest))
        }))
    }

    /// Then every hook object still recorded (those the policies left, the delete hooks
    /// themselves): nothing is left behind once the Manifest is gone.
    async fn delete_hook_objects(
        &self,
        scope: &HookScope<'_>,
        hook_objects: &mut Option<Vec<InventoryEntry>>,
    ) -> Result<Option<(Reason, String, Duration)>, ReconcileError> {
        let mut left = hook_objects
            .clone()
            .unwrap_or_else(|| self.previous.hook_objects.clone());
        plan::sort_for_deletion(&mut left);
        let mut remaining = Vec::new();
        for id in &left {
            if still_there(&scope.delete(hook_objects, id).await?) {
                remaining.push(plan::describe(id));
            }
        }
        Ok(remaining.first().map(|first| {
            let message = format!(
                "waiting for {} to be deleted: {first}",
                plan::counted(remaining.len(), "hook object")
            );
            (Reason::Deleting, message, deletion_requeue(self.manifest))
        }))
    }
}

/// A deletion pass that waits: for a hook, or for objects to go.
fn deleting(reason: Reason, message: String, requeue: Duration, progress: &Progress) -> Pass {
    Pass {
        outcome: Outcome::waiting(State::Deleting, reason, message),
        facts: progress.facts(),
        requeue,
    }
}

impl HookScope<'_> {
    /// Runs the pre-delete or post-delete hooks, rendered from the Manifest's current chart and
    /// values. When that render cannot be made for good (the chart or a values source is gone,
    /// the chart is broken), the deletion goes on without them and a Warning Event `HookSkipped`
    /// says so: a Manifest whose chart was removed can still be deleted. `Some(message)` while
    /// a hook runs; `None` once the run moved past this phase.
    async fn delete_hooks(
        &self,
        run: &mut HookRun,
        hook_objects: &mut Option<Vec<InventoryEntry>>,
        event: HookEvent,
    ) -> Result<Option<String>, ReconcileError> {
        let hooks = match self.render_delete_hooks(event).await {
            Ok(hooks) => hooks,
            Err(e) if cannot_render_for_good(&e) => return self.without_hooks(run, event, e).await,
            Err(e) => return Err(e),
        };
        match self.run_phase(run, hook_objects, &hooks, event).await? {
            PhaseOutcome::Done => Ok(None),
            PhaseOutcome::Waiting(message) => Ok(Some(message)),
        }
    }

    /// The hooks of `event`, from a render of the Manifest's current chart and values.
    async fn render_delete_hooks(&self, event: HookEvent) -> Result<Vec<Hook>, ReconcileError> {
        let mut request = render_request(self.manifest, self.ctx, self.cluster).await?;
        request.is_upgrade = !self
            .manifest
            .status
            .as_ref()
            .is_none_or(|s| s.inventory.is_empty());
        let (_, plan) = vetted_render(self.manifest, self.ctx, self.cluster, &request).await?;
        prepare_hooks(self.cluster, &plan.hooks, event, &request.namespace).await
    }

    /// The delete hooks cannot be rendered (`error`): a hook of this phase that is running is
    /// still waited for (within the default timeout: its own annotation cannot be read any
    /// more); the rest are skipped, with a Warning Event `HookSkipped`.
    async fn without_hooks(
        &self,
        run: &mut HookRun,
        event: HookEvent,
        error: ReconcileError,
    ) -> Result<Option<String>, ReconcileError> {
        if let Some(running) = &run.running
            && let Some(object) = self.cluster.get(&running.object).await?
            && object.uid().as_deref() == Some(running.uid.as_str())
            && let HookState::Running(why) = hooks::hook_state(
                &running.object,
                &serde_json::to_value(&object).unwrap_or(Value::Null),
            )
            && !hooks::timed_out(
                &running.started,
                self.ctx.hook_timeout,
                &Time(Timestamp::now()),
            )
        {
            return Ok(Some(format!(
                "{} hook {}: {why} (the hooks after it are skipped: {error})",
                event.as_str(),
                plan::describe(&running.object)
            )));
        }
        let note = format!("{} hooks not run: {error}", event.as_str());
        let logged = error.for_log();
        tracing::warn!(
            category = error.category(),
            "{} hooks not run: {logged}",
            event.as_str()
        );
        self.publish_skipped(&note).await?;
        hooks::advance(run);
        Ok(None)
    }
}

/// Whether a render for the delete hooks failed in a way retrying cannot fix (a missing values
/// source counts: it may have been deleted together with the Manifest).
fn cannot_render_for_good(error: &ReconcileError) -> bool {
    match error {
        // A kind the target does not serve (yet) may appear (its CRD installed): retried.
        ReconcileError::Plan(PlanError::UnknownKind(_)) => false,
        ReconcileError::ResolveChart(_)
        | ReconcileError::ValuesSourceMissing(_)
        | ReconcileError::VerificationKeysMissing(_)
        // The credentials Secret is gone (a namespace being deleted takes it first).
        | ReconcileError::ChartCredentials(_)
        | ReconcileError::ParseValues(_)
        | ReconcileError::Plan(_)
        // A hook no module may write (in the operator's namespace, a fleet Lease): the
        // deletion goes on without the hooks.
        | ReconcileError::Protected(_) => true,
        ReconcileError::Render(e) => e.is_permanent(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::ApplyError;

    #[test]
    fn delete_hooks_are_skipped_only_when_the_render_cannot_be_made_for_good() {
        assert!(cannot_render_for_good(
            &ReconcileError::ValuesSourceMissing("Secret s does not exist".into())
        ));
        assert!(cannot_render_for_good(&ReconcileError::Plan(
            PlanError::Duplicate("Secret/s".into())
        )));
        assert!(
            cannot_render_for_good(&ReconcileError::ChartCredentials(
                crate::source::CredentialsError::missing("pull")
            )),
            "a deletion whose credentials Secret is gone goes on without its delete hooks"
        );
        assert!(
            !cannot_render_for_good(&ReconcileError::Plan(PlanError::UnknownKind(
                "Widget/w".into()
            ))),
            "a delete hook of a kind not served yet is retried, not skipped"
        );
        assert!(!cannot_render_for_good(&ReconcileError::HookFailed(
            "x".into()
        )));
        assert!(!cannot_render_for_good(&ReconcileError::Apply(
            ApplyError::UnknownKind("Widget/w".into())
        )));
        assert!(ReconcileError::HookFailed("x".into()).is_permanent());
        assert_eq!(
            ReconcileError::HookFailed("x".into()).category(),
            "HookFailed"
        );
    }
}
