//! Inputs: what helm needs for a render — the chart, the merged values (`valuesFrom` read from
//! the Manifest's namespace) and the target's discovery.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::{Resource, ResourceExt};
use serde_json::{Map, Value};

use std::collections::BTreeMap;
use std::sync::Arc;

use super::context::Context;
use super::error::ReconcileError;
use crate::api::{
    ChartVerification, HookRun, Manifest, ManifestStatus, ValuesReference, ValuesSourceKind,
};
use crate::apply::Cluster;
use crate::plan::tenancy::check_protected;
use crate::plan::{self, Plan, RenderedObject, hooks};
use crate::render::values;
use crate::render::{RenderRequest, Rendered};
use crate::source::{Credentials, CredentialsError, KeyMaterial};

/// Renders (cached) and plans the chart; refuses a render that writes what no module may
/// write, or (impersonating) anything the identity may not write, before any of it is. Every
/// render whose objects or hooks are applied goes through here: the install path and the
/// delete hooks.
pub(super) async fn vetted_render(
    manifest: &Manifest,
    ctx: &Context,
    cluster: &Cluster,
    request: &RenderRequest,
) -> Result<(Arc<Rendered>, Plan), ReconcileError> {
    let rendered = ctx.renderer.render(request).await?;
    let max_nodes = plan::max_nodes(ctx.renderer.limits().max_output);
    let plan = plan::plan(plan::parse_documents_within(&rendered.manifest, max_nodes)?)?;
    // On the local cluster only: a remote target's namespaces are not the operator's.
    if manifest.spec.target.is_none() {
        let manifest_namespace = manifest.namespace().unwrap_or_default();
        let protected = &ctx.tenancy.protected;
        check_protected(&plan, &request.namespace, &manifest_namespace, protected)?;
    }
    if !applied_before(manifest, &rendered) {
        let uid = manifest.uid().unwrap_or_default();
        check_permitted(cluster, &plan, &request.namespace, &uid).await?;
    }
    tracing::debug!(
        crds = plan.crds.len(),
        objects = plan.objects.len(),
        digest = %rendered.digest,
        "rendered"
    );
    Ok((rendered, plan))
}

/// Whether a pass already applied this render of this generation (the spec names the
/// ServiceAccount): its identity's dry runs would ask again what that apply answered. A
/// permission revoked since fails the real apply of an object that is already there, as it was.
fn applied_before(manifest: &Manifest, rendered: &Rendered) -> bool {
    manifest.status.as_ref().is_some_and(|status| {
        status.rendered_digest.as_deref() == Some(rendered.digest.as_str())
            && status.applied_generation == manifest.meta().generation
    })
}

/// With an impersonated identity, every object of the render (CRDs, objects, hooks) whose
/// kind is served is first applied with `dryRun=All`: a missing permission (the API
/// server's 403 names the user, the verb, the resource and the namespace) fails the pass
/// before anything of the render is written — not after the first objects were applied.
/// One extra request per object and pass that applies a new render (docs/reconcile.md §
/// Identity); none on a pass that re-applies the render the last one applied.
async fn check_permitted(
    cluster: &Cluster,
    plan: &Plan,
    namespace: &str,
    uid: &str,
) -> Result<(), ReconcileError> {
    if cluster.impersonating().is_none() {
        return Ok(());
    }
    let surface = cluster.surface();
    let mut objects: Vec<RenderedObject> = plan
        .applied()
        .chain(plan.hooks.iter().map(|h| &h.object))
        .filter(|o| surface.resolve(&o.id).is_some())
        .cloned()
        .collect();
    plan::assign_namespaces(&mut objects, namespace, |id| {
        surface.resolve(id).map(|(_, scope)| *scope)
    })?;
    for object in &objects {
        cluster.check_permitted(object, uid).await?;
    }
    Ok(())
}

/// Resolves the chart (blocking file I/O, off the async workers), merges the values and reads
/// the target's discovery: everything helm needs but `--is-upgrade` (left `false`).
pub(super) async fn render_request(
    manifest: &Manifest,
    ctx: &Context,
    cluster: &Cluster,
) -> Result<RenderRequest, ReconcileError> {
    let namespace = manifest
        .spec
        .target_namespace
        .clone()
        .unwrap_or_else(|| manifest.namespace().unwrap_or_default());
    // Resolve (network fetches async; file I/O, hashing and archive checks on blocking threads),
    // with the credentials of `spec.chart.secretRef`, verified with the keys of
    // `spec.chart.verify`.
    let credentials = chart_credentials(manifest, ctx).await?;
    let keys = match &manifest.spec.chart.verify {
        Some(verify) => Some(read_verification_keys(ctx, manifest, verify).await?),
        None => None,
    };
    let chart = ctx
        .remote_charts
        .resolve_verified(
            &manifest.spec.chart,
            &ctx.chart_root,
            credentials.as_ref(),
            ctx.chart_limits,
            keys.as_ref(),
        )
        .await?;
    let values = gather_values(manifest, ctx).await?;
    let surface = cluster.fresh_surface(cluster.discovery_max_age()).await?;
    Ok(RenderRequest {
        chart,
        release: manifest
            .spec
            .release_name
            .clone()
            .unwrap_or_else(|| manifest.name_any()),
        namespace,
        values,
        kube_version: surface.kube_version.clone(),
        api_versions: cluster.render_api_versions(&surface),
        is_upgrade: false,
    })
}

/// The credentials of `spec.chart.secretRef`, read as the operator (as `valuesFrom` Secrets
/// are) from the Manifest's namespace; a missing Secret or key is a clear error naming it.
async fn chart_credentials(
    manifest: &Manifest,
    ctx: &Context,
) -> Result<Option<Credentials>, ReconcileError> {
    let Some(reference) = &manifest.spec.chart.secret_ref else {
        return Ok(None);
    };
    let namespace = manifest.namespace().unwrap_or_default();
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&reference.name)
        .await
        .map_err(|source| ReconcileError::ReadChartSecret {
            name: reference.name.clone(),
            source,
        })?
        .ok_or_else(|| CredentialsError::missing(&reference.name))?;
    let data: BTreeMap<String, Vec<u8>> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| (key, value.0))
        .collect();
    Ok(Some(Credentials::from_secret(&reference.name, &data)?))
}

/// Every entry of the Secret or ConfigMap `spec.chart.verify` names, in the Manifest's
/// namespace (the resolver picks and parses the keys).
async fn read_verification_keys(
    ctx: &Context,
    manifest: &Manifest,
    verify: &ChartVerification,
) -> Result<KeyMaterial, ReconcileError> {
    let namespace = manifest.namespace().unwrap_or_default();
    let (kind, name) = match (&verify.secret_ref, &verify.config_map_ref) {
        (Some(secret), _) => (ValuesSourceKind::Secret, &secret.name),
        (None, Some(config_map)) => (ValuesSourceKind::ConfigMap, &config_map.name),
        // The CRD's CEL rule makes this unreachable through the API server.
        (None, None) => {
            return Err(ReconcileError::VerificationKeysMissing(
                "spec.chart.verify names no Secret or ConfigMap".into(),
            ));
        }
    };
    let from = format!("{kind:?} {name}");
    let failed = |source| ReconcileError::ReadVerificationKeys {
        what: from.clone(),
        source,
    };
    let entries: Option<Vec<(String, Vec<u8>)>> = match kind {
        ValuesSourceKind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), &namespace)
            .get_opt(name)
            .await
            .map_err(failed)?
            .map(|s| {
                let data = s.data.unwrap_or_default().into_iter();
                data.map(|(k, v)| (k, v.0)).collect()
            }),
        ValuesSourceKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), &namespace)
            .get_opt(name)
            .await
            .map_err(failed)?
            .map(|cm| {
                let text = cm.data.unwrap_or_default().into_iter();
                let binary = cm.binary_data.unwrap_or_default().into_iter();
                text.map(|(k, v)| (k, v.into_bytes()))
                    .chain(binary.map(|(k, v)| (k, v.0)))
                    .collect()
            }),
    };
    let entries = entries
        .ok_or_else(|| ReconcileError::VerificationKeysMissing(format!("{from} does not exist")))?;
    Ok(KeyMaterial { from, entries })
}

/// Merges `valuesFrom` in order, then the inline values.
async fn gather_values(
    manifest: &Manifest,
    ctx: &Context,
) -> Result<Map<String, Value>, ReconcileError> {
    let namespace = manifest.namespace().unwrap_or_default();
    let mut merged = Map::new();
    for (index, reference) in manifest.spec.values_from.iter().enumerate() {
        if let Some(text) = read_values_source(ctx, &namespace, reference).await? {
            let name = format!(
                "valuesFrom[{index}] {:?} {} key {}",
                reference.kind, reference.name, reference.key
            );
            values::merge(&mut merged, values::parse(&name, &text)?);
        }
    }
    if let Some(Value::Object(inline)) = &manifest.spec.values {
        values::merge(&mut merged, inline.clone());
    }
    Ok(merged)
}

/// The text under a values reference's key; `None` when missing and optional.
async fn read_values_source(
    ctx: &Context,
    namespace: &str,
    reference: &ValuesReference,
) -> Result<Option<String>, ReconcileError> {
    let failed = |source| ReconcileError::ReadValuesSource {
        what: format!("{:?} {}", reference.kind, reference.name),
        source,
    };
    let text = match reference.kind {
        ValuesSourceKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), namespace)
            .get_opt(&reference.name)
            .await
            .map_err(failed)?
            .map(|cm| cm.data.unwrap_or_default().get(&reference.key).cloned()),
        ValuesSourceKind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), namespace)
            .get_opt(&reference.name)
            .await
            .map_err(failed)?
            .map(|s| s.data.unwrap_or_default().remove(&reference.key))
            .map(|bytes| bytes.map(|b| secret_text(b.0, reference)).transpose())
            .transpose()?,
    };
    match text {
        Some(Some(text)) => Ok(Some(text)),
        _ if reference.optional => Ok(None),
        None => Err(ReconcileError::ValuesSourceMissing(format!(
            "{:?} {} does not exist",
            reference.kind, reference.name
        ))),
        Some(None) => Err(ReconcileError::ValuesSourceMissing(format!(
            "{:?} {} has no key {}",
            reference.kind, reference.name, reference.key
        ))),
    }
}

/// A Secret's values as text: bytes that are not UTF-8 are refused (helm refuses them too),
/// not changed into replacement characters; the message names the key, never the content.
fn secret_text(bytes: Vec<u8>, reference: &ValuesReference) -> Result<String, values::ValuesError> {
    String::from_utf8(bytes).map_err(|_| {
        values::ValuesError::NotUtf8(format!(
            "{:?} {} key {}",
            reference.kind, reference.name, reference.key
        ))
    })
}

/// The hook run an install pass works on, from the previous status: an install until something
/// was applied, then upgrades; a run belongs to the chart, values, release and namespace it
/// started with, and a failed run stays failed until the spec or the inputs change. The
/// install step and `diff`'s preview both start from it.
pub(super) fn install_run(
    manifest: &Manifest,
    previous: &ManifestStatus,
    request: &RenderRequest,
    values_digest: &str,
) -> HookRun {
    let inputs = hooks::inputs_digest(
        &request.chart.digest,
        values_digest,
        &request.release,
        &request.namespace,
    );
    hooks::current_run(
        previous.hook_run.as_ref(),
        false,
        &inputs,
        manifest.meta().generation,
        hooks::installed(previous.hook_run.as_ref(), previous.inventory.is_empty()),
    )
}
