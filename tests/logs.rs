//! The operator's JSON logs, captured from the real binary reconciling real Manifests (install,
//! upgrade with a prune, a render error, values from a Secret, a remote target reached through a
//! kubeconfig Secret and one whose kubeconfig is refused, deletion): every line a pass writes
//! carries the component IDs (namespace, name, uid, module, shard, replica, reconcile id), every
//! pipeline line is inside a pass, and no Secret value or credential reaches the log.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};
use serde_json::{Value, json};
use test_support::objects;

/// The fields every line of a pass carries (from the controller's `reconcile` span).
const COMPONENT_IDS: [&str; 7] = [
    "namespace",
    "name",
    "uid",
    "module",
    "shard",
    "replica",
    "reconcile_id",
];

/// Log targets that only run inside a pass.
const PIPELINE_TARGETS: [&str; 8] = [
    "module_manager::reconcile",
    "module_manager::apply::target",
    "module_manager::render",
    "module_manager::apply",
    "module_manager::plan",
    "module_manager::plan::readiness",
    "module_manager::source",
    "module_manager::render::values",
];

const SECRET_VALUE: &str = "s3cr3t-db-host-7f3a";
/// The token of a refused kubeconfig (it must not be logged either).
const CANARY_TOKEN: &str = "canary-token-5e8dd1e3";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

async fn wait_for(
    api: &Api<Manifest>,
    name: &str,
    what: &str,
    done: impl Fn(Option<&Manifest>) -> bool,
) {
    let start = Instant::now();
    loop {
        let manifest = api.get_opt(name).await.unwrap();
        if done(manifest.as_ref()) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "{name}: never {what}; last seen {:?}",
            manifest.and_then(|m| m.status)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn in_state(state: State) -> impl Fn(Option<&Manifest>) -> bool {
    move |m| {
        m.and_then(|m| m.status.as_ref()).is_some_and(|s| {
            s.state == Some(state) && s.observed_generation == m.unwrap().metadata.generation
        })
    }
}

/// The `reconcile` span of a JSON log line, if the line was written inside a pass.
fn reconcile_span(line: &Value) -> Option<&Value> {
    line["spans"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == "reconcile")
}

#[tokio::test]
async fn every_line_of_a_pass_carries_the_component_ids_and_no_secret() {
    let control_plane = testenv::shared(testenv::Options {
        crd_files: vec![repo().join("crds/manifest.yaml")],
        ..Default::default()
    })
    .await
    .expect("control plane");
    let client: Client = control_plane.client().await.unwrap();
    let ns = control_plane.namespace(&client, "logs").await.unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("operator.log");
    let replica = format!("{ns}-0");

    let mut command = Command::new(env!("CARGO_BIN_EXE_module-manager"));
    command
        .current_dir(repo())
        .env("KUBECONFIG", control_plane.kubeconfig())
        .env("RUST_LOG", "info,module_manager=debug,kube=warn")
        .args(["run", "--replica", &replica, "--chart-root", "."])
        .arg("--helm")
        .arg(testenv::Tools::locate().unwrap().helm)
        .arg("--renderer")
        .arg(testenv::Tools::locate().unwrap().renderer)
        .args(test_support::LOCAL_CHART_HOST_FLAGS)
        .args(["--fleet", &ns, "--lease-namespace", &ns, "--shards", "16"])
        .args(["--admin-address", "127.0.0.1:0"])
        .args(["--manifest-selector", &format!("logs-test={ns}")]);
    let mut operator = testenv::Proc::spawn(
        "module-manager",
        command,
        &log,
        testenv::Lifetime::TiedToThisProcess,
    )
    .unwrap();

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "db"},
                "stringData": {"values.yaml": format!("dbHost: {SECRET_VALUE}\n")},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // A remote target: this same cluster, reached through a kubeconfig Secret holding a real
    // token of a ServiceAccount; and a kubeconfig that is refused (exec), with a token too.
    let token = target_token(&client, &ns).await;
    let admin: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(control_plane.kubeconfig()).unwrap())
            .unwrap();
    let kubeconfig = |user: Value| {
        serde_yaml_ng::to_string(&json!({
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "target",
            "contexts": [{"name": "target", "context": {"cluster": "target", "user": "deployer"}}],
            "clusters": [{"name": "target", "cluster": {
                "server": control_plane.endpoints().server,
                "certificate-authority-data": admin["clusters"][0]["cluster"]["certificate-authority-data"],
            }}],
            "users": [{"name": "deployer", "user": user}],
        }))
        .unwrap()
    };
    for (name, user) in [
        ("target", json!({ "token": token })),
        (
            "refused",
            json!({"token": CANARY_TOKEN, "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "true"}}),
        ),
    ] {
        let secret =
            json!({"metadata": {"name": name}, "stringData": {"kubeconfig": kubeconfig(user)}});
        objects::create_json(&secrets, secret).await;
    }
    let manifests: Api<Manifest> = Api::namespaced(client.clone(), &ns);
    let on_target = |name: &str, secret: &str| {
        json!({"module": name, "chart": {"path": "tests/fixtures/charts/tiny"},
               "target": {"kubeconfigSecretRef": {"name": secret}}})
    };
    for (name, spec) in [
        // Install, then upgrade to a version that drops objects (prune).
        (
            "catalog",
            json!({"module": "catalog", "chart": {"path": "examples/charts/catalog-v1"}}),
        ),
        // Values from a Secret.
        (
            "secret-values",
            json!({"module": "db", "chart": {"path": "tests/fixtures/charts/needs-value"},
                   "targetNamespace": format!("{ns}-db"),
                   "valuesFrom": [{"kind": "Secret", "name": "db"}]}),
        ),
        // A render error.
        (
            "broken",
            json!({"module": "broken", "chart": {"path": "tests/fixtures/charts/needs-value"}}),
        ),
        // On a remote target, and with a refused kubeconfig.
        ("remote", on_target("remote", "target")),
        ("refused", on_target("refused", "refused")),
    ] {
        let manifest = json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": name, "labels": {"logs-test": ns}},
            "spec": spec,
        });
        objects::create_json(&manifests, manifest).await;
    }
    wait_for(&manifests, "catalog", "Ready", in_state(State::Ready)).await;
    wait_for(&manifests, "secret-values", "Ready", in_state(State::Ready)).await;
    wait_for(&manifests, "broken", "Error", in_state(State::Error)).await;
    wait_for(&manifests, "remote", "Ready", in_state(State::Ready)).await;
    wait_for(&manifests, "refused", "Error", in_state(State::Error)).await;
    objects::merge(
        &manifests,
        "catalog",
        json!({"spec": {"chart": {"path": "examples/charts/catalog-v2"}}}),
    )
    .await;
    wait_for(&manifests, "catalog", "upgraded", in_state(State::Ready)).await;
    // The operator's writes to a Manifest name their field manager (the test's own writes
    // have none and no user agent: `unknown`); its create of the target namespace names none,
    // and the API server names it after the operator's user agent.
    let target: Namespace = Api::all(client.clone())
        .get(&format!("{ns}-db"))
        .await
        .unwrap();
    let managers: Vec<_> = target
        .managed_fields()
        .iter()
        .map(|f| f.manager.clone())
        .collect();
    assert_eq!(managers, [Some("module-manager".to_owned())]);
    let catalog = manifests.get("catalog").await.unwrap();
    let writers: BTreeSet<(String, String)> = catalog
        .managed_fields()
        .iter()
        .map(|f| {
            let name = f.manager.clone().unwrap_or_default();
            (name, f.subresource.clone().unwrap_or_default())
        })
        .collect();
    for part in ["status", ""] {
        assert!(
            writers.contains(&("module-manager".to_owned(), part.to_owned())),
            "no write of module-manager to {part:?} in {writers:?}"
        );
    }
    assert!(
        !writers.contains(&("unknown".to_owned(), "status".to_owned())),
        "{writers:?}"
    );
    let uids: BTreeSet<String> = objects::list(&manifests)
        .await
        .iter()
        .filter_map(|m| m.uid())
        .collect();
    let all = ["catalog", "secret-values", "broken", "remote", "refused"];
    for name in all {
        objects::delete(&manifests, name).await;
    }
    for name in all {
        wait_for(&manifests, name, "deleted", |m| m.is_none()).await;
    }
    operator.stop(Duration::from_secs(30));

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains(SECRET_VALUE),
        "a Secret's value reached the log"
    );
    for credential in [token.as_str(), CANARY_TOKEN] {
        assert!(
            !text.contains(credential),
            "a kubeconfig's token reached the log"
        );
    }
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let mut passes = BTreeSet::new();
    let mut messages = BTreeSet::new();
    for line in &lines {
        let target = line["target"].as_str().unwrap_or_default();
        let message = line["message"].as_str().unwrap_or_default();
        let Some(span) = reconcile_span(line) else {
            assert!(
                !PIPELINE_TARGETS.iter().any(|t| target.starts_with(t)),
                "a pipeline line outside a pass: {line}"
            );
            continue;
        };
        for field in COMPONENT_IDS {
            let value = &span[field];
            assert!(
                !value.is_null() && value != "",
                "{field} missing or empty: {line}"
            );
        }
        assert!(uids.contains(span["uid"].as_str().unwrap()), "{line}");
        assert_eq!(span["replica"], replica.as_str(), "{line}");
        passes.insert(span["reconcile_id"].to_string());
        messages.insert(message.split(':').next().unwrap_or_default().to_owned());
    }
    // The check above saw the lines it is about: every step of the scenario logged inside a
    // pass, from the controller and from the pipeline.
    for expected in [
        "reconcile start",
        "reconcile end",
        "rendered",
        "applied",
        "deleted",
        "render",
        "reconcile failed",
        "connecting to a target cluster",
    ] {
        assert!(
            messages.contains(expected),
            "no {expected:?} line inside a pass; messages seen: {messages:?}"
        );
    }
    let starts = lines
        .iter()
        .filter(|l| l["message"] == "reconcile start")
        .count();
    assert_eq!(starts, passes.len(), "one reconcile id per pass");
    assert!(passes.len() >= 6, "{passes:?}");
}

/// A token of a new ServiceAccount in `ns` bound to `cluster-admin` (for the remote target).
async fn target_token(client: &Client, ns: &str) -> String {
    let admin = common::Grant::ExistingClusterRole("cluster-admin");
    common::account_token(client, ns, "deployer", admin, &[]).await
}
