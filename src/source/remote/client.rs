//! The HTTP client of every request (repositories, registries, tokens, blobs): names resolved
//! to the addresses [`Reach`] allows, redirects only over http(s), never from https down to
//! http and each checked like a request, no proxy.

use std::time::Duration;

use super::config::RemoteConfig;
use super::error::FetchError;
use super::reach::Reach;
use super::shown::chain;

/// The HTTP client of every request: names resolved to allowed addresses only, at most
/// `max_redirects` redirects, each to where a request may go; no proxy (the address checked
/// must be the one connected to).
pub(super) fn client(config: &RemoteConfig, reach: &Reach) -> Result<reqwest::Client, FetchError> {
    let max_redirects = config.max_redirects;
    let checks = reach.clone();
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
        } else if let Err(refusal) = checks.check(attempt.url()) {
            attempt.error(refusal)
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .redirect(policy)
        .dns_resolver(reach.resolver())
        .no_proxy()
        .connect_timeout(config.timeout.min(Duration::from_secs(10)))
        .user_agent(crate::telemetry::requests::USER_AGENT)
        .build()
        .map_err(|e| FetchError::Reference(format!("HTTP client: {}", chain(&e))))
}
