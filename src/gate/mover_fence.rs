//! The gate guard's hold on a voucher's mover while it rebuilds one of its
//! buckets (design/buckets.md §5): the rebuild counts every unit of the
//! voucher across masters (the pool, each bucket, transfers in transit),
//! and only a mover that cannot move keeps that count from shifting under
//! it. The guard seizes the mover lease whoever holds it, then raises every
//! bucket's epoch to the lease's, so a take or give of the mover it
//! displaced is refused at every gate (lua/mover_lease.lua); the lease goes
//! back once the rebuild is done, and runs out if the guard dies.

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::store::keys::VoucherKeys;
use crate::store::scripts::MOVER_LEASE;

/// Seizes the mover lease of the voucher whose buckets' keys are `gates`
/// (bucket 0's first) for `owner`, for `lease`, and fences every loaded
/// bucket; the epoch it holds.
pub async fn seize(
    conn: &mut impl ConnectionLike,
    gates: &[VoucherKeys],
    owner: &str,
    lease: Duration,
) -> Result<u64> {
    let Some(first) = gates.first() else {
        return Ok(0);
    };
    let epoch: u64 = MOVER_LEASE
        .key(first.meta())
        .arg("seize")
        .arg(owner)
        .arg(lease.as_millis().max(1) as u64)
        .invoke_async(conn)
        .await?;
    for keys in gates {
        let _: u64 = MOVER_LEASE
            .key(keys.meta())
            .arg("fence")
            .arg(owner)
            .arg(epoch)
            .invoke_async(conn)
            .await?;
    }
    Ok(epoch)
}

/// Gives the lease back (a mover takes it over at a higher epoch).
pub async fn release(
    conn: &mut impl ConnectionLike,
    bucket0: &VoucherKeys,
    owner: &str,
) -> Result<()> {
    let _: i64 = MOVER_LEASE
        .key(bucket0.meta())
        .arg("release")
        .arg(owner)
        .invoke_async(conn)
        .await?;
    Ok(())
}
