//! Remote chart sources: Helm HTTP repositories (`spec.chart.repository` + `name` + `version`)
//! and OCI registries (`spec.chart.oci`).
//!
//! The network part is async; hashing, the archive checks (the same as for a local `.tgz`) and
//! the disk cache run on blocking threads. A verified archive is cached on disk under its sha256
//! digest, so a later resolve of the same chart downloads nothing but the (briefly cached)
//! `index.yaml` or the OCI manifest. See `docs/reconcile.md` for the bounds and the errors.
//!
//! One file per concern: the capped HTTP client (`http.rs`), where it may connect (`reach.rs`,
//! over the address classifier of `address.rs`), Helm repositories (`helm_repo.rs`), OCI
//! registries (`oci.rs`), the credentials of `spec.chart.secretRef` (`credentials.rs`), the disk
//! cache (`cache.rs`), the in-memory TTL cache (`recent.rs`), what may be shown of a URL
//! (`shown.rs`), and signature verification (`spec.chart.verify`: the keys in `verify.rs`,
//! cosign signatures in `cosign.rs`, Helm provenance in `provenance.rs`).

mod address;
mod cache;
mod cosign;
mod credentials;
mod helm_repo;
mod http;
mod oci;
mod provenance;
mod reach;
mod recent;
mod shown;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

use self::cache::{ChartCache, Fetcher, IN_USE};
use self::helm_repo::Index;
use self::reach::Reach;
use self::recent::Recent;
use self::shown::{shown_reference, shown_url};
use self::verify::{Trust, trusted_keys};
use super::archive::{Budget, check_archive};
use super::{ContentError, Limits, ResolvedChart, SourceError};
use crate::api::ChartSource;

pub use self::address::{Cidr, Reserved};
pub use self::credentials::{Credentials, CredentialsError};
pub use self::oci::{HELM_CHART_MEDIA_TYPE, HELM_CONFIG_MEDIA_TYPE, HELM_PROVENANCE_MEDIA_TYPE};
pub use self::reach::Refusal;
pub use self::verify::{KeyMaterial, VerifyError};

/// Most `index.yaml` documents kept in memory (the oldest is dropped).
const MAX_CACHED_INDEXES: usize = 64;
/// Most OCI references whose layer digest is kept in memory.
const MAX_CACHED_REFERENCES: usize = 1024;
/// How much longer than the fetch timeout a fetch may take before it is given up on whatever
/// it is doing (its requests end at the timeout).
const BACKSTOP: Duration = Duration::from_secs(5);

/// How remote charts are fetched and cached.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// Directory of the verified archives, `sha256-<hex>.tgz`.
    pub cache_dir: PathBuf,
    /// Most bytes of archives kept in `cache_dir`; the least recently used go first.
    pub cache_max_bytes: u64,
    /// Limit on one resolve (index or manifest, archive, checks) from start to end.
    pub timeout: Duration,
    /// How long a fetched `index.yaml` is reused before it is fetched again.
    pub index_ttl: Duration,
    /// Most bytes of an `index.yaml`.
    pub max_index_bytes: u64,
    /// Most bytes of `index.yaml` documents (as downloaded) kept in memory, of at most 64.
    pub index_cache_max_bytes: u64,
    /// Most HTTP redirects followed per request.
    pub max_redirects: usize,
    /// Registries (`host` or `host:port`) spoken to over plain HTTP; loopback ones always are.
    pub insecure_registries: Vec<String>,
    /// Reserved ranges (loopback, private, link-local, …) chart hosts may still be in; none by
    /// default: every request, redirect and token realm goes to public addresses only.
    pub allowed_private: Vec<Cidr>,
    /// Whether plain `http://` is allowed for every host (otherwise only for the registries of
    /// `insecure_registries` and loopback ones).
    pub allow_plain_http: bool,
}

impl RemoteConfig {
    /// The defaults, with archives cached in `cache_dir`.
    pub fn new(cache_dir: PathBuf) -> Self {
        Self {
            cache_dir,
            cache_max_bytes: 1024 * 1024 * 1024,
            timeout: Duration::from_secs(60),
            index_ttl: Duration::from_secs(60),
            max_index_bytes: 8 * 1024 * 1024,
            index_cache_max_bytes: 32 * 1024 * 1024,
            max_redirects: 5,
            insecure_registries: Vec::new(),
            allowed_private: Vec::new(),
            allow_plain_http: false,
        }
    }
}

/// Why a remote chart could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// the URL or reference in the spec is unusable.
    #[error("{0}")]
    Reference(String),
    /// the host could not be reached or did not answer in time: refused, reset, DNS, TLS, a
    /// timeout and an answer that is not HTTP all read the same (the cause is logged at debug),
    /// so that a Manifest's status cannot map which internal ports are open.
    #[error("{host} could not be reached or did not answer in time")]
    Unreachable {
        /// `host[:port]` of the request that failed.
        host: String,
    },
    /// the repository or registry refused the request (401, 403): credentials are missing or
    /// wrong. Never quotes them.
    #[error("{}", unauthorized(host, *status, *sent))]
    Unauthorized {
        /// `host[:port]` that refused.
        host: String,
        /// The HTTP status.
        status: u16,
        /// Whether credentials were sent with the request.
        sent: bool,
    },
    /// the credentials of `spec.chart.secretRef` do not fit the source.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// the request was not sent: its host or scheme is not allowed.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// the server answered with an error status.
    #[error("{url} answered HTTP {status}")]
    Status {
        /// The URL, without credentials or query.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// the fetch did not finish in time.
    #[error("the fetch did not finish within {0:?}")]
    Timeout(Duration),
    /// a download exceeds its limit.
    #[error("{what} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// What was downloaded.
        what: String,
        /// The limit.
        limit: u64,
    },
    /// `index.yaml` is not a Helm repository index.
    #[error("malformed index.yaml: {0}")]
    BadIndex(String),
    /// the repository does not have the chart.
    #[error("the repository has no chart {name:?} (it has {available})")]
    NoChart {
        /// The chart asked for.
        name: String,
        /// Some of the charts it has.
        available: String,
    },
    /// no version of the chart matches.
    #[error("no version matches {requested:?} (available: {available})")]
    NoVersion {
        /// The version or range asked for.
        requested: String,
        /// The newest versions there are.
        available: String,
    },
    /// the version is neither one in the index nor a valid constraint.
    #[error("version {requested:?} is not a version of the chart nor a valid range: {reason}")]
    BadVersion {
        /// The version or range asked for.
        requested: String,
        /// What is wrong with it.
        reason: String,
    },
    /// a digest is missing or not a sha256 digest.
    #[error("{0}")]
    BadDigest(String),
    /// the downloaded bytes do not have the published digest.
    #[error("digest mismatch: expected sha256:{expected}, downloaded sha256:{actual}")]
    DigestMismatch {
        /// The published digest.
        expected: String,
        /// The digest of what was downloaded.
        actual: String,
    },
    /// the OCI artifact is not a Helm chart.
    #[error("{0}")]
    MediaType(String),
    /// the registry refused or failed.
    #[error("registry: {message}")]
    Registry {
        /// What the registry said (bounded).
        message: String,
        /// Whether trying again may help.
        transient: bool,
    },
    /// the archive failed the chart checks.
    #[error(transparent)]
    Chart(ContentError),
    /// the chart's signature was not accepted (`spec.chart.verify`).
    #[error("signature verification failed: {0}")]
    Verification(#[from] VerifyError),
    /// storing the archive would take the chart cache past its cap.
    #[error(
        "the chart cache cannot take a {needed}-byte archive: its cap is {limit} bytes \
         (--chart-cache-max-bytes), {in_use} of them held by charts used in the last 10 minutes"
    )]
    CacheFull {
        /// Bytes of the archive (and of its list of fetchers, 65 a fetcher).
        needed: u64,
        /// Bytes of cached files that may not be evicted yet.
        in_use: u64,
        /// The cap.
        limit: u64,
    },
    /// the chart cache could not be read or written.
    #[error("chart cache {path}: {error}")]
    Cache {
        /// The file.
        path: String,
        /// The error.
        error: std::io::Error,
    },
}

impl FetchError {
    /// Bad input waits for a spec change; an unreachable or failing server is retried.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::Timeout(_) | Self::Cache { .. } => false,
            // Files in use age out; an archive larger than the whole cache never fits.
            Self::CacheFull { needed, limit, .. } => needed > limit,
            Self::Status { status, .. } => !(*status >= 500 || *status == 429 || *status == 408),
            Self::Registry { transient, .. } => !transient,
            _ => true,
        }
    }
}

/// What a 401 or 403 reads as: the host and what to check, never the credentials.
fn unauthorized(host: &str, status: u16, sent: bool) -> String {
    if sent {
        format!("authentication to {host} failed (HTTP {status}): check spec.chart.secretRef")
    } else {
        format!(
            "{host} asks for credentials (HTTP {status}): set spec.chart.secretRef (credentials \
             are sent only to the repository's or registry's own host)"
        )
    }
}

/// What was fetched, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchStats {
    /// `index.yaml` downloads.
    pub index_downloads: u64,
    /// OCI manifest requests.
    pub manifest_requests: u64,
    /// Archive downloads (HTTP or OCI blob).
    pub archive_downloads: u64,
    /// Resolves served from the disk cache.
    pub cache_hits: u64,
    /// `index.yaml` documents held in memory now.
    pub cached_indexes: u64,
    /// Their bytes (as downloaded).
    pub cached_index_bytes: u64,
}

#[derive(Default)]
struct Counters {
    index_downloads: AtomicU64,
    manifest_requests: AtomicU64,
    archive_downloads: AtomicU64,
    cache_hits: AtomicU64,
}

/// Installs rustls' ring provider as the process default unless one is installed: reqwest and
/// oci-client are built without a provider of their own (kube uses ring; aws-lc-rs would be a
/// second one to build). Call it before building any other reqwest or oci-client client.
pub fn ensure_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Fetches, verifies and caches remote charts; resolves local ones too.
pub struct RemoteCharts {
    config: RemoteConfig,
    cache: ChartCache,
    /// Every request: repositories, and registries (manifest, token, blob), each answer read
    /// within its limit.
    http: reqwest::Client,
    /// Where requests may go.
    reach: Reach,
    /// Parsed `index.yaml` by URL without its query, with the query it was fetched with, for
    /// `index_ttl`: one entry per repository path, whatever queries Manifests add.
    indexes: Recent<(Option<String>, Arc<Index>)>,
    /// The chart layer's digest by OCI reference: for `index_ttl` for a tag, for good for a
    /// digest (what it names cannot change).
    layers: Recent<String>,
    counters: Counters,
}

impl RemoteCharts {
    /// Clients for `config`. Installs rustls' ring provider as the process default if none is.
    pub fn new(config: RemoteConfig) -> Result<Self, FetchError> {
        ensure_crypto_provider();
        let reach = Reach {
            allowed: config.allowed_private.clone().into(),
            plain_http: config.allow_plain_http,
            insecure_registries: config.insecure_registries.clone().into(),
        };
        let http = http::client(&config, &reach)?;
        Ok(Self {
            cache: ChartCache {
                dir: config.cache_dir.clone(),
                max_bytes: config.cache_max_bytes,
                in_use: IN_USE,
            },
            http,
            reach,
            indexes: Recent::new(MAX_CACHED_INDEXES, config.index_cache_max_bytes),
            config,
            layers: Recent::new(MAX_CACHED_REFERENCES, u64::MAX),
            counters: Counters::default(),
        })
    }

    /// What was fetched so far.
    pub fn stats(&self) -> FetchStats {
        let c = &self.counters;
        let (cached_indexes, cached_index_bytes) = self.indexes.size();
        FetchStats {
            cached_indexes,
            cached_index_bytes,
            index_downloads: c.index_downloads.load(Ordering::Relaxed),
            manifest_requests: c.manifest_requests.load(Ordering::Relaxed),
            archive_downloads: c.archive_downloads.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
        }
    }

    /// Resolves any chart source: a local path (under `root`, on a blocking thread), a chart of
    /// a Helm repository, or an OCI reference; a remote one with `credentials` (those of
    /// `spec.chart.secretRef`), sent only to the repository's or registry's host. A source with
    /// `verify` is refused: its keys are needed ([`RemoteCharts::resolve_verified`]).
    pub async fn resolve(
        &self,
        source: &ChartSource,
        root: &Path,
        credentials: Option<&Credentials>,
        limits: Limits,
    ) -> Result<ResolvedChart, SourceError> {
        self.resolve_verified(source, root, credentials, limits, None)
            .await
    }

    /// [`RemoteCharts::resolve`], and a source with `verify` is verified against the public
    /// keys of `keys` before its archive is used: the archive returned is the one whose digest
    /// the signature covers (an OCI chart's layer is taken from the manifest whose digest was
    /// verified; a repository chart's archive is checked against the digest the provenance
    /// file signs).
    pub async fn resolve_verified(
        &self,
        source: &ChartSource,
        root: &Path,
        credentials: Option<&Credentials>,
        limits: Limits,
        keys: Option<&KeyMaterial>,
    ) -> Result<ResolvedChart, SourceError> {
        match (&source.path, &source.repository, &source.oci) {
            (None, Some(repository), None) => {
                let name = source.name.as_deref().unwrap_or_default();
                let version = source.version.as_deref().unwrap_or_default();
                let origin = format!(
                    "chart {name} {version} from {}",
                    shown_url(repository.as_str())
                );
                let trust = trust(source, keys).map_err(|e| SourceError::Fetch {
                    origin: origin.clone(),
                    error: e.into(),
                })?;
                let fetch = async {
                    let auth = credentials.map(Credentials::for_repository).transpose()?;
                    let (auth, trust) = (auth.as_ref(), trust.as_ref());
                    self.fetch_from_repository(repository, name, version, auth, limits, trust)
                        .await
                };
                self.bounded(origin, fetch).await
            }
            (None, None, Some(reference)) => {
                let origin = format!("chart {}", shown_reference(reference));
                let trust = trust(source, keys).map_err(|e| SourceError::Fetch {
                    origin: origin.clone(),
                    error: e.into(),
                })?;
                let fetch =
                    self.fetch_from_registry(reference, credentials, limits, trust.as_ref());
                self.bounded(origin, fetch).await
            }
            (Some(_), None, None) if source.verify.is_some() => Err(SourceError::Unsupported(
                "spec.chart.verify is for oci charts and charts of a Helm repository",
            )),
            (Some(_), None, None) => {
                let (source, root) = (source.clone(), root.to_owned());
                tokio::task::spawn_blocking(move || super::resolve(&source, &root, limits))
                    .await
                    .map_err(|e| ContentError::Io {
                        path: "chart".into(),
                        source: std::io::Error::other(e),
                    })?
            }
            // The CRD's CEL rule makes this unreachable through the API server.
            _ => super::resolve(source, root, limits),
        }
    }

    /// Runs one fetch within the timeout: its requests share the deadline (each ends when it
    /// passes, as a host that did not answer in time); the limit here, a little later, is only
    /// a backstop for the work between requests.
    async fn bounded(
        &self,
        origin: String,
        fetch: impl Future<Output = Result<ResolvedChart, FetchError>>,
    ) -> Result<ResolvedChart, SourceError> {
        let timeout = self.config.timeout;
        let deadlined = http::with_deadline(timeout, fetch);
        let result = match tokio::time::timeout(timeout + BACKSTOP, deadlined).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout(self.config.timeout)),
        };
        match result {
            Ok(chart) => Ok(chart),
            Err(error) => Err(SourceError::Fetch { origin, error }),
        }
    }

    /// A cached archive with this digest that `fetcher` downloaded itself (the cache's access
    /// rule), checked again (limits may have changed).
    async fn cached(
        &self,
        hex: &str,
        fetcher: &Fetcher,
        limits: Limits,
    ) -> Result<Option<ResolvedChart>, FetchError> {
        let (cache, hex, fetcher) = (self.cache.clone(), hex.to_owned(), fetcher.clone());
        let found = tokio::task::spawn_blocking(move || cache.lookup(&hex, &fetcher, limits))
            .await
            .map_err(|e| FetchError::Cache {
                path: "lookup".into(),
                error: std::io::Error::other(e),
            })??;
        if found.is_some() {
            self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(found)
    }

    /// Checks the digest, then the archive, then stores it in the cache as downloaded by
    /// `fetcher`.
    async fn verify_and_store(
        &self,
        shown: String,
        bytes: Vec<u8>,
        hex: String,
        fetcher: Fetcher,
        limits: Limits,
    ) -> Result<ResolvedChart, FetchError> {
        let cache = self.cache.clone();
        tokio::task::spawn_blocking(move || {
            let actual = format!("{:x}", Sha256::digest(&bytes));
            if actual != hex {
                return Err(FetchError::DigestMismatch {
                    expected: hex,
                    actual,
                });
            }
            check(&shown, &bytes, limits)?;
            let path = cache.store(&hex, &bytes, &fetcher)?;
            tracing::info!(from = %shown, digest = %format!("sha256:{hex}"), bytes = bytes.len(), "fetched a chart archive");
            Ok(ResolvedChart {
                digest: format!("sha256:{hex}"),
                path,
            })
        })
        .await
        .map_err(|e| FetchError::Cache {
            path: "store".into(),
            error: std::io::Error::other(e),
        })?
    }
}

/// The parsed keys of `source.verify`, if set; refused when set without key material.
fn trust(source: &ChartSource, keys: Option<&KeyMaterial>) -> Result<Option<Trust>, VerifyError> {
    match (&source.verify, keys) {
        (None, _) => Ok(None),
        (Some(verify), Some(material)) => Ok(Some(Trust {
            keys: trusted_keys(verify, material)?,
            from: material.from.clone(),
        })),
        (Some(_), None) => Err(VerifyError::NoKeyMaterial),
    }
}

/// The checks a local `.tgz` gets.
fn check(shown: &str, bytes: &[u8], limits: Limits) -> Result<(), FetchError> {
    if bytes.len() as u64 > limits.max_bytes {
        return Err(FetchError::Chart(ContentError::TooLarge {
            what: "bytes",
            limit: limits.max_bytes,
        }));
    }
    check_archive(shown, bytes, &mut Budget::new(limits), 0).map_err(FetchError::Chart)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_and_permanent_errors() {
        let status = |status| FetchError::Status {
            url: "u".into(),
            status,
        };
        assert!(!status(503).is_permanent());
        assert!(!status(429).is_permanent());
        assert!(status(404).is_permanent());
        assert!(!FetchError::Timeout(Duration::from_secs(1)).is_permanent());
        assert!(!FetchError::Unreachable { host: "h".into() }.is_permanent());
        let refused = Refusal::PlainHttp { url: "u".into() };
        assert!(FetchError::Refused(refused).is_permanent());
        let full = |needed| FetchError::CacheFull {
            needed,
            in_use: 90,
            limit: 100,
        };
        assert!(!full(20).is_permanent(), "files in use age out");
        assert!(full(101).is_permanent(), "never fits");
        assert!(!status(408).is_permanent());
        assert!(
            FetchError::DigestMismatch {
                expected: "a".into(),
                actual: "b".into()
            }
            .is_permanent()
        );
        assert!(FetchError::MediaType("x".into()).is_permanent());
    }

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
        assert!(http::same_origin(
            &url("https://charts.example.com:443/x.tgz"),
            &origin
        ));
        for other in [
            "http://charts.example.com/x.tgz",
            "https://charts.example.com:8443/x.tgz",
            "https://cdn.example.com/x.tgz",
        ] {
            assert!(!http::same_origin(&url(other), &origin), "{other}");
        }
    }
}
