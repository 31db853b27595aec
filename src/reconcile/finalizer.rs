//! Finalizer: the one place that adds the Manifest's finalizer (with its shard label) and
//! removes it (releasing the Manifest).

use kube::ResourceExt;
use serde_json::json;

use super::records::patch_metadata;
use super::{Context, ReconcileError};
use crate::api::{HAS_DEPENDENCIES_LABEL, Manifest};
use crate::shard::SHARD_LABEL;

/// The finalizer that keeps a Manifest until its objects are gone.
pub const FINALIZER: &str = "modulemanager.io/finalizer";

/// Whether the Manifest carries the finalizer.
pub(super) fn held(manifest: &Manifest) -> bool {
    manifest.finalizers().iter().any(|f| f == FINALIZER)
}

/// Whether the Manifest has a `spec.dependsOn` but not yet the label saying so (a dependency
/// being deleted lists the Manifests carrying it).
pub(super) fn unlabelled_dependent(manifest: &Manifest) -> bool {
    !manifest.spec.depends_on.is_empty() && !manifest.labels().contains_key(HAS_DEPENDENCIES_LABEL)
}

/// Adds the finalizer and stamps the shard label (and, with a `spec.dependsOn`, the label
/// `modulemanager.io/has-dependencies`) in one write, guarded by the resourceVersion the
/// decision was made on.
pub(super) async fn claim(
    manifest: &Manifest,
    ctx: &Context,
    shard: &str,
) -> Result<(), ReconcileError> {
    let mut finalizers = manifest.finalizers().to_vec();
    if !held(manifest) {
        finalizers.push(FINALIZER.to_owned());
    }
    let mut labels = json!({ SHARD_LABEL: shard });
    if !manifest.spec.depends_on.is_empty() {
        labels[HAS_DEPENDENCIES_LABEL] = json!("true");
    }
    patch_metadata(
        manifest,
        ctx,
        json!({"finalizers": finalizers, "labels": labels}),
    )
    .await
}

/// Removes the finalizer (the Manifest goes), guarded by the resourceVersion the decision was
/// made on.
pub(super) async fn release(manifest: &Manifest, ctx: &Context) -> Result<(), ReconcileError> {
    let finalizers: Vec<String> = manifest
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_metadata(manifest, ctx, json!({ "finalizers": finalizers })).await
}
