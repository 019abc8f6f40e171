//! Bad input through the real binary: one clear line on stderr naming the
//! problem, a non-zero exit code, no panic, and both stores unchanged.

mod common;

use common::TestEnv;

struct Case {
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    code: i32,
    needle: &'static str,
}

fn case(args: &[&str], code: i32, needle: &'static str) -> Case {
    Case {
        args: args.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        code,
        needle,
    }
}

fn with_env(mut c: Case, key: &'static str, value: String) -> Case {
    c.env.push((key, value));
    c
}

/// Runs the case and returns all it printed, stdout and stderr.
fn run_case(env: &TestEnv, c: &Case) -> String {
    let mut cmd = env.cmd();
    // Set on many developer machines (and on ours): errors stay one line.
    cmd.args(&c.args).env("RUST_BACKTRACE", "1");
    for (k, v) in &c.env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run seckill");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(c.code),
        "{:?}: stderr {stderr:?}",
        c.args
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "{:?}: not one line: {stderr:?}",
        c.args
    );
    assert!(stderr.starts_with("error: "), "{:?}: {stderr:?}", c.args);
    assert!(
        stderr.contains(c.needle),
        "{:?}: {stderr:?} does not name {:?}",
        c.args,
        c.needle
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
    assert!(stdout.is_empty(), "{:?}: printed {stdout:?}", c.args);
    format!("{stdout}{stderr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_one_line_a_non_zero_exit_and_changes_nothing() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 10).await;
    {
        // Some state worth protecting: a buyer, a stream entry.
        let keys = seckill::store::keys::VoucherKeys::new(&env.prefix, 1).unwrap();
        let mut redis = env.redis().await;
        seckill::gate::admission::admit(&mut redis, &keys, 1, 77, 123, None)
            .await
            .unwrap();
    }
    let before = env.snapshot().await;
    let cases = vec![
        case(
            &["voucher", "add", "--id", "abc", "--stock", "1"],
            2,
            "'abc' is not a number",
        ),
        case(
            &["voucher", "add", "--id", "0", "--stock", "1"],
            2,
            "must be at least 1",
        ),
        case(
            &["voucher", "add", "--id", "-5", "--stock", "1"],
            2,
            "must be a positive integer",
        ),
        case(
            &[
                "voucher",
                "add",
                "--id",
                "99999999999999999999",
                "--stock",
                "1",
            ],
            2,
            "too large",
        ),
        case(
            &[
                "voucher",
                "add",
                "--id",
                "9223372036854775808",
                "--stock",
                "1",
            ],
            2,
            "too large",
        ),
        case(
            &["voucher", "add", "--id", "2", "--stock", "-1"],
            1,
            "stock -1 is out of range",
        ),
        case(
            &["voucher", "add", "--id", "2", "--stock", "ten"],
            2,
            "'ten' is not a whole number",
        ),
        case(&["voucher", "add", "--id", "2"], 2, "--stock"),
        case(
            &[
                "voucher", "add", "--id", "2", "--stock", "5", "--begin", "+2h", "--end", "+1h",
            ],
            1,
            "begin must be before end",
        ),
        case(
            &[
                "voucher", "add", "--id", "2", "--stock", "5", "--begin", "tomorrow",
            ],
            1,
            "time 'tomorrow'",
        ),
        case(
            &[
                "voucher",
                "add",
                "--id",
                "2",
                "--stock",
                "5",
                "--end",
                "2099-01-01T00:00:00Z",
            ],
            1,
            "2038",
        ),
        case(
            &[
                "voucher",
                "add",
                "--id",
                "2",
                "--stock",
                "5",
                "--pay-timeout",
                "forever",
            ],
            2,
            "duration 'forever'",
        ),
        case(
            &[
                "voucher",
                "add",
                "--id",
                "2",
                "--stock",
                "5",
                "--pay-timeout",
                "0s",
            ],
            1,
            "pay timeout",
        ),
        case(
            &["voucher", "add", "--id", "1", "--stock", "5"],
            1,
            "voucher 1 already exists",
        ),
        case(
            &["buy", "--voucher", "1", "--user", "abc"],
            2,
            "'abc' is not a number",
        ),
        case(
            &["buy", "--voucher", "1", "--user", "0"],
            2,
            "must be at least 1",
        ),
        case(
            &["buy", "--voucher", "x1", "--user", "5"],
            2,
            "'x1' is not a number",
        ),
        case(
            &["buy", "--voucher", "1", "--user", "5", "--node-id", "1024"],
            2,
            "1024",
        ),
        case(
            &["bench", "--voucher", "1", "--users", "0"],
            1,
            "--users must be at least 1",
        ),
        case(
            &["bench", "--voucher", "1", "--concurrency", "0"],
            1,
            "--concurrency",
        ),
        case(
            &[
                "voucher",
                "add",
                "--id",
                "3",
                "--stock",
                "5",
                "--buckets",
                "0",
            ],
            2,
            "between 1 and 64",
        ),
        case(
            &[
                "voucher",
                "add",
                "--id",
                "3",
                "--stock",
                "5",
                "--buckets",
                "65",
            ],
            2,
            "between 1 and 64",
        ),
        case(&["preload"], 2, "--voucher"),
        case(
            &["preload", "--voucher", "1", "--all"],
            2,
            "cannot be used with",
        ),
        case(
            &["preload", "--voucher", "999"],
            1,
            "voucher 999 does not exist",
        ),
        case(&["voucher", "frobnicate"], 2, "frobnicate"),
        case(
            &["buy", "--voucher", "1", "--user", "5", "--prefix", "a b"],
            1,
            "key prefix 'a b'",
        ),
        case(
            &[
                "buy",
                "--voucher",
                "1",
                "--user",
                "5",
                "--redis-url",
                "redis://127.0.0.1:1/",
            ],
            1,
            "cannot connect to Redis at redis://127.0.0.1:1/",
        ),
        case(
            &[
                "buy",
                "--voucher",
                "1",
                "--user",
                "5",
                "--redis-url",
                "not a url",
            ],
            1,
            "cannot connect to Redis",
        ),
        case(
            &[
                "voucher",
                "list",
                "--mysql-url",
                "mysql://seckill:seckill@127.0.0.1:1/x",
            ],
            1,
            "cannot connect to MySQL",
        ),
        case(
            &[
                "voucher",
                "list",
                "--mysql-url",
                "postgres://a:b@127.0.0.1/x",
            ],
            1,
            "cannot connect to MySQL",
        ),
        case(
            &["voucher", "list", "--connect-timeout", "soon"],
            2,
            "duration 'soon'",
        ),
        case(
            &["serve", "--listen", "nowhere"],
            2,
            "invalid socket address",
        ),
        case(
            &["serve", "--listen", "0.0.0.0:1"],
            1,
            "without --api-key-file",
        ),
        case(
            &["serve", "--api-key-file", "/nonexistent/keys"],
            1,
            "cannot read the API key file /nonexistent/keys",
        ),
        case(
            &["serve", "--max-in-flight", "0"],
            1,
            "--max-in-flight must be",
        ),
        case(
            &["serve", "--request-timeout", "1ms"],
            1,
            "--request-timeout must be",
        ),
        case(
            &["serve", "--max-connections", "0"],
            1,
            "--max-connections must be between 1 and 1000000",
        ),
        case(
            &["serve", "--header-timeout", "0s"],
            1,
            "--header-timeout must be between 100ms and 1day",
        ),
        case(
            &["serve", "--idle-timeout", "300000000000y"],
            1,
            "--idle-timeout must be between 100ms and 1day",
        ),
        case(
            &["serve", "--wait-replicas", "1", "--wait-timeout", "3s"],
            1,
            "--wait-timeout must be above 0 and at least 200ms below --request-timeout",
        ),
    ];
    for c in &cases {
        run_case(&env, c);
    }
    assert_eq!(env.snapshot().await, before, "bad input changed a store");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_named_and_never_printed() {
    let env = TestEnv::new().await;
    let mut url = url::Url::parse(&env.cfg.mysql_url).unwrap();
    url.set_password(Some("Wr0ngPassw0rd")).unwrap();
    let before = env.snapshot().await;
    for args in [
        vec!["voucher", "list"],
        vec!["init"],
        vec!["preload", "--all"],
        vec!["voucher", "add", "--id", "5", "--stock", "1"],
    ] {
        let c = with_env(
            case(&args, 1, "access denied (wrong user or password)"),
            "SECKILL_MYSQL_URL",
            url.to_string(),
        );
        let all = run_case(&env, &c);
        assert!(!all.contains("Wr0ngPassw0rd"), "password leaked: {all}");
        assert!(all.contains("seckill:***@"), "URL not shown masked: {all}");
    }
    // A wrong Redis password too (this server has none, so AUTH fails).
    let c = case(
        &["buy", "--voucher", "1", "--user", "5"],
        1,
        "cannot connect to Redis",
    );
    let c = with_env(
        c,
        "SECKILL_REDIS_URL",
        "redis://:Wr0ngPassw0rd@127.0.0.1:16379/".replace("16379", &redis_port()),
    );
    run_case(&env, &c);
    assert_eq!(env.snapshot().await, before);
    env.cleanup().await;
}

fn redis_port() -> String {
    url::Url::parse(&common::redis_url())
        .ok()
        .and_then(|u| u.port())
        .unwrap_or(6379)
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_never_shows_a_password_from_the_environment() {
    let env = TestEnv::new().await;
    let out = env
        .cmd()
        .args(["voucher", "list", "--help"])
        .env("SECKILL_MYSQL_URL", "mysql://u:Sup3rSecret@127.0.0.1:1/x")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--mysql-url"));
    assert!(!help.contains("Sup3rSecret"), "{help}");
    assert!(
        !help.contains("seckill:seckill@"),
        "default password shown: {help}"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninitialised_database_is_named_and_left_alone() {
    let env = TestEnv::uninitialised().await;
    let mut redis = env.redis().await;
    let _: () = redis::cmd("PING").query_async(&mut redis).await.unwrap();
    for args in [
        vec!["voucher", "list"],
        vec!["voucher", "add", "--id", "1", "--stock", "3"],
        vec!["preload", "--all"],
    ] {
        run_case(
            &env,
            &case(&args, 1, "is not initialised: run `seckill init` first"),
        );
    }
    // The command did not create the database behind the operator's back:
    // asked of the server itself, over a connection to no database.
    assert!(
        !database_exists(&env).await,
        "database {} was created by a command that is not `seckill init`",
        env.db_name
    );

    // An existing but empty database is not initialised either.
    let created = seckill::store::db::Db::connect_for_init(&env.cfg)
        .await
        .unwrap();
    created.close().await;
    assert!(
        database_exists(&env).await,
        "the check above can see a database"
    );
    run_case(&env, &case(&["voucher", "list"], 1, "is not initialised"));
    env.cleanup().await;
}

/// Whether the server has the test's database, by information_schema.
async fn database_exists(env: &TestEnv) -> bool {
    use mysql_async::prelude::*;
    let opts = mysql_async::Opts::from_url(&env.cfg.mysql_url).unwrap();
    let opts = mysql_async::OptsBuilder::from_opts(opts).db_name(None::<String>);
    let mut conn = mysql_async::Conn::new(opts)
        .await
        .expect("test MySQL is up");
    let found: Option<String> = conn
        .exec_first(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name = ?",
            (&env.db_name,),
        )
        .await
        .unwrap();
    conn.disconnect().await.ok();
    found.is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bug_is_one_line_whatever_rust_backtrace_says() {
    let env = TestEnv::new().await;
    for place in ["startup", "command"] {
        for backtrace in ["1", "full"] {
            let c = with_env(
                with_env(
                    case(&["status"], 101, "a bug in seckill"),
                    "SECKILL_TEST_PANIC",
                    place.to_string(),
                ),
                "RUST_BACKTRACE",
                backtrace.to_string(),
            );
            let out = run_case(&env, &c);
            assert!(
                out.contains(&format!("test panic at {place}")),
                "{place}: {out}"
            );
        }
    }
    env.cleanup().await;
}
