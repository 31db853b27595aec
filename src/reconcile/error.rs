//! Errors of a pass: one variant per pipeline step, with its category and permanence.

use crate::apply::ApplyError;
use crate::apply::target::TargetError;
use crate::plan::PlanError;
use crate::plan::dependencies::DependencyError;
use crate::plan::tenancy::{IdentityError, ProtectedError};
use crate::render::RenderError;
use crate::render::values::ValuesError;
use crate::shard::fence::FenceLost;
use crate::source::{CredentialsError, SourceError};
use crate::telemetry::events::{MESSAGE_LIMIT, shorten};

/// Why a pass failed, by the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// the Manifest could not be read at the start of the pass.
    #[error("read the Manifest: kubernetes API: {0}")]
    ReadManifest(#[source] kube::Error),
    /// the chart could not be resolved.
    #[error("resolve the chart: {0}")]
    ResolveChart(#[from] SourceError),
    /// the Secret of `spec.chart.secretRef` could not be read.
    #[error("read the chart's credentials Secret {name}: kubernetes API: {source}")]
    ReadChartSecret {
        /// The Secret's name.
        name: String,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// the Secret of `spec.chart.secretRef` is missing or holds no usable credentials.
    #[error("resolve the chart: {0}")]
    ChartCredentials(#[from] CredentialsError),
    /// a values source (ConfigMap or Secret) could not be read.
    #[error("read the values source {what}: kubernetes API: {source}")]
    ReadValuesSource {
        /// The source, as `Kind name`.
        what: String,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// a values source is missing, or lacks its key.
    #[error("values source: {0}")]
    ValuesSourceMissing(String),
    /// the Secret or ConfigMap holding `spec.chart.verify`'s keys could not be read.
    #[error("read the verification keys {what}: kubernetes API: {source}")]
    ReadVerificationKeys {
        /// The object, as `Kind name`.
        what: String,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// the Secret or ConfigMap holding `spec.chart.verify`'s keys is missing.
    #[error("verification keys: {0}")]
    VerificationKeysMissing(String),
    /// a values document is not a YAML map.
    #[error("parse values: {0}")]
    ParseValues(#[from] ValuesError),
    /// helm failed.
    #[error("render: {0}")]
    Render(#[from] RenderError),
    /// the rendered documents are unusable.
    #[error("plan: {0}")]
    Plan(#[from] PlanError),
    /// the Manifest cannot be reconciled under the operator's ServiceAccount flags.
    #[error("identity: {0}")]
    Identity(#[from] IdentityError),
    /// the render writes what no module may write (the operator's namespace, fleet Leases).
    #[error("plan: {0}")]
    Protected(#[from] ProtectedError),
    /// the target cluster cannot be used (Secret, kubeconfig, connection).
    #[error("target: {0}")]
    Target(#[from] TargetError),
    /// the kubeconfig Secret of the target could not be read.
    #[error("read the target's kubeconfig Secret: kubernetes API: {0}")]
    ReadTargetSecret(#[source] kube::Error),
    /// applying, reading or deleting an object failed.
    #[error("apply: {0}")]
    Apply(#[from] ApplyError),
    /// a Job of the module failed (its readiness says so).
    #[error("readiness: {0}")]
    JobFailed(String),
    /// a hook failed or timed out: the operation stops.
    #[error("{0}")]
    HookFailed(String),
    /// the Manifest's status could not be written.
    #[error("write the status: kubernetes API: {0}")]
    WriteStatus(#[source] kube::Error),
    /// the Manifest's metadata (finalizer, shard label) could not be written.
    #[error("write the metadata: kubernetes API: {0}")]
    WriteMetadata(#[source] kube::Error),
    /// the dependencies (`spec.dependsOn`) cannot be waited for (a cycle, a refused namespace).
    #[error("dependencies: {0}")]
    Dependency(#[from] DependencyError),
    /// a dependency (another Manifest) could not be read, or its dependents listed.
    #[error("read the dependency {what}: kubernetes API: {source}")]
    ReadDependency {
        /// The dependency (`namespace/name`) or the list, as said.
        what: String,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// the label `modulemanager.io/depended-on` could not be stamped on a dependency.
    #[error("label the dependency {what}: kubernetes API: {source}")]
    LabelDependency {
        /// The dependency, `namespace/name`.
        what: String,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// the rollout object of the Manifest's rollout group could not be read or written, or the
    /// group's Manifests listed.
    #[error("rollout: {what}: kubernetes API: {source}")]
    Rollout {
        /// What was asked (`read ConfigMap ns/name`, `list the group's Manifests`, …).
        what: String,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// the pass ran past `--pass-deadline-seconds` and was stopped (retried with backoff).
    #[error(
        "the pass did not finish within {} s (--pass-deadline-seconds) and was stopped; it is retried",
        .0.as_secs()
    )]
    PassDeadline(std::time::Duration),
    /// this replica lost the Manifest's shard during the pass: it stops writing at once.
    #[error(transparent)]
    Fenced(#[from] FenceLost),
}

impl ReconcileError {
    /// The error as a log line: helm's own message is left out (a chart's `fail`/`required`
    /// text may carry values, secrets among them; it goes to the Manifest's status and Event
    /// only, which whoever may read the Manifest may read), the rest shortened to
    /// [`MESSAGE_LIMIT`] bytes.
    pub fn for_log(&self) -> String {
        match self {
            Self::Render(RenderError::Helm(message)) => format!(
                "render: helm template failed (its message, {} bytes, is in the Manifest's status, not logged)",
                message.len()
            ),
            other => shorten(&other.to_string(), MESSAGE_LIMIT).into_owned(),
        }
    }

    /// The static category: the only thing used as a metric label or Event reason.
    pub fn category(&self) -> &'static str {
        match self {
            Self::ResolveChart(e) if e.is_unverified() => "ChartUnverified",
            Self::VerificationKeysMissing(_) => "ChartUnverified",
            Self::ResolveChart(_) | Self::ChartCredentials(_) => "ChartError",
            Self::ValuesSourceMissing(_) | Self::ParseValues(_) => "ValuesError",
            Self::Render(_) => "RenderError",
            Self::Plan(_) => "PlanError",
            Self::Identity(_) | Self::Protected(_) => "TenancyError",
            Self::Apply(_) => "ApplyError",
            Self::JobFailed(_) => "JobFailed",
            Self::HookFailed(_) => "HookFailed",
            Self::ReadManifest(_)
            | Self::ReadValuesSource { .. }
            | Self::ReadChartSecret { .. }
            | Self::ReadVerificationKeys { .. }
            | Self::ReadTargetSecret(_)
            | Self::WriteStatus(_)
            | Self::WriteMetadata(_)
            | Self::ReadDependency { .. }
            | Self::LabelDependency { .. }
            | Self::Rollout { .. } => "KubeError",
            Self::Dependency(e) => e.category(),
            Self::Fenced(_) => "Fenced",
            Self::PassDeadline(_) => "PassDeadline",
            Self::Target(e) => e.category(),
        }
    }

    /// Permanent errors (bad input) wait for a spec change; the rest back off and retry.
    pub fn is_permanent(&self) -> bool {
        match self {
            // A kind the target does not serve (yet) may appear: its CRD may be installed later.
            Self::Plan(PlanError::UnknownKind(_)) => false,
            // An unreachable repository or registry is retried; bad charts are not.
            Self::ResolveChart(e) => e.is_permanent(),
            Self::ParseValues(_) | Self::Plan(_) | Self::JobFailed(_) | Self::HookFailed(_) => true,
            // A missing or unusable credentials Secret waits for a change (the watch of
            // labelled Secrets brings it at once) or the interval.
            Self::ChartCredentials(_) => true,
            Self::Identity(_) | Self::Protected(_) | Self::Dependency(_) => true,
            Self::Render(e) => e.is_permanent(),
            Self::Target(e) => e.is_permanent(),
            Self::Apply(e) => e.is_permanent(),
            Self::ValuesSourceMissing(_)
            | Self::VerificationKeysMissing(_)
            | Self::ReadVerificationKeys { .. }
            | Self::ReadManifest(_)
            | Self::ReadValuesSource { .. }
            | Self::ReadChartSecret { .. }
            | Self::ReadTargetSecret(_)
            | Self::WriteStatus(_)
            | Self::WriteMetadata(_)
            | Self::ReadDependency { .. }
            | Self::LabelDependency { .. }
            | Self::Rollout { .. }
            | Self::PassDeadline(_)
            | Self::Fenced(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helm_messages_are_not_logged_and_others_are_shortened() {
        let message = "execution error at (x/templates/a.yaml:1:3): password hunter2 is too short";
        let secret = ReconcileError::Render(RenderError::Helm(message.into()));
        let line = secret.for_log();
        assert!(!line.contains("hunter2"), "{line}");
        assert!(line.contains(&format!("{} bytes", message.len())), "{line}");
        assert_eq!(secret.category(), "RenderError");
        let long =
            ReconcileError::HookFailed(format!("hook x failed: {}the cause", "y".repeat(9000)));
        let line = long.for_log();
        assert!(
            line.len() <= MESSAGE_LIMIT && line.ends_with("the cause"),
            "{line}"
        );
        let timeout =
            ReconcileError::Render(RenderError::Timeout(std::time::Duration::from_secs(3)));
        assert_eq!(timeout.for_log(), timeout.to_string());
    }

    #[test]
    fn unknown_kinds_are_retried_and_bad_charts_are_not() {
        assert!(!ReconcileError::Plan(PlanError::UnknownKind("Widget/w".into())).is_permanent());
        assert!(ReconcileError::Plan(PlanError::Duplicate("Secret/s".into())).is_permanent());
        assert_eq!(
            ReconcileError::ValuesSourceMissing("x".into()).category(),
            "ValuesError"
        );
        // A repository that does not answer is retried; a bad chart from it is not.
        let fetch = |error| {
            ReconcileError::ResolveChart(SourceError::Fetch {
                origin: "chart web 1.0.0 from http://charts.example.com".into(),
                error,
            })
        };
        let unreachable = fetch(crate::source::FetchError::Unreachable {
            host: "charts.example.com".into(),
        });
        assert!(!unreachable.is_permanent());
        assert_eq!(unreachable.category(), "ChartError");
        let mismatch = fetch(crate::source::FetchError::DigestMismatch {
            expected: "a".into(),
            actual: "b".into(),
        });
        assert!(mismatch.is_permanent());
        // A refused signature has its own reason; missing keys may still appear.
        let unverified = fetch(crate::source::FetchError::Verification(
            crate::source::VerifyError::KeyMismatch("Secret k".into()),
        ));
        assert!(unverified.is_permanent());
        assert_eq!(unverified.category(), "ChartUnverified");
        let missing = ReconcileError::VerificationKeysMissing("Secret k does not exist".into());
        assert!(!missing.is_permanent());
        assert_eq!(missing.category(), "ChartUnverified");
    }

    #[test]
    fn messages_name_the_step_and_keep_the_cause() {
        let missing = ReconcileError::ValuesSourceMissing("Secret absent does not exist".into());
        assert_eq!(
            missing.to_string(),
            "values source: Secret absent does not exist"
        );
        let plan = ReconcileError::Plan(PlanError::Duplicate("Secret/s".into()));
        assert!(plan.to_string().starts_with("plan: "), "{plan}");
        assert!(plan.to_string().contains("Secret/s"), "{plan}");
    }
}
