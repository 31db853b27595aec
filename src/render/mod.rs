//! Render: renders a resolved chart as the pinned `helm template` does — through the long-lived
//! `renderer` child (Helm's own packages) or one `helm` process per render — isolated and
//! bounded, behind a cache keyed by everything that changes the output.
//!
//! Why Helm's own code: no Rust template engine renders every common chart as Helm does
//! (Go template and sprig semantics, Helm's loader); Argo CD made the same choice. See
//! `docs/reconcile.md`.

mod child;
mod cli;
pub mod frame;
mod process;
mod request;
pub mod values;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::telemetry::metrics::RenderMetrics;
use prometheus_client::metrics::counter::Counter;

pub use child::RendererState;
use process::on_path;
pub use request::{RenderError, RenderLimits, RenderRequest, sha256};

/// The output of one render.
#[derive(Debug, PartialEq, Eq)]
pub struct Rendered {
    /// Multi-document YAML as helm printed it.
    pub manifest: String,
    /// `sha256:` of `manifest`.
    pub digest: String,
}

/// Which program renders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One `helm template` process per render (the reference).
    Helm(PathBuf),
    /// The long-lived `renderer` child built on Helm's packages (`renderer/`).
    Renderer(PathBuf),
}

/// The backend behind a [`HelmRenderer`].
enum Engine {
    Cli(cli::Cli),
    Child(child::ChildRenderer),
}

/// Renders charts as the pinned helm does, through the chosen [`Backend`], behind the cache.
pub struct HelmRenderer {
    engine: Engine,
    version: String,
    limits: RenderLimits,
    cache: RenderCache,
    metrics: RenderMetrics,
}

impl HelmRenderer {
    /// The `helm` CLI backend: checks the binary (`helm version --short`) and prepares an
    /// isolated helm home in `home`. `metrics` receives cache hits/misses and render
    /// durations/failures.
    pub async fn new(
        helm: PathBuf,
        home: PathBuf,
        limits: RenderLimits,
        metrics: RenderMetrics,
    ) -> Result<Self, RenderError> {
        Self::start(Backend::Helm(helm), home, limits, metrics).await
    }

    /// Starts `backend` (the renderer child answers its hello; helm answers `version`) with a
    /// private helm home in `home`.
    pub async fn start(
        backend: Backend,
        home: PathBuf,
        limits: RenderLimits,
        metrics: RenderMetrics,
    ) -> Result<Self, RenderError> {
        for dir in ["cache", "config", "data"] {
            std::fs::create_dir_all(home.join(dir))
                .map_err(|e| RenderError::Spawn("helm (its home directory)", e))?;
        }
        let (engine, version) = match backend {
            Backend::Helm(helm) => {
                let helm = on_path(&helm, std::env::var_os("PATH").as_deref());
                let (cli, version) = cli::Cli::start(helm, home).await?;
                (Engine::Cli(cli), version)
            }
            Backend::Renderer(binary) => {
                let binary = on_path(&binary, std::env::var_os("PATH").as_deref());
                let counters = child::ChildCounters {
                    starts: metrics.child_starts.clone(),
                    retries: metrics.child_resends.clone(),
                };
                let (child, version) =
                    child::ChildRenderer::start(binary, home, limits, counters).await?;
                (Engine::Child(child), version)
            }
        };
        Ok(Self {
            engine,
            version,
            cache: RenderCache::new(limits.cache_entries, limits.cache_bytes, &metrics),
            metrics,
            limits,
        })
    }

    /// The helm version, e.g. `v4.3.2+g…`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The bounds on its renders.
    pub fn limits(&self) -> RenderLimits {
        self.limits
    }

    /// `helm` or `renderer`.
    pub fn backend(&self) -> &'static str {
        match self.engine {
            Engine::Cli(_) => "helm",
            Engine::Child(_) => "renderer",
        }
    }

    /// The renderer child's state (`None` for the helm CLI backend).
    pub async fn renderer_state(&self) -> Option<RendererState> {
        match &self.engine {
            Engine::Cli(_) => None,
            Engine::Child(child) => Some(child.state().await),
        }
    }

    /// Render-cache hits and misses so far.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Renders, from the cache when the same inputs were rendered before. A render that ran out
    /// of memory is cached as that failure: sent again, it would stop the renderer again (and
    /// a permanent error comes back every `spec.interval`, which may be 1 s).
    pub async fn render(&self, request: &RenderRequest) -> Result<Arc<Rendered>, RenderError> {
        let key = request.cache_key(&self.version);
        match self.cache.get(&key) {
            Some(Cached::Rendered(hit)) => {
                tracing::debug!(digest = %hit.digest, "render cache hit");
                return Ok(hit);
            }
            Some(Cached::MemoryLimit(limit)) => {
                tracing::debug!("render cache hit: the render ran out of memory");
                return Err(RenderError::MemoryLimit(limit));
            }
            None => {}
        }
        let started = std::time::Instant::now();
        let rendered = self.run(request).await;
        let seconds = started.elapsed().as_secs_f64();
        self.metrics.helm_duration.observe(seconds);
        tracing::debug!(
            seconds,
            ok = rendered.is_ok(),
            backend = self.backend(),
            "render"
        );
        let rendered = match rendered {
            Ok(rendered) => Arc::new(rendered),
            Err(error) => {
                self.metrics.helm_failures.inc();
                if let RenderError::MemoryLimit(limit) = error {
                    self.cache.insert(key, Cached::MemoryLimit(limit));
                }
                return Err(error);
            }
        };
        self.cache.insert(key, Cached::Rendered(rendered.clone()));
        Ok(rendered)
    }

    /// Renders without the cache.
    pub async fn render_uncached(&self, request: &RenderRequest) -> Result<Rendered, RenderError> {
        self.run(request).await
    }

    async fn run(&self, request: &RenderRequest) -> Result<Rendered, RenderError> {
        let manifest = match &self.engine {
            Engine::Cli(cli) => cli.render(request, &self.limits).await?,
            Engine::Child(child) => child.render(request).await?,
        };
        Ok(Rendered {
            digest: sha256(manifest.as_bytes()),
            manifest,
        })
    }
}

/// Hit and miss counts of the render cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Renders served from the cache.
    pub hits: u64,
    /// Renders that ran helm.
    pub misses: u64,
}

/// What the render cache holds for a key.
#[derive(Clone, Debug)]
enum Cached {
    /// The render's output.
    Rendered(Arc<Rendered>),
    /// The render ran out of memory (the limit, in bytes): it would again.
    MemoryLimit(u64),
}

impl Cached {
    /// Bytes of output held.
    fn size(&self) -> usize {
        match self {
            Self::Rendered(rendered) => rendered.manifest.len(),
            Self::MemoryLimit(_) => 0,
        }
    }
}

/// Renders by cache key, evicting the oldest entries beyond the capacity in entries or bytes.
struct RenderCache {
    capacity: usize,
    max_bytes: usize,
    entries: Mutex<CacheEntries>,
    hits: Counter,
    misses: Counter,
}

/// Cached renders and their keys in insertion order.
#[derive(Default)]
struct CacheEntries {
    by_key: HashMap<String, Cached>,
    order: VecDeque<String>,
    /// Bytes of the manifests in `by_key`.
    bytes: usize,
}

impl RenderCache {
    fn new(capacity: usize, max_bytes: usize, metrics: &RenderMetrics) -> Self {
        Self {
            capacity,
            max_bytes,
            entries: Mutex::default(),
            hits: metrics.cache_hits.clone(),
            misses: metrics.cache_misses.clone(),
        }
    }

    fn get(&self, key: &str) -> Option<Cached> {
        let found = self
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_key
            .get(key)
            .cloned();
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.inc();
        found
    }

    fn insert(&self, key: String, rendered: Cached) {
        let size = rendered.size();
        if size > self.max_bytes {
            return;
        }
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entries = &mut *guard;
        entries.bytes += size;
        match entries.by_key.insert(key.clone(), rendered) {
            Some(replaced) => entries.bytes -= replaced.size(),
            None => entries.order.push_back(key),
        }
        while entries.order.len() > self.capacity || entries.bytes > self.max_bytes {
            let Some(oldest) = entries.order.pop_front() else {
                break;
            };
            if let Some(gone) = entries.by_key.remove(&oldest) {
                entries.bytes -= gone.size();
            }
        }
    }

    fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.get(),
            misses: self.misses.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::ResolvedChart;

    fn request() -> RenderRequest {
        RenderRequest {
            chart: ResolvedChart {
                digest: "sha256:aa".into(),
                path: "/charts/web".into(),
            },
            release: "web".into(),
            namespace: "apps".into(),
            values: serde_json::from_str(r#"{"b": 1, "a": {"y": 2, "x": 1}}"#).unwrap(),
            kube_version: "v1.36.3".into(),
            api_versions: vec!["apps/v1".into(), "v1".into()].into(),
            is_upgrade: false,
        }
    }

    #[test]
    fn the_cache_key_covers_every_input_and_ignores_value_order() {
        let base = request();
        let key = base.cache_key("v4.3.2");
        let reordered = RenderRequest {
            values: serde_json::from_str(r#"{"a": {"x": 1, "y": 2}, "b": 1}"#).unwrap(),
            ..request()
        };
        assert_eq!(reordered.cache_key("v4.3.2"), key);
        let variants = [
            RenderRequest {
                chart: ResolvedChart {
                    digest: "sha256:bb".into(),
                    ..base.chart.clone()
                },
                ..request()
            },
            RenderRequest {
                values: serde_json::from_str(r#"{"b": 2}"#).unwrap(),
                ..request()
            },
            RenderRequest {
                release: "web2".into(),
                ..request()
            },
            RenderRequest {
                namespace: "other".into(),
                ..request()
            },
            RenderRequest {
                kube_version: "v1.37.0".into(),
                ..request()
            },
            RenderRequest {
                api_versions: vec!["v1".into()].into(),
                ..request()
            },
            RenderRequest {
                is_upgrade: true,
                ..request()
            },
        ];
        for variant in variants {
            assert_ne!(variant.cache_key("v4.3.2"), key, "{variant:?}");
        }
        assert_ne!(base.cache_key("v4.3.3"), key);
    }

    #[test]
    fn the_cache_evicts_the_oldest_and_counts() {
        let cache = RenderCache::new(2, 1 << 20, &RenderMetrics::default());
        let rendered = |s: &str| {
            Cached::Rendered(Arc::new(Rendered {
                manifest: s.into(),
                digest: sha256(s.as_bytes()),
            }))
        };
        cache.insert("a".into(), rendered("a"));
        cache.insert("b".into(), rendered("b"));
        cache.insert("c".into(), rendered("c"));
        assert!(cache.get("a").is_none());
        assert!(matches!(cache.get("c"), Some(Cached::Rendered(r)) if r.manifest == "c"));
        assert_eq!(cache.stats(), CacheStats { hits: 1, misses: 1 });
    }

    /// The cache holds at most its bytes: the oldest go first, a render larger than the whole
    /// cache is not kept, and replacing an entry counts its size once.
    #[test]
    fn the_cache_is_bounded_in_bytes() {
        let cache = RenderCache::new(100, 10, &RenderMetrics::default());
        let rendered = |s: &str| {
            Cached::Rendered(Arc::new(Rendered {
                manifest: s.into(),
                digest: sha256(s.as_bytes()),
            }))
        };
        let bytes = |cache: &RenderCache| cache.entries.lock().unwrap().bytes;
        cache.insert("a".into(), rendered("aaaa"));
        cache.insert("b".into(), rendered("bbbb"));
        cache.insert("b".into(), rendered("bbbb"));
        assert_eq!(bytes(&cache), 8);
        cache.insert("c".into(), rendered("cccc"));
        assert!(cache.get("a").is_none(), "the oldest went to make room");
        assert!(cache.get("b").is_some() && cache.get("c").is_some());
        assert_eq!(bytes(&cache), 8);
        cache.insert("huge".into(), rendered(&"x".repeat(11)));
        assert!(cache.get("huge").is_none());
        assert!(
            cache.get("c").is_some(),
            "a render too large evicts nothing"
        );
        cache.insert("d".into(), rendered(&"d".repeat(10)));
        assert_eq!(bytes(&cache), 10);
        assert_eq!(cache.entries.lock().unwrap().order.len(), 1);
    }
}
