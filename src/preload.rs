//! `seckill preload`: MySQL (the truth) → the Redis gate, for one voucher.
//!
//! Sets meta and stock from MySQL, rebuilds the buyers set (every user with
//! an order) and the released set (every cancelled order: MySQL's stock
//! already counts their units) from MySQL, schedules the deadlines of
//! pending orders, then registers the voucher for workers. It refuses while
//! orders are in flight, because MySQL's stock does not yet count them and
//! copying it to Redis would sell those units a second time.

use crate::redis_store::RedisConn;
use redis::AsyncCommands;
use serde::Serialize;

use crate::backlog::backlog;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::gate;
use crate::keys::{registry, VoucherKeys};
use crate::scripts::PRELOAD;
use crate::voucher;

#[derive(Debug, Clone, Serialize)]
pub struct PreloadReport {
    pub voucher: u64,
    pub total_stock: i64,
    pub stock: i64,
    pub buyers: u64,
    /// In-flight orders that `--force` chose to ignore.
    pub in_flight_ignored: u64,
}

const STAGING_CHUNK: usize = 1_000;

pub async fn preload<C: RedisConn>(
    db: &Db,
    conn: &mut C,
    prefix: &str,
    voucher_id: u64,
    force: bool,
) -> Result<PreloadReport> {
    let keys = VoucherKeys::new(prefix, voucher_id)?;
    // Read Redis before MySQL: an admission after this point changes the
    // witness below and the publish step refuses.
    let before = gate::read(conn, &keys).await?;
    let in_flight = backlog(conn, &keys).await?.in_flight();
    if in_flight > 0 && !force {
        return Err(Error::OrdersInFlight {
            voucher: voucher_id,
            in_flight,
        });
    }
    let v = voucher::get(db, voucher_id).await?;
    let orders = voucher::order_digest(db, voucher_id).await?;
    let users: Vec<u64> = orders.iter().map(|o| o.1).collect();
    let cancelled: Vec<u64> = orders.iter().filter(|o| o.2 == -1).map(|o| o.0).collect();
    let deadlines: Vec<(i64, u64)> = orders
        .iter()
        .filter(|o| o.2 == 0)
        .map(|o| (o.3 + v.pay_timeout_ms, o.0))
        .collect();

    let staging = keys.buyers_staging();
    let released_staging = keys.released_staging();
    let _: () = conn.del(&[&staging, &released_staging]).await?;
    for chunk in users.chunks(STAGING_CHUNK) {
        let _: () = conn.sadd(&staging, chunk).await?;
    }
    for chunk in cancelled.chunks(STAGING_CHUNK) {
        let _: () = conn.sadd(&released_staging, chunk).await?;
    }
    let published: i64 = PRELOAD
        .key(keys.meta())
        .key(keys.stock())
        .key(keys.buyers())
        .key(&staging)
        .key(keys.orders())
        .key(keys.released())
        .key(&released_staging)
        .arg(v.total_stock)
        .arg(v.begin_ms)
        .arg(v.end_ms)
        .arg(v.pay_timeout_ms)
        .arg(v.stock)
        .arg(before.last_entry_id.unwrap_or_default())
        .arg(before.stock.map(|s| s.to_string()).unwrap_or_default())
        .arg(before.buyers)
        .invoke_async(conn)
        .await?;
    if published != 1 {
        return Err(Error::Busy(voucher_id));
    }
    // Deadlines are derived from the stored orders, so adding them again is
    // harmless; a deadline Redis lost comes back here (the sweep is the
    // backstop when nobody preloads).
    for chunk in deadlines.chunks(STAGING_CHUNK) {
        let _: () = conn.zadd_multiple(keys.timeouts(), chunk).await?;
    }
    let _: () = conn.sadd(registry(prefix)?, voucher_id).await?;
    Ok(PreloadReport {
        voucher: voucher_id,
        total_stock: v.total_stock,
        stock: v.stock,
        buyers: users.len() as u64,
        in_flight_ignored: if force { in_flight } else { 0 },
    })
}
