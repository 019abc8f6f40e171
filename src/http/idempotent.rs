//! The HTTP side of idempotency keys (src/idempotency.rs): the
//! `Idempotency-Key` header, and an answer as recorded and as replayed
//! (`Idempotent-Replayed: true`).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, Code};
use super::metrics::OutcomeLabel;
use crate::idempotency::{Answer, IdempotencyKey, Scope};

pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// A request's idempotency key, if it sent one, and whose it is (its API
/// key's, or the shared scope of callers without one).
pub struct Idempotency(pub Option<(IdempotencyKey, Scope)>);

impl<S: Send + Sync> FromRequestParts<S> for Idempotency {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let mut sent = parts.headers.get_all(&IDEMPOTENCY_KEY).iter();
        let Some(value) = sent.next() else {
            return Ok(Idempotency(None));
        };
        if sent.next().is_some() {
            return Err(invalid("Idempotency-Key is sent more than once"));
        }
        let text = value
            .to_str()
            .map_err(|_| invalid("Idempotency-Key holds printable ASCII characters only"))?;
        let key =
            IdempotencyKey::parse(text).map_err(|e| invalid(&format!("Idempotency-Key: {e}")))?;
        let scope = parts
            .extensions
            .get::<Scope>()
            .cloned()
            .unwrap_or(Scope::Shared);
        Ok(Idempotency(Some((key, scope))))
    }
}

fn invalid(detail: &str) -> ApiError {
    ApiError::new(Code::InvalidHeader, detail)
}

/// An answer as the route gives it: JSON with its status, `Retry-After`
/// where the status asks for a retry, and `Idempotent-Replayed: true` when
/// it is an earlier request's.
pub fn respond(answer: Answer, replayed: bool, outcome: &'static str) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    let mut response = (status, answer.body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    let label = if replayed { "replayed" } else { outcome };
    response.extensions_mut().insert(OutcomeLabel(label));
    response
}

/// The key was used for another request.
pub fn reused() -> ApiError {
    ApiError::new(
        Code::IdempotencyKeyReused,
        "this Idempotency-Key was used for another request (another body or path): nothing was done; use a new key for a new request",
    )
}

/// An earlier request with the key is still being answered.
pub fn in_flight() -> ApiError {
    ApiError::new(
        Code::IdempotencyKeyInFlight,
        "a request with this Idempotency-Key is still being answered: nothing was done; send it again in a moment",
    )
}
