//! `seckill pay`: pending → paid, conditionally, before the deadline. Racing
//! the deadline on one order, exactly one of the two conditional updates
//! changes the row.

use mysql_async::prelude::*;

use crate::error::Result;
use crate::orders::counters::ADD_PAID;
use crate::orders::order::OrderStatus;
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::layout::Layout;
use crate::store::redis_conn;
use crate::store::redis_conn::RedisConn;
use crate::support::set_digest;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayOutcome {
    Paid {
        voucher: u64,
        user: u64,
    },
    AlreadyPaid,
    Cancelled,
    /// Still pending, but its payment deadline has passed: it is about to be
    /// cancelled and can no longer be paid.
    DeadlinePassed,
    UnknownOrder,
}

impl PayOutcome {
    /// The outcome's name, as `seckill pay --format json` and the HTTP API
    /// give it.
    pub fn name(&self) -> &'static str {
        match self {
            PayOutcome::Paid { .. } => "paid",
            PayOutcome::AlreadyPaid => "already_paid",
            PayOutcome::Cancelled => "cancelled",
            PayOutcome::DeadlinePassed => "deadline_passed",
            PayOutcome::UnknownOrder => "unknown_order",
        }
    }
}

pub async fn pay(db: &Db, order: u64) -> Result<PayOutcome> {
    let mut conn = db.conn().await?;
    let (outcome, _) = pay_marked(&mut conn, order, None).await?;
    Ok(outcome)
}

/// The key that paid an order (whenever it was), and the order's voucher
/// and user.
pub(crate) struct PaidBy {
    pub key: String,
    pub voucher: u64,
    pub user: u64,
}

/// Pays the order, marking it paid by `key` (an idempotency key's id,
/// src/orders/payment_key.rs) in the same statement. Also returns the key
/// that paid the order, if a key did.
pub(crate) async fn pay_marked(
    conn: &mut mysql_async::Conn,
    order: u64,
    key: Option<&str>,
) -> Result<(PayOutcome, Option<PaidBy>)> {
    // One statement, the voucher's counters with the order: a payer that
    // stops mid-way (a frozen `serve`) cannot hold the voucher row, which
    // every batch of the voucher needs, past the statement.
    let pay = pay_sql(
        "AND (o.held = 1 OR o.create_time > NOW(3) - INTERVAL v.pay_timeout_ms * 1000 MICROSECOND)",
    );
    let params = (
        OrderStatus::Paid.code(),
        key,
        set_digest::hash(order),
        order,
        OrderStatus::Pending.code(),
    );
    // A deadlock with a batch of the voucher (it holds the row and waits
    // for this order's lock: a redelivery of it) rolls this statement back
    // whole; InnoDB lets the batch through, so once more succeeds.
    if let Err(e) = conn.exec_drop(&pay, params).await {
        if crate::error::mysql_code(&e) != Some(crate::error::mysql_codes::LOCK_DEADLOCK) {
            return Err(e.into());
        }
        conn.exec_drop(&pay, params).await?;
    }
    let paid_now = conn.affected_rows() > 0;
    let row: Option<(u64, u64, i8, Option<String>)> = conn
        .exec_first(
            "SELECT voucher_id, user_id, status, pay_key FROM seckill_order WHERE id = ?",
            (order,),
        )
        .await?;
    let Some((voucher, user, status, paid_by)) = row else {
        return Ok((PayOutcome::UnknownOrder, None));
    };
    let outcome = match OrderStatus::from_code(status) {
        Some(OrderStatus::Paid) if paid_now => PayOutcome::Paid { voucher, user },
        Some(OrderStatus::Paid) => PayOutcome::AlreadyPaid,
        Some(OrderStatus::Cancelled) => PayOutcome::Cancelled,
        _ => PayOutcome::DeadlinePassed,
    };
    let paid_by = paid_by.map(|key| PaidBy { key, voucher, user });
    Ok((outcome, paid_by))
}

/// The conditional update of one order pending → paid, with the voucher's
/// counters, under `condition` besides.
fn pay_sql(condition: &str) -> String {
    format!(
        "UPDATE seckill_order o JOIN seckill_voucher v ON v.voucher_id = o.voucher_id
            SET o.status = ?, o.pay_time = NOW(3), o.pay_key = COALESCE(?, o.pay_key), {ADD_PAID}
          WHERE o.id = ? AND o.status = ? {condition}"
    )
}

/// Pays again, whatever their deadline, the pending `orders` of `voucher`
/// that Redis saw paid (its paid set) and MySQL no longer has paid: MySQL
/// lost the payments (a failover to an asynchronous replica, a backup
/// restored). Returns those paid again.
pub async fn pay_again(db: &Db, voucher: u64, orders: &[u64]) -> Result<Vec<u64>> {
    let mut conn = db.conn().await?;
    let pay = pay_sql("AND o.voucher_id = ?");
    let mut paid = Vec::new();
    for &order in orders {
        let params = (
            OrderStatus::Paid.code(),
            None::<String>,
            set_digest::hash(order),
            order,
            OrderStatus::Pending.code(),
            voucher,
        );
        conn.exec_drop(&pay, params).await?;
        if conn.affected_rows() > 0 {
            paid.push(order);
        }
    }
    Ok(paid)
}

/// Pays the order; once paid, drops its deadline and records the payment
/// at the gate. If Redis cannot be reached, the canceller finds the order
/// paid and drops the deadline itself (but nothing records the payment:
/// a MySQL that then loses it cancels the order).
pub async fn pay_and_drop_deadline(cfg: &Config, db: &Db, order: u64) -> Result<PayOutcome> {
    let outcome = pay(db, order).await?;
    crate::support::fault::pause("after_pay").await;
    if let PayOutcome::Paid { voucher, user } = outcome {
        match redis_conn::connect(cfg).await {
            Ok(mut redis) => forget_quietly(&mut redis, &cfg.prefix, (voucher, user), order).await,
            Err(e) => tracing::debug!("could not drop the deadline of order {order}: {e}"),
        }
    }
    Ok(outcome)
}

/// The same on a connection the caller holds (`seckill serve`).
pub async fn pay_on(
    db: &Db,
    conn: &mut impl RedisConn,
    prefix: &str,
    order: u64,
) -> Result<PayOutcome> {
    let outcome = pay(db, order).await?;
    crate::support::fault::pause("after_pay").await;
    if let PayOutcome::Paid { voucher, user } = outcome {
        forget_quietly(conn, prefix, (voucher, user), order).await;
    }
    Ok(outcome)
}

/// [`forget_deadline`], its failure only logged (the canceller drops it).
pub(crate) async fn forget_quietly(
    conn: &mut impl RedisConn,
    prefix: &str,
    (voucher, user): (u64, u64),
    order: u64,
) {
    if let Err(e) = forget_deadline(conn, prefix, (voucher, user), order).await {
        tracing::debug!("could not drop the deadline of order {order}: {e}");
    }
}

/// After a payment, the deadline has nothing left to do; dropping it saves
/// the canceller a MySQL round trip (it would find the order paid anyway),
/// and the gate keeps the order in its paid set: should MySQL lose the
/// payment, the canceller pays the order again instead of cancelling it.
pub async fn forget_deadline(
    conn: &mut impl RedisConn,
    prefix: &str,
    (voucher, user): (u64, u64),
    order: u64,
) -> Result<()> {
    // The deadline is in the gate of the user's bucket.
    let keys = Layout::read(conn, prefix, voucher)
        .await?
        .keys_of_user(user)?;
    crate::orders::timeouts::drop_paid(conn, &keys, &[order]).await?;
    Ok(())
}
