//! The shard of a Manifest: FNV-1a-64 of its UID, top bits.
//!
//! The same function as the Kubernetes API server's sharded list/watch (KEP-5866), so that a
//! range of shards can later be pushed down to the server.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits, over explicit bytes.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME)
    })
}

/// Number of virtual shards: a power of two from 1 to 65,536.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardCount(u32);

impl ShardCount {
    /// The default: 256.
    pub const DEFAULT: Self = Self(256);

    /// `count` if it is a power of two in 1..=65,536.
    pub fn new(count: u32) -> Option<Self> {
        (count.is_power_of_two() && count <= 1 << 16).then_some(Self(count))
    }

    /// The count.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The shard of a UID: the top `log2(count)` bits of `fnv1a64(uid)`.
    pub fn shard_of(self, uid: &str) -> u32 {
        let bits = self.0.trailing_zeros();
        if bits == 0 {
            return 0;
        }
        (fnv1a64(uid.as_bytes()) >> (64 - bits)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        // From the FNV reference test suite (draft-eastlake-fnv).
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn shards_of_fixed_uids_are_pinned() {
        // Cross-checked with an independent implementation (Python, hashing the UTF-8 bytes).
        let s256 = ShardCount::DEFAULT;
        let golden = [
            ("0b7a4a2c-6a4f-4d0e-9a53-3c1f6a3e2b10", 0x04),
            ("5f2c9e1a-0000-4000-8000-000000000001", 0x67),
            ("", 0xcb),
            ("a", 0xaf),
            ("foobar", 0x85),
        ];
        for (uid, shard) in golden {
            assert_eq!(s256.shard_of(uid), shard, "{uid}");
        }
        assert_eq!(ShardCount::new(1).unwrap().shard_of("anything"), 0);
        assert_eq!(
            ShardCount::new(2).unwrap().shard_of("a"),
            1,
            "0xaf… has its top bit set"
        );
        assert_eq!(ShardCount::new(65536).unwrap().shard_of("foobar"), 0x8594);
    }

    #[test]
    fn only_powers_of_two_are_shard_counts() {
        assert!(ShardCount::new(0).is_none());
        assert!(ShardCount::new(100).is_none());
        assert!(ShardCount::new(1 << 17).is_none());
        assert_eq!(ShardCount::new(1024).map(ShardCount::get), Some(1024));
    }

    #[test]
    fn uids_spread_evenly_over_the_shards() {
        let shards = ShardCount::DEFAULT;
        let mut counts = vec![0u32; 256];
        for i in 0..256_000u32 {
            let uid = format!(
                "{:08x}-{:04x}-4{:03x}-8000-{:012x}",
                i.wrapping_mul(2_654_435_761),
                i % 65536,
                i % 4096,
                i
            );
            counts[shards.shard_of(&uid) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(
            *min > 800 && *max < 1200,
            "min {min} max {max} (ideal 1000)"
        );
    }
}
