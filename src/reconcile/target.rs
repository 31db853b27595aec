//! Target: the cluster a Manifest's module goes to, as which identity, and its connection errors.

use kube::ResourceExt;

use super::context::Context;
use super::error::ReconcileError;
use crate::api::Manifest;
use crate::apply::adoption::Owners;
use crate::apply::target::{self, ResolveError, Target, TargetError};
use crate::plan::ownership::{self, TargetCheck};
use crate::plan::tenancy::{self, Identity};

/// The cluster the module goes to, as the identity its objects are written with: the local one
/// impersonating the Manifest's ServiceAccount (or the operator's default one), the local one as
/// the operator, or the remote target of `spec.target` with its kubeconfig's credentials. The one
/// place a pass gets the handle every request for the module's objects goes through (discovery,
/// apply, prune, readiness, hooks, deletion); the Manifest, its status, Events, finalizer and
/// `valuesFrom` stay on `ctx.client`, the operator's own.
///
/// Returns with it the cluster's identity to record at first contact; a cluster whose identity
/// is not the recorded one is refused ([`verify`]).
pub(super) async fn resolve<'a>(
    manifest: &Manifest,
    ctx: &'a Context,
) -> Result<(Target<'a>, Option<String>), ReconcileError> {
    let target = connect(manifest, ctx).await?;
    // An impersonating client may not read Namespaces: the local cluster is the operator's.
    let identity = match target.server() {
        Some(_) => target.identity().await?,
        None => ctx.cluster.identity().await?,
    };
    let record = verify(manifest, &target, identity)?;
    Ok((target, record))
}

/// Compares the cluster's identity with `status.targetIdentity` ([`ownership::check_target`]):
/// `Some` to record at first contact, an error for another cluster, or one that cannot be
/// confirmed.
fn verify(
    manifest: &Manifest,
    target: &Target<'_>,
    found: Option<String>,
) -> Result<Option<String>, ReconcileError> {
    let status = manifest.status.as_ref();
    let recorded = status.and_then(|s| s.target_identity.as_deref());
    let nothing_applied =
        status.is_none_or(|s| s.inventory.is_empty() && s.hook_objects.is_empty());
    let problem = match ownership::check_target(recorded, found.as_deref(), nothing_applied) {
        TargetCheck::Same => return Ok(None),
        TargetCheck::Record(found) => return Ok(Some(found)),
        TargetCheck::Other { recorded, found } => {
            format!("kube-system Namespace UID {found}, the module's cluster has {recorded}")
        }
        TargetCheck::Unconfirmed { recorded } => format!(
            "its kube-system Namespace cannot be read to confirm it is the module's cluster, {recorded}"
        ),
    };
    Err(ReconcileError::Target(TargetError::OtherCluster {
        server: target.server().unwrap_or("(the local cluster)").to_owned(),
        secret: target.secret().unwrap_or("(none)").to_owned(),
        problem,
    }))
}

/// What an install pass may take over besides its own objects (`spec.adopt`): `None` without
/// it; the owners' look-up with it, when the identity the module is written with may adopt
/// ([`tenancy::check_adoption`]: as the operator itself only with `--adopt-as-operator`).
pub(super) fn adoption(
    manifest: &Manifest,
    ctx: &Context,
) -> Result<Option<Owners>, ReconcileError> {
    if !manifest.spec.adopt {
        return Ok(None);
    }
    let namespace = manifest.namespace().unwrap_or_default();
    tenancy::check_adoption(&identity(manifest, ctx)?, &namespace, &ctx.tenancy.policy)?;
    Ok(Some(Owners::new(ctx.client.clone())))
}

/// Whose identity the Manifest's module is written with ([`tenancy::identity`]).
fn identity(manifest: &Manifest, ctx: &Context) -> Result<Identity, ReconcileError> {
    let namespace = manifest.namespace().unwrap_or_default();
    Ok(tenancy::identity(
        manifest.spec.service_account_name.as_deref(),
        manifest.spec.target.is_some(),
        &namespace,
        &ctx.tenancy.policy,
    )?)
}

/// The target of [`resolve`], not yet verified.
async fn connect<'a>(manifest: &Manifest, ctx: &'a Context) -> Result<Target<'a>, ReconcileError> {
    if let Identity::ServiceAccount(account) = identity(manifest, ctx)? {
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
