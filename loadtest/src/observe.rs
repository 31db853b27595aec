//! What the harness watches while the load runs, independently of the fleet's own view: shard
//! ownership from the Leases (judged as the replicas judge a member: dead when its Lease has
//! been unchanged for a lease duration on the observer's clock), and periodic samples of the
//! replicas' metrics and resource usage.
//!
//! [`Ownership`] is pure; [`Sampler`] polls the API server and the replicas.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::fleet::Probe;
use crate::load::Load;
use crate::measure::{self, PromSample};
use crate::results::Sample;

/// A shard Lease as observed: holder (None when empty).
pub type Holders = BTreeMap<u32, Option<String>>;

/// Shard ownership over time, from successive observations of the Leases.
#[derive(Debug)]
pub struct Ownership {
    lease_duration: Duration,
    /// Member → (its Lease's resourceVersion, when the harness first saw that version).
    members: BTreeMap<String, (String, Instant)>,
    /// Shard → since when it has been unowned (continuously).
    unowned_since: BTreeMap<u32, Instant>,
    /// Longest completed or ongoing unowned interval per shard, in seconds.
    pub longest_unowned: BTreeMap<u32, f64>,
    /// The holders at the latest observation.
    pub holders: Holders,
    /// Every holder a shard had while `record_moves` was on, in order of first appearance.
    pub holder_history: BTreeMap<u32, Vec<Option<String>>>,
    pub record_moves: bool,
    /// When the latest observation found every shard owned.
    pub all_owned_at: Option<Instant>,
}

impl Ownership {
    pub fn new(lease_duration: Duration) -> Self {
        Self {
            lease_duration,
            members: BTreeMap::new(),
            unowned_since: BTreeMap::new(),
            longest_unowned: BTreeMap::new(),
            holders: BTreeMap::new(),
            holder_history: BTreeMap::new(),
            record_moves: false,
            all_owned_at: None,
        }
    }

    /// Feeds one observation: the member Leases as (member, resourceVersion) and the shard
    /// Leases' holders, at `now`.
    pub fn observe(&mut self, now: Instant, members: &[(String, String)], holders: Holders) {
        let present: BTreeSet<&String> = members.iter().map(|(m, _)| m).collect();
        self.members.retain(|m, _| present.contains(m));
        for (member, version) in members {
            match self.members.get(member) {
                Some((v, _)) if v == version => {}
                _ => {
                    self.members.insert(member.clone(), (version.clone(), now));
                }
            }
        }
        let live: BTreeSet<String> = self
            .members
            .iter()
            .filter(|(_, (_, since))| now.duration_since(*since) < self.lease_duration)
            .map(|(m, _)| m.clone())
            .collect();
        let mut all_owned = true;
        for (shard, holder) in &holders {
            let owned = holder.as_ref().is_some_and(|h| live.contains(h));
            if owned {
                if let Some(since) = self.unowned_since.remove(shard) {
                    self.note_unowned(*shard, now.duration_since(since));
                }
            } else {
                all_owned = false;
                let since = *self.unowned_since.entry(*shard).or_insert(now);
                self.note_unowned(*shard, now.duration_since(since));
            }
            if self.record_moves {
                let history = self.holder_history.entry(*shard).or_default();
                if holder.is_some() && !history.contains(holder) {
                    history.push(holder.clone());
                }
            }
        }
        if all_owned && !holders.is_empty() {
            self.all_owned_at.get_or_insert(now);
        } else {
            self.all_owned_at = None;
        }
        self.holders = holders;
    }

    fn note_unowned(&mut self, shard: u32, for_: Duration) {
        let longest = self.longest_unowned.entry(shard).or_insert(0.0);
        *longest = longest.max(for_.as_secs_f64());
    }

    /// Shards unowned at the latest observation.
    pub fn unowned_now(&self) -> usize {
        self.unowned_since.len()
    }

    /// Starts recording every holder of every shard, from the current holders.
    pub fn start_recording_moves(&mut self) {
        self.record_moves = true;
        self.holder_history = self
            .holders
            .iter()
            .map(|(k, h)| (*k, h.iter().cloned().map(Some).collect()))
            .collect();
    }

    /// Stops recording; returns the shards that had more than one holder meanwhile.
    pub fn stop_recording_moves(&mut self) -> BTreeMap<u32, Vec<Option<String>>> {
        self.record_moves = false;
        std::mem::take(&mut self.holder_history)
            .into_iter()
            .filter(|(_, holders)| holders.len() > 1)
            .collect()
    }
}

/// Reads the fleet's member and shard Leases: ((member, resourceVersion)…, holders).
pub async fn read_leases(fleet: &Probe) -> anyhow::Result<(Vec<(String, String)>, Holders)> {
    let leases = Api::<Lease>::namespaced(fleet.client.clone(), &fleet.lease_namespace)
        .list(&ListParams::default().labels(&format!("modulemanager.io/fleet={}", fleet.name)))
        .await?;
    let member_prefix = format!("{}-member-", fleet.name);
    let shard_prefix = format!("{}-shard-", fleet.name);
    let mut members = Vec::new();
    let mut holders = BTreeMap::new();
    for lease in leases.items {
        let name = lease.name_any();
        if let Some(member) = name.strip_prefix(&member_prefix) {
            members.push((
                member.to_owned(),
                lease.resource_version().unwrap_or_default(),
            ));
        } else if let Some(shard) = name
            .strip_prefix(&shard_prefix)
            .and_then(|s| s.parse().ok())
        {
            let holder = lease
                .spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty());
            holders.insert(shard, holder);
        }
    }
    Ok((members, holders))
}

/// Per replica, the scrape and usage at one moment.
#[derive(Clone, Debug, Default)]
pub struct ReplicaReading {
    pub samples: Vec<PromSample>,
}

/// The replicas' API requests (every verb, resource and target).
pub const API_REQUESTS: &str = "module_manager_api_requests_total";
/// Counters summed over label sets whose increase is tracked.
pub const COUNTERS: &[&str] = &["module_manager_reconcile_passes_total", API_REQUESTS];
/// Histograms whose increase is tracked.
pub const HISTOGRAMS: &[&str] = &[
    "module_manager_queue_wait_seconds",
    "module_manager_fleet_handover_gap_seconds",
];

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The increase of one replica's [`COUNTERS`] and [`HISTOGRAMS`] from scrape to scrape. A
/// restart (a new `process_start_time_seconds`, or a count going down) starts the process's
/// counts from zero, so what the new process counted is added whole; what the old one counted
/// after its last scrape is lost (at most one sample interval).
#[derive(Clone, Debug, Default)]
pub struct Accumulated {
    previous: Option<(Option<f64>, Vec<PromSample>)>,
    pub counters: BTreeMap<String, f64>,
    pub histograms: BTreeMap<String, Vec<(f64, f64)>>,
}

impl Accumulated {
    /// Adds the increase since the previous scrape. The first scrape of a process started
    /// before `window_start` (Unix seconds) is the baseline; of one started after it, all of
    /// it counts.
    pub fn add(&mut self, samples: &[PromSample], window_start: f64) {
        let start =
            Some(measure::sum(samples, "process_start_time_seconds", &[])).filter(|s| *s > 0.0);
        let empty = Vec::new();
        let previous = match &self.previous {
            Some((previous_start, previous))
                if !restarted(start, *previous_start) && !went_down(previous, samples) =>
            {
                Some(previous)
            }
            // A restart: the new process counted from zero.
            Some(_) => Some(&empty),
            // First sight: the baseline, unless the process started within the window.
            None if start.is_some_and(|s| s >= window_start) => Some(&empty),
            None => None,
        };
        if let Some(previous) = previous {
            for name in COUNTERS {
                let delta = measure::sum(samples, name, &[]) - measure::sum(previous, name, &[]);
                *self.counters.entry((*name).to_owned()).or_default() += delta.max(0.0);
            }
            for name in HISTOGRAMS {
                let delta = measure::histogram_delta(
                    &measure::histogram(previous, name),
                    &measure::histogram(samples, name),
                );
                let total = self.histograms.entry((*name).to_owned()).or_default();
                for (bound, count) in delta {
                    match total
                        .iter_mut()
                        .find(|(b, _)| b.to_bits() == bound.to_bits())
                    {
                        Some(slot) => slot.1 += count,
                        None => {
                            total.push((bound, count));
                            total.sort_by(|a, b| a.0.total_cmp(&b.0));
                        }
                    }
                }
            }
        }
        self.previous = Some((start, samples.to_vec()));
    }
}

/// Whether both scrapes carry a start time and they differ.
fn restarted(start: Option<f64>, previous: Option<f64>) -> bool {
    matches!((start, previous), (Some(a), Some(b)) if a != b)
}

/// Whether any tracked count is lower than before (the process restarted).
fn went_down(previous: &[PromSample], now: &[PromSample]) -> bool {
    COUNTERS
        .iter()
        .any(|name| measure::sum(now, name, &[]) < measure::sum(previous, name, &[]))
        || HISTOGRAMS.iter().any(|name| {
            let count = |samples: &[PromSample]| {
                measure::histogram(samples, name)
                    .last()
                    .map_or(0.0, |b| b.1)
            };
            count(now) < count(previous)
        })
}

/// Everything the sampler collected.
#[derive(Debug)]
pub struct Observed {
    pub ownership: Ownership,
    pub timeline: Vec<Sample>,
    /// The latest reading per replica name (gauges such as shards owned).
    pub latest: BTreeMap<String, ReplicaReading>,
    /// Per replica name, the increase of the tracked counters and histograms over the window,
    /// summed across process restarts.
    pub accumulated: BTreeMap<String, Accumulated>,
    /// Unix time the window began: a process started after it counts from zero.
    pub window_start_unix: f64,
    /// When the readings in `accumulated` arrived (seconds since the load started).
    pub scraped_at: f64,
    /// RSS samples per replica (MiB), for mean and max.
    pub rss_mib: BTreeMap<String, Vec<f64>>,
    /// CPU seconds consumed per replica over the window, summed across process restarts.
    pub cpu_seconds: BTreeMap<String, f64>,
    /// The latest CPU reading per replica (process total).
    pub last_cpu: BTreeMap<String, f64>,
    /// Events to attach to the next timeline sample.
    pub pending_events: Vec<String>,
}

impl Observed {
    fn new(lease: Duration) -> Self {
        Self {
            ownership: Ownership::new(lease),
            timeline: Vec::new(),
            latest: BTreeMap::new(),
            accumulated: BTreeMap::new(),
            window_start_unix: unix_now(),
            scraped_at: 0.0,
            rss_mib: BTreeMap::new(),
            cpu_seconds: BTreeMap::new(),
            last_cpu: BTreeMap::new(),
            pending_events: Vec::new(),
        }
    }
}

/// Polls the Leases, the replicas and the load generator every `interval`.
pub struct Sampler {
    pub observed: Arc<Mutex<Observed>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Sampler {
    pub fn spawn(fleet: Probe, load: Load, interval: Duration, lease: Duration) -> Self {
        let observed = Arc::new(Mutex::new(Observed::new(lease)));
        // Ownership is read on its own, often and never behind a scrape: a paused replica
        // does not answer its admin API, and an observer stuck waiting for it would miss
        // exactly the unowned interval the checker is for.
        let shared = observed.clone();
        let probe = fleet.clone();
        let every = interval.min(Duration::from_millis(500));
        let leases = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let read = tokio::time::timeout(Duration::from_secs(5), read_leases(&probe)).await;
                if let Ok(Ok((members, holders))) = read {
                    let now = Instant::now();
                    shared
                        .lock()
                        .unwrap()
                        .ownership
                        .observe(now, &members, holders);
                }
            }
        });
        let shared = observed.clone();
        let scrapes = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut previous: Option<(f64, u64, u64)> = None;
            loop {
                ticker.tick().await;
                let ordinals = fleet.ordinals().await.unwrap_or_default();
                let readings = futures::future::join_all(ordinals.iter().map(|ordinal| {
                    let fleet = &fleet;
                    async move {
                        let scrape =
                            tokio::time::timeout(Duration::from_secs(2), fleet.scrape(*ordinal))
                                .await;
                        let samples = match scrape {
                            Ok(Ok(text)) => Some(measure::parse_prometheus(&text)),
                            _ => None, // paused, starting or gone: no reading this time
                        };
                        let usage = fleet.usage(*ordinal, samples.as_deref());
                        (fleet.member(*ordinal), samples, usage)
                    }
                }))
                .await;
                let t = load.elapsed();
                let (sent, converged) = {
                    let tracker = load.tracker.lock().unwrap();
                    (
                        tracker.sent.values().sum::<u64>(),
                        tracker.done.len() as u64,
                    )
                };
                let mut observed = shared.lock().unwrap();
                let mut sample = Sample {
                    t,
                    manifests: load.live_count() as u64,
                    unowned_shards: observed.ownership.unowned_now() as u32,
                    events: std::mem::take(&mut observed.pending_events),
                    ..Default::default()
                };
                if let Some((t0, sent0, converged0)) = previous {
                    let dt = (t - t0).max(1e-3);
                    sample.operations_per_second = sent.saturating_sub(sent0) as f64 / dt;
                    sample.converged_per_second = converged.saturating_sub(converged0) as f64 / dt;
                }
                previous = Some((t, sent, converged));
                let dt = (t - observed.timeline.last().map_or(0.0, |s| s.t)).max(1e-3);
                for (member, samples, usage) in readings {
                    if let Some((cpu, rss)) = usage {
                        let mib = rss / (1024.0 * 1024.0);
                        sample.rss_mib.insert(member.clone(), mib);
                        observed
                            .rss_mib
                            .entry(member.clone())
                            .or_default()
                            .push(mib);
                        if let Some(before) = observed.last_cpu.insert(member.clone(), cpu) {
                            // A restarted process starts again from zero: count it from there.
                            let used = if cpu >= before { cpu - before } else { cpu };
                            *observed.cpu_seconds.entry(member.clone()).or_default() += used;
                            sample.cpu_cores.insert(member.clone(), used / dt);
                        }
                    }
                    let Some(samples) = samples else {
                        continue;
                    };
                    // Due and waiting (the backlog), not the re-checks scheduled for later.
                    sample.queue_depth += measure::sum(&samples, "module_manager_queue_due", &[]);
                    let window_start = observed.window_start_unix;
                    observed
                        .accumulated
                        .entry(member.clone())
                        .or_default()
                        .add(&samples, window_start);
                    observed.latest.insert(member, ReplicaReading { samples });
                }
                observed.scraped_at = t;
                observed.timeline.push(sample);
            }
        });
        Self {
            observed,
            tasks: vec![leases, scrapes],
        }
    }

    /// Attaches `event` to the next sample (and the charts).
    pub fn event(&self, event: impl Into<String>) {
        self.observed
            .lock()
            .unwrap()
            .pending_events
            .push(event.into());
    }

    pub fn stop(self) -> Observed {
        for task in &self.tasks {
            task.abort();
        }
        match Arc::try_unwrap(self.observed) {
            Ok(m) => m.into_inner().unwrap(),
            Err(shared) => {
                let mut o = shared.lock().unwrap();
                std::mem::replace(&mut *o, Observed::new(Duration::from_secs(1)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, s: f64) -> Instant {
        t0 + Duration::from_secs_f64(s)
    }

    fn holders(list: &[(u32, Option<&str>)]) -> Holders {
        list.iter()
            .map(|(k, h)| (*k, h.map(str::to_owned)))
            .collect()
    }

    fn members(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(m, v)| (m.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_holder_whose_lease_stops_changing_stops_owning_after_a_lease_duration() {
        let t0 = Instant::now();
        let mut o = Ownership::new(Duration::from_secs(4));
        let h = holders(&[(0, Some("a")), (1, Some("b"))]);
        o.observe(t0, &members(&[("a", "1"), ("b", "1")]), h.clone());
        assert_eq!(o.unowned_now(), 0);
        assert!(o.all_owned_at.is_some());
        // a renews, b does not.
        o.observe(at(t0, 2.0), &members(&[("a", "2"), ("b", "1")]), h.clone());
        assert_eq!(o.unowned_now(), 0);
        o.observe(at(t0, 4.0), &members(&[("a", "3"), ("b", "1")]), h.clone());
        assert_eq!(o.unowned_now(), 1, "b unchanged for 4 s");
        assert!(o.all_owned_at.is_none());
        o.observe(at(t0, 9.0), &members(&[("a", "4"), ("b", "1")]), h);
        assert_eq!(o.longest_unowned[&1], 5.0);
        // a takes shard 1 over.
        let taken = holders(&[(0, Some("a")), (1, Some("a"))]);
        o.observe(at(t0, 10.0), &members(&[("a", "5")]), taken);
        assert_eq!(o.unowned_now(), 0);
        assert_eq!(o.longest_unowned[&1], 6.0);
        assert_eq!(o.all_owned_at, Some(at(t0, 10.0)));
    }

    #[test]
    fn an_empty_holder_or_a_missing_member_is_unowned() {
        let t0 = Instant::now();
        let mut o = Ownership::new(Duration::from_secs(4));
        o.observe(
            t0,
            &members(&[("a", "1")]),
            holders(&[(0, None), (1, Some("gone")), (2, Some("a"))]),
        );
        assert_eq!(o.unowned_now(), 2);
    }

    fn scrape(start: f64, passes: f64, waits: f64) -> Vec<PromSample> {
        measure::parse_prometheus(&format!(
            "process_start_time_seconds {start}\n\
             module_manager_reconcile_passes_total{{result=\"ready\"}} {passes}\n\
             module_manager_queue_wait_seconds_bucket{{le=\"1\"}} {waits}\n\
             module_manager_queue_wait_seconds_bucket{{le=\"+Inf\"}} {waits}\n"
        ))
    }

    #[test]
    fn increases_add_up_across_a_restart() {
        let mut a = Accumulated::default();
        a.add(&scrape(100.0, 50.0, 50.0), 1000.0); // started before the window: baseline
        a.add(&scrape(100.0, 70.0, 70.0), 1000.0);
        a.add(&scrape(100.0, 90.0, 90.0), 1000.0);
        // Restarted: the new process has counted 30 already (more than the old baseline's 0
        // is no help: the start time tells).
        a.add(&scrape(2000.0, 130.0, 130.0), 1000.0);
        a.add(&scrape(2000.0, 140.0, 140.0), 1000.0);
        assert_eq!(
            a.counters["module_manager_reconcile_passes_total"],
            40.0 + 130.0 + 10.0
        );
        let histogram = &a.histograms["module_manager_queue_wait_seconds"];
        assert_eq!(histogram.last().unwrap().1, 180.0);
        // Without start times a count going down shows the restart.
        let mut b = Accumulated::default();
        b.add(&scrape(0.0, 50.0, 50.0), 1000.0);
        b.add(&scrape(0.0, 5.0, 5.0), 1000.0);
        assert_eq!(b.counters["module_manager_reconcile_passes_total"], 5.0);
        // A process started within the window counts from zero.
        let mut c = Accumulated::default();
        c.add(&scrape(1500.0, 12.0, 12.0), 1000.0);
        assert_eq!(c.counters["module_manager_reconcile_passes_total"], 12.0);
    }

    #[test]
    fn moves_are_recorded_while_asked() {
        let t0 = Instant::now();
        let mut o = Ownership::new(Duration::from_secs(4));
        let m = members(&[("a", "1"), ("b", "1")]);
        o.observe(t0, &m, holders(&[(0, Some("a")), (1, Some("b"))]));
        o.start_recording_moves();
        o.observe(at(t0, 1.0), &m, holders(&[(0, Some("a")), (1, None)]));
        o.observe(at(t0, 2.0), &m, holders(&[(0, Some("a")), (1, Some("b"))]));
        assert!(
            o.holder_history.values().all(|h| h.len() == 1),
            "released and back: no move"
        );
        o.observe(at(t0, 3.0), &m, holders(&[(0, Some("b")), (1, Some("b"))]));
        let moved = o.stop_recording_moves();
        assert_eq!(moved.keys().copied().collect::<Vec<_>>(), vec![0]);
        assert_eq!(moved[&0], vec![Some("a".into()), Some("b".into())]);
    }
}
