//! Connecting to MySQL (or MariaDB) and making sure the schema is the one
//! this binary expects before any command touches a table.

use mysql_async::prelude::*;
use std::time::Duration;

use mysql_async::{Conn, Opts, OptsBuilder, Pool};

use crate::error::{describe_mysql, mysql_code, mysql_codes, Error, Result};
use crate::store::config::{Config, SslMode};
use crate::store::mysql_tls;
use crate::store::schema;
use crate::support::mask::mask_url;
use crate::support::version;

#[derive(Clone)]
pub struct Db {
    pool: Pool,
    name: String,
}

impl Db {
    /// Connects and checks that `seckill init` has brought the schema to the
    /// version this binary knows.
    pub async fn connect(cfg: &Config) -> Result<Db> {
        Self::connect_waiting(cfg, None).await
    }

    /// As `connect`, with every session's row lock waits bounded to
    /// `lock_wait` (the worker: a stopped holder is fenced after one wait,
    /// see worker/fence.rs, instead of InnoDB's 50 s per attempt).
    pub async fn connect_waiting(cfg: &Config, lock_wait: Option<Duration>) -> Result<Db> {
        let db = Self::open(cfg, true, lock_wait).await?;
        let mut conn = db.conn().await?;
        schema::ensure_current(&mut conn, &db.name).await?;
        drop(conn);
        Ok(db)
    }

    /// Connects without the schema check and without creating anything
    /// (`seckill doctor` reports the schema's version itself).
    pub async fn connect_unchecked(cfg: &Config) -> Result<Db> {
        Self::open(cfg, true, None).await
    }

    /// Connects without the schema check, creating the database if it is
    /// missing (for `seckill init`).
    pub async fn connect_for_init(cfg: &Config) -> Result<Db> {
        let db = Self::open(cfg, false, None).await?;
        let mut conn = db.conn().await?;
        conn.query_drop(format!("CREATE DATABASE IF NOT EXISTS `{}`", db.name))
            .await?;
        drop(conn);
        db.pool.clone().disconnect().await.ok();
        Self::open(cfg, true, None).await
    }

    async fn open(cfg: &Config, with_db: bool, lock_wait: Option<Duration>) -> Result<Db> {
        let url = mask_url(&cfg.mysql_url);
        let fail = |reason: String| Error::MysqlConnect {
            url: url.clone(),
            reason,
        };
        let opts = Opts::from_url(&cfg.mysql_url).map_err(|e| fail(e.to_string()))?;
        let name = opts
            .db_name()
            .map(str::to_string)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                fail("the URL names no database (mysql://user:pass@host:port/DATABASE)".into())
            })?;
        validate_db_name(&name)?;
        if opts.ssl_opts().is_some() {
            return Err(fail(
                "TLS goes in --mysql-ssl-mode and --mysql-ca-cert, not in the URL (require_ssl, verify_ca, ...)".into(),
            ));
        }
        // The driver wants an IPv6 literal without its brackets.
        let host = opts
            .ip_or_hostname()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = opts.tcp_port();
        let mode = ssl_mode(opts.socket().is_some(), cfg.mysql_ssl_mode).map_err(&fail)?;
        let ssl = mysql_tls::ssl_opts(mode, &cfg.mysql_tls, &host, port, cfg.connect_timeout)
            .await
            .map_err(&fail)?;
        let tls = ssl.is_some();
        let builder = OptsBuilder::from_opts(opts)
            .db_name(with_db.then(|| name.clone()))
            // `setup`, not `init`: the pool resets a connection it takes back
            // (COM_RESET_CONNECTION), which clears session variables; setup
            // commands run again after each reset, init ones only once.
            .setup(session_setup(lock_wait));
        // With TLS, stay on TCP: the driver would otherwise try to move a
        // local connection to the unix socket, where it cannot encrypt.
        let secured = if tls {
            builder.clone().ssl_opts(ssl).prefer_socket(false)
        } else {
            builder.clone().ssl_opts(ssl)
        };
        let db = Db {
            pool: Pool::new(secured),
            name,
        };
        // Probe now so a wrong URL fails here with one clear line.
        let mut probe = tokio::time::timeout(cfg.connect_timeout, db.pool.get_conn()).await;
        let db = match probe {
            // preferred: plaintext when the server offers no TLS.
            Ok(Err(mysql_async::Error::Driver(
                mysql_async::DriverError::NoClientSslFlagFromServer,
            ))) if mode == SslMode::Preferred => {
                let plain = Db {
                    pool: Pool::new(builder.ssl_opts(None)),
                    name: db.name.clone(),
                };
                probe = tokio::time::timeout(cfg.connect_timeout, plain.pool.get_conn()).await;
                plain
            }
            _ => db,
        };
        match probe {
            Ok(Ok(_conn)) => Ok(db),
            Ok(Err(mysql_async::Error::Driver(
                mysql_async::DriverError::NoClientSslFlagFromServer,
            ))) => Err(fail(format!(
                "the server offers no TLS, and --mysql-ssl-mode {} needs it",
                mysql_tls::mode_name(mode)
            ))),
            Ok(Err(e)) => Err(refused(&e, cfg.mysql_ssl_mode, &db.name).unwrap_or_else(fail)),
            Err(_) => Err(fail(format!(
                "no answer within {}",
                humantime::format_duration(cfg.connect_timeout)
            ))),
        }
    }

    pub async fn conn(&self) -> Result<Conn> {
        Ok(self.pool.get_conn().await?)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Closes the pool's connections cleanly (the server logs no aborts).
    pub async fn close(self) {
        self.pool.disconnect().await.ok();
    }
}

/// The TLS mode for the URL's transport: a unix socket is not encrypted
/// by the driver, so preferred means plaintext there, and the modes that
/// insist on TLS are refused (the reason, for the caller's error).
fn ssl_mode(socket: bool, asked: SslMode) -> std::result::Result<SslMode, String> {
    match (socket, asked) {
        (true, SslMode::Preferred) => Ok(SslMode::Disabled),
        (true, SslMode::Disabled) => Ok(SslMode::Disabled),
        (true, other) => Err(format!(
            "--mysql-ssl-mode {} needs TCP; the URL names a unix socket",
            mysql_tls::mode_name(other)
        )),
        (false, m) => Ok(m),
    }
}

/// What a server's refusal of the first connection means: the database
/// not made yet, or a denial (with the likely cause); Err(reason) for the
/// caller's connect error otherwise.
fn refused(e: &mysql_async::Error, mode: SslMode, db: &str) -> std::result::Result<Error, String> {
    match mysql_code(e) {
        Some(mysql_codes::BAD_DB) => Ok(Error::NotInitialised(db.to_string())),
        Some(mysql_codes::ACCESS_DENIED) if mode == SslMode::Disabled => Err(format!(
            "access denied (wrong user or password, or a server that requires TLS: --mysql-ssl-mode is disabled): {}",
            describe_mysql(e)
        )),
        Some(mysql_codes::ACCESS_DENIED) => Err(format!(
            "access denied (wrong user or password): {}",
            describe_mysql(e)
        )),
        _ => Err(describe_mysql(e)),
    }
}

/// What every session runs first. Times are written and read as Unix
/// milliseconds through FROM_UNIXTIME / UNIX_TIMESTAMP, which are exact only
/// in UTC.
fn session_setup(lock_wait: Option<Duration>) -> Vec<String> {
    let mut setup = vec!["SET time_zone = '+00:00'".to_string()];
    if let Some(wait) = lock_wait {
        setup.push(format!(
            "SET SESSION innodb_lock_wait_timeout = {}",
            wait.as_secs().max(1)
        ));
    }
    setup
}

fn validate_db_name(name: &str) -> Result<()> {
    let ok = name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    if !ok {
        return Err(Error::InvalidInput(format!(
            "database name '{name}' must be at most 64 letters, digits, '_' or '$'"
        )));
    }
    Ok(())
}

/// MySQL 8.0 or MariaDB 10.11 at least: the SQL here is the subset both run.
pub async fn check_version(conn: &mut Conn) -> Result<String> {
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await?
        .unwrap_or_default();
    let (needed, min) = if version.to_ascii_lowercase().contains("mariadb") {
        ("MariaDB 10.11", (10, 11))
    } else {
        ("MySQL 8.0", (8, 0))
    };
    if version::major_minor(&version) < min {
        return Err(Error::ServerTooOld {
            server: if min.0 == 10 { "MariaDB" } else { "MySQL" },
            found: version,
            needed,
        });
    }
    Ok(version)
}

/// Options of a read-only transaction whose reads are one consistent
/// snapshot. `WITH CONSISTENT SNAPSHOT` is one only under REPEATABLE READ,
/// so the level is set here, not left to the server's default (a server
/// running READ COMMITTED would otherwise show each read a newer state).
pub fn snapshot_tx() -> mysql_async::TxOpts {
    mysql_async::TxOpts::default()
        .with_isolation_level(Some(mysql_async::IsolationLevel::RepeatableRead))
        .with_consistent_snapshot(true)
        .with_readonly(Some(true))
        .clone()
}

/// Integer ids as a SQL list (`1,2,3`). Integers cannot inject anything, and
/// inlining them spares a prepared statement per list length.
/// A Unix time in ms as a DATETIME(3) expression (`FROM_UNIXTIME(s.mmm)`),
/// for values built into a statement (times before 1970 read as 1970).
pub fn sql_time_ms(ms: i64) -> String {
    let ms = ms.max(0);
    format!("FROM_UNIXTIME({}.{:03})", ms / 1000, ms % 1000)
}

/// A text value for a statement built by hand, as a hex literal (`X'…'`,
/// no quoting for any byte to escape), or `NULL` for none.
pub fn sql_text_or_null(text: Option<&str>) -> String {
    match text {
        Some(text) => format!("X'{}'", crate::support::sha256::hex(text.as_bytes())),
        None => "NULL".to_string(),
    }
}

pub fn join_ids(ids: impl IntoIterator<Item = u64>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for (n, id) in ids.into_iter().enumerate() {
        if n > 0 {
            s.push(',');
        }
        let _ = write!(s, "{id}");
    }
    s
}
