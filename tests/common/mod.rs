//! Helpers the reconcile-style integration tests share (each test binary includes this module
//! with `mod common;` and uses what it needs).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use module_manager::api::Manifest;
use serde_json::{Value, json};

/// Merge-patches a Manifest's spec.
pub async fn patch_spec(manifests: &Api<Manifest>, name: &str, spec: Value) {
    manifests
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

/// Waits until the Manifest satisfies `done` (at most `limit`), showing its status on failure.
pub async fn wait_for(
    manifests: &Api<Manifest>,
    name: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&Manifest) -> bool,
) -> Manifest {
    let deadline = Instant::now() + limit;
    loop {
        let manifest = manifests.get(name).await.unwrap();
        if done(&manifest) {
            return manifest;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: timed out waiting for {what}; status: {:#?}",
            manifest.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (at most `limit`) until the Manifest's current generation is reconciled into `state`.
pub async fn wait_state(
    manifests: &Api<Manifest>,
    name: &str,
    state: module_manager::api::State,
    limit: Duration,
) -> Manifest {
    wait_for(manifests, name, &format!("{state:?}"), limit, |m| {
        let status = m.status.clone().unwrap_or_default();
        status.state == Some(state) && status.observed_generation == m.metadata.generation
    })
    .await
}

/// Whether the Manifest's current generation waits for objects it applied to roll out: its
/// `Ready` condition names them ("waiting for …"), as the first look at the rollout writes it
/// (the pass that applied leaves that status to the look).
pub fn rolling_out(manifest: &Manifest) -> bool {
    let status = manifest.status.clone().unwrap_or_default();
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    status.state == Some(module_manager::api::State::Processing)
        && status.observed_generation == manifest.metadata.generation
        && ready.is_some_and(|c| c.reason == "Progressing" && c.message.starts_with("waiting for"))
}

/// Waits (60 s) until the Manifest `name` is gone (its finalizer released).
pub async fn wait_for_gone(manifests: &Api<Manifest>, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while manifests.get_opt(name).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "{name}: timed out waiting until it is gone"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Events about the object named `regarding` in `namespace`, as (type, reason, note).
pub async fn events(
    client: &Client,
    namespace: &str,
    regarding: &str,
) -> Vec<(String, String, String)> {
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

/// [`events`] once `found` holds for them, or as they are after 10 s (the caller's assertion then
/// shows them). A pass writes the status first and publishes its Event after, so a test that saw
/// the status may list the Events a moment too early.
pub async fn events_once(
    client: &Client,
    namespace: &str,
    regarding: &str,
    found: impl Fn(&[(String, String, String)]) -> bool,
) -> Vec<(String, String, String)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events = events(client, namespace, regarding).await;
        if found(&events) || Instant::now() >= deadline {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asserts that an Event about `regarding` matching `found(type, reason, note)` appears within
/// 10 s (see [`events_once`]), and returns the Events seen.
pub async fn expect_event(
    client: &Client,
    namespace: &str,
    regarding: &str,
    found: impl Fn(&str, &str, &str) -> bool,
) -> Vec<(String, String, String)> {
    let matches = |events: &[(String, String, String)]| {
        events
            .iter()
            .any(|(kind, reason, note)| found(kind, reason, note))
    };
    let events = events_once(client, namespace, regarding, matches).await;
    assert!(matches(&events), "{regarding}: no such Event in {events:?}");
    events
}

/// The inventory of a Manifest's status as `Kind/name`.
pub fn inventory_names(manifest: &Manifest) -> Vec<String> {
    let status = manifest.status.clone().unwrap_or_default();
    status
        .inventory
        .iter()
        .map(|e| format!("{}/{}", e.kind, e.name))
        .collect()
}

/// Plays the Deployment controller: writes the status of a Deployment whose `replicas` have
/// rolled out (counts, the `Available` condition and `Progressing` with reason
/// `NewReplicaSetAvailable`, as kstatus' rule needs them).
pub async fn deployment_rolled_out(client: &Client, ns: &str, name: &str, replicas: i64) {
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), ns);
    let generation = deployments.get(name).await.unwrap().metadata.generation;
    let status = json!({"status": {"observedGeneration": generation, "replicas": replicas,
    "updatedReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
    "conditions": [
        {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
    ]}});
    deployments
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("write the status of Deployment {name}: {e}"));
}

/// An operator reconciling one test namespace on the shared control plane (the namespace,
/// garbage-collector, ServiceAccount and HPA controllers, no workload controllers: tests play
/// those), stopped when dropped.
pub struct Operator {
    pub client: Client,
    pub ns: String,
    pub manifests: Api<Manifest>,
    pub ctx: std::sync::Arc<module_manager::reconcile::Context>,
    /// The controller's caches and queue.
    pub work: module_manager::work::caches::Work,
    _running: Running,
    _helm_home: tempfile::TempDir,
}

/// A test file's harness: an [`Operator`] (stopped when dropped) that the file extends with its
/// own helpers (`impl Harness` there; its methods come before the [`Operator`]'s).
pub struct Harness(pub Operator);

impl std::ops::Deref for Harness {
    type Target = Operator;

    fn deref(&self) -> &Operator {
        &self.0
    }
}

/// A controller running in the background (see [`spawn_controller`]), stopped when dropped.
pub struct Running(Option<tokio::sync::oneshot::Sender<()>>);

impl Running {
    /// Nothing runs (what replaces a running controller that was stopped).
    pub fn stopped() -> Self {
        Self(None)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.0.take() {
            let _ = stop.send(());
        }
    }
}

/// Runs `controller` in the background until the returned [`Running`] is dropped.
pub fn spawn_controller(controller: module_manager::work::controller::Controller) -> Running {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(controller.run(async move {
        let _ = stopped.await;
    }));
    Running(Some(stop))
}

/// Runs a controller of every Manifest `config` selects with `ctx` in the background, until the
/// returned [`Running`] is dropped.
pub fn run_controller(
    ctx: std::sync::Arc<module_manager::reconcile::Context>,
    config: module_manager::work::controller::ControllerConfig,
) -> Running {
    use module_manager::shard::fence::Ownership;
    use module_manager::work::controller::Controller;
    spawn_controller(Controller::new(ctx, config, Ownership::everything()))
}

/// The shared control plane of [`Operator`]s: the namespace, garbage-collector,
/// ServiceAccount and HorizontalPodAutoscaler controllers (the last acts only on the HPA objects
/// of `tests/drift.rs`; with no metrics it only keeps replicas within min and max), the
/// Manifest CRD.
pub async fn control_plane() -> &'static testenv::ControlPlane {
    control_plane_with(Some(
        "namespace,garbagecollector,serviceaccount,horizontalpodautoscaling",
    ))
    .await
}

/// The kube-controller-manager controllers most tests want: namespace, garbage collector and
/// ServiceAccount (no workload controllers: tests play those).
pub const BASIC_CONTROLLERS: &str = "namespace,garbagecollector,serviceaccount";

/// The control plane shared by this test binary with the Manifest CRD and kube-controller-manager
/// running `controllers` (`None`: no controller manager). The first caller's choice holds.
pub async fn control_plane_with(controllers: Option<&str>) -> &'static testenv::ControlPlane {
    testenv::shared(testenv::Options {
        controller_manager: controllers.is_some(),
        controllers: controllers.map(Into::into),
        crd_files: vec![test_support::repo().join("crds/manifest.yaml")],
        ..Default::default()
    })
    .await
    .expect("control plane")
}

/// The control plane shared by this test binary with the Manifest CRD, no controller manager,
/// and kube-apiserver's feature gates `gates` on (e.g. [`testenv::SHARDED_LIST_AND_WATCH`]).
/// The first caller's choice holds.
pub async fn control_plane_with_gates(gates: &[&str]) -> &'static testenv::ControlPlane {
    testenv::shared(testenv::Options {
        crd_files: vec![test_support::repo().join("crds/manifest.yaml")],
        feature_gates: gates.iter().map(|gate| (*gate).to_owned()).collect(),
        ..Default::default()
    })
    .await
    .expect("control plane")
}

/// Starts an [`Operator`] as `replica` in a new namespace named after `prefix`.
pub async fn operator(prefix: &str, replica: &str) -> Operator {
    operator_with(prefix, 2, |context| context.replica(replica)).await
}

/// [`operator`] with `concurrency` workers and a Context as `configure` makes it from the
/// test default (limits, a replica name, …).
pub async fn operator_with(
    prefix: &str,
    concurrency: usize,
    configure: impl FnOnce(test_support::ContextBuilder) -> test_support::ContextBuilder,
) -> Operator {
    operator_on(control_plane().await, prefix, concurrency, configure).await
}

/// [`operator_with`] on `control_plane`.
pub async fn operator_on(
    control_plane: &testenv::ControlPlane,
    prefix: &str,
    concurrency: usize,
    configure: impl FnOnce(test_support::ContextBuilder) -> test_support::ContextBuilder,
) -> Operator {
    use module_manager::shard::fence::Ownership;
    use module_manager::work::controller::{Controller, ControllerConfig};
    let client = control_plane.client().await.unwrap();
    let ns = control_plane.namespace(&client, prefix).await.unwrap();
    let helm_home = tempfile::tempdir().unwrap();
    let ctx = std::sync::Arc::new(
        configure(test_support::context(client.clone(), helm_home.path()))
            .build()
            .await
            .unwrap(),
    );
    let config = ControllerConfig {
        concurrency,
        namespace: Some(ns.clone()),
        ..Default::default()
    };
    let controller = Controller::new(ctx.clone(), config, Ownership::everything());
    let work = controller.work();
    Operator {
        manifests: Api::namespaced(client.clone(), &ns),
        client,
        ns,
        ctx,
        work,
        _running: spawn_controller(controller),
        _helm_home: helm_home,
    }
}

impl Operator {
    /// Creates `manifest` in the test namespace.
    pub async fn create(&self, manifest: &Manifest) {
        create_manifest(&self.manifests, manifest).await;
    }

    /// Merge-patches a Manifest's spec.
    pub async fn patch_spec(&self, name: &str, spec: Value) {
        patch_spec(&self.manifests, name, spec).await;
    }

    /// Waits until the Manifest satisfies `done` (60 s), showing its status on failure.
    pub async fn wait_for(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&Manifest) -> bool,
    ) -> Manifest {
        wait_for(&self.manifests, name, what, PATIENCE, done).await
    }

    /// Waits (60 s) for the current generation to be reconciled into `state`.
    pub async fn wait_state(&self, name: &str, state: module_manager::api::State) -> Manifest {
        wait_state(&self.manifests, name, state, PATIENCE).await
    }

    /// Polls `done` until it holds (60 s).
    pub async fn wait_until(&self, what: &str, done: impl AsyncFnMut() -> bool) {
        wait_until(what, PATIENCE, done).await;
    }

    /// Deletes a Manifest and waits (60 s) until it is gone (its finalizer released).
    pub async fn delete_and_wait(&self, name: &str) {
        delete_and_wait(&self.manifests, name, PATIENCE).await;
    }
}

/// How long the [`Operator`] helpers wait.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `done` every 200 ms until it holds; fails after `limit`.
pub async fn wait_until(what: &str, limit: Duration, done: impl AsyncFnMut() -> bool) {
    wait_until_described(what, limit, done, async || String::new()).await;
}

/// [`wait_until`], failing with what `describe` says of the state at that moment.
pub async fn wait_until_described(
    what: &str,
    limit: Duration,
    mut done: impl AsyncFnMut() -> bool,
    describe: impl AsyncFn() -> String,
) {
    let deadline = Instant::now() + limit;
    while !done().await {
        if Instant::now() >= deadline {
            let now = describe().await;
            if now.is_empty() {
                panic!("timed out waiting until {what}");
            }
            panic!("timed out waiting until {what}; now:\n{now}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes the Manifest `name` and waits (at most `limit`) until it is gone.
pub async fn delete_and_wait(manifests: &Api<Manifest>, name: &str, limit: Duration) {
    manifests
        .delete(name, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    wait_until(&format!("{name} is gone"), limit, async || {
        manifests.get_opt(name).await.unwrap().is_none()
    })
    .await;
}

/// A Manifest `name` of namespace `ns` with `spec`.
pub fn manifest(ns: &str, name: &str, spec: Value) -> Manifest {
    serde_json::from_value(json!({
        "apiVersion": "modulemanager.io/v1alpha1",
        "kind": "Manifest",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap()
}

/// The spec of module `name` from the local chart at `chart` with `values`, re-checked every 2 s.
pub fn chart_spec(name: &str, chart: &str, values: Value) -> Value {
    json!({"module": name, "chart": {"path": chart}, "values": values, "interval": "2s"})
}

/// Creates `manifest` through `manifests`.
pub async fn create_manifest(manifests: &Api<Manifest>, manifest: &Manifest) {
    manifests
        .create(&kube::api::PostParams::default(), manifest)
        .await
        .unwrap();
}

/// The condition `type_` of a Manifest's status as (status, reason, message).
pub fn condition(manifest: &Manifest, type_: &str) -> Option<(String, String, String)> {
    let status = manifest.status.as_ref()?;
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The `Ready` condition of a Manifest's status as (reason, message).
pub fn ready_condition(manifest: &Manifest) -> Option<(String, String)> {
    condition(manifest, "Ready").map(|(_, reason, message)| (reason, message))
}

/// Sets an annotation of a Manifest (a metadata-only change: the generation stays).
pub async fn annotate(manifests: &Api<Manifest>, name: &str, key: &str, value: &str) {
    manifests
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": {"annotations": {key: value}} })),
        )
        .await
        .unwrap();
}

/// What a test ServiceAccount is granted: nothing, `rules` in its namespace (a Role), `rules`
/// cluster-wide (a ClusterRole: non-resource URLs such as `/v1/drain` need one), or an existing
/// ClusterRole (such as `cluster-admin`).
pub enum Grant {
    Nothing,
    Role(Value),
    ClusterRole(Value),
    ExistingClusterRole(&'static str),
}

/// A token for `audiences` (none: the API server's own) of a new ServiceAccount `name` of
/// `ns`, granted `grant` (its Role, ClusterRole or ClusterRoleBinding named after it).
pub async fn account_token(
    client: &Client,
    ns: &str,
    name: &str,
    grant: Grant,
    audiences: &[&str],
) -> String {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), ns);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    accounts
        .create(&kube::api::PostParams::default(), &account)
        .await
        .unwrap();
    let subject = json!([{"kind": "ServiceAccount", "name": name, "namespace": ns}]);
    let cluster_wide = format!("{ns}-{name}");
    match grant {
        Grant::Nothing => {}
        Grant::Role(rules) => {
            rbac_role(client, Some(ns), "Role", name, rules).await;
            rbac_binding(client, Some(ns), "Role", name, name, subject).await;
        }
        Grant::ClusterRole(rules) => {
            rbac_role(client, None, "ClusterRole", &cluster_wide, rules).await;
            rbac_binding(
                client,
                None,
                "ClusterRole",
                &cluster_wide,
                &cluster_wide,
                subject,
            )
            .await;
        }
        Grant::ExistingClusterRole(role) => {
            rbac_binding(client, None, "ClusterRole", &cluster_wide, role, subject).await;
        }
    }
    token_request(&accounts, name, audiences).await
}

/// The rbac.authorization.k8s.io/v1 objects of `kind` in `ns` (`None`: cluster-wide).
fn rbac_api(client: &Client, ns: Option<&str>, kind: &str) -> Api<kube::api::DynamicObject> {
    let resource = kube::discovery::ApiResource {
        group: "rbac.authorization.k8s.io".into(),
        version: "v1".into(),
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// Creates the Role or ClusterRole (`kind`) `name` with `rules`.
async fn rbac_role(client: &Client, ns: Option<&str>, kind: &str, name: &str, rules: Value) {
    let role: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
        "metadata": {"name": name}, "rules": rules,
    }))
    .unwrap();
    rbac_api(client, ns, kind)
        .create(&kube::api::PostParams::default(), &role)
        .await
        .unwrap();
}

/// Creates the `{kind}Binding` `name` of the `kind` `role` to `subjects`.
async fn rbac_binding(
    client: &Client,
    ns: Option<&str>,
    kind: &str,
    name: &str,
    role: &str,
    subjects: Value,
) {
    let binding_kind = format!("{kind}Binding");
    let binding: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding_kind,
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": subjects,
    }))
    .unwrap();
    rbac_api(client, ns, &binding_kind)
        .create(&kube::api::PostParams::default(), &binding)
        .await
        .unwrap();
}

/// An hour's token of ServiceAccount `name` for `audiences`.
async fn token_request(
    accounts: &Api<k8s_openapi::api::core::v1::ServiceAccount>,
    name: &str,
    audiences: &[&str],
) -> String {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    let request: TokenRequest = serde_json::from_value(json!({"spec": {
        "audiences": audiences,
        "expirationSeconds": 3600,
    }}))
    .unwrap();
    accounts
        .create_token_request(name, &kube::api::PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .unwrap()
}

/// A token for the admin API's audience of a new ServiceAccount `name` of `ns`, granted `grant`.
pub async fn admin_token(client: &Client, ns: &str, name: &str, grant: Grant) -> String {
    let audiences = [module_manager::admin::TOKEN_AUDIENCE];
    account_token(client, ns, name, grant, &audiences).await
}

/// The admin server on a loopback port with `client` behind it and `reviews`: its URL.
pub async fn admin_server(client: &Client, reviews: module_manager::admin::Reviews) -> String {
    admin_server_seeing(client, reviews, Default::default()).await
}

/// [`admin_server`], its replica seeing the fleet's `members`.
pub async fn admin_server_seeing(
    client: &Client,
    reviews: module_manager::admin::Reviews,
    members: module_manager::shard::membership::Members,
) -> String {
    use module_manager::admin::{AdminState, ServeLimits};
    use tokio::sync::watch;
    let state = AdminState {
        registry: std::sync::Arc::new(module_manager::telemetry::metrics::registry()),
        synced: std::sync::Arc::default(),
        members: watch::channel(members).1,
        fleet: watch::channel(Default::default()).1,
        work: None,
        drain: watch::channel(false).0,
        client: Some(client.clone()),
        reviews: std::sync::Arc::new(reviews),
        manifest_selector: None,
        target_budget: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(module_manager::admin::serve(
        listener,
        module_manager::admin::router(state),
        ServeLimits::default(),
    ));
    url
}

/// kubectl from the tool cache (`hack/build-tools.sh` builds it beside kube-apiserver).
pub fn kubectl() -> std::path::PathBuf {
    let tools = testenv::Tools::locate().unwrap();
    let kubectl = tools.kube_apiserver.with_file_name("kubectl");
    assert!(
        kubectl.is_file(),
        "{} is missing: run hack/build-tools.sh",
        kubectl.display()
    );
    kubectl
}
