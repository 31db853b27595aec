//! A real local Kubernetes control plane for module-manager's tests, demo and load test.
//!
//! [`ControlPlane::start`] runs the pinned etcd and kube-apiserver (built by
//! `hack/build-tools.sh`) on free loopback ports with throwaway certificates, waits for
//! `/readyz`, and installs CRDs. [`shared`] gives every test in a test binary the same one, and
//! [`ControlPlane::namespace`] a fresh namespace per test. Processes are stopped by PID when the
//! value is dropped, when the test binary exits, and — through `PR_SET_PDEATHSIG` — even when it
//! is killed.

mod control_plane;
pub mod node;
mod pki;
mod process;
pub mod renderer_key;
pub mod tools;

use std::path::PathBuf;

pub use control_plane::{
    ControlPlane, Endpoints, NODE_MONITOR_GRACE_PERIOD, Options, SHARDED_LIST_AND_WATCH, Stop,
    client_for, config_for, install_crds, parse_crds,
};
pub use process::{Lifetime, Paused, Proc, pid_runs, signal_pid, stop_pid};
pub use tools::Tools;

/// What can go wrong while starting or using a control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// a pinned tool has not been built.
    #[error("{0} is missing: run `hack/build-tools.sh` (or `make tools`) first")]
    ToolMissing(PathBuf),
    /// a file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// certificate generation failed.
    #[error("generate certificates: {0}")]
    Pki(#[from] rcgen::Error),
    /// the generated kubeconfig could not be loaded.
    #[error("load kubeconfig: {0}")]
    Kubeconfig(String),
    /// a control-plane process exited while it should be running.
    #[error("{name} exited ({status}); end of its log:\n{log_tail}")]
    Exited {
        /// The program.
        name: &'static str,
        /// Its exit status.
        status: String,
        /// The last lines it logged.
        log_tail: String,
    },
    /// a component did not become ready in time.
    #[error("{what} not ready in time; end of the logs:\n{log_tail}")]
    NotReady {
        /// What was waited for.
        what: &'static str,
        /// The last lines the processes logged.
        log_tail: String,
    },
    /// a CRD could not be read or did not become Established.
    #[error("install CRDs: {0}")]
    Crd(String),
    /// the control plane runs no process of that name.
    #[error("the control plane runs no {0}")]
    NoSuchProcess(String),
    /// the real node cannot start or is in use.
    #[error("real node: {0}")]
    Node(String),
    /// a request to the API server failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

static SHARED: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();

/// The control plane shared by every test of this test binary, started on first use with
/// `options` (later callers' options are ignored). It is stopped when the process exits.
pub async fn shared(options: Options) -> Result<&'static ControlPlane, Error> {
    SHARED
        .get_or_try_init(|| async {
            let control_plane = ControlPlane::start(options).await?;
            // SAFETY: registering a plain extern "C" function has no preconditions.
            unsafe { libc::atexit(stop_shared) };
            Ok(control_plane)
        })
        .await
}

extern "C" fn stop_shared() {
    if let Some(control_plane) = SHARED.get() {
        control_plane.stop();
    }
}
