//! Steady state on the remote test bed (`--edits`): with the fleet holding every target, spec
//! edits — a new `revision` value, so the ConfigMap and the Deployment's pod template change —
//! sent at `--edit-rate` per second to Manifests spread over the targets. Each edit is timed
//! from the moment it is sent to its pass start (the first `reconcile start` of the Manifest's
//! UID in any replica's log at or after it) and to Ready at its new generation (the load's own
//! tracker and watch, as for its updates). The logs and the harness read the same clock:
//! everything runs on this machine.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use module_manager::api::Manifest;
use serde_json::json;
use test_support::log_check::parse_passes;

use crate::fleet::Fleet;
use crate::load::{Load, Op};
use crate::measure;
use crate::options::Options;
use crate::progress::Progress;
use crate::results::RemoteSteady;

/// How long the edits may take to be Ready after the last one was sent.
const SETTLE: Duration = Duration::from_secs(120);

/// One edit, answered: the Manifest's UID and when the edit was sent (for the logs' clock).
struct Edit {
    uid: String,
    sent_at: Timestamp,
}

/// Plays the edits on `load`'s Manifests (but those `skipped`: blackholed targets') and times
/// them: to Ready through `load`'s tracker and watch (as its own updates are), to the pass
/// start through the replicas' logs; returns the figures and the names edited.
pub async fn run(
    load: &Load,
    fleet: &Fleet,
    options: &Options,
    skipped: &dyn Fn(&str) -> bool,
    progress: &Progress,
) -> anyhow::Result<(RemoteSteady, Vec<String>)> {
    let picked = spread(load.api(), &load.selector(), skipped, options.edits).await?;
    let names: Vec<String> = picked.iter().map(ResourceExt::name_any).collect();
    progress.say(format!(
        "remote: {} spec edits at {} per second",
        names.len(),
        options.edit_rate
    ));
    let watch = load.spawn_watch_listed().await;
    let (started, from) = (Instant::now(), load.elapsed());
    let edits = send(load, &names, options.edit_rate).await;
    let to = load.elapsed();
    let deadline = Instant::now() + SETTLE;
    let pending = || {
        load.tracker
            .lock()
            .unwrap()
            .outstanding(Instant::now())
            .len()
    };
    while Instant::now() < deadline && pending() > 0 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    watch.abort();
    let (to_ready, not_ready) = {
        let tracker = load.tracker.lock().unwrap();
        let now = Instant::now();
        (
            tracker.convergence_in(from, to, now),
            tracker.outstanding(now).len(),
        )
    };
    let starts = pass_starts(fleet, &edits).await?;
    let not_started = starts.iter().filter(|s| s.is_none()).count() as u64;
    let steady = RemoteSteady {
        edits: edits.len() as u64,
        failed: (names.len() - edits.len()) as u64,
        rate: options.edit_rate,
        seconds,
        edit_to_pass_start_seconds: measure::quantiles(&at_least(&edits, &starts)),
        edit_to_ready_seconds: measure::quantiles(&to_ready),
        not_started,
        not_ready: not_ready as u64,
    };
    Ok((steady, names))
}

/// Each edit's time to its pass start; one without counts as its time until now (a lower
/// bound), so that missing ones cannot make a quantile look better than it is.
fn at_least(edits: &[Edit], latencies: &[Option<f64>]) -> Vec<f64> {
    let now = Timestamp::now();
    let waited = |edit: &Edit| now.duration_since(edit.sent_at).as_secs_f64();
    edits
        .iter()
        .zip(latencies)
        .map(|(edit, latency)| latency.unwrap_or_else(|| waited(edit)))
        .collect()
}

/// `count` of the Manifests (but those `skipped`), spread evenly over their sorted names: over
/// the targets, the n-th Manifest going to target `(n−1) / modules`.
pub(super) async fn spread(
    api: &Api<Manifest>,
    selector: &str,
    skipped: &dyn Fn(&str) -> bool,
    count: usize,
) -> anyhow::Result<Vec<Manifest>> {
    let listed = api.list(&ListParams::default().labels(selector)).await?;
    let mut manifests: Vec<Manifest> = listed
        .items
        .into_iter()
        .filter(|m| !skipped(&m.name_any()))
        .collect();
    manifests.sort_by_key(ResourceExt::name_any);
    let step = (manifests.len() as f64 / count.max(1) as f64).max(1.0);
    let picked =
        (0..count.min(manifests.len())).map(|i| manifests[(i as f64 * step) as usize].clone());
    Ok(picked.collect())
}

/// Sends one edit per name at `rate` per second, each with a revision of its own, through
/// `load`'s tracker; returns those answered (a failed one is counted by the caller).
async fn send(load: &Load, names: &[String], rate: f64) -> Vec<Edit> {
    let period = Duration::from_secs_f64(1.0 / rate.clamp(0.01, 1000.0));
    let mut ticks = tokio::time::interval(period);
    let mut sent = Vec::new();
    for (i, name) in names.iter().enumerate() {
        ticks.tick().await;
        let (load, name) = (load.clone(), name.clone());
        sent.push(tokio::spawn(async move {
            let patch = json!({"spec": {"values": {"revision": format!("steady-{i}")}}});
            let sent_at = Timestamp::now();
            load.tracker
                .lock()
                .unwrap()
                .sending(&name, Op::Update, Instant::now());
            let params = PatchParams::default();
            match load
                .api()
                .patch(&name, &params, &Patch::Merge(&patch))
                .await
            {
                Ok(answer) => {
                    let generation = answer.metadata.generation.unwrap_or(1);
                    load.tracker.lock().unwrap().answered(&name, generation);
                    Some(Edit {
                        uid: answer.uid()?,
                        sent_at,
                    })
                }
                Err(e) => {
                    let mut tracker = load.tracker.lock().unwrap();
                    tracker.failed(&name, Op::Update, e.to_string());
                    None
                }
            }
        }));
    }
    let mut edits = Vec::new();
    for task in sent {
        if let Ok(Some(edit)) = task.await {
            edits.push(edit);
        }
    }
    edits
}

/// Seconds from each edit to the first pass of its Manifest that started at or after it, in any
/// replica's log (`None`: no such pass). Only the edited Manifests' passes are kept.
async fn pass_starts(fleet: &Fleet, edits: &[Edit]) -> anyhow::Result<Vec<Option<f64>>> {
    let mut starts: HashMap<&str, Vec<Timestamp>> =
        edits.iter().map(|e| (e.uid.as_str(), Vec::new())).collect();
    for (_, log) in fleet.logs().await? {
        for pass in parse_passes(&log) {
            if let Some(found) = starts.get_mut(pass.uid.as_str()) {
                found.push(pass.start);
            }
        }
    }
    let latency = |edit: &Edit| {
        let first = starts
            .get(edit.uid.as_str())?
            .iter()
            .filter(|start| **start >= edit.sent_at)
            .min()?;
        let waited = first.duration_since(edit.sent_at);
        Some(waited.as_secs_f64())
    };
    Ok(edits.iter().map(latency).collect())
}
