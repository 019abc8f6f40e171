//! The gate's payment deadlines (`seckill:{V}:timeouts`) added or dropped
//! through `lua/timeouts.lua`, which keeps the set's digest in meta beside
//! them (reconcile compares it with MySQL's pending orders).

use crate::error::Result;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use crate::store::scripts::TIMEOUTS;

/// Members per call: a script holds Redis for as long as it runs.
const CHUNK: usize = 1_000;

/// Whether a deadline already there keeps its score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// It moves to the one given (a rebuilt gate's deadlines).
    Moves,
    /// It stays: one that is scheduled or claimed is left alone.
    Stays,
}

/// Schedules (order id, deadline ms) pairs; returns how many had none.
pub async fn schedule(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    deadlines: &[(u64, i64)],
    existing: Existing,
) -> Result<usize> {
    let mode = match existing {
        Existing::Moves => "add",
        Existing::Stays => "add_nx",
    };
    let mut added = 0;
    for chunk in deadlines.chunks(CHUNK) {
        let mut inv = TIMEOUTS.prepare_invoke();
        inv.key(keys.timeouts()).key(keys.meta()).arg(mode);
        for (order, at) in chunk {
            inv.arg(*order).arg(*at);
        }
        let n: usize = inv.invoke_async(conn).await?;
        added += n;
    }
    Ok(added)
}

/// Drops the deadlines of `orders`; returns how many were there.
pub async fn drop_deadlines(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    orders: &[u64],
) -> Result<usize> {
    remove(conn, keys, orders, false).await
}

/// Drops the deadlines of `orders`, paid in MySQL, and keeps them in the
/// gate's paid set: a MySQL that loses the payment (a failover, a backup
/// restored) would otherwise see them unpaid and cancel them.
pub async fn drop_paid(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    orders: &[u64],
) -> Result<usize> {
    remove(conn, keys, orders, true).await
}

async fn remove(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    orders: &[u64],
    paid: bool,
) -> Result<usize> {
    let mut gone = 0;
    for chunk in orders.chunks(CHUNK) {
        let mut inv = TIMEOUTS.prepare_invoke();
        inv.key(keys.timeouts()).key(keys.meta());
        match paid {
            true => inv.key(keys.paid()).arg("paid"),
            false => inv.arg("remove"),
        };
        for order in chunk {
            inv.arg(*order);
        }
        let n: usize = inv.invoke_async(conn).await?;
        gone += n;
    }
    Ok(gone)
}
