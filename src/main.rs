//! The `module-manager` command line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kube::runtime::events::Reporter;
use module_manager::admin::AdminState;
use module_manager::apply::Cluster;
use module_manager::chart_source::Limits;
use module_manager::controller::{self, ControllerConfig};
use module_manager::metrics::{QueueMetrics, ReconcileMetrics, RenderMetrics};
use module_manager::reconcile::Context;
use module_manager::render::{HelmRenderer, RenderLimits};
use module_manager::shard::ShardCount;
use module_manager::shard::membership::{self, Members, MembershipConfig};
use module_manager::telemetry::{self, LogFormat};

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
}

#[derive(clap::Args)]
struct RunArgs {
    /// This replica's name, written to `status.owner` and Events.
    #[arg(long, env = "POD_NAME", default_value = "module-manager-0")]
    replica: String,
    /// Directory that local chart paths (`spec.chart.path`) resolve under; paths leaving it are
    /// refused. Required: a default such as the working directory could be `/`.
    #[arg(long)]
    chart_root: PathBuf,
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
        Command::Admin {
            url,
            view: AdminView::Members,
        } => {
            print!(
                "{}",
                module_manager::admin::members_table(
                    &module_manager::admin::fetch_members(&url).await?
                )
            );
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
    let client = kube::Client::try_default().await?;
    let helm_home = match args.helm_home {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("module-manager-helm-{}", std::process::id())),
    };
    let limits = RenderLimits {
        timeout: Duration::from_secs(args.render_timeout_seconds),
        ..Default::default()
    };

    let mut registry = module_manager::metrics::registry();
    let render_metrics = RenderMetrics::register(&mut registry);
    let reconcile_metrics = ReconcileMetrics::register(&mut registry);
    let config = ControllerConfig {
        concurrency: args.concurrency,
        metrics: QueueMetrics::register(&mut registry),
        ..Default::default()
    };

    let renderer = HelmRenderer::new(args.helm.clone(), helm_home, limits, render_metrics).await?;
    let chart_root = args.chart_root.canonicalize()?;
    tracing::info!(replica = %args.replica, helm = renderer.version(), chart_root = %chart_root.display(), "starting");

    let membership = MembershipConfig {
        namespace: args.lease_namespace,
        fleet: args.fleet,
        replica: args.replica.clone(),
        lease_duration: Duration::from_secs(args.lease_duration_seconds),
        renew_interval: Duration::from_secs(args.renew_interval_seconds),
    };
    let (members_tx, members) = tokio::sync::watch::channel(Members::default());
    let (leave_tx, leave) = tokio::sync::oneshot::channel::<()>();
    let membership_task = tokio::spawn(membership::run(
        client.clone(),
        membership,
        members_tx,
        async move {
            let _ = leave.await;
        },
    ));

    let admin = AdminState {
        registry: Arc::new(registry),
        synced: config.synced.clone(),
        members,
    };
    let listener = tokio::net::TcpListener::bind(args.admin_address).await?;
    tracing::info!(address = %args.admin_address, "admin API listening");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, module_manager::admin::router(admin)).await {
            tracing::error!("admin API stopped: {e}");
        }
    });

    let reporter = Reporter {
        controller: "module-manager".into(),
        instance: Some(args.replica.clone()),
    };
    let ctx = Arc::new(Context {
        cluster: Cluster::connect(client.clone()).await?,
        reporter,
        client,
        renderer,
        chart_root,
        chart_limits: Limits::default(),
        replica: args.replica,
        shards: ShardCount::new(args.shards).expect("validated by parse_shards"),
        metrics: reconcile_metrics,
    });
    controller::run(ctx, config, shutdown_signal()).await?;
    let _ = leave_tx.send(());
    let _ = membership_task.await;
    tracing::info!("stopped");
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
