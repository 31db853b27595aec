//! `hostile`: issue 31's tenant isolation measured on whole Manifests. Per repeat, interleaved
//! arms on one fleet: `--innocents` Manifests created at once with no hostile chart, then the
//! same beside one Manifest of each `--hostile` chart sent just before them (a template
//! that never ends, a memory bomb, a 17 MB error, a 10 GB allocation), each arm in a fresh
//! namespace whose Manifests are deleted at its end. Per arm: whether every innocent became
//! Ready, their create→Ready p50/p99 and p99 ÷ the repeat's arm without a hostile chart, the
//! renderer children started, and the hostile Manifest's status, which must name its failure
//! ([`judge`]). See `docs/loadtest.md`.

pub mod judge;

use std::time::{Duration, Instant};

use anyhow::Context;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use module_manager::api::{Manifest, ManifestStatus};
use serde_json::json;

use crate::fleet::{Fleet, Probe};
use crate::load::{Load, ManifestShape};
use crate::measure;
use crate::mttp::burst_limit;
use crate::options::{HostileChart, Options};
use crate::phase::{self, Cluster, Phase};
use crate::progress::Progress;
use crate::results::{Hostile, HostileArm, RunResult};

/// The renderer's counters an arm reads.
const CHILD_STARTS: &str = "module_manager_render_child_starts_total";
const CHILD_RESENDS: &str = "module_manager_render_child_resends_total";

/// How often the hostile Manifest's status is read while waiting for it to name its failure.
const STATUS_POLL: Duration = Duration::from_millis(500);

/// Plays `hostile` on the last fleet size of `--replicas`; fills `result.hostile` and the
/// phase's common figures. Returns the fleet, already stopped.
pub async fn run(
    cluster: &Cluster<'_>,
    options: &Options,
    result: &mut RunResult,
    progress: &Progress,
) -> anyhow::Result<Fleet> {
    anyhow::ensure!(
        matches!(cluster, Cluster::Local(_)),
        "`hostile` needs a local fleet: its hostile charts are path charts under the repository \
         (tests/fixtures/charts), the local replicas' chart root; a deployed fleet's chart root \
         does not hold them"
    );
    anyhow::ensure!(options.innocents > 0, "--innocents must be at least 1");
    let replicas = *options.replicas.last().context("--replicas is empty")?;
    let phase = Phase::start(cluster, options, "mm", replicas, progress.clone()).await?;
    result.environment.replicas = replicas;
    let mut hostile = Hostile {
        replicas,
        innocents: options.innocents as u64,
        chart: result.environment.chart.clone(),
        repeats: options.repeats,
        hostile_seconds: options.hostile_seconds,
        arms: Vec::new(),
    };
    let limit = burst_limit(options.settle_seconds, options.innocents);
    let mut violations = Vec::new();
    for repeat in 1..=options.repeats {
        let charts = std::iter::once(None).chain(options.hostile.iter().copied().map(Some));
        for chart in charts {
            let played = arm(cluster, options, &phase, repeat, chart, limit).await?;
            progress.say(describe(&played));
            violations.extend(judge::violations(&played, limit.as_secs()));
            hostile.arms.push(played);
        }
    }
    judge::set_ratios(&mut hostile.arms);
    result.hostile = Some(hostile);
    phase.finish(options, result, violations).await
}

fn describe(arm: &HostileArm) -> String {
    let status = arm.hostile_status.as_ref().map_or(String::new(), |s| {
        format!(
            "; the hostile Manifest {} its failure",
            if s.names_failure {
                "names"
            } else {
                "does NOT name"
            }
        )
    });
    format!(
        "hostile: {}: {}/{} innocents Ready, p99 {}, renderer starts {}{status}",
        judge::arm_name(arm),
        arm.innocents_ready,
        arm.innocents,
        arm.create_to_ready_seconds
            .p99
            .map_or("–".into(), |p| format!("{p:.2} s")),
        arm.renderer_starts.map_or("–".into(), |n| n.to_string()),
    )
}

/// One arm: the innocents and (with `chart`) one hostile Manifest, sent just before them, in
/// a new namespace; waits for the innocents, for the hostile status to name its failure
/// and for `--hostile-seconds`; then deletes the arm's Manifests.
async fn arm(
    cluster: &Cluster<'_>,
    options: &Options,
    phase: &Phase,
    repeat: u32,
    chart: Option<HostileChart>,
    limit: Duration,
) -> anyhow::Result<HostileArm> {
    let name = chart.map_or("none", HostileChart::name);
    phase.progress.say(format!(
        "hostile: repeat {repeat}: {} innocent Manifests beside {}",
        options.innocents,
        chart.map_or("no hostile chart".to_owned(), |c| format!(
            "the {} chart",
            c.name()
        ))
    ));
    phase::wait_idle(&phase.probe, &phase.progress).await;
    let client = cluster.client().await?;
    let namespace =
        phase::new_namespace(cluster, &client, &format!("hostile-{repeat}-{name}")).await?;
    let innocents = phase::burst_load(&phase.fleet, options, client.clone(), &namespace, None)?;
    let hostile = chart.map(|c| hostile_load(&phase.fleet, options, client.clone(), &namespace, c));
    phase.sampler.event(format!("repeat {repeat}: {name}"));
    let manifests: Api<Manifest> = Api::namespaced(client, &namespace);
    let before = renderer_counts(&phase.probe).await;
    let created = create_at_once(
        options,
        phase,
        &innocents,
        hostile.as_ref(),
        limit,
        namespace,
    )
    .await
    .with_context(|| format!("the innocents of repeat {repeat} beside {name}"))?;
    let hostile_status = match chart {
        Some(chart) => Some(watch_hostile(&manifests, chart, created.at, limit, options).await?),
        None => None,
    };
    let after = renderer_counts(&phase.probe).await;
    let seconds = created.at.elapsed().as_secs_f64();
    let increase = |i: usize| {
        before
            .zip(after)
            .map(|(b, a)| (a[i] - b[i]).max(0.0) as u64)
    };
    let not_deleted = delete_all(&manifests, limit).await?;
    Ok(HostileArm {
        repeat,
        hostile: chart.map(|c| c.name().to_owned()),
        innocents: options.innocents as u64,
        innocents_ready: created.latencies.len() as u64,
        not_ready: created.not_ready,
        create_to_ready_seconds: measure::quantiles(&created.latencies),
        p99_over_no_hostile: None,
        renderer_starts: increase(0),
        renders_resent: increase(1),
        seconds,
        hostile_status,
        not_deleted,
    })
}

/// What an arm's creates gave.
struct Created {
    /// When they were sent.
    at: Instant,
    /// Create → Ready of each innocent that became Ready.
    latencies: Vec<f64>,
    /// The innocents not Ready within the limit, with their state (at most 10).
    not_ready: Vec<String>,
}

/// `--innocents` Manifests of `innocents` created at once just after the one of `hostile`;
/// waits up to `limit` for the innocents to be Ready.
async fn create_at_once(
    options: &Options,
    phase: &Phase,
    innocents: &Load,
    hostile: Option<&(Load, HostileChart)>,
    limit: Duration,
    namespace: String,
) -> anyhow::Result<Created> {
    let mut at = None;
    let beside = async {
        at = Some(Instant::now());
        if let Some((load, chart)) = hostile {
            load.create_untracked(&hostile_name(*chart))
                .await
                .with_context(|| format!("create the {} Manifest", chart.name()))?;
        }
        Ok(())
    };
    let fleet = &phase.fleet;
    let (timed, outstanding) = phase::load_burst_beside(
        innocents,
        fleet,
        options.innocents,
        limit,
        namespace,
        beside,
    )
    .await?;
    let not_ready = if outstanding.is_empty() {
        Vec::new()
    } else {
        innocents.not_ready().await?.into_iter().take(10).collect()
    };
    Ok(Created {
        at: at.unwrap_or_else(Instant::now),
        latencies: timed.latencies,
        not_ready,
    })
}

fn hostile_name(chart: HostileChart) -> String {
    format!("hostile-{}", chart.name())
}

/// A load whose one Manifest installs `chart`, selected by the fleet but not by the
/// innocents' watch (its own label instead of `loadtest-run`).
fn hostile_load(
    fleet: &Fleet,
    options: &Options,
    client: kube::Client,
    namespace: &str,
    chart: HostileChart,
) -> (Load, HostileChart) {
    let mut labels = fleet.manifest_labels.clone();
    labels.insert("loadtest-hostile".into(), chart.name().into());
    let shape = ManifestShape {
        chart: json!({ "path": chart.path() }),
        interval: options.drift_interval.clone(),
        labels,
        remote: None,
    };
    (Load::new(client, namespace, "h", shape), chart)
}

/// Waits (up to `limit` from `created`) until the hostile Manifest's status names its
/// failure, then until `--hostile-seconds` from `created` have passed; reports its status at
/// the end.
async fn watch_hostile(
    manifests: &Api<Manifest>,
    chart: HostileChart,
    created: Instant,
    limit: Duration,
    options: &Options,
) -> anyhow::Result<crate::results::HostileStatus> {
    let name = hostile_name(chart);
    let read = async || -> anyhow::Result<Option<ManifestStatus>> {
        let manifest = manifests
            .get(&name)
            .await
            .with_context(|| format!("read the hostile Manifest {name}"))?;
        Ok(manifest.status)
    };
    let mut named_after = None;
    while created.elapsed() < limit {
        if judge::names_failure(chart, read().await?.as_ref()) {
            named_after = Some(created.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(STATUS_POLL).await;
    }
    let keep = Duration::from_secs(options.hostile_seconds);
    if let Some(left) = keep.checked_sub(created.elapsed()) {
        tokio::time::sleep(left).await;
    }
    Ok(judge::report(chart, read().await?.as_ref(), named_after))
}

/// [`CHILD_STARTS`] and [`CHILD_RESENDS`] summed over the replicas; `None` when a replica
/// could not be scraped or does not export them.
async fn renderer_counts(probe: &Probe) -> Option<[f64; 2]> {
    let mut counts = [0.0; 2];
    for ordinal in probe.ordinals().await.ok()? {
        let text = probe.scrape(ordinal).await.ok()?;
        let samples = measure::parse_prometheus(&text);
        for (i, name) in [CHILD_STARTS, CHILD_RESENDS].into_iter().enumerate() {
            if !samples.iter().any(|s| s.name == name) {
                return None;
            }
            counts[i] += measure::sum(&samples, name, &[]);
        }
    }
    Some(counts)
}

/// Deletes every Manifest of the arm's namespace and waits (up to `limit`) until they are
/// gone; returns those still there, with their state.
async fn delete_all(manifests: &Api<Manifest>, limit: Duration) -> anyhow::Result<Vec<String>> {
    manifests
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("delete the arm's Manifests")?;
    let deadline = Instant::now() + limit;
    loop {
        let left = manifests
            .list(&ListParams::default())
            .await
            .context("list the arm's Manifests")?;
        if left.items.is_empty() || Instant::now() > deadline {
            return Ok(left.items.iter().map(still_there).collect());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `name (state, finalizers)` of a Manifest that should be gone.
fn still_there(m: &Manifest) -> String {
    let state = m.status.as_ref().and_then(|s| s.state);
    format!(
        "{} ({state:?}, finalizers {:?})",
        m.name_any(),
        m.finalizers()
    )
}
