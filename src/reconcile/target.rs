//! Target: the cluster a Manifest's module goes to, as which identity, and its connection errors.

use kube::ResourceExt;

use super::{Context, ReconcileError};
use crate::api::Manifest;
use crate::apply::target::{self, ResolveError, Target};
use crate::plan::tenancy::{self, Identity};

/// The cluster the module goes to, as the identity its objects are written with: the local one
/// impersonating the Manifest's ServiceAccount (or the operator's default one), the local one as
/// the operator, or the remote target of `spec.target` with its kubeconfig's credentials. The one
/// place a pass gets the handle every request for the module's objects goes through (discovery,
/// apply, prune, readiness, hooks, deletion); the Manifest, its status, Events, finalizer and
/// `valuesFrom` stay on `ctx.client`, the operator's own.
pub(super) async fn resolve<'a>(
    manifest: &Manifest,
    ctx: &'a Context,
) -> Result<Target<'a>, ReconcileError> {
    let namespace = manifest.namespace().unwrap_or_default();
    let identity = tenancy::identity(
        manifest.spec.service_account_name.as_deref(),
        manifest.spec.target.is_some(),
        &namespace,
        &ctx.tenancy.policy,
    )?;
    if let Identity::ServiceAccount(account) = identity {
        return Ok(Target::impersonated(
            ctx.tenancy.cluster_for(&account).await?,
        ));
    }
    target::resolve(manifest, &ctx.cluster, &ctx.client, &ctx.targets)
        .await
        .map_err(|error| match error {
            ResolveError::SecretRead(e) => ReconcileError::ReadTargetSecret(e),
            ResolveError::Target(e) => ReconcileError::Target(e),
            ResolveError::Discovery(e) => ReconcileError::Apply(e),
        })
}

/// Passes a step's result on; on a remote target, an error of the target itself
/// (unreachable, 401, TLS) becomes a [`TargetError`](crate::apply::target::TargetError), and
/// 401/TLS evict the client.
pub(super) fn observe<T>(
    target: &Target<'_>,
    ctx: &Context,
    result: Result<T, ReconcileError>,
) -> Result<T, ReconcileError> {
    match result {
        Err(ReconcileError::Apply(error)) => {
            Err(match target.connection_error(&ctx.targets, error) {
                Ok(target) => ReconcileError::Target(target),
                Err(apply) => ReconcileError::Apply(apply),
            })
        }
        result => result,
    }
}
