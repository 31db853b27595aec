//! Shard Leases on a real kube-apiserver: replicas split the shards as assigned, take over a
//! crashed member's shards, hand them back, and never both hold a shard when their views of the
//! fleet disagree (the compare-and-swap decides).
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

use std::collections::BTreeSet;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::Api;
use module_manager::shard::leases::{Round, set_holder, sync_shards};
use module_manager::shard::{ShardCount, assign};
use test_support::objects;

const FLEET: &str = "test";
const A: &str = "module-manager-0";
const B: &str = "module-manager-1";

fn shards() -> ShardCount {
    ShardCount::new(32).unwrap()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

async fn leases() -> Api<Lease> {
    let control_plane = testenv::shared(testenv::Options::default())
        .await
        .expect("control plane");
    let client = control_plane.client().await.unwrap();
    let ns = control_plane
        .namespace(&client, "shard-leases")
        .await
        .unwrap();
    Api::namespaced(client, &ns)
}

/// One round for `me` with its view of the live members and of those known dead.
async fn round(
    leases: &Api<Lease>,
    me: &str,
    live: &BTreeSet<String>,
    dead: &BTreeSet<String>,
) -> Round {
    sync_shards(
        leases,
        FLEET,
        me,
        shards(),
        |m| dead.contains(m),
        &assign(shards(), live),
        |_| true,
    )
    .await
    .unwrap()
}

fn desired_of(member: &str, live: &BTreeSet<String>) -> BTreeSet<u32> {
    assign(shards(), live)
        .iter()
        .enumerate()
        .filter(|(_, owner)| *owner == member)
        .map(|(k, _)| k as u32)
        .collect()
}

async fn versions(leases: &Api<Lease>) -> Vec<Option<String>> {
    objects::list(leases)
        .await
        .iter()
        .map(|l| l.resource_version())
        .collect()
}

async fn holders(leases: &Api<Lease>) -> Vec<(String, String)> {
    let mut list: Vec<(String, String)> = objects::list(leases)
        .await
        .into_iter()
        .map(|l| {
            (
                l.name_any(),
                l.spec.and_then(|s| s.holder_identity).unwrap_or_default(),
            )
        })
        .collect();
    list.sort();
    list
}

#[tokio::test]
async fn replicas_split_take_over_and_hand_back() {
    let leases = leases().await;
    let both = set(&[A, B]);
    let none = BTreeSet::new();

    // Both live: each acquires exactly its assigned shards.
    let a = round(&leases, A, &both, &none).await;
    let b = round(&leases, B, &both, &none).await;
    assert_eq!(a.owned, desired_of(A, &both));
    assert_eq!(b.owned, desired_of(B, &both));
    assert_eq!(a.owned.len() + b.owned.len(), 32);
    // A steady round writes nothing.
    let before = versions(&leases).await;
    let steady = round(&leases, A, &both, &none).await;
    assert!(steady.acquired.is_empty() && steady.released.is_empty());
    let after = versions(&leases).await;
    assert_eq!(before, after, "no Lease write in a steady round");

    // B crashes: A (seeing only itself live) takes B's shards over.
    let only_a = set(&[A]);
    let takeover = round(&leases, A, &only_a, &set(&[B])).await;
    assert_eq!(takeover.acquired, desired_of(B, &both));
    assert_eq!(takeover.owned.len(), 32);

    // B is back: it waits while A holds them; A releases; B acquires.
    assert!(
        round(&leases, B, &both, &none).await.owned.is_empty(),
        "B may not take shards A holds while live"
    );
    let handback = round(&leases, A, &both, &none).await;
    assert_eq!(handback.released, desired_of(B, &both));
    assert_eq!(
        round(&leases, B, &both, &none).await.acquired,
        desired_of(B, &both)
    );
    let holders = holders(&leases).await;
    assert_eq!(
        holders.iter().filter(|(_, h)| h == A).count(),
        desired_of(A, &both).len()
    );
    assert_eq!(
        holders.iter().filter(|(_, h)| h == B).count(),
        desired_of(B, &both).len()
    );
}

#[tokio::test]
async fn a_shard_is_never_held_by_two_replicas_whose_views_disagree() {
    let leases = leases().await;
    // A has not seen B's membership Lease yet (B just joined); B sees both. For B's half of the
    // shards both believe they are the desired owner, and both try to acquire them at once; A
    // must neither win a create race twice nor take over what B already holds (B is not known
    // dead to A, merely unknown).
    let (a_view, b_view, none) = (set(&[A]), set(&[A, B]), BTreeSet::new());
    let (a, b) = tokio::join!(
        round(&leases, A, &a_view, &none),
        round(&leases, B, &b_view, &none)
    );
    let overlap: BTreeSet<u32> = a.owned.intersection(&b.owned).copied().collect();
    assert!(
        overlap.is_empty(),
        "shards held by both: {overlap:?} (A {a:?}, B {b:?})"
    );
    // Every shard went to exactly one of them (no shard lost either).
    assert_eq!(a.owned.len() + b.owned.len(), 32, "A {a:?} B {b:?}");
    // Once the views agree, the fleet converges on the assignment.
    let both = set(&[A, B]);
    for _ in 0..3 {
        round(&leases, A, &both, &none).await;
        round(&leases, B, &both, &none).await;
    }
    let a = round(&leases, A, &both, &none).await;
    let b = round(&leases, B, &both, &none).await;
    assert_eq!(
        (a.owned, b.owned),
        (desired_of(A, &both), desired_of(B, &both))
    );
}

/// The primitive under the rounds, made deterministic: two writers acting on the same read (no
/// Lease yet, then the same resourceVersion) — the second write always fails with a conflict.
#[tokio::test]
async fn of_two_writers_acting_on_the_same_read_only_the_first_succeeds() {
    let leases = leases().await;
    let name = module_manager::shard::leases::lease_name(FLEET, 0);
    let conflict =
        |r: Result<(), kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 409);

    // Create path: both read "no Lease".
    set_holder(&leases, FLEET, &name, None, Some(A))
        .await
        .unwrap();
    assert!(
        conflict(set_holder(&leases, FLEET, &name, None, Some(B)).await),
        "a second create must conflict"
    );

    // Replace path: both read the same version.
    let read = leases.get(&name).await.unwrap();
    set_holder(&leases, FLEET, &name, Some(&read), Some(B))
        .await
        .unwrap();
    assert!(
        conflict(set_holder(&leases, FLEET, &name, Some(&read), Some(A)).await),
        "a stale replace must conflict"
    );

    let now = leases.get(&name).await.unwrap().spec.unwrap();
    assert_eq!(now.holder_identity.as_deref(), Some(B));
    assert_eq!(
        now.lease_transitions,
        Some(2),
        "one epoch per change of holder"
    );
}
