//! The baselines against a real control plane: the bare client's server-side applies create
//! every object of every release and are idempotent; `helm upgrade --install` stores its
//! releases and creates their objects, with and without `--wait`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use loadtest::baseline::{self, HelmWait};
use loadtest::manifest_writes::{self, Writes};
use module_manager::api::{Manifest, State};
use module_manager::apply::MANIFEST_SHARD_LABEL;
use module_manager::apply::MANIFEST_UID_LABEL;
use module_manager::shard::SHARD_LABEL;
use module_manager::shard::hash::ShardCount;
use module_manager::telemetry::requests::{self, ApiRequestMetrics, RequestTarget};
use serde_json::json;
use test_support::objects;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

fn chart() -> PathBuf {
    repo().join("loadtest/charts/podinfo-like")
}

/// The shared control plane, with kube-controller-manager and the Manifest CRD.
async fn control_plane() -> &'static testenv::ControlPlane {
    testenv::shared(testenv::Options {
        controller_manager: true,
        crd_files: vec![repo().join("crds/manifest.yaml")],
        ..Default::default()
    })
    .await
    .expect("control plane")
}

fn releases(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

/// Names of the `K`s in `namespace` that start with `prefix` (leaving out `default` and
/// `kube-root-ca.crt`, which every namespace gets).
async fn names<K: Namespaced>(client: &Client, namespace: &str, prefix: &str) -> BTreeSet<String> {
    let api = Api::<K>::namespaced(client.clone(), namespace);
    let names = objects::names(&api).await.into_iter();
    names.filter(|name| name.starts_with(prefix)).collect()
}

/// A namespaced object type.
trait Namespaced:
    objects::Object + Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
{
}
impl<K: objects::Object + Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>
    Namespaced for K
{
}

/// (`<kind>/<name>`, resourceVersion) of every `K` in `namespace`.
async fn resource_versions<K: Namespaced>(
    client: &Client,
    namespace: &str,
    kind: &str,
) -> Vec<(String, String)> {
    let api = Api::<K>::namespaced(client.clone(), namespace);
    let version = |o: &K| {
        (
            format!("{kind}/{}", o.name_any()),
            o.resource_version().unwrap(),
        )
    };
    objects::list(&api).await.iter().map(version).collect()
}

/// Asserts the chart's four objects exist for each release.
async fn assert_objects(client: &Client, namespace: &str, prefix: &str, releases: &[String]) {
    let expected: BTreeSet<String> = releases.iter().cloned().collect();
    let configs: BTreeSet<String> = releases.iter().map(|r| format!("{r}-config")).collect();
    assert_eq!(
        names::<ServiceAccount>(client, namespace, prefix).await,
        expected
    );
    assert_eq!(names::<ConfigMap>(client, namespace, prefix).await, configs);
    assert_eq!(names::<Service>(client, namespace, prefix).await, expected);
    assert_eq!(
        names::<Deployment>(client, namespace, prefix).await,
        expected
    );
}

/// (name, resourceVersion) of the ConfigMaps, Services and ServiceAccounts (nothing but the
/// applies writes them) and (name, generation) of the Deployments.
async fn versions(client: &Client, namespace: &str) -> BTreeSet<(String, String)> {
    let mut versions = BTreeSet::new();
    versions.extend(resource_versions::<ConfigMap>(client, namespace, "ConfigMap").await);
    versions.extend(resource_versions::<Service>(client, namespace, "Service").await);
    let accounts = resource_versions::<ServiceAccount>(client, namespace, "ServiceAccount");
    versions.extend(accounts.await);
    for d in objects::list(&Api::<Deployment>::namespaced(client.clone(), namespace)).await {
        let generation = d.metadata.generation.unwrap().to_string();
        versions.insert((format!("Deployment/{}", d.name_any()), generation));
    }
    versions
}

/// Asserts helm stored revision 1 of each release, deployed.
async fn assert_releases(client: &Client, namespace: &str, releases: &[String]) {
    let stored: BTreeSet<String> = Api::<Secret>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels("owner=helm,status=deployed"))
        .await
        .unwrap()
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    let expected: BTreeSet<String> = releases
        .iter()
        .map(|r| format!("sh.helm.release.v1.{r}.v1"))
        .collect();
    assert_eq!(stored, expected);
}

#[tokio::test]
async fn bare_apply_and_helm_install_create_every_release() {
    let control_plane = control_plane().await;
    let client = control_plane.client().await.unwrap();
    let helm = testenv::Tools::locate().unwrap().helm;

    // Bare client: render once, apply 10 releases 4 at a time, then again.
    let ns = control_plane.namespace(&client, "lt-bare").await.unwrap();
    let template =
        baseline::render_chart(&helm, &chart(), baseline::TEMPLATE_RELEASE, &ns, &json!({}))
            .await
            .unwrap();
    let kinds: BTreeSet<&str> = template
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["ConfigMap", "Deployment", "Service", "ServiceAccount"])
    );
    let bare = releases("bare", 10);
    let these = baseline::Releases {
        objects_template: &template,
        template_release: baseline::TEMPLATE_RELEASE,
        names: &bare,
        parallelism: 4,
    };
    let first = baseline::bare_apply(&client, &ns, &these).await.unwrap();
    assert_objects(&client, &ns, "bare-", &bare).await;
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get("bare-3")
        .await
        .unwrap();
    let pod_spec = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod_spec.service_account_name.as_deref(), Some("bare-3"));
    let before = versions(&client, &ns).await;
    let again = baseline::bare_apply(&client, &ns, &these).await.unwrap();
    assert_objects(&client, &ns, "bare-", &bare).await;
    assert_eq!(
        versions(&client, &ns).await,
        before,
        "applying again changed an object"
    );

    // helm, without and with --wait.
    let ns = control_plane.namespace(&client, "lt-helm").await.unwrap();
    let plain = releases("helm", 5);
    let kubeconfig = control_plane.kubeconfig();
    let hooks_only = HelmWait::HooksOnly;
    let helm_plain =
        baseline::helm_install(&helm, kubeconfig, &chart(), &ns, &plain, 4, hooks_only)
            .await
            .unwrap();
    assert_releases(&client, &ns, &plain).await;
    assert_objects(&client, &ns, "helm-", &plain).await;

    let ns = control_plane
        .namespace(&client, "lt-helm-wait")
        .await
        .unwrap();
    let waited = releases("wait", 5);
    let helm_waited = baseline::helm_install(
        &helm,
        kubeconfig,
        &chart(),
        &ns,
        &waited,
        4,
        HelmWait::Watcher,
    )
    .await
    .unwrap();
    assert_releases(&client, &ns, &waited).await;
    assert_objects(&client, &ns, "wait-", &waited).await;

    for (what, burst) in [
        ("bare apply, 10 releases", &first),
        ("bare apply again", &again),
        ("helm, 5 releases", &helm_plain),
        ("helm --wait, 5 releases", &helm_waited),
    ] {
        eprintln!(
            "{what}, parallelism {}: {:.2} s, {:.1} releases/s",
            burst.parallelism, burst.seconds, burst.per_second
        );
    }
}

/// Six releases through the bare client with `writes`, 4 at once, in a new namespace: the
/// requests it sent (counted as a replica counts its own), the namespace, the releases.
async fn send(writes: Writes, prefix: &str) -> (ApiRequestMetrics, Client, String, Vec<String>) {
    let control_plane = control_plane().await;
    let client = control_plane.client().await.unwrap();
    let helm = testenv::Tools::locate().unwrap().helm;
    let ns = control_plane.namespace(&client, prefix).await.unwrap();
    let sent = ApiRequestMetrics::default();
    let config = control_plane.config().await.unwrap();
    let counted = requests::client(config, &sent, RequestTarget::Local).unwrap();
    let template =
        baseline::render_chart(&helm, &chart(), baseline::TEMPLATE_RELEASE, &ns, &json!({}))
            .await
            .unwrap();
    let names = releases(prefix, 6);
    let chart_spec = json!({"path": "loadtest/charts/podinfo-like"});
    let labels = BTreeMap::from([("loadtest-run".to_owned(), ns.clone())]);
    let shape = manifest_writes::Shape {
        chart: &chart_spec,
        interval: "10m",
        labels: &labels,
        more_spec: None,
    };
    let releases = baseline::Releases {
        objects_template: &template,
        template_release: baseline::TEMPLATE_RELEASE,
        names: &names,
        parallelism: 4,
    };
    let burst =
        manifest_writes::bare_with_manifest_writes(&counted, &ns, &releases, &shape, writes)
            .await
            .unwrap();
    assert!(burst.seconds > 0.0);
    assert_objects(&client, &ns, &format!("{prefix}-"), &names).await;
    (sent, client, ns, names)
}

/// Asserts each release left what an install leaves: its Manifest claimed (shard label, a
/// finalizer), `Ready` with its inventory and the UIDs of the live objects, which carry its
/// UID and shard; `events` `Ready` Events about it.
async fn assert_installed(client: &Client, ns: &str, releases: &[String], events: usize) {
    let manifests: Api<Manifest> = Api::namespaced(client.clone(), ns);
    let published: Api<Event> = Api::namespaced(client.clone(), ns);
    let published = published.list(&ListParams::default()).await.unwrap().items;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for release in releases {
        let manifest = manifests.get(release).await.unwrap();
        let uid = manifest.uid().unwrap();
        let shard = ShardCount::DEFAULT.shard_of(&uid).to_string();
        assert_eq!(manifest.labels()[SHARD_LABEL], shard);
        assert_eq!(manifest.finalizers().len(), 1, "{release}");
        let status = manifest.status.unwrap();
        assert_eq!(status.state, Some(State::Ready), "{release}");
        assert_eq!(status.inventory.len(), 4, "{release}");
        assert_eq!(status.inventory_uids.len(), 4, "{release}");
        let deployment = deployments.get(release).await.unwrap();
        assert_eq!(deployment.labels()[MANIFEST_UID_LABEL], uid);
        assert_eq!(deployment.labels()[MANIFEST_SHARD_LABEL], shard);
        let recorded = status.inventory_uids.values();
        assert!(
            recorded
                .into_iter()
                .any(|u| Some(u) == deployment.uid().as_ref()),
            "{release}: {:?}",
            status.inventory_uids
        );
        let ready = published.iter().filter(|e| {
            e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
                && e.reason.as_deref() == Some("Ready")
        });
        assert_eq!(ready.count(), events, "{release}");
    }
}

/// Asserts the six releases sent `expected` (verb, resource — any for `apply` —, requests per
/// release) and nothing else but discovery.
fn assert_sent(sent: &ApiRequestMetrics, expected: &[(&str, &str, f64)]) {
    for &(verb, resource, count) in expected {
        let sent_here = if verb == "apply" {
            sent.sum(|l| l.verb == "apply")
        } else {
            sent.count(verb, resource)
        };
        assert_eq!(sent_here as f64 / 6.0, count, "{verb} {resource}");
    }
    let all = sent.sum(|l| l.resource != "discovery") as f64;
    let per_release: f64 = expected.iter().map(|e| e.2).sum();
    assert_eq!(all, 6.0 * per_release, "nothing else: {:?}", sent.seen());
}

const MANIFESTS: &str = "modulemanager.io/manifests";
const STATUS: &str = "modulemanager.io/manifests/status";

/// The bare client with the Manifest's writes sends the fleet's requests of an install per
/// release and leaves what the fleet's install leaves.
#[tokio::test]
async fn the_manifest_writes_baseline_sends_an_install_s_requests() {
    let (sent, client, ns, names) = send(Writes::Fleet, "writes").await;
    // The create, the claim, 2 statuses (the inventory with the first status, Ready), 4
    // applies, the Deployment's read, the Event.
    let expected = [
        ("create", MANIFESTS, 1.0),
        ("patch", MANIFESTS, 1.0),
        ("patch", STATUS, 2.0),
        ("apply", "", 4.0),
        ("get", "apps/deployments", 1.0),
        ("create", "events.k8s.io/events", 1.0),
    ];
    assert_sent(&sent, &expected);
    assert_installed(&client, &ns, &names, 1).await;
}

/// With the minimum writes: the create, the claim, the inventory, 4 applies, the `Ready`
/// status; no read or Event — and the same Manifests as the fleet's.
#[tokio::test]
async fn the_minimum_writes_baseline_sends_what_the_contract_needs() {
    let (sent, client, ns, names) = send(Writes::Minimum, "minimum").await;
    let expected = [
        ("create", MANIFESTS, 1.0),
        ("patch", MANIFESTS, 1.0),
        ("patch", STATUS, 2.0),
        ("apply", "", 4.0),
    ];
    assert_sent(&sent, &expected);
    assert_installed(&client, &ns, &names, 0).await;
}

#[tokio::test]
async fn failures_name_the_release_and_carry_helm_s_reason() {
    let helm = testenv::Tools::locate().unwrap().helm;
    let missing = repo().join("loadtest/charts/no-such-chart");
    let err = baseline::render_chart(&helm, &missing, "x", "default", &json!({}))
        .await
        .unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("no-such-chart"), "{message}");

    let control_plane = control_plane().await;
    let releases = releases("nowhere", 1);
    let err = baseline::helm_install(
        &helm,
        control_plane.kubeconfig(),
        &chart(),
        "no-such-namespace",
        &releases,
        1,
        HelmWait::HooksOnly,
    )
    .await
    .unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("nowhere-0"), "{message}");
    assert!(message.contains("no-such-namespace"), "{message}");
}
