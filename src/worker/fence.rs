//! Fencing a worker that stopped inside its MySQL transaction
//! (lua/fence.lua). Its transaction holds the voucher's row lock; nothing
//! on the MySQL side ends it while the session lives. So a transaction that
//! takes the row lock runs under a lease naming its MySQL connection, and a
//! worker whose (bounded) lock wait timed out ends the sessions whose lease
//! ran out. A worker that lost its lease then holds the others up for at
//! most its lease plus one lock wait.

use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::error::{mysql_code, mysql_codes, Result};
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

/// One transaction holder's entry: the lane's lock owner token.
pub struct Fence<'a> {
    pub keys: &'a VoucherKeys,
    pub owner: &'a str,
    pub lease: Duration,
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
/// out its lock and goes back to the pool).
pub async fn end_lapsed_from(
    conn: &mut impl RedisConn,
    db: &crate::store::db::Db,
    keys: &VoucherKeys,
) -> Result<usize> {
    let mut mysql = db.conn().await?;
    end_lapsed(conn, &mut mysql, keys).await
}

/// After a lock wait on the voucher's row timed out: ends the MySQL
/// sessions whose holders' leases ran out; how many. A session is ended only
/// if it is one of our own user's and has been idle since about its
/// lease's last renewal (a stopped client sends nothing), so an entry left
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
        let session: Option<(String, u64)> = mysql
            .exec_first(
                "SELECT COMMAND, TIME FROM information_schema.PROCESSLIST
                  WHERE ID = ? AND USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1)",
                (id,),
            )
            .await?;
        let gone = match session {
            None => true,
            // Idle since before its last renewal, give or take a second.
            Some((command, idle_s)) if command == "Sleep" && idle_s * 1000 + 1_500 >= since_ms => {
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
            // Busy, or used since: not (or no longer) the stopped holder.
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
