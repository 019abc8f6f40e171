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
    /// A voucher split in buckets: the units in its pool (counted in
    /// `stock` too, with every bucket's), and each bucket on its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<BucketState>,
}

/// One bucket of a voucher split in buckets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BucketState {
    pub bucket: u32,
    /// Its hash tag (the content between the braces of its keys).
    pub tag: String,
    /// The master serving its keys now (None on a single node).
    pub master: Option<String>,
    pub stock: Option<i64>,
    pub buyers: u64,
    pub waitlist: u64,
    pub stream_length: u64,
}

/// The gates of `vouchers`, a voucher split in buckets summed over its
/// buckets (and its pool) with each bucket shown too.
pub async fn read_vouchers(
    conn: &mut impl RedisConn,
    prefix: &str,
    vouchers: &[u64],
) -> Result<Vec<GateState>> {
    let layouts = crate::store::layout::read_many(conn, prefix, vouchers).await?;
    let split = layouts.iter().any(|l| l.buckets() > 1);
    let slots = match split {
        true => crate::store::slot_map::SlotMap::read(conn).await?,
        false => None,
    };
    let mut keys = Vec::new();
    for layout in &layouts {
        keys.extend(layout.all_keys()?);
    }
    let mut gates = read_many(conn, &keys).await?.into_iter();
    let pools = match split {
        true => {
            pipeline_per_item(conn, &layouts, false, false, |pipe, l| {
                pipe.get(l.keys(0)?.pool());
                Ok(())
            })
            .await?
        }
        false => vec![Vec::new(); layouts.len()],
    };
    let mut out = Vec::with_capacity(layouts.len());
    for (layout, pool) in layouts.iter().zip(pools) {
        let mine: Vec<GateState> = gates.by_ref().take(layout.buckets() as usize).collect();
        if layout.buckets() == 1 {
            out.extend(mine);
            continue;
        }
        let pool = pool
            .first()
            .and_then(|v| crate::store::redis_conn::value_text(v).parse::<i64>().ok());
        out.push(sum_of_buckets(layout, mine, pool, slots.as_ref())?);
    }
    Ok(out)
}

fn sum_of_buckets(
    layout: &crate::store::layout::Layout,
    gates: Vec<GateState>,
    pool: Option<i64>,
    slots: Option<&crate::store::slot_map::SlotMap>,
) -> Result<GateState> {
    let mut sum = GateState {
        loaded: gates.iter().all(|g| g.loaded),
        stock: pool,
        pool,
        last_entry_id: gates.first().and_then(|g| g.last_entry_id.clone()),
        ..Default::default()
    };
    for (b, g) in gates.into_iter().enumerate() {
        if let Some(s) = g.stock {
            sum.stock = Some(sum.stock.unwrap_or(0) + s);
        }
        sum.buyers += g.buyers;
        sum.waitlist += g.waitlist;
        sum.stream_length += g.stream_length;
        let keys = layout.keys(b as u32)?;
        let master = slots.and_then(|m| {
            m.master_of(crate::store::slot_map::slot_of(&keys.meta()))
                .map(str::to_string)
        });
        sum.buckets.push(BucketState {
            bucket: b as u32,
            tag: layout.tag(b as u32).unwrap_or_default().to_string(),
            master,
            stock: g.stock,
            buyers: g.buyers,
            waitlist: g.waitlist,
            stream_length: g.stream_length,
        });
    }
    Ok(sum)
}

/// One round trip: meta, stock, buyers, waitlist and stream, read together.
pub async fn read(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<GateState> {
    let mut states = read_many(conn, std::slice::from_ref(keys)).await?;
    states
        .pop()
        .ok_or_else(|| Error::redis("an empty reply to the gate's pipeline"))
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
                    .map_err(|e| Error::redis(format!("gate of voucher {}: {e}", k.voucher())))?;
            Ok(GateState {
                loaded: meta_exists && stock.is_some(),
                stock,
                buyers,
                waitlist,
                stream_length,
                last_entry_id: last.ids.into_iter().next().map(|e| e.id),
                ..Default::default()
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
    /// The voucher's units (bucket 0's meta: the whole voucher's).
    pub total: i64,
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

/// The sale of a voucher, split in buckets or not: stock summed over its
/// buckets and its pool, paused if any bucket is (a round trip more per
/// bucket beyond the first).
pub async fn read_sale_of_buckets(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
) -> Result<Option<Sale>> {
    let Some(mut sale) = read_sale(conn, keys).await? else {
        return Ok(None);
    };
    let layout = crate::store::layout::Layout::from_tags(
        keys.prefix(),
        keys.voucher(),
        sale.bucket_tags.as_deref(),
    )?;
    if layout.buckets() > 1 {
        let pool: Option<i64> = redis::cmd("GET").arg(keys.pool()).query_async(conn).await?;
        sale.stock += pool.unwrap_or(0);
        for b in 1..layout.buckets() {
            let k = layout.keys(b)?;
            let (stock, paused): (Option<i64>, Option<String>) = redis::pipe()
                .get(k.stock())
                .hget(k.meta(), "paused")
                .query_async(conn)
                .await?;
            sale.stock += stock.unwrap_or(0);
            sale.paused |= paused.as_deref() == Some("1");
        }
    }
    Ok(Some(sale))
}

/// One round trip; None when the voucher is not loaded.
pub async fn read_sale(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<Option<Sale>> {
    type Row = (
        (
            Option<i64>,
            Option<i64>,
            Option<String>,
            Option<String>,
            Option<i64>,
        ),
        Option<i64>,
        (i64, i64),
    );
    let (meta, stock, time): Row = redis::pipe()
        .cmd("HMGET")
        .arg(keys.meta())
        .arg(&["begin_ms", "end_ms", "paused", "bucket_tags", "total"])
        .get(keys.stock())
        .cmd("TIME")
        .query_async(conn)
        .await?;
    let ((Some(begin_ms), Some(end_ms), paused, bucket_tags, total), Some(stock)) = (meta, stock)
    else {
        return Ok(None);
    };
    Ok(Some(Sale {
        total: total.unwrap_or(0),
        begin_ms,
        end_ms,
        paused: paused.as_deref() == Some("1"),
        stock,
        now_ms: crate::support::timespec::redis_time_ms(time),
        bucket_tags,
    }))
}
