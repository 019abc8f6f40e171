//! The fence for a worker stopped inside its MySQL transaction
//! (lua/fence.lua, worker/fence.rs), against real Redis and MariaDB: only a
//! session idle since its lease lapsed is ended; an entry left behind that
//! names a connection in use since is not; an entry is forgotten only once
//! its session is gone.

mod common;

use std::time::Duration;

use common::TestEnv;
use mysql_async::prelude::*;
use redis::AsyncCommands;
use seckill::store::keys::VoucherKeys;
use seckill::support::timespec::now_ms;
use seckill::worker::fence;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_session_idle_since_its_lease_lapsed_is_ended() {
    let env = TestEnv::new().await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let db = env.db().await;
    // A stopped holder: its session idle, its lease lapsed 1.2 s ago.
    let mut stopped = db.conn().await.unwrap();
    stopped.query_drop("SELECT 1").await.unwrap();
    // An entry left behind (a lost `leave`) naming a connection in use since.
    let mut busy = db.conn().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    busy.query_drop("SELECT 1").await.unwrap();
    let now = now_ms();
    let entry = |id: u32, lapsed_ms: i64| format!("{} {id} 1000", now - lapsed_ms);
    let _: () = redis
        .hset_multiple(
            keys.fence(),
            &[
                ("stopped", entry(stopped.id(), 1_500)),
                ("left-behind", entry(busy.id(), 1_500)),
            ],
        )
        .await
        .unwrap();
    let mut taker = db.conn().await.unwrap();
    let ended = fence::end_lapsed(&mut redis, &mut taker, &keys)
        .await
        .unwrap();
    assert_eq!(ended, 1);
    assert!(
        stopped.query_drop("SELECT 1").await.is_err(),
        "the stopped session was not ended"
    );
    busy.query_drop("SELECT 1")
        .await
        .expect("a session in use was ended");
    let left: Vec<String> = redis.hkeys(keys.fence()).await.unwrap();
    assert_eq!(
        left,
        vec!["left-behind".to_string()],
        "only the ended one is forgotten"
    );
    drop(stopped);
    drop(busy);
    drop(taker);
    env.cleanup().await;
}
