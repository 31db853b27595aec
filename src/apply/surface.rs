//! What discovery says about a cluster ([`ApiSurface`]), held once for all the clusters that
//! say the same ([`share`]).
//!
//! A cached remote target client kept its own discovery snapshot: ~44 KiB of the ~112 KiB a
//! cached target held on the heap (`tests/target_memory.rs`), ~190 MiB per replica at Kyma's
//! 5,000 clusters. Clusters of one Kubernetes version with the same CRDs serve the same
//! discovery, so the snapshots that are equal are one `Arc`: a table of weak references by a
//! digest of the content, checked for equality (a digest collision shares nothing).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use kube::discovery::{ApiResource, Discovery, Scope as DiscoveryScope};

use crate::api::InventoryEntry;
use crate::plan::Scope;

/// A served kind: (group, version, kind).
type KindKey = (String, String, String);

/// What discovery says about a cluster: its version, the `--api-versions` helm gets, and the
/// resource of every served kind.
#[derive(Debug, PartialEq, Eq)]
pub struct ApiSurface {
    /// `gitVersion`, e.g. `v1.36.3`.
    pub kube_version: String,
    /// Every `group/version` and `group/version/Kind` served, sorted (the core group without
    /// its empty prefix: `v1`, `v1/ConfigMap`).
    pub api_versions: Arc<[String]>,
    kinds: HashMap<KindKey, (ApiResource, Scope)>,
}

impl ApiSurface {
    /// The resource and scope of a kind, if served.
    pub fn resolve(&self, id: &InventoryEntry) -> Option<&(ApiResource, Scope)> {
        self.kinds
            .get(&(id.group.clone(), id.version.clone(), id.kind.clone()))
    }

    /// The surface of a discovery run against a server of `kube_version`.
    pub fn from_discovery(kube_version: String, discovery: &Discovery) -> Self {
        let mut api_versions = Vec::new();
        let mut kinds = HashMap::new();
        for group in discovery.groups() {
            for version in group.versions() {
                let group_version = if group.name().is_empty() {
                    version.to_owned()
                } else {
                    format!("{}/{version}", group.name())
                };
                api_versions.push(group_version.clone());
                for (resource, capabilities) in group.versioned_resources(version) {
                    api_versions.push(format!("{group_version}/{}", resource.kind));
                    let scope = match capabilities.scope {
                        DiscoveryScope::Namespaced => Scope::Namespaced,
                        DiscoveryScope::Cluster => Scope::Cluster,
                    };
                    let key = (
                        resource.group.clone(),
                        resource.version.clone(),
                        resource.kind.clone(),
                    );
                    kinds.insert(key, (resource, scope));
                }
            }
        }
        api_versions.sort();
        api_versions.dedup();
        Self {
            kube_version,
            api_versions: api_versions.into(),
            kinds,
        }
    }

    /// A digest of the content (equal surfaces, equal digests; the kinds in a fixed order).
    fn digest(&self) -> u64 {
        let mut hasher = BuildHasherDefault::<DefaultHasher>::default().build_hasher();
        self.kube_version.hash(&mut hasher);
        self.api_versions.hash(&mut hasher);
        let mut kinds: Vec<_> = self.kinds.iter().collect();
        kinds.sort_by(|a, b| a.0.cmp(b.0));
        for (key, (resource, scope)) in kinds {
            (key, resource, *scope == Scope::Namespaced).hash(&mut hasher);
        }
        hasher.finish()
    }
}

/// The surfaces in use, by digest.
type Table = HashMap<u64, Vec<Weak<ApiSurface>>>;

/// Every surface held by some cluster handle of this process.
static SHARED: LazyLock<Mutex<Table>> = LazyLock::new(Mutex::default);

/// `surface`, or the equal one some cluster handle already holds.
pub fn share(surface: ApiSurface) -> Arc<ApiSurface> {
    let mut table = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    share_in(&mut table, surface)
}

/// [`share`] in `table`. A surface not held yet is added, and the entries nobody holds any more
/// go then (so the table holds no more than the surfaces in use, plus those of the digests not
/// seen since the last addition).
fn share_in(table: &mut Table, surface: ApiSurface) -> Arc<ApiSurface> {
    let digest = surface.digest();
    let held = table.get(&digest).into_iter().flatten();
    if let Some(same) = held.filter_map(Weak::upgrade).find(|s| **s == surface) {
        return same;
    }
    table.retain(|_, surfaces| {
        surfaces.retain(|s| s.strong_count() > 0);
        !surfaces.is_empty()
    });
    let surface = Arc::new(surface);
    table
        .entry(digest)
        .or_default()
        .push(Arc::downgrade(&surface));
    surface
}

#[cfg(test)]
mod tests {
    use super::*;

    fn surface(version: &str, names: &[&str]) -> ApiSurface {
        let kinds = names
            .iter()
            .map(|kind| {
                let resource = ApiResource {
                    group: String::new(),
                    version: "v1".into(),
                    api_version: "v1".into(),
                    kind: (*kind).into(),
                    plural: kind.to_lowercase() + "s",
                };
                let key = (String::new(), "v1".into(), (*kind).into());
                (key, (resource, Scope::Namespaced))
            })
            .collect();
        let mut api_versions: Vec<String> = names.iter().map(|n| format!("v1/{n}")).collect();
        api_versions.sort();
        ApiSurface {
            kube_version: version.into(),
            api_versions: api_versions.into(),
            kinds,
        }
    }

    #[test]
    fn equal_surfaces_are_held_once_and_dropped_with_their_last_holder() {
        let mut table = Table::default();
        let a = share_in(&mut table, surface("v1.36.3", &["ConfigMap", "Secret"]));
        let b = share_in(&mut table, surface("v1.36.3", &["Secret", "ConfigMap"]));
        assert!(Arc::ptr_eq(&a, &b), "the same content, in another order");
        let other = share_in(&mut table, surface("v1.35.0", &["ConfigMap", "Secret"]));
        assert!(!Arc::ptr_eq(&a, &other), "another version");
        let fewer = share_in(&mut table, surface("v1.36.3", &["ConfigMap"]));
        assert!(!Arc::ptr_eq(&a, &fewer), "another set of kinds");
        drop((a, b, other));
        let _again = share_in(&mut table, surface("v1.34.0", &[]));
        assert_eq!(
            table.values().map(Vec::len).sum::<usize>(),
            2,
            "only the surfaces still held, and the new one"
        );
    }

    #[test]
    fn a_digest_collision_shares_nothing() {
        let mut table = Table::default();
        let a = share_in(&mut table, surface("v1.36.3", &["ConfigMap"]));
        // Filed under the digest of another surface: found there, but not equal.
        let b = surface("v1.36.3", &["Secret"]);
        table.insert(b.digest(), vec![Arc::downgrade(&a)]);
        let b = share_in(&mut table, b);
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(b.resolve_kind("Secret"), Some("secrets"));
    }

    impl ApiSurface {
        fn resolve_kind(&self, kind: &str) -> Option<&str> {
            let key = (String::new(), "v1".to_owned(), kind.to_owned());
            Some(self.kinds.get(&key)?.0.plural.as_str())
        }
    }
}
