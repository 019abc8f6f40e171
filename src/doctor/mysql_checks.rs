//! MySQL: reachable and new enough, durable commits, an isolation level the
//! worker's reads are right under, lock waits, the schema's version, and
//! the rights of the role.

use std::collections::HashMap;

use mysql_async::prelude::*;
use mysql_async::Conn;

use super::{Check, Role, Status};
use crate::error::describe_mysql;
use crate::store::config::Config;
use crate::store::db::{self, Db};
use crate::store::schema;
use crate::support::mask::redact;

/// The rows, and the pool once the server was reached (the clock check
/// asks it again; the caller closes it).
pub async fn checks(cfg: &Config, role: Option<Role>) -> (Vec<Check>, Option<Db>) {
    let (db, mut conn) = match connect(cfg).await {
        Ok(pair) => pair,
        Err(e) => {
            let row = Check::fail("mysql reachable", redact(&e, &cfg.secrets()))
                .why("orders are stored in MySQL: the worker and every payment need it")
                .fix("check --mysql-url and that the server runs");
            return (vec![row], None);
        }
    };
    let mut out = Vec::new();
    match db::check_version(&mut conn).await {
        Ok(v) => out.push(Check::ok("mysql reachable", v)),
        Err(e) => {
            out.push(
                Check::fail("mysql reachable", e.to_string())
                    .why("the SQL is the subset MySQL 8.0 and MariaDB 10.11 both run")
                    .fix("upgrade the server"),
            );
            return (out, Some(db));
        }
    }
    match variables(&mut conn).await {
        Ok(vars) => {
            out.push(flush_log(&vars));
            out.push(sync_binlog(&vars));
            out.push(isolation(&vars));
            out.push(lock_waits(&vars));
        }
        Err(e) => out.push(Check::fail("mysql settings", e)),
    }
    out.push(replication(&replicas(&mut conn).await));
    out.push(schema_version(&mut conn, db.name(), role).await);
    if let Some(role) = role {
        out.push(rights(&mut conn, db.name(), role).await);
    }
    drop(conn);
    (out, Some(db))
}

async fn connect(cfg: &Config) -> Result<(Db, Conn), String> {
    let db = Db::connect_unchecked(cfg)
        .await
        .map_err(|e| e.to_string())?;
    match db.conn().await {
        Ok(conn) => Ok((db, conn)),
        Err(e) => Err(e.to_string()),
    }
}

type Vars = HashMap<String, String>;

async fn variables(conn: &mut Conn) -> Result<Vars, String> {
    let rows: Vec<(String, String)> = conn
        .query(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('innodb_flush_log_at_trx_commit', \
             'log_bin', 'sync_binlog', 'tx_isolation', 'transaction_isolation', \
             'innodb_snapshot_isolation', 'innodb_lock_wait_timeout')",
        )
        .await
        .map_err(|e| describe_mysql(&e))?;
    Ok(rows
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect())
}

/// What the server says of its replicas: its status counters (MariaDB's
/// `Slaves_connected`, the semi-synchronous ones of either server), and on
/// MySQL, which has no such counter, `SHOW REPLICAS` (needs REPLICATION
/// SLAVE: refused, the count is unknown).
async fn replicas(conn: &mut Conn) -> Result<Vars, String> {
    let rows: Vec<(String, String)> = conn
        .query(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('Slaves_connected', \
             'Rpl_semi_sync_master_status', 'Rpl_semi_sync_master_clients', \
             'Rpl_semi_sync_source_status', 'Rpl_semi_sync_source_clients')",
        )
        .await
        .map_err(|e| describe_mysql(&e))?;
    let mut status: Vars = rows
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    if !status.contains_key("slaves_connected") {
        match conn.query::<mysql_async::Row, _>("SHOW REPLICAS").await {
            Ok(rows) => {
                status.insert("slaves_connected".into(), rows.len().to_string());
            }
            Err(e) => return Err(describe_mysql(&e)),
        }
    }
    Ok(status)
}

/// Replicas that may lack the last commits: a failover to one loses orders
/// the workers acknowledged (a restore of a backup does the same).
fn replication(status: &Result<Vars, String>) -> Check {
    let name = "mysql replication";
    let check = match status {
        Err(e) => Check::warn(name, format!("not readable: {e}")),
        Ok(status) => {
            let get = |a: &str, b: &str| status.get(a).or_else(|| status.get(b)).cloned();
            let replicas = status
                .get("slaves_connected")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            let semi_sync_on = get("rpl_semi_sync_master_status", "rpl_semi_sync_source_status")
                .is_some_and(|v| v.eq_ignore_ascii_case("ON"));
            let acknowledging = get(
                "rpl_semi_sync_master_clients",
                "rpl_semi_sync_source_clients",
            )
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
            match (replicas, semi_sync_on && acknowledging > 0) {
                (0, _) => Check::ok(name, "no replicas"),
                (n, true) => Check::ok(
                    name,
                    format!("{n} replica(s), semi-synchronous ({acknowledging} acknowledging)"),
                ),
                (n, false) => Check::warn(name, format!("{n} replica(s), asynchronous")),
            }
        }
    };
    check
        .why("an asynchronous replica may lack the last commits: a failover to it loses orders the workers committed and buyers were told they bought, and reconcile then counts those buyers as admissions that never reached MySQL")
        .fix("semi-synchronous replication: SET GLOBAL rpl_semi_sync_master_enabled = ON here and rpl_semi_sync_slave_enabled = ON on each replica (MySQL: the semisync plugins and rpl_semi_sync_source_enabled / rpl_semi_sync_replica_enabled), and in my.cnf; or fail over only to a replica that has every commit")
}

fn flush_log(vars: &Vars) -> Check {
    let name = "mysql innodb_flush_log_at_trx_commit";
    let value = vars
        .get("innodb_flush_log_at_trx_commit")
        .cloned()
        .unwrap_or_default();
    let check = if value == "1" {
        Check::ok(name, value)
    } else {
        Check::fail(name, value)
    };
    check
        .why("with 0 or 2 a commit is on disk only about once a second: a crash of the host loses orders the worker acknowledged, and the users were told they bought")
        .fix("SET GLOBAL innodb_flush_log_at_trx_commit = 1 (and in my.cnf)")
}

fn sync_binlog(vars: &Vars) -> Check {
    let name = "mysql sync_binlog";
    let log_bin = vars.get("log_bin").map(String::as_str).unwrap_or("OFF");
    let sync = vars.get("sync_binlog").cloned().unwrap_or_default();
    let check = if !log_bin.eq_ignore_ascii_case("ON") {
        Check::ok(name, "binary log off")
    } else if sync == "1" {
        Check::ok(name, "1, binary log on")
    } else {
        Check::fail(name, format!("{sync}, binary log on"))
    };
    check
        .why("a commit whose binary log event is not on disk is lost to replicas: after a crash and a failover to one, acknowledged orders are gone")
        .fix("SET GLOBAL sync_binlog = 1 (and in my.cnf)")
}

fn isolation(vars: &Vars) -> Check {
    let name = "mysql isolation";
    let level = vars
        .get("transaction_isolation")
        .or_else(|| vars.get("tx_isolation"))
        .cloned()
        .unwrap_or_default();
    let snapshot = vars
        .get("innodb_snapshot_isolation")
        .map(|v| format!(", innodb_snapshot_isolation {v}"))
        .unwrap_or_default();
    let found = format!("{level}{snapshot}");
    let check = match level.to_ascii_uppercase().as_str() {
        "REPEATABLE-READ" | "READ-COMMITTED" => Check::ok(name, found),
        "SERIALIZABLE" => Check::warn(name, found),
        _ => Check::fail(name, found),
    };
    check
        .why("the worker's dedupe reads must not see orders another transaction may still roll back (READ-UNCOMMITTED would let an order be skipped as stored and then lost); SERIALIZABLE turns every read into a locking one (more lock waits); reconcile sets REPEATABLE-READ for its own reads, and the worker retries the write conflicts innodb_snapshot_isolation reports")
        .fix("SET GLOBAL transaction_isolation = 'REPEATABLE-READ' (tx_isolation before MariaDB 11.1; and in my.cnf)")
}

/// Longer than this, a payment or a repair behind a stopped session waits
/// too long to be told anything (the worker bounds its own waits).
const LOCK_WAIT_BOUND_S: u64 = 50;

fn lock_waits(vars: &Vars) -> Check {
    let name = "mysql innodb_lock_wait_timeout";
    let value = vars
        .get("innodb_lock_wait_timeout")
        .cloned()
        .unwrap_or_default();
    let check = match value.parse::<u64>() {
        Ok(s) if s <= LOCK_WAIT_BOUND_S => Check::ok(name, format!("{s} s")),
        Ok(s) => Check::warn(name, format!("{s} s")),
        Err(_) => Check::warn(name, format!("unreadable: {value:?}")),
    };
    check
        .why(format!("a payment, a repair or `serve` waits this long behind a session that stopped holding a voucher's row before it is told anything (the worker sets its own shorter wait and fences a stopped holder); above {LOCK_WAIT_BOUND_S} s callers time out first"))
        .fix(format!("SET GLOBAL innodb_lock_wait_timeout = {LOCK_WAIT_BOUND_S} (the default) or less"))
}

async fn schema_version(conn: &mut Conn, db_name: &str, role: Option<Role>) -> Check {
    let name = "mysql schema";
    let known = schema::latest();
    let found = match schema::current_version(conn).await {
        Ok(v) => v.unwrap_or(0),
        Err(e) => {
            return Check::fail(name, e.to_string())
                .why("every command checks the schema version before it touches a table")
                .fix("run `seckill init`")
        }
    };
    let check = if found == known {
        Check::ok(name, format!("version {found} in {db_name}"))
    } else if found > known {
        Check::fail(
            name,
            format!("version {found} in {db_name}, newer than this binary's {known}"),
        )
        .fix("upgrade seckill on this host")
    } else {
        let what = if found == 0 {
            format!("{db_name} not initialised")
        } else {
            format!("version {found} in {db_name}, this binary needs {known}")
        };
        // Upgrading is the schema role's job: for it, an older schema is
        // the work ahead, not a fault.
        let check = if role == Some(Role::Schema) {
            Check::warn(name, what)
        } else {
            Check::fail(name, what)
        };
        check.fix("run `seckill init` (as the schema user)")
    };
    check.why("every command refuses a schema it does not know")
}

/// A statement the role runs, reduced to one that touches no row.
struct Probe {
    right: &'static str,
    sql: &'static str,
}

const fn probe(right: &'static str, sql: &'static str) -> Probe {
    Probe { right, sql }
}

const SELECT_ALL: [Probe; 3] = [
    probe(
        "SELECT on seckill_order",
        "SELECT 1 FROM seckill_order LIMIT 0",
    ),
    probe(
        "SELECT on seckill_voucher",
        "SELECT 1 FROM seckill_voucher LIMIT 0",
    ),
    probe(
        "SELECT on seckill_schema_history",
        "SELECT 1 FROM seckill_schema_history LIMIT 0",
    ),
];
const INSERT_ORDER: Probe = probe(
    "INSERT on seckill_order",
    "INSERT INTO seckill_order (id, user_id, voucher_id, create_time) \
     SELECT 1, 1, 1, NOW() FROM DUAL WHERE FALSE",
);
const INSERT_VOUCHER: Probe = probe(
    "INSERT on seckill_voucher",
    "INSERT INTO seckill_voucher (voucher_id, total_stock, stock, begin_time, end_time) \
     SELECT 1, 1, 1, NOW(), NOW() FROM DUAL WHERE FALSE",
);
const INSERT_HISTORY: Probe = probe(
    "INSERT on seckill_schema_history",
    "INSERT INTO seckill_schema_history (version, name) SELECT 0, '' FROM DUAL WHERE FALSE",
);
const UPDATE_ORDER: Probe = probe(
    "UPDATE on seckill_order",
    "UPDATE seckill_order SET status = 0 WHERE FALSE",
);
const PAYMENT_KEYS: [Probe; 4] = [
    probe(
        "SELECT on seckill_payment_key",
        "SELECT 1 FROM seckill_payment_key LIMIT 0",
    ),
    probe(
        "UPDATE on seckill_payment_key",
        "UPDATE seckill_payment_key SET outcome = NULL WHERE FALSE",
    ),
    probe(
        "INSERT on seckill_payment_key",
        "INSERT INTO seckill_payment_key (key_id, order_id, taken_at) \
         SELECT '', 1, NOW() FROM DUAL WHERE FALSE",
    ),
    probe(
        "DELETE on seckill_payment_key",
        "DELETE FROM seckill_payment_key WHERE FALSE",
    ),
];
const UPDATE_VOUCHER: Probe = probe(
    "UPDATE on seckill_voucher",
    "UPDATE seckill_voucher SET stock = 0 WHERE FALSE",
);

fn probes(role: Role) -> Vec<Probe> {
    let mut all: Vec<Probe> = SELECT_ALL.into();
    match role {
        Role::Worker => all.extend([INSERT_ORDER, UPDATE_ORDER, UPDATE_VOUCHER]),
        Role::Serve => {
            all.extend([INSERT_ORDER, UPDATE_ORDER, UPDATE_VOUCHER]);
            all.extend(PAYMENT_KEYS);
        }
        Role::Operator => all.extend([INSERT_VOUCHER, UPDATE_VOUCHER, UPDATE_ORDER]),
        // A migration records itself and may count orders into the
        // voucher rows.
        Role::Schema => all.extend([INSERT_HISTORY, UPDATE_VOUCHER]),
    }
    all
}

/// The rights `contrib/mysql-grants.sql` gives the role, each tried with a
/// statement that matches no row, in a transaction rolled back.
async fn rights(conn: &mut Conn, db_name: &str, role: Role) -> Check {
    let check = format!("mysql rights ({})", role.name());
    let mut denied = Vec::new();
    let mut untried = Vec::new();
    if role == Role::Schema {
        match schema_rights_missing(conn, db_name).await {
            Ok(missing) => denied.extend(missing),
            Err(e) => return Check::fail(check, e),
        }
    }
    let tried = probes(role);
    let schema_missing = matches!(schema::current_version(conn).await, Ok(None));
    if !(role == Role::Schema && schema_missing) {
        if let Err(e) = conn.query_drop("START TRANSACTION").await {
            return Check::fail(check, describe_mysql(&e));
        }
        for p in &tried {
            match conn.query_drop(p.sql).await {
                Ok(()) => {}
                Err(e) if is_denied(&e) => denied.push(p.right.to_string()),
                Err(e) => untried.push(format!("{} ({})", p.right, describe_mysql(&e))),
            }
        }
        if let Err(e) = conn.query_drop("ROLLBACK").await {
            return Check::fail(check, describe_mysql(&e));
        }
    }
    let found = match (denied.is_empty(), untried.is_empty()) {
        (true, true) => {
            return Check::ok(
                check,
                format!("all {} rights of the role held", tried.len()),
            )
        }
        (false, true) => format!("missing: {}", denied.join(", ")),
        (true, false) => format!("not tried: {}", untried.join("; ")),
        (false, false) => format!(
            "missing: {}; not tried: {}",
            denied.join(", "),
            untried.join("; ")
        ),
    };
    Check::new(check, Status::Fail, found)
        .why(format!(
            "the {} runs these statements; a right missing is found only when one is refused",
            role.name()
        ))
        .fix("GRANT the role's rights in contrib/mysql-grants.sql")
}

/// MySQL's refusals of a right: on a table, a column, a database.
fn is_denied(e: &mysql_async::Error) -> bool {
    use crate::error::mysql_codes::{COLUMN_ACCESS_DENIED, DB_ACCESS_DENIED, TABLE_ACCESS_DENIED};
    matches!(
        crate::error::mysql_code(e),
        Some(DB_ACCESS_DENIED | TABLE_ACCESS_DENIED | COLUMN_ACCESS_DENIED)
    )
}

/// `seckill init` creates and alters tables: rights read from the
/// privilege tables, since trying them would change the schema.
async fn schema_rights_missing(conn: &mut Conn, db_name: &str) -> Result<Vec<String>, String> {
    // information_schema names a grantee 'user'@'host'.
    conn.query_drop(
        "SET @doctor_me = CONCAT(QUOTE(SUBSTRING_INDEX(CURRENT_USER(), '@', 1)), '@', \
         QUOTE(SUBSTRING_INDEX(CURRENT_USER(), '@', -1)))",
    )
    .await
    .map_err(|e| describe_mysql(&e))?;
    // This user's own grants (a user who may read the grant tables sees
    // everyone's), global or on a database pattern the name matches.
    let held: Vec<String> = conn
        .exec(
            "SELECT privilege_type FROM information_schema.user_privileges \
             WHERE grantee = @doctor_me \
             UNION SELECT privilege_type FROM information_schema.schema_privileges \
             WHERE grantee = @doctor_me AND ? LIKE table_schema",
            (db_name,),
        )
        .await
        .map_err(|e| describe_mysql(&e))?;
    Ok(["CREATE", "ALTER", "INDEX"]
        .into_iter()
        .filter(|r| !held.iter().any(|h| h.eq_ignore_ascii_case(r)))
        .map(|r| format!("{r} on {db_name}.*"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vars {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_binary_log_counts_only_when_it_is_on() {
        assert_eq!(
            sync_binlog(&vars(&[("log_bin", "OFF"), ("sync_binlog", "0")])).status,
            Status::Ok
        );
        assert_eq!(
            sync_binlog(&vars(&[("log_bin", "ON"), ("sync_binlog", "0")])).status,
            Status::Fail
        );
        assert_eq!(
            sync_binlog(&vars(&[("log_bin", "ON"), ("sync_binlog", "1")])).status,
            Status::Ok
        );
    }

    #[test]
    fn replicas_count_only_when_asynchronous() {
        let judge = |pairs: &[(&str, &str)]| {
            let c = replication(&Ok(vars(pairs)));
            (c.status, c.found)
        };
        assert_eq!(
            judge(&[("slaves_connected", "0")]),
            (Status::Ok, "no replicas".into())
        );
        assert_eq!(
            judge(&[
                ("slaves_connected", "2"),
                ("rpl_semi_sync_master_status", "OFF")
            ]),
            (Status::Warn, "2 replica(s), asynchronous".into())
        );
        // Enabled, yet fallen back to asynchronous: no replica acknowledges.
        assert_eq!(
            judge(&[
                ("slaves_connected", "1"),
                ("rpl_semi_sync_master_status", "ON"),
                ("rpl_semi_sync_master_clients", "0")
            ])
            .0,
            Status::Warn
        );
        assert_eq!(
            judge(&[
                ("slaves_connected", "1"),
                ("rpl_semi_sync_source_status", "ON"),
                ("rpl_semi_sync_source_clients", "1")
            ]),
            (
                Status::Ok,
                "1 replica(s), semi-synchronous (1 acknowledging)".into()
            )
        );
        assert_eq!(replication(&Err("denied".into())).status, Status::Warn);
    }

    #[test]
    fn isolation_levels_are_judged_by_what_the_worker_reads() {
        let level = |l| isolation(&vars(&[("tx_isolation", l)])).status;
        assert_eq!(level("REPEATABLE-READ"), Status::Ok);
        assert_eq!(level("READ-COMMITTED"), Status::Ok);
        assert_eq!(level("SERIALIZABLE"), Status::Warn);
        assert_eq!(level("READ-UNCOMMITTED"), Status::Fail);
    }
}
