//! The order counters kept in the voucher row (schema 5): what a voucher's
//! orders add up to, changed by the same transactions that change the
//! orders (persist, cancel, pay), so what runs every second (the gate
//! guard, `status`, `voucher list`) reads one row per voucher however many
//! orders it has. The rows stay the truth: reconcile recounts them and
//! reports a counter that drifted (`counters_drift`), and [`repair`] sets it
//! from the rows.

use std::collections::HashMap;

use mysql_async::prelude::*;
use mysql_async::TxOpts;
use serde::Serialize;

use crate::error::Result;
use crate::orders::order::OrderStatus;
use crate::store::db::{join_ids, Db};

/// A voucher's orders counted: all of them, and the paid and cancelled
/// ones, each as orders and as units. Pending is what is left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub orders_total: u64,
    pub units_total: u64,
    pub orders_paid: u64,
    pub units_paid: u64,
    pub orders_cancelled: u64,
    pub units_cancelled: u64,
}

impl Counters {
    /// The units pending and paid orders hold: with MySQL's stock, the
    /// voucher's total (I1).
    pub fn units_active(&self) -> u64 {
        self.units_total.saturating_sub(self.units_cancelled)
    }

    /// How far `self` is from `other`: the largest difference of any one
    /// counter (0 when they agree).
    pub fn distance(&self, other: &Counters) -> u64 {
        self.fields()
            .into_iter()
            .zip(other.fields())
            .map(|(a, b)| a.abs_diff(b))
            .max()
            .unwrap_or(0)
    }

    /// Counts one order row as [`RECOUNT_ALL`] does.
    pub fn count(&mut self, status: i8, quantity: u64) {
        self.orders_total += 1;
        self.units_total += quantity;
        match OrderStatus::from_code(status) {
            Some(OrderStatus::Paid) => {
                self.orders_paid += 1;
                self.units_paid += quantity;
            }
            Some(OrderStatus::Cancelled) => {
                self.orders_cancelled += 1;
                self.units_cancelled += quantity;
            }
            _ => {}
        }
    }

    fn fields(&self) -> [u64; 6] {
        [
            self.orders_total,
            self.units_total,
            self.orders_paid,
            self.units_paid,
            self.orders_cancelled,
            self.units_cancelled,
        ]
    }

    /// From the six columns of [`COLUMNS`], in order.
    pub fn from_tuple(t: (u64, u64, u64, u64, u64, u64)) -> Counters {
        Counters {
            orders_total: t.0,
            units_total: t.1,
            orders_paid: t.2,
            units_paid: t.3,
            orders_cancelled: t.4,
            units_cancelled: t.5,
        }
    }
}

/// The counter columns of `seckill_voucher`, in [`Counters`]' order.
pub const COLUMNS: &str =
    "orders_total, units_total, orders_paid, units_paid, orders_cancelled, units_cancelled";

/// Every voucher's counters from its rows, in one statement (the schema 5
/// migration; idempotent). A status this tool never writes counts in the
/// totals only, as pending.
pub const RECOUNT_ALL: &str = "UPDATE seckill_voucher v
      LEFT JOIN (SELECT voucher_id, COUNT(*) AS n, SUM(quantity) AS u,
                        SUM(status = 1) AS np, SUM(IF(status = 1, quantity, 0)) AS up,
                        SUM(status = -1) AS nc, SUM(IF(status = -1, quantity, 0)) AS uc
                   FROM seckill_order GROUP BY voucher_id) c ON c.voucher_id = v.voucher_id
        SET v.orders_total = COALESCE(c.n, 0), v.units_total = COALESCE(c.u, 0),
            v.orders_paid = COALESCE(c.np, 0), v.units_paid = COALESCE(c.up, 0),
            v.orders_cancelled = COALESCE(c.nc, 0), v.units_cancelled = COALESCE(c.uc, 0)";

/// One voucher's counters from its rows, as [`RECOUNT_ALL`] counts them.
const RECOUNT_ONE: &str = "SELECT COUNT(*), COALESCE(SUM(quantity), 0),
        COALESCE(SUM(status = 1), 0), COALESCE(SUM(IF(status = 1, quantity, 0)), 0),
        COALESCE(SUM(status = -1), 0), COALESCE(SUM(IF(status = -1, quantity, 0)), 0)
   FROM seckill_order WHERE voucher_id = ?";

/// How many orders (of any status) MySQL holds per voucher, from the
/// counters: one per user, so also how many users must be buyers at each
/// gate. Vouchers without orders, or unknown to MySQL, are absent.
pub async fn orders_per_voucher(db: &Db, vouchers: &[u64]) -> Result<HashMap<u64, u64>> {
    if vouchers.is_empty() {
        return Ok(HashMap::new());
    }
    let mut conn = db.conn().await?;
    let rows: Vec<(u64, u64)> = conn
        .query(format!(
            "SELECT voucher_id, orders_total FROM seckill_voucher
              WHERE voucher_id IN ({}) AND orders_total > 0",
            join_ids(vouchers.iter().copied())
        ))
        .await?;
    Ok(rows.into_iter().collect())
}

/// What [`repair`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recount {
    pub was: Counters,
    pub now: Counters,
}

/// Sets the voucher's counters from its rows. The voucher row is locked
/// first: every transaction that changes this voucher's orders changes its
/// row too, so none is half done while the rows are counted (the count's
/// read view opens after the lock). It holds the row for as long as the
/// count takes (about a second per million orders here): workers and
/// payments of this voucher wait that long.
pub async fn repair(db: &Db, voucher: u64) -> Result<Option<Recount>> {
    let mut conn = db.conn().await?;
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let was: Option<(u64, u64, u64, u64, u64, u64)> = tx
        .exec_first(
            format!("SELECT {COLUMNS} FROM seckill_voucher WHERE voucher_id = ? FOR UPDATE"),
            (voucher,),
        )
        .await?;
    let Some(was) = was.map(Counters::from_tuple) else {
        tx.rollback().await?;
        return Ok(None);
    };
    let now = recount(&mut tx, voucher).await?;
    if now != was {
        tx.exec_drop(
            "UPDATE seckill_voucher
                SET orders_total = ?, units_total = ?, orders_paid = ?, units_paid = ?,
                    orders_cancelled = ?, units_cancelled = ?
              WHERE voucher_id = ?",
            (
                now.orders_total,
                now.units_total,
                now.orders_paid,
                now.units_paid,
                now.orders_cancelled,
                now.units_cancelled,
                voucher,
            ),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(Some(Recount { was, now }))
}

/// The voucher's counters counted from its rows (a full read of them).
pub async fn recount(conn: &mut impl Queryable, voucher: u64) -> Result<Counters> {
    let row: Option<(u64, u64, u64, u64, u64, u64)> =
        conn.exec_first(RECOUNT_ONE, (voucher,)).await?;
    Ok(row.map(Counters::from_tuple).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_is_the_largest_difference_of_any_counter() {
        let a = Counters {
            orders_total: 10,
            units_total: 12,
            ..Default::default()
        };
        let mut b = a;
        assert_eq!(a.distance(&b), 0);
        b.units_total = 9;
        b.orders_paid = 1;
        assert_eq!(a.distance(&b), 3);
        assert_eq!(b.distance(&a), 3);
    }

    #[test]
    fn active_units_leave_the_cancelled_out() {
        let c = Counters {
            units_total: 7,
            units_cancelled: 2,
            ..Default::default()
        };
        assert_eq!(c.units_active(), 5);
    }
}
