//! Baselines measured in the same run as the fleet: a bare client server-side applying the
//! chart's objects (the API server's ceiling) and `helm upgrade --install` of the same chart.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, stream};
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{self, ApiResource, Scope};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::results::Burst;

/// Field manager of the bare client's server-side applies.
pub const FIELD_MANAGER: &str = "loadtest-baseline";

/// A release name to render the template with: distinctive enough that every occurrence of it
/// in the rendered objects is the release name (see [`for_release`]).
pub const TEMPLATE_RELEASE: &str = "loadtest-template-release";

/// Limit on `helm template`.
const RENDER_TIMEOUT: Duration = Duration::from_secs(60);
/// Limit on one `helm upgrade --install` (helm's own `--timeout` is set a little below it, so a
/// `--wait` that runs out is reported by helm rather than by a kill).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(120);
const HELM_WAIT_TIMEOUT: &str = "110s";
/// Most of helm's stderr kept in an error.
const STDERR_TAIL_BYTES: usize = 2048;

/// `helm template` of `chart` as `release` in `namespace` with `values`, once, parsed into its
/// objects (empty documents skipped). Bounded by a 60 s limit; helm runs with a private home.
pub async fn render_chart(
    helm: &Path,
    chart: &Path,
    release: &str,
    namespace: &str,
    values: &Value,
) -> anyhow::Result<Vec<Value>> {
    let home = HelmHome::new()?;
    let mut command = home.command(helm);
    command
        .arg("template")
        .args(["--namespace", namespace, "--skip-tests", "--values", "-"])
        .arg("--")
        .arg(release)
        .arg(chart);
    // Values are JSON, which is YAML; `null` means the chart's defaults.
    let values = if values.is_null() {
        "{}".to_owned()
    } else {
        values.to_string()
    };
    let out = run(command, Some(values.into_bytes()), RENDER_TIMEOUT)
        .await
        .with_context(|| format!("helm template {} as {release}", chart.display()))?;
    let text = String::from_utf8(out).context("helm template: output is not UTF-8")?;
    parse_documents(&text).context("helm template: parse the output")
}

/// The objects of a multi-document YAML stream, empty documents (`---` alone, comments only)
/// skipped.
pub fn parse_documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).with_context(|| format!("document {index}"))?;
        match value {
            Value::Null => {}
            Value::Object(_) => objects.push(value),
            other => bail!("document {index} is not an object: {other}"),
        }
    }
    Ok(objects)
}

/// The template's objects for `release`: every occurrence of `template_release` in a string
/// value (anywhere: `metadata.name`, labels, selectors, `serviceAccountName`, `name-config`…)
/// replaced by `release`. Keys are left alone.
///
/// Rendering once and substituting costs nothing per release, where `helm template` per release
/// would cost tens of milliseconds of CPU that the bare client is meant not to spend. It is
/// exact for charts that use the release name only verbatim (as `podinfo-like` does); a value
/// derived from it (`trunc`, `upper`, a hash) is not substituted, so the template release must
/// be a name that occurs nowhere else, such as [`TEMPLATE_RELEASE`].
pub fn for_release(template: &[Value], template_release: &str, release: &str) -> Vec<Value> {
    fn substitute(value: &mut Value, from: &str, to: &str) {
        match value {
            Value::String(s) if s.contains(from) => *s = s.replace(from, to),
            Value::Array(items) => items.iter_mut().for_each(|v| substitute(v, from, to)),
            Value::Object(map) => map.values_mut().for_each(|v| substitute(v, from, to)),
            _ => {}
        }
    }
    template
        .iter()
        .map(|object| {
            let mut object = object.clone();
            substitute(&mut object, template_release, release);
            object
        })
        .collect()
}

/// One object ready to apply: where to send it, its name and body.
pub(crate) struct Prepared {
    pub api: Api<DynamicObject>,
    pub kind: String,
    pub name: String,
    pub body: Value,
}

/// The releases of a baseline burst: the chart's objects as `template_release` (see
/// [`for_release`]), the release names, how many at once.
pub struct Releases<'a> {
    pub objects_template: &'a [Value],
    pub template_release: &'a str,
    pub names: &'a [String],
    pub parallelism: usize,
}

/// The template's objects for each release (see [`for_release`]), each ready to apply in
/// `namespace`: every kind resolved once by discovery.
pub(crate) async fn prepare(
    client: &kube::Client,
    namespace: &str,
    releases: &Releases<'_>,
) -> anyhow::Result<Vec<(String, Vec<Prepared>)>> {
    let Releases {
        objects_template,
        template_release,
        names: releases,
        ..
    } = *releases;
    let mut resources: HashMap<GroupVersionKind, (ApiResource, Scope)> = HashMap::new();
    for object in objects_template {
        let gvk = gvk_of(object)?;
        if let Entry::Vacant(entry) = resources.entry(gvk) {
            let gvk = entry.key();
            let (resource, capabilities) = discovery::pinned_kind(client, gvk)
                .await
                .with_context(|| format!("discover {}/{} {}", gvk.group, gvk.version, gvk.kind))?;
            entry.insert((resource, capabilities.scope));
        }
    }
    let mut work = Vec::with_capacity(releases.len());
    for release in releases {
        let mut objects = Vec::with_capacity(objects_template.len());
        for mut body in for_release(objects_template, template_release, release) {
            let (resource, scope) = &resources[&gvk_of(&body)?];
            let name = body
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .with_context(|| format!("release {release}: a {} has no name", resource.kind))?
                .to_owned();
            let api = match scope {
                Scope::Namespaced => {
                    body["metadata"]["namespace"] = namespace.into();
                    Api::namespaced_with(client.clone(), namespace, resource)
                }
                Scope::Cluster => Api::all_with(client.clone(), resource),
            };
            objects.push(Prepared {
                api,
                kind: resource.kind.clone(),
                name,
                body,
            });
        }
        work.push((release.clone(), objects));
    }
    Ok(work)
}

/// Server-side applies (field manager [`FIELD_MANAGER`], forced) the template's objects once
/// per release (see [`for_release`]) to `namespace`, `parallelism` releases at once, each
/// release's objects in order. Discovery (each kind resolved once) and the substitution happen
/// before the clock starts; the burst is timed from the first request to the last answer. The
/// first error fails the whole, naming the release and the object.
pub async fn bare_apply(
    client: &kube::Client,
    namespace: &str,
    releases: &Releases<'_>,
) -> anyhow::Result<Burst> {
    let parallelism = releases.parallelism;
    let work = prepare(client, namespace, releases).await?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let started = Instant::now();
    let mut applies = stream::iter(work)
        .map(|(release, objects)| {
            let params = &params;
            async move {
                for object in objects {
                    object
                        .apply(params)
                        .await
                        .with_context(|| format!("release {release}"))?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(parallelism.max(1));
    while let Some(done) = applies.next().await {
        done?;
    }
    Ok(burst(parallelism, releases.names.len(), started.elapsed()))
}

impl Prepared {
    /// Server-side applies the object with `params`; the error names it.
    pub(crate) async fn apply(&self, params: &PatchParams) -> anyhow::Result<DynamicObject> {
        self.api
            .patch(&self.name, params, &Patch::Apply(&self.body))
            .await
            .with_context(|| format!("apply {} {}", self.kind, self.name))
    }
}

/// What `helm upgrade --install` waits for once it has applied the objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelmWait {
    /// `--wait=hookOnly`, helm 4's default (what "no `--wait`" means): helm returns once the
    /// objects are created or updated and the release record is stored; only hooks are awaited.
    HooksOnly,
    /// `--wait=watcher` (`--wait` alone): also until every object is "Current" by kstatus — a
    /// Deployment's controller has observed its generation and reports it Available with the
    /// new ReplicaSet, a Service has its IP.
    Watcher,
}

impl HelmWait {
    fn flag(self) -> &'static str {
        match self {
            Self::HooksOnly => "--wait=hookOnly",
            Self::Watcher => "--wait=watcher",
        }
    }
}

/// `helm upgrade --install <release> <chart> --namespace <namespace> --kubeconfig <kubeconfig>`
/// for every release, `parallelism` processes at once, waiting for what `wait` says
/// ([`HelmWait::HooksOnly`], helm's default: not for readiness). The chart's default values; helm runs with a
/// private home. Each process is bounded (120 s); a failure is an error with the end of its
/// stderr.
///
/// Which comparison is fair: module-manager reports a Manifest Ready only once every applied
/// workload is rolled out — for a Deployment, once the deployment controller has observed its
/// generation and the desired replicas are updated and available (0 of 0 here). Plain helm does
/// not wait for any of that, so it measures less work (apply and store the release record);
/// [`HelmWait::Watcher`] is the like-for-like "until Ready" path
/// (module-manager's readiness follows the same kstatus rules, `src/plan/readiness.rs`). With 0
/// replicas under kube-controller-manager the wait is cheap in work but not in latency: on the
/// test control plane it added about 1 s per release one at a time (20 releases: 7.7 s without,
/// 27 s with), nothing measurable 4 at a time (5.5 s and 4.6 s). Helm 4 applies server-side too
/// (field manager `helm`), so the apply itself is the same kind of request as ours.
pub async fn helm_install(
    helm: &Path,
    kubeconfig: &Path,
    chart: &Path,
    namespace: &str,
    releases: &[String],
    parallelism: usize,
    wait: HelmWait,
) -> anyhow::Result<Burst> {
    let home = HelmHome::new()?;
    let started = Instant::now();
    let mut installs = stream::iter(releases)
        .map(|release| {
            let mut command = home.command(helm);
            command
                .args(["upgrade", "--install", "--namespace", namespace])
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args([wait.flag(), "--timeout", HELM_WAIT_TIMEOUT])
                .arg("--")
                .arg(release)
                .arg(chart);
            async move {
                run(command, None, INSTALL_TIMEOUT)
                    .await
                    .with_context(|| format!("helm upgrade --install {release}"))
            }
        })
        .buffer_unordered(parallelism.max(1));
    while let Some(done) = installs.next().await {
        done?;
    }
    Ok(burst(parallelism, releases.len(), started.elapsed()))
}

pub(crate) fn burst(parallelism: usize, releases: usize, elapsed: Duration) -> Burst {
    let seconds = elapsed.as_secs_f64();
    Burst {
        parallelism: u32::try_from(parallelism).unwrap_or(u32::MAX),
        seconds,
        per_second: if seconds > 0.0 {
            releases as f64 / seconds
        } else {
            0.0
        },
    }
}

fn gvk_of(object: &Value) -> anyhow::Result<GroupVersionKind> {
    let field = |name: &str| {
        object[name].as_str().with_context(|| {
            format!(
                "object {} has no {name}",
                object.pointer("/metadata/name").unwrap_or(&Value::Null)
            )
        })
    };
    let (api_version, kind) = (field("apiVersion")?, field("kind")?);
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Ok(GroupVersionKind::gvk(group, version, kind))
}

/// A private helm home (cache, config, data) for the duration of a baseline, so that the user's
/// repositories, plugins, registry logins and `HELM_*` settings play no part.
struct HelmHome {
    dir: tempfile::TempDir,
}

impl HelmHome {
    fn new() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("loadtest-helm-")
            .tempdir()
            .context("create a helm home")?;
        Ok(Self { dir })
    }

    /// A helm command in this home. The rest of the environment is inherited (`PATH` and
    /// proxies, which a kubeconfig's exec credential plugin may need), except every `HELM_*`
    /// variable and `KUBECONFIG`: the kubeconfig is always given as a flag.
    fn command(&self, helm: &Path) -> Command {
        let mut command = Command::new(helm);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HELM_") || key == OsStr::new("KUBECONFIG") {
                command.env_remove(key);
            }
        }
        let home = self.dir.path();
        command
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .kill_on_drop(true);
        command
    }
}

/// Runs `command` with `stdin` (or none) to completion within `limit`; its stdout on success,
/// else an error with the end of its stderr. The process is killed when the limit runs out.
async fn run(
    mut command: Command,
    stdin: Option<Vec<u8>>,
    limit: Duration,
) -> anyhow::Result<Vec<u8>> {
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().context("start helm")?;
    let input = child.stdin.take();
    let write = async move {
        if let (Some(mut pipe), Some(bytes)) = (input, stdin) {
            // A helm that exits early closes the pipe; its exit status says why.
            let _ = pipe.write_all(&bytes).await;
        }
    };
    // Writing and reading run together, so neither can block on a full pipe.
    let finished = async { tokio::join!(write, child.wait_with_output()).1 };
    let output = match tokio::time::timeout(limit, finished).await {
        Err(_) => bail!("no answer within {limit:?} (killed)"),
        Ok(output) => output.context("wait for helm")?,
    };
    if !output.status.success() {
        bail!("{}: {}", output.status, stderr_tail(&output.stderr));
    }
    Ok(output.stdout)
}

/// The last [`STDERR_TAIL_BYTES`] of stderr, trimmed, at a character boundary.
fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    let mut start = text.len().saturating_sub(STDERR_TAIL_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    if start > 0 {
        format!("…{}", &text[start..])
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documents_parse_and_empty_ones_are_skipped() {
        let text = "---\n# Source: a.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n\
                    ---\n# Source: empty.yaml\n---\n---\napiVersion: v1\nkind: Service\n\
                    metadata:\n  name: b\n";
        let objects = parse_documents(text).unwrap();
        let names: Vec<_> = objects.iter().map(|o| &o["metadata"]["name"]).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(parse_documents("- a\n- b\n").is_err());
    }

    #[test]
    fn the_release_name_is_substituted_in_every_string_value() {
        let template = [json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": { "name": "tpl", "labels": { "app": "tpl" } },
            "spec": {
                "replicas": 0,
                "selector": { "matchLabels": { "app": "tpl" } },
                "template": { "spec": {
                    "serviceAccountName": "tpl",
                    "containers": [{ "name": "podinfo", "args": ["--config=tpl-config"] }],
                } },
            },
        })];
        let [object] = for_release(&template, "tpl", "r-7").try_into().unwrap();
        assert_eq!(object["metadata"]["name"], "r-7");
        assert_eq!(object["metadata"]["labels"]["app"], "r-7");
        assert_eq!(object["spec"]["selector"]["matchLabels"]["app"], "r-7");
        assert_eq!(
            object["spec"]["template"]["spec"]["serviceAccountName"],
            "r-7"
        );
        let container = &object["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["args"][0], "--config=r-7-config");
        assert_eq!(container["name"], "podinfo");
        assert_eq!(object["spec"]["replicas"], 0);
        // The template itself is untouched.
        assert_eq!(template[0]["metadata"]["name"], "tpl");
    }

    #[test]
    fn kinds_are_read_from_api_version_and_kind() {
        let core = gvk_of(&json!({ "apiVersion": "v1", "kind": "ConfigMap" })).unwrap();
        assert_eq!(core, GroupVersionKind::gvk("", "v1", "ConfigMap"));
        let apps = gvk_of(&json!({ "apiVersion": "apps/v1", "kind": "Deployment" })).unwrap();
        assert_eq!(apps, GroupVersionKind::gvk("apps", "v1", "Deployment"));
        assert!(gvk_of(&json!({ "kind": "ConfigMap", "metadata": { "name": "x" } })).is_err());
    }

    #[test]
    fn bursts_count_per_second_and_survive_an_empty_one() {
        let b = burst(4, 10, Duration::from_secs(2));
        assert_eq!((b.parallelism, b.seconds, b.per_second), (4, 2.0, 5.0));
        assert_eq!(burst(4, 0, Duration::ZERO).per_second, 0.0);
    }

    #[test]
    fn stderr_keeps_its_end() {
        assert_eq!(stderr_tail(b"  Error: no\n"), "Error: no");
        let long = format!("{}Error: the end", "é".repeat(STDERR_TAIL_BYTES));
        let tail = stderr_tail(long.as_bytes());
        assert!(tail.starts_with('…') && tail.ends_with("Error: the end"));
        assert!(tail.len() <= STDERR_TAIL_BYTES + '…'.len_utf8());
    }
}
