//! A read-only look at a voucher's state at the Redis gate.

use crate::redis_store::RedisConn;
use serde::Serialize;

use crate::error::Result;
use crate::keys::VoucherKeys;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GateState {
    /// Whether `seckill preload` has loaded the voucher.
    pub loaded: bool,
    /// Units left at the gate (None when not loaded).
    pub stock: Option<i64>,
    pub buyers: u64,
    pub waitlist: u64,
    /// Entries in the order stream.
    pub stream_length: u64,
    /// The stream's last entry id, a witness that admissions happened.
    pub last_entry_id: Option<String>,
}

/// One round trip: meta, stock, buyers, waitlist and stream, read together.
pub async fn read(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<GateState> {
    let (meta_exists, stock, buyers, waitlist, stream_length, last): (
        bool,
        Option<i64>,
        u64,
        u64,
        u64,
        redis::streams::StreamRangeReply,
    ) = redis::pipe()
        .exists(keys.meta())
        .get(keys.stock())
        .scard(keys.buyers())
        .zcard(keys.waitlist())
        .xlen(keys.orders())
        .xrevrange_count(keys.orders(), "+", "-", 1)
        .query_async(conn)
        .await?;
    Ok(GateState {
        loaded: meta_exists && stock.is_some(),
        stock,
        buyers,
        waitlist,
        stream_length,
        last_entry_id: last.ids.into_iter().next().map(|e| e.id),
    })
}
