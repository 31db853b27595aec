//! module-manager: a sharded Kubernetes operator that manages the lifecycle of Helm-chart modules.
//!
//! The binary (`src/main.rs`) is a thin command line over this library. The modules are listed in
//! dependency order: each uses only those above it (`docs/architecture.md` § The dependency rule;
//! `hack/check-layers.py`, run by `make lint`, holds the same order and fails on a violation).

/// The `Manifest` custom resource as Rust types (the CRD is generated from them).
pub mod api;

/// Logs, metrics and Events: what every other module reports through.
pub mod telemetry;

/// Chart sources: local charts, Helm repositories, OCI registries, the chart cache.
pub mod source;

/// Rendering with Helm's engine (and the values that go into it), cached.
pub mod render;

/// Pure decisions: the plan of a render, hooks, pruning, readiness, the next status.
pub mod plan;

/// The cluster a module goes to: server-side apply, deletion, discovery, remote targets.
pub mod apply;

/// The sharding protocol: shards, assignment, membership and shard Leases, the fence.
pub mod shard;

/// The reconcile pipeline: one pass over one Manifest, one file per phase.
pub mod reconcile;

/// Work: the watches of the owned shards, the queue, and the dispatch of passes.
pub mod work;

/// The admin API server: health, metrics, fleet-wide views, drain.
pub mod admin;

/// The command line's client of the admin API: `module-manager admin …` and its tables.
pub mod cli;

/// Runtime: a replica's configuration, preflight and wiring.
pub mod runtime;
