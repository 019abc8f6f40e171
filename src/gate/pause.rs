//! Pausing a gate while it is rebuilt, and reopening it (lua/pause.lua).
//! A paused gate answers every attempt "paused" and writes nothing.

use redis::AsyncCommands;

use crate::error::Result;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use crate::store::scripts::PAUSE;

/// The meta field that pauses the gate (lua/seckill.lua reads it).
pub const META_PAUSED: &str = "paused";

/// What pausing did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    Now,
    Already,
    /// Not paused: the gate has a buyer for every order given.
    NotNeeded,
    NotLoaded,
}

/// What reopening did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reopened {
    Now,
    WasOpen,
    /// Still paused: fewer buyers than orders.
    StaysPaused,
    NotLoaded,
}

/// Pauses the gate; with `orders` (MySQL's order count, read just before)
/// only if it has fewer buyers than that, checked in the same step.
pub async fn pause(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    orders: Option<u64>,
) -> Result<Paused> {
    let mut call = PAUSE.key(keys.meta());
    call.key(keys.buyers()).arg("pause");
    if let Some(n) = orders {
        call.arg(n);
    }
    let code: i64 = call.invoke_async(conn).await?;
    Ok(match code {
        1 => Paused::Now,
        2 => Paused::Already,
        0 => Paused::NotNeeded,
        _ => Paused::NotLoaded,
    })
}

/// Reopens the gate if it is paused and has at least `orders` buyers
/// (MySQL's order count for the voucher, read just before).
pub async fn reopen(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    orders: u64,
) -> Result<Reopened> {
    let code: i64 = PAUSE
        .key(keys.meta())
        .key(keys.buyers())
        .arg("reopen")
        .arg(orders)
        .invoke_async(conn)
        .await?;
    Ok(match code {
        1 => Reopened::Now,
        2 => Reopened::WasOpen,
        0 => Reopened::StaysPaused,
        _ => Reopened::NotLoaded,
    })
}

/// Whether the gate is paused.
pub async fn is_paused(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<bool> {
    let v: Option<String> = conn.hget(keys.meta(), META_PAUSED).await?;
    Ok(v.as_deref() == Some("1"))
}
