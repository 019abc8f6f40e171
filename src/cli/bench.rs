//! `seckill bench`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::common::{parse_id, Format, FormatOpt, NodeIdOpt, ReplicaWaitOpt};
use super::render::{print_json, table};
use crate::bench::{self, BenchPlan, BenchReport};
use crate::exit_code;
use crate::store::config::Config;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Voucher id (preloaded)
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub voucher: u64,
    /// Distinct users; attempt i is made by user (user-offset + i mod users + 1)
    #[arg(long, default_value_t = 1000)]
    pub users: u64,
    /// First user id is user-offset + 1
    #[arg(long, default_value_t = 0)]
    pub user_offset: u64,
    /// Admission attempts in all
    #[arg(long, default_value_t = 2000)]
    pub attempts: u64,
    /// Attempts in flight at once
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Redis connections the attempts are spread over
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Issue an admission token to every user first (timed apart from the
    /// attempts) and attempt with it
    #[arg(long)]
    pub tokens: bool,
    /// Units per attempt: K, or a range K-M drawn per attempt
    #[arg(long, default_value = "1", value_name = "K[-M]", value_parser = parse_quantity_range)]
    pub quantity: (u32, u32),
    #[command(flatten)]
    pub replicas: ReplicaWaitOpt,
    #[command(flatten)]
    pub node: NodeIdOpt,
    #[command(flatten)]
    pub format: FormatOpt,
}

pub async fn run(cfg: &Config, args: BenchArgs) -> anyhow::Result<u8> {
    let plan = BenchPlan {
        voucher: args.voucher,
        users: args.users,
        user_offset: args.user_offset,
        attempts: args.attempts,
        concurrency: args.concurrency,
        connections: args.connections,
        node_id: args.node.node_id,
        tokens: args.tokens,
        wait_replicas: args.replicas.wait(),
        quantity: args.quantity,
    };
    plan.validate()?;
    let done = Arc::new(AtomicU64::new(0));
    // indicatif draws nothing when stderr is not a terminal.
    let bar = ProgressBar::with_draw_target(Some(plan.attempts), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} attempts {per_sec} {eta}")
    {
        bar.set_style(style);
    }
    let ticker = {
        let (bar, done) = (bar.clone(), done.clone());
        tokio::spawn(async move {
            loop {
                bar.set_position(done.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let result = bench::run(cfg, &plan, done).await;
    ticker.abort();
    bar.finish_and_clear();
    let report = result?;
    if let Some(e) = &report.first_error {
        tracing::warn!("{} attempt(s) failed; the first with: {e}", report.errors);
    }
    match args.format.format {
        Format::Json => print_json(&report)?,
        Format::Table => outln!("{}", bench_table(&report))?,
    }
    Ok(exit_code::OK)
}

fn bench_table(r: &BenchReport) -> comfy_table::Table {
    let mut t = table(&["measure", "value"]);
    let rows: Vec<(String, String)> = vec![
        ("voucher".into(), r.voucher.to_string()),
        ("attempts".into(), r.attempts.to_string()),
        (
            "elapsed".into(),
            format!("{:.3} s", r.elapsed_ms as f64 / 1000.0),
        ),
        ("attempts/s".into(), format!("{:.0}", r.attempts_per_sec)),
        (
            "concurrency / connections".into(),
            format!("{} / {}", r.concurrency, r.connections),
        ),
        ("latency p50".into(), format!("{} µs", r.latency.p50_us)),
        ("latency p90".into(), format!("{} µs", r.latency.p90_us)),
        ("latency p99".into(), format!("{} µs", r.latency.p99_us)),
        ("latency p99.9".into(), format!("{} µs", r.latency.p999_us)),
        ("latency max".into(), format!("{} µs", r.latency.max_us)),
    ];
    for (k, v) in rows {
        t.add_row(vec![k, v]);
    }
    if let Some(ms) = r.tokens_ms {
        t.add_row(vec![
            "tokens issued first in".to_string(),
            format!("{:.3} s", ms as f64 / 1000.0),
        ]);
    }
    for (name, count) in r.outcomes.pairs() {
        t.add_row(vec![format!("outcome {name}"), count.to_string()]);
    }
    t.add_row(vec![
        "units admitted".to_string(),
        r.units_admitted.to_string(),
    ]);
    t.add_row(vec!["errors".to_string(), r.errors.to_string()]);
    if let Some(short) = r.replicas_short {
        t.add_row(vec![
            "successes short of replicas".to_string(),
            short.to_string(),
        ]);
    }
    t
}

/// `K` or `K-M` (1 <= K <= M).
fn parse_quantity_range(s: &str) -> Result<(u32, u32), String> {
    let (lo, hi) = match s.split_once('-') {
        Some((lo, hi)) => (lo, hi),
        None => (s, s),
    };
    let lo = super::buy::parse_quantity(lo)?;
    let hi = super::buy::parse_quantity(hi)?;
    if lo > hi {
        return Err(format!("'{s}': the range's low end is above its high end"));
    }
    Ok((lo, hi))
}
