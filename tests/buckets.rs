//! A voucher split into buckets (design/buckets.md): each user belongs to
//! one bucket, by the same rule in Rust, in lua/seckill.lua and in the
//! README, and is admitted only there.

mod common;

use common::TestEnv;
use redis::AsyncCommands;
use seckill::error::Error;
use seckill::gate::admission::{admit, Admission};
use seckill::gate::buckets::{bucket_of, Layout};
use seckill::store::keys::bucket_tag;
use seckill::support::timespec::now_ms;

const V: u64 = 9;

/// Loads gates of `n` buckets by hand (meta's window, the bucket fields,
/// `stock` each), on salt-0 tags.
async fn hand_made_gates(env: &TestEnv, n: u32, stock: i64) -> Layout {
    let tags: Vec<String> = (0..n).map(|b| bucket_tag(V, b, 0)).collect();
    let layout = Layout::from_tags(&env.prefix, V, Some(&tags.join(" "))).expect("layout");
    let mut redis = env.redis().await;
    let now = now_ms();
    for b in 0..n {
        let k = layout.keys(b).expect("keys");
        let _: () = redis.set(k.stock(), stock).await.expect("stock");
        let _: () = redis
            .hset_multiple(
                k.meta(),
                &[
                    ("begin_ms", (now - 60_000).to_string()),
                    ("end_ms", (now + 600_000).to_string()),
                    ("total", (stock * i64::from(n)).to_string()),
                    ("bucket", b.to_string()),
                    ("buckets", n.to_string()),
                ],
            )
            .await
            .expect("meta");
    }
    layout
}

#[tokio::test]
async fn the_admission_script_routes_users_as_the_binary_does() {
    let env = TestEnv::on_cluster().await;
    let mut redis = env.redis().await;
    for n in [2u32, 3, 7] {
        let layout = hand_made_gates(&env, n, 10_000).await;
        for user in 1..=400u64 {
            let mine = bucket_of(user, n);
            for b in 0..n {
                let keys = layout.keys(b).expect("keys");
                let order = user * 100 + u64::from(b) + 1_000_000 * u64::from(n);
                let answer = admit(&mut redis, &keys, V, user, order, None).await;
                if b == mine {
                    assert!(
                        matches!(
                            answer,
                            Ok(Admission::Admitted { .. }) | Ok(Admission::AlreadyBought)
                        ),
                        "user {user}, bucket {b} of {n}: {answer:?}"
                    );
                } else {
                    match answer {
                        Err(Error::WrongBucket { bucket, .. }) => assert_eq!(bucket, mine),
                        other => panic!("user {user} at bucket {b} of {n}: {other:?}"),
                    }
                }
            }
        }
        // Each user holds one unit, in their own bucket only.
        let mut admitted = 0;
        for b in 0..n {
            let keys = layout.keys(b).expect("keys");
            let buyers: Vec<u64> = redis.smembers(keys.buyers()).await.expect("buyers");
            assert!(
                buyers.iter().all(|u| bucket_of(*u, n) == b),
                "bucket {b} of {n}"
            );
            admitted += buyers.len();
            let _: () = redis
                .del(&[keys.buyers(), keys.stock(), keys.meta(), keys.orders()])
                .await
                .expect("del");
        }
        assert_eq!(admitted, 400, "{n} buckets");
    }
    env.cleanup().await;
}
