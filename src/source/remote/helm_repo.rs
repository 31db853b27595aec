//! Helm HTTP repositories: the `index.yaml` (fetched and kept for `index_ttl`; read by
//! `index.rs`), the chart and version chosen from it, and the archive URL resolved as Helm does.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use reqwest::Url;

use super::cache::{Fetcher, sha256_hex};
use super::charts::RemoteCharts;
use super::credentials::Auth;
use super::error::FetchError;
use super::http::checked_url;
use super::index::{Index, parse_index};
use super::shown::{listing, shown};
use super::verify::{Trust, TrustedKeys, VerifyError};
use crate::source::{Limits, ResolvedChart, version};

impl RemoteCharts {
    /// The chart `name` at `requested` from the repository; `auth` goes with the requests to
    /// the repository's own host (scheme, host and port) only — the index, and chart URLs
    /// there — never to chart URLs on another host (Flux's `passCredentials: false`).
    pub(super) async fn fetch_from_repository(
        &self,
        repository: &str,
        name: &str,
        requested: &str,
        auth: Option<&Auth>,
        limits: Limits,
        trust: Option<&Trust>,
    ) -> Result<ResolvedChart, FetchError> {
        let base = repository_url(repository)?;
        // Every resolve reads the index with its own credentials (or from the index cache
        // under the same credentials), and an archive comes from the disk cache only when the
        // same chart URL with the same credentials downloaded it (`cache.rs`).
        let index = self.index(&base, auth).await?;
        let entries = index.entries.get(name).ok_or_else(|| {
            // Names from the server are shown only when they are chart names.
            let mut names: Vec<&str> = index
                .entries
                .keys()
                .map(String::as_str)
                .filter(|n| is_chart_name(n))
                .collect();
            names.sort_unstable();
            FetchError::NoChart {
                name: name.to_owned(),
                available: format!("{} charts: {}", index.entries.len(), listing(&names)),
            }
        })?;
        let chosen = version::select(requested, entries.iter().map(|e| e.version.as_str()))
            .map_err(|reason| FetchError::BadVersion {
                requested: requested.to_owned(),
                reason,
            })?
            .ok_or_else(|| {
                let mut versions: Vec<_> = entries
                    .iter()
                    .filter_map(|e| Some((version::parse_version(&e.version)?, &e.version)))
                    .collect();
                versions.sort_by(|a, b| b.0.cmp_precedence(&a.0));
                let shown: Vec<&str> = versions.iter().map(|(_, v)| v.as_str()).collect();
                FetchError::NoVersion {
                    requested: requested.to_owned(),
                    available: listing(&shown),
                }
            })?;
        let entry = entries
            .iter()
            .find(|e| e.version == chosen)
            .expect("select returns a candidate");
        let digest = entry.digest.as_deref().ok_or_else(|| {
            FetchError::BadDigest(format!(
                "index.yaml has no digest for version {chosen} (it is required)"
            ))
        })?;
        let hex = sha256_hex(digest)?;
        let url = entry
            .urls
            .first()
            .ok_or_else(|| FetchError::BadIndex(format!("version {chosen} has no urls")))?;
        let url = chart_url(&base, url)?;
        // The provenance file signs the digest the archive (cached or downloaded) is checked
        // against.
        if let Some(trust) = trust {
            let TrustedKeys::Helm(keys) = &trust.keys else {
                return Err(VerifyError::Provider("cosign", "oci charts").into());
            };
            let auth = auth.map(|a| (a, &base));
            self.verify_provenance(&url, auth, &hex, keys, &trust.from)
                .await?;
        }
        let fetcher = Fetcher::new(url.as_str(), auth);
        if let Some(chart) = self.cached(&hex, &fetcher, limits).await? {
            return Ok(chart);
        }
        let bytes = self
            .get_bounded(&url, auth.map(|a| (a, &base)), limits.max_bytes)
            .await?;
        self.counters
            .archive_downloads
            .fetch_add(1, Ordering::Relaxed);
        self.verify_and_store(shown(&url), bytes, hex, fetcher, limits)
            .await
    }

    /// The repository's index, from memory when fetched less than `index_ttl` ago with the
    /// same query and the same credentials. Kept by URL without the query (one entry per
    /// repository path: queries cannot multiply entries) and the credentials' fingerprint
    /// (an index fetched with credentials is not another's proof of access), weighed by its
    /// bytes.
    async fn index(&self, base: &Url, auth: Option<&Auth>) -> Result<Arc<Index>, FetchError> {
        let url = index_url(base);
        let mut key = url.clone();
        key.set_query(None);
        let fingerprint = auth.map_or("anonymous", |a| a.fingerprint.as_str());
        let key = format!("{} {fingerprint}", key.as_str());
        let query = url.query().map(str::to_owned);
        if let Some((fetched_with, index)) = self.indexes.get(&key)
            && fetched_with == query
        {
            return Ok(index);
        }
        let bytes = self
            .get_bounded(&url, auth.map(|a| (a, base)), self.config.max_index_bytes)
            .await?;
        self.counters
            .index_downloads
            .fetch_add(1, Ordering::Relaxed);
        let weight = bytes.len() as u64;
        let index = tokio::task::spawn_blocking(move || parse_index(&bytes))
            .await
            .map_err(|e| FetchError::BadIndex(e.to_string()))??;
        let index = Arc::new(index);
        let ttl = self.config.index_ttl;
        self.indexes.put(key, (query, index.clone()), ttl, weight);
        Ok(index)
    }
}

/// Parses a repository URL: http or https, a host, no credentials.
fn repository_url(text: &str) -> Result<Url, FetchError> {
    let url = Url::parse(text)
        .map_err(|e| FetchError::Reference(format!("the repository is not a URL: {e}")))?;
    checked_url(url, "repository")
}

/// `<repository>/index.yaml` (one slash between them, as Helm does).
fn index_url(base: &Url) -> Url {
    let mut url = base.clone();
    let path = format!("{}/index.yaml", base.path().trim_end_matches('/'));
    url.set_path(&path);
    url
}

/// A chart URL from the index: absolute, or relative to the repository URL taken as a
/// directory and with the repository URL's query, as Helm's `ResolveReferenceURL` does.
fn chart_url(base: &Url, reference: &str) -> Result<Url, FetchError> {
    let bad = |e: url::ParseError| {
        FetchError::BadIndex(format!("a chart URL of the version is not a URL: {e}"))
    };
    let url = match Url::parse(reference) {
        Ok(absolute) => absolute,
        Err(url::ParseError::RelativeUrlWithoutBase) => {
            let mut directory = base.clone();
            directory.set_path(&format!("{}/", base.path().trim_end_matches('/')));
            let mut url = directory.join(reference).map_err(bad)?;
            url.set_query(base.query());
            url
        }
        Err(e) => return Err(bad(e)),
    };
    checked_url(url, "chart")
}

/// What Helm accepts as a chart name (letters, digits, `-`, `_`, `.`; at most 250 characters).
fn is_chart_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 250
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_urls_are_http_without_credentials() {
        assert!(repository_url("https://charts.example.com/stable").is_ok());
        assert!(repository_url("http://127.0.0.1:8080").is_ok());
        for bad in [
            "file:///etc",
            "ftp://example.com/charts",
            "https://user:secret@example.com/charts",
            "not a url",
            "oci://example.com/charts",
        ] {
            let error = repository_url(bad).unwrap_err().to_string();
            assert!(!error.contains("secret"), "{error}");
            assert!(FetchError::Reference(error).is_permanent());
        }
    }

    #[test]
    fn index_and_chart_urls_resolve_as_helm_does() {
        let base = repository_url("https://example.com/charts").unwrap();
        let slash = repository_url("https://example.com/charts/").unwrap();
        assert_eq!(
            index_url(&base).as_str(),
            "https://example.com/charts/index.yaml"
        );
        assert_eq!(index_url(&slash), index_url(&base));
        let root = repository_url("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            index_url(&root).as_str(),
            "http://127.0.0.1:8080/index.yaml"
        );
        for base in [&base, &slash] {
            assert_eq!(
                chart_url(base, "web-1.0.0.tgz").unwrap().as_str(),
                "https://example.com/charts/web-1.0.0.tgz"
            );
            assert_eq!(
                chart_url(base, "../other/web-1.0.0.tgz").unwrap().as_str(),
                "https://example.com/other/web-1.0.0.tgz"
            );
        }
        assert_eq!(
            chart_url(&base, "https://cdn.example.org/web-1.0.0.tgz?sig=abc")
                .unwrap()
                .as_str(),
            "https://cdn.example.org/web-1.0.0.tgz?sig=abc"
        );
        // The repository's query goes with relative chart URLs only (Helm does the same).
        let with_query = repository_url("https://example.com/charts?key=k").unwrap();
        assert_eq!(
            index_url(&with_query).as_str(),
            "https://example.com/charts/index.yaml?key=k"
        );
        assert_eq!(
            chart_url(&with_query, "web-1.0.0.tgz").unwrap().as_str(),
            "https://example.com/charts/web-1.0.0.tgz?key=k"
        );
        assert_eq!(
            chart_url(&with_query, "https://cdn.example.org/web.tgz")
                .unwrap()
                .as_str(),
            "https://cdn.example.org/web.tgz"
        );
        assert!(chart_url(&base, "file:///etc/passwd").is_err());
        assert!(chart_url(&base, "http://u:p@example.com/x.tgz").is_err());
    }
}
