//! `seckill reconcile`: compare each voucher's Redis gate with MySQL (the
//! truth), accounting for work in flight, classify every difference, and
//! repair it — only if the voucher did not move since it was read.
//!
//! Reads go Redis first, then MySQL. An order the worker persists between
//! the two reads is then both "in flight" and "in MySQL" and is counted once
//! (as stored); anything that changes the gate in between (an admission, a
//! release, a promotion) changes the witness, and the read is repeated.
//! Redis stock is never overwritten with MySQL's: the expected gate stock is
//! MySQL's stock less the units admitted but not yet persisted and the
//! cancelled units not yet given back.

mod snapshot;

use std::collections::BTreeSet;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::gate::image::{publish_gate, GateImage, Seen};
use crate::orders::deadline;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use crate::store::registry;
use crate::store::scripts::RECONCILE;
use crate::support::snowflake::Snowflake;
pub use snapshot::{candidates, read_many, read_voucher, Read, Snapshot};

/// The kinds of drift, each with the action that repairs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DriftClass {
    /// Redis lost the voucher (meta or stock missing): rebuild it from MySQL.
    GateNotLoaded,
    /// A loaded gate missing from the registry: no worker consumes its
    /// stream, so its orders never reach MySQL. Register it.
    NotRegistered,
    /// Gate stock above what MySQL allows: an oversell risk. Lower it.
    RedisStockHigh,
    /// Gate stock below what MySQL allows: units stuck. Give them back.
    RedisStockLow,
    /// Users with an order who are not buyers at the gate (could buy twice).
    BuyersMissing,
    /// Buyers with no order and no order in flight (a lost or refused
    /// admission): drop them so they may try again.
    BuyersWithoutOrder,
    /// Cancelled orders whose unit never came back at the gate.
    CancelledNotReleased,
    /// Pending orders with no payment deadline in Redis.
    DeadlineMissing,
    /// MySQL itself: stock + pending + paid ≠ total.
    MysqlInconsistent,
}

impl DriftClass {
    pub fn action(&self) -> &'static str {
        match self {
            DriftClass::GateNotLoaded => "rebuild the gate from MySQL",
            DriftClass::NotRegistered => "register it for the workers",
            DriftClass::RedisStockHigh => "lower the gate stock",
            DriftClass::RedisStockLow => "give the units back at the gate",
            DriftClass::BuyersMissing => "add them to the buyers",
            DriftClass::BuyersWithoutOrder => "drop them from the buyers",
            DriftClass::CancelledNotReleased => "give their units back (release path)",
            DriftClass::DeadlineMissing => "schedule their deadlines",
            DriftClass::MysqlInconsistent => "set stock = total - active (only with --fix-mysql)",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Drift {
    pub class: DriftClass,
    /// Units, users or orders concerned.
    pub amount: u64,
    /// A few of the ids concerned, for the operator.
    pub sample: Vec<u64>,
    pub action: &'static str,
}

/// What reconcile did (or would do) about a voucher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Consistent,
    WouldRepair,
    Repaired,
    /// The voucher kept moving; nothing was written. Try again.
    Busy,
    /// Drift that is only reported (MySQL inconsistent without --fix-mysql).
    NotRepaired,
}

#[derive(Debug, Clone, Serialize)]
pub struct VoucherReport {
    pub voucher: u64,
    pub mysql_total: i64,
    pub mysql_stock: i64,
    pub orders_pending: u64,
    pub orders_paid: u64,
    pub orders_cancelled: u64,
    pub gate_loaded: bool,
    pub gate_stock: Option<i64>,
    pub expected_gate_stock: i64,
    pub buyers: u64,
    pub in_flight: u64,
    pub dead_letters: u64,
    pub drifts: Vec<Drift>,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub dry_run: bool,
    pub fix_mysql: bool,
    /// Reads repeated when the voucher moves, before reporting it busy.
    pub attempts: usize,
    /// Cancellations and new orders younger than this are still being
    /// handled by a worker (release, deadline), not drift.
    pub settle_ms: i64,
}

const SAMPLE: usize = 5;

fn drift(class: DriftClass, ids: &BTreeSet<u64>) -> Drift {
    Drift {
        class,
        amount: ids.len() as u64,
        sample: ids.iter().take(SAMPLE).copied().collect(),
        action: class.action(),
    }
}

/// The drifts of a snapshot, and the expected gate stock.
pub fn classify(s: &Snapshot) -> (Vec<Drift>, i64) {
    let mut out = Vec::new();
    let active = s.pending.len() + s.paid;
    if s.mysql_stock + active as i64 != s.total {
        out.push(Drift {
            class: DriftClass::MysqlInconsistent,
            amount: (s.mysql_stock + active as i64 - s.total).unsigned_abs(),
            sample: Vec::new(),
            action: DriftClass::MysqlInconsistent.action(),
        });
    }
    let expected = s.expected_gate_stock();
    if !s.gate_loaded {
        out.push(Drift {
            class: DriftClass::GateNotLoaded,
            amount: 1,
            sample: Vec::new(),
            action: DriftClass::GateNotLoaded.action(),
        });
        return (out, expected);
    }
    if !s.registered {
        out.push(Drift {
            class: DriftClass::NotRegistered,
            amount: 1,
            sample: Vec::new(),
            action: DriftClass::NotRegistered.action(),
        });
    }
    let stock = s.gate_stock.unwrap_or(0);
    if stock > expected {
        out.push(Drift {
            class: DriftClass::RedisStockHigh,
            amount: (stock - expected) as u64,
            sample: Vec::new(),
            action: DriftClass::RedisStockHigh.action(),
        });
    } else if stock < expected {
        out.push(Drift {
            class: DriftClass::RedisStockLow,
            amount: (expected - stock) as u64,
            sample: Vec::new(),
            action: DriftClass::RedisStockLow.action(),
        });
    }
    let holders = s.holders();
    let missing: BTreeSet<u64> = holders.difference(&s.buyers).copied().collect();
    let orphans: BTreeSet<u64> = s.buyers.difference(&holders).copied().collect();
    let unreleased = s.cancelled_unreleased_settled();
    let no_deadline: BTreeSet<u64> = s.deadlines_missing().iter().map(|(o, _)| *o).collect();
    for (class, ids) in [
        (DriftClass::BuyersMissing, &missing),
        (DriftClass::BuyersWithoutOrder, &orphans),
        (DriftClass::CancelledNotReleased, &unreleased),
        (DriftClass::DeadlineMissing, &no_deadline),
    ] {
        if !ids.is_empty() {
            out.push(drift(class, ids));
        }
    }
    (out, expected)
}

/// Checks one voucher and, unless dry-run, repairs what it found.
/// `first` is a read already made (by [`read_many`]); later rounds read again.
pub async fn reconcile_voucher(
    db: &Db,
    conn: &mut impl RedisConn,
    prefix: &str,
    voucher: u64,
    first: Option<Read>,
    opts: &Options,
    ids: &Snowflake,
) -> Result<VoucherReport> {
    let keys = VoucherKeys::new(prefix, voucher)?;
    let mut first = first;
    let mut attempt = 0;
    // Drift repaired in an earlier round (MySQL's stock, before the gate is
    // decided on a fresh read): reported, and the outcome is "repaired".
    let mut repaired_before: Vec<Drift> = Vec::new();
    loop {
        attempt += 1;
        let read = match first.take() {
            Some(r) => r,
            None => read_voucher(db, conn, &keys, voucher, opts.settle_ms).await?,
        };
        let s = match read {
            Read::Snapshot(s) => s,
            Read::Missing => return Err(Error::VoucherNotFound(voucher)),
            Read::Moved if attempt >= opts.attempts => return Ok(busy_report(voucher)),
            Read::Moved => continue,
        };
        let (drifts, expected) = classify(&s);
        let mut report = report_of(&s, drifts, expected);
        if report.drifts.is_empty() {
            if !repaired_before.is_empty() {
                report.drifts = repaired_before;
                report.outcome = Outcome::Repaired;
            }
            return Ok(report);
        }
        if opts.dry_run {
            report.outcome = Outcome::WouldRepair;
            return Ok(report);
        }
        match repair(db, conn, &keys, voucher, &s, &report.drifts, opts, ids).await? {
            RepairResult::Applied { unrepaired } => {
                report.outcome = if unrepaired {
                    Outcome::NotRepaired
                } else {
                    Outcome::Repaired
                };
                report.drifts.splice(0..0, repaired_before);
                return Ok(report);
            }
            RepairResult::MysqlFixed => {
                repaired_before.extend(
                    report
                        .drifts
                        .into_iter()
                        .filter(|d| d.class == DriftClass::MysqlInconsistent),
                );
            }
            RepairResult::Moved if attempt < opts.attempts => continue,
            RepairResult::Moved => {
                report.outcome = Outcome::Busy;
                return Ok(report);
            }
        }
    }
}

fn busy_report(voucher: u64) -> VoucherReport {
    VoucherReport {
        voucher,
        mysql_total: 0,
        mysql_stock: 0,
        orders_pending: 0,
        orders_paid: 0,
        orders_cancelled: 0,
        gate_loaded: false,
        gate_stock: None,
        expected_gate_stock: 0,
        buyers: 0,
        in_flight: 0,
        dead_letters: 0,
        drifts: Vec::new(),
        outcome: Outcome::Busy,
    }
}

fn report_of(s: &Snapshot, drifts: Vec<Drift>, expected: i64) -> VoucherReport {
    VoucherReport {
        voucher: s.voucher,
        mysql_total: s.total,
        mysql_stock: s.mysql_stock,
        orders_pending: s.pending.len() as u64,
        orders_paid: s.paid as u64,
        orders_cancelled: s.cancelled.len() as u64,
        gate_loaded: s.gate_loaded,
        gate_stock: s.gate_stock,
        expected_gate_stock: expected,
        buyers: s.buyers.len() as u64,
        in_flight: s.in_flight.len() as u64,
        dead_letters: s.dead_letters,
        outcome: if drifts.is_empty() {
            Outcome::Consistent
        } else {
            Outcome::WouldRepair
        },
        drifts,
    }
}

enum RepairResult {
    Applied {
        unrepaired: bool,
    },
    /// MySQL's stock was set right; the gate is decided on a fresh read.
    MysqlFixed,
    Moved,
}

#[allow(clippy::too_many_arguments)]
async fn repair(
    db: &Db,
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
    s: &Snapshot,
    drifts: &[Drift],
    opts: &Options,
    ids: &Snowflake,
) -> Result<RepairResult> {
    let has = |c: DriftClass| drifts.iter().any(|d| d.class == c);
    if has(DriftClass::MysqlInconsistent) {
        if !opts.fix_mysql {
            // The gate is repaired against MySQL; with MySQL itself wrong,
            // touching the gate could only spread the damage.
            tracing::error!(
                "voucher {voucher}: MySQL stock + active orders != total; not repairing (see --fix-mysql)"
            );
            return Ok(RepairResult::Applied { unrepaired: true });
        }
        let active = (s.pending.len() + s.paid) as i64;
        return Ok(
            if fix_mysql_stock(db, voucher, s.mysql_stock, s.total - active).await? {
                RepairResult::MysqlFixed
            } else {
                RepairResult::Moved
            },
        );
    }
    if has(DriftClass::GateNotLoaded) {
        return rebuild_gate(conn, keys, s).await;
    }
    if has(DriftClass::NotRegistered) {
        // Idempotent and outside the gate's own keys: no witness needed.
        registry::register(conn, keys).await?;
    }
    // The expected stock already leaves out every cancelled unit not yet
    // back; the settled ones come back through release.lua below (one unit
    // each, to the waitlist or the stock), the settling ones by their own
    // release. So the script moves the stock by exactly expected - gate.
    let delta = s.expected_gate_stock() - s.gate_stock.unwrap_or(0);
    let holders = s.holders();
    let add: Vec<u64> = holders.difference(&s.buyers).copied().collect();
    let remove: Vec<u64> = s.buyers.difference(&holders).copied().collect();
    let deadlines: Vec<(u64, i64)> = s
        .deadlines_missing()
        .into_iter()
        .map(|(order, created)| (order, created + s.pay_timeout_ms))
        .collect();
    let unreleased: Vec<u64> = s.cancelled_unreleased_settled().into_iter().collect();
    let mut inv = RECONCILE.prepare_invoke();
    inv.key(keys.stock())
        .key(keys.buyers())
        .key(keys.orders())
        .key(keys.released())
        .key(keys.timeouts())
        .arg(&s.witness.last_entry_id)
        .arg(&s.witness.stock)
        .arg(s.witness.buyers)
        .arg(s.witness.released)
        .arg(delta)
        .arg(add.len());
    for u in &add {
        inv.arg(*u);
    }
    inv.arg(remove.len());
    for u in &remove {
        inv.arg(*u);
    }
    inv.arg(deadlines.len());
    for (order, at) in &deadlines {
        inv.arg(*order).arg(*at);
    }
    let applied: i64 = inv.invoke_async(conn).await?;
    if applied != 1 {
        return Ok(RepairResult::Moved);
    }
    if !unreleased.is_empty() {
        deadline::release(conn, keys, voucher, &unreleased, &[], ids).await?;
    }
    Ok(RepairResult::Applied { unrepaired: false })
}

/// The gate from MySQL, as preload builds it, but with the units in flight
/// held back (preload refuses in flight; reconcile accounts for it).
async fn rebuild_gate(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    s: &Snapshot,
) -> Result<RepairResult> {
    let buyers: Vec<u64> = s.holders().into_iter().collect();
    let released: Vec<u64> = s.cancelled.iter().copied().collect();
    let deadlines: Vec<(i64, u64)> = s
        .pending
        .iter()
        .map(|(order, created)| (created + s.pay_timeout_ms, *order))
        .collect();
    let image = GateImage {
        total: s.total,
        begin_ms: s.begin_ms,
        end_ms: s.end_ms,
        pay_timeout_ms: s.pay_timeout_ms,
        stock: (s.mysql_stock - s.unpersisted().len() as i64).max(0),
        buyers: &buyers,
        released: &released,
        deadlines: &deadlines,
    };
    let seen = Seen {
        last_entry_id: &s.witness.last_entry_id,
        stock: &s.witness.stock,
        buyers: s.witness.buyers,
    };
    Ok(if publish_gate(conn, keys, &image, &seen).await? {
        RepairResult::Applied { unrepaired: false }
    } else {
        RepairResult::Moved
    })
}

/// `stock = wanted` only if it is still `seen` (a concurrent order moved it).
async fn fix_mysql_stock(db: &Db, voucher: u64, seen: i64, wanted: i64) -> Result<bool> {
    use mysql_async::prelude::*;
    if wanted < 0 {
        return Err(Error::Mysql(format!(
            "voucher {voucher}: more active orders than units; refusing to set a negative stock"
        )));
    }
    let mut conn = db.conn().await?;
    conn.exec_drop(
        "UPDATE seckill_voucher SET stock = ? WHERE voucher_id = ? AND stock = ?",
        (wanted, voucher, seen),
    )
    .await?;
    Ok(conn.affected_rows() == 1)
}
