//! Simulated nodes that stop answering and come back (issue 19): the example Manifests' Deployments
//! roll out on kwok's nodes, kwok is frozen (SIGSTOP) until the node lifecycle controller marks the
//! nodes NotReady and their Pods unready, then resumed (SIGCONT); the Deployments must be
//! Available and their Manifests Ready again.
//!
//! Its own control plane (not the shared one of a test binary): freezing kwok would stall every
//! other test's workloads. kube-controller-manager's grace period is shortened to
//! [`GRACE_PERIOD`] so that the outage takes seconds, not the demo's two minutes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};
use module_manager::work::controller::{self, ControllerConfig};
use test_support::objects;
use test_support::repo;
use tokio::sync::oneshot;

/// The example Manifests that run Deployments (`catalog` and `widgets` have none).
const EXAMPLES: [&str; 2] = ["web", "ledger"];
/// `--node-monitor-grace-period` here: three of kwok's 10 s Lease renewals in a row may be late
/// before a node goes NotReady unasked (which the test would survive: it only waits longer).
const GRACE_PERIOD: Duration = Duration::from_secs(30);
/// Generous bound for every wait (rollouts, the outage, the recovery) on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_ready_again_after_their_nodes_recover() {
    let control_plane = testenv::ControlPlane::start(testenv::Options {
        simulated_nodes: 2,
        node_monitor_grace_period: Some(GRACE_PERIOD),
        crd_files: vec![repo().join("crds/manifest.yaml")],
        ..Default::default()
    })
    .await
    .expect("control plane");
    let client = control_plane.client().await.unwrap();
    let _operator = start_operator(&client).await;
    let manifests = Api::<Manifest>::namespaced(client.clone(), "default");
    for name in EXAMPLES {
        apply_example(&manifests, name).await;
    }
    for name in EXAMPLES {
        wait_until(&format!("{name} Ready and Available"), async || {
            ready(&manifests, name).await && available(&client, name).await
        })
        .await;
    }
    // kwok holds a Lease per node and renews it (without one, the nodes flap every grace period).
    wait_until("a Lease per node", async || {
        renewals(&client).await.len() == 2
    })
    .await;
    let first = renewals(&client).await;
    wait_until("kwok renews every node Lease", async || {
        let now = renewals(&client).await;
        now.len() == first.len() && now.iter().zip(&first).all(|(a, b)| a != b)
    })
    .await;

    let paused = control_plane.pause("kwok").unwrap();
    wait_until("both nodes NotReady", async || {
        nodes_ready(&client).await.iter().all(|ready| !ready)
    })
    .await;
    for name in EXAMPLES {
        wait_until(
            &format!("{name} unavailable, its Manifest not Ready"),
            async || !available(&client, name).await && !ready(&manifests, name).await,
        )
        .await;
    }
    paused.resume().unwrap();

    wait_until("both nodes Ready again", async || {
        nodes_ready(&client).await.iter().all(|ready| *ready)
    })
    .await;
    for name in EXAMPLES {
        wait_until(&format!("{name} Available and Ready again"), async || {
            available(&client, name).await && ready(&manifests, name).await
        })
        .await;
    }
}

/// Stops the in-process operator when dropped.
struct Operator {
    stop: Option<oneshot::Sender<()>>,
    _helm_home: tempfile::TempDir,
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn start_operator(client: &Client) -> Operator {
    let helm_home = tempfile::tempdir().unwrap();
    let ctx = Arc::new(
        test_support::context(client.clone(), helm_home.path())
            .build()
            .await
            .unwrap(),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let config = ControllerConfig {
        namespace: Some("default".into()),
        ..Default::default()
    };
    tokio::spawn(controller::run(ctx, config, async move {
        let _ = stopped.await;
    }));
    Operator {
        stop: Some(stop),
        _helm_home: helm_home,
    }
}

/// Applies `examples/manifests/<name>.yaml` as it is, but re-checked every 2 s, so that the
/// Manifest follows its Deployment's availability within the outage.
async fn apply_example(manifests: &Api<Manifest>, name: &str) {
    let path = repo().join(format!("examples/manifests/{name}.yaml"));
    let mut manifest: Manifest =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest.spec.interval = "2s".into();
    objects::apply(manifests, "node-recovery-test", &manifest).await;
}

/// Whether the Manifest's current generation was reconciled to Ready.
async fn ready(manifests: &Api<Manifest>, name: &str) -> bool {
    let manifest = manifests.get(name).await.unwrap();
    let status = manifest.status.clone().unwrap_or_default();
    status.observed_generation == manifest.metadata.generation && status.state == Some(State::Ready)
}

/// Whether every Deployment in the example's target namespace (named after it) has all its
/// replicas available.
async fn available(client: &Client, name: &str) -> bool {
    let deployments = objects::list(&Api::<Deployment>::namespaced(client.clone(), name)).await;
    !deployments.is_empty()
        && deployments.iter().all(|d| {
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let status = d.status.clone().unwrap_or_default();
            status.available_replicas.unwrap_or(0) == want
                && status.updated_replicas.unwrap_or(0) == want
        })
}

/// Each simulated node's Ready condition is `True`, in name order.
async fn nodes_ready(client: &Client) -> Vec<bool> {
    by_name(Api::<Node>::all(client.clone()))
        .await
        .iter()
        .map(|node| {
            node.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True")
        })
        .collect()
}

/// The renew times of the node Leases (`kube-node-lease`), in name order.
async fn renewals(client: &Client) -> Vec<String> {
    by_name(Api::<Lease>::namespaced(client.clone(), "kube-node-lease"))
        .await
        .iter()
        .map(|lease| {
            let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref());
            format!("{}@{renewed:?}", lease.name_any())
        })
        .collect()
}

/// Every object of `api`, in name order.
async fn by_name<K: objects::Object>(api: Api<K>) -> Vec<K> {
    let mut items = objects::list(&api).await;
    items.sort_by_key(ResourceExt::name_any);
    items
}

/// Polls `done` every half second until it holds; fails after [`PATIENCE`].
async fn wait_until(what: &str, done: impl AsyncFn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
