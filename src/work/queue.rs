//! Work queue: per-key de-duplication, delayed requeue, one worker per key at a time.
//!
//! kube-runtime's `Controller` does not expose its queue; this one is small enough to own, and
//! the fleet needs its exact depth per shard, and to drop a shard's keys at handover.
//!
//! Its *depth* is what client-go's workqueue calls depth: the keys due and waiting for a worker
//! (the backlog). Keys in flight are counted apart, and so are the keys *scheduled* for a later
//! time (the drift re-check of every Ready Manifest, a retry after its backoff): an idle replica
//! has depth 0 however many Manifests it owns.
//!
//! Due keys come out in two classes, taking turns while both have some: [`Class::Continuing`]
//! (a pass whose work goes on — a rollout it looks at again, a deletion waiting for its objects)
//! and [`Class::Fresh`] (everything else: new Manifests, changes, drift checks, retries), each
//! in order of due time. So a Manifest that has started is not queued behind thousands of first
//! passes, and first passes get every other worker however many rollouts are being watched.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::telemetry::metrics::QueueMetrics;
use tokio::time::Instant;

/// A queue key: knows the shard it belongs to (per-shard depth, handover).
pub trait QueueKey: Clone + Eq + Hash + Ord + Send + 'static {
    /// The key's shard (0 for keys that are not sharded).
    fn shard(&self) -> u32 {
        0
    }
}

impl QueueKey for &'static str {}

/// One shard's part of the queue.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShardQueue {
    /// Keys due and waiting for a worker.
    pub depth: usize,
    /// Keys being worked on.
    pub in_flight: usize,
    /// Keys queued for a later time.
    #[serde(default)]
    pub scheduled: usize,
    /// How long the longest-waiting due key has waited, in seconds.
    pub oldest_wait_seconds: f64,
    /// In how many seconds the next scheduled key is due (`None`: none is scheduled).
    #[serde(default)]
    pub next_due_in_seconds: Option<f64>,
}

/// The queue at one instant.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QueueSnapshot {
    /// Keys due and waiting for a worker (the backlog).
    pub depth: usize,
    /// Keys being worked on.
    pub in_flight: usize,
    /// Keys queued for a later time (re-checks, retries).
    #[serde(default)]
    pub scheduled: usize,
    /// In how many seconds the next scheduled key is due (`None`: none is scheduled).
    #[serde(default)]
    pub next_due_in_seconds: Option<f64>,
    /// Per shard, only shards with queued or in-flight keys.
    pub shards: BTreeMap<u32, ShardQueue>,
}

impl ShardQueue {
    /// Counts one queued key due at `at`, as seen at `now`.
    fn count(&mut self, at: Instant, now: Instant) {
        if at <= now {
            self.depth += 1;
            let waited = (now - at).as_secs_f64();
            self.oldest_wait_seconds = self.oldest_wait_seconds.max(waited);
        } else {
            self.scheduled += 1;
            let due_in = (at - now).as_secs_f64();
            self.next_due_in_seconds = Some(
                self.next_due_in_seconds
                    .map_or(due_in, |next| next.min(due_in)),
            );
        }
    }
}

/// A queue of keys, each due at an instant.
pub struct WorkQueue<K> {
    state: Arc<Mutex<QueueState<K>>>,
    wake: Notify,
    metrics: QueueMetrics,
}

/// A heap entry: due time, insertion sequence (FIFO among equal times), key.
type Entry<K> = Reverse<(Instant, u64, K)>;

/// Which turn a due key waits for ([module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// New work: a new or changed Manifest, a drift check, a retry.
    Fresh,
    /// A pass's work going on: the next look at a rollout, a deletion's wait.
    Continuing,
}

struct QueueState<K> {
    /// When each queued key is due (the earliest requested), and its class.
    due: HashMap<K, (Instant, Class)>,
    /// Due times in order, per class; entries that no longer match `due` are stale and skipped.
    fresh: BinaryHeap<Entry<K>>,
    continuing: BinaryHeap<Entry<K>>,
    /// Keys being worked on now.
    in_flight: HashSet<K>,
    sequence: u64,
    /// Whose turn it is when both classes have a due key.
    continuing_next: bool,
    closed: bool,
}

impl<K: QueueKey> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new(QueueMetrics::default())
    }
}

impl<K: QueueKey> WorkQueue<K> {
    /// A queue that keeps `metrics` exact: in flight as keys come and go, due and scheduled
    /// read from it at each scrape (the last queue made with `metrics` is the one they show).
    pub fn new(metrics: QueueMetrics) -> Self {
        let state = Arc::new(Mutex::new(QueueState {
            due: HashMap::new(),
            fresh: BinaryHeap::new(),
            continuing: BinaryHeap::new(),
            in_flight: HashSet::new(),
            sequence: 0,
            continuing_next: false,
            closed: false,
        }));
        let weak = Arc::downgrade(&state);
        metrics.counts.install(move || {
            weak.upgrade().map_or((0, 0), |state| {
                let state = state.lock().unwrap_or_else(|e| e.into_inner());
                let now = Instant::now();
                let due = state.due.values().filter(|(at, _)| *at <= now).count();
                (due as u64, (state.due.len() - due) as u64)
            })
        });
        Self {
            state,
            wake: Notify::new(),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState<K>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `key` as fresh work after `delay` (at most a year). A key already queued keeps
    /// the earlier of the two times (and that time's class).
    pub fn add(&self, key: K, delay: Duration) {
        self.add_as(key, delay, Class::Fresh);
    }

    /// Queues `key` after `delay` in `class`, as [`WorkQueue::add`].
    pub fn add_as(&self, key: K, delay: Duration, class: Class) {
        let at = Instant::now() + delay.min(Duration::from_secs(365 * 24 * 3600));
        let mut state = self.lock();
        if state.due.get(&key).is_some_and(|(due, _)| *due <= at) {
            return;
        }
        state.due.insert(key.clone(), (at, class));
        state.sequence += 1;
        let sequence = state.sequence;
        state.heap_of(class).push(Reverse((at, sequence, key)));
        drop(state);
        self.wake.notify_one();
    }

    /// Waits for the next due key that is not being worked on and marks it in flight; `None`
    /// once the queue is closed.
    pub async fn next(&self) -> Option<K> {
        loop {
            let wait_until = {
                let mut state = self.lock();
                if state.closed {
                    return None;
                }
                match state.pop_due() {
                    Ok((key, waited)) => {
                        self.metrics.wait.observe(waited.as_secs_f64());
                        self.metrics.in_flight.set(state.in_flight.len() as i64);
                        return Some(key);
                    }
                    Err(next) => next,
                }
            };
            match wait_until {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }

    /// Marks `key` finished; a requeue that arrived meanwhile becomes eligible.
    pub fn done(&self, key: &K) {
        let mut state = self.lock();
        state.in_flight.remove(key);
        self.metrics.in_flight.set(state.in_flight.len() as i64);
        drop(state);
        self.wake.notify_one();
    }

    /// Number of queued keys, due or scheduled, not counting those in flight.
    pub fn len(&self) -> usize {
        self.lock().due.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the queued keys of shards for which `keep` is false (a shard handed over: its new
    /// owner queues them itself); keys in flight finish. Returns how many were dropped.
    pub fn retain_shards(&self, keep: impl Fn(u32) -> bool) -> usize {
        let mut state = self.lock();
        let before = state.due.len();
        state.due.retain(|key, _| keep(key.shard()));
        let dropped = before - state.due.len();
        // Heap entries of dropped keys are now stale and skipped.
        dropped
    }

    /// Number of keys of `shard` being worked on.
    pub fn in_flight_in(&self, shard: u32) -> usize {
        self.lock()
            .in_flight
            .iter()
            .filter(|k| k.shard() == shard)
            .count()
    }

    /// Depth (due and waiting), in flight, scheduled, the longest wait and the next due time,
    /// in total and per shard.
    pub fn snapshot(&self) -> QueueSnapshot {
        let now = Instant::now();
        let state = self.lock();
        let mut shards: BTreeMap<u32, ShardQueue> = BTreeMap::new();
        let mut total = ShardQueue::default();
        for (key, (at, _)) in &state.due {
            shards.entry(key.shard()).or_default().count(*at, now);
            total.count(*at, now);
        }
        for key in &state.in_flight {
            shards.entry(key.shard()).or_default().in_flight += 1;
        }
        QueueSnapshot {
            depth: total.depth,
            in_flight: state.in_flight.len(),
            scheduled: total.scheduled,
            next_due_in_seconds: total.next_due_in_seconds,
            shards,
        }
    }

    /// Stops handing out keys: `next` returns `None` from now on.
    pub fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_waiters();
    }
}

impl<K: QueueKey> QueueState<K> {
    fn heap_of(&mut self, class: Class) -> &mut BinaryHeap<Entry<K>> {
        match class {
            Class::Fresh => &mut self.fresh,
            Class::Continuing => &mut self.continuing,
        }
    }

    /// The first due key not in flight with how long it waited since due, or the instant to
    /// wait for (`None`: nothing queued). The classes take turns while both have a due key.
    fn pop_due(&mut self) -> Result<(K, Duration), Option<Instant>> {
        let now = Instant::now();
        let mut deferred = Vec::new();
        let fresh = self.first_due(Class::Fresh, now, &mut deferred);
        let continuing = self.first_due(Class::Continuing, now, &mut deferred);
        let picked = match (fresh, continuing) {
            (Ok(fresh), Ok(continuing)) => {
                let (picked, other, class) = if self.continuing_next {
                    (continuing, fresh, Class::Fresh)
                } else {
                    (fresh, continuing, Class::Continuing)
                };
                self.heap_of(class).push(other);
                Ok(picked)
            }
            (Ok(fresh), Err(_)) => Ok(fresh),
            (Err(_), Ok(continuing)) => Ok(continuing),
            (Err(a), Err(b)) => Err(a.into_iter().chain(b).min()),
        };
        // Keys whose worker is still busy wait for `done`, which wakes the queue.
        for (class, entry) in deferred {
            self.heap_of(class).push(entry);
        }
        let Reverse((at, _, key)) = picked?;
        let class = self
            .due
            .remove(&key)
            .map_or(Class::Fresh, |(_, class)| class);
        self.continuing_next = class == Class::Fresh;
        self.in_flight.insert(key.clone());
        Ok((key, now.saturating_duration_since(at)))
    }

    /// The first due entry of `class` not in flight, popped (stale entries dropped, those in
    /// flight added to `deferred`); or when the first of that class is due (`None`: none).
    fn first_due(
        &mut self,
        class: Class,
        now: Instant,
        deferred: &mut Vec<(Class, Entry<K>)>,
    ) -> Result<Entry<K>, Option<Instant>> {
        loop {
            let Some(Reverse((at, sequence, key))) = self.heap_of(class).pop() else {
                return Err(None);
            };
            if self.due.get(&key) != Some(&(at, class)) {
                continue; // stale: moved earlier, or to the other class
            }
            if at > now {
                self.heap_of(class).push(Reverse((at, sequence, key)));
                return Err(Some(at));
            }
            if self.in_flight.contains(&key) {
                deferred.push((class, Reverse((at, sequence, key))));
                continue;
            }
            return Ok(Reverse((at, sequence, key)));
        }
    }
}

/// Exponential backoff for the `failures`-th consecutive failure: 1 s doubling to 5 min, with
/// up to 10 % jitter (from `seed`) so that failures of many keys do not retry in lockstep.
pub fn backoff(failures: u32, seed: u64) -> Duration {
    let base = Duration::from_secs(1)
        .saturating_mul(1 << failures.min(9))
        .min(Duration::from_secs(300));
    let jitter = (seed % 1000) as f64 / 10_000.0;
    base.mul_f64(1.0 + jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn keys_are_deduplicated_and_come_due_in_order() {
        let queue = WorkQueue::default();
        queue.add("b", Duration::from_secs(2));
        queue.add("a", Duration::from_secs(5));
        queue.add("a", Duration::from_secs(1)); // earlier wins
        queue.add("b", Duration::from_secs(9)); // later loses
        assert_eq!(queue.len(), 2);
        let start = Instant::now();
        assert_eq!(queue.next().await, Some("a"));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(queue.next().await, Some("b"));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn continuing_and_fresh_keys_take_turns_each_in_due_order() {
        let queue = WorkQueue::default();
        // A burst of first passes, and two Manifests whose rollouts are looked at again.
        for key in ["f1", "f2", "f3", "f4"] {
            queue.add(key, Duration::ZERO);
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        queue.add_as("c2", Duration::from_millis(1), Class::Continuing);
        queue.add_as("c1", Duration::ZERO, Class::Continuing);
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut order = Vec::new();
        while let Ok(Some(key)) = tokio::time::timeout(Duration::from_secs(1), queue.next()).await {
            order.push(key);
            queue.done(&key);
        }
        // Not behind every first pass (FIFO by due time would give f1 f2 f3 f4 c1 c2), and the
        // first passes get every other worker.
        assert_eq!(order, ["f1", "c1", "f2", "c2", "f3", "f4"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_keeps_the_class_of_its_earliest_time() {
        let queue = WorkQueue::default();
        queue.add("f", Duration::ZERO);
        queue.add_as("k", Duration::from_secs(5), Class::Continuing);
        // A change of k now: fresh work, due now.
        queue.add("k", Duration::ZERO);
        // A later continuing request does not move it.
        queue.add_as("k", Duration::from_secs(9), Class::Continuing);
        queue.add_as("c", Duration::ZERO, Class::Continuing);
        let mut order = Vec::new();
        for _ in 0..3 {
            let key = queue.next().await.unwrap();
            order.push(key);
            queue.done(&key);
        }
        // f (fresh), c (continuing's turn), k (fresh, its earliest time's class).
        assert_eq!(order, ["f", "c", "k"]);
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_in_flight_is_not_handed_out_twice() {
        let queue = std::sync::Arc::new(WorkQueue::default());
        queue.add("a", Duration::ZERO);
        assert_eq!(queue.next().await, Some("a"));
        queue.add("a", Duration::ZERO); // an event arrives while "a" is being worked on
        queue.add("b", Duration::from_secs(1));
        let start = Instant::now();
        assert_eq!(queue.next().await, Some("b"), "a waits for its worker");
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        let waiter = tokio::spawn({
            let queue = queue.clone();
            async move { queue.next().await }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!waiter.is_finished());
        queue.done(&"a");
        assert_eq!(waiter.await.unwrap(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_metrics_count_due_scheduled_and_in_flight_apart() {
        let metrics = QueueMetrics::default();
        let queue = WorkQueue::new(metrics.clone());
        queue.add("a", Duration::ZERO);
        queue.add("b", Duration::from_secs(1));
        assert_eq!((metrics.counts.get(), metrics.in_flight.get()), ((1, 1), 0));
        let key = queue.next().await.unwrap();
        assert_eq!((metrics.counts.get(), metrics.in_flight.get()), ((0, 1), 1));
        queue.done(&key);
        assert_eq!((metrics.counts.get(), metrics.in_flight.get()), ((0, 1), 0));
        // Nothing happens to the queue; time alone makes b due.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(metrics.counts.get(), (1, 0));
        drop(queue);
        assert_eq!(metrics.counts.get(), (0, 0), "no queue: nothing counted");
    }

    #[tokio::test(start_paused = true)]
    async fn depth_counts_only_due_keys_and_scheduled_ones_are_reported_apart() {
        let queue = WorkQueue::default();
        // An idle replica: every Manifest Ready, each with its re-check an hour away.
        for (shard, name, minutes) in [(1, "a", 60), (1, "b", 30), (2, "c", 45)] {
            queue.add(Sharded(shard, name), Duration::from_secs(minutes * 60));
        }
        let idle = queue.snapshot();
        assert_eq!(
            (idle.depth, idle.in_flight, idle.scheduled),
            (0, 0, 3),
            "{idle:?}"
        );
        assert_eq!(idle.next_due_in_seconds, Some(1800.0));
        assert_eq!(idle.shards[&1].next_due_in_seconds, Some(1800.0));
        assert_eq!((idle.shards[&2].depth, idle.shards[&2].scheduled), (0, 1));
        // An event makes one due now, a second one runs: depth 1, in flight 1.
        queue.add(Sharded(2, "d"), Duration::ZERO);
        queue.add(Sharded(2, "e"), Duration::ZERO);
        assert_eq!(queue.next().await, Some(Sharded(2, "d")));
        tokio::time::advance(Duration::from_secs(2)).await;
        let busy = queue.snapshot();
        assert_eq!(
            (busy.depth, busy.in_flight, busy.scheduled),
            (1, 1, 3),
            "{busy:?}"
        );
        assert_eq!(busy.shards[&2].oldest_wait_seconds, 2.0);
        assert_eq!(busy.next_due_in_seconds, Some(1798.0));
        // Half an hour later b is due too, and waits like any other due key.
        tokio::time::advance(Duration::from_secs(1800)).await;
        let later = queue.snapshot();
        assert_eq!((later.depth, later.scheduled), (2, 2), "{later:?}");
        assert_eq!(later.shards[&1].depth, 1);
        assert_eq!(later.shards[&1].oldest_wait_seconds, 2.0);
        assert_eq!(later.next_due_in_seconds, Some(898.0));
        assert_eq!(queue.len(), 4, "len counts due and scheduled");
    }

    #[tokio::test(start_paused = true)]
    async fn close_ends_waiting() {
        let queue = std::sync::Arc::new(WorkQueue::<&str>::default());
        let waiter = tokio::spawn({
            let queue = queue.clone();
            async move { queue.next().await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiter.is_finished());
        queue.close();
        assert_eq!(waiter.await.unwrap(), None);
    }

    #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    struct Sharded(u32, &'static str);

    impl QueueKey for Sharded {
        fn shard(&self) -> u32 {
            self.0
        }
    }

    #[tokio::test(start_paused = true)]
    async fn depth_is_exact_per_shard_and_a_shard_can_be_dropped() {
        let queue = WorkQueue::default();
        queue.add(Sharded(1, "a"), Duration::ZERO);
        queue.add(Sharded(1, "b"), Duration::from_secs(10));
        queue.add(Sharded(2, "c"), Duration::ZERO);
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(queue.next().await, Some(Sharded(1, "a")));
        let snapshot = queue.snapshot();
        assert_eq!(
            (snapshot.depth, snapshot.in_flight, snapshot.scheduled),
            (1, 1, 1)
        );
        assert_eq!(
            snapshot.shards[&1],
            ShardQueue {
                depth: 0, // b is not due yet
                in_flight: 1,
                scheduled: 1,
                oldest_wait_seconds: 0.0,
                next_due_in_seconds: Some(7.0),
            }
        );
        assert_eq!(snapshot.shards[&2].oldest_wait_seconds, 3.0);
        assert_eq!(queue.in_flight_in(1), 1);
        assert_eq!(queue.in_flight_in(2), 0);

        // Shard 1 is handed over: its queued keys go, the one in flight finishes.
        assert_eq!(queue.retain_shards(|shard| shard != 1), 1);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.next().await, Some(Sharded(2, "c")));
        tokio::time::advance(Duration::from_secs(60)).await;
        let waiter = tokio::spawn({
            let queue = std::sync::Arc::new(queue);
            async move { tokio::time::timeout(Duration::from_secs(30), queue.next()).await }
        });
        assert!(
            waiter.await.unwrap().is_err(),
            "b was dropped with its shard"
        );
    }

    #[test]
    fn backoff_doubles_to_a_cap_with_bounded_jitter() {
        assert_eq!(backoff(0, 0), Duration::from_secs(1));
        assert_eq!(backoff(3, 0), Duration::from_secs(8));
        assert_eq!(backoff(30, 0), Duration::from_secs(300));
        assert!(
            backoff(3, 999) > Duration::from_secs(8)
                && backoff(3, 999) < Duration::from_secs_f64(8.8)
        );
    }
}
