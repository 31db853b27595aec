//! Steady state on the remote test bed (`--edits`): with the fleet holding every target, spec
//! edits — a new `revision` value, so the ConfigMap and the Deployment's pod template change —
//! sent at `--edit-rate` per second to Manifests spread over the targets. Each edit is timed
//! from the moment it is sent to its pass start (the first `reconcile start` of the Manifest's
//! UID in any replica's log at or after it) and to Ready at its new generation (a watch of the
//! Manifests). The logs and the harness read the same clock: everything runs on this machine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};
use tokio::sync::Notify;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use module_manager::api::{Manifest, State};
use serde_json::json;
use test_support::log_check::parse_passes;

use crate::fleet::Fleet;
use crate::load::Load;
use crate::measure;
use crate::options::Options;
use crate::progress::Progress;
use crate::results::RemoteSteady;

/// How long the edits may take to be Ready after the last one was sent.
const SETTLE: Duration = Duration::from_secs(120);

/// One edit, answered: the Manifest, its new generation, and when the edit was sent.
struct Edit {
    name: String,
    uid: String,
    generation: i64,
    sent: Instant,
    sent_at: Timestamp,
}

/// When each Manifest was first seen Ready, by name: the generation and the moment.
type ReadySeen = Arc<Mutex<HashMap<String, Vec<(i64, Instant)>>>>;

/// Plays the edits on `load`'s Manifests (but those `skipped`: blackholed targets') and times
/// them; returns the figures and the names edited.
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
    let seen = ReadySeen::default();
    let listed = Arc::new(tokio::sync::Notify::new());
    let watch = tokio::spawn(watch_ready(
        load.api().clone(),
        load.selector(),
        seen.clone(),
        listed.clone(),
    ));
    // A Ready seen only once a long first list ends would be late: edits start after it.
    if tokio::time::timeout(SETTLE, listed.notified())
        .await
        .is_err()
    {
        progress.say("remote: the Manifests' watch did not list within two minutes");
    }
    let started = Instant::now();
    let edits = send(load.api(), &names, options.edit_rate).await;
    let deadline = Instant::now() + SETTLE;
    while Instant::now() < deadline && !edits.iter().all(|e| ready_at(&seen, e).is_some()) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    watch.abort();
    let ready: Vec<Option<f64>> = edits.iter().map(|e| ready_at(&seen, e)).collect();
    let starts = pass_starts(fleet, &edits).await?;
    let steady = RemoteSteady {
        edits: edits.len() as u64,
        failed: (names.len() - edits.len()) as u64,
        rate: options.edit_rate,
        seconds,
        edit_to_pass_start_seconds: measure::quantiles(&at_least(&edits, &starts, deadline)),
        edit_to_ready_seconds: measure::quantiles(&at_least(&edits, &ready, deadline)),
        not_started: starts.iter().filter(|s| s.is_none()).count() as u64,
        not_ready: ready.iter().filter(|r| r.is_none()).count() as u64,
    };
    Ok((steady, names))
}

/// Each edit's latency; one not seen counts as its time until `deadline` (a lower bound), so
/// that missing ones cannot make a quantile look better than it is.
fn at_least(edits: &[Edit], latencies: &[Option<f64>], deadline: Instant) -> Vec<f64> {
    let waited = |edit: &Edit| deadline.saturating_duration_since(edit.sent).as_secs_f64();
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

/// Sends one edit per name at `rate` per second, each with a revision of its own; returns those
/// answered (a failed one is left out and counted by the caller).
async fn send(api: &Api<Manifest>, names: &[String], rate: f64) -> Vec<Edit> {
    let period = Duration::from_secs_f64(1.0 / rate.clamp(0.01, 1000.0));
    let mut ticks = tokio::time::interval(period);
    let mut sent = Vec::new();
    for (i, name) in names.iter().enumerate() {
        ticks.tick().await;
        let (api, name) = (api.clone(), name.clone());
        sent.push(tokio::spawn(async move {
            let patch = json!({"spec": {"values": {"revision": format!("steady-{i}")}}});
            let (sent, sent_at) = (Instant::now(), Timestamp::now());
            let answer = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .ok()?;
            Some(Edit {
                uid: answer.uid()?,
                generation: answer.metadata.generation?,
                sent,
                sent_at,
                name,
            })
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

/// Notes every Manifest seen Ready at its generation, with when; `listed` is told once the
/// first list is done.
async fn watch_ready(api: Api<Manifest>, selector: String, seen: ReadySeen, listed: Arc<Notify>) {
    let config = watcher::Config::default().labels(&selector);
    let mut events = watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        let m = match event {
            Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => m,
            Ok(watcher::Event::InitDone) => {
                listed.notify_one();
                continue;
            }
            _ => continue,
        };
        let status = m.status.as_ref();
        let ready = status.and_then(|s| s.state) == Some(State::Ready);
        let observed = status.and_then(|s| s.observed_generation);
        if ready && observed == m.metadata.generation {
            let generation = observed.unwrap_or_default();
            let mut seen = seen.lock().unwrap();
            seen.entry(m.name_any())
                .or_default()
                .push((generation, Instant::now()));
        }
    }
}

/// Seconds from an edit to its Manifest first seen Ready at (or past) its generation.
fn ready_at(seen: &ReadySeen, edit: &Edit) -> Option<f64> {
    let seen = seen.lock().unwrap();
    let first = seen
        .get(&edit.name)?
        .iter()
        .filter(|(generation, _)| *generation >= edit.generation)
        .map(|(_, at)| *at)
        .min()?;
    Some(first.saturating_duration_since(edit.sent).as_secs_f64())
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
