//! The admission policy at the gate (per-user rate limit, admission
//! tokens): MySQL holds it, `lua/policy.lua` publishes it to the gate's
//! meta, where `lua/seckill.lua` reads it on every attempt.

use serde::Serialize;

use crate::error::Result;
use crate::orders::policy::{Policy, PolicyChange, VersionedPolicy};
use crate::store::db::Db;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use crate::store::scripts::POLICY;

/// The meta fields the policy is published in.
pub const META_USER_RATE: &str = "user_rate";
pub const META_REQUIRE_TOKEN: &str = "require_token";
pub const META_PER_USER_LIMIT: &str = "per_user_limit";
pub const META_WAITLIST_LIMIT: &str = "waitlist_limit";
/// The meta field holding the version (MySQL's `policy_version`) of the
/// policy published.
pub const META_POLICY_VERSION: &str = "policy_version";

/// The meta fields lua/seckill.lua counts its policy rejections in.
pub const META_REJECTED_RATE_LIMITED: &str = "rejected_rate_limited";
pub const META_REJECTED_BAD_TOKEN: &str = "rejected_bad_token";

/// Attempts the policy turned away at a voucher's gate, per reason (a bot
/// wave shows up here).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Rejections {
    pub rate_limited: u64,
    pub bad_token: u64,
}

impl Rejections {
    /// From the two meta fields as read (absent: none).
    pub fn from_meta(rate_limited: Option<u64>, bad_token: Option<u64>) -> Rejections {
        Rejections {
            rate_limited: rate_limited.unwrap_or(0),
            bad_token: bad_token.unwrap_or(0),
        }
    }
}

/// The voucher's rejections so far.
pub async fn rejections(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<Rejections> {
    let (rate_limited, bad_token): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(keys.meta())
        .arg(META_REJECTED_RATE_LIMITED)
        .arg(META_REJECTED_BAD_TOKEN)
        .query_async(conn)
        .await?;
    Ok(Rejections::from_meta(rate_limited, bad_token))
}

/// What became of a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The gate holds this policy now.
    Published,
    /// The voucher is not loaded at the gate (preload publishes the policy).
    NotLoaded,
    /// The gate holds a newer version already: nothing was written.
    Newer,
}

/// Publishes `policy` at the gate unless the gate holds a newer version.
pub async fn publish(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    policy: VersionedPolicy,
) -> Result<Published> {
    let published: i64 = POLICY
        .key(keys.meta())
        .arg(policy.policy.user_rate)
        .arg(u8::from(policy.policy.require_token))
        .arg(policy.version)
        .arg(policy.policy.per_user_limit)
        .arg(waitlist_limit_arg(&policy.policy))
        .invoke_async(conn)
        .await?;
    Ok(match published {
        1 => Published::Published,
        2 => Published::Newer,
        _ => Published::NotLoaded,
    })
}

/// Publishes `policy` whatever version the gate holds, and leaves it
/// without one (lua/policy.lua without `ARGV[3]`).
pub async fn publish_unversioned(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    policy: Policy,
) -> Result<Published> {
    let published: i64 = POLICY
        .key(keys.meta())
        .arg(policy.user_rate)
        .arg(u8::from(policy.require_token))
        .arg("")
        .arg(policy.per_user_limit)
        .arg(waitlist_limit_arg(&policy))
        .invoke_async(conn)
        .await?;
    Ok(match published {
        1 => Published::Published,
        _ => Published::NotLoaded,
    })
}

/// The waitlist cap as the scripts take it: '' for none.
pub fn waitlist_limit_arg(policy: &Policy) -> String {
    policy
        .waitlist_limit
        .map(|w| w.to_string())
        .unwrap_or_default()
}

/// The version of the policy the gate holds (None: unknown, e.g. published
/// without one, or not loaded).
pub async fn version_at_gate(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<Option<u64>> {
    let v: Option<String> = redis::cmd("HGET")
        .arg(keys.meta())
        .arg(META_POLICY_VERSION)
        .query_async(conn)
        .await?;
    Ok(v.and_then(|v| v.parse().ok()))
}

/// Changes the policy in MySQL (only what is given), then publishes what
/// MySQL holds at the gate (MySQL first: a crash in between leaves drift
/// that reconcile repairs toward MySQL). Returns the policy in force and
/// whether the gate holds it (or a newer one).
pub async fn update(
    db: &Db,
    conn: &mut impl RedisConn,
    prefix: &str,
    voucher_id: u64,
    change: PolicyChange,
) -> Result<(Policy, bool)> {
    let keys = VoucherKeys::new(prefix, voucher_id)?;
    let policy = crate::orders::voucher::update_policy(db, voucher_id, change).await?;
    crate::support::fault::point("before_publish").await?;
    // Every bucket of a voucher split in buckets admits by its own meta.
    let layout =
        crate::gate::buckets::for_routing(conn, prefix, voucher_id, async || Ok(db.clone()))
            .await?;
    for b in 1..layout.buckets() {
        publish(conn, &layout.keys(b)?, policy).await?;
    }
    // One publish is enough: of updates at once, the last to change MySQL
    // reads back the greatest version, and the gate refuses anything older,
    // in whatever order the publishes land.
    Ok(match publish(conn, &keys, policy).await? {
        Published::Published => (policy.policy, true),
        // A later update took effect and published; report MySQL's policy
        // as it is, which is at least that one.
        Published::Newer => (
            crate::orders::voucher::get(db, voucher_id).await?.policy,
            true,
        ),
        Published::NotLoaded => (policy.policy, false),
    })
}

/// The policy fields of a gate's meta, as read.
#[derive(Debug, Clone, Default)]
pub struct MetaPolicy {
    pub user_rate: Option<u32>,
    pub require_token: Option<String>,
    pub per_user_limit: Option<u32>,
    pub waitlist_limit: Option<String>,
}

/// A policy as the gate's meta holds it (absent fields: off, a limit of 1,
/// no cap).
pub fn from_meta(m: MetaPolicy) -> Policy {
    Policy {
        user_rate: m.user_rate.unwrap_or(0),
        require_token: m.require_token.as_deref() == Some("1"),
        per_user_limit: m.per_user_limit.unwrap_or(1).max(1),
        waitlist_limit: m.waitlist_limit.and_then(|w| w.parse().ok()),
    }
}
