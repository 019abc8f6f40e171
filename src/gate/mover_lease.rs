//! The mover's lease on a voucher split in buckets (lua/mover_lease.lua),
//! every call of it: the mover takes it (one mover at a time, its epoch
//! rising with each new holder) and gives it back; and a hold on the mover
//! while the gate guard rebuilds one of its
//! buckets, or reconcile checks them (design/buckets.md §5): both count
//! every unit of the voucher across masters (the pool, each bucket,
//! transfers in transit), and only a mover that cannot move keeps that
//! count from shifting under them. A hold (one holder at a time) keeps any
//! mover from taking or renewing the lease, and raises every bucket's epoch
//! far above the lease's, so a take or give of a mover under an older epoch
//! is refused at every gate (lua/mover_lease.lua). It is given back once
//! the count is done, and runs out if its holder dies.

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::store::keys::VoucherKeys;
use crate::store::scripts::MOVER_LEASE;

/// One call of lua/mover_lease.lua: `mode` by `owner` on the gate whose
/// meta is `meta`, with the holds key where the mode needs it; the
/// caller adds the mode's own arguments.
fn call(
    meta: &VoucherKeys,
    holds: bool,
    mode: &str,
    owner: &str,
) -> redis::ScriptInvocation<'static> {
    let mut inv = MOVER_LEASE.key(meta.meta());
    if holds {
        inv.key(meta.mover_holds());
    }
    inv.arg(mode).arg(owner);
    inv
}

/// Holds still the mover of the voucher whose buckets' keys are `gates`
/// (bucket 0's first), as `owner`, for `lease`, and fences every loaded
/// bucket: the epoch of the fence, or None while another holds it still
/// (one count of the voucher's units at a time: try again later).
pub async fn seize(
    conn: &mut impl ConnectionLike,
    gates: &[VoucherKeys],
    owner: &str,
    lease: Duration,
) -> Result<Option<u64>> {
    let Some(first) = gates.first() else {
        return Ok(None);
    };
    let Some(epoch) = hold_still(conn, first, owner, lease).await? else {
        return Ok(None);
    };
    for keys in gates {
        if let Err(e) = fence(conn, keys, owner, epoch).await {
            // Half fenced is no hold: the mover may move again.
            unseize(conn, first, owner).await.ok();
            return Err(e);
        }
    }
    Ok(Some(epoch))
}

/// The seize's first step (lua/mover_lease.lua seize): the hold, and
/// bucket 0's epoch raised far; None while another holds the mover still.
pub async fn hold_still(
    conn: &mut impl ConnectionLike,
    bucket0: &VoucherKeys,
    owner: &str,
    lease: Duration,
) -> Result<Option<u64>> {
    let epoch: u64 = call(bucket0, true, "seize", owner)
        .arg(lease.as_millis().max(1) as u64)
        .invoke_async(conn)
        .await?;
    Ok((epoch > 0).then_some(epoch))
}

/// The seize's step for each bucket (lua/mover_lease.lua fence): its
/// epoch raised to `epoch`; the gate's epoch now (0: not loaded).
pub async fn fence(
    conn: &mut impl ConnectionLike,
    keys: &VoucherKeys,
    owner: &str,
    epoch: u64,
) -> Result<u64> {
    Ok(call(keys, false, "fence", owner)
        .arg(epoch)
        .invoke_async(conn)
        .await?)
}

/// Takes or renews the voucher's mover lease as `owner` for `lease`, at
/// an epoch above `floor` (0: none): the lease's epoch, or None while
/// another mover holds it or a hold keeps the mover still.
pub async fn take(
    conn: &mut impl ConnectionLike,
    bucket0: &VoucherKeys,
    owner: &str,
    lease: Duration,
    floor: u64,
) -> Result<Option<u64>> {
    // A rebuild or reconcile holding it still keeps it from moving.
    let epoch: u64 = call(bucket0, true, "take", owner)
        .arg(lease.as_millis() as u64)
        .arg(floor)
        .invoke_async(conn)
        .await?;
    Ok((epoch > 0).then_some(epoch))
}

/// Gives `owner`'s lease back (a mover that stops; otherwise it runs out).
pub async fn give_back(
    conn: &mut impl ConnectionLike,
    bucket0: &VoucherKeys,
    owner: &str,
) -> Result<()> {
    let _: i64 = call(bucket0, false, "release", owner)
        .invoke_async(conn)
        .await?;
    Ok(())
}

/// Gives the hold back (the mover moves again once no hold is left).
pub async fn unseize(
    conn: &mut impl ConnectionLike,
    bucket0: &VoucherKeys,
    owner: &str,
) -> Result<()> {
    let _: i64 = call(bucket0, true, "unseize", owner)
        .invoke_async(conn)
        .await?;
    Ok(())
}

/// Whether `owner`'s hold is still live (it may have run out during a long
/// read, and a mover moved since).
pub async fn holds(
    conn: &mut impl ConnectionLike,
    bucket0: &VoucherKeys,
    owner: &str,
) -> Result<bool> {
    let live: i64 = call(bucket0, true, "holds", owner)
        .invoke_async(conn)
        .await?;
    Ok(live == 1)
}
