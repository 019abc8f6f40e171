//! MySQL's voucher rows as reconcile reads them, inside the caller's
//! snapshot transaction: the sale, the policy and the order counters.

use std::collections::HashMap;

use mysql_async::prelude::*;

use crate::error::Result;
use crate::orders::counters::Counters;
use crate::orders::policy::Policy;
use crate::store::counter_sql::COLUMNS;

#[derive(Debug, Clone, Default)]
pub struct VoucherRow {
    pub total: i64,
    pub stock: i64,
    pub begin_ms: i64,
    pub end_ms: i64,
    pub pay_timeout_ms: i64,
    pub policy: Policy,
    pub counters: Counters,
}

/// The rows of the vouchers in `list` (ids, comma-separated) that MySQL has.
pub async fn read(tx: &mut impl Queryable, list: &str) -> Result<HashMap<u64, VoucherRow>> {
    type Sale = (u64, i64, i64, i64, i64, i64, i64, i64, i64, Option<i64>);
    let sales: Vec<Sale> = tx
        .query(format!(
            "SELECT voucher_id, total_stock, stock,
                    CAST(ROUND(UNIX_TIMESTAMP(begin_time) * 1000) AS SIGNED),
                    CAST(ROUND(UNIX_TIMESTAMP(end_time) * 1000) AS SIGNED),
                    pay_timeout_ms, user_rate, require_token, per_user_limit, waitlist_limit
               FROM seckill_voucher WHERE voucher_id IN ({list})"
        ))
        .await?;
    // Ten more columns: past what mysql_common converts as one tuple.
    type Counted = (u64, u64, u64, u64, u64, u64, u64, u64, u64, u64);
    let counted: Vec<Counted> = tx
        .query(format!(
            "SELECT voucher_id, {COLUMNS} FROM seckill_voucher WHERE voucher_id IN ({list})"
        ))
        .await?;
    let mut out: HashMap<u64, VoucherRow> = sales
        .into_iter()
        .map(
            |(v, total, stock, begin_ms, end_ms, pay_timeout_ms, rate, token, limit, cap)| {
                let row = VoucherRow {
                    total,
                    stock,
                    begin_ms,
                    end_ms,
                    pay_timeout_ms,
                    policy: Policy::from_columns(rate, token, limit, cap),
                    counters: Counters::default(),
                };
                (v, row)
            },
        )
        .collect();
    for (v, a, b, c, d, e, f, g, h, k) in counted {
        if let Some(row) = out.get_mut(&v) {
            row.counters = Counters::from_row((a, b, c, d, e, f, g, h, k));
        }
    }
    // Where a test stops between the rows and the rest of the snapshot.
    crate::support::fault::point("between_snapshot_reads").await?;
    Ok(out)
}
