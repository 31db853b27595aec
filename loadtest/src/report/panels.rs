//! The dashboards without a Grafana: one PNG per row of each dashboard
//! (`dashboard-<uid>-<n>-<row>.png`), each panel drawn from the range queries Prometheus
//! answered during the run, its y axis in the panel's unit, stat panels titled with their last
//! value, empty panels titled with what the dashboard declares about them.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use plotters::prelude::*;

use super::charts::{Panel, line, line_panel, palette};
use super::font::Text;
use crate::prometheus::units;
use crate::results::{DashboardFigures, PanelFigures, RunResult};

/// Panels side by side in a file.
const COLUMNS: usize = 3;
const CELL: (u32, u32) = (520, 320);

/// One file: a row of a dashboard.
pub(super) struct RowChart<'r> {
    pub(super) file_name: String,
    /// `<dashboard title>: <row title>`.
    pub(super) title: String,
    pub(super) panels: Vec<&'r PanelFigures>,
}

/// The files the dashboards of `result` are drawn into, in order.
pub(super) fn planned(result: &RunResult) -> Vec<RowChart<'_>> {
    let Some(monitoring) = &result.monitoring else {
        return Vec::new();
    };
    monitoring.dashboards.iter().flat_map(rows).collect()
}

fn rows(dashboard: &DashboardFigures) -> Vec<RowChart<'_>> {
    let mut rows: Vec<RowChart<'_>> = Vec::new();
    for panel in &dashboard.panels {
        match rows.last_mut() {
            Some(row) if row.panels[0].row == panel.row => row.panels.push(panel),
            _ => {
                let n = rows.len() + 1;
                let name = if panel.row.is_empty() {
                    "top"
                } else {
                    panel.row.as_str()
                };
                rows.push(RowChart {
                    file_name: format!("dashboard-{}-{n}-{}.png", slug(&dashboard.uid), slug(name)),
                    title: format!("{}: {name}", dashboard.title),
                    panels: vec![panel],
                });
            }
        }
    }
    rows
}

/// Lower-case letters and digits, runs of anything else as one `-`.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_owned()
}

/// Draws every row of every dashboard into `dir`; returns the files written.
pub(super) fn render(result: &RunResult, dir: &Path, text: Text) -> anyhow::Result<Vec<PathBuf>> {
    planned(result)
        .iter()
        .map(|row| {
            let path = dir.join(&row.file_name);
            draw(row, &path, text).with_context(|| format!("drawing {}", path.display()))?;
            Ok(path)
        })
        .collect()
}

/// A panel's chart title: its title with the last value(s) of a stat, the series count of a
/// graph, or why it is empty.
pub(super) fn caption(panel: &PanelFigures) -> String {
    if panel.series.is_empty() {
        return format!("{} — no data ({})", panel.title, panel.expected);
    }
    if panel.kind == "stat" {
        let values: Vec<String> = panel
            .series
            .iter()
            .take(3)
            .filter_map(|s| {
                let last = s.points.last()?.1;
                let value = units::format(&panel.unit, last);
                Some(if panel.series.len() == 1 {
                    value
                } else {
                    format!("{} {value}", s.legend)
                })
            })
            .collect();
        return format!("{}: {}", panel.title, values.join(", "));
    }
    let n = panel.series.len();
    format!("{} ({n} series)", panel.title)
}

fn draw(row: &RowChart<'_>, path: &Path, text: Text) -> anyhow::Result<()> {
    let rows = row.panels.len().div_ceil(COLUMNS);
    let size = (CELL.0 * COLUMNS as u32, CELL.1 * rows as u32 + 40);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    let root = if text.drawn() {
        root.titled(&row.title, Text::style(22))?
    } else {
        root.margin(40, 0, 0, 0)
    };
    let captions: Vec<String> = row.panels.iter().map(|p| caption(p)).collect();
    let areas = root.split_evenly((rows, COLUMNS));
    for ((area, panel), caption) in areas.iter().zip(&row.panels).zip(&captions) {
        let lines = panel
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| line(s.legend.clone(), palette(i), s.points.clone()))
            .collect();
        let mut chart = Panel::new(caption, "seconds", "", lines);
        chart.y_unit = Some(panel.unit.as_str());
        line_panel(area, &chart, text)?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{Monitoring, PanelSeries};

    fn panel(id: u64, row: &str, kind: &str, series: usize) -> PanelFigures {
        PanelFigures {
            id,
            title: format!("Panel {id}"),
            row: row.into(),
            kind: kind.into(),
            unit: "s".into(),
            expected: "data".into(),
            series: (0..series)
                .map(|i| PanelSeries {
                    ref_id: "A".into(),
                    legend: format!("mm-{i}"),
                    points: vec![(0.0, 0.5), (1.0, 2.0)],
                })
                .collect(),
            ..Default::default()
        }
    }

    pub(crate) fn with_dashboard() -> RunResult {
        RunResult {
            monitoring: Some(Monitoring {
                dashboards: vec![DashboardFigures {
                    uid: "mm-overview".into(),
                    title: "Overview".into(),
                    panels: vec![
                        panel(1, "", "stat", 1),
                        panel(2, "Reconcile", "timeseries", 2),
                        panel(3, "Reconcile", "timeseries", 0),
                        panel(4, "Work queue (per replica)", "timeseries", 1),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn each_row_is_a_file_named_for_the_dashboard_and_row() {
        let result = with_dashboard();
        let names: Vec<String> = planned(&result)
            .iter()
            .map(|r| r.file_name.clone())
            .collect();
        assert_eq!(
            names,
            [
                "dashboard-mm-overview-1-top.png",
                "dashboard-mm-overview-2-reconcile.png",
                "dashboard-mm-overview-3-work-queue-per-replica.png"
            ]
        );
        assert!(planned(&RunResult::default()).is_empty());
    }

    #[test]
    fn captions_give_a_stats_value_a_graphs_series_or_why_it_is_empty() {
        assert_eq!(caption(&panel(1, "", "stat", 1)), "Panel 1: 2 s");
        assert_eq!(
            caption(&panel(2, "", "timeseries", 2)),
            "Panel 2 (2 series)"
        );
        assert_eq!(
            caption(&panel(3, "", "timeseries", 0)),
            "Panel 3 — no data (data)"
        );
    }

    #[test]
    fn the_summary_lists_each_panel_with_its_series_and_links_the_rows() {
        let mut result = with_dashboard();
        if let Some(m) = &mut result.monitoring {
            m.alerts = vec![crate::results::AlertFigures {
                name: "ModuleManagerUnownedShards".into(),
                health: "ok".into(),
                pending_seconds: 6.0,
                expected: "may fire".into(),
                ..Default::default()
            }];
        }
        let summary = super::super::markdown(&result);
        assert!(summary.contains("## Dashboards and alerts"), "{summary}");
        assert!(
            summary.contains("| Reconcile | 2 Panel 2 | s | 2 | data |  |"),
            "{summary}"
        );
        assert!(summary.contains("| Reconcile | 3 Panel 3 | s | 0 | data |  |"));
        assert!(summary.contains("](dashboard-mm-overview-2-reconcile.png)"));
        assert!(summary.contains("| ModuleManagerUnownedShards | ok | 6 | 0 | may fire |"));
        assert!(!super::super::markdown(&RunResult::default()).contains("Dashboards"));
    }

    #[test]
    fn the_rows_are_drawn_with_and_without_text() {
        let dir = tempfile::tempdir().unwrap();
        let result = with_dashboard();
        for text in [Text::Omitted, Text::Drawn] {
            if text.drawn() && super::super::font::font().is_none() {
                continue;
            }
            let files = render(&result, dir.path(), text).unwrap();
            assert_eq!(files.len(), 3);
            for file in files {
                let bytes = std::fs::read(file).unwrap();
                assert!(bytes.starts_with(b"\x89PNG"));
            }
        }
    }
}
