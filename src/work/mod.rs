//! Work: the watches of the owned shards (and of the labelled values sources and depended-on
//! Manifests), the work queue around them, and the dispatch of passes to workers.

pub mod controller;
mod dependencies;
mod dispatch;
pub mod queue;
mod sources;
mod watches;
