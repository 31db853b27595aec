//! The controller's caches and queue ([`Work`]): the queue key, the two watch caches of
//! Manifests and what the watch loop saw of each, shared by the watches, the dispatch of passes,
//! the fleet loop (the load it publishes) and the admin API.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::Manifest;
use crate::apply::target::Budgets;
use crate::shard::fleet::LocalWork;
use crate::shard::label::{LabelState, Route, label_state, route};
use crate::shard::membership::{
    MAX_PUBLISHED_SHARDS, MAX_PUBLISHED_TARGETS, MemberLoad, ShardLoad,
};
use crate::shard::server::ShardFilter;
use crate::shard::{SHARD_LABEL, ShardCount};
use crate::work::queue::{QueueKey, WorkQueue};
use crate::work::seen::Seen;

/// A Manifest's queue key: its shard, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// The Manifest's shard (from its UID).
    pub shard: u32,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl QueueKey for Key {
    fn shard(&self) -> u32 {
        self.shard
    }
}

/// A Manifest's key (under its UID's shard) and what its shard label says: the keys it may be
/// queued under (`shard::label::route`).
#[derive(Clone, Debug)]
pub(super) struct Candidates {
    key: Key,
    state: LabelState,
}

impl Candidates {
    /// The key this replica queues, given the shards it `wants`: the UID's shard, or the wrong
    /// shard the label names (to relabel it); `None`: another replica's.
    pub(super) fn queued(&self, wants: impl Fn(u32) -> bool) -> Option<Key> {
        let shard = route(self.state, self.key.shard, wants)?.shard();
        Some(Key {
            shard,
            ..self.key.clone()
        })
    }

    /// What its shard label says.
    pub(super) fn state(&self) -> LabelState {
        self.state
    }

    /// Every key it may be queued under.
    pub(super) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        let relabel = match self.state {
            LabelState::Wrong(shard) => Some(Key {
                shard,
                ..self.key.clone()
            }),
            _ => None,
        };
        std::iter::once(self.key.clone()).chain(relabel)
    }
}

/// The controller's caches and queue, shared with the fleet loop and the admin API.
#[derive(Clone)]
pub struct Work {
    pub(super) queue: Arc<WorkQueue<Key>>,
    /// What the watch loop last queued each key for; a key dropped without a pass is removed,
    /// so that the next list or event of its Manifest queues it again.
    pub(super) seen: Arc<Mutex<HashMap<Key, Seen>>>,
    pub(super) labelled: Store<Manifest>,
    pub(super) unlabelled: Store<Manifest>,
    pub(super) shards: ShardCount,
    /// How the watches select this replica's shards (by label, or by the API server).
    pub(super) filter: ShardFilter,
    /// The remote targets' request budgets (their use is published with the load).
    pub(super) budgets: Budgets,
}

impl Work {
    /// The work queue.
    pub fn queue(&self) -> &Arc<WorkQueue<Key>> {
        &self.queue
    }

    /// The cached Manifest `namespace/name`, if this replica watches it.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Manifest>> {
        let reference = ObjectRef::new(name).within(namespace);
        self.labelled
            .get(&reference)
            .or_else(|| self.unlabelled.get(&reference))
    }

    /// The shard of a Manifest (from its UID).
    pub(super) fn shard_of(&self, manifest: &Manifest) -> Option<u32> {
        manifest.uid().map(|uid| self.shards.shard_of(&uid))
    }

    /// A Manifest's queue key (its UID's shard).
    pub(super) fn key_of(&self, manifest: &Manifest) -> Option<Key> {
        Some(Key {
            shard: self.shard_of(manifest)?,
            namespace: manifest.namespace().unwrap_or_default(),
            name: manifest.name_any(),
        })
    }

    /// Every cached Manifest, of both watches (one being labelled may be in both).
    pub(super) fn cached(&self) -> Vec<Arc<Manifest>> {
        let mut all = self.labelled.state();
        all.extend(self.unlabelled.state());
        all
    }

    /// The fleet's shard count.
    pub(super) fn shards(&self) -> ShardCount {
        self.shards
    }

    /// The keys a Manifest may be queued under, by what its shard label says. With the API
    /// server's filter the label is not read: the UID's shard is the only key (nothing relabels).
    pub(super) fn candidates(&self, manifest: &Manifest) -> Option<Candidates> {
        let key = self.key_of(manifest)?;
        let state = if self.filter.labels() {
            let label = manifest.labels().get(SHARD_LABEL).map(String::as_str);
            label_state(label, key.shard, self.shards)
        } else {
            LabelState::Correct
        };
        Some(Candidates { key, state })
    }

    /// What a pass of `key` does with its cached Manifest: reconcile it (the key is its UID's
    /// shard) or relabel it (the key is the other shard its label names); `None` when the key
    /// no longer fits it (deleted, re-created under a new UID, label corrected meanwhile).
    pub(super) fn route_of(&self, key: &Key, manifest: &Manifest) -> Option<Route> {
        let candidates = self.candidates(manifest)?;
        route(candidates.state, candidates.key.shard, |shard| {
            shard == key.shard
        })
    }

    pub(super) fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Seen>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl LocalWork for Work {
    fn in_flight(&self, shard: u32) -> usize {
        self.queue.in_flight_in(shard)
    }

    fn load(&self) -> MemberLoad {
        let snapshot = self.queue.snapshot();
        let mut shards: BTreeMap<u32, ShardLoad> = BTreeMap::new();
        let cached = self.labelled.state();
        for manifest in &cached {
            if let Some(shard) = self.shard_of(manifest) {
                shards.entry(shard).or_default().manifests += 1;
            }
        }
        for (shard, queue) in &snapshot.shards {
            let load = shards.entry(*shard).or_default();
            load.queued = queue.depth as u64;
            load.scheduled = queue.scheduled as u64;
        }
        if shards.len() > MAX_PUBLISHED_SHARDS {
            shards.clear();
        }
        let next_due = snapshot.next_due_in_seconds.and_then(|seconds| {
            let due_in = k8s_openapi::jiff::SignedDuration::try_from_secs_f64(seconds).ok()?;
            let at = k8s_openapi::jiff::Timestamp::now()
                .checked_add(due_in)
                .ok()?;
            // Whole seconds: the annotation stays short, and a table shows no nanoseconds.
            at.round(k8s_openapi::jiff::Unit::Second).ok()
        });
        MemberLoad {
            queued: snapshot.depth as u64,
            scheduled: snapshot.scheduled as u64,
            next_due,
            in_flight: snapshot.in_flight as u64,
            manifests: cached.len() as u64,
            shards,
            targets: self.budgets.busiest(MAX_PUBLISHED_TARGETS),
        }
    }
}
