//! `GET /v1/targets`: the remote targets of the fleet, from the Manifests' statuses (so any
//! replica answers alike) and each target's kubeconfig Secret (its server and credential
//! validity, never its content): which targets fail, and why. Metrics carry no target label;
//! this is where "which 37 of 5,000 clusters fail" is answered. The folding is pure
//! ([`Targets`]); the endpoint (`targets_endpoint.rs`) lists the Manifests page by page and
//! reads the Secrets.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::api::{Manifest, State as ManifestState};
use crate::apply::budget::BudgetSettings;
use crate::apply::credential::Validity;
use crate::apply::target::{SecretKey, secret_key};
use crate::shard::membership::Members;

/// The longest Ready message a row keeps (a failure's message names the server and the error).
const MESSAGE_CHARS: usize = 512;

/// `GET /v1/targets`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetsAnswer {
    /// Targets (kubeconfig Secret keys) named by a Manifest.
    pub targets: u64,
    /// Manifests with a target.
    pub manifests: u64,
    /// Targets with a Manifest in `Error`.
    pub failing: u64,
    /// Targets whose credential is due (expired, or in its last hour and fifth of its life).
    pub expiring: u64,
    /// Failing targets by their reason (the Ready reason most of their failing Manifests have).
    pub by_reason: BTreeMap<String, u64>,
    /// The targets: failing ones first (by reason, then name), then the others by name; only
    /// the failing and expiring ones with `?failing=true`; at most `?limit` (1000).
    pub rows: Vec<TargetRow>,
    /// Rows left out by the limit.
    #[serde(default)]
    pub rows_omitted: u64,
    /// Targets whose requests waited for their budget in the last minute on some replica.
    #[serde(default)]
    pub throttled: u64,
    /// The fleet-wide request budget of one target per minute (`--target-qps` × 60).
    #[serde(default)]
    pub budget_per_minute: u64,
    /// How many targets each replica publishes its budget use of (its busiest): a target
    /// without `budget` used less on each replica than the least it listed.
    #[serde(default)]
    pub budget_listed_per_replica: u64,
}

/// A target's use of its request budget, added up over the replicas that list it among their
/// busiest targets (each publishes its own on its membership Lease with each renewal).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetUse {
    /// Requests in the last minute.
    pub requests_per_minute: u64,
    /// Requests that waited for a token in the last minute.
    pub waits_per_minute: u64,
    /// The replicas that listed it.
    pub replicas: u64,
    /// `requests_per_minute` ÷ the fleet-wide budget of a minute.
    pub used: f64,
}

/// One target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetRow {
    /// The kubeconfig Secret's namespace (its Manifests').
    pub namespace: String,
    /// The Secret.
    pub secret: String,
    /// The key holding the kubeconfig.
    pub key: String,
    /// The API server its kubeconfig names (`None`: the Secret could not be read or checked).
    pub server: Option<String>,
    /// Manifests naming it.
    pub manifests: u64,
    /// Of which Ready at their generation.
    pub ready: u64,
    /// The others, by their Ready condition's reason (`Unknown`: no status yet;
    /// `NotObserved`: a newer generation not reconciled yet).
    pub not_ready: BTreeMap<String, u64>,
    /// The reason of most of its failing Manifests (`None`: none in `Error`).
    pub reason: Option<String>,
    /// The Ready message of one Manifest with that reason (cut to 512 characters).
    pub message: Option<String>,
    /// Since when the longest-failing of its Manifests with that reason has not been Ready (its
    /// Ready condition's last transition: the failure, or a rollout that ended in it).
    pub failing_since: Option<Timestamp>,
    /// When the last of its Ready Manifests became Ready. The status records transitions, not
    /// passes: a drift pass that changes nothing writes nothing.
    pub last_ready: Option<Timestamp>,
    /// When its credential (token `exp`, certificate `notAfter`) expires, if it says.
    pub credential_expires: Option<Timestamp>,
    /// Whether the credential is due (expired, or in its last hour and fifth of its life).
    pub credential_due: bool,
    /// Why the Secret gave no server (missing, no such key, refused kubeconfig).
    pub secret_problem: Option<String>,
    /// Its use of the request budget (`None`: no replica listed it among its busiest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetUse>,
}

/// What a target's kubeconfig Secret says: its server and credential, or why it says nothing.
#[derive(Clone, Debug, PartialEq)]
pub enum SecretFacts {
    /// A kubeconfig module-manager accepts.
    Valid {
        server: String,
        credential: Option<Validity>,
    },
    /// The Secret is missing, has no such key, or its kubeconfig is refused.
    Problem(String),
}

/// The targets folded from Manifests, one page at a time.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    rows: BTreeMap<SecretKey, Folded>,
    manifests: u64,
}

#[derive(Clone, Debug, Default)]
struct Folded {
    row: TargetRow,
    /// Per failing reason: how many, the first by name and its message, and the earliest
    /// Ready transition.
    failing: BTreeMap<String, Failing>,
}

#[derive(Clone, Debug)]
struct Failing {
    manifests: u64,
    first: String,
    message: String,
    since: Option<Timestamp>,
}

impl Targets {
    /// Adds one Manifest (ignored without `spec.target`).
    pub fn add(&mut self, manifest: &Manifest) {
        let Some(key) = secret_key(manifest) else {
            return;
        };
        self.manifests += 1;
        let folded = self.rows.entry(key).or_default();
        folded.row.manifests += 1;
        let status = manifest.status.clone().unwrap_or_default();
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
        let current = status.observed_generation == manifest.metadata.generation;
        if current && status.state == Some(ManifestState::Ready) {
            folded.row.ready += 1;
            let since = ready.map(|c| c.last_transition_time.0);
            folded.row.last_ready = folded.row.last_ready.max(since);
            return;
        }
        let reason = match ready {
            _ if status.state.is_some() && !current => "NotObserved",
            Some(ready) => ready.reason.as_str(),
            None => "Unknown",
        };
        *folded.row.not_ready.entry(reason.to_owned()).or_default() += 1;
        if status.state != Some(ManifestState::Error) || !current {
            return;
        }
        let name = manifest.name_any();
        let message = ready.map(|c| cut(&c.message)).unwrap_or_default();
        let since = ready.map(|c| c.last_transition_time.0);
        let failing = folded
            .failing
            .entry(reason.to_owned())
            .or_insert_with(|| Failing {
                manifests: 0,
                first: name.clone(),
                message: message.clone(),
                since,
            });
        failing.manifests += 1;
        failing.since = match (failing.since, since) {
            (Some(earlier), Some(since)) => Some(earlier.min(since)),
            (earlier, since) => earlier.or(since),
        };
        if name < failing.first {
            (failing.first, failing.message) = (name, message);
        }
    }

    /// The Secret keys seen, for reading their Secrets.
    pub fn keys(&self) -> impl Iterator<Item = &SecretKey> {
        self.rows.keys()
    }

    /// The answer, with what each target's Secret says (`secrets`; a key missing there gets
    /// no server and no credential) at `now`; `failing_only` keeps the failing and expiring.
    /// At most `limit` rows.
    pub fn answer(
        self,
        secrets: &BTreeMap<SecretKey, SecretFacts>,
        uses: &BTreeMap<SecretKey, BudgetUse>,
        now: SystemTime,
        failing_only: bool,
        limit: usize,
    ) -> TargetsAnswer {
        let mut answer = TargetsAnswer {
            targets: self.rows.len() as u64,
            manifests: self.manifests,
            ..Default::default()
        };
        let mut rows = Vec::with_capacity(self.rows.len());
        for (key, folded) in self.rows {
            let mut row = folded.row;
            (row.namespace, row.secret, row.key) =
                (key.namespace.clone(), key.name.clone(), key.key.clone());
            // The reason most failing Manifests have (ties: the first by name).
            let worst = folded
                .failing
                .into_iter()
                .max_by(|(ra, a), (rb, b)| a.manifests.cmp(&b.manifests).then(rb.cmp(ra)));
            if let Some((reason, failing)) = worst {
                *answer.by_reason.entry(reason.clone()).or_default() += 1;
                answer.failing += 1;
                (row.reason, row.message) = (Some(reason), Some(failing.message));
                row.failing_since = failing.since;
            }
            match secrets.get(&key) {
                Some(SecretFacts::Valid { server, credential }) => {
                    row.server = Some(server.clone());
                    row.credential_expires =
                        credential.and_then(|c| Timestamp::try_from(c.expires).ok());
                    row.credential_due = credential.is_some_and(|c| c.due(now));
                }
                Some(SecretFacts::Problem(problem)) => row.secret_problem = Some(problem.clone()),
                None => {}
            }
            answer.expiring += u64::from(row.credential_due);
            row.budget = uses.get(&key).cloned();
            answer.throttled +=
                u64::from(row.budget.as_ref().is_some_and(|b| b.waits_per_minute > 0));
            if !failing_only || row.reason.is_some() || row.credential_due {
                rows.push(row);
            }
        }
        rows.sort_by(|a, b| {
            (
                a.reason.is_none(),
                &a.reason,
                &a.namespace,
                &a.secret,
                &a.key,
            )
                .cmp(&(
                    b.reason.is_none(),
                    &b.reason,
                    &b.namespace,
                    &b.secret,
                    &b.key,
                ))
        });
        answer.rows_omitted = rows.len().saturating_sub(limit) as u64;
        rows.truncate(limit);
        answer.rows = rows;
        answer
    }
}

/// Each target's budget use over the fleet: what the live members published (`members`), with
/// `budget` the fleet-wide one.
pub fn budget_uses(members: &Members, budget: BudgetSettings) -> BTreeMap<SecretKey, BudgetUse> {
    let per_minute = budget.qps * 60.0;
    let mut uses: BTreeMap<SecretKey, BudgetUse> = BTreeMap::new();
    let published = members
        .members
        .iter()
        .filter(|m| m.live)
        .filter_map(|m| m.load.as_ref());
    for load in published {
        for used in &load.targets {
            let key = SecretKey {
                namespace: used.namespace.clone(),
                name: used.secret.clone(),
                key: used.key.clone(),
            };
            let total = uses.entry(key).or_default();
            total.requests_per_minute += used.requests;
            total.waits_per_minute += used.waits;
            total.replicas += 1;
        }
    }
    for total in uses.values_mut() {
        total.used = if per_minute > 0.0 {
            total.requests_per_minute as f64 / per_minute
        } else {
            0.0
        };
    }
    uses
}

/// `text` cut to [`MESSAGE_CHARS`] characters (an ellipsis marks the cut).
pub(super) fn cut(text: &str) -> String {
    match text.char_indices().nth(MESSAGE_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use serde_json::json;

    use super::*;
    use crate::api::ManifestStatus;
    use crate::apply::budget::TargetUse;
    use crate::shard::membership::{MemberLoad, MemberView};

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    /// A Manifest `name` on Secret `secret` (`None`: local) in `state`, its Ready condition with
    /// `reason` since `since`.
    fn manifest(
        name: &str,
        secret: Option<&str>,
        state: Option<ManifestState>,
        reason: &str,
        since: i64,
    ) -> Manifest {
        let mut spec = json!({"module": name, "chart": {"path": "c"}});
        if let Some(secret) = secret {
            spec["target"] = json!({"kubeconfigSecretRef": {"name": secret}});
        }
        let mut manifest: Manifest = serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": name, "namespace": "kcp", "generation": 1},
            "spec": spec,
        }))
        .unwrap();
        manifest.status = state.map(|state| ManifestStatus {
            state: Some(state),
            observed_generation: Some(1),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: if state == ManifestState::Ready {
                    "True"
                } else {
                    "False"
                }
                .into(),
                reason: reason.into(),
                message: format!("{name}: {reason}"),
                observed_generation: Some(1),
                last_transition_time: Time(at(since)),
            }],
            ..Default::default()
        });
        manifest
    }

    fn key(name: &str) -> SecretKey {
        SecretKey {
            namespace: "kcp".into(),
            name: name.into(),
            key: "kubeconfig".into(),
        }
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_100)
    }

    /// Target `a` with a due token, `c` whose Secret is missing.
    fn secrets() -> BTreeMap<SecretKey, SecretFacts> {
        BTreeMap::from([
            (
                key("a"),
                SecretFacts::Valid {
                    server: "https://a:6443".into(),
                    credential: Some(Validity {
                        issued: Some(now() - Duration::from_secs(3000)),
                        expires: now() + Duration::from_secs(600),
                    }),
                },
            ),
            (
                key("c"),
                SecretFacts::Problem("Secret kcp/c not found".into()),
            ),
        ])
    }

    #[test]
    fn targets_are_folded_from_their_manifests_and_failing_ones_come_first_by_reason() {
        let mut targets = Targets::default();
        let (ready, error) = (Some(ManifestState::Ready), Some(ManifestState::Error));
        let processing = Some(ManifestState::Processing);
        for m in [
            manifest("a1", Some("a"), ready, "Ready", 10),
            manifest("a2", Some("a"), ready, "Ready", 20),
            manifest("b2", Some("b"), error, "TargetUnreachable", 30),
            manifest("b1", Some("b"), error, "TargetUnreachable", 5),
            // Failing longer, with another reason: not the row's `failing_since`.
            manifest("b3", Some("b"), error, "ApplyError", 2),
            manifest("b4", Some("b"), processing, "Progressing", 7),
            manifest("c1", Some("c"), error, "TargetAuthError", 40),
            manifest("d1", Some("d"), None, "", 0),
            manifest("local", None, ready, "Ready", 1),
        ] {
            targets.add(&m);
        }
        let keys: Vec<&str> = targets.keys().map(|k| k.name.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c", "d"]);
        let answer = targets.answer(&secrets(), &BTreeMap::new(), now(), false, 1000);
        assert_eq!(
            (answer.targets, answer.manifests, answer.failing),
            (4, 8, 2)
        );
        assert_eq!(answer.expiring, 1);
        assert_eq!(
            answer.by_reason,
            BTreeMap::from([
                ("TargetAuthError".into(), 1),
                ("TargetUnreachable".into(), 1)
            ])
        );
        let order: Vec<&str> = answer.rows.iter().map(|r| r.secret.as_str()).collect();
        assert_eq!(order, ["c", "b", "a", "d"]);
        let b = &answer.rows[1];
        assert_eq!((b.manifests, b.ready), (4, 0));
        assert_eq!(b.reason.as_deref(), Some("TargetUnreachable"));
        assert_eq!(b.message.as_deref(), Some("b1: TargetUnreachable"));
        assert_eq!(b.failing_since, Some(at(5)));
        assert_eq!(
            b.not_ready,
            BTreeMap::from([
                ("ApplyError".into(), 1),
                ("Progressing".into(), 1),
                ("TargetUnreachable".into(), 2)
            ])
        );
        let a = &answer.rows[2];
        assert_eq!((a.ready, a.last_ready), (2, Some(at(20))));
        assert_eq!(a.server.as_deref(), Some("https://a:6443"));
        assert_eq!(a.credential_expires, Some(at(700)));
        assert!(a.credential_due, "600 s left of a 3600 s token");
        assert_eq!(
            answer.rows[0].secret_problem.as_deref(),
            Some("Secret kcp/c not found")
        );
        assert_eq!(
            answer.rows[3].not_ready,
            BTreeMap::from([("Unknown".into(), 1)])
        );
    }

    /// A member publishing its busiest targets (`(secret, requests, waits)`).
    fn publishing(name: &str, live: bool, targets: &[(&str, u64, u64)]) -> MemberView {
        let targets = targets
            .iter()
            .map(|&(secret, requests, waits)| TargetUse {
                namespace: "kcp".into(),
                secret: secret.into(),
                key: "kubeconfig".into(),
                requests,
                waits,
            })
            .collect();
        MemberView {
            name: name.into(),
            live,
            unchanged_for_seconds: 1.0,
            state: Default::default(),
            load: Some(MemberLoad {
                targets,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn budget_use_is_added_up_over_the_live_members_that_publish_it() {
        let members = Members {
            members: vec![
                publishing("mm-0", true, &[("a", 1200, 30), ("b", 60, 0)]),
                publishing("mm-1", true, &[("a", 1800, 0)]),
                // Gone: what it published last no longer counts.
                publishing("mm-2", false, &[("a", 9000, 900), ("c", 10, 0)]),
            ],
            ..Default::default()
        };
        let budget = BudgetSettings {
            qps: 50.0,
            burst: 100,
        };
        let uses = budget_uses(&members, budget);
        assert_eq!(
            uses.keys().cloned().collect::<Vec<_>>(),
            [key("a"), key("b")]
        );
        let a = &uses[&key("a")];
        assert_eq!(
            (a.requests_per_minute, a.waits_per_minute, a.replicas),
            (3000, 30, 2)
        );
        assert_eq!(a.used, 1.0, "3000 of 50 × 60 a minute");
        assert_eq!(uses[&key("b")].used, 60.0 / 3000.0);

        let mut targets = Targets::default();
        for name in ["a", "b", "d"] {
            targets.add(&manifest(
                name,
                Some(name),
                Some(ManifestState::Ready),
                "Ready",
                1,
            ));
        }
        let answer = targets.answer(&secrets(), &uses, now(), false, 1000);
        assert_eq!(answer.throttled, 1, "only a waited");
        let budgets: Vec<Option<u64>> = answer
            .rows
            .iter()
            .map(|r| r.budget.as_ref().map(|b| b.requests_per_minute))
            .collect();
        assert_eq!(budgets, [Some(3000), Some(60), None]);
    }

    #[test]
    fn only_the_failing_and_expiring_targets_are_kept_when_asked() {
        let mut again = Targets::default();
        for m in [
            manifest("a1", Some("a"), Some(ManifestState::Ready), "Ready", 10),
            manifest(
                "b1",
                Some("b"),
                Some(ManifestState::Error),
                "TargetUnreachable",
                5,
            ),
            manifest("e1", Some("e"), Some(ManifestState::Ready), "Ready", 10),
        ] {
            again.add(&m);
        }
        let failing = again
            .clone()
            .answer(&secrets(), &BTreeMap::new(), now(), true, 1000);
        let kept: Vec<&str> = failing.rows.iter().map(|r| r.secret.as_str()).collect();
        assert_eq!(kept, ["b", "a"]);
        assert_eq!((failing.targets, failing.rows_omitted), (3, 0));
        let mut stale = manifest("e2", Some("e"), Some(ManifestState::Ready), "Ready", 10);
        stale.metadata.generation = Some(2);
        again.add(&stale);
        let limited = again.answer(&secrets(), &BTreeMap::new(), now(), false, 2);
        assert_eq!((limited.rows.len(), limited.rows_omitted), (2, 1));
        let everything = {
            let mut all = Targets::default();
            all.add(&stale);
            all.answer(&secrets(), &BTreeMap::new(), now(), false, 10)
        };
        assert_eq!(
            everything.rows[0].not_ready,
            BTreeMap::from([("NotObserved".into(), 1)]),
            "a newer generation than the status describes"
        );
    }

    #[test]
    fn a_long_message_is_cut() {
        let long = "é".repeat(600);
        let cut = cut(&long);
        assert_eq!(cut.chars().count(), MESSAGE_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(super::cut("short"), "short");
    }
}
