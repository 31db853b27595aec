//! A Grafana dashboard as the load test reads it (pure): its template variables, and its panels
//! with their queries, unit, row and what the panel declares about an empty result.
//!
//! The declaration is a sentence in the panel's `description` (with the reason after it, in
//! parentheses):
//! - `Expected empty in a clean run` — the panel shows only failures (errors, failing
//!   Manifests…): no run has to fill it;
//! - `Expected empty without faults` — it shows what only faults cause (handovers after a
//!   takeover…): a run without faults may leave it empty, `chaos` must fill it.
//!
//! Every other panel must return series in every run the dashboards are evaluated in.

use anyhow::{Context, bail};
use serde_json::Value;

/// The sentence of a panel description that declares an error panel.
pub const EMPTY_IN_A_CLEAN_RUN: &str = "Expected empty in a clean run";
/// The sentence of a panel description that declares a panel only faults fill.
pub const EMPTY_WITHOUT_FAULTS: &str = "Expected empty without faults";

/// What a panel declares about returning no series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expectation {
    /// Must return series in every run.
    Data,
    /// May stay empty in any run (it shows failures).
    EmptyInACleanRun,
    /// May stay empty in runs without faults; a run with faults must fill it.
    EmptyWithoutFaults,
}

impl Expectation {
    /// The declaration of `description` (both sentences at once is an error).
    pub fn of(description: &str) -> anyhow::Result<Self> {
        match (
            description.contains(EMPTY_IN_A_CLEAN_RUN),
            description.contains(EMPTY_WITHOUT_FAULTS),
        ) {
            (false, false) => Ok(Self::Data),
            (true, false) => Ok(Self::EmptyInACleanRun),
            (false, true) => Ok(Self::EmptyWithoutFaults),
            (true, true) => {
                bail!("declares both {EMPTY_IN_A_CLEAN_RUN:?} and {EMPTY_WITHOUT_FAULTS:?}")
            }
        }
    }

    /// How `results.json` and the report name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::EmptyInACleanRun => "empty in a clean run",
            Self::EmptyWithoutFaults => "empty without faults",
        }
    }
}

/// A datasource reference (`{"type": …, "uid": …}`); either may be absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatasourceRef {
    pub kind: Option<String>,
    pub uid: Option<String>,
}

/// One query of a panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub ref_id: String,
    pub expr: String,
    /// Grafana's legend template (`{{pod}} draining`; `__auto` or empty: the series' labels).
    pub legend: String,
    pub datasource: Option<DatasourceRef>,
}

/// A panel that queries (rows are not panels here; they name the section a panel is in).
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub id: u64,
    pub title: String,
    /// `timeseries`, `stat`…
    pub kind: String,
    /// The title of the row above it (empty before the first row).
    pub row: String,
    /// `fieldConfig.defaults.unit` (empty: none).
    pub unit: String,
    pub expectation: Expectation,
    pub datasource: Option<DatasourceRef>,
    /// `maxDataPoints`, else the points its width would show (see [`Panel::max_data_points`]).
    pub max_data_points: u32,
    /// `interval`: the panel's minimum query interval, if set (`"30s"`).
    pub min_interval: Option<String>,
    pub targets: Vec<Target>,
}

/// A template variable.
#[derive(Clone, Debug, PartialEq)]
pub struct Variable {
    pub name: String,
    pub kind: String,
    /// The query (`label_values(…)`) of a query variable; the plugin id (`prometheus`) of a
    /// datasource variable.
    pub query: String,
    pub datasource: Option<DatasourceRef>,
    pub include_all: bool,
    pub all_value: Option<String>,
    pub multi: bool,
    pub regex: String,
    /// Grafana's sort option (0 as returned, 1/2 alphabetical, 3/4 numerical, 5/6 alphabetical
    /// ignoring case; odd ascending).
    pub sort: u64,
    /// `current.value` as saved (empty: none).
    pub current: Vec<String>,
}

/// A dashboard's variables and panels.
#[derive(Clone, Debug, PartialEq)]
pub struct Dashboard {
    pub uid: String,
    pub title: String,
    pub variables: Vec<Variable>,
    pub panels: Vec<Panel>,
}

/// Grafana's grid is 24 columns; a panel of width `w` on a 1920-pixel-wide screen shows
/// about `w / 24 × 1800` pixels, one data point per pixel (Grafana's default `maxDataPoints`).
const SCREEN_PIXELS: f64 = 1800.0;

impl Dashboard {
    /// Parses a dashboard's JSON; `file` names it in errors.
    pub fn parse(file: &str, json: &Value) -> anyhow::Result<Self> {
        let variables = json["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .map(variable)
            .collect::<anyhow::Result<Vec<_>>>()
            .with_context(|| format!("{file}: templating"))?;
        let mut panels = Vec::new();
        walk(&json["panels"], "", &mut panels).with_context(|| format!("{file}: panels"))?;
        Ok(Self {
            uid: text(&json["uid"]),
            title: text(&json["title"]),
            variables,
            panels,
        })
    }
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

/// The panels of `list` in order, those of rows (collapsed or not) included, each with the
/// title of the row it is under.
fn walk(list: &Value, row: &str, out: &mut Vec<Panel>) -> anyhow::Result<()> {
    let mut row = row.to_owned();
    for value in list.as_array().into_iter().flatten() {
        if value["type"] == "row" {
            row = text(&value["title"]);
            walk(&value["panels"], &row, out)?;
            continue;
        }
        out.push(panel(value, &row)?);
    }
    Ok(())
}

fn panel(value: &Value, row: &str) -> anyhow::Result<Panel> {
    let id = value["id"].as_u64().context("a panel without an id")?;
    let title = text(&value["title"]);
    let place = || format!("panel {id} {title:?}");
    let targets = value["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            Ok(Target {
                ref_id: text(&t["refId"]),
                expr: t["expr"]
                    .as_str()
                    .with_context(|| format!("{} target {}: no `expr`", place(), t["refId"]))?
                    .to_owned(),
                legend: text(&t["legendFormat"]),
                datasource: datasource(&t["datasource"]),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let width = value["gridPos"]["w"].as_f64().unwrap_or(24.0);
    let max_data_points = value["maxDataPoints"]
        .as_u64()
        .map_or((width / 24.0 * SCREEN_PIXELS).round() as u32, |m| m as u32);
    Ok(Panel {
        id,
        kind: text(&value["type"]),
        row: row.to_owned(),
        unit: text(&value["fieldConfig"]["defaults"]["unit"]),
        expectation: Expectation::of(value["description"].as_str().unwrap_or_default())
            .with_context(place)?,
        datasource: datasource(&value["datasource"]),
        max_data_points: max_data_points.max(1),
        min_interval: value["interval"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        targets,
        title,
    })
}

/// A datasource reference: an object, or (old dashboards) a datasource name as a string.
fn datasource(value: &Value) -> Option<DatasourceRef> {
    match value {
        Value::Null => None,
        Value::String(uid) => Some(DatasourceRef {
            kind: None,
            uid: Some(uid.clone()),
        }),
        other => Some(DatasourceRef {
            kind: other["type"].as_str().map(str::to_owned),
            uid: other["uid"].as_str().map(str::to_owned),
        }),
    }
}

fn variable(value: &Value) -> anyhow::Result<Variable> {
    let name = text(&value["name"]);
    let query = &value["query"];
    let query = query
        .as_str()
        .or_else(|| query["query"].as_str())
        .unwrap_or_default()
        .to_owned();
    let current = match &value["current"]["value"] {
        Value::String(s) if !s.is_empty() => vec![s.clone()],
        Value::Array(values) => values
            .iter()
            .filter_map(|v| v.as_str())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    anyhow::ensure!(!name.is_empty(), "a variable without a name");
    Ok(Variable {
        kind: text(&value["type"]),
        datasource: datasource(&value["datasource"]),
        include_all: value["includeAll"].as_bool().unwrap_or(false),
        all_value: value["allValue"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        multi: value["multi"].as_bool().unwrap_or(false),
        regex: text(&value["regex"]),
        sort: value["sort"].as_u64().unwrap_or(0),
        current,
        query,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_declarations_are_read_from_the_description() {
        assert_eq!(Expectation::of("Queue depth.").unwrap(), Expectation::Data);
        assert_eq!(
            Expectation::of("Errors by category. Expected empty in a clean run (no errors).")
                .unwrap(),
            Expectation::EmptyInACleanRun
        );
        assert_eq!(
            Expectation::of("Gaps. Expected empty without faults.").unwrap(),
            Expectation::EmptyWithoutFaults
        );
        let both = format!("{EMPTY_IN_A_CLEAN_RUN} {EMPTY_WITHOUT_FAULTS}");
        assert!(Expectation::of(&both).is_err());
    }

    #[test]
    fn panels_carry_their_row_unit_and_queries_nested_rows_included() {
        let json = json!({
            "uid": "u", "title": "T",
            "templating": {"list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {"name": "pod", "type": "query", "query": {"query": "label_values(up, pod)"},
                 "includeAll": true, "allValue": ".*", "multi": true, "sort": 1, "current": {}}
            ]},
            "panels": [
                {"id": 1, "type": "stat", "title": "Top", "gridPos": {"w": 12},
                 "targets": [{"refId": "A", "expr": "up", "legendFormat": "__auto"}]},
                {"id": 2, "type": "row", "title": "Row A", "panels": []},
                {"id": 3, "type": "timeseries", "title": "In A",
                 "fieldConfig": {"defaults": {"unit": "s"}},
                 "description": "x. Expected empty in a clean run.",
                 "datasource": {"type": "prometheus", "uid": "${datasource}"},
                 "targets": [{"refId": "A", "expr": "x"}]},
                {"id": 4, "type": "row", "title": "Collapsed", "collapsed": true, "panels": [
                    {"id": 5, "type": "timeseries", "title": "Inside", "maxDataPoints": 100,
                     "targets": [{"refId": "B", "expr": "y"}]}
                ]}
            ]
        });
        let d = Dashboard::parse("d.json", &json).unwrap();
        let rows: Vec<(u64, &str)> = d.panels.iter().map(|p| (p.id, p.row.as_str())).collect();
        assert_eq!(rows, [(1, ""), (3, "Row A"), (5, "Collapsed")]);
        assert_eq!(d.panels[0].max_data_points, 900);
        assert_eq!(d.panels[2].max_data_points, 100);
        assert_eq!(d.panels[1].unit, "s");
        assert_eq!(d.panels[1].expectation, Expectation::EmptyInACleanRun);
        assert_eq!(
            d.panels[1].datasource.as_ref().unwrap().uid.as_deref(),
            Some("${datasource}")
        );
        assert_eq!(d.variables[1].query, "label_values(up, pod)");
        assert!(d.variables[1].include_all && d.variables[1].multi);
        assert_eq!(d.variables[1].all_value.as_deref(), Some(".*"));
    }

    #[test]
    fn a_target_without_an_expression_is_an_error_naming_the_panel() {
        let json = json!({"panels": [{"id": 7, "title": "P", "targets": [{"refId": "A"}]}]});
        let e = format!("{:#}", Dashboard::parse("d.json", &json).unwrap_err());
        assert!(e.contains("d.json") && e.contains("panel 7"), "{e}");
    }
}
