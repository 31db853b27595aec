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

use std::collections::{HashMap, HashSet};

use kube::runtime::watcher;

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

/// Whether an object of a remote target is exactly as module-manager's last apply left it, as a
/// LIST made in this pass tells (there is no watch on a target): the last apply, which sent
/// `body`, answered with `recorded`, and the listing found the object at that very version.
/// An object the listing did not find (deleted, its label removed, its kind not listed), any
/// other version (any write since), or no record means "apply it".
pub fn listed_unchanged(
    recorded: Option<(&str, &Body)>,
    listed: Option<&str>,
    body: &Body,
) -> bool {
    matches!((recorded, listed), (Some((version, sent)), Some(seen))
        if !version.is_empty() && version == seen && sent == body)
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

    #[test]
    fn a_listed_object_is_unchanged_only_at_the_recorded_version_and_body() {
        let body = [7; 32];
        assert!(listed_unchanged(Some(("5", &body)), Some("5"), &body));
        assert!(
            !listed_unchanged(Some(("5", &body)), Some("6"), &body),
            "written since"
        );
        assert!(
            !listed_unchanged(Some(("5", &body)), None, &body),
            "gone, or not listed"
        );
        assert!(
            !listed_unchanged(None, Some("5"), &body),
            "never applied here"
        );
        assert!(
            !listed_unchanged(Some(("5", &body)), Some("5"), &[8; 32]),
            "another render"
        );
        assert!(
            !listed_unchanged(Some(("", &body)), Some(""), &body),
            "no versions"
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
