//! The Markdown summary (`summary.md`): every section a pure function of the [`RunResult`],
//! left out when the run has no data for it.

use crate::results::{
    ApiServerFigures, Baselines, Burst, Capacity, Environment, FleetFigures, Latencies, MoveStep,
    ReplicaFigures, RunResult, Throughput, Violation,
};

use super::charts;

mod faults;
mod format;
mod hostile;
mod monitoring;
mod mttp;
mod remote;

use format::{
    Align, MISSING, descending, divide, is_empty, named_rows_table, number, plural, quantile_table,
    rate, ratio, seconds, table, text_or_missing,
};

/// Resources listed in the API server section; the rest are summed up in one line.
const TOP_RESOURCES: usize = 8;

/// The summary a platform engineer reads: verdict, environment, violations, figures, charts.
pub fn markdown(result: &RunResult) -> String {
    let sections = [
        Some(title(result)),
        Some(environment(&result.environment, &result.parameters)),
        Some(violations(&result.violations)),
        // `mttp`, `remote` and `hostile` send no steady load: their bursts are in their own
        // sections.
        ((result.mttp.is_none() && result.remote.is_none() && result.hostile.is_none())
            || result.throughput.operations > 0)
            .then(|| throughput(&result.throughput)),
        latency(&result.latency),
        replicas(&result.replicas),
        apiserver(&result.apiserver),
        fleet(&result.fleet, result.environment.lease_duration_seconds),
        capacity(&result.capacity),
        result.mttp.as_ref().map(mttp::section),
        result.remote.as_ref().map(remote::section),
        result.hostile.as_ref().map(hostile::section),
        result.baselines.as_ref().map(baselines),
        result
            .baselines_error
            .as_ref()
            .map(|e| format!("## Baselines\n\nNot measured: {e}")),
        monitoring::section(result),
        chart_links(result),
    ];
    let mut out = sections
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("\n\n");
    out.push('\n');
    out
}

fn title(result: &RunResult) -> String {
    let verdict = if result.passed {
        "PASSED ✅"
    } else {
        "FAILED ❌"
    };
    let mut lines = vec![format!("# Load test `{}`: {verdict}", result.scenario)];
    let duration = format!("{:.1} s", result.duration_seconds);
    lines.push(String::new());
    lines.push(match result.started_at.as_str() {
        "" => format!("Ran {duration}."),
        at => format!("Started {at}, ran {duration}."),
    });
    lines.join("\n")
}

fn environment(env: &Environment, parameters: &serde_json::Value) -> String {
    let cpu_limit = env.cpu_limit_per_replica.map_or_else(
        || "unlimited".to_owned(),
        |c| format!("{} cores", number(c)),
    );
    let rows = [
        ("Target", text_or_missing(&env.target)),
        ("Replicas", env.replicas.to_string()),
        ("Shards", env.shards.to_string()),
        (
            "Lease duration",
            format!("{} s", number(env.lease_duration_seconds)),
        ),
        ("CPU limit per replica", cpu_limit),
        (
            "Concurrency",
            format!("{} reconcile workers per replica", env.concurrency),
        ),
        ("Machine cores", env.cores.to_string()),
        ("Chart", text_or_missing(&env.chart)),
        ("Kubernetes", text_or_missing(&env.kubernetes_version)),
        (
            "module-manager",
            text_or_missing(&env.module_manager_version),
        ),
    ];
    let rows = rows
        .into_iter()
        .map(|(k, v)| vec![k.to_owned(), v])
        .collect();
    let mut out = format!(
        "## Environment\n\n{}",
        table(&["", ""], &[Align::Left, Align::Left], rows)
    );
    let has_parameters = match parameters {
        serde_json::Value::Null => false,
        serde_json::Value::Object(map) => !map.is_empty(),
        _ => true,
    };
    if has_parameters {
        out.push_str(&format!("\n\nParameters: `{parameters}`"));
    }
    out
}

fn violations(violations: &[Violation]) -> String {
    if violations.is_empty() {
        return "## Violations\n\nnone".to_owned();
    }
    let items: Vec<String> = violations
        .iter()
        .map(|v| format!("- **{}**: {}", v.checker, v.detail))
        .collect();
    format!(
        "## Violations ({})\n\n{}",
        violations.len(),
        items.join("\n")
    )
}

fn throughput(t: &Throughput) -> String {
    let rows = vec![
        vec![
            "Operations sent".to_owned(),
            t.operations.to_string(),
            rate(t.operations_per_second),
        ],
        vec![
            "Converged (Ready at the written generation)".to_owned(),
            t.converged.to_string(),
            rate(t.converged_per_second),
        ],
    ];
    let mut out = format!(
        "## Throughput\n\n{}\n\nManifests at the end: {}. Reconcile passes (all replicas): {}",
        table(
            &["", "count", "per s"],
            &[Align::Left, Align::Right, Align::Right],
            rows
        ),
        t.manifests_at_end,
        t.reconcile_passes,
    );
    match divide(t.reconcile_passes as f64, t.converged as f64) {
        Some(per) => out.push_str(&format!(", {per:.2} per converged Manifest.")),
        None => out.push('.'),
    }
    if t.failed_requests > 0 || t.superseded > 0 {
        out.push_str(&format!(
            " Failed requests: {}; operations superseded by a newer one before their effect was seen: {}.",
            t.failed_requests, t.superseded
        ));
    }
    out
}

fn latency(l: &Latencies) -> Option<String> {
    let kinds = [
        ("create → Ready", &l.create_to_ready_seconds),
        ("update → Ready", &l.update_to_ready_seconds),
        ("delete → gone", &l.delete_to_gone_seconds),
        ("queue wait", &l.queue_wait_seconds),
    ];
    if kinds.iter().all(|(_, q)| is_empty(q)) {
        return None;
    }
    Some(format!(
        "## Latency\n\n{}\n\nQueue wait is estimated from the histogram's buckets (max: upper \
         bound of the highest non-empty bucket).",
        quantile_table("", &kinds)
    ))
}

fn replicas(replicas: &[ReplicaFigures]) -> Option<String> {
    if replicas.is_empty() {
        return None;
    }
    let rows = replicas
        .iter()
        .map(|r| {
            vec![
                format!("`{}`", r.name),
                r.passes.to_string(),
                format!("{:.1} %", r.share * 100.0),
                r.shards_owned.to_string(),
                format!("{:.1}", r.cpu_seconds),
                format!("{:.2}", r.cpu_cores_mean),
                format!("{:.1}", r.rss_mib_mean),
                format!("{:.1}", r.rss_mib_max),
            ]
        })
        .collect();
    let header = [
        "replica",
        "passes",
        "share",
        "shards",
        "CPU s",
        "mean cores",
        "RSS mean MiB",
        "RSS max MiB",
    ];
    Some(format!(
        "## Replicas\n\n{}",
        named_rows_table(&header, rows)
    ))
}

fn apiserver(a: &ApiServerFigures) -> Option<String> {
    if a.requests_per_second <= 0.0 && a.by_verb.is_empty() && a.by_resource.is_empty() {
        return None;
    }
    let mut out = format!(
        "## API server\n\n{} requests/s in all (`apiserver_request_total` over the load phase).",
        rate(a.requests_per_second)
    );
    if !a.by_verb.is_empty() {
        let rows = descending(a.by_verb.iter())
            .into_iter()
            .map(|(verb, r)| vec![verb.to_owned(), rate(r)])
            .collect();
        out.push_str("\n\n");
        out.push_str(&table(
            &["verb", "req/s"],
            &[Align::Left, Align::Right],
            rows,
        ));
    }
    if !a.by_resource.is_empty() {
        let sorted = descending(a.by_resource.iter());
        let rest = sorted.len().saturating_sub(TOP_RESOURCES);
        let rows = sorted
            .iter()
            .take(TOP_RESOURCES)
            .map(|(resource, r)| vec![resource.to_string(), rate(*r)])
            .collect();
        out.push_str("\n\n");
        out.push_str(&table(
            &["resource (top 8)", "req/s"],
            &[Align::Left, Align::Right],
            rows,
        ));
        if rest > 0 {
            let rest_rate: f64 = sorted.iter().skip(TOP_RESOURCES).map(|(_, r)| r).sum();
            out.push_str(&format!(
                "\n\n{rest} more resources: {} req/s together.",
                rate(rest_rate)
            ));
        }
    }
    Some(out)
}

fn fleet(f: &FleetFigures, lease_duration_seconds: f64) -> Option<String> {
    let quantiles = [
        ("handover gap", &f.handover_gap_seconds),
        ("takeover after a fault", &f.takeover_seconds),
    ];
    let has_quantiles = quantiles.iter().any(|(_, q)| !is_empty(q));
    if !has_quantiles && f.max_unowned_seconds <= 0.0 && f.moves.is_empty() && f.faults.is_empty() {
        return None;
    }
    let mut parts = vec!["## Fleet".to_owned()];
    if has_quantiles {
        parts.push(quantile_table("", &quantiles));
    }
    if !f.faults.is_empty() {
        parts.push(faults::faults(&f.faults));
    }
    parts.push(format!(
        "Longest a shard was unowned: {:.1} s (the checker allows {:.1} s, twice the lease).",
        f.max_unowned_seconds,
        2.0 * lease_duration_seconds
    ));
    if f.takeovers_unfinished > 0 {
        parts.push(format!(
            "{} faults ended before the others had taken the victim's shards over (not in the takeover quantiles).",
            f.takeovers_unfinished
        ));
    }
    if !f.moves.is_empty() {
        parts.push(moves(&f.moves));
    }
    Some(parts.join("\n\n"))
}

fn moves(moves: &[MoveStep]) -> String {
    let rows = moves
        .iter()
        .map(|m| {
            vec![
                m.step.clone(),
                m.shards_moved.to_string(),
                format!("{:.1}", m.shards_ideal),
                m.ratio.map_or_else(|| MISSING.to_owned(), ratio),
                m.manifests_moved.to_string(),
                format!("{:.1}", m.settled_seconds),
            ]
        })
        .collect();
    let header = [
        "membership step",
        "shards moved",
        "ideal",
        "moved ÷ ideal",
        "Manifests moved",
        "settled (s)",
    ];
    format!(
        "Ownership moves (moved ÷ ideal: 1 is the minimum; {MISSING}: nothing had to move):\n\n{}",
        named_rows_table(&header, rows)
    )
}

fn capacity(capacity: &[Capacity]) -> Option<String> {
    if capacity.is_empty() {
        return None;
    }
    let mut parts = vec![
        "## Capacity\n\nLoad stepped up per fleet size until an SLO broke: p99 queue wait < 1 s \
         and p99 create/update → Ready < 5 s."
            .to_owned(),
    ];
    let mut sizes: Vec<&Capacity> = capacity.iter().collect();
    sizes.sort_by_key(|c| c.replicas);
    parts.extend(sizes.iter().map(|c| capacity_steps(c)));
    parts.push(capacity_curve(&sizes));
    Some(parts.join("\n\n"))
}

fn capacity_steps(c: &Capacity) -> String {
    let rows = c
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let slo = if s.passed { "✓" } else { "✗" };
            let point = if c.last_passing == Some(i) {
                " ← capacity"
            } else {
                ""
            };
            vec![
                (i + 1).to_string(),
                rate(s.create_rate),
                s.objects.to_string(),
                rate(s.operations_per_second),
                seconds(s.queue_wait_p99_seconds),
                seconds(s.ready_p99_seconds),
                format!("{slo}{point}"),
            ]
        })
        .collect();
    let header = [
        "step",
        "creates/s offered",
        "objects",
        "ops/s",
        "queue wait p99 (s)",
        "Ready p99 (s)",
        "SLO",
    ];
    let mut align = vec![Align::Right; header.len()];
    align[header.len() - 1] = Align::Left;
    let verdict = if c.point().is_none() {
        "\n\nNo step met the SLOs."
    } else {
        ""
    };
    format!(
        "### {} replica{}\n\n{}{verdict}",
        c.replicas,
        plural(c.replicas),
        table(&header, &align, rows)
    )
}

/// The capacity point of each fleet size against the smallest size that has one (1 replica
/// when measured): how far adding replicas carries.
fn capacity_curve(sizes: &[&Capacity]) -> String {
    let reference = sizes
        .iter()
        .find_map(|c| c.point().map(|p| (c.replicas, p)));
    let rows = sizes
        .iter()
        .map(|c| {
            let Some(point) = c.point() else {
                return vec![
                    c.replicas.to_string(),
                    MISSING.into(),
                    MISSING.into(),
                    MISSING.into(),
                    MISSING.into(),
                    MISSING.into(),
                ];
            };
            let (objects_ratio, ops_ratio, efficiency) = match reference {
                Some((n0, p0)) => {
                    let ops = divide(point.operations_per_second, p0.operations_per_second);
                    let fleet_ratio = f64::from(c.replicas) / f64::from(n0);
                    (
                        divide(point.objects as f64, p0.objects as f64),
                        ops,
                        ops.and_then(|o| divide(o, fleet_ratio)),
                    )
                }
                None => (None, None, None),
            };
            vec![
                c.replicas.to_string(),
                point.objects.to_string(),
                rate(point.operations_per_second),
                objects_ratio.map_or_else(|| MISSING.to_owned(), ratio),
                ops_ratio.map_or_else(|| MISSING.to_owned(), ratio),
                efficiency.map_or_else(|| MISSING.to_owned(), |e| format!("{:.0} %", e * 100.0)),
            ]
        })
        .collect();
    let reference_name = match reference {
        Some((n0, _)) => format!("{n0} replica{}", plural(n0)),
        None => "none: no fleet size met the SLOs".to_owned(),
    };
    let header = [
        "replicas",
        "objects",
        "ops/s",
        "objects ratio",
        "ops/s ratio",
        "scaling efficiency",
    ];
    format!(
        "### Capacity curve\n\nAt each size's last passing step; ratios against {reference_name}; \
         scaling efficiency = ops/s ratio ÷ replica ratio (100 % is linear).\n\n{}",
        table(&header, &vec![Align::Right; header.len()], rows)
    )
}

fn baselines(b: &Baselines) -> String {
    let paths = [
        ("fleet", Some(&b.fleet)),
        ("single replica", b.single_replica.as_ref()),
        ("bare apply", b.bare_apply.as_ref()),
        ("helm", b.helm.as_ref()),
    ];
    let rows = paths
        .iter()
        .filter_map(|(name, burst)| burst.map(|burst| (name, burst)))
        .map(|(name, burst)| {
            vec![
                name.to_string(),
                burst.parallelism.to_string(),
                format!("{:.1}", burst.seconds),
                rate(burst.per_second),
            ]
        })
        .collect();
    let ratios = [
        (
            "fleet ÷ bare apply",
            b.bare_apply.as_ref(),
            " (fraction of the API server's ceiling)",
        ),
        ("fleet ÷ single replica", b.single_replica.as_ref(), ""),
        ("fleet ÷ helm", b.helm.as_ref(), ""),
    ];
    let ratio_lines: Vec<String> = ratios
        .iter()
        .filter_map(|(name, other, note)| {
            let r = burst_ratio(&b.fleet, (*other)?)?;
            Some(format!("- {name}: **{}**{note}", ratio(r)))
        })
        .collect();
    let mut out = format!(
        "## Baselines\n\nThe same burst of {} Manifests ({} objects each) through each path.\n\n{}",
        b.manifests,
        b.objects_per_manifest,
        table(
            &["path", "parallelism", "seconds", "Manifests/s"],
            &[Align::Left, Align::Right, Align::Right, Align::Right],
            rows
        )
    );
    if !ratio_lines.is_empty() {
        out.push_str("\n\n");
        out.push_str(&ratio_lines.join("\n"));
    }
    out
}

/// The fleet's rate over another path's; `None` when the other path did nothing measurable.
fn burst_ratio(fleet: &Burst, other: &Burst) -> Option<f64> {
    divide(fleet.per_second, other.per_second)
}

fn chart_links(result: &RunResult) -> Option<String> {
    let links: Vec<String> = charts::planned(result)
        .iter()
        .map(|chart| format!("![{}]({})", chart.title(), chart.file_name()))
        .collect();
    if links.is_empty() {
        return None;
    }
    Some(format!("## Charts\n\n{}", links.join("\n\n")))
}
