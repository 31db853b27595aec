//! The monitoring bundle in `deploy/monitoring/` against the real binary's metrics and the real
//! `promtool`: dashboards and alerts query only series the binary exports, the rules and every
//! dashboard query parse, the alerts' unit tests pass, and the exposition passes
//! `promtool check metrics`. promtool comes from `PROMTOOL` or `PATH` (`hack/ensure-promtool.sh`).
#![allow(clippy::too_many_lines, reason = "scenario tests read top to bottom")]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use module_manager::telemetry::metrics::{Format, Metrics, StateLabels, encode, registry};
use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;

/// The prefix of module-manager's own metrics.
const PREFIX: &str = "module_manager_";

/// The prefix of the standard process metrics the binary exports too, unprefixed
/// (`process_cpu_seconds_total`, `process_resident_memory_bytes` …).
const PROCESS_PREFIX: &str = "process_";

/// The troubleshooting headings of `docs/operations.md` that runbook links may point at.
const RUNBOOK_HEADINGS: [&str; 13] = [
    "Stuck in Deleting",
    "Unowned shards",
    "Lease flapping",
    "Fenced replica",
    "Render errors",
    "Unreachable targets",
    "Queue backlog",
    "Ownership violations",
    "No live replica",
    "Fence lapses",
    "Stalled Manifests",
    "Retrying Manifests",
    "Expiring target credentials",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn monitoring() -> PathBuf {
    repo().join("deploy/monitoring")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The OpenMetrics exposition of every metric, registered exactly as the binary registers them,
/// with a child in every labelled family: prometheus-client leaves a family without children out
/// of the exposition altogether (not even its `# TYPE` line). A new labelled family needs a line
/// here before a dashboard can query it.
fn exposition() -> String {
    exposition_in(Format::OpenMetrics)
}

/// The binary's metrics, with a sample in each labelled family, in `format`.
fn exposition_in(format: Format) -> String {
    let mut registry = registry();
    let metrics = Metrics::register(&mut registry);
    metrics.reconcile.count_pass("error", "RenderError");
    metrics
        .manifests
        .by_state
        .get_or_create(&StateLabels { state: "Ready" })
        .set(3);
    metrics.reconcile.duration.observe(0.2);
    metrics.fleet.handover_gap.observe(1.5);
    encode(&registry, format).expect("encode metrics")
}

/// The series names Prometheus stores from an OpenMetrics exposition, derived from its
/// `# TYPE` lines (a labelled family without children has no sample lines, only these).
fn exported_series(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest
            .split_once(' ')
            .unwrap_or_else(|| panic!("malformed TYPE line {line:?}"));
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "gauge" | "unknown" | "stateset" => &[""],
            "histogram" => &["_bucket", "_sum", "_count"],
            "gaugehistogram" => &["_bucket", "_gsum", "_gcount"],
            "summary" => &["", "_sum", "_count"],
            "info" => &["_info"],
            other => panic!("metric type {other:?} of {name} is not known to this test"),
        };
        names.extend(suffixes.iter().map(|suffix| format!("{name}{suffix}")));
    }
    names
}

/// The metric names (starting with [`PREFIX`] or [`PROCESS_PREFIX`]) an expression names, outside
/// string literals.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut chars = expr.char_indices().peekable();
    let mut previous = ' ';
    while let Some((start, c)) = chars.next() {
        if matches!(c, '"' | '\'' | '`') {
            // Skip the string literal (backslash escapes only in the quoted ones).
            while let Some((_, d)) = chars.next() {
                if d == '\\' && c != '`' {
                    chars.next();
                } else if d == c {
                    break;
                }
            }
            previous = c;
            continue;
        }
        if is_ident(c) && !is_ident(previous) && !c.is_ascii_digit() && previous != '$' {
            let mut end = start + c.len_utf8();
            while let Some(&(i, d)) = chars.peek() {
                if !is_ident(d) {
                    break;
                }
                end = i + d.len_utf8();
                chars.next();
            }
            let ident = &expr[start..end];
            if ident.starts_with(PREFIX) || ident.starts_with(PROCESS_PREFIX) {
                names.insert(ident.to_owned());
            }
            previous = expr[..end].chars().next_back().unwrap_or(' ');
            continue;
        }
        previous = c;
    }
    names
}

/// Every dashboard in `deploy/monitoring/dashboards/`, parsed, by file name.
fn dashboards() -> Vec<(String, Json)> {
    let dir = monitoring().join("dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    let dashboards: Vec<(String, Json)> = files
        .iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.ends_with(".json"),
                "{name}: only Grafana dashboards (.json) belong in dashboards/"
            );
            let json = serde_json::from_str(&read(path))
                .unwrap_or_else(|e| panic!("{name} is not valid JSON: {e}"));
            (name, json)
        })
        .collect();
    assert!(!dashboards.is_empty(), "no dashboard in {}", dir.display());
    dashboards
}

/// The panels of a dashboard, those nested in (collapsed) rows included.
fn panels(dashboard: &Json) -> Vec<&Json> {
    fn walk<'a>(list: &'a Json, out: &mut Vec<&'a Json>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            if let Some(nested) = panel.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// A PromQL query of a dashboard: where it is, and the expression.
struct Query {
    place: String,
    expr: String,
}

/// The PromQL of every panel target of a dashboard.
fn panel_queries(file: &str, dashboard: &Json) -> Vec<Query> {
    let mut queries = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let place = format!(
                "{file}: panel {} {:?} target {}",
                panel["id"],
                panel["title"].as_str().unwrap_or_default(),
                target["refId"]
            );
            let expr = target["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{place} has no PromQL `expr`"));
            queries.push(Query {
                place,
                expr: expr.to_owned(),
            });
        }
    }
    queries
}

/// The queries of a dashboard's query variables (`label_values(...)` and the like).
fn variable_queries(file: &str, dashboard: &Json) -> Vec<Query> {
    let mut queries = Vec::new();
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = &variable["query"];
        let text = query.as_str().or_else(|| query["query"].as_str());
        queries.push(Query {
            place: format!("{file}: variable {}", variable["name"]),
            expr: text
                .unwrap_or_else(|| panic!("{file}: variable {} has no query", variable["name"]))
                .to_owned(),
        });
    }
    queries
}

/// The PrometheusRule's `spec`: a Prometheus rules file.
/// A YAML list of strings (`what` names it in the failure).
fn strings<'a>(list: &'a Yaml, what: &str) -> Vec<&'a str> {
    let items = list
        .as_sequence()
        .unwrap_or_else(|| panic!("{what}: not a list"));
    let text = |item: &'a Yaml| item.as_str().unwrap_or_else(|| panic!("{what}: {item:?}"));
    items.iter().map(text).collect()
}

fn rules_spec() -> Yaml {
    let path = monitoring().join("prometheusrule.yaml");
    let rule: Yaml = serde_yaml_ng::from_str(&read(&path))
        .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()));
    assert_eq!(
        rule["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    let spec = rule["spec"].clone();
    assert!(
        spec["groups"].as_sequence().is_some_and(|g| !g.is_empty()),
        "the PrometheusRule has no spec.groups"
    );
    spec
}

/// The alerting rules of a rules file.
fn alerts(spec: &Yaml) -> Vec<&Yaml> {
    let mut alerts = Vec::new();
    for group in spec["groups"].as_sequence().into_iter().flatten() {
        for rule in group["rules"].as_sequence().into_iter().flatten() {
            if rule.get("alert").is_some() {
                alerts.push(rule);
            }
        }
    }
    alerts
}

fn alert_name(rule: &Yaml) -> &str {
    rule["alert"].as_str().expect("alert names are strings")
}

/// promtool from `PROMTOOL` or `PATH`; never skips: CI installs it through `make setup`.
fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os("PROMTOOL") {
        return path.into();
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("promtool"))
                .find(|candidate| candidate.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "promtool not found on PATH (nor in PROMTOOL): run hack/ensure-promtool.sh \
                 (`make setup` does) to install Debian's prometheus package"
            )
        })
}

/// Runs promtool with `args` (in `dir`, with `stdin`) and fails the test with its output unless
/// it succeeds.
fn run_promtool(args: &[&str], dir: &Path, stdin: Option<&str>) -> Output {
    let mut child = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .expect("write to promtool");
    }
    let output = child.wait_with_output().expect("promtool runs");
    assert!(
        output.status.success(),
        "promtool {} failed ({}):\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// GitHub's anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn the_metric_names_of_an_expression_are_found_outside_strings() {
    let expr = r#"histogram_quantile(0.99, sum by (pod, le) (rate(module_manager_queue_wait_seconds_bucket{namespace="module_manager_not_a_metric", pod=~"$pod"}[$__rate_interval]))) / on() group_left module_manager_x:recorded or vector(0) * 5m"#;
    assert_eq!(
        metric_names(expr),
        BTreeSet::from([
            "module_manager_queue_wait_seconds_bucket".to_owned(),
            "module_manager_x:recorded".to_owned()
        ])
    );
    assert!(metric_names(r#"absent(up{job=~".*module_manager_.*"} == 1)"#).is_empty());
    assert_eq!(
        metric_names(r#"rate(process_cpu_seconds_total{pod=~"$pod"}[5m])"#),
        BTreeSet::from(["process_cpu_seconds_total".to_owned()])
    );
}

#[test]
fn the_exported_series_follow_the_type_lines() {
    let text = exposition();
    let exported = exported_series(&text);
    for series in [
        "module_manager_reconcile_passes_total",
        "module_manager_queue_wait_seconds_bucket",
        "module_manager_queue_due",
        "module_manager_queue_scheduled",
        "module_manager_fence_lapses_total",
        "module_manager_manifests",
        "module_manager_build_info",
        "module_manager_helm_cpu_seconds_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(exported.contains(series), "{series} is not exported");
    }
    // Renamed when its meaning changed (issue 19): nothing may still read the old series.
    assert!(!exported.contains("module_manager_queue_depth"));
    assert!(!exported.contains("module_manager_reconcile_passes"));
    // Every sample the exposition carries is a series the derivation predicts.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap();
        assert!(exported.contains(name), "sample {line:?} not predicted");
    }
}

#[test]
fn dashboards_are_valid_json_with_unique_panel_ids_and_a_datasource_variable() {
    let mut uids = BTreeSet::new();
    for (file, dashboard) in dashboards() {
        let uid = dashboard["uid"].as_str().unwrap_or_default();
        assert!(!uid.is_empty(), "{file}: no uid");
        assert!(uids.insert(uid.to_owned()), "{file}: uid {uid} is taken");
        assert!(
            dashboard["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{file}: no title"
        );
        assert!(
            dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
            "{file}: schemaVersion"
        );

        let variables = dashboard["templating"]["list"]
            .as_array()
            .unwrap_or_else(|| panic!("{file}: no templating.list"));
        let variable = |name: &str| variables.iter().find(|v| v["name"] == name);
        let datasource =
            variable("datasource").unwrap_or_else(|| panic!("{file}: no datasource variable"));
        assert_eq!(datasource["type"], "datasource", "{file}");
        assert_eq!(datasource["query"], "prometheus", "{file}");
        for name in ["namespace", "pod"] {
            assert!(variable(name).is_some(), "{file}: no {name} variable");
        }

        let mut ids = BTreeSet::new();
        let panels = panels(&dashboard);
        assert!(!panels.is_empty(), "{file}: no panels");
        for panel in &panels {
            let id = panel["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("{file}: panel {:?} has no id", panel["title"]));
            assert!(ids.insert(id), "{file}: panel id {id} is used twice");
            assert!(
                panel["title"].as_str().is_some_and(|t| !t.is_empty()),
                "{file}: panel {id} has no title"
            );
            if panel["type"] == "row" {
                continue;
            }
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{file}: panel {id} does not use the datasource variable"
            );
            let targets = panel["targets"].as_array();
            assert!(
                targets.is_some_and(|t| !t.is_empty()),
                "{file}: panel {id} has no targets"
            );
            let mut ref_ids = BTreeSet::new();
            for target in targets.into_iter().flatten() {
                assert_eq!(target["datasource"]["uid"], "${datasource}", "{file}: {id}");
                assert!(
                    ref_ids.insert(target["refId"].to_string()),
                    "{file}: panel {id} repeats refId {}",
                    target["refId"]
                );
            }
        }
    }
}

#[test]
fn dashboards_and_alerts_query_only_metrics_the_binary_exports() {
    let exported = exported_series(&exposition());
    assert!(
        exported.len() > 20,
        "the exposition names too few series: {exported:?}"
    );

    let mut queries = Vec::new();
    for (file, dashboard) in dashboards() {
        let panel_queries = panel_queries(&file, &dashboard);
        for query in &panel_queries {
            // Also the panels of the standard process metrics, which other programs export too:
            // they keep to module-manager's pods with one of its own.
            assert!(
                metric_names(&query.expr)
                    .iter()
                    .any(|name| name.starts_with(PREFIX)),
                "{} queries no {PREFIX} metric: {}",
                query.place,
                query.expr
            );
        }
        queries.extend(panel_queries);
        queries.extend(variable_queries(&file, &dashboard));
    }
    let spec = rules_spec();
    for rule in alerts(&spec) {
        queries.push(Query {
            place: format!("prometheusrule.yaml: alert {}", alert_name(rule)),
            expr: rule["expr"].as_str().expect("expr").to_owned(),
        });
    }

    let mut missing = BTreeMap::<String, Vec<String>>::new();
    let mut used = BTreeSet::new();
    for query in &queries {
        for name in metric_names(&query.expr) {
            if !exported.contains(&name) {
                missing
                    .entry(name.clone())
                    .or_default()
                    .push(query.place.clone());
            }
            used.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "dashboards or alerts query series the binary does not export \
         (exported: {exported:#?}; a labelled family is exported only once `exposition()` \
         gives it a child):\n{missing:#?}"
    );
    assert!(
        used.len() > 10,
        "too few metrics found in the queries: {used:?}"
    );
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    // promtool has no expression checker; recording rules are expressions it parses.
    let mut rules = Vec::new();
    for (file, dashboard) in dashboards() {
        let stem = file.trim_end_matches(".json").replace(['-', '.'], "_");
        for (i, query) in panel_queries(&file, &dashboard).into_iter().enumerate() {
            // Grafana's interval macros become plain durations; `$namespace`, `$pod` sit in
            // label matcher strings, which are valid as they are.
            let expr = ["$__rate_interval", "$__interval", "$__range"]
                .into_iter()
                .fold(query.expr, |expr, macro_| expr.replace(macro_, "5m"));
            rules.push(serde_json::json!({
                // promtool names the failing rule by its record: the dashboard and the query.
                "record": format!("{stem}:query_{i}"),
                "labels": {"place": query.place},
                "expr": expr,
            }));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = serde_json::json!({"groups": [{"name": "dashboards", "rules": rules}]});
    std::fs::write(
        dir.path().join("dashboards.yaml"),
        serde_yaml_ng::to_string(&file).unwrap(),
    )
    .unwrap();
    run_promtool(&["check", "rules", "dashboards.yaml"], dir.path(), None);
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let dir = tempfile::tempdir().unwrap();
    let rules = serde_yaml_ng::to_string(&rules_spec()).unwrap();
    std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
    let output = run_promtool(&["check", "rules", "rules.yaml"], dir.path(), None);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let count = alerts(&rules_spec()).len();
    assert!(
        stdout.contains(&format!("SUCCESS: {count} rules found")),
        "{stdout}"
    );
}

#[test]
fn the_alerts_unit_tests_pass() {
    let tests_path = monitoring().join("rules_test.yaml");
    let tests_text = read(&tests_path);
    let tests: Yaml = serde_yaml_ng::from_str(&tests_text).expect("rules_test.yaml is YAML");
    let rule_files = strings(&tests["rule_files"], "rules_test.yaml's rule_files");
    assert_eq!(
        rule_files.len(),
        1,
        "one rules file: the PrometheusRule's spec"
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(rule_files[0]),
        serde_yaml_ng::to_string(&rules_spec()).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.path().join("rules_test.yaml"), &tests_text).unwrap();
    run_promtool(&["test", "rules", "rules_test.yaml"], dir.path(), None);

    // Each alert is tested both ways: it fires where it should, and stays silent elsewhere.
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for case in tests["tests"].as_sequence().into_iter().flatten() {
        for check in case["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = check["alertname"].as_str().unwrap().to_owned();
            match check["exp_alerts"].as_sequence() {
                Some(expected) if !expected.is_empty() => fires.insert(name),
                _ => silent.insert(name),
            };
        }
    }
    for rule in alerts(&rules_spec()) {
        let name = alert_name(rule);
        assert!(fires.contains(name), "no test in which {name} fires");
        assert!(
            silent.contains(name),
            "no test in which {name} stays silent"
        );
    }
}

#[test]
fn every_alert_has_a_severity_a_runbook_and_a_doc() {
    let anchors: BTreeSet<String> = RUNBOOK_HEADINGS.iter().map(|h| anchor(h)).collect();
    // Once docs/operations.md exists, its headings are the truth.
    let operations = repo().join("docs/operations.md");
    let headings: Option<BTreeSet<String>> = operations.exists().then(|| {
        read(&operations)
            .lines()
            .filter_map(|line| line.strip_prefix('#'))
            .map(|heading| anchor(heading.trim_start_matches('#')))
            .collect()
    });
    let docs = read(&repo().join("docs/monitoring.md"));

    let spec = rules_spec();
    let alerts = alerts(&spec);
    assert!(alerts.len() >= 8, "alerts: {}", alerts.len());
    let mut names = BTreeSet::new();
    for rule in alerts {
        let name = alert_name(rule);
        assert!(names.insert(name), "alert {name} is defined twice");
        assert!(
            name.starts_with("ModuleManager"),
            "{name}: alerts are named ModuleManager…"
        );
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{name}: severity {severity:?}"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: no {annotation}"
            );
        }
        let runbook = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no runbook_url"));
        let target = runbook
            .strip_prefix("docs/operations.md#")
            .unwrap_or_else(|| panic!("{name}: runbook {runbook} is not in docs/operations.md"));
        assert!(
            anchors.contains(target),
            "{name}: runbook anchor #{target} is none of {anchors:?}"
        );
        if let Some(headings) = &headings {
            assert!(
                headings.contains(target),
                "{name}: docs/operations.md has no heading for #{target}"
            );
        }
        assert!(
            docs.contains(&format!("`{name}`")),
            "docs/monitoring.md does not describe {name}"
        );
    }

    for (file, dashboard) in dashboards() {
        for panel in panels(&dashboard)
            .into_iter()
            .filter(|p| p["type"] != "row")
        {
            let title = panel["title"].as_str().unwrap();
            assert!(
                docs.contains(&format!("| {title} |")),
                "docs/monitoring.md has no table row for the panel {title:?} of {file}"
            );
        }
    }
}

#[test]
fn the_exposition_passes_promtool_check_metrics() {
    let classic = exposition_in(Format::PrometheusText);
    let output = run_promtool(&["check", "metrics"], &repo(), Some(&classic));
    let complaints = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        complaints.trim().is_empty(),
        "promtool check metrics: {complaints}"
    );
}

#[test]
fn the_kustomization_ships_every_dashboard_and_the_rules() {
    let kustomization: Yaml =
        serde_yaml_ng::from_str(&read(&monitoring().join("kustomization.yaml"))).unwrap();
    assert_eq!(kustomization["kind"].as_str(), Some("Kustomization"));
    assert_eq!(kustomization["namespace"].as_str(), Some("module-manager"));
    let resources = strings(&kustomization["resources"], "the kustomization's resources");
    assert!(resources.contains(&"prometheusrule.yaml"), "{resources:?}");
    let options = &kustomization["generatorOptions"];
    assert_eq!(options["disableNameSuffixHash"].as_bool(), Some(true));
    assert_eq!(options["labels"]["grafana_dashboard"].as_str(), Some("1"));

    let generators = kustomization["configMapGenerator"]
        .as_sequence()
        .expect("configMapGenerator");
    let shipped: BTreeSet<&str> = generators
        .iter()
        .flat_map(|g| g["files"].as_sequence().into_iter().flatten())
        .map(|f| f.as_str().unwrap())
        .collect();
    let mut size = 0;
    for (file, _) in dashboards() {
        let path = format!("dashboards/{file}");
        assert!(
            shipped.contains(path.as_str()),
            "{path} is not in the ConfigMap"
        );
        size += std::fs::metadata(monitoring().join(&path)).unwrap().len();
    }
    for path in &shipped {
        assert!(monitoring().join(path).is_file(), "{path} does not exist");
    }
    // `kubectl apply` (client side) copies the ConfigMap into an annotation of at most 256 KiB.
    assert!(
        size < 200 * 1024,
        "the dashboards ConfigMap ({size} bytes) nears kubectl apply's 256 KiB annotation limit"
    );
}
