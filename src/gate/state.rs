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

/// Where a sale stands, as a caller polling it sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaleState {
    Paused,
    NotStarted,
    Ended,
    SoldOut,
    Open,
}

/// A loaded gate's sale window and stock, with Redis's clock (the one the
/// gate decides by).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sale {
    pub begin_ms: i64,
    pub end_ms: i64,
    pub paused: bool,
    pub stock: i64,
    pub now_ms: i64,
    /// Every bucket's tag, when the voucher is split (bucket 0's meta).
    pub bucket_tags: Option<String>,
}

impl Sale {
    /// In lua/seckill.lua's order: the window, then the pause, then stock.
    pub fn state(&self) -> SaleState {
        if self.now_ms < self.begin_ms {
            SaleState::NotStarted
        } else if self.now_ms >= self.end_ms {
            SaleState::Ended
        } else if self.paused {
            SaleState::Paused
        } else if self.stock <= 0 {
            SaleState::SoldOut
        } else {
            SaleState::Open
        }
    }
}

/// One round trip; None when the voucher is not loaded.
pub async fn read_sale(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<Option<Sale>> {
    type Row = (
        (Option<i64>, Option<i64>, Option<String>, Option<String>),
        Option<i64>,
        (i64, i64),
    );
    let (meta, stock, time): Row = redis::pipe()
        .cmd("HMGET")
        .arg(keys.meta())
        .arg(&["begin_ms", "end_ms", "paused", "bucket_tags"])
        .get(keys.stock())
        .cmd("TIME")
        .query_async(conn)
        .await?;
    let ((Some(begin_ms), Some(end_ms), paused, bucket_tags), Some(stock)) = (meta, stock) else {
        return Ok(None);
    };
    Ok(Some(Sale {
        begin_ms,
        end_ms,
        paused: paused.as_deref() == Some("1"),
        stock,
        now_ms: time.0 * 1000 + time.1 / 1000,
        bucket_tags,
    }))
}
