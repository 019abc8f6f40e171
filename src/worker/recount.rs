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
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::gate::pause;
use crate::gate::witness::{self, Witness};
use crate::reconcile::{self, Drift, DriftClass, Outcome};
use crate::store::db::Db;
use crate::store::layout::Layout;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::RedisConn;

/// The longest a count that found the voucher busy, or failed, waits
/// before it is tried again: each full count reads every bucket and every
/// order of the voucher, so a sale that keeps trickling does not get one
/// at each still moment.
const MOST_BACKOFF: Duration = Duration::from_secs(30);

/// The vouchers owed a count.
#[derive(Default)]
pub struct Recounts {
    owed: HashMap<u64, Owed>,
}

#[derive(Default)]
struct Owed {
    /// Its buckets' witnesses as the last look saw them (None: not looked
    /// at since it was owed or last tried).
    last: Option<Vec<Witness>>,
    /// Counts tried and found busy (or failed) in a row, and not to be
    /// tried again before this.
    tries: u32,
    not_before: Option<Instant>,
}

impl Owed {
    /// Tried again only after a while, longer each time.
    fn back_off(&mut self) {
        self.last = None;
        self.tries = self.tries.saturating_add(1);
        let wait = Duration::from_secs(1u64 << self.tries.min(5)).min(MOST_BACKOFF);
        self.not_before = Some(Instant::now() + wait);
    }
}

/// What a look at an owed voucher came to.
#[derive(Debug)]
pub enum Counted {
    /// Not counted yet: its buckets moved since the last look (or this
    /// was the first), one is not loaded, paused or held, or the last try
    /// is too recent. Still owed.
    NotYet,
    /// Counted and repaired; `given_back`: units went back on sale.
    Repaired {
        drifts: Vec<Drift>,
        given_back: bool,
    },
    /// Counted: nothing was off.
    Consistent,
    /// Counted, and MySQL disagrees with its own orders: nothing written,
    /// the debt dropped (the operator's `--fix-mysql` comes first).
    NotRepaired(Vec<Drift>),
    /// The count found it moving or held after all: still owed, tried
    /// again after a while.
    Busy,
}

impl Recounts {
    /// `voucher` is owed a count (again: a later rebuild may hold back
    /// more).
    pub fn owe(&mut self, voucher: u64) {
        self.owed.insert(voucher, Owed::default());
    }

    pub fn owed(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.owed.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Looks at an owed voucher, and counts it if its buckets are as the
    /// last look left them, every one loaded, open and not held (a bucket
    /// lost or paused is the guard's rebuild's first: counted before, its
    /// units would look free). A count that fails backs off too.
    pub async fn look(
        &mut self,
        db: &Db,
        conn: &mut impl RedisConn,
        layout: &Layout,
        ids: &OrderIds,
        opts: &reconcile::Options,
    ) -> Result<Counted> {
        let voucher = layout.voucher();
        let Some(owed) = self.owed.get_mut(&voucher) else {
            return Ok(Counted::Consistent);
        };
        if owed.not_before.is_some_and(|t| Instant::now() < t) {
            return Ok(Counted::NotYet);
        }
        let keys = layout.all_keys()?;
        let now = witness::read_many(conn, &keys).await?;
        if owed.last.as_ref() != Some(&now) || now.iter().any(|w| w.stock.is_empty()) {
            owed.last = Some(now);
            return Ok(Counted::NotYet);
        }
        for k in &keys {
            if pause::is_paused(conn, k).await? || pause::is_held(conn, k).await? {
                owed.last = None;
                return Ok(Counted::NotYet);
            }
        }
        // Tried now: a failure below waits before the next try.
        owed.back_off();
        let prefix = keys[0].prefix().to_string();
        let mut run = reconcile::Run::new(db, conn, &prefix, true).with_order_ids(ids);
        let reports = run.pass(&[voucher], opts, |_| {}).await?;
        let busy = reports.iter().any(|r| {
            matches!(
                r.outcome,
                Outcome::Busy | Outcome::Held | Outcome::WouldRepair
            )
        });
        if busy {
            return Ok(Counted::Busy);
        }
        self.owed.remove(&voucher);
        let not_repaired = reports.iter().any(|r| r.outcome == Outcome::NotRepaired);
        let drifts: Vec<Drift> = reports.into_iter().flat_map(|r| r.drifts).collect();
        Ok(match (not_repaired, drifts.is_empty()) {
            (true, _) => Counted::NotRepaired(drifts),
            (false, true) => Counted::Consistent,
            (false, false) => Counted::Repaired {
                given_back: drifts.iter().any(|d| d.class == DriftClass::RedisStockLow),
                drifts,
            },
        })
    }
}
