//! The reconcile pipeline on a real kube-apiserver (with the garbage-collector and namespace
//! controllers of kube-controller-manager) and the real helm binary.
//!
//! There is no kubelet: where a workload must become ready, the test writes its status through
//! the status subresource, as the Deployment controller would.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use common::Harness;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};
use module_manager::render::{Backend, RenderLimits};
use serde_json::{Value, json};
use test_support::objects;

const REPLICA: &str = "test-replica";

async fn start(prefix: &str, limits: RenderLimits) -> Harness {
    start_with(prefix, limits, None).await
}

/// [`start`] with this render backend (`None`: the one `MM_RENDER_BACKEND` names).
async fn start_with(prefix: &str, limits: RenderLimits, backend: Option<Backend>) -> Harness {
    Harness(
        common::operator_with(prefix, 2, |context| {
            let context = context.replica(REPLICA).render_limits(limits);
            match backend {
                Some(backend) => context.backend(backend),
                None => context,
            }
        })
        .await,
    )
}

impl Harness {
    fn manifest(&self, name: &str, chart: &str, values: Value) -> Manifest {
        common::manifest(&self.ns, name, common::chart_spec(name, chart, values))
    }

    /// Creates the `catalog` Manifest (chart `catalog-v1`) with `values` and waits until Ready.
    async fn ready_catalog(&self, values: Value) -> Manifest {
        self.create(&self.manifest("catalog", "examples/charts/catalog-v1", values))
            .await;
        self.wait_state("catalog", State::Ready).await
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Merge-patches a ConfigMap of the test's namespace.
    async fn patch_config_map(&self, name: &str, patch: Value) {
        self.config_maps()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    /// The `greeting` of a ConfigMap the catalog chart renders (`<release>-settings`).
    async fn greeting(&self, name: &str) -> Option<String> {
        self.config_map_data(name, "greeting").await
    }

    /// The `key` of the ConfigMap `catalog-settings` (the catalog chart's, Manifest `catalog`).
    async fn settings(&self, key: &str) -> Option<String> {
        self.config_map_data("catalog-settings", key).await
    }

    /// Switches the Manifest `catalog` to the catalog-v2 chart (which drops
    /// `catalog-legacy-settings`) and returns it once Ready.
    async fn upgrade_catalog_to_v2(&self) -> Manifest {
        let v2 = json!({"chart": {"path": "examples/charts/catalog-v2"}});
        self.patch_spec("catalog", v2).await;
        self.wait_state("catalog", State::Ready).await
    }

    /// Deletes a ConfigMap of the test's namespace.
    async fn delete_config_map(&self, name: &str) {
        objects::delete(&self.config_maps(), name).await;
    }

    async fn config_map_exists(&self, name: &str) -> bool {
        self.config_maps().get_opt(name).await.unwrap().is_some()
    }

    async fn config_map_data(&self, name: &str, key: &str) -> Option<String> {
        self.config_maps()
            .get_opt(name)
            .await
            .unwrap()
            .and_then(|cm| cm.data?.get(key).cloned())
    }

    /// Asserts that an Event of this type and reason is published about `manifest` (within
    /// 10 s: [`common::expect_event`]).
    async fn expect_event(&self, manifest: &str, kind: &str, reason: &str) {
        common::expect_event(&self.client, &self.ns, manifest, |k, r, _| {
            k == kind && r == reason
        })
        .await;
    }

    /// Events about `manifest` as (type, reason, note).
    async fn events(&self, manifest: &str) -> Vec<(String, String, String)> {
        common::events(&self.client, &self.ns, manifest).await
    }
}

#[tokio::test]
async fn install_upgrade_repair_prune_and_delete() {
    let h = start("lifecycle", RenderLimits::default()).await;
    // Install.
    let installed = h.ready_catalog(json!({"greeting": "hi"})).await;
    assert_eq!(
        common::inventory_names(&installed),
        [
            "ConfigMap/catalog-legacy-settings",
            "ConfigMap/catalog-settings"
        ]
    );
    let status = installed.status.clone().unwrap();
    assert!(status.chart_digest.unwrap().starts_with("sha256:"));
    assert!(status.rendered_digest.unwrap().starts_with("sha256:"));
    assert_eq!(status.owner.as_deref(), Some(REPLICA));
    let shard = module_manager::shard::ShardCount::DEFAULT.shard_of(&installed.uid().unwrap());
    assert_eq!(status.shard, Some(shard));
    assert_eq!(
        installed.labels().get(module_manager::shard::SHARD_LABEL),
        Some(&shard.to_string()),
        "shard label stamped"
    );
    assert_eq!(status.last_operation.unwrap().operation, "Install");
    assert!(
        installed
            .finalizers()
            .contains(&module_manager::reconcile::FINALIZER.to_owned())
    );
    assert_eq!(h.settings("greeting").await.as_deref(), Some("hi"));
    h.expect_event("catalog", "Normal", "Ready").await;

    // A values change updates the objects.
    h.patch_spec("catalog", json!({"values": {"greeting": "hey"}}))
        .await;
    let upgraded = h.wait_state("catalog", State::Ready).await;
    assert_eq!(h.settings("greeting").await.as_deref(), Some("hey"));
    assert_eq!(
        upgraded.status.unwrap().last_operation.unwrap().operation,
        "Upgrade"
    );

    // Drift: a deleted object comes back, an edited one is restored.
    h.delete_config_map("catalog-settings").await;
    h.wait_until("the deleted ConfigMap is back", async || {
        h.settings("greeting").await.is_some()
    })
    .await;
    let tamper = json!({"data": {"greeting": "tampered"}});
    h.patch_config_map("catalog-settings", tamper).await;
    h.wait_until("the edited ConfigMap is restored", async || {
        h.settings("greeting").await.as_deref() == Some("hey")
    })
    .await;

    // A chart version that drops an object prunes it.
    let pruned = h.upgrade_catalog_to_v2().await;
    assert_eq!(
        common::inventory_names(&pruned),
        ["ConfigMap/catalog-settings"]
    );
    assert!(!h.config_map_exists("catalog-legacy-settings").await);
    assert_eq!(h.settings("version").await.as_deref(), Some("2"));

    // Deleting the Manifest deletes its objects, then releases the finalizer.
    h.delete_and_wait("catalog").await;
    assert!(!h.config_map_exists("catalog-settings").await);
    h.expect_event("catalog", "Normal", "Deleted").await;
}

#[tokio::test]
async fn a_web_app_is_ready_once_its_deployment_has_rolled_out() {
    let h = start("web", RenderLimits::default()).await;
    h.create(&h.manifest("web", "examples/charts/web", json!({"replicaCount": 2})))
        .await;
    let processing = h.wait_for("web", "rolling out", common::rolling_out).await;
    let status = processing.status.clone().unwrap();
    let message = &status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap()
        .message;
    assert!(message.contains("Deployment web-web"), "{message}");
    assert_eq!(
        common::inventory_names(&processing),
        ["Service/web-web", "Deployment/web-web"]
    );

    // Play the Deployment controller.
    common::deployment_rolled_out(&h.client, &h.ns, "web-web", 2).await;
    h.wait_state("web", State::Ready).await;
}

#[tokio::test]
async fn orphan_policy_keeps_the_objects() {
    let h = start("orphan", RenderLimits::default()).await;
    let mut manifest = h.manifest("catalog", "examples/charts/catalog-v1", json!({}));
    manifest.spec.deletion_policy = module_manager::api::DeletionPolicy::Orphan;
    h.create(&manifest).await;
    h.wait_state("catalog", State::Ready).await;
    h.delete_and_wait("catalog").await;
    assert!(h.config_map_exists("catalog-settings").await);
    assert!(h.config_map_exists("catalog-legacy-settings").await);
    h.expect_event("catalog", "Normal", "Orphaned").await;
}

#[tokio::test]
async fn a_crd_and_its_custom_resource_install_in_one_pass() {
    let h = start("widgets", RenderLimits::default()).await;
    h.create(&h.manifest(
        "widgets",
        "examples/charts/widgets",
        json!({"color": "green"}),
    ))
    .await;
    let ready = h.wait_state("widgets", State::Ready).await;
    assert_eq!(
        common::inventory_names(&ready),
        [
            "CustomResourceDefinition/widgets.example.com",
            "Widget/widgets-widget"
        ]
    );
    let widgets = ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "example.com",
        "v1",
        "Widget",
    ));
    let widget = Api::<DynamicObject>::namespaced_with(h.client.clone(), &h.ns, &widgets)
        .get("widgets-widget")
        .await
        .unwrap();
    assert_eq!(widget.data["spec"]["color"], "green");
    let events = common::events_once(&h.client, &h.ns, "widgets", |e| !e.is_empty()).await;
    let reasons: Vec<&str> = events
        .iter()
        .map(|(_, reason, _)| reason.as_str())
        .collect();
    assert_eq!(
        reasons,
        ["Ready"],
        "one pass, straight to Ready, no error on the way: {events:?}"
    );
}

#[tokio::test]
async fn an_unchanged_manifest_runs_helm_zero_times_and_writes_nothing() {
    let h = start("unchanged", RenderLimits::default()).await;
    h.ready_catalog(json!({})).await;
    // The first pass after the install renders once more, with --is-upgrade (a different
    // input); wait until a pass has been served from the cache after that.
    h.wait_until("a drift pass hit the render cache", async || {
        h.ctx.renderer.cache_stats().hits >= 1
    })
    .await;

    let version = async |name: &str| h.config_maps().get(name).await.unwrap().resource_version();
    let versions = async || {
        let manifest = h.manifests.get("catalog").await.unwrap().resource_version();
        let settings = version("catalog-settings").await;
        (manifest, settings, version("catalog-legacy-settings").await)
    };
    let before = versions().await;
    let stats_before = h.ctx.renderer.cache_stats();
    tokio::time::sleep(Duration::from_secs(7)).await; // interval 2s: at least two drift passes
    let stats_after = h.ctx.renderer.cache_stats();
    assert!(
        stats_after.hits >= stats_before.hits + 3,
        "drift passes ran: {stats_before:?} -> {stats_after:?}"
    );
    assert_eq!(stats_after.misses, stats_before.misses, "helm did not run");
    assert_eq!(
        versions().await,
        before,
        "no object and not the Manifest was written"
    );
}

#[tokio::test]
async fn bad_input_is_reported_and_deletes_nothing() {
    let limits = RenderLimits {
        timeout: Duration::from_secs(3),
        max_output: 512 * 1024,
        ..Default::default()
    };
    let h = start("bad-input", limits).await;
    h.ready_catalog(json!({"greeting": "hi"})).await;

    let binary: Secret = serde_json::from_value(json!({
        "metadata": {"name": "binary"},
        // "greeting: " and bytes that are not UTF-8: helm refuses them; they are not replaced.
        "data": {"values.yaml": "Z3JlZXRpbmc6IP/+"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(h.client.clone(), &h.ns)
        .create(&PostParams::default(), &binary)
        .await
        .unwrap();
    let fixture = |name: &str| json!({"chart": {"path": format!("tests/fixtures/charts/{name}")}, "values": null});
    let cases = [
        (
            "missing chart path",
            fixture("nope"),
            "ChartError",
            "does not exist",
        ),
        (
            "chart outside the root",
            json!({"chart": {"path": "/etc"}}),
            "ChartError",
            "outside the chart root",
        ),
        (
            "broken chart",
            fixture("broken"),
            "RenderError",
            "cannot load Chart.yaml",
        ),
        (
            "template error",
            fixture("template-error"),
            "RenderError",
            "nosuchfunction",
        ),
        (
            "required value missing",
            fixture("needs-value"),
            "RenderError",
            "dbHost is required",
        ),
        (
            "values of the wrong type",
            json!({"chart": {"path": "tests/fixtures/charts/typed"}, "values": {"replicaCount": "three"}}),
            "RenderError",
            "replicaCount",
        ),
        (
            "render timeout",
            fixture("loop"),
            "RenderError",
            "did not finish within 3s",
        ),
        (
            "oversized output",
            fixture("huge"),
            "RenderError",
            "exceeds the limit of 524288 bytes",
        ),
        (
            "millions of tiny keys, scaled down",
            fixture("tiny-keys"),
            "PlanError",
            "more than 32768 YAML nodes",
        ),
        (
            "values Secret not UTF-8",
            json!({"chart": {"path": "examples/charts/catalog-v1"}, "valuesFrom": [{"kind": "Secret", "name": "binary"}]}),
            "ValuesError",
            "Secret binary key values.yaml: values are not UTF-8 text",
        ),
        (
            "values Secret missing",
            json!({"chart": {"path": "examples/charts/catalog-v1"}, "valuesFrom": [{"kind": "Secret", "name": "absent"}]}),
            "ValuesError",
            "Secret absent does not exist",
        ),
    ];
    for (case, spec, category, expected) in cases {
        h.patch_spec("catalog", spec).await;
        let failed = h
            .wait_for("catalog", case, |m| {
                let status = m.status.clone().unwrap_or_default();
                let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
                status.state == Some(State::Error)
                    && status.observed_generation == m.metadata.generation
                    && ready.is_some_and(|c| c.reason == category && c.message.contains(expected))
            })
            .await;
        assert_eq!(
            common::inventory_names(&failed).len(),
            2,
            "{case}: the inventory is kept"
        );
        assert_eq!(
            h.settings("greeting").await.as_deref(),
            Some("hi"),
            "{case}: nothing deleted"
        );
        assert!(
            h.config_map_exists("catalog-legacy-settings").await,
            "{case}: nothing pruned"
        );
        common::expect_event(&h.client, &h.ns, "catalog", |kind, reason, note| {
            kind == "Warning" && reason == category && note.contains(expected)
        })
        .await;
    }

    // Fixing the input recovers.
    h.patch_spec("catalog", json!({"chart": {"path": "examples/charts/catalog-v1"}, "valuesFrom": null, "values": {"greeting": "hi"}}))
        .await;
    h.wait_state("catalog", State::Ready).await;
}

/// A chart that loops costs its own Manifest: each render timeout stops the renderer's child,
/// so the timeout is transient and backs off on the Manifest's own schedule (the queue's 1 s
/// doubling), not every `spec.interval` (1 s here, the shortest allowed); another Manifest
/// becomes Ready meanwhile. Counts the renderer's starts over 40 s: at the interval a pass
/// would time out every ~3 s (~13 starts); with the backoff the passes come 1, 2, 4, 8, 16 s
/// after the failures (at most 5).
#[tokio::test]
async fn a_looping_chart_backs_off_and_does_not_restart_the_renderer_every_interval() {
    let limits = RenderLimits {
        timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let tools = testenv::Tools::locate().expect("tools built");
    let h = start_with(
        "render-timeout",
        limits,
        Some(Backend::Renderer(tools.renderer)),
    )
    .await;
    let mut looping = h.manifest("loop", "tests/fixtures/charts/loop", json!({}));
    looping.spec.interval = "1s".into();
    h.create(&looping).await;
    let failed = h
        .wait_for("loop", "the render timeout", |m| {
            current_condition(m, "Ready").is_some_and(|(_, reason, message)| {
                reason == "RenderError" && message.contains("did not finish within 2s")
            })
        })
        .await;
    assert!(
        condition_is(&failed, "Stalled", "False"),
        "a timeout is retried: {:?}",
        failed.status
    );
    let starts = || async { h.ctx.renderer.renderer_state().await.unwrap().starts };
    let first = starts().await;
    h.ready_catalog(json!({"greeting": "hi"})).await;
    tokio::time::sleep(Duration::from_secs(40)).await;
    let restarts = starts().await - first;
    eprintln!("{restarts} renderer restarts in 40 s");
    assert!(
        restarts <= 6,
        "{restarts} renderer restarts in 40 s: the timeouts do not back off"
    );
}

#[tokio::test]
async fn an_empty_render_does_not_prune_the_module() {
    let h = start("prune-guard", RenderLimits::default()).await;
    h.ready_catalog(json!({})).await;

    h.patch_spec(
        "catalog",
        json!({"chart": {"path": "tests/fixtures/charts/empty"}}),
    )
    .await;
    let refused = h.wait_state("catalog", State::Warning).await;
    let (reason, message) = common::ready_condition(&refused).unwrap();
    assert_eq!(reason, "PruneRefused");
    assert!(message.contains("render is empty"), "{message}");
    assert_eq!(
        common::inventory_names(&refused).len(),
        2,
        "the refused objects stay in the inventory"
    );
    assert!(h.config_map_exists("catalog-settings").await);
    assert!(h.config_map_exists("catalog-legacy-settings").await);
    common::expect_event(&h.client, &h.ns, "catalog", |kind, reason, _| {
        kind == "Warning" && reason == "PruneRefused"
    })
    .await;
}

#[tokio::test]
async fn objects_it_does_not_manage_are_neither_taken_over_nor_deleted() {
    let h = start("ownership", RenderLimits::default()).await;
    // Someone else's ConfigMap with the name the chart renders.
    objects::create_json(
        &h.config_maps(),
        json!({
            "metadata": {"name": "catalog-settings"}, "data": {"owner": "someone else"}
        }),
    )
    .await;
    h.create(&h.manifest("catalog", "examples/charts/catalog-v1", json!({})))
        .await;
    let refused = h.wait_state("catalog", State::Error).await;
    let message = refused
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap()
        .message;
    assert!(
        message.contains("ConfigMap/")
            && message.contains("catalog-settings")
            && message.contains("not managed"),
        "{message}"
    );
    assert_eq!(h.settings("owner").await.as_deref(), Some("someone else"));

    // Later passes (a spec change here; an operator restart likewise) refuse it again: the
    // refused object is recorded without a UID, so every apply of it is a create that fails.
    h.patch_spec("catalog", json!({"values": {"greeting": "again"}}))
        .await;
    h.wait_state("catalog", State::Error).await;
    assert_eq!(h.settings("owner").await.as_deref(), Some("someone else"));
    assert_eq!(h.settings("greeting").await, None, "not applied over");

    // Once it is out of the way the module installs; an object a person marks
    // `helm.sh/resource-policy: keep` survives the prune when the chart drops it.
    h.delete_config_map("catalog-settings").await;
    h.patch_spec("catalog", json!({"values": {"greeting": "retry"}}))
        .await;
    h.wait_state("catalog", State::Ready).await;
    let keep = json!({"metadata": {"annotations": {"helm.sh/resource-policy": "keep"}}});
    h.patch_config_map("catalog-legacy-settings", keep).await;
    let upgraded = h.upgrade_catalog_to_v2().await;
    assert_eq!(
        common::inventory_names(&upgraded),
        ["ConfigMap/catalog-settings"]
    );
    assert!(h.config_map_exists("catalog-legacy-settings").await, "kept");
}

#[tokio::test]
async fn a_suspended_manifest_is_left_alone_until_resumed() {
    let h = start("suspend", RenderLimits::default()).await;
    h.ready_catalog(json!({})).await;

    h.patch_spec("catalog", json!({"suspend": true})).await;
    tokio::time::sleep(Duration::from_secs(1)).await; // let the suspend be seen
    h.delete_config_map("catalog-settings").await;
    tokio::time::sleep(Duration::from_secs(6)).await; // three drift intervals
    assert!(
        !h.config_map_exists("catalog-settings").await,
        "no repair while suspended"
    );

    h.patch_spec("catalog", json!({"suspend": false})).await;
    h.wait_until("the ConfigMap is repaired after resuming", async || {
        h.config_map_exists("catalog-settings").await
    })
    .await;
}

#[tokio::test]
async fn objects_rendered_with_null_labels_are_still_labelled_and_deleted() {
    let h = start("null-labels", RenderLimits::default()).await;
    h.create(&h.manifest("plain", "tests/fixtures/charts/null-labels", json!({})))
        .await;
    let ready = h.wait_state("plain", State::Ready).await;
    let uid = ready.uid().unwrap();
    let object = h.config_maps().get("plain-plain").await.unwrap();
    assert_eq!(
        object
            .labels()
            .get(module_manager::apply::MANIFEST_UID_LABEL),
        Some(&uid)
    );
    h.delete_and_wait("plain").await;
    assert!(
        !h.config_map_exists("plain-plain").await,
        "deleted with its Manifest"
    );
}

/// The named condition of a Manifest as (status, reason, message), when it is set for the
/// Manifest's current generation: what `kubectl wait --for=condition=…` reads (it waits on a
/// condition whose `observedGeneration` is older than `metadata.generation`).
fn current_condition(manifest: &Manifest, kind: &str) -> Option<(String, String, String)> {
    let status = manifest.status.as_ref()?;
    let c = status.conditions.iter().find(|c| c.type_ == kind)?;
    let current = c
        .observed_generation
        .is_none_or(|g| Some(g) == manifest.metadata.generation);
    current.then(|| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

impl Harness {
    /// Waits until the Manifest's `kind` condition is `status` for its current generation, as
    /// `kubectl wait --for=condition=<kind>=<status>` does.
    async fn wait_condition(&self, name: &str, kind: &str, status: &str) -> Manifest {
        let what = format!("condition {kind}={status}");
        self.wait_for(name, &what, |m| condition_is(m, kind, status))
            .await
    }
}

/// The server-side table of a Manifest (what `kubectl get` prints): the column names and the
/// row's cells.
async fn table_row(h: &Harness, name: &str) -> (Vec<String>, Vec<Value>) {
    let path = format!(
        "/apis/modulemanager.io/v1alpha1/namespaces/{}/manifests/{name}",
        h.ns
    );
    let request = http::Request::get(path)
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let table: Value = h.client.request(request).await.unwrap();
    let columns = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    let cells = table["rows"][0]["cells"].as_array().unwrap().clone();
    (columns, cells)
}

/// Asserts that the current condition `kind` of `manifest` has `reason` and a message
/// containing `text`.
fn assert_condition_says(manifest: &Manifest, kind: &str, reason: &str, text: &str) {
    let (_, found, message) = current_condition(manifest, kind).unwrap();
    assert_eq!(found, reason, "{kind}: {message}");
    assert!(message.contains(text), "{message}");
}

fn condition_is(manifest: &Manifest, kind: &str, status: &str) -> bool {
    current_condition(manifest, kind).is_some_and(|(s, _, _)| s == status)
}

#[tokio::test]
async fn kstatus_conditions_end_kubectl_wait_for_success_retry_and_failure() {
    let h = start("kstatus", RenderLimits::default()).await;
    // Success: Ready=True for the current generation, neither reconciling nor stalled.
    h.create(&h.manifest("good", "examples/charts/catalog-v1", json!({})))
        .await;
    let good = h.wait_condition("good", "Ready", "True").await;
    assert!(condition_is(&good, "Reconciling", "False"));
    assert!(condition_is(&good, "Stalled", "False"));
    // `kubectl get manifests`: the server's table shows the Ready condition and its message.
    let (columns, cells) = table_row(&h, "good").await;
    assert_eq!(
        columns,
        [
            "Name", "Module", "Version", "Ready", "Status", "State", "Owner", "Age"
        ]
    );
    assert_eq!(cells[3], "True");
    assert_eq!(cells[4], "2 objects applied and ready");

    // A transient error (a values ConfigMap not there yet) is retried: in progress, not
    // healthy and not stalled.
    let mut waiting = h.manifest("retried", "examples/charts/catalog-v1", json!({}));
    waiting.spec.values_from =
        vec![serde_json::from_value(json!({"kind": "ConfigMap", "name": "later"})).unwrap()];
    h.create(&waiting).await;
    let retried = h.wait_condition("retried", "Reconciling", "True").await;
    assert_condition_says(
        &retried,
        "Reconciling",
        "ProgressingWithRetry",
        "ConfigMap later does not exist",
    );
    assert!(condition_is(&retried, "Ready", "False"));
    assert!(condition_is(&retried, "Stalled", "False"));
    objects::create_json(
        &h.config_maps(),
        json!({"metadata": {"name": "later"},
        "data": {"values.yaml": "greeting: later\n"}}),
    )
    .await;
    let recovered = h.wait_condition("retried", "Ready", "True").await;
    assert!(condition_is(&recovered, "Reconciling", "False"));

    // A permanent error ends the wait: Stalled=True, Ready=False, not reconciling.
    h.create(&h.manifest("bad", "tests/fixtures/charts/template-error", json!({})))
        .await;
    let bad = h.wait_condition("bad", "Stalled", "True").await;
    let (ready, reason, message) = current_condition(&bad, "Ready").unwrap();
    assert_eq!((ready.as_str(), reason.as_str()), ("False", "RenderError"));
    assert!(message.contains("nosuchfunction"), "{message}");
    assert!(condition_is(&bad, "Reconciling", "False"));
}

#[tokio::test]
async fn a_deployment_that_never_becomes_ready_stalls_after_the_timeout_and_recovers() {
    let h = start("timeout", RenderLimits::default()).await;
    let mut manifest = h.manifest("web", "examples/charts/web", json!({"replicaCount": 1}));
    manifest.spec.timeout = "3s".into();
    h.create(&manifest).await;
    // Nothing plays the Deployment controller: the Deployment never becomes ready.
    let waiting = h
        .wait_for("web", "the wait's start recorded", |m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.readiness_started.is_some())
        })
        .await;
    let started = waiting.status.clone().unwrap().readiness_started;
    let stalled = h.wait_condition("web", "Stalled", "True").await;
    let status = stalled.status.clone().unwrap();
    assert_eq!(status.state, Some(State::Error));
    let (ready, reason, message) = current_condition(&stalled, "Ready").unwrap();
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "ReadinessTimeout")
    );
    assert!(
        message.contains("Deployment web-web: 0 of 1 replicas"),
        "names the object and why: {message}"
    );
    assert_eq!(
        status.readiness_started, started,
        "counted from the first apply, not from each pass"
    );
    h.expect_event("web", "Warning", "ReadinessTimeout").await;

    // It rolls out after all: a later pass finds it ready.
    common::deployment_rolled_out(&h.client, &h.ns, "web-web", 1).await;
    let ready = h.wait_state("web", State::Ready).await;
    assert!(condition_is(&ready, "Stalled", "False"));
    assert_eq!(ready.status.unwrap().readiness_started, None);
}

/// Creates the `Gadget` CRD (with a status subresource) unless it exists, and waits until it
/// is Established.
async fn gadget_crd(client: &Client) -> ApiResource {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "gadgets.status-test.example.com"},
        "spec": {"group": "status-test.example.com", "scope": "Namespaced",
            "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("create the Gadget CRD: {e}"),
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let crd = crds.get("gadgets.status-test.example.com").await.unwrap();
        let established = crd.status.and_then(|s| s.conditions).is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if established {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the Gadget CRD is not Established"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "status-test.example.com",
        "v1",
        "Gadget",
    ))
}

#[tokio::test]
async fn a_custom_resource_that_is_not_ready_keeps_the_manifest_from_ready() {
    let h = start("gadget", RenderLimits::default()).await;
    let gadgets_resource = gadget_crd(&h.client).await;
    let gadgets = Api::<DynamicObject>::namespaced_with(h.client.clone(), &h.ns, &gadgets_resource);
    h.create(&h.manifest("gadget", "tests/fixtures/charts/gadget", json!({})))
        .await;
    // No conditions yet: kstatus reads an object without them as current.
    h.wait_state("gadget", State::Ready).await;

    // Plays the Gadget's controller: its only condition is `kind` with this status.
    let set_condition = async |kind: &str, status: &str, reason: &str, message: &str| {
        let object = gadgets.get("gadget-gadget").await.unwrap();
        let patch = json!({"status": {"observedGeneration": object.metadata.generation,
            "conditions": [{"type": kind, "status": status, "reason": reason, "message": message,
                "lastTransitionTime": "2026-12-01T00:00:00Z"}]}});
        objects::merge_status(&gadgets, "gadget-gadget", patch).await;
    };
    // Waits until the Manifest's condition `kind` has `status`, then checks its Ready condition.
    let ready_says = async |(kind, status): (&str, &str), reason: &str, text: &str| {
        let manifest = h.wait_condition("gadget", kind, status).await;
        assert_condition_says(&manifest, "Ready", reason, text);
        manifest
    };
    // Its controller says it is not ready: the Manifest is not either, and says why.
    set_condition("Ready", "False", "Degraded", "no quorum").await;
    let not_ready = ready_says(
        ("Ready", "False"),
        "Progressing",
        "Gadget gadget-gadget: not Ready (Degraded): no quorum",
    )
    .await;
    assert!(condition_is(&not_ready, "Reconciling", "True"));

    set_condition("Ready", "True", "Healthy", "all good").await;
    h.wait_condition("gadget", "Ready", "True").await;

    // Its controller gives up (kstatus: Failed): the Manifest is stalled, naming it.
    set_condition("Stalled", "True", "InvalidSize", "size too big").await;
    ready_says(
        ("Stalled", "True"),
        "ObjectFailed",
        "Gadget gadget-gadget: stalled (InvalidSize): size too big",
    )
    .await;
}

/// `status.lastHandledReconcileAt` as a Manifest has it.
fn handled_reconcile(manifest: &Manifest) -> Option<String> {
    manifest.status.as_ref()?.last_handled_reconcile_at.clone()
}

#[tokio::test]
async fn a_pass_requested_now_repairs_drift_whatever_the_interval_and_is_echoed() {
    use module_manager::api::RECONCILE_REQUESTED_AT;
    let h = start("requested", RenderLimits::default()).await;
    let mut manifest = h.manifest(
        "catalog",
        "examples/charts/catalog-v1",
        json!({"greeting": "hi"}),
    );
    manifest.spec.interval = "1h".into();
    h.create(&manifest).await;
    let ready = h.wait_state("catalog", State::Ready).await;
    let installed = ready.status.clone().unwrap().last_operation.unwrap();
    assert_eq!(handled_reconcile(&ready), None);

    // Drift that the next drift check (in an hour) would repair.
    let tamper = json!({"data": {"greeting": "tampered"}});
    h.patch_config_map("catalog-settings", tamper.clone()).await;
    // A metadata-only change of the annotation: a pass at once, its status echoes the value.
    common::annotate(
        &h.manifests,
        "catalog",
        RECONCILE_REQUESTED_AT,
        "2026-12-02T02:00:00Z",
    )
    .await;
    let handled = h
        .wait_for("catalog", "the request echoed", |m| {
            handled_reconcile(m).as_deref() == Some("2026-12-02T02:00:00Z")
        })
        .await;
    // The echo is written by the pass that repaired the drift (the status comes after the apply).
    assert_eq!(h.greeting("catalog-settings").await.as_deref(), Some("hi"));
    let status = handled.status.clone().unwrap();
    assert_eq!(status.state, Some(State::Ready));
    assert_eq!(
        status.last_operation.unwrap(),
        installed,
        "inputs unchanged: a drift pass, no upgrade"
    );

    // Each new value asks again.
    h.patch_config_map("catalog-settings", tamper.clone()).await;
    common::annotate(&h.manifests, "catalog", RECONCILE_REQUESTED_AT, "second").await;
    h.wait_for("catalog", "the second request echoed", |m| {
        handled_reconcile(m).as_deref() == Some("second")
    })
    .await;
    assert_eq!(h.greeting("catalog-settings").await.as_deref(), Some("hi"));
}

#[tokio::test]
async fn a_labelled_values_source_that_changes_is_applied_at_once_an_unlabelled_one_waits() {
    use module_manager::api::{WATCH_LABEL, WATCH_LABEL_VALUE};
    let h = start("values-watch", RenderLimits::default()).await;
    let values = |greeting: &str| json!({"values.yaml": format!("greeting: {greeting}\n")});
    let source = |name: &str, labelled: bool| -> ConfigMap {
        let labels = if labelled {
            json!({WATCH_LABEL: WATCH_LABEL_VALUE})
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "data": values("one"),
        }))
        .unwrap()
    };
    for (name, labelled) in [("watched-values", true), ("plain-values", false)] {
        h.config_maps()
            .create(&PostParams::default(), &source(name, labelled))
            .await
            .unwrap();
    }
    for (name, values_from) in [("watched", "watched-values"), ("plain", "plain-values")] {
        let mut manifest = h.manifest(name, "examples/charts/catalog-v1", json!({}));
        manifest.spec.interval = "1h".into();
        manifest.spec.values_from =
            serde_json::from_value(json!([{"kind": "ConfigMap", "name": values_from}])).unwrap();
        h.create(&manifest).await;
    }
    for name in ["watched", "plain"] {
        h.wait_state(name, State::Ready).await;
        let settings = format!("{name}-settings");
        assert_eq!(h.greeting(&settings).await.as_deref(), Some("one"));
    }
    let edit = |greeting: &str| json!({"data": values(greeting)});

    // The unlabelled source is edited first, then the labelled one: once the labelled edit is
    // applied, the watch has handled everything before it — and it never saw the unlabelled one.
    h.patch_config_map("plain-values", edit("two")).await;
    h.patch_config_map("watched-values", edit("two")).await;
    h.wait_until("the labelled source's new value is applied", async || {
        h.greeting("watched-settings").await.as_deref() == Some("two")
    })
    .await;
    assert_eq!(
        h.greeting("plain-settings").await.as_deref(),
        Some("one"),
        "an unlabelled source waits for spec.interval"
    );
    let watched = h.manifests.get("watched").await.unwrap();
    assert_eq!(
        watched.status.unwrap().last_operation.unwrap().operation,
        "Upgrade",
        "new merged values: an upgrade"
    );

    // Labelled later, it is watched from then on (it enters the watch: a change).
    let label = json!({"metadata": {"labels": {WATCH_LABEL: WATCH_LABEL_VALUE}}});
    h.patch_config_map("plain-values", label).await;
    h.wait_until("the newly labelled source is applied", async || {
        h.greeting("plain-settings").await.as_deref() == Some("two")
    })
    .await;
}

#[tokio::test]
async fn a_reset_counts_the_readiness_deadline_anew() {
    use module_manager::api::RESET_REQUESTED_AT;
    let h = start("reset-timeout", RenderLimits::default()).await;
    let mut manifest = h.manifest("web", "examples/charts/web", json!({"replicaCount": 1}));
    manifest.spec.timeout = "3s".into();
    manifest.spec.interval = "1h".into();
    h.create(&manifest).await;
    // Nothing plays the Deployment controller: stalled once the timeout has passed.
    let stalled = h.wait_condition("web", "Stalled", "True").await;
    let started = stalled.status.clone().unwrap().readiness_started.unwrap();
    let (_, reason, _) = current_condition(&stalled, "Ready").unwrap();
    assert_eq!(reason, "ReadinessTimeout");

    common::annotate(&h.manifests, "web", RESET_REQUESTED_AT, "r1").await;
    let reset = h
        .wait_for("web", "the reset echoed", |m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.last_handled_reset_at.as_deref() == Some("r1"))
        })
        .await;
    let restarted = reset.status.clone().unwrap().readiness_started.unwrap();
    assert!(
        restarted.0 > started.0,
        "spec.timeout counts from the reset's pass: {restarted:?} after {started:?}"
    );
    assert_eq!(
        reset.metadata.generation, stalled.metadata.generation,
        "no spec change"
    );
}

#[tokio::test]
async fn a_long_render_error_keeps_its_cause_in_the_status_and_the_event_with_either_backend() {
    // helm stops an include recursion after 1000 levels with a ~130 kB error whose cause is
    // its last line; status and Event used to keep the first 1 KiB, a thousand times "error
    // calling include".
    let tools = testenv::Tools::locate().expect("tools built");
    let cause = "rendering template has a nested reference name: recursion.loop: unable to execute template; Use --debug flag to render out invalid YAML";
    for (prefix, backend) in [
        ("recursion-helm", Backend::Helm(tools.helm.clone())),
        (
            "recursion-renderer",
            Backend::Renderer(tools.renderer.clone()),
        ),
    ] {
        let h = start_with(prefix, RenderLimits::default(), Some(backend)).await;
        h.create(&h.manifest("loop", "tests/fixtures/charts/recursion", json!({})))
            .await;
        let failed = h
            .wait_for("loop", "the render error", |m| {
                m.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "RenderError")
                })
            })
            .await;
        let status = failed.status.unwrap();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert!(
            ready.message.len() <= 2048,
            "{prefix}: {} bytes",
            ready.message.len()
        );
        assert!(
            ready.message.starts_with(
                "render: helm template failed: template: recursion/templates/configmap.yaml:6:12: "
            ),
            "{prefix}: {}",
            ready.message
        );
        assert!(
            ready.message.contains(" bytes omitted] … "),
            "{prefix}: {}",
            ready.message
        );
        assert!(
            ready.message.ends_with(cause),
            "{prefix}: {}",
            ready.message
        );
        let stalled = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Stalled")
            .unwrap();
        assert_eq!(stalled.message, ready.message, "{prefix}");
        assert!(
            status.last_operation.unwrap().message.ends_with(cause),
            "{prefix}"
        );
        let mut notes = Vec::new();
        h.wait_until("the Warning Event", async || {
            notes = h
                .events("loop")
                .await
                .into_iter()
                .filter(|(k, r, _)| k == "Warning" && r == "RenderError")
                .map(|(_, _, note)| note)
                .collect();
            !notes.is_empty()
        })
        .await;
        for note in &notes {
            assert!(note.len() <= 1024, "{prefix}: {} bytes", note.len());
            assert!(
                note.starts_with("render: helm template failed: template: "),
                "{prefix}: {note}"
            );
            assert!(note.ends_with(cause), "{prefix}: {note}");
        }
    }
}

/// Issue 15 item 3: a Manifest whose inventory holds an object of a kind the cluster no longer
/// serves (its CRD, created outside the chart, was deleted) reports an `Error` naming the kind
/// — the rest of the module left in place — and its deletion completes. Before, every pass
/// failed with `ApiError: 404 page not found` (a stale discovery snapshot still listed the kind)
/// and the deletion retried the same until discovery happened to be refreshed.
#[tokio::test]
async fn a_kind_no_longer_served_is_reported_by_name_and_the_manifest_can_be_deleted() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let h = start("unserved", RenderLimits::default()).await;
    let crds = Api::<CustomResourceDefinition>::all(h.client.clone());
    let name = "doodads.unserved-test.example.com";
    objects::create_json(
        &crds,
        json!({
            "metadata": {"name": name},
            "spec": {"group": "unserved-test.example.com", "scope": "Namespaced",
                "names": {"kind": "Doodad", "plural": "doodads", "singular": "doodad"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}]}
        }),
    )
    .await;
    h.wait_until("the Doodad CRD is Established", async || {
        let crd = crds.get(name).await.unwrap();
        crd.status.and_then(|s| s.conditions).is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
    })
    .await;
    h.create(&h.manifest("unserved", "tests/fixtures/charts/doodad", json!({})))
        .await;
    let ready = h.wait_state("unserved", State::Ready).await;
    let inventory = ready.status.unwrap().inventory;
    assert_eq!(inventory.len(), 2, "{inventory:?}");

    // Someone deletes the CRD (and with it the Doodad).
    objects::delete(&crds, name).await;
    h.wait_until("the Doodad CRD is gone", async || {
        crds.get_opt(name).await.unwrap().is_none()
    })
    .await;
    let expected = "Doodad/unserved-doodad: kind Doodad.unserved-test.example.com/v1 is no longer served (its CRD was deleted?)";
    let failed = h
        .wait_for("unserved", "Error naming the kind", |m| {
            m.status.as_ref().is_some_and(|s| {
                s.state == Some(State::Error)
                    && current_condition(m, "Ready")
                        .is_some_and(|(_, _, msg)| msg.contains(expected))
            })
        })
        .await;
    // The rest of the module stays, and so does the record of it.
    assert!(h.config_map_exists("unserved-config").await);
    assert_eq!(failed.status.unwrap().inventory, inventory);

    // Deleting it completes: the Doodad counts as gone, the ConfigMap is deleted.
    h.delete_and_wait("unserved").await;
    assert!(!h.config_map_exists("unserved-config").await);
}

#[tokio::test]
async fn the_watch_cache_keeps_neither_managed_fields_nor_kubectls_copy() {
    const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
    let h = start("slim-cache", RenderLimits::default()).await;
    let mut manifest = h.manifest("catalog", "examples/charts/catalog-v1", json!({}));
    manifest.metadata.annotations = Some(
        [
            (LAST_APPLIED.to_owned(), r#"{"spec":{}}"#.to_owned()),
            ("team".to_owned(), "a".to_owned()),
        ]
        .into(),
    );
    h.create(&manifest).await;
    let ready = h.wait_state("catalog", State::Ready).await;
    // The API server's copy has both: the creator's and the operator's writes.
    assert!(
        ready.managed_fields().len() >= 2,
        "{:?}",
        ready.managed_fields()
    );
    assert!(ready.annotations().contains_key(LAST_APPLIED));
    // The cache a pass reads has neither, and the rest as the API server has it.
    let mut cached = None;
    h.wait_until("the cache holds the Ready status", async || {
        cached = h.work.get(&h.ns, "catalog");
        let status = cached.as_ref().and_then(|m| m.status.as_ref());
        status.is_some_and(|s| s.state == Some(State::Ready))
    })
    .await;
    let cached = cached.unwrap();
    assert_eq!(cached.metadata.managed_fields, None);
    assert!(!cached.annotations().contains_key(LAST_APPLIED));
    assert_eq!(
        cached.annotations().get("team").map(String::as_str),
        Some("a")
    );
    assert_eq!(cached.spec, ready.spec);
    assert_eq!(cached.labels(), ready.labels());
    assert_eq!(cached.finalizers(), ready.finalizers());
}
