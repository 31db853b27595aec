//! End to end on a real node (`make e2e`; docs/deploy.md § What was verified on real pods): the
//! operator's image built from this checkout without an engine (`hack/build-image.sh`) and
//! imported into the node's containerd; the shipped manifests applied as a user does,
//! `kubectl apply --server-side -k deploy/`; three pods Ready through their real probes, each
//! reaching the API server through the `kubernetes` Service with the deployed ServiceAccount and
//! RBAC; example Manifests Ready; not one `forbidden` in any replica's log (read through
//! `pods/log`, i.e. the API server and kubelet); then the replica owning an example
//! force-deleted (`--grace-period=0 --force`): its successor (same name, new process) runs, every
//! shard Lease is held by a running replica, and the example is reconciled again after a change;
//! then all of it uninstalled and the same again with `helm install` of `helm/module-manager`.
//!
//! The image is the Dockerfile's content plus the example charts under `/charts/examples/charts`
//! (an image `FROM` it with charts, as docs/deploy.md advises), under the name `deploy/` runs,
//! `module-manager:<version>`. The test builds it (the debug profile: `PROFILE=dev
//! hack/build-image.sh`, its time on stderr; this is the one recipe, `make e2e` runs the test);
//! `E2E_IMAGE=<archive>` uses an archive built beforehand instead.
//!
//! Needs root, `hack/ensure-node-packages.sh` and the tools (`make setup`): checked before the
//! image is built.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;
#[path = "common/monitoring_crds.rs"]
mod monitoring_crds;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use kube::{Client, ResourceExt};
use module_manager::api::Manifest;

/// The namespace `deploy/` installs into.
const NAMESPACE: &str = "module-manager";
/// How long a step may take before the test fails (a limit, never a measurement).
const LIMIT: Duration = Duration::from_secs(180);
/// The example Manifests that need no container image of their own (their charts hold
/// ConfigMaps, a CRD and a custom resource; storefront depends on the other two).
const EXAMPLES: [&str; 3] = ["catalog", "widgets", "storefront"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The image archive: `E2E_IMAGE`, or built now by `hack/build-image.sh`.
fn image() -> PathBuf {
    if let Some(path) = std::env::var_os("E2E_IMAGE") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "E2E_IMAGE={} is not a file", path.display());
        return path;
    }
    let out = testenv::tools::cache_root().join("images/module-manager-e2e.tar");
    let started = Instant::now();
    let status = Command::new(repo().join("hack/build-image.sh"))
        .env("PROFILE", "dev")
        .env("ADD", "examples/charts=/charts/examples/charts")
        .env("OUT", &out)
        .status()
        .expect("run hack/build-image.sh");
    assert!(status.success(), "hack/build-image.sh failed ({status})");
    eprintln!(
        "the image {} built in {:.0?}",
        out.display(),
        started.elapsed()
    );
    out
}

async fn control_plane() -> &'static testenv::ControlPlane {
    // Root, containerd, runc, the CNI plugins…: before minutes of image build.
    if let Err(e) = testenv::node::check_prerequisites() {
        panic!("the end-to-end test cannot run here: {e}");
    }
    testenv::shared(testenv::Options {
        kubelet: true,
        controller_manager: true,
        images: vec![image()],
        ..Default::default()
    })
    .await
    .expect("a control plane with a real node")
}

/// Runs kubectl against the control plane; its stdout, or a failure with its stderr.
fn kubectl(control_plane: &testenv::ControlPlane, args: &[&str]) -> String {
    let output = Command::new(common::kubectl())
        .arg(format!(
            "--kubeconfig={}",
            control_plane.kubeconfig().display()
        ))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl {} failed ({}):\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The fleet's pods as `name phase ready restarts node` lines, and the end of each one's events.
async fn describe_pods(client: &Client) -> String {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let mut out = String::new();
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        let status = pod.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let restarts: i32 = status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .map(|c| c.restart_count)
            .sum();
        out.push_str(&format!(
            "{} {:?} ready={ready} restarts={restarts} node={:?}\n",
            pod.name_any(),
            status.phase,
            pod.spec.as_ref().and_then(|s| s.node_name.clone())
        ));
        // The end of its log (of the previous container when it restarted: a refused start).
        let params = LogParams {
            previous: restarts > 0,
            tail_lines: Some(3),
            ..LogParams::default()
        };
        if let Ok(log) = pods.logs(&pod.name_any(), &params).await {
            for line in log.lines() {
                out.push_str(&format!(
                    "    {}\n",
                    line.chars().take(400).collect::<String>()
                ));
            }
        }
    }
    out
}

/// Why a Manifest is not Ready: its status, the pods, the shard holders and each replica's
/// last log lines that name it.
async fn describe_manifest(client: &Client, name: &str) -> String {
    let manifests = Api::<Manifest>::namespaced(client.clone(), "default");
    let status = manifests.get(name).await.map(|m| m.status);
    let mut out = format!(
        "{name}: {status:?}\n{}{:?}\n",
        describe_pods(client).await,
        shard_holders(client).await
    );
    for i in 0..3 {
        let pod = format!("module-manager-{i}");
        let log = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
            .logs(&pod, &LogParams::default())
            .await
            .unwrap_or_else(|e| format!("(pods/log: {e})"));
        let about: Vec<&str> = log.lines().filter(|l| l.contains(name)).collect();
        out.push_str(&format!("{pod}, its last lines about {name}:\n"));
        for line in about.iter().rev().take(15).rev() {
            out.push_str(&format!(
                "    {}\n",
                line.chars().take(600).collect::<String>()
            ));
        }
    }
    out
}

/// Whether the pod is Ready (its readiness probe, through kubelet).
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A replica's log through `pods/log` (the API server asks the node's kubelet).
async fn replica_log(client: &Client, pod: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .logs(pod, &LogParams::default())
        .await
        .unwrap_or_else(|e| panic!("pods/log of {pod}: {e}"))
}

/// The holder of each shard Lease of the fleet.
async fn shard_holders(client: &Client) -> BTreeMap<String, String> {
    Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.name_any().contains("shard"))
        .map(|l| {
            let name = l.name_any();
            (
                name,
                l.spec.and_then(|s| s.holder_identity).unwrap_or_default(),
            )
        })
        .collect()
}

/// What every installation must give: the StatefulSet's three pods Ready on the real node, the
/// examples Ready, and not one `forbidden` in any replica's log. `how` names the installation.
async fn fleet_serves_the_examples(
    control_plane: &testenv::ControlPlane,
    client: &Client,
    how: &str,
) {
    let client = client.clone();
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE);
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    common::wait_until_described(
        &format!("the StatefulSet's three pods are Ready (startup, liveness and readiness probes on the real kubelet) after {how}"),
        LIMIT,
        async || {
            statefulsets
                .get("module-manager")
                .await
                .ok()
                .and_then(|s| s.status)
                .is_some_and(|s| s.ready_replicas == Some(3))
        },
        async || describe_pods(&client).await,
    )
    .await;
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(testenv::node::NODE_NAME),
            "{} runs on the real node",
            pod.name_any()
        );
        let env: Vec<String> = pod.spec.as_ref().unwrap().containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| e.name.clone())
            .collect();
        assert!(env.contains(&"POD_NAME".to_owned()), "{env:?}");
    }

    // The examples, The examples, reconciled by the fleet in its pods.
    let mut files = Vec::new();
    for name in EXAMPLES {
        files.push("-f".to_owned());
        files.push(format!("examples/manifests/{name}.yaml"));
    }
    let mut args = vec!["apply", "--server-side"];
    args.extend(files.iter().map(String::as_str));
    kubectl(control_plane, &args);
    let manifests = Api::<Manifest>::namespaced(client.clone(), "default");
    for name in EXAMPLES {
        common::wait_until_described(
            &format!("{name} is Ready ({how})"),
            LIMIT,
            async || {
                manifests.get(name).await.ok().is_some_and(|m| {
                    common::condition(&m, "Ready").is_some_and(|(status, _, _)| status == "True")
                })
            },
            async || describe_manifest(&client, name).await,
        )
        .await;
    }

    // The shipped RBAC is enough: no request of any replica was forbidden.
    for i in 0..3 {
        let pod = format!("module-manager-{i}");
        let log = replica_log(&client, &pod).await;
        assert!(!log.is_empty(), "{pod} logged nothing ({how})");
        let forbidden: Vec<&str> = log
            .lines()
            .filter(|l| l.to_lowercase().contains("forbidden"))
            .collect();
        assert!(
            forbidden.is_empty(),
            "{pod} was refused requests ({how}):\n{}",
            forbidden.join("\n")
        );
    }
}

#[tokio::test]
async fn the_shipped_deployment_runs_on_real_pods() {
    let control_plane = control_plane().await;
    let client = control_plane.client().await.unwrap();
    // deploy/ carries a ServiceMonitor and a PrometheusRule (minimal CRDs of the Prometheus
    // Operator, as in tests/deploy.rs).
    monitoring_crds::install_monitoring_crds(&client).await;

    // 1. As a user deploys it: the kustomize variant.
    kubectl(control_plane, &["apply", "--server-side", "-k", "deploy/"]);
    fleet_serves_the_examples(control_plane, &client, "kubectl apply -k deploy/").await;
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let manifests = Api::<Manifest>::namespaced(client.clone(), "default");

    // 2. The owner of catalog force-deleted (`--grace-period=0 --force`). The StatefulSet
    //    brings a successor of the same name: a new process (a new incarnation on the member
    //    Lease); every shard Lease is held by a running replica (whether the successor or a
    //    survivor: a killed member announced no restart, docs/sharding.md), and catalog is
    //    reconciled again after a change.
    let victim = manifests
        .get("catalog")
        .await
        .unwrap()
        .status
        .and_then(|s| s.owner)
        .expect("catalog has an owner");
    let members = Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    let member_lease = format!("module-manager-member-{victim}");
    let incarnation = |lease: &Lease| {
        lease
            .annotations()
            .get("modulemanager.io/incarnation")
            .cloned()
            .unwrap_or_default()
    };
    let old_incarnation = incarnation(&members.get(&member_lease).await.unwrap());
    let old_uid = pods.get(&victim).await.unwrap().uid();
    assert!(
        !shard_holders(&client).await.is_empty(),
        "the fleet holds shard Leases before the force-delete"
    );
    kubectl(
        control_plane,
        &[
            "-n",
            NAMESPACE,
            "delete",
            "pod",
            &victim,
            "--grace-period=0",
            "--force",
        ],
    );
    common::wait_until_described(
        "a successor of the force-deleted replica runs and renews its member Lease, and every shard is held by a running replica",
        LIMIT,
        async || {
            let Ok(list) = pods.list(&ListParams::default()).await else {
                return false;
            };
            let ready: Vec<String> = list
                .iter()
                .filter(|p| pod_ready(p) && !(p.name_any() == victim && p.uid() == old_uid))
                .map(ResourceExt::name_any)
                .collect();
            let renewed = members
                .get(&member_lease)
                .await
                .ok()
                .is_some_and(|l| incarnation(&l) != old_incarnation);
            let holders = shard_holders(&client).await;
            let held = !holders.is_empty() && holders.values().all(|h| ready.contains(h));
            ready.len() == 3 && renewed && held
        },
        async || {
            format!(
                "{}{:?}",
                describe_pods(&client).await,
                shard_holders(&client).await
            )
        },
    )
    .await;
    // The fleet still serves: a change to an example is reconciled.
    kubectl(
        control_plane,
        &[
            "-n",
            "default",
            "patch",
            "manifest",
            "catalog",
            "--type=merge",
            "-p",
            r#"{"spec":{"values":{"greeting":"hello"}}}"#,
        ],
    );
    common::wait_for(
        &manifests,
        "catalog",
        "Ready at its new generation",
        LIMIT,
        |m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.observed_generation == m.metadata.generation)
                && common::condition(m, "Ready").is_some_and(|(status, _, _)| status == "True")
        },
    )
    .await;

    // 3. Uninstalled as a user would (the Manifests first, while the operator runs to remove
    //    their objects and finalizers), then the same with `helm install` of the chart.
    kubectl(
        control_plane,
        &[
            "-n",
            "default",
            "delete",
            "manifests",
            "--all",
            "--wait=true",
            "--timeout=180s",
        ],
    );
    // module-manager never deletes CRDs (docs/deploy.md): the widgets chart's CRD stays, labelled
    // for the deleted Manifest, and a new Manifest would refuse to take it over. A user removes it.
    kubectl(
        control_plane,
        &["delete", "crd", "widgets.example.com", "--wait=true"],
    );
    kubectl(
        control_plane,
        &["delete", "-k", "deploy/", "--wait=true", "--timeout=180s"],
    );
    let helm_home = tempfile::tempdir().unwrap();
    let output = Command::new(testenv::Tools::locate().unwrap().helm)
        .env_clear()
        .env("HOME", helm_home.path())
        .env("KUBECONFIG", control_plane.kubeconfig())
        .args([
            "install",
            "module-manager",
            "helm/module-manager",
            "--namespace",
            NAMESPACE,
            "--create-namespace",
        ])
        .current_dir(repo())
        .output()
        .expect("run helm");
    assert!(
        output.status.success(),
        "helm install failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    fleet_serves_the_examples(control_plane, &client, "helm install helm/module-manager").await;
}
