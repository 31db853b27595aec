//! Fidelity: every chart of the repository (`examples/`, `tests/fixtures/`, `loadtest/charts/`)
//! and the corpus in `tests/fixtures/fidelity/` renders byte-identically through the renderer
//! backend and the `helm` CLI backend (the reference), under several kube versions, API version
//! sets (both `--api-versions` forms) and install/upgrade; a chart that fails fails with the same
//! message.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use module_manager::render::{Backend, HelmRenderer, RenderLimits, RenderRequest};
use module_manager::source::{self, Limits};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .canonicalize()
        .unwrap()
}

/// Charts that cannot go through the CLI backend here: `loop` never ends (each backend's own
/// test covers its timeout), `memory` would take the machine's memory under the CLI;
/// `address-space` and `fail-huge` test the renderer's own bounds (`tests/renderer.rs`): a
/// 10 GB allocation, a 17 MB error whose cut differs by where each backend cuts it.
const SKIPPED: &[&str] = &[
    "tests/fixtures/charts/loop",
    "tests/fixtures/charts/memory",
    "tests/fixtures/charts/address-space",
    "tests/fixtures/charts/fail-huge",
];

/// Every chart directory under the given roots (relative to the repository).
fn charts() -> Vec<String> {
    let roots = [
        "examples/charts",
        "tests/fixtures/charts",
        "loadtest/charts",
        "tests/fixtures/fidelity",
    ];
    let mut charts = Vec::new();
    for root in roots {
        for entry in std::fs::read_dir(repo().join(root)).unwrap() {
            let path = entry.unwrap().path();
            let relative = format!("{root}/{}", path.file_name().unwrap().to_string_lossy());
            if path.is_dir() && !SKIPPED.contains(&relative.as_str()) {
                charts.push(relative);
            }
        }
    }
    charts.sort();
    charts
}

/// (kube version, API versions, is-upgrade): what discovery could report, in both flag forms.
fn variants() -> Vec<(&'static str, Vec<String>, bool)> {
    let list = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    vec![
        ("v1.36.3", list(&["apps/v1", "v1"]), false),
        (
            "v1.30.0",
            list(&[
                "v1",
                "batch/v1/CronJob",
                "a.example.com/v1,b.example.com/v1",
            ]),
            true,
        ),
        (
            "v1.36.3",
            list(&[
                "apps/v1",
                "batch/v1",
                "example.com/v1",
                "example.com/v1/Gadget",
                "networking.k8s.io/v1",
                "policy/v1",
                "v1",
            ]),
            true,
        ),
    ]
}

fn request(chart: &str, kube: &str, apis: &[String], upgrade: bool) -> RenderRequest {
    let source = module_manager::api::ChartSource {
        path: Some(chart.into()),
        ..Default::default()
    };
    RenderRequest {
        chart: source::resolve(&source, &repo(), Limits::default())
            .unwrap_or_else(|e| panic!("{chart} resolves: {e}")),
        release: "fidelity".into(),
        namespace: "apps".into(),
        values: serde_json::Map::new(),
        kube_version: kube.into(),
        api_versions: apis.to_vec().into(),
        is_upgrade: upgrade,
    }
}

async fn start(backend: Backend, home: &Path) -> Arc<HelmRenderer> {
    Arc::new(
        HelmRenderer::start(
            backend,
            home.to_owned(),
            RenderLimits::default(),
            Default::default(),
        )
        .await
        .expect("the backend starts"),
    )
}

#[tokio::test]
async fn both_backends_render_every_chart_identically() {
    let tools = testenv::Tools::locate().expect("tools built");
    let home = tempfile::tempdir().unwrap();
    let helm = start(Backend::Helm(tools.helm), &home.path().join("helm")).await;
    let renderer = start(
        Backend::Renderer(tools.renderer),
        &home.path().join("renderer"),
    )
    .await;
    assert_eq!(helm.version(), renderer.version());
    let charts = charts();
    let corpus = charts
        .iter()
        .filter(|c| c.starts_with("tests/fixtures/fidelity/"))
        .count();
    assert!(corpus >= 30, "the corpus has {corpus} charts");

    let cases: Vec<(String, RenderRequest)> = charts
        .iter()
        .flat_map(|chart| {
            variants().into_iter().map(move |(kube, apis, upgrade)| {
                let name = format!("{chart} kube={kube} apis={apis:?} upgrade={upgrade}");
                (name, request(chart, kube, &apis, upgrade))
            })
        })
        .collect();
    let results: Vec<(String, Option<String>, bool)> = futures::stream::iter(cases)
        .map(|(name, request)| {
            let (helm, renderer) = (helm.clone(), renderer.clone());
            async move {
                let (want, got) = tokio::join!(
                    helm.render_uncached(&request),
                    renderer.render_uncached(&request)
                );
                let mismatch = match (&want, &got) {
                    (Ok(want), Ok(got)) if want == got => None,
                    (Err(want), Err(got)) if want.to_string() == got.to_string() => None,
                    _ => Some(format!("helm: {want:?}\nrenderer: {got:?}")),
                };
                (name, mismatch, want.is_ok())
            }
        })
        .buffer_unordered(4)
        .collect()
        .await;

    let rendered = results.iter().filter(|(_, _, ok)| *ok).count();
    let failed = results.len() - rendered;
    let mismatches: Vec<String> = results
        .into_iter()
        .filter_map(|(name, mismatch, _)| mismatch.map(|m| format!("{name}\n{m}")))
        .collect();
    assert!(
        mismatches.is_empty(),
        "{} of {} renders differ:\n\n{}",
        mismatches.len(),
        rendered + failed,
        mismatches.join("\n\n")
    );
    eprintln!("{rendered} renders identical, {failed} failures identical");
    // Both kinds are exercised: charts that render and charts that fail (same message).
    assert!(
        rendered >= 100 && failed >= 20,
        "{rendered} rendered, {failed} failed"
    );
}
