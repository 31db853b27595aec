//! module-manager: a sharded Kubernetes operator that manages the lifecycle of Helm-chart modules.
//!
//! The binary (`src/main.rs`) is a thin command line over this library.

pub mod api;
