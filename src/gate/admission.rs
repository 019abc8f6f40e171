//! Layer 1: one admission attempt through `lua/seckill.lua`.

use crate::store::redis_conn::RedisConn;
use redis::Value;

use crate::error::{Error, Result};
use crate::store::keys::VoucherKeys;
use crate::store::scripts::ADMISSION;

/// What the gate answered. The numeric codes are the script's return codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admission {
    /// Code 0: a unit is taken and the order is on its way to MySQL.
    Admitted { order_id: u64 },
    /// Code 1.
    AlreadyBought,
    /// Code 2: the user waits at this 1-based position of the waitlist.
    SoldOut { waitlist_position: u64 },
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
}

/// The outcome kinds, in the script's code order, as shown to people and JSON.
pub const OUTCOME_NAMES: [&str; 9] = [
    "success",
    "already_bought",
    "sold_out",
    "not_started",
    "ended",
    "unknown_voucher",
    "paused",
    "rate_limited",
    "bad_token",
];

impl Admission {
    /// The script's return code (0..=8).
    pub fn code(&self) -> usize {
        match self {
            Admission::Admitted { .. } => 0,
            Admission::AlreadyBought => 1,
            Admission::SoldOut { .. } => 2,
            Admission::NotStarted { .. } => 3,
            Admission::Ended { .. } => 4,
            Admission::UnknownVoucher => 5,
            Admission::Paused => 6,
            Admission::RateLimited => 7,
            Admission::BadToken => 8,
        }
    }

    pub fn name(&self) -> &'static str {
        OUTCOME_NAMES[self.code()]
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
    let reply: (i64, String, Value) = ADMISSION
        .key(keys.meta())
        .key(keys.stock())
        .key(keys.buyers())
        .key(keys.waitlist())
        .key(keys.orders())
        .key(keys.token(user))
        .key(keys.rate())
        .arg(user)
        .arg(order_id)
        .arg(voucher)
        .arg(token.unwrap_or(""))
        .invoke_async(conn)
        .await?;
    decode(reply)
}

fn decode((code, reason, value): (i64, String, Value)) -> Result<Admission> {
    let number = |v: &Value| -> Option<i64> {
        match v {
            Value::Int(n) => Some(*n),
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Value::SimpleString(s) => s.parse().ok(),
            _ => None,
        }
    };
    let bad = || {
        Error::Redis(format!(
            "admission script answered {code} {reason:?} {value:?}"
        ))
    };
    let n = number(&value).ok_or_else(bad)?;
    Ok(match code {
        0 => Admission::Admitted {
            order_id: u64::try_from(n).map_err(|_| bad())?,
        },
        1 => Admission::AlreadyBought,
        2 => Admission::SoldOut {
            waitlist_position: u64::try_from(n).map_err(|_| bad())?,
        },
        3 => Admission::NotStarted { begin_ms: n },
        4 => Admission::Ended { end_ms: n },
        5 => Admission::UnknownVoucher,
        6 => Admission::Paused,
        7 => Admission::RateLimited,
        8 => Admission::BadToken,
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
            decode((0, "ok".into(), bulk("9223372036854775807"))).unwrap(),
            Admission::Admitted {
                order_id: 9_223_372_036_854_775_807
            }
        );
        assert_eq!(
            decode((2, "sold out".into(), Value::Int(3))).unwrap(),
            Admission::SoldOut {
                waitlist_position: 3
            }
        );
        assert_eq!(
            decode((5, "unknown voucher".into(), Value::Int(0))).unwrap(),
            Admission::UnknownVoucher
        );
        assert!(decode((9, "?".into(), Value::Int(0))).is_err());
    }
}

/// After a success, wait until this many replicas of the voucher's master
/// have the admission (Redis `WAIT`), at most `timeout`: a failover to one
/// of them then keeps it. Off by default: it costs a round trip and the
/// replicas' lag on every success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    pub replicas: u32,
    pub timeout: std::time::Duration,
}

/// Redis `WAIT` on the node that holds the voucher (the keyed command beside
/// it routes the pipeline there on a cluster); how many replicas have
/// every write this connection made so far.
pub async fn wait_for_replicas(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    wait: ReplicaWait,
) -> Result<u32> {
    let (_, acked): (bool, u32) = redis::pipe()
        .exists(keys.stock())
        .cmd("WAIT")
        .arg(wait.replicas)
        .arg(wait.timeout.as_millis() as u64)
        .query_async(conn)
        .await?;
    Ok(acked)
}

/// An admission and, after a success when `wait` asks for it, the wait for
/// replicas: the outcome, and how many replicas had it (None when no wait
/// was asked or it was no success).
pub async fn admit_durably(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    attempt: Attempt<'_>,
    wait: Option<ReplicaWait>,
) -> Result<(Admission, Option<u32>)> {
    let outcome = admit(
        conn,
        keys,
        attempt.voucher,
        attempt.user,
        attempt.order_id,
        attempt.token,
    )
    .await?;
    let acked = match (wait, &outcome) {
        (Some(wait), Admission::Admitted { .. }) => {
            Some(wait_for_replicas(conn, keys, wait).await?)
        }
        _ => None,
    };
    Ok((outcome, acked))
}

/// Who attempts what, with which fresh order id and token.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    pub voucher: u64,
    pub user: u64,
    pub order_id: u64,
    pub token: Option<&'a str>,
}
