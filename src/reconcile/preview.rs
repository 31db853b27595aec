//! Preview: what the next install pass would change, without changing anything — the pipeline's
//! own steps (render request, hook run, vetted render, prune decision) up to the writes, which
//! become server-side dry-run applies. `module-manager diff` runs it with the caller's client.

use kube::{Resource, ResourceExt};

use super::context::Context;
use super::error::ReconcileError;
use super::inputs::{install_run, render_request, vetted_render};
use super::install::inputs_changed;
use crate::api::{HookOperation, HookRunPhase, InventoryEntry, Manifest};
use crate::apply::adoption::Owners;
use crate::apply::target::{self, ResolveError};
use crate::apply::{Cluster, FIELD_MANAGER, MANIFEST_SHARD_LABEL, MANIFEST_UID_LABEL};
use crate::plan::diff::{Diff, ObjectChange, ObjectDiff, hooks_to_run, object_change};
use crate::plan::drift::{self, IgnoreRules};
use crate::plan::ownership;
use crate::plan::trigger::{self, Requests};
use crate::plan::{self, PruneDecision, RenderedObject, Scope};

/// What the next pass over `manifest` would change on its target, as `ctx.client`'s identity
/// sees it (its own reads and dry-run applies: nothing it could not read itself). Writes
/// nothing: the Manifest, its status and the module's objects stay as they are.
pub async fn preview(manifest: &Manifest, ctx: &Context) -> Result<Diff, ReconcileError> {
    // The caller's identity on the local cluster (a ServiceAccount named by the Manifest is
    // not impersonated), or the remote target's credentials from the kubeconfig Secret.
    let cluster = target::resolve(manifest, &ctx.cluster, &ctx.client, &ctx.targets)
        .await
        .map_err(|error| match error {
            ResolveError::SecretRead(e) => ReconcileError::ReadTargetSecret(e),
            ResolveError::Target(e) => ReconcileError::Target(e),
            ResolveError::Discovery(e) => ReconcileError::Apply(e),
        })?;
    // A reset not yet handled is part of the next pass: it starts from the status the reset
    // leaves (a failed hook run started over), as the pass will.
    let previous = match (Requests::of(manifest).reset, &manifest.status) {
        (Some(_), Some(status)) => trigger::after_reset(status, manifest.meta().generation),
        _ => manifest.status.clone().unwrap_or_default(),
    };
    let mut request = render_request(manifest, ctx, &cluster).await?;
    let values_digest = request.values_digest();
    let run = install_run(manifest, &previous, &request, &values_digest);
    let mut diff = Diff {
        notes: notes(manifest),
        ..Diff::default()
    };
    if run.phase == HookRunPhase::Failed {
        let message = run.message.unwrap_or_default();
        diff.notes.push(format!(
            "the hook run failed ({message}): the pass stops before applying anything; `retry` resets it"
        ));
        return Ok(diff);
    }
    request.is_upgrade = run.operation == HookOperation::Upgrade;
    let (_, plan) = vetted_render(manifest, ctx, &cluster, &request).await?;
    let surface = cluster.surface();
    let scope = |id: &InventoryEntry| surface.resolve(id).map(|(_, scope)| *scope);
    let mut applied: Vec<RenderedObject> = plan.applied().cloned().collect();
    for object in &mut applied {
        // A kind not served yet (a CRD of this render) is namespaced or not: it is created.
        let kind_scope = scope(&object.id).unwrap_or(Scope::Namespaced);
        plan::assign_namespaces(std::slice::from_mut(object), &request.namespace, |_| {
            Some(kind_scope)
        })?;
    }
    let uid = manifest.uid().unwrap_or_default();
    let rules = IgnoreRules::parse(&manifest.spec.drift_ignore)?;
    let owners = manifest.spec.adopt.then(|| Owners::new(ctx.client.clone()));
    for object in &applied {
        let recorded = previous.inventory_uids.get(&ownership::uid_key(&object.id));
        let drift = ObjectDrift {
            rules: &rules,
            exists: plan::holds(&previous.inventory, &object.id),
            recorded_uid: recorded.map(String::as_str),
            adopt: owners.as_ref(),
        };
        diff.objects
            .extend(object_diff(&cluster, object, &uid, &drift).await?);
    }
    let inventory: Vec<_> = applied.iter().map(|o| o.id.clone()).collect();
    let changed = inputs_changed(manifest, &previous, &request, &values_digest);
    match pruned(manifest, &previous.inventory, &inventory, changed) {
        Ok(gone) => diff.prune = gone,
        Err(reason) => diff.notes.push(format!("no prune: {reason}")),
    }
    diff.hooks = hooks_to_run(&plan.hooks, &run);
    for hook in &mut diff.hooks {
        if hook.object.namespace.is_empty() && scope(&hook.object) != Some(Scope::Cluster) {
            hook.object.namespace.clone_from(&request.namespace);
        }
    }
    Ok(diff)
}

/// What keeps the next pass from doing what the diff shows: a deletion, a suspension.
fn notes(manifest: &Manifest) -> Vec<String> {
    let mut notes = Vec::new();
    if manifest.meta().deletion_timestamp.is_some() {
        notes.push(
            "the Manifest is being deleted: the next pass deletes its objects instead".into(),
        );
    }
    if manifest.spec.suspend {
        notes.push("the Manifest is suspended: no pass runs until it is resumed".into());
    }
    if manifest.spec.adopt {
        notes.push(
            "spec.adopt: existing objects without a Manifest's label, or labelled as a Manifest that is gone, show as changes: the pass takes them over (written as the operator's own identity, only if it runs with --adopt-as-operator)".into(),
        );
    }
    notes
}

/// The objects the prune step would delete (the guard's decision; never a protected one), or
/// why it would refuse.
fn pruned(
    manifest: &Manifest,
    previous: &[InventoryEntry],
    inventory: &[InventoryEntry],
    inputs_changed: bool,
) -> Result<Vec<InventoryEntry>, String> {
    let gone = plan::to_prune(previous, inventory);
    match plan::guard_prune(gone, inventory.len(), inputs_changed) {
        PruneDecision::Prune(gone) => {
            let namespace = manifest.namespace().unwrap_or_default();
            Ok(gone
                .into_iter()
                .filter(|id| plan::protected(id, &namespace).is_none())
                .collect())
        }
        PruneDecision::Refuse(reason) => Err(reason),
    }
}

/// What the pass would do to one object: create it, change these fields (the live object
/// against its dry-run apply), refuse it (not this Manifest's), or nothing.
/// How a pass applies one object: the drift rules, and whether it was applied before.
struct ObjectDrift<'a> {
    rules: &'a IgnoreRules,
    exists: bool,
    /// Its UID as the inventory recorded it.
    recorded_uid: Option<&'a str>,
    /// `spec.adopt`: the owners' look-up (as the caller).
    adopt: Option<&'a Owners>,
}

/// Whether a pass with `spec.adopt` would take over an object labelled as `owner`'s (`None`:
/// unlabelled): as [`crate::plan::ownership::decide`]; an owner the caller cannot look up
/// counts as existing.
async fn adoptable(adopt: Option<&Owners>, owner: Option<&str>) -> bool {
    match (adopt, owner) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(owners), Some(owner)) => owners.gone(owner).await.unwrap_or(false),
    }
}

async fn object_diff(
    cluster: &Cluster,
    object: &RenderedObject,
    uid: &str,
    drift: &ObjectDrift<'_>,
) -> Result<Option<ObjectDiff>, ReconcileError> {
    let done = |change| {
        Ok(Some(ObjectDiff {
            object: object.id.clone(),
            change,
        }))
    };
    if cluster.surface().resolve(&object.id).is_none() {
        return done(ObjectChange::Create);
    }
    let Some(live) = cluster.get(&object.id).await? else {
        return done(ObjectChange::Create);
    };
    // Whose it is, as the pass decides (`plan::ownership::decide`): the recorded object, else
    // one labelled as this Manifest's or one it may adopt.
    let owner = live.labels().get(MANIFEST_UID_LABEL).map(String::as_str);
    let ours = match drift.recorded_uid {
        Some(recorded) => live.metadata.uid.as_deref() == Some(recorded),
        None => owner == Some(uid) || adoptable(drift.adopt, owner).await,
    };
    if !ours {
        return done(ObjectChange::NotOwned);
    }
    // What the pass sends: less the ignored fields once the object exists; and what it leaves
    // after handing over a field it stops setting (`plan::drift`).
    let mut prepared = drift::prepare(object, drift.rules, drift.exists);
    let mut body = RenderedObject {
        id: object.id.clone(),
        body: std::mem::take(&mut prepared.body),
    };
    keep_shard_stamp(&mut body.body, &live);
    let applied = cluster.dry_run_apply(&body, uid).await?;
    let (live, mut applied) = (to_value(&live), to_value(&applied));
    if drift.exists {
        drift::after_handover(&prepared, &live, FIELD_MANAGER, &mut applied);
    }
    match object_change(&object.id, &live, &applied) {
        Some(change) => done(change),
        None => Ok(None),
    }
}

/// Keeps the live object's shard label ([`MANIFEST_SHARD_LABEL`]) in what is previewed: a
/// replica stamps it on every apply, and a preview that left it out (the `diff` command, which
/// does not know the fleet's shard count) would show it removed on every object.
fn keep_shard_stamp(body: &mut serde_json::Value, live: &kube::api::DynamicObject) {
    let Some(shard) = live.labels().get(MANIFEST_SHARD_LABEL) else {
        return;
    };
    let Some(metadata) = body
        .get_mut("metadata")
        .and_then(serde_json::Value::as_object_mut)
    else {
        return;
    };
    let labels = metadata.entry("labels").or_insert(serde_json::Value::Null);
    if !labels.is_object() {
        *labels = serde_json::json!({});
    }
    if let Some(labels) = labels.as_object_mut() {
        labels.insert(MANIFEST_SHARD_LABEL.into(), shard.clone().into());
    }
}

/// A stored object as JSON (a `DynamicObject` always serializes: its fields are JSON already).
fn to_value(object: &kube::api::DynamicObject) -> serde_json::Value {
    serde_json::to_value(object).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_preview_keeps_the_live_shard_label_and_adds_none() {
        let live = |labels: serde_json::Value| -> kube::api::DynamicObject {
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "labels": labels}}))
            .unwrap()
        };
        let stamped = live(json!({MANIFEST_SHARD_LABEL: "7", "app": "web"}));
        let mut body = json!({"metadata": {"name": "c", "labels": {"app": "web"}}});
        keep_shard_stamp(&mut body, &stamped);
        assert_eq!(body["metadata"]["labels"][MANIFEST_SHARD_LABEL], "7");
        assert_eq!(body["metadata"]["labels"]["app"], "web");
        // A template that renders `labels: null`, or none.
        let mut body = json!({"metadata": {"name": "c", "labels": null}});
        keep_shard_stamp(&mut body, &stamped);
        assert_eq!(
            body["metadata"]["labels"],
            json!({MANIFEST_SHARD_LABEL: "7"})
        );
        // An object from before the label: nothing to keep.
        let mut body = json!({"metadata": {"name": "c"}});
        keep_shard_stamp(&mut body, &live(json!({"app": "web"})));
        assert_eq!(body, json!({"metadata": {"name": "c"}}));
    }
}
