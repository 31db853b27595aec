//! What module-manager's integration tests, bench and load test share (not part of the product).
//!
//! - [`log_check`]: the checker over the replicas' JSON logs (no Manifest reconciled by two
//!   replicas at once, none left out),
//! - [`fleet`]: a local fleet of processes of the real `module-manager` binary,
//! - [`context()`]: a reconcile [`Context`](module_manager::reconcile::Context) for in-process
//!   tests, with test defaults.

pub mod context;
pub mod fleet;
pub mod log_check;

pub use context::{ContextBuilder, context, render_backend};

use std::path::{Path, PathBuf};

/// The repository (canonical): local chart paths such as `tests/fixtures/charts/…` resolve here.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support lives in the repository")
        .canonicalize()
        .expect("the repository exists")
}
