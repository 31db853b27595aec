//! Readiness (pure): whether an applied object is ready, by kstatus' rules, from the object as
//! the server returned it.
//!
//! A port of sigs.k8s.io/cli-utils `pkg/kstatus/status` (`status.go` `Compute`, `generic.go`,
//! `core.go`): the generic properties first (deletion, `observedGeneration`, `Reconciling` and
//! `Stalled` conditions), then the rule of a built-in kind, then the `Ready` condition of any
//! other object. kstatus' `Current` is [`Readiness::Ready`], `InProgress` and `Terminating` are
//! [`Readiness::Waiting`], `Failed` is [`Readiness::Failed`]. One deliberate difference: a Job
//! is ready once complete (kstatus: once started), as a chart's Job that must finish (a
//! migration) is what `helm --wait-for-jobs` waits for.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::api::InventoryEntry;

/// An object's readiness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Ready (kstatus: `Current`).
    Ready,
    /// Not yet; the reason says what is awaited (kstatus: `InProgress`, `Terminating`).
    Waiting(String),
    /// Failed: it will not become ready without a change (kstatus: `Failed`).
    Failed(String),
}

/// How long a Pod may be unschedulable before it counts as failed (kstatus' `ScheduleWindow`).
const SCHEDULE_WINDOW: SignedDuration = SignedDuration::from_secs(15);

/// The readiness of `object` (identified by `id`) at `now`; the reasons name the object.
pub fn readiness(id: &InventoryEntry, object: &Value, now: Timestamp) -> Readiness {
    let verdict = generic(object)
        .or_else(|| by_kind(id, object, now))
        .or_else(|| ready_condition(object))
        .unwrap_or(Readiness::Ready);
    match verdict {
        Readiness::Ready => Readiness::Ready,
        Readiness::Waiting(why) => Readiness::Waiting(format!("{} {}: {why}", id.kind, id.name)),
        Readiness::Failed(why) => Readiness::Failed(format!("{} {}: {why}", id.kind, id.name)),
    }
}

/// Whether an object of this kind is ready for good once applied: its readiness is read from
/// the apply's answer and nothing reports on it later (no status a controller writes). A
/// progress re-check reads every other object (workloads, custom resources), not these.
pub fn settled_once_applied(id: &InventoryEntry) -> bool {
    matches!(
        (id.group.as_str(), id.kind.as_str()),
        ("", "ConfigMap" | "Secret" | "ServiceAccount" | "Service")
            | (
                "rbac.authorization.k8s.io",
                "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding"
            )
    )
}

/// When the wait for the applied objects' readiness began, for a pass that finds some not
/// ready: the previous start while the same generation and render are waited for, else `now`.
pub fn wait_started(previous: Option<&Time>, same_render: bool, now: Timestamp) -> Timestamp {
    match previous {
        Some(started) if same_render => started.0,
        _ => now,
    }
}

/// The longest a pass waits, right after applying objects that roll out, before it writes
/// `Processing` (docs/reconcile.md, "The rollout wait inside the pass"): workloads that become
/// ready within it cost one status write (`Ready`) instead of two.
pub const SETTLE_WAIT: Duration = Duration::from_secs(2);

/// The pause before the first look of that wait; each later one is twice the one before.
pub const SETTLE_FIRST_LOOK: Duration = Duration::from_millis(250);

/// The pause before the next look of a pass's wait for its workloads, or `None` to stop
/// waiting: after `looks` looks and `waited` in all, the next pause must end within
/// [`SETTLE_WAIT`], and no other key may be due (a worker that waits while others queue would
/// slow a burst: there, the pass writes `Processing` at once and the rollout is looked at later).
pub fn next_look(waited: Duration, looks: u32, others_due: bool) -> Option<Duration> {
    let pause = SETTLE_FIRST_LOOK.checked_mul(2u32.checked_pow(looks)?)?;
    (!others_due && waited + pause <= SETTLE_WAIT).then_some(pause)
}

/// Whether a wait that began at `started` has passed `timeout` at `now` (a start in the
/// future, from a clock ahead of this one, has not).
pub fn deadline_passed(started: Timestamp, now: Timestamp, timeout: Duration) -> bool {
    let timeout = SignedDuration::try_from(timeout).unwrap_or(SignedDuration::MAX);
    now.duration_since(started) >= timeout
}

/// Objects for a message: how many, then the first few with their reasons.
pub fn list(objects: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = format!(
        "{} object{}: ",
        objects.len(),
        if objects.len() == 1 { "" } else { "s" }
    );
    text.push_str(&objects[..objects.len().min(SHOWN)].join("; "));
    if objects.len() > SHOWN {
        text.push_str(&format!("; and {} more", objects.len() - SHOWN));
    }
    text
}

/// kstatus' `checkGenericProperties`: deletion, an unobserved generation, and the `Reconciling`
/// and `Stalled` conditions decide alone when present.
fn generic(object: &Value) -> Option<Readiness> {
    if object
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty())
    {
        return Some(Readiness::Waiting("being deleted".into()));
    }
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let observed = object
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    if let (Some(generation), Some(observed)) = (generation, observed)
        && generation != observed
    {
        return Some(Readiness::Waiting(format!(
            "generation {generation} not observed yet (observed {observed})"
        )));
    }
    for c in conditions(object) {
        match (c["type"].as_str(), c["status"].as_str()) {
            (Some("Reconciling"), Some("True")) => {
                return Some(Readiness::Waiting(described("reconciling", c)));
            }
            (Some("Stalled"), Some("True")) => {
                return Some(Readiness::Failed(described("stalled", c)));
            }
            _ => {}
        }
    }
    None
}

/// The rule of a built-in kind (kstatus' `legacyTypes`); `None` for other kinds.
fn by_kind(id: &InventoryEntry, object: &Value, now: Timestamp) -> Option<Readiness> {
    let ready = Some(Readiness::Ready);
    match (id.group.as_str(), id.kind.as_str()) {
        ("apps" | "extensions", "Deployment") => Some(deployment(object)),
        ("apps", "StatefulSet") => Some(stateful_set(object)),
        ("apps" | "extensions", "DaemonSet") => Some(daemon_set(object)),
        ("apps" | "extensions", "ReplicaSet") => Some(replica_set(object)),
        ("batch", "Job") => Some(job(object)),
        ("", "Pod") => Some(pod(object, now)),
        ("", "PersistentVolumeClaim") => Some(match text(object, "/status/phase") {
            "Bound" => Readiness::Ready,
            phase => waiting(format!("not Bound (phase {})", or_unknown(phase))),
        }),
        ("", "Service") => {
            let load_balancer = text(object, "/spec/type") == "LoadBalancer";
            if load_balancer && text(object, "/spec/clusterIP").is_empty() {
                Some(waiting("type LoadBalancer without a cluster IP yet"))
            } else {
                ready
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => Some(crd(object)),
        ("", "Secret" | "ConfigMap") | ("batch", "CronJob") | ("policy", "PodDisruptionBudget") => {
            ready
        }
        _ => None,
    }
}

/// A Deployment: failed past its progress deadline; else every replica updated, available and
/// ready, the new ReplicaSet available and the Deployment `Available`.
fn deployment(object: &Value) -> Readiness {
    // The API server defaults `progressDeadlineSeconds`; without one there is no Progressing
    // condition to wait for.
    let mut progressing = object.pointer("/spec/progressDeadlineSeconds").is_none();
    let mut available = false;
    for c in conditions(object) {
        match c["type"].as_str() {
            Some("Progressing") if c["reason"] == "ProgressDeadlineExceeded" => {
                return Readiness::Failed(described("progress deadline exceeded", c));
            }
            Some("Progressing")
                if c["status"] == "True" && c["reason"] == "NewReplicaSetAvailable" =>
            {
                progressing = true;
            }
            Some("Available") if c["status"] == "True" => available = true,
            _ => {}
        }
    }
    let spec = replicas(object);
    let status = int(object, "/status/replicas", 0);
    let updated = int(object, "/status/updatedReplicas", 0);
    let ready = int(object, "/status/readyReplicas", 0);
    let available_replicas = int(object, "/status/availableReplicas", 0);
    if let Some(short) = counts(&[
        (spec, status, "replicas"),
        (spec, updated, "replicas updated"),
    ]) {
        return short;
    }
    if status > spec {
        return waiting(format!("{} old replicas terminating", status - spec));
    }
    if let Some(short) = counts(&[
        (updated, available_replicas, "updated replicas available"),
        (spec, ready, "replicas ready"),
    ]) {
        return short;
    }
    if !progressing {
        waiting("the new ReplicaSet is not available yet")
    } else if !available {
        waiting("not Available")
    } else {
        Readiness::Ready
    }
}

/// A StatefulSet: every replica present, ready and current (or updated up to its partition);
/// `OnDelete` updates are not waited for.
fn stateful_set(object: &Value) -> Readiness {
    if text(object, "/spec/updateStrategy/type") == "OnDelete" {
        return Readiness::Ready;
    }
    let spec = replicas(object);
    let status = int(object, "/status/replicas", 0);
    let ready = int(object, "/status/readyReplicas", 0);
    if let Some(short) = counts(&[(spec, status, "replicas"), (spec, ready, "replicas ready")]) {
        return short;
    }
    if status > spec {
        return waiting(format!("{} old replicas terminating", status - spec));
    }
    let updated = int(object, "/status/updatedReplicas", 0);
    if let Some(partition) = object
        .pointer("/spec/updateStrategy/rollingUpdate/partition")
        .and_then(Value::as_i64)
    {
        return counts(&[(spec - partition, updated, "replicas updated (partition)")])
            .unwrap_or(Readiness::Ready);
    }
    let current = int(object, "/status/currentReplicas", 0);
    if let Some(short) = counts(&[(spec, current, "replicas current")]) {
        return short;
    }
    if text(object, "/status/currentRevision") == text(object, "/status/updateRevision") {
        Readiness::Ready
    } else {
        waiting("the update revision is not the current one yet")
    }
}

/// A DaemonSet: its generation observed, and every desired pod scheduled, updated, available
/// and ready.
fn daemon_set(object: &Value) -> Readiness {
    if object.pointer("/metadata/generation").is_none()
        || object.pointer("/status/observedGeneration").is_none()
    {
        return waiting("the controller has not observed it yet");
    }
    let Some(desired) = object
        .pointer("/status/desiredNumberScheduled")
        .and_then(Value::as_i64)
    else {
        return waiting("no desired number of pods yet");
    };
    counts(&[
        (
            desired,
            int(object, "/status/currentNumberScheduled", 0),
            "pods scheduled",
        ),
        (
            desired,
            int(object, "/status/updatedNumberScheduled", 0),
            "pods updated",
        ),
        (
            desired,
            int(object, "/status/numberAvailable", 0),
            "pods available",
        ),
        (desired, int(object, "/status/numberReady", 0), "pods ready"),
    ])
    .unwrap_or(Readiness::Ready)
}

/// A ReplicaSet: no replica failure, every replica labelled, available and ready.
fn replica_set(object: &Value) -> Readiness {
    if let Some(c) =
        conditions(object).find(|c| c["type"] == "ReplicaFailure" && c["status"] == "True")
    {
        return waiting(described("replica failure", c));
    }
    let spec = replicas(object);
    if let Some(short) = counts(&[
        (
            spec,
            int(object, "/status/fullyLabeledReplicas", 0),
            "replicas labelled",
        ),
        (
            spec,
            int(object, "/status/availableReplicas", 0),
            "replicas available",
        ),
        (
            spec,
            int(object, "/status/readyReplicas", 0),
            "replicas ready",
        ),
    ]) {
        return short;
    }
    let status = int(object, "/status/replicas", 0);
    if status > spec {
        waiting(format!("{} old replicas terminating", status - spec))
    } else {
        Readiness::Ready
    }
}

/// A Job: failed once `Failed`; ready once `Complete` (or suspended).
fn job(object: &Value) -> Readiness {
    for c in conditions(object) {
        match (c["type"].as_str(), c["status"] == "True") {
            (Some("Complete"), true) => return Readiness::Ready,
            (Some("Failed"), true) => return Readiness::Failed(described("failed", c)),
            (Some("Suspended"), true) if object["spec"]["suspend"] == true => {
                return Readiness::Ready;
            }
            _ => {}
        }
    }
    if text(object, "/status/startTime").is_empty() {
        waiting("not started")
    } else {
        waiting("not complete")
    }
}

/// A Pod: ready when running and `Ready`, or finished; failed when crash-looping, or when it
/// could not be scheduled for longer than the schedule window.
fn pod(object: &Value, now: Timestamp) -> Readiness {
    match text(object, "/status/phase") {
        "Succeeded" | "Failed" => Readiness::Ready,
        "Running" => {
            if conditions(object).any(|c| c["type"] == "Ready" && c["status"] == "True") {
                return Readiness::Ready;
            }
            let crashing: Vec<&str> = object
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|s| s.pointer("/state/waiting/reason") == Some(&"CrashLoopBackOff".into()))
                .filter_map(|s| s["name"].as_str())
                .collect();
            if crashing.is_empty() {
                waiting("running but not Ready")
            } else {
                Readiness::Failed(format!("containers crash-looping: {}", crashing.join(", ")))
            }
        }
        "Pending" => {
            let unschedulable = conditions(object).any(|c| {
                c["type"] == "PodScheduled"
                    && c["status"] == "False"
                    && c["reason"] == "Unschedulable"
            });
            let created = text(object, "/metadata/creationTimestamp").parse::<Timestamp>();
            let old = created.is_ok_and(|created| now.duration_since(created) > SCHEDULE_WINDOW);
            if unschedulable && old {
                Readiness::Failed("could not be scheduled".into())
            } else if unschedulable {
                waiting("not scheduled yet")
            } else {
                waiting("Pending")
            }
        }
        "" => waiting("no phase yet"),
        phase => waiting(format!("unknown phase {phase}")),
    }
}

/// A CRD: failed when its names are not accepted or it is not established (other than while
/// installing); ready once `Established`.
fn crd(object: &Value) -> Readiness {
    for c in conditions(object) {
        let status = c["status"].as_str();
        match c["type"].as_str() {
            Some("NamesAccepted") if status == Some("False") => {
                return Readiness::Failed(described("names not accepted", c));
            }
            Some("Established") if status == Some("False") && c["reason"] != "Installing" => {
                return Readiness::Failed(described("not established", c));
            }
            Some("Established") if status == Some("True") => return Readiness::Ready,
            _ => {}
        }
    }
    waiting("not established yet")
}

/// kstatus' `checkReadyCondition`, for kinds without a rule: a `Ready` condition that is not
/// `True` means not ready yet.
fn ready_condition(object: &Value) -> Option<Readiness> {
    let c = conditions(object).find(|c| c["type"] == "Ready")?;
    match c["status"].as_str() {
        Some("True") => Some(Readiness::Ready),
        Some("False" | "Unknown") => Some(waiting(described("not Ready", c))),
        _ => None,
    }
}

/// The first of `(wanted, have, what)` that falls short, as "have of wanted what".
fn counts(checks: &[(i64, i64, &str)]) -> Option<Readiness> {
    checks
        .iter()
        .find(|(wanted, have, _)| wanted > have)
        .map(|(wanted, have, what)| waiting(format!("{have} of {wanted} {what}")))
}

fn waiting(why: impl Into<String>) -> Readiness {
    Readiness::Waiting(why.into())
}

/// `what`, with the condition's reason and message when it has them.
fn described(what: &str, condition: &Value) -> String {
    let reason = condition["reason"].as_str().unwrap_or_default();
    let message = condition["message"].as_str().unwrap_or_default();
    match (reason.is_empty(), message.is_empty()) {
        (true, true) => what.to_owned(),
        (false, true) => format!("{what} ({reason})"),
        (true, false) => format!("{what}: {message}"),
        (false, false) => format!("{what} ({reason}): {message}"),
    }
}

fn conditions(object: &Value) -> impl Iterator<Item = &Value> {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn int(object: &Value, pointer: &str, default: i64) -> i64 {
    object
        .pointer(pointer)
        .and_then(Value::as_i64)
        .unwrap_or(default)
}

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn or_unknown(phase: &str) -> &str {
    if phase.is_empty() { "unknown" } else { phase }
}

/// `spec.replicas`, which defaults to 1.
fn replicas(object: &Value) -> i64 {
    int(object, "/spec/replicas", 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What a rule must answer: ready, waiting (the reason contains the text) or failed (ditto).
    #[derive(Debug)]
    enum Want {
        Ready,
        Waiting(&'static str),
        Failed(&'static str),
    }

    fn now() -> Timestamp {
        "2026-12-01T12:00:00Z".parse().unwrap()
    }

    /// Checks each `(group, kind, object, want)` row; names the row that fails.
    fn check(rows: Vec<(&str, &str, Value, Want)>) {
        for (group, kind, object, want) in rows {
            let id = InventoryEntry {
                group: group.into(),
                version: "v1".into(),
                kind: kind.into(),
                namespace: "ns".into(),
                name: "x".into(),
            };
            let got = readiness(&id, &object, now());
            let ok = match (&want, &got) {
                (Want::Ready, Readiness::Ready) => true,
                (Want::Waiting(text), Readiness::Waiting(why))
                | (Want::Failed(text), Readiness::Failed(why)) => {
                    why.starts_with(&format!("{kind} x: ")) && why.contains(text)
                }
                _ => false,
            };
            assert!(ok, "{kind} {object}: want {want:?}, got {got:?}");
        }
    }

    #[test]
    fn a_pass_waits_for_its_workloads_a_bounded_time_and_not_while_others_queue() {
        let ms = Duration::from_millis;
        // Looks at 0.25, 0.75 and 1.75 s; a fourth would end past the bound.
        assert_eq!(next_look(Duration::ZERO, 0, false), Some(ms(250)));
        assert_eq!(next_look(ms(260), 1, false), Some(ms(500)));
        assert_eq!(next_look(ms(770), 2, false), Some(ms(1000)));
        assert_eq!(next_look(ms(1780), 3, false), None);
        // Slow looks (a slow API server) end the wait sooner: never past the bound.
        assert_eq!(next_look(ms(1100), 2, false), None);
        let mut waited = Duration::ZERO;
        let mut looks = 0;
        while let Some(pause) = next_look(waited, looks, false) {
            waited += pause;
            looks += 1;
        }
        assert!(waited <= SETTLE_WAIT && looks == 3, "{waited:?} {looks}");
        // Other keys due: no wait at all, or no further look.
        assert_eq!(next_look(Duration::ZERO, 0, true), None);
        assert_eq!(next_look(ms(260), 1, true), None);
        assert_eq!(next_look(Duration::ZERO, 40, false), None, "no overflow");
    }

    #[test]
    fn a_progress_recheck_reads_workloads_and_custom_resources_not_settled_kinds() {
        let id = crate::plan::test_object;
        for (group, kind) in [("", "ConfigMap"), ("", "Service"), ("", "ServiceAccount")] {
            assert!(settled_once_applied(&id(group, kind)), "{kind}");
        }
        assert!(settled_once_applied(&id(
            "rbac.authorization.k8s.io",
            "RoleBinding"
        )));
        for (group, kind) in [
            ("apps", "Deployment"),
            ("batch", "Job"),
            ("", "PersistentVolumeClaim"),
            ("", "Pod"),
            ("policy", "PodDisruptionBudget"),
            ("example.com", "ConfigMap"),
        ] {
            assert!(!settled_once_applied(&id(group, kind)), "{group}/{kind}");
        }
    }

    /// A Deployment of `spec` replicas with these status counts and conditions, as the
    /// Deployment controller writes it (the API server defaults `progressDeadlineSeconds`).
    fn deployment(spec: i64, counts: [i64; 4], conditions: Value) -> Value {
        let [replicas, updated, ready, available] = counts;
        json!({"metadata": {"generation": 2},
            "spec": {"replicas": spec, "progressDeadlineSeconds": 600},
            "status": {"observedGeneration": 2, "replicas": replicas, "updatedReplicas": updated,
                "readyReplicas": ready, "availableReplicas": available, "conditions": conditions}})
    }

    fn rolled_out() -> Value {
        json!([{"type": "Available", "status": "True"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}])
    }

    #[test]
    fn the_wait_counts_from_the_first_apply_of_a_render_and_lists_what_it_waits_for() {
        let then: Timestamp = "2026-12-01T11:58:00Z".parse().unwrap();
        assert_eq!(wait_started(Some(&Time(then)), true, now()), then);
        assert_eq!(
            wait_started(Some(&Time(then)), false, now()),
            now(),
            "a new render"
        );
        assert_eq!(wait_started(None, true, now()), now(), "ready before");
        assert!(deadline_passed(then, now(), Duration::from_secs(120)));
        assert!(!deadline_passed(then, now(), Duration::from_secs(121)));
        assert!(
            !deadline_passed(now(), then, Duration::from_secs(1)),
            "a clock behind"
        );
        assert!(!deadline_passed(then, now(), Duration::MAX));
        assert_eq!(
            list(&["Deployment a: x".into()]),
            "1 object: Deployment a: x"
        );
        let seven: Vec<String> = (1..=7).map(|i| format!("Pod p{i}: Pending")).collect();
        let text = list(&seven);
        assert!(
            text.starts_with("7 objects: Pod p1: Pending; Pod p2"),
            "{text}"
        );
        assert!(text.ends_with("Pod p5: Pending; and 2 more"), "{text}");
    }

    #[test]
    fn deployments() {
        let stale = json!({"metadata": {"generation": 3}, "spec": {"replicas": 1},
            "status": {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                "readyReplicas": 1, "availableReplicas": 1, "conditions": rolled_out()}});
        let deadline = json!([{"type": "Progressing", "status": "False",
            "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet \"x-1\" has timed out progressing."}]);
        let rolling = json!([{"type": "Available", "status": "True"},
            {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}]);
        check(vec![
            (
                "apps",
                "Deployment",
                deployment(2, [2, 2, 2, 2], rolled_out()),
                Want::Ready,
            ),
            (
                "apps",
                "Deployment",
                deployment(0, [0, 0, 0, 0], rolled_out()),
                Want::Ready,
            ),
            (
                "apps",
                "Deployment",
                stale,
                Want::Waiting("generation 3 not observed"),
            ),
            (
                "apps",
                "Deployment",
                json!({"metadata": {"generation": 1}, "spec": {}}),
                Want::Waiting("0 of 1 replicas"),
            ),
            (
                "apps",
                "Deployment",
                deployment(2, [2, 1, 2, 2], rolled_out()),
                Want::Waiting("1 of 2 replicas updated"),
            ),
            (
                "apps",
                "Deployment",
                deployment(2, [3, 2, 2, 2], rolled_out()),
                Want::Waiting("1 old replicas terminating"),
            ),
            (
                "apps",
                "Deployment",
                deployment(2, [2, 2, 2, 1], rolled_out()),
                Want::Waiting("1 of 2 updated replicas available"),
            ),
            (
                "apps",
                "Deployment",
                deployment(2, [2, 2, 1, 2], rolled_out()),
                Want::Waiting("1 of 2 replicas ready"),
            ),
            (
                "apps",
                "Deployment",
                deployment(2, [2, 2, 2, 2], rolling),
                Want::Waiting("new ReplicaSet"),
            ),
            (
                "apps",
                "Deployment",
                deployment(
                    2,
                    [2, 2, 2, 2],
                    json!([{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]),
                ),
                Want::Waiting("not Available"),
            ),
            (
                "apps",
                "Deployment",
                deployment(2, [2, 1, 0, 0], deadline),
                Want::Failed("progress deadline exceeded (ProgressDeadlineExceeded): ReplicaSet"),
            ),
        ]);
    }

    #[test]
    fn stateful_sets() {
        let sts = |spec: Value, status: Value| json!({"metadata": {"generation": 1}, "spec": spec, "status": status});
        let all = json!({"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "currentReplicas": 3,
            "updatedReplicas": 3, "currentRevision": "r2", "updateRevision": "r2"});
        let mut revision = all.clone();
        revision["updateRevision"] = json!("r3");
        let partitioned = json!({"replicas": 3, "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}});
        let mut one_updated = all.clone();
        one_updated["updatedReplicas"] = json!(1);
        let mut none_updated = all.clone();
        none_updated["updatedReplicas"] = json!(0);
        check(vec![
            (
                "apps",
                "StatefulSet",
                sts(json!({"replicas": 3}), all.clone()),
                Want::Ready,
            ),
            (
                "apps",
                "StatefulSet",
                sts(
                    json!({"replicas": 3}),
                    json!({"observedGeneration": 1, "replicas": 3, "readyReplicas": 2}),
                ),
                Want::Waiting("2 of 3 replicas ready"),
            ),
            (
                "apps",
                "StatefulSet",
                sts(
                    json!({"replicas": 3}),
                    json!({"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "currentReplicas": 1}),
                ),
                Want::Waiting("1 of 3 replicas current"),
            ),
            (
                "apps",
                "StatefulSet",
                sts(json!({"replicas": 3}), revision),
                Want::Waiting("update revision"),
            ),
            (
                "apps",
                "StatefulSet",
                sts(partitioned.clone(), one_updated),
                Want::Ready,
            ),
            (
                "apps",
                "StatefulSet",
                sts(partitioned, none_updated),
                Want::Waiting("0 of 1 replicas updated"),
            ),
            (
                "apps",
                "StatefulSet",
                sts(
                    json!({"replicas": 3, "updateStrategy": {"type": "OnDelete"}}),
                    json!({}),
                ),
                Want::Ready,
            ),
        ]);
    }

    #[test]
    fn daemon_sets_and_replica_sets() {
        let ds = |counts: [i64; 5]| {
            let [desired, current, updated, available, ready] = counts;
            json!({"metadata": {"generation": 1}, "status": {"observedGeneration": 1,
                "desiredNumberScheduled": desired, "currentNumberScheduled": current,
                "updatedNumberScheduled": updated, "numberAvailable": available, "numberReady": ready}})
        };
        let rs = |labelled: i64, available: i64, ready: i64, conditions: Value| {
            json!({"spec": {"replicas": 2}, "status": {"replicas": 2, "fullyLabeledReplicas": labelled,
                "availableReplicas": available, "readyReplicas": ready, "conditions": conditions}})
        };
        let failure = json!([{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "quota"}]);
        check(vec![
            ("apps", "DaemonSet", ds([2, 2, 2, 2, 2]), Want::Ready),
            (
                "apps",
                "DaemonSet",
                ds([2, 2, 2, 1, 2]),
                Want::Waiting("1 of 2 pods available"),
            ),
            (
                "apps",
                "DaemonSet",
                ds([2, 2, 2, 2, 1]),
                Want::Waiting("1 of 2 pods ready"),
            ),
            (
                "apps",
                "DaemonSet",
                json!({"metadata": {"generation": 1}}),
                Want::Waiting("not observed it yet"),
            ),
            (
                "apps",
                "DaemonSet",
                json!({"metadata": {"generation": 1}, "status": {"observedGeneration": 1}}),
                Want::Waiting("no desired number"),
            ),
            ("apps", "ReplicaSet", rs(2, 2, 2, json!([])), Want::Ready),
            (
                "apps",
                "ReplicaSet",
                rs(2, 1, 1, json!([])),
                Want::Waiting("1 of 2 replicas available"),
            ),
            (
                "apps",
                "ReplicaSet",
                rs(2, 2, 2, failure),
                Want::Waiting("replica failure (FailedCreate): quota"),
            ),
        ]);
    }

    #[test]
    fn jobs() {
        let job = |status: Value| json!({"spec": {"suspend": true}, "status": status});
        check(vec![
            ("batch", "Job", json!({}), Want::Waiting("not started")),
            (
                "batch",
                "Job",
                job(json!({"startTime": "2026-12-01T11:00:00Z"})),
                Want::Waiting("not complete"),
            ),
            (
                "batch",
                "Job",
                job(json!({"conditions": [{"type": "Complete", "status": "True"}]})),
                Want::Ready,
            ),
            (
                "batch",
                "Job",
                job(json!({"conditions": [{"type": "Suspended", "status": "True"}]})),
                Want::Ready,
            ),
            (
                "batch",
                "Job",
                job(
                    json!({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}),
                ),
                Want::Failed("BackoffLimitExceeded"),
            ),
        ]);
    }

    #[test]
    fn pods() {
        let pod = |status: Value, created: &str| json!({"metadata": {"creationTimestamp": created}, "status": status});
        let unschedulable = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]});
        let crash = json!({"phase": "Running", "containerStatuses": [{"name": "app", "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            {"name": "sidecar", "state": {"running": {}}}]});
        check(vec![
            (
                "",
                "Pod",
                pod(
                    json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
                    "2026-12-01T11:00:00Z",
                ),
                Want::Ready,
            ),
            (
                "",
                "Pod",
                pod(json!({"phase": "Succeeded"}), "2026-12-01T11:00:00Z"),
                Want::Ready,
            ),
            (
                "",
                "Pod",
                pod(json!({"phase": "Running"}), "2026-12-01T11:00:00Z"),
                Want::Waiting("running but not Ready"),
            ),
            (
                "",
                "Pod",
                pod(crash, "2026-12-01T11:00:00Z"),
                Want::Failed("crash-looping: app"),
            ),
            (
                "",
                "Pod",
                pod(unschedulable.clone(), "2026-12-01T11:59:50Z"),
                Want::Waiting("not scheduled yet"),
            ),
            (
                "",
                "Pod",
                pod(unschedulable, "2026-12-01T11:59:00Z"),
                Want::Failed("could not be scheduled"),
            ),
            (
                "",
                "Pod",
                pod(json!({"phase": "Pending"}), "2026-12-01T11:00:00Z"),
                Want::Waiting("Pending"),
            ),
            (
                "",
                "Pod",
                pod(json!({}), "2026-12-01T11:00:00Z"),
                Want::Waiting("no phase"),
            ),
        ]);
    }

    #[test]
    fn claims_services_crds_and_always_ready_kinds() {
        let crd = |conditions: Value| json!({"status": {"conditions": conditions}});
        check(vec![
            (
                "",
                "PersistentVolumeClaim",
                json!({"status": {"phase": "Bound"}}),
                Want::Ready,
            ),
            (
                "",
                "PersistentVolumeClaim",
                json!({"status": {"phase": "Pending"}}),
                Want::Waiting("not Bound (phase Pending)"),
            ),
            (
                "",
                "PersistentVolumeClaim",
                json!({}),
                Want::Waiting("phase unknown"),
            ),
            (
                "",
                "Service",
                json!({"spec": {"type": "ClusterIP", "clusterIP": ""}}),
                Want::Ready,
            ),
            (
                "",
                "Service",
                json!({"spec": {"type": "LoadBalancer", "clusterIP": "10.0.0.1"}}),
                Want::Ready,
            ),
            (
                "",
                "Service",
                json!({"spec": {"type": "LoadBalancer"}}),
                Want::Waiting("LoadBalancer"),
            ),
            (
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                crd(json!([{"type": "Established", "status": "True"}])),
                Want::Ready,
            ),
            (
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                crd(json!([{"type": "Established", "status": "False", "reason": "Installing"}])),
                Want::Waiting("not established yet"),
            ),
            (
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                crd(
                    json!([{"type": "NamesAccepted", "status": "False", "reason": "NameConflict"}]),
                ),
                Want::Failed("NameConflict"),
            ),
            (
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                crd(json!([{"type": "Established", "status": "False", "reason": "Broken"}])),
                Want::Failed("not established (Broken)"),
            ),
            ("", "ConfigMap", json!({}), Want::Ready),
            (
                "",
                "Secret",
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
                Want::Ready,
            ),
            ("batch", "CronJob", json!({}), Want::Ready),
            ("policy", "PodDisruptionBudget", json!({}), Want::Ready),
        ]);
    }

    #[test]
    fn any_other_object_by_its_generic_conditions() {
        let cr = |generation: i64, observed: Option<i64>, conditions: Value| {
            let mut status = json!({"conditions": conditions});
            if let Some(observed) = observed {
                status["observedGeneration"] = json!(observed);
            }
            json!({"metadata": {"generation": generation}, "status": status})
        };
        let ready = json!([{"type": "Ready", "status": "True"}]);
        check(vec![
            (
                "example.com",
                "Gadget",
                json!({"metadata": {"generation": 1}}),
                Want::Ready,
            ),
            (
                "example.com",
                "Gadget",
                cr(1, Some(1), ready.clone()),
                Want::Ready,
            ),
            (
                "example.com",
                "Gadget",
                cr(2, Some(1), ready.clone()),
                Want::Waiting("generation 2 not observed yet (observed 1)"),
            ),
            ("example.com", "Gadget", cr(2, None, ready), Want::Ready),
            (
                "example.com",
                "Gadget",
                cr(
                    1,
                    Some(1),
                    json!([{"type": "Ready", "status": "False", "reason": "Degraded", "message": "no quorum"}]),
                ),
                Want::Waiting("not Ready (Degraded): no quorum"),
            ),
            (
                "example.com",
                "Gadget",
                cr(1, Some(1), json!([{"type": "Ready", "status": "Unknown"}])),
                Want::Waiting("not Ready"),
            ),
            (
                "example.com",
                "Gadget",
                cr(
                    1,
                    Some(1),
                    json!([{"type": "Ready", "status": "True"}, {"type": "Reconciling", "status": "True", "reason": "Progressing"}]),
                ),
                Want::Waiting("reconciling (Progressing)"),
            ),
            (
                "example.com",
                "Gadget",
                cr(
                    1,
                    Some(1),
                    json!([{"type": "Stalled", "status": "True", "reason": "InvalidSpec", "message": "bad size"}]),
                ),
                Want::Failed("stalled (InvalidSpec): bad size"),
            ),
            (
                "example.com",
                "Gadget",
                cr(
                    1,
                    Some(1),
                    json!([{"type": "Stalled", "status": "False"}, {"type": "Reconciling", "status": "False"}]),
                ),
                Want::Ready,
            ),
        ]);
    }

    #[test]
    fn generic_properties_come_before_a_kinds_own_rule() {
        let deleted = "2026-12-01T11:00:00Z";
        let stalled = json!([{"type": "Stalled", "status": "True", "reason": "Quota"}]);
        check(vec![
            (
                "apps",
                "Deployment",
                json!({"metadata": {"generation": 1, "deletionTimestamp": deleted}}),
                Want::Waiting("being deleted"),
            ),
            (
                "",
                "ConfigMap",
                json!({"metadata": {"deletionTimestamp": deleted}}),
                Want::Waiting("being deleted"),
            ),
            (
                "apps",
                "Deployment",
                deployment(1, [1, 1, 1, 1], stalled),
                Want::Failed("stalled (Quota)"),
            ),
        ]);
    }
}
