//! Requeueing dead letters (`seckill pending --requeue`): what it means for
//! each reason a message was dead-lettered, keeping I1–I6.
//!
//! MySQL is asked first, per dead letter:
//! - not a well-formed order of this voucher (poison): stays a dead letter;
//! - its order is in MySQL already: stays (nothing left to do; say so);
//! - its user holds another order of the voucher (a second admission):
//!   stays — one order per user, it could only be refused again;
//! - its order id belongs to another order (ids collided): requeued under a
//!   fresh order id;
//! - otherwise (no stock in MySQL then, voucher not in MySQL then, ...):
//!   requeued under its own id.
//!
//! Then `lua/requeue.lua` keeps the gate's accounting: a requeued order
//! holds a unit at the gate — still held if its user is still a buyer, taken
//! again if the unit was given back meanwhile, and not requeued when none is
//! left.

use std::collections::HashMap;

use crate::store::redis_conn::Redis;
use mysql_async::prelude::*;
use redis::streams::StreamRangeReply;
use redis::AsyncCommands;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::store::config::Config;
use crate::store::db::{join_ids, Db};
use crate::store::keys::VoucherKeys;
use crate::store::layout::Layout;
use crate::store::node_lease::OrderIds;
use crate::store::scripts::REQUEUE;
use crate::stream::entry::{OrderMessage, RawEntry};
use crate::stream::pending::NO_STOCK;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RequeueReport {
    pub requeued: u64,
    pub skipped: u64,
    /// One line per dead letter looked at.
    pub entries: Vec<RequeuedEntry>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RequeuedEntry {
    /// The dead letter's id.
    pub id: String,
    /// `requeued`, `readmitted` (a unit taken at the gate again),
    /// `renumbered` (requeued under a fresh order id) or `skipped`.
    pub outcome: &'static str,
    /// The order id it was requeued under.
    pub order: Option<String>,
    /// Why it was skipped.
    pub reason: Option<String>,
}

/// What MySQL says a dead letter may become.
enum Plan {
    Requeue {
        order: u64,
        renumbered: bool,
        /// Its admission's unit was never backed by MySQL (no stock there):
        /// a unit must be taken at the gate whatever the buyers set says.
        unbacked: bool,
    },
    Skip(String),
}

/// Requeues the given dead letters of a voucher (all of them when `ids`
/// is empty), each into the stream of the bucket whose dead letters hold
/// it (the voucher's one stream unless it is split in buckets).
pub async fn requeue_buckets(
    cfg: &Config,
    db: &Db,
    conn: &mut Redis,
    layout: &Layout,
    ids: &[String],
) -> Result<RequeueReport> {
    let gates = layout.all_keys()?;
    if gates.len() == 1 {
        return requeue(cfg, db, conn, &gates[0], ids, None).await;
    }
    let mut total = RequeueReport {
        requeued: 0,
        skipped: 0,
        entries: Vec::new(),
    };
    let mut merge = |r: RequeueReport| {
        total.requeued += r.requeued;
        total.skipped += r.skipped;
        total.entries.extend(r.entries);
    };
    if ids.is_empty() {
        for keys in &gates {
            merge(requeue(cfg, db, conn, keys, &[], None).await?);
        }
        return Ok(total);
    }
    let mut left: Vec<String> = ids.to_vec();
    for keys in &gates {
        let mut here = Vec::new();
        for id in &left {
            let found: StreamRangeReply = conn.xrange(keys.dead(), id, id).await?;
            if !found.ids.is_empty() {
                here.push(id.clone());
            }
        }
        if !here.is_empty() {
            left.retain(|id| !here.contains(id));
            merge(requeue(cfg, db, conn, keys, &here, None).await?);
        }
    }
    // Found in no bucket: reported as such, as for a voucher of one gate.
    if !left.is_empty() {
        merge(requeue(cfg, db, conn, &gates[0], &left, None).await?);
    }
    Ok(total)
}

/// Requeues the given dead letters of `keys`' voucher (all of them when
/// `ids` is empty).
pub async fn requeue(
    cfg: &Config,
    db: &Db,
    conn: &mut Redis,
    keys: &VoucherKeys,
    ids: &[String],
    node_id: Option<u16>,
) -> Result<RequeueReport> {
    let letters = read_dead_letters(conn, keys, ids).await?;
    let reasons: HashMap<String, String> = letters
        .iter()
        .filter_map(|(id, raw)| Some((id.clone(), raw.as_ref()?.field("reason")?.to_string())))
        .collect();
    let parsed: Vec<(String, std::result::Result<OrderMessage, String>)> = letters
        .into_iter()
        .map(|(id, raw)| {
            let msg = raw.ok_or_else(|| "no such dead letter".to_string());
            (id, msg.and_then(|r| r.parse(keys.voucher())))
        })
        .collect();
    let valid: Vec<&OrderMessage> = parsed.iter().filter_map(|(_, m)| m.as_ref().ok()).collect();
    let (by_id, by_user) = stored(db, keys.voucher(), &valid).await?;
    let collides = valid.iter().any(|m| {
        by_id
            .get(&m.order)
            .is_some_and(|&(user, v)| (user, v) != (m.user, m.voucher))
    });
    let fresh = match collides {
        true => Some(OrderIds::lease(cfg, node_id).await?),
        false => None,
    };
    let mut plans = Vec::with_capacity(parsed.len());
    for (id, msg) in &parsed {
        let plan = match msg {
            Err(reason) => Plan::Skip(format!("not a well-formed order of this voucher: {reason}")),
            Ok(m) => match (by_user.get(&m.user), by_id.get(&m.order)) {
                (Some(&stored), _) if stored == m.order => {
                    Plan::Skip(format!("order {} is in MySQL already", m.order))
                }
                (Some(&other), _) => Plan::Skip(format!(
                    "user {} already holds order {other} of this voucher",
                    m.user
                )),
                (None, Some(_)) => match &fresh {
                    Some(ids) => Plan::Requeue {
                        order: ids.next_id()?,
                        renumbered: true,
                        unbacked: false,
                    },
                    None => Plan::Skip("no fresh order id could be minted".into()),
                },
                (None, None) => Plan::Requeue {
                    order: m.order,
                    renumbered: false,
                    unbacked: reasons.get(id).is_some_and(|r| r == NO_STOCK),
                },
            },
        };
        plans.push((id.clone(), plan));
    }
    if let Some(ids) = &fresh {
        ids.release().await;
    }
    apply(conn, keys, plans).await
}

/// Runs the gate's part (lua/requeue.lua) and reports every dead letter.
async fn apply(
    conn: &mut Redis,
    keys: &VoucherKeys,
    plans: Vec<(String, Plan)>,
) -> Result<RequeueReport> {
    let mut report = RequeueReport {
        requeued: 0,
        skipped: 0,
        entries: Vec::with_capacity(plans.len()),
    };
    let mut to_gate: Vec<(String, u64, bool, bool)> = Vec::new();
    for (id, plan) in plans {
        match plan {
            Plan::Skip(reason) => report.entries.push(skipped(id, reason)),
            Plan::Requeue {
                order,
                renumbered,
                unbacked,
            } => to_gate.push((id, order, renumbered, unbacked)),
        }
    }
    for chunk in to_gate.chunks(500) {
        let mut inv = REQUEUE.prepare_invoke();
        inv.key(keys.dead())
            .key(keys.orders())
            .key(keys.stock())
            .key(keys.buyers())
            .key(keys.waitlist())
            .key(keys.requeued())
            .key(keys.waitlist_quantity())
            .key(keys.meta());
        for (id, order, _, unbacked) in chunk {
            inv.arg(id).arg(*order).arg(u8::from(*unbacked));
        }
        let codes: Vec<i64> = inv.invoke_async(conn).await?;
        for ((id, order, renumbered, _), code) in chunk.iter().zip(codes) {
            let outcome = match code {
                1 if *renumbered => "renumbered",
                1 => "requeued",
                2 => "readmitted",
                0 => {
                    report.entries.push(skipped(
                        id.clone(),
                        "its user holds no unit at the gate and none is left".into(),
                    ));
                    continue;
                }
                -1 => {
                    report
                        .entries
                        .push(skipped(id.clone(), "no such dead letter".into()));
                    continue;
                }
                _ => {
                    report.entries.push(skipped(
                        id.clone(),
                        "not a well-formed order of this voucher".into(),
                    ));
                    continue;
                }
            };
            report.entries.push(RequeuedEntry {
                id: id.clone(),
                outcome,
                order: Some(order.to_string()),
                reason: None,
            });
        }
    }
    report.requeued = report
        .entries
        .iter()
        .filter(|e| e.outcome != "skipped")
        .count() as u64;
    report.skipped = report.entries.len() as u64 - report.requeued;
    Ok(report)
}

fn skipped(id: String, reason: String) -> RequeuedEntry {
    RequeuedEntry {
        id,
        outcome: "skipped",
        order: None,
        reason: Some(reason),
    }
}

/// (dead-letter id, its entry when it exists), in the order asked for.
async fn read_dead_letters(
    conn: &mut Redis,
    keys: &VoucherKeys,
    ids: &[String],
) -> Result<Vec<(String, Option<RawEntry>)>> {
    if ids.is_empty() {
        let all: StreamRangeReply = conn.xrange_all(keys.dead()).await?;
        return Ok(all
            .ids
            .iter()
            .map(|e| {
                let raw = RawEntry::from_map(&e.id, &e.map);
                (e.id.clone(), Some(as_order_entry(raw)))
            })
            .collect());
    }
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let one: StreamRangeReply = conn.xrange(keys.dead(), id, id).await?;
        let raw = one.ids.first().map(|e| RawEntry::from_map(&e.id, &e.map));
        out.push((id.clone(), raw.map(as_order_entry)));
    }
    Ok(out)
}

/// A dead letter carries the message's fields beside its own (`entry`,
/// `reason`, `deliveries`): parse it as the message it was, under the id it
/// had in the order stream (that id's time is the order's creation time).
fn as_order_entry(raw: RawEntry) -> RawEntry {
    let entry_id = raw.field("entry").unwrap_or(&raw.entry_id).to_string();
    RawEntry { entry_id, ..raw }
}

type Stored = (HashMap<u64, (u64, u64)>, HashMap<u64, u64>);

/// MySQL's orders under the dead letters' order ids (→ user, voucher), and
/// of their users on this voucher (user → order id).
async fn stored(db: &Db, voucher: u64, msgs: &[&OrderMessage]) -> Result<Stored> {
    if msgs.is_empty() {
        return Ok(Default::default());
    }
    let ids = join_ids(msgs.iter().map(|m| m.order));
    let users = join_ids(msgs.iter().map(|m| m.user));
    let mut conn = db.conn().await?;
    let rows: Vec<(u64, u64, u64)> = conn
        .query(format!(
            "SELECT id, user_id, voucher_id FROM seckill_order WHERE id IN ({ids})
             UNION
             SELECT id, user_id, voucher_id FROM seckill_order
              WHERE voucher_id = {voucher} AND user_id IN ({users})"
        ))
        .await
        .map_err(Error::from)?;
    let mut by_id = HashMap::new();
    let mut by_user = HashMap::new();
    for (id, user, v) in rows {
        if v == voucher {
            by_user.insert(user, id);
        }
        by_id.insert(id, (user, v));
    }
    Ok((by_id, by_user))
}
