//! Reconcile: the pipeline for one Manifest.
//!
//! read → resolve chart → values → render (cached) → plan (pure) → apply (CRDs first) →
//! prune (guarded) → readiness → status. Deletion: finalizer, delete the inventory in reverse
//! order, wait until it is gone, release. Every step has its own error type; a failed pass
//! writes an `Error` status and a Warning Event and deletes nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Map, Value, json};

use crate::api::{
    DeletionPolicy, InventoryEntry, Manifest, State, ValuesReference, ValuesSourceKind,
};
use crate::apply::{ApplyError, Cluster, Deletion};
use crate::chart_source::{Limits, RemoteCharts, SourceError};
use crate::metrics::{ReconcileMetrics, ResultLabels};
use crate::plan::{self, PlanError, PruneDecision, RenderedObject, Scope};
use crate::readiness::{Readiness, readiness};
use crate::render::{HelmRenderer, RenderError, RenderRequest};
use crate::shard::fence::{Fence, FenceLost};
use crate::shard::{SHARD_LABEL, ShardCount};
use crate::status::{Facts, Outcome, next_status};
use crate::values::{self, ValuesError};

/// The finalizer that keeps a Manifest until its objects are gone.
pub const FINALIZER: &str = "modulemanager.io/finalizer";

/// How long to wait for CRDs of a chart to become Established within one pass.
const CRD_ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// How old the target's discovery may be before a pass refreshes it (upgrades, new APIs).
const DISCOVERY_MAX_AGE: Duration = Duration::from_secs(300);
/// Requeue while workloads roll out or objects are being deleted.
const PROGRESS_REQUEUE: Duration = Duration::from_secs(5);

/// What a reconcile pass needs.
pub struct Context {
    /// The cluster holding the Manifests, their values sources and Events.
    pub client: Client,
    /// The cluster modules are applied to.
    pub cluster: Cluster,
    /// The helm renderer (with its cache).
    pub renderer: HelmRenderer,
    /// Local chart paths resolve under this directory (absolute, canonical).
    pub chart_root: PathBuf,
    /// Chart size limits.
    pub chart_limits: Limits,
    /// Fetches charts from Helm repositories and OCI registries (and caches them on disk).
    pub remote_charts: RemoteCharts,
    /// This replica's name (written to `status.owner`).
    pub replica: String,
    /// The fleet's number of virtual shards (a Manifest's shard is stamped as a label and
    /// written to `status.shard`).
    pub shards: ShardCount,
    /// Who publishes Events (controller and replica).
    pub reporter: Reporter,
    /// Pipeline metrics.
    pub metrics: ReconcileMetrics,
}

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// the chart could not be resolved.
    #[error(transparent)]
    Chart(#[from] SourceError),
    /// a values source is missing.
    #[error("{0}")]
    ValuesSource(String),
    /// a values document is not a YAML map.
    #[error(transparent)]
    Values(#[from] ValuesError),
    /// helm failed.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// the rendered documents are unusable.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// applying, reading or deleting an object failed.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// a migration Job failed.
    #[error("{0}")]
    JobFailed(String),
    /// a request about the Manifest itself (finalizer, status, values source) failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// this replica lost the Manifest's shard during the pass: it stops writing at once.
    #[error(transparent)]
    Fenced(#[from] FenceLost),
}

impl ReconcileError {
    /// The static category: the only thing used as a metric label or Event reason.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Chart(_) => "ChartError",
            Self::ValuesSource(_) | Self::Values(_) => "ValuesError",
            Self::Render(_) => "RenderError",
            Self::Plan(_) => "PlanError",
            Self::Apply(_) => "ApplyError",
            Self::JobFailed(_) => "JobFailed",
            Self::Kube(_) => "KubeError",
            Self::Fenced(_) => "Fenced",
        }
    }

    /// Permanent errors (bad input) wait for a spec change; the rest back off and retry.
    pub fn is_permanent(&self) -> bool {
        match self {
            // A kind the target does not serve (yet) may appear: its CRD may be installed later.
            Self::Plan(PlanError::UnknownKind(_)) => false,
            // An unreachable repository or registry is retried; bad charts are not.
            Self::Chart(e) => e.is_permanent(),
            Self::Values(_) | Self::Plan(_) | Self::JobFailed(_) => true,
            Self::Render(e) => e.is_permanent(),
            Self::Apply(e) => e.is_permanent(),
            Self::ValuesSource(_) | Self::Kube(_) | Self::Fenced(_) => false,
        }
    }
}

/// The result of a pass for the work queue.
#[derive(Debug)]
pub enum Next {
    /// Reconcile again after this long.
    After(Duration),
    /// The pass failed transiently: back off.
    Retry(ReconcileError),
    /// Nothing to do until the Manifest changes.
    Idle,
}

/// A successful pass: its outcome and the facts it learned.
struct Pass {
    outcome: Outcome,
    facts: Facts,
    requeue: Duration,
}

/// Reconciles one Manifest; writes its status and Events. Never panics on bad input.
pub async fn reconcile(manifest: Arc<Manifest>, ctx: &Context, fence: &Fence) -> Next {
    let started = std::time::Instant::now();
    let (next, result, category) = pass(manifest, ctx, fence).await;
    ctx.metrics
        .duration
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics
        .reconciles
        .get_or_create(&ResultLabels { result, category })
        .inc();
    next
}

/// One pass, with its result and error category for the metrics.
async fn pass(
    manifest: Arc<Manifest>,
    ctx: &Context,
    fence: &Fence,
) -> (Next, &'static str, &'static str) {
    let interval = crate::api::interval(&manifest.spec).unwrap_or(Duration::from_secs(600));
    // The inventory as this pass wrote it (before applying), so that an error status written
    // from the Manifest as read at the start does not drop entries recorded since.
    let mut recorded = None;
    let result = if manifest.meta().deletion_timestamp.is_some() {
        delete(&manifest, ctx, fence).await
    } else if manifest.spec.suspend {
        return (Next::Idle, "suspended", "");
    } else {
        install(&manifest, ctx, fence, interval, &mut recorded).await
    };
    // The shard was lost during the pass (or is being lost now): the new owner writes the
    // status; this replica writes nothing more and does not requeue.
    let result = result.and_then(|pass| fence.check().map(|()| pass).map_err(Into::into));
    match result {
        Err(ReconcileError::Fenced(lost)) => {
            tracing::warn!("stopping the pass: {lost}");
            // The controller drops the key if the shard is gone, else retries it shortly (the
            // deadline may pass only for a moment).
            (Next::After(Duration::from_secs(1)), "fenced", "Fenced")
        }
        Ok(None) => (Next::Idle, "done", ""),
        Ok(Some(pass)) => {
            let result = match pass.outcome.state {
                State::Ready => "ready",
                State::Processing => "processing",
                State::Warning => "warning",
                State::Deleting => "deleting",
                State::Error => "error",
            };
            match write_status(&manifest, ctx, &pass.outcome, pass.facts).await {
                Ok(()) => (Next::After(pass.requeue), result, ""),
                Err(e) => (Next::Retry(e.into()), "error", "KubeError"),
            }
        }
        Err(error) => {
            let outcome = Outcome {
                state: State::Error,
                reason: error.category(),
                message: error.to_string(),
                rendered: matches!(error, ReconcileError::Render(_)).then_some(false),
                applied: matches!(
                    error,
                    ReconcileError::Apply(_) | ReconcileError::JobFailed(_)
                )
                .then_some(false),
                stalled: error.is_permanent(),
                operation: Some(operation(&manifest)),
            };
            tracing::warn!(
                category = error.category(),
                permanent = error.is_permanent(),
                "reconcile failed: {error}"
            );
            let facts = Facts {
                inventory: recorded,
                ..Default::default()
            };
            // A pass that lost its shard meanwhile must not write over the new owner's status.
            if let Err(lost) = fence.check() {
                tracing::warn!("not writing the error status: {lost}");
            } else if let Err(e) = write_status(&manifest, ctx, &outcome, facts).await {
                tracing::warn!("write the error status: {e}");
            }
            let category = error.category();
            if error.is_permanent() {
                (Next::After(interval), "error", category)
            } else {
                (Next::Retry(error), "error", category)
            }
        }
    }
}

/// `Install` when nothing was applied yet, else `Upgrade`; `Delete` while deleting.
fn operation(manifest: &Manifest) -> &'static str {
    if manifest.meta().deletion_timestamp.is_some() {
        "Delete"
    } else if manifest
        .status
        .as_ref()
        .is_none_or(|s| s.inventory.is_empty())
    {
        "Install"
    } else {
        "Upgrade"
    }
}

async fn install(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
    interval: Duration,
    recorded: &mut Option<Vec<InventoryEntry>>,
) -> Result<Option<Pass>, ReconcileError> {
    let uid = manifest.uid().unwrap_or_default();
    let shard = ctx.shards.shard_of(&uid).to_string();
    let has_finalizer = manifest.finalizers().iter().any(|f| f == FINALIZER);
    if !has_finalizer || manifest.labels().get(SHARD_LABEL) != Some(&shard) {
        fence.check()?;
        claim(manifest, ctx, &shard).await?;
    }
    let previous = manifest.status.clone().unwrap_or_default();
    let namespace = manifest
        .spec
        .target_namespace
        .clone()
        .unwrap_or_else(|| manifest.namespace().unwrap_or_default());

    // Resolve (network fetches async; file I/O, hashing and archive checks on blocking threads)
    // and render.
    let chart = ctx
        .remote_charts
        .resolve(&manifest.spec.chart, &ctx.chart_root, ctx.chart_limits)
        .await?;
    let values = gather_values(manifest, ctx).await?;
    let surface = ctx.cluster.fresh_surface(DISCOVERY_MAX_AGE).await?;
    let request = RenderRequest {
        chart,
        release: manifest
            .spec
            .release_name
            .clone()
            .unwrap_or_else(|| manifest.name_any()),
        namespace: namespace.clone(),
        values,
        kube_version: surface.kube_version.clone(),
        api_versions: surface.api_versions.clone(),
        is_upgrade: !previous.inventory.is_empty(),
    };
    let rendered = ctx.renderer.render(&request).await?;
    let mut plan = plan::plan(plan::parse_documents(&rendered.manifest)?)?;
    let values_digest = request.values_digest();
    // A spec change (release name, target namespace …) counts as a changed input too.
    let inputs_changed = previous.chart_digest.as_deref() != Some(request.chart.digest.as_str())
        || previous.values_digest.as_deref() != Some(values_digest.as_str())
        || previous.applied_generation != manifest.meta().generation;

    // The chart may bring its own target namespace (it is applied first, in install order).
    if !plan
        .objects
        .iter()
        .any(|o| o.id.kind == "Namespace" && o.id.group.is_empty() && o.id.name == namespace)
    {
        fence.check()?;
        ensure_namespace(ctx, &namespace, &uid).await?;
    }

    // CRDs first: apply, wait for Established.
    plan::assign_namespaces(&mut plan.crds, &namespace, |_| Some(Scope::Cluster))?;
    apply_all(
        manifest,
        ctx,
        fence,
        &previous.inventory,
        recorded,
        &plan.crds,
    )
    .await?;
    if !plan.crds.is_empty() {
        let names: Vec<String> = plan.crds.iter().map(|c| c.id.name.clone()).collect();
        ctx.cluster
            .wait_established(&names, CRD_ESTABLISH_TIMEOUT)
            .await?;
    }
    // Kinds discovery does not know yet (from these CRDs, or installed since by someone else):
    // refresh. The API server publishes a new CRD's group in discovery shortly *after* the CRD is
    // Established, so kinds of this chart's own CRDs are waited for a little.
    let unknown = |o: &&RenderedObject| ctx.cluster.surface().resolve(&o.id).is_none();
    if plan.objects.iter().any(|o| unknown(&o)) {
        ctx.cluster.refresh_discovery().await?;
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
            ctx.cluster.refresh_discovery().await?;
        }
    }
    let surface = ctx.cluster.surface();
    plan::assign_namespaces(&mut plan.objects, &namespace, |id| {
        surface.resolve(id).map(|(_, scope)| *scope)
    })?;

    // Apply, recording the inventory first so that nothing applied can be forgotten.
    let inventory = plan.inventory();
    // Objects as the server returned them, for the readiness check (the CRDs are Established).
    let applied = apply_all(
        manifest,
        ctx,
        fence,
        &previous.inventory,
        recorded,
        &plan.objects,
    )
    .await?;

    // Prune what the new render lacks, unless the guard refuses.
    let gone = plan::to_prune(&previous.inventory, &inventory);
    let mut final_inventory = inventory.clone();
    let prune_refused = match plan::guard_prune(gone.clone(), inventory.len(), inputs_changed) {
        PruneDecision::Prune(gone) => {
            let manifest_namespace = manifest.namespace().unwrap_or_default();
            for id in &gone {
                delete_object(ctx, fence, id, &manifest_namespace, &uid).await?;
            }
            None
        }
        PruneDecision::Refuse(reason) => {
            // Refused objects stay on the cluster and in the inventory.
            final_inventory.extend(gone);
            Some(reason)
        }
    };

    // Readiness, from the objects as the server returned them.
    let mut waiting = Vec::new();
    for (id, object) in &applied {
        let body = serde_json::to_value(object).unwrap_or(Value::Null);
        match readiness(id, &body) {
            Readiness::Ready => {}
            Readiness::Waiting(why) => waiting.push(why),
            Readiness::Failed(why) => return Err(ReconcileError::JobFailed(why)),
        }
    }

    let changed = previous.rendered_digest.as_deref() != Some(rendered.digest.as_str())
        || previous.observed_generation != manifest.meta().generation;
    let (state, reason, message, requeue) = if let Some(refusal) = prune_refused {
        (State::Warning, "PruneRefused", refusal, interval)
    } else if let Some(first) = waiting.first() {
        (
            State::Processing,
            "Progressing",
            format!("waiting for {} objects: {first}", waiting.len()),
            PROGRESS_REQUEUE,
        )
    } else {
        (
            State::Ready,
            "Ready",
            format!("{} objects applied and ready", final_inventory.len()),
            interval,
        )
    };
    let outcome = Outcome {
        state,
        reason,
        message,
        rendered: Some(true),
        applied: Some(true),
        stalled: false,
        operation: changed.then(|| operation(manifest)),
    };
    let facts = Facts {
        chart_digest: Some(request.chart.digest.clone()),
        rendered_digest: Some(rendered.digest.clone()),
        values_digest: Some(values_digest),
        applied_generation: manifest.meta().generation,
        inventory: Some(final_inventory),
    };
    Ok(Some(Pass {
        outcome,
        facts,
        requeue,
    }))
}

/// Merges `valuesFrom` in order, then the inline values.
async fn gather_values(
    manifest: &Manifest,
    ctx: &Context,
) -> Result<Map<String, Value>, ReconcileError> {
    let namespace = manifest.namespace().unwrap_or_default();
    let mut merged = Map::new();
    for reference in &manifest.spec.values_from {
        if let Some(text) = read_values_source(ctx, &namespace, reference).await? {
            let name = format!(
                "{:?} {} key {}",
                reference.kind, reference.name, reference.key
            );
            values::merge(&mut merged, values::parse(&name, &text)?);
        }
    }
    if let Some(Value::Object(inline)) = &manifest.spec.values {
        values::merge(&mut merged, inline.clone());
    }
    Ok(merged)
}

/// The text under a values reference's key; `None` when missing and optional.
async fn read_values_source(
    ctx: &Context,
    namespace: &str,
    reference: &ValuesReference,
) -> Result<Option<String>, ReconcileError> {
    let text = match reference.kind {
        ValuesSourceKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), namespace)
            .get_opt(&reference.name)
            .await?
            .map(|cm| cm.data.unwrap_or_default().get(&reference.key).cloned()),
        ValuesSourceKind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), namespace)
            .get_opt(&reference.name)
            .await?
            .map(|s| {
                s.data
                    .unwrap_or_default()
                    .get(&reference.key)
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            }),
    };
    match text {
        Some(Some(text)) => Ok(Some(text)),
        _ if reference.optional => Ok(None),
        None => Err(ReconcileError::ValuesSource(format!(
            "{:?} {} does not exist",
            reference.kind, reference.name
        ))),
        Some(None) => Err(ReconcileError::ValuesSource(format!(
            "{:?} {} has no key {}",
            reference.kind, reference.name, reference.key
        ))),
    }
}

/// Creates the target namespace when missing. It is not part of the module's inventory (never
/// deleted with it), but carries the Manifest's label, so a later chart version that brings
/// this Namespace itself may take it over.
async fn ensure_namespace(ctx: &Context, name: &str, uid: &str) -> Result<(), ReconcileError> {
    let namespaces = Api::<Namespace>::all(ctx.cluster.client().clone());
    if namespaces.get_opt(name).await?.is_none() {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(
                    [(crate::apply::MANIFEST_UID_LABEL.to_owned(), uid.to_owned())].into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &namespace).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Applies `objects` in order, after refusing objects that are not this Manifest's and recording
/// them all in the inventory (nothing applied can be forgotten); the fence is checked before each
/// write. Returns each object as the server returned it.
async fn apply_all(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
    previous: &[InventoryEntry],
    recorded: &mut Option<Vec<InventoryEntry>>,
    objects: &[RenderedObject],
) -> Result<Vec<(InventoryEntry, DynamicObject)>, ReconcileError> {
    let uid = manifest.uid().unwrap_or_default();
    adopt_check(ctx, &uid, previous, objects).await?;
    record_inventory(manifest, ctx, fence, previous, recorded, objects).await?;
    let mut applied = Vec::with_capacity(objects.len());
    for object in objects {
        fence.check()?;
        applied.push((object.id.clone(), ctx.cluster.apply(object, &uid).await?));
        ctx.metrics.applied.inc();
    }
    Ok(applied)
}

/// Refuses, before anything is recorded or applied, objects new to the inventory that already
/// exist and are not this Manifest's.
async fn adopt_check(
    ctx: &Context,
    uid: &str,
    previous: &[InventoryEntry],
    objects: &[RenderedObject],
) -> Result<(), ReconcileError> {
    for object in objects.iter().filter(|o| !previous.contains(&o.id)) {
        ctx.cluster.check_adoptable(object, uid).await?;
    }
    Ok(())
}

/// Before applying `objects`, makes sure the status inventory lists them: an object that is
/// applied but not recorded would never be pruned. `recorded` is what this pass has written so
/// far (`None`: the status still holds `previous`).
async fn record_inventory(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
    previous: &[InventoryEntry],
    recorded: &mut Option<Vec<InventoryEntry>>,
    objects: &[RenderedObject],
) -> Result<(), ReconcileError> {
    let mut list = recorded.clone().unwrap_or_else(|| previous.to_vec());
    let before = list.len();
    for object in objects {
        if !list.contains(&object.id) {
            list.push(object.id.clone());
        }
    }
    if list.len() > before {
        fence.check()?;
        patch_status(manifest, ctx, json!({ "inventory": list })).await?;
        *recorded = Some(list);
    }
    Ok(())
}

/// Adds the finalizer and stamps the shard label in one write, guarded by the resourceVersion
/// the decision was made on.
async fn claim(manifest: &Manifest, ctx: &Context, shard: &str) -> Result<(), ReconcileError> {
    let mut finalizers = manifest.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == FINALIZER) {
        finalizers.push(FINALIZER.to_owned());
    }
    patch_metadata(
        manifest,
        ctx,
        json!({"finalizers": finalizers, "labels": { SHARD_LABEL: shard }}),
    )
    .await
}

/// Replaces the finalizers, guarded by the resourceVersion the decision was made on.
async fn set_finalizers(
    manifest: &Manifest,
    ctx: &Context,
    finalizers: Vec<String>,
) -> Result<(), ReconcileError> {
    patch_metadata(manifest, ctx, json!({ "finalizers": finalizers })).await
}

/// Merge-patches the Manifest's metadata, guarded by the resourceVersion it was read at (a
/// concurrent change makes the write fail with a conflict instead of overwriting it).
async fn patch_metadata(
    manifest: &Manifest,
    ctx: &Context,
    mut metadata: Value,
) -> Result<(), ReconcileError> {
    metadata["resourceVersion"] = json!(manifest.resource_version());
    let patch = json!({ "metadata": metadata });
    manifest_api(manifest, ctx)
        .patch(
            &manifest.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

async fn delete(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
) -> Result<Option<Pass>, ReconcileError> {
    if !manifest.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(None);
    }
    let uid = manifest.uid().unwrap_or_default();
    let manifest_namespace = manifest.namespace().unwrap_or_default();
    let mut inventory = manifest
        .status
        .as_ref()
        .map(|s| s.inventory.clone())
        .unwrap_or_default();
    if manifest.spec.deletion_policy == DeletionPolicy::Delete && !inventory.is_empty() {
        plan::sort_for_deletion(&mut inventory);
        // Objects still terminating; the next pass looks again (without deleting them twice).
        let mut remaining = Vec::new();
        for id in &inventory {
            let outcome = delete_object(ctx, fence, id, &manifest_namespace, &uid).await?;
            if matches!(
                outcome,
                Deletion::Terminating | Deletion::Deleted { terminating: true }
            ) {
                remaining.push(plan::describe(id));
            }
        }
        if let Some(first) = remaining.first() {
            let outcome = Outcome {
                state: State::Deleting,
                reason: "Deleting",
                message: format!(
                    "waiting for {} objects to be deleted: {first}",
                    remaining.len()
                ),
                rendered: None,
                applied: None,
                stalled: false,
                operation: None,
            };
            return Ok(Some(Pass {
                outcome,
                facts: Facts::default(),
                requeue: PROGRESS_REQUEUE,
            }));
        }
    }
    let (reason, note) = match manifest.spec.deletion_policy {
        DeletionPolicy::Delete => (
            "Deleted",
            "the module's objects are deleted (CRDs, the Manifest's namespace, objects it does not manage and those marked helm.sh/resource-policy: keep stay)"
                .to_owned(),
        ),
        DeletionPolicy::Orphan => (
            "Orphaned",
            format!(
                "left {} objects on the cluster (deletionPolicy: Orphan)",
                inventory.len()
            ),
        ),
    };
    fence.check()?;
    publish(manifest, ctx, EventType::Normal, reason, &note).await;
    let finalizers = manifest
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    set_finalizers(manifest, ctx, finalizers).await?;
    Ok(None)
}

/// Deletes one object of the Manifest (pruning or deletion), unless it is protected; checks the
/// fence first and counts or logs the outcome.
async fn delete_object(
    ctx: &Context,
    fence: &Fence,
    id: &InventoryEntry,
    manifest_namespace: &str,
    uid: &str,
) -> Result<Deletion, ReconcileError> {
    fence.check()?;
    let outcome = match plan::protected(id, manifest_namespace) {
        Some(reason) => Deletion::Kept(reason),
        None => ctx.cluster.delete(id, uid).await?,
    };
    count_deletion(ctx, id, &outcome);
    Ok(outcome)
}

/// Counts an object deleted in this pass in the metrics; logs one that is left in place.
fn count_deletion(ctx: &Context, id: &InventoryEntry, outcome: &Deletion) {
    match outcome {
        Deletion::Deleted { .. } => {
            ctx.metrics.deleted.inc();
        }
        Deletion::Kept(reason) => {
            tracing::info!(object = %plan::describe(id), "left in place: {reason}")
        }
        Deletion::Terminating | Deletion::Gone => {}
    }
}

/// Writes the status when it differs from the current one; publishes an Event when the state
/// changed, or an error's message did.
async fn write_status(
    manifest: &Manifest,
    ctx: &Context,
    outcome: &Outcome,
    facts: Facts,
) -> Result<(), kube::Error> {
    let previous = manifest.status.as_ref();
    let shard = manifest.uid().map(|uid| ctx.shards.shard_of(&uid));
    let next = next_status(
        previous,
        manifest.meta().generation,
        outcome,
        facts,
        shard,
        &ctx.replica,
        &Time(Timestamp::now()),
    );
    if previous == Some(&next) {
        return Ok(());
    }
    let previous_message = previous
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.message.as_str());
    let problem = matches!(outcome.state, State::Error | State::Warning);
    let notable = previous.and_then(|s| s.state) != next.state
        || (problem && previous_message != Some(&outcome.message));
    patch_status(
        manifest,
        ctx,
        serde_json::to_value(&next).unwrap_or(Value::Null),
    )
    .await?;
    if notable {
        tracing::info!(state = ?outcome.state, reason = outcome.reason, "{}", outcome.message);
        let kind = if problem {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish(manifest, ctx, kind, outcome.reason, &outcome.message).await;
    }
    Ok(())
}

async fn patch_status(
    manifest: &Manifest,
    ctx: &Context,
    status: Value,
) -> Result<(), kube::Error> {
    manifest_api(manifest, ctx)
        .patch_status(
            &manifest.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await?;
    Ok(())
}

/// At most `max` bytes of `text`, cut at a character boundary (Event notes are limited in bytes).
fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The API of the Manifest's own namespace.
fn manifest_api(manifest: &Manifest, ctx: &Context) -> Api<Manifest> {
    Api::namespaced(
        ctx.client.clone(),
        &manifest.namespace().unwrap_or_default(),
    )
}

async fn publish(manifest: &Manifest, ctx: &Context, type_: EventType, reason: &str, note: &str) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(truncate(note, 1024).to_owned()),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    // A fresh Recorder each time: kube's Recorder folds events with the same reason into one
    // series that keeps the *first* note, which would show an on-call engineer a stale message.
    // Events are only published when the state or the error changes, so this cannot spam.
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    if let Err(e) = recorder.publish(&event, &manifest.object_ref(&())).await {
        tracing::warn!("publish event {reason}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_are_cut_by_bytes_at_a_character_boundary() {
        assert_eq!(truncate("abc", 1024), "abc");
        let long = "é".repeat(1000); // 2 bytes each
        let cut = truncate(&long, 1023);
        assert_eq!(cut.len(), 1022);
        assert!(long.starts_with(cut));
    }

    #[test]
    fn unknown_kinds_are_retried_and_bad_charts_are_not() {
        assert!(!ReconcileError::Plan(PlanError::UnknownKind("Widget/w".into())).is_permanent());
        assert!(ReconcileError::Plan(PlanError::Duplicate("Secret/s".into())).is_permanent());
        assert_eq!(
            ReconcileError::ValuesSource("x".into()).category(),
            "ValuesError"
        );
        // A repository that does not answer is retried; a bad chart from it is not.
        let fetch = |error| {
            ReconcileError::Chart(SourceError::Fetch {
                origin: "chart web 1.0.0 from http://charts.example.com".into(),
                error,
            })
        };
        let unreachable = fetch(crate::chart_source::FetchError::Unreachable {
            url: "http://charts.example.com/index.yaml".into(),
            reason: "connection refused".into(),
        });
        assert!(!unreachable.is_permanent());
        assert_eq!(unreachable.category(), "ChartError");
        let mismatch = fetch(crate::chart_source::FetchError::DigestMismatch {
            expected: "a".into(),
            actual: "b".into(),
        });
        assert!(mismatch.is_permanent());
    }
}
