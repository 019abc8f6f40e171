//! One purchase, as `seckill buy`, `seckill bench` and `seckill serve` make
//! it: the buyer's own bucket's gate, a fresh order id, the admission script
//! (with the wait for replicas when asked), the outcome typed. Callers parse
//! their input, call [`purchase`] and render what it says.

use std::borrow::Cow;

use crate::error::Error;
use crate::gate::admission::{admit_durably, Admission, Attempt, Record, ReplicaWait, Reply};
use crate::gate::buckets::bucket_of;
use crate::idempotency::{Answer, Begun, Reservation};
use crate::store::keys::VoucherKeys;
use crate::store::layout::Layout;
use crate::store::node_lease::OrderIds;
use crate::store::redis_conn::RedisConn;

/// Who buys how many units of which voucher, with which admission token.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub voucher: u64,
    pub user: u64,
    pub token: Option<&'a str>,
    pub quantity: u32,
    /// The caller's client reference, checked (src/orders/reference.rs).
    pub client_reference: Option<&'a str>,
}

/// What the gate answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Purchased {
    pub voucher: u64,
    pub user: u64,
    pub outcome: Admission,
    /// After a success, when a wait for replicas was asked: how many had it.
    pub replicas_acked: Option<u32>,
    /// The outcome is an earlier request's, read back from its idempotency
    /// key's admission record.
    pub from_record: bool,
}

impl Purchased {
    /// Fewer replicas than asked had the admission when the wait ended: a
    /// failover now could lose it.
    pub fn replicas_short(&self, wait: Option<ReplicaWait>) -> bool {
        matches!((wait, self.replicas_acked), (Some(w), Some(acked)) if acked < w.replicas)
    }

    /// Logs a success that fewer replicas than asked had.
    pub fn warn_if_replicas_short(&self, request: &Request<'_>, wait: Option<ReplicaWait>) {
        if let (true, Some(wait), Some(acked)) =
            (self.replicas_short(wait), wait, self.replicas_acked)
        {
            tracing::warn!(
                "voucher {}: only {acked} of {} replica(s) had user {}'s admission within {}: a failover now could lose it",
                request.voucher,
                wait.replicas,
                request.user,
                humantime::format_duration(wait.timeout)
            );
        }
    }
}

/// Why there is no answer. What a caller may tell the buyer differs: only
/// [`Failed::NotSent`] and [`Failed::Refused`] say the purchase did not
/// happen.
#[derive(Debug)]
pub enum Failed {
    /// Nothing reached the gate (no order id could be minted, the buyer's
    /// gate could not be named): the purchase did not happen.
    NotSent(Error),
    /// The gate refused the request's input before writing anything (a
    /// quantity above the voucher's per-user limit).
    Refused(String),
    /// The request may have reached the gate: whether the buyer holds a
    /// unit is unknown. A retry is safe (one order per user): it answers
    /// already bought if the first went through.
    Unknown(Error),
}

impl From<Failed> for Error {
    fn from(f: Failed) -> Error {
        match f {
            Failed::NotSent(e) | Failed::Unknown(e) => e,
            Failed::Refused(reason) => Error::QuantityRefused(reason),
        }
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::NotSent(e) | Failed::Unknown(e) => e.fmt(f),
            Failed::Refused(reason) => write!(f, "invalid input: {reason}"),
        }
    }
}

impl std::error::Error for Failed {}

/// The HTTP status of an outcome, as `seckill serve` answers it and an
/// idempotency key records it (docs/src/reference/http-api.md): 201 for
/// a success only.
pub fn answer_status(outcome: &Admission) -> u16 {
    match outcome {
        Admission::Admitted { .. } => 201,
        Admission::AlreadyBought => 409,
        Admission::SoldOut { .. } | Admission::WaitingForUnits { .. } => 410,
        Admission::NotStarted { .. } => 425,
        Admission::Ended { .. } => 422,
        Admission::UnknownVoucher => 404,
        Admission::Paused => 503,
        Admission::RateLimited => 429,
        Admission::BadToken => 403,
        Admission::NotEnoughStock { .. } => 412,
    }
}

/// The body of an outcome's answer: the report, with ids as strings (a
/// 64-bit id does not survive a JavaScript number).
pub fn answer_report(voucher: u64, user: u64, outcome: &Admission) -> serde_json::Value {
    let mut report = outcome.report(voucher, user);
    report["voucher"] = serde_json::json!(voucher.to_string());
    report["user"] = serde_json::json!(user.to_string());
    report
}

/// An outcome's answer as an idempotency key records it.
pub fn recorded_answer(voucher: u64, user: u64, outcome: &Admission) -> Answer {
    Answer {
        status: answer_status(outcome),
        body: answer_report(voucher, user, outcome)
            .to_string()
            .into_bytes(),
    }
}

/// The fingerprint of a purchase for an idempotency key: the request after
/// parsing, defaults applied, and the voucher.
fn fingerprint(attempt: &Attempt<'_>) -> String {
    let (voucher, user) = (attempt.voucher.to_string(), attempt.user.to_string());
    let quantity = attempt.quantity.to_string();
    let mut parts = vec![
        "purchase",
        &voucher,
        &user,
        &quantity,
        attempt.token.unwrap_or(""),
    ];
    // Only with one: a key taken before references existed keeps its
    // fingerprint across an upgrade.
    parts.extend(attempt.client_reference);
    crate::idempotency::fingerprint(&parts)
}

/// What a purchase with an idempotency key comes to.
#[derive(Debug)]
pub enum Keyed {
    /// The answer to give. `replayed`: it is an earlier request's with the
    /// key. `ran`: this request's own purchase, when it ran one.
    Answered {
        answer: Answer,
        replayed: bool,
        ran: Option<Purchased>,
    },
    /// The key was used for another purchase: nothing was done.
    Reused,
    /// A purchase with the key is still being answered: nothing was done.
    InFlight,
}

/// One purchase with an idempotency key (docs/src/concepts/idempotency.md).
/// On one Redis without a wait for replicas, the key is taken, the
/// admission made and its reply recorded in the reservation in one run of
/// the admission script, and an answer is stored beside it only when that
/// reply does not give it again (`settles`). Otherwise (a Cluster, where
/// the reservation lives in a slot of its own; a wait for replicas, whose
/// count is the first request's to tell; a key taken already; a proxy
/// that refuses keys of two slots) the reservation is looked up first,
/// the admission runs with the record it names, and the answer is stored.
/// `books` carries the reservation's calls, off the admission's connection
/// (which a wait for replicas may hold up). A failure of `render` is told
/// as the failure it returns, and the key opened for the resend.
pub async fn purchase_keyed(
    conn: &mut impl RedisConn,
    books: &mut impl RedisConn,
    reservation: &Reservation,
    prepared: Prepared<'_>,
    wait: Option<ReplicaWait>,
    render: impl AsyncFnOnce(&Purchased) -> Result<Answer, Failed>,
) -> Result<Keyed, Failed> {
    let fingerprint = fingerprint(&prepared.attempt);
    if !conn.is_cluster() && wait.is_none() {
        let nonce = crate::support::nonce::fresh().map_err(Failed::NotSent)?;
        let record = prepared.gate().idempotency_record(&nonce);
        let taken = Record {
            key: &record,
            lifetime_ms: reservation.lifetime_ms(),
            reservation: Some(crate::gate::admission::Reservation {
                key: reservation.key(),
                fingerprint: &fingerprint,
            }),
        };
        match prepared.send_recorded(conn, wait, taken).await {
            Err(Failed::Unknown(Error::KeyReserved)) => {}
            // A proxy in front of several nodes refused the reservation's
            // slot beside the gate's, before the script ran.
            Err(Failed::Unknown(e)) if refused_two_slots(&e) => {}
            // The script writes the reservation only with a recorded
            // reply: nothing to open.
            ran => {
                let way = Way {
                    nonce: &nonce,
                    opens: false,
                    stores_always: false,
                };
                return answer(books, reservation, way, ran, render).await;
            }
        }
    }
    let begun = reservation
        .begin(books, &fingerprint, prepared.gate())
        .await
        .map_err(Failed::NotSent)?;
    let (record, nonce) = match begun {
        Begun::Replay(answer) => {
            return Ok(Keyed::Answered {
                answer,
                replayed: true,
                ran: None,
            })
        }
        Begun::Reused => return Ok(Keyed::Reused),
        Begun::InFlight => return Ok(Keyed::InFlight),
        Begun::Recorded { nonce, reply } => {
            let purchased = prepared.read_back(reply)?;
            // With a wait for replicas, the first answer to be stored is
            // every later one's.
            let way = Way {
                nonce: &nonce,
                opens: false,
                stores_always: wait.is_some(),
            };
            return answer(books, reservation, way, Ok(purchased), render).await;
        }
        Begun::Run { record, nonce } => (record, nonce),
    };
    let recorded = Record {
        key: &record,
        lifetime_ms: reservation.lifetime_ms(),
        reservation: None,
    };
    let ran = prepared.send_recorded(conn, wait, recorded).await;
    // The record lives at the buyer's gate, which a resend may not reach
    // (its master failing over, a layout not known yet): the answer is
    // stored in the reservation, which every resend reads first.
    let way = Way {
        nonce: &nonce,
        opens: true,
        stores_always: true,
    };
    answer(books, reservation, way, ran, render).await
}

/// A proxy refused a command whose keys live in two hash slots.
fn refused_two_slots(e: &Error) -> bool {
    e.store_fault() == Some(crate::error::StoreFault::CrossSlot)
}

/// How a keyed purchase ran its admission.
struct Way<'a> {
    /// Names the admission's record, and the reservation's answer.
    nonce: &'a str,
    /// A reservation pending on this request is opened when it fails or
    /// its outcome is not kept (the one-run way leaves none pending: it
    /// writes the reservation with the record).
    opens: bool,
    /// The answer is stored even where the record gives it again.
    stores_always: bool,
}

/// The answer to a keyed purchase that ran its admission `way`.
async fn answer(
    books: &mut impl RedisConn,
    reservation: &Reservation,
    way: Way<'_>,
    ran: Result<Purchased, Failed>,
    render: impl AsyncFnOnce(&Purchased) -> Result<Answer, Failed>,
) -> Result<Keyed, Failed> {
    let rendered = match ran {
        Ok(purchased) => render(&purchased).await.map(|mine| (purchased, mine)),
        Err(e) => Err(e),
    };
    let (purchased, mine) = match rendered {
        Ok(done) => done,
        Err(e) => {
            if way.opens {
                reservation.open(books, way.nonce).await;
            }
            return Err(e);
        }
    };
    let replayed = purchased.from_record;
    if !purchased.outcome.kept_for_a_key() {
        // Neither the script nor the key keeps it: the resend runs.
        if way.opens {
            reservation.open(books, way.nonce).await;
        }
        return Ok(Keyed::Answered {
            answer: mine,
            replayed,
            ran: Some(purchased),
        });
    }
    if !way.stores_always && !settles(&purchased, &mine) {
        return Ok(Keyed::Answered {
            answer: mine,
            replayed,
            ran: Some(purchased),
        });
    }
    match reservation.settle(books, way.nonce, mine.clone()).await {
        Ok(settled) => Ok(Keyed::Answered {
            replayed: replayed || settled.replayed,
            answer: settled.answer,
            ran: Some(purchased),
        }),
        // Unrecorded here, the outcome is still in the admission's record:
        // a resend is answered from it.
        Err(e) => {
            tracing::warn!("an idempotency key's answer was not recorded: {e}");
            Ok(Keyed::Answered {
                answer: mine,
                replayed,
                ran: Some(purchased),
            })
        }
    }
}

/// Whether an answer of the one-call way must be stored in the key's
/// reservation: a resend is answered from the reply the reservation holds,
/// rendered again, and only an answer that rendering gives again byte for
/// byte may go unstored. already_bought names the order MySQL has at the
/// moment it is asked: stored. (The one-call way never waits for
/// replicas, whose count is of a moment too.)
fn settles(purchased: &Purchased, answer: &Answer) -> bool {
    purchased.outcome == Admission::AlreadyBought
        || *answer != recorded_answer(purchased.voucher, purchased.user, &purchased.outcome)
}

/// Where a voucher's buyers are admitted: each user's bucket's gate.
pub trait Gates {
    fn gate_of(&self, user: u64) -> crate::Result<Cow<'_, VoucherKeys>>;
}

/// A layout names each bucket's keys when asked.
impl Gates for Layout {
    fn gate_of(&self, user: u64) -> crate::Result<Cow<'_, VoucherKeys>> {
        self.keys_of_user(user).map(Cow::Owned)
    }
}

/// Every bucket's keys made once, bucket 0's first (the load generator:
/// nothing is built per attempt).
impl Gates for [VoucherKeys] {
    fn gate_of(&self, user: u64) -> crate::Result<Cow<'_, VoucherKeys>> {
        let buckets = u32::try_from(self.len()).unwrap_or(u32::MAX);
        self.get(bucket_of(user, buckets) as usize)
            .map(Cow::Borrowed)
            .ok_or_else(|| Error::InvalidInput("a voucher with no gate".into()))
    }
}

/// One purchase: routed to the user's bucket's gate, with a fresh order id
/// from `ids`, admitted by the script, and after a success waited on until
/// `wait`'s replicas have it (when asked).
pub async fn purchase(
    conn: &mut impl RedisConn,
    gates: &(impl Gates + ?Sized),
    ids: &OrderIds,
    request: Request<'_>,
    wait: Option<ReplicaWait>,
) -> Result<Purchased, Failed> {
    prepare(gates, ids, request)?.send(conn, wait).await
}

/// A purchase routed and given its order id, not sent yet.
pub struct Prepared<'a> {
    keys: Cow<'a, VoucherKeys>,
    attempt: Attempt<'a>,
}

/// The steps of a purchase before anything is sent: a failure here is
/// always [`Failed::NotSent`]. (`seckill buy` gives its node id back
/// between the two steps.)
pub fn prepare<'a>(
    gates: &'a (impl Gates + ?Sized),
    ids: &OrderIds,
    request: Request<'a>,
) -> Result<Prepared<'a>, Failed> {
    let keys = gates.gate_of(request.user).map_err(Failed::NotSent)?;
    let order_id = ids.next_id().map_err(Failed::NotSent)?;
    let attempt = Attempt {
        voucher: request.voucher,
        user: request.user,
        order_id,
        token: request.token,
        quantity: request.quantity,
        client_reference: request.client_reference,
    };
    Ok(Prepared { keys, attempt })
}

impl Prepared<'_> {
    /// The buyer's gate.
    pub fn gate(&self) -> &VoucherKeys {
        &self.keys
    }

    /// The admission, and the wait for replicas when asked.
    pub async fn send(
        &self,
        conn: &mut impl RedisConn,
        wait: Option<ReplicaWait>,
    ) -> Result<Purchased, Failed> {
        self.run(conn, wait, None).await
    }

    /// [`Prepared::send`], the reply recorded in `record` (an idempotency
    /// key's).
    pub async fn send_recorded(
        &self,
        conn: &mut impl RedisConn,
        wait: Option<ReplicaWait>,
        record: Record<'_>,
    ) -> Result<Purchased, Failed> {
        self.run(conn, wait, Some(record)).await
    }

    async fn run(
        &self,
        conn: &mut impl RedisConn,
        wait: Option<ReplicaWait>,
        record: Option<Record<'_>>,
    ) -> Result<Purchased, Failed> {
        // From here the script may have run: a failure is never told as a
        // refusal, except the script's own refusal of the quantity, which
        // it makes before writing anything.
        match admit_durably(conn, &self.keys, self.attempt, record, wait).await {
            Ok((reply, replicas_acked)) => Ok(self.purchased(reply, replicas_acked)),
            Err(Error::QuantityRefused(reason)) => Err(Failed::Refused(reason)),
            Err(e) => Err(Failed::Unknown(e)),
        }
    }

    /// An earlier request's admission reply, as an idempotency key's
    /// reservation holds it (`{code, reason, value}`): one that cannot be
    /// read leaves its outcome unknown to this request.
    pub fn read_back(&self, reply: Vec<redis::Value>) -> Result<Purchased, Failed> {
        let read =
            Reply::read(reply, self.attempt.voucher, self.attempt.user).map_err(Failed::Unknown)?;
        Ok(self.purchased(
            Reply {
                from_record: true,
                ..read
            },
            None,
        ))
    }

    fn purchased(&self, reply: Reply, replicas_acked: Option<u32>) -> Purchased {
        Purchased {
            voucher: self.attempt.voucher,
            user: self.attempt.user,
            outcome: reply.outcome,
            replicas_acked,
            from_record: reply.from_record,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A proxy's refusal of two slots is told apart from other errors as
    /// the driver parses it off the wire.
    #[test]
    fn a_crossslot_reply_is_a_refusal_of_two_slots() {
        let parsed = |wire: &[u8]| -> Error {
            let value = redis::parse_redis_value(wire).unwrap();
            value.extract_error().unwrap_err().into()
        };
        assert!(refused_two_slots(&parsed(
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"
        )));
        assert!(refused_two_slots(&parsed(
            b"-ERR CROSSSLOT Keys in request don't hash to the same slot\r\n"
        )));
        assert!(!refused_two_slots(&parsed(b"-ERR unknown command\r\n")));
        assert!(!refused_two_slots(&Error::KeyReserved));
    }
}
