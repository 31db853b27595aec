//! Reconcile: the pipeline for one Manifest.
//!
//! read → resolve chart → values → render (cached) → plan (pure) → pre-install/pre-upgrade
//! hooks → apply (CRDs first) → prune (guarded) → readiness → post-install/post-upgrade hooks →
//! status. Deletion: finalizer, pre-delete hooks, delete the inventory in reverse order, wait
//! until it is gone, post-delete hooks, delete the remaining hook objects, release. A hook Job
//! that runs ends the pass (`Processing`, requeue); the run's progress is in `status.hookRun`.
//! Every step has its own error type; a failed pass writes an `Error` status and a Warning
//! Event and deletes nothing.
//!
//! The phases, one file each: `install.rs`, `delete.rs`, the hook runner (`hook_runner.rs`), the
//! inputs of a render (`inputs.rs`), the objects' applies and deletes (`objects.rs`), the writes
//! to the Manifest itself (`records.rs`, `finalizer.rs`, `relabel.rs`: a wrong shard label), the target (`target.rs`),
//! the wait for `spec.dependsOn` and a deletion's wait for dependents (`dependencies.rs`) and the
//! errors (`error.rs`).

#[cfg(test)]
mod argocd_health;
mod delete;
mod dependencies;
mod error;
mod finalizer;
mod hook_runner;
mod inputs;
mod install;
mod objects;
pub mod preview;
mod records;
mod relabel;
mod target;
mod written;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::Reporter;
use kube::{Client, Resource, ResourceExt};

use crate::api::{HookRun, InventoryEntry, Manifest, ManifestStatus, State};
use crate::apply::Cluster;
use crate::apply::identity::Tenancy;
use crate::apply::target::TargetClients;
use crate::plan::PlanLimits;
use crate::plan::status::{Facts, Operation, Outcome, Reason};
use crate::plan::trigger::{self, Requests};
use crate::render::HelmRenderer;
use crate::shard::ShardCount;
use crate::shard::fence::Fence;
use crate::source::{Limits, RemoteCharts};
use crate::telemetry::metrics::{QueueCounts, ReconcileMetrics, ResultLabels};

pub use dependencies::DependencyRules;
pub use error::ReconcileError;
pub use finalizer::FINALIZER;
use records::Stored;
pub use relabel::relabel;
pub use written::LastWrites;

/// How long to wait for CRDs of a chart to become Established within one pass.
const CRD_ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// The default pass deadline (`--pass-deadline-seconds`): well above the sum of the steps'
/// own bounds on a healthy pass (a chart fetch 60 s, a render 30 s, CRDs 30 s).
pub const PASS_DEADLINE: Duration = Duration::from_secs(300);
/// How old the target's discovery may be before a pass refreshes it (upgrades, new APIs).
const DISCOVERY_MAX_AGE: Duration = Duration::from_secs(300);
/// Longest requeue while workloads roll out or objects are being deleted.
const PROGRESS_REQUEUE: Duration = Duration::from_secs(5);
/// Shortest such requeue: right after an apply or a delete.
const PROGRESS_REQUEUE_MIN: Duration = Duration::from_millis(500);
/// Requeue while a hook (a Job) runs: a pass looks at it and returns.
const HOOK_REQUEUE: Duration = Duration::from_secs(2);
/// Longest requeue of a module stalled by its objects (one failed, or not ready past
/// `spec.timeout`): most such causes pass by themselves (a crash loop while a database starts,
/// a Pod unschedulable until a node is added, a rollout past its progress deadline that
/// recovers), and nothing watches the module's objects, so `spec.interval` (up to a day) would
/// keep it `Stalled` long after the cause is gone.
const STALLED_RECHECK: Duration = Duration::from_secs(60);

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
    /// Whose identity each Manifest's objects are written with (impersonated ServiceAccounts,
    /// their clients), and what no module may write.
    pub tenancy: Tenancy,
    /// The pass deadline and the caps on a render.
    pub pass_limits: PassLimits,
    /// This replica's last write of each Manifest: a pass starts from the watch cache when it
    /// holds that write (no read).
    pub written: LastWrites,
    /// Whether dependencies may cross namespaces.
    pub dependencies: DependencyRules,
    /// The work queue's counts (`(due, scheduled)`, installed by the controller): a pass does
    /// not wait for its workloads while other keys are due.
    pub queue: QueueCounts,
}

/// Bounds on one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassLimits {
    /// Longest a pass may run: past it, it is stopped where it is (as a crash would stop it:
    /// the inventory is recorded before anything is applied), ends with a transient error and
    /// frees its worker. Each step has its own, shorter bound (render, chart fetch, CRDs, remote
    /// requests); this one bounds their sum and anything between them.
    pub deadline: Duration,
    /// Caps on one render's objects and on the inventory.
    pub plan: PlanLimits,
}

impl Default for PassLimits {
    fn default() -> Self {
        Self {
            deadline: PASS_DEADLINE,
            plan: PlanLimits::default(),
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

/// How a pass ended, for the metrics (`result` and `category` labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PassResult {
    /// Nothing to do: the Manifest is gone, released, or its deletion finished.
    Done,
    /// `spec.suspend` is set.
    Suspended,
    /// Every object is applied and ready.
    Ready,
    /// Objects roll out or a hook runs.
    Processing,
    /// Applied, with a warning (a refused prune).
    Warning,
    /// The module's objects are being deleted.
    Deleting,
    /// The pass failed, with the error's category.
    Error(&'static str),
    /// The shard was lost during the pass.
    Fenced,
}

impl PassResult {
    /// The `result` label.
    fn as_str(&self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Suspended => "suspended",
            Self::Ready => "ready",
            Self::Processing => "processing",
            Self::Warning => "warning",
            Self::Deleting => "deleting",
            Self::Error(_) => "error",
            Self::Fenced => "fenced",
        }
    }

    /// The `category` label: the error's category, or empty.
    fn category(&self) -> &'static str {
        match self {
            Self::Error(category) => category,
            Self::Fenced => "Fenced",
            _ => "",
        }
    }

    /// The result of a pass that ended with `outcome` (an `Error` outcome that is no error of
    /// a step, a readiness timeout for one, is labelled with its reason).
    fn of(outcome: &Outcome) -> Self {
        match outcome.state {
            State::Ready => Self::Ready,
            State::Processing => Self::Processing,
            State::Warning => Self::Warning,
            State::Deleting => Self::Deleting,
            State::Error => Self::Error(outcome.reason.as_str()),
        }
    }
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
    /// The UIDs of the objects this pass's applies answered with.
    learned_uids: std::collections::BTreeMap<String, String>,
    /// The target cluster's identity, read at first contact.
    target_identity: Option<String>,
    hook_objects: Option<Vec<InventoryEntry>>,
    hook_run: Option<HookRun>,
    /// The hook run as written with the inventory ([`records::record_inventory`]).
    recorded_run: Option<HookRun>,
}

impl Progress {
    fn facts(&self) -> Facts {
        Facts {
            inventory: self.inventory.clone(),
            learned_uids: self.learned_uids.clone(),
            target_identity: self.target_identity.clone(),
            hook_objects: self.hook_objects.clone(),
            hook_run: self.hook_run.clone(),
            ..Default::default()
        }
    }
}

/// Reconciles one Manifest; writes its status and Events. Never panics on bad input.
pub async fn reconcile(manifest: Arc<Manifest>, ctx: &Context, fence: &Fence) -> Next {
    let started = std::time::Instant::now();
    let (next, result) = pass(manifest, ctx, fence).await;
    ctx.metrics
        .duration
        .observe(started.elapsed().as_secs_f64());
    let labels = ResultLabels {
        result: result.as_str(),
        category: result.category(),
    };
    ctx.metrics.reconciles.get_or_create(&labels).inc();
    next
}

/// One pass, with its result for the metrics: reads the Manifest, runs the phase it is in,
/// then records the outcome.
async fn pass(manifest: Arc<Manifest>, ctx: &Context, fence: &Fence) -> (Next, PassResult) {
    let (manifest, stored) = match current(&manifest, ctx, fence).await {
        Ok(Some(fresh)) => {
            let stored = Stored::before(&fresh);
            (Arc::new(starting_point(fresh)), stored)
        }
        // Deleted meanwhile, or re-created under a new UID (queued under its own key).
        Ok(None) => {
            ctx.written.forget(&manifest);
            return (Next::Idle, PassResult::Done);
        }
        Err(ReconcileError::Fenced(lost)) => return fenced(&lost),
        Err(e) => return retry(e),
    };
    let interval = crate::api::interval(&manifest.spec).unwrap_or(Duration::from_secs(600));
    // What this pass recorded, so that an error status written from the Manifest as read at
    // the start does not drop entries recorded since (nor the hook run's progress).
    let mut progress = Progress::default();
    let deleting = manifest.meta().deletion_timestamp.is_some();
    if !deleting && manifest.spec.suspend {
        return (Next::Idle, PassResult::Suspended);
    }
    let steps = async {
        if deleting {
            delete::delete(&manifest, ctx, fence, &mut progress).await
        } else {
            install::install(&manifest, ctx, fence, interval, &mut progress).await
        }
    };
    // Past the deadline the steps are dropped where they are; what they recorded is kept.
    let deadline = ctx.pass_limits.deadline;
    let result = tokio::time::timeout(deadline, steps)
        .await
        .unwrap_or(Err(ReconcileError::PassDeadline(deadline)));
    // The shard was lost during the pass (or is being lost now): the new owner writes the
    // status; this replica writes nothing more and does not requeue.
    let result = result.and_then(|pass| fence.check().map(|()| pass).map_err(Into::into));
    let stored = stored.with_recorded(&progress);
    match result {
        Err(ReconcileError::Fenced(lost)) => fenced(&lost),
        Ok(None) => (Next::Idle, PassResult::Done),
        Ok(Some(pass)) => {
            let result = PassResult::of(&pass.outcome);
            let written =
                records::write_status(&manifest, &stored, ctx, fence, &pass.outcome, pass.facts);
            match written.await {
                Ok(()) => (Next::After(pass.requeue), result),
                Err(e) => retry(e),
            }
        }
        Err(error) => {
            let (manifest, stored) = (&manifest, &stored);
            failed(manifest, stored, ctx, fence, (interval, &progress), error).await
        }
    }
}

/// The pass stops: the shard was lost (or is being lost now). The controller drops the key if
/// the shard is gone, else retries it shortly (the deadline may pass only for a moment).
fn fenced(lost: &crate::shard::fence::FenceLost) -> (Next, PassResult) {
    tracing::warn!("stopping the pass: {lost}");
    (Next::After(Duration::from_secs(1)), PassResult::Fenced)
}

/// The Manifest as stored now, with as few reads as can be: the watch cache's copy when it
/// holds this replica's last write of it ([`LastWrites`]); for a Manifest to claim (a new one),
/// the claim's answer — the claim is guarded by the cached resourceVersion, so a cache that
/// lags fails it with a conflict and the Manifest is read; else one GET
/// ([`records::read_fresh`]). `None` when it was deleted, or re-created under a new UID.
async fn current(
    cached: &Manifest,
    ctx: &Context,
    fence: &Fence,
) -> Result<Option<Manifest>, ReconcileError> {
    if ctx.written.holds_last_write(cached, fence.epoch()) {
        return Ok(Some(cached.clone()));
    }
    let shard = ctx.shards.shard_of(&cached.uid().unwrap_or_default());
    let claims = cached.meta().deletion_timestamp.is_none() && !cached.spec.suspend;
    if claims && finalizer::needs_claim(cached, &shard.to_string()) {
        match finalizer::claim(cached, ctx, fence, &shard.to_string()).await {
            Ok(claimed) => return Ok(Some(claimed)),
            // Changed or deleted since the cache saw it: read it.
            Err(ReconcileError::WriteMetadata(kube::Error::Api(status)))
                if matches!(status.code, 404 | 409) => {}
            Err(e) => return Err(e),
        }
    }
    records::read_fresh(cached, ctx).await
}

/// The Manifest as a pass starts from it: with a reset pending (`resetAt` not yet echoed), its
/// status as the reset leaves it ([`trigger::after_reset`]), so that every status write of the
/// pass — success or error — records the reset together with its echo.
fn starting_point(mut manifest: Manifest) -> Manifest {
    let reset = Requests::of(&manifest).reset;
    if let (Some(reset), Some(status)) = (reset, &manifest.status) {
        tracing::info!(reset_at = %reset, "reset requested: a failed hook run and the readiness deadline start over");
        manifest.status = Some(trigger::after_reset(status, manifest.meta().generation));
    }
    manifest
}

/// A transient failure outside the pipeline's steps (reading the Manifest, writing its status).
fn retry(error: ReconcileError) -> (Next, PassResult) {
    let result = PassResult::Error(error.category());
    (Next::Retry(error), result)
}

/// The outcome of a pass that failed with `error` during `operation`: stalled when the error
/// is permanent, else retried (and `Reconciling`).
fn error_outcome(error: &ReconcileError, operation: Operation) -> Outcome {
    Outcome {
        state: State::Error,
        reason: Reason::Failed(error.category()),
        message: error.to_string(),
        rendered: matches!(error, ReconcileError::Render(_)).then_some(false),
        applied: matches!(
            error,
            ReconcileError::Apply(_) | ReconcileError::JobFailed(_)
        )
        .then_some(false),
        stalled: error.is_permanent(),
        operation: Some(operation),
    }
}

/// A failed pass: writes the `Error` status (keeping what the pass recorded) unless the shard
/// was lost; a permanent error waits for the interval, a transient one backs off.
async fn failed(
    manifest: &Manifest,
    stored: &Stored,
    ctx: &Context,
    fence: &Fence,
    (interval, progress): (Duration, &Progress),
    error: ReconcileError,
) -> (Next, PassResult) {
    let outcome = error_outcome(&error, records::operation(manifest));
    tracing::warn!(
        category = error.category(),
        permanent = error.is_permanent(),
        "reconcile failed: {}",
        error.for_log()
    );
    let facts = progress.facts();
    // A pass that lost its shard meanwhile must not write over the new owner's status.
    if let Err(lost) = fence.check() {
        tracing::warn!("not writing the error status: {lost}");
    } else if let Err(e) =
        records::write_status(manifest, stored, ctx, fence, &outcome, facts).await
    {
        tracing::warn!("the error status is not written: {e}");
    }
    let result = PassResult::Error(error.category());
    if error.is_permanent() {
        (Next::After(interval), result)
    } else {
        (Next::Retry(error), result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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
    fn pass_results_are_the_metric_labels() {
        let outcome = |state, reason| Outcome {
            state,
            reason,
            message: String::new(),
            rendered: None,
            applied: None,
            stalled: false,
            operation: None,
        };
        let of = |state, reason| PassResult::of(&outcome(state, reason));
        assert_eq!(of(State::Ready, Reason::Ready).as_str(), "ready");
        assert_eq!(of(State::Deleting, Reason::Deleting).as_str(), "deleting");
        let timed_out = of(State::Error, Reason::ReadinessTimeout);
        assert_eq!(
            (timed_out.as_str(), timed_out.category()),
            ("error", "ReadinessTimeout")
        );
        assert_eq!(PassResult::Suspended.as_str(), "suspended");
        assert_eq!(
            (PassResult::Fenced.as_str(), PassResult::Fenced.category()),
            ("fenced", "Fenced")
        );
        let failed = PassResult::Error("RenderError");
        assert_eq!(
            (failed.as_str(), failed.category()),
            ("error", "RenderError")
        );
        assert_eq!(PassResult::Done.category(), "");
    }
}
