//! Readiness (pure): whether an applied object is ready, from the object as the server returned it.

use serde_json::Value;

use crate::api::InventoryEntry;

/// An object's readiness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Ready.
    Ready,
    /// Not yet; the reason says what is awaited.
    Waiting(String),
    /// Failed for good (a Job that failed).
    Failed(String),
}

fn int(object: &Value, pointer: &str) -> i64 {
    object.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn condition_true(object: &Value, kind: &str) -> bool {
    condition(object, kind).is_some_and(|c| c["status"] == "True")
}

/// Readiness of Deployments, StatefulSets, DaemonSets (rolled out) and Jobs (complete); every
/// other kind is ready once applied. (CRDs are waited for until Established before anything else
/// is applied, so they never reach this check.)
pub fn readiness(id: &InventoryEntry, object: &Value) -> Readiness {
    let waiting = |what: String| Readiness::Waiting(format!("{} {}: {what}", id.kind, id.name));
    // (desired, updated, ready, what is counted) for the workloads that roll out.
    let rollout = match (id.group.as_str(), id.kind.as_str()) {
        ("apps", "Deployment") => Some((
            replicas(object),
            int(object, "/status/updatedReplicas"),
            int(object, "/status/availableReplicas"),
            "replicas available",
        )),
        ("apps", "StatefulSet") => Some((
            replicas(object),
            int(object, "/status/updatedReplicas"),
            int(object, "/status/readyReplicas"),
            "replicas ready",
        )),
        ("apps", "DaemonSet") => Some((
            int(object, "/status/desiredNumberScheduled"),
            int(object, "/status/updatedNumberScheduled"),
            int(object, "/status/numberAvailable"),
            "pods available",
        )),
        _ => None,
    };
    if let Some((desired, updated, ready, counted)) = rollout {
        return if int(object, "/status/observedGeneration") < int(object, "/metadata/generation") {
            waiting("the controller has not observed the latest spec".into())
        } else if updated < desired || ready < desired {
            waiting(format!("{ready} of {desired} {counted}, {updated} updated"))
        } else {
            Readiness::Ready
        };
    }
    if (id.group.as_str(), id.kind.as_str()) == ("batch", "Job") {
        return if condition_true(object, "Failed") {
            let message = condition(object, "Failed")
                .and_then(|c| c["message"].as_str())
                .unwrap_or("");
            Readiness::Failed(format!("Job {} failed: {message}", id.name))
        } else if condition_true(object, "Complete") {
            Readiness::Ready
        } else {
            waiting("not complete".into())
        };
    }
    Readiness::Ready
}

/// `spec.replicas`, which defaults to 1.
fn replicas(object: &Value) -> i64 {
    object
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(group: &str, kind: &str) -> InventoryEntry {
        InventoryEntry {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: "ns".into(),
            name: "x".into(),
        }
    }

    #[test]
    fn deployments_need_the_latest_generation_rolled_out() {
        let d = id("apps", "Deployment");
        let ready = json!({"metadata": {"generation": 2}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 2, "updatedReplicas": 2, "availableReplicas": 2}});
        assert_eq!(readiness(&d, &ready), Readiness::Ready);
        let stale = json!({"metadata": {"generation": 3}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 2, "updatedReplicas": 2, "availableReplicas": 2}});
        assert!(
            matches!(readiness(&d, &stale), Readiness::Waiting(m) if m.contains("not observed"))
        );
        let rolling = json!({"metadata": {"generation": 2}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 2, "updatedReplicas": 1, "availableReplicas": 2}});
        assert!(
            matches!(readiness(&d, &rolling), Readiness::Waiting(m) if m.contains("1 updated"))
        );
        let fresh = json!({"metadata": {"generation": 1}, "spec": {}});
        assert!(
            matches!(readiness(&d, &fresh), Readiness::Waiting(_)),
            "no status yet: not ready"
        );
        let scaled_to_zero = json!({"metadata": {"generation": 1}, "spec": {"replicas": 0}, "status": {"observedGeneration": 1}});
        assert_eq!(readiness(&d, &scaled_to_zero), Readiness::Ready);
    }

    #[test]
    fn statefulsets_count_ready_replicas() {
        let s = id("apps", "StatefulSet");
        let ready = json!({"metadata": {"generation": 1}, "spec": {"replicas": 3},
            "status": {"observedGeneration": 1, "updatedReplicas": 3, "readyReplicas": 3, "availableReplicas": 0}});
        assert_eq!(readiness(&s, &ready), Readiness::Ready);
    }

    #[test]
    fn daemonsets_and_jobs() {
        let ds = json!({"metadata": {"generation": 1}, "status": {"observedGeneration": 1,
            "desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberAvailable": 1}});
        assert!(matches!(
            readiness(&id("apps", "DaemonSet"), &ds),
            Readiness::Waiting(_)
        ));
        let job = id("batch", "Job");
        assert!(matches!(readiness(&job, &json!({})), Readiness::Waiting(_)));
        assert_eq!(
            readiness(
                &job,
                &json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
            ),
            Readiness::Ready
        );
        let failed = json!({"status": {"conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]}});
        assert!(
            matches!(readiness(&job, &failed), Readiness::Failed(m) if m.contains("BackoffLimitExceeded"))
        );
        assert_eq!(
            readiness(&id("", "ConfigMap"), &json!({})),
            Readiness::Ready
        );
    }
}
