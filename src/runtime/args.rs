//! The `run` flags and their validation into the [`RuntimeConfig`] the wiring uses.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::apply::budget::BudgetSettings;
use crate::apply::target::TargetSettings;
use crate::plan::PlanLimits;
use crate::plan::rollout::RolloutSettings;
use crate::plan::tenancy::ServiceAccountPolicy;
use crate::reconcile::PassLimits;
use crate::render::{Backend, RenderLimits};
use crate::shard::ShardCount;
use crate::shard::fleet::FleetConfig;
use crate::shard::membership::MembershipConfig;
use crate::shard::server::ServerSharding;
use crate::source::{Cidr, RemoteConfig};
use crate::telemetry::LogFormat;

/// The flags of `module-manager run`.
#[derive(clap::Args)]
#[command(args_override_self = true)] // a later flag wins (e.g. extra args after a chart's defaults)
pub struct RunArgs {
    /// This replica's name (unique in its fleet: the pod name), written to `status.owner` and
    /// Events. No default: two processes with one name would both hold its shards.
    #[arg(long, env = "POD_NAME")]
    pub replica: String,
    /// Directory that local chart paths (`spec.chart.path`) resolve under; paths leaving it are
    /// refused. Required: a default such as the working directory could be `/`.
    #[arg(long)]
    pub chart_root: PathBuf,
    /// Directory of the chart archives fetched from Helm repositories and OCI registries,
    /// verified and kept by digest; `module-manager-charts` in the temporary directory when
    /// omitted.
    #[arg(long, env = "MODULE_MANAGER_CHART_CACHE")]
    pub chart_cache_dir: Option<PathBuf>,
    /// Hard cap on the bytes of the chart cache (archives in use and temporary files included):
    /// the least recently used archives go first, and one that does not fit is refused.
    #[arg(long, default_value_t = 1024 * 1024 * 1024)]
    pub chart_cache_max_bytes: u64,
    /// Limit on fetching one remote chart (index or manifest, archive, checks), in seconds.
    #[arg(long, default_value_t = 60)]
    pub chart_fetch_timeout_seconds: u64,
    /// An OCI registry (`host` or `host:port`) to pull from over plain HTTP; repeatable.
    /// Loopback registries always are; every other one needs HTTPS.
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// Reserved address ranges (loopback, private, link-local and cloud metadata, CGNAT, …)
    /// that chart repositories, chart URLs, redirects and OCI token realms may still have, as
    /// CIDRs (`10.0.0.0/8`, `127.0.0.1`); repeatable or comma-separated. None by default.
    #[arg(
        long = "allow-private-chart-hosts",
        value_name = "CIDR",
        value_delimiter = ','
    )]
    pub allow_private_chart_hosts: Vec<Cidr>,
    /// Allow plain `http://` chart repositories, chart URLs, redirects and token realms (OCI
    /// registries of `--insecure-registry` and loopback ones are spoken to over HTTP anyway).
    #[arg(long)]
    pub allow_insecure_http: bool,
    /// The helm binary.
    #[arg(long, env = "MODULE_MANAGER_HELM", default_value = "helm")]
    pub helm: PathBuf,
    /// Private helm home (cache, config, data); a temporary directory when omitted.
    #[arg(long)]
    pub helm_home: Option<PathBuf>,
    /// What renders charts: `renderer` (one long-lived child on Helm's packages, `--renderer`)
    /// or `helm` (one `helm template` process per render, `--helm`).
    #[arg(long, env = "MODULE_MANAGER_RENDER_BACKEND", value_enum, default_value_t = RenderBackendArg::Renderer)]
    pub render_backend: RenderBackendArg,
    /// The renderer binary (`module-manager-renderer`, built from `renderer/`).
    #[arg(
        long,
        env = "MODULE_MANAGER_RENDERER",
        default_value = "module-manager-renderer"
    )]
    pub renderer: PathBuf,
    /// Most Go heap of the renderer child, in MiB; past it the child is restarted and the
    /// renders in flight fail (once retried).
    #[arg(long, default_value_t = 512)]
    pub render_memory_limit_mib: u64,
    /// Most bytes of rendered output the render cache keeps (all entries together; the oldest go
    /// first, a larger render is not cached).
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    pub render_cache_max_bytes: usize,
    /// Longest one reconcile pass may run, in seconds: past it the pass is stopped, ends with a
    /// transient `PassDeadline` error (retried with backoff) and frees its worker.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub pass_deadline_seconds: u64,
    /// Most objects (CRDs, objects and hooks) one render may have; more is a permanent error
    /// before anything is applied.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_objects_per_render: u64,
    /// Most bytes the inventory may take in a Manifest's status (estimated as its JSON); more
    /// is a permanent error before anything is applied (etcd refuses objects over 1.5 MiB).
    #[arg(long, default_value_t = 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..=1_400_000))]
    pub max_inventory_bytes: u64,
    /// Whether a `spec.dependsOn` may name a Manifest of another namespace (`false`: such a
    /// Manifest is `Stalled`, reason `DependencyRefused`, as with Flux's
    /// `--no-cross-namespace-refs`). Allowed, a dependent's status tells whether a Manifest of
    /// another namespace exists and is Ready. Default: `true`, but `false` in impersonation mode
    /// (`--default-service-account` or `--require-service-account`: namespaces are tenants).
    #[arg(long, value_name = "BOOL")]
    pub cross_namespace_dependencies: Option<bool>,
    /// The same as `--cross-namespace-dependencies=false`.
    #[arg(long, conflicts_with = "cross_namespace_dependencies")]
    pub no_cross_namespace_dependencies: bool,
    /// Field managers whose changes every drift pass reverts (comma-separated exact names,
    /// e.g. `kubectl-edit,kubectl-client-side-apply`), besides each Manifest's
    /// `spec.drift.overrideManagers`. Empty by default: reverting a person's `kubectl edit`
    /// during an incident must be a choice.
    #[arg(long, value_delimiter = ',', value_name = "MANAGERS")]
    pub drift_override_managers: Vec<String>,
    /// Most module deletions the whole fleet starts a minute (0: no cap, the default). A
    /// Manifest deleted beyond it (with `deletionPolicy: Delete`, something installed) waits
    /// for its turn in state `Deleting`, reason `DeletionRateLimited`, its module untouched;
    /// each replica starts its share (by shards) evenly spaced. The same in every replica.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_module_deletions_per_minute: u32,
    /// Rollout groups (`modulemanager.io/rollout-group`): Manifests in the first batch of an
    /// upgrade to a new chart; each later batch is twice the one before.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub rollout_first_batch: u64,
    /// Rollout groups: failed upgrades a batch may have; one more halts the rollout (the
    /// rollout object's `modulemanager.io/rollout-paused` annotation says why; removing it
    /// resumes).
    #[arg(long, default_value_t = 0)]
    pub rollout_max_failures: u64,
    /// Rollout groups: how often a Manifest waiting for its batch looks again, in seconds; the
    /// group's Manifests are listed at most once in this time per rollout.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub rollout_check_seconds: u64,
    /// Spreads the upgrades to a new chart of Manifests without a rollout group over this many
    /// seconds (Kyma's `module-upgrade-rollout-max-delay`): each starts at an offset of its
    /// own within the window after its first pass saw the new chart (`status.upgradeAfter`),
    /// so one version moved for thousands of Manifests does not reach every cluster at once.
    /// 0 (the default): at once.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=86400))]
    pub upgrade_spread_seconds: u64,
    /// Most reconciles at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Limit on one helm render, in seconds.
    #[arg(long, default_value_t = 30)]
    pub render_timeout_seconds: u64,
    /// How long a hook (a Job or Pod run by `helm.sh/hook`) may run before it counts as
    /// failed, in seconds, unless its `modulemanager.io/hook-timeout` annotation says otherwise.
    #[arg(long, default_value_t = 300)]
    pub hook_timeout_seconds: u64,
    /// Number of virtual shards (a power of two); the same in every replica of a fleet.
    #[arg(long, default_value_t = 256, value_parser = parse_shards)]
    pub shards: u32,
    /// Fleet name: replicas of one fleet share the shards; Leases are named and labelled by it.
    #[arg(long, default_value = "module-manager")]
    pub fleet: String,
    /// Namespace of the fleet's Leases.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// A member whose Lease is unchanged this long is dead.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// How often a replica renews its Lease.
    #[arg(long, default_value_t = 5)]
    pub renew_interval_seconds: u64,
    /// A replica whose last successful renewal is older than this stops all work (less than
    /// the lease duration: the margin covers a write already under way).
    #[arg(long, default_value_t = 10)]
    pub renew_deadline_seconds: u64,
    /// How long the others keep the shards of a replica that restarts gracefully while its
    /// ordinal is still desired (rolling update: zero moves).
    #[arg(long, default_value_t = 60)]
    pub restart_grace_seconds: u64,
    /// How long a leaving replica tries to hand its shards over before it exits.
    #[arg(long, default_value_t = 10)]
    pub handover_timeout_seconds: u64,
    /// The StatefulSet (in the Lease namespace) whose `spec.replicas` says which ordinals are
    /// desired: members are `<name>-<ordinal>`; a graceful shutdown of a desired ordinal is a
    /// restart, of any other a scale-down. Without it every live member counts and a shutdown
    /// always hands over.
    #[arg(long, env = "STATEFULSET_NAME")]
    pub statefulset: Option<String>,
    /// Reconcile only Manifests matching this label selector (e.g. `team=payments`), so that
    /// several fleets can split the Manifests without overlap.
    #[arg(long)]
    pub manifest_selector: Option<String>,
    /// Whether the API server selects each replica's Manifests by shard from their UIDs
    /// (`shardSelector`: Kubernetes 1.36+ with the alpha feature gate `ShardedListAndWatch`)
    /// instead of the shard label: `off` (the label), `auto` (probed at startup), `on` (startup
    /// fails without it). The same in every replica of a fleet.
    #[arg(long, value_enum, default_value_t = ServerSharding::Off)]
    pub server_side_sharding: ServerSharding,
    /// How long shutdown waits for reconciles in flight.
    #[arg(long, default_value_t = 10)]
    pub drain_timeout_seconds: u64,
    /// Fault injection for tests of the overlap checker: reconcile every Manifest, ignoring
    /// shard ownership. Never use it in a fleet.
    #[arg(long, hide = true)]
    pub fault_ignore_ownership: bool,
    /// Remote targets (`spec.target`): timeout of a connection (TCP and TLS handshake), in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub target_connect_timeout_seconds: u64,
    /// Remote targets: timeout of reading or writing a request, in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub target_request_timeout_seconds: u64,
    /// Remote targets: most clients cached at once (one per kubeconfig Secret key; the least
    /// recently used is dropped first). A replica of N meets most targets: with 5 Manifests per
    /// target hashed by UID, 1 − (1 − 1/N)⁵ of them (87 % at N = 3).
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub target_clients: u64,
    /// Remote targets: most passes at once on the Manifests of one target (kubeconfig Secret
    /// key), per replica. A key whose target is at the limit goes back to the queue without
    /// holding a worker, so a slow or unreachable target holds at most this many workers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub target_passes: u64,
    /// Remote targets: each target's request budget for the whole fleet, in requests per
    /// second on average (Kyma's default); each replica allows its share (the fraction of the
    /// shards it owns).
    #[arg(long, default_value_t = 50.0, value_parser = parse_qps)]
    pub target_qps: f64,
    /// Remote targets: each target's burst of requests for the whole fleet (shared like
    /// `--target-qps`).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub target_burst: u32,
    /// Address of the admin API (`/livez`, `/readyz`, `/metrics`).
    #[arg(long, default_value = "127.0.0.1:9440")]
    pub admin_address: std::net::SocketAddr,
    /// Log format.
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// The ServiceAccount (of each Manifest's own namespace) that Manifests without
    /// `spec.serviceAccountName` are applied as: no local Manifest then uses the operator's rights.
    #[arg(long)]
    pub default_service_account: Option<String>,
    /// Refuse Manifests (on the local cluster) that name no ServiceAccount when there is no
    /// `--default-service-account`: nothing of theirs is applied or deleted.
    #[arg(long)]
    pub require_service_account: bool,
    /// Let Manifests written with the operator's own identity (no ServiceAccount, local cluster)
    /// take over existing objects with `spec.adopt`. Off by default: the operator may write
    /// objects a Manifest's author cannot; as a ServiceAccount or a remote target's user,
    /// adoption is always allowed and bounded by that identity's RBAC.
    #[arg(long)]
    pub adopt_as_operator: bool,
}

/// The flag `--shards`: a power of two from 1 to 65536.
fn parse_shards(text: &str) -> Result<u32, String> {
    let count: u32 = text.parse().map_err(|e| format!("{e}"))?;
    ShardCount::new(count)
        .map(ShardCount::get)
        .ok_or_else(|| "a power of two from 1 to 65536".to_owned())
}

fn parse_qps(text: &str) -> Result<f64, String> {
    let qps: f64 = text.parse().map_err(|e| format!("{e}"))?;
    if qps.is_finite() && (0.01..=100_000.0).contains(&qps) {
        Ok(qps)
    } else {
        Err("requests per second from 0.01 to 100000".to_owned())
    }
}

/// A combination of `run` flags that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The renewal interval is zero or so long that a live member could look dead between two
    /// renewals.
    #[error(
        "--renew-interval-seconds must be at least 1 and at most half of --lease-duration-seconds"
    )]
    RenewInterval,
    /// The renew deadline does not fall between one renewal interval and the lease duration: the
    /// fence would trip on every renewal, or only after others may have taken the shards.
    #[error(
        "--renew-deadline-seconds must be longer than --renew-interval-seconds and shorter than --lease-duration-seconds"
    )]
    RenewDeadline,
    /// The shard count is not a power of two from 1 to 65536 (clap's parser refuses it first;
    /// this is for flags built without it).
    #[error("--shards must be a power of two from 1 to 65536")]
    Shards,
    /// `--default-service-account` is not a valid ServiceAccount name.
    #[error(
        "--default-service-account {0:?} is not a ServiceAccount name (lowercase letters, digits, '-' and '.', at most 253, starting and ending alphanumeric)"
    )]
    DefaultServiceAccount(String),
    /// `--drift-override-managers` names module-manager's own field managers or too many.
    #[error("--drift-override-managers: {0}")]
    DriftOverrideManagers(String),
}

/// The validated configuration of one replica: what [`super::run`] wires together.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Log format.
    pub log_format: LogFormat,
    /// This replica's name.
    pub replica: String,
    /// The directory local chart paths resolve under (canonicalized at startup).
    pub chart_root: PathBuf,
    /// How remote charts are fetched and cached.
    pub remote: RemoteConfig,
    /// The helm binary.
    pub helm: PathBuf,
    /// Private helm home; a temporary directory per process when `None`.
    pub helm_home: Option<PathBuf>,
    /// What renders charts.
    pub render_backend: Backend,
    /// Bounds on one helm run.
    pub render_limits: RenderLimits,
    /// Most reconciles at once.
    pub concurrency: usize,
    /// How long shutdown waits for reconciles in flight.
    pub drain_timeout: Duration,
    /// Reconcile only Manifests matching this label selector.
    pub manifest_selector: Option<String>,
    /// `--server-side-sharding`.
    pub server_side_sharding: ServerSharding,
    /// How long a hook may run unless its annotation says otherwise.
    pub hook_timeout: Duration,
    /// Membership, shards and their timing.
    pub fleet: FleetConfig,
    /// Limits and timeouts of remote target clients.
    pub targets: TargetSettings,
    /// Most passes at once per remote target.
    pub target_passes: usize,
    /// Address of the admin API.
    pub admin_address: SocketAddr,
    /// Fault injection: reconcile every Manifest regardless of shard ownership.
    pub fault_ignore_ownership: bool,
    /// `--default-service-account` and `--require-service-account`.
    pub service_accounts: ServiceAccountPolicy,
    /// `--pass-deadline-seconds`, `--max-objects-per-render`, `--max-inventory-bytes`.
    pub pass_limits: PassLimits,
    /// Whether `spec.dependsOn` may name another namespace (`--cross-namespace-dependencies`,
    /// off by default in impersonation mode).
    pub cross_namespace_dependencies: bool,
    /// `--drift-override-managers`.
    pub drift_override_managers: Vec<String>,
    /// `--max-module-deletions-per-minute` (`None`: no cap).
    pub max_module_deletions_per_minute: Option<std::num::NonZeroU32>,
    /// `--rollout-first-batch`, `--rollout-max-failures`.
    pub rollouts: RolloutSettings,
    /// `--rollout-check-seconds`.
    pub rollout_check: Duration,
    /// `--upgrade-spread-seconds`.
    pub upgrade_spread: Duration,
}

/// `--render-backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RenderBackendArg {
    /// The long-lived renderer child.
    Renderer,
    /// One `helm template` process per render.
    Helm,
}

impl RunArgs {
    /// Whether dependencies may cross namespaces: as set, else not in impersonation mode.
    fn cross_namespace_dependencies(&self) -> bool {
        let impersonating = self.default_service_account.is_some() || self.require_service_account;
        !self.no_cross_namespace_dependencies
            && self.cross_namespace_dependencies.unwrap_or(!impersonating)
    }

    /// The flags about the identity modules are written with, checked.
    fn identity_policy(&self) -> Result<ServiceAccountPolicy, ConfigError> {
        service_accounts(
            self.default_service_account.clone(),
            self.require_service_account,
            self.adopt_as_operator,
        )
    }

    /// `--pass-deadline-seconds`, `--max-objects-per-render`, `--max-inventory-bytes`.
    fn pass_limits(&self) -> PassLimits {
        PassLimits {
            deadline: Duration::from_secs(self.pass_deadline_seconds),
            plan: PlanLimits {
                max_objects: usize::try_from(self.max_objects_per_render).unwrap_or(usize::MAX),
                max_inventory_bytes: usize::try_from(self.max_inventory_bytes)
                    .unwrap_or(usize::MAX),
            },
        }
    }

    /// `--render-timeout-seconds`, `--render-memory-limit-mib`, `--render-cache-max-bytes`.
    fn render_limits(&self) -> RenderLimits {
        RenderLimits {
            timeout: Duration::from_secs(self.render_timeout_seconds),
            memory_limit: self.render_memory_limit_mib.saturating_mul(1024 * 1024),
            cache_bytes: self.render_cache_max_bytes,
            ..Default::default()
        }
    }

    /// `--rollout-first-batch`, `--rollout-max-failures`.
    fn rollout_settings(&self) -> RolloutSettings {
        RolloutSettings {
            first_batch: usize::try_from(self.rollout_first_batch).unwrap_or(usize::MAX),
            max_failures: usize::try_from(self.rollout_max_failures).unwrap_or(usize::MAX),
        }
    }

    /// Checks the flags against each other and turns them into the runtime configuration.
    pub fn validate(self) -> Result<RuntimeConfig, ConfigError> {
        check_lease_timing(
            self.lease_duration_seconds,
            self.renew_interval_seconds,
            self.renew_deadline_seconds,
        )?;
        let shards = ShardCount::new(self.shards).ok_or(ConfigError::Shards)?;
        let cross_namespace_dependencies = self.cross_namespace_dependencies();
        let service_accounts = self.identity_policy()?;
        let pass_limits = self.pass_limits();
        let (rollouts, render_limits) = (self.rollout_settings(), self.render_limits());
        let chart_cache = self
            .chart_cache_dir
            .unwrap_or_else(|| std::env::temp_dir().join("module-manager-charts"));
        Ok(RuntimeConfig {
            log_format: self.log_format,
            remote: RemoteConfig {
                cache_max_bytes: self.chart_cache_max_bytes,
                timeout: Duration::from_secs(self.chart_fetch_timeout_seconds.max(1)),
                insecure_registries: self.insecure_registries,
                allowed_private: self.allow_private_chart_hosts,
                allow_plain_http: self.allow_insecure_http,
                ..RemoteConfig::new(chart_cache)
            },
            chart_root: self.chart_root,
            render_backend: match self.render_backend {
                RenderBackendArg::Renderer => Backend::Renderer(self.renderer),
                RenderBackendArg::Helm => Backend::Helm(self.helm.clone()),
            },
            helm: self.helm,
            helm_home: self.helm_home,
            render_limits,
            pass_limits,
            concurrency: self.concurrency,
            cross_namespace_dependencies,
            drift_override_managers: drift_override_managers(&self.drift_override_managers)?,
            max_module_deletions_per_minute: std::num::NonZeroU32::new(
                self.max_module_deletions_per_minute,
            ),
            rollouts,
            rollout_check: Duration::from_secs(self.rollout_check_seconds),
            upgrade_spread: Duration::from_secs(self.upgrade_spread_seconds),
            drain_timeout: Duration::from_secs(self.drain_timeout_seconds),
            manifest_selector: self.manifest_selector,
            server_side_sharding: self.server_side_sharding,
            hook_timeout: Duration::from_secs(self.hook_timeout_seconds),
            fleet: FleetConfig {
                membership: MembershipConfig {
                    namespace: self.lease_namespace,
                    fleet: self.fleet,
                    replica: self.replica.clone(),
                    lease_duration: Duration::from_secs(self.lease_duration_seconds),
                    renew_interval: Duration::from_secs(self.renew_interval_seconds),
                },
                shards,
                renew_deadline: Duration::from_secs(self.renew_deadline_seconds),
                restart_grace: Duration::from_secs(self.restart_grace_seconds),
                statefulset: self.statefulset,
                handover_timeout: Duration::from_secs(self.handover_timeout_seconds),
            },
            targets: TargetSettings {
                max_clients: self.target_clients as usize,
                connect_timeout: Duration::from_secs(self.target_connect_timeout_seconds),
                request_timeout: Duration::from_secs(self.target_request_timeout_seconds),
                budget: BudgetSettings {
                    qps: self.target_qps,
                    burst: self.target_burst,
                },
                ..Default::default()
            },
            target_passes: self.target_passes as usize,
            admin_address: self.admin_address,
            fault_ignore_ownership: self.fault_ignore_ownership,
            replica: self.replica,
            service_accounts,
        })
    }
}

/// The ServiceAccount flags; the default's name is a DNS subdomain, as the API server requires
/// of a ServiceAccount's name.
/// `--drift-override-managers` checked: empty names dropped (`--drift-override-managers=`
/// names none), module-manager's own managers and more than
/// [`crate::plan::drift_report::MAX_MANAGERS`] refused at start-up rather than on every
/// Manifest.
fn drift_override_managers(names: &[String]) -> Result<Vec<String>, ConfigError> {
    let names: Vec<String> = names.iter().filter(|n| !n.is_empty()).cloned().collect();
    let reserved = [
        crate::apply::FIELD_MANAGER,
        crate::plan::drift::HANDOVER_MANAGER,
    ];
    crate::plan::drift_report::override_managers(&names, &[], &reserved).map_err(|e| match e {
        crate::plan::PlanError::OverrideManager { name, reason } => {
            ConfigError::DriftOverrideManagers(format!("{name:?}: {reason}"))
        }
        other => ConfigError::DriftOverrideManagers(other.to_string()),
    })
}

fn service_accounts(
    default: Option<String>,
    required: bool,
    adopt_as_operator: bool,
) -> Result<ServiceAccountPolicy, ConfigError> {
    if let Some(name) = &default {
        let alphanumeric =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        let valid = name.len() <= 253
            && alphanumeric(name.chars().next())
            && alphanumeric(name.chars().last())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if !valid {
            return Err(ConfigError::DefaultServiceAccount(name.clone()));
        }
    }
    Ok(ServiceAccountPolicy {
        default,
        required,
        adopt_as_operator,
    })
}

/// The renewal interval fits twice in the lease duration (one renewal may fail without the
/// member looking dead), and the renew deadline falls between the two.
fn check_lease_timing(lease: u64, interval: u64, deadline: u64) -> Result<(), ConfigError> {
    if interval < 1 || interval.saturating_mul(2) > lease {
        return Err(ConfigError::RenewInterval);
    }
    if deadline <= interval || deadline >= lease {
        return Err(ConfigError::RenewDeadline);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        run: RunArgs,
    }

    fn validate(extra: &[&str]) -> Result<RuntimeConfig, ConfigError> {
        let base = ["run", "--replica", "mm-0", "--chart-root", "/charts"];
        let flags = Flags::try_parse_from(base.iter().chain(extra)).unwrap();
        flags.run.validate()
    }

    #[test]
    fn drift_override_managers_are_checked_at_start_up() {
        let config = validate(&["--drift-override-managers=kubectl-edit,,kubectl"]).unwrap();
        assert_eq!(config.drift_override_managers, ["kubectl-edit", "kubectl"]);
        let none = validate(&["--drift-override-managers="]).unwrap();
        assert!(none.drift_override_managers.is_empty(), "empty: none");
        for own in ["module-manager", "kubectl,module-manager-handover"] {
            let error = validate(&["--drift-override-managers", own]).unwrap_err();
            assert!(
                matches!(error, ConfigError::DriftOverrideManagers(_)),
                "{error}"
            );
            assert!(error.to_string().contains("module-manager"), "{error}");
        }
        let lots: Vec<String> = (0..33).map(|i| format!("m{i}")).collect();
        let flag = format!("--drift-override-managers={}", lots.join(","));
        assert!(validate(&[flag.as_str()]).is_err());
    }

    #[test]
    fn the_defaults_are_accepted_and_converted() {
        let config = validate(&["--chart-fetch-timeout-seconds", "0"]).unwrap();
        assert_eq!(config.replica, "mm-0");
        assert_eq!(config.fleet.membership.replica, "mm-0");
        assert_eq!(config.fleet.shards.get(), 256);
        assert_eq!(
            config.fleet.membership.lease_duration,
            Duration::from_secs(15)
        );
        assert_eq!(
            config.fleet.membership.renew_interval,
            Duration::from_secs(5)
        );
        assert_eq!(config.fleet.renew_deadline, Duration::from_secs(10));
        assert_eq!(
            config.remote.timeout,
            Duration::from_secs(1),
            "at least 1 s"
        );
        assert_eq!(config.targets.max_clients, 8192);
        assert_eq!(config.render_limits.timeout, Duration::from_secs(30));
        assert_eq!(config.render_limits.cache_bytes, 256 << 20);
        assert_eq!(config.pass_limits, PassLimits::default());
        let bounded = validate(&[
            "--pass-deadline-seconds",
            "20",
            "--max-objects-per-render",
            "7",
            "--max-inventory-bytes",
            "4096",
            "--render-cache-max-bytes",
            "1000",
        ])
        .unwrap();
        assert_eq!(
            bounded.pass_limits,
            PassLimits {
                deadline: Duration::from_secs(20),
                plan: PlanLimits {
                    max_objects: 7,
                    max_inventory_bytes: 4096
                }
            }
        );
        assert_eq!(bounded.render_limits.cache_bytes, 1000);
        // Above what etcd stores, or zero: refused by the parser.
        for bad in [
            &["--max-inventory-bytes", "2000000"][..],
            &["--pass-deadline-seconds", "0"],
            &["--max-objects-per-render", "0"],
        ] {
            let base = ["run", "--replica", "mm-0", "--chart-root", "/charts"];
            assert!(
                Flags::try_parse_from(base.iter().chain(bad)).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(config.chart_root, PathBuf::from("/charts"));
        assert!(
            config.remote.allowed_private.is_empty(),
            "no reserved range"
        );
        assert!(!config.remote.allow_plain_http, "no plain http");
    }

    #[test]
    fn the_chart_host_flags_are_parsed() {
        let config = validate(&[
            "--allow-private-chart-hosts",
            "127.0.0.1,10.0.0.0/8",
            "--allow-private-chart-hosts=fd00::/8",
            "--allow-insecure-http",
        ])
        .unwrap();
        let shown: Vec<String> = config
            .remote
            .allowed_private
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(shown, ["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"]);
        assert!(config.remote.allow_plain_http);
        let base = ["run", "--replica", "a", "--chart-root", "/"];
        let bad = Flags::try_parse_from(base.iter().chain(&["--allow-private-chart-hosts=10/8"]));
        assert!(bad.is_err());
    }

    #[test]
    fn the_renew_interval_fits_twice_in_the_lease() {
        for bad in [
            &["--renew-interval-seconds", "0"][..],
            &["--renew-interval-seconds", "8"],
            &[
                "--lease-duration-seconds",
                "9",
                "--renew-deadline-seconds",
                "6",
            ],
            &["--renew-interval-seconds", "18446744073709551615"],
        ] {
            assert_eq!(
                validate(bad).unwrap_err(),
                ConfigError::RenewInterval,
                "{bad:?}"
            );
        }
        assert_eq!(
            ConfigError::RenewInterval.to_string(),
            "--renew-interval-seconds must be at least 1 and at most half of --lease-duration-seconds"
        );
        // Exactly half is allowed.
        validate(&[
            "--lease-duration-seconds",
            "20",
            "--renew-interval-seconds",
            "10",
            "--renew-deadline-seconds",
            "15",
        ])
        .unwrap();
    }

    #[test]
    fn the_renew_deadline_falls_between_interval_and_lease() {
        for bad in [
            &["--renew-deadline-seconds", "5"][..],
            &["--renew-deadline-seconds", "4"],
            &["--renew-deadline-seconds", "15"],
            &["--renew-deadline-seconds", "60"],
        ] {
            assert_eq!(
                validate(bad).unwrap_err(),
                ConfigError::RenewDeadline,
                "{bad:?}"
            );
        }
        assert_eq!(
            ConfigError::RenewDeadline.to_string(),
            "--renew-deadline-seconds must be longer than --renew-interval-seconds and shorter than --lease-duration-seconds"
        );
        validate(&["--renew-deadline-seconds", "6"]).unwrap();
        validate(&["--renew-deadline-seconds", "14"]).unwrap();
    }

    #[test]
    fn shards_are_a_power_of_two() {
        assert!(
            Flags::try_parse_from([
                "run",
                "--replica",
                "a",
                "--chart-root",
                "/",
                "--shards",
                "3"
            ])
            .is_err()
        );
        let flags = Flags::try_parse_from(["run", "--replica", "a", "--chart-root", "/"]).unwrap();
        let unchecked = RunArgs {
            shards: 3,
            ..flags.run
        };
        assert_eq!(unchecked.validate().unwrap_err(), ConfigError::Shards);
    }

    #[test]
    fn the_service_account_flags_are_checked_and_kept() {
        let open = validate(&[]).unwrap();
        assert_eq!(open.service_accounts, ServiceAccountPolicy::default());
        let locked = validate(&[
            "--default-service-account",
            "module-deployer",
            "--require-service-account",
        ])
        .unwrap();
        assert_eq!(
            locked.service_accounts,
            ServiceAccountPolicy {
                default: Some("module-deployer".into()),
                required: true,
                adopt_as_operator: false,
            }
        );
        assert!(
            validate(&["--adopt-as-operator"])
                .unwrap()
                .service_accounts
                .adopt_as_operator
        );
        assert!(
            validate(&["--require-service-account"])
                .unwrap()
                .service_accounts
                .required
        );
        let long = "a".repeat(254);
        for bad in ["", "Deployer", "-x", "x-", "a_b", "a/b", long.as_str()] {
            let flag = format!("--default-service-account={bad}");
            assert_eq!(
                validate(&[flag.as_str()]).unwrap_err(),
                ConfigError::DefaultServiceAccount(bad.to_owned()),
                "{bad:?}"
            );
        }
        validate(&["--default-service-account", "a.b-1"]).unwrap();
    }

    #[test]
    fn cross_namespace_dependencies_are_off_by_default_in_impersonation_mode() {
        let allowed = |flags: &[&str]| validate(flags).unwrap().cross_namespace_dependencies;
        assert!(allowed(&[]), "open: allowed, as in Flux");
        assert!(!allowed(&["--require-service-account"]));
        assert!(!allowed(&["--default-service-account", "deployer"]));
        assert!(allowed(&[
            "--require-service-account",
            "--cross-namespace-dependencies=true"
        ]));
        assert!(!allowed(&["--cross-namespace-dependencies=false"]));
        assert!(!allowed(&["--no-cross-namespace-dependencies"]));
        let both = [
            "--no-cross-namespace-dependencies",
            "--cross-namespace-dependencies=true",
        ];
        let base = ["run", "--replica", "mm-0", "--chart-root", "/charts"];
        assert!(Flags::try_parse_from(base.iter().chain(&both)).is_err());
    }

    #[test]
    fn module_deletions_are_not_capped_unless_asked() {
        let cap = |flags: &[&str]| {
            validate(flags)
                .unwrap()
                .max_module_deletions_per_minute
                .map(|n| n.get())
        };
        assert_eq!(cap(&[]), None);
        assert_eq!(cap(&["--max-module-deletions-per-minute", "0"]), None);
        assert_eq!(cap(&["--max-module-deletions-per-minute", "60"]), Some(60));
    }

    #[test]
    fn drift_override_managers_are_none_by_default_and_a_list() {
        let managers = |flags: &[&str]| validate(flags).unwrap().drift_override_managers;
        assert!(
            managers(&[]).is_empty(),
            "a kubectl edit is not reverted unless asked"
        );
        assert_eq!(
            managers(&["--drift-override-managers=kubectl-edit,kubectl-client-side-apply"]),
            ["kubectl-edit", "kubectl-client-side-apply"]
        );
    }
}
