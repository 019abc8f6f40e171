//! What a mover's round reads of a voucher in buckets: each bucket's
//! stock, state and waiting line, and the pool, in as few round trips as
//! the state allows (one pipeline per master; the lines further in and the
//! units their requests want only while units are free), and what follows
//! from the read alone: whether the voucher's stock may move, and which
//! waiting requests its free units are for (worker/allotment.rs).

use redis::{FromRedisValue, Value};

use super::allotment::{allot, Allotment, Line};
use crate::error::{Error, Result};
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::{pipeline_per_item, Redis};
use crate::support::timespec::now_ms;

/// How far into each bucket's line a round reads (while units are free;
/// else its first request only): the most requests of one bucket a round
/// serves, and as far as a serve looks (lua/lib/waitlist.lua).
pub(super) const LINE_DEPTH: isize = 1_000;

/// One bucket as a round reads it.
#[derive(Debug, Clone)]
pub(super) struct BucketView {
    /// Its stock, state and waiting line, as the allotment takes them.
    pub(super) line: Line,
    /// The sale's opening (meta's begin_ms; None: not loaded yet, or lost,
    /// and such a gate is neither given nor taken from).
    pub(super) begin_ms: Option<i64>,
}

impl std::borrow::Borrow<Line> for BucketView {
    fn borrow(&self) -> &Line {
        &self.line
    }
}

/// The allotment of a round's look: the pool counts while bucket 0, whose
/// master holds it, is not paused.
pub(super) fn allotment(looks: &[BucketView], pool: i64) -> Allotment {
    allot(looks, if pool_usable(looks) { pool } else { 0 })
}

/// Every bucket as it is now, and the pool's units: one pipeline per
/// master for all of them with each line's first request; while units
/// are free, each line further in (LINE_DEPTH) and (where requests
/// for more than one unit wait) the units they want.
pub(super) async fn look_all(
    conn: &mut Redis,
    gates: &[VoucherKeys],
) -> Result<(Vec<BucketView>, i64)> {
    let items: Vec<(usize, &VoucherKeys)> = gates.iter().enumerate().collect();
    let replies = pipeline_per_item(conn, &items, false, false, |pipe, (b, k)| {
        pipe.get(k.stock())
            .cmd("HMGET")
            .arg(k.meta())
            .arg("paused")
            .arg("begin_ms")
            .zrange_withscores(k.waitlist(), 0, 0)
            .zcard(k.waitlist())
            .hlen(k.waitlist_quantity());
        if *b == 0 {
            pipe.get(k.pool());
        }
        Ok(())
    })
    .await?;
    let mut looks = Vec::with_capacity(gates.len());
    let mut lines = Vec::with_capacity(gates.len());
    let mut pool = 0;
    let mut quantities = false;
    for (keys, reply) in gates.iter().zip(replies) {
        type Row = (
            Option<i64>,
            (Option<String>, Option<String>),
            Vec<(String, f64)>,
            u64,
            u64,
        );
        let mut reply = reply.into_iter();
        let row: Vec<Value> = reply.by_ref().take(5).collect();
        let (stock, (paused, begin), line, length, wanting_more): Row =
            FromRedisValue::from_redis_value(Value::Array(row))
                .map_err(|e| Error::redis(format!("mover look at {}: {e}", keys.meta())))?;
        if let Some(units) = reply.next() {
            pool = Option::<i64>::from_redis_value(units)
                .map_err(|e| Error::redis(format!("mover look at the pool: {e}")))?
                .unwrap_or(0);
        }
        // Requests for more than a unit may wait (whatever the limit is
        // now: one lowered later leaves them as they were). The hash also
        // holds waiting requests' client references (ref:<user>): then the
        // wants are read for nothing, by user, so never misread.
        quantities |= wanting_more > 0;
        looks.push(BucketView {
            line: Line {
                stock: stock.unwrap_or(0).max(0),
                paused: paused.as_deref() == Some("1"),
                waiting: line.iter().map(|(_, at)| (*at, 1)).collect(),
                seen_all: length <= line.len() as u64,
            },
            begin_ms: begin.and_then(|b| b.parse().ok()),
        });
        lines.push(line);
    }
    let free = looks
        .iter()
        .filter(|l| !l.line.paused)
        .map(|l| l.line.stock)
        .sum::<i64>()
        + if pool_usable(&looks) { pool } else { 0 };
    // Sold out: the first request anywhere is all a round needs (the
    // one a freed unit is for).
    if free > 0 && looks.iter().any(|l| !l.line.seen_all) {
        read_lines(conn, gates, &mut lines, &mut looks).await?;
    }
    if quantities && free > 0 {
        read_wants(conn, gates, &lines, &mut looks).await?;
    }
    Ok((looks, pool))
}

/// Each line read on past its first request, up to LINE_DEPTH, one
/// pipeline per master.
async fn read_lines(
    conn: &mut Redis,
    gates: &[VoucherKeys],
    lines: &mut [Vec<(String, f64)>],
    looks: &mut [BucketView],
) -> Result<()> {
    let items: Vec<(usize, &VoucherKeys)> = gates
        .iter()
        .enumerate()
        .filter(|(b, _)| !looks[*b].line.seen_all)
        .collect();
    let replies = pipeline_per_item(conn, &items, false, false, |pipe, (_, k)| {
        pipe.zrange_withscores(k.waitlist(), 0, LINE_DEPTH - 1)
            .zcard(k.waitlist());
        Ok(())
    })
    .await?;
    for ((b, keys), reply) in items.iter().zip(replies) {
        let (line, length): (Vec<(String, f64)>, u64) =
            FromRedisValue::from_redis_value(Value::Array(reply))
                .map_err(|e| Error::redis(format!("mover look at {}: {e}", keys.waitlist())))?;
        looks[*b].line.waiting = line.iter().map(|(_, at)| (*at, 1)).collect();
        looks[*b].line.seen_all = length <= line.len() as u64;
        lines[*b] = line;
    }
    Ok(())
}

/// The units each read waiting request wants (absent: 1), one pipeline
/// per master.
async fn read_wants(
    conn: &mut Redis,
    gates: &[VoucherKeys],
    lines: &[Vec<(String, f64)>],
    looks: &mut [BucketView],
) -> Result<()> {
    let items: Vec<(&VoucherKeys, &Vec<(String, f64)>)> = gates
        .iter()
        .zip(lines)
        .filter(|(_, line)| !line.is_empty())
        .collect();
    let replies = pipeline_per_item(conn, &items, false, false, |pipe, (k, line)| {
        let cmd = pipe.cmd("HMGET").arg(k.waitlist_quantity());
        for (user, _) in line.iter() {
            cmd.arg(user);
        }
        Ok(())
    })
    .await?;
    let waiting = looks.iter_mut().filter(|l| !l.line.waiting.is_empty());
    for (look, reply) in waiting.zip(replies) {
        let wants: Vec<Option<String>> = reply
            .into_iter()
            .next()
            .map(FromRedisValue::from_redis_value)
            .transpose()
            .map_err(|e| Error::redis(format!("mover look at the wanted units: {e}")))?
            .unwrap_or_default();
        for (entry, want) in look.line.waiting.iter_mut().zip(wants) {
            entry.1 = want.and_then(|w| w.parse::<i64>().ok()).unwrap_or(1).max(1);
        }
    }
    Ok(())
}

/// Whether a voucher's stock may move now: every bucket loaded (a preload
/// publishes them one after another, and units moved to one not published
/// yet would be sold by nobody, and make its publish fail), and its sale
/// begun (before it nothing sells, and a preload may be re-splitting it).
pub(super) fn movable(looks: &[BucketView]) -> bool {
    let now = now_ms();
    looks.iter().all(|l| l.begin_ms.is_some_and(|b| b <= now))
}

/// The pool's units may move: its gate (bucket 0's) is not paused.
pub(super) fn pool_usable(looks: &[BucketView]) -> bool {
    looks.first().is_some_and(|l| !l.line.paused)
}

/// The voucher's free units no waiting request is allotted: every open
/// bucket's stock and the usable pool, less what the allotment gives.
pub(super) fn unpromised(looks: &[BucketView], pool: i64, allotted: &Allotment) -> i64 {
    let stock: i64 = looks
        .iter()
        .filter(|l| !l.line.paused)
        .map(|l| l.line.stock.max(0))
        .sum();
    let pool = if pool_usable(looks) { pool.max(0) } else { 0 };
    (stock + pool - allotted.need.iter().sum::<i64>()).max(0)
}
