//! The command line's client side of the admin API: `module-manager admin …` asks a replica
//! and prints the answer as a table.

pub mod client;
pub mod tables;

pub use client::{FETCH_TIMEOUT, MAX_RESPONSE_BODY, fetch};
pub use tables::{
    drain_table, manifest_table, member_state_name, members_table, queue_table, shard_status_name,
    shard_table, shards_table,
};

use axum::http::Method;
use clap::Subcommand;

use crate::admin::{DRAIN_PATH, is_dns_label, is_dns_subdomain};

// The flags of `module-manager admin` (its help text is the subcommand's doc comment in main).
#[derive(clap::Args)]
pub struct AdminArgs {
    /// The replica's admin API.
    #[arg(long, default_value = "http://127.0.0.1:9440", global = true)]
    url: String,
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
    /// Make the replica hand every shard over and take none (`POST /v1/drain`).
    Drain(AdminToken),
    /// Let the replica take shards again (`DELETE /v1/drain`).
    Undrain(AdminToken),
}

#[derive(clap::Args)]
struct AdminToken {
    /// Bearer token (audience `module-manager`) of a caller allowed to `post`/`delete` the
    /// non-resource URL `/v1/drain` (drain, undrain), or to `get` the Manifest (manifest).
    #[arg(long, env = "MODULE_MANAGER_TOKEN", hide_env_values = true)]
    token: String,
}

/// Runs one `admin` subcommand: asks the replica at `--url`, answers the table to print.
pub async fn admin(args: AdminArgs) -> anyhow::Result<String> {
    let url = args.url.as_str();
    Ok(match args.view {
        AdminView::Members => members_table(&fetch(url, Method::GET, "/v1/members", None).await?),
        AdminView::Shards => shards_table(&fetch(url, Method::GET, "/v1/shards", None).await?),
        AdminView::Shard { shard } => {
            let path = format!("/v1/shards/{shard}");
            shard_table(&fetch(url, Method::GET, &path, None).await?)
        }
        AdminView::Queue => queue_table(&fetch(url, Method::GET, "/v1/queue", None).await?),
        AdminView::Manifest {
            namespace,
            name,
            token: AdminToken { token },
        } => {
            anyhow::ensure!(
                is_dns_label(&namespace) && is_dns_subdomain(&name),
                "not a Manifest's namespace and name: {namespace:?} {name:?}"
            );
            let path = format!("/v1/manifests/{namespace}/{name}");
            manifest_table(&fetch(url, Method::GET, &path, Some(&token)).await?)
        }
        AdminView::Drain(AdminToken { token }) => {
            drain_table(&fetch(url, Method::POST, DRAIN_PATH, Some(&token)).await?)
        }
        AdminView::Undrain(AdminToken { token }) => {
            drain_table(&fetch(url, Method::DELETE, DRAIN_PATH, Some(&token)).await?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manifest_is_named_validly_before_any_request() {
        let args = AdminArgs {
            // Nothing listens here: a request would fail differently.
            url: "http://127.0.0.1:1".into(),
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
