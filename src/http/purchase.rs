//! `POST /v1/vouchers/{voucher}/purchases`: one admission through the gate.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use redis::AsyncCommands;

use super::body::{Body, Fields, FromFields};
use super::error::ApiError;
use super::error::Code;
use super::ids::PathIds;
use super::metrics::OutcomeLabel;
use super::{AppState, State};
use crate::gate::admission::Admission;

use crate::orders::order;
use crate::purchase::{purchase, Failed, Request};
use crate::store::keys::VoucherKeys;

// Built by hand from the body's fields (FromFields); the derive is for the
// OpenAPI document only.
/// A purchase: the buyer, and a token and a quantity when needed.
#[derive(utoipa::ToSchema)]
pub struct PurchaseBody {
    /// The buyer: 1..=9223372036854775807, a JSON number or its plain
    /// decimal string.
    #[schema(value_type = String)]
    user: u64,
    /// The user's admission token, for a voucher that requires one.
    #[schema(max_length = 128)]
    token: Option<String>,
    /// Units to buy, all or none: 1 (the default) ..= the voucher's
    /// per-user limit.
    #[schema(minimum = 1, maximum = 100)]
    quantity: Option<u32>,
}

impl FromFields for PurchaseBody {
    const FIELDS: &'static [&'static str] = &["user", "token", "quantity"];

    fn from_fields(f: &mut Fields) -> Result<Self, ApiError> {
        let max = u64::from(crate::orders::policy::MAX_PER_USER_LIMIT);
        Ok(PurchaseBody {
            user: f.id("user")?,
            token: f.text("token", MAX_TOKEN)?,
            quantity: f.number("quantity", 1..=max)?.map(|q| q as u32),
        })
    }
}

/// Tokens are 32 hex digits (`seckill token issue`); anything much longer
/// is no token.
const MAX_TOKEN: usize = 128;

/// One status per outcome (docs/src/reference/http-api.md); 201 for a success only.
pub fn status_of(outcome: &Admission) -> StatusCode {
    match outcome {
        Admission::Admitted { .. } => StatusCode::CREATED,
        Admission::AlreadyBought => StatusCode::CONFLICT,
        Admission::SoldOut { .. } | Admission::WaitingForUnits { .. } => StatusCode::GONE,
        Admission::NotStarted { .. } => StatusCode::TOO_EARLY,
        Admission::Ended { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        Admission::UnknownVoucher => StatusCode::NOT_FOUND,
        Admission::Paused => StatusCode::SERVICE_UNAVAILABLE,
        Admission::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Admission::BadToken => StatusCode::FORBIDDEN,
        Admission::NotEnoughStock { .. } => StatusCode::PRECONDITION_FAILED,
    }
}

/// One admission through the gate: 201 for a success and only for it.
#[utoipa::path(post, path = "/v1/vouchers/{voucher}/purchases", tag = "purchases",
    params(("voucher" = String, Path, description = "The voucher id")),
    request_body = PurchaseBody,
    responses(
        (status = 201, description = "success: the user holds a unit; the order is on its way to MySQL", body = super::schema::PurchaseAnswer),
        (status = 409, description = "already_bought (also a retry whose first attempt went through); order_id is the user's order once MySQL has it", body = super::schema::PurchaseAnswer),
        (status = 410, description = "sold_out: the user is on the waitlist (waitlist_position), or not when it is full (waitlist_full, no position)", body = super::schema::PurchaseAnswer),
        (status = 412, description = "not_enough_stock: fewer units left (units_left) than the quantity asked; nothing taken", body = super::schema::PurchaseAnswer),
        (status = 425, description = "not_started", body = super::schema::PurchaseAnswer),
        (status = 422, description = "ended", body = super::schema::PurchaseAnswer),
        (status = 404, description = "unknown_voucher: not loaded at the gate", body = super::schema::PurchaseAnswer),
        (status = 403, description = "bad_token", body = super::schema::PurchaseAnswer),
        (status = 429, description = "rate_limited (Retry-After)", body = super::schema::PurchaseAnswer),
        (status = 503, description = "paused: the gate admits nobody right now (Retry-After)", body = super::schema::PurchaseAnswer),
    ))]
pub async fn create(
    state: State,
    path: PathIds,
    Body(body): Body<PurchaseBody>,
) -> Result<Response, ApiError> {
    let voucher = path.get("voucher")?;
    let request = body.request(voucher);
    let keys = VoucherKeys::new(&state.cfg.prefix, voucher)?;
    // Outside the sale window (by a cached window, about a second old)
    // nothing can win: answered here, no script run.
    let early = state
        .windows
        .answer(&mut state.redis(), &keys)
        .await
        .map_err(|e| {
            state.metrics.redis_error();
            ApiError::store(&e)
        })?;
    if let Some(outcome) = early {
        return Ok(respond(voucher, request.user, outcome));
    }
    let gates = state
        .windows
        .gates(&state.db, &state.cfg.prefix, voucher)
        .await;
    let mut conn = state.purchase_redis();
    let call = purchase(&mut conn, &*gates, &state.ids, request, state.wait);
    let purchased = match tokio::time::timeout(state.request_timeout, call).await {
        Ok(Ok(purchased)) => purchased,
        Ok(Err(Failed::NotSent(e))) => return Err(ApiError::from(e)),
        Ok(Err(Failed::Refused(reason))) => return Err(ApiError::invalid_field(reason)),
        Ok(Err(Failed::Unknown(e))) if e.may_heal_by_itself() => {
            state.metrics.redis_error();
            tracing::warn!("voucher {voucher}: admission of user {}: {e}", request.user);
            return Err(outcome_unknown("the gate's answer was lost"));
        }
        // The gate answered with an error (a key of the wrong type, a
        // refused command): a retry meets it again.
        Ok(Err(Failed::Unknown(e))) => {
            state.metrics.redis_error();
            tracing::error!("voucher {voucher}: admission of user {}: {e}", request.user);
            return Err(ApiError::new(
                Code::ServerFault,
                "the gate failed on this purchase (its outcome is unknown) in a way a retry does not mend; the operators find the cause in the log under this request's id",
            ));
        }
        Err(_) => {
            state.metrics.redis_error();
            return Err(outcome_unknown("the gate did not answer in time"));
        }
    };
    if let Err(e) = crate::support::fault::point("serve_after_admit").await {
        tracing::warn!("voucher {voucher}: admission of user {}: {e}", request.user);
        return Err(outcome_unknown("the gate's answer was lost"));
    }
    if purchased.outcome == Admission::AlreadyBought {
        return Ok(already_bought(&state, voucher, request.user).await);
    }
    purchased.warn_if_replicas_short(&request, state.wait);
    let extra = HttpOnlyFields {
        replicas_acked: purchased.replicas_acked,
        ..HttpOnlyFields::default()
    };
    Ok(answer(voucher, request.user, purchased.outcome, extra))
}

/// The purchase may or may not have happened: the caller retries it.
fn outcome_unknown(what: &str) -> ApiError {
    ApiError::new(
        Code::OutcomeUnknown,
        format!("{what}; the purchase may or may not have happened: retry it"),
    )
}

impl PurchaseBody {
    /// The purchase this body asks for, its fields checked as far as they
    /// can be without the voucher (the script checks the quantity against
    /// the voucher's per-user limit).
    fn request(&self, voucher: u64) -> Request<'_> {
        Request {
            voucher,
            user: self.user,
            token: self.token.as_deref(),
            quantity: self.quantity.unwrap_or(1),
        }
    }
}

/// How long an already_bought answer may wait for MySQL to name the order.
const ORDER_LOOKUP: Duration = Duration::from_millis(300);

/// already_bought, with the user's order id when MySQL has the order (a
/// retry of a purchase whose answer was lost learns it so). The worker
/// persists within about a second: until then, or if MySQL is slow, the
/// answer has no order id and `GET .../purchases/{user}` tells it later.
async fn already_bought(state: &AppState, voucher: u64, user: u64) -> Response {
    // Buyers clicking again are most already_bought answers: a few lookups
    // at a time per process, the rest answered without the id, so repeat
    // clicks cannot crowd MySQL (and the worker persisting orders) out.
    let Ok(_turn) = state.order_lookups.try_acquire() else {
        return respond(voucher, user, Admission::AlreadyBought);
    };
    let lookup = order::of_user(&state.db, voucher, user);
    let order_id = match tokio::time::timeout(ORDER_LOOKUP, lookup).await {
        Ok(Ok(found)) => found.map(|o| o.id),
        Ok(Err(e)) => {
            tracing::warn!("voucher {voucher}: user {user}'s order: {e}");
            None
        }
        Err(_) => {
            tracing::warn!(
                "voucher {voucher}: user {user}'s order: MySQL did not answer within {}",
                humantime::format_duration(ORDER_LOOKUP)
            );
            None
        }
    };
    let extra = HttpOnlyFields {
        order_id,
        ..HttpOnlyFields::default()
    };
    answer(voucher, user, Admission::AlreadyBought, extra)
}

fn respond(voucher: u64, user: u64, outcome: Admission) -> Response {
    answer(voucher, user, outcome, HttpOnlyFields::default())
}

/// What an answer may carry beyond `seckill buy --format json`'s fields.
#[derive(Default)]
struct HttpOnlyFields {
    /// With `--wait-replicas`, on a success: how many replicas had it.
    replicas_acked: Option<u32>,
    /// already_bought: the user's order, when MySQL has it.
    order_id: Option<u64>,
}

fn answer(voucher: u64, user: u64, outcome: Admission, extra: HttpOnlyFields) -> Response {
    let status = status_of(&outcome);
    let mut report = outcome.report(voucher, user);
    // Ids are strings over HTTP: a 64-bit id does not survive a JavaScript
    // number.
    report["voucher"] = serde_json::json!(voucher.to_string());
    report["user"] = serde_json::json!(user.to_string());
    if let Some(acked) = extra.replicas_acked {
        report["replicas_acked"] = serde_json::json!(acked);
    }
    if let Some(id) = extra.order_id {
        report["order_id"] = serde_json::json!(id.to_string());
    }
    let mut response = (status, axum::Json(report)).into_response();
    response
        .extensions_mut()
        .insert(OutcomeLabel(outcome.name()));
    if matches!(outcome, Admission::Paused | Admission::RateLimited) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// Whether the user bought the voucher, and the order once MySQL has it:
/// how a caller settles a purchase whose answer was lost after the sale
/// ended (a retry then answers `ended`, the gate's check order). While it
/// runs, `bought: false` is not final: the lost request may still reach the
/// gate (its driver resends it); retrying the purchase settles it then.
#[utoipa::path(get, path = "/v1/vouchers/{voucher}/purchases/{user}", tag = "purchases", operation_id = "show_purchase",
    params(
        ("voucher" = String, Path, description = "The voucher id"),
        ("user" = String, Path, description = "The user id"),
    ),
    responses(
        (status = 200, description = "bought true (the gate counts the user a buyer, or MySQL has the order; order null: on its way to MySQL) or false", body = super::schema::BuyerAnswer),
    ))]
pub async fn show(state: State, path: PathIds) -> Result<Response, ApiError> {
    let voucher = path.get("voucher")?;
    let user = path.get("user")?;
    VoucherKeys::new(&state.cfg.prefix, voucher)?;
    // MySQL first: an order persisted before the gate was asked stays
    // found even if a rebuild moves the buyer meanwhile.
    let lookup = order::of_user(&state.db, voucher, user);
    let order = match tokio::time::timeout(state.request_timeout / 2, lookup).await {
        Ok(found) => found?,
        Err(_) => {
            return Err(ApiError::new(
                Code::StoreUnavailable,
                "MySQL did not answer in time; nothing was done: retry in a moment",
            ))
        }
    };
    let bought = match &order {
        Some(_) => true,
        None => {
            let mut conn = state.redis();
            // The buyer is in their own bucket's set: by the layout the
            // purchases cached with the sale window, else read now.
            let layout = match state.windows.layout(voucher) {
                Some(layout) => layout,
                None => match crate::gate::buckets::for_routing(
                    &mut conn,
                    &state.cfg.prefix,
                    voucher,
                    async || Ok(state.db.clone()),
                )
                .await
                {
                    Ok(layout) => std::sync::Arc::new(layout),
                    Err(e) => {
                        state.metrics.redis_error();
                        return Err(ApiError::store(&e));
                    }
                },
            };
            let keys = layout.keys_of_user(user)?;
            let member: redis::RedisResult<bool> = conn.sismember(keys.buyers(), user).await;
            member.map_err(|e| {
                state.metrics.redis_error();
                ApiError::store(&e.into())
            })?
        }
    };
    Ok(axum::Json(serde_json::json!({
        "voucher": voucher.to_string(),
        "user": user.to_string(),
        "bought": bought,
        "order": order.as_ref().map(super::order::answer),
    }))
    .into_response())
}
