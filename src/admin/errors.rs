//! Error answers: one status and `{"error": message}` for every refusal of the admin API.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::answers::ErrorAnswer;

/// An error answer: a status, `{"error": message}` and the seconds of a `Retry-After` header
/// (`401` adds `WWW-Authenticate: Bearer`).
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String, pub Option<u64>);

impl From<(StatusCode, String)> for ApiError {
    fn from((status, message): (StatusCode, String)) -> Self {
        Self(status, message, None)
    }
}

impl From<(StatusCode, String, u64)> for ApiError {
    fn from((status, message, retry_after): (StatusCode, String, u64)) -> Self {
        Self(status, message, Some(retry_after))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.0, Json(ErrorAnswer { error: self.1 })).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.2 {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// An error answer with `status` and `message`.
pub(super) fn error(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError(status, message.into(), None)
}
