//! Passes at once per remote target (`--target-passes`, default 1): a dispatched key whose target
//! already has that many passes on this replica goes back to the queue at once — it holds no
//! worker — and the first key that waited is queued again, due now, when one of them ends (every
//! waiting key also after [`PARKED_RECHECK`] whatever happens: the wake-up only makes it
//! sooner). So a slow, flooded or unreachable target holds at most `--target-passes` workers of a
//! replica at any moment, and the other targets' Manifests keep the rest. A target is its
//! kubeconfig Secret key ([`secret_key`](crate::apply::target::secret_key)); the local cluster is
//! not limited. The slot covers the whole pass (chart fetch and render included: the render
//! needs the target's discovery).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::apply::target::SecretKey;
use crate::telemetry::metrics::TargetMetrics;
use crate::work::caches::Key;
use crate::work::queue::WorkQueue;

/// When a key that found its target busy is looked at again if no pass of that target ends
/// before (a pass is bounded by the pass deadline; this keeps a lost wake-up short).
pub const PARKED_RECHECK: Duration = Duration::from_secs(10);

/// The passes of each target and the keys waiting for one of them to end, first come first
/// woken (pure).
#[derive(Debug)]
pub struct Slots<T, K> {
    limit: usize,
    held: HashMap<T, (usize, VecDeque<K>)>,
    most: usize,
    waiting: usize,
}

impl<T: Eq + Hash, K: PartialEq> Slots<T, K> {
    /// At most `limit` (at least 1) passes per target.
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            held: HashMap::new(),
            most: 0,
            waiting: 0,
        }
    }

    /// Takes a slot of `target` for `key`'s pass; when all are taken, `key` waits for one to be
    /// left and `false` is returned.
    pub fn enter(&mut self, target: T, key: K) -> bool {
        let (passes, parked) = self.held.entry(target).or_default();
        if *passes >= self.limit {
            if !parked.contains(&key) {
                parked.push_back(key);
                self.waiting += 1;
            }
            return false;
        }
        *passes += 1;
        self.most = self.most.max(*passes);
        // It came back before its wake-up (its recheck, an event): it no longer waits.
        let before = parked.len();
        parked.retain(|k| k != &key);
        self.waiting -= before - parked.len();
        true
    }

    /// Leaves a slot of `target`; the key that waited longest for one, to be queued again (the
    /// others keep waiting: one slot is free).
    pub fn leave(&mut self, target: &T) -> Option<K> {
        let (passes, parked) = self.held.get_mut(target)?;
        *passes = passes.saturating_sub(1);
        let woken = parked.pop_front();
        self.waiting -= usize::from(woken.is_some());
        if *passes == 0 && parked.is_empty() {
            self.held.remove(target);
        }
        woken
    }

    /// Stops `key` waiting for any target (its Manifest is gone, or no longer this replica's).
    pub fn forget(&mut self, key: &K) {
        let mut forgotten = 0;
        self.held.retain(|_, (passes, parked)| {
            let before = parked.len();
            parked.retain(|k| k != key);
            forgotten += before - parked.len();
            *passes > 0 || !parked.is_empty()
        });
        self.waiting -= forgotten;
    }

    /// Keys waiting for a slot of any target.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// The most passes one target held at once so far.
    pub fn most(&self) -> usize {
        self.most
    }
}

/// The replica's [`Slots`] of remote targets, with the queue that woken keys go back to.
pub(super) struct TargetGate {
    slots: Mutex<Slots<SecretKey, Key>>,
    queue: Arc<WorkQueue<Key>>,
    metrics: TargetMetrics,
}

impl TargetGate {
    /// A gate of `limit` passes per target; `module_manager_target_passes_waiting` reads it.
    pub(super) fn new(
        limit: usize,
        queue: Arc<WorkQueue<Key>>,
        metrics: TargetMetrics,
    ) -> Arc<Self> {
        let gate = Arc::new(Self {
            slots: Mutex::new(Slots::new(limit)),
            queue,
            metrics,
        });
        let weak = Arc::downgrade(&gate);
        gate.metrics
            .waiting
            .install(move || weak.upgrade().map_or(0, |gate| gate.waiting() as u64));
        gate
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots<SecretKey, Key>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keys waiting for a slot now (a pass does not wait for its workloads while any does).
    pub(super) fn waiting(&self) -> usize {
        self.lock().waiting()
    }

    /// Stops `key` waiting (dropped by this replica: a woken key that never comes back must not
    /// wait, nor be counted, for ever).
    pub(super) fn forget(&self, key: &Key) {
        self.lock().forget(key);
    }

    /// A slot of `target` for `key`'s pass, held until dropped; `None` when the target has no
    /// slot free: `key` is queued again after [`PARKED_RECHECK`], or as soon as a slot is left
    /// and it is the first waiting.
    pub(super) fn enter(self: &Arc<Self>, target: SecretKey, key: &Key) -> Option<Entered> {
        let mut slots = self.lock();
        if !slots.enter(target.clone(), key.clone()) {
            drop(slots);
            self.metrics.parked.inc();
            self.queue.add(key.clone(), PARKED_RECHECK);
            return None;
        }
        self.metrics.passes_held_max.set(slots.most() as i64);
        Some(Entered {
            gate: self.clone(),
            target,
        })
    }
}

/// A pass's slot of its target; leaving it (however the pass ends) wakes the keys that waited.
pub(super) struct Entered {
    gate: Arc<TargetGate>,
    target: SecretKey,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let woken = self.gate.lock().leave(&self.target);
        if let Some(key) = woken {
            self.gate.queue.add(key, Duration::ZERO);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_at_its_limit_parks_keys_until_a_pass_leaves() {
        let mut slots = Slots::new(1);
        assert!(slots.enter("t1", "a"));
        // The same target: parked (once, however often it is dispatched).
        assert!(!slots.enter("t1", "b"));
        assert!(!slots.enter("t1", "b"));
        assert!(!slots.enter("t1", "c"));
        // Another target is not held up.
        assert!(slots.enter("t2", "d"));
        assert_eq!(slots.most(), 1);
        assert_eq!(slots.waiting(), 2);
        // Leaving wakes the key that waited longest; the other keeps waiting.
        assert_eq!(slots.leave(&"t1"), Some("b"));
        assert_eq!(slots.waiting(), 1);
        // Another key came first: the woken one waits again, behind c.
        assert!(slots.enter("t1", "e"));
        assert!(!slots.enter("t1", "b"));
        assert_eq!(slots.leave(&"t1"), Some("c"));
        assert!(slots.enter("t1", "c"));
        // A key that comes back on its own while a slot is free stops waiting.
        assert!(!slots.enter("t1", "f"));
        assert_eq!(slots.leave(&"t1"), Some("b"));
        assert!(slots.enter("t1", "f"));
        assert_eq!(slots.waiting(), 0);
        assert_eq!(slots.leave(&"t1"), None);
        assert_eq!(slots.waiting(), 0);
        assert!(slots.held.contains_key("t2"));
        assert_eq!(slots.leave(&"t2"), None);
        // Nothing is kept for a target with no pass.
        assert!(slots.held.is_empty());
        // Leaving a target never entered is harmless.
        assert_eq!(slots.leave(&"t3"), None);
        // A key dropped while it waits (its Manifest deleted) is forgotten, and so is the
        // target once nothing runs or waits there.
        assert!(slots.enter("t4", "g"));
        assert!(!slots.enter("t4", "h"));
        assert!(!slots.enter("t4", "i"));
        assert_eq!(slots.leave(&"t4"), Some("h"));
        slots.forget(&"h");
        slots.forget(&"i");
        assert_eq!(slots.waiting(), 0);
        assert!(slots.held.is_empty());
    }

    #[test]
    fn a_higher_limit_lets_that_many_passes_in() {
        let mut slots = Slots::new(3);
        assert!(slots.enter("t", 1));
        assert!(slots.enter("t", 2));
        assert!(slots.enter("t", 3));
        assert!(!slots.enter("t", 4));
        assert_eq!(slots.most(), 3);
        assert_eq!(Slots::<&str, u8>::new(0).limit, 1);
    }
}
