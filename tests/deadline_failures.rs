//! Payment deadlines on failure paths: a release that dies after the sweep's
//! cancellation is retried, a worker whose clock runs ahead cancels nothing
//! early and does not spin, one whose clock runs behind still sweeps, and
//! one broken voucher does not stall the others.

mod common;

use std::time::{Duration, Instant};

use common::clock::skewed_clock;
use common::invariants::assert_invariants;
use common::{fast_worker, TestEnv};
use redis::AsyncCommands;
use seckill::store::keys::VoucherKeys;

const V: u64 = 1;

/// Waits until every order of `voucher` is cancelled in MySQL.
async fn wait_all_cancelled(env: &TestEnv, voucher: u64, limit: Duration) {
    let start = Instant::now();
    loop {
        let orders = env.orders(voucher).await;
        if !orders.is_empty() && orders.iter().all(|o| o.2 == -1) {
            return;
        }
        assert!(start.elapsed() < limit, "not all cancelled: {orders:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweep_cancellation_whose_release_died_is_released_later() {
    let env = TestEnv::new().await;
    orders_whose_deadlines_redis_lost(&env).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    // The sweep finds them; the worker dies after cancelling in MySQL and
    // before giving the units back at the gate.
    let sweep = ["--sweep-every", "100ms", "--sweep-grace", "0s"];
    let dying = env.spawn_worker_with(
        &fast_worker(&sweep),
        &[(seckill::support::fault::ENV, "after_cancel=60s")],
    );
    let start = Instant::now();
    while !dying.log_text().contains("test pause at after_cancel") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            dying.log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_all_cancelled(&env, V, Duration::from_secs(10)).await;
    dying.kill9();
    let gate: i64 = redis.get(keys.stock()).await.unwrap();
    assert_eq!(gate, 0, "the gate has not seen the cancellations yet");
    // The next worker, once the dead one's claim has expired (--until-idle
    // leaves deadlines that are not due yet for a later run), gives every
    // unit back, once.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    env.spawn_worker(&fast_worker(&[&["--until-idle"][..], &sweep[..]].concat()))
        .expect_success(Duration::from_secs(60));
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 10);
    assert_eq!(s.redis_stock, Some(10), "every unit is back at the gate");
    env.cleanup().await;
}

/// Ten orders of voucher V, persisted and pending, whose payment deadlines
/// Redis has lost and which are overdue now. Three seconds to pay: the
/// drain before the loss must not cancel them itself.
async fn orders_whose_deadlines_redis_lost(env: &TestEnv) {
    const PAY_MS: u64 = 3_000;
    env.live_voucher_paying_within(V, 10, PAY_MS as i64).await;
    let admitted = Instant::now();
    env.admit_users(V, 10, 0).await;
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    let orders = env.orders(V).await;
    assert!(
        orders.len() == 10 && orders.iter().all(|o| o.2 == 0),
        "the drain took {:?}, past the payment window: {orders:?}",
        admitted.elapsed()
    );
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let _: () = redis.del(keys.timeouts()).await.unwrap();
    let _: () = redis.hdel(keys.meta(), "timeouts_digest").await.unwrap();
    let overdue = Duration::from_millis(PAY_MS + 200);
    tokio::time::sleep(overdue.saturating_sub(admitted.elapsed())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_whose_clock_runs_ahead_cancels_nothing_early_and_does_not_spin() {
    let env = TestEnv::new().await;
    // Ten minutes to pay; the worker's clock is half an hour ahead.
    env.live_voucher_paying_within(V, 10, 600_000).await;
    env.admit_users(V, 10, 0).await;
    let skew = skewed_clock("+30m", 1_500);
    let skew: Vec<(&str, &str)> = skew.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let start = Instant::now();
    let log = env
        .spawn_worker_with(
            &fast_worker(&[
                "--until-idle",
                "--sweep-every",
                "100ms",
                "--sweep-grace",
                "1s",
            ]),
            &skew,
        )
        .expect_success(Duration::from_secs(30));
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "--until-idle took {:?} to exit:\n{log}",
        start.elapsed()
    );
    let orders = env.orders(V).await;
    assert_eq!(orders.len(), 10);
    assert!(
        orders.iter().all(|o| o.2 == 0),
        "orders inside their payment window stay pending: {orders:?}\n{log}"
    );
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}

/// The sweep judges "overdue" by Redis's clock, not the worker's: a worker
/// half an hour behind still finds orders whose deadlines Redis lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_whose_clock_runs_behind_still_sweeps_lost_deadlines() {
    let env = TestEnv::new().await;
    orders_whose_deadlines_redis_lost(&env).await;
    let skew = skewed_clock("-30m", -1_500);
    let skew: Vec<(&str, &str)> = skew.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let behind = env.spawn_worker_with(
        &fast_worker(&["--sweep-every", "100ms", "--sweep-grace", "0s"]),
        &skew,
    );
    wait_all_cancelled(&env, V, Duration::from_secs(20)).await;
    behind.signal("TERM");
    let log = behind.expect_success(Duration::from_secs(30));
    assert!(log.contains("missed by Redis"), "{log}");
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 10);
    assert_eq!(s.redis_stock, Some(10), "every unit is back at the gate");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_broken_voucher_does_not_stall_the_deadlines_of_the_others() {
    let env = TestEnv::new().await;
    const BROKEN: u64 = 1;
    const FINE: u64 = 2;
    env.live_voucher_paying_within(BROKEN, 5, 1_000).await;
    env.live_voucher_paying_within(FINE, 5, 1_000).await;
    env.admit_users(BROKEN, 5, 0).await;
    env.admit_users(FINE, 5, 0).await;
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    // The first voucher's deadlines key gets the wrong type: claiming its
    // deadlines fails before anything is leased, on every pass.
    let broken = VoucherKeys::new(&env.prefix, BROKEN).unwrap();
    let mut redis = env.redis().await;
    let _: () = redis.del(broken.timeouts()).await.unwrap();
    let _: () = redis.set(broken.timeouts(), "not a zset").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let worker = env.spawn_worker(&fast_worker(&["--metrics-addr", &addr]));
    wait_all_cancelled(&env, FINE, Duration::from_secs(20)).await;
    let start = Instant::now();
    loop {
        let out = env
            .cmd()
            .args(["status", "--voucher", "1", "--format", "json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let j = common::json(&out);
        if j[0]["deadline_errors"].as_u64().unwrap_or(0) >= 2 {
            assert!(
                j[0]["deadline_read_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("WRONGTYPE")),
                "{j}"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the broken voucher's failures are not counted: {j}\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = common::scrape_metrics(port).await;
    let errors: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("seckill_deadline_errors_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no seckill_deadline_errors_total:\n{metrics}"));
    assert!(errors >= 2.0, "{metrics}");
    worker.signal("TERM");
    let log = worker.expect_success(Duration::from_secs(30));
    assert!(log.contains("voucher 1: payment deadlines failed"), "{log}");
    let s = assert_invariants(&env, FINE).await;
    assert_eq!(s.mysql_stock, 5);
    assert_eq!(s.redis_stock, Some(5));
    let untouched = env.orders(BROKEN).await;
    assert!(untouched.iter().all(|o| o.2 == 0), "{untouched:?}");
    env.cleanup().await;
}
