//! The fleet loop: the sharding protocol as one replica runs it.
//!
//! Every renew interval: renew the own membership Lease (announcing state and load), list the
//! members, then run a shard round (`leases::sync_shards`) over the assignment of the members
//! that count (`assignment_members`), and publish the result to the fence (`fence::Ownership`)
//! and the admin API. A change of any shard Lease (a release, a takeover) triggers a round at
//! once, and so does the draining of a shard's last pass, so handovers do not wait for the next
//! tick. Shutdown is either a *restart* (the ordinal is still desired: announce `restarting`,
//! keep the shards) or a *leave* (hand every shard over, then delete the membership Lease).
//! The rules are in `docs/sharding.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use super::fence::{Grant, Ownership};
use super::hash::ShardCount;
use super::leases::{Round, sync_shards};
use super::membership::{
    FLEET_LABEL, LEASE_KIND_LABEL, MemberLoad, MemberState, MemberView, Members, Membership,
    MembershipConfig,
};
use super::ownership::ShardLeaseRecord;
use crate::telemetry::metrics::FleetMetrics;

/// How a replica takes part in its fleet.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// Membership Leases: names, namespace, lease duration, renew interval.
    pub membership: MembershipConfig,
    /// Number of virtual shards.
    pub shards: ShardCount,
    /// Stop acting when the last successful renewal is older than this (shorter than the lease
    /// duration by a safety margin).
    pub renew_deadline: Duration,
    /// How long the others keep a gracefully restarting member's shards for it.
    pub restart_grace: Duration,
    /// The StatefulSet whose `spec.replicas` says which ordinals are desired (`None`: every
    /// live member counts, and a shutdown always hands over).
    pub statefulset: Option<String>,
    /// How long a leaving replica tries to hand its shards over before it exits anyway (the
    /// others then take them over after the lease expires).
    pub handover_timeout: Duration,
}

/// The desired members of a StatefulSet: `<name>-0` … `<name>-<replicas - 1>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredOrdinals {
    /// The StatefulSet's name (the members' name prefix).
    pub name: String,
    /// Its `spec.replicas`.
    pub replicas: u32,
}

impl DesiredOrdinals {
    /// Whether `member` is one of the desired ordinals (at most `assignment::MAX_ORDINAL`).
    pub fn desires(&self, member: &str) -> bool {
        member
            .strip_prefix(&self.name)
            .and_then(|rest| rest.strip_prefix('-'))
            .filter(|ordinal| ordinal.bytes().all(|b| b.is_ascii_digit()))
            .filter(|ordinal| *ordinal == "0" || !ordinal.starts_with('0'))
            .and_then(|ordinal| ordinal.parse::<u32>().ok())
            .is_some_and(|ordinal| {
                ordinal < self.replicas && ordinal <= super::assignment::MAX_ORDINAL
            })
    }
}

/// The state a member announces: `draining` while asked to drain, else `state`.
fn announced(drain: &watch::Receiver<bool>, state: &MemberState) -> MemberState {
    if *drain.borrow() {
        MemberState::Draining
    } else {
        *state
    }
}

/// The desired ordinals of a StatefulSet (`spec.replicas` defaults to 1).
fn desired_of(statefulset: &StatefulSet) -> DesiredOrdinals {
    DesiredOrdinals {
        name: statefulset.metadata.name.clone().unwrap_or_default(),
        replicas: statefulset
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(1)
            .max(0) as u32,
    }
}

/// The members the shards are assigned to (pure): live members, plus members restarting within
/// the restart grace; minus draining members; and, with a StatefulSet, only its desired
/// ordinals (a member above `spec.replicas` is scaled away: it hands its shards over).
pub fn assignment_members(
    members: &[MemberView],
    desired: Option<&DesiredOrdinals>,
    restart_grace: Duration,
) -> BTreeSet<String> {
    members
        .iter()
        .filter(|m| m.state != MemberState::Draining)
        .filter(|m| desired.is_none_or(|d| d.desires(&m.name)))
        .filter(|m| {
            let restarting = m.state == MemberState::Restarting
                && desired.is_some()
                && m.unchanged_for_seconds < restart_grace.as_secs_f64();
            (m.live && m.state == MemberState::Active) || restarting
        })
        .map(|m| m.name.clone())
        .collect()
}

/// The shards in `held` (this replica's, with their epochs, after its previous successful
/// round) that another replica took over, with that replica (pure). A takeover from this replica
/// is exactly one change of holder: the Lease names another member at the held epoch + 1. Not
/// losses: a shard still held, one this replica released (no holder at + 1; its release may have
/// landed in a round that then failed), one released and acquired since (+ 2).
pub fn lost_shards(held: &BTreeMap<u32, i32>, round: &Round, me: &str) -> BTreeMap<u32, String> {
    held.iter()
        .filter(|(k, _)| !round.owned.contains(k) && !round.released.contains(k))
        .filter_map(|(k, epoch)| {
            let record = round.records.get(k)?;
            let holder = record.holder.as_deref().filter(|h| *h != me)?;
            (record.epoch == epoch + 1).then(|| (*k, holder.to_owned()))
        })
        .collect()
}

/// A membership renewal, as the renewal task needs it (a trait so that the timing of renewals
/// and rounds can be tested on a paused clock).
pub trait Renew: Send + Sync + 'static {
    /// Renews the own Lease announcing `state` and `load`; on success, returns when the
    /// renewal started (the fence is valid until then + the renew deadline).
    fn renew(
        &self,
        state: MemberState,
        load: MemberLoad,
    ) -> impl std::future::Future<Output = Option<Instant>> + Send;

    /// Whether another process took the membership Lease over under this replica's name (after
    /// a failed renewal): then all work stops for good.
    fn superseded(&self) -> bool;
}

impl Renew for super::membership::Renewer {
    async fn renew(&self, state: MemberState, load: MemberLoad) -> Option<Instant> {
        if super::membership::Renewer::renew(self, state, Some(&load)).await {
            self.renewed_at()
        } else {
            None
        }
    }

    fn superseded(&self) -> bool {
        super::membership::Renewer::superseded(self).is_some()
    }
}

/// What the renewal task reads and updates.
pub struct RenewalContext {
    /// What to announce (besides `draining` while `drain` is set); a change renews at once.
    pub announce: watch::Receiver<MemberState>,
    /// Set while asked to drain; a change renews at once.
    pub drain: watch::Receiver<bool>,
    /// The load to publish.
    pub work: Arc<dyn LocalWork>,
    /// Renewals and their failures are counted here.
    pub metrics: FleetMetrics,
    /// Extended as soon as a renewal succeeds.
    pub ownership: Arc<Ownership>,
    /// How often to renew.
    pub interval: Duration,
    /// How long after a successful renewal's start this replica may act.
    pub renew_deadline: Duration,
}

/// The renewal task's stop switch and handle.
type Renewals = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
);

/// Spawns the renewal task: renews every `interval` (and at once when what it announces
/// changes) and extends the fence as soon as a renewal succeeds. Extending only in the shard
/// round (which ticks independently) let the fence lapse by one renewal latency whenever a round
/// started just before the renewal of the same tick completed (issue 19).
pub fn spawn_renewals(renewer: impl Renew, context: RenewalContext) -> Renewals {
    let RenewalContext {
        mut announce,
        mut drain,
        work,
        metrics,
        ownership,
        interval,
        renew_deadline,
    } = context;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                Ok(()) = announce.changed() => {}
                Ok(()) = drain.changed() => {}
                _ = &mut stopped => break,
            }
            let state = announced(&drain, &announce.borrow_and_update());
            match renewer.renew(state, work.load()).await {
                Some(started) => {
                    metrics.renewals.inc();
                    ownership.renewed(Grant::new(started, renew_deadline));
                }
                None if renewer.superseded() => {
                    // Another process renews this replica's Lease: fence at once and for good
                    // (not at the renew deadline), and renew no more.
                    metrics.renewal_failures.inc();
                    metrics.superseded.inc();
                    ownership.supersede();
                    break;
                }
                None => {
                    metrics.renewal_failures.inc();
                }
            }
        }
    });
    (stop, task)
}

/// The deadline a shard round works to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// No renewal has succeeded yet: no round.
    NotYet,
    /// The last successful renewal is older than the renew deadline: everything was fenced.
    Passed,
    /// Act until the grant's deadline (or a later renewal's, see `Ownership::set`).
    Until(Grant),
}

/// The deadline of a round starting now, from the start of the last successful renewal; when
/// it has passed, fences everything (and logs it, once per lapse).
pub fn round_deadline(
    ownership: &Ownership,
    renewed_at: Option<Instant>,
    renew_deadline: Duration,
) -> Deadline {
    let Some(renewed_at) = renewed_at else {
        return Deadline::NotYet;
    };
    let grant = Grant::new(renewed_at, renew_deadline);
    if Instant::now() < grant.until {
        return Deadline::Until(grant);
    }
    if ownership.in_time() || !ownership.owned().is_empty() {
        tracing::error!(
            renewed_seconds_ago = renewed_at.elapsed().as_secs_f64(),
            "membership lease not renewed within the renew deadline: stopping all work"
        );
    }
    ownership.fence();
    Deadline::Passed
}

/// A shard's state in the fleet view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardStatus {
    /// Held by its desired owner.
    Owned,
    /// Held by a live member that is not its desired owner: being handed over.
    Handover,
    /// Held by no one.
    Free,
    /// Held by a member known dead (or restarting): waiting for takeover or return.
    Orphaned,
}

/// One shard in the fleet view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardView {
    /// The shard.
    pub shard: u32,
    /// Holder of its Lease.
    pub owner: Option<String>,
    /// Owner by the assignment.
    pub desired_owner: Option<String>,
    /// State.
    pub state: ShardStatus,
    /// Epoch (`leaseTransitions` of its Lease).
    pub epoch: i32,
    /// Manifests of the shard, as its owner last published (None: not published).
    pub manifests: Option<u64>,
    /// Manifests due and waiting for a worker, as its owner last published.
    pub queued: Option<u64>,
    /// Manifests queued for a later time (re-checks, retries), as its owner last published.
    #[serde(default)]
    pub scheduled: Option<u64>,
}

/// The fleet as one replica sees it: what `GET /v1/shards` and friends answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetView {
    /// Fleet name.
    pub fleet: String,
    /// The replica answering.
    pub replica: String,
    /// Number of virtual shards.
    pub shard_count: u32,
    /// The StatefulSet's desired replicas, when the fleet follows one.
    pub desired_replicas: Option<u32>,
    /// Whether the replica answering has stopped acting (its renew deadline passed).
    pub self_fenced: bool,
    /// Every member with a Lease.
    pub members: Vec<MemberView>,
    /// The members the shards are assigned to.
    pub assigned: Vec<String>,
    /// Every shard (empty until the first round).
    pub shards: Vec<ShardView>,
}

/// The states of the shards from a round's records (pure).
pub fn shard_views(
    records: &BTreeMap<u32, ShardLeaseRecord>,
    desired: &[String],
    members: &[MemberView],
    mut is_dead: impl FnMut(&str) -> bool,
) -> Vec<ShardView> {
    let by_name: BTreeMap<&str, &MemberView> =
        members.iter().map(|m| (m.name.as_str(), m)).collect();
    records
        .iter()
        .map(|(&shard, record)| {
            let desired_owner = desired.get(shard as usize).cloned();
            let state = match &record.holder {
                None => ShardStatus::Free,
                Some(holder) if is_dead(holder) => ShardStatus::Orphaned,
                Some(holder) if Some(holder) == desired_owner.as_ref() => ShardStatus::Owned,
                Some(_) => ShardStatus::Handover,
            };
            let load = record
                .holder
                .as_deref()
                .and_then(|h| by_name.get(h))
                .and_then(|m| m.load.as_ref())
                .and_then(|l| l.shards.get(&shard));
            ShardView {
                shard,
                owner: record.holder.clone(),
                desired_owner,
                state,
                epoch: record.epoch,
                manifests: load.map(|l| l.manifests),
                queued: load.map(|l| l.queued),
                scheduled: load.map(|l| l.scheduled),
            }
        })
        .collect()
}

/// What the fleet loop needs to know about this replica's work.
pub trait LocalWork: Send + Sync {
    /// Passes of `shard` running now (a shard is released only when none are).
    fn in_flight(&self, shard: u32) -> usize;
    /// The load to publish on the membership Lease.
    fn load(&self) -> MemberLoad;
}

/// How a replica's fleet loop ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Restarting while desired: keep the shards (announce `restarting`).
    Restart,
    /// Leaving: hand every shard over, then delete the membership Lease.
    Leave,
}

/// One replica's part in the fleet.
pub struct Fleet {
    config: FleetConfig,
    membership: Membership,
    shard_leases: Api<Lease>,
    statefulsets: Api<StatefulSet>,
    ownership: Arc<Ownership>,
    work: Arc<dyn LocalWork>,
    metrics: FleetMetrics,
    view: watch::Sender<FleetView>,
    members_view: watch::Sender<Members>,
    /// `POST /v1/drain` sets it: hand every shard over and take none.
    drain: watch::Receiver<bool>,
    desired: Option<DesiredOrdinals>,
    /// What the renewals announce (besides `draining` while `drain` is set).
    announce: watch::Sender<MemberState>,
    /// The shards held after the last successful round, with their epochs (to notice the ones
    /// taken away).
    held: BTreeMap<u32, i32>,
    /// For the `ShardLost`/`OwnershipViolation` Events on the membership Lease.
    client: Client,
    /// The task renewing the membership Lease, and its stop switch.
    renewals: Option<Renewals>,
}

impl Fleet {
    /// A replica of the fleet in `config`; it acts through `ownership` and publishes its views.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        config: FleetConfig,
        ownership: Arc<Ownership>,
        work: Arc<dyn LocalWork>,
        metrics: FleetMetrics,
        view: watch::Sender<FleetView>,
        members_view: watch::Sender<Members>,
        drain: watch::Receiver<bool>,
    ) -> Self {
        let namespace = config.membership.namespace.clone();
        Self {
            client: client.clone(),
            held: BTreeMap::new(),
            membership: Membership::new(client.clone(), config.membership.clone()),
            shard_leases: Api::namespaced(client.clone(), &namespace),
            statefulsets: Api::namespaced(client, &namespace),
            config,
            ownership,
            work,
            metrics,
            view,
            members_view,
            drain,
            desired: None,
            announce: watch::Sender::new(MemberState::Active),
            renewals: None,
        }
    }

    fn me(&self) -> &str {
        &self.config.membership.replica
    }

    /// Runs the protocol until `shutdown` completes; then returns how this replica should exit
    /// (call [`Fleet::exit`] once the controller has drained its passes).
    pub async fn run(&mut self, shutdown: impl std::future::Future<Output = ()>) -> Exit {
        let selector = format!(
            "{FLEET_LABEL}={},{LEASE_KIND_LABEL}=shard",
            self.config.membership.fleet
        );
        let mut shard_events = watcher(
            self.shard_leases.clone(),
            watcher::Config::default().labels(&selector),
        )
        .default_backoff()
        .boxed();
        // The desired ordinals follow the StatefulSet at once (a scale-down's SIGTERM follows
        // the change of `spec.replicas` within milliseconds).
        let mut desired_events = match &self.config.statefulset {
            Some(name) => watcher(
                self.statefulsets.clone(),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
            )
            .default_backoff()
            .boxed(),
            None => futures::stream::pending().boxed(),
        };
        let mut tick = tokio::time::interval(self.config.membership.renew_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.start_renewals();
        tokio::pin!(shutdown);
        loop {
            let draining = !self.ownership.draining().is_empty();
            tokio::select! {
                _ = tick.tick() => self.refresh().await,
                Some(_) = shard_events.next() => {
                    // One round for a burst of changes.
                    while let Some(Some(_)) = shard_events.next().now_or_never() {}
                    self.membership.observe().await;
                }
                Some(event) = desired_events.next() => match event {
                    Ok(watcher::Event::Apply(sts) | watcher::Event::InitApply(sts)) => {
                        self.desired = Some(desired_of(&sts));
                    }
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::warn!("watch the StatefulSet: {e}");
                        continue;
                    }
                },
                // A draining shard is released as soon as its last pass ends.
                _ = tokio::time::sleep(Duration::from_millis(200)), if draining => {}
                Ok(()) = self.drain.changed() => self.refresh().await,
                _ = &mut shutdown => break,
            }
            self.round().await;
        }
        self.decide_exit().await
    }

    /// Restart or leave. The desired replicas are read afresh: a scale-down changes
    /// `spec.replicas` just before the StatefulSet controller stops the pod.
    async fn decide_exit(&mut self) -> Exit {
        self.refresh_desired().await;
        let desired = self.desired.as_ref().is_some_and(|d| d.desires(self.me()));
        if desired && !*self.drain.borrow() {
            Exit::Restart
        } else {
            Exit::Leave
        }
    }

    /// The state to announce now.
    fn announced(&self) -> MemberState {
        announced(&self.drain, &self.announce.borrow())
    }

    /// Renews the membership Lease every renew interval (and at once when what it announces
    /// changes) in a task of its own, so that a slow shard round never delays a renewal; each
    /// successful renewal extends the fence at once.
    fn start_renewals(&mut self) {
        if self.renewals.is_some() {
            return;
        }
        self.renewals = Some(spawn_renewals(
            self.membership.renewer(),
            RenewalContext {
                announce: self.announce.subscribe(),
                drain: self.drain.clone(),
                work: self.work.clone(),
                metrics: self.metrics.clone(),
                ownership: self.ownership.clone(),
                interval: self.config.membership.renew_interval,
                renew_deadline: self.config.renew_deadline,
            },
        ));
    }

    /// Stops the renewals and waits until none is under way (a renewal landing after the final
    /// write would undo it: re-announce `active`, or recreate a deleted Lease).
    async fn stop_renewals(&mut self) {
        if let Some((stop, task)) = self.renewals.take() {
            let _ = stop.send(());
            let _ = task.await;
        }
    }

    /// Lists the members and publishes them.
    async fn refresh(&mut self) {
        self.membership.observe().await;
        self.members_view.send_replace(self.membership.view());
    }

    /// Reads the StatefulSet's desired replicas (keeps the last value when that fails).
    async fn refresh_desired(&mut self) {
        if let Some(name) = &self.config.statefulset {
            match tokio::time::timeout(
                self.config.membership.renew_interval,
                self.statefulsets.get(name),
            )
            .await
            {
                Ok(Ok(sts)) => self.desired = Some(desired_of(&sts)),
                Ok(Err(e)) => tracing::warn!(statefulset = %name, "read desired replicas: {e}"),
                Err(_) => tracing::warn!(statefulset = %name, "read desired replicas: timed out"),
            }
        }
    }

    /// One shard round, if this replica may act; publishes ownership and the fleet view.
    async fn round(&mut self) {
        if self.ownership.is_superseded() {
            return; // another process renews this name's Lease: no shard Lease is touched
        }
        let grant = match round_deadline(
            &self.ownership,
            self.membership.renewed_at(),
            self.config.renew_deadline,
        ) {
            Deadline::NotYet => return,
            Deadline::Passed => {
                self.publish(None, &[], &BTreeSet::new());
                return;
            }
            Deadline::Until(grant) => grant,
        };
        if self.config.statefulset.is_some() && self.desired.is_none() {
            // Which ordinals are desired is unknown: change nothing, keep working.
            self.ownership.extend(grant.until);
            return;
        }
        let assigned = self.assigned();
        let me = self.me().to_owned();
        let desired_owners = super::assign(self.config.shards, &assigned);
        let work = self.work.clone();
        let ownership = self.ownership.clone();
        // Before the round reads the Leases: a shard found taken was taken before this instant.
        let was_in_time = self.ownership.in_time();
        let membership = &mut self.membership;
        // Bounded: a hung request must not stop the rounds (the renewals would go on, and the
        // replica would look alive while nobody works on its shards).
        let round = sync_shards(
            &self.shard_leases,
            &self.config.membership.fleet,
            &me,
            self.config.shards,
            |m| membership.is_dead(m),
            &desired_owners,
            // Dispatch stops first; then a pass popped before is counted in flight, and one
            // popped after is refused: nothing runs on the shard once it is released.
            |k| {
                ownership.stop_dispatch(k);
                work.in_flight(k) == 0
            },
        );
        let result = match tokio::time::timeout(self.config.renew_deadline, round).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(
                "shard round timed out (renew deadline)".into(),
            )),
        };
        match result {
            Ok(round) => {
                self.ownership
                    .set(round.epochs.clone(), round.draining.clone(), grant);
                let lost = lost_shards(&self.held, &round, self.me());
                self.held = round.epochs.clone();
                if !lost.is_empty() {
                    self.report_losses(&lost, was_in_time);
                }
                self.report(&round);
                self.publish(Some(&round), &desired_owners, &assigned);
            }
            Err(e) => {
                tracing::warn!("list shard leases: {e}");
                self.ownership.extend(grant.until);
            }
        }
    }

    /// The members the shards are assigned over: the live, desired members of the last list,
    /// with this replica as it is now.
    fn assigned(&self) -> BTreeSet<String> {
        let members = self.membership.view();
        let mut assigned = assignment_members(
            &members.members,
            self.desired.as_ref(),
            self.config.restart_grace,
        );
        let me = self.me().to_owned();
        // This replica's own state is what it does now, not what the last list showed.
        let self_counts = self.announced() == MemberState::Active
            && self.desired.as_ref().is_none_or(|d| d.desires(&me));
        if self_counts {
            assigned.insert(me);
        } else {
            assigned.remove(&me);
        }
        assigned
    }

    fn report(&self, round: &Round) {
        // Each acquisition and release is logged by `sync_shards` as it happens.
        if !round.conflicts.is_empty() {
            let shards: Vec<String> = round.conflicts.iter().map(u32::to_string).collect();
            tracing::info!(
                shards = %shards.join(","),
                "shard leases changed meanwhile; retrying next round"
            );
        }
        self.metrics.takeovers.inc_by(round.takeovers.len() as u64);
        // A release older than two lease durations was no handover (a fleet scaled to 0 and
        // back, a shard nobody wanted): its age would only distort the gap.
        let handover = 2 * self.config.membership.lease_duration;
        for gap in round.handover_gaps.values().filter(|g| **g <= handover) {
            self.metrics.handover_gap.observe(gap.as_secs_f64());
        }
        self.metrics.acquired.inc_by(round.acquired.len() as u64);
        self.metrics.released.inc_by(round.released.len() as u64);
        self.metrics.conflicts.inc_by(round.conflicts.len() as u64);
        self.metrics.owned.set(round.owned.len() as i64);
        self.metrics.draining.set(round.draining.len() as i64);
    }

    /// Shards another replica took: a warning (and `ShardLost` Event) when this replica's
    /// deadline had passed — the protocol working as designed after a crash, pause or partition —
    /// an error (and `OwnershipViolation` Event) when it had not: then the other replica took a
    /// shard this one could still act on, and both may have written the same objects. The Event
    /// is published in a task of its own (bounded), so a hanging request never stalls the rounds.
    fn report_losses(&self, lost: &BTreeMap<u32, String>, was_in_time: bool) {
        let list = lost
            .iter()
            .map(|(shard, holder)| format!("{shard} (now {holder})"))
            .collect::<Vec<_>>()
            .join(", ");
        self.metrics.losses.inc_by(lost.len() as u64);
        let (reason, note) = if was_in_time {
            self.metrics.ownership_violations.inc_by(lost.len() as u64);
            tracing::error!(
                shards = %list,
                "ownership violation: shards taken over while this replica was within its renew deadline"
            );
            (
                "OwnershipViolation",
                format!(
                    "shards taken over while {} was within its renew deadline (both replicas may have acted): {list}",
                    self.me()
                ),
            )
        } else {
            tracing::warn!(shards = %list, "shards lost: taken over by another replica");
            (
                "ShardLost",
                format!(
                    "{} lost shards after missing its renew deadline: {list}",
                    self.me()
                ),
            )
        };
        let regarding = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some(self.config.membership.namespace.clone()),
            name: Some(self.config.membership.lease_name(self.me())),
            ..Default::default()
        };
        let events = crate::telemetry::events::Publisher::new(
            self.client.clone(),
            kube::runtime::events::Reporter {
                controller: "module-manager".into(),
                instance: Some(self.me().to_owned()),
            },
        );
        let timeout = self.config.membership.renew_interval;
        tokio::spawn(async move {
            let warning = kube::runtime::events::EventType::Warning;
            let publish = events.publish(&regarding, warning, reason, "ShardRound", &note);
            match tokio::time::timeout(timeout, publish).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("publish event {reason}: {e}"),
                Err(_) => tracing::warn!("publish event {reason}: timed out"),
            }
        });
    }

    fn publish(&mut self, round: Option<&Round>, desired: &[String], assigned: &BTreeSet<String>) {
        let members = self.membership.view();
        self.metrics
            .members_live
            .set(members.members.iter().filter(|m| m.live).count() as i64);
        self.metrics
            .fenced
            .set(i64::from(!self.ownership.in_time()));
        let previous = self.view.borrow().shards.clone();
        let membership = &mut self.membership;
        let shards = match round {
            Some(round) => {
                let views = shard_views(&round.records, desired, &members.members, |m| {
                    membership.is_dead(m)
                });
                self.metrics.unowned.set(
                    views
                        .iter()
                        .filter(|v| matches!(v.state, ShardStatus::Free | ShardStatus::Orphaned))
                        .count() as i64,
                );
                views
            }
            None => previous,
        };
        self.view.send_replace(FleetView {
            fleet: self.config.membership.fleet.clone(),
            replica: self.config.membership.replica.clone(),
            shard_count: self.config.shards.get(),
            desired_replicas: self.desired.as_ref().map(|d| d.replicas),
            self_fenced: !self.ownership.in_time(),
            members: members.members,
            assigned: assigned.iter().cloned().collect(),
            shards,
        });
    }

    /// Ends this replica's part, after the controller has drained its passes. `Restart`:
    /// announce `restarting` and keep the shards (the others wait up to the restart grace).
    /// `Leave`: announce `draining`, release every shard (the others see the releases through
    /// their watch and take over at once), then delete the membership Lease. Returns the shards
    /// still held at exit.
    pub async fn exit(&mut self, exit: Exit) -> usize {
        match exit {
            Exit::Restart => {
                self.stop_renewals().await;
                self.ownership.fence();
                let held = self.ownership.owned().len();
                if !self.membership.renew(MemberState::Restarting, None).await {
                    tracing::warn!(
                        "could not announce the restart; the others will take over after the lease expires"
                    );
                }
                tracing::info!(
                    shards = held,
                    "restarting: keeping the shards for the restart grace"
                );
                held
            }
            Exit::Leave => {
                self.start_renewals();
                self.announce.send_replace(MemberState::Draining);
                let deadline = Instant::now() + self.config.handover_timeout;
                let mut observed = Instant::now();
                loop {
                    self.round().await;
                    if self.ownership.owned().is_empty() || Instant::now() >= deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if observed.elapsed() >= self.config.membership.renew_interval {
                        self.refresh().await;
                        observed = Instant::now();
                    }
                }
                self.stop_renewals().await;
                let held = self.ownership.owned().len();
                self.ownership.fence();
                if held == 0 {
                    tracing::info!("left the fleet: every shard handed over");
                } else {
                    tracing::warn!(
                        shards = held,
                        "handover timed out: the others take these over after the lease expires"
                    );
                }
                self.membership.leave().await;
                held
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, live: bool, state: MemberState, unchanged: f64) -> MemberView {
        MemberView {
            name: name.into(),
            live,
            unchanged_for_seconds: unchanged,
            state,
            load: None,
        }
    }

    fn names(set: &BTreeSet<String>) -> Vec<&str> {
        set.iter().map(String::as_str).collect()
    }

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn a_shard_is_lost_only_when_another_took_it_from_this_replica() {
        // Held after the previous round, at epoch 7 each.
        let held: BTreeMap<u32, i32> = (1..=6).map(|k| (k, 7)).collect();
        let record = |holder: Option<&str>, epoch| ShardLeaseRecord {
            holder: holder.map(Into::into),
            epoch,
        };
        let round = Round {
            owned: [1].into(),
            released: [2].into(),
            records: [
                (1, record(Some("mm-0"), 7)),
                (2, record(None, 8)),
                // Taken over from mm-0: one change of holder.
                (3, record(Some("mm-1"), 8)),
                // Released by mm-0 in a round that then timed out: not taken.
                (4, record(None, 8)),
                // Released by mm-0 (that round failed), then acquired by mm-2: a handover.
                (5, record(Some("mm-2"), 9)),
                // A release write of mm-0 that lost a race to its own earlier write.
                (6, record(Some("mm-0"), 8)),
            ]
            .into(),
            ..Default::default()
        };
        assert_eq!(
            lost_shards(&held, &round, "mm-0"),
            BTreeMap::from([(3, "mm-1".to_owned())])
        );
        assert!(lost_shards(&BTreeMap::new(), &round, "mm-0").is_empty());
    }

    #[test]
    fn desired_ordinals_are_exact_names() {
        let sts = DesiredOrdinals {
            name: "mm".into(),
            replicas: 3,
        };
        assert!(sts.desires("mm-0") && sts.desires("mm-2"));
        for name in [
            "mm-3", "mm-01", "mm-+1", "mm", "mm-", "mmx-1", "other-0", "mm-1-1",
        ] {
            assert!(!sts.desires(name), "{name}");
        }
    }

    #[test]
    fn without_a_statefulset_the_live_active_members_count() {
        let members = [
            member("a", true, MemberState::Active, 1.0),
            member("b", false, MemberState::Active, 20.0),
            member("c", true, MemberState::Draining, 1.0),
            // Restart grace needs desired ordinals: without them a restart is a leave.
            member("d", false, MemberState::Restarting, 20.0),
        ];
        assert_eq!(names(&assignment_members(&members, None, GRACE)), ["a"]);
    }

    #[test]
    fn a_restarting_member_keeps_its_place_for_the_grace_and_scaled_away_ordinals_leave() {
        let sts = DesiredOrdinals {
            name: "mm".into(),
            replicas: 3,
        };
        let members = [
            member("mm-0", true, MemberState::Active, 1.0),
            member("mm-1", false, MemberState::Restarting, 30.0), // lease expired, within grace
            member("mm-2", false, MemberState::Restarting, 61.0), // grace over
            member("mm-3", true, MemberState::Active, 1.0),       // scaled away
            member("intruder", true, MemberState::Active, 1.0),   // not of the StatefulSet
        ];
        assert_eq!(
            names(&assignment_members(&members, Some(&sts), GRACE)),
            ["mm-0", "mm-1"]
        );
        // A crashed member (no restarting mark) is out once it is dead.
        let crashed = [
            member("mm-0", true, MemberState::Active, 1.0),
            member("mm-1", false, MemberState::Active, 16.0),
        ];
        assert_eq!(
            names(&assignment_members(&crashed, Some(&sts), GRACE)),
            ["mm-0"]
        );
    }

    /// The handover state machine over time, on a paused clock, from mm-0's point of view: mm-1
    /// restarts (announces `restarting`, stops renewing). Its shards stay its own for the restart
    /// grace, although its Lease expires after 15 s; once the grace is over, mm-0 acquires them;
    /// had it crashed (no announcement), mm-0 would acquire them once the Lease expired.
    #[tokio::test(start_paused = true)]
    async fn a_restart_keeps_its_shards_for_the_grace_and_a_crash_loses_them_at_expiry() {
        use super::super::membership::Liveness;
        use super::super::ownership::{ShardAction, decide, shard_state};
        let sts = DesiredOrdinals {
            name: "mm".into(),
            replicas: 2,
        };
        let lease = Duration::from_secs(15);
        let shards = ShardCount::new(16).unwrap();
        let both: BTreeSet<String> = ["mm-0", "mm-1"].map(String::from).into();
        let theirs: Vec<u32> = super::super::assign(shards, &both)
            .iter()
            .enumerate()
            .filter(|(_, owner)| *owner == "mm-1")
            .map(|(k, _)| k as u32)
            .collect();
        for announced in [MemberState::Restarting, MemberState::Active] {
            let mut liveness = Liveness::default();
            let start = Instant::now();
            let mut first_acquire = None;
            for step in 0..=20u64 {
                // mm-0 renews every 5 s; mm-1's Lease stays at the version of its last write.
                liveness.observe(
                    [
                        ("mm-0".into(), step.to_string()),
                        ("mm-1".into(), "1".into()),
                    ],
                    Instant::now(),
                );
                let views: Vec<MemberView> = liveness
                    .unchanged_for(Instant::now())
                    .into_iter()
                    .map(|(name, unchanged)| MemberView {
                        live: !liveness.is_dead(&name, lease),
                        unchanged_for_seconds: unchanged.as_secs_f64(),
                        state: if name == "mm-1" {
                            announced
                        } else {
                            MemberState::Active
                        },
                        load: None,
                        name,
                    })
                    .collect();
                let desired =
                    super::super::assign(shards, &assignment_members(&views, Some(&sts), GRACE));
                let actions: Vec<ShardAction> = theirs
                    .iter()
                    .map(|&k| {
                        let record = ShardLeaseRecord {
                            holder: Some("mm-1".into()),
                            epoch: 1,
                        };
                        let state = shard_state(Some(&record), |m| liveness.is_dead(m, lease));
                        decide("mm-0", desired.get(k as usize).map(String::as_str), &state)
                    })
                    .collect();
                if actions.contains(&ShardAction::Acquire) && first_acquire.is_none() {
                    first_acquire = Some(start.elapsed());
                    assert!(
                        actions.iter().all(|a| *a == ShardAction::Acquire),
                        "all of its shards at once"
                    );
                }
                tokio::time::advance(Duration::from_secs(5)).await;
            }
            let expected = match announced {
                MemberState::Restarting => GRACE,
                _ => lease,
            };
            assert_eq!(first_acquire, Some(expected), "{announced:?}");
        }
    }

    #[test]
    fn shard_views_tell_owned_handover_free_and_orphaned() {
        let records: BTreeMap<u32, ShardLeaseRecord> =
            [(0, Some("a")), (1, Some("a")), (2, None), (3, Some("dead"))]
                .into_iter()
                .map(|(k, h)| {
                    (
                        k,
                        ShardLeaseRecord {
                            holder: h.map(str::to_owned),
                            epoch: 2,
                        },
                    )
                })
                .collect();
        let desired: Vec<String> = ["a", "b", "b", "a"].map(String::from).to_vec();
        let mut a = member("a", true, MemberState::Active, 0.0);
        a.load = Some(MemberLoad {
            shards: [(
                0,
                super::super::membership::ShardLoad {
                    manifests: 7,
                    queued: 1,
                    scheduled: 6,
                },
            )]
            .into(),
            ..Default::default()
        });
        let views = shard_views(&records, &desired, &[a], |m| m == "dead");
        let states: Vec<ShardStatus> = views.iter().map(|v| v.state).collect();
        assert_eq!(
            states,
            [
                ShardStatus::Owned,
                ShardStatus::Handover,
                ShardStatus::Free,
                ShardStatus::Orphaned
            ]
        );
        assert_eq!(
            (views[0].manifests, views[0].queued, views[0].scheduled),
            (Some(7), Some(1), Some(6))
        );
        assert_eq!(views[1].manifests, None);
    }

    /// A renewal with a fixed latency that succeeds while `up` is set, recording its start as
    /// the Lease I/O does (`Renewer::renew`).
    struct TimedRenewal {
        latency: Duration,
        up: Arc<std::sync::atomic::AtomicBool>,
        renewed_at: Arc<std::sync::Mutex<Option<Instant>>>,
    }

    impl Renew for TimedRenewal {
        async fn renew(&self, _: MemberState, _: MemberLoad) -> Option<Instant> {
            let started = Instant::now();
            tokio::time::sleep(self.latency).await;
            if !self.up.load(std::sync::atomic::Ordering::SeqCst) {
                return None;
            }
            *self.renewed_at.lock().unwrap() = Some(started);
            Some(started)
        }

        fn superseded(&self) -> bool {
            false
        }
    }

    /// Renewals that succeed until `taken_over` is set; from then on another process renews
    /// the Lease under this replica's name (what `Renewer::renew` finds after a conflict).
    struct TakenOver {
        taken_over: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Renew for TakenOver {
        async fn renew(&self, _: MemberState, _: MemberLoad) -> Option<Instant> {
            let started = Instant::now();
            tokio::time::sleep(Duration::from_millis(20)).await;
            (!self.superseded()).then_some(started)
        }

        fn superseded(&self) -> bool {
            self.taken_over.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    /// Issue 15 item 8: a replica whose membership Lease another process (same name, another
    /// incarnation) took over stops all work at its first failed renewal, not at its renew
    /// deadline, and no later shard round (with the grant of an earlier renewal) gives it work
    /// again.
    #[tokio::test(start_paused = true)]
    async fn a_replica_whose_lease_another_incarnation_took_over_is_fenced_at_once_and_for_good() {
        const INTERVAL: Duration = Duration::from_secs(5);
        const DEADLINE: Duration = Duration::from_secs(10);
        let ownership = Ownership::new();
        let taken_over = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (_announce_tx, announce) = watch::channel(MemberState::Active);
        let (_drain_tx, drain) = watch::channel(false);
        let metrics = FleetMetrics::default();
        let (_stop, task) = spawn_renewals(
            TakenOver {
                taken_over: taken_over.clone(),
            },
            RenewalContext {
                announce,
                drain,
                work: Arc::new(Idle),
                metrics: metrics.clone(),
                ownership: ownership.clone(),
                interval: INTERVAL,
                renew_deadline: DEADLINE,
            },
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let grant = Grant::new(Instant::now(), DEADLINE);
        ownership.set(BTreeMap::from([(0, 1)]), BTreeSet::new(), grant);
        assert!(
            ownership.in_time() && ownership.dispatch(0).is_some(),
            "working"
        );

        taken_over.store(true, std::sync::atomic::Ordering::SeqCst);
        // The next renewal (within one interval) finds the Lease taken over.
        tokio::time::sleep(INTERVAL + Duration::from_millis(100)).await;
        assert!(
            Instant::now() < grant.until,
            "still well within the last renewal's deadline"
        );
        assert!(
            !ownership.in_time() && ownership.dispatch(0).is_none(),
            "fenced at the first renewal after the takeover, before the renew deadline"
        );
        // A round that read the last good renewal publishes late: nothing comes back.
        ownership.set(BTreeMap::from([(0, 1)]), BTreeSet::new(), grant);
        ownership.extend(grant.until);
        assert!(!ownership.in_time() && ownership.owned().is_empty());
        assert!(ownership.is_superseded());
        assert_eq!(metrics.superseded.get(), 1);
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the renewal task ends: nothing more to renew")
            .unwrap();
    }

    struct Idle;

    impl LocalWork for Idle {
        fn in_flight(&self, _: u32) -> usize {
            0
        }
        fn load(&self) -> MemberLoad {
            MemberLoad::default()
        }
    }

    /// One replica's two timers on a paused clock: the production renewal task (renewals of
    /// `latency`) and rounds every renew interval starting `phase` later, each taking
    /// `round_latency` between reading `renewed_at` and publishing ownership (as `Fleet::round`
    /// does). Runs for two minutes, then stops the renewals (they fail from then on) and runs
    /// a deadline and two intervals more.
    async fn lapses(phase: Duration, latency: Duration, round_latency: Duration) -> Sweep {
        const INTERVAL: Duration = Duration::from_secs(5);
        const DEADLINE: Duration = Duration::from_secs(10);
        let ownership = Ownership::new();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let renewed_at = Arc::new(std::sync::Mutex::new(None));
        let (_announce_tx, announce) = watch::channel(MemberState::Active);
        let (_drain_tx, drain) = watch::channel(false);
        let start = Instant::now();
        let rounds = tokio::spawn({
            let ownership = ownership.clone();
            let renewed_at = renewed_at.clone();
            async move {
                tokio::time::sleep(phase).await;
                let mut tick = tokio::time::interval(INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let read = *renewed_at.lock().unwrap();
                    if let Deadline::Until(until) = round_deadline(&ownership, read, DEADLINE) {
                        tokio::time::sleep(round_latency).await;
                        ownership.set(BTreeMap::from([(0, 1)]), BTreeSet::new(), until);
                    }
                }
            }
        });
        let renewal = TimedRenewal {
            latency,
            up: up.clone(),
            renewed_at,
        };
        let (stop, task) = spawn_renewals(
            renewal,
            RenewalContext {
                announce,
                drain,
                work: Arc::new(Idle),
                metrics: FleetMetrics::default(),
                ownership: ownership.clone(),
                interval: INTERVAL,
                renew_deadline: DEADLINE,
            },
        );
        tokio::time::sleep_until(start + Duration::from_secs(120)).await;
        let while_up = ownership.lapses();
        let acting = ownership.in_time();
        up.store(false, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(DEADLINE + 2 * INTERVAL).await;
        let fenced = !ownership.in_time();
        let _ = stop.send(());
        task.await.unwrap();
        rounds.abort();
        Sweep {
            while_up,
            total: ownership.lapses(),
            acting,
            fenced,
        }
    }

    /// What one combination of the sweep showed.
    #[derive(Debug)]
    struct Sweep {
        /// Lapses while renewals succeeded.
        while_up: u64,
        /// Lapses in all, after renewals stopped too.
        total: u64,
        /// Acting when the renewals stopped.
        acting: bool,
        /// Fenced after a deadline and two intervals without renewals.
        fenced: bool,
    }

    #[tokio::test(start_paused = true)]
    async fn the_fence_never_lapses_while_renewals_succeed_at_any_phase_of_the_two_timers() {
        let ms = Duration::from_millis;
        // Renewal latencies as seen on an idle fleet (15-60 ms, max 0.84 s) and beyond, up to
        // just under the renewal's own timeout (the renew interval).
        let latencies = [1, 15, 60, 840, 2_000, 4_900].map(ms);
        // The round's phase after the renewal timer, densest where the latencies fall.
        let phases = [
            0, 1, 5, 10, 14, 16, 30, 59, 61, 100, 500, 839, 841, 1_000, 1_999, 2_001, 3_000, 4_000,
            4_899, 4_901, 4_999,
        ]
        .map(ms);
        let mut lapsed = Vec::new();
        let mut combinations = 0;
        for latency in latencies {
            for phase in phases {
                for round_latency in [ms(0), ms(20)] {
                    combinations += 1;
                    let sweep = lapses(phase, latency, round_latency).await;
                    if sweep.while_up > 0 || !sweep.acting {
                        lapsed.push((latency, phase, round_latency, sweep.while_up));
                    }
                    assert!(
                        sweep.fenced && sweep.total > sweep.while_up,
                        "renewals stopped but no lapse (latency {latency:?}, phase {phase:?}): {sweep:?}"
                    );
                }
            }
        }
        assert!(
            lapsed.is_empty(),
            "{} of {combinations} combinations lapsed while renewals succeeded, {} lapses in all (latency, phase, round latency, lapses): {lapsed:?}",
            lapsed.len(),
            lapsed.iter().map(|l| l.3).sum::<u64>(),
        );
    }
}
