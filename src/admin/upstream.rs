//! Calls from the admin API to the API server: a permit per call (at most [`MAX_API_CALLS`] at
//! once) and a timeout.

use std::future::Future;

use axum::http::StatusCode;
use tokio::sync::Semaphore;

use super::{API_TIMEOUT, MAX_API_CALLS};

static API_CALLS: Semaphore = Semaphore::const_new(MAX_API_CALLS);

/// A permit for one API server call (request or review); `429` when [`MAX_API_CALLS`] run.
pub(super) fn api_permit() -> Result<tokio::sync::SemaphorePermit<'static>, (StatusCode, String)> {
    API_CALLS.try_acquire().map_err(|_| {
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
