//! The request budget (issue 14 item 4), on the real control plane: the operator's own API
//! requests per install and per unchanged drift pass, and passes per converged Manifest, read
//! from `module_manager_api_requests_total` (the counting layer on the operator's client; the
//! test's own client is not counted). Counts, not times. Prints `BUDGET` lines with the figures
//! and the requests by verb and resource (`-- --nocapture`).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, PostParams};
use module_manager::api::{Manifest, RECONCILE_REQUESTED_AT, State};
use module_manager::apply::MANIFEST_SHARD_LABEL;
use module_manager::apply::MANIFEST_UID_LABEL;
use module_manager::apply::watched::Selection;
use module_manager::reconcile::Context;
use module_manager::shard::ShardCount;
use module_manager::shard::label::owned_objects;
use module_manager::telemetry::requests::{self, ApiRequestMetrics, RequestLabels, RequestTarget};
use module_manager::work::controller::{self, ControllerConfig};
use serde_json::json;
use test_support::objects;

/// Manifests installed at once.
const MANIFESTS: u64 = 10;
/// Objects the `budget` chart renders: a ConfigMap, a ServiceAccount, a Service (each ready
/// once applied).
const OBJECTS: u64 = 3;

/// An operator (the controller in process, no fleet) whose client counts its requests.
struct Counted {
    admin: kube::Client,
    api: ApiRequestMetrics,
    ctx: Arc<Context>,
    manifests: Api<Manifest>,
    ns: String,
    _stop: tokio::sync::oneshot::Sender<()>,
    _helm_home: tempfile::TempDir,
}

/// An operator's context whose client counts its requests, in a namespace of its own, and
/// the test's own (uncounted) client.
struct Parts {
    admin: kube::Client,
    ns: String,
    api: ApiRequestMetrics,
    ctx: Arc<Context>,
    helm_home: tempfile::TempDir,
}

impl Parts {
    /// With `selection` for the object watches (a replica's owned shards).
    async fn new(selection: Option<Selection>) -> Self {
        let control_plane = common::control_plane().await;
        let admin = control_plane.client().await.unwrap();
        let ns = control_plane.namespace(&admin, "budget").await.unwrap();
        let api = ApiRequestMetrics::default();
        let config = control_plane.config().await.unwrap();
        let client = requests::client(config, &api, RequestTarget::Local).unwrap();
        let helm_home = tempfile::tempdir().unwrap();
        let mut context = test_support::context(client, helm_home.path());
        if let Some(selection) = selection {
            context = context.object_selection(selection);
        }
        let ctx = Arc::new(context.build().await.unwrap());
        Self {
            admin,
            ns,
            api,
            ctx,
            helm_home,
        }
    }

    /// Requests and passes so far (passes are not counted here: the test runs them).
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            requests: counted(&self.api),
            passes: 0,
        }
    }
}

/// Requests by series (`verb resource`) so far.
fn counted(api: &ApiRequestMetrics) -> BTreeMap<(String, String), u64> {
    let requests = api.seen().into_iter().map(|l: RequestLabels| {
        let n = api.requests.get_or_create(&l).get();
        ((l.verb.to_owned(), l.resource), n)
    });
    requests.collect()
}

/// Requests by series (`verb resource`), and passes, at one moment.
#[derive(Clone, Default)]
struct Snapshot {
    requests: BTreeMap<(String, String), u64>,
    passes: u64,
}

/// What happened between two snapshots.
struct Spent {
    requests: BTreeMap<(String, String), u64>,
    passes: u64,
}

impl Spent {
    fn total(&self) -> u64 {
        self.requests.values().sum()
    }

    /// Requests whose (verb, resource) `pick` accepts.
    fn of(&self, pick: impl Fn(&str, &str) -> bool) -> u64 {
        let picked = self.requests.iter().filter(|((v, r), _)| pick(v, r));
        picked.map(|(_, n)| n).sum()
    }

    fn line(&self) -> String {
        let series = self.requests.iter().filter(|(_, n)| **n > 0);
        let shown: Vec<String> = series.map(|((v, r), n)| format!("{v} {r}: {n}")).collect();
        shown.join(", ")
    }
}

impl Counted {
    async fn start() -> Self {
        Self::start_with(None).await
    }

    /// With `selection` for the object watches (a replica's owned shards).
    async fn start_with(selection: Option<Selection>) -> Self {
        let Parts {
            admin,
            ns,
            api,
            ctx,
            helm_home,
        } = Parts::new(selection).await;
        let config = ControllerConfig {
            concurrency: 2,
            namespace: Some(ns.clone()),
            ..Default::default()
        };
        let synced = config.synced.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(controller::run(ctx.clone(), config, async move {
            let _ = stopped.await;
        }));
        while !synced.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self {
            api,
            ctx,
            manifests: Api::namespaced(admin.clone(), &ns),
            admin,
            ns,
            _stop: stop,
            _helm_home: helm_home,
        }
    }

    fn snapshot(&self) -> Snapshot {
        let passes = ["ready", "processing", "warning", "error", "done", "fenced"]
            .into_iter()
            .map(|result| self.passes(result))
            .sum();
        Snapshot {
            requests: counted(&self.api),
            passes,
        }
    }

    /// Passes with `result` (and any error category of those the test meets: none expected).
    fn passes(&self, result: &'static str) -> u64 {
        let labels = module_manager::telemetry::metrics::ResultLabels {
            result,
            category: "",
        };
        self.ctx.metrics.reconciles.get_or_create(&labels).get()
    }

    /// Runs `act`, waits until every Manifest satisfies `done` and no pass ran for a moment (a
    /// pass our own writes would queue is counted), and returns what was spent meanwhile.
    async fn spent(&self, act: impl AsyncFnOnce(&Self), done: impl Fn(&Manifest) -> bool) -> Spent {
        let before = self.snapshot();
        act(self).await;
        for i in 0..MANIFESTS {
            let name = format!("m-{i}");
            let limit = Duration::from_secs(60);
            common::wait_for(&self.manifests, &name, "done", limit, &done).await;
        }
        // Until no pass ran for 1.5 s; at most 15 s (Manifests with a short `spec.interval`
        // whose passes drift apart may never leave such a gap).
        let mut last = self.snapshot().passes;
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let now = self.snapshot().passes;
            if now == last {
                break;
            }
            last = now;
        }
        between(&before, &self.snapshot())
    }
}

/// What was spent from `before` to `after`.
fn between(before: &Snapshot, after: &Snapshot) -> Spent {
    let requests = after.requests.iter().map(|(series, n)| {
        let was = before.requests.get(series).copied().unwrap_or(0);
        (series.clone(), n - was)
    });
    Spent {
        requests: requests.collect(),
        passes: after.passes - before.passes,
    }
}

/// Creates the Manifests `m-0` … of the `budget` chart.
async fn create_all(op: &Counted) {
    create_all_every(op, "1h").await;
}

/// Creates the Manifests `m-0` … of the `budget` chart, with drift passes every `interval`.
async fn create_all_every(op: &Counted, interval: &str) {
    for i in 0..MANIFESTS {
        let manifest: Manifest = serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": format!("m-{i}"), "namespace": op.ns},
            "spec": {"module": format!("m-{i}"), "interval": interval,
                     "chart": {"path": "tests/fixtures/charts/budget"}},
        }))
        .unwrap();
        let post = PostParams::default();
        op.manifests.create(&post, &manifest).await.unwrap();
    }
}

/// Asks every Manifest for a pass now.
async fn request_all(op: &Counted) {
    request_all_at(op, "t1").await;
}

/// Asks every Manifest for a pass now, with `requestedAt: at`.
async fn request_all_at(op: &Counted, at: &str) {
    for i in 0..MANIFESTS {
        let name = format!("m-{i}");
        common::annotate(&op.manifests, &name, RECONCILE_REQUESTED_AT, at).await;
    }
}

/// Whether a Manifest's status echoes the pass requested with `requestedAt: at`.
fn handled(at: &str) -> impl Fn(&Manifest) -> bool {
    move |m: &Manifest| {
        let status = m.status.as_ref();
        status.and_then(|s| s.last_handled_reconcile_at.as_deref()) == Some(at)
    }
}

/// The target cluster's identity (its `kube-system` Namespace's UID, `status.targetIdentity`),
/// read once per cluster handle: once per replica for the local cluster, not per install.
fn identity_read(verb: &str, resource: &str) -> bool {
    verb == "get" && resource == "namespaces"
}

/// The budget: an install costs its objects' applies, the claim (finalizer and shard label),
/// the inventory recorded before the applies and the status — objects + 3 — and one Event (it
/// became Ready); one pass per Manifest whose objects are ready at once (at most 1.2 on
/// average); a pass asked for with `requestedAt` over an unchanged Manifest costs the
/// objects' applies and the status write echoing the request: objects + 1 (a pass on its timer, not
/// asked for, applies nothing unchanged: see the idle test below).
#[tokio::test(flavor = "multi_thread")]
async fn an_install_and_a_drift_pass_stay_within_the_request_budget() {
    let op = Counted::start().await;
    let installed = |m: &Manifest| {
        let status = m.status.clone().unwrap_or_default();
        status.state == Some(State::Ready) && status.observed_generation == m.metadata.generation
    };
    let install = op.spent(create_all, installed).await;
    let drift = op.spent(request_all, handled("t1")).await;

    let per = |n: u64, of: u64| n as f64 / of.max(1) as f64;
    let events = install.of(|_, r| r == "events.k8s.io/events");
    let identity = install.of(identity_read);
    // The controller's own watch of Manifests may open inside the window when it starts (its
    // list came first): that is the replica's start, not an install's request.
    let manifest_watch = install.of(|v, r| watching(v, r) && r == "modulemanager.io/manifests");
    let watches = install.of(watching) - manifest_watch;
    let counted = install.total() - events - identity - watches - manifest_watch;
    eprintln!(
        "BUDGET install: {MANIFESTS} Manifests of {OBJECTS} objects: {:.1} requests per install in \
         all; {:.1} without the Events ({:.1}), the replica's one read of the cluster's \
         identity ({identity} in all), the start of the watches of the objects' kinds \
         ({watches} in all) and of the Manifests' ({manifest_watch}), budget {}; {:.2} passes \
         per Manifest, budget 1.2",
        per(install.total(), MANIFESTS),
        per(counted, MANIFESTS),
        per(events, MANIFESTS),
        OBJECTS + 3,
        per(install.passes, MANIFESTS),
    );
    eprintln!("BUDGET install requests: {}", install.line());
    let drift_per_pass = per(drift.total(), drift.passes);
    eprintln!(
        "BUDGET drift: {} passes, {drift_per_pass:.1} requests per pass, budget {}",
        drift.passes,
        OBJECTS + 1
    );
    eprintln!("BUDGET drift requests: {}", drift.line());

    assert!(counted <= MANIFESTS * (OBJECTS + 3), "requests per install");
    assert!(events <= MANIFESTS, "one Event per install at most");
    assert!(
        identity <= 1,
        "the cluster's identity is read once per replica"
    );
    assert!(watches <= 2 * OBJECTS, "a list and a watch per kind, once");
    assert!(manifest_watch <= 1, "the Manifests' watch opens once");
    assert!(install.passes * 10 <= MANIFESTS * 12, "passes per Manifest");
    assert_eq!(drift.passes, MANIFESTS, "one pass per request");
    let drift_budget = MANIFESTS * (OBJECTS + 1);
    assert!(drift.total() <= drift_budget, "requests per drift pass");
}

/// A pass starts from the watch cache when the cache holds this replica's last write of the
/// Manifest (`reconcile/written.rs`), and reads the Manifest when it does not: here, after a
/// later write is noted for each (another resourceVersion, another status), each pass GETs.
#[tokio::test(flavor = "multi_thread")]
async fn a_pass_reads_the_manifest_when_the_cache_does_not_hold_the_last_write() {
    let op = Counted::start().await;
    let ready = |m: &Manifest| m.status.as_ref().and_then(|s| s.state) == Some(State::Ready);
    op.spent(create_all, ready).await;
    let reads = |spent: &Spent| spent.of(|v, r| v == "get" && r == "modulemanager.io/manifests");

    let current = op.spent(request_all, handled("t1")).await;
    assert_eq!(current.passes, MANIFESTS, "{}", current.line());
    assert_eq!(
        reads(&current),
        0,
        "the cache held every write: {}",
        current.line()
    );

    for i in 0..MANIFESTS {
        let mut later = op.manifests.get(&format!("m-{i}")).await.unwrap();
        later.metadata.resource_version = Some(u64::MAX.to_string());
        later.status.get_or_insert_default().chart_digest = Some("sha256:not-seen-yet".into());
        op.ctx.written.wrote(&later, 0);
    }
    let lagging = op.spent(
        async |op: &Counted| request_all_at(op, "t2").await,
        handled("t2"),
    );
    let lagging = lagging.await;
    assert_eq!(lagging.passes, MANIFESTS, "{}", lagging.line());
    assert_eq!(
        reads(&lagging),
        MANIFESTS,
        "one read a pass: {}",
        lagging.line()
    );
}

/// While a Deployment rolls out, the passes that look at it again read it and apply nothing
/// (the ConfigMap beside it, ready once applied, is not even read); once it has rolled out, the
/// Manifest is Ready, and its one Event says so.
#[tokio::test(flavor = "multi_thread")]
async fn a_rollout_is_looked_at_by_reading_the_workload_not_by_applying_again() {
    let op = Counted::start().await;
    objects::create_json(
        &op.manifests,
        json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": "roll", "namespace": op.ns},
            "spec": {"module": "roll", "interval": "1h", "values": {"replicas": 1},
                     "chart": {"path": "tests/fixtures/charts/scaled"}},
        }),
    )
    .await;
    // No Deployment controller runs: the Deployment waits until the test plays it.
    let limit = Duration::from_secs(60);
    common::wait_state(&op.manifests, "roll", State::Processing, limit).await;
    let before = op.snapshot();
    while op.snapshot().passes < before.passes + 3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rechecks = between(&before, &op.snapshot());
    eprintln!(
        "BUDGET rollout: {} passes while it rolls out: {}",
        rechecks.passes,
        rechecks.line()
    );
    let admin = op.manifests.clone().into_client();
    common::deployment_rolled_out(&admin, &op.ns, "roll", 1).await;
    common::wait_state(&op.manifests, "roll", State::Ready, limit).await;

    assert_eq!(rechecks.of(|verb, _| verb == "apply"), 0, "nothing applied");
    assert_eq!(
        rechecks.of(|_, r| r == "configmaps"),
        0,
        "the ConfigMap not read"
    );
    let reads = rechecks.of(|verb, r| (verb, r) == ("get", "apps/deployments"));
    assert!(
        reads <= rechecks.passes + 1,
        "one read of the Deployment per pass"
    );
    // One Event for the install, when it ends: none when the rollout wait began.
    let ready_published =
        |events: &[(String, String, String)]| events.iter().any(|(_, reason, _)| reason == "Ready");
    let events = common::events_once(&admin, &op.ns, "roll", ready_published).await;
    let reasons: Vec<&str> = events.iter().map(|(_, r, _)| r.as_str()).collect();
    assert_eq!(reasons, ["Ready"], "{events:?}");
}

/// Passes the test runs itself, outside a fleet (this process owns every shard), over
/// Manifests of `tests/fixtures/charts/scaled` (a Deployment of 1 replica and a ConfigMap).
struct Passes {
    parts: Parts,
    manifests: Api<Manifest>,
    fence: module_manager::shard::fence::Fence,
}

impl Passes {
    async fn new() -> Self {
        let parts = Parts::new(None).await;
        let manifests = Api::namespaced(parts.admin.clone(), &parts.ns);
        let fence = module_manager::shard::fence::Ownership::everything()
            .dispatch(0)
            .expect("owns every shard");
        Self {
            parts,
            manifests,
            fence,
        }
    }

    async fn create(&self, name: &str) {
        let manifest: Manifest = serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": name, "namespace": self.parts.ns},
            "spec": {"module": name, "interval": "1h", "values": {"replicas": 1},
                     "chart": {"path": "tests/fixtures/charts/scaled"}},
        }))
        .unwrap();
        let post = PostParams::default();
        self.manifests.create(&post, &manifest).await.unwrap();
    }

    /// One pass over the Manifest as stored; its status after.
    async fn pass(&self, name: &str) -> module_manager::api::ManifestStatus {
        let manifest = Arc::new(self.manifests.get(name).await.unwrap());
        module_manager::reconcile::reconcile(manifest, &self.parts.ctx, &self.fence).await;
        let after = self.manifests.get(name).await.unwrap();
        after.status.unwrap_or_default()
    }

    /// Plays the Deployment `name`'s rollout as soon as it exists (no Deployment controller
    /// runs in these tests): while the pass that applied it waits.
    fn roll_out_once_applied(&self, name: &str) -> tokio::task::JoinHandle<()> {
        let (admin, ns, name) = (
            self.parts.admin.clone(),
            self.parts.ns.clone(),
            name.to_owned(),
        );
        tokio::spawn(async move {
            use k8s_openapi::api::apps::v1::Deployment;
            let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
            while deployments.get_opt(&name).await.unwrap().is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            common::deployment_rolled_out(&admin, &ns, &name, 1).await;
        })
    }
}

/// The rollout wait inside the pass (docs/reconcile.md): a pass that applied a Deployment looks
/// at it again a few times, for at most `plan::readiness::SETTLE_WAIT`, before it writes its
/// status. An install whose workload rolls out meanwhile writes the Manifest's status twice —
/// the inventory before the applies, then `Ready` — not three times, in one pass; one that does
/// not writes `Processing` after at most three looks (the wait's bound: three GETs of the
/// Deployment) and `Ready` from the pass that finds it rolled out. One Event (`Ready`) either
/// way.
#[tokio::test(flavor = "multi_thread")]
async fn a_workload_ready_within_the_pass_costs_one_status_write() {
    let passes = Passes::new().await;
    let (parts, manifests) = (&passes.parts, &passes.manifests);
    for (name, quick) in [("quick", true), ("slow", false)] {
        passes.create(name).await;
        let before = parts.snapshot();
        let rollout = quick.then(|| passes.roll_out_once_applied(name));
        let first = passes.pass(name).await;
        let spent = between(&before, &parts.snapshot());
        eprintln!(
            "BUDGET rollout status, first pass ({name}): {}",
            spent.line()
        );
        let status_writes = |spent: &Spent| {
            spent.of(|v, r| (v, r) == ("patch", "modulemanager.io/manifests/status"))
        };
        let looks = spent.of(|v, r| (v, r) == ("get", "apps/deployments"));
        assert_eq!(first.inventory.len(), 2, "{name}: {first:?}");
        assert_eq!(
            spent.of(|verb, _| verb == "apply"),
            2,
            "{name}: {}",
            spent.line()
        );
        if let Some(rollout) = rollout {
            rollout.await.unwrap();
            assert_eq!(first.state, Some(State::Ready), "{name}: {first:?}");
            assert_eq!(status_writes(&spent), 2, "{name}: {}", spent.line());
            assert!((1..=3).contains(&looks), "{name}: {}", spent.line());
        } else {
            assert_eq!(first.state, Some(State::Processing), "{name}: {first:?}");
            assert!(first.readiness_started.is_some(), "{name}: {first:?}");
            // Three looks at most (0.25, 0.75, 1.75 s); fewer when the GETs are slow (a
            // loaded machine): a look is never started that would end past the 2 s bound.
            assert!(
                (1..=3).contains(&looks),
                "{name}: the wait's bound: {}",
                spent.line()
            );
            common::deployment_rolled_out(&parts.admin, &parts.ns, name, 1).await;
            let second = passes.pass(name).await;
            assert_eq!(second.state, Some(State::Ready), "{name}: {second:?}");
            let spent = between(&before, &parts.snapshot());
            assert_eq!(status_writes(&spent), 3, "{name}: {}", spent.line());
        }
        let done = manifests
            .get(name)
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        assert_eq!(done.inventory_uids.len(), 2, "{name}: every UID: {done:?}");
        let operation = done.last_operation.as_ref().map(|o| o.operation.as_str());
        assert_eq!(operation, Some("Install"), "{name}: {done:?}");
        let ready_published = |events: &[(String, String, String)]| {
            events.iter().any(|(_, reason, _)| reason == "Ready")
        };
        let events = common::events_once(&parts.admin, &parts.ns, name, ready_published).await;
        let reasons: Vec<&str> = events.iter().map(|(_, r, _)| r.as_str()).collect();
        assert_eq!(reasons, ["Ready"], "{name}: {events:?}");
    }
}

/// While a workload rolls out, the wait's start is the first pass's, also when someone writes
/// the Manifest between passes (`spec.timeout` counts from the first apply of the render).
#[tokio::test(flavor = "multi_thread")]
async fn the_rollout_waits_start_is_kept_across_passes() {
    let passes = Passes::new().await;
    passes.create("again").await;
    let first = passes.pass("again").await;
    assert_eq!(first.state, Some(State::Processing), "{first:?}");
    let started = first.readiness_started.clone();
    assert!(started.is_some(), "the wait's start is recorded: {first:?}");
    common::annotate(&passes.manifests, "again", "example.com/touched", "yes").await;
    let second = passes.pass("again").await;
    assert_eq!(second.state, Some(State::Processing), "{second:?}");
    assert_eq!(second.readiness_started, started, "kept: {second:?}");
    common::deployment_rolled_out(&passes.parts.admin, &passes.parts.ns, "again", 1).await;
    let done = passes.pass("again").await;
    assert_eq!(done.state, Some(State::Ready), "{done:?}");
}

/// The watches' own requests: a list and a watch per kind when a replica first applies it,
/// and again when a watch is renewed (the API server ends each after some minutes).
fn watching(verb: &str, _resource: &str) -> bool {
    verb == "list" || verb == "watch"
}

/// Drift passes on a timer over Ready Manifests whose objects nobody touched send no request:
/// the watches of the objects' kinds vouch that each is as the last apply left it
/// (docs/reconcile.md, "Cheap drift passes"). An object edited or deleted by someone else is
/// still repaired by the next pass, which applies what changed and nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn idle_drift_passes_apply_nothing_yet_repair_what_others_changed() {
    use k8s_openapi::api::core::v1::{ConfigMap, Service};
    use kube::api::{Patch, PatchParams};
    let op = Counted::start().await;
    let ready = |m: &Manifest| m.status.as_ref().and_then(|s| s.state) == Some(State::Ready);
    op.spent(async |op: &Counted| create_all_every(op, "2s").await, ready)
        .await;
    // Each object once found unchanged: every kind's watch has listed.
    let unchanged = || op.ctx.metrics.unchanged.get();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while unchanged() < MANIFESTS * OBJECTS {
        assert!(
            std::time::Instant::now() < deadline,
            "no pass skipped its objects"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let before = op.snapshot();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let idle = between(&before, &op.snapshot());
    eprintln!(
        "BUDGET idle: {} passes, {} requests: {}",
        idle.passes,
        idle.total(),
        idle.line()
    );
    assert!(
        idle.passes >= MANIFESTS * 2,
        "the passes ran on their timer"
    );
    assert_eq!(idle.total(), 0, "an idle drift pass sends nothing");

    // Someone edits one ConfigMap and deletes one Service.
    let configmaps: Api<ConfigMap> = Api::namespaced(op.admin.clone(), &op.ns);
    let services: Api<Service> = Api::namespaced(op.admin.clone(), &op.ns);
    let edit = json!({"data": {"n": "edited"}});
    let params = PatchParams::default();
    let before = op.snapshot();
    configmaps
        .patch("m-0", &params, &Patch::Merge(&edit))
        .await
        .unwrap();
    objects::delete(&services, "m-1").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let data = configmaps
            .get("m-0")
            .await
            .unwrap()
            .data
            .unwrap_or_default();
        let restored = data.get("n").map(String::as_str) == Some("0");
        if restored && objects::exists(&services, "m-1").await {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the drift was not repaired"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let repair = between(&before, &op.snapshot());
    eprintln!("BUDGET repair: {} passes: {}", repair.passes, repair.line());
    let applies = |resource: &'static str| repair.of(move |v, r| v == "apply" && r == resource);
    assert!(applies("configmaps") >= 1 && applies("services") >= 1);
    assert_eq!(applies("serviceaccounts"), 0, "nobody touched those");
}

/// In a fleet, each replica's object watches select only the objects of its own shards (each
/// stamped with its Manifest's shard), and follow the owned shards as they change: a replica
/// receives the events of its share of the objects, not of all. After a change, passes skip
/// the objects of owned shards again once the watch has listed them; an object of a shard no
/// longer owned is no longer vouched for, so a pass applies it again.
#[tokio::test(flavor = "multi_thread")]
async fn object_watches_select_the_owned_shards_and_follow_them() {
    use std::collections::BTreeSet;
    let shards = ShardCount::DEFAULT;
    let owning = owned_objects;
    let (select, selected) = tokio::sync::watch::channel(owning(None));
    let selection = Selection {
        shard_of: Box::new(move |uid| shards.shard_of(uid)),
        selected,
    };
    let op = Counted::start_with(Some(selection)).await;
    let ready = |m: &Manifest| m.status.as_ref().and_then(|s| s.state) == Some(State::Ready);
    op.spent(async |op: &Counted| create_all_every(op, "2s").await, ready)
        .await;
    let (unchanged, applied) = (
        || op.ctx.metrics.unchanged.get(),
        || op.ctx.metrics.applied.get(),
    );
    let skipped_again = async |from: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while unchanged() < from + MANIFESTS * OBJECTS {
            assert!(
                std::time::Instant::now() < deadline,
                "no pass skipped its objects"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    skipped_again(0).await;

    let owned_here = stamped_shards(&op).await;

    let other = (0..shards.get()).find(|s| !owned_here.contains(s)).unwrap();
    let lists = || {
        op.snapshot()
            .requests
            .get(&("list".into(), "configmaps".into()))
            .copied()
    };

    // Their shards and one more owned: the watches list again with the new selector, and
    // passes skip the objects again once they have (with no further change needed).
    let listed = lists();
    let mut owned = owned_here.clone();
    owned.insert(other);
    select.send_replace(owning(Some(owned)));
    skipped_again(unchanged()).await;
    assert!(lists() > listed, "a new selector lists again");

    // Only the other shard owned: none of their objects is vouched for, each is applied again.
    let only_other = BTreeSet::from([other]);
    select.send_replace(owning(Some(only_other.clone())));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (skips, applies) = (unchanged(), applied());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(unchanged(), skips, "objects nobody watches were skipped");
    assert!(
        applied() >= applies + MANIFESTS * OBJECTS,
        "each object applied again ({} applies)",
        applied() - applies
    );

    only_owned_shards_bring_events(&op, &only_other, other).await;
}

/// The shards of the Manifests' objects, checking that each ConfigMap carries its Manifest's.
async fn stamped_shards(op: &Counted) -> std::collections::BTreeSet<u32> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ListParams;
    let shards = ShardCount::DEFAULT;
    let configmaps: Api<ConfigMap> = Api::namespaced(op.admin.clone(), &op.ns);
    let mut stamped = std::collections::BTreeSet::new();
    let labelled = ListParams::default().labels(MANIFEST_UID_LABEL);
    for object in configmaps.list(&labelled).await.unwrap() {
        let labels = object.metadata.labels.unwrap_or_default();
        let shard = shards.shard_of(&labels[MANIFEST_UID_LABEL]);
        assert_eq!(labels[MANIFEST_SHARD_LABEL], shard.to_string());
        stamped.insert(shard);
    }
    assert!(!stamped.is_empty());
    stamped
}

/// The API server sends only the selected shards' objects: a labelled object of a shard not
/// `owned` brings no event, one of `inside` (owned) does.
async fn only_owned_shards_bring_events(
    op: &Counted,
    owned: &std::collections::BTreeSet<u32>,
    inside: u32,
) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let configmaps: Api<ConfigMap> = Api::namespaced(op.admin.clone(), &op.ns);
    let followed = op.ctx.cluster.followed().unwrap();
    let stray = |name: &str, shard: u32| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                MANIFEST_UID_LABEL: "someone-else", MANIFEST_SHARD_LABEL: shard.to_string()}}
        }))
        .unwrap()
    };
    let outside = (0..ShardCount::DEFAULT.get())
        .find(|s| !owned.contains(s))
        .unwrap();
    let events = followed.events();
    let post = PostParams::default();
    configmaps
        .create(&post, &stray("outside", outside))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(followed.events(), events, "an event of a shard not owned");
    configmaps
        .create(&post, &stray("inside", inside))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while followed.events() == events {
        assert!(
            std::time::Instant::now() < deadline,
            "no event of an owned shard"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
