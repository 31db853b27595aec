//! Remote targets on two real control planes: the shared one of this test binary holds the
//! Manifests (the "local" cluster, where module-manager runs), a second one started here is the
//! remote target, reached through kubeconfigs stored in Secrets on the local cluster — tokens of
//! ServiceAccounts of the remote cluster, or its admin client certificate, always inline.
//!
//! No test replaces either API server: an unreachable target is a closed port or a listener that
//! never answers, a bad credential is a token the remote API server refuses.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use common::ready_condition;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};
use module_manager::apply::budget::BudgetSettings;
use module_manager::apply::target::{TargetClients, TargetSettings};
use module_manager::reconcile::Context;
use module_manager::telemetry::metrics::{TargetErrorLabels, TargetMetrics};
use module_manager::telemetry::requests::{self, ApiRequestMetrics, RequestTarget};
use module_manager::work::controller::ControllerConfig;
use serde_json::{Value, json};
use test_support::objects;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::OnceCell;

const REPLICA: &str = "test-replica";
/// A chart of one ConfigMap.
const TINY: &str = "tests/fixtures/charts/tiny";
/// A token that must never appear in a status, an Event or a log line.
const CANARY_TOKEN: &str = "canary-token-d41d8cd98f00b204";

/// How long the harness waits for a Manifest or a condition (remote passes are slower).
const PATIENCE: Duration = Duration::from_secs(90);

static REMOTE: OnceCell<testenv::ControlPlane> = OnceCell::const_new();

/// The remote cluster: a second control plane (its own directory, ports and certificates),
/// shared by the tests of this binary and stopped when it exits.
async fn remote_plane() -> &'static testenv::ControlPlane {
    REMOTE
        .get_or_init(|| async {
            let plane = testenv::ControlPlane::start(testenv::Options::default())
                .await
                .expect("remote control plane");
            // SAFETY: registering a plain extern "C" function has no preconditions.
            unsafe { libc::atexit(stop_remote) };
            plane
        })
        .await
}

extern "C" fn stop_remote() {
    if let Some(plane) = REMOTE.get() {
        plane.stop();
    }
}

/// An operator reconciling this test's namespace of the local cluster, stopped when dropped.
struct Harness {
    local: Client,
    local_plane: &'static testenv::ControlPlane,
    remote: Client,
    remote_plane: &'static testenv::ControlPlane,
    ns: String,
    manifests: Api<Manifest>,
    ctx: Arc<Context>,
    /// The operator's requests to the local cluster (its client counts them).
    local_requests: ApiRequestMetrics,
    _running: common::Running,
    _helm_home: tempfile::TempDir,
}

/// How the harness's operator treats remote targets: passes at once per target and each
/// target's request budget.
struct Tuning {
    target_passes: usize,
    budget: BudgetSettings,
    connect_timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            target_passes: 1,
            budget: BudgetSettings::default(),
            // Short: a silent target fails within seconds.
            connect_timeout: Duration::from_secs(2),
        }
    }
}

async fn start(prefix: &str) -> Harness {
    start_with(prefix, Tuning::default()).await
}

async fn start_with(prefix: &str, tuning: Tuning) -> Harness {
    let local_plane = common::control_plane_with(None).await;
    let remote_plane = remote_plane().await;
    let local = local_plane.client().await.unwrap();
    let remote = remote_plane.client().await.unwrap();
    let ns = local_plane.namespace(&local, prefix).await.unwrap();
    let helm_home = tempfile::tempdir().unwrap();
    let (ctx, local_requests, running) = operator(local_plane, &ns, &helm_home, tuning).await;
    Harness {
        manifests: Api::namespaced(local.clone(), &ns),
        local,
        local_plane,
        remote,
        remote_plane,
        ns,
        ctx,
        local_requests,
        _running: running,
        _helm_home: helm_home,
    }
}

/// A new operator process, as far as the test can tell: its own Context (no target clients, no
/// apply records), counting its requests to the local cluster, running a controller of `ns`.
async fn operator(
    local_plane: &testenv::ControlPlane,
    ns: &str,
    helm_home: &tempfile::TempDir,
    tuning: Tuning,
) -> (Arc<Context>, ApiRequestMetrics, common::Running) {
    let local_requests = ApiRequestMetrics::default();
    let config = local_plane.config().await.unwrap();
    let counted = requests::client(config, &local_requests, RequestTarget::Local).unwrap();
    let ctx = Arc::new(
        test_support::context(counted, helm_home.path())
            .replica(REPLICA)
            .targets(TargetClients::new(
                TargetSettings {
                    connect_timeout: tuning.connect_timeout,
                    request_timeout: Duration::from_secs(5),
                    budget: tuning.budget,
                    ..Default::default()
                },
                TargetMetrics::default(),
            ))
            .build()
            .await
            .unwrap(),
    );
    let config = ControllerConfig {
        concurrency: 4,
        target_passes: tuning.target_passes,
        namespace: Some(ns.to_owned()),
        ..Default::default()
    };
    let running = common::run_controller(ctx.clone(), config);
    (ctx, local_requests, running)
}

/// A field of the first cluster or user of a control plane's admin kubeconfig (testenv writes
/// every credential inline), e.g. `clusters/certificate-authority-data`.
fn admin_kubeconfig_field(plane: &testenv::ControlPlane, section: &str, field: &str) -> String {
    let text = std::fs::read_to_string(plane.kubeconfig()).unwrap();
    let config: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let entry = if section == "clusters" {
        "cluster"
    } else {
        "user"
    };
    config[section][0][entry][field]
        .as_str()
        .unwrap_or_else(|| panic!("{section} {field} in the admin kubeconfig"))
        .to_owned()
}

/// A kubeconfig for `server`, trusting `ca_data` (base64 PEM), with the given user fields.
fn kubeconfig(server: &str, ca_data: &str, user: Value) -> String {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "remote",
        "contexts": [{"name": "remote", "context": {"cluster": "remote", "user": "deployer"}}],
        "clusters": [{"name": "remote", "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": "deployer", "user": user}],
    });
    serde_yaml_ng::to_string(&config).unwrap()
}

impl Harness {
    fn remote_server(&self) -> String {
        self.remote_plane.endpoints().server.clone()
    }

    fn remote_ca(&self) -> String {
        admin_kubeconfig_field(self.remote_plane, "clusters", "certificate-authority-data")
    }

    /// A kubeconfig for the remote cluster with `user`.
    fn remote_kubeconfig(&self, user: Value) -> String {
        kubeconfig(&self.remote_server(), &self.remote_ca(), user)
    }

    /// Creates a ServiceAccount `name` on the remote cluster, bound to `cluster-admin`, and
    /// returns a kubeconfig with a token for it.
    async fn service_account_kubeconfig(&self, name: &str) -> String {
        self.remote_kubeconfig(json!({ "token": self.service_account_token(name).await }))
    }

    /// Creates a ServiceAccount `name` on the remote cluster, bound to `cluster-admin`, and
    /// returns a token for it (valid for an hour).
    async fn service_account_token(&self, name: &str) -> String {
        let grant = common::Grant::ExistingClusterRole("cluster-admin");
        common::account_token(&self.remote, "default", name, grant, &[]).await
    }

    /// Creates or replaces the Secret `name` (local cluster, this namespace) with a `kubeconfig` key.
    async fn put_secret(&self, name: &str, kubeconfig: &str) {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(
                [(
                    "kubeconfig".to_owned(),
                    ByteString(kubeconfig.as_bytes().to_vec()),
                )]
                .into(),
            ),
            ..Default::default()
        };
        let secrets = Api::<Secret>::namespaced(self.local.clone(), &self.ns);
        objects::apply(&secrets, "test", &secret).await;
    }

    /// Puts a kubeconfig of a new cluster-admin ServiceAccount `<namespace>-<account>` of the
    /// remote cluster (see [`Self::service_account_kubeconfig`]) in the Secret `remote`.
    async fn put_account_secret(&self, account: &str) {
        let kubeconfig = self
            .service_account_kubeconfig(&format!("{}-{account}", self.ns))
            .await;
        self.put_secret("remote", &kubeconfig).await;
    }

    async fn delete_secret(&self, name: &str) {
        objects::delete(
            &Api::<Secret>::namespaced(self.local.clone(), &self.ns),
            name,
        )
        .await;
    }

    /// A Manifest of `chart` targeting the cluster in Secret `secret` (`None`: local), installed
    /// into a namespace named like this test's local namespace.
    fn manifest(&self, name: &str, chart: &str, secret: Option<&str>, values: Value) -> Manifest {
        let mut spec = json!({
            "module": name,
            "chart": {"path": chart},
            "values": values,
            "interval": "2s",
        });
        if let Some(secret) = secret {
            spec["target"] = json!({"kubeconfigSecretRef": {"name": secret}});
        }
        common::manifest(&self.ns, name, spec)
    }

    /// Creates a Manifest `name` of the tiny chart (one ConfigMap) on the cluster of Secret
    /// `secret` (`None`: local).
    async fn create_tiny(&self, name: &str, secret: Option<&str>) {
        self.create(&self.manifest(name, TINY, secret, json!({})))
            .await;
    }

    async fn create(&self, manifest: &Manifest) {
        common::create_manifest(&self.manifests, manifest).await;
    }

    async fn patch_spec(&self, name: &str, spec: Value) {
        common::patch_spec(&self.manifests, name, spec).await
    }

    /// Waits until the Manifest satisfies `done` (90 s), showing its status on failure.
    async fn wait_for(&self, name: &str, what: &str, done: impl Fn(&Manifest) -> bool) -> Manifest {
        common::wait_for(&self.manifests, name, what, PATIENCE, done).await
    }

    /// Waits for the current generation to be reconciled into `state`.
    async fn wait_state(&self, name: &str, state: State) -> Manifest {
        common::wait_state(&self.manifests, name, state, PATIENCE).await
    }

    /// Waits for an `Error` whose Ready condition has `reason` and a message containing `text`.
    async fn wait_error(&self, name: &str, reason: &str, text: &str) -> Manifest {
        self.wait_for(name, &format!("Error {reason} {text:?}"), |m| {
            let status = m.status.clone().unwrap_or_default();
            status.state == Some(State::Error)
                && ready_condition(m)
                    .is_some_and(|(r, message)| r == reason && message.contains(text))
        })
        .await
    }

    async fn wait_until(&self, what: &str, done: impl AsyncFnMut() -> bool) {
        common::wait_until(what, PATIENCE, done).await;
    }

    /// Stops the operator, waits until its last pass has sent its last request to the target,
    /// then runs `before` (what happens while no operator runs) and starts a new one (with the
    /// default [`Tuning`]): a restart, with nothing kept in memory.
    async fn restart(&mut self, before: impl AsyncFnOnce()) {
        drop(std::mem::replace(
            &mut self._running,
            common::Running::stopped(),
        ));
        let requests = self.ctx.targets.metrics().requests.clone();
        let sent = || requests.sum(|_| true);
        let mut last = (sent(), Instant::now());
        self.wait_until("the stopped operator sends nothing more", async || {
            if sent() != last.0 {
                last = (sent(), Instant::now());
            }
            last.1.elapsed() >= Duration::from_secs(3)
        })
        .await;
        before().await;
        let (ctx, local_requests, running) = operator(
            self.local_plane,
            &self.ns,
            &self._helm_home,
            Tuning::default(),
        )
        .await;
        (self.ctx, self.local_requests, self._running) = (ctx, local_requests, running);
    }

    async fn delete_and_wait(&self, name: &str) {
        common::delete_and_wait(&self.manifests, name, PATIENCE).await;
    }

    /// ConfigMap `name` in the namespace named like this test's, on the remote cluster.
    async fn remote_config_map(&self, name: &str) -> Option<ConfigMap> {
        Api::<ConfigMap>::namespaced(self.remote.clone(), &self.ns)
            .get_opt(name)
            .await
            .unwrap()
    }

    /// Names of the ConfigMaps in this test's namespace on the local cluster.
    async fn local_config_maps(&self) -> Vec<String> {
        objects::names(&Api::<ConfigMap>::namespaced(self.local.clone(), &self.ns)).await
    }

    /// The `key` of the ConfigMap `name` on the remote cluster (which must exist).
    async fn remote_data(&self, name: &str, key: &str) -> Option<String> {
        data(&self.remote_config_map(name).await.unwrap(), key)
    }

    async fn remote_namespace_exists(&self) -> bool {
        Api::<Namespace>::all(self.remote.clone())
            .get_opt(&self.ns)
            .await
            .unwrap()
            .is_some()
    }

    /// Events about `manifest` as (type, reason, note).
    async fn events(&self, manifest: &str) -> Vec<(String, String, String)> {
        common::events(&self.local, &self.ns, manifest).await
    }

    /// Waits until the watch of the Secrets' versions shows Secret `name` as it is now.
    async fn wait_until_watched(&self, name: &str) {
        let secret = Api::<Secret>::namespaced(self.local.clone(), &self.ns)
            .get(name)
            .await
            .unwrap();
        let watched = self.ctx.targets.watched_secrets();
        self.wait_until("the watch shows the Secret's version", async || {
            watched
                .known(&self.ns, name)
                .is_some_and(|f| Some(f.resource_version) == secret.resource_version())
        })
        .await;
    }

    fn target_errors(&self, reason: &'static str) -> u64 {
        self.ctx
            .targets
            .metrics()
            .errors
            .get_or_create(&TargetErrorLabels { reason })
            .get()
    }

    /// `module_manager_target_drift_listings_total` for `outcome`.
    fn listings(&self, outcome: &'static str) -> u64 {
        let metrics = self.ctx.targets.metrics();
        let labels = module_manager::telemetry::metrics::ListingLabels { outcome };
        metrics.drift_listings.get_or_create(&labels).get()
    }
}

/// The Ready condition's (reason, message).
/// Whether the Manifest's status says its error is permanent (condition Stalled=True).
fn stalled(manifest: &Manifest) -> bool {
    manifest.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Stalled" && c.status == "True")
    })
}

fn data(config_map: &ConfigMap, key: &str) -> Option<String> {
    config_map.data.as_ref()?.get(key).cloned()
}

fn inventory(manifest: &Manifest) -> Vec<String> {
    manifest
        .status
        .as_ref()
        .map(|s| {
            s.inventory
                .iter()
                .map(|e| format!("{}/{}/{}", e.kind, e.namespace, e.name))
                .collect()
        })
        .unwrap_or_default()
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn a_module_is_installed_upgraded_repaired_and_deleted_on_the_remote_cluster_only() {
    let h = start("remote-lifecycle").await;
    h.put_account_secret("deployer").await;
    h.create(&h.manifest(
        "catalog",
        "examples/charts/catalog-v1",
        Some("remote"),
        json!({"greeting": "hi"}),
    ))
    .await;
    let installed = h.wait_state("catalog", State::Ready).await;
    let uid = installed.uid().unwrap();
    assert_eq!(
        inventory(&installed),
        [
            format!("ConfigMap/{}/catalog-legacy-settings", h.ns),
            format!("ConfigMap/{}/catalog-settings", h.ns),
        ],
        "the inventory lists the objects on the target"
    );
    // On the remote cluster: the namespace (created there) and the objects, labelled.
    let settings = h
        .remote_config_map("catalog-settings")
        .await
        .expect("on the remote");
    assert_eq!(data(&settings, "greeting").as_deref(), Some("hi"));
    assert_eq!(
        settings.labels().get("modulemanager.io/manifest-uid"),
        Some(&uid)
    );
    assert!(
        h.remote_config_map("catalog-legacy-settings")
            .await
            .is_some()
    );
    // On the local cluster: nothing but the Manifest and its status.
    assert_eq!(h.local_config_maps().await, Vec::<String>::new());

    // Upgrade: version 2 changes one object and drops the other, on the remote cluster.
    h.patch_spec(
        "catalog",
        json!({"chart": {"path": "examples/charts/catalog-v2"}, "values": {"greeting": "hello again"}}),
    )
    .await;
    let upgraded = h.wait_state("catalog", State::Ready).await;
    assert_eq!(
        inventory(&upgraded),
        [format!("ConfigMap/{}/catalog-settings", h.ns)]
    );
    let settings = h.remote_config_map("catalog-settings").await.unwrap();
    assert_eq!(data(&settings, "version").as_deref(), Some("2"));
    assert_eq!(data(&settings, "greeting").as_deref(), Some("hello again"));
    assert!(
        h.remote_config_map("catalog-legacy-settings")
            .await
            .is_none(),
        "pruned on the remote cluster"
    );
    assert_eq!(h.local_config_maps().await, Vec::<String>::new());

    // Drift on the remote cluster is repaired there.
    objects::delete(
        &Api::<ConfigMap>::namespaced(h.remote.clone(), &h.ns),
        "catalog-settings",
    )
    .await;
    h.wait_until("the remote ConfigMap is re-created", async || {
        h.remote_config_map("catalog-settings").await.is_some()
    })
    .await;

    // Deletion removes the objects from the remote cluster.
    h.delete_and_wait("catalog").await;
    assert!(h.remote_config_map("catalog-settings").await.is_none());
    common::expect_event(&h.local, &h.ns, "catalog", |kind, reason, _| {
        kind == "Normal" && reason == "Deleted"
    })
    .await;
    assert_eq!(h.local_config_maps().await, Vec::<String>::new());
    // One client served every pass; no target error happened.
    assert_eq!(h.ctx.targets.len(), 1);
    for reason in module_manager::telemetry::metrics::TARGET_ERROR_REASONS {
        assert_eq!(h.target_errors(reason), 0, "{reason}");
    }
}

#[tokio::test]
async fn a_rotated_secret_gets_a_new_client_and_the_old_credential_is_not_used() {
    let h = start("remote-rotation").await;
    let old_account = format!("{}-old", h.ns);
    let old = h.service_account_kubeconfig(&old_account).await;
    h.put_secret("remote", &old).await;
    h.create(&h.manifest("tiny", TINY, Some("remote"), json!({"n": 1})))
        .await;
    h.wait_state("tiny", State::Ready).await;
    assert_eq!(h.remote_data("tiny", "n").await.as_deref(), Some("1"));

    // Rotate: a token of another ServiceAccount; then revoke the old one.
    h.put_account_secret("new").await;
    objects::delete(
        &Api::<ServiceAccount>::namespaced(h.remote.clone(), "default"),
        &old_account,
    )
    .await;
    // The old token is refused by the remote cluster from now on.
    let old_client = Client::try_from(
        kube::Config::from_custom_kubeconfig(
            Kubeconfig::from_yaml(&old).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    h.wait_until("the old token is revoked", async || {
        matches!(
            Api::<ConfigMap>::namespaced(old_client.clone(), &h.ns).get_opt("tiny").await,
            Err(kube::Error::Api(status)) if status.code == 401
        )
    })
    .await;

    // The next passes (drift, then an upgrade) use the new credential.
    h.patch_spec("tiny", json!({"values": {"n": 2}})).await;
    h.wait_state("tiny", State::Ready).await;
    assert_eq!(h.remote_data("tiny", "n").await.as_deref(), Some("2"));
    assert_eq!(
        h.target_errors("auth"),
        0,
        "the old client was never used after the rotation (it would have met a 401)"
    );
    let events = h.events("tiny").await;
    assert!(
        !events
            .iter()
            .any(|(_, reason, _)| reason.starts_with("Target")),
        "{events:?}"
    );
    assert_eq!(h.ctx.targets.len(), 1, "the old client was replaced");
}

/// Passes on a remote target reuse its client without reading the kubeconfig Secret while the
/// watch of the Secrets' versions shows it unchanged; a changed Secret is read again at the
/// next pass. (Before the watch, every pass read it: the count below grew by one per pass.)
#[tokio::test]
async fn an_unchanged_kubeconfig_secret_is_not_read_again() {
    let h = start("remote-secret-reads").await;
    h.put_account_secret("first").await;
    h.create(&h.manifest("tiny", TINY, Some("remote"), json!({"n": 1})))
        .await;
    h.wait_state("tiny", State::Ready).await;
    let secret_reads = || h.local_requests.count("get", "secrets");
    assert!(secret_reads() >= 1, "the first pass reads the Secret");
    h.wait_until_watched("remote").await;
    // An upgrade: every pass that began before the watch had listed has ended after it.
    h.patch_spec("tiny", json!({"values": {"n": 2}})).await;
    h.wait_state("tiny", State::Ready).await;
    let reads = secret_reads();
    // Two more upgrades, and the drift passes of a 2 s interval meanwhile: none reads it.
    for n in 3..=4 {
        h.patch_spec("tiny", json!({"values": {"n": n}})).await;
        h.wait_state("tiny", State::Ready).await;
    }
    assert_eq!(h.remote_data("tiny", "n").await.as_deref(), Some("4"));
    assert_eq!(
        secret_reads(),
        reads,
        "passes with an unchanged kubeconfig Secret read it"
    );

    // A rotated Secret: the next pass reads it and uses the new credential.
    h.put_account_secret("second").await;
    h.wait_until_watched("remote").await;
    h.patch_spec("tiny", json!({"values": {"n": 5}})).await;
    h.wait_state("tiny", State::Ready).await;
    assert!(secret_reads() > reads, "the changed Secret was not read");
    assert_eq!(h.remote_data("tiny", "n").await.as_deref(), Some("5"));
    assert_eq!(h.target_errors("auth"), 0);
}

/// A drift pass over an unchanged module on a remote target writes nothing: one metadata-only
/// LIST per kind, by the Manifest's UID label, shows every object at the version the last apply
/// answered with. An object edited or deleted on the target shows in that LIST and is repaired
/// by the pass. (Before the listing, every drift pass applied every object: the writes below
/// grew by three per pass.)
#[tokio::test]
async fn idle_drift_passes_on_a_remote_target_write_nothing_and_repair_what_changed() {
    use k8s_openapi::api::core::v1::Service;
    let h = start("remote-idle-drift").await;
    h.put_account_secret("idle").await;
    let chart = "tests/fixtures/charts/budget";
    h.create(&h.manifest("idle", chart, Some("remote"), json!({"n": 1})))
        .await;
    h.wait_state("idle", State::Ready).await;
    let requests = h.ctx.targets.metrics().requests.clone();
    let remote = |pick: &dyn Fn(&str, &str) -> bool| {
        requests.sum(|l| l.target == "remote" && pick(l.verb, &l.resource))
    };
    let writes = || remote(&|verb, _| !matches!(verb, "get" | "list" | "watch"));
    let lists = || remote(&|verb, _| verb == "list");
    let all = || remote(&|_, _| true);
    let applies_of = |resource: &'static str| remote(&|verb, r| verb == "apply" && r == resource);
    let unchanged = || h.ctx.metrics.unchanged.get();
    // The chart's three objects (ConfigMap, ServiceAccount, Service), once found unchanged.
    let skipped = unchanged();
    h.wait_until("a drift pass found every object unchanged", async || {
        unchanged() >= skipped + 3
    })
    .await;

    let (writes_before, lists_before, all_before) = (writes(), lists(), all());
    let skipped = unchanged();
    h.wait_until("two more drift passes", async || unchanged() >= skipped + 6)
        .await;
    let passes_skipping = (unchanged() - skipped) / 3;
    let (listed, sent) = (lists() - lists_before, all() - all_before);
    eprintln!("idle: {passes_skipping} passes, {listed} lists, {sent} requests on the target");
    assert_eq!(writes(), writes_before, "an idle drift pass writes nothing");
    assert_eq!(sent, listed, "and sends nothing but its listings");
    assert!(
        listed <= 3 * (passes_skipping + 1),
        "one LIST per kind per pass: {listed} for {passes_skipping} passes"
    );
    assert!(h.listings("found") >= listed, "each listing is counted");
    for outcome in ["refused", "failed", "unanswered"] {
        assert_eq!(h.listings(outcome), 0, "{outcome}");
    }

    // A renewed credential (a token of another ServiceAccount, the same server): the new
    // client takes over the records, so the passes after it write nothing either.
    let secret_reads = || h.local_requests.count("get", "secrets");
    let reads = secret_reads();
    h.put_account_secret("renewed").await;
    h.wait_until("the renewed Secret is read", async || {
        secret_reads() > reads
    })
    .await;
    let skipped = unchanged();
    h.wait_until("two drift passes with the new client", async || {
        unchanged() >= skipped + 6
    })
    .await;
    assert_eq!(writes(), writes_before, "no write after the renewal");

    // Another writer labels the ConfigMap (a label of its own): a new resourceVersion, so each
    // drift pass applies it (versions alone decide for a ConfigMap), and the stamp its status
    // keeps moves each time; that alone writes no status (an autoscaler or a custom
    // resource's controller does this on every pass).
    let configmaps = Api::<ConfigMap>::namespaced(h.remote.clone(), &h.ns);
    let status_writes = || {
        h.local_requests
            .count("patch", "modulemanager.io/manifests/status")
    };
    let (status_before, configmaps_applied) = (status_writes(), applies_of("configmaps"));
    for round in 0..3 {
        let label = json!({"metadata": {"labels": {"other-writer": round.to_string()}}});
        objects::merge(&configmaps, "idle", label).await;
        h.wait_until("the drift pass applies the ConfigMap again", async || {
            applies_of("configmaps") > configmaps_applied + round
        })
        .await;
    }
    assert_eq!(
        status_writes(),
        status_before,
        "a stamp that moved alone is not written"
    );

    // Someone edits the ConfigMap and deletes the Service on the target.
    let services = Api::<Service>::namespaced(h.remote.clone(), &h.ns);
    let applies = applies_of;
    let (configmaps_before, accounts_before) = (applies("configmaps"), applies("serviceaccounts"));
    objects::merge(&configmaps, "idle", json!({"data": {"n": "edited"}})).await;
    objects::delete(&services, "idle").await;
    h.wait_until("the drift on the target is repaired", async || {
        let restored = h
            .remote_config_map("idle")
            .await
            .and_then(|c| data(&c, "n"));
        restored.as_deref() == Some("1") && objects::exists(&services, "idle").await
    })
    .await;
    assert!(applies("configmaps") > configmaps_before);
    assert_eq!(
        applies("serviceaccounts"),
        accounts_before,
        "nobody touched the ServiceAccount"
    );
}

/// A Deployment's controllers write its status: a new resourceVersion, the same generation.
/// The drift passes after it apply nothing (issue 29: an idle fleet writes nothing; before,
/// each status change cost one apply of the Deployment), while an edit of its spec (a new
/// generation) or of one of its labels, or a label taken over by another manager, is still
/// repaired. The remote cluster runs no
/// controllers: the test writes the status through the status subresource, as the deployment
/// controller does.
#[tokio::test]
async fn a_workload_whose_status_alone_changed_is_not_applied_again_but_drift_is_repaired() {
    use k8s_openapi::api::apps::v1::Deployment;
    let h = start("remote-status-only").await;
    h.put_account_secret("status-only").await;
    let name = "status-only";
    h.create(&h.manifest(
        name,
        "tests/fixtures/charts/scaled",
        Some("remote"),
        json!({"replicas": 1}),
    ))
    .await;
    let deployments = Api::<Deployment>::namespaced(h.remote.clone(), &h.ns);
    let deployment = || async { deployments.get_opt(name).await.unwrap() };
    h.wait_until("the Deployment exists on the target", async || {
        deployment().await.is_some()
    })
    .await;
    // The status the deployment controller would write: `ready` replicas of 1, `message` on
    // the Available condition (another message is another status, the same readiness), the
    // new ReplicaSet rolled out.
    let available = |generation: i64, ready: i64, message: &str| {
        let up = if ready > 0 { "True" } else { "False" };
        json!({"status": {
            "observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
            "readyReplicas": ready, "availableReplicas": ready,
            "conditions": [
                {"type": "Available", "status": up, "reason": "MinimumReplicasAvailable", "message": message},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable", "message": "rolled out"},
            ],
        }})
    };
    let write_status = async |ready: i64, message: &'static str| {
        let generation = deployment().await.unwrap().metadata.generation.unwrap();
        deployments
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(available(generation, ready, message)),
            )
            .await
            .unwrap()
    };
    write_status(1, "up").await;
    h.wait_state(name, State::Ready).await;

    let requests = h.ctx.targets.metrics().requests.clone();
    let applied = || {
        requests
            .sum(|l| l.target == "remote" && l.verb == "apply" && l.resource == "apps/deployments")
    };
    let unchanged = || h.ctx.metrics.unchanged.get();
    // The ConfigMap and the Deployment, both found unchanged by one drift pass.
    let skipped = unchanged();
    h.wait_until("a drift pass found both objects unchanged", async || {
        unchanged() >= skipped + 2
    })
    .await;

    let before = applied();
    let reads = || {
        requests
            .sum(|l| l.target == "remote" && l.verb == "get" && l.resource == "apps/deployments")
    };
    let reads_before = reads();
    let rewritten = write_status(1, "still up")
        .await
        .metadata
        .resource_version
        .unwrap_or_default();
    let skipped = unchanged();
    h.wait_until("two drift passes after the status changed", async || {
        unchanged() >= skipped + 4
    })
    .await;
    assert_eq!(
        applied(),
        before,
        "a status change alone is no drift: nothing applied"
    );
    assert!(
        reads() > reads_before,
        "the Deployment was read: {} reads before, {} after, {} unchanged",
        reads_before,
        reads(),
        unchanged()
    );
    assert_eq!(
        deployment()
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap_or_default(),
        rewritten,
        "nothing was written to the Deployment"
    );

    // The workload loses its pods: the next drift pass sees it on what it read.
    write_status(0, "down").await;
    h.wait_for(name, "not Ready while its Deployment is unavailable", |m| {
        m.status.as_ref().and_then(|s| s.state) != Some(State::Ready)
    })
    .await;
    write_status(1, "up").await;
    h.wait_state(name, State::Ready).await;

    // An edit of its pod template: the spec changes (a new generation), and is repaired. (Not
    // `kubectl scale`: `spec.replicas` is left to whoever set it, as to an autoscaler.)
    let before = applied();
    let image = |d: Deployment| {
        d.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .clone()
    };
    deployments
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "app", "image": "nginx:edited"}
            ]}}}})),
        )
        .await
        .unwrap();
    // Its controllers take the edit in at once: Ready at the new generation, so that only the
    // drift pass can repair it.
    write_status(1, "up").await;
    h.wait_until("the edited image is repaired", async || {
        image(deployment().await.unwrap()).as_deref() == Some("nginx:1.27")
    })
    .await;
    assert!(applied() > before, "the repair applied the Deployment");
    write_status(1, "up").await;
    h.wait_state(name, State::Ready).await;

    // One of the module's labels edited: the same generation, and repaired.
    let before = applied();
    deployments
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app.kubernetes.io/name": "edited"}}})),
        )
        .await
        .unwrap();
    h.wait_until("the edited label is repaired", async || {
        let labels = deployment()
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default();
        labels.get("app.kubernetes.io/name").map(String::as_str) == Some("scaled")
    })
    .await;
    assert!(applied() > before, "the repair applied the Deployment");

    // Another manager changes the label and sets it back: the value is the module's, the
    // generation the same, but module-manager no longer owns the label (a later render that
    // drops it would leave it behind). The next drift pass applies and owns it again.
    let ours_owns_label = async || {
        deployment()
            .await
            .unwrap()
            .metadata
            .managed_fields
            .unwrap_or_default()
            .iter()
            .any(|entry| {
                entry.manager.as_deref() == Some("module-manager")
                    && entry.operation.as_deref() == Some("Apply")
                    && entry.fields_v1.as_ref().is_some_and(|f| {
                        f.0.pointer("/f:metadata/f:labels/f:app.kubernetes.io~1name")
                            .is_some()
                    })
            })
    };
    assert!(ours_owns_label().await, "the apply owns the label");
    let before = applied();
    let relabel = |value: &str| json!({"metadata": {"labels": {"app.kubernetes.io/name": value}}});
    let by_another = PatchParams {
        field_manager: Some("another-writer".into()),
        ..PatchParams::default()
    };
    for value in ["edited", "scaled"] {
        deployments
            .patch(name, &by_another, &Patch::Merge(relabel(value)))
            .await
            .unwrap();
    }
    h.wait_until("module-manager owns the label again", ours_owns_label)
        .await;
    assert!(applied() > before, "the drift pass applied the Deployment");
}

/// A restart (or a shard taken over) leaves a replica without apply records: its first pass
/// of each Manifest used to apply every object again (issue 29: a cold restart at 5,000
/// targets took 14 minutes). The stamps the status keeps let the new process restore each
/// record from one listing: what nobody touched is not applied, a workload whose status
/// changed meanwhile is read and judged on what it is now, and drift made while no operator
/// ran is repaired by that first pass.
#[tokio::test]
async fn a_new_process_restores_its_records_from_the_status_and_repairs_what_changed_meanwhile() {
    use k8s_openapi::api::apps::v1::Deployment;
    let mut h = start("remote-restart").await;
    h.put_account_secret("restart").await;
    let (quiet, workload) = ("restart-quiet", "restart-workload");
    // A long interval: the only drift pass after the restart is its first one.
    let mut budget = h.manifest(
        quiet,
        "tests/fixtures/charts/budget",
        Some("remote"),
        json!({"n": 1}),
    );
    budget.spec.interval = "10m".into();
    h.create(&budget).await;
    let values = json!({"replicas": 1});
    let mut scaled = h.manifest(
        workload,
        "tests/fixtures/charts/scaled",
        Some("remote"),
        values,
    );
    scaled.spec.interval = "10m".into();
    h.create(&scaled).await;
    let deployments = Api::<Deployment>::namespaced(h.remote.clone(), &h.ns);
    h.wait_until("the Deployment exists on the target", async || {
        objects::exists(&deployments, workload).await
    })
    .await;
    let available = async |ready: i64| {
        let generation = deployments.get(workload).await.unwrap().metadata.generation;
        let up = if ready > 0 { "True" } else { "False" };
        let status = json!({"status": {
            "observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
            "readyReplicas": ready, "availableReplicas": ready,
            "conditions": [
                {"type": "Available", "status": up, "reason": "Test", "message": "-"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
            ],
        }});
        deployments
            .patch_status(workload, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap();
    };
    available(1).await;
    h.wait_state(quiet, State::Ready).await;
    h.wait_state(workload, State::Ready).await;
    let stamps = |m: &Manifest| m.status.as_ref().map_or(0, |s| s.applied_stamps.len());
    h.wait_for(quiet, "a stamp for each of its 3 objects", |m| {
        stamps(m) == 3
    })
    .await;
    h.wait_for(workload, "a stamp for each of its 2 objects", |m| {
        stamps(m) == 2
    })
    .await;

    // While no operator runs: someone edits a ConfigMap, and the workload loses its pods.
    let configmaps = Api::<ConfigMap>::namespaced(h.remote.clone(), &h.ns);
    h.restart(async || {
        objects::merge(&configmaps, quiet, json!({"data": {"n": "edited"}})).await;
        available(0).await;
    })
    .await;

    let requests = h.ctx.targets.metrics().requests.clone();
    let count = |verb: &'static str, resource: &'static str| {
        requests.sum(|l| l.target == "remote" && l.verb == verb && l.resource == resource)
    };
    h.wait_until(
        "the edit made while no operator ran is repaired",
        async || h.remote_data(quiet, "n").await.as_deref() == Some("1"),
    )
    .await;
    h.wait_for(workload, "not Ready: its Deployment lost its pods", |m| {
        m.status.as_ref().and_then(|s| s.state) != Some(State::Ready)
    })
    .await;
    available(1).await;
    h.wait_state(workload, State::Ready).await;
    // The quiet module's ServiceAccount and Service and the workload module's ConfigMap, found
    // as their last applies left them, and the Deployment, read: the first pass's.
    assert_eq!(h.ctx.metrics.unchanged.get(), 4, "objects skipped");
    // The repair of the edited ConfigMap: an apply that conflicts with the editor's field, then
    // a forced one (docs/reconcile.md); the other ConfigMap is among the skipped.
    assert!(
        count("apply", "configmaps") <= 2,
        "only the edited ConfigMap is applied"
    );
    for resource in ["serviceaccounts", "services", "apps/deployments"] {
        assert_eq!(count("apply", resource), 0, "nothing applied of {resource}");
    }
    assert!(
        count("get", "apps/deployments") >= 2,
        "the Deployment is read, not applied"
    );
    // The new client's identity (kube-system); the target namespace is not read: the listing
    // found objects in it.
    assert_eq!(count("get", "namespaces"), 1, "namespaces read");
}

/// The target namespace removed, with everything in it, while no operator ran: the first drift
/// pass of the new process, which reads no namespace before its listing, finds nothing listed,
/// makes the namespace before its first write into it and applies the module again — in that
/// pass, without a failed apply.
#[tokio::test]
async fn a_target_namespace_removed_while_no_operator_ran_is_made_again_by_the_drift_pass() {
    let mut h = start("remote-ns-gone").await;
    h.put_account_secret("ns-gone").await;
    let name = "ns-gone";
    let mut manifest = h.manifest(name, TINY, Some("remote"), json!({"n": 1}));
    manifest.spec.interval = "10m".into();
    h.create(&manifest).await;
    h.wait_state(name, State::Ready).await;
    h.wait_for(name, "a stamp for its ConfigMap", |m| {
        m.status
            .as_ref()
            .is_some_and(|s| s.applied_stamps.len() == 1)
    })
    .await;
    let namespaces = Api::<Namespace>::all(h.remote.clone());
    let configmaps = Api::<ConfigMap>::namespaced(h.remote.clone(), &h.ns);
    let ns = h.ns.clone();
    h.restart(async || {
        // What the namespace controller would do (the target runs none): its contents first,
        // then the namespace finalized.
        objects::delete(&configmaps, name).await;
        objects::delete(&namespaces, &ns).await;
        let finalized = json!({"metadata": {"name": ns}, "spec": {"finalizers": []}});
        namespaces
            .replace_subresource("finalize", &ns, &PostParams::default(), &finalized)
            .await
            .unwrap();
        let gone = async || namespaces.get_opt(&ns).await.unwrap().is_none();
        assert!(gone().await, "the target namespace is gone");
    })
    .await;
    h.wait_until("the ConfigMap is applied again", async || {
        h.remote_config_map(name).await.is_some()
    })
    .await;
    assert!(h.remote_namespace_exists().await);
    let events = h.events(name).await;
    let warnings: Vec<_> = events
        .iter()
        .filter(|(kind, ..)| kind == "Warning")
        .collect();
    assert!(warnings.is_empty(), "no pass failed: {warnings:?}");
}

/// A credential that may not `list` a kind on the target: the refused listing is not asked for
/// again on every pass (one warning, asked again after 15 minutes), the kind's objects are
/// applied on every drift pass as before the listings, and drift is still repaired.
#[tokio::test]
async fn a_target_that_refuses_listings_gets_applies_as_before_and_one_refused_list() {
    let h = start("remote-no-list").await;
    let name = format!("{}-no-list", h.ns);
    let may_apply = common::Grant::ClusterRole(json!([
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create"]},
    ]));
    let token = common::account_token(&h.remote, "default", &name, may_apply, &[]).await;
    h.put_secret("remote", &h.remote_kubeconfig(json!({ "token": token })))
        .await;
    let chart = TINY;
    h.create(&h.manifest("tiny", chart, Some("remote"), json!({"n": 1})))
        .await;
    h.wait_state("tiny", State::Ready).await;
    let requests = h.ctx.targets.metrics().requests.clone();
    let applies = || requests.count("apply", "configmaps");
    let lists = || requests.count("list", "configmaps");
    // Drift passes every 2 s: each applies the ConfigMap, as without the listings.
    let applied = applies();
    h.wait_until("three drift passes", async || applies() >= applied + 3)
        .await;
    assert_eq!(
        lists(),
        1,
        "the refused listing is remembered, not asked per pass"
    );
    assert_eq!((h.listings("refused"), h.listings("found")), (1, 0));
    // Drift is repaired.
    let edit = json!({"data": {"n": "edited"}});
    Api::<ConfigMap>::namespaced(h.remote.clone(), &h.ns)
        .patch("tiny", &PatchParams::default(), &Patch::Merge(edit))
        .await
        .unwrap();
    h.wait_until("the ConfigMap is repaired", async || {
        let config_map = h.remote_config_map("tiny").await;
        config_map.and_then(|c| data(&c, "n")).as_deref() == Some("1")
    })
    .await;
    assert_eq!(
        h.ctx.metrics.unchanged.get(),
        0,
        "nothing was skipped unlisted"
    );
}

/// A cached client whose credential is due counts in `module_manager_target_credentials_expiring`
/// — here a client certificate in the last fifth of its life (issued 9 hours ago, valid for 30
/// more minutes), which the target accepts; once the Secret holds a fresh credential (a token
/// valid for an hour, not due), the next pass's client replaces it and the count falls to 0.
#[tokio::test]
async fn a_credential_near_its_expiry_is_counted_until_the_secret_is_renewed() {
    use base64::Engine;
    let h = start("remote-expiring").await;
    let now = std::time::SystemTime::now();
    let hours = |n: u64| Duration::from_secs(n * 3600);
    let user = format!("{}-expiring", h.ns);
    let valid = now - hours(9)..now + Duration::from_secs(30 * 60);
    let (certificate, key) = h
        .remote_plane
        .client_certificate(&user, Some("system:masters"), valid)
        .unwrap();
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let user = json!({"client-certificate-data": b64(&certificate), "client-key-data": b64(&key)});
    h.put_secret("remote", &h.remote_kubeconfig(user)).await;
    let chart = TINY;
    h.create(&h.manifest("tiny", chart, Some("remote"), json!({"n": 1})))
        .await;
    h.wait_state("tiny", State::Ready).await;
    let expiring = || h.ctx.targets.metrics().expiring.get();
    assert_eq!(expiring(), 1, "the certificate is in its last fifth");

    h.put_account_secret("fresh").await;
    h.wait_until_watched("remote").await;
    h.patch_spec("tiny", json!({"values": {"n": 2}})).await;
    h.wait_state("tiny", State::Ready).await;
    assert_eq!(expiring(), 0, "the renewed credential is not due");
    assert_eq!(h.ctx.targets.len(), 1);
}

#[tokio::test]
async fn unreachable_or_refusing_targets_back_off_without_affecting_other_manifests() {
    let h = start("remote-unreachable").await;
    let ca = h.remote_ca();
    let token = json!({ "token": CANARY_TOKEN });
    // Nothing listens.
    let closed = format!("https://127.0.0.1:{}", closed_port());
    h.put_secret("closed", &kubeconfig(&closed, &ca, token.clone()))
        .await;
    // Accepts connections and never answers (no TLS handshake): the connect timeout ends it.
    let silent_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("https://{}", silent_listener.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        let mut connections = Vec::new();
        while let Ok((stream, _)) = silent_listener.accept() {
            connections.push(stream);
        }
    });
    h.put_secret("silent", &kubeconfig(&silent, &ca, token.clone()))
        .await;
    // The real remote server, trusted through the wrong CA (the local cluster's).
    let local_plane = testenv::shared(Default::default()).await.unwrap();
    let local_ca = admin_kubeconfig_field(local_plane, "clusters", "certificate-authority-data");
    h.put_secret(
        "wrong-ca",
        &kubeconfig(&h.remote_server(), &local_ca, token.clone()),
    )
    .await;
    // The real remote server with a token it does not know.
    h.put_secret("bad-token", &h.remote_kubeconfig(token.clone()))
        .await;
    // And one good target.
    let good_token = h.service_account_token(&format!("{}-good", h.ns)).await;
    h.put_secret("good", &h.remote_kubeconfig(json!({ "token": good_token })))
        .await;
    // The good target again, through a proxy that will stop passing bytes (a partition).
    let paused = Arc::new(AtomicBool::new(false));
    let upstream = server_address(&h.remote_server());
    let frozen = format!("https://{}", pausable_proxy(upstream, paused.clone()).await);
    h.put_secret(
        "frozen",
        &kubeconfig(&frozen, &ca, json!({ "token": good_token })),
    )
    .await;

    let server = h.remote_server();
    let targets = [
        (
            "closed",
            "TargetUnreachable",
            closed.as_str(),
            "Connection refused",
        ),
        ("silent", "TargetUnreachable", silent.as_str(), "elapsed"),
        (
            "wrong-ca",
            "TargetAuthError",
            server.as_str(),
            "certificate",
        ),
        (
            "bad-token",
            "TargetAuthError",
            server.as_str(),
            "401 Unauthorized",
        ),
    ];
    for (name, ..) in targets {
        h.create_tiny(name, Some(name)).await;
    }
    h.create_tiny("good", Some("good")).await;
    h.create_tiny("local", None).await;
    h.create_tiny("frozen", Some("frozen")).await;

    // The others are unaffected: Ready on their clusters.
    h.wait_state("good", State::Ready).await;
    h.wait_state("local", State::Ready).await;
    h.wait_state("frozen", State::Ready).await;
    assert!(h.remote_config_map("good").await.is_some());
    assert_eq!(h.local_config_maps().await, ["local"]);

    // The frozen target stops answering on its open connections: the request timeout ends the
    // pass (without it the worker would wait forever), the client is kept, and the Manifest
    // recovers once the target answers again.
    paused.store(true, Ordering::Relaxed);
    let failed = h.wait_error("frozen", "TargetUnreachable", &frozen).await;
    let (_, message) = ready_condition(&failed).unwrap();
    assert!(message.contains("timed out"), "{message}");
    assert_eq!(
        h.ctx.targets.len(),
        2,
        "the clients of good and frozen: an unreachable target keeps its client"
    );
    paused.store(false, Ordering::Relaxed);
    h.wait_state("frozen", State::Ready).await;
    h.wait_state("good", State::Ready).await;

    for (name, reason, server, detail) in targets {
        let failed = h.wait_error(name, reason, detail).await;
        let (_, message) = ready_condition(&failed).unwrap();
        assert!(
            message.contains(server),
            "{name}: names the server: {message}"
        );
        assert!(!message.contains(CANARY_TOKEN), "{name}: {message}");
        assert!(
            !stalled(&failed),
            "{name}: transient, retried with backoff: {:#?}",
            failed.status
        );
        // Retried passes publish no new Event while the message stays the same.
        let events = common::events_once(&h.local, &h.ns, name, |events| {
            events.iter().any(|(_, r, _)| r == reason)
        })
        .await;
        let warnings: Vec<_> = events.iter().filter(|(_, r, _)| r == reason).collect();
        assert_eq!(warnings.len(), 1, "{name}: one Warning Event: {events:?}");
        assert!(
            events
                .iter()
                .all(|(_, _, note)| !note.contains(CANARY_TOKEN))
        );
    }
    for reason in ["unreachable", "tls", "auth"] {
        assert!(h.target_errors(reason) > 0, "{reason} counted");
    }
    // Only targets whose discovery succeeded are cached.
    assert_eq!(h.ctx.targets.len(), 2);
    drop(held);
}

/// A target that accepts connections and never answers holds at most one of the operator's
/// four workers (`--target-passes` 1): its other Manifests go back to the queue without a
/// worker, and the Manifests of other clusters, created once the silent ones were dispatched,
/// are reconciled while its first pass still waits for its 20 s connect timeout — before any
/// silent Manifest has an error. With the limit at 6 (no limit for 6 Manifests, as before it
/// existed) the four workers all wait on the silent target: "good" and "local" are Ready only
/// after silent Manifests have their errors, and `passes_held_max` is 4.
#[tokio::test]
async fn a_silent_target_holds_at_most_one_worker() {
    let h = start_with(
        "remote-one-worker",
        Tuning {
            connect_timeout: Duration::from_secs(20),
            ..Default::default()
        },
    )
    .await;
    let silent_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("https://{}", silent_listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    let held = std::thread::spawn(move || {
        let mut connections = Vec::new();
        while let Ok((stream, _)) = silent_listener.accept() {
            connections.push(stream);
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    let token = json!({ "token": CANARY_TOKEN });
    h.put_secret("silent", &kubeconfig(&silent, &h.remote_ca(), token))
        .await;
    let good_token = h.service_account_token(&format!("{}-good", h.ns)).await;
    h.put_secret("good", &h.remote_kubeconfig(json!({ "token": good_token })))
        .await;
    let silent_manifests: Vec<String> = (0..6).map(|i| format!("silent-{i}")).collect();
    for name in &silent_manifests {
        h.create_tiny(name, Some("silent")).await;
    }
    // The silent Manifests were dispatched: each held by one of the 4 workers (connecting), or
    // one held and the other 5 sent back.
    let metrics = h.ctx.targets.metrics();
    h.wait_until("the silent Manifests were dispatched", async || {
        let connecting = accepted.load(Ordering::Relaxed);
        connecting >= 4 || (connecting >= 1 && metrics.parked.get() >= 5)
    })
    .await;
    h.create_tiny("good", Some("good")).await;
    h.create_tiny("local", None).await;

    h.wait_state("good", State::Ready).await;
    h.wait_state("local", State::Ready).await;
    for name in &silent_manifests {
        let manifest = h.manifests.get(name).await.unwrap();
        let state = manifest.status.and_then(|s| s.state);
        assert_ne!(
            state,
            Some(State::Error),
            "{name} failed before the other clusters' Manifests were Ready: their workers waited on it"
        );
    }
    // The silent target's first pass ends with its connect timeout.
    h.wait_until("a silent Manifest failed", async || {
        for name in &silent_manifests {
            let manifest = h.manifests.get(name).await.unwrap();
            if ready_condition(&manifest).is_some_and(|(reason, _)| reason == "TargetUnreachable") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        metrics.passes_held_max.get(),
        1,
        "one target held more than one worker at once"
    );
    assert!(
        metrics.parked.get() > 0,
        "the silent target's other Manifests went back to the queue"
    );
    drop(held);
}

/// A target's requests wait for its budget: in every window of the run, the requests sent to
/// it are at most the burst plus the rate times the window's length, plus one per client of the
/// target (three passes at once may each build one; each may have taken a token just before the
/// window opened). Without the budget (`BudgetSettings::default()` in the harness) it fails
/// with "14 requests in 1.105 s, the budget allows 6.2": the discovery, identity and apply
/// requests of three installs leaving together.
#[tokio::test]
async fn a_targets_requests_stay_within_its_budget() {
    let budget = BudgetSettings { qps: 2.0, burst: 1 };
    // Three passes at once on the target: they share its budget.
    let h = start_with(
        "remote-budget",
        Tuning {
            budget,
            target_passes: 3,
            ..Default::default()
        },
    )
    .await;
    let token = h.service_account_token(&format!("{}-budget", h.ns)).await;
    h.put_secret("budgeted", &h.remote_kubeconfig(json!({ "token": token })))
        .await;
    let names = ["b-0", "b-1", "b-2"];
    for name in names {
        h.create_tiny(name, Some("budgeted")).await;
    }
    let requests = &h.ctx.targets.metrics().requests;
    let sent = || requests.sum(|labels| labels.target == "remote");
    // (before the read, the count, after the read): requests counted between two reads were
    // sent between the first's start and the second's end.
    let mut samples: Vec<(Instant, u64, Instant)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let before = Instant::now();
        let count = sent();
        samples.push((before, count, Instant::now()));
        let mut ready = 0;
        for name in names {
            let manifest = h.manifests.get(name).await.unwrap();
            let status = manifest.status.unwrap_or_default();
            ready += usize::from(status.state == Some(State::Ready));
        }
        if ready == names.len() {
            break;
        }
        assert!(Instant::now() < deadline, "timed out waiting for Ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let total = samples.last().map_or(0, |(_, n, _)| *n);
    assert!(total >= 6, "the installs sent {total} requests");
    for (i, (start, before, _)) in samples.iter().enumerate() {
        for (_, after, end) in &samples[i + 1..] {
            let window = end.duration_since(*start).as_secs_f64();
            let allowed = f64::from(budget.burst) + budget.qps * window + 3.0;
            assert!(
                (after - before) as f64 <= allowed,
                "{} requests in {window:.3} s, the budget allows {allowed:.1}",
                after - before
            );
        }
    }
    assert!(h.ctx.targets.metrics().budget_waits.get() > 0);
}

/// A token shaped as a JWT (never signed: the target refuses it) issued an hour ago and
/// expiring in a minute: its credential is due.
fn expiring_jwt() -> String {
    use base64::Engine;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let part =
        |value: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string());
    format!(
        "{}.{}.{}",
        part(json!({"alg": "RS256"})),
        part(json!({"iat": now - 3540, "exp": now + 60, "sub": CANARY_TOKEN})),
        part(json!("signature"))
    )
}

/// `GET /v1/targets` on an admin server with the local cluster behind it: the targets of this
/// test's namespace from their Manifests' statuses and their Secrets — Ready ones, an
/// unreachable one whose token is due, one that refuses its token (two Manifests), one whose
/// Secret is missing — failing ones first by reason, and nothing of a credential in the answer.
/// Only for a caller who may `get` `/v1/targets`. (Against a view that stopped after its first
/// page of Manifests it fails on the counts.)
#[tokio::test]
async fn the_targets_view_shows_which_targets_fail_and_why() {
    use module_manager::admin::TargetsAnswer;
    use module_manager::cli::{TARGETS_TIMEOUT, fetch_within, targets_table};
    use module_manager::shard::membership::MAX_PUBLISHED_TARGETS;
    let h = start("remote-view").await;
    let good_token = h.service_account_token(&format!("{}-view", h.ns)).await;
    h.put_secret("good", &h.remote_kubeconfig(json!({ "token": good_token })))
        .await;
    let closed = format!("https://127.0.0.1:{}", closed_port());
    let jwt = expiring_jwt();
    let due = json!({ "token": jwt });
    h.put_secret("closed", &kubeconfig(&closed, &h.remote_ca(), due))
        .await;
    h.put_secret(
        "bad-token",
        &h.remote_kubeconfig(json!({ "token": CANARY_TOKEN })),
    )
    .await;
    for (name, secret) in [
        ("good-1", Some("good")),
        ("good-2", Some("good")),
        ("closed-1", Some("closed")),
        ("bad-1", Some("bad-token")),
        ("bad-2", Some("bad-token")),
        ("missing-1", Some("missing")),
        ("local-1", None),
    ] {
        h.create_tiny(name, secret).await;
    }
    for name in ["good-1", "good-2", "local-1"] {
        h.wait_state(name, State::Ready).await;
    }
    // The budget use of the last minute, right after good's installs (it fades within two).
    let busiest = h.ctx.targets.budgets().busiest(MAX_PUBLISHED_TARGETS);
    h.wait_error("closed-1", "TargetUnreachable", &closed).await;
    for name in ["bad-1", "bad-2"] {
        h.wait_error(name, "TargetAuthError", "401").await;
    }
    h.wait_error("missing-1", "TargetError", "missing").await;

    let url = common::admin_server(&h.local, Default::default()).await;
    let may_see = json!([{"nonResourceURLs": ["/v1/targets"], "verbs": ["get"]}]);
    let viewer = common::Grant::ClusterRole(may_see);
    let viewer = common::admin_token(&h.local, &h.ns, "viewer", viewer).await;
    let nobody = common::Grant::Nothing;
    let nobody = common::admin_token(&h.local, &h.ns, "nobody", nobody).await;
    // Pages of 2 Manifests: the view folds all three pages.
    let path = format!("/v1/targets?namespace={}&page=2", h.ns);
    let get = async |path: &str, token: Option<&str>| {
        fetch_within::<TargetsAnswer>(&url, http::Method::GET, path, token, TARGETS_TIMEOUT)
            .await
            .map_err(|e| format!("{e:#}"))
    };
    let anonymous = get(&path, None).await.unwrap_err();
    assert!(anonymous.contains("401"), "{anonymous}");
    let refused = get(&path, Some(&nobody)).await.unwrap_err();
    assert!(refused.contains("403"), "{refused}");

    let answer = get(&path, Some(&viewer)).await.unwrap();
    assert_eq!((answer.targets, answer.manifests), (4, 6), "{answer:#?}");
    assert_eq!((answer.failing, answer.expiring), (3, 1), "{answer:#?}");
    let reasons: Vec<(&str, u64)> = answer
        .by_reason
        .iter()
        .map(|(r, n)| (r.as_str(), *n))
        .collect();
    assert_eq!(
        reasons,
        [
            ("TargetAuthError", 1),
            ("TargetError", 1),
            ("TargetUnreachable", 1)
        ]
    );
    let order: Vec<&str> = answer.rows.iter().map(|r| r.secret.as_str()).collect();
    assert_eq!(order, ["bad-token", "missing", "closed", "good"]);
    let row = |secret: &str| answer.rows.iter().find(|r| r.secret == secret).unwrap();
    let good = row("good");
    assert_eq!(
        (good.ready, good.manifests, good.reason.as_deref()),
        (2, 2, None)
    );
    assert_eq!(good.server.as_deref(), Some(h.remote_server().as_str()));
    assert!(good.last_ready.is_some() && good.credential_expires.is_some());
    assert!(!good.credential_due);
    let unreachable = row("closed");
    assert!(unreachable.credential_due, "{unreachable:?}");
    assert!(unreachable.failing_since.is_some());
    assert!(
        unreachable
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&closed)),
        "{unreachable:?}"
    );
    let refusing = row("bad-token");
    assert_eq!(
        refusing.not_ready.get("TargetAuthError"),
        Some(&2),
        "{refusing:?}"
    );
    assert!(
        refusing.credential_expires.is_none(),
        "not a JWT: no expiry"
    );
    let missing = row("missing");
    assert!(
        missing
            .secret_problem
            .as_deref()
            .is_some_and(|p| p.contains("not found")),
        "{missing:?}"
    );
    let text = serde_json::to_string(&answer).unwrap();
    for secret in [CANARY_TOKEN, &good_token, &jwt] {
        assert!(!text.contains(secret), "a credential in the answer: {text}");
    }

    let failing = get(&format!("{path}&failing=true"), Some(&viewer))
        .await
        .unwrap();
    let kept: Vec<&str> = failing.rows.iter().map(|r| r.secret.as_str()).collect();
    assert_eq!(kept, ["bad-token", "missing", "closed"]);
    let table = targets_table(&answer, k8s_openapi::jiff::Timestamp::now());
    assert!(
        table.contains("4 targets, 6 Manifests; 3 failing (TargetAuthError 1, TargetError 1, TargetUnreachable 1); 1 with a credential due; 0 throttled"),
        "{table}"
    );
    assert!(table.contains("(due)"), "{table}");

    budget_use_is_added_up_over_the_members(&h, &viewer, busiest).await;
}

/// Issue 29 item 6, requests used against the budget: each replica publishes its busiest
/// targets' requests and waits of the last minute on its membership Lease (a real Lease here,
/// written by a real renewal), and `GET /v1/targets` adds them up over the live members. The
/// first member publishes what this process's real requests to the `good` target counted; a
/// second publishes a use of its own with waits. (Against an answer that took one member's
/// figures, or none, the sums fail.) Run after the view test above: one view at a time per
/// process. `busiest`: what this process published, taken right after the installs.
async fn budget_use_is_added_up_over_the_members(
    h: &Harness,
    viewer: &str,
    busiest: Vec<module_manager::apply::budget::TargetUse>,
) {
    use module_manager::admin::TargetsAnswer;
    use module_manager::apply::budget::TargetUse;
    use module_manager::cli::{TARGETS_TIMEOUT, fetch_within, targets_table};
    use module_manager::shard::membership::{
        MemberLoad, MemberState, Membership, MembershipConfig,
    };
    // What this process's requests to the target counted.
    let counted = busiest.iter().find(|u| u.secret == "good").cloned();
    let counted = counted.unwrap_or_else(|| panic!("no use of `good` counted: {busiest:?}"));
    assert!(counted.requests >= 4, "two installs: {counted:?}");
    assert!(
        !busiest.iter().any(|u| u.secret == "missing"),
        "{busiest:?}"
    );

    let config = |replica: &str| MembershipConfig {
        namespace: h.ns.clone(),
        fleet: "budget-use".into(),
        replica: replica.into(),
        lease_duration: Duration::from_secs(30),
        renew_interval: Duration::from_secs(1),
    };
    let other = TargetUse {
        requests: 5,
        waits: 2,
        ..counted.clone()
    };
    for (replica, targets) in [("mm-0", busiest.clone()), ("mm-1", vec![other])] {
        let load = MemberLoad {
            targets,
            ..Default::default()
        };
        let member = Membership::new(h.local.clone(), config(replica));
        assert!(member.renew(MemberState::Active, Some(&load)).await);
    }
    let mut observer = Membership::new(h.local.clone(), config("observer"));
    observer.observe().await;
    let members = observer.view();
    assert_eq!(members.live().len(), 2, "{members:?}");

    let url = common::admin_server_seeing(&h.local, Default::default(), members).await;
    let path = format!("/v1/targets?namespace={}", h.ns);
    let answer: TargetsAnswer = fetch_within(
        &url,
        http::Method::GET,
        &path,
        Some(viewer),
        TARGETS_TIMEOUT,
    )
    .await
    .unwrap();
    assert_eq!(answer.budget_per_minute, 3000, "the default 50 requests/s");
    assert_eq!(answer.budget_listed_per_replica, 20);
    assert_eq!(answer.throttled, 1, "{answer:#?}");
    let row = |secret: &str| answer.rows.iter().find(|r| r.secret == secret).unwrap();
    let used = row("good")
        .budget
        .clone()
        .expect("the good target's budget use");
    assert_eq!(
        (
            used.requests_per_minute,
            used.waits_per_minute,
            used.replicas
        ),
        (counted.requests + 5, counted.waits + 2, 2),
        "{used:?}"
    );
    assert!((used.used - used.requests_per_minute as f64 / 3000.0).abs() < 1e-9);
    assert_eq!(row("missing").budget, None, "no client, no requests");
    let table = targets_table(&answer, k8s_openapi::jiff::Timestamp::now());
    let shown = format!(
        "{} ({:.0}%), {} waited",
        used.requests_per_minute,
        used.used * 100.0,
        used.waits_per_minute
    );
    assert!(table.contains(&shown), "{table}");
    assert!(table.contains("; 1 throttled"), "{table}");
}

/// `127.0.0.1:<port>` of an `https://127.0.0.1:<port>` server.
fn server_address(server: &str) -> SocketAddr {
    server.trim_start_matches("https://").parse().unwrap()
}

/// A TCP proxy to `upstream` that counts its connections: (address, open now, opened ever).
async fn counting_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (open, opened) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (open_, opened_) = (open.clone(), opened.clone());
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let open = open_.clone();
            opened_.fetch_add(1, Ordering::SeqCst);
            open.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(outbound) = tokio::net::TcpStream::connect(upstream).await {
                    let (from_client, to_client) = inbound.into_split();
                    let (from_server, to_server) = outbound.into_split();
                    let never = Arc::new(AtomicBool::new(false));
                    tokio::join!(
                        pipe(from_client, to_server, never.clone()),
                        pipe(from_server, to_client, never)
                    );
                }
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (address, open, opened)
}

/// A remote target's idle connection is closed once it has been idle for the request timeout,
/// and the next request opens a new one: kube's pool keeps reading an idle connection (to see
/// the server close it) through the connector's read timeout, which fires. What
/// docs/reconcile.md § Remote targets says about connections rests on this.
#[tokio::test]
async fn idle_connections_to_a_target_close_after_the_request_timeout() {
    let plane = remote_plane().await;
    let (address, open, opened) = counting_proxy(server_address(&plane.endpoints().server)).await;
    let mut config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(plane.kubeconfig()).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    config.cluster_url = format!("https://{address}").parse().unwrap();
    // As `TargetClients` builds a target's client, with a short request timeout.
    config.read_timeout = Some(Duration::from_secs(2));
    config.write_timeout = Some(Duration::from_secs(2));
    config.reset_reader_on_write = true;
    let metrics = ApiRequestMetrics::default();
    let client = requests::client(config, &metrics, RequestTarget::Remote).unwrap();
    let namespaces = Api::<Namespace>::all(client);
    namespaces.get("default").await.unwrap();
    assert_eq!(opened.load(Ordering::SeqCst), 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    while open.load(Ordering::SeqCst) > 0 {
        assert!(
            Instant::now() < deadline,
            "the idle connection is still open"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    namespaces.get("default").await.unwrap();
    assert_eq!(
        opened.load(Ordering::SeqCst),
        2,
        "a new connection for the next request"
    );
    assert_eq!(
        metrics.count("get", "namespaces"),
        2,
        "counted as the target's requests"
    );
}

/// A TCP proxy to `upstream` that stops passing bytes (both ways, connections held open) while
/// `paused` is set: a target that stops answering, as in a network partition.
async fn pausable_proxy(upstream: SocketAddr, paused: Arc<AtomicBool>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let paused = paused.clone();
            tokio::spawn(async move {
                let Ok(outbound) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let (from_client, to_client) = inbound.into_split();
                let (from_server, to_server) = outbound.into_split();
                tokio::join!(
                    pipe(from_client, to_server, paused.clone()),
                    pipe(from_server, to_client, paused)
                );
            });
        }
    });
    address
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    paused: Arc<AtomicBool>,
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes that arrive while paused are held back until the pause ends.
        while paused.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_kubeconfig_secret_edited_to_name_another_cluster_is_refused_and_nothing_is_written_there()
 {
    let h = start("remote-identity").await;
    let deployer = format!("{}-deployer", h.ns);
    let kubeconfig = h.service_account_kubeconfig(&deployer).await;
    h.put_secret("remote", &kubeconfig).await;
    let values = json!({"greeting": "hi"});
    let manifest = h.manifest(
        "catalog",
        "examples/charts/catalog-v1",
        Some("remote"),
        values,
    );
    h.create(&manifest).await;
    let installed = h.wait_state("catalog", State::Ready).await;
    let kube_system = |client: &Client| Api::<Namespace>::all(client.clone());
    let remote_identity = kube_system(&h.remote)
        .get("kube-system")
        .await
        .unwrap()
        .uid();
    assert!(remote_identity.is_some());
    let recorded = installed.status.clone().unwrap().target_identity;
    assert_eq!(recorded, remote_identity, "recorded at first contact");

    // The Secret now names another cluster (the local control plane, its admin credentials).
    let other = std::fs::read_to_string(h.local_plane.kubeconfig()).unwrap();
    h.put_secret("remote", &other).await;
    let refused = h
        .wait_error(
            "catalog",
            "TargetError",
            "not the cluster the module was applied to",
        )
        .await;
    let (_, message) = ready_condition(&refused).unwrap();
    let local_identity = kube_system(&h.local)
        .get("kube-system")
        .await
        .unwrap()
        .uid();
    assert!(
        message.contains("Secret remote") && message.contains(&local_identity.unwrap()),
        "{message}"
    );
    assert!(stalled(&refused), "permanent: waits for a change");
    // A spec change is refused too; nothing is ever written to the other cluster.
    h.patch_spec("catalog", json!({"values": {"greeting": "changed"}}))
        .await;
    h.wait_for("catalog", "the new generation refused", |m| {
        let status = m.status.clone().unwrap_or_default();
        status.observed_generation == m.metadata.generation && status.state == Some(State::Error)
    })
    .await;
    assert_eq!(h.local_config_maps().await, Vec::<String>::new());
    let settings = h.remote_config_map("catalog-settings").await.unwrap();
    assert_eq!(
        data(&settings, "greeting").as_deref(),
        Some("hi"),
        "the module's cluster is untouched too"
    );

    // Deleting it completes without touching either cluster: released with a Warning.
    h.delete_and_wait("catalog").await;
    common::expect_event(&h.local, &h.ns, "catalog", |kind, reason, _| {
        kind == "Warning" && reason == "TargetGone"
    })
    .await;
    assert_eq!(h.local_config_maps().await, Vec::<String>::new());
    assert!(
        h.remote_config_map("catalog-settings").await.is_some(),
        "left on the module's cluster"
    );
}

#[tokio::test]
async fn deleting_while_the_target_is_unreachable_retries_until_orphaned() {
    let h = start("remote-unreachable-delete").await;
    h.put_account_secret("deployer").await;
    h.create_tiny("tiny", Some("remote")).await;
    h.wait_state("tiny", State::Ready).await;

    // The target becomes unreachable, then the Manifest is deleted.
    let closed = format!("https://127.0.0.1:{}", closed_port());
    h.put_secret(
        "remote",
        &kubeconfig(&closed, &h.remote_ca(), json!({"token": "x"})),
    )
    .await;
    objects::delete(&h.manifests, "tiny").await;
    let failed = h.wait_error("tiny", "TargetUnreachable", &closed).await;
    assert!(failed.metadata.deletion_timestamp.is_some());
    assert_eq!(
        failed
            .status
            .as_ref()
            .and_then(|s| s.last_operation.as_ref())
            .map(|o| o.operation.as_str()),
        Some("Delete")
    );
    assert!(
        h.remote_config_map("tiny").await.is_some(),
        "nothing deleted"
    );

    // The way out: deletionPolicy Orphan releases it without the target.
    h.patch_spec("tiny", json!({"deletionPolicy": "Orphan"}))
        .await;
    h.wait_until("the Manifest is gone", async || {
        h.manifests.get_opt("tiny").await.unwrap().is_none()
    })
    .await;
    common::expect_event(&h.local, &h.ns, "tiny", |_, reason, _| reason == "Orphaned").await;
    assert!(
        h.remote_config_map("tiny").await.is_some(),
        "left on the target"
    );
}

/// Writes an executable script that creates the file named by its first argument, then prints
/// an ExecCredential with `token`: a kubeconfig that ran it would get in.
fn marker_script(dir: &Path, token: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("credential.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ntouch \"$1\"\necho '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{token}\"}}}}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[tokio::test]
async fn kubeconfigs_that_run_commands_or_read_files_are_refused_and_never_run() {
    let h = start("remote-refused").await;
    let dir = tempfile::tempdir().unwrap();
    let valid_token = h.service_account_token(&format!("{}-deployer", h.ns)).await;
    let valid = h.remote_kubeconfig(json!({ "token": valid_token }));
    let script = marker_script(dir.path(), &valid_token);
    // The script works: run directly, it leaves its marker.
    let probe = dir.path().join("probe");
    assert!(
        std::process::Command::new(&script)
            .arg(&probe)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    );
    assert!(probe.exists());
    let marker = dir.path().join("marker");
    // Files a kubeconfig could name, all holding working credentials.
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &valid_token).unwrap();
    let admin_file = |field: &str, file: &str| {
        use base64::Engine;
        let pem = base64::engine::general_purpose::STANDARD
            .decode(admin_kubeconfig_field(h.remote_plane, "users", field))
            .unwrap();
        let path = dir.path().join(file);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let cert_file = admin_file("client-certificate-data", "admin.crt");
    let key_file = admin_file("client-key-data", "admin.key");
    let ca_file = h.remote_plane.endpoints().dir.join("serving-ca.crt");
    assert!(ca_file.exists());

    let cases = [
        (
            "exec",
            h.remote_kubeconfig(json!({
                "token": CANARY_TOKEN,
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": script,
                    "args": [marker],
                    "interactiveMode": "Never",
                },
            })),
        ),
        (
            "token-file",
            h.remote_kubeconfig(json!({"tokenFile": token_file})),
        ),
        (
            "cert-files",
            h.remote_kubeconfig(json!({"client-certificate": cert_file, "client-key": key_file})),
        ),
        ("ca-file", {
            let config = json!({
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "remote",
                "contexts": [{"name": "remote", "context": {"cluster": "remote", "user": "deployer"}}],
                "clusters": [{"name": "remote", "cluster": {"server": h.remote_server(), "certificate-authority": ca_file}}],
                "users": [{"name": "deployer", "user": {"token": valid_token}}],
            });
            serde_yaml_ng::to_string(&config).unwrap()
        }),
        ("not-yaml", format!("{CANARY_TOKEN}: [unclosed\n")),
    ];
    let expected = [
        ("exec", "sets exec"),
        ("token-file", "sets tokenFile"),
        ("cert-files", "sets client-certificate"),
        ("ca-file", "sets certificate-authority"),
        ("not-yaml", "not a valid kubeconfig"),
    ];
    for (name, config) in &cases {
        h.put_secret(name, config).await;
        h.create_tiny(name, Some(name)).await;
    }
    for (name, text) in expected {
        let failed = h.wait_error(name, "TargetError", text).await;
        let (_, message) = ready_condition(&failed).unwrap();
        assert!(message.contains("is refused"), "{message}");
        assert!(
            stalled(&failed),
            "{name}: permanent until the Secret changes"
        );
        let refused = |events: &[(String, String, String)]| {
            events.iter().any(|(kind, reason, note)| {
                kind == "Warning" && reason == "TargetError" && note.contains(text)
            })
        };
        let events = common::events_once(&h.local, &h.ns, name, refused).await;
        assert!(refused(&events), "{name}: {events:?}");
        for secret in [CANARY_TOKEN, valid_token.as_str()] {
            assert!(!message.contains(secret), "{name}: {message}");
            assert!(events.iter().all(|(_, _, note)| !note.contains(secret)));
        }
    }
    assert!(!marker.exists(), "the exec command was never run");
    assert!(
        !h.remote_namespace_exists().await,
        "nothing reached the remote cluster"
    );
    assert_eq!(h.local_config_maps().await, Vec::<String>::new());
    assert!(h.ctx.targets.is_empty(), "no client was built");
    assert!(
        h.target_errors("refused") >= cases.len() as u64,
        "every refusal counted"
    );

    // A Secret that does not exist yet is retried with backoff until it appears.
    h.create_tiny("later", Some("later")).await;
    let missing = h
        .wait_error("later", "TargetError", "Secret later does not exist")
        .await;
    assert!(!stalled(&missing), "a missing Secret is retried");
    h.put_secret("later", &valid).await;
    h.wait_state("later", State::Ready).await;
    assert!(h.remote_config_map("later").await.is_some());
}

#[tokio::test]
async fn deleting_a_manifest_whose_secret_is_gone_releases_it_with_an_event() {
    let h = start("remote-gone").await;
    h.put_account_secret("deployer").await;
    h.create_tiny("tiny", Some("remote")).await;
    let installed = h.wait_state("tiny", State::Ready).await;
    assert!(h.remote_config_map("tiny").await.is_some());

    h.delete_secret("remote").await;
    h.delete_and_wait("tiny").await;
    let events = h.events("tiny").await;
    let gone = events
        .iter()
        .find(|(kind, reason, _)| kind == "Warning" && reason == "TargetGone")
        .unwrap_or_else(|| panic!("a TargetGone Warning: {events:?}"));
    assert!(
        gone.2.contains("Secret remote does not exist"),
        "{}",
        gone.2
    );
    assert!(gone.2.contains(&installed.uid().unwrap()), "{}", gone.2);
    assert!(
        h.remote_config_map("tiny").await.is_some(),
        "the objects on the target are left"
    );
}
