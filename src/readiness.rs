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

/// Readiness of Deployments, StatefulSets, DaemonSets (rolled out), Jobs (complete) and CRDs
/// (established); every other kind is ready once applied.
pub fn readiness(id: &InventoryEntry, object: &Value) -> Readiness {
    let generation = int(object, "/metadata/generation");
    let observed = int(object, "/status/observedGeneration");
    let waiting = |what: String| Readiness::Waiting(format!("{} {}: {what}", id.kind, id.name));
    match (id.group.as_str(), id.kind.as_str()) {
        ("apps", "Deployment") | ("apps", "StatefulSet") => {
            let desired = object
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let updated = int(object, "/status/updatedReplicas");
            let ready_field = if id.kind == "Deployment" {
                "/status/availableReplicas"
            } else {
                "/status/readyReplicas"
            };
            let ready = int(object, ready_field);
            if observed < generation {
                waiting("the controller has not observed the latest spec".into())
            } else if updated < desired || ready < desired {
                waiting(format!(
                    "{ready} of {desired} replicas ready, {updated} updated"
                ))
            } else {
                Readiness::Ready
            }
        }
        ("apps", "DaemonSet") => {
            let desired = int(object, "/status/desiredNumberScheduled");
            let updated = int(object, "/status/updatedNumberScheduled");
            let available = int(object, "/status/numberAvailable");
            if observed < generation {
                waiting("the controller has not observed the latest spec".into())
            } else if updated < desired || available < desired {
                waiting(format!(
                    "{available} of {desired} pods available, {updated} updated"
                ))
            } else {
                Readiness::Ready
            }
        }
        ("batch", "Job") => {
            if condition_true(object, "Failed") {
                let message = condition(object, "Failed")
                    .and_then(|c| c["message"].as_str())
                    .unwrap_or("");
                Readiness::Failed(format!("Job {} failed: {message}", id.name))
            } else if condition_true(object, "Complete") {
                Readiness::Ready
            } else {
                waiting("not complete".into())
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            if condition_true(object, "Established") {
                Readiness::Ready
            } else {
                waiting("not established".into())
            }
        }
        _ => Readiness::Ready,
    }
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
    fn daemonsets_jobs_and_crds() {
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
        let crd = id("apiextensions.k8s.io", "CustomResourceDefinition");
        assert!(matches!(
            readiness(&crd, &json!({"status": {}})),
            Readiness::Waiting(_)
        ));
        assert_eq!(
            readiness(&id("", "ConfigMap"), &json!({})),
            Readiness::Ready
        );
    }
}
