//! The documented rights (contrib/redis-acl.conf, contrib/mysql-grants.sql)
//! applied to a test's own servers, for its prefix and database.

use super::own_mysql::OwnMysql;
use super::own_redis::OwnRedis;
use super::TestEnv;

pub const PASSWORD: &str = "Least-Privilege-42";

/// The ACL file's users, each as `ACL SETUSER` arguments (name first),
/// for this test's key prefix and the test password.
pub fn redis_acl_users(prefix: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/contrib/redis-acl.conf"
    ))
    .unwrap();
    text.lines()
        .filter(|l| l.starts_with("user "))
        .map(|line| {
            line.replace(">CHANGE-ME", &format!(">{PASSWORD}"))
                .replace("~seckill:*", &format!("~{prefix}:*"))
                .split_whitespace()
                .skip(1)
                .map(str::to_string)
                .collect()
        })
        .collect()
}

/// The ACL file's users on `redis`, for this test's key prefix.
pub fn apply_redis_acl(redis: &OwnRedis, prefix: &str) {
    for user in redis_acl_users(prefix) {
        let mut args = vec!["acl", "setuser"];
        args.extend(user.iter().map(String::as_str));
        assert_eq!(redis.cli(&args).trim(), "OK", "{user:?}");
    }
}

/// The grants file's users, for this test's database: the part before
/// `seckill init` (`after_init` false) or the part after it.
pub fn apply_mysql_grants(mysql: &OwnMysql, db: &str, after_init: bool) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/contrib/mysql-grants.sql"
    ))
    .unwrap()
    .replace("`seckill`.", &format!("`{db}`."))
    .replace("'CHANGE-ME'", &format!("'{PASSWORD}'"));
    let marker = text
        .lines()
        .find(|l| l.starts_with("-- == After `seckill init`"))
        .expect("the grants file marks what comes after init");
    let (before, after) = text.split_once(marker).unwrap_or((&text, ""));
    mysql.root_sql(if after_init { after } else { before });
}

/// The binary as `redis_user` and `mysql_user`, password from a file.
pub fn as_role(
    env: &TestEnv,
    redis: &OwnRedis,
    mysql: &OwnMysql,
    redis_user: &str,
    mysql_user: &str,
) -> assert_cmd::Command {
    let secret =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-pw", env.prefix));
    std::fs::write(&secret, PASSWORD).unwrap();
    let mut cmd = env.cmd();
    cmd.env(
        "SECKILL_REDIS_URL",
        format!("redis://{redis_user}@127.0.0.1:{}/", redis.port),
    )
    .env("SECKILL_REDIS_PASSWORD_FILE", &secret)
    .env(
        "SECKILL_MYSQL_URL",
        format!(
            "mysql://{mysql_user}@127.0.0.1:{}/{}",
            mysql.port, env.db_name
        ),
    )
    .env("SECKILL_MYSQL_PASSWORD_FILE", &secret);
    cmd
}

/// A Redis and a MariaDB of the test's own with the documented users, and
/// the test's database created but not initialised (`seckill init` runs as
/// `seckill-init`/`seckill_init`; the grants after it are the test's).
pub async fn documented_users_before_init() -> (OwnRedis, OwnMysql, TestEnv) {
    let redis = OwnRedis::start();
    let mysql = OwnMysql::start("");
    let mut env = TestEnv::uninitialised().await;
    env.cfg.redis_url = redis.url();
    env.cfg.mysql_url = mysql.url_for(&env.db_name);
    apply_redis_acl(&redis, &env.prefix);
    // The database exists before its users get rights on it (a DBA's step).
    mysql.root_sql(&format!("CREATE DATABASE `{}`", env.db_name));
    apply_mysql_grants(&mysql, &env.db_name, false);
    (redis, mysql, env)
}
