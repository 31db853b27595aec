//! The admin API's endpoints: health, metrics, the fleet's views, one Manifest, the drain switch.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kube::api::Api;

use super::answers::{
    DrainAnswer, ManifestAnswer, ManifestSource, QueueAnswer, ShardsAnswer, manifest_answer,
    queue_answer, shards_answer,
};
use super::auth::{Access, authorize};
use super::errors::{ApiError, error};
use super::names::{is_dns_label, is_dns_subdomain};
use super::server::Source;
use super::state::{AdminState, DRAIN_PATH};
use super::upstream::{Pool, api_call, api_permit};
use crate::api::Manifest;
use crate::shard::fleet::ShardView;
use crate::shard::membership::Members;
use crate::telemetry::metrics::Format;

/// Ready once the Manifest watch has synced: before that, this replica does not know its work.
pub(super) async fn readyz(State(state): State<AdminState>) -> Response {
    if state.synced.load(Ordering::Relaxed) {
        "ok".into_response()
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the Manifest watch has not synced yet",
        )
        .into_response()
    }
}

/// The metrics: OpenMetrics to clients that accept it (Prometheus asks for it first), the
/// classic text format 0.0.4 to the others (`curl`, `promtool check metrics`).
pub(super) async fn metrics(
    State(state): State<AdminState>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let format = Format::negotiate(
        headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    let body = crate::telemetry::metrics::encode(&state.registry, format).map_err(|e| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encode metrics: {e}"),
        )
    })?;
    Ok(([(header::CONTENT_TYPE, format.content_type())], body).into_response())
}

/// Every member with a membership Lease, live or not, as this replica sees it; without the
/// targets' budget use the members publish (it names Secrets across namespaces: only the
/// authorized `GET /v1/targets` shows it).
pub(super) async fn members(State(state): State<AdminState>) -> Json<Members> {
    let mut members = state.members.borrow().clone();
    for member in &mut members.members {
        if let Some(load) = &mut member.load {
            load.targets.clear();
        }
    }
    Json(members)
}

/// The fleet-wide shard view.
pub(super) async fn shards(State(state): State<AdminState>) -> Json<ShardsAnswer> {
    Json(shards_answer(&state.fleet.borrow()))
}

/// One shard.
pub(super) async fn shard(
    State(state): State<AdminState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ShardView>, ApiError> {
    let Path(text) = path.map_err(|e| error(StatusCode::BAD_REQUEST, e.body_text()))?;
    let k: u32 = text.parse().map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            format!("shard {text:?} is not a number"),
        )
    })?;
    let view = state.fleet.borrow();
    if view.shard_count == 0 {
        return Err(error(
            StatusCode::NOT_FOUND,
            "no shard round has completed on this replica yet",
        ));
    }
    if k >= view.shard_count {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!(
                "shard {k} does not exist: the fleet has {} shards",
                view.shard_count
            ),
        ));
    }
    view.shards
        .iter()
        .find(|s| s.shard == k)
        .cloned()
        .map(Json)
        .ok_or_else(|| {
            error(
                StatusCode::NOT_FOUND,
                format!("shard {k} is not in this replica's view yet"),
            )
        })
}

/// This replica's queue and the members' published loads.
pub(super) async fn queue(State(state): State<AdminState>) -> Result<Json<QueueAnswer>, ApiError> {
    let work = state.work.as_ref().ok_or_else(|| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this replica runs no controller: it has no queue",
        )
    })?;
    let snapshot = work.queue().snapshot();
    let replica = state.fleet.borrow().replica.clone();
    Ok(Json(queue_answer(
        replica,
        snapshot,
        &state.members.borrow(),
    )))
}

/// One Manifest, to a caller whose token (audience `module-manager`) may `get` it: from this
/// replica's cache, else from the API server. Authorized before any lookup, so that a caller
/// without the right learns nothing, not even whether the Manifest exists.
pub(super) async fn manifest(
    State(state): State<AdminState>,
    Source(source): Source,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<ManifestAnswer>, ApiError> {
    let Path((namespace, name)) =
        path.map_err(|e| error(StatusCode::BAD_REQUEST, e.body_text()))?;
    if !is_dns_label(&namespace) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "the namespace must be a DNS label (lowercase letters, digits and '-', at most 63)",
        ));
    }
    if !is_dns_subdomain(&name) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "the name must be a DNS subdomain (lowercase letters, digits, '-' and '.', at most 253)",
        ));
    }
    let access = Access::GetManifest {
        namespace: &namespace,
        name: &name,
    };
    authorize(&state, source, &headers, access, Pool::Reads).await?;
    let cached = state.work.as_ref().and_then(|w| w.get(&namespace, &name));
    let (manifest, source) = match cached {
        Some(manifest) => (manifest, ManifestSource::Cache),
        None => {
            let client = state.client.clone().ok_or_else(|| {
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not in this replica's cache, and this replica has no API client to look it up",
                )
            })?;
            let _permit = api_permit(Pool::Reads)?;
            let found = api_call(
                "get Manifest",
                Api::<Manifest>::namespaced(client, &namespace).get_opt(&name),
            )
            .await?;
            let manifest = found.ok_or_else(|| {
                error(
                    StatusCode::NOT_FOUND,
                    format!("Manifest {namespace}/{name} not found"),
                )
            })?;
            (Arc::new(manifest), ManifestSource::Api)
        }
    };
    Ok(Json(manifest_answer(
        &manifest,
        source,
        &state.fleet.borrow(),
    )))
}

/// `POST /v1/drain`: hand every shard over and take none.
pub(super) async fn drain(
    State(state): State<AdminState>,
    source: Source,
    headers: HeaderMap,
) -> Result<Json<DrainAnswer>, ApiError> {
    set_drain(&state, source, &headers, "post", true).await
}

/// `DELETE /v1/drain`: take shards again.
pub(super) async fn undrain(
    State(state): State<AdminState>,
    source: Source,
    headers: HeaderMap,
) -> Result<Json<DrainAnswer>, ApiError> {
    set_drain(&state, source, &headers, "delete", false).await
}

async fn set_drain(
    state: &AdminState,
    Source(source): Source,
    headers: &HeaderMap,
    verb: &str,
    draining: bool,
) -> Result<Json<DrainAnswer>, ApiError> {
    let access = Access::Path {
        path: DRAIN_PATH,
        verb,
    };
    let user = authorize(state, source, headers, access, Pool::Drain).await?;
    let before = state.drain.send_replace(draining);
    tracing::info!(
        user = user.username.as_deref().unwrap_or_default(),
        draining,
        changed = before != draining,
        "drain switch set through the admin API"
    );
    Ok(Json(DrainAnswer { draining }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::testing::{fleet, state, with_fleet};
    use crate::admin::{ErrorAnswer, router};
    use crate::shard::fleet::FleetView;
    use crate::shard::membership::MemberView;
    use axum::Router;
    use axum::body::Body;
    use axum::http::{HeaderMap, Method, Request};
    use http_body_util::BodyExt;
    use serde_json::json;
    use tower::ServiceExt;

    async fn send(
        router: Router,
        method: Method,
        path: &str,
        authorization: Option<&str>,
    ) -> (StatusCode, HeaderMap, String) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        let response = router
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    }

    async fn get(router: Router, path: &str) -> (StatusCode, String, String) {
        let (status, headers, body) = send(router, Method::GET, path, None).await;
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (status, content_type, body)
    }

    /// Asserts a JSON error answer with `status` whose message contains `needle`.
    async fn expect_error(
        router: Router,
        method: Method,
        path: &str,
        status: StatusCode,
        needle: &str,
    ) {
        let (got, headers, body) = send(router, method.clone(), path, None).await;
        assert_eq!(got, status, "{method} {path}: {body}");
        assert_eq!(
            headers[header::CONTENT_TYPE],
            "application/json",
            "{method} {path}"
        );
        let answer: ErrorAnswer = serde_json::from_str(&body).unwrap();
        assert!(answer.error.contains(needle), "{method} {path}: {body}");
    }
    #[tokio::test]
    async fn members_are_listed_as_json() {
        let members = Members {
            members: vec![MemberView {
                name: "module-manager-0".into(),
                live: true,
                unchanged_for_seconds: 1.5,
                state: Default::default(),
                load: None,
            }],
            self_renewed: true,
            renewed_at: None,
        };
        let (status, content_type, body) = get(
            router(state(crate::telemetry::metrics::registry(), members)),
            "/v1/members",
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, "application/json");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
            json!({"members": [{"name": "module-manager-0", "live": true, "unchanged_for_seconds": 1.5, "state": "active"}], "self_renewed": true})
        );
    }

    /// `/v1/members` is not authenticated: the targets' budget use that members publish
    /// (Secret names across namespaces) is left out of it, the rest of the load kept.
    #[tokio::test]
    async fn members_never_show_the_targets_they_publish() {
        let load = crate::shard::membership::MemberLoad {
            queued: 3,
            targets: vec![crate::apply::budget::TargetUse {
                namespace: "tenant-a".into(),
                secret: "cluster-secret-name".into(),
                key: "kubeconfig".into(),
                requests: 40,
                waits: 1,
            }],
            ..Default::default()
        };
        let members = Members {
            members: vec![MemberView {
                name: "module-manager-0".into(),
                live: true,
                unchanged_for_seconds: 1.5,
                state: Default::default(),
                load: Some(load),
            }],
            self_renewed: true,
            renewed_at: None,
        };
        let app = router(state(crate::telemetry::metrics::registry(), members));
        let (status, _, body) = get(app, "/v1/members").await;
        assert_eq!(status, StatusCode::OK);
        assert!(!body.contains("cluster-secret-name"), "{body}");
        assert!(!body.contains("tenant-a"), "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["members"][0]["load"]["queued"], 3, "{body}");
    }

    #[tokio::test]
    async fn shards_answer_the_fleet_view_with_a_member_summary() {
        let (status, content_type, body) = get(router(with_fleet(fleet())), "/v1/shards").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, "application/json");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (&body["fleet"], &body["replica"], &body["shard_count"]),
            (&json!("mm"), &json!("mm-0"), &json!(4))
        );
        assert_eq!(
            (&body["desired_replicas"], &body["self_fenced"]),
            (&json!(2), &json!(false))
        );
        assert_eq!(
            body["shards"][0],
            json!({"shard": 0, "owner": "mm-0", "desired_owner": "mm-0", "state": "owned", "epoch": 3, "manifests": 7, "queued": 1, "scheduled": 6})
        );
        assert_eq!(body["shards"][2]["owner"], json!(null));
        assert_eq!(
            body["members"],
            json!([
                {"name": "gone", "live": false, "state": null, "shards": 1, "desired_shards": 0, "queued": null, "scheduled": null, "next_due": null, "in_flight": null, "manifests": null},
                {"name": "mm-0", "live": true, "state": "active", "shards": 1, "desired_shards": 4, "queued": 2, "scheduled": 7, "next_due": "2026-12-01T12:00:00Z", "in_flight": 1, "manifests": 10},
                {"name": "mm-1", "live": true, "state": "draining", "shards": 1, "desired_shards": 0, "queued": null, "scheduled": null, "next_due": null, "in_flight": null, "manifests": null},
            ])
        );
        // Before the first round: an empty view, not an error.
        let (status, _, body) = get(router(with_fleet(FleetView::default())), "/v1/shards").await;
        assert_eq!(status, StatusCode::OK);
        let empty: ShardsAnswer = serde_json::from_str(&body).unwrap();
        assert!(empty.shards.is_empty() && empty.members.is_empty());
    }

    #[tokio::test]
    async fn one_shard_by_number_or_a_json_error() {
        let router = router(with_fleet(FleetView {
            shards: fleet().shards[..3].to_vec(),
            ..fleet()
        }));
        let (status, _, body) = get(router.clone(), "/v1/shards/1").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            serde_json::from_str::<ShardView>(&body).unwrap(),
            fleet().shards[1]
        );
        for (path, status, needle) in [
            (
                "/v1/shards/4",
                StatusCode::NOT_FOUND,
                "the fleet has 4 shards",
            ),
            (
                "/v1/shards/4294967295",
                StatusCode::NOT_FOUND,
                "does not exist",
            ),
            (
                "/v1/shards/3",
                StatusCode::NOT_FOUND,
                "not in this replica's view yet",
            ),
            ("/v1/shards/x", StatusCode::BAD_REQUEST, "not a number"),
            ("/v1/shards/-1", StatusCode::BAD_REQUEST, "not a number"),
            (
                "/v1/shards/4294967296",
                StatusCode::BAD_REQUEST,
                "not a number",
            ),
            ("/v1/shards/%FF", StatusCode::BAD_REQUEST, ""),
            ("/v1/nothing", StatusCode::NOT_FOUND, "no such endpoint"),
        ] {
            expect_error(router.clone(), Method::GET, path, status, needle).await;
        }
        expect_error(
            router,
            Method::POST,
            "/v1/shards",
            StatusCode::METHOD_NOT_ALLOWED,
            "not allowed",
        )
        .await;
        // No shard exists before the first round.
        expect_error(
            crate::admin::router(with_fleet(FleetView::default())),
            Method::GET,
            "/v1/shards/0",
            StatusCode::NOT_FOUND,
            "no shard round has completed",
        )
        .await;
    }

    #[tokio::test]
    async fn the_queue_needs_a_controller() {
        expect_error(
            router(with_fleet(fleet())),
            Method::GET,
            "/v1/queue",
            StatusCode::SERVICE_UNAVAILABLE,
            "no controller",
        )
        .await;
    }
    #[tokio::test]
    async fn manifest_paths_are_validated_before_any_lookup() {
        let router = router(with_fleet(fleet()));
        let long_namespace = format!("/v1/manifests/{}/web", "a".repeat(64));
        let long_name = format!("/v1/manifests/default/{}", "a".repeat(254));
        for (path, needle) in [
            ("/v1/manifests/Default/web", "namespace"),
            ("/v1/manifests/-ns/web", "namespace"),
            ("/v1/manifests/a.b/web", "namespace"),
            (long_namespace.as_str(), "namespace"),
            ("/v1/manifests/default/Web", "name must"),
            ("/v1/manifests/default/web..x", "name must"),
            ("/v1/manifests/default/web%2Fx", "name must"),
            ("/v1/manifests/default/%20", "name must"),
            (long_name.as_str(), "name must"),
        ] {
            expect_error(
                router.clone(),
                Method::GET,
                path,
                StatusCode::BAD_REQUEST,
                needle,
            )
            .await;
        }
        // Valid, but no token: refused before any lookup (nothing is revealed, not even
        // whether it exists).
        expect_error(
            router.clone(),
            Method::GET,
            "/v1/manifests/default/web.v2",
            StatusCode::UNAUTHORIZED,
            "missing Authorization",
        )
        .await;
        // A token, but no API server to review it with.
        let (status, _, body) = send(
            router.clone(),
            Method::GET,
            "/v1/manifests/default/web.v2",
            Some("Bearer s3cret"),
        )
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(
            body.contains("no API client") && !body.contains("s3cret"),
            "{body}"
        );
        expect_error(
            router,
            Method::GET,
            "/v1/manifests/default",
            StatusCode::NOT_FOUND,
            "no such endpoint",
        )
        .await;
    }
    #[tokio::test]
    async fn draining_needs_an_authenticated_caller() {
        let state = with_fleet(fleet());
        let router = router(state.clone());
        for method in [Method::POST, Method::DELETE] {
            for authorization in [None, Some("Basic dXNlcjpwYXNz"), Some("Bearer ")] {
                let (status, headers, body) =
                    send(router.clone(), method.clone(), "/v1/drain", authorization).await;
                assert_eq!(
                    status,
                    StatusCode::UNAUTHORIZED,
                    "{method} {authorization:?}"
                );
                assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
                assert!(serde_json::from_str::<ErrorAnswer>(&body).is_ok(), "{body}");
            }
            // A well-formed token, but no API server to review it with.
            let (status, _, body) = send(
                router.clone(),
                method.clone(),
                "/v1/drain",
                Some("Bearer s3cret"),
            )
            .await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{method}");
            assert!(!body.contains("s3cret"), "{body}");
        }
        assert!(!*state.drain.borrow(), "refused requests change nothing");
        expect_error(
            router,
            Method::GET,
            "/v1/drain",
            StatusCode::METHOD_NOT_ALLOWED,
            "not allowed",
        )
        .await;
    }
    #[tokio::test]
    async fn readyz_follows_the_watch_sync_and_livez_is_always_ok() {
        let state = state(crate::telemetry::metrics::registry(), Members::default());
        let router = router(state.clone());
        assert_eq!(get(router.clone(), "/livez").await.0, StatusCode::OK);
        let (status, content_type, _) = get(router.clone(), "/readyz").await;
        assert_eq!(
            (status, content_type.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "application/json")
        );
        state.synced.store(true, Ordering::Relaxed);
        assert_eq!(get(router, "/readyz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_are_exposed_with_the_prefix_in_both_formats() {
        let mut registry = crate::telemetry::metrics::registry();
        let metrics = crate::telemetry::metrics::Metrics::register(&mut registry);
        metrics.reconcile.count_pass("error", "RenderError");
        metrics.render.cache_hits.inc();
        let queue = crate::work::queue::WorkQueue::new(metrics.queue.clone());
        queue.add("due", std::time::Duration::ZERO);
        queue.add("later", std::time::Duration::from_secs(3600));
        let router = router(state(registry, Members::default()));

        // Prometheus asks for OpenMetrics first.
        let request = Request::builder()
            .uri("/metrics")
            .header(
                header::ACCEPT,
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            )
            .body(Body::empty())
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap();
        assert!(content_type.starts_with("application/openmetrics-text"));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            body.contains(
                r#"module_manager_reconcile_passes_total{result="error",category="RenderError"} 1"#
            ),
            "{body}"
        );
        assert!(body.contains("# TYPE module_manager_render_cache_hits counter"));
        assert!(body.ends_with("# EOF\n"));

        // Anyone else gets the classic text format.
        let (status, content_type, body) = get(router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(content_type.starts_with("text/plain; version=0.0.4"));
        assert!(body.contains("# TYPE module_manager_render_cache_hits_total counter"));
        assert!(
            body.contains("module_manager_render_cache_hits_total 1"),
            "{body}"
        );
        // Read from the queue at the scrape.
        assert!(body.contains("module_manager_queue_due 1\n"), "{body}");
        assert!(
            body.contains("module_manager_queue_scheduled 1\n"),
            "{body}"
        );
        assert!(!body.contains("# EOF"));
    }
}
