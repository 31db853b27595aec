//! The watches behind cheap drift passes: for every kind module-manager has applied on the
//! local cluster, one metadata-only watch of the objects labelled with a Manifest's UID — in a
//! fleet, only those of this replica's shards ([`Selection`]) — feeding
//! [`plan::unchanged`](crate::plan::unchanged) (which decides). Started on the first apply of
//! the kind; a watch that fails is started again from a fresh list, with backoff (its kind's
//! objects are applied meanwhile). docs/reconcile.md, "Cheap drift passes".

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::discovery::ApiResource;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use tokio::sync::watch;

use super::labels::{MANIFEST_SHARD_LABEL, MANIFEST_UID_LABEL};
use crate::api::InventoryEntry;
use crate::plan::unchanged::{Body, Kind, Seen, Unchanged};

const PROCESS_TARGET: &str = "module_manager::process::object_watch";

/// The first wait before a failed watch is started again; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Which objects a replica's watches select: those of the shards it owns. Each applied object is
/// stamped with its Manifest's shard ([`MANIFEST_SHARD_LABEL`]), and every kind's watch selects
/// the owned shards, started again (from a fresh list) when they change: a replica receives
/// the events of its own share of the module objects. (A process that owns every shard, or
/// `--fault-ignore-ownership`, selects `modulemanager.io/manifest-shard` as a whole.)
pub struct Selection {
    /// The shard of the Manifest with this UID (the label its objects carry).
    pub shard_of: Box<dyn Fn(&str) -> u32 + Send + Sync>,
    /// The owned shards, as they change.
    pub selected: watch::Receiver<Selected>,
}

/// The shards the watches select now.
#[derive(Clone, Debug, PartialEq)]
pub struct Selected {
    /// The owned shards (`None`: every shard).
    pub shards: Option<BTreeSet<u32>>,
    /// The label selector of their objects, [`MANIFEST_SHARD_LABEL`] `in (…)` or any other
    /// that selects at least those (`None`: none owned, nothing to watch).
    pub selector: Option<String>,
}

impl Selected {
    /// Whether the objects of `shard` are selected.
    fn holds(&self, shard: u32) -> bool {
        self.selector.is_some() && self.shards.as_ref().is_none_or(|set| set.contains(&shard))
    }

    /// Whether a watch started with this selection can go on under `next` without listing
    /// again: the same label selector (above the selector's limit of shards it does not change
    /// as the set does). Any other change starts the watch again, also one that only gives
    /// shards up: a watch kept with the wider selector would go on receiving the events of the
    /// shards given up — after a scale-out, every shard's.
    fn covers(&self, next: &Selected) -> bool {
        self.selector.is_some() && self.selector == next.selector
    }
}

/// The applied objects of the local cluster and the watches of their kinds (one per process,
/// shared by the operator's client and every impersonating one: the watches run as the operator).
pub struct Followed {
    client: Client,
    selection: Selection,
    state: Mutex<Unchanged>,
    /// The API of each kind as last applied: a watch that starts again watches it there (a kind
    /// whose first version stopped being served moves with the charts).
    resources: Mutex<HashMap<Kind, ApiResource>>,
    /// The shards each kind's current watch selects: only an object of
    /// one of them is vouched for — an apply a pass made while its shard was not (yet) selected
    /// is recorded, but no watch would see a change to it.
    watching: Mutex<HashMap<Kind, Selected>>,
    /// Object events the watches received (not their lists): what the selection saves.
    events: AtomicU64,
}

impl std::fmt::Debug for Followed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Followed")
            .field("objects", &self.len())
            .finish()
    }
}

impl Followed {
    /// Follows, through `client`, the kinds applied from now on: their objects of the shards
    /// `selection` selects.
    pub fn new(client: Client, selection: Selection) -> Arc<Self> {
        Arc::new(Self {
            client,
            selection,
            state: Mutex::default(),
            resources: Mutex::default(),
            watching: Mutex::default(),
            events: AtomicU64::new(0),
        })
    }

    /// The shard label an object applied for the Manifest `owner_uid` carries.
    pub fn stamp(&self, owner_uid: &str) -> (&'static str, String) {
        let shard = (self.selection.shard_of)(owner_uid);
        (MANIFEST_SHARD_LABEL, shard.to_string())
    }

    /// What the watches select now, the label selector of a kind's watch (`None`: nothing to
    /// watch), and the changes to come.
    fn selected(&self) -> (Selected, Option<String>, watch::Receiver<Selected>) {
        let mut changes = self.selection.selected.clone();
        let now = changes.borrow_and_update().clone();
        let selector = now
            .selector
            .as_ref()
            .map(|shards| format!("{MANIFEST_UID_LABEL},{shards}"));
        (now, selector, changes)
    }

    /// Whether `object`, as an apply for the Manifest `owner_uid` answered, carries the labels
    /// the watches select it by (a mutating webhook may have dropped or changed them): if not,
    /// no watch would report a change to it, and its apply is not recorded.
    pub(super) fn would_see(&self, object: &DynamicObject, owner_uid: &str) -> bool {
        let labels = object.labels();
        let has = |key: &str, value: &str| labels.get(key).is_some_and(|v| v == value);
        let (key, shard) = self.stamp(owner_uid);
        has(MANIFEST_UID_LABEL, owner_uid) && has(key, &shard)
    }

    /// Object events the watches have received.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// Whether the watch of `id`'s kind selects the objects of the Manifest `owner_uid`.
    fn watched(&self, id: &InventoryEntry, owner_uid: &str) -> bool {
        let watching = self.watching.lock().unwrap_or_else(|e| e.into_inner());
        let shard = (self.selection.shard_of)(owner_uid);
        watching
            .get(&Kind::of(id))
            .is_some_and(|selected| selected.holds(shard))
    }

    fn lock(&self) -> MutexGuard<'_, Unchanged> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `id`, an object of the Manifest `owner_uid`, is exactly as module-manager's last
    /// apply, which sent `body`, left it: its kind's watch selects it and has seen no change.
    pub fn unchanged(&self, id: &InventoryEntry, owner_uid: &str, body: &Body) -> bool {
        self.watched(id, owner_uid) && self.lock().unchanged(id, body)
    }

    fn resource(&self, kind: &Kind) -> Option<ApiResource> {
        let resources = self.resources.lock().unwrap_or_else(|e| e.into_inner());
        resources.get(kind).cloned()
    }

    /// Objects recorded now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An apply of `id` (of `resource`) begins; starts its kind's watch on the kind's first.
    pub(super) fn begin(self: &Arc<Self>, id: &InventoryEntry, resource: &ApiResource) {
        let kind = Kind::of(id);
        let mut resources = self.resources.lock().unwrap_or_else(|e| e.into_inner());
        if resources.get(&kind) != Some(resource) {
            resources.insert(kind.clone(), resource.clone());
        }
        drop(resources);
        if self.lock().begin(id) {
            tokio::spawn(self.clone().follow(kind));
        }
    }

    /// The apply of `id`, which sent `body`, answered with `version` (`None`: it failed or
    /// said nothing).
    pub(super) fn applied(&self, id: &InventoryEntry, version: Option<&str>, body: Body) {
        match version {
            Some(version) => self.lock().applied(id, version, body),
            None => self.lock().forget(id),
        }
    }

    /// Watches `kind` as long as the process runs, from a fresh list after each failure (at
    /// the kind's API as last applied) and whenever the owned shards change. Should the task
    /// ever end, the kind is lost for good.
    async fn follow(self: Arc<Self>, kind: Kind) {
        let _lost_when_ended = LostWhenEnded(self.clone(), kind.clone());
        let mut retry = Retry::default();
        loop {
            let Some(resource) = self.resource(&kind) else {
                return;
            };
            let (selected, selector, changes) = self.selected();
            // `None` once the owner of the selection is gone (the process stops).
            let mut changes = Some(changes);
            self.select(&kind, selected.clone());
            let ended = match selector {
                Some(selector) => {
                    let (changes, started) = (&mut changes, (&selected, selector.as_str()));
                    self.watch(&kind, &resource, started, changes, &mut retry)
                        .await
                }
                None => Ended::NothingOwned,
            };
            self.lock().lost(&kind);
            match ended {
                Ended::Reselect => {}
                Ended::NothingOwned => {
                    // Nothing to watch until a shard is owned.
                    if let Some(changes) = changes.as_mut()
                        && changes.changed().await.is_err()
                    {
                        return;
                    }
                }
                Ended::Failed(e) => {
                    let (kind, group) = (&kind.kind, &kind.group);
                    let what = "watch of applied objects failed: drift passes apply them until it has listed again";
                    let backoff = retry.backoff;
                    if retry.warned {
                        tracing::debug!(target: PROCESS_TARGET, %kind, %group, "{what} (next try in {backoff:?}): {e}");
                    } else {
                        tracing::warn!(target: PROCESS_TARGET, %kind, %group, "{what} (next try in {backoff:?}): {e}");
                    }
                    retry.failed();
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    /// Records what `kind`'s watch selects from now on: before a watch lists (the kind was lost
    /// before, so what it vouches for is of the new list), or a new set of shards under the same
    /// selector.
    fn select(&self, kind: &Kind, selected: Selected) {
        let mut watching = self.watching.lock().unwrap_or_else(|e| e.into_inner());
        watching.insert(kind.clone(), selected);
    }

    /// One watch of `kind`'s objects that `started` selects (by `selector`), until it fails or
    /// the selector changes (then the caller starts another at once: the kind is lost until it
    /// has listed).
    async fn watch(
        &self,
        kind: &Kind,
        resource: &ApiResource,
        (started, selector): (&Selected, &str),
        changes: &mut Option<watch::Receiver<Selected>>,
        retry: &mut Retry,
    ) -> Ended {
        // Pages of 100: a list decodes each object's whole metadata (managedFields too) before
        // it is dropped; a page of the default 500 Deployments costs several MiB at once.
        let config = watcher::Config::default().labels(selector).page_size(100);
        let api = Api::<PartialObjectMeta<DynamicObject>>::all_with(self.client.clone(), resource);
        let mut events = watcher(api, config).boxed();
        loop {
            let changed = async {
                match changes.as_mut() {
                    Some(changes) => changes.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let event = tokio::select! {
                still = changed => {
                    let Some(next) = changes.as_mut().filter(|_| still) else {
                        // The owner of the selection is gone (the process stops): watch on.
                        *changes = None;
                        continue;
                    };
                    let next = next.borrow_and_update().clone();
                    if !started.covers(&next) {
                        return Ended::Reselect;
                    }
                    // The same selector: this watch sees what it saw, vouched for the new set.
                    self.select(kind, next);
                    continue;
                }
                event = events.next() => event,
            };
            match event {
                Some(Ok(event)) => {
                    match event {
                        watcher::Event::InitDone => *retry = Retry::default(),
                        watcher::Event::Apply(_) | watcher::Event::Delete(_) => {
                            self.events.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {}
                    }
                    self.lock().on_event(kind, map_event(event, seen));
                }
                Some(Err(e)) => return Ended::Failed(e.to_string()),
                None => return Ended::Failed("the watch ended".into()),
            }
        }
    }
}

/// When a failed watch starts again, and whether it warned since it last listed: a kind the
/// operator may not watch (RBAC) warns once, not every few minutes.
struct Retry {
    backoff: Duration,
    warned: bool,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            backoff: FIRST_BACKOFF,
            warned: false,
        }
    }
}

impl Retry {
    /// After a failure (warned): the next wait is twice as long, up to [`MAX_BACKOFF`].
    fn failed(&mut self) {
        self.warned = true;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }
}

/// Why a watch of a kind ended.
enum Ended {
    /// The owned shards changed: watch with the new selector at once.
    Reselect,
    /// No shard is owned: no watch until one is.
    NothingOwned,
    /// It failed: start again after the backoff.
    Failed(String),
}

/// Marks its kind lost when dropped: a watch task that ends (or panics) leaves nothing of its
/// kind taken as unchanged.
struct LostWhenEnded(Arc<Followed>, Kind);

impl Drop for LostWhenEnded {
    fn drop(&mut self) {
        self.0.lock().lost(&self.1);
    }
}

/// What the state keeps of an object the watch reports.
fn seen(object: PartialObjectMeta<DynamicObject>) -> Seen {
    let name = (object.namespace().unwrap_or_default(), object.name_any());
    (name, object.resource_version().unwrap_or_default())
}

/// A watch event with its object turned into what its follower keeps of it.
pub fn map_event<K, T>(event: watcher::Event<K>, f: impl Fn(K) -> T) -> watcher::Event<T> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owning(shards: Option<&[u32]>) -> Selected {
        let shards: Option<BTreeSet<u32>> = shards.map(|s| s.iter().copied().collect());
        let selector = match &shards {
            Some(set) if set.is_empty() => None,
            Some(set) => Some(format!("{MANIFEST_SHARD_LABEL} in {set:?}")),
            None => Some(MANIFEST_SHARD_LABEL.to_owned()),
        };
        Selected { shards, selector }
    }

    #[test]
    fn a_selection_holds_its_shards_and_nothing_when_none_is_owned() {
        assert!(owning(Some(&[1, 3])).holds(3));
        assert!(!owning(Some(&[1, 3])).holds(2));
        assert!(owning(None).holds(2), "every shard");
        assert!(
            !owning(Some(&[])).holds(2),
            "none owned: nothing is watched"
        );
    }

    #[test]
    fn a_watch_goes_on_only_under_the_same_selector() {
        let (all, some, fewer, none) = (
            owning(None),
            owning(Some(&[1, 3])),
            owning(Some(&[3])),
            owning(Some(&[])),
        );
        assert!(some.covers(&some.clone()));
        assert!(!some.covers(&fewer), "shards given up: list without them");
        assert!(!fewer.covers(&some), "a shard taken: list it");
        assert!(
            !all.covers(&some),
            "every shard before: list only the owned"
        );
        assert!(!none.covers(&none), "nothing was watched");
        // Above the selector's limit the selector is the same however the set changes.
        let big = |n: u32| Selected {
            shards: Some((0..n).collect()),
            selector: Some(MANIFEST_SHARD_LABEL.to_owned()),
        };
        assert!(big(1100).covers(&big(1200)), "the same selector");
    }
}
