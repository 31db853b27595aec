//! Unchanged objects (pure): which of the modules' objects are, as far as a watch of their kind
//! tells, exactly as module-manager's last apply left them, so that a drift pass need not apply
//! them again (docs/reconcile.md, "Cheap drift passes").
//!
//! An object is *unchanged* when module-manager applied it, recorded the resourceVersion the API
//! server answered with (and a digest of the body it sent), and the watch of its kind has since
//! reported no other version of it and has not lost its place — and the body a pass would send
//! now is the one recorded (a pass whose render changed back to an older one, after a pass whose
//! status was never written, must not take the object as it is for the render it wants). Any write to an object — a field, a label, its status, a delete —
//! gives it a new resourceVersion, so every change is caught; the comparison is equality only
//! (resourceVersions are opaque, [API concepts: resource versions]). Everything else — an entry
//! never recorded, a version seen that is not the recorded one, a watch not (re)listed yet — means
//! "apply it": a mistake here costs an apply, never a missed repair beyond the watch's delay.
//!
//! [API concepts: resource versions]: https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions

use std::collections::{BTreeMap, HashMap, HashSet};

use kube::runtime::watcher;
use serde_json::Value;

use crate::api::InventoryEntry;

/// An object's kind, as its watch follows it (any version of it: a resourceVersion is the
/// object's, whatever version it is read at).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kind {
    /// API group, empty for the core group.
    pub group: String,
    pub kind: String,
}

impl Kind {
    /// The kind of `id`.
    pub fn of(id: &InventoryEntry) -> Self {
        Self {
            group: id.group.clone(),
            kind: id.kind.clone(),
        }
    }
}

/// An object of a followed kind: its namespace (empty when cluster-scoped) and name.
pub type Name = (String, String);

/// What the watch reports of one object: its namespace and name, and its resourceVersion.
pub type Seen = (Name, String);

/// A digest of the body of an apply (as sent, before any precondition).
pub type Body = [u8; 32];

/// What is known of one object since module-manager began applying it.
#[derive(Clone, Debug, PartialEq)]
enum Entry {
    /// The apply is under way; the last version the watch reported meanwhile, if any.
    Applying(Option<String>),
    /// The version the apply answered with and the body it sent; nothing else seen since.
    Applied(String, Body),
}

/// The state of one kind's watch.
#[derive(Debug, Default)]
struct Watch {
    /// The first list (or the last relist) is complete and the watch has not failed since.
    synced: bool,
    /// The objects of the list under way (between `Init` and `InitDone`).
    listing: Option<HashSet<Name>>,
}

/// The objects module-manager applied and the watches of their kinds.
#[derive(Debug, Default)]
pub struct Unchanged {
    watches: HashMap<Kind, Watch>,
    objects: HashMap<Kind, HashMap<Name, Entry>>,
}

fn name_of(id: &InventoryEntry) -> Name {
    (id.namespace.clone(), id.name.clone())
}

impl Unchanged {
    /// Whether `id` is exactly as module-manager's last apply left it, and that apply sent
    /// `body` (see the module's doc).
    pub fn unchanged(&self, id: &InventoryEntry, body: &Body) -> bool {
        let kind = Kind::of(id);
        let synced = self.watches.get(&kind).is_some_and(|w| w.synced);
        let entry = self.objects.get(&kind).and_then(|o| o.get(&name_of(id)));
        synced && matches!(entry, Some(Entry::Applied(_, sent)) if sent == body)
    }

    /// An apply of `id` begins (the previous record, if any, no longer holds). `true` when its
    /// kind is new: the caller starts its watch.
    pub fn begin(&mut self, id: &InventoryEntry) -> bool {
        let kind = Kind::of(id);
        let new = !self.watches.contains_key(&kind);
        if new {
            self.watches.insert(kind.clone(), Watch::default());
        }
        let objects = self.objects.entry(kind).or_default();
        objects.insert(name_of(id), Entry::Applying(None));
        new
    }

    /// The apply of `id`, which sent `body`, answered with `version`: recorded, unless the
    /// watch reported another version after the apply began (the object may have changed after
    /// it), the object was deleted meanwhile, or the version is empty (a server that does not
    /// version its objects: nothing can be told unchanged).
    pub fn applied(&mut self, id: &InventoryEntry, version: &str, body: Body) {
        let Some(objects) = self.objects.get_mut(&Kind::of(id)) else {
            return;
        };
        let name = name_of(id);
        let record = match objects.get(&name) {
            Some(Entry::Applying(None)) => !version.is_empty(),
            Some(Entry::Applying(Some(seen))) => seen == version && !version.is_empty(),
            _ => false,
        };
        if record {
            objects.insert(name, Entry::Applied(version.to_owned(), body));
        } else {
            objects.remove(&name);
        }
    }

    /// The apply of `id` failed, or its outcome is not known: it is applied next time.
    pub fn forget(&mut self, id: &InventoryEntry) {
        if let Some(objects) = self.objects.get_mut(&Kind::of(id)) {
            objects.remove(&name_of(id));
        }
    }

    /// The watch of `kind` failed: nothing of it is unchanged until it has listed again.
    pub fn lost(&mut self, kind: &Kind) {
        if let Some(watch) = self.watches.get_mut(kind) {
            watch.synced = false;
            watch.listing = None;
        }
    }

    /// One event of `kind`'s watch.
    pub fn on_event(&mut self, kind: &Kind, event: watcher::Event<Seen>) {
        // No allocation per event: both maps hold every followed kind from its `begin` on.
        let (Some(watch), Some(objects)) = (self.watches.get_mut(kind), self.objects.get_mut(kind))
        else {
            return;
        };
        match event {
            watcher::Event::Init => {
                watch.synced = false;
                watch.listing = Some(HashSet::new());
            }
            watcher::Event::InitApply((name, version)) => {
                if let Some(listing) = watch.listing.as_mut() {
                    listing.insert(name.clone());
                }
                seen(objects, name, Some(version));
            }
            watcher::Event::InitDone => {
                let listed = watch.listing.take().unwrap_or_default();
                let gone: Vec<Name> = objects
                    .keys()
                    .filter(|name| !listed.contains(*name))
                    .cloned()
                    .collect();
                for name in gone {
                    seen(objects, name, None);
                }
                watch.synced = true;
            }
            watcher::Event::Apply((name, version)) => seen(objects, name, Some(version)),
            watcher::Event::Delete((name, _)) => seen(objects, name, None),
        }
    }

    /// Objects recorded (for the metrics and tests).
    pub fn len(&self) -> usize {
        self.objects.values().map(HashMap::len).sum()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The watch saw `name` at `version` (`None`: deleted — its entry goes, also one whose apply is
/// under way: that apply's answer then records nothing). Objects module-manager never applied
/// are not kept.
fn seen(objects: &mut HashMap<Name, Entry>, name: Name, version: Option<String>) {
    match (objects.get_mut(&name), version) {
        (Some(Entry::Applying(last)), Some(version)) => *last = Some(version),
        (Some(Entry::Applied(recorded, _)), Some(version)) if version == *recorded => {}
        (Some(_), _) => {
            objects.remove(&name);
        }
        (None, _) => {}
    }
}

/// What an apply's answer or a metadata-only listing tells of one object of a remote target:
/// its resourceVersion, UID and `metadata.generation` (`None` when the kind has none), and a
/// digest of the fields module-manager's applies own (its `managedFields` entry's `fieldsV1`;
/// `None` when it has none): another manager taking one of them over changes it, even when
/// the value stays.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    pub version: String,
    pub uid: String,
    pub generation: Option<i64>,
    pub ours: Option<Body>,
}

/// What a metadata-only listing found of one object: its [`Stamp`], whether it is being
/// deleted, and its labels and annotations (kept only for the kinds
/// [`generation_follows_spec`]: nothing else reads them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Found {
    pub stamp: Stamp,
    pub deleting: bool,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The kinds whose API server raises `metadata.generation` on every change of `spec` and of
/// nothing else but (for Deployments) annotations, and which a client cannot set: read in
/// Kubernetes 1.36.3 (`pkg/registry/<group>/<kind>/strategy.go`, `PrepareForUpdate`: "Any
/// changes to the spec increment the generation number"; `apiserver/pkg/registry/rest/update.go`:
/// "Ensure requests cannot update generation"). Not the HorizontalPodAutoscaler (its generation
/// is behind a feature gate), nor custom resources (an aggregated API need not follow the rule).
const GENERATION_FOLLOWS_SPEC: [(&str, &str); 7] = [
    ("apps", "Deployment"),
    ("apps", "StatefulSet"),
    ("apps", "DaemonSet"),
    ("apps", "ReplicaSet"),
    ("batch", "Job"),
    ("batch", "CronJob"),
    ("policy", "PodDisruptionBudget"),
];

/// Whether the API server raises `kind`'s generation on every change of its spec
/// ([`GENERATION_FOLLOWS_SPEC`]).
pub fn generation_follows_spec(kind: &Kind) -> bool {
    GENERATION_FOLLOWS_SPEC.contains(&(kind.group.as_str(), kind.kind.as_str()))
}

/// What happened to an object of a remote target since module-manager's last apply of it, as
/// a LIST made in this pass tells (there is no watch on a target).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Since {
    /// Nothing was written: it is as the apply left it, still ready if it was.
    Untouched,
    /// Only its status, or fields others own, changed ([`only_status_changed`]): an apply would
    /// change nothing, but its readiness may have changed (read it).
    StatusOnly,
    /// Anything else: apply it.
    Changed,
}

/// What happened to an object since its last apply, which sent `body` (`sent` is that body as
/// JSON) and answered with `recorded`, given what the listing `found`:
/// - [`Since::Untouched`]: found at that very resourceVersion;
/// - [`Since::StatusOnly`]: found at another, but [`only_status_changed`];
/// - [`Since::Changed`]: not found (deleted, its label removed, its kind not listed), no
///   record, another body, or any other change.
pub fn listed_since(
    kind: &Kind,
    recorded: Option<(&Stamp, &Body)>,
    found: Option<&Found>,
    body: &Body,
    sent: &Value,
) -> Since {
    let (Some((stamp, digest)), Some(found)) = (recorded, found) else {
        return Since::Changed;
    };
    if stamp.version.is_empty() || digest != body {
        Since::Changed
    } else if found.stamp.version == stamp.version {
        Since::Untouched
    } else if only_status_changed(kind, stamp, found, sent) {
        Since::StatusOnly
    } else {
        Since::Changed
    }
}

/// Whether an object last applied with the body `sent`, whose apply answered with `stamp`, and
/// found now as `found`, changed in its status (or in fields others own) only: its kind's
/// generation follows its spec ([`GENERATION_FOLLOWS_SPEC`]), it is the same object (UID), not
/// being deleted, at the same generation, module-manager still owns exactly the fields it owned
/// (the digest of its `managedFields` entry), every label and annotation the body sets is at
/// the body's value, and the body sets nothing but `spec`, labels and annotations. An apply
/// would then change nothing (a Deployment whose controllers updated its status).
pub fn only_status_changed(kind: &Kind, stamp: &Stamp, found: &Found, sent: &Value) -> bool {
    generation_follows_spec(kind)
        && !found.deleting
        && !stamp.uid.is_empty()
        && found.stamp.uid == stamp.uid
        && stamp.generation.is_some_and(|g| g >= 1)
        && found.stamp.generation == stamp.generation
        && stamp.ours.is_some()
        && found.stamp.ours == stamp.ours
        && sets_only(sent, &["apiVersion", "kind", "metadata", "spec"])
        && sets_only(
            &sent["metadata"],
            &["name", "namespace", "labels", "annotations"],
        )
        && entries_hold(&sent["metadata"]["labels"], &found.labels)
        && entries_hold(&sent["metadata"]["annotations"], &found.annotations)
}

/// Whether `value` is an object whose fields are all among `allowed`.
fn sets_only(value: &Value, allowed: &[&str]) -> bool {
    value
        .as_object()
        .is_some_and(|fields| fields.keys().all(|key| allowed.contains(&key.as_str())))
}

/// Whether every entry of `wanted` (a JSON object of strings, or absent) is in `live` with the
/// same value.
fn entries_hold(wanted: &Value, live: &BTreeMap<String, String>) -> bool {
    match wanted {
        Value::Null => true,
        Value::Object(entries) => entries.iter().all(|(key, value)| {
            value
                .as_str()
                .is_some_and(|v| live.get(key).map(String::as_str) == Some(v))
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> InventoryEntry {
        InventoryEntry {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn at(name: &str, version: &str) -> Seen {
        (("ns".into(), name.into()), version.into())
    }

    const BODY: Body = [1; 32];

    fn kind() -> Kind {
        Kind::of(&id("x"))
    }

    /// A followed kind whose watch has listed (nothing).
    fn synced() -> Unchanged {
        let mut state = Unchanged::default();
        assert!(
            state.begin(&id("seed")),
            "the first apply of a kind starts its watch"
        );
        state.forget(&id("seed"));
        state.on_event(&kind(), watcher::Event::Init);
        state.on_event(&kind(), watcher::Event::InitDone);
        state
    }

    fn applied(state: &mut Unchanged, name: &str, version: &str) {
        assert!(!state.begin(&id(name)), "the kind's watch runs already");
        state.applied(&id(name), version, BODY);
    }

    fn stamp(version: &str) -> Stamp {
        Stamp {
            version: version.into(),
            uid: "u-1".into(),
            generation: Some(1),
            ours: Some([3; 32]),
        }
    }

    fn found(version: &str) -> Found {
        Found {
            stamp: stamp(version),
            ..Found::default()
        }
    }

    fn deployment_body() -> Value {
        serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "x", "namespace": "ns", "labels": {"a": "1"}, "annotations": {"b": "2"}},
            "spec": {"replicas": 1},
        })
    }

    /// A Deployment listed after its controllers wrote its status: the apply's answer and the
    /// listing differ in resourceVersion only.
    fn status_written() -> Found {
        Found {
            stamp: stamp("9"),
            deleting: false,
            labels: BTreeMap::from([("a".into(), "1".into()), ("other".into(), "x".into())]),
            annotations: BTreeMap::from([
                ("b".into(), "2".into()),
                ("deployment.kubernetes.io/revision".into(), "1".into()),
            ]),
        }
    }

    #[test]
    fn a_listed_object_is_unchanged_only_at_the_recorded_version_and_body() {
        let body = [7; 32];
        let (kind, sent) = (Kind::of(&id("x")), deployment_body());
        let unchanged = |recorded: Option<(&Stamp, &Body)>, found: Option<&Found>, body: &Body| {
            listed_since(&kind, recorded, found, body, &sent) == Since::Untouched
        };
        assert!(unchanged(
            Some((&stamp("5"), &body)),
            Some(&found("5")),
            &body
        ));
        let mut elsewhere = found("6");
        elsewhere.stamp.generation = Some(2);
        assert!(
            !unchanged(Some((&stamp("5"), &body)), Some(&elsewhere), &body),
            "written since"
        );
        assert!(
            !unchanged(Some((&stamp("5"), &body)), None, &body),
            "gone, or not listed"
        );
        assert!(
            !unchanged(None, Some(&found("5")), &body),
            "never applied here"
        );
        assert!(
            !unchanged(Some((&stamp("5"), &body)), Some(&found("5")), &[8; 32]),
            "another render"
        );
        assert!(
            !unchanged(Some((&stamp(""), &body)), Some(&found("")), &body),
            "no versions"
        );
    }

    /// What [`listed_since`] says of a Deployment recorded at version 5 and found as `found`
    /// (also checking that it agrees with [`only_status_changed`]).
    fn since(kind: &Kind, found: &Found, sent: &Value) -> Since {
        let recorded = stamp("5");
        let since = listed_since(kind, Some((&recorded, &BODY)), Some(found), &BODY, sent);
        assert_eq!(
            since == Since::StatusOnly,
            only_status_changed(kind, &recorded, found, sent)
        );
        since
    }

    #[test]
    fn a_workload_whose_status_alone_changed_is_read_not_applied() {
        let (sent, kind) = (deployment_body(), Kind::of(&id("x")));
        let status_only = |found: &Found| since(&kind, found, &sent) == Since::StatusOnly;
        assert!(
            status_only(&status_written()),
            "status and others' metadata only"
        );
        assert_eq!(since(&kind, &found("5"), &sent), Since::Untouched);
        let recorded = stamp("5");
        assert_eq!(
            listed_since(
                &kind,
                Some((&recorded, &BODY)),
                Some(&status_written()),
                &[9; 32],
                &sent
            ),
            Since::Changed,
            "another render is applied whatever changed"
        );
        let mut scaled = status_written();
        scaled.stamp.generation = Some(2);
        assert!(
            !status_only(&scaled),
            "its spec changed (kubectl scale, edit)"
        );
        let mut replaced = status_written();
        replaced.stamp.uid = "u-2".into();
        assert!(
            !status_only(&replaced),
            "deleted and created again, generation 1 again"
        );
        let mut deleting = status_written();
        deleting.deleting = true;
        assert!(!status_only(&deleting), "being deleted");
        let mut relabelled = status_written();
        relabelled.labels.insert("a".into(), "edited".into());
        assert!(!status_only(&relabelled), "one of our labels changed");
        let mut unlabelled = status_written();
        unlabelled.labels.remove("a");
        assert!(!status_only(&unlabelled), "one of our labels removed");
        let mut annotated = status_written();
        annotated.annotations.insert("b".into(), "edited".into());
        assert!(!status_only(&annotated), "one of our annotations changed");
        let mut taken = status_written();
        taken.stamp.ours = Some([4; 32]);
        assert!(
            !status_only(&taken),
            "another manager took one of our fields over (the value may be the same)"
        );
        let mut unowned = status_written();
        unowned.stamp.ours = None;
        assert!(!status_only(&unowned), "our managedFields entry is gone");
    }

    #[test]
    fn only_kinds_whose_generation_follows_their_spec_and_plain_bodies_are_read() {
        let (sent, kind) = (deployment_body(), Kind::of(&id("x")));
        let changed =
            |kind: &Kind, sent: &Value| since(kind, &status_written(), sent) == Since::Changed;
        let service = Kind {
            group: String::new(),
            kind: "Service".into(),
        };
        assert!(
            changed(&service, &sent),
            "a kind whose generation says nothing"
        );
        let hpa = Kind {
            group: "autoscaling".into(),
            kind: "HorizontalPodAutoscaler".into(),
        };
        assert!(changed(&hpa, &sent), "generation behind a feature gate");
        let mut owned = sent.clone();
        owned["metadata"]["ownerReferences"] = serde_json::json!([{"name": "x"}]);
        assert!(
            changed(&kind, &owned),
            "metadata beyond labels and annotations"
        );
        let mut with_status = sent.clone();
        with_status["status"] = serde_json::json!({"replicas": 1});
        assert!(changed(&kind, &with_status), "a field beside spec");
        let mut odd = sent.clone();
        odd["metadata"]["labels"]["a"] = serde_json::json!(1);
        assert!(changed(&kind, &odd), "a label that is not a string");
        let unversioned = Stamp {
            generation: None,
            ..stamp("5")
        };
        assert!(
            !only_status_changed(&kind, &unversioned, &status_written(), &sent),
            "no generation recorded"
        );
        let mut no_uid = stamp("5");
        no_uid.uid.clear();
        assert!(
            !only_status_changed(&kind, &no_uid, &status_written(), &sent),
            "no UID recorded"
        );
        let mut no_fields = stamp("5");
        no_fields.ours = None;
        let mut found = status_written();
        found.stamp.ours = None;
        assert!(
            !only_status_changed(&kind, &no_fields, &found, &sent),
            "no managedFields entry of ours recorded"
        );
    }

    #[test]
    fn an_object_applied_and_not_changed_since_is_unchanged() {
        let mut state = synced();
        applied(&mut state, "a", "10");
        assert!(state.unchanged(&id("a"), &BODY));
        // The watch reports the apply itself: the same version.
        state.on_event(&kind(), watcher::Event::Apply(at("a", "10")));
        assert!(state.unchanged(&id("a"), &BODY));
        assert!(!state.unchanged(&id("b"), &BODY), "never applied");
    }

    #[test]
    fn any_other_version_or_a_delete_means_apply_again() {
        let mut state = synced();
        applied(&mut state, "a", "10");
        applied(&mut state, "b", "11");
        state.on_event(&kind(), watcher::Event::Apply(at("a", "12")));
        state.on_event(&kind(), watcher::Event::Delete(at("b", "11")));
        assert!(!state.unchanged(&id("a"), &BODY));
        assert!(!state.unchanged(&id("b"), &BODY));
        assert!(state.is_empty(), "changed objects are not kept");
        // An older version reported late also counts: equality only, never order.
        applied(&mut state, "a", "13");
        state.on_event(&kind(), watcher::Event::Apply(at("a", "12")));
        assert!(!state.unchanged(&id("a"), &BODY));
    }

    #[test]
    fn a_change_seen_while_the_apply_is_under_way_is_not_lost() {
        let mut state = synced();
        // Another writer's version arrives between the apply's start and its answer.
        state.begin(&id("a"));
        state.on_event(&kind(), watcher::Event::Apply(at("a", "20")));
        state.applied(&id("a"), "19", BODY);
        assert!(!state.unchanged(&id("a"), &BODY));
        // Deleted meanwhile.
        state.begin(&id("b"));
        state.on_event(&kind(), watcher::Event::Delete(at("b", "5")));
        state.applied(&id("b"), "6", BODY);
        assert!(!state.unchanged(&id("b"), &BODY));
        // The apply's own version, reported before its answer arrived, is no change.
        state.begin(&id("c"));
        state.on_event(&kind(), watcher::Event::Apply(at("c", "30")));
        state.applied(&id("c"), "30", BODY);
        assert!(state.unchanged(&id("c"), &BODY));
    }

    #[test]
    fn only_the_body_last_applied_is_vouched_for() {
        let mut state = synced();
        applied(&mut state, "a", "10");
        // The render went back to a body another pass (whose status was not written) replaced.
        assert!(!state.unchanged(&id("a"), &[2; 32]));
        assert!(state.unchanged(&id("a"), &BODY));
    }

    #[test]
    fn an_unversioned_answer_or_a_delete_during_the_apply_records_nothing() {
        let mut state = synced();
        state.begin(&id("a"));
        state.applied(&id("a"), "", BODY);
        assert!(
            !state.unchanged(&id("a"), &BODY),
            "no version, nothing to compare"
        );
        // An apply cut off (the pass deadline) and its object deleted: nothing stays behind.
        state.begin(&id("b"));
        state.on_event(&kind(), watcher::Event::Delete(at("b", "3")));
        assert!(state.is_empty());
    }

    #[test]
    fn nothing_is_unchanged_before_the_first_list_or_after_the_watch_failed() {
        let mut state = Unchanged::default();
        assert!(state.begin(&id("a")));
        state.applied(&id("a"), "10", BODY);
        assert!(
            !state.unchanged(&id("a"), &BODY),
            "the watch has not listed yet"
        );
        state.on_event(&kind(), watcher::Event::Init);
        state.on_event(&kind(), watcher::Event::InitApply(at("a", "10")));
        assert!(
            !state.unchanged(&id("a"), &BODY),
            "the list is not complete"
        );
        state.on_event(&kind(), watcher::Event::InitDone);
        assert!(state.unchanged(&id("a"), &BODY));
        state.lost(&kind());
        assert!(
            !state.unchanged(&id("a"), &BODY),
            "events may have been missed"
        );
    }

    #[test]
    fn a_relist_drops_what_changed_or_went_while_the_watch_was_away() {
        let mut state = synced();
        applied(&mut state, "same", "1");
        applied(&mut state, "edited", "2");
        applied(&mut state, "gone", "3");
        state.lost(&kind());
        state.on_event(&kind(), watcher::Event::Init);
        state.on_event(&kind(), watcher::Event::InitApply(at("same", "1")));
        state.on_event(&kind(), watcher::Event::InitApply(at("edited", "7")));
        state.on_event(&kind(), watcher::Event::InitApply(at("other", "8")));
        state.on_event(&kind(), watcher::Event::InitDone);
        assert!(state.unchanged(&id("same"), &BODY));
        assert!(!state.unchanged(&id("edited"), &BODY));
        assert!(!state.unchanged(&id("gone"), &BODY));
        assert!(!state.unchanged(&id("other"), &BODY), "never applied by us");
        assert_eq!(state.len(), 1, "only what module-manager applied is kept");
    }

    #[test]
    fn a_failed_apply_is_applied_next_time_and_other_kinds_are_apart() {
        let mut state = synced();
        state.begin(&id("a"));
        state.forget(&id("a"));
        state.applied(&id("a"), "4", BODY);
        assert!(!state.unchanged(&id("a"), &BODY));
        let mut service = id("a");
        service.group = String::new();
        service.kind = "Service".into();
        assert!(state.begin(&service), "a new kind, a new watch");
        state.applied(&service, "4", BODY);
        assert!(
            !state.unchanged(&service, &BODY),
            "its watch has not listed yet"
        );
        // Events of a kind never followed are ignored.
        let other = Kind {
            group: "x".into(),
            kind: "Y".into(),
        };
        state.on_event(&other, watcher::Event::InitDone);
        assert!(!state.watches.contains_key(&other));
    }
}
