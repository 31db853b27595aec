//! The faults of `chaos`: per fault how long it lasted, how long the fleet took to recover,
//! and its API request rate before and after; per fault type the slowest recovery and the
//! highest rate ratio.

use std::collections::BTreeMap;

use crate::results::FaultRecord;

use super::format::{MISSING, named_rows_table, rate, ratio};

fn tenths(v: Option<f64>) -> String {
    v.map_or_else(|| MISSING.to_owned(), |v| format!("{v:.1}"))
}

/// The requests per second after a fault ÷ before it.
fn after_over_before(f: &FaultRecord) -> Option<f64> {
    match (f.requests_per_second_after, f.steady_requests_per_second) {
        (Some(after), Some(before)) if before > 0.0 => Some(after / before),
        _ => None,
    }
}

/// The table of every fault, then the summary per fault type.
pub(super) fn faults(faults: &[FaultRecord]) -> String {
    let rows = faults
        .iter()
        .map(|f| {
            vec![
                f.label.clone(),
                format!("{:.0}", f.at_seconds),
                format!("{:.1}", f.outage_seconds),
                f.recovered_seconds
                    .map_or_else(|| "not recovered".to_owned(), |s| format!("{s:.1}")),
                f.steady_requests_per_second
                    .map_or(MISSING.to_owned(), rate),
                f.requests_per_second_after.map_or(MISSING.to_owned(), rate),
                after_over_before(f).map_or(MISSING.to_owned(), ratio),
            ]
        })
        .collect();
    let header = [
        "fault",
        "at (s)",
        "outage (s)",
        "recovered after (s)",
        "fleet req/s before",
        "req/s, first 30 s after",
        "after ÷ before",
    ];
    format!(
        "Faults (recovered: every operation sent before the outage ended had its effect; fleet requests: the replicas' `module_manager_api_requests_total`):\n\n{}\n\n{}",
        named_rows_table(&header, rows),
        by_type(faults)
    )
}

/// Per fault type: count, slowest recovery (or how many never recovered), highest rate ratio.
fn by_type(faults: &[FaultRecord]) -> String {
    let mut types: BTreeMap<&str, Vec<&FaultRecord>> = BTreeMap::new();
    for f in faults {
        types.entry(f.fault.as_str()).or_default().push(f);
    }
    let rows = types
        .into_iter()
        .map(|(fault, of)| {
            let recovered: Vec<f64> = of.iter().filter_map(|f| f.recovered_seconds).collect();
            let not = of.len() - recovered.len();
            let max = recovered.iter().copied().reduce(f64::max);
            let ratio_max = of
                .iter()
                .filter_map(|f| after_over_before(f))
                .reduce(f64::max);
            vec![
                fault.to_owned(),
                of.len().to_string(),
                tenths(max),
                not.to_string(),
                ratio_max.map_or(MISSING.to_owned(), ratio),
            ]
        })
        .collect();
    let header = [
        "fault type",
        "faults",
        "slowest recovery (s)",
        "not recovered",
        "highest after ÷ before",
    ];
    named_rows_table(&header, rows)
}
