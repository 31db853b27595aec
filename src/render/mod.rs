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
pub mod values;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::process::Command;

use crate::source::ResolvedChart;
use crate::telemetry::events::{MESSAGE_LIMIT, shorten_ends};
use crate::telemetry::metrics::RenderMetrics;
use prometheus_client::metrics::counter::Counter;

/// The flags every render passes besides its inputs; part of the cache key.
const FIXED_FLAGS: &[&str] = &["--include-crds", "--skip-tests", "--values", "-"];

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
                let (child, version) = child::ChildRenderer::start(binary, home, limits).await?;
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

/// The renderer child as its backend sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RendererState {
    /// The running child's process id (`None` between a death and the next render).
    pub pid: Option<u32>,
    /// Renders sent to it and not answered yet.
    pub in_flight: usize,
    /// Children started so far (the first included).
    pub starts: u64,
    /// Renders sent again because their child died under them.
    pub retries: u64,
}

/// Bounds a Go program's address space (`RLIMIT_AS`) well above its heap limit `memory_limit`:
/// a hard backstop for an allocation too fast for a heap check. Go reserves about 1.3 GiB of
/// address space at start, hence the margin.
#[cfg(target_os = "linux")]
fn address_space_limit(command: &mut Command, memory_limit: u64) {
    let bytes = memory_limit.saturating_mul(2).saturating_add(4 << 30);
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit is async-signal-safe, and the closure touches nothing but its copy of
    // `limit`.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn address_space_limit(_: &mut Command, _: u64) {}

/// `program` found in the directories of `path` (this process's `PATH`) when it is a bare name
/// (`helm`): the child runs with an empty environment, where a bare name would be looked up in
/// the C library's default path only (`/bin:/usr/bin`). A path with a `/`, or a name found
/// nowhere (the spawn then says so), is kept as it is.
fn on_path(program: &Path, path: Option<&std::ffi::OsStr>) -> PathBuf {
    let bare = program.components().count() == 1 && !program.to_string_lossy().contains('/');
    let found = bare
        .then(|| {
            std::env::split_paths(path?)
                .map(|dir| dir.join(program))
                .find(|candidate| candidate.is_file())
        })
        .flatten();
    found.unwrap_or_else(|| program.to_owned())
}

/// A private helm home in `home` and nothing else of the environment.
fn private_home<'c>(command: &'c mut Command, home: &Path) -> &'c mut Command {
    command
        .env_clear()
        .env("HOME", home)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
}

/// The useful part of helm's stderr: from its first `Error` line on (warnings before it are
/// dropped), lines joined with `; `, at most [`MESSAGE_LIMIT`] bytes keeping the beginning and
/// the end (an include recursion's cause is the last line of ~130 kB). The backends keep a long
/// text's ends and call [`helm_message_ends`]; this is the whole-text reference.
#[cfg(test)]
fn helm_message(stderr: &[u8]) -> String {
    helm_message_ends(stderr, 0, b"")
}

/// [`helm_message`] of a stderr of which only the ends were kept: `head`, `omitted` bytes
/// dropped, `tail`.
fn helm_message_ends(head: &[u8], omitted: usize, tail: &[u8]) -> String {
    let (head, omitted, tail) = mend_cut(head, omitted, tail);
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let head_lines = lines(&head);
    let first_error = head_lines
        .iter()
        .position(|l| l.starts_with("Error"))
        .unwrap_or(0);
    let message = head_lines[first_error..].join("; ");
    let message = message.strip_prefix("Error: ").unwrap_or(&message);
    let tail = lines(&tail).join("; ");
    let separator = if message.is_empty() || tail.is_empty() || omitted > 0 {
        ""
    } else {
        "; "
    };
    shorten_ends(
        message,
        omitted,
        &format!("{separator}{tail}"),
        MESSAGE_LIMIT,
    )
}

/// The two ends of a cut stream as text, the cut moved past what would read differently from
/// the whole text: a character split by it and the spaces at it (trimmed as a line's ends,
/// which they are not) count as omitted. So the message is the one the whole stderr gives.
fn mend_cut(head: &[u8], omitted: usize, tail: &[u8]) -> (String, usize, String) {
    if omitted == 0 {
        let text = |bytes| String::from_utf8_lossy(bytes).into_owned();
        return (text(head), 0, text(tail));
    }
    let whole_head = head.len();
    let head = match std::str::from_utf8(head) {
        Err(e) if e.error_len().is_none() => &head[..e.valid_up_to()],
        _ => head,
    };
    let split = tail
        .iter()
        .take(3)
        .take_while(|b| (**b & 0xC0) == 0x80)
        .count();
    let (head_text, tail_text) = (
        String::from_utf8_lossy(head),
        String::from_utf8_lossy(&tail[split..]),
    );
    let kept_head = head_text.trim_end_matches([' ', '\t']);
    let kept_tail = tail_text.trim_start_matches([' ', '\t']);
    let cut_off = (whole_head - head.len())
        + (head_text.len() - kept_head.len())
        + split
        + (tail_text.len() - kept_tail.len());
    (
        kept_head.to_owned(),
        omitted + cut_off,
        kept_tail.to_owned(),
    )
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

    #[test]
    fn bare_program_names_are_found_on_this_processs_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("helm"), "").unwrap();
        let path = std::env::join_paths(["/nonexistent".into(), dir.path().to_owned()]).unwrap();
        assert_eq!(
            on_path(Path::new("helm"), Some(&path)),
            dir.path().join("helm")
        );
        assert_eq!(
            on_path(Path::new("nothere"), Some(&path)),
            PathBuf::from("nothere")
        );
        assert_eq!(
            on_path(Path::new("./helm"), Some(&path)),
            PathBuf::from("./helm")
        );
        assert_eq!(
            on_path(Path::new("/usr/bin/helm"), None),
            PathBuf::from("/usr/bin/helm")
        );
        assert_eq!(on_path(Path::new("helm"), None), PathBuf::from("helm"));
    }

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

    #[test]
    fn helm_messages_keep_the_error_lines() {
        let stderr = b"walk.go:74: found symbolic link\nError: template: web/templates/x.yaml:3:4: executing \"x\": nil pointer\n";
        assert_eq!(
            helm_message(stderr),
            "template: web/templates/x.yaml:3:4: executing \"x\": nil pointer"
        );
        let schema = b"Error: values don't meet the specifications of the schema(s):\ntyped:\n- at '/replicaCount': got string\n";
        assert_eq!(
            helm_message(schema),
            "values don't meet the specifications of the schema(s):; typed:; - at '/replicaCount': got string"
        );
        assert_eq!(helm_message(b"  something odd \n"), "something odd");
        let long = helm_message(&[b'x'; 5000]);
        assert_eq!(long.len(), MESSAGE_LIMIT);
        assert!(long.contains(" … [2982 bytes omitted] … "), "{long}");
    }

    #[test]
    fn a_long_helm_error_keeps_its_cause_at_the_end() {
        let nested = "error calling include: template: c/templates/_h.tpl:2:3: executing \"loop\" at <include \"loop\" .>: ".repeat(1000);
        let stderr = format!(
            "walk.go:74: a warning\nError: template: c/templates/cm.yaml:6:12: {nested}error calling include: rendering template has a nested reference name: loop: unable to execute template\n\nUse --debug flag to render out invalid YAML\n"
        );
        let message = helm_message(stderr.as_bytes());
        assert!(message.len() <= MESSAGE_LIMIT);
        assert!(
            message.starts_with("template: c/templates/cm.yaml:6:12: error calling include"),
            "{message}"
        );
        assert!(message.ends_with("nested reference name: loop: unable to execute template; Use --debug flag to render out invalid YAML"), "{message}");
        assert!(message.contains("bytes omitted"));
    }

    #[test]
    fn a_stderr_kept_by_its_ends_keeps_both_and_counts_the_gap() {
        let message = helm_message_ends(
            b"noise\nError: the start\nmore",
            70_000,
            b"tail of a line\nthe cause\n",
        );
        assert_eq!(
            message,
            "the start; more … [70000 bytes omitted] … tail of a line; the cause"
        );
        assert_eq!(helm_message_ends(b"Error: a\n", 0, b"b\n"), "a; b");
    }

    #[test]
    fn a_cut_inside_a_character_or_at_spaces_reads_as_the_whole_text() {
        // The same stderr whole and as two ends cut inside "é" (2 bytes), followed by spaces:
        // the same message, marker count included.
        let whole = format!(
            "Error: {}é  {}the cause\n",
            "a".repeat(3000),
            "b".repeat(3000)
        );
        let bytes = whole.as_bytes();
        let cut = 7 + 3000 + 1;
        let (head, omitted, tail) = mend_cut(&bytes[..cut], 1, &bytes[cut + 1..]);
        assert_eq!((head.len(), omitted), (7 + 3000, 1 + 1 + 2));
        assert!(tail.starts_with('b'));
        assert_eq!(
            helm_message_ends(&bytes[..cut], 1, &bytes[cut + 1..]),
            helm_message(bytes)
        );
        // Cut inside the character on the tail's side.
        assert_eq!(
            helm_message_ends(&bytes[..cut - 1], 1, &bytes[cut..]),
            helm_message(bytes)
        );
    }
}
