//! Layer 3: per-(user, voucher) lease locks, taken, renewed and released for a
//! whole batch in one round trip each (the worker's keep-alive renews them
//! while the batch is being persisted). A voucher's locks are the fields of
//! one hash (lua/lib/lease.lua), so a batch costs a few commands, not a key
//! and two or three commands per user.
//!
//! The lock keeps two workers from working on one user's order at once; it
//! is not what makes the order unique — the UNIQUE keys and the conditional
//! stock update in MySQL are the fence when a lease runs out under a paused
//! holder.

use std::time::Duration;

use crate::error::Result;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use redis::Script;

use crate::store::scripts::{LOCK_ACQUIRE, LOCK_RELEASE, LOCK_RENEW};

/// Who holds a lock: one token per worker instance.
#[derive(Debug, Clone)]
pub struct LockOwner {
    pub token: String,
    pub lease: Duration,
}

impl LockOwner {
    fn lease_ms(&self) -> u64 {
        self.lease.as_millis().max(1) as u64
    }

    /// Tries the lock of every user; returns one flag per user (true = now
    /// held by us). A lock we held already is renewed, its count set to how
    /// often this call lists the user (so a resent call changes nothing).
    pub async fn acquire(
        &self,
        conn: &mut impl RedisConn,
        keys: &VoucherKeys,
        users: &[u64],
    ) -> Result<Vec<bool>> {
        self.per_user(&LOCK_ACQUIRE, conn, keys, users).await
    }

    /// Extends the leases; returns one flag per user (false = lost).
    pub async fn renew(
        &self,
        conn: &mut impl RedisConn,
        keys: &VoucherKeys,
        users: &[u64],
    ) -> Result<Vec<bool>> {
        self.per_user(&LOCK_RENEW, conn, keys, users).await
    }

    /// Runs a script taking (owner, lease, users...), one flag back per user.
    async fn per_user(
        &self,
        script: &Script,
        conn: &mut impl RedisConn,
        keys: &VoucherKeys,
        users: &[u64],
    ) -> Result<Vec<bool>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let flags: Vec<i64> = script
            .key(keys.locks())
            .arg(&self.token)
            .arg(self.lease_ms())
            .arg(users)
            .invoke_async(conn)
            .await?;
        Ok(flags.into_iter().map(|f| f == 1).collect())
    }

    /// Gives back one count of each user's lock we hold (a user listed
    /// twice, twice); returns how many were held.
    pub async fn release(
        &self,
        conn: &mut impl RedisConn,
        keys: &VoucherKeys,
        users: &[u64],
    ) -> Result<usize> {
        if users.is_empty() {
            return Ok(0);
        }
        let released: usize = LOCK_RELEASE
            .key(keys.locks())
            .arg(&self.token)
            .arg(users)
            .invoke_async(conn)
            .await?;
        Ok(released)
    }
}
