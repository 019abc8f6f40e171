//! `seckill pending`

use clap::Args;
use serde::Serialize;

use super::common::{parse_id, Format, FormatOpt};
use super::confirm::{confirm, Confirmation};
use super::render::{print_json, table};
use crate::exit_code;
use crate::gate::buckets;
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn;
use crate::stream::pending::{self, DeadLetterView, PendingEntry, StreamSummary};
use crate::stream::requeue;

#[derive(Args, Debug)]
pub struct PendingArgs {
    /// Show this voucher's pending entries and dead letters
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub voucher: Option<u64>,
    /// How many pending entries and dead letters to list
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Move the voucher's dead letters back into its order stream (after
    /// fixing their cause); with --entry only those
    #[arg(long, requires = "voucher")]
    pub requeue: bool,
    /// A dead-letter id to requeue (repeatable)
    #[arg(long = "entry", requires = "requeue")]
    pub entries: Vec<String>,
    #[command(flatten)]
    pub confirmation: Confirmation,
    #[command(flatten)]
    pub format: FormatOpt,
}

#[derive(Serialize)]
struct VoucherDetail {
    #[serde(flatten)]
    summary: StreamSummary,
    pending_entries: Vec<PendingEntry>,
    dead: Vec<DeadLetterView>,
}

pub async fn run(cfg: &Config, args: PendingArgs) -> anyhow::Result<u8> {
    let mut redis = redis_conn::connect(cfg).await?;
    let Some(voucher) = args.voucher else {
        let rows = pending::summaries(&mut redis, &cfg.prefix).await?;
        match args.format.format {
            Format::Json => print_json(&rows)?,
            Format::Table => outln!("{}", summary_table(&rows))?,
        }
        return Ok(exit_code::OK);
    };
    VoucherKeys::new(&cfg.prefix, voucher)?;
    // Every bucket, bucket 0 lost or not.
    let layout = buckets::for_routing(&mut redis, &cfg.prefix, voucher, async || {
        Db::connect(cfg).await
    })
    .await?;
    if args.requeue {
        let what = if args.entries.is_empty() {
            format!("all dead letters of voucher {voucher}")
        } else {
            format!("{} dead letter(s) of voucher {voucher}", args.entries.len())
        };
        if !confirm(
            &args.confirmation,
            &format!("Requeue {what} into its order stream?"),
        )? {
            errln!("nothing requeued");
            return Ok(exit_code::ERROR);
        }
        let db = Db::connect(cfg).await?;
        let r = requeue::requeue_buckets(cfg, &db, &mut redis, &layout, &args.entries).await;
        db.close().await;
        let r = r?;
        match args.format.format {
            Format::Json => print_json(&r)?,
            Format::Table => {
                outln!(
                    "requeued {} dead letter(s) of voucher {voucher}; {} left where they are",
                    r.requeued,
                    r.skipped
                )?;
                for e in &r.entries {
                    match (&e.order, &e.reason) {
                        (_, Some(reason)) => outln!("  {}: skipped: {reason}", e.id)?,
                        (Some(order), None) => {
                            outln!("  {}: {} as order {order}", e.id, e.outcome)?
                        }
                        (None, None) => outln!("  {}: {}", e.id, e.outcome)?,
                    }
                }
            }
        }
        return Ok(exit_code::OK);
    }
    // Every bucket's stream of a voucher split in buckets, one after another.
    let mut pending_entries = Vec::new();
    let mut dead = Vec::new();
    for keys in layout.all_keys()? {
        pending_entries.extend(pending::pending_entries(&mut redis, &keys, args.limit).await?);
        dead.extend(pending::dead_letters(&mut redis, &keys, args.limit).await?);
    }
    pending_entries.truncate(args.limit);
    dead.truncate(args.limit);
    let detail = VoucherDetail {
        summary: pending::summary_of_buckets(&mut redis, &layout).await?,
        pending_entries,
        dead,
    };
    match args.format.format {
        Format::Json => print_json(&detail)?,
        Format::Table => {
            outln!("{}", summary_table(std::slice::from_ref(&detail.summary)))?;
            if detail.pending_entries.is_empty() {
                outln!("pending entries: none")?;
            } else {
                outln!("pending entries (oldest first):")?;
                outln!("{}", pending_table(&detail.pending_entries))?;
            }
            if detail.dead.is_empty() {
                outln!("dead letters: none")?;
            } else {
                outln!("dead letters:")?;
                outln!("{}", dead_table(&detail.dead))?;
            }
        }
    }
    Ok(exit_code::OK)
}

fn idle(ms: Option<u64>) -> String {
    ms.map_or("-".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
}

fn summary_table(rows: &[StreamSummary]) -> comfy_table::Table {
    let mut t = table(&[
        "voucher",
        "stream",
        "undelivered",
        "pending",
        "oldest pending idle",
        "dead letters",
        "consumers",
        "gate",
    ]);
    for r in rows {
        t.add_row(vec![
            r.voucher.to_string(),
            r.length.to_string(),
            r.undelivered.to_string(),
            r.pending.to_string(),
            idle(r.oldest_pending_idle_ms),
            r.dead_letters.to_string(),
            r.consumers.to_string(),
            if r.paused { "paused" } else { "open" }.to_string(),
        ]);
    }
    t
}

fn pending_table(rows: &[PendingEntry]) -> comfy_table::Table {
    let mut t = table(&[
        "entry",
        "user",
        "order",
        "units",
        "consumer",
        "idle",
        "deliveries",
    ]);
    for r in rows {
        t.add_row(vec![
            r.entry_id.clone(),
            r.user.clone().unwrap_or_else(|| "?".into()),
            r.order.clone().unwrap_or_else(|| "?".into()),
            r.quantity.clone().unwrap_or_else(|| "?".into()),
            r.consumer.clone(),
            idle(Some(r.idle_ms)),
            r.deliveries.to_string(),
        ]);
    }
    t
}

fn dead_table(rows: &[DeadLetterView]) -> comfy_table::Table {
    let mut t = table(&[
        "dead-letter id",
        "entry",
        "user",
        "order",
        "units",
        "deliveries",
        "reason",
    ]);
    let opt = |s: &Option<String>| s.clone().unwrap_or_else(|| "?".into());
    for r in rows {
        t.add_row(vec![
            r.id.clone(),
            opt(&r.entry),
            opt(&r.user),
            opt(&r.order),
            opt(&r.quantity),
            r.deliveries.map_or("?".into(), |d| d.to_string()),
            opt(&r.reason),
        ]);
    }
    t
}
