//! [`SourceError`]: why a chart could not be resolved, local or remote.

use super::chart::ContentError;
use super::remote::FetchError;

/// Why a chart could not be resolved. All but some remote fetch errors are bad input: they wait
/// for a spec change (see [`SourceError::is_permanent`]).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// the chart path does not exist.
    #[error("chart path {0:?} does not exist")]
    NotFound(String),
    /// the chart path leaves the chart root.
    #[error("chart path {path:?} is outside the chart root {root}")]
    OutsideRoot {
        /// The path from the spec.
        path: String,
        /// The configured root.
        root: String,
    },
    /// the chart's files fail a check, or could not be read.
    #[error(transparent)]
    Chart(#[from] ContentError),
    /// not one local path: a remote source
    /// ([`RemoteCharts::resolve`](super::RemoteCharts::resolve) fetches those), or not exactly
    /// one source.
    #[error("{0}")]
    Unsupported(&'static str),
    /// a chart from a repository or registry could not be fetched or failed a check.
    #[error("{origin}: {error}")]
    Fetch {
        /// Which chart from where (URLs without credentials or query).
        origin: String,
        /// What went wrong.
        error: FetchError,
    },
}

impl SourceError {
    /// Bad input (waits for a spec change) as opposed to an unreachable or failing server
    /// (retried with backoff).
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Fetch { error, .. } => error.is_permanent(),
            _ => true,
        }
    }

    /// The chart's signature was not accepted (`spec.chart.verify`).
    pub fn is_unverified(&self) -> bool {
        matches!(
            self,
            Self::Fetch {
                error: FetchError::Verification(_),
                ..
            }
        )
    }
}
