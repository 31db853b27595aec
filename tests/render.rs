//! Rendering with the real pinned helm binary: output, the cache, and every way a chart or its
//! values can be bad.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use module_manager::render::{HelmRenderer, RenderError, RenderLimits, RenderRequest};
use module_manager::source::{self, Limits};
use serde_json::{Map, Value, json};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

async fn renderer(home: &Path, limits: RenderLimits) -> HelmRenderer {
    let helm = testenv::Tools::locate().expect("tools built").helm;
    HelmRenderer::new(helm, home.to_owned(), limits, Default::default())
        .await
        .expect("helm runs")
}

fn request(root: &Path, chart: &str, values: Value) -> RenderRequest {
    let source = module_manager::api::ChartSource {
        path: Some(chart.into()),
        ..Default::default()
    };
    RenderRequest {
        chart: source::resolve(&source, root, Limits::default()).expect("chart resolves"),
        release: "demo".into(),
        namespace: "apps".into(),
        values: values.as_object().cloned().unwrap_or_else(Map::new),
        kube_version: "v1.36.3".into(),
        api_versions: vec!["apps/v1".into(), "v1".into()].into(),
        is_upgrade: false,
    }
}

#[tokio::test]
async fn renders_the_example_chart_and_serves_repeats_from_the_cache() {
    let home = tempfile::tempdir().unwrap();
    let helm = renderer(home.path(), RenderLimits::default()).await;
    assert!(helm.version().starts_with(&format!(
        "v{}",
        testenv::tools::pinned_version("HELM_VERSION")
    )));
    let root = repo().canonicalize().unwrap();
    let req = request(&root, "examples/charts/web", json!({"replicaCount": 3}));

    let first = helm.render(&req).await.unwrap();
    assert!(first.manifest.contains("kind: Deployment"));
    assert!(first.manifest.contains("replicas: 3"));
    assert!(first.manifest.contains("name: demo-web"));
    let objects = module_manager::plan::parse_documents(&first.manifest).unwrap();
    assert_eq!(objects.len(), 2);

    let second = helm.render(&req).await.unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&first, &second),
        "the repeat came from the cache"
    );
    let stats = helm.cache_stats();
    assert_eq!((stats.hits, stats.misses), (1, 1));

    let changed = helm
        .render(&RenderRequest {
            values: json!({"replicaCount": 4}).as_object().cloned().unwrap(),
            ..req
        })
        .await
        .unwrap();
    assert!(changed.manifest.contains("replicas: 4"));
    assert_eq!(helm.cache_stats().misses, 2);
}

#[tokio::test]
async fn bad_charts_and_values_fail_with_helms_message() {
    let home = tempfile::tempdir().unwrap();
    let helm = renderer(home.path(), RenderLimits::default()).await;
    let root = repo().canonicalize().unwrap();
    let cases = [
        ("broken", json!({}), "cannot load Chart.yaml"),
        ("template-error", json!({}), "nosuchfunction"),
        ("needs-value", json!({}), "dbHost is required"),
        ("typed", json!({"replicaCount": "three"}), "replicaCount"),
    ];
    for (name, values, expected) in cases {
        match helm
            .render(&request(
                &root,
                &format!("tests/fixtures/charts/{name}"),
                values,
            ))
            .await
        {
            Err(e @ RenderError::Helm(_)) => {
                assert!(e.is_permanent());
                assert!(e.to_string().contains(expected), "{name}: {e}");
            }
            other => panic!("{name}: expected a helm error, got {other:?}"),
        }
    }
    assert_eq!(helm.cache_stats().hits, 0, "failures are not cached");

    // A release name cannot smuggle in a helm flag (here: read a file as values).
    let mut injected = request(&root, "examples/charts/catalog-v1", json!({}));
    injected.release = "-f/etc/passwd".into();
    let error = helm.render(&injected).await.unwrap_err().to_string();
    assert!(error.contains("invalid release name"), "{error}");
}

#[tokio::test]
async fn a_looping_chart_is_stopped_and_a_huge_output_refused() {
    let home = tempfile::tempdir().unwrap();
    let root = repo().canonicalize().unwrap();
    let render = async |limits: RenderLimits, chart: &str| {
        renderer(home.path(), limits)
            .await
            .render(&request(&root, chart, json!({})))
            .await
    };

    let short = RenderLimits {
        timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let looping = render(short, "tests/fixtures/charts/loop").await;
    assert!(
        matches!(looping, Err(RenderError::Timeout(d)) if d == Duration::from_secs(3)),
        "{looping:?}"
    );

    let small = RenderLimits {
        max_output: 512 * 1024,
        ..Default::default()
    };
    let huge = render(small, "tests/fixtures/charts/huge").await;
    assert!(
        matches!(huge, Err(RenderError::OutputTooLarge(524288))),
        "{huge:?}"
    );
}
