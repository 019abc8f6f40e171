//! Pausing a gate while it is rebuilt, and reopening it (lua/pause.lua).
//! A paused gate answers every attempt "paused" and writes nothing.

use redis::AsyncCommands;

use crate::error::Result;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use crate::store::scripts::PAUSE;

/// The meta field that pauses the gate (lua/seckill.lua reads it).
pub const META_PAUSED: &str = "paused";

/// Pauses the gate; false when it is not loaded (nothing to pause).
pub async fn pause(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<bool> {
    let done: i64 = PAUSE
        .key(keys.meta())
        .key(keys.buyers())
        .arg("pause")
        .invoke_async(conn)
        .await?;
    Ok(done == 1)
}

/// Reopens the gate if it has at least `orders` buyers (MySQL's order count
/// for the voucher, read just before): false when it stays paused.
pub async fn reopen(conn: &mut impl RedisConn, keys: &VoucherKeys, orders: u64) -> Result<bool> {
    let done: i64 = PAUSE
        .key(keys.meta())
        .key(keys.buyers())
        .arg("reopen")
        .arg(orders)
        .invoke_async(conn)
        .await?;
    Ok(done == 1)
}

/// Whether the gate is paused.
pub async fn is_paused(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<bool> {
    let v: Option<String> = conn.hget(keys.meta(), META_PAUSED).await?;
    Ok(v.as_deref() == Some("1"))
}
