//! A gate rebuilt: everything a voucher's gate is rebuilt from (MySQL's truth),
//! and publishing it atomically unless the gate moved meanwhile. Preload and
//! reconcile's rebuild both go through here.

use redis::AsyncCommands;

use crate::error::Result;
use crate::gate::witness::Witness;
use crate::orders::policy::VersionedPolicy;
use crate::orders::timeouts::{self, Existing};
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use crate::store::registry;
use crate::store::scripts::PRELOAD;
use crate::support::set_digest::SetDigest;

/// Sets are staged in chunks of this many members per SADD / ZADD.
const STAGING_CHUNK: usize = 1_000;
/// Staging sets left by a publish that died expire after this long.
const STAGING_TTL_MS: i64 = 600_000;

/// Everything a voucher's gate is rebuilt from.
pub struct RebuiltGate<'a> {
    pub total: i64,
    pub begin_ms: i64,
    pub end_ms: i64,
    pub pay_timeout_ms: i64,
    /// Published unless the gate holds a newer version (a `voucher update`
    /// since MySQL was read).
    pub policy: VersionedPolicy,
    pub stock: i64,
    pub buyers: &'a [u64],
    /// Cancelled orders: the stock published counts their units already.
    pub released: &'a [u64],
    /// (deadline ms, order id) of pending orders.
    pub deadlines: &'a [(i64, u64)],
    /// The gate's place in a voucher split into buckets (None: the
    /// voucher's one gate).
    pub bucket: Option<BucketPlace<'a>>,
}

/// Which bucket a gate image is, of how many; bucket 0's also carries
/// every tag and the pool.
#[derive(Debug, Clone, Copy)]
pub struct BucketPlace<'a> {
    pub bucket: u32,
    pub buckets: u32,
    /// Every bucket's tag, space-separated (bucket 0's image only, else "").
    pub tags: &'a str,
    /// The pool's units (bucket 0's image only).
    pub pool: Option<i64>,
}

/// Registers the voucher, stages the sets, swaps everything in with one
/// script if the gate did not move (false if it did, or if the staging sets
/// expired first) and re-adds the deadlines (derived from the stored
/// orders, so adding one again is harmless).
pub async fn publish_gate<C: RedisConn>(
    conn: &mut C,
    keys: &VoucherKeys,
    image: &RebuiltGate<'_>,
    seen: &Witness,
) -> Result<bool> {
    // Registered before the gate opens: a crash after publishing must not
    // leave a loaded gate whose orders no worker consumes.
    registry::register(conn, keys).await?;
    // Staging keys of this call's own: two rebuilds at once (preload and
    // reconcile) must not fill or swap in each other's half-built sets. The
    // script records the tag, so a resent call (its reply lost) is known as
    // the publish it repeats; decimal within i64, as every meta field is.
    let run = (crate::support::host::random_tag() & i64::MAX as u64).to_string();
    let staging = keys.buyers_staging(&run);
    let released_staging = keys.released_staging(&run);
    for chunk in image.buyers.chunks(STAGING_CHUNK) {
        let _: () = conn.sadd(&staging, chunk).await?;
    }
    for chunk in image.released.chunks(STAGING_CHUNK) {
        let _: () = conn.sadd(&released_staging, chunk).await?;
    }
    // A crash before the swap must not leave them behind for good (the
    // script clears the expiry of what it swaps in).
    let _: () = redis::pipe()
        .pexpire(&staging, STAGING_TTL_MS)
        .pexpire(&released_staging, STAGING_TTL_MS)
        .query_async(conn)
        .await?;
    // The staged sets as sets: what the script checks it received, and
    // the digests it records.
    let (buyers, released) = (distinct_ids(image.buyers), distinct_ids(image.released));
    let mut call = PRELOAD.key(keys.meta());
    call.key(keys.stock())
        .key(keys.buyers())
        .key(&staging)
        .key(keys.orders())
        .key(keys.released())
        .key(&released_staging)
        .key(keys.holds())
        // Its expiry follows the end published here.
        .key(keys.rate())
        .arg(image.total)
        .arg(image.begin_ms)
        .arg(image.end_ms)
        .arg(image.pay_timeout_ms)
        .arg(image.stock)
        .arg(seen.args())
        .arg(image.policy.policy.user_rate)
        .arg(u8::from(image.policy.policy.require_token))
        .arg(&run)
        // What the staging sets must hold: the script tells one that is
        // gone (expired, or consumed by this very publish) from one that is
        // empty because there was nothing to stage.
        .arg(buyers.len())
        .arg(released.len())
        .arg(image.policy.version)
        .arg(image.policy.policy.per_user_limit)
        .arg(crate::gate::policy::waitlist_limit_arg(
            &image.policy.policy,
        ))
        .arg(SetDigest::of(buyers.iter().copied()).0)
        .arg(SetDigest::of(released.iter().copied()).0);
    if let Some(place) = image.bucket {
        call.arg(place.bucket).arg(place.buckets).arg(place.tags);
        if let Some(pool) = place.pool {
            call.key(keys.pool()).arg(pool);
        }
    }
    let published: i64 = call.invoke_async(conn).await?;
    if published != 1 {
        return Ok(false);
    }
    let deadlines: Vec<(u64, i64)> = image.deadlines.iter().map(|(at, o)| (*o, *at)).collect();
    timeouts::schedule(conn, keys, &deadlines, Existing::Moves).await?;
    Ok(true)
}

/// The members `ids` make as a set.
fn distinct_ids(ids: &[u64]) -> std::collections::HashSet<u64> {
    ids.iter().copied().collect()
}
