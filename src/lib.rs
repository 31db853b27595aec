//! module-manager: a sharded Kubernetes operator that manages the lifecycle of Helm-chart modules.
//!
//! The binary (`src/main.rs`) is a thin command line over this library. The modules are listed in
//! dependency order: each uses only those above it (`docs/architecture.md`; `make lint` checks).
//! A blank line between them keeps rustfmt from sorting them by name.

pub mod api;

pub mod telemetry;

pub mod source;

pub mod render;

pub mod plan;

pub mod apply;

pub mod shard;

pub mod reconcile;

pub mod work;

pub mod admin;

pub mod cli;

pub mod runtime;

pub mod log_check;
