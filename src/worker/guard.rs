//! The gate guard: finds gates that may have lost writes MySQL already holds
//! (Redis restarted from older data, or a replica took over before it had
//! them), pauses their admission, rebuilds them from MySQL with the
//! reconcile logic (in-flight work accounted for), and reopens them.
//!
//! Two signs, looked at every pass:
//! - The server holding the voucher is another one than last pass, or than
//!   the one the gate's meta records (`run_id`, written by the guard once a
//!   pass has dealt with it): its run id changed, a restart or a failover.
//!   Only then can acknowledged writes be gone, so the gate is paused and
//!   checked in full. This sign cannot be hidden by what happens before the
//!   pass (a lost user buying again, new buyers taking the units MySQL no
//!   longer has), and the record in meta gives it to a worker that was not
//!   running at the time (cron): meta comes back with the old server's id.
//!   The new id is recorded only once the pause succeeded, so a pause that
//!   failed is tried again on the next pass.
//! - The gate has fewer buyers than MySQL has orders: every order's user
//!   became a buyer at the gate before the order could be committed, and
//!   nothing takes a buyer with an order away. MySQL is read first, so an
//!   order committed in between had its buyer recorded before it. This
//!   covers what the first sign cannot see (a restart while no worker ran).
//!
//! And one of the mirror case, MySQL that lost its last commits (a failover
//! to an asynchronous replica, a backup restored): the voucher's gates
//! count the orders workers inserted into MySQL (meta `committed`, bumped
//! by lua/finish.lua with each acknowledgement) and hold the cancelled
//! orders whose units came back (the released set: each was cancelled in
//! MySQL first), and MySQL holds fewer orders, or fewer cancelled ones,
//! than that. Redis is read first here, so a commit in between only
//! raises MySQL's counts. The gates are paused (reason
//! `mysql_lost_commits`) and rebuilt by reconcile, which restores the lost
//! orders from their kept stream entries and reopens them; buyers it
//! cannot restore keep the gate paused for the operator.
//!
//! A pause carries a grace (`--lock-lease`): a worker holding a batch whose
//! entries the restart lost notices within a third of its lease and holds
//! the gate until that batch is committed (lua/pause.lua), so no rebuild
//! reopens the gate on a view that misses the batch.
//!
//! A lost admission takes its stock decrement with it (one script, one
//! write to the AOF and the replicas), so such a gate also has units MySQL
//! no longer has: left open, it would tell new buyers "success" for orders
//! MySQL must refuse, and let earlier buyers buy again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{FromRedisValue, Value};
use tokio_util::sync::CancellationToken;

use super::recount::{Counted, Recounts};
use super::WorkerStats;
use crate::error::{Error, Result};
use crate::gate::mover_lease;
use crate::gate::pause::{self, PauseReason, Paused, META_PAUSED};
use crate::gate::witness::{self, MysqlBehind, META_COMMITTED, META_FORGOTTEN};
use crate::orders::counters;
use crate::reconcile::{self, Outcome};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::layout::Layout;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::{self, pipeline_per_item, Redis};
use crate::store::registry;
use crate::store::scripts::{RUN_ID, RUN_ID_SOURCE};
use crate::support::backoff::Backoff;

/// Cancellations and new orders younger than this are still a worker's
/// business, not drift (reconcile's default).
pub const SETTLE: Duration = Duration::from_secs(60);
/// How often a paused gate that needs an operator is checked again.
const OPERATOR_RETRY: Duration = Duration::from_secs(30);
/// How often a voucher in buckets has its orders counted per bucket even
/// when nothing points at a loss (each count reads every order of it).
const RECOUNT_EVERY: Duration = Duration::from_secs(30);
/// A gate paused longer than this is worth a warning of its own.
const LONG_PAUSE: Duration = Duration::from_secs(10);

pub struct GateGuard {
    pub(super) cfg: Arc<Config>,
    pub(super) db: Db,
    pub(super) conn: Redis,
    pub(super) ids: Arc<OrderIds>,
    pub(super) stats: Arc<WorkerStats>,
    timing: GuardTiming,
    /// Its token as the holder of a mover lease it seizes (unique).
    owner: String,
    state: GuardState,
}

/// The guard's clocks.
#[derive(Debug, Clone, Copy)]
pub struct GuardTiming {
    /// Between passes.
    pub every: Duration,
    /// No gate this guard pauses reopens sooner (the workers' lock lease).
    pub grace: Duration,
    /// Cancellations and orders younger than this are left to the workers
    /// by its rebuilds ([`SETTLE`]; the conformance walks, whose every
    /// order is young, take none).
    pub settle: Duration,
}

/// What the guard remembers between passes.
#[derive(Default)]
pub struct GuardState {
    /// Every voucher seen (registry, MySQL): one the registry lost is still
    /// watched. Seeded on the first pass.
    known: Option<BTreeSet<u64>>,
    /// The run id of the server that held each gate last pass.
    run_ids: HashMap<GateId, String>,
    /// Paused gates this guard is rebuilding, and since when.
    paused: HashMap<GateId, Pause>,
    /// The layouts of vouchers in buckets, as MySQL recorded them (final
    /// once recorded; bucket 0's meta may have lost them).
    layouts: HashMap<u64, Layout>,
    /// Gates gone from Redis whole (with orders in MySQL), since when this
    /// guard has seen them so: rebuilt only after the grace.
    missing_since: HashMap<GateId, Instant>,
    /// When each voucher in buckets last had its orders counted per bucket.
    counted_at: HashMap<u64, Instant>,
    /// Vouchers in buckets whose rebuild may have held units back.
    recounts: Recounts,
    /// What MySQL lacked of a voucher when a rebuild last found nothing
    /// left to restore (a released order it never had, whose entry is
    /// gone): not paused for again unless it grows.
    accepted: HashMap<u64, MysqlBehind>,
    /// What MySQL lacked of a voucher right after a rebuild reopened its
    /// gates: the same again next pass means the rebuild could not close
    /// it.
    reopened_with: HashMap<u64, MysqlBehind>,
    /// The last raise of a witness failed (said once until one succeeds).
    raise_failing: bool,
}

/// A gate the guard watches: a voucher's one gate, or one bucket of a
/// voucher in buckets (each on its own master: a lost write on one pauses
/// and rebuilds that bucket alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct GateId {
    voucher: u64,
    bucket: u32,
    buckets: u32,
}

impl std::fmt::Display for GateId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.buckets {
            0 | 1 => write!(f, "voucher {}", self.voucher),
            _ => write!(f, "voucher {}, bucket {}", self.voucher, self.bucket),
        }
    }
}

struct Pause {
    since: Instant,
    /// The last rebuild attempt.
    tried: Option<Instant>,
    /// Said once that it takes long, or that it needs an operator.
    warned: bool,
    /// Reconcile cannot repair it alone (MySQL inconsistent): it waits for
    /// `seckill reconcile --fix-mysql`, not for this worker.
    needs_operator: bool,
}

impl Pause {
    fn new() -> Pause {
        Pause {
            since: Instant::now(),
            tried: None,
            warned: false,
            needs_operator: false,
        }
    }
}

/// One gate as the guard reads it.
struct GateSigns {
    loaded: bool,
    buyers: u64,
    paused: bool,
    run_id: Option<String>,
    /// The run id the gate's meta records (the guard's own, last pass).
    recorded_run_id: Option<String>,
}

/// The meta field recording the run id of the server a guard last saw
/// holding the gate.
const META_RUN_ID: &str = "run_id";

/// What a look at a loaded gate leaves to do.
enum Looked {
    /// Open, nothing to fear, or caught up since the look.
    Done,
    /// Paused: to be rebuilt; why, when paused by this look.
    Paused(Option<String>),
}

impl GateGuard {
    pub fn new(
        cfg: Arc<Config>,
        db: Db,
        conn: Redis,
        ids: Arc<OrderIds>,
        stats: Arc<WorkerStats>,
        owner: String,
        timing: GuardTiming,
    ) -> GateGuard {
        GateGuard {
            cfg,
            db,
            conn,
            ids,
            stats,
            timing,
            owner,
            state: GuardState::default(),
        }
    }

    pub async fn run(mut self, stop: CancellationToken) {
        let mut backoff = Backoff::default();
        loop {
            let passed = self.pass().await;
            self.stats.add_guard_pass();
            let delay = match passed {
                Ok(()) => {
                    backoff.reset();
                    self.timing.every
                }
                Err(e) => {
                    let delay = backoff.retry_after(format_args!("gate guard: {e}"));
                    if matches!(e, Error::Redis { .. } | Error::RedisConnect { .. }) {
                        if let Ok(c) = redis_conn::connect(&self.cfg).await {
                            self.conn = c;
                        }
                    }
                    delay
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Looks at every voucher once: pauses those that may have lost writes,
    /// and rebuilds and reopens those paused. One voucher's failure is
    /// logged and the others go on; the pass fails only when the stores
    /// cannot be read at all.
    pub async fn pass(&mut self) -> Result<()> {
        let vouchers = self.vouchers_to_watch().await?;
        let (gates, keys) = self.gates_of(&vouchers).await?;
        // Redis first for the commits MySQL lost, MySQL first for the writes
        // Redis lost: see the module comment.
        let (seen, forgotten) = self.commits_seen(&gates, &keys).await?;
        let totals = counters::totals_per_voucher(&self.db, &vouchers).await?;
        let orders: HashMap<u64, u64> = totals.iter().map(|(v, (n, _))| (*v, *n)).collect();
        let lost_commits: HashMap<u64, MysqlBehind> = seen
            .iter()
            .map(|(v, (committed, released))| {
                let (n, cancelled) = totals.get(v).copied().unwrap_or((0, 0));
                (*v, MysqlBehind::of(*committed, *released, n, cancelled))
            })
            .filter(|(_, behind)| !behind.is_none())
            .collect();
        self.stats
            .set_mysql_commits_lost(lost_commits.values().map(MysqlBehind::sum).sum());
        self.accept_what_a_rebuild_could_not_restore(&lost_commits);
        match crate::orders::restore::held_count(&self.db).await {
            Ok(n) => self.stats.set_orders_held(n),
            Err(e) => tracing::debug!("gate guard: held orders not counted: {e}"),
        }
        let looks = self.look_at(&keys).await?;
        let per_bucket = self.orders_per_bucket(&gates, &looks, &orders).await;
        // Before the rebuilds, with the counts just read: a pass stopped
        // between raises nothing on counts another step made old (the
        // checked model's guard raises in its check).
        let read = (&seen, forgotten.as_slice());
        self.raise_witnesses(&gates, &keys, (&orders, &per_bucket), read, &lost_commits)
            .await;
        let loaded_somewhere: BTreeSet<u64> = gates
            .iter()
            .zip(&looks)
            .filter(|(_, l)| l.as_ref().is_ok_and(|l| l.loaded))
            .map(|(id, _)| id.voucher)
            .collect();
        for ((id, k), look) in gates.iter().zip(&keys).zip(looks) {
            let held = orders.get(&id.voucher).copied().unwrap_or(0);
            let (sign, live) = match id.buckets {
                0 | 1 => (held, held > 0),
                _ => {
                    let counted = per_bucket.get(&id.voucher);
                    let sign = counted.and_then(|c| c.get(id.bucket as usize)).copied();
                    // A bucket gone whole while its voucher sells holds
                    // units, orders or not: rebuilt, not left for a
                    // preload (refused once the sale began).
                    (
                        sign.unwrap_or(0),
                        held > 0 || loaded_somewhere.contains(&id.voucher),
                    )
                }
            };
            let mut lost = lost_commits.get(&id.voucher).copied().unwrap_or_default();
            if self
                .state
                .accepted
                .get(&id.voucher)
                .is_some_and(|a| a.covers(&lost))
            {
                lost = MysqlBehind::default();
            }
            let done = match look {
                Ok(look) => self.watch(*id, k, &look, (sign, lost), live).await,
                Err(e) => Err(e),
            };
            if let Err(e) = done {
                tracing::warn!("gate guard, {id}: {e}");
            }
        }
        self.recount_owed().await;
        let working = self
            .state
            .paused
            .values()
            .filter(|p| !p.needs_operator)
            .count();
        self.stats.set_gates_paused(working as u64);
        Ok(())
    }

    /// The vouchers this guard watches: those it knew (or, at the first
    /// pass, every candidate of the stores) and every registered one.
    async fn vouchers_to_watch(&mut self) -> Result<Vec<u64>> {
        let mut known = match self.state.known.take() {
            Some(k) => k,
            None => reconcile::candidates(&self.db, &mut self.conn, &self.cfg.prefix)
                .await?
                .into_iter()
                .collect(),
        };
        known.extend(registry::members(&mut self.conn, &self.cfg.prefix).await?);
        let vouchers: Vec<u64> = known.iter().copied().collect();
        self.state.known = Some(known);
        Ok(vouchers)
    }

    /// Each voucher's gates (one per bucket) and their keys.
    async fn gates_of(&mut self, vouchers: &[u64]) -> Result<(Vec<GateId>, Vec<VoucherKeys>)> {
        // MySQL's word on the split: a bucket 0 that lost its meta reads as
        // a voucher of one gate, which a rebuild would make of every
        // bucket's users and stock.
        let split = crate::orders::voucher_buckets::split_in_buckets(&self.db, vouchers).await?;
        let mut gates: Vec<GateId> = Vec::with_capacity(vouchers.len());
        let mut keys: Vec<VoucherKeys> = Vec::with_capacity(vouchers.len());
        for &v in vouchers {
            if !split.contains(&v) {
                gates.push(GateId {
                    voucher: v,
                    bucket: 0,
                    buckets: 1,
                });
                keys.push(VoucherKeys::new(&self.cfg.prefix, v)?);
                continue;
            }
            // Not laid out yet (never preloaded): nothing to watch.
            let Some(layout) = self.layout_of(v).await? else {
                continue;
            };
            for b in 0..layout.buckets() {
                gates.push(GateId {
                    voucher: v,
                    bucket: b,
                    buckets: layout.buckets(),
                });
                keys.push(layout.keys(b)?);
            }
        }
        Ok((gates, keys))
    }

    /// A voucher reopened last pass with MySQL lacking what nothing kept
    /// could restore, and lacking the same now: accepted, not paused for
    /// again unless it grows.
    fn accept_what_a_rebuild_could_not_restore(
        &mut self,
        lost_commits: &HashMap<u64, MysqlBehind>,
    ) {
        for (v, was) in std::mem::take(&mut self.state.reopened_with) {
            match lost_commits.get(&v) {
                Some(now) if *now == was => {
                    tracing::warn!(
                        "voucher {v}: MySQL still lacks {} order(s) and {} cancellation(s) the gates saw, which nothing kept can restore; not paused for again unless it grows (see `seckill reconcile --dry-run --voucher {v}`)",
                        now.orders,
                        now.cancellations
                    );
                    self.state.accepted.insert(v, was);
                }
                _ => {}
            }
        }
    }

    /// Each gate as one pipeline reads it: loaded, buyers, paused, the
    /// server's run id and the one meta records.
    async fn look_at(&mut self, keys: &[VoucherKeys]) -> Result<Vec<Result<GateSigns>>> {
        let rows = pipeline_per_item(&mut self.conn, keys, false, true, |pipe, k| {
            pipe.hexists(k.meta(), "begin_ms")
                .scard(k.buyers())
                .hget(k.meta(), META_PAUSED)
                .cmd("EVAL")
                .arg(RUN_ID_SOURCE)
                .arg(1)
                .arg(k.meta())
                .hget(k.meta(), META_RUN_ID);
            Ok(())
        })
        .await?;
        Ok(rows.into_iter().map(look_of).collect())
    }

    /// Handles one gate.
    /// `counts`: MySQL's orders of the gate, and what MySQL lacks of what
    /// its voucher's gates saw it commit.
    async fn watch(
        &mut self,
        v: GateId,
        keys: &VoucherKeys,
        look: &GateSigns,
        counts: (u64, MysqlBehind),
        live: bool,
    ) -> Result<()> {
        let (orders, behind) = counts;
        if !look.loaded {
            return self.gone_whole(v, keys, look, live).await;
        }
        self.state.missing_since.remove(&v);
        let why = match self.pause_if_lost(v, keys, look, (orders, behind)).await? {
            Looked::Done => return Ok(()),
            Looked::Paused(why) => why,
        };
        if let Some(why) = why {
            self.paused_now(v, &why);
            crate::support::fault::point("gate_paused").await?;
        }
        let pause = self.state.paused.entry(v).or_insert_with(Pause::new);
        // One that waits for an operator is looked at again now and then,
        // not every pass (each look is a full reconcile read).
        if pause.needs_operator && pause.tried.is_some_and(|t| t.elapsed() < OPERATOR_RETRY) {
            return Ok(());
        }
        pause.tried = Some(Instant::now());
        self.rebuild(v, keys).await?;
        if !behind.is_none() && !self.state.paused.contains_key(&v) {
            // What the rebuild left, not what this pass saw: a gap it
            // closed is no gap to accept, though one of the same size may
            // open before the next pass (a batch in flight at the failover,
            // whose commit MySQL lost, acknowledged since: M7). Never
            // orders: a rebuild reopens only once it restored the lost
            // orders kept entries name and took the rest off the witness,
            // so orders lacking after it are such a batch's. Nor while
            // another gate of the voucher is paused: its rebuild may
            // restore yet.
            let left = MysqlBehind {
                orders: 0,
                ..self.behind_now(v.voucher).await?
            };
            let all_open = !self.state.paused.keys().any(|g| g.voucher == v.voucher);
            if left.is_none() || !all_open {
                self.state.reopened_with.remove(&v.voucher);
            } else {
                self.state.reopened_with.insert(v.voucher, left);
            }
        }
        Ok(())
    }

    /// What MySQL lacks of `voucher` now, read as a pass reads it: its
    /// gates' witnesses first, then MySQL's counts.
    async fn behind_now(&mut self, voucher: u64) -> Result<MysqlBehind> {
        let (gates, keys) = self.gates_of(&[voucher]).await?;
        let (seen, _) = self.commits_seen(&gates, &keys).await?;
        let totals = counters::totals_per_voucher(&self.db, &[voucher]).await?;
        let (committed, released) = seen.get(&voucher).copied().unwrap_or_default();
        let (orders, cancelled) = totals.get(&voucher).copied().unwrap_or_default();
        Ok(MysqlBehind::of(committed, released, orders, cancelled))
    }

    /// A gate lost whole admits nobody ("unknown voucher"): nothing to
    /// pause. Rebuilt only when MySQL holds orders of it (what Redis lost)
    /// or, a bucket, its voucher sells on (`live`); one without orders
    /// waits for `seckill preload`.
    async fn gone_whole(
        &mut self,
        v: GateId,
        keys: &VoucherKeys,
        look: &GateSigns,
        live: bool,
    ) -> Result<()> {
        self.record_run_id(v, keys, look).await?;
        self.state.paused.remove(&v);
        if !live {
            self.state.missing_since.remove(&v);
            return Ok(());
        }
        // Rebuilt open: only after the grace a pause would have (from
        // when this loss was first seen, not from an earlier pause), and
        // when no worker holds it (a batch Redis lost, in hand).
        let since = *self
            .state
            .missing_since
            .entry(v)
            .or_insert_with(Instant::now);
        if since.elapsed() < self.timing.grace || pause::is_held(&mut self.conn, keys).await? {
            return Ok(());
        }
        self.state.missing_since.remove(&v);
        tracing::warn!(
            "{v}: the gate is gone from Redis while MySQL holds its orders or its voucher sells: rebuilding it from MySQL"
        );
        self.rebuild(v, keys).await
    }

    /// Pauses a loaded gate that may have lost writes (its server changed,
    /// MySQL lacks commits it saw, fewer buyers than MySQL's orders):
    /// Paused with why it was paused now (None: paused already), or Done
    /// when it is open and has nothing to fear.
    async fn pause_if_lost(
        &mut self,
        v: GateId,
        keys: &VoucherKeys,
        look: &GateSigns,
        counts: (u64, MysqlBehind),
    ) -> Result<Looked> {
        let (orders, behind) = counts;
        let moved = look.run_id.as_ref().and_then(|now| {
            [self.state.run_ids.get(&v), look.recorded_run_id.as_ref()]
                .into_iter()
                .flatten()
                .find(|before| *before != now)
                .map(|before| (before.clone(), now.clone()))
        });
        let why = if let Some((before, now)) = moved {
            let paused = pause::pause(
                &mut self.conn,
                keys,
                None,
                self.timing.grace,
                PauseReason::RedisLostWrites,
            )
            .await?;
            // Only now: a pause that failed is tried again next pass.
            self.record_run_id(v, keys, look).await?;
            let changed = format!(
                "the Redis server holding it changed (run id {}.. -> {}..: a restart or a failover)",
                &before[..8.min(before.len())],
                &now[..8.min(now.len())]
            );
            match paused {
                Paused::Now => Some(format!("{changed}, so writes may be lost")),
                // A batch in hand that saw its loss first paused it: the
                // operator still learns why the gate is checked.
                Paused::Already => {
                    tracing::warn!("{v}: {changed} while the gate was paused already; it reopens only once checked against MySQL");
                    // As a pause made now: the rebuild's reads come next.
                    crate::support::fault::point("gate_paused").await?;
                    None
                }
                Paused::NotNeeded | Paused::NotLoaded => None,
            }
        } else if !behind.is_none() && !look.paused {
            self.record_run_id(v, keys, look).await?;
            // No grace: Redis lost nothing, so no worker holds a batch it
            // lost (were it so, the run id's sign pauses with one).
            let reason = PauseReason::MysqlLostCommits;
            match pause::pause(&mut self.conn, keys, None, Duration::ZERO, reason).await? {
                Paused::Now => {
                    // Counted apart from the gate_pauses of Redis's losses.
                    self.stats.add_mysql_loss_pause();
                    self.state.paused.insert(v, Pause::new());
                    tracing::warn!(
                        "{v}: MySQL holds {} order(s) fewer of voucher {} than its workers committed, and {} cancellation(s) fewer than its gates gave units back for: MySQL lost commits (a failover to an asynchronous replica, or a backup restored); admission paused until they are restored from what Redis kept",
                        behind.orders,
                        v.voucher,
                        behind.cancellations
                    );
                    crate::support::fault::point("gate_paused").await?;
                    None
                }
                Paused::NotNeeded | Paused::NotLoaded => return Ok(Looked::Done),
                Paused::Already => None,
            }
        } else if look.buyers < orders && !look.paused {
            self.record_run_id(v, keys, look).await?;
            match pause::pause(&mut self.conn, keys, Some(orders), self.timing.grace, PauseReason::RedisLostWrites).await? {
                Paused::Now => Some(format!(
                    "the gate has {} buyer(s) but MySQL holds {orders} order(s) of its users: Redis lost writes",
                    look.buyers
                )),
                // Caught up since the look (an admission in between).
                Paused::NotNeeded | Paused::NotLoaded => return Ok(Looked::Done),
                Paused::Already => None,
            }
        } else if !look.paused {
            self.record_run_id(v, keys, look).await?;
            self.state.paused.remove(&v);
            return Ok(Looked::Done);
        } else {
            self.record_run_id(v, keys, look).await?;
            None
        };
        Ok(Looked::Paused(why))
    }

    /// Remembers the server now holding the gate, here and in its meta
    /// (where a guard started later finds it).
    async fn record_run_id(
        &mut self,
        v: GateId,
        keys: &VoucherKeys,
        look: &GateSigns,
    ) -> Result<()> {
        let Some(id) = &look.run_id else {
            return Ok(());
        };
        self.state.run_ids.insert(v, id.clone());
        if look.loaded && look.recorded_run_id.as_ref() != Some(id) {
            let _: String = RUN_ID
                .key(keys.meta())
                .arg(id)
                .invoke_async(&mut self.conn)
                .await?;
        }
        Ok(())
    }

    /// Per voucher (summed over its buckets), what its gates saw MySQL
    /// commit: the orders workers inserted, and the cancelled orders whose
    /// units came back (each was cancelled in MySQL first). And per gate,
    /// in `gates`' order, how many gaps were taken off its witness (for
    /// the raise). One pipeline.
    async fn commits_seen(
        &mut self,
        gates: &[GateId],
        keys: &[VoucherKeys],
    ) -> Result<(HashMap<u64, (u64, u64)>, Vec<u64>)> {
        let rows = pipeline_per_item(&mut self.conn, keys, false, false, |pipe, k| {
            pipe.hget(k.meta(), META_COMMITTED)
                .scard(k.released())
                .hget(k.meta(), META_FORGOTTEN);
            Ok(())
        })
        .await?;
        let mut out: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut forgotten = Vec::with_capacity(gates.len());
        for (id, row) in gates.iter().zip(rows) {
            let (committed, released, gaps): (Option<i64>, u64, Option<u64>) =
                FromRedisValue::from_redis_value(Value::Array(row))
                    .map_err(|e| Error::redis(format!("{id}: committed: {e}")))?;
            let seen = out.entry(id.voucher).or_default();
            // Two reconcilers lowering it at once may take it below 0.
            seen.0 += committed.unwrap_or(0).max(0) as u64;
            seen.1 += released;
            forgotten.push(gaps.unwrap_or(0));
        }
        Ok((out, forgotten))
    }

    /// Sets each gate's witness of commits back up to MySQL's count of its
    /// orders this pass (read after the witness), where it is short of
    /// it: Redis went back in time (a rebuild raises it too, but leaves
    /// out the entries in flight then, which count at their
    /// acknowledgement, inserted or found stored as they inserted it), or
    /// restored orders. A witness short by N hides N orders of MySQL's
    /// next loss. Never for a voucher whose MySQL lacks
    /// orders its gates saw committed (that gap is the loss's sign), nor
    /// over a gap taken off since this pass read the witness; a gate in
    /// buckets only on a pass that counted its orders.
    async fn raise_witnesses(
        &mut self,
        gates: &[GateId],
        keys: &[VoucherKeys],
        counted: (&HashMap<u64, u64>, &HashMap<u64, Vec<u64>>),
        read: (&HashMap<u64, (u64, u64)>, &[u64]),
        lost_commits: &HashMap<u64, MysqlBehind>,
    ) {
        let (orders, per_bucket) = counted;
        let (seen, forgotten) = read;
        let mut due: Vec<(GateId, witness::Raise)> = Vec::new();
        for ((id, k), &forgotten) in gates.iter().zip(keys).zip(forgotten) {
            if lost_commits.get(&id.voucher).is_some_and(|b| b.orders > 0) {
                continue;
            }
            let held = match id.buckets {
                0 | 1 => {
                    let held = orders.get(&id.voucher).copied().unwrap_or(0);
                    // One gate: the voucher's count is the gate's.
                    if seen.get(&id.voucher).map_or(0, |s| s.0) >= held {
                        continue;
                    }
                    held
                }
                _ => match per_bucket
                    .get(&id.voucher)
                    .and_then(|c| c.get(id.bucket as usize))
                {
                    Some(&held) if held > 0 => held,
                    _ => continue,
                },
            };
            let keys = k.clone();
            due.push((
                *id,
                witness::Raise {
                    keys,
                    held,
                    forgotten,
                },
            ));
        }
        let (ids, raises): (Vec<GateId>, Vec<witness::Raise>) = due.into_iter().unzip();
        let results = match witness::raise_many(&mut self.conn, &raises).await {
            Ok(each) => each,
            Err(e) => vec![Err(e)],
        };
        for (id, raised) in ids.iter().zip(results) {
            match raised {
                Ok(_) => self.state.raise_failing = false,
                // Said once, not every pass: the fix of a short witness is
                // off while it fails (an ACL without the script's commands?).
                Err(e) if !self.state.raise_failing => {
                    self.state.raise_failing = true;
                    tracing::warn!(
                        "gate guard, {id}: its witness of commits could not be set back up to MySQL's count ({e}); a MySQL loss of up to what it lacks would go unseen until it can"
                    );
                }
                Err(e) => tracing::debug!("gate guard, {id}: witness not raised: {e}"),
            }
        }
    }

    fn paused_now(&mut self, v: GateId, why: &str) {
        self.stats.add_gate_pause();
        self.state.paused.insert(v, Pause::new());
        tracing::warn!("{v}: {why}; admission paused until the gate is checked against MySQL");
    }

    /// Reconcile's repair for the voucher (which reopens a gate it finds or
    /// makes consistent, if it has a buyer for every order).
    async fn rebuild(&mut self, v: GateId, keys: &VoucherKeys) -> Result<()> {
        let opts = reconcile::Options {
            dry_run: false,
            fix_mysql: false,
            attempts: 5,
            settle_ms: self.timing.settle.as_millis() as i64,
            // It rebuilds from what it reads: every member, not digests.
            deep: true,
            drop_lost_commits: None,
        };
        let checked = match v.buckets {
            0 | 1 => {
                reconcile::reconcile_voucher(
                    &self.db,
                    &mut self.conn,
                    &self.cfg.prefix,
                    v.voucher,
                    None,
                    &opts,
                    Some(&self.ids),
                )
                .await
            }
            _ => self.rebuild_bucket(v, &opts).await,
        };
        let report = match checked {
            Ok(r) => r,
            Err(Error::VoucherNotFound(_)) => {
                // Not a voucher of MySQL's: nothing to rebuild it from.
                pause::reopen(&mut self.conn, keys, 0, None).await?;
                self.state.paused.remove(&v);
                tracing::warn!("{v}: not in MySQL; its gate is left as it is");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let what = drift_summary(&report.drifts);
        let pause = self.state.paused.get_mut(&v);
        if v.buckets > 1 && (report.reopened || report.outcome == Outcome::Repaired) {
            // Its stock set from a share read while the other buckets sold
            // on, which may have come out low (recount.rs).
            self.state.recounts.owe(v.voucher);
        }
        let restored: u64 = report
            .drifts
            .iter()
            .filter(|d| d.class == reconcile::DriftClass::OrdersLostByMysql)
            .map(|d| d.amount)
            .sum();
        if restored > 0 && matches!(report.outcome, Outcome::Repaired | Outcome::NotRepaired) {
            self.stats.add_orders_restored(restored);
        }
        if report.reopened {
            let since = pause
                .map(|p| format!(" after {}", round_ms(p.since.elapsed())))
                .unwrap_or_default();
            self.state.paused.remove(&v);
            self.stats.add_gate_reopen();
            tracing::warn!("{v}: gate checked against MySQL ({what}) and reopened{since}");
            return Ok(());
        }
        let Some(pause) = pause else {
            // Not paused (a gate rebuilt whole): nothing to reopen.
            return Ok(());
        };
        match report.outcome {
            Outcome::NotRepaired => {
                if !pause.needs_operator {
                    tracing::warn!(
                        "{v}: its gate stays paused ({what}); {}",
                        operator_step(&report.drifts, v.voucher)
                    );
                }
                pause.needs_operator = true;
                pause.warned = true;
            }
            // Reopened by someone else meanwhile, or not yet enough buyers:
            // the next pass looks again.
            Outcome::Consistent | Outcome::Repaired
                if !pause::is_paused(&mut self.conn, keys).await? =>
            {
                self.state.paused.remove(&v);
            }
            _ if !pause.warned && pause.since.elapsed() > LONG_PAUSE => {
                pause.warned = true;
                let why = match report.outcome {
                    Outcome::Consistent | Outcome::Repaired | Outcome::Held => {
                        "a worker holds it (a batch in hand whose entries Redis lost, not committed yet), its pause's grace runs (one lock lease), or requests admitted past MySQL's stock are still in flight".to_string()
                    }
                    other => format!("it could not be checked yet ({other:?})"),
                };
                tracing::warn!(
                    "{v}: its gate has been paused for {} and stays paused: {why}; retrying",
                    round_ms(pause.since.elapsed()),
                );
            }
            _ => {}
        }
        Ok(())
    }
}

impl GateGuard {
    /// The layout of a voucher in buckets, as MySQL recorded it (None:
    /// not laid out yet).
    async fn layout_of(&mut self, v: u64) -> Result<Option<Layout>> {
        if let Some(layout) = self.state.layouts.get(&v) {
            return Ok(Some(layout.clone()));
        }
        let recorded = crate::gate::buckets::recorded(&self.db, &self.cfg.prefix, v).await?;
        if let Some(layout) = &recorded {
            self.state.layouts.insert(v, layout.clone());
        }
        Ok(recorded)
    }

    /// MySQL's orders per bucket, for each voucher in buckets whose buyers
    /// add up to fewer than its orders, that this guard looks at for the
    /// first time (a worker started after a restart: cron), or that was
    /// last counted `RECOUNT_EVERY` ago: the sign of a loss the run ids
    /// cannot show, bucket by bucket. MySQL counts them (N rows back), but
    /// it reads every order of the voucher, so not every pass.
    async fn orders_per_bucket(
        &mut self,
        gates: &[GateId],
        looks: &[Result<GateSigns>],
        orders: &HashMap<u64, u64>,
    ) -> HashMap<u64, Vec<u64>> {
        let mut buyers: HashMap<u64, (u32, u64)> = HashMap::new();
        for (id, look) in gates.iter().zip(looks) {
            if id.buckets <= 1 {
                continue;
            }
            let e = buyers.entry(id.voucher).or_insert((id.buckets, 0));
            e.1 += look.as_ref().map_or(0, |l| l.buyers);
        }
        let mut out = HashMap::new();
        for (v, (n, buyers)) in buyers {
            let held = orders.get(&v).copied().unwrap_or(0);
            // On the first look, and now and then as well: a loss with no
            // restart behind it (a key evicted or deleted) shows in one
            // bucket's buyers, which another bucket's buyers still in
            // flight can hide in the sum.
            let stale = self
                .state
                .counted_at
                .get(&v)
                .is_none_or(|t| t.elapsed() >= RECOUNT_EVERY);
            if held == 0 || (buyers >= held && !stale) {
                continue;
            }
            self.state.counted_at.insert(v, Instant::now());
            match counters::orders_per_bucket(&self.db, v, n).await {
                Ok(counts) => {
                    out.insert(v, counts);
                }
                Err(e) => tracing::warn!("gate guard, voucher {v}: {e}"),
            }
        }
        out
    }

    /// Rebuilds one bucket with the voucher's mover held still: the
    /// bucket's stock is judged by every unit elsewhere (reconcile's
    /// buckets.rs), which only a mover that cannot move keeps still. The
    /// lease goes back after, or runs out if this worker dies.
    async fn rebuild_bucket(
        &mut self,
        v: GateId,
        opts: &reconcile::Options,
    ) -> Result<reconcile::VoucherReport> {
        let Some(layout) = self.layout_of(v.voucher).await? else {
            return Err(Error::VoucherNotFound(v.voucher));
        };
        let gates = layout.all_keys()?;
        let owner = &self.owner;
        if mover_lease::seize(&mut self.conn, &gates, owner, reconcile::MOVER_HOLD)
            .await?
            .is_none()
        {
            // Another guard or reconcile counts the voucher's units: the
            // bucket stays paused until a later pass.
            return Ok(reconcile::busy_report(v.voucher));
        }
        let check = reconcile::BucketCheck {
            layout: &layout,
            bucket: v.bucket,
            judged: reconcile::StockJudged::Here,
            hold: Some(&self.owner),
            others_may_move: true,
        };
        let checked =
            reconcile::reconcile_bucket(&self.db, &mut self.conn, check, opts, Some(&self.ids))
                .await;
        if let Err(e) = mover_lease::unseize(&mut self.conn, &gates[0], &self.owner).await {
            tracing::debug!(
                "gate guard, {v}: the mover lease was not given back ({e}); it runs out"
            );
        }
        checked
    }
}

impl GateGuard {
    /// Counts again, once their buckets are still, the vouchers whose
    /// rebuild may have held units back (recount.rs); one voucher's failure
    /// is logged and the others go on.
    async fn recount_owed(&mut self) {
        for voucher in self.state.recounts.owed() {
            // A bucket paused still: its rebuild comes first.
            if self.state.paused.keys().any(|g| g.voucher == voucher) {
                continue;
            }
            let layout = match self.layout_of(voucher).await {
                Ok(Some(layout)) => layout,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!("gate guard, voucher {voucher}: {e}");
                    continue;
                }
            };
            let opts = reconcile::Options {
                dry_run: false,
                fix_mysql: false,
                attempts: 2,
                settle_ms: self.timing.settle.as_millis() as i64,
                deep: true,
                drop_lost_commits: None,
            };
            let counted = self
                .state
                .recounts
                .look(&self.db, &mut self.conn, &layout, &self.ids, &opts)
                .await;
            match counted {
                Ok(Counted::Repaired { drifts, given_back }) => {
                    let what = match given_back {
                        true => "what a rebuild held back is on sale again",
                        false => "repaired",
                    };
                    tracing::warn!(
                        "voucher {voucher}: counted again once its buckets were still ({}): {what}",
                        drift_summary(&drifts)
                    );
                }
                Ok(Counted::Consistent) => tracing::info!(
                    "voucher {voucher}: counted again once its buckets were still: nothing held back"
                ),
                Ok(Counted::NotRepaired(drifts)) => tracing::warn!(
                    "voucher {voucher}: counted again once its buckets were still, but not all repaired ({}); {}",
                    drift_summary(&drifts),
                    operator_step(&drifts, voucher)
                ),
                Ok(Counted::NotYet | Counted::Busy) => {}
                Err(e) => tracing::warn!(
                    "gate guard, voucher {voucher}: counting it again failed ({e}); trying again later"
                ),
            }
        }
    }
}

/// What an operator does about drift a repair left.
fn operator_step(drifts: &[reconcile::Drift], voucher: u64) -> String {
    let has = |c: reconcile::DriftClass| drifts.iter().any(|d| d.class == c);
    if has(reconcile::DriftClass::MysqlInconsistent) {
        format!("MySQL's stock disagrees with its orders: run `seckill reconcile --voucher {voucher} --fix-mysql`")
    } else if let Some(d) = drifts
        .iter()
        .find(|d| d.class == reconcile::DriftClass::OrdersLostUnrestorable)
    {
        format!(
            "MySQL lost more committed orders than the kept stream entries show, so {} buyer(s) without an order may be theirs (kept, their units kept): restore those orders from a backup or the application's records, or drop the buyers with `seckill reconcile --voucher {voucher} --drop-lost-commits {}`",
            d.amount, d.amount
        )
    } else {
        format!("see `seckill reconcile --dry-run --voucher {voucher}`")
    }
}

/// "class amount, ..." of what reconcile found, or "nothing to repair".
fn drift_summary(drifts: &[reconcile::Drift]) -> String {
    let repaired: Vec<String> = drifts
        .iter()
        .map(|d| {
            let class = serde_json::to_value(d.class)
                .ok()
                .and_then(|c| c.as_str().map(str::to_string))
                .unwrap_or_default();
            format!("{class} {}", d.amount)
        })
        .collect();
    match repaired.is_empty() {
        true => "nothing to repair".to_string(),
        false => repaired.join(", "),
    }
}

fn look_of(row: Vec<Value>) -> Result<GateSigns> {
    let mut row = row.into_iter();
    let mut next = || row.next().unwrap_or(Value::Nil);
    let loaded: bool =
        FromRedisValue::from_redis_value(next()).map_err(|e| Error::redis(format!("gate: {e}")))?;
    let buyers: u64 = FromRedisValue::from_redis_value(next())
        .map_err(|e| Error::redis(format!("buyers: {e}")))?;
    let paused: Option<String> = FromRedisValue::from_redis_value(next())
        .map_err(|e| Error::redis(format!("paused: {e}")))?;
    // A server that refuses INFO in scripts (an ACL) gives no run id: the
    // buyer count is then the only sign.
    let run_id: Option<String> = FromRedisValue::from_redis_value(next()).ok();
    let recorded_run_id: Option<String> = FromRedisValue::from_redis_value(next())
        .map_err(|e| Error::redis(format!("run id: {e}")))?;
    Ok(GateSigns {
        loaded,
        buyers,
        paused: paused.as_deref() == Some("1"),
        run_id,
        recorded_run_id,
    })
}

fn round_ms(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64))
}
