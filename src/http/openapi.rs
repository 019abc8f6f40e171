//! The OpenAPI 3 description of `seckill serve`, generated from the
//! handlers' annotations (utoipa), served at `GET /v1/openapi.json` and
//! committed as `docs/openapi.json` (`seckill generate`; a test fails when
//! the committed one is stale, and another when a documented route and
//! status is never answered).
//!
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::schema::{
    BuyerAnswer, OrderAnswer, PaymentAnswer, PurchaseAnswer, ReadyAnswer, SaleAnswer, TokenAnswer,
};
use super::{health, metrics, order, purchase, standing, voucher};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "seckill serve",
        description = "The HTTP front door of seckill: purchases through the Redis gate, admission tokens, the sale's state, orders and their payment. Every /v1 request carries `Authorization: Bearer <key>` when the server has API keys; a key may be limited to scopes (read, buy, token, pay). Ids are sent as JSON numbers or plain decimal strings, and answered as strings. An answer that is not an outcome is a problem (RFC 9457, application/problem+json) with a stable `code`; every answer carries X-Request-Id.",
        license(name = "MIT")
    ),
    paths(
        purchase::create,
        standing::show,
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
        voucher::TokenBody,
        TokenAnswer,
        SaleAnswer,
        OrderAnswer,
        BuyerAnswer,
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

/// The description as committed (pretty JSON, one trailing newline):
/// the handlers' annotations completed by `src/http/contract.rs`.
pub fn document() -> String {
    let mut doc = serde_json::to_value(ApiDoc::openapi())
        .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }));
    super::contract::complete(&mut doc);
    let mut json =
        serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
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
