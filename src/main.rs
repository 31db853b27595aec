//! The `module-manager` command line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kube::runtime::events::Reporter;
use module_manager::admin::AdminState;
use module_manager::apply::Cluster;
use module_manager::apply::target::{TargetClients, TargetSettings};
use module_manager::reconcile::Context;
use module_manager::render::{HelmRenderer, RenderLimits};
use module_manager::shard::ShardCount;
use module_manager::shard::fence::Ownership;
use module_manager::shard::fleet::{Fleet, FleetConfig, FleetView};
use module_manager::shard::membership::{Members, MembershipConfig};
use module_manager::source::{Limits, RemoteCharts, RemoteConfig};
use module_manager::telemetry::metrics::Metrics;
use module_manager::telemetry::{self, LogFormat};
use module_manager::work::controller::{Controller, ControllerConfig};

#[derive(Parser)]
#[command(name = "module-manager", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the Manifest CustomResourceDefinition as YAML.
    Crd,
    /// Run the operator: reconcile every Manifest of the cluster in $KUBECONFIG (or in-cluster).
    Run(Box<RunArgs>),
    /// Ask a replica's admin API and print the answer as a table.
    Admin {
        /// The replica's admin API.
        #[arg(long, default_value = "http://127.0.0.1:9440", global = true)]
        url: String,
        #[command(subcommand)]
        view: AdminView,
    },
}

#[derive(Subcommand)]
enum AdminView {
    /// The fleet's members and whether each is live.
    Members,
    /// Every shard (owner, desired owner, state, epoch, Manifests, queued), then per member.
    Shards,
    /// One shard.
    Shard {
        /// The shard number.
        shard: u32,
    },
    /// The replica's queue per shard, then every member's published load.
    Queue,
    /// One Manifest: UID, shard, owner, state.
    Manifest {
        /// The Manifest's namespace.
        namespace: String,
        /// The Manifest's name.
        name: String,
    },
    /// Make the replica hand every shard over and take none (`POST /v1/drain`).
    Drain(AdminToken),
    /// Let the replica take shards again (`DELETE /v1/drain`).
    Undrain(AdminToken),
}

#[derive(clap::Args)]
struct AdminToken {
    /// Bearer token of a caller allowed to `post`/`delete` the non-resource URL `/v1/drain`.
    #[arg(long, env = "MODULE_MANAGER_TOKEN", hide_env_values = true)]
    token: String,
}

#[derive(clap::Args)]
#[command(args_override_self = true)] // a later flag wins (e.g. extra args after a chart's defaults)
struct RunArgs {
    /// This replica's name (unique in its fleet: the pod name), written to `status.owner` and
    /// Events. No default: two processes with one name would both hold its shards.
    #[arg(long, env = "POD_NAME")]
    replica: String,
    /// Directory that local chart paths (`spec.chart.path`) resolve under; paths leaving it are
    /// refused. Required: a default such as the working directory could be `/`.
    #[arg(long)]
    chart_root: PathBuf,
    /// Directory of the chart archives fetched from Helm repositories and OCI registries,
    /// verified and kept by digest; `module-manager-charts` in the temporary directory when
    /// omitted.
    #[arg(long, env = "MODULE_MANAGER_CHART_CACHE")]
    chart_cache_dir: Option<PathBuf>,
    /// Most bytes of archives kept in the chart cache; the least recently used go first.
    #[arg(long, default_value_t = 1024 * 1024 * 1024)]
    chart_cache_max_bytes: u64,
    /// Limit on fetching one remote chart (index or manifest, archive, checks), in seconds.
    #[arg(long, default_value_t = 60)]
    chart_fetch_timeout_seconds: u64,
    /// An OCI registry (`host` or `host:port`) to pull from over plain HTTP; repeatable.
    /// Loopback registries always are; every other one needs HTTPS.
    #[arg(long = "insecure-registry")]
    insecure_registries: Vec<String>,
    /// The helm binary.
    #[arg(long, env = "MODULE_MANAGER_HELM", default_value = "helm")]
    helm: PathBuf,
    /// Private helm home (cache, config, data); a temporary directory when omitted.
    #[arg(long)]
    helm_home: Option<PathBuf>,
    /// Most reconciles at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Limit on one helm render, in seconds.
    #[arg(long, default_value_t = 30)]
    render_timeout_seconds: u64,
    /// How long a hook (a Job or Pod run by `helm.sh/hook`) may run before it counts as
    /// failed, in seconds, unless its `modulemanager.io/hook-timeout` annotation says otherwise.
    #[arg(long, default_value_t = 300)]
    hook_timeout_seconds: u64,
    /// Number of virtual shards (a power of two); the same in every replica of a fleet.
    #[arg(long, default_value_t = 256, value_parser = parse_shards)]
    shards: u32,
    /// Fleet name: replicas of one fleet share the shards; Leases are named and labelled by it.
    #[arg(long, default_value = "module-manager")]
    fleet: String,
    /// Namespace of the fleet's Leases.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// A member whose Lease is unchanged this long is dead.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// How often a replica renews its Lease.
    #[arg(long, default_value_t = 5)]
    renew_interval_seconds: u64,
    /// A replica whose last successful renewal is older than this stops all work (less than
    /// the lease duration: the margin covers a write already under way).
    #[arg(long, default_value_t = 10)]
    renew_deadline_seconds: u64,
    /// How long the others keep the shards of a replica that restarts gracefully while its
    /// ordinal is still desired (rolling update: zero moves).
    #[arg(long, default_value_t = 60)]
    restart_grace_seconds: u64,
    /// How long a leaving replica tries to hand its shards over before it exits.
    #[arg(long, default_value_t = 10)]
    handover_timeout_seconds: u64,
    /// The StatefulSet (in the Lease namespace) whose `spec.replicas` says which ordinals are
    /// desired: members are `<name>-<ordinal>`; a graceful shutdown of a desired ordinal is a
    /// restart, of any other a scale-down. Without it every live member counts and a shutdown
    /// always hands over.
    #[arg(long, env = "STATEFULSET_NAME")]
    statefulset: Option<String>,
    /// Reconcile only Manifests matching this label selector (e.g. `team=payments`), so that
    /// several fleets can split the Manifests without overlap.
    #[arg(long)]
    manifest_selector: Option<String>,
    /// How long shutdown waits for reconciles in flight.
    #[arg(long, default_value_t = 10)]
    drain_timeout_seconds: u64,
    /// Fault injection for tests of the overlap checker: reconcile every Manifest, ignoring
    /// shard ownership. Never use it in a fleet.
    #[arg(long, hide = true)]
    fault_ignore_ownership: bool,
    /// Remote targets (`spec.target`): timeout of a connection (TCP and TLS handshake), in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    target_connect_timeout_seconds: u64,
    /// Remote targets: timeout of reading or writing a request, in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=300))]
    target_request_timeout_seconds: u64,
    /// Remote targets: most clients cached at once (one per kubeconfig Secret key; the least
    /// recently used is dropped first).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65536))]
    target_clients: u64,
    /// Address of the admin API (`/livez`, `/readyz`, `/metrics`).
    #[arg(long, default_value = "127.0.0.1:9440")]
    admin_address: std::net::SocketAddr,
    /// Log format.
    #[arg(long, value_enum, default_value = "json")]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => print!("{}", module_manager::api::manifest_crd_yaml()),
        Command::Run(args) => run(*args).await?,
        Command::Admin { url, view } => {
            use axum::http::Method;
            use module_manager::admin::{self, fetch, is_dns_label, is_dns_subdomain};
            let url = url.as_str();
            let answer = match view {
                AdminView::Members => {
                    admin::members_table(&fetch(url, Method::GET, "/v1/members", None).await?)
                }
                AdminView::Shards => {
                    admin::shards_table(&fetch(url, Method::GET, "/v1/shards", None).await?)
                }
                AdminView::Shard { shard } => admin::shard_table(
                    &fetch(url, Method::GET, &format!("/v1/shards/{shard}"), None).await?,
                ),
                AdminView::Queue => {
                    admin::queue_table(&fetch(url, Method::GET, "/v1/queue", None).await?)
                }
                AdminView::Manifest { namespace, name } => {
                    anyhow::ensure!(
                        is_dns_label(&namespace) && is_dns_subdomain(&name),
                        "not a Manifest's namespace and name: {namespace:?} {name:?}"
                    );
                    let path = format!("/v1/manifests/{namespace}/{name}");
                    admin::manifest_table(&fetch(url, Method::GET, &path, None).await?)
                }
                AdminView::Drain(AdminToken { token }) => admin::drain_table(
                    &fetch(url, Method::POST, admin::DRAIN_PATH, Some(&token)).await?,
                ),
                AdminView::Undrain(AdminToken { token }) => admin::drain_table(
                    &fetch(url, Method::DELETE, admin::DRAIN_PATH, Some(&token)).await?,
                ),
            };
            print!("{answer}");
        }
    }
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    telemetry::init(args.log_format);
    anyhow::ensure!(
        args.renew_interval_seconds >= 1
            && args.renew_interval_seconds * 2 <= args.lease_duration_seconds,
        "--renew-interval-seconds must be at least 1 and at most half of --lease-duration-seconds"
    );
    anyhow::ensure!(
        args.renew_deadline_seconds > args.renew_interval_seconds
            && args.renew_deadline_seconds < args.lease_duration_seconds,
        "--renew-deadline-seconds must be longer than --renew-interval-seconds and shorter than --lease-duration-seconds"
    );
    let client = kube::Client::try_default().await?;
    // Every permission the code uses, asked before anything starts: one error lists what is missing.
    module_manager::runtime::preflight::check(
        &client,
        module_manager::runtime::preflight::Config {
            fleet_namespace: &args.lease_namespace,
            statefulset: args.statefulset.as_deref(),
        },
    )
    .await?;
    let helm_home = match args.helm_home {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("module-manager-helm-{}", std::process::id())),
    };
    let limits = RenderLimits {
        timeout: Duration::from_secs(args.render_timeout_seconds),
        ..Default::default()
    };

    let mut registry = module_manager::telemetry::metrics::registry();
    let Metrics {
        reconcile: reconcile_metrics,
        render: render_metrics,
        queue: queue_metrics,
        fleet: fleet_metrics,
        manifests: manifest_metrics,
        target: target_metrics,
    } = Metrics::register(&mut registry);
    let config = ControllerConfig {
        concurrency: args.concurrency,
        drain_timeout: Duration::from_secs(args.drain_timeout_seconds),
        selector: args.manifest_selector.clone(),
        metrics: queue_metrics,
        ..Default::default()
    };
    if let Some(selector) = &args.manifest_selector {
        // A malformed selector fails here, with the server's message, not in a watch loop.
        kube::Api::<module_manager::api::Manifest>::all(client.clone())
            .list_metadata(&kube::api::ListParams::default().labels(selector).limit(1))
            .await
            .map_err(|e| anyhow::anyhow!("--manifest-selector {selector:?}: {e}"))?;
    }

    let renderer = HelmRenderer::new(args.helm.clone(), helm_home, limits, render_metrics).await?;
    let chart_root = args.chart_root.canonicalize()?;
    let chart_cache = args
        .chart_cache_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("module-manager-charts"));
    tracing::info!(replica = %args.replica, helm = renderer.version(), chart_root = %chart_root.display(), chart_cache = %chart_cache.display(), "starting");
    let remote_charts = RemoteCharts::new(RemoteConfig {
        cache_max_bytes: args.chart_cache_max_bytes,
        timeout: Duration::from_secs(args.chart_fetch_timeout_seconds.max(1)),
        insecure_registries: args.insecure_registries.clone(),
        ..RemoteConfig::new(chart_cache)
    })?;

    if let Some(name) = &args.statefulset {
        // A StatefulSet that cannot be read, or a replica that is not one of its ordinals, would
        // leave the fleet idle without a word: refuse to start instead.
        let statefulsets = kube::Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(
            client.clone(),
            &args.lease_namespace,
        );
        statefulsets.get(name).await.map_err(|e| {
            anyhow::anyhow!(
                "--statefulset {name} in namespace {}: {e}",
                args.lease_namespace
            )
        })?;
        let any_ordinal = module_manager::shard::fleet::DesiredOrdinals {
            name: name.clone(),
            replicas: u32::MAX,
        };
        anyhow::ensure!(
            any_ordinal.desires(&args.replica),
            "--replica {:?} is not an ordinal of StatefulSet {name} (expected {name}-<n>)",
            args.replica
        );
    }
    let fleet_config = FleetConfig {
        membership: MembershipConfig {
            namespace: args.lease_namespace,
            fleet: args.fleet,
            replica: args.replica.clone(),
            lease_duration: Duration::from_secs(args.lease_duration_seconds),
            renew_interval: Duration::from_secs(args.renew_interval_seconds),
        },
        shards: ShardCount::new(args.shards).expect("validated by parse_shards"),
        renew_deadline: Duration::from_secs(args.renew_deadline_seconds),
        restart_grace: Duration::from_secs(args.restart_grace_seconds),
        statefulset: args.statefulset,
        handover_timeout: Duration::from_secs(args.handover_timeout_seconds),
    };

    let reporter = Reporter {
        controller: "module-manager".into(),
        instance: Some(args.replica.clone()),
    };
    let ctx = Arc::new(Context {
        cluster: Cluster::connect(client.clone()).await?,
        targets: TargetClients::new(
            TargetSettings {
                max_clients: args.target_clients as usize,
                connect_timeout: Duration::from_secs(args.target_connect_timeout_seconds),
                request_timeout: Duration::from_secs(args.target_request_timeout_seconds),
                ..Default::default()
            },
            target_metrics,
        ),
        reporter,
        client: client.clone(),
        renderer,
        chart_root,
        chart_limits: Limits::default(),
        remote_charts,
        replica: args.replica,
        shards: fleet_config.shards,
        metrics: reconcile_metrics,
        hook_timeout: Duration::from_secs(args.hook_timeout_seconds),
    });
    let ownership = Ownership::new();
    let controller_ownership = if args.fault_ignore_ownership {
        tracing::error!(
            "--fault-ignore-ownership: reconciling every Manifest regardless of shard ownership (fault injection for tests)"
        );
        Ownership::everything()
    } else {
        ownership.clone()
    };
    let synced = config.synced.clone();
    let census_ownership = controller_ownership.clone();
    let controller = Controller::new(ctx, config, controller_ownership);
    let work = controller.work();
    let census = tokio::spawn(module_manager::work::controller::publish_census(
        work.clone(),
        census_ownership,
        manifest_metrics,
        Duration::from_secs(5),
    ));

    let (fleet_tx, fleet_view) = tokio::sync::watch::channel(FleetView::default());
    let (members_tx, members) = tokio::sync::watch::channel(Members::default());
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    let mut fleet = Fleet::new(
        client.clone(),
        fleet_config,
        ownership,
        Arc::new(work.clone()),
        fleet_metrics,
        fleet_tx,
        members_tx,
        drain_rx,
    );
    let (stop_fleet, fleet_stopped) = tokio::sync::oneshot::channel::<()>();
    let fleet_task = tokio::spawn(async move {
        let exit = fleet
            .run(async move {
                let _ = fleet_stopped.await;
            })
            .await;
        (fleet, exit)
    });

    let admin = AdminState {
        registry: Arc::new(registry),
        synced,
        members,
        fleet: fleet_view,
        work: Some(work),
        drain: drain_tx,
        client: Some(client),
    };
    let listener = tokio::net::TcpListener::bind(args.admin_address).await?;
    tracing::info!(address = %args.admin_address, "admin API listening");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, module_manager::admin::router(admin)).await {
            tracing::error!("admin API stopped: {e}");
        }
    });

    // SIGTERM: the controller stops dispatching and drains its passes; then the fleet loop
    // either keeps the shards (restart) or hands them over (leave).
    controller.run(shutdown_signal()).await?;
    census.abort();
    let _ = stop_fleet.send(());
    let (mut fleet, exit) = fleet_task.await?;
    fleet.exit(exit).await;
    tracing::info!(?exit, "stopped");
    Ok(())
}

fn parse_shards(text: &str) -> Result<u32, String> {
    let count: u32 = text.parse().map_err(|e| format!("{e}"))?;
    ShardCount::new(count)
        .map(ShardCount::get)
        .ok_or_else(|| "a power of two from 1 to 65536".to_owned())
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
