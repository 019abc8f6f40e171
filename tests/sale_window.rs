//! The sale window and unknown vouchers: answered, and nothing written.

mod common;

use common::TestEnv;
use seckill::gate::admission::{admit, Admission};
use seckill::store::keys::VoucherKeys;

async fn attempt(env: &TestEnv, voucher: u64, user: u64) -> Admission {
    let keys = VoucherKeys::new(&env.prefix, voucher).unwrap();
    let mut redis = env.redis().await;
    admit(&mut redis, &keys, voucher, user, 4242, None)
        .await
        .unwrap()
}

#[tokio::test]
async fn before_the_window_opens_nothing_is_written() {
    let env = TestEnv::new().await;
    env.add_voucher(1, 10, 3_600_000, 7_200_000).await;
    env.preload(1).await;
    let before = env.snapshot().await;
    let outcome = attempt(&env, 1, 5).await;
    assert!(
        matches!(outcome, Admission::NotStarted { begin_ms } if begin_ms > seckill::support::timespec::now_ms())
    );
    assert_eq!(
        env.snapshot().await,
        before,
        "a not-started attempt wrote something"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn after_the_window_closes_nothing_is_written() {
    let env = TestEnv::new().await;
    env.add_voucher(1, 10, -7_200_000, -3_600_000).await;
    env.preload(1).await;
    let before = env.snapshot().await;
    let outcome = attempt(&env, 1, 5).await;
    assert!(
        matches!(outcome, Admission::Ended { end_ms } if end_ms < seckill::support::timespec::now_ms())
    );
    assert_eq!(
        env.snapshot().await,
        before,
        "an ended attempt wrote something"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_voucher_never_preloaded_is_unknown_not_unlimited() {
    let env = TestEnv::new().await;
    env.add_voucher(1, 10, -1_000, 3_600_000).await;
    let before = env.snapshot().await;
    assert_eq!(attempt(&env, 1, 5).await, Admission::UnknownVoucher);
    assert_eq!(attempt(&env, 2, 5).await, Admission::UnknownVoucher);
    assert_eq!(
        env.snapshot().await,
        before,
        "an unknown-voucher attempt wrote something"
    );
    env.cleanup().await;
}
