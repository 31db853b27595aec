//! Metrics: one root registry (prefix `module_manager`) with a sub-registry per component; each
//! component's metrics are a struct with `register`. Labels are bounded: never object names or
//! error text. Documented in `docs/metrics.md`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The outcome of a reconcile pass, as a metric label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ready`, `processing`, `warning`, `deleting`, `error`, `idle`.
    pub result: &'static str,
    /// The error category (`RenderError` …), or empty.
    pub category: &'static str,
}

/// Metrics of the reconcile pipeline.
#[derive(Clone, Debug)]
pub struct ReconcileMetrics {
    /// Passes by result.
    pub reconciles: Family<ResultLabels, Counter>,
    /// Duration of a pass.
    pub duration: Histogram,
    /// Objects server-side applied.
    pub applied: Counter,
    /// Objects deleted by pruning or deletion.
    pub deleted: Counter,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            applied: Counter::default(),
            deleted: Counter::default(),
        }
    }
}

impl ReconcileMetrics {
    /// Registers under `reconcile_…` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let sub = registry.sub_registry_with_prefix("reconcile");
        sub.register(
            "passes",
            "Reconcile passes by result and error category",
            metrics.reconciles.clone(),
        );
        sub.register(
            "duration_seconds",
            "Duration of a reconcile pass",
            metrics.duration.clone(),
        );
        sub.register(
            "objects_applied",
            "Objects server-side applied",
            metrics.applied.clone(),
        );
        sub.register(
            "objects_deleted",
            "Objects deleted by pruning or Manifest deletion",
            metrics.deleted.clone(),
        );
        metrics
    }
}

/// Metrics of the helm renderer and its cache.
#[derive(Clone, Debug)]
pub struct RenderMetrics {
    /// Renders served from the cache.
    pub cache_hits: Counter,
    /// Renders that ran helm.
    pub cache_misses: Counter,
    /// Duration of a helm run.
    pub helm_duration: Histogram,
    /// helm runs that failed (chart or machine).
    pub helm_failures: Counter,
}

impl Default for RenderMetrics {
    fn default() -> Self {
        Self {
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            helm_duration: Histogram::new(exponential_buckets(0.01, 2.0, 12)),
            helm_failures: Counter::default(),
        }
    }
}

impl RenderMetrics {
    /// Registers under `render_…` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let sub = registry.sub_registry_with_prefix("render");
        sub.register(
            "cache_hits",
            "Renders served from the render cache",
            metrics.cache_hits.clone(),
        );
        sub.register(
            "cache_misses",
            "Renders that ran helm",
            metrics.cache_misses.clone(),
        );
        sub.register(
            "helm_duration_seconds",
            "Duration of a helm template run",
            metrics.helm_duration.clone(),
        );
        sub.register(
            "helm_failures",
            "helm template runs that failed",
            metrics.helm_failures.clone(),
        );
        metrics
    }
}

/// Metrics of the work queue.
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    /// Keys queued (due or not), not counting those being worked on.
    pub depth: Gauge,
    /// Passes running now.
    pub in_flight: Gauge,
    /// How long a key waited between being due and being handed to a worker.
    pub wait: Histogram,
}

impl Default for QueueMetrics {
    fn default() -> Self {
        Self {
            depth: Gauge::default(),
            in_flight: Gauge::default(),
            wait: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        }
    }
}

impl QueueMetrics {
    /// Registers under `queue_…` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let sub = registry.sub_registry_with_prefix("queue");
        sub.register(
            "depth",
            "Manifests queued, not counting those being reconciled",
            metrics.depth.clone(),
        );
        sub.register(
            "in_flight",
            "Reconcile passes running now",
            metrics.in_flight.clone(),
        );
        sub.register(
            "wait_seconds",
            "Time a due Manifest waited for a worker",
            metrics.wait.clone(),
        );
        metrics
    }
}

/// Metrics of the fleet protocol (shards, Leases).
#[derive(Clone, Debug, Default)]
pub struct FleetMetrics {
    /// Shards this replica holds (draining ones included).
    pub owned: Gauge,
    /// Shards this replica is handing over.
    pub draining: Gauge,
    /// Shards held by no one or by a dead member, as this replica sees the fleet.
    pub unowned: Gauge,
    /// Live members, as this replica sees them.
    pub members_live: Gauge,
    /// 1 while this replica has stopped acting (its renew deadline passed).
    pub fenced: Gauge,
    /// Shards acquired.
    pub acquired: Counter,
    /// Shards released.
    pub released: Counter,
    /// Shard Lease writes that lost a compare-and-swap race.
    pub conflicts: Counter,
    /// Membership Lease renewals that failed.
    pub renewal_failures: Counter,
}

impl FleetMetrics {
    /// Registers under `fleet_…` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let sub = registry.sub_registry_with_prefix("fleet");
        sub.register(
            "shards_owned",
            "Shards this replica holds, draining ones included",
            metrics.owned.clone(),
        );
        sub.register(
            "shards_draining",
            "Shards this replica is handing over",
            metrics.draining.clone(),
        );
        sub.register(
            "shards_unowned",
            "Shards held by no one or by a dead member, as this replica sees the fleet",
            metrics.unowned.clone(),
        );
        sub.register(
            "members_live",
            "Live fleet members, as this replica sees them",
            metrics.members_live.clone(),
        );
        sub.register(
            "fenced",
            "1 while this replica has stopped acting because its renew deadline passed",
            metrics.fenced.clone(),
        );
        sub.register(
            "shard_acquisitions",
            "Shards acquired by this replica",
            metrics.acquired.clone(),
        );
        sub.register(
            "shard_releases",
            "Shards released by this replica",
            metrics.released.clone(),
        );
        sub.register(
            "shard_lease_conflicts",
            "Shard Lease writes that lost a compare-and-swap race",
            metrics.conflicts.clone(),
        );
        sub.register(
            "lease_renewal_failures",
            "Membership Lease renewals that failed",
            metrics.renewal_failures.clone(),
        );
        metrics
    }
}

/// The root registry, `module_manager_…`.
pub fn registry() -> Registry {
    Registry::with_prefix("module_manager")
}
