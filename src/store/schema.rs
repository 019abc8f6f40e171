//! Versioned, idempotent schema migrations. Table and column names follow the
//! original Java design (`seckill_voucher`, `seckill_order`) so a team can point
//! this tool at its existing tables. Every statement runs on MySQL 8 and
//! MariaDB 10.11 alike.

use mysql_async::prelude::*;
use mysql_async::Conn;

use crate::error::{mysql_codes, Error, Result};

pub struct Migration {
    pub version: u32,
    pub name: &'static str,
    pub statements: &'static [&'static str],
}

pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "vouchers and orders",
    statements: &[
        "CREATE TABLE IF NOT EXISTS seckill_voucher (
            voucher_id      BIGINT       NOT NULL PRIMARY KEY,
            title           VARCHAR(255) NOT NULL DEFAULT '',
            total_stock     INT          NOT NULL,
            stock           INT          NOT NULL,
            begin_time      DATETIME(3)  NOT NULL,
            end_time        DATETIME(3)  NOT NULL,
            pay_timeout_ms  BIGINT       NOT NULL DEFAULT 900000,
            create_time     DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            update_time     DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
            CONSTRAINT chk_voucher_stock CHECK (stock >= 0 AND stock <= total_stock),
            CONSTRAINT chk_voucher_window CHECK (begin_time < end_time)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        // status: 0 pending payment, 1 paid, -1 cancelled (payment timeout).
        "CREATE TABLE IF NOT EXISTS seckill_order (
            id              BIGINT       NOT NULL PRIMARY KEY COMMENT 'snowflake order id',
            user_id         BIGINT       NOT NULL,
            voucher_id      BIGINT       NOT NULL,
            status          TINYINT      NOT NULL DEFAULT 0 COMMENT '0 pending, 1 paid, -1 cancelled',
            create_time     DATETIME(3)  NOT NULL,
            pay_time        DATETIME(3)  NULL,
            cancel_time     DATETIME(3)  NULL,
            update_time     DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
            UNIQUE KEY uk_order_user_voucher (user_id, voucher_id),
            KEY idx_order_voucher_status (voucher_id, status, create_time)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
    ],
},
Migration {
    version: 2,
    name: "admission policy",
    statements: &[
        // user_rate: attempts per user per second at the gate (0: no limit);
        // require_token: admission needs a token issued for the user.
        "ALTER TABLE seckill_voucher
            ADD COLUMN user_rate INT NOT NULL DEFAULT 0,
            ADD COLUMN require_token TINYINT NOT NULL DEFAULT 0",
    ],
},
Migration {
    version: 3,
    name: "policy version",
    statements: &[
        // policy_version: raised by one in every UPDATE of the policy, so
        // the gate can refuse a policy older than the one it holds (two
        // `voucher update`s publishing out of order). update_time cannot
        // serve: two updates may share its millisecond, and a clock that
        // steps back makes it go backwards.
        "ALTER TABLE seckill_voucher
            ADD COLUMN policy_version BIGINT NOT NULL DEFAULT 0",
    ],
},
Migration {
    version: 4,
    name: "quantities",
    statements: &[
        // quantity: the units an order holds (one order per user and
        // voucher, of 1 ..= the voucher's per-user limit units).
        // No CHECK constraint: adding one copies the table, and this one
        // may hold millions of orders; the writers check instead.
        "ALTER TABLE seckill_order ADD COLUMN quantity INT NOT NULL DEFAULT 1",
        // per_user_limit: the most units one user may hold; waitlist_limit:
        // the most requests that may wait (NULL: no cap).
        "ALTER TABLE seckill_voucher
            ADD COLUMN per_user_limit INT NOT NULL DEFAULT 1,
            ADD COLUMN waitlist_limit INT NULL",
    ],
},
Migration {
    version: 5,
    name: "order counters",
    statements: &[
        // What the voucher's orders add up to, kept by the transactions that
        // change them (persist, cancel, pay), so a reader that runs every
        // second (the gate guard, status) reads one row instead of counting
        // millions. Pending = total - paid - cancelled. The digests
        // (support/set_digest.rs) of the users, the pending orders and the
        // cancelled ones let reconcile compare the sets with the gate's
        // without reading them. `reconcile --deep` checks all of them
        // against the rows (counters_drift).
        "ALTER TABLE seckill_voucher
            ADD COLUMN orders_total BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN units_total BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN orders_paid BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN units_paid BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN orders_cancelled BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN units_cancelled BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN users_digest BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN pending_digest BIGINT NOT NULL DEFAULT 0,
            ADD COLUMN cancelled_digest BIGINT NOT NULL DEFAULT 0",
        // The orders already there. Run again after a crash, it counts
        // again. Orders an older binary commits after this are not
        // counted: upgrade every worker, then `seckill reconcile --yes`.
        crate::store::counter_sql::RECOUNT_ALL,
    ],
},
Migration {
    version: 6,
    name: "stock buckets",
    statements: &[
        // buckets: how many gates the voucher's stock is split over (1:
        // one gate, the layout before buckets). bucket_tags: each bucket's
        // hash tag, space-separated, bucket 0's (the voucher id) first,
        // chosen by the first preload and kept (a reshard moves slots,
        // never a bucket's keys); '' until then. A user's bucket follows
        // from the user id and `buckets` (gate/buckets.rs), so orders need
        // no column of their own, and `buckets` cannot change once the
        // voucher is loaded.
        "ALTER TABLE seckill_voucher
            ADD COLUMN buckets INT NOT NULL DEFAULT 1,
            ADD COLUMN bucket_tags VARCHAR(2048) NOT NULL DEFAULT ''",
    ],
},
Migration {
    version: 7,
    name: "held orders",
    statements: &[
        // held = 1: a pending order reconcile restored after MySQL lost it,
        // whose payment deadline Redis no longer had (paid, or cancelled
        // in MySQL, before the loss: only the payment provider can tell).
        // No deadline is scheduled for it, so nothing cancels it on its
        // own; the operator settles it (`seckill pay`, or `seckill order
        // unhold` to let its deadline run). The index counts them cheaply.
        "ALTER TABLE seckill_order
            ADD COLUMN held TINYINT NOT NULL DEFAULT 0,
            ADD KEY idx_order_held (held, status)",
    ],
},
Migration {
    version: 8,
    name: "payment idempotency keys",
    statements: &[
        // An Idempotency-Key on a payment (src/orders/payment_key.rs):
        // key_id is the SHA-256 (hex) of the key's scope and the key, never
        // the key; outcome the answer once given (NULL while pending);
        // taken_at in UTC.
        // Rows past the key's lifetime are deleted by later keyed payments.
        "CREATE TABLE IF NOT EXISTS seckill_payment_key (
            key_id      CHAR(64)     NOT NULL PRIMARY KEY,
            order_id    BIGINT       NOT NULL,
            outcome     VARCHAR(32)  NULL,
            taken_at    DATETIME(3)  NOT NULL,
            KEY idx_payment_key_taken (taken_at)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        // pay_key: the key_id of the keyed payment that paid the order,
        // set by the payment's own statement: a resend whose first answer
        // was lost finds its payment here. NULL for payments without a key.
        // Added at the end of the row, an instant change on MariaDB 10.3+
        // and MySQL 8.0.12+.
        "ALTER TABLE seckill_order ADD COLUMN pay_key CHAR(64) NULL",
    ],
},
Migration {
    version: 9,
    name: "client references",
    statements: &[
        // The caller's own name for the purchase (src/orders/reference.rs):
        // 1..=64 printable ASCII characters, NULL without one. Written by
        // the worker's insert from the stream entry's `ref`; at the end of
        // the row, an instant change as pay_key's.
        "ALTER TABLE seckill_order ADD COLUMN client_reference VARCHAR(64) NULL",
    ],
}];

pub fn latest() -> u32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

const CREATE_HISTORY: &str = "CREATE TABLE IF NOT EXISTS seckill_schema_history (
    version     INT          NOT NULL PRIMARY KEY,
    name        VARCHAR(255) NOT NULL,
    applied_at  DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/// The applied schema version, or `None` when the database was never initialised.
pub async fn current_version(conn: &mut Conn) -> Result<Option<u32>> {
    match conn
        .query_first::<Option<u32>, _>("SELECT MAX(version) FROM seckill_schema_history")
        .await
    {
        Ok(v) => Ok(Some(v.flatten().unwrap_or(0))),
        Err(e) if crate::error::mysql_code(&e) == Some(mysql_codes::NO_SUCH_TABLE) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Fails unless the schema is exactly the version this binary knows.
pub async fn ensure_current(conn: &mut Conn, db: &str) -> Result<()> {
    let known = latest();
    match current_version(conn).await? {
        None | Some(0) => Err(Error::NotInitialised(db.to_string())),
        Some(v) if v < known => Err(Error::SchemaOutdated {
            db: db.to_string(),
            found: v,
            needed: known,
        }),
        Some(v) if v > known => Err(Error::SchemaTooNew {
            db: db.to_string(),
            found: v,
            known,
        }),
        Some(_) => Ok(()),
    }
}

#[derive(Debug, serde::Serialize)]
pub struct MigrateReport {
    pub from: u32,
    pub to: u32,
    pub applied: Vec<String>,
}

/// Applies the missing migrations in order. Two `seckill init` at once are
/// serialised by a named lock, and each statement is idempotent on its own,
/// so a crash halfway is finished by the next run.
pub async fn migrate(conn: &mut Conn) -> Result<MigrateReport> {
    let locked: Option<i64> = conn
        .query_first("SELECT GET_LOCK('seckill_schema_migrate', 60)")
        .await?;
    if locked != Some(1) {
        return Err(Error::mysql(
            "another `seckill init` holds the migration lock; try again",
        ));
    }
    let result = apply_missing(conn).await;
    conn.query_drop("DO RELEASE_LOCK('seckill_schema_migrate')")
        .await
        .ok();
    result
}

async fn apply_missing(conn: &mut Conn) -> Result<MigrateReport> {
    conn.query_drop(CREATE_HISTORY).await?;
    let from = current_version(conn).await?.unwrap_or(0);
    if from > latest() {
        return Err(Error::SchemaTooNew {
            db: String::from("(current)"),
            found: from,
            known: latest(),
        });
    }
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| m.version > from) {
        for sql in m.statements {
            match conn.query_drop(*sql).await {
                // A column a crashed run added already: MySQL commits each
                // ALTER on its own, before the history row.
                Err(e) if crate::error::mysql_code(&e) == Some(mysql_codes::DUP_FIELDNAME) => {}
                other => other?,
            }
        }
        conn.exec_drop(
            "INSERT INTO seckill_schema_history (version, name) VALUES (?, ?)",
            (m.version, m.name),
        )
        .await?;
        applied.push(format!("{} {}", m.version, m.name));
    }
    Ok(MigrateReport {
        from,
        to: latest(),
        applied,
    })
}
