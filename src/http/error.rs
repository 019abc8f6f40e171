//! One error type for every route: each variant is one status, and the body
//! is one JSON object with a one-line `error`. Internal errors are logged,
//! never sent to the client as more than a line without secrets.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::BoxError;
use serde_json::json;

#[derive(Debug)]
pub enum ApiError {
    /// Bad input: malformed JSON, a wrong content type, an id out of range.
    BadRequest(String),
    /// No key, or not one of ours.
    Unauthorized,
    /// The request did not arrive in time (its body): nothing was done.
    RequestTimeout(String),
    NotFound(String),
    /// Too many requests in flight, or a store that did not answer in time
    /// before anything was sent.
    Unavailable(String),
    /// A purchase whose Redis call may or may not have run: never told as a
    /// refusal. A retry is safe (one order per user).
    Unknown(String),
    /// A store failed where nothing was written for the caller.
    Internal(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = match self {
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, json!({ "error": m })),
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                json!({ "error": "a valid API key is required (Authorization: Bearer <key>)" }),
            ),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, json!({ "error": m })),
            ApiError::RequestTimeout(m) => (StatusCode::REQUEST_TIMEOUT, json!({ "error": m })),
            ApiError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, json!({ "error": m })),
            ApiError::Unknown(m) => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "outcome": "unknown", "error": m }),
            ),
            ApiError::Internal(m) => {
                tracing::warn!("request failed: {m}");
                (StatusCode::SERVICE_UNAVAILABLE, json!({ "error": m }))
            }
        };
        let unknown = body.get("outcome").is_some();
        let mut response = (status, axum::Json(body)).into_response();
        if unknown {
            response
                .extensions_mut()
                .insert(super::metrics::OutcomeLabel("unknown"));
        }
        let headers = response.headers_mut();
        match status {
            StatusCode::UNAUTHORIZED => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            // The rest of the body may still come: the connection is not
            // reused for another request.
            StatusCode::REQUEST_TIMEOUT => {
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}

impl From<crate::error::Error> for ApiError {
    fn from(e: crate::error::Error) -> Self {
        match e {
            crate::error::Error::InvalidInput(m) | crate::error::Error::QuantityRefused(m) => {
                ApiError::BadRequest(m)
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// Answer for a path no route knows.
pub async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

/// What the limits in front of the router turn into: 503 at once past the
/// in-flight cap or the backstop timeout (counted: the router's own
/// metrics never saw these requests).
pub fn overloaded(state: &super::AppState, e: BoxError) -> Response {
    let (outcome, answer) = if e.is::<tower::timeout::error::Elapsed>() {
        (
            "unknown",
            ApiError::Unknown("the request took too long; its outcome is unknown: retry it".into()),
        )
    } else if e.is::<tower::load_shed::error::Overloaded>() {
        (
            "overloaded",
            ApiError::Unavailable("too many requests in flight; retry in a moment".into()),
        )
    } else {
        ("-", ApiError::Internal(format!("request failed: {e}")))
    };
    state.metrics.refused(outcome);
    answer.into_response()
}
