//! Membership: one Lease per replica, renewed on a schedule. A member is live while its Lease
//! keeps changing, judged on the observer's own clock: a Lease seen unchanged for the lease
//! duration belongs to a dead member. No timestamps from other machines are compared, so clock
//! skew between nodes does not matter.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
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
        let mut next = BTreeMap::new();
        for (member, version) in leases {
            let since = match self.seen.remove(&member) {
                Some(old) if old.version == version => old.since,
                _ => now,
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

/// A member as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberView {
    /// The replica.
    pub name: String,
    /// Whether its Lease changed within the lease duration.
    pub live: bool,
    /// Seconds since this replica last saw its Lease change.
    pub unchanged_for_seconds: f64,
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

/// Renews this replica's Lease and reads the fleet's every `renew_interval`, publishing the view
/// on `view`, until `shutdown` completes; then deletes its Lease (a clean leave: the others do not
/// wait for it to expire).
pub async fn run(
    client: Client,
    config: MembershipConfig,
    view: watch::Sender<Members>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let leases = Api::<Lease>::namespaced(client, &config.namespace);
    let own = config.lease_name(&config.replica);
    let selector = format!("{FLEET_LABEL}={},{LEASE_KIND_LABEL}=member", config.fleet);
    let mut liveness = Liveness::default();
    let mut renewed_at: Option<Instant> = None;
    let mut tick = tokio::time::interval(config.renew_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut shutdown => break,
        }
        // Each request is bounded by the renew interval: a hanging request must not keep a stale
        // view (and a stale "renewed") published.
        let started = Instant::now();
        match tokio::time::timeout(config.renew_interval, renew(&leases, &own, &config)).await {
            // The renewal happened no earlier than the request started: count from there.
            Ok(Ok(())) => renewed_at = Some(started),
            Ok(Err(e)) => tracing::warn!(lease = %own, "renew membership lease: {e}"),
            Err(_) => tracing::warn!(lease = %own, "renew membership lease: timed out"),
        }
        let list = tokio::time::timeout(
            config.renew_interval,
            leases.list(&ListParams::default().labels(&selector)),
        )
        .await;
        match list {
            Err(_) => tracing::warn!("list membership leases: timed out"),
            Ok(Err(e)) => tracing::warn!("list membership leases: {e}"),
            Ok(Ok(list)) => {
                let observed = list.items.iter().filter_map(|lease| {
                    let member = lease.spec.as_ref()?.holder_identity.clone()?;
                    Some((member, lease.resource_version().unwrap_or_default()))
                });
                liveness.observe(observed, Instant::now());
            }
        }
        let now = Instant::now();
        let live = liveness.live(config.lease_duration);
        let members = liveness
            .unchanged_for(now)
            .into_iter()
            .map(|(name, unchanged)| MemberView {
                live: live.contains(&name),
                unchanged_for_seconds: unchanged.as_secs_f64(),
                name,
            })
            .collect();
        let self_renewed =
            renewed_at.is_some_and(|at| now.duration_since(at) < config.lease_duration);
        view.send_replace(Members {
            members,
            self_renewed,
            renewed_at,
        });
    }
    if let Err(e) = leases.delete(&own, &DeleteParams::default()).await {
        tracing::warn!(lease = %own, "delete membership lease on shutdown: {e}");
    }
}

/// Writes this replica's Lease with a fresh renew time (server-side apply, so it is created
/// the first time).
async fn renew(
    leases: &Api<Lease>,
    name: &str,
    config: &MembershipConfig,
) -> Result<(), kube::Error> {
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "labels": { FLEET_LABEL: config.fleet, LEASE_KIND_LABEL: "member" },
        },
        "spec": {
            "holderIdentity": config.replica,
            "leaseDurationSeconds": config.lease_duration.as_secs().max(1),
            "renewTime": MicroTime(Timestamp::now()),
        },
    });
    let params = PatchParams::apply(&format!("module-manager-{}", config.replica)).force();
    leases.patch(name, &params, &Patch::Apply(&lease)).await?;
    Ok(())
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
