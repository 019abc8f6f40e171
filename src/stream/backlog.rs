//! How much of a voucher's order stream is not yet in MySQL: entries never
//! delivered to the worker group, plus entries delivered but not acked.

use crate::store::redis_conn::RedisConn;
use redis::streams::{StreamInfoGroup, StreamInfoGroupsReply};
use redis::AsyncCommands;
use serde::Serialize;

use crate::error::Result;
use crate::store::keys::{VoucherKeys, WORKER_GROUP};
use crate::stream::entry::{OrderMessage, RawEntry, MAX_QUANTITY};
use crate::stream::id::StreamId;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Backlog {
    /// Entries in the stream (acked ones included until trimmed).
    pub length: u64,
    /// Entries the worker group has not read yet (all of them without a group).
    pub undelivered: u64,
    /// Entries read but not acked.
    pub pending: u64,
}

impl Backlog {
    /// Orders admitted in Redis that may not be in MySQL yet.
    pub fn in_flight(&self) -> u64 {
        self.undelivered + self.pending
    }
}

/// The stream's length and the worker group, as one read of both (`None`:
/// an empty stream, nothing in flight).
struct StreamLook {
    length: u64,
    group: Option<StreamInfoGroup>,
}

async fn look<C: RedisConn>(conn: &mut C, stream: &str) -> Result<Option<StreamLook>> {
    let length: u64 = conn.xlen(stream).await?;
    if length == 0 {
        return Ok(None);
    }
    let groups: StreamInfoGroupsReply = conn.xinfo_groups(stream).await?;
    let group = groups.groups.into_iter().find(|g| g.name == WORKER_GROUP);
    Ok(Some(StreamLook { length, group }))
}

pub async fn backlog<C: RedisConn>(conn: &mut C, keys: &VoucherKeys) -> Result<Backlog> {
    let stream = keys.orders();
    match look(conn, &stream).await? {
        Some(seen) => backlog_of(conn, &stream, &seen).await,
        None => Ok(Backlog::default()),
    }
}

/// The backlog, and the time (Unix ms, from its id) of the oldest entry not
/// acknowledged (the oldest pending one, or the first not yet delivered),
/// from one read of the stream's group (the metrics page wants both).
pub async fn backlog_and_oldest<C: RedisConn>(
    conn: &mut C,
    keys: &VoucherKeys,
) -> Result<(Backlog, Option<u64>)> {
    let stream = keys.orders();
    let Some(seen) = look(conn, &stream).await? else {
        return Ok((Backlog::default(), None));
    };
    let backlog = backlog_of(conn, &stream, &seen).await?;
    let after = match &seen.group {
        Some(g) => format!("({}", g.last_delivered_id),
        None => "-".to_string(),
    };
    let next: redis::streams::StreamRangeReply = conn.xrange_count(&stream, &after, "+", 1).await?;
    let undelivered = next.ids.first().map(|e| StreamId::lenient(&e.id).ms);
    let pending = match &seen.group {
        Some(g) if g.pending > 0 => {
            let reply: redis::streams::StreamPendingReply =
                conn.xpending(&stream, WORKER_GROUP).await?;
            match reply {
                redis::streams::StreamPendingReply::Data(d) => {
                    Some(StreamId::lenient(&d.start_id).ms)
                }
                _ => None,
            }
        }
        _ => None,
    };
    Ok((backlog, [undelivered, pending].into_iter().flatten().min()))
}

async fn backlog_of<C: RedisConn>(
    conn: &mut C,
    stream: &str,
    seen: &StreamLook,
) -> Result<Backlog> {
    let length = seen.length;
    let Some(group) = &seen.group else {
        return Ok(Backlog {
            length,
            undelivered: length,
            pending: 0,
        });
    };
    let undelivered = match group.lag {
        Some(0) => 0,
        // Redis's lag can stay above zero after trims although every entry
        // was delivered (seen: lag 100, last delivered = last generated):
        // nothing is undelivered when nothing lies after the group's last id.
        Some(lag) => {
            let newest: redis::streams::StreamRangeReply =
                conn.xrevrange_count(stream, "+", "-", 1).await?;
            let delivered = StreamId::lenient(&group.last_delivered_id);
            match newest.ids.first() {
                Some(e) if StreamId::lenient(&e.id) > delivered => lag as u64,
                _ => 0,
            }
        }
        // Redis cannot tell the lag after some deletions: count what lies
        // after the group's last delivered id.
        None => count_after(conn, stream, &group.last_delivered_id).await?,
    };
    Ok(Backlog {
        length,
        undelivered,
        pending: group.pending as u64,
    })
}

async fn count_after<C: RedisConn>(conn: &mut C, stream: &str, after: &str) -> Result<u64> {
    const PAGE: usize = 1_000;
    let mut from = format!("({after}");
    let mut total = 0u64;
    loop {
        let page: redis::streams::StreamRangeReply =
            conn.xrange_count(stream, &from, "+", PAGE).await?;
        total += page.ids.len() as u64;
        match page.ids.last() {
            Some(last) if page.ids.len() == PAGE => from = format!("({}", last.id),
            _ => return Ok(total),
        }
    }
}

/// (user, order, quantity) of every entry not yet acknowledged —
/// undelivered, or delivered and pending — whatever its consumer (an entry
/// without a quantity holds 1 unit). Malformed entries are skipped (they
/// are the dead-letter path's business).
pub async fn in_flight_orders<C: RedisConn>(
    conn: &mut C,
    keys: &VoucherKeys,
) -> Result<Vec<(u64, u64, u64)>> {
    let stream = keys.orders();
    let Some(seen) = look(conn, &stream).await? else {
        return Ok(Vec::new());
    };
    let group = seen.group;
    let pending = pending_ids(conn, &stream, group.as_ref()).await?;
    let after = group
        .as_ref()
        .map(|g| StreamId::lenient(&g.last_delivered_id));
    // Acknowledged entries are kept for a while (worker --keep): start the
    // range at the oldest entry that can still be in flight, and page it.
    let oldest_pending = pending.iter().map(|id| StreamId::lenient(id)).min();
    let start = match (oldest_pending, after) {
        (Some(p), Some(a)) => p.min(a.next()),
        (None, Some(a)) => a.next(),
        (_, None) => StreamId::ZERO,
    };
    let mut out = Vec::new();
    for_each_page(conn, &stream, Range::From(&start.to_string()), |e| {
        if after.is_none_or(|a| StreamId::lenient(&e.id) > a) || pending.contains(&e.id) {
            out.extend(order_of(e));
        }
        true
    })
    .await?;
    Ok(out)
}

/// Which users' kept acknowledged entries [`acknowledged_orders`] looks for.
pub enum Wanted<'a> {
    /// These users, each found once.
    Users(&'a std::collections::BTreeSet<u64>),
    /// Any user but these (those MySQL has an order of), until this many
    /// are found: MySQL lost more commits than the gate's buyers show (a
    /// preload after the loss, Redis's buyers lost too).
    Besides(&'a std::collections::BTreeSet<u64>, usize),
}

/// The acknowledged entries still kept (worker `--keep`, 1 h by default)
/// of the users `wanted`: orders a worker committed to MySQL before it
/// acknowledged them. Per user the newest such entry decides (a requeued
/// dead letter leaves its first entry acknowledged behind it); a user with
/// any dead letter is not looked for (a refused admission, not a commit,
/// and the common reason for a buyer MySQL has no order of). Read newest
/// first, until every user wanted is found: reconcile asks only when MySQL
/// may have lost its last commits.
pub async fn acknowledged_orders<C: RedisConn>(
    conn: &mut C,
    keys: &VoucherKeys,
    wanted: Wanted<'_>,
) -> Result<Vec<OrderMessage>> {
    let stream = keys.orders();
    let nothing = match wanted {
        Wanted::Users(users) => users.is_empty(),
        Wanted::Besides(_, limit) => limit == 0,
    };
    if nothing {
        return Ok(Vec::new());
    }
    let Some(StreamLook {
        group: Some(group), ..
    }) = look(conn, &stream).await?
    else {
        return Ok(Vec::new());
    };
    let mut dead_users = std::collections::HashSet::new();
    for_each_page(conn, &keys.dead(), Range::From("-"), |e| {
        dead_users.extend(e.get::<u64>("user"));
        true
    })
    .await?;
    let pending = pending_ids(conn, &stream, Some(&group)).await?;
    // Users decided (their newest entry read), whether wanted or not.
    let mut decided: std::collections::HashSet<u64> = dead_users;
    let mut left = match wanted {
        Wanted::Users(users) => users.iter().filter(|u| !decided.contains(u)).count(),
        Wanted::Besides(_, limit) => limit,
    };
    let mut out = Vec::new();
    let newest_first = Range::Newest(&group.last_delivered_id);
    for_each_page(conn, &stream, newest_first, |e| {
        if left == 0 {
            return false;
        }
        if pending.contains(&e.id) {
            return true;
        }
        // Whole, as a worker parsed it: its time is the order's.
        let Ok(m) = RawEntry::from_map(&e.id, &e.map).parse(keys.voucher()) else {
            return true;
        };
        if !decided.insert(m.user) {
            return true;
        }
        let wanted = match wanted {
            Wanted::Users(users) => users.contains(&m.user),
            Wanted::Besides(users, _) => !users.contains(&m.user),
        };
        if wanted {
            left -= 1;
            out.push(m);
        }
        left > 0
    })
    .await?;
    Ok(out)
}

/// The ids of the group's pending entries.
async fn pending_ids<C: RedisConn>(
    conn: &mut C,
    stream: &str,
    group: Option<&StreamInfoGroup>,
) -> Result<std::collections::HashSet<String>> {
    Ok(match group {
        Some(g) if g.pending > 0 => {
            let reply: redis::streams::StreamPendingCountReply = conn
                .xpending_count(stream, WORKER_GROUP, "-", "+", g.pending)
                .await?;
            reply.ids.into_iter().map(|p| p.id).collect()
        }
        _ => Default::default(),
    })
}

/// Which entries a page walk reads, in its order.
enum Range<'a> {
    /// Oldest first, from this id (inclusive) to the end.
    From(&'a str),
    /// Newest first, from this id (inclusive) back to the start.
    Newest(&'a str),
}

/// Every entry of `range`, a few thousand a command, until `each` says
/// stop (false).
async fn for_each_page<C: RedisConn>(
    conn: &mut C,
    stream: &str,
    range: Range<'_>,
    mut each: impl FnMut(&redis::streams::StreamId) -> bool,
) -> Result<()> {
    const PAGE: usize = 5_000;
    let (mut at, newest_first) = match range {
        Range::From(id) => (id.to_string(), false),
        Range::Newest(id) => (id.to_string(), true),
    };
    loop {
        let page: redis::streams::StreamRangeReply = if newest_first {
            conn.xrevrange_count(stream, &at, "-", PAGE).await?
        } else {
            conn.xrange_count(stream, &at, "+", PAGE).await?
        };
        for e in &page.ids {
            if !each(e) {
                return Ok(());
            }
        }
        match page.ids.last() {
            Some(last) if page.ids.len() == PAGE => at = format!("({}", last.id),
            _ => return Ok(()),
        }
    }
}

/// An entry's (user, order, quantity), if well formed.
fn order_of(e: &redis::streams::StreamId) -> Option<(u64, u64, u64)> {
    let quantity = match e.map.get("quantity") {
        None => 1,
        Some(_) => e
            .get::<u64>("quantity")
            .filter(|q| (1..=u64::from(MAX_QUANTITY)).contains(q))?,
    };
    Some((e.get::<u64>("user")?, e.get::<u64>("order")?, quantity))
}
