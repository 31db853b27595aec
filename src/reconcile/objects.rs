//! Objects: applying the module's objects (after the adoption check and the inventory record)
//! and deleting them (guarded, counted).

use kube::ResourceExt;
use kube::api::DynamicObject;

use super::records::record_inventory;
use super::{Context, ReconcileError};
use crate::api::{InventoryEntry, Manifest};
use crate::apply::{Cluster, Deletion};
use crate::plan::{self, RenderedObject};
use crate::shard::fence::Fence;

/// Applies `objects` in order, after refusing objects that are not this Manifest's and recording
/// them all in the inventory (nothing applied can be forgotten); the fence is checked before each
/// write. Returns each object as the server returned it.
pub(super) async fn apply_all(
    manifest: &Manifest,
    ctx: &Context,
    cluster: &Cluster,
    fence: &Fence,
    previous: &[InventoryEntry],
    recorded: &mut Option<Vec<InventoryEntry>>,
    objects: &[RenderedObject],
) -> Result<Vec<(InventoryEntry, DynamicObject)>, ReconcileError> {
    let uid = manifest.uid().unwrap_or_default();
    adopt_check(cluster, &uid, previous, objects).await?;
    record_inventory(manifest, ctx, fence, previous, recorded, objects).await?;
    let mut applied = Vec::with_capacity(objects.len());
    for object in objects {
        fence.check()?;
        applied.push((object.id.clone(), cluster.apply(object, &uid).await?));
        ctx.metrics.applied.inc();
    }
    Ok(applied)
}

/// Refuses, before anything is recorded or applied, objects new to the inventory that already
/// exist and are not this Manifest's.
async fn adopt_check(
    cluster: &Cluster,
    uid: &str,
    previous: &[InventoryEntry],
    objects: &[RenderedObject],
) -> Result<(), ReconcileError> {
    for object in objects.iter().filter(|o| !previous.contains(&o.id)) {
        cluster.check_adoptable(object, uid).await?;
    }
    Ok(())
}

/// Deletes one object of the Manifest (pruning or deletion), unless it is protected; checks the
/// fence first and counts or logs the outcome.
pub(super) async fn delete_object(
    ctx: &Context,
    cluster: &Cluster,
    fence: &Fence,
    id: &InventoryEntry,
    manifest_namespace: &str,
    uid: &str,
) -> Result<Deletion, ReconcileError> {
    fence.check()?;
    let outcome = match plan::protected(id, manifest_namespace) {
        Some(reason) => Deletion::Kept(reason),
        None => cluster.delete(id, uid).await?,
    };
    count_deletion(ctx, id, &outcome);
    Ok(outcome)
}

/// Whether a delete left the object still there (terminating): the next pass looks again.
pub(super) fn still_there(outcome: &Deletion) -> bool {
    matches!(
        outcome,
        Deletion::Terminating | Deletion::Deleted { terminating: true }
    )
}

/// Counts an object deleted in this pass in the metrics; logs one that is left in place.
fn count_deletion(ctx: &Context, id: &InventoryEntry, outcome: &Deletion) {
    match outcome {
        Deletion::Deleted { .. } => {
            ctx.metrics.deleted.inc();
            tracing::info!(object = %plan::describe(id), "deleted");
        }
        Deletion::Kept(reason) => {
            tracing::info!(object = %plan::describe(id), "left in place: {reason}")
        }
        Deletion::Terminating | Deletion::Gone => {}
    }
}
