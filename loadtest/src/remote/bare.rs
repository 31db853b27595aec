//! The `remote` scenario's same-run baseline: a bare client doing per target what the fleet
//! does — a client of its own built from the target's kubeconfig (through the same proxy: its
//! own connection, TLS session and credential), discovery of the chart's kinds on that target,
//! and a server-side apply of every release's objects into the target's namespace — and
//! nothing else (no Manifest, no status, no readiness wait).

use std::time::Instant;

use anyhow::Context;
use futures::{StreamExt, stream};
use kube::Client;
use kube::api::PatchParams;
use serde_json::Value;

use super::testbed::Target;
use crate::baseline::{self, FIELD_MANAGER, Releases, TEMPLATE_RELEASE};
use crate::results::Burst;

/// Applies `modules` releases (`b0`, `b1`… — not the fleet's names) of `template` (the chart
/// rendered as [`TEMPLATE_RELEASE`]) to every target, `parallelism` targets at once; timed from
/// the first client built to the last answer. The first error fails the whole, naming the
/// target.
pub async fn apply(
    targets: &[Target],
    template: &[Value],
    modules: usize,
    parallelism: usize,
) -> anyhow::Result<Burst> {
    let names: Vec<String> = (0..modules).map(|i| format!("b{i}")).collect();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let started = Instant::now();
    let mut targets_done = stream::iter(targets)
        .map(|target| {
            let (names, params) = (&names, &params);
            async move {
                apply_to(target, template, names, params)
                    .await
                    .with_context(|| format!("target {}", target.name))
            }
        })
        .buffer_unordered(parallelism.max(1));
    while let Some(done) = targets_done.next().await {
        done?;
    }
    Ok(baseline::burst(
        parallelism,
        targets.len() * modules,
        started.elapsed(),
    ))
}

async fn apply_to(
    target: &Target,
    template: &[Value],
    names: &[String],
    params: &PatchParams,
) -> anyhow::Result<()> {
    let client = client(&target.kubeconfig()).await?;
    let releases = Releases {
        objects_template: template,
        template_release: TEMPLATE_RELEASE,
        names,
        parallelism: 1,
    };
    for (release, objects) in baseline::prepare(&client, &target.name, &releases).await? {
        for object in objects {
            object
                .apply(params)
                .await
                .with_context(|| format!("release {release}"))?;
        }
    }
    Ok(())
}

/// A client of a target's kubeconfig (text), with the harness's user agent.
async fn client(kubeconfig: &str) -> anyhow::Result<Client> {
    let kubeconfig: kube::config::Kubeconfig =
        serde_yaml_ng::from_str(kubeconfig).context("parse the target's kubeconfig")?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .context("load the target's kubeconfig")?;
    module_manager::telemetry::requests::with_user_agent(&mut config, crate::audit::HARNESS_AGENT);
    Ok(Client::try_from(config)?)
}
