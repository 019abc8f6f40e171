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
