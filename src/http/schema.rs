//! The bodies the handlers build as JSON, described for the OpenAPI
//! document (src/http/openapi.rs); the handlers name them in their
//! annotations. Types only: nothing here is sent as is.

use serde::Serialize;
use utoipa::ToSchema;

/// A purchase's answer: the fields of `seckill buy --format json`.
#[derive(Serialize, ToSchema)]
pub struct PurchaseAnswer {
    /// success, already_bought, sold_out, not_started, ended,
    /// unknown_voucher, paused, rate_limited, bad_token or not_enough_stock
    /// (an `unknown` outcome is a problem: code outcome_unknown)
    pub outcome: String,
    pub voucher: String,
    pub user: String,
    /// The new order's id (success only), a decimal string.
    pub order_id: Option<String>,
    /// The user's 1-based place on the waitlist (sold_out only; null when
    /// the waitlist is full and the user is not on it).
    pub waitlist_position: Option<u64>,
    /// sold_out only: the waitlist is full (the voucher's waitlist limit).
    pub waitlist_full: Option<bool>,
    /// sold_out only: true when the voucher is not sold out but the
    /// user's bucket holds fewer units than asked while its other buckets
    /// may hold them: the request waits on the waitlist for the units to
    /// be brought (a voucher in buckets).
    pub units_elsewhere: Option<bool>,
    /// not_enough_stock only: the units left, fewer than asked.
    pub units_left: Option<i64>,
    /// When the sale opens, Unix ms (not_started only), and as text.
    pub begin_ms: Option<i64>,
    pub begin: Option<String>,
    /// When the sale closed, Unix ms (ended only), and as text.
    pub end_ms: Option<i64>,
    pub end: Option<String>,
    /// With `--wait-replicas`, on a success: how many replicas had it.
    pub replicas_acked: Option<u32>,
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
    /// The share of the voucher's units taken, 0 to 1 (units held for
    /// unpaid orders count; a unit released comes back).
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub claimed: f64,
    /// Requests waiting in line, every bucket's.
    pub waiting: u64,
}

/// As `seckill order show --format json`, every id a string.
#[derive(Serialize, ToSchema)]
pub struct OrderAnswer {
    pub id: String,
    pub user: String,
    pub voucher: String,
    /// pending, paid or cancelled
    pub status: String,
    /// The units the order holds.
    pub quantity: u64,
    pub created_ms: i64,
    pub deadline_ms: i64,
    pub paid_ms: Option<i64>,
    pub cancelled_ms: Option<i64>,
    /// Restored pending after MySQL lost it, its payment unknown: nothing
    /// cancels it until the operator settles it.
    pub held: bool,
    /// The purchase's client_reference, carried from the request (or its
    /// place in line) to the order; null without one.
    #[schema(max_length = 64)]
    pub client_reference: Option<String>,
}

/// Whether a user bought a voucher (`GET .../purchases/{user}`).
#[derive(Serialize, ToSchema)]
pub struct BuyerAnswer {
    pub voucher: String,
    pub user: String,
    /// The gate counts the user a buyer, or MySQL has the user's order.
    pub bought: bool,
    /// The order once the worker has persisted it; null until then (or
    /// when the user has none).
    pub order: Option<OrderAnswer>,
    /// bought, waiting, not_waiting or ended (a buyer stays bought after
    /// the sale's end; anyone else is ended then).
    pub state: String,
    /// waiting only: the place in the voucher's line, every bucket's
    /// requests queued before this one plus one (1 = next); else null.
    pub position: Option<u64>,
    /// waiting only: position - 1; else null.
    pub ahead: Option<u64>,
    /// waiting only: an estimate of the ms until the request is served,
    /// from the pace the line has moved at over the last minutes; null
    /// without a basis.
    pub eta_ms: Option<u64>,
    /// The client_reference of the user's order (once persisted) or of the
    /// request waiting in line; null without one, or while an admitted
    /// order is on its way to MySQL.
    #[schema(max_length = 64)]
    pub client_reference: Option<String>,
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
