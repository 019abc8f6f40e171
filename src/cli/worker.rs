//! `seckill worker`

use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::common::{parse_duration, Format, FormatOpt, NodeIdOpt};
use super::render::{print_json, table};
use crate::exit_code;
use crate::store::config::Config;
use crate::support::shutdown;
use crate::worker::{
    self, default_consumer, DeadlineOptions, StatsSnapshot, WorkerOptions, WorkerStats,
};

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Consumer name in the group, stable per instance [default: host-pid]
    #[arg(long, env = "SECKILL_CONSUMER", hide_env_values = true)]
    pub consumer: Option<String>,
    /// Entries read and persisted per batch (one MySQL transaction)
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Largest batch while a backlog lasts: reads that come back full
    /// double the next one's size up to this (--batch or less: no growth)
    #[arg(long, default_value_t = 2048)]
    pub max_batch: usize,
    /// Longest wait of one blocking read for new entries
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub block: Duration,
    /// Reclaim entries another consumer has left pending this long
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub claim_idle: Duration,
    /// Dead-letter a message that cannot be persisted after this many deliveries
    #[arg(long, default_value_t = 5)]
    pub max_deliveries: u64,
    /// Lease of the per-(user, voucher) locks, renewed while a batch runs
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub lock_lease: Duration,
    /// Longest a batch's (or a cancellation's) MySQL transaction may take,
    /// from its connection to its COMMIT's answer; past it, it is
    /// abandoned: its connection thrown away, its session ended, its batch
    /// left for another worker (more than half --lock-lease)
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub mysql_timeout: Duration,
    /// Trim acknowledged stream entries older than this
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub keep: Duration,
    /// Batches in hand at once (one reads and locks while another commits)
    #[arg(long, default_value_t = 2)]
    pub lanes: usize,
    /// A claimed payment deadline comes back after this long if its claimer died
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub deadline_lease: Duration,
    /// How often MySQL is swept for pending orders whose deadline Redis lost
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub sweep_every: Duration,
    /// How far past its deadline a pending order must be for the sweep to cancel it
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub sweep_grace: Duration,
    /// How often the gates are checked for writes Redis lost that MySQL
    /// holds (then paused, rebuilt from MySQL and reopened); 0s: never
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub gate_check: Duration,
    #[command(flatten)]
    pub node: NodeIdOpt,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464)
    #[arg(long, env = "SECKILL_METRICS_ADDR", hide_env_values = true)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Exit 0 once no voucher has undelivered or pending entries (for cron)
    #[arg(long)]
    pub until_idle: bool,
    #[command(flatten)]
    pub format: FormatOpt,
}

pub async fn run(cfg: &Config, args: WorkerArgs) -> anyhow::Result<u8> {
    let opts = WorkerOptions {
        consumer: args.consumer.unwrap_or_else(default_consumer),
        batch: args.batch,
        max_batch: args.max_batch,
        block: args.block,
        claim_idle: args.claim_idle,
        max_deliveries: args.max_deliveries,
        lock_lease: args.lock_lease,
        mysql_timeout: args.mysql_timeout,
        until_idle: args.until_idle,
        keep: args.keep,
        lanes: args.lanes,
        node_id: args.node.node_id,
        deadlines: DeadlineOptions {
            lease: args.deadline_lease,
            sweep_every: args.sweep_every,
            sweep_grace: args.sweep_grace,
            batch: args.batch,
        },
        metrics_addr: args.metrics_addr,
        gate_check: args.gate_check,
    };
    opts.validate()?;
    let stop = shutdown::on_signals()?;
    let stats = Arc::new(WorkerStats::default());
    let started = std::time::Instant::now();
    worker::run(cfg, &opts, stop, stats.clone()).await?;
    let summary = Summary {
        consumer: opts.consumer,
        elapsed_ms: started.elapsed().as_millis() as u64,
        stats: stats.snapshot(),
    };
    tracing::info!(
        "worker {} stopped: {} persisted, {} duplicates, {} dead-lettered",
        summary.consumer,
        summary.stats.persisted,
        summary.stats.duplicates,
        summary.stats.dead_lettered
    );
    match args.format.format {
        Format::Json => print_json(&summary)?,
        Format::Table => outln!("{}", summary_table(&summary))?,
    }
    Ok(exit_code::OK)
}

#[derive(serde::Serialize)]
struct Summary {
    consumer: String,
    elapsed_ms: u64,
    #[serde(flatten)]
    stats: StatsSnapshot,
}

fn summary_table(s: &Summary) -> comfy_table::Table {
    let mut t = table(&["worker", "value"]);
    let rows = [
        ("consumer", s.consumer.clone()),
        ("ran for", format!("{:.1} s", s.elapsed_ms as f64 / 1000.0)),
        ("orders persisted", s.stats.persisted.to_string()),
        ("duplicates skipped", s.stats.duplicates.to_string()),
        ("dead-lettered", s.stats.dead_lettered.to_string()),
        ("batches", s.stats.batches.to_string()),
        ("entries reclaimed", s.stats.reclaimed.to_string()),
        (
            "left pending (lock held elsewhere)",
            s.stats.lock_denied.to_string(),
        ),
        ("lock leases lost", s.stats.lock_lost.to_string()),
        ("unpaid orders cancelled", s.stats.cancelled.to_string()),
        ("units given back", s.stats.released.to_string()),
        ("units handed to the waitlist", s.stats.promoted.to_string()),
        (
            "worst deadline lateness",
            format!("{} ms", s.stats.max_lateness_ms),
        ),
        (
            "failed deadline passes (retried)",
            s.stats.deadline_errors.to_string(),
        ),
        (
            "gates paused (Redis lost writes)",
            s.stats.gate_pauses.to_string(),
        ),
        (
            "gates paused (MySQL lost commits)",
            s.stats.mysql_loss_pauses.to_string(),
        ),
        (
            "orders restored into MySQL",
            s.stats.orders_restored.to_string(),
        ),
        (
            "payments MySQL lost, made again",
            s.stats.payments_restored.to_string(),
        ),
        (
            "gates rebuilt and reopened",
            s.stats.gate_reopens.to_string(),
        ),
        (
            "units moved between buckets",
            s.stats.units_moved.to_string(),
        ),
    ];
    for (k, v) in rows {
        t.add_row(vec![k.to_string(), v]);
    }
    t
}
