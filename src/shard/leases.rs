//! Shard Leases: one Lease per shard (`<fleet>-shard-<k>`), written only when its holder
//! changes, always by compare-and-swap on the resourceVersion that was read, so two replicas
//! can never both take a shard: the second write fails with a conflict.
//!
//! [`sync_shards`] is one round: read the fleet's shard Leases, decide per shard with the pure
//! rules of `ownership.rs`, write. A replica calls it on every membership tick, and only while
//! its own membership Lease is renewed (self-fencing is the caller's duty).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::{Error as KubeError, ResourceExt};

use super::hash::ShardCount;
use super::membership::{FLEET_LABEL, LEASE_KIND_LABEL};
use super::ownership::{ShardAction, ShardLeaseRecord, ShardState, decide, shard_state};

/// Name of a shard's Lease.
pub fn lease_name(fleet: &str, shard: u32) -> String {
    format!("{fleet}-shard-{shard}")
}

/// What one round did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Shards this replica holds after the round (draining ones included: their in-flight
    /// passes may finish).
    pub owned: BTreeSet<u32>,
    /// Owned shards that are no longer desired here: dispatch nothing new, release once quiet.
    pub draining: BTreeSet<u32>,
    /// Shards acquired in this round.
    pub acquired: BTreeSet<u32>,
    /// Of those, the shards taken over from a holder known to be dead.
    pub takeovers: BTreeSet<u32>,
    /// Of those, the shards released by their previous holder: the time from that release
    /// (the Lease's `renewTime`, written by the releasing replica's clock) to this acquisition.
    pub handover_gaps: BTreeMap<u32, Duration>,
    /// Shards released in this round.
    pub released: BTreeSet<u32>,
    /// Shards whose write lost a compare-and-swap race (retried next round).
    pub conflicts: BTreeSet<u32>,
    /// Shards whose write failed otherwise (retried next round); a failed release keeps the
    /// shard owned and draining.
    pub failed: BTreeSet<u32>,
    /// The epoch (`leaseTransitions`) of every owned shard: a reconcile can compare it before a
    /// write phase to notice a takeover.
    pub epochs: BTreeMap<u32, i32>,
    /// Every shard's Lease after the round (as read, with this round's successful writes).
    pub records: BTreeMap<u32, ShardLeaseRecord>,
}

/// One round for replica `me` (only the list of shard Leases failing is an error; a failed
/// write is reported in [`Round::failed`]): the desired owners come from `desired` (index = shard, from the
/// assignment over the live members); `is_dead(m)` says whether member m is known to be dead
/// (only then are its shards taken over); `may_release(k)` says whether shard k has drained (no
/// work in flight), so a shard is only released once it is quiet.
pub async fn sync_shards(
    leases: &Api<Lease>,
    fleet: &str,
    me: &str,
    shards: ShardCount,
    mut is_dead: impl FnMut(&str) -> bool,
    desired: &[String],
    may_release: impl Fn(u32) -> bool,
) -> Result<Round, KubeError> {
    let selector = format!("{FLEET_LABEL}={fleet},{LEASE_KIND_LABEL}=shard");
    let existing: BTreeMap<String, Lease> = leases
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .map(|l| (l.name_any(), l))
        .collect();
    let mut round = Round::default();
    for shard in 0..shards.get() {
        let name = lease_name(fleet, shard);
        let lease = existing.get(&name);
        let record = lease.map(record_of);
        let state = shard_state(record.as_ref(), &mut is_dead);
        let epoch = record.as_ref().map_or(0, |r| r.epoch);
        let desired_owner = desired.get(shard as usize).map(String::as_str);
        let action = decide(me, desired_owner, &state);
        round.records.insert(shard, record.unwrap_or_default());
        let result = match action {
            ShardAction::Keep | ShardAction::WaitForRelease => {
                if state == ShardState::Owned(me.to_owned()) {
                    round.hold(shard, epoch);
                }
                continue;
            }
            ShardAction::Acquire => set_holder(leases, fleet, &name, lease, Some(me))
                .await
                .map(|()| round.acquired_now(shard, epoch, &state, lease, me)),
            ShardAction::Release if may_release(shard) => {
                set_holder(leases, fleet, &name, lease, None)
                    .await
                    .map(|()| round.released_now(shard, epoch))
            }
            ShardAction::Release => {
                round.drain(shard, epoch);
                continue;
            }
        };
        if let Err(e) = result {
            round.write_failed(shard, epoch, action, e);
        }
    }
    Ok(round)
}

impl Round {
    /// Shard `shard` stays ours at `epoch`.
    fn hold(&mut self, shard: u32, epoch: i32) {
        self.owned.insert(shard);
        self.epochs.insert(shard, epoch);
    }

    /// Shard `shard` stays ours at `epoch` but is not wanted here: it drains.
    fn drain(&mut self, shard: u32, epoch: i32) {
        self.hold(shard, epoch);
        self.draining.insert(shard);
    }

    /// This replica wrote itself as the holder of `shard`, whose Lease was at `epoch` in
    /// `state`.
    fn acquired_now(
        &mut self,
        shard: u32,
        epoch: i32,
        state: &ShardState,
        lease: Option<&Lease>,
        me: &str,
    ) {
        match state {
            ShardState::Orphaned(from) => {
                tracing::info!(shard, epoch = epoch + 1, from = %from, "shard acquired (takeover)");
                self.takeovers.insert(shard);
            }
            _ => {
                tracing::info!(shard, epoch = epoch + 1, "shard acquired");
                if let Some(gap) = lease.and_then(released_for) {
                    self.handover_gaps.insert(shard, gap);
                }
            }
        }
        self.hold(shard, epoch + 1);
        self.acquired.insert(shard);
        self.records.insert(shard, written(Some(me), epoch));
    }

    /// This replica released `shard`, whose Lease was at `epoch`.
    fn released_now(&mut self, shard: u32, epoch: i32) {
        tracing::info!(shard, epoch = epoch + 1, "shard released");
        self.released.insert(shard);
        self.records.insert(shard, written(None, epoch));
    }

    /// The write of `action` on `shard` failed: a conflict, or another error (a release that
    /// failed leaves the shard ours, and draining).
    fn write_failed(&mut self, shard: u32, epoch: i32, action: ShardAction, error: KubeError) {
        match error {
            KubeError::Api(status) if status.code == 409 => {
                self.conflicts.insert(shard);
            }
            e => {
                // Keep going: the round's other decisions stand and are reported. A release
                // that failed leaves the shard ours (and draining).
                tracing::warn!(shard, "write shard lease: {e}");
                self.failed.insert(shard);
                if action == ShardAction::Release {
                    self.drain(shard, epoch);
                }
            }
        }
    }
}

/// The record this round writes over a Lease at `epoch`.
fn written(holder: Option<&str>, epoch: i32) -> ShardLeaseRecord {
    ShardLeaseRecord {
        holder: holder.map(str::to_owned),
        epoch: epoch + 1,
    }
}

/// How long ago a released shard's Lease was released (`None` for a Lease that was never held,
/// or a release time ahead of this clock).
fn released_for(lease: &Lease) -> Option<Duration> {
    let spec = lease.spec.as_ref()?;
    if spec
        .holder_identity
        .as_deref()
        .is_some_and(|h| !h.is_empty())
        || spec.acquire_time.is_none()
    {
        return None;
    }
    let released = spec.renew_time.as_ref()?;
    Duration::try_from(Timestamp::now().duration_since(released.0)).ok()
}

fn record_of(lease: &Lease) -> ShardLeaseRecord {
    let spec = lease.spec.clone().unwrap_or_default();
    ShardLeaseRecord {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        epoch: spec.lease_transitions.unwrap_or(0),
    }
}

/// Sets the holder of a shard Lease by compare-and-swap: creates the Lease when none was read (409 if someone
/// else created it meanwhile), else replaces it guarded by the resourceVersion read (409 if it
/// changed meanwhile). A change of holder bumps `leaseTransitions` (the shard's epoch).
pub async fn set_holder(
    leases: &Api<Lease>,
    fleet: &str,
    name: &str,
    read: Option<&Lease>,
    holder: Option<&str>,
) -> Result<(), KubeError> {
    let mut lease = read.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                [
                    (FLEET_LABEL.to_owned(), fleet.to_owned()),
                    (LEASE_KIND_LABEL.to_owned(), "shard".to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    });
    let mut spec = lease.spec.take().unwrap_or_default();
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    spec.holder_identity = holder.map(str::to_owned);
    let now = MicroTime(Timestamp::now());
    if holder.is_some() {
        spec.acquire_time = Some(now.clone());
    }
    spec.renew_time = Some(now);
    lease.spec = Some(spec);
    match read {
        None => leases
            .create(&PostParams::default(), &lease)
            .await
            .map(|_| ()),
        // `lease` still carries the resourceVersion that was read: the server refuses the
        // replace with 409 if the Lease changed since.
        Some(_) => leases
            .replace(name, &PostParams::default(), &lease)
            .await
            .map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_and_records() {
        assert_eq!(lease_name("core", 17), "core-shard-17");
        let lease = Lease {
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some(String::new()),
                lease_transitions: Some(4),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            record_of(&lease),
            ShardLeaseRecord {
                holder: None,
                epoch: 4
            },
            "an empty holder is no holder"
        );
    }
}
