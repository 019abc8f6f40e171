//! `seckill doctor` against servers set up wrong on purpose, each fault
//! produced for real (a policy that evicts, AOF off, a log flushed once a
//! second, a clock shifted with libfaketime, a right taken away), and
//! against the project's own services, where every check passes.

mod common;

use common::own_mysql::OwnMysql;
use common::own_redis::OwnRedis;
use common::rights::{
    apply_mysql_grants, as_role, documented_users_before_init, redis_acl_users, PASSWORD,
};
use common::{within_seconds, TestEnv};
use serde_json::Value;

/// The report's rows by check name, and the exit code.
fn doctor(cmd: &mut assert_cmd::Command, args: &[&str]) -> (i32, Vec<Value>) {
    let out = cmd
        .args(["doctor", "--format", "json"])
        .args(args)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let checks = report["checks"].as_array().cloned().unwrap_or_default();
    for c in &checks {
        for field in ["check", "status", "found", "why", "fix"] {
            assert!(c[field].is_string(), "{field} in {c}");
        }
    }
    (out.status.code().unwrap_or(-1), checks)
}

fn status_of<'a>(checks: &'a [Value], check: &str) -> &'a str {
    checks
        .iter()
        .find(|c| c["check"] == check)
        .and_then(|c| c["status"].as_str())
        .unwrap_or_else(|| panic!("no check {check} in {checks:?}"))
}

fn found_of(checks: &[Value], check: &str) -> String {
    checks
        .iter()
        .find(|c| c["check"] == check)
        .map(|c| c["found"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

fn not_ok(checks: &[Value]) -> Vec<&Value> {
    checks.iter().filter(|c| c["status"] != "ok").collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_passes_on_the_projects_own_services() {
    let env = TestEnv::new().await;
    let (code, checks) = doctor(&mut env.cmd(), &["--role", "worker"]);
    assert_eq!(not_ok(&checks), Vec::<&Value>::new());
    assert_eq!(code, 0);
    assert!(status_of(&checks, "redis rights (worker)") == "ok");
    assert!(status_of(&checks, "mysql rights (worker)") == "ok");

    // The table says the same, with a summary line.
    let out = env.cmd().arg("doctor").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("redis maxmemory-policy"), "{text}");
    assert!(text.trim_end().ends_with("0 warn, 0 fail"), "{text}");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_passes_on_the_projects_own_cluster() {
    let env = TestEnv::on_cluster().await;
    let (code, checks) = doctor(&mut env.cmd(), &["--role", "serve"]);
    assert_eq!(not_ok(&checks), Vec::<&Value>::new());
    assert_eq!(code, 0);
    // Six servers asked, three masters with a replica each.
    assert!(found_of(&checks, "redis appendonly").contains("all 6 servers"));
    assert_eq!(
        found_of(&checks, "redis cluster replicas")
            .matches(": 1")
            .count(),
        3
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_cluster_the_documented_worker_user_passes_the_checks_it_may_run() {
    let env = TestEnv::on_cluster().await;
    // The worker's rules under a name of this test's, on every node (ACLs
    // are per node).
    let mut rules = redis_acl_users(&env.prefix)
        .into_iter()
        .find(|u| u[0] == "seckill-worker")
        .expect("the worker's user");
    let user = format!("doctor-{}", env.prefix);
    rules[0] = user.clone();
    let base: u16 = std::env::var("SECKILL_CLUSTER_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(17001);
    let cli = |port: u16, args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for port in base..base + 6 {
        let mut args = vec!["acl", "setuser"];
        args.extend(rules.iter().map(String::as_str));
        assert_eq!(cli(port, &args), "OK");
    }
    let seeds: Vec<String> = (base..base + 3)
        .map(|p| format!("redis://{user}:{PASSWORD}@127.0.0.1:{p}/"))
        .collect();
    let mut cmd = env.cmd();
    cmd.env("SECKILL_REDIS_URL", seeds.join(","));
    let (_, checks) = doctor(&mut cmd, &["--role", "worker"]);
    for port in base..base + 6 {
        cli(port, &["acl", "deluser", &user]);
    }
    // It may not list the cluster's nodes (CLUSTER NODES): the slot map
    // gives them, and every check on keys and scripts still runs.
    for ok in [
        "redis reachable",
        "redis cluster replicas",
        "redis scripts",
        "redis node ids",
        "redis rights (worker)",
        "clock skew",
    ] {
        assert_eq!(status_of(&checks, ok), "ok", "{ok}: {checks:?}");
    }
    assert!(found_of(&checks, "redis appendonly").contains("all 6 servers"));
    // CONFIG GET is not the worker's: said, not guessed.
    let fsync = found_of(&checks, "redis appendfsync");
    assert!(fsync.contains("not readable by this user"), "{fsync}");
    assert!(!format!("{checks:?}").contains(PASSWORD));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_lose_acknowledged_writes_fail_and_pass_once_set_right() {
    let redis = OwnRedis::start();
    let mysql = OwnMysql::start("");
    let mut env = mysql.test_env().await;
    env.cfg.redis_url = redis.url();
    // The test's own Redis starts without AOF (it is made to lose writes).
    for set in [
        ["maxmemory-policy", "allkeys-lru"],
        ["maxmemory", "1gb"],
        ["appendfsync", "no"],
        ["lazyfree-lazy-server-del", "no"],
    ] {
        assert_eq!(redis.cli(&["config", "set", set[0], set[1]]).trim(), "OK");
    }
    mysql.root_sql("SET GLOBAL innodb_flush_log_at_trx_commit = 2");
    mysql.root_sql("SET GLOBAL tx_isolation = 'READ-UNCOMMITTED'");
    let (code, checks) = doctor(&mut env.cmd(), &[]);
    assert_eq!(code, 6, "{checks:?}");
    for failed in [
        "redis maxmemory-policy",
        "redis appendonly",
        "redis appendfsync",
        "mysql innodb_flush_log_at_trx_commit",
        "mysql isolation",
    ] {
        assert_eq!(status_of(&checks, failed), "fail", "{failed}: {checks:?}");
    }
    assert_eq!(status_of(&checks, "redis lazyfree"), "warn");
    assert!(found_of(&checks, "redis maxmemory-policy").contains("allkeys-lru"));
    assert!(found_of(&checks, "mysql innodb_flush_log_at_trx_commit").contains('2'));

    // A warning alone is exit 5.
    for set in [
        ["maxmemory-policy", "noeviction"],
        ["appendonly", "yes"],
        ["appendfsync", "always"],
    ] {
        assert_eq!(redis.cli(&["config", "set", set[0], set[1]]).trim(), "OK");
    }
    mysql.root_sql("SET GLOBAL innodb_flush_log_at_trx_commit = 1");
    mysql.root_sql("SET GLOBAL tx_isolation = 'REPEATABLE-READ'");
    let (code, checks) = doctor(&mut env.cmd(), &[]);
    assert_eq!(
        not_ok(&checks)
            .iter()
            .map(|c| c["check"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["redis lazyfree"]
    );
    assert_eq!(code, 5);
    for set in ["lazyfree-lazy-server-del", "lazyfree-lazy-expire"] {
        assert_eq!(redis.cli(&["config", "set", set, "yes"]).trim(), "OK");
    }
    let (code, checks) = doctor(&mut env.cmd(), &[]);
    assert_eq!((code, not_ok(&checks)), (0, Vec::<&Value>::new()));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_log_not_synced_at_each_commit_fails() {
    let mysql = OwnMysql::start("log_bin=binlog\nsync_binlog=0");
    let env = mysql.test_env().await;
    let (_, checks) = doctor(&mut env.cmd(), &[]);
    assert_eq!(status_of(&checks, "mysql sync_binlog"), "fail");
    assert_eq!(found_of(&checks, "mysql sync_binlog"), "0, binary log on");
    mysql.root_sql("SET GLOBAL sync_binlog = 1");
    let (_, checks) = doctor(&mut env.cmd(), &[]);
    assert_eq!(status_of(&checks, "mysql sync_binlog"), "ok");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_shifted_against_the_servers_fails() {
    let env = TestEnv::new().await;
    let libfaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    assert!(
        std::path::Path::new(libfaketime).exists(),
        "libfaketime (package faketime)"
    );
    let mut cmd = env.cmd();
    cmd.env("LD_PRELOAD", libfaketime)
        .env("FAKETIME", "+30s")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("FAKETIME_NO_CACHE", "1");
    let (code, checks) = doctor(&mut cmd, &[]);
    assert_eq!(code, 6, "{checks:?}");
    assert_eq!(status_of(&checks, "clock skew"), "fail");
    // This host is 30 s ahead: both servers read 30 s behind it.
    let found = found_of(&checks, "clock skew");
    assert!(
        found.contains("Redis -30") || found.contains("Redis -29"),
        "{found}"
    );
    assert!(
        found.contains("MySQL -30") || found.contains("MySQL -29"),
        "{found}"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_right_taken_away_is_named_and_the_documented_rights_pass() {
    let (redis, mysql, env) = documented_users_before_init().await;
    let schema = doctor(
        &mut as_role(&env, &redis, &mysql, "seckill-init", "seckill_init"),
        &["--role", "schema"],
    );
    // Before init: the rights are there, the schema is work ahead.
    assert_eq!(
        status_of(&schema.1, "redis rights (schema)"),
        "ok",
        "{schema:?}"
    );
    assert_eq!(
        status_of(&schema.1, "mysql rights (schema)"),
        "ok",
        "{schema:?}"
    );
    assert_eq!(status_of(&schema.1, "mysql schema"), "warn");
    let init = as_role(&env, &redis, &mysql, "seckill-init", "seckill_init")
        .arg("init")
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    apply_mysql_grants(&mysql, &env.db_name, true);
    for (role, redis_user, mysql_user) in [
        ("worker", "seckill-worker", "seckill_worker"),
        ("serve", "seckill-worker", "seckill_worker"),
        ("operator", "seckill-operator", "seckill_operator"),
    ] {
        let (_, checks) = doctor(
            &mut as_role(&env, &redis, &mysql, redis_user, mysql_user),
            &["--role", role],
        );
        assert_eq!(
            status_of(&checks, &format!("redis rights ({role})")),
            "ok",
            "{checks:?}"
        );
        assert_eq!(
            status_of(&checks, &format!("mysql rights ({role})")),
            "ok",
            "{checks:?}"
        );
        assert_eq!(status_of(&checks, "redis scripts"), "ok");
        assert_eq!(status_of(&checks, "redis node ids"), "ok");
    }
    // The operator may not WAIT: asked as the worker, that is named.
    let (_, checks) = doctor(
        &mut as_role(&env, &redis, &mysql, "seckill-operator", "seckill_worker"),
        &["--role", "worker"],
    );
    assert_eq!(found_of(&checks, "redis rights (worker)"), "denied: WAIT");

    // One right taken from each store.
    redis.cli(&["acl", "setuser", "seckill-worker", "-xadd"]);
    mysql.root_sql(&format!(
        "REVOKE INSERT ON `{}`.`seckill_order` FROM 'seckill_worker'@'%'",
        env.db_name
    ));
    let (code, checks) = doctor(
        &mut as_role(&env, &redis, &mysql, "seckill-worker", "seckill_worker"),
        &["--role", "worker"],
    );
    assert_eq!(code, 6);
    assert_eq!(found_of(&checks, "redis rights (worker)"), "denied: XADD");
    assert_eq!(
        found_of(&checks, "mysql rights (worker)"),
        "missing: INSERT on seckill_order"
    );
    // Nothing was written trying: no key under the prefix, no order.
    assert_eq!(
        redis
            .cli(&["--scan", "--pattern", &format!("{}:*", env.prefix)])
            .trim(),
        ""
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_that_checks_nothing_off_loopback_warns_and_an_unreachable_server_fails() {
    let env = TestEnv::new().await;
    let mut cmd = env.cmd();
    // TEST-NET-1: nothing answers there.
    cmd.env(
        "SECKILL_MYSQL_URL",
        "mysql://seckill:seckill@192.0.2.1:3306/seckill",
    )
    .env("SECKILL_CONNECT_TIMEOUT", "1s");
    let (code, checks) = doctor(&mut cmd, &[]);
    assert_eq!(code, 6);
    assert_eq!(status_of(&checks, "mysql transport"), "warn");
    assert!(found_of(&checks, "mysql transport").contains("preferred to 192.0.2.1"));
    assert_eq!(status_of(&checks, "mysql reachable"), "fail");
    // The password is masked in what it found.
    assert!(!format!("{checks:?}").contains("seckill:seckill@"));
    assert_eq!(status_of(&checks, "redis reachable"), "ok");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ids_running_out_warn_and_none_left_fails() {
    use redis::AsyncCommands;
    let env = TestEnv::new().await;
    let mut redis = env.redis().await;
    // Leases as live processes hold them (what node_lease.lua sets).
    let lease = |n: u16| seckill::store::keys::node_lease(&env.prefix, n);
    let mut pipe = redis::pipe();
    for n in 0..1000u16 {
        pipe.set_ex(lease(n), "holder", 60).ignore();
    }
    let () = pipe.query_async(&mut redis).await.unwrap();
    let (code, checks) = doctor(&mut env.cmd(), &[]);
    assert_eq!((code, status_of(&checks, "redis node ids")), (5, "warn"));
    assert_eq!(
        found_of(&checks, "redis node ids"),
        "24 of 1024 free (1000 leased)"
    );
    let mut pipe = redis::pipe();
    for n in 1000..1024u16 {
        pipe.set_ex(lease(n), "holder", 60).ignore();
    }
    let () = pipe.query_async(&mut redis).await.unwrap();
    let (code, checks) = doctor(&mut env.cmd(), &[]);
    assert_eq!((code, status_of(&checks, "redis node ids")), (6, "fail"));
    let _: u64 = redis
        .del((0..1024u16).map(lease).collect::<Vec<_>>())
        .await
        .unwrap();
    env.cleanup().await;
}

/// Issue 34: a server with an asynchronous replica warns (a failover to it
/// can lose the last commits, orders buyers were told they bought); one
/// whose replica acknowledges semi-synchronously is ok. A real primary and
/// replica of the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_replica_warns_and_a_semi_synchronous_one_is_ok() {
    let primary = OwnMysql::start("log_bin=binlog\nserver_id=1\nsync_binlog=1");
    let replica = OwnMysql::start("server_id=2");
    primary.root_sql("GRANT REPLICATION SLAVE ON *.* TO 'seckill'@'%'");
    let env = primary.test_env().await;
    let replication = || {
        let (_, checks) = doctor(&mut env.cmd(), &[]);
        (
            status_of(&checks, "mysql replication").to_string(),
            found_of(&checks, "mysql replication").to_string(),
        )
    };
    assert_eq!(replication(), ("ok".into(), "no replicas".into()));
    replica.root_sql(&format!(
        "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='seckill', \
         MASTER_PASSWORD='seckill'; START SLAVE",
        primary.port
    ));
    let mut seen = replication();
    within_seconds(60, "the primary counts its replica", || {
        seen = replication();
        seen.1 != "no replicas"
    });
    assert_eq!(seen, ("warn".into(), "1 replica(s), asynchronous".into()));
    primary.root_sql("SET GLOBAL rpl_semi_sync_master_enabled = ON");
    replica.root_sql(
        "SET GLOBAL rpl_semi_sync_slave_enabled = ON; STOP SLAVE IO_THREAD; START SLAVE IO_THREAD",
    );
    within_seconds(60, "the replica acknowledges semi-synchronously", || {
        seen = replication();
        seen.0 == "ok"
    });
    assert_eq!(seen.1, "1 replica(s), semi-synchronous (1 acknowledging)");
    env.cleanup().await;
}
