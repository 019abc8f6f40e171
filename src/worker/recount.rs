//! Units a bucket's rebuild held back, given back by the guard that rebuilt
//! it.
//!
//! The guard rebuilds one bucket of a voucher while the others sell on
//! (reconcile/buckets.rs): a unit sold at another bucket and persisted
//! between the rebuild's read of Redis and its read of MySQL counts twice,
//! so the rebuilt bucket's share comes out low, never high. The units so
//! held back are at no gate: without more, only an operator's `seckill
//! reconcile` gave them back (108 of 1,500 in a sale beside a CPU hog).
//!
//! So a rebuild of a bucket leaves the voucher owed one exact count:
//! reconcile's pass over every bucket, its mover held, which needs them all
//! still across its read. A sale in full swing never is, and reading every
//! bucket in full each pass would cost it, so the count waits for a pass
//! that finds each bucket's witness as the pass before left it. A sale gets
//! there once its gates have sold what they hold, which is when the units
//! held back are wanted. The debt lives in the guard's memory: a worker
//! that stops first leaves them to `seckill reconcile` (cron).

use std::collections::HashMap;

use crate::error::Result;
use crate::gate::witness::{self, Witness};
use crate::reconcile::{self, Drift, Outcome};
use crate::store::db::Db;
use crate::store::layout::Layout;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::RedisConn;

/// The vouchers owed a count, each with its buckets' witnesses as the last
/// pass saw them (None: not looked at since it was owed).
#[derive(Default)]
pub struct Recounts {
    owed: HashMap<u64, Option<Vec<Witness>>>,
}

/// What a look at an owed voucher came to.
#[derive(Debug)]
pub enum Counted {
    /// Its buckets moved since the last look (or this was the first):
    /// still owed.
    Moving,
    /// Counted; the drift the count repaired (empty: nothing was off).
    Done(Vec<Drift>),
    /// The count found it moving or held after all: still owed.
    Busy,
}

impl Recounts {
    /// `voucher` is owed a count (again: a later rebuild may hold back
    /// more).
    pub fn owe(&mut self, voucher: u64) {
        self.owed.insert(voucher, None);
    }

    pub fn owed(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.owed.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Looks at an owed voucher, and counts it if its buckets are as the
    /// last look left them.
    pub async fn look(
        &mut self,
        db: &Db,
        conn: &mut impl RedisConn,
        layout: &Layout,
        ids: &OrderIds,
        opts: &reconcile::Options,
    ) -> Result<Counted> {
        let voucher = layout.voucher();
        let keys = layout.all_keys()?;
        let now = witness::read_many(conn, &keys).await?;
        let Some(last) = self.owed.get_mut(&voucher) else {
            return Ok(Counted::Done(Vec::new()));
        };
        if last.as_ref() != Some(&now) {
            *last = Some(now);
            return Ok(Counted::Moving);
        }
        let prefix = keys[0].prefix().to_string();
        let mut run = reconcile::Run::new(db, conn, &prefix, true).with_order_ids(ids);
        let reports = run.pass(&[voucher], opts, |_| {}).await?;
        let settled = reports.iter().all(|r| {
            !matches!(
                r.outcome,
                Outcome::Busy | Outcome::Held | Outcome::WouldRepair
            )
        });
        if !settled {
            // Look for stillness again from here.
            self.owed.insert(voucher, None);
            return Ok(Counted::Busy);
        }
        self.owed.remove(&voucher);
        Ok(Counted::Done(
            reports.into_iter().flat_map(|r| r.drifts).collect(),
        ))
    }
}
