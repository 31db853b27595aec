//! Dispatch: hands queued keys to workers (bounded concurrency), runs each pass between the
//! ownership checks around it, requeues by its outcome, and drains in-flight passes on shutdown.
//!
//! Ownership is checked when a key is dispatched, after its pass, and by the pass's fence
//! before every write.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use kube::ResourceExt;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tracing::Instrument;

use crate::api::Manifest;
use crate::apply::target::secret_key;
use crate::reconcile::{Context, Next, reconcile, relabel};
use crate::shard::fence::{Fence, Ownership};
use crate::shard::label::Route;
use crate::work::caches::{Key, Work};
use crate::work::queue::{Class, WorkQueue, backoff};
use crate::work::target_gate::TargetGate;

/// Numbers reconcile passes within this process (`reconcile_id` on every log line of a pass).
static RECONCILE_IDS: AtomicU64 = AtomicU64::new(1);

/// What every pass shares: the caches and queue, the context, ownership, the consecutive
/// failures of each key (its backoff) and the remote targets' passes at once.
#[derive(Clone)]
pub(super) struct Passes {
    work: Work,
    ctx: Arc<Context>,
    ownership: Arc<Ownership>,
    failures: Arc<Mutex<HashMap<Key, u32>>>,
    targets: Arc<TargetGate>,
}

impl Passes {
    pub(super) fn new(
        work: Work,
        ctx: Arc<Context>,
        ownership: Arc<Ownership>,
        targets: Arc<TargetGate>,
    ) -> Self {
        Self {
            work,
            ctx,
            ownership,
            failures: Arc::default(),
            targets,
        }
    }

    /// Runs passes of queued keys, at most `concurrency` at once, until `shutdown` completes or
    /// the queue closes; returns the passes still in flight.
    pub(super) async fn dispatch(
        &self,
        concurrency: usize,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<JoinSet<()>> {
        let semaphore = Arc::new(Semaphore::new(concurrency.max(1)));
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                permit = semaphore.clone().acquire_owned() => permit?,
                _ = &mut shutdown => break,
            };
            let key = tokio::select! {
                key = self.work.queue.next() => key,
                _ = &mut shutdown => break,
            };
            let Some(key) = key else { break };
            // From here on, however the pass ends (also a task aborted before its first poll),
            // the key stops counting as in flight: a shard must not look busy forever.
            let in_flight = InFlight {
                queue: self.work.queue.clone(),
                key: key.clone(),
            };
            let pass = self.clone().run_pass(in_flight, key);
            tasks.spawn(async move {
                pass.await;
                drop(permit);
            });
            while tasks.try_join_next().is_some() {}
        }
        Ok(tasks)
    }

    /// Stops taking work and the watches, then waits up to `timeout` for in-flight passes.
    pub(super) async fn drain(
        &self,
        mut tasks: JoinSet<()>,
        watch: JoinHandle<()>,
        timeout: Duration,
    ) {
        tracing::info!(
            in_flight = tasks.len(),
            "shutting down: draining in-flight reconciles"
        );
        self.work.queue.close();
        watch.abort();
        let drained = tokio::time::timeout(timeout, async {
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
            self.ownership.fence();
            tasks.shutdown().await;
        }
    }

    async fn run_pass(self, _in_flight: InFlight, key: Key) {
        let Some((fence, manifest, route)) = self.claim(&key) else {
            return;
        };
        let next = match route {
            Route::Reconcile(_) => {
                // A remote target with its passes at the limit: back to the queue, no worker held.
                let entered = match secret_key(&manifest) {
                    Some(target) => match self.targets.enter(target, &key) {
                        Some(entered) => Some(entered),
                        None => return,
                    },
                    None => None,
                };
                let next = self.reconcile_logged(manifest, &fence, &key).await;
                drop(entered);
                next
            }
            Route::Relabel(_) => self.relabel_logged(manifest, &fence, &key).await,
        };
        // A shard handed over meanwhile: its new owner has the key. Forgotten here too, in case
        // the shard comes back before the watch loop notices it left.
        let next = if self.ownership.wants(key.shard) {
            next
        } else {
            self.forget(&key);
            Some(Next::Idle)
        };
        self.schedule(key, next);
    }

    /// The fence, the cached Manifest and what to do with it (reconcile, relabel) of a
    /// dispatched key, if a pass may run on it now; otherwise the key is requeued shortly (ours,
    /// not in time) or forgotten.
    fn claim(&self, key: &Key) -> Option<(Fence, Arc<Manifest>, Route)> {
        let Some(fence) = self.ownership.dispatch(key.shard) else {
            if self.ownership.wants(key.shard) {
                // Still ours but not in time (the renew deadline passed): try again shortly.
                self.work.queue.add(key.clone(), Duration::from_secs(1));
            } else {
                // Not (or no longer) ours: the shard's owner queues it.
                self.forget(key);
            }
            return None;
        };
        // Deleted, recreated under a new UID in another shard (queued under its own key), or
        // its label corrected meanwhile (a relabel key).
        let Some((manifest, route)) = self
            .work
            .get(&key.namespace, &key.name)
            .and_then(|m| Some((m.clone(), self.work.route_of(key, &m)?)))
        else {
            self.forget(key);
            return None;
        };
        Some((fence, manifest, route))
    }

    /// A relabel in its span (not a reconcile pass: the UID's owner may be reconciling the
    /// Manifest meanwhile, and its passes are what the overlap checker counts). Done or not
    /// needed: the key is forgotten (the label no longer names this shard); a failure (a
    /// conflict: someone else wrote) retries with backoff, re-reading the Manifest.
    async fn relabel_logged(
        &self,
        manifest: Arc<Manifest>,
        fence: &Fence,
        key: &Key,
    ) -> Option<Next> {
        let span = tracing::info_span!(
            "relabel",
            namespace = %key.namespace,
            name = %key.name,
            uid = manifest.uid().unwrap_or_default(),
            shard = key.shard,
            replica = %self.ctx.replica,
        );
        let next = relabel(&manifest, &self.ctx, fence).instrument(span).await;
        if matches!(next, Next::Idle) {
            self.forget(key);
        }
        Some(next)
    }

    /// One reconcile in its span, between `reconcile start` and `reconcile end`; `None` when it
    /// panicked.
    async fn reconcile_logged(
        &self,
        manifest: Arc<Manifest>,
        fence: &Fence,
        key: &Key,
    ) -> Option<Next> {
        let span = tracing::info_span!(
            "reconcile",
            namespace = %key.namespace,
            name = %key.name,
            uid = manifest.uid().unwrap_or_default(),
            module = %manifest.spec.module,
            shard = key.shard,
            replica = %self.ctx.replica,
            reconcile_id = RECONCILE_IDS.fetch_add(1, Ordering::Relaxed),
        );
        span.in_scope(|| tracing::info!("reconcile start"));
        // A panic must not leave the key in flight forever (it would never be reconciled again).
        let pass = std::panic::AssertUnwindSafe(
            reconcile(manifest, &self.ctx, fence).instrument(span.clone()),
        )
        .catch_unwind();
        let next = pass.await.ok();
        let result = match &next {
            Some(Next::After(_) | Next::Continue(_)) => "requeue",
            Some(Next::Retry(_)) => "retry",
            Some(Next::Idle) => "idle",
            None => "panicked",
        };
        span.in_scope(|| tracing::info!(result, "reconcile end"));
        if next.is_none() {
            span.in_scope(|| tracing::error!("reconcile panicked; retrying with backoff"));
        }
        next
    }

    /// Requeues a key by its pass's outcome (`None`: it panicked, retried like a failure).
    fn schedule(&self, key: Key, next: Option<Next>) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        match next {
            Some(next @ (Next::After(delay) | Next::Continue(delay))) => {
                failures.remove(&key);
                // Up to 10 % earlier, so that Manifests created together do not drift-check (or
                // look at their rollouts) in lockstep forever, and `spec.interval` stays the
                // longest time between checks.
                let jitter = (RandomState::new().hash_one(&key) % 1000) as f64 / 10_000.0;
                let class = match next {
                    Next::Continue(_) => Class::Continuing,
                    _ => Class::Fresh,
                };
                self.work
                    .queue
                    .add_as(key, delay.mul_f64(1.0 - jitter), class);
            }
            Some(Next::Retry(_)) | None => {
                let count = failures.entry(key.clone()).or_insert(0);
                let delay = backoff(*count, RandomState::new().hash_one(&key));
                *count += 1;
                self.work.queue.add(key, delay);
            }
            Some(Next::Idle) => {
                failures.remove(&key);
            }
        }
    }

    /// Forgets a key: its failures, and what the watch loop saw of it (the next list or event of
    /// this Manifest queues it again).
    fn forget(&self, key: &Key) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        self.work.seen().remove(key);
        self.targets.forget(key);
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
