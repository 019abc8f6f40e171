//! While a batch is in hand: renew its lock leases and keep its entries
//! claimed (XCLAIM JUSTID resets their idle time without counting a
//! delivery), so a slow commit or a store outage does not hand the batch to
//! another worker or push valid messages toward the dead-letter stream.
//!
//! It renews the lease of the batch's MySQL session too (worker/fence.rs),
//! so a batch that is slow to commit is never taken for a stopped one —
//! but only until the transaction's deadline (`--mysql-timeout`): renewal
//! proves progress, not life. Past it the keep-alive renews nothing at
//! all (locks, entries, fence, hold), so a batch whose transaction hangs
//! while its process lives (a stalled task or thread, a COMMIT's answer
//! that never comes) is taken over as a stopped worker's would be.
//!
//! The same XCLAIM says whether Redis still has the batch: it answers every
//! entry still pending with anyone (taking it back); until the batch is
//! committed, an entry it leaves out that is not in the stream either is
//! one Redis lost (a restart from older data, a failover
//! to a replica without it): no view of the stores counts the batch then,
//! so the keep-alive holds the gate (lua/pause.lua) — a rebuild may not
//! reopen it on such a view — until the batch is committed and the hold is
//! given back, or the hold's lease runs out (a worker that died or froze
//! holds nobody up for longer than its lock lease).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::config::Config;
use crate::store::redis_conn::{self, Redis};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::WorkerStats;
use crate::gate::pause;
use crate::store::keys::{VoucherKeys, WORKER_GROUP};
use crate::worker::fence::{entry_name, Fence};
use crate::worker::lock::LockOwner;

/// What the keep-alive knows of its batch.
#[derive(Debug)]
pub struct Standing {
    /// The users whose locks are currently held for the batch; the batch
    /// sets them after acquiring and clears them before releasing, so a
    /// released lock is never reported as lost.
    pub locks: Vec<u64>,
    /// Redis no longer has all of the batch's entries pending with us.
    pub lost: bool,
    /// We hold the gate (a hold renewed each tick while the batch is in hand).
    pub holding: bool,
    /// The batch is committed: entries acknowledged from now on are not lost.
    pub committed: bool,
    /// The last tick that found every entry, or renewed the hold.
    pub confirmed: Instant,
    /// The MySQL session of the batch's transaction while it runs, and
    /// the transaction's deadline: its fence entry is renewed (and entered
    /// again if Redis lost it) until then.
    pub transaction: Option<(u32, Instant)>,
    /// Said once that the transaction ran past its deadline.
    pub overdue_said: bool,
}

/// Stops the keep-alive when dropped.
pub struct KeepAlive {
    stop: CancellationToken,
    shared: Arc<Mutex<Shared>>,
}

/// A tick holds the mutex for its whole length, so what the batch changes
/// never crosses a tick halfway, and a connection one of them replaced
/// serves the other.
struct Shared {
    standing: Standing,
    ticker: Ticker,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What a keep-alive works with: the batch's entries, locks and gate.
pub struct Ticker {
    pub cfg: Arc<Config>,
    /// Its own once an error made it reconnect (the batch's connection is
    /// the lane's, which reconnects only between attempts).
    pub conn: Redis,
    pub keys: VoucherKeys,
    pub consumer: String,
    pub entry_ids: Vec<String>,
    pub owner: LockOwner,
    pub stats: Arc<WorkerStats>,
}

impl KeepAlive {
    pub async fn set_held(&self, users: Vec<u64>) {
        self.shared.lock().await.standing.locks = users;
    }

    /// The MySQL session now inside the batch's transaction and the
    /// transaction's deadline (None: none).
    pub async fn set_transaction(&self, t: Option<(u32, tokio::time::Instant)>) {
        self.shared.lock().await.standing.transaction = t.map(|(id, d)| (id, d.into_std()));
    }

    /// Makes sure the batch's standing was confirmed within `max_age` (a
    /// tick now if not: the process may have been frozen or starved past
    /// its ticks), so a batch Redis lost holds the gate before it commits.
    pub async fn confirm_within(&self, max_age: Duration) {
        let mut shared = self.shared.lock().await;
        let Shared { standing, ticker } = &mut *shared;
        if standing.confirmed.elapsed() > max_age {
            ticker.tick(standing).await;
        }
    }

    /// Whether Redis lost the batch, by a look now (the transaction is
    /// over: the look touches the entries again).
    pub async fn lost_now(&self) -> bool {
        let mut shared = self.shared.lock().await;
        let Shared { standing, ticker } = &mut *shared;
        standing.transaction = None;
        let asked = Instant::now();
        ticker.tick(standing).await;
        // A look that could not be made says nothing: taken for lost.
        standing.lost || standing.confirmed < asked
    }

    /// The batch is committed, `inserted` orders of it new (after a failed
    /// attempt, the orders found stored too: that attempt may have
    /// committed them unseen): from now on its entries go away by our own
    /// acknowledgement. If Redis had lost some, the gate may have been
    /// rebuilt (or never paused) on a view without them and may sell their
    /// units again: it is paused (again), and the gate guard rebuilds it
    /// with the orders now committed.
    pub async fn committed(&self, inserted: u64) {
        let mut shared = self.shared.lock().await;
        let Shared { standing, ticker } = &mut *shared;
        // A look now, while the batch still counts as uncommitted: Redis
        // may have lost its entries since the last tick (a restart between
        // that tick and this commit), and the guard may hold a view read
        // before the commit; only a loss seen here pauses the gate again,
        // which makes that view too old to reopen on (found by the checked
        // model, docs/src/concepts/checked-model.md).
        if inserted > 0 && !standing.lost {
            standing.transaction = None;
            let asked = Instant::now();
            ticker.tick(standing).await;
            // A look that could not be made says nothing: taken for lost,
            // as `lost_now` takes it. The guard's view may have been read
            // after the very restart that hid the batch, so its run id
            // tells nothing more; a needless pause costs a rebuild.
            if standing.confirmed < asked {
                standing.lost = true;
            }
        }
        standing.committed = true;
        if !standing.lost || inserted == 0 {
            return;
        }
        let why = format!(
            "committed {inserted} order(s) whose entries Redis had lost while the gate was open"
        );
        ticker.pause_gate(&why).await;
    }

    /// Stops the keep-alive and gives back the hold on the gate, if one was
    /// taken (the batch is committed: a rebuild now counts it).
    pub async fn finish(self) {
        self.stop.cancel();
        let mut shared = self.shared.lock().await;
        let Shared { standing, ticker } = &mut *shared;
        if !standing.holding {
            return;
        }
        let voucher = ticker.keys.voucher();
        let owner = ticker.owner.token.clone();
        let mut given = pause::unhold(&mut ticker.conn, &ticker.keys, &owner).await;
        if given.is_err() {
            ticker.reconnect().await;
            given = pause::unhold(&mut ticker.conn, &ticker.keys, &owner).await;
        }
        match given {
            Ok(()) => tracing::info!(
                "voucher {voucher}: batch committed; its hold on the gate is given back"
            ),
            Err(e) => tracing::warn!(
                "voucher {voucher}: could not give back the hold on the gate, it ends with its lease: {e}"
            ),
        }
    }
}

/// Ticks every `period` until the batch is finished (or dropped).
pub fn start(ticker: Ticker, period: Duration) -> KeepAlive {
    let stop = CancellationToken::new();
    let shared = Arc::new(Mutex::new(Shared {
        standing: Standing {
            locks: Vec::new(),
            lost: false,
            holding: false,
            committed: false,
            confirmed: Instant::now(),
            transaction: None,
            overdue_said: false,
        },
        ticker,
    }));
    let (token, looping) = (stop.clone(), shared.clone());
    let period = period.max(Duration::from_millis(10));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            let mut shared = looping.lock().await;
            if token.is_cancelled() {
                return;
            }
            let Shared { standing, ticker } = &mut *shared;
            ticker.tick(standing).await;
        }
    });
    KeepAlive { stop, shared }
}

impl Ticker {
    async fn touch(&mut self) -> redis::RedisResult<Vec<String>> {
        redis::cmd("XCLAIM")
            .arg(self.keys.orders())
            .arg(WORKER_GROUP)
            .arg(&self.consumer)
            .arg(0)
            .arg(&self.entry_ids)
            .arg("JUSTID")
            .query_async(&mut self.conn)
            .await
    }

    async fn tick(&mut self, standing: &mut Standing) {
        if standing
            .transaction
            .is_some_and(|(_, deadline)| Instant::now() >= deadline)
        {
            if !standing.overdue_said {
                standing.overdue_said = true;
                tracing::warn!(
                    "voucher {}: the batch's MySQL transaction is past its deadline (--mysql-timeout); its leases are no longer renewed",
                    self.keys.voucher()
                );
            }
            // But a batch Redis lost keeps the gate held: nobody else can
            // take it over, and its commit may yet land.
            self.hold_gate(standing).await;
            return;
        }
        let mut touched = self.touch().await;
        // A connection broken by a restart is the moment that matters:
        // look again at once on a fresh one, not a tick later.
        if touched.as_ref().is_err_and(|e| e.code() != Some("NOGROUP")) {
            self.reconnect().await;
            touched = self.touch().await;
        }
        // XCLAIM answers the entries pending with anyone (it takes them back
        // to us); one it leaves out was acknowledged by another worker, or
        // is gone from the stream. Only the second is lost: an entry still
        // in the stream is in every view of the stores (in flight, or its
        // order in MySQL).
        let missing: Vec<String> = match touched {
            Ok(ids) if ids.len() >= self.entry_ids.len() => Vec::new(),
            Ok(ids) => {
                let got: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
                self.entry_ids
                    .iter()
                    .filter(|id| !got.contains(id.as_str()))
                    .cloned()
                    .collect()
            }
            // The group itself is gone (an older copy of the stream).
            Err(e) if e.code() == Some("NOGROUP") => self.entry_ids.clone(),
            Err(e) => {
                // Say nothing of the batch's standing, and come back on a
                // fresh connection: a multiplexed one does not reconnect.
                tracing::warn!("keep-alive could not touch the batch's entries: {e}");
                self.reconnect().await;
                return;
            }
        };
        let all_there = if missing.is_empty() {
            true
        } else {
            match self.all_in_stream(&missing).await {
                Ok(there) => there,
                Err(e) => {
                    tracing::warn!("keep-alive could not look for the batch's entries: {e}");
                    self.reconnect().await;
                    return;
                }
            }
        };
        if !all_there && !standing.committed && !standing.lost {
            standing.lost = true;
            tracing::warn!(
                "voucher {}: Redis no longer has every entry of the batch in hand (it restarted from older data or failed over?); \
                 holding the gate paused until the batch is committed",
                self.keys.voucher()
            );
        }
        if standing.lost {
            self.hold_gate(standing).await;
        } else if all_there {
            standing.confirmed = Instant::now();
        }
        self.renew_locks(standing).await;
        if let Some((id, _)) = standing.transaction {
            let fence = Fence {
                keys: &self.keys,
                owner: &entry_name(&self.owner.token, id),
                lease: self.owner.lease,
            };
            if let Err(e) = fence.renew(&mut self.conn, Some(id)).await {
                tracing::warn!("keep-alive could not renew the MySQL session's fence lease: {e}");
            }
        }
    }

    /// Holds the gate for a batch Redis lost (and pauses it if it is open).
    async fn hold_gate(&mut self, standing: &mut Standing) {
        if !standing.lost {
            return;
        }
        let lease = self.owner.lease;
        match pause::hold(&mut self.conn, &self.keys, &self.owner.token, lease).await {
            Ok(paused) => {
                standing.holding = true;
                standing.confirmed = Instant::now();
                if !paused && !standing.committed {
                    self.pause_gate("the gate is open although Redis lost a batch in hand")
                        .await;
                }
            }
            Err(e) => tracing::warn!("keep-alive could not hold the gate: {e}"),
        }
    }

    /// Whether every one of `ids` is still in the order stream.
    async fn all_in_stream(&mut self, ids: &[String]) -> redis::RedisResult<bool> {
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("XRANGE")
                .arg(self.keys.orders())
                .arg(id.as_str())
                .arg(id.as_str())
                .arg("COUNT")
                .arg(1);
        }
        let found: Vec<Vec<redis::Value>> = pipe.query_async(&mut self.conn).await?;
        Ok(found.iter().all(|f| !f.is_empty()))
    }

    /// Pauses the gate, `why` a batch Redis lost makes it sell units again
    /// (once more on a fresh connection: the lane's may be the one broken).
    async fn pause_gate(&mut self, why: &str) {
        let voucher = self.keys.voucher();
        let grace = self.owner.lease;
        let mut paused = pause::pause(
            &mut self.conn,
            &self.keys,
            None,
            grace,
            pause::PauseReason::RedisLostWrites,
        )
        .await;
        if paused.is_err() {
            self.reconnect().await;
            paused = pause::pause(
                &mut self.conn,
                &self.keys,
                None,
                grace,
                pause::PauseReason::RedisLostWrites,
            )
            .await;
        }
        match paused {
            // Counted as the guard counts its own pauses: a failover seen
            // first here is a pause of the gate all the same.
            Ok(pause::Paused::Now) => {
                self.stats.add_gate_pause();
                tracing::warn!(
                    "voucher {voucher}: {why}; admission paused until the gate is checked against MySQL"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                "voucher {voucher}: {why}, but could not pause the gate (it may sell their units again: run `seckill reconcile`): {e}"
            ),
        }
    }

    async fn reconnect(&mut self) {
        if let Ok(c) = redis_conn::connect(&self.cfg).await {
            self.conn = c;
        }
    }

    async fn renew_locks(&mut self, standing: &mut Standing) {
        match self
            .owner
            .renew(&mut self.conn, &self.keys, &standing.locks)
            .await
        {
            Ok(renewed) => {
                let lost = renewed.iter().filter(|ok| !**ok).count();
                if lost > 0 {
                    tracing::warn!(
                        "lost {lost} lock lease(s) while persisting a batch; the MySQL keys fence duplicates"
                    );
                    self.stats.add_lock_lost(lost as u64);
                    // Report each loss once; keep renewing the rest.
                    let mut still = renewed.into_iter();
                    standing.locks.retain(|_| still.next().unwrap_or(false));
                }
            }
            Err(e) => tracing::warn!("keep-alive could not renew lock leases: {e}"),
        }
    }
}
