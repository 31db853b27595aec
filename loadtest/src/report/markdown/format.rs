//! Markdown tables and the formatting of their cells (seconds, rates, ratios, a missing figure).

use crate::results::{Quantiles, ReadyTiming};

/// Shown for a figure that was not measured.
pub(super) const MISSING: &str = "–";

#[derive(Clone, Copy)]
pub(super) enum Align {
    Left,
    Right,
}

/// A GitHub-flavoured Markdown table; `|` in cells is escaped.
pub(super) fn table(header: &[&str], align: &[Align], rows: Vec<Vec<String>>) -> String {
    let escape = |cell: &str| cell.replace('|', "\\|");
    let line = |cells: Vec<String>| format!("| {} |", cells.join(" | "));
    let mut lines = vec![line(header.iter().map(|h| escape(h)).collect())];
    lines.push(line(
        align
            .iter()
            .map(|a| match a {
                Align::Left => "---".to_owned(),
                Align::Right => "---:".to_owned(),
            })
            .collect(),
    ));
    lines.extend(
        rows.into_iter()
            .map(|row| line(row.iter().map(|c| escape(c)).collect())),
    );
    lines.join("\n")
}

/// [`table`] with the first column (what each row is) left-aligned, the figures right-aligned.
pub(super) fn named_rows_table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut align = vec![Align::Right; header.len()];
    align[0] = Align::Left;
    table(header, &align, rows)
}

pub(super) fn quantile_table(first_column: &str, kinds: &[(&str, &Quantiles)]) -> String {
    let rows = kinds
        .iter()
        .map(|(name, q)| {
            vec![
                name.to_string(),
                q.count.to_string(),
                seconds(q.p50),
                seconds(q.p90),
                seconds(q.p99),
                seconds(q.max),
            ]
        })
        .collect();
    let header = [
        first_column,
        "count",
        "p50 (s)",
        "p90 (s)",
        "p99 (s)",
        "max (s)",
    ];
    named_rows_table(&header, rows)
}

pub(super) fn is_empty(q: &Quantiles) -> bool {
    q.count == 0 && q.p50.is_none() && q.p90.is_none() && q.p99.is_none() && q.max.is_none()
}

/// Entries by value, highest first (ties by name).
pub(super) fn descending<'a>(
    entries: impl Iterator<Item = (&'a String, &'a f64)>,
) -> Vec<(&'a str, f64)> {
    let mut sorted: Vec<(&str, f64)> = entries.map(|(k, v)| (k.as_str(), *v)).collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    sorted
}

/// `a / b`, `None` when `b` is zero or either is not finite.
pub(super) fn divide(a: f64, b: f64) -> Option<f64> {
    let r = a / b;
    (b != 0.0 && r.is_finite()).then_some(r)
}

/// A duration in seconds, to the millisecond; [`MISSING`] when not measured.
pub(super) fn seconds(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.3}"),
        _ => MISSING.to_owned(),
    }
}

/// The columns of a burst's timing, filled by [`ready_cells`].
pub(super) const READY_COLUMNS: [&str; 6] = [
    "first Ready (s)",
    "half Ready (s)",
    "all Ready (s)",
    "Manifests/s",
    "Ready p50 (s)",
    "Ready p99 (s)",
];

/// A burst's cells under [`READY_COLUMNS`]: seconds from the first create until the first, half
/// and all Manifests were Ready, the rate, and quantiles of create → Ready.
pub(super) fn ready_cells(r: &ReadyTiming) -> [String; 6] {
    let tenths = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or_else(|| MISSING.to_owned(), |v| format!("{v:.1}"))
    };
    [
        tenths(r.first_ready_seconds),
        tenths(r.half_ready_seconds),
        format!("{:.1}", r.all_ready_seconds),
        rate(r.per_second),
        seconds(r.create_to_ready_seconds.p50),
        seconds(r.create_to_ready_seconds.p99),
    ]
}

/// A rate per second.
pub(super) fn rate(v: f64) -> String {
    format!("{v:.1}")
}

/// A ratio, as `2.50×`.
pub(super) fn ratio(v: f64) -> String {
    format!("{v:.2}×")
}

/// A plain figure: integers without decimals, others to two.
pub(super) fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

pub(super) fn text_or_missing(s: &str) -> String {
    if s.is_empty() {
        MISSING.to_owned()
    } else {
        s.to_owned()
    }
}

pub(super) fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}
