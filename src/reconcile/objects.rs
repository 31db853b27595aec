//! Objects: applying the module's objects (after the inventory record, each write conditional on
//! the object being this Manifest's) and deleting them (guarded, counted).

use kube::ResourceExt;
use kube::api::DynamicObject;

use super::context::Context;
use super::drift_check::{DriftCheck, Subject};
use super::error::ReconcileError;
use super::records::{Records, record_inventory};
use crate::api::{InventoryEntry, Manifest, ManifestStatus};
use crate::apply::adoption::Owners;
use crate::apply::listed::Listing;
use crate::apply::namespace::ensure_namespace;
use crate::apply::ownership::apply_owned;
use crate::apply::{Cluster, Deletion, FIELD_MANAGER, MANIFEST_UID_LABEL};
use crate::plan::drift::{self, IgnoreRules};
use crate::plan::ownership;
use crate::plan::unchanged::Since;
use crate::plan::{self, RenderedObject};
use crate::shard::fence::Fence;

/// How a pass applies under the drift rules (`spec.driftIgnore`, the handover).
pub(super) struct DriftPass<'a> {
    /// The Manifest's checked `spec.driftIgnore`.
    pub rules: &'a IgnoreRules,
    /// Whether the render or the spec changed since the last pass that applied everything: only
    /// then can an apply lack a field the last one set (an unchanged pass applies the same
    /// bodies), so only then is an object read to see what it would release.
    pub changed: bool,
    /// A drift pass over the unchanged render of a Ready module, not asked for: objects exactly
    /// as the last apply left them ([`Cluster::since_applied`]: by the watches on the local cluster,
    /// by a listing on a remote target) are not applied again (and, unchanged since that Ready
    /// pass, are still ready).
    pub skip_unchanged: bool,
    /// `spec.drift`: what a drift pass checks and reports, and the managers it overrides.
    pub check: &'a DriftCheck,
    /// A drift pass in `disabled` mode ([`Self::skip_unchanged`] in `disabled` mode): nothing
    /// is applied; what changed since the last apply is read, not applied, so that readiness
    /// is judged on what it is now.
    pub idle: bool,
    /// The target namespace when this pass makes it only before a write into it: a remote
    /// drift pass, whose listing tells that it exists (`Cluster::list_applied`), so that a
    /// pass finding everything as it was reads no namespace.
    pub namespace_on_write: Option<&'a str>,
    /// `spec.adopt`: the objects besides its own a pass may take over ([`apply_owned`]).
    pub adopt: Option<&'a Owners>,
}

/// Whether the live object is this Manifest's, for a hand-over before an apply: its recorded UID,
/// or — none recorded — this Manifest's label. Not another object under the name, nor one refused
/// before (recorded without a UID, labelled as another Manifest's or nobody's): the guarded apply
/// decides those.
fn is_this_manifests(live: &DynamicObject, recorded_uid: Option<&String>, uid: &str) -> bool {
    match recorded_uid {
        Some(recorded) => live.metadata.uid.as_ref() == Some(recorded),
        None => live.labels().get(MANIFEST_UID_LABEL).map(String::as_str) == Some(uid),
    }
}

/// Applies `objects` in order, after recording them all in the inventory (nothing applied can be
/// forgotten); the fence is checked before each write. Each apply is conditional on the object
/// being this Manifest's ([`apply_owned`]: its recorded UID, or — new — that it does not exist
/// yet); the UIDs it learns go to `learned`. Fields the drift rules ignore are left out once an
/// object exists, and fields an apply would release are handed over first ([`hand_over`]).
/// Returns each object applied as the server returned it, and each a drift pass found changed in
/// its status only as read (not those it found untouched: [`DriftPass::skip_unchanged`]).
#[allow(clippy::too_many_arguments, reason = "the pass's parts, each borrowed")]
pub(super) async fn apply_all(
    manifest: &Manifest,
    ctx: &Context,
    cluster: &Cluster,
    fence: &Fence,
    previous: &ManifestStatus,
    records: &mut Records<'_>,
    objects: &[RenderedObject],
    pass: &DriftPass<'_>,
) -> Result<Vec<(InventoryEntry, DynamicObject)>, ReconcileError> {
    let uid = manifest.uid().unwrap_or_default();
    let previous_inventory = &previous.inventory;
    record_inventory(manifest, ctx, fence, previous, records, objects).await?;
    let learned = &mut *records.learned;
    let listing = listing(cluster, pass, &uid, objects, previous).await?;
    let mut applied = Vec::with_capacity(objects.len());
    for object in objects {
        // Applied before, also under another version (a chart moving to `autoscaling/v2`).
        let exists = crate::plan::holds(previous_inventory, &object.id);
        let mut prepared = drift::prepare(object, pass.rules, exists);
        let key = ownership::uid_key(&object.id);
        let recorded_uid = learned.get(&key).or(previous.inventory_uids.get(&key));
        if exists && pass.changed && prepared.may_release() {
            // One read, only when a field may be released.
            if let Some(live) = cluster.get(&object.id).await?
                && is_this_manifests(&live, recorded_uid, &uid)
            {
                hand_over(cluster, fence, &object.id, &prepared, &live).await?;
            }
        }
        let first_with_ignored = !exists && prepared.body != prepared.steady;
        let body = RenderedObject {
            id: object.id.clone(),
            body: std::mem::take(&mut prepared.body),
        };
        if pass.skip_unchanged && exists {
            let kept = previous.applied_stamps.get(&key).map(String::as_str);
            match cluster.since_applied(&body, &uid, &listing, kept) {
                Since::Untouched => {
                    ctx.metrics.unchanged.inc();
                    continue;
                }
                // Its status changed (a workload's controllers): read, not applied, so that its
                // readiness is judged on what it is now.
                Since::StatusOnly => {
                    if let Some(live) = cluster.read_status_only(&body, &uid).await {
                        ctx.metrics.unchanged.inc();
                        applied.push((object.id.clone(), live));
                        continue;
                    }
                }
                // Disabled mode: no drift pass — changed, it is read (for readiness), not
                // applied.
                Since::Changed if pass.idle => {
                    if let Some(live) = cluster.get(&object.id).await? {
                        applied.push((object.id.clone(), live));
                    }
                    continue;
                }
                Since::Changed => {}
            }
        }
        if let Some(namespace) = pass.namespace_on_write
            && object.id.namespace == namespace
            && !pass.check.looks_only(exists)
        {
            fence.check()?;
            ensure_namespace(cluster, namespace, &uid).await?;
        }
        let left = prepared.left_alone();
        let subject = Subject {
            object: &body,
            uid: &uid,
            recorded_uid: recorded_uid.map(String::as_str),
            left: &left,
        };
        let answer = match write_object(ctx, cluster, fence, pass, &subject, exists).await? {
            Written::Looked(live) => {
                applied.extend(live.map(|live| (object.id.clone(), live)));
                continue;
            }
            Written::Applied(answer) => answer,
        };
        if let Some(object_uid) = answer.metadata.uid.clone() {
            learned.insert(key, object_uid);
        }
        if first_with_ignored {
            // The first apply set the ignored fields: hand them over now (from the answer, no
            // read), so the next apply, without them, releases nothing to a default.
            hand_over(cluster, fence, &object.id, &prepared, &answer).await?;
        }
        applied.push((object.id.clone(), answer));
        ctx.metrics.applied.inc();
    }
    Ok(applied)
}

/// A remote target has no watch: on a pass that skips unchanged objects, one metadata-only
/// LIST per kind tells what is unchanged (also to a new process, from the stamps the status
/// keeps).
async fn listing(
    cluster: &Cluster,
    pass: &DriftPass<'_>,
    uid: &str,
    objects: &[RenderedObject],
    previous: &ManifestStatus,
) -> Result<Listing, ReconcileError> {
    if !(pass.skip_unchanged && cluster.is_remote()) {
        return Ok(Listing::default());
    }
    let held: Vec<&InventoryEntry> = objects
        .iter()
        .map(|o| &o.id)
        .filter(|id| crate::plan::holds(&previous.inventory, id))
        .collect();
    Ok(cluster
        .list_applied(uid, &held, &previous.applied_stamps)
        .await?)
}

/// What [`write_object`] did to one object.
enum Written {
    /// A warn-mode look: nothing written; the object as read (`None`: nothing to judge).
    Looked(Option<DynamicObject>),
    /// Applied: the object as the server returned it.
    Applied(DynamicObject),
}

/// One object's write of the pass under its drift check: a look in a warn-mode check (nothing written);
/// else the guarded apply ([`apply_owned`]), in an enabled-mode check after a read (what the
/// apply changed is drift) and the take-over of override managers' fields.
async fn write_object(
    ctx: &Context,
    cluster: &Cluster,
    fence: &Fence,
    pass: &DriftPass<'_>,
    subject: &Subject<'_>,
    exists: bool,
) -> Result<Written, ReconcileError> {
    let check = pass.check;
    if check.looks_only(exists) {
        let live = check.look(&ctx.metrics, cluster, subject).await?;
        return Ok(Written::Looked(live));
    }
    let before = match exists && check.reads_before_apply() {
        true => Some(check.before_apply(cluster, fence, subject).await?),
        false => None,
    };
    fence.check()?;
    let object = subject.object;
    let answer = apply_owned(
        cluster,
        object,
        subject.uid,
        subject.recorded_uid,
        pass.adopt,
    )
    .await?;
    if let Some(before) = &before {
        check.after_apply(&ctx.metrics, &object.id, before, &answer);
    }
    Ok(Written::Applied(answer))
}

/// Applies the live values of the fields `prepared.steady` would release (those
/// module-manager owns on `live`) under the handover field manager; nothing when none.
async fn hand_over(
    cluster: &Cluster,
    fence: &Fence,
    id: &InventoryEntry,
    prepared: &drift::Prepared,
    live: &DynamicObject,
) -> Result<(), ReconcileError> {
    let live = serde_json::to_value(live).unwrap_or_default();
    if let Some(body) = drift::handover(prepared, &live, FIELD_MANAGER) {
        fence.check()?;
        cluster.hand_over(id, &body).await?;
        let fields = prepared.handed_over(&body).join(", ");
        tracing::info!(object = %plan::describe(id), %fields, "handed over to {}", drift::HANDOVER_MANAGER);
    }
    Ok(())
}

/// Deletes one object of the Manifest (pruning or deletion), unless it is protected or not the
/// object `recorded_uid` names (the inventory's UID, if any); checks the fence first and counts
/// or logs the outcome.
pub(super) async fn delete_object(
    ctx: &Context,
    cluster: &Cluster,
    fence: &Fence,
    id: &InventoryEntry,
    manifest_namespace: &str,
    uid: &str,
    recorded_uid: Option<&str>,
) -> Result<Deletion, ReconcileError> {
    fence.check()?;
    let outcome = match plan::protected(id, manifest_namespace) {
        Some(reason) => Deletion::Kept(reason),
        None => cluster.delete(id, uid, recorded_uid).await?,
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
