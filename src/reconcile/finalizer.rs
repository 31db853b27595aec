//! Finalizer: the one place that adds the Manifest's finalizer (with its shard label on the
//! label path) and removes it (releasing the Manifest).

use kube::ResourceExt;
use serde_json::json;

use super::context::Context;
use super::error::ReconcileError;
use super::records::patch_metadata;
use crate::api::{HAS_DEPENDENCIES_LABEL, Manifest};
use crate::shard::SHARD_LABEL;
use crate::shard::fence::Fence;

/// The finalizer that keeps a Manifest until its objects are gone.
pub const FINALIZER: &str = "modulemanager.io/finalizer";

/// Whether the Manifest carries the finalizer.
pub(super) fn held(manifest: &Manifest) -> bool {
    manifest.finalizers().iter().any(|f| f == FINALIZER)
}

/// The shard label a claim stamps: the UID's shard on the label path; `None` when the API server
/// selects each replica's shards from the UID (`--server-side-sharding`): nothing reads it.
pub(super) fn shard_label(manifest: &Manifest, ctx: &Context) -> Option<String> {
    let uid = manifest.uid().unwrap_or_default();
    (ctx.shard_filter.labels()).then(|| ctx.shards.shard_of(&uid).to_string())
}

/// Whether the Manifest must be claimed by its shard's owner: it lacks the finalizer, its shard
/// label is not `label` (its UID's shard, on the label path), or it has a `spec.dependsOn` but
/// not yet the label saying so.
pub(super) fn needs_claim(manifest: &Manifest, label: Option<&str>) -> bool {
    let stamped = manifest.labels().get(SHARD_LABEL).map(String::as_str);
    !held(manifest)
        || label.is_some_and(|label| stamped != Some(label))
        || unlabelled_dependent(manifest)
}

/// Whether the Manifest has a `spec.dependsOn` but not yet the label saying so (a dependency
/// being deleted lists the Manifests carrying it).
fn unlabelled_dependent(manifest: &Manifest) -> bool {
    !manifest.spec.depends_on.is_empty() && !manifest.labels().contains_key(HAS_DEPENDENCIES_LABEL)
}

/// Adds the finalizer and stamps the shard label `label` if any (and, with a `spec.dependsOn`, the label
/// `modulemanager.io/has-dependencies`) in one write, guarded by the resourceVersion the
/// decision was made on (checks the fence first); returns the Manifest as written, which a
/// pass may start from (the guard makes it the current one).
pub(super) async fn claim(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
    label: Option<&str>,
) -> Result<Manifest, ReconcileError> {
    let mut finalizers = manifest.finalizers().to_vec();
    if !held(manifest) {
        finalizers.push(FINALIZER.to_owned());
    }
    let mut labels = json!({});
    if let Some(label) = label {
        labels[SHARD_LABEL] = json!(label);
    }
    if !manifest.spec.depends_on.is_empty() {
        labels[HAS_DEPENDENCIES_LABEL] = json!("true");
    }
    fence.check()?;
    let answer = patch_metadata(
        manifest,
        ctx,
        json!({"finalizers": finalizers, "labels": labels}),
    )
    .await?;
    ctx.written.wrote(&answer, fence.epoch());
    Ok(answer)
}

/// Removes the finalizer (the Manifest goes), guarded by the resourceVersion the decision was
/// made on, and by the fence checked right before it: the writes that precede it (an Event)
/// may have taken a while, or the process may have been stopped meanwhile.
pub(super) async fn release(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
) -> Result<(), ReconcileError> {
    fence.check()?;
    let finalizers: Vec<String> = manifest
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    ctx.written.forget(manifest);
    patch_metadata(manifest, ctx, json!({ "finalizers": finalizers })).await?;
    Ok(())
}
