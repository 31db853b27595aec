//! `mttp`: Flux's "Mean Time To Production" benchmark shape (fluxcd/flux-benchmark: N Helm
//! releases of podinfo applied at once, time until all are reconciled, peak memory), on our
//! fleet. For every fleet size of `--replicas` (and one replica, for the baseline), every burst
//! size of `--manifests` is created at once and timed until all are Ready, with its cost: CPU
//! of the replicas' process trees (the renderer and helm included), API requests (every client,
//! and the fleet's own from the audit log), reconcile passes, peak memory per replica. Then the
//! baselines without a fleet (bare server-side apply, `helm upgrade --install`) at every burst
//! size, and the ratios. Optionally the last fleet idle for `--idle-seconds` and a cold restart
//! of it (`--cold-restart`). See `docs/loadtest.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use module_manager::api::Manifest;

use crate::audit::{self, AuditLog, ClientRequests};
use crate::fleet::{Fleet, Probe};
use crate::manifest_writes::Writes;
use crate::measure;
use crate::options::Options;
use crate::phase::{self, Cluster, Phase};
use crate::progress::Progress;
use crate::results::{
    ColdRestart, GateOutcome, IdleFigures, Mttp, MttpBaseline, MttpBurst, MttpRatio,
    PATH_BARE_APPLY, PATH_HELM, PATH_MANIFEST_WRITES, PATH_MINIMUM_WRITES, RunResult,
};

/// The fleet sizes to measure, in order: one replica first when the baselines run and the list
/// has none (the single-replica baseline), then `--replicas` as given. The last is the fleet
/// under test.
pub fn fleet_sizes(replicas: &[u32], baselines: bool) -> Vec<u32> {
    let mut sizes = Vec::new();
    if baselines && !replicas.contains(&1) {
        sizes.push(1);
    }
    sizes.extend_from_slice(replicas);
    sizes
}

/// How long a burst of `count` may take to be all Ready: `--settle-seconds` plus 0.2 s per
/// Manifest.
pub fn burst_limit(settle_seconds: u64, count: usize) -> Duration {
    Duration::from_secs(settle_seconds) + Duration::from_millis(200 * count as u64)
}

/// `spec.interval` as seconds (`90s`, `10m`, `1h`, `1h30m`); `None` if it does not parse.
pub fn interval_seconds(interval: &str) -> Option<u64> {
    let mut total = 0;
    let mut number = String::new();
    for c in interval.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            _ => return None,
        };
        total += number.parse::<u64>().ok()? * unit;
        number.clear();
    }
    number.is_empty().then_some(total)
}

/// What the run needs besides the options: the audit log and the control plane's processes.
pub(crate) struct Setting<'a> {
    pub(crate) cluster: &'a Cluster<'a>,
    pub(crate) options: &'a Options,
    pub(crate) audit: Option<AuditLog>,
    pub(crate) control_plane: Vec<u32>,
}

/// Plays `mttp`; fills `result.mttp` and the phases' common figures (those of the last fleet).
/// Returns the last fleet, already stopped.
pub async fn run(
    cluster: &Cluster<'_>,
    options: &Options,
    result: &mut RunResult,
    progress: &Progress,
) -> anyhow::Result<Fleet> {
    anyhow::ensure!(!options.manifests.is_empty(), "--manifests is empty");
    let (audit, control_plane): (Option<AuditLog>, Vec<u32>) = match cluster {
        Cluster::Local(cp) => (
            cp.audit_log().map(|p| AuditLog::new(&p)),
            phase::control_plane_pids(cp),
        ),
        Cluster::Deployed { .. } => (None, Vec::new()),
    };
    let setting = Setting {
        cluster,
        options,
        audit,
        control_plane,
    };
    let baselines = !options.no_baselines;
    let sizes = fleet_sizes(&options.replicas, baselines);
    let mut mttp = Mttp::default();
    let mut last: Option<Fleet> = None;
    for (i, replicas) in sizes.iter().copied().enumerate() {
        if let Some(mut fleet) = last.take() {
            fleet.shutdown().await;
        }
        let before = result.violations.len();
        let mut phase = Phase::start(
            cluster,
            options,
            &format!("mm{i}"),
            replicas,
            progress.clone(),
        )
        .await?;
        result.environment.replicas = replicas;
        let mut namespaces = Vec::new();
        for &count in &options.manifests {
            let (measured, namespace) = burst(&setting, &phase, count, &mttp.bursts).await?;
            progress.say(describe(&measured));
            mttp.bursts.push(measured);
            namespaces.push(namespace);
        }
        if i + 1 == sizes.len() {
            after_the_bursts(&setting, &mut phase, &namespaces, &mut mttp).await?;
        }
        last = Some(phase.finish(options, result, Vec::new()).await?);
        for v in &mut result.violations[before..] {
            v.detail = format!("[{replicas} replicas] {}", v.detail);
        }
    }
    let mut fleet = last.context("no fleet size given")?;
    fleet.shutdown().await;
    if baselines {
        let under_test = *options.replicas.last().context("--replicas is empty")?;
        for &count in &options.manifests {
            mttp.baselines
                .push(baseline(&setting, count, under_test, progress).await);
        }
    }
    mttp.ratios = ratios(&mttp, *options.replicas.last().unwrap_or(&1));
    if let Some(path) = &options.gate {
        anyhow::ensure!(
            !options.gate_update || result.violations.is_empty(),
            "--gate-update: the run failed its checks, so its counters are no baseline"
        );
        let outcome = gate(path, options.gate_update, &mttp.bursts)?;
        let detail = |f: &String| format!("{f} (against {})", outcome.baseline);
        result
            .violations
            .extend(outcome.findings.iter().map(|f| crate::results::Violation {
                checker: "counter-regression".into(),
                detail: detail(f),
            }));
        mttp.gate = Some(outcome);
    }
    result.mttp = Some(mttp);
    Ok(fleet)
}

/// `--gate`: the bursts' counters compared with the baseline in `path`, or written to it.
fn gate(path: &std::path::Path, update: bool, bursts: &[MttpBurst]) -> anyhow::Result<GateOutcome> {
    let shown = path.display().to_string();
    if update {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let baseline = crate::gate::baseline_of(bursts, &crate::gate::command_line(&args));
        let text = serde_json::to_string_pretty(&baseline)? + "\n";
        std::fs::write(path, text).with_context(|| format!("write the gate's baseline {shown}"))?;
        let counters = baseline.bursts.values().map(BTreeMap::len).sum();
        return Ok(GateOutcome {
            baseline: shown,
            updated: true,
            counters,
            findings: Vec::new(),
        });
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("read the gate's baseline {shown}"))?;
    let baseline: crate::gate::Baseline = serde_json::from_str(&text)
        .with_context(|| format!("parse the gate's baseline {shown}"))?;
    let findings = crate::gate::compare(&baseline, bursts)
        .map_err(|e| anyhow::anyhow!("the gate's baseline {shown}: {e}"))?;
    Ok(GateOutcome {
        baseline: shown,
        updated: false,
        counters: baseline.bursts.values().map(BTreeMap::len).sum(),
        findings: findings.iter().map(ToString::to_string).collect(),
    })
}

/// The idle window and the cold restart, on the last fleet.
async fn after_the_bursts(
    setting: &Setting<'_>,
    phase: &mut Phase,
    namespaces: &[String],
    mttp: &mut Mttp,
) -> anyhow::Result<()> {
    let held: u64 = setting.options.manifests.iter().sum::<usize>() as u64;
    if setting.options.idle_seconds > 0 {
        mttp.idle = Some(idle(setting, phase, held).await?);
    }
    if setting.options.cold_restart {
        let uids = manifest_uids(setting, namespaces).await?;
        mttp.cold_restart = Some(cold_restart(setting, phase, uids, "mttp").await?);
    }
    Ok(())
}

fn describe(b: &MttpBurst) -> String {
    format!(
        "mttp: {} Manifests on {} replicas all Ready in {:.1} s ({:.1}/s); {:.3} CPU-s, {:.1} API requests ({}) per Manifest",
        b.manifests,
        b.replicas,
        b.ready.all_ready_seconds,
        b.ready.per_second,
        b.cpu_seconds_per_manifest,
        b.api_requests_per_manifest,
        b.operator_requests_per_manifest
            .map_or("fleet: –".into(), |r| format!("fleet {r:.1}")),
    )
}

/// The replicas' counters a window reads: passes, renders, Manifests received by the watches,
/// fence lapses.
const PASSES: &str = "module_manager_reconcile_passes_total";
const RENDERS: &str = "module_manager_render_cache_misses_total";
const WATCH_EVENTS: &str = "module_manager_manifest_watch_events_total";
const FENCE_LAPSES: &str = "module_manager_fence_lapses_total";
const FLEET_COUNTERS: [&str; 4] = [PASSES, RENDERS, WATCH_EVENTS, FENCE_LAPSES];

/// The replicas at one moment: CPU of their process trees summed, reconcile passes summed,
/// RSS per replica (MiB).
#[derive(Debug, Default)]
struct Reading {
    cpu: f64,
    /// [`FLEET_COUNTERS`] summed over the replicas.
    counters: BTreeMap<&'static str, f64>,
    /// Replicas whose metrics could not be read (their counters are missing from the sums).
    scrape_failures: u32,
    rss_mib: BTreeMap<String, f64>,
}

async fn read_fleet(probe: &Probe) -> Reading {
    let mut reading = Reading::default();
    for ordinal in probe.ordinals().await.unwrap_or_default() {
        let samples = probe
            .scrape(ordinal)
            .await
            .ok()
            .map(|text| measure::parse_prometheus(&text));
        if let Some(samples) = &samples {
            for name in FLEET_COUNTERS {
                *reading.counters.entry(name).or_default() += measure::sum(samples, name, &[]);
            }
        } else {
            reading.scrape_failures += 1;
        }
        if let Some((cpu, rss)) = probe.usage(ordinal, samples.as_deref()) {
            reading.cpu += cpu;
            reading
                .rss_mib
                .insert(probe.member(ordinal), rss / (1024.0 * 1024.0));
        }
    }
    reading
}

fn control_plane_cpu(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|pid| test_support::fleet::proc_usage(*pid))
        .map(|(cpu, _)| cpu)
        .sum()
}

/// Where a measurement window starts.
pub(crate) struct Window {
    started: Instant,
    fleet: Reading,
    control_plane: f64,
    apiserver: Vec<measure::PromSample>,
    audit: Option<u64>,
    /// Per replica, how many RSS samples the sampler had.
    rss_samples: BTreeMap<String, usize>,
}

/// What happened in a window.
pub(crate) struct Measured {
    pub(crate) seconds: f64,
    pub(crate) fleet_cpu: f64,
    pub(crate) control_plane_cpu: f64,
    /// Increase of each of [`FLEET_COUNTERS`] over the window.
    pub(crate) counters: BTreeMap<&'static str, f64>,
    pub(crate) scrape_failures: u32,
    pub(crate) apiserver: (Vec<measure::PromSample>, Vec<measure::PromSample>),
    pub(crate) clients: Option<BTreeMap<String, ClientRequests>>,
    pub(crate) peak_rss_mib: BTreeMap<String, f64>,
}

impl Measured {
    /// The increase of one of [`FLEET_COUNTERS`].
    fn counter(&self, name: &str) -> f64 {
        self.counters.get(name).copied().unwrap_or(0.0)
    }
}

pub(crate) async fn open_window(setting: &Setting<'_>, phase: &Phase) -> anyhow::Result<Window> {
    let client = setting.cluster.client().await?;
    Ok(Window {
        fleet: read_fleet(&phase.probe).await,
        control_plane: control_plane_cpu(&setting.control_plane),
        apiserver: phase::apiserver_metrics(&client).await?,
        audit: setting.audit.as_ref().map(AuditLog::mark),
        rss_samples: phase
            .sampler
            .observed
            .lock()
            .unwrap()
            .rss_mib
            .iter()
            .map(|(m, v)| (m.clone(), v.len()))
            .collect(),
        started: Instant::now(),
    })
}

pub(crate) async fn close_window(
    setting: &Setting<'_>,
    phase: &Phase,
    window: Window,
) -> anyhow::Result<Measured> {
    let seconds = window.started.elapsed().as_secs_f64();
    let fleet = read_fleet(&phase.probe).await;
    let control_plane = control_plane_cpu(&setting.control_plane);
    let client = setting.cluster.client().await?;
    let apiserver = phase::apiserver_metrics(&client).await?;
    let mut peak_rss_mib = fleet.rss_mib.clone();
    for (member, samples) in &phase.sampler.observed.lock().unwrap().rss_mib {
        let from = window.rss_samples.get(member).copied().unwrap_or(0);
        let peak = samples.iter().skip(from).copied().fold(0.0, f64::max);
        let entry = peak_rss_mib.entry(member.clone()).or_default();
        *entry = entry.max(peak);
    }
    let clients = match (&setting.audit, window.audit) {
        (Some(log), Some(mark)) => {
            // The API server writes its audit events in batches within a second.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Some(log.since(mark)?)
        }
        _ => None,
    };
    Ok(Measured {
        seconds,
        fleet_cpu: (fleet.cpu - window.fleet.cpu).max(0.0),
        control_plane_cpu: control_plane - window.control_plane,
        counters: FLEET_COUNTERS
            .into_iter()
            .map(|name| {
                let before = window.fleet.counters.get(name).copied().unwrap_or(0.0);
                let after = fleet.counters.get(name).copied().unwrap_or(0.0);
                (name, (after - before).max(0.0))
            })
            .collect(),
        scrape_failures: fleet.scrape_failures + window.fleet.scrape_failures,
        apiserver: (window.apiserver, apiserver),
        clients,
        peak_rss_mib,
    })
}

/// A client's requests divided by `by` (per Manifest, per second): total, by verb, by resource.
fn divided(
    requests: Option<&ClientRequests>,
    by: f64,
) -> (f64, BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let requests = requests.cloned().unwrap_or_default();
    let per = |map: BTreeMap<String, u64>| {
        map.into_iter()
            .map(|(k, v)| (k, v as f64 / by))
            .collect::<BTreeMap<_, _>>()
    };
    (
        requests.total as f64 / by,
        per(requests.by_verb),
        per(requests.by_resource),
    )
}

fn totals(clients: &BTreeMap<String, ClientRequests>) -> BTreeMap<String, u64> {
    clients.iter().map(|(c, r)| (c.clone(), r.total)).collect()
}

/// One burst of `count` on the phase's fleet, measured; returns it and its namespace.
async fn burst(
    setting: &Setting<'_>,
    phase: &Phase,
    count: usize,
    earlier: &[MttpBurst],
) -> anyhow::Result<(MttpBurst, String)> {
    let options = setting.options;
    let replicas = phase.replicas;
    phase.progress.say(format!(
        "mttp: {count} Manifests at once on {replicas} replicas"
    ));
    phase::wait_idle(&phase.probe, &phase.progress).await;
    let window = open_window(setting, phase).await?;
    let timed = phase::timed_burst(
        setting.cluster,
        options,
        &phase.fleet,
        count,
        &format!("mttp-{count}"),
        burst_limit(options.settle_seconds, count),
    )
    .await
    .with_context(|| format!("the burst of {count} on {replicas} replicas"))?;
    let measured = close_window(setting, phase, window).await?;
    let n = count.max(1) as f64;
    let api = phase::apiserver_figures(&measured.apiserver.0, &measured.apiserver.1, n);
    let operator = measured.clients.as_ref().map(|c| c.get(audit::OPERATOR));
    let (per, by_verb, by_resource) = divided(operator.flatten(), n);
    let held_before: u64 = earlier
        .iter()
        .filter(|b| b.replicas == replicas)
        .map(|b| b.manifests)
        .sum();
    let burst = MttpBurst {
        replicas,
        cpu_per_replica: options.cpu_per_replica,
        manifests: count as u64,
        manifests_held: held_before + count as u64,
        ready: timed.ready_timing(),
        fleet_cpu_seconds: measured.fleet_cpu,
        cpu_seconds_per_manifest: measured.fleet_cpu / n,
        control_plane_cpu_seconds_per_manifest: (!setting.control_plane.is_empty())
            .then(|| measured.control_plane_cpu / n),
        api_requests_per_manifest: api.requests_per_second,
        api_by_verb_per_manifest: api.by_verb,
        api_by_resource_per_manifest: api.by_resource,
        requests_by_client: measured.clients.as_ref().map(totals).unwrap_or_default(),
        operator_requests_per_manifest: operator.map(|_| per),
        operator_by_verb_per_manifest: by_verb,
        operator_by_resource_per_manifest: by_resource,
        operator_by_request_per_manifest: operator
            .flatten()
            .map(|r| {
                r.by_request
                    .iter()
                    .map(|(k, v)| (k.clone(), *v as f64 / n))
                    .collect()
            })
            .unwrap_or_default(),
        passes_per_manifest: measured.counter(PASSES) / n,
        renders_per_manifest: Some(measured.counter(RENDERS) / n),
        manifest_watch_events_per_manifest: Some(measured.counter(WATCH_EVENTS) / n),
        fence_lapses: measured.counter(FENCE_LAPSES) as u64,
        scrape_failures: measured.scrape_failures,
        peak_rss_mib: measured.peak_rss_mib,
    };
    Ok((burst, timed.namespace))
}

/// The fleet idle for `--idle-seconds`, all its Manifests Ready.
async fn idle(setting: &Setting<'_>, phase: &Phase, held: u64) -> anyhow::Result<IdleFigures> {
    let seconds = setting.options.idle_seconds;
    phase.progress.say(format!(
        "mttp: the fleet idle with {held} Manifests for {seconds} s"
    ));
    phase::wait_idle(&phase.probe, &phase.progress).await;
    phase.sampler.event("idle");
    let window = open_window(setting, phase).await?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let measured = close_window(setting, phase, window).await?;
    let api = phase::apiserver_figures(
        &measured.apiserver.0,
        &measured.apiserver.1,
        measured.seconds,
    );
    let operator = measured.clients.as_ref().map(|c| c.get(audit::OPERATOR));
    let (per, by_verb, by_resource) = divided(operator.flatten(), measured.seconds);
    Ok(IdleFigures {
        replicas: phase.replicas,
        manifests: held,
        drift_interval: setting.options.drift_interval.clone(),
        seconds: measured.seconds,
        api_requests_per_second: api.requests_per_second,
        operator_requests_per_second: operator.map(|_| per),
        operator_by_verb_per_second: by_verb,
        operator_by_resource_per_second: by_resource,
        requests_by_client: measured.clients.as_ref().map(totals).unwrap_or_default(),
        passes_per_second: measured.counter(PASSES) / measured.seconds,
        fleet_cores: measured.fleet_cpu / measured.seconds,
        peak_rss_mib: measured.peak_rss_mib,
    })
}

/// The UIDs of the Manifests in `namespaces`.
async fn manifest_uids(
    setting: &Setting<'_>,
    namespaces: &[String],
) -> anyhow::Result<BTreeSet<String>> {
    let client = setting.cluster.client().await?;
    let mut uids = BTreeSet::new();
    for namespace in namespaces {
        let api = Api::<Manifest>::namespaced(client.clone(), namespace);
        uids.append(&mut uids_of(&api).await?);
    }
    Ok(uids)
}

/// The UIDs of the Manifests `api` lists.
pub(crate) async fn uids_of(api: &Api<Manifest>) -> anyhow::Result<BTreeSet<String>> {
    let list = api
        .list(&ListParams::default())
        .await
        .context("list the Manifests")?;
    Ok(list.items.iter().filter_map(|m| m.uid()).collect())
}

/// Every replica stopped and started again; waits until every Manifest of `uids` has a
/// completed pass in the new processes' logs (or the limit passes). `scenario` names the
/// progress line.
pub(crate) async fn cold_restart(
    setting: &Setting<'_>,
    phase: &mut Phase,
    uids: BTreeSet<String>,
    scenario: &str,
) -> anyhow::Result<ColdRestart> {
    let count = uids.len();
    let limit = burst_limit(setting.options.settle_seconds, count).max(Duration::from_secs(
        interval_seconds(&setting.options.drift_interval).unwrap_or(600) + 60,
    ));
    phase.progress.say(format!(
        "{scenario}: cold restart of {} replicas holding {count} Manifests",
        phase.replicas
    ));
    let old_logs: BTreeSet<String> = phase.fleet.logs().await?.into_iter().map(|l| l.0).collect();
    phase.sampler.event("cold restart");
    let started = Instant::now();
    phase.fleet.restart_all().await?;
    phase.fleet.wait_ready(Duration::from_secs(300)).await?;
    let ready_seconds = started.elapsed().as_secs_f64();
    loop {
        let (checked, passes) = checked_since_restart(&phase.fleet, &old_logs, &uids).await?;
        let all = checked == count;
        if all || started.elapsed() > limit {
            return Ok(ColdRestart {
                replicas: phase.replicas,
                manifests: count as u64,
                ready_seconds,
                all_checked_seconds: all.then(|| started.elapsed().as_secs_f64()),
                checked: checked as u64,
                passes,
            });
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Manifests of `uids` with a completed pass in the logs not in `old_logs`, and the completed
/// passes there.
async fn checked_since_restart(
    fleet: &Fleet,
    old_logs: &BTreeSet<String>,
    uids: &BTreeSet<String>,
) -> anyhow::Result<(usize, u64)> {
    let mut checked = BTreeSet::new();
    let mut passes = 0;
    for (name, text) in fleet.logs().await? {
        if old_logs.contains(&name) {
            continue;
        }
        for pass in test_support::log_check::parse_passes(&text) {
            if pass.end.is_some() {
                passes += 1;
                if uids.contains(&pass.uid) {
                    checked.insert(pass.uid);
                }
            }
        }
    }
    Ok((checked.len(), passes))
}

/// The baselines without a fleet at one burst size; a failure is recorded, not fatal.
async fn baseline(
    setting: &Setting<'_>,
    count: usize,
    replicas: u32,
    progress: &Progress,
) -> MttpBaseline {
    let mut measured = MttpBaseline {
        manifests: count as u64,
        ..Default::default()
    };
    if let Err(e) = baselines(setting, count, replicas, progress, &mut measured).await {
        progress.say(format!("baseline of {count} failed: {e:#}"));
        measured.error = Some(format!("{e:#}"));
    }
    measured
}

/// Below this many cores (over one second) the control plane counts as quiet after a path.
const QUIET_CORES: f64 = 0.25;
/// The longest a path's CPU window waits for the control plane to quiet down.
const QUIET_LIMIT: Duration = Duration::from_secs(60);

/// Waits until the control plane (`pids`) used less than [`QUIET_CORES`] over the last second,
/// at most [`QUIET_LIMIT`]: the work a path leaves behind (kube-controller-manager's on the
/// Deployments it applied, the endpoints of its Services) counts to it, not to the next path —
/// as a fleet's window, which ends once every Deployment is rolled out, includes it.
async fn quiet(pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let started = Instant::now();
    let (mut cpu, mut at) = (control_plane_cpu(pids), Instant::now());
    while started.elapsed() < QUIET_LIMIT {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (now, now_at) = (control_plane_cpu(pids), Instant::now());
        if (now - cpu) / now_at.duration_since(at).as_secs_f64() < QUIET_CORES {
            return;
        }
        (cpu, at) = (now, now_at);
    }
}

/// Measures the paths in turn into `measured`: bare apply, bare apply with the Manifest's
/// writes, the fleet's and the minimum (local control planes: they leave Manifests with a
/// finalizer behind), helm; with the
/// control plane's CPU from a quiet start until it is quiet again after the path ([`quiet`]).
async fn baselines(
    setting: &Setting<'_>,
    count: usize,
    replicas: u32,
    progress: &Progress,
    measured: &mut MttpBaseline,
) -> anyhow::Result<()> {
    let paths =
        phase::BaselinePaths::new(setting.cluster, setting.options, count, replicas as usize)
            .await?;
    let pids = &setting.control_plane;
    let n = count.max(1) as f64;
    quiet(pids).await;
    let before = control_plane_cpu(pids);
    let (bare, objects) = paths.bare_apply(progress).await?;
    measured.objects_per_manifest = objects;
    measured.bare_apply = Some(bare);
    let mut spent = async |path: &str, before: f64| {
        quiet(pids).await;
        let after = control_plane_cpu(pids);
        if !pids.is_empty() {
            let per = &mut measured.control_plane_cpu_seconds_per_manifest;
            per.insert(path.to_owned(), (after - before) / n);
        }
        after
    };
    let mut before = spent(PATH_BARE_APPLY, before).await;
    if matches!(setting.cluster, Cluster::Local(_)) {
        let writes = paths.manifest_writes(Writes::Fleet, progress).await?;
        measured.bare_with_manifest_writes = Some(writes);
        before = spent(PATH_MANIFEST_WRITES, before).await;
        let minimum = paths.manifest_writes(Writes::Minimum, progress).await?;
        measured.bare_with_minimum_writes = Some(minimum);
        before = spent(PATH_MINIMUM_WRITES, before).await;
    }
    let helm = paths.helm(progress).await?;
    measured.helm = Some(helm);
    spent(PATH_HELM, before).await;
    Ok(())
}

/// Per burst size, the fleet under test (`replicas`) against one replica, bare apply and helm.
pub fn ratios(mttp: &Mttp, replicas: u32) -> Vec<MttpRatio> {
    let rate = |size: u32, count: u64| {
        mttp.bursts
            .iter()
            .find(|b| b.replicas == size && b.manifests == count)
            .map(|b| b.ready.per_second)
    };
    let mut counts: Vec<u64> = Vec::new();
    for b in &mttp.bursts {
        if !counts.contains(&b.manifests) {
            counts.push(b.manifests);
        }
    }
    counts
        .into_iter()
        .filter_map(|count| {
            let fleet = rate(replicas, count)?;
            let baseline = mttp.baselines.iter().find(|b| b.manifests == count);
            let over = |other: Option<f64>| other.filter(|o| *o > 0.0).map(|o| fleet / o);
            Some(MttpRatio {
                manifests: count,
                replicas,
                fleet_over_bare_apply: over(
                    baseline.and_then(|b| b.bare_apply.as_ref().map(|x| x.per_second)),
                ),
                fleet_over_manifest_writes: over(
                    baseline
                        .and_then(|b| b.bare_with_manifest_writes.as_ref().map(|x| x.per_second)),
                ),
                fleet_over_minimum_writes: over(
                    baseline
                        .and_then(|b| b.bare_with_minimum_writes.as_ref().map(|x| x.per_second)),
                ),
                fleet_over_single_replica: (replicas != 1).then(|| over(rate(1, count))).flatten(),
                fleet_over_helm: over(baseline.and_then(|b| b.helm.as_ref().map(|x| x.per_second))),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{Burst, ReadyTiming};

    #[test]
    fn one_replica_is_measured_first_for_the_baseline_unless_listed() {
        assert_eq!(fleet_sizes(&[3], true), vec![1, 3]);
        assert_eq!(fleet_sizes(&[1, 3], true), vec![1, 3]);
        assert_eq!(fleet_sizes(&[3], false), vec![3]);
    }

    #[test]
    fn intervals_parse_as_go_durations_do() {
        assert_eq!(interval_seconds("10m"), Some(600));
        assert_eq!(interval_seconds("1h30m"), Some(5400));
        assert_eq!(interval_seconds("45s"), Some(45));
        assert_eq!(interval_seconds("10"), None);
        assert_eq!(interval_seconds("1d"), None);
    }

    #[test]
    fn ratios_divide_the_fleet_under_test_by_each_path() {
        let burst = |replicas, manifests, per_second| MttpBurst {
            replicas,
            manifests,
            ready: ReadyTiming {
                per_second,
                ..Default::default()
            },
            ..Default::default()
        };
        let path = |per_second| {
            Some(Burst {
                per_second,
                ..Default::default()
            })
        };
        let mttp = Mttp {
            bursts: vec![
                burst(1, 100, 2.0),
                burst(1, 500, 1.0),
                burst(3, 100, 5.0),
                burst(3, 500, 3.0),
            ],
            baselines: vec![MttpBaseline {
                manifests: 100,
                bare_apply: path(10.0),
                helm: path(2.5),
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = ratios(&mttp, 3);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].fleet_over_bare_apply, Some(0.5));
        assert_eq!(r[0].fleet_over_single_replica, Some(2.5));
        assert_eq!(r[0].fleet_over_helm, Some(2.0));
        assert_eq!(r[1].fleet_over_single_replica, Some(3.0));
        assert_eq!(r[1].fleet_over_bare_apply, None, "no baseline at 500");
    }
}
