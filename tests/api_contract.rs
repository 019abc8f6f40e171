//! The HTTP API's contract (issue 37), driven as an application server
//! drives it: one spelling per id, ids as strings in every answer, errors
//! as problems with codes and request ids, keys with scopes, and store
//! failures told apart by whether a retry can succeed. After each refused
//! request nothing was written.

mod common;

use std::io::Write;

use common::serve_proc::Serve;
use common::TestEnv;
use mysql_async::prelude::Queryable;
use serde_json::json;

const KEY: &str = "full-key-0123456789abcdef";
const READ_KEY: &str = "dash-key-0123456789abcdef";

fn key_file(env: &TestEnv) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("keys-{}", env.prefix));
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "{KEY}\n{READ_KEY} read").unwrap();
    path
}

/// The buyers the gate counts for voucher 1: what a refused request must
/// leave unchanged.
async fn buyers(env: &TestEnv) -> u64 {
    let keys = seckill::store::keys::VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    redis::AsyncCommands::scard(&mut redis, keys.buyers())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_spelling_per_id_and_every_id_answered_as_a_string() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 10).await;
    env.live_voucher(8, 10).await;
    let keys = key_file(&env);
    let serve = Serve::start(&env, &["--api-key-file", &keys.display().to_string()]);
    let key = Some(KEY);
    let post = |path: &str, body: &str| serve.post_raw(path, "application/json", body, key);
    for (path, body) in [
        ("/v1/vouchers/1/purchases", "[1]"),
        ("/v1/vouchers/1/purchases", r#"{"user": "+900010"}"#),
        ("/v1/vouchers/1/purchases", r#"{"user": "0900010"}"#),
        ("/v1/vouchers/1/purchases", r#"{"user": 1.5}"#),
        ("/v1/vouchers/1/purchases", r#"{"user": "1e3"}"#),
        ("/v1/vouchers/1/purchases", r#"{"user": 5, "x": 1}"#),
        ("/v1/vouchers/1/purchases", r#"{"user": 5, "quantity": 0}"#),
        ("/v1/vouchers/1/purchases", r#""5""#),
        (
            "/v1/vouchers/1/purchases",
            r#"{"user": 1.0000000000000001}"#,
        ),
        ("/v1/vouchers/+8/purchases", r#"{"user": 5}"#),
        ("/v1/vouchers/08/purchases", r#"{"user": 5}"#),
        ("/v1/vouchers/%38/purchases", r#"{"user": 5}"#),
        ("/v1/vouchers/%FF/purchases", r#"{"user": 5}"#),
    ] {
        let (status, body) = post(path, body);
        assert_eq!(status, 400, "{path} {body}");
        let text = body.to_string();
        assert!(
            !text.contains("expected struct") && !text.contains("PurchaseBody"),
            "{text}"
        );
    }
    assert_eq!(buyers(&env).await, 0, "a refused request wrote");
    let v8 = seckill::store::keys::VoucherKeys::new(&env.prefix, 8).unwrap();
    let mut redis = env.redis().await;
    let n: u64 = redis::AsyncCommands::scard(&mut redis, v8.buyers())
        .await
        .unwrap();
    assert_eq!(n, 0, "voucher 8 was bought through +8 or 08");
    // A long path comes back cut, not whole.
    let long = format!("/v1/orders/{}", "9".repeat(7_000));
    let (status, body) = serve.get(&long, key);
    assert_eq!(status, 400);
    assert!(
        body.to_string().len() < 1_000,
        "{} bytes",
        body.to_string().len()
    );

    // A whole number's other JSON spellings name the same id, exactly.
    let (status, body) = post(
        "/v1/vouchers/8/purchases",
        r#"{"user": 9007199254740993.0}"#,
    );
    assert_eq!(
        (status, &body["user"]),
        (201, &json!("9007199254740993")),
        "{body}"
    );
    let (status, body) = post("/v1/vouchers/8/purchases", r#"{"user": 1e18}"#);
    assert_eq!(
        (status, &body["user"]),
        (201, &json!("1000000000000000000")),
        "{body}"
    );
    // A route asked with a method it does not take.
    let (status, body) = serve.post("/v1/orders/1", &json!({}), key);
    assert_eq!(
        (status, &body["code"]),
        (405, &json!("method_not_allowed")),
        "{body}"
    );

    // A user id past 2^53: every id of every answer is a string.
    let user = "9007199254740993";
    let (status, bought) = post(
        "/v1/vouchers/1/purchases",
        &format!(r#"{{"user": "{user}"}}"#),
    );
    assert_eq!(status, 201, "{bought}");
    assert_eq!(bought["user"], user);
    let drained = env
        .cmd()
        .args(["worker", "--until-idle", "--block", "100ms"])
        .output()
        .unwrap();
    assert!(drained.status.success(), "{drained:?}");
    let order = bought["order_id"].as_str().unwrap();
    let (status, shown) = serve.get(&format!("/v1/orders/{order}"), key);
    assert_eq!(status, 200, "{shown}");
    assert_eq!(
        (&shown["user"], &shown["voucher"]),
        (&json!(user), &json!("1")),
        "{shown}"
    );
    let (_, lookup) = serve.get(&format!("/v1/vouchers/1/purchases/{user}"), key);
    assert_eq!(lookup["order"]["user"], user, "{lookup}");
    assert_eq!(lookup["order"]["voucher"], "1", "{lookup}");
    drop(serve);
    std::fs::remove_file(keys).ok();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_has_a_request_id_and_problems_name_it() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 10).await;
    let keys = key_file(&env);
    let serve = Serve::start(&env, &["--api-key-file", &keys.display().to_string()]);
    let (status, id, body) = serve.get_with(
        "/v1/orders/x",
        Some(KEY),
        &[("x-request-id", "app-42.a:b_c")],
    );
    assert_eq!((status, id.as_str()), (400, "app-42.a:b_c"), "{body}");
    assert_eq!(body["code"], "invalid_id");
    assert_eq!(body["request_id"], "app-42.a:b_c");
    // An id that could forge a log line is replaced.
    let (_, id, _) = serve.get_with("/v1/orders/1", Some(KEY), &[("x-request-id", "a b\"c")]);
    assert_eq!(id.len(), 32, "{id}");
    let (status, id, body) = serve.get_with("/v1/nothing", None, &[]);
    assert_eq!((status, &body["code"]), (404, &json!("no_such_route")));
    assert_eq!(body["request_id"], id.as_str());
    let (status, _, body) = serve.get_with("/v1/vouchers/1", None, &[]);
    assert_eq!((status, &body["code"]), (401, &json!("unauthorized")));
    let (status, _, body) = serve.get_with("/healthz", None, &[]);
    assert_eq!(status, 200, "{body}");
    drop(serve);
    std::fs::remove_file(keys).ok();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_key_reads_and_cannot_buy_pay_or_issue_tokens() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 10).await;
    let keys = key_file(&env);
    let serve = Serve::start(&env, &["--api-key-file", &keys.display().to_string()]);
    let read = Some(READ_KEY);
    assert_eq!(serve.get("/v1/vouchers/1", read).0, 200);
    assert_eq!(serve.get("/v1/vouchers/1/purchases/3", read).0, 200);
    assert_eq!(serve.get("/v1/openapi.json", read).0, 200);
    let head = common::http_agent()
        .head(&serve.url("/v1/vouchers/1"))
        .header("authorization", &format!("Bearer {READ_KEY}"))
        .call()
        .unwrap();
    assert_eq!(head.status().as_u16(), 200, "a read key's HEAD");
    for path in [
        "/v1/vouchers/1/purchases",
        "/v1/vouchers/1/tokens",
        "/v1/orders/1/payment",
    ] {
        let (status, body) = serve.post(path, &json!({ "user": 3 }), read);
        assert_eq!(
            (status, &body["code"]),
            (403, &json!("insufficient_scope")),
            "{path}: {body}"
        );
    }
    assert_eq!(buyers(&env).await, 0, "a read key bought");
    // A key without scopes keeps every right (key files before scopes).
    let (status, body) = serve.post("/v1/vouchers/1/purchases", &json!({ "user": 3 }), Some(KEY));
    assert_eq!(status, 201, "{body}");
    drop(serve);
    std::fs::remove_file(keys).ok();
    env.cleanup().await;
}

/// A privilege revoked from serve's MySQL user: the answer says a retry
/// will not mend it (no Retry-After) and shows no MySQL text; the log
/// line with the cause carries the request's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_no_retry_mends_is_told_so_without_the_store_s_text() {
    let mysql = common::own_mysql::OwnMysql::start("");
    let env = mysql.test_env().await;
    env.live_voucher(1, 10).await;
    let mut admin = env.db().await.conn().await.unwrap();
    let tables: Vec<String> = admin
        .exec(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
            (&env.db_name,),
        )
        .await
        .unwrap();
    drop(admin);
    // Every right serve needs but SELECT on the orders: a privilege
    // revoked (or never granted) by a DBA.
    mysql.root_sql("CREATE USER 'shop'@'%' IDENTIFIED BY 'pw-0123456789'");
    for t in tables.iter().filter(|t| *t != "seckill_order") {
        mysql.root_sql(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON `{}`.`{t}` TO 'shop'@'%'",
            env.db_name
        ));
    }
    let mut url = url::Url::parse(&mysql.url_for(&env.db_name)).unwrap();
    url.set_username("shop").unwrap();
    url.set_password(Some("pw-0123456789")).unwrap();
    let url = url.to_string();
    let serve = Serve::start_with(&env, &[], "seckill=info", &[("SECKILL_MYSQL_URL", &url)]);
    let (status, id, body) =
        serve.get_with("/v1/orders/12345", None, &[("x-request-id", "revoked-1")]);
    assert_eq!(
        (status, &body["code"]),
        (503, &json!("server_fault")),
        "{body}"
    );
    assert!(body.get("retry_after").is_none(), "{body}");
    let text = body.to_string();
    for internal in ["denied", "shop", "seckill_order", "1142"] {
        assert!(!text.contains(internal), "{internal} in {text}");
    }
    assert_eq!(id, "revoked-1");
    let log = serve.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("revoked-1") && l.contains("denied")),
        "no log line with the request id and the cause:\n{log}"
    );
    drop(serve);
    env.cleanup().await;
}

/// A key the gate cannot read (a corrupt value): a problem that promises
/// no retry and does not echo the stored value; on a purchase too, where
/// the gate's script meets it (its outcome unknown, and a retry meets it
/// again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_key_is_a_server_fault_that_echoes_nothing() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 10).await;
    env.live_voucher(2, 10).await;
    let keys = seckill::store::keys::VoucherKeys::new(&env.prefix, 1).unwrap();
    let mut redis = env.redis().await;
    let _: () = redis::AsyncCommands::del(&mut redis, keys.stock())
        .await
        .unwrap();
    let _: () = redis::AsyncCommands::hset(&mut redis, keys.stock(), "secret-value-xyz", "1")
        .await
        .unwrap();
    let two = seckill::store::keys::VoucherKeys::new(&env.prefix, 2).unwrap();
    let _: () = redis::AsyncCommands::set(&mut redis, two.buyers(), "secret-value-xyz")
        .await
        .unwrap();
    let serve = Serve::start(&env, &[]);
    let (status, body) = serve.get("/v1/vouchers/1", None);
    assert_eq!(
        (status, &body["code"]),
        (503, &json!("server_fault")),
        "{body}"
    );
    assert!(body.get("retry_after").is_none(), "{body}");
    assert!(!body.to_string().contains("secret-value"), "{body}");
    for v in [1, 2] {
        let (status, body) = serve.post(
            &format!("/v1/vouchers/{v}/purchases"),
            &json!({ "user": 1 }),
            None,
        );
        assert_eq!(
            (status, &body["code"]),
            (503, &json!("server_fault")),
            "{v}: {body}"
        );
        assert!(body.get("retry_after").is_none(), "{v}: {body}");
        let text = body.to_string();
        assert!(
            !text.contains("secret-value") && !text.contains("WRONGTYPE"),
            "{text}"
        );
    }
    drop(serve);
    env.cleanup().await;
}

/// The Python tools the contract tests run (schemathesis, a client
/// generator), installed by `scripts/pytools.sh` (which `scripts/test.sh`
/// runs): a test that needs one fails naming that script, never skips.
fn pytool(name: &str) -> std::path::PathBuf {
    let dir = std::env::var("SECKILL_TEST_PYTOOLS")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/.services/pytools").to_string());
    let path = std::path::Path::new(&dir).join("bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/pytools.sh (scripts/test.sh does)",
        path.display()
    );
    path
}

/// The document serve answers, written to `path`.
fn save_served_document(serve: &Serve, path: &std::path::Path) {
    let (status, served) = serve.get("/v1/openapi.json", Some(KEY));
    assert_eq!(status, 200, "{served}");
    std::fs::write(path, served.to_string()).unwrap();
}

/// Runs a tool to its end; its stdout when it succeeded, else fails
/// with `what` and both its outputs.
fn succeeds(cmd: &mut std::process::Command, what: &str) -> String {
    let out = cmd.output().expect("run the tool");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The sale the fuzzer meets: a live voucher whose per-user limit is the
/// most a quantity may be (so every quantity the document allows is
/// valid), one not started, one ended, one that requires a token.
async fn a_sale_to_fuzz(env: &TestEnv) {
    env.live_voucher(1, 50).await;
    let limit = ["voucher", "update", "--id", "1", "--per-user-limit", "100"];
    assert!(env.cmd().args(limit).output().unwrap().status.success());
    env.outside_the_window(2, 3).await;
    env.live_voucher(4, 5).await;
    let token = ["voucher", "update", "--id", "4", "--require-token"];
    assert!(env.cmd().args(token).output().unwrap().status.success());
}

/// schemathesis (every check, a fixed seed and example count, the
/// committed configuration) against the document serve answers: no
/// failure. What it declares are the business outcomes; no check is off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_holds_against_schemathesis() {
    let st = pytool("st");
    let env = TestEnv::new().await;
    a_sale_to_fuzz(&env).await;
    let keys = key_file(&env);
    let serve = Serve::start(&env, &["--api-key-file", &keys.display().to_string()]);
    // Purchases reach MySQL meanwhile: a lookup's order is answered too.
    let worker = env.spawn_worker(&["--block", "100ms"]);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let document = dir.join(format!("openapi-{}.json", env.prefix));
    save_served_document(&serve, &document);
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/contract/schemathesis.toml"
    );
    let mut run = std::process::Command::new(st);
    run.args(["--no-color", "--config-file", config, "run"])
        .arg(&document)
        .args(["--url", &serve.url("")])
        .args(["--checks", "all", "--seed", "1", "--max-examples", "100"])
        .args(["--header", &format!("Authorization: Bearer {KEY}")])
        .args(["--workers", "2"])
        .env("SCHEMATHESIS_HOOKS", "");
    // The run's tally, for the log of a passing run too.
    println!("{}", succeeds(&mut run, "schemathesis found failures"));
    drop(worker);
    drop(serve);
    std::fs::remove_file(document).ok();
    std::fs::remove_file(keys).ok();
    env.cleanup().await;
}

/// A client generated from the document serve answers
/// (openapi-python-client) calls every route and decodes every answer
/// into the document's models (tests/contract/generated_client.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_client_calls_every_route_and_decodes_every_answer() {
    let generator = pytool("openapi-python-client");
    let python = pytool("python");
    let env = TestEnv::new().await;
    env.live_voucher(1, 2).await;
    env.outside_the_window(2, 3).await;
    env.live_voucher(4, 5).await;
    for (v, flags) in [
        ("5", &["--user-rate", "1"][..]),
        ("6", &["--require-token"][..]),
        ("7", &["--per-user-limit", "3"][..]),
    ] {
        env.live_voucher(v.parse().unwrap(), 20).await;
        let mut args = vec!["voucher", "update", "--id", v];
        args.extend_from_slice(flags);
        assert!(env.cmd().args(&args).output().unwrap().status.success());
    }
    // One unit whose buyer does not pay within 2 s: the waiting room.
    env.add_voucher_paying_within(8, 1, -1_000, 3_600_000, 2_000)
        .await;
    env.preload(8).await;
    let mut redis = env.redis().await;
    let seven = seckill::store::keys::VoucherKeys::new(&env.prefix, 7).unwrap();
    let _: () = redis::AsyncCommands::set(&mut redis, seven.stock(), 2)
        .await
        .unwrap();
    let paused = seckill::store::keys::VoucherKeys::new(&env.prefix, 4).unwrap();
    let _: () = redis::AsyncCommands::hset(&mut redis, paused.meta(), "paused", "1")
        .await
        .unwrap();
    let keys = key_file(&env);
    let serve = Serve::start(&env, &["--api-key-file", &keys.display().to_string()]);
    // No gate guard: it would reopen voucher 4, paused by hand.
    let worker = env.spawn_worker(&["--block", "100ms", "--gate-check", "0s"]);
    let dir =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("client-{}", env.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let document = dir.join("openapi.json");
    save_served_document(&serve, &document);
    let mut generate = std::process::Command::new(generator);
    generate
        .args(["generate", "--meta", "none", "--overwrite", "--path"])
        .arg(&document)
        .arg("--output-path")
        .arg(dir.join("seckill_client"));
    succeeds(&mut generate, "the generator refused the document");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/contract/generated_client.py"
    );
    let mut client = std::process::Command::new(python);
    client
        .arg(script)
        .arg(&dir)
        .arg(serve.url(""))
        .args([KEY, READ_KEY]);
    println!("{}", succeeds(&mut client, "the generated client"));
    drop(worker);
    drop(serve);
    std::fs::remove_dir_all(dir).ok();
    std::fs::remove_file(keys).ok();
    env.cleanup().await;
}

/// A POST refused before its body is read (a key without the scope, a
/// bad path id) says `Connection: close`: serve drops such a connection,
/// and a client that sent its next request on it met "server disconnected
/// without sending a response" (the generated client, on a CI run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_refused_before_its_body_is_read_closes_its_connection() {
    use std::io::{Read, Write};
    let env = TestEnv::new().await;
    env.live_voucher(1, 10).await;
    let keys = key_file(&env);
    let serve = Serve::start(&env, &["--api-key-file", &keys.display().to_string()]);
    for (path, key) in [
        ("/v1/vouchers/1/purchases", READ_KEY),
        ("/v1/vouchers/08/purchases", KEY),
    ] {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", serve.port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let body = r#"{"user": 55}"#;
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 4"), "{path}: {head}");
        assert!(head.contains("connection: close"), "{path}: {head}");
    }
    assert_eq!(buyers(&env).await, 0);
    drop(serve);
    std::fs::remove_file(keys).ok();
    env.cleanup().await;
}
