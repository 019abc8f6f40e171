//! The waiting room over HTTP, as a browser-facing application reads it:
//! a buyer's state (bought, waiting with their place in line, not waiting,
//! ended), every bucket's line counted in one order, a long poll that
//! wakes on the buyer's promotion, and the sale's claimed share and line.

mod common;

use std::time::Duration;

use common::invariants::assert_invariants;
use common::serve_proc::Serve;
use common::{fast_worker, within_seconds, TestEnv};
use seckill::store::layout::bucket_of;
use serde_json::{json, Value};

/// The `skip`-th user from 1000 up who belongs to bucket `b` of 2.
fn in_bucket_of_2(b: u32, skip: usize) -> u64 {
    (1000..)
        .filter(|u| bucket_of(*u, 2) == b)
        .nth(skip)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_buyer_sees_their_place_and_a_long_poll_wakes_on_their_promotion() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    // One unit whose buyer does not pay within 2 s.
    env.add_voucher_paying_within(V, 1, -1_000, 3_600_000, 2_000)
        .await;
    env.preload(V).await;
    let serve = Serve::start(&env, &[]);
    assert_eq!(serve.buy(V, json!(1)).0, 201);
    assert_eq!(serve.buy(V, json!(2)).0, 410);
    assert_eq!(serve.buy(V, json!(3)).0, 410);
    let bought = serve.standing(V, 1);
    assert_eq!(
        (bought["state"].as_str(), bought["bought"].as_bool()),
        (Some("bought"), Some(true))
    );
    let next = serve.standing(V, 2);
    assert_eq!(next["state"], "waiting", "{next}");
    assert_eq!(
        (next["position"].as_u64(), next["ahead"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(next["bought"], false);
    // No pace seen yet: no basis for an estimate.
    assert_eq!(next["eta_ms"], Value::Null);
    let after = serve.standing(V, 3);
    assert_eq!(
        (after["position"].as_u64(), after["ahead"].as_u64()),
        (Some(2), Some(1))
    );
    let stranger = serve.standing(V, 4);
    assert_eq!(stranger["state"], "not_waiting");
    assert_eq!(stranger["position"], Value::Null);
    let (status, sale) = serve.get(&format!("/v1/vouchers/{V}"), None);
    assert_eq!(status, 200);
    assert_eq!(
        (sale["claimed"].as_f64(), sale["waiting"].as_u64()),
        (Some(1.0), Some(2)),
        "{sale}"
    );

    // The buyer does not pay: the unit goes to user 2, whose held request
    // is answered then, not at the end of its wait.
    let held = std::thread::scope(|s| {
        let poll = s.spawn(|| {
            let started = std::time::Instant::now();
            let (status, body) = serve.get(&format!("/v1/vouchers/{V}/purchases/2?wait=30s"), None);
            (status, body, started.elapsed())
        });
        let worker = env.spawn_worker(&fast_worker(&[]));
        let answer = poll.join().unwrap();
        worker.kill9();
        answer
    });
    let (status, body, took) = held;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["state"], "bought",
        "the poll ended without the promotion: {body} after {took:?}"
    );
    assert!(
        took < Duration::from_secs(29),
        "woke at the end of its wait: {took:?}"
    );
    let moved = serve.standing(V, 3);
    assert_eq!(
        (moved["position"].as_u64(), moved["ahead"].as_u64()),
        (Some(1), Some(0)),
        "{moved}"
    );
    env.spawn_worker(&["--until-idle", "--block", "100ms"])
        .expect_success(Duration::from_secs(60));
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_in_line_counts_every_bucket_s_requests_queued_before_it() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    // Two units in two buckets: one buyer in each sells it out.
    env.live_voucher_in_buckets(V, 2, 2).await;
    let serve = Serve::start(&env, &[]);
    assert_eq!(serve.buy(V, json!(in_bucket_of_2(0, 0))).0, 201);
    assert_eq!(serve.buy(V, json!(in_bucket_of_2(1, 0))).0, 201);
    // In line, in this order: bucket 0, bucket 1, bucket 1, bucket 0.
    let line = [
        in_bucket_of_2(0, 1),
        in_bucket_of_2(1, 1),
        in_bucket_of_2(1, 2),
        in_bucket_of_2(0, 2),
    ];
    for user in line {
        let (status, body) = serve.buy(V, json!(user));
        assert_eq!(status, 410, "{body}");
    }
    for (place, user) in line.iter().enumerate() {
        let body = serve.standing(V, *user);
        assert_eq!(body["state"], "waiting", "{body}");
        assert_eq!(
            body["position"].as_u64(),
            Some(place as u64 + 1),
            "user {user}: {body}"
        );
    }
    let (_, sale) = serve.get(&format!("/v1/vouchers/{V}"), None);
    assert_eq!(sale["waiting"].as_u64(), Some(4), "{sale}");
    env.cleanup().await;
}

/// Requests of two buckets queued in the same microsecond (Redis's clock
/// gives each bucket's script its own time, so they can tie) take two
/// places, the lower bucket's first, as the mover serves them; neither
/// is told it is first while the other is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_of_two_buckets_queued_in_one_microsecond_take_two_places() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    let (layout, mut redis) = env.live_voucher_in_buckets(V, 2, 2).await;
    let serve = Serve::start(&env, &[]);
    assert_eq!(serve.buy(V, json!(in_bucket_of_2(0, 0))).0, 201);
    assert_eq!(serve.buy(V, json!(in_bucket_of_2(1, 0))).0, 201);
    let (first, second) = (in_bucket_of_2(0, 1), in_bucket_of_2(1, 1));
    for user in [second, first] {
        assert_eq!(serve.buy(V, json!(user)).0, 410);
    }
    // The two requests' queued times made equal, as a tie leaves them.
    let tied: f64 =
        redis::AsyncCommands::zscore(&mut redis, layout.keys(1).unwrap().waitlist(), second)
            .await
            .unwrap();
    let _: () =
        redis::AsyncCommands::zadd(&mut redis, layout.keys(0).unwrap().waitlist(), first, tied)
            .await
            .unwrap();
    let places: Vec<Option<u64>> = [first, second]
        .iter()
        .map(|u| serve.standing(V, *u)["position"].as_u64())
        .collect();
    assert_eq!(places, [Some(1), Some(2)]);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_sale_s_end_a_buyer_stays_bought_and_everyone_else_is_ended() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.add_voucher(V, 1, -1_000, 2_000).await;
    env.preload(V).await;
    let serve = Serve::start(&env, &[]);
    assert_eq!(serve.buy(V, json!(1)).0, 201);
    assert_eq!(serve.buy(V, json!(2)).0, 410);
    assert_eq!(serve.standing(V, 2)["state"], "waiting");
    within_seconds(30, "the sale ended", || {
        serve.get(&format!("/v1/vouchers/{V}"), None).1["state"] == "ended"
    });
    assert_eq!(serve.standing(V, 1)["state"], "bought");
    for user in [2, 3] {
        let body = serve.standing(V, user);
        assert_eq!(
            (body["state"].as_str(), body["bought"].as_bool()),
            (Some("ended"), Some(false)),
            "{body}"
        );
    }
    // A held lookup of a settled state is answered at once.
    let (status, body) = serve.get(&format!("/v1/vouchers/{V}/purchases/2?wait=30s"), None);
    assert_eq!((status, body["state"].as_str()), (200, Some("ended")));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_refuse_a_bad_wait_and_an_unknown_voucher_and_bound_the_held_ones() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 1).await;
    // Half the in-flight cap may be held: 2 of 4.
    let serve = Serve::start_logging(&env, &["--max-in-flight", "4"], "seckill=debug");
    for bad in ["31s", "0s", "soon", ""] {
        let (status, body) = serve.get(&format!("/v1/vouchers/{V}/purchases/2?wait={bad}"), None);
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("invalid_field")),
            "{bad}: {body}"
        );
    }
    let (status, body) = serve.get("/v1/vouchers/99/purchases/2", None);
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("voucher_not_loaded")),
        "{body}"
    );
    // With a cap of 4 in flight, 2 may be held: a third is answered at
    // once with the state now, while the two are still held.
    std::thread::scope(|s| {
        let held: Vec<_> = (0..2)
            .map(|_| s.spawn(|| serve.get(&format!("/v1/vouchers/{V}/purchases/5?wait=4s"), None)))
            .collect();
        within_seconds(30, "two lookups held", || {
            serve.log_text().matches("lookup held").count() == 2
        });
        let (status, body) = serve.get(&format!("/v1/vouchers/{V}/purchases/5?wait=30s"), None);
        assert_eq!((status, body["state"].as_str()), (200, Some("not_waiting")));
        assert!(
            held.iter().all(|h| !h.is_finished()),
            "the held lookups ended before the third"
        );
        for h in held {
            assert_eq!(h.join().unwrap().1["state"], "not_waiting");
        }
    });
    env.cleanup().await;
}

/// A serve told to stop answers the lookups it holds at once, with the
/// state they had, instead of keeping its shutdown waiting for their
/// `?wait=`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_serve_answers_the_lookups_it_holds() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 1).await;
    let mut serve = Serve::start_logging(&env, &[], "seckill=debug");
    let url = format!("/v1/vouchers/{V}/purchases/5?wait=30s");
    let ((status, body), took) = std::thread::scope(|s| {
        let held = s.spawn(|| {
            let began = std::time::Instant::now();
            (serve.get(&url, None), began.elapsed())
        });
        within_seconds(30, "the lookup held", || {
            serve.log_text().contains("lookup held")
        });
        serve.terminate();
        held.join().unwrap()
    });
    let stopped = serve.wait_for_exit();
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("not_waiting")),
        "{body}"
    );
    assert!(
        took < Duration::from_secs(20),
        "held {took:?} past the stop"
    );
    assert!(stopped.success(), "{stopped:?}");
    env.cleanup().await;
}
