//! Dependencies: every replica, whatever shards it owns, watches the Manifests labelled
//! `modulemanager.io/depended-on=true` (those some Manifest of their own namespace waits for: a
//! small set) and queues at once the Manifests of its own shards that depend on one whose
//! readiness, generation or existence changed. A wake-up only makes a dependent faster: a
//! waiting dependent looks again every 30 s by itself (`reconcile/dependencies.rs`).
//!
//! As for values sources (`sources.rs`), a change is looked up in this replica's own caches
//! when it arrives ([`dependents`]): one scan per batch of changes, always in step with the
//! caches. Changes are rare: only a depended-on Manifest's [`Signal`] counts (its readiness at
//! its generation), not its other status writes.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use crate::api::{DEPENDED_ON_LABEL, Manifest};
use crate::apply::watched::map_event;
use crate::plan::dependencies::{DependencyKey, Signal, dependencies};
use crate::shard::fence::Ownership;
use crate::work::caches::{Key, Work};
use crate::work::sources::Versions;

/// Most events handled together (one scan of the caches for all of them).
const BATCH: usize = 256;

/// The keys of the Manifests among `manifests` that depend on one of `changed` (pure).
pub(super) fn dependents<'a>(
    manifests: impl IntoIterator<Item = (Key, &'a Manifest)>,
    changed: &HashSet<DependencyKey>,
) -> BTreeSet<Key> {
    manifests
        .into_iter()
        .filter(|(_, manifest)| !manifest.spec.depends_on.is_empty())
        .filter(|(_, manifest)| dependencies(manifest).iter().any(|d| changed.contains(d)))
        .map(|(key, _)| key)
        .collect()
}

/// Queues at once the Manifests of the owned shards that depend on one of `changed`.
fn queue_dependents(work: &Work, ownership: &Ownership, changed: &HashSet<DependencyKey>) {
    let cached = work.cached();
    let keyed = cached
        .iter()
        .filter_map(|m| Some((work.key_of(m)?, m.as_ref())));
    for key in dependents(keyed, changed) {
        if ownership.wants(key.shard) {
            tracing::debug!(namespace = %key.namespace, name = %key.name, "a dependency changed: queued");
            work.queue.add(key, Duration::ZERO);
        }
    }
}

/// Watches the depended-on Manifests (of `api`'s scope) and queues the dependents of those
/// whose [`Signal`] changed; runs until the task is dropped.
pub(super) async fn feed_dependents(api: Api<Manifest>, ownership: Arc<Ownership>, work: Work) {
    let selector = format!("{DEPENDED_ON_LABEL}=true");
    let seen = |m: Manifest| (DependencyKey::of(&m), Signal::of(&m));
    let mut events = watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .map(|event| event.map(|event| map_event(event, seen)))
        .boxed()
        .ready_chunks(BATCH);
    let mut versions: Versions<DependencyKey, Signal> = Versions::default();
    while let Some(batch) = events.next().await {
        let mut changed = HashSet::new();
        for event in batch {
            match event {
                Ok(event) => changed.extend(versions.on_event(event)),
                Err(e) => tracing::warn!("watch depended-on Manifests: {e}"),
            }
        }
        if !changed.is_empty() {
            queue_dependents(&work, &ownership, &changed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifest(namespace: &str, name: &str, depends_on: serde_json::Value) -> (Key, Manifest) {
        let manifest: Manifest = serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"module": name, "chart": {"path": "p"}, "dependsOn": depends_on},
        }))
        .unwrap();
        let key = Key {
            shard: 0,
            namespace: namespace.into(),
            name: name.into(),
        };
        (key, manifest)
    }

    #[test]
    fn a_change_queues_exactly_the_dependents() {
        let manifests = [
            manifest("a", "app", json!([{"name": "db"}])),
            manifest("a", "web", json!([{"name": "db"}, {"name": "cache"}])),
            manifest("b", "other", json!([{"name": "db", "namespace": "a"}])),
            manifest("b", "own-db", json!([{"name": "db"}])),
            manifest("a", "db", json!([])),
        ];
        let of = |changed: &[(&str, &str)]| -> Vec<String> {
            let changed = changed
                .iter()
                .map(|(namespace, name)| DependencyKey {
                    namespace: (*namespace).into(),
                    name: (*name).into(),
                })
                .collect();
            dependents(manifests.iter().map(|(k, m)| (k.clone(), m)), &changed)
                .into_iter()
                .map(|k| format!("{}/{}", k.namespace, k.name))
                .collect()
        };
        assert_eq!(of(&[("a", "db")]), ["a/app", "a/web", "b/other"]);
        assert_eq!(of(&[("a", "cache")]), ["a/web"]);
        assert_eq!(of(&[("b", "db")]), ["b/own-db"]);
        assert!(of(&[("a", "app")]).is_empty(), "nobody depends on it");
    }
}
