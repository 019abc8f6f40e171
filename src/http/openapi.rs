//! The OpenAPI 3 description of `seckill serve`, generated from the
//! handlers' annotations (utoipa), served at `GET /v1/openapi.json` and
//! committed as `docs/openapi.json` (`seckill generate`; a test fails when
//! the committed one is stale, and another when a documented route and
//! status is never answered).
//!
//! The types here only describe bodies the handlers build as JSON.

use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use super::{health, metrics, order, purchase, voucher};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "seckill serve",
        description = "The HTTP front door of seckill: purchases through the Redis gate, admission tokens, the sale's state, orders and their payment. Every /v1 request carries `Authorization: Bearer <key>` when the server has API keys. Ids may be sent as JSON numbers or decimal strings.",
        license(name = "MIT")
    ),
    paths(
        purchase::create,
        voucher::issue_token,
        voucher::show,
        order::show,
        order::pay,
        health::healthz,
        health::readyz,
        metrics::render,
        document_route,
    ),
    components(schemas(
        purchase::PurchaseBody,
        PurchaseAnswer,
        UnknownAnswer,
        ErrorAnswer,
        voucher::TokenBody,
        TokenAnswer,
        SaleAnswer,
        OrderAnswer,
        PaymentAnswer,
        ReadyAnswer,
    )),
    modifiers(&BearerKeys),
    security(("api_key" = []))
)]
pub struct ApiDoc;

struct BearerKeys;

impl Modify for BearerKeys {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The description as committed (pretty JSON, one trailing newline).
pub fn document() -> String {
    let mut json = ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    json.push('\n');
    json
}

/// This description.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "The OpenAPI 3 description", content_type = "application/json")))]
pub async fn document_route() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        document(),
    )
        .into_response()
}

/// A purchase's answer: the fields of `seckill buy --format json`.
#[derive(Serialize, ToSchema)]
pub struct PurchaseAnswer {
    /// success, already_bought, sold_out, not_started, ended,
    /// unknown_voucher, paused, rate_limited or bad_token
    pub outcome: String,
    pub voucher: u64,
    pub user: u64,
    /// The new order's id (success only), a decimal string.
    pub order_id: Option<String>,
    /// The user's 1-based place on the waitlist (sold_out only).
    pub waitlist_position: Option<u64>,
    /// When the sale opens, Unix ms (not_started only), and as text.
    pub begin_ms: Option<i64>,
    pub begin: Option<String>,
    /// When the sale closed, Unix ms (ended only), and as text.
    pub end_ms: Option<i64>,
    pub end: Option<String>,
}

/// The gate's answer was lost after the script was sent: the purchase may or
/// may not have happened. Retry it: a retry answers already_bought if it did.
#[derive(Serialize, ToSchema)]
pub struct UnknownAnswer {
    /// "unknown"
    pub outcome: String,
    pub error: String,
}

/// Bad input, a missing key, an unknown route, or a store that did not answer.
#[derive(Serialize, ToSchema)]
pub struct ErrorAnswer {
    /// One line naming the problem.
    pub error: String,
}

#[derive(Serialize, ToSchema)]
pub struct TokenAnswer {
    pub voucher: String,
    pub user: String,
    pub token: String,
    pub ttl_ms: u64,
}

#[derive(Serialize, ToSchema)]
pub struct SaleAnswer {
    pub voucher: String,
    /// open, not_started, ended, sold_out or paused
    pub state: String,
    pub begin_ms: i64,
    pub end_ms: i64,
    /// Units left at the gate.
    pub stock: i64,
    /// Redis's clock (the gate's), Unix ms.
    pub now_ms: i64,
}

/// As `seckill order show --format json`.
#[derive(Serialize, ToSchema)]
pub struct OrderAnswer {
    pub id: String,
    pub user: u64,
    pub voucher: u64,
    /// pending, paid or cancelled
    pub status: String,
    pub created_ms: i64,
    pub deadline_ms: i64,
    pub paid_ms: Option<i64>,
    pub cancelled_ms: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct PaymentAnswer {
    /// paid, already_paid, cancelled, deadline_passed or unknown_order
    pub outcome: String,
    pub order_id: String,
}

#[derive(Serialize, ToSchema)]
pub struct ReadyAnswer {
    pub ready: bool,
    pub redis: bool,
    pub script: bool,
    pub mysql: bool,
    pub node_id: bool,
}
