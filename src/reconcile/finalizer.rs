//! Finalizer: the one place that adds the Manifest's finalizer (with its shard label) and
//! removes it (releasing the Manifest).

use kube::ResourceExt;
use serde_json::json;

use super::records::patch_metadata;
use super::{Context, ReconcileError};
use crate::api::Manifest;
use crate::shard::SHARD_LABEL;

/// The finalizer that keeps a Manifest until its objects are gone.
pub const FINALIZER: &str = "modulemanager.io/finalizer";

/// Whether the Manifest carries the finalizer.
pub(super) fn held(manifest: &Manifest) -> bool {
    manifest.finalizers().iter().any(|f| f == FINALIZER)
}

/// Adds the finalizer and stamps the shard label in one write, guarded by the resourceVersion
/// the decision was made on.
pub(super) async fn claim(
    manifest: &Manifest,
    ctx: &Context,
    shard: &str,
) -> Result<(), ReconcileError> {
    let mut finalizers = manifest.finalizers().to_vec();
    if !held(manifest) {
        finalizers.push(FINALIZER.to_owned());
    }
    patch_metadata(
        manifest,
        ctx,
        json!({"finalizers": finalizers, "labels": { SHARD_LABEL: shard }}),
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
