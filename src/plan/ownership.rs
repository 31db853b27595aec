//! Ownership: the precondition every apply of a module's object carries, and what a pass does
//! when the API server refuses it — create the object again, take over one of its own, or
//! refuse — decided from the inventory's record and the live object (docs/reconcile.md,
//! "Adoption and ownership").

use crate::api::InventoryEntry;

/// The precondition a server-side apply of a module's object carries, so that the API server,
/// not a read before the write, decides whose object it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guard {
    /// Only an object that does not exist passes: the apply creates it, and an object of the
    /// same name makes it fail instead of being taken over (`metadata.resourceVersion` set to
    /// [`ABSENT_RESOURCE_VERSION`], which no stored object has).
    Absent,
    /// Only the object with this UID passes (the one the inventory recorded): one deleted and
    /// created again by someone else has another UID and is not written.
    Uid(String),
    /// Only the object with this UID, unchanged since it was read at `resource_version`: an
    /// object of this Manifest that the inventory holds no UID of yet, taken over.
    Read {
        /// Its UID.
        uid: String,
        /// Its resourceVersion when it was read.
        resource_version: String,
    },
}

/// The resourceVersion an apply under [`Guard::Absent`] carries. The API server ignores a
/// resourceVersion when the apply creates the object, and refuses the apply (409) when the
/// stored object has another one. etcd counts revisions from 1 and its first write is revision 2,
/// so no stored object has resourceVersion 1 (verified on kube-apiserver 1.36 by
/// `tests/ownership.rs`).
pub const ABSENT_RESOURCE_VERSION: &str = "1";

/// The guard of a pass's first apply of an object: the recorded UID when the inventory holds
/// one, else [`Guard::Absent`] (new to the inventory, or recorded before its first apply
/// answered: a claim to confirm).
pub fn first_guard(recorded_uid: Option<&str>) -> Guard {
    match recorded_uid {
        Some(uid) => Guard::Uid(uid.to_owned()),
        None => Guard::Absent,
    }
}

/// The live object as far as ownership goes.
#[derive(Clone, Copy, Debug)]
pub struct Live<'a> {
    /// Its UID.
    pub uid: &'a str,
    /// Its resourceVersion.
    pub resource_version: &'a str,
    /// The Manifest UID its `modulemanager.io/manifest-uid` label names, if any.
    pub owner: Option<&'a str>,
}

/// What to do after the API server refused the first guarded apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Apply again under this guard: [`Guard::Absent`] when the object is gone (drift repair:
    /// it is created again), [`Guard::Read`] to take over an object of this Manifest.
    Apply(Guard),
    /// The object is someone else's (another Manifest's, `owner`, or nobody's): refused.
    NotOwned {
        /// The Manifest UID its label names, if any.
        owner: Option<String>,
    },
    /// The object the inventory recorded was deleted and another one created under its name:
    /// neither written nor deleted.
    Replaced {
        /// The Manifest UID its label names, if any.
        owner: Option<String>,
    },
}

/// Which objects a pass may take over besides those labelled as this Manifest's
/// (`spec.adopt`, docs/reconcile.md § Adoption and ownership).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// Not asked for (the default): only objects labelled as this Manifest's.
    Off,
    /// `spec.adopt`: also objects no Manifest labelled; one labelled as another Manifest's is
    /// refused until that Manifest is known to be gone ([`Adoption::OwnerGone`]).
    On,
    /// `spec.adopt`, and the Manifest the live object's label names was looked up and no
    /// longer exists: its objects may be taken over too.
    OwnerGone,
}

/// Decides from the recorded UID (if any), the live object (`None`: it does not exist),
/// this Manifest's UID and what it may adopt. Without `spec.adopt` only an object labelled as
/// this Manifest's is taken over, as Helm installs over no object it does not own; with it,
/// also an unlabelled one and — once its owner is known to be gone — one labelled as another
/// Manifest's. An object the inventory recorded under another UID is never taken over.
pub fn decide(
    recorded_uid: Option<&str>,
    live: Option<Live<'_>>,
    manifest_uid: &str,
    adoption: Adoption,
) -> Decision {
    let Some(live) = live else {
        return Decision::Apply(Guard::Absent);
    };
    let owner = live.owner.map(str::to_owned);
    let take = || {
        Decision::Apply(Guard::Read {
            uid: live.uid.to_owned(),
            resource_version: live.resource_version.to_owned(),
        })
    };
    match (recorded_uid, live.owner) {
        (Some(recorded), _) if recorded == live.uid => {
            Decision::Apply(Guard::Uid(recorded.to_owned()))
        }
        (Some(_), _) => Decision::Replaced { owner },
        (None, Some(owner)) if owner == manifest_uid => take(),
        (None, None) if adoption != Adoption::Off => take(),
        (None, Some(_)) if adoption == Adoption::OwnerGone => take(),
        (None, _) => Decision::NotOwned { owner },
    }
}

/// The key of an object in `status.inventoryUids`: `Kind.group/namespace/name` (`Kind` alone
/// in the core group, no namespace part for cluster-scoped objects). Without the version: an
/// object a chart moves to another version of its kind is the same object.
pub fn uid_key(id: &InventoryEntry) -> String {
    let kind = if id.group.is_empty() {
        id.kind.clone()
    } else {
        format!("{}.{}", id.kind, id.group)
    };
    if id.namespace.is_empty() {
        format!("{kind}/{}", id.name)
    } else {
        format!("{kind}/{}/{}", id.namespace, id.name)
    }
}

/// What a pass does about the target cluster's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetCheck {
    /// The recorded cluster, or none recorded and none readable: go on.
    Same,
    /// First contact: go on and record it.
    Record(String),
    /// Another cluster than the recorded one: refused, nothing is written there.
    Other {
        /// The recorded identity.
        recorded: String,
        /// The one found now.
        found: String,
    },
    /// An identity was recorded and cannot be read now: refused (it cannot be told from
    /// another cluster).
    Unconfirmed {
        /// The recorded identity.
        recorded: String,
    },
}

/// Compares the identity `status.targetIdentity` recorded with the one read now. While
/// `nothing_applied` (no inventory, no hook objects: a first kubeconfig that named the wrong
/// cluster, passes that failed before any apply), there is nothing on the recorded cluster to
/// protect, and another identity is recorded instead of refused.
pub fn check_target(
    recorded: Option<&str>,
    found: Option<&str>,
    nothing_applied: bool,
) -> TargetCheck {
    match (recorded, found) {
        (None, None) => TargetCheck::Same,
        (None, Some(found)) => TargetCheck::Record(found.to_owned()),
        (Some(recorded), Some(found)) if recorded != found && nothing_applied => {
            TargetCheck::Record(found.to_owned())
        }
        (Some(recorded), Some(found)) if recorded == found => TargetCheck::Same,
        (Some(recorded), Some(found)) => TargetCheck::Other {
            recorded: recorded.to_owned(),
            found: found.to_owned(),
        },
        (Some(recorded), None) => TargetCheck::Unconfirmed {
            recorded: recorded.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINE: &str = "manifest-a";
    const OTHER: &str = "manifest-b";

    fn live<'a>(uid: &'a str, owner: Option<&'a str>) -> Live<'a> {
        Live {
            uid,
            resource_version: "42",
            owner,
        }
    }

    #[test]
    fn a_recorded_object_is_applied_under_its_uid_a_new_one_only_if_absent() {
        assert_eq!(first_guard(Some("u1")), Guard::Uid("u1".into()));
        assert_eq!(first_guard(None), Guard::Absent);
    }

    #[test]
    fn an_object_that_is_gone_is_created_again() {
        assert_eq!(
            decide(Some("u1"), None, MINE, Adoption::Off),
            Decision::Apply(Guard::Absent)
        );
        assert_eq!(
            decide(None, None, MINE, Adoption::Off),
            Decision::Apply(Guard::Absent)
        );
    }

    #[test]
    fn an_object_recreated_by_someone_else_is_replaced_whatever_its_label() {
        for owner in [None, Some(OTHER), Some(MINE)] {
            assert_eq!(
                decide(Some("u1"), Some(live("u2", owner)), MINE, Adoption::Off),
                Decision::Replaced {
                    owner: owner.map(str::to_owned)
                },
                "{owner:?}"
            );
        }
        assert_eq!(
            decide(
                Some("u1"),
                Some(live("u1", Some(MINE))),
                MINE,
                Adoption::Off
            ),
            Decision::Apply(Guard::Uid("u1".into())),
            "the recorded object itself (the refusal was for another reason)"
        );
    }

    #[test]
    fn only_an_object_labelled_as_this_manifests_is_taken_over_and_only_as_read() {
        assert_eq!(
            decide(None, Some(live("u2", Some(MINE))), MINE, Adoption::Off),
            Decision::Apply(Guard::Read {
                uid: "u2".into(),
                resource_version: "42".into()
            })
        );
        assert_eq!(
            decide(None, Some(live("u2", Some(OTHER))), MINE, Adoption::Off),
            Decision::NotOwned {
                owner: Some(OTHER.into())
            }
        );
        assert_eq!(
            decide(None, Some(live("u2", None)), MINE, Adoption::Off),
            Decision::NotOwned { owner: None }
        );
    }

    #[test]
    fn adoption_takes_unlabelled_objects_and_those_of_a_manifest_gone_never_a_live_ones() {
        let read = Decision::Apply(Guard::Read {
            uid: "u2".into(),
            resource_version: "42".into(),
        });
        let unlabelled = Some(live("u2", None));
        let others = Some(live("u2", Some(OTHER)));
        assert_eq!(decide(None, unlabelled, MINE, Adoption::On), read);
        assert_eq!(decide(None, unlabelled, MINE, Adoption::OwnerGone), read);
        // Labelled as another Manifest's: only once that Manifest is known to be gone.
        assert_eq!(
            decide(None, others, MINE, Adoption::On),
            Decision::NotOwned {
                owner: Some(OTHER.into())
            }
        );
        assert_eq!(decide(None, others, MINE, Adoption::OwnerGone), read);
        // Never an object recorded under another UID, nor a new object (created as absent).
        for adoption in [Adoption::On, Adoption::OwnerGone] {
            assert_eq!(
                decide(Some("u1"), unlabelled, MINE, adoption),
                Decision::Replaced { owner: None }
            );
            assert_eq!(
                decide(None, None, MINE, adoption),
                Decision::Apply(Guard::Absent)
            );
        }
    }

    #[test]
    fn a_target_is_recorded_at_first_contact_and_another_one_refused() {
        assert_eq!(check_target(None, None, false), TargetCheck::Same);
        assert_eq!(
            check_target(None, Some("c1"), false),
            TargetCheck::Record("c1".into())
        );
        assert_eq!(
            check_target(Some("c1"), Some("c1"), false),
            TargetCheck::Same
        );
        assert_eq!(
            check_target(Some("c1"), Some("c2"), false),
            TargetCheck::Other {
                recorded: "c1".into(),
                found: "c2".into()
            }
        );
        assert_eq!(
            check_target(Some("c1"), None, false),
            TargetCheck::Unconfirmed {
                recorded: "c1".into()
            }
        );
        // Nothing applied yet: a corrected kubeconfig's cluster is recorded instead.
        assert_eq!(
            check_target(Some("c1"), Some("c2"), true),
            TargetCheck::Record("c2".into())
        );
        assert_eq!(
            check_target(Some("c1"), None, true),
            TargetCheck::Unconfirmed {
                recorded: "c1".into()
            }
        );
    }

    #[test]
    fn uid_keys_leave_out_the_version_and_tell_scopes_apart() {
        let entry = |group: &str, version: &str, kind: &str, namespace: &str| InventoryEntry {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: "n".into(),
        };
        assert_eq!(
            uid_key(&entry("", "v1", "ConfigMap", "ns")),
            "ConfigMap/ns/n"
        );
        assert_eq!(
            uid_key(&entry("autoscaling", "v1", "HorizontalPodAutoscaler", "ns")),
            uid_key(&entry("autoscaling", "v2", "HorizontalPodAutoscaler", "ns"))
        );
        assert_eq!(
            uid_key(&entry("rbac.authorization.k8s.io", "v1", "ClusterRole", "")),
            "ClusterRole.rbac.authorization.k8s.io/n"
        );
    }
}
