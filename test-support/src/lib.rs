//! What module-manager's integration tests, bench and load test share (not part of the product).
//!
//! - [`log_check`]: the checker over the replicas' JSON logs (no Manifest reconciled by two
//!   replicas at once, none left out),
//! - [`fleet`]: a local fleet of processes of the real `module-manager` binary,
//! - [`objects`]: the kube calls the tests repeat (list, create from JSON, patch, apply, delete),
//! - [`context()`]: a reconcile [`Context`](module_manager::reconcile::Context) for in-process
//!   tests, with test defaults.

pub mod context;
pub mod fleet;
pub mod log_check;
pub mod objects;

pub use context::{ContextBuilder, context, render_backend};

use std::path::{Path, PathBuf};

use module_manager::source::RemoteConfig;

/// The operator flags of every replica a test starts: chart sources may reach this machine's
/// loopback servers (the tests' repositories and registries listen on 127.0.0.1) over plain
/// HTTP. A deployment refuses both (`docs/security.md`).
pub const LOCAL_CHART_HOST_FLAGS: [&str; 2] = [
    "--allow-private-chart-hosts=127.0.0.1",
    "--allow-insecure-http",
];

/// [`LOCAL_CHART_HOST_FLAGS`] for a resolver built in the test process.
pub fn local_chart_hosts(config: RemoteConfig) -> RemoteConfig {
    RemoteConfig {
        allowed_private: vec!["127.0.0.1".parse().expect("an address")],
        allow_plain_http: true,
        ..config
    }
}

/// The repository (canonical): local chart paths such as `tests/fixtures/charts/…` resolve here.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support lives in the repository")
        .canonicalize()
        .expect("the repository exists")
}
