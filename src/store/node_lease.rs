//! Order ids unique across processes and hosts with no set-up: every
//! process that mints order ids leases a snowflake node id from Redis
//! (`lua/node_lease.lua`), renews the lease while it lives, and mints only
//! while the lease is surely its own. The lease also hands out a floor for
//! the id time, so a new holder whose clock is behind a former holder's
//! never repeats one of its ids.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::redis_conn::Redis;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::store::config::{validate_prefix, Config};
use crate::store::keys;
use crate::store::redis_conn;
use crate::store::scripts::NODE_LEASE;
use crate::support::snowflake::{Position, Snowflake, MAX_NODE_ID};

/// How long a lease lives unless renewed; renewed every third of it.
pub const LEASE_TTL: Duration = Duration::from_secs(30);

/// A leased node id and the generator that mints with it.
pub struct OrderIds {
    cfg: Config,
    /// Replaced after an error: a multiplexed connection does not reconnect
    /// by itself, and a lease that cannot be renewed stops all minting.
    conn: Mutex<Redis>,
    prefix: String,
    token: String,
    /// Names the lease's connection (`CLIENT LIST`): `seckill-lease-<hex>`.
    random: u64,
    /// The node id the operator asked for (`--node-id`), if any: then only
    /// that one is ever claimed.
    wanted: Option<u16>,
    held: Mutex<Held>,
}

struct Held {
    node: u16,
    ids: Snowflake,
    /// Minting stops here unless a renewal moved it: the lease may be gone
    /// in Redis by then. None: the lease was lost.
    valid_until: Option<Instant>,
    /// What the last claim or renewal recorded as this node's floor (as
    /// lua/node_lease.lua computes it): no id is minted at or past it, so a
    /// wall clock that jumps ahead cannot mint ids a next holder's floor
    /// does not cover.
    horizon_ms: u64,
}

impl OrderIds {
    /// Leases `wanted`, or the first free node id from a random start.
    pub async fn lease(cfg: &Config, wanted: Option<u16>) -> Result<Arc<OrderIds>> {
        let prefix = cfg.prefix.as_str();
        validate_prefix(prefix)?;
        let random = crate::support::host::random_tag();
        let conn = lease_connection(cfg, random).await?;
        let host = crate::support::host::name();
        let mut me = OrderIds {
            cfg: cfg.clone(),
            conn: Mutex::new(conn),
            prefix: prefix.to_string(),
            token: format!("{host}:{}:{random:016x}", std::process::id()),
            random,
            wanted,
            held: Mutex::new(Held {
                node: 0,
                ids: Snowflake::new(0)?,
                valid_until: None,
                horizon_ms: 0,
            }),
        };
        let held = me.claim_any(random, Position::default()).await?;
        me.held = Mutex::new(held);
        Ok(Arc::new(me))
    }

    /// The name of its connection in `CLIENT LIST`.
    pub fn connection_name(&self) -> String {
        connection_name(self.random)
    }

    /// The node id in use.
    pub fn node(&self) -> u16 {
        self.lock().node
    }

    /// Whether ids can be minted now (the lease is surely held).
    pub fn holds_lease(&self) -> bool {
        let held = self.lock();
        held.valid_until.is_some_and(|t| Instant::now() < t)
    }

    /// A fresh order id; an error once the lease may have been lost (a
    /// renewal failing for a whole lease), never a possibly duplicate id.
    pub fn next_id(&self) -> Result<u64> {
        let held = self.lock();
        let valid = held.valid_until.is_some_and(|t| Instant::now() < t);
        if valid && held.ids.time_ms() < held.horizon_ms {
            return Ok(held.ids.next_id());
        }
        Err(Error::NodeId(format!(
            "the lease of node id {} could not be renewed in time; no order id minted",
            held.node
        )))
    }

    /// Extends the lease; if it was lost, claims a node id again (the same
    /// one when it is free or was asked for, else any) and goes on minting
    /// after its own last id even if Redis lost the floor with the lease.
    pub async fn renew(&self) -> Result<()> {
        let (node, now_ms) = {
            let held = self.lock();
            (held.node, held.ids.time_ms())
        };
        let sent = Instant::now();
        let floor = self.call("renew", node, now_ms).await?;
        if floor >= 0 {
            let mut held = self.lock();
            held.valid_until = Some(sent + usable(LEASE_TTL));
            held.horizon_ms = held.horizon_ms.max(now_ms + ttl_ms());
            return Ok(());
        }
        tracing::warn!("the lease of node id {node} was lost; claiming one again");
        // Read where the generator stands only once minting has stopped, so
        // no id is made after it and before the new generator takes over.
        let after = {
            let mut held = self.lock();
            held.valid_until = None;
            held.ids.position()
        };
        let held = self.claim_any(u64::from(node), after).await?;
        *self.lock() = held;
        Ok(())
    }

    /// Gives the node id back (at exit), so it is free at once.
    pub async fn release(&self) {
        let (node, now_ms) = {
            let mut held = self.lock();
            held.valid_until = None;
            (held.node, held.ids.time_ms())
        };
        if let Err(e) = self.call("release", node, now_ms).await {
            tracing::debug!("could not release node id {node} (it expires by itself): {e}");
        }
    }

    /// Renews the lease every third of its life (every second after a
    /// failure) until `stop`, then releases it.
    pub fn keep_alive(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut wait = LEASE_TTL / 3;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = match me.renew().await {
                    Ok(()) => LEASE_TTL / 3,
                    Err(e) => {
                        tracing::warn!("node id lease: {e}; retrying in 1s");
                        Duration::from_secs(1)
                    }
                };
            }
            me.release().await;
        })
    }

    /// Claims `wanted`, or else tries every node id from `start` on; the
    /// generator mints after the floor and after `after`, this process's
    /// own last id.
    async fn claim_any(&self, start: u64, after: Position) -> Result<Held> {
        let span = u64::from(MAX_NODE_ID) + 1;
        let candidates: Vec<u16> = match self.wanted {
            Some(n) => vec![n],
            None => (0..span).map(|i| ((start + i) % span) as u16).collect(),
        };
        let clock = Snowflake::new(0)?;
        for node in candidates {
            let sent = Instant::now();
            // Ids this process borrowed from future milliseconds count as
            // used: the floor recorded for the next holder must cover them.
            let now_ms = clock.time_ms().max(after.time_ms());
            let floor = self.call("claim", node, now_ms).await?;
            if floor >= 0 {
                return Ok(Held {
                    node,
                    ids: Snowflake::resuming(node, floor as u64, after)?,
                    valid_until: Some(sent + usable(LEASE_TTL)),
                    horizon_ms: (floor as u64).max(now_ms) + ttl_ms(),
                });
            }
        }
        Err(Error::NodeId(match self.wanted {
            Some(n) => format!(
                "node id {n} is leased by another live process (seckill or an application server): \
                 choose another --node-id, or leave it unset to lease a free one"
            ),
            None => format!("all {span} node ids are leased by live processes"),
        }))
    }

    async fn call(&self, op: &str, node: u16, now_ms: u64) -> Result<i64> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let reply = NODE_LEASE
            .key(keys::node_lease(&self.prefix, node))
            .key(keys::node_clock(&self.prefix))
            .arg(op)
            .arg(&self.token)
            .arg(ttl_ms())
            .arg(node)
            .arg(now_ms)
            .invoke_async(&mut conn)
            .await;
        match reply {
            Ok(floor) => Ok(floor),
            Err(e) => {
                // The next call goes through a fresh connection.
                if let Ok(fresh) = lease_connection(&self.cfg, self.random).await {
                    *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
                }
                Err(e.into())
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // A panic while holding it cannot leave Held half-written.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The name of the lease's own connection in `CLIENT LIST`.
pub fn connection_name(random: u64) -> String {
    format!("seckill-lease-{random:016x}")
}

/// A connection of the lease's own, named so an operator can tell it apart.
async fn lease_connection(cfg: &Config, random: u64) -> Result<Redis> {
    let mut conn = redis_conn::connect(cfg).await?;
    // Only a label: on a cluster it goes to every node, and one node that
    // cannot be reached must not stop order ids from being leased.
    let named: redis::RedisResult<()> = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(connection_name(random))
        .query_async(&mut conn)
        .await;
    if let Err(e) = named {
        tracing::debug!("could not name the node lease's connection: {e}");
    }
    Ok(conn)
}

fn ttl_ms() -> u64 {
    LEASE_TTL.as_millis() as u64
}

/// The part of a lease this process may mint in: its own timer started
/// before Redis's, and a margin covers clock-rate differences and pauses.
fn usable(ttl: Duration) -> Duration {
    ttl * 9 / 10
}
