//! `seckill worker`: layers 2–4. Reads admitted orders from every registered
//! voucher's stream, persists them to MySQL exactly once in effect, schedules
//! their payment deadlines, and acknowledges them — surviving crashes,
//! restarts, duplicates and poison messages without losing or doubling one.
//!
//! A batch goes: parse → lock (one round trip) → MySQL transaction → finish
//! script (deadlines, dead letters, XACK) → unlock. A crash anywhere leaves
//! its entries pending; whoever reclaims them redoes the same steps, which
//! are idempotent against what was already committed.

pub mod deadlines;
pub mod keepalive;
pub mod message;
pub mod metrics;
pub mod persist;
pub mod stats;
pub mod stream;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::backlog::backlog;
use crate::config::Config;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::keys::{registry, VoucherKeys};
use crate::lock::LockOwner;
use crate::redis_store;
use crate::timespec::now_ms;
use message::OrderMessage;
use persist::{persist, Fate, PersistError};
pub use stats::{StatsSnapshot, WorkerStats};
use stream::{DeadLetter, Delivery};

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// This instance's consumer name in the group (stable per instance).
    pub consumer: String,
    /// Entries read per stream per round trip.
    pub batch: usize,
    /// How long one blocking read waits for new entries.
    pub block: Duration,
    /// Entries pending this long with a silent consumer are reclaimed.
    pub claim_idle: Duration,
    /// A message that cannot be persisted is dead-lettered once it has been
    /// delivered more often than this.
    pub max_deliveries: u64,
    /// Lease of the L3 locks (renewed while a batch runs).
    pub lock_lease: Duration,
    /// Exit once no voucher has undelivered or pending entries.
    pub until_idle: bool,
    /// Acknowledged entries are trimmed from the streams after this long.
    pub keep: Duration,
    /// Batches in hand at once: while one waits for its MySQL commit, the
    /// next is read and locked (each lane has its own connections).
    pub lanes: usize,
    /// Snowflake node id of the orders this worker mints (promotions).
    pub node_id: u16,
    /// Layer 5: payment deadlines.
    pub deadlines: deadlines::DeadlineOptions,
    /// Where to serve Prometheus metrics (none: no endpoint).
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl WorkerOptions {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidInput(m.to_string()));
        if !(1..=4096).contains(&self.batch) {
            return bad("--batch must be between 1 and 4096");
        }
        if self.block < Duration::from_millis(1) || self.block > Duration::from_secs(60) {
            return bad("--block must be between 1ms and 60s");
        }
        if self.claim_idle < Duration::from_millis(10) {
            return bad("--claim-idle must be at least 10ms");
        }
        if self.max_deliveries == 0 {
            return bad("--max-deliveries must be at least 1");
        }
        if self.lock_lease < Duration::from_millis(30) {
            return bad("--lock-lease must be at least 30ms");
        }
        if self.deadlines.lease < Duration::from_millis(100) {
            return bad("--deadline-lease must be at least 100ms");
        }
        if self.deadlines.sweep_every < Duration::from_millis(100) {
            return bad("--sweep-every must be at least 100ms");
        }
        if !(1..=16).contains(&self.lanes) {
            return bad("--lanes must be between 1 and 16");
        }
        if self.consumer.is_empty() || self.consumer.len() > 200 {
            return bad("--consumer must be 1-200 characters");
        }
        Ok(())
    }
}

/// Redis says the stream or its consumer group is gone.
fn lost_group(e: &Error) -> bool {
    matches!(e, Error::Redis(m) if m.contains("NOGROUP"))
}

/// The default consumer name: host and process id, stable for the life of
/// the process and distinct between instances.
pub fn default_consumer() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}-{}", std::process::id())
}

/// What a committed batch still has to do in Redis, and what it counted.
struct Planned {
    redis: stream::Completion<'static>,
    /// (inserted, already stored)
    counts: (u64, u64),
}

impl Planned {
    fn new(dead: Vec<DeadLetter>, acks: Vec<String>) -> Planned {
        Planned {
            redis: stream::Completion {
                dead,
                acks,
                ..Default::default()
            },
            counts: (0, 0),
        }
    }
}

const REGISTRY_REFRESH: Duration = Duration::from_secs(2);
const TRIM_EVERY: Duration = Duration::from_secs(10);
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
const UNTIL_IDLE_BLOCK: Duration = Duration::from_millis(200);
/// A consumer with nothing pending and silent this long has exited or died.
const SILENT_CONSUMER: Duration = Duration::from_secs(3600);

struct Worker {
    cfg: Arc<Config>,
    opts: Arc<WorkerOptions>,
    /// Lane 0 also reclaims, trims and reports progress.
    lane: usize,
    db: Db,
    conn: MultiplexedConnection,
    blocking: MultiplexedConnection,
    owner: LockOwner,
    stats: Arc<WorkerStats>,
    stop: CancellationToken,
    /// voucher → its stream key, for every registered voucher with a group.
    streams: BTreeMap<u64, String>,
    /// Why an entry could not be persisted last time (for its dead letter).
    last_error: HashMap<String, String>,
    /// With --until-idle, lane 0 handles the payment deadlines itself, so
    /// that it never exits while a release is about to add promotions.
    deadlines: Option<deadlines::Deadlines>,
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
    let mut conn = redis_store::connect(&cfg).await?;
    redis_store::check_version(&mut conn).await?;
    let db = Db::connect(&cfg).await?;
    let run_id = crate::snowflake::Snowflake::new(0)?.next_id();
    let metrics = match opts.metrics_addr {
        Some(addr) => {
            Some(metrics::start(addr, cfg.clone(), stats.clone(), stop.child_token()).await?)
        }
        None => None,
    };
    let deadline_worker = deadlines::Deadlines::new(
        cfg.clone(),
        opts.deadlines.clone(),
        db.clone(),
        redis_store::connect(&cfg).await?,
        crate::snowflake::Snowflake::new(opts.node_id)?,
        stats.clone(),
    );
    let (mut inline_deadlines, deadline_task) = if opts.until_idle {
        (Some(deadline_worker), None)
    } else {
        (None, Some(tokio::spawn(deadline_worker.run(stop.clone()))))
    };
    let mut lanes = Vec::with_capacity(opts.lanes);
    for lane in 0..opts.lanes {
        lanes.push(Worker {
            cfg: cfg.clone(),
            opts: opts.clone(),
            lane,
            db: db.clone(),
            conn: redis_store::connect(&cfg).await?,
            blocking: redis_store::connect_blocking(&cfg, opts.block).await?,
            owner: LockOwner {
                // One owner per lane: two lanes never share a user's lock.
                token: format!("{}:{run_id}:{lane}", opts.consumer),
                lease: opts.lock_lease,
            },
            stats: stats.clone(),
            stop: stop.clone(),
            streams: BTreeMap::new(),
            last_error: HashMap::new(),
            deadlines: if lane == 0 {
                inline_deadlines.take()
            } else {
                None
            },
        });
    }
    tracing::info!(
        "worker {} started (batch {}, lanes {}, claim idle {}, max deliveries {})",
        opts.consumer,
        opts.batch,
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
                outcome = Err(Error::Redis(format!("a worker lane failed: {e}")));
            }
        }
    }
    if let Some(task) = deadline_task {
        // Lanes stop only on `stop`, which also ends this task's loop.
        task.await.ok();
    }
    if let Some(mut w) = last {
        w.forget_self().await;
    }
    if let Some(m) = metrics {
        m.abort();
    }
    db.close().await;
    outcome
}

impl Worker {
    async fn main_loop(&mut self) -> Result<()> {
        let mut last_refresh: Option<Instant> = None;
        let mut last_reclaim: Option<Instant> = None;
        let mut last_trim = Instant::now();
        let mut last_progress = (Instant::now(), 0u64);
        let reclaim_every = (self.opts.claim_idle / 2).max(Duration::from_millis(50));
        let mut backoff = Duration::from_millis(100);
        while !self.stop.is_cancelled() {
            let round = async {
                if last_refresh.is_none_or(|t| t.elapsed() >= REGISTRY_REFRESH) {
                    self.refresh_streams().await?;
                    last_refresh = Some(Instant::now());
                }
                let mut worked = false;
                if self.lane == 0 && last_reclaim.is_none_or(|t| t.elapsed() >= reclaim_every) {
                    worked |= self.reclaim_all().await?;
                    last_reclaim = Some(Instant::now());
                }
                if let Some(d) = self.deadlines.as_mut() {
                    worked |= d.pass().await?;
                }
                worked |= self.read_and_process().await?;
                if self.lane == 0 && last_trim.elapsed() >= TRIM_EVERY {
                    self.trim_all().await;
                    last_trim = Instant::now();
                }
                Ok::<bool, Error>(worked)
            }
            .await;
            match round {
                Ok(worked) => {
                    backoff = Duration::from_millis(100);
                    if !worked && self.opts.until_idle && self.all_idle().await? {
                        tracing::info!("no work left: exiting (--until-idle)");
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!("{e}; retrying in {}", humantime::format_duration(backoff));
                    if lost_group(&e) {
                        // Redis lost a stream with its group (a restart without
                        // persistence): create the groups again on the next round.
                        self.streams.clear();
                        last_refresh = None;
                    }
                    self.pause(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    self.reconnect().await;
                }
            }
            if self.lane == 0 && last_progress.0.elapsed() >= PROGRESS_EVERY {
                let now = self.stats.snapshot();
                let delta = now.persisted - last_progress.1;
                if delta > 0 {
                    tracing::info!(
                        "persisted {delta} orders in the last {}s ({} in all, {} dead-lettered)",
                        PROGRESS_EVERY.as_secs(),
                        now.persisted,
                        now.dead_lettered
                    );
                }
                last_progress = (Instant::now(), now.persisted);
            }
        }
        Ok(())
    }

    /// Sleeps, but wakes at once on stop.
    async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = self.stop.cancelled() => {}
            _ = tokio::time::sleep(d) => {}
        }
    }

    async fn reconnect(&mut self) {
        if let Ok(c) = redis_store::connect(&self.cfg).await {
            self.conn = c;
        }
        if let Ok(c) = redis_store::connect_blocking(&self.cfg, self.opts.block).await {
            self.blocking = c;
        }
    }

    /// Picks up vouchers preloaded since the last look, creating the group.
    async fn refresh_streams(&mut self) -> Result<()> {
        let ids: Vec<u64> = self.conn.smembers(registry(&self.cfg.prefix)?).await?;
        for id in ids {
            if self.streams.contains_key(&id) {
                continue;
            }
            let keys = VoucherKeys::new(&self.cfg.prefix, id)?;
            stream::ensure_group(&mut self.conn, &keys).await?;
            tracing::debug!("consuming {}", keys.orders());
            self.streams.insert(id, keys.orders());
        }
        Ok(())
    }

    async fn reclaim_all(&mut self) -> Result<bool> {
        let mut worked = false;
        let vouchers: Vec<u64> = self.streams.keys().copied().collect();
        for voucher in vouchers {
            let keys = VoucherKeys::new(&self.cfg.prefix, voucher)?;
            loop {
                let claimed = stream::reclaim(
                    &mut self.conn,
                    &keys,
                    &self.opts.consumer,
                    self.opts.claim_idle.as_millis() as u64,
                    self.opts.batch,
                )
                .await?;
                if claimed.is_empty() {
                    break;
                }
                worked = true;
                self.stats.add_reclaimed(claimed.len() as u64);
                let full = claimed.len() == self.opts.batch;
                self.process_batch(voucher, claimed).await?;
                if !full || self.stop.is_cancelled() {
                    break;
                }
            }
        }
        Ok(worked)
    }

    async fn read_and_process(&mut self) -> Result<bool> {
        let streams: Vec<(u64, String)> =
            self.streams.iter().map(|(v, k)| (*v, k.clone())).collect();
        if streams.is_empty() {
            self.pause(self.opts.block.min(REGISTRY_REFRESH)).await;
            return Ok(false);
        }
        // Waiting long for news only delays the exit of an --until-idle run.
        let block = if self.opts.until_idle {
            self.opts.block.min(UNTIL_IDLE_BLOCK)
        } else {
            self.opts.block
        };
        let read = stream::read_new(
            &mut self.blocking,
            &streams,
            &self.opts.consumer,
            self.opts.batch,
            block.as_millis() as u64,
        )
        .await?;
        let worked = !read.is_empty();
        for (voucher, deliveries) in read {
            self.process_batch(voucher, deliveries).await?;
        }
        Ok(worked)
    }

    /// Runs a batch to completion, retrying it as a whole with backoff while
    /// a store is down. Its entries stay claimed by us meanwhile (keep-alive),
    /// so no other worker redelivers them and their delivery count does not
    /// grow. Returns only when done, or when stopping (entries left pending).
    async fn process_batch(&mut self, voucher: u64, deliveries: Vec<Delivery>) -> Result<()> {
        let keys = VoucherKeys::new(&self.cfg.prefix, voucher)?;
        let ids: Vec<String> = deliveries.iter().map(|d| d.raw.entry_id.clone()).collect();
        let alive = keepalive::start(
            self.conn.clone(),
            keys.clone(),
            self.opts.consumer.clone(),
            ids,
            self.owner.clone(),
            // Often enough that neither a lease nor the reclaim threshold passes.
            self.opts.lock_lease.min(self.opts.claim_idle) / 3,
            self.stats.clone(),
        );
        let mut backoff = Duration::from_millis(100);
        let mut failures = 0u32;
        loop {
            match self.try_batch(voucher, &keys, &deliveries, &alive).await {
                Ok(()) => {
                    if failures > 0 {
                        tracing::info!(
                            "voucher {voucher}: batch of {} persisted after {failures} failed attempt(s)",
                            deliveries.len()
                        );
                    }
                    return Ok(());
                }
                Err(e) if lost_group(&e) => {
                    tracing::warn!(
                        "voucher {voucher}: its order stream lost the worker group (Redis lost the keys?); \
                         the {} entries in hand went with it: `seckill reconcile` repairs what was lost",
                        deliveries.len()
                    );
                    return Ok(());
                }
                Err(e) => {
                    if self.stop.is_cancelled() {
                        tracing::warn!(
                            "stopping with a batch of {} unfinished ({e}); its entries stay pending for another worker",
                            deliveries.len()
                        );
                        return Ok(());
                    }
                    tracing::warn!(
                        "voucher {voucher}: batch of {} not persisted: {e}; retrying in {}",
                        deliveries.len(),
                        humantime::format_duration(backoff)
                    );
                    failures += 1;
                    self.pause(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    self.reconnect().await;
                }
            }
        }
    }

    async fn try_batch(
        &mut self,
        voucher: u64,
        keys: &VoucherKeys,
        deliveries: &[Delivery],
        alive: &keepalive::KeepAlive,
    ) -> Result<()> {
        let started = Instant::now();
        let mut dead: Vec<DeadLetter> = Vec::new();
        let mut acks: Vec<String> = Vec::new();
        let mut valid: Vec<(OrderMessage, u64)> = Vec::new();
        for d in deliveries {
            match d.raw.parse(voucher) {
                Ok(m) => valid.push((m, d.deliveries)),
                Err(reason) if d.deliveries > self.opts.max_deliveries => {
                    dead.push(self.dead_letter(&d.raw.entry_id, reason, d.deliveries));
                    acks.push(d.raw.entry_id.clone());
                }
                Err(reason) => {
                    tracing::warn!(
                        "voucher {voucher}: entry {} is malformed ({reason}); delivery {} of {} before it is dead-lettered",
                        d.raw.entry_id,
                        d.deliveries,
                        self.opts.max_deliveries + 1
                    );
                    self.last_error.insert(d.raw.entry_id.clone(), reason);
                }
            }
        }

        let lock_keys: Vec<String> = valid.iter().map(|(m, _)| keys.lock(m.user)).collect();
        let t_lock = Instant::now();
        let granted = self.owner.acquire(&mut self.conn, &lock_keys).await?;
        let lock_ms = t_lock.elapsed().as_secs_f64() * 1e3;
        let mut mine: Vec<(OrderMessage, u64)> = Vec::new();
        let mut held: Vec<String> = Vec::new();
        for ((m, n), (ok, key)) in valid.into_iter().zip(granted.into_iter().zip(lock_keys)) {
            if ok {
                mine.push((m, n));
                held.push(key);
            } else {
                // Someone else works on this user's order: leave it pending
                // (never ack what was not persisted); it comes back later.
                self.stats.add_lock_denied(1);
            }
        }
        alive.set_held(held.clone()).await;
        crate::fault::pause("after_lock").await;
        let t_sql = Instant::now();
        let msgs: Vec<OrderMessage> = mine.iter().map(|(m, _)| m.clone()).collect();
        let persisted = persist(&self.db, voucher, &msgs).await;
        let sql_ms = t_sql.elapsed().as_secs_f64() * 1e3;
        let completion = match persisted {
            Ok(p) => self.complete(&mine, p, dead, acks),
            Err(PersistError::UnknownVoucher(v)) => {
                self.refuse_unknown_voucher(v, &mine, dead, acks)
            }
            Err(e) => {
                alive.set_held(Vec::new()).await;
                if let Err(r) = self.owner.release(&mut self.conn, &held).await {
                    tracing::warn!("voucher {voucher}: could not release {} lock(s), they expire with their lease: {r}", held.len());
                }
                return Err(match e {
                    PersistError::Mysql(e) => Error::from(e),
                    PersistError::Store(e) => e,
                    PersistError::UnknownVoucher(_) => unreachable!("handled above"),
                });
            }
        };
        crate::fault::pause("after_commit").await;
        // Stop renewing before the finish script releases the locks, so a
        // released lock is never taken for a lost one.
        alive.set_held(Vec::new()).await;
        let t_finish = Instant::now();
        let (inserted, duplicates) = completion.counts;
        let done = stream::Completion {
            locks: &held,
            owner: &self.owner.token,
            ..completion.redis
        };
        stream::finish(&mut self.conn, keys, &done).await?;
        crate::fault::pause("after_ack").await;
        tracing::debug!(
            "voucher {voucher}: batch of {}: lock {lock_ms:.1} ms, MySQL {sql_ms:.1} ms, finish {:.1} ms",
            deliveries.len(),
            t_finish.elapsed().as_secs_f64() * 1e3
        );
        for d in &done.dead {
            tracing::warn!(
                "voucher {voucher}: entry {} dead-lettered: {}",
                d.entry_id,
                d.reason
            );
        }
        for id in &done.acks {
            self.last_error.remove(id);
        }
        self.stats
            .add_batch(inserted, duplicates, done.dead.len() as u64);
        self.stats.observe_batch(started.elapsed());
        Ok(())
    }

    /// Deadlines, dead letters and acks for what MySQL decided.
    fn complete(
        &self,
        mine: &[(OrderMessage, u64)],
        p: persist::Persisted,
        dead: Vec<DeadLetter>,
        acks: Vec<String>,
    ) -> Planned {
        let mut plan = Planned::new(dead, acks);
        for ((m, n), fate) in mine.iter().zip(p.fates) {
            match fate {
                Fate::Inserted => {
                    plan.counts.0 += 1;
                    plan.redis
                        .deadlines
                        .push((m.order, m.created_ms + p.pay_timeout_ms));
                }
                Fate::AlreadyStored { status } => {
                    plan.counts.1 += 1;
                    if status == 0 {
                        plan.redis
                            .deadlines
                            .push((m.order, m.created_ms + p.pay_timeout_ms));
                    }
                }
                Fate::Dead(reason) => {
                    plan.redis
                        .dead
                        .push(self.dead_letter(&m.entry_id, reason, *n))
                }
            }
            plan.redis.acks.push(m.entry_id.clone());
        }
        plan
    }

    /// The voucher is not in MySQL: its messages wait (it may be added)
    /// until they have been delivered too often.
    fn refuse_unknown_voucher(
        &mut self,
        voucher: u64,
        mine: &[(OrderMessage, u64)],
        dead: Vec<DeadLetter>,
        acks: Vec<String>,
    ) -> Planned {
        let mut plan = Planned::new(dead, acks);
        let reason = format!("voucher {voucher} is not in MySQL");
        for (m, n) in mine {
            if *n > self.opts.max_deliveries {
                plan.redis
                    .dead
                    .push(self.dead_letter(&m.entry_id, reason.clone(), *n));
                plan.redis.acks.push(m.entry_id.clone());
            } else {
                self.last_error.insert(m.entry_id.clone(), reason.clone());
            }
        }
        if !mine.is_empty() {
            tracing::warn!(
                "voucher {voucher}: {reason}; its orders stay pending until they are dead-lettered"
            );
        }
        plan
    }

    fn dead_letter(&self, entry_id: &str, reason: String, deliveries: u64) -> DeadLetter {
        DeadLetter {
            entry_id: entry_id.to_string(),
            reason,
            deliveries,
        }
    }

    /// On a clean exit: leave the group's consumer list as we found it
    /// (only if nothing is pending for us; otherwise it stays for a reclaim).
    async fn forget_self(&mut self) {
        for voucher in self.streams.keys().copied().collect::<Vec<_>>() {
            let Ok(keys) = VoucherKeys::new(&self.cfg.prefix, voucher) else {
                continue;
            };
            if let Err(e) =
                stream::forget_consumer(&mut self.conn, &keys, &self.opts.consumer).await
            {
                tracing::debug!(
                    "{}: could not remove consumer {}: {e}",
                    keys.orders(),
                    self.opts.consumer
                );
            }
        }
    }

    /// Trims acknowledged entries and forgets consumers gone silent.
    async fn trim_all(&mut self) {
        let keep_ms = self.opts.keep.as_millis() as u64;
        for voucher in self.streams.keys().copied().collect::<Vec<_>>() {
            let Ok(keys) = VoucherKeys::new(&self.cfg.prefix, voucher) else {
                continue;
            };
            let silent = SILENT_CONSUMER.as_millis() as u64;
            match stream::forget_silent_consumers(
                &mut self.conn,
                &keys,
                &self.opts.consumer,
                silent,
            )
            .await
            {
                Ok(n) if n > 0 => {
                    tracing::debug!("{}: forgot {n} silent consumer(s)", keys.orders())
                }
                Ok(_) => {}
                Err(e) => tracing::debug!("{}: could not list consumers: {e}", keys.orders()),
            }
            match stream::trim(&mut self.conn, &keys, keep_ms, now_ms()).await {
                Ok(n) if n > 0 => {
                    tracing::debug!("{}: trimmed {n} acknowledged entries", keys.orders())
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("{}: trim failed: {e}", keys.orders()),
            }
        }
    }

    /// No voucher has an entry undelivered or pending (anyone's), and no
    /// payment deadline this lane handles is due.
    async fn all_idle(&mut self) -> Result<bool> {
        if let Some(d) = self.deadlines.as_mut() {
            if d.any_due().await? {
                return Ok(false);
            }
        }
        for voucher in self.streams.keys().copied().collect::<Vec<_>>() {
            let keys = VoucherKeys::new(&self.cfg.prefix, voucher)?;
            if backlog(&mut self.conn, &keys).await?.in_flight() > 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
