//! The `mttp` section of the summary: bursts, baselines, ratios, the idle fleet, the cold
//! restart.

use std::collections::BTreeMap;

use super::format::{
    Align, MISSING, READY_COLUMNS, descending, named_rows_table, rate, ratio, ready_cells, table,
};
use crate::results::{
    ColdRestart, GateOutcome, IdleFigures, Mttp, MttpBaseline, MttpBurst, MttpRatio,
    PATH_BARE_APPLY, PATH_HELM, PATH_MANIFEST_WRITES, PATH_MINIMUM_WRITES,
};

/// Resources listed per burst in the fleet's requests; the rest are summed up.
const TOP: usize = 6;

pub(super) fn section(m: &Mttp) -> String {
    let mut parts = vec![
        "## MTTP: Manifests created at once, until all are Ready\n\nCPU: the replicas' process \
         trees (module-manager, the renderer child, helm runs). API requests: every client \
         (`apiserver_request_total`); the fleet's own from the API server's audit log (local \
         control planes). Peak RSS: the highest replica, renderer included. The Latency, Replicas \
         and API server sections above cover the whole run of the last fleet size."
            .to_owned(),
        bursts(&m.bursts),
    ];
    parts.extend(fleet_requests(&m.bursts));
    if !m.baselines.is_empty() {
        parts.push(baselines(&m.baselines));
    }
    if !m.ratios.is_empty() {
        parts.push(ratios(&m.ratios));
    }
    parts.extend(m.idle.as_ref().map(idle));
    parts.extend(m.cold_restart.as_ref().map(cold_restart));
    parts.extend(m.gate.as_ref().map(gate));
    parts.join("\n\n")
}

fn optional(v: Option<f64>, digits: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| MISSING.to_owned(), |v| format!("{v:.digits$}"))
}

fn peak(rss: &BTreeMap<String, f64>) -> Option<f64> {
    rss.values().copied().reduce(f64::max)
}

fn bursts(bursts: &[MttpBurst]) -> String {
    let rows = bursts
        .iter()
        .map(|b| {
            let cpu = b
                .cpu_per_replica
                .map_or(String::new(), |c| format!(" × {c} core"));
            let ready = ready_cells(&b.ready);
            let fleet = [
                format!("{}{cpu}", b.replicas),
                b.manifests.to_string(),
                b.manifests_held.to_string(),
            ];
            let cost = [
                format!("{:.3}", b.cpu_seconds_per_manifest),
                optional(b.control_plane_cpu_seconds_per_manifest, 3),
                format!("{:.1}", b.api_requests_per_manifest),
                optional(b.operator_requests_per_manifest, 1),
                format!("{:.2}", b.passes_per_manifest),
                optional(peak(&b.peak_rss_mib), 1),
            ];
            [fleet.as_slice(), &ready, &cost].concat()
        })
        .collect();
    let cost = [
        "CPU-s / Manifest",
        "control plane CPU-s / Manifest",
        "API requests / Manifest",
        "fleet's requests / Manifest",
        "passes / Manifest",
        "peak RSS per replica (MiB)",
    ];
    let header = [
        &["replicas", "Manifests", "held"][..],
        &READY_COLUMNS,
        &cost,
    ]
    .concat();
    named_rows_table(&header, rows)
}

/// One line per burst: the fleet's requests per Manifest by verb and resource.
fn fleet_requests(bursts: &[MttpBurst]) -> Option<String> {
    let lines: Vec<String> = bursts
        .iter()
        .filter(|b| b.operator_requests_per_manifest.is_some())
        .map(|b| {
            let list = |map: &BTreeMap<String, f64>, top: usize| {
                let sorted = descending(map.iter());
                let mut items: Vec<String> = sorted
                    .iter()
                    .take(top)
                    .map(|(k, v)| format!("{k} {v:.2}"))
                    .collect();
                let rest: f64 = sorted.iter().skip(top).map(|(_, v)| v).sum();
                if rest > 0.0 {
                    items.push(format!("others {rest:.2}"));
                }
                items.join(", ")
            };
            format!(
                "- {} replicas, {} Manifests: by verb {}; by resource {}",
                b.replicas,
                b.manifests,
                list(&b.operator_by_verb_per_manifest, usize::MAX),
                list(&b.operator_by_resource_per_manifest, TOP)
            )
        })
        .collect();
    (!lines.is_empty()).then(|| {
        format!(
            "The fleet's requests per Manifest (audit log):\n\n{}",
            lines.join("\n")
        )
    })
}

fn baselines(baselines: &[MttpBaseline]) -> String {
    let mut rows = Vec::new();
    for b in baselines {
        let paths = [
            (PATH_BARE_APPLY, PATH_BARE_APPLY, b.bare_apply.as_ref()),
            (
                PATH_MANIFEST_WRITES,
                PATH_MANIFEST_WRITES,
                b.bare_with_manifest_writes.as_ref(),
            ),
            (
                PATH_MINIMUM_WRITES,
                PATH_MINIMUM_WRITES,
                b.bare_with_minimum_writes.as_ref(),
            ),
            (PATH_HELM, "`helm upgrade --install`", b.helm.as_ref()),
        ];
        for (name, shown, burst) in paths {
            let Some(burst) = burst else { continue };
            let cpu = b.control_plane_cpu_seconds_per_manifest.get(name);
            rows.push(vec![
                b.manifests.to_string(),
                shown.to_owned(),
                format!("{:.1}", burst.seconds),
                rate(burst.per_second),
                burst.parallelism.to_string(),
                cpu.map_or_else(|| MISSING.to_owned(), |cpu| format!("{cpu:.3}")),
            ]);
        }
        if let Some(error) = &b.error {
            rows.push(vec![
                b.manifests.to_string(),
                format!("error: {error}"),
                MISSING.to_owned(),
                MISSING.to_owned(),
                MISSING.to_owned(),
                MISSING.to_owned(),
            ]);
        }
    }
    format!(
        "### Baselines (same run, no fleet)\n\n\
         With the Manifest's writes: a bare client sends, per release, the requests the fleet \
         sends per install (create, claim, inventory, the applies, two statuses, one read, one \
         Event) and nothing else — no render, queue or watch, no wait for the rollout; with the \
         minimum writes, only the create, the claim, the inventory, the applies and the `Ready` \
         status. Control plane CPU: from quiet to quiet again after the path.\n\n{}",
        table(
            &[
                "Manifests",
                "path",
                "took (s)",
                "Manifests/s",
                "at once",
                "control plane CPU-s / Manifest"
            ],
            &[
                Align::Right,
                Align::Left,
                Align::Right,
                Align::Right,
                Align::Right,
                Align::Right
            ],
            rows
        )
    )
}

fn ratios(ratios: &[MttpRatio]) -> String {
    let show =
        |v: Option<f64>| v.map_or_else(|| MISSING.to_owned(), |v| format!("**{}**", ratio(v)));
    let rows = ratios
        .iter()
        .map(|r| {
            vec![
                r.manifests.to_string(),
                r.replicas.to_string(),
                show(r.fleet_over_bare_apply),
                show(r.fleet_over_manifest_writes),
                show(r.fleet_over_minimum_writes),
                show(r.fleet_over_single_replica),
                show(r.fleet_over_helm),
            ]
        })
        .collect();
    format!(
        "### Ratios (Manifests/s; above 1: the fleet is faster)\n\n{}",
        table(
            &[
                "Manifests",
                "replicas",
                "fleet ÷ bare apply",
                "fleet ÷ bare apply with the Manifest's writes",
                "fleet ÷ bare apply with the minimum writes",
                "fleet ÷ one replica",
                "fleet ÷ helm"
            ],
            &[Align::Right; 7],
            rows
        )
    )
}

fn clients(map: &BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return MISSING.to_owned();
    }
    map.iter()
        .map(|(c, n)| format!("{c} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn idle(i: &IdleFigures) -> String {
    let rows = vec![
        vec![
            "API requests/s, every client".to_owned(),
            format!("{:.2}", i.api_requests_per_second),
        ],
        vec![
            "the fleet's requests/s (audit log)".to_owned(),
            optional(i.operator_requests_per_second, 2),
        ],
        vec![
            "requests per client over the window".to_owned(),
            clients(&i.requests_by_client),
        ],
        vec![
            "reconcile passes/s".to_owned(),
            format!("{:.2}", i.passes_per_second),
        ],
        vec![
            "fleet CPU (cores)".to_owned(),
            format!("{:.3}", i.fleet_cores),
        ],
        vec![
            "peak RSS per replica (MiB)".to_owned(),
            optional(peak(&i.peak_rss_mib), 1),
        ],
    ];
    format!(
        "### Idle: {} Manifests on {} replicas for {:.0} s (drift interval {})\n\n{}",
        i.manifests,
        i.replicas,
        i.seconds,
        i.drift_interval,
        table(&["", ""], &[Align::Left, Align::Right], rows)
    )
}

fn gate(g: &GateOutcome) -> String {
    let verdict = if g.updated {
        format!("{} counters written as the new baseline.", g.counters)
    } else if g.findings.is_empty() {
        format!("{} counters compared: all within bounds.", g.counters)
    } else {
        let lines: Vec<String> = g.findings.iter().map(|f| format!("- {f}")).collect();
        format!(
            "{} counters compared; beyond bounds:\n\n{}",
            g.counters,
            lines.join("\n")
        )
    };
    format!(
        "### Counter gate (`{}`)\n\nPer-Manifest counts and peak RSS against the stored baseline, \
         ±{:.0} % (below one per Manifest also ±{} per Manifest); times are not gated. {verdict}",
        g.baseline,
        crate::gate::TOLERANCE * 100.0,
        crate::gate::FLOOR_PER_MANIFEST,
    )
}

fn cold_restart(c: &ColdRestart) -> String {
    format!(
        "### Cold restart of {} replicas holding {} Manifests\n\nEvery replica ready again after \
         {:.1} s; every Manifest reconciled again (a completed pass in the new processes' logs) \
         after {} s; {} of {} checked, {} passes.",
        c.replicas,
        c.manifests,
        c.ready_seconds,
        optional(c.all_checked_seconds, 1),
        c.checked,
        c.manifests,
        c.passes
    )
}
