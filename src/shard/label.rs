//! The shard label: which shard a label value names, what a Manifest's label says against its
//! UID's shard, which replica must act on it, and the selector of the watch for labels naming
//! no shard.
//!
//! A label is only an index for the watches: the UID decides the shard. A label can still be
//! wrong — a `kubectl get -o yaml` copy or a backup restored under a new UID keeps the old one,
//! a user edits it — and a wrong label hides the Manifest from its owner's watch. The rules
//! below give every such Manifest exactly one replica that acts on it (docs/sharding.md,
//! "The shard label").

use std::collections::BTreeSet;

use super::{SHARD_LABEL, ShardCount};
use crate::apply::MANIFEST_SHARD_LABEL;
use crate::apply::watched::Selected;

/// Above this many shards the stray watch cannot list every valid value (the selector would be
/// too long for a request): it selects unlabelled Manifests only (docs/sharding.md, limits).
pub const MAX_STRAY_SELECTOR_SHARDS: u32 = 1024;

/// What a Manifest's shard label says, against the shard of its UID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelState {
    /// The label names the UID's shard.
    Correct,
    /// No label yet (a new Manifest): the UID's owner stamps it in its first pass.
    Missing,
    /// The label names another shard: that shard's owner sees the Manifest and relabels it.
    Wrong(u32),
    /// The label names no shard (not a canonical decimal number below the shard count): only
    /// the stray watch sees it, and the UID's owner relabels it in its pass.
    Invalid,
}

/// The shard a label value names: a canonical decimal number (no sign, no leading zero) below
/// the shard count. `"007"` names nothing: the watch selector `in (7)` would not match it.
pub fn label_shard(value: &str, shards: ShardCount) -> Option<u32> {
    let canonical = !value.is_empty()
        && value.bytes().all(|b| b.is_ascii_digit())
        && (value == "0" || !value.starts_with('0'));
    let shard: u32 = value.parse().ok().filter(|_| canonical)?;
    (shard < shards.get()).then_some(shard)
}

/// What `label` says of a Manifest whose UID is in `uid_shard`.
pub fn label_state(label: Option<&str>, uid_shard: u32, shards: ShardCount) -> LabelState {
    let Some(value) = label else {
        return LabelState::Missing;
    };
    match label_shard(value, shards) {
        Some(shard) if shard == uid_shard => LabelState::Correct,
        Some(shard) => LabelState::Wrong(shard),
        None => LabelState::Invalid,
    }
}

/// What a replica does with a Manifest it sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Reconcile it: the replica owns its UID's shard (a pass also corrects the label).
    Reconcile(u32),
    /// Relabel it to its UID's shard: the replica owns the (wrong) shard its label names, and
    /// is the only replica whose watch sees it.
    Relabel(u32),
}

impl Route {
    /// The shard the replica acts under (its fence, its queue key).
    pub fn shard(self) -> u32 {
        match self {
            Self::Reconcile(shard) | Self::Relabel(shard) => shard,
        }
    }
}

/// What the replica that `wants` some shards does with a Manifest of `uid_shard` whose label
/// says `state`; `None`: another replica acts on it. Exactly one replica acts on every
/// Manifest: the UID's owner, or — when the label names another shard, whose owner alone sees
/// it — that shard's owner, once.
pub fn route(state: LabelState, uid_shard: u32, wants: impl Fn(u32) -> bool) -> Option<Route> {
    if wants(uid_shard) {
        return Some(Route::Reconcile(uid_shard));
    }
    match state {
        LabelState::Wrong(named) if wants(named) => Some(Route::Relabel(named)),
        _ => None,
    }
}

/// Above this many owned shards a watch of the owned shards selects every labelled object and
/// filters locally (a label selector with thousands of values would make an oversized request).
const MAX_SELECTOR_SHARDS: usize = 1024;

/// The label selector of a watch of the objects whose label `key` names one of `shards` (the
/// owned ones; `None`: every shard), joined to `base`; `None` when there is nothing to watch.
/// The shard watch of Manifests (`key` [`SHARD_LABEL`]) and the object watches behind cheap
/// drift passes (`modulemanager.io/manifest-shard`) select with it.
pub fn owned_selector(
    key: &str,
    base: Option<&str>,
    shards: Option<&BTreeSet<u32>>,
) -> Option<String> {
    let shard_part = match shards {
        Some(set) if set.is_empty() => return None,
        Some(set) if set.len() <= MAX_SELECTOR_SHARDS => {
            let values: Vec<String> = set.iter().map(u32::to_string).collect();
            format!("{key} in ({})", values.join(","))
        }
        _ => key.to_owned(),
    };
    Some(match base {
        Some(base) => format!("{base},{shard_part}"),
        None => shard_part,
    })
}

/// What the object watches behind cheap drift passes select when `shards` are owned (`None`:
/// every shard): the objects stamped with one of them ([`MANIFEST_SHARD_LABEL`]).
pub fn owned_objects(shards: Option<BTreeSet<u32>>) -> Selected {
    Selected {
        selector: owned_selector(MANIFEST_SHARD_LABEL, None, shards.as_ref()),
        shards,
    }
}

/// The selector of the watch every replica runs for the Manifests no shard watch sees:
/// unlabelled ones and labels naming no shard (`notin` also matches a missing label), joined to
/// the `--manifest-selector` `base`. Above [`MAX_STRAY_SELECTOR_SHARDS`] shards: unlabelled only.
pub fn stray_selector(base: Option<&str>, shards: ShardCount) -> String {
    let stray = if shards.get() <= MAX_STRAY_SELECTOR_SHARDS {
        let values: Vec<String> = (0..shards.get()).map(|k| k.to_string()).collect();
        format!("{SHARD_LABEL} notin ({})", values.join(","))
    } else {
        format!("!{SHARD_LABEL}")
    };
    match base {
        Some(base) => format!("{base},{stray}"),
        None => stray,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(n: u32) -> ShardCount {
        ShardCount::new(n).unwrap()
    }

    #[test]
    fn only_a_canonical_number_below_the_count_names_a_shard() {
        let s = count(64);
        assert_eq!(label_shard("0", s), Some(0));
        assert_eq!(label_shard("63", s), Some(63));
        for bad in [
            "64",
            "1000",
            "007",
            "00",
            "-1",
            "+3",
            " 3",
            "3 ",
            "",
            "x",
            "4294967296",
        ] {
            assert_eq!(label_shard(bad, s), None, "{bad:?}");
        }
    }

    #[test]
    fn the_label_is_judged_against_the_uid_shard() {
        let s = count(64);
        assert_eq!(label_state(None, 5, s), LabelState::Missing);
        assert_eq!(label_state(Some("5"), 5, s), LabelState::Correct);
        assert_eq!(label_state(Some("9"), 5, s), LabelState::Wrong(9));
        assert_eq!(label_state(Some("05"), 5, s), LabelState::Invalid);
        assert_eq!(label_state(Some("64"), 5, s), LabelState::Invalid);
        assert_eq!(label_state(Some("five"), 5, s), LabelState::Invalid);
    }

    /// Over every split of shards {uid shard, label shard, another} between three replicas and
    /// every label state, exactly one replica acts on the Manifest, and the one that reconciles
    /// owns the UID's shard.
    #[test]
    fn exactly_one_replica_acts_on_every_manifest() {
        let (uid_shard, other) = (1, 2);
        let states = [
            LabelState::Correct,
            LabelState::Missing,
            LabelState::Invalid,
            LabelState::Wrong(other),
        ];
        // owners[k] = which of the three replicas owns shard k.
        for owners in (0..27).map(|n| [n % 3, n / 3 % 3, n / 9]) {
            for state in states {
                let acting: Vec<(usize, Route)> = (0..3)
                    .filter_map(|replica| {
                        let wants = |shard: u32| owners[shard as usize] == replica;
                        // A replica sees a Manifest through its shard watch only when it owns
                        // the shard the label names; the stray watch shows the rest to all.
                        let sees = match state {
                            LabelState::Correct => wants(uid_shard),
                            LabelState::Wrong(named) => wants(named),
                            LabelState::Missing | LabelState::Invalid => true,
                        };
                        let routed = route(state, uid_shard, wants).filter(|_| sees)?;
                        Some((replica, routed))
                    })
                    .collect();
                let uid_owner = owners[uid_shard as usize];
                match state {
                    // Seen only by the label's owner: it reconciles when it also owns the
                    // UID's shard, else relabels (then the UID's owner sees it).
                    LabelState::Wrong(named) if owners[named as usize] != uid_owner => {
                        assert_eq!(acting, [(owners[named as usize], Route::Relabel(named))]);
                    }
                    _ => assert_eq!(acting, [(uid_owner, Route::Reconcile(uid_shard))]),
                }
            }
        }
    }

    #[test]
    fn the_stray_watch_selects_missing_and_nameless_labels() {
        assert_eq!(
            stray_selector(None, count(4)),
            "modulemanager.io/shard notin (0,1,2,3)"
        );
        assert_eq!(
            stray_selector(Some("team=a"), count(2)),
            "team=a,modulemanager.io/shard notin (0,1)"
        );
        assert!(stray_selector(None, count(1024)).ends_with(",1023)"));
        assert_eq!(stray_selector(None, count(2048)), "!modulemanager.io/shard");
    }

    #[test]
    fn the_shard_watch_selects_the_owned_shards() {
        let set = |v: &[u32]| v.iter().copied().collect::<BTreeSet<u32>>();
        assert_eq!(owned_selector(SHARD_LABEL, None, Some(&set(&[]))), None);
        assert_eq!(
            owned_selector(SHARD_LABEL, None, Some(&set(&[3, 1]))).as_deref(),
            Some("modulemanager.io/shard in (1,3)")
        );
        assert_eq!(
            owned_selector(SHARD_LABEL, Some("team=a"), None).as_deref(),
            Some("team=a,modulemanager.io/shard")
        );
        let many: BTreeSet<u32> = (0..2000).collect();
        assert_eq!(
            owned_selector(SHARD_LABEL, None, Some(&many)).as_deref(),
            Some("modulemanager.io/shard"),
            "too many values: select all labelled, filter locally"
        );
    }
}
