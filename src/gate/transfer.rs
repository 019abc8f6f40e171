//! Moving stock between the gates of a voucher split into buckets, by the
//! demarcation rule (design/buckets.md §3): the giver lowers its stock into
//! a transfer record before the receiver raises its own, so the voucher's
//! units never add up to more than it has at any instant.
//!
//! Three steps, each one script and each safe to run twice: take
//! (lua/transfer_take.lua), give (transfer_give.lua), settle
//! (transfer_settle.lua). A transfer whose mover stopped between the steps
//! is completed receiver first (`complete`): landed, it is settled as
//! given; not landed, it is marked void at the receiver (transfer_void.lua)
//! before its units go back, so a late give lands nothing.

use redis::aio::ConnectionLike;

use crate::error::{Error, Result};
use crate::gate::buckets::Layout;
use crate::store::keys::VoucherKeys;
use crate::store::scripts::{
    SERVE_UP_TO, TRANSFER_GIVE, TRANSFER_SETTLE, TRANSFER_TAKE, TRANSFER_VOID,
};

/// One side of a transfer.
#[derive(Debug, Clone, Copy)]
pub enum Side<'a> {
    /// The voucher's pool (keys on bucket 0's tag: pass bucket 0's keys).
    Pool(&'a VoucherKeys),
    /// Bucket `number`'s gate.
    Bucket(u32, &'a VoucherKeys),
}

impl<'a> Side<'a> {
    /// The pool and every bucket of a voucher, from its buckets' keys
    /// (bucket 0's first).
    pub fn all(buckets: &'a [VoucherKeys]) -> Vec<Side<'a>> {
        let mut sides = Vec::with_capacity(buckets.len() + 1);
        if let Some(first) = buckets.first() {
            sides.push(Side::Pool(first));
        }
        sides.extend(
            buckets
                .iter()
                .enumerate()
                .map(|(b, k)| Side::Bucket(b as u32, k)),
        );
        sides
    }

    fn keys(&self) -> &VoucherKeys {
        match self {
            Side::Pool(k) | Side::Bucket(_, k) => k,
        }
    }

    /// How the giver's record names the receiver.
    pub fn label(&self) -> String {
        match self {
            Side::Pool(_) => "pool".to_string(),
            Side::Bucket(b, _) => b.to_string(),
        }
    }

    fn units(&self) -> String {
        match self {
            Side::Pool(k) => k.pool(),
            Side::Bucket(_, k) => k.stock(),
        }
    }

    fn open_transfers(&self) -> String {
        match self {
            Side::Pool(k) => k.pool_transfers(),
            Side::Bucket(_, k) => k.transfers(),
        }
    }

    fn received(&self) -> String {
        match self {
            Side::Pool(k) => k.pool_received(),
            Side::Bucket(_, k) => k.received(),
        }
    }
}

/// What a take did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// These units are in transit under the transfer's id.
    Units(u64),
    /// The giver held fewer than the fewest asked for (its stock).
    Short(u64),
    /// The giver has seen a mover of this later epoch.
    Fenced(u64),
    Paused,
    /// The id is not above the giver's highest and has no open record.
    StaleId,
    /// The giver's gate is not loaded (not preloaded yet, or lost).
    NotLoaded,
}

/// What a give did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Given {
    /// Landed now; `promoted` of its units went to waiting requests.
    Landed {
        promoted: u64,
    },
    AlreadyGiven,
    /// Called off before it arrived: the giver takes the units back.
    Void,
    Fenced(u64),
    Paused,
    /// The receiver's gate is not loaded: the units stay in transit.
    NotLoaded,
}

impl Given {
    /// How the giver settles after this answer: the receiver's word on
    /// the transfer, or None when the units stay in transit (refused: a
    /// later round completes them once stale). A replay's "already given"
    /// is given: settling it void would land its units twice.
    pub fn landing(self) -> Option<Landing> {
        match self {
            Given::Landed { .. } | Given::AlreadyGiven => Some(Landing::Given),
            Given::Void => Some(Landing::Void),
            Given::Fenced(_) | Given::Paused | Given::NotLoaded => None,
        }
    }
}

/// What the receiver says of a transfer: the answer `settle` needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landing {
    Given,
    Void,
}

impl Landing {
    fn word(self) -> &'static str {
        match self {
            Landing::Given => "given",
            Landing::Void => "void",
        }
    }
}

/// What a settle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The record is gone; `units_back` returned to the giver (void only).
    Done { units_back: u64 },
    /// No open record: settled before.
    NoRecord,
    /// A void transfer's giver is paused: the record stays for later.
    Paused,
}

/// A giver's transfer not settled yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTransfer {
    pub id: u64,
    /// The receiver's label: a bucket number or `pool`.
    pub to: String,
    pub units: u64,
    /// When it was taken (the giver's Redis clock, Unix ms).
    pub taken_ms: u64,
}

/// Takes between `least` and `want` units from `giver` for `receiver`
/// under transfer `id`, by a mover of `epoch`.
pub async fn take(
    conn: &mut impl ConnectionLike,
    giver: Side<'_>,
    receiver: Side<'_>,
    id: u64,
    want: u64,
    least: u64,
    epoch: u64,
) -> Result<Taken> {
    let (code, reason, value): (i64, String, u64) = TRANSFER_TAKE
        .key(giver.keys().meta())
        .key(giver.units())
        .key(giver.open_transfers())
        .arg(id)
        .arg(receiver.label())
        .arg(want)
        .arg(least)
        .arg(epoch)
        .invoke_async(conn)
        .await?;
    Ok(match code {
        0 => Taken::Units(value),
        1 => Taken::Short(value),
        2 => Taken::Paused,
        3 => Taken::Fenced(value),
        4 => Taken::StaleId,
        5 => Taken::NotLoaded,
        _ => return Err(unexpected("transfer_take", code, &reason)),
    })
}

/// Lands transfer `id`'s `units` in `receiver` (a bucket given fresh ids
/// serves its waitlist first, one of `fresh_ids` per promotion; given none,
/// the units join its stock).
pub async fn give(
    conn: &mut impl ConnectionLike,
    receiver: Side<'_>,
    id: u64,
    units: u64,
    epoch: u64,
    fresh_ids: &[u64],
) -> Result<Given> {
    let keys = receiver.keys();
    let mut inv = TRANSFER_GIVE.prepare_invoke();
    inv.key(keys.meta())
        .key(receiver.units())
        .key(receiver.received());
    if let Side::Bucket(..) = receiver {
        inv.key(keys.buyers())
            .key(keys.waitlist())
            .key(keys.orders())
            .key(keys.events())
            .key(keys.waitlist_quantity());
    }
    inv.arg(id)
        .arg(units)
        .arg(epoch)
        .arg(keys.voucher())
        .arg(fresh_ids.len());
    for fresh in fresh_ids {
        inv.arg(*fresh);
    }
    let (code, reason, value): (i64, String, u64) = inv.invoke_async(conn).await?;
    Ok(match code {
        0 => Given::Landed { promoted: value },
        1 => Given::AlreadyGiven,
        2 => Given::Void,
        3 => Given::Fenced(value),
        4 => Given::Paused,
        5 => Given::NotLoaded,
        _ => return Err(unexpected("transfer_give", code, &reason)),
    })
}

/// Promotes `bucket`'s waiting requests from the stock it holds, once (`id` must be
/// above every serve id before it of the same epoch: meta's served_last
/// keeps the last),
/// one of `fresh_ids` per promotion: the mover, after its moves to the
/// bucket, under the bound it published (`set_bound`).
pub async fn promote_waiting(
    conn: &mut impl ConnectionLike,
    bucket: Side<'_>,
    id: u64,
    epoch: u64,
    fresh_ids: &[u64],
) -> Result<Given> {
    give(conn, bucket, id, 0, epoch, fresh_ids).await
}

/// What publishing a bound did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bounded {
    Set,
    Fenced(u64),
    /// The bucket's server changed since its state was last checked: the
    /// gate guard checks it first (lua/lib/server_checked.lua).
    Unchecked,
    NotLoaded,
}

/// What the mover publishes in a bucket (lua/serve_up_to.lua), for
/// `ttl_ms` by its master's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundWord {
    /// The queued time (µs) up to which the bucket serves its own waiting
    /// requests; None lifts it.
    pub up_to_us: Option<u64>,
    pub ttl_ms: u64,
    /// The voucher's units no waiting request is given (None: left as
    /// they are).
    pub free: Option<i64>,
    /// The units of the bucket's stock the round's moves take to
    /// requests at other buckets, neither served nor sold there until
    /// taken (0 clears them; None: left as they are).
    pub lent: Option<i64>,
}

impl BoundWord {
    /// The bound alone, for `ttl_ms`.
    pub fn bound(up_to_us: Option<u64>, ttl_ms: u64) -> BoundWord {
        BoundWord {
            up_to_us,
            ttl_ms,
            free: None,
            lent: None,
        }
    }
}

/// Publishes `word` in `keys`' bucket (lua/serve_up_to.lua).
pub async fn set_bound(
    conn: &mut impl ConnectionLike,
    keys: &VoucherKeys,
    epoch: u64,
    word: &BoundWord,
) -> Result<Bounded> {
    let count = |n: Option<i64>| n.map_or(String::new(), |n| n.max(0).to_string());
    let (code, reason, value): (i64, String, u64) = SERVE_UP_TO
        .key(keys.meta())
        .arg(epoch)
        .arg(word.up_to_us.map_or(String::new(), |t| t.to_string()))
        .arg(word.ttl_ms)
        .arg(count(word.free))
        .arg(count(word.lent))
        .invoke_async(conn)
        .await?;
    Ok(match code {
        0 => Bounded::Set,
        3 => Bounded::Fenced(value),
        4 => Bounded::Unchecked,
        5 => Bounded::NotLoaded,
        _ => return Err(unexpected("serve_up_to", code, &reason)),
    })
}

/// Asks `receiver` whether transfer `id` landed, calling it off if not.
pub async fn void(conn: &mut impl ConnectionLike, receiver: Side<'_>, id: u64) -> Result<Landing> {
    let answer: String = TRANSFER_VOID
        .key(receiver.received())
        .arg(id)
        .invoke_async(conn)
        .await?;
    match answer.as_str() {
        "given" => Ok(Landing::Given),
        "void" => Ok(Landing::Void),
        other => Err(unexpected("transfer_void", 0, other)),
    }
}

/// What `receiver` recorded of transfer `id`: landed, called off, or
/// nothing yet (in transit, while the giver has its record).
pub async fn landed(
    conn: &mut impl ConnectionLike,
    receiver: Side<'_>,
    id: u64,
) -> Result<Option<Landing>> {
    let answer: Option<String> = redis::cmd("HGET")
        .arg(receiver.received())
        .arg(id)
        .query_async(conn)
        .await?;
    match answer.as_deref() {
        None => Ok(None),
        Some("given") => Ok(Some(Landing::Given)),
        Some("void") => Ok(Some(Landing::Void)),
        Some(other) => Err(unexpected("the received hash", 0, other)),
    }
}

/// Drops `giver`'s record of transfer `id`, as the receiver answered.
pub async fn settle(
    conn: &mut impl ConnectionLike,
    giver: Side<'_>,
    id: u64,
    landing: Landing,
) -> Result<Settled> {
    let (code, units): (i64, u64) = TRANSFER_SETTLE
        .key(giver.keys().meta())
        .key(giver.units())
        .key(giver.open_transfers())
        .arg(id)
        .arg(landing.word())
        .invoke_async(conn)
        .await?;
    Ok(match code {
        0 => Settled::Done { units_back: units },
        1 => Settled::NoRecord,
        2 => Settled::Paused,
        _ => return Err(unexpected("transfer_settle", code, "")),
    })
}

/// Completes a transfer whose mover may have stopped: the receiver first
/// (it stays given, or is called off), then the giver's record.
pub async fn complete(
    conn: &mut impl ConnectionLike,
    giver: Side<'_>,
    receiver: Side<'_>,
    id: u64,
) -> Result<(Landing, Settled)> {
    let landing = void(conn, receiver, id).await?;
    let settled = settle(conn, giver, id, landing).await?;
    Ok((landing, settled))
}

/// `giver`'s transfers not settled yet, oldest first.
pub async fn open(conn: &mut impl ConnectionLike, giver: Side<'_>) -> Result<Vec<OpenTransfer>> {
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(giver.open_transfers())
        .query_async(conn)
        .await?;
    let mut open = Vec::new();
    for (field, record) in fields {
        // `last` is the highest id ever taken, not a transfer.
        let Ok(id) = field.parse::<u64>() else {
            continue;
        };
        let parts: Vec<&str> = record.split(' ').collect();
        let number = |i: usize| parts.get(i).and_then(|p| p.parse::<u64>().ok());
        match (parts.first(), number(1), number(2)) {
            (Some(to), Some(units), Some(taken_ms)) if parts.len() == 3 => {
                open.push(OpenTransfer {
                    id,
                    to: to.to_string(),
                    units,
                    taken_ms,
                })
            }
            _ => {
                return Err(Error::redis(format!(
                    "transfer {id} of {} reads {record:?}, not \"<to> <units> <time_ms>\"",
                    giver.open_transfers()
                )))
            }
        }
    }
    open.sort_by_key(|t| t.id);
    Ok(open)
}

/// Whether any gate of `layout` (or its pool) has a transfer not settled.
pub async fn any_open(conn: &mut impl ConnectionLike, layout: &Layout) -> Result<bool> {
    let gates = layout.all_keys()?;
    for side in Side::all(&gates) {
        if !open(conn, side).await?.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The units in transit between the gates of `gates` (bucket 0's first):
/// taken by a giver and not landed at the receiver (between give and
/// settle a transfer's units are the receiver's, though the giver still
/// holds its record). Exact only while no mover moves (a fence,
/// gate/mover_lease.rs): read across masters, a transfer moving meanwhile
/// may be counted twice or not at all.
pub async fn in_transit(conn: &mut impl ConnectionLike, gates: &[VoucherKeys]) -> Result<u64> {
    let sides = Side::all(gates);
    let mut units = 0;
    for giver in &sides {
        for t in open(conn, *giver).await? {
            let receiver = match t.to.as_str() {
                "pool" => sides.first().copied(),
                b => b
                    .parse::<usize>()
                    .ok()
                    .and_then(|b| sides.get(b + 1).copied()),
            };
            let Some(receiver) = receiver else {
                return Err(Error::redis(format!(
                    "transfer {} of {} goes to {:?}, not a gate of the voucher",
                    t.id,
                    giver.open_transfers(),
                    t.to
                )));
            };
            if landed(conn, receiver, t.id).await? != Some(Landing::Given) {
                units += t.units;
            }
        }
    }
    Ok(units)
}

fn unexpected(script: &str, code: i64, reason: &str) -> Error {
    Error::redis(format!("{script} answered {code} {reason:?}"))
}
