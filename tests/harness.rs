//! The test harness itself: a test that panics still leaves no database and
//! no keys behind (TestEnv's drop cleans up), even when the panic unwinds
//! through the runtime that the test's connections belong to.

mod common;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use common::TestEnv;
use mysql_async::prelude::*;
use redis::AsyncCommands;

#[test]
fn a_test_that_panics_leaves_no_database_and_no_keys() {
    let seen: Arc<Mutex<Option<(seckill::store::config::Config, String, String)>>> = Arc::default();
    let record = seen.clone();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(move || {
        // A current-thread runtime: the drop runs on the very thread that
        // drives it, in the middle of unwinding.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let env = TestEnv::new().await;
            env.live_voucher(1, 5).await;
            assert!(env.order_count(1).await == 0 && env.in_flight(1).await == 0);
            *record.lock().unwrap() =
                Some((env.cfg.clone(), env.prefix.clone(), env.db_name.clone()));
            panic!("a test failing on purpose (expected)");
        })
    }));
    assert!(outcome.is_err(), "the inner test did not panic");
    let (cfg, prefix, db_name) = seen.lock().unwrap().take().expect("the env was made");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut redis = seckill::store::redis_conn::connect(&cfg).await.unwrap();
        let mut keys: Vec<String> = Vec::new();
        let mut iter: redis::AsyncIter<String> =
            redis.scan_match(format!("{prefix}:*")).await.unwrap();
        while let Some(k) = iter.next_item().await {
            keys.push(k.unwrap());
        }
        assert!(keys.is_empty(), "keys left behind: {keys:?}");
        let opts = mysql_async::Opts::from_url(&cfg.mysql_url).unwrap();
        let opts = mysql_async::OptsBuilder::from_opts(opts).db_name(None::<String>);
        let mut conn = mysql_async::Conn::new(opts).await.unwrap();
        let found: Option<String> = conn
            .exec_first(
                "SELECT schema_name FROM information_schema.schemata WHERE schema_name = ?",
                (&db_name,),
            )
            .await
            .unwrap();
        conn.disconnect().await.ok();
        assert_eq!(found, None, "database left behind");
    });
}
