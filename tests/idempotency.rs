//! Idempotency keys on `seckill serve`'s purchases (docs/src/concepts/
//! idempotency.md), driven over HTTP as an application server drives them:
//! a resend gets the first answer byte for byte whatever happened since
//! (a lost answer, a sell-out, the sale's end, a rate limit, a Redis
//! restart), a key reused for another body is refused and writes nothing,
//! a hundred sends of one key at once admit once, and a key expires.

mod common;

use std::io::Write;
use std::time::Duration;

use common::invariants::assert_invariants;
use common::own_redis::OwnRedis;
use common::serve_proc::Serve;
use common::{free_port, http_agent, within_seconds, TestEnv};
use redis::AsyncCommands;
use seckill::store::keys::VoucherKeys;
use serde_json::{json, Value};

/// One answer as an application server sees it.
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    text: String,
    replayed: bool,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_string()
    }
}

/// A purchase of `body` at voucher `v` with idempotency key `key` (sent as
/// the header's value as is), and an API key when given.
fn send(serve: &Serve, v: u64, body: &Value, key: &str, api_key: Option<&str>) -> Reply {
    post(
        serve,
        &format!("/v1/vouchers/{v}/purchases"),
        body,
        key,
        api_key,
    )
}

/// A payment of `order` with idempotency key `key`.
fn pay(serve: &Serve, order: &str, key: &str) -> Reply {
    post(
        serve,
        &format!("/v1/orders/{order}/payment"),
        &json!({}),
        key,
        None,
    )
}

fn post(serve: &Serve, path: &str, body: &Value, key: &str, api_key: Option<&str>) -> Reply {
    let mut req = http_agent()
        .post(&serve.url(path))
        .header("content-type", "application/json")
        .header("idempotency-key", key);
    if let Some(k) = api_key {
        req = req.header("authorization", &format!("Bearer {k}"));
    }
    let mut r = req.send(body.to_string()).expect("an answer");
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    Reply {
        status: r.status().as_u16(),
        text: r.body_mut().read_to_string().unwrap_or_default(),
        replayed,
    }
}

/// The entries the voucher's stream has had (admissions sent to the worker).
async fn admissions(env: &TestEnv, v: u64) -> usize {
    let keys = VoucherKeys::new(&env.prefix, v).unwrap();
    let mut redis = env.redis().await;
    redis.xlen(keys.orders()).await.unwrap()
}

fn drain(env: &TestEnv) {
    env.spawn_worker(&["--until-idle", "--block", "100ms"])
        .expect_success(Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_after_a_lost_answer_gets_the_first_answer() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 5).await;
    // The first send's answer is lost after the admission ran: the gate
    // admitted the buyer, the caller got 503 outcome_unknown.
    let serve = Serve::start_with(
        &env,
        &[],
        "seckill=info",
        &[("SECKILL_TEST_FAULT", "serve_after_admit@1=error")],
    );
    let body = json!({ "user": "7" });
    let lost = send(&serve, V, &body, "order-7-a", None);
    assert_eq!(
        (lost.status, lost.code().as_str()),
        (503, "outcome_unknown"),
        "{lost:?}"
    );
    let resent = send(&serve, V, &body, "order-7-a", None);
    assert_eq!(resent.status, 201, "{resent:?}");
    assert!(resent.replayed, "{resent:?}");
    let again = send(&serve, V, &body, "\"order-7-a\"", None);
    assert_eq!((again.status, &again.text), (201, &resent.text));
    assert!(again.replayed);
    // The same request without a key: the buyer's own dedupe answers.
    let (status, _) = serve.buy(V, json!("7"));
    assert_eq!(status, 409);
    assert_eq!(admissions(&env, V).await, 1);

    // The client drops the connection right after sending (its answer
    // held back at the gate's side meanwhile): the resend is answered.
    let slow = Serve::start_with(
        &env,
        &[],
        "seckill=info",
        &[("SECKILL_TEST_PAUSE", "serve_after_admit=1s*1")],
    );
    let body = json!({ "user": "8" });
    let text = body.to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", slow.port)).unwrap();
    write!(
        s,
        "POST /v1/vouchers/{V}/purchases HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nIdempotency-Key: order-8\r\nContent-Length: {}\r\n\r\n{text}",
        text.len()
    )
    .unwrap();
    within_seconds(30, "the dropped request reached its pause", || {
        slow.log_text().contains("serve_after_admit")
    });
    drop(s);
    // The first is still being answered or was dropped with its
    // connection; its admission ran: the resend is answered from it.
    let resent = send(&slow, V, &body, "order-8", None);
    assert_eq!(resent.status, 201, "{resent:?}");
    assert!(resent.replayed);
    let again = send(&slow, V, &body, "order-8", None);
    assert_eq!((again.status, &again.text), (201, &resent.text));
    assert_eq!(admissions(&env, V).await, 2);
    drain(&env);
    let state = assert_invariants(&env, V).await;
    assert_eq!(state.orders.len(), 2);
    let order = resent.json()["order_id"]
        .as_str()
        .unwrap()
        .parse::<u64>()
        .unwrap();
    assert_eq!(state.orders[&8].0, order);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_after_a_sell_out_a_rate_limit_and_the_sale_s_end_gets_the_first_answer() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    // One unit; the sale ends 4 s from now; one attempt per user a second.
    env.add_voucher(V, 1, -1_000, 4_000).await;
    env.preload(V).await;
    let rate = env
        .cmd()
        .args(["voucher", "update", "--id", "1", "--user-rate", "1"])
        .output()
        .unwrap();
    assert!(rate.status.success(), "{rate:?}");
    let serve = Serve::start(&env, &[]);
    let first = send(&serve, V, &json!({ "user": 1 }), "k-1", None);
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed);
    // A resend at once: the user's rate would refuse it, the key replays.
    let at_once = send(
        &serve,
        V,
        &json!({ "user": "1", "quantity": 1 }),
        "k-1",
        None,
    );
    assert_eq!((at_once.status, &at_once.text), (201, &first.text));
    assert!(at_once.replayed);
    // Another buyer is refused (sold out), and their resend says so too.
    let late = send(&serve, V, &json!({ "user": 2 }), "k-2", None);
    assert_eq!(late.status, 410, "{late:?}");
    let (status, _) = serve.buy(V, json!(3));
    assert_eq!(status, 410);
    let late_again = send(&serve, V, &json!({ "user": 2 }), "k-2", None);
    assert_eq!((late_again.status, &late_again.text), (410, &late.text));
    // After the sale's end (seen by a request without a key), the resends
    // still get the answers of the sale.
    within_seconds(30, "the sale ended", || serve.buy(V, json!(4)).0 == 422);
    let after = send(&serve, V, &json!({ "user": 1 }), "k-1", None);
    assert_eq!((after.status, &after.text), (201, &first.text));
    assert!(after.replayed);
    let fresh = send(&serve, V, &json!({ "user": 1 }), "k-1-new", None);
    assert_eq!(fresh.status, 422, "a new key is a new request: {fresh:?}");
    assert!(!fresh.replayed);
    assert_eq!(admissions(&env, V).await, 1);
    drain(&env);
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_for_another_body_is_refused_and_writes_nothing() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    let policy = env
        .cmd()
        .args(["voucher", "update", "--id", "1", "--per-user-limit", "3"])
        .output()
        .unwrap();
    assert!(policy.status.success(), "{policy:?}");
    let key_file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "idem-keys-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::write(
        &key_file,
        "shop-a-key-0123456789abcdef\nshop-b-key-0123456789abcdef\n",
    )
    .unwrap();
    let serve = Serve::start(&env, &["--api-key-file", &key_file.display().to_string()]);
    let (a, b) = (
        Some("shop-a-key-0123456789abcdef"),
        Some("shop-b-key-0123456789abcdef"),
    );
    env.live_voucher(2, 10).await;
    let body = json!({ "user": 1, "quantity": 2, "client_reference": "cart-1" });
    let first = send(&serve, V, &body, "k", a);
    assert_eq!(first.status, 201, "{first:?}");
    // The same body spelled otherwise is the same request.
    let respelled = json!({ "client_reference": "cart-1", "quantity": 2.0, "user": "1" });
    let replay = send(&serve, V, &respelled, "k", a);
    assert!(replay.replayed, "{replay:?}");
    assert_eq!((replay.status, &replay.text), (first.status, &first.text));
    // The stores' keys, a reservation read field by field (its encoding's
    // order moves with reads alone).
    let mut redis = env.redis().await;
    let mut written = async || {
        let mut snapshot = env.snapshot().await;
        let mut reservations = Vec::new();
        for key in snapshot.redis.keys().filter(|k| k.contains(":idem:{")) {
            let fields: std::collections::BTreeMap<String, Vec<u8>> =
                redis.hgetall(key).await.unwrap();
            reservations.push((key.clone(), fields));
        }
        snapshot.redis.retain(|k, _| !k.contains(":idem:{"));
        (snapshot, reservations)
    };
    let before = written().await;
    for body in [
        json!({ "user": 1, "quantity": 3, "client_reference": "cart-1" }),
        json!({ "user": 1, "client_reference": "cart-1" }),
        json!({ "user": 2, "quantity": 2, "client_reference": "cart-1" }),
        // The reference is part of the request: another, or none, is
        // another request.
        json!({ "user": 1, "quantity": 2, "client_reference": "cart-2" }),
        json!({ "user": 1, "quantity": 2 }),
    ] {
        let reused = send(&serve, V, &body, "k", a);
        assert_eq!(
            (reused.status, reused.code().as_str()),
            (422, "idempotency_key_reused"),
            "{body}: {reused:?}"
        );
        assert!(!reused.replayed);
    }
    // Another voucher is another request too.
    let other = send(&serve, 2, &body, "k", a);
    assert_eq!(other.code(), "idempotency_key_reused", "{other:?}");
    assert!(written().await == before, "a refused reuse wrote something");
    // The same key under another API key is that caller's own.
    let other_caller = send(&serve, V, &json!({ "user": 2 }), "k", b);
    assert_eq!(other_caller.status, 201, "{other_caller:?}");
    assert!(!other_caller.replayed);
    // Bad keys: 400, nothing written.
    let before = written().await;
    for bad in ["\"open", &"x".repeat(256), "\"\""] {
        let refused = send(&serve, V, &json!({ "user": 3 }), bad, a);
        assert_eq!(
            (refused.status, refused.code().as_str()),
            (400, "invalid_header"),
            "{bad}: {refused:?}"
        );
    }
    assert!(written().await == before, "a bad key wrote something");
    drain(&env);
    assert_invariants(&env, V).await;
    std::fs::remove_file(&key_file).ok();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sends_of_one_key_at_once_admit_once() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 50).await;
    let serve = Serve::start(&env, &[]);
    let replies: Vec<Reply> = std::thread::scope(|s| {
        let sends: Vec<_> = (0..100)
            .map(|_| s.spawn(|| send(&serve, V, &json!({ "user": 42 }), "one-click", None)))
            .collect();
        sends.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let firsts: Vec<&Reply> = replies
        .iter()
        .filter(|r| !r.replayed && r.status == 201)
        .collect();
    assert_eq!(firsts.len(), 1, "{replies:?}");
    let success = &firsts[0].text;
    for r in &replies {
        let same = r.status == 201 && r.replayed && &r.text == success;
        let in_flight = r.status == 409 && r.code() == "idempotency_key_in_flight";
        assert!(same || in_flight || std::ptr::eq(r, firsts[0]), "{r:?}");
    }
    assert_eq!(admissions(&env, V).await, 1);
    drain(&env);
    let state = assert_invariants(&env, V).await;
    assert_eq!(state.orders.len(), 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_expires_with_its_lifetime() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 5).await;
    let serve = Serve::start(&env, &["--idempotency-ttl", "1s"]);
    let sent = std::time::Instant::now();
    let first = send(&serve, V, &json!({ "user": 5 }), "short-lived", None);
    assert_eq!(first.status, 201, "{first:?}");
    // The key was kept: a resend answered within its lifetime of the
    // first's sending (so of the record's writing) is a replay. On a
    // machine too loaded to answer within a second this says nothing.
    let again = send(&serve, V, &json!({ "user": 5 }), "short-lived", None);
    if sent.elapsed() < Duration::from_millis(1000) {
        assert!(again.replayed, "{again:?}");
    }
    let mut redis = env.redis().await;
    let pattern = format!("{}:*idem*", env.prefix);
    // What is left of the key's records lives at most its lifetime (they
    // may be gone already on a loaded machine).
    for key in common::scan_keys(&mut redis, &pattern).await.unwrap() {
        let ttl: i64 = redis.pttl(&key).await.unwrap();
        assert!(
            (-2..=1000).contains(&ttl) && ttl != -1,
            "{key} lives {ttl} ms"
        );
    }
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while !common::scan_keys(&mut redis, &pattern)
        .await
        .unwrap()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < until,
            "the key's records never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Past its lifetime the key is new: the request runs again and the
    // buyer's own dedupe answers.
    let later = send(&serve, V, &json!({ "user": 5 }), "short-lived", None);
    assert_eq!(later.status, 409, "{later:?}");
    assert!(!later.replayed);
    assert_eq!(later.json()["outcome"], "already_bought");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_s_answer_outlives_a_redis_restart_that_kept_its_writes() {
    const V: u64 = 1;
    let redis = OwnRedis::start();
    let mut env = TestEnv::on_redis(&redis.url()).await;
    env.live_voucher(V, 5).await;
    let serve = Serve::start(&env, &[]);
    let first = send(&serve, V, &json!({ "user": 9 }), "across-restart", None);
    assert_eq!(first.status, 201, "{first:?}");
    // On one Redis the reservation holds the admission's record.
    let mut conn = env.redis().await;
    let keys = common::scan_keys(&mut conn, &format!("{}:*idem*", env.prefix))
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "the reservation alone: {keys:?}");
    // A clean restart from a snapshot taken after the answer: the key's
    // records are as durable as the admission they describe.
    redis.snapshot();
    redis.shut_down();
    redis.start_again();
    env.forget_redis();
    let mut resent = send(&serve, V, &json!({ "user": 9 }), "across-restart", None);
    within_seconds(30, "serve reached Redis again", || {
        if resent.status == 503 {
            std::thread::sleep(Duration::from_millis(100));
            resent = send(&serve, V, &json!({ "user": 9 }), "across-restart", None);
            return false;
        }
        true
    });
    assert_eq!((resent.status, &resent.text), (201, &first.text));
    assert!(resent.replayed);
    assert_eq!(admissions(&env, V).await, 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seckill_buy_with_a_key_gives_its_first_outcome_again() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 1).await;
    let buy = |user: &str, key: &str| {
        env.cmd()
            .args(["buy", "--voucher", "1", "--user", user, "--format", "json"])
            .args(["--idempotency-key", key])
            .output()
            .unwrap()
    };
    let first = buy("1", "cli-1");
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    let order = common::json(&first)["order_id"].clone();
    // Sold out since (another buyer took nothing: one unit), and the
    // user already a buyer: the key still answers the first outcome.
    assert_eq!(env.buy_exit(V, "2"), Some(11));
    let again = buy("1", "cli-1");
    assert_eq!(again.status.code(), Some(0), "{again:?}");
    let replayed = common::json(&again);
    assert_eq!(
        (replayed["order_id"].clone(), replayed["replayed"].clone()),
        (order, json!(true))
    );
    // Another user with the key: one line, exit 19, nothing done (but the
    // node id `buy` leased to mint its order id).
    let sale = || env.snapshot();
    let before = sale().await;
    let reused = buy("3", "cli-1");
    assert_eq!(reused.status.code(), Some(19), "{reused:?}");
    let stderr = String::from_utf8_lossy(&reused.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("was used for another purchase"), "{stderr}");
    assert_eq!(sale().await, before);
    // The shared scope: serve without API keys answers the same key alike.
    let serve = Serve::start(&env, &[]);
    let over_http = send(&serve, V, &json!({ "user": 1 }), "cli-1", None);
    assert_eq!(over_http.status, 201, "{over_http:?}");
    assert!(over_http.replayed);
    assert_eq!(admissions(&env, V).await, 1);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_sent_before_the_sale_opens_runs_again_once_it_has() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    // Opens in an hour: "too early" is not kept for the key.
    env.add_voucher(V, 5, 3_600_000, 7_200_000).await;
    env.preload(V).await;
    let serve = Serve::start(&env, &[]);
    let early = send(&serve, V, &json!({ "user": 1 }), "early-bird", None);
    assert_eq!(early.status, 425, "{early:?}");
    // The sale opens (its gate's window moved into the past).
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let (secs, _): (i64, i64) = redis::cmd("TIME").query_async(&mut redis).await.unwrap();
    let _: () = redis
        .hset(keys.meta(), "begin_ms", (secs - 1) * 1000)
        .await
        .unwrap();
    let mut resent = early;
    within_seconds(30, "the sale opened for the key's resend", || {
        resent = send(&serve, V, &json!({ "user": 1 }), "early-bird", None);
        resent.status != 425
    });
    assert_eq!(resent.status, 201, "{resent:?}");
    assert!(!resent.replayed, "{resent:?}");
    let again = send(&serve, V, &json!({ "user": 1 }), "early-bird", None);
    assert_eq!((again.status, &again.text), (201, &resent.text));
    assert!(again.replayed);
    env.cleanup().await;
}

/// Review of issue 38's first build: a keyed purchase whose record was
/// named at a gate chosen before serve knew the voucher's layout failed on
/// every resend for the key's lifetime. Here serve cannot read the layout
/// from bucket 0's gate (lost whole): it must learn it, and name the
/// record at the buyer's own bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_sent_at_once_to_a_fresh_serve_reach_every_bucket() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    let (layout, mut redis) = env.live_voucher_in_buckets(V, 40, 4).await;
    common::lose_gate(&mut redis, &layout.keys(0).unwrap()).await;
    // A serve that has read nothing of the voucher yet: buyers of buckets
    // 1..3 send a key at once.
    let serve = Serve::start(&env, &[]);
    let users: Vec<u64> = (1..4)
        .flat_map(|b| {
            (1u64..)
                .filter(move |u| seckill::store::layout::bucket_of(*u, 4) == b)
                .take(3)
        })
        .collect();
    let firsts: Vec<Reply> = std::thread::scope(|s| {
        let sends: Vec<_> = users
            .iter()
            .map(|u| {
                let serve = &serve;
                s.spawn(move || send(serve, V, &json!({ "user": u }), &format!("fresh-{u}"), None))
            })
            .collect();
        sends.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (user, first) in users.iter().zip(&firsts) {
        assert_eq!(first.status, 201, "user {user}: {first:?}");
        let again = send(
            &serve,
            V,
            &json!({ "user": user }),
            &format!("fresh-{user}"),
            None,
        );
        assert_eq!(
            (again.status, &again.text),
            (201, &first.text),
            "user {user}"
        );
        assert!(again.replayed);
    }
    // Without keys alike: seen answered 404 unknown_voucher, 4 runs of 4,
    // while the first request asked MySQL for the layout (src/http/window.rs).
    let fresh = Serve::start(&env, &[]);
    let others: Vec<u64> = (1..4)
        .flat_map(|b| {
            (1u64..)
                .filter(move |u| seckill::store::layout::bucket_of(*u, 4) == b)
                .skip(3)
                .take(3)
        })
        .collect();
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let sends: Vec<_> = others
            .iter()
            .map(|u| {
                let fresh = &fresh;
                s.spawn(move || fresh.buy(V, json!(u)))
            })
            .collect();
        sends.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (user, (status, body)) in others.iter().zip(&answers) {
        assert_eq!(*status, 201, "user {user}: {body}");
    }
    env.cleanup().await;
}

/// Idempotency keys on payments: a payment whose serve died after it paid
/// (before its answer, or its key's record) is answered "paid" on the
/// resend, from the mark the payment's own statement left on the order;
/// a key that paid one order is refused for another and pays nothing; a
/// resend gets its first answer after the order was paid without the key;
/// an unknown order is not kept; sends of one key at once pay once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_with_a_key_is_made_once_and_answered_again() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 5).await;
    let serve = Serve::start(&env, &[]);
    for user in 1..=4 {
        assert_eq!(serve.buy(V, json!(user)).0, 201);
    }
    drain(&env);
    let state = assert_invariants(&env, V).await;
    let order = |user: u64| state.orders[&user].0.to_string();
    let status_of = |id: &str| serve.get(&format!("/v1/orders/{id}"), None).1["status"].clone();

    // Paid, then serve killed before it answered or recorded the answer.
    let paused = Serve::start_with(
        &env,
        &[],
        "seckill=info",
        &[("SECKILL_TEST_PAUSE", "after_pay=60s*1")],
    );
    let mut s = std::net::TcpStream::connect(("127.0.0.1", paused.port)).unwrap();
    write!(
        s,
        "POST /v1/orders/{}/payment HTTP/1.1\r\nHost: t\r\nIdempotency-Key: pay-1\r\nContent-Length: 0\r\n\r\n",
        order(1)
    )
    .unwrap();
    within_seconds(30, "the payment reached its pause", || {
        paused.log_text().contains("after_pay")
    });
    drop(paused);
    drop(s);
    assert_eq!(status_of(&order(1)), "paid");
    let expected = json!({ "outcome": "paid", "order_id": order(1) }).to_string();
    for _ in 0..2 {
        let resent = pay(&serve, &order(1), "pay-1");
        assert_eq!(
            (resent.status, &resent.text),
            (200, &expected),
            "{resent:?}"
        );
        assert!(resent.replayed, "{resent:?}");
    }

    // The key is order 1's: refused for order 2, which stays pending.
    let reused = pay(&serve, &order(2), "pay-1");
    assert_eq!(
        (reused.status, reused.code().as_str()),
        (422, "idempotency_key_reused"),
        "{reused:?}"
    );
    assert_eq!(status_of(&order(2)), "pending");

    // A first answer, given again after the order was paid without a key.
    let first = pay(&serve, &order(2), "pay-2");
    assert_eq!(first.status, 200, "{first:?}");
    assert!(!first.replayed);
    let plain = serve.post(
        &format!("/v1/orders/{}/payment", order(2)),
        &json!({}),
        None,
    );
    assert_eq!(plain.0, 409, "{plain:?}");
    let again = pay(&serve, &order(2), "pay-2");
    assert_eq!((again.status, &again.text), (200, &first.text));
    assert!(again.replayed);

    // An unknown order is not kept: the key is free for the real one.
    let unknown = pay(&serve, "12345", "pay-3");
    assert_eq!(unknown.status, 404, "{unknown:?}");
    let real = pay(&serve, &order(3), "pay-3");
    assert_eq!(real.status, 200, "{real:?}");
    assert!(!real.replayed);

    // Twenty sends of one key at once: one payment, the rest its answer
    // again or told to wait.
    let replies: Vec<Reply> = std::thread::scope(|s| {
        let sends: Vec<_> = (0..20)
            .map(|_| s.spawn(|| pay(&serve, &order(4), "pay-4")))
            .collect();
        sends.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let firsts = replies.iter().filter(|r| !r.replayed && r.status == 200);
    assert_eq!(firsts.count(), 1, "{replies:?}");
    for r in &replies {
        let paid = r.status == 200;
        let in_flight = r.status == 409 && r.code() == "idempotency_key_in_flight";
        assert!(paid || in_flight, "{r:?}");
    }
    let state = assert_invariants(&env, V).await;
    assert_eq!(state.orders.len(), 4);
    env.cleanup().await;
}

/// The request that paid is held after its payment, before it records its
/// answer; a resend meanwhile finds the payment its key made, answers it
/// as a replay and records it first. The request that paid still answers
/// as the first (not replayed), and both bodies are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_whose_resend_records_first_is_still_answered_as_the_first() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 5).await;
    let faults = std::env::temp_dir().join(format!("seckill-faults-{}", env.prefix));
    std::fs::create_dir_all(&faults).unwrap();
    let dir = faults.display().to_string();
    let serve = Serve::start_with(
        &env,
        &[],
        "seckill=info",
        &[
            ("SECKILL_TEST_FAULT", "after_pay@1=hold"),
            ("SECKILL_TEST_FAULT_DIR", &dir),
        ],
    );
    assert_eq!(serve.buy(V, json!(1)).0, 201);
    drain(&env);
    let state = assert_invariants(&env, V).await;
    let order = state.orders[&1].0.to_string();
    let (first, resent) = std::thread::scope(|s| {
        let first = s.spawn(|| pay(&serve, &order, "pay-race"));
        within_seconds(30, "the payment held after paying", || {
            serve.log_text().contains("fault hold at after_pay")
        });
        let resent = pay(&serve, &order, "pay-race");
        std::fs::write(faults.join("release"), "").unwrap();
        (first.join().unwrap(), resent)
    });
    assert_eq!(resent.status, 200, "{resent:?}");
    assert!(resent.replayed, "{resent:?}");
    assert_eq!((first.status, &first.text), (200, &resent.text));
    assert!(!first.replayed, "the request that paid: {first:?}");
    std::fs::remove_dir_all(&faults).ok();
    env.cleanup().await;
}

/// With `--wait-replicas`, the replica count is the first request's to
/// tell: a resend sent while the first still waits for replicas (none
/// here, so it waits its whole timeout) gets the same body, count and
/// all, not an answer rendered before any wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_during_the_first_s_wait_for_replicas_gets_the_same_answer() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 5).await;
    let serve = Serve::start(
        &env,
        &[
            "--wait-replicas",
            "1",
            "--wait-timeout",
            "3s",
            "--request-timeout",
            "10s",
        ],
    );
    let body = json!({ "user": 9 });
    let orders = VoucherKeys::new(&env.prefix, V).unwrap().orders();
    let (first, resent) = std::thread::scope(|s| {
        let first = s.spawn(|| send(&serve, V, &body, "waited", None));
        // The first request's admission ran and it now waits for a
        // replica.
        within_seconds(30, "the first request admitted", || {
            let out = std::process::Command::new("redis-cli")
                .args(["-u", &common::redis_url(), "XLEN", &orders])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim() == "1"
        });
        let resent = send(&serve, V, &body, "waited", None);
        (first.join().unwrap(), resent)
    });
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.json()["replicas_acked"], 0, "{first:?}");
    assert_eq!((resent.status, &resent.text), (201, &first.text));
    assert!(resent.replayed);
    assert_eq!(admissions(&env, V).await, 1);
    env.cleanup().await;
}

/// On a Redis Cluster the admission's record lives at the buyer's gate,
/// which a resend may not reach: the answer is stored in the key's
/// reservation too, so a resend after the record is gone (its master
/// failed over without it) replays the first answer instead of waiting
/// on a record that will never come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_resend_replays_the_answer_without_the_gate_s_record() {
    const V: u64 = 1;
    let env = TestEnv::on_cluster().await;
    let (layout, mut redis) = env.live_voucher_in_buckets(V, 10, 2).await;
    let serve = Serve::start(&env, &[]);
    let body = json!({ "user": 3 });
    let first = send(&serve, V, &body, "stored", None);
    assert_eq!(first.status, 201, "{first:?}");
    let gate = layout
        .keys(seckill::store::layout::bucket_of(3, 2))
        .unwrap();
    let records = common::scan_keys(&mut redis, &gate.idempotency_record("*"))
        .await
        .unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    let _: () = redis.del(&records[0]).await.unwrap();
    let resent = send(&serve, V, &body, "stored", None);
    assert_eq!(
        (resent.status, &resent.text),
        (201, &first.text),
        "{resent:?}"
    );
    assert!(resent.replayed);
    let mut entries = 0;
    for b in 0..2 {
        let orders = layout.keys(b).unwrap().orders();
        let n: usize = redis.xlen(orders).await.unwrap();
        entries += n;
    }
    assert_eq!(entries, 1);
    env.cleanup().await;
}
