//! Membership Leases on a real kube-apiserver: replicas see each other live, a crashed replica
//! (Lease left behind, no longer renewed) turns dead after the lease duration on the observer's
//! clock, and a replica that shuts down cleanly leaves at once.

use std::time::{Duration, Instant};

use module_manager::shard::membership::{self, Members, MembershipConfig};
use tokio::sync::{oneshot, watch};

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
    let control_plane = testenv::shared(testenv::Options::default())
        .await
        .expect("control plane");
    let client = control_plane.client().await.unwrap();
    let ns = control_plane
        .namespace(&client, "membership")
        .await
        .unwrap();
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
