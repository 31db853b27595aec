//! module-manager: a sharded Kubernetes operator that manages the lifecycle of Helm-chart modules.
//!
//! The binary (`src/main.rs`) is a thin command line over this library.

pub mod admin;
pub mod api;
pub mod apply;
pub mod chart_source;
pub mod controller;
pub mod hooks;
pub mod log_check;
pub mod metrics;
pub mod plan;
pub mod preflight;
pub mod queue;
pub mod readiness;
pub mod reconcile;
pub mod render;
pub mod shard;
pub mod status;
pub mod target;
pub mod telemetry;
pub mod values;
