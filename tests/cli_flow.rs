//! The commands end to end through the real binary: exit codes per outcome,
//! JSON fields, and preload's refusal to re-admit units in flight.

mod common;

use common::invariants::assert_invariants;
use common::{json, TestEnv};
use mysql_async::prelude::*;
use redis::AsyncCommands;

fn run(env: &TestEnv, args: &[&str]) -> std::process::Output {
    env.cmd().args(args).output().expect("run seckill")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_is_idempotent_and_reports_versions() {
    let env = TestEnv::uninitialised().await;
    let first = run(&env, &["init", "--format", "json"]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let j = json(&first);
    assert_eq!(j["schema"]["from"], 0);
    assert_eq!(j["schema"]["to"], seckill::store::schema::latest());
    assert!(j["redis"]["version"]
        .as_str()
        .unwrap()
        .starts_with(char::is_numeric));
    assert!(j["mysql"]["url"].as_str().unwrap().contains(":***@"));
    let again = json(&run(&env, &["init", "--format", "json"]));
    assert_eq!(again["schema"]["from"], seckill::store::schema::latest());
    assert_eq!(again["schema"]["applied"].as_array().unwrap().len(), 0);
    let table = run(&env, &["init"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("up to date"));
    env.cleanup().await;
}

/// Schema 5 counts the orders a database already holds into the voucher
/// rows (and counts again when a crashed run left it half done).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counters_migration_counts_the_orders_already_there() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 20).await;
    env.admit_users(1, 7, 0).await;
    env.spawn_worker(&["--until-idle", "--block", "100ms"])
        .expect_success(std::time::Duration::from_secs(60));
    let order = env.orders(1).await[0].0;
    assert!(run(&env, &["pay", "--order", &order.to_string()])
        .status
        .success());
    // As a schema-4 database would hold them: no counters, migration 5 not
    // recorded (its columns added by a run that crashed before the count),
    // nor any later one (their columns there: added again, harmlessly).
    {
        let mut conn = env.db().await.conn().await.unwrap();
        conn.query_drop(
            "UPDATE seckill_voucher SET orders_total = 0, units_total = 0, orders_paid = 0,
                    units_paid = 0, orders_cancelled = 0, units_cancelled = 0;
             DELETE FROM seckill_schema_history WHERE version >= 5",
        )
        .await
        .unwrap();
    }
    let init = json(&run(&env, &["init", "--format", "json"]));
    assert_eq!(init["schema"]["from"], 4, "{init:#}");
    assert_eq!(init["schema"]["applied"][0], "5 order counters");
    assert_eq!(init["schema"]["applied"][1], "6 stock buckets");
    let list = json(&run(&env, &["voucher", "list", "--format", "json"]));
    assert_eq!(list[0]["orders"]["pending"], 6);
    assert_eq!(list[0]["orders"]["paid"], 1);
    assert_invariants(&env, 1).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buy_exit_codes_and_json_per_outcome() {
    let env = TestEnv::new().await;
    let add = run(
        &env,
        &[
            "voucher", "add", "--id", "1", "--stock", "1", "--begin", "-1m", "--end", "+1h",
            "--title", "one unit",
        ],
    );
    assert!(
        add.status.success(),
        "{}",
        String::from_utf8_lossy(&add.stderr)
    );
    assert!(run(
        &env,
        &["voucher", "add", "--id", "2", "--stock", "5", "--begin", "+1h"]
    )
    .status
    .success());
    assert!(run(
        &env,
        &["voucher", "add", "--id", "3", "--stock", "5", "--begin", "-2h", "--end", "-1h"]
    )
    .status
    .success());
    let pre = run(&env, &["preload", "--all", "--format", "json"]);
    assert!(
        pre.status.success(),
        "{}",
        String::from_utf8_lossy(&pre.stderr)
    );
    assert_eq!(json(&pre).as_array().unwrap().len(), 3);

    let buy = |voucher: &str, user: &str| {
        run(
            &env,
            &[
                "buy",
                "--voucher",
                voucher,
                "--user",
                user,
                "--format",
                "json",
            ],
        )
    };
    let ok = buy("1", "10");
    assert_eq!(ok.status.code(), Some(0));
    let j = json(&ok);
    assert_eq!(j["outcome"], "success");
    assert!(j["order_id"].as_str().unwrap().parse::<u64>().unwrap() > 0);

    let again = buy("1", "10");
    assert_eq!(again.status.code(), Some(10));
    assert_eq!(json(&again)["outcome"], "already_bought");

    let sold_out = buy("1", "11");
    assert_eq!(sold_out.status.code(), Some(11));
    assert_eq!(json(&sold_out)["waitlist_position"], 1);

    let early = buy("2", "10");
    assert_eq!(early.status.code(), Some(12));
    assert_eq!(json(&early)["outcome"], "not_started");
    assert!(json(&early)["begin"].as_str().unwrap().ends_with('Z'));

    let late = buy("3", "10");
    assert_eq!(late.status.code(), Some(13));
    assert_eq!(json(&late)["outcome"], "ended");

    let unknown = buy("4", "10");
    assert_eq!(unknown.status.code(), Some(14));
    assert_eq!(json(&unknown)["outcome"], "unknown_voucher");

    // The human line says the same.
    let text = run(&env, &["buy", "--voucher", "1", "--user", "12"]);
    assert_eq!(text.status.code(), Some(11));
    assert_eq!(
        String::from_utf8_lossy(&text.stdout).trim(),
        "sold out: voucher 1 has no unit left; user 12 is number 2 on the waitlist"
    );

    let list = json(&run(&env, &["voucher", "list", "--format", "json"]));
    let v1 = &list.as_array().unwrap()[0];
    assert_eq!(v1["id"], 1);
    assert_eq!(v1["title"], "one unit");
    assert_eq!(v1["state"], "live");
    assert_eq!(v1["total_stock"], 1);
    assert_eq!(v1["mysql_stock"], 1);
    assert_eq!(v1["gate"]["stock"], 0);
    assert_eq!(v1["gate"]["buyers"], 1);
    assert_eq!(v1["gate"]["waitlist"], 2);
    assert_eq!(v1["gate"]["stream_length"], 1);
    assert_eq!(list[1]["state"], "upcoming");
    assert_eq!(list[2]["state"], "ended");
    let only = json(&run(
        &env,
        &["voucher", "list", "--voucher", "3", "--format", "json"],
    ));
    assert_eq!(only.as_array().unwrap().len(), 1);
    assert_eq!(only[0]["id"], 3);
    let missing = run(&env, &["voucher", "list", "--voucher", "99"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("voucher 99 does not exist"));
    assert_invariants(&env, 1).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preload_refuses_while_orders_are_in_flight() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 10).await;
    assert_eq!(
        run(&env, &["buy", "--voucher", "1", "--user", "5"])
            .status
            .code(),
        Some(0)
    );
    let before = env.snapshot().await;
    let refused = run(&env, &["preload", "--voucher", "1"]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("1 order(s) in flight"), "{stderr}");
    assert!(stderr.contains("seckill reconcile"), "{stderr}");
    assert_eq!(
        env.snapshot().await,
        before,
        "a refused preload wrote something"
    );
    assert_invariants(&env, 1).await;

    // --force does what it says: MySQL's stock (10) is copied over the gate's (9).
    let forced = run(
        &env,
        &["preload", "--voucher", "1", "--force", "--format", "json"],
    );
    assert!(forced.status.success());
    assert_eq!(json(&forced)[0]["in_flight_ignored"], 1);
    let keys = seckill::store::keys::VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let stock: i64 = redis.get(keys.stock()).await.unwrap();
    assert_eq!(stock, 10);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preload_rebuilds_the_gate_from_mysql_and_is_idempotent() {
    let env = TestEnv::new().await;
    env.add_voucher(1, 10, -1_000, 3_600_000).await;
    // Orders persisted earlier (as the worker would have): users 5 (pending),
    // 6 (paid), 7 (cancelled, its unit back in stock).
    {
        let mut conn = env.db().await.conn().await.unwrap();
        conn.query_drop(
            "INSERT INTO seckill_order (id, user_id, voucher_id, status, create_time) VALUES
                (101, 5, 1, 0, NOW(3)), (102, 6, 1, 1, NOW(3)), (103, 7, 1, -1, NOW(3))",
        )
        .await
        .unwrap();
        conn.query_drop("UPDATE seckill_voucher SET stock = stock - 2 WHERE voucher_id = 1")
            .await
            .unwrap();
    }
    env.keep_counters(1).await;
    let keys = seckill::store::keys::VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    // Stale gate state that preload must replace, not merge.
    let _: () = redis.sadd(keys.buyers(), 999).await.unwrap();
    let _: () = redis.set(keys.stock(), 42).await.unwrap();

    let out = run(&env, &["preload", "--voucher", "1", "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = json(&out);
    assert_eq!(j[0]["stock"], 8);
    assert_eq!(j[0]["buyers"], 3);
    let buyers: std::collections::BTreeSet<u64> = redis.smembers(keys.buyers()).await.unwrap();
    assert_eq!(buyers, [5, 6, 7].into_iter().collect());
    let stock: i64 = redis.get(keys.stock()).await.unwrap();
    assert_eq!(stock, 8);
    let registered: bool = redis
        .sismember(seckill::store::registry::key(&env.prefix).unwrap(), 1)
        .await
        .unwrap();
    assert!(registered);
    let fields: std::collections::HashMap<String, String> =
        redis.hgetall(keys.meta()).await.unwrap();
    // The numeric fields (meta holds strings too: the run id preload checked on).
    let meta: std::collections::HashMap<&str, i64> = fields
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.parse().ok()?)))
        .collect();
    assert_eq!(meta["total"], 10);
    assert_eq!(meta["pay_timeout_ms"], 900_000);
    assert!(meta["begin_ms"] < meta["end_ms"]);

    // The cancelled order's unit is in the stock preload published: it is
    // marked given back, so nothing gives it back again. The pending order
    // has its deadline; the paid one has none.
    let released: Vec<u64> = redis.smembers(keys.released()).await.unwrap();
    assert_eq!(released, vec![103]);
    let deadlines: Vec<(u64, f64)> = redis
        .zrange_withscores(keys.timeouts(), 0, -1)
        .await
        .unwrap();
    assert_eq!(deadlines.len(), 1);
    assert_eq!(deadlines[0].0, 101);

    // Byte for byte, but for the run tag the publish records in meta (a
    // resent publish knows itself by it): compared field by field.
    let meta_but_run = |mut m: std::collections::HashMap<String, String>| {
        assert!(m.remove("published_run").is_some(), "the run is recorded");
        m
    };
    let mut snap = env.snapshot().await;
    let meta_before: std::collections::HashMap<String, String> =
        redis.hgetall(keys.meta()).await.unwrap();
    assert!(run(&env, &["preload", "--voucher", "1"]).status.success());
    let mut again = env.snapshot().await;
    let meta_after: std::collections::HashMap<String, String> =
        redis.hgetall(keys.meta()).await.unwrap();
    assert_eq!(
        meta_but_run(meta_after),
        meta_but_run(meta_before),
        "a second preload changed meta"
    );
    snap.redis.remove(&keys.meta());
    again.redis.remove(&keys.meta());
    assert_eq!(again, snap, "a second preload changed something");

    // A user whose order was cancelled still holds their one order ever.
    assert_eq!(
        run(&env, &["buy", "--voucher", "1", "--user", "7"])
            .status
            .code(),
        Some(10)
    );
    assert_invariants(&env, 1).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_reports_every_outcome_in_json() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 50).await;
    let out = run(
        &env,
        &[
            "bench",
            "--voucher",
            "1",
            "--users",
            "200",
            "--attempts",
            "400",
            "--concurrency",
            "32",
            "--format",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = json(&out);
    let o = &j["outcomes"];
    assert_eq!(o["success"], 50);
    assert_eq!(o["already_bought"], 50);
    assert_eq!(o["sold_out"], 300);
    assert_eq!(j["attempts"], 400);
    assert_eq!(j["errors"], 0);
    assert!(j["attempts_per_sec"].as_f64().unwrap() > 0.0);
    for p in ["p50_us", "p90_us", "p99_us", "p999_us", "max_us"] {
        assert!(j["latency"][p].as_u64().is_some(), "{p}");
    }
    assert!(j["latency"]["p50_us"].as_u64() <= j["latency"]["max_us"].as_u64());
    assert_invariants(&env, 1).await;
    env.cleanup().await;
}
