//! `remote`: the workload the product exists for — many Manifests on many remote clusters
//! (Kyma: 25,000 Manifests on 5,000 clusters). [`testbed`] makes `--targets` clusters out of a
//! few real API servers ([`crate::proxy`] gives each its own endpoint, each has its own credential);
//! the fleet gets `--modules-per-target` Manifests per target at once and is timed until all
//! are Ready, with its cost per target (requests from the targets' audit logs, connections
//! from the proxy, sockets, CPU and memory per replica); optionally it then idles for
//! `--idle-seconds`, takes `--edits` spec edits at a steady rate ([`steady`]) and repairs
//! `--drift-changes` objects changed on targets ([`drift`]); last a bare client does the same
//! applies ([`bare`]), with the fleet stopped. See `docs/loadtest.md`.

pub mod bare;
pub mod drift;
pub mod steady;
pub mod testbed;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::audit::{self, AuditLog, ClientRequests};
use crate::fleet::{Fleet, Probe};
use crate::load::{Load, RemoteShape};
use crate::mttp::{self, Setting};
use crate::options::Options;
use crate::phase::{self, Cluster, Phase};
use crate::progress::Progress;
use crate::results::{
    Remote, RemoteBurst, RemoteColdRestart, RemoteIdle, RunResult, Spread, Violation,
};
use testbed::{Shape, TestBed};

/// Plays `remote`; fills `result.remote` and the phase's common figures. Returns the fleet,
/// already stopped.
pub async fn run(
    cluster: &Cluster<'_>,
    options: &Options,
    result: &mut RunResult,
    progress: &Progress,
) -> anyhow::Result<Fleet> {
    let Cluster::Local(host) = cluster else {
        anyhow::bail!(
            "`remote` needs a local control plane: its targets are API servers the harness starts on this machine"
        );
    };
    let shape = Shape {
        targets: options.targets,
        apiservers: options.target_apiservers,
        latency: Duration::from_millis(options.target_latency_ms),
        token_seconds: options.target_token_seconds,
    };
    progress.say(format!(
        "remote: setting up {} targets on {} API servers",
        shape.targets, shape.apiservers
    ));
    let started = Instant::now();
    let bed = TestBed::start(&shape).await?;
    let setting = Setting {
        cluster,
        options,
        audit: None,
        control_plane: phase::control_plane_pids(host),
    };
    let mut remote = Remote {
        targets: options.targets as u64,
        modules_per_target: options.modules_per_target as u64,
        apiservers: options.target_apiservers as u64,
        latency_ms: options.target_latency_ms,
        manifests: (options.targets * options.modules_per_target) as u64,
        setup_seconds: started.elapsed().as_secs_f64(),
        token_seconds: options.target_token_seconds,
        ..Default::default()
    };
    let played = play(&setting, &bed, result, &mut remote, progress).await;
    remote.token_renewals = bed.renewals.renewed.load(Ordering::Relaxed);
    remote.token_renewal_failures = bed.renewals.failed.load(Ordering::Relaxed);
    match played {
        Ok(mut fleet) => {
            fleet.shutdown().await;
            if !options.no_baselines {
                baselines(cluster, &bed, options, &mut remote, progress).await;
            }
            result.remote = Some(remote);
            bed.stop();
            Ok(fleet)
        }
        Err(e) => {
            bed.stop();
            Err(e)
        }
    }
}

/// The fleet's part: the burst, the idle window, the steady edits and the drift repairs.
async fn play(
    setting: &Setting<'_>,
    bed: &TestBed,
    result: &mut RunResult,
    remote: &mut Remote,
    progress: &Progress,
) -> anyhow::Result<Fleet> {
    let options = setting.options;
    let replicas = *options.replicas.last().context("--replicas is empty")?;
    let mut phase =
        Phase::start(setting.cluster, options, "mm", replicas, progress.clone()).await?;
    result.environment.replicas = replicas;
    remote.replicas = replicas;
    let (burst, load) = burst(setting, bed, &phase, remote.manifests as usize).await?;
    remote.burst = burst;
    progress.say(format!(
        "remote: {} Manifests on {} targets all Ready in {:.1} s ({:.1}/s), {:.1} requests and {:.1} connections per target",
        remote.manifests,
        remote.targets,
        remote.burst.ready.all_ready_seconds,
        remote.burst.ready.per_second,
        remote.burst.requests_per_target.mean,
        remote.burst.connections_opened_per_target.mean,
    ));
    if options.idle_seconds > 0 {
        remote.idle = Some(idle(setting, bed, &phase).await?);
    }
    let blackholed = |name: &str| name.starts_with(BLACKHOLED_PREFIX);
    let mut edited = std::collections::BTreeSet::new();
    if options.edits > 0 {
        let progress = &phase.progress;
        let played = steady::run(&load, &phase.fleet, options, &blackholed, progress).await?;
        remote.steady = Some(played.0);
        edited.extend(played.1);
    }
    if options.drift_changes > 0 {
        // Not the edited ones: their drift schedule restarted with the edit.
        let skipped = |name: &str| blackholed(name) || edited.contains(name);
        let progress = &phase.progress;
        let drift = drift::run(&load, bed, options, &skipped, progress);
        remote.drift = Some(drift.await?);
    }
    if options.cold_restart {
        remote.cold_restart = Some(cold_restart(setting, bed, &mut phase, &load).await?);
    }
    // Still Ready: with short-lived tokens, only if every renewal reached the fleet in time.
    let not_ready = still_not_ready(&load).await?;
    remote.not_ready_at_end = Some(not_ready.len() as u64);
    let violations = not_ready
        .into_iter()
        .map(|detail| Violation {
            checker: "not-converged".into(),
            detail: format!("not Ready when the fleet's part ended: {detail}"),
        })
        .collect();
    phase.finish(options, result, violations).await
}

/// The Manifests not Ready at their generation, looked at for up to a minute (a pass may be
/// retrying a passing error); those of blackholed targets are not expected to be.
async fn still_not_ready(load: &Load) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut not_ready = load.not_ready().await?;
        not_ready.retain(|detail| !detail.starts_with(BLACKHOLED_PREFIX));
        if not_ready.is_empty() || Instant::now() > deadline {
            return Ok(not_ready);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The name prefix of the Manifests of blackholed targets (their number still names their
/// target, `RemoteShape::target_of`).
const BLACKHOLED_PREFIX: &str = "bh";

/// Every target's Manifests created at once, timed until all are Ready but those of the
/// blackholed targets (the last `--blackholed-targets`), which are created untracked just before.
async fn burst(
    setting: &Setting<'_>,
    bed: &TestBed,
    phase: &Phase,
    count: usize,
) -> anyhow::Result<(RemoteBurst, Load)> {
    let options = setting.options;
    let blackholed = blackholed(options);
    for index in options.targets - blackholed..options.targets {
        bed.proxy.blackhole(index, true);
    }
    let timed_count = count - blackholed * options.modules_per_target;
    let client = setting.cluster.client().await?;
    let namespace = phase::new_namespace(setting.cluster, &client, "remote").await?;
    bed.put_secrets(&client, &namespace).await?;
    bed.renew_tokens(
        client.clone(),
        namespace.clone(),
        options.target_token_seconds,
    );
    let load = phase::burst_load(
        &phase.fleet,
        options,
        client,
        &namespace,
        Some(RemoteShape {
            modules_per_target: options.modules_per_target,
        }),
    )?;
    phase::wait_idle(&phase.probe, &phase.progress).await;
    let window = mttp::open_window(setting, phase).await?;
    let marks = TargetRequests::mark(bed);
    let opened = bed.proxy.opened();
    let limit = mttp::burst_limit(options.settle_seconds, timed_count);
    for n in timed_count + 1..=count {
        load.create_untracked(&format!("{BLACKHOLED_PREFIX}{n:06}"))
            .await
            .context("a Manifest of a blackholed target")?;
    }
    let timed = phase::timed_load_burst(&load, &phase.fleet, timed_count, limit, namespace)
        .await
        .context("the remote burst")?;
    let measured = mttp::close_window(setting, phase, window).await?;
    // Per target: the answering ones (the blackholed are the last).
    let answering = options.targets - blackholed;
    let mut requests = marks.read(bed).await?;
    requests.truncate(answering);
    let mut opened_now = bed.proxy.opened();
    opened_now.truncate(answering);
    let mut open_now = bed.proxy.open();
    open_now.truncate(answering);
    let gauges = replica_gauges(&phase.probe).await;
    let burst = RemoteBurst {
        ready: timed.ready_timing(),
        fleet_cpu_seconds: measured.fleet_cpu,
        peak_rss_mib: measured.peak_rss_mib,
        sockets: sockets(&phase.probe).await,
        requests_per_target: spread(requests.iter().map(|r| r.total as f64)),
        writes_per_target: spread(requests.iter().map(writes)),
        requests_by_verb: by_verb(&requests),
        requests_by_request: by_request(&requests),
        connections_opened_per_target: spread(increase(&opened, &opened_now)),
        connections_open_per_target: spread(open_now.into_iter().map(|n| n as f64)),
        blackholed_targets: blackholed as u64,
        target_passes_held_max: gauges.held_max,
        target_passes_parked: gauges.parked,
        target_clients: gauges.clients,
    };
    Ok((burst, load))
}

/// `--blackholed-targets`, leaving at least one target answering.
fn blackholed(options: &Options) -> usize {
    options
        .blackholed_targets
        .min(options.targets.saturating_sub(1))
}

/// Per replica, from its metrics.
#[derive(Default)]
struct ReplicaGauges {
    /// The most passes one target held at once.
    held_max: BTreeMap<String, u64>,
    /// Passes that found their target busy.
    parked: BTreeMap<String, u64>,
    /// Target clients cached: the clusters it holds.
    clients: BTreeMap<String, u64>,
}

async fn replica_gauges(probe: &Probe) -> ReplicaGauges {
    let mut gauges = ReplicaGauges::default();
    for ordinal in probe.ordinals().await.unwrap_or_default() {
        let Ok(text) = probe.scrape(ordinal).await else {
            continue;
        };
        let samples = crate::measure::parse_prometheus(&text);
        let member = probe.member(ordinal);
        let value = |name| crate::measure::sum(&samples, name, &[]) as u64;
        gauges.held_max.insert(
            member.clone(),
            value("module_manager_target_passes_held_max"),
        );
        let parked = value("module_manager_target_passes_parked_total");
        gauges.parked.insert(member.clone(), parked);
        gauges
            .clients
            .insert(member, value("module_manager_target_clients"));
    }
    gauges
}

/// Every replica stopped and started again, timed until each Manifest had a pass in the new
/// processes; with what that cost each target (a new process has no apply records, so its
/// first pass of a Manifest applies its objects).
async fn cold_restart(
    setting: &Setting<'_>,
    bed: &TestBed,
    phase: &mut Phase,
    load: &Load,
) -> anyhow::Result<RemoteColdRestart> {
    let uids = mttp::uids_of(load.api()).await?;
    phase::wait_idle(&phase.probe, &phase.progress).await;
    let marks = TargetRequests::mark(bed);
    let opened = bed.proxy.opened();
    let restart = mttp::cold_restart(setting, phase, uids, "remote").await?;
    let answering = setting.options.targets - blackholed(setting.options);
    let mut requests = marks.read(bed).await?;
    requests.truncate(answering);
    let mut opened_now = bed.proxy.opened();
    opened_now.truncate(answering);
    phase.progress.say(format!(
        "remote: cold restart: every Manifest checked again after {} s",
        restart
            .all_checked_seconds
            .map_or_else(|| "(not all)".to_owned(), |s| format!("{s:.1}"))
    ));
    Ok(RemoteColdRestart {
        restart,
        requests_per_target: spread(requests.iter().map(|r| r.total as f64)),
        writes_per_target: spread(requests.iter().map(writes)),
        requests_by_request: by_request(&requests),
        connections_opened_per_target: spread(increase(&opened, &opened_now)),
        target_clients: replica_gauges(&phase.probe).await.clients,
    })
}

/// The fleet idle for `--idle-seconds` with every Manifest Ready.
async fn idle(setting: &Setting<'_>, bed: &TestBed, phase: &Phase) -> anyhow::Result<RemoteIdle> {
    let seconds = setting.options.idle_seconds;
    phase
        .progress
        .say(format!("remote: the fleet idle for {seconds} s"));
    phase::wait_idle(&phase.probe, &phase.progress).await;
    phase.sampler.event("idle");
    let window = mttp::open_window(setting, phase).await?;
    let marks = TargetRequests::mark(bed);
    let opened = bed.proxy.opened();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let measured = mttp::close_window(setting, phase, window).await?;
    // Per target: the answering ones (the blackholed are the last).
    let answering = setting.options.targets - blackholed(setting.options);
    let mut requests = marks.read(bed).await?;
    requests.truncate(answering);
    let mut opened_now = bed.proxy.opened();
    opened_now.truncate(answering);
    let minutes = measured.seconds / 60.0;
    Ok(RemoteIdle {
        seconds: measured.seconds,
        drift_interval: setting.options.drift_interval.clone(),
        requests_per_target_per_minute: spread(requests.iter().map(|r| r.total as f64 / minutes)),
        writes: requests.iter().map(writes).sum::<f64>() as u64,
        requests_by_verb: by_verb(&requests),
        requests_by_request: by_request(&requests),
        connections_opened_per_target: spread(increase(&opened, &opened_now)),
        fleet_cores: measured.fleet_cpu / measured.seconds,
        peak_rss_mib: measured.peak_rss_mib,
    })
}

/// The bare clients on the same targets, with the fleet stopped: the objects' applies alone,
/// then with the Manifest's minimum writes on the local cluster.
async fn baselines(
    cluster: &Cluster<'_>,
    bed: &TestBed,
    options: &Options,
    remote: &mut Remote,
    progress: &Progress,
) {
    let parallelism = remote.replicas as usize * options.concurrency;
    let template = match template(options).await {
        Ok(template) => template,
        Err(e) => {
            progress.say(format!("baseline failed: {e:#}"));
            remote.bare_error = Some(format!("{e:#}"));
            return;
        }
    };
    let targets = &bed.targets[..bed.targets.len() - blackholed(options)];
    let modules = options.modules_per_target;
    progress.say(format!(
        "baseline: a bare client per target applying {modules} releases each, {parallelism} targets at once"
    ));
    match bare::apply(targets, &template, modules, parallelism, None).await {
        Ok(burst) => remote.bare = Some(burst),
        Err(e) => {
            progress.say(format!("baseline failed: {e:#}"));
            remote.bare_error = Some(format!("{e:#}"));
        }
    }
    progress.say(format!(
        "baseline: the same with the Manifest's minimum writes on the local cluster, {parallelism} targets at once"
    ));
    let with_writes = async {
        let client = cluster.client().await?;
        let namespace = phase::new_namespace(cluster, &client, "remote-writes").await?;
        let chart = phase::chart_spec(options)?;
        let labels = BTreeMap::from([("loadtest-run".to_owned(), namespace.clone())]);
        let writes = bare::ManifestWrites {
            local: crate::manifest_writes::LocalWrites::new(&client, &namespace),
            chart: &chart,
            interval: &options.drift_interval,
            labels: &labels,
        };
        bare::apply(targets, &template, modules, parallelism, Some(&writes)).await
    };
    match with_writes.await {
        Ok(burst) => remote.bare_with_manifest_writes = Some(burst),
        Err(e) => {
            progress.say(format!("baseline with the Manifest's writes failed: {e:#}"));
            remote.bare_with_manifest_writes_error = Some(format!("{e:#}"));
        }
    }
    let rate = |b: &Option<crate::results::Burst>| b.as_ref().map(|b| b.per_second);
    let over = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let (fleet, minimum) = (
        Some(remote.burst.ready.per_second),
        rate(&remote.bare_with_manifest_writes),
    );
    remote.fleet_over_bare = over(fleet, rate(&remote.bare));
    remote.fleet_over_minimum = over(fleet, minimum);
    remote.minimum_over_bare = over(minimum, rate(&remote.bare));
}

/// The chart's objects rendered once, as the baselines apply them per release.
async fn template(options: &Options) -> anyhow::Result<Vec<serde_json::Value>> {
    let chart = phase::repo(options).join(&options.chart);
    let helm = testenv::Tools::locate()?.helm;
    crate::baseline::render_chart(
        &helm,
        &chart,
        crate::baseline::TEMPLATE_RELEASE,
        "template",
        &json!({"revision": 0}),
    )
    .await
}

/// Where the targets' API servers' audit logs end.
struct TargetRequests {
    marks: Vec<u64>,
}

impl TargetRequests {
    fn mark(bed: &TestBed) -> Self {
        Self {
            marks: audit_logs(bed).iter().map(AuditLog::mark).collect(),
        }
    }

    /// The fleet's requests on each target (in the order of `bed.targets`) since the marks.
    async fn read(self, bed: &TestBed) -> anyhow::Result<Vec<ClientRequests>> {
        // The API servers write their audit events in batches within a second.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut by_user = BTreeMap::new();
        for (log, mark) in audit_logs(bed).iter().zip(self.marks) {
            by_user.append(&mut audit::operator_requests_by_user(
                &log.text_since(mark)?,
            ));
        }
        Ok(bed
            .targets
            .iter()
            .map(|t| by_user.get(&t.user).cloned().unwrap_or_default())
            .collect())
    }
}

fn audit_logs(bed: &TestBed) -> Vec<AuditLog> {
    bed.apiservers
        .iter()
        .filter_map(|cp| cp.audit_log())
        .map(|path| AuditLog::new(&path))
        .collect()
}

fn writes(requests: &ClientRequests) -> f64 {
    ["create", "update", "patch", "delete", "deletecollection"]
        .iter()
        .filter_map(|verb| requests.by_verb.get(*verb))
        .sum::<u64>() as f64
}

/// All targets' requests by verb and resource.
fn by_request(requests: &[ClientRequests]) -> BTreeMap<String, u64> {
    let mut total = BTreeMap::new();
    for r in requests {
        for (request, n) in &r.by_request {
            *total.entry(request.clone()).or_default() += n;
        }
    }
    total
}

fn by_verb(requests: &[ClientRequests]) -> BTreeMap<String, u64> {
    let mut total = BTreeMap::new();
    for r in requests {
        for (verb, n) in &r.by_verb {
            *total.entry(verb.clone()).or_default() += n;
        }
    }
    total
}

fn increase(before: &[u64], after: &[u64]) -> Vec<f64> {
    after
        .iter()
        .enumerate()
        .map(|(i, a)| a.saturating_sub(before.get(i).copied().unwrap_or(0)) as f64)
        .collect()
}

/// Mean, least, median, p99 and most of per-target values.
pub fn spread(values: impl IntoIterator<Item = f64>) -> Spread {
    let values: Vec<f64> = values.into_iter().collect();
    let q = crate::measure::quantiles(&values);
    Spread {
        mean: values.iter().sum::<f64>() / values.len().max(1) as f64,
        min: values.iter().copied().reduce(f64::min),
        p50: q.p50,
        p99: q.p99,
        max: q.max,
    }
}

/// Open sockets of each local replica (`/proc/<pid>/fd`): its connections to the targets, to
/// its own API server, its listeners.
async fn sockets(probe: &Probe) -> BTreeMap<String, u64> {
    let mut sockets = BTreeMap::new();
    for ordinal in probe.ordinals().await.unwrap_or_default() {
        let Some(pid) = probe.pid(ordinal) else {
            continue;
        };
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let count = entries
            .flatten()
            .filter(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|link| link.to_string_lossy().starts_with("socket:"))
            })
            .count();
        sockets.insert(probe.member(ordinal), count as u64);
    }
    sockets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_counts_every_target() {
        let s = spread([0.0, 0.0, 3.0, 1.0]);
        assert_eq!(s.mean, 1.0);
        assert_eq!(s.max, Some(3.0));
        assert_eq!(s.min, Some(0.0));
        assert_eq!(s.p50, Some(0.0));
        let none = spread([]);
        assert_eq!(none.mean, 0.0);
        assert_eq!(none.max, None);
    }

    #[test]
    fn writes_are_the_mutating_verbs() {
        let requests = ClientRequests {
            total: 6,
            by_verb: [("get", 2), ("list", 1), ("patch", 2), ("delete", 1)]
                .map(|(v, n)| (v.to_owned(), n))
                .into(),
            by_resource: BTreeMap::new(),
            by_request: BTreeMap::new(),
        };
        assert_eq!(writes(&requests), 3.0);
    }
}
