//! What must hold once every fault healed and the workers went idle, read
//! from the stores and the answers the clients got, not from the code
//! under test: the invariants (docs/src/concepts/invariants.md) per voucher (tests/common/invariants.rs),
//! every buyer told success, bought or promoted holding that order in
//! MySQL (unless a fault the book lists as able to undo it did), every
//! payer told paid holding a paid order, no user past the per-user limit,
//! no unit free at the gate while a request for one waits, every gate
//! open and `reconcile --dry-run` clean.

use std::collections::BTreeMap;

use redis::AsyncCommands;
use seckill::store::keys::VoucherKeys;

use crate::common::invariants::{check_invariants, VoucherState};

use super::run::{Answer, Stage, Told};

/// The violations, and the answers a documented fault undid.
#[derive(Default, Debug)]
pub struct Verdict {
    pub violations: Vec<String>,
    pub undone: Vec<String>,
}

pub async fn judge(stage: &Stage) -> Verdict {
    let mut verdict = Verdict::default();
    let mut states: BTreeMap<u64, VoucherState> = BTreeMap::new();
    for v in &stage.plan.vouchers {
        match check_invariants(&stage.env, v.id).await {
            Ok(s) => {
                states.insert(v.id, s);
            }
            Err(broken) => verdict
                .violations
                .push(format!("voucher {}: {broken}", v.id)),
        }
    }
    let (told, limits, windows, in_hand, holds_taken) = {
        let h = stage.history.lock().unwrap();
        let mut windows = rollback_windows(&h.events, stage.plan.gate_check_ms, stage.plan.workers);
        if stage.plan.trim_before_restore {
            windows.extend(trimmed_windows(&h.events));
        }
        (
            h.told.clone(),
            h.limits.clone(),
            windows,
            h.in_hand.clone(),
            holds_taken(&h.events),
        )
    };
    let held = held_orders(stage).await;
    // A restored order is held (payment unknown) only when Redis kept
    // neither its deadline nor its release: it was paid. One whose buyer
    // never asked to pay keeps a unit from the sale for an operator who
    // needs none (the book, "When MySQL loses its last commits").
    for o in &held {
        let asked = told
            .iter()
            .any(|t| matches!(&t.answer, Answer::Paid(p) | Answer::PayRefused(p, _) if p == o));
        if !asked {
            verdict.violations.push(format!(
                "order {o} is held for the operator (restored, payment unknown) though its buyer never asked to pay it"
            ));
        }
    }
    for t in &told {
        let Some(s) = states.get(&t.voucher) else {
            continue;
        };
        if let Some(broken) = broken_promise(t, s) {
            // A payment MySQL lost with the order it paid: the order comes
            // back held for the operator, who asks the payment provider
            // (the book, "When MySQL loses its last commits").
            if matches!(t.answer, Answer::Paid(o) if held.contains(&o)) {
                verdict
                    .undone
                    .push(format!("{broken} (held for the operator)"));
                continue;
            }
            // A Redis gone back to a snapshot forgets the admissions made
            // since that no worker had persisted, and sells units MySQL no
            // longer has until the guard's next pass (the book, "When Redis
            // loses its last writes", what remains exposed).
            let undone = windows
                .iter()
                .any(|(from, to)| t.answered_ms >= *from && t.sent_ms <= *to)
                && matches!(
                    t.answer,
                    Answer::Success(_) | Answer::Bought(_) | Answer::Promoted(_)
                );
            // Unless a worker had it in hand: that batch is kept (the same
            // page, docs/src/concepts/redis-loss.md).
            let kept_by = match t.answer {
                Answer::Success(o) | Answer::Bought(Some(o)) | Answer::Promoted(Some(o)) => {
                    in_hand.get(&o)
                }
                _ => None,
            };
            // Nor once a held worker took the voucher's gate for the batch
            // Redis lost: from then on no reopen and no repair giving units
            // back succeeds while the hold is live, and the rebuild after
            // it counts the batch (the book, "Batches in hand"), so no
            // admission sent after that moment is exposed. Not a
            // promotion: the poll that saw it was sent after the hold, but
            // the release that made it may have come before (seed 7: a
            // release 5 ms before the hold, dead-lettered `no stock in
            // MySQL`, seen by a poll 280 ms after it).
            let after_hold = holds_taken
                .get(&t.voucher)
                .filter(|taken| t.sent_ms >= **taken)
                .filter(|_| !matches!(t.answer, Answer::Promoted(_)));
            match (undone, kept_by, after_hold) {
                (true, Some(who), _) => verdict.violations.push(format!(
                    "{broken}; its order was in the hand of {who} when Redis went back to its snapshot"
                )),
                (true, None, Some(taken)) => verdict.violations.push(format!(
                    "{broken}; sent after a held worker took the gate for the batch Redis lost ({taken} ms)"
                )),
                (true, None, None) => verdict.undone.push(broken),
                (false, _, _) => verdict.violations.push(broken),
            }
        }
    }
    for (v, s) in &states {
        let limit = limits.get(v).copied().unwrap_or(1) as u64;
        for (user, (order, _)) in &s.orders {
            if s.units(*order) > limit {
                verdict.violations.push(format!(
                    "voucher {v}: user {user}'s order {order} holds {} units, the limit was at most {limit}",
                    s.units(*order)
                ));
            }
        }
        let free = s.redis_stock.unwrap_or(0);
        if free > 0 && !s.waitlist.is_empty() && limit == 1 {
            verdict.violations.push(format!(
                "voucher {v}: {free} unit(s) free at the gate while {} request(s) for one wait",
                s.waitlist.len()
            ));
        }
    }
    paused_for_nothing(stage, &told, &mut verdict);
    paused_again(stage, &told, &mut verdict);
    witness_after_drop(stage, &mut verdict).await;
    gates_open(stage, &mut verdict).await;
    let (code, report) = stage.reconcile(&["--dry-run"]);
    if code != 0 {
        verdict.violations.push(format!(
            "reconcile --dry-run exit {code} after the workers went idle: {report}"
        ));
    }
    verdict
}

/// The guard's bound after a store's rollback, beyond its `--gate-check`:
/// one pass, with room for a loaded machine.
const GUARD_BOUND_MS: u64 = 1_500;

/// (from, to) in ms of the answers each store's rollback may undo. Redis:
/// from the snapshot it came back to (none, or back empty: from the start)
/// to the guard's next pass after it answered again (`--gate-check` and
/// a pass). MySQL: from the restore
/// to the guard's next pass (`--gate-check` and a pass), while a release of
/// a unit whose cancellation MySQL lost gives the gate a unit a pending
/// order holds, sold to a buyer whose order is then dead-lettered
/// (docs/src/concepts/mysql-loss.md, what remains exposed). A Redis
/// that came back while every worker was stopped is looked at by no guard
/// until one continues (SIGCONT, or started again after a kill): its
/// window reaches to the guard's pass after the first.
fn rollback_windows(
    events: &[(u64, String)],
    gate_check_ms: u64,
    workers: usize,
) -> Vec<(u64, u64)> {
    let mut snapshot = 0;
    let mut windows: Vec<(u64, u64)> = Vec::new();
    let mut stopped = std::collections::BTreeSet::new();
    // The window waiting for a worker to continue.
    let mut unwatched: Option<usize> = None;
    for (at, what) in events {
        // "worker 1", "worker 1 where it is held": the worker's number.
        let worker = |w: &str| {
            w.strip_prefix("worker ")
                .and_then(|n| n.split_whitespace().next())
                .map(str::to_string)
        };
        let stops = what
            .strip_prefix("fault: SIGSTOP ")
            .or(what.strip_prefix("fault: kill -9 "));
        let continues = what
            .strip_prefix("healed: SIGCONT ")
            .or(what.strip_suffix(" started again"));
        if let Some(w) = stops.and_then(worker) {
            stopped.insert(w);
        } else if let Some(w) = continues.and_then(worker) {
            stopped.remove(&w);
            if let Some(i) = unwatched.take() {
                windows[i].1 = windows[i].1.max(at + gate_check_ms + GUARD_BOUND_MS);
            }
        }
        if what.starts_with("fault: Redis killed -9") && stopped.len() >= workers {
            unwatched = Some(windows.len());
        }
        if what == super::run::MYSQL_RESTORE_BEGINS {
            windows.push((*at, at + gate_check_ms + GUARD_BOUND_MS));
        } else if what == super::run::REDIS_SNAPSHOT_BEGINS {
            snapshot = *at;
        } else if what.starts_with("fault: Redis killed -9, started empty") {
            windows.push((0, at + gate_check_ms + GUARD_BOUND_MS));
        } else if what.starts_with("fault: Redis killed -9") {
            windows.push((snapshot, at + gate_check_ms + GUARD_BOUND_MS));
        }
    }
    windows
}

/// (from, to) in ms of the answers MySQL may lose for good where the
/// stream was trimmed past its lost commits: from the dump it went back
/// to, to the trim. Nothing kept names those orders: the guard cannot
/// restore them, and the operator drops them by their count
/// (docs/src/concepts/mysql-loss.md, "Entries no longer kept").
fn trimmed_windows(events: &[(u64, String)]) -> Vec<(u64, u64)> {
    let mut dumped = None;
    let mut windows = Vec::new();
    for (at, what) in events {
        if what == "MySQL dumped" {
            dumped = Some(*at);
        } else if what.ends_with("acknowledged entries trimmed (--keep past)") {
            if let Some(from) = dumped.take() {
                windows.push((from, *at));
            }
        }
    }
    windows
}

/// Once the operator dropped the lost commits nothing kept names, the
/// gap is off the witness and the guard does not pause for it again, nor
/// for a gap its rebuild cannot close, which it accepts after one reopen
/// (the book, "Entries no longer kept"): no buyer is told `paused` after
/// the passes that follow (E39: the gate paused and reopened every pass).
/// Up to MySQL's second loss, if the plan has one: the guard pauses for
/// that loss, as it must.
fn paused_again(stage: &Stage, told: &[Told], verdict: &mut Verdict) {
    let Some(from) = stage.plan.no_pause_from_ms else {
        return;
    };
    let until = stage
        .history
        .lock()
        .unwrap()
        .events
        .iter()
        .find(|(_, what)| what == super::run::SECOND_DUMP)
        .map_or(u64::MAX, |(at, _)| *at);
    let after_the_drop = |t: &&Told| t.sent_ms >= from && t.sent_ms < until;
    for t in told.iter().filter(after_the_drop).filter(|t| is_paused(t)) {
        verdict.violations.push(format!(
            "voucher {}: user {} told paused ({:?}, sent at {} ms), after the guard had its passes over what the drop of the lost commits left (from {from} ms)",
            t.voucher, t.user, t.via, t.sent_ms
        ));
    }
}

/// Once the operator dropped the lost commits nothing kept names, the
/// gate's witness of commits (meta `committed`) counts MySQL's orders
/// again, no fewer: each run that drops the gap takes it off once, and
/// runs at once take it off once in all (E38: three took it off three
/// times, below 0; a witness left short hides that many commits of the
/// next loss).
async fn witness_after_drop(stage: &Stage, verdict: &mut Verdict) {
    use mysql_async::prelude::Queryable;
    if stage.plan.drop_lost_commits_at_ms.is_none() {
        return;
    }
    let mut redis = stage.env.new_redis_connection().await;
    let mut conn = stage.env.db().await.conn().await.expect("mysql");
    for v in &stage.plan.vouchers {
        let keys = VoucherKeys::new(&stage.env.prefix, v.id).expect("keys");
        let committed: Option<i64> = redis.hget(keys.meta(), "committed").await.unwrap_or(None);
        let total: Option<i64> = conn
            .exec_first(
                "SELECT orders_total FROM seckill_voucher WHERE voucher_id = ?",
                (v.id,),
            )
            .await
            .expect("orders_total");
        if committed.unwrap_or(0) != total.unwrap_or(0) {
            verdict.violations.push(format!(
                "voucher {}: the gate's witness counts {committed:?} committed orders, MySQL holds {total:?}, after the operator dropped the lost commits from three runs at once",
                v.id
            ));
        }
    }
}

/// Whether the buyer was told the gate is paused.
fn is_paused(t: &Told) -> bool {
    match &t.answer {
        Answer::Refused(why) => why == "paused",
        Answer::Unknown(what) => what.contains("\"outcome\":\"paused\""),
        _ => false,
    }
}

/// When a held worker was seen taking each voucher's gate for a batch
/// Redis lost (the first time), with the poll's lag as margin: the pause
/// it sets follows the line it logs by one round trip.
fn holds_taken(events: &[(u64, String)]) -> BTreeMap<u64, u64> {
    const MARGIN_MS: u64 = 100;
    let mut taken = BTreeMap::new();
    for (at, what) in events {
        if let Some(v) = what.strip_prefix(super::run::HOLD_TAKEN) {
            if let Ok(v) = v.parse::<u64>() {
                taken.entry(v).or_insert(at + MARGIN_MS);
            }
        }
    }
    taken
}

/// What a client was told that the stores do not keep, if anything.
fn broken_promise(t: &Told, s: &VoucherState) -> Option<String> {
    let held = s.orders.get(&t.user);
    let what = |kept: &str| {
        format!(
            "voucher {}: user {} told {:?} ({:?}, sent at {} ms, answered at {} ms); MySQL {kept}",
            t.voucher, t.user, t.answer, t.via, t.sent_ms, t.answered_ms
        )
    };
    let has = match held {
        Some((id, status)) => format!("has order {id} with status {status}"),
        None => "has no order of theirs".to_string(),
    };
    match &t.answer {
        Answer::Success(o) | Answer::Bought(Some(o)) | Answer::Promoted(Some(o)) => {
            (held.map(|h| h.0) != Some(*o)).then(|| what(&has))
        }
        Answer::Bought(None) | Answer::Promoted(None) => held.is_none().then(|| what(&has)),
        Answer::Paid(o) => (held != Some(&(*o, 1))).then(|| what(&has)),
        Answer::PayRefused(o, why) if why == "cancelled" || why == "deadline_passed" => {
            (held == Some(&(*o, 1))).then(|| what(&has))
        }
        _ => None,
    }
}

/// The orders restored held (payment unknown) after MySQL lost them and
/// still so: a held order cancelled since was not kept for the operator
/// (E37: the canceller cancelled it, the flag stays).
async fn held_orders(stage: &Stage) -> std::collections::BTreeSet<u64> {
    use mysql_async::prelude::Queryable;
    let mut conn = stage.env.db().await.conn().await.expect("mysql");
    let ids: Vec<u64> = conn
        .query("SELECT id FROM seckill_order WHERE held = 1 AND status = 0")
        .await
        .expect("held orders");
    ids.into_iter().collect()
}

/// A gate is paused only on a sign that a store lost writes (the book, "When
/// Redis loses its last writes": a changed run id, fewer buyers than
/// orders, a batch in hand whose entries are gone; "When MySQL loses its
/// last commits"); `reconcile` and `preload` only reopen (preload
/// publishes paused only over a live hold, which needs a lost batch).
/// Where the plan loses nothing in either store, a buyer told `paused`
/// was refused for nothing (E18: a worker frozen past its lease took the
/// entries another had taken over and acknowledged for lost; E04: a
/// resent preload emptied the gate's buyers).
fn paused_for_nothing(stage: &Stage, told: &[Told], verdict: &mut Verdict) {
    if stage.plan.loses_writes() {
        return;
    }
    for t in told {
        if is_paused(t) {
            verdict.violations.push(format!(
                "voucher {}: user {} told paused ({:?}, sent at {} ms) though no store lost writes",
                t.voucher, t.user, t.via, t.sent_ms
            ));
        }
    }
}

/// Whether the voucher's gate is paused (meta `paused`; unreadable: not).
pub async fn gate_paused(
    redis: &mut seckill::store::redis_conn::Redis,
    keys: &VoucherKeys,
) -> bool {
    let paused: Option<String> = redis.hget(keys.meta(), "paused").await.unwrap_or(None);
    paused.as_deref() == Some("1")
}

async fn gates_open(stage: &Stage, verdict: &mut Verdict) {
    let mut redis = stage.env.new_redis_connection().await;
    for v in &stage.plan.vouchers {
        let keys = VoucherKeys::new(&stage.env.prefix, v.id).expect("keys");
        if gate_paused(&mut redis, &keys).await {
            verdict.violations.push(format!(
                "voucher {}: its gate is still paused after every fault healed, the workers went idle and reconcile --yes ran",
                v.id
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rollback_windows;

    fn events(lines: &[(u64, &str)]) -> Vec<(u64, String)> {
        lines.iter().map(|(at, w)| (*at, w.to_string())).collect()
    }

    #[test]
    fn a_redis_back_while_every_worker_is_down_is_exposed_until_one_runs_again() {
        let mut e = events(&[
            (420, "Redis snapshot begins"),
            (1_542, "fault: kill -9 worker 0"),
            (1_545, "fault: SIGSTOP worker 1"),
            (1_897, "fault: Redis killed -9, started from its snapshot"),
            (3_646, "worker 0 started again"),
            (3_700, "healed: SIGCONT worker 1"),
        ]);
        assert_eq!(rollback_windows(&e, 300, 2), vec![(420, 3_646 + 1_800)]);
        // One worker still running: its guard looks at once.
        e.remove(2);
        assert_eq!(rollback_windows(&e, 300, 2), vec![(420, 1_897 + 1_800)]);
        // Frozen where it was held counts as stopped.
        let e = events(&[
            (0, "fault: SIGSTOP worker 0 where it is held"),
            (10, "fault: Redis killed -9, started empty"),
            (5_000, "healed: SIGCONT worker 0"),
        ]);
        assert_eq!(rollback_windows(&e, 300, 1), vec![(0, 5_000 + 1_800)]);
    }
}
