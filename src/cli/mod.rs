//! The command line's clients: `module-manager admin …` asks a replica's admin API; `get`,
//! `describe`, `reconcile`, `suspend`, `resume`, `retry` and `diff` work on Manifests in the
//! cluster of the kubeconfig, as the caller. Also a kubectl plugin (`kubectl-module_manager`).

pub mod client;
pub mod connect;
pub mod diff;
pub mod locate;
pub mod manifests;
pub mod tables;
pub mod views;
pub mod watch;

pub use client::{FETCH_TIMEOUT, MAX_RESPONSE_BODY, TARGETS_TIMEOUT, fetch, fetch_within};
pub use tables::{
    drain_table, manifest_table, member_state_name, members_table, queue_table, shard_status_name,
    shard_table, shards_table, targets_table,
};

use std::ffi::OsStr;
use std::process::ExitCode;

use axum::http::Method;
use clap::Subcommand;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::admin::{DRAIN_PATH, TARGETS_PATH, TargetsAnswer, is_dns_label, is_dns_subdomain};
use manifests::Request;
use views::{Output, encoded};

/// The executable's name as a kubectl plugin: `kubectl module-manager …` runs it.
pub const PLUGIN_NAME: &str = "kubectl-module_manager";

/// The name help and usage show: `kubectl module-manager` when invoked as the plugin (`argv[0]`
/// is [`PLUGIN_NAME`], with or without a directory), else `module-manager`.
pub fn display_name(argv0: Option<&OsStr>) -> &'static str {
    let plugin = argv0
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|name| name == PLUGIN_NAME);
    if plugin {
        "kubectl module-manager"
    } else {
        "module-manager"
    }
}

/// The Manifest commands (flattened into the top level of `module-manager`).
#[derive(Subcommand)]
pub enum ManifestCommand {
    /// List Manifests (or show one): NAME, READY, STATUS, CHART VERSION, OWNER, AGE.
    Get(manifests::GetArgs),
    /// Show one Manifest: spec, conditions, inventory, hook run, last operation, Events.
    Describe(manifests::DescribeArgs),
    /// Show a Manifest's releases (`status.history`), newest first: REVISION, OPERATION, CHART,
    /// GENERATION, STARTED, ENDED, OUTCOME, MESSAGE.
    History(manifests::HistoryArgs),
    /// Ask for a pass now (annotation `reconcile.modulemanager.io/requestedAt`).
    Reconcile(manifests::RequestArgs),
    /// Stop reconciling a Manifest (`spec.suspend: true`).
    Suspend(manifests::NameArgs),
    /// Reconcile a suspended Manifest again (`spec.suspend: false`).
    Resume(manifests::NameArgs),
    /// Try a failed hook run or permanent error again (annotation `…/resetAt`).
    Retry(manifests::RequestArgs),
    /// Show what the next pass would change, changing nothing; exit 0: none, 1: changes, 2: error.
    Diff(diff::DiffArgs),
}

/// Runs a Manifest command: prints its answer, or its error on stderr. The exit code: 0, 1 on
/// an error (or a `--wait` that ended in `Error`); `diff` as `kubectl diff` (1: changes, 2: error).
pub async fn manifest_command(command: ManifestCommand) -> ExitCode {
    let is_diff = matches!(command, ManifestCommand::Diff(_));
    let result = match command {
        ManifestCommand::Get(args) => manifests::get(args).await.map(|t| (t, false)),
        ManifestCommand::Describe(args) => manifests::describe(args).await.map(|t| (t, false)),
        ManifestCommand::History(args) => manifests::history(args).await.map(|t| (t, false)),
        ManifestCommand::Reconcile(args) => manifests::request(args, Request::Reconcile).await,
        ManifestCommand::Retry(args) => manifests::request(args, Request::Reset).await,
        ManifestCommand::Suspend(args) => {
            manifests::set_suspend(args, true).await.map(|t| (t, false))
        }
        ManifestCommand::Resume(args) => manifests::set_suspend(args, false)
            .await
            .map(|t| (t, false)),
        ManifestCommand::Diff(args) => diff::diff(args).await,
    };
    match result {
        Ok((text, flagged)) => {
            print!("{text}");
            ExitCode::from(u8::from(flagged))
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(if is_diff { 2 } else { 1 })
        }
    }
}

// The flags of `module-manager admin` (its help text is the subcommand's doc comment in main).
#[derive(clap::Args)]
pub struct AdminArgs {
    /// The replica's admin API.
    #[arg(
        long,
        env = "MODULE_MANAGER_ADMIN_URL",
        default_value = "http://127.0.0.1:9440",
        global = true
    )]
    url: String,
    /// Output format: the table, or the admin API's answer as JSON or YAML.
    #[arg(short = 'o', long, value_enum, default_value_t, global = true)]
    output: Output,
    #[command(subcommand)]
    view: AdminView,
}

#[derive(Subcommand)]
enum AdminView {
    /// The fleet's members and whether each is live.
    Members,
    /// Every shard (owner, desired owner, state, epoch, Manifests, queued), then per member.
    Shards,
    /// One shard.
    Shard {
        /// The shard number.
        shard: u32,
    },
    /// The replica's queue per shard, then every member's published load.
    Queue,
    /// One Manifest: UID, shard, owner, state (for a caller who may `get` it).
    Manifest {
        /// The Manifest's namespace.
        namespace: String,
        /// The Manifest's name.
        name: String,
        #[command(flatten)]
        token: AdminToken,
    },
    /// The fleet's remote targets (`GET /v1/targets`): per target its server, Manifests Ready,
    /// why it fails and since when, and when its credential expires; failing ones first, by
    /// reason. For a caller who may `get` the non-resource URL `/v1/targets`.
    Targets {
        /// Only the failing targets and those whose credential is due.
        #[arg(long)]
        failing: bool,
        /// Only the Manifests (and kubeconfig Secrets) of this namespace.
        #[arg(long = "target-namespace", value_name = "NAMESPACE")]
        namespace: Option<String>,
        /// Most rows (the counts cover every target).
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
        #[command(flatten)]
        token: AdminToken,
    },
    /// Make the replica hand every shard over and take none (`POST /v1/drain`).
    Drain(AdminToken),
    /// Let the replica take shards again (`DELETE /v1/drain`).
    Undrain(AdminToken),
}

#[derive(clap::Args)]
struct AdminToken {
    /// Bearer token (audience `module-manager`) of a caller allowed to `post`/`delete` the
    /// non-resource URL `/v1/drain` (drain, undrain), to `get` `/v1/targets` (targets), or to
    /// `get` the Manifest (manifest).
    #[arg(long, env = "MODULE_MANAGER_TOKEN", hide_env_values = true)]
    token: String,
}

/// Asks the replica and shows the answer: `table` of it, or the answer itself as JSON/YAML.
async fn shown<T: DeserializeOwned + Serialize>(
    args: &AdminArgs,
    method: Method,
    path: &str,
    token: Option<&str>,
    table: fn(&T) -> String,
) -> anyhow::Result<String> {
    let answer: T = fetch(&args.url, method, path, token).await?;
    Ok(encoded(&answer, args.output)?.unwrap_or_else(|| table(&answer)))
}

/// Runs one `admin` subcommand: asks the replica at `--url`, answers the table (or `-o`) to print.
pub async fn admin(args: AdminArgs) -> anyhow::Result<String> {
    let a = &args;
    match &args.view {
        AdminView::Members => shown(a, Method::GET, "/v1/members", None, members_table).await,
        AdminView::Shards => shown(a, Method::GET, "/v1/shards", None, shards_table).await,
        AdminView::Shard { shard } => {
            let path = format!("/v1/shards/{shard}");
            shown(a, Method::GET, &path, None, shard_table).await
        }
        AdminView::Queue => shown(a, Method::GET, "/v1/queue", None, queue_table).await,
        AdminView::Manifest {
            namespace,
            name,
            token: AdminToken { token },
        } => {
            anyhow::ensure!(
                is_dns_label(namespace) && is_dns_subdomain(name),
                "not a Manifest's namespace and name: {namespace:?} {name:?}"
            );
            let path = format!("/v1/manifests/{namespace}/{name}");
            shown(a, Method::GET, &path, Some(token), manifest_table).await
        }
        AdminView::Targets {
            failing,
            namespace,
            limit,
            token: AdminToken { token },
        } => {
            let mut query = vec![format!("failing={failing}"), format!("limit={limit}")];
            if let Some(namespace) = namespace {
                anyhow::ensure!(is_dns_label(namespace), "not a namespace: {namespace:?}");
                query.push(format!("namespace={namespace}"));
            }
            let path = format!("{TARGETS_PATH}?{}", query.join("&"));
            let answer: TargetsAnswer =
                fetch_within(&a.url, Method::GET, &path, Some(token), TARGETS_TIMEOUT).await?;
            let now = k8s_openapi::jiff::Timestamp::now();
            Ok(encoded(&answer, a.output)?.unwrap_or_else(|| targets_table(&answer, now)))
        }
        AdminView::Drain(AdminToken { token }) => {
            shown(a, Method::POST, DRAIN_PATH, Some(token), drain_table).await
        }
        AdminView::Undrain(AdminToken { token }) => {
            shown(a, Method::DELETE, DRAIN_PATH, Some(token), drain_table).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_name_is_recognised_from_argv0() {
        let name = |argv0: &str| display_name(Some(OsStr::new(argv0)));
        assert_eq!(name("kubectl-module_manager"), "kubectl module-manager");
        assert_eq!(
            name("/usr/local/bin/kubectl-module_manager"),
            "kubectl module-manager"
        );
        assert_eq!(name("/usr/local/bin/module-manager"), "module-manager");
        assert_eq!(name("kubectl-module_manager-0.1.0"), "module-manager");
        assert_eq!(display_name(None), "module-manager");
    }

    #[tokio::test]
    async fn a_manifest_is_named_validly_before_any_request() {
        let args = AdminArgs {
            // Nothing listens here: a request would fail differently.
            url: "http://127.0.0.1:1".into(),
            output: Output::Table,
            view: AdminView::Manifest {
                namespace: "Default".into(),
                name: "web".into(),
                token: AdminToken { token: "t".into() },
            },
        };
        let error = admin(args).await.unwrap_err().to_string();
        assert_eq!(
            error,
            r#"not a Manifest's namespace and name: "Default" "web""#
        );
    }
}
