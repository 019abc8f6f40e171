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

    /// The voucher has no gate in Redis (never preloaded, or lost whole).
    #[error("voucher {0} is not loaded at the gate (seckill preload --voucher {0})")]
    VoucherNotLoaded(u64),

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

    /// The admission script found the idempotency key's reservation
    /// (`KEYS[10]`) taken and did nothing: the request goes the two-step
    /// way (src/idempotency.rs). Never shown: the purchase handles it.
    #[error("the idempotency key is reserved by an earlier request")]
    KeyReserved,

    /// The admission script refused the quantity asked (outside 1 ..= the
    /// voucher's per-user limit) before writing anything: bad input, told
    /// as such (`invalid input: ...`), not a failure of the store.
    #[error("invalid input: {0}")]
    QuantityRefused(String),

    /// A Redis command or script failed: `fault` is what callers branch
    /// on; `cause` is the driver's error when there was one.
    #[error("Redis: {message}")]
    Redis {
        fault: StoreFault,
        message: String,
        cause: Option<Cause>,
    },

    /// A MySQL statement failed: as [`Error::Redis`].
    #[error("MySQL: {message}")]
    Mysql {
        fault: StoreFault,
        message: String,
        cause: Option<Cause>,
    },
}

/// A store driver's own error, kept beside the one-line message made from
/// it. Not the std `source()` of our error: the message already renders it,
/// and `{:#}` (how the CLI prints an error) would print it twice.
pub type Cause = std::sync::Arc<dyn std::error::Error + Send + Sync>;

/// What failed at a store, in the terms callers branch on (retry, create
/// again, wait, answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFault {
    /// Redis: the stream or its consumer group does not exist (NOGROUP).
    NoGroup,
    /// MySQL: a lock wait ran past `innodb_lock_wait_timeout` (1205).
    LockWaitTimeout,
    /// MySQL: the transaction was chosen as a deadlock's victim (1213), or
    /// met a write conflict (1020): it was rolled back.
    Deadlock,
    /// The connection broke, was refused, or timed out at the socket: the
    /// command may or may not have run.
    ConnectionLost,
    /// One of the project's scripts (lua/) refused its arguments with an
    /// error reply, before writing anything.
    ScriptRefused,
    /// Redis: a command's keys live in several hash slots (CROSSSLOT),
    /// refused before it ran (a Cluster node, or a proxy in front of
    /// several).
    CrossSlot,
    /// The server cannot serve now but will by itself: Redis loading its
    /// data, a cluster slot moving or down, a busy script; MySQL shutting
    /// down or out of connections.
    Unavailable,
    /// Anything else: another server error, or a reply the code cannot read.
    Other,
}

impl Error {
    /// A Redis failure the code found itself (a reply it cannot read).
    pub fn redis(message: impl Into<String>) -> Error {
        Error::Redis {
            fault: StoreFault::Other,
            message: message.into(),
            cause: None,
        }
    }

    /// A MySQL failure the code found itself (rows it cannot accept).
    pub fn mysql(message: impl Into<String>) -> Error {
        Error::Mysql {
            fault: StoreFault::Other,
            message: message.into(),
            cause: None,
        }
    }

    /// The store fault, for a Redis or MySQL error.
    pub fn store_fault(&self) -> Option<StoreFault> {
        match self {
            Error::Redis { fault, .. } | Error::Mysql { fault, .. } => Some(*fault),
            _ => None,
        }
    }

    /// Whether the same request, made again later, can succeed without
    /// anyone changing anything: a store that did not answer, a lock or
    /// a race lost; not a refusal (a privilege, a corrupt key, bad input).
    pub fn may_heal_by_itself(&self) -> bool {
        match self {
            Error::RedisConnect { .. }
            | Error::MysqlConnect { .. }
            | Error::Timeout { .. }
            | Error::TransactionPastDeadline(_)
            | Error::Busy(_)
            | Error::WrongBucket { .. }
            | Error::NodeId(_) => true,
            Error::Redis { fault, .. } | Error::Mysql { fault, .. } => matches!(
                fault,
                StoreFault::ConnectionLost
                    | StoreFault::LockWaitTimeout
                    | StoreFault::Deadlock
                    | StoreFault::Unavailable
            ),
            _ => false,
        }
    }

    /// The driver's error behind a Redis or MySQL error, if there was one.
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::Redis { cause, .. } | Error::Mysql { cause, .. } => cause.as_deref(),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis {
            fault: redis_fault(&e),
            message: describe_redis(&e),
            cause: Some(std::sync::Arc::new(e)),
        }
    }
}

impl From<mysql_async::Error> for Error {
    fn from(e: mysql_async::Error) -> Self {
        Error::Mysql {
            fault: mysql_fault(&e),
            message: describe_mysql(&e),
            cause: Some(std::sync::Arc::new(e)),
        }
    }
}

fn redis_fault(e: &redis::RedisError) -> StoreFault {
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
        return StoreFault::ConnectionLost;
    }
    match first_server_error(e) {
        Some((code, detail)) => server_fault(&code, detail.as_deref()),
        None => StoreFault::Other,
    }
}

/// The code and text of a server's error reply: the reply itself, or the
/// first failed command's of a pipeline or transaction (whose error holds
/// them apart, with no code or detail of its own).
fn first_server_error(e: &redis::RedisError) -> Option<(String, Option<String>)> {
    let errors = e.clone().into_server_errors()?;
    let (_, first) = errors.first()?;
    Some((
        first.code().to_string(),
        first.details().map(str::to_string),
    ))
}

fn server_fault(code: &str, detail: Option<&str>) -> StoreFault {
    match (code, detail) {
        ("NOGROUP", _) => StoreFault::NoGroup,
        ("CROSSSLOT", _) => StoreFault::CrossSlot,
        // A proxy may wrap it in its own ERR.
        ("ERR", Some(d)) if d.starts_with("CROSSSLOT") => StoreFault::CrossSlot,
        ("ERR", Some(d)) if is_script_refusal(d) => StoreFault::ScriptRefused,
        // Redis 6.2 wraps an error a script's call met in its own ERR
        // ("Error running script ...: @user_script:58: NOGROUP ..."); 7
        // passes the code through.
        ("ERR", Some(d)) if d.contains(": NOGROUP ") => StoreFault::NoGroup,
        ("LOADING" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "BUSY" | "NOREPLICAS", _) => {
            StoreFault::Unavailable
        }
        _ => StoreFault::Other,
    }
}

/// The text of a refusal one of the project's scripts answered (`seckill:
/// quantity ...`), alone or as a pipeline's failed command.
pub fn script_refusal(e: &redis::RedisError) -> Option<String> {
    match first_server_error(e)? {
        (code, Some(detail)) if code == "ERR" && is_script_refusal(&detail) => Some(detail),
        _ => None,
    }
}

/// Whether an error reply's text starts as the project's scripts' refusals
/// do: `<script>: ` or `<script>.lua: `, a name of lowercase letters and
/// underscores (a Lua runtime error starts `user_script:<line>:`, Redis's
/// own errors with a word and a space). `store::scripts`' tests hold every
/// refusal of lua/ to this rule.
pub(crate) fn is_script_refusal(detail: &str) -> bool {
    let Some((first, _)) = detail.split_once(": ") else {
        return false;
    };
    let name = first.strip_suffix(".lua").unwrap_or(first);
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

fn mysql_fault(e: &mysql_async::Error) -> StoreFault {
    match e {
        mysql_async::Error::Server(s) => match s.code {
            mysql_codes::LOCK_WAIT_TIMEOUT => StoreFault::LockWaitTimeout,
            mysql_codes::LOCK_DEADLOCK | mysql_codes::RECORD_CHANGED => StoreFault::Deadlock,
            mysql_codes::CONNECTION_KILLED => StoreFault::ConnectionLost,
            mysql_codes::SERVER_SHUTDOWN
            | mysql_codes::TOO_MANY_CONNECTIONS
            | mysql_codes::TOO_MANY_USER_CONNECTIONS
            | mysql_codes::USER_LIMIT_REACHED
            | mysql_codes::QUERY_INTERRUPTED
            | mysql_codes::QUERY_TIMEOUT
            | mysql_codes::MYSQL_QUERY_TIMEOUT => StoreFault::Unavailable,
            _ => StoreFault::Other,
        },
        mysql_async::Error::Io(_) => StoreFault::ConnectionLost,
        mysql_async::Error::Driver(
            mysql_async::DriverError::ConnectionClosed | mysql_async::DriverError::PoolDisconnected,
        ) => StoreFault::ConnectionLost,
        _ => StoreFault::Other,
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
    /// ER_CONNECTION_KILLED: the session was killed (the fence, an operator).
    pub const CONNECTION_KILLED: u16 = 1927;
    /// ER_SERVER_SHUTDOWN: the server is shutting down.
    pub const SERVER_SHUTDOWN: u16 = 1053;
    /// ER_CON_COUNT_ERROR: too many connections.
    pub const TOO_MANY_CONNECTIONS: u16 = 1040;
    /// ER_TOO_MANY_USER_CONNECTIONS: the user's max_user_connections.
    pub const TOO_MANY_USER_CONNECTIONS: u16 = 1203;
    /// ER_USER_LIMIT_REACHED: a per-hour resource limit of the user.
    pub const USER_LIMIT_REACHED: u16 = 1226;
    /// ER_QUERY_INTERRUPTED: the statement was killed.
    pub const QUERY_INTERRUPTED: u16 = 1317;
    /// ER_STATEMENT_TIMEOUT (MariaDB's max_statement_time is 1969).
    pub const QUERY_TIMEOUT: u16 = 1969;
    /// ER_QUERY_TIMEOUT: MySQL's max_execution_time.
    pub const MYSQL_QUERY_TIMEOUT: u16 = 3024;
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
