//! The `shardSelector` of a set of shards, for the API server's sharded list and watch
//! (KEP-5866, alpha in Kubernetes 1.36 behind the feature gate `ShardedListAndWatch`).
//!
//! The server hashes `metadata.uid` with FNV-1a-64 — our shard function (`hash.rs`) — and keeps
//! the objects whose hash lies in one of the selector's half-open ranges `[start, end)`, written
//! as 16 lowercase hex digits after `0x` (the end may be `0x10000000000000000`, 2^64). Shard `k`
//! of `S = 2^b` is the top `b` bits of the hash, so it is the range
//! `[k · 2^(64-b), (k+1) · 2^(64-b))`, and adjacent shards merge into one range
//! (docs/sharding.md, "Server-side sharded watches").

use std::collections::BTreeSet;

use super::ShardCount;

/// Most ranges one selector holds: the server parses it as CEL, whose parser refuses an
/// expression above 100,000 code points, and each range takes 75 (`shardRange(…)||`). Above,
/// the watch asks for every Manifest and filters locally, as the label path does above 1,024
/// shards.
pub const MAX_SELECTOR_RANGES: usize = 1024;

/// A half-open range `[start, end)` of 64-bit hashes; `end` may be 2^64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashRange {
    /// The first hash in the range.
    pub start: u64,
    /// The first hash after it (2^64 for the last range).
    pub end: u128,
}

/// The hash ranges of `shards` (each below `count`), adjacent shards merged, in order.
pub fn hash_ranges(shards: &BTreeSet<u32>, count: ShardCount) -> Vec<HashRange> {
    let width: u128 = (1u128 << 64) >> count.get().trailing_zeros();
    let mut ranges: Vec<HashRange> = Vec::new();
    for &shard in shards.iter().filter(|&&shard| shard < count.get()) {
        let start = u128::from(shard) * width;
        match ranges.last_mut() {
            Some(last) if last.end == start => last.end = start + width,
            _ => ranges.push(HashRange {
                // Below 2^64: the shard is below the count.
                start: start as u64,
                end: start + width,
            }),
        }
    }
    ranges
}

/// What one shard watch asks the server for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerSelection {
    /// Nothing is owned: no watch.
    Nothing,
    /// Every Manifest (every shard owned, or too many ranges: filtered locally); no parameter.
    Everything,
    /// The `shardSelector` of the owned shards.
    Ranges(String),
}

/// What the shard watch of `shards` (`None`: every shard) asks for.
pub fn server_selection(shards: Option<&BTreeSet<u32>>, count: ShardCount) -> ServerSelection {
    let Some(shards) = shards else {
        return ServerSelection::Everything;
    };
    let ranges = hash_ranges(shards, count);
    let everything = [HashRange {
        start: 0,
        end: 1 << 64,
    }];
    if ranges.is_empty() {
        ServerSelection::Nothing
    } else if ranges == everything || ranges.len() > MAX_SELECTOR_RANGES {
        ServerSelection::Everything
    } else {
        ServerSelection::Ranges(selector(&ranges))
    }
}

/// The `shardSelector` of `ranges`: `shardRange(object.metadata.uid,'0x…','0x…')`, joined by
/// `||`.
pub fn selector(ranges: &[HashRange]) -> String {
    let parts: Vec<String> = ranges
        .iter()
        .map(|range| {
            format!(
                "shardRange(object.metadata.uid,'0x{:016x}','0x{:016x}')",
                range.start, range.end
            )
        })
        .collect();
    parts.join("||")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::hash::fnv1a64;

    fn set(shards: impl IntoIterator<Item = u32>) -> BTreeSet<u32> {
        shards.into_iter().collect()
    }

    #[test]
    fn the_examples_of_the_kubernetes_api_documentation() {
        // ListOptions.shardSelector's comment (apimachinery v0.36.3 meta/v1/types.go): the
        // 2- and 4-shard splits, exactly.
        let two = ShardCount::new(2).unwrap();
        assert_eq!(
            server_selection(Some(&set([0])), two),
            ServerSelection::Ranges(
                "shardRange(object.metadata.uid,'0x0000000000000000','0x8000000000000000')".into()
            )
        );
        assert_eq!(
            server_selection(Some(&set([1])), two),
            ServerSelection::Ranges(
                "shardRange(object.metadata.uid,'0x8000000000000000','0x10000000000000000')".into()
            )
        );
        let four = ShardCount::new(4).unwrap();
        assert_eq!(
            server_selection(Some(&set([2])), four),
            ServerSelection::Ranges(
                "shardRange(object.metadata.uid,'0x8000000000000000','0xc000000000000000')".into()
            )
        );
    }

    #[test]
    fn adjacent_shards_merge_and_the_rest_stay_apart() {
        let s = ShardCount::new(8).unwrap();
        let ranges = hash_ranges(&set([0, 1, 2, 5, 7]), s);
        let at = |k: u128| k << 61;
        assert_eq!(
            ranges,
            vec![
                HashRange {
                    start: 0,
                    end: at(3)
                },
                HashRange {
                    start: at(5) as u64,
                    end: at(6)
                },
                HashRange {
                    start: at(7) as u64,
                    end: 1 << 64
                },
            ]
        );
        assert_eq!(
            server_selection(Some(&set(0..8)), s),
            ServerSelection::Everything,
            "every shard: no parameter"
        );
        assert_eq!(
            server_selection(Some(&set([])), s),
            ServerSelection::Nothing
        );
        assert_eq!(server_selection(None, s), ServerSelection::Everything);
        let one = ShardCount::new(1).unwrap();
        assert_eq!(
            server_selection(Some(&set([0])), one),
            ServerSelection::Everything
        );
    }

    #[test]
    fn too_many_ranges_ask_for_everything() {
        let s = ShardCount::new(1 << 16).unwrap();
        let every_other: BTreeSet<u32> = (0..1 << 16).step_by(2).collect();
        assert_eq!(hash_ranges(&every_other, s).len(), 1 << 15);
        assert_eq!(
            server_selection(Some(&every_other), s),
            ServerSelection::Everything
        );
        let few: BTreeSet<u32> = (0..2 * MAX_SELECTOR_RANGES as u32).step_by(2).collect();
        let ServerSelection::Ranges(selector) = server_selection(Some(&few), s) else {
            panic!("{MAX_SELECTOR_RANGES} ranges fit")
        };
        assert!(selector.chars().count() < 100_000, "{}", selector.len());
    }

    /// The server's match (apimachinery v0.36.3 `pkg/sharding/selector.go`,
    /// `shardSelector.Matches` and `HexLess`): `"0x" + %016x` of the hash compared as strings,
    /// a longer string being larger.
    fn server_matches(selector: &str, uid: &str) -> bool {
        let hash = format!("0x{:016x}", fnv1a64(uid.as_bytes()));
        let less = |a: &str, b: &str| (a.len(), a) < (b.len(), b);
        selector.split("||").any(|part| {
            let bounds: Vec<&str> = part.split('\'').collect();
            let (start, end) = (bounds[1], bounds[3]);
            !less(&hash, start) && less(&hash, end)
        })
    }

    #[test]
    fn the_server_selects_exactly_the_uids_of_the_owned_shards() {
        for count in [1, 2, 4, 64, 256, 1024] {
            let s = ShardCount::new(count).unwrap();
            // Every third shard, and a contiguous block: gaps and merged ranges.
            let owned: BTreeSet<u32> = (0..count)
                .filter(|k| k % 3 == 1 || (count / 4..count / 2).contains(k))
                .collect();
            let ServerSelection::Ranges(selector) = server_selection(Some(&owned), s) else {
                let all_or_none = owned.is_empty() || owned.len() as u32 == count;
                assert!(all_or_none, "S = {count}: no selector for {owned:?}");
                continue;
            };
            for i in 0..4000u32 {
                let uid = format!(
                    "{:08x}-0000-4000-8000-{:012x}",
                    i.wrapping_mul(2_654_435_761),
                    i
                );
                assert_eq!(
                    server_matches(&selector, &uid),
                    owned.contains(&s.shard_of(&uid)),
                    "S = {count}, {uid}"
                );
            }
        }
    }
}
