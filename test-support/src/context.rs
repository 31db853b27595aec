//! A reconcile [`Context`] for in-process tests and the bench: test defaults, a few overrides.

use std::path::{Path, PathBuf};

use kube::Client;
use kube::runtime::events::Reporter;
use module_manager::apply::Cluster;
use module_manager::apply::identity::Tenancy;
use module_manager::apply::target::TargetClients;
use module_manager::apply::watched::{Followed, Selection};
use module_manager::reconcile::{Context, PassLimits};
use module_manager::render::{Backend, HelmRenderer, RenderLimits};
use module_manager::shard::label::owned_objects;
use module_manager::source::{Limits, RemoteCharts, RemoteConfig};

/// The replica name tests run as unless [`ContextBuilder::replica`] says otherwise.
pub const REPLICA: &str = "test-replica";

/// Builds a [`Context`]; start with [`context`].
pub struct ContextBuilder {
    client: Client,
    helm_home: PathBuf,
    chart_cache: PathBuf,
    render_limits: RenderLimits,
    backend: Option<Backend>,
    targets: TargetClients,
    replica: String,
    tenancy: Tenancy,
    pass_limits: PassLimits,
    cross_namespace_dependencies: bool,
    drift_override_managers: Vec<String>,
    selection: Option<Selection>,
}

/// The backend tests render with unless told otherwise: `$MODULE_MANAGER_TEST_RENDER_BACKEND`
/// (`renderer` or `helm`), else the renderer; the binaries from `testenv::Tools`.
pub fn render_backend() -> anyhow::Result<Backend> {
    let tools = testenv::Tools::locate()?;
    match std::env::var("MODULE_MANAGER_TEST_RENDER_BACKEND").as_deref() {
        Ok("renderer") | Err(_) => Ok(Backend::Renderer(tools.renderer)),
        Ok("helm") => Ok(Backend::Helm(tools.helm)),
        Ok(other) => {
            anyhow::bail!("MODULE_MANAGER_TEST_RENDER_BACKEND={other}: not renderer or helm")
        }
    }
}

/// A Context on `client` whose helm home is `helm_home`. Defaults: the real helm or renderer
/// ([`render_backend`]), chart root [`repo`](crate::repo), default chart and render limits, the remote-chart
/// cache in `<helm_home>/charts`, default target clients, replica [`REPLICA`] (also the Events'
/// reporting instance, controller `module-manager`), the default shard count, the
/// default hook timeout, fresh metrics.
pub fn context(client: Client, helm_home: &Path) -> ContextBuilder {
    ContextBuilder {
        client,
        helm_home: helm_home.to_owned(),
        chart_cache: helm_home.join("charts"),
        render_limits: RenderLimits::default(),
        backend: None,
        targets: TargetClients::default(),
        replica: REPLICA.to_owned(),
        tenancy: Tenancy::default(),
        pass_limits: PassLimits::default(),
        selection: None,
        cross_namespace_dependencies: true,
        drift_override_managers: Vec::new(),
    }
}

impl ContextBuilder {
    /// The replica name (`status.owner`, and the Events' reporting instance).
    pub fn replica(mut self, replica: &str) -> Self {
        self.replica = replica.to_owned();
        self
    }

    /// Where remote charts are cached (default `<helm_home>/charts`).
    pub fn chart_cache(mut self, dir: &Path) -> Self {
        self.chart_cache = dir.to_owned();
        self
    }

    /// The renderer's limits.
    pub fn render_limits(mut self, limits: RenderLimits) -> Self {
        self.render_limits = limits;
        self
    }

    /// The render backend (default [`render_backend`]).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// The clients of remote targets (e.g. with short timeouts).
    pub fn targets(mut self, targets: TargetClients) -> Self {
        self.targets = targets;
        self
    }

    /// Who the module's objects are written as, and what is protected (default: the
    /// operator's client, no impersonation, nothing protected).
    pub fn tenancy(mut self, tenancy: Tenancy) -> Self {
        self.tenancy = tenancy;
        self
    }

    /// The pass deadline and the caps on a render (default [`PassLimits::default`]).
    pub fn pass_limits(mut self, limits: PassLimits) -> Self {
        self.pass_limits = limits;
        self
    }

    /// Whether `spec.dependsOn` may name another namespace (default: yes;
    /// `--no-cross-namespace-dependencies` is `false`).
    pub fn cross_namespace_dependencies(mut self, allowed: bool) -> Self {
        self.cross_namespace_dependencies = allowed;
        self
    }

    /// `--drift-override-managers` (default: none).
    pub fn drift_override_managers(mut self, managers: &[&str]) -> Self {
        self.drift_override_managers = managers.iter().map(|m| (*m).to_owned()).collect();
        self
    }

    /// What the object watches behind cheap drift passes select (default [`every_shard`]: the
    /// objects of every shard, each stamped with its shard, as a replica that owns them all).
    pub fn object_selection(mut self, selection: Selection) -> Self {
        self.selection = Some(selection);
        self
    }

    /// Discovers the cluster and checks the helm binary.
    pub async fn build(self) -> anyhow::Result<Context> {
        let backend = match self.backend {
            Some(backend) => backend,
            None => render_backend()?,
        };
        let renderer = HelmRenderer::start(
            backend,
            self.helm_home,
            self.render_limits,
            Default::default(),
        )
        .await?;
        // As a replica has it (src/runtime/start.rs): drift passes skip unchanged objects.
        let selection = self.selection.unwrap_or_else(every_shard);
        let followed = Followed::new(self.client.clone(), selection);
        Ok(Context {
            cluster: Cluster::connect(self.client.clone())
                .await?
                .with_followed(Some(followed.clone())),
            client: self.client,
            targets: self.targets,
            renderer,
            chart_root: crate::repo(),
            chart_limits: Limits::default(),
            remote_charts: RemoteCharts::new(crate::local_chart_hosts(RemoteConfig::new(
                self.chart_cache,
            )))?,
            shards: module_manager::shard::ShardCount::DEFAULT,
            shard_filter: Default::default(),
            reporter: Reporter {
                controller: "module-manager".into(),
                instance: Some(self.replica.clone()),
            },
            replica: self.replica,
            metrics: Default::default(),
            hook_timeout: module_manager::plan::hooks::DEFAULT_HOOK_TIMEOUT,
            tenancy: self.tenancy.with_followed(Some(followed)),
            pass_limits: self.pass_limits,
            written: Default::default(),
            dependencies: module_manager::reconcile::DependencyRules {
                cross_namespace: self.cross_namespace_dependencies,
            },
            drift_override_managers: self.drift_override_managers,
            queue: Default::default(),
            deletions: Default::default(),
            rollouts: Default::default(),
        })
    }
}

/// The selection of a replica that owns every shard (of the default count): objects are
/// stamped with their shard, and the watches select every shard.
pub fn every_shard() -> Selection {
    let shards = module_manager::shard::ShardCount::DEFAULT;
    let (_, selected) = tokio::sync::watch::channel(owned_objects(None));
    Selection {
        shard_of: Box::new(move |uid| shards.shard_of(uid)),
        selected,
    }
}
