//! The shell examples of `docs/operations.md` — waiting in CI, a pass now, a reset, a diff, the
//! Argo CD health check — run as written (`bash -e`, with `kubectl` and `module-manager` on
//! `PATH`) against the real kube-apiserver, with the pipeline reconciling in-process. Only the
//! namespace (`apps`, `argocd`) is replaced by the test's own.
//!
//! And the README's commands after `make run`, as written, against a fleet of two real replica
//! processes: only the namespace `default` and the second replica's port are replaced, and
//! `cargo run` runs the binaries this build made (a `cargo` on `PATH` that knows just those
//! two `cargo run` lines).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, PostParams};
use module_manager::api::{Manifest, State};
use serde_json::json;
use test_support::fleet::{LocalFleet, ReplicaSettings};
use test_support::objects;
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

/// A directory for `PATH` with `module-manager` (this build) and `kubectl`; no helm or renderer:
/// `diff` finds the renderer `hack/build-tools.sh` built, as it does for a user of a checkout.
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
    ] {
        std::os::unix::fs::symlink(target, dir.path().join(name)).unwrap();
    }
    dir
}

/// Runs one example with `bash -e` in `cwd`: its exit code, stdout and stderr.
async fn run(example: &str, cwd: &Path, tools: &Path, kubeconfig: &Path) -> (i32, String, String) {
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
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
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
            let (code, out, err) = run(&example, cwd.path(), tools.path(), &kubeconfig).await;
            assert_eq!(code, 0, "{title}: exit {code}\n{example}\n{out}{err}");
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

/// The README's block of commands to try after `make run` (it starts `export KUBECONFIG=`).
fn readme_commands(readme: &str) -> String {
    let start = readme
        .find("```bash\nexport KUBECONFIG=")
        .expect("the README's block after make run")
        + "```bash\n".len();
    let block = &readme[start..];
    block[..block.find("\n```").expect("a closed code block") + 1].to_owned()
}

/// `cargo` for the README's commands: `cargo run -q -p testenv --bin testenv -- status` prints
/// the test's kubeconfig, `cargo run -q --bin module-manager -- …` runs this build's binary;
/// anything else fails.
const CARGO_RUN: &str = r#"#!/usr/bin/env bash
case "$*" in
  "run -q -p testenv --bin testenv -- status") echo "$KUBECONFIG_OF_TEST" ;;
  "run -q --bin module-manager -- "*) shift 5; exec module-manager "$@" ;;
  *) echo "cargo (test stand-in): not a README command: $*" >&2; exit 127 ;;
esac
"#;

/// A fleet of two replica processes reconciling the Manifests of `ns` labelled for it, and the
/// directory of their logs.
async fn readme_fleet(
    client: &kube::Client,
    kubeconfig: &Path,
    ns: &str,
) -> (LocalFleet, tempfile::TempDir) {
    let logs = tempfile::Builder::new()
        .prefix("readme-fleet-")
        .tempdir()
        .unwrap();
    let settings = ReplicaSettings {
        binary: env!("CARGO_BIN_EXE_module-manager").into(),
        chart_root: repo(),
        helm: testenv::Tools::locate().unwrap().helm,
        shards: 16,
        concurrency: 2,
        lease_duration_seconds: 6,
        renew_interval_seconds: 1,
        renew_deadline_seconds: 4,
        restart_grace_seconds: 30,
        handover_timeout_seconds: Some(5),
        statefulset: true,
        manifest_selector: format!("readme-test={ns}"),
        extra_args: Vec::new(),
        log_dir: logs.path().to_owned(),
    };
    let mut fleet = LocalFleet::create(client, kubeconfig, ns, "module-manager", 2, settings)
        .await
        .unwrap();
    for ordinal in 0..2 {
        fleet.start(ordinal).unwrap();
    }
    (fleet, logs)
}

/// The Manifest `web` of `ns` as in examples/manifests/ (but a chart of ConfigMaps: no kubelet
/// runs pods here), labelled for the fleet, Ready; and the namespace's `default`
/// ServiceAccount, which the README's token is for.
async fn ready_web(client: &kube::Client, ns: &str) {
    let manifests: Api<Manifest> = Api::namespaced(client.clone(), ns);
    let mut web = common::manifest(
        ns,
        "web",
        json!({"module": "web", "chart": {"path": "examples/charts/catalog-v1"}, "interval": "1h"}),
    );
    web.metadata.labels = Some([("readme-test".to_owned(), ns.to_owned())].into());
    common::create_manifest(&manifests, &web).await;
    common::wait_state(&manifests, "web", State::Ready, Duration::from_secs(120)).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    common::wait_until(
        "the default ServiceAccount",
        Duration::from_secs(60),
        async || objects::exists(&accounts, "default").await,
    )
    .await;
}

/// The README's commands for namespace `ns` and the fleet's admin ports, each after a line
/// `>>> <command>` on stdout (to tell their outputs apart); and how many there are.
fn readme_script(ns: &str, kubeconfig: &Path, admin: [u16; 2]) -> (String, usize) {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let commands = readme_commands(&readme)
        .replace("-n default", &format!("-n {ns}"))
        .replace("manifest default web", &format!("manifest {ns} web"))
        .replace(
            "--serviceaccount=default:",
            &format!("--serviceaccount={ns}:"),
        )
        .replace("localhost:9441", &format!("localhost:{}", admin[1]));
    let mut script = format!(
        "export KUBECONFIG_OF_TEST={} MODULE_MANAGER_ADMIN_URL=http://127.0.0.1:{}\n",
        kubeconfig.display(),
        admin[0]
    );
    let commands: Vec<&str> = commands.lines().filter(|l| !l.trim().is_empty()).collect();
    for command in &commands {
        script += &format!("echo '>>> {}'\n{command}\n", command.replace('\'', ""));
    }
    (script, commands.len())
}

/// What each README command must print (`ns`: the namespace of `web`).
fn check_readme_output(command: &str, output: &str, ns: &str) {
    let expected: &[&str] = match command {
        c if c.starts_with("kubectl get manifests") => &["NAMESPACE"],
        c if c.contains("admin shards") => &["SHARD", "module-manager-0", "module-manager-1"],
        c if c.contains("admin queue") => &["module-manager-0"],
        // `created` the first time, `unchanged` when the block runs again.
        c if c.starts_with("kubectl create") => &["manifest-reader"],
        c if c.contains("admin manifest") => &["module-manager-", "Ready"],
        c if c.contains(" get -A") => &["CHART VERSION", " 1.0.0 "],
        c if c.contains(" diff web") => &["No changes.\n"],
        c if c.starts_with("curl") => &["\"shards\""],
        _ => &[],
    };
    for text in expected {
        assert!(
            output.contains(text),
            "{command}: no {text:?} in:\n{output}"
        );
    }
    let web_row = output
        .lines()
        .any(|l| l.split_whitespace().take(2).eq([ns, "web"]));
    if command.contains("get manifests -A") || command.contains(" get -A") {
        assert!(web_row, "{command}: no row of {ns}/web in:\n{output}");
    }
}

#[tokio::test]
async fn the_readme_commands_run_as_written() {
    let control_plane = common::control_plane().await;
    let client = control_plane.client().await.unwrap();
    let ns = control_plane.namespace(&client, "readme").await.unwrap();
    let kubeconfig = control_plane.kubeconfig().to_owned();
    let (fleet, _logs) = readme_fleet(&client, &kubeconfig, &ns).await;
    ready_web(&client, &ns).await;
    let tools = tools_dir();
    let cargo = tools.path().join("cargo");
    std::fs::write(&cargo, CARGO_RUN).unwrap();
    let mut mode = std::fs::metadata(&cargo).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut mode, 0o755);
    std::fs::set_permissions(&cargo, mode).unwrap();
    let admin = [0, 1].map(|ordinal| fleet.replicas()[&ordinal].admin);
    let (script, count) = readme_script(&ns, &kubeconfig, admin);
    // $KUBECONFIG comes from the README's own first line. A reader may run the block twice:
    // the second time must work as well (nothing is created that exists already).
    for _ in 0..2 {
        let (code, stdout, stderr) =
            run(&script, &repo(), tools.path(), Path::new("/nonexistent")).await;
        assert_eq!(code, 0, "{script}\n{stdout}\n{stderr}");
        let ran: Vec<(&str, &str)> = stdout
            .split(">>> ")
            .skip(1)
            .map(|section| section.split_once('\n').unwrap_or((section, "")))
            .collect();
        assert_eq!(ran.len(), count, "{stdout}");
        for (command, output) in ran {
            check_readme_output(command, output, &ns);
        }
    }
}
