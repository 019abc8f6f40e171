//! Layer 5: payment deadlines. Claiming due deadlines with a lease, cancelling
//! unpaid orders in MySQL (the unit back to MySQL stock exactly when the
//! status changed), giving the unit back at the gate once per order (to the
//! waitlist's head, or to the stock), and finding overdue orders whose
//! deadline Redis lost.

use mysql_async::prelude::*;
use mysql_async::{Conn, TxOpts};
use redis::Value;

use crate::error::{Error, Result};
use crate::orders::counters::ADD_CANCELLED;
use crate::orders::order::OrderStatus;
use crate::orders::timeouts::Existing;
use crate::orders::voucher::RowRead;
use crate::store::db::{join_ids, Db};
use crate::store::keys::VoucherKeys;
use crate::store::layout::Layout;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::{value_text, RedisConn};
use crate::store::scripts::{CLAIM_DUE, RELEASE};
use crate::support::set_digest::SetDigest;

/// A claimed deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub order: u64,
    pub deadline_ms: i64,
}

/// Claims up to `limit` due deadlines for `lease_ms`; returns Redis's clock
/// and the deadlines as they were.
pub async fn claim_due(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    lease_ms: u64,
    limit: usize,
) -> Result<(i64, Vec<Due>)> {
    let (now, flat): (i64, Vec<Value>) = CLAIM_DUE
        .key(keys.timeouts())
        .arg(lease_ms)
        .arg(limit)
        .invoke_async(conn)
        .await?;
    let mut due = Vec::with_capacity(flat.len() / 2);
    for pair in flat.chunks(2) {
        let [member, score] = pair else { continue };
        let (member, score) = (value_text(member), value_text(score));
        match (member.parse::<u64>(), score.parse::<f64>()) {
            (Ok(order), Ok(deadline)) => due.push(Due {
                order,
                deadline_ms: deadline as i64,
            }),
            _ => tracing::warn!(
                "{}: ignoring malformed deadline {member:?} {score:?}",
                keys.timeouts()
            ),
        }
    }
    Ok((now, due))
}

/// What MySQL said about orders whose deadline came.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cancellation {
    /// (order, units) cancelled now or earlier: their units must be given
    /// back at the gate (release.lua makes that happen once per order).
    pub cancelled: Vec<(u64, u64)>,
    /// The voucher's per-user limit (how many fresh ids a release needs).
    pub per_user_limit: u32,
    /// How many of them this transaction cancelled (and restocked in MySQL).
    pub cancelled_now: u64,
    /// The units those orders held, back in MySQL's stock now.
    pub units_now: u64,
    /// Paid, or of another voucher: their deadline is simply dropped.
    pub settled: Vec<u64>,
    /// Not in MySQL at all. A deadline is scheduled only once its order is
    /// committed, so MySQL lost them (a failover, a backup restored) unless
    /// they were deleted by hand: the caller decides (worker/canceller.rs).
    pub missing: Vec<u64>,
    /// The voucher row's count of orders, read in the same transaction.
    pub orders_total: u64,
}

/// In one transaction: `pending -> cancelled` for these orders of `voucher`,
/// and `stock + k` for exactly the units k of the rows that changed (their
/// quantities, read under the rows' locks). A concurrent payment
/// of the same order waits for the row lock and then finds it cancelled (or
/// this update finds it paid): exactly one outcome.
/// On `conn` (a session the worker has fenced: worker/fence.rs).
pub async fn cancel_unpaid(conn: &mut Conn, voucher: u64, orders: &[u64]) -> Result<Cancellation> {
    if orders.is_empty() {
        return Ok(Cancellation::default());
    }
    let ids = join_ids(orders.iter().copied());
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let (cancelled, pending) = (OrderStatus::Cancelled.code(), OrderStatus::Pending.code());
    // Locked first: a payment of one of them waits until this commits, so
    // the units restocked are exactly those of the rows cancelled below.
    let unpaid: Vec<(u64, u64)> = tx
        .query(format!(
            "SELECT id, quantity FROM seckill_order
              WHERE voucher_id = {voucher} AND id IN ({ids}) AND status = {pending} AND held = 0
              FOR UPDATE"
        ))
        .await?;
    let units_now: u64 = unpaid.iter().map(|(_, q)| q).sum();
    let mut cancelled_now = 0;
    if !unpaid.is_empty() {
        let locked = join_ids(unpaid.iter().map(|(id, _)| *id));
        tx.query_drop(format!(
            "UPDATE seckill_order SET status = {cancelled}, cancel_time = NOW(3)
              WHERE voucher_id = {voucher} AND id IN ({locked}) AND status = {pending}"
        ))
        .await?;
        cancelled_now = tx.affected_rows();
        let ids = SetDigest::of(unpaid.iter().map(|(id, _)| *id));
        tx.exec_drop(
            format!("UPDATE seckill_voucher SET stock = stock + ?, {ADD_CANCELLED} WHERE voucher_id = ?"),
            (units_now, cancelled_now, units_now, ids.0, ids.0, voucher),
        )
        .await?;
    }
    let rows: Vec<(u64, u64, i8, u64)> = tx
        .query(format!(
            "SELECT id, voucher_id, IF(held = 1 AND status = {pending}, 2, status), quantity
               FROM seckill_order WHERE id IN ({ids})"
        ))
        .await?;
    let row: Option<(i64, u64)> = tx
        .exec_first(
            "SELECT per_user_limit, orders_total FROM seckill_voucher WHERE voucher_id = ?",
            (voucher,),
        )
        .await?;
    let (per_user_limit, orders_total) = (row.map(|r| r.0), row.map_or(0, |r| r.1));
    crate::support::fault::point("before_cancel_commit").await?;
    tx.commit().await?;
    let mut out = Cancellation {
        cancelled_now,
        units_now,
        orders_total,
        per_user_limit: per_user_limit.map_or(1, |l| {
            l.clamp(1, i64::from(crate::orders::policy::MAX_PER_USER_LIMIT)) as u32
        }),
        ..Default::default()
    };
    for &order in orders {
        let found = rows
            .iter()
            .find(|r| r.0 == order)
            .map(|&(_, v, status, units)| (v, OrderStatus::from_code(status), units));
        match found {
            Some((v, Some(OrderStatus::Cancelled), units)) if v == voucher => {
                out.cancelled.push((order, units.max(1)))
            }
            Some((v, Some(OrderStatus::Pending), _)) if v == voucher => {
                // Not possible after the update above; keep the deadline.
                tracing::warn!("order {order} is still pending after its cancellation");
            }
            Some(_) => out.settled.push(order),
            None => out.missing.push(order),
        }
    }
    Ok(out)
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Units given back now (an order already released counts 0).
    pub released: u64,
    /// Units handed to waitlisted users: from those released and from the
    /// gate's stock, which joins them (so it may exceed `released`).
    pub promoted: u64,
    /// Nothing was done: the gate is paused (its deadlines come back after
    /// their lease and are released once it reopens).
    pub deferred: bool,
}

/// Whose release it is while the gate is paused (lua/release.lua).
#[derive(Debug, Clone, Copy)]
pub enum WhilePaused<'a> {
    /// A payment deadline: wait for the gate to reopen.
    Defer,
    /// A repair made on a view read with this pause token: go on if no
    /// pause came since.
    RepairedUnder(&'a str),
}

/// Gives back the units of `cancelled` orders, (order, units), at the
/// gate, once per order, and drops the deadlines of `settled` ones
/// (release.lua). `per_user_limit` is the voucher's: with the units it
/// bounds the promotions one release can make, each needing a fresh id.
#[allow(clippy::too_many_arguments)]
pub async fn release(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
    cancelled: &[(u64, u64)],
    per_user_limit: u32,
    settled: &[u64],
    ids: &OrderIds,
    paused: WhilePaused<'_>,
) -> Result<Released> {
    if cancelled.is_empty() && settled.is_empty() {
        return Ok(Released::default());
    }
    let mut inv = RELEASE.prepare_invoke();
    inv.key(keys.stock())
        .key(keys.buyers())
        .key(keys.waitlist())
        .key(keys.orders())
        .key(keys.events())
        .key(keys.timeouts())
        .key(keys.released())
        .key(keys.meta())
        .key(keys.holds())
        .key(keys.waitlist_quantity())
        .arg(voucher)
        .arg(match paused {
            WhilePaused::Defer => "",
            WhilePaused::RepairedUnder(token) => token,
        })
        .arg(cancelled.len());
    for (order, units) in cancelled {
        inv.arg(*order).arg(*units).arg(ids.next_id()?);
    }
    // Promotions can reach the units released plus what the gate's stock
    // held (less than one request's worth when anyone waits).
    let units: u64 = cancelled.iter().map(|(_, u)| u).sum();
    let extra = (units + u64::from(per_user_limit)).saturating_sub(cancelled.len() as u64);
    inv.arg(extra);
    for _ in 0..extra {
        inv.arg(ids.next_id()?);
    }
    for order in settled {
        inv.arg(*order);
    }
    let (released, promoted, deferred): (u64, u64, u8) = inv.invoke_async(conn).await?;
    Ok(Released {
        released,
        promoted,
        deferred: deferred == 1,
    })
}

/// Pending orders of `voucher` (id, user) created before `created_before_ms`: overdue
/// by MySQL's own account, whatever Redis remembers (the backstop sweep).
pub async fn overdue_in_mysql(
    db: &Db,
    voucher: u64,
    created_before_ms: i64,
    limit: usize,
) -> Result<Vec<(u64, u64)>> {
    let mut conn = db.conn().await?;
    Ok(conn
        .exec(
            "SELECT id, user_id FROM seckill_order
              WHERE voucher_id = ? AND status = ? AND create_time < FROM_UNIXTIME(? / 1000)
              ORDER BY create_time LIMIT ?",
            (
                voucher,
                OrderStatus::Pending.code(),
                created_before_ms,
                limit as u64,
            ),
        )
        .await?)
}

/// Which of `orders` MySQL has cancelled (of `voucher`).
pub async fn cancelled_among(db: &Db, voucher: u64, orders: &[u64]) -> Result<Vec<u64>> {
    if orders.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = db.conn().await?;
    Ok(conn
        .query(format!(
            "SELECT id FROM seckill_order WHERE voucher_id = {voucher} AND id IN ({}) AND status = {}",
            join_ids(orders.iter().copied()),
            OrderStatus::Cancelled.code()
        ))
        .await?)
}

/// Every cancelled order of `voucher` (id, user).
async fn cancelled_in_mysql(db: &Db, voucher: u64) -> Result<Vec<(u64, u64)>> {
    let mut conn = db.conn().await?;
    Ok(conn
        .exec(
            "SELECT id, user_id FROM seckill_order WHERE voucher_id = ? AND status = ?",
            (voucher, OrderStatus::Cancelled.code()),
        )
        .await?)
}

/// The orders of `orders` ((order, user) pairs) whose units the gate owes
/// back: not released, their user one of its buyers (a gate Redis set back
/// to before the user's admission counts that unit free already).
async fn owed_releases(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    orders: &[(u64, u64)],
) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for chunk in orders.chunks(1_000) {
        let ids: Vec<u64> = chunk.iter().map(|(o, _)| *o).collect();
        let users: Vec<u64> = chunk.iter().map(|(_, u)| *u).collect();
        let (released, buyers): (Vec<bool>, Vec<bool>) = redis::pipe()
            .cmd("SMISMEMBER")
            .arg(keys.released())
            .arg(&ids)
            .cmd("SMISMEMBER")
            .arg(keys.buyers())
            .arg(&users)
            .query_async(conn)
            .await?;
        out.extend(
            ids.iter()
                .zip(released.iter().zip(&buyers))
                .filter(|(_, (released, buyer))| !**released && **buyer)
                .map(|(o, _)| *o),
        );
    }
    Ok(out)
}

/// Gives each cancelled order of `voucher` that its gate (of `layout`) has
/// not released, whose user is one of the gate's buyers and that has no
/// deadline one due at `at_ms` (one there,
/// claimed or not, stays): the claim path finds it cancelled and its
/// release gives the unit back, once (lua/release.lua). For the units of
/// cancellations whose release nothing else will make (the sweep calls it
/// when the gates' released sets disagree with MySQL's cancellations two
/// sweeps running: the checked model's finding M5). Reads every cancelled
/// order of the voucher. Returns how many got a deadline.
pub async fn schedule_unreleased(
    conn: &mut impl RedisConn,
    db: &Db,
    layout: &Layout,
    voucher: u64,
    at_ms: i64,
) -> Result<usize> {
    let orders = cancelled_in_mysql(db, voucher).await?;
    let mut scheduled = 0;
    for (keys, mine) in layout.split_orders(&orders)? {
        let owed = owed_releases(conn, &keys, &mine).await?;
        scheduled += schedule_missing(conn, &keys, &owed, at_ms).await?;
    }
    Ok(scheduled)
}

/// Gives each of `orders` that has no deadline in Redis one due at `at_ms`
/// (a scheduled or claimed deadline is left as it is). Returns how many had
/// none.
pub async fn schedule_missing(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    orders: &[u64],
    at_ms: i64,
) -> Result<usize> {
    if orders.is_empty() {
        return Ok(0);
    }
    let pairs: Vec<(u64, i64)> = orders.iter().map(|o| (*o, at_ms)).collect();
    crate::orders::timeouts::schedule(conn, keys, &pairs, Existing::Stays).await
}

/// The payment timeout of a voucher, from MySQL.
pub async fn pay_timeout_ms(db: &Db, voucher: u64) -> Result<i64> {
    let mut conn = db.conn().await?;
    crate::orders::voucher::pay_timeout_ms(&mut conn, voucher, RowRead::Plain)
        .await?
        .ok_or(Error::VoucherNotFound(voucher))
}
