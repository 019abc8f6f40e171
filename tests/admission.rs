//! Layer 1 under real concurrency: thousands of simultaneous attempts against
//! real Redis, then every invariant checked against both stores.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use common::invariants::assert_invariants;
use common::TestEnv;
use redis::AsyncCommands;
use seckill::gate::admission::{admit, Admission};
use seckill::store::keys::VoucherKeys;
use seckill::support::snowflake::Snowflake;
use tokio::sync::Barrier;

const VOUCHER: u64 = 1;

/// Every user of `users` tries twice, all attempts released at once.
async fn simultaneous_sale(env: &TestEnv, users: u64) -> Vec<(u64, Admission)> {
    let keys = Arc::new(VoucherKeys::new(&env.prefix, VOUCHER).unwrap());
    let ids = Arc::new(Snowflake::new(1).unwrap());
    let mut conns = Vec::new();
    for _ in 0..8 {
        conns.push(env.new_redis_connection().await);
    }
    let attempts = (users * 2) as usize;
    let barrier = Arc::new(Barrier::new(attempts));
    let mut tasks = Vec::with_capacity(attempts);
    for i in 0..attempts {
        let user = (i as u64 % users) + 1;
        let mut conn = conns[i % conns.len()].clone();
        let (keys, ids, barrier) = (keys.clone(), ids.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let outcome = admit(&mut conn, &keys, VOUCHER, user, ids.next_id(), None)
                .await
                .expect("admit");
            (user, outcome)
        }));
    }
    let mut results = Vec::with_capacity(attempts);
    for t in tasks {
        results.push(t.await.expect("task"));
    }
    results
}

async fn check_sale(stock: i64) {
    let env = TestEnv::new().await;
    env.live_voucher(VOUCHER, stock).await;
    let users = 1_000u64;
    let results = simultaneous_sale(&env, users).await;
    let expected_winners = (stock as u64).min(users);

    let mut by_user: BTreeMap<u64, Vec<Admission>> = BTreeMap::new();
    for (user, outcome) in &results {
        by_user.entry(*user).or_default().push(*outcome);
    }
    let winners: BTreeSet<u64> = results
        .iter()
        .filter(|(_, o)| matches!(o, Admission::Admitted { .. }))
        .map(|(u, _)| *u)
        .collect();
    let successes = results
        .iter()
        .filter(|(_, o)| matches!(o, Admission::Admitted { .. }))
        .count();
    assert_eq!(successes as u64, expected_winners, "successes");
    assert_eq!(winners.len(), successes, "a user was admitted twice");

    let mut positions = BTreeSet::new();
    for (user, outcomes) in &by_user {
        assert_eq!(outcomes.len(), 2);
        if winners.contains(user) {
            // The attempt that lost the race can only come after the win.
            assert!(
                outcomes.contains(&Admission::AlreadyBought),
                "user {user}: {outcomes:?}"
            );
        } else {
            let pos: Vec<u64> = outcomes
                .iter()
                .map(|o| match o {
                    Admission::SoldOut { waitlist_position } => *waitlist_position,
                    other => panic!("user {user} got {other:?}"),
                })
                .collect();
            assert_eq!(pos[0], pos[1], "user {user} queued twice: {pos:?}");
            positions.insert(pos[0]);
        }
    }
    let waitlisted = users - expected_winners;
    let expected_positions: BTreeSet<u64> = (1..=waitlisted).collect();
    assert_eq!(
        positions, expected_positions,
        "waitlist positions are 1..=N, one per user"
    );

    let keys = VoucherKeys::new(&env.prefix, VOUCHER).unwrap();
    let mut redis = env.redis().await;
    let stream_len: u64 = redis.xlen(keys.orders()).await.unwrap();
    let stock_left: i64 = redis.get(keys.stock()).await.unwrap();
    let buyers: u64 = redis.scard(keys.buyers()).await.unwrap();
    let queue: u64 = redis.zcard(keys.waitlist()).await.unwrap();
    assert_eq!(stream_len, expected_winners, "stream entries");
    assert_eq!(buyers, expected_winners, "buyers");
    assert_eq!(stock_left, stock - expected_winners as i64, "stock left");
    assert_eq!(queue, waitlisted, "waitlist length");

    // The stream carries exactly the admitted orders.
    let entries: redis::streams::StreamRangeReply = redis.xrange_all(keys.orders()).await.unwrap();
    let admitted_orders: BTreeSet<u64> = results
        .iter()
        .filter_map(|(_, o)| match o {
            Admission::Admitted { order_id } => Some(*order_id),
            _ => None,
        })
        .collect();
    let stream_orders: BTreeSet<u64> = entries
        .ids
        .iter()
        .map(|e| e.get::<u64>("order").unwrap())
        .collect();
    assert_eq!(stream_orders, admitted_orders);
    assert!(entries
        .ids
        .iter()
        .all(|e| e.get::<String>("kind").as_deref() == Some("admit")));
    assert!(entries
        .ids
        .iter()
        .all(|e| e.get::<u64>("voucher") == Some(VOUCHER)));

    let state = assert_invariants(&env, VOUCHER).await;
    assert_eq!(state.buyers, winners);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_attempts_for_one_hundred_units() {
    check_sale(100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_attempts_for_one_unit() {
    check_sale(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_attempts_for_more_units_than_buyers() {
    check_sale(5_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zero_stock_waitlists_everyone_in_arrival_order() {
    let env = TestEnv::new().await;
    env.live_voucher(VOUCHER, 0).await;
    let keys = VoucherKeys::new(&env.prefix, VOUCHER).unwrap();
    let mut redis = env.redis().await;
    let ids = Snowflake::new(1).unwrap();
    // Users arriving one after another, faster than a millisecond apart.
    let arrivals = [900u64, 30, 500, 7, 64];
    for (i, user) in arrivals.iter().enumerate() {
        let outcome = admit(&mut redis, &keys, VOUCHER, *user, ids.next_id(), None)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Admission::SoldOut {
                waitlist_position: i as u64 + 1
            }
        );
    }
    let queue: Vec<u64> = redis.zrange(keys.waitlist(), 0, -1).await.unwrap();
    assert_eq!(queue, arrivals, "the waitlist is first come, first served");
    assert_invariants(&env, VOUCHER).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waitlisted_user_admitted_later_leaves_the_waitlist() {
    let env = TestEnv::new().await;
    env.live_voucher(VOUCHER, 1).await;
    let keys = VoucherKeys::new(&env.prefix, VOUCHER).unwrap();
    let mut redis = env.redis().await;
    let ids = Snowflake::new(1).unwrap();
    assert!(matches!(
        admit(&mut redis, &keys, VOUCHER, 1, ids.next_id(), None)
            .await
            .unwrap(),
        Admission::Admitted { .. }
    ));
    assert_eq!(
        admit(&mut redis, &keys, VOUCHER, 2, ids.next_id(), None)
            .await
            .unwrap(),
        Admission::SoldOut {
            waitlist_position: 1
        }
    );
    // A unit comes back at the gate (as a release without a waitlist would do).
    let _: () = redis.incr(keys.stock(), 1).await.unwrap();
    assert!(matches!(
        admit(&mut redis, &keys, VOUCHER, 2, ids.next_id(), None)
            .await
            .unwrap(),
        Admission::Admitted { .. }
    ));
    let queue: u64 = redis.zcard(keys.waitlist()).await.unwrap();
    assert_eq!(queue, 0, "an admitted user must not stay on the waitlist");
    env.cleanup().await;
}
