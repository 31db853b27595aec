//! Dependencies: an install pass waits for the Manifests its `spec.dependsOn` names (read fresh
//! from the API server, whichever replica owns them), looking again every
//! [`DEPENDENCY_RECHECK`] at most while one is not ready, stamps on each of its own namespace
//! the label that puts it in every replica's depended-on watch (`work/dependencies.rs`: a
//! faster wake-up, never needed for correctness), and reports a cycle; a deletion waits for the
//! dependents of its own namespace that installed something. The decisions are
//! `plan::dependencies`'.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch};
use serde_json::json;

use super::context::Context;
use super::error::ReconcileError;
use super::pass::Pass;
use crate::api::{DEPENDED_ON_LABEL, HAS_DEPENDENCIES_LABEL, Manifest, State};
use crate::plan::dependencies::{
    DependencyError, DependencyKey, Standing, check_namespaces, dependencies, describe_cycle,
    find_cycle, holding_dependents, waiting_message,
};
use crate::plan::status::{Facts, Outcome, Reason};
use crate::shard::fence::Fence;

/// Most Manifests a pass reads beyond its own dependencies to look for a cycle (a dependent sees
/// only its own dependencies' specs: the chain is read through them, this far).
const MAX_CHAIN_READS: usize = 32;
/// How often a deletion held by its dependents looks again (dependents are not watched: their
/// deletion wakes nothing here).
pub const DEPENDENTS_RECHECK: Duration = Duration::from_secs(10);
/// How often, at most, a dependent that waits for a dependency looks again by itself (or its
/// `spec.interval`, if shorter) — Flux's `--requeue-dependency` default. Whatever happens to the
/// labels and watches that wake it sooner (a dependency created, of another namespace, or
/// labelled while a watch was down), a dependent installs within this long of its dependencies
/// becoming Ready.
pub const DEPENDENCY_RECHECK: Duration = Duration::from_secs(30);
/// Most dependents a deletion's message names.
const NAMED_DEPENDENTS: usize = 10;

/// Reads the Manifest `key` (`None`: not found).
async fn read(ctx: &Context, key: &DependencyKey) -> Result<Option<Manifest>, ReconcileError> {
    Api::<Manifest>::namespaced(ctx.client.clone(), &key.namespace)
        .get_opt(&key.name)
        .await
        .map_err(|source| ReconcileError::ReadDependency {
            what: key.to_string(),
            source,
        })
}

/// Stamps `modulemanager.io/depended-on=true` on `dependency` unless it has it, when it is of
/// the dependent's own namespace (`namespace`): a metadata-only merge patch of that one label
/// (its spec and status are its owner's). Never on another namespace's Manifest: the operator
/// writes nothing there on a tenant's behalf; that dependent is woken by its own recheck.
async fn label(
    dependency: &Manifest,
    ctx: &Context,
    fence: &Fence,
    (namespace, key): (&str, &DependencyKey),
) -> Result<(), ReconcileError> {
    if key.namespace != namespace || dependency.labels().contains_key(DEPENDED_ON_LABEL) {
        return Ok(());
    }
    fence.check()?;
    let patch = json!({"metadata": {"labels": {DEPENDED_ON_LABEL: "true"}}});
    Api::<Manifest>::namespaced(ctx.client.clone(), &key.namespace)
        .patch(
            &key.name,
            &super::records::merge_params(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| ReconcileError::LabelDependency {
            what: key.to_string(),
            source,
        })?;
    Ok(())
}

/// Before anything is installed: `Some(pass)` (`Processing`, reason `DependencyNotReady`,
/// looked at again after [`DEPENDENCY_RECHECK`] or `interval`, whichever is shorter: a
/// dependency's change may wake it earlier) while a dependency is not Ready; an error when they
/// form a cycle or one is in a refused namespace.
pub(super) async fn wait(
    manifest: &Manifest,
    ctx: &Context,
    fence: &Fence,
    interval: Duration,
) -> Result<Option<Pass>, ReconcileError> {
    let wanted = dependencies(manifest);
    if wanted.is_empty() {
        return Ok(None);
    }
    check_namespaces(manifest, ctx.dependencies.cross_namespace)?;
    let mut graph = BTreeMap::new();
    graph.insert(DependencyKey::of(manifest), wanted.clone());
    let mut standings = Vec::with_capacity(wanted.len());
    let namespace = manifest.namespace().unwrap_or_default();
    for key in wanted {
        let found = read(ctx, &key).await?;
        if let Some(dependency) = &found {
            label(dependency, ctx, fence, (&namespace, &key)).await?;
            graph.insert(key.clone(), dependencies(dependency));
        }
        standings.push((key, Standing::of(found.as_ref())));
    }
    let Some(message) = waiting_message(&standings) else {
        return Ok(None);
    };
    if let Some(cycle) = cycle_through(manifest, ctx, graph).await? {
        return Err(DependencyError::Cycle(describe_cycle(&cycle)).into());
    }
    Ok(Some(Pass {
        outcome: Outcome::waiting(State::Processing, Reason::DependencyNotReady, message),
        facts: Facts::default(),
        requeue: interval.min(DEPENDENCY_RECHECK),
    }))
}

/// A cycle through `manifest`, reading the chain of dependencies beyond `graph` (what the pass
/// read already) up to [`MAX_CHAIN_READS`] Manifests.
async fn cycle_through(
    manifest: &Manifest,
    ctx: &Context,
    mut graph: BTreeMap<DependencyKey, Vec<DependencyKey>>,
) -> Result<Option<Vec<DependencyKey>>, ReconcileError> {
    let start = DependencyKey::of(manifest);
    let mut reads = 0;
    loop {
        if let Some(cycle) = find_cycle(&start, &graph) {
            return Ok(Some(cycle));
        }
        let unread: BTreeSet<DependencyKey> = graph
            .values()
            .flatten()
            .filter(|key| !graph.contains_key(*key))
            .cloned()
            .collect();
        if unread.is_empty() || reads >= MAX_CHAIN_READS {
            return Ok(None);
        }
        for key in unread.into_iter().take(MAX_CHAIN_READS - reads) {
            reads += 1;
            let found = read(ctx, &key).await?;
            graph.insert(key, found.as_ref().map(dependencies).unwrap_or_default());
        }
    }
}

/// Before a Manifest others depend on deletes its objects: `Some(pass)` (`Deleting`, reason
/// `DependentsExist`, looked at again every [`DEPENDENTS_RECHECK`]) while a dependent of its own
/// namespace that installed something exists. Only a Manifest labelled depended-on can have one
/// (the label is stamped before a dependent of its namespace installs anything); its dependents
/// are found among the Manifests of its namespace labelled `modulemanager.io/has-dependencies`.
/// A dependent in another namespace never holds it: one tenant cannot keep another's Manifest
/// (and namespace) from being deleted.
pub(super) async fn held_by_dependents(
    manifest: &Manifest,
    ctx: &Context,
) -> Result<Option<Pass>, ReconcileError> {
    if !manifest.labels().contains_key(DEPENDED_ON_LABEL) {
        return Ok(None);
    }
    let namespace = manifest.namespace().unwrap_or_default();
    let listed = Api::<Manifest>::namespaced(ctx.client.clone(), &namespace)
        .list(&ListParams::default().labels(HAS_DEPENDENCIES_LABEL))
        .await
        .map_err(|source| ReconcileError::ReadDependency {
            what: "dependents (Manifests labelled modulemanager.io/has-dependencies)".to_owned(),
            source,
        })?;
    let holding = holding_dependents(manifest, &listed.items);
    if holding.is_empty() {
        return Ok(None);
    }
    let named: Vec<String> = holding
        .iter()
        .take(NAMED_DEPENDENTS)
        .map(ToString::to_string)
        .collect();
    let more = holding.len().saturating_sub(NAMED_DEPENDENTS);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let message = format!(
        "waiting for the Manifests that depend on this one to be deleted first: {}{more}",
        named.join(", ")
    );
    Ok(Some(Pass {
        outcome: Outcome::waiting(State::Deleting, Reason::DependentsExist, message),
        facts: Facts::default(),
        requeue: DEPENDENTS_RECHECK,
    }))
}
