//! What a problem (RFC 9457) is made of: the failure kinds with their
//! stable codes, statuses and titles, and the body every answer that is
//! not an outcome carries (docs/src/reference/http-errors.md). Apart from
//! the routes' error type (error.rs) so that the connection cap, which
//! answers before any route, builds the same body.

use axum::http::StatusCode;
use serde_json::json;

/// A failure kind: its code, status and title are the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The body is not a JSON object of the documented fields (malformed,
    /// not JSON, too large, a field unknown, missing or of the wrong type).
    InvalidBody,
    /// An id (path or body) is not one plain decimal 1..=2^63-1.
    InvalidId,
    /// A field's value is out of its range (quantity, ttl_ms, token).
    InvalidField,
    /// A header's value is not what the route takes (Idempotency-Key).
    InvalidHeader,
    /// No key, or not one of the server's.
    Unauthorized,
    /// The key may not call this route (its scopes).
    InsufficientScope,
    NoSuchRoute,
    /// The route exists, not with this method (`Allow` lists those it has).
    MethodNotAllowed,
    OrderNotFound,
    VoucherNotLoaded,
    /// The body did not arrive in time: nothing was done.
    BodyTimeout,
    /// Past `--max-in-flight`: refused at once, nothing done.
    Overloaded,
    /// Past `--max-connections` with every connection busy.
    TooManyConnections,
    /// Redis or MySQL did not answer, before anything was written for the
    /// caller: a retry can succeed.
    StoreUnavailable,
    /// A purchase whose call to the gate may or may not have run: retry it
    /// (one order per user: a retry answers already_bought if it did).
    OutcomeUnknown,
    /// The idempotency key was used before for another request (another
    /// body): nothing done.
    IdempotencyKeyReused,
    /// An earlier request with this idempotency key is still being
    /// answered: nothing done; send it again in a moment.
    IdempotencyKeyInFlight,
    /// A store refused in a way a retry does not mend (a revoked
    /// privilege, a corrupt key): an operator must look; the cause is in
    /// the log under the request id.
    ServerFault,
}

impl Code {
    pub const ALL: [Code; 18] = [
        Code::InvalidBody,
        Code::InvalidId,
        Code::InvalidField,
        Code::InvalidHeader,
        Code::Unauthorized,
        Code::InsufficientScope,
        Code::NoSuchRoute,
        Code::MethodNotAllowed,
        Code::OrderNotFound,
        Code::VoucherNotLoaded,
        Code::BodyTimeout,
        Code::Overloaded,
        Code::TooManyConnections,
        Code::StoreUnavailable,
        Code::OutcomeUnknown,
        Code::IdempotencyKeyReused,
        Code::IdempotencyKeyInFlight,
        Code::ServerFault,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidBody => "invalid_body",
            Code::InvalidId => "invalid_id",
            Code::InvalidField => "invalid_field",
            Code::InvalidHeader => "invalid_header",
            Code::Unauthorized => "unauthorized",
            Code::InsufficientScope => "insufficient_scope",
            Code::NoSuchRoute => "no_such_route",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::OrderNotFound => "order_not_found",
            Code::VoucherNotLoaded => "voucher_not_loaded",
            Code::BodyTimeout => "body_timeout",
            Code::Overloaded => "overloaded",
            Code::TooManyConnections => "too_many_connections",
            Code::StoreUnavailable => "store_unavailable",
            Code::OutcomeUnknown => "outcome_unknown",
            Code::IdempotencyKeyReused => "idempotency_key_reused",
            Code::IdempotencyKeyInFlight => "idempotency_key_in_flight",
            Code::ServerFault => "server_fault",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            Code::InvalidBody | Code::InvalidId | Code::InvalidField | Code::InvalidHeader => {
                StatusCode::BAD_REQUEST
            }
            Code::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Code::IdempotencyKeyInFlight => StatusCode::CONFLICT,
            Code::Unauthorized => StatusCode::UNAUTHORIZED,
            Code::InsufficientScope => StatusCode::FORBIDDEN,
            Code::NoSuchRoute | Code::OrderNotFound | Code::VoucherNotLoaded => {
                StatusCode::NOT_FOUND
            }
            Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Code::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Code::Overloaded
            | Code::TooManyConnections
            | Code::StoreUnavailable
            | Code::OutcomeUnknown
            | Code::ServerFault => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Code::InvalidBody => "The body is not what this route takes",
            Code::InvalidId => "An id is not a valid id",
            Code::InvalidField => "A field is out of its range",
            Code::InvalidHeader => "A header's value is not what this route takes",
            Code::IdempotencyKeyReused => "The idempotency key was used for another request",
            Code::IdempotencyKeyInFlight => {
                "A request with this idempotency key is still being answered"
            }
            Code::Unauthorized => "A valid API key is required",
            Code::InsufficientScope => "The API key may not call this route",
            Code::NoSuchRoute => "No such route",
            Code::MethodNotAllowed => "The route does not take this method",
            Code::OrderNotFound => "No such order",
            Code::VoucherNotLoaded => "The voucher is not loaded at the gate",
            Code::BodyTimeout => "The body did not arrive in time",
            Code::Overloaded => "Too many requests in flight",
            Code::TooManyConnections => "Too many connections",
            Code::StoreUnavailable => "A store did not answer",
            Code::OutcomeUnknown => "The purchase's outcome is unknown",
            Code::ServerFault => "The server cannot serve this request",
        }
    }

    /// Whether the same request, sent again, can succeed without anyone
    /// changing anything (then the answer carries `Retry-After`).
    pub fn retry_can_succeed(self) -> bool {
        matches!(
            self,
            Code::Overloaded
                | Code::TooManyConnections
                | Code::StoreUnavailable
                | Code::OutcomeUnknown
                | Code::IdempotencyKeyInFlight
        )
    }

    /// The problem's type: a URN per code (stable; not a page to fetch).
    pub fn type_uri(self) -> String {
        format!("urn:seckill:problem:{}", self.as_str())
    }
}

/// The problem's JSON, as every route and the layers in front send it.
pub fn problem_body(code: Code, detail: &str, request_id: Option<&str>) -> serde_json::Value {
    let mut body = json!({
        "type": code.type_uri(),
        "title": code.title(),
        "status": code.status().as_u16(),
        "detail": detail,
        "code": code.as_str(),
        // The body of these answers before problems: kept for callers
        // that read it.
        "error": detail,
    });
    if let Some(id) = request_id {
        body["request_id"] = json!(id);
    }
    if code == Code::OutcomeUnknown {
        body["outcome"] = json!("unknown");
    }
    body
}

pub const PROBLEM_JSON: &str = "application/problem+json";
