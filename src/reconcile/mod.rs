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
//! errors (`error.rs`). What every phase shares: the [`Context`] (`context.rs`) and a pass's
//! requeue timings and records (`pass.rs`). This file only runs one pass over the phases.

#[cfg(test)]
mod argocd_health;
mod context;
mod delete;
mod deletion_cap;
mod dependencies;
mod drift_check;
mod error;
mod finalizer;
mod hook_runner;
mod inputs;
mod install;
mod objects;
mod pass;
pub mod preview;
mod records;
mod relabel;
mod rollout;
mod target;
mod written;

use std::sync::Arc;
use std::time::Duration;

use kube::Resource;

use crate::api::{Manifest, State};
use crate::plan::status::{Operation, Outcome, Reason};
use crate::plan::trigger::{self, Requests};
use crate::shard::fence::Fence;

pub use context::{Context, DependencyRules, PASS_DEADLINE, PassLimits, Rollouts};
pub use deletion_cap::DeletionCap;
pub use error::ReconcileError;
pub use finalizer::FINALIZER;
pub use pass::{Next, progress_requeue};
use pass::{Pass, Progress};
use records::Stored;
pub use relabel::relabel;
pub use written::LastWrites;

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

/// Reconciles one Manifest; writes its status and Events. Never panics on bad input.
pub async fn reconcile(manifest: Arc<Manifest>, ctx: &Context, fence: &Fence) -> Next {
    let started = std::time::Instant::now();
    let (next, result) = pass(manifest, ctx, fence).await;
    ctx.metrics
        .duration
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics.count_pass(result.as_str(), result.category());
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
            let next = next_after(&pass);
            let written =
                records::write_status(&manifest, &stored, ctx, fence, &pass.outcome, pass.facts);
            match written.await {
                Ok(()) => (next, result),
                Err(e) => retry(e),
            }
        }
        Err(error) => {
            let (manifest, stored) = (&manifest, &stored);
            failed(manifest, stored, ctx, fence, (interval, &progress), error).await
        }
    }
}

/// When to look again after a successful pass: its work goes on while it is in progress (a
/// rollout, a hook, a deletion waiting for its objects) — but a wait for other Manifests
/// (dependencies, dependents, the turn of a deletion under the fleet's cap, a rollout's
/// batches) is a poll, not work
/// of its own: fresh work, which its
/// dependencies' first passes must not wait behind (they are woken when those change).
fn next_after(pass: &Pass) -> Next {
    let waits_for_others = matches!(
        pass.outcome.reason,
        Reason::DependencyNotReady
            | Reason::DependentsExist
            | Reason::DeletionRateLimited
            | Reason::RolloutWaiting
            | Reason::RolloutPaused
    );
    let in_progress = matches!(pass.outcome.state, State::Processing | State::Deleting);
    if in_progress && !waits_for_others {
        Next::Continue(pass.requeue)
    } else {
        Next::After(pass.requeue)
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
    let label = finalizer::shard_label(cached, ctx);
    let claims = cached.meta().deletion_timestamp.is_none() && !cached.spec.suspend;
    if claims && finalizer::needs_claim(cached, label.as_deref()) {
        match finalizer::claim(cached, ctx, fence, label.as_deref()).await {
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
    if let ReconcileError::Dependency(_) = error {
        // A cycle (or a refused namespace) is looked at again like a dependency wait: its
        // other members' changes wake it only through labels and watches, an optimisation.
        let recheck = interval.min(dependencies::DEPENDENCY_RECHECK);
        (Next::After(recheck), result)
    } else if error.is_permanent() {
        (Next::After(interval), result)
    } else {
        (Next::Retry(error), result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
