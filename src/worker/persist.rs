//! Layer 4: one MySQL transaction per batch of one voucher.
//!
//! Inside it: the stock is taken with one conditional `UPDATE ... WHERE
//! stock >= k` (k the batch's units: the sum of its orders' quantities) and
//! the new orders go in with one multi-row INSERT. When that fast path fails
//! (a duplicate key: a redelivery; or too little stock), the careful path
//! looks up what is stored, recognises redelivered orders, gives what stock
//! is left to whole orders in stream order (an order gets all its units or
//! none), and inserts those.
//! The UNIQUE keys are the fence: when a concurrent worker commits one of the
//! same orders first, the INSERT fails with a duplicate key, the transaction
//! rolls back whole, and the batch is classified again against what is now
//! committed.

use std::collections::HashMap;
use std::fmt::Write as _;

use mysql_async::prelude::*;
use mysql_async::{Conn, TxOpts};

use crate::error::{mysql_code, mysql_codes};
use crate::orders::counters::{Taking, ADD_TAKING};
use crate::orders::order::OrderStatus;
use crate::orders::voucher::{self, RowRead};
use crate::store::db::join_ids;
use crate::stream::entry::OrderMessage;

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Inserted by this transaction.
    Inserted,
    /// Already in MySQL under the same order id (a redelivery: the worker
    /// that inserted it died before acknowledging it); whether it still
    /// waits for payment (then its deadline is scheduled again, from
    /// this time), and the stored order's time (`create_time`, in ms): the
    /// time of the entry that inserted it, so this very entry's (its
    /// `created_ms`) unless another entry of the same order inserted it
    /// (a copy: a duplicate delivery, a requeue racing the insert), whose
    /// acknowledgement counts it.
    AlreadyStored { pending: bool, created_ms: i64 },
    /// The same order as an earlier message of this batch (its entry
    /// twice): the earlier one carries it.
    Repeated,
    /// No unit left in MySQL for it ([`NO_STOCK`](crate::stream::pending::NO_STOCK)): dead-lettered, unless
    /// MySQL lost cancellations whose units the gates gave back (then the
    /// unit backing it comes back to MySQL once the gate guard cancels
    /// them again, and it is kept for a retry: the checked model's finding
    /// M4).
    NoStock,
    /// Left pending for a retry: neither acknowledged nor dead-lettered.
    Kept,
    /// Refused for good; goes to the dead-letter stream with this reason.
    Dead(String),
}

#[derive(Debug)]
pub struct Persisted {
    /// One fate per message, in order.
    pub fates: Vec<Fate>,
    pub pay_timeout_ms: i64,
    /// MySQL's count of the voucher's cancelled orders, read under the
    /// row's lock by a transaction that found no stock for an order
    /// ([`Fate::NoStock`]); otherwise 0.
    pub cancelled: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("voucher {0} is not in MySQL")]
    UnknownVoucher(u64),
    #[error("MySQL: {}", crate::error::describe_mysql(.0))]
    Mysql(#[from] mysql_async::Error),
    #[error("{0}")]
    Store(#[from] crate::error::Error),
}

const CONFLICT_RETRIES: usize = 5;

/// Persists the messages of one voucher (all `msgs` share `voucher`).
/// On `conn`, whose session the caller has fenced (worker/fence.rs): a
/// lock wait that times out is returned at once, for the caller to end a
/// stopped holder's session before it tries again.
pub async fn persist(
    conn: &mut Conn,
    voucher: u64,
    msgs: &[OrderMessage],
) -> Result<Persisted, PersistError> {
    if msgs.is_empty() {
        return Ok(Persisted {
            fates: Vec::new(),
            pay_timeout_ms: 0,
            cancelled: 0,
        });
    }
    let conn = &mut *conn;
    // The normal case — new orders of distinct users, stock for all — needs
    // no lookup: the UNIQUE keys refuse anything else, and then the careful
    // path below classifies the batch against what is stored.
    if all_distinct(msgs) {
        match persist_fresh(conn, voucher, msgs).await {
            Ok(Some(p)) => return Ok(p),
            Ok(None) => {}
            // A duplicate, or a deadlock with a payment of a redelivered
            // order: the careful path classifies the batch again.
            Err(PersistError::Mysql(e))
                if matches!(
                    mysql_code(&e),
                    Some(mysql_codes::DUP_ENTRY | mysql_codes::LOCK_DEADLOCK)
                ) => {}
            Err(e) => return Err(e),
        }
    }
    let mut attempt = 0;
    loop {
        match persist_once(conn, voucher, msgs).await {
            Err(PersistError::Mysql(e))
                if attempt < CONFLICT_RETRIES
                    && matches!(
                        mysql_code(&e),
                        Some(
                            mysql_codes::DUP_ENTRY
                                | mysql_codes::LOCK_DEADLOCK
                                | mysql_codes::RECORD_CHANGED
                        )
                    ) =>
            {
                attempt += 1;
                tracing::debug!(
                    "voucher {voucher}: batch conflicted ({}), classifying again",
                    crate::error::describe_mysql(&e)
                );
            }
            other => return other,
        }
    }
}

fn all_distinct(msgs: &[OrderMessage]) -> bool {
    let mut users = std::collections::HashSet::with_capacity(msgs.len());
    let mut orders = std::collections::HashSet::with_capacity(msgs.len());
    msgs.iter()
        .all(|m| users.insert(m.user) && orders.insert(m.order))
}

/// Inserts every message as a new order, or nothing: `None` when MySQL has
/// not enough stock for all of them. A dropped transaction rolls back before
/// the connection's next statement.
async fn persist_fresh(
    conn: &mut Conn,
    voucher: u64,
    msgs: &[OrderMessage],
) -> Result<Option<Persisted>, PersistError> {
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    // The locking UPDATE comes first: with innodb_snapshot_isolation=ON
    // (MariaDB 11.6's default), updating a row another worker changed after
    // this transaction's first plain read fails with error 1020.
    if !take_exactly(&mut tx, voucher, &taking(msgs.iter())).await? {
        tx.rollback().await?;
        return Ok(None);
    }
    let pay_timeout_ms = lock_voucher(&mut tx, voucher).await?;
    insert_orders(&mut tx, voucher, msgs.iter()).await?;
    crate::support::fault::point("before_commit").await?;
    tx.commit().await?;
    Ok(Some(Persisted {
        fates: vec![Fate::Inserted; msgs.len()],
        pay_timeout_ms,
        cancelled: 0,
    }))
}

/// Locks the voucher's row for the rest of the transaction (a locking read
/// opens no read view), returning its payment timeout. On the slow path it
/// comes before any plain read, so the row cannot change between this
/// transaction's read view and its stock update (error 1020 under
/// innodb_snapshot_isolation); after the fast path's UPDATE it holds the
/// lock already.
async fn lock_voucher(
    tx: &mut mysql_async::Transaction<'_>,
    voucher: u64,
) -> Result<i64, PersistError> {
    voucher::pay_timeout_ms(tx, voucher, RowRead::Locking)
        .await?
        .ok_or(PersistError::UnknownVoucher(voucher))
}

struct Stored {
    user: u64,
    voucher: u64,
    status: i8,
    /// `create_time` in ms: the time of the stream entry that inserted it.
    created_ms: i64,
}

async fn persist_once(
    conn: &mut Conn,
    voucher: u64,
    msgs: &[OrderMessage],
) -> Result<Persisted, PersistError> {
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let pay_timeout_ms = lock_voucher(&mut tx, voucher).await?;

    let (by_id, by_user) = stored_orders(&mut tx, voucher, msgs).await?;
    let mut fates: Vec<Option<Fate>> = vec![None; msgs.len()];
    let mut fresh: Vec<usize> = Vec::new();
    // Users and order ids taken by earlier messages of this very batch.
    let mut batch_users: HashMap<u64, u64> = HashMap::new();
    let mut batch_orders: HashMap<u64, u64> = HashMap::new();
    for (i, m) in msgs.iter().enumerate() {
        let fate = if let Some(s) = by_id.get(&m.order) {
            if s.user == m.user && s.voucher == voucher {
                // Stored, and repeated in this batch: the first carries it
                // (and counts it into the witness, once).
                match batch_orders.insert(m.order, m.user) {
                    Some(_) => Some(Fate::Repeated),
                    None => Some(Fate::AlreadyStored {
                        pending: OrderStatus::from_code(s.status) == Some(OrderStatus::Pending),
                        created_ms: s.created_ms,
                    }),
                }
            } else {
                Some(Fate::Dead(format!(
                    "order id {} collides with the order of user {} for voucher {}",
                    m.order, s.user, s.voucher
                )))
            }
        } else if let Some(other) = by_user.get(&m.user) {
            Some(Fate::Dead(format!(
                "user {} already holds order {other} of voucher {voucher}",
                m.user
            )))
        } else if let Some(user) = batch_orders.get(&m.order) {
            if *user == m.user {
                // The same order twice in one batch: the first one carries it.
                Some(Fate::Repeated)
            } else {
                Some(Fate::Dead(format!(
                    "order id {} collides with the order of user {user} for voucher {voucher}",
                    m.order
                )))
            }
        } else if let Some(other) = batch_users.get(&m.user) {
            Some(Fate::Dead(format!(
                "user {} already holds order {other} of voucher {voucher}",
                m.user
            )))
        } else {
            batch_users.insert(m.user, m.order);
            batch_orders.insert(m.order, m.user);
            fresh.push(i);
            None
        };
        fates[i] = fate;
    }

    let wanting: Vec<&OrderMessage> = fresh.iter().map(|&i| &msgs[i]).collect();
    let served = take_stock(&mut tx, voucher, &wanting).await?;
    let (taken, short): (Vec<_>, Vec<_>) = fresh.iter().zip(&served).partition(|(_, s)| **s);
    // What the caller weighs against the gates' released units: read in
    // this transaction, whose row lock keeps it what the stock was.
    let cancelled = match short.is_empty() {
        true => 0,
        false => orders_cancelled(&mut tx, voucher).await?,
    };
    for (&i, _) in short {
        fates[i] = Some(Fate::NoStock);
    }
    if !taken.is_empty() {
        insert_orders(&mut tx, voucher, taken.iter().map(|(&i, _)| &msgs[i])).await?;
        for (&i, _) in taken {
            fates[i] = Some(Fate::Inserted);
        }
    }
    crate::support::fault::point("before_commit").await?;
    tx.commit().await?;
    Ok(Persisted {
        fates: fates
            .into_iter()
            .map(|f| f.unwrap_or(Fate::Dead("unclassified".into())))
            .collect(),
        pay_timeout_ms,
        cancelled,
    })
}

/// The voucher row's count of cancelled orders.
async fn orders_cancelled(
    tx: &mut mysql_async::Transaction<'_>,
    voucher: u64,
) -> Result<u64, PersistError> {
    let n: Option<u64> = tx
        .exec_first(
            "SELECT orders_cancelled FROM seckill_voucher WHERE voucher_id = ?",
            (voucher,),
        )
        .await?;
    n.ok_or(PersistError::UnknownVoucher(voucher))
}

type StoredMaps = (HashMap<u64, Stored>, HashMap<u64, u64>);

/// Orders already stored under one of the batch's order ids, or for one of
/// its users on this voucher. Ids are integers, so inlining them is safe and
/// spares a prepared statement per batch size.
async fn stored_orders(
    tx: &mut mysql_async::Transaction<'_>,
    voucher: u64,
    msgs: &[OrderMessage],
) -> Result<StoredMaps, mysql_async::Error> {
    let ids = join_ids(msgs.iter().map(|m| m.order));
    let users = join_ids(msgs.iter().map(|m| m.user));
    // The time as the insert wrote it (`sql_time_ms`; sessions are UTC).
    let columns = "id, user_id, voucher_id, status, \
                   CAST(ROUND(UNIX_TIMESTAMP(create_time) * 1000) AS SIGNED)";
    // NULL where MariaDB's UNIX_TIMESTAMP has no answer (before 1970-01-01
    // 00:00:01): a time no entry has, so no order counts as its own.
    let rows: Vec<(u64, u64, u64, i8, Option<i64>)> = tx
        .query(format!(
            "SELECT {columns} FROM seckill_order WHERE id IN ({ids})
             UNION ALL
             SELECT {columns} FROM seckill_order
              WHERE voucher_id = {voucher} AND user_id IN ({users})"
        ))
        .await?;
    let mut by_id = HashMap::new();
    let mut by_user = HashMap::new();
    for (id, user, v, status, created_ms) in rows {
        if v == voucher {
            by_user.insert(user, id);
        }
        by_id.insert(
            id,
            Stored {
                user,
                voucher: v,
                status,
                created_ms: created_ms.unwrap_or(i64::MIN),
            },
        );
    }
    Ok((by_id, by_user))
}

/// What the orders add to the voucher's counters.
fn taking<'a>(msgs: impl Iterator<Item = &'a OrderMessage>) -> Taking {
    let mut t = Taking::default();
    for m in msgs {
        t.add(m.order, m.user, u64::from(m.quantity));
    }
    t
}

/// Takes stock for these orders: all of them when there is enough, else
/// whole orders in turn while they fit (an order gets all its units or
/// none). Says which orders got theirs.
async fn take_stock(
    tx: &mut mysql_async::Transaction<'_>,
    voucher: u64,
    wanting: &[&OrderMessage],
) -> Result<Vec<bool>, mysql_async::Error> {
    let all = taking(wanting.iter().copied());
    if all.units == 0 {
        return Ok(vec![false; wanting.len()]);
    }
    if take_exactly(tx, voucher, &all).await? {
        return Ok(vec![true; wanting.len()]);
    }
    // Short: lock the row, then share out what is left.
    let left: i64 = tx
        .exec_first(
            "SELECT stock FROM seckill_voucher WHERE voucher_id = ? FOR UPDATE",
            (voucher,),
        )
        .await?
        .unwrap_or(0);
    let wanted: Vec<u64> = wanting.iter().map(|m| u64::from(m.quantity)).collect();
    let served = share_out(u64::try_from(left).unwrap_or(0), &wanted);
    let take = taking(
        wanting
            .iter()
            .zip(&served)
            .filter(|(_, s)| **s)
            .map(|(m, _)| *m),
    );
    if take.units > 0 && !take_exactly(tx, voucher, &take).await? {
        return Ok(vec![false; wanting.len()]);
    }
    Ok(served)
}

/// Which orders `left` units serve, in turn, each whole or not at all.
fn share_out(mut left: u64, wanted: &[u64]) -> Vec<bool> {
    wanted
        .iter()
        .map(|&w| {
            let fits = w <= left;
            if fits {
                left -= w;
            }
            fits
        })
        .collect()
}

/// The conditional decrement (docs/src/concepts/layers.md, L4): the units of `take` or none. It
/// reads the current row, so it is safe where a SELECT-then-UPDATE is not.
/// Its orders are counted in the same statement (their INSERT follows in
/// this transaction, or the whole of it rolls back).
async fn take_exactly(
    tx: &mut mysql_async::Transaction<'_>,
    voucher: u64,
    take: &Taking,
) -> Result<bool, mysql_async::Error> {
    tx.exec_drop(
        format!(
            "UPDATE seckill_voucher SET stock = stock - ?, {ADD_TAKING}
              WHERE voucher_id = ? AND stock >= ?"
        ),
        (
            take.units,
            take.orders,
            take.units,
            take.users.0,
            take.orders_digest.0,
            voucher,
            take.units,
        ),
    )
    .await?;
    Ok(tx.affected_rows() == 1)
}

async fn insert_orders<'a>(
    tx: &mut mysql_async::Transaction<'_>,
    voucher: u64,
    msgs: impl Iterator<Item = &'a OrderMessage>,
) -> Result<(), mysql_async::Error> {
    let mut sql = String::from(
        "INSERT INTO seckill_order (id, user_id, voucher_id, status, create_time, quantity, client_reference) VALUES ",
    );
    for (n, m) in msgs.enumerate() {
        if n > 0 {
            sql.push(',');
        }
        let _ = write!(
            sql,
            "({},{},{voucher},{},{},{},{})",
            m.order,
            m.user,
            OrderStatus::Pending.code(),
            crate::store::db::sql_time_ms(m.created_ms),
            m.quantity,
            crate::store::db::sql_text_or_null(m.client_reference.as_deref())
        );
    }
    tx.query_drop(sql).await
}

#[cfg(test)]
mod tests {
    use super::share_out;

    #[test]
    fn short_stock_goes_to_whole_orders_in_turn() {
        assert_eq!(share_out(5, &[2, 3]), [true, true]);
        assert_eq!(share_out(4, &[3, 3, 1]), [true, false, true]);
        assert_eq!(share_out(0, &[1]), [false]);
        assert_eq!(share_out(2, &[3]), [false], "never part of an order");
    }
}
