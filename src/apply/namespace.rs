//! Namespace: creating a module's target namespace on its cluster, unless it is known to exist
//! (`known_namespaces.rs`).

use std::time::Instant;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};

use super::labels::MANIFEST_UID_LABEL;
use super::{ApplyError, Cluster};

/// Creates the target namespace when missing. It is not part of the module's inventory (never
/// deleted with it), but carries the Manifest's label, so a later chart version that brings
/// this Namespace itself may take it over. A namespace seen to exist on this cluster in the
/// last 5 minutes (15 on a remote target: `known_namespaces.rs`) is not read again.
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
