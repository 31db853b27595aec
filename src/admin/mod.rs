//! Admin API (axum): health, metrics, the fleet's members and shards, this replica's queue, one
//! Manifest's shard and owner, and the authenticated drain switch; plus the command line's
//! client and tables. Documented in `docs/admin-api.md`.
//!
//! Every `/v1` answer is JSON; every error is `{"error": "..."}`. The fleet-wide views come from
//! the Leases (through the fleet loop's [`FleetView`] and [`Members`]), so any replica answers
//! them alike. Mutating endpoints authenticate the caller's bearer token with a TokenReview and
//! authorize it with a SubjectAccessReview on the non-resource path, as kube-rbac-proxy does.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use prometheus_client::registry::Registry;

use crate::telemetry::metrics::Format;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, watch};

use crate::api::{Manifest, State as ManifestState};
use crate::shard::ShardCount;
use crate::shard::fleet::{FleetView, ShardStatus, ShardView};
use crate::shard::membership::{MemberState, Members};
use crate::work::controller::Work;
use crate::work::queue::QueueSnapshot;

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
}

/// Largest request body the router accepts (no endpoint reads one).
pub const MAX_REQUEST_BODY: usize = 4096;
/// Longest bearer token accepted.
pub const MAX_TOKEN_LENGTH: usize = 8192;
/// Limit on each call to the API server (TokenReview, SubjectAccessReview, Manifest lookup).
pub const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Most API server calls the admin API makes at once; beyond it callers get `429`.
pub const MAX_API_CALLS: usize = 16;
/// Limit on one command-line request, connection to last byte.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer the command line reads.
pub const MAX_RESPONSE_BODY: usize = 16 << 20;

/// The path the drain switch is authorized on (`nonResourceURLs` in a ClusterRole).
pub const DRAIN_PATH: &str = "/v1/drain";

static API_CALLS: Semaphore = Semaphore::const_new(MAX_API_CALLS);

// ---------------------------------------------------------------------------------------------
// Answers: what the server serializes and the command line deserializes.

/// Every error answer: `{"error": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorAnswer {
    /// What went wrong.
    pub error: String,
}

/// `GET /v1/shards`: the fleet-wide view from the replica answering.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardsAnswer {
    /// Fleet name.
    pub fleet: String,
    /// The replica answering.
    pub replica: String,
    /// Number of virtual shards (0 before the replica's first shard round).
    pub shard_count: u32,
    /// The StatefulSet's desired replicas, when the fleet follows one.
    pub desired_replicas: Option<u32>,
    /// Whether the replica answering has stopped acting (its renew deadline passed).
    pub self_fenced: bool,
    /// The members the shards are assigned to.
    pub assigned: Vec<String>,
    /// Every shard (empty until the first round).
    pub shards: Vec<ShardView>,
    /// Per member (and per shard holder without a membership Lease).
    pub members: Vec<MemberSummary>,
}

/// One member in `GET /v1/shards`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberSummary {
    /// The replica.
    pub name: String,
    /// Whether its membership Lease changed within the lease duration.
    pub live: bool,
    /// What it announces; `None`: it holds shards but has no membership Lease.
    pub state: Option<MemberState>,
    /// Shards whose Lease it holds.
    pub shards: u32,
    /// Shards the assignment gives it.
    pub desired_shards: u32,
    /// Manifests queued, as it last published.
    pub queued: Option<u64>,
    /// Reconcile passes running, as it last published.
    pub in_flight: Option<u64>,
    /// Manifests in its cache, as it last published.
    pub manifests: Option<u64>,
}

/// `GET /v1/queue`: the answering replica's queue and every member's published load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueAnswer {
    /// The replica answering (empty before its first shard round).
    pub replica: String,
    /// Its queue now.
    pub queue: QueueSnapshot,
    /// Every member's load as it last published on its membership Lease.
    pub members: Vec<MemberQueue>,
}

/// One member's published load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberQueue {
    /// The replica.
    pub name: String,
    /// Whether its membership Lease changed within the lease duration.
    pub live: bool,
    /// What it announces.
    pub state: MemberState,
    /// Manifests queued (`None`: nothing published).
    pub queued: Option<u64>,
    /// Reconcile passes running.
    pub in_flight: Option<u64>,
    /// Manifests in its cache.
    pub manifests: Option<u64>,
}

/// Where `GET /v1/manifests/{namespace}/{name}` found the Manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ManifestSource {
    /// The answering replica's watch cache (it owns the shard, or the Manifest is new).
    Cache,
    /// The API server (another replica owns the shard).
    Api,
}

/// `GET /v1/manifests/{namespace}/{name}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestAnswer {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// Its shard, from the UID (`None` before the answering replica's first shard round).
    pub shard: Option<u32>,
    /// The holder of the shard's Lease in the fleet view.
    pub owner: Option<String>,
    /// `status.state`.
    pub state: Option<ManifestState>,
    /// The `Ready` condition's reason.
    pub reason: Option<String>,
    /// The `Ready` condition's message.
    pub message: Option<String>,
    /// Where it was found.
    pub source: ManifestSource,
}

/// `POST`/`DELETE /v1/drain`: the drain switch after the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainAnswer {
    /// Whether the replica hands every shard over and takes none.
    pub draining: bool,
}

/// An error answer: a status and `{"error": message}` (`401` adds `WWW-Authenticate: Bearer`).
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String);

impl From<(StatusCode, String)> for ApiError {
    fn from((status, message): (StatusCode, String)) -> Self {
        Self(status, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.0, Json(ErrorAnswer { error: self.1 })).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError(status, message.into())
}

// ---------------------------------------------------------------------------------------------
// The router.

/// The admin router.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/members", get(members))
        .route("/v1/shards", get(shards))
        .route("/v1/shards/{shard}", get(shard))
        .route("/v1/queue", get(queue))
        .route("/v1/manifests/{namespace}/{name}", get(manifest))
        .route(DRAIN_PATH, post(drain).delete(undrain))
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

/// Ready once the Manifest watch has synced: before that, this replica does not know its work.
async fn readyz(State(state): State<AdminState>) -> Response {
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
async fn metrics(
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

/// Every member with a membership Lease, live or not, as this replica sees it.
async fn members(State(state): State<AdminState>) -> Json<Members> {
    Json(state.members.borrow().clone())
}

/// The fleet-wide shard view.
async fn shards(State(state): State<AdminState>) -> Json<ShardsAnswer> {
    Json(shards_answer(&state.fleet.borrow()))
}

/// One shard.
async fn shard(
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
async fn queue(State(state): State<AdminState>) -> Result<Json<QueueAnswer>, ApiError> {
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

/// One Manifest: from this replica's cache, else from the API server.
async fn manifest(
    State(state): State<AdminState>,
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
            let _permit = api_permit()?;
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
async fn drain(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> Result<Json<DrainAnswer>, ApiError> {
    set_drain(&state, &headers, "post", true).await
}

/// `DELETE /v1/drain`: take shards again.
async fn undrain(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> Result<Json<DrainAnswer>, ApiError> {
    set_drain(&state, &headers, "delete", false).await
}

async fn set_drain(
    state: &AdminState,
    headers: &HeaderMap,
    verb: &str,
    draining: bool,
) -> Result<Json<DrainAnswer>, ApiError> {
    let user = authorize(state.client.as_ref(), headers, DRAIN_PATH, verb).await?;
    let before = state.drain.send_replace(draining);
    tracing::info!(
        user = user.username.as_deref().unwrap_or_default(),
        draining,
        changed = before != draining,
        "drain switch set through the admin API"
    );
    Ok(Json(DrainAnswer { draining }))
}

// ---------------------------------------------------------------------------------------------
// The answers, from the views (pure).

/// The `GET /v1/shards` answer from a fleet view.
pub fn shards_answer(view: &FleetView) -> ShardsAnswer {
    ShardsAnswer {
        fleet: view.fleet.clone(),
        replica: view.replica.clone(),
        shard_count: view.shard_count,
        desired_replicas: view.desired_replicas,
        self_fenced: view.self_fenced,
        assigned: view.assigned.clone(),
        shards: view.shards.clone(),
        members: member_summary(view),
    }
}

/// Per member: shards held and desired, and the published load; shard holders without a
/// membership Lease are listed too (not live, no state), by name.
pub fn member_summary(view: &FleetView) -> Vec<MemberSummary> {
    let mut by_name: BTreeMap<&str, MemberSummary> = view
        .members
        .iter()
        .map(|m| {
            let load = m.load.as_ref();
            (
                m.name.as_str(),
                MemberSummary {
                    name: m.name.clone(),
                    live: m.live,
                    state: Some(m.state),
                    shards: 0,
                    desired_shards: 0,
                    queued: load.map(|l| l.queued),
                    in_flight: load.map(|l| l.in_flight),
                    manifests: load.map(|l| l.manifests),
                },
            )
        })
        .collect();
    let unknown = |name: &str| MemberSummary {
        name: name.to_owned(),
        live: false,
        state: None,
        shards: 0,
        desired_shards: 0,
        queued: None,
        in_flight: None,
        manifests: None,
    };
    for shard in &view.shards {
        if let Some(owner) = shard.owner.as_deref() {
            by_name
                .entry(owner)
                .or_insert_with(|| unknown(owner))
                .shards += 1;
        }
        if let Some(desired) = shard.desired_owner.as_deref() {
            by_name
                .entry(desired)
                .or_insert_with(|| unknown(desired))
                .desired_shards += 1;
        }
    }
    by_name.into_values().collect()
}

/// The `GET /v1/queue` answer.
pub fn queue_answer(replica: String, queue: QueueSnapshot, members: &Members) -> QueueAnswer {
    QueueAnswer {
        replica,
        queue,
        members: members
            .members
            .iter()
            .map(|m| {
                let load = m.load.as_ref();
                MemberQueue {
                    name: m.name.clone(),
                    live: m.live,
                    state: m.state,
                    queued: load.map(|l| l.queued),
                    in_flight: load.map(|l| l.in_flight),
                    manifests: load.map(|l| l.manifests),
                }
            })
            .collect(),
    }
}

/// The `GET /v1/manifests/{namespace}/{name}` answer: the shard from the UID, its owner from the
/// fleet view, state and the `Ready` condition from the status.
pub fn manifest_answer(
    manifest: &Manifest,
    source: ManifestSource,
    view: &FleetView,
) -> ManifestAnswer {
    let uid = manifest.uid();
    let shard = ShardCount::new(view.shard_count)
        .zip(uid.as_deref())
        .map(|(count, uid)| count.shard_of(uid));
    let owner = shard.and_then(|k| {
        view.shards
            .iter()
            .find(|s| s.shard == k)
            .and_then(|s| s.owner.clone())
    });
    let status = manifest.status.as_ref();
    let ready = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    ManifestAnswer {
        namespace: manifest.namespace().unwrap_or_default(),
        name: manifest.name_any(),
        uid,
        shard,
        owner,
        state: status.and_then(|s| s.state),
        reason: ready.map(|c| c.reason.clone()).filter(|r| !r.is_empty()),
        message: ready.map(|c| c.message.clone()).filter(|m| !m.is_empty()),
        source,
    }
}

/// Whether `text` is a DNS-1123 label (a namespace): lowercase alphanumerics and `-`, starting
/// and ending alphanumeric, at most 63 characters.
pub fn is_dns_label(text: &str) -> bool {
    text.len() <= 63 && is_label_part(text)
}

/// Whether `text` is a DNS-1123 subdomain (a Manifest's name): labels joined by `.`, at most
/// 253 characters.
pub fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(is_label_part)
}

fn is_label_part(part: &str) -> bool {
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = part.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Authentication and authorization.

/// The bearer token of a request: exactly one `Authorization: Bearer <token>` header with a
/// non-empty token of visible ASCII, at most [`MAX_TOKEN_LENGTH`] long; else `401`.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, (StatusCode, String)> {
    let unauthorized = |why: &str| (StatusCode::UNAUTHORIZED, why.to_owned());
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values
        .next()
        .ok_or_else(|| unauthorized("missing Authorization: Bearer <token>"))?;
    if values.next().is_some() {
        return Err(unauthorized("more than one Authorization header"));
    }
    let malformed = || unauthorized("malformed Authorization header: expected Bearer <token>");
    let (scheme, token) = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .ok_or_else(malformed)?;
    let token = token.trim_start_matches(' ');
    if !scheme.eq_ignore_ascii_case("bearer")
        || token.is_empty()
        || token.len() > MAX_TOKEN_LENGTH
        || !token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(malformed());
    }
    Ok(token)
}

/// The audience a drain caller's token must be issued for (TokenReview `spec.audiences`).
pub const TOKEN_AUDIENCE: &str = "module-manager";

/// Authenticates the request's bearer token (TokenReview) and authorizes the user to `verb` the
/// non-resource `path` (SubjectAccessReview with the reviewed user, groups, uid and extra;
/// `verb` is the lowercase HTTP method, as kube-rbac-proxy does). Answers the user, or the
/// status to refuse with: `401` (no, malformed or rejected token), `403` (not allowed), `503`
/// (no API client), `429` (too many reviews at once), `502`/`504` (the API server failed or did
/// not answer within [`API_TIMEOUT`]). Only tokens issued for the audience [`TOKEN_AUDIENCE`]
/// are accepted (`kubectl create token NAME --audience module-manager`): a caller never hands a
/// token the API server itself would accept to this endpoint. The token is never logged.
pub async fn authorize(
    client: Option<&kube::Client>,
    headers: &HeaderMap,
    path: &str,
    verb: &str,
) -> Result<UserInfo, (StatusCode, String)> {
    let token = bearer_token(headers)?;
    let client = client.ok_or_else(|| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "this replica has no API client to authenticate callers".to_owned(),
        )
    })?;
    let _permit = api_permit()?;
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences: Some(vec![TOKEN_AUDIENCE.to_owned()]),
        },
        ..Default::default()
    };
    let reviewed = api_call(
        "TokenReview",
        Api::<TokenReview>::all(client.clone()).create(&PostParams::default(), &review),
    )
    .await?;
    let status = reviewed.status.unwrap_or_default();
    let user = status
        .user
        .filter(|u| u.username.as_deref().is_some_and(|n| !n.is_empty()));
    // An audience-aware server names the audience it matched; an empty list would mean the
    // token is one for the API server itself, which callers must not hand to this endpoint.
    let for_us = status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|a| a == TOKEN_AUDIENCE));
    let Some(user) = user.filter(|_| status.authenticated == Some(true) && for_us) else {
        tracing::info!(
            error = status.error.as_deref().unwrap_or_default(),
            path,
            verb,
            "admin API: token not authenticated"
        );
        return Err((
            StatusCode::UNAUTHORIZED,
            "the token was not authenticated".to_owned(),
        ));
    };
    let username = user.username.clone().unwrap_or_default();
    let access = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.to_owned()),
                verb: Some(verb.to_owned()),
            }),
            resource_attributes: None,
        },
        ..Default::default()
    };
    let decided = api_call(
        "SubjectAccessReview",
        Api::<SubjectAccessReview>::all(client.clone()).create(&PostParams::default(), &access),
    )
    .await?;
    let status = decided.status.unwrap_or_default();
    if !status.allowed {
        let reason = status
            .reason
            .filter(|r| !r.is_empty())
            .or(status.evaluation_error.filter(|e| !e.is_empty()))
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        tracing::info!(user = %username, path, verb, "admin API: access denied");
        return Err((
            StatusCode::FORBIDDEN,
            format!("user {username:?} may not {verb} {path}{reason}"),
        ));
    }
    Ok(user)
}

/// A permit for one API server call (request or review); `429` when [`MAX_API_CALLS`] run.
fn api_permit() -> Result<tokio::sync::SemaphorePermit<'static>, (StatusCode, String)> {
    API_CALLS.try_acquire().map_err(|_| {
        (
            StatusCode::TOO_MANY_REQUESTS,
            "too many admin requests are waiting for the API server; retry shortly".to_owned(),
        )
    })
}

/// Runs one API server call within [`API_TIMEOUT`]: `504` when it does not answer in time, `502`
/// with the error when it fails.
async fn api_call<T>(
    what: &str,
    call: impl Future<Output = kube::Result<T>>,
) -> Result<T, (StatusCode, String)> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => {
            tracing::warn!("admin API: {what}: {e}");
            Err((StatusCode::BAD_GATEWAY, format!("{what}: {e}")))
        }
        Err(_) => Err((
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "{what}: the API server did not answer within {} s",
                API_TIMEOUT.as_secs()
            ),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// The command line's client.

/// Asks a replica's admin API (`base`: `http://host:port`): `method path`, with `token` as a
/// bearer token when given. Answers the JSON body as `T`; a non-2xx answer is an error with the
/// server's `{"error"}` message. Bounded: [`FETCH_TIMEOUT`] for the whole exchange, at most
/// [`MAX_RESPONSE_BODY`] bytes read.
pub async fn fetch<T: DeserializeOwned>(
    base: &str,
    method: Method,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<T> {
    use http_body_util::BodyExt;
    let what = format!("{method} {path}");
    let uri: axum::http::Uri = format!("{}{path}", base.trim_end_matches('/'))
        .parse()
        .map_err(|e| anyhow::anyhow!("{what}: bad URL {base:?}: {e}"))?;
    let mut request = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header(header::ACCEPT, "application/json");
    if let Some(token) = token {
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| anyhow::anyhow!("the token is not a valid header value"))?;
        value.set_sensitive(true);
        request = request.header(header::AUTHORIZATION, value);
    }
    let request = request
        .body(Body::empty())
        .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| anyhow::anyhow!("{what} at {base}: {e:?}"))?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BODY)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("{what} at {base}: read the answer: {e}"))?
            .to_bytes();
        anyhow::Ok((status, body))
    };
    let (status, body) = tokio::time::timeout(FETCH_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "{what} at {base}: no answer within {} s",
                FETCH_TIMEOUT.as_secs()
            )
        })??;
    if !status.is_success() {
        let message = match serde_json::from_slice::<ErrorAnswer>(&body) {
            Ok(answer) => answer.error,
            Err(_) => String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        };
        anyhow::bail!("{what}: {status}: {message}");
    }
    serde_json::from_slice(&body).map_err(|e| anyhow::anyhow!("{what}: unexpected answer: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Tables for the command line (pure).

/// Rows as aligned columns, two spaces apart, without trailing blanks.
fn columns(rows: &[Vec<String>]) -> String {
    let count = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..count)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line += "  ";
            }
            line += &format!("{cell:<width$}", width = widths[i]);
        }
        out += line.trim_end();
        out.push('\n');
    }
    out
}

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn yes_no(value: bool) -> String {
    if value { "yes" } else { "no" }.to_owned()
}

/// A shard state as the API spells it.
pub fn shard_status_name(status: ShardStatus) -> &'static str {
    match status {
        ShardStatus::Owned => "owned",
        ShardStatus::Handover => "handover",
        ShardStatus::Free => "free",
        ShardStatus::Orphaned => "orphaned",
    }
}

/// A member state as the API spells it.
pub fn member_state_name(state: MemberState) -> &'static str {
    match state {
        MemberState::Active => "active",
        MemberState::Restarting => "restarting",
        MemberState::Draining => "draining",
    }
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

fn shard_row(shard: &ShardView) -> Vec<String> {
    vec![
        shard.shard.to_string(),
        or_dash(shard.owner.as_deref()),
        or_dash(shard.desired_owner.as_deref()),
        shard_status_name(shard.state).to_owned(),
        shard.epoch.to_string(),
        or_dash(shard.manifests),
        or_dash(shard.queued),
    ]
}

/// `GET /v1/shards` as tables: one line per shard, then one per member, then the fleet.
pub fn shards_table(answer: &ShardsAnswer) -> String {
    let mut rows = vec![
        [
            "SHARD",
            "OWNER",
            "DESIRED",
            "STATE",
            "EPOCH",
            "MANIFESTS",
            "QUEUED",
        ]
        .map(String::from)
        .to_vec(),
    ];
    rows.extend(answer.shards.iter().map(shard_row));
    let mut out = columns(&rows);
    if answer.shards.is_empty() {
        out += "(no shard round has completed on the replica asked yet)\n";
    }
    out.push('\n');
    let mut rows = vec![
        [
            "MEMBER",
            "LIVE",
            "STATE",
            "SHARDS",
            "DESIRED",
            "QUEUED",
            "IN FLIGHT",
            "MANIFESTS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    rows.extend(answer.members.iter().map(|m| {
        vec![
            m.name.clone(),
            yes_no(m.live),
            m.state.map_or("no lease", member_state_name).to_owned(),
            m.shards.to_string(),
            m.desired_shards.to_string(),
            or_dash(m.queued),
            or_dash(m.in_flight),
            or_dash(m.manifests),
        ]
    }));
    out += &columns(&rows);
    out += &format!(
        "\nfleet {}: {} shards, answered by {}",
        answer.fleet, answer.shard_count, answer.replica
    );
    if let Some(replicas) = answer.desired_replicas {
        out += &format!(", {replicas} desired replicas");
    }
    out.push('\n');
    if answer.self_fenced {
        out += "(the replica asked is fenced: its own Lease renewal is overdue, it does no work)\n";
    }
    out
}

/// `GET /v1/shards/{k}` as a table.
pub fn shard_table(shard: &ShardView) -> String {
    let names = [
        "SHARD",
        "OWNER",
        "DESIRED",
        "STATE",
        "EPOCH",
        "MANIFESTS",
        "QUEUED",
    ];
    let rows: Vec<Vec<String>> = names
        .iter()
        .zip(shard_row(shard))
        .map(|(name, value)| vec![(*name).to_owned(), value])
        .collect();
    columns(&rows)
}

/// `GET /v1/queue` as tables: the replica's queue per shard, then every member's load.
pub fn queue_table(answer: &QueueAnswer) -> String {
    let mut rows = vec![
        ["SHARD", "QUEUED", "IN FLIGHT", "OLDEST WAIT"]
            .map(String::from)
            .to_vec(),
    ];
    rows.extend(answer.queue.shards.iter().map(|(shard, q)| {
        vec![
            shard.to_string(),
            q.depth.to_string(),
            q.in_flight.to_string(),
            format!("{:.1}s", q.oldest_wait_seconds),
        ]
    }));
    let mut out = columns(&rows);
    out += &format!(
        "{}: {} queued, {} in flight\n\n",
        if answer.replica.is_empty() {
            "the replica asked"
        } else {
            &answer.replica
        },
        answer.queue.depth,
        answer.queue.in_flight
    );
    let mut rows = vec![
        [
            "MEMBER",
            "LIVE",
            "STATE",
            "QUEUED",
            "IN FLIGHT",
            "MANIFESTS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    rows.extend(answer.members.iter().map(|m| {
        vec![
            m.name.clone(),
            yes_no(m.live),
            member_state_name(m.state).to_owned(),
            or_dash(m.queued),
            or_dash(m.in_flight),
            or_dash(m.manifests),
        ]
    }));
    out += &columns(&rows);
    out
}

/// `GET /v1/manifests/{namespace}/{name}` as a table.
pub fn manifest_table(answer: &ManifestAnswer) -> String {
    let state = answer.state.map(|s| format!("{s:?}"));
    let source = match answer.source {
        ManifestSource::Cache => "the cache of the replica asked",
        ManifestSource::Api => "the API server",
    };
    let rows = [
        (
            "MANIFEST",
            Some(format!("{}/{}", answer.namespace, answer.name)),
        ),
        ("UID", answer.uid.clone()),
        ("SHARD", answer.shard.map(|k| k.to_string())),
        ("OWNER", answer.owner.clone()),
        ("STATE", state),
        ("REASON", answer.reason.clone()),
        ("MESSAGE", answer.message.clone()),
        ("FROM", Some(source.to_owned())),
    ];
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(name, value)| vec![name.to_owned(), or_dash(value)])
        .collect();
    columns(&rows)
}

/// `POST`/`DELETE /v1/drain` as a line.
pub fn drain_table(answer: &DrainAnswer) -> String {
    if answer.draining {
        "draining: the replica asked hands its shards over and takes none\n".to_owned()
    } else {
        "not draining: the replica asked takes shards again\n".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::membership::{MemberLoad, MemberView};
    use crate::telemetry::metrics::ResultLabels;
    use crate::work::queue::{ShardQueue, WorkQueue};
    use axum::http::Request;
    use http_body_util::BodyExt;
    use serde_json::json;
    use tower::ServiceExt;

    fn state(registry: Registry, members: Members) -> AdminState {
        AdminState {
            registry: Arc::new(registry),
            synced: Arc::default(),
            members: watch::channel(members).1,
            fleet: watch::channel(FleetView::default()).1,
            work: None,
            drain: watch::channel(false).0,
            client: None,
        }
    }

    fn with_fleet(view: FleetView) -> AdminState {
        AdminState {
            fleet: watch::channel(view).1,
            ..state(crate::telemetry::metrics::registry(), Members::default())
        }
    }

    fn member(
        name: &str,
        live: bool,
        state: MemberState,
        load: Option<(u64, u64, u64)>,
    ) -> MemberView {
        MemberView {
            name: name.into(),
            live,
            unchanged_for_seconds: 1.0,
            state,
            load: load.map(|(queued, in_flight, manifests)| MemberLoad {
                queued,
                in_flight,
                manifests,
                shards: BTreeMap::new(),
            }),
        }
    }

    fn shard_view(
        shard: u32,
        owner: Option<&str>,
        desired: Option<&str>,
        state: ShardStatus,
        load: Option<(u64, u64)>,
    ) -> ShardView {
        ShardView {
            shard,
            owner: owner.map(str::to_owned),
            desired_owner: desired.map(str::to_owned),
            state,
            epoch: 3,
            manifests: load.map(|l| l.0),
            queued: load.map(|l| l.1),
        }
    }

    /// Four shards over `mm-0` (live), `mm-1` (draining) and `gone` (holds shard 3 without a
    /// membership Lease).
    fn fleet() -> FleetView {
        FleetView {
            fleet: "mm".into(),
            replica: "mm-0".into(),
            shard_count: 4,
            desired_replicas: Some(2),
            self_fenced: false,
            members: vec![
                member("mm-0", true, MemberState::Active, Some((2, 1, 10))),
                member("mm-1", true, MemberState::Draining, None),
            ],
            assigned: vec!["mm-0".into()],
            shards: vec![
                shard_view(
                    0,
                    Some("mm-0"),
                    Some("mm-0"),
                    ShardStatus::Owned,
                    Some((7, 1)),
                ),
                shard_view(1, Some("mm-1"), Some("mm-0"), ShardStatus::Handover, None),
                shard_view(2, None, Some("mm-0"), ShardStatus::Free, None),
                shard_view(3, Some("gone"), Some("mm-0"), ShardStatus::Orphaned, None),
            ],
        }
    }

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

    #[test]
    fn members_print_as_a_table() {
        let members = Members {
            members: vec![
                MemberView {
                    name: "module-manager-0".into(),
                    live: true,
                    unchanged_for_seconds: 1.25,
                    state: Default::default(),
                    load: None,
                },
                MemberView {
                    name: "module-manager-1".into(),
                    live: false,
                    unchanged_for_seconds: 20.0,
                    state: Default::default(),
                    load: None,
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
    async fn the_cli_client_reads_the_views_from_a_served_router() {
        let members = Members {
            members: vec![MemberView {
                name: "module-manager-0".into(),
                live: true,
                unchanged_for_seconds: 0.5,
                state: Default::default(),
                load: None,
            }],
            self_renewed: true,
            renewed_at: None,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = router(AdminState {
            fleet: watch::channel(fleet()).1,
            ..state(crate::telemetry::metrics::registry(), members.clone())
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        let base = format!("http://{address}/");
        let fetched: Members = fetch(&base, Method::GET, "/v1/members", None)
            .await
            .unwrap();
        assert_eq!(fetched.members, members.members);
        assert!(fetched.self_renewed);
        let shards: ShardsAnswer = fetch(&base, Method::GET, "/v1/shards", None).await.unwrap();
        assert_eq!(shards, shards_answer(&fleet()));
        let shard: ShardView = fetch(&base, Method::GET, "/v1/shards/1", None)
            .await
            .unwrap();
        assert_eq!(shard, fleet().shards[1]);
        // Errors carry the status and the server's message.
        let missing = fetch::<ShardView>(&base, Method::GET, "/v1/shards/9", None)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("404") && missing.contains("shard 9 does not exist"),
            "{missing}"
        );
        let unauthenticated = fetch::<DrainAnswer>(&base, Method::POST, "/v1/drain", None)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            unauthenticated.contains("401") && unauthenticated.contains("missing Authorization"),
            "{unauthenticated}"
        );
        let no_client = fetch::<DrainAnswer>(&base, Method::DELETE, "/v1/drain", Some("t0ken"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            no_client.contains("503") && !no_client.contains("t0ken"),
            "{no_client}"
        );
    }

    #[tokio::test]
    async fn the_cli_client_gives_up_on_a_silent_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        // Accepts and never answers.
        let _server = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                held.push(listener.accept().await.unwrap());
            }
        });
        tokio::time::pause();
        let error = fetch::<Members>(
            &format!("http://{address}"),
            Method::GET,
            "/v1/members",
            None,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(error.contains("no answer within 10 s"), "{error}");
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
            json!({"shard": 0, "owner": "mm-0", "desired_owner": "mm-0", "state": "owned", "epoch": 3, "manifests": 7, "queued": 1})
        );
        assert_eq!(body["shards"][2]["owner"], json!(null));
        assert_eq!(
            body["members"],
            json!([
                {"name": "gone", "live": false, "state": null, "shards": 1, "desired_shards": 0, "queued": null, "in_flight": null, "manifests": null},
                {"name": "mm-0", "live": true, "state": "active", "shards": 1, "desired_shards": 4, "queued": 2, "in_flight": 1, "manifests": 10},
                {"name": "mm-1", "live": true, "state": "draining", "shards": 1, "desired_shards": 0, "queued": null, "in_flight": null, "manifests": null},
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
            super::router(with_fleet(FleetView::default())),
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

    #[test]
    fn the_queue_answer_has_the_snapshot_and_every_members_load() {
        let queue: WorkQueue<&str> = WorkQueue::default();
        queue.add("a", Duration::ZERO);
        queue.add("b", Duration::from_secs(60));
        let members = Members {
            members: fleet().members,
            self_renewed: true,
            renewed_at: None,
        };
        let answer = queue_answer("mm-0".into(), queue.snapshot(), &members);
        let json = serde_json::to_value(&answer).unwrap();
        assert_eq!(json["replica"], "mm-0");
        assert_eq!(
            (&json["queue"]["depth"], &json["queue"]["in_flight"]),
            (&json!(2), &json!(0))
        );
        assert_eq!(json["queue"]["shards"]["0"]["depth"], 2);
        assert_eq!(
            json["members"],
            json!([
                {"name": "mm-0", "live": true, "state": "active", "queued": 2, "in_flight": 1, "manifests": 10},
                {"name": "mm-1", "live": true, "state": "draining", "queued": null, "in_flight": null, "manifests": null},
            ])
        );
        // The command line reads back what the server writes.
        assert_eq!(serde_json::from_value::<QueueAnswer>(json).unwrap(), answer);
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
        // Valid, but neither a cache nor a client to look in.
        expect_error(
            router.clone(),
            Method::GET,
            "/v1/manifests/default/web.v2",
            StatusCode::SERVICE_UNAVAILABLE,
            "no API client",
        )
        .await;
        expect_error(
            router,
            Method::GET,
            "/v1/manifests/default",
            StatusCode::NOT_FOUND,
            "no such endpoint",
        )
        .await;
    }

    #[test]
    fn dns_names() {
        for good in ["a", "default", "kube-system", "0", &"a".repeat(63)] {
            assert!(is_dns_label(good) && is_dns_subdomain(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a b", "ä", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(!is_dns_label("a.b") && is_dns_subdomain("a.b") && is_dns_subdomain("web-1.v2"));
        for bad in ["", ".a", "a.", "a..b", "a/b", "a.-b", &"a".repeat(254)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        assert!(is_dns_subdomain(&"a".repeat(253)));
    }

    fn a_manifest(status: serde_json::Value) -> Manifest {
        serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": "web", "namespace": "default", "uid": "a"},
            "spec": {"module": "web", "chart": {"path": "web"}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_manifest_answer_has_the_shard_from_the_uid_and_its_owner() {
        let manifest = a_manifest(json!({
            "state": "Error",
            "conditions": [
                {"type": "Rendered", "status": "False", "reason": "RenderError", "message": "boom", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Ready", "status": "False", "reason": "RenderError", "message": "template: boom", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
        }));
        // fnv1a64("a") = 0xaf63…: shard 2 of 4 (top two bits 10).
        let answer = manifest_answer(&manifest, ManifestSource::Api, &fleet());
        assert_eq!(
            serde_json::to_value(&answer).unwrap(),
            json!({"namespace": "default", "name": "web", "uid": "a", "shard": 2, "owner": null,
                   "state": "Error", "reason": "RenderError", "message": "template: boom", "source": "api"})
        );
        let view = FleetView {
            shard_count: 2,
            ..fleet()
        };
        let answer = manifest_answer(&a_manifest(json!({})), ManifestSource::Cache, &view);
        assert_eq!(
            (answer.shard, answer.owner.as_deref()),
            (Some(1), Some("mm-1"))
        );
        assert_eq!((answer.state, answer.reason), (None, None));
        // Before the first round the shard count is unknown.
        let answer = manifest_answer(&manifest, ManifestSource::Cache, &FleetView::default());
        assert_eq!((answer.shard, answer.owner), (None, None));
    }

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        let headers = |values: &[&str]| {
            let mut map = HeaderMap::new();
            for v in values {
                map.append(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            }
            map
        };
        assert_eq!(
            bearer_token(&headers(&["Bearer abc.def-_"])).unwrap(),
            "abc.def-_"
        );
        assert_eq!(bearer_token(&headers(&["bearer  abc"])).unwrap(), "abc");
        let too_long = format!("Bearer {}", "a".repeat(MAX_TOKEN_LENGTH + 1));
        for bad in [
            &[][..],
            &["Basic dXNlcjpwYXNz"],
            &["Bearer"],
            &["Bearer "],
            &["Bearer a b"],
            &["Bearertoken"],
            &[too_long.as_str()],
            &["Bearer a", "Bearer b"],
        ] {
            let (status, _) = bearer_token(&headers(bad)).unwrap_err();
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{bad:?}");
        }
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

    #[test]
    fn shards_print_as_tables() {
        let table = shards_table(&shards_answer(&fleet()));
        let lines: Vec<&str> = table.lines().collect();
        let words = |line: &str| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            words(lines[0]),
            [
                "SHARD",
                "OWNER",
                "DESIRED",
                "STATE",
                "EPOCH",
                "MANIFESTS",
                "QUEUED"
            ]
        );
        assert_eq!(
            words(lines[1]),
            ["0", "mm-0", "mm-0", "owned", "3", "7", "1"]
        );
        assert_eq!(
            words(lines[2]),
            ["1", "mm-1", "mm-0", "handover", "3", "-", "-"]
        );
        assert_eq!(words(lines[3]), ["2", "-", "mm-0", "free", "3", "-", "-"]);
        assert_eq!(
            words(lines[4]),
            ["3", "gone", "mm-0", "orphaned", "3", "-", "-"]
        );
        assert_eq!(lines[5], "");
        assert!(lines[6].starts_with("MEMBER") && lines[6].contains("IN FLIGHT"));
        assert_eq!(
            words(lines[7]),
            ["gone", "no", "no", "lease", "1", "0", "-", "-", "-"]
        );
        assert_eq!(
            words(lines[8]),
            ["mm-0", "yes", "active", "1", "4", "2", "1", "10"]
        );
        assert_eq!(
            lines[11],
            "fleet mm: 4 shards, answered by mm-0, 2 desired replicas"
        );
        // Columns line up: every shard row's OWNER starts where the header's does.
        let owner_at = lines[0].find("OWNER").unwrap();
        assert_eq!(lines[3].find("- ").unwrap(), owner_at);
        assert!(table.lines().all(|l| !l.ends_with(' ')));

        let empty = shards_table(&ShardsAnswer {
            self_fenced: true,
            ..Default::default()
        });
        assert!(empty.contains("no shard round has completed"), "{empty}");
        assert!(empty.contains("fenced"), "{empty}");
    }

    #[test]
    fn one_shard_prints_as_a_table() {
        let table = shard_table(&fleet().shards[0]);
        assert_eq!(
            table,
            "SHARD      0\nOWNER      mm-0\nDESIRED    mm-0\nSTATE      owned\nEPOCH      3\nMANIFESTS  7\nQUEUED     1\n"
        );
    }

    #[test]
    fn the_queue_prints_as_tables() {
        let answer = QueueAnswer {
            replica: "mm-0".into(),
            queue: QueueSnapshot {
                depth: 3,
                in_flight: 1,
                shards: [
                    (
                        0,
                        ShardQueue {
                            depth: 2,
                            in_flight: 1,
                            oldest_wait_seconds: 1.25,
                        },
                    ),
                    (
                        3,
                        ShardQueue {
                            depth: 1,
                            in_flight: 0,
                            oldest_wait_seconds: 0.0,
                        },
                    ),
                ]
                .into(),
            },
            members: queue_answer(
                String::new(),
                QueueSnapshot::default(),
                &Members {
                    members: fleet().members,
                    ..Default::default()
                },
            )
            .members,
        };
        let table = queue_table(&answer);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "SHARD  QUEUED  IN FLIGHT  OLDEST WAIT");
        assert_eq!(lines[1], "0      2       1          1.2s");
        assert_eq!(lines[2], "3      1       0          0.0s");
        assert_eq!(lines[3], "mm-0: 3 queued, 1 in flight");
        assert_eq!(lines[4], "");
        assert_eq!(
            lines[5],
            "MEMBER  LIVE  STATE     QUEUED  IN FLIGHT  MANIFESTS"
        );
        assert_eq!(lines[6], "mm-0    yes   active    2       1          10");
        assert_eq!(lines[7], "mm-1    yes   draining  -       -          -");
    }

    #[test]
    fn a_manifest_prints_as_a_table() {
        let answer = ManifestAnswer {
            namespace: "default".into(),
            name: "web".into(),
            uid: Some("0b7a4a2c-6a4f-4d0e-9a53-3c1f6a3e2b10".into()),
            shard: Some(4),
            owner: Some("mm-1".into()),
            state: Some(ManifestState::Ready),
            reason: Some("Ready".into()),
            message: None,
            source: ManifestSource::Api,
        };
        assert_eq!(
            manifest_table(&answer),
            "MANIFEST  default/web\nUID       0b7a4a2c-6a4f-4d0e-9a53-3c1f6a3e2b10\nSHARD     4\nOWNER     mm-1\nSTATE     Ready\nREASON    Ready\nMESSAGE   -\nFROM      the API server\n"
        );
    }

    #[test]
    fn the_drain_switch_prints_as_a_line() {
        assert!(drain_table(&DrainAnswer { draining: true }).starts_with("draining:"));
        assert!(drain_table(&DrainAnswer { draining: false }).starts_with("not draining:"));
        assert_eq!(
            serde_json::to_value(DrainAnswer { draining: true }).unwrap(),
            json!({"draining": true})
        );
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
        metrics
            .reconcile
            .reconciles
            .get_or_create(&ResultLabels {
                result: "error",
                category: "RenderError",
            })
            .inc();
        metrics.render.cache_hits.inc();
        metrics.queue.depth.set(7);
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
        assert!(body.contains("module_manager_queue_depth 7"), "{body}");
        assert!(!body.contains("# EOF"));
    }
}
