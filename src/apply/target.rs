//! Remote targets: the cluster a Manifest's module is applied to when `spec.target` names a
//! kubeconfig Secret.
//!
//! The Secret (in the Manifest's namespace) is read on every pass; its kubeconfig is parsed,
//! checked ([`validate`]: only inline credentials — never a command, a plugin or a file) and
//! turned into a client with connect and request timeouts, plus discovery: a [`Cluster`]. Clients are
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
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::KubeConfigOptions;
use kube::{Client, Config, ResourceExt};

use crate::api::Manifest;
use crate::apply::budget::{BudgetLayer, BudgetSettings, Counts, Share, TargetBudget, TargetUse};
use crate::apply::credential::Validity;
use crate::apply::kubeconfig::{ValidKubeconfig, parse, validate};
use crate::apply::listed;
pub use crate::apply::watched_secrets::Fingerprint;
use crate::apply::watched_secrets::WatchedSecrets;
use crate::apply::{ApplyError, Cluster};
use crate::telemetry::metrics::{TargetErrorLabels, TargetMetrics};
use crate::telemetry::requests::{self, CountRequests, RequestTarget};

/// How often a lookup drops idle clients (an insert always drops the excess).
const PRUNE_EVERY: Duration = Duration::from_secs(60);

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
    /// Each target's fleet-wide request budget (`--target-qps`, `--target-burst`).
    pub budget: BudgetSettings,
}

impl Default for TargetSettings {
    fn default() -> Self {
        Self {
            max_clients: 8192,
            idle: Duration::from_secs(30 * 60),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            budget: BudgetSettings::default(),
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
    /// the target is not the cluster the module was applied to (a kubeconfig Secret edited to
    /// name another cluster; waits for a change): nothing is applied, pruned or deleted there.
    #[error(
        "the target {server} named by Secret {secret} is not the cluster the module was applied to ({problem}); nothing was applied, pruned or deleted there"
    )]
    OtherCluster {
        /// The server URL (without credentials).
        server: String,
        /// The Secret's name.
        secret: String,
        /// What differs, naming the identities (UIDs of `kube-system` Namespaces).
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
            Self::SecretMissing { .. }
            | Self::KeyMissing { .. }
            | Self::Refused { .. }
            | Self::OtherCluster { .. } => "TargetError",
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
        matches!(self, Self::Refused { .. } | Self::OtherCluster { .. })
    }

    /// The `reason` label of `module_manager_target_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SecretMissing { .. } | Self::KeyMissing { .. } => "secret",
            Self::Refused { .. } | Self::OtherCluster { .. } => "refused",
            Self::Connection { failure, .. } => failure.reason(),
        }
    }

    /// Whether the target can no longer be named at all (Secret or key gone, kubeconfig
    /// refused, another cluster than the module's): a Manifest being deleted is then released,
    /// leaving the objects on the target.
    pub fn target_gone(&self) -> bool {
        !matches!(self, Self::Connection { .. })
    }
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
/// repeats; at most 300 bytes, keeping both ends.
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
    crate::telemetry::events::shorten(&parts.join(": "), 300).into_owned()
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
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretKey {
    /// The Secret's namespace (the Manifest's).
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// The key.
    pub key: String,
}

/// Each target's request budget on this replica, by Secret key: shared by the clients built
/// from it, with when it was last given to one.
#[derive(Clone, Default)]
pub struct Budgets(Arc<Mutex<BudgetMap>>);

/// Budgets by Secret key, with when each was last given to a client.
type BudgetMap = HashMap<SecretKey, (Arc<TargetBudget>, Instant)>;

impl Budgets {
    fn lock(&self) -> std::sync::MutexGuard<'_, BudgetMap> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `most` targets that pressed on their budget most in the last minute: those whose
    /// requests waited first (most waits first), then by requests; those that used none are
    /// left out.
    pub fn busiest(&self, most: usize) -> Vec<TargetUse> {
        let now = Instant::now();
        let used: Vec<(SecretKey, Counts)> = self
            .lock()
            .iter()
            .map(|(key, (budget, _))| (key.clone(), budget.last_minute(now)))
            .collect();
        busiest(used, most)
    }
}

/// The `most` entries of `used` with the most waits, then requests (ties: by key); none
/// without either. Waits first: a throttled target is always published, however many busier
/// ones never waited.
pub fn busiest(mut used: Vec<(SecretKey, Counts)>, most: usize) -> Vec<TargetUse> {
    used.retain(|(_, c)| c.requests + c.waits > 0);
    used.sort_by(|(ka, a), (kb, b)| {
        (b.waits, b.requests)
            .cmp(&(a.waits, a.requests))
            .then(ka.cmp(kb))
    });
    used.truncate(most);
    used.into_iter()
        .map(|(key, c)| TargetUse {
            namespace: key.namespace,
            secret: key.name,
            key: key.key,
            requests: c.requests,
            waits: c.waits,
        })
        .collect()
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
    /// When the client's credential expires, if it says (`credential.rs`).
    expires: Option<Validity>,
}

/// A client just built, to be cached.
struct Built {
    server: String,
    cluster: Arc<Cluster>,
    expires: Option<Validity>,
}

/// How many of `credentials` are due at `now` ([`Validity::due`]: expired, or in the last hour
/// or fifth of their life): `module_manager_target_credentials_expiring`.
pub fn expiring(credentials: impl Iterator<Item = Option<Validity>>, now: SystemTime) -> usize {
    credentials
        .filter(|c| c.is_some_and(|c| c.due(now)))
        .count()
}

/// The cache of remote target clients (one per kubeconfig Secret key).
pub struct TargetClients {
    settings: TargetSettings,
    metrics: TargetMetrics,
    entries: Arc<Mutex<HashMap<SecretKey, Entry>>>,
    /// What the clients of each Secret key recorded of their applies on the cluster with this
    /// digest ([`ValidKubeconfig::cluster_digest`]): shared by the clients built from that key
    /// (two passes that meet an uncached target at once both build one; a renewed Secret gets
    /// a new one) while they name the same cluster. Weak: the records live as long as a client
    /// holds them — a cached one, or one being built (so a prune meanwhile cannot split them).
    applied: Mutex<HashMap<SecretKey, (String, std::sync::Weak<listed::Applied>)>>,
    /// The request budget of each Secret key, shared by the clients built from it, and when it
    /// was last given to one: kept while a client holds it or for a while after, also when no
    /// client could be built (a target
    /// whose discovery fails — a 429 from an overloaded one, a 401 — gets no fresh bucket with
    /// each new client); dropped after [`TargetSettings::idle`] unused.
    budgets: Budgets,
    /// This replica's share of the fleet, which scales each target's budget (installed by the
    /// controller from its shard ownership).
    share: Share,
    /// When idle clients were last looked for by a lookup (at most once a minute: a prune
    /// copies and sorts every key, thousands at a replica's share of the targets).
    pruned_at: Mutex<Instant>,
    /// The Secrets' versions from a metadata-only watch (fed by `work/secret_versions.rs`).
    watched: Arc<WatchedSecrets>,
}

impl Default for TargetClients {
    fn default() -> Self {
        Self::new(TargetSettings::default(), TargetMetrics::default())
    }
}

impl TargetClients {
    /// An empty cache.
    pub fn new(settings: TargetSettings, metrics: TargetMetrics) -> Self {
        let entries: Arc<Mutex<HashMap<SecretKey, Entry>>> = Arc::default();
        let cached = entries.clone();
        metrics.expiring.install(move || {
            let entries = cached.lock().unwrap_or_else(|e| e.into_inner());
            expiring(entries.values().map(|e| e.expires), SystemTime::now()) as u64
        });
        Self {
            settings,
            metrics,
            entries,
            applied: Mutex::default(),
            budgets: Budgets::default(),
            share: Share::default(),
            pruned_at: Mutex::new(Instant::now()),
            watched: Arc::default(),
        }
    }

    /// The Secrets' versions the watch feeds.
    pub fn watched_secrets(&self) -> Arc<WatchedSecrets> {
        self.watched.clone()
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

    /// This replica's share of the fleet, for the targets' request budgets.
    pub fn share(&self) -> &Share {
        &self.share
    }

    /// The targets' request budgets on this replica (a handle: their use is published).
    pub fn budgets(&self) -> Budgets {
        self.budgets.clone()
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
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        applied.retain(|_, (_, records)| records.strong_count() > 0);
        let mut budgets = self.budgets.lock();
        // Held by a client (besides this map), or given to one recently.
        budgets.retain(|_, (budget, used)| {
            Arc::strong_count(budget) > 1
                || now.saturating_duration_since(*used) < self.settings.idle
        });
        self.publish(entries);
    }

    /// Sets the gauge of cached clients (the expiring credentials are counted when scraped).
    fn publish(&self, entries: &HashMap<SecretKey, Entry>) {
        self.metrics.clients.set(entries.len() as i64);
    }

    /// The cached client for this Secret version, if any (and marks it used).
    fn cached(&self, key: &SecretKey, fingerprint: &Fingerprint) -> Option<(Arc<Cluster>, String)> {
        let mut entries = self.lock();
        let now = Instant::now();
        let mut pruned_at = self.pruned_at.lock().unwrap_or_else(|e| e.into_inner());
        if now.saturating_duration_since(*pruned_at) >= PRUNE_EVERY {
            *pruned_at = now;
            self.prune(&mut entries, now);
        }
        let entry = entries
            .get_mut(key)
            .filter(|e| &e.fingerprint == fingerprint)?;
        entry.last_used = Instant::now();
        Some((entry.cluster.clone(), entry.server.clone()))
    }

    /// Caches a new client (replacing one built from an older version of the Secret), then
    /// drops idle and excess clients.
    fn insert(&self, key: SecretKey, fingerprint: Fingerprint, built: Built) {
        let mut entries = self.lock();
        let now = Instant::now();
        entries.insert(
            key,
            Entry {
                fingerprint,
                server: built.server,
                cluster: built.cluster,
                last_used: now,
                expires: built.expires,
            },
        );
        self.prune(&mut entries, now);
    }

    /// The records of applies for a client of `key` built for the cluster with `digest`: those
    /// of the clients built before from `key` for that same cluster (the same server, CA and TLS
    /// server name: a renewed token; besides, a pass verifies the cluster's identity before it
    /// applies anything, `reconcile/target.rs`), else new ones. So a renewed credential does
    /// not make the next drift pass apply every object again. Refused listings are forgotten:
    /// a new credential may list.
    fn applied_of(&self, key: &SecretKey, digest: &str) -> Arc<listed::Applied> {
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        let kept = applied
            .get(key)
            .filter(|(same, _)| same == digest)
            .and_then(|(_, records)| records.upgrade());
        match kept {
            Some(records) => {
                records.forget_refusals();
                records
            }
            None => {
                let records = Arc::new(listed::Applied::counted(
                    self.metrics.drift_listings.clone(),
                ));
                applied.insert(key.clone(), (digest.to_owned(), Arc::downgrade(&records)));
                records
            }
        }
    }

    /// The request budget of `key`'s clients: the one kept for it, else a full one.
    fn budget_of(&self, key: &SecretKey) -> Arc<TargetBudget> {
        let mut budgets = self.budgets.lock();
        let (budget, used) = budgets.entry(key.clone()).or_insert_with(|| {
            let budget = TargetBudget::new(
                self.settings.budget,
                self.share.clone(),
                self.metrics.budget_waits.clone(),
            );
            (Arc::new(budget), Instant::now())
        });
        *used = Instant::now();
        budget.clone()
    }

    /// Drops the client of a Secret key whatever version it was built from (the Secret is gone or
    /// no longer usable: that client must not be used again).
    fn forget(&self, key: &SecretKey) {
        let mut entries = self.lock();
        entries.remove(key);
        self.publish(&entries);
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
        self.publish(&entries);
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
        self.watched.want();
        // The watch shows the Secret unchanged since the client was built: no read.
        if let Some(fingerprint) = self.watched.known(&key.namespace, &key.name)
            && let Some((cluster, server)) = self.cached(&key, &fingerprint)
        {
            return Ok((cluster, fingerprint, server));
        }
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
        self.watched.read(
            &key.namespace,
            &key.name,
            secret.as_ref().map(|s| Fingerprint::of(&s.metadata)),
        );
        let Some(secret) = secret else {
            return fail(TargetError::SecretMissing {
                name: key.name.clone(),
            });
        };
        let fingerprint = Fingerprint::of(&secret.metadata);
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
        let expires = valid.credential_validity();
        let applied = self.applied_of(&key, &valid.cluster_digest());
        let client = match self.client(valid, self.budget_of(&key)).await {
            Ok(client) => client,
            Err(problem) => return fail(refused(problem.to_owned())),
        };
        tracing::info!(secret = %key.name, key = %key.key, %server, "connecting to a target cluster");
        let cluster = match Cluster::connect(client).await {
            Ok(cluster) => Arc::new(cluster.remote(applied)),
            Err(error) => {
                return Err(
                    match self.connection_error(&key, &fingerprint, &server, error) {
                        Ok(target) => ResolveError::Target(target),
                        Err(apply) => ResolveError::Discovery(apply),
                    },
                );
            }
        };
        let built = Built {
            server: server.clone(),
            cluster: cluster.clone(),
            expires,
        };
        self.insert(key, fingerprint.clone(), built);
        Ok((cluster, fingerprint, server))
    }

    /// A client with timeouts whose requests are counted and wait for `budget`, from a
    /// validated kubeconfig. The messages name no content.
    async fn client(
        &self,
        valid: ValidKubeconfig,
        budget: Arc<TargetBudget>,
    ) -> Result<Client, &'static str> {
        let mut config = Config::from_custom_kubeconfig(valid.into_kubeconfig(), &KubeConfigOptions::default())
            .await
            .map_err(|_| {
                "its certificate-authority-data, client-certificate-data or client-key-data cannot be decoded (base64 of PEM)"
            })?;
        config.connect_timeout = Some(self.settings.connect_timeout);
        config.read_timeout = Some(self.settings.request_timeout);
        config.write_timeout = Some(self.settings.request_timeout);
        // The read timeout counts from the request, not from when a pooled connection went idle.
        config.reset_reader_on_write = true;
        requests::with_user_agent(&mut config, requests::USER_AGENT);
        let counted = CountRequests::new(self.metrics.requests.clone(), RequestTarget::Remote);
        let builder = kube::client::ClientBuilder::try_from(config).map_err(|_| {
            "its certificates or key cannot be used for TLS (certificate-authority-data, client-certificate-data, client-key-data)"
        })?;
        // Counted when sent, after waiting for the budget.
        Ok(builder
            .with_layer(&counted)
            .with_layer(&BudgetLayer(budget))
            .build())
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
    Shared(Arc<Cluster>),
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
            Held::Shared(cluster) => cluster,
        }
    }
}

impl Target<'_> {
    /// The local cluster through a client that impersonates a ServiceAccount (its errors are
    /// the local cluster's: no remote target to blame).
    pub fn impersonated(cluster: Arc<Cluster>) -> Target<'static> {
        Target {
            cluster: Held::Shared(cluster),
            remote: None,
        }
    }

    /// The remote server's URL; `None` for the local cluster.
    pub fn server(&self) -> Option<&str> {
        self.remote.as_ref().map(|r| r.server.as_str())
    }

    /// The name of the remote target's kubeconfig Secret; `None` for the local cluster.
    pub fn secret(&self) -> Option<&str> {
        self.remote.as_ref().map(|r| r.key.name.as_str())
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

/// The kubeconfig Secret key of a Manifest's remote target (`spec.target`), if it has one: what
/// names a target in this replica (its client, records, budget and passes at once).
pub fn secret_key(manifest: &Manifest) -> Option<SecretKey> {
    let target = manifest.spec.target.as_ref()?;
    Some(SecretKey {
        namespace: manifest.namespace().unwrap_or_default(),
        name: target.kubeconfig_secret_ref.name.clone(),
        key: target.kubeconfig_secret_ref.key.clone(),
    })
}

/// The cluster a Manifest's module goes to: the local cluster without `spec.target`, else the
/// target named by the kubeconfig Secret (its client cached).
pub async fn resolve<'a>(
    manifest: &Manifest,
    local: &'a Cluster,
    client: &Client,
    targets: &TargetClients,
) -> Result<Target<'a>, ResolveError> {
    let Some(key) = secret_key(manifest) else {
        return Ok(Target {
            cluster: Held::Local(local),
            remote: None,
        });
    };
    let (cluster, fingerprint, server) = targets.connect(client, key.clone()).await?;
    Ok(Target {
        cluster: Held::Shared(cluster),
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
    fn clients_of_one_key_and_cluster_share_their_records_while_one_holds_them() {
        let clients = TargetClients::default();
        let key = SecretKey {
            namespace: "a".into(),
            name: "remote".into(),
            key: "kubeconfig".into(),
        };
        let first = clients.applied_of(&key, "cluster-1");
        // A prune while the first client is still being built (none cached) keeps them.
        clients.prune(&mut clients.lock(), Instant::now());
        let second = clients.applied_of(&key, "cluster-1");
        assert!(
            Arc::ptr_eq(&first, &second),
            "built at once, or renewed: shared"
        );
        let other = clients.applied_of(&key, "cluster-2");
        assert!(
            !Arc::ptr_eq(&first, &other),
            "another cluster: records of its own"
        );
        drop((first, second));
        let again = clients.applied_of(&key, "cluster-2");
        assert!(Arc::ptr_eq(&other, &again));
        drop((other, again));
        clients.prune(&mut clients.lock(), Instant::now());
        let applied = clients.applied.lock().unwrap();
        assert!(applied.is_empty(), "nothing kept once no client holds them");
    }

    #[test]
    fn credentials_due_count_as_expiring() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let expires = |offset: Duration, later: bool| {
            let expires = if later { now + offset } else { now - offset };
            Some(Validity {
                issued: None,
                expires,
            })
        };
        let credentials = [
            None,
            expires(Duration::from_secs(10), false),
            expires(Duration::from_secs(59 * 60), true),
            expires(Duration::from_secs(2 * 3600), true),
        ];
        assert_eq!(expiring(credentials.into_iter(), now), 2);
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

    #[test]
    fn the_busiest_targets_are_the_throttled_then_those_with_the_most_requests() {
        let key = |name: &str| SecretKey {
            namespace: "ns".into(),
            name: name.into(),
            key: "kubeconfig".into(),
        };
        let counts = |requests, waits| Counts { requests, waits };
        let used = vec![
            (key("quiet"), counts(0, 0)),
            (key("b"), counts(30, 0)),
            (key("a"), counts(30, 0)),
            (key("throttled"), counts(30, 12)),
            (key("busy"), counts(90, 0)),
            (key("few"), counts(1, 0)),
        ];
        let names =
            |uses: Vec<TargetUse>| -> Vec<String> { uses.into_iter().map(|u| u.secret).collect() };
        // A target that waited is listed before busier ones that did not.
        assert_eq!(
            names(busiest(used.clone(), 4)),
            ["throttled", "busy", "a", "b"]
        );
        assert_eq!(names(busiest(used.clone(), 1)), ["throttled"]);
        // The unused never, even with room.
        assert_eq!(names(busiest(used, 10)).len(), 5);
        let top = busiest(vec![(key("t"), counts(7, 2))], 1);
        assert_eq!(
            top,
            [TargetUse {
                namespace: "ns".into(),
                secret: "t".into(),
                key: "kubeconfig".into(),
                requests: 7,
                waits: 2,
            }]
        );
    }
}
