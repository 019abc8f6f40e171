//! MySQL stopped for a few seconds in the middle of a drain: the worker
//! waits, retries, resumes, and loses nothing. The outage is real — a MariaDB
//! instance of this test's own (scripts/services.sh with its own port and
//! data folder) is shut down and started again — so the shared server the
//! other tests use is never touched.

mod common;

use std::time::{Duration, Instant};

use common::invariants::assert_invariants;
use common::own_mysql::OwnMysql;
use seckill::orders::order::OrderStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_stopped_mid_drain_then_back_loses_nothing() {
    let mysql = OwnMysql::start("");
    let env = mysql.test_env().await;
    let v = 1;
    env.live_voucher(v, 20_000).await;
    env.admit_users(v, 20_000, 0).await;
    let w = env.spawn_worker(&["--batch", "64", "--claim-idle", "1s", "--block", "200ms"]);
    env.wait_orders(v, 1_000, Duration::from_secs(60)).await;
    mysql.services("down");
    tokio::time::sleep(Duration::from_secs(3)).await;
    mysql.services("up");
    env.wait_drained(v, Duration::from_secs(120)).await;
    w.signal("TERM");
    let log = w.expect_success(Duration::from_secs(30));
    assert!(
        log.contains("retrying"),
        "the worker never noticed the outage:\n{log}"
    );
    assert_eq!(env.order_count(v).await, 20_000);
    let s = assert_invariants(&env, v).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}

/// Deadlines that come due while MySQL is down are claimed, fail to cancel
/// and wait out their lease; once MySQL is back, the sweep finds those
/// orders overdue in MySQL. Redis missed nothing, and the log says what did
/// happen: the cancellation was delayed.
///
/// Timing: eight seconds to pay leave the set-up time to stop MySQL first;
/// the outage lasts six seconds past the deadlines, longer than the
/// deadline pass's longest retry wait (5 s), so a pass claims them while
/// MySQL is away; their 30 s lease outlasts the first pass after it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadlines_delayed_by_an_outage_are_not_reported_as_missed_by_redis() {
    const PAY: Duration = Duration::from_secs(8);
    let mysql = OwnMysql::start("");
    let env = mysql.test_env().await;
    let v = 1;
    env.live_voucher_paying_within(v, 20, PAY.as_millis() as i64)
        .await;
    let admitted = Instant::now();
    env.admit_users(v, 20, 0).await;
    let w = env.spawn_worker(&[
        "--deadline-lease",
        "30s",
        "--sweep-every",
        "300ms",
        "--sweep-grace",
        "300ms",
    ]);
    env.wait_orders(v, 20, Duration::from_secs(30)).await;
    // Their deadlines at the gate too: the batch is finished, not only
    // committed (a MySQL stopped between the two loses the COMMIT's reply:
    // then Redis has no deadline and the sweep rightly says so).
    let keys = seckill::store::keys::VoucherKeys::new(&env.prefix, v).unwrap();
    let mut redis = env.redis().await;
    let until = Instant::now() + Duration::from_secs(30);
    while redis::AsyncCommands::zcard::<_, u64>(&mut redis, keys.timeouts())
        .await
        .unwrap()
        < 20
    {
        assert!(
            Instant::now() < until,
            "the deadlines never reached the gate"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    mysql.services("down");
    assert!(
        admitted.elapsed() < PAY,
        "MySQL stopped {:?} after the admissions, past their deadlines",
        admitted.elapsed()
    );
    tokio::time::sleep((PAY + Duration::from_secs(6)).saturating_sub(admitted.elapsed())).await;
    mysql.services("up");
    env.wait_settled(v, Duration::from_secs(90)).await;
    w.signal("TERM");
    let log = w.expect_success(Duration::from_secs(30));
    assert!(
        log.contains("cancellation was delayed"),
        "the sweep never met the delayed orders:\n{log}"
    );
    assert!(!log.contains("missed by Redis"), "{log}");
    let orders = env.orders(v).await;
    let cancelled = OrderStatus::Cancelled.code();
    assert!(orders.iter().all(|o| o.2 == cancelled), "{orders:?}");
    assert_invariants(&env, v).await;
    env.cleanup().await;
}
