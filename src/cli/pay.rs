//! `seckill pay`

use clap::Args;
use serde_json::json;

use super::common::{parse_id, Format, FormatOpt};
use super::render::print_json;
use crate::exit_code;
use crate::orders::payment::{self, PayOutcome};
use crate::store::config::Config;
use crate::store::db::Db;

#[derive(Args, Debug)]
pub struct PayArgs {
    /// Order id
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub order: u64,
    #[command(flatten)]
    pub format: FormatOpt,
}

pub async fn run(cfg: &Config, args: PayArgs) -> anyhow::Result<u8> {
    let db = Db::connect(cfg).await?;
    let outcome = payment::pay_and_drop_deadline(cfg, &db, args.order).await;
    db.close().await;
    let outcome = outcome?;
    let (name, code, line) = match outcome {
        PayOutcome::Paid { voucher, user } => (
            "paid",
            exit_code::OK,
            format!(
                "paid: order {} (user {user}, voucher {voucher})",
                args.order
            ),
        ),
        PayOutcome::AlreadyPaid => (
            "already_paid",
            exit_code::ALREADY_PAID,
            format!("already paid: order {} was paid before", args.order),
        ),
        PayOutcome::Cancelled => (
            "cancelled",
            exit_code::ORDER_CANCELLED,
            format!(
                "cancelled: order {} was cancelled at its payment deadline",
                args.order
            ),
        ),
        PayOutcome::DeadlinePassed => (
            "deadline_passed",
            exit_code::ORDER_CANCELLED,
            format!(
                "deadline passed: order {} can no longer be paid and is being cancelled",
                args.order
            ),
        ),
        PayOutcome::UnknownOrder => (
            "unknown_order",
            exit_code::UNKNOWN_ORDER,
            format!("unknown order: there is no order {}", args.order),
        ),
    };
    match args.format.format {
        Format::Json => {
            print_json(&json!({ "outcome": name, "order_id": args.order.to_string() }))?
        }
        Format::Table if code == exit_code::OK => outln!("{line}")?,
        Format::Table => errln!("error: {line}"),
    }
    Ok(code)
}
