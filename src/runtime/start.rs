//! Starting one replica's parts: chart sources and renderer, the reconcile [`Context`], the
//! controller and its census, the fleet loop, and the admin API.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::Reporter;
use prometheus_client::registry::Registry;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::RuntimeConfig;
use crate::admin::AdminState;
use crate::apply::Cluster;
use crate::apply::catalog::CrdCatalog;
use crate::apply::identity::Tenancy;
use crate::apply::target::TargetClients;
use crate::apply::watched::{Followed, Selection};
use crate::reconcile::{Context, DeletionCap, DependencyRules, Rollouts};
use crate::render::HelmRenderer;
use crate::shard::ShardCount;
use crate::shard::fence::{Ownership, Watched};
use crate::shard::fleet::{Exit, Fleet, FleetView};
use crate::shard::label::owned_objects;
use crate::shard::membership::Members;
use crate::shard::server::{self, ServerSharding, ShardFilter};
use crate::source::{Limits, RemoteCharts};
use crate::telemetry::metrics::{Metrics, RenderMetrics};
use crate::work::controller::{Controller, ControllerConfig};

/// A malformed `--manifest-selector` fails here, with the server's message, not in a watch loop.
pub async fn check_selector(client: &kube::Client, selector: &str) -> anyhow::Result<()> {
    kube::Api::<crate::api::Manifest>::all(client.clone())
        .list_metadata(&kube::api::ListParams::default().labels(selector).limit(1))
        .await
        .map_err(|e| anyhow::anyhow!("--manifest-selector {selector:?}: {e}"))?;
    Ok(())
}

/// How the Manifest watches select this replica's shards: `--server-side-sharding`, after
/// asking the API server whether it honours `shardSelector` (unless `off`).
pub async fn shard_filter(
    client: &kube::Client,
    mode: ServerSharding,
) -> anyhow::Result<ShardFilter> {
    let honoured = match mode {
        ServerSharding::Off => None,
        ServerSharding::On => Some(server::probe(client).await.map_err(|e| {
            anyhow::anyhow!("--server-side-sharding: probing the API server (a list of Manifests with a shardSelector): {e}")
        })?),
        // `auto` never stops a start: a probe that fails (the CRD not yet served, a 429 or 503,
        // another refusal text) counts as "not honoured", and the label path works everywhere.
        ServerSharding::Auto => Some(server::probe(client).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "--server-side-sharding=auto: the probe failed; using the shard label");
            false
        })),
    };
    let filter = server::decide(mode, honoured).map_err(anyhow::Error::msg)?;
    tracing::info!(?mode, ?honoured, ?filter, "shard filter");
    Ok(filter)
}

/// Where charts come from and how they are rendered.
pub struct Charts {
    renderer: HelmRenderer,
    chart_root: PathBuf,
    remote: RemoteCharts,
}

/// Starts the renderer (or checks the helm binary), resolves the chart root and opens the chart cache; logs `starting`.
pub async fn charts(config: &RuntimeConfig, metrics: RenderMetrics) -> anyhow::Result<Charts> {
    let helm_home = match &config.helm_home {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("module-manager-helm-{}", std::process::id())),
    };
    let limits = config.render_limits;
    let backend = config.render_backend.clone();
    let renderer = HelmRenderer::start(backend, helm_home, limits, metrics).await?;
    let chart_root = config.chart_root.canonicalize()?;
    let chart_cache = &config.remote.cache_dir;
    tracing::info!(replica = %config.replica, helm = renderer.version(), render_backend = renderer.backend(), chart_root = %chart_root.display(), chart_cache = %chart_cache.display(), "starting");
    let remote = RemoteCharts::new(config.remote.clone())?;
    Ok(Charts {
        renderer,
        chart_root,
        remote,
    })
}

/// A started replica: what the shutdown sequence stops, in order.
pub struct Replica {
    /// The controller, not running yet: it runs until the shutdown signal.
    pub controller: Controller,
    /// Publishes the Manifest census every few seconds.
    pub census: JoinHandle<()>,
    /// Tells the fleet loop to stop.
    pub stop_fleet: oneshot::Sender<()>,
    /// The fleet loop, and how it ended.
    pub fleet: JoinHandle<(Fleet, Exit)>,
}

/// Builds the reconcile context, the controller and the fleet loop, starts the census, the
/// fleet loop and the admin API.
pub async fn start(
    config: RuntimeConfig,
    client: kube::Client,
    charts: Charts,
    metrics: Metrics,
    registry: Registry,
    shard_filter: ShardFilter,
) -> anyhow::Result<Replica> {
    let controller_config = ControllerConfig {
        concurrency: config.concurrency,
        target_passes: config.target_passes,
        drain_timeout: config.drain_timeout,
        selector: config.manifest_selector.clone(),
        metrics: metrics.queue.clone(),
        ..Default::default()
    };
    let ownership = Ownership::counting_lapses(metrics.fleet.fence_lapses.clone());
    let controller_ownership = if config.fault_ignore_ownership {
        tracing::error!(
            "--fault-ignore-ownership: reconciling every Manifest regardless of shard ownership (fault injection for tests)"
        );
        Ownership::everything()
    } else {
        ownership.clone()
    };
    let selection = object_selection(config.fleet.shards, &controller_ownership);
    let ctx = context(
        &config,
        client.clone(),
        charts,
        &metrics,
        selection,
        shard_filter,
    )
    .await?;
    let synced = controller_config.synced.clone();
    let census_ownership = controller_ownership.clone();
    let controller = Controller::new(ctx, controller_config, controller_ownership);
    let work = controller.work();
    let census = tokio::spawn(crate::work::census::publish_census(
        work.clone(),
        census_ownership,
        metrics.manifests,
        Duration::from_secs(5),
    ));
    let views = Views::new();
    let fleet = Fleet::new(
        client.clone(),
        config.fleet,
        ownership,
        Arc::new(work.clone()),
        metrics.fleet,
        views.fleet_tx,
        views.members_tx,
        views.drain_rx,
    );
    let (stop_fleet, fleet) = spawn_fleet(fleet);
    let admin = AdminState {
        registry: Arc::new(registry),
        synced,
        members: views.members,
        fleet: views.fleet,
        work: Some(work),
        drain: views.drain_tx,
        client: Some(client),
        reviews: Arc::default(),
        manifest_selector: config.manifest_selector.clone(),
        target_budget: config.targets.budget,
    };
    serve_admin(config.admin_address, admin).await?;
    Ok(Replica {
        controller,
        census,
        stop_fleet,
        fleet,
    })
}

/// The reconcile context: the local cluster, remote target clients, renderer and chart sources.
async fn context(
    config: &RuntimeConfig,
    client: kube::Client,
    charts: Charts,
    metrics: &Metrics,
    selection: Selection,
    shard_filter: ShardFilter,
) -> anyhow::Result<Arc<Context>> {
    let reporter = Reporter {
        controller: "module-manager".into(),
        instance: Some(config.replica.clone()),
    };
    let catalog = crds(&client).await;
    let followed = Followed::new(client.clone(), selection);
    let targets = TargetClients::new(config.targets, metrics.target.clone());
    Ok(Arc::new(Context {
        cluster: Cluster::connect(client.clone())
            .await?
            .with_catalog(Some(catalog.clone()))
            .with_followed(Some(followed.clone())),
        deletions: DeletionCap::new(
            config.max_module_deletions_per_minute,
            targets.share().clone(),
            (
                metrics.reconcile.deletions_delayed.clone(),
                metrics.reconcile.deletions_waiting.clone(),
            ),
        ),
        targets,
        rollouts: Rollouts {
            namespace: config.fleet.membership.namespace.clone(),
            fleet: config.fleet.membership.fleet.clone(),
            settings: config.rollouts,
            check_every: config.rollout_check,
            spread: config.upgrade_spread,
        },
        reporter,
        client,
        renderer: charts.renderer,
        chart_root: charts.chart_root,
        chart_limits: Limits::default(),
        remote_charts: charts.remote,
        replica: config.replica.clone(),
        shards: config.fleet.shards,
        shard_filter,
        metrics: metrics.reconcile.clone(),
        hook_timeout: config.hook_timeout,
        tenancy: tenancy(config)
            .await?
            .with_catalog(Some(catalog))
            .with_followed(Some(followed))
            .with_requests(metrics.api.clone()),
        pass_limits: config.pass_limits,
        written: Default::default(),
        dependencies: DependencyRules {
            cross_namespace: config.cross_namespace_dependencies,
        },
        drift_override_managers: config.drift_override_managers.clone(),
        queue: Default::default(),
    }))
}

/// How long the owned shards must hold still before the object watches follow them.
const SELECTION_SETTLE: Duration = Duration::from_secs(1);

/// What the watches behind cheap drift passes select: the objects of the shards `ownership`
/// dispatches, each stamped with its Manifest's shard (docs/reconcile.md, "Cheap drift passes").
fn object_selection(shards: ShardCount, ownership: &Ownership) -> Selection {
    let mut owned = ownership.subscribe();
    let selected = |now: &Watched| owned_objects(now.shards.clone());
    let (changes, receiver) = watch::channel(selected(&owned.borrow_and_update()));
    tokio::spawn(async move {
        while owned.changed().await.is_ok() {
            // Shards are taken and given up in rounds (a scale-out, a drain): the watches follow
            // once the set has held still for a moment, not each round — a growing set lists
            // every kind again.
            while let Ok(Ok(())) = tokio::time::timeout(SELECTION_SETTLE, owned.changed()).await {}
            let next = selected(&owned.borrow_and_update());
            // Only a change of the shards moves the watches, not one of `Watched::losses`: a
            // shard lost and taken back between two looks was selected all along.
            changes.send_if_modified(|now| {
                let changed = *now != next;
                *now = next;
                changed
            });
        }
    });
    Selection {
        shard_of: Box::new(move |uid| shards.shard_of(uid)),
        selected: receiver,
    }
}

/// The local cluster's CRD catalog, followed by a watch; waits (bounded) for its first list, so
/// that the first renders already use it (until then, renders use discovery alone).
async fn crds(client: &kube::Client) -> Arc<CrdCatalog> {
    const FIRST_LIST: Duration = Duration::from_secs(30);
    let catalog = CrdCatalog::watch(client.clone());
    if tokio::time::timeout(FIRST_LIST, catalog.synced())
        .await
        .is_err()
    {
        tracing::warn!(
            "CustomResourceDefinitions not listed within {FIRST_LIST:?}: rendering with discovery alone until they are"
        );
    }
    catalog
}

/// Impersonation from the operator's own connection settings (inferred as the client's were),
/// the ServiceAccount flags, and what is protected: the fleet's Lease namespace, the pod's own
/// namespace (`POD_NAMESPACE`, when set: the StatefulSet sets it), and Leases carrying the
/// fleet's labels.
async fn tenancy(config: &RuntimeConfig) -> anyhow::Result<Tenancy> {
    use crate::shard::membership::{FLEET_LABEL, LEASE_KIND_LABEL};
    let base = kube::Config::infer().await?;
    let mut namespaces = vec![config.fleet.membership.namespace.clone()];
    if let Ok(own) = std::env::var("POD_NAMESPACE")
        && !own.is_empty()
        && !namespaces.contains(&own)
    {
        namespaces.push(own);
    }
    tracing::info!(protected = ?namespaces, default_service_account = ?config.service_accounts.default, require_service_account = config.service_accounts.required, "tenancy");
    let protected = crate::plan::tenancy::Protected {
        namespaces,
        lease_labels: vec![FLEET_LABEL.to_owned(), LEASE_KIND_LABEL.to_owned()],
    };
    Ok(Tenancy::new(
        Some(base),
        config.service_accounts.clone(),
        protected,
    ))
}

/// The channels between the fleet loop and the admin API.
struct Views {
    fleet_tx: watch::Sender<FleetView>,
    fleet: watch::Receiver<FleetView>,
    members_tx: watch::Sender<Members>,
    members: watch::Receiver<Members>,
    drain_tx: watch::Sender<bool>,
    drain_rx: watch::Receiver<bool>,
}

impl Views {
    fn new() -> Self {
        let (fleet_tx, fleet) = watch::channel(FleetView::default());
        let (members_tx, members) = watch::channel(Members::default());
        let (drain_tx, drain_rx) = watch::channel(false);
        Self {
            fleet_tx,
            fleet,
            members_tx,
            members,
            drain_tx,
            drain_rx,
        }
    }
}

/// Runs the fleet loop in a task until the sender is used (or dropped).
fn spawn_fleet(mut fleet: Fleet) -> (oneshot::Sender<()>, JoinHandle<(Fleet, Exit)>) {
    let (stop_fleet, fleet_stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let exit = fleet
            .run(async move {
                let _ = fleet_stopped.await;
            })
            .await;
        (fleet, exit)
    });
    (stop_fleet, task)
}

/// Binds the admin API's address and serves it in a task.
async fn serve_admin(address: std::net::SocketAddr, admin: AdminState) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(address = %address, "admin API listening");
    tokio::spawn(async move {
        let limits = crate::admin::ServeLimits::default();
        if let Err(e) = crate::admin::serve(listener, crate::admin::router(admin), limits).await {
            tracing::error!("admin API stopped: {e}");
        }
    });
    Ok(())
}
