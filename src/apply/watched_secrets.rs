//! The versions of the local cluster's Secrets as a metadata-only watch reports them
//! (`work/secret_versions.rs` feeds it), and as the passes' own reads found them: what lets a
//! pass on a remote target reuse its cached client without reading the kubeconfig Secret
//! ([`super::target`]). Only a Secret's namespace, name, UID and resourceVersion are kept (a
//! few hundred bytes per Secret). While the watch is not in step — before its first list, and
//! after an error until it has listed anew (the feed restarts the watch after any error, so no
//! skipped event can leave a stale version behind) — nothing is known and every pass reads the
//! Secret, as without the watch.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::Notify;

/// The version of a Secret a client was built from: a client is reused only while both match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// `metadata.uid` (a deleted and re-created Secret differs).
    pub uid: String,
    /// `metadata.resourceVersion` (any change to the Secret differs).
    pub resource_version: String,
}

impl Fingerprint {
    /// The version of the Secret whose metadata is `meta`.
    pub fn of(meta: &ObjectMeta) -> Self {
        Self {
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
        }
    }
}

/// A Secret by namespace and name.
pub type SecretName = (String, String);

/// What the watch of Secrets has shown.
#[derive(Debug, Default)]
pub struct WatchedSecrets {
    inner: Mutex<Inner>,
    /// A remote target was used: the watch is worth its cost (a replica without remote
    /// targets never lists the cluster's Secrets).
    wanted: AtomicBool,
    wanted_now: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    /// The first list is complete.
    listed: bool,
    /// The watch failed and has not listed since.
    failed: bool,
    versions: HashMap<SecretName, Fingerprint>,
}

impl WatchedSecrets {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pass uses a remote target: start the watch if it has not started.
    pub fn want(&self) {
        if !self.wanted.load(Ordering::Relaxed) && !self.wanted.swap(true, Ordering::SeqCst) {
            self.wanted_now.notify_one();
        }
    }

    /// Returns once a remote target has been used.
    pub async fn wanted(&self) {
        if !self.wanted.load(Ordering::SeqCst) {
            self.wanted_now.notified().await;
        }
    }

    /// The version of a Secret the watch has shown last; `None` when it has shown none (the
    /// Secret does not exist, or the watch has not listed it yet) or is not in step.
    pub fn known(&self, namespace: &str, name: &str) -> Option<Fingerprint> {
        let inner = self.lock();
        if !inner.listed || inner.failed {
            return None;
        }
        inner
            .versions
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// A complete list: what it holds replaces what was known; the watch is in step.
    pub fn listed(&self, versions: HashMap<SecretName, Fingerprint>) {
        let mut inner = self.lock();
        inner.versions = versions;
        inner.listed = true;
        inner.failed = false;
    }

    /// Secrets created, changed (`Some`) or deleted (`None`) by watch events.
    pub fn changed(&self, changes: impl IntoIterator<Item = (SecretName, Option<Fingerprint>)>) {
        let mut inner = self.lock();
        for (name, version) in changes {
            match version {
                Some(version) => inner.versions.insert(name, version),
                None => inner.versions.remove(&name),
            };
        }
    }

    /// What a read of the Secret found (`None`: it does not exist). A read is as fresh as the
    /// watch or fresher; an older event the watch delivers after it costs one more read.
    pub fn read(&self, namespace: &str, name: &str, version: Option<Fingerprint>) {
        let name = (namespace.to_owned(), name.to_owned());
        let mut inner = self.lock();
        match version {
            Some(version) => inner.versions.insert(name, version),
            None => inner.versions.remove(&name),
        };
    }

    /// Forgets a Secret another watch saw change: the next pass reads it, whatever this watch
    /// has delivered so far.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.lock()
            .versions
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// The watch failed: until it has listed anew, nothing it showed is trusted.
    pub fn out_of_step(&self) {
        self.lock().failed = true;
    }

    /// Secrets known (a figure for the memory it holds).
    pub fn len(&self) -> usize {
        self.lock().versions.len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(rv: &str) -> Fingerprint {
        Fingerprint {
            uid: "u".into(),
            resource_version: rv.into(),
        }
    }

    fn name(n: &str) -> SecretName {
        ("ns".into(), n.into())
    }

    #[test]
    fn nothing_is_known_before_the_first_list_nor_after_a_failure_until_a_new_list() {
        let watched = WatchedSecrets::default();
        watched.changed([(name("a"), Some(version("1")))]);
        assert_eq!(watched.known("ns", "a"), None, "not listed yet");
        watched.listed([(name("a"), version("1"))].into());
        assert_eq!(watched.known("ns", "a"), Some(version("1")));
        assert_eq!(watched.known("ns", "b"), None, "not listed: read it");
        watched.out_of_step();
        assert_eq!(watched.known("ns", "a"), None, "the watch failed");
        watched.changed([(name("b"), Some(version("7")))]);
        assert_eq!(
            watched.known("ns", "b"),
            None,
            "an event after a failure is not enough"
        );
        watched.listed([(name("a"), version("2"))].into());
        assert_eq!(watched.known("ns", "a"), Some(version("2")), "listed anew");
        assert_eq!(watched.known("ns", "b"), None, "not in the new list");
    }

    #[test]
    fn changes_and_deletions_replace_what_was_known() {
        let watched = WatchedSecrets::default();
        watched.listed([(name("a"), version("1")), (name("b"), version("2"))].into());
        watched.changed([(name("a"), Some(version("3"))), (name("b"), None)]);
        assert_eq!(watched.known("ns", "a"), Some(version("3")));
        assert_eq!(watched.known("ns", "b"), None);
        assert_eq!(watched.len(), 1);
        watched.listed([(name("c"), version("4"))].into());
        assert_eq!(watched.known("ns", "a"), None, "a relist without it: gone");
    }

    #[test]
    fn reads_and_forgotten_secrets_override_what_the_watch_showed() {
        let watched = WatchedSecrets::default();
        watched.listed([(name("a"), version("1"))].into());
        watched.forget("ns", "a");
        assert_eq!(
            watched.known("ns", "a"),
            None,
            "another watch saw it change: read it"
        );
        watched.read("ns", "a", Some(version("2")));
        assert_eq!(
            watched.known("ns", "a"),
            Some(version("2")),
            "what the read found"
        );
        watched.changed([(name("a"), Some(version("1")))]);
        assert_eq!(
            watched.known("ns", "a"),
            Some(version("1")),
            "a late, older event: the cached client (2) no longer matches, so it is read again"
        );
        watched.read("ns", "a", None);
        assert_eq!(watched.known("ns", "a"), None, "the read found it gone");
    }
}
