//! Sharding: the virtual shard of a Manifest and the assignment of shards to fleet members.

pub mod assignment;
pub mod hash;

pub use assignment::assign;
pub use hash::ShardCount;
