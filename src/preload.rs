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
    let (v, orders) = voucher::get_with_orders(db, voucher_id).await?;
    let users: Vec<u64> = orders.iter().map(|o| o.1).collect();
    let cancelled: Vec<u64> = orders.iter().filter(|o| o.2 == -1).map(|o| o.0).collect();
    let deadlines: Vec<(i64, u64)> = orders
        .iter()
        .filter(|o| o.2 == 0)
        .map(|o| (o.3 + v.pay_timeout_ms, o.0))
        .collect();

    let published = publish_gate(
        conn,
        &keys,
        &GateImage {
            total: v.total_stock,
            begin_ms: v.begin_ms,
            end_ms: v.end_ms,
            pay_timeout_ms: v.pay_timeout_ms,
            stock: v.stock,
            buyers: &users,
            released: &cancelled,
            deadlines: &deadlines,
        },
        &Seen {
            last_entry_id: &before.last_entry_id.unwrap_or_default(),
            stock: &before.stock.map(|s| s.to_string()).unwrap_or_default(),
            buyers: before.buyers,
        },
    )
    .await?;
    if !published {
        return Err(Error::Busy(voucher_id));
    }
    Ok(PreloadReport {
        voucher: voucher_id,
        total_stock: v.total_stock,
        stock: v.stock,
        buyers: users.len() as u64,
        in_flight_ignored: if force { in_flight } else { 0 },
    })
}

/// Everything a voucher's gate is rebuilt from.
pub struct GateImage<'a> {
    pub total: i64,
    pub begin_ms: i64,
    pub end_ms: i64,
    pub pay_timeout_ms: i64,
    pub stock: i64,
    pub buyers: &'a [u64],
    /// Cancelled orders: the stock published counts their units already.
    pub released: &'a [u64],
    /// (deadline ms, order id) of pending orders.
    pub deadlines: &'a [(i64, u64)],
}

/// The gate as seen before MySQL was read: publishing refuses if it moved.
pub struct Seen<'a> {
    pub last_entry_id: &'a str,
    pub stock: &'a str,
    pub buyers: u64,
}

/// Stages the sets, swaps everything in with one script if the gate did not
/// move (false if it did), re-adds the deadlines (derived from the stored
/// orders, so adding one again is harmless) and registers the voucher.
pub async fn publish_gate<C: RedisConn>(
    conn: &mut C,
    keys: &VoucherKeys,
    image: &GateImage<'_>,
    seen: &Seen<'_>,
) -> Result<bool> {
    let staging = keys.buyers_staging();
    let released_staging = keys.released_staging();
    let _: () = conn.del(&[&staging, &released_staging]).await?;
    for chunk in image.buyers.chunks(STAGING_CHUNK) {
        let _: () = conn.sadd(&staging, chunk).await?;
    }
    for chunk in image.released.chunks(STAGING_CHUNK) {
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
        .arg(image.total)
        .arg(image.begin_ms)
        .arg(image.end_ms)
        .arg(image.pay_timeout_ms)
        .arg(image.stock)
        .arg(seen.last_entry_id)
        .arg(seen.stock)
        .arg(seen.buyers)
        .invoke_async(conn)
        .await?;
    if published != 1 {
        return Ok(false);
    }
    for chunk in image.deadlines.chunks(STAGING_CHUNK) {
        let _: () = conn.zadd_multiple(keys.timeouts(), chunk).await?;
    }
    let _: () = conn.sadd(registry(keys.prefix())?, keys.voucher()).await?;
    Ok(true)
}
