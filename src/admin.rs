//! Admin API (axum): health, metrics and the fleet's members; the shard views arrive with the
//! shard Leases. Documented in `docs/admin-api.md`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::shard::membership::Members;

/// What the admin API reads.
#[derive(Clone)]
pub struct AdminState {
    /// The root metrics registry.
    pub registry: Arc<Registry>,
    /// Whether the Manifest watch has seen its first full list.
    pub synced: Arc<AtomicBool>,
    /// The fleet as this replica sees it (from the membership Leases).
    pub members: watch::Receiver<Members>,
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/members", get(members))
        .with_state(state)
}

/// Ready once the Manifest watch has synced: before that, this replica does not know its work.
async fn readyz(State(state): State<AdminState>) -> Response {
    if state.synced.load(Ordering::Relaxed) {
        "ok".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the Manifest watch has not synced yet",
        )
            .into_response()
    }
}

/// Every member with a membership Lease, live or not, as this replica sees it.
async fn members(State(state): State<AdminState>) -> Json<Members> {
    Json(state.members.borrow().clone())
}

/// Fetches the fleet's members from a replica's admin API (`base`: `http://host:port`).
pub async fn fetch_members(base: &str) -> anyhow::Result<Members> {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<axum::body::Body>();
    let uri: axum::http::Uri = format!("{}/v1/members", base.trim_end_matches('/')).parse()?;
    let response = tokio::time::timeout(std::time::Duration::from_secs(10), client.get(uri))
        .await
        .map_err(|_| anyhow::anyhow!("ask {base}: no answer within 10 s"))?
        .map_err(|e| anyhow::anyhow!("ask {base}: {e:?}"))?;
    anyhow::ensure!(
        response.status().is_success(),
        "GET /v1/members: {}",
        response.status()
    );
    let body = response.into_body().collect().await?.to_bytes();
    Ok(serde_json::from_slice(&body)?)
}

/// The members as a table, for the command line.
pub fn members_table(members: &Members) -> String {
    let mut out = format!("{:<32} {:<5} {}\n", "NAME", "LIVE", "UNCHANGED FOR");
    for member in &members.members {
        let live = if member.live { "yes" } else { "no" };
        out += &format!(
            "{:<32} {:<5} {:.1}s\n",
            member.name, live, member.unchanged_for_seconds
        );
    }
    if !members.self_renewed {
        out += "(the replica asked has not renewed its own Lease within the lease duration)\n";
    }
    out
}

/// The OpenMetrics text exposition.
async fn metrics(State(state): State<AdminState>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encode metrics: {e}"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{QueueMetrics, ReconcileMetrics, RenderMetrics, ResultLabels};
    use crate::shard::membership::MemberView;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn state(registry: Registry, members: Members) -> AdminState {
        AdminState {
            registry: Arc::new(registry),
            synced: Arc::default(),
            members: watch::channel(members).1,
        }
    }

    #[test]
    fn members_print_as_a_table() {
        let members = Members {
            members: vec![
                MemberView {
                    name: "module-manager-0".into(),
                    live: true,
                    unchanged_for_seconds: 1.25,
                },
                MemberView {
                    name: "module-manager-1".into(),
                    live: false,
                    unchanged_for_seconds: 20.0,
                },
            ],
            self_renewed: false,
            renewed_at: None,
        };
        let table = members_table(&members);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("NAME") && lines[0].contains("LIVE"));
        assert!(
            lines[1].starts_with("module-manager-0")
                && lines[1].contains("yes")
                && lines[1].ends_with("1.2s")
        );
        assert!(lines[2].contains(" no ") && lines[2].ends_with("20.0s"));
        assert!(lines[3].contains("has not renewed"));
    }

    /// The command line's client against the real router on a loopback port.
    #[tokio::test]
    async fn the_cli_client_reads_members_from_a_served_router() {
        let members = Members {
            members: vec![MemberView {
                name: "module-manager-0".into(),
                live: true,
                unchanged_for_seconds: 0.5,
            }],
            self_renewed: true,
            renewed_at: None,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = router(state(crate::metrics::registry(), members.clone()));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let fetched = fetch_members(&format!("http://{address}")).await.unwrap();
        assert_eq!(fetched.members, members.members);
        assert!(fetched.self_renewed);
    }

    #[tokio::test]
    async fn members_are_listed_as_json() {
        let members = Members {
            members: vec![MemberView {
                name: "module-manager-0".into(),
                live: true,
                unchanged_for_seconds: 1.5,
            }],
            self_renewed: true,
            renewed_at: None,
        };
        let (status, content_type, body) = get(
            router(state(crate::metrics::registry(), members)),
            "/v1/members",
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, "application/json");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
            serde_json::json!({"members": [{"name": "module-manager-0", "live": true, "unchanged_for_seconds": 1.5}], "self_renewed": true})
        );
    }

    async fn get(router: Router, path: &str) -> (StatusCode, String, String) {
        let response = router
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn readyz_follows_the_watch_sync_and_livez_is_always_ok() {
        let state = state(crate::metrics::registry(), Members::default());
        let router = router(state.clone());
        assert_eq!(get(router.clone(), "/livez").await.0, StatusCode::OK);
        assert_eq!(
            get(router.clone(), "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        state.synced.store(true, Ordering::Relaxed);
        assert_eq!(get(router, "/readyz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_are_exposed_with_the_prefix() {
        let mut registry = crate::metrics::registry();
        let reconcile = ReconcileMetrics::register(&mut registry);
        let render = RenderMetrics::register(&mut registry);
        let queue = QueueMetrics::register(&mut registry);
        reconcile
            .reconciles
            .get_or_create(&ResultLabels {
                result: "error",
                category: "RenderError",
            })
            .inc();
        render.cache_hits.inc();
        queue.depth.set(7);
        let router = router(state(registry, Members::default()));
        let (status, content_type, body) = get(router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(content_type.starts_with("application/openmetrics-text"));
        assert!(
            body.contains(
                r#"module_manager_reconcile_passes_total{result="error",category="RenderError"} 1"#
            ),
            "{body}"
        );
        assert!(
            body.contains("module_manager_render_cache_hits_total 1"),
            "{body}"
        );
        assert!(body.contains("module_manager_queue_depth 7"), "{body}");
        assert!(body.ends_with("# EOF\n"));
    }
}
