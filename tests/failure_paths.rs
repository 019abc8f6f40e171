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

/// Callers branch on what failed at a store, never on its wording: each
/// fault the code acts on comes as its kind, with the driver's error kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_failures_come_as_the_kind_callers_branch_on() {
    use mysql_async::prelude::Queryable;
    use seckill::error::{Error, StoreFault};
    use seckill::gate::admission::{admit_durably, Attempt};
    use seckill::store::keys::VoucherKeys;

    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    env.live_voucher(2, 10).await;
    let mut redis = env.redis().await;
    let fault_of = |e: redis::RedisError| {
        let e = Error::from(e);
        assert!(e.cause().is_some(), "{e}: the driver's error is kept");
        e.store_fault()
    };

    let no_group: redis::RedisResult<redis::Value> = redis::cmd("XREADGROUP")
        .arg(&["GROUP", "nobody", "c", "STREAMS"])
        .arg(format!("{}:no-stream", env.prefix))
        .arg(">")
        .query_async(&mut redis)
        .await;
    assert_eq!(fault_of(no_group.unwrap_err()), Some(StoreFault::NoGroup));
    // The same inside a pipeline, whose error holds its commands' apart.
    let in_pipeline: redis::RedisResult<(i64, redis::Value)> = redis::pipe()
        .cmd("EXISTS")
        .arg("nothing")
        .cmd("XREADGROUP")
        .arg(&["GROUP", "nobody", "c", "STREAMS"])
        .arg(format!("{}:no-stream", env.prefix))
        .arg(">")
        .query_async(&mut redis)
        .await;
    assert_eq!(
        fault_of(in_pipeline.unwrap_err()),
        Some(StoreFault::NoGroup)
    );

    // The admission script's own refusal of its arguments, and a Lua
    // runtime error (not a refusal of ours, though its text has a colon).
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let bad_user: redis::RedisResult<redis::Value> = seckill::store::scripts::ADMISSION
        .key(keys.meta())
        .key(keys.stock())
        .key(keys.buyers())
        .key(keys.waitlist())
        .key(keys.orders())
        .arg("not-a-user")
        .arg(1)
        .arg(V)
        .invoke_async(&mut redis)
        .await;
    assert_eq!(
        fault_of(bad_user.unwrap_err()),
        Some(StoreFault::ScriptRefused)
    );
    let runtime: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
        .arg("error('seckill: not ours')")
        .arg(0)
        .query_async(&mut redis)
        .await;
    assert_eq!(fault_of(runtime.unwrap_err()), Some(StoreFault::Other));

    // A quantity above the voucher's limit is the caller's input, refused
    // before anything is written.
    let attempt = Attempt {
        voucher: V,
        user: 7,
        order_id: 1,
        token: None,
        quantity: 5,
        client_reference: None,
    };
    // Alone, and in the pipeline with the wait for replicas.
    let wait = seckill::gate::admission::ReplicaWait {
        replicas: 0,
        timeout: Duration::from_millis(10),
    };
    for wait in [None, Some(wait)] {
        let refused = admit_durably(&mut redis, &keys, attempt, None, wait).await;
        match refused {
            Err(Error::QuantityRefused(reason)) => {
                assert_eq!(
                    reason, "quantity must be between 1 and 1 (the per-user limit)",
                    "{wait:?}"
                );
                let shown = format!("{}", Error::QuantityRefused(reason));
                assert!(shown.starts_with("invalid input: "));
            }
            other => panic!("expected a quantity refusal ({wait:?}), got {other:?}"),
        }
    }
    let buyers: u64 = redis.scard(keys.buyers()).await.unwrap();
    assert_eq!(buyers, 0, "nothing written");

    // MySQL: a lock wait past its timeout, a deadlock's victim, a session
    // killed under its connection.
    let db = env.db().await;
    let mut holder = db.conn().await.unwrap();
    let mut waiter = db.conn().await.unwrap();
    let lock = "SELECT stock FROM seckill_voucher WHERE voucher_id = ? FOR UPDATE";
    holder.query_drop("BEGIN").await.unwrap();
    holder.exec_drop(lock, (V,)).await.unwrap();
    waiter
        .query_drop("SET SESSION innodb_lock_wait_timeout = 1")
        .await
        .unwrap();
    waiter.query_drop("BEGIN").await.unwrap();
    let waited = waiter.exec_drop(lock, (V,)).await.unwrap_err();
    assert_eq!(
        Error::from(waited).store_fault(),
        Some(StoreFault::LockWaitTimeout)
    );

    // Each holds one row and asks for the other's: InnoDB rolls one back.
    waiter.query_drop("ROLLBACK").await.unwrap();
    waiter
        .query_drop("SET SESSION innodb_lock_wait_timeout = 30")
        .await
        .unwrap();
    waiter.query_drop("BEGIN").await.unwrap();
    waiter.exec_drop(lock, (2u64,)).await.unwrap();
    // Both ask at once: whichever asks second closes the cycle (in either
    // order), and InnoDB rolls one of them back.
    let (holder_got, waiter_got) = tokio::join!(
        holder.exec_drop(lock, (2u64,)),
        waiter.exec_drop(lock, (V,))
    );
    let victim = match (holder_got, waiter_got) {
        (Err(e), Ok(())) | (Ok(()), Err(e)) => e,
        other => panic!("one of the two is a deadlock's victim: {other:?}"),
    };
    assert_eq!(
        Error::from(victim).store_fault(),
        Some(StoreFault::Deadlock)
    );
    holder.query_drop("ROLLBACK").await.ok();
    waiter.query_drop("ROLLBACK").await.ok();

    let id = waiter.id();
    let mut probe = db.conn().await.unwrap();
    probe.query_drop(format!("KILL {id}")).await.unwrap();
    let lost = waiter.query_drop("SELECT 1").await.unwrap_err();
    assert_eq!(
        Error::from(lost).store_fault(),
        Some(StoreFault::ConnectionLost)
    );
    // The pool disconnects at cleanup once every connection is back.
    drop((holder, waiter, probe));
    env.cleanup().await;
}
