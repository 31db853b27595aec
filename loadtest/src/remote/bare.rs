//! The `remote` scenario's same-run baselines: a bare client doing per target what the fleet
//! does — a client of its own built from the target's kubeconfig (through the same proxy: its
//! own connection, TLS session and credential), discovery of the chart's kinds on that target,
//! and a server-side apply of every release's objects into the target's namespace — and
//! nothing else (no Manifest, no status, no readiness wait); and the same client also sending
//! the Manifest's minimum writes on the local cluster per release ([`Writes::Minimum`]: its
//! create, the claim, the inventory, one `Ready` status), which bounds what any fleet that keeps
//! the Manifest's contract can reach on this machine.

use std::time::Instant;

use anyhow::Context;
use futures::{StreamExt, stream};
use kube::Client;
use kube::api::PatchParams;
use serde_json::Value;

use super::testbed::Target;
use crate::baseline::{self, FIELD_MANAGER, Releases, TEMPLATE_RELEASE};
use crate::manifest_writes::{LocalWrites, Shape, Writes};
use crate::results::Burst;

/// The Manifest writes of [`apply`]'s second baseline: where, and what the Manifests look like
/// (their `spec.target` is filled per target).
pub struct ManifestWrites<'a> {
    pub local: LocalWrites,
    pub chart: &'a Value,
    pub interval: &'a str,
    pub labels: &'a std::collections::BTreeMap<String, String>,
}

/// Applies `modules` releases (`b0`, `b1`… — not the fleet's names; `m0`… with `writes`) of
/// `template` (the chart rendered as [`TEMPLATE_RELEASE`]) to every target, `parallelism`
/// targets at once, each release with the Manifest's minimum `writes` if given; timed from the
/// first client built to the last answer. The first error fails the whole, naming the target.
pub async fn apply(
    targets: &[Target],
    template: &[Value],
    modules: usize,
    parallelism: usize,
    writes: Option<&ManifestWrites<'_>>,
) -> anyhow::Result<Burst> {
    let prefix = if writes.is_some() { "m" } else { "b" };
    let names: Vec<String> = (0..modules).map(|i| format!("{prefix}{i}")).collect();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let started = Instant::now();
    let mut targets_done = stream::iter(targets)
        .map(|target| {
            let (names, params) = (&names, &params);
            async move {
                apply_to(target, template, names, params, writes)
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
    writes: Option<&ManifestWrites<'_>>,
) -> anyhow::Result<()> {
    let client = client(&target.kubeconfig()).await?;
    let releases = Releases {
        objects_template: template,
        template_release: TEMPLATE_RELEASE,
        names,
        parallelism: 1,
    };
    // As the fleet's Manifests name their target (`load.rs`).
    let more_spec = serde_json::json!({
        "target": {"kubeconfigSecretRef": {"name": target.name}},
        "targetNamespace": target.name,
    });
    for (release, objects) in baseline::prepare(&client, &target.name, &releases).await? {
        let Some(writes) = writes else {
            for object in objects {
                object
                    .apply(params)
                    .await
                    .with_context(|| format!("release {release}"))?;
            }
            continue;
        };
        let shape = Shape {
            chart: writes.chart,
            interval: writes.interval,
            labels: writes.labels,
            more_spec: Some(&more_spec),
        };
        let name = format!("{}-{release}", target.name);
        writes
            .local
            .install(&name, Writes::Minimum, &shape, &objects)
            .await
            .with_context(|| format!("release {release}"))?;
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
