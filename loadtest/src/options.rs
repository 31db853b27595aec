//! The command line: a scenario and its parameters (documented in `docs/loadtest.md`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;

/// The named scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Steady creates, updates and deletes for a while.
    Basic,
    /// Ramp the create rate (and with the objects the update rate) in steps until an SLO
    /// breaks; the last passing step is the capacity. `--replicas 1,2,3,4` gives the curve.
    ScaleOut,
    /// The basic load while random replicas are killed (SIGKILL) or paused (SIGSTOP).
    Chaos,
    /// The basic load while every replica is restarted in turn: nothing may move.
    RollingUpdate,
    /// The basic load while the fleet is scaled up and down.
    Rebalance,
    /// A short run of everything cheap: basic load, one rolling update, small baselines. For
    /// `make test`.
    Smoke,
    /// Flux's "Mean Time To Production" shape: `--manifests` created at once, time to all
    /// Ready, CPU, API requests and memory per Manifest, with the baselines in the same run;
    /// optionally the idle fleet (`--idle-seconds`) and a cold restart (`--cold-restart`).
    Mttp,
    /// Kyma's shape: `--modules-per-target` Manifests on each of `--targets` remote clusters
    /// (simulated on `--target-apiservers` real API servers, each target with its own endpoint
    /// and credential) created at once, time to all Ready, cost per target; optionally the idle
    /// fleet; a bare client per target as the baseline.
    Remote,
    /// Issue 31's tenant isolation at the level of whole Manifests: `--innocents` Manifests
    /// created at once, alone and beside one hostile Manifest of each `--hostile` chart, in
    /// interleaved arms repeated `--repeats` times; their create→Ready against the same
    /// repeat's arm without a hostile chart, the renderer child's starts, the hostile
    /// Manifest's status.
    Hostile,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Basic => "basic",
            Scenario::ScaleOut => "scale-out",
            Scenario::Chaos => "chaos",
            Scenario::RollingUpdate => "rolling-update",
            Scenario::Rebalance => "rebalance",
            Scenario::Smoke => "smoke",
            Scenario::Mttp => "mttp",
            Scenario::Remote => "remote",
            Scenario::Hostile => "hostile",
        }
    }
}

/// The hostile charts of the `hostile` scenario: the test fixtures under
/// `tests/fixtures/charts/` that attack the shared renderer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostileChart {
    /// A template that never ends: the render timeout stops it (and the child).
    Loop,
    /// Doubles a string until the renderer child's heap limit stops the child.
    Memory,
    /// `fail` with a 17 MB message: a template error the renderer caps.
    FailHuge,
    /// Asks for 10 GB at once: the child's address-space limit kills it.
    AddressSpace,
}

impl HostileChart {
    pub fn name(self) -> &'static str {
        match self {
            HostileChart::Loop => "loop",
            HostileChart::Memory => "memory",
            HostileChart::FailHuge => "fail-huge",
            HostileChart::AddressSpace => "address-space",
        }
    }

    /// `spec.chart.path`: under the repository, which is the local replicas' chart root.
    pub fn path(self) -> String {
        format!("tests/fixtures/charts/{}", self.name())
    }
}

/// Every parameter; each scenario reads the ones its heading names.
#[derive(Args, Clone, Debug, Serialize)]
pub struct Options {
    // ---- the fleet ----
    /// Replicas; `scale-out` and `mttp` take a list (`1,2,3,4`) and measure each size in turn.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "3",
        help_heading = "Fleet"
    )]
    pub replicas: Vec<u32>,
    /// Virtual shards (a power of two).
    #[arg(long, default_value_t = 256, help_heading = "Fleet")]
    pub shards: u32,
    /// Reconcile workers per replica.
    #[arg(long, default_value_t = 4, help_heading = "Fleet")]
    pub concurrency: usize,
    #[arg(long, default_value_t = 15, help_heading = "Fleet")]
    pub lease_duration_seconds: u64,
    #[arg(long, default_value_t = 5, help_heading = "Fleet")]
    pub renew_interval_seconds: u64,
    #[arg(long, default_value_t = 10, help_heading = "Fleet")]
    pub renew_deadline_seconds: u64,
    #[arg(long, default_value_t = 60, help_heading = "Fleet")]
    pub restart_grace_seconds: u64,
    /// CPU quota per local replica in cores (cgroup; needs root), like a pod's CPU limit.
    /// Without it all replicas share the machine's cores.
    #[arg(long, help_heading = "Fleet")]
    pub cpu_per_replica: Option<f64>,
    /// An extra argument for every local replica (repeatable; a later flag wins), e.g.
    /// `--replica-arg=--restart-grace-seconds=0`.
    #[arg(
        long = "replica-arg",
        allow_hyphen_values = true,
        help_heading = "Fleet"
    )]
    pub replica_args: Vec<String>,
    /// A kube-apiserver feature gate to turn on in the local control plane (repeatable), e.g.
    /// `--feature-gate ShardedListAndWatch` with `--replica-arg=--server-side-sharding=on`
    /// (server-side sharded watches, docs/sharding.md).
    #[arg(long = "feature-gate", help_heading = "Fleet")]
    pub feature_gates: Vec<String>,
    /// Fault injection: start local replicas without `--statefulset`, as a Deployment would
    /// run them: every graceful shutdown is then a leave that hands the shards over, so a
    /// rolling update moves them.
    #[arg(long, help_heading = "Fleet")]
    pub without_statefulset: bool,

    // ---- the load ----
    /// Creates per second.
    #[arg(long, default_value_t = 2.0, help_heading = "Load")]
    pub create_rate: f64,
    /// Deletes per second (oldest Manifest first).
    #[arg(long, default_value_t = 0.2, help_heading = "Load")]
    pub delete_rate: f64,
    /// Every Manifest's values are changed once per this many seconds (0: no updates).
    #[arg(long, default_value_t = 60, help_heading = "Load")]
    pub update_period_seconds: u64,
    /// Length of the load phase (basic, chaos, rolling-update and rebalance run at least as
    /// long as their actions need).
    #[arg(long, default_value_t = 120, help_heading = "Load")]
    pub duration_seconds: u64,
    /// Load before the first action (chaos, rolling-update, rebalance), so that there is
    /// something to move.
    #[arg(long, default_value_t = 30, help_heading = "Load")]
    pub warmup_seconds: u64,
    /// Chart directory under the repository (local fleets), for `spec.chart.path`.
    #[arg(
        long,
        default_value = "loadtest/charts/podinfo-like",
        help_heading = "Load"
    )]
    pub chart: String,
    /// `spec.chart` as JSON instead (deployed fleets: a repository or `oci://` chart their
    /// replicas can fetch).
    #[arg(long, help_heading = "Load")]
    pub chart_spec: Option<String>,
    /// `spec.interval` of the Manifests (drift re-check).
    #[arg(long, default_value = "10m", help_heading = "Load")]
    pub drift_interval: String,

    // ---- scale-out ----
    /// Create rate of the first step.
    #[arg(long, default_value_t = 1.0, help_heading = "scale-out")]
    pub start_rate: f64,
    /// Added to the create rate at every step.
    #[arg(long, default_value_t = 1.0, help_heading = "scale-out")]
    pub rate_step: f64,
    #[arg(long, default_value_t = 30, help_heading = "scale-out")]
    pub step_seconds: u64,
    #[arg(long, default_value_t = 30, help_heading = "scale-out")]
    pub max_steps: usize,
    /// SLO: p99 queue wait below this (seconds).
    #[arg(long, default_value_t = 1.0, help_heading = "scale-out")]
    pub slo_queue_wait_seconds: f64,
    /// SLO: p99 create/update-to-Ready below this (seconds).
    #[arg(long, default_value_t = 5.0, help_heading = "scale-out")]
    pub slo_ready_seconds: f64,

    // ---- chaos ----
    /// Seconds between faults.
    #[arg(long, default_value_t = 30, help_heading = "chaos")]
    pub chaos_interval_seconds: u64,
    /// Replicas hit by each fault.
    #[arg(long, default_value_t = 1, help_heading = "chaos")]
    pub victims: u32,
    /// Faults to pick from: `kill` (SIGKILL, started again after `--revive-after-seconds`),
    /// `pause` (SIGSTOP for `--pause-seconds`, then SIGCONT); on a local control plane also
    /// `apiserver` (kube-apiserver SIGKILLed), `apiserver-graceful` (SIGTERM) and `etcd`
    /// (SIGKILLed), each started again on its port and data after
    /// `--control-plane-down-seconds`; `partition` (one replica's API traffic blackholed by its
    /// own proxy, `--partition-seconds`) and `slow` (every replica's delayed, `--slow-ms` for
    /// `--slow-seconds`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kill,pause",
        help_heading = "chaos"
    )]
    pub faults: Vec<String>,
    /// Exactly this many faults, the types of `--faults` in the order given (again from the
    /// first after the last), whatever `--duration-seconds` leaves room for (it still sets the
    /// load's length, if longer); default: a random order, as many as fit in the duration.
    #[arg(long, help_heading = "chaos")]
    pub fault_count: Option<u32>,
    /// Default: twice the lease duration (long enough for a takeover).
    #[arg(long, help_heading = "chaos")]
    pub pause_seconds: Option<u64>,
    /// Default: three times the lease duration (long enough for a takeover).
    #[arg(long, help_heading = "chaos")]
    pub revive_after_seconds: Option<u64>,
    #[arg(long, default_value_t = 1, help_heading = "chaos")]
    pub seed: u64,
    /// `partition`: how long the victim is cut off (default: 30–90 s, drawn per fault).
    #[arg(long, help_heading = "chaos")]
    pub partition_seconds: Option<u64>,
    /// `slow`: how long every replica's API traffic is delayed (default: 30–90 s, drawn per
    /// fault).
    #[arg(long, help_heading = "chaos")]
    pub slow_seconds: Option<u64>,
    /// `slow`: the round trip added, milliseconds (default: 200–2000, drawn per fault).
    #[arg(long, help_heading = "chaos")]
    pub slow_ms: Option<u64>,
    /// How long kube-apiserver or etcd stays stopped before it is started again.
    #[arg(long, default_value_t = 5, help_heading = "chaos")]
    pub control_plane_down_seconds: u64,
    /// After each fault, every operation sent before it ended must have its effect within
    /// this many seconds of its end (checker `not-recovered`).
    #[arg(long, default_value_t = 120, help_heading = "chaos")]
    pub recovery_limit_seconds: u64,
    /// Fault injection: each control-plane fault also freezes kube-controller-manager
    /// (SIGSTOP) until the recovery wait is over, a control plane that does not come back
    /// whole (Deployments are not rolled out, so Manifests do not become Ready).
    #[arg(long, help_heading = "chaos")]
    pub fault_freeze_controller_manager: bool,

    // ---- rebalance ----
    /// Fleet sizes to scale to in turn; default N+2, N−1, N.
    #[arg(long, value_delimiter = ',', help_heading = "rebalance")]
    pub sizes: Vec<u32>,

    // ---- mttp ----
    /// Burst sizes: each is created at once, in turn, on every fleet size.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "100,500,1000",
        help_heading = "mttp"
    )]
    pub manifests: Vec<usize>,
    /// After the last burst (`mttp`, `remote`), measure the idle fleet (API requests, passes,
    /// CPU, memory) for this many seconds (0: not at all). A whole `--drift-interval` sees
    /// every drift check.
    #[arg(long, default_value_t = 0, help_heading = "mttp")]
    pub idle_seconds: u64,
    /// Then (`mttp`, `remote`) stop every replica and start them again: time until every
    /// Manifest has been reconciled again.
    #[arg(long, help_heading = "mttp")]
    pub cold_restart: bool,
    /// Compare the run's per-Manifest counters (requests by verb, passes, renders, watch
    /// events) and peak memory with the baseline in this file, and fail the run (checker
    /// `counter-regression`) beyond ±5 % (`loadtest/src/gate.rs`). Times are never gated.
    #[arg(long, help_heading = "mttp")]
    pub gate: Option<std::path::PathBuf>,
    /// With `--gate`: write the run's counters to that file instead of comparing (the new
    /// baseline, committed after review).
    #[arg(long, requires = "gate", help_heading = "mttp")]
    pub gate_update: bool,

    // ---- remote ----
    /// Remote clusters (each a namespace on one of the target API servers, with its own
    /// endpoint and credential).
    #[arg(long, default_value_t = 20, help_heading = "remote")]
    pub targets: usize,
    /// Manifests per target.
    #[arg(long, default_value_t = 5, help_heading = "remote")]
    pub modules_per_target: usize,
    /// Real API servers (each with etcd and kube-controller-manager) the targets are spread
    /// over.
    #[arg(long, default_value_t = 2, help_heading = "remote")]
    pub target_apiservers: usize,
    /// Round trip added to every connection to a target (half each way), milliseconds.
    #[arg(long, default_value_t = 0, help_heading = "remote")]
    pub target_latency_ms: u64,
    /// Lifetime of each target's ServiceAccount token, seconds.
    #[arg(long, default_value_t = 86_400, help_heading = "remote")]
    pub target_token_seconds: i64,
    /// Blackhole the last N targets from the start (the proxy accepts their connections and
    /// swallows every byte): their Manifests are created with the burst but not timed, and the
    /// others' create→Ready is measured beside them.
    #[arg(long, default_value_t = 0, help_heading = "remote")]
    pub blackholed_targets: usize,
    /// After the burst (and the idle window), this many spec edits (a new `revision` value) to
    /// Manifests spread over the targets, each timed to its pass start and to Ready (0: none).
    #[arg(long, default_value_t = 0, help_heading = "remote")]
    pub edits: usize,
    /// Edits sent per second (`--edits`).
    #[arg(long, default_value_t = 2.0, help_heading = "remote")]
    pub edit_rate: f64,
    /// Then change one module's ConfigMap on each of this many targets (straight on the target,
    /// as another field manager) and time each change to its repair by the fleet (0: none).
    #[arg(long, default_value_t = 0, help_heading = "remote")]
    pub drift_changes: usize,

    // ---- hostile ----
    /// Innocent Manifests (of `--chart`) created at once in every arm.
    #[arg(long, default_value_t = 20, help_heading = "hostile")]
    pub innocents: usize,
    /// The hostile charts: each arm but the first of a repeat creates one Manifest of one of
    /// them beside the innocents.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "loop,memory,fail-huge,address-space",
        help_heading = "hostile"
    )]
    pub hostile: Vec<HostileChart>,
    /// Times the arms are played (no hostile chart, then each of `--hostile`).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..), help_heading = "hostile")]
    pub repeats: u32,
    /// Keep each hostile Manifest at least this long after its creation (counting the
    /// renderer's starts over that time); 0: until its status names its failure.
    #[arg(long, default_value_t = 0, help_heading = "hostile")]
    pub hostile_seconds: u64,

    // ---- baselines ----
    /// Skip the baselines (on by default for basic, scale-out, smoke and mttp).
    #[arg(long, help_heading = "Baselines")]
    pub no_baselines: bool,
    /// Manifests (releases) in each baseline burst.
    #[arg(long, default_value_t = 100, help_heading = "Baselines")]
    pub burst: usize,

    // ---- where ----
    /// Drive a fleet deployed as a StatefulSet in the cluster of this kubeconfig instead of
    /// starting one.
    #[arg(long, help_heading = "Target")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the deployed StatefulSet.
    #[arg(long, default_value = "module-manager", help_heading = "Target")]
    pub fleet_namespace: String,
    #[arg(long, default_value = "module-manager", help_heading = "Target")]
    pub statefulset: String,
    #[arg(long, default_value_t = 9440, help_heading = "Target")]
    pub admin_port: u16,
    /// The module-manager binary for local fleets (default: next to this program).
    #[arg(long, help_heading = "Target")]
    pub binary: Option<PathBuf>,
    /// The repository (chart root of local replicas; default: found from this program).
    #[arg(long, help_heading = "Target")]
    pub repo: Option<PathBuf>,

    // ---- Prometheus ----
    /// Run without Prometheus: no dashboards drawn, no alerts evaluated (local fleets of
    /// basic, chaos, rolling-update, rebalance and smoke start one by default).
    #[arg(long, help_heading = "Prometheus")]
    pub no_prometheus: bool,
    /// Prometheus' scrape and rule evaluation interval, seconds (Grafana's datasource
    /// `timeInterval`: `$__rate_interval` is at least four of it).
    #[arg(long, default_value_t = 1.0, help_heading = "Prometheus")]
    pub prometheus_scrape_seconds: f64,

    // ---- output ----
    /// Results go to `<out>/<scenario>-<time>/`.
    #[arg(long, default_value = "loadtest-results", help_heading = "Output")]
    pub out: PathBuf,
    /// Seconds between samples of the fleet.
    #[arg(long, default_value_t = 1.0, help_heading = "Output")]
    pub sample_seconds: f64,
    /// How long to wait for the last operations' effects after the load stops.
    #[arg(long, default_value_t = 120, help_heading = "Output")]
    pub settle_seconds: u64,
    /// Keep the local replicas' logs (in the temporary directory; the path is printed).
    #[arg(long, help_heading = "Output")]
    pub keep_logs: bool,
    /// No progress bar.
    #[arg(long, help_heading = "Output")]
    pub quiet: bool,
}

impl Options {
    /// The defaults, as the command line would give them.
    pub fn defaults() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            options: Options,
        }
        Cli::parse_from(["loadtest"]).options
    }

    pub fn pause(&self) -> u64 {
        self.pause_seconds
            .unwrap_or(2 * self.lease_duration_seconds)
    }

    pub fn revive_after(&self) -> u64 {
        self.revive_after_seconds
            .unwrap_or(3 * self.lease_duration_seconds)
    }

    /// Whether Prometheus watches `scenario`'s fleet (local fleets only: a deployed one has
    /// its own). `scale-out`, `mttp` and `remote` run several fleets or none under load.
    pub fn prometheus(&self, scenario: Scenario, local: bool) -> bool {
        !self.no_prometheus
            && local
            && matches!(
                scenario,
                Scenario::Basic
                    | Scenario::Chaos
                    | Scenario::RollingUpdate
                    | Scenario::Rebalance
                    | Scenario::Smoke
            )
    }

    /// Whether the baselines run for `scenario`.
    pub fn baselines(&self, scenario: Scenario) -> bool {
        !self.no_baselines
            && matches!(
                scenario,
                Scenario::Basic | Scenario::ScaleOut | Scenario::Smoke
            )
    }
}
