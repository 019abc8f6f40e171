//! What reconcile tells the operator about a voucher.

use serde::Serialize;

use super::classify::Drift;
use super::quick::Agreed;
use super::snapshot::{Snapshot, VoucherUnits};

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
    /// Repaired but for the units to give back: a worker holds the gate (a
    /// batch in hand whose entries Redis lost), or a paused gate's grace
    /// runs; they go back once it has committed, or the grace has ended.
    /// Try again.
    Held,
}

#[derive(Debug, Clone, Serialize)]
pub struct VoucherReport {
    pub voucher: u64,
    /// One bucket of a voucher in buckets (one report each): then
    /// `mysql_total` and `mysql_stock` are the bucket's share of MySQL's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u32>,
    /// On bucket 0's report of a voucher in buckets: the voucher's units,
    /// wherever they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voucher_units: Option<VoucherUnits>,
    pub mysql_total: i64,
    pub mysql_stock: i64,
    pub orders_pending: u64,
    pub orders_paid: u64,
    pub orders_cancelled: u64,
    pub gate_loaded: bool,
    /// Admission is paused (after this run: a reopen clears it).
    pub gate_paused: bool,
    pub gate_stock: Option<i64>,
    pub expected_gate_stock: i64,
    pub buyers: u64,
    pub in_flight: u64,
    pub dead_letters: u64,
    pub drifts: Vec<Drift>,
    pub outcome: Outcome,
    /// The gate was paused (a worker found it had lost writes) and this run,
    /// having found or made it consistent, reopened it.
    pub reopened: bool,
    /// How the voucher was read: `quick` (counts and digests, compared
    /// without reading the sets) or `full` (every order, buyer, release and
    /// deadline: `--deep`, or a quick look that could not tell).
    pub read: ReadKind,
    /// A set digest at the gate is not its set's (a tool that changed the
    /// set without it): every look reads the voucher in full until a run
    /// without `--dry-run` sets it right.
    pub gate_digests_behind: bool,
    /// Pending orders held for the operator (**new**): restored after MySQL
    /// lost them, with no payment deadline Redis still knew (paid, or
    /// cancelled in MySQL, before the loss). Nothing cancels them; `seckill
    /// pay` or `seckill order unhold` settles each.
    pub orders_held: Vec<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadKind {
    Quick,
    Full,
}

/// A voucher that kept moving (or whose units another counts): nothing
/// written, to be looked at again.
pub fn busy_report(voucher: u64) -> VoucherReport {
    VoucherReport {
        voucher,
        bucket: None,
        voucher_units: None,
        mysql_total: 0,
        mysql_stock: 0,
        orders_pending: 0,
        orders_paid: 0,
        orders_cancelled: 0,
        gate_loaded: false,
        gate_paused: false,
        gate_stock: None,
        expected_gate_stock: 0,
        buyers: 0,
        in_flight: 0,
        dead_letters: 0,
        drifts: Vec::new(),
        outcome: Outcome::Busy,
        reopened: false,
        read: ReadKind::Full,
        gate_digests_behind: false,
        orders_held: Vec::new(),
    }
}

/// A voucher the quick look found consistent.
pub(super) fn agreed_report(a: &Agreed) -> VoucherReport {
    let c = &a.row.counters;
    VoucherReport {
        voucher: a.voucher,
        bucket: None,
        voucher_units: None,
        mysql_total: a.row.total,
        mysql_stock: a.row.stock,
        orders_pending: c.orders_pending(),
        orders_paid: c.orders_paid,
        orders_cancelled: c.orders_cancelled,
        gate_loaded: true,
        gate_paused: a.gate_paused,
        gate_stock: Some(a.gate_stock),
        expected_gate_stock: a.expected_gate_stock,
        buyers: a.buyers,
        in_flight: a.in_flight,
        dead_letters: a.dead_letters,
        drifts: Vec::new(),
        outcome: Outcome::Consistent,
        reopened: false,
        read: ReadKind::Quick,
        gate_digests_behind: false,
        // A held order has no deadline: the quick look never agrees on it.
        orders_held: Vec::new(),
    }
}

pub(super) fn report_of(s: &Snapshot, drifts: Vec<Drift>, expected: i64) -> VoucherReport {
    VoucherReport {
        voucher: s.voucher,
        bucket: s.bucket.as_ref().map(|b| b.bucket),
        voucher_units: s.bucket.as_ref().filter(|b| b.bucket == 0).map(|b| b.units),
        mysql_total: s.total,
        mysql_stock: s.mysql_stock,
        orders_pending: s.pending.len() as u64,
        orders_paid: s.paid as u64,
        orders_cancelled: s.cancelled.len() as u64,
        gate_loaded: s.gate_loaded,
        gate_paused: s.gate_paused,
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
        reopened: false,
        read: ReadKind::Full,
        gate_digests_behind: false,
        orders_held: s.held.iter().copied().collect(),
    }
}
