//! Test support: every test gets its own Redis key prefix and its own MySQL
//! database on the project's services (`scripts/services.sh up`), so tests
//! run in parallel without seeing each other. Nothing is mocked.
#![allow(dead_code)]

pub mod clock;
pub mod fault_proxy;
pub mod invariants;
pub mod mysql_dump;
pub mod own_cluster;
pub mod own_mysql;
pub mod own_redis;
pub mod process;
pub mod rights;
pub mod serve_proc;
pub mod terminal;
pub mod tls;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mysql_async::prelude::*;
use redis::AsyncCommands;
use seckill::orders::voucher::{self, NewVoucher};
use seckill::store::config::{Config, DEFAULT_MYSQL_URL, DEFAULT_REDIS_URL};
use seckill::store::db::Db;
use seckill::store::redis_conn::{Redis, RedisConn};
use seckill::support::timespec::now_ms;
use serde_json::Value;
use tokio::sync::OnceCell;

static COUNTER: AtomicU64 = AtomicU64::new(0);

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

/// The project's test cluster (`scripts/services.sh up cluster`): its
/// masters as seed nodes.
pub fn cluster_url() -> String {
    std::env::var("SECKILL_TEST_CLUSTER_URL").unwrap_or_else(|_| {
        "redis://127.0.0.1:17001/,redis://127.0.0.1:17002/,redis://127.0.0.1:17003/".to_string()
    })
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

/// The worker's Prometheus page on `port`, with the HTTP head.
/// An HTTP client for the tests' servers: statuses are answers, not
/// errors, and nothing waits longer than 30 s.
pub fn http_agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// Polls `done` until it holds, failing the test after `seconds`.
pub fn within_seconds(seconds: u64, what: &str, mut done: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(seconds);
    while !done() {
        assert!(
            std::time::Instant::now() < until,
            "not within {seconds} s: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A port nothing listens on right now (for a server or endpoint a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub async fn scrape_metrics(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the metrics port answers");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("send the request");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("read the page");
    body
}

/// A command's stdout as JSON, failing with everything it printed.
pub fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// One test's stores. Dropping it drops its database and deletes its keys,
/// also when the test panics (`cleanup()` does the same on the test's own
/// runtime, and then the drop has nothing left to do).
pub struct TestEnv {
    pub cfg: Config,
    pub prefix: String,
    pub db_name: String,
    /// One pool and one Redis connection for the test's own reads, made on
    /// first use (after the test may have pointed `cfg` elsewhere).
    shared_db: OnceCell<Db>,
    shared_redis: OnceCell<Redis>,
    cleaned: bool,
}

impl TestEnv {
    /// A fresh prefix and a fresh, migrated database.
    pub async fn new() -> TestEnv {
        let env = Self::uninitialised().await;
        env.create_database().await;
        env
    }

    /// Like `new`, with Redis being the test cluster.
    pub async fn on_cluster() -> TestEnv {
        Self::on_redis(&cluster_url()).await
    }

    /// Like `new`, with Redis at `url` (a node or a cluster's seeds).
    pub async fn on_redis(url: &str) -> TestEnv {
        let mut env = Self::uninitialised().await;
        env.cfg.redis_url = url.to_string();
        env.create_database().await;
        env
    }

    /// Creates and migrates the database `cfg` names.
    pub async fn create_database(&self) {
        let db = Db::connect_for_init(&self.cfg)
            .await
            .expect("create test database");
        let mut conn = db.conn().await.expect("mysql connection");
        seckill::store::schema::migrate(&mut conn)
            .await
            .expect("migrate");
        drop(conn);
        db.close().await;
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
            ..Config::default()
        };
        TestEnv {
            cfg,
            prefix,
            db_name,
            shared_db: OnceCell::new(),
            shared_redis: OnceCell::new(),
            cleaned: false,
        }
    }

    /// The test's Redis connection (multiplexed: a clone shares it).
    pub async fn redis(&self) -> Redis {
        self.shared_redis
            .get_or_init(|| self.new_redis_connection())
            .await
            .clone()
    }

    /// Drops the shared connection (a single node's does not reconnect
    /// after its server restarted); the next `redis()` makes a new one.
    pub fn forget_redis(&mut self) {
        self.shared_redis = OnceCell::new();
    }

    /// A connection of its own, for tests that need several.
    pub async fn new_redis_connection(&self) -> Redis {
        seckill::store::redis_conn::connect(&self.cfg)
            .await
            .expect("test Redis is up (scripts/services.sh up)")
    }

    /// The test's MySQL pool (closed by `cleanup` or the drop, not by callers).
    pub async fn db(&self) -> &Db {
        self.try_db().await.expect("test MySQL is up and migrated")
    }

    /// The pool, or None while the database is missing or not migrated.
    pub async fn try_db(&self) -> Option<&Db> {
        self.shared_db
            .get_or_try_init(|| Db::connect(&self.cfg))
            .await
            .ok()
    }

    /// `seckill reconcile --settle 0s --format json` with `extra`: its exit
    /// code (-1: killed) and its report.
    pub fn reconcile_json(&self, extra: &[&str]) -> (i32, Value) {
        let out = self
            .cmd()
            .args(["reconcile", "--settle", "0s", "--format", "json"])
            .args(extra)
            .output()
            .expect("run seckill reconcile");
        (out.status.code().unwrap_or(-1), json(&out))
    }

    /// `seckill buy --voucher V --user U`'s exit code (None: killed).
    pub fn buy_exit(&self, voucher: u64, user: &str) -> Option<i32> {
        self.cmd()
            .args(["buy", "--voucher", &voucher.to_string(), "--user", user])
            .output()
            .expect("run seckill buy")
            .status
            .code()
    }

    /// The real binary, pointed at this test's stores.
    pub fn cmd(&self) -> assert_cmd::Command {
        let mut c = assert_cmd::Command::cargo_bin("seckill").expect("binary built");
        c.envs(self.store_env())
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .env_remove("SECKILL_NODE_ID")
            .timeout(Duration::from_secs(120));
        c
    }

    /// The environment that points the binary at this test's stores,
    /// TLS settings included.
    pub fn store_env(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            ("SECKILL_REDIS_URL", self.cfg.redis_url.clone()),
            ("SECKILL_MYSQL_URL", self.cfg.mysql_url.clone()),
            ("SECKILL_PREFIX", self.prefix.clone()),
        ];
        let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let files = [
            ("SECKILL_REDIS_CA_CERT", path(&self.cfg.redis_tls.ca_cert)),
            (
                "SECKILL_REDIS_CLIENT_CERT",
                path(&self.cfg.redis_tls.client_cert),
            ),
            (
                "SECKILL_REDIS_CLIENT_KEY",
                path(&self.cfg.redis_tls.client_key),
            ),
            ("SECKILL_MYSQL_CA_CERT", path(&self.cfg.mysql_tls.ca_cert)),
            (
                "SECKILL_MYSQL_CLIENT_CERT",
                path(&self.cfg.mysql_tls.client_cert),
            ),
            (
                "SECKILL_MYSQL_CLIENT_KEY",
                path(&self.cfg.mysql_tls.client_key),
            ),
        ];
        for (k, v) in files {
            if let Some(v) = v {
                vars.push((k, v));
            }
        }
        use seckill::store::config::SslMode;
        let mode = match self.cfg.mysql_ssl_mode {
            SslMode::Disabled => "disabled",
            SslMode::Preferred => "preferred",
            SslMode::Required => "required",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyIdentity => "verify-identity",
        };
        vars.push(("SECKILL_MYSQL_SSL_MODE", mode.to_string()));
        vars
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
        voucher::add(
            self.db().await,
            &NewVoucher {
                id,
                title: format!("test voucher {id}"),
                stock,
                begin_ms: now + begin_offset_ms,
                end_ms: now + end_offset_ms,
                pay_timeout_ms,
                policy: Default::default(),
                buckets: 1,
            },
        )
        .await
        .expect("add voucher");
    }

    /// Adds a live voucher (open for an hour) and preloads it.
    /// After a test changed a gate set by hand (simulating a write Redis
    /// lost), the set's digest in meta as it would be with the set: a lost
    /// write loses the digest's move too. `field` is `buyers_digest`,
    /// `released_digest` or `timeouts_digest`; `sign` 1 for members added,
    /// -1 for members removed, 0 when the write changed nothing.
    pub async fn move_digest(&self, voucher: u64, field: &str, members: &[u64], sign: i64) {
        if sign == 0 {
            return;
        }
        let keys = seckill::store::keys::VoucherKeys::new(&self.prefix, voucher).expect("keys");
        let mut redis = self.redis().await;
        let held: Option<u64> = redis.hget(keys.meta(), field).await.expect("digest");
        let moved =
            invariants::digest_of(&members.iter().map(|m| m.to_string()).collect::<Vec<_>>());
        let m = 1u64 << 52;
        let now = match sign > 0 {
            true => (held.unwrap_or(0) + moved) % m,
            false => (held.unwrap_or(0) + m - moved) % m,
        };
        let _: () = redis.hset(keys.meta(), field, now).await.expect("digest");
    }

    /// After a test changed orders by hand (simulating what the product
    /// or a lost write did), the voucher row's counters as the product
    /// would have kept them.
    pub async fn keep_counters(&self, voucher: u64) {
        seckill::orders::counters::repair(self.db().await, voucher)
            .await
            .expect("count the orders again");
    }

    /// `voucher add --buckets`, `preload` and the real binary's admission,
    /// worker and mover: the voucher sells on every master and exactly its
    /// stock, one order per user, whatever bucket ran dry first.
    pub async fn live_voucher_in_buckets(
        &self,
        voucher: u64,
        stock: i64,
        buckets: u32,
    ) -> (seckill::gate::buckets::Layout, Redis) {
        self.live_voucher_in_buckets_with(voucher, stock, buckets, &[])
            .await
    }

    /// [`Self::live_voucher_in_buckets`] with more `voucher add` flags.
    pub async fn live_voucher_in_buckets_with(
        &self,
        voucher: u64,
        stock: i64,
        buckets: u32,
        extra: &[&str],
    ) -> (seckill::gate::buckets::Layout, Redis) {
        let out = self
            .cmd()
            .args(["voucher", "add", "--id", &voucher.to_string()])
            .args([
                "--stock",
                &stock.to_string(),
                "--buckets",
                &buckets.to_string(),
            ])
            .args(extra)
            .args(["--begin", "-1m", "--pay-timeout", "1h", "--format", "json"])
            .output()
            .expect("voucher add");
        assert!(out.status.success(), "{out:?}");
        let added = json(&out);
        assert_eq!(added["buckets"], buckets, "{added}");
        let out = self
            .cmd()
            .args([
                "preload",
                "--voucher",
                &voucher.to_string(),
                "--format",
                "json",
            ])
            .output()
            .expect("preload");
        assert!(out.status.success(), "{out:?}");
        let preloaded = json(&out);
        assert_eq!(preloaded[0]["buckets"], buckets, "{preloaded}");
        let mut redis = self.redis().await;
        let layout = seckill::gate::buckets::Layout::read(&mut redis, &self.prefix, voucher)
            .await
            .expect("layout");
        (layout, redis)
    }

    pub async fn live_voucher(&self, id: u64, stock: i64) {
        self.add_voucher(id, stock, -1_000, 3_600_000).await;
        self.preload(id).await;
    }

    /// Voucher `not_started` opening in an hour and `ended` closed an hour
    /// ago, both preloaded (5 units each): the sale window's outcomes.
    pub async fn outside_the_window(&self, not_started: u64, ended: u64) {
        self.add_voucher(not_started, 5, 3_600_000, 7_200_000).await;
        self.preload(not_started).await;
        self.add_voucher(ended, 5, -7_200_000, -3_600_000).await;
        self.preload(ended).await;
    }

    pub async fn preload(&self, id: u64) {
        let mut redis = self.redis().await;
        seckill::gate::preload::preload(self.db().await, &mut redis, &self.prefix, id, false)
            .await
            .expect("preload");
    }

    /// Every key under this test's prefix.
    pub async fn prefix_keys(&self, redis: &mut Redis) -> Vec<String> {
        scan_keys(redis, &format!("{}:*", self.prefix))
            .await
            .expect("scan")
    }

    /// Every key of this test's prefix with a dump of its value, and every
    /// table of its database with a checksum: equal snapshots mean nothing
    /// was written.
    pub async fn snapshot(&self) -> Snapshot {
        let mut redis = self.redis().await;
        let keys = self.prefix_keys(&mut redis).await;
        let mut redis_state = BTreeMap::new();
        // Keys that change with time alone are taken as what they mean (a
        // renewal or an expiry between two snapshots is a moment, not an
        // event): the node-id clock (`{nodes}:clock`), which every process
        // minting order ids renews on a timer, is left out; a voucher's
        // lock hash is its live leases (its key outlives released ones
        // until its own expiry), absent when none is live.
        let now_ms = redis_now_ms(&mut redis).await.expect("time");
        for k in keys.into_iter().filter(|k| !k.ends_with("{nodes}:clock")) {
            let value = if k.ends_with(":locks") {
                let leases: BTreeMap<String, String> = redis.hgetall(&k).await.expect("locks");
                let live: Vec<String> = leases
                    .iter()
                    .filter(|(user, lease)| {
                        *user != "encoding" && lease_expiry(lease).is_some_and(|e| e > now_ms)
                    })
                    .map(|(user, lease)| format!("{user}={lease}\n"))
                    .collect();
                (!live.is_empty()).then(|| live.concat().into_bytes())
            } else {
                redis::cmd("DUMP")
                    .arg(&k)
                    .query_async(&mut redis)
                    .await
                    .expect("dump")
            };
            // Gone since the scan (it expired): absent.
            if let Some(value) = value {
                redis_state.insert(k, value);
            }
        }
        let mut tables = BTreeMap::new();
        if let Some(db) = self.try_db().await {
            let mut conn = db.conn().await.expect("mysql connection");
            let names: Vec<String> = conn.query("SHOW TABLES").await.expect("show tables");
            for t in names {
                let row: Option<(String, Option<i64>)> = conn
                    .query_first(format!("CHECKSUM TABLE `{t}`"))
                    .await
                    .expect("checksum");
                tables.insert(t, row.and_then(|r| r.1));
            }
        }
        Snapshot {
            redis: redis_state,
            tables,
        }
    }

    /// Drops the database and the prefix's keys now, on the test's runtime
    /// (the drop does the same for a test that panicked before getting here).
    pub async fn cleanup(mut self) {
        if let Some(db) = self.shared_db.take() {
            db.close().await;
        }
        self.shared_redis.take();
        let done = tokio::time::timeout(
            CLEANUP_LIMIT,
            drop_stores(&self.cfg, &self.prefix, &self.db_name),
        )
        .await;
        match done {
            Ok(Ok(())) => self.cleaned = true,
            Ok(Err(e)) => eprintln!("cleanup of {}: {e} (retried on drop)", self.prefix),
            Err(_) => eprintln!("cleanup of {} timed out (retried on drop)", self.prefix),
        }
    }
}

/// Deletes a gate's keys whole, as a restart without persistence leaves
/// its master (the stream and the counters stay: they are not the gate's).
pub async fn lose_gate(redis: &mut Redis, k: &seckill::store::keys::VoucherKeys) {
    let gone: Vec<String> = vec![
        k.meta(),
        k.stock(),
        k.buyers(),
        k.released(),
        k.timeouts(),
        k.waitlist(),
        k.rate(),
    ];
    let _: () = redis.del(&gone).await.expect("del");
}

/// Every key matching `pattern`: SCAN on one node, SCAN on every master of
/// a cluster (each master answers for its own keys only).
pub async fn scan_keys(redis: &mut Redis, pattern: &str) -> redis::RedisResult<Vec<String>> {
    let mut nodes = Vec::new();
    match redis {
        Redis::Node(c) => nodes.push(c.clone()),
        Redis::Cluster(_) => {
            let text: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(redis)
                .await?;
            for line in text.lines() {
                let fields: Vec<&str> = line.split(' ').collect();
                let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
                    continue;
                };
                if !flags.contains("master") || flags.contains("fail") {
                    continue;
                }
                let host_port = addr.split('@').next().unwrap_or_default();
                let client = redis::Client::open(format!("redis://{host_port}/"))?;
                nodes.push(client.get_multiplexed_async_connection().await?);
            }
        }
    }
    let mut keys = Vec::new();
    for mut node in nodes {
        let mut iter: redis::AsyncIter<String> = node.scan_match(pattern).await?;
        while let Some(k) = iter.next_item().await {
            keys.push(k?);
        }
    }
    Ok(keys)
}

/// The slot of voucher `v`'s keys.
pub async fn slot_of(env: &TestEnv, v: u64) -> u16 {
    let mut redis = env.redis().await;
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(format!("{{{v}}}"))
        .query_async(&mut redis)
        .await
        .expect("cluster keyslot")
}

/// One voucher id per master of a cluster made by `redis-cli --cluster
/// create` (slots split in three equal ranges).
pub async fn one_voucher_per_master(env: &TestEnv) -> Vec<u64> {
    let mut found: [Option<u64>; 3] = [None; 3];
    for v in 1.. {
        // redis-cli --cluster create: 0-5460, 5461-10922, 10923-16383.
        let third = match slot_of(env, v).await {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        };
        found[third].get_or_insert(v);
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    found.iter().map(|v| v.unwrap_or_default()).collect()
}

/// The longest a cleanup may take: a store that does not answer must not
/// hang the test run.
const CLEANUP_LIMIT: Duration = Duration::from_secs(20);

/// Redis's clock, in Unix ms (the one leases and deadlines are kept by).
pub async fn redis_now_ms(redis: &mut Redis) -> redis::RedisResult<i64> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(redis).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// When a lock of a voucher's lock hash expires: a value is
/// "<expires_ms> <count> <owner>" (lua/lib/lease.lua).
pub fn lease_expiry(value: &str) -> Option<i64> {
    value.split(' ').next()?.parse().ok()
}

/// Deletes every key of `prefix` and drops `db_name`, with connections of
/// its own (the caller's runtime may be gone or unwinding).
async fn drop_stores(cfg: &Config, prefix: &str, db_name: &str) -> Result<(), String> {
    let mut redis = seckill::store::redis_conn::connect(cfg)
        .await
        .map_err(|e| format!("redis: {e}"))?;
    let keys = scan_keys(&mut redis, &format!("{prefix}:*"))
        .await
        .map_err(|e| format!("redis scan: {e}"))?;
    // One DEL per key: on a cluster the keys of one DEL must share a slot.
    if keys.is_empty() {
        // Nothing to delete (an empty pipeline is an error).
    } else if redis.is_cluster() {
        for k in &keys {
            let _: () = redis.del(k).await.map_err(|e| format!("redis del: {e}"))?;
        }
    } else {
        let mut pipe = redis::pipe();
        for k in &keys {
            pipe.del(k).ignore();
        }
        let _: () = pipe
            .query_async(&mut redis)
            .await
            .map_err(|e| format!("redis del: {e}"))?;
    }
    // The server of the test's URL, without a database to connect to.
    let opts = mysql_async::Opts::from_url(&cfg.mysql_url).map_err(|e| e.to_string())?;
    let mut opts = mysql_async::OptsBuilder::from_opts(opts).db_name(None::<String>);
    // A server that insists on TLS gets it (this is cleanup: no checks).
    use seckill::store::config::SslMode;
    if matches!(
        cfg.mysql_ssl_mode,
        SslMode::Required | SslMode::VerifyCa | SslMode::VerifyIdentity
    ) {
        opts = opts.ssl_opts(Some(
            mysql_async::SslOpts::default().with_danger_accept_invalid_certs(true),
        ));
    }
    let mut conn = mysql_async::Conn::new(opts)
        .await
        .map_err(|e| format!("mysql: {e}"))?;
    // A transaction a panicking test left open must not make DROP wait forever.
    conn.query_drop("SET SESSION lock_wait_timeout = 10")
        .await
        .map_err(|e| format!("mysql: {e}"))?;
    conn.query_drop(format!("DROP DATABASE IF EXISTS `{db_name}`"))
        .await
        .map_err(|e| format!("mysql drop database: {e}"))?;
    conn.disconnect().await.ok();
    Ok(())
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        // The test's runtime may be unwinding (or be a current-thread one that
        // this very thread drives): clean up on a thread with a runtime of its
        // own, wait a bounded time, and never panic here.
        let (cfg, prefix, db_name) = (self.cfg.clone(), self.prefix.clone(), self.db_name.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name(format!("cleanup-{prefix}"))
            .spawn(move || {
                let result = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt.block_on(async {
                        tokio::time::timeout(CLEANUP_LIMIT, drop_stores(&cfg, &prefix, &db_name))
                            .await
                            .unwrap_or_else(|_| Err("timed out".to_string()))
                    }),
                    Err(e) => Err(format!("no runtime: {e}")),
                };
                tx.send(result).ok();
            });
        if let Err(e) = spawned {
            eprintln!("cleanup of {}: no thread: {e}", self.prefix);
            return;
        }
        match rx.recv_timeout(CLEANUP_LIMIT + Duration::from_secs(5)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("cleanup of {}: {e}", self.prefix),
            Err(_) => eprintln!("cleanup of {} did not finish", self.prefix),
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
    ) -> seckill::bench::BenchReport {
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
    ) -> tokio::task::JoinHandle<seckill::bench::BenchReport> {
        self.sale_of_quantities_in_background(voucher, users, offset, attempts, concurrency, (1, 1))
    }

    /// As [`TestEnv::sale_in_background`], each attempt asking a quantity
    /// drawn from `quantity` (inclusive).
    pub fn sale_of_quantities_in_background(
        &self,
        voucher: u64,
        users: u64,
        offset: u64,
        attempts: u64,
        concurrency: usize,
        quantity: (u32, u32),
    ) -> tokio::task::JoinHandle<seckill::bench::BenchReport> {
        let cfg = self.cfg.clone();
        let plan = seckill::bench::BenchPlan {
            voucher,
            users,
            user_offset: offset,
            attempts,
            concurrency,
            connections: concurrency.clamp(1, 4),
            // A leased node id: two sales at once never mint one order id.
            node_id: None,
            tokens: false,
            wait_replicas: None,
            quantity,
        };
        tokio::spawn(async move {
            seckill::bench::run(&cfg, &plan, Default::default())
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
    /// Delivers up to `count` new entries to `consumer`; returns them.
    pub async fn read_as(
        &self,
        voucher: u64,
        consumer: &str,
        count: usize,
    ) -> Vec<redis::streams::StreamId> {
        let keys = seckill::store::keys::VoucherKeys::new(&self.prefix, voucher).unwrap();
        let mut redis = self.redis().await;
        seckill::worker::group::ensure_group(&mut redis, &keys)
            .await
            .unwrap();
        let read: Option<redis::streams::StreamReadReply> = redis::cmd("XREADGROUP")
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
        read.and_then(|r| r.keys.into_iter().next())
            .map(|k| k.ids)
            .unwrap_or_default()
    }

    /// Admits `user` at the voucher's gate under `order`, then dead-letters
    /// its entry with `reason`, as the worker does after the last try (dead
    /// letter, then XACK); returns the dead letter's id.
    pub async fn admit_and_dead_letter(
        &self,
        voucher: u64,
        user: u64,
        order: u64,
        reason: &str,
    ) -> String {
        self.admit_referenced_and_dead_letter(voucher, user, order, None, reason)
            .await
    }

    /// As `admit_and_dead_letter`, the admission carrying a client reference.
    pub async fn admit_referenced_and_dead_letter(
        &self,
        voucher: u64,
        user: u64,
        order: u64,
        client_reference: Option<&str>,
        reason: &str,
    ) -> String {
        let keys = seckill::store::keys::VoucherKeys::new(&self.prefix, voucher).unwrap();
        let mut redis = self.redis().await;
        let attempt = seckill::gate::admission::Attempt {
            voucher,
            user,
            order_id: order,
            token: None,
            quantity: 1,
            client_reference,
        };
        let (reply, _) =
            seckill::gate::admission::admit_durably(&mut redis, &keys, attempt, None, None)
                .await
                .unwrap();
        assert_eq!(reply.outcome.name(), "success");
        let read = self.read_as(voucher, "dead-letterer", 1).await;
        let e = &read[0];
        let mut fields: Vec<(String, String)> = vec![
            ("entry".into(), e.id.clone()),
            ("reason".into(), reason.into()),
            ("deliveries".into(), "6".into()),
        ];
        for (k, v) in &e.map {
            fields.push((k.clone(), redis::from_redis_value(v.clone()).unwrap()));
        }
        let dead: String = redis.xadd(keys.dead(), "*", &fields).await.unwrap();
        let _: () = redis
            .xack(keys.orders(), seckill::store::keys::WORKER_GROUP, &[&e.id])
            .await
            .unwrap();
        dead
    }

    /// `seckill pending --voucher V --requeue --yes --format json`.
    pub fn requeue(&self, voucher: u64) -> std::process::Output {
        self.cmd()
            .args(["pending", "--voucher", &voucher.to_string()])
            .args(["--requeue", "--yes", "--format", "json"])
            .output()
            .expect("seckill pending --requeue runs")
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
        let mut conn = self.db().await.conn().await.expect("mysql");
        let rows: Vec<(u64, u64, i8)> = conn
            .exec(
                "SELECT id, user_id, status FROM seckill_order WHERE voucher_id = ? ORDER BY id",
                (voucher,),
            )
            .await
            .expect("read orders");
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
        let mut conn = self.db().await.conn().await.expect("mysql");
        let n: Option<u64> = conn
            .exec_first(
                "SELECT COUNT(*) FROM seckill_order WHERE voucher_id = ?",
                (voucher,),
            )
            .await
            .expect("count orders");
        n.unwrap_or(0)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub redis: BTreeMap<String, Vec<u8>>,
    pub tables: BTreeMap<String, Option<i64>>,
}
