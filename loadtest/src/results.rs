//! What a run measured and found: the JSON written as `results.json`, the input of the Markdown
//! summary and the charts. Plain data; every figure says its unit in its name.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One run of one scenario.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunResult {
    /// Scenario name (`basic`, `scale-out`, `chaos`, `rolling-update`, `rebalance`, `smoke`).
    pub scenario: String,
    /// Start, RFC 3339.
    pub started_at: String,
    /// The scenario's parameters as given (after defaults).
    pub parameters: serde_json::Value,
    pub environment: Environment,
    pub duration_seconds: f64,
    /// True when no checker found a violation.
    pub passed: bool,
    pub violations: Vec<Violation>,
    /// Over the whole load phase.
    pub throughput: Throughput,
    pub latency: Latencies,
    /// Per replica (by member name), over the load phase.
    pub replicas: Vec<ReplicaFigures>,
    pub apiserver: ApiServerFigures,
    pub fleet: FleetFigures,
    /// `scale-out` only: one entry per fleet size measured.
    pub capacity: Vec<Capacity>,
    /// `mttp` only: the bursts, their baselines, the idle fleet and the cold restart.
    #[serde(default)]
    pub mttp: Option<Mttp>,
    /// `remote` only: many targets on a few API servers.
    #[serde(default)]
    pub remote: Option<Remote>,
    /// `hostile` only: innocent Manifests beside one hostile Manifest, arm by arm.
    #[serde(default)]
    pub hostile: Option<Hostile>,
    /// Present when baselines ran.
    pub baselines: Option<Baselines>,
    /// Why the baselines could not be measured, when they failed.
    #[serde(default)]
    pub baselines_error: Option<String>,
    /// Samples over time (every `sample_interval_seconds`), for the charts.
    pub timeline: Vec<Sample>,
    /// What a real Prometheus scraping the replicas saw: the dashboards' panels and the alerts
    /// (local fleets of `basic`, `chaos`, `rolling-update`, `rebalance` and `smoke`).
    #[serde(default)]
    pub monitoring: Option<Monitoring>,
}

/// The dashboards of `deploy/monitoring/dashboards/` and the alerts of
/// `deploy/monitoring/prometheusrule.yaml`, evaluated by a Prometheus that scraped every replica
/// during the run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Monitoring {
    /// `prometheus --version`.
    pub prometheus: String,
    pub scrape_interval_seconds: f64,
    /// The window the panels were queried over: from before the load to the end of the settle
    /// time, seconds.
    pub window_seconds: f64,
    /// Whether the run injected faults (`chaos`): panels declared empty without faults must
    /// then have data.
    pub faults: bool,
    pub dashboards: Vec<DashboardFigures>,
    pub alerts: Vec<AlertFigures>,
}

/// One dashboard as Grafana would have shown it over the run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DashboardFigures {
    pub file: String,
    pub uid: String,
    pub title: String,
    /// Each template variable's value(s), filled from its own query.
    pub variables: BTreeMap<String, String>,
    /// What was wrong with the dashboard as a whole (a variable without values…).
    pub problems: Vec<String>,
    pub panels: Vec<PanelFigures>,
}

/// One panel: its queries' series over the window.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PanelFigures {
    pub id: u64,
    pub title: String,
    /// The row it is under.
    pub row: String,
    /// `timeseries`, `stat`…
    pub kind: String,
    /// Grafana unit id (`s`, `ops`, `percentunit`…).
    pub unit: String,
    /// What the dashboard declares: `data`, `empty in a clean run`, `empty without faults`.
    pub expected: String,
    /// The queries' step.
    pub step_seconds: f64,
    /// Series with at least one value (NaN and infinite values dropped).
    pub series: Vec<PanelSeries>,
    /// What was wrong with it: a query error, an unknown unit or variable, a foreign
    /// datasource, a legend naming a label its series lack.
    pub problems: Vec<String>,
}

/// One series of a panel.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PanelSeries {
    pub ref_id: String,
    /// The legend Grafana would show.
    pub legend: String,
    /// (seconds since the window started, value).
    pub points: Vec<(f64, f64)>,
}

/// One alert rule over the run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AlertFigures {
    pub name: String,
    pub group: String,
    /// `ok` when Prometheus evaluated it without error.
    pub health: String,
    #[serde(default)]
    pub last_error: String,
    /// Seconds it was pending and firing (rule evaluations in that state × the interval).
    pub pending_seconds: f64,
    pub firing_seconds: f64,
    /// What the scenario expects: `silent` (never firing) or `may fire`.
    pub expected: String,
}

/// Where the run ran.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Environment {
    /// `local` (the harness started the control plane and the replicas) or `cluster` (a
    /// deployed StatefulSet reached through a kubeconfig).
    pub target: String,
    /// Replicas at the start of the load phase.
    pub replicas: u32,
    pub shards: u32,
    /// Lease duration the fleet runs with (the unowned-shard checker allows twice this).
    pub lease_duration_seconds: f64,
    /// CPU limit per replica (cgroup quota) in cores; `None` when unlimited.
    pub cpu_limit_per_replica: Option<f64>,
    /// Reconcile workers per replica.
    pub concurrency: usize,
    /// Logical CPUs of the machine running the harness.
    pub cores: usize,
    /// The chart the Manifests install.
    pub chart: String,
    /// `kube-apiserver` version (`gitVersion`).
    pub kubernetes_version: String,
    /// module-manager version (`module_manager_build_info`), when scraped.
    pub module_manager_version: String,
}

/// A checker's finding; any one fails the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// `overlap`, `not-converged`, `unowned-shard`, `moved-during-rolling-update`.
    pub checker: String,
    /// Human-readable, with the Manifest, shard or replica concerned.
    pub detail: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Throughput {
    /// Creates, updates and deletes sent by the load generator.
    pub operations: u64,
    pub operations_per_second: f64,
    /// Manifests that reached Ready at the generation written (creates and updates).
    pub converged: u64,
    pub converged_per_second: f64,
    /// Reconcile passes, all replicas.
    pub reconcile_passes: u64,
    /// Manifests existing at the end.
    pub manifests_at_end: u64,
    /// Requests of the load generator that failed (counted in `operations`, nothing waited for).
    #[serde(default)]
    pub failed_requests: u64,
    /// Operations replaced by a newer one on the same Manifest before their effect was seen
    /// (their latency is unknown).
    #[serde(default)]
    pub superseded: u64,
}

/// Quantiles of a set of durations, in seconds (`NaN` serialises as `null` when empty).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Quantiles {
    pub count: u64,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latencies {
    /// From the create call's answer to the first observation of Ready at generation 1.
    pub create_to_ready_seconds: Quantiles,
    /// From an update's answer to the first observation of Ready at the new generation.
    pub update_to_ready_seconds: Quantiles,
    /// From the request's answer to the Manifest's disappearance (finalizer released).
    pub delete_to_gone_seconds: Quantiles,
    /// `module_manager_queue_wait_seconds`, all replicas, estimated from the histogram's
    /// buckets over the load phase (max is the upper bound of the highest non-empty bucket).
    pub queue_wait_seconds: Quantiles,
}

/// One replica's share and cost.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReplicaFigures {
    pub name: String,
    /// Reconcile passes it ran during the load phase.
    pub passes: u64,
    /// `passes` / all replicas' passes.
    pub share: f64,
    /// Shards it owned at the end.
    pub shards_owned: u32,
    /// CPU seconds of the process and its helm children during the load phase.
    pub cpu_seconds: f64,
    /// `cpu_seconds` / load-phase seconds.
    pub cpu_cores_mean: f64,
    pub rss_mib_mean: f64,
    pub rss_mib_max: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ApiServerFigures {
    /// `apiserver_request_total` over the load phase, per second.
    pub requests_per_second: f64,
    /// By verb (`GET`, `LIST`, `WATCH`, `PATCH`, `APPLY`…), per second.
    pub by_verb: BTreeMap<String, f64>,
    /// By resource (`manifests`, `configmaps`, `leases`…), per second.
    pub by_resource: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FleetFigures {
    /// Release → next acquire of the same shard (planned handovers), from the replicas'
    /// `module_manager_fleet_handover_gap_seconds`.
    pub handover_gap_seconds: Quantiles,
    /// Per kill or pause of a replica: from the fault to the moment every shard was owned by a
    /// live member again, as observed through the Leases.
    pub takeover_seconds: Quantiles,
    /// Faults after which the takeover had not finished when the victim came back (not in
    /// `takeover_seconds`: each took longer than the victim was away).
    #[serde(default)]
    pub takeovers_unfinished: u32,
    /// Longest time a shard was unowned (no holder, or a holder whose member Lease had not been
    /// renewed for a lease duration).
    pub max_unowned_seconds: f64,
    /// One entry per membership change (scale, kill, restart).
    pub moves: Vec<MoveStep>,
    /// `chaos`: one entry per fault, in order.
    #[serde(default)]
    pub faults: Vec<FaultRecord>,
}

/// One fault of `chaos` and how the fleet came out of it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FaultRecord {
    /// Its type, a `--faults` name: `kill`, `pause`, `apiserver`, `apiserver-graceful`, `etcd`,
    /// `partition`, `slow`.
    pub fault: String,
    /// What was hit, e.g. `kill mm-1`, `apiserver`.
    pub label: String,
    /// When it began, seconds since the load started.
    pub at_seconds: f64,
    /// From its beginning until it was over: the victims started again or resumed, the API
    /// server answering `/readyz` again.
    pub outage_seconds: f64,
    /// From the end of the outage until every operation sent before it had its effect (Ready
    /// at the generation written, or gone) and at least one create or update sent after it
    /// had too, the load's or a probe's (the fleet works again; an empty backlog alone is not
    /// enough); `None`: not within `--recovery-limit-seconds`.
    pub recovered_seconds: Option<f64>,
    /// Probe Manifests the harness created after the outage because the load had sent no
    /// create or update that could show the fleet works again.
    #[serde(default)]
    pub probes: u32,
    /// Operations still without their effect at the limit (when not recovered): those sent
    /// before the end, else all, e.g. `Create m-12 (130 s ago)`.
    #[serde(default)]
    pub stuck: Vec<String>,
    /// The fleet's API requests per second (`module_manager_api_requests_total`, every
    /// replica) over the 30 s before the first fault (the same for every fault: a steady
    /// baseline, not the previous fault's recovery).
    pub steady_requests_per_second: Option<f64>,
    /// The same over the first 30 s after it: from the process's start for control-plane
    /// faults, from the end for `partition` and `slow` (none for `kill` and `pause`).
    pub requests_per_second_after: Option<f64>,
    /// `apiserver-graceful`: whether kube-apiserver had not exited within the 30-s grace after
    /// SIGTERM and was SIGKILLed.
    #[serde(default)]
    pub killed_after_grace: Option<bool>,
    /// Replicas whose process had exited when the fault was over (not the victims of a kill).
    #[serde(default)]
    pub replicas_exited: Vec<String>,
}

/// Shards and Manifests that changed owner in one membership step, against the ideal.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MoveStep {
    /// E.g. `3→5`, `restart member-1`, `kill member-2`.
    pub step: String,
    pub shards_moved: u32,
    /// Shards that must move at least (|1 − N/M| style), as a count.
    pub shards_ideal: f64,
    pub manifests_moved: u64,
    /// `shards_moved / shards_ideal` (1.0 is ideal; `None` when nothing had to move).
    pub ratio: Option<f64>,
    /// Seconds until the Leases matched the new assignment.
    pub settled_seconds: f64,
}

/// `scale-out` for one fleet size: load stepped up until an SLO broke.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Capacity {
    pub replicas: u32,
    pub steps: Vec<CapacityStep>,
    /// Index in `steps` of the last step where both SLOs held (`None`: not even the first).
    pub last_passing: Option<usize>,
}

impl Capacity {
    /// The capacity point: the last passing step.
    pub fn point(&self) -> Option<&CapacityStep> {
        self.last_passing.map(|i| &self.steps[i])
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CapacityStep {
    /// Create rate offered in this step, per second.
    pub create_rate: f64,
    /// Manifests existing at the end of the step.
    pub objects: u64,
    /// Operations (creates, updates) sent per second during the step.
    pub operations_per_second: f64,
    /// p99 queue wait during the step (SLO < 1 s).
    pub queue_wait_p99_seconds: Option<f64>,
    /// p99 create/update-to-Ready of the operations sent in the step (SLO < 5 s).
    pub ready_p99_seconds: Option<f64>,
    pub passed: bool,
}

/// The same burst of Manifests through each path, in the same run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Baselines {
    /// Manifests (or releases) in each burst.
    pub manifests: u64,
    /// Objects the chart renders per Manifest.
    pub objects_per_manifest: u64,
    /// The fleet under test: create the Manifests at once, until all are Ready.
    pub fleet: Burst,
    /// One replica, same burst.
    pub single_replica: Option<Burst>,
    /// A bare client server-side applying the rendered objects as fast as it can (the API
    /// server's ceiling for this work on this machine).
    pub bare_apply: Option<Burst>,
    /// `helm upgrade --install` of the same chart, one release per Manifest.
    pub helm: Option<Burst>,
}

/// One burst: how long the whole took.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Burst {
    /// Replicas (fleet bursts) or parallel workers (bare client, helm).
    pub parallelism: u32,
    pub seconds: f64,
    /// Manifests (releases) per second.
    pub per_second: f64,
}

/// The fleet at one moment.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the load phase started.
    pub t: f64,
    /// Operations sent per second since the previous sample.
    pub operations_per_second: f64,
    /// Manifests converged per second since the previous sample.
    pub converged_per_second: f64,
    /// Queue depth summed over replicas: Manifests due and waiting for a worker
    /// (`module_manager_queue_due`), not those scheduled for later.
    pub queue_depth: f64,
    /// Manifests existing.
    pub manifests: u64,
    /// Shards without a live owner.
    pub unowned_shards: u32,
    /// Per replica name: CPU cores used since the previous sample, RSS in MiB.
    pub cpu_cores: BTreeMap<String, f64>,
    pub rss_mib: BTreeMap<String, f64>,
    /// Events in this interval (`kill member-1`, `scale 3→5`).
    pub events: Vec<String>,
}

/// `mttp`: Manifests created at once, shaped like Flux's "Mean Time To Production" benchmark.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Mttp {
    /// One per fleet size and burst size, in the order run.
    pub bursts: Vec<MttpBurst>,
    /// Per burst size: the paths without the fleet, in the same run.
    pub baselines: Vec<MttpBaseline>,
    /// Per burst size: the fleet under test against each baseline.
    pub ratios: Vec<MttpRatio>,
    /// The fleet idle after its last burst (`--idle-seconds`).
    pub idle: Option<IdleFigures>,
    /// Every replica stopped and started again (`--cold-restart`).
    pub cold_restart: Option<ColdRestart>,
    /// The counters compared with `--gate`'s baseline, or written to it.
    #[serde(default)]
    pub gate: Option<GateOutcome>,
}

/// What `--gate` did (`crate::gate`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GateOutcome {
    /// The baseline file.
    pub baseline: String,
    /// The run's counters were written to it (`--gate-update`) instead of compared.
    pub updated: bool,
    /// Counters compared (or written).
    pub counters: usize,
    /// The counters beyond the tolerance, each with both values.
    pub findings: Vec<String>,
}

/// How fast a burst of Manifests created at once became Ready.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReadyTiming {
    /// From the first create to the last Manifest seen Ready.
    pub all_ready_seconds: f64,
    /// Manifests / `all_ready_seconds`.
    pub per_second: f64,
    /// Create → Ready of each Manifest.
    pub create_to_ready_seconds: Quantiles,
    /// From the first create to the first Manifest Ready, and to half of them Ready.
    #[serde(default)]
    pub first_ready_seconds: Option<f64>,
    #[serde(default)]
    pub half_ready_seconds: Option<f64>,
}

/// One burst: `manifests` created at once on a fleet of `replicas`, until all are Ready.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MttpBurst {
    pub replicas: u32,
    /// CPU quota per replica (cores), if any.
    pub cpu_per_replica: Option<f64>,
    pub manifests: u64,
    /// Manifests the fleet held at the end (earlier bursts' included: they stay).
    pub manifests_held: u64,
    /// How fast they became Ready (its fields stand at this level in the JSON).
    #[serde(flatten)]
    pub ready: ReadyTiming,
    /// CPU of the replicas' process trees (module-manager, the renderer, helm) over the burst.
    pub fleet_cpu_seconds: f64,
    pub cpu_seconds_per_manifest: f64,
    /// CPU of etcd, kube-apiserver and kube-controller-manager over the burst, per Manifest
    /// (local control planes only).
    pub control_plane_cpu_seconds_per_manifest: Option<f64>,
    /// `apiserver_request_total`, every client, over the burst, per Manifest.
    pub api_requests_per_manifest: f64,
    /// The same by verb (`POST`, `GET`, `APPLY`…) and by resource, per Manifest.
    pub api_by_verb_per_manifest: BTreeMap<String, f64>,
    pub api_by_resource_per_manifest: BTreeMap<String, f64>,
    /// Requests per client over the burst, from the audit log (local control planes).
    pub requests_by_client: BTreeMap<String, u64>,
    /// module-manager's requests per Manifest, and by audit verb and resource (audit log).
    pub operator_requests_per_manifest: Option<f64>,
    pub operator_by_verb_per_manifest: BTreeMap<String, f64>,
    pub operator_by_resource_per_manifest: BTreeMap<String, f64>,
    /// The same by verb and resource (`patch deployments`).
    #[serde(default)]
    pub operator_by_request_per_manifest: BTreeMap<String, f64>,
    /// Reconcile passes per Manifest (the replicas' counter).
    pub passes_per_manifest: f64,
    /// Renders per Manifest (the replicas' `module_manager_render_cache_misses_total`).
    #[serde(default)]
    pub renders_per_manifest: Option<f64>,
    /// Manifests the replicas' Manifest watches received, per Manifest
    /// (`module_manager_manifest_watch_events_total`, every replica).
    #[serde(default)]
    pub manifest_watch_events_per_manifest: Option<f64>,
    /// Times a replica's fence lapsed during the burst (`module_manager_fence_lapses_total`;
    /// each restarts its shard watch and stops its passes, so the burst's counts are disturbed).
    #[serde(default)]
    pub fence_lapses: u64,
    /// Replica scrapes that failed at the burst's start or end (their counters are missing).
    #[serde(default)]
    pub scrape_failures: u32,
    /// Highest RSS per replica (process tree, the renderer included) seen during the burst.
    pub peak_rss_mib: BTreeMap<String, f64>,
}

/// The paths without the fleet for one burst size.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MttpBaseline {
    pub manifests: u64,
    pub objects_per_manifest: u64,
    pub bare_apply: Option<Burst>,
    /// A bare client sending, per release, the fleet's requests of an install
    /// ([`crate::manifest_writes`]); local control planes only.
    #[serde(default)]
    pub bare_with_manifest_writes: Option<Burst>,
    /// The same with only the writes the Manifest's contract needs at least
    /// ([`crate::manifest_writes::Writes::Minimum`]); local control planes only.
    #[serde(default)]
    pub bare_with_minimum_writes: Option<Burst>,
    pub helm: Option<Burst>,
    /// The control plane's CPU-seconds per Manifest while each path ran, by path
    /// ([`PATH_BARE_APPLY`], [`PATH_MANIFEST_WRITES`], [`PATH_MINIMUM_WRITES`], [`PATH_HELM`]);
    /// local control planes.
    #[serde(default)]
    pub control_plane_cpu_seconds_per_manifest: BTreeMap<String, f64>,
    /// Why a path could not be measured.
    pub error: Option<String>,
}

/// [`MttpBaseline::control_plane_cpu_seconds_per_manifest`]'s key of the bare apply.
pub const PATH_BARE_APPLY: &str = "bare apply";
/// … of the bare client with the fleet's requests.
pub const PATH_MANIFEST_WRITES: &str = "bare apply with the Manifest's writes";
/// … of the bare client with the minimum writes.
pub const PATH_MINIMUM_WRITES: &str = "bare apply with the minimum writes";
/// … of `helm upgrade --install`.
pub const PATH_HELM: &str = "helm";

/// The fleet under test (the last of `--replicas`) against the baselines, at one burst size;
/// each a ratio of Manifests per second (above 1: the fleet is faster).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MttpRatio {
    pub manifests: u64,
    pub replicas: u32,
    pub fleet_over_bare_apply: Option<f64>,
    /// Against the bare client that sends the fleet's requests (the API server's work for the
    /// Manifests, without the operator).
    #[serde(default)]
    pub fleet_over_manifest_writes: Option<f64>,
    /// Against the bare client that sends only the writes the Manifest's contract needs.
    #[serde(default)]
    pub fleet_over_minimum_writes: Option<f64>,
    /// Against one replica with the same CPU quota: N vs 1 replicas.
    pub fleet_over_single_replica: Option<f64>,
    pub fleet_over_helm: Option<f64>,
}

/// The fleet idle with all its Manifests Ready, at their drift interval.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IdleFigures {
    pub replicas: u32,
    pub manifests: u64,
    /// `spec.interval` of the Manifests.
    pub drift_interval: String,
    pub seconds: f64,
    /// `apiserver_request_total`, every client, per second.
    pub api_requests_per_second: f64,
    /// module-manager's requests per second (audit log), and by verb and resource.
    pub operator_requests_per_second: Option<f64>,
    pub operator_by_verb_per_second: BTreeMap<String, f64>,
    pub operator_by_resource_per_second: BTreeMap<String, f64>,
    /// Requests per client over the window (audit log).
    pub requests_by_client: BTreeMap<String, u64>,
    /// Reconcile passes per second, all replicas (the drift checks).
    pub passes_per_second: f64,
    /// Cores of the replicas' process trees, summed.
    pub fleet_cores: f64,
    /// Highest RSS per replica (process tree, the renderer included) over the window.
    pub peak_rss_mib: BTreeMap<String, f64>,
}

/// Every replica stopped (SIGTERM) and started again at once.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ColdRestart {
    pub replicas: u32,
    pub manifests: u64,
    /// From the stop to the moment every replica answered `/readyz` again.
    pub ready_seconds: f64,
    /// From the stop until every Manifest had a completed reconcile pass in the new processes'
    /// logs (`reconcile end`); `None` when some had none within the limit.
    pub all_checked_seconds: Option<f64>,
    /// Manifests with a completed pass after the restart, when the measurement ended.
    pub checked: u64,
    /// Reconcile passes the new processes completed until then.
    pub passes: u64,
}

/// `remote`: Manifests on many remote targets (simulated clusters, each with its own endpoint
/// and credential) created at once, the idle fleet, and a bare client doing the same applies.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Remote {
    pub targets: u64,
    pub modules_per_target: u64,
    /// Real API servers the targets are spread over.
    pub apiservers: u64,
    /// Round trip the proxy adds to every connection.
    pub latency_ms: u64,
    pub replicas: u32,
    pub manifests: u64,
    /// Setting up the targets (namespaces, ServiceAccounts, tokens) before the fleet starts.
    pub setup_seconds: f64,
    pub burst: RemoteBurst,
    pub idle: Option<RemoteIdle>,
    /// The same-run baseline: a bare client per target, through the same proxy.
    pub bare: Option<Burst>,
    pub bare_error: Option<String>,
    /// The fleet's Manifests per second ÷ the bare client's.
    pub fleet_over_bare: Option<f64>,
    /// The second baseline: the bare client also sending the Manifest's minimum writes on the
    /// local cluster per release (create, claim, inventory, `Ready`).
    #[serde(default)]
    pub bare_with_manifest_writes: Option<Burst>,
    #[serde(default)]
    pub bare_with_manifest_writes_error: Option<String>,
    /// The fleet's Manifests per second ÷ that baseline's.
    #[serde(default)]
    pub fleet_over_minimum: Option<f64>,
    /// That baseline's Manifests per second ÷ the bare client's: what the Manifest's own
    /// writes cost on this machine, whatever the operator.
    #[serde(default)]
    pub minimum_over_bare: Option<f64>,
    /// Lifetime of each target's token; the harness renews them at half their life.
    #[serde(default)]
    pub token_seconds: i64,
    #[serde(default)]
    pub token_renewals: u64,
    #[serde(default)]
    pub token_renewal_failures: u64,
    /// Manifests not Ready at their generation when the fleet's part ended (a run with any
    /// fails).
    #[serde(default)]
    pub not_ready_at_end: Option<u64>,
    /// Spec edits with the fleet holding every target (`--edits`).
    #[serde(default)]
    pub steady: Option<RemoteSteady>,
    /// Objects changed on targets and repaired by the fleet (`--drift-changes`).
    #[serde(default)]
    pub drift: Option<RemoteDrift>,
    /// The whole fleet restarted at the end (`--cold-restart`).
    #[serde(default)]
    pub cold_restart: Option<RemoteColdRestart>,
}

/// Objects changed on the targets by someone else, and their repair (`remote --drift-changes`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RemoteDrift {
    /// Manifests picked (`--drift-changes`, at most the Manifests not edited before).
    pub requested: u64,
    /// Changes made (one ConfigMap each); the others' ConfigMap was not found or not changed.
    pub changes: u64,
    /// The Manifests' `spec.interval`: a change is found by the next drift pass.
    pub interval_seconds: f64,
    /// From a change sent to the ConfigMap seen with the chart's value again; a change not seen
    /// repaired counts as its wait (a lower bound).
    pub change_to_repair_seconds: Quantiles,
    /// Changes repaired within one interval.
    pub within_interval: u64,
    /// Changes repaired within 1.1 intervals (an operator before bd27d37 added up to 10 %).
    pub within_interval_and_jitter: u64,
    /// Changes not repaired within 1.1 intervals and a minute.
    pub not_repaired: u64,
}

/// Spec edits at a steady rate with the fleet holding every target (`remote --edits`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RemoteSteady {
    /// Edits answered (each a new generation of a Manifest of its own).
    pub edits: u64,
    /// Edits the API server did not answer.
    pub failed: u64,
    /// Edits sent per second.
    pub rate: f64,
    /// From the first edit sent to the last one Ready (or the wait's end).
    pub seconds: f64,
    /// From an edit sent to the first `reconcile start` of its Manifest at or after it; an edit
    /// without one counts as its wait (a lower bound).
    pub edit_to_pass_start_seconds: Quantiles,
    /// From an edit sent to its Manifest first seen Ready at its new generation; an edit not
    /// seen Ready counts as its wait (a lower bound).
    pub edit_to_ready_seconds: Quantiles,
    /// Edits no pass was seen to start for in the replicas' logs.
    pub not_started: u64,
    /// Edits not Ready at their generation within two minutes of the last one.
    pub not_ready: u64,
}

/// Every target's share of something (targets with none count as 0).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Spread {
    pub mean: f64,
    pub min: Option<f64>,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

/// The burst of the `remote` scenario.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RemoteBurst {
    /// How fast the Manifests became Ready (its fields stand at this level in the JSON).
    #[serde(flatten)]
    pub ready: ReadyTiming,
    /// CPU of the replicas' process trees.
    pub fleet_cpu_seconds: f64,
    pub peak_rss_mib: BTreeMap<String, f64>,
    /// Open sockets per replica at the end (its remote connections, its local API server's, its
    /// admin listener).
    pub sockets: BTreeMap<String, u64>,
    /// The fleet's requests on each target (audit logs of the targets' API servers, by the
    /// target's credential).
    pub requests_per_target: Spread,
    pub writes_per_target: Spread,
    /// The fleet's requests on all targets by verb.
    pub requests_by_verb: BTreeMap<String, u64>,
    /// The same by verb and resource (`patch deployments`).
    #[serde(default)]
    pub requests_by_request: BTreeMap<String, u64>,
    /// TCP connections opened to each target during the burst (each a TLS handshake).
    pub connections_opened_per_target: Spread,
    /// TCP connections open to each target at the end.
    pub connections_open_per_target: Spread,
    /// Targets blackholed from the start (`--blackholed-targets`; their Manifests are not
    /// timed).
    #[serde(default)]
    pub blackholed_targets: u64,
    /// Per replica, the most passes one target held at once
    /// (`module_manager_target_passes_held_max` at the end).
    #[serde(default)]
    pub target_passes_held_max: BTreeMap<String, u64>,
    /// Per replica, passes that found their target busy and went back to the queue.
    #[serde(default)]
    pub target_passes_parked: BTreeMap<String, u64>,
    /// Per replica, the target clients it holds at the end (`module_manager_target_clients`:
    /// the clusters it met, one client per kubeconfig Secret key).
    #[serde(default)]
    pub target_clients: BTreeMap<String, u64>,
}

/// Every replica stopped and started again with the fleet holding every target
/// (`remote --cold-restart`), and what the restart cost the targets.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RemoteColdRestart {
    pub restart: ColdRestart,
    /// The fleet's requests on each target from the stop until every Manifest was checked.
    pub requests_per_target: Spread,
    pub writes_per_target: Spread,
    /// The same by verb and resource, all targets.
    pub requests_by_request: BTreeMap<String, u64>,
    /// TCP connections opened to each target in that time.
    pub connections_opened_per_target: Spread,
    /// Per replica, the target clients it holds when every Manifest was checked.
    pub target_clients: BTreeMap<String, u64>,
}

/// The fleet idle on the `remote` targets.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RemoteIdle {
    pub seconds: f64,
    pub drift_interval: String,
    pub requests_per_target_per_minute: Spread,
    /// Writes on all targets together (should be none).
    pub writes: u64,
    pub requests_by_verb: BTreeMap<String, u64>,
    /// The same by verb and resource (`list deployments`).
    #[serde(default)]
    pub requests_by_request: BTreeMap<String, u64>,
    pub connections_opened_per_target: Spread,
    /// Cores the fleet used on average.
    pub fleet_cores: f64,
    pub peak_rss_mib: BTreeMap<String, f64>,
}

/// `hostile`: innocent Manifests created at once, alone and beside one hostile Manifest
/// (issue 31's targets at the level of whole Manifests).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Hostile {
    pub replicas: u32,
    /// Innocent Manifests per arm.
    pub innocents: u64,
    /// The innocents' chart.
    pub chart: String,
    pub repeats: u32,
    /// `--hostile-seconds`: how long each hostile Manifest was kept at least.
    pub hostile_seconds: u64,
    /// In the order played: per repeat, the arm without a hostile chart, then one per chart.
    pub arms: Vec<HostileArm>,
}

/// One arm: the innocents (and, just before them, the hostile Manifest, if any) created in a
/// fresh namespace, deleted again at its end.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HostileArm {
    /// From 1.
    pub repeat: u32,
    /// The hostile chart (`loop`, `memory`, `fail-huge`, `address-space`); `None`: the arm
    /// without one, the repeat's baseline.
    pub hostile: Option<String>,
    pub innocents: u64,
    /// Innocents seen Ready within the limit (`--settle-seconds` + 0.2 s per Manifest).
    pub innocents_ready: u64,
    /// Innocents not Ready at the limit, with their state (at most 10).
    #[serde(default)]
    pub not_ready: Vec<String>,
    /// Create → Ready of the innocents that became Ready.
    pub create_to_ready_seconds: Quantiles,
    /// The innocents' p99 ÷ the p99 of the same repeat's arm without a hostile chart.
    pub p99_over_no_hostile: Option<f64>,
    /// Renderer children started during the arm, all replicas
    /// (`module_manager_render_child_starts_total`); `None` when the replicas do not export it
    /// (the helm backend) or a scrape failed.
    pub renderer_starts: Option<u64>,
    /// Renders sent to a child again because it stopped under them
    /// (`module_manager_render_child_resends_total`): with a hostile chart that kills the
    /// child, more than 1 means innocent renders were in flight at a death.
    pub renders_resent: Option<u64>,
    /// From the creates to the end of the arm (the hostile Manifest kept `--hostile-seconds`):
    /// the time the renderer's starts are counted over.
    pub seconds: f64,
    /// The hostile Manifest at the end of the arm.
    pub hostile_status: Option<HostileStatus>,
    /// The arm's Manifests not gone within the limit after their deletion.
    #[serde(default)]
    pub not_deleted: Vec<String>,
}

/// The hostile Manifest's status, and whether it names the chart's failure.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostileStatus {
    /// `status.state`.
    pub state: Option<String>,
    /// `Ready` condition: status, reason.
    pub ready: Option<String>,
    pub ready_reason: Option<String>,
    /// `Stalled` condition's status (`True`: waits for a change; otherwise retried).
    pub stalled: Option<String>,
    /// `Reconciling` condition's reason (`ProgressingWithRetry` while a transient error is
    /// retried).
    pub reconciling_reason: Option<String>,
    /// The `Ready` condition's message, at most 200 bytes (its start).
    pub message: String,
    /// What the status must say for this chart (`crate::hostile`).
    pub expected: String,
    /// Whether it did at the end of the arm.
    pub names_failure: bool,
    /// From the creates until the status first named the failure.
    pub named_after_seconds: Option<f64>,
}
