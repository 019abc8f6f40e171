//! `GET /v1/orders/{order}` (as `seckill order show`) and
//! `POST /v1/orders/{order}/payment` (as `seckill pay`: pay and the payment
//! deadline racing on one order produce exactly one outcome).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::{ApiError, Code};
use super::ids::PathIds;
use super::metrics::OutcomeLabel;
use super::State;
use crate::orders::order;
use crate::orders::payment::{self, PayOutcome};

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
/// on one order produce exactly one outcome.
#[utoipa::path(post, path = "/v1/orders/{order}/payment", tag = "orders",
    params(("order" = String, Path, description = "The order id")),
    responses(
        (status = 200, description = "paid", body = super::schema::PaymentAnswer),
        (status = 409, description = "already_paid", body = super::schema::PaymentAnswer),
        (status = 410, description = "cancelled or deadline_passed", body = super::schema::PaymentAnswer),
        (status = 404, description = "unknown_order", body = super::schema::PaymentAnswer),
    ))]
pub async fn pay(state: State, path: PathIds) -> Result<Response, ApiError> {
    let id = path.get("order")?;
    let outcome = payment::pay_on(&state.db, &mut state.redis(), &state.cfg.prefix, id).await?;
    let (status, name) = match outcome {
        PayOutcome::Paid { .. } => (StatusCode::OK, "paid"),
        PayOutcome::AlreadyPaid => (StatusCode::CONFLICT, "already_paid"),
        PayOutcome::Cancelled => (StatusCode::GONE, "cancelled"),
        PayOutcome::DeadlinePassed => (StatusCode::GONE, "deadline_passed"),
        PayOutcome::UnknownOrder => (StatusCode::NOT_FOUND, "unknown_order"),
    };
    let body = json!({ "outcome": name, "order_id": id.to_string() });
    let mut response = (status, Json(body)).into_response();
    response.extensions_mut().insert(OutcomeLabel(name));
    Ok(response)
}
