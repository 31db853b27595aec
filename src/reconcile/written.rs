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
//! It also holds the status a pass left for the Manifest's next pass to write
//! ([`LastWrites::defer`]; docs/reconcile.md, "The rollout status, written by the look that
//! follows"): that pass starts from it only if the Manifest is still exactly as this replica
//! last knew it (same resourceVersion, same epoch of the shard).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::{Manifest, ManifestStatus};

/// This replica's last write to one Manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Write {
    resource_version: String,
    status: u64,
    epoch: i32,
}

/// How long a status left for the next pass is kept: a look comes within seconds, or after
/// the queue's wait in a burst; one that never comes (the shard moved, the Manifest was deleted
/// by another replica) must not keep its status in memory for good.
const KEPT_FOR: Duration = Duration::from_secs(600);

/// How often the statuses kept past [`KEPT_FOR`] are swept, at most (on the next hand-over or
/// pass start after it: every owned Manifest has a pass at least every `spec.interval`).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A status a pass left unwritten for the Manifest's next pass, valid only at this
/// resourceVersion and epoch.
#[derive(Clone, Debug)]
struct Deferred {
    resource_version: String,
    epoch: i32,
    status: ManifestStatus,
    at: Instant,
}

impl Deferred {
    /// Kept longer than [`KEPT_FOR`] at `now`.
    fn stale(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at) >= KEPT_FOR
    }
}

/// What is remembered, by UID (at most one entry of each kind per Manifest).
#[derive(Debug, Default)]
struct Remembered {
    writes: HashMap<String, Write>,
    deferred: HashMap<String, Deferred>,
    /// Manifests whose stored status is behind one a pass left for a look: set when a status
    /// is left, cleared only when a status write of this replica lands (or the Manifest is
    /// forgotten). While set, a pass that finds no kept status (taken by a look whose write
    /// failed, swept, superseded by another write of this replica) finds it [`Left::Dropped`]
    /// and writes: a status is never left twice without a write between.
    behind: HashSet<String>,
    /// When the statuses kept past [`KEPT_FOR`] were last swept.
    swept: Option<Instant>,
}

impl Remembered {
    /// Forgets the statuses kept past [`KEPT_FOR`], at most every [`SWEEP_EVERY`].
    fn sweep(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        self.deferred.retain(|_, kept| !kept.stale(now));
        self.swept = Some(now);
    }
}

/// What a pass finds of the status the last pass left for it ([`LastWrites::take_deferred`]).
#[derive(Debug, PartialEq)]
pub enum Left {
    /// None was left.
    Nothing,
    /// Left, and the Manifest is as that pass left it: start from it.
    Kept(Box<ManifestStatus>),
    /// Left, but the Manifest or the shard changed since: the stored status is behind.
    Dropped,
}

/// The last write of each Manifest this replica wrote, by UID, and the statuses passes left
/// for the next pass.
#[derive(Debug, Default)]
pub struct LastWrites {
    remembered: Mutex<Remembered>,
}

/// Which write of a Manifest was this replica's last when a pass began ([`LastWrites::mark`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark(Option<String>);

/// A digest of a Manifest's status as stored (the same for equal statuses).
fn status_digest(manifest: &Manifest) -> u64 {
    let text = serde_json::to_vec(&manifest.status).unwrap_or_default();
    BuildHasherDefault::<DefaultHasher>::default().hash_one(text)
}

impl LastWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.remembered.lock().unwrap_or_else(|e| e.into_inner())
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
        let mut remembered = self.lock();
        remembered.deferred.remove(&uid);
        remembered.writes.insert(uid, write);
    }

    /// Forgets a Manifest (deleted, released).
    pub fn forget(&self, manifest: &Manifest) {
        if let Some(uid) = manifest.uid() {
            let mut remembered = self.lock();
            remembered.writes.remove(&uid);
            remembered.deferred.remove(&uid);
            remembered.behind.remove(&uid);
        }
    }

    /// A status write of this replica landed for `manifest` (or the stored status already is
    /// what the pass would write): the stored status is no longer behind a kept one.
    pub fn caught_up(&self, manifest: &Manifest) {
        if let Some(uid) = manifest.uid() {
            self.lock().behind.remove(&uid);
        }
    }

    /// This replica's last write of `manifest` now: taken when a pass begins, to tell at its
    /// end whether it wrote the Manifest itself ([`LastWrites::defer`]).
    pub fn mark(&self, manifest: &Manifest) -> Mark {
        let uid = manifest.uid().unwrap_or_default();
        Mark(
            self.lock()
                .writes
                .get(&uid)
                .map(|w| w.resource_version.clone()),
        )
    }

    /// Leaves `status` for the Manifest's next pass instead of writing it: valid while the
    /// Manifest stays as this pass left it — at this replica's write made during the pass
    /// (`mark`, taken at its start, tells), or else at `started` (the Manifest as the pass
    /// began) — and the shard at `epoch`. `false` (nothing kept) when the pass wrote at
    /// another epoch.
    pub fn defer(
        &self,
        started: &Manifest,
        mark: &Mark,
        epoch: i32,
        status: ManifestStatus,
    ) -> bool {
        let Some(uid) = started.uid() else {
            return false;
        };
        let mut remembered = self.lock();
        let last = remembered.writes.get(&uid);
        let wrote_since = last.map(|w| w.resource_version.clone()) != mark.0;
        let resource_version = if wrote_since {
            last.filter(|w| w.epoch == epoch)
                .map(|w| w.resource_version.clone())
        } else {
            started.resource_version()
        };
        let Some(resource_version) = resource_version else {
            return false;
        };
        let now = Instant::now();
        let deferred = Deferred {
            resource_version,
            epoch,
            status,
            at: now,
        };
        remembered.behind.insert(uid.clone());
        remembered.deferred.insert(uid, deferred);
        remembered.sweep(now);
        true
    }

    /// The status a pass left for this one: [`Left::Kept`] if `current` (the Manifest this
    /// pass starts from) is still exactly as that pass left it, at the same epoch, and it was
    /// left less than [`KEPT_FOR`] ago; taken either way. [`Left::Dropped`] also when none is
    /// kept but the stored status is still behind one that was (see `Remembered::behind`).
    pub fn take_deferred(&self, current: &Manifest, epoch: i32) -> Left {
        self.take_deferred_at(current, epoch, Instant::now())
    }

    fn take_deferred_at(&self, current: &Manifest, epoch: i32, now: Instant) -> Left {
        let Some(uid) = current.uid() else {
            return Left::Nothing;
        };
        let mut remembered = self.lock();
        remembered.sweep(now);
        let Some(deferred) = remembered.deferred.remove(&uid) else {
            return if remembered.behind.contains(&uid) {
                Left::Dropped
            } else {
                Left::Nothing
            };
        };
        let same = deferred.epoch == epoch
            && !deferred.stale(now)
            && current.resource_version().as_deref() == Some(deferred.resource_version.as_str());
        if same {
            Left::Kept(Box::new(deferred.status))
        } else {
            Left::Dropped
        }
    }

    /// Whether `cached` (the watch cache's copy) holds this replica's last write of it, made
    /// at `epoch` ([`current`]).
    pub fn holds_last_write(&self, cached: &Manifest, epoch: i32) -> bool {
        let Some(uid) = cached.uid() else {
            return false;
        };
        let last = self.lock().writes.get(&uid).cloned();
        last.is_some_and(|last| current(&last, cached, epoch))
    }

    /// Manifests remembered now (their last writes; the statuses kept for a look are among
    /// them or were forgotten with them).
    pub fn len(&self) -> usize {
        self.lock().writes.len()
    }

    /// Statuses kept for a look now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.lock().deferred.len()
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

    #[test]
    fn a_status_left_for_the_next_pass_holds_only_while_the_manifest_is_as_left() {
        let writes = LastWrites::default();
        let rolling = ManifestStatus {
            state: Some(State::Processing),
            ..Default::default()
        };
        // A pass that wrote (the inventory): the status holds at that write.
        let started = manifest("10", None);
        let mark = writes.mark(&started);
        writes.wrote(&manifest("11", None), 1);
        assert!(writes.defer(&started, &mark, 1, rolling.clone()));
        let kept = Left::Kept(Box::new(rolling.clone()));
        assert_eq!(writes.take_deferred(&manifest("11", None), 1), kept);
        // The look's status write failed: the stored status is still behind.
        let again = writes.take_deferred(&manifest("11", None), 1);
        assert_eq!(again, Left::Dropped, "taken once, and behind until written");
        writes.caught_up(&manifest("11", None));
        assert_eq!(
            writes.take_deferred(&manifest("11", None), 1),
            Left::Nothing,
            "written"
        );
        // Someone wrote the Manifest since (a new resourceVersion): not used, and gone.
        let mark = writes.mark(&manifest("11", None));
        assert!(writes.defer(&manifest("11", None), &mark, 1, rolling.clone()));
        assert_eq!(
            writes.take_deferred(&manifest("12", None), 1),
            Left::Dropped
        );
        writes.caught_up(&manifest("12", None));
        // A pass that wrote nothing: the status holds at the version it started from.
        assert!(writes.defer(&manifest("11", None), &mark, 1, rolling.clone()));
        // The shard lost and taken back (another epoch): not used.
        assert_eq!(
            writes.take_deferred(&manifest("11", None), 2),
            Left::Dropped
        );
        writes.caught_up(&manifest("11", None));
        // Another write of this replica (a label) supersedes it: gone, the status behind.
        assert!(writes.defer(&manifest("11", None), &mark, 1, rolling.clone()));
        writes.wrote(&manifest("13", None), 1);
        let superseded = writes.take_deferred(&manifest("13", None), 1);
        assert_eq!(superseded, Left::Dropped);
        writes.caught_up(&manifest("13", None));
        // A pass whose write was made at another epoch leaves nothing.
        let mark = writes.mark(&manifest("13", None));
        writes.wrote(&manifest("14", None), 2);
        assert!(!writes.defer(&manifest("13", None), &mark, 1, rolling.clone()));
        assert_eq!(
            writes.take_deferred(&manifest("14", None), 2),
            Left::Nothing
        );
        // Forgetting the Manifest forgets it.
        let mark = writes.mark(&manifest("14", None));
        assert!(writes.defer(&manifest("14", None), &mark, 2, rolling));
        writes.forget(&manifest("14", None));
        assert_eq!(
            writes.take_deferred(&manifest("14", None), 2),
            Left::Nothing
        );
        assert_eq!(writes.kept(), 0);
    }

    #[test]
    fn statuses_kept_for_a_look_that_never_comes_are_swept() {
        let writes = LastWrites::default();
        let kept_for = |i: usize| {
            let mut m = manifest("10", None);
            m.metadata.uid = Some(format!("m-{i}"));
            let mark = writes.mark(&m);
            assert!(writes.defer(&m, &mark, 1, ManifestStatus::default()));
            m
        };
        let first = kept_for(0);
        let later = Instant::now() + KEPT_FOR + Duration::from_secs(1);
        // Past its time: not used.
        assert_eq!(writes.take_deferred_at(&first, 1, later), Left::Dropped);
        let others: Vec<Manifest> = (1..50).map(kept_for).collect();
        assert_eq!(writes.kept(), 49, "none is past its time yet");
        // Any pass start after the time sweeps them all, not only its own.
        let mut unrelated = manifest("10", None);
        unrelated.metadata.uid = Some("unrelated".into());
        let sweep_at = later + SWEEP_EVERY;
        assert_eq!(
            writes.take_deferred_at(&unrelated, 1, sweep_at),
            Left::Nothing
        );
        assert_eq!(writes.kept(), 0, "swept");
        // Their Manifests' stored statuses are still behind: their next passes write.
        for other in &others {
            assert_eq!(writes.take_deferred_at(other, 1, sweep_at), Left::Dropped);
        }
    }
}
