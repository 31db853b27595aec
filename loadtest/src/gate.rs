//! A regression gate on counters, not times (issue 37 item 6): the per-Manifest counts of an
//! `mttp` run — the fleet's API requests by verb and resource (audit log), reconcile passes,
//! renders, the Manifests the replicas' watches received — and the replicas' peak memory,
//! compared with a baseline stored in the repository (`loadtest/gate/mttp.json`). Counts move
//! little from one run to the next on a noisy machine (four runs at load 3–5 stayed within
//! 1 %); times do not, so times are never gated. What can still move them: a Deployment that
//! is not Available by the second pass (a slow kube-controller-manager) costs a third pass and
//! its reads; a fence lapse restarts a shard watch (such a run is refused, not judged).
//!
//! `loadtest mttp … --gate FILE` compares the run with `FILE` and fails it (checker
//! `counter-regression`) when a counter moved beyond [`TOLERANCE`]; `--gate-update` writes the
//! run's counters to `FILE` instead, and that change is a reviewed commit. Pure: the run's
//! [`MttpBurst`]es in, findings out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::results::MttpBurst;

/// A counter may move this much (relative) either way.
pub const TOLERANCE: f64 = 0.05;

/// Below one per Manifest a counter may also move this much (absolute, per Manifest): a few
/// stray requests (a conflict retried, a pass more) in a run of hundreds of Manifests are not a
/// regression, and 5 % of 0.02 would be a fraction of one request.
pub const FLOOR_PER_MANIFEST: f64 = 0.05;

/// The stored baseline: what run it is, and its counters by burst.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// How to measure it again (the command, for people).
    pub command: String,
    /// `debug` or `release`: memory (and nothing else here) differs between the two, so a
    /// baseline is compared only with a run of the same profile.
    pub profile: String,
    /// The machine's cores when measured: peak memory (tokio workers, allocator arenas, Go's
    /// threads) depends on them, so it is compared only on a machine with as many.
    #[serde(default)]
    pub cores: usize,
    /// Per burst (`"<replicas>x<manifests>"`), counter name → value.
    pub bursts: BTreeMap<String, BTreeMap<String, f64>>,
}

/// One counter out of bounds, or missing on one side.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub burst: String,
    pub counter: String,
    pub baseline: Option<f64>,
    pub measured: Option<f64>,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = |v: Option<f64>| v.map_or("absent".to_owned(), |v| format!("{v:.3}"));
        write!(
            f,
            "{} {}: baseline {}, measured {}",
            self.burst,
            self.counter,
            value(self.baseline),
            value(self.measured)
        )?;
        if let (Some(b), Some(m)) = (self.baseline, self.measured)
            && b > 0.0
        {
            write!(f, " ({:+.1} %)", (m / b - 1.0) * 100.0)?;
        }
        Ok(())
    }
}

/// The build profile of this binary (the harness and the replicas are built together).
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// The command to measure a baseline again, from a run's arguments (program name left out):
/// `loadtest` and the arguments without those naming this machine's paths or the gate itself.
pub fn command_line(args: &[String]) -> String {
    const WITH_PATH: [&str; 5] = ["--binary", "--repo", "--out", "--gate", "--kubeconfig"];
    const FLAGS: [&str; 2] = ["--gate-update", "--quiet"];
    let mut kept = vec!["loadtest".to_owned()];
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let name = arg.split('=').next().unwrap_or(arg);
        if WITH_PATH.contains(&name) {
            if !arg.contains('=') {
                args.next();
            }
        } else if !FLAGS.contains(&name) {
            kept.push(arg.clone());
        }
    }
    kept.join(" ")
}

/// This machine's cores.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, usize::from)
}

/// A burst's key in [`Baseline::bursts`].
pub fn burst_key(burst: &MttpBurst) -> String {
    format!("{}x{}", burst.replicas, burst.manifests)
}

/// Resources whose requests run on timers, not per Manifest: Lease renewals and reads,
/// discovery. Their count per Manifest grows with the run's length, which depends on the
/// machine's speed, so they are not gated.
pub const TIME_DRIVEN: [&str; 2] = ["leases", "non-resource"];

/// Verbs whose requests run on timers: a watch is sent again each time the API server ends
/// it, every 290 s (kube-runtime's `timeoutSeconds`), whatever the load; a run that lasts past
/// that point counts one more per watch (a CI run at load 5 did: 13 in a run of 200 Manifests).
pub const TIME_DRIVEN_VERBS: [&str; 1] = ["watch"];

/// The one gated counter that is not per Manifest (MiB, the highest replica).
pub const PEAK_RSS: &str = "peak_rss_mib";

/// The gated counters of one burst, per Manifest but for [`PEAK_RSS`]: `passes`, `renders`,
/// `manifest_watch_events`, `requests` (the fleet's, without [`TIME_DRIVEN`] and
/// [`TIME_DRIVEN_VERBS`] ones) and
/// `requests <verb> <resource>` for each kind (audit verbs: `create`, `patch`, `get`…).
pub fn counters(burst: &MttpBurst) -> BTreeMap<String, f64> {
    let mut counters = BTreeMap::from([("passes".to_owned(), burst.passes_per_manifest)]);
    let optional = [
        ("renders", burst.renders_per_manifest),
        (
            "manifest_watch_events",
            burst.manifest_watch_events_per_manifest,
        ),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            counters.insert(name.to_owned(), value);
        }
    }
    let gated = burst
        .operator_by_request_per_manifest
        .iter()
        .filter(|(request, _)| {
            let (verb, resource) = request.split_once(' ').unwrap_or(("", request.as_str()));
            !TIME_DRIVEN.contains(&resource) && !TIME_DRIVEN_VERBS.contains(&verb)
        });
    let mut requests = 0.0;
    for (request, value) in gated {
        counters.insert(format!("requests {request}"), *value);
        requests += value;
    }
    if burst.operator_requests_per_manifest.is_some() {
        counters.insert("requests".to_owned(), requests);
    }
    if let Some(peak) = burst.peak_rss_mib.values().copied().reduce(f64::max) {
        counters.insert(PEAK_RSS.to_owned(), peak);
    }
    counters
}

/// The baseline a run's bursts make.
pub fn baseline_of(bursts: &[MttpBurst], command: &str) -> Baseline {
    Baseline {
        command: command.to_owned(),
        profile: profile().to_owned(),
        cores: cores(),
        bursts: bursts
            .iter()
            .map(|b| {
                // Four decimals: what a reviewer reads (sums carry float noise).
                let rounded = counters(b)
                    .into_iter()
                    .map(|(k, v)| (k, (v * 1e4).round() / 1e4));
                (burst_key(b), rounded.collect())
            })
            .collect(),
    }
}

/// Whether `measured` is within bounds of `baseline` (per Manifest counts; see [`TOLERANCE`]
/// and [`FLOOR_PER_MANIFEST`]; memory has no floor).
fn within(counter: &str, baseline: f64, measured: f64) -> bool {
    let mut allowed = baseline.abs() * TOLERANCE;
    if counter != PEAK_RSS {
        allowed = allowed.max(FLOOR_PER_MANIFEST);
    }
    (measured - baseline).abs() <= allowed
}

/// Every counter of every burst of `baseline` against the run's; a burst of the baseline the
/// run lacks is an error (the run was not the baseline's command).
pub fn compare(baseline: &Baseline, bursts: &[MttpBurst]) -> Result<Vec<Finding>, String> {
    if baseline.profile != profile() {
        return Err(format!(
            "the baseline was measured with a {} build and this is a {} build",
            baseline.profile,
            profile()
        ));
    }
    if let Some(b) = bursts
        .iter()
        .find(|b| b.fence_lapses > 0 || b.scrape_failures > 0)
    {
        return Err(format!(
            "burst {} was disturbed ({} fence lapses, {} failed scrapes of the replicas' metrics): its counts cannot be judged; run again on a quieter machine",
            burst_key(b),
            b.fence_lapses,
            b.scrape_failures
        ));
    }
    let run: BTreeMap<String, BTreeMap<String, f64>> =
        bursts.iter().map(|b| (burst_key(b), counters(b))).collect();
    // Memory depends on the cores: not compared on another machine (the rest is).
    let other_machine = baseline.cores != cores();
    let mut findings = Vec::new();
    for (key, expected) in &baseline.bursts {
        let Some(measured) = run.get(key) else {
            return Err(format!(
                "the run has no burst {key} (replicas x manifests); the baseline was measured with `{}`",
                baseline.command
            ));
        };
        let names = expected
            .keys()
            .chain(measured.keys().filter(|k| !expected.contains_key(*k)));
        for name in names.filter(|name| !(other_machine && *name == PEAK_RSS)) {
            let (b, m) = (expected.get(name).copied(), measured.get(name).copied());
            // A counter new to the run (a verb never sent before) or gone from it moved from
            // or to 0.
            if !within(name, b.unwrap_or(0.0), m.unwrap_or(0.0)) {
                findings.push(Finding {
                    burst: key.clone(),
                    counter: name.clone(),
                    baseline: b,
                    measured: m,
                });
            }
        }
    }
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn burst(passes: f64, patch: f64, rss: f64) -> MttpBurst {
        MttpBurst {
            replicas: 2,
            manifests: 200,
            passes_per_manifest: passes,
            operator_requests_per_manifest: Some(patch + 1.7),
            operator_by_request_per_manifest: BTreeMap::from([
                ("patch deployments".to_owned(), patch),
                ("get manifests".to_owned(), 1.0),
                // Timers, not Manifests: left out.
                ("patch leases".to_owned(), 0.5),
                ("get non-resource".to_owned(), 0.2),
            ]),
            renders_per_manifest: Some(1.0),
            manifest_watch_events_per_manifest: Some(12.0),
            peak_rss_mib: BTreeMap::from([
                ("mm-0".to_owned(), rss),
                ("mm-1".to_owned(), rss - 5.0),
            ]),
            ..Default::default()
        }
    }

    fn names(findings: &[Finding]) -> Vec<&str> {
        findings.iter().map(|f| f.counter.as_str()).collect()
    }

    #[test]
    fn the_same_counts_pass_and_moved_counts_fail() {
        let baseline = baseline_of(&[burst(2.0, 6.0, 80.0)], "loadtest mttp");
        let counted: Vec<&String> = baseline.bursts["2x200"].keys().collect();
        assert_eq!(
            counted,
            [
                "manifest_watch_events",
                "passes",
                "peak_rss_mib",
                "renders",
                "requests",
                "requests get manifests",
                "requests patch deployments"
            ]
        );
        assert_eq!(baseline.bursts["2x200"]["requests"], 7.0);
        assert_eq!(baseline.bursts["2x200"][PEAK_RSS], 80.0);
        assert_eq!(compare(&baseline, &[burst(2.0, 6.0, 80.0)]), Ok(vec![]));
        // Within 5 %: 2.08 passes, 6.25 patches (7.25 requests), 83.9 MiB; twice the Lease
        // requests and watches sent again at the API server's timeout (a slower run) are not
        // counted.
        let mut slower = burst(2.08, 6.25, 83.9);
        slower
            .operator_by_request_per_manifest
            .insert("patch leases".into(), 1.0);
        slower
            .operator_by_request_per_manifest
            .insert("watch manifests".into(), 0.065);
        assert_eq!(compare(&baseline, &[slower]), Ok(vec![]));
        // A pass more per Manifest, one patch more, 10 % more memory.
        let findings = compare(&baseline, &[burst(3.0, 7.0, 88.0)]).unwrap();
        assert_eq!(
            names(&findings),
            [
                "passes",
                "peak_rss_mib",
                "requests",
                "requests patch deployments"
            ]
        );
        // Fewer is a change too: the baseline is updated by a reviewed commit.
        let findings = compare(&baseline, &[burst(1.0, 6.0, 80.0)]).unwrap();
        assert_eq!(names(&findings), ["passes"]);
        assert!(
            findings[0].to_string().contains("-50.0 %"),
            "{}",
            findings[0]
        );
    }

    #[test]
    fn small_counters_have_an_absolute_floor_and_new_requests_count() {
        let mut quiet = burst(2.0, 6.0, 80.0);
        quiet
            .operator_by_request_per_manifest
            .insert("update manifests".into(), 0.02);
        let baseline = baseline_of(&[quiet], "loadtest mttp");
        // 0.02 → 0.05 per Manifest: within the floor (and 7.02 → 7.05 requests).
        let mut run = burst(2.0, 6.0, 80.0);
        run.operator_by_request_per_manifest
            .insert("update manifests".into(), 0.05);
        assert_eq!(compare(&baseline, std::slice::from_ref(&run)), Ok(vec![]));
        // A request the baseline never sent, at 0.5 per Manifest; `update` gone (0.02: fine).
        let mut run = burst(2.0, 6.0, 80.0);
        run.operator_by_request_per_manifest
            .insert("delete configmaps".into(), 0.5);
        let findings = compare(&baseline, &[run]).unwrap();
        assert_eq!(names(&findings), ["requests", "requests delete configmaps"]);
        assert_eq!(findings[1].baseline, None);
    }

    #[test]
    fn the_command_leaves_out_paths_and_the_gate() {
        let args: Vec<String> = "mttp --manifests 200 --binary /x/module-manager --repo=/x --quiet --gate f.json --gate-update --replicas 2"
            .split(' ')
            .map(str::to_owned)
            .collect();
        assert_eq!(
            command_line(&args),
            "loadtest mttp --manifests 200 --replicas 2"
        );
        let args = ["remote".to_owned(), "--kubeconfig=/home/x/kc".to_owned()];
        assert_eq!(command_line(&args), "loadtest remote");
    }

    #[test]
    fn another_shape_or_profile_is_an_error_not_a_pass() {
        let baseline = baseline_of(&[burst(2.0, 6.0, 80.0)], "loadtest mttp --manifests 200");
        let mut other = burst(2.0, 6.0, 80.0);
        other.manifests = 100;
        let error = compare(&baseline, &[other]).unwrap_err();
        assert!(
            error.contains("no burst 2x200") && error.contains("--manifests 200"),
            "{error}"
        );
        // A run whose fence lapsed (its shard watch restarted) or whose scrape failed.
        let mut lapsed = burst(2.0, 6.0, 80.0);
        lapsed.fence_lapses = 1;
        let error = compare(&baseline, &[lapsed]).unwrap_err();
        assert!(error.contains("disturbed (1 fence lapses"), "{error}");
        let mut unread = burst(2.0, 6.0, 80.0);
        unread.scrape_failures = 1;
        assert!(compare(&baseline, &[unread]).is_err());
        // On a machine with other cores memory is not compared; the counts are.
        let mut elsewhere = baseline.clone();
        elsewhere.cores = cores() + 2;
        assert_eq!(compare(&elsewhere, &[burst(2.0, 6.0, 160.0)]), Ok(vec![]));
        let findings = compare(&elsewhere, &[burst(3.0, 6.0, 160.0)]).unwrap();
        assert_eq!(names(&findings), ["passes"]);
        let mut release = baseline.clone();
        release.profile = if profile() == "debug" {
            "release"
        } else {
            "debug"
        }
        .into();
        assert!(compare(&release, &[burst(2.0, 6.0, 80.0)]).is_err());
    }
}
