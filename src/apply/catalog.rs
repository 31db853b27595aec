//! The CRD catalog: the local cluster's Established CustomResourceDefinitions, followed by a
//! watch, so that every replica gives the renderer the same API versions from the moment a CRD
//! is Established or deleted.
//!
//! Discovery alone cannot give that: each replica refreshed its snapshot at its own time, and
//! the API server publishes a new CRD's group in discovery a little *after* the CRD is
//! Established (and drops it a little after the CRD is gone). So the API versions a render gets
//! are composed deterministically ([`compose`]): discovery's entries for every group/version no
//! CRD was ever seen to define (the built-in and aggregated APIs), plus, from the watch, the
//! served versions of every Established CRD that is not being deleted. Any change of that set
//! also bumps a generation that makes every [`super::Cluster`] sharing the catalog re-run its
//! discovery on its next render, so kinds (resources and scopes) follow as well.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

/// The log target of the watch: the process's, not a pass's (`module_manager::apply` lines
/// belong inside a pass, `tests/logs.rs`).
const PROCESS_TARGET: &str = "module_manager::process::crds";

/// What one CRD contributes (pure, from the object).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrdEntry {
    /// Every `group/version` the CRD defines, served or not, Established or not: discovery's
    /// entries for these are never used (the watch is the only source for them).
    pub defines: BTreeSet<String>,
    /// What helm's `--api-versions` gets from it: `group/version` and `group/version/Kind` of
    /// each served version, while the CRD is Established and not being deleted; else nothing.
    pub served: BTreeSet<String>,
}

/// Reads what `crd` contributes.
pub fn entry(crd: &CustomResourceDefinition) -> CrdEntry {
    let spec = &crd.spec;
    let mut entry = CrdEntry::default();
    for version in &spec.versions {
        entry
            .defines
            .insert(format!("{}/{}", spec.group, version.name));
    }
    let established = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
    if !established || crd.metadata.deletion_timestamp.is_some() {
        return entry;
    }
    for version in spec.versions.iter().filter(|v| v.served) {
        let group_version = format!("{}/{}", spec.group, version.name);
        entry
            .served
            .insert(format!("{group_version}/{}", spec.names.kind));
        entry.served.insert(group_version);
    }
    entry
}

/// The `group/version` an `--api-versions` entry belongs to, if it has a group
/// (`apps/v1/Deployment` → `apps/v1`); a core entry (`v1`, `v1/ConfigMap`) is returned whole and
/// never matches a CRD's `group/version` (a CRD's group always contains a dot).
fn group_version_of(entry: &str) -> &str {
    match entry.match_indices('/').nth(1) {
        Some((at, _)) => &entry[..at],
        None => entry,
    }
}

/// The API versions a render gets: `discovered` without the entries of any group/version in
/// `crd_defined`, plus `served` (the Established CRDs'), sorted and without duplicates.
pub fn compose<'a>(
    discovered: &[String],
    crd_defined: &BTreeSet<String>,
    served: impl IntoIterator<Item = &'a String>,
) -> Vec<String> {
    let mut versions: Vec<String> = discovered
        .iter()
        .filter(|e| !crd_defined.contains(group_version_of(e)))
        .cloned()
        .collect();
    versions.extend(served.into_iter().cloned());
    versions.sort();
    versions.dedup();
    versions
}

#[derive(Debug, Default)]
struct State {
    /// By CRD name.
    crds: BTreeMap<String, CrdEntry>,
    /// Every group/version a CRD was seen to define since start (also after it was deleted:
    /// discovery may still list it for a moment).
    defined: BTreeSet<String>,
    /// Bumped whenever what the catalog answers changes.
    generation: u64,
    /// A re-list in progress (the watcher restarted): the entries seen so far.
    relist: Option<BTreeMap<String, CrdEntry>>,
}

impl State {
    /// Replaces the CRDs (`None` removes `name`); bumps the generation if anything changed.
    fn set(&mut self, name: &str, entry: Option<CrdEntry>) {
        let changed = match entry {
            Some(entry) => {
                self.defined.extend(entry.defines.iter().cloned());
                self.crds.insert(name.to_owned(), entry.clone()) != Some(entry)
            }
            None => self.crds.remove(name).is_some(),
        };
        if changed {
            self.generation += 1;
        }
    }

    /// Applies one watcher event.
    fn apply(&mut self, event: watcher::Event<CustomResourceDefinition>) {
        match event {
            watcher::Event::Apply(crd) => self.set(&crd.name_any(), Some(entry(&crd))),
            watcher::Event::Delete(crd) => self.set(&crd.name_any(), None),
            watcher::Event::Init => self.relist = Some(BTreeMap::new()),
            watcher::Event::InitApply(crd) => {
                let entry = entry(&crd);
                self.defined.extend(entry.defines.iter().cloned());
                self.relist
                    .get_or_insert_default()
                    .insert(crd.name_any(), entry);
            }
            watcher::Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                if listed != self.crds {
                    self.crds = listed;
                    self.generation += 1;
                }
            }
        }
    }
}

/// The CRDs of the local cluster, as the watch last saw them, shared by every [`super::Cluster`]
/// of the local cluster (the operator's own and each impersonated account's).
#[derive(Debug)]
pub struct CrdCatalog {
    state: RwLock<State>,
    synced: watch::Sender<bool>,
}

impl Default for CrdCatalog {
    fn default() -> Self {
        Self {
            state: RwLock::default(),
            synced: watch::Sender::new(false),
        }
    }
}

impl CrdCatalog {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Bumped whenever what [`CrdCatalog::api_versions`] answers changes (0 before the first
    /// list completed).
    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    /// Whether the first list has completed (before it, renders use discovery alone).
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until the first list has completed.
    pub async fn synced(&self) {
        let mut synced = self.synced.subscribe();
        let _ = synced.wait_for(|done| *done).await;
    }

    /// The API versions a render gets (see [`compose`]) from discovery's `discovered`.
    pub fn api_versions(&self, discovered: &[String]) -> Vec<String> {
        let state = self.read();
        compose(
            discovered,
            &state.defined,
            state.crds.values().flat_map(|e| &e.served),
        )
    }

    /// Applies one watcher event (the watch task's step; also for tests).
    pub fn apply(&self, event: watcher::Event<CustomResourceDefinition>) {
        let done = matches!(event, watcher::Event::InitDone);
        self.state
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .apply(event);
        if done {
            self.synced.send_replace(true);
        }
    }

    /// A catalog followed by a watch of every CRD through `client`, in a task that runs as long
    /// as the process (failures are logged and retried with backoff).
    pub fn watch(client: Client) -> Arc<Self> {
        let catalog = Arc::new(Self::default());
        let follower = catalog.clone();
        tokio::spawn(async move {
            let api = Api::<CustomResourceDefinition>::all(client);
            // Pages of 50: the first list of a cluster with many large CRDs stays small in memory
            // (only what renders need is kept of each).
            let mut events = watcher(api, watcher::Config::default().page_size(50))
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => follower.apply(event),
                    Err(e) => {
                        tracing::warn!(target: PROCESS_TARGET, "watch CustomResourceDefinitions: {e}");
                    }
                }
            }
        });
        catalog
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(name: &str, established: bool, served: &[(&str, bool)]) -> CustomResourceDefinition {
        let (plural, group) = name.split_once('.').unwrap();
        let versions: Vec<_> = served
            .iter()
            .map(|(v, s)| json!({"name": v, "served": s, "storage": *v == served[0].0}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "group": group,
                "names": {"plural": plural, "kind": "Widget"},
                "scope": "Namespaced",
                "versions": versions,
            },
            "status": {"conditions": [
                {"type": "Established", "status": if established {"True"} else {"False"}}
            ]},
        }))
        .unwrap()
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_served_versions_of_an_established_crd_count() {
        let entry = entry(&crd(
            "widgets.x.example.com",
            true,
            &[("v1", true), ("v2", false)],
        ));
        assert_eq!(
            entry.served.into_iter().collect::<Vec<_>>(),
            strings(&["x.example.com/v1", "x.example.com/v1/Widget"])
        );
        assert_eq!(entry.defines.len(), 2);
        let pending = super::entry(&crd("widgets.x.example.com", false, &[("v1", true)]));
        assert!(pending.served.is_empty());
        assert_eq!(pending.defines.len(), 1);
        let mut deleting = crd("widgets.x.example.com", true, &[("v1", true)]);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert!(super::entry(&deleting).served.is_empty());
    }

    #[test]
    fn crd_groups_come_from_the_watch_whatever_discovery_says() {
        let defined: BTreeSet<String> = strings(&["x.example.com/v1", "y.example.com/v1"])
            .into_iter()
            .collect();
        // Discovery is stale: it still lists y (deleted) and not yet x (just Established).
        let discovered = strings(&[
            "apps/v1",
            "apps/v1/Deployment",
            "v1",
            "v1/ConfigMap",
            "y.example.com/v1",
            "y.example.com/v1/Widget",
        ]);
        let served = strings(&["x.example.com/v1", "x.example.com/v1/Widget"]);
        // What the cluster serves now: also what a fresher discovery snapshot lists.
        let fresher = strings(&[
            "apps/v1",
            "apps/v1/Deployment",
            "v1",
            "v1/ConfigMap",
            "x.example.com/v1",
            "x.example.com/v1/Widget",
        ]);
        assert_eq!(compose(&discovered, &defined, &served), fresher);
        // Two replicas with different discovery snapshots answer the same.
        assert_eq!(
            compose(&fresher, &defined, &served),
            compose(&discovered, &defined, &served)
        );
    }

    #[test]
    fn the_generation_moves_only_when_the_answer_can_change() {
        let catalog = CrdCatalog::default();
        catalog.apply(watcher::Event::Init);
        catalog.apply(watcher::Event::InitDone);
        assert!(catalog.is_synced());
        let base = catalog.generation();
        let pending = crd("widgets.x.example.com", false, &[("v1", true)]);
        catalog.apply(watcher::Event::Apply(pending.clone()));
        let defined = catalog.generation();
        assert!(
            defined > base,
            "a new CRD changes what discovery is trusted for"
        );
        catalog.apply(watcher::Event::Apply(pending));
        assert_eq!(catalog.generation(), defined, "the same CRD again");
        let established = crd("widgets.x.example.com", true, &[("v1", true)]);
        catalog.apply(watcher::Event::Apply(established.clone()));
        assert!(catalog.generation() > defined);
        assert!(
            catalog
                .api_versions(&strings(&["v1"]))
                .contains(&"x.example.com/v1".to_owned())
        );
        // A re-list without it (deleted while the watch was down) removes it.
        let before = catalog.generation();
        catalog.apply(watcher::Event::Init);
        catalog.apply(watcher::Event::InitDone);
        assert!(catalog.generation() > before);
        assert_eq!(
            catalog.api_versions(&strings(&["v1", "x.example.com/v1"])),
            strings(&["v1"]),
            "discovery still listing a deleted CRD's group is not believed"
        );
        catalog.apply(watcher::Event::Apply(established.clone()));
        catalog.apply(watcher::Event::Delete(established));
        assert_eq!(catalog.api_versions(&strings(&["v1"])), strings(&["v1"]));
    }
}
