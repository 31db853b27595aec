//! What the admin API reads ([`AdminState`]: the registry, the fleet's views, this replica's
//! caches and queue, the drain switch, the review cache) and the path of the drain switch.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use prometheus_client::registry::Registry;
use tokio::sync::watch;

use super::reviews::Reviews;
use crate::apply::budget::BudgetSettings;
use crate::shard::fleet::FleetView;
use crate::shard::membership::Members;
use crate::work::caches::Work;

/// What the admin API reads.
#[derive(Clone)]
pub struct AdminState {
    /// The root metrics registry.
    pub registry: Arc<Registry>,
    /// Whether the Manifest watch has seen its first full list.
    pub synced: Arc<AtomicBool>,
    /// The fleet as this replica sees it (from the membership Leases).
    pub members: watch::Receiver<Members>,
    /// Shards and members as of this replica's last shard round.
    pub fleet: watch::Receiver<FleetView>,
    /// This replica's caches and queue (`None` in router tests without a controller).
    pub work: Option<Work>,
    /// Set by `POST /v1/drain`: hand every shard over and take none.
    pub drain: watch::Sender<bool>,
    /// The API server, for TokenReview/SubjectAccessReview and Manifest lookups (`None`:
    /// mutating endpoints refuse every caller).
    pub client: Option<kube::Client>,
    /// TokenReview answers kept briefly, and the limits on failed authentications.
    pub reviews: Arc<Reviews>,
    /// The fleet's `--manifest-selector`: the Manifests `GET /v1/targets` looks at.
    pub manifest_selector: Option<String>,
    /// Each remote target's fleet-wide request budget (`--target-qps`, `--target-burst`).
    pub target_budget: BudgetSettings,
}

/// The path the drain switch is authorized on (`nonResourceURLs` in a ClusterRole).
pub const DRAIN_PATH: &str = "/v1/drain";

/// The path the fleet's targets are authorized on (`get`, `nonResourceURLs` in a ClusterRole).
pub const TARGETS_PATH: &str = "/v1/targets";
