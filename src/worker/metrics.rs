//! `seckill worker --metrics-addr`: the worker's counters, batch latency,
//! deadline lateness, and per voucher the stream backlog and its age, the
//! gate's stock, buyers, waitlist, dead letters and pause, in OpenMetrics
//! text (GET /metrics), on the same stack as `seckill serve` (axum and the
//! Prometheus org's client crate). Per-voucher values are read from Redis
//! at each scrape into a registry made for that scrape, so a voucher no
//! longer registered leaves the page with it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use redis::AsyncCommands;

use super::stats::{StatsSnapshot, WorkerStats};
use crate::error::Result;
use crate::gate::policy::{self, Rejections};
use crate::gate::state::GateState;
use crate::store::config::Config;
use crate::store::redis_conn;
use crate::store::registry;
use crate::stream::backlog::{backlog_and_oldest, Backlog};
use crate::support::timespec::now_ms;

/// Binds now (so a busy port fails the worker at start), then serves until `stop`.
pub async fn start(
    addr: SocketAddr,
    cfg: Arc<Config>,
    stats: Arc<WorkerStats>,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>> {
    let page = Router::new().route(
        "/metrics",
        get(move || {
            let (cfg, stats) = (cfg.clone(), stats.clone());
            async move {
                let body = render(&cfg, &stats).await;
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    body,
                )
            }
        }),
    );
    let (task, addr) = crate::support::metrics_page::start(addr, page, stop).await?;
    tracing::info!("metrics on http://{addr}/metrics");
    Ok(task)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VoucherLabel {
    voucher: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabels {
    voucher: u64,
    reason: &'static str,
}

/// What the page shows of one registered voucher, read at the scrape.
struct VoucherRow {
    voucher: u64,
    backlog: Backlog,
    /// Age of the oldest entry not yet acknowledged (none: nothing in flight).
    oldest_age_ms: Option<u64>,
    rejections: Rejections,
    paused: bool,
    gate: GateState,
    dead_letters: u64,
}

async fn render(cfg: &Config, stats: &WorkerStats) -> String {
    let mut registry = Registry::with_prefix("seckill");
    register_worker(&mut registry, stats);
    match voucher_rows(cfg).await {
        Ok(rows) => register_vouchers(&mut registry, &rows),
        Err(e) => tracing::warn!("metrics: could not read the vouchers' gates and streams: {e}"),
    }
    let mut out = String::new();
    if let Err(e) = encode(&mut out, &registry) {
        tracing::warn!("metrics: could not encode: {e}");
    }
    out
}

fn register_worker(registry: &mut Registry, stats: &WorkerStats) {
    let s = stats.snapshot();
    for (name, help, value) in worker_counters(&s) {
        registry.register(name, help, ConstCounter::new(value));
    }
    registry.register(
        "mysql_commits_lost",
        "Orders the gates saw workers commit that MySQL no longer holds, at the gate guard's last pass (above 0: MySQL lost commits)",
        ConstGauge::new(s.mysql_commits_lost as f64),
    );
    registry.register(
        "orders_held",
        "Pending orders restored after MySQL lost them whose payment only the payment provider knows: held for the operator (pay or unhold them)",
        ConstGauge::new(s.orders_held as f64),
    );
    registry.register(
        "deadline_lateness_max_seconds",
        "Worst time from a payment deadline to its cancellation",
        ConstGauge::new(s.max_lateness_ms as f64 / 1000.0),
    );
    registry.register(
        "deadline_lateness_seconds",
        "Per deadline pass that cancelled orders, how late its latest cancellation was",
        stats.timings.lateness_seconds.clone(),
    );
    registry.register(
        "batch_duration_seconds",
        "Time to persist one batch (lock, MySQL, finish)",
        stats.timings.batch_seconds.clone(),
    );
}

/// The worker's counters: name, help, value. Names without `_total`: the
/// encoder adds it to counters.
fn worker_counters(s: &StatsSnapshot) -> [(&'static str, &'static str, u64); 20] {
    [
    (
        "orders_persisted",
        "Orders inserted into MySQL by this worker",
        s.persisted,
    ),
    (
        "units_persisted",
        "Units the orders inserted into MySQL by this worker hold",
        s.units_persisted,
    ),
    (
        "orders_duplicate",
        "Redelivered entries whose order was already stored",
        s.duplicates,
    ),
    (
        "dead_lettered",
        "Messages moved to a dead-letter stream",
        s.dead_lettered,
    ),
    (
        "entries_reclaimed",
        "Entries taken over from silent consumers",
        s.reclaimed,
    ),
    (
        "lock_denied",
        "Entries left pending because another worker held the user's lock",
        s.lock_denied,
    ),
    (
        "lock_lost",
        "Lock leases that expired while their batch was being persisted",
        s.lock_lost,
    ),
    (
        "orders_cancelled",
        "Unpaid orders cancelled at their payment deadline",
        s.cancelled,
    ),
    (
        "units_released",
        "Units given back at the gate after a cancellation",
        s.released,
    ),
    (
        "promotions",
        "Units handed to waitlisted users (released ones and the gate's stock they joined)",
        s.promoted,
    ),
    (
        "deadline_errors",
        "Voucher passes of the payment deadlines that failed (each retried)",
        s.deadline_errors,
    ),
    (
        "gate_pauses",
        "Gates paused by this worker because Redis lost writes MySQL holds",
        s.gate_pauses,
    ),
    (
        "gate_pauses_mysql_lost_commits",
        "Gates paused by this worker because MySQL held fewer orders than its workers committed",
        s.mysql_loss_pauses,
    ),
    (
        "orders_restored",
        "Orders MySQL lost that this worker's gate guard restored into it from the kept stream entries",
        s.orders_restored,
    ),
    (
        "payments_restored",
        "Payments MySQL lost that this worker's canceller made again, the gate having seen them paid",
        s.payments_restored,
    ),
    (
        "gate_reopens",
        "Paused or lost gates this worker rebuilt from MySQL and reopened",
        s.gate_reopens,
    ),
    (
        "gate_guard_passes",
        "Passes of this worker's gate guard over every voucher it watches",
        s.guard_passes,
    ),
    (
        "units_moved",
        "Units the mover moved between the buckets of vouchers split in buckets",
        s.units_moved,
    ),
    (
        "transfers_completed",
        "Transfers between buckets a stopped mover left half done, completed",
        s.transfers_completed,
    ),
    (
        "worker_retries",
        "Retries after a failed call to Redis or MySQL (an outage, a timeout)",
        crate::support::backoff::retries(),
    ),
    ]
}

fn register_vouchers(registry: &mut Registry, rows: &[VoucherRow]) {
    let gauge = |registry: &mut Registry,
                 name: &str,
                 help: &str,
                 value: &dyn Fn(&VoucherRow) -> Option<f64>| {
        let family = Family::<VoucherLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for r in rows {
            if let Some(v) = value(r) {
                family
                    .get_or_create(&VoucherLabel { voucher: r.voucher })
                    .set(v);
            }
        }
        registry.register(name, help, family);
    };
    gauge(
        registry,
        "stream_lag",
        "Order stream entries not yet delivered to the worker group",
        &|r| Some(r.backlog.undelivered as f64),
    );
    gauge(
        registry,
        "stream_pending",
        "Order stream entries delivered but not acknowledged",
        &|r| Some(r.backlog.pending as f64),
    );
    gauge(
        registry,
        "stream_oldest_age_seconds",
        "Age of the oldest order stream entry not yet acknowledged (0: none in flight)",
        &|r| Some(r.oldest_age_ms.unwrap_or(0) as f64 / 1000.0),
    );
    gauge(
        registry,
        "gate_paused",
        "1 while the voucher's gate is paused for a rebuild",
        &|r| Some(f64::from(u8::from(r.paused))),
    );
    gauge(
        registry,
        "gate_stock",
        "Units left at the voucher's gate",
        &|r| r.gate.stock.map(|s| s as f64),
    );
    gauge(
        registry,
        "gate_buyers",
        "Users admitted at the voucher's gate",
        &|r| Some(r.gate.buyers as f64),
    );
    gauge(
        registry,
        "gate_waitlist",
        "Users waiting on the voucher's waitlist",
        &|r| Some(r.gate.waitlist as f64),
    );
    gauge(
        registry,
        "dead_letters",
        "Entries in the voucher's dead-letter stream",
        &|r| Some(r.dead_letters as f64),
    );
    let rejections = Family::<RejectionLabels, Counter>::default();
    for r in rows {
        for (reason, n) in [
            ("rate_limited", r.rejections.rate_limited),
            ("bad_token", r.rejections.bad_token),
        ] {
            rejections
                .get_or_create(&RejectionLabels {
                    voucher: r.voucher,
                    reason,
                })
                .inc_by(n);
        }
    }
    registry.register(
        "gate_rejections",
        "Admission attempts the voucher's policy turned away",
        rejections,
    );
}

/// Vouchers read at once per scrape: each costs a few round trips, and a
/// scrape must end well inside Prometheus's timeout with thousands of them.
const CONCURRENT_READS: usize = 32;

async fn voucher_rows(cfg: &Config) -> Result<Vec<VoucherRow>> {
    use futures_util::stream::{self, StreamExt};
    let mut conn = redis_conn::connect(cfg).await?;
    let ids = registry::members(&mut conn, &cfg.prefix).await?;
    let layouts = crate::store::layout::read_many(&mut conn, &cfg.prefix, &ids).await?;
    let gates = crate::gate::state::read_vouchers(&mut conn, &cfg.prefix, &ids).await?;
    let now = u64::try_from(now_ms()).unwrap_or(0);
    let rows = stream::iter(layouts.into_iter().zip(gates))
        .map(|(layout, gate)| {
            let mut conn = conn.clone();
            async move {
                let row = voucher_row(&mut conn, &layout, gate, now).await;
                if let Err(e) = &row {
                    // One voucher's failed read leaves the others on the page.
                    tracing::warn!("metrics: voucher {}: {e}", layout.voucher());
                }
                row.ok()
            }
        })
        .buffered(CONCURRENT_READS)
        .filter_map(|row| async move { row })
        .collect()
        .await;
    Ok(rows)
}

async fn voucher_row(
    conn: &mut redis_conn::Redis,
    layout: &crate::store::layout::Layout,
    gate: GateState,
    now: u64,
) -> Result<VoucherRow> {
    // A voucher split in buckets: its buckets' streams, rejections and
    // dead letters add up; the oldest entry is the oldest of any; paused
    // if any bucket is.
    let mut row = VoucherRow {
        voucher: layout.voucher(),
        backlog: Backlog::default(),
        oldest_age_ms: None,
        rejections: Rejections::default(),
        paused: false,
        gate,
        dead_letters: 0,
    };
    for k in layout.all_keys()? {
        let (backlog, oldest) = backlog_and_oldest(conn, &k).await?;
        row.backlog.length += backlog.length;
        row.backlog.undelivered += backlog.undelivered;
        row.backlog.pending += backlog.pending;
        let age = oldest.map(|t| now.saturating_sub(t));
        row.oldest_age_ms = row.oldest_age_ms.max(age);
        let rejected = policy::rejections(conn, &k).await?;
        row.rejections.rate_limited += rejected.rate_limited;
        row.rejections.bad_token += rejected.bad_token;
        row.paused |= crate::gate::pause::is_paused(conn, &k).await?;
        let dead: u64 = conn.xlen(k.dead()).await?;
        row.dead_letters += dead;
    }
    Ok(row)
}
