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
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _helm_home: tempfile::TempDir,
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The shared control plane of [`Operator`]s: the namespace, garbage-collector,
/// ServiceAccount and HorizontalPodAutoscaler controllers (the last acts only on the HPA objects
/// of `tests/drift.rs`; with no metrics it only keeps replicas within min and max), the
/// Manifest CRD.
pub async fn control_plane() -> &'static testenv::ControlPlane {
    testenv::shared(testenv::Options {
        controller_manager: true,
        controllers: Some(
            "namespace,garbagecollector,serviceaccount,horizontalpodautoscaling".into(),
        ),
        crd_files: vec![test_support::repo().join("crds/manifest.yaml")],
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
    use module_manager::shard::fence::Ownership;
    use module_manager::work::controller::{Controller, ControllerConfig};
    let control_plane = control_plane().await;
    let client = control_plane.client().await.unwrap();
    let ns = control_plane.namespace(&client, prefix).await.unwrap();
    let helm_home = tempfile::tempdir().unwrap();
    let ctx = std::sync::Arc::new(
        configure(test_support::context(client.clone(), helm_home.path()))
            .build()
            .await
            .unwrap(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = ControllerConfig {
        concurrency,
        namespace: Some(ns.clone()),
        ..Default::default()
    };
    let controller = Controller::new(ctx.clone(), config, Ownership::everything());
    let work = controller.work();
    tokio::spawn(controller.run(async move {
        let _ = stopped.await;
    }));
    Operator {
        manifests: Api::namespaced(client.clone(), &ns),
        client,
        ns,
        ctx,
        work,
        stop: Some(stop),
        _helm_home: helm_home,
    }
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

/// What a test ServiceAccount is granted: nothing, `rules` in its namespace (a Role), or
/// `rules` cluster-wide (a ClusterRole: non-resource URLs such as `/v1/drain` need one).
pub enum Grant {
    Nothing,
    Role(Value),
    ClusterRole(Value),
}

/// A token for `audiences` (none: the API server's own) of a new ServiceAccount `name` of
/// `ns`, granted `grant` (its Role or ClusterRole named after it).
pub async fn account_token(
    client: &Client,
    ns: &str,
    name: &str,
    grant: Grant,
    audiences: &[&str],
) -> String {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::api::{DynamicObject, PostParams};
    let post = PostParams::default();
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), ns);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    accounts.create(&post, &account).await.unwrap();
    let subject = json!([{"kind": "ServiceAccount", "name": name, "namespace": ns}]);
    let (kind, rules, role_name) = match grant {
        Grant::Nothing => return token_request(&accounts, name, audiences).await,
        Grant::Role(rules) => ("Role", rules, name.to_owned()),
        Grant::ClusterRole(rules) => ("ClusterRole", rules, format!("{ns}-{name}")),
    };
    let rbac = kube::discovery::ApiResource {
        group: "rbac.authorization.k8s.io".into(),
        version: "v1".into(),
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    let binding_kind = format!("{kind}Binding");
    let binding_resource = kube::discovery::ApiResource {
        kind: binding_kind.clone(),
        plural: format!("{}s", binding_kind.to_lowercase()),
        ..rbac.clone()
    };
    let (roles, bindings) = if kind == "Role" {
        (
            Api::<DynamicObject>::namespaced_with(client.clone(), ns, &rbac),
            Api::<DynamicObject>::namespaced_with(client.clone(), ns, &binding_resource),
        )
    } else {
        (
            Api::<DynamicObject>::all_with(client.clone(), &rbac),
            Api::<DynamicObject>::all_with(client.clone(), &binding_resource),
        )
    };
    let role: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
        "metadata": {"name": role_name}, "rules": rules,
    }))
    .unwrap();
    roles.create(&post, &role).await.unwrap();
    let binding: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding_kind,
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role_name},
        "subjects": subject,
    }))
    .unwrap();
    bindings.create(&post, &binding).await.unwrap();
    token_request(&accounts, name, audiences).await
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
    use module_manager::admin::{AdminState, ServeLimits};
    use tokio::sync::watch;
    let state = AdminState {
        registry: std::sync::Arc::new(module_manager::telemetry::metrics::registry()),
        synced: std::sync::Arc::default(),
        members: watch::channel(Default::default()).1,
        fleet: watch::channel(Default::default()).1,
        work: None,
        drain: watch::channel(false).0,
        client: Some(client.clone()),
        reviews: std::sync::Arc::new(reviews),
        manifest_selector: None,
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
