//! The registry of preloaded vouchers (`<prefix>:vouchers`, a set): where
//! workers discover the streams to consume and operators' commands find the
//! vouchers to report on. Every read and write of it goes through here.

use std::collections::HashSet;

use redis::AsyncCommands;

use crate::error::Result;
use crate::store::config::validate_prefix;
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;

/// The registry's key, a public contract (docs/src/reference/key-layout.md).
pub fn key(prefix: &str) -> Result<String> {
    validate_prefix(prefix)?;
    Ok(format!("{prefix}:vouchers"))
}

/// Every registered voucher, in ascending order.
pub async fn members(conn: &mut impl RedisConn, prefix: &str) -> Result<Vec<u64>> {
    let mut ids: Vec<u64> = conn.smembers(key(prefix)?).await?;
    ids.sort_unstable();
    Ok(ids)
}

/// Which of `vouchers` are registered: the registry's set of vouchers that
/// holds them, one command for any number, however large the registry.
pub async fn registered(
    conn: &mut impl RedisConn,
    prefix: &str,
    vouchers: &[u64],
) -> Result<HashSet<u64>> {
    if vouchers.is_empty() {
        return Ok(HashSet::new());
    }
    let found: Vec<bool> = redis::cmd("SMISMEMBER")
        .arg(key(prefix)?)
        .arg(vouchers)
        .query_async(conn)
        .await?;
    Ok(vouchers
        .iter()
        .zip(found)
        .filter(|(_, is)| *is)
        .map(|(v, _)| *v)
        .collect())
}

/// Registers the voucher (idempotent): workers start consuming its stream.
pub async fn register(conn: &mut impl RedisConn, keys: &VoucherKeys) -> Result<()> {
    let _: () = conn.sadd(key(keys.prefix())?, keys.voucher()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_matches_the_contract() {
        assert_eq!(key("seckill").unwrap(), "seckill:vouchers");
        assert!(key("a{b").is_err());
    }
}
