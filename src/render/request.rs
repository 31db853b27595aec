//! What a render is asked for ([`RenderRequest`], with its cache key), its bounds
//! ([`RenderLimits`]) and how it fails ([`RenderError`]).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::source::ResolvedChart;

/// The flags every render passes besides its inputs; part of the cache key.
pub(super) const FIXED_FLAGS: &[&str] = &["--include-crds", "--skip-tests", "--values", "-"];

/// Bounds on one helm run.
#[derive(Clone, Copy, Debug)]
pub struct RenderLimits {
    /// Wall-clock limit; the process is killed after it.
    pub timeout: Duration,
    /// Most bytes of rendered output.
    pub max_output: usize,
    /// Most renders kept in the cache.
    pub cache_entries: usize,
    /// Most bytes of rendered output kept in the cache (all entries together); a render larger
    /// than this is not cached.
    pub cache_bytes: usize,
    /// Most bytes of Go heap the renderer child may use (all its renders together); past it the
    /// child exits and its renders fail with [`RenderError::MemoryLimit`]. The helm CLI backend
    /// gives each `helm` process the same as `GOMEMLIMIT` and its address space the same hard
    /// bound as the child's ([`address_space_limit`]); a helm that runs out of it fails the
    /// render with [`RenderError::MemoryLimit`].
    pub memory_limit: u64,
}

impl Default for RenderLimits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            max_output: 16 * 1024 * 1024,
            cache_entries: 1024,
            cache_bytes: 256 * 1024 * 1024,
            memory_limit: 512 * 1024 * 1024,
        }
    }
}

/// Why a render failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// helm or the renderer (the program named) could not be started.
    #[error("start {0}: {1}")]
    Spawn(&'static str, #[source] std::io::Error),
    /// helm ran longer than the limit and was killed (transient: retried with the queue's
    /// backoff, per Manifest, not at `spec.interval`; a busy machine may also be the cause).
    #[error("helm template did not finish within {0:?} and was stopped")]
    Timeout(Duration),
    /// the output exceeded the limit.
    #[error("helm template output exceeds the limit of {0} bytes")]
    OutputTooLarge(usize),
    /// helm reported an error (a template error, a missing required value, a schema violation).
    #[error("helm template failed: {0}")]
    Helm(String),
    /// `helm version` (or the renderer's hello) did not answer as expected.
    #[error("helm version: {0}")]
    Version(String),
    /// the render ran out of memory alone on the renderer (the heap limit, or the address-space
    /// backstop): no other render was in flight on it.
    #[error("render exceeded the renderer's memory limit of {0} bytes")]
    MemoryLimit(u64),
    /// the renderer child stopped under the render, and could not be blamed on it.
    #[error("renderer stopped: {0}")]
    RendererDied(String),
}

impl RenderError {
    /// Whether the error comes from the chart or its values (waits for a spec change) rather
    /// than from the machine (retried with backoff). A timeout is transient: it costs the
    /// renderer its child, so it must back off on its Manifest's own schedule (the work queue's
    /// 1 s doubling to 5 min) rather than come back every `spec.interval` (as short as 1 s);
    /// and a loaded machine can cause it too.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::OutputTooLarge(_) | Self::Helm(_) | Self::MemoryLimit(_)
        )
    }
}

/// Everything that determines a render.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderRequest {
    /// The chart.
    pub chart: ResolvedChart,
    /// Helm release name.
    pub release: String,
    /// Release namespace.
    pub namespace: String,
    /// Merged values.
    pub values: Map<String, Value>,
    /// The target's version, e.g. `v1.36.3`.
    pub kube_version: String,
    /// The target's API versions (`group/version` and `group/version/Kind`), sorted.
    pub api_versions: Arc<[String]>,
    /// Whether an inventory exists (`.Release.IsUpgrade`).
    pub is_upgrade: bool,
}

impl RenderRequest {
    /// `sha256:` over the chart digest, canonical values, release, namespace, kube version, sorted
    /// API versions, upgrade flag, helm version and flags.
    pub fn cache_key(&self, helm_version: &str) -> String {
        let canonical = serde_json::json!({
            "chart": self.chart.digest,
            // serde_json's maps are ordered by key, so this serialization is canonical.
            "values": self.values,
            "release": self.release,
            "namespace": self.namespace,
            "kubeVersion": self.kube_version,
            "apiVersions": &*self.api_versions,
            "isUpgrade": self.is_upgrade,
            "helm": helm_version,
            "flags": FIXED_FLAGS,
        });
        sha256(canonical.to_string().as_bytes())
    }

    /// `sha256:` of the canonical values alone (recorded to tell a changed input from a vanished
    /// object).
    pub fn values_digest(&self) -> String {
        sha256(Value::Object(self.values.clone()).to_string().as_bytes())
    }
}

/// `sha256:<hex>` of bytes.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}
