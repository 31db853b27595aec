//! The command line's HTTP client of a replica's admin API, with its limits.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Method, header};
use serde::de::DeserializeOwned;

use crate::admin::ErrorAnswer;

/// Limit on one command-line request, connection to last byte.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Limit on `GET /v1/targets`, which lists every Manifest and reads every target's Secret (the
/// view's own deadline is 25 s, the admin server's limit on a request 30 s).
pub const TARGETS_TIMEOUT: Duration = Duration::from_secs(35);
/// Largest answer the command line reads.
pub const MAX_RESPONSE_BODY: usize = 16 << 20;

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
    fetch_within(base, method, path, token, FETCH_TIMEOUT).await
}

/// [`fetch`] within `timeout` instead of [`FETCH_TIMEOUT`].
pub async fn fetch_within<T: DeserializeOwned>(
    base: &str,
    method: Method,
    path: &str,
    token: Option<&str>,
    timeout: Duration,
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
    let (status, body) = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| {
            anyhow::anyhow!("{what} at {base}: no answer within {} s", timeout.as_secs())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::testing::{fleet, state};
    use crate::admin::{AdminState, DrainAnswer, ShardsAnswer, router, shards_answer};
    use crate::shard::fleet::ShardView;
    use crate::shard::membership::{MemberView, Members};
    use tokio::sync::watch;

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
}
