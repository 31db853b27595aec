//! The faults of `chaos` beyond the replicas' own (issue 33): kube-apiserver killed (SIGKILL)
//! or stopped gracefully (SIGTERM), etcd killed, each started again on its port and data after
//! `--control-plane-down-seconds`; a replica partitioned from the API server and every replica's
//! API traffic slowed ([`crate::network`]); and, after every fault, how the fleet came out of it: the
//! time until every operation sent before the fault ended had its effect (and one sent after
//! it), and the fleet's API request rate before the first fault and in the first 30 s after
//! each.
//!
//! The decisions ([`Fault::parse`], [`rate_between`], [`stuck_before`], [`new_work_done`],
//! [`needs_probe`]) are pure; the rest drives the control plane and waits.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::load::{Done, Op};
use crate::observe::Observed;
use crate::options::Options;
use crate::phase::Phase;
use crate::results::FaultRecord;

/// How long after a fault's end the load has to send a create or update before the harness
/// sends a probe.
const PROBE_AFTER: Duration = Duration::from_secs(1);

/// The window of the request rates before and after a fault.
pub const RATE_WINDOW_SECONDS: f64 = 30.0;

/// A fault of `--faults`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Replicas killed (SIGKILL), started again after `--revive-after-seconds`.
    Kill,
    /// Replicas stopped (SIGSTOP), resumed after `--pause-seconds`.
    Pause,
    /// kube-apiserver killed (SIGKILL) and started again on its port.
    ApiServer,
    /// kube-apiserver stopped gracefully (SIGTERM: it finishes what is in flight) and started
    /// again.
    ApiServerGraceful,
    /// etcd killed (SIGKILL) and started again on its data.
    Etcd,
    /// One replica's connections to the API server blackholed (its own proxy swallows every
    /// byte) while its process runs.
    Partition,
    /// Every replica's connections to the API server delayed.
    Slow,
}

impl Fault {
    pub const ALL: [Fault; 7] = [
        Fault::Kill,
        Fault::Pause,
        Fault::ApiServer,
        Fault::ApiServerGraceful,
        Fault::Etcd,
        Fault::Partition,
        Fault::Slow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::ApiServer => "apiserver",
            Fault::ApiServerGraceful => "apiserver-graceful",
            Fault::Etcd => "etcd",
            Fault::Partition => "partition",
            Fault::Slow => "slow",
        }
    }

    /// Whether it goes through the replicas' proxies ([`crate::network`]).
    pub fn on_network(self) -> bool {
        matches!(self, Fault::Partition | Fault::Slow)
    }

    /// Whether the request rate of the 30 s after it is measured (a fault that every replica,
    /// or the victim, comes out of at once; not a replica started again).
    pub fn rate_after(self) -> bool {
        !matches!(self, Fault::Kill | Fault::Pause)
    }

    pub fn parse(name: &str) -> anyhow::Result<Fault> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .with_context(|| {
                let known: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                format!("unknown fault {name:?} ({})", known.join(", "))
            })
    }

    /// The control-plane process it stops and how, if it is a control-plane fault.
    pub fn process(self) -> Option<(&'static str, testenv::Stop)> {
        match self {
            Fault::Kill | Fault::Pause | Fault::Partition | Fault::Slow => None,
            Fault::ApiServer => Some(("kube-apiserver", testenv::Stop::Kill)),
            Fault::ApiServerGraceful => Some(("kube-apiserver", testenv::Stop::Graceful)),
            Fault::Etcd => Some(("etcd", testenv::Stop::Kill)),
        }
    }
}

/// The order of the faults: every type of `--faults` once in a random order, then again in
/// another, so that each type comes as often as the others (± 1) whatever the seed; or, with
/// `--fault-count`, in the order given, again and again.
pub struct FaultBag {
    kinds: Vec<Fault>,
    left: Vec<Fault>,
    shuffled: bool,
}

impl FaultBag {
    pub fn new(kinds: Vec<Fault>) -> Self {
        Self {
            kinds,
            left: Vec::new(),
            shuffled: true,
        }
    }

    /// The kinds in the order given.
    pub fn in_order(kinds: Vec<Fault>) -> Self {
        Self {
            shuffled: false,
            ..Self::new(kinds)
        }
    }

    /// The next fault; `None` when there are no kinds.
    pub fn next(&mut self, rng: &mut impl rand::Rng) -> Option<Fault> {
        if self.left.is_empty() {
            self.left = self.kinds.clone();
            if self.shuffled {
                rand::seq::SliceRandom::shuffle(self.left.as_mut_slice(), rng);
            } else {
                self.left.reverse();
            }
        }
        self.left.pop()
    }
}

/// The fleet's API requests so far (every replica's `module_manager_api_requests_total`, summed
/// across restarts), looked at every second and kept as (seconds since the load started when
/// the scrape's readings arrived, total): one sample per scrape.
pub struct RequestHistory {
    pub samples: Arc<Mutex<Vec<(f64, f64)>>>,
    /// The end of the steady window every fault's "before" rate is taken over: the first
    /// fault's start ([`RequestHistory::baseline`]).
    baseline_until: Mutex<Option<f64>>,
    task: tokio::task::JoinHandle<()>,
}

impl RequestHistory {
    pub fn spawn(phase: &Phase) -> Self {
        let samples: Arc<Mutex<Vec<(f64, f64)>>> = Arc::default();
        let observed = phase.sampler.observed.clone();
        let into = samples.clone();
        let task = tokio::spawn(async move {
            loop {
                let (at, total) = {
                    let observed = observed.lock().unwrap();
                    (observed.scraped_at, fleet_requests(&observed))
                };
                {
                    let mut samples = into.lock().unwrap();
                    if at > 0.0 && samples.last().is_none_or(|(last, _)| *last < at) {
                        samples.push((at, total));
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Self {
            samples,
            baseline_until: Mutex::new(None),
            task,
        }
    }

    /// Marks the end of the steady window (`at`, seconds since the load started: when the
    /// first fault began); later calls change nothing.
    pub fn mark_baseline(&self, at: f64) {
        self.baseline_until.lock().unwrap().get_or_insert(at);
    }

    /// The steady request rate: over the 30 s before the first fault (from the load's start if
    /// that is sooner), one figure for every fault, so that no fault's "before" holds the
    /// recovery of the previous one.
    pub fn baseline(&self) -> Option<f64> {
        let until = (*self.baseline_until.lock().unwrap())?;
        self.rate((until - RATE_WINDOW_SECONDS).max(self.first()), until)
    }

    /// When the first sample was taken (seconds since the load started).
    pub fn first(&self) -> f64 {
        self.samples.lock().unwrap().first().map_or(0.0, |s| s.0)
    }

    /// Requests per second between `from` and `to` (seconds since the load started).
    pub fn rate(&self, from: f64, to: f64) -> Option<f64> {
        rate_between(&self.samples.lock().unwrap(), from, to)
    }
}

impl Drop for RequestHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn fleet_requests(observed: &Observed) -> f64 {
    observed
        .accumulated
        .values()
        .filter_map(|a| a.counters.get(crate::observe::API_REQUESTS))
        .sum()
}

/// The rate of a growing total between `from` and `to`, from the last sample at or before
/// `from` to the first at or after `to`; `None` without samples on both sides.
pub fn rate_between(samples: &[(f64, f64)], from: f64, to: f64) -> Option<f64> {
    let start = samples.iter().rev().find(|(t, _)| *t <= from)?;
    let end = samples.iter().find(|(t, _)| *t >= to)?;
    let seconds = end.0 - start.0;
    (seconds > 0.0).then(|| (end.1 - start.1).max(0.0) / seconds)
}

/// Operations sent before `before` (seconds since the load started) still without their
/// effect: `outstanding` as [`crate::load::Tracker::outstanding`] gives them at `now`.
pub fn stuck_before(
    outstanding: &[(String, Op, f64)],
    now: f64,
    before: f64,
) -> Vec<(String, Op, f64)> {
    outstanding
        .iter()
        .filter(|(_, _, age)| now - age < before)
        .cloned()
        .collect()
}

/// Whether a create or update sent at or after `since` (seconds since the load started) had
/// its effect: the fleet works again. Required after every fault, however empty the backlog:
/// the load's requests fail during an outage, so a fleet that never came back could leave
/// none, and one that never reconnects would pass at once ([`needs_probe`] sends one when the
/// load sent none).
pub fn new_work_done(done: &[Done], since: f64) -> bool {
    done.iter().any(|d| d.op != Op::Delete && d.sent >= since)
}

/// Whether no create or update sent at or after `since` is done or waiting (`outstanding` at
/// `now`, as [`stuck_before`] takes it): the load sent none that could show the fleet works
/// again (its requests failed, or it sent only deletes), so the harness sends a probe.
pub fn needs_probe(done: &[Done], outstanding: &[(String, Op, f64)], now: f64, since: f64) -> bool {
    let waiting = outstanding
        .iter()
        .any(|(_, op, age)| *op != Op::Delete && now - age >= since);
    !waiting && !new_work_done(done, since)
}

/// Stops the fault's control-plane process, waits `--control-plane-down-seconds`, starts it
/// again and waits for `/readyz`. Returns when the process was started again and when the
/// outage ended (ready); records in `record` whether a graceful stop needed SIGKILL after its
/// grace.
pub async fn control_plane_outage(
    control_plane: &testenv::ControlPlane,
    fault: Fault,
    options: &Options,
    record: &mut FaultRecord,
) -> anyhow::Result<(Instant, Instant)> {
    let (program, how) = fault.process().context("not a control-plane fault")?;
    let killed = control_plane.stop_process(program, how).await?;
    if how == testenv::Stop::Graceful {
        record.killed_after_grace = Some(killed);
    }
    tokio::time::sleep(Duration::from_secs(options.control_plane_down_seconds)).await;
    let spawned = Instant::now();
    control_plane
        .start_process(program)
        .await
        .with_context(|| format!("start {program} again"))?;
    Ok((spawned, Instant::now()))
}

/// The instants of one fault: when it hit, when the rate "after" is counted from (the
/// process started again; else the end), when it was over.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub hit: Instant,
    pub rate_from: Instant,
    pub back: Instant,
}

/// After a fault that ended at `back`: waits (up to `--recovery-limit-seconds`) until every
/// operation sent before then had its effect, and for control-plane faults until 30 s have
/// passed for the rate after it; fills the record's figures.
pub async fn recovery(
    phase: &Phase,
    options: &Options,
    history: &RequestHistory,
    Span {
        hit,
        rate_from,
        back,
    }: Span,
    record: &mut FaultRecord,
) {
    let load = &phase.load;
    let back_at = load.elapsed() - back.elapsed().as_secs_f64();
    record.at_seconds = back_at - back.duration_since(hit).as_secs_f64();
    record.outage_seconds = back.duration_since(hit).as_secs_f64();
    let limit = Duration::from_secs(options.recovery_limit_seconds);
    let mut probed: Option<Instant> = None;
    loop {
        let now = load.elapsed();
        let (outstanding, working, probe) = {
            let tracker = load.tracker.lock().unwrap();
            let outstanding = tracker.outstanding(Instant::now());
            let working = new_work_done(&tracker.done, back_at);
            let probe = needs_probe(&tracker.done, &outstanding, now, back_at);
            (outstanding, working, probe)
        };
        // A probe Manifest when the load, a second after the end, has sent nothing that could
        // show the fleet works (and again 5 s after a probe that failed).
        if probe
            && back.elapsed() > PROBE_AFTER
            && probed.is_none_or(|p| p.elapsed() > PROBE_AFTER * 5)
        {
            probed = Some(Instant::now());
            record.probes += 1;
            // In the background: it may wait for one of the load's slots.
            let load = load.clone();
            tokio::spawn(async move { load.create().await });
        }
        let stuck = stuck_before(&outstanding, now, back_at);
        if stuck.is_empty() && working {
            record.recovered_seconds = Some(back.elapsed().as_secs_f64());
            break;
        }
        if back.elapsed() > limit {
            // The backlog, else what was sent after the fault (nothing of it had its effect).
            let shown = if stuck.is_empty() { outstanding } else { stuck };
            record.stuck = shown
                .iter()
                .map(|(name, op, age)| format!("{op:?} {name} ({age:.0} s ago)"))
                .collect();
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    record.replicas_exited = exited(phase).await;
    record.steady_requests_per_second = history.baseline();
    if Fault::parse(&record.fault).is_ok_and(Fault::rate_after) {
        // From the process's start (its clients' retries before /readyz count), 30 s, and
        // the scrape after that (every few seconds).
        let from = load.elapsed() - rate_from.elapsed().as_secs_f64();
        let window = Duration::from_secs_f64(RATE_WINDOW_SECONDS + 1.0);
        tokio::time::sleep(window.saturating_sub(rate_from.elapsed())).await;
        let to = from + RATE_WINDOW_SECONDS;
        let limit = Instant::now() + Duration::from_secs(15);
        while history
            .samples
            .lock()
            .unwrap()
            .last()
            .is_none_or(|s| s.0 < to)
            && Instant::now() < limit
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        record.requests_per_second_after = history.rate(from, to);
    }
}

/// Replicas the harness started whose process is no longer running.
async fn exited(phase: &Phase) -> Vec<String> {
    let mut gone = Vec::new();
    for ordinal in phase.probe.ordinals().await.unwrap_or_default() {
        if let Some(pid) = phase.probe.pid(ordinal)
            && !testenv::pid_runs(pid, "module-manager")
        {
            gone.push(phase.probe.member(ordinal));
        }
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_by_name_and_name_their_process() {
        for fault in Fault::ALL {
            assert_eq!(Fault::parse(fault.name()).unwrap(), fault);
        }
        let unknown = Fault::parse("latency").unwrap_err().to_string();
        assert!(unknown.contains("kill, pause, apiserver"), "{unknown}");
        assert_eq!(Fault::Kill.process(), None);
        assert_eq!(
            Fault::ApiServerGraceful.process(),
            Some(("kube-apiserver", testenv::Stop::Graceful))
        );
        assert_eq!(Fault::Etcd.process(), Some(("etcd", testenv::Stop::Kill)));
    }

    #[test]
    fn the_bag_gives_every_fault_once_per_round() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let kinds = vec![Fault::ApiServer, Fault::Etcd, Fault::Kill];
        let mut bag = FaultBag::new(kinds.clone());
        for _ in 0..4 {
            let mut round: Vec<Fault> = (0..3).map(|_| bag.next(&mut rng).unwrap()).collect();
            round.sort_by_key(|f| f.name());
            let mut want = kinds.clone();
            want.sort_by_key(|f| f.name());
            assert_eq!(round, want);
        }
        assert_eq!(FaultBag::new(Vec::new()).next(&mut rng), None);
        let mut bag = FaultBag::in_order(kinds.clone());
        let order: Vec<Fault> = (0..4).map(|_| bag.next(&mut rng).unwrap()).collect();
        assert_eq!(
            order,
            [Fault::ApiServer, Fault::Etcd, Fault::Kill, Fault::ApiServer]
        );
    }

    #[test]
    fn the_rate_spans_the_samples_around_the_window() {
        let samples = [(0.0, 0.0), (10.0, 100.0), (20.0, 400.0), (31.0, 510.0)];
        assert_eq!(rate_between(&samples, 10.0, 20.0), Some(30.0));
        // From the last sample at or before the start to the first at or after the end.
        assert_eq!(rate_between(&samples, 12.0, 30.0), Some(410.0 / 21.0));
        assert_eq!(rate_between(&samples, 25.0, 40.0), None, "no end yet");
        assert_eq!(rate_between(&samples, -5.0, 10.0), None, "no start");
        assert_eq!(rate_between(&samples, 10.0, 10.0), None);
    }

    #[test]
    fn the_fleet_works_again_once_a_create_or_update_sent_after_the_fault_is_done() {
        let done = |op, sent| Done {
            op,
            sent,
            seconds: 1.0,
        };
        let before = [done(Op::Create, 10.0), done(Op::Delete, 30.0)];
        assert!(!new_work_done(&before, 20.0), "a delete needs no Ready");
        assert!(new_work_done(&[done(Op::Update, 21.0)], 20.0));
        // Nothing sent after the fault: not working (a fleet that never reconnects must not
        // pass at once), and a probe is due.
        assert!(!new_work_done(&[], 20.0));
        assert!(needs_probe(&before, &[], 40.0, 20.0));
        // At 40 s, a create sent at 25 s waits: no probe, and not working until it is done.
        let waiting = [("m".to_owned(), Op::Create, 15.0)];
        assert!(!needs_probe(&before, &waiting, 40.0, 20.0));
        // One sent before the fault, or a delete, does not count.
        let older = [("m".to_owned(), Op::Create, 25.0)];
        assert!(needs_probe(&before, &older, 40.0, 20.0));
        let delete = [("m".to_owned(), Op::Delete, 15.0)];
        assert!(needs_probe(&before, &delete, 40.0, 20.0));
        assert!(!needs_probe(&[done(Op::Update, 21.0)], &[], 40.0, 20.0));
    }

    #[test]
    fn only_operations_sent_before_the_end_of_the_fault_count_as_stuck() {
        let outstanding = vec![
            ("old".to_owned(), Op::Create, 50.0),
            ("new".to_owned(), Op::Update, 5.0),
        ];
        // Now is 100 s, the fault ended at 60 s: `old` was sent at 50 s, `new` at 95 s.
        let stuck = stuck_before(&outstanding, 100.0, 60.0);
        assert_eq!(stuck, vec![("old".to_owned(), Op::Create, 50.0)]);
        assert!(stuck_before(&outstanding, 100.0, 40.0).is_empty());
    }
}
