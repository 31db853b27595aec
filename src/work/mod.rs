//! Work: the watches of the owned shards (and of the labelled values sources and depended-on
//! Manifests), the work queue around them, and the dispatch of passes to workers. The
//! controller (`controller.rs`) starts them over the caches and queue they share (`caches.rs`).

pub mod caches;
pub mod census;
pub mod controller;
mod dependencies;
mod dispatch;
pub mod queue;
mod secret_versions;
mod seen;
mod sources;
mod target_gate;
mod watches;
