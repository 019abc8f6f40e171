//! Layer 2: the order streams and the worker group on them — creating the
//! group, reading new entries, reclaiming entries of dead consumers, finishing
//! a batch, and trimming what is safely done.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::streams::{
    StreamAutoClaimReply, StreamInfoConsumersReply, StreamInfoGroupsReply, StreamPendingCountReply,
    StreamPendingReply,
};
use redis::AsyncCommands;

use super::persist::{Fate, Persisted};
use crate::error::{Error, Result};
use crate::store::keys::{VoucherKeys, WORKER_GROUP};
use crate::store::redis_conn::RedisConn;
use crate::store::scripts::{FINISH, FORGET_CONSUMER};
use crate::stream::entry::{OrderMessage, RawEntry};
use crate::stream::id::StreamId;
use crate::stream::pending::NO_STOCK;
use crate::stream::read_reply;

/// An entry handed to this consumer, with how often it has been delivered.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub raw: RawEntry,
    pub deliveries: u64,
}

/// Creates the worker group on the voucher's stream (and the stream) unless
/// it exists. Starting at id 0 delivers entries admitted before any worker ran.
pub async fn ensure_group(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<()> {
    let created: redis::RedisResult<()> = conn
        .xgroup_create_mkstream(keys.orders(), WORKER_GROUP, "0")
        .await;
    match created {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => Ok(other?),
    }
}

/// Reads up to `count` new entries per stream, blocking up to `block_ms`
/// (`None`: not at all).
/// Uses its own connection: a blocking read holds it for the whole wait.
pub async fn read_new<L: Copy + Eq + std::hash::Hash>(
    conn: &mut impl RedisConn,
    streams: &[(L, String)],
    consumer: &str,
    count: usize,
    block_ms: Option<u64>,
) -> Result<Vec<(L, Vec<Delivery>)>> {
    if streams.is_empty() {
        return Ok(Vec::new());
    }
    if conn.is_cluster() && streams.len() > 1 {
        return poll_each(conn, streams, consumer, count, block_ms.unwrap_or(0)).await;
    }
    xreadgroup(conn, streams, consumer, count, block_ms).await
}

/// How often a cluster's streams are looked at while all are empty: at
/// first soon, then less often, up to [`CLUSTER_POLL_MAX`].
const CLUSTER_POLL_MIN: Duration = Duration::from_millis(10);
const CLUSTER_POLL_MAX: Duration = Duration::from_millis(200);
/// Reads in flight at once.
const CLUSTER_READS_AT_ONCE: usize = 64;

/// On a cluster one XREADGROUP names the streams of one slot only, and a
/// blocking read of one voucher would hold up the reads of the others on
/// its node: each stream is read without blocking, many at once, again and
/// again (less often while all stay empty) until something arrives or
/// `block_ms` has passed. Entries already handed to this consumer are
/// returned even when another stream's read failed (they would otherwise
/// wait for a reclaim); the error comes back once nothing else does.
async fn poll_each<L: Copy + Eq + std::hash::Hash>(
    conn: &mut impl RedisConn,
    streams: &[(L, String)],
    consumer: &str,
    count: usize,
    block_ms: u64,
) -> Result<Vec<(L, Vec<Delivery>)>> {
    let until = Instant::now() + Duration::from_millis(block_ms);
    let mut pause = CLUSTER_POLL_MIN;
    loop {
        let mut out = Vec::new();
        let mut failed = None;
        for group in streams.chunks(CLUSTER_READS_AT_ONCE) {
            let reads = group.iter().map(|stream| {
                let mut c = conn.clone();
                async move {
                    xreadgroup(&mut c, std::slice::from_ref(stream), consumer, count, None).await
                }
            });
            for read in futures_util::future::join_all(reads).await {
                match read {
                    Ok(r) => out.extend(r),
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
        }
        if !out.is_empty() {
            if let Some(e) = failed {
                tracing::warn!("{e} (the other streams' entries are handled first)");
            }
            return Ok(out);
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let now = Instant::now();
        if now >= until {
            return Ok(out);
        }
        tokio::time::sleep(pause.min(until - now)).await;
        pause = (pause * 2).min(CLUSTER_POLL_MAX);
    }
}

/// One XREADGROUP over `streams` (blocking when `block_ms` is given).
async fn xreadgroup<L: Copy + Eq + std::hash::Hash>(
    conn: &mut impl RedisConn,
    streams: &[(L, String)],
    consumer: &str,
    count: usize,
    block_ms: Option<u64>,
) -> Result<Vec<(L, Vec<Delivery>)>> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(WORKER_GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(count);
    if let Some(ms) = block_ms {
        cmd.arg("BLOCK").arg(ms);
    }
    cmd.arg("STREAMS");
    for (_, key) in streams {
        cmd.arg(key);
    }
    for _ in streams {
        cmd.arg(">");
    }
    let reply: redis::Value = cmd.query_async(conn).await?;
    let read = read_reply::streams(reply)
        .map_err(|e| Error::redis(format!("unexpected XREADGROUP reply: {e}")))?;
    let by_key: HashMap<&str, L> = streams.iter().map(|(v, k)| (k.as_str(), *v)).collect();
    let mut out = Vec::new();
    for (key, raw) in read {
        let Some(label) = by_key.get(key.as_str()) else {
            continue;
        };
        let entries: Vec<Delivery> = raw
            .into_iter()
            .map(|raw| Delivery { raw, deliveries: 1 })
            .collect();
        if !entries.is_empty() {
            out.push((*label, entries));
        }
    }
    Ok(out)
}

/// Claims entries idle for at least `min_idle_ms` (their consumer died or
/// failed them), scanning the pending entries from `start`, and reports how
/// often each was delivered, claim included. Returns where the next call
/// should start (`0-0`: the scan went through every pending entry).
pub async fn reclaim(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    consumer: &str,
    min_idle_ms: u64,
    count: usize,
    start: StreamId,
) -> Result<(StreamId, Vec<Delivery>)> {
    let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
        .arg(keys.orders())
        .arg(WORKER_GROUP)
        .arg(consumer)
        .arg(min_idle_ms)
        .arg(start.to_string())
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    let next = StreamId::lenient(&reply.next_stream_id);
    if !reply.deleted_ids.is_empty() {
        tracing::warn!(
            "{}: {} pending entr(y/ies) no longer in the stream were dropped by Redis: {:?}",
            keys.orders(),
            reply.deleted_ids.len(),
            reply.deleted_ids
        );
    }
    if reply.claimed.is_empty() {
        return Ok((next, Vec::new()));
    }
    // XAUTOCLAIM does not say how often an entry was delivered; XPENDING
    // does. One exact range per entry (in one round trip): a range over
    // several would also hold this consumer's other pending entries and
    // could cut the claimed ones off at its count.
    let mut pipe = redis::pipe();
    for e in &reply.claimed {
        pipe.xpending_consumer_count(keys.orders(), WORKER_GROUP, &e.id, &e.id, 1, consumer);
    }
    let counts: Vec<StreamPendingCountReply> = pipe.query_async(conn).await?;
    let by_id: HashMap<String, u64> = counts
        .into_iter()
        .flat_map(|c| c.ids)
        .map(|p| (p.id, p.times_delivered as u64))
        .collect();
    let deliveries = reply
        .claimed
        .iter()
        .map(|e| Delivery {
            raw: RawEntry::from_map(&e.id, &e.map),
            deliveries: by_id.get(&e.id).copied().unwrap_or(1),
        })
        .collect();
    Ok((next, deliveries))
}

/// A message refused for good.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub entry_id: String,
    pub reason: String,
    pub deliveries: u64,
}

/// What completes a committed batch.
#[derive(Debug, Default)]
pub struct Completion<'a> {
    /// (order id, payment deadline ms) of the pending orders.
    pub deadlines: Vec<(u64, i64)>,
    pub dead: Vec<DeadLetter>,
    /// Entry ids to acknowledge whose orders MySQL holds (the batch
    /// inserted them, or found them stored as these entries inserted them:
    /// by a delivery that died before acknowledging them, so never
    /// counted): counted into the gate's witness of MySQL's commits (meta
    /// `committed`) when acknowledged now.
    pub inserted: Vec<String>,
    /// The other entry ids to acknowledge (dead-lettered ones included).
    pub acks: Vec<String>,
    /// Users whose locks to release, and their owner's token.
    pub locks: &'a [u64],
    pub owner: &'a str,
}

/// What a committed batch still has to do in Redis, and what it counted.
pub struct Planned {
    pub redis: Completion<'static>,
    /// (inserted, already stored)
    pub counts: (u64, u64),
    /// The units of the orders inserted.
    pub units: u64,
}

impl Planned {
    pub fn new(dead: Vec<DeadLetter>, acks: Vec<String>) -> Planned {
        Planned {
            redis: Completion {
                dead,
                acks,
                ..Default::default()
            },
            counts: (0, 0),
            units: 0,
        }
    }
}

/// The completion of a batch whose transaction ended with `p` (one fate
/// per order of `mine`, (order, deliveries)): the deadlines of its pending
/// orders, the inserted ones counted into the gate's witness, dead letters
/// for the refused, every entry acknowledged. `dead` and `acks`: the
/// batch's malformed entries, dead-lettered already.
pub fn plan(
    mine: &[(OrderMessage, u64)],
    p: Persisted,
    dead: Vec<DeadLetter>,
    acks: Vec<String>,
) -> Planned {
    let mut plan = Planned::new(dead, acks);
    for ((m, n), fate) in mine.iter().zip(p.fates) {
        match fate {
            Fate::Inserted => {
                plan.counts.0 += 1;
                plan.units += u64::from(m.quantity);
                plan.redis
                    .deadlines
                    .push((m.order, m.created_ms + p.pay_timeout_ms));
                plan.redis.inserted.push(m.entry_id.clone());
                continue;
            }
            Fate::AlreadyStored {
                pending,
                created_ms,
            } => {
                plan.counts.1 += 1;
                // From the stored order's time: a copy's is later, and
                // would move the deadline (a claim's included) past the
                // one MySQL's payment keeps to.
                if pending {
                    plan.redis
                        .deadlines
                        .push((m.order, created_ms + p.pay_timeout_ms));
                }
                let own = created_ms == m.created_ms;
                // Inserted by this entry (an earlier delivery or attempt
                // that died before the acknowledgement, or one Redis
                // forgot): counted when its XACK succeeds, as an insert's
                // is (XACK of a pending entry succeeds once). Uncounted,
                // MySQL losing it while it was in flight would go unseen
                // (the checked model's finding M3). Another entry's (a
                // copy) is counted by that entry's acknowledgement:
                // counting it here too would raise the witness above
                // MySQL, and the gate guard would pause for a loss that
                // did not happen.
                if own {
                    plan.redis.inserted.push(m.entry_id.clone());
                    continue;
                }
            }
            Fate::Repeated => plan.counts.1 += 1,
            // Neither acknowledged nor dead-lettered: it comes back.
            Fate::Kept => continue,
            Fate::NoStock => plan.redis.dead.push(DeadLetter {
                entry_id: m.entry_id.clone(),
                reason: NO_STOCK.to_string(),
                deliveries: *n,
            }),
            Fate::Dead(reason) => plan.redis.dead.push(DeadLetter {
                entry_id: m.entry_id.clone(),
                reason,
                deliveries: *n,
            }),
        }
        plan.redis.acks.push(m.entry_id.clone());
    }
    plan
}

/// The orders a batch found no stock for in MySQL ([`Fate::NoStock`]),
/// kept for a retry while MySQL has fewer cancellations (`cancelled`, read
/// in the batch's transaction) than the voucher's gates released
/// (`released`, read after it): MySQL lost commits, and the units it lost
/// the cancellations of back requests the gates admitted, told "success";
/// the gate guard cancels those orders again, and the retry finds the unit
/// (the checked model's finding M4). Dead-lettered otherwise, and past
/// `max_deliveries` in any case. How many were kept.
///
/// Counts suffice where orders are single units: a cancellation MySQL has
/// and the gate has not released yet (which hides a lost one in the
/// counts) left its unit in MySQL's stock, so MySQL runs out for the
/// gate's requests only when the gate released more orders than MySQL
/// cancelled. A lost cancellation of an order of several units, hidden by
/// a cancellation of fewer not yet released, is missed.
pub fn keep_no_stock_while_mysql_lacks_cancellations(
    fates: &mut [Fate],
    deliveries: impl IntoIterator<Item = u64>,
    released: u64,
    cancelled: u64,
    max_deliveries: u64,
) -> usize {
    let behind = released.saturating_sub(cancelled);
    let mut kept = 0;
    for (fate, n) in fates.iter_mut().zip(deliveries) {
        if *fate == Fate::NoStock && behind > 0 && n <= max_deliveries {
            *fate = Fate::Kept;
            kept += 1;
        }
    }
    kept
}

/// Deadlines, dead letters, XACK, then the locks' release — atomically
/// (lua/finish.lua).
pub async fn finish(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    c: &Completion<'_>,
) -> Result<u64> {
    let (deadlines, dead, acks) = (&c.deadlines, &c.dead, &c.acks);
    let mut inv = FINISH.prepare_invoke();
    inv.key(keys.orders())
        .key(keys.timeouts())
        .key(keys.dead())
        .key(keys.locks())
        .key(keys.meta());
    inv.arg(WORKER_GROUP).arg(c.owner).arg(deadlines.len());
    for (order, deadline) in deadlines {
        inv.arg(*order).arg(*deadline);
    }
    inv.arg(dead.len());
    for d in dead {
        inv.arg(&d.entry_id).arg(&d.reason).arg(d.deliveries);
    }
    inv.arg(c.locks.len()).arg(c.locks);
    inv.arg(c.inserted.len());
    for id in c.inserted.iter().chain(acks) {
        inv.arg(id);
    }
    Ok(inv.invoke_async(conn).await?)
}

/// Trims entries that are done: below the oldest pending entry, at or below
/// the group's last delivered id, and older than `keep_ms`. Returns how many
/// were removed. Nothing undelivered or pending is ever trimmed.
pub async fn trim(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    keep_ms: u64,
    now_ms: i64,
) -> Result<u64> {
    let stream = keys.orders();
    let groups: StreamInfoGroupsReply = conn.xinfo_groups(&stream).await?;
    let Some(group) = groups.groups.into_iter().find(|g| g.name == WORKER_GROUP) else {
        return Ok(0);
    };
    let mut threshold = StreamId::lenient(&group.last_delivered_id);
    let pending: StreamPendingReply = conn.xpending(&stream, WORKER_GROUP).await?;
    if let StreamPendingReply::Data(d) = pending {
        threshold = threshold.min(StreamId::lenient(&d.start_id));
    }
    let retained = StreamId::at_ms(u64::try_from(now_ms).unwrap_or(0).saturating_sub(keep_ms));
    threshold = threshold.min(retained);
    if threshold == StreamId::ZERO {
        return Ok(0);
    }
    let removed: u64 = redis::cmd("XTRIM")
        .arg(&stream)
        .arg("MINID")
        .arg(threshold.to_string())
        .query_async(conn)
        .await?;
    Ok(removed)
}
/// Removes `consumer` from the group if it has nothing pending; true if removed.
pub async fn forget_consumer(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    consumer: &str,
) -> Result<bool> {
    let removed: i64 = FORGET_CONSUMER
        .key(keys.orders())
        .arg(WORKER_GROUP)
        .arg(consumer)
        .invoke_async(conn)
        .await?;
    Ok(removed == 1)
}

/// Removes consumers (other than `me`) silent for `idle_ms` with nothing
/// pending: workers that exited or died long ago. Returns how many.
pub async fn forget_silent_consumers(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    me: &str,
    idle_ms: u64,
) -> Result<u64> {
    let consumers: StreamInfoConsumersReply =
        conn.xinfo_consumers(keys.orders(), WORKER_GROUP).await?;
    let mut removed = 0;
    for c in consumers.consumers {
        if c.name != me
            && c.pending == 0
            && c.idle as u64 >= idle_ms
            && forget_consumer(conn, keys, &c.name).await?
        {
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::entry::Kind;

    fn message(n: u64) -> (OrderMessage, u64) {
        let m = OrderMessage {
            entry_id: format!("{n}-0"),
            user: n,
            order: 100 + n,
            voucher: 1,
            kind: Kind::Admit,
            quantity: 1,
            created_ms: 1_000,
            client_reference: None,
        };
        (m, 1)
    }

    /// The witness counts every order MySQL holds that the batch
    /// acknowledges, inserted or found stored as this entry inserted it
    /// (finding M3), and an order's entry repeated in the batch once.
    #[test]
    fn orders_inserted_or_found_stored_are_counted_and_a_repeat_is_not() {
        let mine: Vec<(OrderMessage, u64)> = (1..=5).map(message).collect();
        let fates = vec![
            Fate::Inserted,
            Fate::AlreadyStored {
                pending: true,
                created_ms: 1_000,
            },
            Fate::AlreadyStored {
                pending: false,
                created_ms: 1_000,
            },
            Fate::Repeated,
            Fate::Dead("no stock in MySQL".into()),
        ];
        let p = Persisted {
            fates,
            pay_timeout_ms: 60_000,
            cancelled: 0,
        };
        let planned = plan(&mine, p, vec![], vec![]);
        assert_eq!(planned.redis.inserted, ["1-0", "2-0", "3-0"]);
        assert_eq!(planned.redis.acks, ["4-0", "5-0"]);
        assert_eq!(planned.counts, (1, 3));
        let deadlines: Vec<u64> = planned.redis.deadlines.iter().map(|d| d.0).collect();
        assert_eq!(deadlines, [101, 102]);
        assert_eq!(planned.redis.dead.len(), 1);
    }

    /// An order found stored that another entry inserted (a copy of its
    /// entry, later) is acknowledged uncounted, whatever its deliveries:
    /// that entry's acknowledgement counts it, so copies never raise the
    /// witness above MySQL. Its deadline is scheduled all the same, from
    /// the stored order's time.
    #[test]
    fn an_order_another_entry_inserted_is_not_counted_again() {
        let mut mine: Vec<(OrderMessage, u64)> = (1..=2).map(message).collect();
        mine[1].1 = 3;
        let p = Persisted {
            fates: vec![
                Fate::AlreadyStored {
                    pending: true,
                    created_ms: 400,
                },
                Fate::AlreadyStored {
                    pending: false,
                    created_ms: 400,
                },
            ],
            pay_timeout_ms: 60_000,
            cancelled: 0,
        };
        let planned = plan(&mine, p, vec![], vec![]);
        assert!(planned.redis.inserted.is_empty());
        assert_eq!(planned.redis.acks, ["1-0", "2-0"]);
        assert_eq!(planned.counts, (0, 2));
        assert_eq!(planned.redis.deadlines, [(101, 60_400)]);
    }

    /// An order MySQL had no unit for is kept (neither acknowledged nor
    /// dead-lettered) only while MySQL has fewer cancellations than the
    /// gates released, and not past the last delivery (finding M4).
    #[test]
    fn no_stock_is_kept_while_mysql_lacks_cancellations_and_deliveries_are_left() {
        let mine: Vec<(OrderMessage, u64)> = (1..=3).map(message).collect();
        let deliveries = [1, 5, 6];
        let no_stock = || vec![Fate::NoStock, Fate::NoStock, Fate::NoStock];

        let mut fates = no_stock();
        assert_eq!(
            keep_no_stock_while_mysql_lacks_cancellations(&mut fates, deliveries, 4, 3, 5),
            2
        );
        assert_eq!(fates[..2], [Fate::Kept, Fate::Kept]);
        assert_eq!(fates[2], Fate::NoStock);
        let p = Persisted {
            fates,
            pay_timeout_ms: 60_000,
            cancelled: 3,
        };
        let planned = plan(&mine, p, vec![], vec![]);
        assert!(planned.redis.inserted.is_empty());
        assert_eq!(planned.redis.acks, ["3-0"]);
        let dead: Vec<(&str, &str)> = planned
            .redis
            .dead
            .iter()
            .map(|d| (d.entry_id.as_str(), d.reason.as_str()))
            .collect();
        assert_eq!(dead, [("3-0", NO_STOCK)]);

        // MySQL has every cancellation the gates released (or more: one
        // not released yet): no unit is owed, refused for good.
        for (released, cancelled) in [(3, 3), (2, 3), (0, 0)] {
            let mut fates = no_stock();
            assert_eq!(
                keep_no_stock_while_mysql_lacks_cancellations(
                    &mut fates, deliveries, released, cancelled, 5
                ),
                0
            );
            assert_eq!(fates, no_stock());
        }
    }
}
