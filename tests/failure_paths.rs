//! Failure paths of preload and the MySQL transactions: a gate left loaded
//! but unregistered is repaired by running preload again; reads meant as one
//! snapshot are one on a server whose default isolation is READ COMMITTED;
//! the batch transaction, on its fast path and on its careful one, meets no
//! read conflict under innodb_snapshot_isolation.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::invariants::assert_invariants;
use common::own_mysql::OwnMysql;
use common::{fast_worker, TestEnv};
use redis::AsyncCommands;
use seckill::store::registry;

const V: u64 = 1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preload_again_registers_a_loaded_gate_a_crash_left_unregistered() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    env.admit_users(V, 6, 0).await;
    // A preload that died after publishing, before registering: the gate
    // admits, but no worker consumes its orders.
    let mut redis = env.redis().await;
    let _: () = redis
        .srem(registry::key(&env.prefix).unwrap(), V)
        .await
        .unwrap();
    let out = env
        .cmd()
        .args(["preload", "--voucher", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("in flight"), "{stderr}");
    let registered: bool = redis
        .sismember(registry::key(&env.prefix).unwrap(), V)
        .await
        .unwrap();
    assert!(registered, "running preload again registers the voucher");
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    assert_eq!(env.order_count(V).await, 6);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 4);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconcile_reads_one_snapshot_on_a_read_committed_server() {
    let mysql = OwnMysql::start("transaction-isolation=READ-COMMITTED");
    let env = mysql.test_env().await;
    env.live_voucher(V, 100).await;
    env.admit_users(V, 50, 0).await;
    // Reconcile stops between reading the voucher row and reading its
    // orders; the worker commits the 50 orders in flight exactly then.
    let mut look = Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args([
            "reconcile",
            "--dry-run",
            "--voucher",
            "1",
            "--format",
            "json",
        ])
        .envs(env.store_env())
        .env_remove("RUST_LOG")
        .env(seckill::support::fault::ENV, "between_snapshot_reads=5s")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = BufReader::new(look.stderr.take().unwrap()).lines();
    let paused = said
        .by_ref()
        .map_while(|l| l.ok())
        .any(|l| l.contains("test pause at between_snapshot_reads"));
    assert!(paused, "reconcile never reached the pause");
    let worker = env.spawn_worker(&fast_worker(&[]));
    env.wait_orders(V, 50, Duration::from_secs(30)).await;
    assert!(
        look.try_wait().unwrap().is_none(),
        "the worker committed after the read, not between its two parts"
    );
    worker.signal("TERM");
    worker.expect_success(Duration::from_secs(30));
    std::thread::spawn(move || said.for_each(drop));
    let out = look.wait_with_output().unwrap();
    let report = common::json(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a drain is not drift (a read of the stock from before and the orders from after would be): {report}"
    );
    assert_eq!(report["consistent"], true, "{report}");
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_under_innodb_snapshot_isolation_meet_no_read_conflict() {
    let mysql = OwnMysql::start("innodb_snapshot_isolation=ON");
    let env = mysql.test_env().await;
    env.live_voucher(V, 10_000).await;
    env.admit_users(V, 10_000, 0).await;
    let flags = fast_worker(&["--batch", "64", "--until-idle"]);
    let a = env.spawn_worker(&flags);
    let b = env.spawn_worker(&flags);
    let logs = [
        a.expect_success(Duration::from_secs(120)),
        b.expect_success(Duration::from_secs(120)),
    ];
    for log in &logs {
        assert!(
            !log.contains("error 1020") && !log.contains("not persisted"),
            "a batch failed on a read conflict:\n{log}"
        );
    }
    assert_eq!(env.order_count(V).await, 10_000);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    drop(env);
}

/// The careful path (a batch holding orders already stored: a redelivery)
/// also takes the voucher row before its first plain read: two workers
/// under innodb_snapshot_isolation never meet a read conflict there either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redelivered_batches_under_innodb_snapshot_isolation_meet_no_read_conflict() {
    let mysql = OwnMysql::start("innodb_snapshot_isolation=ON");
    let env = mysql.test_env().await;
    env.live_voucher(V, 4_000).await;
    env.admit_users(V, 2_000, 0).await;
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    // Every stored order delivered again, between 2,000 fresh admissions,
    // so that batches mix the two and take the careful path.
    let keys = seckill::store::keys::VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let stored: redis::streams::StreamRangeReply = redis.xrange_all(keys.orders()).await.unwrap();
    let sale = env.sale_in_background(V, 2_000, 2_000, 2_000, 2);
    for group in stored.ids.chunks(20) {
        let mut pipe = redis::pipe();
        for e in group {
            let field = |f: &str| e.get::<String>(f).unwrap();
            pipe.xadd(
                keys.orders(),
                "*",
                &[
                    ("user", field("user")),
                    ("order", field("order")),
                    ("voucher", field("voucher")),
                    ("kind", field("kind")),
                ],
            )
            .ignore();
        }
        let _: () = pipe.query_async(&mut redis).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(sale.await.unwrap().outcomes.success, 2_000);
    // A batch classified again after a conflict (error 1020 among them)
    // says so at debug level.
    let flags = fast_worker(&["--batch", "64", "--until-idle"]);
    let debug = [("RUST_LOG", "seckill=debug")];
    let a = env.spawn_worker_with(&flags, &debug);
    let b = env.spawn_worker_with(&flags, &debug);
    let logs = [
        a.expect_success(Duration::from_secs(120)),
        b.expect_success(Duration::from_secs(120)),
    ];
    for log in &logs {
        assert!(
            log.contains("DEBUG"),
            "the worker logs at debug level:\n{log}"
        );
        assert!(
            !log.contains("error 1020") && !log.contains("not persisted"),
            "a batch met a read conflict:\n{log}"
        );
    }
    assert_eq!(env.order_count(V).await, 4_000);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    drop(env);
}
