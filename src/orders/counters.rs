//! The order counters kept in the voucher row (schema 5): what a voucher's
//! orders add up to, changed by the same transactions that change the
//! orders (persist, cancel, pay), so what runs every second (the gate
//! guard, `status`, `voucher list`) reads one row per voucher however many
//! orders it has, and reconcile compares the voucher's sets with the gate's
//! by their digests (support/set_digest.rs) instead of reading them. The
//! rows stay the truth: `reconcile --deep` counts them again and reports a
//! counter that drifted (`counters_drift`), and [`repair`] sets it from the
//! rows.

use std::collections::HashMap;

use mysql_async::prelude::*;
use mysql_async::TxOpts;
use serde::Serialize;

use crate::error::Result;
use crate::orders::order::OrderStatus;
use crate::store::counter_sql::{COLUMNS, RECOUNT_ONE};
use crate::store::db::{join_ids, Db};
use crate::support::set_digest::{sql_modulus, SetDigest};

/// A voucher's orders counted: all of them, and the paid and cancelled
/// ones, each as orders and as units (pending is what is left), and the
/// digests of its users, of its pending orders and of its cancelled ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub orders_total: u64,
    pub units_total: u64,
    pub orders_paid: u64,
    pub units_paid: u64,
    pub orders_cancelled: u64,
    pub units_cancelled: u64,
    /// Every order's user: the gate's buyers, less those in flight.
    pub users_digest: SetDigest,
    /// The pending orders' ids: the gate's payment deadlines.
    pub pending_digest: SetDigest,
    /// The cancelled orders' ids: the gate's released set.
    pub cancelled_digest: SetDigest,
}

/// A counters row as read: nine integers in [`COLUMNS`]' order.
pub type CountersRow = (u64, u64, u64, u64, u64, u64, u64, u64, u64);

impl Counters {
    /// The units pending and paid orders hold: with MySQL's stock, the
    /// voucher's total (I1).
    pub fn units_active(&self) -> u64 {
        self.units_total.saturating_sub(self.units_cancelled)
    }

    /// Pending orders: neither paid nor cancelled.
    pub fn orders_pending(&self) -> u64 {
        self.orders_total
            .saturating_sub(self.orders_paid)
            .saturating_sub(self.orders_cancelled)
    }

    /// How far `self` is from `other`: the largest difference of any one
    /// count, at least 1 when only a digest differs (0 when they agree).
    pub fn distance(&self, other: &Counters) -> u64 {
        let counts = self
            .counts()
            .into_iter()
            .zip(other.counts())
            .map(|(a, b)| a.abs_diff(b))
            .max()
            .unwrap_or(0);
        counts.max(u64::from(self != other))
    }

    /// Counts one order row as `store::counter_sql::RECOUNT_ALL` does.
    pub fn count(&mut self, id: u64, user: u64, status: i8, quantity: u64) {
        self.orders_total += 1;
        self.units_total += quantity;
        self.users_digest.add(user);
        match OrderStatus::from_code(status) {
            Some(OrderStatus::Pending) => self.pending_digest.add(id),
            Some(OrderStatus::Paid) => {
                self.orders_paid += 1;
                self.units_paid += quantity;
            }
            // A status this tool never writes counts as cancelled, as the
            // full read classifies it.
            Some(OrderStatus::Cancelled) | None => {
                self.orders_cancelled += 1;
                self.units_cancelled += quantity;
                self.cancelled_digest.add(id);
            }
        }
    }

    fn counts(&self) -> [u64; 6] {
        [
            self.orders_total,
            self.units_total,
            self.orders_paid,
            self.units_paid,
            self.orders_cancelled,
            self.units_cancelled,
        ]
    }

    /// From the columns of [`COLUMNS`], in order.
    pub fn from_row(r: CountersRow) -> Counters {
        Counters {
            orders_total: r.0,
            units_total: r.1,
            orders_paid: r.2,
            units_paid: r.3,
            orders_cancelled: r.4,
            units_cancelled: r.5,
            users_digest: SetDigest(r.6),
            pending_digest: SetDigest(r.7),
            cancelled_digest: SetDigest(r.8),
        }
    }
}

/// What a batch adds to the counters, in its conditional stock update
/// (worker/persist.rs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Taking {
    pub orders: u64,
    pub units: u64,
    pub users: SetDigest,
    pub orders_digest: SetDigest,
}

impl Taking {
    pub fn add(&mut self, order: u64, user: u64, units: u64) {
        self.orders += 1;
        self.units += units;
        self.users.add(user);
        self.orders_digest.add(order);
    }
}

/// The SET clause that adds a [`Taking`] (four parameters: orders, units,
/// the users' digest, the orders' digest).
pub const ADD_TAKING: &str = concat!(
    "orders_total = orders_total + ?, units_total = units_total + ?, ",
    "users_digest = (users_digest + ?) % ",
    sql_modulus!(),
    ", pending_digest = (pending_digest + ?) % ",
    sql_modulus!()
);

/// The SET clause that cancels pending orders (three parameters: orders,
/// units, their ids' digest).
pub const ADD_CANCELLED: &str = concat!(
    "orders_cancelled = orders_cancelled + ?, units_cancelled = units_cancelled + ?, ",
    "pending_digest = (pending_digest + ",
    sql_modulus!(),
    " - ?) % ",
    sql_modulus!(),
    ", cancelled_digest = (cancelled_digest + ?) % ",
    sql_modulus!()
);

/// The SET clause that pays one pending order `o` of the voucher `v` (one
/// parameter: the order's hash).
pub const ADD_PAID: &str = concat!(
    "v.orders_paid = v.orders_paid + 1, v.units_paid = v.units_paid + o.quantity, ",
    "v.pending_digest = (v.pending_digest + ",
    sql_modulus!(),
    " - ?) % ",
    sql_modulus!()
);

/// Per voucher with orders, from the counters: all its orders, and its
/// cancelled ones (the gate guard's check of MySQL against what the gates
/// saw it commit). Vouchers without orders, or unknown to MySQL, are absent.
pub async fn totals_per_voucher(db: &Db, vouchers: &[u64]) -> Result<HashMap<u64, (u64, u64)>> {
    if vouchers.is_empty() {
        return Ok(HashMap::new());
    }
    let mut conn = db.conn().await?;
    let rows: Vec<(u64, u64, u64)> = conn
        .query(format!(
            "SELECT voucher_id, orders_total, orders_cancelled FROM seckill_voucher
              WHERE voucher_id IN ({}) AND orders_total > 0",
            join_ids(vouchers.iter().copied())
        ))
        .await?;
    Ok(rows.into_iter().map(|(v, n, c)| (v, (n, c))).collect())
}

/// The voucher row's count and digest of its cancelled orders (none: 0).
pub async fn cancellations(db: &Db, voucher: u64) -> Result<(u64, SetDigest)> {
    let mut conn = db.conn().await?;
    let row: Option<(u64, u64)> = conn
        .exec_first(
            "SELECT orders_cancelled, cancelled_digest FROM seckill_voucher WHERE voucher_id = ?",
            (voucher,),
        )
        .await?;
    Ok(row.map_or((0, SetDigest::default()), |(n, d)| (n, SetDigest(d))))
}

/// A voucher in `buckets` buckets: its orders per bucket, each counted in
/// the bucket of its user. MySQL computes the rule of store/layout.rs
/// (the first 8 bytes of SHA-1 of the decimal user id, big-endian, mod N:
/// CONV keeps 64 bits), so only N counts cross the wire, whatever the
/// sale's size; it still reads every order of the voucher (its index).
pub async fn orders_per_bucket(db: &Db, voucher: u64, buckets: u32) -> Result<Vec<u64>> {
    let n = buckets.max(1);
    let mut conn = db.conn().await?;
    let rows: Vec<(u64, u64)> = conn
        .exec(
            "SELECT CAST(CONV(LEFT(SHA1(user_id), 16), 16, 10) AS UNSIGNED) % ?, COUNT(*)
               FROM seckill_order WHERE voucher_id = ? GROUP BY 1",
            (n, voucher),
        )
        .await?;
    let mut counts = vec![0; n as usize];
    for (bucket, count) in rows {
        if let Some(c) = counts.get_mut(bucket as usize) {
            *c = count;
        }
    }
    Ok(counts)
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
/// count takes (the book, docs/src/concepts/deadlines.md): workers and payments of this voucher wait
/// that long.
pub async fn repair(db: &Db, voucher: u64) -> Result<Option<Recount>> {
    let mut conn = db.conn().await?;
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let recounted = repair_in(&mut tx, voucher).await?;
    tx.commit().await?;
    Ok(recounted)
}

/// [`repair`] inside the caller's transaction (which changed the rows).
pub async fn repair_in(
    tx: &mut mysql_async::Transaction<'_>,
    voucher: u64,
) -> Result<Option<Recount>> {
    let was: Option<CountersRow> = tx
        .exec_first(
            format!("SELECT {COLUMNS} FROM seckill_voucher WHERE voucher_id = ? FOR UPDATE"),
            (voucher,),
        )
        .await?;
    let Some(was) = was.map(Counters::from_row) else {
        return Ok(None);
    };
    let now = recount(&mut *tx, voucher).await?;
    if now != was {
        tx.exec_drop(
            "UPDATE seckill_voucher
                SET orders_total = ?, units_total = ?, orders_paid = ?, units_paid = ?,
                    orders_cancelled = ?, units_cancelled = ?, users_digest = ?,
                    pending_digest = ?, cancelled_digest = ?
              WHERE voucher_id = ?",
            (
                now.orders_total,
                now.units_total,
                now.orders_paid,
                now.units_paid,
                now.orders_cancelled,
                now.units_cancelled,
                now.users_digest.0,
                now.pending_digest.0,
                now.cancelled_digest.0,
                voucher,
            ),
        )
        .await?;
    }
    Ok(Some(Recount { was, now }))
}

/// The voucher's counters counted from its rows (a full read of them).
pub async fn recount(conn: &mut impl Queryable, voucher: u64) -> Result<Counters> {
    let row: Option<CountersRow> = conn.exec_first(RECOUNT_ONE, (voucher,)).await?;
    Ok(row.map(Counters::from_row).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_is_the_largest_difference_of_any_count() {
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
        let mut c = a;
        c.users_digest.add(7);
        assert_eq!(a.distance(&c), 1, "a digest alone");
    }

    #[test]
    fn a_row_counts_into_its_status() {
        let mut c = Counters::default();
        c.count(101, 1, 0, 2);
        c.count(102, 2, 1, 1);
        c.count(103, 3, -1, 3);
        assert_eq!((c.orders_total, c.units_total), (3, 6));
        assert_eq!(c.orders_pending(), 1);
        assert_eq!(c.units_active(), 3);
        assert_eq!(c.users_digest, SetDigest::of([1, 2, 3]));
        assert_eq!(c.pending_digest, SetDigest::of([101]));
        assert_eq!(c.cancelled_digest, SetDigest::of([103]));
    }
}
