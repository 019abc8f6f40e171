//! Passwords from files (`--redis-password-file`, `--mysql-password-file`):
//! used, refused when the URL has one too, and never shown, wherever they
//! came from.

mod common;

use std::path::PathBuf;

use common::own_redis::OwnRedis;
use common::TestEnv;

fn secret_file(env: &TestEnv, name: &str, content: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-{name}", env.prefix));
    std::fs::write(&path, content).expect("write the secret file");
    path
}

/// The MySQL URL of the test without its password.
fn without_password(url: &str) -> String {
    let mut u = url::Url::parse(url).unwrap();
    u.set_password(None).unwrap();
    u.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_come_from_files_for_every_command() {
    let mut redis = OwnRedis::start();
    let env = TestEnv::on_redis(&redis.url()).await;
    env.live_voucher(1, 5).await;
    // A password long enough to be scrubbed from any text it appears in.
    let redis_secret = "redis-Secret-4711!";
    redis.require_password(redis_secret);
    let redis_file = secret_file(&env, "redis", &format!("{redis_secret}\n"));
    let mysql_file = secret_file(&env, "mysql", "seckill\n");
    let run = |args: &[&str]| {
        env.cmd()
            .env("SECKILL_MYSQL_URL", without_password(&env.cfg.mysql_url))
            .env("SECKILL_REDIS_PASSWORD_FILE", &redis_file)
            .env("SECKILL_MYSQL_PASSWORD_FILE", &mysql_file)
            .args(args)
            .output()
            .unwrap()
    };
    let bought = run(&["buy", "--voucher", "1", "--user", "7"]);
    assert_eq!(bought.status.code(), Some(0), "{bought:?}");
    let status = run(&["status", "--format", "json"]);
    assert!(status.status.success(), "{status:?}");
    let worker = run(&["worker", "--until-idle"]);
    assert!(worker.status.success(), "{worker:?}");
    assert_eq!(env.order_count(1).await, 1);
    for out in [&bought, &status, &worker] {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!text.contains(redis_secret), "{text}");
    }
    // Without the file the server refuses, and says so in one line.
    let refused = env.cmd().args(["status"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_password_file_is_one_line_naming_the_file_never_the_secret() {
    let env = TestEnv::new().await;
    let wrong = secret_file(&env, "wrong", "not-the-Password-0815\n");
    let empty = secret_file(&env, "empty", "\n");
    let missing = PathBuf::from("/nonexistent/seckill-password");
    let no_password_url = without_password(&env.cfg.mysql_url);
    let cases: Vec<(Vec<(&str, String)>, &str)> = vec![
        // The URL has a password and so has the file.
        (
            vec![("SECKILL_MYSQL_PASSWORD_FILE", wrong.display().to_string())],
            "has a password too",
        ),
        (
            vec![
                ("SECKILL_MYSQL_URL", no_password_url.clone()),
                ("SECKILL_MYSQL_PASSWORD_FILE", empty.display().to_string()),
            ],
            "is empty",
        ),
        (
            vec![
                ("SECKILL_MYSQL_URL", no_password_url.clone()),
                ("SECKILL_MYSQL_PASSWORD_FILE", missing.display().to_string()),
            ],
            "/nonexistent/seckill-password",
        ),
        (
            vec![
                ("SECKILL_MYSQL_URL", no_password_url.clone()),
                ("SECKILL_MYSQL_PASSWORD_FILE", wrong.display().to_string()),
            ],
            "Access denied",
        ),
    ];
    for (vars, expected) in cases {
        let mut cmd = env.cmd();
        for (k, v) in &vars {
            cmd.env(k, v);
        }
        let out = cmd.args(["status"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{vars:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{vars:?}: {err}");
        assert!(err.contains(expected), "{vars:?}: {err}");
        assert!(!err.contains("not-the-Password-0815"), "{err}");
    }
    env.cleanup().await;
}
