//! The deployment (`deploy/`, rendered by the pinned kustomize, and the chart `helm/module-manager`,
//! rendered by the pinned helm) against the real API server:
//!
//! - every object of both is accepted by a server-side apply with `dryRun=All` and strict field
//!   validation, and the StatefulSet's pod passes the `restricted` Pod Security Standard;
//! - the real binary, running as the deployed ServiceAccount (a token from the TokenRequest API)
//!   with exactly the deployed RBAC, installs a module, serves the drain endpoint to the
//!   deployed drain role only, deletes the module and leaves the fleet — without one forbidden
//!   request;
//! - the chart's RBAC grants every permission the preflight asks for;
//! - a ServiceAccount without bindings makes the binary exit with the preflight's list.
//!
//! The ServiceMonitor and PrometheusRule need the Prometheus Operator's CRDs, which this
//! repository does not build: `tests/common/monitoring_crds.rs` makes minimal CRDs written for this test after
//! the Prometheus Operator's API reference (`monitoring.coreos.com/v1`): the fields the
//! deployment uses, with their types. With strict field validation, a misspelled or misplaced
//! field is rejected — and so is a real field they leave out (add it here when the deployment
//! starts using it). What they do not reproduce is the rest of the operator's own schema.
//!
//! Runs in seconds: one control plane (with the ClusterRole aggregation controller) for the four
//! tests, one operator process.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{
    Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    ValidationDirective,
};
use kube::discovery::{Discovery, Scope};
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};
use module_manager::runtime::preflight;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use test_support::objects;

#[path = "common/monitoring_crds.rs"]
mod monitoring_crds;
use monitoring_crds::install_monitoring_crds;

/// The namespace `deploy/` installs into.
const NAMESPACE: &str = "module-manager";
/// The chart is rendered as this release, in this namespace.
const RELEASE: &str = "mm";
const HELM_NAMESPACE: &str = "mm-helm";
/// The field manager of the test's applies.
const MANAGER: &str = "deploy-test";
/// The smallest margin the termination grace must leave after the drain and the handover.
const MIN_TERMINATION_MARGIN: i64 = 15;
/// How long a step of a scenario may take before the test fails (a limit, never a measurement).
const LIMIT: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

async fn control_plane() -> &'static testenv::ControlPlane {
    testenv::shared(testenv::Options {
        crd_files: vec![repo().join("crds/manifest.yaml")],
        // ClusterRole aggregation fills in module-manager-modules; no workload controllers (no
        // StatefulSet pods: the test runs the replica itself).
        controller_manager: true,
        controllers: Some("clusterrole-aggregation-controller,serviceaccount-controller".into()),
        ..Default::default()
    })
    .await
    .expect("control plane")
}

fn tools() -> testenv::Tools {
    let tools = testenv::Tools::locate().expect("the pinned tools");
    assert!(
        tools.kustomize.is_file(),
        "{} is missing: run `hack/build-tools.sh` (or `make tools`)",
        tools.kustomize.display()
    );
    tools
}

// ---------------------------------------------------------------------------------------------
// Rendering.

/// Parses multi-document YAML into JSON values (empty documents skipped).
fn documents(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("start the tool");
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `kustomize build <repo>/<dir>`.
fn kustomize(dir: &str) -> Vec<Value> {
    documents(&run(Command::new(tools().kustomize)
        .arg("build")
        .arg(repo().join(dir))))
}

/// The pinned helm with a private home (as the operator runs it).
fn helm(home: &Path) -> Command {
    let mut command = Command::new(tools().helm);
    command
        .env_clear()
        .env("HOME", home)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    command
}

/// `helm template mm helm/module-manager --namespace mm-helm --include-crds <args>`.
fn helm_template(args: &[&str]) -> Vec<Value> {
    helm_template_of(&repo().join("helm/module-manager"), args)
}

/// `helm template mm <chart> --namespace mm-helm --include-crds <args>` (a directory or `.tgz`).
fn helm_template_of(chart: &Path, args: &[&str]) -> Vec<Value> {
    let home = tempfile::tempdir().unwrap();
    documents(&run(helm(home.path())
        .args(["template", RELEASE])
        .arg(chart)
        .args(["--namespace", HELM_NAMESPACE, "--include-crds"])
        .args(args)))
}

/// Every monitoring toggle of the chart on.
const ALL_MONITORING: &[&str] = &[
    "--set",
    "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.dashboards.enabled=true",
];

fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

fn find<'a>(objects: &'a [Value], kind_: &str, name_: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| kind(o) == kind_ && name(o) == name_)
        .unwrap_or_else(|| panic!("no {kind_} {name_} in {:?}", kinds(objects)))
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| format!("{}/{}", kind(o), name(o)))
        .collect()
}

/// `value` with every number as a float (`0` and `0.0` compare equal).
fn numbers_as_floats(value: Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64().unwrap()),
        Value::Array(items) => Value::Array(items.into_iter().map(numbers_as_floats).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, numbers_as_floats(v)))
                .collect(),
        ),
        other => other,
    }
}

/// The `--name=value` argument of a container.
fn flag<'a>(args: &'a [Value], name: &str) -> Option<&'a str> {
    args.iter()
        .filter_map(Value::as_str)
        .filter_map(|a| a.strip_prefix(name)?.strip_prefix('='))
        .next_back()
}

// ---------------------------------------------------------------------------------------------
// Structural checks, the same for kustomize and the chart.

/// What both renderings must say about the fleet (`prefix`: `module-manager` or
/// `mm-module-manager`).
fn check_deployment(objects: &[Value], prefix: &str) {
    for (kind_, suffix) in [
        ("ServiceAccount", ""),
        ("ClusterRole", ""),
        ("ClusterRoleBinding", ""),
        ("Role", ""),
        ("RoleBinding", ""),
        ("ClusterRole", "-modules"),
        ("ClusterRoleBinding", "-modules"),
        ("ClusterRole", "-modules-default"),
        ("ClusterRole", "-drain"),
        ("ClusterRole", "-targets"),
        ("StatefulSet", ""),
        ("Service", "-headless"),
        ("Service", "-admin"),
        ("PodDisruptionBudget", ""),
        ("ServiceMonitor", ""),
        ("PrometheusRule", ""),
        ("ConfigMap", "-dashboards"),
    ] {
        find(objects, kind_, &format!("{prefix}{suffix}"));
    }
    // The CRD is the generated one (kustomize writes `0.0` as `0`: compared as numbers).
    let crd = find(
        objects,
        "CustomResourceDefinition",
        "manifests.modulemanager.io",
    );
    let generated = documents(&module_manager::api::manifest_crd_yaml());
    assert!(
        numbers_as_floats(crd.clone()) == numbers_as_floats(generated[0].clone()),
        "the deployed CRD differs from `module-manager crd`: run `make crds`"
    );

    let sts = find(objects, "StatefulSet", prefix);
    let spec = &sts["spec"];
    assert_eq!(spec["replicas"], 3);
    assert_eq!(spec["podManagementPolicy"], "Parallel");
    let pod = &spec["template"]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(
        &spec["selector"]["matchLabels"], labels,
        "selector ≠ pod labels"
    );
    let headless = find(objects, "Service", spec["serviceName"].as_str().unwrap());
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(headless["spec"]["selector"], *labels);
    assert_eq!(
        pod["serviceAccountName"], prefix,
        "the pods run as the ServiceAccount the RBAC binds"
    );

    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    let args = container["args"].as_array().unwrap();
    assert_eq!(args[0], "run");
    assert_eq!(flag(args, "--shards"), Some("256"));
    // Graceful termination: drain the passes, hand the shards over, then a margin.
    let drain: i64 = flag(args, "--drain-timeout-seconds")
        .unwrap()
        .parse()
        .unwrap();
    let handover: i64 = flag(args, "--handover-timeout-seconds")
        .unwrap()
        .parse()
        .unwrap();
    let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
    assert!(
        grace >= drain + handover + MIN_TERMINATION_MARGIN,
        "terminationGracePeriodSeconds {grace} < drain {drain} + handover {handover} + {MIN_TERMINATION_MARGIN}"
    );
    // The replica's identity comes from the downward API; the StatefulSet is this one.
    let env = container["env"].as_array().unwrap();
    let var = |n: &str| {
        env.iter()
            .find(|e| e["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        var("POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(
        var("POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(var("STATEFULSET_NAME")["value"], *name(sts));
    // Probes on the admin API's port.
    let admin = flag(args, "--admin-address").unwrap();
    let port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "admin")
        .expect("a port named admin");
    assert_eq!(
        admin.rsplit(':').next().unwrap(),
        port["containerPort"].to_string()
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin");
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());
    // Non-root, read-only, no capabilities; helm's home on a writable emptyDir.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    let helm_home = flag(args, "--helm-home").expect("--helm-home");
    let writable = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == m["name"] && v["emptyDir"].is_object())
        })
        .any(|m| Path::new(helm_home).starts_with(m["mountPath"].as_str().unwrap()));
    assert!(writable, "--helm-home {helm_home} is not on an emptyDir");

    let pdb = find(objects, "PodDisruptionBudget", prefix);
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], *labels);

    // The ServiceMonitor selects exactly the admin Service, on a port it has.
    let monitor = find(objects, "ServiceMonitor", prefix);
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    let selected: Vec<&Value> = objects
        .iter()
        .filter(|o| kind(o) == "Service")
        .filter(|s| {
            selector
                .iter()
                .all(|(k, v)| s["metadata"]["labels"][k] == *v)
        })
        .collect();
    assert_eq!(selected.len(), 1, "the ServiceMonitor selects {selected:?}");
    assert_eq!(name(selected[0]), format!("{prefix}-admin"));
    assert_eq!(selected[0]["spec"]["selector"], *labels);
    let port_name = &monitor["spec"]["endpoints"][0]["port"];
    assert!(
        selected[0]["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == *port_name)
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");

    let dashboards = find(objects, "ConfigMap", &format!("{prefix}-dashboards"));
    assert_eq!(dashboards["metadata"]["labels"]["grafana_dashboard"], "1");
    let data = dashboards["data"].as_object().unwrap();
    assert!(!data.is_empty());
    for (file, text) in data {
        let dashboard: Value = serde_json::from_str(text.as_str().unwrap())
            .unwrap_or_else(|e| panic!("dashboard {file} is not JSON: {e}"));
        assert!(dashboard["panels"].is_array(), "{file} has no panels");
    }

    // The aggregated role for the modules, and its default piece.
    let modules = find(objects, "ClusterRole", &format!("{prefix}-modules"));
    let aggregation = &modules["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"];
    let piece = find(objects, "ClusterRole", &format!("{prefix}-modules-default"));
    for (k, v) in aggregation.as_object().unwrap() {
        assert_eq!(
            piece["metadata"]["labels"][k], *v,
            "the default piece is not aggregated"
        );
    }
    assert!(
        modules.get("rules").is_none(),
        "an aggregated ClusterRole's rules belong to the aggregation controller"
    );
    let drain = find(objects, "ClusterRole", &format!("{prefix}-drain"));
    assert_eq!(
        drain["rules"],
        json!([{"nonResourceURLs": ["/v1/drain"], "verbs": ["post", "delete"]}])
    );
    let targets = find(objects, "ClusterRole", &format!("{prefix}-targets"));
    assert_eq!(
        targets["rules"],
        json!([{"nonResourceURLs": ["/v1/targets"], "verbs": ["get"]}])
    );
}

// ---------------------------------------------------------------------------------------------
// The API server.

/// Server-side applies `objects` with strict field validation; answers a line per object the
/// server refused. For real, ownership is not forced (a second apply must not conflict with a
/// controller); a dry run forces it (it checks what the server accepts, while another test may
/// have changed a field, e.g. the StatefulSet's replicas).
async fn apply(client: &Client, objects: &[Value], dry_run: bool) -> Vec<String> {
    let discovery = Discovery::new(client.clone())
        .run_aggregated()
        .await
        .expect("discovery");
    let params = PatchParams {
        dry_run,
        force: dry_run,
        field_manager: Some(MANAGER.into()),
        field_validation: Some(ValidationDirective::Strict),
    };
    let mut refused = Vec::new();
    for object in objects {
        let what = format!("{}/{}", kind(object), name(object));
        let object: DynamicObject = serde_json::from_value(object.clone()).unwrap();
        let types = object.types.clone().expect("apiVersion and kind");
        let gvk = GroupVersionKind::try_from(&types).unwrap();
        let Some((resource, capabilities)) = discovery.resolve_gvk(&gvk) else {
            refused.push(format!("{what}: the API server does not serve {gvk:?}"));
            continue;
        };
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                object.metadata.namespace.as_deref().unwrap_or("default"),
                &resource,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        if let Err(e) = api
            .patch(&object.name_any(), &params, &Patch::Apply(&object))
            .await
        {
            refused.push(format!("{what}: {e}"));
        }
    }
    refused
}

/// Creates (or keeps) a namespace labelled for the `restricted` Pod Security Standard.
async fn restricted_namespace(client: &Client, name: &str) {
    let namespace = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}
    });
    let refused = apply(client, &[namespace], false).await;
    assert!(refused.is_empty(), "{refused:?}");
}

/// A dry-run Pod from the StatefulSet's template: the `restricted` namespace admits it or not.
async fn admit_pod(client: &Client, sts: &Value) -> Result<(), kube::Error> {
    let template = &sts["spec"]["template"];
    let mut metadata = template["metadata"].clone();
    metadata["name"] = json!(format!("{}-0", name(sts)));
    let pod =
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]});
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod).unwrap();
    let namespace = sts["metadata"]["namespace"].as_str().unwrap();
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), namespace)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &pod,
        )
        .await
        .map(drop)
}

/// A token for a ServiceAccount from the TokenRequest API (signed by the API server), for the
/// API server itself.
async fn token(client: &Client, namespace: &str, account: &str) -> String {
    token_for(client, namespace, account, &[]).await
}

/// A token for the admin API's drain endpoint (its audience).
async fn admin_token(client: &Client, namespace: &str, account: &str) -> String {
    token_for(
        client,
        namespace,
        account,
        &[module_manager::admin::TOKEN_AUDIENCE],
    )
    .await
}

/// A ServiceAccount token for `audiences` (none: the API server's own).
async fn token_for(client: &Client, namespace: &str, account: &str, audiences: &[&str]) -> String {
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), namespace);
    if accounts.get_opt(account).await.unwrap().is_none() {
        objects::create_json(&accounts, json!({"metadata": {"name": account}})).await;
    }
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600, "audiences": audiences}
    });
    let answer: TokenRequest = accounts
        .create_subresource("token", account, &PostParams::default(), &request)
        .await
        .expect("TokenRequest");
    answer.status.and_then(|s| s.token).expect("a token")
}

/// A kubeconfig for the control plane that authenticates with `token` only, written to
/// `dir/<label>.kubeconfig`.
async fn token_kubeconfig(dir: &Path, label: &str, token: &str) -> PathBuf {
    let admin = control_plane().await.kubeconfig();
    let mut config: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(admin).unwrap()).unwrap();
    config["users"] = json!([{"name": "token", "user": {"token": token}}]);
    config["contexts"][0]["context"]["user"] = json!("token");
    let path = dir.join(format!("{label}.kubeconfig"));
    std::fs::write(&path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    path
}

/// Polls `probe` until it answers `Some`, failing after [`LIMIT`] with `context()`, which is
/// also called on every poll (it may fail the test early).
async fn eventually<T, F, Fut>(what: &str, context: impl Fn() -> String, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(answer) = probe().await {
            return answer;
        }
        let context = context();
        assert!(
            start.elapsed() < LIMIT,
            "{what}: not within {LIMIT:?}\n{context}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits for a process to exit; answers its status (`exit status: N`).
async fn exited(process: &mut testenv::Proc) -> String {
    let start = Instant::now();
    loop {
        if let Err(testenv::Error::Exited { status, .. }) = process.check_running() {
            return status;
        }
        assert!(
            start.elapsed() < LIMIT,
            "the operator did not exit:\n{}",
            process.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The operator binary with the deployed StatefulSet's arguments and environment, made local:
/// the chart root is the test fixtures, helm the pinned one, the admin API on a free port.
fn operator(sts: &Value, kubeconfig: &Path, helm_home: &Path, admin: u16) -> Command {
    let pod = &sts["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let mut command = Command::new(env!("CARGO_BIN_EXE_module-manager"));
    command
        .env_clear()
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,kube=warn");
    for var in container["env"].as_array().unwrap() {
        let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("metadata.name") => format!("{}-0", name(sts)),
            Some("metadata.namespace") => sts["metadata"]["namespace"].as_str().unwrap().into(),
            Some(other) => panic!("unexpected fieldRef {other}"),
            None => var["value"].as_str().unwrap().into(),
        };
        command.env(var["name"].as_str().unwrap(), value);
    }
    // The deployed arguments first; the local ones after them win (a later flag overrides).
    command.args(
        container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap()),
    );
    command
        .arg(format!(
            "--chart-root={}",
            repo().join("tests/fixtures/charts").display()
        ))
        .arg(format!("--helm={}", tools().helm.display()))
        .arg(format!("--renderer={}", tools().renderer.display()))
        .arg(format!("--helm-home={}", helm_home.display()))
        .arg(format!("--admin-address=127.0.0.1:{admin}"))
        .args(test_support::LOCAL_CHART_HOST_FLAGS);
    command
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_and_chart_are_accepted_by_the_api_server() {
    let client = control_plane().await.client().await.unwrap();
    install_monitoring_crds(&client).await;

    // The generated CRD (crds/ and the chart link to it) is up to date.
    assert!(
        std::fs::read_to_string(repo().join("deploy/base/crds/manifest.yaml")).unwrap()
            == module_manager::api::manifest_crd_yaml(),
        "deploy/base/crds/manifest.yaml is stale: run `make crds`"
    );
    let deployed = kustomize("deploy");
    check_deployment(&deployed, "module-manager");
    find(&deployed, "Namespace", NAMESPACE);
    assert!(
        deployed
            .iter()
            .filter(|o| kind(o) != "Namespace" && kind(o) != "CustomResourceDefinition")
            .filter(|o| !kind(o).starts_with("Cluster"))
            .filter(|o| !kind(o).starts_with("ValidatingAdmissionPolicy"))
            .all(|o| o["metadata"]["namespace"] == NAMESPACE),
        "every namespaced object in {NAMESPACE}"
    );
    // deploy/base: the same without what needs the Prometheus Operator.
    let base = kustomize("deploy/base");
    assert!(base.iter().all(|o| {
        !o["apiVersion"]
            .as_str()
            .unwrap()
            .starts_with("monitoring.coreos.com/")
    }));
    assert!(base.iter().all(|o| deployed.contains(o)), "base ⊄ deploy/");

    let chart = helm_template(ALL_MONITORING);
    check_deployment(&chart, "mm-module-manager");
    // Impersonation mode (deploy/impersonate, tenancy.mode=impersonate): the operator gets
    // `impersonate` on ServiceAccounts and --require-service-account, and the module role is
    // not bound to it.
    let impersonating = kustomize("deploy/impersonate");
    let chart_impersonating = helm_template(&["--set", "tenancy.mode=impersonate"]);
    for (objects, prefix) in [
        (&impersonating, "module-manager"),
        (&chart_impersonating, "mm-module-manager"),
    ] {
        let role = find(objects, "ClusterRole", &format!("{prefix}-impersonate"));
        assert_eq!(role["rules"][0]["verbs"], json!(["impersonate"]));
        assert!(
            !objects
                .iter()
                .any(|o| kind(o) == "ClusterRoleBinding" && name(o) == format!("{prefix}-modules")),
            "{prefix}: the module role is not bound to the operator"
        );
        let sts = find(objects, "StatefulSet", prefix);
        let args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap();
        assert!(
            args.contains(&json!("--require-service-account")),
            "{args:?}"
        );
    }
    assert!(
        base.iter()
            .any(|o| kind(o) == "ClusterRoleBinding" && name(o) == "module-manager-modules")
    );
    // Without the toggles, nothing that needs the Prometheus Operator or Grafana.
    let plain = kinds(&helm_template(&[]));
    assert!(
        !plain.iter().any(|k| k.starts_with("ServiceMonitor/")
            || k.starts_with("PrometheusRule/")
            || k.ends_with("-dashboards")),
        "{plain:?}"
    );
    // The chart's rules are the deployed ones, in one copy (a symlink).
    let rule =
        |objects: &[Value], prefix: &str| find(objects, "PrometheusRule", prefix)["spec"].clone();
    assert_eq!(
        rule(&chart, "mm-module-manager"),
        rule(&deployed, "module-manager")
    );
    let dashboards = |objects: &[Value], prefix: &str| {
        find(objects, "ConfigMap", &format!("{prefix}-dashboards"))["data"].clone()
    };
    assert_eq!(
        dashboards(&chart, "mm-module-manager"),
        dashboards(&deployed, "module-manager")
    );

    // The API server accepts every object (the namespaces must exist for a dry run).
    restricted_namespace(&client, NAMESPACE).await;
    restricted_namespace(&client, HELM_NAMESPACE).await;
    let refused = apply(&client, &deployed, true).await;
    assert!(
        refused.is_empty(),
        "deploy/ refused:\n{}",
        refused.join("\n")
    );
    let refused = apply(&client, &chart, true).await;
    assert!(
        refused.is_empty(),
        "the chart refused:\n{}",
        refused.join("\n")
    );
    for (what, objects) in [
        ("deploy/impersonate", &impersonating),
        ("the chart in impersonation mode", &chart_impersonating),
    ] {
        let refused = apply(&client, objects, true).await;
        assert!(
            refused.is_empty(),
            "{what} refused:\n{}",
            refused.join("\n")
        );
    }

    // The pods meet the restricted Pod Security Standard (the namespaces enforce it).
    for (objects, sts) in [(&deployed, "module-manager"), (&chart, "mm-module-manager")] {
        let sts = find(objects, "StatefulSet", sts);
        admit_pod(&client, sts)
            .await
            .unwrap_or_else(|e| panic!("the pod of {} is refused: {e}", name(sts)));
    }
    // … and a pod that does not is refused, so the check above can fail.
    let mut privileged = find(&deployed, "StatefulSet", "module-manager").clone();
    privileged["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
        json!(true);
    let error = admit_pod(&client, &privileged).await.unwrap_err();
    assert!(
        error.to_string().contains("allowPrivilegeEscalation"),
        "{error}"
    );

    // `helm lint --strict` is clean.
    let home = tempfile::tempdir().unwrap();
    run(helm(home.path())
        .args(["lint", "--strict"])
        .arg(repo().join("helm/module-manager")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_runs_with_exactly_the_deployed_rbac() {
    let control_plane = control_plane().await;
    let client = control_plane.client().await.unwrap();
    install_monitoring_crds(&client).await;

    // The whole deployment, for real (no kubelet: the StatefulSet starts no pod). Applied twice:
    // a second apply of the same configuration must not conflict with the aggregation
    // controller (it owns the aggregated role's rules).
    let deployed = kustomize("deploy");
    restricted_namespace(&client, NAMESPACE).await;
    let refused = apply(&client, &deployed, false).await;
    assert!(refused.is_empty(), "{}", refused.join("\n"));
    let roles = Api::<ClusterRole>::all(client.clone());
    eventually("module-manager-modules aggregated", String::new, || async {
        let role = roles.get("module-manager-modules").await.ok()?;
        (!role.rules.unwrap_or_default().is_empty()).then_some(())
    })
    .await;
    let refused = apply(&client, &deployed, false).await;
    assert!(refused.is_empty(), "a second apply: {}", refused.join("\n"));

    // The operator, as its ServiceAccount.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = token_kubeconfig(
        dir.path(),
        "operator",
        &token(&client, NAMESPACE, "module-manager").await,
    )
    .await;
    let sts = find(&deployed, "StatefulSet", "module-manager");
    let admin_port = objects::free_port();
    let log = dir.path().join("operator.log");
    let mut process = testenv::Proc::spawn(
        "module-manager",
        operator(sts, &kubeconfig, &dir.path().join("helm"), admin_port),
        &log,
        testenv::Lifetime::TiedToThisProcess,
    )
    .unwrap();
    let admin = format!("http://127.0.0.1:{admin_port}");
    // The log so far; a forbidden request fails the test at once (no waiting for the limit).
    let tail = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !text.to_lowercase().contains("forbidden"),
            "a request was forbidden:\n{text}"
        );
        text
    };
    use axum::http::Method;
    use module_manager::admin::DRAIN_PATH;
    use module_manager::cli::fetch;
    // Up: the admin API answers (an exit before, e.g. the preflight's, fails at once).
    let start = Instant::now();
    while fetch::<Value>(&admin, Method::GET, "/v1/shards", None)
        .await
        .is_err()
    {
        if let Err(e) = process.check_running() {
            panic!("the operator exited: {e}");
        }
        assert!(start.elapsed() < LIMIT, "no admin API:\n{}", tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The drain endpoint: the deployed drain role allows it, nobody else.
    let drainer_binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "deploy-test-drainer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "module-manager-drain"},
        "subjects": [{"kind": "ServiceAccount", "name": "drainer", "namespace": NAMESPACE}]
    });
    assert!(apply(&client, &[drainer_binding], false).await.is_empty());
    let drainer = admin_token(&client, NAMESPACE, "drainer").await;
    let nobody = admin_token(&client, NAMESPACE, "nobody").await;
    let answer: Value = fetch(&admin, Method::POST, DRAIN_PATH, Some(&drainer))
        .await
        .unwrap_or_else(|e| panic!("drain: {e}\n{}", tail()));
    assert_eq!(answer, json!({"draining": true}));
    let refused = fetch::<Value>(&admin, Method::POST, DRAIN_PATH, Some(&nobody))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("403"), "{refused}");
    let answer: Value = fetch(&admin, Method::DELETE, DRAIN_PATH, Some(&drainer))
        .await
        .unwrap();
    assert_eq!(answer, json!({"draining": false}));

    // A module: installed, Ready, its ConfigMap there, an Event published.
    let namespace = control_plane.namespace(&client, "deploy").await.unwrap();
    let manifests = Api::<Manifest>::namespaced(client.clone(), &namespace);
    objects::create_json(
        &manifests,
        json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": "tiny"},
            "spec": {"module": "tiny", "chart": {"path": "tiny"}, "values": {"n": 7}}
        }),
    )
    .await;
    let uid = eventually("the Manifest is Ready", tail, || async {
        let m = manifests.get("tiny").await.ok()?;
        let status = m.status.clone()?;
        (status.state == Some(State::Ready) && status.observed_generation == m.metadata.generation)
            .then(|| m.uid().unwrap())
    })
    .await;
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), &namespace);
    let configmap = configmaps
        .get("tiny")
        .await
        .expect("the module's ConfigMap");
    assert_eq!(configmap.data.as_ref().unwrap()["n"], "7");
    assert_eq!(configmap.labels()["modulemanager.io/manifest-uid"], uid);
    // The Event follows the status write that made the Manifest Ready: wait for it.
    let events = Api::<Event>::namespaced(client.clone(), &namespace);
    let about_it = |e: &Event| {
        e.regarding
            .as_ref()
            .is_some_and(|r| r.uid.as_deref() == Some(uid.as_str()))
            && e.reporting_controller.as_deref() == Some("module-manager")
    };
    eventually("an Event about the Manifest", tail, || async {
        let listed = events.list(&ListParams::default()).await.ok()?;
        listed.items.iter().any(about_it).then_some(())
    })
    .await;

    // Deleted: the module's objects go, then the finalizer.
    objects::delete(&manifests, "tiny").await;
    eventually("the Manifest is deleted", tail, || async {
        manifests
            .get_opt("tiny")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(!objects::exists(&configmaps, "tiny").await);

    // A scale-down to zero, then SIGTERM: the replica hands its shards over, deletes its
    // membership Lease and exits cleanly.
    objects::merge(
        &Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE),
        "module-manager",
        json!({"spec": {"replicas": 0}}),
    )
    .await;
    eventually("the replica sees the scale-down", tail, || async {
        let shards: Value = fetch(&admin, Method::GET, "/v1/shards", None).await.ok()?;
        (shards["desired_replicas"] == 0).then_some(())
    })
    .await;
    assert_eq!(
        unsafe { libc::kill(process.pid() as i32, libc::SIGTERM) },
        0
    );
    let status = exited(&mut process).await;
    let log_text = tail();
    assert_eq!(status, "exit status: 0", "{log_text}");
    let leases = Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    assert!(
        !objects::exists(&leases, "module-manager-member-module-manager-0").await,
        "the membership Lease is left"
    );
    let held: Vec<String> = leases
        .list(
            &ListParams::default()
                .labels("modulemanager.io/fleet=module-manager,modulemanager.io/lease=shard"),
        )
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|l| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| !h.is_empty())
        })
        .map(|l| l.name_any())
        .collect();
    assert!(held.is_empty(), "shard Leases still held: {held:?}");

    // Not one request of the whole run was forbidden.
    assert!(
        log_text.contains("preflight: every permission granted"),
        "{log_text}"
    );
    let forbidden: Vec<&str> = log_text
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "forbidden requests:\n{}",
        forbidden.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_rbac_grants_what_preflight_asks() {
    let client = control_plane().await.client().await.unwrap();
    let chart = helm_template(&[]);
    restricted_namespace(&client, HELM_NAMESPACE).await;
    let rbac: Vec<Value> = chart
        .iter()
        .filter(|o| {
            kind(o) == "ServiceAccount"
                || o["apiVersion"]
                    .as_str()
                    .unwrap()
                    .starts_with("rbac.authorization.k8s.io/")
        })
        .cloned()
        .collect();
    let refused = apply(&client, &rbac, false).await;
    assert!(refused.is_empty(), "{}", refused.join("\n"));
    let dir = tempfile::tempdir().unwrap();
    let account = "mm-module-manager";
    let kubeconfig = token_kubeconfig(
        dir.path(),
        "chart",
        &token(&client, HELM_NAMESPACE, account).await,
    )
    .await;
    let as_operator = testenv::client_for(&kubeconfig).await.unwrap();
    let checks = preflight::checks(preflight::Config {
        fleet_namespace: HELM_NAMESPACE,
        statefulset: Some(account),
        impersonating: false,
    });
    assert_eq!(checks.len(), preflight::PERMISSIONS.len() - 1);
    let missing = preflight::missing(&as_operator, &checks).await.unwrap();
    assert!(
        missing.is_empty(),
        "{}",
        preflight::report(None, &missing, checks.len())
    );
    // The modules' aggregated role reaches the operator (e.g. the ConfigMaps of a module).
    let can_i = preflight::Check {
        permission: preflight::Permission {
            verb: "create",
            group: "",
            resource: "configmaps",
            subresource: "",
            scope: preflight::Scope::AllNamespaces,
            when: preflight::When::Always,
            why: "a module's ConfigMap",
        },
        namespace: Some("anywhere".into()),
        name: None,
    };
    eventually(
        "the chart's module role is aggregated",
        String::new,
        || async {
            preflight::missing(&as_operator, std::slice::from_ref(&can_i))
                .await
                .unwrap()
                .is_empty()
                .then_some(())
        },
    )
    .await;

    // Impersonation mode: `impersonate` on ServiceAccounts too, so every permission the
    // preflight asks with --require-service-account is granted.
    let impersonating = helm_template(&["--set", "tenancy.mode=impersonate"]);
    let impersonate_rbac: Vec<Value> = impersonating
        .iter()
        .filter(|o| kind(o).starts_with("Cluster") && name(o).ends_with("-impersonate"))
        .cloned()
        .collect();
    assert_eq!(impersonate_rbac.len(), 2, "a ClusterRole and its binding");
    let refused = apply(&client, &impersonate_rbac, false).await;
    assert!(refused.is_empty(), "{}", refused.join("\n"));
    let checks = preflight::checks(preflight::Config {
        fleet_namespace: HELM_NAMESPACE,
        statefulset: Some(account),
        impersonating: true,
    });
    assert_eq!(checks.len(), preflight::PERMISSIONS.len());
    eventually(
        "the chart's impersonation role is granted",
        String::new,
        || async {
            let missing = preflight::missing(&as_operator, &checks).await.unwrap();
            missing.is_empty().then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_rbac_the_operator_exits_with_the_missing_permissions() {
    let control_plane = control_plane().await;
    let client = control_plane.client().await.unwrap();
    let namespace = control_plane.namespace(&client, "unbound").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = token_kubeconfig(
        dir.path(),
        "unbound",
        &token(&client, &namespace, "unbound").await,
    )
    .await;
    // The deployed StatefulSet's arguments, in a namespace where the account has no binding.
    let mut sts = find(&kustomize("deploy"), "StatefulSet", "module-manager").clone();
    sts["metadata"]["namespace"] = json!(namespace);
    let log = dir.path().join("operator.log");
    let mut process = testenv::Proc::spawn(
        "module-manager",
        operator(
            &sts,
            &kubeconfig,
            &dir.path().join("helm"),
            objects::free_port(),
        ),
        &log,
        testenv::Lifetime::TiedToThisProcess,
    )
    .unwrap();
    let status = exited(&mut process).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert_ne!(status, "exit status: 0", "{text}");
    let checks = preflight::checks(preflight::Config {
        fleet_namespace: &namespace,
        statefulset: Some("module-manager"),
        impersonating: false,
    });
    let user = format!("system:serviceaccount:{namespace}:unbound");
    assert!(
        text.contains(&format!(
            "preflight: {user:?} lacks {} of the {} permissions module-manager needs:",
            checks.len(),
            checks.len()
        )),
        "{text}"
    );
    for check in &checks {
        assert!(
            text.contains(&format!("  - {} (", check.describe())),
            "{} not listed:\n{text}",
            check.describe()
        );
    }
    assert!(text.contains("deploy/base/rbac/operator.yaml"), "{text}");
    // Nothing started: it stopped before joining the fleet.
    let leases = objects::list(&Api::<Lease>::namespaced(client.clone(), &namespace)).await;
    assert!(leases.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Releases: `make release` (hack/release.sh) and the version written down in several places.

/// The operator's version in Cargo.toml: the one source of truth.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The text after `prefix` on the first line of `<repo>/path` that starts with it, unquoted.
fn line_value(path: &str, prefix: &str) -> String {
    let text = std::fs::read_to_string(repo().join(path)).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in {path}"));
    line.trim().trim_matches('"').to_owned()
}

/// The image of every container (and init container) of every workload in `objects`.
fn images(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .flat_map(|o| {
            let pod = &o["spec"]["template"]["spec"];
            [&pod["containers"], &pod["initContainers"]]
                .into_iter()
                .filter_map(Value::as_array)
                .flatten()
                .map(|c| c["image"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn every_version_is_cargos() {
    let chart: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo().join("helm/module-manager/Chart.yaml")).unwrap(),
    )
    .unwrap();
    let kustomization: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo().join("deploy/base/kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let found = [
        (
            "helm/module-manager/Chart.yaml version",
            chart["version"].as_str().unwrap().to_owned(),
        ),
        (
            "helm/module-manager/Chart.yaml appVersion",
            chart["appVersion"].as_str().unwrap().to_owned(),
        ),
        (
            "deploy/base/kustomization.yaml image tag",
            kustomization["images"][0]["newTag"]
                .as_str()
                .unwrap()
                .to_owned(),
        ),
        (
            "Dockerfile ARG VERSION",
            line_value("Dockerfile", "ARG VERSION="),
        ),
        (
            "CHANGELOG.md latest release",
            line_value("CHANGELOG.md", "## [0")
                .split(']')
                .next()
                .map(|v| format!("0{v}"))
                .unwrap(),
        ),
    ];
    let wrong: Vec<String> = found
        .iter()
        .filter(|(_, v)| v != VERSION)
        .map(|(what, v)| format!("{what} is {v:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "Cargo.toml says {VERSION}, but {}: run hack/set-version.sh {VERSION}",
        wrong.join(", ")
    );
    let shown = run(Command::new(env!("CARGO_BIN_EXE_module-manager")).arg("--version"));
    assert_eq!(shown.trim(), format!("module-manager {VERSION}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_release_installs() {
    const IMAGE: &str = "registry.example.com/platform/module-manager";
    let dir = tempfile::tempdir().unwrap();
    let dist = dir.path().join("dist");
    // The release script as `make release` runs it, around the test's (debug) binary: the
    // release build itself is what `make release` adds (docs/development.md).
    run(Command::new(repo().join("hack/release.sh"))
        .env("VERSION", VERSION)
        .env("IMAGE", IMAGE)
        .env("DIST", &dist)
        .env("RELEASE_BINARY", env!("CARGO_BIN_EXE_module-manager")));
    let name = format!("module-manager-{VERSION}");
    let file = |suffix: &str| dist.join(format!("{name}{suffix}"));

    // SHA256SUMS names every other file, with its sum.
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS")).unwrap();
    let mut listed = BTreeSet::new();
    for line in sums.lines() {
        let (sum, file) = line.split_once("  ").expect("`<sum>  <file>` lines");
        let bytes = std::fs::read(dist.join(file)).unwrap();
        assert_eq!(sum, format!("{:x}", Sha256::digest(&bytes)), "{file}");
        listed.insert(file.to_owned());
    }
    let present: BTreeSet<String> = std::fs::read_dir(&dist)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f != "SHA256SUMS")
        .collect();
    assert_eq!(listed, present);
    for suffix in [
        "-linux-amd64",
        "-crd.yaml",
        "-install.yaml",
        "-install-monitoring.yaml",
        ".tgz",
        ".cdx.json",
    ] {
        assert!(present.contains(&format!("{name}{suffix}")), "{present:?}");
    }

    // The binary runs, and its CRD is the generated one, shipped beside it.
    let binary = file("-linux-amd64");
    let shown = run(Command::new(&binary).arg("--version"));
    assert_eq!(shown.trim(), format!("module-manager {VERSION}"));
    // The kubectl plugin: the same binary under the plugin's name.
    let plugin = dist.join(format!("kubectl-module_manager-{VERSION}-linux-amd64"));
    assert_eq!(
        std::fs::read(&plugin).unwrap(),
        std::fs::read(&binary).unwrap()
    );
    let crd = run(Command::new(&binary).arg("crd"));
    assert!(crd == module_manager::api::manifest_crd_yaml());
    assert!(crd == std::fs::read_to_string(file("-crd.yaml")).unwrap());

    // The SBOM names the operator at this version and its dependencies.
    let sbom: Value = serde_json::from_slice(&std::fs::read(file(".cdx.json")).unwrap()).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["metadata"]["component"]["name"], "module-manager");
    assert_eq!(sbom["metadata"]["component"]["version"], VERSION);
    let components: BTreeSet<&str> = sbom["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for dependency in ["kube-client", "rustls", "tokio", "prometheus-client"] {
        assert!(
            components.contains(dependency),
            "{dependency} not in the SBOM"
        );
    }
    assert!(
        !components.contains("openssl-sys"),
        "the SBOM lists openssl-sys"
    );

    // The bundles and the packaged chart: the deployment, on the released image.
    let image = BTreeSet::from([format!("{IMAGE}:{VERSION}")]);
    let documents_of = |path: PathBuf| documents(&std::fs::read_to_string(path).unwrap());
    let bundle = documents_of(file("-install-monitoring.yaml"));
    check_deployment(&bundle, "module-manager");
    assert_eq!(images(&bundle), image);
    let base = documents_of(file("-install.yaml"));
    assert!(
        base.iter().all(|o| bundle.contains(o)),
        "install ⊄ install-monitoring"
    );
    let chart = helm_template_of(&file(".tgz"), ALL_MONITORING);
    check_deployment(&chart, "mm-module-manager");
    assert_eq!(images(&chart), image);
    let home = tempfile::tempdir().unwrap();
    let packaged: Value = serde_yaml_ng::from_str(&run(helm(home.path())
        .args(["show", "chart"])
        .arg(file(".tgz"))))
    .unwrap();
    assert_eq!(packaged["version"], VERSION);
    assert_eq!(packaged["appVersion"], VERSION);

    // The API server accepts all of it.
    let client = control_plane().await.client().await.unwrap();
    install_monitoring_crds(&client).await;
    restricted_namespace(&client, NAMESPACE).await;
    restricted_namespace(&client, HELM_NAMESPACE).await;
    for (what, objects) in [("the bundle", &bundle), ("the packaged chart", &chart)] {
        let refused = apply(&client, objects, true).await;
        assert!(
            refused.is_empty(),
            "{what} refused:\n{}",
            refused.join("\n")
        );
    }
}

/// The schema's node for a values path (`properties` all the way down), if it has one.
fn schema_at<'a>(schema: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(schema, |node, key| node.get("properties")?.get(*key))
}

/// Every path of `values` (maps entered, the rest leaves), as key lists.
fn value_paths(values: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Some(map) = values.as_object().filter(|m| !m.is_empty()) {
        for (key, value) in map {
            prefix.push(key.clone());
            out.push(prefix.clone());
            value_paths(value, prefix, out);
            prefix.pop();
        }
    }
}

#[test]
fn the_values_schema_covers_every_value_and_refuses_wrong_ones() {
    let chart = repo().join("helm/module-manager");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json")).unwrap())
            .unwrap();
    let values: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart.join("values.yaml")).unwrap())
            .unwrap();
    let mut paths = Vec::new();
    value_paths(&values, &mut Vec::new(), &mut paths);
    // Every named value has a node, down to a free-form map (labels, resources' quantities:
    // a node without `properties`, whose keys are anyone's).
    let missing: Vec<String> = paths
        .iter()
        .filter(|path| {
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            let parent = schema_at(&schema, &path[..path.len() - 1]);
            parent.is_none_or(|p| p.get("properties").is_some())
                && schema_at(&schema, &path).is_none()
        })
        .map(|path| path.join("."))
        .collect();
    assert!(missing.is_empty(), "not in values.schema.json: {missing:?}");
    assert!(paths.len() > 50, "{} values", paths.len());

    // Wrong values are refused at render time, each named by helm's schema check.
    let home = tempfile::tempdir().unwrap();
    for (set, named) in [
        ("tenancy.mode=team", "/tenancy/mode"),
        ("shards=100", "/shards"),
        ("replicas=-1", "/replicas"),
        ("logFormat=xml", "/logFormat"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("adminPort=70000", "/adminPort"),
        ("concurrency=0", "/concurrency"),
        (
            "podDisruptionBudget.maxUnavailable=half",
            "/podDisruptionBudget/maxUnavailable",
        ),
        ("replica=3", "additional properties 'replica' not allowed"),
        (
            "monitoring.serviceMonitor.enable=true",
            "'enable' not allowed",
        ),
    ] {
        let output = helm(home.path())
            .args(["template", RELEASE])
            .arg(&chart)
            .args(["--set", set])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{set} is accepted");
        assert!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(named),
            "{set}: {stderr}"
        );
    }
    // … and right ones are not (the defaults render in the other tests).
    run(helm(home.path())
        .args(["template", RELEASE])
        .arg(&chart)
        .args(["--set", "tenancy.mode=impersonate,shards=1024,podDisruptionBudget.maxUnavailable=50%,logFormat=text"]));
}

/// A client of the control plane acting as `user` in `groups` (impersonated by the admin;
/// `system:masters` passes RBAC, so what refuses is the admission policy alone).
async fn impersonating(user: &str, groups: &[&str]) -> Client {
    let mut config = control_plane().await.config().await.unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    Client::try_from(config).unwrap()
}

/// Issue 15 item 3: the ValidatingAdmissionPolicy of deploy/base (and the chart's, for its
/// release): only the operator's ServiceAccount may create a Manifest with a shard label or change
/// the label; anyone else gets the policy's message; other changes stay allowed to everyone.
#[tokio::test]
async fn only_the_operator_may_set_or_change_the_shard_label() {
    let control_plane = control_plane().await;
    let admin = control_plane.client().await.unwrap();
    let base = kustomize("deploy/base");
    let policy = find(
        &base,
        "ValidatingAdmissionPolicy",
        "module-manager-shard-label",
    );
    let binding = find(
        &base,
        "ValidatingAdmissionPolicyBinding",
        "module-manager-shard-label",
    );
    assert_eq!(binding["spec"]["policyName"], "module-manager-shard-label");
    let refused = apply(&admin, &[policy.clone(), binding.clone()], false).await;
    assert!(refused.is_empty(), "{refused:?}");
    // The chart's names the release's ServiceAccount, and is off with the toggle.
    let chart = helm_template(&[]);
    let chart_policy = find(
        &chart,
        "ValidatingAdmissionPolicy",
        "mm-module-manager-shard-label",
    );
    assert!(
        chart_policy["spec"]["variables"][0]["expression"]
            .as_str()
            .unwrap()
            .contains("'system:serviceaccount:mm-helm:mm-module-manager'"),
        "{chart_policy}"
    );
    assert_eq!(
        chart_policy["spec"]["validations"],
        policy["spec"]["validations"]
    );
    let off = kinds(&helm_template(&["--set", "shardLabelPolicy.enabled=false"]));
    assert!(
        !off.iter()
            .any(|k| k.starts_with("ValidatingAdmissionPolicy")),
        "{off:?}"
    );

    let namespace = control_plane
        .namespace(&admin, "label-policy")
        .await
        .unwrap();
    let masters = ["system:masters", "system:authenticated"];
    let someone = impersonating("system:serviceaccount:tenant:deployer", &masters).await;
    let operator = impersonating(
        "system:serviceaccount:module-manager:module-manager",
        &masters,
    )
    .await;
    let manifests = |client: &Client| Api::<Manifest>::namespaced(client.clone(), &namespace);
    let manifest = |name: &str, label: Option<&str>| -> Manifest {
        let mut labels = serde_json::Map::new();
        if let Some(label) = label {
            labels.insert("modulemanager.io/shard".into(), json!(label));
        }
        serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": name, "labels": labels},
            "spec": {"module": "tiny", "chart": {"path": "tests/fixtures/charts/tiny"}, "suspend": true}
        }))
        .unwrap()
    };
    let relabel = |value: &str| {
        Patch::Merge(json!({"metadata": {"labels": {"modulemanager.io/shard": value}}}))
    };
    let message =
        "only the module-manager operator may set or change the label modulemanager.io/shard";
    let refusal = |result: Result<Manifest, kube::Error>| match result {
        Err(kube::Error::Api(status)) if status.message.contains(message) => status.message,
        other => panic!("expected the policy's refusal, got {other:?}"),
    };

    // The policy takes effect once the API server has loaded it: poll until the first refusal.
    let copy = manifest("copy", Some("7"));
    let first = eventually("the policy refuses a labelled create", String::new, || {
        let api = manifests(&someone);
        let copy = copy.clone();
        async move {
            match api.create(&PostParams::default(), &copy).await {
                Err(kube::Error::Api(status)) if status.message.contains(message) => {
                    Some(status.message)
                }
                Err(e) => panic!("{e}"),
                Ok(_) => {
                    objects::delete(&api, "copy").await;
                    None
                }
            }
        }
    })
    .await;
    assert!(first.contains("create the Manifest without it"), "{first}");
    eprintln!("POLICY refusal: {first}");

    // Someone else: an unlabelled create, and changes not touching the label, are allowed; a
    // label added, changed or removed is refused.
    let pp = PatchParams::default();
    manifests(&someone)
        .create(&PostParams::default(), &manifest("plain", None))
        .await
        .unwrap();
    let refused = refusal(manifests(&someone).patch("plain", &pp, &relabel("3")).await);
    assert!(refused.contains("leave it as it is"), "{refused}");
    // The operator may do both.
    manifests(&operator)
        .patch("plain", &pp, &relabel("3"))
        .await
        .unwrap();
    manifests(&operator)
        .create(&PostParams::default(), &manifest("stamped", Some("5")))
        .await
        .unwrap();
    refusal(manifests(&someone).patch("plain", &pp, &relabel("4")).await);
    let removed = Patch::Merge(json!({"metadata": {"labels": {"modulemanager.io/shard": null}}}));
    refusal(manifests(&someone).patch("plain", &pp, &removed).await);
    let touched =
        Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}, "spec": {"values": {"n": 1}}}));
    manifests(&someone)
        .patch("plain", &pp, &touched)
        .await
        .unwrap();
    let plain = manifests(&admin).get("plain").await.unwrap();
    assert_eq!(
        plain
            .labels()
            .get("modulemanager.io/shard")
            .map(String::as_str),
        Some("3")
    );
    // Status writes are not matched (the subresource).
    manifests(&someone)
        .patch_status(
            "stamped",
            &pp,
            &Patch::Merge(json!({"status": {"shard": 5}})),
        )
        .await
        .unwrap();
}
