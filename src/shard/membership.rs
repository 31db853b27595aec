//! Membership: one Lease per replica, renewed on a schedule. A member is live while its Lease
//! keeps changing, judged on the observer's own clock: a Lease seen unchanged for the lease
//! duration belongs to a dead member. No timestamps from other machines are compared, so clock
//! skew between nodes does not matter.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

/// Label naming the fleet a Lease belongs to.
pub const FLEET_LABEL: &str = "modulemanager.io/fleet";
/// Label telling membership Leases (`member`) from shard Leases.
pub const LEASE_KIND_LABEL: &str = "modulemanager.io/lease";

/// How a replica takes part in its fleet.
#[derive(Clone, Debug)]
pub struct MembershipConfig {
    /// Namespace of the Leases.
    pub namespace: String,
    /// Fleet name: Lease name prefix and label value.
    pub fleet: String,
    /// This replica's name.
    pub replica: String,
    /// A Lease unchanged for this long belongs to a dead member.
    pub lease_duration: Duration,
    /// How often the own Lease is renewed and the others are read.
    pub renew_interval: Duration,
}

impl MembershipConfig {
    /// Name of a member's Lease.
    pub fn lease_name(&self, member: &str) -> String {
        format!("{}-member-{member}", self.fleet)
    }
}

/// When each member's Lease was last seen to change (pure). Evidence of death accumulates only
/// through successful observations: an observer whose own lists fail learns nothing, and
/// declares no one dead because of it.
#[derive(Debug, Default)]
pub struct Liveness {
    seen: BTreeMap<String, Observed>,
    /// Holders asked about while they had no membership Lease here, and since when.
    absent: BTreeMap<String, Instant>,
    /// When the last successful observation was made.
    last_observed: Option<Instant>,
}

#[derive(Debug)]
struct Observed {
    version: String,
    since: Instant,
}

impl Liveness {
    /// Records a successful read of the Leases as (member, resourceVersion). A member seen for
    /// the first time, or whose Lease changed, counts as renewed now; members without a Lease
    /// are forgotten.
    pub fn observe(&mut self, leases: impl IntoIterator<Item = (String, String)>, now: Instant) {
        self.observe_between(leases, now, now);
    }

    /// Records a read that was sent at `sent` and answered at `answered`: the snapshot it shows
    /// was taken somewhere in between. Erring on the safe side, a change counts as made when the
    /// answer came (`answered`), and "still unchanged" as known only when the read was sent
    /// (`sent`), so a slow read never makes a member look dead sooner.
    pub fn observe_between(
        &mut self,
        leases: impl IntoIterator<Item = (String, String)>,
        sent: Instant,
        answered: Instant,
    ) {
        let now = sent;
        let mut next = BTreeMap::new();
        for (member, version) in leases {
            let since = match self.seen.remove(&member) {
                Some(old) if old.version == version => old.since,
                _ => answered,
            };
            self.absent.remove(&member);
            next.insert(member, Observed { version, since });
        }
        self.seen = next;
        self.last_observed = Some(now);
    }

    /// Notes shard holders this observer has no membership Lease for (from `now` on, they are
    /// watched for absence).
    pub fn note_holders<'a>(&mut self, holders: impl IntoIterator<Item = &'a str>, now: Instant) {
        for holder in holders {
            if !self.seen.contains_key(holder) {
                self.absent.entry(holder.to_owned()).or_insert(now);
            }
        }
    }

    /// Members whose Lease changed within `lease_duration` before the last observation.
    pub fn live(&self, lease_duration: Duration) -> BTreeSet<String> {
        self.seen
            .keys()
            .filter(|m| !self.is_dead(m, lease_duration))
            .cloned()
            .collect()
    }

    /// Whether `member` is known to be dead: its Lease was seen unchanged across successful
    /// observations spanning `lease_duration`; or, for a holder without a membership Lease
    /// (noted with [`Liveness::note_holders`]), successful observations over a whole
    /// `lease_duration` never showed one. A holder never noted is not dead: it may have joined
    /// after the last read.
    pub fn is_dead(&self, member: &str, lease_duration: Duration) -> bool {
        let Some(last) = self.last_observed else {
            return false;
        };
        match (self.seen.get(member), self.absent.get(member)) {
            (Some(observed), _) => last.saturating_duration_since(observed.since) >= lease_duration,
            (None, Some(since)) => last.saturating_duration_since(*since) >= lease_duration,
            (None, None) => false,
        }
    }

    /// Every known member and how long its Lease has been unchanged.
    pub fn unchanged_for(&self, now: Instant) -> BTreeMap<String, Duration> {
        self.seen
            .iter()
            .map(|(m, o)| (m.clone(), now.duration_since(o.since)))
            .collect()
    }
}

/// Annotation on a membership Lease saying what the member is doing besides working:
/// `restarting` (shut down gracefully while still desired: keep its shards for the restart grace)
/// or `draining` (asked to hand over all its shards, or leaving for good). Absent: working.
pub const MEMBER_STATE_ANNOTATION: &str = "modulemanager.io/state";
/// Annotation on a membership Lease with the member's load ([`MemberLoad`] as JSON), published
/// with each renewal (no extra writes), so that any replica can show the fleet's queues.
pub const MEMBER_LOAD_ANNOTATION: &str = "modulemanager.io/load";

/// What a member announces on its Lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Working.
    #[default]
    Active,
    /// Shut down while still desired (a rolling update): its shards wait for it.
    Restarting,
    /// Handing over all its shards (`POST /v1/drain`, scale-down or leaving).
    Draining,
}

/// One shard's load as its owner publishes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLoad {
    /// Manifests of the shard in the owner's cache.
    #[serde(rename = "m")]
    pub manifests: u64,
    /// Manifests of the shard due and waiting for a worker.
    #[serde(rename = "q")]
    pub queued: u64,
    /// Manifests of the shard queued for a later time (re-checks, retries).
    #[serde(rename = "s", default, skip_serializing_if = "is_zero")]
    pub scheduled: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A member's load, published on its Lease.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberLoad {
    /// Manifests due and waiting for a worker (the backlog; before issue 19 also the
    /// scheduled ones).
    pub queued: u64,
    /// Manifests queued for a later time (re-checks, retries).
    #[serde(default)]
    pub scheduled: u64,
    /// When the next scheduled one is due (this member's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_due: Option<Timestamp>,
    /// Reconcile passes running.
    pub in_flight: u64,
    /// Manifests in its cache (those of its shards).
    pub manifests: u64,
    /// Per owned shard; left out when it owns more than [`MAX_PUBLISHED_SHARDS`] shards (the
    /// annotation must stay small).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shards: BTreeMap<u32, ShardLoad>,
}

/// At most this many shards' loads are published per member.
pub const MAX_PUBLISHED_SHARDS: usize = 4096;

/// A member as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberView {
    /// The replica.
    pub name: String,
    /// Whether its Lease changed within the lease duration.
    pub live: bool,
    /// Seconds since this replica last saw its Lease change.
    pub unchanged_for_seconds: f64,
    /// What it announces (restarting, draining).
    #[serde(default)]
    pub state: MemberState,
    /// Its load as last published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<MemberLoad>,
}

/// The fleet as this replica sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Members {
    /// Every member with a Lease, by name.
    pub members: Vec<MemberView>,
    /// Whether this replica renewed its own Lease within the lease duration (when the view was
    /// published).
    pub self_renewed: bool,
    /// When this replica's last successful renewal started: consumers check it *when they act*,
    /// against a renew deadline shorter than the lease duration.
    #[serde(skip)]
    pub renewed_at: Option<Instant>,
}

impl Members {
    /// The names of the live members.
    pub fn live(&self) -> BTreeSet<String> {
        self.members
            .iter()
            .filter(|m| m.live)
            .map(|m| m.name.clone())
            .collect()
    }
}

/// One replica's side of membership: renews its own Lease, reads the fleet's, and judges who is
/// alive. [`run`] drives it on a schedule; the fleet loop (`fleet.rs`) drives it between shard
/// rounds.
pub struct Membership {
    leases: Api<Lease>,
    config: MembershipConfig,
    own: String,
    selector: String,
    liveness: Liveness,
    renewed_at: RenewedAt,
    version: Version,
    left: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Member states and loads from the last successful list.
    annotations: BTreeMap<String, (MemberState, Option<MemberLoad>)>,
}

impl Membership {
    /// A member of `config.fleet` whose Leases live in `config.namespace`.
    pub fn new(client: Client, config: MembershipConfig) -> Self {
        Self {
            leases: Api::namespaced(client, &config.namespace),
            own: config.lease_name(&config.replica),
            selector: format!("{FLEET_LABEL}={},{LEASE_KIND_LABEL}=member", config.fleet),
            config,
            liveness: Liveness::default(),
            renewed_at: RenewedAt::default(),
            version: Version::default(),
            left: Default::default(),
            annotations: BTreeMap::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &MembershipConfig {
        &self.config
    }

    /// When the last successful renewal started.
    pub fn renewed_at(&self) -> Option<Instant> {
        self.renewed_at.get()
    }

    /// A handle that renews this member's Lease, for a task of its own: renewals must never
    /// wait behind slow shard rounds.
    pub fn renewer(&self) -> Renewer {
        Renewer {
            leases: self.leases.clone(),
            own: self.own.clone(),
            config: self.config.clone(),
            renewed_at: self.renewed_at.clone(),
            version: self.version.clone(),
            left: self.left.clone(),
        }
    }

    /// Renews the own Lease (see [`Renewer::renew`]).
    pub async fn renew(&self, state: MemberState, load: Option<&MemberLoad>) -> bool {
        self.renewer().renew(state, load).await
    }

    /// Lists the fleet's membership Leases (bounded by the renew interval) and records what
    /// they show; a failed list is no evidence about anyone.
    pub async fn observe(&mut self) {
        let sent = Instant::now();
        let list = tokio::time::timeout(
            self.config.renew_interval,
            self.leases
                .list(&ListParams::default().labels(&self.selector)),
        )
        .await;
        match list {
            Err(_) => tracing::warn!("list membership leases: timed out"),
            Ok(Err(e)) => tracing::warn!("list membership leases: {e}"),
            Ok(Ok(list)) => {
                let mut observed = Vec::new();
                self.annotations.clear();
                for lease in &list.items {
                    let Some(member) = lease.spec.as_ref().and_then(|s| s.holder_identity.clone())
                    else {
                        continue;
                    };
                    observed.push((member.clone(), lease.resource_version().unwrap_or_default()));
                    self.annotations.insert(member, announced(lease));
                }
                self.liveness
                    .observe_between(observed, sent, Instant::now());
            }
        }
    }

    /// Whether `member` is known to be dead (see [`Liveness::is_dead`]); a member not listed
    /// is noted, so that a whole lease duration of its absence counts as death.
    pub fn is_dead(&mut self, member: &str) -> bool {
        self.liveness.note_holders([member], Instant::now());
        self.liveness.is_dead(member, self.config.lease_duration)
    }

    /// The fleet as last observed.
    pub fn view(&self) -> Members {
        let now = Instant::now();
        let live = self.liveness.live(self.config.lease_duration);
        let members = self
            .liveness
            .unchanged_for(now)
            .into_iter()
            .map(|(name, unchanged)| {
                let (state, load) = self.annotations.get(&name).cloned().unwrap_or_default();
                MemberView {
                    live: live.contains(&name),
                    unchanged_for_seconds: unchanged.as_secs_f64(),
                    state,
                    load,
                    name,
                }
            })
            .collect();
        Members {
            members,
            self_renewed: self
                .renewed_at()
                .is_some_and(|at| now.duration_since(at) < self.config.lease_duration),
            renewed_at: self.renewed_at(),
        }
    }

    /// Deletes the own Lease: a clean leave, the others drop this member at their next read.
    pub async fn leave(&self) {
        self.renewer().leave().await;
    }
}

/// When the last successful renewal started, shared between the renewing task and readers.
#[derive(Clone, Debug, Default)]
struct RenewedAt(std::sync::Arc<std::sync::Mutex<Option<Instant>>>);

impl RenewedAt {
    fn get(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, at: Instant) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }
}

/// Renews one member's Lease.
#[derive(Clone)]
pub struct Renewer {
    leases: Api<Lease>,
    own: String,
    config: MembershipConfig,
    renewed_at: RenewedAt,
    /// The resourceVersion of the own Lease as last written: every write is conditional on it,
    /// so that a renewal that lands late (its client gave up) fails instead of undoing a later
    /// write (the `restarting` mark, the deletion at leave).
    version: Version,
    /// Set by [`Renewer::leave`]: no renewal after it.
    left: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// The own Lease's last known resourceVersion, shared.
#[derive(Clone, Debug, Default)]
struct Version(std::sync::Arc<std::sync::Mutex<Option<String>>>);

impl Version {
    fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, version: Option<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = version;
    }
}

impl Renewer {
    /// When this renewer's last successful renewal started.
    pub fn renewed_at(&self) -> Option<Instant> {
        self.renewed_at.get()
    }

    /// Renews the own Lease announcing `state` and `load` (bounded by the renew interval; a
    /// failure is logged and leaves `renewed_at` as it was). Returns whether it succeeded.
    pub async fn renew(&self, state: MemberState, load: Option<&MemberLoad>) -> bool {
        if self.left.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        // The renewal happened no earlier than the request started: count from there.
        let started = Instant::now();
        let request = async {
            // A conflict means the Lease changed since this replica last wrote it: one of its
            // own renewals landed after its client gave up, or another process renews it (a
            // second replica under the same name). Read the version and try again.
            for _ in 0..3 {
                let expected = self.version.get();
                match renew(
                    &self.leases,
                    &self.own,
                    &self.config,
                    state,
                    load,
                    expected.as_deref(),
                )
                .await
                {
                    Err(kube::Error::Api(status))
                        if status.code == 409 || (status.code == 404 && expected.is_some()) =>
                    {
                        tracing::warn!(lease = %self.own, "membership lease changed by another writer (a late renewal of this replica, or a second process named {}?): re-reading it", self.config.replica);
                        self.refresh_version().await;
                    }
                    other => return other,
                }
            }
            Err(kube::Error::Service(
                "membership lease kept changing under this replica".into(),
            ))
        };
        match tokio::time::timeout(self.config.renew_interval, request).await {
            Ok(Ok(version)) => {
                self.version.set(version);
                self.renewed_at.set(started);
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.own, "renew membership lease: {e}");
                false
            }
            Err(_) => {
                tracing::warn!(lease = %self.own, "renew membership lease: timed out");
                false
            }
        }
    }
}

impl Renewer {
    async fn refresh_version(&self) {
        match self.leases.get_opt(&self.own).await {
            Ok(lease) => self.version.set(lease.and_then(|l| l.resource_version())),
            Err(e) => tracing::warn!(lease = %self.own, "read membership lease: {e}"),
        }
    }

    /// Deletes the own Lease (a clean leave), conditional on the version last written, so that
    /// a renewal landing late cannot recreate it, and no renewal after it can either.
    pub async fn leave(&self) {
        self.left.store(true, std::sync::atomic::Ordering::SeqCst);
        for _ in 0..3 {
            let params = DeleteParams {
                preconditions: self.version.get().map(|version| Preconditions {
                    resource_version: Some(version),
                    uid: None,
                }),
                ..Default::default()
            };
            match self.leases.delete(&self.own, &params).await {
                Err(kube::Error::Api(status)) if status.code == 409 => self.refresh_version().await,
                Err(kube::Error::Api(status)) if status.code == 404 => break,
                Err(e) => {
                    tracing::warn!(lease = %self.own, "delete membership lease on shutdown: {e}");
                    break;
                }
                Ok(_) => break,
            }
        }
    }
}

/// The state and load a membership Lease announces (unreadable annotations count as none).
fn announced(lease: &Lease) -> (MemberState, Option<MemberLoad>) {
    let annotations = lease.annotations();
    let state = match annotations.get(MEMBER_STATE_ANNOTATION).map(String::as_str) {
        Some("restarting") => MemberState::Restarting,
        Some("draining") => MemberState::Draining,
        _ => MemberState::Active,
    };
    let load = annotations
        .get(MEMBER_LOAD_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok());
    (state, load)
}

/// Renews this replica's Lease and reads the fleet's every `renew_interval`, publishing the view
/// on `view`, until `shutdown` completes; then deletes its Lease (a clean leave: the others do not
/// wait for it to expire).
pub async fn run(
    client: Client,
    config: MembershipConfig,
    view: watch::Sender<Members>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut membership = Membership::new(client, config);
    let mut tick = tokio::time::interval(membership.config.renew_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut shutdown => break,
        }
        membership.renew(MemberState::Active, None).await;
        membership.observe().await;
        view.send_replace(membership.view());
    }
    membership.leave().await;
}

/// Writes this replica's Lease with a fresh renew time, its state and load (server-side apply:
/// created the first time; an annotation left out is removed, since this field manager owns it).
async fn renew(
    leases: &Api<Lease>,
    name: &str,
    config: &MembershipConfig,
    state: MemberState,
    load: Option<&MemberLoad>,
    expected: Option<&str>,
) -> Result<Option<String>, kube::Error> {
    let mut annotations = serde_json::Map::new();
    match state {
        MemberState::Active => {}
        MemberState::Restarting => {
            annotations.insert(MEMBER_STATE_ANNOTATION.into(), "restarting".into());
        }
        MemberState::Draining => {
            annotations.insert(MEMBER_STATE_ANNOTATION.into(), "draining".into());
        }
    }
    if let Some(load) = load {
        annotations.insert(
            MEMBER_LOAD_ANNOTATION.into(),
            serde_json::to_string(load).unwrap_or_default().into(),
        );
    }
    let mut lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "labels": { FLEET_LABEL: config.fleet, LEASE_KIND_LABEL: "member" },
            "annotations": annotations,
        },
        "spec": {
            "holderIdentity": config.replica,
            "leaseDurationSeconds": config.lease_duration.as_secs().max(1),
            "renewTime": MicroTime(Timestamp::now()),
        },
    });
    if let Some(expected) = expected {
        // A precondition: the apply fails with 409 when the Lease changed since.
        lease["metadata"]["resourceVersion"] = expected.into();
    }
    let params = PatchParams::apply(&format!("module-manager-{}", config.replica)).force();
    let written = leases.patch(name, &params, &Patch::Apply(&lease)).await?;
    Ok(written.resource_version())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leases(entries: &[(&str, &str)]) -> Vec<(String, String)> {
        entries
            .iter()
            .map(|(m, v)| (m.to_string(), v.to_string()))
            .collect()
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    const DURATION: Duration = Duration::from_secs(15);

    #[tokio::test(start_paused = true)]
    async fn a_lease_unchanged_for_the_duration_is_dead_on_the_observers_clock() {
        let mut liveness = Liveness::default();
        liveness.observe(leases(&[("a", "1"), ("b", "7")]), Instant::now());
        assert_eq!(liveness.live(DURATION), names(&["a", "b"]));

        // a renews every 5 s; b stops (its resourceVersion stays 7).
        for step in 1..=3u64 {
            tokio::time::advance(Duration::from_secs(5)).await;
            liveness.observe(
                leases(&[("a", &(1 + step).to_string()), ("b", "7")]),
                Instant::now(),
            );
        }
        // 15 s after b's last change: dead; a is live.
        assert!(liveness.is_dead("b", DURATION));
        assert!(!liveness.is_dead("a", DURATION));
        assert_eq!(liveness.live(DURATION), names(&["a"]));
        assert_eq!(
            liveness.unchanged_for(Instant::now())["b"],
            Duration::from_secs(15)
        );

        // b comes back (a new resourceVersion): live again at once.
        liveness.observe(leases(&[("a", "5"), ("b", "8")]), Instant::now());
        assert_eq!(liveness.live(DURATION).len(), 2);
    }

    /// A slow read: the change it shows counts from its answer, "unchanged" only from when it
    /// was sent, so the read's latency never shortens the time to death.
    #[tokio::test(start_paused = true)]
    async fn a_slow_read_never_makes_a_member_dead_sooner() {
        let mut liveness = Liveness::default();
        let sent = Instant::now();
        tokio::time::advance(Duration::from_secs(4)).await;
        liveness.observe_between(leases(&[("a", "1")]), sent, Instant::now());
        // 15 s after the first read was *sent*, a read is sent that still shows "1" and takes 4 s.
        tokio::time::advance(Duration::from_secs(11)).await;
        let sent = Instant::now();
        tokio::time::advance(Duration::from_secs(4)).await;
        liveness.observe_between(leases(&[("a", "1")]), sent, Instant::now());
        assert!(
            !liveness.is_dead("a", DURATION),
            "only 11 s between the first answer and the last send"
        );
        let sent = Instant::now();
        liveness.observe_between(leases(&[("a", "1")]), sent, Instant::now());
        assert!(liveness.is_dead("a", DURATION));
    }

    #[tokio::test(start_paused = true)]
    async fn failed_observations_are_no_evidence_of_death() {
        let mut liveness = Liveness::default();
        liveness.observe(leases(&[("a", "1")]), Instant::now());
        // This observer's own lists fail for a minute: nothing is observed.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(
            !liveness.is_dead("a", DURATION),
            "no successful observation saw a unchanged that long"
        );
        // Its lists work again and a has renewed meanwhile.
        liveness.observe(leases(&[("a", "9")]), Instant::now());
        assert!(!liveness.is_dead("a", DURATION));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_lease_is_forgotten_and_a_new_member_counts_as_just_renewed() {
        let mut liveness = Liveness::default();
        liveness.observe(leases(&[("a", "1"), ("b", "1")]), Instant::now());
        tokio::time::advance(Duration::from_secs(20)).await;
        liveness.observe(leases(&[("a", "1"), ("c", "3")]), Instant::now());
        assert_eq!(liveness.live(DURATION), names(&["c"]));
        assert!(!liveness.unchanged_for(Instant::now()).contains_key("b"));
    }

    /// A replica that has observed for a long time meets a shard holder it has never listed (it
    /// joined after the last read): not dead until a whole lease duration of successful reads
    /// from the moment it was first asked about has never shown its Lease.
    #[tokio::test(start_paused = true)]
    async fn an_unknown_holder_is_dead_only_after_a_lease_duration_of_absence_since_first_asked() {
        let mut liveness = Liveness::default();
        assert!(!liveness.is_dead("x", DURATION), "before any observation");
        liveness.observe(leases(&[("a", "1")]), Instant::now());
        tokio::time::advance(Duration::from_secs(60)).await; // observing for long
        liveness.observe(leases(&[("a", "2")]), Instant::now());
        assert!(
            !liveness.is_dead("x", DURATION),
            "never asked about: not dead"
        );
        liveness.note_holders(["x"], Instant::now());
        assert!(!liveness.is_dead("x", DURATION), "just noted");
        for _ in 0..2 {
            tokio::time::advance(Duration::from_secs(7)).await;
            liveness.observe(leases(&[("a", "3")]), Instant::now());
        }
        assert!(!liveness.is_dead("x", DURATION), "14 s of absence");
        tokio::time::advance(Duration::from_secs(1)).await;
        liveness.observe(leases(&[("a", "4")]), Instant::now());
        assert!(liveness.is_dead("x", DURATION), "15 s of observed absence");
        // Had it shown up meanwhile, it would be live.
        liveness.observe(leases(&[("a", "5"), ("x", "1")]), Instant::now());
        assert!(!liveness.is_dead("x", DURATION));
    }

    #[test]
    fn lease_names_carry_the_fleet() {
        let config = MembershipConfig {
            namespace: "mm".into(),
            fleet: "core".into(),
            replica: "module-manager-2".into(),
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
        };
        assert_eq!(
            config.lease_name("module-manager-2"),
            "core-member-module-manager-2"
        );
    }
}
