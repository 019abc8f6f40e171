//! Repairing a voucher's drift: each write is conditional on the gate (or
//! MySQL's stock) being as it was read, so a repair computed from a stale
//! snapshot is refused instead of applied.

use super::classify::{Drift, DriftClass};
use super::snapshot::Snapshot;
use super::Options;
use crate::error::{Error, Result};
use crate::gate::policy::{self, Published};
use crate::gate::rebuilt::{publish_gate, BucketPlace, RebuiltGate};
use crate::orders::counters;
use crate::orders::deadline;
use crate::orders::restore;
use crate::orders::voucher;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::RedisConn;
use crate::store::registry;
use crate::store::scripts::{DIGEST_SYNC, RECONCILE};

pub(super) enum RepairResult {
    Applied {
        unrepaired: bool,
    },
    /// MySQL's stock was set right; the gate is decided on a fresh read.
    MysqlFixed,
    Moved,
    /// Applied but for the units to give back: a worker holds the gate (a
    /// batch in hand that Redis lost, missing from the view), or a paused
    /// gate's grace runs (within which such a worker may yet hold it), or
    /// it was paused again since the view. No reopen on it: the grace may
    /// end before the reopen, which would open the gate with cancellations
    /// not released.
    Held,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn repair(
    db: &Db,
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
    s: &Snapshot,
    drifts: &[Drift],
    opts: &Options,
    ids: Option<&OrderIds>,
) -> Result<RepairResult> {
    crate::support::fault::point("before_repair").await?;
    let has = |c: DriftClass| drifts.iter().any(|d| d.class == c);
    if has(DriftClass::CountersDrift) {
        recount_counters(db, voucher).await?;
        if drifts.len() == 1 {
            return Ok(RepairResult::Applied { unrepaired: false });
        }
    }
    if has(DriftClass::OrdersLostByMysql) || has(DriftClass::CancellationsLostByMysql) {
        // MySQL first, with the orders as the gate knows them now; the gate
        // is decided on a fresh read that has them.
        restore_lost_orders(db, voucher, s).await?;
        return Ok(RepairResult::MysqlFixed);
    }
    if has(DriftClass::MysqlInconsistent) {
        return repair_mysql_stock(db, voucher, s, opts).await;
    }
    if has(DriftClass::GateNotLoaded) {
        return rebuild_gate(db, conn, keys, voucher, s).await;
    }
    if has(DriftClass::PolicyDiffers) {
        republish_policy(db, conn, keys, voucher).await?;
    }
    if has(DriftClass::NotRegistered) {
        // Idempotent and outside the gate's own keys: no witness needed.
        registry::register(conn, keys).await?;
    }
    let fix = GateFix::of(s);
    if !fix.spoken.is_empty() {
        tracing::warn!(
            "voucher {voucher}: {} cancelled order(s) whose unit an order holds already (a release Redis lost): marked released, no unit given back",
            fix.spoken.len()
        );
    }
    let ids = match (fix.unreleased.is_empty() && fix.promotions == 0, ids) {
        (true, _) => None,
        (false, Some(ids)) => Some(ids),
        (false, None) => {
            // Found only now (not in the plan that decided on leasing ids).
            tracing::warn!(
                "voucher {voucher}: units to give back turned up during the repair; run reconcile again"
            );
            return Ok(RepairResult::Applied { unrepaired: true });
        }
    };
    let fresh: Vec<u64> = match ids {
        Some(ids) => (0..fix.promotions)
            .map(|_| ids.next_id())
            .collect::<Result<_>>()?,
        None => Vec::new(),
    };
    match apply_gate_fix(conn, keys, s, &fix, &fresh).await? {
        1 => {}
        2 => return Ok(RepairResult::Held),
        _ => return Ok(RepairResult::Moved),
    }
    if let (false, Some(ids)) = (fix.unreleased.is_empty(), ids) {
        // Under a pause (the guard's rebuild), the buyers were just
        // repaired on this view: the release may promote from them.
        let under = deadline::WhilePaused::RepairedUnder(&s.pause_token);
        let with_units: Vec<(u64, u64)> =
            fix.unreleased.iter().map(|o| (*o, s.units(*o))).collect();
        let limit = s.policy.per_user_limit;
        let done =
            deadline::release(conn, keys, voucher, &with_units, limit, &[], ids, under).await?;
        // A gate paused with no token (published paused by preload.lua
        // under a hold) defers every repair's release: its reopen attempt,
        // which drops a lapsed hold and gives it a token, is what lets
        // the next read go on, so it goes on to it as before. pause.lua's
        // pauses carry a token and, when they have one, the grace.
        if done.deferred && !s.pause_token.is_empty() {
            return Ok(RepairResult::Held);
        }
    }
    // Buyers whose orders MySQL may have lost with their entries are kept
    // (holders), and the gate's stock judged without giving units back:
    // not repaired until the operator names them.
    Ok(RepairResult::Applied {
        unrepaired: has(DriftClass::OrdersLostUnrestorable),
    })
}

/// The voucher row's order counters counted again from its orders.
async fn recount_counters(db: &Db, voucher: u64) -> Result<()> {
    // MySQL's own bookkeeping, counted again under the voucher row's
    // lock (so exact whatever moved since the snapshot); the gate is
    // not involved.
    if let Some(r) = counters::repair(db, voucher).await? {
        tracing::warn!(
            "voucher {voucher}: order counters were {:?}, counted again from the orders: {:?}",
            r.was,
            r.now
        );
    }
    Ok(())
}

/// The commits MySQL lost restored from the kept stream entries, and the
/// cancellations it lost made again.
async fn restore_lost_orders(db: &Db, voucher: u64, s: &Snapshot) -> Result<()> {
    let cancel: Vec<u64> = s.lost_cancellations.iter().copied().collect();
    let r = restore::restore(db, voucher, &s.lost_commits, &cancel).await?;
    tracing::warn!(
        "voucher {voucher}: restored {} order(s) MySQL lost from the kept stream entries: {} pending, {} cancelled (released at the gate, or past their deadline), {} held for the operator{}; cancelled again {} order(s) whose cancellation it lost",
        r.count(),
        r.pending,
        r.cancelled,
        r.held.len(),
        held_list(&r.held),
        r.cancelled_again
    );
    Ok(())
}

/// MySQL's stock set from its total and active orders, with `--fix-mysql`.
async fn repair_mysql_stock(
    db: &Db,
    voucher: u64,
    s: &Snapshot,
    opts: &Options,
) -> Result<RepairResult> {
    if !opts.fix_mysql {
        // The gate is repaired against MySQL; with MySQL itself wrong,
        // touching the gate could only spread the damage.
        tracing::error!(
            "voucher {voucher}: MySQL stock + active orders != total; not repairing (see --fix-mysql)"
        );
        return Ok(RepairResult::Applied { unrepaired: true });
    }
    // A bucket's figures are its share: MySQL's row is the voucher's.
    let (seen, wanted) = match &s.bucket {
        Some(b) => (b.units.mysql_stock, b.units.total - b.voucher_active),
        None => (s.mysql_stock, s.total - s.active_units()),
    };
    Ok(if fix_mysql_stock(db, voucher, seen, wanted).await? {
        RepairResult::MysqlFixed
    } else {
        RepairResult::Moved
    })
}

/// MySQL's policy published at the gate.
async fn republish_policy(
    db: &Db,
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
) -> Result<()> {
    // MySQL's policy as it is now, not as the snapshot saw it, with its
    // version: a `voucher update` since (or publishing meanwhile) must
    // not be undone.
    let now = voucher::get(db, voucher).await?.versioned_policy();
    if policy::publish(conn, keys, now).await? == Published::Newer {
        publish_over_foreign_version(db, conn, keys, voucher).await?;
    }
    Ok(())
}

/// What `lua/reconcile.lua` is to change at the gate, and the settled
/// cancelled units given back after it.
struct GateFix {
    /// The stock moved by this much.
    delta: i64,
    add: Vec<u64>,
    remove: Vec<u64>,
    /// (order, deadline ms) of pending orders missing theirs.
    deadlines: Vec<(u64, i64)>,
    /// Cancelled orders marked released with no unit given back.
    spoken: Vec<u64>,
    /// Settled cancelled orders whose unit is given back.
    unreleased: Vec<u64>,
    /// Waitlisted users the units given back may serve, each a new order.
    promotions: u64,
}

impl GateFix {
    fn of(s: &Snapshot) -> GateFix {
        // The expected stock already leaves out every cancelled unit not yet
        // back; the settled ones come back through release.lua after the
        // script (one unit each, to the waitlist or the stock), the settling
        // ones by their own release. So the script moves the stock by exactly
        // expected - gate.
        let mut delta = s.expected_gate_stock() - s.gate_stock.unwrap_or(0);
        if !s.unrestorable.is_empty() {
            // Units that look stuck may be held by buyers whose orders MySQL
            // lost with their entries (their quantities unknown): none given
            // back until the operator names them (classify.rs).
            delta = delta.min(0);
        }
        let holders = s.holders();
        let add: Vec<u64> = holders.difference(&s.buyers).copied().collect();
        let remove: Vec<u64> = s.buyers.difference(&holders).copied().collect();
        let deadlines: Vec<(u64, i64)> = s
            .deadlines_missing()
            .into_iter()
            .map(|(order, created)| (order, created + s.pay_timeout_ms))
            .collect();
        let spoken = s.spoken_for();
        let unreleased: Vec<u64> = s
            .cancelled_unreleased_settled()
            .into_iter()
            .filter(|o| !spoken.contains(o))
            .collect();
        // Units given back go to waitlisted users first, each with a new order:
        // with the gate's own stock they serve at most this many requests (a
        // bucket may hold more stock than that while requests wait, kept under
        // the mover's bound: it serves those, not this repair).
        let promotions = if delta > 0 {
            (delta as u64 + u64::from(s.policy.per_user_limit)).min(s.waiting)
        } else {
            0
        };
        GateFix {
            delta,
            add,
            remove,
            deadlines,
            spoken,
            unreleased,
            promotions,
        }
    }
}

/// Runs `lua/reconcile.lua` for `fix`, conditional on the witness read;
/// `fresh` are the ids of the orders promotions make. Returns the script's
/// answer: 1 applied, 2 a worker holds the gate or a pause's grace runs
/// (no unit given back), else the gate moved.
async fn apply_gate_fix(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    s: &Snapshot,
    fix: &GateFix,
    fresh: &[u64],
) -> Result<i64> {
    let mut inv = RECONCILE.prepare_invoke();
    inv.key(keys.stock())
        .key(keys.buyers())
        .key(keys.orders())
        .key(keys.released())
        .key(keys.timeouts())
        .key(keys.waitlist())
        .key(keys.events())
        .key(keys.meta())
        .key(keys.holds())
        .key(keys.waitlist_quantity())
        .arg(s.witness.args())
        .arg(fix.delta)
        .arg(fix.add.len());
    for u in &fix.add {
        inv.arg(*u);
    }
    inv.arg(fix.remove.len());
    for u in &fix.remove {
        inv.arg(*u);
    }
    inv.arg(fix.deadlines.len());
    for (order, at) in &fix.deadlines {
        inv.arg(*order).arg(*at);
    }
    inv.arg(fresh.len()).arg(fresh);
    inv.arg(fix.spoken.len()).arg(&fix.spoken);
    let applied: i64 = inv.invoke_async(conn).await?;
    Ok(applied)
}

/// ": held a, b, c" (the first few), or nothing.
fn held_list(held: &[u64]) -> String {
    if held.is_empty() {
        return String::new();
    }
    let few: Vec<String> = held.iter().take(10).map(u64::to_string).collect();
    let more = if held.len() > 10 { ", ..." } else { "" };
    format!(" (pay or unhold them: {}{more})", few.join(", "))
}

/// Sets the gate's digests that left their sets behind to the sets' (the
/// triples of [`Snapshot::digests_behind`]), each only if it still holds the
/// value read (`lua/digest_sync.lua`). Before any other repair of the gate:
/// those move the digests from there. Returns whether all were set.
pub(super) async fn sync_digests(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    behind: &[(&'static str, String, String)],
) -> Result<bool> {
    let mut inv = DIGEST_SYNC.prepare_invoke();
    inv.key(keys.meta());
    for (field, seen, digest) in behind {
        inv.arg(*field).arg(seen).arg(digest);
    }
    let written: usize = inv.invoke_async(conn).await?;
    Ok(written == behind.len())
}

/// The gate from MySQL, as preload builds it, but with the units in flight
/// held back (preload refuses in flight; reconcile accounts for it).
async fn rebuild_gate(
    db: &Db,
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
    s: &Snapshot,
) -> Result<RepairResult> {
    // The policy read now, with its version (the snapshot has none): the
    // script keeps a newer one that a `voucher update` published meanwhile.
    let policy = voucher::get(db, voucher).await?.versioned_policy();
    let buyers: Vec<u64> = s.holders().into_iter().collect();
    let released: Vec<u64> = s.cancelled.iter().copied().collect();
    let deadlines: Vec<(i64, u64)> = s
        .pending
        .iter()
        .filter(|(order, _)| !s.held.contains(order))
        .map(|(order, created)| (created + s.pay_timeout_ms, *order))
        .collect();
    let place = s.bucket.as_ref().map(|b| BucketPlace {
        bucket: b.bucket,
        buckets: b.buckets,
        tags: if b.bucket == 0 { &b.tags } else { "" },
        // Lost with bucket 0 (its tag): the share counts its units.
        pool: (b.bucket == 0).then_some(0),
    });
    let image = RebuiltGate {
        bucket: place,
        total: s.bucket.as_ref().map_or(s.total, |b| b.units.total),
        begin_ms: s.begin_ms,
        end_ms: s.end_ms,
        pay_timeout_ms: s.pay_timeout_ms,
        policy,
        stock: (s.mysql_stock - s.unpersisted_units()).max(0),
        buyers: &buyers,
        released: &released,
        deadlines: &deadlines,
    };
    Ok(if publish_gate(conn, keys, &image, &s.witness).await? {
        RepairResult::Applied { unrepaired: false }
    } else {
        RepairResult::Moved
    })
}

/// The gate refused MySQL's policy as older than its own. MySQL's version
/// only grows, and the gate's was read from MySQL before it was published,
/// so a gate version above MySQL's current one comes from another database
/// (MySQL restored from a backup, a prefix pointed at a new database): no
/// update would ever be published again. Then MySQL's policy replaces it
/// outright; otherwise an update published since, and the gate is current.
async fn publish_over_foreign_version(
    db: &Db,
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
) -> Result<()> {
    // The gate first: MySQL read after it is at least any version it holds.
    let Some(at_gate) = policy::version_at_gate(conn, keys).await? else {
        return Ok(());
    };
    let now = voucher::get(db, voucher).await?.versioned_policy();
    if now.version >= at_gate {
        return Ok(());
    }
    tracing::warn!(
        "voucher {voucher}: the gate's policy version {at_gate} is above MySQL's {}: replacing it with MySQL's policy",
        now.version
    );
    policy::publish_unversioned(conn, keys, now.policy).await?;
    policy::publish(conn, keys, now).await?;
    Ok(())
}

/// `stock = wanted` only if it is still `seen` (a concurrent order moved it).
async fn fix_mysql_stock(db: &Db, voucher: u64, seen: i64, wanted: i64) -> Result<bool> {
    use mysql_async::prelude::*;
    if wanted < 0 {
        return Err(Error::mysql(format!(
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
