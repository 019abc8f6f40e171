//! The SQL that counts a voucher's orders into its row (schema 5's counters
//! and digests, orders/counters.rs): one definition for the migration that
//! counts what is there and for the recount of one voucher.

use crate::support::set_digest::{sql_hash, sql_modulus};

/// The counter columns of `seckill_voucher`, in `orders::counters::Counters`' order.
pub const COLUMNS: &str = "orders_total, units_total, orders_paid, units_paid, orders_cancelled, \
     units_cancelled, users_digest, pending_digest, cancelled_digest";

/// The aggregates over `seckill_order` rows that make the counters, in
/// [`COLUMNS`]' order and named n, u, np, up, nc, uc, du, dp, dc (a status
/// this tool never writes counts as cancelled, as the full read has it).
macro_rules! recount_columns {
    () => {
        concat!(
            "COUNT(*) AS n, COALESCE(SUM(quantity), 0) AS u, ",
            "COALESCE(SUM(status = 1), 0) AS np, COALESCE(SUM(IF(status = 1, quantity, 0)), 0) AS up, ",
            "COALESCE(SUM(status NOT IN (0, 1)), 0) AS nc, ",
            "COALESCE(SUM(IF(status NOT IN (0, 1), quantity, 0)), 0) AS uc, ",
            "COALESCE(SUM(", sql_hash!("user_id"), ") % ", sql_modulus!(), ", 0) AS du, ",
            "COALESCE(SUM(IF(status = 0, ", sql_hash!("id"), ", 0)) % ", sql_modulus!(), ", 0) AS dp, ",
            "COALESCE(SUM(IF(status NOT IN (0, 1), ", sql_hash!("id"), ", 0)) % ", sql_modulus!(), ", 0) AS dc"
        )
    };
}

/// Every voucher's counters from its rows, in one statement (the schema 5
/// migration; idempotent).
pub const RECOUNT_ALL: &str = concat!(
    "UPDATE seckill_voucher v LEFT JOIN (SELECT voucher_id, ",
    recount_columns!(),
    " FROM seckill_order GROUP BY voucher_id) ",
    "AS c ON c.voucher_id = v.voucher_id ",
    "SET v.orders_total = COALESCE(c.n, 0), v.units_total = COALESCE(c.u, 0), ",
    "v.orders_paid = COALESCE(c.np, 0), v.units_paid = COALESCE(c.up, 0), ",
    "v.orders_cancelled = COALESCE(c.nc, 0), v.units_cancelled = COALESCE(c.uc, 0), ",
    "v.users_digest = COALESCE(c.du, 0), v.pending_digest = COALESCE(c.dp, 0), ",
    "v.cancelled_digest = COALESCE(c.dc, 0)"
);

/// One voucher's counters from its rows, as [`RECOUNT_ALL`] counts them.
pub const RECOUNT_ONE: &str = concat!(
    "SELECT ",
    recount_columns!(),
    " FROM seckill_order WHERE voucher_id = ?"
);
