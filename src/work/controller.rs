//! Controller: its configuration and the [`Controller`] that starts the watches (`watches.rs`)
//! over the caches and queue it creates (`caches.rs`) and the dispatch of passes (`dispatch.rs`).
//!
//! Two watches: `modulemanager.io/shard in (<owned>)` (restarted whenever the owned set
//! changes, so the cache and the event stream scale with this replica's share) and
//! the stray watch `modulemanager.io/shard notin (0,…,S-1)` (new Manifests, whose owner stamps
//! the label in its first pass, and labels naming no shard). A Manifest whose label names
//! another valid shard is queued by that shard's owner, under that shard, to be relabelled.
//! With the API server's filter (`--server-side-sharding`), the shard watch asks for the owned
//! shards' UID hash ranges instead and there is no stray watch nor relabelling.
//! Ownership is checked on every event, when a key is dispatched, and by the pass's fence before
//! every write. A third watch, of the ConfigMaps and Secrets labelled `modulemanager.io/watch=true`
//! (`sources.rs`), queues the Manifests that read one that changed; a fourth, of the Manifests
//! labelled `modulemanager.io/depended-on=true` (`dependencies.rs`), those that depend on one
//! whose readiness changed. A fifth, metadata only, of the Secrets' versions
//! (`secret_versions.rs`, from this replica's first remote target on) lets remote passes skip
//! reading an unchanged kubeconfig Secret.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::reflector::{self, store::Writer};

use crate::api::Manifest;
use crate::reconcile::Context;
use crate::shard::fence::Ownership;
use crate::telemetry::metrics::QueueMetrics;
use crate::work::caches::Work;
use crate::work::dependencies::feed_dependents;
use crate::work::dispatch::Passes;
use crate::work::queue::WorkQueue;
use crate::work::secret_versions::feed_secret_versions;
use crate::work::sources::feed_sources;
use crate::work::target_gate::TargetGate;
use crate::work::watches::{Scope, feed_queue};

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Most reconciles at once.
    pub concurrency: usize,
    /// Most reconciles at once of the Manifests of one remote target (`--target-passes`).
    pub target_passes: usize,
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
            target_passes: 1,
            drain_timeout: Duration::from_secs(10),
            namespace: None,
            selector: None,
            metrics: QueueMetrics::default(),
            synced: Arc::default(),
        }
    }
}

/// A controller, before it runs.
pub struct Controller {
    ctx: Arc<Context>,
    config: ControllerConfig,
    ownership: Arc<Ownership>,
    work: Work,
    targets: Arc<TargetGate>,
    writers: (Writer<Manifest>, Writer<Manifest>),
}

impl Controller {
    /// A controller that works on the shards `ownership` allows.
    pub fn new(ctx: Arc<Context>, config: ControllerConfig, ownership: Arc<Ownership>) -> Self {
        let (labelled, labelled_writer) = reflector::store();
        let (unlabelled, unlabelled_writer) = reflector::store();
        let queue = Arc::new(WorkQueue::new(config.metrics.clone()));
        let targets = TargetGate::new(
            config.target_passes,
            queue.clone(),
            ctx.targets.metrics().clone(),
        );
        // The queue's counts for the passes too: one waits for its workloads only while no
        // other key is due nor waits for a remote target's pass to end (`reconcile::install`,
        // the rollout wait inside the pass).
        let counts = config.metrics.counts.clone();
        let gate = targets.clone();
        ctx.queue.install(move || {
            let (due, scheduled) = counts.get();
            (due + gate.waiting() as u64, scheduled)
        });
        // Each remote target's request budget is split between the replicas by their shards.
        let owner = ownership.clone();
        let shards = ctx.shards;
        ctx.targets
            .share()
            .install(move || owner.share(shards.get()));
        let work = Work {
            queue,
            seen: Arc::default(),
            labelled,
            unlabelled,
            shards: ctx.shards,
            filter: ctx.shard_filter,
            budgets: ctx.targets.budgets(),
        };
        Self {
            ctx,
            config,
            ownership,
            work,
            targets,
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
            targets,
            writers,
        } = self;
        let api = match &config.namespace {
            Some(namespace) => Api::<Manifest>::namespaced(ctx.client.clone(), namespace),
            None => Api::<Manifest>::all(ctx.client.clone()),
        };
        let dependents = feed_dependents(api, ownership.clone(), work.clone());
        let scope = Scope {
            client: ctx.client.clone(),
            namespace: config.namespace.clone(),
        };
        let manifests = feed_queue(
            scope,
            config.metrics.watch_events.clone(),
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
            ctx.targets.watched_secrets(),
        );
        let secret_versions = feed_secret_versions(
            ctx.client.clone(),
            config.namespace.clone(),
            ctx.targets.watched_secrets(),
        );
        // One task: shutdown stops the watches together.
        let watch = tokio::spawn(async move {
            tokio::join!(manifests, sources, dependents, secret_versions);
        });

        let passes = Passes::new(work, ctx, ownership, targets);
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
