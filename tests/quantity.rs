//! Orders of more than one unit through the worker (issue 21, first part):
//! a stream entry's `quantity` field is persisted with the order, MySQL's
//! stock is taken in units, a short stock refuses whole orders only, and
//! the invariants hold in units. The entries are written here the way the
//! admission script writes them (buyer, stock, entry in one step), since
//! admission with a quantity is the next part.

mod common;

use std::time::Duration;

use common::invariants::assert_invariants;
use common::TestEnv;
use mysql_async::prelude::*;
use redis::AsyncCommands;
use seckill::store::keys::VoucherKeys;

/// What an admission of `quantity` units does at the gate.
async fn admit(env: &TestEnv, voucher: u64, user: u64, order: u64, quantity: u64) {
    let keys = VoucherKeys::new(&env.prefix, voucher).unwrap();
    let mut redis = env.redis().await;
    let mut pipe = redis::pipe();
    pipe.atomic()
        .decr(keys.stock(), quantity)
        .sadd(keys.buyers(), user)
        .xadd(
            keys.orders(),
            "*",
            &[
                ("user", user.to_string()),
                ("order", order.to_string()),
                ("voucher", voucher.to_string()),
                ("kind", "admit".to_string()),
                ("quantity", quantity.to_string()),
            ],
        );
    let _: () = pipe.query_async(&mut redis).await.unwrap();
    env.move_digest(voucher, "buyers_digest", &[user], 1).await;
}

fn drain(env: &TestEnv) {
    env.spawn_worker(&["--until-idle", "--block", "100ms"])
        .expect_success(Duration::from_secs(60));
}

async fn quantities(env: &TestEnv, voucher: u64) -> Vec<(u64, u64)> {
    let mut conn = env.db().await.conn().await.unwrap();
    conn.exec(
        "SELECT user_id, quantity FROM seckill_order WHERE voucher_id = ? ORDER BY user_id",
        (voucher,),
    )
    .await
    .unwrap()
}

async fn mysql_stock(env: &TestEnv, voucher: u64) -> i64 {
    let mut conn = env.db().await.conn().await.unwrap();
    conn.exec_first(
        "SELECT stock FROM seckill_voucher WHERE voucher_id = ?",
        (voucher,),
    )
    .await
    .unwrap()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_of_several_units_persist_in_units() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 10).await;
    for (user, quantity) in [(1, 3), (2, 2), (3, 1)] {
        admit(&env, 1, user, 100 + user, quantity).await;
    }
    let s = assert_invariants(&env, 1).await;
    assert_eq!(s.unpersisted_units(), 6, "in flight, in units");
    drain(&env);
    assert_eq!(quantities(&env, 1).await, [(1, 3), (2, 2), (3, 1)]);
    assert_eq!(mysql_stock(&env, 1).await, 4);
    assert_invariants(&env, 1).await;
    env.cleanup().await;
}

/// The gate admitted 8 units that MySQL does not have (a gate that lost
/// writes): MySQL's 5 go to whole orders in stream order, 3 and 2; the
/// order of 3 between them that no longer fits is dead-lettered, never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_stock_refuses_whole_orders_only() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 8).await;
    let mut conn = env.db().await.conn().await.unwrap();
    conn.exec_drop(
        "UPDATE seckill_voucher SET stock = 5, total_stock = 5 WHERE voucher_id = 1",
        (),
    )
    .await
    .unwrap();
    drop(conn);
    for (user, quantity) in [(1, 3), (2, 3), (3, 2)] {
        admit(&env, 1, user, 100 + user, quantity).await;
    }
    drain(&env);
    assert_eq!(quantities(&env, 1).await, [(1, 3), (3, 2)]);
    assert_eq!(mysql_stock(&env, 1).await, 0);
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let dead: redis::streams::StreamRangeReply = redis.xrange_all(keys.dead()).await.unwrap();
    let users: Vec<u64> = dead.ids.iter().filter_map(|e| e.get("user")).collect();
    assert_eq!(users, [2], "{dead:?}");
    // The operator sees what the letter holds.
    let out = env
        .cmd()
        .args(["pending", "--voucher", "1", "--format", "json"])
        .output()
        .unwrap();
    let j = common::json(&out);
    assert_eq!(j["dead"][0]["quantity"], "3", "{j}");
    env.cleanup().await;
}

/// Reconcile counts in units: a voucher whose orders hold several units
/// each is consistent, and a gate one unit high is found as one unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_counts_units() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 10).await;
    admit(&env, 1, 1, 101, 3).await;
    admit(&env, 1, 2, 102, 2).await;
    let report = |env: &TestEnv| {
        let out = env
            .cmd()
            .args([
                "reconcile",
                "--voucher",
                "1",
                "--dry-run",
                "--format",
                "json",
            ])
            .output()
            .unwrap();
        common::json(&out)
    };
    // In flight: the gate's 5 and MySQL's 10 agree less the 5 units on
    // their way.
    let j = report(&env);
    assert_eq!(j["vouchers"][0]["drifts"], serde_json::json!([]), "{j}");
    drain(&env);
    let j = report(&env);
    assert_eq!(j["vouchers"][0]["drifts"], serde_json::json!([]), "{j}");
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let _: i64 = redis.incr(keys.stock(), 1).await.unwrap();
    let j = report(&env);
    let drifts = &j["vouchers"][0]["drifts"];
    assert_eq!(drifts[0]["class"], "redis_stock_high", "{j}");
    assert_eq!(drifts[0]["amount"], 1, "{j}");
    env.cleanup().await;
}

/// Both stores (the node-id leases left out: `TestEnv::snapshot`).
async fn sale_snapshot(env: &TestEnv) -> common::Snapshot {
    env.snapshot().await
}

fn buy(env: &TestEnv, voucher: u64, user: u64, quantity: &str) -> std::process::Output {
    env.cmd()
        .args([
            "buy",
            "--voucher",
            &voucher.to_string(),
            "--user",
            &user.to_string(),
        ])
        .args(["--quantity", quantity, "--format", "json"])
        .output()
        .unwrap()
}

fn update(env: &TestEnv, voucher: u64, flags: &[&str]) {
    let out = env
        .cmd()
        .args(["voucher", "update", "--id", &voucher.to_string()])
        .args(flags)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_takes_all_its_units_or_none() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 5).await;
    update(&env, 1, &["--per-user-limit", "3"]);
    let out = buy(&env, 1, 1, "3");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // 2 left, 3 asked: refused whole, nothing written.
    let before = sale_snapshot(&env).await;
    let out = buy(&env, 1, 2, "3");
    assert_eq!(out.status.code(), Some(18), "{out:?}");
    let j = common::json(&out);
    assert_eq!(
        (&j["outcome"], &j["units_left"]),
        (
            &serde_json::json!("not_enough_stock"),
            &serde_json::json!(2)
        ),
        "{j}"
    );
    assert_eq!(
        sale_snapshot(&env).await,
        before,
        "a refusal wrote something"
    );
    assert_eq!(buy(&env, 1, 2, "2").status.code(), Some(0));
    assert_eq!(
        buy(&env, 1, 1, "1").status.code(),
        Some(10),
        "one order per user, whatever its quantity"
    );
    drain(&env);
    assert_eq!(quantities(&env, 1).await, [(1, 3), (2, 2)]);
    let s = assert_invariants(&env, 1).await;
    assert_eq!((s.mysql_stock, s.redis_stock), (0, Some(0)));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_quantities_are_one_line_and_write_nothing() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 10).await;
    update(&env, 1, &["--per-user-limit", "2"]);
    let before = sale_snapshot(&env).await;
    for (quantity, code) in [
        ("0", 2),
        ("3", 1),
        ("-1", 2),
        ("9223372036854775808", 2),
        ("two", 2),
        ("", 2),
    ] {
        let out = buy(&env, 1, 7, quantity);
        assert_eq!(
            out.status.code(),
            Some(code),
            "--quantity {quantity:?}: {out:?}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("quantity"),
            "--quantity {quantity:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        if code == 1 {
            assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
            assert!(stderr.contains("per-user limit"), "{stderr}");
        }
    }
    assert_eq!(
        sale_snapshot(&env).await,
        before,
        "a bad quantity wrote something"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_waitlist_answers_sold_out_and_writes_nothing() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 1).await;
    update(&env, 1, &["--waitlist-limit", "2"]);
    assert_eq!(buy(&env, 1, 1, "1").status.code(), Some(0));
    for (user, position) in [(2, 1), (3, 2)] {
        let out = buy(&env, 1, user, "1");
        assert_eq!(out.status.code(), Some(11));
        assert_eq!(common::json(&out)["waitlist_position"], position);
    }
    let before = sale_snapshot(&env).await;
    let out = buy(&env, 1, 4, "1");
    assert_eq!(out.status.code(), Some(11), "{out:?}");
    let j = common::json(&out);
    assert_eq!(
        (&j["waitlist_position"], &j["waitlist_full"]),
        (&serde_json::Value::Null, &serde_json::json!(true)),
        "{j}"
    );
    assert_eq!(
        sale_snapshot(&env).await,
        before,
        "an attempt at a full waitlist wrote something"
    );
    let table = env
        .cmd()
        .args(["buy", "--voucher", "1", "--user", "5"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("waitlist is full"),
        "{table:?}"
    );
    // A user already waiting keeps the place.
    assert_eq!(common::json(&buy(&env, 1, 2, "1"))["waitlist_position"], 1);
    // No cap any more: the next one waits.
    update(&env, 1, &["--no-waitlist-limit"]);
    assert_eq!(common::json(&buy(&env, 1, 4, "1"))["waitlist_position"], 3);
    env.cleanup().await;
}

/// A cancelled order of 3 units serves the waitlist in order, each request
/// whole: 1 unit to the first, the request of 3 behind it passed over (it
/// keeps its place), 2 to the next; the last waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_order_serves_waiting_requests_whole_in_order() {
    let env = TestEnv::new().await;
    // Long enough for the test to pay the promoted orders in time on a
    // loaded machine.
    env.live_voucher_paying_within(1, 3, 4_000).await;
    update(&env, 1, &["--per-user-limit", "3"]);
    assert_eq!(buy(&env, 1, 1, "3").status.code(), Some(0));
    for (user, quantity) in [(2, "1"), (3, "3"), (4, "2"), (5, "1")] {
        assert_eq!(buy(&env, 1, user, quantity).status.code(), Some(11));
    }
    let worker = env.spawn_worker(&common::fast_worker(&[]));
    // User 1's order is cancelled at its deadline; users 2 and 4 get
    // orders of 1 and 2 units, paid at once so that they stay.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let promoted = loop {
        let q = quantities(&env, 1).await;
        if q.iter().any(|(u, _)| *u == 2) && q.iter().any(|(u, _)| *u == 4) {
            break q;
        }
        assert!(std::time::Instant::now() < until, "no promotions: {q:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for (order, _, _) in env.orders(1).await.iter().filter(|o| o.1 != 1) {
        let paid = seckill::orders::payment::pay(env.db().await, *order)
            .await
            .unwrap();
        assert!(
            matches!(paid, seckill::orders::payment::PayOutcome::Paid { .. }),
            "{paid:?}"
        );
    }
    assert_eq!(promoted, [(1, 3), (2, 1), (4, 2)]);
    worker.signal("TERM");
    worker.expect_success(Duration::from_secs(30));
    let s = assert_invariants(&env, 1).await;
    assert_eq!(s.waitlist, [3, 5], "the request of 3 keeps its place");
    assert_eq!(s.redis_stock, Some(0));
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let wants: std::collections::HashMap<String, String> =
        redis.hgetall(keys.waitlist_quantity()).await.unwrap();
    assert_eq!(wants.get("3").map(String::as_str), Some("3"), "{wants:?}");
    assert!(
        !wants.contains_key("4"),
        "a served request's quantity stays: {wants:?}"
    );
    env.cleanup().await;
}

/// Thousands of attempts asking 1 to 3 units each at once: the units
/// admitted are the stock (less what no request fits), no order is
/// partial, and MySQL holds the same after the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_quantities_at_once_admit_exactly_the_stock() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 500).await;
    update(&env, 1, &["--per-user-limit", "3"]);
    let out = env
        .cmd()
        .args([
            "bench",
            "--voucher",
            "1",
            "--users",
            "1000",
            "--attempts",
            "2000",
        ])
        .args([
            "--quantity",
            "1-3",
            "--concurrency",
            "32",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let j = common::json(&out);
    let units = j["units_admitted"].as_u64().unwrap();
    let s = assert_invariants(&env, 1).await;
    let left = s.redis_stock.unwrap() as u64;
    assert_eq!(units + left, 500, "{j}");
    assert!(
        left < 3,
        "{left} units left while requests of 1 kept coming: {j}"
    );
    drain(&env);
    let q = quantities(&env, 1).await;
    assert_eq!(q.iter().map(|(_, k)| k).sum::<u64>(), units);
    assert!(q.iter().all(|(_, k)| (1..=3).contains(k)), "{q:?}");
    assert_eq!(q.len() as u64, j["outcomes"]["success"].as_u64().unwrap());
    let s = assert_invariants(&env, 1).await;
    assert_eq!(s.mysql_stock as u64, left);
    env.cleanup().await;
}

/// The worker killed with kill -9 again and again while buyers ask 1 to 3
/// units: every unit the gate admitted ends in exactly one order of its
/// quantity, and the invariants hold in units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nines_with_quantities_lose_nothing_and_double_nothing() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 6_000).await;
    update(&env, 1, &["--per-user-limit", "3"]);
    let sale = env.sale_of_quantities_in_background(1, 4_000, 0, 4_000, 4, (1, 3));
    for round in 0..8u64 {
        let w = env.spawn_worker(&common::fast_worker(&["--batch", "128"]));
        tokio::time::sleep(Duration::from_millis(150 + 37 * round)).await;
        w.kill9();
    }
    let report = sale.await.unwrap();
    env.spawn_worker(&common::fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(120));
    assert_eq!(env.in_flight(1).await, 0);
    let q = quantities(&env, 1).await;
    assert_eq!(q.len() as u64, report.outcomes.success);
    assert_eq!(q.iter().map(|(_, k)| k).sum::<u64>(), report.units_admitted);
    let s = assert_invariants(&env, 1).await;
    assert_eq!(s.mysql_stock as u64, 6_000 - report.units_admitted);
    env.cleanup().await;
}
