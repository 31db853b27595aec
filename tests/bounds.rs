//! Bounded input on a real kube-apiserver (issue 15 items 5, 7 and 9): a `valuesFrom` alias bomb
//! and one nested too deep are refused naming their source, a render over the object cap is refused with nothing applied,
//! a pass past its deadline ends and frees its worker, and the admin API's Manifest details need
//! a token whose user may `get` that Manifest (TokenReview + SubjectAccessReview); junk tokens
//! cost a bounded number of TokenReviews (issue 31 item 4).
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use common::Harness;
use std::time::Duration;

use common::condition;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};
use module_manager::plan::PlanLimits;
use module_manager::reconcile::PassLimits;
use serde_json::{Value, json};
use test_support::objects;

async fn start(prefix: &str, limits: PassLimits, concurrency: usize) -> Harness {
    Harness(common::operator_with(prefix, concurrency, |context| context.pass_limits(limits)).await)
}

impl Harness {
    async fn create(&self, name: &str, spec: Value) {
        let mut spec = spec;
        spec["module"] = json!(name);
        spec["interval"] = json!("2s");
        self.0.create(&common::manifest(&self.ns, name, spec)).await;
    }

    /// Waits (2 minutes) until the Manifest's current generation is `Error` with a Ready
    /// condition whose message contains `needle`; answers the condition's (reason, message) and
    /// the `Stalled` condition's status.
    async fn wait_error(&self, name: &str, needle: &str) -> (String, String, String) {
        let what = format!("Error with {needle:?}");
        let manifest = common::wait_for(
            &self.manifests,
            name,
            &what,
            Duration::from_secs(120),
            |m| {
                let status = m.status.clone().unwrap_or_default();
                status.state == Some(State::Error)
                    && status.observed_generation == m.metadata.generation
                    && condition(m, "Ready").is_some_and(|(_, _, message)| message.contains(needle))
            },
        )
        .await;
        let (_, reason, message) = condition(&manifest, "Ready").unwrap();
        let stalled = condition(&manifest, "Stalled")
            .map(|c| c.0)
            .unwrap_or_default();
        (reason, message, stalled)
    }

    /// [`Self::wait_error`], asserting the condition's `reason` and the `Stalled` status
    /// (`"True"`: a permanent error); answers the message.
    async fn expect_error(&self, name: &str, needle: &str, reason: &str, stalled: &str) -> String {
        let (found, message, found_stalled) = self.wait_error(name, needle).await;
        assert_eq!(found, reason, "{message}");
        assert_eq!(found_stalled, stalled, "Stalled: {message}");
        message
    }

    /// Creates a ConfigMap `name` whose `values.yaml` is `yaml`, for `valuesFrom`.
    async fn put_values(&self, name: &str, yaml: String) {
        objects::create_json(
            &self.config_maps(),
            json!({
                "metadata": {"name": name},
                "data": {"values.yaml": yaml},
            }),
        )
        .await;
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}

/// This process's resident memory (VmRSS), in KiB: reported, never asserted.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The review's ConfigMap: about 270 KB whose aliases expand to 256 MiB (one 64 KiB anchor
/// used 4000 times). It once took a replica from 93 to 850 MiB and went to helm; now the pass
/// fails before decoding it, with a permanent error naming the source, and nothing is applied.
#[tokio::test]
async fn a_values_alias_bomb_is_refused_naming_its_source() {
    let h = start("alias-bomb", PassLimits::default(), 2).await;
    let mut bomb = format!("big: &a \"{}\"\nlist:\n", "v".repeat(64 << 10));
    bomb.push_str(&"- *a\n".repeat(4000));
    assert!(bomb.len() < 300 << 10, "{} bytes", bomb.len());
    h.put_values("plain", "greeting: hello\n".to_owned()).await;
    h.put_values("bomb", bomb).await;
    let before = rss_kib();
    h.create(
        "catalog",
        json!({
            "chart": {"path": "examples/charts/catalog-v1"},
            "valuesFrom": [
                {"kind": "ConfigMap", "name": "plain", "key": "values.yaml"},
                {"kind": "ConfigMap", "name": "bomb", "key": "values.yaml"},
            ],
        }),
    )
    .await;
    let refused =
        "valuesFrom[1] ConfigMap bomb key values.yaml: YAML anchors and aliases are not allowed";
    let message = h
        .expect_error("catalog", refused, "ValuesError", "True")
        .await;
    assert!(
        !message.contains("vvvv"),
        "the content is not quoted: {message}"
    );
    eprintln!(
        "RSS of the test process (operator in-process): {before} KiB before, {} KiB after the refused pass",
        rss_kib()
    );
    assert!(
        !objects::exists(&h.config_maps(), "catalog-settings").await,
        "nothing is applied"
    );
}

/// A `valuesFrom` ConfigMap of 900 000 open brackets: libyaml would spend time quadratic in
/// their depth decoding it (hours, on the worker's thread, out of reach of the pass deadline);
/// it is refused before decoding, naming its source, and the only worker goes on to serve the
/// next Manifest.
#[tokio::test]
async fn a_deeply_nested_values_source_is_refused_and_the_worker_serves_the_next_manifest() {
    let h = start("deep-values", PassLimits::default(), 1).await;
    h.put_values("deep", format!("a: {}", "[".repeat(900_000)))
        .await;
    h.create(
        "deep",
        json!({
            "chart": {"path": "examples/charts/catalog-v1"},
            "valuesFrom": [{"kind": "ConfigMap", "name": "deep", "key": "values.yaml"}],
        }),
    )
    .await;
    h.create(
        "next",
        json!({"chart": {"path": "examples/charts/catalog-v1"}, "values": {"greeting": "hi"}}),
    )
    .await;
    let refused = "valuesFrom[0] ConfigMap deep key values.yaml: YAML nested deeper than 128 levels is not allowed";
    h.expect_error("deep", refused, "ValuesError", "True").await;
    common::wait_for(
        &h.manifests,
        "next",
        "Ready",
        Duration::from_secs(120),
        |m| m.status.as_ref().and_then(|s| s.state) == Some(State::Ready),
    )
    .await;
}

/// A render with more objects than `--max-objects-per-render`: a permanent error before
/// anything is recorded or applied.
#[tokio::test]
async fn a_render_over_the_object_cap_is_refused_and_nothing_is_applied() {
    let limits = PassLimits {
        plan: PlanLimits {
            max_objects: 1,
            ..PlanLimits::default()
        },
        ..PassLimits::default()
    };
    let h = start("object-cap", limits, 2).await;
    h.create(
        "catalog",
        json!({"chart": {"path": "examples/charts/catalog-v1"}}),
    )
    .await;
    let message = h
        .expect_error(
            "catalog",
            "more than the limit of 1 per render",
            "PlanError",
            "True",
        )
        .await;
    assert!(message.contains("the render has 2 objects"), "{message}");
    let manifest = h.manifests.get("catalog").await.unwrap();
    assert!(
        manifest.status.unwrap_or_default().inventory.is_empty(),
        "nothing recorded"
    );
    for name in ["catalog-settings", "catalog-legacy-settings"] {
        assert!(
            !objects::exists(&h.config_maps(), name).await,
            "{name} is not applied"
        );
    }
}

/// A pass stuck on a target that accepts connections and never answers (its connect timeout is
/// 10 s) ends at the 2 s pass deadline with a transient error — and its worker, the only one,
/// is free: another Manifest becomes Ready meanwhile.
#[tokio::test]
async fn a_pass_past_its_deadline_ends_and_frees_its_worker() {
    let limits = PassLimits {
        deadline: Duration::from_secs(2),
        ..PassLimits::default()
    };
    let h = start("pass-deadline", limits, 1).await;
    let silent_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("https://{}", silent_listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent_listener.accept() {
            held.push(stream);
        }
    });
    let kubeconfig = serde_yaml_ng::to_string(&json!({
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "silent",
        "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "u"}}],
        "clusters": [{"name": "silent", "cluster": {"server": silent}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    }))
    .unwrap();
    let secret = json!({"metadata": {"name": "silent"}, "stringData": {"kubeconfig": kubeconfig}});
    objects::create_json(&Api::<Secret>::namespaced(h.client.clone(), &h.ns), secret).await;
    h.create(
        "stuck",
        json!({
            "chart": {"path": "examples/charts/catalog-v1"},
            "target": {"kubeconfigSecretRef": {"name": "silent"}},
        }),
    )
    .await;
    let deadline = "did not finish within 2 s (--pass-deadline-seconds)";
    h.expect_error("stuck", deadline, "PassDeadline", "False")
        .await;
    // One worker, and the stuck Manifest retried: the other one still gets it.
    h.create(
        "catalog",
        json!({"chart": {"path": "examples/charts/catalog-v1"}}),
    )
    .await;
    common::wait_state(
        &h.manifests,
        "catalog",
        State::Ready,
        Duration::from_secs(120),
    )
    .await;
}

/// A token of the account `reader`, which may `get` the Manifests of `ns`.
async fn reader(client: &Client, ns: &str) -> String {
    let rules =
        json!([{"apiGroups": ["modulemanager.io"], "resources": ["manifests"], "verbs": ["get"]}]);
    common::admin_token(client, ns, "reader", common::Grant::Role(rules)).await
}

/// The Manifest `web` in `ns`.
async fn create_web(client: &Client, ns: &str) {
    objects::create_json(
        &Api::<Manifest>::namespaced(client.clone(), ns),
        json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"module": "web", "chart": {"path": "examples/charts/web"}},
        }),
    )
    .await;
}

/// `GET /v1/manifests/{ns}/{name}` on the admin server with a real API server behind it: no
/// token is refused (401), a token whose user may not `get` the Manifest is refused (403, the
/// same for a Manifest that does not exist: nothing is revealed), one that may is answered; a
/// Manifest of another namespace is refused to it.
#[tokio::test]
async fn manifest_details_need_a_token_that_may_get_the_manifest() {
    use axum::http::Method;
    use module_manager::admin::ManifestAnswer;
    use module_manager::cli::fetch;
    let plane = common::control_plane().await;
    let client = plane.client().await.unwrap();
    let ns = plane.namespace(&client, "admin-read").await.unwrap();
    let other = plane.namespace(&client, "admin-read-other").await.unwrap();
    for namespace in [&ns, &other] {
        create_web(&client, namespace).await;
    }
    let url = common::admin_server(&client, Default::default()).await;

    let path = format!("/v1/manifests/{ns}/web");
    let get = async |path: &str, token: Option<&str>| {
        fetch::<ManifestAnswer>(&url, Method::GET, path, token)
            .await
            .map_err(|e| format!("{e:#}"))
    };
    let anonymous = get(&path, None).await.unwrap_err();
    assert!(anonymous.contains("401"), "{anonymous}");
    let nobody = common::admin_token(&client, &ns, "nobody", common::Grant::Nothing).await;
    let refused = get(&path, Some(&nobody)).await.unwrap_err();
    assert!(
        refused.contains("403") && refused.contains("may not get manifests.modulemanager.io"),
        "{refused}"
    );
    let absent = get(&format!("/v1/manifests/{ns}/absent"), Some(&nobody))
        .await
        .unwrap_err();
    assert!(absent.contains("403"), "not 404: {absent}");
    let reader = reader(&client, &ns).await;
    let answer = get(&path, Some(&reader)).await.unwrap();
    assert_eq!(
        (answer.namespace.as_str(), answer.name.as_str()),
        (ns.as_str(), "web")
    );
    let uid = Api::<Manifest>::namespaced(client.clone(), &ns)
        .get("web")
        .await
        .unwrap()
        .uid();
    assert_eq!(answer.uid, uid);
    let elsewhere = get(&format!("/v1/manifests/{other}/web"), Some(&reader))
        .await
        .unwrap_err();
    assert!(elsewhere.contains("403"), "{elsewhere}");
    // Something that is no token at all.
    let unknown = get(&path, Some("not-a-token")).await.unwrap_err();
    assert!(unknown.contains("401"), "{unknown}");
}

/// Junk tokens cannot make the operator send unbounded TokenReviews (issue 31 item 4), on a real
/// API server, the reviews counted by the operator's own request metrics: twenty requests with
/// one junk token send one TokenReview; distinct junk tokens from one source send reviews until
/// its bucket is empty, then get `429` with `Retry-After` and send none; an authenticated
/// token's review is reused (its SubjectAccessReview is not), and its requests cost the bucket
/// nothing. Before, every request sent a TokenReview (21 for the first twenty-one requests).
#[tokio::test]
async fn junk_tokens_cost_one_token_review_each_and_failures_are_rate_limited() {
    use module_manager::admin::{ReviewLimits, Reviews};
    use module_manager::telemetry::requests::{self, ApiRequestMetrics, RequestTarget};
    let plane = common::control_plane().await;
    let admin = plane.client().await.unwrap();
    let ns = plane.namespace(&admin, "admin-reviews").await.unwrap();
    create_web(&admin, &ns).await;
    let reader = reader(&admin, &ns).await;
    let config = plane.config().await.unwrap();
    let metrics = ApiRequestMetrics::default();
    let client = requests::client(config, &metrics, RequestTarget::Local).unwrap();
    let reviews = || metrics.count("create", "authentication.k8s.io/tokenreviews");
    let access_reviews = || metrics.count("create", "authorization.k8s.io/subjectaccessreviews");
    // No refill within the test: the counts do not depend on how fast it runs.
    let limits = ReviewLimits {
        source_burst: 5.0,
        source_per_second: 1e-6,
        ..ReviewLimits::default()
    };
    let url = common::admin_server(&client, Reviews::new(limits)).await;
    module_manager::source::ensure_crypto_provider();
    let http = reqwest::Client::new();
    let get = async |token: &str| {
        let answer = http
            .get(format!("{url}/v1/manifests/{ns}/web"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let retry_after = answer
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        (answer.status().as_u16(), retry_after)
    };

    assert_eq!(get(&reader).await, (200, None));
    assert_eq!((reviews(), access_reviews()), (1, 1));
    for n in 0..20 {
        assert_eq!(get("junk-token-1").await, (401, None), "request {n}");
    }
    assert_eq!(
        reviews(),
        2,
        "twenty requests with one junk token: one TokenReview"
    );
    // Four more junk tokens empty the bucket of five; the next is refused unreviewed.
    for n in 2..6 {
        assert_eq!(get(&format!("junk-token-{n}")).await, (401, None));
    }
    assert_eq!(reviews(), 6);
    for n in 6..16 {
        let (status, retry_after) = get(&format!("junk-token-{n}")).await;
        assert_eq!(status, 429, "junk token {n}");
        let seconds: u64 = retry_after.expect("Retry-After").parse().unwrap();
        assert!(seconds >= 1, "{seconds}");
    }
    assert_eq!(reviews(), 6, "refused callers sent no TokenReview");
    // The junk token already refused is answered from memory, the reader's from its review.
    assert_eq!(get("junk-token-1").await, (401, None));
    assert_eq!(get(&reader).await, (200, None));
    assert_eq!((reviews(), access_reviews()), (6, 2));
}
