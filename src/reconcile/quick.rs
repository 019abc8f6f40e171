//! reconcile's quick look: a voucher compared by counts and digests instead
//! of member by member, so a consistent voucher costs the same at ten orders
//! as at ten million.
//!
//! MySQL's voucher row holds the counts and digests of its orders (the
//! users, the pending orders, the cancelled ones: orders/counters.rs) and
//! the gate's meta those of its sets (buyers, timeouts, released:
//! lua/lib/digest.lua). With the entries in flight looked up in MySQL, the
//! two agree exactly when a full read would find the voucher consistent
//! (but with a chance of 2^-52 per set that differs). Anything else —
//! drift, work between the two stores (a cancellation not yet released, a
//! batch committed and not yet finished), a gate from before digests — is
//! `Unsure`: the caller looks again, then reads the voucher in full, which
//! classifies it exactly.

use std::collections::HashSet;

use mysql_async::prelude::*;
use redis::{FromRedisValue, Value};

use super::voucher_rows::{self, VoucherRow};
use crate::error::{Error, Result};
use crate::gate::pause::{META_PAUSED, META_PAUSE_TOKEN};
use crate::gate::policy::{
    self, META_PER_USER_LIMIT, META_REQUIRE_TOKEN, META_USER_RATE, META_WAITLIST_LIMIT,
};
use crate::gate::witness::{self, GateDigests, Witness};
use crate::store::db::{join_ids, Db};
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::{pipeline_per_item, RedisConn};
use crate::store::registry;
use crate::stream::backlog::in_flight_orders;
use crate::support::set_digest::SetDigest;

/// A voucher both stores agree on, with what its report shows.
#[derive(Debug, Clone)]
pub struct Agreed {
    pub voucher: u64,
    pub row: VoucherRow,
    pub gate_stock: i64,
    pub gate_paused: bool,
    pub pause_token: String,
    pub buyers: u64,
    pub in_flight: u64,
    pub dead_letters: u64,
    /// MySQL's stock less the units admitted and not yet persisted.
    pub expected_gate_stock: i64,
}

#[derive(Debug)]
pub enum Quick {
    Agreed(Box<Agreed>),
    /// The counts or digests differ: a full read decides.
    Unsure,
    /// The gate moved while it was looked at.
    Moved,
    /// Not in MySQL.
    Missing,
}

/// What the gate holds for one voucher, besides its witness and digests.
struct GateHolds {
    loaded: bool,
    deadlines: u64,
    dead_letters: u64,
    policy: crate::orders::policy::Policy,
    paused: bool,
    pause_token: String,
    /// (user, order, units) of the entries not yet acknowledged.
    entries: Vec<(u64, u64, u64)>,
}

/// Looks at many vouchers with a few round trips in all, Redis first and
/// MySQL second, the witnesses and digests read before and after.
pub async fn look_many(
    db: &Db,
    conn: &mut impl RedisConn,
    prefix: &str,
    vouchers: &[u64],
) -> Result<Vec<Quick>> {
    let keys = VoucherKeys::of_all(prefix, vouchers)?;
    let before = witness::read_many_with_digests(conn, &keys).await?;
    let registered = registry::registered(conn, prefix, vouchers).await?;
    let gates = read_gates(conn, &keys).await?;

    let list = join_ids(vouchers.iter().copied());
    let mut mysql = db.conn().await?;
    let mut tx = mysql
        .start_transaction(crate::store::db::snapshot_tx())
        .await?;
    let rows = voucher_rows::read(&mut tx, &list).await?;
    let mut stored = Vec::with_capacity(gates.len());
    for (gate, voucher) in gates.iter().zip(vouchers) {
        stored.push(stored_of_entries(&mut tx, *voucher, &gate.entries).await?);
    }
    tx.commit().await?;
    drop(mysql);
    let after = witness::read_many_with_digests(conn, &keys).await?;

    let mut out = Vec::with_capacity(vouchers.len());
    for (i, voucher) in vouchers.iter().enumerate() {
        let Some(row) = rows.get(voucher) else {
            out.push(Quick::Missing);
            continue;
        };
        if before[i] != after[i] {
            out.push(Quick::Moved);
            continue;
        }
        let (w, d) = &before[i];
        let look = QuickLook {
            voucher: *voucher,
            row,
            gate: &gates[i],
            witness: w,
            digests: d,
            registered: registered.contains(voucher),
            stored: &stored[i],
        };
        out.push(match look.agreed() {
            Some(a) => Quick::Agreed(Box::new(a)),
            None => Quick::Unsure,
        });
    }
    Ok(out)
}

async fn read_gates(conn: &mut impl RedisConn, keys: &[VoucherKeys]) -> Result<Vec<GateHolds>> {
    let replies = pipeline_per_item(conn, keys, false, false, |pipe, k| {
        pipe.exists(k.meta())
            .zcard(k.timeouts())
            .xlen(k.dead())
            .xlen(k.orders())
            .hget(k.meta(), META_USER_RATE)
            .hget(k.meta(), META_REQUIRE_TOKEN)
            .hget(k.meta(), META_PAUSED)
            .hget(k.meta(), META_PAUSE_TOKEN)
            .hget(k.meta(), META_PER_USER_LIMIT)
            .hget(k.meta(), META_WAITLIST_LIMIT);
        Ok(())
    })
    .await?;
    let mut gates = Vec::with_capacity(keys.len());
    for (chunk, k) in replies.into_iter().zip(keys) {
        type Row = (
            bool,
            u64,
            u64,
            u64,
            Option<u32>,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<u32>,
            Option<String>,
        );
        let (
            loaded,
            deadlines,
            dead_letters,
            stream_len,
            rate,
            token,
            paused,
            pause_token,
            limit,
            cap,
        ): Row = FromRedisValue::from_redis_value(Value::Array(chunk))
            .map_err(|e| Error::redis(format!("gate of voucher {}: {e}", k.voucher())))?;
        let entries = match stream_len {
            0 => Vec::new(),
            _ => in_flight_orders(conn, k).await?,
        };
        gates.push(GateHolds {
            loaded,
            deadlines,
            dead_letters,
            policy: policy::from_meta(policy::MetaPolicy {
                user_rate: rate,
                require_token: token,
                per_user_limit: limit,
                waitlist_limit: cap,
            }),
            paused: paused.as_deref() == Some("1"),
            pause_token: pause_token.unwrap_or_default(),
            entries,
        });
    }
    Ok(gates)
}

/// Of the entries in flight: the order ids MySQL stores for this voucher,
/// and the users who hold an order of it.
#[derive(Debug, Default)]
struct Stored {
    orders: HashSet<u64>,
    users: HashSet<u64>,
}

async fn stored_of_entries(
    tx: &mut impl Queryable,
    voucher: u64,
    entries: &[(u64, u64, u64)],
) -> Result<Stored> {
    if entries.is_empty() {
        return Ok(Stored::default());
    }
    let ids = join_ids(entries.iter().map(|e| e.1));
    let users = join_ids(entries.iter().map(|e| e.0));
    let rows: Vec<(u64, u64)> = tx
        .query(format!(
            "SELECT id, user_id FROM seckill_order WHERE voucher_id = {voucher} AND id IN ({ids})
             UNION ALL
             SELECT id, user_id FROM seckill_order WHERE voucher_id = {voucher} AND user_id IN ({users})"
        ))
        .await?;
    let mut s = Stored::default();
    for (id, user) in rows {
        s.orders.insert(id);
        s.users.insert(user);
    }
    Ok(s)
}

struct QuickLook<'a> {
    voucher: u64,
    row: &'a VoucherRow,
    gate: &'a GateHolds,
    witness: &'a Witness,
    digests: &'a GateDigests,
    registered: bool,
    stored: &'a Stored,
}

impl QuickLook<'_> {
    /// The voucher as a full read would report it consistent, or None.
    fn agreed(&self) -> Option<Agreed> {
        let (row, gate, c) = (self.row, self.gate, &self.row.counters);
        let gate_stock: i64 = self.witness.stock.parse().ok()?;
        if !gate.loaded || !self.registered || row.policy != gate.policy {
            return None;
        }
        // I1 by the counters.
        if row.stock + c.units_active() as i64 != row.total {
            return None;
        }
        // Entries whose order MySQL does not have yet hold units taken at
        // the gate only; their users are buyers with no order yet.
        let unpersisted: Vec<&(u64, u64, u64)> = gate
            .entries
            .iter()
            .filter(|(_, order, _)| !self.stored.orders.contains(order))
            .collect();
        let units: u64 = unpersisted.iter().map(|e| e.2).sum();
        let new_users: HashSet<u64> = unpersisted
            .iter()
            .map(|e| e.0)
            .filter(|u| !self.stored.users.contains(u))
            .collect();
        let holders = c.orders_total + new_users.len() as u64;
        let mut holders_digest = c.users_digest;
        for u in &new_users {
            holders_digest.add(*u);
        }
        let digest = |field: &Option<String>| SetDigest::parse(field.as_deref());
        let buyers_agree =
            self.witness.buyers == holders && digest(&self.digests.buyers) == Some(holders_digest);
        // Every cancelled order released, every pending one with its
        // deadline, nothing else in either set.
        let released_agree = self.witness.released == c.orders_cancelled
            && digest(&self.digests.released) == Some(c.cancelled_digest);
        let deadlines_agree = gate.deadlines == c.orders_pending()
            && digest(&self.digests.timeouts) == Some(c.pending_digest);
        // MySQL holds every order the gate saw committed (read after it).
        let none_lost = self.digests.committed <= c.orders_total;
        let expected = row.stock - units as i64;
        if !(buyers_agree && released_agree && deadlines_agree && none_lost)
            || expected < 0
            || gate_stock != expected
        {
            return None;
        }
        Some(Agreed {
            voucher: self.voucher,
            row: row.clone(),
            gate_stock,
            gate_paused: gate.paused,
            pause_token: gate.pause_token.clone(),
            buyers: self.witness.buyers,
            in_flight: gate.entries.len() as u64,
            dead_letters: gate.dead_letters,
            expected_gate_stock: expected,
        })
    }
}
