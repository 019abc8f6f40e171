//! The invariants (docs/src/concepts/invariants.md), checked after every scenario. Each check
//! reads both stores and fails with the numbers that disagree.

use std::collections::{BTreeMap, BTreeSet};

use mysql_async::prelude::*;
use redis::streams::{StreamInfoGroupsReply, StreamRangeReply};
use redis::AsyncCommands;
use seckill::store::keys::{VoucherKeys, WORKER_GROUP};
use seckill::store::layout::{bucket_of, Layout};
use seckill::stream::id::StreamId;

use super::TestEnv;

/// What the stores hold for one voucher.
#[derive(Debug)]
pub struct VoucherState {
    pub total: i64,
    pub mysql_stock: i64,
    /// user → (order id, status) of the MySQL orders.
    pub orders: BTreeMap<u64, (u64, i8)>,
    /// order id → units, of the MySQL orders and the entries in flight
    /// (an entry without a `quantity` field holds one), read here from the
    /// rows and the entries themselves, not through the code under test.
    pub quantities: BTreeMap<u64, u64>,
    pub redis_stock: Option<i64>,
    pub buyers: BTreeSet<u64>,
    pub waitlist: Vec<u64>,
    /// Order ids whose unit was given back at the gate.
    pub released: BTreeSet<u64>,
    /// Pending orders past their payment deadline by more than a second
    /// (held ones aside: restored after MySQL lost them, their deadline is
    /// held for the operator).
    pub overdue_pending: u64,
    /// (user, order) of the stream entries not yet acknowledged
    /// (undelivered or pending; a pending one may already be in MySQL).
    pub in_flight: Vec<(u64, u64)>,
    /// The voucher row's order counters (orders and units: all, paid,
    /// cancelled; the digests of the users, the pending and the cancelled
    /// orders), and the same counted here from the rows (the digests by
    /// MySQL's SHA1(), independently of the code under test).
    pub counters: [u64; 9],
    pub counted: [u64; 9],
    /// The gate's set digests (meta buyers_digest, released_digest,
    /// timeouts_digest; absent: 0), and the same computed here from the
    /// sets' members.
    pub gate_digests: [u64; 3],
    pub set_digests: [u64; 3],
    /// (user, bucket) of buyers and waiting users at a bucket that is not
    /// theirs (a voucher in buckets).
    pub misrouted: Vec<(u64, u32)>,
}

/// A set's digest as reconcile compares it: the sum of the members'
/// first 52 bits of SHA-1 (of the decimal form) mod 2^52, computed here
/// apart from the code under test.
pub fn digest_of<'a>(members: impl IntoIterator<Item = &'a String>) -> u64 {
    members.into_iter().fold(0u64, |d, m| {
        let hex = sha1_smol::Sha1::from(m.as_bytes()).digest().to_string();
        (d + u64::from_str_radix(&hex[..13], 16).unwrap()) % (1 << 52)
    })
}

pub async fn read_state(env: &TestEnv, voucher: u64) -> VoucherState {
    try_read_state(env, voucher)
        .await
        .unwrap_or_else(|broken| panic!("{broken}"))
}

/// The state, or that a user has two orders (the map by user holds one).
pub async fn try_read_state(env: &TestEnv, voucher: u64) -> Result<VoucherState, String> {
    let mut conn = env.db().await.conn().await.expect("mysql");
    type Row = (i64, i64, u64, u64, u64, u64, u64, u64, u64, u64, u64);
    let (total, mysql_stock, c0, c1, c2, c3, c4, c5, c6, c7, c8): Row = conn
        .exec_first(
            "SELECT total_stock, stock, orders_total, units_total, orders_paid, units_paid,
                    orders_cancelled, units_cancelled, users_digest, pending_digest,
                    cancelled_digest
               FROM seckill_voucher WHERE voucher_id = ?",
            (voucher,),
        )
        .await
        .expect("read voucher")
        .expect("voucher exists in MySQL");
    let rows: Vec<(u64, u64, i8, u64)> = conn
        .exec(
            "SELECT user_id, id, status, quantity FROM seckill_order WHERE voucher_id = ?",
            (voucher,),
        )
        .await
        .expect("read orders");
    let orders_len = rows.len();
    let digests: (u64, u64, u64) = conn
        .exec_first(
            "SELECT COALESCE(SUM(CAST(CONV(LEFT(SHA1(user_id), 13), 16, 10) AS UNSIGNED)) % 4503599627370496, 0),
                    COALESCE(SUM(IF(status = 0, CAST(CONV(LEFT(SHA1(id), 13), 16, 10) AS UNSIGNED), 0)) % 4503599627370496, 0),
                    COALESCE(SUM(IF(status NOT IN (0, 1), CAST(CONV(LEFT(SHA1(id), 13), 16, 10) AS UNSIGNED), 0)) % 4503599627370496, 0)
               FROM seckill_order WHERE voucher_id = ?",
            (voucher,),
        )
        .await
        .expect("digests of the orders")
        .unwrap_or_default();
    let mut counted = [
        orders_len as u64,
        0,
        0,
        0,
        0,
        0,
        digests.0,
        digests.1,
        digests.2,
    ];
    for (_, _, status, quantity) in &rows {
        counted[1] += quantity;
        // A status other than pending or paid counts as cancelled.
        let at = match status {
            0 => continue,
            1 => 2,
            _ => 4,
        };
        counted[at] += 1;
        counted[at + 1] += quantity;
    }
    let overdue_pending: Option<u64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM seckill_order o JOIN seckill_voucher v ON v.voucher_id = o.voucher_id
              WHERE o.voucher_id = ? AND o.status = 0 AND o.held = 0
                AND o.create_time < NOW(3) - INTERVAL (v.pay_timeout_ms + 1000) * 1000 MICROSECOND",
            (voucher,),
        )
        .await
        .expect("overdue orders");
    let mut quantities: BTreeMap<u64, u64> = rows.iter().map(|r| (r.1, r.3)).collect();
    let orders: BTreeMap<u64, (u64, i8)> = rows
        .into_iter()
        .map(|(u, id, st, _)| (u, (id, st)))
        .collect();
    if orders.len() != orders_len {
        return Err(format!(
            "I4: a user has two orders of voucher {voucher} ({orders_len} orders of {} users)",
            orders.len()
        ));
    }
    drop(conn);

    // Every gate of the voucher: one, or one per bucket (then the pool and
    // the units in transit count as stock: free units not in a bucket).
    let mut redis = env.redis().await;
    let layout = Layout::read(&mut redis, &env.prefix, voucher)
        .await
        .expect("layout");
    let gates = layout.all_keys().expect("keys");
    let mut redis_stock: Option<i64> = None;
    let (mut buyers, mut waitlist, mut released) = (Vec::new(), Vec::new(), Vec::new());
    let mut gate_digests = [0u64; 3];
    let (mut raw_buyers, mut raw_released, mut raw_timeouts) = (Vec::new(), Vec::new(), Vec::new());
    let mut entries = Vec::new();
    let mut misrouted = Vec::new();
    for (b, keys) in gates.iter().enumerate() {
        let stock: Option<i64> = redis.get(keys.stock()).await.expect("stock");
        if let Some(stock) = stock {
            *redis_stock.get_or_insert(0) += stock;
        }
        let mine: Vec<u64> = redis.smembers(keys.buyers()).await.expect("buyers");
        let waiting: Vec<u64> = redis
            .zrange(keys.waitlist(), 0, -1)
            .await
            .expect("waitlist");
        for u in mine.iter().chain(&waiting) {
            if bucket_of(*u, layout.buckets()) != b as u32 {
                misrouted.push((*u, b as u32));
            }
        }
        buyers.extend(mine);
        waitlist.extend(waiting);
        let gone: Vec<u64> = redis.smembers(keys.released()).await.expect("released");
        released.extend(gone);
        let fields: Vec<Option<u64>> = redis::cmd("HMGET")
            .arg(keys.meta())
            .arg(&["buyers_digest", "released_digest", "timeouts_digest"])
            .query_async(&mut redis)
            .await
            .expect("digests");
        for (i, d) in gate_digests.iter_mut().enumerate() {
            *d = (*d + fields.get(i).copied().flatten().unwrap_or(0)) % (1 << 52);
        }
        let members: Vec<String> = redis.smembers(keys.buyers()).await.expect("buyers");
        raw_buyers.extend(members);
        let members: Vec<String> = redis.smembers(keys.released()).await.expect("released");
        raw_released.extend(members);
        let members: Vec<String> = redis
            .zrange(keys.timeouts(), 0, -1)
            .await
            .expect("timeouts");
        raw_timeouts.extend(members);
        entries.extend(in_flight(&mut redis, keys).await);
    }
    let (pool, in_transit) = match layout.buckets() {
        1 => (0, 0),
        _ => free_between_buckets(&mut redis, &gates).await,
    };
    if let Some(stock) = redis_stock.as_mut() {
        *stock += pool + in_transit;
    }
    let set_digests = [
        digest_of(&raw_buyers),
        digest_of(&raw_released),
        digest_of(&raw_timeouts),
    ];
    for (_, order, quantity) in &entries {
        quantities.entry(*order).or_insert(*quantity);
    }
    Ok(VoucherState {
        released: released.into_iter().collect(),
        overdue_pending: overdue_pending.unwrap_or(0),
        total,
        mysql_stock,
        orders,
        redis_stock,
        buyers: buyers.into_iter().collect(),
        waitlist,
        quantities,
        in_flight: entries.iter().map(|(u, o, _)| (*u, *o)).collect(),
        counters: [c0, c1, c2, c3, c4, c5, c6, c7, c8],
        counted,
        gate_digests,
        set_digests,
        misrouted,
    })
}

/// The pool's units and those in transit (taken from a gate, not landed
/// yet) of a voucher in buckets, read from the keys themselves.
async fn free_between_buckets(
    redis: &mut seckill::store::redis_conn::Redis,
    gates: &[VoucherKeys],
) -> (i64, i64) {
    let pool: Option<i64> = redis.get(gates[0].pool()).await.expect("pool");
    let received_of = |to: &str| match to {
        "pool" => gates[0].pool_received(),
        b => gates[b.parse::<usize>().expect("a bucket number")].received(),
    };
    let mut in_transit = 0;
    let givers =
        std::iter::once(gates[0].pool_transfers()).chain(gates.iter().map(|g| g.transfers()));
    for giver in givers {
        let records: Vec<(String, String)> = redis.hgetall(&giver).await.expect("transfers");
        for (id, record) in records {
            if id == "last" {
                continue;
            }
            let parts: Vec<&str> = record.split(' ').collect();
            let landed: Option<String> = redis
                .hget(received_of(parts[0]), &id)
                .await
                .expect("received");
            if landed.as_deref() != Some("given") {
                in_transit += parts[1].parse::<i64>().expect("units");
            }
        }
    }
    (pool.unwrap_or(0), in_transit)
}

async fn in_flight(
    redis: &mut seckill::store::redis_conn::Redis,
    keys: &VoucherKeys,
) -> Vec<(u64, u64, u64)> {
    let all: StreamRangeReply = redis.xrange_all(keys.orders()).await.expect("xrange");
    let groups: Option<StreamInfoGroupsReply> = if all.ids.is_empty() {
        None
    } else {
        Some(
            redis
                .xinfo_groups(keys.orders())
                .await
                .expect("xinfo groups"),
        )
    };
    let group = groups.and_then(|g| g.groups.into_iter().find(|g| g.name == WORKER_GROUP));
    let pending: BTreeSet<String> = match &group {
        Some(_) => {
            let reply: redis::streams::StreamPendingCountReply = redis
                .xpending_count(keys.orders(), WORKER_GROUP, "-", "+", 1_000_000)
                .await
                .expect("xpending");
            reply.ids.into_iter().map(|p| p.id).collect()
        }
        None => BTreeSet::new(),
    };
    all.ids
        .iter()
        .filter(|e| match &group {
            None => true,
            Some(g) => pending.contains(&e.id) || id_after(&e.id, &g.last_delivered_id),
        })
        .map(|e| {
            let id = |f: &str| {
                e.get::<u64>(f)
                    .unwrap_or_else(|| panic!("stream entry {} has no numeric {f}", e.id))
            };
            let quantity = if e.map.contains_key("quantity") {
                id("quantity")
            } else {
                1
            };
            (id("user"), id("order"), quantity)
        })
        .collect()
}

fn id_after(a: &str, b: &str) -> bool {
    StreamId::lenient(a) > StreamId::lenient(b)
}

impl VoucherState {
    /// The units of an order (MySQL's or in flight).
    pub fn units(&self, order: u64) -> u64 {
        self.quantities.get(&order).copied().unwrap_or(1)
    }

    /// The units of the in-flight entries MySQL does not have yet.
    pub fn unpersisted_units(&self) -> i64 {
        self.in_flight
            .iter()
            .filter(|(user, order)| self.orders.get(user).map(|o| o.0) != Some(*order))
            .map(|(_, order)| self.units(*order) as i64)
            .sum()
    }

    /// Users of in-flight entries whose order is not in MySQL yet (a pending
    /// entry of a stored order is a crash between commit and ack: not a unit
    /// in flight, and not a duplicate).
    pub fn unpersisted_users(&self) -> Vec<u64> {
        self.in_flight
            .iter()
            .filter(|(user, order)| self.orders.get(user).map(|o| o.0) != Some(*order))
            .map(|(user, _)| *user)
            .collect()
    }
}

/// I1–I5 at a quiet moment (no worker racing this check).
pub async fn assert_invariants(env: &TestEnv, voucher: u64) -> VoucherState {
    check_invariants(env, voucher)
        .await
        .unwrap_or_else(|broken| panic!("{broken}"))
}

/// Fails with what does not add up, as [`assert_invariants`] (the fault
/// explorer reports it instead of panicking).
macro_rules! ensure {
    ($cond:expr, $($what:tt)+) => {
        if !$cond {
            return Err(format!($($what)+));
        }
    };
}

macro_rules! ensure_eq {
    ($a:expr, $b:expr, $($what:tt)+) => {
        match (&$a, &$b) {
            (a, b) => {
                if a != b {
                    return Err(format!("{}\n  left: {a:?}\n right: {b:?}", format!($($what)+)));
                }
            }
        }
    };
}

/// I1–I6 as [`assert_invariants`] checks them: the state, or the first
/// that does not hold.
pub async fn check_invariants(env: &TestEnv, voucher: u64) -> Result<VoucherState, String> {
    let s = try_read_state(env, voucher).await?;
    let active: i64 = s
        .orders
        .values()
        .filter(|o| o.1 == 0 || o.1 == 1)
        .map(|o| s.units(o.0) as i64)
        .sum();
    // I1: MySQL accounts for every unit (stock + Σ quantity(pending, paid)).
    ensure_eq!(
        s.mysql_stock + active,
        s.total,
        "I1: mysql stock {} + units of active orders {active} != total {}",
        s.mysql_stock,
        s.total
    );
    // The voucher row's counters are what its orders add up to.
    ensure_eq!(
        s.counters, s.counted,
        "order counters (orders, units: all, paid, cancelled; digests: users, pending, cancelled) {:?} != counted from the rows {:?}",
        s.counters, s.counted
    );
    // So are the gate's digests (what reconcile's quick look compares).
    if s.redis_stock.is_some() {
        ensure_eq!(
            s.gate_digests,
            s.set_digests,
            "the gate's digests (buyers, released, timeouts) are not its sets'"
        );
    }
    // I3: no negative stock anywhere.
    ensure!(s.mysql_stock >= 0, "I3: mysql stock {} < 0", s.mysql_stock);
    if let Some(rs) = s.redis_stock {
        ensure!(rs >= 0, "I3: redis stock {rs} < 0");
        // I2: Redis stock equals MySQL stock less the units admitted but not yet persisted.
        let in_flight = s.unpersisted_units();
        ensure_eq!(
            rs + in_flight,
            s.mysql_stock,
            "I2: redis stock {rs} + in flight {in_flight} != mysql stock {}",
            s.mysql_stock
        );
    }
    // A voucher in buckets: every buyer and waiting user is in their own.
    ensure!(
        s.misrouted.is_empty(),
        "users at a bucket not theirs (user, bucket): {:?}",
        s.misrouted
    );
    // I4 (also asserted while reading): no user twice among orders and in-flight entries.
    let mut seen = BTreeSet::new();
    let unpersisted = s.unpersisted_users();
    for u in s.orders.keys().chain(unpersisted.iter()) {
        ensure!(
            seen.insert(*u),
            "I4: user {u} holds two units (order or in-flight entry)"
        );
    }
    // I5: the buyers at the gate are exactly the users with an order or an entry in flight.
    ensure_eq!(
        s.buyers,
        seen,
        "I5: buyers at the gate differ from users with an order or an entry in flight"
    );
    // I6: no pending order lingers past its deadline, and every cancelled
    // order's unit was given back at the gate (the released set holds it;
    // I2 above shows it was given back once).
    ensure_eq!(
        s.overdue_pending,
        0,
        "I6: pending orders past their payment deadline"
    );
    let cancelled: BTreeSet<u64> = s
        .orders
        .values()
        .filter(|o| o.1 == -1)
        .map(|o| o.0)
        .collect();
    ensure!(
        cancelled.is_subset(&s.released),
        "I6: cancelled orders whose unit was not given back: {:?}",
        cancelled.difference(&s.released).collect::<Vec<_>>()
    );
    // A buyer is never waitlisted; each waitlisted user appears once.
    let waitlisted: BTreeSet<u64> = s.waitlist.iter().copied().collect();
    ensure_eq!(
        waitlisted.len(),
        s.waitlist.len(),
        "a user is on the waitlist twice"
    );
    ensure!(
        waitlisted.is_disjoint(&s.buyers),
        "a buyer is on the waitlist: {:?}",
        waitlisted.intersection(&s.buyers).collect::<Vec<_>>()
    );
    Ok(s)
}
