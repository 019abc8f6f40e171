//! serve's shared Redis connections, mended in the background.
//!
//! Requests share a few multiplexed connections opened at start. A
//! multiplexed connection to one server does not reconnect by itself: once
//! that server restarted (even cleanly, within a second), every request on
//! it failed "broken pipe" for good, `/readyz` said not ready, and nothing
//! brought serve back short of a restart by hand (issue 33). So a mender
//! PINGs each connection every `MEND_EVERY` and replaces one that does not
//! answer with a new connection as soon as the server takes one: a request
//! sees a restart for at most about `MEND_EVERY` plus a connect after the
//! server answers again. A cluster connection is left alone: the cluster
//! client reconnects to its nodes by itself, and a PING that lands on a
//! node in the middle of a failover must not rebuild it.
//!
//! The mender's own progress is what `/healthz` reports: it fails only when
//! no round has finished for twice the longest a round can take (a PING's
//! timeout, a connect's and a PING's again for the question after the
//! handshake, plus the pause between rounds: 18.5 s with the default
//! `--connect-timeout` of 5 s), so the mender is stuck or gone; never
//! because a store is down, so a liveness probe does not restart serve in a
//! loop during a Redis outage.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::store::config::Config;
use crate::store::redis_conn::{self, Redis, RedisConn};

/// How often every connection is PINGed.
pub const MEND_EVERY: Duration = Duration::from_millis(500);
/// A PING slower than this counts as no answer (a purchase connection's
/// PING may queue behind a WAIT of `--wait-timeout`, 500 ms by default).
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections shared by all requests, each replaced when it stops
/// answering.
pub struct SharedRedis {
    slots: Vec<RwLock<Redis>>,
    /// Per slot: the last replacement failed (said once per outage).
    down: Vec<AtomicBool>,
    next: AtomicUsize,
}

impl SharedRedis {
    /// None for no connections.
    pub fn new(connections: Vec<Redis>) -> Option<Self> {
        (!connections.is_empty()).then(|| SharedRedis {
            down: connections.iter().map(|_| AtomicBool::new(false)).collect(),
            slots: connections.into_iter().map(RwLock::new).collect(),
            next: AtomicUsize::new(0),
        })
    }

    /// One of the connections, in turn (a clone sends on the same socket).
    pub fn next(&self) -> Redis {
        // Never empty (new), so the index is in range.
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        // A poisoned lock still holds a usable connection.
        let slot = self.slots[i].read().unwrap_or_else(|e| e.into_inner());
        slot.clone()
    }

    /// PINGs every connection at once and replaces each that did not
    /// answer, if a new one can be made now.
    async fn mend(&self, cfg: &Config, what: &str) {
        let rounds = self.slots.iter().zip(&self.down).enumerate();
        let rounds = rounds.map(|(i, (slot, down))| async move {
            let mut conn = slot.read().unwrap_or_else(|e| e.into_inner()).clone();
            if conn.is_cluster() {
                return;
            }
            let ping = redis::cmd("PING");
            let answer = ping.query_async::<String>(&mut conn);
            if matches!(tokio::time::timeout(PING_TIMEOUT, answer).await, Ok(Ok(_))) {
                return;
            }
            // The whole connect is bounded (its INFO after the handshake
            // too), so a round is: a round is what `/healthz` watches.
            let fresh = tokio::time::timeout(connect_limit(cfg), redis_conn::connect(cfg)).await;
            match fresh {
                Ok(Ok(fresh)) => {
                    *slot.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                    down.store(false, Ordering::Relaxed);
                    tracing::warn!("serve: {what} Redis connection {i} did not answer; replaced");
                }
                Ok(Err(e)) if !down.swap(true, Ordering::Relaxed) => tracing::warn!(
                    "serve: {what} Redis connection {i} does not answer and a new one cannot be made yet ({e}); trying every {}",
                    humantime::format_duration(MEND_EVERY)
                ),
                Err(_) if !down.swap(true, Ordering::Relaxed) => tracing::warn!(
                    "serve: {what} Redis connection {i} does not answer and a new one timed out; trying every {}",
                    humantime::format_duration(MEND_EVERY)
                ),
                _ => {}
            }
        });
        futures_util::future::join_all(rounds).await;
    }
}

/// When the mender last finished a round, for `/healthz`.
pub struct Mending {
    start: Instant,
    last_ms: AtomicU64,
    /// No round finished for this long: the mender is stuck.
    pub stalled: Duration,
}

impl Mending {
    pub fn new(connect_timeout: Duration) -> Self {
        Mending {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            // Twice the longest round (pools are mended at once) and the
            // pause between two.
            stalled: 2 * (PING_TIMEOUT + connect_timeout + PING_TIMEOUT) + MEND_EVERY,
        }
    }

    fn round_done(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// How long since the last round finished (or since start).
    pub fn since_last_round(&self) -> Duration {
        let now = self.start.elapsed();
        now.saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Mends `pools` every `MEND_EVERY` until `stop`.
pub async fn mend_until(
    cfg: &Config,
    pools: &[(&SharedRedis, &str)],
    mending: &Mending,
    stop: CancellationToken,
) {
    loop {
        let round = async {
            // Where a test stalls the mender.
            crate::support::fault::pause("mend_round").await;
            let each = pools.iter().map(|(pool, what)| pool.mend(cfg, what));
            futures_util::future::join_all(each).await;
        };
        // A stop does not wait for a round a dead server holds up.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = round => {}
        }
        mending.round_done();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(MEND_EVERY) => {}
        }
    }
}

/// The longest a replacement's connect may take: the handshake's timeout,
/// and a PING's for the question that follows it (cluster or not).
fn connect_limit(cfg: &Config) -> Duration {
    cfg.connect_timeout + PING_TIMEOUT
}

/// A shared set of `n` connections, opened now.
pub async fn open(cfg: &Config, n: usize) -> Result<Vec<Redis>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(redis_conn::connect(cfg).await?);
    }
    Ok(out)
}
