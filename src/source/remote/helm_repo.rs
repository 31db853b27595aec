//! Helm HTTP repositories: the `index.yaml` (parsed without expanding aliases), the chart and
//! version chosen from it, and the archive URL resolved as Helm does.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use reqwest::Url;
use serde::Deserialize;

use super::cache::{Fetcher, sha256_hex};
use super::credentials::Auth;
use super::http::checked_url;
use super::shown::{listing, shown};
use super::verify::{Trust, TrustedKeys, VerifyError};
use super::{FetchError, RemoteCharts};
use crate::source::{Limits, ResolvedChart, version};

/// A repository's `index.yaml`, the parts that are read.
#[derive(Debug, Deserialize)]
pub(super) struct Index {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    #[serde(default)]
    entries: HashMap<String, Vec<IndexEntry>>,
}

#[derive(Debug, Deserialize)]
struct IndexEntry {
    version: String,
    #[serde(default)]
    digest: Option<String>,
    #[serde(default)]
    urls: Vec<String>,
}

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

/// Parses an `index.yaml`. Anchors and aliases are refused before decoding: `helm repo index`
/// never writes them, and a decoder copies an alias's target at every use, so a small document
/// could expand to gigabytes. Errors say where and what kind, never quote the content (the body
/// may come from anywhere a redirect led).
fn parse_index(bytes: &[u8]) -> Result<Index, FetchError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| FetchError::BadIndex(format!("not UTF-8 (at byte {})", e.valid_up_to())))?;
    refuse_aliases(text)?;
    let index: Index = serde_yaml_ng::from_str(text).map_err(|e| {
        FetchError::BadIndex(match e.location() {
            Some(at) => format!(
                "not a Helm repository index (line {}, column {})",
                at.line(),
                at.column()
            ),
            None => "not a Helm repository index".into(),
        })
    })?;
    if index.api_version.as_deref().is_none_or(str::is_empty) {
        return Err(FetchError::BadIndex("no apiVersion".into()));
    }
    Ok(index)
}

/// Refuses any anchor or alias before decoding ([`crate::source::yaml::refuse_aliases`]).
fn refuse_aliases(text: &str) -> Result<(), FetchError> {
    crate::source::yaml::refuse_aliases(text).map_err(|e| {
        FetchError::BadIndex(match e {
            crate::source::yaml::YamlRefusal::Alias { line, column } => {
                format!("YAML anchors and aliases are not accepted (line {line}, column {column})")
            }
            other => other.to_string(),
        })
    })
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

    #[test]
    fn malformed_indexes_are_refused() {
        let good = b"apiVersion: v1\nentries:\n  web:\n  - version: 1.0.0\n    digest: abc\n    urls: [web-1.0.0.tgz]\n";
        assert_eq!(
            parse_index(good).unwrap().entries["web"][0].version,
            "1.0.0"
        );
        for bad in [
            &b"<html>not found</html>"[..],
            b"entries: {}\n",
            b"apiVersion: v1\nentries: [1, 2]\n",
            b"apiVersion: v1\nentries:\n  web:\n  - urls: [x]\n",
            b"apiVersion: v1\nentries: {web: [\n",
        ] {
            assert!(
                matches!(parse_index(bad), Err(FetchError::BadIndex(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// A small index whose aliases would expand to 1024 copies of a 64 KiB string (64 MiB;
    /// the same shape with a 7 MiB string and tens of thousands of aliases is hundreds of GB):
    /// refused before decoding, as is any anchor or alias.
    #[test]
    fn indexes_with_anchors_or_aliases_are_refused_unexpanded() {
        let mut bomb = format!(
            "apiVersion: v1\nx: &a \"{}\"\nentries:\n  web:\n",
            "v".repeat(64 << 10)
        );
        for _ in 0..1024 {
            bomb.push_str("  - {version: *a}\n");
        }
        assert!(bomb.len() < 100 << 10, "the document itself is small");
        let error = parse_index(bomb.as_bytes()).unwrap_err().to_string();
        assert!(
            error.contains("anchors and aliases are not accepted"),
            "{error}"
        );
        for other in [
            "apiVersion: v1\nentries:\n  web: &w\n  - version: 1.0.0\n",
            "apiVersion: v1\nbase: &b {version: 1.0.0}\nentries:\n  web:\n  - <<: *b\n",
        ] {
            let error = parse_index(other.as_bytes()).unwrap_err().to_string();
            assert!(error.contains("anchors and aliases"), "{other}: {error}");
        }
        // Nesting deeper than the decoder reads (its time is quadratic in the depth).
        let deep = format!("apiVersion: v1\nentries: {}", "[".repeat(1 << 20));
        let error = parse_index(deep.as_bytes()).unwrap_err().to_string();
        assert!(error.contains("nested deeper than 128 levels"), "{error}");
        // `&` and `*` inside scalars are text, not anchors.
        let plain = "apiVersion: v1\nentries:\n  web:\n  - version: 1.0.0\n    description: a & b *c\n    urls: [\"web.tgz?a=1&b=*\"]\n";
        assert_eq!(
            parse_index(plain.as_bytes()).unwrap().entries["web"].len(),
            1
        );
    }

    /// Errors say where, never what: the body may be anything a redirect reached.
    #[test]
    fn index_errors_quote_no_content() {
        for body in [
            &b"secret-token-1234"[..],
            b"{\"AccessKeyId\": \"secret-token-1234\"}",
            b"apiVersion: v1\nentries:\n  web:\n  - version: [secret-token-1234]\n",
            b"apiVersion: v1\nentries: {web: [secret-token-1234\n",
            b"\xff secret-token-1234",
        ] {
            let error = parse_index(body).unwrap_err().to_string();
            assert!(!error.contains("secret"), "{error}");
            assert!(
                error.contains("line") || error.contains("byte") || error.contains("apiVersion"),
                "{error}"
            );
        }
    }
}
