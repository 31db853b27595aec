//! Charts from Helm HTTP repositories and OCI registries, against real servers started here:
//! an HTTP server in this process serving what each test puts in it (charts packaged and
//! indexed by the pinned helm, or broken on purpose), and Debian's `docker-registry` on a
//! loopback port with charts pushed by `helm push` (and one pushed by `oci-client` with the wrong
//! media types). The resolver is tested directly, then the whole pipeline on a real API server.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use common::condition;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use module_manager::api::{
    ChartSource, ChartVerification, LocalObjectReference, State as ModuleState,
    VerificationProvider,
};
use module_manager::source::{
    Credentials, FetchError, KeyMaterial, Limits, RemoteCharts, RemoteConfig, ResolvedChart,
    SourceError,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use test_support::objects;
use test_support::repo;

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

// ---------------------------------------------------------------------------------------------
// helm, run as a tool with private directories

/// Runs `command` (the tool `tool` with `args` set), asserts that it succeeded, and returns what it
/// wrote: stdout, then stderr.
fn run_tool(mut command: Command, tool: &str, args: &[&str]) -> String {
    let output = command.output().expect("the tool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{tool} {args:?}: {text}");
    text
}

fn helm(home: &Path, args: &[&str]) -> String {
    let mut command = Command::new(testenv::Tools::locate().expect("tools built").helm);
    command
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    run_tool(command, "helm", args)
}

/// catalog 1.0.0 and 2.0.0 packaged by helm, and the `index.yaml` `helm repo index` wrote for
/// them (relative URLs).
struct Packaged {
    v1: Vec<u8>,
    v2: Vec<u8>,
    index: Vec<u8>,
}

fn packaged() -> &'static Packaged {
    static PACKAGED: OnceLock<Packaged> = OnceLock::new();
    PACKAGED.get_or_init(|| {
        let home = tempfile::tempdir().unwrap();
        let out = home.path().join("repo");
        let out_dir = out.to_str().unwrap();
        for chart in ["catalog-v1", "catalog-v2"] {
            let path = repo().join("examples/charts").join(chart);
            helm(
                home.path(),
                &["package", path.to_str().unwrap(), "-d", out_dir],
            );
        }
        helm(home.path(), &["repo", "index", out_dir]);
        Packaged {
            v1: std::fs::read(out.join("catalog-1.0.0.tgz")).unwrap(),
            v2: std::fs::read(out.join("catalog-2.0.0.tgz")).unwrap(),
            index: std::fs::read(out.join("index.yaml")).unwrap(),
        }
    })
}

/// A Helm chart's OCI image manifest whose one chart layer has this digest and size.
fn helm_manifest(layer_digest: &str, size: usize) -> Vec<u8> {
    json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.cncf.helm.config.v1+json",
                   "digest": format!("sha256:{}", sha256(b"{}")), "size": 2},
        "layers": [{"mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
                    "digest": layer_digest, "size": size}],
    })
    .to_string()
    .into_bytes()
}

/// A gzipped tar; entry names are written raw so that hostile ones (`..`, `/`) can be built.
fn tgz(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::default(),
    ));
    for (path, kind, content) in entries {
        let mut header = tar::Header::new_gnu();
        header.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_entry_type(*kind);
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        if kind.is_symlink() {
            header.set_link_name("/etc/passwd").unwrap();
        }
        header.set_cksum();
        builder.append(&header, *content).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

/// An `index.yaml` with one entry per `(chart, version, digest, url)`.
fn index_yaml(entries: &[(&str, &str, &str, &str)]) -> Vec<u8> {
    let mut text = String::from("apiVersion: v1\nentries:\n");
    for (chart, version, digest, url) in entries {
        text.push_str(&format!(
            "  {chart}:\n  - name: {chart}\n    version: {version}\n    digest: {digest}\n    urls:\n    - {url}\n"
        ));
    }
    text.into_bytes()
}

/// [`index_yaml`] of entries that own their digest and URL.
fn owned_index_yaml(entries: &[(&str, &str, String, String)]) -> Vec<u8> {
    let borrowed: Vec<(&str, &str, &str, &str)> = entries
        .iter()
        .map(|(n, v, d, u)| (*n, *v, d.as_str(), u.as_str()))
        .collect();
    index_yaml(&borrowed)
}

/// Hostile archives of a chart `evil`, by name: `dotdot` (an entry escaping with `../`),
/// `absolute` (an absolute path), `link` (a symlink) and `bomb` (a file of `bomb_bytes` zeros).
fn hostile_archives(bomb_bytes: usize) -> Vec<(&'static str, Vec<u8>)> {
    let file = tar::EntryType::Regular;
    let chart_yaml: &[u8] = b"apiVersion: v2\nname: evil\nversion: 1.0.0\n";
    vec![
        (
            "dotdot",
            tgz(&[
                ("evil/Chart.yaml", file, chart_yaml),
                ("evil/../../etc/x", file, b"x"),
            ]),
        ),
        ("absolute", tgz(&[("/etc/evil", file, b"x")])),
        (
            "link",
            tgz(&[
                ("evil/Chart.yaml", file, chart_yaml),
                ("evil/templates/l", tar::EntryType::Symlink, b""),
            ]),
        ),
        (
            "bomb",
            tgz(&[
                ("evil/Chart.yaml", file, chart_yaml),
                ("evil/big", file, &vec![0u8; bomb_bytes]),
            ]),
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// an HTTP chart repository in this process

#[derive(Clone)]
enum Reply {
    Body(Vec<u8>),
    /// A body with a `Docker-Content-Digest` header.
    Digested(Vec<u8>, String),
    Redirect(String),
    Status(StatusCode),
    /// Accept the request, never answer.
    Hang,
    /// 401 with this `WWW-Authenticate` challenge.
    Challenge(String),
    /// This status and a chunked body (no `Content-Length`) of this many bytes of `s3cret `,
    /// made as it is sent.
    Stream(StatusCode, u64),
}

#[derive(Clone, Default)]
struct Files {
    replies: Arc<Mutex<HashMap<String, Reply>>>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    /// Bytes of `Reply::Stream` bodies handed to the connection so far.
    streamed: Arc<std::sync::atomic::AtomicU64>,
}

/// Serves whatever the test puts at a path; counts requests per path.
struct RepoServer {
    url: String,
    files: Files,
}

impl RepoServer {
    /// Serves each `(name, archive)` at `{dir}/{name}.tgz`; returns their entries for
    /// [`owned_index_yaml`]: `(name, "1.0.0", digest, "{name}.tgz")`.
    fn put_archives(
        &self,
        dir: &str,
        archives: &[(&'static str, Vec<u8>)],
    ) -> Vec<(&'static str, &'static str, String, String)> {
        let mut entries = Vec::new();
        for (name, bytes) in archives {
            self.put(&format!("{dir}/{name}.tgz"), bytes.clone());
            entries.push((*name, "1.0.0", sha256(bytes), format!("{name}.tgz")));
        }
        entries
    }

    async fn start() -> Self {
        Self::start_on("127.0.0.1:0").await
    }

    /// The server on `bind` (e.g. `127.0.0.2:0`, another loopback address).
    async fn start_on(bind: &str) -> Self {
        module_manager::source::ensure_crypto_provider();
        async fn serve(State(files): State<Files>, uri: Uri) -> Response {
            let path = uri.path().to_owned();
            *files.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
            let reply = files.replies.lock().unwrap().get(&path).cloned();
            match reply {
                Some(Reply::Body(bytes)) => bytes.into_response(),
                Some(Reply::Digested(bytes, digest)) => {
                    ([("docker-content-digest", digest)], bytes).into_response()
                }
                Some(Reply::Redirect(to)) => {
                    (StatusCode::FOUND, [(header::LOCATION, to)]).into_response()
                }
                Some(Reply::Status(status)) => status.into_response(),
                Some(Reply::Hang) => std::future::pending().await,
                Some(Reply::Challenge(challenge)) => (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, challenge)],
                )
                    .into_response(),
                Some(Reply::Stream(status, total)) => {
                    const CHUNK: usize = 64 << 10;
                    let chunk = axum::body::Bytes::from(b"s3cret ".repeat(CHUNK / 7));
                    let streamed = files.streamed.clone();
                    let body = futures::stream::unfold(0u64, move |sent| {
                        let (chunk, streamed) = (chunk.clone(), streamed.clone());
                        async move {
                            (sent < total).then(|| {
                                streamed.fetch_add(
                                    chunk.len() as u64,
                                    std::sync::atomic::Ordering::Relaxed,
                                );
                                let next = sent + chunk.len() as u64;
                                (Ok::<_, std::io::Error>(chunk), next)
                            })
                        }
                    });
                    (status, axum::body::Body::from_stream(body)).into_response()
                }
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }
        let files = Files::default();
        let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(files.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, files }
    }

    fn put(&self, path: &str, bytes: impl Into<Vec<u8>>) {
        self.files
            .replies
            .lock()
            .unwrap()
            .insert(path.into(), Reply::Body(bytes.into()));
    }

    fn redirect(&self, path: &str, to: &str) {
        self.files
            .replies
            .lock()
            .unwrap()
            .insert(path.into(), Reply::Redirect(to.into()));
    }

    fn reply(&self, path: &str, reply: Reply) {
        self.files
            .replies
            .lock()
            .unwrap()
            .insert(path.into(), reply);
    }

    fn streamed(&self) -> u64 {
        self.files
            .streamed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Requests of every path.
    fn all_hits(&self) -> usize {
        self.files.hits.lock().unwrap().values().sum()
    }

    fn hits(&self, path: &str) -> usize {
        self.files
            .hits
            .lock()
            .unwrap()
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// The helm-built repository at `/charts`.
    fn publish_catalog(&self) -> String {
        let charts = packaged();
        self.put("/charts/index.yaml", charts.index.clone());
        self.put("/charts/catalog-1.0.0.tgz", charts.v1.clone());
        self.put("/charts/catalog-2.0.0.tgz", charts.v2.clone());
        format!("{}/charts", self.url)
    }
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    objects::free_port()
}

// ---------------------------------------------------------------------------------------------
// a raw TCP server: answers slowly, not at all, or not in HTTP

/// What a [`raw_server`] does once it has read a request.
#[derive(Clone)]
enum Raw {
    /// Close the connection.
    Close,
    /// Keep it open and say nothing.
    Silent,
    /// Send these bytes (not HTTP) and keep it open.
    Garbage(&'static [u8]),
    /// A 200 with this body (`Content-Length` set), sent in `pieces` parts `pause` apart.
    Trickle(Arc<Vec<u8>>, usize, Duration),
}

/// Requests by path.
type Hits = Arc<Mutex<HashMap<String, usize>>>;

/// A server on a loopback port that reads each request's head and answers as `route` says for
/// its path; returns `127.0.0.1:<port>` and the requests by path.
async fn raw_server(route: impl Fn(&str) -> Raw + Send + Sync + 'static) -> (String, Hits) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let (hits, route) = (Hits::default(), Arc::new(route));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (hits, route) = (counted.clone(), route.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let path = text.split(' ').nth(1).unwrap_or_default().to_owned();
                *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
                match route(&path) {
                    Raw::Close => {}
                    Raw::Silent => std::future::pending().await,
                    Raw::Garbage(bytes) => {
                        let _ = stream.write_all(bytes).await;
                        std::future::pending::<()>().await;
                    }
                    Raw::Trickle(body, pieces, pause) => {
                        let head =
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                        if stream.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        for piece in body.chunks(body.len().div_ceil(pieces).max(1)) {
                            tokio::time::sleep(pause).await;
                            if stream.write_all(piece).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (host, hits)
}

fn hits_of(hits: &Hits, path: &str) -> usize {
    hits.lock().unwrap().get(path).copied().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// a real OCI registry: Debian's docker-registry

struct Registry {
    /// `127.0.0.1:<port>`.
    host: String,
    _process: testenv::Proc,
    dir: tempfile::TempDir,
}

fn docker_registry() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("docker-registry"))
        .find(|path| path.is_file())
        .expect(
            "docker-registry is not installed: run `make setup` (hack/ensure-docker-registry.sh)",
        )
}

impl Registry {
    async fn start() -> Self {
        Self::start_with(None).await
    }

    /// A registry with HTTP basic auth (`htpasswd`, bcrypt as `htpasswd -B` writes) for
    /// `(user, password)`, or anonymous.
    async fn start_with(user: Option<(&str, &str)>) -> Self {
        module_manager::source::ensure_crypto_provider();
        let binary = docker_registry();
        let dir = tempfile::tempdir().unwrap();
        let auth = match user {
            Some((user, password)) => {
                let hash = bcrypt::hash_with_result(password, 5)
                    .unwrap()
                    .format_for_version(bcrypt::Version::TwoY);
                let file = dir.path().join("htpasswd");
                std::fs::write(&file, format!("{user}:{hash}\n")).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: charts\n    path: {}\n",
                    file.display()
                )
            }
            None => String::new(),
        };
        let mut last = String::new();
        // A port picked here may be taken before the registry binds it: try a few.
        for _ in 0..5 {
            let host = format!("127.0.0.1:{}", closed_port());
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n{auth}",
                    dir.path().join("data").display()
                ),
            )
            .unwrap();
            let mut command = Command::new(&binary);
            command.arg("serve").arg(&config);
            let mut process = testenv::Proc::spawn(
                "docker-registry",
                command,
                &dir.path().join("registry.log"),
                testenv::Lifetime::TiedToThisProcess,
            )
            .unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && process.check_running().is_ok() {
                if let Ok(response) = reqwest::get(format!("http://{host}/v2/")).await
                    && (response.status().is_success()
                        || (user.is_some() && response.status() == StatusCode::UNAUTHORIZED))
                {
                    return Self {
                        host,
                        _process: process,
                        dir,
                    };
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            last = process.log_tail();
        }
        panic!("docker-registry did not start: {last}");
    }

    /// `helm push` of a packaged chart to `oci://<host>/charts`; returns the manifest digest.
    fn push(&self, tgz: &[u8], name: &str) -> String {
        self.push_as(tgz, name, None)
    }

    /// [`Registry::push`] as `(user, password)` (helm's `--username`, `--password`).
    fn push_as(&self, tgz: &[u8], name: &str, user: Option<(&str, &str)>) -> String {
        self.push_into(tgz, name, "charts", user)
    }

    /// `helm push` to `oci://<host>/<repository>`, as `user` if given; the manifest digest.
    fn push_into(
        &self,
        tgz: &[u8],
        name: &str,
        repository: &str,
        user: Option<(&str, &str)>,
    ) -> String {
        let file = self.dir.path().join(name);
        std::fs::write(&file, tgz).unwrap();
        let home = tempfile::tempdir().unwrap();
        let (to, file) = (
            format!("oci://{}/{repository}", self.host),
            file.display().to_string(),
        );
        let mut args = vec!["push", &file, &to, "--plain-http"];
        if let Some((user, password)) = &user {
            args.extend(["--username", user, "--password", password]);
        }
        let output = helm(home.path(), &args);
        output
            .lines()
            .find_map(|l| l.strip_prefix("Digest: "))
            .unwrap_or_else(|| panic!("no digest in {output}"))
            .trim()
            .to_owned()
    }

    /// Pushes the catalog chart's archive as a plain OCI image (not Helm's media types).
    async fn push_as_image(&self, tgz: &[u8], repository: &str) {
        let client = oci_client::Client::new(oci_client::client::ClientConfig {
            protocol: oci_client::client::ClientProtocol::Http,
            ..Default::default()
        });
        let reference: oci_client::Reference =
            format!("{}/{repository}:1.0.0", self.host).parse().unwrap();
        let layer = oci_client::client::ImageLayer::new(
            tgz.to_vec(),
            oci_client::manifest::IMAGE_LAYER_GZIP_MEDIA_TYPE.to_owned(),
            None,
        );
        let config = oci_client::client::Config::new(
            b"{}".to_vec(),
            oci_client::manifest::IMAGE_CONFIG_MEDIA_TYPE.to_owned(),
            None,
        );
        client
            .push(
                &reference,
                &[layer],
                config,
                &oci_client::secrets::RegistryAuth::Anonymous,
                None,
            )
            .await
            .expect("push with oci-client");
    }
}

// ---------------------------------------------------------------------------------------------
// the resolver on its own

/// The resolver's configuration for the test's loopback servers (plain HTTP on 127.0.0.1).
fn config(cache: &Path) -> RemoteConfig {
    test_support::local_chart_hosts(RemoteConfig::new(cache.to_owned()))
}

fn remote(cache: &Path) -> RemoteCharts {
    RemoteCharts::new(config(cache)).unwrap()
}

fn from_repository(repository: &str, name: &str, version: &str) -> ChartSource {
    ChartSource {
        repository: Some(repository.into()),
        name: Some(name.into()),
        version: Some(version.into()),
        ..Default::default()
    }
}

fn from_oci(reference: &str) -> ChartSource {
    ChartSource {
        oci: Some(reference.into()),
        ..Default::default()
    }
}

async fn resolve(
    remote: &RemoteCharts,
    source: &ChartSource,
    limits: Limits,
) -> Result<ResolvedChart, SourceError> {
    remote.resolve(source, &repo(), None, limits).await
}

/// [`resolve`] of the chart at the OCI `reference`.
async fn resolve_oci(
    remote: &RemoteCharts,
    reference: &str,
    limits: Limits,
) -> Result<ResolvedChart, SourceError> {
    resolve(remote, &from_oci(reference), limits).await
}

#[tokio::test]
async fn a_repository_chart_is_resolved_verified_and_cached_by_digest() {
    let server = RepoServer::start().await;
    let repository = server.publish_catalog();
    let cache = tempfile::tempdir().unwrap();
    let charts = remote(cache.path());
    let limits = Limits::default();
    let catalog = |version: &str| from_repository(&repository, "catalog", version);

    let exact = resolve(&charts, &catalog("1.0.0"), limits).await.unwrap();
    assert_eq!(exact.digest, format!("sha256:{}", sha256(&packaged().v1)));
    assert_eq!(std::fs::read(&exact.path).unwrap(), packaged().v1);
    assert!(exact.path.starts_with(cache.path()));
    for (range, expected) in [
        ("^1", &packaged().v1),
        (">=1.0 <3", &packaged().v2),
        ("2.x", &packaged().v2),
        ("~1.0.0 || ~2.0.0", &packaged().v2),
    ] {
        let chart = resolve(&charts, &catalog(range), limits).await.unwrap();
        assert_eq!(
            chart.digest,
            format!("sha256:{}", sha256(expected)),
            "{range}"
        );
    }
    // One index download within its time to live; each archive downloaded once.
    assert_eq!(server.hits("/charts/index.yaml"), 1);
    assert_eq!(server.hits("/charts/catalog-1.0.0.tgz"), 1);
    assert_eq!(server.hits("/charts/catalog-2.0.0.tgz"), 1);
    assert_eq!(charts.stats().cache_hits, 3);

    // Another resolver on the same cache directory (a restarted replica), with the index not
    // kept in memory: the index is fetched again, the archive is not.
    let restarted = RemoteCharts::new(RemoteConfig {
        index_ttl: Duration::ZERO,
        ..config(cache.path())
    })
    .unwrap();
    let again = resolve(&restarted, &catalog("1.0.0"), limits)
        .await
        .unwrap();
    assert_eq!(again, exact);
    assert_eq!(server.hits("/charts/index.yaml"), 2);
    assert_eq!(
        server.hits("/charts/catalog-1.0.0.tgz"),
        1,
        "served from the disk cache"
    );
    assert_eq!(restarted.stats().archive_downloads, 0);

    // URLs in the index may point elsewhere (absolute), and a repository may redirect.
    server.put(
        "/elsewhere/index.yaml",
        index_yaml(&[(
            "catalog",
            "1.0.0",
            &sha256(&packaged().v2), // a different archive: v2's, published as 1.0.0
            &format!("{}/moved/catalog.tgz", server.url),
        )]),
    );
    server.redirect("/moved/catalog.tgz", "/charts/catalog-2.0.0.tgz");
    let moved = resolve(
        &charts,
        &from_repository(&format!("{}/elsewhere/", server.url), "catalog", "1.0.0"),
        limits,
    )
    .await
    .unwrap();
    assert_eq!(moved.digest, format!("sha256:{}", sha256(&packaged().v2)));
}

/// Each bad repository or archive: its error (naming the repository), permanent or not, and
/// nothing of it in the cache.
#[tokio::test]
async fn bad_repositories_and_archives_fail_with_clear_errors() {
    let server = RepoServer::start().await;
    let good = server.publish_catalog();
    let base = server.url.clone();
    let cache = tempfile::tempdir().unwrap();
    let charts = RemoteCharts::new(RemoteConfig {
        max_index_bytes: 64 * 1024,
        ..config(cache.path())
    })
    .unwrap();

    server.put("/broken/index.yaml", "apiVersion: v1\nentries: {catalog: [");
    server.put(
        "/html/index.yaml",
        "<html><body>Not a repository</body></html>",
    );
    server.put("/huge/index.yaml", vec![b'#'; 65 * 1024]);
    // 53 KiB that a decoder expanding aliases makes 2048 copies of a 16 KiB string (32 MiB;
    // with the default 8 MiB limit the same shape reaches hundreds of GB).
    let mut bomb = format!(
        "apiVersion: v1\nx: &a \"{}\"\nentries:\n  catalog:\n",
        "v".repeat(16 << 10)
    );
    for _ in 0..2048 {
        bomb.push_str("  - {version: *a}\n");
    }
    server.put("/aliases/index.yaml", bomb);
    // What an internal endpoint might answer: nothing of it may reach a message.
    server.put(
        "/leak/index.yaml",
        "{\"Token\": \"s3cret\"}\ns3cret s3cret\n",
    );
    // The index says v1's digest; the server has v2's archive under v1's name.
    server.put("/mismatch/index.yaml", packaged().index.clone());
    server.put("/mismatch/catalog-1.0.0.tgz", packaged().v2.clone());
    let mut hostile = hostile_archives(4 << 20);
    hostile.push(("notgzip", b"this is not a gzip stream".to_vec()));
    let mut entries = server.put_archives("/hostile", &hostile);
    entries.push(("nodigest", "1.0.0", "''".into(), "x.tgz".into()));
    entries.push((
        "baddigest",
        "1.0.0",
        "../../../etc/passwd".into(),
        "x.tgz".into(),
    ));
    entries.push((
        "fileurl",
        "1.0.0",
        sha256(b"x"),
        "file:///etc/passwd".into(),
    ));
    entries.push(("gone", "1.0.0", sha256(b"x"), "gone.tgz".into()));
    entries.push(("looping", "1.0.0", sha256(b"x"), "loop.tgz".into()));
    server.put("/hostile/index.yaml", owned_index_yaml(&entries));
    server.redirect("/hostile/loop.tgz", "/hostile/loop.tgz");
    let closed = format!("http://127.0.0.1:{}/charts", closed_port());
    let small = Limits {
        max_files: 100,
        max_bytes: 1 << 20,
    };

    let mismatch = format!(
        "digest mismatch: expected sha256:{}",
        sha256(&packaged().v1)
    );
    // (case, repository path on the server, chart, version, expected): read with the `small`
    // limits, each a permanent error.
    let served = [
        (
            "malformed index",
            "/broken",
            "catalog",
            "1.0.0",
            "malformed index.yaml",
        ),
        (
            "not an index",
            "/html",
            "catalog",
            "1.0.0",
            "malformed index.yaml",
        ),
        (
            "alias bomb",
            "/aliases",
            "catalog",
            "1.0.0",
            "anchors and aliases are not accepted",
        ),
        // The alias check lets it through (nothing in it could be an alias); the decoder's
        // refusal names no content.
        (
            "a body that is not YAML, not quoted",
            "/leak",
            "catalog",
            "1.0.0",
            "malformed index.yaml: not a Helm repository index",
        ),
        (
            "oversized index",
            "/huge",
            "catalog",
            "1.0.0",
            "exceeds the limit of 65536 bytes",
        ),
        (
            "no index",
            "/nothing",
            "catalog",
            "1.0.0",
            "answered HTTP 404",
        ),
        (
            "unknown chart",
            "/charts",
            "nope",
            "1.0.0",
            "has no chart \"nope\" (it has 1 charts: catalog)",
        ),
        (
            "no match",
            "/charts",
            "catalog",
            "^3",
            "no version matches \"^3\"",
        ),
        (
            "unknown version",
            "/charts",
            "catalog",
            "9.9.9",
            "no version matches \"9.9.9\" (available: 2.0.0, 1.0.0)",
        ),
        (
            "bad range",
            "/charts",
            "catalog",
            ">>1",
            "not a version of the chart nor a valid range",
        ),
        (
            "digest mismatch",
            "/mismatch",
            "catalog",
            "1.0.0",
            &mismatch,
        ),
        (
            "../ in the archive",
            "/hostile",
            "dotdot",
            "1.0.0",
            "escapes the chart",
        ),
        (
            "absolute path",
            "/hostile",
            "absolute",
            "1.0.0",
            "escapes the chart",
        ),
        (
            "symlink",
            "/hostile",
            "link",
            "1.0.0",
            "is not a regular file",
        ),
        (
            "unpacks too large",
            "/hostile",
            "bomb",
            "1.0.0",
            "exceeds the limit of 1048576 bytes",
        ),
        (
            "not gzip",
            "/hostile",
            "notgzip",
            "1.0.0",
            "is not a valid .tgz",
        ),
        (
            "no digest",
            "/hostile",
            "nodigest",
            "1.0.0",
            "is not a sha256 digest",
        ),
        (
            "digest as a path",
            "/hostile",
            "baddigest",
            "1.0.0",
            "is not a sha256 digest",
        ),
        (
            "file URL",
            "/hostile",
            "fileurl",
            "1.0.0",
            "only http and https",
        ),
        (
            "archive gone",
            "/hostile",
            "gone",
            "1.0.0",
            "hostile/gone.tgz answered HTTP 404",
        ),
        (
            "redirect loop",
            "/hostile",
            "looping",
            "1.0.0",
            "more than 5 redirects",
        ),
    ];
    let mut cases: Vec<(&str, ChartSource, Limits, &str, bool)> = served
        .into_iter()
        .map(|(case, path, chart, version, expected)| {
            let source = from_repository(&format!("{base}{path}"), chart, version);
            (case, source, small, expected, true)
        })
        .collect();
    let tiny = Limits {
        max_files: 100,
        max_bytes: 100,
    };
    let credentials = format!("http://user:s3cret@{}/charts", &base[7..]);
    cases.extend([
        (
            "download too large",
            from_repository(&good, "catalog", "1.0.0"),
            tiny,
            "exceeds the limit of 100 bytes",
            true,
        ),
        (
            "file repository",
            from_repository("file:///etc", "catalog", "1.0.0"),
            small,
            "only http and https",
            true,
        ),
        (
            "credentials",
            from_repository(&credentials, "catalog", "1.0.0"),
            small,
            "carries credentials",
            true,
        ),
        (
            "unreachable",
            from_repository(&closed, "catalog", "1.0.0"),
            small,
            "could not be reached or did not answer in time",
            false,
        ),
    ]);
    for (case, source, limits, expected, permanent) in cases {
        let error = resolve(&charts, &source, limits).await.unwrap_err();
        let message = error.to_string();
        assert!(message.contains(expected), "{case}: {message}");
        assert_eq!(error.is_permanent(), permanent, "{case}: {message}");
        assert!(!message.contains("s3cret"), "{case}: {message}");
        if let Some(repository) = source.repository.as_deref().filter(|r| !r.contains('@')) {
            assert!(
                message.contains(repository.trim_end_matches('/')),
                "{case}: {message}"
            );
        }
        assert!(
            matches!(error, SourceError::Fetch { .. }),
            "{case}: {error:?}"
        );
    }
    // A server in trouble is retried: 5xx, and no answer within the fetch timeout.
    server.reply(
        "/flaky/index.yaml",
        Reply::Status(StatusCode::SERVICE_UNAVAILABLE),
    );
    server.reply("/silent/index.yaml", Reply::Hang);
    let impatient = RemoteCharts::new(RemoteConfig {
        timeout: Duration::from_secs(1),
        ..config(cache.path())
    })
    .unwrap();
    for (path, expected) in [
        ("/flaky", "/flaky/index.yaml answered HTTP 503"),
        ("/silent", "could not be reached or did not answer in time"),
    ] {
        let source = from_repository(&format!("{base}{path}"), "catalog", "1.0.0");
        let error = resolve(&impatient, &source, small).await.unwrap_err();
        assert!(error.to_string().contains(expected), "{error}");
        assert!(!error.is_permanent(), "{error}");
    }

    let cached: Vec<_> = std::fs::read_dir(cache.path())
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(cached.is_empty(), "nothing bad was cached: {cached:?}");
}

#[tokio::test]
async fn an_oci_chart_is_pulled_from_a_real_registry_and_cached() {
    let registry = Registry::start().await;
    let manifest_digest = registry.push(&packaged().v1, "catalog-1.0.0.tgz");
    registry.push(&packaged().v2, "catalog-2.0.0.tgz");
    let cache = tempfile::tempdir().unwrap();
    let charts = remote(cache.path());
    let limits = Limits::default();
    let host = &registry.host;
    let catalog = |reference: &str| format!("oci://{host}/charts/catalog{reference}");

    let v1 = resolve_oci(&charts, &catalog(":1.0.0"), limits)
        .await
        .unwrap();
    // The chart layer is the archive helm packaged, byte for byte.
    assert_eq!(v1.digest, format!("sha256:{}", sha256(&packaged().v1)));
    assert_eq!(std::fs::read(&v1.path).unwrap(), packaged().v1);
    let v2 = resolve_oci(&charts, &catalog(":2.0.0"), limits)
        .await
        .unwrap();
    assert_eq!(v2.digest, format!("sha256:{}", sha256(&packaged().v2)));
    let pinned = resolve_oci(&charts, &catalog(&format!("@{manifest_digest}")), limits)
        .await
        .unwrap();
    assert_eq!(pinned, v1);
    let stats = charts.stats();
    assert_eq!(
        (
            stats.manifest_requests,
            stats.archive_downloads,
            stats.cache_hits
        ),
        (3, 2, 1),
        "the pinned pull needed the manifest only"
    );
    // Within the index time to live a tag needs no manifest request, and a digest never again.
    for reference in [
        format!("oci://{host}/charts/catalog:1.0.0"),
        format!("oci://{host}/charts/catalog@{manifest_digest}"),
    ] {
        let again = resolve_oci(&charts, &reference, limits).await.unwrap();
        assert_eq!(again, v1, "{reference}");
    }
    let stats = charts.stats();
    assert_eq!((stats.manifest_requests, stats.cache_hits), (3, 3));

    // Bad references and artifacts.
    registry
        .push_as_image(&packaged().v1, "images/catalog")
        .await;
    let missing = format!("sha256:{}", "0".repeat(64));
    let closed = format!("127.0.0.1:{}", closed_port());
    let cases = [
        (
            format!("oci://{host}/images/catalog:1.0.0"),
            limits,
            "is not a Helm chart's",
            true,
        ),
        (
            format!("oci://{host}/charts/catalog:9.9.9"),
            limits,
            "not found in the registry",
            true,
        ),
        (
            format!("oci://{host}/charts/catalog@{missing}"),
            limits,
            "not found in the registry",
            true,
        ),
        (
            format!("oci://{host}/charts/nothing:1.0.0"),
            limits,
            "not found in the registry",
            true,
        ),
        (
            format!("oci://{host}/charts/catalog"),
            limits,
            "names no tag or digest",
            true,
        ),
        (
            format!("oci://{host}/charts/catalog:2.0.0"),
            Limits {
                max_files: 100,
                max_bytes: 100,
            },
            "exceeds the limit of 100 bytes",
            true,
        ),
        (
            format!("oci://{closed}/charts/catalog:1.0.0"),
            limits,
            "could not be reached or did not answer in time",
            false,
        ),
    ];
    for (reference, limits, expected, permanent) in cases {
        let error = resolve_oci(&charts, &reference, limits).await.unwrap_err();
        let message = error.to_string();
        assert!(message.contains(expected), "{reference}: {message}");
        assert!(
            message.contains(&reference),
            "names the reference: {message}"
        );
        assert_eq!(error.is_permanent(), permanent, "{reference}: {message}");
        assert!(matches!(
            error,
            SourceError::Fetch { ref error, .. } if !matches!(error, FetchError::Chart(_))
        ));
    }
}

/// A registry that lies: the test's HTTP server answering the distribution API with hostile
/// content (a real registry refuses to store such manifests).
#[tokio::test]
async fn a_hostile_registry_is_refused() {
    let server = RepoServer::start().await;
    let host = server.url.trim_start_matches("http://").to_owned();
    server.put("/v2/", "{}");
    server.put("/v2/charts/huge/manifests/1.0.0", vec![b' '; 5 << 20]);
    let body = helm_manifest(&format!("sha256:{}", sha256(b"x")), 1);
    server.reply(
        "/v2/charts/lying/manifests/1.0.0",
        Reply::Digested(body, format!("sha256:{}", "0".repeat(64))),
    );
    server.put(
        "/v2/charts/index/manifests/1.0.0",
        json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
               "manifests": []})
        .to_string(),
    );
    // A layer that claims 100 bytes and sends 2 MiB.
    let big = vec![7u8; 2 << 20];
    let big_digest = format!("sha256:{}", sha256(&big));
    server.put(
        "/v2/charts/big/manifests/1.0.0",
        helm_manifest(&big_digest, 100),
    );
    server.put(&format!("/v2/charts/big/blobs/{big_digest}"), big);

    let cache = tempfile::tempdir().unwrap();
    let charts = remote(cache.path());
    let small = Limits {
        max_files: 100,
        max_bytes: 1 << 20,
    };
    for (chart, expected, permanent) in [
        ("huge", "exceeds the limit of 4194304 bytes", true),
        ("lying", "digest mismatch", true),
        ("index", "is an image index, not a Helm chart", true),
        (
            "big",
            "chart layer exceeds the limit of 1048576 bytes",
            true,
        ),
    ] {
        let reference = format!("oci://{host}/charts/{chart}:1.0.0");
        let error = resolve_oci(&charts, &reference, small).await.unwrap_err();
        assert!(error.to_string().contains(expected), "{chart}: {error}");
        assert_eq!(error.is_permanent(), permanent, "{chart}: {error}");
    }
}

/// Endless answers, chunked (no `Content-Length` to refuse them by): an index, an archive, a
/// registry's token realm, a chart layer, and a layer's error answer. Each is cut off at its
/// limit (nothing reads such a body whole), and nothing of them is quoted.
#[tokio::test]
async fn endless_answers_are_cut_off_at_their_limit() {
    const ENDLESS: u64 = 256 << 20;
    /// Far below ENDLESS, far above a limit plus what socket buffers hold.
    const READ_AT_MOST: u64 = 48 << 20;
    let small = Limits {
        max_files: 100,
        max_bytes: 1 << 20,
    };
    let cache = tempfile::tempdir().unwrap();
    let charts = remote(cache.path());
    let layer = format!("sha256:{}", sha256(b"layer"));

    // A registry whose token realm never stops talking.
    let tokens = RepoServer::start().await;
    let host = tokens.url.trim_start_matches("http://").to_owned();
    tokens.reply(
        "/v2/",
        Reply::Challenge(format!(
            "Bearer realm=\"{}/token\",service=\"registry\"",
            tokens.url
        )),
    );
    tokens.reply("/token", Reply::Stream(StatusCode::OK, ENDLESS));
    tokens.put("/v2/charts/web/manifests/1.0.0", helm_manifest(&layer, 100));
    let error = resolve_oci(&charts, &format!("oci://{host}/charts/web:1.0.0"), small)
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("exceeds the limit"), "token: {message}");
    assert!(!message.contains("s3cret"), "token: {message}");
    assert!(
        tokens.streamed() < READ_AT_MOST,
        "token: {} bytes read",
        tokens.streamed()
    );
    assert_eq!(tokens.hits("/v2/charts/web/manifests/1.0.0"), 0);

    // A registry (no auth) whose layer answers endlessly: an error, then a success.
    for (status, expected, permanent) in [
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "answered HTTP 500",
            false,
        ),
        (StatusCode::OK, "exceeds the limit of 1048576 bytes", true),
    ] {
        let registry = RepoServer::start().await;
        let host = registry.url.trim_start_matches("http://").to_owned();
        registry.put("/v2/", "{}");
        registry.put("/v2/charts/web/manifests/1.0.0", helm_manifest(&layer, 100));
        registry.reply(
            &format!("/v2/charts/web/blobs/{layer}"),
            Reply::Stream(status, ENDLESS),
        );
        let error = resolve_oci(&charts, &format!("oci://{host}/charts/web:1.0.0"), small)
            .await
            .unwrap_err();
        let message = error.to_string();
        assert!(message.contains(expected), "layer {status}: {message}");
        assert!(!message.contains("s3cret"), "layer {status}: {message}");
        assert_eq!(error.is_permanent(), permanent, "layer {status}: {message}");
        let read = registry.streamed();
        assert!(read < READ_AT_MOST, "layer {status}: {read} bytes read");
    }

    // A repository whose index, or archive, never ends.
    let repository = RepoServer::start().await;
    repository.reply(
        "/endless/index.yaml",
        Reply::Stream(StatusCode::OK, ENDLESS),
    );
    repository.put(
        "/archive/index.yaml",
        index_yaml(&[("web", "1.0.0", &sha256(b"x"), "web.tgz")]),
    );
    repository.reply("/archive/web.tgz", Reply::Stream(StatusCode::OK, ENDLESS));
    for (path, expected) in [
        ("/endless", "index.yaml exceeds the limit of 8388608 bytes"),
        ("/archive", "web.tgz exceeds the limit of 1048576 bytes"),
    ] {
        let before = repository.streamed();
        let source = from_repository(&format!("{}{path}", repository.url), "web", "1.0.0");
        let message = resolve(&charts, &source, small)
            .await
            .unwrap_err()
            .to_string();
        assert!(message.contains(expected), "{path}: {message}");
        let read = repository.streamed() - before;
        assert!(read < READ_AT_MOST, "{path}: {read} bytes read");
    }
}

/// The message of a fetch error, without the origin (which names the chart and repository).
fn fetch_message(error: &SourceError) -> String {
    match error {
        SourceError::Fetch { error, .. } => error.to_string(),
        other => panic!("not a fetch error: {other}"),
    }
}

/// The [`fetch_message`] a tenant without credentials gets resolving `source`; fails with
/// `served` when the chart is served to it.
async fn refused_without_credentials(
    charts: &RemoteCharts,
    source: &ChartSource,
    served: &str,
) -> String {
    let error = resolve_as(charts, source, None).await.expect_err(served);
    fetch_message(&error)
}

/// Chart hosts at loopback, private, link-local (metadata) and other reserved addresses are
/// refused before any connection — written as IP literals in any form, resolved from a name,
/// reached by a redirect, a chart URL of the index or an OCI token realm — and plain http is
/// refused, unless the operator allows them; nothing reaches the servers behind them.
#[tokio::test]
async fn private_hosts_and_plain_http_are_refused_unless_allowed() {
    let server = RepoServer::start().await;
    server.publish_catalog();
    let port = server.url.rsplit(':').next().unwrap().to_owned();
    // Another loopback address, standing for an internal service: reaching it would succeed.
    let inside = RepoServer::start_on("127.0.0.2:0").await;
    inside.publish_catalog();
    inside.put("/token", r#"{"token": "t"}"#);
    let cache = tempfile::tempdir().unwrap();
    let strict = RemoteCharts::new(RemoteConfig::new(cache.path().to_owned())).unwrap();
    let public_only = RemoteCharts::new(RemoteConfig {
        allow_plain_http: true,
        ..RemoteConfig::new(cache.path().to_owned())
    })
    .unwrap();
    let local = remote(cache.path());

    server.redirect(
        "/to-inside/index.yaml",
        &format!("{}/charts/index.yaml", inside.url),
    );
    server.redirect(
        "/to-metadata/index.yaml",
        "http://169.254.169.254/latest/meta-data/",
    );
    server.redirect("/to-mapped/index.yaml", "http://[::ffff:a9fe:a9fe]/latest/");
    let v1 = sha256(&packaged().v1);
    let absolute = format!("{}/charts/catalog-1.0.0.tgz", inside.url);
    server.put(
        "/absolute/index.yaml",
        index_yaml(&[("catalog", "1.0.0", &v1, &absolute)]),
    );
    server.reply(
        "/v2/",
        Reply::Challenge(format!(
            "Bearer realm=\"{}/token\",service=\"r\"",
            inside.url
        )),
    );
    let oci_here = format!("oci://127.0.0.1:{port}/charts/catalog:1.0.0");
    let at = |path: &str| from_repository(&format!("{}{path}", server.url), "catalog", "1.0.0");
    let plain = "is plain http, which chart sources may not use (an operator may allow it with --allow-insecure-http)";
    let loopback = "the host 127.0.0.1 has a loopback address, which chart sources may not reach (an operator may allow the range with --allow-private-chart-hosts)";
    let cases: Vec<(&str, &RemoteCharts, ChartSource, String)> = vec![
        (
            "plain http",
            &strict,
            from_repository("http://10.1.2.3/charts", "catalog", "1.0.0"),
            plain.into(),
        ),
        (
            "plain http by name",
            &strict,
            from_repository("http://charts.example.com/stable", "catalog", "1.0.0"),
            plain.into(),
        ),
        (
            "loopback literal",
            &public_only,
            at("/charts"),
            loopback.into(),
        ),
        (
            "loopback in decimal",
            &public_only,
            from_repository(
                &format!("http://2130706433:{port}/charts"),
                "catalog",
                "1.0.0",
            ),
            loopback.into(),
        ),
        (
            "loopback by name",
            &public_only,
            from_repository(
                &format!("http://localhost:{port}/charts"),
                "catalog",
                "1.0.0",
            ),
            "the host localhost has a loopback address".into(),
        ),
        (
            "loopback registry",
            &public_only,
            from_oci(&oci_here),
            loopback.into(),
        ),
        (
            "metadata",
            &public_only,
            from_repository("http://169.254.169.254/latest", "catalog", "1.0.0"),
            "has a link-local (or cloud metadata) address".into(),
        ),
        (
            "private",
            &public_only,
            from_repository("https://10.1.2.3/charts", "catalog", "1.0.0"),
            "the host 10.1.2.3 has a private address".into(),
        ),
        (
            "ULA",
            &public_only,
            from_repository("https://[fd00::1]/charts", "catalog", "1.0.0"),
            "the host [fd00::1] has a private address".into(),
        ),
        (
            "redirect inside",
            &local,
            at("/to-inside"),
            "the host 127.0.0.2 has a loopback address".into(),
        ),
        (
            "redirect to metadata",
            &local,
            at("/to-metadata"),
            "the host 169.254.169.254 has a link-local".into(),
        ),
        (
            "redirect to an IPv4-mapped address",
            &local,
            at("/to-mapped"),
            "the host [::ffff:a9fe:a9fe] has a link-local".into(),
        ),
        (
            "chart URL inside",
            &local,
            at("/absolute"),
            "the host 127.0.0.2 has a loopback address".into(),
        ),
        (
            "token realm inside",
            &local,
            from_oci(&oci_here),
            "the host 127.0.0.2 has a loopback address".into(),
        ),
    ];
    for (case, charts, source, expected) in cases {
        if !std::ptr::eq(charts, &local) {
            assert_eq!(server.all_hits(), 0, "{case}: nothing reached the server");
        }
        let error = resolve(charts, &source, Limits::default())
            .await
            .unwrap_err();
        let message = error.to_string();
        assert!(message.contains(&expected), "{case}: {message}");
        assert!(error.is_permanent(), "{case}: {message}");
        assert!(
            matches!(
                &error,
                SourceError::Fetch {
                    error: FetchError::Refused(_),
                    ..
                }
            ),
            "{case}: {error:?}"
        );
    }
    assert_eq!(inside.all_hits(), 0, "nothing reached the inside server");
    // Allowed: by name too (the resolver keeps 127.0.0.1, drops ::1).
    let by_name = from_repository(
        &format!("http://localhost:{port}/charts"),
        "catalog",
        "1.0.0",
    );
    let chart = resolve(&local, &by_name, Limits::default()).await.unwrap();
    assert_eq!(chart.digest, format!("sha256:{v1}"));
}

/// Refused, reset, no answer, an answer that is not HTTP, TLS to a plain server, a name that
/// does not resolve: one message, so that a Manifest's status cannot tell which internal ports
/// are open. (Messages that named the cause — `Connection refused`, `timed out`, a parse
/// error — make this fail.)
#[tokio::test]
async fn unreachable_hosts_read_the_same_whatever_the_cause() {
    let (closing, _) = raw_server(|_| Raw::Close).await;
    let (silent, _) = raw_server(|_| Raw::Silent).await;
    let (ssh, _) = raw_server(|_| Raw::Garbage(b"SSH-2.0-OpenSSH_9.6\r\n")).await;
    let plain = RepoServer::start().await;
    let tls_to_plain = plain.url.replace("http://", "https://");
    let cache = tempfile::tempdir().unwrap();
    let charts = RemoteCharts::new(RemoteConfig {
        timeout: Duration::from_secs(2),
        ..config(cache.path())
    })
    .unwrap();
    let closed = format!("http://127.0.0.1:{}", closed_port());
    let mut messages = std::collections::BTreeMap::new();
    for base in [
        closed,
        format!("http://{closing}"),
        format!("http://{silent}"),
        format!("http://{ssh}"),
        tls_to_plain,
        "http://no-such-host.invalid".to_owned(),
    ] {
        let source = from_repository(&format!("{base}/charts"), "catalog", "1.0.0");
        let error = resolve(&charts, &source, Limits::default())
            .await
            .unwrap_err();
        assert!(!error.is_permanent(), "{base}: {error}");
        let host = base.split("://").nth(1).unwrap();
        let message = fetch_message(&error).replace(host, "HOST");
        messages.entry(message).or_insert_with(Vec::new).push(base);
    }
    assert_eq!(
        messages.len(),
        1,
        "one message for every cause: {messages:#?}"
    );
    let message = messages.keys().next().unwrap();
    assert_eq!(
        message,
        "HOST could not be reached or did not answer in time"
    );
}

/// A repository that trickles its answer, or never answers, gives the fetch up at its deadline;
/// and the deadline is the whole fetch's, not each request's: an index that takes most of it
/// leaves the archive only the rest.
#[tokio::test]
async fn a_trickling_or_silent_repository_cannot_hold_a_fetch() {
    let v1 = Arc::new(packaged().v1.clone());
    let index = Arc::new(index_yaml(&[(
        "catalog",
        "1.0.0",
        &sha256(&v1),
        "catalog-1.0.0.tgz",
    )]));
    let (host, hits) = raw_server(move |path| match path {
        // 1 MiB at 10 bytes a second.
        "/endless/index.yaml" => Raw::Trickle(
            Arc::new(vec![b'#'; 1 << 20]),
            1 << 20,
            Duration::from_millis(100),
        ),
        "/silent/index.yaml" => Raw::Silent,
        // 5 s and 8 s: each within a 10 s deadline alone, not together.
        "/slow/index.yaml" => Raw::Trickle(index.clone(), 20, Duration::from_millis(250)),
        "/slow/catalog-1.0.0.tgz" => Raw::Trickle(v1.clone(), 20, Duration::from_millis(400)),
        _ => Raw::Close,
    })
    .await;
    let cache = tempfile::tempdir().unwrap();
    let with_timeout = |seconds| {
        RemoteCharts::new(RemoteConfig {
            timeout: Duration::from_secs(seconds),
            ..config(cache.path())
        })
        .unwrap()
    };
    let (impatient, patient) = (with_timeout(2), with_timeout(10));
    for (charts, path) in [
        (&impatient, "/endless"),
        (&impatient, "/silent"),
        (&patient, "/slow"),
    ] {
        let source = from_repository(&format!("http://{host}{path}"), "catalog", "1.0.0");
        // A bound on the test only, far above the deadlines: a fetch held on fails here.
        let fetch = resolve(charts, &source, Limits::default());
        let error = tokio::time::timeout(Duration::from_secs(120), fetch)
            .await
            .unwrap_or_else(|_| panic!("{path}: the fetch was held"))
            .unwrap_err();
        assert_eq!(
            fetch_message(&error),
            format!("{host} could not be reached or did not answer in time"),
            "{path}"
        );
        assert!(!error.is_permanent(), "{path}: {error}");
    }
    assert_eq!(hits_of(&hits, "/slow/index.yaml"), 1);
    assert_eq!(
        hits_of(&hits, "/slow/catalog-1.0.0.tgz"),
        1,
        "the index arrived within the deadline and the archive was asked for"
    );
}

/// The chart cache's cap is hard: an archive that would take it past the cap, counting the
/// archives in use, is refused (and retried later), and the directory never holds more.
#[tokio::test]
async fn the_chart_cache_refuses_what_would_exceed_its_cap() {
    let server = RepoServer::start().await;
    let repository = server.publish_catalog();
    let cache = tempfile::tempdir().unwrap();
    let (v1, v2) = (&packaged().v1, &packaged().v2);
    let cap = (v1.len().max(v2.len()) * 3 / 2) as u64;
    let charts = RemoteCharts::new(RemoteConfig {
        cache_max_bytes: cap,
        ..config(cache.path())
    })
    .unwrap();
    let version = |v: &str| from_repository(&repository, "catalog", v);
    let one = resolve(&charts, &version("1.0.0"), Limits::default())
        .await
        .unwrap();
    let error = resolve(&charts, &version("2.0.0"), Limits::default())
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains(&format!(
            "the chart cache cannot take a {}-byte archive: its cap is {cap} bytes (--chart-cache-max-bytes), {} of them held by charts used in the last 10 minutes",
            v2.len() + FETCHERS_LINE,
            v1.len()
        )),
        "{message}"
    );
    assert!(!error.is_permanent(), "files in use age out: {message}");
    let held: u64 = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(held <= cap, "{held} bytes in a cache capped at {cap}");
    let again = resolve(&charts, &version("1.0.0"), Limits::default())
        .await
        .unwrap();
    assert_eq!(again, one, "what is cached is served");
}

/// The bytes an archive's list of fetchers takes in the chart cache for one fetcher (a hash and
/// a newline), counted with the archive.
const FETCHERS_LINE: usize = 65;

/// Index cache entries are one per repository path whatever queries Manifests add, bounded in
/// bytes (huge indexes), and dropped once expired.
#[tokio::test]
async fn index_cache_entries_are_bounded_and_expire() {
    const CACHED_INDEX_BYTES: u64 = 1 << 20;
    let server = RepoServer::start().await;
    let repository = server.publish_catalog();
    let cache = tempfile::tempdir().unwrap();
    let charts = RemoteCharts::new(RemoteConfig {
        index_cache_max_bytes: CACHED_INDEX_BYTES,
        ..config(cache.path())
    })
    .unwrap();
    for i in 0..20 {
        let source = from_repository(&format!("{repository}?q={i}"), "catalog", "1.0.0");
        resolve(&charts, &source, Limits::default()).await.unwrap();
    }
    let stats = charts.stats();
    assert_eq!(stats.index_downloads, 20, "another query is fetched again");
    assert_eq!(
        stats.cached_indexes, 1,
        "one entry for the repository, whatever the query"
    );

    // Huge indexes (for a cache of 1 MiB: 300 KiB each) at 20 paths: the cache keeps what fits.
    let mut huge = String::from_utf8(packaged().index.clone()).unwrap();
    while huge.len() < 300 << 10 {
        huge.push_str(&format!("# {}\n", "padding ".repeat(16)));
    }
    for i in 0..20 {
        server.put(&format!("/huge{i}/index.yaml"), huge.clone());
        server.put(
            &format!("/huge{i}/catalog-1.0.0.tgz"),
            packaged().v1.clone(),
        );
        let source = from_repository(&format!("{}/huge{i}", server.url), "catalog", "1.0.0");
        resolve(&charts, &source, Limits::default()).await.unwrap();
    }
    let stats = charts.stats();
    assert!(stats.cached_index_bytes <= CACHED_INDEX_BYTES, "{stats:?}");
    assert!(stats.cached_indexes < 20, "some were evicted: {stats:?}");

    // With a time to live of zero each index expires at once and goes when the next is stored.
    let forgetful = RemoteCharts::new(RemoteConfig {
        index_ttl: Duration::ZERO,
        ..config(cache.path())
    })
    .unwrap();
    for i in 0..5 {
        let source = from_repository(&format!("{}/huge{i}", server.url), "catalog", "1.0.0");
        resolve(&forgetful, &source, Limits::default())
            .await
            .unwrap();
    }
    let stats = forgetful.stats();
    assert_eq!(
        (stats.index_downloads, stats.cached_indexes),
        (5, 1),
        "{stats:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// the whole pipeline on a real API server

/// An operator running in this test's namespace ([`common::Operator`]) with a chart cache of its
/// own, stopped when dropped.
struct Harness {
    operator: common::Operator,
    _chart_cache: tempfile::TempDir,
}

impl std::ops::Deref for Harness {
    type Target = common::Operator;

    fn deref(&self) -> &common::Operator {
        &self.operator
    }
}

async fn start(prefix: &str) -> Harness {
    let control_plane = common::control_plane_with(Some(common::BASIC_CONTROLLERS)).await;
    let chart_cache = tempfile::tempdir().unwrap();
    let operator = common::operator_on(control_plane, prefix, 2, |context| {
        context
            .replica("test-replica")
            .chart_cache(chart_cache.path())
    })
    .await;
    Harness {
        operator,
        _chart_cache: chart_cache,
    }
}

impl Harness {
    async fn create(&self, name: &str, chart: Value, values: Value) {
        let spec = json!({"module": name, "chart": chart, "values": values, "interval": "2s"});
        self.operator
            .create(&common::manifest(&self.ns, name, spec))
            .await;
    }

    /// Replaces `spec.chart` (a merge patch would keep the fields of the previous source).
    async fn set_chart(&self, name: &str, chart: Value) {
        let patch = json!({"spec": {"chart": {
            "path": null, "repository": null, "name": null, "version": null, "oci": null,
        }}});
        let mut patch = patch;
        for (key, value) in chart.as_object().unwrap() {
            patch["spec"]["chart"][key] = value.clone();
        }
        self.manifests
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    async fn config_map_data(&self, name: &str, key: &str) -> Option<String> {
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.ns)
            .get_opt(name)
            .await
            .unwrap()
            .and_then(|cm| cm.data?.get(key).cloned())
    }

    /// Events about `manifest` as (type, reason, note).
    async fn events(&self, manifest: &str) -> Vec<(String, String, String)> {
        common::events(&self.client, &self.ns, manifest).await
    }
}

/// Installs catalog 1.0.0, upgrades it to 2.0.0 (which drops one object), through `source`.
async fn install_and_upgrade(h: &Harness, v1: Value, v2: Value) {
    h.create("catalog", v1, json!({"greeting": "hi"})).await;
    let installed = h.wait_state("catalog", ModuleState::Ready).await;
    assert_eq!(
        common::inventory_names(&installed),
        [
            "ConfigMap/catalog-legacy-settings",
            "ConfigMap/catalog-settings"
        ]
    );
    assert_eq!(
        installed.status.unwrap().chart_digest,
        Some(format!("sha256:{}", sha256(&packaged().v1)))
    );
    assert_eq!(
        h.config_map_data("catalog-settings", "version")
            .await
            .as_deref(),
        Some("1")
    );

    h.set_chart("catalog", v2).await;
    let upgraded = h.wait_state("catalog", ModuleState::Ready).await;
    assert_eq!(
        common::inventory_names(&upgraded),
        ["ConfigMap/catalog-settings"]
    );
    let status = upgraded.status.unwrap();
    assert_eq!(
        status.chart_digest,
        Some(format!("sha256:{}", sha256(&packaged().v2)))
    );
    assert_eq!(status.last_operation.unwrap().operation, "Upgrade");
    assert_eq!(
        h.config_map_data("catalog-settings", "version")
            .await
            .as_deref(),
        Some("2")
    );
    assert_eq!(
        h.config_map_data("catalog-legacy-settings", "format").await,
        None,
        "pruned"
    );
    assert_eq!(
        h.config_map_data("catalog-settings", "greeting")
            .await
            .as_deref(),
        Some("hi")
    );
}

#[tokio::test]
async fn a_module_installs_and_upgrades_from_a_helm_repository() {
    let server = RepoServer::start().await;
    let repository = server.publish_catalog();
    let h = start("http-repo").await;
    install_and_upgrade(
        &h,
        json!({"repository": repository, "name": "catalog", "version": "1.0.0"}),
        json!({"repository": repository, "name": "catalog", "version": ">=1.0 <3"}),
    )
    .await;
}

#[tokio::test]
async fn a_module_installs_and_upgrades_from_an_oci_registry() {
    let registry = Registry::start().await;
    registry.push(&packaged().v1, "catalog-1.0.0.tgz");
    registry.push(&packaged().v2, "catalog-2.0.0.tgz");
    let h = start("oci").await;
    install_and_upgrade(
        &h,
        json!({"oci": format!("oci://{}/charts/catalog:1.0.0", registry.host)}),
        json!({"oci": format!("oci://{}/charts/catalog:2.0.0", registry.host)}),
    )
    .await;
}

#[tokio::test]
async fn bad_remote_sources_are_reported_and_delete_nothing() {
    let server = RepoServer::start().await;
    let good = server.publish_catalog();
    let base = server.url.clone();
    let registry = Registry::start().await;
    registry
        .push_as_image(&packaged().v1, "images/catalog")
        .await;
    let h = start("bad-remote").await;
    h.create(
        "catalog",
        json!({"repository": good, "name": "catalog", "version": "1.0.0"}),
        json!({"greeting": "hi"}),
    )
    .await;
    h.wait_state("catalog", ModuleState::Ready).await;

    server.put("/broken/index.yaml", "apiVersion: v1\nentries: {catalog: [");
    // The digest of v1 is cached (the module runs it): publish one no archive has.
    server.put(
        "/mismatch/index.yaml",
        index_yaml(&[(
            "catalog",
            "1.0.0",
            &sha256(b"published"),
            "catalog-1.0.0.tgz",
        )]),
    );
    server.put("/mismatch/catalog-1.0.0.tgz", packaged().v2.clone());
    // The bomb unpacks to 21 MiB, over the default limit of 20 MiB, from a few KiB.
    let entries = server.put_archives("/hostile", &hostile_archives(21 << 20));
    server.put("/hostile/index.yaml", owned_index_yaml(&entries));
    let closed = format!("http://127.0.0.1:{}/charts", closed_port());
    // (case, repository path on the server, chart, version, expected): each a permanent error.
    let served = [
        (
            "malformed index.yaml",
            "/broken",
            "catalog",
            "1.0.0",
            "malformed index.yaml",
        ),
        (
            "unknown version",
            "/charts",
            "catalog",
            "9.9.9",
            "no version matches \"9.9.9\"",
        ),
        (
            "digest mismatch",
            "/mismatch",
            "catalog",
            "1.0.0",
            "digest mismatch",
        ),
        (
            "../ in the archive",
            "/hostile",
            "dotdot",
            "1.0.0",
            "escapes the chart",
        ),
        (
            "absolute path in the archive",
            "/hostile",
            "absolute",
            "1.0.0",
            "escapes the chart",
        ),
        (
            "link in the archive",
            "/hostile",
            "link",
            "1.0.0",
            "is not a regular file",
        ),
        (
            "oversized archive",
            "/hostile",
            "bomb",
            "1.0.0",
            "exceeds the limit of 20971520 bytes",
        ),
    ];
    let mut cases: Vec<(&str, Value, &str, bool)> = served
        .into_iter()
        .map(|(case, path, name, version, expected)| {
            let chart =
                json!({"repository": format!("{base}{path}"), "name": name, "version": version});
            (case, chart, expected, true)
        })
        .collect();
    cases.extend([
        (
            "wrong media type",
            json!({"oci": format!("oci://{}/images/catalog:1.0.0", registry.host)}),
            "is not a Helm chart's",
            true,
        ),
        (
            "a loopback address the operator does not allow",
            json!({"repository": "http://127.0.0.2:9/charts", "name": "catalog", "version": "1.0.0"}),
            "the host 127.0.0.2 has a loopback address, which chart sources may not reach",
            true,
        ),
        (
            "unreachable host",
            json!({"repository": closed, "name": "catalog", "version": "1.0.0"}),
            "could not be reached or did not answer in time",
            false,
        ),
    ]);
    for (case, chart, expected, permanent) in cases {
        h.set_chart("catalog", chart.clone()).await;
        let failed = h
            .wait_for("catalog", case, |m| {
                let status = m.status.clone().unwrap_or_default();
                status.state == Some(ModuleState::Error)
                    && status.observed_generation == m.metadata.generation
                    && condition(m, "Ready").is_some_and(|(_, reason, message)| {
                        reason == "ChartError" && message.contains(expected)
                    })
            })
            .await;
        let (_, _, message) = condition(&failed, "Ready").unwrap();
        let origin = chart["repository"]
            .as_str()
            .or(chart["oci"].as_str())
            .unwrap();
        assert!(
            message.contains(origin),
            "{case}: names the source: {message}"
        );
        let stalled = condition(&failed, "Stalled").unwrap().0;
        assert_eq!(stalled == "True", permanent, "{case}: permanent? {message}");
        assert_eq!(
            common::inventory_names(&failed).len(),
            2,
            "{case}: the inventory is kept"
        );
        for (config_map, key, value, what) in [
            ("catalog-settings", "version", "1", "nothing changed"),
            ("catalog-legacy-settings", "format", "xml", "nothing pruned"),
        ] {
            let data = h.config_map_data(config_map, key).await;
            assert_eq!(data.as_deref(), Some(value), "{case}: {what}");
        }
        common::expect_event(&h.client, &h.ns, "catalog", |kind, reason, note| {
            kind == "Warning" && reason == "ChartError" && note.contains(expected)
        })
        .await;
    }

    // Fixing the source recovers.
    h.set_chart(
        "catalog",
        json!({"repository": good, "name": "catalog", "version": "1.0.0"}),
    )
    .await;
    let ready = h.wait_state("catalog", ModuleState::Ready).await;
    assert_eq!(common::inventory_names(&ready).len(), 2);
    assert!(ready.uid().is_some());
}

// ---------------------------------------------------------------------------------------------
// private charts: spec.chart.secretRef

/// A server that answers only requests whose `Authorization` header is the one it requires
/// (none: every request), and records every request's path and `Authorization` header.
#[derive(Clone, Default)]
struct Guarded {
    required: Arc<Mutex<Option<String>>>,
    /// The `WWW-Authenticate` of a 401 (default: `Basic realm="charts"`).
    challenge: Arc<Mutex<Option<String>>>,
    files: Arc<Mutex<HashMap<String, Reply>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// A request's path and `Authorization` header.
type Seen = (String, Option<String>);

struct GuardedServer {
    url: String,
    host: String,
    state: Guarded,
}

impl GuardedServer {
    /// On `bind` (`127.0.0.1:0`, `127.0.0.2:0` …), requiring basic auth of `user` (or nothing).
    async fn start(bind: &str, user: Option<(&str, &str)>) -> Self {
        module_manager::source::ensure_crypto_provider();
        async fn serve(
            State(g): State<Guarded>,
            uri: Uri,
            headers: axum::http::HeaderMap,
        ) -> Response {
            let path = uri.path().to_owned();
            let auth = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            g.seen.lock().unwrap().push((path.clone(), auth.clone()));
            let required = g.required.lock().unwrap().clone();
            if required.is_some() && auth != required {
                let challenge = g.challenge.lock().unwrap().clone();
                let challenge = challenge.unwrap_or_else(|| "Basic realm=\"charts\"".into());
                let challenge = [(header::WWW_AUTHENTICATE, challenge)];
                return (StatusCode::UNAUTHORIZED, challenge).into_response();
            }
            match g.files.lock().unwrap().get(&path).cloned() {
                Some(Reply::Body(bytes)) => bytes.into_response(),
                Some(Reply::Redirect(to)) => {
                    (StatusCode::FOUND, [(header::LOCATION, to)]).into_response()
                }
                _ => StatusCode::NOT_FOUND.into_response(),
            }
        }
        let state = Guarded::default();
        let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let server = Self {
            url: format!("http://{host}"),
            host,
            state,
        };
        server.require(user);
        server
    }

    /// Requires basic auth of `user` from now on (a rotation), or nothing.
    fn require(&self, user: Option<(&str, &str)>) {
        *self.state.required.lock().unwrap() = user.map(|(u, p)| basic(u, p));
    }

    fn put(&self, path: &str, reply: Reply) {
        self.state.files.lock().unwrap().insert(path.into(), reply);
    }

    /// The catalog at `/charts`, as helm indexed it.
    fn publish_catalog(&self) -> String {
        let charts = packaged();
        self.put("/charts/index.yaml", Reply::Body(charts.index.clone()));
        self.put("/charts/catalog-1.0.0.tgz", Reply::Body(charts.v1.clone()));
        self.put("/charts/catalog-2.0.0.tgz", Reply::Body(charts.v2.clone()));
        format!("{}/charts", self.url)
    }

    /// The requests seen so far, as (path, Authorization).
    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }
}

/// `Basic base64(user:password)`.
fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}")
}

/// The credentials of a Secret `name` holding `pairs`.
fn credentials(name: &str, pairs: &[(&str, &str)]) -> Credentials {
    let data = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect();
    Credentials::from_secret(name, &data).unwrap()
}

/// A `.dockerconfigjson` with one entry, for `host`.
fn docker_config(host: &str, user: &str, password: &str) -> String {
    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    json!({"auths": {host: {"auth": auth}}}).to_string()
}

async fn resolve_as(
    remote: &RemoteCharts,
    source: &ChartSource,
    credentials: Option<&Credentials>,
) -> Result<ResolvedChart, SourceError> {
    remote
        .resolve(source, &repo(), credentials, Limits::default())
        .await
}

/// A case of refused credentials: its name, the credentials, the message expected.
type Refusal<'a> = (&'static str, Option<&'a Credentials>, String);

/// Wrong and missing credentials for `host`, and what each reads as.
fn refusals<'a>(host: &str, wrong: &'a Credentials) -> Vec<Refusal<'a>> {
    vec![
        (
            "wrong",
            Some(wrong),
            format!("authentication to {host} failed (HTTP 401): check spec.chart.secretRef"),
        ),
        (
            "missing",
            None,
            format!("{host} asks for credentials (HTTP 401): set spec.chart.secretRef"),
        ),
    ]
}

/// Each case fails for `source`, permanently, with its message, quoting no password.
async fn assert_refused(charts: &RemoteCharts, source: &ChartSource, cases: &[Refusal<'_>]) {
    for (case, credentials, expected) in cases {
        let error = resolve_as(charts, source, *credentials).await.unwrap_err();
        let message = error.to_string();
        assert!(message.contains(expected), "{case}: {message}");
        assert!(error.is_permanent(), "{case}");
        assert!(
            !message.contains(WRONG) && !message.contains(RIGHT),
            "{message}"
        );
    }
}

const RIGHT: &str = "right-pass-4b1d9e";
const WRONG: &str = "wrong-pass-77c0aa";

/// A repository behind basic auth: the right credentials fetch the chart; wrong or missing ones
/// fail with a clear message that quotes no credential — even though the chart is in the disk
/// cache by then (each Manifest proves its own access: the index is cached per credentials, and
/// the archive is served from the cache only to the credentials that downloaded it); after a
/// rotation at the server, the new credentials work; so does a bearer token.
#[tokio::test]
async fn a_repository_with_basic_auth_serves_only_the_right_credentials() {
    let server = GuardedServer::start("127.0.0.1:0", Some(("alice", RIGHT))).await;
    let repository = server.publish_catalog();
    let cache = tempfile::tempdir().unwrap();
    let charts = remote(cache.path());
    let source = from_repository(&repository, "catalog", "1.0.0");
    let right = credentials("repo-creds", &[("username", "alice"), ("password", RIGHT)]);
    let wrong = credentials("repo-creds", &[("username", "alice"), ("password", WRONG)]);

    let chart = resolve_as(&charts, &source, Some(&right)).await.unwrap();
    assert_eq!(chart.digest, format!("sha256:{}", sha256(&packaged().v1)));
    assert!(
        server
            .seen()
            .iter()
            .all(|(_, auth)| auth.as_deref() == Some(basic("alice", RIGHT).as_str())),
        "{:?}",
        server.seen()
    );
    let cases = refusals(&server.host, &wrong);
    assert_refused(&charts, &source, &cases).await;
    assert_eq!(
        charts.stats().cache_hits,
        0,
        "nothing was served from the cache"
    );

    // Rotation at the server, then in the Secret: the new credentials fetch the index again,
    // and the archive (the cache serves it only to the credentials that downloaded it); then
    // the cache serves them.
    server.require(Some(("alice", WRONG)));
    for _ in 0..2 {
        let chart = resolve_as(&charts, &source, Some(&wrong)).await.unwrap();
        assert_eq!(chart.digest, format!("sha256:{}", sha256(&packaged().v1)));
    }
    assert_eq!(charts.stats().archive_downloads, 2);
    assert_eq!(
        charts.stats().cache_hits,
        1,
        "the archive came from the cache"
    );
    assert_eq!(charts.stats().index_downloads, 2);

    // A bearer token (`bearerToken`) instead.
    *server.state.required.lock().unwrap() = Some("Bearer repo-token-9f2c".into());
    let bearer = credentials("repo-creds", &[("bearerToken", "repo-token-9f2c")]);
    resolve_as(&charts, &source, Some(&bearer)).await.unwrap();
    assert_eq!(charts.stats().index_downloads, 3);
}

/// Credentials go to the repository's own host only: not to a chart URL of the index on
/// another host, and not after a redirect to another host (reqwest drops `Authorization`
/// then) — that host sees no credentials; a redirect on the same host keeps them.
#[tokio::test]
async fn credentials_go_only_to_the_repository_host() {
    let server = GuardedServer::start("127.0.0.1:0", Some(("alice", RIGHT))).await;
    let other = GuardedServer::start("127.0.0.2:0", None).await;
    let (v1, v2) = (&packaged().v1, &packaged().v2);
    server.put(
        "/charts/index.yaml",
        Reply::Body(index_yaml(&[
            ("redirected", "1.0.0", &sha256(v1), "redirected-1.0.0.tgz"),
            (
                "elsewhere",
                "2.0.0",
                &sha256(v2),
                &format!("{}/cdn/catalog-2.0.0.tgz", other.url),
            ),
            ("moved", "1.0.0", &sha256(v1), "moved-1.0.0.tgz"),
        ])),
    );
    let to_other = format!("{}/cdn/catalog-1.0.0.tgz", other.url);
    server.put("/charts/redirected-1.0.0.tgz", Reply::Redirect(to_other));
    server.put(
        "/charts/moved-1.0.0.tgz",
        Reply::Redirect(format!("{}/charts/here/catalog-1.0.0.tgz", server.url)),
    );
    server.put("/charts/here/catalog-1.0.0.tgz", Reply::Body(v1.clone()));
    other.put("/cdn/catalog-1.0.0.tgz", Reply::Body(v1.clone()));
    other.put("/cdn/catalog-2.0.0.tgz", Reply::Body(v2.clone()));
    let mut config = config(tempfile::tempdir().unwrap().keep().as_path());
    config.allowed_private = vec!["127.0.0.0/8".parse().unwrap()];
    let charts = RemoteCharts::new(config).unwrap();
    let right = credentials("repo-creds", &[("username", "alice"), ("password", RIGHT)]);
    let repository = format!("{}/charts", server.url);
    for (chart, version) in [("redirected", "1.0.0"), ("elsewhere", "2.0.0")] {
        let source = from_repository(&repository, chart, version);
        resolve_as(&charts, &source, Some(&right)).await.unwrap();
    }
    let seen = other.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen.iter().all(|(_, auth)| auth.is_none()),
        "credentials reached another host: {seen:?}"
    );
    // A redirect on the same host keeps them (the server refuses requests without them).
    let cache = tempfile::tempdir().unwrap();
    let fresh = remote(cache.path());
    let source = from_repository(&repository, "moved", "1.0.0");
    resolve_as(&fresh, &source, Some(&right)).await.unwrap();
    assert!(
        server
            .seen()
            .iter()
            .any(|(path, auth)| path == "/charts/here/catalog-1.0.0.tgz" && auth.is_some())
    );
}

/// Debian's docker-registry with htpasswd (basic) auth: a `.dockerconfigjson` entry for the
/// registry pulls the chart; wrong or missing credentials, or an entry for another registry,
/// fail clearly — also for a tag and a digest already pulled into the caches by someone else.
#[tokio::test]
async fn a_registry_with_basic_auth_serves_only_the_right_credentials() {
    let registry = Registry::start_with(Some(("alice", RIGHT))).await;
    let digest = registry.push_as(&packaged().v1, "catalog-1.0.0.tgz", Some(("alice", RIGHT)));
    let host = registry.host.clone();
    let cache = tempfile::tempdir().unwrap();
    let charts = remote(cache.path());
    let pull = |password: &str| {
        let config = docker_config(&host, "alice", password);
        credentials("pull", &[(".dockerconfigjson", config.as_str())])
    };
    let by_tag = from_oci(&format!("oci://{host}/charts/catalog:1.0.0"));
    let by_digest = from_oci(&format!("oci://{host}/charts/catalog@{digest}"));
    for source in [&by_tag, &by_digest] {
        let chart = resolve_as(&charts, source, Some(&pull(RIGHT)))
            .await
            .unwrap();
        assert_eq!(chart.digest, format!("sha256:{}", sha256(&packaged().v1)));
    }
    let basic_pair = credentials("pull", &[("username", "alice"), ("password", RIGHT)]);
    resolve_as(&charts, &by_tag, Some(&basic_pair))
        .await
        .unwrap();
    let elsewhere = docker_config("registry.example.com", "alice", RIGHT);
    let elsewhere = credentials("pull", &[(".dockerconfigjson", elsewhere.as_str())]);
    let wrong = pull(WRONG);
    let mut cases = refusals(&host, &wrong);
    cases.push((
        "another registry's",
        Some(&elsewhere),
        format!("Secret pull has no .dockerconfigjson entry for registry {host}"),
    ));
    for source in [&by_tag, &by_digest] {
        assert_refused(&charts, source, &cases).await;
    }
}

/// The distribution token flow with credentials: the registry's `Bearer` challenge names a
/// realm, which gets the credentials (basic) and answers a pull token, which the registry gets;
/// wrong credentials are refused by the realm. A plain-HTTP registry naming a realm on another
/// host gets no credentials sent there; a bearer token in the Secret goes to the registry as it
/// is, never to a realm.
#[tokio::test]
async fn the_token_flow_sends_the_credentials_only_to_the_realm_it_trusts() {
    const TOKEN: &str = "pull-token-5a1e";
    let realm = GuardedServer::start("127.0.0.1:0", Some(("alice", RIGHT))).await;
    realm.put(
        "/token",
        Reply::Body(json!({"token": TOKEN}).to_string().into_bytes()),
    );
    let registry = GuardedServer::start("127.0.0.1:0", None).await;
    *registry.state.required.lock().unwrap() = Some(format!("Bearer {TOKEN}"));
    let challenge = |realm: &str| format!("Bearer realm=\"{realm}/token\",service=\"test\"");
    *registry.state.challenge.lock().unwrap() = Some(challenge(&realm.url));
    let v1 = &packaged().v1;
    registry.put(
        "/v2/charts/catalog/manifests/1.0.0",
        Reply::Body(helm_manifest(&format!("sha256:{}", sha256(v1)), v1.len())),
    );
    registry.put(
        &format!("/v2/charts/catalog/blobs/sha256:{}", sha256(v1)),
        Reply::Body(v1.clone()),
    );
    let cache = tempfile::tempdir().unwrap();
    let fresh = || {
        let mut config = config(cache.path());
        config.allowed_private = vec!["127.0.0.0/8".parse().unwrap()];
        RemoteCharts::new(config).unwrap()
    };
    let charts = fresh();
    let source = from_oci(&format!("oci://{}/charts/catalog:1.0.0", registry.host));
    let right = credentials("pull", &[("username", "alice"), ("password", RIGHT)]);
    let chart = resolve_as(&charts, &source, Some(&right)).await.unwrap();
    assert_eq!(chart.digest, format!("sha256:{}", sha256(v1)));
    let basic_right = basic("alice", RIGHT);
    assert!(
        realm
            .seen()
            .iter()
            .all(|(_, auth)| auth.as_deref() == Some(basic_right.as_str())),
        "{:?}",
        realm.seen()
    );
    assert!(
        registry.seen().iter().all(|(_, auth)| auth
            .as_ref()
            .is_none_or(|a| a == &format!("Bearer {TOKEN}"))),
        "the registry got the token, never the password: {:?}",
        registry.seen()
    );
    let wrong = credentials("pull", &[("username", "alice"), ("password", WRONG)]);
    let cases = refusals(&realm.host, &wrong);
    assert_refused(&charts, &source, &cases[..1]).await;

    // The registry's own token, used as it is: the realm sees no request for it.
    let before = realm.seen().len();
    let token = credentials("pull", &[("bearerToken", TOKEN)]);
    resolve_as(&charts, &source, Some(&token)).await.unwrap();
    assert_eq!(realm.seen().len(), before);

    // A realm on another host named by a plain-HTTP registry gets nothing.
    let elsewhere = GuardedServer::start("127.0.0.2:0", None).await;
    *registry.state.challenge.lock().unwrap() = Some(challenge(&elsewhere.url));
    let message = resolve_as(&fresh(), &source, Some(&right))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains(&format!(
            "names a token realm on another host ({}): credentials are not sent there",
            elsewhere.host
        )),
        "{message}"
    );
    assert!(elsewhere.seen().is_empty(), "{:?}", elsewhere.seen());
}

/// Two tenants share the chart cache (issue 31 item 3). Tenant P's private repository (basic
/// auth) serves chart C to P. Tenant Q, without credentials, points at a public repository whose
/// `index.yaml` lists C's digest (it is in P's `status.chartDigest` and the operator's log) with
/// a URL that answers 404: Q fails with that 404, and again when its index names C's URL on P's
/// host (no credentials: 401). P is served from the cache; the public repository's URL is once
/// it served the archive itself. Before, the cache was looked up by digest alone and Q got C.
#[tokio::test]
async fn a_digest_listed_by_another_repository_is_not_served_from_the_cache() {
    let private = GuardedServer::start("127.0.0.1:0", Some(("alice", RIGHT))).await;
    let repository = private.publish_catalog();
    let public = RepoServer::start().await;
    let c = sha256(&packaged().v1);
    public.put(
        "/lure/index.yaml",
        index_yaml(&[("catalog", "1.0.0", &c, "catalog-1.0.0.tgz")]),
    );
    let direct = format!("{repository}/catalog-1.0.0.tgz");
    public.put(
        "/direct/index.yaml",
        index_yaml(&[("catalog", "1.0.0", &c, &direct)]),
    );
    let cache = tempfile::tempdir().unwrap();
    let charts = remote(cache.path());
    let tenant_p = credentials("repo-creds", &[("username", "alice"), ("password", RIGHT)]);
    let private_source = from_repository(&repository, "catalog", "1.0.0");
    let chart = resolve_as(&charts, &private_source, Some(&tenant_p))
        .await
        .unwrap();
    assert_eq!(chart.digest, format!("sha256:{c}"));

    let lure = from_repository(&format!("{}/lure", public.url), "catalog", "1.0.0");
    let served = "tenant Q was served tenant P's private chart from the cache";
    let message = refused_without_credentials(&charts, &lure, served).await;
    assert!(message.contains("answered HTTP 404"), "{message}");
    assert_eq!(
        public.hits("/lure/catalog-1.0.0.tgz"),
        1,
        "Q asked its own server"
    );
    let named = from_repository(&format!("{}/direct", public.url), "catalog", "1.0.0");
    let served = "tenant Q was served tenant P's chart by naming its URL";
    let message = refused_without_credentials(&charts, &named, served).await;
    assert!(
        message.contains("asks for credentials (HTTP 401)"),
        "{message}"
    );
    assert_eq!(charts.stats().cache_hits, 0);

    // P again: from the cache. The public repository serving C itself: downloaded once, then
    // from the cache too.
    resolve_as(&charts, &private_source, Some(&tenant_p))
        .await
        .unwrap();
    assert_eq!(charts.stats().cache_hits, 1);
    public.put("/lure/catalog-1.0.0.tgz", packaged().v1.clone());
    for _ in 0..2 {
        let chart = resolve_as(&charts, &lure, None).await.unwrap();
        assert_eq!(chart.digest, format!("sha256:{c}"));
    }
    assert_eq!(public.hits("/lure/catalog-1.0.0.tgz"), 2);
    assert_eq!(charts.stats().cache_hits, 2);
}

/// The OCI form of the above: tenant P pulls chart C from a registry with basic auth; tenant Q,
/// without credentials, names a registry of its own whose manifest's chart layer has C's
/// digest and whose blob does not exist: Q fails with the registry's 404, by tag and by digest.
/// Before, the layer's digest was looked up in the cache alone and Q got C.
#[tokio::test]
async fn a_layer_digest_named_by_another_registry_is_not_served_from_the_cache() {
    let registry = Registry::start_with(Some(("alice", RIGHT))).await;
    registry.push_as(&packaged().v1, "catalog-1.0.0.tgz", Some(("alice", RIGHT)));
    let host = registry.host.clone();
    let cache = tempfile::tempdir().unwrap();
    let charts = remote(cache.path());
    let config = docker_config(&host, "alice", RIGHT);
    let tenant_p = credentials("pull", &[(".dockerconfigjson", config.as_str())]);
    let chart = resolve_as(
        &charts,
        &from_oci(&format!("oci://{host}/charts/catalog:1.0.0")),
        Some(&tenant_p),
    )
    .await
    .unwrap();
    let c = format!("sha256:{}", sha256(&packaged().v1));
    assert_eq!(chart.digest, c);

    let lure = RepoServer::start().await;
    let lure_host = lure.url.trim_start_matches("http://").to_owned();
    lure.put("/v2/", "{}");
    let manifest = helm_manifest(&c, packaged().v1.len());
    let manifest_digest = format!("sha256:{}", sha256(&manifest));
    lure.put("/v2/charts/catalog/manifests/1.0.0", manifest.clone());
    lure.put(
        &format!("/v2/charts/catalog/manifests/{manifest_digest}"),
        manifest,
    );
    for reference in [
        format!("oci://{lure_host}/charts/catalog:1.0.0"),
        format!("oci://{lure_host}/charts/catalog@{manifest_digest}"),
    ] {
        let served = "tenant Q was served tenant P's private chart from the cache";
        let message = refused_without_credentials(&charts, &from_oci(&reference), served).await;
        assert!(
            message.contains("not found in the registry"),
            "{reference}: {message}"
        );
    }
    assert_eq!(lure.hits(&format!("/v2/charts/catalog/blobs/{c}")), 2);
    assert_eq!(charts.stats().cache_hits, 0);
}

/// Installs a Secret `name` of `data` (string values) labelled for the watch, or replaces its
/// data.
async fn put_secret(h: &Harness, name: &str, data: Value) {
    let secrets: Api<Secret> = Api::namespaced(h.client.clone(), &h.ns);
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {"modulemanager.io/watch": "true"}},
        "stringData": data,
    }))
    .unwrap();
    objects::apply(&secrets, "chart-sources-test", &secret).await;
}

/// Captured log lines of this test process (every test's, at debug level).
fn captured_logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static Mutex<Vec<u8>> = Box::leak(Box::default());
        let writer = move || Capture(logs);
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_env_filter("debug")
            .with_writer(writer)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
        logs
    })
}

struct Capture(&'static Mutex<Vec<u8>>);

impl std::io::Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The pipeline with a private repository: a wrong password in the Secret fails clearly
/// (status, Event), a missing Secret names itself; rotating the Secret (labelled for the
/// watch) makes the Manifest Ready without a spec change and before its interval (1 h); no
/// password reaches the status, the Events or the log.
#[tokio::test]
async fn a_rotated_credentials_secret_makes_the_manifest_ready_and_no_password_shows() {
    let logs = captured_logs();
    let server = GuardedServer::start("127.0.0.1:0", Some(("alice", RIGHT))).await;
    let repository = server.publish_catalog();
    let h = start("creds").await;
    put_secret(
        &h,
        "repo-creds",
        json!({"username": "alice", "password": WRONG}),
    )
    .await;
    let create = async |name: &str, secret: &str| {
        objects::create_json(
            &h.manifests,
            json!({
                "apiVersion": "modulemanager.io/v1alpha1",
                "kind": "Manifest",
                "metadata": {"name": name, "namespace": h.ns},
                "spec": {"module": name, "interval": "1h", "chart": {
                    "repository": repository, "name": "catalog", "version": "1.0.0",
                    "secretRef": {"name": secret}}},
            }),
        )
        .await;
    };
    create("catalog", "repo-creds").await;
    create("orphan", "absent").await;
    let host = &server.host;
    for (name, expected) in [
        (
            "catalog",
            format!("authentication to {host} failed (HTTP 401): check spec.chart.secretRef"),
        ),
        (
            "orphan",
            "spec.chart.secretRef: Secret absent does not exist in the Manifest's namespace".into(),
        ),
    ] {
        let failed = h
            .wait_for(name, &expected, |m| {
                condition(m, "Ready").is_some_and(|(_, reason, message)| {
                    reason == "ChartError" && message.contains(&expected)
                })
            })
            .await;
        assert_eq!(condition(&failed, "Stalled").unwrap().0, "True", "{name}");
        common::expect_event(&h.client, &h.ns, name, |_, reason, note| {
            reason == "ChartError" && note.contains(&expected)
        })
        .await;
    }
    let generation = h
        .manifests
        .get("catalog")
        .await
        .unwrap()
        .metadata
        .generation;
    put_secret(
        &h,
        "repo-creds",
        json!({"username": "alice", "password": RIGHT}),
    )
    .await;
    let ready = h.wait_state("catalog", ModuleState::Ready).await;
    assert_eq!(ready.metadata.generation, generation, "no spec change");
    assert_eq!(
        h.config_map_data("catalog-settings", "version")
            .await
            .as_deref(),
        Some("1")
    );
    for name in ["catalog", "orphan"] {
        let manifest = h.manifests.get(name).await.unwrap();
        let status = serde_json::to_string(&manifest.status).unwrap();
        let events = format!("{:?}", h.events(name).await);
        for password in [RIGHT, WRONG] {
            assert!(!status.contains(password), "{name}: {status}");
            assert!(!events.contains(password), "{name}: {events}");
        }
    }
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        text.contains("reconcile failed") && text.contains("check spec.chart.secretRef"),
        "the capture saw the passes"
    );
    for secret in [RIGHT, WRONG, basic("alice", RIGHT).as_str()] {
        assert!(!text.contains(secret), "a credential reached the log");
    }
}

// ---------------------------------------------------------------------------------------------
// signed charts (spec.chart.verify): signed here with the real cosign and helm + gpg

/// `cosign` (built by `hack/build-tools.sh`) with a private home and no key password.
fn cosign(home: &Path, args: &[&str]) -> String {
    let binary = testenv::Tools::locate().expect("tools built").cosign;
    assert!(
        binary.is_file(),
        "{} is missing: run `make setup` (hack/build-tools.sh builds cosign)",
        binary.display()
    );
    let mut command = Command::new(binary);
    command
        .args(args)
        .current_dir(home)
        .env_clear()
        .env("HOME", home)
        .env("COSIGN_PASSWORD", "")
        .env("TUF_ROOT", home.join("tuf"));
    run_tool(command, "cosign", args)
}

/// A cosign key pair in its own directory: the directory (holding `cosign.key`) and the PEM
/// public key.
fn cosign_key_pair() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    cosign(dir.path(), &["generate-key-pair"]);
    let public = std::fs::read_to_string(dir.path().join("cosign.pub")).unwrap();
    (dir, public)
}

impl Registry {
    /// `cosign sign --key` of `repository@digest` in the layout the resolver verifies (no
    /// transparency log: nothing leaves the machine).
    fn sign(&self, key_dir: &Path, repository: &str, digest: &str) {
        let key = key_dir.join("cosign.key");
        cosign(
            key_dir,
            &[
                "sign",
                "--key",
                key.to_str().unwrap(),
                "--tlog-upload=false",
                "--new-bundle-format=false",
                "--use-signing-config=false",
                "--allow-http-registry",
                "--yes",
                &format!("{}/{repository}@{digest}", self.host),
            ],
        );
    }

    /// `helm push` of `tgz` to `oci://<host>/<repository>`; returns the manifest digest.
    fn push_to(&self, tgz: &[u8], name: &str, repository: &str) -> String {
        self.push_into(tgz, name, repository, None)
    }
}

/// catalog 1.0.0 with other content (another values.yaml): what a tag moved after signing
/// points to.
fn catalog_v1_altered() -> Vec<u8> {
    let home = tempfile::tempdir().unwrap();
    let chart = home.path().join("catalog");
    let source = repo().join("examples/charts/catalog-v1");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    for file in ["Chart.yaml", "values.yaml"] {
        std::fs::copy(source.join(file), chart.join(file)).unwrap();
    }
    for entry in std::fs::read_dir(source.join("templates")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            chart.join("templates").join(entry.file_name()),
        )
        .unwrap();
    }
    let mut values = std::fs::read_to_string(chart.join("values.yaml")).unwrap();
    values.push_str("\n# altered after signing\n");
    std::fs::write(chart.join("values.yaml"), values).unwrap();
    let out = home.path().join("out");
    helm(
        home.path(),
        &[
            "package",
            chart.to_str().unwrap(),
            "-d",
            out.to_str().unwrap(),
        ],
    );
    std::fs::read(out.join("catalog-1.0.0.tgz")).unwrap()
}

fn keys(from: &str, entries: &[(&str, &[u8])]) -> KeyMaterial {
    KeyMaterial {
        from: from.into(),
        entries: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
            .collect(),
    }
}

fn verified(mut source: ChartSource, provider: VerificationProvider) -> ChartSource {
    source.verify = Some(ChartVerification {
        provider,
        secret_ref: Some(LocalObjectReference {
            name: "signers".into(),
        }),
        config_map_ref: None,
        key: None,
    });
    source
}

/// Checks each case is refused for its reason: permanent, and a verification error (not
/// another chart error). Every case is checked before the test fails, so that a run without
/// verification shows which cases it lets through.
#[derive(Default)]
struct Refusals(Vec<String>);

impl Refusals {
    fn check(&mut self, result: Result<ResolvedChart, SourceError>, case: &str, expected: &str) {
        let failure = match result {
            Ok(chart) => format!("{case}: accepted {}", chart.digest),
            Err(error) => {
                let message = error.to_string();
                if message.contains("signature verification failed: ")
                    && message.contains(expected)
                    && error.is_permanent()
                    && error.is_unverified()
                {
                    return;
                }
                format!("{case}: {message}")
            }
        };
        self.0.push(failure);
    }

    fn assert_all_refused(self) {
        assert!(
            self.0.is_empty(),
            "not refused as expected:\n{}",
            self.0.join("\n")
        );
    }
}

#[tokio::test]
async fn cosign_signed_oci_charts_are_verified_against_the_key() {
    let registry = Registry::start().await;
    let (ours, our_key) = cosign_key_pair();
    let (theirs, _) = cosign_key_pair();
    let host = registry.host.clone();
    let v1 = registry.push(&packaged().v1, "catalog-1.0.0.tgz");
    let v2 = registry.push(&packaged().v2, "catalog-2.0.0.tgz");
    registry.sign(ours.path(), "charts/catalog", &v1);
    // Signed by another key.
    let other = registry.push_to(&packaged().v1, "catalog-1.0.0.tgz", "other");
    registry.sign(theirs.path(), "other/catalog", &other);
    // Signed, then the tag moved to other content.
    let moved = registry.push_to(&packaged().v1, "catalog-1.0.0.tgz", "moved");
    registry.sign(ours.path(), "moved/catalog", &moved);
    registry.push_to(&catalog_v1_altered(), "catalog-1.0.0.tgz", "moved");

    let cache = tempfile::tempdir().unwrap();
    let charts = remote(cache.path());
    let material = keys("Secret signers", &[("cosign.pub", our_key.as_bytes())]);
    let oci = |reference: String| verified(from_oci(&reference), VerificationProvider::Cosign);
    let resolve_with = |source: ChartSource| {
        let (charts, material, limits) = (&charts, &material, Limits::default());
        async move {
            charts
                .resolve_verified(&source, &repo(), None, limits, Some(material))
                .await
        }
    };

    let good = resolve_with(oci(format!("oci://{host}/charts/catalog:1.0.0")))
        .await
        .unwrap();
    assert_eq!(good.digest, format!("sha256:{}", sha256(&packaged().v1)));
    let pinned = resolve_with(oci(format!("oci://{host}/charts/catalog@{v1}")))
        .await
        .unwrap();
    assert_eq!(pinned, good);

    let mut refusals = Refusals::default();
    refusals.check(
        resolve_with(oci(format!("oci://{host}/charts/catalog:2.0.0"))).await,
        "unsigned",
        &format!(
            "no signature found: the registry has no cosign signature tag {}.sig",
            v2.replace(':', "-")
        ),
    );
    refusals.check(
        resolve_with(oci(format!("oci://{host}/other/catalog:1.0.0"))).await,
        "another key",
        "the signature does not match the keys of Secret signers",
    );
    refusals.check(
        resolve_with(oci(format!("oci://{host}/moved/catalog:1.0.0"))).await,
        "tag moved after signing",
        "no signature found",
    );
    // The signature of v1 copied to v2's signature tag: good, but of another manifest.
    copy_manifest(
        &host,
        "charts/catalog",
        &format!("{}.sig", v1.replace(':', "-")),
        &format!("{}.sig", v2.replace(':', "-")),
    )
    .await;
    refusals.check(
        resolve_with(oci(format!("oci://{host}/charts/catalog:2.0.0"))).await,
        "a signature of another manifest",
        &format!("payload digest mismatch: the signature is for {v1}, the chart is {v2}"),
    );
    refusals.assert_all_refused();
    // A verified source without keys, and keys that are not keys.
    let catalog_v1 = oci(format!("oci://{host}/charts/catalog:1.0.0"));
    let error = charts
        .resolve(&catalog_v1, &repo(), None, Limits::default())
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("no public keys were read"),
        "{error}"
    );
    let error = charts
        .resolve_verified(
            &catalog_v1,
            &repo(),
            None,
            Limits::default(),
            Some(&keys("Secret signers", &[("cosign.pub", b"not a key")])),
        )
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("Secret signers key cosign.pub: not a PEM ECDSA P-256 public key"),
        "{error}"
    );
}

/// Copies the manifest at tag `from` to tag `to` of `repository` (the blobs are shared).
async fn copy_manifest(host: &str, repository: &str, from: &str, to: &str) {
    let client = reqwest::Client::new();
    let accept = "application/vnd.oci.image.manifest.v1+json";
    let response = client
        .get(format!("http://{host}/v2/{repository}/manifests/{from}"))
        .header("accept", accept)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let media_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    let body = response.bytes().await.unwrap();
    let put = client
        .put(format!("http://{host}/v2/{repository}/manifests/{to}"))
        .header("content-type", media_type)
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());
}

/// An OpenPGP signing key made with gpg in its own home: the home, the legacy secret keyring
/// `helm package --sign` reads, and the public keyring (binary or armored).
struct GpgKey {
    home: tempfile::TempDir,
    name: String,
}

/// gpg starts an agent per home: stopped with the key.
impl Drop for GpgKey {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .args([
                "--homedir",
                self.home.path().to_str().unwrap(),
                "--kill",
                "gpg-agent",
            ])
            .output();
        let _ = std::fs::remove_file(self.keyring());
    }
}

impl GpgKey {
    fn new(name: &str) -> Self {
        let home = tempfile::tempdir().unwrap();
        let params = format!(
            "%no-protection\nKey-Type: RSA\nKey-Length: 2048\nKey-Usage: sign\nName-Real: {name}\nName-Email: {name}@example.com\nExpire-Date: 0\n%commit\n"
        );
        std::fs::write(home.path().join("params"), params).unwrap();
        Self::gpg(home.path(), &["--gen-key", "params"]);
        let key = Self {
            home,
            name: name.into(),
        };
        let secret = Self::gpg(key.home.path(), &["--export-secret-keys", name]);
        std::fs::write(key.keyring(), secret).unwrap();
        key
    }

    /// The legacy secret keyring (outside gpg's home, which would import a `secring.gpg`).
    fn keyring(&self) -> PathBuf {
        self.home.path().with_extension("secring.gpg")
    }

    fn gpg(home: &Path, args: &[&str]) -> Vec<u8> {
        let output = Command::new("gpg")
            .args(["--batch", "--homedir", home.to_str().unwrap()])
            .args(args)
            .current_dir(home)
            .output()
            .expect("gpg runs: run `make setup` (hack/ensure-gnupg.sh)");
        assert!(
            output.status.success(),
            "gpg {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output.stdout
    }

    fn public(&self, armor: bool) -> Vec<u8> {
        let mut args = vec!["--export"];
        if armor {
            args.push("--armor");
        }
        args.push(&self.name);
        Self::gpg(self.home.path(), &args)
    }

    /// `helm package --sign` of `chart` into `out`: the archive and its provenance file.
    fn package(&self, chart: &Path, out: &Path) -> (Vec<u8>, Vec<u8>) {
        let name = chart.file_name().unwrap().to_str().unwrap();
        let version = if name.ends_with("v2") {
            "2.0.0"
        } else {
            "1.0.0"
        };
        let keyring = self.keyring();
        helm(
            self.home.path(),
            &[
                "package",
                chart.to_str().unwrap(),
                "-d",
                out.to_str().unwrap(),
                "--sign",
                "--key",
                &self.name,
                "--keyring",
                keyring.to_str().unwrap(),
            ],
        );
        let tgz = out.join(format!("catalog-{version}.tgz"));
        let prov = out.join(format!("catalog-{version}.tgz.prov"));
        (std::fs::read(tgz).unwrap(), std::fs::read(prov).unwrap())
    }
}

/// A repository at `/<path>` of `server` with catalog `version` as given, and its `.prov` file
/// if any.
fn publish_signed(
    server: &RepoServer,
    path: &str,
    version: &str,
    tgz: &[u8],
    prov: Option<&[u8]>,
) -> String {
    let file = format!("catalog-{version}.tgz");
    server.put(
        &format!("/{path}/index.yaml"),
        index_yaml(&[("catalog", version, &sha256(tgz), &file)]),
    );
    server.put(&format!("/{path}/{file}"), tgz.to_vec());
    if let Some(prov) = prov {
        server.put(&format!("/{path}/{file}.prov"), prov.to_vec());
    }
    format!("{}/{path}", server.url)
}

#[tokio::test]
async fn helm_provenance_files_are_verified_against_the_keyring() {
    let (ours, theirs) = (GpgKey::new("chart-signer"), GpgKey::new("someone-else"));
    let out = tempfile::tempdir().unwrap();
    let charts_dir = repo().join("examples/charts");
    let (v1, v1_prov) = ours.package(&charts_dir.join("catalog-v1"), &out.path().join("ours"));
    let (v2, v2_prov) = theirs.package(&charts_dir.join("catalog-v2"), &out.path().join("theirs"));
    let server = RepoServer::start().await;
    let signed = publish_signed(&server, "signed", "1.0.0", &v1, Some(&v1_prov));
    let other_key = publish_signed(&server, "other", "2.0.0", &v2, Some(&v2_prov));
    let unsigned = publish_signed(&server, "unsigned", "1.0.0", &v1, None);
    // v2's archive under v1's name, the index changed to match it, v1's provenance file.
    let tampered = publish_signed(&server, "tampered", "1.0.0", &v2, Some(&v1_prov));

    let cache = tempfile::tempdir().unwrap();
    let charts = remote(cache.path());
    let resolve_with = |repository: String, version: &str, material: KeyMaterial| {
        let source = verified(
            from_repository(&repository, "catalog", version),
            VerificationProvider::Helm,
        );
        let charts = &charts;
        async move {
            charts
                .resolve_verified(&source, &repo(), None, Limits::default(), Some(&material))
                .await
        }
    };
    let binary = || keys("Secret signers", &[("pubring.gpg", &ours.public(false))]);
    let armored = || keys("ConfigMap signers", &[("signer.asc", &ours.public(true))]);

    let good = resolve_with(signed.clone(), "1.0.0", binary())
        .await
        .unwrap();
    assert_eq!(good.digest, format!("sha256:{}", sha256(&v1)));
    assert_eq!(std::fs::read(&good.path).unwrap(), v1);
    let again = resolve_with(signed, "1.0.0", armored()).await.unwrap();
    assert_eq!(again, good, "an armored keyring works too");

    let mut refusals = Refusals::default();
    refusals.check(
        resolve_with(other_key, "2.0.0", binary()).await,
        "signed by another key",
        "the signature does not match the keys of Secret signers",
    );
    refusals.check(
        resolve_with(unsigned, "1.0.0", binary()).await,
        "no provenance file",
        "no signature found: http://127.0.0.1",
    );
    refusals.check(
        resolve_with(tampered, "1.0.0", binary()).await,
        "an archive the provenance file does not sign",
        &format!(
            "archive digest mismatch: the signature is for sha256:{}, the chart is sha256:{}",
            sha256(&v1),
            sha256(&v2)
        ),
    );
    refusals.assert_all_refused();
    assert_eq!(
        server.hits("/tampered/catalog-1.0.0.tgz") + server.hits("/other/catalog-2.0.0.tgz"),
        0,
        "a refused chart is not downloaded"
    );
}

#[tokio::test]
async fn a_module_installs_only_a_verified_chart() {
    let registry = Registry::start().await;
    let (ours, our_key) = cosign_key_pair();
    let v1 = registry.push(&packaged().v1, "catalog-1.0.0.tgz");
    registry.push(&packaged().v2, "catalog-2.0.0.tgz");
    registry.sign(ours.path(), "charts/catalog", &v1);
    let signer = GpgKey::new("chart-signer");
    let out = tempfile::tempdir().unwrap();
    let (v2_tgz, v2_prov) = signer.package(&repo().join("examples/charts/catalog-v2"), out.path());
    let server = RepoServer::start().await;
    let signed_repository = publish_signed(&server, "signed", "2.0.0", &v2_tgz, Some(&v2_prov));

    let h = start("verify").await;
    let secrets = Api::<Secret>::namespaced(h.client.clone(), &h.ns);
    let secret =
        json!({"metadata": {"name": "cosign-signers"}, "stringData": {"cosign.pub": our_key}});
    objects::create_json(&secrets, secret).await;
    let keyring = String::from_utf8(signer.public(true)).unwrap();
    let config_map =
        json!({"metadata": {"name": "helm-signers"}, "data": {"signers.asc": keyring}});
    objects::create_json(
        &Api::<ConfigMap>::namespaced(h.client.clone(), &h.ns),
        config_map,
    )
    .await;
    let cosign_verify = json!({"provider": "cosign", "secretRef": {"name": "cosign-signers"}});
    let oci = |tag: &str| json!({"oci": format!("oci://{}/charts/catalog:{tag}", registry.host), "verify": cosign_verify});

    h.create("catalog", oci("1.0.0"), json!({"greeting": "hi"}))
        .await;
    let ready = h.wait_state("catalog", ModuleState::Ready).await;
    assert_eq!(
        ready.status.clone().unwrap().chart_digest,
        Some(format!("sha256:{}", sha256(&packaged().v1)))
    );

    // 2.0.0 is not signed: refused before rendering, nothing changes.
    h.set_chart("catalog", oci("2.0.0")).await;
    let refused = h
        .wait_for("catalog", "refused", |m| {
            let status = m.status.clone().unwrap_or_default();
            status.observed_generation == m.metadata.generation
                && condition(m, "Ready").is_some_and(|(_, reason, _)| reason == "ChartUnverified")
        })
        .await;
    let (_, _, message) = condition(&refused, "Ready").unwrap();
    assert!(
        message.contains("signature verification failed: no signature found"),
        "{message}"
    );
    assert_eq!(condition(&refused, "Stalled").unwrap().0, "True");
    assert_eq!(
        refused.status.clone().unwrap().state,
        Some(ModuleState::Error)
    );
    assert_eq!(
        refused.status.clone().unwrap().chart_digest,
        Some(format!("sha256:{}", sha256(&packaged().v1)))
    );
    assert_eq!(common::inventory_names(&refused).len(), 2, "nothing pruned");
    assert_eq!(
        h.config_map_data("catalog-settings", "version")
            .await
            .as_deref(),
        Some("1"),
        "nothing applied"
    );
    common::expect_event(&h.client, &h.ns, "catalog", |kind, reason, note| {
        kind == "Warning" && reason == "ChartUnverified" && note.contains("no signature found")
    })
    .await;

    // The signed 2.0.0 of a Helm repository, its keyring in a ConfigMap: upgraded.
    h.set_chart(
        "catalog",
        json!({
            "repository": signed_repository, "name": "catalog", "version": "2.0.0",
            // A merge patch: the Secret of the cosign keys is removed.
            "verify": {"provider": "helm", "secretRef": null, "configMapRef": {"name": "helm-signers"}},
        }),
    )
    .await;
    let upgraded = h.wait_state("catalog", ModuleState::Ready).await;
    assert_eq!(
        upgraded.status.unwrap().chart_digest,
        Some(format!("sha256:{}", sha256(&v2_tgz)))
    );
    assert_eq!(
        h.config_map_data("catalog-settings", "version")
            .await
            .as_deref(),
        Some("2")
    );
}
