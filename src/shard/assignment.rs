//! Assignment (pure): which live member owns each virtual shard. Every replica computes it
//! alone from the same inputs; there is no central sharder.
//!
//! StatefulSet members (`<prefix>-<ordinal>`) get the ordinal-incremental assignment: it replays
//! the scale-ups 1 → N, each new member taking exactly its share, evenly from the others. That
//! gives the best balance (max = ceil(S/N)), a new member moves exactly floor(S/(N+1)) shards,
//! removing the highest ordinal moves only its shards, and a member missing in the middle moves
//! only its own (they go to the least-loaded live members). Members without a common prefix and
//! ordinals fall back to a consistent-hash ring (`hashring`, virtual nodes).
//! Measurements behind the choice: `shared/research/assignment.md`, `docs/sharding.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use xxhash_rust::xxh64::xxh64;

use super::hash::ShardCount;

/// Virtual nodes per member on the fallback ring.
const RING_VNODES: u32 = 256;

/// The highest ordinal the ordinal-incremental assignment accepts: its cost grows with the
/// highest ordinal, not with the number of members. A name with a larger number (say a pod of a
/// Deployment whose random suffix happens to be all digits) is not a StatefulSet ordinal.
pub const MAX_ORDINAL: u32 = 1023;

/// Splits `name` into its StatefulSet prefix and ordinal (`module-manager-12` →
/// `("module-manager", 12)`); `None` for other names and for ordinals above [`MAX_ORDINAL`].
pub fn ordinal(name: &str) -> Option<(&str, u32)> {
    let (prefix, number) = name.rsplit_once('-')?;
    if number.is_empty() || number.starts_with('+') || (number.len() > 1 && number.starts_with('0'))
    {
        return None;
    }
    let ordinal: u32 = number.parse().ok()?;
    (ordinal <= MAX_ORDINAL).then_some((prefix, ordinal))
}

/// The owner of every shard (index = shard), given the live members. Empty when no member is
/// live. Deterministic: the same members give the same answer in every process and build.
pub fn assign(shards: ShardCount, live: &BTreeSet<String>) -> Vec<String> {
    if live.is_empty() {
        return Vec::new();
    }
    let ordinals: Option<BTreeMap<u32, &str>> = live
        .iter()
        .map(|name| ordinal(name).map(|(_, o)| (o, name.as_str())))
        .collect();
    let prefixes: BTreeSet<&str> = live
        .iter()
        .filter_map(|n| ordinal(n).map(|(p, _)| p))
        .collect();
    match ordinals {
        Some(ordinals) if prefixes.len() == 1 => {
            let prefix = prefixes.into_iter().next().unwrap_or_default();
            ordinal_incremental(shards, prefix, &ordinals)
        }
        _ => ring(shards, live),
    }
}

/// The score of shard `k` for member `name`: xxh64 of explicit bytes, stable across builds.
fn score(name: &str, shard: u32) -> u64 {
    xxh64(format!("{name}/shard-{shard}").as_bytes(), 0)
}

fn ordinal_incremental(
    shards: ShardCount,
    prefix: &str,
    live: &BTreeMap<u32, &str>,
) -> Vec<String> {
    let s = shards.get() as usize;
    let members = live.keys().next_back().map_or(0, |max| *max as usize + 1);
    let name = |j: usize| format!("{prefix}-{j}");
    let mut owner = vec![0usize; s];
    let mut load = vec![0usize; members];
    load[0] = s;
    for j in 1..members {
        let (q, r) = (s / (j + 1), s % (j + 1));
        let mut quota: Vec<usize> = (0..j).map(|i| load[i] - (q + usize::from(i < r))).collect();
        let member = name(j);
        let mut order: Vec<usize> = (0..s).collect();
        order.sort_by_cached_key(|k| std::cmp::Reverse((score(&member, *k as u32), *k)));
        for k in order {
            let from = owner[k];
            if quota[from] > 0 {
                quota[from] -= 1;
                load[from] -= 1;
                owner[k] = j;
                load[j] += 1;
            }
        }
    }
    // Gap fill: shards of ordinals that are not live go to the least-loaded live member.
    for k in 0..s {
        if live.contains_key(&(owner[k] as u32)) {
            continue;
        }
        let to = live
            .keys()
            .map(|o| *o as usize)
            .min_by_key(|o| (load[*o], std::cmp::Reverse(score(&name(*o), k as u32))))
            .expect("live is not empty");
        load[owner[k]] -= 1;
        owner[k] = to;
        load[to] += 1;
    }
    owner.into_iter().map(name).collect()
}

/// A consistent-hash ring over the member names (hashring's SipHash uses fixed keys, and every
/// value hashed here writes explicit little-endian bytes, so rings agree across processes and
/// platforms).
fn ring(shards: ShardCount, live: &BTreeSet<String>) -> Vec<String> {
    let mut ring = hashring::HashRing::new();
    let vnodes = live
        .iter()
        .flat_map(|member| (0..RING_VNODES).map(move |vnode| VNode { member, vnode }));
    ring.batch_add(vnodes.collect());
    (0..shards.get())
        .map(|k| {
            ring.get(&ShardKey(k))
                .map(|v| v.member.clone())
                .unwrap_or_default()
        })
        .collect()
}

/// A virtual node of a member on the ring.
#[derive(Clone, Copy, Debug, PartialEq)]
struct VNode<'a> {
    member: &'a String,
    vnode: u32,
}

impl Hash for VNode<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.member.as_bytes());
        state.write(&self.vnode.to_le_bytes());
    }
}

/// A shard as a ring key, hashed as its little-endian bytes.
struct ShardKey(u32);

impl Hash for ShardKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    const S: ShardCount = ShardCount::DEFAULT;

    fn fleet(ordinals: impl IntoIterator<Item = u32>) -> BTreeSet<String> {
        ordinals
            .into_iter()
            .map(|o| format!("module-manager-{o}"))
            .collect()
    }

    fn moved(a: &[String], b: &[String]) -> usize {
        a.iter().zip(b).filter(|(x, y)| x != y).count()
    }

    fn max_load(assignment: &[String]) -> usize {
        let mut load = BTreeMap::new();
        for owner in assignment {
            *load.entry(owner).or_insert(0) += 1;
        }
        load.into_values().max().unwrap_or(0)
    }

    #[test]
    fn ordinals_parse_numerically() {
        assert_eq!(ordinal("module-manager-12"), Some(("module-manager", 12)));
        assert_eq!(ordinal("mm-0"), Some(("mm", 0)));
        for bad in [
            "module-manager",
            "module-manager-",
            "module-manager-01",
            "module-manager-+1",
            "x-1a",
            "nodash",
            "module-manager-1024",
            "mm-4000000000",
        ] {
            assert_eq!(ordinal(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_huge_number_in_a_name_is_not_an_ordinal() {
        // Would be 4e9 replay steps (and a 32 GB vector) if taken as an ordinal.
        let members = fleet([0, 1])
            .into_iter()
            .chain(["module-manager-4000000000".to_owned()])
            .collect();
        let assignment = assign(S, &members);
        assert_eq!(assignment.len(), 256, "answered, by the ring");
    }

    #[test]
    fn balance_is_the_best_possible_for_1_to_16_members() {
        for n in 1..=16u32 {
            let assignment = assign(S, &fleet(0..n));
            assert_eq!(assignment.len(), 256);
            assert_eq!(
                max_load(&assignment),
                256usize.div_ceil(n as usize),
                "N = {n}"
            );
        }
    }

    #[test]
    fn growing_and_shrinking_move_the_ideal_number_of_shards() {
        for n in 1..=16u32 {
            let before = assign(S, &fleet(0..n));
            let grown = assign(S, &fleet(0..n + 1));
            let ideal_grow = 256.0 / f64::from(n + 1);
            assert_eq!(
                moved(&before, &grown),
                256 / (n as usize + 1),
                "exactly the new member's share moves"
            );
            let grow = moved(&before, &grown) as f64;
            assert!(
                grow <= 1.1 * ideal_grow,
                "N {n} -> {}: moved {grow}, ideal {ideal_grow:.1}",
                n + 1
            );
            assert!(
                before
                    .iter()
                    .zip(&grown)
                    .all(|(a, b)| a == b || *b == format!("module-manager-{n}")),
                "only the new member gains shards"
            );
            if n > 1 {
                let shrunk = assign(S, &fleet(0..n - 1));
                let ideal_shrink = 256.0 / f64::from(n);
                let shrink = moved(&before, &shrunk) as f64;
                assert!(
                    shrink <= 1.1 * ideal_shrink,
                    "N {n} -> {}: moved {shrink}, ideal {ideal_shrink:.1}",
                    n - 1
                );
            }
        }
    }

    #[test]
    fn a_missing_middle_member_moves_only_its_own_shards() {
        let full = assign(S, &fleet(0..5));
        let without_2 = assign(S, &fleet([0, 1, 3, 4]));
        for (before, after) in full.iter().zip(&without_2) {
            if before != "module-manager-2" {
                assert_eq!(before, after, "a shard of a live member moved");
            } else {
                assert_ne!(after, "module-manager-2");
            }
        }
        assert!(max_load(&without_2) <= 256usize.div_ceil(4) + 1);
    }

    #[test]
    fn members_without_ordinals_use_the_ring() {
        let members: BTreeSet<String> = ["alpha", "bravo", "charlie"].map(String::from).into();
        let assignment = assign(S, &members);
        assert!(assignment.iter().all(|owner| members.contains(owner)));
        assert!(max_load(&assignment) < 256 / 3 * 2, "roughly balanced");
        // Removing one member moves only its shards.
        let fewer: BTreeSet<String> = ["alpha", "charlie"].map(String::from).into();
        let after = assign(S, &fewer);
        for (before, after) in assignment.iter().zip(&after) {
            if before != "bravo" {
                assert_eq!(before, after);
            }
        }
        assert!(assign(S, &BTreeSet::new()).is_empty());
    }

    /// Every replica must compute the same assignment, in every build: pinned by a digest of
    /// the assignments for 1…17 members (a change here is a fleet-wide reshuffle on upgrade).
    #[test]
    fn assignments_are_pinned() {
        let mut digest = Sha256::new();
        for n in 1..=17u32 {
            for owner in assign(S, &fleet(0..n)) {
                digest.update(owner.as_bytes());
                digest.update(b"\n");
            }
        }
        let ring: BTreeSet<String> = ["alpha", "bravo", "charlie"].map(String::from).into();
        for owner in assign(S, &ring) {
            digest.update(owner.as_bytes());
            digest.update(b"\n");
        }
        assert_eq!(
            format!("{:x}", digest.finalize()),
            "c5cfb415848a57d131c22f612df8f569124f45d52dc898b369c69fc2169e0431"
        );
    }
}
