//! `seckill order show` and `seckill order unhold`

use clap::{Args, Subcommand};

use super::common::{parse_id, Format, FormatOpt};
use super::render::{print_json, table};
use crate::exit_code;
use crate::orders::order::{self, OrderView};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::support::timespec::format_ms;

#[derive(Subcommand, Debug)]
pub enum OrderCommand {
    /// One order: status, user, voucher, created, payment deadline, paid/cancelled time
    Show(ShowArgs),
    /// Let a held order's payment deadline run (the payment provider has it
    /// unpaid): reconcile schedules it again, and past it the order is
    /// cancelled and its unit given back
    Unhold(UnholdArgs),
}

#[derive(Args, Debug)]
pub struct UnholdArgs {
    /// Order id
    #[arg(long = "order", value_parser = parse_id, allow_hyphen_values = true)]
    pub id: u64,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Order id
    #[arg(value_parser = parse_id, allow_hyphen_values = true)]
    pub id: u64,
    #[command(flatten)]
    pub format: FormatOpt,
}

pub async fn run(cfg: &Config, cmd: OrderCommand) -> anyhow::Result<u8> {
    let args = match cmd {
        OrderCommand::Show(args) => args,
        OrderCommand::Unhold(args) => return unhold(cfg, args).await,
    };
    let db = Db::connect(cfg).await?;
    let found = order::get(&db, args.id).await;
    db.close().await;
    let Some(o) = found? else {
        errln!("error: unknown order: there is no order {}", args.id);
        return Ok(exit_code::UNKNOWN_ORDER);
    };
    match args.format.format {
        Format::Json => print_json(&o)?,
        Format::Table => outln!("{}", order_table(&o))?,
    }
    Ok(exit_code::OK)
}

fn order_table(o: &OrderView) -> comfy_table::Table {
    let mut t = table(&["order", &o.id.to_string()]);
    let time = |ms: Option<i64>| ms.map_or("-".to_string(), format_ms);
    let rows = [
        ("status", o.status.to_string()),
        ("user", o.user.to_string()),
        ("voucher", o.voucher.to_string()),
        ("units", o.quantity.to_string()),
        ("created", format_ms(o.created_ms)),
        (
            "payment deadline",
            match o.held {
                true => format!(
                    "{} (held: restored, payment unknown)",
                    format_ms(o.deadline_ms)
                ),
                false => format_ms(o.deadline_ms),
            },
        ),
        ("paid", time(o.paid_ms)),
        ("cancelled", time(o.cancelled_ms)),
        (
            "client reference",
            o.client_reference
                .clone()
                .unwrap_or_else(|| "-".to_string()),
        ),
    ];
    for (k, v) in rows {
        t.add_row(vec![k.to_string(), v]);
    }
    t
}

async fn unhold(cfg: &Config, args: UnholdArgs) -> anyhow::Result<u8> {
    let db = Db::connect(cfg).await?;
    let done: crate::Result<(bool, Option<OrderView>)> = async {
        let unheld = crate::orders::restore::unhold(&db, args.id).await?;
        Ok((unheld, order::get(&db, args.id).await?))
    }
    .await;
    db.close().await;
    let (unheld, found) = done?;
    let Some(o) = found else {
        errln!("error: unknown order: there is no order {}", args.id);
        return Ok(exit_code::UNKNOWN_ORDER);
    };
    if unheld {
        outln!(
            "order {}: no longer held; `seckill reconcile --voucher {}` schedules its payment deadline, and a worker cancels it past that",
            o.id,
            o.voucher
        )?;
    } else {
        outln!("order {}: not held ({}); nothing changed", o.id, o.status)?;
    }
    Ok(exit_code::OK)
}
