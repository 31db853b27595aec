//! Cheap drift passes on remote targets: what module-manager's applies answered there
//! ([`Applied`]), and, for one pass, the versions a metadata-only LIST of each kind finds now
//! ([`Listing`]). There is no watch on a target (it would be one long-lived watch per kind per
//! kubeconfig): a drift pass lists instead, by the Manifest's UID label, skips the objects at
//! the resourceVersion its last apply answered with, reads the workloads whose status alone
//! changed, and applies the rest
//! ([`plan::unchanged::listed_since`](crate::plan::unchanged::listed_since) decides).
//! docs/reconcile.md, "Cheap drift passes".

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};
use kube::discovery::ApiResource;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::labels::{FIELD_MANAGER, MANIFEST_UID_LABEL};
use crate::api::InventoryEntry;
use crate::plan::Scope;
use crate::plan::applied_stamps;
use crate::plan::ownership::uid_key;
use crate::plan::unchanged::{Body, Found, Kind, Name, Stamp, generation_follows_spec};
use crate::telemetry::events::shorten;
use crate::telemetry::metrics::{LISTING_OUTCOMES, ListingLabels};

/// Objects per page of a listing; a Manifest's objects of one kind rarely fill one.
const PAGE: u32 = 500;
/// Most pages read per kind: past that, the kind is not listed (its objects are applied).
const MAX_PAGES: usize = 4;
/// The most bytes of an error answer a warning quotes (the target's API server may be a
/// tenant's).
const MESSAGE_LIMIT: usize = 512;
/// How long a kind whose listing the target refused (403: the credential may not `list` it) is
/// not listed again through this client: its objects are applied meanwhile, as before the
/// listings, without a refused request per pass.
const REFUSED_FOR: Duration = Duration::from_secs(15 * 60);

/// What an apply answered (the object's resourceVersion, UID and generation) and the digest of
/// the body sent.
type Record = (Stamp, Body);

/// The applies of one target's client, by kind and name: what each answered (`None`: it failed,
/// or answered with nothing to compare — the object is applied again, and the stamp in its
/// Manifest's status is not used, this process having applied it). Kept as long as the client
/// is cached, dropped when the object is deleted or a listing no longer finds it.
#[derive(Debug, Default)]
pub struct Applied {
    records: Mutex<HashMap<Kind, HashMap<Name, Option<Record>>>>,
    /// Kinds whose listing the target refused, and when.
    refused: Mutex<HashMap<Kind, Instant>>,
    /// Listings by outcome (`module_manager_target_drift_listings_total`).
    outcomes: ListingOutcomes,
}

/// Listings by [`Listed::outcome`], the replica's counter family (or a detached one).
pub type ListingOutcomes = Family<ListingLabels, Counter>;

fn name_of(id: &InventoryEntry) -> Name {
    (id.namespace.clone(), id.name.clone())
}

impl Applied {
    /// No records yet; listings counted in `outcomes`.
    pub fn counted(outcomes: ListingOutcomes) -> Self {
        Self {
            outcomes,
            ..Self::default()
        }
    }

    /// Counts one listing's outcome.
    pub(super) fn count(&self, listed: &Listed) {
        let outcome = listed.outcome();
        self.outcomes
            .get_or_create(&ListingLabels { outcome })
            .inc();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Kind, HashMap<Name, Option<Record>>>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The apply of `id`, which sent `body`, answered with `stamp` (`None`: it failed, said
    /// nothing, or left a field to another manager: applied again next time).
    pub(super) fn applied(&self, id: &InventoryEntry, stamp: Option<Stamp>, body: Body) {
        let mut records = self.lock();
        let objects = records.entry(Kind::of(id)).or_default();
        let record = stamp.filter(|s| !s.version.is_empty()).map(|s| (s, body));
        objects.insert(name_of(id), record);
    }

    /// `id` was read at `stamp` and found changed in its status only since its last apply
    /// ([`crate::plan::unchanged::only_status_changed`]): its record moves to that version (the
    /// digest of the body sent stays), so that the next listing finds it untouched.
    pub(super) fn refresh(&self, id: &InventoryEntry, stamp: Stamp) {
        if let Some(record) = self
            .lock()
            .get_mut(&Kind::of(id))
            .and_then(|objects| objects.get_mut(&name_of(id)))
            .and_then(Option::as_mut)
        {
            record.0 = stamp;
        }
    }

    /// `id` was never applied through this client, and its status keeps the stamp `kept` of an
    /// earlier record (made by another process: [`crate::plan::applied_stamps`]): when the
    /// listing `found` it as that record says and `body` is what was sent, the record is
    /// restored. Whether it was.
    pub(super) fn restore(
        &self,
        id: &InventoryEntry,
        kept: &str,
        found: &Found,
        body: Body,
    ) -> bool {
        let kind = Kind::of(id);
        let Some(stamp) = applied_stamps::restored(&kind, kept, found, &body) else {
            return false;
        };
        let mut records = self.lock();
        let objects = records.entry(kind).or_default();
        match objects.entry(name_of(id)) {
            std::collections::hash_map::Entry::Vacant(vacant) => {
                vacant.insert(Some((stamp, body)));
                true
            }
            std::collections::hash_map::Entry::Occupied(_) => false,
        }
    }

    /// Whether an apply of `id` went through this client (whatever it answered): a stamp in
    /// its status is then not used ([`Self::restore`]).
    pub(super) fn applied_here(&self, id: &InventoryEntry) -> bool {
        self.lock()
            .get(&Kind::of(id))
            .is_some_and(|objects| objects.contains_key(&name_of(id)))
    }

    /// What the Manifest's status is to keep of `ids` ([`crate::plan::applied_stamps`]), by
    /// [`uid_key`]: the stamp of each record held, and `None` for each object applied here
    /// with nothing to keep (its old stamp goes). Objects this client knows nothing of are
    /// left out (their stamps stay).
    pub fn stamps<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a InventoryEntry>,
    ) -> BTreeMap<String, Option<String>> {
        let records = self.lock();
        let mut stamps = BTreeMap::new();
        for id in ids {
            let kind = Kind::of(id);
            let Some(record) = records.get(&kind).and_then(|o| o.get(&name_of(id))) else {
                continue;
            };
            let kept = record
                .as_ref()
                .filter(|(s, _)| applied_stamps::keepable(&kind, s));
            let stamp = kept.map(|(stamp, body)| applied_stamps::stamp_of(&kind, stamp, body));
            stamps.insert(uid_key(id), stamp);
        }
        stamps
    }

    /// `id` was deleted (or its delete answered): nothing of it is kept.
    pub(super) fn forget(&self, id: &InventoryEntry) {
        if let Some(objects) = self.lock().get_mut(&Kind::of(id)) {
            objects.remove(&name_of(id));
        }
    }

    /// A listing of `ids`' kind found `versions`: the records of those it did not find go (the
    /// object was deleted or relabelled by someone; the pass applies it and records it again),
    /// so that nothing is kept of objects gone for good.
    pub(super) fn settle(&self, ids: &[&InventoryEntry], versions: &HashMap<Name, Found>) {
        let mut records = self.lock();
        for id in ids {
            let name = name_of(id);
            if !versions.contains_key(&name)
                && let Some(objects) = records.get_mut(&Kind::of(id))
            {
                objects.remove(&name);
            }
        }
    }

    /// Whether `kind`'s listing was refused less than [`REFUSED_FOR`] before `now`.
    pub(super) fn refused(&self, kind: &Kind, now: Instant) -> bool {
        let refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused
            .get(kind)
            .is_some_and(|at| now.saturating_duration_since(*at) < REFUSED_FOR)
    }

    /// A new credential may list what the last one could not: every kind is listed again.
    pub(super) fn forget_refusals(&self) {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// The target refused `kind`'s listing at `now`.
    pub(super) fn refuse(&self, kind: &Kind, now: Instant) {
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.insert(kind.clone(), now);
    }

    /// What the last apply of `id` answered, if it is kept.
    pub(super) fn record(&self, id: &InventoryEntry) -> Option<Record> {
        self.lock().get(&Kind::of(id))?.get(&name_of(id))?.clone()
    }

    /// Records kept (for tests).
    pub fn len(&self) -> usize {
        let records = self.lock();
        records.values().flat_map(HashMap::values).flatten().count()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One pass's look at its objects on a target: for each kind it could list, what the listing
/// found of every object labelled with the Manifest's UID. A kind that was not listed (no record
/// to compare with, not served, a failed request) is absent: its objects are applied.
#[derive(Debug, Default)]
pub struct Listing {
    found: HashMap<Kind, HashMap<Name, Found>>,
}

impl Listing {
    /// What the listing found of `id` (`None`: not listed, or its kind was not).
    pub fn found(&self, id: &InventoryEntry) -> Option<&Found> {
        self.found.get(&Kind::of(id))?.get(&name_of(id))
    }

    /// Records what one kind's listing found.
    pub(super) fn insert(&mut self, kind: Kind, found: HashMap<Name, Found>) {
        self.found.insert(kind, found);
    }
}

/// Where to list one kind's objects of a Manifest: in their namespace when they share one (a
/// ServiceAccount token bound to one namespace may list there), else cluster-wide.
pub(super) fn scope_of<'a>(ids: &[&'a InventoryEntry], scope: &Scope) -> Option<&'a str> {
    let namespaces: BTreeSet<&str> = ids.iter().map(|id| id.namespace.as_str()).collect();
    match (scope, namespaces.len()) {
        (Scope::Namespaced, 1) => namespaces.into_iter().next(),
        _ => None,
    }
}

/// What one kind's listing found.
pub(super) enum Listed {
    /// Each object labelled with the Manifest's UID, as listed.
    Found(HashMap<Name, Found>),
    /// The target refused it (403).
    Refused,
    /// The target answered with another error (what it said, shortened).
    Failed(String),
    /// More objects of the kind than [`MAX_PAGES`] pages hold.
    Overflow,
    /// No answer (connection refused, a timeout, TLS): the target itself failed, and an apply
    /// would fail the same way.
    Unanswered(kube::Error),
}

impl Listed {
    /// The metric label of this outcome (one of [`LISTING_OUTCOMES`]).
    pub(super) fn outcome(&self) -> &'static str {
        match self {
            Self::Found(_) => LISTING_OUTCOMES[0],
            Self::Refused => LISTING_OUTCOMES[1],
            Self::Failed(_) | Self::Overflow => LISTING_OUTCOMES[2],
            Self::Unanswered(_) => LISTING_OUTCOMES[3],
        }
    }
}

/// The objects of `resource` labelled with the Manifest `owner_uid`
/// (in `namespace`, or cluster-wide): one metadata-only LIST, a consistent read (no
/// `resourceVersion`: the API server answers as of now, never from an older cache), paged.
pub(super) async fn list_versions(
    client: &kube::Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    owner_uid: &str,
) -> Listed {
    let api: Api<kube::api::DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let selector = format!("{MANIFEST_UID_LABEL}={owner_uid}");
    let mut params = ListParams::default().labels(&selector).limit(PAGE);
    let mut versions = HashMap::new();
    let kind = Kind {
        group: resource.group.clone(),
        kind: resource.kind.clone(),
    };
    for _ in 0..MAX_PAGES {
        let page = match api.list_metadata(&params).await {
            Ok(page) => page,
            Err(kube::Error::Api(status)) if status.code == 403 => return Listed::Refused,
            Err(kube::Error::Api(status)) => {
                let message = shorten(&status.message, MESSAGE_LIMIT);
                return Listed::Failed(format!("HTTP {}: {message}", status.code));
            }
            // The transport failed (connect, TLS, a timeout): the target did not answer.
            Err(error @ (kube::Error::HyperError(_) | kube::Error::Service(_))) => {
                return Listed::Unanswered(error);
            }
            Err(error) => return Listed::Failed(shorten(&error.to_string(), MESSAGE_LIMIT).into()),
        };
        for item in page.items {
            let (name, found) = found_of(&kind, item.metadata);
            versions.insert(name, found);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Listed::Found(versions),
        }
    }
    Listed::Overflow
}

/// What a listing of `kind` tells of one object: its name and [`Found`] (its labels and
/// annotations only where [`generation_follows_spec`] reads them).
pub(super) fn found_of(kind: &Kind, meta: kube::api::ObjectMeta) -> (Name, Found) {
    let stamp = stamp_of(&meta);
    let keep = generation_follows_spec(kind);
    let name = (
        meta.namespace.unwrap_or_default(),
        meta.name.unwrap_or_default(),
    );
    let found = Found {
        stamp,
        deleting: meta.deletion_timestamp.is_some(),
        labels: meta.labels.filter(|_| keep).unwrap_or_default(),
        annotations: meta.annotations.filter(|_| keep).unwrap_or_default(),
    };
    (name, found)
}

/// An object's resourceVersion, UID and generation, and the digest of the fields
/// module-manager's applies own (its `Apply` entry of `managedFields`, of the object itself,
/// not of a subresource).
pub(super) fn stamp_of(meta: &kube::api::ObjectMeta) -> Stamp {
    let ours = meta.managed_fields.iter().flatten().find(|entry| {
        entry.manager.as_deref() == Some(FIELD_MANAGER)
            && entry.operation.as_deref() == Some("Apply")
            && entry.subresource.as_deref().unwrap_or_default().is_empty()
    });
    Stamp {
        version: meta.resource_version.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        generation: meta.generation,
        ours: ours.map(|entry| {
            use sha2::{Digest, Sha256};
            let fields = entry.fields_v1.as_ref().map(|f| &f.0);
            Sha256::digest(serde_json::to_vec(&fields).unwrap_or_default()).into()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: &str, namespace: &str, name: &str) -> InventoryEntry {
        InventoryEntry {
            group: String::new(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn at(version: &str) -> Stamp {
        Stamp {
            version: version.into(),
            ..Stamp::default()
        }
    }

    #[test]
    fn an_apply_is_kept_until_one_fails_or_the_object_is_deleted() {
        let applied = Applied::default();
        let cm = entry("ConfigMap", "a", "c");
        applied.applied(&cm, Some(at("7")), [1; 32]);
        assert_eq!(applied.record(&cm), Some((at("7"), [1; 32])));
        applied.applied(&cm, Some(at("9")), [2; 32]);
        assert_eq!(applied.record(&cm), Some((at("9"), [2; 32])));
        applied.applied(&cm, None, [2; 32]);
        assert_eq!(applied.record(&cm), None, "a failed apply forgets");
        assert!(applied.applied_here(&cm), "but remembers it applied");
        applied.applied(&cm, Some(at("")), [2; 32]);
        assert_eq!(applied.record(&cm), None, "an empty version is no record");
        applied.applied(&cm, Some(at("10")), [2; 32]);
        applied.forget(&cm);
        assert!(applied.is_empty());
        assert!(!applied.applied_here(&cm));
    }

    #[test]
    fn a_record_is_restored_from_its_stamp_only_where_nothing_was_applied() {
        let applied = Applied::default();
        let (cm, other, never) = (
            entry("ConfigMap", "a", "c"),
            entry("ConfigMap", "a", "other"),
            entry("ConfigMap", "a", "never"),
        );
        let stamp = Stamp {
            uid: "u-1".into(),
            ..at("7")
        };
        let kind = Kind::of(&cm);
        let kept = applied_stamps::stamp_of(&kind, &stamp, &[1; 32]);
        let found = Found {
            stamp: stamp.clone(),
            ..Found::default()
        };
        assert!(applied.restore(&cm, &kept, &found, [1; 32]));
        assert_eq!(applied.record(&cm), Some((stamp.clone(), [1; 32])));
        applied.applied(&other, None, [1; 32]);
        assert!(
            !applied.restore(&other, &kept, &found, [1; 32]),
            "applied here: this process knows better than the stamp"
        );
        let stamps = applied.stamps([&cm, &other, &never]);
        let expected = BTreeMap::from([(uid_key(&cm), Some(kept)), (uid_key(&other), None)]);
        assert_eq!(stamps, expected, "kept, dropped, left alone");
    }

    #[test]
    fn a_listing_drops_the_records_of_what_it_did_not_find() {
        let applied = Applied::default();
        let (kept, gone) = (
            entry("ConfigMap", "a", "kept"),
            entry("ConfigMap", "a", "gone"),
        );
        applied.applied(&kept, Some(at("1")), [1; 32]);
        applied.applied(&gone, Some(at("2")), [1; 32]);
        let found = Found {
            stamp: at("1"),
            ..Found::default()
        };
        let versions = HashMap::from([(name_of(&kept), found)]);
        applied.settle(&[&kept, &gone], &versions);
        assert!(applied.record(&kept).is_some());
        assert_eq!(applied.record(&gone), None);
    }

    #[test]
    fn a_refused_kind_is_not_listed_again_for_a_while() {
        let applied = Applied::default();
        let kind = Kind::of(&entry("ConfigMap", "a", "c"));
        let now = Instant::now();
        assert!(!applied.refused(&kind, now));
        applied.refuse(&kind, now);
        assert!(applied.refused(&kind, now + Duration::from_secs(60)));
        assert!(
            !applied.refused(&kind, now + REFUSED_FOR),
            "tried again later"
        );
    }

    #[test]
    fn a_kind_is_listed_in_its_one_namespace_or_cluster_wide() {
        let (a, b) = (entry("ConfigMap", "a", "x"), entry("ConfigMap", "a", "y"));
        let other = entry("ConfigMap", "b", "z");
        assert_eq!(scope_of(&[&a, &b], &Scope::Namespaced), Some("a"));
        assert_eq!(scope_of(&[&a, &other], &Scope::Namespaced), None);
        let node = entry("ClusterRole", "", "r");
        assert_eq!(scope_of(&[&node], &Scope::Cluster), None);
    }
}
