//! Reclaiming entries of dead consumers: XAUTOCLAIM's cursor is carried
//! across calls, and every reclaimed entry is told its true delivery count.

mod common;

use std::time::{Duration, Instant};

use common::{fast_worker, TestEnv};
use redis::AsyncCommands;
use seckill::store::keys::{VoucherKeys, WORKER_GROUP};
use seckill::stream::id::StreamId;
use seckill::worker::group;

const V: u64 = 1;

/// Resets the idle time of `ids` (still owned by `consumer`), without
/// counting a delivery: they look like entries a live consumer works on.
async fn keep_fresh(
    redis: &mut seckill::store::redis_conn::Redis,
    keys: &VoucherKeys,
    consumer: &str,
    ids: &[String],
) {
    try_keep_fresh(redis, keys, consumer, ids).await.unwrap();
}

async fn try_keep_fresh(
    redis: &mut seckill::store::redis_conn::Redis,
    keys: &VoucherKeys,
    consumer: &str,
    ids: &[String],
) -> redis::RedisResult<()> {
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(keys.orders())
        .arg(WORKER_GROUP)
        .arg(consumer)
        .arg(0)
        .arg(ids)
        .arg("IDLE")
        .arg(0)
        .arg("JUSTID")
        .query_async(redis)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaimed_entries_carry_their_own_delivery_count() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    env.admit_users(V, 5, 0).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let ids: Vec<String> = env
        .read_as(V, "c", 10_000)
        .await
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(ids.len(), 5);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The 2nd and 4th stay busy with the same consumer: a range over the
    // claimed ones (1st..5th) also holds them.
    keep_fresh(&mut redis, &keys, "c", &[ids[1].clone(), ids[3].clone()]).await;
    let (_, claimed) = group::reclaim(&mut redis, &keys, "c", 200, 3, StreamId::ZERO)
        .await
        .unwrap();
    let got: Vec<(&str, u64)> = claimed
        .iter()
        .map(|d| (d.raw.entry_id.as_str(), d.deliveries))
        .collect();
    assert_eq!(
        got,
        [
            (ids[0].as_str(), 2),
            (ids[2].as_str(), 2),
            (ids[4].as_str(), 2)
        ],
        "each claimed entry was delivered twice (read, then claimed)"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_entry_behind_many_live_ones_is_reclaimed() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 20).await;
    env.admit_users(V, 16, 0).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    // All 16 go to a consumer that dies; the first 15 are then taken over by
    // a live one that keeps working on them. XAUTOCLAIM with COUNT 1 scans
    // at most 10 pending entries per call: only a cursor kept from one call
    // to the next reaches the 16th.
    let ids: Vec<String> = env
        .read_as(V, "dead", 10_000)
        .await
        .into_iter()
        .map(|e| e.id)
        .collect();
    let live = ids[..15].to_vec();
    keep_fresh(&mut redis, &keys, "live", &live).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let fresh = {
        let (mut redis, keys, live, stop) =
            (redis.clone(), keys.clone(), live.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                // Best effort, beside a live worker: a failed touch only
                // lets the live entries be reclaimed too, which the test
                // does not assert against.
                let _ = try_keep_fresh(&mut redis, &keys, "live", &live).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let worker = env.spawn_worker(&fast_worker(&["--batch", "1"]));
    let started = Instant::now();
    let last: redis::streams::StreamRangeReply = redis
        .xrange(keys.orders(), &ids[15], &ids[15])
        .await
        .unwrap();
    let last_user: u64 = last.ids[0].get("user").unwrap();
    while !env.orders(V).await.iter().any(|o| o.1 == last_user) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the idle entry behind 15 live ones was never reclaimed:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Acknowledged after the commit: waited for, not looked at once (the
    // order can be seen in MySQL before its entry is acknowledged).
    loop {
        let owner: redis::streams::StreamPendingCountReply = redis
            .xpending_count(keys.orders(), WORKER_GROUP, &ids[15], &ids[15], 1)
            .await
            .expect("XPENDING");
        if owner.ids.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "persisted, never acknowledged:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    fresh.await.unwrap();
    env.cleanup().await;
}
