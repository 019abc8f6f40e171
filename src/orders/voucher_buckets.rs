//! How a voucher's stock is split over buckets, as MySQL records it: the
//! count an operator sets before the first preload, and the tags that
//! preload chooses (store/layout.rs turns them into keys).

use mysql_async::prelude::*;

use crate::error::{Error, Result};
use crate::orders::voucher::get;
use crate::store::db::Db;
use crate::store::layout::MAX_BUCKETS;

/// Checks a bucket count given by a person.
pub fn validate_buckets(buckets: u32) -> Result<u32> {
    if (1..=MAX_BUCKETS).contains(&buckets) {
        Ok(buckets)
    } else {
        Err(Error::InvalidInput(format!(
            "buckets {buckets} is out of range: it must be between 1 and {MAX_BUCKETS}"
        )))
    }
}

/// A voucher in buckets gives each at least the per-user limit: a bucket
/// starts with `total / buckets` units, and a share below the limit would
/// leave its users' largest requests to wait for the mover from the first
/// one on (design/buckets.md hole 5).
pub fn validate_split(voucher: u64, total: i64, buckets: u32, per_user_limit: u32) -> Result<()> {
    if buckets <= 1 {
        return Ok(());
    }
    let share = total / i64::from(buckets);
    if share >= i64::from(per_user_limit) {
        return Ok(());
    }
    let most = (total / i64::from(per_user_limit.max(1))).max(1);
    let or_limit = match share {
        0 => String::new(),
        s => format!(", or a per-user limit of {s} or less"),
    };
    Err(Error::InvalidInput(format!(
        "voucher {voucher}: {total} units in {buckets} buckets give each {share}, fewer than the per-user limit {per_user_limit}: use at most {most} bucket(s){or_limit}"
    )))
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

/// The bucket tags the first preload recorded (None before it).
pub async fn bucket_tags(db: &Db, id: u64) -> Result<Option<String>> {
    let mut conn = db.conn().await?;
    let tags: Option<String> = conn
        .exec_first(
            "SELECT bucket_tags FROM seckill_voucher WHERE voucher_id = ?",
            (id,),
        )
        .await?;
    Ok(tags.filter(|t| !t.is_empty()))
}

/// Which of `ids` are split in buckets (MySQL's word, the truth: a gate
/// that lost its meta reads as one bucket).
pub async fn split_in_buckets(db: &Db, ids: &[u64]) -> Result<std::collections::HashSet<u64>> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let mut conn = db.conn().await?;
    let split: Vec<u64> = conn
        .query(format!(
            "SELECT voucher_id FROM seckill_voucher WHERE buckets > 1 AND voucher_id IN ({})",
            crate::store::db::join_ids(ids.iter().copied())
        ))
        .await?;
    Ok(split.into_iter().collect())
}
