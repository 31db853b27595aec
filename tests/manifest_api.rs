//! The Manifest CRD on a real kube-apiserver: CRUD, CEL validation, the status subresource, and
//! the CRD on the server equals `crds/manifest.yaml`.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use module_manager::api::{
    ChartSource, InventoryEntry, Manifest, ManifestSpec, ManifestStatus, NOT_OBSERVED, State,
};
use module_manager::plan::readiness::{Readiness, readiness};
use serde_json::json;
use test_support::objects;

fn crd_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds/manifest.yaml")
}

/// A client and a fresh namespace on the control plane shared by this test binary.
async fn setup(prefix: &str) -> (Client, Api<Manifest>) {
    let control_plane = testenv::shared(testenv::Options {
        crd_files: vec![crd_file()],
        ..Default::default()
    })
    .await
    .expect("start the control plane");
    let client = control_plane.client().await.expect("client");
    let ns = control_plane
        .namespace(&client, prefix)
        .await
        .expect("namespace");
    (client.clone(), Api::namespaced(client, &ns))
}

fn manifest(name: &str, chart: ChartSource) -> Manifest {
    Manifest::new(
        name,
        ManifestSpec {
            module: "web".into(),
            chart,
            release_name: None,
            target_namespace: None,
            values: Some(json!({"replicaCount": 2})),
            values_from: vec![],
            target: None,
            service_account_name: None,
            deletion_policy: Default::default(),
            adopt: false,
            suspend: false,
            interval: "10m".into(),
            max_history: None,
            timeout: "5m".into(),
            drift_ignore: vec![],
            drift: Default::default(),
            depends_on: vec![],
        },
    )
}

fn path_chart() -> ChartSource {
    ChartSource {
        path: Some("/charts/web".into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn manifest_create_get_list_delete() {
    let (_, api) = setup("crud").await;
    let created = create_web(&api).await;
    assert!(created.uid().is_some());
    // Defaults from the schema are applied by the server.
    assert_eq!(created.spec.interval, "10m");

    let got = api.get("web").await.unwrap();
    assert_eq!(got.spec, created.spec);
    assert_eq!(
        got.spec.values,
        Some(json!({"replicaCount": 2})),
        "free-form values are preserved"
    );

    api.create(&PostParams::default(), &manifest("other", path_chart()))
        .await
        .unwrap();
    let mut names: Vec<String> = objects::names(&api).await;
    names.sort();
    assert_eq!(names, ["other", "web"]);

    objects::delete(&api, "web").await;
    assert!(!objects::exists(&api, "web").await);
}

/// Creates a Manifest from raw JSON and returns the server's rejection message.
async fn rejection(api: &Api<Manifest>, chart: serde_json::Value) -> String {
    let raw = json!({
        "apiVersion": "modulemanager.io/v1alpha1",
        "kind": "Manifest",
        "metadata": {"name": "bad"},
        "spec": {"module": "web", "chart": chart},
    });
    let manifest: Manifest = serde_json::from_value(raw).unwrap();
    refusal(
        api.create(&PostParams::default(), &manifest).await,
        "the Manifest",
    )
}

/// The message of the server's refusal (422) of `what`; fails on any other answer.
fn refusal(result: Result<Manifest, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{what}: {status:?}");
            status.message
        }
        other => panic!("expected the server to refuse {what}, got {other:?}"),
    }
}

/// Creates the Manifest `web` of [`path_chart`].
async fn create_web(api: &Api<Manifest>) -> Manifest {
    api.create(&PostParams::default(), &manifest("web", path_chart()))
        .await
        .unwrap()
}

#[tokio::test]
async fn cel_rule_requires_exactly_one_chart_source() {
    let (_, api) = setup("cel").await;
    for (case, chart, expected) in [
        (
            "two sources",
            json!({"path": "/charts/web", "oci": "oci://registry.example/web:1.0.0"}),
            "exactly one chart source must be set",
        ),
        (
            "no source",
            json!({}),
            "exactly one chart source must be set",
        ),
        (
            "half a repository",
            json!({"repository": "https://charts.example", "name": "web"}),
            "name and version are required with repository",
        ),
        (
            "credentials for a path",
            json!({"path": "/charts/web", "secretRef": {"name": "pull"}}),
            "secretRef is for repository and oci sources",
        ),
    ] {
        let message = rejection(&api, chart).await;
        assert!(message.contains(expected), "{case}: {message}");
    }

    // Each single source is accepted.
    for (name, chart) in [
        ("by-path", json!({"path": "/charts/web"})),
        (
            "by-repo",
            json!({"repository": "https://charts.example", "name": "web", "version": "1.x"}),
        ),
        (
            "by-oci",
            json!({"oci": "oci://registry.example/charts/web:1.0.0"}),
        ),
        (
            "by-oci-with-credentials",
            json!({"oci": "oci://registry.example/charts/web:1.0.0", "secretRef": {"name": "pull"}}),
        ),
    ] {
        let mut m = manifest(name, ChartSource::default());
        m.spec.chart = serde_json::from_value(chart).unwrap();
        api.create(&PostParams::default(), &m)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[tokio::test]
async fn cel_rules_match_the_verification_provider_to_the_source() {
    let (_, api) = setup("cel-verify").await;
    let oci = "oci://registry.example/charts/web:1.0.0";
    let secret = json!({"name": "signers"});
    let cases = [
        (
            json!({"repository": "https://charts.example", "name": "web", "version": "1.0.0",
                   "verify": {"provider": "cosign", "secretRef": secret}}),
            "verify.provider cosign is for oci charts, helm for charts of a Helm repository",
        ),
        (
            json!({"oci": oci, "verify": {"provider": "helm", "secretRef": secret}}),
            "verify.provider cosign is for oci charts, helm for charts of a Helm repository",
        ),
        (
            json!({"path": "/charts/web", "verify": {"provider": "helm", "secretRef": secret}}),
            "verify.provider cosign is for oci charts, helm for charts of a Helm repository",
        ),
        (
            json!({"oci": oci, "verify": {"provider": "cosign"}}),
            "exactly one of secretRef and configMapRef must be set",
        ),
        (
            json!({"oci": oci, "verify": {"provider": "cosign", "secretRef": secret,
                   "configMapRef": secret}}),
            "exactly one of secretRef and configMapRef must be set",
        ),
    ];
    for (chart, expected) in cases {
        let message = rejection(&api, chart.clone()).await;
        assert!(message.contains(expected), "{chart}: {message}");
    }
    for (name, chart) in [
        (
            "cosign",
            json!({"oci": oci, "verify": {"provider": "cosign", "secretRef": secret}}),
        ),
        (
            "helm",
            json!({"repository": "https://charts.example", "name": "web", "version": "1.0.0",
                   "verify": {"provider": "helm", "configMapRef": secret, "key": "pubring.gpg"}}),
        ),
    ] {
        let mut m = manifest(name, ChartSource::default());
        m.spec.chart = serde_json::from_value(chart).unwrap();
        let created = api
            .create(&PostParams::default(), &m)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            created.spec.chart.verify, m.spec.chart.verify,
            "{name}: kept"
        );
    }
}

#[tokio::test]
async fn cel_rule_keeps_the_target_immutable() {
    let (_, api) = setup("target").await;
    let patch = |name: &'static str, spec: serde_json::Value| {
        let api = api.clone();
        async move {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": spec })),
            )
            .await
        }
    };
    let immutable = |result: Result<Manifest, kube::Error>| {
        let message = refusal(result, "the change of target");
        assert!(message.contains("spec.target is immutable"), "{message}");
    };
    let remote = json!({"kubeconfigSecretRef": {"name": "remote"}});

    // Local → remote is refused; other changes are not.
    api.create(&PostParams::default(), &manifest("local", path_chart()))
        .await
        .unwrap();
    immutable(patch("local", json!({ "target": remote })).await);
    patch("local", json!({"values": {"replicaCount": 3}}))
        .await
        .unwrap();

    // Remote → another Secret, another key, or local is refused.
    let mut m = manifest("remote", path_chart());
    m.spec.target = Some(serde_json::from_value(remote.clone()).unwrap());
    let created = api.create(&PostParams::default(), &m).await.unwrap();
    assert_eq!(
        created.spec.target.unwrap().kubeconfig_secret_ref.key,
        "kubeconfig",
        "the key defaults to kubeconfig"
    );
    immutable(
        patch(
            "remote",
            json!({"target": {"kubeconfigSecretRef": {"name": "other"}}}),
        )
        .await,
    );
    immutable(
        patch(
            "remote",
            json!({"target": {"kubeconfigSecretRef": {"name": "remote", "key": "other"}}}),
        )
        .await,
    );
    immutable(patch("remote", json!({ "target": null })).await);
    // Restating the same target (with or without the default key) is no change.
    patch("remote", json!({ "target": remote, "suspend": true }))
        .await
        .unwrap();
}

#[tokio::test]
async fn status_subresource_round_trips() {
    let (_, api) = setup("status").await;
    create_web(&api).await;

    let status = ManifestStatus {
        state: Some(State::Ready),
        observed_generation: Some(1),
        shard: Some(17),
        owner: Some("module-manager-0".into()),
        chart_digest: Some(format!("sha256:{}", "a".repeat(64))),
        ..Default::default()
    };
    let patch =
        json!({"apiVersion": "modulemanager.io/v1alpha1", "kind": "Manifest", "status": status});
    let params = PatchParams::apply("module-manager-test").force();
    let patched = api
        .patch_status("web", &params, &Patch::Apply(&patch))
        .await
        .unwrap();
    assert_eq!(patched.status.as_ref(), Some(&status));
    assert_eq!(api.get("web").await.unwrap().status, Some(status.clone()));

    // Writes to the main resource do not touch the status (that is what the subresource is for).
    let mut edited = api.get("web").await.unwrap();
    edited.status = Some(ManifestStatus {
        state: Some(State::Error),
        ..Default::default()
    });
    edited.spec.suspend = true;
    let replaced = api
        .replace("web", &PostParams::default(), &edited)
        .await
        .unwrap();
    assert!(replaced.spec.suspend);
    assert_eq!(replaced.status, Some(status));
}

/// kstatus' reading of a Manifest as the server serves it, through the operator's port.
fn kstatus_ready(manifest: &Manifest) -> bool {
    let id = InventoryEntry {
        group: "modulemanager.io".into(),
        version: "v1alpha1".into(),
        kind: "Manifest".into(),
        namespace: manifest.namespace().unwrap_or_default(),
        name: manifest.name_any(),
    };
    let object = serde_json::to_value(manifest).unwrap();
    let now = k8s_openapi::jiff::Timestamp::now();
    match readiness(&id, &object, now) {
        Readiness::Ready => true,
        Readiness::Waiting(_) => false,
        Readiness::Failed(why) => panic!("a new Manifest read as failed: {why}"),
    }
}

#[tokio::test]
async fn a_new_manifest_reads_in_progress_until_a_pass_writes_its_status() {
    let (_, api) = setup("unobserved").await;
    let created = create_web(&api).await;
    // The server fills in the CRD's default status: no generation observed yet. Without it
    // kstatus (Flux's health checks, `kpt live status`) reads an object without conditions as
    // Current, before anything was installed.
    for seen in [
        created,
        api.get("web").await.unwrap(),
        objects::list(&api).await.remove(0),
    ] {
        let status = seen.status.clone().expect("the default status");
        assert_eq!(status.observed_generation, Some(NOT_OBSERVED));
        assert_eq!(status.state, None);
        assert!(!kstatus_ready(&seen), "a new Manifest reads InProgress");
    }

    // The inventory record before the applies writes only its own fields: still in progress.
    let inventory = json!({"status": {"inventory": [{"group": "", "version": "v1",
        "kind": "ConfigMap", "namespace": "apps", "name": "web"}]}});
    let recorded = api
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&inventory))
        .await
        .unwrap();
    let status = recorded.status.clone().unwrap();
    assert_eq!(status.observed_generation, Some(NOT_OBSERVED));
    assert_eq!(status.inventory.len(), 1);
    assert!(!kstatus_ready(&recorded));

    // The first status of a pass names the generation it describes: Current when Ready.
    let ready = json!({"status": {"state": "Ready", "observedGeneration": 1, "conditions": [
        {"type": "Ready", "status": "True", "reason": "Ready", "message": "all objects ready",
         "observedGeneration": 1, "lastTransitionTime": "2026-12-03T09:00:00Z"}]}});
    let written = api
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .unwrap();
    assert_eq!(
        written.status.as_ref().unwrap().observed_generation,
        Some(1)
    );
    assert!(
        kstatus_ready(&written),
        "a Ready status of generation 1 reads Current"
    );
}

#[tokio::test]
async fn crd_on_the_server_equals_the_checked_in_file() {
    let (client, _) = setup("crd").await;
    let file = testenv::parse_crds(&std::fs::read_to_string(crd_file()).unwrap()).unwrap();
    assert_eq!(file.len(), 1);
    // The file is what the Rust types generate ...
    assert_eq!(file[0], module_manager::api::manifest_crd());

    // ... and what the server stores, apart from the two fields the server defaults.
    let on_server = Api::<CustomResourceDefinition>::all(client)
        .get("manifests.modulemanager.io")
        .await
        .unwrap();
    let mut server_spec = on_server.spec;
    assert_eq!(
        server_spec.conversion.take().map(|c| c.strategy).as_deref(),
        Some("None")
    );
    assert_eq!(
        server_spec.names.list_kind.take().as_deref(),
        Some("ManifestList")
    );
    let (server, local) = (
        serde_json::to_value(&server_spec).unwrap(),
        serde_json::to_value(&file[0].spec).unwrap(),
    );
    assert!(
        server == local,
        "the CRD on the server differs from crds/manifest.yaml:\n{}",
        json_diff(&server, &local, "")
    );
}

/// The paths at which two JSON values differ, one per line (readable where `Debug` of a CRD is not).
fn json_diff(server: &serde_json::Value, file: &serde_json::Value, path: &str) -> String {
    use serde_json::Value::Object;
    match (server, file) {
        (Object(a), Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter()
                .map(|k| {
                    let null = serde_json::Value::Null;
                    json_diff(
                        a.get(k).unwrap_or(&null),
                        b.get(k).unwrap_or(&null),
                        &format!("{path}.{k}"),
                    )
                })
                .collect()
        }
        (a, b) if a == b => String::new(),
        (a, b) => format!("{path}: server {a} file {b}\n"),
    }
}

#[tokio::test]
async fn the_timeout_defaults_to_five_minutes_and_must_be_a_duration() {
    let (_, api) = setup("timeout").await;
    let mut m = manifest("web", path_chart());
    m.spec.timeout = "90s".into();
    api.create(&PostParams::default(), &m).await.unwrap();
    let patch = |timeout: serde_json::Value| {
        let api = api.clone();
        async move {
            api.patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"timeout": timeout}})),
            )
            .await
        }
    };
    for bad in ["soon", "5", "1h 2m"] {
        let message = refusal(patch(json!(bad)).await, bad);
        assert!(message.contains("spec.timeout"), "{bad}: {message}");
    }
    // Removed, it is defaulted by the server.
    let defaulted = patch(serde_json::Value::Null).await.unwrap();
    assert_eq!(defaulted.spec.timeout, "5m");
}

/// Names, durations and lists outside the CRD's schema are refused by the API server, naming
/// the field: they never reach a replica (a release name or namespace with `..` or `/` would
/// otherwise become part of object names and paths).
#[tokio::test]
async fn names_intervals_and_lists_outside_the_schema_are_refused() {
    let (_, api) = setup("schema").await;
    let many: Vec<_> = (0..33)
        .map(|i| json!({"kind": "ConfigMap", "name": format!("v{i}")}))
        .collect();
    for (field, value) in [
        ("releaseName", json!("../etc")),
        ("releaseName", json!("Web")),
        ("releaseName", json!("a".repeat(54))),
        ("targetNamespace", json!("kube_system")),
        ("targetNamespace", json!("a.b")),
        ("targetNamespace", json!("a".repeat(64))),
        ("serviceAccountName", json!("../default")),
        ("interval", json!("1d")),
        ("interval", json!("-5m")),
        ("interval", json!(format!("{}h", "9".repeat(40)))),
        ("timeout", json!("5m; rm -rf /")),
        ("module", json!("")),
        ("valuesFrom", json!(many)),
        ("drift", json!({"overrideManagers": [""]})),
        ("drift", json!({"overrideManagers": vec!["kubectl"; 17]})),
        (
            "drift",
            json!({"overrideManagers": ["kubectl", "module-manager"]}),
        ),
        (
            "drift",
            json!({"overrideManagers": ["module-manager-handover"]}),
        ),
    ] {
        let mut spec = json!({"module": "web", "chart": {"path": "/charts/web"}});
        spec[field] = value;
        let raw = json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": "bad"},
            "spec": spec,
        });
        let manifest: Manifest = serde_json::from_value(raw).unwrap();
        match api.create(&PostParams::default(), &manifest).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{field}: {status:?}");
                assert!(
                    status.message.contains(&format!("spec.{field}")),
                    "{field}: {}",
                    status.message
                );
            }
            other => panic!("{field}: expected the server to refuse it, got {other:?}"),
        }
    }
    assert!(!objects::exists(&api, "bad").await);
}
