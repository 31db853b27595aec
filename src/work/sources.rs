//! Values sources: a metadata-only watch of the ConfigMaps and Secrets labelled
//! `modulemanager.io/watch=true`; a change to one queues at once the Manifests of this replica
//! that name it (`spec.valuesFrom`, `spec.chart.secretRef`, or `spec.target`'s kubeconfig
//! Secret).
//!
//! Opt-in by label, as Flux's helm-controller does (`reconcile.fluxcd.io/watch: Enabled`,
//! fluxcd/helm-controller#143, #1086): the watch and its events scale with the objects people
//! chose, not with every ConfigMap and Secret of the cluster. Metadata only (the API server sends
//! `PartialObjectMetadata`): no Secret data is kept (a client-side `kubectl apply` annotation is decoded and dropped), and a watched object costs its name and
//! resourceVersion. Which Manifests a change concerns is looked up in this replica's own
//! Manifest caches when it arrives ([`affected`]): one scan per batch of changes, always in step
//! with the caches (no second index to keep right through relists and shard handovers).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Debug;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::api::{Manifest, ValuesSourceKind, WATCH_LABEL, WATCH_LABEL_VALUE};
use crate::apply::watched::map_event;
use crate::apply::watched_secrets::WatchedSecrets;
use crate::shard::fence::Ownership;
use crate::work::caches::{Key, Work};

/// Most events handled together (one scan of the caches for all of them).
const BATCH: usize = 256;

/// A ConfigMap or Secret, by namespace, kind and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct SourceRef {
    namespace: String,
    /// `ConfigMap` or `Secret`.
    kind: &'static str,
    name: String,
}

/// The objects a Manifest reads besides itself, all in its own namespace: its `valuesFrom`
/// ConfigMaps and Secrets, its chart's credentials Secret and its target's kubeconfig Secret.
pub(super) fn references(manifest: &Manifest) -> impl Iterator<Item = SourceRef> + '_ {
    let namespace = manifest.namespace().unwrap_or_default();
    let values = manifest.spec.values_from.iter().map(|v| {
        let kind = match v.kind {
            ValuesSourceKind::ConfigMap => "ConfigMap",
            ValuesSourceKind::Secret => "Secret",
        };
        (kind, v.name.as_str())
    });
    let target = manifest
        .spec
        .target
        .iter()
        .map(|t| ("Secret", t.kubeconfig_secret_ref.name.as_str()));
    let credentials = manifest
        .spec
        .chart
        .secret_ref
        .iter()
        .map(|r| ("Secret", r.name.as_str()));
    values
        .chain(credentials)
        .chain(target)
        .map(move |(kind, name)| SourceRef {
            namespace: namespace.clone(),
            kind,
            name: name.to_owned(),
        })
}

/// The keys of the Manifests among `manifests` that read one of `changed` (pure).
pub(super) fn affected<'a>(
    manifests: impl IntoIterator<Item = (Key, &'a Manifest)>,
    changed: &HashSet<SourceRef>,
) -> BTreeSet<Key> {
    manifests
        .into_iter()
        .filter(|(_, manifest)| references(manifest).any(|r| changed.contains(&r)))
        .map(|(key, _)| key)
        .collect()
}

/// One labelled object as its watch reports it: which it is and its resourceVersion.
type Seen = (SourceRef, String);

/// What one watch (of one kind) knows of its objects: their resourceVersions (or another
/// version `V` of what matters of them), to tell a change from the same object listed again.
#[derive(Debug)]
pub(super) struct Versions<K = SourceRef, V = String> {
    known: HashMap<K, V>,
    /// The list under way (between `Init` and `InitDone`).
    listing: HashMap<K, V>,
    /// The first list is complete.
    synced: bool,
}

impl<K, V> Default for Versions<K, V> {
    fn default() -> Self {
        Self {
            known: HashMap::new(),
            listing: HashMap::new(),
            synced: false,
        }
    }
}

impl<K: Clone + Eq + std::hash::Hash, V: PartialEq> Versions<K, V> {
    /// The objects an event shows changed (pure): created, modified or deleted. The first list
    /// changes nothing (a Manifest is queued when it is first seen anyway); a relist (the watch
    /// lost its place) changes what differs from before, and what is gone from it.
    pub(super) fn on_event(&mut self, event: watcher::Event<(K, V)>) -> Vec<K> {
        match event {
            watcher::Event::Init => {
                self.listing.clear();
                Vec::new()
            }
            watcher::Event::InitApply((source, version)) => {
                self.listing.insert(source, version);
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = std::mem::take(&mut self.listing);
                let mut changed: Vec<K> = Vec::new();
                if self.synced {
                    let gone = self.known.keys().filter(|s| !listed.contains_key(*s));
                    changed.extend(gone.cloned());
                    let differ = listed.iter().filter(|(s, v)| self.known.get(*s) != Some(v));
                    changed.extend(differ.map(|(s, _)| s.clone()));
                }
                self.known = listed;
                self.synced = true;
                changed
            }
            watcher::Event::Apply((source, version)) => {
                if self.known.get(&source) == Some(&version) {
                    return Vec::new();
                }
                self.known.insert(source.clone(), version);
                vec![source]
            }
            watcher::Event::Delete((source, _)) => {
                self.known.remove(&source);
                vec![source]
            }
        }
    }
}

type Events =
    Pin<Box<dyn Stream<Item = (usize, Result<watcher::Event<Seen>, watcher::Error>)> + Send>>;

/// The metadata-only watch of the labelled objects of kind `K` (index `stream`), as [`Seen`]s.
fn watch<K>(client: &Client, namespace: Option<&str>, kind: &'static str, stream: usize) -> Events
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<PartialObjectMeta<K>> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let selector = format!("{WATCH_LABEL}={WATCH_LABEL_VALUE}");
    let seen = move |object: PartialObjectMeta<K>| -> Seen {
        let source = SourceRef {
            namespace: object.namespace().unwrap_or_default(),
            kind,
            name: object.name_any(),
        };
        (source, object.resource_version().unwrap_or_default())
    };
    watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .map(move |event| (stream, event.map(|event| map_event(event, seen))))
        .boxed()
}

/// Watches the labelled ConfigMaps and Secrets (of `namespace`, or all) and queues at once the
/// Manifests of the owned shards that read a changed one; runs until the task is dropped.
pub(super) async fn feed_sources(
    client: Client,
    namespace: Option<String>,
    ownership: Arc<Ownership>,
    work: Work,
    secret_versions: Arc<WatchedSecrets>,
) {
    let namespace = namespace.as_deref();
    let configmaps = watch::<ConfigMap>(&client, namespace, "ConfigMap", 0);
    let secrets = watch::<Secret>(&client, namespace, "Secret", 1);
    let mut events = futures::stream::select(configmaps, secrets).ready_chunks(BATCH);
    let mut versions: [Versions; 2] = Default::default();
    while let Some(batch) = events.next().await {
        let mut changed = HashSet::new();
        for (stream, event) in batch {
            match event {
                Ok(event) => changed.extend(versions[stream].on_event(event)),
                Err(e) => tracing::warn!("watch labelled values sources: {e}"),
            }
        }
        if changed.is_empty() {
            continue;
        }
        // The passes queued below must read a changed kubeconfig Secret, whatever the (separate)
        // watch of the Secrets' versions has delivered so far.
        for source in changed.iter().filter(|s| s.kind == "Secret") {
            secret_versions.forget(&source.namespace, &source.name);
        }
        let cached = work.cached();
        let keyed = cached
            .iter()
            .filter_map(|m| Some((work.key_of(m)?, m.as_ref())));
        for key in affected(keyed, &changed) {
            if ownership.wants(key.shard) {
                tracing::debug!(namespace = %key.namespace, name = %key.name, "a values source changed: queued");
                work.queue.add(key, Duration::ZERO);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn source(kind: &'static str, name: &str) -> SourceRef {
        SourceRef {
            namespace: "ns".into(),
            kind,
            name: name.into(),
        }
    }

    fn manifest(name: &str, spec: serde_json::Value) -> (Key, Manifest) {
        let mut full = json!({"module": name, "chart": {"path": "p"}});
        full.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        let manifest: Manifest = serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": full,
        }))
        .unwrap();
        let key = Key {
            shard: 0,
            namespace: "ns".into(),
            name: name.into(),
        };
        (key, manifest)
    }

    #[test]
    fn a_change_concerns_exactly_the_manifests_that_read_the_object() {
        let manifests = [
            manifest(
                "a",
                json!({"valuesFrom": [{"kind": "ConfigMap", "name": "shared"},
                                      {"kind": "Secret", "name": "a-secret"}]}),
            ),
            manifest(
                "b",
                json!({"valuesFrom": [{"kind": "ConfigMap", "name": "shared"}]}),
            ),
            manifest(
                "c",
                json!({"target": {"kubeconfigSecretRef": {"name": "remote"}}}),
            ),
            manifest("d", json!({})),
            manifest(
                "e",
                json!({"chart": {"oci": "oci://r.example.com/c:1", "secretRef": {"name": "pull"}}}),
            ),
        ];
        let of = |changed: &[SourceRef]| -> Vec<String> {
            let changed: HashSet<SourceRef> = changed.iter().cloned().collect();
            affected(manifests.iter().map(|(k, m)| (k.clone(), m)), &changed)
                .into_iter()
                .map(|k| k.name)
                .collect()
        };
        assert_eq!(of(&[source("ConfigMap", "shared")]), ["a", "b"]);
        assert_eq!(of(&[source("Secret", "a-secret")]), ["a"]);
        assert_eq!(of(&[source("Secret", "remote")]), ["c"], "a kubeconfig");
        assert_eq!(of(&[source("Secret", "pull")]), ["e"], "chart credentials");
        assert!(
            of(&[source("Secret", "shared")]).is_empty(),
            "a Secret is not a ConfigMap of the same name"
        );
        let elsewhere = SourceRef {
            namespace: "other".into(),
            ..source("ConfigMap", "shared")
        };
        assert!(
            of(&[elsewhere]).is_empty(),
            "valuesFrom reads its own namespace"
        );
    }

    #[test]
    fn only_changes_count_not_the_same_objects_listed_again() {
        let mut versions: Versions = Versions::default();
        let a = || source("ConfigMap", "a");
        let b = || source("ConfigMap", "b");
        // The first list: nothing changed (the Manifests are queued when first seen).
        assert!(versions.on_event(watcher::Event::Init).is_empty());
        versions.on_event(watcher::Event::InitApply((a(), "1".into())));
        versions.on_event(watcher::Event::InitApply((b(), "1".into())));
        assert!(versions.on_event(watcher::Event::InitDone).is_empty());
        // Edited, created, deleted: changes; the same version again is not.
        assert_eq!(
            versions.on_event(watcher::Event::Apply((a(), "2".into()))),
            [a()]
        );
        assert!(
            versions
                .on_event(watcher::Event::Apply((a(), "2".into())))
                .is_empty()
        );
        let c = source("Secret", "c");
        assert_eq!(
            versions.on_event(watcher::Event::Apply((c.clone(), "5".into()))),
            [source("Secret", "c")]
        );
        assert_eq!(
            versions.on_event(watcher::Event::Delete((c, "6".into()))),
            [source("Secret", "c")]
        );
        // A relist after the watch lost its place: what differs, and what is gone.
        versions.on_event(watcher::Event::Init);
        versions.on_event(watcher::Event::InitApply((a(), "2".into())));
        let d = source("ConfigMap", "d");
        versions.on_event(watcher::Event::InitApply((d.clone(), "1".into())));
        let mut changed = versions.on_event(watcher::Event::InitDone);
        changed.sort();
        assert_eq!(changed, [b(), d], "b is gone, d is new, a is unchanged");
    }
}
