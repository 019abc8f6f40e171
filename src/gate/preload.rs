//! `seckill preload`: MySQL (the truth) → the Redis gate, for one voucher.
//!
//! Sets meta and stock from MySQL, rebuilds the buyers set (every user with
//! an order) and the released set (every cancelled order: MySQL's stock
//! already counts their units) from MySQL, schedules the deadlines of
//! pending orders. The voucher is registered for workers first, so no crash
//! leaves a loaded gate that no worker consumes. It refuses while orders are
//! in flight (registering the voucher all the same, so they drain), because
//! MySQL's stock does not yet count them and copying it to Redis would sell
//! those units a second time.

use crate::store::redis_conn::RedisConn;
use redis::AsyncCommands;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::gate::image::{publish_gate, GateImage};
use crate::gate::pause::{self, META_PAUSE_TOKEN};
use crate::gate::witness;
use crate::orders::order::OrderStatus;
use crate::orders::voucher;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::registry;
use crate::stream::backlog::backlog;

#[derive(Debug, Clone, Serialize)]
pub struct PreloadReport {
    pub voucher: u64,
    pub total_stock: i64,
    pub stock: i64,
    pub buyers: u64,
    /// In-flight orders that `--force` chose to ignore.
    pub in_flight_ignored: u64,
}

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
    let before = witness::read(conn, &keys).await?;
    // A pause after this (a guard that saw Redis lose writes) must not be
    // undone by the reopen below, which relies on this view.
    let pause_seen: Option<String> = conn.hget(keys.meta(), META_PAUSE_TOKEN).await?;
    let in_flight = backlog(conn, &keys).await?.in_flight();
    if in_flight > 0 && !force {
        // Orders in flight belong to a gate that was loaded: make sure
        // workers consume them (a preload that died between publishing and
        // registering left it unregistered), then let them drain.
        registry::register(conn, &keys).await?;
        return Err(Error::OrdersInFlight {
            voucher: voucher_id,
            in_flight,
        });
    }
    let (v, orders) = voucher::get_with_orders(db, voucher_id).await?;
    let users: Vec<u64> = orders.iter().map(|o| o.user).collect();
    let cancelled: Vec<u64> = orders
        .iter()
        .filter(|o| o.status == Some(OrderStatus::Cancelled))
        .map(|o| o.id)
        .collect();
    let deadlines: Vec<(i64, u64)> = orders
        .iter()
        .filter(|o| o.status == Some(OrderStatus::Pending))
        .map(|o| (o.created_ms + v.pay_timeout_ms, o.id))
        .collect();

    let published = publish_gate(
        conn,
        &keys,
        &GateImage {
            total: v.total_stock,
            begin_ms: v.begin_ms,
            end_ms: v.end_ms,
            pay_timeout_ms: v.pay_timeout_ms,
            policy: v.versioned_policy(),
            stock: v.stock,
            buyers: &users,
            released: &cancelled,
            deadlines: &deadlines,
        },
        &before,
    )
    .await?;
    if !published {
        return Err(Error::Busy(voucher_id));
    }
    // The gate is MySQL's image now: one a worker paused (Redis had lost
    // writes) opens again, if it has a buyer for every order.
    let seen = pause_seen.unwrap_or_default();
    pause::reopen(conn, &keys, users.len() as u64, Some(&seen)).await?;
    Ok(PreloadReport {
        voucher: voucher_id,
        total_stock: v.total_stock,
        stock: v.stock,
        buyers: users.len() as u64,
        in_flight_ignored: if force { in_flight } else { 0 },
    })
}
