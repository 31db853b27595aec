//! Remote chart sources: Helm HTTP repositories (`spec.chart.repository` + `name` + `version`)
//! and OCI registries (`spec.chart.oci`).
//!
//! The network part is async; hashing, the archive checks (the same as for a local `.tgz`) and
//! the disk cache run on blocking threads. A verified archive is cached on disk under its sha256
//! digest, so a later resolve of the same chart downloads nothing but the (briefly cached)
//! `index.yaml` or the OCI manifest. See `docs/reconcile.md` for the bounds and the errors.

use std::collections::HashMap;
use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oci_client::Reference;
use oci_client::manifest::{OciDescriptor, OciManifest};
use reqwest::Url;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{Budget, Limits, ResolvedChart, SourceError, check_archive, version};
use crate::api::ChartSource;

/// Media type of a Helm chart's OCI config (Chart.yaml as JSON).
pub const HELM_CONFIG_MEDIA_TYPE: &str = "application/vnd.cncf.helm.config.v1+json";
/// Media type of the layer holding the chart archive.
pub const HELM_CHART_MEDIA_TYPE: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";
/// Media type of a chart's provenance layer (allowed beside the chart, not read).
pub const HELM_PROVENANCE_MEDIA_TYPE: &str = "application/vnd.cncf.helm.chart.provenance.v1.prov";

/// Most bytes of an OCI manifest (what the OCI distribution spec asks registries to accept).
const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// Most bytes of a registry's token answer (a JSON object with a token of a few KiB).
const MAX_TOKEN_BYTES: u64 = 1024 * 1024;
/// The manifest media types asked for: image manifests (a chart is one) and indexes (refused
/// with a clear message).
const MANIFEST_MEDIA_TYPES: &[&str] = &[
    oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
    oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];
const CREDENTIALS_NEEDED: &str =
    "the registry requires credentials; only anonymous pulls are supported";
/// Most `index.yaml` documents kept in memory (the oldest is dropped).
const MAX_CACHED_INDEXES: usize = 64;
/// Most OCI references whose layer digest is kept in memory.
const MAX_CACHED_REFERENCES: usize = 1024;
/// Archives used (stored or found) more recently than this are not evicted: a render reads the
/// file after the resolve returns its path. The cache may exceed its size meanwhile.
const IN_USE: Duration = Duration::from_secs(600);
/// Most characters of a server's message quoted in an error.
const MAX_QUOTE: usize = 300;

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
    /// Most HTTP redirects followed per request.
    pub max_redirects: usize,
    /// Registries (`host` or `host:port`) spoken to over plain HTTP; loopback ones always are.
    pub insecure_registries: Vec<String>,
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
            max_redirects: 5,
            insecure_registries: Vec::new(),
        }
    }
}

/// Why a remote chart could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// the URL or reference in the spec is unusable.
    #[error("{0}")]
    Reference(String),
    /// the server could not be reached (connection refused, DNS, TLS, reset).
    #[error("{url} is unreachable: {reason}")]
    Unreachable {
        /// The URL, without credentials or query.
        url: String,
        /// The cause.
        reason: String,
    },
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
    Chart(Box<SourceError>),
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
            Self::Status { status, .. } => !(*status >= 500 || *status == 429 || *status == 408),
            Self::Registry { transient, .. } => !transient,
            _ => true,
        }
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
}

#[derive(Default)]
struct Counters {
    index_downloads: AtomicU64,
    manifest_requests: AtomicU64,
    archive_downloads: AtomicU64,
    cache_hits: AtomicU64,
}

/// A repository's `index.yaml`, the parts that are read.
#[derive(Debug, Deserialize)]
struct Index {
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

/// Installs rustls' ring provider as the process default unless one is installed: reqwest and
/// oci-client are built without a provider of their own (kube uses ring; aws-lc-rs would be a
/// second one to build). Call it before building any other reqwest or oci-client client.
pub fn ensure_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Recent answers by key, each valid for a time to live; beyond `max` the oldest is dropped.
struct Recent<V> {
    entries: Mutex<HashMap<String, (Instant, V)>>,
    max: usize,
}

impl<V: Clone> Recent<V> {
    fn new(max: usize) -> Self {
        Self {
            entries: Mutex::default(),
            max,
        }
    }

    fn get(&self, key: &str, ttl: Duration) -> Option<V> {
        let entries = self.entries.lock().unwrap();
        let (at, value) = entries.get(key)?;
        (at.elapsed() < ttl).then(|| value.clone())
    }

    fn put(&self, key: String, value: V) {
        let mut entries = self.entries.lock().unwrap();
        if entries.len() >= self.max
            && !entries.contains_key(&key)
            && let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
        {
            entries.remove(&oldest);
        }
        entries.insert(key, (Instant::now(), value));
    }
}

/// Fetches, verifies and caches remote charts; resolves local ones too.
pub struct RemoteCharts {
    config: RemoteConfig,
    cache: ChartCache,
    /// Every request: repositories, and registries (manifest, token, blob), each answer read
    /// within its limit.
    http: reqwest::Client,
    /// Parsed `index.yaml` by URL, for `index_ttl`.
    indexes: Recent<Arc<Index>>,
    /// The chart layer's digest by OCI reference: for `index_ttl` for a tag, for good for a
    /// digest (what it names cannot change).
    layers: Recent<String>,
    counters: Counters,
}

impl RemoteCharts {
    /// Clients for `config`. Installs rustls' ring provider as the process default if none is.
    pub fn new(config: RemoteConfig) -> Result<Self, FetchError> {
        ensure_crypto_provider();
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
        let http = reqwest::Client::builder()
            .redirect(policy)
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("module-manager/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| FetchError::Reference(format!("HTTP client: {}", chain(&e))))?;
        Ok(Self {
            cache: ChartCache {
                dir: config.cache_dir.clone(),
                max_bytes: config.cache_max_bytes,
                in_use: IN_USE,
            },
            http,
            config,
            indexes: Recent::new(MAX_CACHED_INDEXES),
            layers: Recent::new(MAX_CACHED_REFERENCES),
            counters: Counters::default(),
        })
    }

    /// What was fetched so far.
    pub fn stats(&self) -> FetchStats {
        let c = &self.counters;
        FetchStats {
            index_downloads: c.index_downloads.load(Ordering::Relaxed),
            manifest_requests: c.manifest_requests.load(Ordering::Relaxed),
            archive_downloads: c.archive_downloads.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
        }
    }

    /// Resolves any chart source: a local path (under `root`, on a blocking thread), a chart of
    /// a Helm repository, or an OCI reference.
    pub async fn resolve(
        &self,
        source: &ChartSource,
        root: &Path,
        limits: Limits,
    ) -> Result<ResolvedChart, SourceError> {
        match (&source.path, &source.repository, &source.oci) {
            (None, Some(repository), None) => {
                let name = source.name.as_deref().unwrap_or_default();
                let version = source.version.as_deref().unwrap_or_default();
                let origin = format!(
                    "chart {name} {version} from {}",
                    shown_url(repository.as_str())
                );
                self.bounded(
                    origin,
                    self.fetch_from_repository(repository, name, version, limits),
                )
                .await
            }
            (None, None, Some(reference)) => {
                let origin = format!("chart {}", shown_reference(reference));
                self.bounded(origin, self.fetch_from_registry(reference, limits))
                    .await
            }
            (Some(_), None, None) => {
                let (source, root) = (source.clone(), root.to_owned());
                tokio::task::spawn_blocking(move || super::resolve(&source, &root, limits))
                    .await
                    .map_err(|e| SourceError::Io {
                        path: "chart".into(),
                        source: std::io::Error::other(e),
                    })?
            }
            // The CRD's CEL rule makes this unreachable through the API server.
            _ => super::resolve(source, root, limits),
        }
    }

    async fn bounded(
        &self,
        origin: String,
        fetch: impl Future<Output = Result<ResolvedChart, FetchError>>,
    ) -> Result<ResolvedChart, SourceError> {
        let result = match tokio::time::timeout(self.config.timeout, fetch).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout(self.config.timeout)),
        };
        match result {
            Ok(chart) => Ok(chart),
            Err(error) => Err(SourceError::Fetch { origin, error }),
        }
    }

    async fn fetch_from_repository(
        &self,
        repository: &str,
        name: &str,
        requested: &str,
        limits: Limits,
    ) -> Result<ResolvedChart, FetchError> {
        let base = repository_url(repository)?;
        let index = self.index(&base).await?;
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
        if let Some(chart) = self.cached(&hex, limits).await? {
            return Ok(chart);
        }
        let url = entry
            .urls
            .first()
            .ok_or_else(|| FetchError::BadIndex(format!("version {chosen} has no urls")))?;
        let url = chart_url(&base, url)?;
        let bytes = self.get_bounded(&url, limits.max_bytes).await?;
        self.counters
            .archive_downloads
            .fetch_add(1, Ordering::Relaxed);
        self.verify_and_store(shown(&url), bytes, hex, limits).await
    }

    /// The repository's index, from memory when fetched less than `index_ttl` ago.
    async fn index(&self, base: &Url) -> Result<Arc<Index>, FetchError> {
        let url = index_url(base);
        let key = url.as_str().to_owned();
        if let Some(index) = self.indexes.get(&key, self.config.index_ttl) {
            return Ok(index);
        }
        let bytes = self.get_bounded(&url, self.config.max_index_bytes).await?;
        self.counters
            .index_downloads
            .fetch_add(1, Ordering::Relaxed);
        let index = tokio::task::spawn_blocking(move || parse_index(&bytes))
            .await
            .map_err(|e| FetchError::BadIndex(e.to_string()))??;
        let index = Arc::new(index);
        self.indexes.put(key, index.clone());
        Ok(index)
    }

    /// GETs `url`, refusing more than `max` bytes.
    async fn get_bounded(&self, url: &Url, max: u64) -> Result<Vec<u8>, FetchError> {
        let (body, _) = self
            .send_bounded(self.http.get(url.clone()), url, max)
            .await?;
        Ok(body)
    }

    /// Sends `request` (for `url`), refusing an answer of more than `max` bytes; returns the
    /// body and the headers.
    async fn send_bounded(
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

    /// An anonymous pull token for `reference`'s repository when the registry asks for one
    /// (a `Bearer` challenge on `/v2/`), as the distribution spec's token flow: the realm's
    /// answer is read within [`MAX_TOKEN_BYTES`]. `None` when the registry asks for nothing, or
    /// for credentials another way (the manifest request then says so).
    async fn anonymous_token(
        &self,
        reference: &Reference,
        scheme: &str,
    ) -> Result<Option<String>, FetchError> {
        let url = registry_url(scheme, reference, "")?;
        let response = self
            .http
            .get(url.clone())
            .send()
            .await
            .map_err(|e| request_error(&shown(&url), e, self.config.timeout))?;
        if response.status() != reqwest::StatusCode::UNAUTHORIZED {
            return Ok(None);
        }
        let challenge = response
            .headers()
            .get_all(reqwest::header::WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(bearer_challenge);
        drop(response);
        let Some(challenge) = challenge else {
            return Ok(None);
        };
        let refused = |what: &str| FetchError::Registry {
            message: format!("the registry's token {what}"),
            transient: false,
        };
        let realm = challenge
            .get("realm")
            .ok_or_else(|| refused("challenge names no realm"))?;
        let realm = Url::parse(realm).map_err(|_| refused("realm is not a URL"))?;
        let mut realm = checked_url(realm, "token realm")?;
        {
            let mut query = realm.query_pairs_mut();
            if let Some(service) = challenge.get("service") {
                query.append_pair("service", service);
            }
            query.append_pair(
                "scope",
                &format!("repository:{}:pull", reference.repository()),
            );
        }
        let body = match self
            .send_bounded(self.http.get(realm.clone()), &realm, MAX_TOKEN_BYTES)
            .await
        {
            Ok((body, _)) => body,
            Err(FetchError::Status {
                status: 401 | 403, ..
            }) => return Err(credentials_needed()),
            Err(e) => return Err(e),
        };
        #[derive(Deserialize)]
        struct Answer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: Answer =
            serde_json::from_slice(&body).map_err(|_| refused("answer is not a token"))?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .map(Some)
            .ok_or_else(|| refused("answer holds no token"))
    }

    /// GETs `what` of the registry with the pull token, within `max` bytes; the registry's
    /// refusals in words.
    async fn registry_get(
        &self,
        url: &Url,
        accept: Option<&str>,
        token: Option<&str>,
        max: u64,
    ) -> Result<(Vec<u8>, reqwest::header::HeaderMap), FetchError> {
        let mut request = self.http.get(url.clone());
        if let Some(accept) = accept {
            request = request.header(reqwest::header::ACCEPT, accept);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        match self.send_bounded(request, url, max).await {
            Err(FetchError::Status { status: 404, .. }) => Err(FetchError::Registry {
                message: "not found in the registry".into(),
                transient: false,
            }),
            Err(FetchError::Status {
                status: 401 | 403, ..
            }) => Err(credentials_needed()),
            other => other,
        }
    }

    /// The image manifest of `reference`, read within [`MAX_MANIFEST_BYTES`] and checked
    /// against a digest in the reference and the registry's `Docker-Content-Digest`.
    async fn pull_manifest(
        &self,
        reference: &Reference,
        scheme: &str,
        token: Option<&str>,
    ) -> Result<OciManifest, FetchError> {
        let target = reference
            .digest()
            .or(reference.tag())
            .expect("oci_reference requires a tag or digest");
        let url = registry_url(scheme, reference, &format!("manifests/{target}"))?;
        self.counters
            .manifest_requests
            .fetch_add(1, Ordering::Relaxed);
        let accept = MANIFEST_MEDIA_TYPES.join(", ");
        let (body, headers) = self
            .registry_get(&url, Some(&accept), token, MAX_MANIFEST_BYTES)
            .await?;
        let actual = format!("{:x}", Sha256::digest(&body));
        let published = headers
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .filter(|d| d.starts_with("sha256:"));
        for expected in [reference.digest(), published].into_iter().flatten() {
            let expected = sha256_hex(expected)?;
            if expected != actual {
                return Err(FetchError::DigestMismatch {
                    expected,
                    actual: actual.clone(),
                });
            }
        }
        serde_json::from_slice(&body).map_err(|e| FetchError::Registry {
            message: format!(
                "not an OCI manifest (line {}, column {})",
                e.line(),
                e.column()
            ),
            transient: false,
        })
    }

    async fn fetch_from_registry(
        &self,
        text: &str,
        limits: Limits,
    ) -> Result<ResolvedChart, FetchError> {
        let reference = oci_reference(text)?;
        let plain = self.plain_http(reference.registry());
        // A reference resolved moments ago (a tag) or ever (a digest) needs no manifest.
        let key = format!("{plain}:{}", reference.whole());
        let ttl = match reference.digest() {
            Some(_) => Duration::MAX,
            None => self.config.index_ttl,
        };
        if let Some(hex) = self.layers.get(&key, ttl)
            && let Some(chart) = self.cached(&hex, limits).await?
        {
            return Ok(chart);
        }
        let chart = self.fetch_layer(&reference, plain, text, limits).await?;
        let hex = chart.digest.trim_start_matches("sha256:").to_owned();
        self.layers.put(key, hex);
        Ok(chart)
    }

    /// Pulls the manifest, checks it is a Helm chart, and takes its archive from the cache or
    /// the registry.
    async fn fetch_layer(
        &self,
        reference: &Reference,
        plain: bool,
        text: &str,
        limits: Limits,
    ) -> Result<ResolvedChart, FetchError> {
        let scheme = if plain { "http" } else { "https" };
        let token = self.anonymous_token(reference, scheme).await?;
        let manifest = self
            .pull_manifest(reference, scheme, token.as_deref())
            .await?;
        let manifest = match manifest {
            OciManifest::Image(manifest) => manifest,
            OciManifest::ImageIndex(_) => {
                return Err(FetchError::MediaType(
                    "the reference is an image index, not a Helm chart".into(),
                ));
            }
        };
        if manifest.config.media_type != HELM_CONFIG_MEDIA_TYPE {
            return Err(FetchError::MediaType(format!(
                "the config media type is not a Helm chart's ({HELM_CONFIG_MEDIA_TYPE})"
            )));
        }
        if manifest.layers.iter().any(|l| {
            l.media_type != HELM_CHART_MEDIA_TYPE && l.media_type != HELM_PROVENANCE_MEDIA_TYPE
        }) {
            return Err(FetchError::MediaType(format!(
                "a layer's media type is not a Helm chart's ({HELM_CHART_MEDIA_TYPE})"
            )));
        }
        let charts: Vec<_> = manifest
            .layers
            .iter()
            .filter(|l| l.media_type == HELM_CHART_MEDIA_TYPE)
            .collect();
        let [layer] = charts[..] else {
            return Err(FetchError::MediaType(format!(
                "{} layers of media type {HELM_CHART_MEDIA_TYPE}, expected one",
                charts.len()
            )));
        };
        if u64::try_from(layer.size).map_or(true, |size| size > limits.max_bytes) {
            return Err(FetchError::TooLarge {
                what: format!("chart layer of {} bytes", layer.size),
                limit: limits.max_bytes,
            });
        }
        let hex = sha256_hex(&layer.digest)?;
        if let Some(chart) = self.cached(&hex, limits).await? {
            return Ok(chart);
        }
        let bytes = self
            .pull_layer(reference, scheme, token.as_deref(), layer, limits)
            .await?;
        self.counters
            .archive_downloads
            .fetch_add(1, Ordering::Relaxed);
        self.verify_and_store(shown_reference(text), bytes, hex, limits)
            .await
    }

    /// The chart layer's bytes, read within the chart's byte limit (a registry may send more
    /// than the size it declared). Redirects (to a CDN) follow the HTTP client's policy: not
    /// from https to http, the token not sent to another host; `urls` of the descriptor are
    /// not used. The digest is checked by the caller.
    async fn pull_layer(
        &self,
        reference: &Reference,
        scheme: &str,
        token: Option<&str>,
        layer: &OciDescriptor,
        limits: Limits,
    ) -> Result<Vec<u8>, FetchError> {
        let url = registry_url(scheme, reference, &format!("blobs/{}", layer.digest))?;
        match self.registry_get(&url, None, token, limits.max_bytes).await {
            Ok((body, _)) => Ok(body),
            Err(FetchError::TooLarge { limit, .. }) => Err(FetchError::TooLarge {
                what: "chart layer".into(),
                limit,
            }),
            Err(e) => Err(e),
        }
    }

    fn plain_http(&self, registry: &str) -> bool {
        let host = registry
            .rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(registry, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
            || self
                .config
                .insecure_registries
                .iter()
                .any(|r| r == registry || r == host)
    }

    /// A cached archive with this digest, checked again (limits may have changed).
    async fn cached(&self, hex: &str, limits: Limits) -> Result<Option<ResolvedChart>, FetchError> {
        let (cache, hex) = (self.cache.clone(), hex.to_owned());
        let found = tokio::task::spawn_blocking(move || cache.lookup(&hex, limits))
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

    /// Checks the digest, then the archive, then stores it in the cache.
    async fn verify_and_store(
        &self,
        shown: String,
        bytes: Vec<u8>,
        hex: String,
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
            let path = cache.store(&hex, &bytes)?;
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

/// The checks a local `.tgz` gets.
fn check(shown: &str, bytes: &[u8], limits: Limits) -> Result<(), FetchError> {
    if bytes.len() as u64 > limits.max_bytes {
        return Err(FetchError::Chart(Box::new(SourceError::TooLarge {
            what: "bytes",
            limit: limits.max_bytes,
        })));
    }
    check_archive(shown, bytes, &mut Budget::new(limits), 0)
        .map_err(|e| FetchError::Chart(Box::new(e)))
}

/// Verified archives on disk, `sha256-<hex>.tgz`, bounded in total size; temporary files of interrupted writes go after an hour.
#[derive(Clone, Debug)]
struct ChartCache {
    dir: PathBuf,
    max_bytes: u64,
    /// Files used more recently than this stay, whatever the size.
    in_use: Duration,
}

impl ChartCache {
    fn path(&self, hex: &str) -> PathBuf {
        self.dir.join(format!("sha256-{hex}.tgz"))
    }

    fn error(path: &Path, error: std::io::Error) -> FetchError {
        FetchError::Cache {
            path: path.display().to_string(),
            error,
        }
    }

    /// The archive with this digest if it is cached, still has that digest and passes the
    /// checks; a corrupt or failing file is removed. A hit marks the file as recently used.
    fn lookup(&self, hex: &str, limits: Limits) -> Result<Option<ResolvedChart>, FetchError> {
        let path = self.path(hex);
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Self::error(&path, e)),
        };
        let mut bytes = Vec::new();
        file.take(limits.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Self::error(&path, e))?;
        let intact = format!("{:x}", Sha256::digest(&bytes)) == hex
            && check(&path.display().to_string(), &bytes, limits).is_ok();
        if !intact {
            let _ = std::fs::remove_file(&path);
            return Ok(None);
        }
        if let Ok(file) = std::fs::File::options().append(true).open(&path) {
            let _ = file.set_modified(std::time::SystemTime::now());
        }
        Ok(Some(ResolvedChart {
            digest: format!("sha256:{hex}"),
            path,
        }))
    }

    /// Writes the archive to a temporary file of its own (created exclusively with a random
    /// name: replicas sharing the cache never write the same one), renames it into place, then
    /// evicts the least recently used others while the cache is over its size.
    fn store(&self, hex: &str, bytes: &[u8]) -> Result<PathBuf, FetchError> {
        use std::io::Write;
        std::fs::create_dir_all(&self.dir).map_err(|e| Self::error(&self.dir, e))?;
        let path = self.path(hex);
        let mut temporary = tempfile::Builder::new()
            .prefix(&format!(".{hex}."))
            .suffix(".tmp")
            .tempfile_in(&self.dir)
            .map_err(|e| Self::error(&self.dir, e))?;
        temporary
            .write_all(bytes)
            .map_err(|e| Self::error(temporary.path(), e))?;
        temporary
            .persist(&path)
            .map_err(|e| Self::error(&path, e.error))?;
        self.evict(&path);
        Ok(path)
    }

    fn evict(&self, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let entries: Vec<_> = entries.filter_map(Result::ok).collect();
        // Temporary files of writes that never finished (a crash) go after an hour.
        for entry in &entries {
            let stale = entry.metadata().and_then(|m| m.modified()).is_ok_and(|at| {
                at.elapsed()
                    .is_ok_and(|age| age > Duration::from_secs(3600))
            });
            if entry.file_name().to_string_lossy().ends_with(".tmp") && stale {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .iter()
            .filter(|e| e.file_name().to_string_lossy().starts_with("sha256-"))
            .filter_map(|e| {
                let metadata = e.metadata().ok()?;
                Some((metadata.modified().ok()?, metadata.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|(_, size, _)| size).sum();
        files.sort();
        for (used, size, path) in files {
            if total <= self.max_bytes {
                break;
            }
            // A file used moments ago may be about to be read by a render.
            let in_use = used.elapsed().map_or(true, |age| age < self.in_use);
            if path != keep && !in_use && std::fs::remove_file(&path).is_ok() {
                tracing::info!(path = %path.display(), "evicted from the chart cache");
                total -= size;
            }
        }
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

/// Reads the YAML events of `text` (which expands nothing) and refuses any anchor or alias.
fn refuse_aliases(text: &str) -> Result<(), FetchError> {
    use yaml_rust2::parser::{Event, Parser};
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, at) = parser.next_token().map_err(|e| {
            FetchError::BadIndex(format!(
                "not valid YAML (line {}, column {})",
                e.marker().line(),
                e.marker().col() + 1
            ))
        })?;
        let anchored = match event {
            Event::StreamEnd => return Ok(()),
            Event::Alias(_) => true,
            Event::Scalar(_, _, anchor, _)
            | Event::SequenceStart(anchor, _)
            | Event::MappingStart(anchor, _) => anchor != 0,
            _ => false,
        };
        if anchored {
            return Err(FetchError::BadIndex(format!(
                "YAML anchors and aliases are not accepted (line {}, column {})",
                at.line(),
                at.col() + 1
            )));
        }
    }
}

/// The hex of a `sha256:<hex>` or bare `<hex>` digest (lowercase; it names a cache file).
fn sha256_hex(digest: &str) -> Result<String, FetchError> {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        // Not quoted: it may come from a server.
        Err(FetchError::BadDigest(
            "the digest is not a sha256 digest".into(),
        ))
    }
}

/// Parses a repository URL: http or https, a host, no credentials.
fn repository_url(text: &str) -> Result<Url, FetchError> {
    let url = Url::parse(text)
        .map_err(|e| FetchError::Reference(format!("the repository is not a URL: {e}")))?;
    checked_url(url, "repository")
}

fn checked_url(url: Url, what: &str) -> Result<Url, FetchError> {
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

/// A URL as it may appear in a status or log: scheme, host, port and path only.
fn shown(url: &Url) -> String {
    let mut shown = format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default());
    if let Some(port) = url.port() {
        shown.push_str(&format!(":{port}"));
    }
    shown.push_str(url.path());
    bounded_text(&shown)
}

/// A URL from the spec as it may be shown (credentials and query dropped).
fn shown_url(text: &str) -> String {
    Url::parse(text).map_or_else(|_| "an invalid URL".to_owned(), |url| shown(&url))
}

/// An OCI reference as it may be shown: without user info before the host, bounded.
fn shown_reference(text: &str) -> String {
    let (scheme, rest) = text.split_at(if text.starts_with("oci://") { 6 } else { 0 });
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = host.rsplit_once('@').map_or(host, |(_, host)| host);
    bounded_text(&format!("{scheme}{host}{path}"))
}

/// Parses `oci://host[:port]/repository/chart:tag` or `…@sha256:<hex>`. Helm stores a version's
/// `+` as `_` in tags (OCI tags cannot hold `+`); so does this.
fn oci_reference(text: &str) -> Result<Reference, FetchError> {
    let rest = text
        .strip_prefix("oci://")
        .ok_or_else(|| FetchError::Reference("an OCI reference starts with oci://".into()))?;
    let (host, path) = rest
        .split_once('/')
        .ok_or_else(|| FetchError::Reference("the reference has no repository".into()))?;
    if host.contains('@') {
        return Err(FetchError::Reference(
            "the reference carries credentials, which are not supported (they would show in \
             status and logs)"
                .into(),
        ));
    }
    if !(host.contains('.') || host.contains(':') || host == "localhost") {
        return Err(FetchError::Reference(format!(
            "{:?} is not a registry host (oci://host[:port]/repository/chart:tag)",
            bounded_text(host)
        )));
    }
    let last = path.rsplit('/').next().unwrap_or_default();
    let normalized = if last.contains('@') {
        rest.to_owned()
    } else if let Some((_, tag)) = last.split_once(':').filter(|(_, tag)| !tag.is_empty()) {
        format!(
            "{}{}",
            &rest[..rest.len() - tag.len()],
            tag.replace('+', "_")
        )
    } else {
        return Err(FetchError::Reference(
            "the reference names no tag or digest (oci://host/repository/chart:version)".into(),
        ));
    };
    normalized
        .parse::<Reference>()
        .map_err(|e| FetchError::Reference(format!("invalid OCI reference: {e}")))
}

fn request_error(url: &str, error: reqwest::Error, timeout: Duration) -> FetchError {
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

fn credentials_needed() -> FetchError {
    FetchError::Registry {
        message: CREDENTIALS_NEEDED.into(),
        transient: false,
    }
}

/// `<scheme>://<registry>/v2/<repository>/<path>` (`/v2/` for an empty path).
fn registry_url(scheme: &str, reference: &Reference, path: &str) -> Result<Url, FetchError> {
    let text = if path.is_empty() {
        format!("{scheme}://{}/v2/", reference.resolve_registry())
    } else {
        format!(
            "{scheme}://{}/v2/{}/{path}",
            reference.resolve_registry(),
            reference.repository()
        )
    };
    Url::parse(&text).map_err(|e| FetchError::Reference(format!("invalid OCI reference: {e}")))
}

/// The parameters of a `Bearer` challenge (`Bearer realm="…",service="…",scope="…"`).
fn bearer_challenge(header: &str) -> Option<HashMap<String, String>> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params = HashMap::new();
    let mut rest = rest.trim_start();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &quoted[end?..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_owned(), &after[end..])
        };
        params.insert(key, value);
        rest = remaining.trim_start().trim_start_matches(',').trim_start();
    }
    Some(params)
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

/// At most [`MAX_QUOTE`] characters of text from outside.
fn bounded_text(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTE) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// What Helm accepts as a chart name (letters, digits, `-`, `_`, `.`; at most 250 characters).
fn is_chart_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 250
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Up to ten items, then how many more.
fn listing(items: &[&str]) -> String {
    if items.is_empty() {
        return "none".into();
    }
    let mut text = items
        .iter()
        .take(10)
        .map(|s| bounded_text(s))
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > 10 {
        text.push_str(&format!(" and {} more", items.len() - 10));
    }
    text
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
    fn shown_urls_carry_no_credentials_or_query() {
        let url = Url::parse("https://user:pw@example.com:8443/charts/x.tgz?token=t").unwrap();
        assert_eq!(shown(&url), "https://example.com:8443/charts/x.tgz");
        assert_eq!(
            shown_url("https://user:pw@example.com/c"),
            "https://example.com/c"
        );
        assert_eq!(shown_url("::"), "an invalid URL");
    }

    #[test]
    fn digests_are_sha256_hex_only() {
        let hex = "a".repeat(64);
        assert_eq!(sha256_hex(&hex).unwrap(), hex);
        assert_eq!(
            sha256_hex(&format!("sha256:{}", "A".repeat(64))).unwrap(),
            hex
        );
        for bad in [
            "",
            "sha512:abc",
            "../../etc/passwd",
            &"g".repeat(64),
            &"a".repeat(63),
        ] {
            assert!(
                matches!(sha256_hex(bad), Err(FetchError::BadDigest(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn oci_references_need_a_host_and_a_tag_or_digest() {
        let r = oci_reference("oci://127.0.0.1:5000/charts/web:1.2.3").unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("127.0.0.1:5000", "charts/web", Some("1.2.3"))
        );
        let r = oci_reference("oci://registry.example.com/web:1.0.0+build.1").unwrap();
        assert_eq!(r.tag(), Some("1.0.0_build.1"), "+ is stored as _");
        let digest = format!("sha256:{}", "0".repeat(64));
        let r = oci_reference(&format!("oci://localhost:5000/charts/web@{digest}")).unwrap();
        assert_eq!(r.digest(), Some(digest.as_str()));
        let error = oci_reference("oci://user:s3cret@example.com/charts/web:1.0.0")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("carries credentials") && !error.contains("s3cret"),
            "{error}"
        );
        assert_eq!(
            shown_reference("oci://user:s3cret@example.com/charts/web:1.0.0"),
            "oci://example.com/charts/web:1.0.0"
        );
        assert_eq!(
            shown_reference("oci://example.com/a@sha256:00"),
            "oci://example.com/a@sha256:00"
        );
        assert_eq!(shown_reference("oci://u:p@h"), "oci://h");
        for bad in [
            "oci://charts/web:1.0.0",
            "oci://example.com/charts/web",
            "oci://example.com",
            "https://example.com/charts/web:1.0.0",
        ] {
            assert!(
                matches!(oci_reference(bad), Err(FetchError::Reference(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn loopback_and_listed_registries_use_plain_http() {
        let mut config = RemoteConfig::new(std::env::temp_dir());
        config.insecure_registries = vec!["registry.internal:5000".into(), "plain.lan".into()];
        let remote = RemoteCharts::new(config).unwrap();
        for plain in [
            "127.0.0.1:5000",
            "127.1.2.3",
            "localhost:5000",
            "[::1]:5000",
            "registry.internal:5000",
            "plain.lan:443",
        ] {
            assert!(remote.plain_http(plain), "{plain}");
        }
        for tls in ["registry.internal:5001", "ghcr.io", "10.0.0.1:5000"] {
            assert!(!remote.plain_http(tls), "{tls}");
        }
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
        assert!(
            !FetchError::Unreachable {
                url: "u".into(),
                reason: "refused".into()
            }
            .is_permanent()
        );
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
    fn bearer_challenges_are_parsed() {
        let params = bearer_challenge(
            r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull,push""#,
        )
        .unwrap();
        assert_eq!(params["realm"], "https://auth.example.com/token");
        assert_eq!(params["service"], "registry.example.com");
        assert_eq!(params["scope"], "repository:a/b:pull,push");
        let params =
            bearer_challenge(r#"bearer realm=http://127.0.0.1/t, service="a\"b""#).unwrap();
        assert_eq!(params["realm"], "http://127.0.0.1/t");
        assert_eq!(params["service"], "a\"b");
        assert!(bearer_challenge(r#"Basic realm="registry""#).is_none());
        assert!(bearer_challenge(r#"Bearer realm="unterminated"#).is_none());
    }

    fn archive(n: u8) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::none(),
        ));
        let content = vec![n; 200];
        let mut header = tar::Header::new_gnu();
        header.set_path("demo/Chart.yaml").unwrap();
        header.set_size(content.len() as u64);
        header.set_cksum();
        builder.append(&header, content.as_slice()).unwrap();
        builder.into_inner().unwrap().finish().unwrap()
    }

    fn set_age(path: &Path, age: Duration) {
        std::fs::File::options()
            .append(true)
            .open(path)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - age)
            .unwrap();
    }

    /// Ages are set, not waited for: the order does not hang on timestamp resolution.
    #[test]
    fn the_cache_evicts_the_least_recently_used_but_not_what_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let archives: Vec<Vec<u8>> = (0..4).map(archive).collect();
        let hexes: Vec<String> = archives
            .iter()
            .map(|a| format!("{:x}", Sha256::digest(a)))
            .collect();
        let size = archives[0].len() as u64;
        let cache = ChartCache {
            dir: dir.path().join("charts"),
            // Room for two and a half archives.
            max_bytes: size * 5 / 2,
            in_use: IN_USE,
        };
        let limits = Limits::default();
        // Leftovers of interrupted writes: one from two hours ago, one under way.
        std::fs::create_dir_all(&cache.dir).unwrap();
        let (stale, fresh) = (cache.dir.join(".a.1.0.tmp"), cache.dir.join(".b.1.1.tmp"));
        std::fs::write(&stale, b"partial").unwrap();
        std::fs::write(&fresh, b"partial").unwrap();
        set_age(&stale, Duration::from_secs(7200));

        // Three archives just stored (a render may be about to read each): none goes, though
        // the cache is over its size.
        for (hex, bytes) in hexes.iter().zip(&archives).take(3) {
            cache.store(hex, bytes).unwrap();
        }
        assert!(
            !stale.exists() && fresh.exists(),
            "stale temporary files go"
        );
        assert!(
            (0..3).all(|i| cache.path(&hexes[i]).exists()),
            "nothing in use is evicted"
        );
        let leftovers = std::fs::read_dir(&cache.dir)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().ends_with(".tmp")
            })
            .count();
        assert_eq!(leftovers, 1, "stores leave no temporary file");

        // Used 3, 4 and 1 hours ago; then 1 is found again (marked used now), and 3 stored:
        // the least recently used go, 0 then 2, until the rest fits.
        for (i, hours) in [(0, 3), (1, 4), (2, 1)] {
            set_age(&cache.path(&hexes[i]), Duration::from_secs(hours * 3600));
        }
        assert!(cache.lookup(&hexes[1], limits).unwrap().is_some());
        cache.store(&hexes[3], &archives[3]).unwrap();
        let present: Vec<bool> = hexes.iter().map(|h| cache.path(h).exists()).collect();
        assert_eq!(present, [false, true, false, true]);

        // A file whose content changed is not served, and is removed.
        let path = cache.path(&hexes[3]);
        std::fs::write(&path, b"tampered").unwrap();
        assert!(cache.lookup(&hexes[3], limits).unwrap().is_none());
        assert!(!path.exists());
    }
}
