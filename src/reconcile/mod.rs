//! Reconcile: the pipeline for one Manifest.
//!
//! read → resolve chart → values → render (cached) → plan (pure) → pre-install/pre-upgrade
//! hooks → apply (CRDs first) → prune (guarded) → readiness → post-install/post-upgrade hooks →
//! status. Deletion: finalizer, pre-delete hooks, delete the inventory in reverse order, wait
//! until it is gone, post-delete hooks, delete the remaining hook objects, release. A hook Job
//! that runs ends the pass (`Processing`, requeue); the run's progress is in `status.hookRun`.
//! Every step has its own error type; a failed pass writes an `Error` status and a Warning
//! Event and deletes nothing.

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
    DeletionPolicy, HookOperation, HookRun, HookRunPhase, InventoryEntry, Manifest, ManifestStatus,
    RunningHook, State, ValuesReference, ValuesSourceKind,
};
use crate::apply::target::{self, ResolveError, Target, TargetClients, TargetError};
use crate::apply::{ApplyError, Cluster, Deletion, MANIFEST_UID_LABEL};
use crate::plan::hooks::{self, Existing, HookState, Step};
use crate::plan::readiness::{Readiness, readiness};
use crate::plan::status::{Facts, Outcome, next_status};
use crate::plan::{self, Hook, HookEvent, PlanError, PruneDecision, RenderedObject, Scope};
use crate::render::values::{self, ValuesError};
use crate::render::{HelmRenderer, RenderError, RenderRequest};
use crate::shard::fence::{Fence, FenceLost};
use crate::shard::{SHARD_LABEL, ShardCount};
use crate::source::{Limits, RemoteCharts, SourceError};
use crate::telemetry::metrics::{ReconcileMetrics, ResultLabels};

/// The finalizer that keeps a Manifest until its objects are gone.
pub const FINALIZER: &str = "modulemanager.io/finalizer";

/// How long to wait for CRDs of a chart to become Established within one pass.
const CRD_ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// How old the target's discovery may be before a pass refreshes it (upgrades, new APIs).
const DISCOVERY_MAX_AGE: Duration = Duration::from_secs(300);
/// Longest requeue while workloads roll out or objects are being deleted.
const PROGRESS_REQUEUE: Duration = Duration::from_secs(5);
/// Shortest such requeue: right after an apply or a delete.
const PROGRESS_REQUEUE_MIN: Duration = Duration::from_millis(500);
/// Requeue while a hook (a Job) runs: a pass looks at it and returns.
const HOOK_REQUEUE: Duration = Duration::from_secs(2);

/// When to look again at objects still rolling out or being deleted, `waited` after the wait
/// began: half that (the wait so far), between [`PROGRESS_REQUEUE_MIN`] and
/// [`PROGRESS_REQUEUE`]. A workload controller usually reports the new generation, and the
/// garbage collector removes dependents, within a second: a fixed 5 s poll made nearly every
/// upgrade take 5 s (the load test measured update → Ready p50 5.3 s); halving keeps a long
/// rollout at about the old number of passes plus six.
pub fn progress_requeue(waited: Duration) -> Duration {
    (waited / 2).clamp(PROGRESS_REQUEUE_MIN, PROGRESS_REQUEUE)
}

/// How long `status` has been waiting for its objects to roll out (its `Reconciling` condition
/// true since), by this replica's clock; zero when it was not waiting.
fn rolling_out_for(status: &ManifestStatus, now: Timestamp) -> Duration {
    if status.state != Some(State::Processing) {
        return Duration::ZERO;
    }
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Reconciling" && c.status == "True")
        .and_then(|c| Duration::try_from(now.duration_since(c.last_transition_time.0)).ok())
        .unwrap_or_default()
}

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

/// What a reconcile pass needs.
pub struct Context {
    /// The cluster holding the Manifests, their values sources and Events.
    pub client: Client,
    /// The local cluster: modules without `spec.target` are applied to it.
    pub cluster: Cluster,
    /// Clients of remote targets (`spec.target`), cached per kubeconfig Secret.
    pub targets: TargetClients,
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
    /// How long a hook may run when its `modulemanager.io/hook-timeout` annotation does not say.
    pub hook_timeout: Duration,
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
    /// a Job of the module failed.
    #[error("{0}")]
    JobFailed(String),
    /// a hook failed or timed out: the operation stops.
    #[error("{0}")]
    HookFailed(String),
    /// a request about the Manifest itself (finalizer, status, values source) failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// this replica lost the Manifest's shard during the pass: it stops writing at once.
    #[error(transparent)]
    Fenced(#[from] FenceLost),
    /// the target cluster cannot be used (Secret, kubeconfig, connection).
    #[error(transparent)]
    Target(#[from] TargetError),
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
            Self::HookFailed(_) => "HookFailed",
            Self::Kube(_) => "KubeError",
            Self::Fenced(_) => "Fenced",
            Self::Target(e) => e.category(),
        }
    }

    /// Permanent errors (bad input) wait for a spec change; the rest back off and retry.
    pub fn is_permanent(&self) -> bool {
        match self {
            // A kind the target does not serve (yet) may appear: its CRD may be installed later.
            Self::Plan(PlanError::UnknownKind(_)) => false,
            // An unreachable repository or registry is retried; bad charts are not.
            Self::Chart(e) => e.is_permanent(),
            Self::Values(_) | Self::Plan(_) | Self::JobFailed(_) | Self::HookFailed(_) => true,
            Self::Render(e) => e.is_permanent(),
            Self::Target(e) => e.is_permanent(),
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

/// What a pass has recorded so far (or will record), so that an error status written from the
/// Manifest as read at the start keeps it: the inventory and the hook objects (written before
/// anything is applied) and the hook run's progress.
#[derive(Default)]
struct Progress {
    inventory: Option<Vec<InventoryEntry>>,
    hook_objects: Option<Vec<InventoryEntry>>,
    hook_run: Option<HookRun>,
}

impl Progress {
    fn facts(&self) -> Facts {
        Facts {
            inventory: self.inventory.clone(),
            hook_objects: self.hook_objects.clone(),
            hook_run: self.hook_run.clone(),
            ..Default::default()
        }
    }
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
    // The Manifest as stored now, not as the watch cache has it: a pass decides from
    // `status.hookRun` and `status.hookObjects` (which hook to start, which objects may exist),
    // and a cache that lags behind the last pass's status write would start a hook again or
    // drop a recorded hook object (the status is written whole). One GET per pass.
    let manifest = match manifest_api(&manifest, ctx)
        .get_opt(&manifest.name_any())
        .await
    {
        Ok(Some(fresh)) if fresh.uid() == manifest.uid() => Arc::new(fresh),
        // Deleted meanwhile, or re-created under a new UID (queued under its own key).
        Ok(_) => return (Next::Idle, "done", ""),
        Err(e) => return (Next::Retry(e.into()), "error", "KubeError"),
    };
    let interval = crate::api::interval(&manifest.spec).unwrap_or(Duration::from_secs(600));
    // What this pass recorded, so that an error status written from the Manifest as read at
    // the start does not drop entries recorded since (nor the hook run's progress).
    let mut progress = Progress::default();
    let result = if manifest.meta().deletion_timestamp.is_some() {
        delete(&manifest, ctx, fence, &mut progress).await
    } else if manifest.spec.suspend {
        return (Next::Idle, "suspended", "");
    } else {
        install(&manifest, ctx, fence, interval, &mut progress).await
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
            let facts = progress.facts();
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
    progress: &mut Progress,
) -> Result<Option<Pass>, ReconcileError> {
    let uid = manifest.uid().unwrap_or_default();
    let shard = ctx.shards.shard_of(&uid).to_string();
    let has_finalizer = manifest.finalizers().iter().any(|f| f == FINALIZER);
    if !has_finalizer || manifest.labels().get(SHARD_LABEL) != Some(&shard) {
        fence.check()?;
        claim(manifest, ctx, &shard).await?;
    }
    // The cluster the module goes to: the local one, or the remote target of `spec.target`.
    let cluster = resolve_target(manifest, ctx).await?;
    let result = install_on(manifest, ctx, &cluster, fence, interval, progress).await;
    observe(&cluster, ctx, result)
}

/// The cluster the module goes to: the local one, or the remote target of `spec.target`.
async fn resolve_target<'a>(
    manifest: &Manifest,
    ctx: &'a Context,
) -> Result<Target<'a>, ReconcileError> {
    target::resolve(manifest, &ctx.cluster, &ctx.client, &ctx.targets)
        .await
        .map_err(|error| match error {
            ResolveError::SecretRead(e) => ReconcileError::Kube(e),
            ResolveError::Target(e) => ReconcileError::Target(e),
            ResolveError::Discovery(e) => ReconcileError::Apply(e),
        })
}

/// Passes a step's result on; on a remote target, an error of the target itself
/// (unreachable, 401, TLS) becomes a [`TargetError`], and 401/TLS evict the client.
fn observe<T>(
    target: &Target<'_>,
    ctx: &Context,
    result: Result<T, ReconcileError>,
) -> Result<T, ReconcileError> {
    match result {
        Err(ReconcileError::Apply(error)) => {
            Err(match target.connection_error(&ctx.targets, error) {
                Ok(target) => ReconcileError::Target(target),
                Err(apply) => ReconcileError::Apply(apply),
            })
        }
        result => result,
    }
}

/// Installs or upgrades the module on `cluster` (everything but the Manifest, its status and
/// Events, which stay on the local cluster).
async fn install_on(
    manifest: &Manifest,
    ctx: &Context,
    cluster: &Cluster,
    fence: &Fence,
    interval: Duration,
    progress: &mut Progress,
) -> Result<Option<Pass>, ReconcileError> {
    let uid = manifest.uid().unwrap_or_default();
    let previous = manifest.status.clone().unwrap_or_default();
    let mut request = render_request(manifest, ctx, cluster).await?;
    let namespace = request.namespace.clone();
    let values_digest = request.values_digest();

    // The hook run this pass works on: an install until something was applied, then upgrades;
    // a run belongs to the chart, values, release and namespace it started with.
    let inputs = hooks::inputs_digest(
        &request.chart.digest,
        &values_digest,
        &request.release,
        &namespace,
    );
    let run = hooks::current_run(
        previous.hook_run.as_ref(),
        false,
        &inputs,
        manifest.meta().generation,
        hooks::installed(previous.hook_run.as_ref(), previous.inventory.is_empty()),
    );
    if run.phase == HookRunPhase::Failed {
        // Stays failed until the spec or the inputs change: nothing is applied meanwhile.
        return Err(ReconcileError::HookFailed(
            run.message.clone().unwrap_or_default(),
        ));
    }
    // Helm renders an install as an install: `--is-upgrade` only once the run is an upgrade
    // (also on drift passes after an install, which re-apply what the install applied).
    request.is_upgrade = run.operation == HookOperation::Upgrade;
    let rendered = ctx.renderer.render(&request).await?;
    let mut plan = plan::plan(plan::parse_documents(&rendered.manifest)?)?;
    tracing::debug!(
        crds = plan.crds.len(),
        objects = plan.objects.len(),
        digest = %rendered.digest,
        "rendered"
    );
    // Recorded from here on: a render that fails does not replace the previous run.
    let run = progress.hook_run.insert(run);
    // A spec change (release name, target namespace …) counts as a changed input too.
    let inputs_changed = previous.chart_digest.as_deref() != Some(request.chart.digest.as_str())
        || previous.values_digest.as_deref() != Some(values_digest.as_str())
        || previous.applied_generation != manifest.meta().generation;
    let scope = HookScope {
        manifest,
        ctx,
        cluster,
        fence,
        uid: uid.clone(),
        manifest_namespace: manifest.namespace().unwrap_or_default(),
        previous_hook_objects: &previous.hook_objects,
    };
    let pre_hooks = match hooks::event(run.operation, run.phase) {
        Some(event) if run.phase == HookRunPhase::PreHooks => {
            prepare_hooks(cluster, &plan.hooks, event, &namespace).await?
        }
        _ => Vec::new(),
    };

    // The chart may bring its own target namespace (it is applied first, in install order).
    // Pre-hooks that run before it need it now (created with the Manifest's label, so the
    // chart's Namespace object may take it over).
    let chart_brings_namespace = plan
        .objects
        .iter()
        .any(|o| o.id.kind == "Namespace" && o.id.group.is_empty() && o.id.name == namespace);
    if !chart_brings_namespace || !pre_hooks.is_empty() {
        fence.check()?;
        ensure_namespace(cluster, &namespace, &uid).await?;
    }

    // Pre-install or pre-upgrade hooks, before anything of this render is applied. A Job that
    // runs ends the pass; the next one continues from `status.hookRun`.
    // The phase moves on (and is saved) when its hooks are done.
    if run.phase == HookRunPhase::PreHooks
        && let Some(event) = hooks::event(run.operation, run.phase)
        && let PhaseOutcome::Waiting(message) = scope
            .run_phase(run, &mut progress.hook_objects, &pre_hooks, event)
            .await?
    {
        return Ok(Some(Pass {
            outcome: Outcome {
                state: State::Processing,
                reason: "HookRunning",
                message,
                rendered: Some(true),
                applied: None,
                stalled: false,
                operation: None,
            },
            facts: progress.facts(),
            requeue: HOOK_REQUEUE,
        }));
    }

    // CRDs first: apply, wait for Established.
    plan::assign_namespaces(&mut plan.crds, &namespace, |_| Some(Scope::Cluster))?;
    apply_all(
        manifest,
        ctx,
        cluster,
        fence,
        &previous.inventory,
        &mut progress.inventory,
        &plan.crds,
    )
    .await?;
    if !plan.crds.is_empty() {
        let names: Vec<String> = plan.crds.iter().map(|c| c.id.name.clone()).collect();
        cluster
            .wait_established(&names, CRD_ESTABLISH_TIMEOUT)
            .await?;
    }
    // Kinds discovery does not know yet (from these CRDs, or installed since by someone else):
    // refresh. The API server publishes a new CRD's group in discovery shortly *after* the CRD is
    // Established, so kinds of this chart's own CRDs are waited for a little.
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
    plan::assign_namespaces(&mut plan.objects, &namespace, |id| {
        surface.resolve(id).map(|(_, scope)| *scope)
    })?;

    // Apply, recording the inventory first so that nothing applied can be forgotten.
    let inventory = plan.inventory();
    // Objects as the server returned them, for the readiness check (the CRDs are Established).
    let applied = apply_all(
        manifest,
        ctx,
        cluster,
        fence,
        &previous.inventory,
        &mut progress.inventory,
        &plan.objects,
    )
    .await?;
    tracing::debug!(objects = applied.len(), "applied");

    // Prune what the new render lacks, unless the guard refuses.
    let gone = plan::to_prune(&previous.inventory, &inventory);
    let mut final_inventory = inventory.clone();
    let prune_refused = match plan::guard_prune(gone.clone(), inventory.len(), inputs_changed) {
        PruneDecision::Prune(gone) => {
            let manifest_namespace = manifest.namespace().unwrap_or_default();
            for id in &gone {
                delete_object(ctx, cluster, fence, id, &manifest_namespace, &uid).await?;
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

    // Post-install or post-upgrade hooks, once every object is ready.
    let was_done = run.phase == HookRunPhase::Done;
    let mut hook_waiting = None;
    if waiting.is_empty() {
        if run.phase == HookRunPhase::Objects {
            hooks::advance(run);
        }
        if let Some(event) = hooks::event(run.operation, run.phase) {
            let post_hooks = prepare_hooks(cluster, &plan.hooks, event, &namespace).await?;
            match scope
                .run_phase(run, &mut progress.hook_objects, &post_hooks, event)
                .await?
            {
                PhaseOutcome::Waiting(message) => hook_waiting = Some(message),
                PhaseOutcome::Done => {}
            }
        }
    }
    let finished = !was_done && run.phase == HookRunPhase::Done;
    let operation_name = match run.operation {
        HookOperation::Install => "Install",
        HookOperation::Upgrade => "Upgrade",
        HookOperation::Delete => "Delete",
    };

    let changed = previous.rendered_digest.as_deref() != Some(rendered.digest.as_str())
        || previous.observed_generation != manifest.meta().generation
        || finished;
    let (state, reason, message, mut requeue) = if let Some(refusal) = prune_refused {
        (State::Warning, "PruneRefused", refusal, interval)
    } else if let Some(first) = waiting.first() {
        (
            State::Processing,
            "Progressing",
            format!("waiting for {} objects: {first}", waiting.len()),
            progress_requeue(rolling_out_for(&previous, Timestamp::now())),
        )
    } else if let Some(message) = hook_waiting.clone() {
        (State::Processing, "HookRunning", message, HOOK_REQUEUE)
    } else {
        (
            State::Ready,
            "Ready",
            format!("{} objects applied and ready", final_inventory.len()),
            interval,
        )
    };
    if hook_waiting.is_some() {
        requeue = requeue.min(HOOK_REQUEUE); // also while a prune refusal is shown
    }
    let outcome = Outcome {
        state,
        reason,
        message,
        rendered: Some(true),
        applied: Some(true),
        stalled: false,
        operation: changed.then_some(operation_name),
    };
    let facts = Facts {
        chart_digest: Some(request.chart.digest.clone()),
        rendered_digest: Some(rendered.digest.clone()),
        values_digest: Some(values_digest),
        applied_generation: manifest.meta().generation,
        inventory: Some(final_inventory),
        hook_run: progress.hook_run.clone(),
        hook_objects: progress.hook_objects.clone(),
    };
    Ok(Some(Pass {
        outcome,
        facts,
        requeue,
    }))
}

/// Resolves the chart (blocking file I/O, off the async workers), merges the values and reads
/// the target's discovery: everything helm needs but `--is-upgrade` (left `false`).
async fn render_request(
    manifest: &Manifest,
    ctx: &Context,
    cluster: &Cluster,
) -> Result<RenderRequest, ReconcileError> {
    let namespace = manifest
        .spec
        .target_namespace
        .clone()
        .unwrap_or_else(|| manifest.namespace().unwrap_or_default());
    // Resolve (network fetches async; file I/O, hashing and archive checks on blocking threads).
    let chart = ctx
        .remote_charts
        .resolve(&manifest.spec.chart, &ctx.chart_root, ctx.chart_limits)
        .await?;
    let values = gather_values(manifest, ctx).await?;
    let surface = cluster.fresh_surface(DISCOVERY_MAX_AGE).await?;
    Ok(RenderRequest {
        chart,
        release: manifest
            .spec
            .release_name
            .clone()
            .unwrap_or_else(|| manifest.name_any()),
        namespace,
        values,
        kube_version: surface.kube_version.clone(),
        api_versions: surface.api_versions.clone(),
        is_upgrade: false,
    })
}

/// The hooks of `event`, in run order, with their namespaces assigned (discovery is refreshed
/// once when a kind is unknown; a kind still unknown is an error, retried).
async fn prepare_hooks(
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
enum PhaseOutcome {
    /// Every hook succeeded: the run moved to its next phase (and the `hook-succeeded` ones
    /// were deleted).
    Done,
    /// A hook is running (or its previous instance is being deleted): requeue.
    Waiting(String),
}

/// What running hooks needs from the pass.
struct HookScope<'a> {
    manifest: &'a Manifest,
    ctx: &'a Context,
    /// The cluster the module (and its hooks) go to.
    cluster: &'a Cluster,
    fence: &'a Fence,
    uid: String,
    manifest_namespace: String,
    /// `status.hookObjects` as read at the start of the pass.
    previous_hook_objects: &'a [InventoryEntry],
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
    async fn run_phase(
        &self,
        run: &mut HookRun,
        hook_objects: &mut Option<Vec<InventoryEntry>>,
        hooks: &[Hook],
        event: HookEvent,
    ) -> Result<PhaseOutcome, ReconcileError> {
        let event_name = event.as_str();
        let stamp = hooks::stamp(run, event);
        let deleting = matches!(event, HookEvent::PreDelete | HookEvent::PostDelete);
        loop {
            let (hook, object) = match hooks::next_step(hooks, run) {
                Step::Finish(succeeded) => {
                    hooks::advance(run);
                    if !succeeded.is_empty() {
                        self.save_run(run).await?;
                    }
                    for hook in succeeded {
                        self.delete(hook_objects, &hook.object.id).await?;
                    }
                    return Ok(PhaseOutcome::Done);
                }
                Step::Start(hook) => {
                    let id = &hook.object.id;
                    // A delete hook whose namespace is being deleted (or is gone) cannot run:
                    // skipped, so that deleting the namespace does not wait on this Manifest
                    // forever.
                    if deleting && let Some(why) = self.namespace_unusable(id).await? {
                        self.skip(run, hook, event, &why).await?;
                        continue;
                    }
                    // Recorded before it is applied: a hook object is never forgotten.
                    self.record(hook_objects, id).await?;
                    let mut adopted = None;
                    if let Some(existing) = self.cluster.get(id).await? {
                        if existing.labels().get(MANIFEST_UID_LABEL) != Some(&self.uid) {
                            return Err(ApplyError::NotOwned(plan::describe(id)).into());
                        }
                        let this_run = existing.annotations().get(hooks::RUN_ANNOTATION)
                            == Some(&stamp)
                            && existing.metadata.deletion_timestamp.is_none();
                        match hooks::existing(hook, this_run) {
                            Existing::Adopt => adopted = Some(existing),
                            Existing::Replace => match self.delete(hook_objects, id).await? {
                                Deletion::Deleted { terminating: true } | Deletion::Terminating => {
                                    return Ok(PhaseOutcome::Waiting(format!(
                                        "{event_name} hook {}: waiting until its previous instance is deleted",
                                        plan::describe(id)
                                    )));
                                }
                                Deletion::Kept(why) if hooks::runs_to_completion(id) => {
                                    let why = format!(
                                        "{} exists from an earlier run and cannot be replaced ({why}); delete it to run the hook again",
                                        plan::describe(id)
                                    );
                                    return Err(self.fail(run, hook_objects, hook, why).await);
                                }
                                _ => {}
                            },
                            Existing::Update => {}
                            Existing::Refuse(why) => {
                                return Err(self.fail(run, hook_objects, hook, why).await);
                            }
                        }
                    }
                    let object = match adopted {
                        Some(existing) => {
                            tracing::info!(hook = %plan::describe(id), event = event_name, "hook adopted: started by a pass that did not record it");
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
                        None => {
                            let mut stamped = hook.object.clone();
                            if let Some(metadata) = stamped
                                .body
                                .get_mut("metadata")
                                .and_then(Value::as_object_mut)
                            {
                                let annotations =
                                    metadata.entry("annotations").or_insert(Value::Null);
                                if !annotations.is_object() {
                                    *annotations = json!({});
                                }
                                annotations[hooks::RUN_ANNOTATION] = json!(stamp);
                            }
                            self.fence.check()?;
                            let applied = self.cluster.apply(&stamped, &self.uid).await?;
                            self.ctx.metrics.applied.inc();
                            tracing::info!(hook = %plan::describe(id), event = event_name, "hook started");
                            run.running = Some(RunningHook {
                                object: id.clone(),
                                uid: applied.uid().unwrap_or_default(),
                                started: Time(Timestamp::now()),
                            });
                            applied
                        }
                    };
                    (hook, object)
                }
                Step::Watch(hook) => {
                    let id = &hook.object.id;
                    let expected = run.running.as_ref().map(|r| r.uid.as_str());
                    match self.cluster.get(id).await? {
                        Some(object) if object.uid().as_deref() == expected => (hook, object),
                        gone => {
                            if gone.is_none()
                                && deleting
                                && let Some(why) = self.namespace_unusable(id).await?
                            {
                                // Deleted with its namespace: nothing to wait for.
                                self.skip(run, hook, event, &why).await?;
                                continue;
                            }
                            let ttl = hook
                                .object
                                .body
                                .pointer("/spec/ttlSecondsAfterFinished")
                                .is_some();
                            let why = format!(
                                "{event_name} hook {} was deleted or replaced before it was seen to finish{}",
                                plan::describe(id),
                                if ttl && gone.is_none() {
                                    " (its ttlSecondsAfterFinished may have removed it: whether it succeeded is unknown; give it a TTL of a minute or more)"
                                } else {
                                    ""
                                }
                            );
                            return Err(self.fail(run, hook_objects, hook, why).await);
                        }
                    }
                }
            };
            let id = &hook.object.id;
            let body = serde_json::to_value(&object).unwrap_or(Value::Null);
            match hooks::hook_state(id, &body) {
                HookState::Succeeded => {
                    tracing::info!(hook = %plan::describe(id), event = event_name, "hook succeeded");
                    run.completed.push(id.clone());
                    run.running = None;
                }
                HookState::Running(why) => {
                    let limit = hooks::timeout(hook, self.ctx.hook_timeout);
                    let started = run.running.as_ref().map(|r| r.started.clone());
                    if started.is_some_and(|s| hooks::timed_out(&s, limit, &Time(Timestamp::now())))
                    {
                        let why = format!(
                            "{event_name} hook {} did not finish within {limit:?}",
                            plan::describe(id)
                        );
                        return Err(self.fail(run, hook_objects, hook, why).await);
                    }
                    let position = run.completed.len() + 1;
                    return Ok(PhaseOutcome::Waiting(format!(
                        "{event_name} hook {position} of {}: {why}",
                        hooks.len()
                    )));
                }
                HookState::Failed(why) => {
                    let why = format!("{event_name} hook {why}");
                    return Err(self.fail(run, hook_objects, hook, why).await);
                }
            }
        }
    }

    /// Fails the run. When the hook's policy says `hook-failed` it is deleted — after the
    /// failure is saved, so that a pass that ends without writing its status does not start the
    /// hook again.
    async fn fail(
        &self,
        run: &mut HookRun,
        hook_objects: &mut Option<Vec<InventoryEntry>>,
        hook: &Hook,
        why: String,
    ) -> ReconcileError {
        tracing::warn!(hook = %plan::describe(&hook.object.id), "hook failed: {why}");
        hooks::fail(run, &why, self.manifest.meta().generation);
        if hooks::delete_on_failure(hook) {
            if let Err(e) = self.save_run(run).await {
                return e; // retried: the next pass sees the failure again
            }
            if let Err(e) = self.delete(hook_objects, &hook.object.id).await {
                return e; // retried: the run is recorded as failed; deleted with the Manifest
            }
        }
        ReconcileError::HookFailed(why)
    }

    /// Writes `status.hookRun` now (before a step that must not be repeated or undone by a pass
    /// that reads an older run).
    async fn save_run(&self, run: &HookRun) -> Result<(), ReconcileError> {
        self.fence.check()?;
        patch_status(self.manifest, self.ctx, json!({ "hookRun": run })).await?;
        Ok(())
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
        self.fence.check()?;
        publish(
            self.manifest,
            self.ctx,
            EventType::Warning,
            "HookSkipped",
            &note,
        )
        .await;
        run.completed.push(hook.object.id.clone());
        run.running = None;
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
            patch_status(self.manifest, self.ctx, json!({ "hookObjects": list })).await?;
            *hook_objects = Some(list);
        }
        Ok(())
    }

    /// Deletes a hook object (with the protections of any delete) and forgets it unless it is
    /// still terminating. The list is written with the pass's status.
    async fn delete(
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
        )
        .await?;
        if !matches!(
            outcome,
            Deletion::Terminating | Deletion::Deleted { terminating: true }
        ) {
            let mut list = hook_objects
                .clone()
                .unwrap_or_else(|| self.previous_hook_objects.to_vec());
            list.retain(|o| o != id);
            *hook_objects = Some(list);
        }
        Ok(outcome)
    }
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
async fn ensure_namespace(cluster: &Cluster, name: &str, uid: &str) -> Result<(), ReconcileError> {
    let namespaces = Api::<Namespace>::all(cluster.client().clone());
    // Errors are the target's (an apply on it), so that a remote target's failures are told apart.
    let failed = |source| ApplyError::Api {
        object: format!("Namespace {name}"),
        source,
    };
    if namespaces.get_opt(name).await.map_err(failed)?.is_none() {
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
            Err(e) => return Err(failed(e).into()),
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
    cluster: &Cluster,
    fence: &Fence,
    previous: &[InventoryEntry],
    recorded: &mut Option<Vec<InventoryEntry>>,
    objects: &[RenderedObject],
) -> Result<Vec<(InventoryEntry, DynamicObject)>, ReconcileError> {
    let uid = manifest.uid().unwrap_or_default();
    adopt_check(cluster, &uid, previous, objects).await?;
    record_inventory(manifest, ctx, fence, previous, recorded, objects).await?;
    let mut applied = Vec::with_capacity(objects.len());
    for object in objects {
        fence.check()?;
        applied.push((object.id.clone(), cluster.apply(object, &uid).await?));
        ctx.metrics.applied.inc();
    }
    Ok(applied)
}

/// Refuses, before anything is recorded or applied, objects new to the inventory that already
/// exist and are not this Manifest's.
async fn adopt_check(
    cluster: &Cluster,
    uid: &str,
    previous: &[InventoryEntry],
    objects: &[RenderedObject],
) -> Result<(), ReconcileError> {
    for object in objects.iter().filter(|o| !previous.contains(&o.id)) {
        cluster.check_adoptable(object, uid).await?;
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
    progress: &mut Progress,
) -> Result<Option<Pass>, ReconcileError> {
    if !manifest.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(None);
    }
    let previous = manifest.status.clone().unwrap_or_default();
    let inventory = previous.inventory.clone();
    // Nothing was ever applied (no object, no hook object): nothing to remove, no target to
    // contact, no delete hooks to run.
    let applied = !previous.inventory.is_empty() || !previous.hook_objects.is_empty();
    if manifest.spec.deletion_policy == DeletionPolicy::Delete && applied {
        let cluster = match resolve_target(manifest, ctx).await {
            // The target cannot be named any more: release rather than wait forever.
            Err(ReconcileError::Target(gone)) if gone.target_gone() => {
                let objects = previous.inventory.len() + previous.hook_objects.len();
                return release_target_gone(manifest, ctx, fence, &gone, objects).await;
            }
            result => result?,
        };
        let removed = delete_on(manifest, ctx, &cluster, fence, progress, &previous).await;
        if let Some(pass) = observe(&cluster, ctx, removed)? {
            return Ok(Some(pass));
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

/// The deletion on `cluster`: the pre-delete hooks, the inventory (reverse install order), the
/// post-delete hooks, then every hook object still recorded. `Some(pass)` while a hook runs or
/// an object is still terminating; `None` once everything is gone.
async fn delete_on(
    manifest: &Manifest,
    ctx: &Context,
    cluster: &Cluster,
    fence: &Fence,
    progress: &mut Progress,
    previous: &crate::api::ManifestStatus,
) -> Result<Option<Pass>, ReconcileError> {
    let uid = manifest.uid().unwrap_or_default();
    let manifest_namespace = manifest.namespace().unwrap_or_default();
    let mut inventory = previous.inventory.clone();
    let scope = HookScope {
        manifest,
        ctx,
        cluster,
        fence,
        uid: uid.clone(),
        manifest_namespace: manifest_namespace.clone(),
        previous_hook_objects: &previous.hook_objects,
    };
    let run = progress.hook_run.insert(hooks::current_run(
        previous.hook_run.as_ref(),
        true,
        "",
        manifest.meta().generation,
        true,
    ));
    if run.phase == HookRunPhase::Failed {
        return Err(ReconcileError::HookFailed(
            run.message.clone().unwrap_or_default(),
        ));
    }
    let deleting = |reason, message: String, requeue, facts: Facts| Pass {
        outcome: Outcome {
            state: State::Deleting,
            reason,
            message,
            rendered: None,
            applied: None,
            stalled: false,
            operation: None,
        },
        facts,
        requeue,
    };

    // Pre-delete hooks, before any object is deleted (the phase moves on once they are done).
    if run.phase == HookRunPhase::PreHooks
        && let Some(message) = scope
            .delete_hooks(run, &mut progress.hook_objects, HookEvent::PreDelete)
            .await?
    {
        return Ok(Some(deleting(
            "HookRunning",
            message,
            HOOK_REQUEUE,
            progress.facts(),
        )));
    }

    if run.phase == HookRunPhase::Objects {
        plan::sort_for_deletion(&mut inventory);
        // Objects still terminating; the next pass looks again (without deleting them
        // twice).
        let mut remaining = Vec::new();
        for id in &inventory {
            let outcome = delete_object(ctx, cluster, fence, id, &manifest_namespace, &uid).await?;
            if matches!(
                outcome,
                Deletion::Terminating | Deletion::Deleted { terminating: true }
            ) {
                remaining.push(plan::describe(id));
            }
        }
        if let Some(first) = remaining.first() {
            let message = format!(
                "waiting for {} objects to be deleted: {first}",
                remaining.len()
            );
            return Ok(Some(deleting(
                "Deleting",
                message,
                deletion_requeue(manifest),
                progress.facts(),
            )));
        }
        hooks::advance(run);
    }

    // Post-delete hooks, once the objects are gone.
    if run.phase == HookRunPhase::PostHooks
        && let Some(message) = scope
            .delete_hooks(run, &mut progress.hook_objects, HookEvent::PostDelete)
            .await?
    {
        return Ok(Some(deleting(
            "HookRunning",
            message,
            HOOK_REQUEUE,
            progress.facts(),
        )));
    }

    // Then every hook object still recorded (those the policies left, the delete hooks
    // themselves): nothing is left behind once the Manifest is gone.
    let mut left = progress
        .hook_objects
        .clone()
        .unwrap_or_else(|| previous.hook_objects.clone());
    plan::sort_for_deletion(&mut left);
    let mut remaining = Vec::new();
    for id in &left {
        if let Deletion::Terminating | Deletion::Deleted { terminating: true } =
            scope.delete(&mut progress.hook_objects, id).await?
        {
            remaining.push(plan::describe(id));
        }
    }
    if let Some(first) = remaining.first() {
        let message = format!(
            "waiting for {} hook objects to be deleted: {first}",
            remaining.len()
        );
        return Ok(Some(deleting(
            "Deleting",
            message,
            deletion_requeue(manifest),
            progress.facts(),
        )));
    }
    Ok(None)
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
        let rendered = async {
            let mut request = render_request(self.manifest, self.ctx, self.cluster).await?;
            request.is_upgrade = !self
                .manifest
                .status
                .as_ref()
                .is_none_or(|s| s.inventory.is_empty());
            let rendered = self.ctx.renderer.render(&request).await?;
            let plan = plan::plan(plan::parse_documents(&rendered.manifest)?)?;
            prepare_hooks(self.cluster, &plan.hooks, event, &request.namespace).await
        };
        let hooks = match rendered.await {
            Ok(hooks) => hooks,
            Err(e) if cannot_render_for_good(&e) => {
                // A hook of this phase that is running is still waited for (within the default
                // timeout: its own annotation cannot be read any more); the rest are skipped.
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
                        "{} hook {}: {why} (the hooks after it are skipped: {e})",
                        event.as_str(),
                        plan::describe(&running.object)
                    )));
                }
                let note = format!("{} hooks not run: {e}", event.as_str());
                tracing::warn!(category = e.category(), "{note}");
                self.fence.check()?;
                publish(
                    self.manifest,
                    self.ctx,
                    EventType::Warning,
                    "HookSkipped",
                    &note,
                )
                .await;
                hooks::advance(run);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match self.run_phase(run, hook_objects, &hooks, event).await? {
            PhaseOutcome::Done => Ok(None),
            PhaseOutcome::Waiting(message) => Ok(Some(message)),
        }
    }
}

/// Whether a render for the delete hooks failed in a way retrying cannot fix (a missing values
/// source counts: it may have been deleted together with the Manifest).
fn cannot_render_for_good(error: &ReconcileError) -> bool {
    match error {
        // A kind the target does not serve (yet) may appear (its CRD installed): retried.
        ReconcileError::Plan(PlanError::UnknownKind(_)) => false,
        ReconcileError::Chart(_)
        | ReconcileError::ValuesSource(_)
        | ReconcileError::Values(_)
        | ReconcileError::Plan(_) => true,
        ReconcileError::Render(e) => e.is_permanent(),
        _ => false,
    }
}

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
    cluster: &Cluster,
    fence: &Fence,
    id: &InventoryEntry,
    manifest_namespace: &str,
    uid: &str,
) -> Result<Deletion, ReconcileError> {
    fence.check()?;
    let outcome = match plan::protected(id, manifest_namespace) {
        Some(reason) => Deletion::Kept(reason),
        None => cluster.delete(id, uid).await?,
    };
    count_deletion(ctx, id, &outcome);
    Ok(outcome)
}

/// Counts an object deleted in this pass in the metrics; logs one that is left in place.
fn count_deletion(ctx: &Context, id: &InventoryEntry, outcome: &Deletion) {
    match outcome {
        Deletion::Deleted { .. } => {
            ctx.metrics.deleted.inc();
            tracing::info!(object = %plan::describe(id), "deleted");
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
    fn progress_is_looked_at_soon_after_the_apply_then_less_often() {
        assert_eq!(progress_requeue(Duration::ZERO), PROGRESS_REQUEUE_MIN);
        assert_eq!(
            progress_requeue(Duration::from_secs(3)),
            Duration::from_millis(1500)
        );
        assert_eq!(progress_requeue(Duration::from_secs(60)), PROGRESS_REQUEUE);
        let since = |state: State, reconciling: &str, seconds_ago: i64| {
            let now = Timestamp::now();
            let status = ManifestStatus {
                state: Some(state),
                conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    type_: "Reconciling".into(),
                    status: reconciling.into(),
                    reason: "Progressing".into(),
                    message: String::new(),
                    observed_generation: Some(2),
                    last_transition_time: Time(
                        now - k8s_openapi::jiff::SignedDuration::from_secs(seconds_ago),
                    ),
                }],
                ..Default::default()
            };
            rolling_out_for(&status, now)
        };
        assert_eq!(since(State::Processing, "True", 8), Duration::from_secs(8));
        // The first pass after a change: the previous state was Ready, nothing waited yet.
        assert_eq!(since(State::Ready, "False", 8), Duration::ZERO);
        // A clock behind the writer's: no negative wait.
        assert_eq!(since(State::Processing, "True", -8), Duration::ZERO);
    }

    #[test]
    fn event_notes_are_cut_by_bytes_at_a_character_boundary() {
        assert_eq!(truncate("abc", 1024), "abc");
        let long = "é".repeat(1000); // 2 bytes each
        let cut = truncate(&long, 1023);
        assert_eq!(cut.len(), 1022);
        assert!(long.starts_with(cut));
    }

    #[test]
    fn delete_hooks_are_skipped_only_when_the_render_cannot_be_made_for_good() {
        assert!(cannot_render_for_good(&ReconcileError::ValuesSource(
            "Secret s does not exist".into()
        )));
        assert!(cannot_render_for_good(&ReconcileError::Plan(
            PlanError::Duplicate("Secret/s".into())
        )));
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
        let unreachable = fetch(crate::source::FetchError::Unreachable {
            url: "http://charts.example.com/index.yaml".into(),
            reason: "connection refused".into(),
        });
        assert!(!unreachable.is_permanent());
        assert_eq!(unreachable.category(), "ChartError");
        let mismatch = fetch(crate::source::FetchError::DigestMismatch {
            expected: "a".into(),
            actual: "b".into(),
        });
        assert!(mismatch.is_permanent());
    }
}
