//! Pausing a gate while it is rebuilt, reopening it, and the holds that keep
//! it paused (lua/pause.lua). A paused gate answers every attempt "paused"
//! and writes nothing.

use std::time::Duration;

use redis::AsyncCommands;

use crate::error::Result;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use crate::store::scripts::PAUSE;

/// The meta field that pauses the gate (lua/seckill.lua reads it).
pub const META_PAUSED: &str = "paused";
/// The meta field naming the latest pause (a reopen checks it).
pub const META_PAUSE_TOKEN: &str = "pause_token";

/// The meta field saying why the gate is paused ([`PauseReason`]).
pub const META_PAUSED_REASON: &str = "paused_reason";

/// Why a gate is paused, as meta's `paused_reason` and `status` say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseReason {
    /// Redis may have lost writes MySQL holds (a restart, a failover).
    RedisLostWrites,
    /// MySQL has fewer orders than its workers committed (a failover to an
    /// asynchronous replica, a backup restored).
    MysqlLostCommits,
}

impl PauseReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            PauseReason::RedisLostWrites => "redis_lost_writes",
            PauseReason::MysqlLostCommits => "mysql_lost_commits",
        }
    }
}

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
    /// Still paused: its grace runs, or a worker holds it (a batch in hand
    /// that Redis lost, not in any view of the stores until it commits).
    Held,
    /// Still paused: paused again since the caller's view was read.
    PausedSince,
    NotLoaded,
}

/// pause.lua with all three keys, for `action`.
fn call(keys: &VoucherKeys, action: &str) -> redis::ScriptInvocation<'static> {
    let mut call = PAUSE.key(keys.meta());
    call.key(keys.buyers()).key(keys.holds()).arg(action);
    call
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// Pauses the gate; with `orders` (MySQL's order count, read just before)
/// only if it has fewer buyers than that, checked in the same step. No
/// reopen succeeds within `grace`: the time workers take to notice that
/// Redis lost the batch they hold, and to hold the gate.
pub async fn pause(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    orders: Option<u64>,
    grace: Duration,
    reason: PauseReason,
) -> Result<Paused> {
    let mut call = call(keys, "pause");
    match orders {
        Some(n) => call.arg(n),
        None => call.arg(""),
    };
    call.arg(ms(grace)).arg(reason.as_str());
    let code: i64 = call.invoke_async(conn).await?;
    Ok(match code {
        1 => Paused::Now,
        2 => Paused::Already,
        0 => Paused::NotNeeded,
        _ => Paused::NotLoaded,
    })
}

/// Reopens the gate if it is paused, has at least `orders` buyers (MySQL's
/// order count for the voucher, read just before), its grace ran out, no
/// worker holds it and, with `seen` (the pause token the caller's view was
/// read with), no pause came since that view.
pub async fn reopen(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    orders: u64,
    seen: Option<&str>,
) -> Result<Reopened> {
    let mut call = call(keys, "reopen");
    call.arg(orders);
    if let Some(token) = seen {
        call.arg(token);
    }
    let code: i64 = call.invoke_async(conn).await?;
    Ok(match code {
        1 => Reopened::Now,
        2 => Reopened::WasOpen,
        0 => Reopened::StaysPaused,
        3 => Reopened::Held,
        4 => Reopened::PausedSince,
        _ => Reopened::NotLoaded,
    })
}

/// Holds the gate paused for `lease` on behalf of `owner` (renewed by
/// calling again); true when the gate is paused, false when it is open or
/// not loaded.
pub async fn hold(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    owner: &str,
    lease: Duration,
) -> Result<bool> {
    let code: i64 = call(keys, "hold")
        .arg(owner)
        .arg(ms(lease).max(1))
        .invoke_async(conn)
        .await?;
    Ok(code == 1)
}

/// Gives back `owner`'s hold.
pub async fn unhold(conn: &mut impl RedisConn, keys: &VoucherKeys, owner: &str) -> Result<()> {
    let _: i64 = call(keys, "unhold").arg(owner).invoke_async(conn).await?;
    Ok(())
}

/// Whether a worker holds the gate (loaded or not: a rebuild of a gate
/// Redis lost whole waits for the holds too).
pub async fn is_held(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<bool> {
    let code: i64 = call(keys, "held").invoke_async(conn).await?;
    Ok(code == 1)
}

/// Whether the gate is paused.
pub async fn is_paused(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<bool> {
    let v: Option<String> = conn.hget(keys.meta(), META_PAUSED).await?;
    Ok(v.as_deref() == Some("1"))
}
