//! `seckill voucher add|list`

use clap::{Args, Subcommand};
use serde::Serialize;

use super::common::{parse_count, parse_duration, parse_id, Format, FormatOpt};
use super::render::{print_json, table};
use crate::exit_code;
use crate::gate::state::{self, GateState};
use crate::gate::{buckets, policy};
use crate::orders::policy::{
    Policy, PolicyChange, MAX_PER_USER_LIMIT, MAX_USER_RATE, MAX_WAITLIST_LIMIT,
};
use crate::orders::voucher::{self, NewVoucher, Voucher, MAX_BUCKETS};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::redis_conn;
use crate::support::timespec::{format_duration_ms, format_ms, now_ms, parse_time};

#[derive(Subcommand, Debug)]
pub enum VoucherCommand {
    /// Add a voucher to MySQL (then `seckill preload` opens it at the gate)
    Add(AddArgs),
    /// Change a voucher's admission policy, in MySQL and at the gate at once
    Update(UpdateArgs),
    /// List vouchers: MySQL stock and orders beside the Redis gate's state
    List(ListArgs),
}

#[derive(Args, Debug)]
pub struct AddArgs {
    /// Voucher id (1..=9223372036854775807)
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub id: u64,
    /// Units for sale
    #[arg(long, value_parser = parse_count, allow_hyphen_values = true)]
    pub stock: i64,
    /// Sale opens: RFC 3339, `now`, or relative like `+10m`
    #[arg(long, default_value = "now", allow_hyphen_values = true)]
    pub begin: String,
    /// Sale closes: RFC 3339, `now`, or relative like `+2h` [default: begin + 24h]
    #[arg(long, allow_hyphen_values = true)]
    pub end: Option<String>,
    /// Time a buyer has to pay before the unit is released
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub pay_timeout: std::time::Duration,
    /// Title shown in listings
    #[arg(long, default_value = "")]
    pub title: String,
    /// At most N attempts per user in any one second at the gate (0: no limit)
    #[arg(long, default_value_t = 0, value_name = "N", value_parser = parse_rate, allow_hyphen_values = true)]
    pub user_rate: u32,
    /// Admission needs a token issued for the user (`seckill token issue`)
    #[arg(long)]
    pub require_token: bool,
    /// The most units one user may buy (one order of 1..=L units)
    #[arg(long, default_value_t = 1, value_name = "L", value_parser = parse_limit, allow_hyphen_values = true)]
    pub per_user_limit: u32,
    /// Once W requests wait, a sold-out attempt writes nothing (default: no cap)
    #[arg(long, value_name = "W", value_parser = parse_waitlist_limit, allow_hyphen_values = true)]
    pub waitlist_limit: Option<u32>,
    /// Split the stock over N gates, each on a master of its own, so one
    /// voucher sells on N Redis masters (1: one gate)
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = parse_buckets, allow_hyphen_values = true)]
    pub buckets: u32,
    #[command(flatten)]
    pub format: FormatOpt,
}

#[derive(Args, Debug)]
pub struct UpdateArgs {
    /// Voucher id
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub id: u64,
    /// At most N attempts per user in any one second at the gate (0: no limit)
    #[arg(long, value_name = "N", value_parser = parse_rate, allow_hyphen_values = true)]
    pub user_rate: Option<u32>,
    /// Admission needs a token issued for the user
    #[arg(long, conflicts_with = "no_require_token")]
    pub require_token: bool,
    /// Admission needs no token
    #[arg(long)]
    pub no_require_token: bool,
    /// The most units one user may buy (one order of 1..=L units)
    #[arg(long, value_name = "L", value_parser = parse_limit, allow_hyphen_values = true)]
    pub per_user_limit: Option<u32>,
    /// Once W requests wait, a sold-out attempt writes nothing
    #[arg(long, value_name = "W", value_parser = parse_waitlist_limit, allow_hyphen_values = true, conflicts_with = "no_waitlist_limit")]
    pub waitlist_limit: Option<u32>,
    /// No cap on the waitlist
    #[arg(long)]
    pub no_waitlist_limit: bool,
    /// Split the stock over N gates (only before the first preload)
    #[arg(long, value_name = "N", value_parser = parse_buckets, allow_hyphen_values = true)]
    pub buckets: Option<u32>,
    #[command(flatten)]
    pub format: FormatOpt,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only these vouchers (repeatable)
    #[arg(long = "voucher", value_parser = parse_id, allow_hyphen_values = true)]
    pub vouchers: Vec<u64>,
    #[command(flatten)]
    pub format: FormatOpt,
}

pub async fn run(cfg: &Config, cmd: VoucherCommand) -> anyhow::Result<u8> {
    match cmd {
        VoucherCommand::Add(args) => add(cfg, args).await,
        VoucherCommand::Update(args) => update(cfg, args).await,
        VoucherCommand::List(args) => list(cfg, args).await,
    }
}

async fn add(cfg: &Config, args: AddArgs) -> anyhow::Result<u8> {
    let now = now_ms();
    let begin_ms = parse_time(&args.begin, now)?;
    let end_ms = match &args.end {
        Some(end) => parse_time(end, now)?,
        None => begin_ms.saturating_add(24 * 3_600_000),
    };
    let new = NewVoucher {
        id: args.id,
        title: args.title,
        stock: args.stock,
        begin_ms,
        end_ms,
        pay_timeout_ms: i64::try_from(args.pay_timeout.as_millis()).unwrap_or(i64::MAX),
        policy: Policy {
            user_rate: args.user_rate,
            require_token: args.require_token,
            per_user_limit: args.per_user_limit,
            waitlist_limit: args.waitlist_limit,
        },
        buckets: args.buckets,
    };
    // Validate before connecting: bad input is reported even with no server.
    new.validate()?;
    let db = Db::connect(cfg).await?;
    voucher::add(&db, &new).await?;
    let added = voucher::get(&db, new.id).await?;
    db.close().await;
    match args.format.format {
        Format::Json => print_json(&VoucherView::new(&added, None, now))?,
        Format::Table => {
            outln!(
                "voucher {} added: {} units, sale {} -> {}, pay within {}",
                added.id,
                added.total_stock,
                format_ms(added.begin_ms),
                format_ms(added.end_ms),
                format_duration_ms(added.pay_timeout_ms)
            )?;
            outln!("next: seckill preload --voucher {}", added.id)?;
        }
    }
    Ok(exit_code::OK)
}

async fn update(cfg: &Config, args: UpdateArgs) -> anyhow::Result<u8> {
    let require_token = match (args.require_token, args.no_require_token) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    };
    let change = PolicyChange {
        user_rate: args.user_rate,
        require_token,
        per_user_limit: args.per_user_limit,
        waitlist_limit: match (args.waitlist_limit, args.no_waitlist_limit) {
            (Some(w), _) => Some(Some(w)),
            (_, true) => Some(None),
            _ => None,
        },
    };
    if change.is_empty() && args.buckets.is_none() {
        anyhow::bail!("nothing to change: give --user-rate, --require-token, --no-require-token, --per-user-limit, --waitlist-limit, --no-waitlist-limit or --buckets");
    }
    let db = Db::connect(cfg).await?;
    let mut redis = redis_conn::connect(cfg).await?;
    let updated = async {
        // A new split and a new limit are judged together, and a lowered
        // limit goes first, so neither is refused for the other's old value
        // and a refused pair changes nothing.
        let mut limit_first = false;
        if let (Some(n), Some(limit)) = (args.buckets, change.per_user_limit) {
            let v = voucher::get(&db, args.id).await?;
            crate::orders::voucher_buckets::validate_split(args.id, v.total_stock, n, limit)?;
            limit_first = limit < v.policy.per_user_limit;
        }
        let mut policy_now = None;
        if limit_first {
            policy_now = Some(policy::update(&db, &mut redis, &cfg.prefix, args.id, change).await?);
        }
        if let Some(n) = args.buckets {
            buckets::split(&db, &mut redis, &cfg.prefix, args.id, n).await?;
        }
        let (policy, at_gate) = match (policy_now, change.is_empty()) {
            (Some(done), _) => done,
            (None, false) => policy::update(&db, &mut redis, &cfg.prefix, args.id, change).await?,
            // Only the split changed: the policy as it is.
            (None, true) => (voucher::get(&db, args.id).await?.policy, false),
        };
        let buckets_now = voucher::get(&db, args.id).await?.buckets;
        Ok::<_, crate::error::Error>((policy, at_gate, buckets_now))
    }
    .await;
    db.close().await;
    let (policy, at_gate, buckets_now) = updated?;
    match args.format.format {
        Format::Json => print_json(&serde_json::json!({
            "id": args.id,
            "buckets": buckets_now,
            "user_rate": policy.user_rate,
            "require_token": policy.require_token,
            "per_user_limit": policy.per_user_limit,
            "waitlist_limit": policy.waitlist_limit,
            "gate_updated": at_gate,
        }))?,
        Format::Table => outln!(
            "voucher {}: {}user rate {}, token {}, up to {} per user, waitlist {}{}",
            args.id,
            match buckets_now {
                1 => String::new(),
                n => format!("{n} buckets, "),
            },
            match policy.user_rate {
                0 => "off".to_string(),
                n => format!("{n}/s per user"),
            },
            if policy.require_token {
                "required"
            } else {
                "not required"
            },
            policy.per_user_limit,
            match policy.waitlist_limit {
                None => "uncapped".to_string(),
                Some(w) => format!("capped at {w}"),
            },
            if at_gate || change.is_empty() {
                ""
            } else {
                " (not loaded at the gate: preload publishes it)"
            }
        )?,
    }
    Ok(exit_code::OK)
}

/// A bucket count: a whole number 1 ..= MAX_BUCKETS.
fn parse_buckets(s: &str) -> Result<u32, String> {
    parse_between(s, 1..=MAX_BUCKETS, "1")
}

/// A per-user limit: a whole number 1 ..= MAX_PER_USER_LIMIT.
fn parse_limit(s: &str) -> Result<u32, String> {
    parse_between(s, 1..=MAX_PER_USER_LIMIT, "1")
}

/// A waitlist cap: a whole number 0 ..= MAX_WAITLIST_LIMIT.
fn parse_waitlist_limit(s: &str) -> Result<u32, String> {
    parse_between(s, 0..=MAX_WAITLIST_LIMIT, "0")
}

/// A per-user rate: a whole number 0 ..= MAX_USER_RATE.
fn parse_rate(s: &str) -> Result<u32, String> {
    parse_between(s, 0..=MAX_USER_RATE, "0 (off)")
}

/// A whole number in `range`; the error names the range, its low end as
/// `low` says it.
fn parse_between(s: &str, range: std::ops::RangeInclusive<u32>, low: &str) -> Result<u32, String> {
    let n = parse_count(s)?;
    u32::try_from(n)
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            format!(
                "{n} is out of range: it must be between {low} and {}",
                range.end()
            )
        })
}

async fn list(cfg: &Config, args: ListArgs) -> anyhow::Result<u8> {
    let db = Db::connect(cfg).await?;
    let vouchers = voucher::list_only(&db, &args.vouchers).await;
    db.close().await;
    let vouchers = vouchers?;
    let mut redis = redis_conn::connect(cfg).await?;
    let ids: Vec<u64> = vouchers.iter().map(|v| v.id).collect();
    let gates = state::read_vouchers(&mut redis, &cfg.prefix, &ids).await?;
    let now = now_ms();
    let views: Vec<VoucherView> = vouchers
        .iter()
        .zip(&gates)
        .map(|(v, g)| VoucherView::new(v, Some(g), now))
        .collect();
    match args.format.format {
        Format::Json => print_json(&views)?,
        Format::Table => {
            outln!("{}", list_table(&views))?;
            if views
                .iter()
                .any(|v| v.gate.is_some_and(|g| !g.buckets.is_empty()))
            {
                outln!("{}", buckets_table(&views))?;
            }
        }
    }
    Ok(exit_code::OK)
}

/// Each bucket of the vouchers split in buckets, with the master serving it.
fn buckets_table(views: &[VoucherView]) -> comfy_table::Table {
    let mut t = table(&[
        "voucher",
        "bucket",
        "master",
        "gate stock",
        "buyers",
        "waitlist",
        "stream",
    ]);
    for v in views {
        let Some(g) = v.gate else { continue };
        for b in &g.buckets {
            t.add_row(vec![
                v.id.to_string(),
                format!("{} {{{}}}", b.bucket, b.tag),
                b.master.clone().unwrap_or_else(|| "-".into()),
                b.stock.map_or("-".into(), |s| s.to_string()),
                b.buyers.to_string(),
                b.waitlist.to_string(),
                b.stream_length.to_string(),
            ]);
        }
        if let Some(pool) = g.pool {
            t.add_row(vec![
                v.id.to_string(),
                "pool".into(),
                g.buckets
                    .first()
                    .and_then(|b| b.master.clone())
                    .unwrap_or_else(|| "-".into()),
                pool.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
    }
    t
}

/// A voucher as shown to people and scripts.
#[derive(Serialize)]
pub struct VoucherView<'a> {
    id: u64,
    title: &'a str,
    state: &'static str,
    total_stock: i64,
    mysql_stock: i64,
    begin: String,
    end: String,
    begin_ms: i64,
    end_ms: i64,
    pay_timeout_ms: i64,
    user_rate: u32,
    require_token: bool,
    per_user_limit: u32,
    waitlist_limit: Option<u32>,
    buckets: u32,
    orders: Orders,
    gate: Option<&'a GateState>,
}

#[derive(Serialize)]
struct Orders {
    pending: i64,
    paid: i64,
    cancelled: i64,
}

impl<'a> VoucherView<'a> {
    fn new(v: &'a Voucher, gate: Option<&'a GateState>, now: i64) -> Self {
        VoucherView {
            id: v.id,
            title: &v.title,
            state: v.sale_state(now),
            total_stock: v.total_stock,
            mysql_stock: v.stock,
            begin: format_ms(v.begin_ms),
            end: format_ms(v.end_ms),
            begin_ms: v.begin_ms,
            end_ms: v.end_ms,
            pay_timeout_ms: v.pay_timeout_ms,
            user_rate: v.policy.user_rate,
            require_token: v.policy.require_token,
            per_user_limit: v.policy.per_user_limit,
            waitlist_limit: v.policy.waitlist_limit,
            buckets: v.buckets,
            orders: Orders {
                pending: v.orders_pending,
                paid: v.orders_paid,
                cancelled: v.orders_cancelled,
            },
            gate,
        }
    }
}

fn list_table(views: &[VoucherView]) -> comfy_table::Table {
    let mut t = table(&[
        "voucher",
        "title",
        "state",
        "total",
        "mysql stock",
        "pending",
        "paid",
        "cancelled",
        "gate stock",
        "buyers",
        "waitlist",
        "stream",
        "policy",
        "sale window (UTC)",
    ]);
    for v in views {
        let (gate_stock, buyers, waitlist, stream) = match v.gate {
            Some(g) if g.loaded => (
                g.stock.map_or("-".into(), |s| s.to_string()),
                g.buyers.to_string(),
                g.waitlist.to_string(),
                g.stream_length.to_string(),
            ),
            _ => ("not loaded".into(), "-".into(), "-".into(), "-".into()),
        };
        t.add_row(vec![
            v.id.to_string(),
            v.title.to_string(),
            v.state.to_string(),
            v.total_stock.to_string(),
            v.mysql_stock.to_string(),
            v.orders.pending.to_string(),
            v.orders.paid.to_string(),
            v.orders.cancelled.to_string(),
            gate_stock,
            buyers,
            waitlist,
            stream,
            Policy {
                user_rate: v.user_rate,
                require_token: v.require_token,
                per_user_limit: v.per_user_limit,
                waitlist_limit: v.waitlist_limit,
            }
            .describe(),
            format!("{} -> {}", v.begin, v.end),
        ]);
    }
    t
}
