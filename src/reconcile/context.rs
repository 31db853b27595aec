//! The context of every pass of a replica ([`Context`]): the clients, caches, renderer, metrics
//! and rules a pass works with, and the bounds on one pass.

use std::path::PathBuf;
use std::time::Duration;

use kube::Client;
use kube::runtime::events::Reporter;

use super::deletion_cap::DeletionCap;
use super::written::LastWrites;
use crate::apply::Cluster;
use crate::apply::identity::Tenancy;
use crate::apply::target::TargetClients;
use crate::plan::PlanLimits;
use crate::plan::rollout::RolloutSettings;
use crate::render::HelmRenderer;
use crate::shard::ShardCount;
use crate::shard::server::ShardFilter;
use crate::source::{Limits, RemoteCharts};
use crate::telemetry::metrics::{QueueCounts, ReconcileMetrics};

/// The default pass deadline (`--pass-deadline-seconds`): well above the sum of the steps'
/// own bounds on a healthy pass (a chart fetch 60 s, a render 30 s, CRDs 30 s).
pub const PASS_DEADLINE: Duration = Duration::from_secs(300);

/// What a reconcile pass needs.
pub struct Context {
    /// The cluster holding the Manifests, their values sources and Events.
    pub client: Client,
    /// The local cluster: modules without `spec.target` are applied to it.
    pub cluster: Cluster,
    /// Clients of remote targets (`spec.target`), cached per kubeconfig Secret.
    pub targets: TargetClients,
    /// The helm renderer (with its cache).
    pub renderer: HelmRenderer,
    /// Local chart paths resolve under this directory (absolute, canonical).
    pub chart_root: PathBuf,
    /// Chart size limits.
    pub chart_limits: Limits,
    /// Fetches charts from Helm repositories and OCI registries (and caches them on disk).
    pub remote_charts: RemoteCharts,
    /// This replica's name (written to `status.owner`).
    pub replica: String,
    /// The fleet's number of virtual shards (a Manifest's shard is stamped as a label and
    /// written to `status.shard`).
    pub shards: ShardCount,
    /// How the Manifest watches select this replica's shards: on the label path a claim stamps
    /// the shard label; with the API server's filter (`--server-side-sharding`) nothing does.
    pub shard_filter: ShardFilter,
    /// Who publishes Events (controller and replica).
    pub reporter: Reporter,
    /// Pipeline metrics.
    pub metrics: ReconcileMetrics,
    /// How long a hook may run when its `modulemanager.io/hook-timeout` annotation does not say.
    pub hook_timeout: Duration,
    /// Whose identity each Manifest's objects are written with (impersonated ServiceAccounts,
    /// their clients), and what no module may write.
    pub tenancy: Tenancy,
    /// The pass deadline and the caps on a render.
    pub pass_limits: PassLimits,
    /// This replica's last write of each Manifest: a pass starts from the watch cache when it
    /// holds that write (no read).
    pub written: LastWrites,
    /// Whether dependencies may cross namespaces.
    pub dependencies: DependencyRules,
    /// `--drift-override-managers`: field managers whose changes every drift pass reverts,
    /// besides a Manifest's `spec.drift.overrideManagers`; empty by default.
    pub drift_override_managers: Vec<String>,
    /// The work queue's counts (`(due, scheduled)`, installed by the controller; due includes
    /// the keys waiting for their remote target's pass to end): a pass does not wait for its
    /// workloads while other keys are due.
    pub queue: QueueCounts,
    /// `--max-module-deletions-per-minute`: the fleet's cap on module deletions and this
    /// replica's pace under it (no cap by default).
    pub deletions: DeletionCap,
    /// Where rollout groups keep their rollout objects, and how their batches go.
    pub rollouts: Rollouts,
}

/// Bounds on one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassLimits {
    /// Longest a pass may run: past it, it is stopped where it is (as a crash would stop it:
    /// the inventory is recorded before anything is applied), ends with a transient error and
    /// frees its worker. Each step has its own, shorter bound (render, chart fetch, CRDs, remote
    /// requests); this one bounds their sum and anything between them.
    pub deadline: Duration,
    /// Caps on one render's objects and on the inventory.
    pub plan: PlanLimits,
}

impl Default for PassLimits {
    fn default() -> Self {
        Self {
            deadline: PASS_DEADLINE,
            plan: PlanLimits::default(),
        }
    }
}

/// How dependencies are handled, shared by every pass of a replica.
#[derive(Clone, Debug)]
pub struct DependencyRules {
    /// Whether a dependency may be in another namespace than its dependent
    /// (`--cross-namespace-dependencies`; off by default in impersonation mode).
    pub cross_namespace: bool,
}

impl Default for DependencyRules {
    fn default() -> Self {
        Self {
            cross_namespace: true,
        }
    }
}

/// Where the fleet keeps its rollout objects, and how rollouts go.
#[derive(Clone, Debug)]
pub struct Rollouts {
    /// The fleet's namespace (that of its Leases).
    pub namespace: String,
    /// The fleet's name (the objects are named after it).
    pub fleet: String,
    /// Batch sizes and the failures a batch may have.
    pub settings: RolloutSettings,
    /// How often a waiting Manifest looks again (`--rollout-check-seconds`); the group's
    /// Manifests are listed at most once in this time per rollout.
    pub check_every: Duration,
    /// The window upgrades to a new chart of Manifests without a rollout group are spread over
    /// (`--upgrade-spread-seconds`; zero: none).
    pub spread: Duration,
}

impl Default for Rollouts {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            fleet: "module-manager".into(),
            settings: RolloutSettings::default(),
            check_every: Duration::from_secs(30),
            spread: Duration::ZERO,
        }
    }
}
