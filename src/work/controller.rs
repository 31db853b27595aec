//! Controller: watches the Manifests of the shards this replica owns, feeds the work queue, runs
//! reconciles with bounded concurrency, and drains in-flight work on shutdown.
//!
//! Two watches: `modulemanager.io/shard in (<owned>)` (restarted whenever the owned set
//! changes, so the cache and the event stream scale with this replica's share) and
//! `!modulemanager.io/shard` (new Manifests, whose owner stamps the label in its first pass).
//! Ownership is checked on every event, when a key is dispatched, and by the pass's fence before
//! every write.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::Instrument;

use k8s_openapi::jiff::Timestamp;

use crate::api::{Manifest, State};
use crate::reconcile::{Context, Next, reconcile};
use crate::shard::fence::Ownership;
use crate::shard::fleet::LocalWork;
use crate::shard::membership::{MAX_PUBLISHED_SHARDS, MemberLoad, ShardLoad};
use crate::shard::{SHARD_LABEL, ShardCount};
use crate::telemetry::metrics::{ManifestMetrics, QueueMetrics, StateLabels};
use crate::work::queue::{QueueKey, WorkQueue, backoff};

/// Numbers reconcile passes within this process (`reconcile_id` on every log line of a pass).
static RECONCILE_IDS: AtomicU64 = AtomicU64::new(1);

/// Above this many owned shards the shard watch selects every labelled Manifest and filters
/// locally (a label selector with thousands of values would make an oversized request).
const MAX_SELECTOR_SHARDS: usize = 1024;

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

/// What the watch loop remembers of a Manifest to tell a spec change from a status-only write.
#[derive(PartialEq)]
struct Seen {
    uid: Option<String>,
    generation: Option<i64>,
    deleting: bool,
}

impl Seen {
    fn of(manifest: &Manifest) -> Self {
        Self {
            uid: manifest.uid(),
            generation: manifest.meta().generation,
            deleting: manifest.meta().deletion_timestamp.is_some(),
        }
    }
}

/// The controller's caches and queue, shared with the fleet loop and the admin API.
#[derive(Clone)]
pub struct Work {
    queue: Arc<WorkQueue<Key>>,
    /// What the watch loop last queued each key for; a key dropped without a pass is removed,
    /// so that the next list or event of its Manifest queues it again.
    seen: Arc<Mutex<HashMap<Key, Seen>>>,
    labelled: Store<Manifest>,
    unlabelled: Store<Manifest>,
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
    fn shard_of(&self, manifest: &Manifest) -> Option<u32> {
        manifest.uid().map(|uid| self.shards.shard_of(&uid))
    }

    /// A Manifest's queue key.
    fn key_of(&self, manifest: &Manifest) -> Option<Key> {
        Some(Key {
            shard: self.shard_of(manifest)?,
            namespace: manifest.namespace().unwrap_or_default(),
            name: manifest.name_any(),
        })
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Seen>> {
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
    for manifest in manifests {
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
            shards.entry(*shard).or_default().queued = queue.depth as u64;
        }
        if shards.len() > MAX_PUBLISHED_SHARDS {
            shards.clear();
        }
        MemberLoad {
            queued: snapshot.depth as u64,
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
        let work = Work {
            queue: Arc::new(WorkQueue::new(config.metrics.clone())),
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
        let watch = tokio::spawn(feed_queue(
            api,
            config.selector.clone(),
            ownership.clone(),
            work.clone(),
            writers,
            config.synced.clone(),
        ));

        let semaphore = Arc::new(Semaphore::new(config.concurrency.max(1)));
        let failures = Arc::new(Mutex::new(HashMap::<Key, u32>::new()));
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                permit = semaphore.clone().acquire_owned() => permit?,
                _ = &mut shutdown => break,
            };
            let key = tokio::select! {
                key = work.queue.next() => key,
                _ = &mut shutdown => break,
            };
            let Some(key) = key else { break };
            // From here on, however the pass ends (also a task aborted before its first poll),
            // the key stops counting as in flight: a shard must not look busy forever.
            let in_flight = InFlight {
                queue: work.queue.clone(),
                key: key.clone(),
            };
            let pass = run_pass(
                in_flight,
                key,
                work.clone(),
                ctx.clone(),
                ownership.clone(),
                failures.clone(),
            );
            tasks.spawn(async move {
                pass.await;
                drop(permit);
            });
            while tasks.try_join_next().is_some() {}
        }

        tracing::info!(
            in_flight = tasks.len(),
            "shutting down: draining in-flight reconciles"
        );
        work.queue.close();
        watch.abort();
        let drained = tokio::time::timeout(config.drain_timeout, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                abandoned = tasks.len(),
                "drain timeout: abandoning in-flight reconciles"
            );
            // Their fences must fail from now on (the shards are about to be handed over), and
            // they are aborted and awaited, so none is still running when shards are released.
            ownership.fence();
            tasks.shutdown().await;
        }
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

type Events = Pin<Box<dyn Stream<Item = Result<watcher::Event<Manifest>, watcher::Error>> + Send>>;

/// The label selector of the shard watch for the dispatchable shards (`None`: all shards);
/// `None` when there is nothing to watch.
fn shard_selector(base: Option<&str>, shards: Option<&BTreeSet<u32>>) -> Option<String> {
    let shard_part = match shards {
        Some(set) if set.is_empty() => return None,
        Some(set) if set.len() <= MAX_SELECTOR_SHARDS => {
            let values: Vec<String> = set.iter().map(u32::to_string).collect();
            format!("{SHARD_LABEL} in ({})", values.join(","))
        }
        _ => SHARD_LABEL.to_owned(),
    };
    Some(match base {
        Some(base) => format!("{base},{shard_part}"),
        None => shard_part,
    })
}

fn watch_with(api: &Api<Manifest>, selector: Option<String>) -> Events {
    match selector {
        Some(selector) => watcher(api.clone(), watcher::Config::default().labels(&selector))
            .default_backoff()
            .boxed(),
        None => futures::stream::pending().boxed(),
    }
}

/// Feeds the queue from both watches: a Manifest is queued when it is new to this replica, its
/// spec changed (generation) or its deletion started, and its shard is owned here. Status-only
/// writes (ours) do not requeue: drift repair runs on the reconcile's own schedule.
async fn feed_queue(
    api: Api<Manifest>,
    base: Option<String>,
    ownership: Arc<Ownership>,
    work: Work,
    (mut labelled_writer, mut unlabelled_writer): (Writer<Manifest>, Writer<Manifest>),
    synced: Arc<AtomicBool>,
) {
    let mut watched = ownership.subscribe();
    let mut owned = watched.borrow_and_update().clone();
    let mut labelled = watch_with(&api, shard_selector(base.as_deref(), owned.shards.as_ref()));
    let unlabelled_selector = match &base {
        Some(base) => format!("{base},!{SHARD_LABEL}"),
        None => format!("!{SHARD_LABEL}"),
    };
    let mut unlabelled = watch_with(&api, Some(unlabelled_selector));
    let mut labelled_synced = owned.shards.as_ref().is_some_and(BTreeSet::is_empty);
    let mut unlabelled_synced = false;
    // Keys listed by a watch's initial list wait for its end: the cache (the store a pass reads)
    // holds the new list only from `InitDone` on.
    let mut listed: [Vec<(Key, Seen)>; 2] = Default::default();
    loop {
        let (event, from_labelled) = tokio::select! {
            changed = watched.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = watched.borrow_and_update().clone();
                if now != owned {
                    owned = now;
                    // Keys of shards no longer ours leave the queue (their new owner queues
                    // them); those of newly owned shards are queued by the new watch's list,
                    // and new Manifests of theirs from the unlabelled cache right here.
                    // One snapshot for all three, so that they agree.
                    let keep = |shard: u32| owned.shards.as_ref().is_none_or(|set| set.contains(&shard));
                    work.queue.retain_shards(keep);
                    work.seen().retain(|key, _| keep(key.shard));
                    for manifest in work.unlabelled.state() {
                        if let Some(key) = work.key_of(&manifest).filter(|k| keep(k.shard)) {
                            work.queue.add(key, Duration::ZERO);
                        }
                    }
                    labelled = watch_with(&api, shard_selector(base.as_deref(), owned.shards.as_ref()));
                    listed[0].clear();
                    if owned.shards.as_ref().is_some_and(BTreeSet::is_empty) {
                        // Nothing to watch: the cache must not keep the last shards' Manifests.
                        labelled_writer.apply_watcher_event(&watcher::Event::Init);
                        labelled_writer.apply_watcher_event(&watcher::Event::InitDone);
                    }
                }
                continue;
            }
            Some(event) = labelled.next() => (event, true),
            Some(event) = unlabelled.next() => (event, false),
        };
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!("watch Manifests: {e}");
                continue;
            }
        };
        if from_labelled {
            labelled_writer.apply_watcher_event(&event);
        } else {
            unlabelled_writer.apply_watcher_event(&event);
        }
        let stream = usize::from(!from_labelled);
        match &event {
            watcher::Event::Apply(manifest) | watcher::Event::InitApply(manifest) => {
                let initial = matches!(event, watcher::Event::InitApply(_));
                let Some(key) = work.key_of(manifest) else {
                    continue;
                };
                let now = Seen::of(manifest);
                if initial {
                    // Decided at InitDone, against ownership and `seen` as they are then.
                    listed[stream].push((key, now));
                } else if ownership.wants(key.shard) && work.seen().get(&key) != Some(&now) {
                    work.seen().insert(key.clone(), now);
                    work.queue.add(key, Duration::ZERO);
                }
            }
            watcher::Event::Delete(manifest) => {
                if let Some(key) = work.key_of(manifest) {
                    work.seen().remove(&key);
                }
            }
            watcher::Event::InitDone => {
                for (key, now) in listed[stream].drain(..) {
                    let mut seen = work.seen();
                    if ownership.wants(key.shard) && seen.get(&key) != Some(&now) {
                        seen.insert(key.clone(), now);
                        work.queue.add(key, Duration::ZERO);
                    }
                }
                if from_labelled {
                    labelled_synced = true;
                } else {
                    unlabelled_synced = true;
                }
                if labelled_synced && unlabelled_synced {
                    synced.store(true, Ordering::Relaxed);
                }
            }
            watcher::Event::Init => listed[stream].clear(),
        }
    }
}

async fn run_pass(
    _in_flight: InFlight,
    key: Key,
    work: Work,
    ctx: Arc<Context>,
    ownership: Arc<Ownership>,
    failures: Arc<Mutex<HashMap<Key, u32>>>,
) {
    let forget = |key: &Key| {
        failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        // The next list or event of this Manifest queues it again.
        work.seen().remove(key);
    };
    let Some(fence) = ownership.dispatch(key.shard) else {
        if ownership.wants(key.shard) {
            // Still ours but not in time (the renew deadline passed): try again shortly.
            work.queue.add(key, Duration::from_secs(1));
        } else {
            // Not (or no longer) ours: the shard's owner queues it.
            forget(&key);
        }
        return;
    };
    // Deleted, or recreated under a new UID in another shard (queued under its own key).
    let Some(manifest) = work
        .get(&key.namespace, &key.name)
        .filter(|m| work.shard_of(m) == Some(key.shard))
    else {
        forget(&key);
        return;
    };
    let span = tracing::info_span!(
        "reconcile",
        namespace = %key.namespace,
        name = %key.name,
        uid = manifest.uid().unwrap_or_default(),
        module = %manifest.spec.module,
        shard = key.shard,
        replica = %ctx.replica,
        reconcile_id = RECONCILE_IDS.fetch_add(1, Ordering::Relaxed),
    );
    span.in_scope(|| tracing::info!("reconcile start"));
    // A panic must not leave the key in flight forever (it would never be reconciled again).
    let pass =
        std::panic::AssertUnwindSafe(reconcile(manifest, &ctx, &fence).instrument(span.clone()))
            .catch_unwind();
    let next = pass.await.ok();
    let result = match &next {
        Some(Next::After(_)) => "requeue",
        Some(Next::Retry(_)) => "retry",
        Some(Next::Idle) => "idle",
        None => "panicked",
    };
    span.in_scope(|| tracing::info!(result, "reconcile end"));
    if next.is_none() {
        span.in_scope(|| tracing::error!("reconcile panicked; retrying with backoff"));
    }
    // A shard handed over meanwhile: its new owner has the key. Forgotten here too, in case
    // the shard comes back before the watch loop notices it left.
    let next = if ownership.wants(key.shard) {
        next
    } else {
        forget(&key);
        Some(Next::Idle)
    };
    {
        let mut failures = failures.lock().unwrap_or_else(|e| e.into_inner());
        match next {
            Some(Next::After(delay)) => {
                failures.remove(&key);
                // Up to 10 % later, so that Manifests created together do not drift-check in
                // lockstep forever.
                let jitter = (RandomState::new().hash_one(&key) % 1000) as f64 / 10_000.0;
                work.queue.add(key.clone(), delay.mul_f64(1.0 + jitter));
            }
            Some(Next::Retry(_)) | None => {
                let count = failures.entry(key.clone()).or_insert(0);
                let delay = backoff(*count, RandomState::new().hash_one(&key));
                *count += 1;
                work.queue.add(key.clone(), delay);
            }
            Some(Next::Idle) => {
                failures.remove(&key);
            }
        }
    }
}

/// Marks a key done when dropped.
struct InFlight {
    queue: Arc<WorkQueue<Key>>,
    key: Key,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.queue.done(&self.key);
    }
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
    fn the_shard_watch_selects_the_owned_shards() {
        let set = |v: &[u32]| v.iter().copied().collect::<BTreeSet<u32>>();
        assert_eq!(shard_selector(None, Some(&set(&[]))), None);
        assert_eq!(
            shard_selector(None, Some(&set(&[3, 1]))).as_deref(),
            Some("modulemanager.io/shard in (1,3)")
        );
        assert_eq!(
            shard_selector(Some("team=a"), None).as_deref(),
            Some("team=a,modulemanager.io/shard")
        );
        let many: BTreeSet<u32> = (0..2000).collect();
        assert_eq!(
            shard_selector(None, Some(&many)).as_deref(),
            Some("modulemanager.io/shard"),
            "too many values: select all labelled, filter locally"
        );
    }
}
