//! Failure paths of preload and the MySQL transactions: a gate left loaded
//! but unregistered is repaired by running preload again; reads meant as one
//! snapshot are one on a server whose default isolation is READ COMMITTED.

mod common;

use std::time::Duration;

use common::invariants::assert_invariants;
use common::{fast_worker, TestEnv};
use redis::AsyncCommands;
use seckill::store::registry;

const V: u64 = 1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preload_again_registers_a_loaded_gate_a_crash_left_unregistered() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    env.admit_users(V, 6, 0).await;
    // A preload that died after publishing, before registering: the gate
    // admits, but no worker consumes its orders.
    let mut redis = env.redis().await;
    let _: () = redis
        .srem(registry::key(&env.prefix).unwrap(), V)
        .await
        .unwrap();
    let out = env
        .cmd()
        .args(["preload", "--voucher", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("in flight"), "{stderr}");
    let registered: bool = redis
        .sismember(registry::key(&env.prefix).unwrap(), V)
        .await
        .unwrap();
    assert!(registered, "running preload again registers the voucher");
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    assert_eq!(env.order_count(V).await, 6);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 4);
    env.cleanup().await;
}
