//! `seckill worker --metrics-addr`: the worker's counters, batch latency and
//! per-voucher stream backlog in Prometheus text format (GET /metrics), on
//! the same HTTP stack as `seckill serve` (axum).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::stats::{StatsSnapshot, WorkerStats, BATCH_BUCKETS};
use crate::error::{Error, Result};
use crate::gate::policy::{self, Rejections};
use crate::store::config::Config;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn;
use crate::store::registry;
use crate::stream::backlog::backlog;

/// Binds now (so a busy port fails the worker at start), then serves until `stop`.
pub async fn start(
    addr: SocketAddr,
    cfg: Arc<Config>,
    stats: Arc<WorkerStats>,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::InvalidInput(format!("--metrics-addr {addr}: {e}")))?;
    tracing::info!("metrics on http://{addr}/metrics");
    let page = Router::new().route(
        "/metrics",
        get(move || {
            let (cfg, stats) = (cfg.clone(), stats.clone());
            async move {
                let body = render(&cfg, &stats.snapshot(), &stats.batch_histogram()).await;
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
            }
        }),
    );
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, page)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::warn!("metrics endpoint stopped: {e}");
        }
    }))
}

async fn render(
    cfg: &Config,
    s: &StatsSnapshot,
    hist: &([u64; BATCH_BUCKETS.len()], u64, f64),
) -> String {
    let mut out = String::new();
    let counters: [(&str, &str, u64); 14] = [
        (
            "seckill_orders_persisted_total",
            "Orders inserted into MySQL by this worker",
            s.persisted,
        ),
        (
            "seckill_units_persisted_total",
            "Units the orders inserted into MySQL by this worker hold",
            s.units_persisted,
        ),
        (
            "seckill_orders_duplicate_total",
            "Redelivered entries whose order was already stored",
            s.duplicates,
        ),
        (
            "seckill_dead_lettered_total",
            "Messages moved to a dead-letter stream",
            s.dead_lettered,
        ),
        (
            "seckill_entries_reclaimed_total",
            "Entries taken over from silent consumers",
            s.reclaimed,
        ),
        (
            "seckill_lock_denied_total",
            "Entries left pending because another worker held the user's lock",
            s.lock_denied,
        ),
        (
            "seckill_lock_lost_total",
            "Lock leases that expired while their batch was being persisted",
            s.lock_lost,
        ),
        (
            "seckill_orders_cancelled_total",
            "Unpaid orders cancelled at their payment deadline",
            s.cancelled,
        ),
        (
            "seckill_units_released_total",
            "Units given back at the gate after a cancellation",
            s.released,
        ),
        (
            "seckill_promotions_total",
            "Units handed to waitlisted users (released ones and the gate's stock they joined)",
            s.promoted,
        ),
        (
            "seckill_deadline_errors_total",
            "Voucher passes of the payment deadlines that failed (each retried)",
            s.deadline_errors,
        ),
        (
            "seckill_gate_pauses_total",
            "Gates paused by this worker because Redis lost writes MySQL holds",
            s.gate_pauses,
        ),
        (
            "seckill_gate_reopens_total",
            "Paused or lost gates this worker rebuilt from MySQL and reopened",
            s.gate_reopens,
        ),
        (
            "seckill_gate_guard_passes_total",
            "Passes of this worker's gate guard over every voucher it watches",
            s.guard_passes,
        ),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP seckill_deadline_lateness_max_seconds Worst time from a payment deadline to its cancellation\n\
         # TYPE seckill_deadline_lateness_max_seconds gauge\n\
         seckill_deadline_lateness_max_seconds {}",
        s.max_lateness_ms as f64 / 1000.0
    );
    let (buckets, count, sum) = hist;
    let _ = writeln!(
        out,
        "# HELP seckill_batch_duration_seconds Time to persist one batch (lock, MySQL, finish)\n\
         # TYPE seckill_batch_duration_seconds histogram"
    );
    let mut cumulative = 0;
    for (le, n) in BATCH_BUCKETS.iter().zip(buckets) {
        cumulative += n;
        let _ = writeln!(
            out,
            "seckill_batch_duration_seconds_bucket{{le=\"{le}\"}} {cumulative}"
        );
    }
    let _ = writeln!(
        out,
        "seckill_batch_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
    );
    let _ = writeln!(out, "seckill_batch_duration_seconds_sum {sum}");
    let _ = writeln!(out, "seckill_batch_duration_seconds_count {count}");
    match stream_backlog(cfg).await {
        Ok(rows) => {
            let _ = writeln!(
                out,
                "# HELP seckill_stream_lag Order stream entries not yet delivered to the worker group\n\
                 # TYPE seckill_stream_lag gauge"
            );
            for (v, lag, ..) in &rows {
                let _ = writeln!(out, "seckill_stream_lag{{voucher=\"{v}\"}} {lag}");
            }
            let _ = writeln!(
                out,
                "# HELP seckill_gate_paused 1 while the voucher's gate is paused for a rebuild\n\
                 # TYPE seckill_gate_paused gauge"
            );
            for (v, .., paused) in &rows {
                let _ = writeln!(
                    out,
                    "seckill_gate_paused{{voucher=\"{v}\"}} {}",
                    u8::from(*paused)
                );
            }
            let _ = writeln!(
                out,
                "# HELP seckill_stream_pending Order stream entries delivered but not acknowledged\n\
                 # TYPE seckill_stream_pending gauge"
            );
            for (v, _, pending, ..) in &rows {
                let _ = writeln!(out, "seckill_stream_pending{{voucher=\"{v}\"}} {pending}");
            }
            let _ = writeln!(
                out,
                "# HELP seckill_gate_rejections_total Admission attempts the voucher's policy turned away\n\
                 # TYPE seckill_gate_rejections_total counter"
            );
            for (v, _, _, r, _) in &rows {
                for (reason, n) in [("rate_limited", r.rate_limited), ("bad_token", r.bad_token)] {
                    let _ = writeln!(
                        out,
                        "seckill_gate_rejections_total{{voucher=\"{v}\",reason=\"{reason}\"}} {n}"
                    );
                }
            }
        }
        Err(e) => tracing::warn!("metrics: could not read the stream backlog: {e}"),
    }
    out
}

/// Per registered voucher: lag, pending, the gate's policy rejections and
/// whether it is paused.
async fn stream_backlog(cfg: &Config) -> Result<Vec<(u64, u64, u64, Rejections, bool)>> {
    let mut conn = redis_conn::connect(cfg).await?;
    let ids = registry::members(&mut conn, &cfg.prefix).await?;
    let mut out = Vec::with_capacity(ids.len());
    for v in ids {
        let keys = VoucherKeys::new(&cfg.prefix, v)?;
        let b = backlog(&mut conn, &keys).await?;
        let r = policy::rejections(&mut conn, &keys).await?;
        let paused = crate::gate::pause::is_paused(&mut conn, &keys).await?;
        out.push((v, b.undelivered, b.pending, r, paused));
    }
    Ok(out)
}
