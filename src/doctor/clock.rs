//! Three clocks take part in a sale: Redis's (the sale window, payment
//! deadlines), this host's (order ids, whose time the node leases keep
//! rising) and MySQL's (order and payment times). Each server's clock is
//! read between two readings of this host's, so the skew is known within
//! half the round trip.

use std::time::{SystemTime, UNIX_EPOCH};

use mysql_async::prelude::*;

use super::redis_nodes::{self, Shape};
use super::{Check, Role};
use crate::store::config::Config;
use crate::store::db::Db;
use crate::store::redis_conn::{self, Redis};
use crate::support::mask::redact;

/// Up to this much skew is noise on a host with NTP.
const OK_MS: i64 = 500;
/// Past this, deadlines and windows visibly move against what users see.
const FAIL_MS: i64 = 5_000;

fn host_now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// A server's clock against this host's: the skew and its uncertainty.
struct Skew {
    server: String,
    skew_ms: i64,
    within_ms: i64,
}

fn skew(server: String, before_us: i64, server_us: i64, after_us: i64) -> Skew {
    let middle = before_us + (after_us - before_us) / 2;
    Skew {
        server,
        skew_ms: (server_us - middle) / 1000,
        within_ms: (after_us - before_us + 1999) / 2000,
    }
}

/// On the connections the store checks made (`None`: that store was not
/// reached, which its own row already says).
pub async fn checks(
    cfg: &Config,
    role: Option<Role>,
    redis: Option<&mut (Redis, Shape)>,
    db: Option<&Db>,
) -> Vec<Check> {
    let mut skews = Vec::new();
    let mut unread = Vec::new();
    // The schema role's Redis user may not run TIME, and `seckill init`
    // uses no clock of Redis's.
    if role != Some(Role::Schema) {
        match redis {
            Some((conn, shape)) => match redis_skews(conn, shape).await {
                Ok(s) => skews.extend(s),
                Err(e) => unread.push(format!("Redis: {}", redact(&e, &cfg.secrets()))),
            },
            None => unread.push("Redis (not reached)".to_string()),
        }
    }
    match db {
        Some(db) => match mysql_skew(db).await {
            Ok(s) => skews.push(s),
            Err(e) => unread.push(format!("MySQL: {}", redact(&e, &cfg.secrets()))),
        },
        None => unread.push("MySQL (not reached)".to_string()),
    }
    let worst = skews.iter().map(|s| s.skew_ms.abs()).max().unwrap_or(0);
    let mut found: Vec<String> = skews
        .iter()
        .map(|s| format!("{} {:+} ms (±{} ms)", s.server, s.skew_ms, s.within_ms))
        .collect();
    found.extend(unread.iter().map(|u| format!("not read: {u}")));
    let found = format!("against this host: {}", found.join(", "));
    let check = if worst > FAIL_MS {
        Check::fail("clock skew", found)
    } else if worst > OK_MS || !unread.is_empty() {
        Check::warn("clock skew", found)
    } else {
        Check::ok("clock skew", found)
    };
    vec![check
        .why(format!("Redis's clock opens and closes the sale and runs the payment deadlines, this host's stamps order ids, MySQL's the order times: a skew moves a deadline against the time an order shows, and a host behind Redis waits out the difference before minting ids after a restart (ok up to {OK_MS} ms, fail past {FAIL_MS} ms)"))
        .fix("run NTP (chrony, systemd-timesyncd) on every host")]
}

async fn redis_skews(conn: &mut Redis, shape: &Shape) -> Result<Vec<Skew>, String> {
    let mut out = Vec::new();
    for node in shape.nodes.iter().filter(|n| n.replica_of.is_none()) {
        let before = host_now_us();
        let reply = redis_nodes::ask(conn, node, &redis::cmd("TIME")).await?;
        let after = host_now_us();
        let parts: Vec<i64> = match reply {
            redis::Value::Array(a) => a
                .iter()
                .filter_map(|v| redis_conn::value_text(v).parse().ok())
                .collect(),
            _ => Vec::new(),
        };
        let [secs, micros] = parts[..] else {
            return Err("TIME gave no seconds and microseconds".into());
        };
        let label = if matches!(conn, Redis::Cluster(_)) {
            format!("Redis {}", node.addr)
        } else {
            "Redis".to_string()
        };
        let server_us = secs
            .checked_mul(1_000_000)
            .and_then(|s| s.checked_add(micros))
            .ok_or("TIME gave a time out of range")?;
        out.push(skew(label, before, server_us, after));
    }
    Ok(out)
}

async fn mysql_skew(db: &Db) -> Result<Skew, String> {
    let mut conn = db.conn().await.map_err(|e| e.to_string())?;
    let before = host_now_us();
    // Microseconds since the epoch, in the session's UTC.
    let server: Option<i64> = conn
        .query_first("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)")
        .await
        .map_err(|e| crate::error::describe_mysql(&e))?;
    let after = host_now_us();
    drop(conn);
    let server = server.ok_or("NOW(6) gave nothing")?;
    Ok(skew("MySQL".into(), before, server, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_skew_is_taken_from_the_middle_of_the_round_trip() {
        let s = skew("x".into(), 1_000_000, 3_000_000, 1_004_000);
        assert_eq!(s.skew_ms, 1_998);
        assert_eq!(s.within_ms, 2);
    }
}
