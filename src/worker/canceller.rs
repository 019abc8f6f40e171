//! Layer 5 inside `seckill worker`: cancel orders unpaid at their deadline
//! and give their units back, plus the MySQL sweep that catches deadlines
//! Redis lost. Runs as its own task (sleeping until the next due deadline,
//! at most a second) or, with --until-idle, inline in the first lane.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use super::options::DeadlineOptions;
use super::WorkerStats;
use crate::error::Result;
use crate::orders::deadline::{self, Due};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::registry;
use crate::support::backoff::Backoff;
use crate::support::snowflake::Snowflake;
use crate::support::timespec::now_ms;

/// Longest sleep between looks at the deadlines: deadlines scheduled by
/// other worker processes are noticed at least this often.
const MAX_SLEEP: Duration = Duration::from_secs(1);

pub struct Canceller {
    pub(super) cfg: Arc<Config>,
    pub(super) opts: DeadlineOptions,
    pub(super) db: Db,
    pub(super) conn: MultiplexedConnection,
    /// Mints the order ids of promotions.
    pub(super) ids: Snowflake,
    pub(super) stats: Arc<WorkerStats>,
    /// Cached per voucher for the sweep.
    pub(super) pay_timeouts: HashMap<u64, i64>,
    pub(super) last_sweep: Option<Instant>,
}

impl Canceller {
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
                    let b = backoff.next_delay();
                    tracing::warn!(
                        "payment deadlines: {e}; retrying in {}",
                        humantime::format_duration(b)
                    );
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

    /// Handles every due deadline of every voucher (and the sweep when it is
    /// time); true when it did anything.
    pub async fn pass(&mut self) -> Result<bool> {
        let mut worked = false;
        for voucher in self.vouchers().await? {
            let keys = VoucherKeys::new(&self.cfg.prefix, voucher)?;
            loop {
                let lease = self.opts.lease.as_millis() as u64;
                let (now, due) =
                    deadline::claim_due(&mut self.conn, &keys, lease, self.opts.batch).await?;
                if due.is_empty() {
                    break;
                }
                worked = true;
                let full = due.len() == self.opts.batch;
                self.settle(voucher, &keys, &due, Some((now, Instant::now())))
                    .await?;
                if !full {
                    break;
                }
            }
        }
        if self
            .last_sweep
            .is_none_or(|t| t.elapsed() >= self.opts.sweep_every)
        {
            worked |= self.sweep().await?;
            self.last_sweep = Some(Instant::now());
        }
        Ok(worked)
    }

    /// Cancels in MySQL, then gives the units back in Redis. A crash between
    /// the two leaves the claimed deadline to come back after its lease;
    /// the cancellation is then found done and the release happens once.
    /// `claimed`: Redis's clock at the claim, and when that was here, to
    /// measure how late the cancellation committed (none for the sweep).
    async fn settle(
        &mut self,
        voucher: u64,
        keys: &VoucherKeys,
        due: &[Due],
        claimed: Option<(i64, Instant)>,
    ) -> Result<()> {
        let orders: Vec<u64> = due.iter().map(|d| d.order).collect();
        let c = deadline::cancel_unpaid(&self.db, voucher, &orders).await?;
        if let Some((redis_now, at)) = claimed {
            let committed = redis_now + at.elapsed().as_millis() as i64;
            let latest = due
                .iter()
                .map(|d| committed - d.deadline_ms)
                .max()
                .unwrap_or(0);
            self.stats.note_lateness(latest.max(0) as u64);
        }
        crate::support::fault::pause("after_cancel").await;
        let r = deadline::release(
            &mut self.conn,
            keys,
            voucher,
            &c.cancelled,
            &c.settled,
            &self.ids,
        )
        .await?;
        self.stats
            .add_released(c.cancelled_now, r.released, r.promoted);
        if c.cancelled_now > 0 || r.released > 0 {
            tracing::debug!(
                "voucher {voucher}: {} unpaid order(s) cancelled, {} unit(s) given back ({} to the waitlist)",
                c.cancelled_now,
                r.released,
                r.promoted
            );
        }
        Ok(())
    }

    /// The backstop: pending orders past deadline + grace by MySQL's clock.
    async fn sweep(&mut self) -> Result<bool> {
        let mut worked = false;
        for voucher in self.vouchers().await? {
            let timeout = match self.pay_timeouts.get(&voucher) {
                Some(t) => *t,
                None => match deadline::pay_timeout_ms(&self.db, voucher).await {
                    Ok(t) => {
                        self.pay_timeouts.insert(voucher, t);
                        t
                    }
                    // A voucher Redis knows and MySQL does not has no orders to sweep.
                    Err(crate::Error::VoucherNotFound(_)) => continue,
                    Err(e) => return Err(e),
                },
            };
            let cutoff = now_ms() - timeout - self.opts.sweep_grace.as_millis() as i64;
            let overdue =
                deadline::overdue_in_mysql(&self.db, voucher, cutoff, self.opts.batch).await?;
            if overdue.is_empty() {
                continue;
            }
            worked = true;
            let keys = VoucherKeys::new(&self.cfg.prefix, voucher)?;
            let scheduled = deadline::scheduled_count(&mut self.conn, &keys, &overdue).await?;
            let missed = overdue.len() - scheduled;
            if missed > 0 {
                tracing::warn!(
                    "voucher {voucher}: {missed} pending order(s) past their payment deadline were missed by Redis (no deadline there); cancelling them"
                );
            }
            if scheduled > 0 {
                tracing::warn!(
                    "voucher {voucher}: {scheduled} pending order(s) are past their payment deadline + grace although Redis has their deadline (cancellation delayed, e.g. by a store outage); cancelling them"
                );
            }
            let due: Vec<Due> = overdue
                .into_iter()
                .map(|order| Due {
                    order,
                    deadline_ms: 0,
                })
                .collect();
            self.settle(voucher, &keys, &due, None).await?;
        }
        Ok(worked)
    }

    /// Time until the earliest deadline of any voucher (capped at a second).
    pub async fn until_next_due(&mut self) -> Result<Duration> {
        let vouchers = self.vouchers().await?;
        if vouchers.is_empty() {
            return Ok(MAX_SLEEP);
        }
        let mut pipe = redis::pipe();
        for v in &vouchers {
            pipe.zrange_withscores(VoucherKeys::new(&self.cfg.prefix, *v)?.timeouts(), 0, 0);
        }
        let firsts: Vec<Vec<(String, f64)>> = pipe.query_async(&mut self.conn).await?;
        let earliest = firsts.iter().flatten().map(|(_, s)| *s as i64).min();
        let now = now_ms();
        Ok(match earliest {
            Some(t) if t <= now => Duration::ZERO,
            Some(t) => Duration::from_millis((t - now) as u64).min(MAX_SLEEP),
            None => MAX_SLEEP,
        })
    }

    /// Whether any deadline is due now (for --until-idle).
    pub async fn any_due(&mut self) -> Result<bool> {
        Ok(self.until_next_due().await? == Duration::ZERO)
    }
}
