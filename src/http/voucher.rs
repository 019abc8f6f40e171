//! `GET /v1/vouchers/{voucher}` (the sale's state, cheap enough to poll) and
//! `POST /v1/vouchers/{voucher}/tokens` (an admission token for a user).

use axum::Json;
use serde_json::{json, Value};

use super::body::{Body, Fields, FromFields};
use super::error::ApiError;
use super::error::Code;
use super::ids::PathIds;
use super::State;
use crate::gate::state::{self, SaleState};
use crate::gate::token;
use crate::store::keys::VoucherKeys;
use crate::store::layout::Layout;

/// The sale's window and state, by the gate's clock; cheap enough to poll.
#[utoipa::path(get, path = "/v1/vouchers/{voucher}", tag = "vouchers", operation_id = "show_voucher",
    params(("voucher" = String, Path, description = "The voucher id")),
    responses(
        (status = 200, description = "The sale", body = super::schema::SaleAnswer),
        (status = 404, description = "voucher_not_loaded: not loaded at the gate"),
    ))]
pub async fn show(state: State, path: PathIds) -> Result<Json<Value>, ApiError> {
    let voucher = path.get("voucher")?;
    let keys = VoucherKeys::new(&state.cfg.prefix, voucher)?;
    let sale = state::read_sale_of_buckets(&mut state.redis(), &keys).await?;
    let Some(sale) = sale else {
        return Err(ApiError::new(
            Code::VoucherNotLoaded,
            format!("voucher {voucher} is not loaded at the gate"),
        ));
    };
    let layout = Layout::from_tags(&state.cfg.prefix, voucher, sale.bucket_tags.as_deref())?;
    let line = crate::gate::waiting::line_of(&mut state.redis(), &layout).await?;
    state.pace.saw(voucher, line.promotions);
    let claimed = match sale.total {
        t if t > 0 => (1.0 - sale.stock as f64 / t as f64).clamp(0.0, 1.0),
        _ => 0.0,
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
        // Four decimals: a share, not a count to compute with.
        "claimed": (claimed * 10_000.0).round() / 10_000.0,
        "waiting": line.waiting,
    })))
}

// Built by hand from the body's fields (FromFields); the derive is for the
// OpenAPI document only.
/// The user a token is for, and how long it lives.
#[derive(utoipa::ToSchema)]
pub struct TokenBody {
    /// The user: a JSON number or its plain decimal string.
    #[schema(value_type = String)]
    user: u64,
    /// How long the token stays valid, in ms: 1 ..= 86400000 (24 h);
    /// default 600000 (10 minutes).
    #[schema(minimum = 1, maximum = 86_400_000)]
    ttl_ms: Option<u64>,
}

impl FromFields for TokenBody {
    const FIELDS: &'static [&'static str] = &["user", "ttl_ms"];

    fn from_fields(f: &mut Fields) -> Result<Self, ApiError> {
        let max = token::MAX_TTL.as_millis() as u64;
        Ok(TokenBody {
            user: f.id("user")?,
            ttl_ms: f.number("ttl_ms", 1..=max)?,
        })
    }
}

const DEFAULT_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// An admission token for a user (as `seckill token issue`).
#[utoipa::path(post, path = "/v1/vouchers/{voucher}/tokens", tag = "vouchers",
    params(("voucher" = String, Path, description = "The voucher id")),
    request_body = TokenBody,
    responses(
        (status = 200, description = "The token and its lifetime", body = super::schema::TokenAnswer),
        (status = 404, description = "voucher_not_loaded: not loaded at the gate"),
    ))]
pub async fn issue_token(
    state: State,
    path: PathIds,
    Body(body): Body<TokenBody>,
) -> Result<Json<Value>, ApiError> {
    let voucher = path.get("voucher")?;
    let ttl = body
        .ttl_ms
        .map_or(DEFAULT_TTL, std::time::Duration::from_millis);
    token::validate_ttl(ttl)?;
    VoucherKeys::new(&state.cfg.prefix, voucher)?;
    let mut conn = state.redis();
    // The token lives in the user's bucket, where the user is admitted.
    let keys = Layout::read(&mut conn, &state.cfg.prefix, voucher)
        .await?
        .keys_of_user(body.user)?;
    let issued = token::issue(&mut conn, &keys, body.user, ttl).await?;
    Ok(Json(json!({
        "voucher": issued.voucher.to_string(),
        "user": issued.user.to_string(),
        "token": issued.token,
        "ttl_ms": issued.ttl_ms,
    })))
}
