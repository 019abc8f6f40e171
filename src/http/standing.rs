//! `GET /v1/vouchers/{voucher}/purchases/{user}`: where a buyer stands —
//! bought (with the order), waiting (with their place in line and an
//! estimate), not waiting, or the sale ended — and, with `?wait=`, held
//! until that changes (a long poll, so a browser-facing application need
//! not poll).

use std::time::{Duration, Instant};

use axum::http::Uri;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, Code};
use super::ids::PathIds;
use super::{AppState, State};
use crate::gate::waiting;
use crate::orders::order::{self, OrderView};
use crate::store::keys::VoucherKeys;
use crate::store::layout::Layout;

/// The longest and shortest `?wait=`.
const MAX_WAIT: Duration = Duration::from_secs(30);
const MIN_WAIT: Duration = Duration::from_secs(1);
/// How often a held request looks again (Redis only; MySQL once it moved).
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// Where the buyer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Bought,
    Waiting,
    NotWaiting,
    Ended,
}

impl Place {
    fn name(self) -> &'static str {
        match self {
            Place::Bought => "bought",
            Place::Waiting => "waiting",
            Place::NotWaiting => "not_waiting",
            Place::Ended => "ended",
        }
    }
}

/// The answer's facts.
struct Standing {
    state: Place,
    order: Option<OrderView>,
    position: Option<u64>,
    eta_ms: Option<u64>,
    /// The waiting request's (an order's is in the order).
    waiting_reference: Option<String>,
}

/// Where the buyer stands: bought (the gate counts the user a buyer, or
/// MySQL has the order: `order` once the worker persisted it), waiting
/// (`position` in the voucher's line, 1 = next; `ahead`; `eta_ms`, an
/// estimate from the pace the line has moved at over the last minutes,
/// null without one), not_waiting, or ended (the sale closed and the user
/// holds nothing). `?wait=` (1s..30s) holds the request until the state
/// changes or the time runs out.
#[utoipa::path(get, path = "/v1/vouchers/{voucher}/purchases/{user}", tag = "purchases", operation_id = "show_purchase",
    params(
        ("voucher" = String, Path, description = "The voucher id"),
        ("user" = String, Path, description = "The user id"),
        ("wait" = Option<String>, Query, description = "Hold the request until the state changes, at most this long: 1s to 30s (e.g. 30s; any humantime duration in that range, such as 1500ms, is taken). Past serve's bound of held requests, answered at once", pattern = "^([1-9]|[12][0-9]|30)s$"),
    ),
    responses(
        (status = 200, description = "Where the buyer stands: state bought (the gate counts the user a buyer, or MySQL has the order; order null until the worker persisted it), waiting (position, ahead, eta_ms), not_waiting or ended; bought kept for callers written before state", body = super::schema::BuyerAnswer),
        (status = 404, description = "voucher_not_loaded: the voucher is not loaded at the gate and MySQL has no order of the user's"),
    ))]
pub async fn show(state: State, path: PathIds, uri: Uri) -> Result<Response, ApiError> {
    let started = Instant::now();
    let voucher = path.get("voucher")?;
    let user = path.get("user")?;
    VoucherKeys::new(&state.cfg.prefix, voucher)?;
    let wait = wait_of(uri.query())?;
    let first = stands(&state, voucher, user).await?;
    let settled = matches!(first.state, Place::Bought | Place::Ended);
    let Some(wait) = wait.filter(|_| !settled) else {
        return Ok(answer(voucher, user, &first));
    };
    // Past the bound, answered at once with the state now.
    let Ok(_held) = state.long_polls.try_acquire() else {
        return Ok(answer(voucher, user, &first));
    };
    tracing::debug!("voucher {voucher}: user {user}'s lookup held (up to {wait:?})");
    // Counted from the request's start: the backstop allows the wait on
    // top of a request's time, not on top of this lookup's first reads.
    let until = started + wait;
    let layout = layout_of(&state, voucher).await?;
    loop {
        let now = Instant::now();
        if now >= until {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(LOOK_EVERY.min(until - now)) => {}
            // Shutting down: answered now, not cut off at the drain's end.
            _ = state.stopping.cancelled() => break,
        }
        if glance(&state, &layout, user).await? != Some(first.state) {
            // Moved: the full look, MySQL's order with it.
            let last = stands(&state, voucher, user).await?;
            return Ok(answer(voucher, user, &last));
        }
    }
    // Unmoved: the place in line now, from the gate alone.
    let last = at_the_gate(&state, &layout, voucher, user, None).await?;
    Ok(answer(voucher, user, &last))
}

/// `?wait=<duration>`, 1s ..= 30s; other query parameters are ignored.
fn wait_of(query: Option<&str>) -> Result<Option<Duration>, ApiError> {
    let Some(text) = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("wait="))
    else {
        return Ok(None);
    };
    let wait = humantime::parse_duration(text)
        .ok()
        .filter(|w| (MIN_WAIT..=MAX_WAIT).contains(w))
        .ok_or_else(|| {
            ApiError::invalid_field(format!(
                "wait must be a duration from 1s to 30s (e.g. 30s, 1500ms), not {}",
                super::error::quote(text)
            ))
        })?;
    Ok(Some(wait))
}

/// How much longer than the backstop a request may take: a purchase
/// lookup's `?wait=` (a bad one is refused at once by the route); nothing
/// for any other route.
pub fn held_for(uri: &Uri) -> Duration {
    let segments: Vec<&str> = uri.path().split('/').collect();
    let lookup = matches!(
        segments.as_slice(),
        ["", "v1", "vouchers", _, "purchases", _]
    );
    match lookup {
        true => wait_of(uri.query()).ok().flatten().unwrap_or_default(),
        false => Duration::ZERO,
    }
}

async fn layout_of(state: &AppState, voucher: u64) -> Result<std::sync::Arc<Layout>, ApiError> {
    if let Some(layout) = state.windows.layout(voucher) {
        return Ok(layout);
    }
    let mut conn = state.redis();
    let layout =
        crate::gate::buckets::for_routing(&mut conn, &state.cfg.prefix, voucher, async || {
            Ok(state.db.clone())
        })
        .await
        .map_err(|e| {
            state.metrics.redis_error();
            ApiError::store(&e)
        })?;
    Ok(std::sync::Arc::new(layout))
}

/// The full look: MySQL's order first (an order persisted before the
/// gate was asked stays found even if a rebuild moves the buyer
/// meanwhile), then the gate.
async fn stands(state: &AppState, voucher: u64, user: u64) -> Result<Standing, ApiError> {
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
    // Found: bought, whatever the gate says (no gate read).
    let layout = match order {
        Some(_) => std::sync::Arc::new(Layout::single(&state.cfg.prefix, voucher)),
        None => layout_of(state, voucher).await?,
    };
    at_the_gate(state, &layout, voucher, user, order).await
}

/// Where the user stands by the gate (`order`: MySQL's, if it has one).
async fn at_the_gate(
    state: &AppState,
    layout: &Layout,
    voucher: u64,
    user: u64,
    order: Option<OrderView>,
) -> Result<Standing, ApiError> {
    let mut standing = Standing {
        state: Place::Bought,
        order,
        position: None,
        eta_ms: None,
        waiting_reference: None,
    };
    if standing.order.is_some() {
        return Ok(standing);
    }
    standing.state = glance(state, layout, user).await?.ok_or_else(|| {
        ApiError::new(
            Code::VoucherNotLoaded,
            format!("voucher {voucher} is not loaded at the gate"),
        )
    })?;
    if standing.state == Place::Waiting {
        let mut conn = state.redis();
        let (in_line, line) = redis_read(state, async {
            let in_line = waiting::in_line(&mut conn, layout, user).await?;
            Ok((in_line, waiting::line_of(&mut conn, layout).await?))
        })
        .await?;
        let position = in_line.as_ref().map(|w| w.position);
        standing.waiting_reference = in_line.and_then(|w| w.client_reference);
        state.pace.saw(voucher, line.promotions);
        // Served between the two looks: not waiting any more.
        standing.state = match position {
            Some(_) => Place::Waiting,
            None => glance(state, layout, user)
                .await?
                .unwrap_or(Place::NotWaiting),
        };
        standing.position = position;
        standing.eta_ms = position.and_then(|p| state.pace.eta_ms(voucher, p));
    }
    Ok(standing)
}

/// The gate's side alone, one round trip to the user's bucket: bought,
/// waiting, not waiting, or ended; None when that gate is not loaded.
async fn glance(state: &AppState, layout: &Layout, user: u64) -> Result<Option<Place>, ApiError> {
    redis_read(state, async {
        let keys = layout.keys_of_user(user)?;
        let mut conn = state.redis();
        type Look = (bool, Option<f64>, Option<i64>, (i64, i64));
        let (buyer, queued, end_ms, time): Look = redis::pipe()
            .sismember(keys.buyers(), user)
            .zscore(keys.waitlist(), user)
            .hget(keys.meta(), "end_ms")
            .cmd("TIME")
            .query_async(&mut conn)
            .await?;
        let now_ms = crate::support::timespec::redis_time_ms(time);
        Ok(Some(if buyer {
            Place::Bought
        } else if let Some(end) = end_ms {
            match (now_ms >= end, queued.is_some()) {
                (true, _) => Place::Ended,
                (false, true) => Place::Waiting,
                (false, false) => Place::NotWaiting,
            }
        } else {
            return Ok(None);
        }))
    })
    .await
}

async fn redis_read<T>(
    state: &AppState,
    read: impl std::future::Future<Output = crate::error::Result<T>>,
) -> Result<T, ApiError> {
    read.await.map_err(|e| {
        state.metrics.redis_error();
        ApiError::store(&e)
    })
}

fn answer(voucher: u64, user: u64, s: &Standing) -> Response {
    axum::Json(serde_json::json!({
        "voucher": voucher.to_string(),
        "user": user.to_string(),
        "bought": s.state == Place::Bought,
        "order": s.order.as_ref().map(super::order::answer),
        "state": s.state.name(),
        "position": s.position,
        "ahead": s.position.map(|p| p - 1),
        "eta_ms": s.eta_ms,
        "client_reference": s
            .order
            .as_ref()
            .and_then(|o| o.client_reference.as_ref())
            .or(s.waiting_reference.as_ref()),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_takes_one_to_thirty_seconds() {
        assert_eq!(wait_of(None).unwrap(), None);
        assert_eq!(wait_of(Some("x=1")).unwrap(), None);
        assert_eq!(
            wait_of(Some("x=1&wait=30s")).unwrap(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            wait_of(Some("wait=1500ms")).unwrap(),
            Some(Duration::from_millis(1500))
        );
        for bad in ["wait=31s", "wait=999ms", "wait=", "wait=soon", "wait=-1s"] {
            assert!(wait_of(Some(bad)).is_err(), "{bad}");
        }
    }
}
