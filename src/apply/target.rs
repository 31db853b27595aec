//! Remote targets: the cluster a Manifest's module is applied to when `spec.target` names a
//! kubeconfig Secret.
//!
//! The Secret (in the Manifest's namespace) is read on every pass; its kubeconfig is parsed,
//! checked ([`validate`]: only inline credentials — never a command, a plugin or a file) and turned
//! into a client with connect and request timeouts, plus discovery: a [`Cluster`]. Clients are
//! cached by Secret (namespace, name, key) and reused while the Secret's UID and resourceVersion
//! are unchanged, so a rotated Secret gets a new client on the next pass, without a restart. An
//! authentication (401) or TLS failure evicts the client; the cache is bounded (least recently
//! used first) and forgets clients unused for a while.
//!
//! Failures are [`TargetError`]s: a missing Secret or key is retried with backoff, a refused
//! kubeconfig waits for a change, an unreachable target backs off. No message names anything
//! but the Secret, the key, the server URL (without credentials) and the offending field —
//! never a token, key, certificate or the kubeconfig's text.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::io::ErrorKind;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::{
    AuthInfo, Cluster as KubeconfigCluster, Context as KubeconfigContext, KubeConfigOptions,
    Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use kube::{Client, Config, ResourceExt};

use crate::api::Manifest;
use crate::apply::{ApplyError, Cluster};
use crate::telemetry::metrics::{TargetErrorLabels, TargetMetrics};

/// The largest kubeconfig accepted (a kubeconfig with a CA bundle is a few KiB).
pub const MAX_KUBECONFIG_BYTES: usize = 256 * 1024;

/// Limits and timeouts of remote target clients.
#[derive(Clone, Copy, Debug)]
pub struct TargetSettings {
    /// Most clients cached at once (least recently used evicted first).
    pub max_clients: usize,
    /// A client unused this long is dropped.
    pub idle: Duration,
    /// TCP connect and TLS handshake timeout of a remote request.
    pub connect_timeout: Duration,
    /// Read and write timeout of a remote request.
    pub request_timeout: Duration,
}

impl Default for TargetSettings {
    fn default() -> Self {
        Self {
            max_clients: 256,
            idle: Duration::from_secs(30 * 60),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// How a request to a target failed, when the target (not the request) is the problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Connection refused or reset, a timeout, DNS: the target cannot be reached.
    Unreachable,
    /// 401: the target does not accept the kubeconfig's credentials.
    Unauthorized,
    /// The TLS handshake failed (the server's certificate, or the client certificate).
    Tls,
}

impl Failure {
    /// The `reason` label of `module_manager_target_errors_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::Unauthorized => "auth",
            Self::Tls => "tls",
        }
    }

    /// Whether the cached client is dropped (its credentials or trust are wrong; the next pass
    /// builds a new one from the Secret).
    pub fn evicts(self) -> bool {
        !matches!(self, Self::Unreachable)
    }
}

/// Why a Manifest's target cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// the kubeconfig Secret does not exist (it may be created: retried with backoff).
    #[error("the target's kubeconfig Secret {name} does not exist")]
    SecretMissing {
        /// The Secret's name.
        name: String,
    },
    /// the Secret has no such key (retried with backoff).
    #[error("the target's kubeconfig Secret {name} has no key {key}")]
    KeyMissing {
        /// The Secret's name.
        name: String,
        /// The key.
        key: String,
    },
    /// the kubeconfig is unusable or refused (waits for a change).
    #[error("the kubeconfig in Secret {name} key {key} is refused: {problem}; nothing was applied")]
    Refused {
        /// The Secret's name.
        name: String,
        /// The key.
        key: String,
        /// What is wrong, naming fields, never values.
        problem: String,
    },
    /// the target failed at the connection level (retried with backoff).
    #[error("{}", connection_message(.server, .secret, *.failure, .detail))]
    Connection {
        /// The server URL (without credentials).
        server: String,
        /// The Secret's name.
        secret: String,
        /// What failed.
        failure: Failure,
        /// The transport's description (no credentials) and what was being done.
        detail: String,
    },
}

fn connection_message(server: &str, secret: &str, failure: Failure, detail: &str) -> String {
    match failure {
        Failure::Unreachable => format!("target {server} is unreachable: {detail}"),
        Failure::Unauthorized => {
            format!("target {server} does not accept the credentials in Secret {secret}: {detail}")
        }
        Failure::Tls => format!(
            "target {server}: TLS handshake failed: {detail} (check certificate-authority-data and the client certificate in Secret {secret})"
        ),
    }
}

impl TargetError {
    /// The static category (status reason, Event reason, metric label).
    pub fn category(&self) -> &'static str {
        match self {
            Self::SecretMissing { .. } | Self::KeyMissing { .. } | Self::Refused { .. } => {
                "TargetError"
            }
            Self::Connection {
                failure: Failure::Unreachable,
                ..
            } => "TargetUnreachable",
            Self::Connection { .. } => "TargetAuthError",
        }
    }

    /// A refused kubeconfig waits for a change (and is re-checked at `spec.interval`); the rest
    /// back off and retry.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Refused { .. })
    }

    /// The `reason` label of `module_manager_target_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SecretMissing { .. } | Self::KeyMissing { .. } => "secret",
            Self::Refused { .. } => "refused",
            Self::Connection { failure, .. } => failure.reason(),
        }
    }

    /// Whether the target can no longer be named at all (Secret or key gone, kubeconfig
    /// refused): a Manifest being deleted is then released, leaving the objects on the target.
    pub fn target_gone(&self) -> bool {
        !matches!(self, Self::Connection { .. })
    }
}

/// Why a kubeconfig is refused. Messages name fields and entries, never values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// no `current-context`.
    #[error("it has no current-context")]
    NoCurrentContext,
    /// the current context is not defined.
    #[error("its current-context {0:?} is not among its contexts")]
    MissingContext(String),
    /// the context's cluster is not defined.
    #[error("cluster {0:?} of the current context is not among its clusters")]
    MissingCluster(String),
    /// the context's user is not defined.
    #[error("user {0:?} of the current context is not among its users")]
    MissingUser(String),
    /// the cluster has no server.
    #[error("cluster {0:?} has no server")]
    NoServer(String),
    /// the server URL is not acceptable.
    #[error(
        "the server of cluster {cluster:?} must be an https:// URL without credentials, query or fragment: {problem}"
    )]
    BadServer {
        /// The cluster entry.
        cluster: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// a field that would run code, read a file, or weaken TLS.
    #[error("{owner} sets {field}: {why}")]
    Forbidden {
        /// `user "name"` or `cluster "name"`.
        owner: String,
        /// The kubeconfig field.
        field: &'static str,
        /// Why it is refused and what to use instead.
        why: &'static str,
    },
    /// a client certificate without its key, or the other way round.
    #[error("user {0:?} sets only one of client-certificate-data and client-key-data")]
    IncompleteCertificate(String),
}

const RUNS_CODE: &str = "module-manager never runs commands or plugins named by a kubeconfig; embed a token or a client certificate (token, client-certificate-data and client-key-data)";
const READS_FILE: &str = "module-manager never reads files named by a kubeconfig; embed the content instead (token, client-certificate-data, client-key-data, certificate-authority-data)";

/// A kubeconfig that passed [`validate`]: the current context only, with nothing but the
/// accepted fields.
#[derive(Clone)]
pub struct ValidKubeconfig {
    /// The server URL (it carries no credentials: those are refused).
    pub server: String,
    kubeconfig: Kubeconfig,
}

impl std::fmt::Debug for ValidKubeconfig {
    // Never the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValidKubeconfig")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// Parses the bytes of a kubeconfig Secret key. The parser's own message is not passed on: it
/// may quote the Secret's content.
pub fn parse(bytes: &[u8]) -> Result<Kubeconfig, String> {
    if bytes.len() > MAX_KUBECONFIG_BYTES {
        return Err(format!(
            "it is {} bytes, more than the limit of {MAX_KUBECONFIG_BYTES}",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_owned())?;
    Kubeconfig::from_yaml(text).map_err(|_| {
        "it is not a valid kubeconfig (YAML); the parser's message is not shown because it may quote the Secret".to_owned()
    })
}

/// Checks the current context of a kubeconfig and keeps only what module-manager accepts:
/// the cluster's `server` (https), `certificate-authority-data`, `tls-server-name`; the user's
/// `token`, `client-certificate-data` + `client-key-data` and impersonation. Refused: `exec`,
/// `auth-provider`, `tokenFile`, `client-certificate`, `client-key`, `certificate-authority`
/// (files), `username`/`password`, `insecure-skip-tls-verify: true`, `proxy-url`, and `http://`
/// servers. Other contexts, clusters and users are ignored (never used).
pub fn validate(kubeconfig: &Kubeconfig) -> Result<ValidKubeconfig, Refusal> {
    let context_name = kubeconfig
        .current_context
        .as_deref()
        .filter(|c| !c.is_empty())
        .ok_or(Refusal::NoCurrentContext)?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| Refusal::MissingContext(context_name.to_owned()))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| Refusal::MissingCluster(context.cluster.clone()))?;
    let user = match context.user.as_deref().filter(|u| !u.is_empty()) {
        None => None,
        Some(name) => Some((
            name,
            kubeconfig
                .auth_infos
                .iter()
                .find(|u| u.name == name)
                .and_then(|u| u.auth_info.as_ref())
                .ok_or_else(|| Refusal::MissingUser(name.to_owned()))?,
        )),
    };

    // The user first: the fields that would run code matter most.
    let mut accepted_user = AuthInfo::default();
    if let Some((name, user)) = user {
        let forbidden = |field, why| Refusal::Forbidden {
            owner: format!("user {name:?}"),
            field,
            why,
        };
        if user.exec.is_some() {
            return Err(forbidden("exec", RUNS_CODE));
        }
        if user.auth_provider.is_some() {
            return Err(forbidden("auth-provider", RUNS_CODE));
        }
        if set(&user.token_file) {
            return Err(forbidden("tokenFile", READS_FILE));
        }
        if set(&user.client_certificate) {
            return Err(forbidden("client-certificate", READS_FILE));
        }
        if set(&user.client_key) {
            return Err(forbidden("client-key", READS_FILE));
        }
        if set(&user.username) || user.password.is_some() {
            return Err(forbidden(
                "username/password",
                "basic authentication was removed from Kubernetes in 1.19; use a token or a client certificate",
            ));
        }
        if set(&user.client_certificate_data) != user.client_key_data.is_some() {
            return Err(Refusal::IncompleteCertificate(name.to_owned()));
        }
        accepted_user = AuthInfo {
            token: user.token.clone(),
            client_certificate_data: user.client_certificate_data.clone(),
            client_key_data: user.client_key_data.clone(),
            impersonate: user.impersonate.clone(),
            impersonate_uid: user.impersonate_uid.clone(),
            impersonate_groups: user.impersonate_groups.clone(),
            impersonate_user_extra: user.impersonate_user_extra.clone(),
            ..Default::default()
        };
    }

    let cluster_name = context.cluster.clone();
    let forbidden = |field, why| Refusal::Forbidden {
        owner: format!("cluster {cluster_name:?}"),
        field,
        why,
    };
    if set(&cluster.certificate_authority) {
        return Err(forbidden("certificate-authority", READS_FILE));
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        return Err(forbidden(
            "insecure-skip-tls-verify",
            "the server's certificate must be verified (set certificate-authority-data, or use a certificate the system trusts)",
        ));
    }
    if set(&cluster.proxy_url) {
        return Err(forbidden(
            "proxy-url",
            "proxies are not supported for targets",
        ));
    }
    let server = cluster
        .server
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Refusal::NoServer(cluster_name.clone()))?;
    check_server(server).map_err(|problem| Refusal::BadServer {
        cluster: cluster_name.clone(),
        problem,
    })?;

    let accepted_cluster = KubeconfigCluster {
        server: Some(server.to_owned()),
        certificate_authority_data: cluster.certificate_authority_data.clone(),
        tls_server_name: cluster.tls_server_name.clone(),
        ..Default::default()
    };
    const NAME: &str = "target";
    Ok(ValidKubeconfig {
        server: server.to_owned(),
        kubeconfig: Kubeconfig {
            clusters: vec![NamedCluster {
                name: NAME.into(),
                cluster: Some(accepted_cluster),
                ..Default::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: NAME.into(),
                auth_info: Some(accepted_user),
                ..Default::default()
            }],
            contexts: vec![NamedContext {
                name: NAME.into(),
                context: Some(KubeconfigContext {
                    cluster: NAME.into(),
                    user: Some(NAME.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            current_context: Some(NAME.into()),
            ..Default::default()
        },
    })
}

fn set(field: &Option<String>) -> bool {
    field.as_deref().is_some_and(|f| !f.is_empty())
}

/// `https://host[:port][/path]`, nothing else: a URL with credentials would put them in every
/// message naming the server.
fn check_server(server: &str) -> Result<(), &'static str> {
    let uri: http::Uri = server.parse().map_err(|_| "not a URL")?;
    if uri.scheme_str() != Some("https") {
        return Err("the scheme is not https");
    }
    let authority = uri.authority().ok_or("no host")?;
    if authority.as_str().contains('@') {
        return Err("it carries credentials");
    }
    if uri.query().is_some() || server.contains('#') {
        return Err("it has a query or fragment");
    }
    Ok(())
}

/// Classifies a failed request: `Some` when the target itself failed (unreachable, credentials
/// refused, TLS), with a description of the transport error that carries no credentials;
/// `None` for answers about the request (403, 404, 422, 500 …).
pub fn classify(error: &kube::Error) -> Option<(Failure, String)> {
    if let kube::Error::Api(status) = error {
        return (status.code == 401)
            .then(|| (Failure::Unauthorized, "401 Unauthorized".to_owned()));
    }
    // Walk the whole chain, also into `io::Error`s (whose `source()` skips their inner error).
    let mut stack: Vec<&(dyn StdError + 'static)> = vec![error];
    let mut unreachable = false;
    while let Some(e) = stack.pop() {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some((Failure::Tls, tls.to_string()));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            unreachable |= network_kind(io.kind());
            if let Some(inner) = io.get_ref() {
                stack.push(inner);
            }
        }
        if let Some(client) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            unreachable |= client.is_connect();
        }
        if let Some(kube::Error::HyperError(hyper)) = e.downcast_ref::<kube::Error>() {
            unreachable |= hyper.is_timeout() || hyper.is_closed() || hyper.is_incomplete_message();
        }
        if let Some(source) = e.source() {
            stack.push(source);
        }
    }
    unreachable.then(|| (Failure::Unreachable, describe_chain(error)))
}

/// `a: b: c` from an error's sources, without the top level (kube's own wrapper) and without
/// repeats.
fn describe_chain(error: &kube::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = error.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    if parts.is_empty() {
        parts.push(error.to_string());
    }
    let mut text = parts.join(": ");
    if text.len() > 300 {
        let mut end = 300;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

fn network_kind(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::NotConnected
            | ErrorKind::TimedOut
            | ErrorKind::HostUnreachable
            | ErrorKind::NetworkUnreachable
            | ErrorKind::NetworkDown
            | ErrorKind::AddrNotAvailable
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof
    )
}

/// The kube error inside an apply-step error, and what was being done.
fn apply_source(error: &ApplyError) -> Option<(&kube::Error, String)> {
    match error {
        ApplyError::Discovery(e) => Some((e, "discovery".to_owned())),
        ApplyError::Api { object, source } => Some((source, object.clone())),
        _ => None,
    }
}

/// A Secret key holding a target's kubeconfig: what the client cache is keyed by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SecretKey {
    /// The Secret's namespace (the Manifest's).
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// The key.
    pub key: String,
}

/// The version of a Secret a client was built from: a client is reused only while both match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// `metadata.uid` (a deleted and re-created Secret differs).
    pub uid: String,
    /// `metadata.resourceVersion` (any change to the Secret differs).
    pub resource_version: String,
}

/// Which cache entries to drop at `now`: those unused for longer than `idle`, then the least
/// recently used until at most `max` remain.
pub fn to_evict<K: Clone>(
    entries: &[(K, Instant)],
    now: Instant,
    max: usize,
    idle: Duration,
) -> Vec<K> {
    let mut evict = Vec::new();
    let mut kept: Vec<&(K, Instant)> = Vec::new();
    for entry in entries {
        if now.saturating_duration_since(entry.1) > idle {
            evict.push(entry.0.clone());
        } else {
            kept.push(entry);
        }
    }
    if kept.len() > max {
        kept.sort_by_key(|(_, used)| *used);
        let excess = kept.len() - max;
        evict.extend(kept.into_iter().take(excess).map(|(k, _)| k.clone()));
    }
    evict
}

struct Entry {
    fingerprint: Fingerprint,
    server: String,
    cluster: Arc<Cluster>,
    last_used: Instant,
}

/// The cache of remote target clients (one per kubeconfig Secret key).
pub struct TargetClients {
    settings: TargetSettings,
    metrics: TargetMetrics,
    entries: Mutex<HashMap<SecretKey, Entry>>,
}

impl Default for TargetClients {
    fn default() -> Self {
        Self::new(TargetSettings::default(), TargetMetrics::default())
    }
}

impl TargetClients {
    /// An empty cache.
    pub fn new(settings: TargetSettings, metrics: TargetMetrics) -> Self {
        Self {
            settings,
            metrics,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Clients cached now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no client is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The metrics (errors by reason, cached clients).
    pub fn metrics(&self) -> &TargetMetrics {
        &self.metrics
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SecretKey, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops idle and excess clients.
    fn prune(&self, entries: &mut HashMap<SecretKey, Entry>, now: Instant) {
        let used: Vec<(SecretKey, Instant)> = entries
            .iter()
            .map(|(k, e)| (k.clone(), e.last_used))
            .collect();
        for stale in to_evict(&used, now, self.settings.max_clients, self.settings.idle) {
            entries.remove(&stale);
        }
        self.metrics.clients.set(entries.len() as i64);
    }

    /// The cached client for this Secret version, if any (and marks it used).
    fn cached(&self, key: &SecretKey, fingerprint: &Fingerprint) -> Option<(Arc<Cluster>, String)> {
        let mut entries = self.lock();
        self.prune(&mut entries, Instant::now());
        let entry = entries
            .get_mut(key)
            .filter(|e| &e.fingerprint == fingerprint)?;
        entry.last_used = Instant::now();
        Some((entry.cluster.clone(), entry.server.clone()))
    }

    /// Caches a new client (replacing one built from an older version of the Secret), then
    /// drops idle and excess clients.
    fn insert(
        &self,
        key: SecretKey,
        fingerprint: Fingerprint,
        server: String,
        cluster: Arc<Cluster>,
    ) {
        let mut entries = self.lock();
        let now = Instant::now();
        entries.insert(
            key,
            Entry {
                fingerprint,
                server,
                cluster,
                last_used: now,
            },
        );
        self.prune(&mut entries, now);
    }

    /// Drops the client of a Secret key whatever version it was built from (the Secret is gone or
    /// no longer usable: that client must not be used again).
    fn forget(&self, key: &SecretKey) {
        let mut entries = self.lock();
        entries.remove(key);
        self.metrics.clients.set(entries.len() as i64);
    }

    /// Drops the client built from this version of the Secret (a newer one stays).
    fn evict(&self, key: &SecretKey, fingerprint: &Fingerprint) {
        let mut entries = self.lock();
        if entries
            .get(key)
            .is_some_and(|e| &e.fingerprint == fingerprint)
        {
            entries.remove(key);
        }
        self.metrics.clients.set(entries.len() as i64);
    }

    /// Counts a target error.
    fn count(&self, error: &TargetError) {
        self.metrics
            .errors
            .get_or_create(&TargetErrorLabels {
                reason: error.reason(),
            })
            .inc();
    }

    /// The client for a Secret key: cached while the Secret is unchanged, else built.
    async fn connect(
        &self,
        local: &Client,
        key: SecretKey,
    ) -> Result<(Arc<Cluster>, Fingerprint, String), ResolveError> {
        // Not counted as a target error: the local API server failed, not the target.
        let secret = Api::<Secret>::namespaced(local.clone(), &key.namespace)
            .get_opt(&key.name)
            .await
            .map_err(ResolveError::SecretRead)?;
        // The Secret cannot be used: neither can a client built from an earlier version of it.
        let fail = |error: TargetError| {
            self.forget(&key);
            self.count(&error);
            Err(ResolveError::Target(error))
        };
        let Some(secret) = secret else {
            return fail(TargetError::SecretMissing {
                name: key.name.clone(),
            });
        };
        let fingerprint = Fingerprint {
            uid: secret.uid().unwrap_or_default(),
            resource_version: secret.resource_version().unwrap_or_default(),
        };
        if let Some((cluster, server)) = self.cached(&key, &fingerprint) {
            return Ok((cluster, fingerprint, server));
        }
        let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(&key.key)) else {
            return fail(TargetError::KeyMissing {
                name: key.name.clone(),
                key: key.key.clone(),
            });
        };
        let refused = |problem: String| TargetError::Refused {
            name: key.name.clone(),
            key: key.key.clone(),
            problem,
        };
        let valid = match parse(&bytes.0).and_then(|k| validate(&k).map_err(|r| r.to_string())) {
            Ok(valid) => valid,
            Err(problem) => return fail(refused(problem)),
        };
        let server = valid.server.clone();
        let client = match self.client(valid).await {
            Ok(client) => client,
            Err(problem) => return fail(refused(problem.to_owned())),
        };
        tracing::info!(secret = %key.name, key = %key.key, %server, "connecting to a target cluster");
        let cluster = match Cluster::connect(client).await {
            Ok(cluster) => Arc::new(cluster),
            Err(error) => {
                return Err(
                    match self.connection_error(&key, &fingerprint, &server, error) {
                        Ok(target) => ResolveError::Target(target),
                        Err(apply) => ResolveError::Discovery(apply),
                    },
                );
            }
        };
        self.insert(key, fingerprint.clone(), server.clone(), cluster.clone());
        Ok((cluster, fingerprint, server))
    }

    /// A client with timeouts, from a validated kubeconfig. The messages name no content.
    async fn client(&self, valid: ValidKubeconfig) -> Result<Client, &'static str> {
        let mut config = Config::from_custom_kubeconfig(valid.kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|_| {
                "its certificate-authority-data, client-certificate-data or client-key-data cannot be decoded (base64 of PEM)"
            })?;
        config.connect_timeout = Some(self.settings.connect_timeout);
        config.read_timeout = Some(self.settings.request_timeout);
        config.write_timeout = Some(self.settings.request_timeout);
        // The read timeout counts from the request, not from when a pooled connection went idle.
        config.reset_reader_on_write = true;
        Client::try_from(config).map_err(|_| {
            "its certificates or key cannot be used for TLS (certificate-authority-data, client-certificate-data, client-key-data)"
        })
    }

    /// Turns an apply-step error on a target into a [`TargetError`] when the target itself
    /// failed (counting it, and evicting the client on 401 or TLS); other errors stay as they are.
    fn connection_error(
        &self,
        key: &SecretKey,
        fingerprint: &Fingerprint,
        server: &str,
        error: ApplyError,
    ) -> Result<TargetError, ApplyError> {
        let Some((failure, detail)) = apply_source(&error)
            .and_then(|(source, what)| classify(source).map(|(f, d)| (f, format!("{d} ({what})"))))
        else {
            return Err(error);
        };
        if failure.evicts() {
            self.evict(key, fingerprint);
        }
        let error = TargetError::Connection {
            server: server.to_owned(),
            secret: key.name.clone(),
            failure,
            detail,
        };
        self.count(&error);
        Ok(error)
    }
}

/// Why the cluster of a Manifest's target could not be had.
#[derive(Debug)]
pub enum ResolveError {
    /// reading the kubeconfig Secret from the local cluster failed.
    SecretRead(kube::Error),
    /// the target cannot be used (Secret, kubeconfig, connection).
    Target(TargetError),
    /// the target's discovery failed for a reason other than the connection.
    Discovery(ApplyError),
}

/// The cluster a pass applies to: the local one, or a Manifest's remote target.
pub struct Target<'a> {
    cluster: Held<'a>,
    remote: Option<Remote>,
}

enum Held<'a> {
    Local(&'a Cluster),
    Remote(Arc<Cluster>),
}

struct Remote {
    key: SecretKey,
    fingerprint: Fingerprint,
    server: String,
}

impl Deref for Target<'_> {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        match &self.cluster {
            Held::Local(cluster) => cluster,
            Held::Remote(cluster) => cluster,
        }
    }
}

impl Target<'_> {
    /// The remote server's URL; `None` for the local cluster.
    pub fn server(&self) -> Option<&str> {
        self.remote.as_ref().map(|r| r.server.as_str())
    }

    /// An apply-step error of a pass on this target: on a remote target, an error of the target
    /// itself (unreachable, 401, TLS) becomes a [`TargetError`] (counted; 401/TLS evict the
    /// client); other errors come back unchanged.
    pub fn connection_error(
        &self,
        targets: &TargetClients,
        error: ApplyError,
    ) -> Result<TargetError, ApplyError> {
        match &self.remote {
            Some(remote) => {
                targets.connection_error(&remote.key, &remote.fingerprint, &remote.server, error)
            }
            None => Err(error),
        }
    }
}

/// The cluster a Manifest's module goes to: the local cluster without `spec.target`, else the
/// target named by the kubeconfig Secret (its client cached).
pub async fn resolve<'a>(
    manifest: &Manifest,
    local: &'a Cluster,
    client: &Client,
    targets: &TargetClients,
) -> Result<Target<'a>, ResolveError> {
    let Some(target) = &manifest.spec.target else {
        return Ok(Target {
            cluster: Held::Local(local),
            remote: None,
        });
    };
    let key = SecretKey {
        namespace: manifest.namespace().unwrap_or_default(),
        name: target.kubeconfig_secret_ref.name.clone(),
        key: target.kubeconfig_secret_ref.key.clone(),
    };
    let (cluster, fingerprint, server) = targets.connect(client, key.clone()).await?;
    Ok(Target {
        cluster: Held::Remote(cluster),
        remote: Some(Remote {
            key,
            fingerprint,
            server,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cr3t-t0ken-value";

    fn kubeconfig(user: &str, cluster: &str) -> Kubeconfig {
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: ctx\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nclusters:\n- name: c\n  cluster:\n{cluster}\nusers:\n- name: u\n  user:\n{user}\n"
        );
        parse(text.as_bytes()).unwrap()
    }

    const SERVER: &str =
        "    server: https://10.0.0.1:6443\n    certificate-authority-data: Q0E=\n";

    fn refusal(user: &str, cluster: &str) -> Refusal {
        validate(&kubeconfig(user, cluster)).unwrap_err()
    }

    #[test]
    fn inline_token_and_certificates_are_accepted_and_nothing_else_is_kept() {
        let valid = validate(&kubeconfig(
            &format!("    token: {TOKEN}\n    as: deployer\n"),
            &format!("{SERVER}    tls-server-name: api.example\n    disable-compression: true\n"),
        ))
        .unwrap();
        assert_eq!(valid.server, "https://10.0.0.1:6443");
        let kept = &valid.kubeconfig;
        assert_eq!(kept.current_context.as_deref(), Some("target"));
        let cluster = kept.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        assert_eq!(cluster.tls_server_name.as_deref(), Some("api.example"));
        assert_eq!(cluster.disable_compression, None);
        let user = kept.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(user.token.is_some());
        assert_eq!(user.impersonate.as_deref(), Some("deployer"));
        assert!(
            !format!("{valid:?}").contains(TOKEN),
            "Debug shows no token"
        );

        let certificate = validate(&kubeconfig(
            "    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n",
            SERVER,
        ))
        .unwrap();
        let user = certificate.kubeconfig.auth_infos[0]
            .auth_info
            .as_ref()
            .unwrap();
        assert_eq!(user.client_certificate_data.as_deref(), Some("Q0VSVA=="));
        assert!(user.client_key_data.is_some());
    }

    #[test]
    fn commands_plugins_and_files_are_refused_naming_the_field_not_the_value() {
        let cases = [
            (
                format!(
                    "    token: {TOKEN}\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/touch\n      args: [/tmp/pwned]\n"
                ),
                SERVER.to_owned(),
                "exec",
            ),
            (
                "    auth-provider:\n      name: oidc\n      config:\n        id-token: abc\n"
                    .into(),
                SERVER.into(),
                "auth-provider",
            ),
            (
                "    tokenFile: /var/run/secrets/token\n".into(),
                SERVER.into(),
                "tokenFile",
            ),
            (
                "    client-certificate: /etc/cert.pem\n    client-key-data: S0VZ\n".into(),
                SERVER.into(),
                "client-certificate",
            ),
            (
                "    client-certificate-data: Q0VSVA==\n    client-key: /etc/key.pem\n".into(),
                SERVER.into(),
                "client-key",
            ),
            (
                format!("    username: admin\n    password: {TOKEN}\n"),
                SERVER.into(),
                "username/password",
            ),
            (
                format!("    token: {TOKEN}\n"),
                "    server: https://10.0.0.1:6443\n    certificate-authority: /etc/ca.pem\n"
                    .into(),
                "certificate-authority",
            ),
            (
                format!("    token: {TOKEN}\n"),
                "    server: https://10.0.0.1:6443\n    insecure-skip-tls-verify: true\n".into(),
                "insecure-skip-tls-verify",
            ),
            (
                format!("    token: {TOKEN}\n"),
                format!("{SERVER}    proxy-url: http://proxy:3128\n"),
                "proxy-url",
            ),
        ];
        for (user, cluster, field) in cases {
            let refusal = refusal(&user, &cluster);
            assert!(
                matches!(&refusal, Refusal::Forbidden { field: f, .. } if *f == field),
                "{field}: {refusal:?}"
            );
            let message = refusal.to_string();
            assert!(message.contains(field), "{message}");
            for value in [TOKEN, "/bin/touch", "/etc/", "/var/run", "abc"] {
                assert!(!message.contains(value), "{field}: {message} shows {value}");
            }
        }
    }

    #[test]
    fn incomplete_or_unnamed_entries_are_refused() {
        assert_eq!(
            refusal("    client-certificate-data: Q0VSVA==\n", SERVER),
            Refusal::IncompleteCertificate("u".into())
        );
        let no_context = parse(b"apiVersion: v1\nkind: Config\n").unwrap();
        assert_eq!(
            validate(&no_context).unwrap_err(),
            Refusal::NoCurrentContext
        );
        let mut missing = kubeconfig("    token: t\n", SERVER);
        missing.current_context = Some("other".into());
        assert_eq!(
            validate(&missing).unwrap_err(),
            Refusal::MissingContext("other".into())
        );
        let mut no_user = kubeconfig("    token: t\n", SERVER);
        no_user.auth_infos.clear();
        assert_eq!(
            validate(&no_user).unwrap_err(),
            Refusal::MissingUser("u".into())
        );
        let mut no_cluster = kubeconfig("    token: t\n", SERVER);
        no_cluster.clusters.clear();
        assert_eq!(
            validate(&no_cluster).unwrap_err(),
            Refusal::MissingCluster("c".into())
        );
        assert_eq!(
            refusal("    token: t\n", "    certificate-authority-data: Q0E=\n"),
            Refusal::NoServer("c".into())
        );
    }

    #[test]
    fn servers_must_be_plain_https_urls() {
        for (server, problem) in [
            ("http://10.0.0.1:8080", "the scheme is not https"),
            (
                "https://admin:hunter2@10.0.0.1:6443",
                "it carries credentials",
            ),
            (
                "https://10.0.0.1:6443/?token=x",
                "it has a query or fragment",
            ),
            ("not a url", "not a URL"),
        ] {
            let refusal = refusal("    token: t\n", &format!("    server: {server}\n"));
            assert_eq!(
                refusal,
                Refusal::BadServer {
                    cluster: "c".into(),
                    problem
                },
                "{server}"
            );
            assert!(!refusal.to_string().contains("hunter2"));
        }
        assert!(
            validate(&kubeconfig(
                "    token: t\n",
                "    server: https://api.example/prefix\n"
            ))
            .is_ok()
        );
    }

    #[test]
    fn oversized_binary_and_malformed_secrets_are_refused_without_quoting_them() {
        let big = vec![b'a'; MAX_KUBECONFIG_BYTES + 1];
        assert!(parse(&big).unwrap_err().contains("more than the limit"));
        assert!(parse(&[0xff, 0xfe, 0x00]).unwrap_err().contains("UTF-8"));
        let malformed = format!("clusters: {TOKEN}\n");
        let problem = parse(malformed.as_bytes()).unwrap_err();
        assert!(problem.contains("not a valid kubeconfig"));
        assert!(!problem.contains(TOKEN));
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: "Unauthorized".into(),
            ..Default::default()
        }))
    }

    #[test]
    fn transport_failures_are_told_apart_from_answers() {
        let refused =
            kube::Error::Service(Box::new(std::io::Error::from(ErrorKind::ConnectionRefused)));
        assert_eq!(classify(&refused).map(|c| c.0), Some(Failure::Unreachable));
        let timeout = kube::Error::Service(Box::new(std::io::Error::new(
            ErrorKind::TimedOut,
            "deadline has elapsed",
        )));
        let (failure, detail) = classify(&timeout).unwrap();
        assert_eq!(failure, Failure::Unreachable);
        assert!(detail.contains("deadline has elapsed"), "{detail}");
        // A TLS error sits inside an io::Error, whose source() skips it.
        let tls = kube::Error::Service(Box::new(std::io::Error::new(
            ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        )));
        let (failure, detail) = classify(&tls).unwrap();
        assert_eq!(failure, Failure::Tls);
        assert!(detail.contains("UnknownIssuer"), "{detail}");
        assert_eq!(
            classify(&api_error(401)).map(|c| c.0),
            Some(Failure::Unauthorized)
        );
        for code in [403, 404, 409, 422, 500] {
            assert_eq!(classify(&api_error(code)), None, "{code}");
        }
        let other = kube::Error::Service(Box::new(std::io::Error::other("something else")));
        assert_eq!(classify(&other), None);
    }

    #[test]
    fn failures_map_to_categories_permanence_and_eviction() {
        let connection = |failure| TargetError::Connection {
            server: "https://10.0.0.1:6443".into(),
            secret: "remote".into(),
            failure,
            detail: "x".into(),
        };
        let unreachable = connection(Failure::Unreachable);
        assert_eq!(unreachable.category(), "TargetUnreachable");
        assert!(!unreachable.is_permanent() && !unreachable.target_gone());
        assert!(!Failure::Unreachable.evicts());
        assert!(Failure::Unauthorized.evicts() && Failure::Tls.evicts());
        assert_eq!(connection(Failure::Tls).category(), "TargetAuthError");
        assert_eq!(connection(Failure::Unauthorized).reason(), "auth");
        assert!(unreachable.to_string().contains("https://10.0.0.1:6443"));
        let refused = TargetError::Refused {
            name: "remote".into(),
            key: "kubeconfig".into(),
            problem: "p".into(),
        };
        assert!(refused.is_permanent() && refused.target_gone());
        assert_eq!(refused.category(), "TargetError");
        let missing = TargetError::SecretMissing {
            name: "remote".into(),
        };
        assert!(!missing.is_permanent() && missing.target_gone());
        assert_eq!(missing.reason(), "secret");
        for error in [unreachable, refused, missing] {
            assert!(crate::telemetry::metrics::TARGET_ERROR_REASONS.contains(&error.reason()));
        }
    }

    #[test]
    fn the_cache_drops_idle_clients_then_the_least_recently_used() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let idle = Duration::from_secs(100);
        let entries = [("a", at(0)), ("b", at(50)), ("c", at(120)), ("d", at(130))];
        // At 160: `a` idle for 160 s, `b` for 110 s; `c` and `d` recent.
        assert_eq!(to_evict(&entries, at(160), 10, idle), ["a", "b"]);
        // At most 1 kept: `c` (older) goes too.
        let mut evicted = to_evict(&entries, at(160), 1, idle);
        evicted.sort();
        assert_eq!(evicted, ["a", "b", "c"]);
        // Nothing idle, under the bound: nothing.
        assert!(to_evict(&entries, at(60), 4, idle).is_empty());
        assert_eq!(to_evict(&entries, at(60), 3, idle), ["a"]);
    }
}
