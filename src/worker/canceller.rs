//! Layer 5 inside `seckill worker`: cancel orders unpaid at their deadline
//! and give their units back, plus the MySQL sweep that catches deadlines
//! Redis lost. Runs as its own task (sleeping until the next due deadline,
//! at most a second) or, with --until-idle, inline in the first lane.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::options::DeadlineOptions;
use super::WorkerStats;
use crate::error::{Result, StoreFault};
use crate::gate::buckets::{Layout, Layouts};
use crate::gate::witness::{self, META_COMMITTED};
use crate::orders::deadline::{self, Due};
use crate::orders::{counters, payment, timeouts};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::{pipeline_per_item, Redis};
use crate::store::registry;
use crate::support::backoff::Backoff;
use crate::support::set_digest::SetDigest;
use crate::worker::fence;
use redis::AsyncCommands;

/// Redis's clock, the one authority for deadlines (docs/src/concepts/rules.md): on a
/// cluster, the clock of the node that holds the voucher (the keyed command
/// beside TIME routes the pipeline there).
async fn redis_time_ms(conn: &mut Redis, keys: &VoucherKeys) -> Result<i64> {
    let (t, _): ((i64, i64), bool) = redis::pipe()
        .cmd("TIME")
        .exists(keys.timeouts())
        .query_async(conn)
        .await?;
    Ok(crate::support::timespec::redis_time_ms(t))
}

/// Longest sleep between looks at the deadlines: deadlines scheduled by
/// other worker processes are noticed at least this often.
const MAX_SLEEP: Duration = Duration::from_secs(1);

pub struct Canceller {
    cfg: Arc<Config>,
    opts: DeadlineOptions,
    db: Db,
    conn: Redis,
    /// Mints the order ids of promotions.
    ids: Arc<OrderIds>,
    stats: Arc<WorkerStats>,
    /// Cached per voucher for the sweep.
    pay_timeouts: HashMap<u64, i64>,
    last_sweep: Option<Instant>,
    /// Per voucher, the cancellations the last sweep read, and whether it
    /// (or one before it, reading the same) looked at them in full.
    cancellations_seen: HashMap<u64, (Cancellations, bool)>,
    /// The vouchers' buckets: each has its own deadlines.
    layouts: Layouts,
    /// Its entry in a voucher's fence while it cancels, and that lease.
    owner: String,
    fence_lease: Duration,
    /// How long its transaction may take (`--mysql-timeout`).
    mysql_timeout: Duration,
}

/// A voucher's cancellations as a sweep reads them: the count and digest
/// of its gates' released sets (no digest: one gate's is unreadable), and
/// MySQL's count and digest of its cancelled orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cancellations {
    released: (u64, Option<SetDigest>),
    cancelled: (u64, SetDigest),
}

/// How a canceller enters a voucher's fence (worker/fence.rs) while it
/// cancels.
pub struct Fenced {
    /// Its entry's name.
    pub owner: String,
    /// The entry's lease, never renewed.
    pub lease: Duration,
    /// How long its transaction may take (`--mysql-timeout`).
    pub mysql_timeout: Duration,
}

impl Canceller {
    /// A canceller on a Redis connection of its own; `ids` mints the
    /// promotions' order ids.
    pub async fn new(
        cfg: Arc<Config>,
        opts: DeadlineOptions,
        db: Db,
        ids: Arc<OrderIds>,
        stats: Arc<WorkerStats>,
        fenced: Fenced,
    ) -> Result<Canceller> {
        Ok(Canceller {
            conn: crate::store::redis_conn::connect(&cfg).await?,
            cfg,
            opts,
            db,
            ids,
            stats,
            pay_timeouts: HashMap::new(),
            last_sweep: None,
            cancellations_seen: HashMap::new(),
            layouts: Default::default(),
            owner: fenced.owner,
            fence_lease: fenced.lease,
            mysql_timeout: fenced.mysql_timeout,
        })
    }

    /// Until `stop`: a pass, then sleep until the next deadline is due.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut backoff = Backoff::default();
        while !stop.is_cancelled() {
            let wait = match self.pass().await {
                Ok(_) => {
                    backoff.reset();
                    self.until_next_due().await.unwrap_or(MAX_SLEEP)
                }
                Err(e) => {
                    let b = backoff.retry_after(format_args!("payment deadlines: {e}"));
                    if let Ok(c) = crate::store::redis_conn::connect(&self.cfg).await {
                        self.conn = c;
                    }
                    b
                }
            };
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    async fn vouchers(&mut self) -> Result<Vec<u64>> {
        registry::members(&mut self.conn, &self.cfg.prefix).await
    }

    /// Every gate of every registered voucher (one per bucket).
    async fn gates(&mut self) -> Result<Vec<VoucherKeys>> {
        let vouchers = self.vouchers().await?;
        self.layouts
            .gates(&mut self.conn, &self.db, &self.cfg.prefix, &vouchers)
            .await
    }

    /// Handles every due deadline of every voucher (and the sweep when it is
    /// time); true when it did anything. Each voucher on its own: one whose
    /// deadlines fail (say its deadlines key has the wrong type) is logged,
    /// counted and retried next pass, and the others proceed. Only when
    /// every voucher failed (a store is down) does the pass fail, so the
    /// caller backs off and reconnects.
    pub async fn pass(&mut self) -> Result<bool> {
        let vouchers = self.vouchers().await?;
        let sweep_now = self
            .last_sweep
            .is_none_or(|t| t.elapsed() >= self.opts.sweep_every);
        let mut worked = false;
        let mut first_failure = None;
        let mut succeeded = false;
        for &voucher in &vouchers {
            // A voucher in buckets: what its healthy buckets did counts,
            // and its sweep runs, whatever one failing bucket did.
            let (w, failed) = match self
                .layouts
                .of(&mut self.conn, &self.db, &self.cfg.prefix, voucher)
                .await
            {
                Ok(layout) => self.claim_and_settle(&layout).await,
                Err(e) => (false, Some(e)),
            };
            worked |= w;
            let swept = match (failed.is_some(), sweep_now) {
                (false, true) => self.sweep(voucher).await.map(|swept| swept || w),
                _ => Ok(w),
            };
            let failed = match swept {
                Ok(s) => {
                    worked |= s;
                    failed
                }
                Err(e) => failed.or(Some(e)),
            };
            match failed {
                None => succeeded = true,
                Some(e) => {
                    // Partly done still counts as done for the pass.
                    succeeded |= w;
                    self.note_failure(voucher, &e).await;
                    first_failure.get_or_insert(e);
                }
            }
        }
        if sweep_now {
            self.last_sweep = Some(Instant::now());
        }
        match first_failure {
            Some(e) if !succeeded => Err(e),
            _ => Ok(worked),
        }
    }

    /// Claims and settles the due deadlines of each of the voucher's gates
    /// (one per bucket), a batch at a time.
    /// Returns whether any gate did something, and the first failure.
    async fn claim_and_settle(&mut self, layout: &Layout) -> (bool, Option<crate::Error>) {
        // One bucket whose master is down must not hold up the others'
        // cancellations: each is tried, the first failure reported.
        let (mut worked, mut failure) = (false, None);
        let gates = match layout.all_keys() {
            Ok(gates) => gates,
            Err(e) => return (false, Some(e)),
        };
        for keys in gates {
            match self.claim_and_settle_gate(&keys).await {
                Ok(w) => worked |= w,
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        (worked, failure)
    }

    async fn claim_and_settle_gate(&mut self, keys: &VoucherKeys) -> Result<bool> {
        let voucher = keys.voucher();
        let keys = keys.clone();
        let mut worked = false;
        loop {
            let lease = self.opts.lease.as_millis() as u64;
            let (now, due) =
                deadline::claim_due(&mut self.conn, &keys, lease, self.opts.batch).await?;
            if due.is_empty() {
                return Ok(worked);
            }
            worked = true;
            let full = due.len() == self.opts.batch;
            self.settle(voucher, &keys, &due, (now, Instant::now()))
                .await?;
            if !full {
                return Ok(worked);
            }
        }
    }

    /// A voucher whose deadlines failed: logged, counted here (metrics)
    /// and in Redis (`seckill:{V}:deadline_errors`, shown by `seckill status`).
    async fn note_failure(&mut self, voucher: u64, e: &crate::Error) {
        self.stats.add_deadline_error();
        tracing::warn!(
            "voucher {voucher}: payment deadlines failed ({e}); retrying it next pass, the other vouchers go on"
        );
        if let Ok(keys) = VoucherKeys::new(&self.cfg.prefix, voucher) {
            let counted: redis::RedisResult<i64> = self.conn.incr(keys.deadline_errors(), 1).await;
            if let Err(e) = counted {
                tracing::debug!("voucher {voucher}: could not count the failure: {e}");
            }
        }
    }

    /// Cancels in MySQL, then gives the units back in Redis. A crash between
    /// the two leaves the claimed deadline to come back after its lease;
    /// the cancellation is then found done and the release happens once.
    /// `claimed`: Redis's clock at the claim, and when that was here, to
    /// measure how late the cancellation committed.
    async fn settle(
        &mut self,
        voucher: u64,
        keys: &VoucherKeys,
        due: &[Due],
        (redis_now, at): (i64, Instant),
    ) -> Result<()> {
        let orders: Vec<u64> = due.iter().map(|d| d.order).collect();
        let Some(c) = self.cancel_claimed(voucher, keys, orders).await? else {
            return Ok(());
        };
        let committed = redis_now + at.elapsed().as_millis() as i64;
        let latest = due
            .iter()
            .map(|d| committed - d.deadline_ms)
            .max()
            .unwrap_or(0);
        self.stats.note_lateness(latest.max(0) as u64);
        crate::support::fault::point("after_cancel").await?;
        self.give_back(voucher, keys, &c).await
    }

    /// The first half of settling claimed deadlines: orders the gate saw
    /// paid lose their deadline and stay paid; the others are cancelled in
    /// MySQL (those it lost kept for their deadline). None: nothing was
    /// left to cancel. (`settle` runs it, notes the lateness, passes the
    /// `after_cancel` fault point, then runs [`Canceller::give_back`].)
    pub async fn cancel_claimed(
        &mut self,
        voucher: u64,
        keys: &VoucherKeys,
        orders: Vec<u64>,
    ) -> Result<Option<deadline::Cancellation>> {
        if orders.is_empty() {
            return Ok(None);
        }
        // One round trip, before MySQL: the gate's witness of commits (see
        // keep_lost; two reconcilers lowering it at once may take it below
        // 0) and which of these orders the gate saw paid and which it
        // released. A released one gave its unit away: never paid again,
        // whatever the paid set says (a late payer's step records it there).
        let (committed, paid, released): (Option<i64>, Vec<bool>, Vec<bool>) = redis::pipe()
            .hget(keys.meta(), META_COMMITTED)
            .cmd("SMISMEMBER")
            .arg(keys.paid())
            .arg(&orders)
            .cmd("SMISMEMBER")
            .arg(keys.released())
            .arg(&orders)
            .query_async(&mut self.conn)
            .await?;
        let seen: Vec<bool> = paid.iter().zip(&released).map(|(p, r)| *p && !r).collect();
        let orders = self.take_out_paid(voucher, keys, orders, &seen).await?;
        if orders.is_empty() {
            return Ok(None);
        }
        let mut c = self.cancel_fenced(keys, &orders).await?;
        keep_lost(voucher, &mut c, committed.unwrap_or(0).max(0) as u64);
        Ok(Some(c))
    }

    /// The second half: the cancelled orders' units back at the gate (the
    /// waitlist served first), the settled ones' deadlines dropped;
    /// deferred while the gate is paused.
    pub async fn give_back(
        &mut self,
        voucher: u64,
        keys: &VoucherKeys,
        c: &deadline::Cancellation,
    ) -> Result<()> {
        let r = deadline::release(
            &mut self.conn,
            keys,
            voucher,
            &c.cancelled,
            c.per_user_limit,
            &c.settled,
            &self.ids,
            deadline::WhilePaused::Defer,
        )
        .await?;
        if r.deferred {
            // Claimed, not released: they come back after their lease.
            tracing::debug!(
                "voucher {voucher}: its gate is paused; {} cancelled order(s) get their units back once it reopens",
                c.cancelled.len()
            );
        }
        self.stats
            .add_released(c.cancelled_now, r.released, r.promoted);
        if c.cancelled_now > 0 || r.released > 0 {
            tracing::debug!(
                "voucher {voucher}: {} unpaid order(s) cancelled, {} unit(s) given back, {} unit(s) to the waitlist",
                c.cancelled_now,
                r.released,
                r.promoted
            );
        }
        Ok(())
    }

    /// Orders the gate saw paid (`seen`: in its paid set) are never
    /// cancelled: one pending in MySQL lost its payment with the last
    /// commits of a MySQL that went back in time, and is paid again; their
    /// deadlines go. One MySQL has cancelled all the same (the payment
    /// lost, the order cancelled before the gate recorded the payment) is
    /// returned with the others: its cancellation's release gives its
    /// unit back, where dropping its deadline would leave the unit with
    /// no one to give it back (the checked model's finding M5).
    async fn take_out_paid(
        &mut self,
        voucher: u64,
        keys: &VoucherKeys,
        orders: Vec<u64>,
        seen: &[bool],
    ) -> Result<Vec<u64>> {
        let paid: Vec<u64> = orders
            .iter()
            .zip(seen)
            .filter(|(_, paid)| **paid)
            .map(|(o, _)| *o)
            .collect();
        if !paid.is_empty() {
            let again = payment::pay_again(&self.db, voucher, &paid).await?;
            if !again.is_empty() {
                tracing::warn!(
                    "voucher {voucher}: MySQL lost the payment of {} order(s) the gate saw paid (a failover to an asynchronous replica, or a backup restored): paid again, not cancelled: {}",
                    again.len(),
                    crate::store::db::join_ids(again.iter().copied())
                );
                self.stats.add_payments_restored(again.len() as u64);
            }
            let cancelled = deadline::cancelled_among(&self.db, voucher, &paid).await?;
            if !cancelled.is_empty() {
                tracing::warn!(
                    "voucher {voucher}: MySQL has cancelled {} order(s) the gate saw paid (their payment lost with MySQL's last commits): their units are given back: {}",
                    cancelled.len(),
                    crate::store::db::join_ids(cancelled.iter().copied())
                );
            }
            let done: Vec<u64> = paid
                .into_iter()
                .filter(|o| !cancelled.contains(o))
                .collect();
            timeouts::drop_paid(&mut self.conn, keys, &done).await?;
            return Ok(orders.into_iter().filter(|o| !done.contains(o)).collect());
        }
        Ok(orders)
    }

    /// The cancellation's transaction locks the voucher's row: fenced as
    /// a batch's is (worker/fence.rs). It is short and not renewed: one
    /// that outlives its lease may be ended by another worker, and is then
    /// tried again; one past `--mysql-timeout` is abandoned.
    async fn cancel_fenced(
        &mut self,
        keys: &VoucherKeys,
        orders: &[u64],
    ) -> Result<deadline::Cancellation> {
        fence::run(
            &mut self.conn,
            &self.db,
            (keys, &self.owner, self.fence_lease),
            // Its lease is not renewed: past it the session may be ended
            // by another worker, so it gives up by then itself.
            self.mysql_timeout.min(self.fence_lease),
            (async |_, _| {}, async || {}),
            async |mysql: &mut mysql_async::Conn| {
                deadline::cancel_unpaid(mysql, keys.voucher(), orders).await
            },
            |e: &crate::Error| e.store_fault() == Some(StoreFault::LockWaitTimeout),
        )
        .await
    }

    /// The backstop for one voucher: pending orders past deadline + grace,
    /// by Redis's clock (`now`, the clock their creation times come from),
    /// get a deadline due now unless Redis has one. They are cancelled and
    /// released by the claim path like any other, so a crash between the
    /// cancellation and the release is retried after the claim's lease.
    async fn sweep(&mut self, voucher: u64) -> Result<bool> {
        let layout = self
            .layouts
            .of(&mut self.conn, &self.db, &self.cfg.prefix, voucher)
            .await?;
        let keys = layout.keys(0)?;
        let now = redis_time_ms(&mut self.conn, &keys).await?;
        // Its failure leaves the older backstop below to run.
        let unreleased = match self.reschedule_unreleased(voucher, &layout, now).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("voucher {voucher}: unreleased cancellations not looked for: {e}");
                0
            }
        };
        let timeout = match self.pay_timeouts.get(&voucher) {
            Some(t) => *t,
            None => match deadline::pay_timeout_ms(&self.db, voucher).await {
                Ok(t) => {
                    self.pay_timeouts.insert(voucher, t);
                    t
                }
                // A voucher Redis knows and MySQL does not has no orders to sweep.
                Err(crate::Error::VoucherNotFound(_)) => return Ok(unreleased > 0),
                Err(e) => return Err(e),
            },
        };
        let cutoff = now - timeout - self.opts.sweep_grace.as_millis() as i64;
        let overdue =
            deadline::overdue_in_mysql(&self.db, voucher, cutoff, self.opts.batch).await?;
        if overdue.is_empty() {
            return Ok(unreleased > 0);
        }
        // Each order's deadline lives in its user's bucket.
        let mut missed = 0;
        for (keys, mine) in layout.split_orders(&overdue)? {
            let mine: Vec<u64> = mine.into_iter().map(|(order, _)| order).collect();
            missed += deadline::schedule_missing(&mut self.conn, &keys, &mine, now).await?;
        }
        if missed > 0 {
            tracing::warn!(
                "voucher {voucher}: {missed} pending order(s) past their payment deadline were missed by Redis (no deadline there); scheduled to be cancelled now"
            );
        }
        let delayed = overdue.len() - missed;
        if delayed > 0 {
            tracing::warn!(
                "voucher {voucher}: {delayed} pending order(s) are past their payment deadline + grace although Redis has their deadline (their cancellation was delayed, e.g. by a store outage)"
            );
        }
        Ok(missed > 0 || unreleased > 0)
    }

    /// The sweep's other backstop: cancelled orders whose unit no release
    /// is on its way to give back (a canceller that died between its
    /// cancellation and its release, after a payment MySQL lost had the
    /// gate drop the order's deadline: the checked model's finding M5).
    /// Seen by the sets' counts and digests: the voucher's gates' released
    /// sets disagree with MySQL's cancelled orders, and did the same way at
    /// the sweep before (a cancellation on its way to its release changes
    /// them between sweeps). Only then, once per such disagreement, are
    /// MySQL's cancelled orders read, and those a gate holds the buyer of
    /// and has not released get a deadline due now (one there, claimed or
    /// not, stays): the claim path finds them cancelled and gives their
    /// units back (release.lua gives one back once). How many got one.
    async fn reschedule_unreleased(
        &mut self,
        voucher: u64,
        layout: &Layout,
        now: i64,
    ) -> Result<usize> {
        let gates = layout.all_keys()?;
        // The gates first: a cancellation commits in MySQL before its
        // release, so one between the two reads shows as a disagreement,
        // which the next sweep reads changed.
        let mut released = (0, Some(SetDigest::default()));
        for (w, d) in witness::read_many_with_digests(&mut self.conn, &gates).await? {
            released.0 += w.released;
            released.1 = released
                .1
                .zip(SetDigest::parse(d.released.as_deref()))
                .map(|(a, b)| a.plus(b));
        }
        let cancelled = counters::cancellations(&self.db, voucher).await?;
        let seen = Cancellations {
            released,
            cancelled,
        };
        let looked = match self.cancellations_seen.get(&voucher) {
            Some((before, looked)) if *before == seen => *looked,
            // New: looked at if the next sweep reads it the same.
            _ => {
                self.cancellations_seen.insert(voucher, (seen, false));
                return Ok(0);
            }
        };
        if looked || seen.released == (cancelled.0, Some(cancelled.1)) {
            return Ok(0);
        }
        self.cancellations_seen.insert(voucher, (seen, true));
        let scheduled =
            deadline::schedule_unreleased(&mut self.conn, &self.db, layout, voucher, now).await?;
        if scheduled > 0 {
            tracing::warn!(
                "voucher {voucher}: {scheduled} cancelled order(s) never gave their unit back (MySQL has {} cancelled, the gates released {}) and had no deadline left to release them: scheduled to be released now",
                cancelled.0,
                released.0
            );
        }
        Ok(scheduled)
    }

    /// Time until the earliest deadline of any voucher (capped at a
    /// second), by Redis's clock: a worker host whose clock runs ahead must
    /// not see deadlines as due that the claim script (Redis's clock) will
    /// not hand out. A voucher whose deadlines cannot be read is left out
    /// (the pass reports it).
    pub async fn until_next_due(&mut self) -> Result<Duration> {
        let keys = self.gates().await?;
        // TIME goes with each voucher's read: on a cluster, the clock that
        // counts for a voucher is that of the node holding its deadlines.
        let replies = pipeline_per_item(&mut self.conn, &keys, false, true, |pipe, k| {
            pipe.cmd("TIME").zrange_withscores(k.timeouts(), 0, 0);
            Ok(())
        })
        .await?;
        let mut wait = MAX_SLEEP;
        for mut row in replies {
            if row.len() != 2 {
                continue;
            }
            let first = row.pop().unwrap_or(redis::Value::Nil);
            let time = row.pop().unwrap_or(redis::Value::Nil);
            let now = crate::support::timespec::redis_time_ms(
                redis::FromRedisValue::from_redis_value(time)
                    .map_err(|e| crate::Error::redis(format!("TIME: {e}")))?,
            );
            // A voucher whose deadlines cannot be read is left out.
            let Ok(first) = <Vec<(String, f64)> as redis::FromRedisValue>::from_redis_value(first)
            else {
                continue;
            };
            if let Some((_, at)) = first.first() {
                let at = *at as i64;
                wait = wait.min(Duration::from_millis((at - now).max(0) as u64));
            }
        }
        Ok(wait)
    }

    /// Whether any deadline is due now (for --until-idle).
    pub async fn any_due(&mut self) -> Result<bool> {
        Ok(self.until_next_due().await? == Duration::ZERO)
    }
}

/// Orders with a deadline that MySQL does not have: while MySQL holds fewer
/// orders than this gate saw workers commit (its witness, read before
/// MySQL, so a commit in between cannot make it look behind), MySQL lost
/// them and the gate guard restores them: their deadlines stay (claimed,
/// they come back after the lease), so the restore knows them unpaid and
/// the next claim cancels them. Dropped, they would come back held, their
/// payment unknown. Otherwise (deleted by hand) they are dropped.
fn keep_lost(voucher: u64, c: &mut deadline::Cancellation, committed: u64) {
    if c.missing.is_empty() {
        return;
    }
    if committed > c.orders_total {
        tracing::warn!(
            "voucher {voucher}: {} order(s) with a payment deadline are not in MySQL, which holds {} order(s) of the {committed} its workers committed: MySQL lost them; their deadlines are kept for the restore",
            c.missing.len(),
            c.orders_total
        );
        c.missing.clear();
        return;
    }
    for order in &c.missing {
        tracing::warn!(
            "voucher {voucher}: order {order} has a deadline but is not in MySQL; dropping the deadline"
        );
    }
    c.settled.append(&mut c.missing);
}
