//! Layer 5 with real worker processes and short payment timeouts: unpaid
//! orders cancelled and their units given back exactly once, pay racing the
//! deadline, a crash between the MySQL cancellation and the Redis release,
//! the waitlist taking released units in order, and the MySQL sweep.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::invariants::assert_invariants;
use common::{json, TestEnv};
use redis::AsyncCommands;
use seckill::gate::admission::{admit, Admission};
use seckill::orders::payment::{self, PayOutcome};
use seckill::store::keys::VoucherKeys;
use seckill::support::snowflake::Snowflake;

const V: u64 = 1;
use common::fast_worker as worker_args;

async fn pay(env: &TestEnv, order: u64) -> PayOutcome {
    payment::pay(env.db().await, order).await.expect("pay")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unpaid_orders_are_cancelled_and_their_units_restored_exactly_once() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 20, 1_000).await;
    env.admit_users(V, 20, 0).await;
    let w = env.spawn_worker(&worker_args(&[]));
    env.wait_orders(V, 20, Duration::from_secs(30)).await;
    let orders = env.orders(V).await;
    for (id, _, _) in &orders[..5] {
        assert!(matches!(pay(&env, *id).await, PayOutcome::Paid { .. }));
    }
    env.wait_settled(V, Duration::from_secs(30)).await;
    // A second worker joining late must not give anything back again.
    let again = env.spawn_worker(&worker_args(&[
        "--sweep-every",
        "100ms",
        "--sweep-grace",
        "0s",
    ]));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for p in [w, again] {
        p.signal("TERM");
        p.expect_success(Duration::from_secs(20));
    }
    let s = assert_invariants(&env, V).await;
    let cancelled = s.orders.values().filter(|o| o.1 == -1).count();
    assert_eq!(cancelled, 15);
    assert_eq!(s.mysql_stock, 15);
    assert_eq!(s.redis_stock, Some(15));
    assert_eq!(s.released.len(), 15);
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let left: u64 = redis.zcard(keys.timeouts()).await.unwrap();
    assert_eq!(left, 0, "every deadline is done with");
    // Paying a cancelled order is refused with its own exit code.
    let cancelled_id = s.orders.values().find(|o| o.1 == -1).unwrap().0;
    let out = env
        .cmd()
        .args(["pay", "--order", &cancelled_id.to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(21));
    let paid_id = orders[0].0.to_string();
    assert_eq!(
        env.cmd()
            .args(["pay", "--order", &paid_id])
            .output()
            .unwrap()
            .status
            .code(),
        Some(20)
    );
    assert_eq!(
        env.cmd()
            .args(["pay", "--order", "12345"])
            .output()
            .unwrap()
            .status
            .code(),
        Some(22)
    );
    // What an operator sees when the customer calls.
    let shown = env
        .cmd()
        .args(["order", "show", &paid_id, "--format", "json"])
        .output()
        .unwrap();
    assert!(shown.status.success());
    let j = json(&shown);
    assert_eq!(j["id"], paid_id);
    assert_eq!(j["status"], "paid");
    assert_eq!(j["voucher"], V);
    assert_eq!(
        j["deadline_ms"].as_i64().unwrap() - j["created_ms"].as_i64().unwrap(),
        1_000
    );
    assert!(j["paid_ms"].as_i64().is_some() && j["cancelled_ms"].is_null());
    let table = env
        .cmd()
        .args(["order", "show", &cancelled_id.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("cancelled") && text.contains("payment deadline"),
        "{text}"
    );
    let unknown = env.cmd().args(["order", "show", "12345"]).output().unwrap();
    assert_eq!(unknown.status.code(), Some(22));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("there is no order 12345"));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pay_racing_the_deadline_ends_paid_or_cancelled_never_both() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 500, 2_000).await;
    env.admit_users(V, 500, 0).await;
    let w = env.spawn_worker(&worker_args(&["--batch", "64"]));
    env.wait_orders(V, 500, Duration::from_secs(30)).await;
    // Each order's deadline, as the worker scheduled it.
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    // Scheduled once each batch's finish has run, just after its commit.
    let scheduled = Instant::now();
    while redis.zcard::<_, usize>(keys.timeouts()).await.unwrap() < 500
        && scheduled.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadlines: Vec<(u64, f64)> = redis
        .zrange_withscores(keys.timeouts(), 0, -1)
        .await
        .unwrap();
    assert_eq!(deadlines.len(), 500);
    let db = Arc::new(env.db().await.clone());
    let mut tasks = Vec::new();
    for (i, (order, deadline)) in deadlines.into_iter().enumerate() {
        let db = db.clone();
        // At the deadline instant, give or take up to 100 ms (the 500 calls
        // queue for connections, so most land a little late).
        let at = deadline as i64 + (i as i64 % 201) - 120;
        tasks.push(tokio::spawn(async move {
            let wait = at - seckill::support::timespec::now_ms();
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
            }
            (order, payment::pay(&db, order).await.expect("pay"))
        }));
    }
    let mut said: BTreeMap<u64, PayOutcome> = BTreeMap::new();
    for t in tasks {
        let (order, outcome) = t.await.unwrap();
        said.insert(order, outcome);
    }
    env.wait_settled(V, Duration::from_secs(30)).await;
    w.signal("TERM");
    w.expect_success(Duration::from_secs(20));
    let orders = env.orders(V).await;
    let (mut paid, mut cancelled) = (0, 0);
    for (id, _, status) in &orders {
        match (said[id], status) {
            (PayOutcome::Paid { .. }, 1) => paid += 1,
            (PayOutcome::Cancelled | PayOutcome::DeadlinePassed, -1) => cancelled += 1,
            (outcome, status) => panic!("order {id}: pay said {outcome:?}, status is {status}"),
        }
    }
    eprintln!("at the deadline: {paid} paid, {cancelled} cancelled");
    assert_eq!(paid + cancelled, 500);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, cancelled as i64);
    assert_eq!(s.redis_stock, Some(cancelled as i64));
    assert_eq!(s.released.len(), cancelled);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_between_the_cancel_commit_and_the_release_restores_each_unit_once() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 30, 1_000).await;
    env.admit_users(V, 30, 0).await;
    let w = env.spawn_worker_with(
        &worker_args(&[]),
        &[(seckill::support::fault::ENV, "after_cancel=30s")],
    );
    let start = std::time::Instant::now();
    while !w.log_text().contains("test pause at after_cancel") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            w.log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    w.kill9();
    // MySQL cancelled and restocked; the gate has not seen it yet.
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let gate: i64 = redis.get(keys.stock()).await.unwrap();
    assert_eq!(gate, 0);
    assert!(env.orders(V).await.iter().any(|o| o.2 == -1));
    // Two workers pick up after the lease: each unit comes back once.
    let a = env.spawn_worker(&worker_args(&[]));
    let b = env.spawn_worker(&worker_args(&[]));
    env.wait_settled(V, Duration::from_secs(30)).await;
    let start = std::time::Instant::now();
    loop {
        let released: u64 = redis.scard(keys.released()).await.unwrap();
        if released == 30 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "only {released} released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for p in [a, b] {
        p.signal("TERM");
        p.expect_success(Duration::from_secs(20));
    }
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 30);
    assert_eq!(s.redis_stock, Some(30));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn released_units_go_to_the_waitlist_in_order_skipping_buyers() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 3, 1_000).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let ids = Snowflake::new(5).unwrap();
    for user in [1, 2, 3] {
        let a = admit(&mut redis, &keys, V, user, ids.next_id(), None)
            .await
            .unwrap();
        assert!(matches!(a, Admission::Admitted { .. }));
    }
    // A buyer who somehow sits at the head of the line must be skipped.
    let _: () = redis.zadd(keys.waitlist(), 2, 1).await.unwrap();
    let (a, b, c) = (100, 200, 300);
    for (i, user) in [a, b, c].into_iter().enumerate() {
        let out = admit(&mut redis, &keys, V, user, ids.next_id(), None)
            .await
            .unwrap();
        assert_eq!(
            out,
            Admission::SoldOut {
                waitlist_position: i as u64 + 2
            }
        );
    }
    let w = env.spawn_worker(&worker_args(&[]));
    // The three buyers do not pay: their units go to A, B and C, in that order.
    let start = std::time::Instant::now();
    let events = loop {
        let ev: redis::streams::StreamRangeReply = redis.xrange_all(keys.events()).await.unwrap();
        if ev.ids.len() >= 3 {
            break ev;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            w.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let promoted: Vec<u64> = events
        .ids
        .iter()
        .map(|e| e.get::<u64>("user").unwrap())
        .collect();
    assert_eq!(promoted, vec![a, b, c]);
    assert!(events
        .ids
        .iter()
        .all(|e| e.get::<String>("type").as_deref() == Some("promoted")));
    // Their promote orders are persisted, each with its own deadline; they pay.
    let promoted_orders: Vec<u64> = events
        .ids
        .iter()
        .map(|e| e.get::<u64>("order").unwrap())
        .collect();
    let start = std::time::Instant::now();
    loop {
        let stored = env.orders(V).await;
        if promoted_orders
            .iter()
            .all(|o| stored.iter().any(|s| s.0 == *o))
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "promote orders not persisted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (o, user) in promoted_orders.iter().zip([a, b, c]) {
        let out = pay(&env, *o).await;
        assert_eq!(out, PayOutcome::Paid { voucher: V, user }, "order {o}");
    }
    env.wait_settled(V, Duration::from_secs(30)).await;
    w.signal("TERM");
    w.expect_success(Duration::from_secs(20));
    let queue: u64 = redis.zcard(keys.waitlist()).await.unwrap();
    assert_eq!(
        queue, 0,
        "the buyer was dropped from the line, A, B, C left it"
    );
    let out = env
        .cmd()
        .args(["waitlist", "--voucher", "1", "--format", "json"])
        .output()
        .unwrap();
    let j = json(&out);
    assert_eq!(j["promotions"], 3);
    assert_eq!(j["length"], 0);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    assert_eq!(s.redis_stock, Some(0));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadlines_lost_from_redis_are_caught_by_the_mysql_sweep() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 10, 1_000).await;
    env.admit_users(V, 10, 0).await;
    env.spawn_worker(&worker_args(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let _: () = redis.del(keys.timeouts()).await.unwrap();
    let _: () = redis.hdel(keys.meta(), "timeouts_digest").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let log = env
        .spawn_worker(&worker_args(&[
            "--until-idle",
            "--sweep-every",
            "100ms",
            "--sweep-grace",
            "0s",
        ]))
        .expect_success(Duration::from_secs(60));
    assert!(log.contains("missed by Redis"), "{log}");
    assert!(env.orders(V).await.iter().all(|o| o.2 == -1));
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 10);
    assert_eq!(s.redis_stock, Some(10));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_releaser_overtaken_after_its_lease_gives_nothing_back_twice() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 20, 1_000).await;
    env.admit_users(V, 20, 0).await;
    // A stalls 2.5 s between its MySQL cancellation and its Redis release,
    // past its 1 s lease: B claims the same deadlines and releases them;
    // then A wakes up and releases the same orders again.
    let slow = env.spawn_worker_with(
        &worker_args(&["--format", "json"]),
        &[(seckill::support::fault::ENV, "after_cancel=2500ms")],
    );
    let start = std::time::Instant::now();
    while !slow.log_text().contains("test pause at after_cancel") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            slow.log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fast = env.spawn_worker(&worker_args(&["--format", "json"]));
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    slow.signal("TERM");
    fast.signal("TERM");
    let (slow, slow_log) = slow.expect_summary(Duration::from_secs(20));
    let (fast, fast_log) = fast.expect_summary(Duration::from_secs(20));
    let n = |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap();
    // A did cancel in MySQL, but B took the deadlines over after A's lease
    // and gave every unit back; A's late release found nothing left to give.
    assert!(
        n(&slow, "cancelled") > 0,
        "A cancelled nothing: {slow}\n{slow_log}"
    );
    assert_eq!(
        n(&slow, "cancelled") + n(&fast, "cancelled"),
        20,
        "{slow} / {fast}"
    );
    assert_eq!(
        n(&fast, "released"),
        20,
        "B did not take over A's deadlines: {fast}\n{fast_log}\nA: {slow}"
    );
    assert_eq!(n(&slow, "released"), 0, "A gave units back: {slow}");
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 20);
    assert_eq!(s.redis_stock, Some(20), "a unit was given back twice");
    env.cleanup().await;
}
