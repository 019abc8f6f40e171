//! Admission policy at the gate: the per-user rate limit (a sliding
//! one-second window, exact under concurrency) and admission tokens.

mod common;

use std::time::{Duration, Instant};

use common::TestEnv;
use redis::AsyncCommands;
use seckill::gate::admission::{admit, Admission};
use seckill::gate::policy;
use seckill::orders::policy::{Policy, PolicyChange};
use seckill::orders::voucher;
use seckill::orders::voucher::update_policy;
use seckill::store::keys::VoucherKeys;

const V: u64 = 1;

async fn set_policy(env: &TestEnv, voucher: u64, user_rate: u32, require_token: bool) {
    let mut redis = env.redis().await;
    let (p, at_gate) = policy::update(
        env.db().await,
        &mut redis,
        &env.prefix,
        voucher,
        PolicyChange {
            user_rate: Some(user_rate),
            require_token: Some(require_token),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        p,
        Policy {
            user_rate,
            require_token,
            ..Policy::default()
        }
    );
    assert!(at_gate);
}

async fn attempt(env: &TestEnv, user: u64, order: u64, token: Option<&str>) -> Admission {
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    admit(&mut redis, &keys, V, user, order, token)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_is_exact_under_many_parallel_attempts_of_one_user() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 1_000).await;
    set_policy(&env, V, 5, false).await;
    // 400 attempts by one user, 64 at a time.
    let report = env.sale_in_background(V, 1, 0, 400, 64).await.unwrap();
    let o = report.outcomes;
    let passed = o.success + o.already_bought;
    assert_eq!(o.success, 1, "{o:?}");
    assert_eq!(passed + o.rate_limited, 400, "{o:?}");
    // Within one second exactly 5 pass; a slower run may span more windows.
    let windows = report.elapsed_ms / 1_000 + 1;
    if report.elapsed_ms < 1_000 {
        assert_eq!(passed, 5, "{o:?} in {} ms", report.elapsed_ms);
    } else {
        assert!(passed >= 5 && passed <= 5 * windows, "{o:?}");
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_slides_instead_of_resetting_on_a_boundary_and_is_per_user() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 1_000).await;
    set_policy(&env, V, 3, false).await;
    let t0 = Instant::now();
    for i in 0..3 {
        assert!(matches!(
            attempt(&env, 1, 100 + i, None).await,
            Admission::Admitted { .. } | Admission::AlreadyBought
        ));
    }
    assert_eq!(attempt(&env, 1, 110, None).await, Admission::RateLimited);
    // Another user is not affected.
    assert!(matches!(
        attempt(&env, 2, 120, None).await,
        Admission::Admitted { .. }
    ));
    // 600 ms later a fixed window could have rolled over (a second boundary
    // lies somewhere in any 1 s span); the sliding one has not.
    tokio::time::sleep(Duration::from_millis(600).saturating_sub(t0.elapsed())).await;
    for i in 0..3 {
        assert_eq!(
            attempt(&env, 1, 130 + i, None).await,
            Admission::RateLimited,
            "at {:?}",
            t0.elapsed()
        );
    }
    // A full second after the three passed, one more passes.
    tokio::time::sleep(Duration::from_millis(1_100).saturating_sub(t0.elapsed())).await;
    assert_eq!(attempt(&env, 1, 140, None).await, Admission::AlreadyBought);
    let mut redis = env.redis().await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let r = policy::rejections(&mut redis, &keys).await.unwrap();
    assert_eq!(r.rate_limited, 4);
    env.cleanup().await;
}

/// A rate lowered during a sale counts the attempts already recorded: a
/// user with more of them in the last second than the new rate is refused
/// at once; raised again, the same record lets one more through. A refusal
/// reads only the rate-th newest entry of the user's list, so each step
/// checks that place for a list longer and shorter than the rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_lowered_or_raised_mid_second_counts_the_attempts_already_made() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 1_000).await;
    set_policy(&env, V, 10, false).await;
    for i in 0..6 {
        assert_ne!(
            attempt(&env, 1, 100 + i, None).await,
            Admission::RateLimited
        );
    }
    set_policy(&env, V, 3, false).await;
    assert_eq!(attempt(&env, 1, 110, None).await, Admission::RateLimited);
    set_policy(&env, V, 6, false).await;
    assert_eq!(attempt(&env, 1, 111, None).await, Admission::RateLimited);
    set_policy(&env, V, 7, false).await;
    assert_eq!(attempt(&env, 1, 112, None).await, Admission::AlreadyBought);
    assert_eq!(attempt(&env, 1, 113, None).await, Admission::RateLimited);
    // A user with one attempt on record, at a rate of one.
    set_policy(&env, V, 1, false).await;
    assert_ne!(attempt(&env, 2, 120, None).await, Admission::RateLimited);
    assert_eq!(attempt(&env, 2, 121, None).await, Admission::RateLimited);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voucher_that_requires_tokens_admits_only_the_users_own_token() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    env.live_voucher(2, 10).await;
    set_policy(&env, V, 0, true).await;
    set_policy(&env, 2, 0, true).await;
    let issue = |voucher: u64, user: u64, ttl: &str| {
        let out = env
            .cmd()
            .args(["token", "issue", "--voucher", &voucher.to_string()])
            .args([
                "--user",
                &user.to_string(),
                "--ttl",
                ttl,
                "--format",
                "json",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        common::json(&out)["token"].as_str().unwrap().to_string()
    };
    let mine = issue(V, 1, "10m");
    let other_users = issue(V, 2, "10m");
    let other_vouchers = issue(2, 1, "10m");
    let expiring = issue(V, 3, "100ms");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = env.snapshot().await;
    for (user, token) in [
        (1, None),
        (1, Some("00000000000000000000000000000000")),
        (1, Some(other_users.as_str())),
        (1, Some(other_vouchers.as_str())),
        (3, Some(expiring.as_str())),
    ] {
        assert_eq!(
            attempt(&env, user, 7, token).await,
            Admission::BadToken,
            "{token:?}"
        );
    }
    // Nothing written but the rejection counter.
    let after = env.snapshot().await;
    let meta = VoucherKeys::new(&env.prefix, V).unwrap().meta();
    let changed: Vec<&String> = after
        .redis
        .iter()
        .filter(|(k, v)| before.redis.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(changed, [&meta], "only the counters in meta changed");
    assert_eq!(before.tables, after.tables);
    let mut redis = env.redis().await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    assert_eq!(
        policy::rejections(&mut redis, &keys)
            .await
            .unwrap()
            .bad_token,
        5
    );
    // The right token, again and again until it expires.
    assert!(matches!(
        attempt(&env, 1, 8, Some(&mine)).await,
        Admission::Admitted { .. }
    ));
    assert_eq!(
        attempt(&env, 1, 9, Some(&mine)).await,
        Admission::AlreadyBought
    );
    // Through the binary: exit code 17 and the outcome name.
    let out = env
        .cmd()
        .args(["buy", "--voucher", "1", "--user", "4", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(17));
    assert_eq!(common::json(&out)["outcome"], "bad_token");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_changed_during_a_live_sale_takes_effect_at_once() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 100_000).await;
    let sale = env.sale_in_background(V, 50_000, 0, 50_000, 16);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let out = env
        .cmd()
        .args(["voucher", "update", "--id", "1", "--require-token"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let o = sale.await.unwrap().outcomes;
    assert!(o.success > 0 && o.bad_token > 0, "{o:?}");
    assert_eq!(o.success + o.bad_token, 50_000, "{o:?}");
    let status = env
        .cmd()
        .args(["status", "--voucher", "1", "--format", "json"])
        .output()
        .unwrap();
    let j = common::json(&status);
    assert_eq!(j[0]["require_token"], true);
    assert_eq!(j[0]["rejected"]["bad_token"], o.bad_token);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preload_and_reconcile_carry_the_policy_from_mysql() {
    let env = TestEnv::new().await;
    env.add_voucher(V, 10, -1_000, 3_600_000).await;
    // Changed while the gate is not loaded: preload publishes it.
    let out = env
        .cmd()
        .args([
            "voucher",
            "update",
            "--id",
            "1",
            "--user-rate",
            "4",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert_eq!(common::json(&out)["gate_updated"], false);
    env.preload(V).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let rate: u32 = redis.hget(keys.meta(), "user_rate").await.unwrap();
    assert_eq!(rate, 4);
    // The gate drifts from MySQL: reconcile reports, then repairs it.
    let _: () = redis.hset(keys.meta(), "user_rate", 0).await.unwrap();
    let _: () = redis.hset(keys.meta(), "require_token", 1).await.unwrap();
    let look = env
        .cmd()
        .args(["reconcile", "--dry-run", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(look.status.code(), Some(3));
    let j = common::json(&look);
    assert_eq!(
        j["vouchers"][0]["drifts"][0]["class"], "policy_differs",
        "{j}"
    );
    let fix = env
        .cmd()
        .args(["reconcile", "--yes", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(fix.status.code(), Some(4), "{fix:?}");
    let (rate, token): (u32, String) = redis::cmd("HMGET")
        .arg(keys.meta())
        .arg("user_rate")
        .arg("require_token")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!((rate, token.as_str()), (4, "0"));
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_servers_call_the_new_contract_through_redis_cli() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    set_policy(&env, V, 0, true).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/lua/seckill.lua");
    let token_script = concat!(env!("CARGO_MANIFEST_DIR"), "/lua/token.lua");
    let port = env
        .cfg
        .redis_url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let user_keys = |user: u64| {
        vec![
            keys.meta(),
            keys.stock(),
            keys.buyers(),
            keys.waitlist(),
            keys.orders(),
            keys.token(user),
            keys.rate(),
        ]
    };
    // The application stores a token it minted, then the user attempts.
    let token = "app-minted-token-0123456789abcdef";
    let k = keys.token(9);
    let stored = cli(&["--eval", token_script, &k, ",", token, "60000"]);
    assert_eq!(stored.trim(), "1", "{stored}");
    let mut args: Vec<String> = vec!["--eval".into(), script.into()];
    args.extend(user_keys(9));
    args.extend([
        ",".into(),
        "9".into(),
        "5001".into(),
        "1".into(),
        "wrong-token-0000000".into(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let bad = cli(&refs);
    assert!(bad.starts_with("8\nbad token"), "{bad}");
    let n = args.len();
    args[n - 1] = token.into();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let ok = cli(&refs);
    assert!(ok.starts_with("0\nok\n5001"), "{ok}");
    // A caller of the old contract (5 keys, 3 args) is told what is missing.
    let old = cli(&[
        "--eval",
        script,
        &keys.meta(),
        &keys.stock(),
        &keys.buyers(),
        &keys.waitlist(),
        &keys.orders(),
        ",",
        "10",
        "5002",
        "1",
    ]);
    assert!(old.contains("KEYS[6]"), "{old}");
    // Another user's token key with this user's id: refused, not checked.
    let mut slip: Vec<String> = vec!["--eval".into(), script.into()];
    let mut keys9 = user_keys(9);
    keys9[5] = keys.token(10);
    slip.extend(keys9);
    slip.extend([
        ",".into(),
        "9".into(),
        "5003".into(),
        "1".into(),
        token.into(),
    ]);
    let refs: Vec<&str> = slip.iter().map(String::as_str).collect();
    let refused = cli(&refs);
    assert!(
        refused.contains("KEYS[6] is not the token key"),
        "{refused}"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_policy_input_is_one_line_and_changes_nothing() {
    let env = TestEnv::new().await;
    for (args, needle) in [
        (
            vec!["voucher", "update", "--id", "999", "--user-rate", "3"],
            "voucher 999 does not exist",
        ),
        (vec!["voucher", "update", "--id", "1"], "nothing to change"),
        (
            vec!["voucher", "update", "--id", "1", "--user-rate", "-2"],
            "out of range",
        ),
        (
            vec![
                "voucher",
                "add",
                "--id",
                "5",
                "--stock",
                "1",
                "--user-rate",
                "5000",
            ],
            "out of range",
        ),
        (
            vec![
                "token",
                "issue",
                "--voucher",
                "1",
                "--user",
                "1",
                "--ttl",
                "2d",
            ],
            "out of range",
        ),
        (
            vec![
                "token",
                "issue",
                "--voucher",
                "1",
                "--user",
                "1",
                "--ttl",
                "soon",
            ],
            "soon",
        ),
        (
            vec![
                "voucher",
                "update",
                "--id",
                "1",
                "--require-token",
                "--no-require-token",
            ],
            "cannot be used with",
        ),
        (
            vec!["token", "issue", "--voucher", "42", "--user", "1"],
            "not loaded at the gate",
        ),
    ] {
        let out = env.cmd().args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_policy_updates_at_once_both_take_effect() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    let mut rate = env.cmd();
    rate.args(["voucher", "update", "--id", "1", "--user-rate", "7"]);
    let rate = std::thread::spawn(move || rate.output().unwrap());
    let token = env
        .cmd()
        .args(["voucher", "update", "--id", "1", "--require-token"])
        .output()
        .unwrap();
    assert!(token.status.success(), "{token:?}");
    let rate = rate.join().unwrap();
    assert!(rate.status.success(), "{rate:?}");
    let v = seckill::orders::voucher::get(env.db().await, V)
        .await
        .unwrap();
    let both = Policy {
        user_rate: 7,
        require_token: true,
        ..Policy::default()
    };
    assert_eq!(v.policy, both);
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let (rate, token): (u32, String) = redis::cmd("HMGET")
        .arg(keys.meta())
        .arg("user_rate")
        .arg("require_token")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!((rate, token.as_str()), (7, "1"), "the gate holds both too");
    env.cleanup().await;
}

/// The policy the gate's meta holds.
async fn gate_policy(env: &TestEnv, voucher: u64) -> Policy {
    let keys = VoucherKeys::new(&env.prefix, voucher).unwrap();
    let mut redis = env.redis().await;
    let (rate, token): (Option<u32>, Option<String>) = redis::cmd("HMGET")
        .arg(keys.meta())
        .arg(policy::META_USER_RATE)
        .arg(policy::META_REQUIRE_TOKEN)
        .query_async(&mut redis)
        .await
        .unwrap();
    policy::from_meta(policy::MetaPolicy {
        user_rate: rate,
        require_token: token,
        ..Default::default()
    })
}

/// The version of the policy the gate's meta holds, as written.
async fn gate_policy_version(env: &TestEnv, voucher: u64) -> Option<String> {
    let keys = VoucherKeys::new(&env.prefix, voucher).unwrap();
    let mut redis = env.redis().await;
    redis.hget(keys.meta(), "policy_version").await.unwrap()
}

/// Issue 19, item 10: two `voucher update`s at once each write MySQL, read
/// their policy back and publish it; the older publish may land last (its
/// updater then dies, or its read after the publish fails). The gate must
/// still end with MySQL's policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_policy_published_last_does_not_replace_mysqls() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let db = env.db().await;
    let older = update_policy(
        db,
        V,
        PolicyChange {
            user_rate: Some(5),
            require_token: Some(true),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let newer = update_policy(
        db,
        V,
        PolicyChange {
            user_rate: Some(0),
            require_token: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut redis = env.redis().await;
    policy::publish(&mut redis, &keys, newer).await.unwrap();
    policy::publish(&mut redis, &keys, older).await.unwrap();
    let mysql = voucher::get(db, V).await.unwrap().policy;
    assert_eq!(mysql, Policy::default());
    assert_eq!(gate_policy(&env, V).await, mysql, "the gate is MySQL's");
    env.cleanup().await;
}

/// Many `seckill voucher update` processes at once, each flipping tokens
/// and the rate: afterwards the gate holds MySQL's row, version and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_policy_updates_leave_the_gate_equal_to_mysql() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    const UPDATES: usize = 24;
    let mut children = Vec::new();
    for i in 0..UPDATES {
        let rate = ((i * 7) % 11).to_string();
        let token = if i % 2 == 0 {
            "--require-token"
        } else {
            "--no-require-token"
        };
        children.push(
            std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
                .envs(env.store_env())
                .env_remove("RUST_LOG")
                .args([
                    "voucher",
                    "update",
                    "--id",
                    "1",
                    "--user-rate",
                    &rate,
                    token,
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
    }
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let v = voucher::get(env.db().await, V).await.unwrap();
    assert_eq!(v.policy_version, UPDATES as u64, "one version per update");
    assert_eq!(gate_policy(&env, V).await, v.policy);
    assert_eq!(
        gate_policy_version(&env, V).await,
        Some(v.policy_version.to_string())
    );
    env.cleanup().await;
}

/// A preload that read MySQL before an update and publishes after that
/// update's own publish keeps the update's (newer) policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preload_that_read_mysql_before_an_update_keeps_the_newer_policy() {
    use std::io::{BufRead, BufReader};
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    let mut preload = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .envs(env.store_env())
        .env_remove("RUST_LOG")
        .env(seckill::support::fault::ENV, "between_snapshot_reads=2s")
        .args(["preload", "--voucher", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = BufReader::new(preload.stderr.take().unwrap()).lines();
    assert!(
        said.by_ref()
            .map_while(|l| l.ok())
            .any(|l| l.contains("test pause at between_snapshot_reads")),
        "preload never reached the pause"
    );
    set_policy(&env, V, 4, true).await;
    std::thread::spawn(move || said.for_each(drop));
    assert!(preload.wait().unwrap().success());
    let v = voucher::get(env.db().await, V).await.unwrap();
    assert_eq!(
        v.policy,
        Policy {
            user_rate: 4,
            require_token: true,
            ..Policy::default()
        }
    );
    assert_eq!(
        gate_policy(&env, V).await,
        v.policy,
        "the update's policy stays"
    );
    assert_eq!(gate_policy_version(&env, V).await, Some("1".to_string()));
    // A preload now publishes the same version again.
    env.preload(V).await;
    assert_eq!(gate_policy(&env, V).await, v.policy);
    env.cleanup().await;
}

/// An application server written before the version calls policy.lua with
/// two arguments: it publishes as it always did, and the version it did
/// not give is no longer claimed for the gate's policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_lua_without_a_version_publishes_unconditionally() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    set_policy(&env, V, 3, false).await;
    set_policy(&env, V, 2, true).await;
    assert_eq!(gate_policy_version(&env, V).await, Some("2".to_string()));
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let published: i64 = seckill::store::scripts::POLICY
        .key(keys.meta())
        .arg(9)
        .arg(0)
        .invoke_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(published, 1);
    assert_eq!(
        gate_policy(&env, V).await,
        Policy {
            user_rate: 9,
            require_token: false,
            ..Policy::default()
        }
    );
    assert_eq!(gate_policy_version(&env, V).await, None);
    // A versioned publish is taken again after it; an older one is refused.
    let v = voucher::get(env.db().await, V).await.unwrap();
    let published = policy::publish(&mut redis, &keys, v.versioned_policy())
        .await
        .unwrap();
    assert_eq!(published, policy::Published::Published);
    assert_eq!(gate_policy(&env, V).await, v.policy);
    let stale = seckill::orders::policy::VersionedPolicy {
        policy: Policy::default(),
        version: 1,
    };
    let published = policy::publish(&mut redis, &keys, stale).await.unwrap();
    assert_eq!(published, policy::Published::Newer);
    assert_eq!(gate_policy(&env, V).await, v.policy);
    // Not a version: an error reply, nothing written.
    let bad: redis::RedisResult<i64> = seckill::store::scripts::POLICY
        .key(keys.meta())
        .arg(0)
        .arg(0)
        .arg("12x")
        .invoke_async(&mut redis)
        .await;
    assert!(bad.is_err(), "{bad:?}");
    assert_eq!(gate_policy(&env, V).await, v.policy);
    env.cleanup().await;
}

/// Issue 19, item 11b: the rate hash expired 1 s after the end the sale had
/// when it was created, so extending the sale reset every user's window at
/// the old end. Its expiry follows the end preload publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extending_the_sale_keeps_the_rate_windows_past_the_old_end() {
    let env = TestEnv::new().await;
    // No stock: the attempt is waitlisted, nothing goes in flight (preload
    // refuses while orders are).
    env.add_voucher(V, 0, -1_000, 2_000).await;
    env.preload(V).await;
    set_policy(&env, V, 1, false).await;
    assert!(matches!(
        attempt(&env, 1, 100, None).await,
        Admission::SoldOut { .. }
    ));
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let old_end = voucher::get(env.db().await, V).await.unwrap().end_ms;
    let new_end = old_end + 60_000;
    {
        use mysql_async::prelude::*;
        let mut conn = env.db().await.conn().await.unwrap();
        conn.exec_drop(
            "UPDATE seckill_voucher SET end_time = FROM_UNIXTIME(? / 1000) WHERE voucher_id = ?",
            (new_end, V),
        )
        .await
        .unwrap();
    }
    env.preload(V).await;
    let expires: i64 = redis::cmd("PEXPIRETIME")
        .arg(keys.rate())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(expires, new_end + 1_000);
    let wait = old_end + 1_300 - seckill::support::timespec::now_ms();
    tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
    let kept: bool = redis.hexists(keys.rate(), "1").await.unwrap();
    assert!(kept, "the user's rate entry outlives the old end");
    env.cleanup().await;
}

/// A gate whose policy version is above MySQL's (MySQL restored from a
/// backup) would refuse every publish: reconcile replaces it with MySQL's
/// policy and version, and updates publish again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_replaces_a_policy_version_mysql_never_had() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    set_policy(&env, V, 2, false).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let _: () = redis
        .hset_multiple(
            keys.meta(),
            &[
                ("user_rate", "0"),
                ("require_token", "1"),
                ("policy_version", "99"),
            ],
        )
        .await
        .unwrap();
    let (code, report) = env.reconcile_json(&["--yes"]);
    assert_eq!(code, 4, "{report}");
    let v = voucher::get(env.db().await, V).await.unwrap();
    assert_eq!(gate_policy(&env, V).await, v.policy);
    assert_eq!(gate_policy_version(&env, V).await, Some("1".to_string()));
    set_policy(&env, V, 3, true).await;
    assert_eq!(
        gate_policy(&env, V).await,
        Policy {
            user_rate: 3,
            require_token: true,
            ..Policy::default()
        }
    );
    let (code, report) = env.reconcile_json(&["--dry-run"]);
    assert_eq!(code, 0, "{report}");
    env.cleanup().await;
}
