//! Who may flip the drain switch, see the fleet's targets or read a Manifest's details: the
//! bearer token (TokenReview, its answer kept briefly and failed ones limited: `reviews.rs`) and
//! the caller's access (SubjectAccessReview, asked every time) to the non-resource path
//! (`/v1/drain`, `/v1/targets`), or to `get` that Manifest, as kube-rbac-proxy does.

use std::net::IpAddr;

use axum::http::{HeaderMap, StatusCode, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::errors::ApiError;
use super::reviews::{Reviewed, Reviews, TokenKey};
use super::state::AdminState;
use super::upstream::{Pool, api_call, api_permit};

/// Longest bearer token accepted.
pub const MAX_TOKEN_LENGTH: usize = 8192;

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

/// What a caller asks to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access<'a> {
    /// `verb` (the lowercase HTTP method, as kube-rbac-proxy does) on a non-resource `path`.
    Path {
        /// The path, e.g. `/v1/drain`.
        path: &'a str,
        /// The verb, e.g. `post`.
        verb: &'a str,
    },
    /// `get` one Manifest (what `kubectl get manifest -n NAMESPACE NAME` needs).
    GetManifest {
        /// Its namespace.
        namespace: &'a str,
        /// Its name.
        name: &'a str,
    },
}

impl Access<'_> {
    /// The access as a SubjectAccessReview asks it.
    fn attributes(&self) -> (Option<NonResourceAttributes>, Option<ResourceAttributes>) {
        use kube::Resource;
        match *self {
            Self::Path { path, verb } => (
                Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some(verb.to_owned()),
                }),
                None,
            ),
            Self::GetManifest { namespace, name } => (
                None,
                Some(ResourceAttributes {
                    group: Some(crate::api::Manifest::group(&()).into_owned()),
                    resource: Some(crate::api::Manifest::plural(&()).into_owned()),
                    verb: Some("get".to_owned()),
                    namespace: Some(namespace.to_owned()),
                    name: Some(name.to_owned()),
                    ..Default::default()
                }),
            ),
        }
    }
}

impl std::fmt::Display for Access<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Path { path, verb } => write!(f, "{verb} {path}"),
            Self::GetManifest { namespace, name } => {
                write!(
                    f,
                    "get manifests.modulemanager.io {name:?} in namespace {namespace:?}"
                )
            }
        }
    }
}

/// Authenticates the request's bearer token (TokenReview) and authorizes the user for `access`
/// (SubjectAccessReview with the reviewed user, groups, uid and extra), with permits from
/// `pool`. Answers the user, or the status to refuse with: `401` (no, malformed or rejected
/// token), `403` (not allowed), `503` (no API client), `429` (too many reviews of the pool at
/// once, or too many failed authentications from `source` or from everyone: with
/// `Retry-After`), `502`/`504` (the API server failed or did not answer within
/// [`API_TIMEOUT`](super::API_TIMEOUT)). A token's review is reused for a while (a refused token
/// costs no permit then). Only tokens issued for the audience [`TOKEN_AUDIENCE`] are accepted
/// (`kubectl create token NAME --audience module-manager`): a caller never hands a token the API
/// server itself would accept to this endpoint. The token is never logged nor kept (only its
/// hash).
pub async fn authorize(
    state: &AdminState,
    source: Option<IpAddr>,
    headers: &HeaderMap,
    access: Access<'_>,
    pool: Pool,
) -> Result<UserInfo, ApiError> {
    let token = bearer_token(headers)?;
    let client = state.client.as_ref().ok_or_else(|| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "this replica has no API client to authenticate callers".to_owned(),
        )
    })?;
    let key = TokenKey::of(token);
    let cached = state.reviews.cached(&key);
    if cached == Some(Reviewed::Refused) {
        return Err(not_authenticated().into());
    }
    // One permit for both reviews.
    let _permit = api_permit(pool)?;
    let user = match cached {
        Some(Reviewed::Authenticated(user)) => user,
        _ => review(client, &state.reviews, (key, token), source, &access).await?,
    };
    check_access(client, &user, &access).await?;
    Ok(user)
}

/// Sends the TokenReview of `token` if the buckets of failed reviews allow it (`429` else), and
/// remembers its answer; a failed call is not remembered.
async fn review(
    client: &kube::Client,
    reviews: &Reviews,
    (key, token): (TokenKey, &str),
    source: Option<IpAddr>,
    access: &Access<'_>,
) -> Result<UserInfo, ApiError> {
    let charge = reviews.charge(source)?;
    match authenticate(client, token, access).await {
        Ok(user) => {
            reviews.remember(key, charge, Reviewed::Authenticated(user.clone()));
            Ok(user)
        }
        Err((StatusCode::UNAUTHORIZED, message)) => {
            reviews.remember(key, charge, Reviewed::Refused);
            Err((StatusCode::UNAUTHORIZED, message).into())
        }
        // The API server failed: the review counts against the buckets all the same.
        Err(other) => Err(other.into()),
    }
}

/// What a token that was not authenticated reads as.
fn not_authenticated() -> (StatusCode, String) {
    (
        StatusCode::UNAUTHORIZED,
        "the token was not authenticated".to_owned(),
    )
}

/// The TokenReview: the user the token names, if the API server authenticated it for
/// [`TOKEN_AUDIENCE`]; else `401`.
async fn authenticate(
    client: &kube::Client,
    token: &str,
    access: &Access<'_>,
) -> Result<UserInfo, (StatusCode, String)> {
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
            access = %access,
            "admin API: token not authenticated"
        );
        return Err(not_authenticated());
    };
    Ok(user)
}

/// The SubjectAccessReview: whether `user` has `access`; else `403` with the authorizer's
/// reason.
async fn check_access(
    client: &kube::Client,
    user: &UserInfo,
    access: &Access<'_>,
) -> Result<(), (StatusCode, String)> {
    let username = user.username.clone().unwrap_or_default();
    let (non_resource_attributes, resource_attributes) = access.attributes();
    let access_review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            non_resource_attributes,
            resource_attributes,
        },
        ..Default::default()
    };
    let decided = api_call(
        "SubjectAccessReview",
        Api::<SubjectAccessReview>::all(client.clone())
            .create(&PostParams::default(), &access_review),
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
        tracing::info!(user = %username, access = %access, "admin API: access denied");
        return Err((
            StatusCode::FORBIDDEN,
            format!("user {username:?} may not {access}{reason}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

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
}
