//! Benchmarks of the reconcile pipeline on the real control plane and renderer (`make bench`):
//! a fresh install vs a pass over an unchanged Manifest, and a render-cache miss vs a hit.
//! Reported as medians and ratios measured in the same run (the machine is shared and noisy).
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use module_manager::api::{Manifest, State};
use module_manager::reconcile::reconcile;
use module_manager::render::RenderRequest;
use module_manager::source::{self, Limits};
use serde_json::json;

const INSTALLS: usize = 10;
const UNCHANGED_PASSES: usize = 50;
const RENDER_MISSES: usize = 20;
const RENDER_HITS: usize = 2000;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .canonicalize()
        .unwrap()
}

/// Median and 90th percentile.
fn summary(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[samples.len() * 9 / 10])
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let control_plane = testenv::shared(testenv::Options {
        controller_manager: true,
        controllers: Some("namespace,garbagecollector,serviceaccount".into()),
        crd_files: vec![repo().join("crds/manifest.yaml")],
        ..Default::default()
    })
    .await?;
    let client = control_plane.client().await?;
    let ns = control_plane.namespace(&client, "bench").await?;
    let helm_home = tempfile::tempdir()?;
    // Outside a fleet: this process owns every shard.
    let fence = module_manager::shard::fence::Ownership::everything()
        .dispatch(0)
        .expect("owns every shard");
    let ctx = test_support::context(client.clone(), helm_home.path())
        .replica("bench")
        .build()
        .await?;
    let manifests = Api::<Manifest>::namespaced(client.clone(), &ns);

    // Fresh installs: every pass until Ready (finalizer, render miss, apply, status).
    let mut installs = Vec::new();
    for i in 0..INSTALLS {
        let name = format!("install-{i}");
        let manifest: Manifest = serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1", "kind": "Manifest",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"module": name, "chart": {"path": "examples/charts/catalog-v1"}, "values": {"greeting": "hi"}},
        }))?;
        manifests.create(&PostParams::default(), &manifest).await?;
        let start = Instant::now();
        loop {
            let current = Arc::new(manifests.get(&name).await?);
            let ready = current.status.as_ref().is_some_and(|s| {
                s.state == Some(State::Ready)
                    && s.observed_generation == current.metadata.generation
            });
            if ready {
                break;
            }
            reconcile(current, &ctx, &fence).await;
        }
        installs.push(start.elapsed());
    }

    // Passes over an unchanged Manifest (drift checks): render from the cache, no-op applies,
    // no status write.
    let ready = Arc::new(manifests.get("install-0").await?);
    reconcile(ready.clone(), &ctx, &fence).await; // the first pass after install renders with --is-upgrade
    let ready = Arc::new(manifests.get("install-0").await?);
    let version_before = ready.metadata.resource_version.clone();
    let misses_before = ctx.renderer.cache_stats().misses;
    let mut unchanged = Vec::new();
    for _ in 0..UNCHANGED_PASSES {
        let start = Instant::now();
        reconcile(ready.clone(), &ctx, &fence).await;
        unchanged.push(start.elapsed());
    }
    assert_eq!(
        ctx.renderer.cache_stats().misses,
        misses_before,
        "unchanged passes must not render"
    );
    assert_eq!(
        manifests.get("install-0").await?.metadata.resource_version,
        version_before,
        "and must not write"
    );

    // Render-cache miss (the renderer runs) vs hit.
    let source = module_manager::api::ChartSource {
        path: Some("examples/charts/web".into()),
        ..Default::default()
    };
    let chart = source::resolve(&source, &repo(), Limits::default())?;
    let surface = ctx.cluster.surface();
    let request = |replicas: usize| RenderRequest {
        chart: chart.clone(),
        release: "bench".into(),
        namespace: ns.clone(),
        values: json!({"replicaCount": replicas})
            .as_object()
            .cloned()
            .unwrap(),
        kube_version: surface.kube_version.clone(),
        api_versions: surface.api_versions.clone(),
        is_upgrade: false,
    };
    let mut misses = Vec::new();
    for i in 0..RENDER_MISSES {
        let req = request(1000 + i);
        let start = Instant::now();
        ctx.renderer.render(&req).await?;
        misses.push(start.elapsed());
    }
    let hit_request = request(1000);
    let mut hits = Vec::new();
    for _ in 0..RENDER_HITS {
        let start = Instant::now();
        ctx.renderer.render(&hit_request).await?;
        hits.push(start.elapsed());
    }

    let (install_p50, install_p90) = summary(installs);
    let (unchanged_p50, unchanged_p90) = summary(unchanged);
    let (miss_p50, miss_p90) = summary(misses);
    let (hit_p50, hit_p90) = summary(hits);
    println!("| measurement | runs | median | p90 |");
    println!("|---|---|---|---|");
    println!(
        "| fresh install, every pass until Ready | {INSTALLS} | {} | {} |",
        ms(install_p50),
        ms(install_p90)
    );
    println!(
        "| pass over an unchanged Manifest | {UNCHANGED_PASSES} | {} | {} |",
        ms(unchanged_p50),
        ms(unchanged_p90)
    );
    println!(
        "| render, cache miss (the renderer runs) | {RENDER_MISSES} | {} | {} |",
        ms(miss_p50),
        ms(miss_p90)
    );
    println!(
        "| render, cache hit | {RENDER_HITS} | {} | {} |",
        ms(hit_p50),
        ms(hit_p90)
    );
    println!();
    println!(
        "fresh install / unchanged pass (medians): {:.1}x",
        install_p50.as_secs_f64() / unchanged_p50.as_secs_f64()
    );
    println!(
        "render miss / render hit (medians): {:.0}x",
        miss_p50.as_secs_f64() / hit_p50.as_secs_f64()
    );
    Ok(())
}
