//! Metrics: one root registry with the standard `process_…` metrics and, under the prefix
//! `module_manager`, a sub-registry per component; each component's metrics are a struct with
//! `register`. Labels are bounded: never object names or error text. Documented in
//! `docs/metrics.md`.

mod process;

pub use process::{HelmCpuCollector, ProcessCollector};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::atomic::AtomicU64;

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

/// The `mode` label of `module_manager_reconcile_objects_drifted_total`: `enabled` or `warn`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    /// `enabled` (repaired) or `warn` (reported only).
    pub mode: &'static str,
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
    /// Objects a drift pass did not apply: unchanged since the last apply, as their watch (or a
    /// remote target's listing) tells, or changed in their status only (read instead).
    pub unchanged: Counter,
    /// Objects deleted by pruning or deletion.
    pub deleted: Counter,
    /// Objects a drift pass found drifted, by `spec.drift.mode`.
    pub drifted: Family<DriftLabels, Counter>,
    /// Module deletions that had to wait for their turn under the fleet's cap
    /// (`--max-module-deletions-per-minute`).
    pub deletions_delayed: Counter,
    /// Module deletions waiting for their turn under that cap now.
    pub deletions_waiting: Gauge,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            applied: Counter::default(),
            unchanged: Counter::default(),
            deleted: Counter::default(),
            drifted: Family::default(),
            deletions_delayed: Counter::default(),
            deletions_waiting: Gauge::default(),
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
            "objects_unchanged",
            "Objects a drift pass did not apply: unchanged since the last apply as their watch or listing tells, or changed in their status only (read instead)",
            metrics.unchanged.clone(),
        );
        sub.register(
            "objects_deleted",
            "Objects deleted by pruning or Manifest deletion",
            metrics.deleted.clone(),
        );
        sub.register(
            "objects_drifted",
            "Objects a drift pass found different from the chart, by spec.drift.mode: enabled (repaired) or warn (reported only)",
            metrics.drifted.clone(),
        );
        sub.register(
            "deletions_delayed",
            "Module deletions that waited for their turn under the fleet's cap (--max-module-deletions-per-minute)",
            metrics.deletions_delayed.clone(),
        );
        sub.register(
            "deletions_waiting",
            "Module deletions waiting for their turn under the fleet's cap now",
            metrics.deletions_waiting.clone(),
        );
        metrics
    }

    /// Counts one pass with its result and error category (empty when none).
    pub fn count_pass(&self, result: &'static str, category: &'static str) {
        let labels = ResultLabels { result, category };
        self.reconciles.get_or_create(&labels).inc();
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
    /// Renderer children started (renderer backend): the first at startup, then every start
    /// after a child died (memory limit, crash) or was stopped (a render past its timeout).
    pub child_starts: Counter,
    /// Renders sent to the renderer child again because the child stopped under them.
    pub child_resends: Counter,
}

impl Default for RenderMetrics {
    fn default() -> Self {
        Self {
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            helm_duration: Histogram::new(exponential_buckets(0.01, 2.0, 12)),
            helm_failures: Counter::default(),
            child_starts: Counter::default(),
            child_resends: Counter::default(),
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
        sub.register(
            "child_starts",
            "Renderer children started: the first, then each start after a child died or was stopped",
            metrics.child_starts.clone(),
        );
        sub.register(
            "child_resends",
            "Renders sent to the renderer child again because the child stopped under them",
            metrics.child_resends.clone(),
        );
        metrics
    }
}

/// Metrics of the work queue.
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    /// Keys due and waiting for a worker, and keys scheduled for later: read from the queue at
    /// scrape time (a key becomes due as time passes, with no event to update a gauge on).
    pub counts: QueueCounts,
    /// Passes running now.
    pub in_flight: Gauge,
    /// How long a key waited between being due and being handed to a worker.
    pub wait: Histogram,
    /// Manifests received from this replica's Manifest watches (what feeds the queue), by watch.
    pub watch_events: Family<WatchLabels, Counter>,
}

impl Default for QueueMetrics {
    fn default() -> Self {
        Self {
            counts: QueueCounts::default(),
            in_flight: Gauge::default(),
            wait: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            watch_events: Family::default(),
        }
    }
}

/// A gauge read when it is scraped (or asked, [`CountedNow::get`]) from a source its owner
/// installs; 0 until one is. For counts that change with time itself, not only with events.
#[derive(Clone)]
pub struct CountedNow {
    name: &'static str,
    help: &'static str,
    source: std::sync::Arc<std::sync::RwLock<Option<std::sync::Arc<CountNow>>>>,
}

/// What a [`CountedNow`] reads.
type CountNow = dyn Fn() -> u64 + Send + Sync;

impl std::fmt::Debug for CountedNow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CountedNow").field(&self.name).finish()
    }
}

impl CountedNow {
    /// A gauge `name` (under its registry's prefix) described by `help`.
    pub fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            source: std::sync::Arc::default(),
        }
    }

    /// Reads the count from `source` from now on.
    pub fn install(&self, source: impl Fn() -> u64 + Send + Sync + 'static) {
        *self.source.write().unwrap_or_else(|e| e.into_inner()) = Some(std::sync::Arc::new(source));
    }

    /// The count now.
    pub fn get(&self) -> u64 {
        let source = self
            .source
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        source.map_or(0, |count| count())
    }
}

impl prometheus_client::collector::Collector for CountedNow {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        let gauge = ConstGauge::new(self.get() as i64);
        gauge.encode(encoder.encode_descriptor(self.name, self.help, None, gauge.metric_type())?)
    }
}

/// What the queue counts at one instant: `(due, scheduled)`.
type CountQueue = dyn Fn() -> (u64, u64) + Send + Sync;

/// The source of `queue_due` and `queue_scheduled`: the queue installs a reader of its state
/// (`WorkQueue::new`); without one both are 0.
#[derive(Clone, Default)]
pub struct QueueCounts(std::sync::Arc<std::sync::RwLock<Option<std::sync::Arc<CountQueue>>>>);

impl std::fmt::Debug for QueueCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("QueueCounts").field(&self.get()).finish()
    }
}

impl QueueCounts {
    /// Reads the counts from `source` from now on.
    pub fn install(&self, source: impl Fn() -> (u64, u64) + Send + Sync + 'static) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(std::sync::Arc::new(source));
    }

    /// `(due, scheduled)` now.
    pub fn get(&self) -> (u64, u64) {
        let source = self.0.read().unwrap_or_else(|e| e.into_inner()).clone();
        source.map_or((0, 0), |count| count())
    }
}

impl prometheus_client::collector::Collector for QueueCounts {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        let (due, scheduled) = self.get();
        for (name, help, value) in [
            (
                "due",
                "Manifests due and waiting for a worker (the backlog), not counting those being reconciled",
                due,
            ),
            (
                "scheduled",
                "Manifests queued for a later time (drift re-checks, retries after a backoff)",
                scheduled,
            ),
        ] {
            let gauge = ConstGauge::new(value as i64);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

impl QueueMetrics {
    /// Registers under `queue_…` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "manifest_watch_events",
            "Manifests received from this replica's Manifest watches (initial lists and deletions included), by watch: shard or stray",
            metrics.watch_events.clone(),
        );
        for watch in ["shard", "stray"] {
            let _ = metrics.watch_events.get_or_create(&WatchLabels { watch });
        }
        let sub = registry.sub_registry_with_prefix("queue");
        sub.register_collector(Box::new(metrics.counts.clone()));
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
#[derive(Clone, Debug)]
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
    /// Membership Lease renewals that succeeded.
    pub renewals: Counter,
    /// Membership Lease renewals that failed.
    pub renewal_failures: Counter,
    /// Shards acquired from a holder known to be dead.
    pub takeovers: Counter,
    /// Time from a shard's release by its previous holder to its acquisition here.
    pub handover_gap: Histogram,
    /// Shards this replica held that another replica took over.
    pub losses: Counter,
    /// Losses found while this replica was still within its renew deadline: another replica
    /// took a shard this one could still act on. Should stay 0 (`docs/metrics.md`).
    pub ownership_violations: Counter,
    /// Times this replica found its fence's deadline passed (all work stopped meanwhile):
    /// `module_manager_fence_lapses_total`, 0 on a healthy fleet.
    pub fence_lapses: Counter,
    /// Times another process took this replica's membership Lease over under its name (it
    /// stopped all work for good): `module_manager_fleet_superseded_total`, 0 normally.
    pub superseded: Counter,
}

impl Default for FleetMetrics {
    fn default() -> Self {
        Self {
            owned: Gauge::default(),
            draining: Gauge::default(),
            unowned: Gauge::default(),
            members_live: Gauge::default(),
            fenced: Gauge::default(),
            acquired: Counter::default(),
            released: Counter::default(),
            conflicts: Counter::default(),
            renewals: Counter::default(),
            renewal_failures: Counter::default(),
            takeovers: Counter::default(),
            handover_gap: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            losses: Counter::default(),
            ownership_violations: Counter::default(),
            fence_lapses: Counter::default(),
            superseded: Counter::default(),
        }
    }
}

impl FleetMetrics {
    /// Registers under `fleet_…` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "fence_lapses",
            "Times this replica's renew deadline passed while it held its fence (all work stopped until the next renewal and round)",
            metrics.fence_lapses.clone(),
        );
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
            "lease_renewals",
            "Membership Lease renewals that succeeded",
            metrics.renewals.clone(),
        );
        sub.register(
            "lease_renewal_failures",
            "Membership Lease renewals that failed",
            metrics.renewal_failures.clone(),
        );
        sub.register(
            "shard_takeovers",
            "Shards acquired by this replica from a holder known to be dead",
            metrics.takeovers.clone(),
        );
        sub.register(
            "handover_gap_seconds",
            "Time from a shard's release by its previous holder to its acquisition by this replica",
            metrics.handover_gap.clone(),
        );
        sub.register(
            "shard_losses",
            "Shards this replica held that another replica took over",
            metrics.losses.clone(),
        );
        sub.register(
            "ownership_violations",
            "Shards taken over by another replica while this one could still act on them (should stay 0)",
            metrics.ownership_violations.clone(),
        );
        metrics.register_identity(sub);
        metrics
    }

    /// The counter of issue 15 item 8 (kept apart: `register` is at its length limit).
    fn register_identity(&self, sub: &mut Registry) {
        sub.register(
            "superseded",
            "Times another process with this replica's name took its membership Lease over (this process stopped all work for good)",
            self.superseded.clone(),
        );
    }
}

/// A remote target error's kind, as a metric label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetErrorLabels {
    /// `secret`, `refused`, `unreachable`, `auth` or `tls` (never the server or the Secret).
    pub reason: &'static str,
}

/// Every `reason` label value of `module_manager_target_errors_total` (what
/// `TargetError::reason` returns), so the series exist (at 0) from the start.
pub const TARGET_ERROR_REASONS: [&str; 5] = ["secret", "refused", "unreachable", "auth", "tls"];

/// A drift listing's outcome, as a metric label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListingLabels {
    /// `found`, `refused` (403), `failed` (another answer) or `unanswered`.
    pub outcome: &'static str,
}

/// Every `outcome` label value of `module_manager_target_drift_listings_total`.
pub const LISTING_OUTCOMES: [&str; 4] = ["found", "refused", "failed", "unanswered"];

/// Metrics of remote targets (`spec.target`).
#[derive(Clone, Debug)]
pub struct TargetMetrics {
    /// Remote target errors by reason.
    pub errors: Family<TargetErrorLabels, Counter>,
    /// Remote target clients cached now.
    pub clients: Gauge,
    /// Cached remote target clients whose credential is due (expired or about to), counted
    /// when scraped.
    pub expiring: CountedNow,
    /// Where the remote clients' API requests are counted (the replica's
    /// `module_manager_api_requests_total`, target `remote`).
    pub requests: crate::telemetry::requests::ApiRequestMetrics,
    /// Requests to remote targets that waited for their target's request budget.
    pub budget_waits: Counter,
    /// Passes that found their target's passes at the limit and went back to the queue
    /// (`--target-passes`).
    pub parked: Counter,
    /// The most passes one target held at once on this replica since it started: at most
    /// `--target-passes` (a slow or unreachable target holds no more workers than that).
    pub passes_held_max: Gauge,
    /// Keys waiting now for a pass of their target to end (counted when scraped).
    pub waiting: CountedNow,
    /// Drift passes' listings of a kind's objects on a target, by outcome: all but `found` make
    /// the pass apply that kind's objects.
    pub drift_listings: Family<ListingLabels, Counter>,
}

impl Default for TargetMetrics {
    fn default() -> Self {
        Self {
            errors: Family::default(),
            clients: Gauge::default(),
            expiring: CountedNow::new(
                "credentials_expiring",
                "Cached remote target clients whose credential (a token's iat/exp, a client certificate's notBefore/notAfter) is expired or in its last hour and last fifth of its lifetime",
            ),
            requests: crate::telemetry::requests::ApiRequestMetrics::default(),
            budget_waits: Counter::default(),
            parked: Counter::default(),
            passes_held_max: Gauge::default(),
            waiting: CountedNow::new(
                "passes_waiting",
                "Manifests waiting now, without a worker, for a pass of their remote target to end (--target-passes)",
            ),
            drift_listings: Family::default(),
        }
    }
}

impl TargetMetrics {
    /// Registers under `target_…` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let sub = registry.sub_registry_with_prefix("target");
        sub.register(
            "errors",
            "Remote target errors by reason: secret (Secret or key missing), refused (kubeconfig refused), unreachable, auth (401), tls",
            metrics.errors.clone(),
        );
        sub.register(
            "clients",
            "Remote target clients cached (one per kubeconfig Secret key in use)",
            metrics.clients.clone(),
        );
        sub.register_collector(Box::new(metrics.expiring.clone()));
        sub.register(
            "budget_waits",
            "Requests to remote targets that waited for their target's request budget (--target-qps, --target-burst, this replica's share)",
            metrics.budget_waits.clone(),
        );
        sub.register(
            "passes_parked",
            "Passes that found their remote target at --target-passes passes already and went back to the queue without holding a worker",
            metrics.parked.clone(),
        );
        sub.register(
            "passes_held_max",
            "The most passes (workers) one remote target held at once on this replica since it started (at most --target-passes)",
            metrics.passes_held_max.clone(),
        );
        sub.register_collector(Box::new(metrics.waiting.clone()));
        sub.register(
            "drift_listings",
            "Drift passes' metadata LISTs of one kind of a Manifest's objects on its remote target, by outcome: found, refused (403), failed (another error answer: the pass applies that kind's objects), unanswered",
            metrics.drift_listings.clone(),
        );
        for outcome in LISTING_OUTCOMES {
            let _ = metrics
                .drift_listings
                .get_or_create(&ListingLabels { outcome });
        }
        // Every reason from the start (at 0), so that rates and alerts see the series before the
        // first error.
        for reason in TARGET_ERROR_REASONS {
            let _ = metrics.errors.get_or_create(&TargetErrorLabels { reason });
        }
        metrics
    }
}

/// A Manifest state, as a metric label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// `Ready`, `Processing`, `Warning`, `Error`, `Deleting`, or `Unknown` (no status yet).
    pub state: &'static str,
}

/// The Manifests in the shards this replica owns (refreshed every few seconds from the cache).
#[derive(Clone, Debug, Default)]
pub struct ManifestMetrics {
    /// Manifests by status state.
    pub by_state: Family<StateLabels, Gauge>,
    /// Age of the oldest deletion request among them, 0 when none is being deleted.
    pub oldest_deletion: Gauge<f64, AtomicU64>,
    /// Manifests that failed, by how (stalled or retrying) and the Ready condition's reason.
    pub failing: Family<FailingLabels, Gauge>,
}

/// Which Manifest watch an event came from.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    /// `shard` (the owned shards' labels) or `stray` (Manifests without a valid shard label).
    pub watch: &'static str,
}

/// How a Manifest fails, as metric labels: `Stalled=True` or `Reconciling=True` with reason
/// `ProgressingWithRetry`, and the Ready condition's reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailingLabels {
    /// `stalled` (waits for a change) or `retrying` (backs off and tries again).
    pub status: &'static str,
    /// One of [`FAILING_REASONS`].
    pub reason: &'static str,
}

/// Every `reason` label value of `module_manager_manifests_failing` (the Ready reasons a
/// failing pass writes; `Other` for any other), so the series exist (at 0) from the start.
pub const FAILING_REASONS: &[&str] = &[
    "ReadinessTimeout",
    "ObjectFailed",
    "ChartError",
    "ChartUnverified",
    "ValuesError",
    "RenderError",
    "PlanError",
    "TenancyError",
    "ApplyError",
    "JobFailed",
    "HookFailed",
    "KubeError",
    "TargetError",
    "TargetUnreachable",
    "TargetAuthError",
    "PassDeadline",
    "DependencyCycle",
    "DependencyRefused",
    "Other",
];

impl ManifestMetrics {
    /// Registers `manifests`, `manifests_oldest_deletion_seconds` and `manifests_failing` in
    /// `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "manifests",
            "Manifests in the shards this replica owns, by status state",
            metrics.by_state.clone(),
        );
        registry.register(
            "manifests_oldest_deletion_seconds",
            "Age of the oldest deletionTimestamp among this replica's Manifests (0 when none)",
            metrics.oldest_deletion.clone(),
        );
        registry.register(
            "manifests_failing",
            "Manifests in the shards this replica owns that failed: stalled (Stalled=True, waits for a change) or retrying (Reconciling=True, ProgressingWithRetry), by the Ready reason",
            metrics.failing.clone(),
        );
        for status in ["stalled", "retrying"] {
            for reason in FAILING_REASONS {
                let _ = metrics
                    .failing
                    .get_or_create(&FailingLabels { status, reason });
            }
        }
        metrics
    }
}

/// The binary's version, as a label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// Every component's metrics, registered exactly as the binary registers them.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// The reconcile pipeline.
    pub reconcile: ReconcileMetrics,
    /// The helm renderer and its cache.
    pub render: RenderMetrics,
    /// The work queue.
    pub queue: QueueMetrics,
    /// The fleet protocol.
    pub fleet: FleetMetrics,
    /// The Manifests this replica owns.
    pub manifests: ManifestMetrics,
    /// Remote targets.
    pub target: TargetMetrics,
    /// The API requests of every client the replica builds.
    pub api: crate::telemetry::requests::ApiRequestMetrics,
}

impl Metrics {
    /// Registers everything in `registry` (made by [`registry`]): the process metrics, and
    /// under `module_manager_…` `build_info`, the CPU of helm runs and the components' metrics.
    pub fn register(registry: &mut Registry) -> Self {
        // Read at each scrape; the standard names, without the prefix.
        registry.register_collector(Box::new(ProcessCollector));
        let registry = registry.sub_registry_with_prefix("module_manager");
        registry.register_collector(Box::new(HelmCpuCollector));
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1; the label carries the module-manager version",
            build_info,
        );
        let api = crate::telemetry::requests::ApiRequestMetrics::register(registry);
        Self {
            reconcile: ReconcileMetrics::register(registry),
            render: RenderMetrics::register(registry),
            queue: QueueMetrics::register(registry),
            fleet: FleetMetrics::register(registry),
            manifests: ManifestMetrics::register(registry),
            target: TargetMetrics {
                requests: api.clone(),
                ..TargetMetrics::register(registry)
            },
            api,
        }
    }
}

/// The root registry, without a prefix: [`Metrics::register`] puts the standard `process_…`
/// metrics in it, and everything of module-manager in its sub-registry `module_manager_…`.
pub fn registry() -> Registry {
    Registry::default()
}

/// The two exposition formats of `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (`application/openmetrics-text`), what Prometheus asks for first.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4 (`text/plain`), for `promtool check metrics`,
    /// `curl` and older scrapers: a counter's `# HELP`/`# TYPE` name its `_total` series, no
    /// `# EOF`.
    PrometheusText,
}

impl Format {
    /// The format a client asks for with its `Accept` header values: OpenMetrics when any
    /// names it, else the classic text format.
    pub fn negotiate<'a>(accept: impl IntoIterator<Item = &'a str>) -> Self {
        if accept
            .into_iter()
            .any(|v| v.contains("application/openmetrics-text"))
        {
            Self::OpenMetrics
        } else {
            Self::PrometheusText
        }
    }

    /// The `Content-Type` of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Encodes `registry` in `format` (prometheus-client's encoders).
pub fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, registry)?,
        Format::PrometheusText => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, registry)?
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_names_counters_with_their_total_series() {
        let mut registry = registry();
        let metrics = Metrics::register(&mut registry);
        metrics.reconcile.applied.inc();
        metrics.reconcile.count_pass("error", "RenderError");
        let open = encode(&registry, Format::OpenMetrics).unwrap();
        let text = encode(&registry, Format::PrometheusText).unwrap();
        assert!(open.contains("# TYPE module_manager_reconcile_objects_applied counter\n"));
        assert!(open.ends_with("# EOF\n"));
        assert!(text.contains("# TYPE module_manager_reconcile_objects_applied_total counter\n"));
        assert!(text.contains("module_manager_reconcile_objects_applied_total 1\n"));
        assert!(text.contains(
            "module_manager_reconcile_passes_total{result=\"error\",category=\"RenderError\"} 1\n"
        ));
        assert!(text.contains("# TYPE module_manager_reconcile_duration_seconds histogram\n"));
        assert!(text.contains("module_manager_build_info{version="));
        // Remote target errors exist at 0 for every reason from the start.
        for reason in TARGET_ERROR_REASONS {
            assert!(
                text.contains(&format!(
                    "module_manager_target_errors_total{{reason=\"{reason}\"}} 0\n"
                )),
                "{reason}"
            );
        }
        assert!(text.contains("module_manager_target_clients 0\n"));
        assert!(!text.contains("# EOF"));
        // The standard process metrics, unprefixed, and the CPU of helm runs (Linux only).
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "module_manager_helm_cpu_seconds_total",
        ] {
            let found = text.contains(&format!("\n{name} "));
            assert_eq!(found, cfg!(target_os = "linux"), "{name}");
        }
        // The same samples in both (histogram lines in another order), but for the readings of
        // /proc, which change from one scrape to the next.
        let samples = |s: &str| -> std::collections::BTreeSet<String> {
            s.lines()
                .filter(|l| !l.starts_with('#'))
                .filter(|l| !l.starts_with("process_") && !l.starts_with("module_manager_helm_cpu"))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(samples(&open), samples(&text));
    }

    #[test]
    fn openmetrics_only_for_clients_that_ask_for_it() {
        let prometheus =
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        assert_eq!(Format::negotiate([prometheus]), Format::OpenMetrics);
        assert_eq!(Format::negotiate(["*/*"]), Format::PrometheusText);
        assert_eq!(Format::negotiate([]), Format::PrometheusText);
    }
}
