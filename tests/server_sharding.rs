//! Server-side sharded watches (`--server-side-sharding on`), end to end: replicas of the real
//! binary against a kube-apiserver started with the feature gate `ShardedListAndWatch`, each
//! watching only its shards' hash ranges of the Manifests' UIDs (`shardSelector`).
//!
//! What it guards: a selector built from the wrong ranges (another hash, other bits, an
//! off-by-one shard) leaves Manifests to no replica (never Ready, or their `status.owner` not
//! their shard's holder) — and a server that does not filter sends each replica every Manifest
//! (the watch-event check). The label path (the gate off) runs in every other test binary.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};
use module_manager::shard::{SHARD_LABEL, ShardCount, assign};
use test_support::fleet::{ShortFleet, start_short};
use test_support::log_check;
use test_support::objects;

const SHARDS: u32 = 64;
const MANIFESTS: usize = 40;

struct Fleet(ShortFleet);

impl Fleet {
    async fn new(name: &str, replicas: u32) -> Self {
        let control_plane =
            common::control_plane_with_gates(&[testenv::SHARDED_LIST_AND_WATCH]).await;
        let args = vec!["--server-side-sharding".into(), "on".into()];
        let binary = env!("CARGO_BIN_EXE_module-manager").into();
        let shards = (replicas, SHARDS);
        Self(
            start_short(
                control_plane,
                binary,
                ("server-sharding", name),
                shards,
                args,
            )
            .await,
        )
    }

    fn manifests(&self) -> Api<Manifest> {
        Api::namespaced(self.0.client.clone(), &self.0.namespace)
    }

    /// Each shard's holder, from the shard Leases.
    async fn holders(&self) -> BTreeMap<u32, String> {
        test_support::fleet::shard_holders(&self.0.client, &self.0.namespace, &self.0.name)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|(shard, (holder, _))| Some((shard, holder?)))
            .collect()
    }

    /// Waits until the shard Leases name exactly the assignment over ordinals `0..n`.
    async fn wait_assignment(&self, n: u32) -> BTreeMap<u32, String> {
        let members: BTreeSet<String> = (0..n).map(|o| self.0.local.member(o)).collect();
        let want: BTreeMap<u32, String> = assign(ShardCount::new(SHARDS).unwrap(), &members)
            .into_iter()
            .enumerate()
            .map(|(k, owner)| (k as u32, owner))
            .collect();
        let start = Instant::now();
        loop {
            if self.holders().await == want {
                return want;
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "never matched the assignment over {members:?}\n{}",
                self.0.local.tails()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every Manifest is Ready at its generation and was last reconciled by the
    /// holder of its UID's shard (`status.owner`); fails with the laggards.
    async fn wait_ready_by_owners(&self, holders: &BTreeMap<u32, String>, what: &str) {
        let shards = ShardCount::new(SHARDS).unwrap();
        let start = Instant::now();
        loop {
            let list = objects::list(&self.manifests()).await;
            let lagging: Vec<String> = list
                .iter()
                .filter(|m| {
                    let status = m.status.clone().unwrap_or_default();
                    let shard = shards.shard_of(&m.uid().unwrap());
                    status.state != Some(State::Ready)
                        || status.observed_generation != m.metadata.generation
                        || status.owner.as_ref() != holders.get(&shard)
                })
                .map(|m| {
                    format!(
                        "{} ({:?})",
                        m.name_any(),
                        m.status.as_ref().map(|s| &s.owner)
                    )
                })
                .collect();
            if lagging.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{what}: {} Manifests not Ready by their shard's holder, e.g. {:?}\n{}",
                lagging.len(),
                &lagging[..lagging.len().min(5)],
                self.0.local.tails()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `module_manager_manifest_watch_events_total{watch=…}` of replica `ordinal`.
    async fn watch_events(&self, ordinal: u32, watch: &str) -> f64 {
        let (_, text) = self.0.local.get(ordinal, "/metrics").await.unwrap();
        let series = format!("module_manager_manifest_watch_events_total{{watch=\"{watch}\"}}");
        text.lines()
            .find_map(|line| line.strip_prefix(&series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} on replica {ordinal}"))
    }

    async fn assert_no_shard_label(&self) {
        for manifest in objects::list(&self.manifests()).await {
            assert!(
                !manifest.labels().contains_key(SHARD_LABEL),
                "{}: the shard label was written: {:?}",
                manifest.name_any(),
                manifest.labels()
            );
        }
    }

    async fn assert_clean(&self, what: &str) {
        let uids = objects::list(&self.manifests())
            .await
            .iter()
            .filter_map(|m| m.uid())
            .collect();
        let report = log_check::check(&self.0.local.logs().unwrap(), &uids);
        eprintln!("SHARDING {what}: {report}");
        assert!(report.passes > 0, "{what}: no passes logged");
        assert!(report.is_clean(), "{what}: {report}");
    }
}

/// Counts the events of an unfiltered watch of the fleet's Manifests (what one replica
/// watching everything would receive), as the replicas count theirs.
fn count_all_events(client: Client, namespace: &str, name: &str) -> Arc<AtomicU64> {
    let count = Arc::new(AtomicU64::new(0));
    let api = Api::<Manifest>::namespaced(client, namespace);
    let config = watcher::Config::default().labels(&format!("fleet-test={name}"));
    let counter = count.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            if let Ok(
                watcher::Event::Apply(_) | watcher::Event::InitApply(_) | watcher::Event::Delete(_),
            ) = event
            {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    count
}

#[tokio::test]
async fn with_the_servers_filter_each_replica_watches_only_its_shards_and_reconciles_them() {
    let name = "ranges";
    let mut fleet = Fleet::new(name, 2).await;
    let all_events = count_all_events(fleet.0.client.clone(), &fleet.0.namespace, name);
    let holders = fleet.wait_assignment(2).await;
    let api = fleet.manifests();
    test_support::fleet::create_tiny_manifests(&api, name, 0..MANIFESTS)
        .await
        .unwrap();
    fleet.wait_ready_by_owners(&holders, "2 replicas").await;
    fleet.assert_no_shard_label().await;

    // Each replica received the events of its own shards only: together about what one
    // watch of everything received (each would receive all of it without the server's filter).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let total = all_events.load(Ordering::Relaxed) as f64;
    let mut sum = 0.0;
    for ordinal in 0..2 {
        let shard = fleet.watch_events(ordinal, "shard").await;
        let stray = fleet.watch_events(ordinal, "stray").await;
        eprintln!(
            "SHARDING replica {ordinal} of 2: {shard} shard-watch events ({:.2} of {total} of an unfiltered watch), {stray} stray",
            shard / total
        );
        assert!(shard > 0.0, "replica {ordinal} received nothing");
        assert_eq!(stray, 0.0, "no stray watch on this path");
        sum += shard;
    }
    assert!(
        sum <= 1.25 * total,
        "the replicas received {sum} events, one unfiltered watch {total}: the server did not filter"
    );

    // Scale out: shards move to the new replica; every Manifest, changed, is reconciled by its
    // shard's new holder — the old replicas' watches were restarted with their new ranges.
    test_support::fleet::set_desired(&fleet.0.client, &fleet.0.namespace, name, 3)
        .await
        .unwrap();
    fleet.0.local.start(2).unwrap();
    let moved_to = fleet.wait_assignment(3).await;
    let moved = moved_to
        .iter()
        .filter(|(k, owner)| holders.get(k) != Some(owner))
        .count();
    assert!(moved > 0, "no shard moved");
    test_support::fleet::touch_all(&api, 1).await.unwrap();
    fleet.wait_ready_by_owners(&moved_to, "after 2 → 3").await;
    fleet.assert_no_shard_label().await;
    eprintln!(
        "SHARDING scale 2 → 3: {moved} of {SHARDS} shards moved; every Manifest Ready by its holder"
    );
    fleet.assert_clean("ranges").await;
    let stopping: Vec<_> = fleet.0.local.take_all();
    test_support::fleet::stop_all(stopping, Duration::from_secs(10)).await;
}
