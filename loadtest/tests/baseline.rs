//! The baselines against a real control plane: the bare client's server-side applies create
//! every object of every release and are idempotent; `helm upgrade --install` stores its
//! releases and creates their objects, with and without `--wait`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use loadtest::baseline::{self, HelmWait};
use serde::de::DeserializeOwned;
use serde_json::json;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

fn chart() -> PathBuf {
    repo().join("loadtest/charts/podinfo-like")
}

fn releases(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

/// Names of the `K`s in `namespace` that start with `prefix` (leaving out `default` and
/// `kube-root-ca.crt`, which every namespace gets).
async fn names<K>(client: &Client, namespace: &str, prefix: &str) -> BTreeSet<String>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .filter(|name| name.starts_with(prefix))
        .collect()
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
    let lp = ListParams::default();
    let mut versions = BTreeSet::new();
    let version = |kind: &str, meta: &kube::api::ObjectMeta| {
        (
            format!("{kind}/{}", meta.name.clone().unwrap()),
            meta.resource_version.clone().unwrap(),
        )
    };
    for cm in Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .unwrap()
    {
        versions.insert(version("ConfigMap", &cm.metadata));
    }
    for svc in Api::<Service>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .unwrap()
    {
        versions.insert(version("Service", &svc.metadata));
    }
    for sa in Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .unwrap()
    {
        versions.insert(version("ServiceAccount", &sa.metadata));
    }
    for d in Api::<Deployment>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .unwrap()
    {
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
    let control_plane = testenv::shared(testenv::Options {
        controller_manager: true,
        crd_files: vec![repo().join("crds/manifest.yaml")],
        ..Default::default()
    })
    .await
    .expect("control plane");
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
    let first = baseline::bare_apply(
        &client,
        &ns,
        &template,
        baseline::TEMPLATE_RELEASE,
        &bare,
        4,
    )
    .await
    .unwrap();
    assert_objects(&client, &ns, "bare-", &bare).await;
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get("bare-3")
        .await
        .unwrap();
    let pod_spec = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod_spec.service_account_name.as_deref(), Some("bare-3"));
    let before = versions(&client, &ns).await;
    let again = baseline::bare_apply(
        &client,
        &ns,
        &template,
        baseline::TEMPLATE_RELEASE,
        &bare,
        4,
    )
    .await
    .unwrap();
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
    let helm_plain = baseline::helm_install(&helm, kubeconfig, &chart(), &ns, &plain, 4)
        .await
        .unwrap();
    assert_releases(&client, &ns, &plain).await;
    assert_objects(&client, &ns, "helm-", &plain).await;

    let ns = control_plane
        .namespace(&client, "lt-helm-wait")
        .await
        .unwrap();
    let waited = releases("wait", 5);
    let helm_waited = baseline::helm_install_waiting(
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

#[tokio::test]
async fn failures_name_the_release_and_carry_helm_s_reason() {
    let helm = testenv::Tools::locate().unwrap().helm;
    let missing = repo().join("loadtest/charts/no-such-chart");
    let err = baseline::render_chart(&helm, &missing, "x", "default", &json!({}))
        .await
        .unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("no-such-chart"), "{message}");

    let control_plane = testenv::shared(testenv::Options {
        controller_manager: true,
        crd_files: vec![repo().join("crds/manifest.yaml")],
        ..Default::default()
    })
    .await
    .expect("control plane");
    let releases = releases("nowhere", 1);
    let err = baseline::helm_install(
        &helm,
        control_plane.kubeconfig(),
        &chart(),
        "no-such-namespace",
        &releases,
        1,
    )
    .await
    .unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("nowhere-0"), "{message}");
    assert!(message.contains("no-such-namespace"), "{message}");
}
