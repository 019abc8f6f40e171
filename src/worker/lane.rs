//! One lane of `seckill worker`: a loop that keeps the registry's streams in
//! view, reads new entries (lane 0 also reclaims, trims, reports progress
//! and, with --until-idle, handles payment deadlines) and hands each read to
//! the batch pipeline. Lanes run side by side so that one batch's MySQL
//! commit overlaps the next batch's read and lock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::redis_conn::Redis;
use tokio_util::sync::CancellationToken;

use super::canceller::Canceller;
use super::group;
use super::lock::LockOwner;
use super::options::WorkerOptions;
use super::{lost_group, WorkerStats};
use crate::error::{Error, Result};
use crate::gate::buckets;
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn;
use crate::store::registry;
use crate::stream::backlog::backlog;
use crate::stream::id::StreamId;
use crate::support::backoff::Backoff;
use crate::support::timespec::now_ms;

const REGISTRY_REFRESH: Duration = Duration::from_secs(2);
const TRIM_EVERY: Duration = Duration::from_secs(10);
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// XAUTOCLAIM calls per voucher per reclaim round, each scanning up to
/// 10 × --batch pending entries; the cursor carries over to the next round.
const RECLAIM_CALLS_PER_ROUND: usize = 16;
/// With --until-idle, the longest wait of a read while work is left elsewhere
/// (often another lane of this worker finishing its batch): short, since
/// the run exits only after the next read and look.
const UNTIL_IDLE_BLOCK: Duration = Duration::from_millis(50);
/// A consumer with nothing pending and silent this long has exited or died.
const SILENT_CONSUMER: Duration = Duration::from_secs(3600);

pub(super) struct Lane {
    pub(super) cfg: Arc<Config>,
    pub(super) opts: Arc<WorkerOptions>,
    /// Lane 0 also reclaims, trims and reports progress.
    pub(super) lane: usize,
    pub(super) db: Db,
    pub(super) conn: Redis,
    pub(super) blocking: Redis,
    pub(super) owner: LockOwner,
    pub(super) stats: Arc<WorkerStats>,
    pub(super) stop: CancellationToken,
    /// Every gate of every registered voucher (one per bucket) whose
    /// stream has the group: (voucher, bucket) → its keys.
    pub(super) streams: BTreeMap<(u64, u32), VoucherKeys>,
    /// Why an entry could not be persisted last time (for its dead letter).
    pub(super) last_error: HashMap<String, String>,
    /// Redis lost a group: create every known voucher's group again.
    pub(super) recreate_groups: bool,
    /// The mover pass under way when this lane first found nothing to do
    /// since it last worked (--until-idle).
    pub(super) idle_since_pass: Option<u64>,
    /// Vouchers registered whose gate was not loaded at the last look:
    /// their buckets are read again at each refresh until it is.
    pub(super) unsettled: BTreeSet<u64>,
    /// Where each gate's next XAUTOCLAIM starts (lane 0 only).
    pub(super) reclaim_cursors: HashMap<(u64, u32), StreamId>,
    /// With --until-idle, lane 0 handles the payment deadlines itself, so
    /// that it never exits while a release is about to add promotions.
    pub(super) deadlines: Option<Canceller>,
    /// The last read found nothing (--until-idle waits before the next one).
    pub(super) read_nothing: bool,
    /// Entries the next read asks for per stream (adapts to the backlog).
    pub(super) read_size: usize,
}

impl Lane {
    pub(super) async fn main_loop(&mut self) -> Result<()> {
        let mut last_refresh: Option<Instant> = None;
        let mut last_reclaim: Option<Instant> = None;
        let mut last_trim = Instant::now();
        let mut last_progress = (Instant::now(), 0u64);
        let reclaim_every = (self.opts.claim_idle / 2).max(Duration::from_millis(50));
        let mut backoff = Backoff::default();
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
                // A deadline pass that failed (a bucket's master down) must
                // not keep this lane from reading the streams: its error
                // comes back after the read.
                let deadlines = match self.deadlines.as_mut() {
                    Some(d) => Some(d.pass().await),
                    None => None,
                };
                worked |= self.read_and_process().await?;
                if let Some(passed) = deadlines {
                    worked |= passed?;
                }
                // Not while stopping: a stop must not wait on housekeeping.
                if self.lane == 0 && !self.stop.is_cancelled() && last_trim.elapsed() >= TRIM_EVERY
                {
                    self.trim_all().await;
                    last_trim = Instant::now();
                }
                Ok::<bool, Error>(worked)
            }
            .await;
            match round {
                Ok(worked) => {
                    backoff.reset();
                    if worked {
                        self.idle_since_pass = None;
                    }
                    if !worked && self.opts.until_idle && self.all_idle().await? {
                        break;
                    }
                }
                Err(e) => {
                    // Whatever the failed round did, it is work to wait out.
                    self.idle_since_pass = None;
                    let delay = backoff.retry_after(&e);
                    if lost_group(&e) {
                        // Redis lost a stream with its group (a restart or a
                        // failover without the last writes): create the
                        // groups again on the next round.
                        self.recreate_groups = true;
                        last_refresh = None;
                    }
                    self.pause(delay).await;
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
    pub(super) async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = self.stop.cancelled() => {}
            _ = tokio::time::sleep(d) => {}
        }
    }

    pub(super) async fn reconnect(&mut self) {
        if let Ok(c) = redis_conn::connect(&self.cfg).await {
            self.conn = c;
        }
        if let Ok(c) = redis_conn::connect_blocking(&self.cfg, self.opts.block).await {
            self.blocking = c;
        }
    }

    /// Picks up vouchers preloaded since the last look, creating the group
    /// (again for every voucher, after Redis lost groups). A voucher this
    /// lane consumes that the registry no longer lists (Redis lost the
    /// registry's last writes, or all of it) is registered again: it is
    /// still being sold, and operators' commands and other workers find
    /// vouchers there.
    async fn refresh_streams(&mut self) -> Result<()> {
        let registered: BTreeSet<u64> = registry::members(&mut self.conn, &self.cfg.prefix)
            .await?
            .into_iter()
            .collect();
        let known: BTreeSet<u64> = self.streams.keys().map(|(v, _)| *v).collect();
        for &id in &known {
            if !registered.contains(&id) {
                let keys = VoucherKeys::new(&self.cfg.prefix, id)?;
                registry::register(&mut self.conn, &keys).await?;
                tracing::warn!("voucher {id} was missing from the registry; registered again");
            }
        }
        let mut failed = None;
        for id in registered.union(&known) {
            // A voucher in buckets has a stream per bucket; its split never
            // changes once loaded, so a voucher seen whole is not read again.
            if known.contains(id) && !self.unsettled.contains(id) && !self.recreate_groups {
                continue;
            }
            let read = buckets::read_settled(&mut self.conn, &self.db, &self.cfg.prefix, *id).await;
            let gates = match read {
                Ok((layout, loaded)) => {
                    // Registered, not loaded and no split recorded: a
                    // preload under way may be about to record buckets.
                    match loaded {
                        true => self.unsettled.remove(id),
                        false => self.unsettled.insert(*id),
                    };
                    layout.all_keys()?
                }
                Err(e) => {
                    tracing::warn!("voucher {id}: could not read its buckets: {e}");
                    failed = Some(e);
                    continue;
                }
            };
            for (bucket, keys) in gates.into_iter().enumerate() {
                // One gate whose group cannot be made must not keep the
                // others from being read: it is tried again next refresh.
                if let Err(e) = group::ensure_group(&mut self.conn, &keys).await {
                    tracing::warn!("{}: could not create the worker group: {e}", keys.orders());
                    failed = Some(e);
                    // Looked at again next refresh, with its other buckets
                    // (an --until-idle run may exit meanwhile, as for any
                    // stream whose group cannot be made: it says so).
                    self.unsettled.insert(*id);
                    continue;
                }
                tracing::debug!("consuming {}", keys.orders());
                self.streams.insert((*id, bucket as u32), keys);
            }
        }
        match failed {
            // A store that is down fails them all: back off and reconnect.
            Some(e) if self.streams.is_empty() => Err(e),
            Some(_) => Ok(()),
            None => {
                self.recreate_groups = false;
                Ok(())
            }
        }
    }

    async fn reclaim_all(&mut self) -> Result<bool> {
        let mut worked = false;
        let gates: Vec<((u64, u32), VoucherKeys)> =
            self.streams.iter().map(|(g, k)| (*g, k.clone())).collect();
        for (gate, keys) in gates {
            // XAUTOCLAIM looks at no more than 10 × COUNT pending entries per
            // call: the cursor carries on where the last call stopped (across
            // rounds too), so idle entries behind many live ones are reached.
            for _ in 0..RECLAIM_CALLS_PER_ROUND {
                let cursor = self
                    .reclaim_cursors
                    .get(&gate)
                    .copied()
                    .unwrap_or(StreamId::ZERO);
                let (next, claimed) = group::reclaim(
                    &mut self.conn,
                    &keys,
                    &self.opts.consumer,
                    self.opts.claim_idle.as_millis() as u64,
                    self.opts.batch,
                    cursor,
                )
                .await?;
                self.reclaim_cursors.insert(gate, next);
                if !claimed.is_empty() {
                    worked = true;
                    self.stats.add_reclaimed(claimed.len() as u64);
                    self.process_batch(&keys, claimed).await?;
                }
                if next == StreamId::ZERO || self.stop.is_cancelled() {
                    break;
                }
            }
        }
        Ok(worked)
    }

    async fn read_and_process(&mut self) -> Result<bool> {
        let streams: Vec<((u64, u32), String)> =
            self.streams.iter().map(|(g, k)| (*g, k.orders())).collect();
        if streams.is_empty() {
            self.pause(self.opts.block.min(REGISTRY_REFRESH)).await;
            return Ok(false);
        }
        // Waiting for news only delays the exit of an --until-idle run: it
        // looks without waiting first, and waits (briefly) only when the
        // last look found nothing and yet work was left (entries pending
        // elsewhere, deadlines due), so that it does not spin.
        let block = if !self.opts.until_idle {
            Some(self.opts.block)
        } else if self.read_nothing {
            Some(self.opts.block.min(UNTIL_IDLE_BLOCK))
        } else {
            None
        };
        let read = group::read_new(
            &mut self.blocking,
            &streams,
            &self.opts.consumer,
            self.read_size,
            block.map(|b| b.as_millis() as u64),
        )
        .await?;
        let worked = !read.is_empty();
        self.read_nothing = !worked;
        let largest = read.iter().map(|(_, d)| d.len()).max().unwrap_or(0);
        self.read_size = next_read_size(self.read_size, largest, &self.opts);
        // Every gate's batch is in hand from this read on: each is kept
        // alive (its gate held if Redis loses it) while the ones before it
        // are persisted, or a gate rebuilt meanwhile would sell its units
        // again and let its buyers buy twice (found by the fault explorer).
        let batches: Vec<_> = read
            .into_iter()
            .filter_map(|(gate, deliveries)| {
                let keys = self.streams.get(&gate).cloned()?;
                let alive = self.keep_alive(&keys, &deliveries);
                Some((keys, deliveries, alive))
            })
            .collect();
        for (keys, deliveries, alive) in batches {
            self.process_kept(&keys, deliveries, alive).await?;
        }
        Ok(worked)
    }

    /// On a clean exit: leave the group's consumer list as we found it
    /// (only if nothing is pending for us; otherwise it stays for a reclaim).
    pub(super) async fn forget_self(&mut self) {
        for keys in self.streams.values().cloned().collect::<Vec<_>>() {
            if let Err(e) = group::forget_consumer(&mut self.conn, &keys, &self.opts.consumer).await
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
        for keys in self.streams.values().cloned().collect::<Vec<_>>() {
            let silent = SILENT_CONSUMER.as_millis() as u64;
            match group::forget_silent_consumers(&mut self.conn, &keys, &self.opts.consumer, silent)
                .await
            {
                Ok(n) if n > 0 => {
                    tracing::debug!("{}: forgot {n} silent consumer(s)", keys.orders())
                }
                Ok(_) => {}
                Err(e) => tracing::debug!("{}: could not list consumers: {e}", keys.orders()),
            }
            match group::trim(&mut self.conn, &keys, keep_ms, now_ms()).await {
                Ok(n) if n > 0 => {
                    tracing::debug!("{}: trimmed {n} acknowledged entries", keys.orders())
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("{}: trim failed: {e}", keys.orders()),
            }
        }
    }

    /// No voucher has an entry undelivered or pending (anyone's), no
    /// payment deadline this lane handles is due, and no gate is paused.
    async fn all_idle(&mut self) -> Result<bool> {
        // A paused gate is being rebuilt: its reopening is work left. So
        // may be a gate the guard has not looked at yet: a run started
        // after Redis lost writes must not exit before the guard's first
        // pass has paused (and begun to rebuild) what it finds.
        let guard_looked = self.opts.gate_check.is_zero() || self.stats.guard_passes() > 0;
        if self.stats.gates_paused() > 0 || !guard_looked {
            return Ok(false);
        }
        // Units moving to waiting buyers of a voucher in buckets are work
        // left (their promotions come after the move): a mover pass begun
        // after this lane last worked must have found nothing to move.
        let since = *self
            .idle_since_pass
            .get_or_insert_with(|| self.stats.mover_passes());
        if !self.stats.mover_settled_after(since) {
            return Ok(false);
        }
        if let Some(d) = self.deadlines.as_mut() {
            if d.any_due().await? {
                return Ok(false);
            }
        }
        for keys in self.streams.values().cloned().collect::<Vec<_>>() {
            if backlog(&mut self.conn, &keys).await?.in_flight() > 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The size of the next read after one that asked for `asked` entries per
/// stream and got at most `got` from any: twice as many after a full read
/// (a backlog), half as many after one less than half full, within
/// `--batch` and `--max-batch`.
fn next_read_size(asked: usize, got: usize, opts: &WorkerOptions) -> usize {
    let (least, most) = (opts.batch, opts.largest_batch());
    let next = if got >= asked {
        asked.saturating_mul(2)
    } else if got < asked / 2 {
        asked / 2
    } else {
        asked
    };
    next.clamp(least, most)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(batch: usize, max_batch: usize) -> WorkerOptions {
        WorkerOptions {
            consumer: "t".into(),
            batch,
            max_batch,
            block: Duration::from_secs(1),
            claim_idle: Duration::from_secs(30),
            max_deliveries: 5,
            lock_lease: Duration::from_secs(10),
            mysql_timeout: Duration::from_secs(10),
            until_idle: false,
            keep: Duration::from_secs(3600),
            lanes: 2,
            node_id: None,
            deadlines: super::super::options::DeadlineOptions {
                lease: Duration::from_secs(30),
                sweep_every: Duration::from_secs(60),
                sweep_grace: Duration::from_secs(60),
                batch,
            },
            metrics_addr: None,
            gate_check: Duration::from_secs(1),
        }
    }

    #[test]
    fn reads_grow_while_full_and_shrink_back_when_the_backlog_is_gone() {
        let o = opts(256, 2048);
        let mut size = 256;
        let mut seen = vec![];
        for _ in 0..5 {
            size = next_read_size(size, size, &o);
            seen.push(size);
        }
        assert_eq!(seen, [512, 1024, 2048, 2048, 2048]);
        // A read at least half full keeps the size; less, halves it.
        assert_eq!(next_read_size(2048, 1024, &o), 2048);
        assert_eq!(next_read_size(2048, 1023, &o), 1024);
        assert_eq!(next_read_size(512, 0, &o), 256);
        assert_eq!(next_read_size(256, 0, &o), 256);
    }

    #[test]
    fn a_max_batch_at_or_below_batch_keeps_reads_fixed() {
        let o = opts(256, 100);
        assert_eq!(next_read_size(256, 256, &o), 256);
        assert_eq!(next_read_size(256, 0, &o), 256);
    }
}
