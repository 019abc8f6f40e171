//! Layer 1: one admission attempt through `lua/seckill.lua`.

use crate::store::redis_conn::RedisConn;
use redis::{ErrorKind, ScriptInvocation, ServerErrorKind, Value};

use crate::error::{Error, Result};
use crate::store::keys::VoucherKeys;
use crate::store::reply::int as number;
use crate::store::scripts::ADMISSION;

/// What the gate answered. The numeric codes are the script's return codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admission {
    /// Code 0: a unit is taken and the order is on its way to MySQL.
    Admitted { order_id: u64 },
    /// Code 1.
    AlreadyBought,
    /// Code 2: the user waits at this 1-based position of the waitlist;
    /// 0: the waitlist is full (the voucher's waitlist limit) and nothing
    /// was written.
    SoldOut { waitlist_position: u64 },
    /// Code 2 "waiting for units": a voucher in buckets whose bucket holds
    /// fewer units than asked while its other buckets may hold them; the
    /// request waits at this 1-based position for the mover to bring
    /// them (0: the waitlist is full and nothing was written).
    WaitingForUnits { waitlist_position: u64 },
    /// Code 3: the sale opens at `begin_ms` (Unix ms).
    NotStarted { begin_ms: i64 },
    /// Code 4: the sale closed at `end_ms` (Unix ms).
    Ended { end_ms: i64 },
    /// Code 5: the voucher is not preloaded.
    UnknownVoucher,
    /// Code 6: the gate is paused.
    Paused,
    /// Code 7: the user tried too often in the last second.
    RateLimited,
    /// Code 8: the voucher requires a token and this was not the user's.
    BadToken,
    /// Code 9: fewer units left than asked for (but some): nothing taken.
    NotEnoughStock { left: i64 },
}

/// Code 2's reason when the request waits for units the voucher holds at
/// other buckets (lua/seckill.lua).
const WAITING_FOR_UNITS: &str = "waiting for units";

/// The outcome kinds, in the script's code order, as shown to people and JSON.
pub const OUTCOME_NAMES: [&str; 10] = [
    "success",
    "already_bought",
    "sold_out",
    "not_started",
    "ended",
    "unknown_voucher",
    "paused",
    "rate_limited",
    "bad_token",
    "not_enough_stock",
];

impl Admission {
    /// The script's return code (0..=9).
    pub fn code(&self) -> usize {
        match self {
            Admission::Admitted { .. } => 0,
            Admission::AlreadyBought => 1,
            Admission::SoldOut { .. } | Admission::WaitingForUnits { .. } => 2,
            Admission::NotStarted { .. } => 3,
            Admission::Ended { .. } => 4,
            Admission::UnknownVoucher => 5,
            Admission::Paused => 6,
            Admission::RateLimited => 7,
            Admission::BadToken => 8,
            Admission::NotEnoughStock { .. } => 9,
        }
    }

    pub fn name(&self) -> &'static str {
        OUTCOME_NAMES[self.code()]
    }

    /// Whether an idempotency key keeps this outcome for its resends. Not
    /// the outcomes that say "try again later" (not started, paused, rate
    /// limited) or "not loaded yet": a resend runs again. lua/seckill.lua
    /// records the same ones (its `unrecorded` codes are the others).
    pub fn kept_for_a_key(&self) -> bool {
        !matches!(
            self,
            Admission::NotStarted { .. }
                | Admission::UnknownVoucher
                | Admission::Paused
                | Admission::RateLimited
        )
    }

    /// The outcome as `seckill buy --format json` and `seckill serve` give
    /// it. Order ids are strings: a 64-bit id does not survive a JavaScript
    /// number.
    pub fn report(&self, voucher: u64, user: u64) -> serde_json::Value {
        use crate::support::timespec::format_ms;
        use serde_json::json;
        let mut v = json!({ "outcome": self.name(), "voucher": voucher, "user": user });
        match self {
            Admission::Admitted { order_id } => v["order_id"] = json!(order_id.to_string()),
            // 0: the waitlist is full, the user is not on it.
            Admission::SoldOut { waitlist_position }
            | Admission::WaitingForUnits { waitlist_position } => {
                v["waitlist_position"] = match waitlist_position {
                    0 => serde_json::Value::Null,
                    p => json!(p),
                };
                v["waitlist_full"] = json!(*waitlist_position == 0);
                v["units_elsewhere"] = json!(matches!(self, Admission::WaitingForUnits { .. }));
            }
            Admission::NotEnoughStock { left } => v["units_left"] = json!(left),
            Admission::NotStarted { begin_ms } => {
                v["begin"] = json!(format_ms(*begin_ms));
                v["begin_ms"] = json!(begin_ms);
            }
            Admission::Ended { end_ms } => {
                v["end"] = json!(format_ms(*end_ms));
                v["end_ms"] = json!(end_ms);
            }
            Admission::AlreadyBought
            | Admission::UnknownVoucher
            | Admission::Paused
            | Admission::RateLimited
            | Admission::BadToken => {}
        }
        v
    }
}

impl Admission {
    /// The outcome a report (`Admission::report`, or serve's answer, which
    /// gives ids as strings) describes: how a recorded answer is read back.
    pub fn from_report(report: &serde_json::Value) -> Option<Admission> {
        let number = |field: &str| -> Option<i64> {
            let v = report.get(field)?;
            v.as_i64().or_else(|| v.as_str()?.parse().ok())
        };
        Some(match report.get("outcome")?.as_str()? {
            "success" => Admission::Admitted {
                order_id: u64::try_from(number("order_id")?).ok()?,
            },
            "already_bought" => Admission::AlreadyBought,
            "sold_out" => {
                let waitlist_position = report["waitlist_position"].as_u64().unwrap_or(0);
                match report["units_elsewhere"].as_bool() {
                    Some(true) => Admission::WaitingForUnits { waitlist_position },
                    _ => Admission::SoldOut { waitlist_position },
                }
            }
            "not_started" => Admission::NotStarted {
                begin_ms: number("begin_ms")?,
            },
            "ended" => Admission::Ended {
                end_ms: number("end_ms")?,
            },
            "unknown_voucher" => Admission::UnknownVoucher,
            "paused" => Admission::Paused,
            "rate_limited" => Admission::RateLimited,
            "bad_token" => Admission::BadToken,
            "not_enough_stock" => Admission::NotEnoughStock {
                left: number("units_left")?,
            },
            _ => return None,
        })
    }
}

/// Runs the admission script once for `user` with a fresh `order_id` and
/// the user's admission token, if any.
pub async fn admit(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
    user: u64,
    order_id: u64,
    token: Option<&str>,
) -> Result<Admission> {
    let attempt = Attempt {
        voucher,
        user,
        order_id,
        token,
        quantity: 1,
        client_reference: None,
    };
    let reply: Vec<Value> = invocation(keys, attempt, None)
        .invoke_async(conn)
        .await
        .map_err(refused_input)?;
    Ok(Reply::read(reply, voucher, user)?.outcome)
}

/// The script refuses a quantity outside 1 ..= the voucher's per-user
/// limit with an error reply, before writing anything: bad input, not a
/// failure of the store.
fn refused_input(e: redis::RedisError) -> Error {
    let quantity = crate::error::script_refusal(&e)
        .and_then(|d| Some(d.strip_prefix("seckill: ")?.to_string()))
        .filter(|reason| reason.starts_with("quantity "));
    match quantity {
        Some(reason) => Error::QuantityRefused(reason),
        None => e.into(),
    }
}

/// The admission script's call for `attempt` (KEYS and ARGV as
/// lua/seckill.lua documents them), recording its reply in `record` when
/// given.
fn invocation(
    keys: &VoucherKeys,
    attempt: Attempt<'_>,
    record: Option<Record<'_>>,
) -> ScriptInvocation<'static> {
    let mut inv = ADMISSION.prepare_invoke();
    inv.key(keys.meta())
        .key(keys.stock())
        .key(keys.buyers())
        .key(keys.waitlist())
        .key(keys.orders())
        .key(keys.token(attempt.user))
        .key(keys.rate())
        .key(keys.waitlist_quantity())
        .arg(attempt.user)
        .arg(attempt.order_id)
        .arg(attempt.voucher)
        .arg(attempt.token.unwrap_or(""))
        .arg(attempt.quantity);
    // ARGV is positional: an empty ARGV[6] and ARGV[7] stand for a record
    // and a reservation not given.
    let (mut lifetime, mut fingerprint) = (None, None);
    if let Some(record) = record {
        inv.key(record.key);
        lifetime = Some(record.lifetime_ms);
        if let Some(reservation) = record.reservation {
            inv.key(reservation.key);
            fingerprint = Some(reservation.fingerprint);
        }
    }
    if lifetime.is_some() || attempt.client_reference.is_some() {
        inv.arg(lifetime.map(|l| l.to_string()).unwrap_or_default());
    }
    if fingerprint.is_some() || attempt.client_reference.is_some() {
        inv.arg(fingerprint.unwrap_or(""));
    }
    if let Some(reference) = attempt.client_reference {
        inv.arg(reference);
    }
    inv
}

/// Where an admission with an idempotency key records its reply, and for
/// how long (`KEYS[9]` and `ARGV[6]` of lua/seckill.lua; src/idempotency.rs).
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub key: &'a str,
    pub lifetime_ms: u64,
    /// The key's reservation, taken in the same run (one Redis only).
    pub reservation: Option<Reservation<'a>>,
}

/// An idempotency key's reservation and the request's fingerprint
/// (`KEYS[10]` and `ARGV[7]` of lua/seckill.lua).
#[derive(Debug, Clone, Copy)]
pub struct Reservation<'a> {
    pub key: &'a str,
    pub fingerprint: &'a str,
}

/// What the admission script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub outcome: Admission,
    /// The reply was read back from the idempotency key's record: an
    /// earlier request's.
    pub from_record: bool,
}

impl Reply {
    /// The script's reply array: `{code, reason, value}`, with a fourth
    /// element 1 when read back from a record.
    pub fn read(reply: Vec<Value>, voucher: u64, user: u64) -> Result<Reply> {
        let bad = || Error::redis(format!("admission script answered {reply:?}"));
        let (code, reason, value, from_record) = match reply.as_slice() {
            [code, reason, value] => (code, reason, value, false),
            [code, reason, value, flag] => (code, reason, value, number(flag) == Some(1)),
            _ => return Err(bad()),
        };
        let code = number(code).ok_or_else(bad)?;
        let reason = match reason {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            _ => return Err(bad()),
        };
        let outcome = decode((code, reason, value.clone()), voucher, user)?;
        Ok(Reply {
            outcome,
            from_record,
        })
    }
}

fn decode(
    (code, reason, value): (i64, String, Value),
    voucher: u64,
    user: u64,
) -> Result<Admission> {
    let bad = || {
        Error::redis(format!(
            "admission script answered {code} {reason:?} {value:?}"
        ))
    };
    let n = number(&value).ok_or_else(bad)?;
    Ok(match code {
        0 => Admission::Admitted {
            order_id: u64::try_from(n).map_err(|_| bad())?,
        },
        1 => Admission::AlreadyBought,
        2 if reason == WAITING_FOR_UNITS => Admission::WaitingForUnits {
            waitlist_position: u64::try_from(n).map_err(|_| bad())?,
        },
        2 => Admission::SoldOut {
            waitlist_position: u64::try_from(n).map_err(|_| bad())?,
        },
        3 => Admission::NotStarted { begin_ms: n },
        4 => Admission::Ended { end_ms: n },
        5 => Admission::UnknownVoucher,
        6 => Admission::Paused,
        7 => Admission::RateLimited,
        8 => Admission::BadToken,
        9 => Admission::NotEnoughStock { left: n },
        // Not an outcome: the caller routed by a layout that changed.
        10 => {
            return Err(Error::WrongBucket {
                voucher,
                user,
                bucket: u32::try_from(n).map_err(|_| bad())?,
            })
        }
        11 => return Err(Error::KeyReserved),
        _ => return Err(bad()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_every_code() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            decode((0, "ok".into(), bulk("9223372036854775807")), 1, 1).unwrap(),
            Admission::Admitted {
                order_id: 9_223_372_036_854_775_807
            }
        );
        assert_eq!(
            decode((2, "sold out".into(), Value::Int(3)), 1, 1).unwrap(),
            Admission::SoldOut {
                waitlist_position: 3
            }
        );
        assert_eq!(
            decode((2, "waiting for units".into(), Value::Int(4)), 1, 1).unwrap(),
            Admission::WaitingForUnits {
                waitlist_position: 4
            }
        );
        assert_eq!(
            decode((5, "unknown voucher".into(), Value::Int(0)), 1, 1).unwrap(),
            Admission::UnknownVoucher
        );
        assert_eq!(
            decode((9, "not enough stock".into(), Value::Int(2)), 1, 1).unwrap(),
            Admission::NotEnoughStock { left: 2 }
        );
        assert!(matches!(
            decode((10, "wrong bucket".into(), Value::Int(2)), 7, 8),
            Err(Error::WrongBucket {
                voucher: 7,
                user: 8,
                bucket: 2
            })
        ));
        assert!(matches!(
            decode((11, "key reserved".into(), Value::Int(0)), 1, 1),
            Err(Error::KeyReserved)
        ));
        assert!(decode((12, "?".into(), Value::Int(0)), 1, 1).is_err());
    }

    /// One of every outcome, and of each kind of sold out.
    fn every_outcome() -> [Admission; 12] {
        [
            Admission::Admitted {
                order_id: 9_223_372_036_854_775_807,
            },
            Admission::AlreadyBought,
            Admission::SoldOut {
                waitlist_position: 0,
            },
            Admission::SoldOut {
                waitlist_position: 3,
            },
            Admission::WaitingForUnits {
                waitlist_position: 4,
            },
            Admission::NotStarted { begin_ms: 5 },
            Admission::Ended { end_ms: 6 },
            Admission::UnknownVoucher,
            Admission::Paused,
            Admission::RateLimited,
            Admission::BadToken,
            Admission::NotEnoughStock { left: 2 },
        ]
    }

    /// The outcomes an idempotency key keeps are the ones lua/seckill.lua
    /// records: its `unrecorded` codes are exactly the others (and 10).
    #[test]
    fn the_script_records_what_a_key_keeps() {
        let source = crate::store::scripts::ADMISSION_SOURCE;
        let line = source
            .lines()
            .find(|l| l.trim_start().starts_with("local unrecorded = {"))
            .expect("the unrecorded codes");
        let unrecorded: Vec<i64> = line
            .split('[')
            .skip(1)
            .filter_map(|part| part.split(']').next()?.parse().ok())
            .collect();
        let outcomes = every_outcome();
        let mut not_kept: Vec<i64> = outcomes
            .iter()
            .filter(|o| !o.kept_for_a_key())
            .map(|o| o.code() as i64)
            .collect();
        not_kept.push(10);
        assert_eq!(unrecorded, not_kept, "{line}");
    }

    #[test]
    fn every_outcome_is_read_back_from_its_report() {
        let outcomes = every_outcome();
        for outcome in outcomes {
            let mut report = outcome.report(7, 8);
            assert_eq!(Admission::from_report(&report), Some(outcome));
            // Serve's answer: ids as strings.
            report["voucher"] = serde_json::json!("7");
            assert_eq!(Admission::from_report(&report), Some(outcome));
        }
        assert_eq!(
            Admission::from_report(&serde_json::json!({"outcome": "?"})),
            None
        );
    }
}

/// After a success, wait until this many replicas of the voucher's master
/// have the admission (Redis `WAIT`), at most `timeout`: a failover to one
/// of them then keeps it. Off by default: every attempt waits for the
/// replicas' lag (see [`admit_durably`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    pub replicas: u32,
    pub timeout: std::time::Duration,
}

/// An admission and, after a success when `wait` asks for it, the wait for
/// replicas: the outcome, and how many replicas had it (None when no wait
/// was asked or it was no success).
///
/// `WAIT` counts the replicas that have every write its own connection made
/// so far. Sent as a request of its own, after a reconnect (a failover, a
/// reset connection) it can run on a fresh connection that wrote nothing
/// and count replicas that never saw the admission; so it goes out in one
/// pipeline with the script, on one connection. On a cluster the script's
/// keys route the pipeline to the voucher's master (`WAIT` itself names no
/// key). Refusals wait too (the outcome is not known when it is sent), but
/// report no count. A client that resends the pipeline after losing its
/// reply (the cluster client does, on a reconnect) runs the script again,
/// which answers already bought, as for a lone EVALSHA; here that can
/// happen during the whole wait.
pub async fn admit_durably(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    attempt: Attempt<'_>,
    record: Option<Record<'_>>,
    wait: Option<ReplicaWait>,
) -> Result<(Reply, Option<u32>)> {
    let inv = invocation(keys, attempt, record);
    let Some(wait) = wait else {
        let reply: Vec<Value> = inv.invoke_async(conn).await.map_err(refused_input)?;
        return Ok((Reply::read(reply, attempt.voucher, attempt.user)?, None));
    };
    let mut pipe = redis::pipe();
    pipe.invoke_script(&inv);
    if let Some(record) = record {
        // WAIT counts the replicas that have this connection's writes. A
        // run that reads an earlier request's record back writes nothing,
        // and its WAIT would count replicas that may lack that admission:
        // a write to the record after the admission makes the count cover
        // it (a record that does not exist takes no write and needs none).
        pipe.cmd("PEXPIRE")
            .arg(record.key)
            .arg(record.lifetime_ms)
            .ignore();
    }
    pipe.cmd("WAIT")
        .arg(wait.replicas)
        .arg(wait.timeout.as_millis() as u64);
    let (reply, acked): (Vec<Value>, u32) = match pipe.query_async(conn).await {
        // A restarted or flushed server lost the script, so the admission
        // did not run: load it and send both again (invoke_async does this
        // for a lone EVALSHA, not for one inside a pipeline).
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            inv.load_async(conn).await?;
            pipe.query_async(conn).await.map_err(refused_input)?
        }
        other => other.map_err(refused_input)?,
    };
    let reply = Reply::read(reply, attempt.voucher, attempt.user)?;
    let acked = matches!(reply.outcome, Admission::Admitted { .. }).then_some(acked);
    Ok((reply, acked))
}

/// Who attempts what, with which fresh order id and token.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    pub voucher: u64,
    pub user: u64,
    pub order_id: u64,
    pub token: Option<&'a str>,
    /// The units wanted (1 ..= the voucher's per-user limit).
    pub quantity: u32,
    /// The caller's client reference (`ARGV[8]`), checked.
    pub client_reference: Option<&'a str>,
}
