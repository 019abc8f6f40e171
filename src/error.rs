//! Errors the library reports. Callers branch on the variants (exit codes,
//! retries); every message is one line that names the problem.

use std::time::Duration;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid input: {0}")]
    InvalidInput(String),

    #[error("cannot connect to Redis at {url}: {reason}")]
    RedisConnect { url: String, reason: String },

    #[error("cannot connect to MySQL at {url}: {reason}")]
    MysqlConnect { url: String, reason: String },

    #[error("{what} did not answer within {}", humantime::format_duration(*.after))]
    Timeout { what: String, after: Duration },

    /// A fenced MySQL transaction ran past `--mysql-timeout`: its worker
    /// abandoned it (the connection thrown away, the session ended or
    /// left for the fence).
    #[error("the MySQL transaction did not end within {} (--mysql-timeout); abandoned", humantime::format_duration(*.0))]
    TransactionPastDeadline(Duration),

    #[error("{server} {found} is too old: {needed} or newer is needed")]
    ServerTooOld {
        server: &'static str,
        found: String,
        needed: &'static str,
    },

    #[error("database `{0}` is not initialised: run `seckill init` first")]
    NotInitialised(String),

    #[error("database `{db}` has schema version {found}, this seckill needs {needed}: run `seckill init`")]
    SchemaOutdated { db: String, found: u32, needed: u32 },

    #[error("database `{db}` has schema version {found}, newer than this seckill knows ({known}): upgrade seckill")]
    SchemaTooNew { db: String, found: u32, known: u32 },

    #[error("voucher {0} does not exist")]
    VoucherNotFound(u64),

    #[error("voucher {0} already exists")]
    VoucherExists(u64),

    #[error(
        "voucher {voucher} has {in_flight} order(s) in flight (admitted in Redis, not yet in MySQL); \
         preloading now would re-admit sold units. Let `seckill worker` drain them, or run \
         `seckill reconcile`; `--force` overrides"
    )]
    OrdersInFlight { voucher: u64, in_flight: u64 },

    #[error(
        "voucher {0} changed in Redis while it was being preloaded (a sale is running?); try again"
    )]
    Busy(u64),

    #[error("{0}")]
    NodeId(String),

    #[error("user {user} belongs to bucket {bucket} of voucher {voucher}, not the one asked (the voucher's buckets changed since they were read): try again")]
    WrongBucket {
        voucher: u64,
        user: u64,
        bucket: u32,
    },

    #[error("Redis: {0}")]
    Redis(String),

    #[error("MySQL: {0}")]
    Mysql(String),
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(describe_redis(&e))
    }
}

impl From<mysql_async::Error> for Error {
    fn from(e: mysql_async::Error) -> Self {
        Error::Mysql(describe_mysql(&e))
    }
}

/// MySQL server error numbers the code branches on, in one list.
pub mod mysql_codes {
    pub const ACCESS_DENIED: u16 = 1045;
    pub const BAD_DB: u16 = 1049;
    pub const DUP_ENTRY: u16 = 1062;
    /// ALTER TABLE ... ADD COLUMN of a column that exists.
    pub const DUP_FIELDNAME: u16 = 1060;
    pub const NO_SUCH_TABLE: u16 = 1146;
    pub const LOCK_WAIT_TIMEOUT: u16 = 1205;
    /// ER_NO_SUCH_THREAD: KILL of a session that has ended already.
    pub const NO_SUCH_THREAD: u16 = 1094;
    pub const LOCK_DEADLOCK: u16 = 1213;
    /// ER_CHECKREAD "Record has changed since last read" (MariaDB with
    /// innodb_snapshot_isolation=ON): a write conflict, retried like one.
    pub const RECORD_CHANGED: u16 = 1020;
    /// A right refused on a database, a table, a column (`seckill doctor`).
    pub const DB_ACCESS_DENIED: u16 = 1044;
    pub const TABLE_ACCESS_DENIED: u16 = 1142;
    pub const COLUMN_ACCESS_DENIED: u16 = 1143;
}

/// The MySQL error code of a server error, for callers that branch on it.
pub fn mysql_code(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

/// Whether a MySQL error, made one of ours, was a lock wait that timed out.
pub fn is_lock_wait_timeout(e: &Error) -> bool {
    matches!(e, Error::Mysql(m) if m.ends_with(&format!("(error {})", mysql_codes::LOCK_WAIT_TIMEOUT)))
}

/// One line for a MySQL error, without the driver's nested repetitions.
pub fn describe_mysql(e: &mysql_async::Error) -> String {
    match e {
        mysql_async::Error::Server(s) => format!("{} (error {})", s.message, s.code),
        mysql_async::Error::Io(io) => match io {
            mysql_async::IoError::Io(e) => e.to_string(),
            #[allow(unreachable_patterns)]
            other => other.to_string(),
        },
        mysql_async::Error::Driver(d) => d.to_string(),
        mysql_async::Error::Url(u) => u.to_string(),
        mysql_async::Error::Other(o) => o.to_string(),
    }
}

/// One line for a Redis error.
pub fn describe_redis(e: &redis::RedisError) -> String {
    e.to_string().replace('\n', " ")
}
