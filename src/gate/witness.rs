//! The gate's witness: what changes whenever a voucher's gate moves. An
//! admission or promotion appends to the stream, an admission or release
//! changes the stock, a promotion or repair changes the buyers, a release
//! grows the released set. A write computed from a read of both stores is
//! applied only if the witness is still what it was before the read
//! (`lua/preload.lua` and `lua/reconcile.lua` check all four values).

use redis::streams::StreamRangeReply;
use redis::{FromRedisValue, ScriptInvocation, ServerErrorKind, Value};

use crate::error::{Error, Result};
use crate::store::keys::{VoucherKeys, WORKER_GROUP};
use crate::store::redis_conn::{pipeline_per_item, RedisConn};
use crate::store::scripts::RAISE_COMMITS;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Witness {
    /// The order stream's last entry id ('' when the stream is empty).
    pub last_entry_id: String,
    /// The gate stock as stored ('' when missing).
    pub stock: String,
    pub buyers: u64,
    pub released: u64,
}

impl Witness {
    /// The script arguments, in the order both scripts take them.
    pub fn args(&self) -> (&str, &str, u64, u64) {
        (&self.last_entry_id, &self.stock, self.buyers, self.released)
    }
}

/// One voucher's witness.
pub async fn read(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<Witness> {
    read_many(conn, std::slice::from_ref(keys))
        .await?
        .pop()
        .ok_or_else(|| Error::redis("an empty reply to the witness read"))
}

/// The gate's set digests as its meta holds them (`lua/lib/digest.lua`;
/// None where absent): reconcile compares them with MySQL's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GateDigests {
    pub buyers: Option<String>,
    pub released: Option<String>,
    pub timeouts: Option<String>,
    /// How many deadlines the timeouts set holds (the witness counts the
    /// other two sets).
    pub timeouts_len: u64,
    /// The orders workers inserted into MySQL and acknowledged here
    /// ([`META_COMMITTED`]): read before MySQL, MySQL holds at least this
    /// many of the gate's orders unless it lost commits.
    pub committed: u64,
    /// How many gaps of lost commits were taken off the witness
    /// ([`META_FORGOTTEN`]), read with it.
    pub forgotten: u64,
}

/// The meta field counting the orders workers inserted into MySQL
/// (lua/finish.lua): the gate's witness of MySQL's commits.
pub const META_COMMITTED: &str = "committed";
/// The meta field counting the gaps lua/forget_commits.lua took off the
/// witness: a raise from a count of MySQL read before one would put the
/// gap back (lua/raise_commits.lua refuses then).
pub const META_FORGOTTEN: &str = "forgotten";

/// Sets the gate's witness of commits back up to `held`, MySQL's count of
/// the gate's orders read before this call, less the entries in flight
/// whose acknowledgement may still count one of them
/// (lua/raise_commits.lua): a Redis that went back in time took the
/// witness's counts since with it, and a witness left short hides as many
/// orders of MySQL's next loss. Only raises it, and only if no gap was
/// taken off it since `forgotten` ([`META_FORGOTTEN`]) was read, before
/// MySQL. Returns the witness after (-1: the gate has no meta, left alone;
/// -2: a gap was taken off since). Never call it while MySQL lacks what
/// the witness saw: that gap is the loss's sign, and the caller's count
/// would be the lower one.
pub async fn raise_committed(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    held: u64,
    forgotten: u64,
) -> Result<i64> {
    crate::support::fault::point("before_raise").await?;
    let raise = Raise {
        keys: keys.clone(),
        held,
        forgotten,
    };
    Ok(raise.invocation().invoke_async(conn).await?)
}

/// One gate's raise: its keys, MySQL's count of its orders and the forget
/// count, both read as [`raise_committed`] says.
pub struct Raise {
    pub keys: VoucherKeys,
    pub held: u64,
    pub forgotten: u64,
}

impl Raise {
    fn invocation(&self) -> ScriptInvocation<'static> {
        let mut inv = RAISE_COMMITS.key(self.keys.orders());
        inv.key(self.keys.meta())
            .arg(WORKER_GROUP)
            .arg(self.held)
            .arg(self.forgotten);
        inv
    }
}

/// [`raise_committed`] for many gates in one pipeline (a round trip per
/// node, not per gate: the gate guard raises every selling voucher each
/// pass). A gate whose server lost the script is raised on its own, which
/// loads it. Each gate's witness after (or its error), in order.
pub async fn raise_many(conn: &mut impl RedisConn, raises: &[Raise]) -> Result<Vec<Result<i64>>> {
    if raises.is_empty() {
        return Ok(Vec::new());
    }
    crate::support::fault::point("before_raise").await?;
    let rows = pipeline_per_item(conn, raises, false, true, |pipe, r| {
        pipe.invoke_script(&r.invocation());
        Ok(())
    })
    .await?;
    let mut out = Vec::with_capacity(raises.len());
    for (r, row) in raises.iter().zip(rows) {
        let reply = row.into_iter().next().unwrap_or(Value::Nil);
        out.push(match reply {
            Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript) => {
                r.invocation().invoke_async(conn).await.map_err(Error::from)
            }
            Value::ServerError(e) => Err(redis::RedisError::from(e).into()),
            v => i64::from_redis_value(v)
                .map_err(|e| Error::redis(format!("raise_commits.lua: {e}"))),
        });
    }
    Ok(out)
}

/// What MySQL lacks of what a voucher's gates saw it commit: MySQL lost
/// commits (a failover to an asynchronous replica, a backup restored).
/// The witness errs low, never high.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MysqlBehind {
    /// Orders workers inserted.
    pub orders: u64,
    /// Cancellations whose units the gates gave back.
    pub cancellations: u64,
}

impl MysqlBehind {
    /// From the gates' `committed` and released counts (read before
    /// MySQL) and the voucher row's `orders_total` and `orders_cancelled`.
    pub fn of(committed: u64, released: u64, orders_total: u64, orders_cancelled: u64) -> Self {
        MysqlBehind {
            orders: committed.saturating_sub(orders_total),
            cancellations: released.saturating_sub(orders_cancelled),
        }
    }

    pub fn is_none(&self) -> bool {
        self.sum() == 0
    }

    pub fn sum(&self) -> u64 {
        self.orders + self.cancellations
    }

    pub fn covers(&self, other: &MysqlBehind) -> bool {
        other.orders <= self.orders && other.cancellations <= self.cancellations
    }
}

/// The meta fields of [`GateDigests`], in its order.
pub const DIGEST_FIELDS: [&str; 3] = ["buyers_digest", "released_digest", "timeouts_digest"];

impl GateDigests {
    pub fn fields(&self) -> [&Option<String>; 3] {
        [&self.buyers, &self.released, &self.timeouts]
    }
}

/// The witnesses of many vouchers, each read in one MULTI (a consistent
/// moment per voucher; on a single node one MULTI holds many of them).
pub async fn read_many(conn: &mut impl RedisConn, keys: &[VoucherKeys]) -> Result<Vec<Witness>> {
    Ok(read_many_with_digests(conn, keys)
        .await?
        .into_iter()
        .map(|(w, _)| w)
        .collect())
}

/// The witnesses and the set digests, each voucher's in one MULTI.
pub async fn read_many_with_digests(
    conn: &mut impl RedisConn,
    keys: &[VoucherKeys],
) -> Result<Vec<(Witness, GateDigests)>> {
    let replies = pipeline_per_item(conn, keys, true, false, |pipe, k| {
        pipe.xrevrange_count(k.orders(), "+", "-", 1)
            .get(k.stock())
            .scard(k.buyers())
            .scard(k.released())
            .cmd("HMGET")
            .arg(k.meta())
            .arg(&DIGEST_FIELDS[..])
            .zcard(k.timeouts())
            .hget(k.meta(), META_COMMITTED)
            .hget(k.meta(), META_FORGOTTEN);
        Ok(())
    })
    .await?;
    replies
        .into_iter()
        .map(|c| {
            type Row = (
                StreamRangeReply,
                Option<String>,
                u64,
                u64,
                (Option<String>, Option<String>, Option<String>),
                u64,
                Option<i64>,
                Option<u64>,
            );
            let (last, stock, buyers, released, (b, r, t), timeouts_len, committed, forgotten): Row =
                FromRedisValue::from_redis_value(Value::Array(c))
                    .map_err(|e| Error::redis(format!("witness: {e}")))?;
            let witness = Witness {
                last_entry_id: last
                    .ids
                    .into_iter()
                    .next()
                    .map(|e| e.id)
                    .unwrap_or_default(),
                stock: stock.unwrap_or_default(),
                buyers,
                released,
            };
            let digests = GateDigests {
                buyers: b,
                released: r,
                timeouts: t,
                timeouts_len,
                // Never below 0 (see reconcile's forget_lost_commits).
                committed: committed.unwrap_or(0).max(0) as u64,
                forgotten: forgotten.unwrap_or(0),
            };
            Ok((witness, digests))
        })
        .collect()
}
