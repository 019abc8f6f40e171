//! Vouchers in MySQL, the source of truth: creating and reading them (their
//! policy is orders/policy.rs, their split over buckets
//! orders/voucher_buckets.rs).

use mysql_async::prelude::*;
use mysql_async::{from_value_opt, FromRowError, Row, Value};
use serde::Serialize;

use crate::error::{mysql_code, mysql_codes, Error, Result};
use crate::orders::order::OrderStatus;
use crate::orders::policy::{Policy, PolicyChange, VersionedPolicy};
use crate::orders::voucher_buckets::{validate_buckets, validate_split};
use crate::store::db::Db;

/// Ids are positive and fit a signed 64-bit integer (a Java `long`, a MySQL `BIGINT`).
pub const MAX_ID: u64 = i64::MAX as u64;
pub const MAX_STOCK: i64 = i32::MAX as i64;
pub const DEFAULT_PAY_TIMEOUT_MS: i64 = 15 * 60 * 1000;
/// 2038-01-19T03:14:07Z: FROM_UNIXTIME's limit on MariaDB 10.11.
pub const MAX_TIME_MS: i64 = i32::MAX as i64 * 1000;

pub use crate::store::layout::MAX_BUCKETS;

#[derive(Debug, Clone)]
pub struct NewVoucher {
    pub id: u64,
    pub title: String,
    pub stock: i64,
    pub begin_ms: i64,
    pub end_ms: i64,
    pub pay_timeout_ms: i64,
    pub policy: Policy,
    /// Gates the stock is split over (gate/buckets.rs), 1 for one gate.
    pub buckets: u32,
}

impl NewVoucher {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidInput(m));
        validate_id("voucher id", self.id)?;
        if !(0..=MAX_STOCK).contains(&self.stock) {
            return bad(format!(
                "stock {} is out of range: it must be between 0 and {MAX_STOCK}",
                self.stock
            ));
        }
        if self.begin_ms >= self.end_ms {
            return bad(format!(
                "the sale begins ({}) at or after it ends ({}): begin must be before end",
                crate::support::timespec::format_ms(self.begin_ms),
                crate::support::timespec::format_ms(self.end_ms)
            ));
        }
        if self.begin_ms < 0 {
            return bad("the sale cannot begin before 1970".into());
        }
        if self.end_ms > MAX_TIME_MS {
            return bad(format!(
                "the sale ends after {}, the last time MySQL's FROM_UNIXTIME can store",
                crate::support::timespec::format_ms(MAX_TIME_MS)
            ));
        }
        if !(1_000..=7 * 24 * 3_600_000).contains(&self.pay_timeout_ms) {
            return bad(format!(
                "pay timeout {} is out of range: it must be between 1s and 7days",
                crate::support::timespec::format_duration_ms(self.pay_timeout_ms)
            ));
        }
        if self.title.chars().count() > 255 {
            return bad("title is longer than 255 characters".into());
        }
        validate_buckets(self.buckets)?;
        self.policy.validate()?;
        validate_split(
            self.id,
            self.stock,
            self.buckets,
            self.policy.per_user_limit,
        )
    }
}

/// Ids of vouchers, users and orders: 1 ..= 9223372036854775807.
pub fn validate_id(what: &str, id: u64) -> Result<()> {
    if id == 0 || id > MAX_ID {
        return Err(Error::InvalidInput(format!(
            "{what} {id} is out of range: it must be between 1 and {MAX_ID}"
        )));
    }
    Ok(())
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Voucher {
    pub id: u64,
    pub title: String,
    pub total_stock: i64,
    pub stock: i64,
    pub begin_ms: i64,
    pub end_ms: i64,
    pub pay_timeout_ms: i64,
    #[serde(flatten)]
    pub policy: Policy,
    /// Raised by every change of the policy (see [`VersionedPolicy`]).
    pub policy_version: u64,
    pub orders_pending: i64,
    pub orders_paid: i64,
    pub orders_cancelled: i64,
    /// Gates the stock is split over (1: one gate).
    pub buckets: u32,
    /// Each bucket's hash tag, space-separated, once the first preload
    /// chose them ('' before).
    pub bucket_tags: String,
}

impl Voucher {
    pub fn versioned_policy(&self) -> VersionedPolicy {
        VersionedPolicy {
            policy: self.policy,
            version: self.policy_version,
        }
    }

    /// `upcoming`, `live` or `ended` at `now_ms` (the words tables and JSON show).
    pub fn sale_state(&self, now_ms: i64) -> &'static str {
        if now_ms < self.begin_ms {
            "upcoming"
        } else if now_ms < self.end_ms {
            "live"
        } else {
            "ended"
        }
    }
}

pub async fn add(db: &Db, v: &NewVoucher) -> Result<()> {
    v.validate()?;
    let mut conn = db.conn().await?;
    let result = conn
        .exec_drop(
            "INSERT INTO seckill_voucher
                (voucher_id, title, total_stock, stock, begin_time, end_time, pay_timeout_ms,
                 user_rate, require_token, per_user_limit, waitlist_limit, buckets)
             VALUES (?, ?, ?, ?, FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000), ?, ?, ?, ?, ?, ?)",
            (
                v.id,
                &v.title,
                v.stock,
                v.stock,
                v.begin_ms,
                v.end_ms,
                v.pay_timeout_ms,
                v.policy.user_rate,
                v.policy.require_token,
                v.policy.per_user_limit,
                v.policy.waitlist_limit,
                v.buckets,
            ),
        )
        .await;
    match result {
        Err(e) if mysql_code(&e) == Some(mysql_codes::DUP_ENTRY) => Err(Error::VoucherExists(v.id)),
        other => Ok(other?),
    }
}

/// The order counts come from the counters (orders/counters.rs): one row
/// per voucher, however many orders it has.
const SELECT_VOUCHERS: &str = "SELECT v.voucher_id, v.title, v.total_stock, v.stock,
            CAST(ROUND(UNIX_TIMESTAMP(v.begin_time) * 1000) AS SIGNED),
            CAST(ROUND(UNIX_TIMESTAMP(v.end_time) * 1000) AS SIGNED),
            v.pay_timeout_ms, v.user_rate, v.require_token, v.per_user_limit,
            v.waitlist_limit, v.policy_version,
            v.orders_total - v.orders_paid - v.orders_cancelled, v.orders_paid, v.orders_cancelled,
            v.buckets, v.bucket_tags
         FROM seckill_voucher v";

/// The voucher query, with what follows its FROM clause.
fn select_vouchers(tail: &str) -> String {
    format!("{SELECT_VOUCHERS} {tail}")
}

/// A row of [`SELECT_VOUCHERS`]: seventeen columns, more than
/// mysql_common converts as a tuple.
struct VoucherRow(Voucher);

impl FromRow for VoucherRow {
    fn from_row_opt(row: Row) -> std::result::Result<Self, FromRowError> {
        fn take<T: FromValue>(v: &mut impl Iterator<Item = Option<Value>>) -> Option<T> {
            from_value_opt(v.next()??).ok()
        }
        let mut v = row.clone().unwrap_raw().into_iter();
        let v = &mut v;
        // The policy columns are read as plain integers: a value another
        // tool wrote out of range must not fail every read of the table.
        let voucher = (|| {
            Some(Voucher {
                id: take(v)?,
                title: take(v)?,
                total_stock: take(v)?,
                stock: take(v)?,
                begin_ms: take(v)?,
                end_ms: take(v)?,
                pay_timeout_ms: take(v)?,
                policy: Policy::from_columns(take(v)?, take(v)?, take(v)?, take(v)?),
                policy_version: take(v)?,
                orders_pending: take(v)?,
                orders_paid: take(v)?,
                orders_cancelled: take(v)?,
                buckets: take::<i64>(v)?.clamp(1, i64::from(MAX_BUCKETS)) as u32,
                bucket_tags: take(v)?,
            })
        })();
        match (voucher, v.next()) {
            (Some(voucher), None) => Ok(VoucherRow(voucher)),
            _ => Err(FromRowError(row)),
        }
    }
}

fn from_row(r: VoucherRow) -> Voucher {
    r.0
}

pub async fn list(db: &Db) -> Result<Vec<Voucher>> {
    let mut conn = db.conn().await?;
    let rows: Vec<VoucherRow> = conn.query(select_vouchers("ORDER BY v.voucher_id")).await?;
    Ok(rows.into_iter().map(from_row).collect())
}

/// Every voucher, or only those in `only` (each of which must exist).
pub async fn list_only(db: &Db, only: &[u64]) -> Result<Vec<Voucher>> {
    let mut vouchers = list(db).await?;
    if only.is_empty() {
        return Ok(vouchers);
    }
    if let Some(missing) = only
        .iter()
        .find(|id| !vouchers.iter().any(|v| v.id == **id))
    {
        return Err(Error::VoucherNotFound(*missing));
    }
    vouchers.retain(|v| only.contains(&v.id));
    Ok(vouchers)
}

pub async fn get(db: &Db, id: u64) -> Result<Voucher> {
    let mut conn = db.conn().await?;
    let row: Option<VoucherRow> = conn
        .exec_first(select_vouchers("WHERE v.voucher_id = ?"), (id,))
        .await?;
    row.map(from_row).ok_or(Error::VoucherNotFound(id))
}

/// How a read of the voucher row takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowRead {
    /// A plain read.
    Plain,
    /// `FOR UPDATE`: locks the row for the rest of the caller's transaction
    /// and opens no read view.
    Locking,
}

/// The voucher's payment timeout (None: MySQL does not know the voucher),
/// on a connection or inside a caller's transaction.
pub async fn pay_timeout_ms(
    conn: &mut impl Queryable,
    voucher: u64,
    read: RowRead,
) -> Result<Option<i64>, mysql_async::Error> {
    let lock = match read {
        RowRead::Plain => "",
        RowRead::Locking => " FOR UPDATE",
    };
    conn.exec_first(
        format!("SELECT pay_timeout_ms FROM seckill_voucher WHERE voucher_id = ?{lock}"),
        (voucher,),
    )
    .await
}

/// An order as the gate needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderDigest {
    pub id: u64,
    pub user: u64,
    /// None for a status value this tool never writes.
    pub status: Option<OrderStatus>,
    pub created_ms: i64,
    /// A pending order held for the operator (schema 7): no deadline.
    pub held: bool,
}

/// The voucher and its orders, read in one consistent snapshot (a worker
/// committing in between cannot show the stock from before and the orders
/// from after). One order per user ever (the UNIQUE key), so every user
/// here stays a buyer at the gate, whatever the status.
pub async fn get_with_orders(db: &Db, id: u64) -> Result<(Voucher, Vec<OrderDigest>)> {
    let mut conn = db.conn().await?;
    let mut tx = conn
        .start_transaction(crate::store::db::snapshot_tx())
        .await?;
    let row: Option<VoucherRow> = tx
        .exec_first(select_vouchers("WHERE v.voucher_id = ?"), (id,))
        .await?;
    let voucher = row.map(from_row).ok_or(Error::VoucherNotFound(id))?;
    crate::support::fault::point("between_snapshot_reads").await?;
    let rows: Vec<(u64, u64, i8, i64, i8)> = tx
        .exec(
            "SELECT id, user_id, status, CAST(ROUND(UNIX_TIMESTAMP(create_time) * 1000) AS SIGNED), held
               FROM seckill_order WHERE voucher_id = ?",
            (id,),
        )
        .await?;
    tx.commit().await?;
    let orders = rows
        .into_iter()
        .map(|(id, user, status, created_ms, held)| OrderDigest {
            id,
            user,
            status: OrderStatus::from_code(status),
            created_ms,
            held: held == 1,
        })
        .collect();
    Ok((voucher, orders))
}

/// Sets how many buckets the voucher's stock is split over, while it has
/// no order and no bucket tags (no preload laid it out yet).
pub async fn set_buckets(db: &Db, id: u64, buckets: u32) -> Result<()> {
    validate_buckets(buckets)?;
    let mut conn = db.conn().await?;
    // The split is checked against the limit in the same statement: a
    // limit raised meanwhile is not split around.
    conn.exec_drop(
        "UPDATE seckill_voucher SET buckets = ?
         WHERE voucher_id = ? AND orders_total = 0 AND bucket_tags = ''
           AND (? = 1 OR total_stock DIV ? >= per_user_limit)",
        (buckets, id, buckets, buckets),
    )
    .await?;
    if conn.affected_rows() == 1 {
        return Ok(());
    }
    drop(conn);
    let v = get(db, id).await?;
    if v.buckets == buckets {
        return Ok(());
    }
    validate_split(id, v.total_stock, buckets, v.policy.per_user_limit)?;
    Err(Error::InvalidInput(format!(
        "voucher {id} cannot change its buckets ({} now): it has been preloaded or has orders, and users who hold or wait for units must stay in their bucket",
        v.buckets
    )))
}

/// Records the bucket tags the first preload chose, unless another
/// preload recorded some first or the split changed since `buckets` was
/// read. Returns the tags MySQL holds now.
pub async fn record_bucket_tags(db: &Db, id: u64, buckets: u32, tags: &str) -> Result<String> {
    let mut conn = db.conn().await?;
    conn.exec_drop(
        "UPDATE seckill_voucher SET bucket_tags = ?
         WHERE voucher_id = ? AND buckets = ? AND bucket_tags = ''",
        (tags, id, buckets),
    )
    .await?;
    drop(conn);
    let v = get(db, id).await?;
    if v.buckets != buckets {
        return Err(Error::Busy(id));
    }
    Ok(v.bucket_tags)
}

/// Changes the admission policy in MySQL; what is not given stays. Returns
/// the policy now in force, with its version (a later update's, if one
/// came in between: the pair is read from one row).
pub async fn update_policy(db: &Db, id: u64, change: PolicyChange) -> Result<VersionedPolicy> {
    Policy {
        user_rate: change.user_rate.unwrap_or(0),
        per_user_limit: change.per_user_limit.unwrap_or(1),
        waitlist_limit: change.waitlist_limit.flatten(),
        ..Policy::default()
    }
    .validate()?;
    let mut conn = db.conn().await?;
    // Only what was given, in one statement: two updates at once (one of
    // the rate, one of tokens) both take effect. The version is raised in
    // the same statement, under the row lock, so versions follow the order
    // in which the updates took effect.
    conn.exec_drop(
        "UPDATE seckill_voucher
            SET user_rate = COALESCE(?, user_rate), require_token = COALESCE(?, require_token),
                per_user_limit = COALESCE(?, per_user_limit),
                waitlist_limit = IF(?, ?, waitlist_limit),
                policy_version = policy_version + 1
          WHERE voucher_id = ?
            AND (? IS NULL OR buckets = 1 OR total_stock DIV buckets >= ?)",
        (
            change.user_rate,
            change.require_token,
            change.per_user_limit,
            change.waitlist_limit.is_some(),
            change.waitlist_limit.flatten(),
            id,
            change.per_user_limit,
            change.per_user_limit,
        ),
    )
    .await?;
    let changed = conn.affected_rows() == 1;
    drop(conn);
    let v = get(db, id).await?;
    if !changed {
        // The row is there: the new limit is above its buckets' share.
        let limit = change.per_user_limit.unwrap_or(v.policy.per_user_limit);
        validate_split(id, v.total_stock, v.buckets, limit)?;
        // Or it was not, and the split changed since.
        return Err(Error::InvalidInput(format!(
            "voucher {id}: its buckets changed while its policy was updated; nothing changed, try again"
        )));
    }
    Ok(v.versioned_policy())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok_voucher() -> NewVoucher {
        NewVoucher {
            id: 1,
            title: "t".into(),
            stock: 100,
            begin_ms: 1_000,
            end_ms: 2_000,
            pay_timeout_ms: DEFAULT_PAY_TIMEOUT_MS,
            policy: Policy::default(),
            buckets: 1,
        }
    }

    #[test]
    fn validation_names_the_problem() {
        assert!(ok_voucher().validate().is_ok());
        let cases: Vec<(NewVoucher, &str)> = vec![
            (
                NewVoucher {
                    id: 0,
                    ..ok_voucher()
                },
                "voucher id 0",
            ),
            (
                NewVoucher {
                    stock: -1,
                    ..ok_voucher()
                },
                "stock -1",
            ),
            (
                NewVoucher {
                    begin_ms: 2_000,
                    ..ok_voucher()
                },
                "begin must be before end",
            ),
            (
                NewVoucher {
                    pay_timeout_ms: 10,
                    ..ok_voucher()
                },
                "pay timeout",
            ),
            (
                NewVoucher {
                    id: MAX_ID + 1,
                    ..ok_voucher()
                },
                "out of range",
            ),
        ];
        for (v, needle) in cases {
            let e = v.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{e:?} lacks {needle:?}");
        }
    }
}
