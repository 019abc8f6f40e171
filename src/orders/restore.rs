//! Orders MySQL lost (a failover to an asynchronous replica, a backup
//! restored) put back from what Redis kept of them: the stream entry a
//! worker acknowledged after committing it (id, user, quantity, time), and
//! the gate's records of what became of it since. An order whose unit the
//! gate gave back comes back cancelled (that unit may be sold again
//! already); one whose payment deadline the gate holds comes back pending,
//! its deadline running, or cancelled if that deadline passed (see
//! [`LostState::PastDeadline`]); one the gate knows neither way (paid, or
//! cancelled in MySQL before the loss) comes back pending and held
//! (schema 7): nothing cancels it, the operator settles it.

use std::collections::HashSet;
use std::fmt::Write as _;

use mysql_async::prelude::*;
use mysql_async::TxOpts;

use crate::error::{Error, Result};
use crate::orders::counters;
use crate::orders::order::OrderStatus;
use crate::store::db::{join_ids, sql_text_or_null, sql_time_ms, Db};

/// Orders per statement: a million lost orders in one INSERT would pass
/// MySQL's max_allowed_packet.
const CHUNK: usize = 5_000;

/// An order MySQL lost, as its kept stream entry and the gate know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostCommit {
    pub user: u64,
    pub order: u64,
    pub quantity: u64,
    /// The entry's time: the order's creation time.
    pub created_ms: i64,
    /// The caller's client reference its entry carried.
    pub client_reference: Option<String>,
    pub state: LostState,
}

/// How the gate knows a lost order now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostState {
    /// Its unit was given back: it was cancelled.
    Released,
    /// Its payment deadline is scheduled and still ahead: pending.
    AwaitingPayment,
    /// Its deadline is still scheduled but passed: nobody can pay it any
    /// more, and a worker may be between its cancellation (lost with
    /// MySQL) and its release. Restored cancelled, its unit still taken
    /// at the gate: the release to come (the worker's, or the next claim
    /// of the deadline) gives it back once. Restored pending, that
    /// release would give back a unit a pending order holds.
    PastDeadline,
    /// Neither: paid, or cancelled in MySQL and its deadline dropped,
    /// before the loss. Only the payment provider can tell: held.
    Unknown,
}

/// What a restore put back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    pub pending: u64,
    pub cancelled: u64,
    /// Pending and held, for the operator.
    pub held: Vec<u64>,
    /// In MySQL already (restored by another run, or persisted meanwhile).
    pub present: u64,
    /// Pending orders cancelled again (their cancellation lost).
    pub cancelled_again: u64,
}

impl Restored {
    pub fn count(&self) -> u64 {
        self.pending + self.cancelled + self.held.len() as u64
    }
}

/// Puts `lost` back into MySQL with their ids, and cancels again the
/// pending orders of `cancel` (whose units the gate gave back: MySQL lost
/// their cancellation), in one transaction under the voucher row's lock:
/// the pending ones take their units from the stock again (all or none: a
/// stock short of them means MySQL sold those units since, and nothing is
/// restored), the cancelled ones give theirs back, and the row's counters
/// are counted again with them. Orders MySQL has already are left as they
/// are.
pub async fn restore(
    db: &Db,
    voucher: u64,
    lost: &[LostCommit],
    cancel: &[u64],
) -> Result<Restored> {
    let mut out = Restored::default();
    if lost.is_empty() && cancel.is_empty() {
        return Ok(out);
    }
    let mut conn = db.conn().await?;
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let stock: Option<i64> = tx
        .exec_first(
            "SELECT stock FROM seckill_voucher WHERE voucher_id = ? FOR UPDATE",
            (voucher,),
        )
        .await?;
    let Some(stock) = stock else {
        return Err(Error::VoucherNotFound(voucher));
    };
    let stock = stock + cancel_again(&mut tx, voucher, cancel, &mut out).await? as i64;
    let fresh = absent(&mut tx, voucher, lost).await?;
    out.present = (lost.len() - fresh.len()) as u64;
    if fresh.is_empty() {
        counters::repair_in(&mut tx, voucher).await?;
        tx.commit().await?;
        return Ok(out);
    }
    let units: u64 = fresh
        .iter()
        .filter(|l| l.state == LostState::AwaitingPayment || l.state == LostState::Unknown)
        .map(|l| l.quantity)
        .sum();
    if units as i64 > stock {
        return Err(Error::mysql(format!(
            "voucher {voucher}: the {} order(s) MySQL lost hold {units} unit(s), but its stock is {stock}: those units were sold again in MySQL; nothing restored",
            fresh.len()
        )));
    }
    for chunk in fresh.chunks(CHUNK) {
        let mut sql = String::from(
            "INSERT INTO seckill_order (id, user_id, voucher_id, status, create_time, quantity, cancel_time, held, client_reference) VALUES ",
        );
        for (n, l) in chunk.iter().enumerate() {
            if n > 0 {
                sql.push(',');
            }
            let (status, cancel_time, held) = match l.state {
                LostState::Released | LostState::PastDeadline => {
                    (OrderStatus::Cancelled, "NOW(3)", 0)
                }
                LostState::AwaitingPayment => (OrderStatus::Pending, "NULL", 0),
                LostState::Unknown => (OrderStatus::Pending, "NULL", 1),
            };
            let _ = write!(
                sql,
                "({},{},{voucher},{},{},{},{cancel_time},{held},{})",
                l.order,
                l.user,
                status.code(),
                sql_time_ms(l.created_ms),
                l.quantity,
                sql_text_or_null(l.client_reference.as_deref())
            );
            match l.state {
                LostState::Released | LostState::PastDeadline => out.cancelled += 1,
                LostState::AwaitingPayment => out.pending += 1,
                LostState::Unknown => out.held.push(l.order),
            }
        }
        tx.query_drop(sql).await?;
    }
    tx.exec_drop(
        "UPDATE seckill_voucher SET stock = stock - ? WHERE voucher_id = ?",
        (units, voucher),
    )
    .await?;
    counters::repair_in(&mut tx, voucher).await?;
    tx.commit().await?;
    Ok(out)
}

/// Of `lost`, those MySQL has neither by id nor by user (the UNIQUE key).
async fn absent<'a>(
    tx: &mut mysql_async::Transaction<'_>,
    voucher: u64,
    lost: &'a [LostCommit],
) -> Result<Vec<&'a LostCommit>> {
    if lost.is_empty() {
        return Ok(Vec::new());
    }
    let mut taken_ids: HashSet<u64> = HashSet::new();
    let mut taken_users: HashSet<u64> = HashSet::new();
    for chunk in lost.chunks(CHUNK) {
        let ids = join_ids(chunk.iter().map(|l| l.order));
        let users = join_ids(chunk.iter().map(|l| l.user));
        let found: Vec<u64> = tx
            .query(format!("SELECT id FROM seckill_order WHERE id IN ({ids})"))
            .await?;
        taken_ids.extend(found);
        let found: Vec<u64> = tx
            .exec(
                format!("SELECT user_id FROM seckill_order WHERE voucher_id = ? AND user_id IN ({users})"),
                (voucher,),
            )
            .await?;
        taken_users.extend(found);
    }
    Ok(lost
        .iter()
        .filter(|l| !taken_ids.contains(&l.order) && !taken_users.contains(&l.user))
        .collect())
}

/// `pending -> cancelled` for those of `orders` still pending, their units
/// back in the stock; returns those units.
async fn cancel_again(
    tx: &mut mysql_async::Transaction<'_>,
    voucher: u64,
    orders: &[u64],
    out: &mut Restored,
) -> Result<u64> {
    if orders.is_empty() {
        return Ok(0);
    }
    let pending = OrderStatus::Pending.code();
    let mut units = 0;
    for chunk in orders.chunks(CHUNK) {
        let rows: Vec<(u64, u64)> = tx
            .exec(
                format!(
                    "SELECT id, quantity FROM seckill_order
                      WHERE voucher_id = ? AND status = ? AND id IN ({}) FOR UPDATE",
                    join_ids(chunk.iter().copied())
                ),
                (voucher, pending),
            )
            .await?;
        if rows.is_empty() {
            continue;
        }
        tx.exec_drop(
            format!(
                "UPDATE seckill_order SET status = ?, cancel_time = NOW(3)
                  WHERE voucher_id = ? AND status = ? AND id IN ({})",
                join_ids(rows.iter().map(|(id, _)| *id))
            ),
            (OrderStatus::Cancelled.code(), voucher, pending),
        )
        .await?;
        units += rows.iter().map(|(_, q)| q).sum::<u64>();
        out.cancelled_again += rows.len() as u64;
    }
    tx.exec_drop(
        "UPDATE seckill_voucher SET stock = stock + ? WHERE voucher_id = ?",
        (units, voucher),
    )
    .await?;
    Ok(units)
}

/// The pending orders held for the operator: of `voucher`, or all.
pub async fn held(db: &Db, voucher: Option<u64>) -> Result<Vec<(u64, u64)>> {
    let mut conn = db.conn().await?;
    let rows: Vec<(u64, u64)> = conn
        .exec(
            "SELECT voucher_id, id FROM seckill_order
              WHERE held = 1 AND status = ? AND (? IS NULL OR voucher_id = ?)
              ORDER BY voucher_id, id",
            (OrderStatus::Pending.code(), voucher, voucher),
        )
        .await?;
    Ok(rows)
}

/// How many pending orders are held for the operator, all vouchers'
/// (counted on the index: the gate guard asks at every pass).
pub async fn held_count(db: &Db) -> Result<u64> {
    let mut conn = db.conn().await?;
    let n: Option<u64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM seckill_order WHERE held = 1 AND status = ?",
            (OrderStatus::Pending.code(),),
        )
        .await?;
    Ok(n.unwrap_or(0))
}

/// Lets a held order's payment deadline run again (the payment provider
/// says it was not paid): reconcile then schedules it, and past it the
/// order is cancelled and its unit given back. Whether it was held.
pub async fn unhold(db: &Db, order: u64) -> Result<bool> {
    let mut conn = db.conn().await?;
    conn.exec_drop(
        "UPDATE seckill_order SET held = 0 WHERE id = ? AND held = 1 AND status = ?",
        (order, OrderStatus::Pending.code()),
    )
    .await?;
    Ok(conn.affected_rows() == 1)
}
