//! Classifying a snapshot's differences: pure, so every class and the
//! expected gate stock are unit-tested without a store.

use std::collections::BTreeSet;

use serde::Serialize;

use super::snapshot::Snapshot;

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
    /// Orders a worker committed and acknowledged that MySQL no longer has
    /// (it lost its last commits), their stream entries still kept: their
    /// buyers keep their units and stay buyers, and the orders are
    /// restored into MySQL with their ids (orders/restore.rs).
    OrdersLostByMysql,
    /// MySQL lost more commits than the kept entries show (the gate's
    /// witness of commits is ahead of its orders): the buyers with no order
    /// anywhere may be theirs, so none is dropped and the gate's stock is
    /// left as it is, until the operator drops them by their count.
    OrdersLostUnrestorable,
    /// Pending orders in MySQL whose unit the gate gave back: MySQL lost
    /// their cancellation. Cancel them in MySQL again.
    CancellationsLostByMysql,
    /// Cancelled orders whose unit never came back at the gate.
    CancelledNotReleased,
    /// Pending orders with no payment deadline in Redis.
    DeadlineMissing,
    /// MySQL itself: stock + pending + paid ≠ total.
    MysqlInconsistent,
    /// The voucher row's order counters are not what its orders add up to
    /// (an order changed by a tool that does not keep them).
    CountersDrift,
    /// The gate's admission policy (rate limit, tokens) is not MySQL's.
    PolicyDiffers,
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
            DriftClass::OrdersLostByMysql => {
                "restore the orders into MySQL from the kept stream entries (their buyers and units kept)"
            }
            DriftClass::CancellationsLostByMysql => {
                "cancel them in MySQL again (their units are back at the gate)"
            }
            DriftClass::OrdersLostUnrestorable => {
                "keep their buyers and units; drop them only with --drop-lost-commits <amount>"
            }
            DriftClass::CancelledNotReleased => "give their units back (release path)",
            DriftClass::DeadlineMissing => "schedule their deadlines",
            DriftClass::MysqlInconsistent => "set stock = total - active (only with --fix-mysql)",
            DriftClass::CountersDrift => "count the orders again into the voucher row",
            DriftClass::PolicyDiffers => "publish MySQL's policy at the gate",
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
    // I1 in units: stock + Σ quantity(pending, paid) = total.
    let active = s.active_units();
    if s.mysql_stock + active != s.total {
        out.push(Drift {
            class: DriftClass::MysqlInconsistent,
            amount: (s.mysql_stock + active - s.total).unsigned_abs(),
            sample: Vec::new(),
            action: DriftClass::MysqlInconsistent.action(),
        });
    }
    if s.counters != s.recounted {
        out.push(Drift {
            class: DriftClass::CountersDrift,
            amount: s.counters.distance(&s.recounted),
            sample: Vec::new(),
            action: DriftClass::CountersDrift.action(),
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
    if s.policy != s.gate_policy {
        out.push(Drift {
            class: DriftClass::PolicyDiffers,
            amount: 1,
            sample: Vec::new(),
            action: DriftClass::PolicyDiffers.action(),
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
    } else if stock < expected && s.unrestorable.is_empty() {
        // Not with buyers whose orders MySQL may have lost: their units
        // are unknown (no entry says how many), and what looks stuck may
        // be theirs.
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
    // Settled ones, and settling ones whose unit an order holds already
    // (their release must not give it again).
    let mut unreleased = s.cancelled_unreleased_settled();
    unreleased.extend(s.spoken_for());
    let no_deadline: BTreeSet<u64> = s.deadlines_missing().iter().map(|(o, _)| *o).collect();
    let lost: BTreeSet<u64> = s.lost_commits.iter().map(|l| l.user).collect();
    for (class, ids) in [
        (DriftClass::OrdersLostByMysql, &lost),
        (DriftClass::OrdersLostUnrestorable, &s.unrestorable),
        (DriftClass::CancellationsLostByMysql, &s.lost_cancellations),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Voucher of 10 units: users 1 and 2 hold pending orders 101 and 102,
    /// user 3 paid order 103; the gate agrees.
    fn consistent() -> Snapshot {
        Snapshot {
            voucher: 7,
            total: 10,
            mysql_stock: 7,
            pay_timeout_ms: 1_000,
            pending: vec![(101, 5), (102, 6)],
            paid: 1,
            paid_units: 1,
            order_ids: [101, 102, 103].into(),
            order_users: [1, 2, 3].into(),
            gate_loaded: true,
            registered: true,
            gate_stock: Some(7),
            buyers: [1, 2, 3].into(),
            deadlines: [101, 102].into(),
            ..Default::default()
        }
    }

    fn classes(s: &Snapshot) -> Vec<(DriftClass, u64)> {
        classify(s).0.iter().map(|d| (d.class, d.amount)).collect()
    }

    #[test]
    fn a_consistent_voucher_has_no_drift() {
        let s = consistent();
        let (drifts, expected) = classify(&s);
        assert!(drifts.is_empty(), "{drifts:?}");
        assert_eq!(expected, 7);
    }

    #[test]
    fn every_count_is_in_units() {
        let mut s = consistent();
        // Order 101 holds 3 units and 103 (paid) 2: MySQL's stock is 4.
        s.quantities = [(101, 3), (103, 2)].into();
        s.paid_units = 2;
        s.mysql_stock = 4;
        s.gate_stock = Some(4);
        assert_eq!(classes(&s), []);
        // Two units admitted at the gate, not yet in MySQL.
        s.in_flight = vec![(4, 104)];
        s.quantities.insert(104, 2);
        s.buyers.insert(4);
        s.gate_stock = Some(2);
        assert_eq!(classes(&s), []);
        assert_eq!(classify(&s).1, 2);
        // MySQL off by one unit.
        s.mysql_stock = 5;
        assert_eq!(classify(&s).0[0].class, DriftClass::MysqlInconsistent);
        assert_eq!(classify(&s).0[0].amount, 1);
    }

    #[test]
    fn gate_stock_is_compared_with_mysql_less_work_in_flight() {
        let mut s = consistent();
        // User 4 admitted at the gate, not yet in MySQL: one unit taken there only.
        s.in_flight = vec![(4, 104)];
        s.buyers.insert(4);
        s.gate_stock = Some(6);
        assert_eq!(classes(&s), []);
        assert_eq!(classify(&s).1, 6);
        // Once persisted (in MySQL and still in flight) it counts once.
        s.order_ids.insert(104);
        s.order_users.insert(4);
        s.mysql_stock = 6;
        s.pending.push((104, 7));
        s.deadlines.insert(104);
        assert_eq!(classes(&s), []);

        s.gate_stock = Some(9);
        assert_eq!(classes(&s), [(DriftClass::RedisStockHigh, 3)]);
        s.gate_stock = Some(2);
        assert_eq!(classes(&s), [(DriftClass::RedisStockLow, 4)]);
    }

    #[test]
    fn buyers_are_compared_with_order_holders() {
        let mut s = consistent();
        s.buyers.remove(&2);
        s.buyers.insert(9);
        assert_eq!(
            classes(&s),
            [
                (DriftClass::BuyersMissing, 1),
                (DriftClass::BuyersWithoutOrder, 1)
            ]
        );
        let (drifts, _) = classify(&s);
        assert_eq!(drifts[0].sample, [2]);
        assert_eq!(drifts[1].sample, [9]);
    }

    #[test]
    fn a_cancellation_is_drift_only_once_it_had_time_to_be_released() {
        let mut s = consistent();
        // Order 102 cancelled in MySQL (its unit back there), not released at the gate.
        s.pending.retain(|(o, _)| *o != 102);
        s.cancelled.insert(102);
        s.mysql_stock = 8;
        s.settling.insert(102);
        assert_eq!(classes(&s), [], "still settling");
        assert_eq!(classify(&s).1, 7, "its unit is not expected back yet");
        s.settling.clear();
        assert_eq!(classes(&s), [(DriftClass::CancelledNotReleased, 1)]);
        s.released.insert(102);
        s.gate_stock = Some(8);
        assert_eq!(classes(&s), []);
    }

    #[test]
    fn a_pending_order_without_a_deadline_is_drift_unless_it_is_new() {
        let mut s = consistent();
        s.deadlines.remove(&102);
        assert_eq!(classes(&s), [(DriftClass::DeadlineMissing, 1)]);
        s.settling.insert(102);
        assert_eq!(classes(&s), []);
    }

    #[test]
    fn a_lost_gate_is_reported_alone_and_an_unregistered_one_as_such() {
        let mut s = consistent();
        s.registered = false;
        assert_eq!(classes(&s), [(DriftClass::NotRegistered, 1)]);
        s.gate_loaded = false;
        s.gate_stock = None;
        s.buyers.clear();
        assert_eq!(classes(&s), [(DriftClass::GateNotLoaded, 1)]);
    }

    #[test]
    fn a_counter_that_is_not_what_the_rows_add_up_to_is_drift() {
        let mut s = consistent();
        s.counters.orders_total = 3;
        s.recounted.orders_total = 3;
        assert_eq!(classes(&s), []);
        s.counters.orders_paid = 2;
        s.recounted.orders_paid = 1;
        assert_eq!(classes(&s), [(DriftClass::CountersDrift, 1)]);
    }

    #[test]
    fn mysql_disagreeing_with_itself_is_reported_first() {
        let mut s = consistent();
        s.mysql_stock = 5;
        let c = classes(&s);
        assert_eq!(c[0], (DriftClass::MysqlInconsistent, 2));
    }
}
