//! Trimming the order stream never removes an entry that is undelivered or
//! pending, and a consumer is only forgotten with nothing pending.

mod common;

use common::TestEnv;
use redis::streams::StreamRangeReply;
use redis::AsyncCommands;
use seckill::store::keys::{VoucherKeys, WORKER_GROUP};
use seckill::worker::group;

async fn ids(redis: &mut seckill::store::redis_conn::Redis, keys: &VoucherKeys) -> Vec<String> {
    let r: StreamRangeReply = redis.xrange_all(keys.orders()).await.unwrap();
    r.ids.into_iter().map(|e| e.id).collect()
}

#[tokio::test]
async fn trim_keeps_every_undelivered_and_pending_entry() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let mut all = Vec::new();
    for i in 1..=10u64 {
        let id: String = redis
            .xadd(
                keys.orders(),
                "*",
                &[("user", i), ("order", 100 + i), ("voucher", 1)],
            )
            .await
            .unwrap();
        all.push(id);
    }
    group::ensure_group(&mut redis, &keys).await.unwrap();
    // "ghost" reads six entries and acknowledges the 1st, 2nd and 4th.
    env.read_as(1, "ghost", 6).await;
    let _: u64 = redis
        .xack(keys.orders(), WORKER_GROUP, &[&all[0], &all[1], &all[3]])
        .await
        .unwrap();

    // Entries are newer than any retention window: nothing goes.
    let now = seckill::support::timespec::now_ms();
    assert_eq!(
        group::trim(&mut redis, &keys, 3_600_000, now)
            .await
            .unwrap(),
        0
    );
    // Without retention only what lies below the oldest pending entry goes.
    assert_eq!(group::trim(&mut redis, &keys, 0, now + 1).await.unwrap(), 2);
    assert_eq!(ids(&mut redis, &keys).await, all[2..].to_vec());
    // Pending entries are untouched, and the ghost cannot be forgotten.
    let pending: redis::streams::StreamPendingReply =
        redis.xpending(keys.orders(), WORKER_GROUP).await.unwrap();
    assert_eq!(pending.count(), 3);
    assert!(!group::forget_consumer(&mut redis, &keys, "ghost")
        .await
        .unwrap());

    // Once everything is delivered and acknowledged, all but the last
    // delivered entry go, and the consumer may be forgotten.
    env.read_as(1, "ghost", 10).await;
    let _: u64 = redis.xack(keys.orders(), WORKER_GROUP, &all).await.unwrap();
    group::trim(&mut redis, &keys, 0, now + 1).await.unwrap();
    assert_eq!(ids(&mut redis, &keys).await, vec![all[9].clone()]);
    assert!(group::forget_consumer(&mut redis, &keys, "ghost")
        .await
        .unwrap());
    env.cleanup().await;
}
