//! One error type for every route. An answer that is not an outcome (a
//! purchase's or a payment's) is a problem (RFC 9457,
//! `application/problem+json`) with a stable machine-readable `code`, one
//! per failure kind (docs/src/reference/http-errors.md), a bounded
//! `detail` that names the field at fault but no internals, and the
//! request's id, which is also on the log line that carries the cause.

pub use super::problem::{problem_body, Code, PROBLEM_JSON};
use super::request_id;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::BoxError;

/// What a route answers when it does not answer its resource.
#[derive(Debug)]
pub struct ApiError {
    pub code: Code,
    /// One line for the caller: names the field at fault, holds no input
    /// beyond a short excerpt and no store's text.
    pub detail: String,
}

/// A detail is one line of at most this many characters.
const MAX_DETAIL: usize = 200;

/// Input quoted in a detail is cut to this many characters.
const MAX_QUOTE: usize = 24;

impl ApiError {
    pub fn new(code: Code, detail: impl Into<String>) -> ApiError {
        ApiError {
            code,
            detail: one_line(&detail.into()),
        }
    }

    pub fn invalid_id(detail: impl Into<String>) -> ApiError {
        ApiError::new(Code::InvalidId, detail)
    }

    pub fn invalid_field(detail: impl Into<String>) -> ApiError {
        ApiError::new(Code::InvalidField, detail)
    }

    pub fn invalid_body(detail: impl Into<String>) -> ApiError {
        ApiError::new(Code::InvalidBody, detail)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            Code::Unauthorized,
            "a valid API key is required (Authorization: Bearer <key>)",
        )
    }

    /// A store failed: the cause goes to the log (with the request's id),
    /// the caller learns whether a retry can succeed.
    pub fn store(e: &crate::error::Error) -> ApiError {
        if e.may_heal_by_itself() {
            tracing::warn!("{e}");
            ApiError::new(
                Code::StoreUnavailable,
                format!(
                    "{} did not answer; nothing was done: retry in a moment",
                    store_name(e)
                ),
            )
        } else {
            tracing::error!("{e}");
            ApiError::new(
                Code::ServerFault,
                format!(
                    "{} refused the request in a way a retry does not mend; the operators find the cause in the log under this request's id",
                    store_name(e)
                ),
            )
        }
    }
}

fn store_name(e: &crate::error::Error) -> &'static str {
    use crate::error::Error;
    match e {
        Error::Mysql { .. } | Error::MysqlConnect { .. } => "MySQL",
        Error::Redis { .. } | Error::RedisConnect { .. } => "Redis",
        _ => "a store",
    }
}

/// The text as one line of at most [`MAX_DETAIL`] characters.
fn one_line(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    cut(&flat, MAX_DETAIL)
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// A body's JSON text as shown in a detail (already quoted when a
/// string): cut short as [`quote`] cuts.
pub fn excerpt(json_text: &str) -> String {
    let chars = json_text.chars().count();
    match chars > MAX_QUOTE {
        true => format!("{} ({chars} characters)", cut(json_text, MAX_QUOTE)),
        false => json_text.to_string(),
    }
}

/// Caller input as quoted in a detail: cut short, so a long input does not
/// come back in full.
pub fn quote(input: &str) -> String {
    let chars = input.chars().count();
    match chars > MAX_QUOTE {
        true => format!("{:?} ({chars} characters)", cut(input, MAX_QUOTE)),
        false => format!("{input:?}"),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let id = request_id::current();
        let body = problem_body(self.code, &self.detail, id.as_deref());
        let status = self.code.status();
        let mut response = (status, body.to_string()).into_response();
        if self.code == Code::OutcomeUnknown {
            response
                .extensions_mut()
                .insert(super::metrics::OutcomeLabel("unknown"));
        }
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if self.code.retry_can_succeed() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        match status {
            StatusCode::UNAUTHORIZED => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            // The rest of the body may still come: the connection is not
            // reused for another request.
            StatusCode::REQUEST_TIMEOUT => {
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        response
    }
}

impl From<crate::error::Error> for ApiError {
    fn from(e: crate::error::Error) -> Self {
        use crate::error::Error;
        match e {
            Error::InvalidInput(m) | Error::QuantityRefused(m) => {
                ApiError::invalid_field(m.trim_start_matches("invalid input: "))
            }
            Error::VoucherNotLoaded(v) => ApiError::new(
                Code::VoucherNotLoaded,
                format!("voucher {v} is not loaded at the gate"),
            ),
            other => ApiError::store(&other),
        }
    }
}

/// Answer for a path no route knows.
pub async fn not_found() -> ApiError {
    ApiError::new(Code::NoSuchRoute, "no such route")
}

/// Answer for a route asked with a method it does not take (axum adds
/// `Allow`).
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        Code::MethodNotAllowed,
        "this route does not take this method (see Allow)",
    )
}

/// What the limits in front of the router turn into: 503 at once past the
/// in-flight cap or the backstop timeout (counted: the router's own
/// metrics never saw these requests). A purchase or a payment past the
/// backstop may have been done: its outcome is unknown; any other request
/// changed nothing a retry cannot redo.
pub fn overloaded(state: &super::AppState, changes: bool, e: BoxError) -> Response {
    let (outcome, answer) = if e.is::<tokio::time::error::Elapsed>() && changes {
        (
            "unknown",
            ApiError::new(
                Code::OutcomeUnknown,
                "the request took too long; its outcome is unknown: retry it",
            ),
        )
    } else if e.is::<tokio::time::error::Elapsed>() {
        (
            "unanswered",
            ApiError::new(
                Code::StoreUnavailable,
                "the request took too long (a store did not answer); retry in a moment",
            ),
        )
    } else if e.is::<tower::load_shed::error::Overloaded>() {
        (
            "overloaded",
            ApiError::new(
                Code::Overloaded,
                "too many requests in flight; retry in a moment",
            ),
        )
    } else {
        tracing::error!("request failed: {e}");
        (
            "-",
            ApiError::new(Code::ServerFault, "the request failed inside the server"),
        )
    };
    state.metrics.refused(outcome);
    answer.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_a_retry_is_promised_only_where_it_can_succeed() {
        let names: std::collections::BTreeSet<&str> =
            Code::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), Code::ALL.len());
        for c in Code::ALL {
            let retry = c.retry_can_succeed();
            // A request in flight with the same idempotency key (409) is
            // over in a moment too.
            let over_in_a_moment = c.status() == StatusCode::SERVICE_UNAVAILABLE
                && c != Code::ServerFault
                || c == Code::IdempotencyKeyInFlight;
            assert_eq!(retry, over_in_a_moment, "{c:?}");
        }
    }

    #[test]
    fn details_are_one_bounded_line_and_quotes_are_short() {
        let long = "x".repeat(7_000);
        let e = ApiError::invalid_id(format!("voucher must be an id, not {}", quote(&long)));
        assert!(e.detail.chars().count() <= MAX_DETAIL + 1, "{}", e.detail);
        assert!(e.detail.contains("(7000 characters)"));
        assert_eq!(one_line("a\nb\rc"), "a b c");
        assert_eq!(quote("08"), "\"08\"");
        assert_eq!(excerpt("\"+900010\""), "\"+900010\"");
        assert!(excerpt(&"9".repeat(99)).ends_with("… (99 characters)"));
    }
}
