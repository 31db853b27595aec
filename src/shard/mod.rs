//! Sharding: the virtual shard of a Manifest and the assignment of shards to fleet members.

pub mod assignment;
pub mod fence;
pub mod fleet;
pub mod hash;
pub mod label;
pub mod leases;
pub mod membership;
pub mod ownership;
pub mod ranges;
pub mod server;

pub use assignment::assign;
pub use hash::ShardCount;

/// The label holding a Manifest's shard, stamped by the replica that owns the shard, so that
/// replicas can watch only their shards (`modulemanager.io/shard in (…)`).
pub const SHARD_LABEL: &str = "modulemanager.io/shard";
