//! One gate's reconcile, the voucher's one gate or one of its buckets (the
//! target): read it with MySQL, classify, repair only if nothing moved
//! since the read, reopen it when consistent; and what MySQL lost is
//! forgotten or raised back on the gate's witness of commits.

use crate::error::{Error, Result};
use crate::gate::pause::Reopened;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::layout::Layout;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::RedisConn;
use crate::store::scripts::FORGET_COMMITS;

use super::buckets::{self, StockJudged};
use super::classify::{classify, Drift, DriftClass};
use super::repair::{repair, sync_digests, RepairResult};
use super::report::{busy_report, report_of, Outcome, VoucherReport};
use super::snapshot::{read_voucher, Read, Snapshot, VoucherUnits};
use super::{Options, MOVER_HOLD};

/// A gate a worker paused (Redis had lost writes) that is consistent now
/// opens again, if it has a buyer for every one of `orders` (the view's
/// count; orders only grow), its pause's grace ran out, no worker holds it
/// and no pause came since `pause_token` was read. Sets whether it was
/// reopened and whether it is paused now.
pub(super) async fn reopen_if_paused(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    orders: u64,
    pause_token: &str,
    report: &mut VoucherReport,
) -> Result<()> {
    let done = crate::gate::pause::reopen(conn, keys, orders, Some(pause_token)).await?;
    report.reopened = done == Reopened::Now;
    report.gate_paused = matches!(
        done,
        Reopened::StaysPaused | Reopened::Held | Reopened::PausedSince
    );
    Ok(())
}

/// [`reopen_if_paused`] on a full read.
/// Lowers the gate's witness of MySQL's commits (meta `committed`) by what
/// MySQL lost that nothing is left of to restore or keep: no kept entry,
/// no buyer without an order (Redis lost them too, or the operator dropped
/// them by their count). Otherwise the guard would pause the gate for that
/// gap at every pass. Read before MySQL, the witness only errs low, so the
/// gap taken off is never more than was lost.
///
/// False when the witness moved since the read (another run took the gap
/// off, or a commit landed): nothing was taken off, and the caller reads
/// again rather than repair on this view.
async fn forget_lost_commits(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    s: &Snapshot,
) -> Result<bool> {
    let gap = s.commits_lost();
    if gap == 0 || !s.lost_commits.is_empty() || !s.unrestorable.is_empty() {
        return Ok(true);
    }
    crate::support::fault::point("before_forget").await?;
    // Only off the witness this run read: another run that read the same
    // gap may have taken it off since (lua/forget_commits.lua).
    let left: i64 = FORGET_COMMITS
        .key(keys.meta())
        .arg(s.gate_digests.committed)
        .arg(gap)
        .invoke_async(conn)
        .await?;
    if left < 0 {
        tracing::info!(
            "voucher {}: the gate's witness of commits moved since it was read (another reconcile took the gap off?); reading again",
            keys.voucher()
        );
        return Ok(false);
    }
    tracing::warn!(
        "voucher {}: MySQL lost {gap} committed order(s) that no kept stream entry or buyer is left of: nothing to restore, counted as lost",
        keys.voucher()
    );
    Ok(true)
}

/// Sets the gate's witness of MySQL's commits back up to MySQL's count of
/// the gate's orders (read after the witness): see
/// [`crate::gate::witness::raise_committed`]. Never while MySQL lacks what
/// the witness saw. False when the gate had no meta to raise (gone whole:
/// a repair makes it, and the caller raises again then).
async fn raise_lost_witness(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    s: &Snapshot,
) -> Result<bool> {
    // MySQL's orders as counted, or as its row says if fewer (a row behind
    // its orders is drift for `--fix-mysql`, not a loss to pause for).
    let held = s.recounted.orders_total.min(s.counters.orders_total);
    if s.commits_lost() > 0 || s.gate_digests.committed >= held {
        return Ok(true);
    }
    let forgotten = s.gate_digests.forgotten;
    let after = crate::gate::witness::raise_committed(conn, keys, held, forgotten).await?;
    if after == -1 {
        return Ok(false);
    }
    if after > s.gate_digests.committed as i64 {
        tracing::info!(
            "voucher {}: the gate's witness of commits raised from {} to {after} of MySQL's {held} order(s) (Redis had lost its count)",
            keys.voucher(),
            s.gate_digests.committed
        );
    }
    Ok(true)
}

async fn reopen_on_read(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    s: &Snapshot,
    report: &mut VoucherReport,
) -> Result<()> {
    // A gate that owes units MySQL lacks to requests still in flight stays
    // paused until they settle (committed or dead-lettered): then a read
    // accounts for them, and no cancellation meanwhile is given twice. A
    // bucket's share is judged by the mover's count (buckets.rs).
    let owed = s.owed_uncovered();
    if s.bucket.is_none() && owed > 0 && s.gate_paused {
        tracing::info!(
            "{}: gate stays paused: {owed} unit(s) admitted past MySQL's stock are still in flight",
            keys.meta()
        );
        report.gate_paused = true;
        return Ok(());
    }
    reopen_if_paused(conn, keys, s.order_ids.len() as u64, &s.pause_token, report).await
}

/// Which bucket answers for a difference in a voucher's units.
pub(super) enum Carrier {
    /// No difference; the voucher's units as read.
    None(Option<VoucherUnits>),
    Bucket(u32, Option<VoucherUnits>),
    /// The buckets kept moving: not counted.
    Busy,
}

/// What one reconcile loop reads and repairs.
#[derive(Clone, Copy)]
enum Target<'a> {
    /// A voucher's one gate.
    Voucher { prefix: &'a str, voucher: u64 },
    /// One bucket of a voucher in buckets (the mover fenced: buckets.rs).
    Bucket(BucketCheck<'a>),
}

/// One bucket of a voucher in buckets to check.
#[derive(Clone, Copy)]
pub struct BucketCheck<'a> {
    pub layout: &'a Layout,
    pub bucket: u32,
    pub judged: StockJudged,
    /// Who holds the voucher's mover still (gate/mover_lease.rs): the hold
    /// is renewed before every read, so no read outlives it. None: a look
    /// that writes nothing (dry run).
    pub hold: Option<&'a str>,
    /// The other buckets may sell during the read (the guard's rebuild of
    /// a paused bucket, which must finish during a sale): their count then
    /// errs low, never high. Otherwise every bucket must be still across
    /// the read, or it is read again.
    pub others_may_move: bool,
}

impl Target<'_> {
    fn voucher(&self) -> u64 {
        match self {
            Target::Voucher { voucher, .. } => *voucher,
            Target::Bucket(c) => c.layout.voucher(),
        }
    }

    fn keys(&self) -> Result<VoucherKeys> {
        match self {
            Target::Voucher { prefix, voucher } => VoucherKeys::new(prefix, *voucher),
            Target::Bucket(c) => c.layout.keys(c.bucket),
        }
    }

    async fn read(
        &self,
        db: &Db,
        conn: &mut impl RedisConn,
        keys: &VoucherKeys,
        opts: &Options,
    ) -> Result<Read> {
        match self {
            Target::Voucher { voucher, .. } => {
                read_voucher(db, conn, keys, *voucher, opts.settle_ms).await
            }
            Target::Bucket(c) => {
                if let Some(owner) = c.hold {
                    let gates = c.layout.all_keys()?;
                    let held = crate::gate::mover_lease::seize(conn, &gates, owner, MOVER_HOLD);
                    if held.await?.is_none() {
                        // Another holds it (ours ran out): no count now.
                        return Ok(Read::Moved);
                    }
                }
                buckets::read_bucket(db, conn, c, opts.settle_ms, !opts.dry_run).await
            }
        }
    }
}

/// Checks one voucher and, unless dry-run, repairs what it found.
/// `first` is a read already made (by [`super::read_many`]); later rounds read again.
pub async fn reconcile_voucher(
    db: &Db,
    conn: &mut impl RedisConn,
    prefix: &str,
    voucher: u64,
    first: Option<Read>,
    opts: &Options,
    ids: Option<&OrderIds>,
) -> Result<VoucherReport> {
    let target = Target::Voucher { prefix, voucher };
    reconcile_gate(db, conn, target, first, opts, ids).await
}

/// Checks bucket `bucket` of a voucher in buckets and, unless dry-run,
/// repairs what it found and reopens it if paused. Only while the
/// voucher's mover is fenced (gate/mover_lease.rs): the bucket's stock is
/// judged by every unit of the voucher elsewhere.
pub async fn reconcile_bucket(
    db: &Db,
    conn: &mut impl RedisConn,
    check: BucketCheck<'_>,
    opts: &Options,
    ids: Option<&OrderIds>,
) -> Result<VoucherReport> {
    let bucket = check.bucket;
    let mut report = reconcile_gate(db, conn, Target::Bucket(check), None, opts, ids).await?;
    report.bucket = Some(bucket);
    Ok(report)
}

async fn reconcile_gate(
    db: &Db,
    conn: &mut impl RedisConn,
    target: Target<'_>,
    first: Option<Read>,
    opts: &Options,
    ids: Option<&OrderIds>,
) -> Result<VoucherReport> {
    let voucher = target.voucher();
    let keys = target.keys()?;
    let mut first = first;
    let mut attempt = 0;
    // Drift repaired in an earlier round (MySQL's stock, before the gate is
    // decided on a fresh read): reported, and the outcome is "repaired".
    let mut repaired_before: Vec<Drift> = Vec::new();
    loop {
        attempt += 1;
        let read = match first.take() {
            Some(r) => r,
            None => target.read(db, conn, &keys, opts).await?,
        };
        let mut s = match read {
            Read::Snapshot(s) => s,
            Read::Missing => return Err(Error::VoucherNotFound(voucher)),
            Read::Moved if attempt >= opts.attempts => return Ok(busy_report(voucher)),
            Read::Moved => continue,
        };
        let unrestorable = s.unrestorable.len() as u64;
        if unrestorable > 0 && opts.drop_lost_commits == Some(unrestorable) {
            // Named by the operator: plain buyers without an order now.
            s.unrestorable.clear();
        }
        if !opts.dry_run && !forget_lost_commits(conn, &keys, &s).await? {
            if attempt >= opts.attempts {
                return Ok(busy_report(voucher));
            }
            continue;
        }
        let witness_done = opts.dry_run || raise_lost_witness(conn, &keys, &s).await?;
        let mut report = look_at_read(conn, &keys, &s, opts).await?;
        if report.drifts.is_empty() {
            if !repaired_before.is_empty() {
                report.drifts = repaired_before;
                report.outcome = Outcome::Repaired;
            }
            if !opts.dry_run {
                reopen_on_read(conn, &keys, &s, &mut report).await?;
            }
            return Ok(report);
        }
        if opts.dry_run {
            report.outcome = match s.unrestorable.is_empty() {
                true => Outcome::WouldRepair,
                false => Outcome::NotRepaired,
            };
            return Ok(report);
        }
        match repair(db, conn, &keys, voucher, &s, &report.drifts, opts, ids).await? {
            RepairResult::Applied { unrepaired } => {
                // The repair made the gate's meta (gone whole).
                if !witness_done {
                    raise_lost_witness(conn, &keys, &s).await?;
                }
                // A gate paused while buyers may have lost their orders
                // stays paused: the operator decides about them.
                report.outcome = if unrepaired {
                    Outcome::NotRepaired
                } else {
                    reopen_on_read(conn, &keys, &s, &mut report).await?;
                    Outcome::Repaired
                };
                report.drifts.splice(0..0, repaired_before);
                return Ok(report);
            }
            RepairResult::MysqlFixed => {
                repaired_before.extend(repaired_in_mysql(report.drifts));
            }
            RepairResult::Held => {
                report.outcome = Outcome::Held;
                report.gate_paused = s.gate_paused;
                report.drifts.splice(0..0, repaired_before);
                return Ok(report);
            }
            RepairResult::Moved if attempt < opts.attempts => continue,
            RepairResult::Moved => {
                report.outcome = Outcome::Busy;
                return Ok(report);
            }
        }
    }
}

/// The report on a read: its drift classified, and whether the gate's
/// digests are behind its sets (unless dry-run, set right first).
async fn look_at_read(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    s: &Snapshot,
    opts: &Options,
) -> Result<VoucherReport> {
    let (drifts, expected) = classify(s);
    let mut report = report_of(s, drifts, expected);
    let behind = s.digests_behind();
    report.gate_digests_behind = !behind.is_empty();
    if !opts.dry_run && !behind.is_empty() {
        report.gate_digests_behind = !sync_digests(conn, keys, &behind).await?;
    }
    Ok(report)
}

/// The drift a repair that fixed MySQL repaired for good: the rest is
/// decided again on a fresh read.
fn repaired_in_mysql(drifts: Vec<Drift>) -> impl Iterator<Item = Drift> {
    drifts
        .into_iter()
        // Counters were counted again on the way (repair.rs).
        .filter(|d| {
            matches!(
                d.class,
                DriftClass::MysqlInconsistent
                    | DriftClass::CountersDrift
                    | DriftClass::OrdersLostByMysql
            )
        })
}
