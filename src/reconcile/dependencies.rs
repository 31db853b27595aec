//! Dependencies: an install pass waits for the Manifests its `spec.dependsOn` names (read fresh
//! from the API server, whichever replica owns them), stamps on each the label that puts it in
//! every replica's depended-on watch (`work/dependencies.rs`), and reports a cycle; a deletion
//! waits for the dependents that installed something. The decisions are `plan::dependencies`'.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch};
use serde_json::json;

use super::{Context, Pass, ReconcileError};
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
/// Most dependents a deletion's message names.
const NAMED_DEPENDENTS: usize = 10;
/// Most dependencies [`Awaited`] remembers: one that is never created stays in it (its dependent
/// may have gone or changed since); past this many, a missing one is found at its dependent's
/// next interval instead.
const MAX_AWAITED: usize = 10_000;

/// How dependencies are handled, shared by every pass of a replica.
#[derive(Clone, Debug)]
pub struct DependencyRules {
    /// Whether a dependency may be in another namespace than its dependent
    /// (`--no-cross-namespace-dependencies` turns it off).
    pub cross_namespace: bool,
    /// The dependencies passes found missing.
    pub awaited: Awaited,
}

impl Default for DependencyRules {
    fn default() -> Self {
        Self {
            cross_namespace: true,
            awaited: Awaited::default(),
        }
    }
}

/// The dependencies passes of this replica found missing: when one is created, the stray watch
/// (which sees every new Manifest) queues its dependents at once. Restarts lose nothing: every
/// Manifest has a pass after a restart, which finds them again.
#[derive(Clone, Debug, Default)]
pub struct Awaited(Arc<Mutex<HashSet<DependencyKey>>>);

impl Awaited {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<DependencyKey>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that `key` may be missing (up to [`MAX_AWAITED`] keys).
    fn insert(&self, key: DependencyKey) {
        let mut set = self.set();
        if set.len() < MAX_AWAITED {
            set.insert(key);
        }
    }

    /// Whether `key` was awaited (it is no longer).
    pub fn take(&self, key: &DependencyKey) -> bool {
        self.set().remove(key)
    }
}

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

/// Stamps `modulemanager.io/depended-on=true` on `dependency` unless it has it: a metadata-only
/// merge patch of that one label (its spec and status are its owner's).
async fn label(
    dependency: &Manifest,
    ctx: &Context,
    fence: &Fence,
    key: &DependencyKey,
) -> Result<(), ReconcileError> {
    if dependency.labels().contains_key(DEPENDED_ON_LABEL) {
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
/// looked at again after `interval` as a backstop: a dependency's change wakes it earlier) while
/// a dependency is not Ready; an error when they form a cycle or one is in a refused namespace.
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
    for key in wanted {
        // Awaited before the read: one created right after it is not missed.
        let awaited = &ctx.dependencies.awaited;
        awaited.insert(key.clone());
        let found = read(ctx, &key).await?;
        if let Some(dependency) = &found {
            awaited.take(&key);
            label(dependency, ctx, fence, &key).await?;
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
        requeue: interval,
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
/// `DependentsExist`, looked at again every [`DEPENDENTS_RECHECK`]) while a dependent that
/// installed something exists. Only a Manifest labelled depended-on can have one (the label is
/// stamped before a dependent installs anything); its dependents are found among the Manifests
/// labelled `modulemanager.io/has-dependencies`, not among all.
pub(super) async fn held_by_dependents(
    manifest: &Manifest,
    ctx: &Context,
) -> Result<Option<Pass>, ReconcileError> {
    if !manifest.labels().contains_key(DEPENDED_ON_LABEL) {
        return Ok(None);
    }
    let listed = Api::<Manifest>::all(ctx.client.clone())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn awaited_dependencies_are_taken_once_and_bounded() {
        let awaited = Awaited::default();
        let key = |name: String| DependencyKey {
            namespace: "a".into(),
            name,
        };
        awaited.insert(key("db".into()));
        assert!(awaited.take(&key("db".into())));
        assert!(!awaited.take(&key("db".into())), "once");
        for i in 0..MAX_AWAITED + 5 {
            awaited.insert(key(format!("m{i}")));
        }
        assert_eq!(awaited.set().len(), MAX_AWAITED);
        assert!(
            !awaited.take(&key(format!("m{MAX_AWAITED}"))),
            "past the bound"
        );
    }
}
