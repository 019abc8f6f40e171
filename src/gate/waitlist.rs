//! The waitlist of a voucher, read for operators.

use serde::Serialize;

use crate::error::Result;
use crate::store::keys::VoucherKeys;
use crate::store::layout::Layout;
use crate::store::redis_conn::RedisConn;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Waiting {
    pub position: u64,
    pub user: u64,
    /// When the user was first queued (Unix ms).
    pub queued_ms: i64,
    /// The units the request waits for.
    pub quantity: u64,
    /// The bucket it waits at (a voucher split in buckets only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u32>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Waitlist {
    pub voucher: u64,
    pub length: u64,
    /// Promotions so far: waiting requests served, one order each.
    pub promotions: u64,
    pub head: Vec<Waiting>,
}

/// The first `limit` users in line, the queue's length and the promotions.
pub async fn read(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
    limit: usize,
) -> Result<Waitlist> {
    let (entries, length, promotions): (Vec<(u64, f64)>, u64, Option<u64>) = redis::pipe()
        .zrange_withscores(keys.waitlist(), 0, limit as isize - 1)
        .zcard(keys.waitlist())
        .hget(keys.meta(), "promotions")
        .query_async(conn)
        .await?;
    // Requests of one unit have no entry (absent: 1).
    let wants: Vec<Option<u64>> = if entries.is_empty() {
        Vec::new()
    } else {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(keys.waitlist_quantity());
        for (user, _) in &entries {
            cmd.arg(*user);
        }
        cmd.query_async(conn).await?
    };
    Ok(Waitlist {
        voucher,
        length,
        promotions: promotions.unwrap_or(0),
        head: entries
            .into_iter()
            .zip(wants.into_iter().chain(std::iter::repeat(None)))
            .enumerate()
            .map(|(i, ((user, score), wants))| Waiting {
                position: i as u64 + 1,
                user,
                // Scores are microseconds.
                queued_ms: (score / 1000.0) as i64,
                quantity: wants.unwrap_or(1).max(1),
                bucket: None,
            })
            .collect(),
    })
}

/// The waitlist of every bucket of a voucher as one line, in order of
/// arrival across buckets (each bucket's queued times are its master's
/// clock: the order holds within the clock skew between masters).
pub async fn read_all(
    conn: &mut impl RedisConn,
    layout: &Layout,
    limit: usize,
) -> Result<Waitlist> {
    let voucher = layout.voucher();
    if layout.buckets() == 1 {
        return read(conn, &layout.keys(0)?, voucher, limit).await;
    }
    let mut all = Waitlist {
        voucher,
        length: 0,
        promotions: 0,
        head: Vec::new(),
    };
    for (b, keys) in layout.all_keys()?.iter().enumerate() {
        let w = read(conn, keys, voucher, limit).await?;
        all.length += w.length;
        all.promotions += w.promotions;
        all.head.extend(w.head.into_iter().map(|mut entry| {
            entry.bucket = Some(b as u32);
            entry
        }));
    }
    all.head.sort_by_key(|w| (w.queued_ms, w.position));
    all.head.truncate(limit);
    for (i, w) in all.head.iter_mut().enumerate() {
        w.position = i as u64 + 1;
    }
    Ok(all)
}
