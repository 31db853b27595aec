//! The labels module-manager stamps on the objects it applies: the managing Manifest's UID and,
//! on the local cluster, its shard.

/// The label on every applied object naming the Manifest (by UID) that manages it. Only objects
/// carrying it are adopted on upgrade, pruned or deleted.
pub const MANIFEST_UID_LABEL: &str = "modulemanager.io/manifest-uid";

/// The label on each object applied on the local cluster naming its Manifest's shard (not
/// `modulemanager.io/shard`, which routes Manifests: a chart may create Manifests itself).
pub const MANIFEST_SHARD_LABEL: &str = "modulemanager.io/manifest-shard";
