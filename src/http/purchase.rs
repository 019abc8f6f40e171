//! `POST /v1/vouchers/{voucher}/purchases`: one admission through the gate.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;

use super::body::{Body, Fields, FromFields};
use super::error::ApiError;
use super::error::Code;
use super::idempotent::{self, Idempotency};
use super::ids::PathIds;
use super::{AppState, State};
use crate::gate::admission::Admission;

use crate::idempotency::{Answer, Reservation};
use crate::orders::order;
use crate::purchase::{
    answer_report, answer_status, prepare, purchase_keyed, Failed, Keyed, Purchased, Request,
};
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
    /// The caller's own name for this purchase (a cart or checkout id):
    /// 1..=64 printable ASCII characters. Kept with the order, also when
    /// the request waits in line first, and returned with the order and
    /// the purchase lookup; part of the request an Idempotency-Key names.
    #[schema(min_length = 1, max_length = 64, pattern = "^[ -~]{1,64}$")]
    client_reference: Option<String>,
}

impl FromFields for PurchaseBody {
    const FIELDS: &'static [&'static str] = &["user", "token", "quantity", "client_reference"];

    fn from_fields(f: &mut Fields) -> Result<Self, ApiError> {
        let max = u64::from(crate::orders::policy::MAX_PER_USER_LIMIT);
        Ok(PurchaseBody {
            user: f.id("user")?,
            token: f.text("token", MAX_TOKEN)?,
            quantity: f.number("quantity", 1..=max)?.map(|q| q as u32),
            client_reference: f.client_reference("client_reference")?,
        })
    }
}

/// Tokens are 32 hex digits (`seckill token issue`); anything much longer
/// is no token.
const MAX_TOKEN: usize = 128;

/// One admission through the gate: 201 for a success and only for it.
#[utoipa::path(post, path = "/v1/vouchers/{voucher}/purchases", tag = "purchases",
    params(
        ("voucher" = String, Path, description = "The voucher id"),
        ("Idempotency-Key" = Option<String>, Header, description = "1..=255 printable ASCII characters, bare or quoted: a resend with the same key and body gets the first answer again (Idempotent-Replayed: true)"),
    ),
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
    Idempotency(idempotency): Idempotency,
    Body(body): Body<PurchaseBody>,
) -> Result<Response, ApiError> {
    let voucher = path.get("voucher")?;
    let request = body.request(voucher);
    let keys = VoucherKeys::new(&state.cfg.prefix, voucher)?;
    // Outside the sale window (by a cached window, about a second old)
    // nothing can win: answered here, no script run. With a key, an answer
    // a key keeps (ended) must come from the script, which records it (a
    // first request answered here while a resend's script ran could not be
    // told apart).
    let early = state
        .windows
        .answer(&mut state.redis(), &keys)
        .await
        .map_err(|e| {
            state.metrics.redis_error();
            ApiError::store(&e)
        })?;
    // With a key too when the answer is not kept for it (not started): a
    // resend runs again either way, and pre-sale clicks cost Redis nothing.
    if let Some(outcome) = early.filter(|o| idempotency.is_none() || !o.kept_for_a_key()) {
        return Ok(Answered::of(voucher, request.user, outcome).respond());
    }
    let Some((key, scope)) = idempotency else {
        return admit(&state, request).await.map(Answered::respond);
    };
    let gates = state
        .windows
        .gates(&state.db, &state.cfg.prefix, voucher)
        .await;
    let prepared =
        prepare(&*gates, &state.ids, request).map_err(|f| failure(&state, &request, f))?;
    // A resend waits this long for an earlier request that has no outcome
    // yet before taking it for one that never reached the gate.
    let patience = state.request_timeout + Duration::from_secs(1);
    let reservation = Reservation::new(
        &state.cfg.prefix,
        &scope,
        &key,
        state.idempotency_ttl,
        patience,
    )?;
    let (mut conn, mut books) = (state.purchase_redis(), state.redis());
    let render = async |purchased: &Purchased| {
        after_admit(&request).await?;
        Ok(answer_to(&state, &request, purchased).await.into_answer())
    };
    let call = purchase_keyed(
        &mut conn,
        &mut books,
        &reservation,
        prepared,
        state.wait,
        render,
    );
    match tokio::time::timeout(state.request_timeout, call).await {
        Ok(Ok(Keyed::Answered {
            answer,
            replayed,
            ran,
        })) => {
            let outcome = match ran {
                Some(p) if !replayed => p.outcome.name(),
                _ => "replayed",
            };
            Ok(idempotent::respond(answer, replayed, outcome))
        }
        Ok(Ok(Keyed::Reused)) => Err(idempotent::reused()),
        Ok(Ok(Keyed::InFlight)) => Err(idempotent::in_flight()),
        Ok(Err(failed)) => Err(failure(&state, &request, failed)),
        Err(_) => {
            state.metrics.redis_error();
            Err(outcome_unknown("the gate did not answer in time"))
        }
    }
}

/// One admission through the gate, answered.
async fn admit(state: &AppState, request: Request<'_>) -> Result<Answered, ApiError> {
    let gates = state
        .windows
        .gates(&state.db, &state.cfg.prefix, request.voucher)
        .await;
    let mut conn = state.purchase_redis();
    let call = async {
        let purchased = prepare(&*gates, &state.ids, request)?
            .send(&mut conn, state.wait)
            .await?;
        after_admit(&request).await?;
        Ok(purchased)
    };
    let purchased = match tokio::time::timeout(state.request_timeout, call).await {
        Ok(Ok(purchased)) => purchased,
        Ok(Err(failed)) => return Err(failure(state, &request, failed)),
        Err(_) => {
            state.metrics.redis_error();
            return Err(outcome_unknown("the gate did not answer in time"));
        }
    };
    Ok(answer_to(state, &request, &purchased).await)
}

/// The test fault point between the admission and its answer: an error
/// there is the answer lost on its way back, as a reset connection loses
/// it.
async fn after_admit(request: &Request<'_>) -> Result<(), Failed> {
    crate::support::fault::point("serve_after_admit")
        .await
        .map_err(|e| {
            tracing::warn!(
                "voucher {}: admission of user {}: {e}",
                request.voucher,
                request.user
            );
            let lost = std::io::Error::new(std::io::ErrorKind::ConnectionReset, e.to_string());
            Failed::Unknown(redis::RedisError::from(lost).into())
        })
}

/// What a purchase that failed is answered.
fn failure(state: &AppState, request: &Request<'_>, failed: Failed) -> ApiError {
    let (voucher, user) = (request.voucher, request.user);
    match failed {
        Failed::NotSent(e) => {
            if matches!(
                e,
                crate::error::Error::Redis { .. } | crate::error::Error::RedisConnect { .. }
            ) {
                state.metrics.redis_error();
            }
            ApiError::from(e)
        }
        Failed::Refused(reason) => ApiError::invalid_field(reason),
        Failed::Unknown(e) if e.may_heal_by_itself() => {
            state.metrics.redis_error();
            tracing::warn!("voucher {voucher}: admission of user {user}: {e}");
            outcome_unknown("the gate's answer was lost")
        }
        // The gate answered with an error (a key of the wrong type, a
        // refused command): a retry meets it again.
        Failed::Unknown(e) => {
            state.metrics.redis_error();
            tracing::error!("voucher {voucher}: admission of user {user}: {e}");
            ApiError::new(
                Code::ServerFault,
                "the gate failed on this purchase (its outcome is unknown) in a way a retry does not mend; the operators find the cause in the log under this request's id",
            )
        }
    }
}

/// The answer to what the gate said.
async fn answer_to(state: &AppState, request: &Request<'_>, purchased: &Purchased) -> Answered {
    let (voucher, user) = (request.voucher, request.user);
    if purchased.outcome == Admission::AlreadyBought {
        return already_bought(state, voucher, user).await;
    }
    purchased.warn_if_replicas_short(request, state.wait);
    let extra = HttpOnlyFields {
        replicas_acked: purchased.replicas_acked,
        ..HttpOnlyFields::default()
    };
    Answered::new(voucher, user, purchased.outcome, extra)
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
            client_reference: self.client_reference.as_deref(),
        }
    }
}

/// How long an already_bought answer may wait for MySQL to name the order.
const ORDER_LOOKUP: Duration = Duration::from_millis(300);

/// already_bought, with the user's order id when MySQL has the order (a
/// retry of a purchase whose answer was lost learns it so). The worker
/// persists within about a second: until then, or if MySQL is slow, the
/// answer has no order id and `GET .../purchases/{user}` tells it later.
async fn already_bought(state: &AppState, voucher: u64, user: u64) -> Answered {
    // Buyers clicking again are most already_bought answers: a few lookups
    // at a time per process, the rest answered without the id, so repeat
    // clicks cannot crowd MySQL (and the worker persisting orders) out.
    let Ok(_turn) = state.order_lookups.try_acquire() else {
        return Answered::of(voucher, user, Admission::AlreadyBought);
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
    Answered::new(voucher, user, Admission::AlreadyBought, extra)
}

/// What an answer may carry beyond `seckill buy --format json`'s fields.
#[derive(Default)]
struct HttpOnlyFields {
    /// With `--wait-replicas`, on a success: how many replicas had it.
    replicas_acked: Option<u32>,
    /// already_bought: the user's order, when MySQL has it.
    order_id: Option<u64>,
}

/// A purchase's answer: its outcome, status and body.
struct Answered {
    outcome: Admission,
    status: StatusCode,
    report: serde_json::Value,
}

impl Answered {
    fn of(voucher: u64, user: u64, outcome: Admission) -> Answered {
        Answered::new(voucher, user, outcome, HttpOnlyFields::default())
    }

    fn new(voucher: u64, user: u64, outcome: Admission, extra: HttpOnlyFields) -> Answered {
        let mut report = answer_report(voucher, user, &outcome);
        if let Some(acked) = extra.replicas_acked {
            report["replicas_acked"] = serde_json::json!(acked);
        }
        if let Some(id) = extra.order_id {
            report["order_id"] = serde_json::json!(id.to_string());
        }
        Answered {
            outcome,
            status: StatusCode::from_u16(answer_status(&outcome))
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            report,
        }
    }

    /// The answer as an idempotency key records it.
    fn into_answer(self) -> Answer {
        Answer {
            status: self.status.as_u16(),
            body: self.report.to_string().into_bytes(),
        }
    }

    fn respond(self) -> Response {
        let outcome = self.outcome.name();
        idempotent::respond(self.into_answer(), false, outcome)
    }
}
