//! The Prometheus sections of the summary: each dashboard's panels with their series counts
//! (and links to the PNGs of its rows), and each alert's time pending and firing against what
//! the run expects of it.

use crate::results::{DashboardFigures, Monitoring, RunResult};

use super::super::panels;
use super::format::{Align, number, table};

/// The section, when Prometheus watched the run.
pub(super) fn section(result: &RunResult) -> Option<String> {
    let m = result.monitoring.as_ref()?;
    let mut out = vec![format!(
        "## Dashboards and alerts\n\nA real Prometheus ({}) scraped every replica every {} s \
         and evaluated the alert rules of `deploy/monitoring/prometheusrule.yaml`; afterwards \
         every panel query of `deploy/monitoring/dashboards/` was evaluated over the run's {} s \
         as Grafana would ({}).",
        m.prometheus,
        number(m.scrape_interval_seconds),
        number(m.window_seconds.round()),
        if m.faults {
            "a run with faults: panels declared empty without faults must have data"
        } else {
            "a run without faults: panels declared empty in a clean run or without faults may be empty"
        }
    )];
    for dashboard in &m.dashboards {
        out.push(dashboard_table(dashboard));
    }
    let links: Vec<String> = panels::planned(result)
        .iter()
        .map(|row| format!("![{}]({})", row.title, row.file_name))
        .collect();
    if !links.is_empty() {
        out.push(links.join("\n\n"));
    }
    out.push(alerts(m));
    Some(out.join("\n\n"))
}

fn dashboard_table(d: &DashboardFigures) -> String {
    let variables: Vec<String> = d
        .variables
        .iter()
        .map(|(k, v)| format!("`${k}` = {v}"))
        .collect();
    let rows = d
        .panels
        .iter()
        .map(|p| {
            vec![
                p.row.clone(),
                format!("{} {}", p.id, p.title),
                p.unit.clone(),
                p.series.len().to_string(),
                p.expected.clone(),
                p.problems.join("; "),
            ]
        })
        .collect();
    let mut text = format!(
        "### {} (`{}`)\n\nVariables: {}.\n\n{}",
        d.title,
        d.file,
        variables.join(", "),
        table(
            &["row", "panel", "unit", "series", "declared", "problems"],
            &[
                Align::Left,
                Align::Left,
                Align::Left,
                Align::Right,
                Align::Left,
                Align::Left
            ],
            rows
        )
    );
    if !d.problems.is_empty() {
        text.push_str(&format!("\n\nProblems: {}", d.problems.join("; ")));
    }
    text
}

fn alerts(m: &Monitoring) -> String {
    let rows = m
        .alerts
        .iter()
        .map(|a| {
            vec![
                a.name.clone(),
                a.health.clone(),
                number(a.pending_seconds.round()),
                number(a.firing_seconds.round()),
                a.expected.clone(),
            ]
        })
        .collect();
    format!(
        "### Alerts\n\n{}",
        table(
            &["alert", "health", "pending (s)", "firing (s)", "expected"],
            &[
                Align::Left,
                Align::Left,
                Align::Right,
                Align::Right,
                Align::Left
            ],
            rows
        )
    )
}
