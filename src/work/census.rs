//! The census of the cached Manifests of the owned shards: counted by state, by how they fail,
//! and the age of the oldest deletion, published as metrics every few seconds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use crate::api::{Manifest, State};
use crate::plan::status::PROGRESSING_WITH_RETRY;
use crate::shard::fence::Ownership;
use crate::telemetry::metrics::{FAILING_REASONS, FailingLabels, ManifestMetrics, StateLabels};
use crate::work::caches::Work;

impl Work {
    /// The cached Manifests of the shards `owns` accepts, counted by state (`census`). A
    /// Manifest being labelled can sit in both caches for a moment: counted once.
    pub fn census(&self, owns: impl Fn(u32) -> bool, now: Timestamp) -> Census {
        let labelled = self.labelled.state();
        let unlabelled = self.unlabelled.state();
        let mut seen = std::collections::HashSet::new();
        census(
            labelled
                .iter()
                .chain(&unlabelled)
                .filter(|m| self.shard_of(m).is_some_and(&owns))
                .filter(|m| seen.insert(m.uid()))
                .map(|m| m.as_ref()),
            now,
        )
    }
}

/// Manifests counted by status state, and the age of the oldest deletion request.
#[derive(Debug, Default, PartialEq)]
pub struct Census {
    /// State name (`Unknown` without a status yet) → count; every state is present.
    pub by_state: BTreeMap<&'static str, i64>,
    /// Age of the oldest `deletionTimestamp`, if any Manifest is being deleted.
    pub oldest_deletion: Option<Duration>,
    /// (`stalled` | `retrying`, Ready reason) → count of the failing Manifests; every pair
    /// of [`FAILING_REASONS`] is present.
    pub failing: BTreeMap<(&'static str, &'static str), i64>,
}

/// How a Manifest fails, if it does: `stalled` (`Stalled=True`) or `retrying`
/// (`Reconciling=True` with `ProgressingWithRetry`), with its Ready reason as one of
/// [`FAILING_REASONS`] (`Other` for one not in the list, so the label stays bounded).
fn failing(status: &crate::api::ManifestStatus) -> Option<(&'static str, &'static str)> {
    let condition = |kind: &str| status.conditions.iter().find(|c| c.type_ == kind);
    let is_true = |kind: &str| condition(kind).is_some_and(|c| c.status == "True");
    let how = if is_true("Stalled") {
        "stalled"
    } else if condition("Reconciling")
        .is_some_and(|c| c.status == "True" && c.reason == PROGRESSING_WITH_RETRY)
    {
        "retrying"
    } else {
        return None;
    };
    let reason = condition("Ready").map_or("Other", |c| c.reason.as_str());
    let known = FAILING_REASONS.iter().copied().find(|r| *r == reason);
    Some((how, known.unwrap_or("Other")))
}

/// Counts `manifests` by state (pure).
pub fn census<'a>(manifests: impl IntoIterator<Item = &'a Manifest>, now: Timestamp) -> Census {
    let mut by_state: BTreeMap<&'static str, i64> = [
        "Ready",
        "Processing",
        "Warning",
        "Error",
        "Deleting",
        "Unknown",
    ]
    .into_iter()
    .map(|state| (state, 0))
    .collect();
    let mut oldest_deletion: Option<Duration> = None;
    let mut failing_count: BTreeMap<(&'static str, &'static str), i64> = ["stalled", "retrying"]
        .into_iter()
        .flat_map(|how| {
            FAILING_REASONS
                .iter()
                .map(move |reason| ((how, *reason), 0))
        })
        .collect();
    for manifest in manifests {
        if let Some(key) = manifest.status.as_ref().and_then(failing) {
            *failing_count.entry(key).or_default() += 1;
        }
        let state = match manifest.status.as_ref().and_then(|s| s.state.as_ref()) {
            Some(State::Ready) => "Ready",
            Some(State::Processing) => "Processing",
            Some(State::Warning) => "Warning",
            Some(State::Error) => "Error",
            Some(State::Deleting) => "Deleting",
            None => "Unknown",
        };
        *by_state.entry(state).or_default() += 1;
        if let Some(since) = &manifest.meta().deletion_timestamp {
            let age = Duration::try_from(now.duration_since(since.0)).unwrap_or_default();
            oldest_deletion = Some(oldest_deletion.map_or(age, |o| o.max(age)));
        }
    }
    Census {
        by_state,
        oldest_deletion,
        failing: failing_count,
    }
}

/// Publishes the census of this replica's Manifests every `interval`, until the task is dropped.
pub async fn publish_census(
    work: Work,
    ownership: Arc<Ownership>,
    metrics: ManifestMetrics,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        // A fenced replica owns nothing it may act on: it reports nothing (another replica
        // may own those shards now).
        let in_time = ownership.in_time();
        let census = work.census(|shard| in_time && ownership.wants(shard), Timestamp::now());
        for (state, count) in census.by_state {
            metrics
                .by_state
                .get_or_create(&StateLabels { state })
                .set(count);
        }
        metrics
            .oldest_deletion
            .set(census.oldest_deletion.unwrap_or_default().as_secs_f64());
        for ((status, reason), count) in census.failing {
            metrics
                .failing
                .get_or_create(&FailingLabels { status, reason })
                .set(count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_census_counts_states_and_the_oldest_deletion() {
        let now: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        let manifest = |state: Option<State>, deleted_at: Option<&str>| {
            let mut m = Manifest::new(
                "m",
                serde_json::from_value(serde_json::json!({
                    "module": "x", "chart": {"path": "x"}
                }))
                .unwrap(),
            );
            m.status = state.map(|state| crate::api::ManifestStatus {
                state: Some(state),
                ..Default::default()
            });
            m.metadata.deletion_timestamp = deleted_at
                .map(|t| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.parse().unwrap()));
            m
        };
        let manifests = [
            manifest(Some(State::Ready), None),
            manifest(Some(State::Ready), None),
            manifest(None, None),
            manifest(Some(State::Deleting), Some("2026-11-30T11:50:00Z")),
            manifest(Some(State::Deleting), Some("2026-11-30T11:59:00Z")),
        ];
        let counted = census(&manifests, now);
        assert_eq!(counted.by_state["Ready"], 2);
        assert_eq!(counted.by_state["Unknown"], 1);
        assert_eq!(counted.by_state["Deleting"], 2);
        assert_eq!(counted.by_state["Error"], 0, "every state is present");
        assert_eq!(counted.oldest_deletion, Some(Duration::from_secs(600)));
        assert_eq!(census(&manifests[..3], now).oldest_deletion, None);
    }

    #[test]
    fn failing_manifests_are_counted_by_how_and_reason() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let condition = |kind: &str, status: &str, reason: &str| Condition {
            type_: kind.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::UNIX_EPOCH,
            ),
        };
        let with = |conditions: Vec<Condition>| {
            let mut m = Manifest::new(
                "m",
                serde_json::from_value(serde_json::json!({"module": "x", "chart": {"path": "x"}}))
                    .unwrap(),
            );
            m.status = Some(crate::api::ManifestStatus {
                state: Some(State::Error),
                conditions,
                ..Default::default()
            });
            m
        };
        let stalled = |reason| {
            with(vec![
                condition("Ready", "False", reason),
                condition("Reconciling", "False", reason),
                condition("Stalled", "True", reason),
            ])
        };
        let manifests = [
            stalled("ReadinessTimeout"),
            stalled("ReadinessTimeout"),
            stalled("ObjectFailed"),
            stalled("SomethingNew"),
            with(vec![
                condition("Ready", "False", "ValuesError"),
                condition("Reconciling", "True", PROGRESSING_WITH_RETRY),
                condition("Stalled", "False", "ValuesError"),
            ]),
            // In progress without an error, and ready: not failing.
            with(vec![
                condition("Ready", "False", "Progressing"),
                condition("Reconciling", "True", "Progressing"),
            ]),
            with(vec![condition("Ready", "True", "Ready")]),
        ];
        let counted = census(&manifests, Timestamp::UNIX_EPOCH).failing;
        assert_eq!(counted[&("stalled", "ReadinessTimeout")], 2);
        assert_eq!(counted[&("stalled", "ObjectFailed")], 1);
        assert_eq!(
            counted[&("stalled", "Other")],
            1,
            "an unknown reason is bounded"
        );
        assert_eq!(counted[&("retrying", "ValuesError")], 1);
        assert_eq!(counted.values().sum::<i64>(), 5);
        assert_eq!(
            counted.len(),
            2 * FAILING_REASONS.len(),
            "every series is present"
        );
    }
}
