//! Layer 3 lease locks against real Redis: owner tokens, reentrancy, leases.

mod common;

use std::time::Duration;

use common::TestEnv;
use redis::AsyncCommands;
use seckill::store::keys::VoucherKeys;
use seckill::worker::lock::LockOwner;

fn owner(token: &str, lease_ms: u64) -> LockOwner {
    LockOwner {
        token: token.to_string(),
        lease: Duration::from_millis(lease_ms),
    }
}

#[tokio::test]
async fn only_the_owner_takes_renews_and_releases_and_reentry_is_counted() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let (a, b) = (owner("a", 5_000), owner("b", 5_000));
    let k = vec![keys.lock(1), keys.lock(2)];

    assert_eq!(a.acquire(&mut redis, &k).await.unwrap(), vec![true, true]);
    // Another owner is refused; the holder re-enters.
    assert_eq!(b.acquire(&mut redis, &k[..1]).await.unwrap(), vec![false]);
    assert_eq!(a.acquire(&mut redis, &k[..1]).await.unwrap(), vec![true]);
    let count: u64 = redis.hget(&k[0], "a").await.unwrap();
    assert_eq!(count, 2);
    let ttl: i64 = redis.pttl(&k[0]).await.unwrap();
    assert!(ttl > 0 && ttl <= 5_000, "lease {ttl}");

    // Releasing by someone else's token does nothing.
    assert_eq!(b.release(&mut redis, &k).await.unwrap(), 0);
    assert_eq!(a.release(&mut redis, &k[..1]).await.unwrap(), 1);
    assert!(
        redis.exists::<_, bool>(&k[0]).await.unwrap(),
        "one reentry is still held"
    );
    assert_eq!(a.release(&mut redis, &k).await.unwrap(), 2);
    assert!(!redis.exists::<_, bool>(&k[0]).await.unwrap());
    assert!(!redis.exists::<_, bool>(&k[1]).await.unwrap());
    assert_eq!(b.acquire(&mut redis, &k).await.unwrap(), vec![true, true]);
    env.cleanup().await;
}

#[tokio::test]
async fn an_expired_lease_is_reported_lost_and_can_be_taken_by_another() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let (a, b) = (owner("a", 100), owner("b", 5_000));
    let k = vec![keys.lock(7), keys.lock(8)];
    assert_eq!(a.acquire(&mut redis, &k).await.unwrap(), vec![true, true]);
    assert_eq!(a.renew(&mut redis, &k).await.unwrap(), vec![true, true]);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(b.acquire(&mut redis, &k[..1]).await.unwrap(), vec![true]);
    assert_eq!(a.renew(&mut redis, &k).await.unwrap(), vec![false, false]);
    // The late holder's release leaves the new owner's lock alone.
    assert_eq!(a.release(&mut redis, &k).await.unwrap(), 0);
    let holder: Option<u64> = redis.hget(&k[0], "b").await.unwrap();
    assert_eq!(holder, Some(1));
    env.cleanup().await;
}
