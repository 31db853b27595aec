//! The sharded fleet, end to end: replicas of the real `module-manager` binary against a real
//! kube-apiserver, a StatefulSet object saying which ordinals are desired, a few hundred
//! Manifests. Every scenario ends with the overlap checker over the replicas' JSON logs
//! (`test_support::log_check`): no Manifest reconciled by two replicas at once, none left unreconciled.
//!
//! Timings are shortened (lease 4 s, renew every 1 s, renew deadline 3 s) so that expiry-based
//! takeovers take seconds. The figures printed (`FLEET …` lines) are reported in
//! `docs/sharding.md`; nothing here asserts a wall-clock time.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use module_manager::api::{Manifest, State};
use module_manager::shard::ShardCount;
use serde_json::{Value, json};
use test_support::fleet::{ShortFleet, assigned_holders, proc_usage, start_short};
use test_support::log_check;
use test_support::objects;

const SHARDS: u32 = 64;
const LEASE_SECONDS: u64 = 4;
/// The binary's default timings (lease 15 s, renew every 5 s, deadline 10 s), as extra args.
const DEFAULT_TIMINGS: [&str; 6] = [
    "--lease-duration-seconds",
    "15",
    "--renew-interval-seconds",
    "5",
    "--renew-deadline-seconds",
    "10",
];

/// The fleet tests start several processes each; on a 2-core machine they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fleet of replica processes named `<name>-<ordinal>`, its StatefulSet object, its Manifests
/// (labelled `fleet-test=<name>`) and its logs.
struct Fleet {
    started: ShortFleet,
    /// Number of shards (`--shards` in the extra arguments, else `SHARDS`).
    shards: u32,
}

impl std::ops::Deref for Fleet {
    type Target = ShortFleet;
    fn deref(&self) -> &ShortFleet {
        &self.started
    }
}

impl std::ops::DerefMut for Fleet {
    fn deref_mut(&mut self) -> &mut ShortFleet {
        &mut self.started
    }
}

impl Fleet {
    async fn new(name: &str, replicas: u32, extra_args: &[&str]) -> Self {
        let control_plane = testenv::shared(testenv::Options {
            crd_files: vec![repo().join("crds/manifest.yaml")],
            ..Default::default()
        })
        .await
        .expect("control plane");
        let replica_args = extra_args.iter().map(|a| a.to_string()).collect();
        // Lease 4 s, renew 1 s, deadline 3 s (LEASE_SECONDS); extra args may override `--shards`.
        let binary = env!("CARGO_BIN_EXE_module-manager").into();
        let started = start_short(
            control_plane,
            binary,
            ("fleet", name),
            (replicas, SHARDS),
            replica_args,
        )
        .await;
        Self {
            started,
            shards: extra_args
                .windows(2)
                .find(|pair| pair[0] == "--shards")
                .map_or(SHARDS, |pair| pair[1].parse().unwrap()),
        }
    }

    fn member(&self, ordinal: u32) -> String {
        self.local.member(ordinal)
    }

    /// Starts replica `ordinal` (a fresh log file per process).
    fn start(&mut self, ordinal: u32) {
        self.local.start(ordinal).unwrap();
    }

    /// SIGTERM and wait for the exit (graceful: restart or leave, as the replica decides).
    fn stop(&mut self, ordinal: u32) {
        if let Some(mut replica) = self.local.take(ordinal) {
            replica.process.stop(Duration::from_secs(30));
        }
    }

    fn signal(&self, ordinal: u32, signal: i32) {
        self.local.signal(ordinal, signal).unwrap();
    }

    /// The replica's metrics (classic text format) from its admin API.
    async fn scrape(&self, ordinal: u32) -> String {
        self.local.get(ordinal, "/metrics").await.unwrap().1
    }

    /// The sum of the samples of metric `name` (all label sets) on replica `ordinal`.
    async fn metric(&self, ordinal: u32, name: &str) -> f64 {
        self.scrape(ordinal)
            .await
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.split(['{', ' ']).next() == Some(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The reasons of the Events about replica `ordinal`'s membership Lease.
    async fn member_event_reasons(&self, ordinal: u32) -> Vec<String> {
        let lease = format!("{}-member-{}", self.name, self.member(ordinal));
        objects::list(&Api::<k8s_openapi::api::events::v1::Event>::namespaced(
            self.client.clone(),
            &self.namespace,
        ))
        .await
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&lease))
        .filter_map(|e| e.reason)
        .collect()
    }

    fn kill(&mut self, ordinal: u32) {
        self.signal(ordinal, libc::SIGKILL);
        let mut replica = self.local.take(ordinal).unwrap();
        replica.process.stop(Duration::from_secs(1)); // reaps it
    }

    async fn set_desired(&self, replicas: u32) {
        test_support::fleet::set_desired(&self.client, &self.namespace, &self.name, replicas)
            .await
            .unwrap();
    }

    fn manifests(&self) -> Api<Manifest> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn create_manifests(&self, count: usize) {
        self.create_manifests_from(0, count).await;
    }

    async fn create_manifests_from(&self, first: usize, count: usize) {
        let numbers = first..first + count;
        test_support::fleet::create_tiny_manifests(&self.manifests(), &self.name, numbers)
            .await
            .unwrap();
    }

    /// Changes every Manifest's values (a new generation each must reconcile).
    async fn touch_all(&self, n: u64) {
        test_support::fleet::touch_all(&self.manifests(), n)
            .await
            .unwrap();
    }

    /// A fleet of 3 replicas (no extra argument) with the shards assigned and `manifests`
    /// Manifests created and Ready; answers how long they took to be Ready.
    async fn three_ready(name: &str, manifests: usize) -> (Self, Duration) {
        let fleet = Self::new(name, 3, &[]).await;
        fleet.wait_assignment(3, "start").await;
        fleet.create_manifests(manifests).await;
        let what = format!("{manifests} Manifests on 3 replicas");
        let took = fleet.wait_ready(&what).await;
        (fleet, took)
    }

    /// The RSS of each replica's process, in MiB.
    fn rss_mib_per_replica(&self) -> Vec<f64> {
        self.local
            .replicas()
            .values()
            .map(|r| rss_mib(r.process.pid()))
            .collect()
    }

    /// Waits until every Manifest is Ready at its current generation; fails with the laggards.
    async fn wait_ready(&self, what: &str) -> Duration {
        self.wait_ready_within(what, Duration::from_secs(120)).await
    }

    async fn wait_ready_within(&self, what: &str, limit: Duration) -> Duration {
        let start = Instant::now();
        let api = self.manifests();
        loop {
            let list = objects::list(&api).await;
            let lagging: Vec<String> = list
                .iter()
                .filter(|m| {
                    let status = m.status.clone().unwrap_or_default();
                    status.state != Some(State::Ready)
                        || status.observed_generation != m.metadata.generation
                })
                .map(|m| m.name_any())
                .collect();
            if lagging.is_empty() {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "{what}: {} Manifests not Ready at their generation, e.g. {:?}\n{}",
                lagging.len(),
                &lagging[..lagging.len().min(5)],
                self.tails()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn tails(&self) -> String {
        self.local.tails()
    }

    /// Every shard Lease as (holder, epoch).
    async fn holders(&self) -> BTreeMap<u32, (Option<String>, i32)> {
        test_support::fleet::shard_holders(&self.client, &self.namespace, &self.name)
            .await
            .unwrap()
    }

    /// Waits until the shard Leases name exactly the assignment over ordinals `0..n`.
    async fn wait_assignment(&self, n: u32, what: &str) -> Duration {
        let start = Instant::now();
        self.wait_assignment_over(&(0..n).collect::<Vec<_>>(), what)
            .await;
        start.elapsed()
    }

    /// All logs written so far, one per process start.
    fn logs(&self) -> Vec<(String, String)> {
        self.local.logs().unwrap()
    }

    async fn uids(&self) -> BTreeSet<String> {
        objects::list(&self.manifests())
            .await
            .iter()
            .filter_map(|m| m.uid())
            .collect()
    }

    /// The overlap checker over every log so far.
    async fn check(&self) -> log_check::Report {
        log_check::check(&self.logs(), &self.uids().await)
    }

    async fn assert_clean(&self, what: &str) {
        let report = self.check().await;
        eprintln!("FLEET {} {what}: {report}", self.name);
        assert!(report.passes > 0, "{what}: no passes logged");
        assert!(report.is_clean(), "{what}: {report}");
    }

    /// Per shard, the times it was released and acquired (from the replicas' logs).
    fn shard_events(&self, message: &str) -> Vec<(u32, Timestamp)> {
        let mut events = Vec::new();
        for (_, log) in self.logs() {
            for line in log.lines() {
                let Ok(value) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                if value["message"] != message {
                    continue;
                }
                let at: Timestamp = value["timestamp"].as_str().unwrap().parse().unwrap();
                events.push((value["shard"].as_u64().unwrap() as u32, at));
            }
        }
        events.sort_by_key(|(_, at)| *at);
        events
    }

    /// Handover gaps (release → next acquire of the same shard) after `since`, in seconds.
    fn handover_gaps(&self, since: Timestamp) -> Vec<f64> {
        let acquired = self.shard_events("shard acquired");
        let mut gaps = Vec::new();
        for (shard, released) in self.shard_events("shard released") {
            if released < since {
                continue;
            }
            if let Some((_, at)) = acquired
                .iter()
                .find(|(k, at)| *k == shard && *at >= released)
            {
                gaps.push(at.duration_since(released).as_secs_f64());
            }
        }
        gaps.sort_by(f64::total_cmp);
        gaps
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn now() -> Timestamp {
    Timestamp::try_from(SystemTime::now()).unwrap()
}

/// Shards whose holder differs between two snapshots, and how many Manifests they hold.
fn moved(
    before: &BTreeMap<u32, (Option<String>, i32)>,
    after: &BTreeMap<u32, (Option<String>, i32)>,
) -> BTreeSet<u32> {
    after
        .iter()
        .filter(|(k, (holder, _))| before.get(k).map(|(h, _)| h) != Some(holder))
        .map(|(k, _)| *k)
        .collect()
}

async fn manifests_in(fleet: &Fleet, shards: &BTreeSet<u32>) -> usize {
    let count = ShardCount::new(fleet.shards).unwrap();
    fleet
        .uids()
        .await
        .iter()
        .filter(|uid| shards.contains(&count.shard_of(uid)))
        .count()
}

impl Fleet {
    /// Prints a scale step's figures (shards and Manifests moved vs ideal, handover gaps);
    /// returns the moved shards and the holders after the step.
    async fn report_step(
        &self,
        step_name: &str,
        before: &BTreeMap<u32, (Option<String>, i32)>,
        step: Timestamp,
        took: Duration,
        ideal_fraction: f64,
    ) -> (BTreeSet<u32>, BTreeMap<u32, (Option<String>, i32)>) {
        let after = self.holders().await;
        let moved = moved(before, &after);
        let ideal = self.shards as f64 * ideal_fraction;
        let gaps = self.handover_gaps(step);
        eprintln!(
            "FLEET scale {step_name}: settled in {took:?}; {} shards moved (ideal {ideal:.1}, ratio {:.2}), {} Manifests; handover gap p50 {:.3}s p99 {:.3}s over {} shards",
            moved.len(),
            moved.len() as f64 / ideal,
            manifests_in(self, &moved).await,
            quantile(&gaps, 0.5),
            quantile(&gaps, 0.99),
            gaps.len()
        );
        (moved, after)
    }
}

#[tokio::test]
async fn three_replicas_reconcile_every_manifest_and_scale_3_5_2_moving_only_what_they_must() {
    let _serial = SERIAL.lock().await;
    let (mut fleet, took) = Fleet::three_ready("scale", 300).await;
    eprintln!("FLEET scale: 300 Manifests Ready on 3 replicas in {took:?}");
    // Every replica reconciled a share.
    let report = fleet.check().await;
    assert!(report.is_clean(), "{report}");

    // 3 → 5: the new members take exactly their shares.
    let before = fleet.holders().await;
    let step = now();
    fleet.set_desired(5).await;
    fleet.start(3);
    fleet.start(4);
    // Changes arrive while shards change hands: passes are queued and in flight during the
    // handovers (the checker sees any pass of the old owner overlapping the new owner's).
    fleet.touch_all(1).await;
    let took = fleet.wait_assignment(5, "3 → 5").await;
    let (moved_up, after) = fleet
        .report_step("3→5", &before, step, took, 2.0 / 5.0)
        .await;
    assert!(moved_up.iter().all(|k| {
        let owner = after[k].0.as_deref();
        owner == Some(&fleet.member(3)) || owner == Some(&fleet.member(4))
    }));
    // No flapping: each moved shard changed hands once (released, acquired) — or twice when
    // one newcomer was live before the other (a loaded machine starts them seconds apart): the
    // first takes a share of a 4-member assignment, and hands part of it to the second. It
    // never went back to an old member (the final owners are the newcomers, above).
    let mut via_other_newcomer = 0;
    for k in &moved_up {
        let changes = (after[k].1 - before[k].1) / 2;
        assert!(
            changes == 1 || changes == 2,
            "shard {k} changed hands {changes} times"
        );
        via_other_newcomer += usize::from(changes == 2);
    }
    eprintln!("FLEET scale 3→5: {via_other_newcomer} shards moved through the other newcomer");
    fleet.wait_ready("after 3 → 5").await;
    // The new members measured each handover gap (release → their acquisition); no takeovers.
    for ordinal in [3, 4] {
        assert!(
            fleet
                .metric(ordinal, "module_manager_fleet_handover_gap_seconds_count")
                .await
                > 0.0
        );
        assert_eq!(
            fleet
                .metric(ordinal, "module_manager_fleet_shard_takeovers_total")
                .await,
            0.0
        );
    }

    // 5 → 2: the scaled-away members hand over before they exit.
    let before = fleet.holders().await;
    let step = now();
    fleet.set_desired(2).await;
    fleet.touch_all(2).await; // in flight while the scaled-away members hand over
    for ordinal in [4, 3, 2] {
        fleet.stop(ordinal);
    }
    let took = fleet.wait_assignment(2, "5 → 2").await;
    let (moved_down, _) = fleet
        .report_step("5→2", &before, step, took, 3.0 / 5.0)
        .await;
    let gaps = fleet.handover_gaps(step);
    // Planned handover: every moved shard was released by its leaving holder and acquired
    // (none waited for its holder's lease to expire), and none moved more than once.
    assert_eq!(
        gaps.len(),
        moved_down.len(),
        "every moved shard was released, then acquired, once"
    );
    fleet.touch_all(3).await;
    fleet.wait_ready("after 5 → 2").await;
    fleet.assert_clean("scale 3→5→2").await;
}

#[tokio::test]
async fn a_killed_replica_is_taken_over_and_a_stopped_one_does_not_act_on_lost_shards() {
    let _serial = SERIAL.lock().await;
    let (mut fleet, _) = Fleet::three_ready("chaos", 200).await;

    // kill -9: no restarting mark, so once its lease expires the others take over.
    let killed_at = now();
    fleet.kill(1);
    fleet.touch_all(1).await; // changes for the dead replica's shards wait for the takeover
    // New Manifests whose shards have no working owner yet must not be lost.
    fleet.create_manifests_from(200, 40).await;
    fleet
        .wait_assignment_over(&[0, 2], "takeover after kill -9")
        .await;
    // A dead owner's shard is taken over (logged as such), not acquired free.
    let acquired: Vec<f64> = fleet
        .shard_events("shard acquired (takeover)")
        .into_iter()
        .filter(|(_, at)| *at > killed_at)
        .map(|(_, at)| at.duration_since(killed_at).as_secs_f64())
        .collect();
    eprintln!(
        "FLEET chaos: kill -9 → {} shards taken over between {:.2}s and {:.2}s after the kill (lease {LEASE_SECONDS} s, renew 1 s)",
        acquired.len(),
        acquired.iter().copied().fold(f64::INFINITY, f64::min),
        acquired.iter().copied().fold(0.0, f64::max)
    );
    fleet.wait_ready("after kill -9").await;

    // The StatefulSet brings it back: its shards return by planned handover.
    fleet.start(1);
    fleet.wait_assignment(3, "return").await;

    // SIGSTOP past the lease: the others take over; after SIGCONT it must not act on the
    // shards it lost (self-fencing), then gets its share back by handover.
    fleet.signal(2, libc::SIGSTOP);
    fleet.touch_all(2).await;
    fleet
        .wait_assignment_over(&[0, 1], "takeover from a stopped replica")
        .await;
    fleet.wait_ready("while stopped").await;
    // Resume it while the new owners are busy with its old shards' Manifests: were its fence
    // broken, its stale ownership would reconcile the same Manifests at the same time.
    fleet.touch_all(3).await;
    fleet.signal(2, libc::SIGCONT);
    fleet.wait_ready("right after SIGCONT").await;
    fleet.wait_assignment(3, "after SIGCONT").await;
    fleet.touch_all(4).await;
    fleet.wait_ready("after SIGCONT").await;
    let resumed_log = fleet
        .logs()
        .into_iter()
        .find(|(name, _)| name.starts_with(&format!("{}.", fleet.member(2))))
        .unwrap()
        .1;
    assert!(
        resumed_log.contains("not renewed within the renew deadline"),
        "the resumed replica fenced itself"
    );
    // It noticed the shards taken from it — as losses after its deadline, not as violations —
    // with a metric and an Event on its membership Lease; the survivors counted takeovers.
    let metric = async |ordinal, name| fleet.metric(ordinal, name).await;
    assert!(metric(2, "module_manager_fleet_shard_losses_total").await > 0.0);
    assert_eq!(
        metric(2, "module_manager_fleet_ownership_violations_total").await,
        0.0
    );
    assert!(
        metric(0, "module_manager_fleet_shard_takeovers_total").await
            + metric(1, "module_manager_fleet_shard_takeovers_total").await
            > 0.0
    );
    let reasons = fleet.member_event_reasons(2).await;
    assert!(reasons.iter().any(|r| r == "ShardLost"), "{reasons:?}");
    assert!(
        !reasons.iter().any(|r| r == "OwnershipViolation"),
        "{reasons:?}"
    );
    fleet.assert_clean("kill -9 and SIGSTOP/SIGCONT").await;
}

impl Fleet {
    /// Waits until the shard Leases name exactly the assignment over `ordinals`.
    async fn wait_assignment_over(&self, ordinals: &[u32], what: &str) {
        let members: BTreeSet<String> = ordinals.iter().map(|o| self.member(*o)).collect();
        let want = assigned_holders(ShardCount::new(self.shards).unwrap(), &members);
        let start = Instant::now();
        loop {
            let holders: BTreeMap<u32, Option<String>> = self
                .holders()
                .await
                .into_iter()
                .map(|(k, (h, _))| (k, h))
                .collect();
            if holders == want {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "{what}: never matched the assignment over {members:?}\n{}",
                self.tails()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn a_rolling_restart_moves_no_shard() {
    let _serial = SERIAL.lock().await;
    let (mut fleet, _) = Fleet::three_ready("rolling", 100).await;
    let before = fleet.holders().await;
    for ordinal in 0..3 {
        fleet.stop(ordinal);
        fleet.start(ordinal);
        // The restarted replica is back at work before the next one goes.
        fleet.touch_all(u64::from(ordinal) + 1).await;
        fleet.wait_ready("during the rolling restart").await;
    }
    let after = fleet.holders().await;
    assert_eq!(before, after, "holders and epochs unchanged: zero moves");
    eprintln!(
        "FLEET rolling: 3 restarts, 0 of {} shards moved",
        fleet.shards
    );
    fleet.assert_clean("rolling restart").await;
}

impl Fleet {
    /// The replica holding the shard of `uid`.
    async fn holder_of(&self, uid: &str) -> Option<String> {
        let shard = ShardCount::new(self.shards).unwrap().shard_of(uid);
        self.holders()
            .await
            .remove(&shard)
            .and_then(|(holder, _)| holder)
    }
}

/// `spec.dependsOn` across replicas: the dependency is held by one replica, its dependent by
/// the other; the dependent waits, then is woken by the dependency's readiness (its interval is
/// an hour: the depended-on watch of its own replica wakes it, or at the latest its own 30 s
/// recheck — so this test no longer fails without the watch).
#[tokio::test]
async fn a_dependent_is_woken_by_a_dependency_another_replica_owns() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("deps", 2, &[]).await;
    fleet.wait_assignment(2, "start").await;
    let api = fleet.manifests();
    let tiny = |name: &str, extra: Value| -> Manifest {
        let mut spec = json!({"module": "tiny", "chart": {"path": "tests/fixtures/charts/tiny"},
            "interval": "1h"});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1",
            "kind": "Manifest",
            "metadata": {"name": name, "labels": {"fleet-test": fleet.name}},
            "spec": spec,
        }))
        .unwrap()
    };
    // Suspended: no pass, no status, until the dependent waits for it.
    let base = api
        .create(
            &PostParams::default(),
            &tiny("base", json!({"suspend": true})),
        )
        .await
        .unwrap();
    let base_holder = fleet.holder_of(&base.uid().unwrap()).await.unwrap();
    // A dependent on the other replica's shards (each try has one chance in two).
    let mut dependent = None;
    for i in 0..20 {
        let name = format!("app-{i}");
        let app = tiny(&name, json!({"dependsOn": [{"name": "base"}]}));
        let created = api.create(&PostParams::default(), &app).await.unwrap();
        if fleet.holder_of(&created.uid().unwrap()).await.as_ref() != Some(&base_holder) {
            dependent = Some(name);
            break;
        }
        api.delete(&name, &Default::default()).await.unwrap();
    }
    let app = dependent.expect("a dependent on the other replica in 20 tries");
    let waiting = wait_manifest(&api, &app, |m| {
        m.status.as_ref().is_some_and(|s| {
            s.state == Some(State::Processing)
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "DependencyNotReady")
        })
    })
    .await;
    let owner = waiting.status.unwrap().owner.unwrap();
    assert_ne!(owner, base_holder, "the two are on different replicas");

    objects::merge(&api, "base", json!({"spec": {"suspend": false}})).await;
    let took = fleet.wait_ready("base, then its dependent").await;
    eprintln!(
        "FLEET deps: dependency Ready on {base_holder}, dependent on {owner} Ready; both within {took:?}"
    );
    fleet.assert_clean("dependsOn across replicas").await;
}

/// Waits (60 s) until the Manifest `name` satisfies `done`.
async fn wait_manifest(
    api: &Api<Manifest>,
    name: &str,
    done: impl Fn(&Manifest) -> bool,
) -> Manifest {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(manifest) = api.get_opt(name).await.unwrap() {
            if done(&manifest) {
                return manifest;
            }
            assert!(Instant::now() < deadline, "{name}: {:#?}", manifest.status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A mass deletion proceeds at the fleet's cap (`--max-module-deletions-per-minute`), which the
/// replicas share by their shards: 500 Manifests deleted at once on 2 replicas with a cap of 300
/// a minute (5 a second for the fleet) vanish no faster than that in any 20 s window (a 3 s
/// allowance for how long a deletion takes once started, and one more start per replica); the
/// waiting ones say so in their status and an Event, both replicas count their delayed
/// deletions, a waiting one's module is untouched, and every Manifest is gone at the end. With
/// each replica taking the whole cap (the fleet at twice it) or no cap, the window check fails.
#[tokio::test]
async fn a_mass_deletion_proceeds_at_the_fleet_cap() {
    use futures::StreamExt;
    use kube::api::DeleteParams;
    use kube::runtime::watcher;
    const MANIFESTS: usize = 500;
    const PER_SECOND: f64 = 5.0;
    const WINDOW: Duration = Duration::from_secs(20);
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("capped", 2, &["--max-module-deletions-per-minute", "300"]).await;
    fleet.wait_assignment(2, "start").await;
    fleet.create_manifests(MANIFESTS).await;
    fleet
        .wait_ready_within("500 Manifests on 2 replicas", Duration::from_secs(600))
        .await;

    // When each Manifest vanishes, from a watch started before the deletion.
    let api = fleet.manifests();
    let (gone_tx, mut gone) = tokio::sync::mpsc::unbounded_channel();
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let mut listed_tx = Some(listed_tx);
    let config = watcher::Config::default().labels(&format!("fleet-test={}", fleet.name));
    let watch = tokio::spawn(watcher(api.clone(), config).for_each(move |event| {
        match event {
            Ok(watcher::Event::Delete(m)) => {
                let _ = gone_tx.send((Instant::now(), m.name_any()));
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(tx) = listed_tx.take() {
                    let _ = tx.send(());
                }
            }
            _ => {}
        }
        futures::future::ready(())
    }));
    listed.await.expect("the watch listed the Manifests");
    let selector = ListParams::default().labels(&format!("fleet-test={}", fleet.name));
    api.delete_collection(&DeleteParams::default(), &selector)
        .await
        .unwrap();

    // A Manifest waiting for its turn says so. One whose turn is 10 s away or more is looked
    // at (the head of the queue may start between two reads).
    let waiting_reason = |m: &Manifest| {
        let status = m.status.clone().unwrap_or_default();
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
        (ready.reason == "DeletionRateLimited")
            .then(|| (m.name_any(), status.state, ready.message.clone()))
    };
    let turn_of = |message: &str| -> Option<Timestamp> {
        let rest = message.split("at about ").nth(1)?;
        rest.split(';').next()?.trim().parse().ok()
    };
    let later = |m: &Manifest| {
        let told = waiting_reason(m)?;
        let turn = turn_of(&told.2)?;
        (turn.duration_since(now()).as_secs() >= 10).then_some(told)
    };
    let mut told = None;
    for _ in 0..120 {
        told = objects::list(&api).await.iter().find_map(later);
        if told.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (name, state, message) =
        told.expect("a Manifest waiting for its turn, reason DeletionRateLimited");
    assert_eq!(state, Some(State::Deleting), "{name}");
    // Its module is untouched while it waits (the tiny chart's ConfigMap is named after it).
    let configmaps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        fleet.client.clone(),
        &fleet.namespace,
    );
    let module = configmaps.get_opt(&name).await.unwrap();
    let waits = api
        .get_opt(&name)
        .await
        .unwrap()
        .and_then(|m| waiting_reason(&m));
    assert!(
        module.is_some() || waits.is_none(),
        "{name} waits for its turn, yet its module's ConfigMap is gone"
    );
    assert!(
        message.contains("cap of 300 module deletions a minute"),
        "{name}: {message}"
    );

    let mut times = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(900);
    while times.len() < MANIFESTS {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, gone.recv()).await {
            Ok(Some((at, _))) => times.push(at),
            _ => panic!(
                "{} of {MANIFESTS} Manifests gone\n{}",
                times.len(),
                fleet.tails()
            ),
        }
    }
    watch.abort();
    assert!(
        objects::list(&api).await.is_empty(),
        "every Manifest is gone"
    );

    // No window holds more than the cap allows.
    let allowed = PER_SECOND * (WINDOW + Duration::from_secs(3)).as_secs_f64() + 2.0;
    let busiest = (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| t.duration_since(times[i]) < WINDOW)
                .count()
        })
        .max()
        .unwrap();
    let took = times[MANIFESTS - 1].duration_since(times[0]);
    eprintln!(
        "FLEET capped: {MANIFESTS} deletions in {took:?} at a cap of 300/min; at most {busiest} in a {WINDOW:?} window (allowed {allowed})"
    );
    assert!(
        busiest as f64 <= allowed,
        "{busiest} deletions within {WINDOW:?}, allowed {allowed}"
    );

    let events = objects::list(&Api::<k8s_openapi::api::events::v1::Event>::namespaced(
        fleet.client.clone(),
        &fleet.namespace,
    ))
    .await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("DeletionRateLimited")),
        "an Event says a deletion waits"
    );
    for ordinal in 0..2 {
        let delayed = fleet
            .metric(ordinal, "module_manager_reconcile_deletions_delayed_total")
            .await;
        assert!(
            delayed > 0.0,
            "replica {ordinal} paced its share: {delayed}"
        );
    }
    fleet.assert_clean("mass deletion at the cap").await;
}

/// The checker is only worth something if it fails when ownership is broken: two replicas that
/// ignore ownership reconcile the same Manifests at once, and the checker must say so.
#[tokio::test]
async fn the_checker_catches_replicas_that_ignore_ownership() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("broken", 2, &["--fault-ignore-ownership"]).await;
    fleet.create_manifests(60).await;
    fleet.wait_ready("60 Manifests").await;
    for n in 1..=3 {
        fleet.touch_all(n).await;
        fleet.wait_ready("touched").await;
    }
    let report = fleet.check().await;
    eprintln!("FLEET broken: {report}");
    assert!(
        !report.overlaps.is_empty(),
        "two replicas ignoring ownership must be caught: {report}"
    );
}

/// This binary's API server runs without the feature gate `ShardedListAndWatch`: a replica told
/// `--server-side-sharding on` refuses to start, saying why; one told `auto` takes the label
/// path (its Manifest carries the shard label). (`tests/server_sharding.rs` runs the gate on.)
#[tokio::test]
async fn without_the_feature_gate_server_side_sharding_on_refuses_to_start_and_auto_uses_labels() {
    let _serial = SERIAL.lock().await;
    let mut refused = Fleet::new("gate-on", 1, &["--server-side-sharding", "on"]).await;
    let mut replica = refused.local.take(0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while replica.process.check_running().is_ok() {
        assert!(Instant::now() < deadline, "still running without the gate");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = refused.logs();
    assert!(
        logs.iter()
            .any(|(_, log)| log.contains("does not honour shardSelector")),
        "the error says why: {logs:?}"
    );

    let auto = Fleet::new("gate-auto", 1, &["--server-side-sharding", "auto"]).await;
    auto.create_manifests(1).await;
    auto.wait_ready("auto without the gate").await;
    let manifest = auto.manifests().get("m0").await.unwrap();
    let shard = ShardCount::new(SHARDS)
        .unwrap()
        .shard_of(&manifest.uid().unwrap());
    assert_eq!(
        manifest.labels().get(module_manager::shard::SHARD_LABEL),
        Some(&shard.to_string()),
        "the label path"
    );
}

impl Fleet {
    fn admin_url(&self, ordinal: u32) -> String {
        format!("http://127.0.0.1:{}", self.local.replicas()[&ordinal].admin)
    }
}

/// A ServiceAccount token for `audiences`, optionally allowed to `post`/`delete` `/v1/drain`.
async fn token_for(
    client: &Client,
    namespace: &str,
    name: &str,
    allowed: bool,
    audiences: &[&str],
) -> String {
    let grant = if allowed {
        common::Grant::ClusterRole(
            json!([{"nonResourceURLs": ["/v1/drain"], "verbs": ["post", "delete"]}]),
        )
    } else {
        common::Grant::Nothing
    };
    common::account_token(client, namespace, name, grant, audiences).await
}

/// A ServiceAccount token for the admin API's audience, optionally allowed to `post`/`delete`
/// `/v1/drain`.
async fn token(client: &Client, namespace: &str, name: &str, allowed: bool) -> String {
    token_for(
        client,
        namespace,
        name,
        allowed,
        &[module_manager::admin::TOKEN_AUDIENCE],
    )
    .await
}

/// The admin API of a live fleet: any replica answers the same fleet-wide view, and a drain needs
/// an authenticated, authorized caller — then the replica hands every shard over, and takes its
/// share back when undrained.
#[tokio::test]
async fn any_replica_shows_the_fleet_and_drain_is_authorized_through_the_api_server() {
    use axum::http::Method;
    use module_manager::admin::{DrainAnswer, ShardsAnswer};
    use module_manager::cli::fetch;
    use module_manager::shard::fleet::ShardStatus;
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("admin", 2, &[]).await;
    fleet.wait_assignment(2, "start").await;
    fleet.create_manifests(40).await;
    fleet.wait_ready("40 Manifests").await;

    // Both replicas answer the same fleet-wide ownership, matching the Leases.
    let holders = fleet.holders().await;
    let start = Instant::now();
    loop {
        let mut agree = true;
        for ordinal in [0, 1] {
            let answer: ShardsAnswer =
                fetch(&fleet.admin_url(ordinal), Method::GET, "/v1/shards", None)
                    .await
                    .unwrap();
            let owners: BTreeMap<u32, Option<String>> = answer
                .shards
                .iter()
                .map(|s| (s.shard, s.owner.clone()))
                .collect();
            let leases: BTreeMap<u32, Option<String>> =
                holders.iter().map(|(k, (h, _))| (*k, h.clone())).collect();
            let published: u64 = answer.shards.iter().filter_map(|s| s.manifests).sum();
            agree &= owners == leases
                && answer.shards.iter().all(|s| s.state == ShardStatus::Owned)
                && answer.members.iter().map(|m| m.shards).sum::<u32>() == SHARDS
                && published == 40;
        }
        if agree {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the replicas' views never agreed with the Leases"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let url = fleet.admin_url(0);
    // No token, a bad token, a token without the role: refused, nothing changes.
    let refused = fetch::<DrainAnswer>(&url, Method::POST, "/v1/drain", None).await;
    assert!(format!("{:#}", refused.unwrap_err()).contains("401"));
    let refused = fetch::<DrainAnswer>(&url, Method::POST, "/v1/drain", Some("not-a-token")).await;
    assert!(format!("{:#}", refused.unwrap_err()).contains("401"));
    let weak = token(&fleet.client, &fleet.namespace, "viewer", false).await;
    let refused = fetch::<DrainAnswer>(&url, Method::POST, "/v1/drain", Some(&weak)).await;
    assert!(format!("{:#}", refused.unwrap_err()).contains("403"));
    // An authorized account's token for the API server (not for this endpoint): refused.
    let api_token = token_for(&fleet.client, &fleet.namespace, "api-only", true, &[]).await;
    let refused = fetch::<DrainAnswer>(&url, Method::POST, "/v1/drain", Some(&api_token)).await;
    assert!(format!("{:#}", refused.unwrap_err()).contains("401"));
    assert_eq!(
        fleet.holders().await,
        holders,
        "refused drains change nothing"
    );

    // Authorized: replica 0 hands every shard to replica 1.
    let operator = token(&fleet.client, &fleet.namespace, "operator", true).await;
    let answer: DrainAnswer = fetch(&url, Method::POST, "/v1/drain", Some(&operator))
        .await
        .unwrap();
    assert!(answer.draining);
    fleet.wait_assignment_over(&[1], "drained").await;
    fleet.touch_all(1).await;
    fleet.wait_ready("while replica 0 is drained").await;

    // Undrained: it takes its share back.
    let answer: DrainAnswer = fetch(&url, Method::DELETE, "/v1/drain", Some(&operator))
        .await
        .unwrap();
    assert!(!answer.draining);
    fleet.wait_assignment(2, "undrained").await;
    fleet.touch_all(2).await;
    fleet.wait_ready("undrained").await;
    fleet.assert_clean("drain and undrain").await;
}

/// Lease writes the API server has served so far (create, update, patch, apply of `leases`),
/// from its own `/metrics`.
async fn lease_writes(client: &Client) -> f64 {
    let request = axum::http::Request::get("/metrics")
        .body(Vec::new())
        .unwrap();
    let text = client.request_text(request).await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"leases\""))
        .filter(|l| {
            ["CREATE", "UPDATE", "PATCH", "APPLY", "PUT", "POST"]
                .iter()
                .any(|verb| l.contains(&format!("verb=\"{verb}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> f64 {
    proc_usage(pid).unwrap().1 / (1024.0 * 1024.0)
}

/// The figures of `docs/sharding.md` that the scenario tests do not print: lease writes of an
/// idle fleet (S = 256, N = 5, default timings) and the memory of one replica out of four vs a
/// single replica at the same 3,000 Manifests. Minutes of machine time: `make measure-fleet`.
#[tokio::test]
#[ignore = "measurement, minutes long: make measure-fleet"]
async fn measure_idle_lease_writes_and_memory_per_replica() {
    let _serial = SERIAL.lock().await;
    {
        let defaults = [&["--shards", "256"][..], &DEFAULT_TIMINGS].concat();
        let fleet = Fleet::new("idle", 5, &defaults).await;
        fleet.wait_assignment(5, "idle fleet").await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let before = lease_writes(&fleet.client).await;
        let window = Duration::from_secs(60);
        tokio::time::sleep(window).await;
        let writes = lease_writes(&fleet.client).await - before;
        eprintln!(
            "FLEET idle: S=256 N=5 renew 5 s: {writes} lease writes in {window:?} = {:.2}/s (expected N/renew = 1.00/s: renewals only, no shard Lease writes)",
            writes / window.as_secs_f64()
        );
    }
    let manifests = 3000;
    let mut rss = Vec::new();
    for replicas in [4, 1] {
        let fleet = Fleet::new(&format!("mem{replicas}"), replicas, &[]).await;
        fleet.wait_assignment(replicas, "memory fleet").await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let idle = fleet.rss_mib_per_replica();
        eprintln!("FLEET memory: {replicas} replicas before any Manifest: RSS MiB {idle:.1?}");
        fleet.create_manifests(manifests).await;
        let took = fleet
            .wait_ready_within("memory fleet", Duration::from_secs(1200))
            .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let each = fleet.rss_mib_per_replica();
        eprintln!(
            "FLEET memory: {manifests} Manifests on {replicas} replicas, Ready after {took:?}; RSS MiB per replica {each:.1?}"
        );
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        rss.push((mean(&idle), mean(&each)));
    }
    let ((idle4, full4), (idle1, full1)) = (rss[0], rss[1]);
    eprintln!(
        "FLEET memory: mean RSS of one replica out of 4 = {full4:.1} MiB vs a single replica = {full1:.1} MiB: ratio {:.2}; growth with the Manifests {:.1} vs {:.1} MiB: ratio {:.2}",
        full4 / full1,
        full4 - idle4,
        full1 - idle1,
        (full4 - idle4) / (full1 - idle1)
    );
}

/// Issue 19: an idle fleet with the default timings (lease 15 s, renew 5 s, deadline 10 s) lets
/// no replica's fence lapse — before the fence followed the renewals, idle replicas lapsed about
/// once a minute — and reports no queue: every Manifest is Ready, so each replica's queue holds
/// only the scheduled drift re-checks (`spec.interval` 1 h): depth 0, scheduled = the Manifests,
/// in `/v1/queue`, `/v1/shards` and the metrics.
#[tokio::test]
async fn an_idle_fleet_with_default_timings_never_lapses_and_reports_no_queue() {
    use axum::http::Method;
    use module_manager::admin::{QueueAnswer, ShardsAnswer};
    use module_manager::cli::fetch;
    const MANIFESTS: u64 = 30;
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("idle19", 3, &DEFAULT_TIMINGS).await;
    fleet.wait_assignment(3, "start").await;
    fleet.create_manifests(MANIFESTS as usize).await;
    fleet.wait_ready("30 Manifests").await;

    // The queues settle (the last passes end, every member publishes its load at a renewal).
    let start = Instant::now();
    loop {
        let mut local = (0, 0, 0); // depth, in flight, scheduled over the replicas' own queues
        let mut metrics = (0.0, 0.0);
        for ordinal in 0..3 {
            let answer: QueueAnswer =
                fetch(&fleet.admin_url(ordinal), Method::GET, "/v1/queue", None)
                    .await
                    .unwrap();
            local.0 += answer.queue.depth;
            local.1 += answer.queue.in_flight;
            local.2 += answer.queue.scheduled;
            metrics.0 += fleet.metric(ordinal, "module_manager_queue_due").await;
            metrics.1 += fleet
                .metric(ordinal, "module_manager_queue_scheduled")
                .await;
        }
        let shards: ShardsAnswer = fetch(&fleet.admin_url(0), Method::GET, "/v1/shards", None)
            .await
            .unwrap();
        let published = |f: fn(&module_manager::admin::MemberSummary) -> Option<u64>| {
            shards.members.iter().filter_map(f).sum::<u64>()
        };
        let per_shard = (
            shards.shards.iter().filter_map(|s| s.queued).sum::<u64>(),
            shards
                .shards
                .iter()
                .filter_map(|s| s.scheduled)
                .sum::<u64>(),
        );
        let seen = (
            local,
            metrics,
            (published(|m| m.queued), published(|m| m.scheduled)),
            per_shard,
        );
        let idle = (
            (0, 0, MANIFESTS as usize),
            (0.0, MANIFESTS as f64),
            (0, MANIFESTS),
            (0, MANIFESTS),
        );
        if seen == idle {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "an idle fleet with {MANIFESTS} Ready Manifests should show depth 0 and {MANIFESTS} scheduled \
             ((depth, in flight, scheduled) of /v1/queue, (due, scheduled) metrics, (queued, scheduled) \
             of /v1/shards' members and shards): {seen:?}\n{}",
            fleet.tails()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let settled = start.elapsed();
    // About a minute of idling (12 renew intervals per replica): no lapse anywhere.
    let renewals_before = fleet
        .metric(0, "module_manager_fleet_lease_renewals_total")
        .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let renewals = fleet
        .metric(0, "module_manager_fleet_lease_renewals_total")
        .await;
    assert!(renewals > renewals_before, "the renewals go on");
    let mut lapses = Vec::new();
    for ordinal in 0..3 {
        lapses.push(
            fleet
                .metric(ordinal, "module_manager_fence_lapses_total")
                .await,
        );
    }
    eprintln!(
        "FLEET idle19: 3 replicas, default timings, {MANIFESTS} Ready Manifests: fence lapses per replica since they started {lapses:?} (the queues settled {:.0} s after all were Ready, then 60 s idle), {} renewals of replica 0 in the last minute",
        settled.as_secs_f64(),
        renewals - renewals_before
    );
    assert_eq!(lapses, [0.0; 3], "no replica's fence may lapse while idle");
    fleet.assert_clean("idle fleet").await;
}

/// The CRD of the capabilities test: `widgets.x.example.com`, served at `v1`.
fn widget_crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.x.example.com"},
        "spec": {
            "group": "x.example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .unwrap()
}

impl Fleet {
    /// Creates Manifests `<prefix><i>` of the `capabilities` chart until every replica in
    /// `0..replicas` owns at least `per_replica` of them; returns their names.
    async fn create_capability_manifests(
        &self,
        prefix: &str,
        replicas: u32,
        per_replica: usize,
    ) -> Vec<String> {
        let api = self.manifests();
        let holders = self.holders().await;
        let shards = ShardCount::new(self.shards).unwrap();
        let mut owned: BTreeMap<String, usize> = BTreeMap::new();
        let mut names = Vec::new();
        while (0..replicas).any(|o| owned.get(&self.member(o)).copied().unwrap_or(0) < per_replica)
        {
            assert!(
                names.len() < 100,
                "no even spread over the replicas: {owned:?}"
            );
            let name = format!("{prefix}{}", names.len());
            let created = objects::create_json(
                &api,
                json!({
                    "apiVersion": "modulemanager.io/v1alpha1",
                    "kind": "Manifest",
                    "metadata": {"name": name, "labels": {"fleet-test": self.name}},
                    "spec": {
                        "module": "capabilities",
                        "chart": {"path": "tests/fixtures/charts/capabilities"},
                        "interval": "1h"
                    }
                }),
            )
            .await;
            let shard = shards.shard_of(&created.uid().unwrap());
            if let Some((Some(holder), _)) = holders.get(&shard) {
                *owned.entry(holder.clone()).or_default() += 1;
            }
            names.push(name);
        }
        eprintln!(
            "FLEET {}: {prefix}* Manifests per replica {owned:?}",
            self.name
        );
        names
    }

    /// Creates `capabilities` Manifests `<prefix>…` until each of 3 replicas owns two, waits
    /// until they are Ready and checks that every one rendered `want`; returns their names.
    async fn assert_all_render(
        &self,
        prefix: &str,
        want: &(String, String),
        what: &str,
    ) -> Vec<String> {
        let names = self.create_capability_manifests(prefix, 3, 2).await;
        self.wait_ready(what).await;
        let answers = self.capability_answers(&names).await;
        let wrong: Vec<_> = answers.iter().filter(|(_, a)| *a != want).collect();
        assert!(
            wrong.is_empty(),
            "{what}: rendered other than (has, hasKind) = {want:?}: {wrong:?}\n{}",
            self.tails()
        );
        names
    }

    /// The `has` and `hasKind` answers the `capabilities` chart rendered for each release.
    async fn capability_answers(&self, names: &[String]) -> BTreeMap<String, (String, String)> {
        let configmaps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
            self.client.clone(),
            &self.namespace,
        );
        let mut answers = BTreeMap::new();
        for name in names {
            let data = configmaps
                .get(&format!("{name}-caps"))
                .await
                .unwrap()
                .data
                .unwrap_or_default();
            answers.insert(
                name.clone(),
                (
                    data.get("has").cloned().unwrap_or_default(),
                    data.get("hasKind").cloned().unwrap_or_default(),
                ),
            );
        }
        answers
    }
}

/// Issue 14 item 3: right after a CRD is Established, new Manifests render
/// `.Capabilities.APIVersions.Has "x.example.com/v1"` true on every replica, and right after it
/// is deleted, false on every replica (before, each replica refreshed discovery at 5 minutes of
/// age: the replicas started before the CRD rendered false for minutes).
#[tokio::test]
async fn every_replica_renders_capabilities_as_the_cluster_is_right_after_a_crd_changes() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("caps", 3, &[]).await;
    fleet.wait_assignment(3, "start").await;
    // Every replica has run discovery (at startup) and rendered before the CRD exists.
    let before = fleet.create_capability_manifests("before", 3, 1).await;
    fleet.wait_ready("before the CRD").await;
    let no = ("false".to_owned(), "false".to_owned());
    let yes = ("true".to_owned(), "true".to_owned());
    let answers = fleet.capability_answers(&before).await;
    assert!(
        answers.values().all(|a| *a == no),
        "no CRD yet: {answers:?}"
    );

    let crds = Api::<CustomResourceDefinition>::all(fleet.client.clone());
    crds.create(&PostParams::default(), &widget_crd())
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(60),
        kube::runtime::wait::await_condition(
            crds.clone(),
            "widgets.x.example.com",
            kube::runtime::conditions::is_crd_established(),
        ),
    )
    .await
    .expect("CRD Established")
    .unwrap();
    let established = fleet
        .assert_all_render("established", &yes, "right after the CRD was Established")
        .await;

    crds.delete("widgets.x.example.com", &Default::default())
        .await
        .unwrap();
    let start = Instant::now();
    while crds
        .get_opt("widgets.x.example.com")
        .await
        .unwrap()
        .is_some()
    {
        assert!(start.elapsed() < Duration::from_secs(60), "CRD never went");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deleted = fleet
        .assert_all_render("deleted", &no, "right after the CRD was deleted")
        .await;
    eprintln!(
        "FLEET caps: {} Manifests after Established all rendered true, {} after deletion all false, on 3 replicas",
        established.len(),
        deleted.len()
    );
    fleet.assert_clean("capabilities").await;
}
/// Issue 15 item 3: a shard label that is not the UID's shard.
mod wrong_labels {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use module_manager::shard::SHARD_LABEL;

    const WAIT: Duration = Duration::from_secs(90);

    impl Fleet {
        /// The shard of a Manifest's UID.
        fn shard_of(&self, manifest: &Manifest) -> u32 {
            ShardCount::new(self.shards)
                .unwrap()
                .shard_of(&manifest.uid().unwrap())
        }

        /// A shard held by another replica than the holder of `shard`.
        async fn shard_of_another_holder(&self, shard: u32) -> u32 {
            let holders = self.holders().await;
            let holder = &holders[&shard].0;
            *holders
                .iter()
                .find(|(_, (other, _))| other != holder)
                .expect("two holders")
                .0
        }

        async fn set_label(&self, name: &str, value: &str) {
            objects::merge(
                &self.manifests(),
                name,
                json!({"metadata": {"labels": {SHARD_LABEL: value}}}),
            )
            .await;
        }

        /// Creates `name`, with the shard label `label` if given.
        async fn create_with(&self, name: &str, label: Option<&str>) -> Manifest {
            let mut labels = json!({"fleet-test": self.name});
            if let Some(label) = label {
                labels[SHARD_LABEL] = json!(label);
            }
            let manifest: Manifest = serde_json::from_value(json!({
                "apiVersion": "modulemanager.io/v1alpha1",
                "kind": "Manifest",
                "metadata": {"name": name, "labels": labels},
                "spec": {"module": "tiny", "chart": {"path": "tests/fixtures/charts/tiny"}, "interval": "1h"}
            }))
            .unwrap();
            self.manifests()
                .create(&PostParams::default(), &manifest)
                .await
                .unwrap()
        }

        /// Creates `name` with the shard label `value`; when `value` is `None`, with a valid
        /// label naming a shard held by another replica than the UID's owner (set right after
        /// the create, since the UID is not known before). Returns it as created.
        async fn create_labelled(&self, name: &str, value: Option<&str>) -> Manifest {
            let created = self.create_with(name, Some(value.unwrap_or("0"))).await;
            let uid_shard = self.shard_of(&created);
            let holders = self.holders().await;
            if value.is_none() && holders[&0].0 == holders[&uid_shard].0 {
                let other = self.shard_of_another_holder(uid_shard).await;
                self.set_label(name, &other.to_string()).await;
            }
            created
        }

        /// Waits until `check` holds for `name` (`None`: it is gone); the last reading on failure.
        async fn wait_for(
            &self,
            name: &str,
            what: &str,
            check: impl Fn(Option<&Manifest>) -> bool,
        ) -> Result<(), String> {
            let start = Instant::now();
            loop {
                let manifest = self.manifests().get_opt(name).await.unwrap();
                if check(manifest.as_ref()) {
                    return Ok(());
                }
                if start.elapsed() > WAIT {
                    let label = manifest
                        .as_ref()
                        .map(|m| m.labels().get(SHARD_LABEL).cloned());
                    let state = manifest.and_then(|m| m.status?.state);
                    return Err(format!(
                        "{name}: not {what} after {WAIT:?} (label {label:?}, state {state:?})"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }

        /// Waits until `name` carries its UID's shard label and is Ready.
        async fn wait_relabelled_ready(&self, name: &str) -> Result<(), String> {
            self.wait_for(name, "relabelled to its UID's shard and Ready", |m| {
                m.is_some_and(|m| {
                    m.labels().get(SHARD_LABEL) == Some(&self.shard_of(m).to_string())
                        && m.status.as_ref().and_then(|s| s.state) == Some(State::Ready)
                })
            })
            .await
        }

        /// Whether a `Relabelled` Event is about Manifest `name` (a relabel by the label's owner).
        async fn relabelled(&self, name: &str) -> bool {
            Api::<k8s_openapi::api::events::v1::Event>::namespaced(
                self.client.clone(),
                &self.namespace,
            )
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reason.as_deref() == Some("Relabelled")
            })
        }

        /// The UIDs of the module's objects (the tiny chart's ConfigMap).
        async fn object_uids(&self, manifest: &Manifest) -> Vec<Option<String>> {
            let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace);
            let mut uids = Vec::new();
            for entry in &manifest.status.as_ref().unwrap().inventory {
                uids.push(
                    api.get_opt(&entry.name)
                        .await
                        .unwrap()
                        .and_then(|o| o.uid()),
                );
            }
            uids
        }
    }

    /// A label naming another replica's shard on create; labels naming no shard (not a number,
    /// out of range, not canonical) on create: each is relabelled to its UID's shard and Ready.
    async fn wrong_on_create(fleet: &Fleet) -> Vec<Result<(), String>> {
        let mut results = Vec::new();
        let cases = [
            ("create-other", None),
            ("create-text", Some("not-a-shard")),
            ("create-range", Some("999")),
            ("create-zero", Some("007")),
        ];
        for (name, value) in cases {
            fleet.create_labelled(name, value).await;
        }
        for (name, _) in cases {
            results.push(fleet.wait_relabelled_ready(name).await);
        }
        // The label named another replica's shard: that replica relabelled it.
        if results[0].is_ok() && !fleet.relabelled("create-other").await {
            results[0] = Err("create-other: no Relabelled Event".into());
        }
        results
    }

    /// A Ready Manifest relabelled to another replica's shard goes back to its shard and stays
    /// Ready; its objects are neither re-created nor pruned.
    async fn ready_moved(fleet: &Fleet) -> Result<(), String> {
        let name = "ready-moved";
        fleet.create_with(name, None).await;
        fleet.wait_relabelled_ready(name).await?;
        let ready = fleet.manifests().get(name).await.unwrap();
        let before = fleet.object_uids(&ready).await;
        assert!(before.iter().all(Option::is_some), "{before:?}");
        let other = fleet.shard_of_another_holder(fleet.shard_of(&ready)).await;
        fleet.set_label(name, &other.to_string()).await;
        fleet.wait_relabelled_ready(name).await?;
        if !fleet.relabelled(name).await {
            return Err(format!("{name}: no Relabelled Event"));
        }
        let after = fleet.manifests().get(name).await.unwrap();
        let inventory = |m: &Manifest| m.status.as_ref().unwrap().inventory.clone();
        if fleet.object_uids(&after).await != before || inventory(&after) != inventory(&ready) {
            return Err(format!("{name}: its objects changed: {before:?}"));
        }
        Ok(())
    }

    /// A Ready Manifest relabelled to another replica's shard and deleted at once: its deletion
    /// completes (the UID's owner releases the finalizer).
    async fn deleted_moved(fleet: &Fleet) -> Result<(), String> {
        let name = "deleted-moved";
        fleet.create_with(name, None).await;
        fleet.wait_relabelled_ready(name).await?;
        let ready = fleet.manifests().get(name).await.unwrap();
        let other = fleet.shard_of_another_holder(fleet.shard_of(&ready)).await;
        fleet.set_label(name, &other.to_string()).await;
        objects::delete(&fleet.manifests(), name).await;
        fleet.wait_for(name, "deleted", |m| m.is_none()).await
    }

    /// Reports every case, then fails if any did: all cases run before the verdict, so that a
    /// run of the old code shows each one failing (it did: no Manifest was relabelled, the
    /// deletion never completed).
    async fn verdict(name: &str, results: Vec<Result<(), String>>, fleet: &Fleet) {
        for result in &results {
            eprintln!("FLEET {name}: {result:?}");
        }
        assert!(
            results.iter().all(Result::is_ok),
            "{results:?}\n{}",
            fleet.tails()
        );
        fleet.assert_clean(name).await;
    }

    /// Two replicas; wrong labels on create: another replica's shard, not a number, out of
    /// range, not canonical.
    #[tokio::test]
    async fn a_manifest_created_with_a_wrong_shard_label_is_relabelled_and_reconciled() {
        let _serial = SERIAL.lock().await;
        let fleet = Fleet::new("relabel-create", 2, &[]).await;
        fleet.wait_assignment(2, "start").await;
        let results = wrong_on_create(&fleet).await;
        verdict("wrong labels on create", results, &fleet).await;
    }

    /// Two replicas; a Ready Manifest relabelled to another replica's shard, and one relabelled
    /// and deleted at once.
    #[tokio::test]
    async fn a_relabelled_manifest_returns_to_its_shard_ready_or_is_deleted() {
        let _serial = SERIAL.lock().await;
        let fleet = Fleet::new("relabel-move", 2, &[]).await;
        fleet.wait_assignment(2, "start").await;
        let results = vec![ready_moved(&fleet).await, deleted_moved(&fleet).await];
        verdict("relabelled Manifests", results, &fleet).await;
    }
}
