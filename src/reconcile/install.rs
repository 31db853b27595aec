//! Install: installs or upgrades the module, one named step after another — render request,
//! hook run, render, pre-hooks, CRDs and discovery, apply, prune, readiness, post-hooks,
//! outcome.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use super::context::Context;
use super::drift_check::DriftCheck;
use super::error::ReconcileError;
use super::hook_runner::{HookScope, PhaseOutcome, prepare_hooks};
use super::inputs::{install_run, render_request, vetted_render};
use super::objects::{DriftPass, apply_all, delete_object};
use super::pass::{
    CRD_ESTABLISH_TIMEOUT, HOOK_REQUEUE, Pass, Progress, STALLED_RECHECK, progress_requeue,
    rolling_out_for,
};
use super::records::Records;
use super::{dependencies, finalizer, rollout, target};
use crate::api::{DriftMode, State};
use crate::api::{HookOperation, HookRun, HookRunPhase, InventoryEntry, Manifest, ManifestStatus};
use crate::apply::adoption::Owners;
use crate::apply::namespace::ensure_namespace;
use crate::apply::{ApplyError, Cluster, FIELD_MANAGER, kind_name};
use crate::plan::drift::IgnoreRules;
use crate::plan::hooks;
use crate::plan::ownership;
use crate::plan::readiness::{Readiness, readiness};
use crate::plan::status::{Facts, Operation, Outcome, Reason};
use crate::plan::{self, Plan, PruneDecision, RenderedObject, Scope};
use crate::render::{RenderRequest, Rendered};
use crate::shard::fence::Fence;

/// Claims the Manifest (finalizer and shard label) if needed, then installs on its target.
pub(super) async fn install(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
    interval: Duration,
    progress: &mut Progress,
) -> Result<Option<Pass>, ReconcileError> {
    let uid = manifest.uid().unwrap_or_default();
    let label = finalizer::shard_label(manifest, ctx);
    if finalizer::needs_claim(manifest, label.as_deref()) {
        finalizer::claim(manifest, ctx, fence, label.as_deref()).await?;
    }
    // Nothing is installed or upgraded before every dependency is Ready.
    if let Some(waiting) = dependencies::wait(manifest, ctx, fence, interval).await? {
        return Ok(Some(waiting));
    }
    // Nor is an upgrade to a new chart before its rollout group's batch admits it.
    if let Some(waiting) = rollout::wait(manifest, ctx).await? {
        return Ok(Some(waiting));
    }
    // The cluster the module goes to: the local one, or the remote target of `spec.target`.
    let (cluster, identity) = target::resolve(manifest, ctx).await?;
    progress.target_identity = identity;
    let adopt = target::adoption(manifest, ctx)?;
    let step = Install {
        manifest,
        ctx,
        cluster: &cluster,
        fence,
        uid,
        interval,
        adopt,
    };
    let result = step.install_on(progress).await;
    target::observe(&cluster, ctx, result)
}

/// The first object of a render that the inventory holds (so its kind was served when it was
/// applied) and whose kind discovery — refreshed — no longer lists: its CRD was deleted.
fn no_longer_served(
    objects: &[RenderedObject],
    inventory: &[InventoryEntry],
    served: impl Fn(&InventoryEntry) -> bool,
) -> Option<ApplyError> {
    // Before namespaces are assigned: an object without one matches its entry in any.
    let recorded = |id: &InventoryEntry| {
        inventory.iter().any(|e| {
            (&e.group, &e.kind, &e.name) == (&id.group, &id.kind, &id.name)
                && (id.namespace.is_empty() || e.namespace == id.namespace)
        })
    };
    let gone = objects.iter().find(|o| !served(&o.id) && recorded(&o.id))?;
    Some(ApplyError::NoLongerServed {
        object: plan::describe(&gone.id),
        kind: kind_name(&gone.id),
    })
}

/// One install pass on one cluster: what every step needs.
struct Install<'a> {
    manifest: &'a Manifest,
    ctx: &'a Context,
    /// The cluster the module goes to (everything but the Manifest, its status and Events,
    /// which stay on the local cluster).
    cluster: &'a Cluster,
    fence: &'a Fence,
    uid: String,
    interval: Duration,
    /// What the pass may take over besides its own objects (`spec.adopt`), if anything.
    adopt: Option<Owners>,
}

/// What the prune step left: the inventory to record and a refusal to show.
struct Pruned {
    inventory: Vec<InventoryEntry>,
    refused: Option<String>,
}

impl Install<'_> {
    /// Installs or upgrades the module on the step's cluster, phase by phase; a step that must
    /// wait (a hook runs) ends the pass with its outcome.
    async fn install_on(&self, progress: &mut Progress) -> Result<Option<Pass>, ReconcileError> {
        let previous = self.manifest.status.clone().unwrap_or_default();
        let mut request = render_request(self.manifest, self.ctx, self.cluster).await?;
        let values_digest = request.values_digest();
        let run = self.hook_run(&previous, &request, &values_digest)?;
        // Helm renders an install as an install: `--is-upgrade` only once the run is an upgrade
        // (also on drift passes after an install, which re-apply what the install applied).
        request.is_upgrade = run.operation == HookOperation::Upgrade;
        let (rendered, mut plan) = self.render(&request).await?;
        let rules = IgnoreRules::parse(&self.manifest.spec.drift_ignore)?;
        let check = self.drift_check(&previous, &rendered)?;
        let mut drift = self.drift_pass(&previous, &rendered, &rules, &check);
        let namespace = request.namespace.as_str();
        if drift.skip_unchanged
            && self.cluster.is_remote()
            && self.makes_namespace(&plan, namespace)
        {
            drift.namespace_on_write = Some(namespace);
        }
        // Recorded from here on: a render that fails does not replace the previous run.
        let run = progress.hook_run.insert(run);
        let scope = self.hook_scope(&previous);
        let hook_objects = &mut progress.hook_objects;
        if let Some(message) = self
            .pre_hooks(&scope, run, hook_objects, &plan, (namespace, &drift))
            .await?
        {
            return Ok(Some(self.waiting(hook_running(message), progress)));
        }
        let mut records = Records {
            inventory: &mut progress.inventory,
            learned: &mut progress.learned_uids,
            run: &*run,
            recorded_run: &mut progress.recorded_run,
        };
        self.crds(&previous, &mut records, &mut plan, namespace, &drift)
            .await?;
        self.resolve_scopes(&mut plan, namespace).await?;
        // Apply, recording the inventory first so that nothing applied can be forgotten; or,
        // while the objects applied last roll out, read them.
        let applied = match self.recheck(&previous, &plan.objects, &drift).await? {
            Some(read) => read,
            None => {
                // The objects are looked at: what the check finds is reported (not after a
                // re-check, nor after the CRD phase alone, which share the check).
                check.begin();
                self.apply(&previous, &mut records, &plan.objects, &drift)
                    .await?
            }
        };
        let changed_inputs = inputs_changed(self.manifest, &previous, &request, &values_digest);
        let pruned = self
            .prune(&previous, plan.inventory(), changed_inputs)
            .await?;
        let now = Timestamp::now();
        // A refused prune outranks readiness (`Ended::state`): nothing to wait for then.
        let applied = match pruned.refused {
            None => self.settle(&previous, applied).await,
            Some(_) => applied,
        };
        let readiness = readiness_of(&applied, Timestamp::now())?;
        let (hook_waiting, finished) = self
            .post_hooks(
                &scope,
                run,
                hook_objects,
                &plan,
                (namespace, &drift),
                readiness.all_ready(),
            )
            .await?;
        let changed = previous.rendered_digest.as_deref() != Some(rendered.digest.as_str())
            || previous.observed_generation != self.manifest.meta().generation
            || finished;
        let ended = Ended {
            pruned,
            readiness,
            hook_waiting,
            operation: changed.then_some(Operation::from(run.operation)),
            wait: self.wait(&previous, &rendered, now),
        };
        let mut digests = digests(&request, &rendered, values_digest);
        digests.drift = check.condition(drift.changed);
        Ok(Some(self.outcome(&previous, ended, digests, progress)))
    }

    /// How this pass applies: `changed` when the render or the spec changed since the last
    /// pass; skipping unchanged objects when nothing changed, the module was Ready and no pass
    /// was asked for (`requestedAt`, `resetAt`: a pass asked for applies everything).
    fn drift_pass<'r>(
        &'r self,
        previous: &ManifestStatus,
        rendered: &Rendered,
        rules: &'r IgnoreRules,
        check: &'r DriftCheck,
    ) -> DriftPass<'r> {
        let changed = self.render_changed(previous, rendered);
        let asked = crate::plan::trigger::Requests::of(self.manifest) != Default::default();
        let ready = previous.state == Some(State::Ready);
        DriftPass {
            rules,
            changed,
            skip_unchanged: !changed && !asked && ready,
            check,
            idle: !changed && !asked && ready && check.mode == DriftMode::Disabled,
            namespace_on_write: None,
            adopt: self.adopt.as_ref(),
        }
    }

    /// Whether the render or the spec changed since the last pass that applied everything.
    fn render_changed(&self, previous: &ManifestStatus, rendered: &Rendered) -> bool {
        previous.rendered_digest.as_deref() != Some(rendered.digest.as_str())
            || previous.applied_generation != self.manifest.meta().generation
    }

    /// `spec.drift` for this pass: the managers to override (the operator's and the
    /// Manifest's, checked), and whether it checks for drift — a drift pass (nothing changed)
    /// in `warn` mode, or in `enabled` mode one of the timer's (not asked for, over a Ready
    /// module: a pass asked for repairs as before, without a report).
    fn drift_check(
        &self,
        previous: &ManifestStatus,
        rendered: &Rendered,
    ) -> Result<DriftCheck, ReconcileError> {
        let spec = &self.manifest.spec.drift;
        let reserved = [FIELD_MANAGER, crate::plan::drift::HANDOVER_MANAGER];
        let managers = crate::plan::drift_report::override_managers(
            &self.ctx.drift_override_managers,
            &spec.override_managers,
            &reserved,
        )?;
        let drift_pass = !self.render_changed(previous, rendered);
        let asked = crate::plan::trigger::Requests::of(self.manifest) != Default::default();
        let timer = !asked && previous.state == Some(State::Ready);
        let active = crate::plan::drift_report::checks(spec.mode, drift_pass, timer);
        Ok(DriftCheck::new(spec.mode, managers, drift_pass, active))
    }

    /// The hook run this pass works on: an install until something was applied, then upgrades;
    /// a run belongs to the chart, values, release and namespace it started with. A failed run
    /// stays failed until the spec or the inputs change: nothing is applied meanwhile.
    fn hook_run(
        &self,
        previous: &ManifestStatus,
        request: &RenderRequest,
        values_digest: &str,
    ) -> Result<HookRun, ReconcileError> {
        let run = install_run(self.manifest, previous, request, values_digest);
        if run.phase == HookRunPhase::Failed {
            return Err(ReconcileError::HookFailed(
                run.message.clone().unwrap_or_default(),
            ));
        }
        Ok(run)
    }

    /// Renders (cached), plans and vets the chart ([`vetted_render`]), and refuses a render
    /// over the caps (`--max-objects-per-render`, `--max-inventory-bytes`) before anything of
    /// it is recorded. Installs only: a deletion's hooks are never refused by a cap lowered
    /// since the install.
    async fn render(
        &self,
        request: &RenderRequest,
    ) -> Result<(Arc<Rendered>, Plan), ReconcileError> {
        let (rendered, plan) =
            vetted_render(self.manifest, self.ctx, self.cluster, request).await?;
        let status = self.manifest.status.clone().unwrap_or_default();
        let limits = self.ctx.pass_limits.plan;
        let (previous, hooks) = (&status.inventory, &status.hook_objects);
        let stamped = self.cluster.is_remote();
        plan::check_limits(&plan, previous, hooks, limits, stamped)?;
        Ok((rendered, plan))
    }

    fn hook_scope<'s>(&'s self, previous: &'s ManifestStatus) -> HookScope<'s> {
        HookScope {
            manifest: self.manifest,
            ctx: self.ctx,
            cluster: self.cluster,
            fence: self.fence,
            uid: self.uid.clone(),
            manifest_namespace: self.manifest.namespace().unwrap_or_default(),
            previous_hook_objects: &previous.hook_objects,
        }
    }

    /// Pre-install or pre-upgrade hooks, before anything of this render is applied (the target
    /// namespace is made first when they need it, and when this pass makes it, unless `drift`
    /// makes it only before a write: [`DriftPass::namespace_on_write`]). A Job that runs ends
    /// the pass (`Some(message)`); the next one continues from `status.hookRun`. The phase
    /// moves on (and is saved) when its hooks are done.
    async fn pre_hooks(
        &self,
        scope: &HookScope<'_>,
        run: &mut HookRun,
        hook_objects: &mut Option<Vec<InventoryEntry>>,
        plan: &Plan,
        (namespace, drift): (&str, &DriftPass<'_>),
    ) -> Result<Option<String>, ReconcileError> {
        let event = match hooks::event(run.operation, run.phase) {
            Some(event) if run.phase == HookRunPhase::PreHooks => Some(event),
            _ => None,
        };
        let pre_hooks = match event {
            Some(event) => prepare_hooks(self.cluster, &plan.hooks, event, namespace).await?,
            None => Vec::new(),
        };
        let hooks_need_it = !pre_hooks.is_empty() && !self.own_namespace(namespace);
        let now = drift.namespace_on_write.is_none() && self.makes_namespace(plan, namespace);
        if hooks_need_it || now {
            self.fence.check()?;
            ensure_namespace(self.cluster, namespace, &self.uid).await?;
        }
        let Some(event) = event else {
            return Ok(None);
        };
        match scope
            .run_phase(run, hook_objects, &pre_hooks, event)
            .await?
        {
            PhaseOutcome::Waiting(message) => Ok(Some(message)),
            PhaseOutcome::Done => Ok(None),
        }
    }

    /// Whether this pass makes the target namespace: not the Manifest's own on the local
    /// cluster, which exists (the Manifest is in it), nor one the chart brings (applied first,
    /// in install order; pre-hooks that run before it get it made, with the Manifest's label, so
    /// the chart's Namespace object may take it over).
    fn makes_namespace(&self, plan: &Plan, namespace: &str) -> bool {
        let chart_brings_it = plan
            .objects
            .iter()
            .any(|o| o.id.kind == "Namespace" && o.id.group.is_empty() && o.id.name == namespace);
        !self.own_namespace(namespace) && !chart_brings_it
    }

    /// Whether `namespace` is the Manifest's own on the local cluster.
    fn own_namespace(&self, namespace: &str) -> bool {
        self.manifest.spec.target.is_none()
            && self.manifest.namespace().as_deref() == Some(namespace)
    }

    /// CRDs first: apply, wait for Established (those applied).
    async fn crds(
        &self,
        previous: &ManifestStatus,
        records: &mut Records<'_>,
        plan: &mut Plan,
        namespace: &str,
        drift: &DriftPass<'_>,
    ) -> Result<(), ReconcileError> {
        plan::assign_namespaces(&mut plan.crds, namespace, |_| Some(Scope::Cluster))?;
        let applied = self.apply(previous, records, &plan.crds, drift).await?;
        // CRDs a drift pass did not apply are unchanged since the Ready pass: Established.
        if !applied.is_empty() {
            let names: Vec<String> = applied.iter().map(|(id, _)| id.name.clone()).collect();
            self.cluster
                .wait_established(&names, CRD_ESTABLISH_TIMEOUT)
                .await?;
        }
        Ok(())
    }

    /// Kinds discovery does not know yet (from these CRDs, or installed since by someone else):
    /// refresh. The API server publishes a new CRD's group in discovery shortly *after* the CRD
    /// is Established, so kinds of this chart's own CRDs are waited for a little. Then every
    /// object gets its namespace by its kind's scope.
    async fn resolve_scopes(&self, plan: &mut Plan, namespace: &str) -> Result<(), ReconcileError> {
        let cluster = self.cluster;
        let unknown = |o: &&RenderedObject| cluster.surface().resolve(&o.id).is_none();
        if plan.objects.iter().any(|o| unknown(&o)) {
            cluster.refresh_discovery().await?;
            let crd_groups: Vec<&str> = plan
                .crds
                .iter()
                .filter_map(|c| c.body.pointer("/spec/group")?.as_str())
                .collect();
            let deadline = tokio::time::Instant::now() + CRD_ESTABLISH_TIMEOUT;
            while plan
                .objects
                .iter()
                .filter(unknown)
                .any(|o| crd_groups.contains(&o.id.group.as_str()))
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
                cluster.refresh_discovery().await?;
            }
        }
        let surface = cluster.surface();
        let inventory = self.manifest.status.as_ref().map(|s| &s.inventory[..]);
        let served = |id: &InventoryEntry| surface.resolve(id).is_some();
        if let Some(gone) = no_longer_served(&plan.objects, inventory.unwrap_or_default(), served) {
            return Err(gone.into());
        }
        plan::assign_namespaces(&mut plan.objects, namespace, |id| {
            surface.resolve(id).map(|(_, scope)| *scope)
        })?;
        Ok(())
    }

    /// Applies `objects` (recorded in the inventory first, the UIDs learned after); returns them
    /// as the server did.
    async fn apply(
        &self,
        previous: &ManifestStatus,
        records: &mut Records<'_>,
        objects: &[RenderedObject],
        drift: &DriftPass<'_>,
    ) -> Result<Vec<(InventoryEntry, DynamicObject)>, ReconcileError> {
        let (manifest, ctx, cluster, fence) = (self.manifest, self.ctx, self.cluster, self.fence);
        let applied = apply_all(
            manifest, ctx, cluster, fence, previous, records, objects, drift,
        )
        .await?;
        tracing::debug!(objects = applied.len(), "applied");
        Ok(applied)
    }

    /// A progress re-check: the last pass applied this render of this generation and found
    /// objects rolling out, less than `spec.interval` ago (the wait's start), and no pass was
    /// asked for (`requestedAt`, `resetAt`). The objects are read instead of applied again —
    /// one GET per object whose readiness can still change
    /// ([`plan::readiness::settled_once_applied`]: none for ConfigMaps, Services …). `None`:
    /// apply (not a re-check, or an object is gone: the apply re-creates it). Drift is repaired
    /// as before by the passes that apply: the first of each render, every pass once the
    /// rollout has taken longer than the interval, the drift passes, the requested ones.
    async fn recheck(
        &self,
        previous: &ManifestStatus,
        objects: &[RenderedObject],
        drift: &DriftPass<'_>,
    ) -> Result<Option<Vec<(InventoryEntry, DynamicObject)>>, ReconcileError> {
        let rolling_out = plan::status::rolling_out(Some(previous));
        let requests = crate::plan::trigger::Requests::of(self.manifest);
        let within_interval = previous.readiness_started.as_ref().is_some_and(|started| {
            let waited = Timestamp::now().duration_since(started.0);
            waited < k8s_openapi::jiff::SignedDuration::try_from(self.interval).unwrap_or_default()
        });
        if !rolling_out || !within_interval || drift.changed || requests != Default::default() {
            return Ok(None);
        }
        let mut read = Vec::new();
        for object in objects {
            if plan::readiness::settled_once_applied(&object.id) {
                continue;
            }
            let recorded = previous
                .inventory_uids
                .get(&crate::plan::ownership::uid_key(&object.id));
            match self.cluster.get(&object.id).await? {
                // Another object under the name (deleted and created again by someone else):
                // not ours to call ready; the guarded apply reports it.
                Some(live) if recorded.is_some() && live.metadata.uid.as_ref() != recorded => {
                    return Ok(None);
                }
                Some(live) => read.push((object.id.clone(), live)),
                None => return Ok(None),
            }
        }
        tracing::debug!(objects = read.len(), "rolling out: read, not applied");
        Ok(Some(read))
    }

    /// The rollout wait inside the pass (docs/reconcile.md, "The rollout wait inside the
    /// pass"): a pass that has just applied objects which roll out, and nothing failed, looks at
    /// those objects again a few times ([`plan::readiness::next_look`]: at most
    /// [`plan::readiness::SETTLE_WAIT`], none while other keys are due) before it decides, so
    /// that workloads ready within it cost one status write (`Ready`), not `Processing` and
    /// then `Ready`. One GET per waiting object per look, each cut off at the wait's end (a
    /// slow remote target holds the worker no longer); a look that fails, takes too long, or
    /// finds an object gone or replaced, ends the wait (the pass decides from what it has; the
    /// next pass sees the rest). Passes that look at a rollout already under way do not wait:
    /// they are requeued ([`super::progress_requeue`]).
    async fn settle(
        &self,
        previous: &ManifestStatus,
        mut applied: Vec<(InventoryEntry, DynamicObject)>,
    ) -> Vec<(InventoryEntry, DynamicObject)> {
        if plan::status::rolling_out(Some(previous)) {
            return applied;
        }
        let started = tokio::time::Instant::now();
        let deadline = started + plan::readiness::SETTLE_WAIT;
        let mut looks = 0;
        loop {
            let waiting = still_waiting(&applied, Timestamp::now());
            let others_due = self.ctx.queue.get().0 > 0;
            let pause = plan::readiness::next_look(started.elapsed(), looks, others_due);
            let (false, Some(pause)) = (waiting.is_empty(), pause) else {
                return applied;
            };
            tokio::time::sleep(pause).await;
            looks += 1;
            for i in waiting {
                let (id, object) = &applied[i];
                match tokio::time::timeout_at(deadline, self.cluster.get(id)).await {
                    Ok(Ok(Some(live))) if live.metadata.uid == object.metadata.uid => {
                        applied[i].1 = live;
                    }
                    _ => return applied,
                }
            }
            tracing::debug!(looks, "rolling out: looked again within the pass");
        }
    }

    /// Prunes what the new render lacks, unless the guard refuses: refused objects stay on the
    /// cluster and in the inventory.
    async fn prune(
        &self,
        previous: &ManifestStatus,
        inventory: Vec<InventoryEntry>,
        inputs_changed: bool,
    ) -> Result<Pruned, ReconcileError> {
        let gone = plan::to_prune(&previous.inventory, &inventory);
        let mut pruned = Pruned {
            inventory: inventory.clone(),
            refused: None,
        };
        match plan::guard_prune(gone.clone(), inventory.len(), inputs_changed) {
            PruneDecision::Prune(gone) => {
                let manifest_namespace = self.manifest.namespace().unwrap_or_default();
                for id in &gone {
                    let (ctx, cluster, fence) = (self.ctx, self.cluster, self.fence);
                    let recorded = previous.inventory_uids.get(&ownership::uid_key(id));
                    let (namespace, uid) = (&manifest_namespace, &self.uid);
                    let recorded = recorded.map(String::as_str);
                    delete_object(ctx, cluster, fence, id, namespace, uid, recorded).await?;
                }
            }
            PruneDecision::Refuse(reason) => {
                pruned.inventory.extend(gone);
                pruned.refused = Some(reason);
            }
        }
        Ok(pruned)
    }

    /// Post-install or post-upgrade hooks, once every object is `ready`: `Some(message)` while
    /// one runs, and whether the run finished in this pass.
    async fn post_hooks(
        &self,
        scope: &HookScope<'_>,
        run: &mut HookRun,
        hook_objects: &mut Option<Vec<InventoryEntry>>,
        plan: &Plan,
        (namespace, drift): (&str, &DriftPass<'_>),
        ready: bool,
    ) -> Result<(Option<String>, bool), ReconcileError> {
        let was_done = run.phase == HookRunPhase::Done;
        let mut waiting = None;
        if ready {
            if run.phase == HookRunPhase::Objects {
                hooks::advance(run);
            }
            if let Some(event) = hooks::event(run.operation, run.phase) {
                let post_hooks = prepare_hooks(self.cluster, &plan.hooks, event, namespace).await?;
                // A drift pass that wrote nothing into the namespace has not made it.
                if !post_hooks.is_empty() && drift.namespace_on_write.is_some() {
                    self.fence.check()?;
                    ensure_namespace(self.cluster, namespace, &self.uid).await?;
                }
                if let PhaseOutcome::Waiting(message) = scope
                    .run_phase(run, hook_objects, &post_hooks, event)
                    .await?
                {
                    waiting = Some(message);
                }
            }
        }
        Ok((waiting, !was_done && run.phase == HookRunPhase::Done))
    }

    /// The wait for the objects' readiness: it began with the first apply of this generation's
    /// render (kept in the status, so a new owner does not restart it).
    fn wait(&self, previous: &ManifestStatus, rendered: &Rendered, now: Timestamp) -> Wait {
        let same_render = previous.applied_generation == self.manifest.meta().generation
            && previous.rendered_digest.as_deref() == Some(rendered.digest.as_str());
        let started = previous.readiness_started.as_ref();
        Wait {
            started: plan::readiness::wait_started(started, same_render, now),
            now,
            timeout: crate::api::timeout(&self.manifest.spec),
        }
    }

    /// A pass that waits for a hook, before anything of this render was applied.
    fn waiting(&self, outcome: Outcome, progress: &Progress) -> Pass {
        Pass {
            outcome,
            facts: progress.facts(),
            requeue: HOOK_REQUEUE,
        }
    }

    /// The pass's outcome and facts once everything was applied.
    fn outcome(
        &self,
        previous: &ManifestStatus,
        ended: Ended,
        digests: Facts,
        progress: &Progress,
    ) -> Pass {
        let verdict = ended.state(previous, self.interval);
        let mut requeue = verdict.requeue;
        if ended.hook_waiting.is_some() {
            requeue = requeue.min(HOOK_REQUEUE); // also while a prune refusal is shown
        }
        let outcome = verdict.outcome(ended.operation);
        // The wait's start is kept while objects are not ready, cleared once they all are.
        let started = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ended.wait.started);
        let readiness_started = (!ended.readiness.all_ready()).then_some(started);
        let applied_stamps = match self.cluster.applied() {
            Some(applied) => applied.stamps(&ended.pruned.inventory),
            None => Default::default(),
        };
        let facts = Facts {
            applied_generation: self.manifest.meta().generation,
            applied_stamps,
            inventory: Some(ended.pruned.inventory),
            learned_uids: progress.learned_uids.clone(),
            target_identity: progress.target_identity.clone(),
            hook_run: progress.hook_run.clone(),
            hook_objects: progress.hook_objects.clone(),
            readiness_started: Some(readiness_started),
            ..digests
        };
        Pass {
            outcome,
            facts,
            requeue,
        }
    }
}

/// What the steps after the apply found.
struct Ended {
    pruned: Pruned,
    /// The applied objects that are not ready, or failed.
    readiness: NotReady,
    /// A post-hook that runs.
    hook_waiting: Option<String>,
    /// The operation to record, when the pass changed something.
    operation: Option<Operation>,
    /// The readiness deadline.
    wait: Wait,
}

/// The wait for the objects' readiness: since when, now, and for how long at most.
struct Wait {
    started: Timestamp,
    now: Timestamp,
    timeout: Duration,
}

/// How a pass that applied everything ends.
struct Verdict {
    state: State,
    reason: Reason,
    message: String,
    stalled: bool,
    requeue: Duration,
}

impl Verdict {
    /// The outcome of a pass that rendered and applied everything.
    fn outcome(self, operation: Option<Operation>) -> Outcome {
        Outcome {
            state: self.state,
            reason: self.reason,
            message: self.message,
            rendered: Some(true),
            applied: Some(true),
            stalled: self.stalled,
            operation,
        }
    }
}

impl Ended {
    /// The verdict of a pass that applied everything: a refused prune and failed objects
    /// stall; objects not ready wait until `spec.timeout`, then stall; hooks run; else ready.
    fn state(&self, previous: &ManifestStatus, interval: Duration) -> Verdict {
        let verdict = |state, reason, message, stalled, requeue| Verdict {
            state,
            reason,
            message,
            stalled,
            requeue,
        };
        let waiting = &self.readiness.waiting;
        if let Some(refusal) = &self.pruned.refused {
            // Nothing changes until someone looks at it: stalled, as kstatus must read it.
            let message = refusal.clone();
            verdict(
                State::Warning,
                Reason::PruneRefused,
                message,
                true,
                interval,
            )
        } else if !self.readiness.failed.is_empty() {
            let message = format!("failed: {}", plan::readiness::list(&self.readiness.failed));
            let requeue = interval.min(STALLED_RECHECK);
            verdict(State::Error, Reason::ObjectFailed, message, true, requeue)
        } else if !waiting.is_empty()
            && plan::readiness::deadline_passed(self.wait.started, self.wait.now, self.wait.timeout)
        {
            let timeout = self.wait.timeout;
            let list = plan::readiness::list(waiting);
            let message = format!("not ready within the timeout ({timeout:?}): {list}");
            verdict(
                State::Error,
                Reason::ReadinessTimeout,
                message,
                true,
                interval.min(STALLED_RECHECK),
            )
        } else if let Some(first) = waiting.first() {
            let message = format!(
                "waiting for {}: {first}",
                plan::counted(waiting.len(), "object")
            );
            let requeue = progress_requeue(rolling_out_for(previous, self.wait.now));
            verdict(
                State::Processing,
                Reason::Progressing,
                message,
                false,
                requeue,
            )
        } else if let Some(message) = self.hook_waiting.clone() {
            verdict(
                State::Processing,
                Reason::HookRunning,
                message,
                false,
                HOOK_REQUEUE,
            )
        } else {
            let message = format!(
                "{} applied and ready",
                plan::counted(self.pruned.inventory.len(), "object")
            );
            verdict(State::Ready, Reason::Ready, message, false, interval)
        }
    }
}

/// Whether a render input a person controls — the chart, the values, the release name, the
/// target namespace — changed since the last completed apply: what lets the mass-prune guard
/// let objects go. When the recorded run is done (`status.hookRun`, phase `Done`: its inputs
/// are those of the last completed apply), its inputs digest ([`hooks::inputs_digest`])
/// decides, and any other spec edit (the interval, `suspend`, `driftIgnore`, a label) does
/// not: a render that lost objects through a capability flip stays refused whatever else is
/// edited. While a run is under way (its digest is recorded with the inventory or a hook's
/// progress before the apply completes) or none is recorded, the digests written by the last
/// completed pass and the generation decide, as before.
pub(super) fn inputs_changed(
    manifest: &Manifest,
    previous: &ManifestStatus,
    request: &RenderRequest,
    values_digest: &str,
) -> bool {
    let now = hooks::inputs_digest(
        &request.chart.digest,
        values_digest,
        &request.release,
        &request.namespace,
    );
    changed_since_run(previous, &now, || {
        previous.chart_digest.as_deref() != Some(request.chart.digest.as_str())
            || previous.values_digest.as_deref() != Some(values_digest)
            || previous.applied_generation != manifest.meta().generation
    })
}

/// [`inputs_changed`]'s rule (pure): a done run's inputs digest against `now`, or
/// `otherwise` when no run is done.
fn changed_since_run(
    previous: &ManifestStatus,
    now: &str,
    otherwise: impl FnOnce() -> bool,
) -> bool {
    match &previous.hook_run {
        Some(run) if run.phase == HookRunPhase::Done => run.inputs_digest != now,
        _ => otherwise(),
    }
}

/// The applied objects that are not ready, as their readiness says why.
struct NotReady {
    waiting: Vec<String>,
    failed: Vec<String>,
}

impl NotReady {
    fn all_ready(&self) -> bool {
        self.waiting.is_empty() && self.failed.is_empty()
    }
}

/// Readiness, from the objects as the server returned them: why each waits or failed; a
/// failed Job fails the pass.
fn readiness_of(
    applied: &[(InventoryEntry, DynamicObject)],
    now: Timestamp,
) -> Result<NotReady, ReconcileError> {
    let mut not_ready = NotReady {
        waiting: Vec::new(),
        failed: Vec::new(),
    };
    for (id, object) in applied {
        let body = serde_json::to_value(object).unwrap_or(Value::Null);
        match readiness(id, &body, now) {
            Readiness::Ready => {}
            Readiness::Waiting(why) => not_ready.waiting.push(why),
            Readiness::Failed(why) if (id.group.as_str(), id.kind.as_str()) == ("batch", "Job") => {
                return Err(ReconcileError::JobFailed(why));
            }
            Readiness::Failed(why) => not_ready.failed.push(why),
        }
    }
    Ok(not_ready)
}

/// The applied objects that still wait (their indices), or none when one failed (the pass
/// reports it at once).
fn still_waiting(applied: &[(InventoryEntry, DynamicObject)], now: Timestamp) -> Vec<usize> {
    let mut waiting = Vec::new();
    for (i, (id, object)) in applied.iter().enumerate() {
        let body = serde_json::to_value(object).unwrap_or(Value::Null);
        match readiness(id, &body, now) {
            Readiness::Ready => {}
            Readiness::Waiting(_) => waiting.push(i),
            Readiness::Failed(_) => return Vec::new(),
        }
    }
    waiting
}

/// The digests a pass that rendered and applied records.
fn digests(request: &RenderRequest, rendered: &Rendered, values_digest: String) -> Facts {
    Facts {
        chart_digest: Some(request.chart.digest.clone()),
        rendered_digest: Some(rendered.digest.clone()),
        values_digest: Some(values_digest),
        ..Default::default()
    }
}

/// The outcome of a pass that waits for a pre-hook.
fn hook_running(message: String) -> Outcome {
    Outcome {
        state: State::Processing,
        reason: Reason::HookRunning,
        message,
        rendered: Some(true),
        applied: None,
        stalled: false,
        operation: None,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::error_outcome;
    use super::*;
    use crate::plan::PlanError;

    /// Review 2026-12-01 item 10: an edit of the spec that changes no render input (the
    /// interval, `suspend`, `driftIgnore`) used to count as a changed input (the generation
    /// moved), lifting the mass-prune guard for a render that lost objects through a capability
    /// flip. Only the chart, the values, the release and the namespace count.
    #[test]
    fn only_a_changed_render_input_lets_the_mass_prune_guard_go() {
        let inputs = hooks::inputs_digest("sha256:chart", "sha256:values", "web", "apps");
        let recorded = ManifestStatus {
            hook_run: Some(crate::api::HookRun {
                operation: crate::api::HookOperation::Upgrade,
                inputs_digest: inputs.clone(),
                generation: Some(1),
                id: "run-1".into(),
                phase: HookRunPhase::Done,
                completed: Vec::new(),
                running: None,
                message: None,
            }),
            ..Default::default()
        };
        // The spec's generation moved (an interval edit), the inputs did not.
        let generation_moved = || true;
        assert!(!changed_since_run(&recorded, &inputs, generation_moved));
        for other in [
            hooks::inputs_digest("sha256:chart2", "sha256:values", "web", "apps"),
            hooks::inputs_digest("sha256:chart", "sha256:values2", "web", "apps"),
            hooks::inputs_digest("sha256:chart", "sha256:values", "web2", "apps"),
            hooks::inputs_digest("sha256:chart", "sha256:values", "web", "apps2"),
        ] {
            assert!(changed_since_run(&recorded, &other, || false));
        }
        // No run recorded: the old rule (chart, values or generation).
        let unrecorded = ManifestStatus::default();
        assert!(changed_since_run(&unrecorded, &inputs, generation_moved));
        assert!(!changed_since_run(&unrecorded, &inputs, || false));
        // A run under way (recorded before its apply completed: a pre-hook runs, or the pass
        // failed after the render) says nothing of the last completed apply: the old rule.
        let mut under_way = recorded.clone();
        if let Some(run) = under_way.hook_run.as_mut() {
            run.phase = HookRunPhase::PreHooks;
        }
        let values_changed = || true;
        assert!(changed_since_run(&under_way, &inputs, values_changed));
        assert!(!changed_since_run(&under_way, &inputs, || false));
    }

    #[test]
    fn an_inventory_object_of_a_kind_not_served_any_more_is_named_with_its_kind() {
        let id = |group: &str, kind: &str, namespace: &str, name: &str| InventoryEntry {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        let object = |id: InventoryEntry| RenderedObject {
            id,
            body: Value::Null,
        };
        let rendered = [
            object(id("", "ConfigMap", "", "c")),
            object(id("example.com", "Doodad", "", "d")),
        ];
        let inventory = [
            id("", "ConfigMap", "ns", "c"),
            id("example.com", "Doodad", "ns", "d"),
        ];
        let not_doodads = |i: &InventoryEntry| i.kind != "Doodad";
        let gone = no_longer_served(&rendered, &inventory, not_doodads).unwrap();
        assert_eq!(
            gone.to_string(),
            "Doodad/d: kind Doodad.example.com/v1 is no longer served (its CRD was deleted?)"
        );
        // Every kind served; or the object is new (its kind may come with a CRD later).
        assert!(no_longer_served(&rendered, &inventory, |_| true).is_none());
        assert!(no_longer_served(&rendered, &inventory[..1], not_doodads).is_none());
        // Recorded in another namespace than the one the render names: another object.
        let elsewhere = [object(id("example.com", "Doodad", "other", "d"))];
        assert!(no_longer_served(&elsewhere, &inventory, not_doodads).is_none());
    }
    use crate::plan::status::{Facts, PROGRESSING_WITH_RETRY, next_status};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::SignedDuration;
    use serde_json::json;

    /// kstatus' answers that matter to a user (`Terminating` reads as in progress).
    #[derive(Debug, PartialEq)]
    pub(in crate::reconcile) enum Kstatus {
        Current,
        InProgress,
        Failed,
    }

    /// kstatus' `Compute` over a Manifest, through its port in `plan::readiness`: the generic
    /// properties (deletion, observedGeneration, Reconciling, Stalled), then `Ready`.
    fn kstatus(manifest: &Value) -> Kstatus {
        let id = InventoryEntry {
            group: "modulemanager.io".into(),
            version: "v1alpha1".into(),
            kind: "Manifest".into(),
            namespace: "ns".into(),
            name: "m".into(),
        };
        match readiness(&id, manifest, Timestamp::now()) {
            Readiness::Ready => Kstatus::Current,
            Readiness::Waiting(_) => Kstatus::InProgress,
            Readiness::Failed(_) => Kstatus::Failed,
        }
    }

    /// What the steps after an apply found, waiting `waited` seconds of a 300 s timeout.
    fn ended(
        refused: Option<&str>,
        not_ready: [&[&str]; 2],
        hook: Option<&str>,
        waited: i64,
    ) -> Ended {
        let now = Timestamp::now();
        let strings = |list: &[&str]| list.iter().map(ToString::to_string).collect();
        Ended {
            pruned: Pruned {
                inventory: Vec::new(),
                refused: refused.map(Into::into),
            },
            readiness: NotReady {
                waiting: strings(not_ready[0]),
                failed: strings(not_ready[1]),
            },
            hook_waiting: hook.map(Into::into),
            operation: Some(Operation::Upgrade),
            wait: Wait {
                started: now - SignedDuration::from_secs(waited),
                now,
                timeout: Duration::from_secs(300),
            },
        }
    }

    fn applied(ended: &Ended) -> Outcome {
        let previous = ManifestStatus::default();
        ended
            .state(&previous, Duration::from_secs(600))
            .outcome(ended.operation)
    }

    /// The status after a pass with `outcome` over `previous`.
    pub(in crate::reconcile) fn after(
        previous: Option<&ManifestStatus>,
        generation: i64,
        outcome: &Outcome,
    ) -> ManifestStatus {
        let now = Time(Timestamp::now());
        next_status(
            previous,
            Some(generation),
            outcome,
            Facts::default(),
            None,
            "r0",
            &now,
        )
    }

    fn condition<'a>(status: &'a ManifestStatus, kind: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == kind).unwrap()
    }

    /// Every state the pipeline can end a pass in, from its own outcome functions, with what
    /// kstatus must read.
    pub(in crate::reconcile) fn pipeline_states() -> Vec<(&'static str, Outcome, Kstatus)> {
        let waiting: &[&str] = &["Deployment web: 0 of 1 replicas"];
        let transient = error_outcome(
            &ReconcileError::ValuesSourceMissing("ConfigMap v does not exist".into()),
            Operation::Upgrade,
        );
        let permanent = error_outcome(
            &ReconcileError::Plan(PlanError::Duplicate("Secret/s".into())),
            Operation::Install,
        );
        let job = error_outcome(
            &ReconcileError::JobFailed("Job j: failed".into()),
            Operation::Upgrade,
        );
        // As `delete.rs` writes it while objects are being deleted.
        let deleting = Outcome {
            state: State::Deleting,
            reason: Reason::Deleting,
            message: "waiting for 2 objects to be deleted".into(),
            rendered: None,
            applied: None,
            stalled: false,
            operation: None,
        };
        let failed: &[&str] = &["Deployment web: progress deadline exceeded"];
        let mut states = dependency_states();
        states.extend(vec![
            (
                "ready",
                applied(&ended(None, [&[], &[]], None, 0)),
                Kstatus::Current,
            ),
            (
                "rolling out",
                applied(&ended(None, [waiting, &[]], None, 10)),
                Kstatus::InProgress,
            ),
            (
                "post-hook running",
                applied(&ended(None, [&[], &[]], Some("Job m runs"), 0)),
                Kstatus::InProgress,
            ),
            (
                "prune refused (Warning)",
                applied(&ended(Some("would delete 3 of 4"), [&[], &[]], None, 0)),
                Kstatus::Failed,
            ),
            (
                "an object failed",
                applied(&ended(None, [&[], failed], None, 0)),
                Kstatus::Failed,
            ),
            (
                "readiness deadline passed",
                applied(&ended(None, [waiting, &[]], None, 301)),
                Kstatus::Failed,
            ),
            ("transient error, retried", transient, Kstatus::InProgress),
            ("permanent error", permanent, Kstatus::Failed),
            ("a Job failed", job, Kstatus::Failed),
            ("deleting", deleting, Kstatus::InProgress),
        ]);
        states
    }

    /// The states of `dependsOn`: waiting for a dependency, a cycle, a deletion waiting for
    /// its dependents.
    fn dependency_states() -> Vec<(&'static str, Outcome, Kstatus)> {
        let cycle = error_outcome(
            &ReconcileError::Dependency(crate::plan::dependencies::DependencyError::Cycle(
                "a/x → a/y → a/x".into(),
            )),
            Operation::Install,
        );
        vec![
            (
                "waiting for a dependency",
                Outcome::waiting(
                    State::Processing,
                    Reason::DependencyNotReady,
                    "waiting: dependency a/db is not found".into(),
                ),
                Kstatus::InProgress,
            ),
            ("a dependency cycle", cycle, Kstatus::Failed),
            (
                "a deletion waiting for its dependents",
                Outcome::waiting(
                    State::Deleting,
                    Reason::DependentsExist,
                    "waiting for the Manifests that depend on this one to be deleted first: a/b"
                        .into(),
                ),
                Kstatus::InProgress,
            ),
            (
                "an upgrade held by its rollout group's halted rollout",
                Outcome::waiting(
                    State::Processing,
                    Reason::RolloutPaused,
                    "the rollout is paused: batch 1: 10 of 10 failed (m1, m2)".into(),
                ),
                Kstatus::InProgress,
            ),
            (
                "a deletion waiting for its turn under the fleet's cap",
                Outcome::waiting(
                    State::Deleting,
                    Reason::DeletionRateLimited,
                    "waiting for its turn under the fleet's cap of 60 module deletions a minute"
                        .into(),
                ),
                Kstatus::InProgress,
            ),
        ]
    }

    #[test]
    fn kstatus_reads_every_state_of_the_pipeline_as_a_user_expects() {
        for (what, outcome, want) in pipeline_states() {
            let status = after(None, 3, &outcome);
            let mut manifest = json!({"metadata": {"generation": 3}, "status": status});
            if outcome.state == State::Deleting {
                manifest["metadata"]["deletionTimestamp"] = json!("2026-12-01T12:00:00Z");
            }
            assert_eq!(kstatus(&manifest), want, "{what}: {status:#?}");
            // The abnormal-true conditions decide alone (the `Ready` fallback is newer in
            // kstatus and has its caveats, `status.go`): the same without `Ready`.
            let mut without_ready = manifest.clone();
            let conditions = without_ready["status"]["conditions"]
                .as_array_mut()
                .unwrap();
            conditions.retain(|c| c["type"] != "Ready");
            assert_eq!(
                kstatus(&without_ready),
                want,
                "{what}, by Reconciling/Stalled"
            );
            // `kubectl wait --for=condition=Ready` returns exactly when kstatus says Current.
            let ready = condition(&status, "Ready").status == "True";
            assert_eq!(ready, want == Kstatus::Current, "{what}");
            assert!(
                status
                    .conditions
                    .iter()
                    .all(|c| c.observed_generation == Some(3)),
                "{what}: every condition names the generation it describes"
            );
            let both =
                ["Reconciling", "Stalled"].map(|kind| condition(&status, kind).status == "True");
            assert_ne!(
                both,
                [true, true],
                "{what}: never both in progress and stalled"
            );
            assert!(!condition(&status, "Ready").message.is_empty(), "{what}");
        }
    }

    #[test]
    fn a_manifest_no_pass_wrote_yet_is_in_progress() {
        // The CRD's default status, as the API server serves a new Manifest.
        let created = json!({"metadata": {"generation": 1},
            "status": {"observedGeneration": crate::api::NOT_OBSERVED}});
        assert_eq!(kstatus(&created), Kstatus::InProgress);
        // Without it kstatus would read it Current: no conditions, nothing to compare.
        assert_eq!(
            kstatus(&json!({"metadata": {"generation": 1}})),
            Kstatus::Current
        );
        // The inventory record (before the applies) keeps the default; the first status
        // written replaces it.
        let recorded = json!({"metadata": {"generation": 1}, "status": {
            "observedGeneration": crate::api::NOT_OBSERVED,
            "inventory": [{"group": "", "version": "v1", "kind": "ConfigMap",
                "namespace": "ns", "name": "c"}]}});
        assert_eq!(kstatus(&recorded), Kstatus::InProgress);
    }

    #[test]
    fn a_retried_error_is_in_progress_until_it_succeeds() {
        let transient = error_outcome(
            &ReconcileError::ValuesSourceMissing("ConfigMap v does not exist".into()),
            Operation::Upgrade,
        );
        // A retried error says so, with the error as the message (fluxcd/pkg's convention).
        let retrying = after(None, 3, &transient);
        let reconciling = condition(&retrying, "Reconciling");
        assert_eq!(reconciling.reason, PROGRESSING_WITH_RETRY);
        assert!(reconciling.message.contains("ConfigMap v does not exist"));
        assert_eq!(condition(&retrying, "Ready").reason, "ValuesError");
        // Once the retry succeeds: Current, no longer reconciling.
        let recovered = after(
            Some(&retrying),
            3,
            &applied(&ended(None, [&[], &[]], None, 0)),
        );
        let manifest = json!({"metadata": {"generation": 3}, "status": recovered});
        assert_eq!(kstatus(&manifest), Kstatus::Current);
        assert_eq!(condition(&recovered, "Reconciling").status, "False");
        // A spec change not reconciled yet (also `suspend: true`, which writes no status):
        // the status describes an older generation, so kstatus reads it as in progress.
        let manifest = json!({"metadata": {"generation": 4}, "status": recovered});
        assert_eq!(kstatus(&manifest), Kstatus::InProgress);
    }

    #[test]
    fn the_readiness_deadline_names_what_is_not_ready() {
        let waiting: &[&str] = &[
            "Deployment web: 0 of 1 replicas",
            "Widget w: not Ready (Degraded)",
        ];
        let early = applied(&ended(None, [waiting, &[]], None, 299));
        assert_eq!(
            (early.state, early.reason, early.stalled),
            (State::Processing, Reason::Progressing, false)
        );
        let late = applied(&ended(None, [waiting, &[]], None, 300));
        assert_eq!(
            (late.state, late.reason, late.stalled),
            (State::Error, Reason::ReadinessTimeout, true)
        );
        assert_eq!(
            late.message,
            "not ready within the timeout (300s): 2 objects: Deployment web: 0 of 1 replicas; \
             Widget w: not Ready (Degraded)"
        );
        // Ready objects past the deadline are simply ready.
        let ready = applied(&ended(None, [&[], &[]], None, 900));
        assert_eq!(ready.state, State::Ready);
    }

    #[test]
    fn a_module_stalled_by_its_objects_is_looked_at_again_within_a_minute() {
        let previous = ManifestStatus::default();
        let interval = Duration::from_secs(600);
        let requeue = |ended: Ended| ended.state(&previous, interval).requeue;
        let waiting: &[&str] = &["Deployment web: 0 of 1 replicas"];
        let failed: &[&str] = &["Pod p: CrashLoopBackOff"];
        assert_eq!(
            requeue(ended(None, [waiting, &[]], None, 300)),
            STALLED_RECHECK
        );
        assert_eq!(
            requeue(ended(None, [&[], failed], None, 10)),
            STALLED_RECHECK
        );
        // A shorter interval is kept; a refused prune waits for the interval (only a person
        // changes it); a ready module waits for its drift check.
        let short = Duration::from_secs(20);
        let failing = ended(None, [&[], failed], None, 10);
        assert_eq!(failing.state(&previous, short).requeue, short);
        assert_eq!(
            requeue(ended(Some("refused"), [&[], &[]], None, 10)),
            interval
        );
        assert_eq!(requeue(ended(None, [&[], &[]], None, 10)), interval);
    }
}
