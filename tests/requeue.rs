//! `seckill pending --requeue` for every kind of dead letter, keeping the
//! gate's accounting: after the worker drains what was requeued, I1–I6 hold.

mod common;

use std::time::Duration;

use common::invariants::assert_invariants;
use common::{fast_worker, TestEnv};
use redis::AsyncCommands;
use seckill::gate::admission::admit;
use seckill::store::keys::VoucherKeys;

const V: u64 = 1;

fn outcome_of<'a>(report: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == id)
        .unwrap_or_else(|| panic!("{id} not in {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_dead_letter_is_requeued_or_kept_without_breaking_the_gate() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 8).await;
    env.admit_users(V, 3, 0).await; // users 1..3
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let stored = env.orders(V).await;
    let order_of = |user: u64| stored.iter().find(|o| o.1 == user).unwrap().0;

    // Its user is still a buyer: the unit taken at its admission is held.
    let held = env
        .admit_and_dead_letter(V, 4, 9_000_004, "voucher 1 is not in MySQL")
        .await;
    // Reconcile freed its user and gave the unit back since: requeueing
    // must take a unit at the gate again.
    let freed = env
        .admit_referenced_and_dead_letter(V, 5, 9_000_005, Some("cart-5"), "no stock in MySQL")
        .await;
    let changed: i64 = redis.srem(keys.buyers(), 5).await.unwrap();
    env.move_digest(V, "buyers_digest", &[5], -changed).await;
    let _: () = redis.incr(keys.stock(), 1).await.unwrap();
    // Its order id is another order's: requeued under a fresh one.
    let collided = env
        .admit_and_dead_letter(
            V,
            6,
            order_of(2),
            "order id collides with the order of user 2",
        )
        .await;
    // A second admission of a user who holds an order: kept.
    let changed: i64 = redis.srem(keys.buyers(), 1).await.unwrap();
    env.move_digest(V, "buyers_digest", &[1], -changed).await;
    let second = env
        .admit_and_dead_letter(V, 1, 9_000_011, "user 1 already holds an order")
        .await;
    // The gate was one unit ahead of MySQL (Redis lost a write): the unit
    // its admission took was never backed, so requeueing must take one at
    // the gate although its user is still a buyer.
    let _: () = redis.incr(keys.stock(), 1).await.unwrap();
    let unbacked = env
        .admit_and_dead_letter(V, 7, 9_000_007, "no stock in MySQL")
        .await;
    // Poison: kept.
    let poison: String = redis
        .xadd(
            keys.dead(),
            "*",
            &[
                ("entry", "1-1"),
                ("reason", "missing field 'user'"),
                ("order", "77"),
                ("voucher", "1"),
            ],
        )
        .await
        .unwrap();
    let stock_before: i64 = redis.get(keys.stock()).await.unwrap();

    let out = env.requeue(V);
    assert!(out.status.success(), "{out:?}");
    let report = common::json(&out);
    assert_eq!(
        outcome_of(&report, &held)["outcome"],
        "requeued",
        "{report}"
    );
    assert_eq!(
        outcome_of(&report, &freed)["outcome"],
        "readmitted",
        "{report}"
    );
    assert_eq!(
        outcome_of(&report, &collided)["outcome"],
        "renumbered",
        "{report}"
    );
    assert_ne!(
        outcome_of(&report, &collided)["order"],
        order_of(2).to_string(),
        "{report}"
    );
    assert_eq!(
        outcome_of(&report, &second)["outcome"],
        "skipped",
        "{report}"
    );
    assert!(outcome_of(&report, &second)["reason"]
        .as_str()
        .unwrap()
        .contains("already holds order"));
    assert_eq!(
        outcome_of(&report, &poison)["outcome"],
        "skipped",
        "{report}"
    );
    assert_eq!(
        outcome_of(&report, &unbacked)["outcome"],
        "readmitted",
        "{report}"
    );
    assert_eq!(report["requeued"], 4);
    assert_eq!(report["skipped"], 2);
    let stock_after: i64 = redis.get(keys.stock()).await.unwrap();
    assert_eq!(
        stock_after,
        stock_before - 2,
        "only the re-admissions took a unit"
    );
    let dead: u64 = redis.xlen(keys.dead()).await.unwrap();
    assert_eq!(dead, 2, "the kept ones stay dead letters");

    // The second admission's gate unit is not an order's: give it back as
    // reconcile would, so that the gate agrees with MySQL again.
    let changed: i64 = redis.sadd(keys.buyers(), 1).await.unwrap();
    env.move_digest(V, "buyers_digest", &[1], changed).await;
    let _: () = redis.incr(keys.stock(), 1).await.unwrap();
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    let users: Vec<u64> = env.orders(V).await.iter().map(|o| o.1).collect();
    for u in [4, 5, 6, 7] {
        assert!(users.contains(&u), "user {u} has an order: {users:?}");
    }
    // A requeued letter's order keeps the reference its admission carried.
    let db = env.db().await;
    let order = seckill::orders::order::of_user(db, V, 5).await.unwrap();
    assert_eq!(
        order.and_then(|o| o.client_reference).as_deref(),
        Some("cart-5")
    );
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 1);
    assert_eq!(s.redis_stock, Some(1));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_whose_unit_went_elsewhere_is_not_requeued_when_none_is_left() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 1).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let freed = env
        .admit_and_dead_letter(V, 8, 9_000_008, "no stock in MySQL")
        .await;
    // Reconcile gave its unit back; another user bought it.
    let changed: i64 = redis.srem(keys.buyers(), 8).await.unwrap();
    env.move_digest(V, "buyers_digest", &[8], -changed).await;
    let _: () = redis.incr(keys.stock(), 1).await.unwrap();
    assert_eq!(
        admit(&mut redis, &keys, V, 9, 9_000_009, None)
            .await
            .unwrap()
            .name(),
        "success"
    );
    let out = env.requeue(V);
    let report = common::json(&out);
    let e = outcome_of(&report, &freed);
    assert_eq!(e["outcome"], "skipped", "{report}");
    assert!(
        e["reason"].as_str().unwrap().contains("none is left"),
        "{report}"
    );
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.orders.len(), 1, "one unit, one order");
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}
