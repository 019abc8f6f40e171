//! How a voucher's stock is split over buckets, as MySQL records it: the
//! checks of a split, and reads of the tags preload chose (store/layout.rs
//! turns them into keys; orders/voucher.rs writes the row).

use mysql_async::prelude::*;

use crate::error::{Error, Result};
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
