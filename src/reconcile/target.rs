//! Target: the cluster a Manifest's module goes to, and its connection errors.

use super::{Context, ReconcileError};
use crate::api::Manifest;
use crate::apply::target::{self, ResolveError, Target};

/// The cluster the module goes to: the local one, or the remote target of `spec.target`.
pub(super) async fn resolve<'a>(
    manifest: &Manifest,
    ctx: &'a Context,
) -> Result<Target<'a>, ReconcileError> {
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
