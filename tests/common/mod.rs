//! Test support: every test gets its own Redis key prefix and its own MySQL
//! database on the project's services (`scripts/services.sh up`), so tests
//! run in parallel without seeing each other. Nothing is mocked.
#![allow(dead_code)]

pub mod invariants;
pub mod process;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mysql_async::prelude::*;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use seckill::orders::voucher::{self, NewVoucher};
use seckill::store::config::{Config, DEFAULT_MYSQL_URL, DEFAULT_REDIS_URL};
use seckill::store::db::Db;
use seckill::support::timespec::now_ms;

static COUNTER: AtomicU64 = AtomicU64::new(0);
static NODE: AtomicU64 = AtomicU64::new(1);

/// Worker flags for tests: short claim, block, lease and deadline lease, so
/// crashes and takeovers play out in a second, followed by `extra`.
pub fn fast_worker<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--claim-idle",
        "500ms",
        "--block",
        "200ms",
        "--lock-lease",
        "1s",
        "--deadline-lease",
        "1s",
    ];
    a.extend_from_slice(extra);
    a
}

pub fn redis_url() -> String {
    std::env::var("SECKILL_TEST_REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_string())
}

fn mysql_base_url() -> String {
    std::env::var("SECKILL_TEST_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.to_string())
}

/// The base MySQL URL pointed at another database.
pub fn mysql_url_for(db_name: &str) -> String {
    let mut url = url::Url::parse(&mysql_base_url()).expect("SECKILL_TEST_MYSQL_URL parses");
    url.set_path(&format!("/{db_name}"));
    url.to_string()
}

pub struct TestEnv {
    pub cfg: Config,
    pub prefix: String,
    pub db_name: String,
}

impl TestEnv {
    /// A fresh prefix and a fresh, migrated database.
    pub async fn new() -> TestEnv {
        let env = Self::uninitialised().await;
        let db = Db::connect_for_init(&env.cfg)
            .await
            .expect("create test database");
        let mut conn = db.conn().await.expect("mysql connection");
        seckill::store::schema::migrate(&mut conn)
            .await
            .expect("migrate");
        drop(conn);
        db.close().await;
        env
    }

    /// A fresh prefix and a database name that does not exist yet.
    pub async fn uninitialised() -> TestEnv {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let id = format!(
            "{}_{}_{}",
            std::process::id(),
            nanos % 1_000_000,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let db_name = format!("seckill_t{id}");
        let prefix = format!("t{id}");
        let cfg = Config {
            redis_url: redis_url(),
            mysql_url: mysql_url_for(&db_name),
            prefix: prefix.clone(),
            connect_timeout: Duration::from_secs(5),
        };
        TestEnv {
            cfg,
            prefix,
            db_name,
        }
    }

    pub async fn redis(&self) -> MultiplexedConnection {
        seckill::store::redis_conn::connect(&self.cfg)
            .await
            .expect("test Redis is up (scripts/services.sh up)")
    }

    pub async fn db(&self) -> Db {
        Db::connect(&self.cfg)
            .await
            .expect("test MySQL is up and migrated")
    }

    /// The real binary, pointed at this test's stores.
    pub fn cmd(&self) -> assert_cmd::Command {
        let mut c = assert_cmd::Command::cargo_bin("seckill").expect("binary built");
        c.env("SECKILL_REDIS_URL", &self.cfg.redis_url)
            .env("SECKILL_MYSQL_URL", &self.cfg.mysql_url)
            .env("SECKILL_PREFIX", &self.prefix)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .env_remove("SECKILL_NODE_ID")
            .timeout(Duration::from_secs(120));
        c
    }

    /// Adds a voucher whose sale window is [now + begin_offset_ms, now + end_offset_ms).
    pub async fn add_voucher(&self, id: u64, stock: i64, begin_offset_ms: i64, end_offset_ms: i64) {
        self.add_voucher_paying_within(
            id,
            stock,
            begin_offset_ms,
            end_offset_ms,
            voucher::DEFAULT_PAY_TIMEOUT_MS,
        )
        .await
    }

    /// A live voucher (open for an hour) whose orders must be paid within
    /// `pay_timeout_ms`, preloaded.
    pub async fn live_voucher_paying_within(&self, id: u64, stock: i64, pay_timeout_ms: i64) {
        self.add_voucher_paying_within(id, stock, -1_000, 3_600_000, pay_timeout_ms)
            .await;
        self.preload(id).await;
    }

    pub async fn add_voucher_paying_within(
        &self,
        id: u64,
        stock: i64,
        begin_offset_ms: i64,
        end_offset_ms: i64,
        pay_timeout_ms: i64,
    ) {
        let now = now_ms();
        let db = self.db().await;
        voucher::add(
            &db,
            &NewVoucher {
                id,
                title: format!("test voucher {id}"),
                stock,
                begin_ms: now + begin_offset_ms,
                end_ms: now + end_offset_ms,
                pay_timeout_ms,
            },
        )
        .await
        .expect("add voucher");
        db.close().await;
    }

    /// Adds a live voucher (open for an hour) and preloads it.
    pub async fn live_voucher(&self, id: u64, stock: i64) {
        self.add_voucher(id, stock, -1_000, 3_600_000).await;
        self.preload(id).await;
    }

    pub async fn preload(&self, id: u64) {
        let db = self.db().await;
        let mut redis = self.redis().await;
        seckill::gate::preload::preload(&db, &mut redis, &self.prefix, id, false)
            .await
            .expect("preload");
        db.close().await;
    }

    /// Every key under this test's prefix.
    pub async fn prefix_keys(&self, redis: &mut MultiplexedConnection) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        let mut iter: redis::AsyncIter<String> = redis
            .scan_match(format!("{}:*", self.prefix))
            .await
            .expect("scan");
        while let Some(k) = iter.next_item().await {
            keys.push(k.expect("scan item"));
        }
        keys
    }

    /// Every key of this test's prefix with a dump of its value, and every
    /// table of its database with a checksum: equal snapshots mean nothing
    /// was written.
    pub async fn snapshot(&self) -> Snapshot {
        let mut redis = self.redis().await;
        let keys = self.prefix_keys(&mut redis).await;
        let mut redis_state = BTreeMap::new();
        for k in keys {
            let dump: Vec<u8> = redis::cmd("DUMP")
                .arg(&k)
                .query_async(&mut redis)
                .await
                .expect("dump");
            redis_state.insert(k, dump);
        }
        let mut tables = BTreeMap::new();
        if let Ok(db) = Db::connect(&self.cfg).await {
            let mut conn = db.conn().await.expect("mysql connection");
            let names: Vec<String> = conn.query("SHOW TABLES").await.expect("show tables");
            for t in names {
                let row: Option<(String, Option<i64>)> = conn
                    .query_first(format!("CHECKSUM TABLE `{t}`"))
                    .await
                    .expect("checksum");
                tables.insert(t, row.and_then(|r| r.1));
            }
            drop(conn);
            db.close().await;
        }
        Snapshot {
            redis: redis_state,
            tables,
        }
    }

    /// Drops the database and the prefix's keys.
    pub async fn cleanup(self) {
        let mut redis = self.redis().await;
        let keys = self.prefix_keys(&mut redis).await;
        for chunk in keys.chunks(500) {
            let _: () = redis.del(chunk).await.expect("del");
        }
        let admin = Config {
            mysql_url: mysql_url_for("mysql"),
            ..self.cfg.clone()
        };
        if let Ok(db) = Db::connect_for_init(&admin).await {
            if let Ok(mut conn) = db.conn().await {
                conn.query_drop(format!("DROP DATABASE IF EXISTS `{}`", self.db_name))
                    .await
                    .ok();
            }
            db.close().await;
        }
    }
}

impl TestEnv {
    /// Admits `users` distinct users (ids offset+1 ..= offset+users), once each.
    pub async fn admit_users(
        &self,
        voucher: u64,
        users: u64,
        offset: u64,
    ) -> seckill::gate::bench::BenchReport {
        self.sale_in_background(voucher, users, offset, users, 64)
            .await
            .expect("admissions")
    }

    /// `attempts` admissions by `users` users (offset+1 ..), `concurrency`
    /// at a time, running while the test does other things.
    pub fn sale_in_background(
        &self,
        voucher: u64,
        users: u64,
        offset: u64,
        attempts: u64,
        concurrency: usize,
    ) -> tokio::task::JoinHandle<seckill::gate::bench::BenchReport> {
        let cfg = self.cfg.clone();
        let plan = seckill::gate::bench::BenchPlan {
            voucher,
            users,
            user_offset: offset,
            attempts,
            concurrency,
            connections: concurrency.clamp(1, 4),
            // A node id per sale: two sales at once never mint one order id.
            node_id: (NODE.fetch_add(1, Ordering::Relaxed) % 1024) as u16,
        };
        tokio::spawn(async move {
            seckill::gate::bench::run(&cfg, &plan, Default::default())
                .await
                .expect("admissions")
        })
    }

    /// Entries of the voucher's stream not yet persisted (undelivered + pending).
    pub async fn in_flight(&self, voucher: u64) -> u64 {
        let keys = seckill::store::keys::VoucherKeys::new(&self.prefix, voucher).unwrap();
        let mut redis = self.redis().await;
        seckill::stream::backlog::backlog(&mut redis, &keys)
            .await
            .expect("backlog")
            .in_flight()
    }

    /// Waits until nothing is in flight for the voucher.
    pub async fn wait_drained(&self, voucher: u64, limit: Duration) {
        let start = std::time::Instant::now();
        while self.in_flight(voucher).await > 0 {
            assert!(
                start.elapsed() < limit,
                "voucher {voucher} not drained within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Has `consumer` read up to `count` new entries of the voucher's stream
    /// (creating the group) and never acknowledge them: a worker that died.
    pub async fn read_as(&self, voucher: u64, consumer: &str, count: usize) {
        let keys = seckill::store::keys::VoucherKeys::new(&self.prefix, voucher).unwrap();
        let mut redis = self.redis().await;
        seckill::worker::group::ensure_group(&mut redis, &keys)
            .await
            .unwrap();
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(seckill::store::keys::WORKER_GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(keys.orders())
            .arg(">")
            .query_async(&mut redis)
            .await
            .unwrap();
    }

    /// Waits until MySQL holds at least `at_least` orders of the voucher.
    pub async fn wait_orders(&self, voucher: u64, at_least: u64, limit: Duration) {
        let start = std::time::Instant::now();
        loop {
            let n = self.order_count(voucher).await;
            if n >= at_least {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "only {n} orders of voucher {voucher} after {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// (order id, user, status) of every order of the voucher.
    pub async fn orders(&self, voucher: u64) -> Vec<(u64, u64, i8)> {
        let db = self.db().await;
        let mut conn = db.conn().await.expect("mysql");
        let rows: Vec<(u64, u64, i8)> = conn
            .exec(
                "SELECT id, user_id, status FROM seckill_order WHERE voucher_id = ? ORDER BY id",
                (voucher,),
            )
            .await
            .expect("read orders");
        drop(conn);
        db.close().await;
        rows
    }

    /// Waits until no order of the voucher is pending any more.
    pub async fn wait_settled(&self, voucher: u64, limit: Duration) {
        let start = std::time::Instant::now();
        loop {
            let pending = self
                .orders(voucher)
                .await
                .iter()
                .filter(|o| o.2 == 0)
                .count();
            if pending == 0 {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "{pending} orders still pending after {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn order_count(&self, voucher: u64) -> u64 {
        let db = self.db().await;
        let mut conn = db.conn().await.expect("mysql");
        let n: Option<u64> = conn
            .exec_first(
                "SELECT COUNT(*) FROM seckill_order WHERE voucher_id = ?",
                (voucher,),
            )
            .await
            .expect("count orders");
        drop(conn);
        db.close().await;
        n.unwrap_or(0)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub redis: BTreeMap<String, Vec<u8>>,
    pub tables: BTreeMap<String, Option<i64>>,
}
