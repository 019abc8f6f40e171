//! `seckill buy`

use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::common::{parse_duration, parse_id, Format, FormatOpt, NodeIdOpt, ReplicaWaitOpt};
use super::render::print_json;
use crate::exit_code;
use crate::gate::admission::Admission;
use crate::gate::buckets;
use crate::idempotency::{Answer, IdempotencyKey, Reservation, Scope};
use crate::purchase::{self, Keyed, Request};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn;
use crate::support::timespec::format_ms;

#[derive(Args, Debug)]
pub struct BuyArgs {
    /// Voucher id
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub voucher: u64,
    /// User id
    #[arg(long, value_parser = parse_id, allow_hyphen_values = true)]
    pub user: u64,
    /// The user's admission token (`seckill token issue`), for a voucher
    /// that requires one
    #[arg(long, allow_hyphen_values = true)]
    pub token: Option<String>,
    /// Units to buy, all or none (1 ..= the voucher's per-user limit)
    #[arg(long, default_value_t = 1, value_name = "K", value_parser = parse_quantity, allow_hyphen_values = true)]
    pub quantity: u32,
    /// An idempotency key (1 to 255 printable ASCII characters): run again
    /// with the same key and arguments, the command gives the first run's
    /// outcome (and exit code) again instead of buying anew
    #[arg(long, value_name = "KEY", value_parser = IdempotencyKey::parse, allow_hyphen_values = true)]
    pub idempotency_key: Option<IdempotencyKey>,
    /// How long --idempotency-key's outcome is kept (1s ..= 30days)
    #[arg(long, default_value = "24h", value_parser = parse_lifetime, requires = "idempotency_key")]
    pub idempotency_ttl: std::time::Duration,
    /// Your own name for this purchase (1 to 64 printable ASCII
    /// characters), kept with the order, also when the request waits in
    /// line first
    #[arg(long, value_name = "REF", value_parser = parse_reference, allow_hyphen_values = true)]
    pub client_reference: Option<String>,
    #[command(flatten)]
    pub replicas: ReplicaWaitOpt,
    #[command(flatten)]
    pub node: NodeIdOpt,
    #[command(flatten)]
    pub format: FormatOpt,
}

pub async fn run(cfg: &Config, args: BuyArgs) -> anyhow::Result<u8> {
    VoucherKeys::new(&cfg.prefix, args.voucher)?;
    let mut redis = redis_conn::connect(cfg).await?;
    let gates = buckets::for_routing(&mut redis, &cfg.prefix, args.voucher, async || {
        Db::connect(cfg).await
    })
    .await?;
    let ids = OrderIds::lease(cfg, args.node.node_id).await?;
    let request = Request {
        voucher: args.voucher,
        user: args.user,
        token: args.token.as_deref(),
        quantity: args.quantity,
        client_reference: args.client_reference.as_deref(),
    };
    let wait = args.replicas.wait();
    let prepared = purchase::prepare(&gates, &ids, request);
    // One id minted: the node id is free for another process before the
    // admission (whose answer may take a replica wait) is sent.
    ids.release().await;
    let prepared = prepared?;
    let bought = match &args.idempotency_key {
        None => {
            let purchased = prepared.send(&mut redis, wait).await?;
            Bought {
                outcome: purchased.outcome,
                replicas_acked: purchased.replicas_acked,
                replayed: false,
            }
        }
        Some(key) => {
            let reservation = Reservation::new(
                &cfg.prefix,
                &Scope::Shared,
                key,
                args.idempotency_ttl,
                PATIENCE,
            )?;
            let mut books = redis.clone();
            let render = async |p: &purchase::Purchased| {
                Ok(purchase::recorded_answer(
                    args.voucher,
                    args.user,
                    &p.outcome,
                ))
            };
            let keyed = purchase::purchase_keyed(
                &mut redis,
                &mut books,
                &reservation,
                prepared,
                wait,
                render,
            )
            .await?;
            let quoted = key.as_str();
            match keyed {
                Keyed::Answered {
                    answer,
                    replayed,
                    ran,
                } => Bought {
                    outcome: read_back(&answer)?,
                    replicas_acked: ran.filter(|_| !replayed).and_then(|p| p.replicas_acked),
                    replayed,
                },
                Keyed::Reused => {
                    errln!(
                        "error: the idempotency key {quoted:?} was used for another purchase (another user, voucher, quantity or token): nothing was done"
                    );
                    return Ok(exit_code::IDEMPOTENCY_KEY_REUSED);
                }
                Keyed::InFlight => {
                    errln!(
                        "error: a purchase with the idempotency key {quoted:?} is still being answered: nothing was done; run this again in a moment"
                    );
                    return Ok(exit_code::IDEMPOTENCY_KEY_IN_FLIGHT);
                }
            }
        }
    };
    if !bought.replayed {
        let purchased = purchase::Purchased {
            voucher: args.voucher,
            user: args.user,
            outcome: bought.outcome,
            replicas_acked: bought.replicas_acked,
            from_record: false,
        };
        purchased.warn_if_replicas_short(&request, wait);
    }
    let (outcome, replicas_acked) = (bought.outcome, bought.replicas_acked);
    match args.format.format {
        Format::Json => {
            let mut v = outcome.report(args.voucher, args.user);
            if let Some(acked) = replicas_acked {
                v["replicas_acked"] = json!(acked);
            }
            if bought.replayed {
                v["replayed"] = json!(true);
            }
            print_json(&v)?
        }
        Format::Table => {
            let replayed = match bought.replayed {
                true => " (the outcome of an earlier run with this idempotency key)",
                false => "",
            };
            outln!(
                "{}{replayed}",
                outcome_line(args.voucher, args.user, &outcome)
            )?
        }
    }
    Ok(exit_code_of(&outcome))
}

/// How long a run waits for an earlier run with the same key that has no
/// outcome yet before taking it for one that never reached the gate.
const PATIENCE: Duration = Duration::from_secs(5);

/// What the buyer is told.
struct Bought {
    outcome: Admission,
    replicas_acked: Option<u32>,
    /// The outcome is an earlier run's, with the same idempotency key.
    replayed: bool,
}

fn parse_reference(s: &str) -> Result<String, String> {
    crate::orders::reference::check(s)?;
    Ok(s.to_string())
}

/// An idempotency key's lifetime: a duration from 1s to 30days.
fn parse_lifetime(s: &str) -> Result<Duration, String> {
    let lifetime = parse_duration(s)?;
    crate::idempotency::validate_lifetime(lifetime).map_err(|e| e.to_string())?;
    Ok(lifetime)
}

/// The outcome a recorded answer describes.
fn read_back(answer: &Answer) -> anyhow::Result<Admission> {
    serde_json::from_slice(&answer.body)
        .ok()
        .and_then(|report| Admission::from_report(&report))
        .ok_or_else(|| anyhow::anyhow!("the idempotency key's recorded answer cannot be read"))
}

pub fn exit_code_of(outcome: &Admission) -> u8 {
    match outcome {
        Admission::Admitted { .. } => exit_code::OK,
        Admission::AlreadyBought => exit_code::ALREADY_BOUGHT,
        Admission::SoldOut { .. } | Admission::WaitingForUnits { .. } => exit_code::SOLD_OUT,
        Admission::NotStarted { .. } => exit_code::NOT_STARTED,
        Admission::Ended { .. } => exit_code::ENDED,
        Admission::UnknownVoucher => exit_code::UNKNOWN_VOUCHER,
        Admission::Paused => exit_code::PAUSED,
        Admission::RateLimited => exit_code::RATE_LIMITED,
        Admission::BadToken => exit_code::BAD_TOKEN,
        Admission::NotEnoughStock { .. } => exit_code::NOT_ENOUGH_STOCK,
    }
}

/// A quantity: a whole number from 1 (the script checks it against the
/// voucher's per-user limit).
pub fn parse_quantity(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(q) if (1..=crate::orders::policy::MAX_PER_USER_LIMIT).contains(&q) => Ok(q),
        _ => Err(format!(
            "'{s}' is not a quantity: a whole number from 1 to {}",
            crate::orders::policy::MAX_PER_USER_LIMIT
        )),
    }
}

fn outcome_line(voucher: u64, user: u64, outcome: &Admission) -> String {
    match outcome {
        Admission::Admitted { order_id } => {
            format!("success: user {user} holds a unit of voucher {voucher}, order {order_id}")
        }
        Admission::AlreadyBought => {
            format!("already bought: user {user} already holds a unit of voucher {voucher}")
        }
        Admission::SoldOut {
            waitlist_position: 0,
        } => format!(
            "sold out: voucher {voucher} has no unit left and its waitlist is full; user {user} is not on it"
        ),
        Admission::SoldOut { waitlist_position } => format!(
            "sold out: voucher {voucher} has no unit left; user {user} is number {waitlist_position} on the waitlist"
        ),
        Admission::WaitingForUnits {
            waitlist_position: 0,
        } => format!(
            "waiting: voucher {voucher} has too few units at user {user}'s bucket and its waitlist is full; user {user} is not on it"
        ),
        Admission::WaitingForUnits { waitlist_position } => format!(
            "waiting: voucher {voucher} has too few units at user {user}'s bucket but may have them at its others; user {user} is number {waitlist_position} in line for the units to come"
        ),
        Admission::NotEnoughStock { left } => format!(
            "not enough stock: voucher {voucher} has {left} unit(s) left, fewer than asked; nothing taken"
        ),
        Admission::NotStarted { begin_ms } => format!(
            "not started: the sale of voucher {voucher} opens at {}",
            format_ms(*begin_ms)
        ),
        Admission::Ended { end_ms } => format!(
            "ended: the sale of voucher {voucher} closed at {}",
            format_ms(*end_ms)
        ),
        Admission::UnknownVoucher => format!(
            "unknown voucher: voucher {voucher} is not loaded at the gate (seckill preload --voucher {voucher})"
        ),
        Admission::Paused => format!("paused: the gate of voucher {voucher} admits nobody right now"),
        Admission::RateLimited => format!(
            "rate limited: user {user} made the attempts voucher {voucher} allows per second; try again in a second"
        ),
        Admission::BadToken => format!(
            "bad token: voucher {voucher} needs the admission token issued for user {user} (missing, wrong or expired)"
        ),
    }
}
