//! One run: set up a fleet and its load ([`Phase`]), play the scenario ([`crate::scenario`], or
//! the bursts of [`crate::mttp`], [`crate::remote`] or [`crate::hostile`]), wait for the last
//! effects, check, measure, run the baselines.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::fleet::Fleet;
use crate::options::{Options, Scenario};
use crate::phase::{
    BaselinePaths, Cluster, Phase, now_ts, repo, timed_burst, wait_assignment, wait_idle,
};
use crate::progress::Progress;
use crate::prometheus::{Monitor, verdict};
use crate::results::{Baselines, Burst, Environment, RunResult};
use crate::{hostile, mttp, remote, scenario};

/// Runs `scenario` on `cluster` and returns its result (not yet written anywhere).
pub async fn execute(
    scenario: Scenario,
    options: &Options,
    cluster: Cluster<'_>,
) -> anyhow::Result<RunResult> {
    let client = cluster.client().await?;
    let version = client.apiserver_version().await?;
    let first = *options.replicas.first().context("--replicas is empty")?;
    let mut result = RunResult {
        scenario: scenario.name().into(),
        started_at: now_ts().to_string(),
        parameters: serde_json::to_value(options)?,
        environment: Environment {
            target: match cluster {
                Cluster::Local(_) => "local".into(),
                Cluster::Deployed { .. } => "cluster".into(),
            },
            replicas: first,
            shards: options.shards,
            lease_duration_seconds: options.lease_duration_seconds as f64,
            cpu_limit_per_replica: options.cpu_per_replica,
            concurrency: options.concurrency,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            chart: options
                .chart_spec
                .clone()
                .unwrap_or_else(|| options.chart.clone()),
            kubernetes_version: version.git_version,
            module_manager_version: module_manager_version(),
        },
        ..Default::default()
    };
    let progress = Progress::new(options.quiet);
    let original_replicas = match &cluster {
        Cluster::Deployed { .. } => {
            let (namespace, name) = (&options.fleet_namespace, &options.statefulset);
            let statefulset = crate::fleet::read_statefulset(&client, namespace, name).await?;
            statefulset.spec.and_then(|s| s.replicas)
        }
        Cluster::Local(_) => None,
    };
    let fleet = if scenario == Scenario::ScaleOut {
        let mut last = None;
        for (i, replicas) in options.replicas.iter().enumerate() {
            if let Some(fleet) = last.take() {
                let mut fleet: Fleet = fleet;
                fleet.shutdown().await;
            }
            let before = result.violations.len();
            let phase = Phase::start(
                &cluster,
                options,
                &format!("mm{i}"),
                *replicas,
                progress.clone(),
            )
            .await?;
            result.environment.replicas = *replicas;
            let capacity = scenario::scale_out(&phase, options).await?;
            result.capacity.push(capacity);
            last = Some(phase.finish(options, &mut result, Vec::new()).await?);
            for v in &mut result.violations[before..] {
                v.detail = format!("[{replicas} replicas] {}", v.detail);
            }
        }
        last.context("no fleet size given")?
    } else if scenario == Scenario::Mttp {
        mttp::run(&cluster, options, &mut result, &progress).await?
    } else if scenario == Scenario::Remote {
        remote::run(&cluster, options, &mut result, &progress).await?
    } else if scenario == Scenario::Hostile {
        hostile::run(&cluster, options, &mut result, &progress).await?
    } else {
        let mut phase = Phase::start(&cluster, options, "mm", first, progress.clone()).await?;
        let local = matches!(cluster, Cluster::Local(_));
        let monitor = if options.prometheus(scenario, local) {
            progress.say("starting Prometheus (the dashboards and alerts)");
            let scrape = Duration::from_secs_f64(options.prometheus_scrape_seconds.max(0.1));
            Some(Monitor::start(&repo(options), &phase.probe, &phase.namespace, scrape).await?)
        } else {
            None
        };
        let control_plane = match &cluster {
            Cluster::Local(cp) => Some(*cp),
            Cluster::Deployed { .. } => None,
        };
        let extra = scenario::play(
            scenario,
            &mut phase,
            options,
            &mut result.fleet,
            control_plane,
        )
        .await?;
        let fleet = phase.finish(options, &mut result, extra).await?;
        if let Some(monitor) = monitor {
            progress.say("evaluating the dashboards' panels and the alerts");
            let faults = scenario == Scenario::Chaos;
            let monitoring = monitor
                .finish(&repo(options), faults)
                .await
                .context("evaluate the dashboards and alerts")?;
            result.violations.extend(verdict::dashboards(&monitoring));
            result.violations.extend(verdict::alerts(&monitoring));
            result.monitoring = Some(monitoring);
        }
        fleet
    };
    result.passed = result.violations.is_empty();
    let mut fleet = fleet;
    if options.baselines(scenario) {
        match run_baselines(&cluster, options, &mut fleet, &progress).await {
            Ok(b) => result.baselines = Some(b),
            // The scenario's figures stand; the report says what went wrong.
            Err(e) => {
                progress.say(format!("baselines failed: {e:#}"));
                result.baselines_error = Some(format!("{e:#}"));
            }
        }
    }
    fleet.shutdown().await;
    if let Cluster::Deployed { run, .. } = &cluster {
        clean_up_deployed(&client, options, run, original_replicas, &progress).await;
    }
    progress.finish();
    Ok(result)
}

fn module_manager_version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

/// Deletes the run's namespaces (the fleet removes their modules) and puts the StatefulSet's
/// `spec.replicas` back; failures are reported, not fatal.
async fn clean_up_deployed(
    client: &Client,
    options: &Options,
    run: &str,
    replicas: Option<i32>,
    progress: &Progress,
) {
    let namespaces = Api::<Namespace>::all(client.clone());
    let selector = format!("loadtest-run={run}");
    match namespaces
        .list(&ListParams::default().labels(&selector))
        .await
    {
        Ok(list) => {
            for ns in list {
                if let Err(e) = namespaces.delete(&ns.name_any(), &Default::default()).await {
                    progress.say(format!("clean-up: delete namespace {}: {e}", ns.name_any()));
                }
            }
        }
        Err(e) => progress.say(format!("clean-up: list namespaces {selector}: {e}")),
    }
    if let Some(replicas) = replicas {
        let patch = json!({"spec": {"replicas": replicas}});
        if let Err(e) = Api::<StatefulSet>::namespaced(client.clone(), &options.fleet_namespace)
            .patch(
                &options.statefulset,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
        {
            progress.say(format!("clean-up: restore {replicas} replicas: {e}"));
        }
    }
}

/// A burst of `count` Manifests on the fleet's selector in a new namespace: the time from the
/// first create to the last Ready.
async fn fleet_burst(
    cluster: &Cluster<'_>,
    options: &Options,
    fleet: &Fleet,
    count: usize,
    prefix: &str,
) -> anyhow::Result<Burst> {
    let limit = Duration::from_secs(options.settle_seconds);
    Ok(timed_burst(cluster, options, fleet, count, prefix, limit)
        .await?
        .burst)
}

async fn run_baselines(
    cluster: &Cluster<'_>,
    options: &Options,
    fleet: &mut Fleet,
    progress: &Progress,
) -> anyhow::Result<Baselines> {
    let count = options.burst;
    let replicas = fleet.ordinals().await?.len() as u32;
    progress.say(format!(
        "baseline: a burst of {count} Manifests on {replicas} replicas"
    ));
    wait_idle(&fleet.probe(), progress).await;
    let fleet_burst_figure = fleet_burst(cluster, options, fleet, count, "burst-fleet").await?;

    progress.say("baseline: the same burst on a single replica");
    fleet.scale(1).await?;
    wait_assignment(&fleet.probe(), fleet.shards, 1, Duration::from_secs(180)).await?;
    // The remaining replica re-reads every Manifest of the shards it gained: let it finish.
    wait_idle(&fleet.probe(), progress).await;
    let single = fleet_burst(cluster, options, fleet, count, "burst-single").await?;
    if !fleet.is_local() {
        fleet.scale(replicas).await?;
    } else {
        fleet.shutdown().await;
    }

    let paths = bare_and_helm(cluster, options, count, replicas as usize, progress).await?;
    Ok(Baselines {
        manifests: count as u64,
        objects_per_manifest: paths.objects_per_manifest,
        fleet: fleet_burst_figure,
        single_replica: Some(single),
        bare_apply: Some(paths.bare_apply),
        helm: Some(paths.helm),
    })
}

/// The two baselines without a fleet, for one burst size.
pub struct PathsWithoutFleet {
    pub objects_per_manifest: u64,
    pub bare_apply: Burst,
    pub helm: Burst,
}

/// A bare client server-side applying the chart's objects for `count` releases, then
/// `helm upgrade --install` of `count` releases, each `replicas` × `--concurrency` at once
/// (as many as the fleet's workers), each in a new namespace.
pub async fn bare_and_helm(
    cluster: &Cluster<'_>,
    options: &Options,
    count: usize,
    replicas: usize,
    progress: &Progress,
) -> anyhow::Result<PathsWithoutFleet> {
    let paths = BaselinePaths::new(cluster, options, count, replicas).await?;
    let (bare_apply, objects_per_manifest) = paths.bare_apply(progress).await?;
    let helm = paths.helm(progress).await?;
    Ok(PathsWithoutFleet {
        objects_per_manifest,
        bare_apply,
        helm,
    })
}
