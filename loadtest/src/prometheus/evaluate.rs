//! A dashboard evaluated as Grafana would show it over a window: its template variables filled
//! from their own queries, then every panel query, with the variables and Grafana's built-ins
//! substituted, as a range query through the Prometheus API. What is wrong with the dashboard
//! (a variable without values, a foreign datasource, an unknown unit, a query Prometheus
//! refuses, a legend naming a missing label) is recorded with the panel, not raised: the
//! checkers turn it into findings.

use std::collections::BTreeMap;

use anyhow::{Context, bail};

use super::api::{Api, Series};
use super::dashboard::{Dashboard, DatasourceRef, Panel, Variable};
use super::grafana::{self, Selected};
use super::units;
use crate::results::{DashboardFigures, PanelFigures, PanelSeries};

/// The uid the datasource variable resolves to: the run's Prometheus.
pub const DATASOURCE_UID: &str = "loadtest-prometheus";

/// The time window and the datasource's scrape interval.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start: f64,
    pub end: f64,
    pub scrape_ms: u64,
}

/// The variables' values as text, by name (datasource variables give [`DATASOURCE_UID`]).
type Values = BTreeMap<String, Selected>;

/// Evaluates `dashboard` (from `file`) over `window`.
pub async fn dashboard(
    api: &Api,
    file: &str,
    dashboard: &Dashboard,
    window: Window,
) -> DashboardFigures {
    let mut problems = Vec::new();
    let mut values = Values::new();
    for variable in &dashboard.variables {
        match resolve(api, variable, &values, window).await {
            Ok(selected) => {
                values.insert(variable.name.clone(), selected);
            }
            Err(e) => problems.push(format!("variable ${}: {e:#}", variable.name)),
        }
    }
    let mut panels = Vec::new();
    for panel in &dashboard.panels {
        panels.push(evaluate_panel(api, panel, &values, window).await);
    }
    DashboardFigures {
        file: file.to_owned(),
        uid: dashboard.uid.clone(),
        title: dashboard.title.clone(),
        variables: values
            .iter()
            .map(|(name, selected)| (name.clone(), selected.display()))
            .collect(),
        problems,
        panels,
    }
}

/// A variable's value: a datasource variable selects the run's Prometheus; a query variable
/// runs its query with the variables before it substituted.
async fn resolve(
    api: &Api,
    variable: &Variable,
    before: &Values,
    window: Window,
) -> anyhow::Result<Selected> {
    match variable.kind.as_str() {
        "datasource" => {
            anyhow::ensure!(
                variable.query == "prometheus",
                "a datasource variable of {:?}: the dashboards query Prometheus",
                variable.query
            );
            Ok(Selected::One(DATASOURCE_UID.to_owned()))
        }
        "query" => {
            check_datasource(variable.datasource.as_ref(), before)?;
            anyhow::ensure!(
                variable.regex.is_empty(),
                "a regex ({:?}) the load test does not apply",
                variable.regex
            );
            let query = grafana::interpolate(&variable.query, &|name| {
                before.get(name).map(Selected::promql)
            })?;
            let options = query_values(api, &query, window)
                .await
                .with_context(|| format!("query {query:?}"))?;
            let options = grafana::sort_options(options, variable.sort);
            grafana::select(
                &options,
                &variable.current,
                variable.include_all,
                variable.all_value.as_deref(),
            )
            .with_context(|| format!("query {query:?}"))
        }
        other => bail!("type {other:?} is not one the load test fills (datasource, query)"),
    }
}

/// The values of a Prometheus variable query: `label_values(label)`,
/// `label_values(selector, label)` or `query_result(expr)`.
async fn query_values(api: &Api, query: &str, window: Window) -> anyhow::Result<Vec<String>> {
    let query = query.trim();
    if let Some(args) = call_args(query, "label_values") {
        let (selector, label) = match args.rsplit_once(',') {
            Some((selector, label)) => (selector.trim(), label.trim()),
            None => ("", args.trim()),
        };
        return api
            .label_values(label, selector, window.start, window.end)
            .await;
    }
    if let Some(expr) = call_args(query, "query_result") {
        let series = api.query(expr, window.end).await?;
        return Ok(series
            .iter()
            .map(|s| {
                let labels: Vec<String> = s
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{v}\""))
                    .collect();
                let value = s.points.first().map_or(f64::NAN, |p| p.1);
                format!("{{{}}} {value}", labels.join(","))
            })
            .collect());
    }
    bail!("only label_values(…) and query_result(…) are filled by the load test")
}

/// `name(args)` → `args`.
fn call_args<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .strip_prefix(name)?
        .trim_start()
        .strip_prefix('(')?
        .strip_suffix(')')
}

/// A datasource reference must name Prometheus and resolve to the dashboard's datasource
/// variable: a fixed uid works only on the Grafana the dashboard was exported from.
fn check_datasource(reference: Option<&DatasourceRef>, values: &Values) -> anyhow::Result<()> {
    let Some(reference) = reference else {
        // Grafana's default datasource: the one Prometheus here.
        return Ok(());
    };
    if let Some(kind) = &reference.kind {
        anyhow::ensure!(
            kind == "prometheus",
            "datasource type {kind:?}, not prometheus"
        );
    }
    if let Some(uid) = &reference.uid {
        let resolved = grafana::interpolate(uid, &|name| values.get(name).map(Selected::promql))?;
        anyhow::ensure!(
            resolved == DATASOURCE_UID,
            "datasource uid {uid:?} is not the dashboard's datasource variable"
        );
    }
    Ok(())
}

async fn evaluate_panel(api: &Api, panel: &Panel, values: &Values, window: Window) -> PanelFigures {
    let mut problems = Vec::new();
    if !units::known(&panel.unit) {
        problems.push(format!("unit {:?} is not one the report knows", panel.unit));
    }
    if let Err(e) = check_datasource(panel.datasource.as_ref(), values) {
        problems.push(format!("panel: {e:#}"));
    }
    let min_interval = match panel
        .min_interval
        .as_deref()
        .map(grafana::parse_duration_ms)
    {
        Some(Ok(ms)) => Some(ms),
        Some(Err(e)) => {
            problems.push(format!("interval: {e:#}"));
            None
        }
        None => None,
    };
    let (range, builtins) = grafana::panel_range(
        window.start,
        window.end,
        panel.max_data_points,
        min_interval,
        window.scrape_ms,
    );
    let mut series = Vec::new();
    for target in &panel.targets {
        let place = format!("target {}", target.ref_id);
        if let Err(e) = check_datasource(target.datasource.as_ref(), values) {
            problems.push(format!("{place}: {e:#}"));
        }
        let lookup = |name: &str| {
            builtins
                .get(name)
                .or_else(|| values.get(name).map(Selected::promql))
        };
        let answer = match grafana::interpolate(&target.expr, &lookup) {
            Ok(expr) => api.query_range(&expr, range).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(answer) => {
                for s in answer {
                    if let Some(drawn) = drawable(&s, target, window.start, &mut problems) {
                        series.push(drawn);
                    }
                }
            }
            Err(e) => problems.push(format!("{place}: {e:#}")),
        }
    }
    problems.dedup();
    PanelFigures {
        id: panel.id,
        title: panel.title.clone(),
        row: panel.row.clone(),
        kind: panel.kind.clone(),
        unit: panel.unit.clone(),
        expected: panel.expectation.name().to_owned(),
        step_seconds: range.step,
        series,
        problems,
    }
}

/// The series as a panel draws it (finite points, relative times, its legend); `None` when it
/// has no finite value. A legend naming a label the series lacks is a problem.
fn drawable(
    series: &Series,
    target: &super::dashboard::Target,
    start: f64,
    problems: &mut Vec<String>,
) -> Option<PanelSeries> {
    let points: Vec<(f64, f64)> = series
        .points
        .iter()
        .filter(|(_, v)| v.is_finite())
        .map(|(t, v)| (t - start, *v))
        .collect();
    if points.is_empty() {
        return None;
    }
    let (legend, missing) = grafana::legend(&target.legend, &series.labels, &target.expr);
    if !missing.is_empty() {
        problems.push(format!(
            "target {}: the legend {:?} names labels its series lack: {}",
            target.ref_id,
            target.legend,
            missing.join(", ")
        ));
    }
    Some(PanelSeries {
        ref_id: target.ref_id.clone(),
        legend,
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_queries_are_split_into_their_arguments() {
        assert_eq!(
            call_args("label_values(up{a=\"b,c\"}, pod)", "label_values"),
            Some("up{a=\"b,c\"}, pod")
        );
        assert_eq!(call_args("label_values (pod)", "label_values"), Some("pod"));
        assert_eq!(call_args("metrics(x)", "label_values"), None);
    }

    #[test]
    fn datasources_must_be_the_dashboards_prometheus_variable() {
        let values = Values::from([(
            "datasource".to_owned(),
            Selected::One(DATASOURCE_UID.into()),
        )]);
        let reference = |kind: Option<&str>, uid: Option<&str>| DatasourceRef {
            kind: kind.map(str::to_owned),
            uid: uid.map(str::to_owned),
        };
        assert!(check_datasource(None, &values).is_ok());
        let variable = reference(Some("prometheus"), Some("${datasource}"));
        assert!(check_datasource(Some(&variable), &values).is_ok());
        let fixed = reference(Some("prometheus"), Some("P1809F7CD0C75ACF3"));
        assert!(check_datasource(Some(&fixed), &values).is_err());
        let loki = reference(Some("loki"), Some("${datasource}"));
        assert!(check_datasource(Some(&loki), &values).is_err());
        let unknown = reference(None, Some("$other"));
        assert!(check_datasource(Some(&unknown), &values).is_err());
    }
}
