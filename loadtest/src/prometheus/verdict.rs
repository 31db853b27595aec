//! The checkers of what Prometheus saw (pure; any finding fails the run):
//!
//! - `empty-panel`: a panel that returned no series though its dashboard does not declare it
//!   may (`dashboard.rs`: error panels may always be empty, fault panels only in runs without
//!   faults);
//! - `dashboard`: what the evaluation found wrong with a dashboard or panel (a variable without
//!   values, a query Prometheus refused, a foreign datasource, an unknown unit or variable, a
//!   legend naming a label the series lack);
//! - `alert`: a rule Prometheus could not evaluate, an alert that fired though the run expects
//!   it silent.

use super::alerts::Expect;
use super::dashboard::Expectation;
use crate::checks::{listed, violation};
use crate::results::{Monitoring, PanelFigures, Violation};

/// `empty-panel` and `dashboard` findings.
pub fn dashboards(monitoring: &Monitoring) -> Vec<Violation> {
    let mut found = Vec::new();
    for dashboard in &monitoring.dashboards {
        let name = &dashboard.file;
        let empty: Vec<&PanelFigures> = dashboard
            .panels
            .iter()
            .filter(|p| p.series.is_empty() && must_have_data(p, monitoring.faults))
            .collect();
        if !empty.is_empty() {
            found.push(violation(
                "empty-panel",
                format!(
                    "{name}: {} panels returned no series over the run: {}",
                    empty.len(),
                    listed(&empty, |p| format!(
                        "{} {:?} ({})",
                        p.id, p.title, p.expected
                    ))
                ),
            ));
        }
        let problems: Vec<String> = dashboard
            .problems
            .iter()
            .cloned()
            .chain(dashboard.panels.iter().flat_map(|p| {
                p.problems
                    .iter()
                    .map(move |problem| format!("panel {} {:?}: {problem}", p.id, p.title))
            }))
            .collect();
        if !problems.is_empty() {
            found.push(violation(
                "dashboard",
                format!(
                    "{name}: {} problems: {}",
                    problems.len(),
                    listed(&problems, String::clone)
                ),
            ));
        }
    }
    found
}

fn must_have_data(panel: &PanelFigures, faults: bool) -> bool {
    if panel.expected == Expectation::EmptyInACleanRun.name() {
        false
    } else if panel.expected == Expectation::EmptyWithoutFaults.name() {
        faults
    } else {
        true
    }
}

/// `alert` findings.
pub fn alerts(monitoring: &Monitoring) -> Vec<Violation> {
    let mut found = Vec::new();
    let unhealthy: Vec<String> = monitoring
        .alerts
        .iter()
        .filter(|a| a.health != "ok")
        .map(|a| format!("{} ({}: {})", a.name, a.health, a.last_error))
        .collect();
    if !unhealthy.is_empty() {
        found.push(violation(
            "alert",
            format!(
                "{} rules Prometheus did not evaluate cleanly: {}",
                unhealthy.len(),
                listed(&unhealthy, String::clone)
            ),
        ));
    }
    let fired: Vec<String> = monitoring
        .alerts
        .iter()
        .filter(|a| a.expected == Expect::Silent.name() && a.firing_seconds > 0.0)
        .map(|a| format!("{} for {:.0} s", a.name, a.firing_seconds))
        .collect();
    if !fired.is_empty() {
        let run = if monitoring.faults {
            "a run whose faults do not explain them"
        } else {
            "a run without faults"
        };
        found.push(violation(
            "alert",
            format!("fired in {run}: {}", listed(&fired, String::clone)),
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{AlertFigures, DashboardFigures, PanelSeries};

    fn panel(id: u64, expected: Expectation, series: usize) -> PanelFigures {
        PanelFigures {
            id,
            title: format!("p{id}"),
            expected: expected.name().to_owned(),
            series: (0..series)
                .map(|_| PanelSeries {
                    ref_id: "A".into(),
                    legend: "x".into(),
                    points: vec![(0.0, 1.0)],
                })
                .collect(),
            ..Default::default()
        }
    }

    fn monitoring(panels: Vec<PanelFigures>, faults: bool) -> Monitoring {
        Monitoring {
            faults,
            dashboards: vec![DashboardFigures {
                file: "d.json".into(),
                panels,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn an_empty_panel_fails_unless_declared() {
        let panels = vec![
            panel(1, Expectation::Data, 2),
            panel(2, Expectation::EmptyInACleanRun, 0),
            panel(3, Expectation::EmptyWithoutFaults, 0),
        ];
        assert!(dashboards(&monitoring(panels.clone(), false)).is_empty());
        // With faults, the fault panel must have data; the error panel still need not.
        let v = dashboards(&monitoring(panels.clone(), true));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].checker, "empty-panel");
        assert!(v[0].detail.contains("3 \"p3\""), "{}", v[0].detail);
        // An undeclared panel without data fails any run.
        let mut broken = panels;
        broken[0].series.clear();
        let v = dashboards(&monitoring(broken, false));
        assert!(v[0].detail.contains("1 \"p1\" (data)"), "{}", v[0].detail);
    }

    #[test]
    fn problems_are_findings_naming_the_panel() {
        let mut p = panel(4, Expectation::Data, 1);
        p.problems = vec!["unit \"sec\" is not one the report knows".into()];
        let v = dashboards(&monitoring(vec![p], false));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].checker, "dashboard");
        assert!(
            v[0].detail.contains("panel 4 \"p4\": unit"),
            "{}",
            v[0].detail
        );
    }

    fn alert(name: &str, expected: Expect, pending: f64, firing: f64) -> AlertFigures {
        AlertFigures {
            name: name.into(),
            health: "ok".into(),
            pending_seconds: pending,
            firing_seconds: firing,
            expected: expected.name().into(),
            ..Default::default()
        }
    }

    #[test]
    fn alerts_fail_when_unhealthy_or_firing_unexpected() {
        let mut m = monitoring(Vec::new(), true);
        m.alerts = vec![
            alert("Quiet", Expect::Silent, 30.0, 0.0),
            alert("Allowed", Expect::MayFire, 0.0, 10.0),
        ];
        assert!(alerts(&m).is_empty(), "{:?}", alerts(&m));
        m.alerts[0].firing_seconds = 5.0;
        m.alerts[1].health = "err".into();
        let v = alerts(&m);
        let details: Vec<&str> = v.iter().map(|v| v.detail.as_str()).collect();
        assert_eq!(v.len(), 2, "{details:?}");
        assert!(details[0].contains("Allowed (err"));
        assert!(details[1].contains("Quiet for 5 s"));
    }
}
