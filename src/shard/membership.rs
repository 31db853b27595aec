//! Membership: one Lease per replica, renewed on a schedule. A member is live while its Lease
//! keeps changing, judged on the observer's own clock: a Lease seen unchanged for the lease
//! duration belongs to a dead member. No timestamps from other machines are compared, so clock
//! skew between nodes does not matter.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::apply::budget::TargetUse;
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
/// Annotation on a membership Lease naming the process that renews it: a random id drawn at
/// start ([`new_incarnation`]). A renewal that meets a conflict re-reads the Lease; if it now
/// names another incarnation, a second process under this replica's name took the Lease over,
/// and this one stops all work instead of overwriting it ([`after_conflict`]).
pub const MEMBER_INCARNATION_ANNOTATION: &str = "modulemanager.io/incarnation";
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
    /// The remote targets that used their request budget most on this member in the last
    /// minute (at most [`MAX_PUBLISHED_TARGETS`]): `GET /v1/targets` adds them up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetUse>,
}

/// At most this many shards' loads are published per member.
pub const MAX_PUBLISHED_SHARDS: usize = 4096;

/// At most this many targets' budget use is published per member (about 100 bytes each).
pub const MAX_PUBLISHED_TARGETS: usize = 20;

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

/// A fresh incarnation id: 128 bits from the standard library's per-process random hasher keys
/// (seeded from the operating system's random source), mixed with the process id and the time.
pub fn new_incarnation() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut words = [0u64; 2];
    for (i, word) in words.iter_mut().enumerate() {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.write_usize(i);
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        *word = hasher.finish();
    }
    format!("{:016x}{:016x}", words[0], words[1])
}

/// What a renewal that met a conflict (409, or 404 after a write) does next (pure), from the
/// own Lease as re-read (`None`: gone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterConflict {
    /// Write again, conditional on this version (`None`: create it): the Lease was last
    /// written by this process (a renewal of its own that landed after its client gave up), by
    /// no incarnation at all (an older operator version), or is gone.
    Retry(Option<String>),
    /// Another process renews the Lease under this replica's name (its incarnation given):
    /// stop all work, never overwrite it.
    Superseded(String),
}

/// Decides what a renewal by incarnation `own` does after a conflict, from the Lease re-read.
pub fn after_conflict(own: &str, lease: Option<&Lease>) -> AfterConflict {
    let Some(lease) = lease else {
        return AfterConflict::Retry(None);
    };
    match lease.annotations().get(MEMBER_INCARNATION_ANNOTATION) {
        Some(other) if other != own => AfterConflict::Superseded(other.clone()),
        _ => AfterConflict::Retry(lease.resource_version()),
    }
}

/// The member a membership Lease stands for: the name after `<fleet>-member-`, never its
/// `holderIdentity` (any writer of Leases could name someone else there and keep a dead member
/// looking alive). A Lease whose holder differs from its name is no member at all.
pub fn member_of(lease: &Lease, fleet: &str) -> Option<String> {
    let name = lease.metadata.name.as_deref()?;
    let member = name.strip_prefix(fleet)?.strip_prefix("-member-")?;
    let holder = lease.spec.as_ref()?.holder_identity.as_deref()?;
    (!member.is_empty() && holder == member).then(|| member.to_owned())
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
    incarnation: std::sync::Arc<str>,
    superseded: Superseded,
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
            incarnation: new_incarnation().into(),
            superseded: Superseded::default(),
            annotations: BTreeMap::new(),
        }
    }

    /// This process's incarnation (written on the Lease with every renewal).
    pub fn incarnation(&self) -> &str {
        &self.incarnation
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
            incarnation: self.incarnation.clone(),
            superseded: self.superseded.clone(),
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
                    let Some(member) = member_of(lease, &self.config.fleet) else {
                        tracing::warn!(lease = %lease.name_any(), holder = ?lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()), "a membership lease whose holder is not its name: not a member");
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

    fn clear(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The incarnation that took the own Lease over, once one did; shared.
#[derive(Clone, Debug, Default)]
struct Superseded(std::sync::Arc<std::sync::Mutex<Option<String>>>);

impl Superseded {
    fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
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
    /// This process's incarnation, written with every renewal.
    incarnation: std::sync::Arc<str>,
    /// Set when another incarnation took the Lease over: no renewal (nor leave) after it.
    superseded: Superseded,
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
        if self.left.load(std::sync::atomic::Ordering::SeqCst) || self.superseded().is_some() {
            return false;
        }
        // The renewal happened no earlier than the request started: count from there.
        let started = Instant::now();
        let request = async {
            // A conflict means the Lease changed since this replica last wrote it: one of its
            // own renewals landed after its client gave up (same incarnation: try again), or
            // another process renews it under the same name (another incarnation: stop).
            for _ in 0..3 {
                let expected = self.version.get();
                let written = renew(
                    &self.leases,
                    &self.own,
                    (&self.config, &self.incarnation),
                    state,
                    load,
                    expected.as_deref(),
                )
                .await;
                match written {
                    Err(kube::Error::Api(status))
                        if status.code == 409 || (status.code == 404 && expected.is_some()) =>
                    {
                        if let Some(other) = self.reread_after_conflict().await {
                            self.supersede(other.clone());
                            return Err(kube::Error::Service(
                                format!("taken over by incarnation {other}").into(),
                            ));
                        }
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
            Ok(Err(_)) if self.superseded().is_some() => false, // logged at error already
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
    /// The incarnation that took the own Lease over, if one did: then this process renews
    /// nothing and acts on nothing any more.
    pub fn superseded(&self) -> Option<String> {
        self.superseded.get()
    }

    /// This process's incarnation.
    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }

    /// Re-reads the own Lease after a conflict ([`after_conflict`]): returns the other
    /// incarnation if one took it over; else takes its version for the next attempt (a failed
    /// read keeps the version as it was).
    async fn reread_after_conflict(&self) -> Option<String> {
        match self.leases.get_opt(&self.own).await {
            Ok(lease) => match after_conflict(&self.incarnation, lease.as_ref()) {
                AfterConflict::Superseded(other) => return Some(other),
                AfterConflict::Retry(version) => {
                    tracing::warn!(lease = %self.own, "membership lease changed under this replica by its own incarnation (a late renewal): retrying");
                    self.version.set(version);
                }
            },
            Err(e) => tracing::warn!(lease = %self.own, "read membership lease: {e}"),
        }
        None
    }

    /// Records that incarnation `other` took the own Lease over: no renewal counts any more
    /// (the fence follows `renewed_at`, cleared here), logged at error, and a Warning Event
    /// `MemberSuperseded` on the Lease (in a task of its own, bounded by the renew interval).
    fn supersede(&self, other: String) {
        *self.superseded.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(other.clone());
        self.renewed_at.clear();
        let note = format!(
            "another process renews {} under the replica name {} (incarnation {other}; this process is {}): this process stopped all work and must be restarted",
            self.own, self.config.replica, self.incarnation
        );
        tracing::error!(lease = %self.own, incarnation = %self.incarnation, other = %other, "membership lease taken over by another process with this replica's name: stopping all work for good");
        let regarding = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some(self.config.namespace.clone()),
            name: Some(self.own.clone()),
            ..Default::default()
        };
        let events = crate::telemetry::events::Publisher::new(
            self.leases.clone().into_client(),
            kube::runtime::events::Reporter {
                controller: "module-manager".into(),
                instance: Some(self.config.replica.clone()),
            },
        );
        let timeout = self.config.renew_interval;
        tokio::spawn(async move {
            let warning = kube::runtime::events::EventType::Warning;
            let publish = events.publish(&regarding, warning, "MemberSuperseded", "Renew", &note);
            match tokio::time::timeout(timeout, publish).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("publish event MemberSuperseded: {e}"),
                Err(_) => tracing::warn!("publish event MemberSuperseded: timed out"),
            }
        });
    }

    /// Deletes the own Lease (a clean leave), conditional on the version last written, so that
    /// a renewal landing late cannot recreate it, and no renewal after it can either.
    pub async fn leave(&self) {
        self.left.store(true, std::sync::atomic::Ordering::SeqCst);
        if self.superseded().is_some() {
            return; // the Lease is the other process's now
        }
        for _ in 0..3 {
            let params = DeleteParams {
                preconditions: self.version.get().map(|version| Preconditions {
                    resource_version: Some(version),
                    uid: None,
                }),
                ..Default::default()
            };
            match self.leases.delete(&self.own, &params).await {
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    if let Some(other) = self.reread_after_conflict().await {
                        tracing::warn!(lease = %self.own, other = %other, "membership lease taken over by another process with this replica's name: not deleting it");
                        break;
                    }
                }
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
    (config, incarnation): (&MembershipConfig, &str),
    state: MemberState,
    load: Option<&MemberLoad>,
    expected: Option<&str>,
) -> Result<Option<String>, kube::Error> {
    let mut annotations = serde_json::Map::new();
    annotations.insert(MEMBER_INCARNATION_ANNOTATION.into(), incarnation.into());
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

    fn lease(name: &str, holder: &str, incarnation: Option<&str>, version: &str) -> Lease {
        let mut lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": version},
            "spec": {"holderIdentity": holder},
        }))
        .unwrap();
        if let Some(incarnation) = incarnation {
            lease.metadata.annotations = Some(
                [(
                    MEMBER_INCARNATION_ANNOTATION.to_owned(),
                    incarnation.to_owned(),
                )]
                .into(),
            );
        }
        lease
    }

    /// Issue 15 item 8: a conflict caused by another incarnation stops this one; one caused
    /// by its own late renewal (or by a writer without incarnation, an older version) retries.
    #[test]
    fn a_conflict_with_another_incarnation_supersedes_and_an_own_late_write_retries() {
        let taken = lease("f-member-f-0", "f-0", Some("bbbb"), "12");
        assert_eq!(
            after_conflict("aaaa", Some(&taken)),
            AfterConflict::Superseded("bbbb".into())
        );
        let own = lease("f-member-f-0", "f-0", Some("aaaa"), "13");
        assert_eq!(
            after_conflict("aaaa", Some(&own)),
            AfterConflict::Retry(Some("13".into()))
        );
        let unmarked = lease("f-member-f-0", "f-0", None, "14");
        assert_eq!(
            after_conflict("aaaa", Some(&unmarked)),
            AfterConflict::Retry(Some("14".into()))
        );
        assert_eq!(after_conflict("aaaa", None), AfterConflict::Retry(None));
    }

    #[test]
    fn incarnations_differ_between_draws() {
        let (a, b) = (new_incarnation(), new_incarnation());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }

    /// Issue 15 item 8: members are keyed by Lease name. A forged Lease under another name
    /// naming a dead member as its holder (what a chart could create) does not keep that member
    /// alive, and is no member itself.
    #[tokio::test(start_paused = true)]
    async fn a_forged_lease_naming_a_dead_member_does_not_keep_it_alive() {
        let observe = |liveness: &mut Liveness, leases: &[Lease]| {
            let observed: Vec<(String, String)> = leases
                .iter()
                .filter_map(|l| Some((member_of(l, "f")?, l.resource_version()?)))
                .collect();
            liveness.observe(observed, Instant::now());
        };
        let mut liveness = Liveness::default();
        observe(
            &mut liveness,
            &[
                lease("f-member-f-0", "f-0", None, "1"),
                lease("f-member-f-1", "f-1", None, "1"),
            ],
        );
        // f-1 dies (its Lease stays at "1"); a forged Lease naming it changes every 5 s.
        for step in 1..=4u32 {
            tokio::time::advance(Duration::from_secs(5)).await;
            let version = (1 + step).to_string();
            observe(
                &mut liveness,
                &[
                    lease("f-member-f-0", "f-0", None, &version),
                    lease("f-member-f-1", "f-1", None, "1"),
                    lease("f-member-forged", "f-1", None, &version),
                    lease("other-lease", "f-1", None, &version),
                ],
            );
        }
        assert!(
            liveness.is_dead("f-1", DURATION),
            "the forgery kept f-1 alive"
        );
        assert_eq!(liveness.live(DURATION), names(&["f-0"]));
        assert_eq!(
            member_of(&lease("f-member-forged", "f-1", None, "1"), "f"),
            None,
            "a Lease whose holder is not its name is no member"
        );
        assert_eq!(member_of(&lease("f-member-", "", None, "1"), "f"), None);
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
