//! What the worker has not finished, per voucher: stream length, entries not
//! yet delivered, entries delivered but not acknowledged (and to whom, for how
//! long), and dead letters — plus re-driving dead letters once fixed.

use redis::streams::{StreamInfoConsumersReply, StreamPendingCountReply, StreamRangeReply};
use redis::AsyncCommands;
use serde::Serialize;

use crate::error::Result;
use crate::store::keys::{VoucherKeys, WORKER_GROUP};
use crate::store::redis_conn::RedisConn;
use crate::store::registry;
use crate::stream::backlog::backlog;
use crate::stream::entry::RawEntry;

/// The dead-letter reason of an order MySQL had no unit for: its gate unit
/// was never backed (requeue takes one again).
pub const NO_STOCK: &str = "no stock in MySQL";

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StreamSummary {
    pub voucher: u64,
    pub length: u64,
    pub undelivered: u64,
    pub pending: u64,
    /// Idle time of the oldest pending entry.
    pub oldest_pending_idle_ms: Option<u64>,
    pub dead_letters: u64,
    pub consumers: u64,
    /// The gate admits nobody while a worker rebuilds it (Redis lost writes).
    pub paused: bool,
}

pub async fn summary(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
) -> Result<StreamSummary> {
    let b = backlog(conn, keys).await?;
    let dead_letters: u64 = conn.xlen(keys.dead()).await?;
    let mut oldest_pending_idle_ms = None;
    let mut consumers = 0;
    if b.length > 0 && has_group(conn, keys).await? {
        if b.pending > 0 {
            let first: StreamPendingCountReply = conn
                .xpending_count(keys.orders(), WORKER_GROUP, "-", "+", 1)
                .await?;
            oldest_pending_idle_ms = first.ids.first().map(|p| p.last_delivered_ms as u64);
        }
        let c: StreamInfoConsumersReply = conn.xinfo_consumers(keys.orders(), WORKER_GROUP).await?;
        consumers = c.consumers.len() as u64;
    }
    let paused = crate::gate::pause::is_paused(conn, keys).await?;
    Ok(StreamSummary {
        voucher,
        paused,
        length: b.length,
        undelivered: b.undelivered,
        pending: b.pending,
        oldest_pending_idle_ms,
        dead_letters,
        consumers,
    })
}

/// The summary of every registered voucher, in voucher order.
pub async fn summaries(conn: &mut impl RedisConn, prefix: &str) -> Result<Vec<StreamSummary>> {
    let ids = registry::members(conn, prefix).await?;
    let layouts = crate::store::layout::read_many(conn, prefix, &ids).await?;
    let mut rows = Vec::with_capacity(ids.len());
    for layout in &layouts {
        rows.push(summary_of_buckets(conn, layout).await?);
    }
    Ok(rows)
}

/// A voucher's summary over every bucket's stream (one for a voucher of
/// one gate): counts summed, the oldest pending idle time the longest.
pub async fn summary_of_buckets(
    conn: &mut impl RedisConn,
    layout: &crate::store::layout::Layout,
) -> Result<StreamSummary> {
    let mut sum: Option<StreamSummary> = None;
    for keys in layout.all_keys()? {
        let s = summary(conn, &keys, layout.voucher()).await?;
        sum = Some(match sum {
            None => s,
            Some(mut t) => {
                t.length += s.length;
                t.undelivered += s.undelivered;
                t.pending += s.pending;
                t.oldest_pending_idle_ms = t.oldest_pending_idle_ms.max(s.oldest_pending_idle_ms);
                t.dead_letters += s.dead_letters;
                t.consumers = t.consumers.max(s.consumers);
                t.paused |= s.paused;
                t
            }
        });
    }
    sum.ok_or_else(|| crate::error::Error::redis("a voucher with no gate"))
}

async fn has_group(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<bool> {
    let groups: redis::streams::StreamInfoGroupsReply = conn.xinfo_groups(keys.orders()).await?;
    Ok(groups.groups.iter().any(|g| g.name == WORKER_GROUP))
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PendingEntry {
    pub entry_id: String,
    pub user: Option<String>,
    pub order: Option<String>,
    /// The units the order holds ("1" for an entry without a quantity).
    pub quantity: Option<String>,
    pub consumer: String,
    pub idle_ms: u64,
    pub deliveries: u64,
}

/// Up to `limit` pending entries, oldest first, with their fields.
pub async fn pending_entries(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    limit: usize,
) -> Result<Vec<PendingEntry>> {
    if !conn.exists::<_, bool>(keys.orders()).await? || !has_group(conn, keys).await? {
        return Ok(Vec::new());
    }
    let reply: StreamPendingCountReply = conn
        .xpending_count(keys.orders(), WORKER_GROUP, "-", "+", limit)
        .await?;
    let mut out = Vec::with_capacity(reply.ids.len());
    for p in reply.ids {
        let entry: StreamRangeReply = conn.xrange(keys.orders(), &p.id, &p.id).await?;
        let raw = entry.ids.first().map(|e| RawEntry::from_map(&e.id, &e.map));
        let field = |name: &str| raw.as_ref().and_then(|r| r.field(name)).map(str::to_string);
        out.push(PendingEntry {
            user: field("user"),
            order: field("order"),
            quantity: raw
                .as_ref()
                .map(|r| r.field("quantity").unwrap_or("1").to_string()),
            entry_id: p.id,
            consumer: p.consumer,
            idle_ms: p.last_delivered_ms as u64,
            deliveries: p.times_delivered as u64,
        });
    }
    Ok(out)
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeadLetterView {
    /// Id in the dead-letter stream (what `--requeue --entry` takes).
    pub id: String,
    /// Id the message had in the order stream.
    pub entry: Option<String>,
    pub reason: Option<String>,
    pub deliveries: Option<u64>,
    pub user: Option<String>,
    pub order: Option<String>,
    pub kind: Option<String>,
    /// The units the order holds ("1" for a letter without a quantity).
    pub quantity: Option<String>,
}

pub async fn dead_letters(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    limit: usize,
) -> Result<Vec<DeadLetterView>> {
    let reply: StreamRangeReply = conn.xrange_count(keys.dead(), "-", "+", limit).await?;
    Ok(reply
        .ids
        .iter()
        .map(|e| {
            let raw = RawEntry::from_map(&e.id, &e.map);
            let f = |name: &str| raw.field(name).map(str::to_string);
            DeadLetterView {
                id: e.id.clone(),
                entry: f("entry"),
                reason: f("reason"),
                deliveries: f("deliveries").and_then(|d| d.parse().ok()),
                user: f("user"),
                order: f("order"),
                kind: f("kind"),
                quantity: Some(f("quantity").unwrap_or_else(|| "1".into())),
            }
        })
        .collect())
}
