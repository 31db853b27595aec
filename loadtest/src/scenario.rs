//! The scenarios: what happens to the fleet while the load runs. Each returns the violations
//! only it can judge (the common checkers run in [`crate::phase::Phase::finish`]).

use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::checks;
use crate::faults::{self, Fault, FaultBag, RequestHistory, Span};
use crate::load::Rates;
use crate::measure;
use crate::observe::{Holders, read_leases};
use crate::options::{Options, Scenario};
use crate::phase::{Phase, move_step, wait_assignment};
use crate::results::{Capacity, CapacityStep, FaultRecord, FleetFigures, Violation};

/// Plays `scenario` (all but scale-out) on the phase's fleet (`control_plane`: the local one,
/// for `chaos`'s control-plane faults).
pub async fn play(
    scenario: Scenario,
    phase: &mut Phase,
    options: &Options,
    figures: &mut FleetFigures,
    control_plane: Option<&testenv::ControlPlane>,
) -> anyhow::Result<Vec<Violation>> {
    match scenario {
        Scenario::Basic => {
            phase.progress.expect(options.duration_seconds);
            phase
                .load
                .run(
                    Phase::rates(options),
                    Duration::from_secs(options.duration_seconds),
                )
                .await;
            Ok(Vec::new())
        }
        Scenario::Chaos => chaos(phase, options, figures, control_plane).await,
        Scenario::RollingUpdate | Scenario::Smoke => rolling_update(phase, options, figures).await,
        Scenario::Rebalance => rebalance(phase, options, figures).await,
        Scenario::ScaleOut => anyhow::bail!("scale-out is played by scale_out"),
        Scenario::Mttp => anyhow::bail!("mttp is played by mttp::run"),
        Scenario::Remote => anyhow::bail!("remote is played by remote::run"),
        Scenario::Hostile => anyhow::bail!("hostile is played by hostile::run"),
    }
}

/// The shard holders now; a failed read is retried (up to 5 times, 1 s apart) rather than
/// ending a run of many minutes.
/// Waits (5 minutes at most) until the shard Leases name the assignment over `replicas`.
async fn settle(phase: &Phase, replicas: u32) -> anyhow::Result<Duration> {
    let limit = Duration::from_secs(300);
    wait_assignment(&phase.probe, phase.fleet.shards, replicas, limit).await
}

async fn holders(phase: &Phase) -> anyhow::Result<Holders> {
    let mut attempt = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), read_leases(&phase.probe)).await {
            Ok(Ok((_, holders))) => return Ok(holders),
            Ok(Err(e)) if attempt >= 4 => return Err(e.context("read the shard Leases")),
            Err(_) if attempt >= 4 => anyhow::bail!("read the shard Leases: timed out"),
            _ => attempt += 1,
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Runs the load in the background until [`crate::load::Load::stop`].
fn background_load(phase: &Phase, options: &Options) -> tokio::task::JoinHandle<()> {
    let load = phase.load.clone();
    let rates = Phase::rates(options);
    tokio::spawn(async move { load.run(rates, Duration::from_secs(24 * 3600)).await })
}

/// Lets the load run until `duration_seconds` have passed since the phase started, then stops
/// it.
async fn run_out(phase: &Phase, options: &Options, load: tokio::task::JoinHandle<()>) {
    let left = options.duration_seconds as f64 - phase.load.elapsed();
    if left > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(left)).await;
    }
    phase.load.stop();
    let _ = load.await;
}

/// Restarts every replica in turn (highest ordinal first, as a StatefulSet rolls), each after
/// the previous one is ready again; nothing may move meanwhile.
async fn rolling_update(
    phase: &mut Phase,
    options: &Options,
    figures: &mut FleetFigures,
) -> anyhow::Result<Vec<Violation>> {
    phase.progress.expect(options.duration_seconds);
    let load = background_load(phase, options);
    tokio::time::sleep(Duration::from_secs(options.warmup_seconds)).await;
    let from = now();
    phase
        .sampler
        .observed
        .lock()
        .unwrap()
        .ownership
        .start_recording_moves();
    let mut ordinals = phase.fleet.ordinals().await?;
    ordinals.sort_unstable_by(|a, b| b.cmp(a));
    for ordinal in ordinals {
        let member = phase.fleet.member(ordinal);
        phase
            .progress
            .say(format!("rolling update: restarting {member}"));
        phase.sampler.event(format!("restart {member}"));
        let before = holders(phase).await?;
        let started = Instant::now();
        phase.fleet.restart(ordinal).await?;
        phase.fleet.wait_ready(Duration::from_secs(180)).await?;
        let after = holders(phase).await?;
        figures.moves.push(
            move_step(
                phase,
                format!("restart {member}"),
                &before,
                &after,
                0.0,
                started.elapsed(),
            )
            .await?,
        );
    }
    // One sample after the last restart, so that a late move is seen.
    // Keep watching for a lease duration and a renew round after the last restart: a replica
    // that came back without renewing would lose its shards only then.
    tokio::time::sleep(
        phase.fleet.lease_duration
            + Duration::from_secs(options.renew_interval_seconds)
            + Duration::from_secs_f64(2.0 * options.sample_seconds),
    )
    .await;
    let to = now();
    let moved = phase
        .sampler
        .observed
        .lock()
        .unwrap()
        .ownership
        .stop_recording_moves();
    run_out(phase, options, load).await;
    let logs = phase.fleet.logs().await?;
    Ok(checks::moved_during_rolling_update(&moved, &logs, from, to))
}

/// Faults on a schedule: random replicas killed (SIGKILL) or paused (SIGSTOP), or the control
/// plane's kube-apiserver or etcd stopped and started again ([`faults`]); measures each
/// takeover and each recovery.
async fn chaos(
    phase: &mut Phase,
    options: &Options,
    figures: &mut FleetFigures,
    control_plane: Option<&testenv::ControlPlane>,
) -> anyhow::Result<Vec<Violation>> {
    let kinds = fault_kinds(options, control_plane.is_some(), phase.network.is_some())?;
    phase.progress.expect(options.duration_seconds);
    let mut rng = StdRng::seed_from_u64(options.seed);
    let load = background_load(phase, options);
    // From the start, so that the first fault has its steady rate (with a warmup of 30 s).
    let history = RequestHistory::spawn(phase);
    tokio::time::sleep(Duration::from_secs(options.warmup_seconds)).await;
    let interval = Duration::from_secs(options.chaos_interval_seconds.max(1));
    let mut takeovers = Vec::new();
    let mut bag = match options.fault_count {
        Some(_) => FaultBag::in_order(kinds),
        None => FaultBag::new(kinds),
    };
    let mut rounds = 0;
    while match options.fault_count {
        Some(count) => rounds < count,
        None => {
            rounds == 0
                || phase.load.elapsed() + interval.as_secs_f64() <= options.duration_seconds as f64
        }
    } {
        rounds += 1;
        let round = Instant::now();
        let fault = bag.next(&mut rng).context("faults")?;
        let mut record = FaultRecord {
            fault: fault.name().to_owned(),
            ..Default::default()
        };
        let frozen = match control_plane {
            Some(cp) if fault.process().is_some() && options.fault_freeze_controller_manager => {
                Some(cp.pause("kube-controller-manager")?)
            }
            _ => None,
        };
        history.mark_baseline(phase.load.elapsed());
        let span = match control_plane.filter(|_| fault.process().is_some()) {
            Some(cp) => control_plane_fault(phase, cp, fault, options, &mut record).await?,
            None if fault == Fault::Slow => slow(phase, options, &mut rng, &mut record).await?,
            None => {
                let taken = &mut takeovers;
                replica_fault(
                    phase,
                    options,
                    (fault, &mut rng),
                    figures,
                    taken,
                    &mut record,
                )
                .await?
            }
        };
        faults::recovery(phase, options, &history, span, &mut record).await;
        drop(frozen);
        phase.progress.say(describe_recovery(&record));
        figures.faults.push(record);
        phase.fleet.wait_ready(Duration::from_secs(180)).await?;
        // The next fault starts from a settled fleet: the victims have their shards back, so
        // each takeover and its moves are measured on their own.
        let all = phase.fleet.ordinals().await?.len() as u32;
        settle(phase, all)
            .await
            .context("the fleet did not settle after a fault")?;
        let left = interval.saturating_sub(round.elapsed());
        tokio::time::sleep(left).await;
    }
    figures.takeover_seconds = measure::quantiles(&takeovers);
    run_out(phase, options, load).await;
    let limit = Duration::from_secs(options.recovery_limit_seconds);
    Ok(checks::not_recovered(&figures.faults, limit))
}

/// The faults of `--faults`, each possible where the run is.
fn fault_kinds(options: &Options, local: bool, proxied: bool) -> anyhow::Result<Vec<Fault>> {
    let kinds: Vec<Fault> = options
        .faults
        .iter()
        .map(|f| Fault::parse(f))
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(!kinds.is_empty(), "--faults is empty");
    anyhow::ensure!(
        local || kinds.iter().all(|f| f.process().is_none()),
        "the faults apiserver, apiserver-graceful and etcd need a local control plane"
    );
    anyhow::ensure!(
        proxied || kinds.iter().all(|f| !f.on_network()),
        "the faults partition and slow need a local fleet (its replicas' proxies)"
    );
    Ok(kinds)
}

/// kube-apiserver or etcd stopped and started again; returns its span (the rate after it
/// from the process's start).
async fn control_plane_fault(
    phase: &Phase,
    control_plane: &testenv::ControlPlane,
    fault: Fault,
    options: &Options,
    record: &mut FaultRecord,
) -> anyhow::Result<Span> {
    record.label = fault.name().to_owned();
    phase.progress.say(format!("chaos: {}", record.label));
    phase.sampler.event(record.label.clone());
    let hit = Instant::now();
    let (rate_from, back) =
        faults::control_plane_outage(control_plane, fault, options, record).await?;
    phase.sampler.event(format!("back {}", record.label));
    Ok(Span {
        hit,
        rate_from,
        back,
    })
}

/// Random replicas killed or paused, the takeover timed, the victims started again or
/// resumed; returns its span (over when the victims were back).
async fn replica_fault(
    phase: &mut Phase,
    options: &Options,
    (fault, rng): (Fault, &mut StdRng),
    figures: &mut FleetFigures,
    takeovers: &mut Vec<f64>,
    record: &mut FaultRecord,
) -> anyhow::Result<Span> {
    let mut ordinals = phase.fleet.ordinals().await?;
    ordinals.shuffle(rng);
    ordinals.truncate(options.victims.max(1) as usize);
    ordinals.sort_unstable();
    let members: Vec<String> = ordinals.iter().map(|o| phase.fleet.member(*o)).collect();
    let label = format!("{} {}", fault.name(), members.join(","));
    record.label = label.clone();
    phase.progress.say(format!("chaos: {label}"));
    let before = holders(phase).await?;
    let victims_held = before
        .values()
        .filter(|h| h.as_ref().is_some_and(|h| members.contains(h)))
        .count();
    let hit = Instant::now();
    let mut stopped = now();
    phase.sampler.event(label.clone());
    let hold = if fault == Fault::Kill {
        for o in &ordinals {
            phase.fleet.kill(*o).await?;
        }
        Duration::from_secs(options.revive_after())
    } else if fault == Fault::Partition {
        let network = phase.network.as_ref().context("no proxies")?;
        for o in &ordinals {
            network.blackhole(*o as usize, true);
        }
        stopped = now();
        let seconds = options
            .partition_seconds
            .unwrap_or_else(|| rng.random_range(30..=90));
        Duration::from_secs(seconds)
    } else {
        for o in &ordinals {
            phase.fleet.pause(*o, true)?;
        }
        stopped = now();
        Duration::from_secs(options.pause())
    };
    // Until the victims come back: did the others take their shards over, and when?
    let takeover = wait_takeover(phase, &members, &before, hit, hit + hold).await;
    if takeover.is_none() && fault_needs_takeover(hold, phase) {
        figures.takeovers_unfinished += 1;
    }
    if let Some(seconds) = takeover {
        takeovers.push(seconds);
        let after = holders(phase).await?;
        let ideal = victims_held as f64 / phase.fleet.shards as f64;
        let settled = Duration::from_secs_f64(seconds);
        let step = move_step(phase, label.clone(), &before, &after, ideal, settled).await?;
        figures.moves.push(step);
    }
    let left = (hit + hold).saturating_duration_since(Instant::now());
    tokio::time::sleep(left).await;
    bring_back(phase, fault, &ordinals, stopped).await?;
    phase.sampler.event(format!("back {}", members.join(",")));
    let back = Instant::now();
    Ok(Span {
        hit,
        rate_from: back,
        back,
    })
}

/// The victims of a replica fault started again, resumed or reconnected (`stopped`: when the
/// pause or partition began).
async fn bring_back(
    phase: &mut Phase,
    fault: Fault,
    ordinals: &[u32],
    stopped: k8s_openapi::jiff::Timestamp,
) -> anyhow::Result<()> {
    for o in ordinals {
        if fault == Fault::Kill {
            phase.fleet.revive(*o).await?;
            continue;
        }
        // The window the overlap checker knows of: from after SIGSTOP was sent to before
        // SIGCONT is (the process surely ran nothing in between: no pass counts), or from after
        // the replica's proxy began to swallow its bytes to before it stops (nothing it sent
        // reached the API server in between, and the heal resets what was open: its passes
        // count only after the heal, or after the reset ended them).
        let window = (stopped, now());
        let member = phase.fleet.member(*o);
        match phase.network.as_ref().filter(|_| fault == Fault::Partition) {
            Some(network) => {
                phase.partitions.entry(member).or_default().push(window);
                network.blackhole(*o as usize, false);
            }
            None => {
                phase.pauses.entry(member).or_default().push(window);
                phase.fleet.pause(*o, false)?;
            }
        }
    }
    Ok(())
}

/// Every replica's API traffic delayed by `--slow-ms` (or 200–2000 ms) of round trip for
/// `--slow-seconds` (or 30–90 s); returns its span (over at the end of the delay).
async fn slow(
    phase: &Phase,
    options: &Options,
    rng: &mut StdRng,
    record: &mut FaultRecord,
) -> anyhow::Result<Span> {
    let network = phase.network.as_ref().context("no proxies")?;
    let delay = options
        .slow_ms
        .unwrap_or_else(|| rng.random_range(200..=2000));
    let seconds = options
        .slow_seconds
        .unwrap_or_else(|| rng.random_range(30..=90));
    record.label = format!("slow {delay} ms for {seconds} s");
    phase.progress.say(format!("chaos: {}", record.label));
    phase.sampler.event(record.label.clone());
    let ordinals = phase.fleet.ordinals().await?;
    let hit = Instant::now();
    for o in &ordinals {
        network.set_round_trip(*o as usize, Duration::from_millis(delay));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    for o in &ordinals {
        network.set_round_trip(*o as usize, Duration::ZERO);
    }
    phase.sampler.event("back: not slow".to_owned());
    let back = Instant::now();
    Ok(Span {
        hit,
        rate_from: back,
        back,
    })
}

/// One line for the progress output: how the fleet came out of a fault.
fn describe_recovery(record: &FaultRecord) -> String {
    let rate = |r: Option<f64>| r.map_or("–".to_owned(), |r| format!("{r:.1}/s"));
    format!(
        "chaos: {} over after {:.1} s; recovered {}; fleet requests {} before, {} in the 30 s after",
        record.label,
        record.outage_seconds,
        record
            .recovered_seconds
            .map_or("not within the limit".to_owned(), |s| format!(
                "{s:.1} s after"
            )),
        rate(record.steady_requests_per_second),
        rate(record.requests_per_second_after),
    )
}

/// Whether the victims stay away long enough that the others must take over (a lease duration
/// plus a renew round and a margin); a shorter pause or revive only delays.
fn fault_needs_takeover(hold: Duration, phase: &Phase) -> bool {
    hold >= phase.fleet.lease_duration * 2
}

/// Waits (until `deadline`) until every shard the victims held (in `before`) is held by
/// another member and no shard is unowned; returns the seconds from `hit` to the observation
/// that showed it.
async fn wait_takeover(
    phase: &Phase,
    victims: &[String],
    before: &Holders,
    hit: Instant,
    deadline: Instant,
) -> Option<f64> {
    let theirs: Vec<u32> = before
        .iter()
        .filter(|(_, h)| h.as_ref().is_some_and(|h| victims.contains(h)))
        .map(|(k, _)| *k)
        .collect();
    while Instant::now() < deadline {
        {
            let observed = phase.sampler.observed.lock().unwrap();
            let ownership = &observed.ownership;
            let taken = theirs.iter().all(|k| {
                ownership
                    .holders
                    .get(k)
                    .and_then(Option::as_ref)
                    .is_some_and(|h| !victims.contains(h))
            });
            if taken && ownership.unowned_now() == 0 {
                return Some(hit.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Scales the fleet through `--sizes` (default N+2, N−1, N), measuring moves against the ideal.
async fn rebalance(
    phase: &mut Phase,
    options: &Options,
    figures: &mut FleetFigures,
) -> anyhow::Result<Vec<Violation>> {
    phase.progress.expect(options.duration_seconds);
    let n = phase.replicas;
    let sizes = if options.sizes.is_empty() {
        vec![n + 2, n.saturating_sub(1).max(1), n]
    } else {
        options.sizes.clone()
    };
    let load = background_load(phase, options);
    tokio::time::sleep(Duration::from_secs(options.warmup_seconds)).await;
    let mut current = n;
    for size in sizes {
        anyhow::ensure!(size > 0, "--sizes: a fleet needs at least one replica");
        let label = format!("scale {current}→{size}");
        phase.progress.say(format!("rebalance: {label}"));
        phase.sampler.event(label.clone());
        let before = holders(phase).await?;
        let started = Instant::now();
        phase.fleet.scale(size).await?;
        settle(phase, size).await.with_context(|| label.clone())?;
        let after = holders(phase).await?;
        let ideal = f64::from(current.abs_diff(size)) / f64::from(current.max(size));
        figures
            .moves
            .push(move_step(phase, label, &before, &after, ideal, started.elapsed()).await?);
        current = size;
        tokio::time::sleep(Duration::from_secs(options.warmup_seconds.min(15))).await;
    }
    run_out(phase, options, load).await;
    Ok(Vec::new())
}

/// Per-replica cumulative buckets of the queue-wait histogram now.
async fn queue_wait_now(phase: &Phase) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut all = Vec::new();
    for ordinal in phase.probe.ordinals().await.unwrap_or_default() {
        if let Ok(text) = phase.probe.scrape(ordinal).await {
            let samples = measure::parse_prometheus(&text);
            all.push((
                phase.probe.member(ordinal),
                measure::histogram(&samples, "module_manager_queue_wait_seconds"),
            ));
        }
    }
    all
}

fn queue_wait_between(
    before: &[(String, Vec<(f64, f64)>)],
    after: &[(String, Vec<(f64, f64)>)],
) -> Vec<(f64, f64)> {
    let mut total: Vec<(f64, f64)> = Vec::new();
    for (member, a) in after {
        let b = before
            .iter()
            .find(|(m, _)| m == member)
            .map(|(_, b)| b.clone())
            .unwrap_or_default();
        for (bound, count) in measure::histogram_delta(&b, a) {
            match total
                .iter_mut()
                .find(|(x, _)| x.to_bits() == bound.to_bits())
            {
                Some(slot) => slot.1 += count,
                None => total.push((bound, count)),
            }
        }
    }
    total.sort_by(|a, b| a.0.total_cmp(&b.0));
    total
}

struct StepWindow {
    create_rate: f64,
    /// Requests of the load generator that failed during the step.
    failed: u64,
    from: f64,
    to: f64,
    sent: u64,
    objects: u64,
    queue: Vec<(f64, f64)>,
}

/// Steps the create rate up (updates follow the objects) until an SLO breaks.
pub async fn scale_out(phase: &Phase, options: &Options) -> anyhow::Result<Capacity> {
    let step = Duration::from_secs(options.step_seconds.max(1));
    phase
        .progress
        .expect(options.step_seconds * options.max_steps as u64);
    let mut capacity = Capacity {
        replicas: phase.replicas,
        ..Default::default()
    };
    let mut previous: Option<StepWindow> = None;
    let grace = Duration::from_secs_f64(options.slo_ready_seconds);
    for k in 0..options.max_steps {
        let create_rate = options.start_rate + k as f64 * options.rate_step;
        let rates = Rates {
            create: create_rate,
            delete: 0.0,
            update_period: Phase::rates(options).update_period,
        };
        let queue_before = queue_wait_now(phase).await;
        let from = phase.load.elapsed();
        let sent_before = phase.load.sent();
        let failed_before = phase.load.tracker.lock().unwrap().failed;
        phase
            .sampler
            .event(format!("step {} ({create_rate}/s)", k + 1));
        let load = phase.load.clone();
        let task = tokio::spawn(async move { load.run(rates, step).await });
        if let Some(window) = previous.take() {
            // The previous step is judged once its last operations had the SLO's time.
            tokio::time::sleep(grace.min(step)).await;
            let judged = judge(phase, options, window);
            phase.progress.say(describe(&judged));
            let passed = judged.passed;
            capacity.steps.push(judged);
            if passed {
                capacity.last_passing = Some(capacity.steps.len() - 1);
            } else {
                phase.load.stop();
                let _ = task.await;
                phase.load.resume();
                return Ok(capacity);
            }
        }
        let _ = task.await;
        let to = phase.load.elapsed();
        let failed = phase.load.tracker.lock().unwrap().failed;
        let queue_after = queue_wait_now(phase).await;
        previous = Some(StepWindow {
            create_rate,
            from,
            to,
            sent: phase.load.sent().saturating_sub(sent_before),
            failed: failed.saturating_sub(failed_before),
            objects: phase.load.live_count() as u64,
            queue: queue_wait_between(&queue_before, &queue_after),
        });
    }
    if let Some(window) = previous {
        tokio::time::sleep(grace).await;
        let judged = judge(phase, options, window);
        phase.progress.say(describe(&judged));
        if judged.passed {
            capacity.last_passing = Some(capacity.steps.len());
        }
        capacity.steps.push(judged);
    }
    Ok(capacity)
}

fn judge(phase: &Phase, options: &Options, window: StepWindow) -> CapacityStep {
    let ready =
        phase
            .load
            .tracker
            .lock()
            .unwrap()
            .convergence_in(window.from, window.to, Instant::now());
    let ready_p99 = measure::quantiles(&ready).p99;
    let queue_p99 = measure::histogram_quantile(&window.queue, 0.99);
    // No figure is no pass: a step whose requests failed, or whose replicas could not be
    // scraped, did not show the SLOs held.
    let passed = window.failed == 0
        && ready_p99.is_some_and(|p| p < options.slo_ready_seconds)
        && queue_p99.is_some_and(|p| p < options.slo_queue_wait_seconds);
    CapacityStep {
        create_rate: window.create_rate,
        objects: window.objects,
        operations_per_second: window.sent as f64 / (window.to - window.from).max(1e-3),
        queue_wait_p99_seconds: queue_p99,
        ready_p99_seconds: ready_p99,
        passed,
    }
}

fn describe(step: &CapacityStep) -> String {
    format!(
        "scale-out: {:.1} creates/s, {} objects, {:.1} ops/s: p99 queue wait {}, p99 to Ready {} — {}",
        step.create_rate,
        step.objects,
        step.operations_per_second,
        step.queue_wait_p99_seconds
            .map_or("–".into(), |v| format!("{v:.3} s")),
        step.ready_p99_seconds
            .map_or("–".into(), |v| format!("{v:.2} s")),
        if step.passed {
            "SLOs met"
        } else {
            "SLO broken"
        }
    )
}

fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::try_from(std::time::SystemTime::now()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_wait_is_summed_over_replicas_per_step() {
        let before = vec![("a".to_owned(), vec![(1.0, 2.0), (f64::INFINITY, 2.0)])];
        let after = vec![
            ("a".to_owned(), vec![(1.0, 5.0), (f64::INFINITY, 6.0)]),
            // A replica that appeared during the step counts from zero.
            ("b".to_owned(), vec![(1.0, 1.0), (f64::INFINITY, 1.0)]),
        ];
        assert_eq!(
            queue_wait_between(&before, &after),
            vec![(1.0, 4.0), (f64::INFINITY, 5.0)]
        );
    }
}
