//! `seckill status`: one row per voucher, both stores side by side, read in
//! batches (a pipeline per chunk of vouchers or, on a cluster, per voucher; one MySQL query).

use redis::{FromRedisValue, Value};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::gate::pause::{META_PAUSED, META_PAUSED_REASON};
use crate::gate::policy::{Rejections, META_REJECTED_BAD_TOKEN, META_REJECTED_RATE_LIMITED};
use crate::orders::voucher::{self, Voucher};
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::{pipeline_per_item, RedisConn};
use crate::stream::backlog::backlog;

#[derive(Debug, Clone, Serialize)]
pub struct VoucherStatus {
    #[serde(flatten)]
    pub voucher: Voucher,
    pub gate_loaded: bool,
    pub redis_stock: Option<i64>,
    /// Entries not yet delivered to the worker group.
    pub undelivered: u64,
    /// Entries delivered but not acknowledged.
    pub pending: u64,
    pub dead_letters: u64,
    pub waitlist: u64,
    /// The earliest payment deadline still scheduled (Unix ms).
    pub next_deadline_ms: Option<i64>,
    /// Failed passes of the worker over this voucher's deadlines (it
    /// retries; a growing number needs a look, see the worker's log).
    pub deadline_errors: u64,
    /// Why the deadlines could not be read, when they could not.
    pub deadline_read_error: Option<String>,
    /// Attempts the admission policy turned away, per reason.
    pub rejected: Rejections,
    /// The gate admits nobody while a worker rebuilds it (Redis lost writes)
    /// or MySQL's lost orders are restored.
    pub paused: bool,
    /// Why it is paused (**new**): `redis_lost_writes`, `mysql_lost_commits`,
    /// or null (not paused, or paused by a release that did not say).
    pub paused_reason: Option<String>,
}

type GateRow = (bool, Option<i64>, u64, u64, u64, Option<u64>);

impl VoucherStatus {
    pub fn in_flight(&self) -> u64 {
        self.undelivered + self.pending
    }

    /// This status and another bucket's of the same voucher, summed.
    fn with_bucket(mut self, b: VoucherStatus) -> VoucherStatus {
        self.gate_loaded &= b.gate_loaded;
        self.redis_stock = match (self.redis_stock, b.redis_stock) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.undelivered += b.undelivered;
        self.pending += b.pending;
        self.dead_letters += b.dead_letters;
        self.waitlist += b.waitlist;
        self.next_deadline_ms = match (self.next_deadline_ms, b.next_deadline_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.deadline_errors += b.deadline_errors;
        self.deadline_read_error = self.deadline_read_error.or(b.deadline_read_error);
        self.rejected.rate_limited += b.rejected.rate_limited;
        self.rejected.bad_token += b.rejected.bad_token;
        self.paused |= b.paused;
        self.paused_reason = self.paused_reason.or(b.paused_reason);
        self
    }
}

/// One gate's row of the status pipeline.
async fn gate_status(
    conn: &mut impl RedisConn,
    v: &Voucher,
    k: &VoucherKeys,
    row: &[Value],
) -> Result<VoucherStatus> {
    if row.len() != 12 {
        return Err(Error::redis(format!(
            "gate of voucher {}: {} replies",
            v.id,
            row.len()
        )));
    }
    let (meta, stock, dead, waitlist, stream_len, deadline_errors): GateRow =
        FromRedisValue::from_redis_value(Value::Array(row[..6].to_vec()))
            .map_err(|e| Error::redis(format!("gate of voucher {}: {e}", v.id)))?;
    let (rate_limited, bad_token): (Option<u64>, Option<u64>) =
        FromRedisValue::from_redis_value(Value::Array(row[6..8].to_vec()))
            .map_err(|e| Error::redis(format!("gate of voucher {}: {e}", v.id)))?;
    let (first, deadline_read_error) = match <Vec<(String, f64)>>::from_redis_value(row[8].clone())
    {
        Ok(first) => (first, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let paused = matches!(&row[9], Value::BulkString(b) if b.as_slice() == b"1");
    let paused_reason = match &row[11] {
        Value::BulkString(b) if paused => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    // Only streams with entries need the group's view.
    let b = if stream_len > 0 {
        backlog(conn, k).await?
    } else {
        Default::default()
    };
    Ok(VoucherStatus {
        voucher: v.clone(),
        gate_loaded: meta && stock.is_some(),
        redis_stock: stock,
        undelivered: b.undelivered,
        pending: b.pending,
        dead_letters: dead,
        waitlist,
        next_deadline_ms: first.first().map(|(_, at)| *at as i64),
        deadline_errors: deadline_errors.unwrap_or(0),
        deadline_read_error,
        rejected: Rejections::from_meta(rate_limited, bad_token),
        paused,
        paused_reason,
    })
}

/// Every voucher in MySQL (or only `only`), with its gate.
pub async fn read(
    db: &Db,
    conn: &mut impl RedisConn,
    prefix: &str,
    only: &[u64],
) -> Result<Vec<VoucherStatus>> {
    let vouchers = voucher::list_only(db, only).await?;
    let ids: Vec<u64> = vouchers.iter().map(|v| v.id).collect();
    // Every gate: one per voucher, or one per bucket of a voucher split in
    // buckets (its rows summed below, its pool counted in its stock).
    let layouts = crate::store::layout::read_many(conn, prefix, &ids).await?;
    let mut keys: Vec<VoucherKeys> = Vec::new();
    for layout in &layouts {
        keys.extend(layout.all_keys()?);
    }
    // A broken deadlines key (say, of the wrong type) must show up in its
    // row, not fail the whole report: errors stay in the replies.
    let rows = pipeline_per_item(conn, &keys, false, true, |pipe, k| {
        pipe.exists(k.meta())
            .get(k.stock())
            .xlen(k.dead())
            .zcard(k.waitlist())
            .xlen(k.orders())
            .get(k.deadline_errors())
            .hget(k.meta(), META_REJECTED_RATE_LIMITED)
            .hget(k.meta(), META_REJECTED_BAD_TOKEN)
            .zrange_withscores(k.timeouts(), 0, 0)
            .hget(k.meta(), META_PAUSED)
            .get(k.pool())
            .hget(k.meta(), META_PAUSED_REASON);
        Ok(())
    })
    .await?;
    let mut gates = keys.iter().zip(&rows);
    let mut out = Vec::with_capacity(vouchers.len());
    for (v, layout) in vouchers.iter().zip(&layouts) {
        let mut status: Option<VoucherStatus> = None;
        for (bucket, (k, row)) in gates.by_ref().take(layout.buckets() as usize).enumerate() {
            let mut gate = gate_status(conn, v, k, row).await?;
            if bucket == 0 && layout.buckets() > 1 {
                // The pool: units of the voucher given to no bucket yet.
                let pool: Option<i64> = FromRedisValue::from_redis_value(row[10].clone())
                    .map_err(|e| Error::redis(format!("pool of voucher {}: {e}", v.id)))?;
                gate.redis_stock = gate.redis_stock.map(|s| s + pool.unwrap_or(0));
            }
            status = Some(match status {
                None => gate,
                Some(sum) => sum.with_bucket(gate),
            });
        }
        out.extend(status);
    }
    Ok(out)
}
