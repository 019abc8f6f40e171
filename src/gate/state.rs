//! A read-only look at a voucher's state at the Redis gate.

use redis::{FromRedisValue, Value};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;

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

/// Vouchers read per pipeline: one round trip each, none too large for a
/// server in the middle of a sale.
const CHUNK: usize = 500;

/// One round trip: meta, stock, buyers, waitlist and stream, read together.
pub async fn read(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<GateState> {
    let mut states = read_many(conn, std::slice::from_ref(keys)).await?;
    states
        .pop()
        .ok_or_else(|| Error::Redis("an empty reply to the gate's pipeline".into()))
}

/// The gates of many vouchers, in the order given, one pipeline per chunk.
pub async fn read_many(conn: &mut impl RedisConn, keys: &[VoucherKeys]) -> Result<Vec<GateState>> {
    const PER_VOUCHER: usize = 6;
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(CHUNK) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.exists(k.meta())
                .get(k.stock())
                .scard(k.buyers())
                .zcard(k.waitlist())
                .xlen(k.orders())
                .xrevrange_count(k.orders(), "+", "-", 1);
        }
        let replies: Vec<Value> = pipe.query_async(conn).await?;
        for (k, row) in chunk.iter().zip(replies.chunks(PER_VOUCHER)) {
            let (meta_exists, stock, buyers, waitlist, stream_length, last): GateRow =
                FromRedisValue::from_redis_value(Value::Array(row.to_vec()))
                    .map_err(|e| Error::Redis(format!("gate of voucher {}: {e}", k.voucher())))?;
            out.push(GateState {
                loaded: meta_exists && stock.is_some(),
                stock,
                buyers,
                waitlist,
                stream_length,
                last_entry_id: last.ids.into_iter().next().map(|e| e.id),
            });
        }
    }
    Ok(out)
}

type GateRow = (
    bool,
    Option<i64>,
    u64,
    u64,
    u64,
    redis::streams::StreamRangeReply,
);
