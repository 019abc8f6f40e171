//! Idempotency keys (docs/src/concepts/idempotency.md): a request sent
//! again with the key of an earlier one gets the earlier one's answer, and
//! nothing runs twice.
//!
//! Two records, each with one job. The key's *reservation*
//! (lua/idem_reserve.lua), in a slot of its own, holds the request's
//! fingerprint and the nonce naming the admission record: a resend finds
//! it whatever user or voucher it names. The *admission record* (`KEYS[9]`
//! of lua/seckill.lua), in the buyer's bucket's slot, is written by the
//! admission script in the same atomic run as the admission: there is no
//! admission of a keyed request without it, and a later run with the same
//! record returns it instead of admitting again, so a resend is answered
//! from it. On one Redis the script takes the reservation in that same
//! run too (`KEYS[10]`). An answer the record alone does not give again
//! is stored in the reservation (lua/idem_settle.lua).

use std::time::Duration;

use redis::Value;

use crate::error::{Error, Result};
use crate::store::keys::{idempotency_reservation, VoucherKeys};
use crate::store::redis_conn::RedisConn;
use crate::store::reply::{bytes, int as number};
use crate::store::scripts::{IDEM_RESERVE, IDEM_SETTLE};
use crate::support::sha256::{hex, sha256};

/// How long a key's records live unless told otherwise.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// The longest lifetime the scripts take.
pub const MAX_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);
/// The longest key.
pub const MAX_KEY_LEN: usize = 255;

/// A caller's idempotency key: 1..=255 printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key of a header value or a flag, bare (`abc`) or as the IETF
    /// draft's quoted string (`"abc"`), both the same key.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let bare = match text.strip_prefix('"') {
            Some(rest) => rest
                .strip_suffix('"')
                .ok_or_else(|| "an idempotency key that opens a quote must close it".to_string())?,
            None => text,
        };
        if bare.is_empty() || bare.len() > MAX_KEY_LEN {
            return Err(format!(
                "an idempotency key is 1 to {MAX_KEY_LEN} characters, not {}",
                bare.len()
            ));
        }
        if !crate::support::printable::is_printable_ascii(bare) {
            return Err(
                "an idempotency key holds printable ASCII characters only (no control characters)"
                    .into(),
            );
        }
        Ok(IdempotencyKey(bare.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whose keys these are: callers with different API keys never share one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Callers without an API key: `seckill buy`, `seckill serve` without
    /// `--api-key-file`.
    Shared,
    /// An API key, by the first 8 bytes of its SHA-256.
    ApiKey([u8; 8]),
}

impl Scope {
    /// The scope of an API key, named by its digest (never the key).
    pub fn of_api_key(key: &[u8]) -> Scope {
        let mut id = [0u8; 8];
        id.copy_from_slice(&sha256(key)[..8]);
        Scope::ApiKey(id)
    }

    pub(crate) fn name(&self) -> String {
        match self {
            Scope::Shared => "shared".into(),
            Scope::ApiKey(id) => format!("key.{}", hex(id)),
        }
    }
}

/// A request's fingerprint: the SHA-256 (hex) of its parts after parsing,
/// defaults applied, so two spellings of one request are the same request.
pub fn fingerprint(parts: &[&str]) -> String {
    // Joined by newlines, each part's own newlines and backslashes escaped
    // (a token is any text; ids and numbers hold neither, so their
    // fingerprints are as before the escape), so the joined text names
    // each part: a token ending in "\nR" is not that token and the
    // reference R.
    let escaped: Vec<String> = parts
        .iter()
        .map(|p| p.replace('\\', "\\\\").replace('\n', "\\n"))
        .collect();
    hex(&sha256(escaped.join("\n").as_bytes()))
}

/// A recorded answer: a status and its body's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// What to do with a request whose key was looked up.
#[derive(Debug, PartialEq)]
pub enum Begun {
    /// Run it, with this admission record (named by the reservation's
    /// nonce at the gate the request goes to). If an earlier request with
    /// the key ran its admission already, the record exists and the run
    /// returns that admission's reply, marked as read back.
    Run { record: String, nonce: String },
    /// The admission ran and its reply (`{code, reason, value}` of
    /// lua/seckill.lua) is recorded in the reservation: answer it again.
    /// `nonce`: the reservation's, to store an answer under.
    Recorded { nonce: String, reply: Vec<Value> },
    /// The key's answer: give it again.
    Replay(Answer),
    /// The key was used for another request (another body).
    Reused,
    /// An earlier request with the key is being answered right now.
    InFlight,
}

/// What the request is answered: the recorded answer, and whether it is an
/// earlier request's.
#[derive(Debug)]
pub struct Settled {
    pub answer: Answer,
    pub replayed: bool,
}

/// One idempotency key's reservation.
#[derive(Debug, Clone)]
pub struct Reservation {
    key: String,
    lifetime_ms: u64,
    patience: Duration,
}

impl Reservation {
    /// `lifetime`: how long the key's records live. `patience`: how long a
    /// resend takes an earlier request with no outcome yet for one still
    /// being answered (409) rather than one that died before it ran.
    pub fn new(
        prefix: &str,
        scope: &Scope,
        key: &IdempotencyKey,
        lifetime: Duration,
        patience: Duration,
    ) -> Result<Self> {
        let lifetime_ms = validate_lifetime(lifetime)?;
        let digest = hex(&sha256(key.as_str().as_bytes()));
        Ok(Reservation {
            key: idempotency_reservation(prefix, &scope.name(), &digest),
            lifetime_ms,
            patience,
        })
    }

    /// The reservation's Redis key.
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn lifetime_ms(&self) -> u64 {
        self.lifetime_ms
    }

    /// Looks the key up, and takes it when nobody has. The admission's
    /// record is named at `gate`, the gate the admission goes to (the
    /// reservation holds only its nonce: a gate named wrongly, by a layout
    /// not known yet, is refused by the script with "wrong bucket" and the
    /// resend names the right one).
    pub async fn begin(
        &self,
        conn: &mut impl RedisConn,
        fingerprint: &str,
        gate: &VoucherKeys,
    ) -> Result<Begun> {
        let fresh = crate::support::nonce::fresh()?;
        let reply: Vec<Value> = IDEM_RESERVE
            .key(&self.key)
            .arg(fingerprint)
            .arg(&fresh)
            .arg(self.lifetime_ms)
            .invoke_async(conn)
            .await?;
        let bad = || Error::redis(format!("idem_reserve.lua answered {reply:?}"));
        let text = |v: &Value| {
            bytes(v)
                .and_then(|r| String::from_utf8(r).ok())
                .ok_or_else(bad)
        };
        let (code, a, b) = match reply.as_slice() {
            [code, a, b, ..] => (number(code).ok_or_else(bad)?, a, b),
            _ => return Err(bad()),
        };
        match code {
            0 => Ok(Begun::Run {
                record: gate.idempotency_record(&fresh),
                nonce: fresh,
            }),
            1 => Ok(Begun::Replay(Answer {
                status: number(a)
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or_else(bad)?,
                body: bytes(b).ok_or_else(bad)?,
            })),
            2 => {
                let nonce = text(a)?;
                let age = Duration::from_millis(number(b).ok_or_else(bad)?.max(0) as u64);
                let record = gate.idempotency_record(&nonce);
                // The admission ran if its record exists: the run returns
                // it. Without one, a young request is still on its way;
                // an old one (or one its taker opened) never ran, and a
                // late arrival of it would find this run's record.
                let admitted: bool = redis::cmd("EXISTS").arg(&record).query_async(conn).await?;
                if admitted || age >= self.patience {
                    Ok(Begun::Run { record, nonce })
                } else {
                    Ok(Begun::InFlight)
                }
            }
            3 => Ok(Begun::Reused),
            4 => Ok(Begun::Recorded {
                nonce: text(a)?,
                reply: reply[2..].to_vec(),
            }),
            _ => Err(bad()),
        }
    }

    /// Records `answer` as the key's, unless an earlier request recorded
    /// one first: what the request is answered.
    pub async fn settle(
        &self,
        conn: &mut impl RedisConn,
        nonce: &str,
        answer: Answer,
    ) -> Result<Settled> {
        let (code, status, body): (i64, Value, Value) = IDEM_SETTLE
            .key(&self.key)
            .arg("done")
            .arg(nonce)
            .arg(answer.status)
            .arg(&answer.body)
            .invoke_async(conn)
            .await?;
        if code != 1 {
            // The reservation is gone (expired, or lost with Redis's last
            // writes): this answer is the request's, recorded nowhere.
            return Ok(Settled {
                answer,
                replayed: false,
            });
        }
        let recorded = Answer {
            status: number(&status)
                .and_then(|n| u16::try_from(n).ok())
                .unwrap_or(answer.status),
            body: bytes(&body).unwrap_or_default(),
        };
        let replayed = recorded != answer;
        Ok(Settled {
            answer: recorded,
            replayed,
        })
    }

    /// The request failed before it had an answer to record: a resend may
    /// go on at once instead of waiting out the patience. Best effort: if
    /// this is lost too, the resend waits.
    pub async fn open(&self, conn: &mut impl RedisConn, nonce: &str) {
        let opened: redis::RedisResult<Value> = IDEM_SETTLE
            .key(&self.key)
            .arg("open")
            .arg(nonce)
            .invoke_async(conn)
            .await;
        if let Err(e) = opened {
            tracing::warn!("an idempotency key's reservation stays pending: {e}");
        }
    }
}

/// A lifetime the scripts take, in ms.
pub fn validate_lifetime(lifetime: Duration) -> Result<u64> {
    if lifetime < Duration::from_secs(1) || lifetime > MAX_LIFETIME {
        return Err(Error::InvalidInput(format!(
            "an idempotency key's lifetime is 1s to {}, not {}",
            humantime::format_duration(MAX_LIFETIME),
            humantime::format_duration(lifetime)
        )));
    }
    Ok(lifetime.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_bare_or_quoted_printable_ascii_up_to_255() {
        let key = |t: &str| IdempotencyKey::parse(t).map(|k| k.0);
        assert_eq!(key("abc").unwrap(), "abc");
        assert_eq!(key("\"abc\"").unwrap(), "abc");
        assert_eq!(key("a b").unwrap(), "a b");
        assert_eq!(key(&"x".repeat(255)).unwrap().len(), 255);
        assert!(key(&"x".repeat(256)).is_err());
        assert!(key("").is_err());
        assert!(key("\"\"").is_err());
        assert!(key("\"abc").is_err());
        assert!(key("a\tb").is_err());
        assert!(key("é").is_err());
    }

    #[test]
    fn scopes_and_fingerprints_name_no_secret_and_tell_requests_apart() {
        let scope = Scope::of_api_key(b"shop-key-0123456789abcdef");
        assert!(scope.name().starts_with("key.") && scope.name().len() == 20);
        assert!(!scope.name().contains("shop"));
        assert_eq!(Scope::Shared.name(), "shared");
        assert_ne!(fingerprint(&["a", "bc"]), fingerprint(&["ab", "c"]));
        // A part's own newline is no boundary between parts.
        assert_ne!(fingerprint(&["t\nR"]), fingerprint(&["t", "R"]));
        assert_ne!(fingerprint(&["t\\", "nR"]), fingerprint(&["t", "R"]));
        assert_ne!(fingerprint(&["t\\nR"]), fingerprint(&["t\nR"]));
        // Parts without either are joined as they always were: keys taken
        // before the escape keep their fingerprints.
        assert_eq!(
            fingerprint(&["purchase", "1", "7"]),
            hex(&sha256(b"purchase\n1\n7"))
        );
        assert_eq!(fingerprint(&["a"]).len(), 64);
    }
}
