//! Identity: the local cluster as seen by a Manifest's ServiceAccount — clients that impersonate
//! it, cached per account — and what no module may write ([`Tenancy`]).
//!
//! An impersonating client is the operator's own connection with `Impersonate-User:
//! system:serviceaccount:<namespace>:<name>`: the API server authorizes every request as that
//! account (with the groups `system:serviceaccounts`, `system:serviceaccounts:<namespace>` and
//! `system:authenticated`, which it adds to an impersonated ServiceAccount user), after checking
//! that the operator may `impersonate` that `serviceaccounts` object. Each account gets its own
//! [`Cluster`] (its own discovery, made as the account); the cache is bounded (least recently
//! used first) and forgets accounts unused for a while.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Config;

use super::catalog::CrdCatalog;
use super::target::to_evict;
use super::watched::Followed;
use super::{ApplyError, Cluster};
use crate::plan::tenancy::{Protected, ServiceAccount, ServiceAccountPolicy};
use crate::telemetry::requests::{self, ApiRequestMetrics, RequestTarget};

/// Most impersonating clients cached at once.
const MAX_CLIENTS: usize = 256;
/// An impersonating client unused this long is dropped.
const IDLE: Duration = Duration::from_secs(30 * 60);

/// Who a pass writes a module's objects as, and what no module may write.
pub struct Tenancy {
    /// The operator's ServiceAccount flags.
    pub policy: ServiceAccountPolicy,
    /// The namespaces and Leases no module may write.
    pub protected: Protected,
    /// The operator's own connection, which impersonating clients copy; `None` where a
    /// Context is built from a client alone (tests): a Manifest naming a ServiceAccount then
    /// fails with [`ApplyError::NoImpersonation`].
    base: Option<Config>,
    clients: Mutex<HashMap<ServiceAccount, (Arc<Cluster>, Instant)>>,
    /// The local cluster's CRDs, which every impersonating client's renders follow.
    catalog: Option<Arc<CrdCatalog>>,
    /// The local cluster's applied objects and their watches, shared with the operator's client.
    followed: Option<Arc<Followed>>,
    /// Where the impersonating clients' API requests are counted.
    requests: ApiRequestMetrics,
}

impl Default for Tenancy {
    /// No impersonation, no policy, nothing protected.
    fn default() -> Self {
        Self::new(None, ServiceAccountPolicy::default(), Protected::default())
    }
}

impl Tenancy {
    /// Tenancy with the operator's connection `base`, its flags and what is protected.
    pub fn new(base: Option<Config>, policy: ServiceAccountPolicy, protected: Protected) -> Self {
        Self {
            policy,
            protected,
            base,
            clients: Mutex::new(HashMap::new()),
            catalog: None,
            followed: None,
            requests: ApiRequestMetrics::default(),
        }
    }

    /// Every impersonating client follows `catalog` (see [`Cluster::with_catalog`]).
    pub fn with_catalog(self, catalog: Option<Arc<CrdCatalog>>) -> Self {
        Self { catalog, ..self }
    }

    /// Every impersonating client records its applies in `followed` (see
    /// [`Cluster::with_followed`]).
    pub fn with_followed(self, followed: Option<Arc<Followed>>) -> Self {
        Self { followed, ..self }
    }

    /// Every impersonating client counts its requests into `requests` (target `impersonated`).
    pub fn with_requests(self, requests: ApiRequestMetrics) -> Self {
        Self { requests, ..self }
    }

    /// Impersonating clients cached now.
    pub fn cached(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ServiceAccount, (Arc<Cluster>, Instant)>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The local cluster as `account` sees it: cached, else connected (discovery as the account).
    pub async fn cluster_for(&self, account: &ServiceAccount) -> Result<Arc<Cluster>, ApplyError> {
        let now = Instant::now();
        if let Some((cluster, used)) = self.lock().get_mut(account) {
            *used = now;
            return Ok(cluster.clone());
        }
        let mut config = self.base.clone().ok_or(ApplyError::NoImpersonation)?;
        let user = account.username();
        config.auth_info.impersonate = Some(user.clone());
        config.auth_info.impersonate_groups = None;
        let client = requests::client(config, &self.requests, RequestTarget::Impersonated)
            .map_err(ApplyError::Discovery)?;
        let cluster = Arc::new(
            Cluster::connect_as(client, user)
                .await?
                .with_catalog(self.catalog.clone())
                .with_followed(self.followed.clone()),
        );
        let mut clients = self.lock();
        clients.insert(account.clone(), (cluster.clone(), now));
        let used: Vec<(ServiceAccount, Instant)> =
            clients.iter().map(|(k, (_, t))| (k.clone(), *t)).collect();
        for stale in to_evict(&used, now, MAX_CLIENTS, IDLE) {
            clients.remove(&stale);
        }
        Ok(cluster)
    }
}
