//! `seckill reconcile`

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget};
use serde::Serialize;

use super::common::{parse_duration, parse_id, Format, FormatOpt, NodeIdOpt};
use super::confirm::{confirm, Confirmation};
use super::render::{print_json, table};
use crate::exit_code;
use crate::reconcile::{self, Options, Outcome, VoucherReport};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::redis_conn::{self, RedisConn};

#[derive(Args, Debug)]
pub struct ReconcileArgs {
    /// Only these vouchers (repeatable) [default: every voucher registered at
    /// the gate or holding orders in MySQL]
    #[arg(long = "voucher", value_parser = parse_id, allow_hyphen_values = true)]
    pub vouchers: Vec<u64>,
    /// Report what would be repaired; change nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Also repair MySQL when its stock + active orders != total
    #[arg(long)]
    pub fix_mysql: bool,
    /// Read every voucher in full (every order, buyer, release and deadline)
    /// and count MySQL's orders again, instead of comparing counts and
    /// digests first; finds a counter or digest that drifted from its rows
    #[arg(long)]
    pub deep: bool,
    /// Drop the buyers whose orders MySQL may have lost with their stream
    /// entries (drift orders_lost_unrestorable), their units back on sale:
    /// give the amount the report names (one --voucher only)
    #[arg(long, value_name = "AMOUNT", requires = "vouchers")]
    pub drop_lost_commits: Option<u64>,
    /// How often to re-read a voucher that keeps moving before calling it busy
    #[arg(long, default_value_t = 5)]
    pub attempts: usize,
    /// Cancellations and new orders younger than this are still being handled
    /// by a worker, not drift (keep it above the worker's --deadline-lease)
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub settle: std::time::Duration,
    #[command(flatten)]
    pub confirmation: Confirmation,
    #[command(flatten)]
    pub node: NodeIdOpt,
    #[command(flatten)]
    pub format: FormatOpt,
}

#[derive(Serialize)]
struct Report<'a> {
    dry_run: bool,
    consistent: bool,
    vouchers: &'a [VoucherReport],
}

pub async fn run(cfg: &Config, args: ReconcileArgs) -> anyhow::Result<u8> {
    if !args.dry_run && !confirm_possible(&args.confirmation) {
        anyhow::bail!(
            "not a terminal, so nobody can confirm the repairs: pass --yes to repair, or --dry-run to look"
        );
    }
    if args.drop_lost_commits.is_some() && args.vouchers.len() != 1 {
        anyhow::bail!(
            "--drop-lost-commits names the buyers of one voucher: give exactly one --voucher"
        );
    }
    let db = Db::connect(cfg).await?;
    let result = reconcile_with(cfg, &args, &db).await;
    db.close().await;
    result
}

async fn reconcile_with(cfg: &Config, args: &ReconcileArgs, db: &Db) -> anyhow::Result<u8> {
    let mut redis = redis_conn::connect(cfg).await?;
    let vouchers = if args.vouchers.is_empty() {
        reconcile::candidates(db, &mut redis, &cfg.prefix).await?
    } else {
        args.vouchers.clone()
    };
    let look = Options {
        dry_run: true,
        fix_mysql: args.fix_mysql,
        attempts: args.attempts.max(1),
        settle_ms: args.settle.as_millis() as i64,
        deep: args.deep,
        drop_lost_commits: args.drop_lost_commits,
    };
    let mut run = reconcile::Run::new(db, &mut redis, &cfg.prefix, !args.vouchers.is_empty());
    let plan = pass_with_progress(&mut run, &vouchers, &look).await?;
    // Busy vouchers go to the repair pass too (it reads them again), and
    // paused ones (it reopens those it finds consistent).
    let drifting = reconcile::to_repair(&plan);
    if args.dry_run || drifting.is_empty() {
        render(args, &plan)?;
        return Ok(exit_code_of(&plan));
    }
    if !args.confirmation.yes {
        render(args, &plan)?;
        let question = format!(
            "Repair (or reopen) {} voucher(s) as listed?",
            drifting.len()
        );
        if !confirm(&args.confirmation, &question)? {
            errln!("nothing repaired");
            return Ok(exit_code::DRIFT_FOUND);
        }
    }
    let act = Options {
        dry_run: false,
        ..look
    };
    let bar = progress_bar(drifting.len());
    let done = run
        .repair(cfg, args.node.node_id, &plan, &act, |n| bar.inc(n as u64))
        .await;
    bar.finish_and_clear();
    let done = done?;
    render(args, &done)?;
    Ok(exit_code_of(&done))
}

/// 0 all consistent; 4 drift found and all of it repaired; 3 drift (or a
/// voucher too busy to check) left.
fn exit_code_of(reports: &[VoucherReport]) -> u8 {
    let left = reports.iter().any(|r| {
        matches!(
            r.outcome,
            Outcome::WouldRepair | Outcome::Busy | Outcome::NotRepaired | Outcome::Held
        )
    });
    if left {
        exit_code::DRIFT_FOUND
    } else if reports.iter().any(|r| r.outcome == Outcome::Repaired) {
        exit_code::DRIFT_REPAIRED
    } else {
        exit_code::OK
    }
}

fn confirm_possible(c: &Confirmation) -> bool {
    use std::io::IsTerminal;
    c.yes || (std::io::stdin().is_terminal() && std::io::stderr().is_terminal())
}

/// A pass with a progress bar on stderr (indicatif draws nothing off a
/// terminal; a bar is only worth it for many vouchers).
async fn pass_with_progress(
    run: &mut reconcile::Run<'_, impl RedisConn>,
    vouchers: &[u64],
    opts: &Options,
) -> crate::Result<Vec<VoucherReport>> {
    let bar = progress_bar(vouchers.len());
    let reports = run.pass(vouchers, opts, |n| bar.inc(n as u64)).await;
    bar.finish_and_clear();
    reports
}

/// A bar on stderr for passes over many vouchers; none for a few.
fn progress_bar(vouchers: usize) -> ProgressBar {
    if vouchers > reconcile::CHUNK {
        ProgressBar::with_draw_target(Some(vouchers as u64), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    }
}

fn render(args: &ReconcileArgs, reports: &[VoucherReport]) -> anyhow::Result<()> {
    let consistent = reports.iter().all(|r| r.outcome == Outcome::Consistent);
    match args.format.format {
        Format::Json => print_json(&Report {
            dry_run: args.dry_run,
            consistent,
            vouchers: reports,
        }),
        Format::Table => {
            outln!("{}", numbers_table(reports))?;
            if reports.iter().any(|r| r.voucher_units.is_some()) {
                outln!("{}", units_table(reports))?;
            }
            if !consistent {
                outln!("{}", drift_table(reports))?;
            }
            for r in reports.iter().filter(|r| !r.orders_held.is_empty()) {
                outln!(
                    "voucher {}: {} order(s) held, restored after MySQL lost them with their payment unknown (nothing cancels them): {}; `seckill pay --order <id>` if the payment provider has it paid, else `seckill order unhold --order <id>` lets its deadline run",
                    gate_name(r),
                    r.orders_held.len(),
                    r.orders_held
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )?;
            }
            Ok(())
        }
    }
}

fn outcome_text(o: Outcome) -> &'static str {
    match o {
        Outcome::Consistent => "consistent",
        Outcome::WouldRepair => "would repair",
        Outcome::Repaired => "repaired",
        Outcome::Busy => "busy: kept moving, try again",
        Outcome::NotRepaired => "not repaired",
        Outcome::Held => {
            "held: a worker's batch Redis lost is not committed yet, or the pause's grace runs; try again"
        }
    }
}

/// The outcome, and what became of a paused gate.
fn state_text(r: &VoucherReport) -> String {
    let outcome = outcome_text(r.outcome);
    if r.reopened {
        format!("{outcome}, reopened")
    } else if r.gate_paused {
        format!("{outcome}, paused")
    } else {
        outcome.to_string()
    }
}

/// The voucher, and for a voucher in buckets which bucket (`7/2`).
fn gate_name(r: &VoucherReport) -> String {
    match r.bucket {
        Some(b) => format!("{}/{b}", r.voucher),
        None => r.voucher.to_string(),
    }
}

fn numbers_table(reports: &[VoucherReport]) -> comfy_table::Table {
    let mut t = table(&[
        "voucher",
        "total",
        "mysql stock",
        "pending",
        "paid",
        "cancelled",
        "gate stock",
        "expected",
        "buyers",
        "in flight",
        "dead letters",
        "state",
    ]);
    for r in reports {
        t.add_row(vec![
            gate_name(r),
            r.mysql_total.to_string(),
            r.mysql_stock.to_string(),
            r.orders_pending.to_string(),
            r.orders_paid.to_string(),
            r.orders_cancelled.to_string(),
            r.gate_stock.map_or("missing".into(), |s| s.to_string()),
            r.expected_gate_stock.to_string(),
            r.buyers.to_string(),
            r.in_flight.to_string(),
            r.dead_letters.to_string(),
            state_text(r),
        ]);
    }
    t
}

/// Vouchers in buckets, their units wherever they are: the places add up
/// to MySQL's free stock when `off` is 0.
fn units_table(reports: &[VoucherReport]) -> comfy_table::Table {
    let mut t = table(&[
        "voucher",
        "total",
        "mysql stock",
        "pool",
        "in transit",
        "bucket stock",
        "in flight",
        "unreleased",
        "off",
    ]);
    for r in reports {
        let Some(u) = &r.voucher_units else { continue };
        t.add_row(vec![
            r.voucher.to_string(),
            u.total.to_string(),
            u.mysql_stock.to_string(),
            u.pool.to_string(),
            u.in_transit.to_string(),
            u.bucket_stock.to_string(),
            u.in_flight.to_string(),
            u.unreleased.to_string(),
            u.off.to_string(),
        ]);
    }
    t
}

fn drift_table(reports: &[VoucherReport]) -> comfy_table::Table {
    let mut t = table(&["voucher", "drift", "amount", "e.g.", "action", "result"]);
    for r in reports {
        for d in &r.drifts {
            let sample = d
                .sample
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            t.add_row(vec![
                gate_name(r),
                serde_json::to_value(d.class)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                d.amount.to_string(),
                sample,
                d.action.to_string(),
                outcome_text(r.outcome).to_string(),
            ]);
        }
    }
    t
}
