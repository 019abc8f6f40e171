//! TLS to Redis (rediss://, a private CA, mutual TLS) and to MySQL (every
//! --mysql-ssl-mode), against servers that accept nothing else, with
//! certificates made by openssl for the test. Every command runs over TLS;
//! each TLS problem is one line, a non-zero exit, and writes nothing.

mod common;

use std::time::Duration;

use common::invariants::assert_invariants;
use common::own_mysql::OwnMysql;
use common::tls::{Certs, TlsRedis};
use common::{fast_worker, json, TestEnv};
use mysql_async::prelude::*;
use seckill::store::config::{SslMode, TlsFiles};

/// my.cnf lines: the server's certificate, and TLS required of everyone.
fn tls_only_mysql(certs: &Certs, (cert, key): (std::path::PathBuf, std::path::PathBuf)) -> String {
    format!(
        "ssl_cert={}\nssl_key={}\nssl_ca={}\nrequire_secure_transport=ON",
        cert.display(),
        key.display(),
        certs.ca().display()
    )
}

/// A test environment on these servers, every certificate checked.
async fn env_over_tls(certs: &Certs, redis: &TlsRedis, mysql: &OwnMysql) -> TestEnv {
    let mut env = TestEnv::uninitialised().await;
    env.cfg.redis_url = redis.url();
    let (cert, key) = certs.client();
    env.cfg.redis_tls = TlsFiles {
        ca_cert: Some(certs.ca()),
        client_cert: Some(cert),
        client_key: Some(key),
    };
    env.cfg.mysql_url = mysql.url_for(&env.db_name);
    env.cfg.mysql_ssl_mode = SslMode::VerifyIdentity;
    env.cfg.mysql_tls.ca_cert = Some(certs.ca());
    env
}

/// What goes wrong, the environment that makes it, what the one line must
/// say (any of), and the command (one that would write the store).
type Case<'a> = (
    &'a str,
    Vec<(&'a str, String)>,
    &'a [&'a str],
    &'a [&'a str],
);

fn ok(out: std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{out:?}");
    if matches!(out.stdout.as_slice().first(), Some(b'{') | Some(b'[')) {
        json(&out)
    } else {
        serde_json::Value::Null
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_runs_over_tls_with_every_certificate_checked() {
    let certs = Certs::make("flow");
    let redis = TlsRedis::start(&certs, true);
    let mysql = OwnMysql::start(&tls_only_mysql(&certs, certs.server()));
    // MySQL wants a client certificate from this user too (mutual TLS).
    mysql.root_sql("ALTER USER 'seckill'@'%' REQUIRE X509");
    let mut env = env_over_tls(&certs, &redis, &mysql).await;
    let (cert, key) = certs.client();
    env.cfg.mysql_tls.client_cert = Some(cert);
    env.cfg.mysql_tls.client_key = Some(key);
    let run = |args: &[&str]| env.cmd().args(args).output().unwrap();
    ok(run(&["init"]));
    ok(run(&[
        "voucher",
        "add",
        "--id",
        "1",
        "--stock",
        "20",
        "--begin",
        "-1m",
        "--pay-timeout",
        "2s",
    ]));
    ok(run(&["voucher", "list", "--format", "json"]));
    ok(run(&["preload", "--voucher", "1"]));
    let bought = run(&["buy", "--voucher", "1", "--user", "1", "--format", "json"]);
    let order = ok(bought)["order_id"].as_str().unwrap().to_string();
    let bench = ok(run(&[
        "bench",
        "--voucher",
        "1",
        "--users",
        "40",
        "--user-offset",
        "100",
        "--attempts",
        "40",
        "--format",
        "json",
    ]));
    assert_eq!(bench["outcomes"]["success"], 19, "{bench}");
    ok(run(&["token", "issue", "--voucher", "1", "--user", "5"]));
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    ok(run(&["pay", "--order", &order]));
    let shown = ok(run(&["order", "show", &order, "--format", "json"]));
    assert_eq!(shown["status"], "paid");
    ok(run(&["waitlist", "--voucher", "1"]));
    ok(run(&["pending", "--format", "json"]));
    // The unpaid run out of time and their units go to the waitlist.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    let status = ok(run(&["status", "--format", "json"]));
    assert_eq!(status[0]["orders_paid"], 1, "{status}");
    let report = ok(run(&["reconcile", "--dry-run", "--format", "json"]));
    assert_eq!(report["consistent"], true, "{report}");
    let repaired = run(&["reconcile", "--yes", "--format", "json"]);
    assert_eq!(repaired.status.code(), Some(0), "{repaired:?}");
    // The library's own connections are encrypted too.
    let mut conn = env.db().await.conn().await.unwrap();
    let cipher: Option<(String, String)> = conn
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .await
        .unwrap();
    assert!(
        cipher.is_some_and(|(_, c)| !c.is_empty()),
        "MySQL session not encrypted"
    );
    drop(conn);
    // Without the client certificate MySQL refuses, in one line.
    let refused = env
        .cmd()
        .env_remove("SECKILL_MYSQL_CLIENT_CERT")
        .env_remove("SECKILL_MYSQL_CLIENT_KEY")
        .args(["status"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert_eq!(String::from_utf8_lossy(&refused.stderr).lines().count(), 1);
    assert_invariants(&env, 1).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tls_problem_is_one_line_naming_it_and_writes_nothing() {
    let certs = Certs::make("problems");
    let redis = TlsRedis::start(&certs, true);
    // MySQL's certificate is for another host (signed by the right CA).
    let mysql = OwnMysql::start(&tls_only_mysql(&certs, certs.other_host()));
    let mut env = env_over_tls(&certs, &redis, &mysql).await;
    // verify-ca checks the chain only: it connects where verify-identity
    // must refuse; it never silently means verify-identity.
    env.cfg.mysql_ssl_mode = SslMode::VerifyCa;
    env.create_database().await;
    env.live_voucher(1, 5).await;
    let before = env.snapshot().await;
    // (what, environment, what the line must say, the command: one that
    // would write the store in question)
    let mysql_write: &[&str] = &["voucher", "add", "--id", "2", "--stock", "1"];
    let redis_write: &[&str] = &["buy", "--voucher", "1", "--user", "9"];
    let mut cases: Vec<Case> = Vec::new();
    let other_ca = certs.other_ca().display().to_string();
    cases.push((
        "verify-identity against a certificate for another host",
        vec![("SECKILL_MYSQL_SSL_MODE", "verify-identity".into())],
        &["not valid for name"],
        mysql_write,
    ));
    cases.push((
        "MySQL certificate from an unknown CA",
        vec![("SECKILL_MYSQL_CA_CERT", other_ca.clone())],
        &["UnknownIssuer", "unknown issuer"],
        mysql_write,
    ));
    cases.push((
        "plaintext MySQL against require_secure_transport",
        vec![("SECKILL_MYSQL_SSL_MODE", "disabled".into())],
        &["insecure transport", "requires TLS"],
        mysql_write,
    ));
    cases.push((
        "verify-ca without a CA",
        vec![("SECKILL_MYSQL_CA_CERT", String::new())],
        &["needs --mysql-ca-cert"],
        mysql_write,
    ));
    cases.push((
        "Redis certificate from an unknown CA",
        vec![("SECKILL_REDIS_CA_CERT", other_ca.clone())],
        &["UnknownIssuer", "unknown issuer"],
        redis_write,
    ));
    cases.push((
        "plaintext Redis URL against a TLS-only port",
        vec![
            (
                "SECKILL_REDIS_URL",
                format!("redis://127.0.0.1:{}/", redis.port),
            ),
            ("SECKILL_REDIS_CA_CERT", String::new()),
            ("SECKILL_REDIS_CLIENT_CERT", String::new()),
            ("SECKILL_REDIS_CLIENT_KEY", String::new()),
        ],
        &["TLS"],
        redis_write,
    ));
    cases.push((
        "no client certificate where Redis requires one",
        vec![
            ("SECKILL_REDIS_CLIENT_CERT", String::new()),
            ("SECKILL_REDIS_CLIENT_KEY", String::new()),
        ],
        // TLS 1.3: the alert, or the connection dropped before it is read.
        &[
            "CertificateRequired",
            "certificate required",
            "reset by peer",
        ],
        redis_write,
    ));
    for (what, vars, needles, command) in cases {
        let mut cmd = env.cmd();
        for (k, v) in &vars {
            if v.is_empty() {
                cmd.env_remove(k);
            } else {
                cmd.env(k, v);
            }
        }
        let out = cmd.args(command).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
        assert_eq!(err.lines().count(), 1, "{what}: {err}");
        assert!(needles.iter().any(|n| err.contains(n)), "{what}: {err}");
    }
    assert_eq!(
        env.snapshot().await,
        before,
        "a refused connection wrote something"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_speaks_only_tls_runs_the_sale_over_rediss() {
    let certs = Certs::make("cluster");
    let cluster = common::own_cluster::OwnCluster::start_tls(&certs.dir);
    let mut env = TestEnv::uninitialised().await;
    env.cfg.redis_url = cluster.url();
    env.cfg.redis_tls.ca_cert = Some(certs.ca());
    env.create_database().await;
    let vouchers = common::one_voucher_per_master(&env).await;
    for v in &vouchers {
        env.live_voucher(*v, 20).await;
        let bench = ok(env
            .cmd()
            .args([
                "bench",
                "--voucher",
                &v.to_string(),
                "--users",
                "30",
                "--attempts",
                "30",
            ])
            .args(["--format", "json"])
            .output()
            .unwrap());
        assert_eq!(bench["outcomes"]["success"], 20, "{bench}");
    }
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    ok(env.cmd().args(["status"]).output().unwrap());
    let report = ok(env
        .cmd()
        .args(["reconcile", "--dry-run", "--format", "json"])
        .output()
        .unwrap());
    assert_eq!(report["consistent"], true, "{report}");
    for v in &vouchers {
        let s = assert_invariants(&env, *v).await;
        assert_eq!(s.mysql_stock, 0);
    }
    env.cleanup().await;
}
