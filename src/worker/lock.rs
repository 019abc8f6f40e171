//! Layer 3: per-(user, voucher) lease locks, taken, renewed and released for a
//! whole batch in one round trip each (the worker's keep-alive renews them
//! while the batch is being persisted).
//!
//! The lock keeps two workers from working on one user's order at once; it
//! is not what makes the order unique — the UNIQUE keys and the conditional
//! stock update in MySQL are the fence when a lease runs out under a paused
//! holder.

use std::time::Duration;

use crate::error::Result;
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

    /// Tries every key; returns one flag per key (true = now held by us).
    pub async fn acquire(&self, conn: &mut impl RedisConn, keys: &[String]) -> Result<Vec<bool>> {
        self.per_key(&LOCK_ACQUIRE, conn, keys).await
    }

    /// Extends the leases; returns one flag per key (false = lost).
    pub async fn renew(&self, conn: &mut impl RedisConn, keys: &[String]) -> Result<Vec<bool>> {
        self.per_key(&LOCK_RENEW, conn, keys).await
    }

    /// Runs a script taking (owner, lease) over `keys`, one flag back per key.
    async fn per_key(
        &self,
        script: &Script,
        conn: &mut impl RedisConn,
        keys: &[String],
    ) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        let flags: Vec<i64> = inv
            .arg(&self.token)
            .arg(self.lease_ms())
            .invoke_async(conn)
            .await?;
        Ok(flags.into_iter().map(|f| f == 1).collect())
    }

    /// Gives back one reentry of each key we hold.
    pub async fn release(&self, conn: &mut impl RedisConn, keys: &[String]) -> Result<usize> {
        if keys.is_empty() {
            return Ok(0);
        }
        let mut inv = LOCK_RELEASE.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        let released: usize = inv.arg(&self.token).invoke_async(conn).await?;
        Ok(released)
    }
}
