//! Membership Leases on a real kube-apiserver: replicas see each other live, a crashed replica
//! (Lease left behind, no longer renewed) turns dead after the lease duration on the observer's
//! clock, and a replica that shuts down cleanly leaves at once.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

use std::time::{Duration, Instant};

use kube::ResourceExt;
use module_manager::shard::membership::{self, Members, MembershipConfig};
use test_support::objects;
use tokio::sync::{oneshot, watch};

/// A client of the shared control plane and a new namespace named after `prefix`.
async fn namespace(prefix: &str) -> (kube::Client, String) {
    let control_plane = testenv::shared(testenv::Options::default())
        .await
        .expect("control plane");
    let client = control_plane.client().await.unwrap();
    let ns = control_plane.namespace(&client, prefix).await.unwrap();
    (client, ns)
}

fn config(namespace: &str, replica: &str) -> MembershipConfig {
    MembershipConfig {
        namespace: namespace.into(),
        fleet: "test".into(),
        replica: replica.into(),
        lease_duration: Duration::from_secs(3),
        renew_interval: Duration::from_millis(300),
    }
}

/// Starts a member; returns its view, a clean-shutdown trigger and its task (abort = crash).
fn member(
    client: &kube::Client,
    namespace: &str,
    replica: &str,
) -> (
    watch::Receiver<Members>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (view, receiver) = watch::channel(Members::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(membership::run(
        client.clone(),
        config(namespace, replica),
        view,
        async move {
            let _ = stopped.await;
        },
    ));
    (receiver, stop, task)
}

async fn wait_for(
    view: &mut watch::Receiver<Members>,
    what: &str,
    done: impl Fn(&Members) -> bool,
) -> Duration {
    let start = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(30), view.wait_for(|m| done(m))).await;
    assert!(
        result.is_ok_and(|r| r.is_ok()),
        "timed out waiting for {what}; view: {:?}",
        *view.borrow()
    );
    start.elapsed()
}

#[tokio::test]
async fn members_see_each_other_crashes_expire_and_clean_leaves_are_immediate() {
    let (client, ns) = namespace("membership").await;
    let names = |list: &[&str]| {
        list.iter()
            .map(|s| s.to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };

    let (mut a, _stop_a, _task_a) = member(&client, &ns, "module-manager-0");
    let (_b, _stop_b, task_b) = member(&client, &ns, "module-manager-1");
    let (_c, stop_c, task_c) = member(&client, &ns, "module-manager-2");
    wait_for(&mut a, "all three live", |m| {
        m.live() == names(&["module-manager-0", "module-manager-1", "module-manager-2"])
            && m.self_renewed
    })
    .await;

    // A crash: the task is gone, its Lease stays and stops changing.
    task_b.abort();
    let took = wait_for(&mut a, "the crashed member to turn dead", |m| {
        m.live() == names(&["module-manager-0", "module-manager-2"])
            && m.members.iter().any(|v| v.name == "module-manager-1")
    })
    .await;
    assert!(
        took >= Duration::from_secs(2),
        "not before (about) the lease duration: {took:?}"
    );

    // A clean leave deletes the Lease: gone from the view within a renew interval or two.
    stop_c.send(()).unwrap();
    task_c.await.unwrap();
    let took = wait_for(&mut a, "the member that left to disappear", |m| {
        !m.members.iter().any(|v| v.name == "module-manager-2")
    })
    .await;
    assert!(
        took < Duration::from_secs(3),
        "faster than an expiry: {took:?}"
    );
}

/// Writes to the own Lease are conditional on the version last written: a renewal after a change
/// by someone else re-reads and succeeds (and says so), a late renewal cannot undo a later write,
/// and after a leave this replica renews no more.
#[tokio::test]
async fn renewals_are_conditional_and_cannot_undo_a_leave() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, Patch, PatchParams};
    use module_manager::shard::membership::{MemberState, Membership};
    let (client, ns) = namespace("renewals").await;
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let config = config(&ns, "module-manager-0");
    let name = config.lease_name("module-manager-0");
    let membership = Membership::new(client.clone(), config);
    let renewer = membership.renewer();
    assert!(renewer.renew(MemberState::Active, None).await);
    assert!(renewer.renew(MemberState::Restarting, None).await);

    // Someone else changes the Lease: the next renewal conflicts, re-reads, and succeeds.
    leases
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    assert!(renewer.renew(MemberState::Active, None).await);
    let lease = leases.get(&name).await.unwrap();
    assert!(
        !lease.annotations().contains_key("modulemanager.io/state"),
        "the renewal after the conflict was applied"
    );

    // A renewal sent earlier that lands late carries the version it expected: the API server
    // refuses it (409) instead of undoing what was written since (e.g. the `restarting` mark).
    let stale = lease.resource_version();
    assert!(renewer.renew(MemberState::Restarting, None).await);
    let late = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "resourceVersion": stale},
        "spec": {"holderIdentity": "module-manager-0"},
    });
    let refused = leases
        .patch(
            &name,
            &PatchParams::apply("module-manager-module-manager-0").force(),
            &Patch::Apply(&late),
        )
        .await;
    assert!(
        matches!(refused, Err(kube::Error::Api(ref s)) if s.code == 409),
        "a late conditional renewal is refused: {refused:?}"
    );

    membership.leave().await;
    assert!(!objects::exists(&leases, &name).await);
    assert!(
        !renewer.renew(MemberState::Active, None).await,
        "a renewal after the leave fails"
    );
    assert!(
        !objects::exists(&leases, &name).await,
        "and does not recreate the Lease"
    );
}

struct Idle;

impl module_manager::shard::fleet::LocalWork for Idle {
    fn in_flight(&self, _: u32) -> usize {
        0
    }
    fn load(&self) -> module_manager::shard::membership::MemberLoad {
        Default::default()
    }
}

/// One process's fleet side as far as the fence goes: its membership, the production renewal
/// task, and its ownership (given shard 0 once its first renewal succeeded, as a round would).
struct Process {
    membership: module_manager::shard::membership::Membership,
    ownership: std::sync::Arc<module_manager::shard::fence::Ownership>,
    metrics: module_manager::telemetry::metrics::FleetMetrics,
    _renewals: (oneshot::Sender<()>, tokio::task::JoinHandle<()>),
    _announce: watch::Sender<module_manager::shard::membership::MemberState>,
    _drain: watch::Sender<bool>,
}

/// Generous for a loaded machine: the fence of the process that keeps working holds while at
/// least one renewal (each bounded by the renew interval) succeeds per deadline.
const DEADLINE: Duration = Duration::from_secs(5);

async fn process(client: &kube::Client, namespace: &str, replica: &str) -> Process {
    use module_manager::shard::fence::{Grant, Ownership};
    use module_manager::shard::fleet::{RenewalContext, spawn_renewals};
    use module_manager::shard::membership::{MemberState, Membership};
    let config = MembershipConfig {
        renew_interval: Duration::from_secs(1),
        ..config(namespace, replica)
    };
    let membership = Membership::new(client.clone(), config.clone());
    let ownership = Ownership::new();
    let metrics = module_manager::telemetry::metrics::FleetMetrics::default();
    let (announce_tx, announce) = watch::channel(MemberState::Active);
    let (drain_tx, drain) = watch::channel(false);
    let renewer = membership.renewer();
    let renewals = spawn_renewals(
        membership.renewer(),
        RenewalContext {
            announce,
            drain,
            work: std::sync::Arc::new(Idle),
            metrics: metrics.clone(),
            ownership: ownership.clone(),
            interval: config.renew_interval,
            renew_deadline: DEADLINE,
        },
    );
    let start = Instant::now();
    let renewed_at = loop {
        if let Some(at) = renewer.renewed_at() {
            break at;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{replica} never renewed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ownership.set(
        [(0, 1)].into(),
        Default::default(),
        Grant::new(renewed_at, DEADLINE),
    );
    Process {
        membership,
        ownership,
        metrics,
        _renewals: renewals,
        _announce: announce_tx,
        _drain: drain_tx,
    }
}

/// Issue 15 item 8: a second process under the same replica name takes the membership Lease
/// over; the first is fenced at its next renewal and stays fenced (it no longer overwrites the
/// Lease), the second keeps working, and the first reports it (metric, Event). Before, the first
/// re-read the version on the conflict and overwrote the Lease: both kept renewing and acting.
#[tokio::test]
async fn two_processes_under_one_name_exactly_one_keeps_working() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::Api;
    use module_manager::shard::membership::MEMBER_INCARNATION_ANNOTATION;
    let (client, ns) = namespace("one-name").await;
    let first = process(&client, &ns, "module-manager-0").await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // a renewal or two
    assert!(first.ownership.in_time(), "the first works alone");

    let second = process(&client, &ns, "module-manager-0").await;
    let start = Instant::now();
    while !first.ownership.is_superseded() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the first process was never fenced: it keeps renewing the Lease the second took over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // For longer than the renew deadline (many renewals of both): exactly one works.
    let watched = Instant::now();
    while watched.elapsed() < DEADLINE * 2 {
        assert!(
            !first.ownership.in_time() && first.ownership.dispatch(0).is_none(),
            "the superseded process acts again"
        );
        assert!(
            second.ownership.in_time() && second.ownership.dispatch(0).is_some(),
            "the second process stopped working"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(first.metrics.superseded.get(), 1);
    assert_eq!(second.metrics.superseded.get(), 0);
    let lease = Api::<Lease>::namespaced(client.clone(), &ns)
        .get("test-member-module-manager-0")
        .await
        .unwrap();
    assert_eq!(
        lease
            .annotations()
            .get(MEMBER_INCARNATION_ANNOTATION)
            .map(String::as_str),
        Some(second.membership.incarnation()),
        "the Lease stays the second's"
    );
    assert_ne!(
        first.membership.incarnation(),
        second.membership.incarnation()
    );
    // The superseded process does not delete the other's Lease when it shuts down.
    first.membership.leave().await;
    let start = Instant::now();
    loop {
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns);
        let events = objects::list(&events).await;
        if events
            .iter()
            .any(|e| e.reason.as_deref() == Some("MemberSuperseded"))
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no MemberSuperseded Event"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        objects::exists(
            &Api::<Lease>::namespaced(client.clone(), &ns),
            "test-member-module-manager-0"
        )
        .await,
        "the superseded process deleted the Lease of the one that took it over"
    );
    assert!(second.ownership.in_time());
}
