//! `GET /v1/targets`, the endpoint: its query, its authorization, and the reads the view is
//! folded from (`targets.rs`) — every Manifest of the fleet, page by page, and each target's
//! kubeconfig Secret — within bounds: one view at a time per replica, a few Secret reads at
//! once, one deadline for all of it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use tokio::sync::Semaphore;

use super::auth::{Access, authorize};
use super::errors::{ApiError, error};
use super::names::{is_dns_label, is_dns_subdomain};
use super::server::Source;
use super::state::{AdminState, TARGETS_PATH};
use super::targets::{SecretFacts, Targets, TargetsAnswer, budget_uses, cut};
use super::upstream::{Pool, api_call, api_permit};
use crate::api::Manifest;
use crate::apply::kubeconfig::{parse, validate};
use crate::apply::target::SecretKey;
use crate::shard::membership::MAX_PUBLISHED_TARGETS;

/// Manifests per page (the watches list 100 at a time too): a page is what the view holds of
/// the Manifests at once.
const PAGE: u32 = 100;
/// Secrets read at once.
const SECRETS_AT_ONCE: usize = 8;
/// The whole view's deadline, below the admin server's 30 s per request: past it the answer is
/// `504`, not a connection closed without a word.
const DEADLINE: Duration = Duration::from_secs(25);
/// Rows answered by default, and at most (the counts always cover every target).
const ROWS: usize = 1000;
const MOST_ROWS: usize = 10_000;

/// One view at a time per replica: each holds one of the reads' permits and sends up to
/// [`SECRETS_AT_ONCE`] requests; another caller meanwhile gets `429`.
static VIEWS: Semaphore = Semaphore::const_new(1);

/// The query of `GET /v1/targets`.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct TargetsQuery {
    /// Only the failing targets and those whose credential is due.
    #[serde(default)]
    failing: bool,
    /// Only the Manifests (and Secrets) of this namespace.
    namespace: Option<String>,
    /// Most rows in the answer (default 1000, at most 10,000).
    limit: Option<usize>,
    /// Manifests per page (1–100; tests use small pages).
    page: Option<u32>,
}

/// `GET /v1/targets`: the fleet's remote targets (of this fleet's Manifests: its
/// `--manifest-selector`), for a caller who may `get` the non-resource path `/v1/targets`.
pub(super) async fn targets(
    State(state): State<AdminState>,
    Source(source): Source,
    headers: HeaderMap,
    query: Result<Query<TargetsQuery>, QueryRejection>,
) -> Result<Json<TargetsAnswer>, ApiError> {
    let Query(query) = query.map_err(|e| error(StatusCode::BAD_REQUEST, e.body_text()))?;
    if query
        .namespace
        .as_deref()
        .is_some_and(|ns| !is_dns_label(ns))
    {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "the namespace must be a DNS label (lowercase letters, digits and '-', at most 63)",
        ));
    }
    let limit = query.limit.unwrap_or(ROWS);
    let page = query.page.unwrap_or(PAGE);
    if !(1..=MOST_ROWS).contains(&limit) || !(1..=PAGE).contains(&page) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "limit must be 1 to 10000 and page 1 to 100",
        ));
    }
    let access = Access::Path {
        path: TARGETS_PATH,
        verb: "get",
    };
    authorize(&state, source, &headers, access, Pool::Reads).await?;
    let client = state.client.clone().ok_or_else(|| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this replica has no API client to list the Manifests with",
        )
    })?;
    let _view = VIEWS.try_acquire().map_err(|_| {
        error(
            StatusCode::TOO_MANY_REQUESTS,
            "another targets view is being computed on this replica; retry shortly",
        )
    })?;
    let _permit = api_permit(Pool::Reads)?;
    let view = async {
        let targets = fold(&client, &state, query.namespace.as_deref(), page).await?;
        let keys: Vec<SecretKey> = targets.keys().cloned().collect();
        let secrets = secret_facts(&client, keys).await;
        let uses = budget_uses(&state.members.borrow(), state.target_budget);
        let now = SystemTime::now();
        let mut answer = targets.answer(&secrets, &uses, now, query.failing, limit);
        answer.budget_per_minute = (state.target_budget.qps * 60.0).round() as u64;
        answer.budget_listed_per_replica = MAX_PUBLISHED_TARGETS as u64;
        Ok::<_, ApiError>(answer)
    };
    match tokio::time::timeout(DEADLINE, view).await {
        Ok(answer) => Ok(Json(answer?)),
        Err(_) => Err(error(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "the targets view took longer than {} s (every Manifest and every target's Secret are read); ask for one namespace (?namespace=)",
                DEADLINE.as_secs()
            ),
        )),
    }
}

/// Every Manifest of this fleet (of `namespace`, if given), folded page by page.
async fn fold(
    client: &kube::Client,
    state: &AdminState,
    namespace: Option<&str>,
    page: u32,
) -> Result<Targets, ApiError> {
    let manifests = match namespace {
        Some(namespace) => Api::<Manifest>::namespaced(client.clone(), namespace),
        None => Api::<Manifest>::all(client.clone()),
    };
    let mut params = ListParams::default().limit(page);
    if let Some(selector) = &state.manifest_selector {
        params = params.labels(selector);
    }
    let mut targets = Targets::default();
    loop {
        let listed = api_call("list Manifests", manifests.list(&params)).await?;
        listed.items.iter().for_each(|m| targets.add(m));
        match listed.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(targets),
        }
    }
}

/// What each target's kubeconfig Secret says: each Secret read once (one GET, a few at once),
/// each of its keys checked as a pass would; a name that is no Secret's is not read.
async fn secret_facts(
    client: &kube::Client,
    keys: Vec<SecretKey>,
) -> BTreeMap<SecretKey, SecretFacts> {
    let mut by_secret: BTreeMap<(String, String), Vec<SecretKey>> = BTreeMap::new();
    for key in keys {
        let secret = (key.namespace.clone(), key.name.clone());
        by_secret.entry(secret).or_default().push(key);
    }
    let reads = futures::stream::iter(by_secret).map(|((namespace, name), keys)| async move {
        let read = if is_dns_subdomain(&name) {
            let secrets = Api::<Secret>::namespaced(client.clone(), &namespace);
            api_call("get Secret", secrets.get_opt(&name)).await
        } else {
            Err((StatusCode::BAD_REQUEST, "not a Secret's name".to_owned()))
        };
        keys.into_iter()
            .map(|key| {
                let facts = facts_of(&read, &key);
                (key, facts)
            })
            .collect::<Vec<_>>()
    });
    let read: Vec<Vec<(SecretKey, SecretFacts)>> =
        reads.buffer_unordered(SECRETS_AT_ONCE).collect().await;
    read.into_iter().flatten().collect()
}

/// What a Secret as read says of one of its keys.
fn facts_of(read: &Result<Option<Secret>, (StatusCode, String)>, key: &SecretKey) -> SecretFacts {
    let secret = match read {
        Err((_, problem)) => return SecretFacts::Problem(cut(problem)),
        Ok(None) => return SecretFacts::Problem(format!("Secret {} not found", key.name)),
        Ok(Some(secret)) => secret,
    };
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(&key.key)) else {
        return SecretFacts::Problem(cut(&format!("Secret {} has no key {}", key.name, key.key)));
    };
    match parse(&bytes.0).and_then(|k| validate(&k).map_err(|r| r.to_string())) {
        Ok(valid) => SecretFacts::Valid {
            credential: valid.credential_validity(),
            server: cut(&valid.server),
        },
        Err(problem) => SecretFacts::Problem(cut(&format!("kubeconfig refused: {problem}"))),
    }
}
