//! `seckill doctor`: checks that the servers are set up so that the
//! guarantees hold. Most ways of voiding them are silent: a Redis that may
//! evict keys admits a buyer twice, a MySQL that flushes its log once a
//! second loses orders a user was told succeeded, and nothing fails until
//! the day it matters. Each check reads settings and tries rights without
//! writing anything, and says what it found, why it matters and how to fix
//! it. A server that cannot be reached is a failed check, not an error:
//! finding that out is the doctor's job too.

mod clock;
mod mysql_checks;
mod redis_checks;
mod redis_nodes;
mod transport;

use serde::Serialize;

use crate::store::config::Config;

/// How a check came out, worst last (the run's outcome is the worst).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub check: String,
    pub status: Status,
    pub found: String,
    pub why: String,
    pub fix: String,
}

impl Check {
    fn new(check: impl Into<String>, status: Status, found: impl Into<String>) -> Check {
        Check {
            check: check.into(),
            status,
            found: found.into(),
            why: String::new(),
            fix: String::new(),
        }
    }

    fn ok(check: impl Into<String>, found: impl Into<String>) -> Check {
        Check::new(check, Status::Ok, found)
    }

    fn warn(check: impl Into<String>, found: impl Into<String>) -> Check {
        Check::new(check, Status::Warn, found)
    }

    fn fail(check: impl Into<String>, found: impl Into<String>) -> Check {
        Check::new(check, Status::Fail, found)
    }

    fn why(mut self, why: impl Into<String>) -> Check {
        self.why = why.into();
        self
    }

    fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = fix.into();
        self
    }
}

/// The user whose rights are tried: the roles of `contrib/redis-acl.conf`
/// and `contrib/mysql-grants.sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Worker,
    Serve,
    Operator,
    Schema,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Serve => "serve",
            Role::Operator => "operator",
            Role::Schema => "schema",
        }
    }

    /// Whether the role touches voucher keys and order ids (all but the
    /// schema role, whose Redis user may read the server's version only).
    fn uses_keys(role: Option<Role>) -> bool {
        role != Some(Role::Schema)
    }
}

/// Every check, in a fixed order: Redis, MySQL, the clocks, transport.
pub async fn run(cfg: &Config, role: Option<Role>) -> Vec<Check> {
    let mut checks = transport::checks(cfg);
    let (redis_rows, mut redis) = redis_checks::checks(cfg, role).await;
    let (mysql_rows, db) = mysql_checks::checks(cfg, role).await;
    checks.extend(redis_rows);
    checks.extend(mysql_rows);
    checks.extend(clock::checks(cfg, role, redis.as_mut(), db.as_ref()).await);
    if let Some(db) = db {
        db.close().await;
    }
    checks
}

/// The worst status of a report (`Ok` for none).
pub fn worst(checks: &[Check]) -> Status {
    checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok)
}
