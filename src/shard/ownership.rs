//! Shard ownership (pure): the state of a shard from its Lease and the live members, and what
//! this replica does about it. The shard-Lease manager (compare-and-swap writes, handover) acts
//! on these decisions; keeping them pure makes the protocol's rules testable in isolation.
//!
//! A shard is owned by X while its Lease names X and X is not known to be dead. Y may acquire it
//! only when the Lease names no one or its holder is dead — positive evidence: its membership
//! Lease seen unchanged for the lease duration, not merely absent from Y's (possibly stale) view
//! of the fleet. The owner that is no longer desired releases it after draining its work.

/// A shard's Lease as read from the API server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardLeaseRecord {
    /// `spec.holderIdentity`: the replica holding the shard, if any.
    pub holder: Option<String>,
    /// `spec.leaseTransitions`: bumped at every change of holder (the shard's epoch).
    pub epoch: i32,
}

/// A shard's state as this replica sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardState {
    /// Held by a member not known to be dead.
    Owned(String),
    /// Held by no one (released, or never acquired).
    Free,
    /// Held by a member known to be dead (crashed or partitioned): it may be taken over.
    Orphaned(String),
}

/// The state of a shard from its Lease (`None`: no Lease yet); `is_dead` answers from the
/// membership observations (`membership::Liveness::is_dead`).
pub fn shard_state(
    lease: Option<&ShardLeaseRecord>,
    is_dead: impl FnOnce(&str) -> bool,
) -> ShardState {
    match lease.and_then(|l| l.holder.as_ref()) {
        None => ShardState::Free,
        Some(holder) if is_dead(holder) => ShardState::Orphaned(holder.clone()),
        Some(holder) => ShardState::Owned(holder.clone()),
    }
}

/// What this replica does about one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardAction {
    /// Nothing to change (it keeps the shard, or the shard is someone else's business).
    Keep,
    /// Take the shard (compare-and-swap on the Lease as read).
    Acquire,
    /// Stop, drain in-flight work, then release the shard (compare-and-swap).
    Release,
    /// The shard is desired here but another live member still holds it: wait for its release.
    WaitForRelease,
}

/// The decision for `me` about a shard whose desired owner (from the assignment) is `desired`.
pub fn decide(me: &str, desired: Option<&str>, state: &ShardState) -> ShardAction {
    let wanted = desired == Some(me);
    match state {
        ShardState::Owned(holder) if holder == me => {
            if wanted {
                ShardAction::Keep
            } else {
                ShardAction::Release
            }
        }
        ShardState::Owned(_) if wanted => ShardAction::WaitForRelease,
        ShardState::Free | ShardState::Orphaned(_) if wanted => ShardAction::Acquire,
        _ => ShardAction::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str) -> ShardLeaseRecord {
        ShardLeaseRecord {
            holder: Some(holder.into()),
            epoch: 3,
        }
    }

    #[test]
    fn the_state_follows_positive_evidence_of_death() {
        let is_dead = |m: &str| m == "c";
        assert_eq!(shard_state(None, is_dead), ShardState::Free);
        assert_eq!(
            shard_state(Some(&ShardLeaseRecord::default()), is_dead),
            ShardState::Free
        );
        assert_eq!(
            shard_state(Some(&held_by("a")), is_dead),
            ShardState::Owned("a".into())
        );
        assert_eq!(
            shard_state(Some(&held_by("c")), is_dead),
            ShardState::Orphaned("c".into())
        );
        // A holder this replica has never heard of is not dead: it may just have joined.
        assert_eq!(
            shard_state(Some(&held_by("newcomer")), is_dead),
            ShardState::Owned("newcomer".into())
        );
    }

    #[test]
    fn only_the_desired_owner_acquires_and_only_a_free_or_orphaned_shard() {
        use ShardAction::*;
        let owned_by = |h: &str| ShardState::Owned(h.into());
        // (me, desired, state) -> action
        let cases = [
            ("a", Some("a"), owned_by("a"), Keep),
            ("a", Some("b"), owned_by("a"), Release),
            ("a", None, owned_by("a"), Release),
            ("a", Some("a"), owned_by("b"), WaitForRelease),
            ("a", Some("a"), ShardState::Free, Acquire),
            ("a", Some("a"), ShardState::Orphaned("c".into()), Acquire),
            ("a", Some("b"), ShardState::Free, Keep),
            ("a", Some("b"), ShardState::Orphaned("c".into()), Keep),
            ("a", Some("b"), owned_by("b"), Keep),
        ];
        for (me, desired, state, action) in cases {
            assert_eq!(
                decide(me, desired, &state),
                action,
                "{me} desired {desired:?} {state:?}"
            );
        }
    }

    /// Whatever the replicas' (possibly different) views of the desired owner, none of them
    /// decides to acquire a shard whose holder it does not know to be dead.
    #[test]
    fn a_holder_not_known_dead_never_loses_a_shard_to_an_acquire() {
        let members = ["a", "b", "c"];
        for holder in members {
            let state = shard_state(Some(&held_by(holder)), |_| false);
            for me in members {
                for desired in members.iter().map(|d| Some(*d)).chain([None]) {
                    assert_ne!(
                        decide(me, desired, &state),
                        ShardAction::Acquire,
                        "{me} would take {holder}'s shard"
                    );
                }
            }
        }
    }
}
