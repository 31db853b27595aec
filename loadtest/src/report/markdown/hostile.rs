//! The `hostile` section of the summary: every arm, then per hostile chart against issue 31's
//! targets (p99 within 2× of the arm without a hostile chart; at most 10 renderer restarts in
//! 10 minutes).

use super::format::{Align, MISSING, ratio, seconds, table};
use crate::results::{Hostile, HostileArm};

/// Issue 31: the innocents' create→Ready p99 within this factor of the run without a hostile
/// chart.
const RATIO_TARGET: f64 = 2.0;
/// Issue 31: at most this many renderer restarts …
const STARTS_TARGET: u64 = 10;
/// … in this many seconds, per hostile Manifest.
const STARTS_WINDOW_SECONDS: f64 = 600.0;

pub(super) fn section(h: &Hostile) -> String {
    let intro = format!(
        "## Hostile charts beside innocent Manifests\n\n{} repeats on {} replicas; in every arm \
         {} innocent Manifests (`{}`) created at once, beside one hostile Manifest sent just \
         before them (none in each repeat's first arm), in a fresh namespace, deleted at \
         the arm's end. Each hostile Manifest was kept at least {} s. Renderer starts: \
         `module_manager_render_child_starts_total` over the arm, all replicas (every start in \
         an arm is a restart). Renders re-sent: `module_manager_render_child_resends_total` (more \
         than 1 beside a chart that kills the child: innocent renders were in flight then).",
        h.repeats, h.replicas, h.innocents, h.chart, h.hostile_seconds
    );
    [intro, arms(&h.arms), targets(&h.arms)].join("\n\n")
}

fn count(v: Option<u64>) -> String {
    v.map_or_else(|| MISSING.to_owned(), |n| n.to_string())
}

fn arms(arms: &[HostileArm]) -> String {
    let rows = arms
        .iter()
        .map(|a| {
            let status = a.hostile_status.as_ref();
            let named = status.map_or(MISSING.to_owned(), |s| {
                if s.names_failure { "yes" } else { "**no**" }.to_owned()
            });
            let conditions = status.map_or(MISSING.to_owned(), |s| {
                format!(
                    "{} · Ready {} {} · Stalled {} · {}",
                    s.state.as_deref().unwrap_or(MISSING),
                    s.ready.as_deref().unwrap_or(MISSING),
                    s.ready_reason.as_deref().unwrap_or(""),
                    s.stalled.as_deref().unwrap_or(MISSING),
                    s.reconciling_reason.as_deref().unwrap_or(MISSING),
                )
            });
            let message = status.map_or(MISSING.to_owned(), |s| format!("`{}`", s.message));
            vec![
                a.repeat.to_string(),
                a.hostile.clone().unwrap_or_else(|| "none".to_owned()),
                format!(
                    "{}/{}{}",
                    a.innocents_ready,
                    a.innocents,
                    if a.innocents_ready == a.innocents {
                        ""
                    } else {
                        " **not all**"
                    }
                ),
                seconds(a.create_to_ready_seconds.p50),
                seconds(a.create_to_ready_seconds.p99),
                a.p99_over_no_hostile.map_or(MISSING.to_owned(), ratio),
                count(a.renderer_starts),
                count(a.renders_resent),
                format!("{:.0}", a.seconds),
                conditions,
                message,
                seconds(status.and_then(|s| s.named_after_seconds)),
                named,
            ]
        })
        .collect();
    let header = [
        "repeat",
        "hostile chart",
        "innocents Ready",
        "p50 (s)",
        "p99 (s)",
        "p99 ÷ no hostile",
        "renderer starts",
        "renders re-sent",
        "arm (s)",
        "hostile state · Ready · Stalled · Reconciling",
        "hostile Ready message (start)",
        "failure named after (s)",
        "names its failure",
    ];
    let mut align = vec![Align::Right; header.len()];
    for i in [1, 9, 10] {
        align[i] = Align::Left;
    }
    table(&header, &align, rows)
}

/// Per hostile chart, over the repeats: the highest p99 ratio against 2×, the most renderer
/// starts against 10 in 10 minutes (judged only on arms of at least 10 minutes).
fn targets(arms: &[HostileArm]) -> String {
    let mut charts: Vec<&str> = Vec::new();
    for chart in arms.iter().filter_map(|a| a.hostile.as_deref()) {
        if !charts.contains(&chart) {
            charts.push(chart);
        }
    }
    let rows = charts
        .into_iter()
        .map(|chart| {
            let of: Vec<&HostileArm> = arms
                .iter()
                .filter(|a| a.hostile.as_deref() == Some(chart))
                .collect();
            let ratios: Vec<f64> = of.iter().filter_map(|a| a.p99_over_no_hostile).collect();
            let worst = ratios.iter().copied().reduce(f64::max);
            let within = match worst {
                Some(w) if ratios.len() == of.len() => yes_no(w <= RATIO_TARGET),
                _ => MISSING.to_owned(),
            };
            let starts = of.iter().filter_map(|a| a.renderer_starts).max();
            let shortest = of.iter().map(|a| a.seconds).reduce(f64::min).unwrap_or(0.0);
            let restarts = match starts {
                Some(n) if shortest >= STARTS_WINDOW_SECONDS => yes_no(n <= STARTS_TARGET),
                _ => format!("– (arms of {shortest:.0} s: needs `--hostile-seconds 600`)"),
            };
            vec![
                chart.to_owned(),
                ratios
                    .iter()
                    .map(|r| ratio(*r))
                    .collect::<Vec<_>>()
                    .join(", "),
                worst.map_or(MISSING.to_owned(), ratio),
                within,
                of.iter()
                    .map(|a| count(a.renderer_starts))
                    .collect::<Vec<_>>()
                    .join(", "),
                restarts,
            ]
        })
        .collect();
    let header = [
        "hostile chart",
        "p99 ÷ no hostile, per repeat",
        "highest",
        "within 2× (issue 31)",
        "renderer starts, per repeat",
        "≤ 10 starts in 10 min (issue 31)",
    ];
    let mut align = vec![Align::Right; header.len()];
    align[0] = Align::Left;
    align[5] = Align::Left;
    format!(
        "### Against issue 31's targets\n\n{}",
        table(&header, &align, rows)
    )
}

fn yes_no(ok: bool) -> String {
    if ok { "yes" } else { "**no**" }.to_owned()
}
