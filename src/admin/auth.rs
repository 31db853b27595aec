//! Who may flip the drain switch: the bearer token (TokenReview) and the caller's access to the
//! non-resource path (SubjectAccessReview), as kube-rbac-proxy does.

use axum::http::{HeaderMap, StatusCode, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::MAX_TOKEN_LENGTH;
use super::upstream::{api_call, api_permit};

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
/// not answer within [`API_TIMEOUT`](super::API_TIMEOUT)). Only tokens issued for the audience [`TOKEN_AUDIENCE`]
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
    // One permit for both reviews.
    let _permit = api_permit()?;
    let user = authenticate(client, token, path, verb).await?;
    check_access(client, &user, path, verb).await?;
    Ok(user)
}

/// The TokenReview: the user the token names, if the API server authenticated it for
/// [`TOKEN_AUDIENCE`]; else `401`.
async fn authenticate(
    client: &kube::Client,
    token: &str,
    path: &str,
    verb: &str,
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
            path,
            verb,
            "admin API: token not authenticated"
        );
        return Err((
            StatusCode::UNAUTHORIZED,
            "the token was not authenticated".to_owned(),
        ));
    };
    Ok(user)
}

/// The SubjectAccessReview: whether `user` may `verb` the non-resource `path`; else `403` with
/// the authorizer's reason.
async fn check_access(
    client: &kube::Client,
    user: &UserInfo,
    path: &str,
    verb: &str,
) -> Result<(), (StatusCode, String)> {
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
