//! Hook runner: runs one phase of a release's hooks (Jobs, Pods …) across passes — start,
//! observe, finish — recording each in `status.hookObjects` and the run in `status.hookRun`.

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::context::Context;
use super::error::ReconcileError;
use super::objects::{delete_object, still_there};
use super::records::{patch_status, publish};
use crate::api::{HookRun, InventoryEntry, Manifest, RunningHook};
use crate::apply::{ApplyError, Cluster, Deletion, MANIFEST_UID_LABEL};
use crate::plan::hooks::{self, Existing, HookState, Step};
use crate::plan::{self, Hook, HookEvent, RenderedObject};
use crate::shard::fence::Fence;

/// The hooks of `event`, in run order, with their namespaces assigned (discovery is refreshed
/// once when a kind is unknown; a kind still unknown is an error, retried).
pub(super) async fn prepare_hooks(
    cluster: &Cluster,
    all: &[Hook],
    event: HookEvent,
    namespace: &str,
) -> Result<Vec<Hook>, ReconcileError> {
    let mut selected = hooks::hooks_for(all, event);
    if selected
        .iter()
        .any(|h| cluster.surface().resolve(&h.object.id).is_none())
    {
        cluster.refresh_discovery().await?;
    }
    let surface = cluster.surface();
    let mut objects: Vec<RenderedObject> = selected.iter().map(|h| h.object.clone()).collect();
    plan::assign_namespaces(&mut objects, namespace, |id| {
        surface.resolve(id).map(|(_, scope)| *scope)
    })?;
    for (hook, object) in selected.iter_mut().zip(objects) {
        hook.object = object;
    }
    Ok(selected)
}

/// How a phase of hooks ended in this pass.
pub(super) enum PhaseOutcome {
    /// Every hook succeeded: the run moved to its next phase (and the `hook-succeeded` ones
    /// were deleted).
    Done,
    /// A hook is running (or its previous instance is being deleted): requeue.
    Waiting(String),
}

/// What starting or watching a hook found.
enum Found {
    /// The hook's object as the server has it: look at its state.
    Object(Box<DynamicObject>),
    /// A delete hook that cannot run was counted as done: go on with the next.
    Skipped,
    /// The hook cannot start yet (its previous instance is being deleted).
    Waiting(String),
}

/// What running hooks needs from the pass.
pub(super) struct HookScope<'a> {
    pub(super) manifest: &'a Manifest,
    pub(super) ctx: &'a Context,
    /// The cluster the module (and its hooks) go to.
    pub(super) cluster: &'a Cluster,
    pub(super) fence: &'a Fence,
    pub(super) uid: String,
    pub(super) manifest_namespace: String,
    /// `status.hookObjects` as read at the start of the pass.
    pub(super) previous_hook_objects: &'a [InventoryEntry],
}

/// The hook run and the hook objects a phase works on.
pub(super) struct RunState<'r> {
    pub(super) run: &'r mut HookRun,
    pub(super) hook_objects: &'r mut Option<Vec<InventoryEntry>>,
}

impl HookScope<'_> {
    /// Runs the hooks of one phase as far as they go in this pass: each is started (its
    /// previous instance deleted first when its policy says `before-hook-creation`), looked at,
    /// and recorded as completed; a Job or Pod that has not finished ends the pass (`Waiting`);
    /// one that failed or ran past its timeout fails the run. Once all succeeded, the run moves
    /// to its next phase — saved in `status.hookRun` *before* those with `hook-succeeded` are
    /// deleted (in reverse order), so that a pass that ends without writing its status never
    /// looks for a hook it deleted itself.
    ///
    /// Every hook object is stamped with the run (`modulemanager.io/hook-run`); a hook about to
    /// start whose object carries this run's stamp was started by a pass that could not record
    /// it (a crash, a lost status write, a lost shard): it is adopted as the running hook, never
    /// deleted nor started again.
    pub(super) async fn run_phase(
        &self,
        run: &mut HookRun,
        hook_objects: &mut Option<Vec<InventoryEntry>>,
        hooks: &[Hook],
        event: HookEvent,
    ) -> Result<PhaseOutcome, ReconcileError> {
        let mut state = RunState { run, hook_objects };
        loop {
            let (hook, found) = match hooks::next_step(hooks, state.run) {
                Step::Finish(succeeded) => return self.finish(&mut state, succeeded).await,
                Step::Start(hook) => (hook, self.start(&mut state, hook, event).await?),
                Step::Watch(hook) => (hook, self.watch(&mut state, hook, event).await?),
            };
            let object = match found {
                Found::Object(object) => *object,
                Found::Skipped => continue,
                Found::Waiting(message) => return Ok(PhaseOutcome::Waiting(message)),
            };
            if let Some(outcome) = self
                .observe(&mut state, hooks, hook, &object, event)
                .await?
            {
                return Ok(outcome);
            }
        }
    }

    /// Every hook of the phase succeeded: the run moves on (saved first), then the
    /// `hook-succeeded` ones are deleted.
    async fn finish(
        &self,
        state: &mut RunState<'_>,
        succeeded: Vec<&Hook>,
    ) -> Result<PhaseOutcome, ReconcileError> {
        hooks::advance(state.run);
        if !succeeded.is_empty() {
            self.save_run(state.run).await?;
        }
        for hook in succeeded {
            self.delete(state.hook_objects, &hook.object.id).await?;
        }
        Ok(PhaseOutcome::Done)
    }

    /// Starts a hook: records it, deals with an instance that exists (adopt, replace, update or
    /// refuse), then applies it stamped with the run.
    async fn start(
        &self,
        state: &mut RunState<'_>,
        hook: &Hook,
        event: HookEvent,
    ) -> Result<Found, ReconcileError> {
        let id = &hook.object.id;
        // A delete hook whose namespace is being deleted (or is gone) cannot run: skipped, so
        // that deleting the namespace does not wait on this Manifest forever.
        if is_delete(event)
            && let Some(why) = self.namespace_unusable(id).await?
        {
            self.skip(state.run, hook, event, &why).await?;
            return Ok(Found::Skipped);
        }
        // Recorded before it is applied: a hook object is never forgotten.
        self.record(state.hook_objects, id).await?;
        let stamp = hooks::stamp(state.run, event);
        if let Some(existing) = self.cluster.get(id).await? {
            if existing.labels().get(MANIFEST_UID_LABEL) != Some(&self.uid) {
                return Err(ApplyError::HookNotOwned(plan::describe(id)).into());
            }
            let this_run = existing.annotations().get(hooks::RUN_ANNOTATION) == Some(&stamp)
                && existing.metadata.deletion_timestamp.is_none();
            match hooks::existing(hook, this_run) {
                Existing::Adopt => {
                    let adopted = adopt(state.run, event, id, existing);
                    return Ok(Found::Object(Box::new(adopted)));
                }
                Existing::Replace => {
                    if let Some(waiting) = self.replace(state, hook, event).await? {
                        return Ok(Found::Waiting(waiting));
                    }
                }
                Existing::Update => {}
                Existing::Refuse(why) => return Err(self.fail(state, hook, why).await),
            }
        }
        let created = self.create(state.run, hook, event, &stamp).await?;
        Ok(Found::Object(Box::new(created)))
    }

    /// Deletes a hook's previous instance (`before-hook-creation`); `Some(message)` while it is
    /// still being deleted.
    async fn replace(
        &self,
        state: &mut RunState<'_>,
        hook: &Hook,
        event: HookEvent,
    ) -> Result<Option<String>, ReconcileError> {
        let id = &hook.object.id;
        match self.delete(state.hook_objects, id).await? {
            Deletion::Deleted { terminating: true } | Deletion::Terminating => Ok(Some(format!(
                "{} hook {}: waiting until its previous instance is deleted",
                event.as_str(),
                plan::describe(id)
            ))),
            Deletion::Kept(why) if hooks::runs_to_completion(id) => {
                let why = format!(
                    "{} exists from an earlier run and cannot be replaced ({why}); delete it to run the hook again",
                    plan::describe(id)
                );
                Err(self.fail(state, hook, why).await)
            }
            _ => Ok(None),
        }
    }

    /// Applies a hook stamped with the run and records it as the running hook.
    async fn create(
        &self,
        run: &mut HookRun,
        hook: &Hook,
        event: HookEvent,
        stamp: &str,
    ) -> Result<DynamicObject, ReconcileError> {
        let id = &hook.object.id;
        let mut stamped = hook.object.clone();
        if let Some(metadata) = stamped
            .body
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
        {
            let annotations = metadata.entry("annotations").or_insert(Value::Null);
            if !annotations.is_object() {
                *annotations = json!({});
            }
            annotations[hooks::RUN_ANNOTATION] = json!(stamp);
        }
        self.fence.check()?;
        let applied = self.cluster.apply(&stamped, &self.uid).await?;
        self.ctx.metrics.applied.inc();
        tracing::info!(hook = %plan::describe(id), event = event.as_str(), "hook started");
        run.running = Some(RunningHook {
            object: id.clone(),
            uid: applied.uid().unwrap_or_default(),
            started: Time(Timestamp::now()),
        });
        Ok(applied)
    }

    /// Looks up the running hook; one deleted or replaced before it was seen to finish fails the
    /// run (unless it went with its namespace during a deletion).
    async fn watch(
        &self,
        state: &mut RunState<'_>,
        hook: &Hook,
        event: HookEvent,
    ) -> Result<Found, ReconcileError> {
        let id = &hook.object.id;
        let expected = state.run.running.as_ref().map(|r| r.uid.as_str());
        let gone = match self.cluster.get(id).await? {
            Some(object) if object.uid().as_deref() == expected => {
                return Ok(Found::Object(Box::new(object)));
            }
            gone => gone,
        };
        if gone.is_none()
            && is_delete(event)
            && let Some(why) = self.namespace_unusable(id).await?
        {
            // Deleted with its namespace: nothing to wait for.
            self.skip(state.run, hook, event, &why).await?;
            return Ok(Found::Skipped);
        }
        let ttl = hook
            .object
            .body
            .pointer("/spec/ttlSecondsAfterFinished")
            .is_some();
        let why = format!(
            "{} hook {} was deleted or replaced before it was seen to finish{}",
            event.as_str(),
            plan::describe(id),
            if ttl && gone.is_none() {
                " (its ttlSecondsAfterFinished may have removed it: whether it succeeded is unknown; give it a TTL of a minute or more)"
            } else {
                ""
            }
        );
        Err(self.fail(state, hook, why).await)
    }

    /// Looks at a started hook: `None` when it succeeded (the phase goes on), `Waiting` while
    /// it runs; failed or past its timeout fails the run.
    async fn observe(
        &self,
        state: &mut RunState<'_>,
        hooks: &[Hook],
        hook: &Hook,
        object: &DynamicObject,
        event: HookEvent,
    ) -> Result<Option<PhaseOutcome>, ReconcileError> {
        let event_name = event.as_str();
        let id = &hook.object.id;
        let body = serde_json::to_value(object).unwrap_or(Value::Null);
        match hooks::hook_state(id, &body) {
            HookState::Succeeded => {
                tracing::info!(hook = %plan::describe(id), event = event_name, "hook succeeded");
                state.run.completed.push(id.clone());
                state.run.running = None;
                Ok(None)
            }
            HookState::Running(why) => {
                let limit = hooks::timeout(hook, self.ctx.hook_timeout);
                let started = state.run.running.as_ref().map(|r| r.started.clone());
                if started.is_some_and(|s| hooks::timed_out(&s, limit, &Time(Timestamp::now()))) {
                    let why = format!(
                        "{event_name} hook {} did not finish within {limit:?}",
                        plan::describe(id)
                    );
                    return Err(self.fail(state, hook, why).await);
                }
                let position = state.run.completed.len() + 1;
                Ok(Some(PhaseOutcome::Waiting(format!(
                    "{event_name} hook {position} of {}: {why}",
                    hooks.len()
                ))))
            }
            HookState::Failed(why) => {
                let why = format!("{event_name} hook {why}");
                Err(self.fail(state, hook, why).await)
            }
        }
    }

    /// Fails the run. When the hook's policy says `hook-failed` it is deleted — after the
    /// failure is saved, so that a pass that ends without writing its status does not start the
    /// hook again.
    async fn fail(&self, state: &mut RunState<'_>, hook: &Hook, why: String) -> ReconcileError {
        tracing::warn!(hook = %plan::describe(&hook.object.id), "hook failed: {why}");
        hooks::fail(state.run, &why, self.manifest.meta().generation);
        if hooks::delete_on_failure(hook) {
            if let Err(e) = self.save_run(state.run).await {
                return e; // retried: the next pass sees the failure again
            }
            if let Err(e) = self.delete(state.hook_objects, &hook.object.id).await {
                return e; // retried: the run is recorded as failed; deleted with the Manifest
            }
        }
        ReconcileError::HookFailed(why)
    }

    /// Writes `status.hookRun` now (before a step that must not be repeated or undone by a pass
    /// that reads an older run).
    async fn save_run(&self, run: &HookRun) -> Result<(), ReconcileError> {
        self.fence.check()?;
        let mut patch = json!({ "hookRun": run });
        // A reset this pass carries out is handled once its new run is saved: a pass that ends
        // without its final status write (a lost shard, a crash) must not start it over again.
        if let Some(reset) = crate::plan::trigger::Requests::of(self.manifest).reset {
            patch["lastHandledResetAt"] = json!(reset);
        }
        patch_status(self.manifest, self.ctx, self.fence, patch).await
    }

    /// Why a delete hook's namespace cannot hold it: being deleted, or gone (`None` for a
    /// cluster-scoped hook or a usable namespace).
    async fn namespace_unusable(
        &self,
        id: &InventoryEntry,
    ) -> Result<Option<String>, ReconcileError> {
        if id.namespace.is_empty() {
            return Ok(None);
        }
        let namespaces = Api::<Namespace>::all(self.cluster.client().clone());
        let namespace =
            namespaces
                .get_opt(&id.namespace)
                .await
                .map_err(|source| ApplyError::Api {
                    object: format!("Namespace {}", id.namespace),
                    source,
                })?;
        Ok(match namespace {
            None => Some(format!("its namespace {} is gone", id.namespace)),
            Some(ns) if ns.metadata.deletion_timestamp.is_some() => {
                Some(format!("its namespace {} is being deleted", id.namespace))
            }
            Some(_) => None,
        })
    }

    /// Counts a delete hook that cannot run as done, with a Warning Event `HookSkipped`.
    async fn skip(
        &self,
        run: &mut HookRun,
        hook: &Hook,
        event: HookEvent,
        why: &str,
    ) -> Result<(), ReconcileError> {
        let note = format!(
            "{} hook {} not run: {why}",
            event.as_str(),
            plan::describe(&hook.object.id)
        );
        tracing::warn!("{note}");
        self.publish_skipped(&note).await?;
        run.completed.push(hook.object.id.clone());
        run.running = None;
        Ok(())
    }

    /// Publishes a Warning Event `HookSkipped` (unless the shard was lost).
    pub(super) async fn publish_skipped(&self, note: &str) -> Result<(), ReconcileError> {
        self.fence.check()?;
        let warning = EventType::Warning;
        publish(self.manifest, self.ctx, warning, "HookSkipped", note).await;
        Ok(())
    }

    /// Adds a hook object to `status.hookObjects` (written at once) unless it is listed.
    async fn record(
        &self,
        hook_objects: &mut Option<Vec<InventoryEntry>>,
        id: &InventoryEntry,
    ) -> Result<(), ReconcileError> {
        let mut list = hook_objects
            .clone()
            .unwrap_or_else(|| self.previous_hook_objects.to_vec());
        if !list.contains(id) {
            list.push(id.clone());
            self.fence.check()?;
            let hook_objects_patch = json!({ "hookObjects": list });
            patch_status(self.manifest, self.ctx, self.fence, hook_objects_patch).await?;
            *hook_objects = Some(list);
        }
        Ok(())
    }

    /// Deletes a hook object (with the protections of any delete) and forgets it unless it is
    /// still terminating. The list is written with the pass's status.
    pub(super) async fn delete(
        &self,
        hook_objects: &mut Option<Vec<InventoryEntry>>,
        id: &InventoryEntry,
    ) -> Result<Deletion, ReconcileError> {
        let outcome = delete_object(
            self.ctx,
            self.cluster,
            self.fence,
            id,
            &self.manifest_namespace,
            &self.uid,
            None,
        )
        .await?;
        if !still_there(&outcome) {
            let mut list = hook_objects
                .clone()
                .unwrap_or_else(|| self.previous_hook_objects.to_vec());
            list.retain(|o| o != id);
            *hook_objects = Some(list);
        }
        Ok(outcome)
    }
}

/// Whether `event` is one of the deletion's hook phases.
fn is_delete(event: HookEvent) -> bool {
    matches!(event, HookEvent::PreDelete | HookEvent::PostDelete)
}

/// Takes over a hook this run started in a pass that could not record it, as the running hook.
fn adopt(
    run: &mut HookRun,
    event: HookEvent,
    id: &InventoryEntry,
    existing: DynamicObject,
) -> DynamicObject {
    tracing::info!(hook = %plan::describe(id), event = event.as_str(), "hook adopted: started by a pass that did not record it");
    let started = existing
        .metadata
        .creation_timestamp
        .clone()
        .unwrap_or_else(|| Time(Timestamp::now()));
    run.running = Some(RunningHook {
        object: id.clone(),
        uid: existing.uid().unwrap_or_default(),
        started,
    });
    existing
}
