//! Admin API (axum): health, metrics, the fleet's members and shards, this replica's queue, one
//! Manifest's shard and owner, and the authenticated drain switch. Documented in
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
#[cfg(test)]
pub(crate) mod testing;
mod upstream;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

pub use answers::{
    DrainAnswer, ErrorAnswer, ManifestAnswer, ManifestSource, MemberQueue, MemberSummary,
    QueueAnswer, ShardsAnswer, manifest_answer, member_summary, queue_answer, shards_answer,
};
pub use auth::{Access, TOKEN_AUDIENCE, authorize, bearer_token};
pub use errors::ApiError;
pub use names::{is_dns_label, is_dns_subdomain};
pub use reviews::{ReviewLimits, Reviews};
pub use server::{ServeLimits, Source, serve};
pub use upstream::Pool;

use crate::shard::fleet::FleetView;
use crate::shard::membership::Members;
use crate::work::controller::Work;
use errors::error;

/// What the admin API reads.
#[derive(Clone)]
pub struct AdminState {
    /// The root metrics registry.
    pub registry: Arc<Registry>,
    /// Whether the Manifest watch has seen its first full list.
    pub synced: Arc<AtomicBool>,
    /// The fleet as this replica sees it (from the membership Leases).
    pub members: watch::Receiver<Members>,
    /// Shards and members as of this replica's last shard round.
    pub fleet: watch::Receiver<FleetView>,
    /// This replica's caches and queue (`None` in router tests without a controller).
    pub work: Option<Work>,
    /// Set by `POST /v1/drain`: hand every shard over and take none.
    pub drain: watch::Sender<bool>,
    /// The API server, for TokenReview/SubjectAccessReview and Manifest lookups (`None`:
    /// mutating endpoints refuse every caller).
    pub client: Option<kube::Client>,
    /// TokenReview answers kept briefly, and the limits on failed authentications.
    pub reviews: Arc<Reviews>,
}

/// Largest request body the router accepts (no endpoint reads one).
pub const MAX_REQUEST_BODY: usize = 4096;
/// Longest bearer token accepted.
pub const MAX_TOKEN_LENGTH: usize = 8192;
/// Limit on each call to the API server (TokenReview, SubjectAccessReview, Manifest lookup).
pub const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Most API server calls the admin API makes at once; beyond it callers get `429`.
pub const MAX_API_CALLS: usize = 16;

/// The path the drain switch is authorized on (`nonResourceURLs` in a ClusterRole).
pub const DRAIN_PATH: &str = "/v1/drain";

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
