//! A voucher split into buckets (design/buckets.md), as every part of the
//! code reads it: which bucket a user belongs to, and each bucket's keys.
//! Choosing the tags, recording them and reading them back from MySQL is
//! gate/buckets.rs's.
//!
//! Bucket 0 is the voucher's own tag `{V}`, so a voucher of one bucket has
//! the layout of a voucher before buckets. Bucket b > 0 has the tag
//! `{V.b.s}`, recorded once chosen.

use redis::aio::ConnectionLike;

use crate::error::{Error, Result};
use crate::store::keys::{is_bucket_tag, VoucherKeys};

/// The most buckets a voucher's stock may be split over: a bucket costs
/// the mover a script call per round, and past one per master a bucket
/// buys nothing.
pub const MAX_BUCKETS: u32 = 64;

/// Bucket 0's meta fields that describe the split: how many buckets, and
/// every bucket's tag in order, space-separated (bucket 0's first). Every
/// bucket's meta has `buckets` and `bucket` (its number) too: the
/// admission script routes by them (lua/preload.lua writes all three).
pub const META_BUCKETS: &str = "buckets";
pub const META_BUCKET_TAGS: &str = "bucket_tags";

/// The bucket of `user` in a voucher of `buckets` buckets: the first 8
/// bytes of the SHA-1 of the user id's decimal form, big-endian, modulo
/// `buckets`. `lua/seckill.lua` computes the same (a test holds the two
/// together) and the book gives it to application servers (docs/src/concepts/buckets.md).
pub fn bucket_of(user: u64, buckets: u32) -> u32 {
    if buckets <= 1 {
        return 0;
    }
    let digest = sha1_smol::Sha1::from(user.to_string()).digest().bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % u64::from(buckets)) as u32
}

/// One bucket's keys and (order, user) pairs of the users it holds.
pub type BucketOrders = (VoucherKeys, Vec<(u64, u64)>);

/// A voucher's buckets: each one's tag, bucket 0's (the voucher's own) first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
    voucher: u64,
    tags: Vec<String>,
}

impl Layout {
    /// A voucher of one bucket: today's layout.
    pub fn single(prefix: &str, voucher: u64) -> Layout {
        Layout {
            prefix: prefix.to_string(),
            voucher,
            tags: vec![voucher.to_string()],
        }
    }

    /// The layout `tags` (space-separated, as recorded) describe; none or
    /// empty: one bucket.
    pub fn from_tags(prefix: &str, voucher: u64, tags: Option<&str>) -> Result<Layout> {
        let tags: Vec<String> = tags
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if tags.is_empty() {
            return Ok(Layout::single(prefix, voucher));
        }
        let bad = tags.len() > MAX_BUCKETS as usize
            || tags[0] != voucher.to_string()
            || tags.iter().any(|t| !is_bucket_tag(t, voucher));
        if bad {
            return Err(Error::redis(format!(
                "voucher {voucher}'s bucket tags read {:?}: not {{V}} then up to {} bucket tags",
                tags.join(" "),
                MAX_BUCKETS - 1
            )));
        }
        Ok(Layout {
            prefix: prefix.to_string(),
            voucher,
            tags,
        })
    }

    /// The layout bucket 0's meta records (one bucket when it records none,
    /// which is also what a gate not loaded yet reads as).
    pub async fn read(
        conn: &mut impl ConnectionLike,
        prefix: &str,
        voucher: u64,
    ) -> Result<Layout> {
        Ok(Self::read_loaded(conn, prefix, voucher).await?.0)
    }

    /// The layout, and whether bucket 0's gate is loaded: until it is, a
    /// preload may yet record a split, so a reader that keeps the layout
    /// reads it again.
    pub async fn read_loaded(
        conn: &mut impl ConnectionLike,
        prefix: &str,
        voucher: u64,
    ) -> Result<(Layout, bool)> {
        let meta = VoucherKeys::new(prefix, voucher)?.meta();
        let (begin, tags): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(meta)
            .arg("begin_ms")
            .arg(META_BUCKET_TAGS)
            .query_async(conn)
            .await?;
        Ok((
            Layout::from_tags(prefix, voucher, tags.as_deref())?,
            begin.is_some(),
        ))
    }

    pub fn voucher(&self) -> u64 {
        self.voucher
    }

    pub fn buckets(&self) -> u32 {
        self.tags.len() as u32
    }

    /// The tags as recorded: space-separated, bucket 0's first.
    pub fn tags_text(&self) -> String {
        self.tags.join(" ")
    }

    pub fn tag(&self, bucket: u32) -> Option<&str> {
        self.tags.get(bucket as usize).map(String::as_str)
    }

    /// The keys of bucket `bucket`'s gate.
    pub fn keys(&self, bucket: u32) -> Result<VoucherKeys> {
        let tag = self.tag(bucket).ok_or_else(|| {
            Error::InvalidInput(format!(
                "voucher {} has {} bucket(s), no bucket {bucket}",
                self.voucher,
                self.buckets()
            ))
        })?;
        VoucherKeys::of_bucket(&self.prefix, self.voucher, tag)
    }

    /// The keys of the gate `user` belongs to.
    pub fn keys_of_user(&self, user: u64) -> Result<VoucherKeys> {
        self.keys(bucket_of(user, self.buckets()))
    }

    /// Every bucket's keys, bucket 0's first.
    pub fn all_keys(&self) -> Result<Vec<VoucherKeys>> {
        (0..self.buckets()).map(|b| self.keys(b)).collect()
    }

    /// Each bucket's keys with the `orders` ((order, user) pairs) whose
    /// users it holds, bucket 0's first.
    pub fn split_orders(&self, orders: &[(u64, u64)]) -> Result<Vec<BucketOrders>> {
        let mut per: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.buckets() as usize];
        for &(order, user) in orders {
            per[bucket_of(user, self.buckets()) as usize].push((order, user));
        }
        self.all_keys()
            .map(|keys| keys.into_iter().zip(per).collect())
    }
}

/// The layouts of `vouchers` as bucket 0's meta records them (one bucket
/// when it records none): a few round trips for all of them.
pub async fn read_many(
    conn: &mut impl crate::store::redis_conn::RedisConn,
    prefix: &str,
    vouchers: &[u64],
) -> Result<Vec<Layout>> {
    let keys = VoucherKeys::of_all(prefix, vouchers)?;
    let rows = crate::store::redis_conn::pipeline_per_item(conn, &keys, false, false, |p, k| {
        p.hget(k.meta(), META_BUCKET_TAGS);
        Ok(())
    })
    .await?;
    vouchers
        .iter()
        .zip(rows)
        .map(|(&v, row)| {
            let tags = match row.first() {
                None | Some(redis::Value::Nil) => None,
                Some(t) => Some(crate::store::redis_conn::value_text(t)),
            };
            Layout::from_tags(prefix, v, tags.as_deref())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_bucket_is_bucket_zero() {
        for user in [1, 2, 42, u64::MAX] {
            assert_eq!(bucket_of(user, 1), 0);
            assert_eq!(bucket_of(user, 0), 0);
        }
    }

    #[test]
    fn routing_is_the_documented_digest() {
        // SHA-1("1") = 356a192b7913b04c 54574d18c28d46e6395428ab: the first
        // 8 bytes are 0x356a192b7913b04c = 3848916506047131724.
        assert_eq!(bucket_of(1, 3), (3_848_916_506_047_131_724u64 % 3) as u32);
        assert_eq!(bucket_of(1, 7), (3_848_916_506_047_131_724u64 % 7) as u32);
    }

    #[test]
    fn routing_spreads_users_evenly() {
        let mut per = [0u32; 3];
        for user in 1..=30_000 {
            per[bucket_of(user, 3) as usize] += 1;
        }
        for n in per {
            assert!((9_500..=10_500).contains(&n), "{per:?}");
        }
    }

    #[test]
    fn a_layout_reads_back_as_recorded() {
        let layout = Layout::from_tags("p", 7, Some("7 7.1.4 7.2.0")).unwrap();
        assert_eq!(layout.buckets(), 3);
        assert_eq!(layout.keys(1).unwrap().stock(), "p:{7.1.4}:stock");
        assert_eq!(layout.tags_text(), "7 7.1.4 7.2.0");
        assert!(layout.keys(3).is_err());
        let user = (1..).find(|u| bucket_of(*u, 3) == 2).unwrap();
        assert_eq!(layout.keys_of_user(user).unwrap().meta(), "p:{7.2.0}:meta");
        assert_eq!(
            Layout::from_tags("p", 7, None).unwrap(),
            Layout::single("p", 7)
        );
        assert_eq!(Layout::from_tags("p", 7, Some("")).unwrap().buckets(), 1);
        for bad in ["8 8.1.0", "7.1.0 7", "7 8.1.0", "7 7.x.0"] {
            assert!(Layout::from_tags("p", 7, Some(bad)).is_err(), "{bad}");
        }
    }
}
