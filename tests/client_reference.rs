//! `client_reference`, the caller's own name for a purchase, driven over
//! HTTP and the CLI as applications and operators drive them: kept with
//! the order whether the request bought at once or waited in line first,
//! returned with the order and the purchase lookup, and refused (400,
//! nothing written) when it is not 1 to 64 printable ASCII characters.

mod common;

use std::time::Duration;

use common::invariants::assert_invariants;
use common::serve_proc::{assert_problem, Serve};
use common::{fast_worker, json, within_seconds, TestEnv};
use redis::AsyncCommands;
use seckill::store::keys::VoucherKeys;
use serde_json::{json, Value};

fn buy(serve: &Serve, v: u64, user: u64, reference: Option<&str>) -> (u16, Value) {
    let mut body = json!({ "user": user });
    if let Some(r) = reference {
        body["client_reference"] = json!(r);
    }
    serve.post(&format!("/v1/vouchers/{v}/purchases"), &body, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_goes_with_the_order_whether_it_bought_at_once_or_waited_in_line() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    // One unit whose buyer does not pay within 2 s: it goes to the line.
    env.add_voucher_paying_within(V, 1, -1_000, 3_600_000, 2_000)
        .await;
    env.preload(V).await;
    let serve = Serve::start(&env, &[]);
    let (status, first) = buy(&serve, V, 1, Some("cart-1"));
    assert_eq!(status, 201, "{first}");
    let first_order = first["order_id"].as_str().unwrap().to_string();
    assert_eq!(buy(&serve, V, 2, Some("cart 2/~")).0, 410);
    assert_eq!(buy(&serve, V, 3, None).0, 410);
    // A waiting user's later attempt keeps the reference it queued with.
    assert_eq!(buy(&serve, V, 2, Some("cart-2-again")).0, 410);

    let waiting = serve.standing(V, 2);
    assert_eq!(
        (
            waiting["state"].as_str(),
            waiting["client_reference"].as_str()
        ),
        (Some("waiting"), Some("cart 2/~")),
        "{waiting}"
    );
    assert_eq!(serve.standing(V, 3)["client_reference"], Value::Null);

    // User 1 does not pay: the unit goes to user 2, whose order carries
    // the reference its request waited with.
    let worker = env.spawn_worker(&fast_worker(&[]));
    let mut promoted = Value::Null;
    within_seconds(60, "user 2's order persisted", || {
        promoted = serve.standing(V, 2);
        promoted["order"].is_object()
    });
    worker.kill9();
    assert_eq!(promoted["state"], "bought", "{promoted}");
    assert_eq!(promoted["client_reference"], "cart 2/~", "{promoted}");
    assert_eq!(
        promoted["order"]["client_reference"], "cart 2/~",
        "{promoted}"
    );
    let mut redis = env.redis().await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let left: Option<String> = redis.hget(keys.waitlist_quantity(), "ref:2").await.unwrap();
    assert_eq!(left, None, "the reference left the line with the request");

    // The cancelled order keeps its own, over HTTP and in `seckill order`.
    let (status, order) = serve.get(&format!("/v1/orders/{first_order}"), None);
    assert_eq!(status, 200, "{order}");
    assert_eq!(
        (order["status"].as_str(), order["client_reference"].as_str()),
        (Some("cancelled"), Some("cart-1")),
        "{order}"
    );
    let shown = env
        .cmd()
        .args(["order", "show", &first_order, "--format", "json"])
        .output()
        .unwrap();
    assert!(shown.status.success(), "{shown:?}");
    assert_eq!(json(&shown)["client_reference"], "cart-1");
    let table = env
        .cmd()
        .args(["order", "show", &first_order])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("client reference") && table.contains("cart-1"),
        "{table}"
    );

    env.spawn_worker(&["--until-idle", "--block", "100ms"])
        .expect_success(Duration::from_secs(60));
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_reference_is_refused_and_writes_nothing() {
    const V: u64 = 1;
    let env = TestEnv::new().await;
    env.live_voucher(V, 1).await;
    let serve = Serve::start(&env, &[]);
    let before = env.snapshot().await;
    let long = "r".repeat(65);
    for bad in [
        json!(""),
        json!(long),
        json!("tab\there"),
        json!("é"),
        json!(7),
    ] {
        let (status, body) = serve.post(
            &format!("/v1/vouchers/{V}/purchases"),
            &json!({ "user": 5, "client_reference": bad }),
            None,
        );
        assert_problem(status, &body, body["request_id"].as_str());
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("invalid_field")),
            "{bad}: {body}"
        );
        assert!(
            body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("client_reference")),
            "{bad}: {body}"
        );
    }
    let buy_5 = |reference: &str| {
        env.cmd()
            .args(["buy", "--voucher", "1", "--user", "5", "--format", "json"])
            .args(["--client-reference", reference])
            .output()
            .unwrap()
    };
    // The command line: one line naming the problem, exit code 2.
    for bad in ["", "tab\there", long.as_str()] {
        let out = buy_5(bad);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.contains("client reference"), "{bad:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert_eq!(env.snapshot().await, before, "a refused reference wrote");

    // A good one from the command line reaches the order.
    let out = buy_5("-checkout 5-");
    assert!(out.status.success(), "{out:?}");
    let order = json(&out)["order_id"].as_str().unwrap().to_string();
    env.spawn_worker(&["--until-idle", "--block", "100ms"])
        .expect_success(Duration::from_secs(60));
    let (status, shown) = serve.get(&format!("/v1/orders/{order}"), None);
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["client_reference"], "-checkout 5-", "{shown}");
    assert_invariants(&env, V).await;
    env.cleanup().await;
}
