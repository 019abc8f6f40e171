//! Idempotency keys on payments (docs/src/concepts/idempotency.md). The
//! key's row in `seckill_payment_key`, taken before the payment, names the
//! order it pays and, once answered, the outcome. The payment marks the
//! order with the key (`seckill_order.pay_key`) in its one statement, so
//! the record of a payment is written in the payment's own transaction: a
//! resend after a lost answer finds the payment its key made, and a key
//! never pays twice (an order is paid once).

use std::time::Duration;

use mysql_async::prelude::*;

use crate::error::{Error, Result};
use crate::idempotency::{validate_lifetime, IdempotencyKey, Scope};
use crate::orders::payment::{forget_quietly, pay_marked, PayOutcome};
use crate::store::db::Db;
use crate::store::redis_conn::RedisConn;
use crate::support::sha256::{hex, sha256};

/// One idempotency key on a payment.
#[derive(Debug, Clone)]
pub struct PaymentKey {
    /// SHA-256 (hex) of the scope and the key: never the key itself.
    id: String,
    lifetime_ms: u64,
    patience: Duration,
}

/// What a payment with an idempotency key comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyedPayment {
    /// The outcome to answer (by its name, as recorded). `replayed`: an
    /// earlier request with the key gave or made it.
    Answered {
        outcome: &'static str,
        replayed: bool,
    },
    /// The key was used for another order: nothing was done.
    Reused,
    /// A payment with the key is still being answered: nothing was done.
    InFlight,
}

/// Outcomes a key keeps: the order's state, known. `unknown_order` is not
/// kept: the worker may persist the order a moment later.
const KEPT: [&str; 4] = ["paid", "already_paid", "cancelled", "deadline_passed"];

/// How often a key found expired, or deleted under our feet, is tried again.
const TAKE_ATTEMPTS: usize = 3;

impl PaymentKey {
    /// `lifetime`: how long the key's row answers. `patience`: how long a
    /// resend takes an earlier request with no outcome yet for one still
    /// being answered (409) rather than one that died.
    pub fn new(
        scope: &Scope,
        key: &IdempotencyKey,
        lifetime: Duration,
        patience: Duration,
    ) -> Result<Self> {
        let lifetime_ms = validate_lifetime(lifetime)?;
        let named = format!("{}\n{}", scope.name(), key.as_str());
        Ok(PaymentKey {
            id: hex(&sha256(named.as_bytes())),
            lifetime_ms,
            patience,
        })
    }

    /// Pays `order` under this key (as [`crate::orders::payment::pay_on`]
    /// does without one): the key taken, or its earlier answer found; the
    /// payment made, marked with the key; its outcome recorded.
    pub async fn pay(
        &self,
        db: &Db,
        redis: &mut impl RedisConn,
        prefix: &str,
        order: u64,
    ) -> Result<KeyedPayment> {
        let mut conn = db.conn().await?;
        if let Some(early) = self.take(&mut conn, order).await? {
            return Ok(early);
        }
        let (paid, paid_by) = match pay_marked(&mut conn, order, Some(&self.id)).await {
            Ok(done) => done,
            Err(e) => {
                self.open(&mut conn).await;
                return Err(e);
            }
        };
        crate::support::fault::pause("after_pay").await;
        // Paid earlier by this key: a request whose answer was lost (its
        // deadline perhaps still at the gate: dropped again).
        let (outcome, replayed) = match (paid, paid_by) {
            (PayOutcome::Paid { voucher, user }, _) => {
                forget_quietly(redis, prefix, (voucher, user), order).await;
                ("paid", false)
            }
            (PayOutcome::AlreadyPaid, Some(by)) if by.key == self.id => {
                forget_quietly(redis, prefix, (by.voucher, by.user), order).await;
                ("paid", true)
            }
            (other, _) => (other.name(), false),
        };
        if !KEPT.contains(&outcome) {
            // Not kept: the key is freed, or at least opened, for the resend.
            let freed = conn
                .exec_drop(
                    "DELETE FROM seckill_payment_key WHERE key_id = ? AND outcome IS NULL",
                    (&self.id,),
                )
                .await;
            if let Err(e) = freed {
                tracing::warn!("a payment's idempotency key was not freed: {e}");
                self.open(&mut conn).await;
            }
            return Ok(KeyedPayment::Answered { outcome, replayed });
        }
        let recorded = conn
            .exec_drop(
                "UPDATE seckill_payment_key SET outcome = ? WHERE key_id = ? AND outcome IS NULL",
                (outcome, &self.id),
            )
            .await;
        if let Err(e) = recorded {
            // The payment's own mark on the order answers the resend.
            tracing::warn!("a payment's idempotency key's answer was not recorded: {e}");
            self.open(&mut conn).await;
            return Ok(KeyedPayment::Answered { outcome, replayed });
        }
        if conn.affected_rows() == 1 {
            self.purge_expired(&mut conn).await;
            return Ok(KeyedPayment::Answered { outcome, replayed });
        }
        // Another request with the key recorded its answer first: a resend
        // that found this request's payment, or one that ran before it.
        let recorded: Option<Option<String>> = conn
            .exec_first(
                "SELECT outcome FROM seckill_payment_key WHERE key_id = ?",
                (&self.id,),
            )
            .await?;
        Ok(match recorded.flatten().and_then(|n| kept(&n)) {
            // The same answer: this request's own, however recorded.
            Some(first) => KeyedPayment::Answered {
                outcome: first,
                replayed: replayed || first != outcome,
            },
            None => KeyedPayment::Answered { outcome, replayed },
        })
    }

    /// Takes the key for `order`, or answers from it: `None` when the
    /// payment is to run.
    async fn take(&self, conn: &mut mysql_async::Conn, order: u64) -> Result<Option<KeyedPayment>> {
        for _ in 0..TAKE_ATTEMPTS {
            conn.exec_drop(
                "INSERT IGNORE INTO seckill_payment_key (key_id, order_id, taken_at)
                 VALUES (?, ?, UTC_TIMESTAMP(3))",
                (&self.id, order),
            )
            .await?;
            if conn.affected_rows() == 1 {
                return Ok(None);
            }
            let row: Option<(u64, Option<String>, i64)> = conn
                .exec_first(
                    "SELECT order_id, outcome,
                            TIMESTAMPDIFF(MICROSECOND, taken_at, UTC_TIMESTAMP(3)) DIV 1000
                       FROM seckill_payment_key WHERE key_id = ?",
                    (&self.id,),
                )
                .await?;
            let Some((owner, outcome, age_ms)) = row else {
                continue;
            };
            if age_ms >= self.lifetime_ms as i64 {
                conn.exec_drop(
                    "DELETE FROM seckill_payment_key WHERE key_id = ?
                        AND taken_at <= UTC_TIMESTAMP(3) - INTERVAL ? MICROSECOND",
                    (&self.id, self.lifetime_ms * 1000),
                )
                .await?;
                continue;
            }
            if owner != order {
                return Ok(Some(KeyedPayment::Reused));
            }
            if let Some(outcome) = outcome.as_deref().and_then(kept) {
                return Ok(Some(KeyedPayment::Answered {
                    outcome,
                    replayed: true,
                }));
            }
            // Pending: the payment ran if the order carries the key (the
            // run answers it); an earlier request younger than the
            // patience is still on its way.
            let paid_by: Option<Option<String>> = conn
                .exec_first("SELECT pay_key FROM seckill_order WHERE id = ?", (order,))
                .await?;
            let ran = paid_by.flatten() == Some(self.id.clone());
            if ran || age_ms >= self.patience.as_millis() as i64 {
                return Ok(None);
            }
            return Ok(Some(KeyedPayment::InFlight));
        }
        Err(Error::mysql(
            "an idempotency key's row kept changing while it was read: try again",
        ))
    }

    /// The payment failed before it had an outcome: a resend may go on at
    /// once. Best effort (MySQL may be what failed).
    async fn open(&self, conn: &mut mysql_async::Conn) {
        let opened = conn
            .exec_drop(
                "UPDATE seckill_payment_key SET taken_at = UTC_TIMESTAMP(3) - INTERVAL ? MICROSECOND
                  WHERE key_id = ? AND outcome IS NULL",
                (self.patience.as_micros() as u64, &self.id),
            )
            .await;
        if let Err(e) = opened {
            tracing::warn!("a payment's idempotency key stays pending: {e}");
        }
    }

    /// Rows past their lifetime, a few at a time: each payment that
    /// records a new answer clears some, after its own work.
    async fn purge_expired(&self, conn: &mut mysql_async::Conn) {
        let purged = conn
            .exec_drop(
                "DELETE FROM seckill_payment_key
                  WHERE taken_at < UTC_TIMESTAMP(3) - INTERVAL ? MICROSECOND
                  ORDER BY taken_at LIMIT 100",
                (self.lifetime_ms * 1000,),
            )
            .await;
        if let Err(e) = purged {
            tracing::debug!("expired payment keys not purged: {e}");
        }
    }
}

/// A recorded outcome's name, if a key keeps it.
fn kept(name: &str) -> Option<&'static str> {
    KEPT.iter().copied().find(|k| *k == name)
}
