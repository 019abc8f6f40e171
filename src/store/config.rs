//! Where the stores are and how long to wait for them.

use std::path::PathBuf;
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
    /// Certificates for `rediss://` URLs (none: the system's roots, no
    /// client certificate).
    pub redis_tls: TlsFiles,
    pub mysql_ssl_mode: SslMode,
    pub mysql_tls: TlsFiles,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            redis_url: DEFAULT_REDIS_URL.to_string(),
            mysql_url: DEFAULT_MYSQL_URL.to_string(),
            prefix: DEFAULT_PREFIX.to_string(),
            connect_timeout: Duration::from_secs(5),
            redis_tls: TlsFiles::default(),
            mysql_ssl_mode: SslMode::default(),
            mysql_tls: TlsFiles::default(),
        }
    }
}

/// PEM files for one store's TLS: the CA to trust (instead of the system's
/// roots), and a client certificate with its key for mutual TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_cert: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl TlsFiles {
    /// A client certificate and its key go together.
    pub fn validate(&self, store: &str) -> Result<()> {
        match (&self.client_cert, &self.client_key) {
            (Some(_), None) | (None, Some(_)) => Err(Error::InvalidInput(format!(
                "--{store}-client-cert and --{store}-client-key go together"
            ))),
            _ => Ok(()),
        }
    }
}

/// How to secure the MySQL connection: the mysql client's `--ssl-mode`
/// words and meanings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SslMode {
    /// Plaintext.
    Disabled,
    /// TLS when the server offers it (certificate not checked), plaintext
    /// otherwise.
    #[default]
    Preferred,
    /// TLS or nothing; the certificate is not checked.
    Required,
    /// TLS with the certificate's chain checked against the CA, not its
    /// host name.
    VerifyCa,
    /// TLS with the chain and the host name checked.
    VerifyIdentity,
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
