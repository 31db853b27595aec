//! Namespace: creating a module's target namespace on its cluster, and remembering the
//! namespaces known to exist so that a pass does not read them again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};

use super::{ApplyError, Cluster, MANIFEST_UID_LABEL};

/// How long a namespace seen to exist is trusted without a read. A namespace deleted meanwhile
/// fails the next apply into it, which forgets it ([`Known::forget`]): the pass after creates it.
const KNOWN_FOR: Duration = Duration::from_secs(300);

/// Most namespaces remembered per cluster (past it, the expired ones are dropped, or all).
const MAX_KNOWN: usize = 4096;

/// The namespaces of one cluster known to exist, and since when.
#[derive(Debug, Default)]
pub(super) struct Known {
    since: Mutex<HashMap<String, Instant>>,
}

impl Known {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `name` was seen to exist less than [`KNOWN_FOR`] before `now`.
    fn holds(&self, name: &str, now: Instant) -> bool {
        self.lock()
            .get(name)
            .is_some_and(|since| now.duration_since(*since) < KNOWN_FOR)
    }

    /// `name` exists (read or created) at `now`.
    fn exists(&self, name: &str, now: Instant) {
        let mut known = self.lock();
        if known.len() >= MAX_KNOWN {
            known.retain(|_, since| now.duration_since(*since) < KNOWN_FOR);
            if known.len() >= MAX_KNOWN {
                known.clear();
            }
        }
        known.insert(name.to_owned(), now);
    }

    /// `name` may be gone: read it next time.
    pub(super) fn forget(&self, name: &str) {
        self.lock().remove(name);
    }
}

/// Creates the target namespace when missing. It is not part of the module's inventory (never
/// deleted with it), but carries the Manifest's label, so a later chart version that brings
/// this Namespace itself may take it over. A namespace seen to exist on this cluster in the
/// last five minutes is not read again.
pub async fn ensure_namespace(cluster: &Cluster, name: &str, uid: &str) -> Result<(), ApplyError> {
    if cluster.namespaces.holds(name, Instant::now()) {
        return Ok(());
    }
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
                labels: Some([(MANIFEST_UID_LABEL.to_owned(), uid.to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &namespace).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(failed(e)),
        }
    }
    cluster.namespaces.exists(name, Instant::now());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_trusted_for_a_while_and_forgotten_on_a_failed_apply() {
        let known = Known::default();
        let t0 = Instant::now();
        assert!(!known.holds("team-a", t0));
        known.exists("team-a", t0);
        assert!(known.holds("team-a", t0 + Duration::from_secs(60)));
        assert!(!known.holds("team-a", t0 + KNOWN_FOR), "read again later");
        known.forget("team-a");
        assert!(!known.holds("team-a", t0));
        for i in 0..MAX_KNOWN + 1 {
            known.exists(&format!("ns-{i}"), t0);
        }
        assert!(known.lock().len() <= MAX_KNOWN, "bounded");
    }
}
