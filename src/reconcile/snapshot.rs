//! One voucher as both stores see it, read Redis first and MySQL second, with
//! a witness of the gate read before and after the Redis part.

use std::collections::{BTreeSet, HashMap, HashSet};

use mysql_async::prelude::*;
use redis::{FromRedisValue, Pipeline, Value};

use super::voucher_rows::{self, VoucherRow};
use crate::error::{Error, Result};
use crate::gate::pause::{META_PAUSED, META_PAUSE_TOKEN};
use crate::gate::policy::{
    self, META_PER_USER_LIMIT, META_REQUIRE_TOKEN, META_USER_RATE, META_WAITLIST_LIMIT,
};
use crate::gate::witness::{self, GateDigests, Witness, DIGEST_FIELDS};
use crate::orders::counters::Counters;
use crate::orders::order::OrderStatus;
use crate::orders::policy::Policy;
use crate::orders::restore::{LostCommit, LostState};
use crate::store::db::{join_ids, Db};
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::{pipeline_per_item, RedisConn};
use crate::store::registry;
use crate::stream::backlog::{acknowledged_orders, in_flight_orders, Wanted};
use crate::stream::entry::OrderMessage;
use crate::support::set_digest::SetDigest;

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub voucher: u64,
    // MySQL
    pub total: i64,
    pub mysql_stock: i64,
    pub begin_ms: i64,
    pub end_ms: i64,
    pub pay_timeout_ms: i64,
    /// The admission policy in MySQL, and as the gate's meta holds it.
    pub policy: Policy,
    pub gate_policy: Policy,
    /// (order id, created ms) of pending orders.
    pub pending: Vec<(u64, i64)>,
    /// Pending orders held for the operator (restored after MySQL lost
    /// them, their payment unknown): no deadline is theirs to schedule.
    pub held: BTreeSet<u64>,
    pub paid: usize,
    /// The units paid orders hold.
    pub paid_units: u64,
    /// Order id → units, for MySQL's orders and the entries in flight that
    /// hold more than one (absent: one).
    pub quantities: HashMap<u64, u64>,
    pub cancelled: BTreeSet<u64>,
    /// Orders cancelled, or pending orders created, less than the settle
    /// time ago: their release or deadline may still be on its way.
    pub settling: HashSet<u64>,
    pub order_ids: HashSet<u64>,
    pub order_users: BTreeSet<u64>,
    /// The voucher row's order counters, and the same counted from the
    /// rows read with it (one snapshot: they agree unless a counter drifted).
    pub counters: Counters,
    pub recounted: Counters,
    // Redis
    pub gate_loaded: bool,
    /// Admission paused (a worker found the gate had lost writes).
    pub gate_paused: bool,
    /// The latest pause this view saw ('' if none): a reopen on this view
    /// is refused if another pause came since.
    pub pause_token: String,
    /// Users on the waitlist (some may be buyers already).
    pub waiting: u64,
    /// In the registry, where workers find the streams to consume.
    pub registered: bool,
    pub gate_stock: Option<i64>,
    pub buyers: BTreeSet<u64>,
    pub released: BTreeSet<u64>,
    pub deadlines: HashSet<u64>,
    /// (user, order) of entries not yet acknowledged.
    pub in_flight: Vec<(u64, u64)>,
    /// Orders a worker committed and acknowledged (their entries still
    /// kept) that MySQL does not have: it lost its last commits (a failover
    /// to an asynchronous replica, a backup restored). Their buyers are
    /// never dropped, and the units of those not released are held as if
    /// in flight, until the orders are restored.
    pub lost_commits: Vec<LostCommit>,
    /// Buyers with no order anywhere, while MySQL lost more commits than
    /// the kept entries show ([`Snapshot::commits_lost`]): any of them may
    /// be a buyer whose order is gone with its entry, so none is dropped
    /// and the gate's stock is not judged (their quantities are unknown)
    /// unless the operator names their count (`--drop-lost-commits`).
    pub unrestorable: BTreeSet<u64>,
    /// Pending orders in MySQL whose unit the gate gave back (in the
    /// released set): a release follows a cancellation MySQL committed, so
    /// MySQL lost that cancellation (a backup restored from between the
    /// two, an asynchronous replica). Cancelled again, their units are
    /// MySQL's stock again, as the gate has them.
    pub lost_cancellations: BTreeSet<u64>,
    pub dead_letters: u64,
    pub witness: Witness,
    /// The gate's set digests as read before the sets, and which of them
    /// were the same after (no script changed that set meanwhile).
    pub gate_digests: GateDigests,
    pub digests_stable: [bool; 3],
    /// One bucket of a voucher in buckets (reconcile/buckets.rs): then
    /// `total` and `mysql_stock` are the bucket's share, and this holds
    /// the voucher's own.
    pub bucket: Option<BucketView>,
}

/// A voucher in buckets, its units wherever they are: with none lost or
/// too many, the places add up to MySQL's free stock (reconcile's check
/// of the voucher as a whole).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct VoucherUnits {
    pub total: i64,
    /// MySQL's free stock: the total less what pending and paid orders hold.
    pub mysql_stock: i64,
    pub pool: i64,
    pub in_transit: i64,
    /// Every bucket's stock.
    pub bucket_stock: i64,
    /// Admitted at a bucket, not yet in MySQL.
    pub in_flight: i64,
    /// Cancelled in MySQL, not yet given back at their bucket.
    pub unreleased: i64,
    /// MySQL's free stock less all the above: above 0, units stuck; below
    /// 0, more units in Redis than MySQL has (an oversell risk).
    pub off: i64,
}

/// Where a bucket sits, and its voucher's MySQL figures.
#[derive(Debug, Clone, Default)]
pub struct BucketView {
    pub bucket: u32,
    pub buckets: u32,
    /// Every bucket's tag, space-separated.
    pub tags: String,
    /// The units the voucher's pending and paid orders hold, every bucket's.
    pub voucher_active: i64,
    /// The voucher's units wherever they are (its total and MySQL's free
    /// stock among them).
    pub units: VoucherUnits,
    /// The bucket holding the most stock (the lowest such), as read.
    pub richest: u32,
}

impl Snapshot {
    /// The gate's digests that are not their sets' (a set changed by a
    /// tool that does not keep its digest, or a gate from a release without
    /// them), as (meta field, value read, the set's digest), for
    /// `lua/digest_sync.lua`. Only those stable across the read: the sets
    /// were read in full and did not move.
    pub fn digests_behind(&self) -> Vec<(&'static str, String, String)> {
        let sets = [
            SetDigest::of(self.buyers.iter().copied()),
            SetDigest::of(self.released.iter().copied()),
            SetDigest::of(self.deadlines.iter().copied()),
        ];
        DIGEST_FIELDS
            .into_iter()
            .zip(self.gate_digests.fields())
            .zip(sets)
            .zip(self.digests_stable)
            .filter(|(_, stable)| *stable)
            .filter(|(((_, seen), set), _)| SetDigest::parse(seen.as_deref()) != Some(*set))
            .map(|(((field, seen), set), _)| {
                (field, seen.clone().unwrap_or_default(), set.0.to_string())
            })
            .collect()
    }

    /// The units an order (in MySQL or in flight) holds.
    pub fn units(&self, order: u64) -> u64 {
        self.quantities.get(&order).copied().unwrap_or(1)
    }

    /// The units pending and paid orders hold: with MySQL's stock, the
    /// voucher's total (I1).
    pub fn active_units(&self) -> i64 {
        let pending: u64 = self.pending.iter().map(|(o, _)| self.units(*o)).sum();
        (pending + self.paid_units) as i64
    }

    /// In-flight orders MySQL does not have yet, and committed ones it
    /// lost: units taken at the gate only.
    pub fn unpersisted(&self) -> Vec<(u64, u64)> {
        let lost = self
            .lost_commits
            .iter()
            .filter(|l| l.state != LostState::Released)
            .map(|l| (l.user, l.order));
        self.in_flight
            .iter()
            .filter(|(_, order)| !self.order_ids.contains(order))
            .copied()
            .chain(lost)
            .collect()
    }

    /// Users who are buyers for good: an order in MySQL (any status), in
    /// flight, or one MySQL lost.
    pub fn holders(&self) -> BTreeSet<u64> {
        let mut h = self.order_users.clone();
        h.extend(self.unpersisted().into_iter().map(|(user, _)| user));
        h.extend(self.lost_commits.iter().map(|l| l.user));
        h.extend(&self.unrestorable);
        h
    }

    /// How many more orders the gate's workers inserted into MySQL than
    /// MySQL has of its users (the witness read before MySQL, so a commit
    /// in between only lowers it): above 0, MySQL lost commits.
    pub fn commits_lost(&self) -> u64 {
        self.gate_digests
            .committed
            .saturating_sub(self.recounted.orders_total)
    }

    pub fn cancelled_unreleased(&self) -> BTreeSet<u64> {
        self.cancelled.difference(&self.released).copied().collect()
    }

    /// Cancelled orders whose unit should have come back by now.
    pub fn cancelled_unreleased_settled(&self) -> BTreeSet<u64> {
        self.cancelled_unreleased()
            .into_iter()
            .filter(|o| !self.settling.contains(o))
            .collect()
    }

    /// Pending orders old enough to have their deadline, without one.
    pub fn deadlines_missing(&self) -> Vec<(u64, i64)> {
        self.pending
            .iter()
            .filter(|(order, _)| {
                !self.deadlines.contains(order)
                    && !self.settling.contains(order)
                    && !self.held.contains(order)
                    && !self.lost_cancellations.contains(order)
            })
            .copied()
            .collect()
    }

    /// What the gate's stock should be: MySQL's, less the units admitted but
    /// not yet persisted, less the cancelled units not yet given back.
    pub fn expected_gate_stock(&self) -> i64 {
        self.gate_owes().max(0)
    }

    /// Cancelled orders whose unit the gate owes beyond MySQL's stock (see
    /// [`Snapshot::gate_owes`]): an order holds it already, so they are to
    /// be marked released with no unit given — settling ones first, since
    /// their own release, when it comes, must then find them released.
    pub fn spoken_for(&self) -> Vec<u64> {
        let mut owed_beyond = u64::try_from(-self.gate_owes()).unwrap_or(0);
        let settled = self.cancelled_unreleased_settled();
        let unreleased = self.cancelled_unreleased();
        let settling = unreleased.iter().filter(|o| !settled.contains(o));
        let mut spoken = Vec::new();
        // Whole orders, until their units cover what is owed beyond.
        for &order in settling.chain(settled.iter()) {
            if owed_beyond == 0 {
                break;
            }
            owed_beyond = owed_beyond.saturating_sub(self.units(order));
            spoken.push(order);
        }
        spoken
    }

    /// The units the gate owes beyond MySQL's stock that no cancellation
    /// covers ([`Snapshot::spoken_for`]): requests admitted past MySQL's
    /// stock (Redis lost writes), still in flight. A cancellation
    /// committed while they are would give MySQL a unit one of them then
    /// takes, and its release the gate the same unit again (the checked
    /// model's finding M1, docs/src/concepts/checked-model.md).
    pub fn owed_uncovered(&self) -> i64 {
        let spoken: u64 = self.spoken_for().iter().map(|o| self.units(*o)).sum();
        (-(self.gate_owes() + spoken as i64)).max(0)
    }

    /// The units of the in-flight orders MySQL does not have yet.
    pub fn unpersisted_units(&self) -> i64 {
        let units: u64 = self.unpersisted().iter().map(|(_, o)| self.units(*o)).sum();
        units as i64
    }

    /// MySQL's stock less what the gate owes (units admitted but not yet
    /// persisted, cancelled units not yet given back). Below 0, the gate
    /// owes more than MySQL has: some cancelled order's unit is held by an
    /// order already (a release whose record Redis lost after its promoted
    /// order was persisted), and giving it back again would oversell.
    pub fn gate_owes(&self) -> i64 {
        self.mysql_stock + self.lost_cancellation_units()
            - self.unpersisted_units()
            - self.unreleased_units()
    }

    /// The units of the pending orders whose cancellation MySQL lost: its
    /// stock once they are cancelled again.
    pub fn lost_cancellation_units(&self) -> i64 {
        let units: u64 = self.lost_cancellations.iter().map(|o| self.units(*o)).sum();
        units as i64
    }

    /// The units of cancelled orders not yet given back at the gate.
    pub fn unreleased_units(&self) -> i64 {
        let units: u64 = self
            .cancelled_unreleased()
            .iter()
            .map(|o| self.units(*o))
            .sum();
        units as i64
    }
}

/// A voucher as read.
#[derive(Debug)]
pub enum Read {
    Snapshot(Box<Snapshot>),
    /// The gate moved while it was being read: the two stores' views may
    /// not fit together. Read it again.
    Moved,
    /// Not in MySQL.
    Missing,
}

/// Reads one voucher.
pub async fn read_voucher(
    db: &Db,
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    voucher: u64,
    settle_ms: i64,
) -> Result<Read> {
    let mut reads = read_many(db, conn, keys.prefix(), &[voucher], settle_ms).await?;
    Ok(reads.pop().unwrap_or(Read::Missing))
}

/// Sets up to this size are read with one command; larger ones by scanning.
const WHOLE: u64 = 10_000;

/// All members of a set or sorted set (`cmd` = SSCAN or ZSCAN), a few
/// thousand per command.
async fn scan_members(conn: &mut impl RedisConn, cmd: &str, key: &str) -> Result<Vec<u64>> {
    let zset = cmd == "ZSCAN";
    let mut cursor = "0".to_string();
    let mut out = Vec::new();
    loop {
        let (next, page): (String, Vec<String>) = redis::cmd(cmd)
            .arg(key)
            .arg(&cursor)
            .arg("COUNT")
            .arg(5_000)
            .query_async(conn)
            .await?;
        // ZSCAN pages alternate member, score.
        let members = page.iter().step_by(if zset { 2 } else { 1 });
        out.extend(members.filter_map(|m| m.parse::<u64>().ok()));
        if next == "0" {
            return Ok(out);
        }
        cursor = next;
    }
}
type OrderRow = (u64, u64, u64, i8, i64, i8, u64, i8);

/// Reads many vouchers with a few round trips in all: the witnesses (one
/// MULTI), the gates (one pipeline), the streams of those with entries, the
/// vouchers and their orders (one MySQL query each), the witnesses again.
/// Work younger than `settle_ms` is treated as still on its way.
pub async fn read_many(
    db: &Db,
    conn: &mut impl RedisConn,
    prefix: &str,
    vouchers: &[u64],
    settle_ms: i64,
) -> Result<Vec<Read>> {
    let gates: Vec<GateSpec> = VoucherKeys::of_all(prefix, vouchers)?
        .into_iter()
        .map(GateSpec::whole)
        .collect();
    let reads = read_gates(db, conn, prefix, &gates, settle_ms).await?;
    Ok(reads
        .into_iter()
        .map(|r| match r.snapshot {
            None => Read::Missing,
            Some(_) if r.moved => Read::Moved,
            Some(s) => Read::Snapshot(s),
        })
        .collect())
}

/// One gate to read: a voucher's one gate, or one bucket of a voucher in
/// buckets (whose MySQL side is then the orders of that bucket's users).
#[derive(Debug, Clone)]
pub struct GateSpec {
    pub keys: VoucherKeys,
    pub bucket: u32,
    pub buckets: u32,
}

impl GateSpec {
    pub fn whole(keys: VoucherKeys) -> GateSpec {
        GateSpec {
            keys,
            bucket: 0,
            buckets: 1,
        }
    }
}

/// A gate as read: its snapshot (None: the voucher is not in MySQL), and
/// whether its witness moved during the read.
#[derive(Debug)]
pub struct GateRead {
    pub snapshot: Option<Box<Snapshot>>,
    pub moved: bool,
}

/// [`read_many`] for gates, a voucher's buckets among them.
pub async fn read_gates(
    db: &Db,
    conn: &mut impl RedisConn,
    prefix: &str,
    gates: &[GateSpec],
    settle_ms: i64,
) -> Result<Vec<GateRead>> {
    let keys: Vec<VoucherKeys> = gates.iter().map(|g| g.keys.clone()).collect();
    let gate_vouchers: Vec<u64> = keys.iter().map(|k| k.voucher()).collect();
    let vouchers: Vec<u64> = gate_vouchers
        .iter()
        .copied()
        .collect::<BTreeSet<u64>>()
        .into_iter()
        .collect();
    let looked = witness::read_many_with_digests(conn, &keys).await?;
    let (before, digests): (Vec<Witness>, Vec<GateDigests>) = looked.into_iter().unzip();
    // Small sets come whole in the pipeline; a large one is scanned in
    // pieces afterwards, so that no single command holds Redis for long
    // during a sale (the witness check still vouches for the whole read).
    let registered = registry::registered(conn, prefix, &vouchers).await?;
    let items: Vec<(&VoucherKeys, &Witness)> = keys.iter().zip(&before).collect();
    let replies = pipeline_per_item(conn, &items, false, false, |pipe, (k, w)| {
        queue_gate_reads(pipe, k, w);
        Ok(())
    })
    .await?;
    let mut snaps = Vec::with_capacity(keys.len());
    for ((chunk, w), (k, voucher)) in replies
        .into_iter()
        .zip(&before)
        .zip(keys.iter().zip(&gate_vouchers))
    {
        let row = decode_gate_row(*voucher, chunk)?;
        let registered = registered.contains(voucher);
        snaps.push(gate_snapshot(conn, k, w, row, registered).await?);
    }

    let (rows, orders) = read_mysql(db, &vouchers, settle_ms).await?;
    // The gate must not have moved during the MySQL reads either: then every
    // difference left is either drift or younger than the settle time.
    let looked = witness::read_many_with_digests(conn, &keys).await?;
    let (after, digests_after): (Vec<Witness>, Vec<GateDigests>) = looked.into_iter().unzip();
    mark_stable_digests(&mut snaps, digests, &digests_after);

    let index = GateIndex::new(gates);
    let known = apply_voucher_rows(&mut snaps, &index, rows);
    apply_orders(&mut snaps, &index, orders);
    // Buyers with no order in MySQL and none in flight: a lost admission,
    // or a commit MySQL lost. The kept acknowledged entries tell them apart
    // (read only when there are such buyers).
    for ((s, k), known) in snaps.iter_mut().zip(&keys).zip(&known) {
        if *known {
            find_lost_commits(conn, k, s).await?;
        }
    }
    // MySQL lost more than the kept entries show: whoever is left without
    // an order may be one of those.
    for s in &mut snaps {
        let pending: BTreeSet<u64> = s.pending.iter().map(|(o, _)| *o).collect();
        s.lost_cancellations = pending.intersection(&s.released).copied().collect();
        if s.commits_lost() > s.lost_commits.len() as u64 {
            s.unrestorable = s.buyers.difference(&s.holders()).copied().collect();
        }
    }
    Ok(snaps
        .into_iter()
        .enumerate()
        .map(|(i, s)| GateRead {
            moved: before[i] != after[i],
            snapshot: known[i].then(|| Box::new(s)),
        })
        .collect())
}

/// The replies [`queue_gate_sets`] asks for, one gate's first.
const GATE_SET_REPLIES: usize = 6;
/// The replies [`queue_gate_meta`] asks for, after those.
const GATE_META_REPLIES: usize = 7;

/// One gate's part of the pipeline, read back by [`decode_gate_row`].
fn queue_gate_reads(pipe: &mut Pipeline, k: &VoucherKeys, w: &Witness) {
    queue_gate_sets(pipe, k, w);
    queue_gate_meta(pipe, k);
}

/// [`GATE_SET_REPLIES`] commands, read back by [`decode_gate_sets`].
fn queue_gate_sets(pipe: &mut Pipeline, k: &VoucherKeys, w: &Witness) {
    pipe.exists(k.meta());
    for (key, len) in [(k.buyers(), w.buyers), (k.released(), w.released)] {
        if len > WHOLE {
            pipe.srandmember_multiple(key, 0);
        } else {
            pipe.smembers(key);
        }
    }
    pipe.zrange(k.timeouts(), 0, WHOLE as isize)
        .xlen(k.dead())
        .xlen(k.orders());
}

/// [`GATE_META_REPLIES`] commands, read back by [`decode_gate_meta`].
fn queue_gate_meta(pipe: &mut Pipeline, k: &VoucherKeys) {
    pipe.hget(k.meta(), META_USER_RATE)
        .hget(k.meta(), META_REQUIRE_TOKEN)
        .hget(k.meta(), META_PAUSED)
        .hget(k.meta(), META_PAUSE_TOKEN)
        .zcard(k.waitlist())
        .hget(k.meta(), META_PER_USER_LIMIT)
        .hget(k.meta(), META_WAITLIST_LIMIT);
}

/// One gate's replies to [`queue_gate_reads`].
struct GateRow {
    sets: GateSets,
    meta: GateMeta,
}

/// A gate's sets and streams as the pipeline sent them: a set larger than
/// [`WHOLE`] only in part (see [`complete_sets`]).
struct GateSets {
    meta_exists: bool,
    buyers: Vec<u64>,
    released: Vec<u64>,
    deadlines: Vec<u64>,
    dead_letters: u64,
    stream_len: u64,
}

/// A gate's policy, pause and waitlist, as its meta holds them.
struct GateMeta {
    user_rate: Option<u32>,
    require_token: Option<String>,
    paused: Option<String>,
    pause_token: Option<String>,
    waiting: u64,
    per_user_limit: Option<u32>,
    waitlist_limit: Option<String>,
}

fn decode_gate_row(voucher: u64, mut chunk: Vec<Value>) -> Result<GateRow> {
    if chunk.len() != GATE_SET_REPLIES + GATE_META_REPLIES {
        return Err(Error::redis(format!(
            "gate of voucher {voucher}: {} replies",
            chunk.len()
        )));
    }
    let meta = chunk.split_off(GATE_SET_REPLIES);
    Ok(GateRow {
        sets: decode_gate_sets(voucher, chunk)?,
        meta: decode_gate_meta(voucher, meta)?,
    })
}

fn decode_gate_sets(voucher: u64, replies: Vec<Value>) -> Result<GateSets> {
    type Replies = (bool, Vec<u64>, Vec<u64>, Vec<u64>, u64, u64);
    let (meta_exists, buyers, released, deadlines, dead_letters, stream_len): Replies =
        FromRedisValue::from_redis_value(Value::Array(replies))
            .map_err(|e| Error::redis(format!("gate of voucher {voucher}: {e}")))?;
    Ok(GateSets {
        meta_exists,
        buyers,
        released,
        deadlines,
        dead_letters,
        stream_len,
    })
}

fn decode_gate_meta(voucher: u64, replies: Vec<Value>) -> Result<GateMeta> {
    type Replies = (
        Option<u32>,
        Option<String>,
        Option<String>,
        Option<String>,
        u64,
        Option<u32>,
        Option<String>,
    );
    let (user_rate, require_token, paused, pause_token, waiting, per_user_limit, waitlist_limit): Replies =
        FromRedisValue::from_redis_value(Value::Array(replies))
            .map_err(|e| Error::redis(format!("policy of voucher {voucher}: {e}")))?;
    Ok(GateMeta {
        user_rate,
        require_token,
        paused,
        pause_token,
        waiting,
        per_user_limit,
        waitlist_limit,
    })
}

/// A gate's snapshot (its Redis side) from its replies and what they leave
/// to read: the orders in flight in its stream, and the sets too large to
/// come whole.
async fn gate_snapshot(
    conn: &mut impl RedisConn,
    k: &VoucherKeys,
    w: &Witness,
    row: GateRow,
    registered: bool,
) -> Result<Snapshot> {
    let GateRow { mut sets, meta } = row;
    let entries = if sets.stream_len > 0 {
        in_flight_orders(conn, k).await?
    } else {
        Vec::new()
    };
    let quantities: HashMap<u64, u64> = entries
        .iter()
        .filter(|(_, _, q)| *q != 1)
        .map(|(_, order, q)| (*order, *q))
        .collect();
    let in_flight: Vec<(u64, u64)> = entries.iter().map(|(u, o, _)| (*u, *o)).collect();
    complete_sets(conn, k, w, &mut sets).await?;
    Ok(Snapshot {
        voucher: k.voucher(),
        gate_loaded: sets.meta_exists && !w.stock.is_empty(),
        gate_paused: meta.paused.as_deref() == Some("1"),
        pause_token: meta.pause_token.unwrap_or_default(),
        waiting: meta.waiting,
        registered,
        gate_stock: w.stock.parse().ok(),
        buyers: sets.buyers.into_iter().collect(),
        released: sets.released.into_iter().collect(),
        deadlines: sets.deadlines.into_iter().collect(),
        in_flight,
        quantities,
        dead_letters: sets.dead_letters,
        witness: w.clone(),
        gate_policy: policy::from_meta(policy::MetaPolicy {
            user_rate: meta.user_rate,
            require_token: meta.require_token,
            per_user_limit: meta.per_user_limit,
            waitlist_limit: meta.waitlist_limit,
        }),
        ..Default::default()
    })
}

/// The sets the pipeline sent only in part, scanned in full.
async fn complete_sets(
    conn: &mut impl RedisConn,
    k: &VoucherKeys,
    w: &Witness,
    sets: &mut GateSets,
) -> Result<()> {
    if w.buyers > WHOLE {
        sets.buyers = scan_members(conn, "SSCAN", &k.buyers()).await?;
    }
    if w.released > WHOLE {
        sets.released = scan_members(conn, "SSCAN", &k.released()).await?;
    }
    if sets.deadlines.len() as u64 > WHOLE {
        sets.deadlines = scan_members(conn, "ZSCAN", &k.timeouts()).await?;
    }
    Ok(())
}

/// The vouchers' rows and all their orders.
async fn read_mysql(
    db: &Db,
    vouchers: &[u64],
    settle_ms: i64,
) -> Result<(HashMap<u64, VoucherRow>, Vec<OrderRow>)> {
    let list = join_ids(vouchers.iter().copied());
    // Where a test widens the gap between the two stores' reads.
    crate::support::fault::point("between_gate_and_mysql_reads").await?;
    let mut mysql = db.conn().await?;
    // One snapshot for both queries: a worker committing a batch between
    // them would otherwise show the stock from before and the orders from
    // after, a false "MySQL inconsistent" and a wrong expected gate stock.
    let mut tx = mysql
        .start_transaction(crate::store::db::snapshot_tx())
        .await?;
    let rows = voucher_rows::read(&mut tx, &list).await?;
    let orders: Vec<OrderRow> = tx
        .exec(
            format!(
                "SELECT voucher_id, id, user_id, status,
                        CAST(ROUND(UNIX_TIMESTAMP(create_time) * 1000) AS SIGNED),
                        COALESCE(cancel_time, create_time) > NOW(3) - INTERVAL ? MICROSECOND,
                        quantity, held
                   FROM seckill_order WHERE voucher_id IN ({list})"
            ),
            (settle_ms * 1000,),
        )
        .await?;
    tx.commit().await?;
    drop(mysql);
    Ok((rows, orders))
}

/// The gate digests read before the sets, and which of them the sets read
/// match (`after`: the digests read after MySQL).
fn mark_stable_digests(snaps: &mut [Snapshot], before: Vec<GateDigests>, after: &[GateDigests]) {
    for ((s, seen), again) in snaps.iter_mut().zip(before).zip(after) {
        // Stable: the field did not move, and the set read has the size
        // it had before and after (a member added and taken out again
        // during the read leaves the field as it was, but may be in it).
        s.digests_stable = [
            seen.buyers == again.buyers && s.buyers.len() as u64 == s.witness.buyers,
            seen.released == again.released && s.released.len() as u64 == s.witness.released,
            seen.timeouts == again.timeouts
                && seen.timeouts_len == again.timeouts_len
                && s.deadlines.len() as u64 == seen.timeouts_len,
        ];
        s.gate_digests = seen;
    }
}

/// Where each voucher's gates are among those read.
struct GateIndex<'a> {
    gates: &'a [GateSpec],
    of_voucher: HashMap<u64, Vec<usize>>,
}

impl<'a> GateIndex<'a> {
    fn new(gates: &'a [GateSpec]) -> Self {
        let mut of_voucher: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, g) in gates.iter().enumerate() {
            of_voucher.entry(g.keys.voucher()).or_default().push(i);
        }
        GateIndex { gates, of_voucher }
    }

    fn of_voucher(&self, v: u64) -> impl Iterator<Item = usize> + '_ {
        self.of_voucher.get(&v).into_iter().flatten().copied()
    }

    /// The gate holding a user's orders: the voucher's one, or the user's
    /// bucket among those read.
    fn holding(&self, v: u64, user: u64) -> Option<usize> {
        self.of_voucher(v).find(|&i| {
            let g = &self.gates[i];
            g.buckets <= 1 || crate::store::layout::bucket_of(user, g.buckets) == g.bucket
        })
    }
}

/// Each voucher row into the snapshots of its gates; which gates' vouchers
/// MySQL has.
fn apply_voucher_rows(
    snaps: &mut [Snapshot],
    index: &GateIndex,
    rows: HashMap<u64, VoucherRow>,
) -> Vec<bool> {
    let mut known = vec![false; index.gates.len()];
    for (v, row) in rows {
        for i in index.of_voucher(v) {
            known[i] = true;
            let s = &mut snaps[i];
            s.policy = row.policy;
            s.counters = row.counters;
            (
                s.total,
                s.mysql_stock,
                s.begin_ms,
                s.end_ms,
                s.pay_timeout_ms,
            ) = (
                row.total,
                row.stock,
                row.begin_ms,
                row.end_ms,
                row.pay_timeout_ms,
            );
        }
    }
    known
}

/// Each order into the snapshot of the gate holding it.
fn apply_orders(snaps: &mut [Snapshot], index: &GateIndex, orders: Vec<OrderRow>) {
    for (v, id, user, status, created, recent, quantity, held) in orders {
        let Some(i) = index.holding(v, user) else {
            continue;
        };
        let s = &mut snaps[i];
        s.recounted.count(id, user, status, quantity);
        s.order_ids.insert(id);
        // MySQL's quantity is the truth for a stored order (an in-flight
        // entry of it says the same).
        if quantity != 1 {
            s.quantities.insert(id, quantity);
        } else {
            s.quantities.remove(&id);
        }
        s.order_users.insert(user);
        if recent == 1 {
            s.settling.insert(id);
        }
        match OrderStatus::from_code(status) {
            Some(OrderStatus::Pending) => {
                s.pending.push((id, created));
                if held == 1 {
                    s.held.insert(id);
                }
            }
            Some(OrderStatus::Paid) => {
                s.paid += 1;
                s.paid_units += quantity;
            }
            _ => {
                s.cancelled.insert(id);
            }
        }
    }
}

/// The commits MySQL lost of a gate's buyers with no order anywhere (and,
/// if MySQL lost more, of other users), from the kept acknowledged entries.
async fn find_lost_commits(
    conn: &mut impl RedisConn,
    k: &VoucherKeys,
    s: &mut Snapshot,
) -> Result<()> {
    let orphans: BTreeSet<u64> = s.buyers.difference(&s.holders()).copied().collect();
    if orphans.is_empty() && s.commits_lost() == 0 {
        return Ok(());
    }
    let mut found = acknowledged_orders(conn, k, Wanted::Users(&orphans)).await?;
    found.retain(|m| !s.order_ids.contains(&m.order));
    let unexplained = s.commits_lost().saturating_sub(found.len() as u64);
    if unexplained > 0 {
        // Lost commits of users who are no longer buyers here either (a
        // preload or a rebuild after the loss): their entries may be
        // kept all the same.
        let mut known = s.order_users.clone();
        known.extend(&orphans);
        known.extend(s.in_flight.iter().map(|(user, _)| *user));
        let besides = Wanted::Besides(&known, unexplained as usize);
        found.extend(acknowledged_orders(conn, k, besides).await?);
    }
    let scheduled: Vec<u64> = found
        .iter()
        .map(|m| m.order)
        .filter(|o| s.deadlines.contains(o))
        .collect();
    let (now, scores) = deadlines_at_redis_time(conn, k, &scheduled).await?;
    for m in found {
        if s.order_ids.contains(&m.order) {
            continue;
        }
        let quantity = u64::from(m.quantity);
        if quantity != 1 {
            s.quantities.insert(m.order, quantity);
        }
        let state = lost_state(s, &m, now, scores.get(&m.order).copied());
        s.lost_commits.push(LostCommit {
            user: m.user,
            order: m.order,
            quantity,
            created_ms: m.created_ms,
            client_reference: m.client_reference,
            state,
        });
    }
    Ok(())
}

/// Redis's clock, the one authority for deadlines (`lua/claim_due.lua`
/// claims by it), and the scores of `orders`' deadlines, read together on
/// the gate's node. (0, none) when there are none to read.
async fn deadlines_at_redis_time(
    conn: &mut impl RedisConn,
    k: &VoucherKeys,
    orders: &[u64],
) -> Result<(i64, HashMap<u64, i64>)> {
    if orders.is_empty() {
        return Ok((0, HashMap::new()));
    }
    let (time, scores): ((i64, i64), Vec<Option<f64>>) = redis::pipe()
        .cmd("TIME")
        .cmd("ZMSCORE")
        .arg(k.timeouts())
        .arg(orders)
        .query_async(conn)
        .await?;
    let scores = orders
        .iter()
        .zip(scores)
        .filter_map(|(o, score)| Some((*o, score? as i64)))
        .collect();
    Ok((crate::support::timespec::redis_time_ms(time), scores))
}

/// Where a commit MySQL lost stands at the gate, at Redis's time `now`: a
/// deadline is past once its order's time is (the canceller's claim moves
/// its score later) or its score is (a deadline made due: the sweep's).
fn lost_state(s: &Snapshot, m: &OrderMessage, now: i64, score: Option<i64>) -> LostState {
    let past = m.created_ms + s.pay_timeout_ms <= now || score.is_some_and(|t| t <= now);
    if s.released.contains(&m.order) {
        LostState::Released
    } else if s.deadlines.contains(&m.order) && past {
        LostState::PastDeadline
    } else if s.deadlines.contains(&m.order) {
        LostState::AwaitingPayment
    } else {
        LostState::Unknown
    }
}

/// Every voucher worth checking: registered at the gate, or holding orders
/// in MySQL (a gate that lost its registry too must not go unchecked).
pub async fn candidates(db: &Db, conn: &mut impl RedisConn, prefix: &str) -> Result<Vec<u64>> {
    let mut ids: BTreeSet<u64> = registry::members(conn, prefix).await?.into_iter().collect();
    let mut mysql = db.conn().await?;
    let with_orders: Vec<u64> = mysql
        .query("SELECT DISTINCT voucher_id FROM seckill_order")
        .await?;
    ids.extend(with_orders);
    Ok(ids.into_iter().collect())
}
