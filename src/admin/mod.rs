//! Admin API (axum): health, metrics, the fleet's members and shards, this replica's queue, one
//! Manifest's shard and owner, the fleet's remote targets (`targets.rs`), and the authenticated
//! drain switch. Documented in
//! `docs/admin-api.md`; the command line's client and tables are in `crate::cli`.
//!
//! Every `/v1` answer is JSON; every error is `{"error": "..."}`. The fleet-wide views come from
//! the Leases (through the fleet loop's [`FleetView`] and [`Members`]), so any replica answers
//! them alike. The drain switch and a Manifest's details authenticate the caller's bearer token
//! with a TokenReview and authorize it with a SubjectAccessReview (on the non-resource path, or
//! `get` on that Manifest), as kube-rbac-proxy does; TokenReview answers are kept briefly and
//! failed authentications are rate-limited (`reviews.rs`). The server (`server.rs`) bounds
//! connections and the time to read a request's header and to answer it.

mod answers;
mod auth;
mod errors;
mod handlers;
mod names;
mod reviews;
mod server;
mod state;
mod targets;
mod targets_endpoint;
#[cfg(test)]
pub(crate) mod testing;
mod upstream;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};

pub use answers::{
    DrainAnswer, ErrorAnswer, ManifestAnswer, ManifestSource, MemberQueue, MemberSummary,
    QueueAnswer, ShardsAnswer, manifest_answer, member_summary, queue_answer, shards_answer,
};
pub use auth::{Access, MAX_TOKEN_LENGTH, TOKEN_AUDIENCE, authorize, bearer_token};
pub use errors::ApiError;
pub use names::{is_dns_label, is_dns_subdomain};
pub use reviews::{ReviewLimits, Reviews};
pub use server::{ServeLimits, Source, serve};
pub use state::{AdminState, DRAIN_PATH, TARGETS_PATH};
pub use targets::{BudgetUse, TargetRow, TargetsAnswer};
pub use upstream::{API_TIMEOUT, MAX_API_CALLS, Pool};

use errors::error;

/// Largest request body the router accepts (no endpoint reads one).
pub const MAX_REQUEST_BODY: usize = 4096;

/// The admin router.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(handlers::readyz))
        .route("/metrics", get(handlers::metrics))
        .route("/v1/members", get(handlers::members))
        .route("/v1/shards", get(handlers::shards))
        .route("/v1/shards/{shard}", get(handlers::shard))
        .route("/v1/queue", get(handlers::queue))
        .route("/v1/manifests/{namespace}/{name}", get(handlers::manifest))
        .route(TARGETS_PATH, get(targets_endpoint::targets))
        .route(DRAIN_PATH, post(handlers::drain).delete(handlers::undrain))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this endpoint",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BODY))
        .with_state(state)
}
