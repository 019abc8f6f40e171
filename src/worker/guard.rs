//! The gate guard: finds a gate that lost writes MySQL already holds (Redis
//! restarted from older data, or a replica took over before it had them),
//! pauses its admission, rebuilds it from MySQL with the reconcile logic
//! (in-flight work accounted for), and reopens it.
//!
//! The sign: every order in MySQL was admitted at the gate first, which made
//! its user a buyer, and nothing takes a buyer with an order away — so a
//! gate with fewer buyers than MySQL has orders lost writes. MySQL is read
//! first and the gate second, so an order committed in between had its
//! buyer recorded before it (no false alarm). A lost admission takes its
//! stock decrement with it (one script, one write to the AOF and the
//! replicas), so such a gate also has units MySQL no longer has: left
//! open, it would tell new buyers "success" for orders MySQL must refuse,
//! and let earlier buyers buy again.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{FromRedisValue, Value};
use tokio_util::sync::CancellationToken;

use super::WorkerStats;
use crate::error::{Error, Result};
use crate::gate::pause::{self, META_PAUSED};
use crate::orders::order;
use crate::reconcile::{self, Outcome};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::{self, pipeline_per_item, Redis};
use crate::store::registry;
use crate::support::backoff::Backoff;

/// Cancellations and new orders younger than this are still a worker's
/// business, not drift (reconcile's default).
const SETTLE_MS: i64 = 60_000;

pub struct GateGuard {
    pub(super) cfg: Arc<Config>,
    pub(super) db: Db,
    pub(super) conn: Redis,
    pub(super) ids: Arc<OrderIds>,
    pub(super) stats: Arc<WorkerStats>,
    pub(super) every: Duration,
    /// Every voucher seen in the registry: one the registry lost is still
    /// watched.
    pub(super) known: BTreeSet<u64>,
    /// When each paused gate was found, for the log.
    pub(super) paused_since: std::collections::HashMap<u64, Instant>,
}

/// One gate as the guard reads it.
struct Look {
    loaded: bool,
    buyers: u64,
    paused: bool,
}

impl GateGuard {
    pub async fn run(mut self, stop: CancellationToken) {
        let mut backoff = Backoff::default();
        loop {
            let delay = match self.pass().await {
                Ok(()) => {
                    backoff.reset();
                    self.every
                }
                Err(e) => {
                    let delay = backoff
                        .next_delay()
                        .min(self.every.max(Duration::from_secs(1)));
                    tracing::warn!(
                        "gate guard: {e}; retrying in {}",
                        humantime::format_duration(delay)
                    );
                    if let Ok(c) = redis_conn::connect(&self.cfg).await {
                        self.conn = c;
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

    /// Looks at every voucher once: pauses those that lost writes, and
    /// rebuilds and reopens those paused.
    pub async fn pass(&mut self) -> Result<()> {
        let registered = registry::members(&mut self.conn, &self.cfg.prefix).await?;
        self.known.extend(registered);
        let vouchers: Vec<u64> = self.known.iter().copied().collect();
        // MySQL first: see the module comment.
        let orders = order::count_per_voucher(&self.db, &vouchers).await?;
        let keys: Vec<VoucherKeys> = vouchers
            .iter()
            .map(|v| VoucherKeys::new(&self.cfg.prefix, *v))
            .collect::<Result<_>>()?;
        let rows = pipeline_per_item(&mut self.conn, &keys, false, false, |pipe, k| {
            pipe.exists(k.meta())
                .scard(k.buyers())
                .hget(k.meta(), META_PAUSED);
            Ok(())
        })
        .await?;
        let mut paused_now = 0;
        for ((v, k), row) in vouchers.iter().zip(&keys).zip(rows) {
            let (loaded, buyers, paused): (bool, u64, Option<String>) =
                FromRedisValue::from_redis_value(Value::Array(row))
                    .map_err(|e| Error::Redis(format!("gate of voucher {v}: {e}")))?;
            let look = Look {
                loaded,
                buyers,
                paused: paused.as_deref() == Some("1"),
            };
            let held = orders.get(v).copied().unwrap_or(0);
            if self.watch(*v, k, &look, held).await? {
                paused_now += 1;
            }
        }
        self.stats.set_gates_paused(paused_now);
        Ok(())
    }

    /// Handles one gate; true while it stays paused (or lost).
    async fn watch(
        &mut self,
        v: u64,
        keys: &VoucherKeys,
        look: &Look,
        orders: u64,
    ) -> Result<bool> {
        if !look.loaded {
            // A gate lost whole admits nobody ("unknown voucher"): nothing
            // to pause. Rebuilt only when MySQL holds orders of it (what
            // Redis lost); one without orders waits for `seckill preload`.
            if orders == 0 {
                return Ok(false);
            }
            tracing::warn!(
                "voucher {v}: the gate is gone from Redis but MySQL holds {orders} order(s) of it: rebuilding it from MySQL"
            );
            self.paused_since.entry(v).or_insert_with(Instant::now);
            return self.rebuild(v, keys).await;
        }
        if look.buyers < orders && !look.paused {
            pause::pause(&mut self.conn, keys).await?;
            self.stats.add_gate_pause();
            self.paused_since.insert(v, Instant::now());
            tracing::warn!(
                "voucher {v}: the gate has {} buyer(s) but MySQL holds {orders} order(s): Redis lost writes; admission paused until the gate is rebuilt from MySQL",
                look.buyers
            );
            crate::support::fault::pause("gate_paused").await;
        } else if !look.paused {
            return Ok(false);
        }
        self.rebuild(v, keys).await
    }

    /// Reconcile's repair for the voucher, then a reopening if the gate now
    /// has a buyer for every order; true while it stays paused.
    async fn rebuild(&mut self, v: u64, keys: &VoucherKeys) -> Result<bool> {
        let opts = reconcile::Options {
            dry_run: false,
            fix_mysql: false,
            attempts: 5,
            settle_ms: SETTLE_MS,
        };
        let report = match reconcile::reconcile_voucher(
            &self.db,
            &mut self.conn,
            &self.cfg.prefix,
            v,
            None,
            &opts,
            Some(&self.ids),
        )
        .await
        {
            Ok(r) => r,
            Err(Error::VoucherNotFound(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        if !matches!(report.outcome, Outcome::Consistent | Outcome::Repaired) {
            tracing::debug!("voucher {v}: gate not rebuilt yet ({:?})", report.outcome);
            return Ok(true);
        }
        let orders = order::count_per_voucher(&self.db, &[v])
            .await?
            .get(&v)
            .copied()
            .unwrap_or(0);
        if !pause::reopen(&mut self.conn, keys, orders).await? {
            return Ok(true);
        }
        let since = self
            .paused_since
            .remove(&v)
            .map(|t| {
                format!(
                    " after {}",
                    humantime::format_duration(round_ms(t.elapsed()))
                )
            })
            .unwrap_or_default();
        let repaired: Vec<String> = report
            .drifts
            .iter()
            .map(|d| {
                let class = serde_json::to_value(d.class)
                    .ok()
                    .and_then(|c| c.as_str().map(str::to_string))
                    .unwrap_or_default();
                format!("{class} {}", d.amount)
            })
            .collect();
        self.stats.add_gate_reopen();
        tracing::warn!(
            "voucher {v}: gate rebuilt from MySQL ({}) and reopened{since}",
            if repaired.is_empty() {
                "nothing to repair".to_string()
            } else {
                repaired.join(", ")
            }
        );
        Ok(false)
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
