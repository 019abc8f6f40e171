//! Connecting to Redis. Everything else in the library takes
//! `impl redis::aio::ConnectionLike`, so a cluster connection can be passed
//! wherever a single-node one is today: the key layout is already slot-safe.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::AsyncConnectionConfig;

use crate::error::{describe_redis, Error, Result};
use crate::store::config::Config;
use crate::support::mask::mask_url;

/// Any async Redis connection the library can work with: a single node's
/// multiplexed connection today, a cluster connection tomorrow.
pub trait RedisConn: ConnectionLike + Send + Sync {}
impl<T: ConnectionLike + Send + Sync> RedisConn for T {}

/// Redis 6.2 brought XAUTOCLAIM, which the worker needs.
pub const MIN_REDIS: (u32, u32) = (6, 2);

/// Replies slower than this fail the command (blocking reads get their own
/// connection with a longer timeout).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// One multiplexed connection: cheap to clone, pipelines concurrent requests.
pub async fn connect(cfg: &Config) -> Result<MultiplexedConnection> {
    connect_with_response_timeout(cfg, RESPONSE_TIMEOUT).await
}

/// A connection for blocking reads (XREADGROUP BLOCK): it is held for the
/// whole wait, so it must be its own, and its reply timeout must outlast the
/// block time (the driver's default would cut the wait short).
pub async fn connect_blocking(cfg: &Config, block: Duration) -> Result<MultiplexedConnection> {
    connect_with_response_timeout(cfg, block + RESPONSE_TIMEOUT).await
}

async fn connect_with_response_timeout(
    cfg: &Config,
    response_timeout: Duration,
) -> Result<MultiplexedConnection> {
    let url = mask_url(&cfg.redis_url);
    let fail = |reason: String| Error::RedisConnect {
        url: url.clone(),
        reason,
    };
    let client =
        redis::Client::open(cfg.redis_url.as_str()).map_err(|e| fail(describe_redis(&e)))?;
    let conn_cfg = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(cfg.connect_timeout))
        .set_response_timeout(Some(response_timeout));
    let attempt = client.get_multiplexed_async_connection_with_config(&conn_cfg);
    match tokio::time::timeout(cfg.connect_timeout, attempt).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(fail(describe_redis(&e))),
        Err(_) => Err(fail(format!(
            "no answer within {}",
            humantime::format_duration(cfg.connect_timeout)
        ))),
    }
}

/// The server's version, e.g. `7.0.15`.
pub async fn server_version(conn: &mut impl RedisConn) -> Result<String> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| Error::Redis("INFO server has no redis_version".into()))
}

/// Fails unless the server is at least [`MIN_REDIS`].
pub async fn check_version(conn: &mut impl RedisConn) -> Result<String> {
    let version = server_version(conn).await?;
    if parse_major_minor(&version) < MIN_REDIS {
        return Err(Error::ServerTooOld {
            server: "Redis",
            found: version,
            needed: "6.2",
        });
    }
    Ok(version)
}

/// A reply value as text (bulk and simple strings, integers), for replies
/// whose shape is known but whose element types vary.
pub fn value_text(v: &redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

/// `"10.11.19-MariaDB-0+deb12u1"` → `(10, 11)`; unparsable parts count as 0.
pub fn parse_major_minor(version: &str) -> (u32, u32) {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_major_then_minor() {
        assert_eq!(parse_major_minor("7.0.15"), (7, 0));
        assert_eq!(parse_major_minor("10.11.19-MariaDB-0+deb12u1"), (10, 11));
        assert!(parse_major_minor("6.0.9") < MIN_REDIS);
        assert!(parse_major_minor("6.2.0") >= MIN_REDIS);
        assert_eq!(parse_major_minor("garbage"), (0, 0));
    }
}
