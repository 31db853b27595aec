//! Race-free ownership on a real kube-apiserver: the preconditions a guarded apply carries, two
//! Manifests rendering one object, and an object deleted and created again by someone else
//! (docs/reconcile.md, "Adoption and ownership"). A remote target whose kubeconfig Secret now
//! names another cluster is tested in `tests/remote_targets.rs`.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Error as KubeError, ResourceExt};
use module_manager::api::{Manifest, State};
use module_manager::apply::MANIFEST_UID_LABEL;
use serde_json::{Value, json};
use test_support::objects;

const REPLICA: &str = "test-replica";

/// A server-side apply of the ConfigMap `name` as manager `probe`, `metadata` merged into the
/// body's; the answer's HTTP code (200 when it was written) and the causes' fields.
async fn apply(
    api: &Api<ConfigMap>,
    name: &str,
    metadata: Value,
    force: bool,
) -> (u16, Vec<String>) {
    let mut body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}});
    for (key, value) in metadata.as_object().unwrap() {
        body["metadata"][key] = value.clone();
    }
    let params = PatchParams::apply("probe");
    let params = if force { params.force() } else { params };
    match api.patch(name, &params, &Patch::Apply(&body)).await {
        Ok(_) => (200, Vec::new()),
        Err(KubeError::Api(status)) => {
            let causes = status.details.map(|d| d.causes).unwrap_or_default();
            (
                status.code,
                causes
                    .into_iter()
                    .map(|c| format!("{} {}", c.reason, c.field))
                    .collect(),
            )
        }
        Err(e) => panic!("apply {name}: {e}"),
    }
}

/// What the design rests on, asked of the API server itself: a resourceVersion no object has
/// lets an apply create but not overwrite; a UID lets it write only that object (and never
/// create); a field conflict is told apart from a failed precondition by its causes.
#[tokio::test]
async fn the_api_server_enforces_the_preconditions_of_an_apply_body() {
    let plane = common::control_plane().await;
    let client = plane.client().await.unwrap();
    let ns = plane.namespace(&client, "preconditions").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let absent = json!({"resourceVersion": "1"});
    let stranger = "00000000-0000-0000-0000-000000000001";

    assert_eq!(
        apply(&api, "a", json!({"uid": stranger}), true).await.0,
        409,
        "a UID never creates"
    );
    assert!(!objects::exists(&api, "a").await);
    assert_eq!(
        apply(&api, "a", absent.clone(), true).await.0,
        200,
        "absent: created"
    );
    let created = api.get("a").await.unwrap();
    assert_ne!(created.resource_version().as_deref(), Some("1"));
    assert_eq!(
        apply(&api, "a", absent.clone(), true).await,
        (409, vec![]),
        "exists: refused, also forced"
    );
    assert_eq!(apply(&api, "a", absent.clone(), false).await, (409, vec![]));
    let uid = created.uid().unwrap();
    assert_eq!(
        apply(&api, "a", json!({"uid": uid}), false).await.0,
        200,
        "its own UID"
    );
    let (code, causes) = apply(&api, "a", json!({"uid": stranger}), true).await;
    assert_eq!(code, 422);
    assert!(
        causes.iter().all(|c| c.ends_with("metadata.uid")),
        "{causes:?}"
    );
    // Read, then written once at that resourceVersion: a second writer with the same read loses.
    let read = api.get("a").await.unwrap().resource_version().unwrap();
    let as_read = |x: &str| json!({"uid": uid, "resourceVersion": read, "labels": {"x": x}});
    assert_eq!(apply(&api, "a", as_read("1"), false).await.0, 200);
    assert_eq!(apply(&api, "a", as_read("2"), false).await, (409, vec![]));
    // Another manager's field: the conflict comes first and names itself by its causes.
    let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "theirs"}});
    api.patch(
        "a",
        &PatchParams::apply("other").force(),
        &Patch::Apply(&theirs),
    )
    .await
    .unwrap();
    let conflict = (409, vec!["FieldManagerConflict .data.k".to_owned()]);
    assert_eq!(apply(&api, "a", absent, false).await, conflict);
    assert_eq!(apply(&api, "a", json!({"uid": uid}), false).await, conflict);
    // No field is owned by the precondition: the applies own `data.k` and the label only.
    let managed = api.get("a").await.unwrap().managed_fields().to_vec();
    let probe = managed
        .iter()
        .find(|m| m.manager.as_deref() == Some("probe"))
        .unwrap();
    assert_eq!(probe.operation.as_deref(), Some("Apply"));
    let fields = serde_json::to_string(&probe.fields_v1).unwrap();
    assert!(
        !fields.contains("uid") && !fields.contains("resourceVersion"),
        "{fields}"
    );
}

/// An operator for this test's namespace ([`common::Operator`]), stopped when dropped.
async fn start(prefix: &str) -> common::Operator {
    common::operator_with(prefix, 2, |context| context.replica(REPLICA)).await
}

/// A Manifest `name` installing the catalog chart as release `module` (its objects are named
/// after it), re-applied every 2 s.
fn manifest(ns: &str, name: &str, module: &str, greeting: &str) -> Manifest {
    serde_json::from_value(json!({
        "apiVersion": "modulemanager.io/v1alpha1",
        "kind": "Manifest",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"module": name, "releaseName": module, "chart": {"path": "examples/charts/catalog-v1"},
                 "values": {"greeting": greeting}, "interval": "2s"},
    }))
    .unwrap()
}

/// The message of the Manifest's `Ready` condition.
fn ready_message(manifest: &Manifest) -> String {
    let status = manifest.status.clone().unwrap_or_default();
    let ready = status.conditions.into_iter().find(|c| c.type_ == "Ready");
    ready.map(|c| c.message).unwrap_or_default()
}

/// Whether the Manifest's current generation ended in a settled state (Ready or Error).
fn settled(manifest: &Manifest) -> bool {
    let status = manifest.status.clone().unwrap_or_default();
    matches!(status.state, Some(State::Ready | State::Error))
        && status.observed_generation == manifest.metadata.generation
}

/// The ConfigMap's owner label and resourceVersion.
async fn owner_and_version(config_maps: &Api<ConfigMap>, name: &str) -> (Option<String>, String) {
    let cm = config_maps.get(name).await.unwrap();
    (
        cm.labels().get(MANIFEST_UID_LABEL).cloned(),
        cm.resource_version().unwrap(),
    )
}

/// One pair's outcome: which Manifest of the two owns the objects.
struct Pair {
    module: String,
    winner: (String, String),
    loser: String,
    owner_and_version: (Option<String>, String),
}

/// Waits until both Manifests of the pair `module` settled and exactly one is Ready, the other
/// Error naming the object and the winner's UID; the owner label names the winner.
async fn settle_pair(op: &common::Operator, module: &str) -> Pair {
    let config_maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), &op.ns);
    let limit = Duration::from_secs(90);
    let names = [format!("{module}-a"), format!("{module}-b")];
    let mut settled_pair = Vec::new();
    for name in &names {
        settled_pair.push(common::wait_for(&op.manifests, name, "settled", limit, settled).await);
    }
    let state = |i: usize| settled_pair[i].status.clone().unwrap().state;
    let (winner, loser) = match (state(0), state(1)) {
        (Some(State::Ready), Some(State::Error)) => (0, 1),
        (Some(State::Error), Some(State::Ready)) => (1, 0),
        states => panic!("{module}: exactly one of the two must own the objects: {states:?}"),
    };
    let winner_uid = settled_pair[winner].uid().unwrap();
    let message = ready_message(&settled_pair[loser]);
    assert!(
        message.contains(&format!("{module}-"))
            && message.contains(&winner_uid)
            && message.contains("refusing to take it over"),
        "{module}: the loser names the object and its owner: {message}"
    );
    let owner_and_version = owner_and_version(&config_maps, &format!("{module}-settings")).await;
    assert_eq!(
        owner_and_version.0.as_deref(),
        Some(winner_uid.as_str()),
        "{module}"
    );
    Pair {
        module: module.to_owned(),
        winner: (names[winner].clone(), winner_uid),
        loser: names[loser].clone(),
        owner_and_version,
    }
}

/// Pairs of Manifests created at once, each pair rendering the same objects (one release name):
/// several pairs, so that the two of a pair do apply at the same moment in some of them.
#[tokio::test]
async fn manifests_created_at_once_rendering_one_object_one_owns_it_without_flipping() {
    let op = common::operator_with("race", 8, |context| context.replica(REPLICA)).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), &op.ns);
    let modules: Vec<String> = (0..4).map(|i| format!("shared{i}")).collect();
    let post = PostParams::default();
    let creations = modules.iter().flat_map(|module| {
        ["a", "b"].map(|side| manifest(&op.ns, &format!("{module}-{side}"), module, side))
    });
    let creations: Vec<Manifest> = creations.collect();
    for created in
        futures::future::join_all(creations.iter().map(|m| op.manifests.create(&post, m))).await
    {
        created.unwrap();
    }
    let mut pairs = Vec::new();
    for module in &modules {
        pairs.push(settle_pair(&op, module).await);
    }

    // Drift passes of both (the winners every 2 s; the losers on a spec change) neither flip
    // an owner label nor write an object.
    let limit = Duration::from_secs(60);
    for round in 0..3 {
        for pair in &pairs {
            let spec = json!({"values": {"greeting": format!("again {round}")}});
            common::patch_spec(&op.manifests, &pair.loser, spec).await;
        }
        for pair in &pairs {
            common::wait_state(&op.manifests, &pair.loser, State::Error, limit).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        for pair in &pairs {
            let now = owner_and_version(&config_maps, &format!("{}-settings", pair.module)).await;
            assert_eq!(now, pair.owner_and_version, "{} round {round}", pair.module);
        }
    }
    for pair in &pairs {
        let cm = config_maps
            .get(&format!("{}-settings", pair.module))
            .await
            .unwrap();
        let greeting = pair.winner.0.rsplit('-').next().unwrap();
        assert_eq!(
            cm.data.unwrap().get("greeting").map(String::as_str),
            Some(greeting)
        );
    }

    // Deleting a loser leaves the winner's objects.
    let pair = &pairs[0];
    objects::delete(&op.manifests, &pair.loser).await;
    common::wait_for_gone(&op.manifests, &pair.loser).await;
    let settings = format!("{}-settings", pair.module);
    assert_eq!(
        owner_and_version(&config_maps, &settings).await,
        pair.owner_and_version
    );
    let legacy = config_maps
        .get(&format!("{}-legacy-settings", pair.module))
        .await
        .unwrap();
    assert_eq!(
        legacy.labels().get(MANIFEST_UID_LABEL),
        Some(&pair.winner.1)
    );
}

/// An operator with the Manifest `catalog` (release `catalog`, greeting `hi`) Ready.
async fn ready_catalog(prefix: &str) -> (common::Operator, Api<ConfigMap>, Manifest) {
    let op = start(prefix).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), &op.ns);
    let catalog = manifest(&op.ns, "catalog", "catalog", "hi");
    op.manifests
        .create(&PostParams::default(), &catalog)
        .await
        .unwrap();
    let limit = Duration::from_secs(60);
    let ready = common::wait_state(&op.manifests, "catalog", State::Ready, limit).await;
    (op, config_maps, ready)
}

#[tokio::test]
async fn an_object_deleted_and_created_again_by_someone_else_is_neither_written_nor_deleted() {
    let (op, config_maps, ready) = ready_catalog("recreated").await;
    let limit = Duration::from_secs(60);
    let uid = ready.uid().unwrap();
    let recorded = ready.status.clone().unwrap().inventory_uids;
    let original = objects::uid(&config_maps, "catalog-settings").await;
    assert_eq!(
        recorded.get(&format!("ConfigMap/{}/catalog-settings", op.ns)),
        Some(&original)
    );

    // Someone deletes it and creates their own under the name — even with the Manifest's label.
    objects::delete(&config_maps, "catalog-settings").await;
    let theirs = objects::create_json(
        &config_maps,
        json!({
            "metadata": {"name": "catalog-settings", "labels": {MANIFEST_UID_LABEL: uid}},
            "data": {"owner": "someone else"},
        }),
    )
    .await;
    let refused = common::wait_for(
        &op.manifests,
        "catalog",
        "Error about the replaced object",
        limit,
        |m| ready_message(m).contains("created again by someone else"),
    )
    .await;
    assert!(
        ready_message(&refused).contains("catalog-settings"),
        "{}",
        ready_message(&refused)
    );
    let events = common::events_once(&op.client, &op.ns, "catalog", |e| {
        e.iter()
            .any(|(k, _, n)| k == "Warning" && n.contains("created again"))
    })
    .await;
    assert!(
        events
            .iter()
            .any(|(k, _, n)| k == "Warning" && n.contains("created again")),
        "{events:?}"
    );
    let kept = config_maps.get("catalog-settings").await.unwrap();
    assert_eq!(
        kept.resource_version(),
        theirs.resource_version(),
        "not written"
    );
    assert_eq!(kept.data.unwrap().get("greeting"), None);

    // Deleting the Manifest deletes its other object and leaves theirs.
    objects::delete(&op.manifests, "catalog").await;
    common::wait_for_gone(&op.manifests, "catalog").await;
    let left = config_maps
        .get_opt("catalog-settings")
        .await
        .unwrap()
        .expect("theirs is left");
    assert_eq!(left.uid(), theirs.uid());
    let legacy = config_maps
        .get_opt("catalog-legacy-settings")
        .await
        .unwrap();
    assert!(
        legacy.is_none_or(|l| l.metadata.deletion_timestamp.is_some()),
        "its own object is deleted"
    );
}

#[tokio::test]
async fn an_object_of_the_manifest_that_is_gone_is_created_again() {
    let (op, config_maps, _) = ready_catalog("repaired").await;
    let limit = Duration::from_secs(60);
    let before = objects::uid(&config_maps, "catalog-settings").await;
    objects::delete(&config_maps, "catalog-settings").await;
    // The next drift pass (2 s) creates it again, and records its new UID.
    let key = format!("ConfigMap/{}/catalog-settings", op.ns);
    let repaired = common::wait_for(
        &op.manifests,
        "catalog",
        "the new UID recorded",
        limit,
        |m| {
            let uids = m.status.clone().unwrap_or_default().inventory_uids;
            uids.get(&key).is_some_and(|uid| *uid != before)
        },
    )
    .await;
    let now = config_maps.get("catalog-settings").await.unwrap();
    assert_eq!(
        repaired.status.unwrap().inventory_uids.get(&key),
        now.uid().as_ref()
    );
    assert_eq!(
        now.data.unwrap().get("greeting").map(String::as_str),
        Some("hi")
    );
}

/// An operator whose Manifests, written with its own identity, may adopt (`--adopt-as-operator`).
async fn start_adopting(prefix: &str) -> common::Operator {
    use module_manager::apply::identity::Tenancy;
    use module_manager::plan::tenancy::{Protected, ServiceAccountPolicy};
    let policy = ServiceAccountPolicy {
        adopt_as_operator: true,
        ..Default::default()
    };
    common::operator_with(prefix, 2, |context| {
        context
            .replica(REPLICA)
            .tenancy(Tenancy::new(None, policy, Protected::default()))
    })
    .await
}

/// [`manifest`] with `spec` fields merged in.
fn manifest_with(ns: &str, name: &str, greeting: &str, spec: Value) -> Manifest {
    let mut manifest = serde_json::to_value(manifest(ns, name, "catalog", greeting)).unwrap();
    let fields = manifest["spec"].as_object_mut().unwrap();
    fields.extend(spec.as_object().unwrap().clone());
    serde_json::from_value(manifest).unwrap()
}

/// The UIDs of the catalog chart's two ConfigMaps (release `catalog`).
async fn catalog_uids(config_maps: &Api<ConfigMap>) -> [String; 2] {
    [
        objects::uid(config_maps, "catalog-settings").await,
        objects::uid(config_maps, "catalog-legacy-settings").await,
    ]
}

/// A module moves from one Manifest to another (docs/api.md: delete with `Orphan`, create
/// the new one with `spec.adopt`): no object is deleted or created again, and while the first
/// Manifest exists its objects are never taken, with or without `spec.adopt`.
#[tokio::test]
async fn a_module_moves_to_another_manifest_by_adoption_and_keeps_its_objects() {
    let op = start_adopting("adopt-move").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), &op.ns);
    let limit = Duration::from_secs(60);
    let old = manifest_with(&op.ns, "old", "hi", json!({"deletionPolicy": "Orphan"}));
    op.manifests
        .create(&PostParams::default(), &old)
        .await
        .unwrap();
    let old = common::wait_state(&op.manifests, "old", State::Ready, limit).await;
    let old_uid = old.uid().unwrap();
    let uids = catalog_uids(&config_maps).await;

    // Without spec.adopt the new Manifest is refused, naming the owner.
    let new = manifest_with(&op.ns, "new", "moved", json!({}));
    op.manifests
        .create(&PostParams::default(), &new)
        .await
        .unwrap();
    let refused = common::wait_for(&op.manifests, "new", "refused", limit, |m| {
        ready_message(m).contains(&old_uid)
    })
    .await;
    assert!(
        ready_message(&refused).contains("spec.adopt"),
        "the refusal says how to take over: {}",
        ready_message(&refused)
    );
    // With it, while `old` exists: still refused (never a live Manifest's objects).
    let adopt = json!({"spec": {"adopt": true}});
    op.manifests
        .patch("new", &PatchParams::default(), &Patch::Merge(&adopt))
        .await
        .unwrap();
    let generation = op.manifests.get("new").await.unwrap().metadata.generation;
    let still = common::wait_for(
        &op.manifests,
        "new",
        "refused at the new generation",
        limit,
        |m| {
            let status = m.status.clone().unwrap_or_default();
            status.observed_generation == generation && ready_message(m).contains(&old_uid)
        },
    )
    .await;
    assert_eq!(still.status.unwrap().state, Some(State::Error));
    assert_eq!(
        config_maps
            .get("catalog-settings")
            .await
            .unwrap()
            .labels()
            .get(MANIFEST_UID_LABEL),
        Some(&old_uid),
        "not taken while its Manifest exists"
    );

    // `old` is deleted, its objects orphaned: `new` takes them over as they are.
    objects::delete(&op.manifests, "old").await;
    common::wait_for_gone(&op.manifests, "old").await;
    let moved = common::wait_state(&op.manifests, "new", State::Ready, limit).await;
    let new_uid = moved.uid().unwrap();
    assert_eq!(
        catalog_uids(&config_maps).await,
        uids,
        "no object created again"
    );
    let settings = config_maps.get("catalog-settings").await.unwrap();
    assert_eq!(settings.labels().get(MANIFEST_UID_LABEL), Some(&new_uid));
    assert_eq!(
        settings.data.unwrap().get("greeting").map(String::as_str),
        Some("moved")
    );
    let recorded = moved.status.unwrap().inventory_uids;
    assert_eq!(
        recorded.get(&format!("ConfigMap/{}/catalog-settings", op.ns)),
        Some(&uids[0])
    );
}

/// A release installed by `helm install` is taken over by a Manifest with `spec.adopt`: its
/// objects keep their UIDs and get the chart's values as the Manifest renders them; Helm's
/// release Secret is left alone (docs/api.md § Adopting existing objects).
#[tokio::test]
async fn a_release_installed_by_helm_is_taken_over_with_adopt() {
    let op = start_adopting("adopt-helm").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), &op.ns);
    let limit = Duration::from_secs(60);
    let home = tempfile::tempdir().unwrap();
    let chart = test_support::repo().join("examples/charts/catalog-v1");
    let kubeconfig = common::control_plane().await.kubeconfig().to_owned();
    let output = std::process::Command::new(testenv::Tools::locate().unwrap().helm)
        .args(["install", "catalog"])
        .arg(&chart)
        .args(["--namespace", &op.ns, "--set", "greeting=from-helm"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env_clear()
        .env("HOME", home.path())
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let uids = catalog_uids(&config_maps).await;

    let taker = manifest_with(&op.ns, "taker", "from-mm", json!({"adopt": true}));
    op.manifests
        .create(&PostParams::default(), &taker)
        .await
        .unwrap();
    let ready = common::wait_state(&op.manifests, "taker", State::Ready, limit).await;
    assert_eq!(
        catalog_uids(&config_maps).await,
        uids,
        "no object created again"
    );
    let settings = config_maps.get("catalog-settings").await.unwrap();
    assert_eq!(
        settings.labels().get(MANIFEST_UID_LABEL),
        ready.uid().as_ref()
    );
    assert_eq!(
        settings.data.unwrap().get("greeting").map(String::as_str),
        Some("from-mm")
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(op.client.clone(), &op.ns);
    assert!(
        objects::exists(&secrets, "sh.helm.release.v1.catalog.v1").await,
        "Helm's release record is left alone"
    );
}

/// Written with the operator's own identity, `spec.adopt` is refused unless the operator runs
/// with `--adopt-as-operator`: its rights are wider than the Manifest's author's.
#[tokio::test]
async fn adoption_as_the_operator_is_refused_without_the_flag() {
    let op = start("adopt-refused").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), &op.ns);
    let limit = Duration::from_secs(60);
    let theirs = objects::create_json(
        &config_maps,
        json!({"metadata": {"name": "catalog-settings"}, "data": {"owner": "someone else"}}),
    )
    .await;
    let taker = manifest_with(&op.ns, "taker", "hi", json!({"adopt": true}));
    op.manifests
        .create(&PostParams::default(), &taker)
        .await
        .unwrap();
    let refused = common::wait_state(&op.manifests, "taker", State::Error, limit).await;
    let message = ready_message(&refused);
    assert!(
        message.contains("--adopt-as-operator") && message.contains("nothing was applied"),
        "{message}"
    );
    let kept = config_maps.get("catalog-settings").await.unwrap();
    assert_eq!(
        kept.resource_version(),
        theirs.resource_version(),
        "not written"
    );
    assert!(
        !objects::exists(&config_maps, "catalog-legacy-settings").await,
        "nothing applied"
    );
}

/// The owner is looked up in every namespace: an object labelled as a Manifest of another
/// namespace (which no replica here reconciles) is refused while that Manifest exists, and
/// taken over once it is gone.
#[tokio::test]
async fn an_object_of_a_manifest_in_another_namespace_is_adopted_only_once_it_is_gone() {
    let op = start_adopting("adopt-elsewhere").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), &op.ns);
    let limit = Duration::from_secs(60);
    let control_plane = common::control_plane().await;
    let other_ns = control_plane
        .namespace(&op.client, "adopt-owner")
        .await
        .unwrap();
    let others: Api<Manifest> = Api::namespaced(op.client.clone(), &other_ns);
    let owner = others
        .create(
            &PostParams::default(),
            &manifest(&other_ns, "owner", "catalog", "hi"),
        )
        .await
        .unwrap();
    let owner_uid = owner.uid().unwrap();
    let theirs = objects::create_json(
        &config_maps,
        json!({"metadata": {"name": "catalog-settings", "labels": {MANIFEST_UID_LABEL: owner_uid}},
               "data": {"owner": "the other namespace's"}}),
    )
    .await;

    let taker = manifest_with(&op.ns, "taker", "taken", json!({"adopt": true}));
    op.manifests
        .create(&PostParams::default(), &taker)
        .await
        .unwrap();
    let refused = common::wait_for(&op.manifests, "taker", "refused", limit, |m| {
        ready_message(m).contains(&owner_uid)
    })
    .await;
    assert!(
        ready_message(&refused).contains("which exists"),
        "{}",
        ready_message(&refused)
    );
    let kept = config_maps.get("catalog-settings").await.unwrap();
    assert_eq!(
        kept.resource_version(),
        theirs.resource_version(),
        "not written"
    );

    objects::delete(&others, "owner").await;
    common::wait_for_gone(&others, "owner").await;
    let ready = common::wait_state(&op.manifests, "taker", State::Ready, limit).await;
    let taken = config_maps.get("catalog-settings").await.unwrap();
    assert_eq!(taken.uid(), theirs.uid(), "taken over, not created again");
    assert_eq!(taken.labels().get(MANIFEST_UID_LABEL), ready.uid().as_ref());
}
