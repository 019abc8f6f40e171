//! `lua/seckill.lua` is a public contract: an application server in another
//! language calls it with the documented KEYS and ARGV. Here that other
//! client is `redis-cli`, with EVALSHA of the file's SHA and with --eval.

mod common;

use std::path::Path;
use std::process::Command;

use common::invariants::assert_invariants;
use common::TestEnv;
use redis::AsyncCommands;
use seckill::store::keys::VoucherKeys;

fn redis_cli(args: &[&str]) -> (bool, String) {
    let out = Command::new("redis-cli")
        .arg("-u")
        .arg(common::redis_url())
        .args(args)
        .output()
        .expect("redis-cli is installed (scripts/services.sh up installs it)");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text.trim().to_string())
}

fn script_path() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("lua/seckill.lua")
        .to_string_lossy()
        .into_owned()
}

fn keys_of(env: &TestEnv, voucher: u64) -> [String; 5] {
    let k = VoucherKeys::new(&env.prefix, voucher).unwrap();
    [k.meta(), k.stock(), k.buyers(), k.waitlist(), k.orders()]
}

/// KEYS[1..8] of `user`'s admission at `k`'s gate.
fn keys_of_user(k: &VoucherKeys, user: u64) -> Vec<String> {
    vec![
        k.meta(),
        k.stock(),
        k.buyers(),
        k.waitlist(),
        k.orders(),
        k.token(user),
        k.rate(),
        k.waitlist_quantity(),
    ]
}

/// EVALSHA the way an app server does it: SCRIPT LOAD once, then by SHA.
fn evalsha(sha: &str, keys: &[String], argv: &[&str]) -> (bool, String) {
    let count = keys.len().to_string();
    let mut args: Vec<&str> = vec!["EVALSHA", sha, &count];
    args.extend(keys.iter().map(String::as_str));
    args.extend_from_slice(argv);
    redis_cli(&args)
}

#[tokio::test]
async fn another_client_gets_the_documented_replies() {
    let env = TestEnv::new().await;
    env.live_voucher(7, 1).await;
    let keys = keys_of(&env, 7);
    let source = std::fs::read_to_string(script_path()).unwrap();
    let (ok, sha) = redis_cli(&["SCRIPT", "LOAD", &source]);
    assert!(ok, "{sha}");
    assert_eq!(
        sha,
        seckill::store::scripts::ADMISSION.get_hash(),
        "the binary embeds the file as it is"
    );

    assert_eq!(
        evalsha(&sha, &keys, &["11", "1001", "7"]),
        (true, "0\nok\n1001".into())
    );
    assert_eq!(
        evalsha(&sha, &keys, &["11", "1002", "7"]),
        (true, "1\nalready bought\n0".into())
    );
    assert_eq!(
        evalsha(&sha, &keys, &["12", "1003", "7"]),
        (true, "2\nsold out\n1".into())
    );
    assert_eq!(
        evalsha(&sha, &keys, &["13", "1004", "7"]),
        (true, "2\nsold out\n2".into())
    );
    assert_eq!(
        evalsha(&sha, &keys, &["12", "1005", "7"]),
        (true, "2\nsold out\n1".into())
    );
    let unknown = keys_of(&env, 8);
    assert_eq!(
        evalsha(&sha, &unknown, &["11", "1006", "8"]),
        (true, "5\nunknown voucher\n0".into())
    );

    let mut redis = env.redis().await;
    let entries: redis::streams::StreamRangeReply = redis.xrange_all(&keys[4]).await.unwrap();
    assert_eq!(entries.ids.len(), 1);
    let e = &entries.ids[0];
    assert_eq!(e.get::<String>("user").as_deref(), Some("11"));
    assert_eq!(e.get::<String>("order").as_deref(), Some("1001"));
    assert_eq!(e.get::<String>("voucher").as_deref(), Some("7"));
    assert_eq!(e.get::<String>("kind").as_deref(), Some("admit"));
    assert_invariants(&env, 7).await;
    env.cleanup().await;
}

#[tokio::test]
async fn redis_cli_eval_of_the_file_admits_and_reports_the_window() {
    let env = TestEnv::new().await;
    env.add_voucher(3, 5, 3_600_000, 7_200_000).await;
    env.preload(3).await;
    let keys = keys_of(&env, 3);
    let path = script_path();
    let mut args: Vec<&str> = vec!["--eval", &path];
    args.extend(keys.iter().map(String::as_str));
    args.extend([",", "21", "2001", "3"]);
    let (ok, out) = redis_cli(&args);
    assert!(ok, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..2], ["3", "not started"], "{out}");
    assert!(lines[2].parse::<i64>().unwrap() > seckill::support::timespec::now_ms());
    env.cleanup().await;
}

#[tokio::test]
async fn bad_arguments_are_error_replies_and_write_nothing() {
    let env = TestEnv::new().await;
    env.live_voucher(9, 3).await;
    let keys = keys_of(&env, 9);
    let source = std::fs::read_to_string(script_path()).unwrap();
    let (_, sha) = redis_cli(&["SCRIPT", "LOAD", &source]);
    let before = env.snapshot().await;
    for (argv, needle) in [
        (["abc", "1", "9"], "bad user id"),
        (["0", "1", "9"], "bad user id"),
        (["-4", "1", "9"], "bad user id"),
        (["9223372036854775808", "1", "9"], "bad user id"),
        (["5", "x", "9"], "bad order id"),
        (["5", "1", "10"], "does not match the keys"),
    ] {
        let (_, out) = evalsha(&sha, &keys, &argv);
        assert!(out.contains(needle), "{argv:?}: {out}");
    }
    assert_eq!(env.snapshot().await, before);
    env.cleanup().await;
}

/// The gate's digests move only by what a write did: a deadline scheduled
/// twice in one call (a batch that carried one order twice), or again by a
/// resent call, counts once; dropping it twice takes it out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_given_twice_is_counted_once_in_its_digest() {
    use seckill::orders::timeouts::{self, Existing};
    let env = TestEnv::new().await;
    env.live_voucher(1, 5).await;
    let keys = VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let digest = |redis: &mut seckill::store::redis_conn::Redis| {
        let meta = keys.meta();
        let mut redis = redis.clone();
        async move {
            let d: Option<u64> = redis.hget(meta, "timeouts_digest").await.unwrap();
            d.unwrap_or(0)
        }
    };
    let added = timeouts::schedule(
        &mut redis,
        &keys,
        &[(7, 100), (7, 100), (8, 100)],
        Existing::Moves,
    )
    .await
    .unwrap();
    assert_eq!(added, 2);
    let once = digest(&mut redis).await;
    let members: Vec<String> = vec!["7".into(), "8".into()];
    assert_eq!(once, common::invariants::digest_of(&members));
    timeouts::schedule(&mut redis, &keys, &[(7, 200)], Existing::Stays)
        .await
        .unwrap();
    assert_eq!(digest(&mut redis).await, once, "a resent schedule");
    let score: Option<f64> = redis.zscore(keys.timeouts(), 7).await.unwrap();
    assert_eq!(score, Some(100.0), "left as it was");
    assert_eq!(
        timeouts::drop_deadlines(&mut redis, &keys, &[7, 7])
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        timeouts::drop_deadlines(&mut redis, &keys, &[7])
            .await
            .unwrap(),
        0
    );
    let left: Vec<String> = vec!["8".into()];
    assert_eq!(
        digest(&mut redis).await,
        common::invariants::digest_of(&left)
    );
    env.cleanup().await;
}

/// An idempotency key through the scripts alone (`KEYS[9]`, `KEYS[10]`,
/// `ARGV[6]`, `ARGV[7]` of lua/seckill.lua, and lua/idem_reserve.lua), as
/// a caller in another language sends it: the reservation is taken with
/// the admission, holding its reply, in one run; a second run with the
/// reservation taken does nothing (code 11); idem_reserve.lua answers a
/// resend with the recorded reply; a record of `KEYS[9]` alone answers a
/// resend with a fourth element 1; an outcome that is not kept (not
/// started) leaves the key free.
#[tokio::test]
async fn an_idempotency_key_is_taken_admitted_and_replayed_by_the_scripts() {
    let env = TestEnv::new().await;
    env.live_voucher(4, 2).await;
    env.add_voucher(5, 1, 3_600_000, 7_200_000).await;
    env.preload(5).await;
    let source = std::fs::read_to_string(script_path()).unwrap();
    let (ok, sha) = redis_cli(&["SCRIPT", "LOAD", &source]);
    assert!(ok, "{sha}");
    let keyed = |voucher: u64, user: &str, nonce: &str, reservation: Option<&str>| {
        let k = VoucherKeys::new(&env.prefix, voucher).unwrap();
        let mut keys = keys_of_user(&k, user.parse().unwrap());
        keys.push(k.idempotency_record(nonce));
        keys.extend(reservation.map(str::to_string));
        (keys, k.idempotency_record(nonce))
    };
    let run = |keys: &[String], argv: &[&str]| evalsha(&sha, keys, argv);
    let reserve_path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("lua/idem_reserve.lua")
        .to_string_lossy()
        .into_owned();
    let reserve = |reservation: &str, fingerprint: &str| {
        redis_cli(&[
            "--eval",
            &reserve_path,
            reservation,
            ",",
            fingerprint,
            "fresh-nonce",
            "60000",
        ])
    };
    let reservation = format!("{}:idem:{{shared:abc}}", env.prefix);
    let mut redis = env.redis().await;

    let (keys, record) = keyed(4, "21", "n1", Some(&reservation));
    let argv = ["21", "3001", "4", "", "", "60000", "fp-1"];
    assert_eq!(run(&keys, &argv), (true, "0\nok\n3001".into()));
    let taken: std::collections::HashMap<String, String> =
        redis.hgetall(&reservation).await.unwrap();
    let fields = |names: &[&str]| -> Vec<String> {
        names
            .iter()
            .map(|n| taken.get(*n).cloned().unwrap_or_default())
            .collect()
    };
    assert_eq!(
        fields(&["fingerprint", "state", "nonce", "code", "reason", "value"]),
        ["fp-1", "pending", "n1", "0", "ok", "3001"]
    );
    let ttl: i64 = redis.pttl(&reservation).await.unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    let exists: bool = redis.exists(&record).await.unwrap();
    assert!(!exists, "the reservation holds the record");

    // The key taken: another run (another nonce, even another user) does
    // nothing at all; idem_reserve.lua gives the recorded reply, or
    // refuses another fingerprint.
    let before = env.snapshot().await;
    let (again, _) = keyed(4, "22", "n2", Some(&reservation));
    let argv2 = ["22", "3002", "4", "", "", "60000", "fp-2"];
    assert_eq!(run(&again, &argv2), (true, "11\nkey reserved\n0".into()));
    assert_eq!(
        reserve(&reservation, "fp-1"),
        (true, "4\nn1\n0\nok\n3001".into())
    );
    assert_eq!(reserve(&reservation, "fp-2"), (true, "3\n\n0".into()));
    assert_eq!(env.snapshot().await, before);

    // KEYS[9] alone: recorded there, and a resend marked as read back.
    let (alone, alone_record) = keyed(4, "23", "n3", None);
    let argv3 = ["23", "3003", "4", "", "", "60000"];
    assert_eq!(run(&alone, &argv3), (true, "0\nok\n3003".into()));
    let exists: bool = redis.exists(&alone_record).await.unwrap();
    assert!(exists);
    let before = env.snapshot().await;
    assert_eq!(run(&alone, &argv3), (true, "0\nok\n3003\n1".into()));
    assert_eq!(env.snapshot().await, before);

    // Not started is not kept: nothing recorded, the key stays free.
    let free = format!("{}:idem:{{shared:def}}", env.prefix);
    let (early, early_record) = keyed(5, "24", "n4", Some(&free));
    let (ok, out) = run(&early, &["24", "3004", "5", "", "", "60000", "fp-4"]);
    assert!(ok && out.starts_with("3\nnot started\n"), "{out}");
    for key in [&free, &early_record] {
        let exists: bool = redis.exists(key).await.unwrap();
        assert!(!exists, "{key}");
    }

    // A reservation without a fingerprint is an error.
    let (_, out) = run(&early, &["24", "3005", "5", "", "", "60000"]);
    assert!(out.contains("ARGV[7]"), "{out}");
    assert_invariants(&env, 4).await;
    env.cleanup().await;
}

/// ARGV[8], the client reference: on the order entry of an admission, in
/// KEYS[8]'s ref:<user> while the request waits (its first reference: a
/// waiting user's later attempts change nothing), gone when the user is
/// admitted; part of what a KEYS[9] record names; a bad one, or one
/// without KEYS[8], is an error reply that writes nothing.
#[tokio::test]
async fn a_client_reference_goes_with_the_entry_or_waits_in_line() {
    let env = TestEnv::new().await;
    env.live_voucher(6, 1).await;
    let source = std::fs::read_to_string(script_path()).unwrap();
    let (ok, sha) = redis_cli(&["SCRIPT", "LOAD", &source]);
    assert!(ok, "{sha}");
    let k = VoucherKeys::new(&env.prefix, 6).unwrap();
    let keys_for = |user: u64, nonce: Option<&str>| {
        let mut keys = keys_of_user(&k, user);
        keys.extend(nonce.map(|n| k.idempotency_record(n)));
        keys
    };
    let run = |keys: &[String], argv: &[&str]| evalsha(&sha, keys, argv);
    let mut redis = env.redis().await;

    // Refused, nothing written: too long, a control character, no KEYS[8].
    let before = env.snapshot().await;
    let long = "r".repeat(65);
    for (keys, reference, needle) in [
        (keys_for(31, None), long.as_str(), "ARGV[8]"),
        (keys_for(31, None), "tab\there", "ARGV[8]"),
        (keys_of(&env, 6).to_vec(), "ok-ref", "needs KEYS[8]"),
    ] {
        let (_, out) = run(&keys, &["31", "4001", "6", "", "", "", "", reference]);
        assert!(out.contains(needle), "{reference:?}: {out}");
    }
    assert_eq!(env.snapshot().await, before);

    // Admitted: the entry carries it.
    let argv = ["31", "4002", "6", "", "", "", "", "cart 31/~"];
    assert_eq!(
        run(&keys_for(31, None), &argv),
        (true, "0\nok\n4002".into())
    );
    let entries: redis::streams::StreamRangeReply = redis.xrange_all(k.orders()).await.unwrap();
    let last = entries.ids.last().unwrap();
    assert_eq!(
        last.get::<String>("ref").as_deref(),
        Some("cart 31/~"),
        "{last:?}"
    );

    // Sold out: it waits with the request, the first one only.
    for (order, reference) in [("4003", "cart-32"), ("4004", "cart-32-again")] {
        let argv = ["32", order, "6", "", "", "", "", reference];
        assert_eq!(
            run(&keys_for(32, None), &argv),
            (true, "2\nsold out\n1".into())
        );
    }
    assert_eq!(
        run(&keys_for(33, None), &["33", "4005", "6"]),
        (true, "2\nsold out\n2".into())
    );
    let waiting: std::collections::HashMap<String, String> =
        redis.hgetall(k.waitlist_quantity()).await.unwrap();
    assert_eq!(
        waiting,
        [("ref:32".to_string(), "cart-32".to_string())].into(),
        "user 33 asked with none"
    );

    // Admitted while waiting (a unit added, at both stores): this
    // request's reference goes on its entry, the waiting one's is gone.
    let _: () = redis.set(k.stock(), 1).await.unwrap();
    let _: () = redis.hincr(k.meta(), "total", 1).await.unwrap();
    let db = env.db().await;
    let mut conn = db.conn().await.unwrap();
    mysql_async::prelude::Queryable::query_drop(
        &mut conn,
        "UPDATE seckill_voucher SET stock = stock + 1, total_stock = total_stock + 1 WHERE voucher_id = 6",
    )
    .await
    .unwrap();
    drop(conn);
    let argv = ["32", "4006", "6", "", "", "", "", "cart-32-now"];
    assert_eq!(
        run(&keys_for(32, None), &argv),
        (true, "0\nok\n4006".into())
    );
    let waiting: std::collections::HashMap<String, String> =
        redis.hgetall(k.waitlist_quantity()).await.unwrap();
    assert!(waiting.is_empty(), "{waiting:?}");
    let entries: redis::streams::StreamRangeReply = redis.xrange_all(k.orders()).await.unwrap();
    let last = entries.ids.last().unwrap();
    assert_eq!(last.get::<String>("ref").as_deref(), Some("cart-32-now"));

    // A record names the reference: another one with the same KEYS[9] is
    // another request; the same one is answered again.
    let keyed = keys_for(34, Some("n34"));
    let argv = ["34", "4007", "6", "", "", "60000", "", "cart-34"];
    assert_eq!(run(&keyed, &argv), (true, "2\nsold out\n2".into()));
    let (_, out) = run(&keyed, &["34", "4008", "6", "", "", "60000", "", "cart-35"]);
    assert!(out.contains("another request"), "{out}");
    let (_, out) = run(&keyed, &["34", "4008", "6", "", "", "60000"]);
    assert!(out.contains("another request"), "{out}");
    assert_eq!(
        run(&keyed, &["34", "4009", "6", "", "", "60000", "", "cart-34"]),
        (true, "2\nsold out\n2\n1".into())
    );
    assert_invariants(&env, 6).await;
    env.cleanup().await;
}
