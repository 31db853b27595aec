//! module-manager: a sharded Kubernetes operator that manages the lifecycle of Helm-chart modules.
//!
//! The binary (`src/main.rs`) is a thin command line over this library. The modules are listed in
//! dependency order: each uses only those above it (`docs/architecture.md`; `make lint` checks).

pub mod admin;
pub mod api;
pub mod apply;
pub mod log_check;
pub mod plan;
pub mod reconcile;
pub mod render;
pub mod runtime;
pub mod shard;
pub mod source;
pub mod telemetry;
pub mod work;
