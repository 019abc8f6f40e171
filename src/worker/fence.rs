//! Fencing a worker that stopped inside its MySQL transaction
//! (lua/fence.lua). Its transaction holds the voucher's row lock; nothing
//! on the MySQL side ends it while the session lives. So a transaction that
//! takes the row lock runs under a lease naming its MySQL connection, and a
//! worker whose (bounded) lock wait timed out ends the sessions whose lease
//! ran out. A worker that lost its lease then holds the others up for at
//! most its lease plus one lock wait.
//!
//! A live worker is no better a holder than a stopped one when its
//! transaction makes no progress (a task or a runtime thread stalled, a
//! COMMIT whose answer never comes over a half-open connection). So every
//! fenced transaction has a deadline (`--mysql-timeout`): the lease is
//! renewed only until then, and past it the worker abandons the
//! transaction itself: its connection is thrown away (never back to the
//! pool) and its session ended, or, when MySQL cannot be reached to end it,
//! left in the fence, where its lapsed lease lets the next worker end it.

use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::Conn;
use tokio::time::Instant;

use crate::error::{mysql_code, mysql_codes, Error, Result};
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use crate::store::scripts::FENCE;

/// The lock wait a worker's MySQL session gets: long enough for a batch of
/// a live worker to commit (milliseconds, seconds when MySQL is slow),
/// short enough that a stopped holder is found soon after its lease ran
/// out. Half the lease, in whole seconds (InnoDB's unit), at least one.
pub fn lock_wait(lease: Duration) -> Duration {
    Duration::from_secs((lease.as_secs() / 2).max(1))
}

/// One transaction holder's entry, named by [`entry_name`].
pub struct Fence<'a> {
    pub keys: &'a VoucherKeys,
    pub owner: &'a str,
    pub lease: Duration,
}

/// The fence entry of one session: its worker's owner token and the
/// session's id, so that a session abandoned and not yet ended keeps its
/// entry while the same worker opens the next one.
pub fn entry_name(owner: &str, mysql_id: u32) -> String {
    format!("{owner}/{mysql_id}")
}

/// How long a connection that is thrown away gets to say goodbye.
const QUIT_WAIT: Duration = Duration::from_secs(1);

/// Runs `work`, one transaction that takes `keys`' voucher row lock, on a
/// session of `db` entered in the voucher's fence for `lease`, and
/// leaves the fence after. `work` (and the checkout before it) must end
/// within `limit`: past it the transaction is abandoned (see the module
/// comment) and the answer is [`Error::TransactionPastDeadline`].
/// `told.0` hears the session's id and deadline before `work` starts: the
/// batch's keep-alive renews the lease until then, never after; `told.1`
/// hears that the transaction is over before the entry goes (outside the
/// deadline: it may wait for a keep-alive tick), since a renewal enters a
/// gone entry again (lua/fence.lua). A lock wait
/// that timed out (`waited_out`) ends the sessions of holders whose lease
/// ran out, so the retry finds the row free of them.
///
/// An entry that could not be entered or left may stay, naming the
/// session: the session is then thrown away, not pooled, so that a worker
/// ending it later ends no one's work.
pub async fn run<T, E: From<Error>>(
    redis: &mut impl RedisConn,
    db: &Db,
    (keys, owner, lease): (&VoucherKeys, &str, Duration),
    limit: Duration,
    told: (impl AsyncFnOnce(u32, Instant), impl AsyncFnOnce()),
    work: impl AsyncFnOnce(&mut Conn) -> std::result::Result<T, E>,
    waited_out: impl Fn(&E) -> bool,
) -> std::result::Result<T, E> {
    let (entered, ended) = told;
    let deadline = Instant::now() + limit;
    let mut mysql = checkout(db, limit).await?;
    let id = mysql.id();
    let name = entry_name(owner, id);
    let fence = Fence {
        keys,
        owner: &name,
        lease,
    };
    if let Err(e) = fence.enter(redis, id).await {
        // Redis may have written it before the error.
        discard(mysql).await;
        return Err(e.into());
    }
    entered(id, deadline).await;
    let Ok(done) = tokio::time::timeout_at(deadline, work(&mut mysql)).await else {
        fence.abandon(redis, db, mysql, limit).await;
        return Err(Error::TransactionPastDeadline(limit).into());
    };
    ended().await;
    let left = fence.leave(redis).await;
    crate::support::fault::pause("after_fence_left").await;
    match left {
        Ok(()) => drop(mysql),
        Err(e) => {
            tracing::debug!(
                "voucher {}: fence entry of session {id} left to expire, the session thrown away: {e}",
                keys.voucher()
            );
            discard(mysql).await;
        }
    }
    if done.as_ref().is_err_and(&waited_out) {
        end_lapsed_from(redis, db, keys, limit).await?;
    }
    done
}

/// Throws a connection away: it never goes back to the pool, where its
/// next user would read the answers this one never got. COM_QUIT is sent
/// if the socket takes it; a silent peer's is given up after a second
/// (the connection is marked closed first, so the pool drops it then too).
pub async fn discard(mysql: Conn) {
    let _ = tokio::time::timeout(QUIT_WAIT, mysql.disconnect()).await;
}

impl Fence<'_> {
    fn lease_ms(&self) -> u64 {
        self.lease.as_millis().max(1) as u64
    }

    /// Enters `mysql_id` (the session about to take the row lock).
    pub async fn enter(&self, conn: &mut impl RedisConn, mysql_id: u32) -> Result<()> {
        let _: i64 = FENCE
            .key(self.keys.fence())
            .arg("enter")
            .arg(self.owner)
            .arg(self.lease_ms())
            .arg(mysql_id)
            .invoke_async(conn)
            .await?;
        Ok(())
    }

    /// Extends the lease; enters `mysql_id` again if the entry is gone
    /// (Redis lost it), so a holder that stops later is still found.
    pub async fn renew(&self, conn: &mut impl RedisConn, mysql_id: Option<u32>) -> Result<()> {
        let mut call = FENCE.key(self.keys.fence());
        call.arg("renew").arg(self.owner).arg(self.lease_ms());
        if let Some(id) = mysql_id {
            call.arg(id);
        }
        let _: i64 = call.invoke_async(conn).await?;
        Ok(())
    }

    /// The transaction ended; an entry that could not be removed lapses
    /// with its lease (only logged).
    pub async fn leave_quietly(&self, conn: &mut impl RedisConn) {
        if let Err(e) = self.leave(conn).await {
            tracing::debug!(
                "voucher {}: fence entry left to expire: {e}",
                self.keys.voucher()
            );
        }
    }

    /// A transaction past its deadline: its connection is thrown away and
    /// its session ended from a fresh one. When that cannot be done (MySQL
    /// out of reach), the entry is left as it is: it is no longer renewed,
    /// and a worker whose lock wait times out ends the session after it
    /// lapsed.
    async fn abandon(&self, redis: &mut impl RedisConn, db: &Db, mysql: Conn, limit: Duration) {
        let (voucher, id) = (self.keys.voucher(), mysql.id());
        discard(mysql).await;
        match end_session(db, id, limit).await {
            Ok(()) => {
                self.leave_quietly(redis).await;
                tracing::warn!(
                    "voucher {voucher}: abandoned a MySQL transaction that did not end within {} (--mysql-timeout): its connection thrown away, its session {id} ended",
                    humantime::format_duration(limit)
                );
            }
            Err(e) => {
                // Renewed once more, to lapse at once: its lease's last
                // renewal is then later than anything the session did, so
                // the next worker whose lock wait times out finds it
                // unused since and ends it (renewals stopped at the
                // deadline, possibly before the session's last statement).
                let lapsing = Fence {
                    lease: Duration::from_millis(1),
                    ..*self
                };
                if let Err(r) = lapsing.renew(redis, Some(id)).await {
                    tracing::debug!(
                        "voucher {voucher}: fence entry of session {id} not renewed: {r}"
                    );
                }
                tracing::warn!(
                    "voucher {voucher}: abandoned a MySQL transaction that did not end within {} (--mysql-timeout), but could not end its session {id} ({e}): \
                     its fence lease has run out, and the next worker whose lock wait times out ends it",
                    humantime::format_duration(limit)
                )
            }
        }
    }

    /// The transaction ended (committed or rolled back).
    pub async fn leave(&self, conn: &mut impl RedisConn) -> Result<()> {
        let _: i64 = FENCE
            .key(self.keys.fence())
            .arg("leave")
            .arg(self.owner)
            .invoke_async(conn)
            .await?;
        Ok(())
    }
}

/// [`end_lapsed`] on a session of its own from `db` (the caller's waited
/// out its lock and goes back to the pool), within `limit`.
pub async fn end_lapsed_from(
    conn: &mut impl RedisConn,
    db: &Db,
    keys: &VoucherKeys,
    limit: Duration,
) -> Result<usize> {
    on_fresh_session(
        db,
        limit,
        "ending the sessions of stopped holders",
        async |mysql| end_lapsed(conn, mysql, keys).await,
    )
    .await
}

/// A session from `db` within `limit`.
async fn checkout(db: &Db, limit: Duration) -> Result<Conn> {
    tokio::time::timeout(limit, db.conn())
        .await
        .map_err(|_| Error::Timeout {
            what: "MySQL (a connection)".into(),
            after: limit,
        })?
}

/// `work` on a session of its own from `db`, checkout and work each within
/// `limit`; a session whose work timed out is thrown away (`what`: what the
/// timeout says it was doing).
async fn on_fresh_session<T>(
    db: &Db,
    limit: Duration,
    what: &str,
    work: impl AsyncFnOnce(&mut Conn) -> Result<T>,
) -> Result<T> {
    let mut mysql = checkout(db, limit).await?;
    match tokio::time::timeout(limit, work(&mut mysql)).await {
        Ok(done) => done,
        Err(_) => {
            discard(mysql).await;
            Err(Error::Timeout {
                what: format!("MySQL ({what})"),
                after: limit,
            })
        }
    }
}

/// Ends session `id` of our own MySQL user (one this worker abandoned),
/// from a fresh session, within `limit`; Ok once it is gone.
async fn end_session(db: &Db, id: u32, limit: Duration) -> Result<()> {
    on_fresh_session(db, limit, "ending an abandoned session", async |mysql| {
        if session(mysql, u64::from(id)).await?.is_none() {
            return Ok(());
        }
        match mysql.query_drop(format!("KILL {id}")).await {
            Err(e) if mysql_code(&e) != Some(mysql_codes::NO_SUCH_THREAD) => Err(Error::from(e)),
            _ => Ok(()),
        }
    })
    .await
}

/// Session `id` if it is one of our own user's: what it does (COMMAND)
/// and for how long, in seconds (TIME).
async fn session(mysql: &mut Conn, id: u64) -> Result<Option<(String, u64)>> {
    Ok(mysql
        .exec_first(
            "SELECT COMMAND, TIME FROM information_schema.PROCESSLIST
              WHERE ID = ? AND USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)",
            (id,),
        )
        .await?)
}

/// After a lock wait on the voucher's row timed out: ends the MySQL
/// sessions whose holders' leases ran out; how many. A session is ended only
/// if it is one of our own user's and has been in its current state (idle,
/// or stuck in a statement) since about its lease's last renewal (a
/// stopped client sends nothing), so an entry left
/// behind (a lost `leave`, a Redis restored from older data) that names a
/// connection in use since, or an id met again on another server, is left
/// alone. An entry is forgotten only once its session is gone.
pub async fn end_lapsed(
    conn: &mut impl RedisConn,
    mysql: &mut Conn,
    keys: &VoucherKeys,
) -> Result<usize> {
    let flat: Vec<String> = FENCE
        .key(keys.fence())
        .arg("expired")
        .invoke_async(conn)
        .await?;
    let mut ended = 0;
    for entry in flat.chunks_exact(3) {
        let (owner, id, since) = (&entry[0], &entry[1], &entry[2]);
        let (Ok(id), Ok(since_ms)) = (id.parse::<u64>(), since.parse::<u64>()) else {
            continue;
        };
        let gone = match session(mysql, id).await? {
            None => true,
            // In its current state (idle, or inside a statement that does
            // not end: a COMMIT whose client went silent) since before its
            // lease's last renewal, give or take a second. A live holder
            // renews until its deadline, so a lapsed lease is one given up.
            Some((_, for_s)) if for_s * 1000 + 1_500 >= since_ms => {
                match mysql.query_drop(format!("KILL {id}")).await {
                    Ok(()) => {
                        ended += 1;
                        tracing::warn!(
                            "voucher {}: ended MySQL session {id}: its worker stopped inside a transaction holding the voucher's row (its lease ran out)",
                            keys.voucher()
                        );
                        true
                    }
                    Err(e) if mysql_code(&e) == Some(mysql_codes::NO_SUCH_THREAD) => true,
                    Err(e) => {
                        tracing::warn!(
                            "voucher {}: could not end MySQL session {id} of a stopped worker (it holds the voucher's row): {}",
                            keys.voucher(),
                            crate::error::describe_mysql(&e)
                        );
                        false
                    }
                }
            }
            // In a state newer than its lease's last renewal: used since,
            // so not (or no longer) the holder that gave it up.
            Some(_) => false,
        };
        if gone {
            let _: i64 = FENCE
                .key(keys.fence())
                .arg("forget")
                .arg(owner)
                .arg(id)
                .invoke_async(conn)
                .await?;
        }
    }
    Ok(ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_wait_is_half_the_lease_in_whole_seconds() {
        assert_eq!(lock_wait(Duration::from_secs(10)), Duration::from_secs(5));
        assert_eq!(lock_wait(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(lock_wait(Duration::from_millis(30)), Duration::from_secs(1));
    }
}
