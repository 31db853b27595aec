//! Apply: a target cluster's discovery, server-side apply with one field manager, CRD
//! establishment, and deletion.

pub mod adoption;
pub mod budget;
pub mod catalog;
pub mod credential;
pub mod identity;
mod known_namespaces;
pub mod kubeconfig;
mod labels;
pub mod listed;
pub mod namespace;
pub mod ownership;
mod precondition;
pub mod surface;
pub mod target;
pub mod watched;
pub mod watched_secrets;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions,
    PropagationPolicy,
};
use kube::discovery::Discovery;
use kube::{Client, Error as KubeError, ResourceExt};

use crate::api::InventoryEntry;
use crate::plan::ownership::Guard;
use crate::plan::unchanged::Since;
use crate::plan::{RenderedObject, Scope, describe, drift};
use listed::Listing;
use serde_json::Value;
pub use surface::ApiSurface;

pub use labels::{FIELD_MANAGER, MANIFEST_SHARD_LABEL, MANIFEST_UID_LABEL};

/// How old a discovery snapshot [`Cluster::serves`] decides from may be.
const SERVES_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(1);

/// The Namespace whose UID identifies a cluster (every cluster has it; created by the API
/// server itself).
const IDENTITY_NAMESPACE: &str = "kube-system";

/// The Helm annotation that keeps an object when it leaves the chart or the release is deleted.
const RESOURCE_POLICY: &str = "helm.sh/resource-policy";

/// What a guarded delete did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// The delete was issued now; `terminating` when the object is still there (waiting for
    /// finalizers or dependents).
    Deleted {
        /// Whether the object still exists.
        terminating: bool,
    },
    /// A delete issued on an earlier pass is still in progress.
    Terminating,
    /// The object (or its kind) was already gone.
    Gone,
    /// The object was left alone, for the reason given.
    Kept(&'static str),
}

/// Why applying, reading or deleting an object failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// discovery of the target's API failed.
    #[error("discover the target's API: {0}")]
    Discovery(#[source] KubeError),
    /// the API server rejected the object as invalid (a chart bug: waits for a spec change).
    #[error("{object} was rejected: {message}")]
    Rejected {
        /// The object.
        object: String,
        /// The server's message.
        message: String,
    },
    /// a request failed for another reason (retried with backoff).
    #[error("{object}: {source}")]
    Api {
        /// The object.
        object: String,
        /// The error.
        #[source]
        source: KubeError,
    },
    /// the target does not serve the object's kind.
    #[error("{0}: the target does not serve this kind")]
    UnknownKind(String),
    /// the target served the object's kind and no longer does (discovery refreshed: its CRD
    /// was deleted); retried with backoff, the chart may bring the CRD again.
    #[error("{object}: kind {kind} is no longer served (its CRD was deleted?)")]
    NoLongerServed {
        /// The object.
        object: String,
        /// Its kind, `Kind.group/version`.
        kind: String,
    },
    /// the object exists but is not managed by this Manifest.
    #[error(
        "{0} already exists and is not managed by this Manifest; refusing to take it over (spec.adopt takes over objects no Manifest manages)"
    )]
    NotOwned(String),
    /// a hook object of the chart exists and is not this Manifest's.
    #[error(
        "{0} (a hook) already exists and is not managed by this Manifest; refusing to run the hook over it (spec.adopt takes over a module's objects, never a hook's: delete a hook object left behind, e.g. by helm install, to let the hook run)"
    )]
    HookNotOwned(String),
    /// the object exists and is labelled as another Manifest's (which created or took it over
    /// first).
    #[error(
        "{object} already exists and is managed by the Manifest with UID {owner}; refusing to take it over (spec.adopt takes over only objects of a Manifest that no longer exists)"
    )]
    OwnedByAnother {
        /// The object.
        object: String,
        /// The UID its `modulemanager.io/manifest-uid` label names.
        owner: String,
    },
    /// `spec.adopt`: the object is labelled as another Manifest's, which exists (retried: it is
    /// taken over once that Manifest is gone).
    #[error(
        "{object} already exists and is managed by the Manifest with UID {owner}, which exists; spec.adopt takes it over once that Manifest is gone (deleted with deletionPolicy: Orphan)"
    )]
    OwnerExists {
        /// The object.
        object: String,
        /// The UID its `modulemanager.io/manifest-uid` label names.
        owner: String,
    },
    /// the object the inventory recorded was deleted and another one created under its name:
    /// it is neither written nor deleted.
    #[error(
        "{object} was deleted and created again by someone else ({owner}); left alone: neither applied over nor deleted"
    )]
    Replaced {
        /// The object.
        object: String,
        /// Whose label the new one carries, as a phrase.
        owner: String,
    },
    /// the object changed between the read that decided to take it over and the write
    /// (retried: the next pass decides again).
    #[error("{0} changed while it was being taken over; the next pass decides again")]
    Changed(String),
    /// the precondition of a guarded apply failed (decided on by `apply_owned`, never shown).
    #[error("{0}: the apply's precondition failed")]
    PreconditionFailed(String),
    /// CRDs did not become Established in time.
    #[error("CustomResourceDefinition {0} is not Established")]
    CrdNotEstablished(String),
    /// the API server refused the request for lack of a permission (the identity the pass
    /// writes with may not do it; retried with backoff: RBAC may be granted).
    #[error("{object} is forbidden: {message}")]
    Forbidden {
        /// The object.
        object: String,
        /// The server's message: the user, the verb, the resource and the namespace.
        message: String,
    },
    /// the Manifest an object's label names could not be looked up (`spec.adopt`: only an
    /// object of a Manifest that no longer exists is taken over).
    #[error(
        "look up the Manifest with UID {owner}, which an object to adopt is labelled with: kubernetes API: {source}"
    )]
    ReadOwner {
        /// The UID the object's label names.
        owner: String,
        /// The listing's error.
        #[source]
        source: KubeError,
    },
    /// a Manifest names a ServiceAccount but this Context cannot impersonate (it was built
    /// from a client without its connection settings).
    #[error("this operator cannot impersonate ServiceAccounts (no connection settings)")]
    NoImpersonation,
}

impl ApplyError {
    /// Whether retrying without a spec change cannot help.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::Rejected { .. }
                | Self::NotOwned(_)
                | Self::HookNotOwned(_)
                | Self::OwnedByAnother { .. }
                | Self::Replaced { .. }
        )
    }

    fn from_kube(id: &InventoryEntry, source: KubeError) -> Self {
        match source {
            KubeError::Api(status) if matches!(status.code, 400 | 422) => Self::Rejected {
                object: describe(id),
                message: status.message,
            },
            KubeError::Api(status) if status.code == 403 => Self::Forbidden {
                object: describe(id),
                message: status.message,
            },
            source => Self::Api {
                object: describe(id),
                source,
            },
        }
    }
}

/// Whether a failed request's answer says the API server does not route the path at all — its
/// plain-text `404 page not found`, no `Status` of reason `NotFound` (an object that is missing
/// has one): the resource is not served, for instance because its CRD was deleted.
pub fn not_served(error: &KubeError) -> bool {
    matches!(error, KubeError::Api(status) if status.code == 404 && !status.is_not_found())
}

/// A kind as `Kind.group/version` (`Kind/version` in the core group), for messages.
pub fn kind_name(id: &InventoryEntry) -> String {
    if id.group.is_empty() {
        format!("{}/{}", id.kind, id.version)
    } else {
        format!("{}.{}/{}", id.kind, id.group, id.version)
    }
}

/// A cluster handle's discovery snapshot (shared with the handles whose clusters say the same,
/// [`surface::share`]), when it was taken, and the CRD catalog's generation read before it
/// started (0 without a catalog).
struct Discovered {
    surface: Arc<ApiSurface>,
    at: std::time::Instant,
    generation: u64,
}

/// Runs discovery (the version, then every group through aggregated discovery); `generation`:
/// the CRD catalog's, read before discovery started.
async fn discover(client: &Client, generation: u64) -> Result<Discovered, ApplyError> {
    let version = client
        .apiserver_version()
        .await
        .map_err(ApplyError::Discovery)?;
    let discovery = Discovery::new(client.clone())
        .run_aggregated()
        .await
        .map_err(ApplyError::Discovery)?;
    let surface = ApiSurface::from_discovery(version.git_version, &discovery);
    Ok(Discovered {
        surface: surface::share(surface),
        at: std::time::Instant::now(),
        generation,
    })
}

/// A cluster that modules are applied to, with its discovery cached.
pub struct Cluster {
    client: Client,
    surface: RwLock<Discovered>,
    /// The user the client impersonates, if any.
    user: Option<String>,
    /// The local cluster's CRDs, followed by a watch (`None`: a remote target, or a test
    /// Context: discovery alone, refreshed by age).
    catalog: Option<Arc<catalog::CrdCatalog>>,
    /// The cluster's identity, read once ([`Cluster::identity`]).
    identity: tokio::sync::OnceCell<Option<String>>,
    /// Namespaces known to exist, since when (`namespace.rs`): not read again for a while.
    namespaces: known_namespaces::Known,
    /// The objects applied and the watches of their kinds (`None`: every drift pass applies).
    followed: Option<Arc<watched::Followed>>,
    /// A remote target's applies, which a drift pass compares with a listing
    /// ([`Cluster::list_applied`]); `None` on the local cluster (its watches do that).
    listed: Option<Arc<listed::Applied>>,
}

impl Cluster {
    /// Connects and runs discovery.
    pub async fn connect(client: Client) -> Result<Self, ApplyError> {
        let surface = RwLock::new(discover(&client, 0).await?);
        Ok(Self {
            client,
            surface,
            user: None,
            catalog: None,
            identity: tokio::sync::OnceCell::new(),
            namespaces: known_namespaces::Known::default(),
            followed: None,
            listed: None,
        })
    }

    /// A remote target: its applies are recorded in `applied` (those of the client it replaces,
    /// when built for the same server from a renewed Secret, or new ones), and a drift pass
    /// lists its objects to tell which are unchanged ([`Cluster::list_applied`]); its discovery
    /// is refreshed less often ([`Cluster::discovery_max_age`]) and its namespaces are trusted
    /// longer (`known_namespaces.rs`).
    pub fn remote(self, applied: Arc<listed::Applied>) -> Self {
        Self {
            listed: Some(applied),
            namespaces: known_namespaces::Known::remote(),
            ..self
        }
    }

    /// Whether this is a remote target ([`Cluster::remote`]).
    pub fn is_remote(&self) -> bool {
        self.listed.is_some()
    }

    /// A remote target's recorded applies (`None` on the local cluster).
    pub fn applied(&self) -> Option<Arc<listed::Applied>> {
        self.listed.clone()
    }

    /// How old the discovery a render uses may be before a pass refreshes it: 5 minutes on the
    /// local cluster, whose CRDs a watch follows besides; 15 on a remote target, where every
    /// refresh is three requests per client (version, core and aggregated groups) to a cluster
    /// whose Manifests' drift passes otherwise cost a LIST per kind — at 5 minutes discovery
    /// was the larger part of an idle target's requests. A kind that is not known refreshes
    /// it at once either way.
    pub fn discovery_max_age(&self) -> Duration {
        if self.is_remote() {
            Duration::from_secs(15 * 60)
        } else {
            Duration::from_secs(5 * 60)
        }
    }

    /// Connects with a client that impersonates `user`, and runs discovery as that user.
    pub async fn connect_as(client: Client, user: String) -> Result<Self, ApplyError> {
        Ok(Self {
            user: Some(user),
            ..Self::connect(client).await?
        })
    }

    /// Follows `catalog` (the local cluster's CRDs): renders get its API versions
    /// ([`catalog::compose`]) and discovery is re-run on the next render after it changed.
    pub fn with_catalog(self, catalog: Option<Arc<catalog::CrdCatalog>>) -> Self {
        Self { catalog, ..self }
    }

    /// Records what its applies answer in `followed`, whose watches tell which objects are
    /// unchanged since ([`Cluster::since_applied`]). The local cluster only: the watches run as the
    /// operator.
    pub fn with_followed(self, followed: Option<Arc<watched::Followed>>) -> Self {
        Self { followed, ..self }
    }

    /// The objects applied and the watches of their kinds, if followed.
    pub fn followed(&self) -> Option<&Arc<watched::Followed>> {
        self.followed.as_ref()
    }

    /// What happened to `object` since module-manager's last apply of it, if that apply sent
    /// the body an apply of `object` for the Manifest `owner_uid` would send now: on the local
    /// cluster as the watch of its kind tells (untouched or changed), on a remote target as
    /// `listing` tells ([`crate::plan::unchanged::listed_since`]), from this process's record or,
    /// when it has none, one restored from the stamp the Manifest's status `kept`
    /// ([`crate::plan::applied_stamps`]). `Changed` when not followed.
    pub fn since_applied(
        &self,
        object: &RenderedObject,
        owner_uid: &str,
        listing: &Listing,
        kept: Option<&str>,
    ) -> Since {
        let sent = self.labelled(object, owner_uid);
        let body = body_digest(&sent);
        if let Some(applied) = &self.listed {
            let mut recorded = applied.record(&object.id);
            if let (None, Some(kept), Some(found)) = (&recorded, kept, listing.found(&object.id))
                && applied.restore(&object.id, kept, found, body)
            {
                recorded = applied.record(&object.id);
            }
            return crate::plan::unchanged::listed_since(
                &crate::plan::unchanged::Kind::of(&object.id),
                recorded.as_ref().map(|(stamp, digest)| (stamp, digest)),
                listing.found(&object.id),
                &body,
                &sent,
            );
        }
        let untouched = self
            .followed
            .as_ref()
            .is_some_and(|followed| followed.unchanged(&object.id, owner_uid, &body));
        if untouched {
            Since::Untouched
        } else {
            Since::Changed
        }
    }

    /// On a remote target, `object` read after its listing found only its status changed
    /// ([`Since::StatusOnly`]): the object as it is now, if it is still changed in its status
    /// only (checked again on what the read returned), its record then moved to the version
    /// read, so that the next pass finds it untouched. `None`: apply it (it changed meanwhile,
    /// is gone, nothing is recorded, or the read failed).
    pub async fn read_status_only(
        &self,
        object: &RenderedObject,
        owner_uid: &str,
    ) -> Option<DynamicObject> {
        let Some(applied) = &self.listed else {
            return None;
        };
        // The read only saves an apply: when it fails (a 429, a timeout), the object is applied.
        let live = match self.get(&object.id).await {
            Ok(Some(live)) => live,
            Ok(None) => return None,
            Err(error) => {
                tracing::debug!(object = %describe(&object.id), %error, "the read of a workload whose status changed failed; applying it");
                return None;
            }
        };
        let sent = self.labelled(object, owner_uid);
        let kind = crate::plan::unchanged::Kind::of(&object.id);
        let found = listed::found_of(&kind, live.metadata.clone()).1;
        let still = applied.record(&object.id).is_some_and(|(stamp, digest)| {
            digest == body_digest(&sent)
                && crate::plan::unchanged::only_status_changed(&kind, &stamp, &found, &sent)
        });
        if !still {
            return None;
        }
        applied.refresh(&object.id, found.stamp);
        Some(live)
    }

    /// On a remote target, the versions of the Manifest `owner_uid`'s objects among `ids`, one
    /// metadata-only LIST by its UID label per kind that has an apply recorded here, or a stamp
    /// in the status (`kept`, by [`crate::plan::ownership::uid_key`]: a record to restore)
    /// (none on the local cluster, where watches tell). A namespace in which objects were listed is
    /// known to exist (not read again by the next pass). A kind the target refuses or fails to
    /// list is left out (its objects are applied); a target that does not answer is an error,
    /// as an apply's would be (the pass ends there, after one timeout, not one per request).
    pub async fn list_applied(
        &self,
        owner_uid: &str,
        ids: &[&InventoryEntry],
        kept: &BTreeMap<String, String>,
    ) -> Result<Listing, ApplyError> {
        let mut listing = Listing::default();
        let Some(applied) = &self.listed else {
            return Ok(listing);
        };
        let known = |id: &InventoryEntry| {
            let key = crate::plan::ownership::uid_key(id);
            applied.record(id).is_some() || !applied.applied_here(id) && kept.contains_key(&key)
        };
        let mut kinds: HashMap<crate::plan::unchanged::Kind, Vec<&InventoryEntry>> = HashMap::new();
        for id in ids.iter().filter(|id| known(id)) {
            kinds
                .entry(crate::plan::unchanged::Kind::of(id))
                .or_default()
                .push(id);
        }
        let surface = self.surface();
        for (kind, of_kind) in kinds {
            let Some((resource, scope)) = surface.resolve(of_kind[0]) else {
                continue;
            };
            if applied.refused(&kind, std::time::Instant::now()) {
                continue;
            }
            let namespace = listed::scope_of(&of_kind, scope);
            let found = listed::list_versions(&self.client, resource, namespace, owner_uid).await;
            applied.count(&found);
            match found {
                listed::Listed::Found(versions) => {
                    let now = std::time::Instant::now();
                    for (namespace, _) in versions.keys().filter(|(ns, _)| !ns.is_empty()) {
                        self.namespaces.exists(namespace, now);
                    }
                    applied.settle(&of_kind, &versions);
                    listing.insert(kind, versions);
                }
                listed::Listed::Refused => {
                    let scope = namespace
                        .map_or("cluster-wide".to_owned(), |ns| format!("in namespace {ns}"));
                    tracing::warn!(kind = %kind.kind, group = %kind.group, "the target refuses to list this kind {scope} (RBAC: `list` is needed for cheap drift passes): its objects are applied on every drift pass; asked again in 15 minutes");
                    applied.refuse(&kind, std::time::Instant::now());
                }
                listed::Listed::Failed(reason) => {
                    tracing::warn!(kind = %kind.kind, group = %kind.group, "the drift listing of this kind failed ({reason}): its objects are applied in this pass");
                }
                listed::Listed::Overflow => {
                    tracing::warn!(kind = %kind.kind, group = %kind.group, "this Manifest has more objects of this kind than a drift listing reads (4 pages of 500): they are applied in this pass");
                }
                listed::Listed::Unanswered(error) => {
                    return Err(ApplyError::from_kube(of_kind[0], error));
                }
            }
        }
        Ok(listing)
    }

    /// `object` as applied for the Manifest `owner_uid`: labelled with its UID, and, where
    /// [`watched::Followed`] selects objects by shard, with its shard.
    fn labelled(&self, object: &RenderedObject, owner_uid: &str) -> Value {
        let stamp = self.followed.as_ref().map(|f| f.stamp(owner_uid));
        labelled(object, owner_uid, stamp)
    }

    /// The user this cluster's requests impersonate; `None`: the client's own identity.
    pub fn impersonating(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The cluster's identity: the UID of its `kube-system` Namespace, read once per handle
    /// (a remote target's client is cached, the local cluster's lives as long as the replica).
    /// `None` when this identity may not read it (403) or it does not exist; other failures are
    /// not kept (the next pass reads again).
    pub async fn identity(&self) -> Result<Option<String>, ApplyError> {
        let read = || async {
            let namespaces = Api::<Namespace>::all(self.client.clone());
            match namespaces.get_opt(IDENTITY_NAMESPACE).await {
                Ok(namespace) => Ok(namespace.and_then(|n| n.metadata.uid)),
                Err(KubeError::Api(status)) if status.code == 403 => Ok(None),
                Err(source) => Err(ApplyError::Api {
                    object: format!("Namespace/{IDENTITY_NAMESPACE}"),
                    source,
                }),
            }
        };
        self.identity.get_or_try_init(read).await.cloned()
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The discovery snapshot.
    pub fn surface(&self) -> Arc<ApiSurface> {
        self.discovered().surface.clone()
    }

    fn discovered(&self) -> std::sync::RwLockReadGuard<'_, Discovered> {
        self.surface.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-runs discovery (after CRDs changed, or when a kind is unknown).
    pub async fn refresh_discovery(&self) -> Result<(), ApplyError> {
        let generation = self.catalog.as_ref().map_or(0, |c| c.generation());
        let discovered = discover(&self.client, generation).await?;
        *self.surface.write().unwrap_or_else(|e| e.into_inner()) = discovered;
        Ok(())
    }

    /// The discovery snapshot, refreshed first when it is older than `max_age` (the target may
    /// have been upgraded, or served new APIs, since) or when the CRD catalog changed since it
    /// was taken.
    pub async fn fresh_surface(
        &self,
        max_age: std::time::Duration,
    ) -> Result<Arc<ApiSurface>, ApplyError> {
        let generation = self.catalog.as_ref().map(|c| c.generation());
        let stale = {
            let discovered = self.discovered();
            discovered.at.elapsed() > max_age
                || generation.is_some_and(|g| g != discovered.generation)
        };
        if stale {
            self.refresh_discovery().await?;
        }
        Ok(self.surface())
    }

    /// The `--api-versions` a render gets from `surface`: with a synced CRD catalog, discovery's
    /// built-in and aggregated APIs plus the Established CRDs' versions from the watch (the same
    /// on every replica from the moment a CRD changes); else discovery's list.
    pub fn render_api_versions(&self, surface: &ApiSurface) -> Arc<[String]> {
        match &self.catalog {
            Some(catalog) if catalog.is_synced() => {
                catalog.api_versions(&surface.api_versions).into()
            }
            _ => surface.api_versions.clone(),
        }
    }

    fn api_for(&self, id: &InventoryEntry) -> Result<Api<DynamicObject>, ApplyError> {
        let surface = self.surface();
        let (resource, scope) = surface
            .resolve(id)
            .ok_or_else(|| ApplyError::UnknownKind(describe(id)))?;
        Ok(match scope {
            Scope::Namespaced => Api::namespaced_with(self.client.clone(), &id.namespace, resource),
            Scope::Cluster => Api::all_with(self.client.clone(), resource),
        })
    }

    /// Whether the target serves `id`'s kind — the one place that decides it, asked when a
    /// snapshot lacks the kind or a request found no such resource: discovery is refreshed first
    /// (unless taken within the last second), so that neither a stale snapshot missing a new CRD nor one still listing a deleted CRD
    /// decides. A kind not served means its objects are gone (deleting a CRD deletes them).
    pub async fn serves(&self, id: &InventoryEntry) -> Result<bool, ApplyError> {
        // A snapshot taken in the last second is fresh enough: a prune or deletion of many
        // objects of one deleted kind asks once per object, and needs one discovery, not one
        // each.
        let surface = self.fresh_surface(SERVES_MAX_AGE).await?;
        Ok(surface.resolve(id).is_some())
    }

    /// The API of `id`'s kind; `None` when the target does not serve it (after [`Self::serves`]).
    async fn served_api(
        &self,
        id: &InventoryEntry,
    ) -> Result<Option<Api<DynamicObject>>, ApplyError> {
        match self.api_for(id) {
            Ok(api) => Ok(Some(api)),
            Err(ApplyError::UnknownKind(_)) if !self.serves(id).await? => Ok(None),
            Err(ApplyError::UnknownKind(_)) => self.api_for(id).map(Some),
            Err(e) => Err(e),
        }
    }

    /// The object as stored, if it exists (`None` too when its kind is not served any more).
    pub async fn get(&self, id: &InventoryEntry) -> Result<Option<DynamicObject>, ApplyError> {
        let Some(api) = self.served_api(id).await? else {
            return Ok(None);
        };
        match api.get_opt(&id.name).await {
            Err(e) if not_served(&e) && !self.serves(id).await? => Ok(None),
            result => result.map_err(|e| ApplyError::from_kube(id, e)),
        }
    }

    /// Server-side applies one object, labelled as managed by the Manifest `owner_uid`, and
    /// returns it as stored. Applied without `force` first: a field another manager changed
    /// is a conflict (HTTP 409), answered by a forced apply that takes the drift back — less
    /// the fields left to their owner ([`drift::yielded`]: an autoscaler's `spec.replicas`).
    /// No conflict, no second request.
    pub async fn apply(
        &self,
        object: &RenderedObject,
        owner_uid: &str,
    ) -> Result<DynamicObject, ApplyError> {
        self.server_side_apply(object, owner_uid, false, None).await
    }

    /// [`Cluster::apply`] carrying `guard`'s precondition in the body: when the API server
    /// refuses it, [`ApplyError::PreconditionFailed`] and nothing is written
    /// ([`ownership::apply_owned`] decides what comes next).
    pub async fn apply_guarded(
        &self,
        object: &RenderedObject,
        owner_uid: &str,
        guard: &Guard,
    ) -> Result<DynamicObject, ApplyError> {
        self.server_side_apply(object, owner_uid, false, Some(guard))
            .await
    }

    /// Applies `body` (fields at their live values, [`drift::handover`]) under
    /// [`drift::HANDOVER_MANAGER`], so that module-manager's next apply, which lacks them,
    /// does not release them to their defaults. Not forced: a conflict means another manager
    /// changed the field meanwhile and owns it — releasing it resets nothing then.
    pub async fn hand_over(&self, id: &InventoryEntry, body: &Value) -> Result<(), ApplyError> {
        let api = self.api_for(id)?;
        let params = PatchParams::apply(drift::HANDOVER_MANAGER);
        match api.patch(&id.name, &params, &Patch::Apply(body)).await {
            Ok(_) => Ok(()),
            Err(KubeError::Api(status)) if status.code == 409 => Ok(()),
            Err(e) => Err(ApplyError::from_kube(id, e)),
        }
    }

    /// Replaces the object's `managedFields` with `entries` (a merge patch replaces the list
    /// whole), only if it is still the object `uid` at `resource_version`: `None` when the
    /// API server answers 409 (another write came between — a controller's status write will
    /// do — and the next drift pass looks again). Changes no field of the object: it moves
    /// other managers' fields to module-manager ([`crate::plan::drift_report::take_over`]), so
    /// that the apply that follows reverts them. Returns the object as stored.
    pub async fn take_over_fields(
        &self,
        id: &InventoryEntry,
        uid: &str,
        resource_version: &str,
        entries: Vec<Value>,
    ) -> Result<Option<DynamicObject>, ApplyError> {
        let api = self.api_for(id)?;
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let patch = serde_json::json!({"metadata": {
            "uid": uid, "resourceVersion": resource_version, "managedFields": entries}});
        match api.patch(&id.name, &params, &Patch::Merge(&patch)).await {
            Ok(stored) => Ok(Some(stored)),
            Err(KubeError::Api(status)) if status.code == 409 => Ok(None),
            Err(e) => Err(ApplyError::from_kube(id, e)),
        }
    }

    /// Whether this cluster's identity may apply `object`: a server-side apply with
    /// `dryRun=All` (authorized and admitted like the real one, stored nowhere). Only a refusal
    /// for lack of permission fails; any other answer (a kind not served yet, a namespace the
    /// render creates first, an invalid object) is left for the real apply to report.
    pub async fn check_permitted(
        &self,
        object: &RenderedObject,
        owner_uid: &str,
    ) -> Result<(), ApplyError> {
        let Ok(api) = self.api_for(&object.id) else {
            return Ok(());
        };
        let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
        match api
            .patch(
                &object.id.name,
                &params,
                &Patch::Apply(&self.labelled(object, owner_uid)),
            )
            .await
        {
            Err(KubeError::Api(status)) if status.code == 403 => Err(ApplyError::Forbidden {
                object: describe(&object.id),
                message: status.message,
            }),
            _ => Ok(()),
        }
    }

    /// What [`Cluster::apply`] would store, without storing it: the same server-side apply (the
    /// same field manager, without `force` first and forced on a conflict less an autoscaler's
    /// `replicas`, labelled) with `dryRun=All`, so that defaulting, admission and fields released
    /// by the field manager show as the real apply would leave them. The caller strips the
    /// `driftIgnore` fields first, as a pass does (`reconcile::preview`).
    pub async fn dry_run_apply(
        &self,
        object: &RenderedObject,
        owner_uid: &str,
    ) -> Result<DynamicObject, ApplyError> {
        self.server_side_apply(object, owner_uid, true, None).await
    }

    /// The apply of [`Cluster::apply`] (`dry_run`: with `dryRun=All`, as `diff` previews it):
    /// without `force` first, and forced — less the fields left to autoscalers
    /// ([`drift::yielded`]) — when another manager changed a field the chart sets; with `guard`,
    /// its precondition in the body (both requests), and a refusal of it is
    /// [`ApplyError::PreconditionFailed`].
    async fn server_side_apply(
        &self,
        object: &RenderedObject,
        owner_uid: &str,
        dry_run: bool,
        guard: Option<&Guard>,
    ) -> Result<DynamicObject, ApplyError> {
        let api = self.api_for(&object.id)?;
        let mut body = self.labelled(object, owner_uid);
        let followed = self.followed.as_ref().filter(|_| !dry_run);
        let listed = self.listed.as_ref().filter(|_| !dry_run);
        let sent = (followed.is_some() || listed.is_some()).then(|| body_digest(&body));
        if let Some(guard) = guard {
            precondition::precondition(&mut body, guard);
        }
        if let Some(followed) = followed {
            let surface = self.surface();
            if let Some((resource, _)) = surface.resolve(&object.id) {
                followed.begin(&object.id, resource);
            }
        }
        let name = &object.id.name;
        let params = |force: bool| {
            let params = PatchParams::apply(FIELD_MANAGER);
            let params = if force { params.force() } else { params };
            if dry_run { params.dry_run() } else { params }
        };
        let mut yielded = false;
        let answer = match api.patch(name, &params(false), &Patch::Apply(&body)).await {
            Err(KubeError::Api(status))
                if status.code == 409
                    && (guard.is_none() || precondition::field_conflict(&status)) =>
            {
                for pointer in self.yielded(&object.id, &status.message).await {
                    yielded |= pointer.remove(&mut body);
                }
                api.patch(name, &params(true), &Patch::Apply(&body)).await
            }
            answer => answer,
        };
        if answer.is_err() {
            // The namespace may be gone: the next pass looks (and creates it).
            self.namespaces.forget(&object.id.namespace);
        }
        if let (Some(followed), Some(sent)) = (followed, sent) {
            // A field left to its owner was not applied: the object is not as the chart has
            // it, so a drift pass applies it again and asks again (an HPA removed by this very
            // pass's prune, after this apply, no longer keeps `replicas` then).
            let version = answer
                .as_ref()
                .ok()
                .filter(|o| !yielded && followed.would_see(o, owner_uid))
                .and_then(|o| o.metadata.resource_version.as_deref());
            followed.applied(&object.id, version, sent);
        }
        if let (Some(listed), Some(sent)) = (listed, sent) {
            // As above; a listing finds the object by its UID label only.
            let stamp = answer
                .as_ref()
                .ok()
                .filter(|o| {
                    !yielded
                        && o.labels().get(MANIFEST_UID_LABEL).map(String::as_str) == Some(owner_uid)
                })
                .map(|o| listed::stamp_of(&o.metadata));
            listed.applied(&object.id, stamp, sent);
        }
        match answer {
            Err(KubeError::Api(status)) if guard.is_some() && precondition::refused(&status) => {
                Err(ApplyError::PreconditionFailed(describe(&object.id)))
            }
            Err(e) if not_served(&e) && !self.serves(&object.id).await? => {
                Err(ApplyError::NoLongerServed {
                    object: describe(&object.id),
                    kind: kind_name(&object.id),
                })
            }
            answer => answer.map_err(|e| ApplyError::from_kube(&object.id, e)),
        }
    }

    /// The fields of an apply conflict left to their owner ([`drift::yielded`]); when the HPA
    /// controller holds `spec.replicas`, whether an HPA still targets the workload decides
    /// ([`Cluster::autoscaled`]: one list, only then).
    async fn yielded(&self, id: &InventoryEntry, message: &str) -> Vec<drift::Pointer> {
        let held_by = drift::replicas_held_by(id, message);
        let asks = held_by.iter().any(|m| m == drift::AUTOSCALER_CONTROLLER);
        let autoscaled = asks && self.autoscaled(id).await;
        drift::yielded(&held_by, autoscaled)
    }

    /// Whether a HorizontalPodAutoscaler in `id`'s namespace targets it (`autoscaling/v2`,
    /// `scaleTargetRef` of the same group, kind and name). `true` when they cannot be listed
    /// (no permission, an error): the autoscaler's value is kept, as before.
    async fn autoscaled(&self, id: &InventoryEntry) -> bool {
        use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
        let api = Api::<HorizontalPodAutoscaler>::namespaced(self.client.clone(), &id.namespace);
        let Ok(list) = api.list(&ListParams::default()).await else {
            return true;
        };
        list.items.iter().any(|hpa| {
            let target = &hpa.spec.scale_target_ref;
            let group = target.api_version.as_deref().unwrap_or_default();
            let group = group.split_once('/').map_or("", |(group, _)| group);
            (group, target.kind.as_str(), target.name.as_str())
                == (id.group.as_str(), id.kind.as_str(), id.name.as_str())
        })
    }

    /// Deletes an object managed by the Manifest `owner_uid`, in the background (dependents by
    /// the garbage collector). Objects without the Manifest's label, or annotated
    /// `helm.sh/resource-policy: keep`, are kept, and so is one whose UID is not
    /// `recorded_uid` (the inventory's: deleted and created again by someone else). The delete is
    /// conditional on the UID that was read, so an object re-created meanwhile is not hit.
    pub async fn delete(
        &self,
        id: &InventoryEntry,
        owner_uid: &str,
        recorded_uid: Option<&str>,
    ) -> Result<Deletion, ApplyError> {
        if let Some(listed) = &self.listed {
            // Whatever the outcome: an object being deleted, gone or left is not applied as is.
            listed.forget(id);
        }
        let Some(api) = self.served_api(id).await? else {
            return Ok(Deletion::Gone);
        };
        let Some(existing) = self.get(id).await? else {
            return Ok(Deletion::Gone);
        };
        if existing
            .labels()
            .get(MANIFEST_UID_LABEL)
            .map(String::as_str)
            != Some(owner_uid)
        {
            return Ok(Deletion::Kept("not managed by this Manifest"));
        }
        if recorded_uid.is_some_and(|uid| existing.metadata.uid.as_deref() != Some(uid)) {
            return Ok(Deletion::Kept("created again by someone else"));
        }
        if existing
            .annotations()
            .get(RESOURCE_POLICY)
            .map(String::as_str)
            == Some("keep")
        {
            return Ok(Deletion::Kept("helm.sh/resource-policy: keep"));
        }
        if existing.metadata.deletion_timestamp.is_some() {
            return Ok(Deletion::Terminating); // deleted on an earlier pass: no second request
        }
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: existing.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        // The answer is the object while it still exists, a Status once it is gone.
        match api.delete(&id.name, &params).await {
            Ok(either) => Ok(Deletion::Deleted {
                terminating: either.is_left(),
            }),
            Err(KubeError::Api(status)) if matches!(status.code, 404 | 409) => Ok(Deletion::Gone),
            Err(e) => Err(ApplyError::from_kube(id, e)),
        }
    }

    /// Waits until every named CRD is Established.
    pub async fn wait_established(
        &self,
        names: &[String],
        timeout: Duration,
    ) -> Result<(), ApplyError> {
        let api = Api::<CustomResourceDefinition>::all(self.client.clone());
        for name in names {
            let established = kube::runtime::wait::await_condition(
                api.clone(),
                name,
                kube::runtime::conditions::is_crd_established(),
            );
            match tokio::time::timeout(timeout, established).await {
                Ok(Ok(_)) => {}
                _ => return Err(ApplyError::CrdNotEstablished(name.clone())),
            }
        }
        Ok(())
    }
}

/// A digest of an apply body (what [`watched::Followed`] records of it).
fn body_digest(body: &Value) -> crate::plan::unchanged::Body {
    use sha2::{Digest, Sha256};
    Sha256::digest(serde_json::to_vec(body).unwrap_or_default()).into()
}

/// The object as applied: labelled as managed by the Manifest `owner_uid`, and with `stamp`
/// (a label and its value) if any.
fn labelled(
    object: &RenderedObject,
    owner_uid: &str,
    stamp: Option<(&str, String)>,
) -> serde_json::Value {
    let mut body = object.body.clone();
    if let Some(metadata) = body
        .get_mut("metadata")
        .and_then(serde_json::Value::as_object_mut)
    {
        let labels = metadata.entry("labels").or_insert(serde_json::Value::Null);
        if !labels.is_object() {
            // Absent, or `labels: null` from a template whose optional block rendered nothing.
            *labels = serde_json::json!({});
        }
        if let Some(labels) = labels.as_object_mut() {
            labels.insert(MANIFEST_UID_LABEL.into(), owner_uid.into());
            if let Some((key, value)) = stamp {
                labels.insert(key.into(), value.into());
            }
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_404_without_a_not_found_status_means_the_resource_is_not_served() {
        let answer = |code: u16, reason: &str| {
            KubeError::Api(
                kube::core::Status::failure("404 page not found", reason)
                    .with_code(code)
                    .boxed(),
            )
        };
        // What kube makes of the API server's plain-text answer for a path it does not route.
        assert!(not_served(&answer(404, "Failed to parse error data")));
        assert!(
            !not_served(&answer(404, "NotFound")),
            "an object that is missing"
        );
        assert!(!not_served(&answer(403, "Forbidden")));
        let core = InventoryEntry {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: String::new(),
            name: "c".into(),
        };
        assert_eq!(kind_name(&core), "ConfigMap/v1");
    }
}
