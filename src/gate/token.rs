//! Admission tokens: minted here from the operating system's CSPRNG (128
//! bits), stored with `lua/token.lua` for one user and one voucher, and
//! checked by `lua/seckill.lua` when the voucher requires them.

use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::store::keys::VoucherKeys;
use crate::store::redis_conn::RedisConn;
use crate::store::scripts::TOKEN;

/// The longest a token may live (token.lua refuses more).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct IssuedToken {
    pub voucher: u64,
    pub user: u64,
    pub token: String,
    pub ttl_ms: u64,
}

/// 128 random bits as 32 hex digits.
pub fn mint() -> Result<String> {
    crate::support::nonce::fresh()
}

/// Checks a time to live before anything is written.
pub fn validate_ttl(ttl: Duration) -> Result<u64> {
    let ms = ttl.as_millis();
    if ms == 0 || ttl > MAX_TTL {
        return Err(Error::InvalidInput(format!(
            "token time to live {} is out of range: it must be between 1ms and 24h",
            humantime::format_duration(ttl)
        )));
    }
    Ok(ms as u64)
}

/// Mints a token for `user` and stores it (replacing the user's last one).
pub async fn issue(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    user: u64,
    ttl: Duration,
) -> Result<IssuedToken> {
    let ttl_ms = validate_ttl(ttl)?;
    let loaded: bool = redis::cmd("EXISTS")
        .arg(keys.meta())
        .query_async(conn)
        .await?;
    if !loaded {
        return Err(Error::VoucherNotLoaded(keys.voucher()));
    }
    let token = mint()?;
    store(conn, keys, user, &token, ttl_ms).await?;
    Ok(IssuedToken {
        voucher: keys.voucher(),
        user,
        token,
        ttl_ms,
    })
}

/// Stores a token minted elsewhere (what application servers do).
pub async fn store(
    conn: &mut impl RedisConn,
    keys: &VoucherKeys,
    user: u64,
    token: &str,
    ttl_ms: u64,
) -> Result<()> {
    let _: i64 = TOKEN
        .key(keys.token(user))
        .arg(token)
        .arg(ttl_ms)
        .invoke_async(conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_random_bits() {
        let (a, b) = (mint().unwrap(), mint().unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn time_to_live_is_bounded() {
        assert!(validate_ttl(Duration::ZERO).is_err());
        assert!(validate_ttl(Duration::from_secs(25 * 3600)).is_err());
        assert_eq!(validate_ttl(Duration::from_secs(600)).unwrap(), 600_000);
    }
}
