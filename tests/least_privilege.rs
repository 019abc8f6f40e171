//! The documented rights (contrib/redis-acl.conf, contrib/mysql-grants.sql)
//! are enough: init, the worker, status and reconcile with repair run under
//! users that hold exactly them; a right taken away is one line naming it.

mod common;

use common::invariants::assert_invariants;
use common::rights::{apply_mysql_grants, as_role, documented_users_before_init};
use redis::AsyncCommands;

fn one_error_line(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_the_worker_status_and_reconcile_run_with_exactly_the_documented_rights() {
    let (redis, mysql, env) = documented_users_before_init().await;

    let run = |redis_user: &str, mysql_user: &str, args: &[&str]| {
        as_role(&env, &redis, &mysql, redis_user, mysql_user)
            .args(args)
            .output()
            .unwrap()
    };
    let init = run("seckill-init", "seckill_init", &["init"]);
    assert!(init.status.success(), "{init:?}");
    apply_mysql_grants(&mysql, &env.db_name, true);
    for args in [
        &[
            "voucher", "add", "--id", "1", "--stock", "20", "--begin", "-1m",
        ][..],
        &["preload", "--voucher", "1"],
    ] {
        let out = run("seckill-operator", "seckill_operator", args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    for user in 1..=8 {
        let out = run(
            "seckill-worker",
            "seckill_worker",
            &["buy", "--voucher", "1", "--user", &user.to_string()],
        );
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    let drained = run(
        "seckill-worker",
        "seckill_worker",
        &[
            "worker",
            "--until-idle",
            "--claim-idle",
            "500ms",
            "--block",
            "200ms",
        ],
    );
    assert!(drained.status.success(), "{drained:?}");
    assert_eq!(env.order_count(1).await, 8);
    let status = run(
        "seckill-operator",
        "seckill_operator",
        &["status", "--format", "json"],
    );
    assert!(status.status.success(), "{status:?}");
    let pending = run("seckill-operator", "seckill_operator", &["pending"]);
    assert!(pending.status.success(), "{pending:?}");
    // A drift for reconcile to repair under the operator's rights.
    let keys = seckill::store::keys::VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut admin = env.redis().await;
    let _: () = admin.incr(keys.stock(), 3).await.unwrap();
    let repaired = run(
        "seckill-operator",
        "seckill_operator",
        &["reconcile", "--yes"],
    );
    assert_eq!(repaired.status.code(), Some(4), "{repaired:?}");
    assert_invariants(&env, 1).await;

    // A right taken away: one line that names it.
    redis.cli(&["acl", "setuser", "seckill-operator", "-xinfo"]);
    let err = one_error_line(&run("seckill-operator", "seckill_operator", &["status"]));
    assert!(err.to_lowercase().contains("xinfo"), "{err}");
    redis.cli(&["acl", "setuser", "seckill-operator", "+xinfo"]);
    mysql.root_sql(&format!(
        "REVOKE SELECT ON `{}`.* FROM 'seckill_operator'@'%'",
        env.db_name
    ));
    let err = one_error_line(&run("seckill-operator", "seckill_operator", &["status"]));
    assert!(err.contains("SELECT") && err.contains("denied"), "{err}");
    env.cleanup().await;
}
