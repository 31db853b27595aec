//! Written: what this replica last wrote of each Manifest (its resourceVersion and a digest of
//! its status, at the shard's epoch), so that a pass can start from the watch cache instead of
//! reading the Manifest again when the cache already holds that write.
//!
//! A pass decides from the status (`hookRun`, `hookObjects`, the inventory): a cache that lags
//! behind the last pass's status write would start a hook again or drop a recorded object. The
//! cache is current for the pass when its copy is the one this replica wrote last (same
//! resourceVersion), or carries the same status (someone changed only metadata or spec since,
//! which is what queued the pass: the cache holds that event). Only the shard's owner writes the
//! status, so an equal status is that write; a write at another epoch of the shard (the shard
//! was lost and taken back meanwhile: another replica may have written since) is not trusted.
//!
//! A cache, not state a pass depends on: a Manifest not remembered (a new process, a shard taken
//! over) costs one GET, never a wrong decision.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Mutex;

use kube::ResourceExt;

use crate::api::Manifest;

/// This replica's last write to one Manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Write {
    resource_version: String,
    status: u64,
    epoch: i32,
}

/// The last write of each Manifest this replica wrote, by UID.
#[derive(Debug, Default)]
pub struct LastWrites {
    writes: Mutex<HashMap<String, Write>>,
}

/// A digest of a Manifest's status as stored (the same for equal statuses).
fn status_digest(manifest: &Manifest) -> u64 {
    let text = serde_json::to_vec(&manifest.status).unwrap_or_default();
    BuildHasherDefault::<DefaultHasher>::default().hash_one(text)
}

impl LastWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Write>> {
        self.writes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `answer`, the Manifest as the API server returned it after a write of this
    /// replica at `epoch`.
    pub fn wrote(&self, answer: &Manifest, epoch: i32) {
        let (Some(uid), Some(resource_version)) = (answer.uid(), answer.resource_version()) else {
            return;
        };
        let write = Write {
            resource_version,
            status: status_digest(answer),
            epoch,
        };
        self.lock().insert(uid, write);
    }

    /// Forgets a Manifest (deleted, released).
    pub fn forget(&self, manifest: &Manifest) {
        if let Some(uid) = manifest.uid() {
            self.lock().remove(&uid);
        }
    }

    /// Whether `cached` (the watch cache's copy) holds this replica's last write of it, made
    /// at `epoch` ([`current`]).
    pub fn holds_last_write(&self, cached: &Manifest, epoch: i32) -> bool {
        let Some(uid) = cached.uid() else {
            return false;
        };
        let last = self.lock().get(&uid).cloned();
        last.is_some_and(|last| current(&last, cached, epoch))
    }

    /// Manifests remembered now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether `cached` holds `last` (pure): the same epoch of the shard, and the same
/// resourceVersion or the same status.
fn current(last: &Write, cached: &Manifest, epoch: i32) -> bool {
    last.epoch == epoch
        && (cached.resource_version().as_deref() == Some(last.resource_version.as_str())
            || status_digest(cached) == last.status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ManifestStatus, State};

    fn manifest(resource_version: &str, state: Option<State>) -> Manifest {
        let mut m = Manifest::new(
            "m",
            serde_json::from_value(serde_json::json!({"module": "x", "chart": {"path": "x"}}))
                .unwrap(),
        );
        m.metadata.uid = Some("u1".into());
        m.metadata.resource_version = Some(resource_version.into());
        m.status = state.map(|state| ManifestStatus {
            state: Some(state),
            ..Default::default()
        });
        m
    }

    #[test]
    fn the_cache_is_trusted_only_when_it_holds_the_last_write() {
        let writes = LastWrites::default();
        let written = manifest("10", Some(State::Ready));
        assert!(
            !writes.holds_last_write(&written, 1),
            "nothing written yet: read"
        );
        writes.wrote(&written, 1);
        assert!(writes.holds_last_write(&written, 1), "the write itself");
        // Someone annotated it since (a requested pass): a new version, our status.
        assert!(writes.holds_last_write(&manifest("11", Some(State::Ready)), 1));
        // The cache lags behind the write: an older status.
        assert!(!writes.holds_last_write(&manifest("9", Some(State::Processing)), 1));
        assert!(!writes.holds_last_write(&manifest("9", None), 1));
        // The shard was lost and taken back: another replica may have written since.
        assert!(!writes.holds_last_write(&written, 2));
        writes.forget(&written);
        assert!(!writes.holds_last_write(&written, 1));
        assert!(writes.is_empty());
    }
}
