//! [`RemoteCharts`], what each fetch shares: the configuration, the HTTP client, where requests
//! may go, the in-memory caches of indexes and layer digests, what was fetched
//! ([`FetchStats`]), and the way in and out of the disk cache (`cached`, `verify_and_store`).
//! The fetches themselves are `impl RemoteCharts` blocks in the files of their concern.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use super::cache::{ChartCache, Fetcher, IN_USE, check};
use super::client::client;
use super::config::RemoteConfig;
use super::error::FetchError;
use super::index::Index;
use super::reach::Reach;
use super::recent::Recent;
use crate::source::{Limits, ResolvedChart};

/// Most `index.yaml` documents kept in memory (the oldest is dropped).
const MAX_CACHED_INDEXES: usize = 64;
/// Most OCI references whose layer digest is kept in memory.
const MAX_CACHED_REFERENCES: usize = 1024;

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
pub(super) struct Counters {
    pub(super) index_downloads: AtomicU64,
    pub(super) manifest_requests: AtomicU64,
    pub(super) archive_downloads: AtomicU64,
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
    pub(super) config: RemoteConfig,
    cache: ChartCache,
    /// Every request: repositories, and registries (manifest, token, blob), each answer read
    /// within its limit.
    pub(super) http: reqwest::Client,
    /// Where requests may go.
    pub(super) reach: Reach,
    /// Parsed `index.yaml` by URL without its query, with the query it was fetched with, for
    /// `index_ttl`: one entry per repository path, whatever queries Manifests add.
    pub(super) indexes: Recent<(Option<String>, Arc<Index>)>,
    /// The chart layer's digest by OCI reference: for `index_ttl` for a tag, for good for a
    /// digest (what it names cannot change).
    pub(super) layers: Recent<String>,
    pub(super) counters: Counters,
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
        let http = client(&config, &reach)?;
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

    /// A cached archive with this digest that `fetcher` downloaded itself (the cache's access
    /// rule), checked again (limits may have changed).
    pub(super) async fn cached(
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
    pub(super) async fn verify_and_store(
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
