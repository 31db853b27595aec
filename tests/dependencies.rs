//! `spec.dependsOn` on a real kube-apiserver: a dependent waits (`Processing`,
//! `DependencyNotReady`) and is woken by its dependency's readiness (the depended-on watch) or,
//! where no watch sees it, by its own recheck within 30 s (every Manifest here has
//! `interval: 1h`, so only these can make it Ready within the test); a missing dependency, a
//! cycle, the deletion order, and tenants in two namespaces.
//!
//! There is no kubelet: the dependency's Deployment is made ready by writing its status, as the
//! Deployment controller would.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use std::time::Duration;

use kube::ResourceExt;
use kube::api::PostParams;
use module_manager::api::{DEPENDED_ON_LABEL, HAS_DEPENDENCIES_LABEL, Manifest, State};
use serde_json::{Value, json};
use test_support::objects;

const LIMIT: Duration = Duration::from_secs(60);

fn manifest(ns: &str, name: &str, chart: &str, values: Value, depends_on: Value) -> Manifest {
    serde_json::from_value(json!({
        "apiVersion": "modulemanager.io/v1alpha1",
        "kind": "Manifest",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"module": name, "chart": {"path": chart}, "values": values,
            "interval": "1h", "releaseName": name, "dependsOn": depends_on},
    }))
    .unwrap()
}

/// A catalog (two ConfigMaps, ready at once) named `name`, depending on `depends_on`.
fn catalog(ns: &str, name: &str, depends_on: Value) -> Manifest {
    manifest(
        ns,
        name,
        "examples/charts/catalog-v1",
        json!({"greeting": name}),
        depends_on,
    )
}

/// Waits until each Manifest is Ready, in order.
async fn all_ready<const N: usize>(operator: &common::Operator, names: [&str; N]) {
    for name in names {
        common::wait_state(&operator.manifests, name, State::Ready, LIMIT).await;
    }
}

async fn create(operator: &common::Operator, manifest: &Manifest) {
    operator
        .manifests
        .create(&PostParams::default(), manifest)
        .await
        .unwrap();
}

/// The Ready condition's (reason, message).
fn ready_condition(manifest: &Manifest) -> (String, String) {
    let status = manifest.status.clone().unwrap_or_default();
    status
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.reason, c.message))
        .unwrap_or_default()
}

/// Waits until `name` is at `state` for its generation with this Ready reason.
async fn wait_reason(
    operator: &common::Operator,
    name: &str,
    state: State,
    reason: &str,
) -> Manifest {
    common::wait_for(&operator.manifests, name, reason, LIMIT, |m| {
        let status = m.status.clone().unwrap_or_default();
        status.state == Some(state)
            && status.observed_generation == m.metadata.generation
            && ready_condition(m).0 == reason
    })
    .await
}

/// `web` (a Deployment that is not ready until the test says so) and `app` (a catalog that
/// depends on it); returns `app` once it waits.
async fn app_waiting_for_web(operator: &common::Operator) -> Manifest {
    let ns = &operator.ns;
    let web = manifest(
        ns,
        "web",
        "examples/charts/web",
        json!({"replicaCount": 1}),
        json!([]),
    );
    create(operator, &web).await;
    create(operator, &catalog(ns, "app", json!([{"name": "web"}]))).await;
    wait_reason(operator, "app", State::Processing, "DependencyNotReady").await
}

/// `web`'s Deployment rolls out (played by the test), and `web` becomes Ready.
async fn web_rolls_out(operator: &common::Operator) {
    let manifests = &operator.manifests;
    common::wait_for(manifests, "web", "rolling out", LIMIT, common::rolling_out).await;
    common::deployment_rolled_out(&operator.client, &operator.ns, "web-web", 1).await;
    common::wait_state(manifests, "web", State::Ready, LIMIT).await;
}

#[tokio::test]
async fn a_dependent_waits_and_is_woken_when_its_dependency_becomes_ready() {
    let operator = common::operator("deps-wake", "test-replica").await;
    let ns = operator.ns.clone();
    let waiting = app_waiting_for_web(&operator).await;
    let (_, message) = ready_condition(&waiting);
    assert!(
        message.contains(&format!("dependency {ns}/web is not Ready")),
        "{message}"
    );
    assert!(
        common::inventory_names(&waiting).is_empty(),
        "nothing installed while waiting"
    );
    let web = operator.manifests.get("web").await.unwrap();
    assert_eq!(
        web.labels().get(DEPENDED_ON_LABEL).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        waiting
            .labels()
            .get(HAS_DEPENDENCIES_LABEL)
            .map(String::as_str),
        Some("true")
    );

    // The Deployment rolls out: web becomes Ready, and app is woken (its interval is an hour).
    web_rolls_out(&operator).await;
    let app = common::wait_state(&operator.manifests, "app", State::Ready, LIMIT).await;
    assert!(!common::inventory_names(&app).is_empty());
}

/// Two tenants, each in its own namespace: a dependent in one never holds the deletion of a
/// Manifest in the other, and the operator writes nothing on the other's Manifest for it (no
/// depended-on label). Before, `a/app` kept `b/db` in `Deleting / DependentsExist` (and
/// namespace b Terminating) until tenant a deleted its own Manifest (review 2026-12-05 F2).
/// No watch of tenant a's operator (scoped to namespace a) sees `b/db` become Ready: `a/app`
/// installs through its own recheck (30 s). On 40d49df this test fails there already: `a/app`
/// waited for its interval (an hour) — "app: timed out waiting for Ready".
#[tokio::test]
async fn a_dependent_in_another_namespace_never_holds_a_deletion() {
    let tenant_a = common::operator("deps-tenant-a", "test-replica").await;
    let tenant_b = common::operator("deps-tenant-b", "test-replica").await;
    create(&tenant_b, &catalog(&tenant_b.ns, "db", json!([]))).await;
    let elsewhere = json!([{"name": "db", "namespace": tenant_b.ns}]);
    create(&tenant_a, &catalog(&tenant_a.ns, "app", elsewhere)).await;
    common::wait_state(&tenant_b.manifests, "db", State::Ready, LIMIT).await;
    let app = common::wait_state(&tenant_a.manifests, "app", State::Ready, LIMIT).await;
    assert!(!common::inventory_names(&app).is_empty(), "app installed");
    let db = tenant_b.manifests.get("db").await.unwrap();
    assert!(
        !db.labels().contains_key(DEPENDED_ON_LABEL),
        "nothing written on another namespace's Manifest: {:?}",
        db.labels()
    );

    objects::delete(&tenant_b.manifests, "db").await;
    let deadline = std::time::Instant::now() + LIMIT;
    while let Some(db) = tenant_b.manifests.get_opt("db").await.unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "b/db is held: {:?}",
            db.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let app = tenant_a.manifests.get("app").await.unwrap();
    assert!(
        !common::inventory_names(&app).is_empty(),
        "a/app keeps what it installed"
    );
}

/// A dependency created after its dependent began to wait: found by the dependent's recheck
/// (within 30 s), then Ready.
#[tokio::test]
async fn a_missing_dependency_is_waited_for_until_it_is_created_and_ready() {
    let operator = common::operator("deps-missing", "test-replica").await;
    let ns = operator.ns.clone();
    create(&operator, &catalog(&ns, "app", json!([{"name": "later"}]))).await;
    let waiting = wait_reason(&operator, "app", State::Processing, "DependencyNotReady").await;
    let (_, message) = ready_condition(&waiting);
    assert_eq!(
        message,
        format!("waiting: dependency {ns}/later is not found")
    );

    create(&operator, &catalog(&ns, "later", json!([]))).await;
    all_ready(&operator, ["later", "app"]).await;
}

#[tokio::test]
async fn a_cycle_is_stalled_and_breaking_it_lets_both_install() {
    let operator = common::operator("deps-cycle", "test-replica").await;
    let ns = operator.ns.clone();
    create(&operator, &catalog(&ns, "x", json!([{"name": "y"}]))).await;
    create(&operator, &catalog(&ns, "y", json!([{"name": "x"}]))).await;
    for (name, other) in [("x", "y"), ("y", "x")] {
        let stalled = wait_reason(&operator, name, State::Error, "DependencyCycle").await;
        let (_, message) = ready_condition(&stalled);
        let cycle = format!("{ns}/{name} → {ns}/{other} → {ns}/{name}");
        assert_eq!(
            message,
            format!("dependencies: dependency cycle: {cycle} (remove one of these dependsOn)")
        );
        let status = stalled.status.clone().unwrap_or_default();
        let stalled_condition = status.conditions.iter().find(|c| c.type_ == "Stalled");
        assert_eq!(stalled_condition.map(|c| c.status.as_str()), Some("True"));
        assert!(common::inventory_names(&stalled).is_empty());
    }
    let events = common::events_once(&operator.client, &ns, "x", |events| {
        events
            .iter()
            .any(|(_, reason, _)| reason == "DependencyCycle")
    })
    .await;
    assert!(
        events
            .iter()
            .any(|(kind, reason, _)| kind == "Warning" && reason == "DependencyCycle"),
        "{events:?}"
    );

    // y no longer depends on x: y installs, and x (stalled, interval 1h) is woken by y.
    common::patch_spec(&operator.manifests, "y", json!({"dependsOn": null})).await;
    all_ready(&operator, ["y", "x"]).await;
}

#[tokio::test]
async fn a_dependency_is_deleted_only_after_its_dependents() {
    let operator = common::operator("deps-delete", "test-replica").await;
    let ns = operator.ns.clone();
    create(&operator, &catalog(&ns, "base", json!([]))).await;
    create(&operator, &catalog(&ns, "app", json!([{"name": "base"}]))).await;
    // A dependent that never installed anything (it also waits for a Manifest that does not
    // exist) does not hold the deletion.
    create(
        &operator,
        &catalog(&ns, "idle", json!([{"name": "base"}, {"name": "nowhere"}])),
    )
    .await;
    all_ready(&operator, ["base", "app"]).await;
    wait_reason(&operator, "idle", State::Processing, "DependencyNotReady").await;

    objects::delete(&operator.manifests, "base").await;
    let held = wait_reason(&operator, "base", State::Deleting, "DependentsExist").await;
    let (_, message) = ready_condition(&held);
    assert_eq!(
        message,
        format!("waiting for the Manifests that depend on this one to be deleted first: {ns}/app")
    );
    assert!(
        !common::inventory_names(&held).is_empty(),
        "its objects are still there"
    );

    objects::delete(&operator.manifests, "app").await;
    // base goes once app is gone (its deletion looks again every 10 s), idle or not.
    let deadline = std::time::Instant::now() + LIMIT;
    while operator.manifests.get_opt("base").await.unwrap().is_some() {
        assert!(std::time::Instant::now() < deadline, "base is not deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!objects::exists(&operator.manifests, "app").await);
    assert!(
        objects::exists(&operator.manifests, "idle").await,
        "a dependent is not deleted with its dependency"
    );
}

#[tokio::test]
async fn another_namespace_is_refused_when_the_operator_says_so() {
    let operator = common::operator_with("deps-refused", 2, |context| {
        context.cross_namespace_dependencies(false)
    })
    .await;
    let ns = operator.ns.clone();
    let elsewhere = json!([{"name": "db", "namespace": "databases"}]);
    create(&operator, &catalog(&ns, "app", elsewhere)).await;
    let refused = wait_reason(&operator, "app", State::Error, "DependencyRefused").await;
    let (_, message) = ready_condition(&refused);
    assert_eq!(
        message,
        "dependencies: dependency databases/db is in another namespace, and this operator \
         refuses those (--cross-namespace-dependencies=false, the default in impersonation mode)"
    );
    assert!(common::inventory_names(&refused).is_empty());
    // The same namespace is fine.
    create(&operator, &catalog(&ns, "db", json!([]))).await;
    create(&operator, &catalog(&ns, "web", json!([{"name": "db"}]))).await;
    common::wait_state(&operator.manifests, "web", State::Ready, LIMIT).await;
}

/// The example of `make run`: `examples/manifests/storefront.yaml` depends on `catalog` and
/// `widgets`; applied first (widgets not there yet), it becomes Ready once both are.
#[tokio::test]
async fn the_storefront_example_waits_for_catalog_and_widgets() {
    let operator = common::operator("deps-example", "test-replica").await;
    let ns = operator.ns.clone();
    for name in ["storefront", "catalog", "widgets"] {
        let path = test_support::repo().join(format!("examples/manifests/{name}.yaml"));
        let mut example: Manifest =
            serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        // Into the test's namespace, the module's objects too.
        example.metadata.namespace = Some(ns.clone());
        example.spec.target_namespace = None;
        create(&operator, &example).await;
        if name == "storefront" {
            let waiting =
                wait_reason(&operator, name, State::Processing, "DependencyNotReady").await;
            let (_, message) = ready_condition(&waiting);
            assert!(
                message.contains(&format!("dependency {ns}/widgets is not found")),
                "{message}"
            );
        }
    }
    common::wait_state(&operator.manifests, "storefront", State::Ready, LIMIT).await;
}
