//! Watches: the two shard-selected watches of Manifests, the caches they fill and the queue
//! they feed.
//!
//! On the label path, `modulemanager.io/shard in (<owned>)` is restarted whenever the owned set
//! changes, so the cache and the event stream scale with this replica's share; the stray watch
//! (`shard::label::stray_selector`) sees new Manifests, whose owner stamps the label in its first
//! pass, and labels naming no shard. Which replica acts on a Manifest whose label is wrong:
//! `shard::label::route`. With the API server's filter (`shard::server`), the shard watch asks
//! for the owned shards' hash ranges (`shardSelector`, restarted the same way) and there is no
//! stray watch: the server selects by UID, which every Manifest has from its creation.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::api::Manifest;
use crate::shard::SHARD_LABEL;
use crate::shard::fence::{Ownership, Watched};
use crate::shard::label::{owned_selector, stray_selector};
use crate::shard::ranges::{ServerSelection, server_selection};
use crate::shard::server::{ShardFilter, with_shard_selector};
use crate::telemetry::metrics::WatchLabels;
use crate::work::caches::{Candidates, Work};
use crate::work::seen::Seen;

/// The labelled watch's index in [`Feed`]'s per-watch arrays (the unlabelled one is 1).
const LABELLED: usize = 0;

/// How long what the watch loop saw of a Manifest a watch reported deleted is kept: a Manifest
/// that moves from one watch to the other (the first pass stamps the shard label) leaves one
/// and enters the other in either order, and forgetting it would make its next event look new
/// (a second pass for the first pass's own writes).
const GONE_GRACE: Duration = Duration::from_secs(10);

type Events = Pin<Box<dyn Stream<Item = Result<watcher::Event<Manifest>, watcher::Error>> + Send>>;

/// The annotation `kubectl apply` keeps a copy of the whole object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no reader of the caches uses before a Manifest enters them: `managedFields` (the
/// largest part of a Manifest after a few writes: one entry per writer, each a tree of the
/// fields it set) and kubectl's copy of the object. A pass writes Manifests with merge patches
/// only (never a PUT of the cached copy), so what is dropped here is never written back.
fn slim(manifest: &mut Manifest) {
    let meta = manifest.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// The Manifests `api` lists that match `labels` (every one when `None`).
fn watch(api: Api<Manifest>, labels: Option<&str>) -> Events {
    let config = match labels {
        Some(labels) => watcher::Config::default().labels(labels),
        None => watcher::Config::default(),
    };
    watcher(api, config).default_backoff().modify(slim).boxed()
}

/// No watch: nothing to select.
fn nothing() -> Events {
    futures::stream::pending().boxed()
}

/// Where the Manifests are watched: the client and the namespace (every one when `None`).
#[derive(Clone)]
pub(super) struct Scope {
    pub(super) client: Client,
    pub(super) namespace: Option<String>,
}

impl Scope {
    fn api(&self, client: Client) -> Api<Manifest> {
        match &self.namespace {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::all(client),
        }
    }
}

/// Feeds the queue from both watches: a Manifest is queued when it is new to this replica, its
/// spec changed (generation), its deletion started or it asks for a pass or a reset
/// ([`Seen::wants_pass_after`]), and its shard is owned here. Status-only writes (ours) do not
/// requeue: drift repair runs on the reconcile's own schedule.
pub(super) async fn feed_queue(
    scope: Scope,
    events: Family<WatchLabels, Counter>,
    base: Option<String>,
    ownership: Arc<Ownership>,
    work: Work,
    (labelled_writer, unlabelled_writer): (Writer<Manifest>, Writer<Manifest>),
    synced: Arc<AtomicBool>,
) {
    let mut watched = ownership.subscribe();
    let owned = watched.borrow_and_update().clone();
    let labels = work.filter.labels();
    let mut unlabelled = if labels {
        let stray = stray_selector(base.as_deref(), work.shards());
        watch(scope.api(scope.client.clone()), Some(&stray))
    } else {
        nothing()
    };
    let mut feed = Feed {
        synced: [
            owned.shards.as_ref().is_some_and(BTreeSet::is_empty),
            !labels,
        ],
        scope,
        events: ["shard", "stray"]
            .map(|watch| events.get_or_create(&WatchLabels { watch }).clone()),
        base,
        ownership,
        work,
        writers: [labelled_writer, unlabelled_writer],
        synced_flag: synced,
        owned,
        listed: Default::default(),
        gone: Default::default(),
    };
    let mut labelled = feed.shard_watch();
    loop {
        let (event, from_labelled) = tokio::select! {
            changed = watched.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = watched.borrow_and_update().clone();
                if let Some(watch) = feed.owned_changed(now) {
                    labelled = watch;
                }
                continue;
            }
            Some(event) = labelled.next() => (event, true),
            Some(event) = unlabelled.next() => (event, false),
        };
        feed.on_event(event, usize::from(!from_labelled));
    }
}

/// The state of the watch loop; per-watch arrays are indexed labelled (0), unlabelled (1).
struct Feed {
    scope: Scope,
    /// Manifests received, per watch (`module_manager_manifest_watch_events_total`).
    events: [Counter; 2],
    base: Option<String>,
    ownership: Arc<Ownership>,
    work: Work,
    writers: [Writer<Manifest>; 2],
    /// Set once both watches have seen their first full lists.
    synced_flag: Arc<AtomicBool>,
    synced: [bool; 2],
    owned: Watched,
    /// Keys listed by a watch's initial list wait for its end: the cache (the store a pass
    /// reads) holds the new list only from `InitDone` on.
    listed: [Vec<(Candidates, Seen)>; 2],
    /// Keys a watch reported deleted, and when: forgotten ([`Work::seen`]) after
    /// [`GONE_GRACE`] unless a watch holds their Manifest again.
    gone: std::collections::HashMap<crate::work::caches::Key, std::time::Instant>,
}

impl Feed {
    /// The shard watch of the shards owned now.
    fn shard_watch(&self) -> Events {
        let base = self.base.as_deref();
        let owned = self.owned.shards.as_ref();
        let client = &self.scope.client;
        match self.work.filter {
            ShardFilter::Labels => match owned_selector(SHARD_LABEL, base, owned) {
                Some(selector) => watch(self.scope.api(client.clone()), Some(&selector)),
                None => nothing(),
            },
            ShardFilter::Server => match server_selection(owned, self.work.shards()) {
                ServerSelection::Nothing => nothing(),
                ServerSelection::Everything => watch(self.scope.api(client.clone()), base),
                ServerSelection::Ranges(selector) => {
                    let ranged = with_shard_selector(client, &selector);
                    watch(self.scope.api(ranged), base)
                }
            },
        }
    }

    /// The owned shards changed (or not): re-filters the queue and returns the new shard watch.
    fn owned_changed(&mut self, now: Watched) -> Option<Events> {
        if now == self.owned {
            return None;
        }
        self.owned = now;
        // Keys of shards no longer ours leave the queue (their new owner queues them); those of
        // newly owned shards are queued by the new watch's list, and new Manifests of theirs
        // from the unlabelled cache right here. One snapshot for all three, so that they agree.
        let owned = &self.owned;
        let keep = |shard: u32| owned.shards.as_ref().is_none_or(|set| set.contains(&shard));
        let work = &self.work;
        work.queue.retain_shards(keep);
        work.seen().retain(|key, _| keep(key.shard));
        for manifest in work.unlabelled.state() {
            let candidates = work.candidates(&manifest);
            if let Some(key) = candidates.and_then(|c| c.queued(keep)) {
                work.queue.add(key, Duration::ZERO);
            }
        }
        let labelled = self.shard_watch();
        self.listed[LABELLED].clear();
        if self.owned.shards.as_ref().is_some_and(BTreeSet::is_empty) {
            // Nothing to watch: the cache must not keep the last shards' Manifests.
            self.writers[LABELLED].apply_watcher_event(&watcher::Event::Init);
            self.writers[LABELLED].apply_watcher_event(&watcher::Event::InitDone);
        }
        Some(labelled)
    }

    /// An event of watch `stream`: into its cache, then into the queue.
    fn on_event(&mut self, event: Result<watcher::Event<Manifest>, watcher::Error>, stream: usize) {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!("watch Manifests: {e}");
                return;
            }
        };
        self.writers[stream].apply_watcher_event(&event);
        if let watcher::Event::Apply(_) | watcher::Event::InitApply(_) | watcher::Event::Delete(_) =
            &event
        {
            self.events[stream].inc();
        }
        match &event {
            watcher::Event::Apply(manifest) => {
                self.applied(manifest);
            }
            watcher::Event::InitApply(manifest) => {
                // Decided at InitDone, against ownership and `seen` as they are then.
                if let Some(candidates) = self.work.candidates(manifest) {
                    let seen = Seen::of(manifest, candidates.state());
                    self.listed[stream].push((candidates, seen));
                }
            }
            watcher::Event::Delete(manifest) => {
                let now = std::time::Instant::now();
                if let Some(candidates) = self.work.candidates(manifest) {
                    self.gone.extend(candidates.keys().map(|key| (key, now)));
                }
                self.forget_gone(now);
            }
            watcher::Event::InitDone => self.listed_all(stream),
            watcher::Event::Init => self.listed[stream].clear(),
        }
    }

    /// Forgets what was seen of the keys reported deleted more than [`GONE_GRACE`] ago whose
    /// Manifest neither watch holds now.
    fn forget_gone(&mut self, now: std::time::Instant) {
        let work = &self.work;
        let mut seen = work.seen();
        self.gone.retain(|key, since| {
            if now.duration_since(*since) < GONE_GRACE {
                return true;
            }
            if work.get(&key.namespace, &key.name).is_none() {
                seen.remove(key);
            }
            false
        });
    }

    /// A Manifest created or changed: queued when it is new or changed and its shard is ours
    /// (or the wrong shard its label names is: to relabel it).
    fn applied(&self, manifest: &Manifest) {
        let Some(candidates) = self.work.candidates(manifest) else {
            return;
        };
        let Some(key) = candidates.queued(|shard| self.ownership.wants(shard)) else {
            return;
        };
        let now = Seen::of(manifest, candidates.state());
        let mut seen = self.work.seen();
        let wanted = now.wants_pass_after(seen.get(&key));
        seen.insert(key.clone(), now);
        drop(seen);
        if wanted {
            self.work.queue.add(key, Duration::ZERO);
        }
    }

    /// The initial list of watch `stream` is complete: its keys are queued.
    fn listed_all(&mut self, stream: usize) {
        for (candidates, now) in self.listed[stream].drain(..) {
            let Some(key) = candidates.queued(|shard| self.ownership.wants(shard)) else {
                continue;
            };
            let mut seen = self.work.seen();
            let wanted = now.wants_pass_after(seen.get(&key));
            seen.insert(key.clone(), now);
            if wanted {
                self.work.queue.add(key, Duration::ZERO);
            }
        }
        self.synced[stream] = true;
        if self.synced == [true, true] {
            self.synced_flag.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cached_copy_drops_managed_fields_and_kubectls_copy_only() {
        let mut cached: Manifest = serde_json::from_value(serde_json::json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": 2,
                "resourceVersion": "7", "labels": {SHARD_LABEL: "3"},
                "annotations": {LAST_APPLIED: "{\"spec\":{}}", "team": "a"},
                "finalizers": ["modulemanager.io/finalizer"],
                "managedFields": [{"manager": "kubectl", "operation": "Apply",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:module": {}}}}]},
            "spec": {"module": "m", "chart": {"path": "p"}},
            "status": {"state": "Ready"},
        }))
        .unwrap();
        let before = cached.clone();
        slim(&mut cached);
        assert_eq!(cached.metadata.managed_fields, None);
        let mut expected = before;
        expected.metadata.managed_fields = None;
        expected.metadata.annotations = Some([("team".to_owned(), "a".to_owned())].into());
        assert_eq!(
            serde_json::to_value(&cached).unwrap(),
            serde_json::to_value(&expected).unwrap(),
            "everything else is kept"
        );
    }
}
