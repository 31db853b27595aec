//! [`FetchError`]: why a remote chart could not be fetched, and whether trying again may help.

use std::time::Duration;

use super::credentials::CredentialsError;
use super::reach::Refusal;
use super::verify::VerifyError;
use crate::source::ContentError;

/// Why a remote chart could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// the URL or reference in the spec is unusable.
    #[error("{0}")]
    Reference(String),
    /// the host could not be reached or did not answer in time: refused, reset, DNS, TLS, a
    /// timeout and an answer that is not HTTP all read the same (the cause is logged at debug),
    /// so that a Manifest's status cannot map which internal ports are open.
    #[error("{host} could not be reached or did not answer in time")]
    Unreachable {
        /// `host[:port]` of the request that failed.
        host: String,
    },
    /// the repository or registry refused the request (401, 403): credentials are missing or
    /// wrong. Never quotes them.
    #[error("{}", unauthorized(host, *status, *sent))]
    Unauthorized {
        /// `host[:port]` that refused.
        host: String,
        /// The HTTP status.
        status: u16,
        /// Whether credentials were sent with the request.
        sent: bool,
    },
    /// the credentials of `spec.chart.secretRef` do not fit the source.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// the request was not sent: its host or scheme is not allowed.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// the server answered with an error status.
    #[error("{url} answered HTTP {status}")]
    Status {
        /// The URL, without credentials or query.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// the fetch did not finish in time.
    #[error("the fetch did not finish within {0:?}")]
    Timeout(Duration),
    /// a download exceeds its limit.
    #[error("{what} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// What was downloaded.
        what: String,
        /// The limit.
        limit: u64,
    },
    /// `index.yaml` is not a Helm repository index.
    #[error("malformed index.yaml: {0}")]
    BadIndex(String),
    /// the repository does not have the chart.
    #[error("the repository has no chart {name:?} (it has {available})")]
    NoChart {
        /// The chart asked for.
        name: String,
        /// Some of the charts it has.
        available: String,
    },
    /// no version of the chart matches.
    #[error("no version matches {requested:?} (available: {available})")]
    NoVersion {
        /// The version or range asked for.
        requested: String,
        /// The newest versions there are.
        available: String,
    },
    /// the version is neither one in the index nor a valid constraint.
    #[error("version {requested:?} is not a version of the chart nor a valid range: {reason}")]
    BadVersion {
        /// The version or range asked for.
        requested: String,
        /// What is wrong with it.
        reason: String,
    },
    /// a digest is missing or not a sha256 digest.
    #[error("{0}")]
    BadDigest(String),
    /// the downloaded bytes do not have the published digest.
    #[error("digest mismatch: expected sha256:{expected}, downloaded sha256:{actual}")]
    DigestMismatch {
        /// The published digest.
        expected: String,
        /// The digest of what was downloaded.
        actual: String,
    },
    /// the OCI artifact is not a Helm chart.
    #[error("{0}")]
    MediaType(String),
    /// the registry refused or failed.
    #[error("registry: {message}")]
    Registry {
        /// What the registry said (bounded).
        message: String,
        /// Whether trying again may help.
        transient: bool,
    },
    /// the archive failed the chart checks.
    #[error(transparent)]
    Chart(ContentError),
    /// the chart's signature was not accepted (`spec.chart.verify`).
    #[error("signature verification failed: {0}")]
    Verification(#[from] VerifyError),
    /// storing the archive would take the chart cache past its cap.
    #[error(
        "the chart cache cannot take a {needed}-byte archive: its cap is {limit} bytes \
         (--chart-cache-max-bytes), {in_use} of them held by charts used in the last 10 minutes"
    )]
    CacheFull {
        /// Bytes of the archive (and of its list of fetchers, 65 a fetcher).
        needed: u64,
        /// Bytes of cached files that may not be evicted yet.
        in_use: u64,
        /// The cap.
        limit: u64,
    },
    /// the chart cache could not be read or written.
    #[error("chart cache {path}: {error}")]
    Cache {
        /// The file.
        path: String,
        /// The error.
        error: std::io::Error,
    },
}

impl FetchError {
    /// Bad input waits for a spec change; an unreachable or failing server is retried.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::Timeout(_) | Self::Cache { .. } => false,
            // Files in use age out; an archive larger than the whole cache never fits.
            Self::CacheFull { needed, limit, .. } => needed > limit,
            Self::Status { status, .. } => !(*status >= 500 || *status == 429 || *status == 408),
            Self::Registry { transient, .. } => !transient,
            _ => true,
        }
    }
}

/// What a 401 or 403 reads as: the host and what to check, never the credentials.
fn unauthorized(host: &str, status: u16, sent: bool) -> String {
    if sent {
        format!("authentication to {host} failed (HTTP {status}): check spec.chart.secretRef")
    } else {
        format!(
            "{host} asks for credentials (HTTP {status}): set spec.chart.secretRef (credentials \
             are sent only to the repository's or registry's own host)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_and_permanent_errors() {
        let status = |status| FetchError::Status {
            url: "u".into(),
            status,
        };
        assert!(!status(503).is_permanent());
        assert!(!status(429).is_permanent());
        assert!(status(404).is_permanent());
        assert!(!FetchError::Timeout(Duration::from_secs(1)).is_permanent());
        assert!(!FetchError::Unreachable { host: "h".into() }.is_permanent());
        let refused = Refusal::PlainHttp { url: "u".into() };
        assert!(FetchError::Refused(refused).is_permanent());
        let full = |needed| FetchError::CacheFull {
            needed,
            in_use: 90,
            limit: 100,
        };
        assert!(!full(20).is_permanent(), "files in use age out");
        assert!(full(101).is_permanent(), "never fits");
        assert!(!status(408).is_permanent());
        assert!(
            FetchError::DigestMismatch {
                expected: "a".into(),
                actual: "b".into()
            }
            .is_permanent()
        );
        assert!(FetchError::MediaType("x".into()).is_permanent());
    }
}
