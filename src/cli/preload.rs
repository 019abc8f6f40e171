//! `seckill preload`

use clap::Args;

use super::common::{parse_id, Format, FormatOpt};
use super::render::{print_json, table};
use crate::exit_code;
use crate::gate::preload::{preload, PreloadReport};
use crate::orders::voucher;
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::redis_conn;

#[derive(Args, Debug)]
#[group(id = "which", required = true, multiple = false, args = ["voucher", "all"])]
pub struct PreloadArgs {
    /// The voucher to load
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub voucher: Option<u64>,
    /// Load every voucher in MySQL
    #[arg(long)]
    pub all: bool,
    /// Load even while orders are in flight (this can re-admit sold units;
    /// prefer `seckill reconcile`)
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub format: FormatOpt,
}

pub async fn run(cfg: &Config, args: PreloadArgs) -> anyhow::Result<u8> {
    let db = Db::connect(cfg).await?;
    let mut redis = redis_conn::connect(cfg).await?;
    let ids: Vec<u64> = match args.voucher {
        Some(id) => vec![id],
        None => voucher::list(&db).await?.iter().map(|v| v.id).collect(),
    };
    let mut reports = Vec::with_capacity(ids.len());
    for id in ids {
        match preload(&db, &mut redis, &cfg.prefix, id, args.force).await {
            Ok(r) => {
                if r.in_flight_ignored > 0 {
                    tracing::warn!(
                        voucher = id,
                        "--force: preloaded over {} order(s) in flight; run `seckill reconcile --dry-run`",
                        r.in_flight_ignored
                    );
                }
                if r.mysql_lost_commits > 0 {
                    tracing::warn!(
                        voucher = id,
                        "MySQL lacks {} commit(s) the gate saw (a failover to an asynchronous replica, or a backup restored): published paused until they are restored (a worker's gate guard does it, or `seckill reconcile --yes`)",
                        r.mysql_lost_commits
                    );
                }
                reports.push(r);
            }
            Err(e) => {
                db.close().await;
                return Err(e.into());
            }
        }
    }
    db.close().await;
    match args.format.format {
        Format::Json => print_json(&reports)?,
        Format::Table => outln!("{}", preload_table(&reports))?,
    }
    Ok(exit_code::OK)
}

fn preload_table(reports: &[PreloadReport]) -> comfy_table::Table {
    let mut t = table(&["voucher", "total", "gate stock", "buyers", "note"]);
    for r in reports {
        let note = if r.mysql_lost_commits > 0 {
            format!("paused: MySQL lost {} commit(s)", r.mysql_lost_commits)
        } else if r.in_flight_ignored > 0 {
            format!("forced over {} in flight", r.in_flight_ignored)
        } else {
            "loaded".to_string()
        };
        t.add_row(vec![
            r.voucher.to_string(),
            r.total_stock.to_string(),
            r.stock.to_string(),
            r.buyers.to_string(),
            note,
        ]);
    }
    t
}
