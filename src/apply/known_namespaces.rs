//! The namespaces of one cluster known to exist ([`Known`]), so that a pass does not read them
//! again: trusted for a while, forgotten when an apply into one fails.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a namespace seen to exist is trusted without a read. A namespace deleted meanwhile
/// fails the next apply into it, which forgets it ([`Known::forget`]): the pass after creates it.
const KNOWN_FOR: Duration = Duration::from_secs(300);
/// The same on a remote target: longer than the default `spec.interval` (10 minutes, up to 10 %
/// more with jitter), so that after a drift pass whose listing saw objects in the namespace
/// ([`super::Cluster::list_applied`]) the next one does not read it.
const REMOTE_KNOWN_FOR: Duration = Duration::from_secs(15 * 60);

/// Most namespaces remembered per cluster (past it, the expired ones are dropped, or all).
const MAX_KNOWN: usize = 4096;

/// The namespaces of one cluster known to exist, and since when.
#[derive(Debug)]
pub(super) struct Known {
    since: Mutex<HashMap<String, Instant>>,
    /// How long a namespace seen is trusted.
    known_for: Duration,
}

impl Default for Known {
    fn default() -> Self {
        Self {
            since: Mutex::default(),
            known_for: KNOWN_FOR,
        }
    }
}

impl Known {
    /// Namespaces of a remote target ([`REMOTE_KNOWN_FOR`]).
    pub(super) fn remote() -> Self {
        Self {
            known_for: REMOTE_KNOWN_FOR,
            ..Self::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `name` was seen to exist less than `known_for` before `now`.
    pub(super) fn holds(&self, name: &str, now: Instant) -> bool {
        self.lock()
            .get(name)
            .is_some_and(|since| now.duration_since(*since) < self.known_for)
    }

    /// `name` exists (read or created) at `now`.
    pub(super) fn exists(&self, name: &str, now: Instant) {
        let mut known = self.lock();
        if known.len() >= MAX_KNOWN {
            known.retain(|_, since| now.duration_since(*since) < self.known_for);
            if known.len() >= MAX_KNOWN {
                known.clear();
            }
        }
        known.insert(name.to_owned(), now);
    }

    /// `name` may be gone: read it next time.
    pub(super) fn forget(&self, name: &str) {
        self.lock().remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_trusted_for_a_while_and_forgotten_on_a_failed_apply() {
        let known = Known::default();
        let t0 = Instant::now();
        assert!(!known.holds("team-a", t0));
        known.exists("team-a", t0);
        assert!(known.holds("team-a", t0 + Duration::from_secs(60)));
        assert!(!known.holds("team-a", t0 + KNOWN_FOR), "read again later");
        known.forget("team-a");
        assert!(!known.holds("team-a", t0));
        for i in 0..MAX_KNOWN + 1 {
            known.exists(&format!("ns-{i}"), t0);
        }
        assert!(known.lock().len() <= MAX_KNOWN, "bounded");
        let remote = Known::remote();
        remote.exists("team-a", t0);
        assert!(
            remote.holds("team-a", t0 + KNOWN_FOR),
            "longer on a remote target"
        );
        assert!(!remote.holds("team-a", t0 + REMOTE_KNOWN_FOR));
    }
}
