//! Tenancy on a real kube-apiserver with `--authorization-mode=RBAC`: a Manifest naming a
//! ServiceAccount is applied, hooked and deleted as that account (impersonated), so it cannot
//! reach beyond what the account may touch; the operator's namespace is never writable; the
//! `--require-service-account` and `--default-service-account` policies.
//!
//! Each scenario makes its own namespaces — A (the tenant: its ServiceAccount `deployer` may do
//! anything with ConfigMaps and Jobs there, and read its Namespace), B (another tenant: the
//! account may only read ConfigMaps there) and OP
//! (stands for the operator's namespace: protected, and `deployer` is even granted ConfigMaps
//! there, to show that RBAC does not matter) — and runs a controller on A. The test's client
//! is the admin: it checks what was (not) written.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};
use module_manager::apply::identity::Tenancy;
use module_manager::plan::tenancy::{Protected, ServiceAccountPolicy};
use module_manager::work::controller::ControllerConfig;
use serde_json::{Value, json};
use test_support::objects;

const CHART: &str = "tests/fixtures/charts/tenant";
const ACCOUNT: &str = "deployer";

/// Three namespaces, the tenant's RBAC and a controller on namespace A; stopped when dropped.
struct Tenants {
    client: Client,
    a: String,
    b: String,
    op: String,
    manifests: Api<Manifest>,
    _running: common::Running,
    _helm_home: tempfile::TempDir,
}

async fn create<K>(api: &Api<K>, object: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// A Role in `namespace` over `rules`, bound to A's `deployer`.
async fn grant(client: &Client, namespace: &str, a: &str, rules: Value) {
    let meta = json!({"name": ACCOUNT, "namespace": namespace});
    create(
        &Api::<Role>::namespaced(client.clone(), namespace),
        json!({"metadata": meta, "rules": rules}),
    )
    .await;
    create(
        &Api::<RoleBinding>::namespaced(client.clone(), namespace),
        json!({
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": a}],
        }),
    )
    .await;
}

async fn start(prefix: &str, policy: ServiceAccountPolicy) -> Tenants {
    let control_plane = common::control_plane_with(Some(common::BASIC_CONTROLLERS)).await;
    let client = control_plane.client().await.unwrap();
    let a = control_plane
        .namespace(&client, &format!("{prefix}-a"))
        .await
        .unwrap();
    let b = control_plane
        .namespace(&client, &format!("{prefix}-b"))
        .await
        .unwrap();
    let op = control_plane
        .namespace(&client, &format!("{prefix}-op"))
        .await
        .unwrap();
    create(
        &Api::<ServiceAccount>::namespaced(client.clone(), &a),
        json!({"metadata": {"name": ACCOUNT}}),
    )
    .await;
    let everything = json!([
        "get", "list", "watch", "create", "update", "patch", "delete"
    ]);
    grant(
        &client,
        &a,
        &a,
        json!([
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": everything},
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": everything},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
        ]),
    )
    .await;
    // In B the account may read ConfigMaps, not write them: the adoption read passes, so
    // only the dry-run apply finds a forbidden object before the first real apply.
    grant(
        &client,
        &b,
        &a,
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
    )
    .await;
    // Even an explicit grant does not open the operator's namespace to a module.
    grant(
        &client,
        &op,
        &a,
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": everything}]),
    )
    .await;
    let base = control_plane.config().await.unwrap();
    let protected = Protected {
        namespaces: vec![op.clone()],
        lease_labels: vec!["modulemanager.io/fleet".into()],
    };
    let helm_home = tempfile::tempdir().unwrap();
    let ctx = test_support::context(client.clone(), helm_home.path())
        .chart_cache(&helm_home.path().join("charts"))
        .tenancy(Tenancy::new(Some(base), policy, protected))
        .build()
        .await
        .unwrap();
    let config = ControllerConfig {
        concurrency: 2,
        namespace: Some(a.clone()),
        ..Default::default()
    };
    let running = common::run_controller(Arc::new(ctx), config);
    Tenants {
        manifests: Api::namespaced(client.clone(), &a),
        client,
        a,
        b,
        op,
        _running: running,
        _helm_home: helm_home,
    }
}

impl Tenants {
    /// Creates a Manifest of the `tenant` chart with `values`, as `account` (or none).
    async fn create(&self, name: &str, account: Option<&str>, values: Value) {
        self.create_every(name, account, values, "2s").await;
    }

    /// [`Self::create`] with its drift interval.
    async fn create_every(&self, name: &str, account: Option<&str>, values: Value, interval: &str) {
        let mut spec = json!({"module": name, "chart": {"path": CHART}, "values": values, "interval": interval});
        if let Some(account) = account {
            spec["serviceAccountName"] = json!(account);
        }
        common::create_manifest(&self.manifests, &common::manifest(&self.a, name, spec)).await;
    }

    async fn wait_for(&self, name: &str, what: &str, done: impl Fn(&Manifest) -> bool) -> Manifest {
        common::wait_for(&self.manifests, name, what, Duration::from_secs(90), done).await
    }

    async fn wait_state(&self, name: &str, state: State) -> Manifest {
        common::wait_state(&self.manifests, name, state, Duration::from_secs(90)).await
    }

    /// Waits for `Error` and returns the status message.
    async fn error(&self, name: &str) -> String {
        let failed = self.wait_state(name, State::Error).await;
        ready_message(&failed)
    }

    async fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .unwrap()
    }

    fn user(&self) -> String {
        format!("system:serviceaccount:{}:{ACCOUNT}", self.a)
    }

    /// Creates a Manifest as the account and waits for its `Error`: `object` is forbidden for
    /// the account, which lacks `patch` on `resource`.
    async fn refused(
        &self,
        name: &str,
        account: Option<&str>,
        values: Value,
        object: &str,
        resource: &str,
    ) {
        self.create(name, account, values).await;
        let message = self.error(name).await;
        assert_forbidden(&message, object, &self.user(), resource);
    }
}

/// The `Ready` condition's message (the status message).
fn ready_message(manifest: &Manifest) -> String {
    let status = manifest.status.clone().unwrap_or_default();
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// The message names the object, the impersonated user and the verb and resource it lacks.
fn assert_forbidden(message: &str, object: &str, user: &str, resource: &str) {
    assert!(
        message.contains(&format!("{object} is forbidden"))
            && message.contains(user)
            && message.contains(&format!("cannot patch resource \"{resource}\"")),
        "expected {object} forbidden for {user} ({resource}): {message}"
    );
}

#[tokio::test]
async fn a_tenant_writes_only_where_its_account_may() {
    let t = start("tenancy", ServiceAccountPolicy::default()).await;
    let (a, b, op) = (t.a.clone(), t.b.clone(), t.op.clone());
    // Its own namespace: installed as the account (no drift pass later: the deletion below
    // works on an inventory this test edits).
    t.create_every(
        "own",
        Some(ACCOUNT),
        json!({"configMaps": [{"name": "own"}]}),
        "1h",
    )
    .await;
    t.wait_state("own", State::Ready).await;
    assert!(t.config_map(&a, "own").await.is_some(), "applied in A");

    // Namespace B: refused before anything of the render is applied — `a-first` (in A, applied
    // first in install order) is not written either.
    t.refused(
        "into-b",
        Some(ACCOUNT),
        json!({"configMaps": [{"name": "a-first"}, {"name": "z-in-b", "namespace": b}]}),
        &format!("ConfigMap/{b}/z-in-b"),
        "configmaps",
    )
    .await;
    assert!(t.config_map(&b, "z-in-b").await.is_none());
    assert!(
        t.config_map(&a, "a-first").await.is_none(),
        "nothing of the render is applied"
    );

    // Changing B's own object: refused, the object unchanged.
    create(
        &Api::<ConfigMap>::namespaced(t.client.clone(), &b),
        json!({"metadata": {"name": "theirs"}, "data": {"value": "b's"}}),
    )
    .await;
    t.refused(
        "change-b",
        Some(ACCOUNT),
        json!({"configMaps": [{"name": "theirs", "namespace": b}]}),
        &format!("ConfigMap/{b}/theirs"),
        "configmaps",
    )
    .await;
    let theirs = t.config_map(&b, "theirs").await.unwrap();
    assert_eq!(theirs.data.unwrap()["value"], "b's");

    // Cluster-scoped: refused.
    let role = format!("{a}-escalate");
    t.refused(
        "cluster",
        Some(ACCOUNT),
        json!({"configMaps": [{"name": "with-role"}], "clusterRole": role}),
        &format!("ClusterRole/{role}"),
        "clusterroles",
    )
    .await;
    let roles = Api::<ClusterRole>::all(t.client.clone());
    assert!(!objects::exists(&roles, &role).await);
    assert!(t.config_map(&a, "with-role").await.is_none());

    // The operator's namespace: refused whatever the RBAC (the account may write ConfigMaps
    // there), with a message naming the object.
    t.create(
        "into-op",
        Some(ACCOUNT),
        json!({"configMaps": [{"name": "a-first-op"}, {"name": "planted", "namespace": op}]}),
    )
    .await;
    let message = t.error("into-op").await;
    assert!(
        message.contains(&format!("ConfigMap/{op}/planted is refused"))
            && message.contains("operator's own"),
        "{message}"
    );
    assert!(t.config_map(&op, "planted").await.is_none());
    assert!(t.config_map(&a, "a-first-op").await.is_none());
    let events = common::events_once(&t.client, &a, "into-op", |e| {
        e.iter().any(|(_, reason, _)| reason == "TenancyError")
    })
    .await;
    assert!(
        events.iter().any(|(kind, reason, note)| kind == "Warning"
            && reason == "TenancyError"
            && note.contains("planted")),
        "{events:?}"
    );

    // Deleting A's Manifest deletes nothing in B, even with B's object forged into its
    // inventory and labelled as its own: the delete is made as the account, and refused.
    let own_uid = objects::uid(&t.manifests, "own").await;
    let label = json!({"metadata": {"labels": {"modulemanager.io/manifest-uid": own_uid}}});
    Api::<ConfigMap>::namespaced(t.client.clone(), &b)
        .patch("theirs", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let status = t.manifests.get_status("own").await.unwrap().status.unwrap();
    let mut inventory = serde_json::to_value(&status.inventory).unwrap();
    inventory.as_array_mut().unwrap().push(json!({
        "group": "", "version": "v1", "kind": "ConfigMap", "namespace": b, "name": "theirs",
    }));
    objects::merge_status(
        &t.manifests,
        "own",
        json!({"status": {"inventory": inventory}}),
    )
    .await;
    objects::delete(&t.manifests, "own").await;
    let failed = t
        .wait_for("own", "the deletion refused", |m| {
            let status = m.status.clone().unwrap_or_default();
            status.state == Some(State::Error) && ready_message(m).contains("theirs")
        })
        .await;
    let message = ready_message(&failed);
    assert!(
        message.contains(&format!("ConfigMap/{b}/theirs is forbidden"))
            && message.contains(&t.user()),
        "{message}"
    );
    assert!(
        t.config_map(&b, "theirs").await.is_some(),
        "B's object is still there"
    );
    // Release the Manifest (the test's cleanup).
    objects::merge(
        &t.manifests,
        "own",
        json!({"metadata": {"finalizers": null}}),
    )
    .await;
}

#[tokio::test]
async fn hooks_run_as_the_tenant() {
    let t = start("tenancy-hooks", ServiceAccountPolicy::default()).await;
    let (a, b) = (t.a.clone(), t.b.clone());
    t.create(
        "hook-in-b",
        Some(ACCOUNT),
        json!({"configMaps": [{"name": "app"}], "hook": {"name": "migrate", "namespace": b}}),
    )
    .await;
    let message = t.error("hook-in-b").await;
    assert_forbidden(&message, &format!("Job/{b}/migrate"), &t.user(), "jobs");
    let jobs = Api::<Job>::namespaced(t.client.clone(), &b);
    assert!(!objects::exists(&jobs, "migrate").await);
    assert!(t.config_map(&a, "app").await.is_none());
    // The same hook in A starts (as the account, which may create Jobs there).
    t.create(
        "hook-in-a",
        Some(ACCOUNT),
        json!({"configMaps": [{"name": "app-a"}], "hook": {"name": "migrate-a", "namespace": a}}),
    )
    .await;
    let jobs = Api::<Job>::namespaced(t.client.clone(), &a);
    t.wait_for("hook-in-a", "the hook running", |m| {
        m.status.clone().unwrap_or_default().state == Some(State::Processing)
    })
    .await;
    let job = jobs.get("migrate-a").await.unwrap();
    let managers: Vec<_> = job
        .managed_fields()
        .iter()
        .map(|f| f.manager.clone())
        .collect();
    assert!(
        managers.contains(&Some("module-manager".into())),
        "{managers:?}"
    );
}

#[tokio::test]
async fn a_delete_hook_in_the_operators_namespace_is_never_run() {
    // As the operator (no account): only the protected check stands between the chart and
    // the operator's namespace. The hook is added after the install and the Manifest deleted:
    // the delete hooks are rendered from the current spec, so they must be vetted too.
    let t = start("tenancy-delete-hook", ServiceAccountPolicy::default()).await;
    t.create("leaver", None, json!({"configMaps": [{"name": "kept"}]}))
        .await;
    t.wait_state("leaver", State::Ready).await;
    let hook = json!({"name": "cleanup", "namespace": t.op, "events": "pre-delete"});
    let patch = json!({"spec": {"values": {"configMaps": [{"name": "kept"}], "hook": hook}}});
    t.manifests
        .patch("leaver", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let message = t.error("leaver").await;
    assert!(
        message.contains(&format!("Job/{}/cleanup", t.op)),
        "{message}"
    );
    objects::delete(&t.manifests, "leaver").await;
    let start = std::time::Instant::now();
    while t.manifests.get_opt("leaver").await.unwrap().is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the Manifest was not deleted; Jobs in the operator's namespace: {:?}",
            Api::<Job>::namespaced(t.client.clone(), &t.op)
                .list(&Default::default())
                .await
                .map(|l| l
                    .items
                    .iter()
                    .map(ResourceExt::name_any)
                    .collect::<Vec<_>>())
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let jobs = Api::<Job>::namespaced(t.client.clone(), &t.op);
    assert!(
        !objects::exists(&jobs, "cleanup").await,
        "a delete hook ran in the operator's namespace"
    );
    assert!(
        t.config_map(&t.a, "kept").await.is_none(),
        "the module was deleted"
    );
}

#[tokio::test]
async fn require_service_account_refuses_a_manifest_without_one() {
    let required = ServiceAccountPolicy {
        default: None,
        required: true,
        adopt_as_operator: false,
    };
    let t = start("tenancy-required", required).await;
    t.create("anonymous", None, json!({"configMaps": [{"name": "anon"}]}))
        .await;
    let failed = t.wait_state("anonymous", State::Error).await;
    let status = failed.status.clone().unwrap();
    let message = ready_message(&failed);
    assert!(message.contains("--require-service-account"), "{message}");
    let stalled = status.conditions.iter().find(|c| c.type_ == "Stalled");
    assert_eq!(
        stalled.map(|c| c.status.as_str()),
        Some("True"),
        "{status:?}"
    );
    assert!(t.config_map(&t.a, "anon").await.is_none());
    let events = common::events_once(&t.client, &t.a, "anonymous", |e| !e.is_empty()).await;
    assert!(
        events
            .iter()
            .any(|(kind, reason, _)| kind == "Warning" && reason == "TenancyError"),
        "{events:?}"
    );
    // Naming one, it installs.
    t.create(
        "named",
        Some(ACCOUNT),
        json!({"configMaps": [{"name": "named"}]}),
    )
    .await;
    t.wait_state("named", State::Ready).await;
    assert!(t.config_map(&t.a, "named").await.is_some());
}

#[tokio::test]
async fn the_default_service_account_is_used_for_manifests_without_one() {
    let defaulted = ServiceAccountPolicy {
        default: Some(ACCOUNT.into()),
        required: true,
        adopt_as_operator: false,
    };
    let t = start("tenancy-default", defaulted).await;
    let b = t.b.clone();
    t.create("mine", None, json!({"configMaps": [{"name": "mine"}]}))
        .await;
    t.wait_state("mine", State::Ready).await;
    assert!(t.config_map(&t.a, "mine").await.is_some());
    // As the default account, B is out of reach.
    t.refused(
        "elsewhere",
        None,
        json!({"configMaps": [{"name": "elsewhere", "namespace": b}]}),
        &format!("ConfigMap/{b}/elsewhere"),
        "configmaps",
    )
    .await;
    assert!(t.config_map(&b, "elsewhere").await.is_none());
}

/// Server-side applies of ConfigMaps the API server has served so far, (real, dry run), from
/// its own `/metrics`.
async fn config_map_applies(client: &Client) -> (f64, f64) {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let mut counts = (0.0, 0.0);
    for line in text.lines().filter(|l| {
        l.starts_with("apiserver_request_total{")
            && l.contains("resource=\"configmaps\"")
            && l.contains("verb=\"APPLY\"")
    }) {
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        if line.contains("dry_run=\"All\"") {
            counts.1 += value;
        } else {
            counts.0 += value;
        }
    }
    counts
}

/// The request cost of the dry-run pre-check (docs/reconcile.md § Identity): the same
/// 20-ConfigMap module, drift passes every second for 20 s, written as the operator and then as
/// a ServiceAccount; prints the ConfigMap applies (real and dry run) per pass. Run alone (the
/// API server's counters are global): `cargo test --test tenancy -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "measurement: run alone, prints the request counts"]
async fn measure_the_request_cost_of_the_pre_check() {
    let t = start("tenancy-cost", ServiceAccountPolicy::default()).await;
    let objects: Vec<Value> = (0..20)
        .map(|i| json!({"name": format!("cm-{i:02}")}))
        .collect();
    for (name, account) in [("as-operator", None), ("as-account", Some(ACCOUNT))] {
        t.create_every(name, account, json!({"configMaps": objects}), "1s")
            .await;
        t.wait_state(name, State::Ready).await;
        let before = config_map_applies(&t.client).await;
        tokio::time::sleep(Duration::from_secs(20)).await;
        let after = config_map_applies(&t.client).await;
        let (real, dry) = (after.0 - before.0, after.1 - before.1);
        let passes = real / 20.0;
        println!(
            "{name}: {real} applies and {dry} dry-run applies of ConfigMaps in {passes:.1} passes: {:.1} dry runs per pass, {:.2} write requests per applied object",
            dry / passes.max(1.0),
            (real + dry) / real.max(1.0)
        );
        match account {
            None => assert_eq!(dry, 0.0, "no pre-check as the operator"),
            Some(_) => assert!(dry > 0.0, "the pre-check runs as an account"),
        }
        objects::delete(&t.manifests, name).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while t.manifests.get_opt(name).await.unwrap().is_some() {
            assert!(std::time::Instant::now() < deadline, "{name} not deleted");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `spec.adopt` as a ServiceAccount takes over only what that account may write: an unlabelled
/// ConfigMap of its own namespace is taken as the account (UID kept); one in a namespace where
/// it may only read is refused for lack of `patch` — by the dry-run permission check every
/// impersonated pass makes before applying anything, so nothing of that render is written —
/// and left as it was (docs/api.md § Adopting existing objects).
#[tokio::test]
async fn a_tenant_adopts_only_what_its_account_may_write() {
    let t = start("tenancy-adopt", ServiceAccountPolicy::default()).await;
    let (a, b) = (t.a.clone(), t.b.clone());
    let existing = |namespace: &str| {
        let api = Api::<ConfigMap>::namespaced(t.client.clone(), namespace);
        async move {
            objects::create_json(
                &api,
                json!({"metadata": {"name": "existing"}, "data": {"value": "by hand"}}),
            )
            .await
        }
    };
    let in_a = existing(&a).await;
    let in_b = existing(&b).await;
    let adopting = |name: &str, values: Value| {
        let spec = json!({"module": name, "chart": {"path": CHART}, "values": values,
                          "interval": "2s", "serviceAccountName": ACCOUNT, "adopt": true});
        common::manifest(&a, name, spec)
    };

    common::create_manifest(
        &t.manifests,
        &adopting("own", json!({"configMaps": [{"name": "existing"}]})),
    )
    .await;
    let ready = t.wait_state("own", State::Ready).await;
    let taken = t.config_map(&a, "existing").await.unwrap();
    assert_eq!(taken.uid(), in_a.uid(), "taken over, not created again");
    assert_eq!(
        taken
            .labels()
            .get(module_manager::apply::MANIFEST_UID_LABEL),
        ready.uid().as_ref()
    );
    assert_eq!(
        taken.data.unwrap().get("value").map(String::as_str),
        Some("from-the-chart")
    );

    common::create_manifest(
        &t.manifests,
        &adopting(
            "into-b",
            json!({"configMaps": [{"name": "existing", "namespace": b}]}),
        ),
    )
    .await;
    let message = t.error("into-b").await;
    assert_forbidden(
        &message,
        &format!("ConfigMap/{b}/existing"),
        &t.user(),
        "configmaps",
    );
    let left = t.config_map(&b, "existing").await.unwrap();
    assert_eq!(
        left.resource_version(),
        in_b.resource_version(),
        "not written"
    );
}
