//! What a Manifest's status keeps of module-manager's apply records on a remote target
//! (`status.appliedStamps`, pure), so that a replica that starts, or takes the Manifest over, can
//! tell from one listing that an object is as the last apply left it, instead of applying every
//! object again (docs/reconcile.md, "After a restart").
//!
//! A record ([`Stamp`] and the digest of the body sent) lives in one process's memory. Its
//! *stamp* here is a short digest of what the record proves: the object's UID and the body sent,
//! and — for the kinds whose generation follows their spec
//! ([`generation_follows_spec`]) — the generation and module-manager's owned fields, else the
//! resourceVersion. A listing that finds the object with the same UID and version (or
//! generation and owned fields) and a body to send that is the same gives the same stamp: the
//! record holds again, whoever made it, and it is restored. Anything else — another version, a
//! new render, an object not listed, a stamp never written — gives another digest or none, and
//! the object is applied as before: a mistake costs an apply, never a missed repair.

use std::collections::BTreeMap;

use super::ownership::uid_key;
use super::unchanged::{Body, Found, Kind, Stamp, generation_follows_spec};
use crate::api::{InventoryEntry, ManifestStatus};

/// Bytes of the digest kept per object (16 hex digits): a stamp is compared for equality with
/// the one the same object's listing gives, never searched for.
const KEPT_BYTES: usize = 8;

/// The version a restored record of a workload carries: no listing finds it at that version,
/// so the object is read once ([`super::unchanged::Since::StatusOnly`]) and its readiness
/// judged on what it is now — its status may have changed while nobody looked.
pub const RESTORED_VERSION: &str = "restored";

/// The stamp of one record: the kind's object at `stamp`, applied with `body`.
pub fn stamp_of(kind: &Kind, stamp: &Stamp, body: &Body) -> String {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new();
    digest.update(stamp.uid.as_bytes());
    digest.update([0]);
    digest.update(body);
    if generation_follows_spec(kind) {
        digest.update(b"g");
        digest.update(stamp.generation.unwrap_or(-1).to_be_bytes());
        digest.update(stamp.ours.unwrap_or([0; 32]));
    } else {
        digest.update(b"v");
        digest.update(stamp.version.as_bytes());
    }
    let digest = digest.finalize();
    digest[..KEPT_BYTES]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Whether a record of this stamp can be kept: an object with a UID and a version (a workload
/// with a generation and owned fields too: what its stamp compares).
pub fn keepable(kind: &Kind, stamp: &Stamp) -> bool {
    let versioned = !stamp.version.is_empty() && !stamp.uid.is_empty();
    versioned
        && (!generation_follows_spec(kind)
            || stamp.generation.is_some_and(|g| g >= 1) && stamp.ours.is_some())
}

/// The record to restore for an object whose status keeps `kept`, found as `found` by a
/// listing, with `body` to send now: `None` unless the stamps agree. A workload's record gets
/// [`RESTORED_VERSION`], so that it is read, not taken as untouched.
pub fn restored(kind: &Kind, kept: &str, found: &Found, body: &Body) -> Option<Stamp> {
    if found.deleting || !keepable(kind, &found.stamp) || stamp_of(kind, &found.stamp, body) != kept
    {
        return None;
    }
    let mut stamp = found.stamp.clone();
    if generation_follows_spec(kind) {
        stamp.version = RESTORED_VERSION.to_owned();
    }
    Some(stamp)
}

/// The stamps a status keeps after a pass: those it had, with the pass's (`current`: a new
/// stamp, or `None` for an object applied with nothing to keep, whose old stamp goes), of the
/// objects `inventory` still holds. An old stamp kept (the object's record was lost since, say
/// by a failed status write) only ever costs a listing: it is compared, never trusted alone.
pub fn next(
    mut kept: BTreeMap<String, String>,
    current: BTreeMap<String, Option<String>>,
    inventory: &[InventoryEntry],
) -> BTreeMap<String, String> {
    for (key, stamp) in current {
        match stamp {
            Some(stamp) => kept.insert(key, stamp),
            None => kept.remove(&key),
        };
    }
    let held: std::collections::HashSet<String> = inventory.iter().map(uid_key).collect();
    kept.retain(|key, _| held.contains(key));
    kept
}

/// Whether `next` differs from the `stored` status only in stamps that moved or went: not worth
/// a write (the stamps then ride with the next one). An object whose resourceVersion others
/// move (an autoscaler's status, a custom resource's controller) gets a new stamp on each pass
/// that applies it; only a stamp for an object that had none — a first apply, the first pass
/// after an upgrade to stamps — is written on its own.
pub fn only_moved(stored: &ManifestStatus, next: &ManifestStatus) -> bool {
    let new_stamp = next
        .applied_stamps
        .keys()
        .any(|key| !stored.applied_stamps.contains_key(key));
    let rest_equal = *stored
        == ManifestStatus {
            applied_stamps: stored.applied_stamps.clone(),
            ..next.clone()
        };
    rest_equal && !new_stamp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(group: &str, kind: &str) -> Kind {
        Kind {
            group: group.into(),
            kind: kind.into(),
        }
    }

    fn stamp(version: &str, generation: i64) -> Stamp {
        Stamp {
            version: version.into(),
            uid: "u-1".into(),
            generation: Some(generation),
            ours: Some([3; 32]),
        }
    }

    fn found(stamp: Stamp) -> Found {
        Found {
            stamp,
            ..Found::default()
        }
    }

    const BODY: Body = [1; 32];

    #[test]
    fn an_object_at_the_recorded_version_and_body_is_restored() {
        let config_map = kind("", "ConfigMap");
        let kept = stamp_of(&config_map, &stamp("7", 0), &BODY);
        assert_eq!(kept.len(), 16);
        let restored = restored(&config_map, &kept, &found(stamp("7", 0)), &BODY);
        assert_eq!(restored, Some(stamp("7", 0)));
        let written = found(stamp("8", 0));
        assert_eq!(super::restored(&config_map, &kept, &written, &BODY), None);
        let other_body = super::restored(&config_map, &kept, &found(stamp("7", 0)), &[2; 32]);
        assert_eq!(other_body, None, "a new render is applied");
        let mut again = found(stamp("7", 0));
        again.stamp.uid = "u-2".into();
        assert_eq!(super::restored(&config_map, &kept, &again, &BODY), None);
        let mut deleting = found(stamp("7", 0));
        deleting.deleting = true;
        assert_eq!(super::restored(&config_map, &kept, &deleting, &BODY), None);
    }

    #[test]
    fn a_workload_is_restored_by_generation_and_owned_fields_and_then_read() {
        let deployment = kind("apps", "Deployment");
        let kept = stamp_of(&deployment, &stamp("7", 2), &BODY);
        let status_written = found(stamp("9", 2));
        let restored = restored(&deployment, &kept, &status_written, &BODY).unwrap();
        assert_eq!(
            restored.version, RESTORED_VERSION,
            "read once, not untouched"
        );
        assert_eq!(restored.generation, Some(2));
        let spec_edited = found(stamp("9", 3));
        assert_eq!(
            super::restored(&deployment, &kept, &spec_edited, &BODY),
            None
        );
        let mut taken_over = found(stamp("9", 2));
        taken_over.stamp.ours = Some([4; 32]);
        assert_eq!(
            super::restored(&deployment, &kept, &taken_over, &BODY),
            None
        );
    }

    #[test]
    fn a_pass_sets_and_drops_the_stamps_of_the_objects_still_held() {
        let entry = |name: &str| crate::plan::tests::id("ConfigMap", "ns", name);
        let key = |name: &str| uid_key(&entry(name));
        let kept = BTreeMap::from([
            (key("a"), "1".into()),
            (key("b"), "2".into()),
            (key("c"), "3".into()),
            (key("gone"), "4".into()),
        ]);
        let current = BTreeMap::from([
            (key("a"), Some("5".into())),
            (key("b"), None),
            (key("new"), Some("6".into())),
        ]);
        let inventory = ["a", "b", "c", "new"].map(entry);
        let expected = BTreeMap::from([
            (key("a"), "5".into()),
            (key("c"), "3".into()),
            (key("new"), "6".into()),
        ]);
        assert_eq!(next(kept, current, &inventory), expected);
    }

    #[test]
    fn a_stamp_that_moved_alone_is_not_written_a_new_one_is() {
        let stored = ManifestStatus {
            applied_stamps: BTreeMap::from([("a".into(), "1".into()), ("b".into(), "2".into())]),
            ..ManifestStatus::default()
        };
        let moved = ManifestStatus {
            applied_stamps: BTreeMap::from([("a".into(), "9".into())]),
            ..stored.clone()
        };
        assert!(only_moved(&stored, &moved), "moved and went");
        let new = ManifestStatus {
            applied_stamps: BTreeMap::from([("c".into(), "3".into())]),
            ..stored.clone()
        };
        assert!(
            !only_moved(&stored, &new),
            "a stamp for an object that had none"
        );
        let other = ManifestStatus {
            observed_generation: Some(2),
            ..moved
        };
        assert!(!only_moved(&stored, &other), "something else changed");
    }

    #[test]
    fn only_records_that_can_prove_something_are_kept() {
        let (config_map, deployment) = (kind("", "ConfigMap"), kind("apps", "Deployment"));
        assert!(keepable(&config_map, &stamp("7", 0)));
        assert!(!keepable(&config_map, &stamp("", 0)), "no version");
        assert!(keepable(&deployment, &stamp(RESTORED_VERSION, 1)));
        assert!(!keepable(&deployment, &stamp("7", 0)), "no generation");
        let mut not_owned = stamp("7", 1);
        not_owned.ours = None;
        assert!(!keepable(&deployment, &not_owned));
        let mut no_uid = stamp("7", 1);
        no_uid.uid.clear();
        assert!(!keepable(&deployment, &no_uid));
    }
}
