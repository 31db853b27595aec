//! The fleet's cap on module deletions (`--max-module-deletions-per-minute`): a Manifest whose
//! deletion would uninstall its module waits for its turn ([`crate::plan::deletion_pace`]) before the
//! first step of the deletion, so a mistaken mass deletion (`kubectl delete manifests --all`)
//! uninstalls at a known pace and leaves time to set `deletionPolicy: Orphan`
//! on the Manifests still waiting. Off (no cap) unless the flag is set.

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp, Unit};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::apply::budget::Share;
use crate::plan::deletion_pace::{Admission, DeletionPace, spacing};

/// The cap and this replica's pace under it.
#[derive(Debug, Default)]
pub struct DeletionCap {
    /// Module deletions the fleet may start a minute; `None`: no cap.
    per_minute: Option<NonZeroU32>,
    /// This replica's share of the fleet's shards (its share of the cap).
    share: Share,
    pace: Mutex<DeletionPace>,
    /// Deletions that had to wait for a turn
    /// (`module_manager_reconcile_deletions_delayed_total`).
    delayed: Counter,
    /// Deletions waiting for their turn (`module_manager_reconcile_deletions_waiting`), as of
    /// the last deletion pass.
    waiting: Gauge,
}

/// A deletion that must wait: when its turn comes, and the words for its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// How long until its turn.
    pub wait: Duration,
    /// The status message.
    pub message: String,
}

impl DeletionCap {
    /// A cap of `per_minute` module deletions for the fleet (`None`: none), split by `share`;
    /// its metrics are `delayed` and `waiting`.
    pub fn new(
        per_minute: Option<NonZeroU32>,
        share: Share,
        (delayed, waiting): (Counter, Gauge),
    ) -> Self {
        Self {
            per_minute,
            share,
            pace: Mutex::default(),
            delayed,
            waiting,
        }
    }

    /// Whether the deletion of the Manifest `uid` may start now; `Some(turn)` if it waits.
    pub fn admit(&self, uid: &str) -> Option<Turn> {
        let per_minute = self.per_minute?.get();
        let now = Instant::now();
        let spacing = spacing(per_minute, self.share.get());
        let mut pace = self.lock();
        let admitted = pace.admit(uid, now, spacing);
        self.waiting
            .set(i64::try_from(pace.waiting()).unwrap_or(i64::MAX));
        drop(pace);
        if admitted.queued && admitted.admission != Admission::Start {
            self.delayed.inc();
        }
        let Admission::Wait(at) = admitted.admission else {
            return None;
        };
        let wait = at.saturating_duration_since(now);
        Some(Turn {
            wait,
            message: turn_message(per_minute, wait),
        })
    }
}

impl DeletionCap {
    /// Forgets the Manifest `uid` (released): those queued behind it move up.
    pub fn forget(&self, uid: &str) {
        if self.per_minute.is_none() {
            return;
        }
        let mut pace = self.lock();
        pace.forget(uid);
        self.waiting
            .set(i64::try_from(pace.waiting()).unwrap_or(i64::MAX));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeletionPace> {
        self.pace.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The status message of a deletion waiting `wait` for its turn under a cap of `per_minute`.
fn turn_message(per_minute: u32, wait: Duration) -> String {
    let at = SignedDuration::try_from(wait)
        .ok()
        .and_then(|wait| Timestamp::now().checked_add(wait).ok())
        .and_then(|at| at.round(Unit::Second).ok())
        .map_or_else(|| "later".to_owned(), |at| format!("at about {at}"));
    format!(
        "waiting for its turn under the fleet's cap of {per_minute} module deletions a minute (--max-module-deletions-per-minute): the module is uninstalled {at}; deletionPolicy: Orphan releases the Manifest now and leaves the module installed"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(per_minute: u32) -> DeletionCap {
        let metrics = (Counter::default(), Gauge::default());
        DeletionCap::new(NonZeroU32::new(per_minute), Share::default(), metrics)
    }

    #[test]
    fn without_a_cap_every_deletion_starts() {
        let off = cap(0);
        assert!((0..100).all(|i| off.admit(&format!("m{i}")).is_none()));
        assert_eq!(off.waiting.get(), 0);
    }

    #[test]
    fn beyond_the_cap_deletions_wait_and_are_counted() {
        // One a second: the first starts, the next two wait about 1 and 2 s.
        let capped = cap(60);
        assert!(capped.admit("a").is_none());
        let b = capped.admit("b").expect("b waits");
        let c = capped.admit("c").expect("c waits");
        assert!(
            b.wait <= Duration::from_secs(1) && c.wait > b.wait,
            "{b:?} {c:?}"
        );
        assert!(
            c.message.contains("cap of 60 module deletions a minute"),
            "{}",
            c.message
        );
        assert!(
            c.message.contains("deletionPolicy: Orphan"),
            "{}",
            c.message
        );
        // Asked again, b waits for the same turn and is not counted twice.
        assert!(capped.admit("b").is_some());
        assert_eq!((capped.delayed.get(), capped.waiting.get()), (2, 2));
        // Released (Orphan), b leaves the queue: c moves up.
        capped.forget("b");
        assert_eq!(capped.waiting.get(), 1);
        let moved = capped.admit("c").expect("c still waits for the spacing");
        assert!(moved.wait <= Duration::from_secs(1), "{moved:?}");
    }
}
