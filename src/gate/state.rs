//! A read-only look at a voucher's state at the Redis gate.

use redis::{FromRedisValue, Value};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::{pipeline_per_item, RedisConn};

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
    let mut states = read_many(conn, std::slice::from_ref(keys)).await?;
    states
        .pop()
        .ok_or_else(|| Error::Redis("an empty reply to the gate's pipeline".into()))
}

/// The gates of many vouchers, in the order given.
pub async fn read_many(conn: &mut impl RedisConn, keys: &[VoucherKeys]) -> Result<Vec<GateState>> {
    let replies = pipeline_per_item(conn, keys, false, false, |pipe, k| {
        pipe.exists(k.meta())
            .get(k.stock())
            .scard(k.buyers())
            .zcard(k.waitlist())
            .xlen(k.orders())
            .xrevrange_count(k.orders(), "+", "-", 1);
        Ok(())
    })
    .await?;
    keys.iter()
        .zip(replies)
        .map(|(k, row)| {
            let (meta_exists, stock, buyers, waitlist, stream_length, last): GateRow =
                FromRedisValue::from_redis_value(Value::Array(row))
                    .map_err(|e| Error::Redis(format!("gate of voucher {}: {e}", k.voucher())))?;
            Ok(GateState {
                loaded: meta_exists && stock.is_some(),
                stock,
                buyers,
                waitlist,
                stream_length,
                last_entry_id: last.ids.into_iter().next().map(|e| e.id),
            })
        })
        .collect()
}

type GateRow = (
    bool,
    Option<i64>,
    u64,
    u64,
    u64,
    redis::streams::StreamRangeReply,
);
