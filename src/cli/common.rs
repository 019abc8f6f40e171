//! Options and parsers shared by every command.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::orders::voucher::MAX_ID;
use crate::store::config::{self, Config, SslMode, TlsFiles};
use crate::store::secret_file;
use crate::support::snowflake::MAX_NODE_ID;

/// Where the stores are. Flattened into every command, each flag with its
/// environment variable.
#[derive(Args, Debug, Clone)]
pub struct ConnectOpts {
    /// Redis URL (redis://[:password@]host:port/[db])
    #[arg(
        long,
        env = "SECKILL_REDIS_URL",
        default_value = config::DEFAULT_REDIS_URL,
        hide_env_values = true,
        global = true
    )]
    pub redis_url: String,

    /// MySQL URL (mysql://user:password@host:port/database)
    /// [default: mysql://seckill:***@127.0.0.1:13306/seckill]
    #[arg(
        long,
        env = "SECKILL_MYSQL_URL",
        default_value = config::DEFAULT_MYSQL_URL,
        hide_default_value = true,
        hide_env_values = true,
        global = true
    )]
    pub mysql_url: String,

    /// Key prefix of every Redis key
    #[arg(
        long,
        env = "SECKILL_PREFIX",
        default_value = config::DEFAULT_PREFIX,
        hide_env_values = true,
        global = true
    )]
    pub prefix: String,

    /// How long to wait for a server to accept a connection
    #[arg(
        long,
        env = "SECKILL_CONNECT_TIMEOUT",
        default_value = "5s",
        value_parser = parse_duration,
        hide_env_values = true,
        global = true
    )]
    pub connect_timeout: Duration,

    /// Read the Redis password from this file (one trailing newline is
    /// dropped), e.g. a systemd credential; the URL must then have none
    #[arg(
        long,
        env = "SECKILL_REDIS_PASSWORD_FILE",
        value_name = "FILE",
        hide_env_values = true,
        global = true
    )]
    pub redis_password_file: Option<PathBuf>,

    /// Read the MySQL password from this file (one trailing newline is
    /// dropped), e.g. a systemd credential; the URL must then have none
    #[arg(
        long,
        env = "SECKILL_MYSQL_PASSWORD_FILE",
        value_name = "FILE",
        hide_env_values = true,
        global = true
    )]
    pub mysql_password_file: Option<PathBuf>,

    /// CA certificate (PEM) to trust for rediss:// URLs instead of the
    /// system's roots
    #[arg(
        long,
        env = "SECKILL_REDIS_CA_CERT",
        value_name = "FILE",
        hide_env_values = true,
        global = true
    )]
    pub redis_ca_cert: Option<PathBuf>,

    /// Client certificate (PEM) for rediss:// with mutual TLS
    #[arg(
        long,
        env = "SECKILL_REDIS_CLIENT_CERT",
        value_name = "FILE",
        hide_env_values = true,
        global = true
    )]
    pub redis_client_cert: Option<PathBuf>,

    /// The client certificate's private key (PEM)
    #[arg(
        long,
        env = "SECKILL_REDIS_CLIENT_KEY",
        value_name = "FILE",
        hide_env_values = true,
        global = true
    )]
    pub redis_client_key: Option<PathBuf>,

    /// MySQL TLS, as the mysql client's --ssl-mode: verify-ca checks the
    /// certificate's chain, verify-identity its host name too
    #[arg(
        long,
        env = "SECKILL_MYSQL_SSL_MODE",
        value_enum,
        default_value_t = SslModeArg::Preferred,
        hide_env_values = true,
        global = true
    )]
    pub mysql_ssl_mode: SslModeArg,

    /// CA certificate (PEM) to check the MySQL server's certificate against
    /// (verify-ca, verify-identity) instead of the built-in roots
    #[arg(
        long,
        env = "SECKILL_MYSQL_CA_CERT",
        value_name = "FILE",
        hide_env_values = true,
        global = true
    )]
    pub mysql_ca_cert: Option<PathBuf>,

    /// Client certificate (PEM) for MySQL with mutual TLS
    #[arg(
        long,
        env = "SECKILL_MYSQL_CLIENT_CERT",
        value_name = "FILE",
        hide_env_values = true,
        global = true
    )]
    pub mysql_client_cert: Option<PathBuf>,

    /// The client certificate's private key (PEM)
    #[arg(
        long,
        env = "SECKILL_MYSQL_CLIENT_KEY",
        value_name = "FILE",
        hide_env_values = true,
        global = true
    )]
    pub mysql_client_key: Option<PathBuf>,
}

/// `--mysql-ssl-mode`, the mysql client's words.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslModeArg {
    Disabled,
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

impl From<SslModeArg> for SslMode {
    fn from(m: SslModeArg) -> SslMode {
        match m {
            SslModeArg::Disabled => SslMode::Disabled,
            SslModeArg::Preferred => SslMode::Preferred,
            SslModeArg::Required => SslMode::Required,
            SslModeArg::VerifyCa => SslMode::VerifyCa,
            SslModeArg::VerifyIdentity => SslMode::VerifyIdentity,
        }
    }
}

impl ConnectOpts {
    /// The connection settings, with passwords from files put into the URLs.
    pub fn config(&self) -> crate::error::Result<Config> {
        let mut redis_url = self.redis_url.clone();
        if let Some(file) = &self.redis_password_file {
            let what = "--redis-password-file";
            let password = secret_file::read_password(file, what)?;
            redis_url = secret_file::with_password(&redis_url, &password, what)?;
        }
        let mut mysql_url = self.mysql_url.clone();
        if let Some(file) = &self.mysql_password_file {
            let what = "--mysql-password-file";
            let password = secret_file::read_password(file, what)?;
            mysql_url = secret_file::with_password(&mysql_url, &password, what)?;
        }
        let redis_tls = TlsFiles {
            ca_cert: self.redis_ca_cert.clone(),
            client_cert: self.redis_client_cert.clone(),
            client_key: self.redis_client_key.clone(),
        };
        redis_tls.validate("redis")?;
        let mysql_tls = TlsFiles {
            ca_cert: self.mysql_ca_cert.clone(),
            client_cert: self.mysql_client_cert.clone(),
            client_key: self.mysql_client_key.clone(),
        };
        mysql_tls.validate("mysql")?;
        Ok(Config {
            redis_url,
            mysql_url,
            prefix: self.prefix.clone(),
            connect_timeout: self.connect_timeout,
            redis_tls,
            mysql_ssl_mode: self.mysql_ssl_mode.into(),
            mysql_tls,
        })
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// A table for people
    #[default]
    Table,
    /// JSON for scripts
    Json,
}

/// `--format table|json`, for every command that prints data.
#[derive(Args, Debug, Clone, Copy)]
pub struct FormatOpt {
    /// Output format
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// The snowflake node id of this process's order ids.
#[derive(Args, Debug, Clone, Copy)]
pub struct NodeIdOpt {
    /// Snowflake node id (0..=1023), leased from Redis: refused while another
    /// live process holds it [default: a free one, leased]
    #[arg(long, env = "SECKILL_NODE_ID", hide_env_values = true,
          value_parser = clap::value_parser!(u16).range(0..=i64::from(MAX_NODE_ID)))]
    pub node_id: Option<u16>,
}

/// Waiting for replicas after a success (Redis WAIT), for `buy` and `bench`.
#[derive(Args, Debug, Clone, Copy)]
pub struct ReplicaWaitOpt {
    /// After a success, wait until N replicas of the voucher's master have
    /// it (a failover to one of them then keeps it) [default: no wait]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub wait_replicas: Option<u32>,
    /// The longest --wait-replicas waits before giving up (the admission
    /// stands either way)
    #[arg(long, default_value = "500ms", value_parser = parse_duration, requires = "wait_replicas")]
    pub wait_timeout: Duration,
}

impl ReplicaWaitOpt {
    pub fn wait(&self) -> Option<crate::gate::admission::ReplicaWait> {
        self.wait_replicas
            .map(|replicas| crate::gate::admission::ReplicaWait {
                replicas,
                timeout: self.wait_timeout,
            })
    }
}

/// An id of a voucher, user or order: 1 ..= 9223372036854775807.
pub fn parse_id(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') && t[1..].chars().all(|c| c.is_ascii_digit()) && t.len() > 1 {
        return Err(format!("must be a positive integer, got {t}"));
    }
    let n: u64 =
        t.parse().map_err(
            |_| match t.chars().all(|c| c.is_ascii_digit()) && !t.is_empty() {
                true => format!("{t} is too large (the largest id is {MAX_ID})"),
                false => format!("'{t}' is not a number"),
            },
        )?;
    if n == 0 {
        return Err("must be at least 1".into());
    }
    if n > MAX_ID {
        return Err(format!("{n} is too large (the largest id is {MAX_ID})"));
    }
    Ok(n)
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::support::timespec::parse_duration(s).map_err(|e| strip_prefix(e.to_string()))
}

/// Stock and counts: a whole number, where a minus sign gets a clear error
/// instead of being taken for a flag.
pub fn parse_count(s: &str) -> Result<i64, String> {
    s.trim()
        .parse::<i64>()
        .map_err(|_| format!("'{s}' is not a whole number"))
}

fn strip_prefix(msg: String) -> String {
    msg.strip_prefix("invalid input: ")
        .map(str::to_string)
        .unwrap_or(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_what_is_wrong() {
        assert_eq!(parse_id("42"), Ok(42));
        assert!(parse_id("0").unwrap_err().contains("at least 1"));
        assert!(parse_id("-3").unwrap_err().contains("positive"));
        assert!(parse_id("abc").unwrap_err().contains("not a number"));
        assert!(parse_id("99999999999999999999")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_id("9223372036854775808")
            .unwrap_err()
            .contains("too large"));
        assert_eq!(parse_id("9223372036854775807"), Ok(MAX_ID));
    }
}
