//! Drift repair on the remote test bed (`--drift-changes`): someone changes a module's object
//! on its target — the ConfigMap's `revision`, merge-patched by another field manager straight
//! on the target's API server, as `kubectl edit` would — on targets spread over the bed, and each change is timed until the
//! fleet has put the chart's value back (a watch of those ConfigMaps on each API server). The
//! changes are spread evenly over one interval, so that they sample every point of the drift
//! schedule. The fleet finds a change with the Manifest's next drift pass, which the operator
//! schedules `spec.interval × (1 − 0–10 %)` after the last (`× (1 + 0–10 %)` before bd27d37):
//! the figures are the changes repaired within one interval and within 1.1.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use module_manager::api::Manifest;
use module_manager::apply::MANIFEST_UID_LABEL;
use serde_json::json;

use super::steady::spread;
use super::testbed::TestBed;
use crate::load::{Load, RemoteShape};
use crate::measure;
use crate::options::Options;
use crate::progress::Progress;
use crate::results::RemoteDrift;

/// The value a change writes; the chart's is never this.
const DRIFTED: &str = "drifted by someone";
/// The field manager of the changes (`kubectl edit` would be another).
const MANAGER: &str = "loadtest-drift";
/// How long past 1.1 intervals a change may take to be repaired before it counts as not; and
/// the longest wait for the watches' first lists.
const GRACE: Duration = Duration::from_secs(60);

/// One change made on a target: the ConfigMap (API server, namespace, name) and when.
struct Change {
    apiserver: usize,
    namespace: String,
    name: String,
    changed: Instant,
}

/// When each changed ConfigMap was first seen with another value than [`DRIFTED`] after it
/// was changed, by (API server, namespace, name).
type Repaired = Arc<Mutex<HashMap<(usize, String, String), Instant>>>;

/// Changes one ConfigMap on each of `--drift-changes` targets (Manifests not `skipped`: not
/// edited just before, not on blackholed targets), evenly over one interval so that each lands
/// at its own point of its Manifest's drift schedule, and times their repairs.
pub async fn run(
    load: &Load,
    bed: &TestBed,
    options: &Options,
    skipped: &dyn Fn(&str) -> bool,
    progress: &Progress,
) -> anyhow::Result<RemoteDrift> {
    let (api, selector) = (load.api(), load.selector());
    let picked = spread(api, &selector, skipped, options.drift_changes).await?;
    let interval = picked
        .first()
        .and_then(|m| module_manager::api::interval(&m.spec))
        .unwrap_or(Duration::from_secs(600));
    progress.say(format!(
        "remote: changing a ConfigMap on {} targets over one interval ({interval:?})",
        picked.len()
    ));
    let shape = RemoteShape {
        modules_per_target: options.modules_per_target,
    };
    let found = configmaps(bed, shape, &picked).await?;
    let repaired = Repaired::default();
    let (watches, listed) = watch_repairs(bed, &found, repaired.clone());
    if !all_listed(&listed, GRACE).await {
        progress.say("remote: a watch of the targets' ConfigMaps did not list within a minute");
    }
    let changes = change_all(bed, found, interval).await;
    // An operator before bd27d37 put a drift pass up to 10 % past the interval.
    let deadline = Instant::now() + interval.mul_f64(1.1) + GRACE;
    while Instant::now() < deadline && !changes.iter().all(|c| repair_of(&repaired, c).is_some()) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for watch in watches {
        watch.abort();
    }
    let seen: Vec<Option<f64>> = changes.iter().map(|c| repair_of(&repaired, c)).collect();
    let within = |limit: f64| seen.iter().flatten().filter(|s| **s <= limit).count() as u64;
    let waited = |c: &Change| deadline.saturating_duration_since(c.changed).as_secs_f64();
    let latencies: Vec<f64> = changes
        .iter()
        .zip(&seen)
        .map(|(c, s)| s.unwrap_or_else(|| waited(c)))
        .collect();
    Ok(RemoteDrift {
        requested: picked.len() as u64,
        changes: changes.len() as u64,
        interval_seconds: interval.as_secs_f64(),
        change_to_repair_seconds: measure::quantiles(&latencies),
        within_interval: within(interval.as_secs_f64()),
        within_interval_and_jitter: within(interval.as_secs_f64() * 1.1),
        not_repaired: seen.iter().filter(|s| s.is_none()).count() as u64,
    })
}

/// Waits until every watch's flag says its first list is done, at most `limit`.
async fn all_listed(listed: &[Arc<AtomicBool>], limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !listed.iter().all(|l| l.load(Ordering::SeqCst)) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

/// Changes each ConfigMap of `found`, spaced evenly over `interval`; those changed, with when.
async fn change_all(
    bed: &TestBed,
    found: Vec<(usize, String, String)>,
    interval: Duration,
) -> Vec<Change> {
    let mut ticks = tokio::time::interval(interval.div_f64(found.len().max(1) as f64));
    let mut changes = Vec::new();
    for (apiserver, namespace, name) in found {
        ticks.tick().await;
        let api: Api<ConfigMap> = Api::namespaced(bed.admins[apiserver].clone(), &namespace);
        let change = json!({"data": {"revision": DRIFTED}});
        let params = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        let changed = Instant::now();
        if api
            .patch(&name, &params, &Patch::Merge(&change))
            .await
            .is_ok()
        {
            changes.push(Change {
                apiserver,
                namespace,
                name,
                changed,
            });
        }
    }
    changes
}

/// The ConfigMap of each picked Manifest on its target: (API server, namespace, name).
async fn configmaps(
    bed: &TestBed,
    shape: RemoteShape,
    picked: &[Manifest],
) -> anyhow::Result<Vec<(usize, String, String)>> {
    let mut found = Vec::new();
    for manifest in picked {
        let Some(target) = shape.target_of(&manifest.name_any()) else {
            continue;
        };
        let Some(apiserver) = bed
            .targets
            .iter()
            .find(|t| t.name == target)
            .map(|t| t.apiserver)
        else {
            continue;
        };
        let api: Api<ConfigMap> = Api::namespaced(bed.admins[apiserver].clone(), &target);
        let selector = format!(
            "{MANIFEST_UID_LABEL}={}",
            manifest.uid().unwrap_or_default()
        );
        let listed = api.list(&ListParams::default().labels(&selector)).await?;
        if let Some(configmap) = listed.items.first() {
            found.push((apiserver, target, configmap.name_any()));
        }
    }
    Ok(found)
}

/// A watch per API server of the ConfigMaps of modules, noting when each changed one shows
/// another value than the change's after it showed the change; with each watch, a flag set once
/// its first list is done (a change must not be made before: its repair could go unseen).
fn watch_repairs(
    bed: &TestBed,
    found: &[(usize, String, String)],
    repaired: Repaired,
) -> (Vec<tokio::task::JoinHandle<()>>, Vec<Arc<AtomicBool>>) {
    let mut by_apiserver: BTreeMap<usize, Vec<(String, String)>> = BTreeMap::new();
    for (apiserver, namespace, name) in found {
        by_apiserver
            .entry(*apiserver)
            .or_default()
            .push((namespace.clone(), name.clone()));
    }
    by_apiserver
        .into_iter()
        .map(|(apiserver, watched)| {
            let api: Api<ConfigMap> = Api::all(bed.admins[apiserver].clone());
            let listed = Arc::new(AtomicBool::new(false));
            let (repaired, synced) = (repaired.clone(), listed.clone());
            let watch = tokio::spawn(async move {
                let config = watcher::Config::default().labels(MANIFEST_UID_LABEL);
                let mut events = watcher(api, config).default_backoff().boxed();
                let mut drifted = std::collections::HashSet::new();
                while let Some(event) = events.next().await {
                    let cm = match event {
                        Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => cm,
                        Ok(watcher::Event::InitDone) => {
                            synced.store(true, Ordering::SeqCst);
                            continue;
                        }
                        _ => continue,
                    };
                    let key = (cm.namespace().unwrap_or_default(), cm.name_any());
                    if !watched.contains(&key) {
                        continue;
                    }
                    let value = cm.data.as_ref().and_then(|d| d.get("revision"));
                    if value.map(String::as_str) == Some(DRIFTED) {
                        drifted.insert(key);
                    } else if drifted.remove(&key) {
                        let mut repaired = repaired.lock().unwrap();
                        repaired
                            .entry((apiserver, key.0, key.1))
                            .or_insert_with(Instant::now);
                    }
                }
            });
            (watch, listed)
        })
        .unzip()
}

/// Seconds from a change to its repair, if seen.
fn repair_of(repaired: &Repaired, change: &Change) -> Option<f64> {
    let key = (
        change.apiserver,
        change.namespace.clone(),
        change.name.clone(),
    );
    let at = *repaired.lock().unwrap().get(&key)?;
    Some(at.saturating_duration_since(change.changed).as_secs_f64())
}
