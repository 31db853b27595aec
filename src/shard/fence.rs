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
//!
//! The deadline follows the renewals themselves (`extend`, called as soon as a renewal
//! succeeds), not only the shard rounds, and it never moves backwards; every lapse (a deadline
//! found passed while it was set) is counted in `module_manager_fence_lapses_total`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
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
    /// The unbroken chain of successful renewals: since the start of its first, and until
    /// when its last allows acting (each renewal completed before the previous one's deadline).
    chain: Option<(Instant, Instant)>,
    /// Owns every shard, forever: a replica outside any fleet (tests, benchmarks).
    everything: bool,
    /// Another process renews this replica's membership Lease under its name: nothing is
    /// owned, for good ([`Ownership::supersede`]).
    superseded: bool,
}

/// This replica's ownership, shared.
#[derive(Debug)]
pub struct Ownership {
    held: Mutex<Held>,
    /// The shards whose Manifests this replica watches (owned, not draining); the controller
    /// re-filters its watch and queue when it changes.
    watched: watch::Sender<Watched>,
    /// Lapses: deadlines found passed while set (`module_manager_fence_lapses_total`).
    lapses: Counter,
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

/// What a successful membership renewal allows: acting until `until` (its start + the renew
/// deadline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// When the renewal started.
    pub renewed_at: Instant,
    /// Acting is allowed until then.
    pub until: Instant,
}

impl Grant {
    /// The grant of a renewal that started at `renewed_at`.
    pub fn new(renewed_at: Instant, renew_deadline: std::time::Duration) -> Self {
        Self {
            renewed_at,
            until: renewed_at + renew_deadline,
        }
    }
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

    /// The epoch of the shard's ownership the pass started with.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }
}

impl Ownership {
    /// Owns nothing until the first shard round.
    pub fn new() -> Arc<Self> {
        Self::counting_lapses(Counter::default())
    }

    /// Owns nothing until the first shard round; counts every lapse in `lapses`.
    pub fn counting_lapses(lapses: Counter) -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::default(),
            watched: watch::Sender::new(Watched {
                shards: Some(BTreeSet::new()),
                losses: 0,
            }),
            lapses,
        })
    }

    /// How many times the deadline was found passed while set.
    pub fn lapses(&self) -> u64 {
        self.lapses.get()
    }

    /// Owns every shard and never expires: a replica outside any fleet (tests, benchmarks).
    pub fn everything() -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::new(Held {
                everything: true,
                ..Default::default()
            }),
            watched: watch::Sender::new(Watched::default()),
            lapses: Counter::default(),
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

    /// The fraction of the fleet's `shards` this replica owns (draining ones included): 1 when
    /// it owns everything outside a fleet.
    pub fn share(&self, shards: u32) -> f64 {
        let held = self.lock();
        if held.everything {
            return 1.0;
        }
        held.epochs.len() as f64 / f64::from(shards.max(1))
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

    /// Records the outcome of a shard round that read the shard Leases *after* the renewal of
    /// `grant`: the owned shards and their epochs, those draining, and the new deadline — the
    /// grant's, or a later one of the renewals that completed since in an unbroken chain with it
    /// (each before the previous deadline: no one could have declared this replica dead
    /// meanwhile). So a renewal that completes while a round runs is never lost.
    pub fn set(&self, epochs: BTreeMap<u32, i32>, draining: BTreeSet<u32>, grant: Grant) {
        let mut held = self.lock();
        if held.everything || held.superseded {
            return;
        }
        self.report_lapse(&held);
        held.epochs = epochs;
        held.draining = draining;
        let now = Instant::now();
        let chained = held
            .chain
            .filter(|(since, until)| *since <= grant.renewed_at && now < *until)
            .map(|(_, until)| until);
        held.valid_until = Some(chained.map_or(grant.until, |until| until.max(grant.until)));
        self.publish(&held);
    }

    /// Records a successful renewal at once (the fence follows the renewals, not the rounds,
    /// which tick independently): extends the deadline as [`Ownership::extend`] does, and the
    /// renewal chain a later [`Ownership::set`] may use.
    pub fn renewed(&self, grant: Grant) {
        {
            let mut held = self.lock();
            let now = Instant::now();
            held.chain = Some(match held.chain {
                Some((since, until)) if now < until => (since, until.max(grant.until)),
                _ => (grant.renewed_at, grant.until),
            });
        }
        self.extend(grant.until);
    }

    /// Extends the deadline after a renewal (see [`Ownership::renewed`]; also after a renewal
    /// when the shard round failed): only valid if the previous deadline had not passed (then
    /// no one could have declared this replica dead, so its shards are still its own); after a
    /// lapse, everything is dropped until a round reads the Leases again. Never moves the
    /// deadline backwards.
    pub fn extend(&self, valid_until: Instant) {
        let mut held = self.lock();
        if held.everything || held.superseded {
            return;
        }
        if held.valid_until.is_some_and(|until| Instant::now() < until) {
            held.valid_until = held.valid_until.max(Some(valid_until));
        } else {
            self.report_lapse(&held);
            held.epochs.clear();
            held.draining.clear();
            held.valid_until = None;
        }
        self.publish(&held);
    }

    /// Stops all work at once (renew deadline passed, or shutting down): nothing is
    /// dispatchable and every fence fails. The shard Leases are not touched. A deadline found
    /// passed here counts as a lapse (the caller logs it).
    pub fn fence(&self) {
        let mut held = self.lock();
        self.count_lapse(&held);
        if held.everything {
            held.everything = false;
            held.epochs.clear();
        }
        held.valid_until = None;
        self.publish(&held);
    }

    /// Stops all work for good: another process renews this replica's membership Lease under
    /// its name (a second process with the same replica name, which took the Lease over). No
    /// later round or renewal grants anything again; the process must be restarted.
    pub fn supersede(&self) {
        let mut held = self.lock();
        held.superseded = true;
        held.everything = false;
        held.epochs.clear();
        held.draining.clear();
        held.valid_until = None;
        held.chain = None;
        self.publish(&held);
    }

    /// Whether [`Ownership::supersede`] was called.
    pub fn is_superseded(&self) -> bool {
        self.lock().superseded
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

impl Ownership {
    /// Counts a lapse if the deadline was set and has passed; returns for how long it has.
    fn count_lapse(&self, held: &Held) -> Option<std::time::Duration> {
        let now = Instant::now();
        let lapsed = held.valid_until.filter(|until| now >= *until)?;
        self.lapses.inc();
        Some(now - lapsed)
    }

    /// Counts and logs that the previous deadline passed before this update (the process was
    /// stopped, or could not renew): every fence failed meanwhile.
    fn report_lapse(&self, held: &Held) {
        if let Some(lapsed) = self.count_lapse(held) {
            tracing::warn!(
                lapsed_seconds = lapsed.as_secs_f64(),
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
        let grant = Grant::new(Instant::now(), Duration::from_secs(10));
        ownership.set(epochs(&[(1, 3), (2, 1)]), BTreeSet::from([2]), grant);
        let fence = ownership.dispatch(1).expect("owned");
        assert!(fence.check().is_ok());
        assert!(ownership.dispatch(2).is_none(), "draining: no new passes");
        assert!(ownership.dispatch(3).is_none(), "not owned");
        assert_eq!(
            ownership.subscribe().borrow().shards,
            Some(BTreeSet::from([1]))
        );

        // Taken over and re-acquired: a new epoch; the old pass must not write.
        ownership.set(epochs(&[(1, 5)]), BTreeSet::new(), grant);
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
            Grant::new(Instant::now(), Duration::from_secs(10)),
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
        let deadline = Grant::new(Instant::now(), Duration::from_secs(10));
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

    #[tokio::test(start_paused = true)]
    async fn a_renewal_extends_the_deadline_at_once_and_is_not_undone_by_an_older_round() {
        let deadline = Duration::from_secs(10);
        let ownership = Ownership::new();
        let first = Grant::new(Instant::now(), deadline);
        ownership.renewed(first);
        assert!(!ownership.in_time(), "a renewal alone owns nothing");
        ownership.set(epochs(&[(1, 1)]), BTreeSet::new(), first);
        // A round starts with the first grant; the next renewal completes while it runs.
        tokio::time::advance(Duration::from_secs(5)).await;
        ownership.renewed(Grant::new(Instant::now(), deadline));
        ownership.set(epochs(&[(1, 1)]), BTreeSet::new(), first);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(
            ownership.dispatch(1).is_some(),
            "the renewal's deadline holds"
        );
        assert_eq!(ownership.lapses(), 0);
        // No renewal: the deadline passes; the next update counts the lapse once.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(ownership.dispatch(1).is_none());
        let late = Grant::new(Instant::now(), deadline);
        ownership.renewed(late);
        assert_eq!(ownership.lapses(), 1);
        assert!(
            ownership.owned().is_empty(),
            "dropped until a round reads the Leases"
        );
        // A round that started before the late renewal cannot use its chain.
        ownership.set(epochs(&[(1, 1)]), BTreeSet::new(), first);
        assert!(ownership.dispatch(1).is_none());
        ownership.set(epochs(&[(1, 2)]), BTreeSet::new(), late);
        assert!(ownership.dispatch(1).is_some());
        assert_eq!(
            ownership.lapses(),
            2,
            "the stale round found its own deadline passed"
        );
    }
}
