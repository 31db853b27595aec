//! The capped HTTP client: redirects only over http(s) and never from https down to http, answers
//! read within a byte limit, the URLs it may be sent to, and transport errors in words.

use std::time::Duration;

use reqwest::Url;

use super::shown::{bounded_text, shown};
use super::{FetchError, RemoteCharts, RemoteConfig};

/// The HTTP client of every request: at most `max_redirects` redirects, the resolve's timeout.
pub(super) fn client(config: &RemoteConfig) -> Result<reqwest::Client, FetchError> {
    let max_redirects = config.max_redirects;
    let policy = reqwest::redirect::Policy::custom(move |attempt| {
        let from_https = attempt
            .previous()
            .last()
            .is_some_and(|u| u.scheme() == "https");
        if attempt.previous().len() > max_redirects {
            attempt.error(format!("more than {max_redirects} redirects"))
        } else if !matches!(attempt.url().scheme(), "http" | "https") {
            attempt.error("a redirect to a scheme other than http or https")
        } else if from_https && attempt.url().scheme() == "http" {
            attempt.error("a redirect from https to plain http")
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .redirect(policy)
        .timeout(config.timeout)
        .connect_timeout(config.timeout.min(Duration::from_secs(10)))
        .user_agent(concat!("module-manager/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| FetchError::Reference(format!("HTTP client: {}", chain(&e))))
}

impl RemoteCharts {
    /// GETs `url`, refusing more than `max` bytes.
    pub(super) async fn get_bounded(&self, url: &Url, max: u64) -> Result<Vec<u8>, FetchError> {
        let (body, _) = self
            .send_bounded(self.http.get(url.clone()), url, max)
            .await?;
        Ok(body)
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
        let mut response = request
            .send()
            .await
            .map_err(|e| request_error(&shown, e, self.config.timeout))?;
        let status = response.status();
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
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| request_error(&shown, e, self.config.timeout))?
        {
            if (body.len() + chunk.len()) as u64 > max {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body, headers))
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

pub(super) fn request_error(url: &str, error: reqwest::Error, timeout: Duration) -> FetchError {
    if error.is_timeout() {
        return FetchError::Timeout(timeout);
    }
    let redirect = error.is_redirect();
    let builder = error.is_builder();
    let reason = chain(&error.without_url());
    if redirect || builder {
        FetchError::Reference(format!("{url}: {reason}"))
    } else {
        FetchError::Unreachable {
            url: url.to_owned(),
            reason,
        }
    }
}

/// An error and its causes, `a: b: c`, without repeats, bounded.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = c.source();
    }
    bounded_text(&text)
}
