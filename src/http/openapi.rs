//! The OpenAPI 3 description of `seckill serve`, generated from the
//! handlers' annotations (utoipa), served at `GET /v1/openapi.json` and
//! committed as `docs/openapi.json` (`seckill generate`; a test fails when
//! the committed one is stale, and another when a documented route and
//! status is never answered).
//!
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::schema::{
    BuyerAnswer, ErrorAnswer, OrderAnswer, PaymentAnswer, PurchaseAnswer, ReadyAnswer, SaleAnswer,
    TokenAnswer, UnknownAnswer,
};
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
        purchase::show,
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
