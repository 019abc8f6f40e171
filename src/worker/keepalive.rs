//! While a batch is in hand: renew its lock leases and keep its entries
//! claimed (XCLAIM JUSTID resets their idle time without counting a
//! delivery), so a slow commit or a store outage does not hand the batch to
//! another worker or push valid messages toward the dead-letter stream.

use std::sync::Arc;
use std::time::Duration;

use crate::store::redis_conn::Redis;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::WorkerStats;
use crate::store::keys::{VoucherKeys, WORKER_GROUP};
use crate::worker::lock::LockOwner;

/// The users whose locks are currently held for the batch; the batch sets
/// them after acquiring and clears them before releasing. A renewal holds the
/// mutex, so clearing waits for it and a released lock is never reported as
/// lost.
pub type HeldLocks = Arc<Mutex<Vec<u64>>>;

/// Stops the keep-alive when dropped.
pub struct KeepAlive {
    stop: CancellationToken,
    pub held: HeldLocks,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl KeepAlive {
    pub async fn set_held(&self, users: Vec<u64>) {
        *self.held.lock().await = users;
    }
}

pub fn start(
    conn: Redis,
    keys: VoucherKeys,
    consumer: String,
    entry_ids: Vec<String>,
    owner: LockOwner,
    period: Duration,
    stats: Arc<WorkerStats>,
) -> KeepAlive {
    let stop = CancellationToken::new();
    let held: HeldLocks = Arc::new(Mutex::new(Vec::new()));
    let (token, held_locks) = (stop.clone(), held.clone());
    let period = period.max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut conn = conn;
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            let touched: redis::RedisResult<redis::Value> = redis::cmd("XCLAIM")
                .arg(keys.orders())
                .arg(WORKER_GROUP)
                .arg(&consumer)
                .arg(0)
                .arg(&entry_ids)
                .arg("JUSTID")
                .query_async(&mut conn)
                .await;
            if let Err(e) = touched {
                tracing::warn!("keep-alive could not touch the batch's entries: {e}");
            }
            let mut locks = held_locks.lock().await;
            match owner.renew(&mut conn, &keys, &locks).await {
                Ok(renewed) => {
                    let lost = renewed.iter().filter(|ok| !**ok).count();
                    if lost > 0 {
                        tracing::warn!(
                            "lost {lost} lock lease(s) while persisting a batch; the MySQL keys fence duplicates"
                        );
                        stats.add_lock_lost(lost as u64);
                        // Report each loss once; keep renewing the rest.
                        let mut still = renewed.into_iter();
                        locks.retain(|_| still.next().unwrap_or(false));
                    }
                }
                Err(e) => tracing::warn!("keep-alive could not renew lock leases: {e}"),
            }
        }
    });
    KeepAlive { stop, held }
}
