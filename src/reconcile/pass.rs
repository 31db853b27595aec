//! A pass: how long it waits before looking again (the requeue timings), what it records as it
//! goes ([`Progress`]), how it ends ([`Pass`]) and what it tells the work queue ([`Next`]).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::error::ReconcileError;
use crate::api::{HookRun, InventoryEntry, ManifestStatus, State};
use crate::plan::status::{Facts, Outcome};

/// How long to wait for CRDs of a chart to become Established within one pass.
pub(super) const CRD_ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest requeue while workloads roll out or objects are being deleted.
pub(super) const PROGRESS_REQUEUE: Duration = Duration::from_secs(5);
/// Shortest such requeue: right after an apply or a delete.
pub(super) const PROGRESS_REQUEUE_MIN: Duration = Duration::from_millis(500);
/// Requeue while a hook (a Job) runs: a pass looks at it and returns.
pub(super) const HOOK_REQUEUE: Duration = Duration::from_secs(2);
/// Longest requeue of a module stalled by its objects (one failed, or not ready past
/// `spec.timeout`): most such causes pass by themselves (a crash loop while a database starts,
/// a Pod unschedulable until a node is added, a rollout past its progress deadline that
/// recovers), and nothing watches the module's objects, so `spec.interval` (up to a day) would
/// keep it `Stalled` long after the cause is gone.
pub(super) const STALLED_RECHECK: Duration = Duration::from_secs(60);

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
pub(super) fn rolling_out_for(status: &ManifestStatus, now: Timestamp) -> Duration {
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

/// The result of a pass for the work queue.
#[derive(Debug)]
pub enum Next {
    /// Reconcile again after this long.
    After(Duration),
    /// The pass's work goes on (a rollout it looks at again, a deletion waiting for its
    /// objects): look again after this long, taking turns with fresh work in the queue.
    Continue(Duration),
    /// The pass failed transiently: back off.
    Retry(ReconcileError),
    /// Nothing to do until the Manifest changes.
    Idle,
}

/// A successful pass: its outcome and the facts it learned.
pub(super) struct Pass {
    pub(super) outcome: Outcome,
    pub(super) facts: Facts,
    pub(super) requeue: Duration,
}

/// What a pass has recorded so far (or will record), so that an error status written from the
/// Manifest as read at the start keeps it: the inventory and the hook objects (written before
/// anything is applied) and the hook run's progress.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) inventory: Option<Vec<InventoryEntry>>,
    /// The UIDs of the objects this pass's applies answered with.
    pub(super) learned_uids: BTreeMap<String, String>,
    /// The target cluster's identity, read at first contact.
    pub(super) target_identity: Option<String>,
    pub(super) hook_objects: Option<Vec<InventoryEntry>>,
    pub(super) hook_run: Option<HookRun>,
    /// The hook run as written with the inventory ([`record_inventory`](super::records::record_inventory)).
    pub(super) recorded_run: Option<HookRun>,
}

impl Progress {
    pub(super) fn facts(&self) -> Facts {
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
}
