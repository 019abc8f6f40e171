//! `seckill status`

use std::io::IsTerminal;
use std::time::Duration;

use clap::Args;

use super::common::{parse_duration, parse_id, Format, FormatOpt};
use super::render::{self, print_json, table};
use crate::exit_code;
use crate::status::{self, VoucherStatus};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::redis_conn;
use crate::support::timespec::{format_duration_ms, format_ms, now_ms};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Only these vouchers (repeatable)
    #[arg(long = "voucher", value_parser = parse_id, allow_hyphen_values = true)]
    pub vouchers: Vec<u64>,
    /// Refresh every so often until Ctrl-C (in place on a terminal)
    #[arg(long, num_args = 0..=1, default_missing_value = "2s", value_parser = parse_duration)]
    pub watch: Option<Duration>,
    #[command(flatten)]
    pub format: FormatOpt,
}

pub async fn run(cfg: &Config, args: StatusArgs) -> anyhow::Result<u8> {
    let db = Db::connect(cfg).await?;
    let mut redis = redis_conn::connect(cfg).await?;
    let result = watch_loop(cfg, &args, &db, &mut redis).await;
    db.close().await;
    result
}

async fn watch_loop(
    cfg: &Config,
    args: &StatusArgs,
    db: &Db,
    redis: &mut crate::store::redis_conn::Redis,
) -> anyhow::Result<u8> {
    let in_place = std::io::stdout().is_terminal() && args.format.format == Format::Table;
    let mut shown = false;
    loop {
        let rows = match (
            status::read(db, redis, &cfg.prefix, &args.vouchers).await,
            args.watch,
        ) {
            (Ok(rows), _) => rows,
            // Watching rides out a store's restart: it says so and looks
            // again next time, on a new Redis connection (MySQL's pool
            // drops the broken ones itself). A first read that fails is an
            // error, as without --watch: a typo or a wrong password does
            // not wait forever.
            (Err(e), Some(every)) if shown => {
                tracing::warn!(
                    "status: {e}; looking again in {}",
                    humantime::format_duration(every)
                );
                if let Ok(fresh) = redis_conn::connect(cfg).await {
                    *redis = fresh;
                }
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => return Ok(exit_code::OK),
                    _ = tokio::time::sleep(every) => {}
                }
                continue;
            }
            (Err(e), _) => return Err(e.into()),
        };
        shown = true;
        if in_place {
            // Clear the screen and home the cursor: a refresh, not a scroll.
            out!("\x1b[2J\x1b[H")?;
        }
        match args.format.format {
            Format::Json => print_json(&rows)?,
            Format::Table => outln!("{}", status_table(&rows, now_ms()))?,
        }
        let Some(every) = args.watch else {
            return Ok(exit_code::OK);
        };
        if render::reader_gone() {
            return Ok(exit_code::OK);
        }
        if in_place {
            outln!(
                "refreshing every {} (Ctrl-C to quit)",
                humantime::format_duration(every)
            )?;
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(exit_code::OK),
            _ = tokio::time::sleep(every) => {}
        }
    }
}

fn next_deadline(r: &VoucherStatus, now: i64) -> String {
    let next = match (r.next_deadline_ms, &r.deadline_read_error) {
        (_, Some(e)) => format!("unreadable: {e}"),
        (None, None) => "-".into(),
        // Whole seconds read better than humantime's milliseconds here.
        (Some(t), None) if t > now => {
            format!("in {}", format_duration_ms((t - now) / 1000 * 1000))
        }
        (Some(t), None) => format!("due {} ago", format_duration_ms((now - t) / 1000 * 1000)),
    };
    match r.deadline_errors {
        0 => next,
        n => format!("{next} ({n} failed passes)"),
    }
}

fn rejected(r: &VoucherStatus) -> String {
    match (r.rejected.rate_limited, r.rejected.bad_token) {
        (0, 0) => "-".into(),
        (rate, token) => format!("rate {rate}, token {token}"),
    }
}

pub fn status_table(rows: &[VoucherStatus], now: i64) -> comfy_table::Table {
    let mut t = table(&[
        "voucher",
        "state",
        "sale window (UTC)",
        "total",
        "redis stock",
        "mysql stock",
        "pending",
        "paid",
        "cancelled",
        "in flight",
        "dead",
        "waitlist",
        "policy",
        "rejected",
        "next deadline",
    ]);
    for r in rows {
        let v = &r.voucher;
        t.add_row(vec![
            v.id.to_string(),
            if r.paused {
                match r.paused_reason.as_deref() {
                    Some("mysql_lost_commits") => "paused (MySQL lost commits)".to_string(),
                    Some("redis_lost_writes") => "paused (Redis lost writes)".to_string(),
                    _ => "paused".to_string(),
                }
            } else {
                r.voucher.sale_state(now).to_string()
            },
            format!("{} -> {}", format_ms(v.begin_ms), format_ms(v.end_ms)),
            v.total_stock.to_string(),
            if r.gate_loaded {
                r.redis_stock.map_or("-".into(), |s| s.to_string())
            } else {
                "not loaded".into()
            },
            v.stock.to_string(),
            v.orders_pending.to_string(),
            v.orders_paid.to_string(),
            v.orders_cancelled.to_string(),
            r.in_flight().to_string(),
            r.dead_letters.to_string(),
            r.waitlist.to_string(),
            v.policy.describe(),
            rejected(r),
            next_deadline(r, now),
        ]);
    }
    t
}
