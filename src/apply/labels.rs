//! How module-manager marks the objects it applies: its field manager, and the labels naming
//! the managing Manifest's UID and, on the local cluster, its shard.

/// The field manager of every write module-manager makes to a module's objects.
pub const FIELD_MANAGER: &str = "module-manager";

/// The label on every applied object naming the Manifest (by UID) that manages it. Only objects
/// carrying it are adopted on upgrade, pruned or deleted.
pub const MANIFEST_UID_LABEL: &str = "modulemanager.io/manifest-uid";

/// The label on each object applied on the local cluster naming its Manifest's shard (not
/// `modulemanager.io/shard`, which routes Manifests: a chart may create Manifests itself).
pub const MANIFEST_SHARD_LABEL: &str = "modulemanager.io/manifest-shard";
