//! One voucher as both stores see it, read Redis first and MySQL second, with
//! a witness of the gate read before and after the Redis part.

use std::collections::{BTreeSet, HashSet};

use mysql_async::prelude::*;
use redis::AsyncCommands;

use crate::backlog::in_flight_orders;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::keys::{registry, VoucherKeys};
use crate::redis_store::RedisConn;

/// What changes whenever the gate moves: an admission or promotion appends
/// to the stream, an admission or release changes the stock, a repair
/// changes the buyers, a release grows the released set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Witness {
    pub last_entry_id: String,
    pub stock: String,
    pub buyers: u64,
    pub released: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub voucher: u64,
    // MySQL
    pub total: i64,
    pub mysql_stock: i64,
    pub begin_ms: i64,
    pub end_ms: i64,
    pub pay_timeout_ms: i64,
    /// (order id, created ms) of pending orders.
    pub pending: Vec<(u64, i64)>,
    pub paid: usize,
    pub cancelled: BTreeSet<u64>,
    /// Orders cancelled, or pending orders created, less than the settle
    /// time ago: their release or deadline may still be on its way.
    pub settling: HashSet<u64>,
    pub order_ids: HashSet<u64>,
    pub order_users: BTreeSet<u64>,
    // Redis
    pub gate_loaded: bool,
    pub gate_stock: Option<i64>,
    pub buyers: BTreeSet<u64>,
    pub released: BTreeSet<u64>,
    pub deadlines: HashSet<u64>,
    /// (user, order) of entries not yet acknowledged.
    pub in_flight: Vec<(u64, u64)>,
    pub dead_letters: u64,
    pub witness: Witness,
}

impl Snapshot {
    /// In-flight orders MySQL does not have yet: units taken at the gate only.
    pub fn unpersisted(&self) -> Vec<(u64, u64)> {
        self.in_flight
            .iter()
            .filter(|(_, order)| !self.order_ids.contains(order))
            .copied()
            .collect()
    }

    /// Users who hold a unit: an order in MySQL (any status) or in flight.
    pub fn holders(&self) -> BTreeSet<u64> {
        let mut h = self.order_users.clone();
        h.extend(self.unpersisted().into_iter().map(|(user, _)| user));
        h
    }

    pub fn cancelled_unreleased(&self) -> BTreeSet<u64> {
        self.cancelled.difference(&self.released).copied().collect()
    }

    /// Cancelled orders whose unit should have come back by now.
    pub fn cancelled_unreleased_settled(&self) -> BTreeSet<u64> {
        self.cancelled_unreleased()
            .into_iter()
            .filter(|o| !self.settling.contains(o))
            .collect()
    }

    /// Pending orders old enough to have their deadline, without one.
    pub fn deadlines_missing(&self) -> Vec<(u64, i64)> {
        self.pending
            .iter()
            .filter(|(order, _)| !self.deadlines.contains(order) && !self.settling.contains(order))
            .copied()
            .collect()
    }

    /// What the gate's stock should be: MySQL's, less the units admitted but
    /// not yet persisted, less the cancelled units not yet given back.
    pub fn expected_gate_stock(&self) -> i64 {
        (self.mysql_stock
            - self.unpersisted().len() as i64
            - self.cancelled_unreleased().len() as i64)
            .max(0)
    }
}

async fn witness(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<Witness> {
    let (last, stock, buyers, released): (
        redis::streams::StreamRangeReply,
        Option<String>,
        u64,
        u64,
    ) = redis::pipe()
        .atomic()
        .xrevrange_count(keys.orders(), "+", "-", 1)
        .get(keys.stock())
        .scard(keys.buyers())
        .scard(keys.released())
        .query_async(conn)
        .await?;
    Ok(Witness {
        last_entry_id: last
            .ids
            .into_iter()
            .next()
            .map(|e| e.id)
            .unwrap_or_default(),
        stock: stock.unwrap_or_default(),
        buyers,
        released,
    })
}

/// Reads the voucher; `None` when the gate moved while it was being read
/// (then the two stores' views may not fit together). Work younger than
/// `settle_ms` is treated as still on its way, not as drift.
pub async fn read_voucher(
    db: &Db,
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
    settle_ms: i64,
) -> Result<Option<Snapshot>> {
    let before = witness(conn, keys).await?;
    let (meta_exists, buyers, released, deadlines, dead_letters): (
        bool,
        Vec<u64>,
        Vec<u64>,
        Vec<u64>,
        u64,
    ) = redis::pipe()
        .exists(keys.meta())
        .smembers(keys.buyers())
        .smembers(keys.released())
        .zrange(keys.timeouts(), 0, -1)
        .xlen(keys.dead())
        .query_async(conn)
        .await?;
    let in_flight = in_flight_orders(conn, keys).await?;
    let mut s = Snapshot {
        voucher,
        gate_loaded: meta_exists && !before.stock.is_empty(),
        gate_stock: before.stock.parse().ok(),
        buyers: buyers.into_iter().collect(),
        released: released.into_iter().collect(),
        deadlines: deadlines.into_iter().collect(),
        in_flight,
        dead_letters,
        witness: before,
        ..Default::default()
    };
    let mut mysql = db.conn().await?;
    let row: Option<(i64, i64, i64, i64, i64)> = mysql
        .exec_first(
            "SELECT total_stock, stock,
                    CAST(ROUND(UNIX_TIMESTAMP(begin_time) * 1000) AS SIGNED),
                    CAST(ROUND(UNIX_TIMESTAMP(end_time) * 1000) AS SIGNED),
                    pay_timeout_ms
               FROM seckill_voucher WHERE voucher_id = ?",
            (voucher,),
        )
        .await?;
    let (total, stock, begin_ms, end_ms, pay_timeout_ms) =
        row.ok_or(Error::VoucherNotFound(voucher))?;
    (
        s.total,
        s.mysql_stock,
        s.begin_ms,
        s.end_ms,
        s.pay_timeout_ms,
    ) = (total, stock, begin_ms, end_ms, pay_timeout_ms);
    let orders: Vec<(u64, u64, i8, i64, i8)> = mysql
        .exec(
            "SELECT id, user_id, status, CAST(ROUND(UNIX_TIMESTAMP(create_time) * 1000) AS SIGNED),
                    COALESCE(cancel_time, create_time) > NOW(3) - INTERVAL ? MICROSECOND
               FROM seckill_order WHERE voucher_id = ?",
            (settle_ms * 1000, voucher),
        )
        .await?;
    drop(mysql);
    // The gate must not have moved during the MySQL reads either: then every
    // difference left is either drift or younger than the settle time.
    if witness(conn, keys).await? != s.witness {
        return Ok(None);
    }
    for (id, user, status, created, recent) in orders {
        s.order_ids.insert(id);
        s.order_users.insert(user);
        if recent == 1 {
            s.settling.insert(id);
        }
        match status {
            0 => s.pending.push((id, created)),
            1 => s.paid += 1,
            _ => {
                s.cancelled.insert(id);
            }
        }
    }
    Ok(Some(s))
}

/// Every voucher worth checking: registered at the gate, or holding orders
/// in MySQL (a gate that lost its registry too must not go unchecked).
pub async fn candidates(db: &Db, conn: &mut impl RedisConn, prefix: &str) -> Result<Vec<u64>> {
    let mut ids: BTreeSet<u64> = conn
        .smembers::<_, Vec<u64>>(registry(prefix)?)
        .await?
        .into_iter()
        .collect();
    let mut mysql = db.conn().await?;
    let with_orders: Vec<u64> = mysql
        .query("SELECT DISTINCT voucher_id FROM seckill_order")
        .await?;
    ids.extend(with_orders);
    Ok(ids.into_iter().collect())
}
