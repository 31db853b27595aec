//! `get`, `describe`, `reconcile`, `suspend`, `resume`, `retry`: Manifests on the cluster in the
//! kubeconfig, read and changed as the caller (flux's `get/reconcile/suspend/resume` for Manifests).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::json;

use super::connect::{Connection, KubeArgs, api_error, connect};
use super::views::{
    Output, describe_manifest, encoded, event_time, history_table, manifests_table,
};
use super::watch::follow;
use crate::api::{Manifest, ManifestStatus, RECONCILE_REQUESTED_AT, RESET_REQUESTED_AT, State};
use crate::source::local_chart_version;

/// Most Events `describe` shows (the latest).
const EVENTS_SHOWN: usize = 20;
/// How often `--wait` looks at the Manifest.
const WAIT_POLL: Duration = Duration::from_secs(1);

/// `get [NAME] [-n NS | -A]`.
#[derive(clap::Args, Debug)]
pub struct GetArgs {
    /// One Manifest; every Manifest of the namespace when omitted.
    pub name: Option<String>,
    /// Manifests of every namespace.
    #[arg(short = 'A', long, conflicts_with = "name")]
    pub all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: Output,
    /// After the table, print a row each time a Manifest changes, until interrupted (as
    /// `kubectl get -w`).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Directory local chart paths (`spec.chart.path`) resolve under, to show a path chart's
    /// version from its `Chart.yaml` (as the operator's `--chart-root`).
    #[arg(long, default_value = ".")]
    pub chart_root: PathBuf,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `describe NAME`.
#[derive(clap::Args, Debug)]
pub struct DescribeArgs {
    /// The Manifest.
    pub name: String,
    /// Output format (`json`/`yaml`: the Manifest and its Events).
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: Output,
    /// Directory local chart paths (`spec.chart.path`) resolve under, to show a path chart's
    /// version from its `Chart.yaml` (as the operator's `--chart-root`).
    #[arg(long, default_value = ".")]
    pub chart_root: PathBuf,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `history NAME [-o json|yaml]`.
#[derive(clap::Args)]
pub struct HistoryArgs {
    /// The Manifest.
    pub name: String,
    /// Output format (`json`/`yaml`: `status.history` as stored).
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: Output,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `reconcile NAME [--wait]` and `retry NAME [--wait]`.
#[derive(clap::Args, Debug)]
pub struct RequestArgs {
    /// The Manifest.
    pub name: String,
    /// Wait until a pass has handled the request, then print its outcome (exit 1 when it ends
    /// in `Error`).
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits (`90s`, `5m`).
    #[arg(long, default_value = "5m", value_parser = parse_timeout)]
    pub timeout: Duration,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `suspend NAME`, `resume NAME`.
#[derive(clap::Args, Debug)]
pub struct NameArgs {
    /// The Manifest.
    pub name: String,
    #[command(flatten)]
    pub kube: KubeArgs,
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    crate::api::parse_interval(text)
        .ok_or_else(|| format!("not a duration like 90s or 5m: {text:?}"))
}

fn what(namespace: &str, name: &str) -> String {
    format!("Manifest {namespace}/{name}")
}

/// The version a path chart's `Chart.yaml` under `root` says, where this process can read it.
fn path_version(root: &Path) -> impl Fn(&str) -> Option<String> {
    move |path| local_chart_version(path, root)
}

/// What `get` prints: a table of Manifests, or the text of `-o json|yaml`.
enum Listed {
    Manifests(Vec<Manifest>),
    Encoded(String),
}

/// `value` as `-o` asks, else the table of `manifests`.
fn listed_as(
    value: &impl Serialize,
    output: Output,
    manifests: Vec<Manifest>,
) -> anyhow::Result<Listed> {
    Ok(match encoded(value, output)? {
        Some(text) => Listed::Encoded(text),
        None => Listed::Manifests(manifests),
    })
}

/// The Manifest `get` names, or those of its namespace (or of all).
async fn listed(api: &Api<Manifest>, args: &GetArgs, namespace: &str) -> anyhow::Result<Listed> {
    if let Some(name) = &args.name {
        let manifest = api
            .get(name)
            .await
            .map_err(|e| api_error("get", &what(namespace, name), e))?;
        return listed_as(&manifest, args.output, vec![manifest.clone()]);
    }
    let scope = if args.all_namespaces {
        "all namespaces".to_owned()
    } else {
        format!("namespace {namespace}")
    };
    let items = api
        .list(&ListParams::default())
        .await
        .map_err(|e| api_error("list", &format!("Manifests of {scope}"), e))?
        .items;
    let as_list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    listed_as(&as_list, args.output, items)
}

/// `get`: a table (or `-o json|yaml`: the Manifest, or a `List` of them); with `--watch`, the
/// table, then a row per change until interrupted.
pub async fn get(args: GetArgs) -> anyhow::Result<String> {
    anyhow::ensure!(
        !args.watch || args.output == Output::Table,
        "get --watch prints a table: -o json and -o yaml are not supported with it"
    );
    let Connection { client, namespace } = connect(&args.kube).await?;
    let api: Api<Manifest> = if args.all_namespaces {
        Api::all(client)
    } else {
        Api::namespaced(client, &namespace)
    };
    let manifests = match listed(&api, &args, &namespace).await? {
        Listed::Manifests(manifests) => manifests,
        Listed::Encoded(text) => return Ok(text),
    };
    let version = path_version(&args.chart_root);
    let table = manifests_table(&manifests, args.all_namespaces, Timestamp::now(), &version);
    if !args.watch {
        return Ok(table);
    }
    let mut out = std::io::stdout();
    std::io::Write::write_all(&mut out, table.as_bytes())?;
    let name = args.name.as_deref();
    follow(
        api,
        name,
        &manifests,
        args.all_namespaces,
        &version,
        &mut out,
    )
    .await?;
    Ok(String::new())
}

/// The latest Events about `manifest` (by UID), oldest first.
async fn events_of(client: &Client, manifest: &Manifest) -> anyhow::Result<Vec<Event>> {
    let namespace = manifest.namespace().unwrap_or_default();
    let uid = manifest.uid().unwrap_or_default();
    let selector = format!("regarding.uid={uid}");
    let mut events: Vec<Event> = Api::<Event>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(|e| {
            api_error(
                "list the Events of",
                &what(&namespace, &manifest.name_any()),
                e,
            )
        })?
        .items;
    events.sort_by_key(event_time);
    let skip = events.len().saturating_sub(EVENTS_SHOWN);
    Ok(events.split_off(skip))
}

/// `describe`: spec, status, inventory, hook run, last operation and recent Events.
pub async fn describe(args: DescribeArgs) -> anyhow::Result<String> {
    let Connection { client, namespace } = connect(&args.kube).await?;
    let manifest = Api::<Manifest>::namespaced(client.clone(), &namespace)
        .get(&args.name)
        .await
        .map_err(|e| api_error("get", &what(&namespace, &args.name), e))?;
    let events = events_of(&client, &manifest).await?;
    let both = json!({"manifest": manifest, "events": events});
    if let Some(text) = encoded(&both, args.output)? {
        return Ok(text);
    }
    let version = path_version(&args.chart_root);
    Ok(describe_manifest(
        &manifest,
        &events,
        Timestamp::now(),
        &version,
    ))
}

/// `history`: the Manifest's releases, newest first, as the caller reads them.
pub async fn history(args: HistoryArgs) -> anyhow::Result<String> {
    let Connection { client, namespace } = connect(&args.kube).await?;
    let manifest = Api::<Manifest>::namespaced(client, &namespace)
        .get(&args.name)
        .await
        .map_err(|e| api_error("get", &what(&namespace, &args.name), e))?;
    let history = manifest.status.map(|s| s.history).unwrap_or_default();
    if let Some(text) = encoded(&history, args.output)? {
        return Ok(text);
    }
    Ok(history_table(&history, Timestamp::now()))
}

/// Merge-patches one Manifest; its error names the step.
async fn patch(
    api: &Api<Manifest>,
    step: &str,
    what: &str,
    name: &str,
    body: serde_json::Value,
) -> anyhow::Result<Manifest> {
    let params = PatchParams {
        field_manager: Some("module-manager-cli".to_owned()),
        ..PatchParams::default()
    };
    api.patch(name, &params, &Patch::Merge(&body))
        .await
        .map_err(|e| api_error(step, what, e))
}

/// `suspend` / `resume`: sets `spec.suspend`.
pub async fn set_suspend(args: NameArgs, suspend: bool) -> anyhow::Result<String> {
    let Connection { client, namespace } = connect(&args.kube).await?;
    let api = Api::<Manifest>::namespaced(client, &namespace);
    let what = what(&namespace, &args.name);
    let step = if suspend { "suspend" } else { "resume" };
    patch(
        &api,
        step,
        &what,
        &args.name,
        json!({"spec": {"suspend": suspend}}),
    )
    .await?;
    Ok(format!(
        "{what} {}\n",
        if suspend { "suspended" } else { "resumed" }
    ))
}

/// Which request a `reconcile` or `retry` makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// A pass now (`reconcile.modulemanager.io/requestedAt`, echoed in
    /// `status.lastHandledReconcileAt`).
    Reconcile,
    /// A reset of a failed hook run or permanent error (`…/resetAt`, echoed in
    /// `status.lastHandledResetAt`).
    Reset,
}

impl Request {
    /// The annotation the request sets.
    pub fn annotation(self) -> &'static str {
        match self {
            Self::Reconcile => RECONCILE_REQUESTED_AT,
            Self::Reset => RESET_REQUESTED_AT,
        }
    }

    /// The value a pass echoed for this request.
    pub fn handled(self, status: &ManifestStatus) -> Option<&str> {
        match self {
            Self::Reconcile => status.last_handled_reconcile_at.as_deref(),
            Self::Reset => status.last_handled_reset_at.as_deref(),
        }
    }
}

/// The merge patch that makes `request` with the token `at` (the current time, RFC 3339).
pub fn request_patch(request: Request, at: &str) -> serde_json::Value {
    json!({"metadata": {"annotations": {request.annotation(): at}}})
}

/// `reconcile` / `retry`: sets the request's annotation to the current time; with `--wait`,
/// waits until a pass echoed it and answers its outcome. The second value is whether it failed.
pub async fn request(args: RequestArgs, request: Request) -> anyhow::Result<(String, bool)> {
    let Connection { client, namespace } = connect(&args.kube).await?;
    let api = Api::<Manifest>::namespaced(client, &namespace);
    let what = what(&namespace, &args.name);
    let at = Timestamp::now().to_string();
    let step = match request {
        Request::Reconcile => "request a pass of",
        Request::Reset => "request a retry of",
    };
    patch(&api, step, &what, &args.name, request_patch(request, &at)).await?;
    let asked = format!("{what}: {} set to {at}\n", request.annotation());
    if !args.wait {
        return Ok((asked, false));
    }
    let status = wait_handled(&api, &args.name, &what, request, &at, args.timeout).await?;
    let (text, failed) = outcome(&status);
    Ok((asked + &text, failed))
}

/// Polls until the Manifest's status echoes `at` for `request`; an error after `timeout`.
async fn wait_handled(
    api: &Api<Manifest>,
    name: &str,
    what: &str,
    request: Request,
    at: &str,
    timeout: Duration,
) -> anyhow::Result<ManifestStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        let manifest = api
            .get(name)
            .await
            .map_err(|e| api_error("wait for", what, e))?;
        let status = manifest.status.unwrap_or_default();
        if request.handled(&status) == Some(at) {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            let seen = request.handled(&status).unwrap_or("nothing");
            anyhow::bail!(
                "{what}: no pass handled the request within {}s (the status echoes {seen}, not {at}); is a replica running and does it own the Manifest's shard?",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

/// The pass's outcome in a line, and whether it failed (`Error`).
pub fn outcome(status: &ManifestStatus) -> (String, bool) {
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    let message = ready.map(|c| c.message.as_str()).unwrap_or_default();
    let state = status
        .state
        .map_or_else(|| "-".to_owned(), |s| format!("{s:?}"));
    (
        format!("handled: {state}: {message}\n"),
        status.state == Some(State::Error),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_set_their_own_annotation_and_read_their_own_echo() {
        let at = "2026-12-02T03:00:00.123Z";
        assert_eq!(
            request_patch(Request::Reconcile, at),
            json!({"metadata": {"annotations": {"reconcile.modulemanager.io/requestedAt": at}}})
        );
        assert_eq!(
            request_patch(Request::Reset, at),
            json!({"metadata": {"annotations": {"reconcile.modulemanager.io/resetAt": at}}})
        );
        let status = ManifestStatus {
            last_handled_reconcile_at: Some("a".into()),
            last_handled_reset_at: Some("b".into()),
            ..Default::default()
        };
        assert_eq!(Request::Reconcile.handled(&status), Some("a"));
        assert_eq!(Request::Reset.handled(&status), Some("b"));
    }

    #[test]
    fn an_outcome_fails_only_in_error() {
        let status = |state| ManifestStatus {
            state: Some(state),
            ..Default::default()
        };
        assert_eq!(
            outcome(&status(State::Ready)),
            ("handled: Ready: \n".into(), false)
        );
        assert!(outcome(&status(State::Error)).1);
        assert!(!outcome(&status(State::Processing)).1);
        assert_eq!(parse_timeout("90s"), Ok(Duration::from_secs(90)));
        assert!(parse_timeout("soon").is_err());
    }
}
