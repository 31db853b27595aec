//! The shell examples of `docs/operations.md` — waiting in CI, a pass now, a reset, a diff, the
//! Argo CD health check — run as written (`bash -e`, with `kubectl` and `module-manager` on
//! `PATH`) against the real kube-apiserver, with the pipeline reconciling in-process. Only the
//! namespace (`apps`, `argocd`) is replaced by the test's own.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use module_manager::api::State;
use serde_json::json;
use test_support::repo;

/// The longest one example may take (its own waits are shorter; a loaded CI machine).
const EXAMPLE_LIMIT: Duration = Duration::from_secs(300);

/// The `sh` code blocks of the section `## <title>` of `markdown`, in order.
fn sh_blocks(markdown: &str, title: &str) -> Vec<String> {
    let heading = format!("## {title}\n");
    let start = markdown
        .find(&heading)
        .unwrap_or_else(|| panic!("no section {title:?}"));
    let section = &markdown[start + heading.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut blocks = Vec::new();
    let mut rest = section;
    while let Some(open) = rest.find("```sh\n") {
        let body = &rest[open + "```sh\n".len()..];
        let close = body.find("\n```").expect("a closed code block");
        blocks.push(body[..close + 1].to_owned());
        rest = &body[close + 4..];
    }
    blocks
}

#[test]
fn code_blocks_of_a_section_are_found_in_order() {
    let doc = "## A\n```sh\none\n```\ntext\n```sh\ntwo\n```\n## B\n```sh\nthree\n```\n";
    assert_eq!(sh_blocks(doc, "A"), ["one\n", "two\n"]);
    assert_eq!(sh_blocks(doc, "B"), ["three\n"]);
}

/// A directory for `PATH` with `module-manager` (this build), `kubectl`, and `helm` for the
/// diff's renderer.
fn tools_dir() -> tempfile::TempDir {
    let tools = testenv::Tools::locate().expect("tools built");
    let dir = tempfile::tempdir().unwrap();
    let kubectl = tools.kube_apiserver.with_file_name("kubectl");
    assert!(
        kubectl.is_file(),
        "{} is missing: run hack/build-tools.sh",
        kubectl.display()
    );
    for (name, target) in [
        (
            "module-manager",
            PathBuf::from(env!("CARGO_BIN_EXE_module-manager")),
        ),
        ("kubectl", kubectl),
        ("helm", tools.helm.clone()),
    ] {
        std::os::unix::fs::symlink(target, dir.path().join(name)).unwrap();
    }
    dir
}

/// Runs one example with `bash -e` in `cwd`: its exit code and output.
async fn run(example: &str, cwd: &Path, tools: &Path, kubeconfig: &Path) -> (i32, String) {
    let path = std::env::join_paths(std::iter::once(tools.to_owned()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let output = tokio::process::Command::new("bash")
        .args(["-e", "-c", example])
        .current_dir(cwd)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(EXAMPLE_LIMIT, output)
        .await
        .unwrap_or_else(|_| panic!("no exit within {EXAMPLE_LIMIT:?}:\n{example}"))
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn the_operations_examples_run_as_written() {
    let h = common::operator("docs", "docs-0").await;
    let kubeconfig = common::control_plane().await.kubeconfig().to_owned();
    let tools = tools_dir();
    // The examples' working directory: `manifest.yaml`, `./charts` (the chart root) and
    // `deploy/argocd/argocd-cm.yaml` as in a checkout.
    let cwd = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo(), cwd.path().join("charts")).unwrap();
    // Argo CD's ConfigMap patch names Argo CD's namespace: the test's instead.
    let patch = std::fs::read_to_string(repo().join("deploy/argocd/argocd-cm.yaml"))
        .unwrap()
        .replace("namespace: argocd", &format!("namespace: {}", h.ns));
    std::fs::create_dir_all(cwd.path().join("deploy/argocd")).unwrap();
    std::fs::write(cwd.path().join("deploy/argocd/argocd-cm.yaml"), patch).unwrap();
    let manifest = json!({
        "apiVersion": "modulemanager.io/v1alpha1", "kind": "Manifest",
        "metadata": {"name": "web", "namespace": h.ns},
        "spec": {"module": "web", "chart": {"path": "examples/charts/catalog-v1"},
                 "values": {"greeting": "hi"}, "interval": "1h"},
    });
    std::fs::write(cwd.path().join("manifest.yaml"), manifest.to_string()).unwrap();
    // Argo CD's ConfigMap, for the health-check patch.
    Api::<ConfigMap>::namespaced(h.client.clone(), &h.ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "argocd-cm"}})).unwrap(),
        )
        .await
        .unwrap();

    let doc = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let mut ran = 0;
    for title in [
        "Waiting in CI",
        "Run a pass now",
        "Retry a failed hook or error",
        "See what a pass would change",
        "Argo CD",
    ] {
        let blocks = sh_blocks(&doc, title);
        assert!(!blocks.is_empty(), "no example in {title:?}");
        for block in blocks {
            let example = block
                .replace("-n apps", &format!("-n {}", h.ns))
                .replace("ns=apps", &format!("ns={}", h.ns))
                .replace("-n argocd", &format!("-n {}", h.ns));
            let (code, output) = run(&example, cwd.path(), tools.path(), &kubeconfig).await;
            assert_eq!(code, 0, "{title}: exit {code}\n{example}\n{output}");
            ran += 1;
        }
    }
    assert!(ran >= 7, "{ran} examples");

    // What the examples did: the Manifest is Ready, both requests were handled, the health
    // check is in Argo CD's ConfigMap.
    let web = common::wait_state(&h.manifests, "web", State::Ready, Duration::from_secs(60)).await;
    let status = web.status.unwrap();
    assert!(status.last_handled_reconcile_at.is_some());
    assert!(status.last_handled_reset_at.is_some());
    let argocd = Api::<ConfigMap>::namespaced(h.client.clone(), &h.ns)
        .get("argocd-cm")
        .await
        .unwrap();
    assert!(
        argocd
            .data
            .unwrap_or_default()
            .contains_key("resource.customizations.health.modulemanager.io_Manifest")
    );
}
