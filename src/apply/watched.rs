//! The watches behind cheap drift passes: for every kind module-manager has applied on the
//! local cluster, one metadata-only watch of the objects labelled with a Manifest's UID, feeding
//! [`plan::unchanged`](crate::plan::unchanged) (which decides). Started on the first apply of
//! the kind; a watch that fails is started again from a fresh list, with backoff (its kind's
//! objects are applied meanwhile). docs/reconcile.md, "Cheap drift passes".

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::discovery::ApiResource;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::MANIFEST_UID_LABEL;
use crate::api::InventoryEntry;
use crate::plan::unchanged::{Body, Kind, Seen, Unchanged};

const PROCESS_TARGET: &str = "module_manager::process::object_watch";

/// The first wait before a failed watch is started again; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// The applied objects of the local cluster and the watches of their kinds (one per process,
/// shared by the operator's client and every impersonating one: the watches run as the operator).
pub struct Followed {
    client: Client,
    state: Mutex<Unchanged>,
    /// The API of each kind as last applied: a watch that starts again watches it there (a kind
    /// whose first version stopped being served moves with the charts).
    resources: Mutex<HashMap<Kind, ApiResource>>,
}

impl std::fmt::Debug for Followed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Followed")
            .field("objects", &self.len())
            .finish()
    }
}

impl Followed {
    /// Follows, through `client`, the kinds applied from now on.
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            state: Mutex::default(),
            resources: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Unchanged> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `id` is exactly as module-manager's last apply, which sent `body`, left it.
    pub fn unchanged(&self, id: &InventoryEntry, body: &Body) -> bool {
        self.lock().unchanged(id, body)
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
    /// the kind's API as last applied). Should the task ever end, the kind is lost for good.
    async fn follow(self: Arc<Self>, kind: Kind) {
        let _lost_when_ended = LostWhenEnded(self.clone(), kind.clone());
        // Pages of 100: a list decodes each object's whole metadata (managedFields too) before
        // it is dropped; a page of the default 500 Deployments costs several MiB at once.
        let config = watcher::Config::default()
            .labels(MANIFEST_UID_LABEL)
            .page_size(100);
        let mut backoff = FIRST_BACKOFF;
        // Warned since the watch last listed: a kind the operator may not watch (RBAC) warns
        // once, not every few minutes.
        let mut warned = false;
        loop {
            let Some(resource) = self.resource(&kind) else {
                return;
            };
            let api =
                Api::<PartialObjectMeta<DynamicObject>>::all_with(self.client.clone(), &resource);
            let mut events = watcher(api, config.clone()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        if matches!(event, watcher::Event::InitDone) {
                            (backoff, warned) = (FIRST_BACKOFF, false);
                        }
                        self.lock().on_event(&kind, map_event(event, seen));
                    }
                    Err(e) => {
                        self.lock().lost(&kind);
                        let (kind, group) = (&kind.kind, &kind.group);
                        let what = "watch of applied objects failed: drift passes apply them until it has listed again";
                        if warned {
                            tracing::debug!(target: PROCESS_TARGET, %kind, %group, "{what} (next try in {backoff:?}): {e}");
                        } else {
                            tracing::warn!(target: PROCESS_TARGET, %kind, %group, "{what} (next try in {backoff:?}): {e}");
                        }
                        warned = true;
                        break;
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
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
