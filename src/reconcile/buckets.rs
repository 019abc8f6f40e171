//! One bucket of a voucher split in buckets, as reconcile compares it with
//! MySQL (design/buckets.md §5 and hole 2): its buyers, releases and
//! deadlines against the orders of its own users, and its stock against
//! its share of MySQL's free stock — what MySQL has left less what every
//! other place holds: the pool, the units in transit, and each other
//! bucket's stock, units admitted there and not yet persisted, and units
//! cancelled there and not yet given back.
//!
//! Transfers move units between masters, where no one read sees both
//! sides: the pool and the transfers in transit are read before and after
//! the buckets and must not have moved (a writing caller holds the mover
//! still: gate/mover_lease.rs). Reconcile wants every bucket still across
//! the read, which makes the count exact. The guard's rebuild of a paused
//! bucket cannot wait for a sale to stop, so there the other buckets sell
//! on, and that is safe: each is read Redis first, MySQL after, with its
//! stock and its released set read at one moment (the witness, and a
//! released set of the size the witness counted: it only grows), so a
//! unit that moves during the read (sold, persisted, cancelled, given
//! back) is counted once or twice, never not at all. The share then comes
//! out low, never high: a unit held back (given back by the next
//! `seckill reconcile`), never one sold twice.

use redis::AsyncCommands;

use super::snapshot::{read_gates, BucketView, GateRead, GateSpec, Read, Snapshot, VoucherUnits};
use super::BucketCheck;
use crate::error::Result;
use crate::gate::transfer;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use crate::store::scripts::POOL_FOLD;

/// Which bucket answers for the voucher's stock. Only the whole voucher's
/// units can be checked against MySQL (the split between buckets is the
/// mover's, not MySQL's), so a difference shows in every bucket alike;
/// one bucket takes it, and the others are judged by their sets alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockJudged {
    /// This bucket's stock is set from its share (the guard's rebuild of
    /// the bucket that lost writes, or reconcile's chosen bucket).
    Here,
    /// Another bucket's stock answers for the difference.
    Elsewhere,
}

/// Reads the bucket `check` names, its MySQL side made the bucket's (see
/// the module comment). `writing` (a repair follows): bucket 0, paused for
/// a rebuild and judged here, takes the pool into its stock first
/// (lua/pool_fold.lua: it shares bucket 0's master, so it may have lost
/// writes with it), and a bucket judged elsewhere takes what surplus the
/// carrier left.
pub async fn read_bucket(
    db: &Db,
    conn: &mut impl RedisConn,
    check: &BucketCheck<'_>,
    settle_ms: i64,
    writing: bool,
) -> Result<Read> {
    let (layout, bucket, judged) = (check.layout, check.bucket, check.judged);
    let fold = writing && judged == StockJudged::Here;
    let gates = layout.all_keys()?;
    if fold && bucket == 0 && !fold_pool(conn, &gates).await? {
        // The pool moved, though the mover is held: read again.
        return Ok(Read::Moved);
    }
    // Transit first, the pool after: a stale transfer a mover's round
    // completes meanwhile (its units back in the pool) is counted twice
    // then, never not at all; the buckets' stock is read after, too.
    let (transit, pool) = transit_and_pool(conn, &gates).await?;
    let specs: Vec<GateSpec> = gates
        .iter()
        .enumerate()
        .map(|(b, keys)| GateSpec {
            keys: keys.clone(),
            bucket: b as u32,
            buckets: layout.buckets(),
        })
        .collect();
    let reads = read_gates(db, conn, layout.keys(0)?.prefix(), &specs, settle_ms).await?;
    let (mut s, others) = match bucket_and_others(reads, bucket, check.others_may_move) {
        Ok(split) => split,
        Err(read) => return Ok(read),
    };
    // Transfers and the pool as they were: a mover not held (a dry run)
    // may have moved units between places read at different moments.
    if transit_and_pool(conn, &gates).await? != (transit, pool) {
        return Ok(Read::Moved);
    }
    // A hold that ran out during the read let a mover move: read again.
    if let Some(owner) = check.hold {
        if !crate::gate::mover_lease::holds(conn, &gates[0], owner).await? {
            return Ok(Read::Moved);
        }
    }
    let units = voucher_units(&s, &others, pool, transit);
    // Here: MySQL's free stock less what every other place holds, which
    // is what it holds and what the voucher is off.
    let share = match judged {
        StockJudged::Here => held(&s) + units.off,
        // What it holds, so that its expected stock is its stock; when
        // writing, less what the voucher holds beyond MySQL's units and the
        // carrier could not take (its stock first, then cancelled units an
        // order holds already: the carrier is repaired first). A dry run
        // shows the difference on the carrier alone.
        StockJudged::Elsewhere => match writing {
            true => held(&s) + units.off.min(0),
            false => held(&s),
        },
    };
    let active_elsewhere: i64 = others.iter().map(|o| o.active_units()).sum();
    let view = BucketView {
        bucket,
        buckets: layout.buckets(),
        tags: layout.tags_text(),
        voucher_active: s.active_units() + active_elsewhere,
        units,
        richest: richest(bucket, &s, &others, layout.buckets()),
    };
    // MySQL against itself stays a voucher's matter: the bucket's total is
    // its share and its own active units, off by what the voucher is off.
    let off = units.total - units.mysql_stock - view.voucher_active;
    s.mysql_stock = share;
    s.total = share + s.active_units() + off;
    // The voucher row's counters count every bucket's orders.
    s.counters = s.recounted;
    s.bucket = Some(view);
    Ok(Read::Snapshot(s))
}

/// Takes the pool into bucket 0's stock (lua/pool_fold.lua). False: the
/// pool moved meanwhile, nothing taken.
async fn fold_pool(conn: &mut impl RedisConn, gates: &[VoucherKeys]) -> Result<bool> {
    let pool: i64 = conn
        .get::<_, Option<i64>>(gates[0].pool())
        .await?
        .unwrap_or(0);
    if pool <= 0 {
        return Ok(true);
    }
    let folded: i64 = POOL_FOLD
        .key(gates[0].meta())
        .key(gates[0].pool())
        .key(gates[0].stock())
        .arg(pool)
        .invoke_async(conn)
        .await?;
    Ok(folded != 0)
}

/// The units in transit between buckets, then the pool's.
async fn transit_and_pool(conn: &mut impl RedisConn, gates: &[VoucherKeys]) -> Result<(i64, i64)> {
    let transit = transfer::in_transit(conn, gates).await? as i64;
    let pool: i64 = conn
        .get::<_, Option<i64>>(gates[0].pool())
        .await?
        .unwrap_or(0);
    Ok((transit, pool))
}

/// The snapshot of bucket `bucket` and those of the others, in bucket
/// order; or, if they cannot be counted together, the read to answer with
/// (Missing, Moved).
fn bucket_and_others(
    reads: Vec<GateRead>,
    bucket: u32,
    others_may_move: bool,
) -> std::result::Result<(Box<Snapshot>, Vec<Snapshot>), Read> {
    let mut target = None;
    let mut others = Vec::with_capacity(reads.len());
    for (b, read) in reads.into_iter().enumerate() {
        let Some(s) = read.snapshot else {
            return Err(Read::Missing);
        };
        // Every bucket still across the read makes the count exact; only
        // a rebuild under a pause (the others selling on) settles for a
        // count that errs low.
        if read.moved && (b as u32 == bucket || !others_may_move) {
            return Err(Read::Moved);
        }
        if b as u32 == bucket {
            target = Some(s);
        } else {
            // Its stock is the witness's; the released set read after
            // must be the one that went with it.
            if s.released.len() as u64 != s.witness.released {
                return Err(Read::Moved);
            }
            others.push(*s);
        }
    }
    match target {
        Some(s) => Ok((s, others)),
        None => Err(Read::Missing),
    }
}

/// The voucher's units wherever they are, as read.
fn voucher_units(s: &Snapshot, others: &[Snapshot], pool: i64, transit: i64) -> VoucherUnits {
    let all = || std::iter::once(s).chain(others);
    let mut units = VoucherUnits {
        total: s.total,
        mysql_stock: s.mysql_stock,
        pool,
        in_transit: transit,
        bucket_stock: all().map(|g| g.gate_stock.unwrap_or(0).max(0)).sum(),
        in_flight: all().map(|g| g.unpersisted_units()).sum(),
        unreleased: all().map(|g| g.unreleased_units()).sum(),
        off: 0,
    };
    units.off = units.mysql_stock
        - units.pool
        - units.in_transit
        - units.bucket_stock
        - units.in_flight
        - units.unreleased;
    units
}

/// The bucket holding the most stock (the lowest such); `others` are the
/// buckets but `bucket`, in order.
fn richest(bucket: u32, s: &Snapshot, others: &[Snapshot], buckets: u32) -> u32 {
    std::iter::once((bucket, s.gate_stock.unwrap_or(0)))
        .chain(
            others
                .iter()
                .zip((0..buckets).filter(|b| *b != bucket))
                .map(|(o, b)| (b, o.gate_stock.unwrap_or(0))),
        )
        .max_by_key(|(b, stock)| (*stock, std::cmp::Reverse(*b)))
        .map_or(0, |(b, _)| b)
}

/// The units a bucket holds as read: its stock, what it admitted that
/// MySQL does not have yet, and what MySQL cancelled that it has not been
/// given back yet.
fn held(s: &Snapshot) -> i64 {
    s.gate_stock.unwrap_or(0).max(0) + s.unpersisted_units() + s.unreleased_units()
}
