//! `seckill worker`: layers 2–5 in one process. Reads admitted orders from
//! every registered voucher's stream, persists them to MySQL exactly once in
//! effect, schedules their payment deadlines and acknowledges them —
//! surviving crashes, restarts, duplicates and poison messages without
//! losing or doubling one — and cancels orders unpaid at their deadline.
//!
//! `lane` is the read loop, `batch` the per-batch pipeline, `group` the
//! consumer-group commands, `lock` the L3 leases (renewed by `keepalive`),
//! `persist` the L4 transaction, `canceller` layer 5.

pub mod allotment;
mod batch;
mod bucket_look;
pub mod canceller;
pub mod fence;
pub mod group;
pub mod guard;
pub mod keepalive;
mod lane;
pub mod lock;
pub mod metrics;
pub mod mover;
pub mod options;
pub mod persist;
pub mod recount;
pub mod stats;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result, StoreFault};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn;
use canceller::Canceller;
use guard::{GateGuard, GuardTiming};
use lane::Lane;
use lock::LockOwner;
pub use options::{default_consumer, DeadlineOptions, WorkerOptions};
pub use stats::{StatsSnapshot, WorkerStats};

/// The longest an exiting worker spends leaving the groups' consumer lists.
const FORGET_SELF_WITHIN: Duration = Duration::from_secs(2);

/// Redis says the stream or its consumer group is gone.
fn lost_group(e: &Error) -> bool {
    e.store_fault() == Some(StoreFault::NoGroup)
}

/// Runs until `stop` is cancelled (after finishing the batch in hand) or,
/// with `until_idle`, until there is no work left.
pub async fn run(
    cfg: &Config,
    opts: &WorkerOptions,
    stop: CancellationToken,
    stats: Arc<WorkerStats>,
) -> Result<()> {
    opts.validate()?;
    let cfg = Arc::new(cfg.clone());
    let opts = Arc::new(opts.clone());
    let mut conn = redis_conn::connect(&cfg).await?;
    redis_conn::check_version(&mut conn).await?;
    let db = Db::connect_waiting(&cfg, Some(fence::lock_wait(opts.lock_lease))).await?;
    let ids = OrderIds::lease(&cfg, opts.node_id).await?;
    let stop_renewing = CancellationToken::new();
    let renewing = ids.keep_alive(stop_renewing.clone());
    // Unique among all processes: lock owner tokens must never be shared.
    let run_id = ids.next_id()?;
    let metrics = match opts.metrics_addr {
        Some(addr) => {
            Some(metrics::start(addr, cfg.clone(), stats.clone(), stop.child_token()).await?)
        }
        None => None,
    };
    let parts = Parts {
        cfg,
        opts,
        db,
        ids,
        stats,
        run_id,
    };
    let deadline_worker = parts.canceller().await?;
    let stop_guard = stop.child_token();
    let guard_task = (!parts.opts.gate_check.is_zero())
        .then(|| tokio::spawn(parts.gate_guard(conn.clone()).run(stop_guard.clone())));
    // Vouchers split in buckets: one worker at a time moves their stock.
    let stop_mover = stop.child_token();
    let mover_task = tokio::spawn(parts.mover().await?.run(stop_mover.clone()));
    let (inline_deadlines, deadline_task) = if parts.opts.until_idle {
        (Some(deadline_worker), None)
    } else {
        (None, Some(tokio::spawn(deadline_worker.run(stop.clone()))))
    };
    let lanes = parts.lanes(&stop, inline_deadlines).await?;
    let opts = &parts.opts;
    tracing::info!(
        "worker {} started (batch {} up to {}, lanes {}, claim idle {}, max deliveries {})",
        opts.consumer,
        opts.batch,
        opts.largest_batch(),
        opts.lanes,
        humantime::format_duration(opts.claim_idle),
        opts.max_deliveries
    );
    let (outcome, last) = run_lanes(lanes).await;
    stop_guard.cancel();
    if let Some(task) = guard_task {
        task.await.ok();
    }
    stop_mover.cancel();
    mover_task.await.ok();
    if let Some(task) = deadline_task {
        // Lanes stop only on `stop`, which also ends this task's loop.
        task.await.ok();
    }
    if let Some(mut w) = last {
        leave_consumer_lists(&mut w).await;
    }
    if opts.until_idle && outcome.is_ok() && !stop.is_cancelled() {
        tracing::info!("no work left: exiting (--until-idle)");
    }
    if let Some(m) = metrics {
        m.abort();
    }
    stop_renewing.cancel();
    renewing.await.ok();
    parts.db.close().await;
    outcome
}

/// What every part of a worker shares.
struct Parts {
    cfg: Arc<Config>,
    opts: Arc<WorkerOptions>,
    db: Db,
    ids: Arc<OrderIds>,
    stats: Arc<WorkerStats>,
    /// An id minted for this run: owner tokens are made from it.
    run_id: u64,
}

impl Parts {
    /// Layer 5: the payment deadlines.
    async fn canceller(&self) -> Result<Canceller> {
        let fenced = canceller::Fenced {
            owner: format!("{}:{}:deadlines", self.opts.consumer, self.run_id),
            // Not renewed while it runs: long enough for its two lock waits
            // (order rows, then the voucher's), each half the lock lease.
            lease: self.opts.lock_lease * 2,
            mysql_timeout: self.opts.mysql_timeout,
        };
        Canceller::new(
            self.cfg.clone(),
            self.opts.deadlines.clone(),
            self.db.clone(),
            self.ids.clone(),
            self.stats.clone(),
            fenced,
        )
        .await
    }

    /// The gate guard, on the worker's first connection.
    fn gate_guard(&self, conn: redis_conn::Redis) -> GateGuard {
        GateGuard::new(
            self.cfg.clone(),
            self.db.clone(),
            conn,
            self.ids.clone(),
            self.stats.clone(),
            format!("{}:{}:guard", self.opts.consumer, self.run_id),
            GuardTiming {
                every: self.opts.gate_check,
                grace: self.opts.lock_lease,
                settle: guard::SETTLE,
            },
        )
    }

    /// The mover of vouchers split in buckets.
    async fn mover(&self) -> Result<mover::Mover> {
        Ok(mover::Mover {
            cfg: self.cfg.clone(),
            conn: redis_conn::connect(&self.cfg).await?,
            db: self.db.clone(),
            ids: self.ids.clone(),
            stats: self.stats.clone(),
            owner: format!("{}:{}:mover", self.opts.consumer, self.run_id),
            lease: self.opts.lock_lease,
            layouts: Default::default(),
            failing: Default::default(),
            epoch_floors: Default::default(),
            bounded: Default::default(),
            last_pass: Default::default(),
            published: Default::default(),
            guarded: !self.opts.gate_check.is_zero(),
            told_unchecked: Default::default(),
            unchecked: Default::default(),
            moves_left: false,
            until_idle: self.opts.until_idle,
        })
    }

    /// The read loops, each on connections of its own; lane 0 runs the
    /// deadlines inline when given them (`--until-idle`).
    async fn lanes(
        &self,
        stop: &CancellationToken,
        mut inline_deadlines: Option<Canceller>,
    ) -> Result<Vec<Lane>> {
        let opts = &self.opts;
        let mut lanes = Vec::with_capacity(opts.lanes);
        for lane in 0..opts.lanes {
            lanes.push(Lane {
                cfg: self.cfg.clone(),
                opts: opts.clone(),
                lane,
                db: self.db.clone(),
                conn: redis_conn::connect(&self.cfg).await?,
                blocking: redis_conn::connect_blocking(&self.cfg, opts.block).await?,
                owner: LockOwner {
                    // One owner per lane: two lanes never share a user's lock.
                    token: format!("{}:{}:{lane}", opts.consumer, self.run_id),
                    lease: opts.lock_lease,
                },
                stats: self.stats.clone(),
                stop: stop.clone(),
                streams: BTreeMap::new(),
                unsettled: Default::default(),
                idle_since_pass: None,
                last_error: HashMap::new(),
                reclaim_cursors: HashMap::new(),
                recreate_groups: false,
                read_nothing: false,
                read_size: opts.batch,
                deadlines: if lane == 0 {
                    inline_deadlines.take()
                } else {
                    None
                },
            });
        }
        Ok(lanes)
    }
}

/// Runs the lanes to their end: the first error of any, and a lane to
/// leave the consumer lists with.
async fn run_lanes(lanes: Vec<Lane>) -> (Result<()>, Option<Lane>) {
    let mut running = tokio::task::JoinSet::new();
    for mut w in lanes {
        running.spawn(async move {
            let result = w.main_loop().await;
            (w, result)
        });
    }
    let mut outcome = Ok(());
    let mut last = None;
    while let Some(joined) = running.join_next().await {
        match joined {
            Ok((w, result)) => {
                if result.is_err() && outcome.is_ok() {
                    outcome = result;
                }
                last = Some(w);
            }
            Err(e) => {
                outcome = Err(Error::redis(format!("a worker lane failed: {e}")));
            }
        }
    }
    (outcome, last)
}

/// Best effort, and bounded: a connection gone silent would hold the exit
/// for a reply timeout per voucher, past systemd's TimeoutStopSec; a
/// consumer left behind is forgotten later.
async fn leave_consumer_lists(w: &mut Lane) {
    if tokio::time::timeout(FORGET_SELF_WITHIN, w.forget_self())
        .await
        .is_err()
    {
        tracing::debug!(
            "leaving the consumer list took over {FORGET_SELF_WITHIN:?}; left for later"
        );
    }
}
