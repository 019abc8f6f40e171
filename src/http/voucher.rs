//! `GET /v1/vouchers/{voucher}` (the sale's state, cheap enough to poll) and
//! `POST /v1/vouchers/{voucher}/tokens` (an admission token for a user).

use axum::extract::Path;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::ids::{parse_id, Id};
use super::{Body, State};
use crate::gate::state::{self, SaleState};
use crate::gate::token;
use crate::store::keys::VoucherKeys;
use crate::store::layout::Layout;

/// The sale's window and state, by the gate's clock; cheap enough to poll.
#[utoipa::path(get, path = "/v1/vouchers/{voucher}", tag = "vouchers", operation_id = "show_voucher",
    params(("voucher" = String, Path, description = "The voucher id")),
    responses(
        (status = 200, description = "The sale", body = super::schema::SaleAnswer),
        (status = 404, description = "Not loaded at the gate", body = super::schema::ErrorAnswer),
        (status = 400, description = "A bad voucher id", body = super::schema::ErrorAnswer),
        (status = 401, description = "No valid API key", body = super::schema::ErrorAnswer),
    ))]
pub async fn show(state: State, Path(voucher): Path<String>) -> Result<Json<Value>, ApiError> {
    let voucher = parse_id("voucher", &voucher)?;
    let keys = VoucherKeys::new(&state.cfg.prefix, voucher)?;
    let sale = state::read_sale_of_buckets(&mut state.redis(), &keys).await?;
    let Some(sale) = sale else {
        return Err(ApiError::NotFound(format!(
            "voucher {voucher} is not loaded at the gate"
        )));
    };
    let name = match sale.state() {
        SaleState::Paused => "paused",
        SaleState::NotStarted => "not_started",
        SaleState::Ended => "ended",
        SaleState::SoldOut => "sold_out",
        SaleState::Open => "open",
    };
    Ok(Json(json!({
        "voucher": voucher.to_string(),
        "state": name,
        "begin_ms": sale.begin_ms,
        "end_ms": sale.end_ms,
        "stock": sale.stock,
        "now_ms": sale.now_ms,
    })))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    /// The user: a JSON number or a decimal string.
    #[schema(value_type = String, example = "42")]
    user: Id,
    /// How long the token stays valid, in ms (default 10 minutes).
    #[serde(default)]
    ttl_ms: Option<u64>,
}

const DEFAULT_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// An admission token for a user (as `seckill token issue`).
#[utoipa::path(post, path = "/v1/vouchers/{voucher}/tokens", tag = "vouchers",
    params(("voucher" = String, Path, description = "The voucher id")),
    request_body = TokenBody,
    responses(
        (status = 200, description = "The token and its lifetime", body = super::schema::TokenAnswer),
        (status = 400, description = "Bad input (a ttl over 24 h, say)", body = super::schema::ErrorAnswer),
        (status = 408, description = "the body did not arrive within --request-timeout; nothing was done", body = super::schema::ErrorAnswer),
        (status = 401, description = "No valid API key", body = super::schema::ErrorAnswer),
    ))]
pub async fn issue_token(
    state: State,
    Path(voucher): Path<String>,
    Body(body): Body<TokenBody>,
) -> Result<Json<Value>, ApiError> {
    let voucher = parse_id("voucher", &voucher)?;
    let ttl = body
        .ttl_ms
        .map_or(DEFAULT_TTL, std::time::Duration::from_millis);
    token::validate_ttl(ttl)?;
    VoucherKeys::new(&state.cfg.prefix, voucher)?;
    let mut conn = state.redis();
    // The token lives in the user's bucket, where the user is admitted.
    let keys = Layout::read(&mut conn, &state.cfg.prefix, voucher)
        .await?
        .keys_of_user(body.user.0)?;
    let issued = token::issue(&mut conn, &keys, body.user.0, ttl).await?;
    Ok(Json(json!({
        "voucher": issued.voucher.to_string(),
        "user": issued.user.to_string(),
        "token": issued.token,
        "ttl_ms": issued.ttl_ms,
    })))
}
