//! One order as operators need it when a customer calls.

use mysql_async::prelude::*;
use serde::Serialize;

use crate::error::Result;
use crate::store::db::Db;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct OrderView {
    /// A string in JSON: 64-bit ids do not survive JavaScript numbers.
    #[serde(serialize_with = "as_string")]
    pub id: u64,
    pub user: u64,
    pub voucher: u64,
    /// `pending`, `paid` or `cancelled`.
    pub status: &'static str,
    /// The units the order holds.
    pub quantity: u64,
    pub created_ms: i64,
    pub deadline_ms: i64,
    pub paid_ms: Option<i64>,
    pub cancelled_ms: Option<i64>,
    /// Its payment deadline is held (**new**): restored pending after
    /// MySQL lost it, its payment unknown; nothing cancels it until the
    /// operator pays or unholds it.
    pub held: bool,
    /// The caller's client reference of the purchase (**new**), null
    /// without one.
    pub client_reference: Option<String>,
}

fn as_string<S: serde::Serializer>(id: &u64, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&id.to_string())
}

/// `seckill_order.status`, a public contract shared with the Java version:
/// 0 pending payment, 1 paid, -1 cancelled at the payment deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    Pending,
    Paid,
    Cancelled,
}

impl OrderStatus {
    /// The column's value.
    pub const fn code(self) -> i8 {
        match self {
            OrderStatus::Pending => 0,
            OrderStatus::Paid => 1,
            OrderStatus::Cancelled => -1,
        }
    }

    /// None for a value this tool never writes.
    pub const fn from_code(code: i8) -> Option<OrderStatus> {
        match code {
            0 => Some(OrderStatus::Pending),
            1 => Some(OrderStatus::Paid),
            -1 => Some(OrderStatus::Cancelled),
            _ => None,
        }
    }

    /// The word in tables and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            OrderStatus::Pending => "pending",
            OrderStatus::Paid => "paid",
            OrderStatus::Cancelled => "cancelled",
        }
    }
}

/// The word for a stored status, `unknown` for a value this tool never writes.
pub fn status_name(code: i8) -> &'static str {
    OrderStatus::from_code(code).map_or("unknown", OrderStatus::name)
}

type Row = (
    u64,
    u64,
    u64,
    i8,
    i64,
    Option<i64>,
    Option<i64>,
    i64,
    u64,
    i8,
    Option<String>,
);

const SELECT_VIEW: &str = "SELECT o.id, o.user_id, o.voucher_id, o.status,
        CAST(ROUND(UNIX_TIMESTAMP(o.create_time) * 1000) AS SIGNED),
        CAST(ROUND(UNIX_TIMESTAMP(o.pay_time) * 1000) AS SIGNED),
        CAST(ROUND(UNIX_TIMESTAMP(o.cancel_time) * 1000) AS SIGNED),
        v.pay_timeout_ms, o.quantity, o.held, o.client_reference
   FROM seckill_order o JOIN seckill_voucher v ON v.voucher_id = o.voucher_id";

pub async fn get(db: &Db, id: u64) -> Result<Option<OrderView>> {
    view_where(db, "o.id = ?", vec![id.into()]).await
}

/// The user's order for the voucher (one per user: the UNIQUE key), once
/// the worker has persisted it.
pub async fn of_user(db: &Db, voucher: u64, user: u64) -> Result<Option<OrderView>> {
    let filter = "o.user_id = ? AND o.voucher_id = ?";
    view_where(db, filter, vec![user.into(), voucher.into()]).await
}

async fn view_where(
    db: &Db,
    filter: &str,
    params: Vec<mysql_async::Value>,
) -> Result<Option<OrderView>> {
    let mut conn = db.conn().await?;
    let row: Option<Row> = conn
        .exec_first(format!("{SELECT_VIEW} WHERE {filter}"), params)
        .await?;
    Ok(row.map(|r| OrderView {
        id: r.0,
        user: r.1,
        voucher: r.2,
        status: status_name(r.3),
        created_ms: r.4,
        deadline_ms: r.4 + r.7,
        paid_ms: r.5,
        cancelled_ms: r.6,
        quantity: r.8,
        held: r.9 == 1 && r.3 == OrderStatus::Pending.code(),
        client_reference: r.10,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_schema_contract() {
        for s in [
            OrderStatus::Pending,
            OrderStatus::Paid,
            OrderStatus::Cancelled,
        ] {
            assert_eq!(OrderStatus::from_code(s.code()), Some(s));
        }
        assert_eq!(OrderStatus::Cancelled.code(), -1);
        assert_eq!(status_name(7), "unknown");
    }
}
