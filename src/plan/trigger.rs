//! Requests (pure): the pass asked for now (`reconcile.modulemanager.io/requestedAt`) and the
//! reset (`reconcile.modulemanager.io/resetAt`) a Manifest carries, and the status a pass starts
//! from when a reset is pending.
//!
//! Flux's model (fluxcd/pkg `apis/meta` `ReconcileRequestAnnotation`, helm-controller
//! `api/v2/annotations.go` `ResetRequestAnnotation`): any new value of the annotation asks once;
//! the pass that handles it echoes the value in `status.lastHandledReconcileAt` /
//! `status.lastHandledResetAt`, so a client knows its request was seen.

use crate::api::{Manifest, ManifestStatus, RECONCILE_REQUESTED_AT, RESET_REQUESTED_AT};
use crate::plan::hooks;

/// The requests of a Manifest that no pass has handled yet (their annotation values).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    /// A pass now: `requestedAt` differs from `status.lastHandledReconcileAt`.
    pub reconcile: Option<String>,
    /// A reset: `resetAt` differs from `status.lastHandledResetAt`.
    pub reset: Option<String>,
}

/// The value of a request annotation when it asks for something: set, not empty, and not the
/// value a pass handled last.
pub fn pending<'a>(value: Option<&'a str>, handled: Option<&str>) -> Option<&'a str> {
    value.filter(|v| !v.is_empty() && Some(*v) != handled)
}

/// The value of annotation `key` of `manifest`.
fn annotation<'a>(manifest: &'a Manifest, key: &str) -> Option<&'a str> {
    let annotations = manifest.metadata.annotations.as_ref()?;
    annotations.get(key).map(String::as_str)
}

impl Requests {
    /// The pending requests of `manifest`.
    pub fn of(manifest: &Manifest) -> Self {
        let status = manifest.status.as_ref();
        let pending_of = |key: &str, handled: Option<&String>| {
            pending(annotation(manifest, key), handled.map(String::as_str)).map(ToOwned::to_owned)
        };
        Self {
            reconcile: pending_of(
                RECONCILE_REQUESTED_AT,
                status.and_then(|s| s.last_handled_reconcile_at.as_ref()),
            ),
            reset: pending_of(
                RESET_REQUESTED_AT,
                status.and_then(|s| s.last_handled_reset_at.as_ref()),
            ),
        }
    }
}

/// Echoes in `status` (the next status of a pass of `manifest`) the requests the pass read:
/// `lastHandledReconcileAt` and `lastHandledResetAt` take the annotations' values (one not set
/// or empty keeps the status' value). Every status write of a pass carries them, so the echo
/// costs no write of its own.
pub fn echo(status: &mut ManifestStatus, manifest: &Manifest) {
    let value = |key| {
        annotation(manifest, key)
            .filter(|v| !v.is_empty())
            .map(ToOwned::to_owned)
    };
    if let Some(handled) = value(RECONCILE_REQUESTED_AT) {
        status.last_handled_reconcile_at = Some(handled);
    }
    if let Some(handled) = value(RESET_REQUESTED_AT) {
        status.last_handled_reset_at = Some(handled);
    }
}

/// The status a pass starts from when a reset is pending, so that whatever the pass writes (its
/// status, or an error status) records the reset with its echo: a failed hook run is replaced by
/// a new run for the same inputs ([`hooks::restart`]: its hooks run again), and the readiness
/// wait starts over (`spec.timeout` counts from this pass). Any other permanent error (a chart
/// or values error, an object that failed) needs nothing: every pass starts from the spec and
/// the cluster, and the reset's pass is that new try.
pub fn after_reset(status: &ManifestStatus, generation: Option<i64>) -> ManifestStatus {
    let mut status = status.clone();
    if let Some(run) = &status.hook_run
        && let Some(again) = hooks::restart(run, generation, status.inventory.is_empty())
    {
        status.hook_run = Some(again);
    }
    status.readiness_started = None;
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HookOperation, HookRun, HookRunPhase};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn manifest(annotations: serde_json::Value, status: serde_json::Value) -> Manifest {
        serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": "m", "namespace": "ns", "annotations": annotations},
            "spec": {"module": "m", "chart": {"path": "p"}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_request_is_pending_until_its_value_is_echoed() {
        assert_eq!(pending(Some("t1"), None), Some("t1"));
        assert_eq!(pending(Some("t2"), Some("t1")), Some("t2"));
        assert_eq!(pending(Some("t1"), Some("t1")), None, "handled");
        assert_eq!(pending(Some(""), None), None, "an empty value asks nothing");
        assert_eq!(pending(None, Some("t1")), None);

        let asked = manifest(
            json!({RECONCILE_REQUESTED_AT: "t2", RESET_REQUESTED_AT: "r1", "other": "x"}),
            json!({"lastHandledReconcileAt": "t1", "lastHandledResetAt": "r1"}),
        );
        assert_eq!(
            Requests::of(&asked),
            Requests {
                reconcile: Some("t2".into()),
                reset: None,
            }
        );
        let mut next = ManifestStatus {
            last_handled_reconcile_at: Some("t1".into()),
            ..Default::default()
        };
        echo(&mut next, &asked);
        assert_eq!(
            (
                next.last_handled_reconcile_at.as_deref(),
                next.last_handled_reset_at.as_deref()
            ),
            (Some("t2"), Some("r1")),
            "the pass echoes what it read"
        );
        let handled = manifest(json!({RECONCILE_REQUESTED_AT: "t2"}), json!(next.clone()));
        assert_eq!(Requests::of(&handled), Requests::default(), "echoed: done");
        let plain = manifest(json!({"other": "x"}), json!({}));
        assert_eq!(Requests::of(&plain), Requests::default());
        let before = next.clone();
        echo(&mut next, &plain);
        assert_eq!(next, before, "no annotation: the echo is kept");
        let fresh = manifest(json!({RESET_REQUESTED_AT: "r1"}), json!(null));
        assert_eq!(Requests::of(&fresh).reset.as_deref(), Some("r1"));
    }

    #[test]
    fn a_reset_restarts_a_failed_hook_run_and_the_readiness_wait() {
        let failed = HookRun {
            id: "r1".into(),
            operation: HookOperation::Upgrade,
            inputs_digest: "sha256:a".into(),
            generation: Some(3),
            phase: HookRunPhase::Failed,
            completed: vec![],
            running: None,
            message: Some("pre-upgrade hook Job m-migrate failed".into()),
        };
        let started = Time("2026-12-01T12:00:00Z".parse().unwrap());
        let status = ManifestStatus {
            hook_run: Some(failed.clone()),
            readiness_started: Some(started.clone()),
            last_handled_reset_at: Some("r0".into()),
            ..Default::default()
        };
        let reset = after_reset(&status, Some(3));
        let run = reset.hook_run.clone().unwrap();
        assert_eq!(run.phase, HookRunPhase::PreHooks);
        assert_eq!(run.inputs_digest, failed.inputs_digest);
        assert_ne!(run.id, failed.id);
        assert_eq!(reset.readiness_started, None, "spec.timeout counts anew");
        assert_eq!(
            reset.last_handled_reset_at.as_deref(),
            Some("r0"),
            "the echo is the pass's to write"
        );
        // A run that did not fail is kept as it is.
        let done = HookRun {
            phase: HookRunPhase::Done,
            ..failed
        };
        let status = ManifestStatus {
            hook_run: Some(done.clone()),
            readiness_started: Some(started),
            ..Default::default()
        };
        assert_eq!(after_reset(&status, Some(3)).hook_run, Some(done));
        assert_eq!(
            after_reset(&ManifestStatus::default(), Some(1)),
            ManifestStatus::default()
        );
    }
}
