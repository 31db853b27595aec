//! The load generator: creates, updates and deletes Manifests at given rates (open loop: a
//! slow API server delays operations, it does not lower the offered rate until `MAX_IN_FLIGHT`
//! requests are outstanding), and a watch that records when each operation's effect is seen:
//! Ready at the generation written (creates, updates), or the Manifest gone (deletes).
//!
//! [`Tracker`] is the bookkeeping, pure and unit-tested; [`Load`] is the I/O around it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, oneshot};

/// Most requests of the load generator outstanding at once.
const MAX_IN_FLIGHT: usize = 64;

/// What an operation waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Op {
    Create,
    Update,
    Delete,
}

/// An operation whose effect was seen: when it was sent (seconds since the load started) and
/// how long its effect took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Done {
    pub op: Op,
    pub sent: f64,
    pub seconds: f64,
}

#[derive(Clone, Debug)]
struct Pending {
    op: Op,
    sent: Instant,
    /// The generation to reach (unknown until the write's answer arrives).
    generation: Option<i64>,
}

/// The bookkeeping of sent operations and observed states.
#[derive(Debug)]
pub struct Tracker {
    start: Instant,
    pending: HashMap<String, Pending>,
    /// The latest Ready generation seen per Manifest, and when it was first seen.
    ready: HashMap<String, (i64, Instant)>,
    /// Manifests seen deleted, and when.
    gone: HashMap<String, Instant>,
    pub done: Vec<Done>,
    /// Operations sent, by kind.
    pub sent: BTreeMap<Op, u64>,
    /// Failed requests (counted in `sent` too; nothing waited for), with the first few
    /// messages.
    pub failed: u64,
    /// Operations replaced by a newer one on the same Manifest before their effect was seen
    /// (their latency is unknown; the newer one's counts).
    pub superseded: u64,
    pub failures: Vec<String>,
}

impl Tracker {
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            pending: HashMap::new(),
            ready: HashMap::new(),
            gone: HashMap::new(),
            done: Vec::new(),
            sent: BTreeMap::new(),
            failed: 0,
            superseded: 0,
            failures: Vec::new(),
        }
    }

    /// An operation on `name` is about to be sent (it replaces an unfinished one: the newer
    /// write supersedes, and the older one's latency is not known).
    pub fn sending(&mut self, name: &str, op: Op, now: Instant) {
        *self.sent.entry(op).or_default() += 1;
        if op == Op::Create {
            self.gone.remove(name);
        }
        if self.pending.contains_key(name) {
            self.superseded += 1;
        }
        self.pending.insert(
            name.to_owned(),
            Pending {
                op,
                sent: now,
                generation: None,
            },
        );
    }

    /// The API server answered a create or update with `generation`.
    pub fn answered(&mut self, name: &str, generation: i64) {
        let Some(pending) = self.pending.get_mut(name) else {
            return;
        };
        pending.generation = Some(generation);
        if let Some((seen, at)) = self.ready.get(name).copied()
            && seen >= generation
        {
            self.complete(name, at);
        }
    }

    /// A delete was answered: the Manifest may still exist (finalizer) until seen gone.
    pub fn delete_answered(&mut self, name: &str) {
        if let Some(at) = self.gone.get(name).copied() {
            self.complete(name, at);
        }
    }

    /// The request failed: nothing to wait for.
    pub fn failed(&mut self, name: &str, op: Op, message: String) {
        self.failed += 1;
        if self.failures.len() < 10 {
            self.failures.push(format!("{op:?} {name}: {message}"));
        }
        self.pending.remove(name);
    }

    /// The watch saw `name` Ready at `generation`.
    pub fn seen_ready(&mut self, name: &str, generation: i64, now: Instant) {
        let entry = self
            .ready
            .entry(name.to_owned())
            .or_insert((generation, now));
        if entry.0 < generation {
            *entry = (generation, now);
        }
        if let Some(p) = self.pending.get(name)
            && p.op != Op::Delete
            && p.generation.is_some_and(|g| g <= generation)
        {
            self.complete(name, now);
        }
    }

    /// The watch saw `name` deleted.
    pub fn seen_gone(&mut self, name: &str, now: Instant) {
        self.ready.remove(name);
        self.gone.insert(name.to_owned(), now);
        if self.pending.get(name).is_some_and(|p| p.op == Op::Delete) {
            self.complete(name, now);
        }
    }

    /// The watch listed the Manifests again (after its connection was lost: an API server
    /// restart) and `listed` are all that exist: a delete sent before the list began
    /// (`listing_since`) whose Manifest is not among them is done — its delete event fell into
    /// the gap, and a relist shows no deletions.
    pub fn relisted(&mut self, listed: &BTreeSet<String>, listing_since: Instant, now: Instant) {
        let gone: Vec<String> = self
            .pending
            .iter()
            .filter(|(name, p)| {
                p.op == Op::Delete && p.sent < listing_since && !listed.contains(*name)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            self.seen_gone(&name, now);
        }
    }

    fn complete(&mut self, name: &str, at: Instant) {
        if let Some(p) = self.pending.remove(name) {
            self.done.push(Done {
                op: p.op,
                sent: p.sent.duration_since(self.start).as_secs_f64(),
                seconds: at.saturating_duration_since(p.sent).as_secs_f64(),
            });
        }
    }

    /// Operations still waiting for their effect: (name, op, seconds since sent).
    pub fn outstanding(&self, now: Instant) -> Vec<(String, Op, f64)> {
        let mut list: Vec<_> = self
            .pending
            .iter()
            .map(|(n, p)| (n.clone(), p.op, now.duration_since(p.sent).as_secs_f64()))
            .collect();
        list.sort_by(|a, b| b.2.total_cmp(&a.2));
        list
    }

    /// Creates and updates sent in `[from, to)` (seconds since start): latencies of those whose
    /// effect was seen, and for those still outstanding their age so far (a lower bound).
    pub fn convergence_in(&self, from: f64, to: f64, now: Instant) -> Vec<f64> {
        let mut values: Vec<f64> = self
            .done
            .iter()
            .filter(|d| d.op != Op::Delete && d.sent >= from && d.sent < to)
            .map(|d| d.seconds)
            .collect();
        for p in self.pending.values().filter(|p| p.op != Op::Delete) {
            let sent = p.sent.duration_since(self.start).as_secs_f64();
            if sent >= from && sent < to {
                values.push(now.duration_since(p.sent).as_secs_f64());
            }
        }
        values
    }
}

/// What the Manifests look like.
#[derive(Clone, Debug)]
pub struct ManifestShape {
    /// `spec.chart` (e.g. `{"path": "loadtest/charts/podinfo-like"}`).
    pub chart: Value,
    /// `spec.interval` (drift re-check).
    pub interval: String,
    /// Labels every Manifest carries (the fleet's selector, the run).
    pub labels: BTreeMap<String, String>,
    /// Remote targets (the `remote` scenario): none installs on the fleet's own cluster.
    pub remote: Option<RemoteShape>,
}

/// The name of remote target `index` (`t-00042`): its namespace on its API server, its Secret's
/// name, and the namespace its modules are installed into.
pub fn target_name(index: usize) -> String {
    format!("t-{index:05}")
}

/// Where the Manifests of the `remote` scenario go: the n-th Manifest created (from 1) to
/// target `(n - 1) / modules_per_target`, through its kubeconfig Secret, into the namespace of
/// the same name ([`target_name`]).
#[derive(Clone, Copy, Debug)]
pub struct RemoteShape {
    pub modules_per_target: usize,
}

impl RemoteShape {
    /// The target of the Manifest named `name` (a prefix and its number).
    pub fn target_of(self, name: &str) -> Option<String> {
        let digits = name.trim_start_matches(|c: char| !c.is_ascii_digit());
        let n: usize = digits.parse().ok()?;
        let index = n.checked_sub(1)? / self.modules_per_target.max(1);
        Some(target_name(index))
    }
}

/// Sends operations and watches their effects in one namespace.
#[derive(Clone)]
pub struct Load {
    api: Api<Manifest>,
    shape: ManifestShape,
    pub tracker: Arc<Mutex<Tracker>>,
    permits: Arc<Semaphore>,
    /// Live Manifests in update order (least recently written first).
    live: Arc<Mutex<VecDeque<String>>>,
    next: Arc<Mutex<u64>>,
    revision: Arc<Mutex<u64>>,
    prefix: String,
    /// Set to end [`Load::run`] early.
    stopped: Arc<AtomicBool>,
}

impl Load {
    pub fn new(client: Client, namespace: &str, prefix: &str, shape: ManifestShape) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            shape,
            tracker: Arc::new(Mutex::new(Tracker::new(Instant::now()))),
            permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            live: Arc::new(Mutex::new(VecDeque::new())),
            next: Arc::new(Mutex::new(0)),
            revision: Arc::new(Mutex::new(0)),
            prefix: prefix.to_owned(),
            stopped: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn api(&self) -> &Api<Manifest> {
        &self.api
    }

    pub fn start(&self) -> Instant {
        self.tracker.lock().unwrap().start
    }

    /// Seconds since the load started.
    pub fn elapsed(&self) -> f64 {
        self.start().elapsed().as_secs_f64()
    }

    /// Operations sent so far.
    pub fn sent(&self) -> u64 {
        self.tracker.lock().unwrap().sent.values().sum()
    }

    pub fn live_count(&self) -> usize {
        self.live.lock().unwrap().len()
    }

    /// The label selector of this load's Manifests.
    /// The UIDs of the load's Manifests that exist now.
    pub async fn uids(&self) -> kube::Result<BTreeSet<String>> {
        let params = ListParams::default().labels(&self.selector());
        let manifests = self.api.list(&params).await?;
        Ok(manifests.items.iter().filter_map(|m| m.uid()).collect())
    }

    pub fn selector(&self) -> String {
        self.shape
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Watches the Manifests and feeds the tracker until the task is aborted.
    pub fn spawn_watch(&self) -> tokio::task::JoinHandle<()> {
        self.watch_task(None)
    }

    /// [`Load::spawn_watch`], returned once its first list is in the tracker (or after two
    /// minutes): a Ready seen only when a long list ends would be late.
    pub async fn spawn_watch_listed(&self) -> tokio::task::JoinHandle<()> {
        let (listed, done) = tokio::sync::oneshot::channel();
        let watch = self.watch_task(Some(listed));
        let _ = tokio::time::timeout(Duration::from_secs(120), done).await;
        watch
    }

    fn watch_task(&self, mut listed: Option<oneshot::Sender<()>>) -> tokio::task::JoinHandle<()> {
        let api = self.api.clone();
        let tracker = self.tracker.clone();
        let config = watcher::Config::default().labels(&self.selector());
        tokio::spawn(async move {
            let mut stream = watcher(api, config).default_backoff().boxed();
            // The names of the list in progress, and when it began.
            let mut listing: (BTreeSet<String>, Instant) = (BTreeSet::new(), Instant::now());
            while let Some(event) = stream.next().await {
                let now = Instant::now();
                let Ok(event) = event else {
                    continue; // the watcher retries by itself after a backoff
                };
                let mut tracker = tracker.lock().unwrap();
                match event {
                    watcher::Event::Apply(m) | watcher::Event::InitApply(m) => {
                        if let Some(generation) = ready_generation(&m) {
                            tracker.seen_ready(&m.name_any(), generation, now);
                        }
                        listing.0.insert(m.name_any());
                    }
                    watcher::Event::Delete(m) => tracker.seen_gone(&m.name_any(), now),
                    watcher::Event::InitDone => {
                        tracker.relisted(&std::mem::take(&mut listing.0), listing.1, now);
                        if let Some(listed) = listed.take() {
                            let _ = listed.send(());
                        }
                    }
                    watcher::Event::Init => listing = (BTreeSet::new(), now),
                }
            }
        })
    }

    fn manifest(&self, name: &str, revision: u64) -> Manifest {
        let mut value = json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": name, "labels": self.shape.labels},
            "spec": {
                "module": name,
                "chart": self.shape.chart,
                "values": {"revision": revision},
                "interval": self.shape.interval,
            }
        });
        if let Some(target) = self.shape.remote.and_then(|r| r.target_of(name)) {
            value["spec"]["target"] = json!({"kubeconfigSecretRef": {"name": target}});
            value["spec"]["targetNamespace"] = json!(target);
        }
        serde_json::from_value(value).expect("a valid Manifest")
    }

    /// Creates Manifest `name` now, untracked: nothing waits for it, no latency is counted (a
    /// Manifest expected never to be Ready, e.g. on a blackholed target).
    pub async fn create_untracked(&self, name: &str) -> anyhow::Result<()> {
        self.api
            .create(&PostParams::default(), &self.manifest(name, 0))
            .await?;
        Ok(())
    }

    /// Creates one new Manifest (in the background).
    pub async fn create(&self) {
        let name = {
            let mut next = self.next.lock().unwrap();
            *next += 1;
            format!("{}{:06}", self.prefix, *next)
        };
        self.in_background(&name.clone(), Op::Create, move |this| async move {
            let manifest = this.manifest(&name, 0);
            match this.api.create(&PostParams::default(), &manifest).await {
                Ok(created) => this.answered(name, &created),
                Err(e) => this
                    .tracker
                    .lock()
                    .unwrap()
                    .failed(&name, Op::Create, e.to_string()),
            }
        })
        .await;
    }

    /// Marks `op` on `name` sent, waits for a slot and sends it in the background, holding the
    /// slot until `send` ends. The latency runs from when the operation was due, including any
    /// wait for a slot.
    async fn in_background<F, Work>(&self, name: &str, op: Op, send: F)
    where
        F: FnOnce(Load) -> Work,
        Work: Future<Output = ()> + Send + 'static,
    {
        self.tracker
            .lock()
            .unwrap()
            .sending(name, op, Instant::now());
        let permit = self.permits.clone().acquire_owned().await.expect("open");
        let work = send(self.clone());
        tokio::spawn(async move {
            work.await;
            drop(permit);
        });
    }

    /// An answer to a create or an update: its generation is awaited; the Manifest is live.
    fn answered(&self, name: String, answer: &Manifest) {
        let generation = answer.metadata.generation.unwrap_or(1);
        self.tracker.lock().unwrap().answered(&name, generation);
        self.live.lock().unwrap().push_back(name);
    }

    /// Changes the values of the least recently written Manifest (a new generation).
    pub async fn update(&self) {
        let Some(name) = self.live.lock().unwrap().pop_front() else {
            return;
        };
        let revision = {
            let mut r = self.revision.lock().unwrap();
            *r += 1;
            *r
        };
        self.in_background(&name.clone(), Op::Update, move |this| async move {
            let patch = json!({"spec": {"values": {"revision": revision}}});
            let params = PatchParams::default();
            match this.api.patch(&name, &params, &Patch::Merge(&patch)).await {
                Ok(m) => this.answered(name, &m),
                Err(e) => {
                    this.tracker
                        .lock()
                        .unwrap()
                        .failed(&name, Op::Update, e.to_string());
                    this.live.lock().unwrap().push_back(name);
                }
            }
        })
        .await;
    }

    /// Deletes the least recently written live Manifest.
    pub async fn delete(&self) {
        let Some(name) = self.live.lock().unwrap().pop_front() else {
            return;
        };
        self.in_background(&name.clone(), Op::Delete, move |this| async move {
            match this.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => this.tracker.lock().unwrap().delete_answered(&name),
                Err(e) => {
                    let gone = matches!(&e, kube::Error::Api(s) if s.code == 404);
                    this.tracker
                        .lock()
                        .unwrap()
                        .failed(&name, Op::Delete, e.to_string());
                    if !gone {
                        this.live.lock().unwrap().push_back(name);
                    }
                }
            }
        })
        .await;
    }

    /// Ends a running [`Load::run`] at its next tick (and every later one until
    /// [`Load::resume`]).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    pub fn resume(&self) {
        self.stopped.store(false, Ordering::SeqCst);
    }

    /// Runs the generator for `duration` (or until [`Load::stop`]): creates at `create_rate`/s, deletes at
    /// `delete_rate`/s, and updates so that every live Manifest is written once per
    /// `update_period` (rate = live / period).
    pub async fn run(&self, rates: Rates, duration: Duration) {
        let tick = Duration::from_millis(20);
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut creates, mut updates, mut deletes) = (0.0f64, 0.0f64, 0.0f64);
        let end = Instant::now() + duration;
        let mut last = Instant::now();
        while Instant::now() < end && !self.stopped.load(Ordering::SeqCst) {
            interval.tick().await;
            let now = Instant::now();
            let dt = now.duration_since(last).as_secs_f64();
            last = now;
            creates += rates.create * dt;
            deletes += rates.delete * dt;
            if let Some(period) = rates.update_period {
                updates += self.live_count() as f64 / period.as_secs_f64() * dt;
            }
            while creates >= 1.0 {
                creates -= 1.0;
                self.create().await;
            }
            while deletes >= 1.0 {
                deletes -= 1.0;
                self.delete().await;
            }
            while updates >= 1.0 {
                updates -= 1.0;
                self.update().await;
            }
        }
    }

    /// Creates `count` Manifests as fast as the in-flight limit allows.
    pub async fn burst(&self, count: usize) {
        for _ in 0..count {
            self.create().await;
        }
    }

    /// Waits until every operation's effect was seen (or `limit` passes); returns the
    /// outstanding ones.
    pub async fn settle(&self, limit: Duration) -> Vec<(String, Op, f64)> {
        let deadline = Instant::now() + limit;
        loop {
            let in_flight = MAX_IN_FLIGHT - self.permits.available_permits();
            let outstanding = self.tracker.lock().unwrap().outstanding(Instant::now());
            if in_flight == 0 && outstanding.is_empty() {
                return outstanding;
            }
            if Instant::now() > deadline {
                return outstanding;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Manifests not in their expected state now: existing ones not Ready at their generation
    /// (name, state, observed/generation); deletes are covered by [`Tracker::outstanding`].
    pub async fn not_ready(&self) -> anyhow::Result<Vec<String>> {
        let list = self
            .api
            .list(&ListParams::default().labels(&self.selector()))
            .await?;
        Ok(list
            .items
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter(|m| ready_generation(m) != m.metadata.generation)
            .map(|m| {
                let status = m.status.clone().unwrap_or_default();
                format!(
                    "{} ({:?}, observed generation {:?} of {:?}{})",
                    m.name_any(),
                    status.state,
                    status.observed_generation,
                    m.metadata.generation,
                    status
                        .conditions
                        .iter()
                        .find(|c| c.type_ == "Ready")
                        .map(|c| format!(": {}", c.message))
                        .unwrap_or_default()
                )
            })
            .collect())
    }
}

/// The generation a Manifest is Ready at, if it is.
fn ready_generation(m: &Manifest) -> Option<i64> {
    let status = m.status.as_ref()?;
    (status.state == Some(State::Ready))
        .then_some(status.observed_generation)
        .flatten()
}

/// Offered rates.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    pub create: f64,
    pub delete: f64,
    pub update_period: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, s: f64) -> Instant {
        start + Duration::from_secs_f64(s)
    }

    #[test]
    fn a_create_completes_when_ready_at_its_generation_is_seen() {
        let t0 = Instant::now();
        let mut t = Tracker::new(t0);
        t.sending("a", Op::Create, at(t0, 1.0));
        t.answered("a", 1);
        t.seen_ready("a", 1, at(t0, 3.5));
        assert_eq!(
            t.done,
            vec![Done {
                op: Op::Create,
                sent: 1.0,
                seconds: 2.5
            }]
        );
        assert!(t.outstanding(at(t0, 4.0)).is_empty());
    }

    #[test]
    fn a_delete_missing_from_a_relist_is_done_unless_sent_after_the_list_began() {
        let t0 = Instant::now();
        let mut t = Tracker::new(t0);
        for name in ["gone", "still-there", "late"] {
            t.sending(name, Op::Delete, at(t0, 1.0));
            t.delete_answered(name);
        }
        t.sending("late", Op::Delete, at(t0, 6.0));
        let listed = BTreeSet::from(["still-there".to_owned()]);
        t.relisted(&listed, at(t0, 5.0), at(t0, 7.0));
        assert_eq!(t.done.len(), 1, "{:?}", t.done);
        assert_eq!(t.done[0].seconds, 6.0);
        let left: Vec<String> = t
            .outstanding(at(t0, 8.0))
            .into_iter()
            .map(|o| o.0)
            .collect();
        assert_eq!(left.len(), 2);
        assert!(left.contains(&"still-there".to_owned()) && left.contains(&"late".to_owned()));
    }

    #[test]
    fn ready_seen_before_the_answer_arrives_still_counts() {
        let t0 = Instant::now();
        let mut t = Tracker::new(t0);
        t.sending("a", Op::Update, at(t0, 1.0));
        t.seen_ready("a", 2, at(t0, 1.5));
        assert!(t.done.is_empty(), "generation not known yet");
        t.answered("a", 2);
        assert_eq!(t.done.len(), 1);
        assert!((t.done[0].seconds - 0.5).abs() < 1e-9);
    }

    #[test]
    fn an_older_ready_generation_does_not_complete_an_update() {
        let t0 = Instant::now();
        let mut t = Tracker::new(t0);
        t.seen_ready("a", 1, at(t0, 0.5));
        t.sending("a", Op::Update, at(t0, 1.0));
        t.answered("a", 2);
        t.seen_ready("a", 1, at(t0, 2.0));
        assert!(t.done.is_empty());
        let outstanding = t.outstanding(at(t0, 5.0));
        assert_eq!(outstanding.len(), 1);
        assert_eq!(outstanding[0].2, 4.0);
        // Censored: the outstanding update counts with its age so far.
        assert_eq!(t.convergence_in(0.0, 2.0, at(t0, 5.0)), vec![4.0]);
        t.seen_ready("a", 2, at(t0, 6.0));
        assert_eq!(t.done[0].seconds, 5.0);
    }

    #[test]
    fn deletes_complete_when_the_manifest_is_gone_and_failures_are_not_waited_for() {
        let t0 = Instant::now();
        let mut t = Tracker::new(t0);
        t.sending("a", Op::Delete, at(t0, 1.0));
        t.delete_answered("a");
        assert!(t.done.is_empty(), "a finalizer keeps it");
        t.seen_gone("a", at(t0, 2.0));
        assert_eq!(t.done[0].op, Op::Delete);
        // Gone before the answer arrived.
        t.sending("b", Op::Delete, at(t0, 1.0));
        t.seen_gone("b", at(t0, 1.2));
        assert_eq!(t.done.len(), 2);
        t.sending("c", Op::Create, at(t0, 1.0));
        t.failed("c", Op::Create, "409".into());
        assert!(t.outstanding(at(t0, 9.0)).is_empty());
        assert_eq!(t.sent[&Op::Create], 1);
        assert_eq!(t.failed, 1);
        assert_eq!(t.convergence_in(0.0, 10.0, at(t0, 9.0)), Vec::<f64>::new());
    }
}
