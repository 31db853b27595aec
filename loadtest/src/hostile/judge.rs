//! What the `hostile` scenario judges, as pure functions: what each hostile chart's Manifest
//! must say in its status, that status as reported, each arm's p99 against its repeat's arm
//! without a hostile chart, and the violations.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use module_manager::api::ManifestStatus;

use crate::options::HostileChart;
use crate::results::{HostileArm, HostileStatus, Violation};

/// The `Ready` reason of every render failure (`ReconcileError::category`).
const RENDER_ERROR: &str = "RenderError";
/// How much of the `Ready` message the report keeps.
const MESSAGE_KEPT: usize = 200;

/// What a hostile chart's failure looks like in its Manifest's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expectation {
    /// `Stalled=True` (a permanent error: waits for a change) or not (retried with backoff).
    pub stalled: bool,
    /// Words of the `Ready` message that name the failure.
    pub says: &'static str,
}

impl Expectation {
    /// As the report says it.
    pub fn describe(self) -> String {
        let stalled = if self.stalled {
            "Stalled=True"
        } else {
            "retried (Stalled not True)"
        };
        format!("Ready=False {RENDER_ERROR} \"…{}…\", {stalled}", self.says)
    }
}

/// The failure each hostile chart must be reported with: the heap limit and the address-space
/// backstop are memory failures, the 17 MB `fail` a (bounded) template error, the endless loop
/// a timeout.
pub fn expected(chart: HostileChart) -> Expectation {
    match chart {
        HostileChart::Memory | HostileChart::AddressSpace => Expectation {
            stalled: true,
            says: "exceeded the renderer's memory limit",
        },
        HostileChart::FailHuge => Expectation {
            stalled: true,
            says: "helm template failed: execution error",
        },
        HostileChart::Loop => Expectation {
            stalled: false,
            says: "did not finish within",
        },
    }
}

fn condition<'a>(status: &'a ManifestStatus, kind: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == kind)
}

/// Whether `status` names `chart`'s failure: `Ready=False` with reason `RenderError` and the
/// expected words in its message, `Stalled=True` exactly when the failure is permanent.
pub fn names_failure(chart: HostileChart, status: Option<&ManifestStatus>) -> bool {
    let Some(status) = status else {
        return false;
    };
    let expectation = expected(chart);
    let ready = condition(status, "Ready").is_some_and(|c| {
        c.status == "False" && c.reason == RENDER_ERROR && c.message.contains(expectation.says)
    });
    let stalled = condition(status, "Stalled").is_some_and(|c| c.status == "True");
    ready && stalled == expectation.stalled
}

/// The report of a hostile Manifest's status; `named_after_seconds`: when it first named the
/// failure.
pub fn report(
    chart: HostileChart,
    status: Option<&ManifestStatus>,
    named_after_seconds: Option<f64>,
) -> HostileStatus {
    let of = |kind: &str| status.and_then(|s| condition(s, kind));
    let message = of("Ready").map_or("", |c| c.message.as_str());
    HostileStatus {
        state: status
            .and_then(|s| s.state)
            .map(|state| format!("{state:?}")),
        ready: of("Ready").map(|c| c.status.clone()),
        ready_reason: of("Ready").map(|c| c.reason.clone()),
        stalled: of("Stalled").map(|c| c.status.clone()),
        reconciling_reason: of("Reconciling").map(|c| c.reason.clone()),
        message: printable_start(message, MESSAGE_KEPT),
        expected: expected(chart).describe(),
        names_failure: names_failure(chart, status),
        named_after_seconds,
    }
}

/// The first `max` bytes of `text` (at a character boundary), control characters shown as
/// `\u{…}`: a hostile chart's message may be made of them.
fn printable_start(text: &str, max: usize) -> String {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end]
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Sets each arm's p99 over the p99 of its repeat's arm without a hostile chart.
pub fn set_ratios(arms: &mut [HostileArm]) {
    let baselines: Vec<(u32, Option<f64>)> = arms
        .iter()
        .filter(|a| a.hostile.is_none())
        .map(|a| (a.repeat, a.create_to_ready_seconds.p99))
        .collect();
    for arm in arms {
        let baseline = baselines
            .iter()
            .find(|(repeat, _)| *repeat == arm.repeat)
            .and_then(|(_, p99)| *p99);
        arm.p99_over_no_hostile = match (arm.create_to_ready_seconds.p99, baseline) {
            (Some(p99), Some(base)) if base > 0.0 => Some(p99 / base),
            _ => None,
        };
    }
}

/// `repeat 2, beside memory` (or `without a hostile chart`).
pub fn arm_name(arm: &HostileArm) -> String {
    match &arm.hostile {
        Some(chart) => format!("repeat {}, beside {chart}", arm.repeat),
        None => format!("repeat {}, without a hostile chart", arm.repeat),
    }
}

/// What fails the run in an arm: an innocent not Ready (`not-converged`), a Manifest of the
/// arm not gone after its deletion (`not-converged`), a hostile Manifest whose status does
/// not name its failure (`hostile-status`).
pub fn violations(arm: &HostileArm, limit_seconds: u64) -> Vec<Violation> {
    let mut found = Vec::new();
    let name = arm_name(arm);
    if arm.innocents_ready < arm.innocents {
        found.push(Violation {
            checker: "not-converged".into(),
            detail: format!(
                "{name}: {} of {} innocent Manifests not Ready within {limit_seconds} s: {}",
                arm.innocents - arm.innocents_ready,
                arm.innocents,
                arm.not_ready.join("; ")
            ),
        });
    }
    if !arm.not_deleted.is_empty() {
        found.push(Violation {
            checker: "not-converged".into(),
            detail: format!(
                "{name}: {} Manifests not gone {limit_seconds} s after their deletion: {}",
                arm.not_deleted.len(),
                arm.not_deleted.join("; ")
            ),
        });
    }
    if let Some(status) = arm.hostile_status.as_ref().filter(|s| !s.names_failure) {
        found.push(Violation {
            checker: "hostile-status".into(),
            detail: format!(
                "{name}: the hostile Manifest's status does not name its failure (expected {}): \
                 state {}, Ready {} {}, Stalled {}, message \"{}\"",
                status.expected,
                status.state.as_deref().unwrap_or("none"),
                status.ready.as_deref().unwrap_or("none"),
                status.ready_reason.as_deref().unwrap_or(""),
                status.stalled.as_deref().unwrap_or("none"),
                status.message
            ),
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Quantiles;
    use serde_json::json;

    fn status(conditions: serde_json::Value) -> ManifestStatus {
        serde_json::from_value(json!({"state": "Error", "conditions": conditions})).unwrap()
    }

    fn condition(kind: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
        json!({"type": kind, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": "2026-12-07T00:00:00Z"})
    }

    fn failed(message: &str, stalled: bool) -> ManifestStatus {
        let flag = if stalled { "True" } else { "False" };
        status(json!([
            condition("Ready", "False", "RenderError", message),
            condition("Stalled", flag, "RenderError", message),
        ]))
    }

    const MEMORY: &str = "render: render exceeded the renderer's memory limit of 536870912 bytes";
    const TIMEOUT: &str = "render: helm template did not finish within 30s and was stopped";
    const FAIL: &str = "render: helm template failed: execution error at (fail-huge/templates/cm.yaml:2:4): error calling fail: \u{1}\u{1}";

    #[test]
    fn each_chart_must_be_reported_with_its_own_failure() {
        assert!(names_failure(
            HostileChart::Memory,
            Some(&failed(MEMORY, true))
        ));
        assert!(names_failure(
            HostileChart::AddressSpace,
            Some(&failed(MEMORY, true))
        ));
        assert!(names_failure(
            HostileChart::FailHuge,
            Some(&failed(FAIL, true))
        ));
        assert!(names_failure(
            HostileChart::Loop,
            Some(&failed(TIMEOUT, false))
        ));
        // The wrong failure, the wrong permanence, no status, a Ready Manifest.
        assert!(!names_failure(
            HostileChart::Memory,
            Some(&failed(
                "render: renderer stopped: the renderer exited (exit status: 2)",
                false
            ))
        ));
        assert!(!names_failure(
            HostileChart::Memory,
            Some(&failed(MEMORY, false))
        ));
        assert!(!names_failure(
            HostileChart::Loop,
            Some(&failed(TIMEOUT, true))
        ));
        assert!(!names_failure(
            HostileChart::FailHuge,
            Some(&failed(MEMORY, true))
        ));
        assert!(!names_failure(HostileChart::Loop, None));
        let ready = status(json!([condition("Ready", "True", "Ready", "ready")]));
        assert!(!names_failure(HostileChart::Loop, Some(&ready)));
    }

    #[test]
    fn the_report_keeps_the_start_of_the_message_printable() {
        let long = format!("{FAIL}{}", "\u{1}".repeat(10_000));
        let reported = report(
            HostileChart::FailHuge,
            Some(&failed(&long, true)),
            Some(1.5),
        );
        assert!(reported.names_failure);
        assert_eq!(reported.stalled.as_deref(), Some("True"));
        assert_eq!(reported.ready_reason.as_deref(), Some("RenderError"));
        assert_eq!(reported.state.as_deref(), Some("Error"));
        assert!(reported.message.starts_with("render: helm template failed"));
        let quoted = report(HostileChart::Memory, Some(&failed(MEMORY, true)), None);
        assert_eq!(quoted.message, MEMORY, "printable text is kept as it is");
        assert!(!reported.message.contains('\u{1}'), "{}", reported.message);
        assert!(reported.message.len() < 6 * MESSAGE_KEPT);
        let none = report(HostileChart::Loop, None, None);
        assert!(!none.names_failure);
        assert_eq!(none.message, "");
    }

    fn arm(repeat: u32, hostile: Option<&str>, p99: Option<f64>) -> HostileArm {
        HostileArm {
            repeat,
            hostile: hostile.map(str::to_owned),
            innocents: 3,
            innocents_ready: 3,
            create_to_ready_seconds: Quantiles {
                p99,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn ratios_are_against_the_same_repeats_arm_without_a_hostile_chart() {
        let mut arms = vec![
            arm(1, None, Some(2.0)),
            arm(1, Some("loop"), Some(3.0)),
            arm(2, None, Some(4.0)),
            arm(2, Some("loop"), Some(3.0)),
            arm(2, Some("memory"), None),
            arm(3, Some("loop"), Some(3.0)),
        ];
        set_ratios(&mut arms);
        let ratios: Vec<Option<f64>> = arms.iter().map(|a| a.p99_over_no_hostile).collect();
        assert_eq!(
            ratios,
            [Some(1.0), Some(1.5), Some(1.0), Some(0.75), None, None]
        );
    }

    #[test]
    fn an_innocent_not_ready_or_a_hostile_status_without_its_failure_fails_the_run() {
        let mut healthy = arm(1, Some("memory"), Some(1.0));
        healthy.hostile_status = Some(report(
            HostileChart::Memory,
            Some(&failed(MEMORY, true)),
            Some(0.5),
        ));
        assert!(violations(&healthy, 60).is_empty());

        let mut stuck = healthy.clone();
        stuck.innocents_ready = 2;
        stuck.not_ready = vec!["b000002 (Some(Error), …)".into()];
        stuck.hostile_status = Some(report(
            HostileChart::Memory,
            Some(&failed("render: renderer stopped: exit status 2", false)),
            None,
        ));
        stuck.not_deleted = vec!["h-memory".into()];
        let found = violations(&stuck, 60);
        let checkers: Vec<&str> = found.iter().map(|v| v.checker.as_str()).collect();
        assert_eq!(
            checkers,
            ["not-converged", "not-converged", "hostile-status"]
        );
        assert!(
            found[0].detail.contains("repeat 1, beside memory: 1 of 3"),
            "{}",
            found[0].detail
        );
        assert!(found[0].detail.contains("b000002"));
        assert!(
            found[2].detail.contains("renderer stopped"),
            "{}",
            found[2].detail
        );
    }
}
