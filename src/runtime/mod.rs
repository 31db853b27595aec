//! Runtime: one replica's wiring from its validated flags (`args`), the permission preflight,
//! the startup checks, and the shutdown sequence.

pub mod args;
pub mod preflight;
mod shutdown;
mod start;
mod statefulset;

pub use args::{ConfigError, RunArgs, RuntimeConfig};

use crate::telemetry::metrics::{self, Metrics};
use crate::telemetry::requests::{self, RequestTarget};

/// Runs one replica until SIGTERM or SIGINT: checks its permissions and flags against the
/// cluster, starts the controller, the fleet loop and the admin API, then shuts them down in
/// order (the controller drains its passes; the fleet loop keeps or hands over the shards).
pub async fn run(config: RuntimeConfig) -> anyhow::Result<()> {
    crate::telemetry::init(config.log_format);
    let mut registry = metrics::registry();
    let metrics = Metrics::register(&mut registry);
    // Every request of the replica's own connection is counted (`module_manager_api_requests_total`).
    let client = requests::client(
        kube::Config::infer().await?,
        &metrics.api,
        RequestTarget::Local,
    )?;
    // Every permission the code uses, asked before anything starts: one error lists what is missing.
    preflight::check(
        &client,
        preflight::Config {
            fleet_namespace: &config.fleet.membership.namespace,
            statefulset: config.fleet.statefulset.as_deref(),
            impersonating: config.service_accounts.default.is_some()
                || config.service_accounts.required,
        },
    )
    .await?;
    if let Some(selector) = &config.manifest_selector {
        start::check_selector(&client, selector).await?;
    }
    let shard_filter = start::shard_filter(&client, config.server_side_sharding).await?;
    let charts = start::charts(&config, metrics.render.clone()).await?;
    if let Some(name) = &config.fleet.statefulset {
        let namespace = &config.fleet.membership.namespace;
        statefulset::check(&client, namespace, name, &config.replica).await?;
    }
    let replica = start::start(config, client, charts, metrics, registry, shard_filter).await?;
    // SIGTERM: the controller stops dispatching and drains its passes; then the fleet loop
    // either keeps the shards (restart) or hands them over (leave).
    replica.controller.run(shutdown::signal()).await?;
    replica.census.abort();
    let _ = replica.stop_fleet.send(());
    let (mut fleet, exit) = replica.fleet.await?;
    fleet.exit(exit).await;
    tracing::info!(?exit, "stopped");
    Ok(())
}
