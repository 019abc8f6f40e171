//! The same binary on a Redis Cluster (`scripts/services.sh up cluster`):
//! every command end to end with vouchers on every master, an application
//! server calling the admission script with `redis-cli -c`, and a master
//! killed during a live sale (on a cluster of the test's own).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::invariants::assert_invariants;
use common::own_cluster::OwnCluster;
use common::{cluster_url, fast_worker, json, one_voucher_per_master, TestEnv};
use mysql_async::prelude::*;
use redis::AsyncCommands;
use seckill::store::keys::VoucherKeys;
use seckill::store::redis_conn::RedisConn;

fn run(env: &TestEnv, args: &[&str]) -> std::process::Output {
    env.cmd().args(args).output().expect("run seckill")
}

/// Runs and expects exit 0, returning stdout as JSON.
fn run_json(env: &TestEnv, args: &[&str]) -> serde_json::Value {
    let out = run(env, args);
    assert!(
        out.status.success(),
        "seckill {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

async fn order_ids(env: &TestEnv, voucher: u64) -> Vec<(u64, u64)> {
    let mut conn = env.db().await.conn().await.unwrap();
    conn.exec(
        "SELECT id, user_id FROM seckill_order WHERE voucher_id = ? ORDER BY id",
        (voucher,),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_on_a_cluster_with_vouchers_on_every_master() {
    let env = TestEnv::on_cluster().await;
    assert!(
        env.redis().await.is_cluster(),
        "the test Redis is a cluster"
    );
    let init = run_json(&env, &["init", "--format", "json"]);
    assert!(init["redis"]["version"].as_str().is_some(), "{init}");
    let vouchers = one_voucher_per_master(&env).await;
    let [a, b, c] = [vouchers[0], vouchers[1], vouchers[2]];
    for (v, stock) in [(a, 50), (b, 3), (c, 5)] {
        run_json(
            &env,
            &[
                "voucher",
                "add",
                "--id",
                &v.to_string(),
                "--stock",
                &stock.to_string(),
                "--begin",
                "-1m",
                "--pay-timeout",
                "10s",
                "--format",
                "json",
            ],
        );
    }
    let listed = run_json(&env, &["voucher", "list", "--format", "json"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(3), "{listed}");
    let preloaded = run_json(&env, &["preload", "--all", "--format", "json"]);
    assert_eq!(preloaded.as_array().map(Vec::len), Some(3), "{preloaded}");

    // Admission on every master: bench on one, buy on the others, a policy.
    let bench = run_json(
        &env,
        &[
            "bench",
            "--voucher",
            &a.to_string(),
            "--attempts",
            "400",
            "--users",
            "100",
            "--format",
            "json",
        ],
    );
    assert_eq!(bench["outcomes"]["success"], 50, "{bench}");
    let waitlist = run_json(
        &env,
        &["waitlist", "--voucher", &a.to_string(), "--format", "json"],
    );
    assert_eq!(waitlist["length"], 50, "{waitlist}");
    let buy = |v: u64, user: u64, extra: &[&str]| {
        let mut args = vec![
            "buy".to_string(),
            "--voucher".into(),
            v.to_string(),
            "--user".into(),
            user.to_string(),
            "--format".into(),
            "json".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&env, &refs)
    };
    for user in 1..=5 {
        assert_eq!(
            buy(b, user, &[]).status.code(),
            Some(if user <= 3 { 0 } else { 11 })
        );
    }
    assert_eq!(buy(b, 1, &[]).status.code(), Some(10), "already bought");
    let update = run(
        &env,
        &[
            "voucher",
            "update",
            "--id",
            &c.to_string(),
            "--require-token",
        ],
    );
    assert!(update.status.success(), "{update:?}");
    assert_eq!(buy(c, 1, &[]).status.code(), Some(17), "bad token");
    let token = run_json(
        &env,
        &[
            "token",
            "issue",
            "--voucher",
            &c.to_string(),
            "--user",
            "1",
            "--format",
            "json",
        ],
    );
    let token = token["token"].as_str().expect("a token").to_string();
    let bought = buy(c, 1, &["--token", &token]);
    assert_eq!(bought.status.code(), Some(0), "{bought:?}");
    let status = run_json(&env, &["status", "--format", "json"]);
    let in_flight: u64 = status
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["undelivered"].as_u64().unwrap_or(0) + v["pending"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(in_flight, 50 + 3 + 1, "{status}");
    let rejected = status
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == c)
        .map(|v| v["rejected"]["bad_token"].clone());
    assert_eq!(rejected, Some(serde_json::json!(1)), "{status}");

    // A dead letter (as the worker leaves one after the last try), for
    // `pending --requeue` to put back.
    let c_keys = VoucherKeys::new(&env.prefix, c).unwrap();
    let mut redis = env.redis().await;
    let read = env.read_as(c, "dead-letterer", 1).await;
    let mut fields: Vec<(String, String)> = vec![
        ("entry".into(), read[0].id.clone()),
        ("reason".into(), "MySQL unreachable".into()),
        ("deliveries".into(), "6".into()),
    ];
    for (k, v) in &read[0].map {
        fields.push((k.clone(), redis::from_redis_value(v.clone()).unwrap()));
    }
    let _: String = redis.xadd(c_keys.dead(), "*", &fields).await.unwrap();
    let _: () = redis
        .xack(
            c_keys.orders(),
            seckill::store::keys::WORKER_GROUP,
            &[&read[0].id],
        )
        .await
        .unwrap();
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    let pending = run_json(&env, &["pending", "--format", "json"]);
    let dead = |p: &serde_json::Value, v: u64| {
        p.as_array()
            .unwrap()
            .iter()
            .find(|r| r["voucher"] == v)
            .map(|r| r["dead_letters"].as_u64().unwrap_or(0))
    };
    assert_eq!(dead(&pending, c), Some(1), "{pending}");
    // Paid well inside its 10 s: it stays when the others run out of time.
    let (paid, _) = order_ids(&env, b).await[0];
    run_json(
        &env,
        &["pay", "--order", &paid.to_string(), "--format", "json"],
    );
    let shown = run_json(
        &env,
        &["order", "show", &paid.to_string(), "--format", "json"],
    );
    assert_eq!(shown["status"], "paid", "{shown}");
    run_json(
        &env,
        &[
            "pending",
            "--voucher",
            &c.to_string(),
            "--requeue",
            "--yes",
            "--format",
            "json",
        ],
    );

    // The worker as a service, with its metrics, while orders are paid and
    // the rest run out of time (their units go to a's waitlist head).
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let worker = env.spawn_worker(&fast_worker(&["--metrics-addr", &addr]));
    env.wait_orders(c, 1, Duration::from_secs(30)).await;
    env.wait_orders(b, 3, Duration::from_secs(30)).await;
    let metrics = common::scrape_metrics(port).await;
    assert!(
        metrics.contains(&format!("seckill_stream_lag{{voucher=\"{a}\"}}")),
        "{metrics}"
    );
    // Deadlines: 2s after admission every unpaid order is cancelled and
    // a's units are handed to its waitlist (promotions become orders too).
    let start = Instant::now();
    loop {
        let status = run_json(&env, &["status", "--format", "json"]);
        let settled =
            status.as_array().unwrap().iter().all(|v| {
                v["orders_pending"].as_u64() == Some(0) && v["waitlist"].as_u64() == Some(0)
            });
        if settled {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "deadlines not handled: {status}\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let promoted = run_json(
        &env,
        &["waitlist", "--voucher", &a.to_string(), "--format", "json"],
    );
    assert!(
        promoted["promotions"].as_u64().unwrap_or(0) > 0,
        "{promoted}"
    );
    let watch = Command::new("timeout")
        .args([
            "2",
            assert_cmd::cargo::cargo_bin("seckill").to_str().unwrap(),
        ])
        .args(["status", "--watch", "300ms"])
        .env("SECKILL_REDIS_URL", &env.cfg.redis_url)
        .env("SECKILL_MYSQL_URL", &env.cfg.mysql_url)
        .env("SECKILL_PREFIX", &env.prefix)
        .output()
        .unwrap();
    let watched = String::from_utf8_lossy(&watch.stdout);
    assert!(
        watched.matches(&format!("│ {b} ")).count() >= 2,
        "{watched}"
    );
    worker.signal("TERM");
    worker.expect_success(Duration::from_secs(30));

    // Reconcile: clean, then a damaged gate is found and repaired.
    let report = run_json(&env, &["reconcile", "--dry-run", "--format", "json"]);
    assert_eq!(report["consistent"], true, "{report}");
    let keys = VoucherKeys::new(&env.prefix, b).unwrap();
    let mut redis = env.redis().await;
    let _: () = redis.incr(keys.stock(), 2).await.unwrap();
    let drift = run(&env, &["reconcile", "--dry-run", "--format", "json"]);
    assert_eq!(drift.status.code(), Some(3), "{drift:?}");
    assert_eq!(json(&drift)["consistent"], false);
    let repaired = run(&env, &["reconcile", "--yes", "--format", "json"]);
    assert_eq!(repaired.status.code(), Some(4), "{repaired:?}");
    let report = run_json(&env, &["reconcile", "--dry-run", "--format", "json"]);
    assert_eq!(report["consistent"], true, "{report}");
    for v in [a, b, c] {
        assert_invariants(&env, v).await;
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_server_calls_the_script_with_redis_cli_on_a_cluster() {
    let env = TestEnv::on_cluster().await;
    env.live_voucher(7, 2).await;
    let keys = VoucherKeys::new(&env.prefix, 7).unwrap();
    let script =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/seckill.lua")).unwrap();
    let seed_port = cluster_url()
        .split(',')
        .next()
        .and_then(|u| url::Url::parse(u).ok())
        .and_then(|u| u.port())
        .unwrap();
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-c", "-p", &seed_port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let sha = seckill::store::scripts::ADMISSION.get_hash().to_string();
    let call = |user: &str, order: &str| {
        let mut args = vec!["EVALSHA".to_string(), sha.clone(), "7".into()];
        args.extend([
            keys.meta(),
            keys.stock(),
            keys.buyers(),
            keys.waitlist(),
            keys.orders(),
            keys.token(user.parse().unwrap()),
            keys.rate(),
        ]);
        args.extend([
            user.to_string(),
            order.to_string(),
            "7".into(),
            String::new(),
        ]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&refs)
    };
    // The owner of the slot answers; it may not have the script yet.
    let first = call("1", "900001");
    let reply = if first.contains("NOSCRIPT") {
        // SCRIPT LOAD on the node that owns the slot: EVAL through -c is
        // redirected there by its keys and leaves the script cached.
        let mut args = vec!["EVAL".to_string(), script.clone(), "7".into()];
        args.extend([
            keys.meta(),
            keys.stock(),
            keys.buyers(),
            keys.waitlist(),
            keys.orders(),
            keys.token(1),
            keys.rate(),
        ]);
        args.extend(["1".to_string(), "900001".into(), "7".into(), String::new()]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&refs)
    } else {
        first
    };
    assert!(reply.starts_with('0'), "success is code 0: {reply}");
    let again = call("1", "900002");
    assert!(again.starts_with('1'), "already bought is 1: {again}");
    let second = call("2", "900003");
    assert!(second.starts_with('0'), "{second}");
    let sold_out = call("3", "900004");
    assert!(sold_out.starts_with('2'), "sold out is 2: {sold_out}");
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    let s = assert_invariants(&env, 7).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}

/// A master is killed (SIGKILL) while buyers are admitted and the worker
/// persists: its replica takes over, admission and the worker carry on after
/// retries, and once the sale is over nothing was sold twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_killed_during_a_live_sale_fails_over_and_nothing_is_oversold() {
    let cluster = OwnCluster::start();
    let env = TestEnv::on_redis(&cluster.url()).await;
    let vouchers = one_voucher_per_master(&env).await;
    for v in &vouchers {
        env.live_voucher(*v, 3_000).await;
    }
    let victim_voucher = vouchers[0];
    let victim = cluster.master_of(&format!("{{{victim_voucher}}}"));
    let replica = cluster.replica_of(victim);
    let mut worker = env.spawn_worker(&fast_worker(&[]));
    // The failover changes the server behind the victim's voucher: its
    // gate guard pauses that gate to check it against MySQL.
    worker.expect_gate_pauses();
    let sales: Vec<_> = vouchers
        .iter()
        .map(|v| env.sale_in_background(*v, 12_000, 0, 12_000, 8))
        .collect();
    // Kill the master once its voucher's sale is well under way.
    let keys = VoucherKeys::new(&env.prefix, victim_voucher).unwrap();
    let mut redis = env.redis().await;
    loop {
        let stock: i64 = redis.get(keys.stock()).await.unwrap();
        if stock < 2_500 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.kill9(victim);
    let killed_at = Instant::now();
    cluster.wait_master(replica, Duration::from_secs(30));
    eprintln!("failover took {:?}", killed_at.elapsed());
    let mut errors = 0;
    for sale in sales {
        let report = sale.await.expect("the sale finishes after the failover");
        eprintln!(
            "voucher {}: {:?} errors {} (first: {:?})",
            report.voucher, report.outcomes, report.errors, report.first_error
        );
        errors += report.errors;
    }
    // Buyers told `paused` come back: while the guard checks the gate, the
    // sale's attempts may all have been spent. They try again until the
    // reopened gate sells out (the same users: those who bought are refused).
    let retry_until = Instant::now() + Duration::from_secs(60);
    loop {
        let stock: i64 = redis.get(keys.stock()).await.unwrap();
        if stock <= 0 {
            break;
        }
        assert!(
            Instant::now() < retry_until,
            "the gate never sold out after the failover ({stock} left):\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let again = env
            .sale_in_background(victim_voucher, 12_000, 0, 12_000, 8)
            .await
            .expect("the buyers' retry finishes");
        eprintln!("retry on voucher {victim_voucher}: {:?}", again.outcomes);
    }
    // Every voucher drains, the one that failed over included.
    let start = Instant::now();
    for v in &vouchers {
        while env.in_flight(*v).await > 0 {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "voucher {v} not drained: {}\n{}",
                String::from_utf8_lossy(&run(&env, &["pending"]).stdout),
                worker.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Whatever the killed master had not yet replicated, the worker's gate
    // guard checks that gate against MySQL after the failover (on its next
    // pass, which a quick drain may beat): no operator repair is needed.
    let seen_until = Instant::now() + Duration::from_secs(30);
    while !worker.log_text().contains("run id") {
        assert!(
            Instant::now() < seen_until,
            "the gate guard never saw the failover:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while env.in_flight(victim_voucher).await > 0
        || worker.log_text().matches("reopened").count() == 0
    {
        assert!(
            Instant::now() < seen_until,
            "the gate guard never reopened the gate:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.signal("TERM");
    let log = worker.expect_success(Duration::from_secs(30));
    let report = run_json(&env, &["reconcile", "--dry-run", "--format", "json"]);
    assert_eq!(report["consistent"], true, "{report}\n{log}");
    for v in &vouchers {
        let s = assert_invariants(&env, *v).await;
        // 12,000 buyers for 3,000 units: the sale went on until sold out,
        // on the voucher that failed over too.
        assert_eq!(s.mysql_stock, 0, "voucher {v} did not sell out");
    }
    eprintln!("admission errors during the failover: {errors}");
    env.cleanup().await;
}

/// `buy --voucher 5 --user 1 --wait-replicas 1 --format json` plus `extra`.
fn buy_waiting_for_a_replica(env: &TestEnv, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "buy",
        "--voucher",
        "5",
        "--user",
        "1",
        "--wait-replicas",
        "1",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--format", "json"]);
    run(env, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buy_can_wait_for_a_replica_and_says_how_many_had_the_admission() {
    let env = TestEnv::on_cluster().await;
    env.live_voucher(5, 10).await;
    let out = buy_waiting_for_a_replica(&env, &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json(&out)["replicas_acked"], 1, "{}", json(&out));
    let bench = run_json(
        &env,
        &[
            "bench",
            "--voucher",
            "5",
            "--users",
            "20",
            "--user-offset",
            "100",
            "--attempts",
            "20",
            "--wait-replicas",
            "1",
            "--format",
            "json",
        ],
    );
    assert_eq!(bench["outcomes"]["success"], 9, "{bench}");
    assert_eq!(bench["replicas_short"], 0, "{bench}");
    env.cleanup().await;

    // A single node has no replica: the admission stands, the wait says so.
    let env = TestEnv::new().await;
    env.live_voucher(5, 10).await;
    let out = buy_waiting_for_a_replica(&env, &["--wait-timeout", "100ms"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json(&out)["replicas_acked"], 0, "{}", json(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("only 0 of 1 replica(s)"),
        "{out:?}"
    );
    env.cleanup().await;
}

/// A node that accepts connections but answers nothing (frozen, swapping)
/// is still in the slot map until the cluster flags it failed, a node
/// timeout later (15 s by default). Meanwhile every connect reaches it: it
/// costs that connect the connect timeout, and must not fail it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_the_cluster_has_not_flagged_yet_does_not_fail_a_connect() {
    let cluster = OwnCluster::start();
    let env = TestEnv::on_redis(&cluster.url()).await;
    env.live_voucher(5, 10).await;
    let keys = VoucherKeys::new(&env.prefix, 5).unwrap();
    let replica = cluster.replica_of(cluster.master_of(&keys.stock()));
    cluster.wait_in_slot_maps(replica);
    cluster.signal(replica, "-STOP");
    // Well inside the test cluster's node timeout (1 s) plus its vote.
    let out = run(
        &env,
        &[
            "buy",
            "--voucher",
            "5",
            "--user",
            "1",
            "--connect-timeout",
            "1s",
        ],
    );
    cluster.signal(replica, "-CONT");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(env.in_flight(5).await, 1);
    env.cleanup().await;
}
