//! The `remote` section of the summary: the targets, the burst and its cost per target, the
//! idle fleet, the bare client.

use std::collections::BTreeMap;

use super::format::{
    Align, MISSING, READY_COLUMNS, quantile_table, rate, ratio, ready_cells, table,
};
use crate::results::{
    Remote, RemoteBurst, RemoteColdRestart, RemoteDrift, RemoteIdle, RemoteSteady, Spread,
};

pub(super) fn section(r: &Remote) -> String {
    let mut parts = vec![
        format!(
            "## Remote: {} Manifests on {} targets\n\n{} targets × {} Manifests on {} replicas; \
             the targets are namespaces on {} real API servers, each with its own endpoint (a \
             proxy address), ServiceAccount token and TLS sessions; {} ms round trip added. \
             Setting them up took {:.1} s. Per target: the fleet's requests from the API \
             servers' audit logs (by the target's credential), connections from the proxy.",
            r.manifests,
            r.targets,
            r.targets,
            r.modules_per_target,
            r.replicas,
            r.apiservers,
            r.latency_ms,
            r.setup_seconds
        ),
        credentials(r),
        burst(&r.burst),
        target_passes(&r.burst),
        per_target(&[
            ("requests", &r.burst.requests_per_target),
            ("writes", &r.burst.writes_per_target),
            ("connections opened", &r.burst.connections_opened_per_target),
            (
                "connections open at the end",
                &r.burst.connections_open_per_target,
            ),
        ]),
        format!(
            "By verb, all targets: {}",
            verbs(&r.burst.requests_by_verb, &r.burst.requests_by_request)
        ),
    ];
    parts.push(bare(r));
    parts.extend(r.idle.as_ref().map(idle));
    parts.extend(r.steady.as_ref().map(steady));
    parts.extend(r.drift.as_ref().map(drift));
    parts.extend(r.cold_restart.as_ref().map(cold_restart));
    parts.join("\n\n")
}

/// The targets' tokens and whether every Manifest stayed Ready with them.
fn credentials(r: &Remote) -> String {
    let not_ready = r
        .not_ready_at_end
        .map_or_else(|| MISSING.to_owned(), |n| n.to_string());
    let tokens = if r.token_seconds > 0 {
        format!(
            "Tokens valid for {} s, renewed by the harness at half their life (a new \
             TokenRequest written into the Secret): {} renewals, {} failed. ",
            r.token_seconds, r.token_renewals, r.token_renewal_failures
        )
    } else {
        String::new()
    };
    format!(
        "{tokens}Manifests not Ready at their generation when the fleet's part ended: {not_ready}."
    )
}

fn burst(b: &RemoteBurst) -> String {
    let peak = b.peak_rss_mib.values().copied().reduce(f64::max);
    let sockets = b.sockets.values().copied().max();
    let header = [
        &READY_COLUMNS[..],
        &[
            "fleet CPU-s",
            "peak RSS per replica (MiB)",
            "sockets per replica (most)",
        ],
    ]
    .concat();
    let ready = ready_cells(&b.ready);
    let cost = [
        format!("{:.1}", b.fleet_cpu_seconds),
        peak.map_or_else(|| MISSING.to_owned(), |p| format!("{p:.1}")),
        sockets.map_or_else(|| MISSING.to_owned(), |s| s.to_string()),
    ];
    table(
        &header,
        &[Align::Right; 9],
        vec![[&ready[..], &cost].concat()],
    )
}

/// The blackholed targets and the passes one target held at once, per replica.
fn target_passes(b: &RemoteBurst) -> String {
    format!(
        "Targets blackholed from the start: {} (their Manifests are not timed). Most passes \
         one target held at once (`--target-passes` bounds it): {}; passes that found their \
         target busy and went back to the queue: {}. Target clients held at the end (the \
         clusters each replica met): {}.",
        b.blackholed_targets,
        counts(&b.target_passes_held_max),
        counts(&b.target_passes_parked),
        counts(&b.target_clients),
    )
}

/// `name count, …` (per replica, per verb…), or `–`.
fn counts(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return MISSING.to_owned();
    }
    let items: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    items.join(", ")
}

/// The fleet restarted while holding every target, and what that cost the targets.
fn cold_restart(c: &RemoteColdRestart) -> String {
    let r = &c.restart;
    let checked = r
        .all_checked_seconds
        .map_or_else(|| MISSING.to_owned(), |s| format!("{s:.1}"));
    format!(
        "### Cold restart of {} replicas holding {} Manifests\n\nEvery replica ready again \
         after {:.1} s; every Manifest checked again (a completed pass in the new processes' \
         logs) after {checked} s; {} of {} checked, {} passes. Target clients held then: \
         {}.\n\n{}\n\nBy request, all targets: {}",
        r.replicas,
        r.manifests,
        r.ready_seconds,
        r.checked,
        r.manifests,
        r.passes,
        counts(&c.target_clients),
        per_target(&[
            ("requests", &c.requests_per_target),
            ("writes", &c.writes_per_target),
            ("connections opened", &c.connections_opened_per_target),
        ]),
        verbs(&BTreeMap::new(), &c.requests_by_request),
    )
}

fn optional(v: Option<f64>) -> String {
    v.map_or_else(|| MISSING.to_owned(), |v| format!("{v:.2}"))
}

fn per_target(rows: &[(&str, &Spread)]) -> String {
    table(
        &["per target", "mean", "min", "p50", "p99", "max"],
        &[
            Align::Left,
            Align::Right,
            Align::Right,
            Align::Right,
            Align::Right,
            Align::Right,
        ],
        rows.iter()
            .map(|(what, s)| {
                vec![
                    (*what).to_owned(),
                    format!("{:.2}", s.mean),
                    optional(s.min),
                    optional(s.p50),
                    optional(s.p99),
                    optional(s.max),
                ]
            })
            .collect(),
    )
}

/// Requests by verb and resource when the run counted them, else by verb.
fn verbs(by_verb: &BTreeMap<String, u64>, by_request: &BTreeMap<String, u64>) -> String {
    counts(if by_request.is_empty() {
        by_verb
    } else {
        by_request
    })
}

fn bare(r: &Remote) -> String {
    let body = match (&r.bare, &r.bare_error) {
        (Some(b), _) => format!(
            "{:.1} s, {} Manifests/s with {} targets at once; the fleet ÷ the bare client: **{}**",
            b.seconds,
            rate(b.per_second),
            b.parallelism,
            r.fleet_over_bare.map_or_else(|| MISSING.to_owned(), ratio)
        ),
        (None, Some(e)) => format!("not measured: {e}"),
        (None, None) => "not run (`--no-baselines`)".to_owned(),
    };
    let writes = match (
        &r.bare_with_manifest_writes,
        &r.bare_with_manifest_writes_error,
    ) {
        (Some(b), _) => format!(
            "{:.1} s, {} Manifests/s; the fleet ÷ this client: **{}**; this client ÷ the bare \
             client: {}",
            b.seconds,
            rate(b.per_second),
            r.fleet_over_minimum
                .map_or_else(|| MISSING.to_owned(), ratio),
            r.minimum_over_bare
                .map_or_else(|| MISSING.to_owned(), ratio),
        ),
        (None, Some(e)) => format!("not measured: {e}"),
        (None, None) => "not run".to_owned(),
    };
    format!(
        "### Baseline: a bare client per target (same run, the fleet stopped)\n\n\
         A client built from each target's kubeconfig (its own connection and credential through \
         the same proxy) discovers the chart's kinds and server-side applies the releases' \
         objects, and nothing else (no Manifest, status or rollout wait): {body}\n\n\
         The same client also sending, per release, the Manifest's minimum writes on the local \
         cluster (its create, the claim, the inventory, one `Ready` status: what any operator \
         keeping the Manifest's contract sends): {writes}"
    )
}

fn idle(i: &RemoteIdle) -> String {
    let peak = i.peak_rss_mib.values().copied().reduce(f64::max);
    format!(
        "### The fleet idle\n\n{:.0} s at `spec.interval` {}: {:.3} cores, peak RSS {} MiB; \
         writes on all targets: {}; by verb: {}.\n\n{}",
        i.seconds,
        i.drift_interval,
        i.fleet_cores,
        peak.map_or_else(|| MISSING.to_owned(), |p| format!("{p:.1}")),
        i.writes,
        verbs(&i.requests_by_verb, &i.requests_by_request),
        per_target(&[
            ("requests per minute", &i.requests_per_target_per_minute),
            ("connections opened", &i.connections_opened_per_target),
        ])
    )
}

fn steady(s: &RemoteSteady) -> String {
    format!(
        "### Steady state: spec edits with every target held\n\n{} edits at {} per second to \
         Manifests spread over the targets (a new `revision`: the ConfigMap and the \
         Deployment's pod template change), {:.0} s; {} not answered, {} without a pass start \
         in the logs, {} not Ready within two minutes of the last edit (those count at their \
         wait below). From the edit sent:\n\n{}",
        s.edits,
        s.rate,
        s.seconds,
        s.failed,
        s.not_started,
        s.not_ready,
        quantile_table(
            "edit to",
            &[
                ("pass start", &s.edit_to_pass_start_seconds),
                ("Ready", &s.edit_to_ready_seconds),
            ],
        )
    )
}

fn drift(d: &RemoteDrift) -> String {
    format!(
        "### Drift repair on the targets\n\n{} of {} picked ConfigMaps changed straight on their \
         targets (one per Manifest, as another field manager), spread over one interval; \
         `spec.interval` {:.0} s (each drift pass comes at most one interval after the last; \
         up to 10 % later before bd27d37): {} repaired within one interval, {} within 1.1 \
         intervals, {} not within 1.1 intervals and \
         a minute (counted at that wait below). From the change sent to the chart's value seen \
         again:\n\n{}",
        d.changes,
        d.requested,
        d.interval_seconds,
        d.within_interval,
        d.within_interval_and_jitter,
        d.not_repaired,
        quantile_table("change to", &[("repair", &d.change_to_repair_seconds)])
    )
}
