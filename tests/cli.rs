//! The Manifest commands of the `module-manager` binary (`get`, `describe`, `history`, `reconcile`,
//! `suspend`, `resume`, `retry`, `diff`) and the kubectl plugin name, run as processes against the
//! real kube-apiserver, with the pipeline reconciling in-process.
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use module_manager::api::{Manifest, RECONCILE_REQUESTED_AT, RESET_REQUESTED_AT, State};
use module_manager::render::Backend;
use serde_json::{Value, json};
use test_support::objects;
use test_support::repo;

/// The longest one command may take (a loaded CI machine; a diff starts a renderer).
const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// A namespace with the pipeline reconciling it in-process ([`common::Operator`]), and the
/// admin kubeconfig the commands run with.
struct Harness {
    operator: common::Operator,
    kubeconfig: PathBuf,
}

impl std::ops::Deref for Harness {
    type Target = common::Operator;

    fn deref(&self) -> &common::Operator {
        &self.operator
    }
}

async fn start(prefix: &str) -> Harness {
    Harness {
        operator: common::operator(prefix, test_support::context::REPLICA).await,
        kubeconfig: common::control_plane().await.kubeconfig().to_owned(),
    }
}

/// What a process printed and how it ended.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `program args`, with `KUBECONFIG` set, bounded by [`COMMAND_LIMIT`].
async fn run_program(program: &Path, args: &[&str], kubeconfig: &Path, path: Option<&Path>) -> Ran {
    let mut command = tokio::process::Command::new(program);
    command.args(args).env("KUBECONFIG", kubeconfig);
    if let Some(dir) = path {
        let joined = std::env::join_paths(std::iter::once(dir.to_owned()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .unwrap();
        command.env("PATH", joined);
    }
    ran(command).await
}

/// Runs `command` to its end, bounded by [`COMMAND_LIMIT`].
async fn ran(mut command: tokio::process::Command) -> Ran {
    let shown = format!("{command:?}");
    let output = tokio::time::timeout(COMMAND_LIMIT, command.kill_on_drop(true).output())
        .await
        .unwrap_or_else(|_| panic!("{shown}: no exit within {COMMAND_LIMIT:?}"))
        .unwrap();
    Ran {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

impl Harness {
    /// `module-manager args… -n <ns>`.
    async fn mm(&self, args: &[&str]) -> Ran {
        let mut all = args.to_vec();
        all.extend(["-n", self.ns.as_str()]);
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_module-manager"));
        run_program(&binary, &all, &self.kubeconfig, None).await
    }

    /// Like [`Harness::mm`], expecting exit code `code`.
    async fn mm_ok(&self, args: &[&str], code: i32) -> String {
        let ran = self.mm(args).await;
        assert_eq!(
            ran.code, code,
            "module-manager {args:?}: exit {}\nstdout:\n{}\nstderr:\n{}",
            ran.code, ran.stdout, ran.stderr
        );
        ran.stdout
    }

    /// Creates the `catalog` Manifest (chart `catalog-v1`, greeting `hi`) and waits until Ready.
    async fn ready_catalog(&self, interval: &str) -> Manifest {
        objects::create_json(
            &self.manifests,
            json!({
                "apiVersion": "modulemanager.io/v1alpha1",
                "kind": "Manifest",
                "metadata": {"name": "catalog", "namespace": self.ns},
                "spec": {"module": "catalog", "chart": {"path": "examples/charts/catalog-v1"},
                    "values": {"greeting": "hi"}, "interval": interval},
            }),
        )
        .await;
        self.wait_ready("catalog").await
    }

    /// Waits (90 s) until the Manifest `name` is Ready at its generation.
    async fn wait_ready(&self, name: &str) -> Manifest {
        let limit = Duration::from_secs(90);
        common::wait_state(&self.manifests, name, State::Ready, limit).await
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}

/// The Manifest's metadata and spec, without what the API server changes on every write.
fn essentials(manifest: &Manifest) -> Value {
    let mut value = serde_json::to_value(manifest).unwrap();
    let metadata = value["metadata"].as_object_mut().unwrap();
    for noise in ["managedFields", "resourceVersion", "generation"] {
        metadata.remove(noise);
    }
    value.as_object_mut().unwrap().remove("status");
    value
}

#[tokio::test]
async fn get_describe_and_the_requests_change_exactly_their_field() {
    let h = start("cli-get").await;
    h.ready_catalog("1h").await;
    // get: the printer columns.
    let table = h.mm_ok(&["get"], 0).await;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "NAME", "READY", "STATUS", "CHART", "VERSION", "OWNER", "AGE"
        ],
        "{table}"
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(&row[..2], ["catalog", "True"], "{table}");
    // The path chart's version, from examples/charts/catalog-v1/Chart.yaml (the working
    // directory is the checkout, the default --chart-root).
    assert_eq!(
        row[row.len() - 3..row.len() - 1],
        ["1.0.0", test_support::context::REPLICA],
        "{table}"
    );
    assert_eq!(lines.len(), 2, "{table}");
    // Where the chart cannot be read: a dash.
    let elsewhere = tempfile::tempdir().unwrap();
    let root = elsewhere.path().display().to_string();
    let unread = h.mm_ok(&["get", "--chart-root", &root], 0).await;
    let row: Vec<&str> = unread.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[row.len() - 3], "-", "{unread}");
    let one: Value =
        serde_json::from_str(&h.mm_ok(&["get", "catalog", "-o", "json"], 0).await).unwrap();
    assert_eq!(one["metadata"]["name"], "catalog");
    assert_eq!(one["status"]["state"], "Ready");
    let list: Value = serde_yaml_ng::from_str(&h.mm_ok(&["get", "-o", "yaml"], 0).await).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"][0]["metadata"]["name"], "catalog");
    let across = h.mm_ok(&["get", "-A"], 0).await;
    assert!(across.starts_with("NAMESPACE"), "{across}");
    assert!(
        across
            .lines()
            .any(|l| l.starts_with(&format!("{}  ", h.ns)) && l.contains("catalog")),
        "{across}"
    );
    // describe: spec, conditions, inventory, hook run, last operation, Events.
    let described = h.mm_ok(&["describe", "catalog"], 0).await;
    for expected in [
        "Name:             catalog\n".to_owned(),
        "Chart:            path examples/charts/catalog-v1, version 1.0.0\n".to_owned(),
        format!(
            "Inventory:\n  ConfigMap/{0}/catalog-legacy-settings\n  ConfigMap/{0}/catalog-settings\n",
            h.ns
        ),
        "Hook run:         Install Done\n".to_owned(),
        "Last operation:   Install at ".to_owned(),
    ] {
        assert!(
            described.contains(&expected),
            "{expected:?} missing from:\n{described}"
        );
    }
    assert!(
        described
            .lines()
            .any(|l| l.split_whitespace().take(3).eq(["Ready", "True", "Ready"])),
        "no Ready condition in:\n{described}"
    );
    // history: the install, one release.
    let history = h.mm_ok(&["history", "catalog"], 0).await;
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines.len(), 2, "{history}");
    assert!(lines[0].starts_with("REVISION"), "{history}");
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        [
            row[0],
            row[1],
            row[2],
            row[row.len() - 2],
            row[row.len() - 1]
        ],
        [
            "1",
            "Install",
            "examples/charts/catalog-v1",
            "Succeeded",
            "-"
        ],
        "{history}"
    );
    let stored: Value =
        serde_json::from_str(&h.mm_ok(&["history", "catalog", "-o", "json"], 0).await).unwrap();
    assert_eq!(stored[0]["outcome"], "Succeeded", "{stored}");
    let events = common::events_once(&h.client, &h.ns, "catalog", |e| !e.is_empty()).await;
    let described = h.mm_ok(&["describe", "catalog"], 0).await;
    let (_, reason, _) = &events[0];
    assert!(
        described
            .split("Events:")
            .nth(1)
            .is_some_and(|e| e.contains(reason.as_str())),
        "the Event {reason} missing from:\n{described}"
    );
    // suspend / resume: exactly spec.suspend.
    let before = essentials(&h.manifests.get("catalog").await.unwrap());
    h.mm_ok(&["suspend", "catalog"], 0).await;
    let suspended = essentials(&h.manifests.get("catalog").await.unwrap());
    let mut expected = before.clone();
    expected["spec"]["suspend"] = json!(true);
    assert_eq!(suspended, expected);
    h.mm_ok(&["resume", "catalog"], 0).await;
    assert_eq!(
        essentials(&h.manifests.get("catalog").await.unwrap()),
        before
    );
    // reconcile / retry: exactly their annotation, an RFC 3339 time.
    for (command, annotation) in [
        ("reconcile", RECONCILE_REQUESTED_AT),
        ("retry", RESET_REQUESTED_AT),
    ] {
        let before = essentials(&h.manifests.get("catalog").await.unwrap());
        let said = h.mm_ok(&[command, "catalog"], 0).await;
        let after = h.manifests.get("catalog").await.unwrap();
        let value = after
            .annotations()
            .get(annotation)
            .cloned()
            .expect(annotation);
        value
            .parse::<k8s_openapi::jiff::Timestamp>()
            .expect("an RFC 3339 time");
        assert!(said.contains(&value), "{said}");
        let mut expected = before;
        expected["metadata"]["annotations"][annotation] = json!(value);
        assert_eq!(essentials(&after), expected, "{command}");
    }
    // Errors say what failed.
    let missing = h.mm(&["get", "nope"]).await;
    assert_eq!(missing.code, 1);
    assert_eq!(
        missing.stderr.trim(),
        format!("error: get: Manifest {}/nope not found", h.ns)
    );
    let unreadable = h
        .mm(&["get", "--kubeconfig", "/nonexistent/kubeconfig"])
        .await;
    assert_failed(
        &unreadable,
        1,
        "error: read the kubeconfig /nonexistent/kubeconfig: ",
    );
    let dir = tempfile::tempdir().unwrap();
    let stranger = token_kubeconfig(&h, dir.path(), "stranger").await;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_module-manager"));
    let forbidden = run_program(&binary, &["get", "-n", &h.ns], &stranger, None).await;
    assert_failed(&forbidden, 1, "error: list: forbidden: ");
    assert!(
        forbidden
            .stderr
            .contains("cannot list resource \"manifests\""),
        "{}",
        forbidden.stderr
    );
    // diff runs as the caller: one who may read the Manifest but not its objects sees none of
    // them (exit 2, the refusal named), whatever the operator could read.
    let viewer = token_kubeconfig(&h, dir.path(), "viewer").await;
    grant_manifest_reads(&h, "viewer").await;
    // The authorizer sees a new binding shortly, not at once.
    let deadline = std::time::Instant::now() + COMMAND_LIMIT;
    while run_program(&binary, &["get", "catalog", "-n", &h.ns], &viewer, None)
        .await
        .code
        != 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the viewer's Role never took effect"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // `--kubeconfig` names the viewer while $KUBECONFIG is the admin's: the flag must win.
    let viewer_flag = viewer.display().to_string();
    let mut args = vec![
        "diff",
        "catalog",
        "-n",
        h.ns.as_str(),
        "--kubeconfig",
        &viewer_flag,
    ];
    let flags = render_flags();
    args.extend(flags.iter().map(String::as_str));
    let refused = run_program(&binary, &args, &h.kubeconfig, None).await;
    assert_eq!(refused.code, 2, "{}\n{}", refused.stdout, refused.stderr);
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);
    let expected = format!(
        "User \"system:serviceaccount:{}:viewer\" cannot get resource \"configmaps\"",
        h.ns
    );
    assert!(refused.stderr.contains(&expected), "{}", refused.stderr);
}

/// Lets the ServiceAccount `account` get Manifests of the test's namespace, and nothing else.
async fn grant_manifest_reads(h: &Harness, account: &str) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": account},
        "rules": [{"apiGroups": ["modulemanager.io"], "resources": ["manifests"], "verbs": ["get"]}],
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": account},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": h.ns}],
    }))
    .unwrap();
    let params = PostParams::default();
    Api::<Role>::namespaced(h.client.clone(), &h.ns)
        .create(&params, &role)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(h.client.clone(), &h.ns)
        .create(&params, &binding)
        .await
        .unwrap();
}

/// A kubeconfig for the control plane as a new ServiceAccount without any role.
async fn token_kubeconfig(h: &Harness, dir: &Path, account: &str) -> PathBuf {
    let accounts = Api::<ServiceAccount>::namespaced(h.client.clone(), &h.ns);
    objects::create_json(&accounts, json!({"metadata": {"name": account}})).await;
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}});
    let answer: TokenRequest = accounts
        .create_subresource("token", account, &PostParams::default(), &request)
        .await
        .unwrap();
    let token = answer.status.and_then(|s| s.token).unwrap();
    let mut config: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&h.kubeconfig).unwrap()).unwrap();
    config["users"] = json!([{"name": "token", "user": {"token": token}}]);
    config["contexts"][0]["context"]["user"] = json!("token");
    let path = dir.join(format!("{account}.kubeconfig"));
    std::fs::write(&path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    path
}

#[tokio::test]
async fn reconcile_wait_ends_when_a_pass_echoes_the_request_or_at_its_timeout() {
    // No pipeline in this namespace: the test writes the echo a replica would write, so the
    // wait is tested whether or not the operator handles the annotation.
    let control_plane = common::control_plane().await;
    let client = control_plane.client().await.unwrap();
    let ns = control_plane.namespace(&client, "cli-wait").await.unwrap();
    let manifests = Api::<Manifest>::namespaced(client.clone(), &ns);
    objects::create_json(
        &manifests,
        json!({
            "apiVersion": "modulemanager.io/v1alpha1", "kind": "Manifest",
            "metadata": {"name": "idle"}, "spec": {"module": "idle", "chart": {"path": "x"}},
        }),
    )
    .await;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_module-manager"));
    let kubeconfig = control_plane.kubeconfig();
    let wait = |timeout: &'static str| {
        let args = [
            "reconcile",
            "idle",
            "-n",
            &ns,
            "--wait",
            "--timeout",
            timeout,
        ];
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let binary = binary.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_program(&binary, &args, kubeconfig, None).await
        }
    };
    let waited = wait("2s").await;
    assert_eq!(waited.code, 1, "{}", waited.stdout);
    assert!(
        waited
            .stderr
            .contains("no pass handled the request within 2s"),
        "{}",
        waited.stderr
    );
    // An echo of the request (as a pass writes it) ends the wait with the outcome.
    let echo = {
        let manifests = manifests.clone();
        tokio::spawn(async move {
            let first = waited_for_new_request(&manifests, "idle").await;
            let status = json!({"status": {"state": "Error", "lastHandledReconcileAt": first,
                "conditions": [{"type": "Ready", "status": "False", "reason": "RenderError",
                    "message": "render: boom", "lastTransitionTime": "2026-12-02T00:00:00Z"}]}});
            manifests
                .patch_status("idle", &PatchParams::default(), &Patch::Merge(&status))
                .await
                .unwrap();
        })
    };
    let handled = wait("60s").await;
    echo.await.unwrap();
    assert_eq!(
        handled.code, 1,
        "an Error outcome fails: {} {}",
        handled.stdout, handled.stderr
    );
    assert!(
        handled.stdout.ends_with("handled: Error: render: boom\n"),
        "{}",
        handled.stdout
    );
}

/// The request annotation of the Manifest `name`.
async fn requested(manifests: &Api<Manifest>, name: &str) -> Option<String> {
    let manifest = manifests.get(name).await.unwrap();
    manifest.annotations().get(RECONCILE_REQUESTED_AT).cloned()
}

/// The request annotation once it differs from the one there was first.
async fn waited_for_new_request(manifests: &Api<Manifest>, name: &str) -> String {
    let first = requested(manifests, name).await;
    let deadline = std::time::Instant::now() + COMMAND_LIMIT;
    loop {
        if let Some(now) = requested(manifests, name).await
            && Some(&now) != first.as_ref()
        {
            return now;
        }
        assert!(std::time::Instant::now() < deadline, "no new request");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts that a command exited with `code` and an error message starting with `start`.
fn assert_failed(ran: &Ran, code: i32, start: &str) {
    assert_eq!(ran.code, code, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stderr.starts_with(start), "{}", ran.stderr);
}

/// The resourceVersions of the Manifest and the ConfigMaps of the namespace.
async fn versions(h: &Harness) -> BTreeMap<String, String> {
    let mut versions: BTreeMap<String, String> = objects::list(&h.config_maps())
        .await
        .iter()
        .map(|cm| (cm.name_any(), cm.resource_version().unwrap()))
        .collect();
    let manifest = h.manifests.get("catalog").await.unwrap();
    versions.insert("Manifest".into(), manifest.resource_version().unwrap());
    versions
}

/// The render flags of `diff` for the backend the tests use.
fn render_flags() -> Vec<String> {
    let mut flags = vec!["--chart-root".to_owned(), repo().display().to_string()];
    match test_support::render_backend().unwrap() {
        Backend::Renderer(path) => flags.extend([
            "--render-backend".into(),
            "renderer".into(),
            "--renderer".into(),
            path.display().to_string(),
        ]),
        Backend::Helm(path) => flags.extend([
            "--render-backend".into(),
            "helm".into(),
            "--helm".into(),
            path.display().to_string(),
        ]),
    }
    flags
}

/// `diff` with no render flag (as the README runs it) finds the renderer `hack/build-tools.sh`
/// built for this checkout, with nothing on `PATH`; with an empty cache it names every place it
/// tried; a renderer named that does not exist is named in the error.
async fn the_build_renderer_is_found_without_a_flag(h: &Harness) {
    let nothing = tempfile::tempdir().unwrap();
    let diff = |cache: &Path, extra: &[&str]| {
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_module-manager"));
        let mut command = tokio::process::Command::new(binary);
        let root = repo().display().to_string();
        command
            .args(["diff", "catalog", "-n", &h.ns, "--chart-root", &root])
            .args(extra)
            .env("KUBECONFIG", &h.kubeconfig)
            .env("PATH", nothing.path())
            .env("MODULE_MANAGER_CACHE", cache);
        for flag in [
            "MODULE_MANAGER_RENDER_BACKEND",
            "MODULE_MANAGER_RENDERER",
            "MODULE_MANAGER_HELM",
        ] {
            command.env_remove(flag);
        }
        ran(command)
    };
    let found = diff(&testenv::tools::cache_root(), &[]).await;
    assert_eq!(
        (found.code, found.stdout.as_str()),
        (0, "No changes.\n"),
        "{}",
        found.stderr
    );
    let missing = diff(nothing.path(), &[]).await;
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    let cached = nothing.path().join("tools/renderer-");
    assert!(
        missing
            .stderr
            .starts_with("error: find the renderer: no renderer or helm found; tried:\n  ")
            && missing.stderr.contains(&cached.display().to_string())
            && missing.stderr.contains("make tools"),
        "{}",
        missing.stderr
    );
    let named = diff(nothing.path(), &["--renderer", "/nonexistent/renderer"]).await;
    assert_failed(
        &named,
        2,
        "error: start the renderer /nonexistent/renderer: ",
    );
}

#[tokio::test]
async fn diff_lists_exactly_a_values_change_a_drift_and_a_prune_and_changes_nothing() {
    let h = start("cli-diff").await;
    h.ready_catalog("1h").await;
    let flags = render_flags();
    let diff = |extra: &[&'static str]| {
        let mut args: Vec<&str> = vec!["diff", "catalog"];
        args.extend(extra);
        args.extend(flags.iter().map(String::as_str));
        args
    };
    assert_eq!(h.mm_ok(&diff(&[]), 0).await, "No changes.\n");
    the_build_renderer_is_found_without_a_flag(&h).await;
    // Suspended, so that no pass repairs what the diff is to show.
    h.mm_ok(&["suspend", "catalog"], 0).await;
    common::patch_spec(
        &h.manifests,
        "catalog",
        json!({"values": {"greeting": "hello"}}),
    )
    .await;
    let drift = json!({"data": {"format": "json"}});
    h.config_maps()
        .patch("catalog-legacy-settings", &PatchParams::apply("hand-edit").force(), &Patch::Apply(&json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "catalog-legacy-settings"}, "data": drift["data"]})))
        .await
        .unwrap();
    let before = versions(&h).await;
    let text = h.mm_ok(&diff(&[]), 1).await;
    let ns = &h.ns;
    assert_eq!(
        text,
        format!(
            "~ change ConfigMap/{ns}/catalog-legacy-settings\n    ~ /data/format: \"json\" -> \"xml\"\n\
             ~ change ConfigMap/{ns}/catalog-settings\n    ~ /data/greeting: \"hi\" -> \"hello\"\n\
             note: the Manifest is suspended: no pass runs until it is resumed\n"
        )
    );
    assert_eq!(versions(&h).await, before, "the diff wrote");
    // A chart that drops an object: it would be pruned (JSON output).
    common::patch_spec(
        &h.manifests,
        "catalog",
        json!({"chart": {"path": "examples/charts/catalog-v2"}}),
    )
    .await;
    let answer: Value = serde_json::from_str(&h.mm_ok(&diff(&["-o", "json"]), 1).await).unwrap();
    assert_eq!(
        answer["prune"],
        json!([{"group": "", "version": "v1", "kind": "ConfigMap", "namespace": ns, "name": "catalog-legacy-settings"}])
    );
    let changes: Vec<(&str, &str)> = answer["objects"][0]["change"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["after"].as_str().unwrap()))
        .collect();
    assert_eq!(answer["objects"].as_array().unwrap().len(), 1, "{answer}");
    assert_eq!(
        changes,
        [("/data/greeting", "hello"), ("/data/version", "2")]
    );
    // Nothing was written: every object and the Manifest (but for the spec patch) as before.
    let mut after = versions(&h).await;
    after.remove("Manifest");
    let mut unchanged = before.clone();
    unchanged.remove("Manifest");
    assert_eq!(after, unchanged, "the diff changed objects");
    // The plugin name: `kubectl-module_manager` is the same command line.
    let bin = tempfile::tempdir().unwrap();
    let plugin = bin.path().join("kubectl-module_manager");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_module-manager"), &plugin).unwrap();
    let help = run_program(&plugin, &["--help"], &h.kubeconfig, None).await;
    assert!(
        help.stdout
            .contains("Usage: kubectl module-manager <COMMAND>"),
        "{}",
        help.stdout
    );
    let kubectl = common::kubectl();
    let got = run_program(
        &kubectl,
        &["module-manager", "get", "catalog", "-n", ns],
        &h.kubeconfig,
        Some(bin.path()),
    )
    .await;
    assert_eq!(got.code, 0, "{}", got.stderr);
    assert!(
        got.stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("catalog")),
        "{}",
        got.stdout
    );
    // kubectl's own wait on the Ready condition.
    h.mm_ok(&["resume", "catalog"], 0).await;
    let waited = run_program(
        &kubectl,
        &[
            "wait",
            "--for=condition=Ready",
            "manifest/catalog",
            "-n",
            ns,
            "--timeout=90s",
        ],
        &h.kubeconfig,
        None,
    )
    .await;
    assert_eq!(waited.code, 0, "{} {}", waited.stdout, waited.stderr);
    h.wait_ready("catalog").await;
    assert_eq!(h.mm_ok(&diff(&[]), 0).await, "No changes.\n");
}

#[tokio::test]
async fn diff_lists_the_hooks_an_upgrade_would_run_and_the_pass_runs_them() {
    let h = start("cli-hooks").await;
    let values = |version: &str| {
        json!({"version": version,
            "hooks": [{"name": "migrate", "events": "pre-upgrade", "kind": "ConfigMap"}]})
    };
    objects::create_json(
        &h.manifests,
        json!({
            "apiVersion": "modulemanager.io/v1alpha1", "kind": "Manifest",
            "metadata": {"name": "ledger", "namespace": h.ns},
            "spec": {"module": "ledger", "chart": {"path": "tests/fixtures/charts/hooks"},
                "values": values("1"), "interval": "1h"},
        }),
    )
    .await;
    h.wait_ready("ledger").await;
    let flags = render_flags();
    let mut args = vec!["diff", "ledger"];
    args.extend(flags.iter().map(String::as_str));
    // An install runs no pre-upgrade hook: nothing left to do.
    assert_eq!(h.mm_ok(&args, 0).await, "No changes.\n");
    h.mm_ok(&["suspend", "ledger"], 0).await;
    common::patch_spec(&h.manifests, "ledger", json!({"values": values("2")})).await;
    let ns = &h.ns;
    assert_eq!(
        h.mm_ok(&args, 1).await,
        format!(
            "~ change ConfigMap/{ns}/ledger-app\n    ~ /data/version: \"1\" -> \"2\"\n\
             > run hook ConfigMap/{ns}/ledger-migrate (pre-upgrade)\n\
             note: the Manifest is suspended: no pass runs until it is resumed\n"
        )
    );
    assert!(
        !objects::exists(&h.config_maps(), "ledger-migrate").await,
        "the diff ran the hook"
    );
    // The pass does what the diff said, and then there is nothing left.
    h.mm_ok(&["resume", "ledger"], 0).await;
    h.wait_ready("ledger").await;
    let hook = h.config_maps().get("ledger-migrate").await.unwrap();
    assert_eq!(hook.data.unwrap()["version"], "2");
    assert_eq!(h.mm_ok(&args, 0).await, "No changes.\n");
}

/// A `module-manager get … -w` process and the lines it printed so far.
struct Watching {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    printed: Vec<String>,
}

impl Watching {
    async fn start(h: &Harness, args: &[&str]) -> Self {
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_module-manager"));
        let mut command = tokio::process::Command::new(binary);
        command
            .args(args)
            .args(["-w", "-n", &h.ns])
            .env("KUBECONFIG", &h.kubeconfig)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        // As an interactive shell starts it: SIGINT at its default. A test run started in the
        // background of a non-interactive shell inherits SIGINT ignored (POSIX), and so would
        // the child; Ctrl-C then could not end it (seen in a CI run started with `&`).
        // SAFETY: `signal` is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        Self {
            child,
            lines: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout)),
            printed: Vec::new(),
        }
    }

    /// The next line, `None` at the end of the output or when none comes within `limit`.
    async fn next(&mut self, limit: Duration) -> Option<String> {
        let line = tokio::time::timeout(limit, self.lines.next_line()).await;
        let line = line.ok()?.unwrap()?;
        self.printed.push(line.clone());
        Some(line)
    }

    /// Reads lines until one whose words start with `words`.
    async fn until(&mut self, words: &[&str]) -> String {
        loop {
            match self.next(COMMAND_LIMIT).await {
                Some(line)
                    if line
                        .split_whitespace()
                        .take(words.len())
                        .eq(words.iter().copied()) =>
                {
                    return line;
                }
                Some(_) => {}
                None => panic!("no row {words:?}; printed:\n{}", self.printed.join("\n")),
            }
        }
    }

    /// Interrupts it as Ctrl-C does; it must end at once, by the signal. Answers every line
    /// it printed.
    async fn interrupt(mut self) -> Vec<String> {
        let pid = self.child.id().unwrap() as libc::pid_t;
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("get -w still runs 10 s after SIGINT")
            .unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGINT)
        );
        while self.next(Duration::from_secs(10)).await.is_some() {}
        self.printed
    }
}

#[tokio::test]
async fn get_watch_prints_the_table_then_a_row_per_change_until_interrupted() {
    let h = start("cli-watch").await;
    h.ready_catalog("1h").await;
    let mut all = Watching::start(&h, &["get"]).await;
    let mut one = Watching::start(&h, &["get", "catalog"]).await;
    // The table, as `get` prints it (the chart version from Chart.yaml), then nothing while
    // nothing changes: the watch's own first list prints no row again.
    for watching in [&mut all, &mut one] {
        let header = watching.next(COMMAND_LIMIT).await.unwrap();
        assert!(header.starts_with("NAME "), "{header}");
        let row = watching.until(&["catalog", "True"]).await;
        assert!(row.contains(" 1.0.0 "), "{row}");
        let quiet = watching.next(Duration::from_secs(3)).await;
        assert_eq!(quiet, None, "a row while nothing changed");
    }
    // A change of catalog: a row.
    let label = json!({"metadata": {"labels": {"watched": "yes"}}});
    h.manifests
        .patch("catalog", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    all.until(&["catalog", "True"]).await;
    one.until(&["catalog", "True"]).await;
    // A new Manifest: its rows until it is Ready, aligned with the table's columns.
    let other = common::manifest(
        &h.ns,
        "other",
        common::chart_spec("other", "examples/charts/catalog-v1", json!({})),
    );
    common::create_manifest(&h.manifests, &other).await;
    let ready = all.until(&["other", "True"]).await;
    assert!(ready.contains(" 1.0.0 "), "{ready}");
    // A deletion: the row of its last state (Deleting).
    common::delete_and_wait(&h.manifests, "other", COMMAND_LIMIT).await;
    let printed = all.interrupt().await;
    assert!(
        printed.iter().filter(|l| l.starts_with("other ")).count() >= 2,
        "{printed:#?}"
    );
    // The named watch follows its Manifest only.
    let printed = one.interrupt().await;
    assert!(
        printed.iter().all(|l| !l.starts_with("other ")),
        "{printed:#?}"
    );
}
