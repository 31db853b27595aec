//! Records: the pass's writes to the Manifest itself (status, inventory, metadata) and its Events.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::context::Context;
use super::error::ReconcileError;
use crate::api::{HookRun, InventoryEntry, Manifest, ManifestStatus, Release, State};
use crate::plan::RenderedObject;
use crate::plan::status::{
    Facts, Operation, Outcome, next_status, operation_of, publishes_event, ready_message,
    status_patch,
};
use crate::plan::{applied_stamps, history, trigger};
use crate::shard::fence::Fence;
use crate::telemetry::events::Publisher;

/// The Manifest as stored now, not as the watch cache has it: a pass decides from
/// `status.hookRun` and `status.hookObjects` (which hook to start, which objects may exist),
/// and a cache that lags behind the last pass's status write would start a hook again or
/// drop a recorded hook object (the status is written whole). One GET, for a pass whose cache
/// copy may lag (`reconcile::current` says when). `None` when it was deleted meanwhile, or
/// re-created under a new UID.
pub(super) async fn read_fresh(
    manifest: &Manifest,
    ctx: &Context,
) -> Result<Option<Manifest>, ReconcileError> {
    let fresh = manifest_api(manifest, ctx)
        .get_opt(&manifest.name_any())
        .await
        .map_err(ReconcileError::ReadManifest)?;
    Ok(fresh.filter(|fresh| fresh.uid() == manifest.uid()))
}

/// The operation a failed pass of `manifest` reports ([`operation_of`]).
pub(super) fn operation(manifest: &Manifest) -> Operation {
    let deleting = manifest.meta().deletion_timestamp.is_some();
    operation_of(manifest.status.as_ref(), deleting)
}

/// The Manifest's status as the API server holds it: as the pass began, with what the pass
/// recorded itself since (the status patch of a pass is made against it).
pub(super) struct Stored {
    status: Option<ManifestStatus>,
}

impl Stored {
    /// As `manifest` (as read or cached) holds it.
    pub(super) fn before(manifest: &Manifest) -> Self {
        Self {
            status: manifest.status.clone(),
        }
    }

    /// With what the pass recorded itself: the inventory, written with its hook run before
    /// the applies (the hook objects are not taken: the hook runner writes a grown list at once
    /// but a shrunk one only with the pass's status).
    pub(super) fn with_recorded(mut self, progress: &super::pass::Progress) -> Self {
        if let Some(inventory) = &progress.inventory {
            let status = self.status.get_or_insert_default();
            status.inventory.clone_from(inventory);
            status.hook_run.clone_from(&progress.recorded_run);
        }
        self
    }
}

/// `status.history` after a pass that worked on `pass_run` and leaves `next`
/// ([`history::next`]), with the release inputs the Manifest names.
fn release_history(
    manifest: &Manifest,
    next: &ManifestStatus,
    pass_run: Option<&HookRun>,
    outcome: &Outcome,
    now: &Time,
) -> Vec<Release> {
    let spec = &manifest.spec;
    let chart = history::chart_reference(&spec.chart);
    let release = spec
        .release_name
        .clone()
        .unwrap_or_else(|| manifest.name_any());
    let namespace = spec
        .target_namespace
        .clone()
        .unwrap_or_else(|| manifest.namespace().unwrap_or_default());
    let max = spec
        .max_history
        .map_or(history::DEFAULT_MAX_HISTORY, |max| max as usize);
    let inputs = history::Inputs {
        chart: &chart,
        release: &release,
        namespace: &namespace,
        max,
    };
    history::next(next, pass_run, outcome, &inputs, now)
}

/// Writes the status when it differs from the stored one; publishes an Event when
/// [`publishes_event`] says so (the state changed, but not into the rollout wait, or an error's
/// message did). The status echoes the requests the pass read
/// (`lastHandledReconcileAt`, `lastHandledResetAt`): no write of their own.
/// `manifest.status` is the status the pass decided from, `stored` what the API server holds
/// (the patch is made against it).
pub(super) async fn write_status(
    manifest: &Manifest,
    stored: &Stored,
    ctx: &Context,
    fence: &Fence,
    outcome: &Outcome,
    facts: Facts,
) -> Result<(), ReconcileError> {
    let previous = manifest.status.as_ref();
    let shard = manifest.uid().map(|uid| ctx.shards.shard_of(&uid));
    let now = Time(Timestamp::now());
    let pass_run = facts.hook_run.clone();
    let mut next = next_status(
        previous,
        manifest.meta().generation,
        outcome,
        facts,
        shard,
        &ctx.replica,
        &now,
    );
    next.history = release_history(manifest, &next, pass_run.as_ref(), outcome, &now);
    trigger::echo(&mut next, manifest);
    let stored_status = stored.status.as_ref();
    if stored_status.is_some_and(|s| *s == next || applied_stamps::only_moved(s, &next)) {
        return Ok(());
    }
    // The messages as written (shortened), so a long one that did not change is not news.
    let message = ready_message(&next).unwrap_or_default();
    let problem = matches!(outcome.state, State::Error | State::Warning);
    let notable = publishes_event(previous, &next, outcome);
    let patch = status_patch(stored.status.as_ref(), &next);
    patch_status(manifest, ctx, fence, patch).await?;
    if notable {
        let reason = outcome.reason.as_str();
        // A render error's text is helm's (a chart's `fail` may quote values): status and
        // Event only; the failed pass logged what it may (`ReconcileError::for_log`).
        if reason == "RenderError" {
            tracing::info!(state = ?outcome.state, reason, "the message is in the status");
        } else {
            tracing::info!(state = ?outcome.state, reason, "{message}");
        }
        let kind = if problem {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish(manifest, ctx, kind, reason, &message).await;
    }
    Ok(())
}

/// Merge-patches part of the Manifest's status (`{"status": status}`), as the shard's owner at
/// the fence's epoch: the answer is remembered ([`LastWrites`](super::written::LastWrites)).
pub(super) async fn patch_status(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
    status: Value,
) -> Result<(), ReconcileError> {
    let answer = manifest_api(manifest, ctx)
        .patch_status(
            &manifest.name_any(),
            &merge_params(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
        .map_err(ReconcileError::WriteStatus)?;
    ctx.written.wrote(&answer, fence.epoch());
    Ok(())
}

/// Merge-patches the Manifest's metadata, guarded by the resourceVersion it was read at (a
/// concurrent change makes the write fail with a conflict instead of overwriting it); returns
/// the Manifest as written.
pub(super) async fn patch_metadata(
    manifest: &Manifest,
    ctx: &Context,
    mut metadata: Value,
) -> Result<Manifest, ReconcileError> {
    metadata["resourceVersion"] = json!(manifest.resource_version());
    let patch = json!({ "metadata": metadata });
    manifest_api(manifest, ctx)
        .patch(&manifest.name_any(), &merge_params(), &Patch::Merge(&patch))
        .await
        .map_err(ReconcileError::WriteMetadata)
}

/// What a pass records while it applies: the inventory (before each apply, with the hook run
/// it belongs to) and the UIDs the applies answered with.
pub(super) struct Records<'r> {
    /// The inventory as this pass recorded it (`None`: not recorded, the status holds the
    /// previous one).
    pub inventory: &'r mut Option<Vec<InventoryEntry>>,
    /// The UIDs the applies answered with.
    pub learned: &'r mut BTreeMap<String, String>,
    /// The pass's hook run (its operation: an install or an upgrade).
    pub run: &'r HookRun,
    /// The hook run as the inventory record wrote it.
    pub recorded_run: &'r mut Option<HookRun>,
}

/// Before applying `objects`, makes sure the status inventory lists them: an object that is
/// applied but not recorded would never be pruned. The hook run goes with it, so that a pass
/// after a crash continues the same run — an install as an install — instead of taking the
/// recorded objects for an upgrade's.
pub(super) async fn record_inventory(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
    previous: &ManifestStatus,
    records: &mut Records<'_>,
    objects: &[RenderedObject],
) -> Result<(), ReconcileError> {
    let recorded = &mut *records.inventory;
    let mut list = recorded
        .clone()
        .unwrap_or_else(|| previous.inventory.clone());
    let before = list.len();
    // A set, not `list.contains` per object: quadratic at the objects cap (5,000).
    let mut known: std::collections::HashSet<InventoryEntry> = list.iter().cloned().collect();
    for object in objects {
        if known.insert(object.id.clone()) {
            list.push(object.id.clone());
        }
    }
    if list.len() > before {
        fence.check()?;
        let run = records.run;
        let patch = json!({ "inventory": list, "hookRun": run });
        patch_status(manifest, ctx, fence, patch).await?;
        *recorded = Some(list);
        *records.recorded_run = Some(run.clone());
    }
    Ok(())
}

/// A merge patch's parameters: field manager `module-manager` (the name its writes to a
/// Manifest show under in `managedFields`, as its applies do).
pub(super) fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(crate::apply::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// The API of the Manifest's own namespace.
fn manifest_api(manifest: &Manifest, ctx: &Context) -> Api<Manifest> {
    Api::namespaced(
        ctx.client.clone(),
        &manifest.namespace().unwrap_or_default(),
    )
}

/// Publishes an Event about the Manifest (action `Reconcile`).
pub(super) async fn publish(
    manifest: &Manifest,
    ctx: &Context,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let events = Publisher::new(ctx.client.clone(), ctx.reporter.clone());
    let regarding = manifest.object_ref(&());
    let published = events.publish(&regarding, type_, reason, "Reconcile", note);
    if let Err(e) = published.await {
        tracing::warn!("publish event {reason}: {e}");
    }
}
