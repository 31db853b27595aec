//! Fencing: which shards this replica may work on right now, shared between the fleet loop
//! (which writes it after every shard round) and the controller and reconcile passes (which
//! read it on every event, before every pass and before every write).
//!
//! A shard may be worked on while it is owned at the epoch the pass started with, and only until
//! the *renew deadline* of the last successful membership renewal: `renewed_at +
//! renew_deadline`, with `renew_deadline` shorter than the lease duration. Other replicas declare
//! this one dead no earlier than `renewed_at + lease_duration` on their clocks, so a replica that
//! cannot renew (partitioned, paused, overloaded) stops itself before anyone else may take its
//! shards over. The checks read the monotonic clock, which keeps running while a process is
//! stopped: a process resumed after `SIGSTOP` finds its deadline passed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

/// The shards this replica holds and until when it may act on them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Held {
    /// Owned shards (draining ones included) and their epochs.
    epochs: BTreeMap<u32, i32>,
    /// Owned shards being handed over: no new passes.
    draining: BTreeSet<u32>,
    /// Acting is allowed until then (`None`: never).
    valid_until: Option<Instant>,
    /// Owns every shard, forever: a replica outside any fleet (tests, benchmarks).
    everything: bool,
}

/// This replica's ownership, shared.
#[derive(Debug)]
pub struct Ownership {
    held: Mutex<Held>,
    /// The shards whose Manifests this replica watches (owned, not draining); the controller
    /// re-filters its watch and queue when it changes.
    watched: watch::Sender<Watched>,
}

/// The shards to watch (`None`: every shard), and how many times a shard has left the set: a
/// change of either restarts the controller's watch, even when a loss and a re-acquisition were
/// coalesced into one notification.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Watched {
    /// Owned, not draining (`None`: every shard).
    pub shards: Option<BTreeSet<u32>>,
    /// Bumped whenever a shard leaves the set.
    pub losses: u64,
}

/// Why a pass stopped: this replica no longer may act on the Manifest's shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "shard {shard} is no longer owned by this replica at epoch {epoch} (handed over, taken over, or the membership lease was not renewed in time)"
)]
pub struct FenceLost {
    /// The shard.
    pub shard: u32,
    /// The epoch the pass started with.
    pub epoch: i32,
}

/// A pass's permission to act on one shard, checked before every write.
#[derive(Clone, Debug)]
pub struct Fence {
    ownership: Arc<Ownership>,
    shard: u32,
    epoch: i32,
}

impl Fence {
    /// Whether the pass may still write: the shard is still owned at the same epoch and the
    /// renew deadline has not passed.
    pub fn check(&self) -> Result<(), FenceLost> {
        if self.ownership.holds(self.shard, self.epoch) {
            Ok(())
        } else {
            Err(FenceLost {
                shard: self.shard,
                epoch: self.epoch,
            })
        }
    }

    /// The shard this fence guards.
    pub fn shard(&self) -> u32 {
        self.shard
    }
}

impl Ownership {
    /// Owns nothing until the first shard round.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::default(),
            watched: watch::Sender::new(Watched {
                shards: Some(BTreeSet::new()),
                losses: 0,
            }),
        })
    }

    /// Owns every shard and never expires: a replica outside any fleet (tests, benchmarks).
    pub fn everything() -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::new(Held {
                everything: true,
                ..Default::default()
            }),
            watched: watch::Sender::new(Watched::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn holds(&self, shard: u32, epoch: i32) -> bool {
        let held = self.lock();
        held.everything
            || (held.valid_until.is_some_and(|until| Instant::now() < until)
                && held.epochs.get(&shard) == Some(&epoch))
    }

    /// A fence for a new pass on `shard`, if one may start: owned, not draining, in time.
    pub fn dispatch(self: &Arc<Self>, shard: u32) -> Option<Fence> {
        let held = self.lock();
        let epoch = if held.everything {
            0
        } else {
            if held.valid_until.is_none_or(|until| Instant::now() >= until)
                || held.draining.contains(&shard)
            {
                return None;
            }
            *held.epochs.get(&shard)?
        };
        Some(Fence {
            ownership: self.clone(),
            shard,
            epoch,
        })
    }

    /// Whether events of `shard` concern this replica (owned and not draining; the deadline is
    /// checked at dispatch).
    pub fn wants(&self, shard: u32) -> bool {
        let held = self.lock();
        held.everything || (held.epochs.contains_key(&shard) && !held.draining.contains(&shard))
    }

    /// Subscribes to the shards to watch.
    pub fn subscribe(&self) -> watch::Receiver<Watched> {
        self.watched.subscribe()
    }

    /// Owned shards (draining ones included) with their epochs.
    pub fn owned(&self) -> BTreeMap<u32, i32> {
        self.lock().epochs.clone()
    }

    /// Owned shards being handed over.
    pub fn draining(&self) -> BTreeSet<u32> {
        self.lock().draining.clone()
    }

    /// Whether this replica may act at all now (its renew deadline has not passed).
    pub fn in_time(&self) -> bool {
        let held = self.lock();
        held.everything || held.valid_until.is_some_and(|until| Instant::now() < until)
    }

    /// Records the outcome of a shard round that read the shard Leases *after* the renewal that
    /// started at `renewed_at`: the owned shards and their epochs, those draining, and the new
    /// deadline.
    pub fn set(&self, epochs: BTreeMap<u32, i32>, draining: BTreeSet<u32>, valid_until: Instant) {
        let mut held = self.lock();
        if held.everything {
            return;
        }
        report_lapse(&held);
        held.epochs = epochs;
        held.draining = draining;
        held.valid_until = Some(valid_until);
        self.publish(&held);
    }

    /// Extends the deadline after a renewal when the shard round failed: only valid if the
    /// previous deadline had not passed (then no one could have declared this replica dead, so
    /// its shards are still its own); after a lapse, everything is dropped until a round reads
    /// the Leases again.
    pub fn extend(&self, valid_until: Instant) {
        let mut held = self.lock();
        if held.everything {
            return;
        }
        if held.valid_until.is_some_and(|until| Instant::now() < until) {
            held.valid_until = Some(valid_until);
        } else {
            report_lapse(&held);
            held.epochs.clear();
            held.draining.clear();
            held.valid_until = None;
        }
        self.publish(&held);
    }

    /// Stops all work at once (renew deadline passed, or shutting down): nothing is
    /// dispatchable and every fence fails. The shard Leases are not touched.
    pub fn fence(&self) {
        let mut held = self.lock();
        if held.everything {
            held.everything = false;
            held.epochs.clear();
        }
        held.valid_until = None;
        self.publish(&held);
    }

    /// Stops new passes on `shard` at once (before its release is decided): a pass dispatched
    /// before this is counted in flight by the queue, one dispatched after is refused, and its
    /// events are ignored. The controller's watch follows at the round's end (`set`), once for
    /// all the shards the round releases.
    pub fn stop_dispatch(&self, shard: u32) {
        let mut held = self.lock();
        if held.epochs.contains_key(&shard) {
            held.draining.insert(shard);
        }
    }

    fn publish(&self, held: &Held) {
        if held.everything {
            return;
        }
        let shards: BTreeSet<u32> = held
            .epochs
            .keys()
            .filter(|k| !held.draining.contains(k))
            .copied()
            .collect();
        self.watched.send_if_modified(|current| {
            if current.shards.as_ref() == Some(&shards) {
                return false;
            }
            let lost = current
                .shards
                .as_ref()
                .is_none_or(|before| before.iter().any(|k| !shards.contains(k)));
            if lost {
                current.losses += 1;
            }
            current.shards = Some(shards);
            true
        });
    }
}

/// Logs that the previous deadline passed before this update (the process was stopped, or could
/// not renew): every fence failed meanwhile.
fn report_lapse(held: &Held) {
    if let Some(until) = held.valid_until {
        let now = Instant::now();
        if now >= until {
            tracing::warn!(
                lapsed_seconds = (now - until).as_secs_f64(),
                "membership lease not renewed within the renew deadline: all work was stopped; resuming with the shards the Leases show now"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn epochs(pairs: &[(u32, i32)]) -> BTreeMap<u32, i32> {
        pairs.iter().copied().collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_holds_while_owned_at_its_epoch_and_in_time() {
        let ownership = Ownership::new();
        assert!(
            ownership.dispatch(1).is_none(),
            "nothing owned before a round"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        ownership.set(epochs(&[(1, 3), (2, 1)]), BTreeSet::from([2]), deadline);
        let fence = ownership.dispatch(1).expect("owned");
        assert!(fence.check().is_ok());
        assert!(ownership.dispatch(2).is_none(), "draining: no new passes");
        assert!(ownership.dispatch(3).is_none(), "not owned");
        assert_eq!(
            ownership.subscribe().borrow().shards,
            Some(BTreeSet::from([1]))
        );

        // Taken over and re-acquired: a new epoch; the old pass must not write.
        ownership.set(epochs(&[(1, 5)]), BTreeSet::new(), deadline);
        assert_eq!(fence.check(), Err(FenceLost { shard: 1, epoch: 3 }));
        let fence = ownership.dispatch(1).unwrap();
        assert!(fence.check().is_ok());

        // The renew deadline passes (no renewal, or the process was stopped).
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(fence.check().is_err());
        assert!(ownership.dispatch(1).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn extending_after_a_lapse_drops_everything_until_the_next_round() {
        let ownership = Ownership::new();
        ownership.set(
            epochs(&[(1, 1)]),
            BTreeSet::new(),
            Instant::now() + Duration::from_secs(10),
        );
        // In time: a renewal without a round keeps the shards.
        tokio::time::advance(Duration::from_secs(5)).await;
        ownership.extend(Instant::now() + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(ownership.dispatch(1).is_some(), "extended");
        // A lapse (e.g. SIGSTOP past the deadline), then a renewal without a round: nothing.
        tokio::time::advance(Duration::from_secs(30)).await;
        ownership.extend(Instant::now() + Duration::from_secs(10));
        assert!(ownership.dispatch(1).is_none());
        assert!(ownership.owned().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_dispatch_refuses_new_passes_and_counts_as_a_loss_for_the_watch() {
        let ownership = Ownership::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        ownership.set(epochs(&[(1, 1), (2, 1)]), BTreeSet::new(), deadline);
        let before = ownership.subscribe().borrow().clone();
        let running = ownership.dispatch(1).unwrap();
        ownership.stop_dispatch(1);
        assert!(
            ownership.dispatch(1).is_none(),
            "no new pass once dispatch stopped"
        );
        assert!(!ownership.wants(1), "its events are ignored");
        assert!(running.check().is_ok(), "a pass already running may finish");
        // The round's end publishes the release to the controller's watch.
        ownership.set(epochs(&[(2, 1)]), BTreeSet::new(), deadline);
        let after = ownership.subscribe().borrow().clone();
        assert_eq!(after.shards, Some(BTreeSet::from([2])));
        assert_eq!(after.losses, before.losses + 1);
        // Lost and re-acquired between two looks of the controller: the counter still differs.
        ownership.set(epochs(&[(1, 3), (2, 1)]), BTreeSet::new(), deadline);
        let again = ownership.subscribe().borrow().clone();
        assert_eq!(again.shards, before.shards);
        assert_ne!(again, before);
    }

    #[test]
    fn everything_owns_every_shard_until_fenced() {
        let ownership = Ownership::everything();
        let fence = ownership.dispatch(77).unwrap();
        assert!(fence.check().is_ok() && ownership.wants(3));
        ownership.fence();
        assert!(fence.check().is_err());
        assert!(ownership.dispatch(77).is_none());
    }
}
