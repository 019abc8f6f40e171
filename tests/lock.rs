//! Layer 3 lease locks against real Redis: owner tokens, counts, leases,
//! and the layout of a voucher's locks (one hash, lua/lib/lease.lua).

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

/// (expires_ms, count, owner) of one user's lock as stored.
async fn stored(
    redis: &mut impl redis::aio::ConnectionLike,
    keys: &VoucherKeys,
    user: u64,
) -> Option<(u64, u64, String)> {
    let v: Option<String> = redis::cmd("HGET")
        .arg(keys.locks())
        .arg(user)
        .query_async(redis)
        .await
        .unwrap();
    let v = v?;
    let mut p = v.splitn(3, ' ');
    Some((
        p.next().unwrap().parse().unwrap(),
        p.next().unwrap().parse().unwrap(),
        p.next().unwrap().to_string(),
    ))
}

/// The users with a lock in the hash (its `encoding` field is no lock).
async fn lock_fields(
    redis: &mut impl redis::aio::ConnectionLike,
    keys: &VoucherKeys,
) -> Vec<String> {
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(keys.locks())
        .query_async(redis)
        .await
        .unwrap();
    fields.into_iter().filter(|f| f != "encoding").collect()
}

#[tokio::test]
async fn the_hash_is_kept_in_the_hashtable_encoding() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let a = owner("a", 5_000);
    assert_eq!(
        a.acquire(&mut redis, &keys, &[1]).await.unwrap(),
        vec![true]
    );
    let encoding: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(keys.locks())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(encoding, "hashtable");
    env.cleanup().await;
}

#[tokio::test]
async fn only_the_owner_takes_renews_and_releases_and_taking_again_sets_the_count() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    // Owner tokens contain spaces and colons in real life (consumer names).
    let (a, b) = (owner("host a:1:0", 5_000), owner("b", 5_000));

    assert_eq!(
        a.acquire(&mut redis, &keys, &[1, 2]).await.unwrap(),
        vec![true, true]
    );
    let (first_expiry, _, _) = stored(&mut redis, &keys, 1).await.unwrap();
    // Another owner is refused; the holder takes it again.
    assert_eq!(
        b.acquire(&mut redis, &keys, &[1]).await.unwrap(),
        vec![false]
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        a.acquire(&mut redis, &keys, &[1]).await.unwrap(),
        vec![true]
    );
    // Renewed, and counted from this call alone (a resent call must not
    // leave the lock held after the one release that follows).
    let (expiry, count, holder) = stored(&mut redis, &keys, 1).await.unwrap();
    assert_eq!((count, holder.as_str()), (1, "host a:1:0"));
    assert!(expiry > first_expiry, "renewed: {first_expiry} -> {expiry}");
    let ttl: i64 = redis.pttl(keys.locks()).await.unwrap();
    assert!(ttl > 0 && ttl <= 5_000, "lease {ttl}");
    // Listed twice in one call: held twice, whatever it held before.
    assert_eq!(
        a.acquire(&mut redis, &keys, &[2, 2]).await.unwrap(),
        vec![true, true]
    );
    assert_eq!(stored(&mut redis, &keys, 2).await.map(|s| s.1), Some(2));

    // Releasing by someone else's token does nothing.
    assert_eq!(b.release(&mut redis, &keys, &[1, 2]).await.unwrap(), 0);
    assert_eq!(a.release(&mut redis, &keys, &[1, 2]).await.unwrap(), 2);
    assert_eq!(
        stored(&mut redis, &keys, 2).await.map(|s| s.1),
        Some(1),
        "one of the two is still held"
    );
    assert_eq!(stored(&mut redis, &keys, 1).await, None);
    assert_eq!(a.release(&mut redis, &keys, &[1, 2]).await.unwrap(), 1);
    assert_eq!(
        lock_fields(&mut redis, &keys).await,
        Vec::<String>::new(),
        "the last release leaves no lock behind"
    );
    assert_eq!(
        b.acquire(&mut redis, &keys, &[1, 2]).await.unwrap(),
        vec![true, true]
    );
    env.cleanup().await;
}

#[tokio::test]
async fn an_expired_lease_is_reported_lost_and_can_be_taken_by_another() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let (a, b) = (owner("a", 100), owner("b", 5_000));
    assert_eq!(
        a.acquire(&mut redis, &keys, &[7, 8]).await.unwrap(),
        vec![true, true]
    );
    assert_eq!(
        a.renew(&mut redis, &keys, &[7, 8]).await.unwrap(),
        vec![true, true]
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    // The hash outlives a's leases (b's is longer), but a's have run out.
    assert_eq!(
        b.acquire(&mut redis, &keys, &[7]).await.unwrap(),
        vec![true]
    );
    assert_eq!(
        a.renew(&mut redis, &keys, &[7, 8]).await.unwrap(),
        vec![false, false]
    );
    // A lease that ran out is not re-entered either: it is taken afresh.
    assert_eq!(
        a.acquire(&mut redis, &keys, &[8]).await.unwrap(),
        vec![true]
    );
    assert_eq!(stored(&mut redis, &keys, 8).await.unwrap().1, 1);
    tokio::time::sleep(Duration::from_millis(250)).await;
    // The late holder's release leaves the new owner's lock alone.
    assert_eq!(a.release(&mut redis, &keys, &[7, 8]).await.unwrap(), 0);
    let (_, count, holder) = stored(&mut redis, &keys, 7).await.unwrap();
    assert_eq!((count, holder.as_str()), (1, "b"));
    assert_eq!(
        stored(&mut redis, &keys, 8).await,
        None,
        "the owner's own expired lock is cleared on release"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn the_locks_hash_lives_as_long_as_its_longest_lease() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let (long, short) = (owner("long", 2_000), owner("short", 100));
    assert_eq!(
        long.acquire(&mut redis, &keys, &[1]).await.unwrap(),
        vec![true]
    );
    // A shorter lease taken later must not shorten the hash's life.
    assert_eq!(
        short.acquire(&mut redis, &keys, &[2]).await.unwrap(),
        vec![true]
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        long.renew(&mut redis, &keys, &[1]).await.unwrap(),
        vec![true]
    );
    assert_eq!(
        short.renew(&mut redis, &keys, &[2]).await.unwrap(),
        vec![false]
    );
    // Renewals keep it alive past the first lease.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(
            long.renew(&mut redis, &keys, &[1]).await.unwrap(),
            vec![true]
        );
    }
    // Every holder gone: the hash expires with the last lease.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert!(!redis.exists::<_, bool>(keys.locks()).await.unwrap());
    env.cleanup().await;
}

#[tokio::test]
async fn a_user_twice_in_one_batch_is_one_lock_entered_twice() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let (a, b) = (owner("a", 5_000), owner("b", 5_000));
    assert_eq!(
        a.acquire(&mut redis, &keys, &[3, 3, 4]).await.unwrap(),
        vec![true, true, true]
    );
    assert_eq!(stored(&mut redis, &keys, 3).await.unwrap().1, 2);
    assert_eq!(
        b.acquire(&mut redis, &keys, &[3, 3]).await.unwrap(),
        vec![false, false]
    );
    assert_eq!(
        a.renew(&mut redis, &keys, &[3, 3, 4]).await.unwrap(),
        vec![true, true, true]
    );
    // Given back twice in one call: free for the next owner.
    assert_eq!(a.release(&mut redis, &keys, &[3, 3, 3]).await.unwrap(), 2);
    assert_eq!(
        b.acquire(&mut redis, &keys, &[3]).await.unwrap(),
        vec![true]
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_batch_larger_than_one_lua_unpack_is_locked_whole() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let a = owner("a", 5_000);
    let users: Vec<u64> = (1..=4096).collect();
    let granted = a.acquire(&mut redis, &keys, &users).await.unwrap();
    assert!(granted.iter().all(|g| *g) && granted.len() == 4096);
    assert_eq!(lock_fields(&mut redis, &keys).await.len(), 4096);
    let renewed = a.renew(&mut redis, &keys, &users).await.unwrap();
    assert!(renewed.iter().all(|g| *g) && renewed.len() == 4096);
    assert_eq!(a.release(&mut redis, &keys, &users).await.unwrap(), 4096);
    assert!(lock_fields(&mut redis, &keys).await.is_empty());
    env.cleanup().await;
}

#[tokio::test]
async fn an_owner_whose_token_ends_like_another_s_is_another_owner() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    // The stored value of a's lock ends with " 1 b", as b's would.
    let (a, b) = (owner("x 1 b", 5_000), owner("b", 5_000));
    assert_eq!(
        a.acquire(&mut redis, &keys, &[1]).await.unwrap(),
        vec![true]
    );
    assert_eq!(
        b.acquire(&mut redis, &keys, &[1]).await.unwrap(),
        vec![false]
    );
    assert_eq!(b.renew(&mut redis, &keys, &[1]).await.unwrap(), vec![false]);
    assert_eq!(b.release(&mut redis, &keys, &[1]).await.unwrap(), 0);
    let (_, count, holder) = stored(&mut redis, &keys, 1).await.unwrap();
    assert_eq!((count, holder.as_str()), (1, "x 1 b"));
    // And the other way round.
    assert_eq!(
        b.acquire(&mut redis, &keys, &[2]).await.unwrap(),
        vec![true]
    );
    assert_eq!(
        a.acquire(&mut redis, &keys, &[2]).await.unwrap(),
        vec![false]
    );
    assert_eq!(a.release(&mut redis, &keys, &[2]).await.unwrap(), 0);
    assert_eq!(a.release(&mut redis, &keys, &[1]).await.unwrap(), 1);
    assert_eq!(b.release(&mut redis, &keys, &[2]).await.unwrap(), 1);
    assert!(lock_fields(&mut redis, &keys).await.is_empty());
    env.cleanup().await;
}
