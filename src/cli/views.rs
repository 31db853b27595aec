//! Manifests, one Manifest in detail and a diff, for a terminal (pure), and `-o json|yaml`.

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;
use serde_json::Value;

use super::tables::{age, columns, or_dash, shortened};

/// The `version` of a path chart's `Chart.yaml` (`spec.chart.path` → version), where this
/// process can read it.
pub type PathVersion<'a> = &'a dyn Fn(&str) -> Option<String>;
use crate::api::{InventoryEntry, Manifest, ManifestStatus, Release};
use crate::plan::describe;
use crate::plan::diff::{Diff, FieldChange, ObjectChange};

/// Longest Ready message a `get` row shows: a long error is shortened (`describe` shows it all).
const STATUS_WIDTH: usize = 100;

/// `-o`: how a command prints its answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns or sections for a terminal.
    #[default]
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// `value` as JSON or YAML (`None` for [`Output::Table`]: the caller prints its table).
pub fn encoded<T: Serialize>(value: &T, output: Output) -> anyhow::Result<Option<String>> {
    Ok(match output {
        Output::Table => None,
        Output::Json => Some(serde_json::to_string_pretty(value)? + "\n"),
        Output::Yaml => Some(serde_yaml_ng::to_string(value)?),
    })
}

/// The status and message of the `Ready` condition.
fn ready(status: Option<&ManifestStatus>) -> (String, String) {
    status
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map_or_else(
            || ("-".into(), String::new()),
            |c| (c.status.clone(), c.message.clone()),
        )
}

/// The chart version a row shows: `spec.chart.version`, else the version of a path chart's
/// `Chart.yaml` (`path_version`), else `-`.
pub fn chart_version(manifest: &Manifest, path_version: PathVersion) -> String {
    let chart = &manifest.spec.chart;
    or_dash((chart.version.clone()).or_else(|| chart.path.as_deref().and_then(path_version)))
}

/// The header of `get`: NAME, READY, STATUS, CHART VERSION, OWNER, AGE (NAMESPACE first across
/// namespaces).
pub fn manifests_header(all_namespaces: bool) -> Vec<String> {
    let mut header = vec!["NAME", "READY", "STATUS", "CHART VERSION", "OWNER", "AGE"];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    header.into_iter().map(String::from).collect()
}

/// One row of `get` (see [`manifests_header`]).
pub fn manifest_row(
    manifest: &Manifest,
    all_namespaces: bool,
    now: Timestamp,
    path_version: PathVersion,
) -> Vec<String> {
    let status = manifest.status.as_ref();
    let (ready, message) = ready(status);
    let mut row = vec![
        manifest.name_any(),
        ready,
        shortened(&message, STATUS_WIDTH),
        chart_version(manifest, path_version),
        or_dash(status.and_then(|s| s.owner.as_deref())),
        age(manifest.creation_timestamp().map(|t| t.0), now),
    ];
    if all_namespaces {
        row.insert(0, manifest.namespace().unwrap_or_default());
    }
    row
}

/// `get`: NAME, READY, STATUS (the Ready message), CHART VERSION, OWNER, AGE — with NAMESPACE
/// first across namespaces — as the CRD's printer columns show them, and the version of a path
/// chart.
pub fn manifests_table(
    manifests: &[Manifest],
    all_namespaces: bool,
    now: Timestamp,
    path_version: PathVersion,
) -> String {
    if manifests.is_empty() {
        return "No Manifests found.\n".into();
    }
    let mut rows = vec![manifests_header(all_namespaces)];
    rows.extend(
        manifests
            .iter()
            .map(|m| manifest_row(m, all_namespaces, now, path_version)),
    );
    columns(&rows)
}

/// Where the chart comes from, in one line.
fn chart_source(manifest: &Manifest, path_version: PathVersion) -> String {
    let chart = &manifest.spec.chart;
    let version = chart.version.as_deref().map(|v| format!(" {v}"));
    match (&chart.path, &chart.repository, &chart.oci) {
        (Some(path), _, _) => match path_version(path) {
            Some(version) => format!("path {path}, version {version}"),
            None => format!("path {path}"),
        },
        (_, Some(repository), _) => format!(
            "{} from {repository}{}",
            chart.name.as_deref().unwrap_or("?"),
            version.unwrap_or_default()
        ),
        (_, _, Some(oci)) => format!("{oci}{}", version.unwrap_or_default()),
        _ => "-".into(),
    }
}

fn entries(title: &str, ids: &[InventoryEntry], out: &mut String) {
    *out += &format!("{title}:");
    if ids.is_empty() {
        *out += " <none>\n";
        return;
    }
    out.push('\n');
    for id in ids {
        *out += &format!("  {}\n", describe(id));
    }
}

/// The spec in a few lines.
fn spec_section(manifest: &Manifest, path_version: PathVersion, out: &mut String) {
    let spec = &manifest.spec;
    let namespace = manifest.namespace().unwrap_or_default();
    let lines = [
        ("Module", spec.module.clone()),
        ("Chart", chart_source(manifest, path_version)),
        (
            "Release",
            spec.release_name
                .clone()
                .unwrap_or_else(|| manifest.name_any()),
        ),
        (
            "Target namespace",
            spec.target_namespace.clone().unwrap_or(namespace),
        ),
        (
            "Target",
            spec.target.as_ref().map_or_else(
                || "this cluster".into(),
                |t| format!("kubeconfig Secret {}", t.kubeconfig_secret_ref.name),
            ),
        ),
        (
            "Service account",
            or_dash(spec.service_account_name.as_deref()),
        ),
        ("Values from", spec.values_from.len().to_string()),
        ("Suspended", spec.suspend.to_string()),
        ("Interval", spec.interval.clone()),
        ("Timeout", spec.timeout.clone()),
    ];
    for (label, value) in lines {
        *out += &format!("{:<18}{value}\n", format!("{label}:"));
    }
}

/// The status: state, conditions, last operation, hook run, inventory.
fn status_section(status: &ManifestStatus, out: &mut String) {
    *out += &format!(
        "State:            {}\n",
        or_dash(status.state.map(|s| format!("{s:?}")))
    );
    *out += &format!("Owner:            {}\n", or_dash(status.owner.as_deref()));
    *out += &format!(
        "Handled request:  {}\n",
        or_dash(status.last_handled_reconcile_at.as_deref())
    );
    *out += &format!(
        "Handled reset:    {}\n",
        or_dash(status.last_handled_reset_at.as_deref())
    );
    *out += "Conditions:\n";
    let mut rows = vec![
        ["TYPE", "STATUS", "REASON", "MESSAGE"]
            .map(String::from)
            .to_vec(),
    ];
    rows.extend(status.conditions.iter().map(|c| {
        vec![
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            c.message.replace('\n', " "),
        ]
    }));
    for line in columns(&rows).lines() {
        *out += &format!("  {line}\n");
    }
    match &status.last_operation {
        Some(op) => {
            *out += &format!(
                "Last operation:   {} at {}: {}\n",
                op.operation, op.time.0, op.message
            );
        }
        None => *out += "Last operation:   <none>\n",
    }
    match &status.hook_run {
        Some(run) => {
            let running = run.running.as_ref().map(|r| describe(&r.object));
            *out += &format!(
                "Hook run:         {:?} {:?}{}{}\n",
                run.operation,
                run.phase,
                running
                    .map(|r| format!(", running {r}"))
                    .unwrap_or_default(),
                run.message
                    .as_ref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            );
        }
        None => *out += "Hook run:         <none>\n",
    }
    entries("Inventory", &status.inventory, out);
    entries("Hook objects", &status.hook_objects, out);
}

/// `describe`: the spec, the status (conditions, last operation, hook run, inventory) and the
/// recent Events of the Manifest, oldest first; a path chart with its `Chart.yaml`'s version.
pub fn describe_manifest(
    manifest: &Manifest,
    events: &[Event],
    now: Timestamp,
    path_version: PathVersion,
) -> String {
    let mut out = format!(
        "Name:             {}\nNamespace:        {}\nAge:              {}\n",
        manifest.name_any(),
        manifest.namespace().unwrap_or_default(),
        age(manifest.creation_timestamp().map(|t| t.0), now)
    );
    spec_section(manifest, path_version, &mut out);
    match &manifest.status {
        Some(status) if !ManifestStatus::is_unwritten(Some(status)) => {
            status_section(status, &mut out);
        }
        _ => out += "Status:           <none yet: no replica has reconciled it>\n",
    }
    out += "Events:";
    if events.is_empty() {
        out += " <none>\n";
        return out;
    }
    out.push('\n');
    let mut rows = vec![
        ["TYPE", "REASON", "AGE", "FROM", "MESSAGE"]
            .map(String::from)
            .to_vec(),
    ];
    rows.extend(events.iter().map(|e| {
        let from = e
            .reporting_instance
            .clone()
            .or_else(|| e.reporting_controller.clone());
        vec![
            or_dash(e.type_.as_deref()),
            or_dash(e.reason.as_deref()),
            age(event_time(e), now),
            or_dash(from),
            e.note.clone().unwrap_or_default().replace('\n', " "),
        ]
    }));
    for line in columns(&rows).lines() {
        out += &format!("  {line}\n");
    }
    out
}

/// When an Event last happened (its series, else its time, else its creation).
pub fn event_time(event: &Event) -> Option<Timestamp> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

fn shown(value: Option<&Value>) -> String {
    match value {
        None => "<absent>".into(),
        Some(Value::String(text)) => format!("{text:?}"),
        Some(other) => other.to_string(),
    }
}

fn field_line(field: &FieldChange) -> String {
    match (&field.before, &field.after) {
        (None, after) => format!("    + {}: {}\n", field.path, shown(after.as_ref())),
        (before, None) => format!("    - {}: {}\n", field.path, shown(before.as_ref())),
        (before, after) => format!(
            "    ~ {}: {} -> {}\n",
            field.path,
            shown(before.as_ref()),
            shown(after.as_ref())
        ),
    }
}

/// `history`: one row per release, newest first (times as ages, as `kubectl get` shows them).
pub fn history_table(history: &[Release], now: Timestamp) -> String {
    if history.is_empty() {
        return "no releases recorded yet\n".into();
    }
    let header = [
        "REVISION",
        "OPERATION",
        "CHART",
        "GENERATION",
        "STARTED",
        "ENDED",
        "OUTCOME",
        "MESSAGE",
    ];
    let mut rows = vec![header.map(String::from).to_vec()];
    for release in history {
        rows.push(vec![
            release.revision.to_string(),
            format!("{:?}", release.operation),
            release.chart.clone(),
            or_dash(release.generation),
            age(Some(release.started.0), now),
            age(release.ended.as_ref().map(|ended| ended.0), now),
            format!("{:?}", release.outcome),
            release
                .message
                .as_deref()
                .map_or_else(|| "-".into(), |message| shortened(message, 60)),
        ]);
    }
    columns(&rows)
}

/// `diff`: objects to create, to change (field by field), to refuse, to prune, hooks to run.
pub fn diff_text(diff: &Diff) -> String {
    let mut out = String::new();
    for object in &diff.objects {
        let name = describe(&object.object);
        match &object.change {
            ObjectChange::Create => out += &format!("+ create {name}\n"),
            ObjectChange::NotOwned => {
                out +=
                    &format!("! {name} exists and is not this Manifest's: the pass would fail\n");
            }
            ObjectChange::Update { fields } => {
                out += &format!("~ change {name}\n");
                out.extend(fields.iter().map(field_line));
            }
        }
    }
    for id in &diff.prune {
        out += &format!("- prune {}\n", describe(id));
    }
    for hook in &diff.hooks {
        out += &format!("> run hook {} ({})\n", describe(&hook.object), hook.event);
    }
    for note in &diff.notes {
        out += &format!("note: {note}\n");
    }
    if !diff.has_changes() {
        out += "No changes.\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::diff::{HookToRun, ObjectDiff};
    use k8s_openapi::jiff::SignedDuration;
    use serde_json::json;

    #[test]
    fn history_rows_are_newest_first_with_ages_and_the_failure() {
        let history: Vec<Release> = serde_json::from_value(json!([
            {"revision": 2, "operation": "Upgrade", "chart": "charts/web", "generation": 3,
             "runId": "b", "started": "2026-12-02T01:00:00Z", "ended": "2026-12-02T01:01:00Z",
             "outcome": "Failed", "message": "pre-upgrade hook Job db-migrate failed"},
            {"revision": 1, "operation": "Install", "chart": "charts/web", "generation": 1,
             "runId": "a", "started": "2026-12-02T00:00:00Z", "outcome": "Succeeded"},
        ]))
        .unwrap();
        let now: Timestamp = "2026-12-02T02:00:00Z".parse().unwrap();
        let text = history_table(&history, now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("REVISION") && lines[0].contains("OUTCOME"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("2 ") && lines[1].contains("Upgrade") && lines[1].contains("59m"),
            "{text}"
        );
        assert!(
            lines[1].contains("Failed") && lines[1].contains("db-migrate"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("1 ") && lines[2].contains("Succeeded"),
            "{text}"
        );
        assert_eq!(history_table(&[], now), "no releases recorded yet\n");
    }

    fn manifest(name: &str, status: Value) -> Manifest {
        serde_json::from_value(json!({
            "apiVersion": "modulemanager.io/v1alpha1", "kind": "Manifest",
            "metadata": {"name": name, "namespace": "apps",
                "creationTimestamp": "2026-12-02T01:00:00Z"},
            "spec": {"module": name, "chart": {"repository": "https://charts.example",
                "name": "web", "version": "1.2.3"}},
            "status": status,
        }))
        .unwrap()
    }

    fn ready_status(message: &str) -> Value {
        json!({"state": "Ready", "owner": "module-manager-1", "conditions": [{
            "type": "Ready", "status": "True", "reason": "Ready", "message": message,
            "lastTransitionTime": "2026-12-02T01:00:05Z"}]})
    }

    fn now() -> Timestamp {
        "2026-12-02T03:00:00Z".parse().unwrap()
    }

    /// No path chart's `Chart.yaml` readable.
    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_path_chart_shows_its_chart_yaml_version_else_a_dash() {
        let mut web = manifest("web", ready_status("ready"));
        web.spec.chart = serde_json::from_value(json!({"path": "charts/web"})).unwrap();
        let read = |path: &str| (path == "charts/web").then(|| "0.4.1".to_owned());
        let table = manifests_table(std::slice::from_ref(&web), false, now(), &read);
        let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            row[row.len() - 3..],
            ["0.4.1", "module-manager-1", "2h"],
            "{table}"
        );
        let unread = manifest_row(&web, false, now(), &none);
        assert_eq!(unread[3], "-");
        let described = describe_manifest(&web, &[], now(), &read);
        assert!(
            described.contains("Chart:            path charts/web, version 0.4.1\n"),
            "{described}"
        );
        let described = describe_manifest(&web, &[], now(), &none);
        assert!(
            described.contains("Chart:            path charts/web\n"),
            "{described}"
        );
        // A repository chart shows its spec's version, whatever a path would say.
        assert_eq!(chart_version(&manifest("api", Value::Null), &read), "1.2.3");
    }

    #[test]
    fn get_prints_the_printer_columns() {
        let long = "x".repeat(300);
        let rows = [
            manifest("web", ready_status("all 3 objects ready")),
            manifest("api", ready_status(&long)),
        ];
        let table = manifests_table(&rows, false, now(), &none);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "NAME", "READY", "STATUS", "CHART", "VERSION", "OWNER", "AGE"
            ]
        );
        assert!(
            lines[1].starts_with("web   True   all 3 objects ready"),
            "{table}"
        );
        assert!(
            lines[1].ends_with("1.2.3          module-manager-1  2h"),
            "{table}"
        );
        // A long message is cut (describe shows it whole).
        assert!(
            lines[2].contains(&format!("{}…", "x".repeat(99))),
            "{table}"
        );
        assert!(!lines[2].contains(&"x".repeat(101)));
        let across = manifests_table(&rows[..1], true, now(), &none);
        assert!(
            across.lines().nth(1).unwrap().starts_with("apps       web"),
            "{across}"
        );
        let unreconciled = manifest("new", Value::Null);
        let row = manifests_table(&[unreconciled], false, now(), &none);
        assert_eq!(
            row.lines()
                .nth(1)
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>(),
            ["new", "-", "1.2.3", "-", "2h"]
        );
        assert_eq!(
            manifests_table(&[], false, now(), &none),
            "No Manifests found.\n"
        );
    }

    #[test]
    fn ages_read_like_kubectl() {
        let ago = |s: i64| age(Some(now() - SignedDuration::from_secs(s)), now());
        assert_eq!(
            [
                ago(5),
                ago(119),
                ago(120),
                ago(7199),
                ago(7200),
                ago(200_000)
            ],
            ["5s", "119s", "2m", "119m", "2h", "2d"]
        );
        // A clock behind the server's: no negative age.
        assert_eq!(ago(-30), "0s");
        assert_eq!(age(None, now()), "-");
    }

    #[test]
    fn describe_shows_spec_conditions_inventory_hooks_and_events() {
        let mut status = ready_status("all 1 objects ready");
        status["inventory"] = json!([{"version": "v1", "kind": "ConfigMap", "namespace": "apps", "name": "web-settings"}]);
        status["lastOperation"] =
            json!({"operation": "Install", "time": "2026-12-02T01:00:05Z", "message": "installed"});
        status["hookRun"] = json!({"operation": "Install", "phase": "Done"});
        let event: Event = serde_json::from_value(json!({
            "metadata": {"name": "e", "namespace": "apps"}, "eventTime": "2026-12-02T02:59:00.000000Z",
            "type": "Normal", "reason": "Installed", "note": "installed 1 object",
            "reportingController": "module-manager", "reportingInstance": "module-manager-1",
            "action": "Reconcile"}))
        .unwrap();
        let text = describe_manifest(&manifest("web", status), &[event], now(), &none);
        for expected in [
            "Name:             web\n",
            "Chart:            web from https://charts.example 1.2.3\n",
            "Target namespace: apps\n",
            "  Ready  True    Ready   all 1 objects ready\n",
            "Last operation:   Install at 2026-12-02T01:00:05Z: installed\n",
            "Hook run:         Install Done\n",
            "Inventory:\n  ConfigMap/apps/web-settings\n",
            "Hook objects: <none>\n",
            "  Normal  Installed  60s  module-manager-1  installed 1 object\n",
        ] {
            assert!(
                text.contains(expected),
                "{expected:?} missing from:\n{text}"
            );
        }
        let fresh = describe_manifest(&manifest("new", Value::Null), &[], now(), &none);
        assert!(fresh.contains("Status:           <none yet"), "{fresh}");
        assert!(fresh.ends_with("Events: <none>\n"), "{fresh}");
        // As the API server serves a new Manifest: the CRD's default status.
        let served = manifest("new", json!({"observedGeneration": -1}));
        let served = describe_manifest(&served, &[], now(), &none);
        assert!(served.contains("Status:           <none yet"), "{served}");
    }

    fn id(kind: &str, name: &str) -> InventoryEntry {
        InventoryEntry {
            group: String::new(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: "apps".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_diff_reads_as_create_change_prune_and_hooks() {
        let diff = Diff {
            objects: vec![
                ObjectDiff {
                    object: id("ConfigMap", "new"),
                    change: ObjectChange::Create,
                },
                ObjectDiff {
                    object: id("ConfigMap", "web"),
                    change: ObjectChange::Update {
                        fields: vec![
                            FieldChange {
                                path: "/data/greeting".into(),
                                before: Some(json!("hi")),
                                after: Some(json!("hello")),
                            },
                            FieldChange {
                                path: "/data/n".into(),
                                before: None,
                                after: Some(json!(3)),
                            },
                            FieldChange {
                                path: "/data/old".into(),
                                before: Some(json!("x")),
                                after: None,
                            },
                        ],
                    },
                },
                ObjectDiff {
                    object: id("Service", "taken"),
                    change: ObjectChange::NotOwned,
                },
            ],
            prune: vec![id("ConfigMap", "legacy")],
            hooks: vec![HookToRun {
                event: "pre-upgrade",
                object: id("Job", "migrate"),
            }],
            notes: vec!["no prune: x".into()],
        };
        assert_eq!(
            diff_text(&diff),
            "+ create ConfigMap/apps/new\n\
             ~ change ConfigMap/apps/web\n    ~ /data/greeting: \"hi\" -> \"hello\"\n    + /data/n: 3\n    - /data/old: \"x\"\n\
             ! Service/apps/taken exists and is not this Manifest's: the pass would fail\n\
             - prune ConfigMap/apps/legacy\n\
             > run hook Job/apps/migrate (pre-upgrade)\n\
             note: no prune: x\n"
        );
        assert_eq!(diff_text(&Diff::default()), "No changes.\n");
        let json = encoded(&diff, Output::Json).unwrap().unwrap();
        let value: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["objects"][1]["change"]["action"], "update");
        assert_eq!(value["objects"][0]["change"]["action"], "create");
        assert!(encoded(&diff, Output::Table).unwrap().is_none());
        assert!(
            encoded(&diff, Output::Yaml)
                .unwrap()
                .unwrap()
                .contains("event: pre-upgrade")
        );
    }
}
