//! Where the stores are and how long to wait for them.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::support::mask;

/// The project's own Redis, started by `scripts/services.sh up`.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:16379/";
/// The project's own MariaDB, started by `scripts/services.sh up`.
pub const DEFAULT_MYSQL_URL: &str = "mysql://seckill:seckill@127.0.0.1:13306/seckill";
pub const DEFAULT_PREFIX: &str = "seckill";

#[derive(Debug, Clone)]
pub struct Config {
    pub redis_url: String,
    pub mysql_url: String,
    pub prefix: String,
    pub connect_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            redis_url: DEFAULT_REDIS_URL.to_string(),
            mysql_url: DEFAULT_MYSQL_URL.to_string(),
            prefix: DEFAULT_PREFIX.to_string(),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl Config {
    /// Passwords found in the URLs, to scrub from any message before it is shown.
    pub fn secrets(&self) -> Vec<String> {
        let mut s = mask::secrets_of(&self.redis_url);
        s.extend(mask::secrets_of(&self.mysql_url));
        s
    }
}

/// A key prefix must not contain what would break the key layout: braces
/// (the hash tag is ours), whitespace or the `:` separator at either end.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    let bad = prefix.is_empty()
        || prefix.len() > 64
        || prefix.starts_with(':')
        || prefix.ends_with(':')
        || prefix
            .chars()
            .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control());
    if bad {
        return Err(Error::InvalidInput(format!(
            "key prefix '{prefix}' must be 1-64 characters without braces, spaces or a leading/trailing ':'"
        )));
    }
    Ok(())
}
