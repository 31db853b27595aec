//! [`RemoteConfig`]: how remote charts are fetched and cached (the flags of `run`).

use std::path::PathBuf;
use std::time::Duration;

use super::address::Cidr;

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
