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
use crate::gate::buckets::{self, bucket_of, Layout};
use crate::gate::pause::{self, PauseReason, META_PAUSE_TOKEN};
use crate::gate::rebuilt::{publish_gate, BucketPlace, RebuiltGate};
use crate::gate::transfer;
use crate::gate::witness::{self, MysqlBehind};
use crate::orders::order::OrderStatus;
use crate::orders::voucher::{self, OrderDigest, Voucher};
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::registry;
use crate::stream::backlog::backlog;
use std::collections::HashSet;
use std::time::Duration;

#[derive(Debug, Clone, Serialize)]
pub struct PreloadReport {
    pub voucher: u64,
    pub total_stock: i64,
    pub stock: i64,
    pub buyers: u64,
    /// In-flight orders that `--force` chose to ignore.
    pub in_flight_ignored: u64,
    /// Gates the stock is split over (1: one gate).
    pub buckets: u32,
    /// What MySQL lacks of what the gate saw it commit (orders workers
    /// inserted, cancellations whose units came back): MySQL lost commits,
    /// and the gate was published paused for their restore. 0 normally.
    pub mysql_lost_commits: u64,
}

pub async fn preload<C: RedisConn>(
    db: &Db,
    conn: &mut C,
    prefix: &str,
    voucher_id: u64,
    force: bool,
) -> Result<PreloadReport> {
    // The split is fixed once recorded: reading it before the gate's
    // witness changes nothing the witness guards.
    let layout = buckets::lay_out(db, conn, prefix, voucher_id).await?;
    if layout.buckets() > 1 {
        return preload_buckets(db, conn, &layout, force).await;
    }
    let keys = VoucherKeys::new(prefix, voucher_id)?;
    // Read Redis before MySQL: an admission after this point changes the
    // witness below and the publish step refuses.
    let before = witness::read(conn, &keys).await?;
    // A pause after this (a guard that saw Redis lose writes) must not be
    // undone by the reopen below, which relies on this view; the commits
    // the gate saw tell what MySQL lost since.
    let (pause_seen, committed): (Option<String>, Option<i64>) = redis::cmd("HMGET")
        .arg(keys.meta())
        .arg(&[META_PAUSE_TOKEN, witness::META_COMMITTED])
        .query_async(conn)
        .await?;
    let in_flight = refuse_in_flight(conn, &keys, force).await?;
    let (v, orders) = voucher::get_with_orders(db, voucher_id).await?;
    let mut image = OrdersImage::of(&v, &orders);
    image
        .keep_releases_mysql_lost(conn, &keys, &order_ids(&orders))
        .await?;
    // Read before MySQL, the witness shows what MySQL lost since (a
    // failover, a backup restored): an image of MySQL alone would drop the
    // lost buyers, who could then buy again before anything restored
    // their orders. Published paused, as the gate guard pauses it; the
    // guard's restore (or `reconcile --yes`) reopens it.
    let lost = MysqlBehind::of(
        committed.unwrap_or(0).max(0) as u64,
        before.released,
        (v.orders_pending + v.orders_paid + v.orders_cancelled).max(0) as u64,
        v.orders_cancelled.max(0) as u64,
    )
    .sum();
    if lost > 0 {
        pause::pause(
            conn,
            &keys,
            None,
            Duration::ZERO,
            PauseReason::MysqlLostCommits,
        )
        .await?;
    }

    let published = publish_gate(conn, &keys, &image.gate(&v, v.stock, None), &before).await?;
    if !published {
        return Err(Error::Busy(voucher_id));
    }
    // The gate is MySQL's image now: one a worker paused (Redis had lost
    // writes) opens again, if it has a buyer for every order.
    if lost == 0 {
        let seen = pause_seen.unwrap_or_default();
        pause::reopen(conn, &keys, image.users.len() as u64, Some(&seen)).await?;
    }
    Ok(PreloadReport {
        voucher: voucher_id,
        total_stock: v.total_stock,
        stock: v.stock,
        buyers: image.users.len() as u64,
        in_flight_ignored: if force { in_flight } else { 0 },
        buckets: 1,
        mysql_lost_commits: lost,
    })
}

/// The ids of these orders, to look members up among.
fn order_ids(orders: &[OrderDigest]) -> HashSet<u64> {
    orders.iter().map(|o| o.id).collect()
}

/// The orders in flight at a gate; unless `force`, an error when there are
/// any. Orders in flight belong to a gate that was loaded: the voucher is
/// registered first so workers consume them (a preload that died between
/// publishing and registering left it unregistered), then they drain.
async fn refuse_in_flight<C: RedisConn>(
    conn: &mut C,
    keys: &VoucherKeys,
    force: bool,
) -> Result<u64> {
    let in_flight = backlog(conn, keys).await?.in_flight();
    if in_flight > 0 && !force {
        registry::register(conn, keys).await?;
        return Err(Error::OrdersInFlight {
            voucher: keys.voucher(),
            in_flight,
        });
    }
    Ok(in_flight)
}

/// What a gate is rebuilt from, out of MySQL's orders (of one bucket's
/// users, for a voucher in buckets).
struct OrdersImage {
    users: Vec<u64>,
    cancelled: Vec<u64>,
    deadlines: Vec<(i64, u64)>,
}

impl OrdersImage {
    fn of<'a>(v: &Voucher, orders: impl IntoIterator<Item = &'a OrderDigest>) -> OrdersImage {
        let mut image = OrdersImage {
            users: Vec::new(),
            cancelled: Vec::new(),
            deadlines: Vec::new(),
        };
        for o in orders {
            image.users.push(o.user);
            match o.status {
                Some(OrderStatus::Cancelled) => image.cancelled.push(o.id),
                // A held order's deadline is the operator's (orders/restore.rs).
                Some(OrderStatus::Pending) if o.held => {}
                Some(OrderStatus::Pending) => image
                    .deadlines
                    .push((o.created_ms + v.pay_timeout_ms, o.id)),
                _ => {}
            }
        }
        image
    }

    /// Keeps in the released set its members MySQL has no order of:
    /// cancelled orders whose unit the gate gave back and whose commits
    /// MySQL then lost (a failover, a backup restored). Their release is
    /// all Redis keeps of them once their deadline went with it, and the
    /// restore (orders/restore.rs) reads it to bring them back cancelled:
    /// rebuilt from MySQL alone, they came back held as if paid, their
    /// units kept from the sale. A release after the witness was read
    /// makes the publish refuse, so reading the set now is enough.
    async fn keep_releases_mysql_lost<C: RedisConn>(
        &mut self,
        conn: &mut C,
        keys: &VoucherKeys,
        known: &HashSet<u64>,
    ) -> Result<()> {
        let released: Vec<u64> = conn.smembers(keys.released()).await?;
        self.cancelled
            .extend(released.into_iter().filter(|id| !known.contains(id)));
        Ok(())
    }

    fn gate<'a>(
        &'a self,
        v: &Voucher,
        stock: i64,
        bucket: Option<BucketPlace<'a>>,
    ) -> RebuiltGate<'a> {
        RebuiltGate {
            total: v.total_stock,
            begin_ms: v.begin_ms,
            end_ms: v.end_ms,
            pay_timeout_ms: v.pay_timeout_ms,
            policy: v.versioned_policy(),
            stock,
            buyers: &self.users,
            released: &self.cancelled,
            deadlines: &self.deadlines,
            bucket,
        }
    }
}

/// A voucher in buckets: every bucket's gate from its own users' orders,
/// MySQL's free stock split evenly (what does not divide evenly in the
/// pool), while no bucket has orders in flight or stock in transit and no
/// sale runs. A live sale is refused: the buckets are on different
/// masters, so publishing them one after another would let a bucket sell
/// stock another bucket is being given.
async fn preload_buckets<C: RedisConn>(
    db: &Db,
    conn: &mut C,
    layout: &Layout,
    force: bool,
) -> Result<PreloadReport> {
    let voucher_id = layout.voucher();
    let n = layout.buckets();
    let gates = layout.all_keys()?;
    let mut seen = Vec::with_capacity(gates.len());
    let mut in_flight = 0;
    for keys in &gates {
        let before = witness::read(conn, keys).await?;
        let pause_seen: Option<String> = conn.hget(keys.meta(), META_PAUSE_TOKEN).await?;
        in_flight += refuse_in_flight(conn, keys, force).await?;
        seen.push((before, pause_seen.unwrap_or_default()));
    }
    if transfer::any_open(conn, layout).await? {
        return Err(Error::InvalidInput(format!(
            "voucher {voucher_id} has stock in transit between its buckets: a worker's mover completes it; preload again after"
        )));
    }
    let (v, orders) = voucher::get_with_orders(db, voucher_id).await?;
    // Loaded: published (meta has the window), not merely touched (a
    // mover lease or an epoch makes a meta key too).
    let mut loaded = false;
    for keys in &gates {
        loaded |= conn.hexists::<_, _, bool>(keys.meta(), "begin_ms").await?;
    }
    if loaded && crate::support::timespec::now_ms() >= v.begin_ms {
        return Err(Error::InvalidInput(format!(
            "voucher {voucher_id} is split in {n} buckets, loaded, and its sale has begun: a preload would split its stock again while units are sold and released, so it is refused"
        )));
    }
    let share = v.stock / i64::from(n);
    let pool = v.stock - share * i64::from(n);
    let mut buyers = 0;
    let tags = layout.tags_text();
    let known = order_ids(&orders);
    for (b, keys) in gates.iter().enumerate() {
        let b = b as u32;
        let mut image = OrdersImage::of(&v, orders.iter().filter(|o| bucket_of(o.user, n) == b));
        image.keep_releases_mysql_lost(conn, keys, &known).await?;
        let place = BucketPlace {
            bucket: b,
            buckets: n,
            tags: if b == 0 { &tags } else { "" },
            pool: (b == 0).then_some(pool),
        };
        let published = publish_gate(
            conn,
            keys,
            &image.gate(&v, share, Some(place)),
            &seen[b as usize].0,
        )
        .await?;
        if !published {
            return Err(Error::Busy(voucher_id));
        }
        pause::reopen(
            conn,
            keys,
            image.users.len() as u64,
            Some(&seen[b as usize].1),
        )
        .await?;
        buyers += image.users.len() as u64;
    }
    Ok(PreloadReport {
        voucher: voucher_id,
        total_stock: v.total_stock,
        stock: v.stock,
        buyers,
        in_flight_ignored: if force { in_flight } else { 0 },
        buckets: n,
        // A sale in buckets that began is refused above; before it,
        // nothing was committed.
        mysql_lost_commits: 0,
    })
}
