//! Stock buckets (design/buckets.md): one voucher's gate split over N hash
//! tags, so one voucher sells on N masters. This module lays a voucher out:
//! it chooses each bucket's tag so the buckets land on different masters
//! and records it in MySQL (the routing and the keys are store/layout.rs's).
//! The tag is recorded, not recomputed: a reshard later moves slots, never a
//! bucket's keys.

use redis::aio::ConnectionLike;

use crate::error::{Error, Result};
use crate::store::db::Db;
use crate::store::keys::{bucket_tag as tag, VoucherKeys};
pub use crate::store::layout::{bucket_of, Layout, MAX_BUCKETS, META_BUCKETS, META_BUCKET_TAGS};
use crate::store::slot_map::{slot_of, SlotMap};

/// How many salts the choice tries per bucket before it settles for a
/// master that serves a bucket already (16384 slots: a master serving a
/// third of them is found in a handful of tries).
const SALT_TRIES: u32 = 10_000;

/// `voucher update --buckets`: sets the split in MySQL while no gate of the
/// voucher is loaded and it has no order (after that, re-routing users who
/// hold or wait for units would let them buy twice).
pub async fn split(
    db: &Db,
    conn: &mut impl ConnectionLike,
    prefix: &str,
    voucher: u64,
    buckets: u32,
) -> Result<()> {
    crate::orders::voucher_buckets::validate_buckets(buckets)?;
    let (layout, loaded) = Layout::read_loaded(conn, prefix, voucher).await?;
    if loaded && layout.buckets() != buckets {
        return Err(Error::InvalidInput(format!(
            "voucher {voucher} is loaded at the gate in {} bucket(s): its buckets cannot change now (users who hold or wait for units must stay in their bucket)",
            layout.buckets()
        )));
    }
    crate::orders::voucher::set_buckets(db, voucher, buckets).await
}

/// The voucher's layout as MySQL records it, choosing and recording its
/// tags first if no preload did yet (for one bucket too: recorded tags
/// mark a voucher whose split may not change any more).
pub async fn lay_out(
    db: &Db,
    conn: &mut impl crate::store::redis_conn::RedisConn,
    prefix: &str,
    voucher: u64,
) -> Result<Layout> {
    let v = crate::orders::voucher::get(db, voucher).await?;
    let tags = match v.bucket_tags.is_empty() {
        false => v.bucket_tags,
        true => {
            let slots = SlotMap::read(conn).await?;
            let chosen = choose_tags(voucher, v.buckets, slots.as_ref()).join(" ");
            crate::orders::voucher::record_bucket_tags(db, voucher, v.buckets, &chosen).await?
        }
    };
    let layout = Layout::from_tags(prefix, voucher, Some(&tags))?;
    if layout.buckets() != v.buckets {
        return Err(Error::mysql(format!(
            "voucher {voucher} has {} buckets but {} bucket tags recorded ({tags:?})",
            v.buckets,
            layout.buckets()
        )));
    }
    Ok(layout)
}

/// The layout as [`Layout::read_loaded`] reads it, and when bucket 0's gate
/// is not loaded (not yet, or Redis lost it), the tags MySQL recorded: they
/// are final once recorded, so a worker keeps reading every bucket of a
/// voucher whose bucket 0 is gone. The flag: whether the layout is final.
pub async fn read_settled(
    conn: &mut impl ConnectionLike,
    db: &Db,
    prefix: &str,
    voucher: u64,
) -> Result<(Layout, bool)> {
    let (layout, loaded) = Layout::read_loaded(conn, prefix, voucher).await?;
    if loaded {
        return Ok((layout, true));
    }
    match recorded(db, prefix, voucher).await? {
        Some(recorded) => Ok((recorded, true)),
        None => Ok((layout, false)),
    }
}

/// The layout a voucher's buyers are routed by (buy, bench, serve, token
/// issue, voucher update): bucket 0's, or while bucket 0's gate is not
/// loaded (not yet, or Redis lost it while the other buckets sell on) the
/// tags MySQL recorded at the first preload, which are final. `mysql` is
/// asked only then; when it cannot answer, bucket 0's word stands (one
/// gate: a voucher not loaded is answered "unknown voucher" as before).
pub async fn for_routing(
    conn: &mut impl ConnectionLike,
    prefix: &str,
    voucher: u64,
    mysql: impl AsyncFnOnce() -> Result<Db>,
) -> Result<Layout> {
    let (layout, loaded) = Layout::read_loaded(conn, prefix, voucher).await?;
    if loaded {
        return Ok(layout);
    }
    let looked = match mysql().await {
        Ok(db) => recorded(&db, prefix, voucher).await,
        Err(e) => Err(e),
    };
    match looked {
        Ok(Some(recorded)) => Ok(recorded),
        Ok(None) => Ok(layout),
        Err(e) => {
            tracing::debug!(
                "voucher {voucher}: bucket 0 is not loaded and MySQL's split could not be read ({e}); routing to bucket 0"
            );
            Ok(layout)
        }
    }
}

/// The layout MySQL recorded at the first preload (None before it): final
/// once recorded, and the word to trust when Redis may have lost bucket 0's
/// meta (the gate guard, reconcile).
pub async fn recorded(db: &Db, prefix: &str, voucher: u64) -> Result<Option<Layout>> {
    match crate::orders::voucher_buckets::bucket_tags(db, voucher).await? {
        Some(tags) => Ok(Some(Layout::from_tags(prefix, voucher, Some(&tags))?)),
        None => Ok(None),
    }
}

/// The layouts of vouchers whose split is final (bucket 0 loaded, or the
/// tags recorded in MySQL), read once; the others are read again each time.
#[derive(Debug, Default)]
pub struct Layouts {
    settled: std::collections::HashMap<u64, Layout>,
}

impl Layouts {
    pub async fn of(
        &mut self,
        conn: &mut impl ConnectionLike,
        db: &Db,
        prefix: &str,
        voucher: u64,
    ) -> Result<Layout> {
        if let Some(layout) = self.settled.get(&voucher) {
            return Ok(layout.clone());
        }
        let (layout, settled) = read_settled(conn, db, prefix, voucher).await?;
        if settled {
            self.settled.insert(voucher, layout.clone());
        }
        Ok(layout)
    }

    /// Every gate of `vouchers`, each voucher's buckets in order.
    pub async fn gates(
        &mut self,
        conn: &mut impl ConnectionLike,
        db: &Db,
        prefix: &str,
        vouchers: &[u64],
    ) -> Result<Vec<VoucherKeys>> {
        let mut gates = Vec::with_capacity(vouchers.len());
        for &v in vouchers {
            gates.extend(self.of(conn, db, prefix, v).await?.all_keys()?);
        }
        Ok(gates)
    }
}

/// One tag per bucket, bucket 0 first: each bucket on a master no earlier
/// bucket is on while there are masters to spare, then on the master
/// serving the fewest buckets. Without a slot map (a single node) every
/// salt is 0.
pub fn choose_tags(voucher: u64, buckets: u32, slots: Option<&SlotMap>) -> Vec<String> {
    let Some(slots) = slots else {
        return (0..buckets).map(|b| tag(voucher, b, 0)).collect();
    };
    let master = |t: &str| {
        slots
            .master_of(slot_of(&format!("{{{t}}}")))
            .map(str::to_string)
    };
    let first = tag(voucher, 0, 0);
    let mut taken: Vec<Option<String>> = vec![master(&first)];
    let mut tags = vec![first];
    for bucket in 1..buckets {
        let uses = |m: &Option<String>| taken.iter().filter(|t| *t == m).count();
        let fewest = slots
            .masters()
            .iter()
            .map(|m| uses(&Some(m.to_string())))
            .min()
            .unwrap_or(0);
        let chosen = (0..SALT_TRIES)
            .map(|salt| tag(voucher, bucket, salt))
            .find(|t| {
                let m = master(t);
                m.is_some() && uses(&m) == fewest
            })
            .unwrap_or_else(|| tag(voucher, bucket, 0));
        taken.push(master(&chosen));
        tags.push(chosen);
    }
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_node_takes_salt_zero() {
        assert_eq!(choose_tags(7, 3, None), vec!["7", "7.1.0", "7.2.0"]);
    }
}
