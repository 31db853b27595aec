//! Controller: watches Manifests, feeds the work queue, runs reconciles with bounded concurrency,
//! and drains in-flight work on shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::api::Manifest;
use crate::metrics::QueueMetrics;
use crate::queue::{WorkQueue, backoff};
use crate::reconcile::{Context, Next, reconcile};

/// Numbers reconcile passes within this process (`reconcile_id` on every log line of a pass).
static RECONCILE_IDS: AtomicU64 = AtomicU64::new(1);

/// A Manifest's queue key: namespace and name.
pub type Key = (String, String);

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Most reconciles at once.
    pub concurrency: usize,
    /// How long shutdown waits for in-flight reconciles.
    pub drain_timeout: Duration,
    /// Watch only this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Queue depth and passes in flight.
    pub metrics: QueueMetrics,
    /// Set once the first list of Manifests has been seen (`/readyz`).
    pub synced: Arc<AtomicBool>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            concurrency: 4,
            drain_timeout: Duration::from_secs(10),
            namespace: None,
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

/// Runs until `shutdown` completes, then stops taking work and waits up to the drain timeout
/// for in-flight reconciles.
pub async fn run(
    ctx: Arc<Context>,
    config: ControllerConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let (store, writer) = reflector::store();
    let queue = Arc::new(WorkQueue::<Key>::new(config.metrics.clone()));
    let api = match &config.namespace {
        Some(namespace) => Api::<Manifest>::namespaced(ctx.client.clone(), namespace),
        None => Api::<Manifest>::all(ctx.client.clone()),
    };
    let events =
        reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    let watch = tokio::spawn(feed_queue(events, queue.clone(), config.synced.clone()));

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
            key = queue.next() => key,
            _ = &mut shutdown => break,
        };
        let Some(key) = key else { break };
        let work = work(
            key,
            store.clone(),
            ctx.clone(),
            queue.clone(),
            failures.clone(),
        );
        tasks.spawn(async move {
            work.await;
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }

    tracing::info!(
        in_flight = tasks.len(),
        "shutting down: draining in-flight reconciles"
    );
    queue.close();
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
    }
    Ok(())
}

/// Queues a Manifest when it is new, its spec changed (generation) or its deletion started.
/// Status-only writes (ours) do not requeue: drift repair runs on the reconcile's own schedule.
async fn feed_queue(
    events: impl futures::Stream<Item = Result<watcher::Event<Manifest>, watcher::Error>>,
    queue: Arc<WorkQueue<Key>>,
    synced: Arc<AtomicBool>,
) {
    let key_of = |m: &Manifest| (m.namespace().unwrap_or_default(), m.name_any());
    let mut seen: HashMap<Key, Seen> = HashMap::new();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(manifest) | watcher::Event::InitApply(manifest)) => {
                let key = key_of(&manifest);
                let now = Seen::of(&manifest);
                if seen.get(&key) != Some(&now) {
                    seen.insert(key.clone(), now);
                    queue.add(key, Duration::ZERO);
                }
            }
            Ok(watcher::Event::Delete(manifest)) => {
                seen.remove(&key_of(&manifest));
            }
            Ok(watcher::Event::InitDone) => synced.store(true, Ordering::Relaxed),
            Ok(watcher::Event::Init) => {}
            Err(e) => tracing::warn!("watch Manifests: {e}"),
        }
    }
}

async fn work(
    key: Key,
    store: Store<Manifest>,
    ctx: Arc<Context>,
    queue: Arc<WorkQueue<Key>>,
    failures: Arc<Mutex<HashMap<Key, u32>>>,
) {
    let reference = ObjectRef::new(&key.1).within(&key.0);
    if let Some(manifest) = store.get(&reference) {
        let span = tracing::info_span!(
            "reconcile",
            namespace = %key.0,
            name = %key.1,
            uid = manifest.uid().unwrap_or_default(),
            module = %manifest.spec.module,
            shard = manifest.uid().map(|uid| ctx.shards.shard_of(&uid)).unwrap_or_default(),
            replica = %ctx.replica,
            reconcile_id = RECONCILE_IDS.fetch_add(1, Ordering::Relaxed),
        );
        // A panic must not leave the key in flight forever (it would never be reconciled again).
        let pass =
            std::panic::AssertUnwindSafe(reconcile(manifest, &ctx).instrument(span)).catch_unwind();
        let next = pass.await.ok();
        if next.is_none() {
            tracing::error!(namespace = %key.0, name = %key.1, "reconcile panicked; retrying with backoff");
        }
        let mut failures = failures.lock().unwrap_or_else(|e| e.into_inner());
        match next {
            Some(Next::After(delay)) => {
                failures.remove(&key);
                queue.add(key.clone(), delay);
            }
            Some(Next::Retry(_)) | None => {
                let count = failures.entry(key.clone()).or_insert(0);
                let delay = backoff(*count, RandomState::new().hash_one(&key));
                *count += 1;
                queue.add(key.clone(), delay);
            }
            Some(Next::Idle) => {
                failures.remove(&key);
            }
        }
    } else {
        failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key); // deleted
    }
    queue.done(&key);
}
