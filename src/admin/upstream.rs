//! Calls from the admin API to the API server: a permit per call (at most [`MAX_API_CALLS`] at
//! once per pool: the drain switch's own, and the reads') and a timeout.

use std::future::Future;
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::Semaphore;

/// Limit on each call to the API server (TokenReview, SubjectAccessReview, Manifest lookup).
pub const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Most API server calls the admin API makes at once; beyond it callers get `429`.
pub const MAX_API_CALLS: usize = 16;

/// The permits of the drain switch's reviews: callers of the other endpoints (anyone who can
/// reach the port, token or not) never take one, so they cannot keep an operator from draining.
static DRAIN_CALLS: Semaphore = Semaphore::const_new(MAX_API_CALLS);
/// The permits of every other endpoint's calls (reviews and Manifest lookups).
static READ_CALLS: Semaphore = Semaphore::const_new(MAX_API_CALLS);

/// Which permits a call takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    /// `POST`/`DELETE /v1/drain`.
    Drain,
    /// The read endpoints.
    Reads,
}

/// A permit for one API server call (request or review) from `pool`; `429` when
/// [`MAX_API_CALLS`] of that pool run.
pub(super) fn api_permit(
    pool: Pool,
) -> Result<tokio::sync::SemaphorePermit<'static>, (StatusCode, String)> {
    let permits = match pool {
        Pool::Drain => &DRAIN_CALLS,
        Pool::Reads => &READ_CALLS,
    };
    permits.try_acquire().map_err(|_| {
        (
            StatusCode::TOO_MANY_REQUESTS,
            "too many admin requests are waiting for the API server; retry shortly".to_owned(),
        )
    })
}

/// Runs one API server call within [`API_TIMEOUT`]: `504` when it does not answer in time, `502`
/// with the error when it fails.
pub(super) async fn api_call<T>(
    what: &str,
    call: impl Future<Output = kube::Result<T>>,
) -> Result<T, (StatusCode, String)> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => {
            tracing::warn!("admin API: {what}: {e}");
            Err((StatusCode::BAD_GATEWAY, format!("{what}: {e}")))
        }
        Err(_) => Err((
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "{what}: the API server did not answer within {} s",
                API_TIMEOUT.as_secs()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads that take every permit of their pool (a flood of requests with bogus tokens) leave
    /// the drain switch's reviews theirs.
    #[test]
    fn reads_cannot_take_the_drain_switchs_permits() {
        let mut held = Vec::new();
        while let Ok(permit) = api_permit(Pool::Reads) {
            held.push(permit);
        }
        assert!(!held.is_empty());
        let (status, _) = api_permit(Pool::Reads).unwrap_err();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(api_permit(Pool::Drain).is_ok());
    }
}
