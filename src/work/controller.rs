//! Controller: the queue key, the configuration, the caches and queue shared with the fleet loop
//! and the admin API ([`Work`], with the census of its Manifests), and the [`Controller`] that
//! starts the watches (`watches.rs`) and the dispatch of passes (`dispatch.rs`).
//!
//! Two watches: `modulemanager.io/shard in (<owned>)` (restarted whenever the owned set
//! changes, so the cache and the event stream scale with this replica's share) and
//! the stray watch `modulemanager.io/shard notin (0,…,S-1)` (new Manifests, whose owner stamps
//! the label in its first pass, and labels naming no shard). A Manifest whose label names
//! another valid shard is queued by that shard's owner, under that shard, to be relabelled.
//! Ownership is checked on every event, when a key is dispatched, and by the pass's fence before
//! every write. A third watch, of the ConfigMaps and Secrets labelled `modulemanager.io/watch=true`
//! (`sources.rs`), queues the Manifests that read one that changed; a fourth, of the Manifests
//! labelled `modulemanager.io/depended-on=true` (`dependencies.rs`), those that depend on one
//! whose readiness changed.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::{Resource, ResourceExt};

use k8s_openapi::jiff::Timestamp;

use crate::api::{Manifest, State};
use crate::plan::status::PROGRESSING_WITH_RETRY;
use crate::reconcile::Context;
use crate::shard::fence::Ownership;
use crate::shard::fleet::LocalWork;
use crate::shard::label::{LabelState, Route, label_state, route};
use crate::shard::membership::{MAX_PUBLISHED_SHARDS, MemberLoad, ShardLoad};
use crate::shard::{SHARD_LABEL, ShardCount};
use crate::telemetry::metrics::{
    FAILING_REASONS, FailingLabels, ManifestMetrics, QueueMetrics, StateLabels,
};
use crate::work::dependencies::feed_dependents;
use crate::work::dispatch::Passes;
use crate::work::queue::{QueueKey, WorkQueue};
use crate::work::sources::feed_sources;
use crate::work::watches::{Seen, feed_queue};

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

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Most reconciles at once.
    pub concurrency: usize,
    /// How long shutdown waits for in-flight reconciles.
    pub drain_timeout: Duration,
    /// Watch only this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Reconcile only Manifests matching this label selector (several fleets can split the
    /// Manifests between them).
    pub selector: Option<String>,
    /// Queue depth and passes in flight.
    pub metrics: QueueMetrics,
    /// Set once the watches have seen their first full lists (`/readyz`).
    pub synced: Arc<AtomicBool>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            concurrency: 4,
            drain_timeout: Duration::from_secs(10),
            namespace: None,
            selector: None,
            metrics: QueueMetrics::default(),
            synced: Arc::default(),
        }
    }
}

/// The controller's caches and queue, shared with the fleet loop and the admin API.
#[derive(Clone)]
pub struct Work {
    pub(super) queue: Arc<WorkQueue<Key>>,
    /// What the watch loop last queued each key for; a key dropped without a pass is removed,
    /// so that the next list or event of its Manifest queues it again.
    seen: Arc<Mutex<HashMap<Key, Seen>>>,
    labelled: Store<Manifest>,
    pub(super) unlabelled: Store<Manifest>,
    shards: ShardCount,
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

    /// The keys a Manifest may be queued under, by what its shard label says.
    pub(super) fn candidates(&self, manifest: &Manifest) -> Option<Candidates> {
        let key = self.key_of(manifest)?;
        let label = manifest.labels().get(SHARD_LABEL).map(String::as_str);
        let state = label_state(label, key.shard, self.shards);
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

impl Work {
    /// The cached Manifests of the shards `owns` accepts, counted by state (`census`). A
    /// Manifest being labelled can sit in both caches for a moment: counted once.
    pub fn census(&self, owns: impl Fn(u32) -> bool, now: Timestamp) -> Census {
        let labelled = self.labelled.state();
        let unlabelled = self.unlabelled.state();
        let mut seen = std::collections::HashSet::new();
        census(
            labelled
                .iter()
                .chain(&unlabelled)
                .filter(|m| self.shard_of(m).is_some_and(&owns))
                .filter(|m| seen.insert(m.uid()))
                .map(|m| m.as_ref()),
            now,
        )
    }
}

/// Manifests counted by status state, and the age of the oldest deletion request.
#[derive(Debug, Default, PartialEq)]
pub struct Census {
    /// State name (`Unknown` without a status yet) → count; every state is present.
    pub by_state: BTreeMap<&'static str, i64>,
    /// Age of the oldest `deletionTimestamp`, if any Manifest is being deleted.
    pub oldest_deletion: Option<Duration>,
    /// (`stalled` | `retrying`, Ready reason) → count of the failing Manifests; every pair
    /// of [`FAILING_REASONS`] is present.
    pub failing: BTreeMap<(&'static str, &'static str), i64>,
}

/// How a Manifest fails, if it does: `stalled` (`Stalled=True`) or `retrying`
/// (`Reconciling=True` with `ProgressingWithRetry`), with its Ready reason as one of
/// [`FAILING_REASONS`] (`Other` for one not in the list, so the label stays bounded).
fn failing(status: &crate::api::ManifestStatus) -> Option<(&'static str, &'static str)> {
    let condition = |kind: &str| status.conditions.iter().find(|c| c.type_ == kind);
    let is_true = |kind: &str| condition(kind).is_some_and(|c| c.status == "True");
    let how = if is_true("Stalled") {
        "stalled"
    } else if condition("Reconciling")
        .is_some_and(|c| c.status == "True" && c.reason == PROGRESSING_WITH_RETRY)
    {
        "retrying"
    } else {
        return None;
    };
    let reason = condition("Ready").map_or("Other", |c| c.reason.as_str());
    let known = FAILING_REASONS.iter().copied().find(|r| *r == reason);
    Some((how, known.unwrap_or("Other")))
}

/// Counts `manifests` by state (pure).
pub fn census<'a>(manifests: impl IntoIterator<Item = &'a Manifest>, now: Timestamp) -> Census {
    let mut by_state: BTreeMap<&'static str, i64> = [
        "Ready",
        "Processing",
        "Warning",
        "Error",
        "Deleting",
        "Unknown",
    ]
    .into_iter()
    .map(|state| (state, 0))
    .collect();
    let mut oldest_deletion: Option<Duration> = None;
    let mut failing_count: BTreeMap<(&'static str, &'static str), i64> = ["stalled", "retrying"]
        .into_iter()
        .flat_map(|how| {
            FAILING_REASONS
                .iter()
                .map(move |reason| ((how, *reason), 0))
        })
        .collect();
    for manifest in manifests {
        if let Some(key) = manifest.status.as_ref().and_then(failing) {
            *failing_count.entry(key).or_default() += 1;
        }
        let state = match manifest.status.as_ref().and_then(|s| s.state.as_ref()) {
            Some(State::Ready) => "Ready",
            Some(State::Processing) => "Processing",
            Some(State::Warning) => "Warning",
            Some(State::Error) => "Error",
            Some(State::Deleting) => "Deleting",
            None => "Unknown",
        };
        *by_state.entry(state).or_default() += 1;
        if let Some(since) = &manifest.meta().deletion_timestamp {
            let age = Duration::try_from(now.duration_since(since.0)).unwrap_or_default();
            oldest_deletion = Some(oldest_deletion.map_or(age, |o| o.max(age)));
        }
    }
    Census {
        by_state,
        oldest_deletion,
        failing: failing_count,
    }
}

/// Publishes the census of this replica's Manifests every `interval`, until the task is dropped.
pub async fn publish_census(
    work: Work,
    ownership: Arc<Ownership>,
    metrics: ManifestMetrics,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        // A fenced replica owns nothing it may act on: it reports nothing (another replica
        // may own those shards now).
        let in_time = ownership.in_time();
        let census = work.census(|shard| in_time && ownership.wants(shard), Timestamp::now());
        for (state, count) in census.by_state {
            metrics
                .by_state
                .get_or_create(&StateLabels { state })
                .set(count);
        }
        metrics
            .oldest_deletion
            .set(census.oldest_deletion.unwrap_or_default().as_secs_f64());
        for ((status, reason), count) in census.failing {
            metrics
                .failing
                .get_or_create(&FailingLabels { status, reason })
                .set(count);
        }
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
        }
    }
}

/// A controller, before it runs.
pub struct Controller {
    ctx: Arc<Context>,
    config: ControllerConfig,
    ownership: Arc<Ownership>,
    work: Work,
    writers: (Writer<Manifest>, Writer<Manifest>),
}

impl Controller {
    /// A controller that works on the shards `ownership` allows.
    pub fn new(ctx: Arc<Context>, config: ControllerConfig, ownership: Arc<Ownership>) -> Self {
        let (labelled, labelled_writer) = reflector::store();
        let (unlabelled, unlabelled_writer) = reflector::store();
        // The queue's counts for the passes too: one waits for its workloads only while no
        // other key is due (`reconcile::install`, the rollout wait inside the pass).
        let counts = config.metrics.counts.clone();
        let queue = Arc::new(WorkQueue::new(config.metrics.clone()));
        ctx.queue.install(move || counts.get());
        let work = Work {
            queue,
            seen: Arc::default(),
            labelled,
            unlabelled,
            shards: ctx.shards,
        };
        Self {
            ctx,
            config,
            ownership,
            work,
            writers: (labelled_writer, unlabelled_writer),
        }
    }

    /// The caches and queue (for the fleet loop and the admin API).
    pub fn work(&self) -> Work {
        self.work.clone()
    }

    /// Runs until `shutdown` completes, then stops taking work and waits up to the drain
    /// timeout for in-flight reconciles.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let Self {
            ctx,
            config,
            ownership,
            work,
            writers,
        } = self;
        let api = match &config.namespace {
            Some(namespace) => Api::<Manifest>::namespaced(ctx.client.clone(), namespace),
            None => Api::<Manifest>::all(ctx.client.clone()),
        };
        let dependents = feed_dependents(api.clone(), ownership.clone(), work.clone());
        let manifests = feed_queue(
            api,
            config.selector.clone(),
            ownership.clone(),
            work.clone(),
            writers,
            config.synced.clone(),
        );
        let sources = feed_sources(
            ctx.client.clone(),
            config.namespace.clone(),
            ownership.clone(),
            work.clone(),
        );
        // One task: shutdown stops the watches together.
        let watch = tokio::spawn(async move {
            tokio::join!(manifests, sources, dependents);
        });

        let passes = Passes::new(work, ctx, ownership);
        let tasks = passes.dispatch(config.concurrency, shutdown).await?;
        passes.drain(tasks, watch, config.drain_timeout).await;
        Ok(())
    }
}

/// Runs a controller outside any fleet: it owns every shard (tests, benchmarks, `examples/`).
pub async fn run(
    ctx: Arc<Context>,
    config: ControllerConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    Controller::new(ctx, config, Ownership::everything())
        .run(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_census_counts_states_and_the_oldest_deletion() {
        let now: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        let manifest = |state: Option<State>, deleted_at: Option<&str>| {
            let mut m = Manifest::new(
                "m",
                serde_json::from_value(serde_json::json!({
                    "module": "x", "chart": {"path": "x"}
                }))
                .unwrap(),
            );
            m.status = state.map(|state| crate::api::ManifestStatus {
                state: Some(state),
                ..Default::default()
            });
            m.metadata.deletion_timestamp = deleted_at
                .map(|t| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.parse().unwrap()));
            m
        };
        let manifests = [
            manifest(Some(State::Ready), None),
            manifest(Some(State::Ready), None),
            manifest(None, None),
            manifest(Some(State::Deleting), Some("2026-11-30T11:50:00Z")),
            manifest(Some(State::Deleting), Some("2026-11-30T11:59:00Z")),
        ];
        let counted = census(&manifests, now);
        assert_eq!(counted.by_state["Ready"], 2);
        assert_eq!(counted.by_state["Unknown"], 1);
        assert_eq!(counted.by_state["Deleting"], 2);
        assert_eq!(counted.by_state["Error"], 0, "every state is present");
        assert_eq!(counted.oldest_deletion, Some(Duration::from_secs(600)));
        assert_eq!(census(&manifests[..3], now).oldest_deletion, None);
    }

    #[test]
    fn failing_manifests_are_counted_by_how_and_reason() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let condition = |kind: &str, status: &str, reason: &str| Condition {
            type_: kind.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::UNIX_EPOCH,
            ),
        };
        let with = |conditions: Vec<Condition>| {
            let mut m = Manifest::new(
                "m",
                serde_json::from_value(serde_json::json!({"module": "x", "chart": {"path": "x"}}))
                    .unwrap(),
            );
            m.status = Some(crate::api::ManifestStatus {
                state: Some(State::Error),
                conditions,
                ..Default::default()
            });
            m
        };
        let stalled = |reason| {
            with(vec![
                condition("Ready", "False", reason),
                condition("Reconciling", "False", reason),
                condition("Stalled", "True", reason),
            ])
        };
        let manifests = [
            stalled("ReadinessTimeout"),
            stalled("ReadinessTimeout"),
            stalled("ObjectFailed"),
            stalled("SomethingNew"),
            with(vec![
                condition("Ready", "False", "ValuesError"),
                condition("Reconciling", "True", PROGRESSING_WITH_RETRY),
                condition("Stalled", "False", "ValuesError"),
            ]),
            // In progress without an error, and ready: not failing.
            with(vec![
                condition("Ready", "False", "Progressing"),
                condition("Reconciling", "True", "Progressing"),
            ]),
            with(vec![condition("Ready", "True", "Ready")]),
        ];
        let counted = census(&manifests, Timestamp::UNIX_EPOCH).failing;
        assert_eq!(counted[&("stalled", "ReadinessTimeout")], 2);
        assert_eq!(counted[&("stalled", "ObjectFailed")], 1);
        assert_eq!(
            counted[&("stalled", "Other")],
            1,
            "an unknown reason is bounded"
        );
        assert_eq!(counted[&("retrying", "ValuesError")], 1);
        assert_eq!(counted.values().sum::<i64>(), 5);
        assert_eq!(
            counted.len(),
            2 * FAILING_REASONS.len(),
            "every series is present"
        );
    }
}
