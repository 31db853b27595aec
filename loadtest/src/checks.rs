//! The checkers: pure functions from what was observed to [`Violation`]s. Any violation fails
//! the run (non-zero exit).
//!
//! - `overlap`: two replicas reconciling one Manifest at the same time (the replicas' logs,
//!   [`test_support::log_check`]);
//! - `not-converged`: a Manifest that never reached its expected state (Ready at the generation
//!   written, or gone after a delete), or that no replica ever reconciled;
//! - `unowned-shard`: a shard without a live owner for longer than twice the lease duration;
//! - `moved-during-rolling-update`: a shard that changed holder, or a Manifest reconciled by
//!   two different replicas, while the replicas were restarted one by one;
//! - `not-recovered` (`chaos`): `--recovery-limit-seconds` after a fault's end, operations
//!   sent before it ended still without their effect, or not one create or update sent after
//!   it (the load's, else a probe Manifest the harness sends) with its effect; or a replica
//!   process that exited.
//!
//! The dashboards' and alerts' checkers (`empty-panel`, `dashboard`, `alert`) are in
//! [`crate::prometheus::verdict`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use test_support::log_check;

use crate::load::Op;
use crate::results::{FaultRecord, Violation};

/// How many findings of one checker are spelled out before "… and N more".
const LIST_LIMIT: usize = 10;

pub(crate) fn violation(checker: &str, detail: String) -> Violation {
    Violation {
        checker: checker.to_owned(),
        detail,
    }
}

pub(crate) fn listed<T>(items: &[T], show: impl Fn(&T) -> String) -> String {
    let mut text: Vec<String> = items.iter().take(LIST_LIMIT).map(show).collect();
    if items.len() > LIST_LIMIT {
        text.push(format!("… and {} more", items.len() - LIST_LIMIT));
    }
    text.join("; ")
}

/// Overlapping reconciles of one Manifest.
pub fn overlaps(report: &log_check::Report) -> Vec<Violation> {
    if report.overlaps.is_empty() {
        return Vec::new();
    }
    vec![violation(
        "overlap",
        format!(
            "{} pairs of reconcile passes of one Manifest ran at the same time on two replicas: {}",
            report.overlaps.len(),
            listed(&report.overlaps, |o| format!(
                "{} by {} #{} and {} #{}",
                o.uid, o.first.0, o.first.1, o.second.0, o.second.1
            ))
        ),
    )]
}

/// Manifests that did not reach their expected state: operations whose effect was never seen,
/// Manifests not Ready at their generation at the end, expected Manifests no replica completed
/// a pass of.
pub fn not_converged(
    outstanding: &[(String, Op, f64)],
    not_ready: &[String],
    unreconciled: &[String],
    waited: Duration,
) -> Vec<Violation> {
    let mut found = Vec::new();
    if !outstanding.is_empty() {
        found.push(violation(
            "not-converged",
            format!(
                "{} operations without their effect {waited:?} after the load stopped: {}",
                outstanding.len(),
                listed(outstanding, |(name, op, age)| format!(
                    "{op:?} {name} ({age:.0} s ago)"
                ))
            ),
        ));
    }
    if !not_ready.is_empty() {
        found.push(violation(
            "not-converged",
            format!(
                "{} Manifests not Ready at their generation at the end: {}",
                not_ready.len(),
                listed(not_ready, String::clone)
            ),
        ));
    }
    if !unreconciled.is_empty() {
        found.push(violation(
            "not-converged",
            format!(
                "{} Manifests no replica completed a reconcile pass of: {}",
                unreconciled.len(),
                listed(unreconciled, String::clone)
            ),
        ));
    }
    found
}

/// Shards unowned for longer than twice the lease duration.
pub fn unowned(longest: &BTreeMap<u32, f64>, lease_duration: Duration) -> Vec<Violation> {
    let limit = 2.0 * lease_duration.as_secs_f64();
    let over: Vec<(u32, f64)> = longest
        .iter()
        .filter(|(_, s)| **s > limit)
        .map(|(k, s)| (*k, *s))
        .collect();
    if over.is_empty() {
        return Vec::new();
    }
    vec![violation(
        "unowned-shard",
        format!(
            "{} shards without a live owner for longer than {limit:.0} s (twice the lease duration): {}",
            over.len(),
            listed(&over, |(k, s)| format!("shard {k} for {s:.1} s"))
        ),
    )]
}

/// Faults the fleet did not recover from: `limit` after the fault's end, operations sent
/// before it ended still without their effect or no create or update sent after it with its
/// effect ([`crate::faults::new_work_done`]); or replicas whose process exited.
pub fn not_recovered(faults: &[FaultRecord], limit: Duration) -> Vec<Violation> {
    let mut found = Vec::new();
    for fault in faults {
        if fault.recovered_seconds.is_none() {
            found.push(violation(
                "not-recovered",
                format!(
                    "{} (at {:.0} s): not recovered {limit:?} after its end; {} operations still without their effect: {}",
                    fault.label,
                    fault.at_seconds,
                    fault.stuck.len(),
                    listed(&fault.stuck, String::clone)
                ),
            ));
        }
        if !fault.replicas_exited.is_empty() {
            found.push(violation(
                "not-recovered",
                format!(
                    "{} (at {:.0} s): replicas exited: {}",
                    fault.label,
                    fault.at_seconds,
                    fault.replicas_exited.join(", ")
                ),
            ));
        }
    }
    found
}

/// Moves during a rolling update: shards with more than one holder (from the Lease
/// observations) and Manifests reconciled by more than one replica between `from` and `to`
/// (from the logs).
pub fn moved_during_rolling_update(
    shard_holders: &BTreeMap<u32, Vec<Option<String>>>,
    logs: &[(String, String)],
    from: Timestamp,
    to: Timestamp,
) -> Vec<Violation> {
    let mut found = Vec::new();
    if !shard_holders.is_empty() {
        let moved: Vec<(&u32, &Vec<Option<String>>)> = shard_holders.iter().collect();
        found.push(violation(
            "moved-during-rolling-update",
            format!(
                "{} shards changed holder: {}",
                moved.len(),
                listed(&moved, |(k, holders)| format!(
                    "shard {k}: {}",
                    holders
                        .iter()
                        .map(|h| h.as_deref().unwrap_or("-"))
                        .collect::<Vec<_>>()
                        .join(" → ")
                ))
            ),
        ));
    }
    let mut replicas_by_uid: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, log) in logs {
        for pass in log_check::parse_passes(log) {
            if pass.start >= from && pass.start <= to {
                replicas_by_uid
                    .entry(pass.uid)
                    .or_default()
                    .insert(pass.replica);
            }
        }
    }
    let moved: Vec<(String, BTreeSet<String>)> = replicas_by_uid
        .into_iter()
        .filter(|(_, r)| r.len() > 1)
        .collect();
    if !moved.is_empty() {
        found.push(violation(
            "moved-during-rolling-update",
            format!(
                "{} Manifests reconciled by more than one replica: {}",
                moved.len(),
                listed(&moved, |(uid, r)| format!(
                    "{uid} by {}",
                    r.iter().cloned().collect::<Vec<_>>().join(" and ")
                ))
            ),
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(replica: &str, uid: &str, id: u64, message: &str, at: &str) -> String {
        serde_json::json!({
            "timestamp": at, "level": "INFO", "message": message,
            "spans": [{"name": "reconcile", "uid": uid, "replica": replica, "reconcile_id": id}],
        })
        .to_string()
    }

    #[test]
    fn unowned_allows_exactly_twice_the_lease() {
        let lease = Duration::from_secs(4);
        let ok = BTreeMap::from([(0, 8.0), (1, 0.5)]);
        assert!(unowned(&ok, lease).is_empty());
        let bad = BTreeMap::from([(0, 8.5), (1, 0.5), (2, 30.0)]);
        let v = unowned(&bad, lease);
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.starts_with("2 shards"), "{}", v[0].detail);
        assert!(v[0].detail.contains("shard 2 for 30.0 s"));
    }

    #[test]
    fn not_converged_names_each_kind_of_laggard() {
        assert!(not_converged(&[], &[], &[], Duration::from_secs(1)).is_empty());
        let v = not_converged(
            &[("m1".into(), Op::Create, 12.0)],
            &["m2 (Some(Error))".into()],
            &["uid-3".into()],
            Duration::from_secs(60),
        );
        assert_eq!(v.len(), 3);
        assert!(v[0].detail.contains("Create m1"));
        assert!(v[2].detail.contains("uid-3"));
        let many: Vec<String> = (0..25).map(|i| format!("m{i}")).collect();
        let v = not_converged(&[], &many, &[], Duration::from_secs(1));
        assert!(v[0].detail.ends_with("… and 15 more"), "{}", v[0].detail);
    }

    #[test]
    fn a_fault_not_recovered_from_names_what_is_stuck_and_who_exited() {
        let limit = Duration::from_secs(120);
        let recovered = FaultRecord {
            label: "apiserver".into(),
            recovered_seconds: Some(3.0),
            ..Default::default()
        };
        assert!(not_recovered(std::slice::from_ref(&recovered), limit).is_empty());
        let stuck = FaultRecord {
            label: "etcd".into(),
            at_seconds: 40.0,
            stuck: vec!["Create m-3 (150 s ago)".into()],
            ..Default::default()
        };
        let exited = FaultRecord {
            replicas_exited: vec!["mm-1".into()],
            ..recovered
        };
        let v = not_recovered(&[stuck, exited], limit);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(
            v[0].detail.starts_with("etcd (at 40 s): not recovered"),
            "{}",
            v[0].detail
        );
        assert!(v[0].detail.contains("Create m-3"), "{}", v[0].detail);
        assert!(
            v[1].detail.contains("replicas exited: mm-1"),
            "{}",
            v[1].detail
        );
    }

    #[test]
    fn a_manifest_reconciled_by_two_replicas_in_the_window_moved() {
        let logs = vec![
            (
                "a".to_owned(),
                [
                    line("mm-0", "u1", 1, "reconcile start", "2026-01-01T00:00:01Z"),
                    line("mm-0", "u1", 1, "reconcile end", "2026-01-01T00:00:02Z"),
                    line("mm-0", "u2", 2, "reconcile start", "2026-01-01T00:00:01Z"),
                    line("mm-0", "u2", 2, "reconcile end", "2026-01-01T00:00:02Z"),
                ]
                .join("\n"),
            ),
            (
                "b".to_owned(),
                [
                    line("mm-1", "u1", 1, "reconcile start", "2026-01-01T00:00:05Z"),
                    line("mm-1", "u1", 1, "reconcile end", "2026-01-01T00:00:06Z"),
                    // u2 by mm-1 only outside the window.
                    line("mm-1", "u2", 2, "reconcile start", "2026-01-01T00:01:00Z"),
                    line("mm-1", "u2", 2, "reconcile end", "2026-01-01T00:01:01Z"),
                ]
                .join("\n"),
            ),
        ];
        let from: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let to: Timestamp = "2026-01-01T00:00:30Z".parse().unwrap();
        let v = moved_during_rolling_update(&BTreeMap::new(), &logs, from, to);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].detail.contains("u1 by mm-0 and mm-1"),
            "{}",
            v[0].detail
        );
        assert!(!v[0].detail.contains("u2"));
        let shards = BTreeMap::from([(3, vec![Some("mm-0".into()), Some("mm-1".into())])]);
        let v = moved_during_rolling_update(&shards, &[], from, to);
        assert!(
            v[0].detail.contains("shard 3: mm-0 → mm-1"),
            "{}",
            v[0].detail
        );
    }
}
