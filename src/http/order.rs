//! `GET /v1/orders/{order}` (as `seckill order show`) and
//! `POST /v1/orders/{order}/payment` (as `seckill pay`: pay and the payment
//! deadline racing on one order produce exactly one outcome).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::{ApiError, Code};
use super::idempotent::{self, Idempotency};
use super::ids::PathIds;
use super::State;
use crate::idempotency::Answer;
use crate::orders::order;
use crate::orders::payment;
use crate::orders::payment_key::{KeyedPayment, PaymentKey};

/// One order (as `seckill order show`).
#[utoipa::path(get, path = "/v1/orders/{order}", tag = "orders", operation_id = "show_order",
    params(("order" = String, Path, description = "The order id")),
    responses(
        (status = 200, description = "The order", body = super::schema::OrderAnswer),
        (status = 404, description = "order_not_found: no such order"),
    ))]
pub async fn show(state: State, path: PathIds) -> Result<Response, ApiError> {
    let id = path.get("order")?;
    match order::get(&state.db, id).await? {
        Some(o) => Ok(Json(answer(&o)).into_response()),
        None => Err(ApiError::new(
            Code::OrderNotFound,
            format!("there is no order {id}"),
        )),
    }
}

/// An order as the API answers it: `seckill order show --format json`
/// with every id a string (a 64-bit id does not survive a JavaScript
/// number, and an ownership check on a rounded user id matches the
/// neighbour's).
pub fn answer(o: &order::OrderView) -> serde_json::Value {
    let mut body = json!(o);
    body["user"] = json!(o.user.to_string());
    body["voucher"] = json!(o.voucher.to_string());
    body
}

/// Pays the order (as `seckill pay`): pay and the payment deadline racing
/// on one order produce exactly one outcome. With an `Idempotency-Key`, a
/// resend gets the first answer again (src/orders/payment_key.rs).
#[utoipa::path(post, path = "/v1/orders/{order}/payment", tag = "orders",
    params(
        ("order" = String, Path, description = "The order id"),
        ("Idempotency-Key" = Option<String>, Header, description = "1..=255 printable ASCII characters, bare or quoted: a resend with the same key for the same order gets the first answer again (Idempotent-Replayed: true)"),
    ),
    responses(
        (status = 200, description = "paid", body = super::schema::PaymentAnswer),
        (status = 409, description = "already_paid", body = super::schema::PaymentAnswer),
        (status = 410, description = "cancelled or deadline_passed", body = super::schema::PaymentAnswer),
        (status = 404, description = "unknown_order", body = super::schema::PaymentAnswer),
    ))]
pub async fn pay(
    state: State,
    path: PathIds,
    Idempotency(idempotency): Idempotency,
) -> Result<Response, ApiError> {
    let id = path.get("order")?;
    let Some((key, scope)) = idempotency else {
        let outcome = payment::pay_on(&state.db, &mut state.redis(), &state.cfg.prefix, id).await?;
        return Ok(paid_answer(id, outcome.name(), false));
    };
    let patience = state.request_timeout + std::time::Duration::from_secs(1);
    let key = PaymentKey::new(&scope, &key, state.idempotency_ttl, patience)?;
    match key
        .pay(&state.db, &mut state.redis(), &state.cfg.prefix, id)
        .await?
    {
        KeyedPayment::Answered { outcome, replayed } => Ok(paid_answer(id, outcome, replayed)),
        KeyedPayment::Reused => Err(idempotent::reused()),
        KeyedPayment::InFlight => Err(idempotent::in_flight()),
    }
}

/// A payment's answer: its status and body follow from the outcome's name
/// and the order alone, so a replay is the first answer byte for byte.
fn paid_answer(id: u64, name: &'static str, replayed: bool) -> Response {
    let status = match name {
        "paid" => StatusCode::OK,
        "already_paid" => StatusCode::CONFLICT,
        "cancelled" | "deadline_passed" => StatusCode::GONE,
        _ => StatusCode::NOT_FOUND,
    };
    let body = json!({ "outcome": name, "order_id": id.to_string() });
    let answer = Answer {
        status: status.as_u16(),
        body: body.to_string().into_bytes(),
    };
    idempotent::respond(answer, replayed, name)
}
