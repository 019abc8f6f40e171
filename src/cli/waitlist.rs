//! `seckill waitlist`

use clap::Args;

use super::common::{parse_id, Format, FormatOpt};
use super::render::{print_json, table};
use crate::exit_code;
use crate::gate::buckets;
use crate::gate::waitlist::{self, Waitlist};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn;
use crate::support::timespec::{format_duration_ms, format_ms, now_ms};

#[derive(Args, Debug)]
pub struct WaitlistArgs {
    /// Voucher id
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub voucher: u64,
    /// How many users from the head of the line to show
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    #[command(flatten)]
    pub format: FormatOpt,
}

pub async fn run(cfg: &Config, args: WaitlistArgs) -> anyhow::Result<u8> {
    VoucherKeys::new(&cfg.prefix, args.voucher)?;
    let mut redis = redis_conn::connect(cfg).await?;
    // Every bucket's line, bucket 0 lost or not.
    let layout = buckets::for_routing(&mut redis, &cfg.prefix, args.voucher, async || {
        Db::connect(cfg).await
    })
    .await?;
    let w = waitlist::read_all(&mut redis, &layout, args.limit.max(1)).await?;
    match args.format.format {
        Format::Json => print_json(&w)?,
        Format::Table => {
            outln!(
                "voucher {}: {} waiting, {} promoted so far (an order each)",
                w.voucher,
                w.length,
                w.promotions
            )?;
            if !w.head.is_empty() {
                outln!("{}", waitlist_table(&w, now_ms()))?;
            }
        }
    }
    Ok(exit_code::OK)
}

fn waitlist_table(w: &Waitlist, now: i64) -> comfy_table::Table {
    let mut t = table(&["position", "user", "units", "queued at", "waiting for"]);
    for e in &w.head {
        // Whole seconds read better than humantime's milliseconds here.
        let waited = (now - e.queued_ms).max(0) / 1000 * 1000;
        t.add_row(vec![
            e.position.to_string(),
            e.user.to_string(),
            e.quantity.to_string(),
            format_ms(e.queued_ms),
            format_duration_ms(waited),
        ]);
    }
    t
}
