//! `seckill worker`: layers 2–5 in one process. Reads admitted orders from
//! every registered voucher's stream, persists them to MySQL exactly once in
//! effect, schedules their payment deadlines and acknowledges them —
//! surviving crashes, restarts, duplicates and poison messages without
//! losing or doubling one — and cancels orders unpaid at their deadline.
//!
//! `lane` is the read loop, `batch` the per-batch pipeline, `group` the
//! consumer-group commands, `lock` the L3 leases (renewed by `keepalive`),
//! `persist` the L4 transaction, `canceller` layer 5.

mod allotment;
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
use guard::GateGuard;
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
    let deadline_worker = Canceller {
        cfg: cfg.clone(),
        opts: opts.deadlines.clone(),
        db: db.clone(),
        conn: redis_conn::connect(&cfg).await?,
        ids: ids.clone(),
        stats: stats.clone(),
        pay_timeouts: HashMap::new(),
        last_sweep: None,
        layouts: Default::default(),
        owner: format!("{}:{run_id}:deadlines", opts.consumer),
        // Not renewed while it runs: long enough for its two lock waits
        // (order rows, then the voucher's), each half the lock lease.
        fence_lease: opts.lock_lease * 2,
        mysql_timeout: opts.mysql_timeout,
    };
    let stop_guard = stop.child_token();
    let guard_task = (!opts.gate_check.is_zero()).then(|| {
        let guard = GateGuard {
            cfg: cfg.clone(),
            db: db.clone(),
            conn: conn.clone(),
            ids: ids.clone(),
            stats: stats.clone(),
            every: opts.gate_check,
            grace: opts.lock_lease,
            owner: format!("{}:{run_id}:guard", opts.consumer),
            state: Default::default(),
        };
        tokio::spawn(guard.run(stop_guard.clone()))
    });
    // Vouchers split in buckets: one worker at a time moves their stock.
    let stop_mover = stop.child_token();
    let mover_task = {
        let mover = mover::Mover {
            cfg: cfg.clone(),
            conn: redis_conn::connect(&cfg).await?,
            db: db.clone(),
            ids: ids.clone(),
            stats: stats.clone(),
            owner: format!("{}:{run_id}:mover", opts.consumer),
            lease: opts.lock_lease,
            layouts: Default::default(),
            failing: Default::default(),
            epoch_floors: Default::default(),
            bounded: Default::default(),
            last_pass: Default::default(),
            published: Default::default(),
            guarded: !opts.gate_check.is_zero(),
            told_unchecked: Default::default(),
            moves_left: false,
            until_idle: opts.until_idle,
        };
        tokio::spawn(mover.run(stop_mover.clone()))
    };
    let (mut inline_deadlines, deadline_task) = if opts.until_idle {
        (Some(deadline_worker), None)
    } else {
        (None, Some(tokio::spawn(deadline_worker.run(stop.clone()))))
    };
    let mut lanes = Vec::with_capacity(opts.lanes);
    for lane in 0..opts.lanes {
        lanes.push(Lane {
            cfg: cfg.clone(),
            opts: opts.clone(),
            lane,
            db: db.clone(),
            conn: redis_conn::connect(&cfg).await?,
            blocking: redis_conn::connect_blocking(&cfg, opts.block).await?,
            owner: LockOwner {
                // One owner per lane: two lanes never share a user's lock.
                token: format!("{}:{run_id}:{lane}", opts.consumer),
                lease: opts.lock_lease,
            },
            stats: stats.clone(),
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
    tracing::info!(
        "worker {} started (batch {} up to {}, lanes {}, claim idle {}, max deliveries {})",
        opts.consumer,
        opts.batch,
        opts.largest_batch(),
        opts.lanes,
        humantime::format_duration(opts.claim_idle),
        opts.max_deliveries
    );
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
        // Best effort, and bounded: a connection gone silent would hold
        // the exit for a reply timeout per voucher, past systemd's
        // TimeoutStopSec; a consumer left behind is forgotten later.
        if tokio::time::timeout(FORGET_SELF_WITHIN, w.forget_self())
            .await
            .is_err()
        {
            tracing::debug!(
                "leaving the consumer list took over {FORGET_SELF_WITHIN:?}; left for later"
            );
        }
    }
    if opts.until_idle && outcome.is_ok() && !stop.is_cancelled() {
        tracing::info!("no work left: exiting (--until-idle)");
    }
    if let Some(m) = metrics {
        m.abort();
    }
    stop_renewing.cancel();
    renewing.await.ok();
    db.close().await;
    outcome
}
