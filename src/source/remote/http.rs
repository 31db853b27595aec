//! Capped requests, over the client of `client.rs` (which checks every redirect): each only where
//! `Reach` allows, within what is left of its fetch's deadline, its answer read within a byte
//! limit, and transport errors that all read the same.

use std::time::Duration;

use reqwest::Url;
use tokio::time::Instant;

use super::charts::RemoteCharts;
use super::credentials::Auth;
use super::error::FetchError;
use super::reach::{authority, refusal_in};
use super::shown::{bounded_text, chain, shown};

tokio::task_local! {
    /// When the fetch under way must be done: each request gets what is left of it, so a
    /// server that trickles bytes or never answers ends the request, whichever request it is.
    static DEADLINE: Instant;
}

/// Runs `fetch` with a deadline `timeout` from now for its requests.
pub(super) async fn with_deadline<T>(timeout: Duration, fetch: impl Future<Output = T>) -> T {
    DEADLINE.scope(Instant::now() + timeout, fetch).await
}

impl RemoteCharts {
    /// A GET of `url` if a request may go there, bounded by what is left of the fetch's
    /// deadline (the whole timeout outside a fetch).
    pub(super) fn get(&self, url: &Url) -> Result<reqwest::RequestBuilder, FetchError> {
        self.reach.check(url)?;
        let left = DEADLINE
            .try_with(|deadline| deadline.saturating_duration_since(Instant::now()))
            .unwrap_or(self.config.timeout);
        if left.is_zero() {
            return Err(FetchError::Timeout(self.config.timeout));
        }
        Ok(self.http.get(url.clone()).timeout(left))
    }

    /// GETs `url`, refusing more than `max` bytes; with `auth` when `url` is on `origin`'s
    /// host (scheme, host and port), the host the credentials are for. The HTTP client drops
    /// the `Authorization` header on a redirect to another host, port or scheme (reqwest's
    /// `remove_sensitive_headers`).
    pub(super) async fn get_bounded(
        &self,
        url: &Url,
        auth: Option<(&Auth, &Url)>,
        max: u64,
    ) -> Result<Vec<u8>, FetchError> {
        let mut request = self.get(url)?;
        let auth = auth.filter(|(_, origin)| same_origin(url, origin));
        if let Some((auth, _)) = auth {
            request = auth.authorize(request);
        }
        match self.send_bounded(request, url, max).await {
            Ok((body, _)) => Ok(body),
            Err(error) => Err(match auth {
                Some(_) => error.credentials_sent_to(&authority(url)),
                None => error,
            }),
        }
    }

    /// Sends `request` (for `url`), refusing an answer of more than `max` bytes; returns the
    /// body and the headers.
    pub(super) async fn send_bounded(
        &self,
        request: reqwest::RequestBuilder,
        url: &Url,
        max: u64,
    ) -> Result<(Vec<u8>, reqwest::header::HeaderMap), FetchError> {
        let shown = shown(url);
        let mut response = request.send().await.map_err(|e| request_error(url, e))?;
        let status = response.status();
        if matches!(status.as_u16(), 401 | 403) {
            return Err(FetchError::Unauthorized {
                host: authority(response.url()),
                status: status.as_u16(),
                sent: false,
            });
        }
        if !status.is_success() {
            return Err(FetchError::Status {
                url: shown,
                status: status.as_u16(),
            });
        }
        let too_large = || FetchError::TooLarge {
            what: shown.clone(),
            limit: max,
        };
        if response.content_length().is_some_and(|length| length > max) {
            return Err(too_large());
        }
        let headers = response.headers().clone();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| request_error(url, e))? {
            if (body.len() + chunk.len()) as u64 > max {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body, headers))
    }
}

/// Whether `a` and `b` have the same scheme, host and port: where credentials for `b` may go.
pub(super) fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

impl FetchError {
    /// A refusal by `host`, the host credentials were sent to, says they were (a refusal by
    /// another host, reached by a redirect, did not get them).
    pub(super) fn credentials_sent_to(self, host: &str) -> Self {
        match self {
            Self::Unauthorized {
                host: refused,
                status,
                ..
            } => Self::Unauthorized {
                sent: refused == host,
                host: refused,
                status,
            },
            other => other,
        }
    }
}

pub(super) fn checked_url(url: Url, what: &str) -> Result<Url, FetchError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(FetchError::Reference(format!(
            "the {what} URL has scheme {:?}; only http and https are supported",
            bounded_text(url.scheme())
        )));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(FetchError::Reference(format!(
            "the {what} URL carries credentials, which are not supported (they would show in \
             status and logs)"
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(FetchError::Reference(format!("the {what} URL has no host")));
    }
    Ok(url)
}

/// What a failed request (for `url`) reads as: a refused host or scheme as such; a redirect
/// the policy refused in its words; anything else — refused, reset, DNS, TLS, a timeout, an
/// answer that is not HTTP — as one message naming the host, the cause logged at debug only
/// (so that a Manifest's author cannot tell an open internal port from a closed one).
pub(super) fn request_error(url: &Url, error: reqwest::Error) -> FetchError {
    if let Some(refusal) = refusal_in(&error) {
        return FetchError::Refused(refusal);
    }
    let at = error.url().unwrap_or(url).clone();
    if error.is_redirect() || error.is_builder() {
        return FetchError::Reference(format!("{}: {}", shown(&at), chain(&error.without_url())));
    }
    tracing::debug!(url = %shown(&at), error = %chain(&error.without_url()), "a chart host could not be reached");
    FetchError::Unreachable {
        host: authority(&at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_whether_credentials_went_to_the_host_that_refused() {
        let refused = |host: &str| FetchError::Unauthorized {
            host: host.into(),
            status: 401,
            sent: false,
        };
        let sent = refused("charts.example.com").credentials_sent_to("charts.example.com");
        assert!(sent.is_permanent());
        assert_eq!(
            sent.to_string(),
            "authentication to charts.example.com failed (HTTP 401): check spec.chart.secretRef"
        );
        // Redirected to a CDN, which got none.
        let elsewhere = refused("cdn.example.net").credentials_sent_to("charts.example.com");
        assert!(elsewhere.to_string().starts_with(
            "cdn.example.net asks for credentials (HTTP 401): set spec.chart.secretRef"
        ));
        let url = |text: &str| reqwest::Url::parse(text).unwrap();
        let origin = url("https://charts.example.com/stable");
        assert!(same_origin(
            &url("https://charts.example.com:443/x.tgz"),
            &origin
        ));
        for other in [
            "http://charts.example.com/x.tgz",
            "https://charts.example.com:8443/x.tgz",
            "https://cdn.example.com/x.tgz",
        ] {
            assert!(!same_origin(&url(other), &origin), "{other}");
        }
    }
}
