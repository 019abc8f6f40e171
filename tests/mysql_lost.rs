//! MySQL that lost its last commits (issue 34): a failover to an
//! asynchronous replica, or a backup restored, stood in for by a dump of
//! the test's database loaded back over it. A worker's gate guard sees
//! MySQL hold fewer orders (or fewer cancellations) than the gates saw it
//! commit, pauses the gate, restores what Redis kept of the lost orders,
//! and reopens it; no buyer told "success" is dropped, no unit sold twice.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::invariants::assert_invariants;
use common::own_redis::OwnRedis;
use common::process::WorkerProc;
use common::{fast_worker, free_port, json, scrape_metrics, TestEnv};
use mysql_async::prelude::*;
use redis::AsyncCommands;
use seckill::store::keys::VoucherKeys;
use serde_json::Value;

/// The worker's counters of a pause for MySQL's lost commits and of a
/// gate rebuilt and reopened.
const LOST: &str = "gate_pauses_mysql_lost_commits";
const REOPENED: &str = "gate_reopens";

/// (order id, user, status, held) of the voucher's orders, by id.
async fn orders_held(env: &TestEnv, voucher: u64) -> Vec<(u64, u64, i8, i8)> {
    let mut conn = env.db().await.conn().await.unwrap();
    conn.exec(
        "SELECT id, user_id, status, held FROM seckill_order WHERE voucher_id = ? ORDER BY id",
        (voucher,),
    )
    .await
    .unwrap()
}

fn order_of(orders: &[(u64, u64, i8, i8)], user: u64) -> (u64, u64, i8, i8) {
    *orders
        .iter()
        .find(|o| o.1 == user)
        .unwrap_or_else(|| panic!("no order of user {user}: {orders:?}"))
}

fn buy_users(env: &TestEnv, voucher: u64, users: std::ops::RangeInclusive<u64>) {
    for user in users {
        assert_eq!(
            env.buy_exit(voucher, &user.to_string()),
            Some(0),
            "user {user}"
        );
    }
}

fn pay(env: &TestEnv, order: u64) {
    let out = env
        .cmd()
        .args(["pay", "--order", &order.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

fn voucher_status(env: &TestEnv, voucher: u64) -> Value {
    let out = env
        .cmd()
        .args([
            "status",
            "--voucher",
            &voucher.to_string(),
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    json(&out)[0].clone()
}

/// The gauge's value on a metrics page.
fn gauge(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The reproduction as written, with a worker running throughout:
/// 30 orders in MySQL, dumped; users 31..60 buy, user 45 pays; the dump is
/// restored. The guard pauses the gate (status says why, the metric counts
/// the loss), restores the 30 orders with their ids (user 45's pending and
/// held, for the operator), and reopens it; reconcile is clean and lists
/// the held order; user 45 cannot buy again. Before: nothing paused, and
/// reconcile --yes dropped the 30 buyers and sold their units again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_restored_under_a_running_worker_is_paused_restored_and_reopened() {
    let env = TestEnv::new().await;
    env.live_voucher(77, 100).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut worker = env.spawn_worker_with(
        &fast_worker(&["--gate-check", "1s", "--metrics-addr", &addr]),
        // Held paused a while, so that status and the metric can be seen.
        &[("SECKILL_TEST_PAUSE", "gate_paused=3s*1")],
    );
    worker.expect_gate_pauses();
    env.admit_users(77, 30, 0).await;
    env.wait_orders(77, 30, Duration::from_secs(30)).await;
    let dump = env.dump_mysql();
    buy_users(&env, 77, 31..=49);
    // A buyer with a client reference: its order comes back with it.
    let referenced = env
        .cmd()
        .args(["buy", "--voucher", "77", "--user", "50"])
        .args(["--client-reference", "lost-50"])
        .output()
        .unwrap();
    assert!(referenced.status.success(), "{referenced:?}");
    buy_users(&env, 77, 51..=60);
    env.wait_orders(77, 60, Duration::from_secs(30)).await;
    let before = orders_held(&env, 77).await;
    let paid = order_of(&before, 45).0;
    pay(&env, paid);
    env.restore_mysql(&dump);
    assert_eq!(env.order_count(77).await, 30, "the dump is back");

    let found = worker.wait_count(LOST, 1, Duration::from_secs(10));
    let status = voucher_status(&env, 77);
    assert_eq!(
        (&status["paused"], &status["paused_reason"]),
        (&Value::from(true), &Value::from("mysql_lost_commits")),
        "{status:#}"
    );
    let page = scrape_metrics(port).await;
    assert_eq!(
        gauge(&page, "seckill_mysql_commits_lost"),
        Some(30.0),
        "{page}"
    );
    worker.wait_count(REOPENED, 1, Duration::from_secs(20));

    let after = orders_held(&env, 77).await;
    assert_eq!(after.len(), 60, "{after:?}");
    for (id, user, status, held) in &after {
        let was = before.iter().find(|o| o.0 == *id);
        assert_eq!(
            was.map(|o| o.1),
            Some(*user),
            "order {id} came back with its id and user"
        );
        let expected = if *user == 45 { (0, 1) } else { (0, 0) };
        assert_eq!((*status, *held), expected, "order {id} of user {user}");
    }
    let fifty = order_of(&after, 50).0.to_string();
    let shown = env
        .cmd()
        .args(["order", "show", &fifty, "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(json(&shown)["client_reference"], "lost-50", "{shown:?}");
    let (code, report) = env.reconcile_json(&["--dry-run"]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        report["vouchers"][0]["orders_held"],
        serde_json::json!([paid]),
        "{report:#}"
    );
    assert_eq!(
        env.buy_exit(77, "45"),
        Some(10),
        "the paid user bought again"
    );
    assert_eq!(env.buy_exit(77, "61"), Some(0));
    env.wait_orders(77, 61, Duration::from_secs(30)).await;
    env.wait_drained(77, Duration::from_secs(30)).await;
    // A preload (the gate rebuilt from MySQL) schedules no deadline for the
    // held order: its payment is the operator's to settle.
    env.preload(77).await;
    let keys = VoucherKeys::new(&env.prefix, 77).unwrap();
    let mut redis = env.redis().await;
    let deadline: Option<f64> = redis.zscore(keys.timeouts(), paid).await.unwrap();
    assert_eq!(deadline, None, "a held order got a deadline");
    // The operator, told by the payment provider it was paid, says so.
    pay(&env, paid);
    assert_eq!(order_of(&orders_held(&env, 77).await, 45).2, 1);
    within(10, "the loss gauge back at 0", async || {
        gauge(&scrape_metrics(port).await, "seckill_mysql_commits_lost") == Some(0.0)
    })
    .await;
    assert_invariants(&env, 77).await;
    eprintln!(
        "found {} after the restore",
        humantime::format_duration(found)
    );
    drop(worker);
    env.cleanup().await;
}

/// A restore to a point between a cancellation and its release: three
/// orders in the dump, a fourth after it; all four pass their deadline and
/// the worker cancels them in MySQL, then stops before giving their units
/// back (the dump is restored there). The fourth comes back cancelled, its
/// unit still to be given back (its deadline passed: restored pending, the
/// release to come would give back a unit a pending order holds); the
/// three the dump has pending are cancelled again once their units come
/// back. Every unit is back once, in both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_between_cancellations_and_their_release_cancels_each_once() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(78, 10, 2_000).await;
    let mut worker = env.spawn_worker_with(
        &fast_worker(&["--gate-check", "1s"]),
        &[("SECKILL_TEST_PAUSE", "after_cancel=5s*1")],
    );
    worker.expect_gate_pauses();
    env.admit_users(78, 3, 0).await;
    env.wait_orders(78, 3, Duration::from_secs(30)).await;
    let dump = env.dump_mysql();
    buy_users(&env, 78, 4..=4);
    env.wait_orders(78, 4, Duration::from_secs(30)).await;
    worker.wait_log("test pause at after_cancel", Duration::from_secs(30));
    // The first deadlines' pass (the dump's three orders, the fourth too
    // if it was due by then) is cancelled in MySQL, not yet released.
    let in_dump = orders_held(&env, 78).await;
    let cancelled = in_dump.iter().filter(|o| o.1 <= 3 && o.2 == -1).count();
    assert!(cancelled > 0, "{in_dump:?}");
    env.restore_mysql(&dump);

    worker.wait_count(LOST, 1, Duration::from_secs(10));
    worker.wait_log(
        &format!("cancelled again {cancelled} order(s)"),
        Duration::from_secs(30),
    );
    within(30, "every unit back", async || {
        let orders = orders_held(&env, 78).await;
        orders.len() == 4 && orders.iter().all(|o| o.2 == -1) && gate_stock(&env, 78).await == 10
    })
    .await;
    let s = assert_invariants(&env, 78).await;
    assert_eq!(
        (s.mysql_stock, s.redis_stock, s.released.len()),
        (10, Some(10), 4)
    );
    // The units come back while the gate is still paused for the loss; it
    // reopens at the guard's next pass (a buy before then is told paused).
    worker.wait_count(REOPENED, 1, Duration::from_secs(30));
    assert_eq!(env.buy_exit(78, "4"), Some(10), "user 4 is still a buyer");
    drop(worker);
    env.cleanup().await;
}

async fn gate_stock(env: &TestEnv, voucher: u64) -> i64 {
    let keys = VoucherKeys::new(&env.prefix, voucher).unwrap();
    let mut redis = env.redis().await;
    redis.get(keys.stock()).await.unwrap()
}

/// Polls `done` until it holds (the test fails after `seconds`).
async fn within(seconds: u64, what: &str, done: impl AsyncFn() -> bool) {
    let start = std::time::Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < Duration::from_secs(seconds),
            "not within {seconds}s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A restore while a sale runs: 2000 users try 20000 times for 150 units,
/// the dump taken after the first 20 orders and restored mid-sale.
/// Admissions pause while the lost orders are restored; nobody is admitted
/// past the true stock, and every buyer told "success" has an order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_during_a_sale_sells_no_unit_twice_and_loses_no_buyer() {
    let env = TestEnv::new().await;
    env.live_voucher(79, 150).await;
    let mut worker = env.spawn_worker(&fast_worker(&["--gate-check", "500ms"]));
    worker.expect_gate_pauses();
    env.admit_users(79, 20, 0).await;
    env.wait_orders(79, 20, Duration::from_secs(30)).await;
    let dump = env.dump_mysql();
    let sale = env.sale_in_background(79, 2_000, 20, 20_000, 2);
    env.wait_orders(79, 60, Duration::from_secs(30)).await;
    env.restore_mysql(&dump);
    assert!(
        !sale.is_finished(),
        "the sale ended before the restore: make it longer"
    );
    let report = sale.await.unwrap();
    worker.wait_count(REOPENED, 1, Duration::from_secs(30));
    let admitted = 20 + report.outcomes.success;
    assert_eq!(
        admitted, 150,
        "admitted {admitted} of 150 units: {:?}",
        report.outcomes
    );
    env.wait_orders(79, admitted, Duration::from_secs(60)).await;
    env.wait_drained(79, Duration::from_secs(60)).await;
    assert_eq!(
        env.order_count(79).await,
        admitted,
        "a buyer told success lost"
    );
    let s = assert_invariants(&env, 79).await;
    assert_eq!(s.buyers.len() as u64, admitted);
    assert!(
        worker.log_text().contains("orders_lost_by_mysql"),
        "nothing was lost: {}",
        worker.log_text()
    );
    drop(worker);
    env.cleanup().await;
}

/// MySQL went back before any worker ran (cron starts one later): its
/// first pass finds the gates' count of commits ahead of MySQL's, and
/// restores the lost orders before anything else touches the voucher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_after_the_restore_restores_before_it_reopens() {
    let env = TestEnv::new().await;
    env.live_voucher(80, 50).await;
    let drain = || {
        env.spawn_worker(&["--until-idle", "--block", "100ms"])
            .expect_success(Duration::from_secs(60))
    };
    env.admit_users(80, 10, 0).await;
    drain();
    let dump = env.dump_mysql();
    env.admit_users(80, 15, 10).await;
    drain();
    let before = env.orders(80).await;
    env.restore_mysql(&dump);
    let mut worker = env.spawn_worker(&fast_worker(&["--gate-check", "1s"]));
    worker.expect_gate_pauses();
    worker.wait_count(LOST, 1, Duration::from_secs(20));
    worker.wait_count(REOPENED, 1, Duration::from_secs(20));
    assert_eq!(
        env.orders(80).await,
        before,
        "the orders came back as they were"
    );
    assert_invariants(&env, 80).await;
    drop(worker);
    env.cleanup().await;
}

/// Every entry of the voucher trimmed (a worker's `--keep` past them), then
/// MySQL set back to `dump`: the commits it loses are named by nothing
/// kept.
async fn failover_past_keep(env: &TestEnv, keys: &VoucherKeys, dump: &common::mysql_dump::Dump) {
    let mut redis = env.redis().await;
    let _: u64 = redis::cmd("XTRIM")
        .arg(keys.orders())
        .arg("MAXLEN")
        .arg(0)
        .query_async(&mut redis)
        .await
        .unwrap();
    env.restore_mysql(dump);
}

/// Ten orders committed, MySQL dumped, five more committed, their entries
/// trimmed (a worker's `--keep` past), MySQL set back to the dump: five
/// commits lost that nothing kept names. The voucher's keys.
async fn five_lost_past_keep(env: &TestEnv, voucher: u64) -> VoucherKeys {
    env.admit_users(voucher, 10, 0).await;
    env.wait_orders(voucher, 10, Duration::from_secs(30)).await;
    let dump = env.dump_mysql();
    env.admit_users(voucher, 5, 10).await;
    env.wait_orders(voucher, 15, Duration::from_secs(30)).await;
    env.wait_drained(voucher, Duration::from_secs(30)).await;
    let keys = VoucherKeys::new(&env.prefix, voucher).unwrap();
    failover_past_keep(env, &keys, &dump).await;
    keys
}

/// Lost commits whose stream entries are gone too (trimmed past the
/// worker's --keep): reconcile cannot tell which buyers were theirs, so it
/// drops none and gives no unit back, and the gate stays paused until the
/// operator names their count with --drop-lost-commits; a wrong count
/// drops nothing. After, the guard does not pause it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commits_with_no_kept_entry_wait_for_the_operator_to_name_them() {
    let env = TestEnv::new().await;
    env.live_voucher(81, 50).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut worker = env.spawn_worker(&fast_worker(&[
        "--gate-check",
        "500ms",
        "--metrics-addr",
        &addr,
    ]));
    worker.expect_gate_pauses();
    let keys = five_lost_past_keep(&env, 81).await;
    let mut redis = env.redis().await;
    worker.wait_count(LOST, 1, Duration::from_secs(10));
    worker.wait_log("--drop-lost-commits 5", Duration::from_secs(20));

    let drift = |report: &Value| report["vouchers"][0]["drifts"].clone();
    let (code, report) = env.reconcile_json(&["--dry-run", "--voucher", "81"]);
    assert_eq!(code, 3, "{report:#}");
    assert_eq!(
        drift(&report)[0]["class"],
        "orders_lost_unrestorable",
        "{report:#}"
    );
    assert_eq!(drift(&report)[0]["amount"], 5, "{report:#}");
    let (code, report) =
        env.reconcile_json(&["--yes", "--voucher", "81", "--drop-lost-commits", "4"]);
    assert_eq!(
        (code, &report["vouchers"][0]["outcome"]),
        (3, &"not_repaired".into())
    );
    let buyers: u64 = redis.scard(keys.buyers()).await.unwrap();
    let stock: i64 = redis.get(keys.stock()).await.unwrap();
    assert_eq!(
        (buyers, stock),
        (15, 35),
        "a wrong count dropped buyers or gave units"
    );
    let paused: Option<String> = redis.hget(keys.meta(), "paused").await.unwrap();
    assert_eq!(paused.as_deref(), Some("1"));

    let (code, report) =
        env.reconcile_json(&["--yes", "--voucher", "81", "--drop-lost-commits", "5"]);
    assert_eq!(code, 4, "{report:#}");
    assert_eq!(report["vouchers"][0]["reopened"], true, "{report:#}");
    let buyers: u64 = redis.scard(keys.buyers()).await.unwrap();
    let stock: i64 = redis.get(keys.stock()).await.unwrap();
    assert_eq!((buyers, stock), (10, 40));
    // Three guard passes later the gate is still open: the gap was
    // forgotten with the buyers.
    let pauses = worker.count(LOST).expect("the worker's metrics");
    let passes = || async {
        gauge(
            &scrape_metrics(port).await,
            "seckill_gate_guard_passes_total",
        )
    };
    let now = passes().await.unwrap_or(0.0);
    assert_eq!(
        env.buy_exit(81, "11"),
        Some(0),
        "a dropped buyer buys again"
    );
    env.wait_orders(81, 11, Duration::from_secs(30)).await;
    within(20, "three more guard passes", async || {
        passes().await.is_some_and(|p| p >= now + 3.0)
    })
    .await;
    assert_eq!(worker.count(LOST), Some(pauses), "paused again");
    assert_invariants(&env, 81).await;
    drop(worker);
    env.cleanup().await;
}

/// Operators (or a retried job) dropping the same lost commits from runs
/// at once take the gap off the gate's witness of commits once, not once
/// per run: a witness left short would count fewer commits than MySQL
/// holds and hide that many orders of the next loss. Found by the fault
/// explorer (family `failover_past_keep`, seed 15: witness 33, MySQL 41
/// after three runs dropping 4). Each run is held after its read, before
/// it takes the gap off, until all three stand there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commits_dropped_from_runs_at_once_come_off_the_witness_once() {
    let env = TestEnv::new().await;
    env.live_voucher(83, 50).await;
    let mut worker = env.spawn_worker(&fast_worker(&["--gate-check", "500ms"]));
    worker.expect_gate_pauses();
    let keys = five_lost_past_keep(&env, 83).await;
    let mut redis = env.redis().await;
    worker.wait_log("--drop-lost-commits 5", Duration::from_secs(20));

    let dir = std::env::temp_dir().join(format!("seckill-forget-{}", env.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let runs: Vec<(std::process::Child, std::path::PathBuf)> = (0..3)
        .map(|i| {
            let err = dir.join(format!("run{i}.err"));
            let child = std::process::Command::new(assert_cmd::cargo::cargo_bin("seckill"))
                .envs(env.store_env())
                .env_remove("RUST_LOG")
                .env("SECKILL_TEST_FAULT", "before_forget=hold")
                .env("SECKILL_TEST_FAULT_DIR", &dir)
                .args(["reconcile", "--yes", "--voucher", "83"])
                .args(["--drop-lost-commits", "5", "--settle", "0s"])
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&err).unwrap())
                .spawn()
                .unwrap();
            (child, err)
        })
        .collect();
    common::within_seconds(30, "every run held after its read", || {
        runs.iter().all(|(_, err)| {
            std::fs::read_to_string(err).is_ok_and(|t| t.contains("fault hold at before_forget"))
        })
    });
    std::fs::write(dir.join("release"), b"").unwrap();
    // Each ends well: the one that took the gap off repaired (4), the
    // others, finding the witness moved, read again (4 or 0).
    for (mut child, err) in runs {
        let code = child.wait().unwrap().code();
        assert!(
            matches!(code, Some(0) | Some(4)),
            "a run exited {code:?}: {}",
            std::fs::read_to_string(&err).unwrap_or_default()
        );
    }
    let committed: i64 = redis.hget(keys.meta(), "committed").await.unwrap();
    assert_eq!(
        committed, 10,
        "the witness of commits after three runs dropped a gap of 5 (MySQL holds 10 orders)"
    );
    let paused: Option<String> = redis.hget(keys.meta(), "paused").await.unwrap();
    assert_ne!(paused.as_deref(), Some("1"), "the gate reopened");
    assert_invariants(&env, 83).await;
    std::fs::remove_dir_all(&dir).ok();
    drop(worker);
    env.cleanup().await;
}

/// A voucher in three buckets on the cluster's three masters: each
/// bucket's gate counts the commits of its own stream, the guard adds them
/// up against the voucher's orders, and each bucket's lost orders are
/// restored by that bucket's rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_of_a_voucher_in_buckets_brings_back_every_buckets_orders() {
    let env = TestEnv::on_cluster().await;
    let (_layout, _redis) = env.live_voucher_in_buckets(82, 90, 3).await;
    let mut worker = env.spawn_worker(&fast_worker(&["--gate-check", "1s"]));
    worker.expect_gate_pauses();
    env.admit_users(82, 15, 0).await;
    env.wait_orders(82, 15, Duration::from_secs(30)).await;
    let dump = env.dump_mysql();
    env.admit_users(82, 30, 15).await;
    env.wait_orders(82, 45, Duration::from_secs(30)).await;
    let before = env.orders(82).await;
    env.restore_mysql(&dump);
    worker.wait_count(LOST, 1, Duration::from_secs(10));
    within(30, "the orders back", async || {
        env.orders(82).await == before
    })
    .await;
    within(30, "every bucket open", async || {
        !voucher_status(&env, 82)["paused"].as_bool().unwrap_or(true)
    })
    .await;
    let (code, report) = env.reconcile_json(&["--dry-run"]);
    assert_eq!(code, 0, "{report:#}");
    assert_invariants(&env, 82).await;
    drop(worker);
    env.cleanup().await;
}

/// A preload after the loss rebuilds the gate from MySQL: the lost buyers
/// are no buyers there any more, and their units are back on sale. Their
/// entries are still kept: reconcile finds them by the gate's witness of
/// commits (ahead of MySQL), restores the orders, makes the users buyers
/// again and takes their units back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preload_after_the_loss_does_not_hide_the_lost_orders() {
    let env = TestEnv::new().await;
    env.live_voucher(83, 50).await;
    let drain = || {
        env.spawn_worker(&["--until-idle", "--block", "100ms"])
            .expect_success(Duration::from_secs(60))
    };
    env.admit_users(83, 10, 0).await;
    drain();
    let dump = env.dump_mysql();
    env.admit_users(83, 10, 10).await;
    drain();
    let before = env.orders(83).await;
    env.restore_mysql(&dump);
    env.preload(83).await;
    assert_eq!(
        gate_stock(&env, 83).await,
        40,
        "the preload gave the lost units back"
    );

    let (code, report) = env.reconcile_json(&["--yes"]);
    assert_eq!(code, 4, "{report:#}");
    assert_eq!(env.orders(83).await, before, "the orders came back");
    assert_eq!(gate_stock(&env, 83).await, 30, "{report:#}");
    let s = assert_invariants(&env, 83).await;
    assert_eq!(s.buyers.len(), 20);
    assert_eq!(
        env.buy_exit(83, "15"),
        Some(10),
        "a lost buyer bought again"
    );
    env.cleanup().await;
}

/// A preload after MySQL lost commits and before anything restored them
/// (the fault explorer's E6, seed 1 of the `mysql_failover` family: a
/// buyer told promoted, whose order MySQL lost, bought again after the
/// preload and held a second order; the first could not come back). The
/// image of MySQL alone has no lost buyer: published open, it let them
/// buy again. The gate's witness, read before MySQL, shows the loss: the
/// preload publishes the gate paused and says so, and the restore reopens
/// it with every lost buyer back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preload_before_the_restore_lets_no_lost_buyer_buy_again() {
    let env = TestEnv::new().await;
    env.live_voucher(86, 50).await;
    let drain = || {
        env.spawn_worker(&["--until-idle", "--block", "100ms"])
            .expect_success(Duration::from_secs(60))
    };
    env.admit_users(86, 10, 0).await;
    drain();
    let dump = env.dump_mysql();
    env.admit_users(86, 10, 10).await;
    drain();
    let before = env.orders(86).await;
    env.restore_mysql(&dump);
    let out = env
        .cmd()
        .args(["preload", "--voucher", "86", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        env.buy_exit(86, "15"),
        Some(15),
        "a lost buyer is answered paused, not sold a second order"
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report[0]["mysql_lost_commits"], 10, "{report:#}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("published paused until they are restored"),
        "{out:?}"
    );

    let (code, report) = env.reconcile_json(&["--yes"]);
    assert_eq!(code, 4, "{report:#}");
    assert_eq!(env.orders(86).await, before, "the orders came back");
    assert_eq!(gate_stock(&env, 86).await, 30, "{report:#}");
    assert_invariants(&env, 86).await;
    assert_eq!(
        env.buy_exit(86, "15"),
        Some(10),
        "a lost buyer is a buyer again"
    );
    assert_eq!(env.buy_exit(86, "21"), Some(0), "the gate reopened");
    env.cleanup().await;
}

/// A lost order whose deadline comes before any guard looks (here: its
/// guard looks once an hour): the worker's canceller finds it missing from
/// MySQL while the gate's witness says MySQL holds fewer orders than were
/// committed, so it keeps the deadline instead of dropping it. The restore
/// then knows it unpaid (cancelled, its unit given back by the next claim)
/// instead of holding it for the operator. Before, the deadline was
/// dropped and the order came back held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_of_an_order_mysql_lost_is_kept_for_the_restore() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(84, 10, 4_000).await;
    let mut worker = env.spawn_worker(&fast_worker(&["--gate-check", "1h"]));
    worker.expect_gate_pauses();
    env.admit_users(84, 3, 0).await;
    env.wait_orders(84, 3, Duration::from_secs(30)).await;
    let dump = env.dump_mysql();
    buy_users(&env, 84, 4..=4);
    env.wait_orders(84, 4, Duration::from_secs(30)).await;
    let lost = order_of(&orders_held(&env, 84).await, 4).0;
    env.restore_mysql(&dump);
    // The canceller came to its deadline: kept, or (before) dropped.
    within(
        30,
        "the canceller at the lost order's deadline",
        async || {
            let log = worker.log_text();
            log.contains("their deadlines are kept")
                || log.contains(&format!("order {lost} has a deadline"))
        },
    )
    .await;

    let (code, report) = env.reconcile_json(&["--yes"]);
    assert_eq!(code, 4, "{report:#}");
    let restored = order_of(&orders_held(&env, 84).await, 4);
    assert_eq!(restored, (lost, 4, -1, 0), "restored cancelled, not held");
    within(30, "every unit back", async || {
        let orders = orders_held(&env, 84).await;
        orders.len() == 4 && orders.iter().all(|o| o.2 == -1) && gate_stock(&env, 84).await == 10
    })
    .await;
    let (code, report) = env.reconcile_json(&["--dry-run"]);
    assert_eq!(code, 0, "{report:#}");
    assert_invariants(&env, 84).await;
    drop(worker);
    env.cleanup().await;
}

/// A preload after MySQL lost an order that had since been cancelled and
/// its unit given back (the fault explorer's E5, seed 1 of the
/// `mysql_failover` family: ten never-paid orders came back held). The
/// preload rebuilt the released set from MySQL, which no longer had the
/// order, and the release was the only mark Redis kept of it (the
/// deadline goes with the release): the restore then knew it neither
/// released nor due, took it for paid and held it for the operator, its
/// unit kept from the sale. Restored cancelled, with its unit at the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preload_after_the_loss_keeps_the_lost_orders_releases() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(85, 10, 1_500).await;
    let mut worker = env.spawn_worker(&fast_worker(&["--gate-check", "1h"]));
    env.admit_users(85, 3, 0).await;
    env.wait_orders(85, 3, Duration::from_secs(30)).await;
    let dump = env.dump_mysql();
    buy_users(&env, 85, 4..=4);
    env.wait_orders(85, 4, Duration::from_secs(30)).await;
    let lost = order_of(&orders_held(&env, 85).await, 4).0;
    let keys = VoucherKeys::new(&env.prefix, 85).unwrap();
    // Every order unpaid past its deadline is cancelled and released
    // before the worker stops (users 1..3's too: a cancellation the
    // restore undoes is made again only if the gate released it; none may
    // linger pending past its deadline, I6).
    within(30, "every order cancelled and released", async || {
        let mut redis = env.redis().await;
        let released: Vec<u64> = redis.smembers(keys.released()).await.unwrap();
        let orders = orders_held(&env, 85).await;
        orders.iter().all(|o| o.2 == -1 && released.contains(&o.0)) && released.contains(&lost)
    })
    .await;
    worker.signal("TERM");
    assert!(
        worker.wait_for(Duration::from_secs(30)).is_some(),
        "the worker stops"
    );
    env.restore_mysql(&dump);
    env.preload(85).await;

    let (code, report) = env.reconcile_json(&["--yes"]);
    assert_eq!(code, 4, "{report:#}");
    let restored = order_of(&orders_held(&env, 85).await, 4);
    assert_eq!(
        restored,
        (lost, 4, -1, 0),
        "restored cancelled, not held: {report:#}"
    );
    assert_eq!(gate_stock(&env, 85).await, 7, "{report:#}");
    let (code, report) = env.reconcile_json(&["--dry-run"]);
    assert_eq!(code, 0, "{report:#}");
    // The restore brought users 1..3's orders back pending, past their
    // deadlines (the preload scheduled them): a worker cancels them.
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    assert_invariants(&env, 85).await;
    env.cleanup().await;
}

/// A payment MySQL lost with its last commits, the order itself kept (the
/// fault explorer's E1, seed 19: a buyer told "paid" had the order
/// cancelled and its unit sold again). The payment dropped the order's
/// deadline and the gate kept the order in its paid set; after the
/// restore MySQL has it pending with no deadline, so the sweep schedules
/// it; the canceller, seeing it paid at the gate, pays it again instead
/// of cancelling it. An unpaid order beside it is cancelled as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_mysql_lost_is_made_again_not_cancelled() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(79, 10, 2_000).await;
    env.admit_users(79, 3, 0).await;
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    let dump = env.dump_mysql();
    let before = orders_held(&env, 79).await;
    let (paid_1, paid_2, unpaid) = (
        order_of(&before, 1).0,
        order_of(&before, 2).0,
        order_of(&before, 3).0,
    );
    pay(&env, paid_1);
    pay(&env, paid_2);
    env.restore_mysql(&dump);
    let restored = orders_held(&env, 79).await;
    assert!(restored.iter().all(|o| o.2 == 0), "{restored:?}");

    let worker = env.spawn_worker(&fast_worker(&[
        "--gate-check",
        "1s",
        "--sweep-every",
        "1s",
        "--sweep-grace",
        "1s",
    ]));
    within(60, "every order settled", async || {
        orders_held(&env, 79).await.iter().all(|o| o.2 != 0)
    })
    .await;
    let after = orders_held(&env, 79).await;
    assert_eq!(
        [paid_1, paid_2, unpaid].map(|o| after.iter().find(|r| r.0 == o).map(|r| r.2)),
        [Some(1), Some(1), Some(-1)],
        "the paid orders paid again, the unpaid one cancelled: {after:?}"
    );
    // Both payments made again, in one sweep's claim or in two (the two
    // orders pass their deadline a moment apart): counted, and said.
    worker.wait_count("payments_restored", 2, Duration::from_secs(30));
    assert_eq!(worker.count("payments_restored"), Some(2));
    worker.wait_log("MySQL lost the payment of", Duration::from_secs(30));
    worker.signal("TERM");
    worker.expect_success(Duration::from_secs(30));
    let s = assert_invariants(&env, 79).await;
    assert_eq!((s.mysql_stock, s.redis_stock), (8, Some(8)));
    env.cleanup().await;
}

/// The witness below 0 (two reconcilers each taking a forgotten gap off
/// it): the canceller reads it as 0 and cancels as before, where reading it
/// as a count failed every pass of the voucher's deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_witness_below_zero_does_not_stop_cancellations() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(80, 5, 1_000).await;
    env.admit_users(80, 2, 0).await;
    let keys = VoucherKeys::new(&env.prefix, 80).unwrap();
    let mut redis = env.redis().await;
    let worker = env.spawn_worker(&fast_worker(&["--gate-check", "0s"]));
    env.wait_orders(80, 2, Duration::from_secs(30)).await;
    let _: () = redis.hset(keys.meta(), "committed", -3).await.unwrap();
    within(30, "both unpaid orders cancelled", async || {
        orders_held(&env, 80).await.iter().all(|o| o.2 == -1)
    })
    .await;
    worker.signal("TERM");
    worker.expect_success(Duration::from_secs(30));
    assert_invariants(&env, 80).await;
    env.cleanup().await;
}

/// MySQL dumped, `users` buy (each their first order), MySQL set back to
/// the dump: the worker's guard finds the loss and restores their orders
/// as they were (the orders returned).
async fn lost_and_restored(
    env: &TestEnv,
    worker: &WorkerProc,
    v: u64,
    users: std::ops::RangeInclusive<u64>,
) -> Vec<(u64, u64, i8, i8)> {
    let dumped = env.order_count(v).await;
    let dump = env.dump_mysql();
    let after = dumped + users.clone().count() as u64;
    buy_users(env, v, users);
    env.wait_orders(v, after, Duration::from_secs(30)).await;
    env.wait_drained(v, Duration::from_secs(30)).await;
    let before = orders_held(env, v).await;
    env.restore_mysql(&dump);
    // The dump is back: the guard sees the loss (on a loaded machine it
    // may have restored orders already by this count, never more than
    // there were).
    let now = env.order_count(v).await;
    assert!(now <= after, "more orders than before the loss: {now}");
    worker.wait_count(LOST, 1, Duration::from_secs(20));
    within(30, "the lost orders restored", async || {
        orders_held(env, v).await == before
    })
    .await;
    before
}

/// Redis restarted from an older snapshot, then MySQL set back by fewer
/// commits than Redis had lost of its count (E12 of design/explorer.md's
/// "Defects found on main"): 10 orders at the snapshot, 20 more before the
/// restart, 5 more after the guard rebuilt the gate, and MySQL back to
/// before those 5. Before the fix, the gate's witness of commits went back
/// with Redis (to 10) and nothing set it up again, so at 15 against
/// MySQL's 30 the guard never saw the 5 lost; the canceller dropped their
/// deadlines and only `reconcile --yes` restored them, held. Now the
/// rebuild sets the witness up to MySQL's count, and the loss is found and
/// restored as any other: pending, not held, deadlines kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_loss_after_a_redis_rollback_is_found_and_restored() {
    const V: u64 = 86;
    let redis = OwnRedis::start();
    let mut env = TestEnv::on_redis(&redis.url()).await;
    env.live_voucher_paying_within(V, 100, 600_000).await;
    let mut worker = env.spawn_worker(&fast_worker(&["--gate-check", "500ms"]));
    worker.expect_gate_pauses();
    env.admit_users(V, 10, 0).await;
    env.wait_orders(V, 10, Duration::from_secs(30)).await;
    env.wait_drained(V, Duration::from_secs(30)).await;
    redis.snapshot();
    env.admit_users(V, 20, 10).await;
    env.wait_orders(V, 30, Duration::from_secs(30)).await;
    env.wait_drained(V, Duration::from_secs(30)).await;
    redis.crash_and_restart();
    env.forget_redis();
    worker.wait_count(REOPENED, 1, Duration::from_secs(30));

    let before = lost_and_restored(&env, &worker, V, 31..=35).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut conn = env.redis().await;
    for user in 31..=35 {
        let order = order_of(&before, user).0;
        let deadline: Option<f64> = conn.zscore(keys.timeouts(), order).await.unwrap();
        assert!(
            deadline.is_some(),
            "order {order} of user {user} lost its deadline"
        );
    }
    assert!(
        !worker
            .log_text()
            .contains("has a deadline but is not in MySQL"),
        "{}",
        worker.log_text()
    );
    // The deadlines Redis lost (users 11..30) are all that may be left to
    // repair: too young for the guard's rebuild to count them missing, or
    // repaired by it if the run took longer than its settle time.
    let (code, report) = env.reconcile_json(&["--yes"]);
    let drifts = report["vouchers"][0]["drifts"].as_array().cloned();
    assert!(
        drifts
            .iter()
            .flatten()
            .all(|d| d["class"] == "deadline_missing"
                && d["amount"].as_u64().is_some_and(|n| n <= 20)),
        "{report:#}"
    );
    assert!(matches!(code, 0 | 4), "{report:#}");
    let (code, report) = env.reconcile_json(&["--dry-run"]);
    assert_eq!(code, 0, "{report:#}");
    worker.signal("TERM");
    worker.expect_success(Duration::from_secs(30));
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

/// The witness short by a batch Redis had in hand when it went back: the
/// snapshot taken while a worker stood between its commit and its
/// acknowledgement, so after the restart those 10 entries are pending
/// again with the witness at 0. The rebuild leaves them out (their
/// acknowledgement might count them), and the worker that reclaims them
/// (held until the gate reopened) finds their orders stored and counts
/// nothing. The guard's next passes set the witness up to MySQL's 10, so
/// MySQL's later loss of 3 (fewer than the shortfall) is found and
/// restored. Before, the witness stayed at 3 against MySQL's 10 and the
/// loss went unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_in_hand_at_the_snapshot_leaves_no_witness_short() {
    const V: u64 = 87;
    let redis = OwnRedis::start();
    let mut env = TestEnv::on_redis(&redis.url()).await;
    env.live_voucher_paying_within(V, 100, 600_000).await;
    // Admitted before the worker starts: one batch of all 10.
    env.admit_users(V, 10, 0).await;
    let dir = std::env::temp_dir().join(format!("seckill-in-hand-{}", env.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_text = dir.to_string_lossy().to_string();
    // The batch stands between its commit and its acknowledgement until
    // the snapshot is taken; the reclaimed one (the second to take its
    // locks) until the gate is rebuilt.
    let mut worker = env.spawn_worker_with(
        &fast_worker(&["--gate-check", "500ms"]),
        &[
            (
                "SECKILL_TEST_FAULT",
                "after_commit@1=hold,after_lock@2=hold",
            ),
            ("SECKILL_TEST_FAULT_DIR", dir_text.as_str()),
        ],
    );
    worker.expect_gate_pauses();
    let release = dir.join("release");
    worker.wait_log("fault hold at after_commit", Duration::from_secs(30));
    redis.snapshot();
    std::fs::write(&release, b"").unwrap();
    worker.wait_log("fault released at after_commit", Duration::from_secs(30));
    std::fs::remove_file(&release).unwrap();
    env.wait_drained(V, Duration::from_secs(30)).await;
    redis.crash_and_restart();
    env.forget_redis();
    worker.wait_log("fault hold at after_lock", Duration::from_secs(30));
    worker.wait_count(REOPENED, 1, Duration::from_secs(30));
    std::fs::write(&release, b"").unwrap();
    env.wait_drained(V, Duration::from_secs(30)).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    within(30, "the witness back at MySQL's 10 orders", async || {
        let mut conn = env.redis().await;
        let committed: Option<u64> = conn.hget(keys.meta(), "committed").await.unwrap();
        committed == Some(10)
    })
    .await;

    lost_and_restored(&env, &worker, V, 11..=13).await;
    stopped_and_checked(env, worker, V, &dir).await;
}

/// The raise never counts an order twice: while a committed batch stands
/// before its acknowledgement (which will count its 10 orders), the
/// guard's passes see the witness at 0 below MySQL's 10 and raise it to
/// no more than MySQL holds less the 10 entries pending. Once the batch
/// is acknowledged the witness is exactly 10, and nothing is paused for a
/// loss that did not happen (a raise to 10 would have made it 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_between_commit_and_ack_is_not_counted_twice() {
    const V: u64 = 88;
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 100, 600_000).await;
    env.admit_users(V, 10, 0).await;
    let (worker, dir, port) =
        worker_held_at(&env, &["--gate-check", "100ms"], "after_commit@1=hold");
    worker.wait_log("fault hold at after_commit", Duration::from_secs(30));
    assert_eq!(env.order_count(V).await, 10, "the batch is committed");
    three_guard_passes(port, "over the batch in hand").await;
    std::fs::write(dir.join("release"), b"").unwrap();
    env.wait_drained(V, Duration::from_secs(30)).await;
    three_guard_passes(port, "after the acknowledgement").await;
    witness_at_with_no_loss(&env, &worker, V, 10).await;
    stopped_and_checked(env, worker, V, &dir).await;
}

/// A raise from a count of MySQL read before the operator dropped lost
/// commits does not put the dropped gap back: the guard reads the witness
/// short (12 of MySQL's 15) and stands before its raise; meanwhile MySQL
/// goes back to 10 orders with the entries of the other 5 trimmed, and
/// the operator drops them (the witness taken down to 10). The raise then
/// finds a gap taken off since its read and writes nothing; without that
/// check it set the witness to 15 and the next pass paused the gate for a
/// loss already dealt with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_read_before_a_drop_does_not_put_the_gap_back() {
    const V: u64 = 89;
    let env = TestEnv::new().await;
    env.live_voucher(V, 50).await;
    env.admit_users(V, 10, 0).await;
    env.spawn_worker(&["--until-idle", "--block", "100ms"])
        .expect_success(Duration::from_secs(60));
    let dump = env.dump_mysql();
    env.admit_users(V, 5, 10).await;
    env.spawn_worker(&["--until-idle", "--block", "100ms"])
        .expect_success(Duration::from_secs(60));
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    // Short, as a Redis rollback leaves it.
    let _: () = redis.hset(keys.meta(), "committed", 12).await.unwrap();

    let (worker, dir, port) =
        worker_held_at(&env, &["--gate-check", "300ms"], "before_raise@1=hold");
    worker.wait_log("fault hold at before_raise", Duration::from_secs(30));
    failover_past_keep(&env, &keys, &dump).await;
    let (code, report) = env.reconcile_json(&["--dry-run", "--voucher", "89"]);
    assert_eq!(code, 3, "{report:#}");
    let amount = report["vouchers"][0]["drifts"][0]["amount"].to_string();
    let (code, report) =
        env.reconcile_json(&["--yes", "--voucher", "89", "--drop-lost-commits", &amount]);
    assert_eq!(code, 4, "{report:#}");
    let committed: Option<i64> = redis.hget(keys.meta(), "committed").await.unwrap();
    assert_eq!(committed, Some(10), "the drop took the gap off");

    std::fs::write(dir.join("release"), b"").unwrap();
    worker.wait_log("fault released at before_raise", Duration::from_secs(30));
    three_guard_passes(port, "after the raise").await;
    witness_at_with_no_loss(&env, &worker, V, 10).await;
    stopped_and_checked(env, worker, V, &dir).await;
}

/// An order a retry finds stored counts into the witness (the checked
/// model's finding M3, docs/src/concepts/checked-model.md): a worker
/// commits user 1's order and is killed (kill -9) before acknowledging
/// it; MySQL was dumped before that commit. Once the dead worker's lock
/// lapsed, a second worker reclaims the entry, finds the order stored,
/// and stands before its acknowledgement while MySQL goes back to the
/// dump (the order lost with its entry in flight); then it acknowledges.
/// Before, that acknowledgement counted nothing: the witness stayed at
/// MySQL's 0 orders, no pass of the guard (nor its raise, which counts
/// what MySQL holds) saw the loss, and the buyer's "success" had no
/// order. Now it counts, and the guard pauses the gate and restores the
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_a_retry_found_stored_is_counted_so_its_loss_is_restored() {
    const V: u64 = 90;
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 10, 600_000).await;
    let dump = env.dump_mysql();
    env.admit_users(V, 1, 0).await;
    let (first, _, _) = worker_held_at(&env, &["--gate-check", "1h"], "after_commit@1=hold");
    first.wait_log("fault hold at after_commit", Duration::from_secs(30));
    assert_eq!(env.order_count(V).await, 1, "the order is committed");
    first.kill9();
    // Its lock lapses first, so the next worker's first batch is the
    // retry (not one that could lock nobody).
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    within(30, "the dead worker's lock lapsed", async || {
        let mut redis = env.redis().await;
        let now = common::redis_now_ms(&mut redis).await.unwrap();
        let locks: std::collections::HashMap<String, String> =
            redis.hgetall(keys.locks()).await.unwrap();
        locks
            .values()
            .all(|v| common::lease_expiry(v).is_some_and(|t| t <= now))
    })
    .await;

    let (mut worker, dir, _) =
        worker_held_at(&env, &["--gate-check", "200ms"], "after_commit@1=hold");
    worker.expect_gate_pauses();
    worker.wait_log("fault hold at after_commit", Duration::from_secs(30));
    env.restore_mysql(&dump);
    assert_eq!(env.order_count(V).await, 0, "MySQL lost the order");
    std::fs::write(dir.join("release"), b"").unwrap();
    worker.wait_log("fault released at after_commit", Duration::from_secs(30));
    worker.wait_count(LOST, 1, Duration::from_secs(30));
    within(30, "the lost order restored", async || {
        orders_held(&env, V).await.iter().any(|o| o.1 == 1)
    })
    .await;
    worker.wait_count(REOPENED, 1, Duration::from_secs(30));
    stopped_and_checked(env, worker, V, &dir).await;
}

/// The checked model's finding M4: MySQL lost the cancellation of user 1's
/// order, whose unit the gate had given back; user 2 is admitted on that
/// unit, told "success", and a worker persists the order before the gate
/// guard has cancelled user 1's again, so MySQL has no unit for it. Before:
/// dead-lettered (`no stock in MySQL`), a success with no order. Now: kept
/// pending while MySQL has fewer cancellations than the gate released;
/// once the guard has cancelled user 1's order again, a retry inserts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_on_a_unit_whose_cancellation_mysql_lost_gets_the_order_once_it_is_cancelled_again()
{
    const V: u64 = 93;
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 1, 1_000).await;
    // No guard: the cancellation's loss goes unmended until the next worker.
    let first = env.spawn_worker(&fast_worker(&["--gate-check", "0s"]));
    buy_users(&env, V, 1..=1);
    env.wait_orders(V, 1, Duration::from_secs(30)).await;
    let dump = env.dump_mysql();
    within(30, "user 1's order cancelled, its unit back", async || {
        let orders = orders_held(&env, V).await;
        orders.iter().all(|o| o.2 == -1) && gate_stock(&env, V).await == 1
    })
    .await;
    drop(first);
    env.restore_mysql(&dump);
    buy_users(&env, V, 2..=2);
    // The guard stands at its pause, before it mends MySQL, while user 2's
    // order is persisted.
    let (mut worker, dir, _) = worker_held_at(
        &env,
        &["--gate-check", "200ms", "--max-deliveries", "1000"],
        "gate_paused@1=hold",
    );
    worker.expect_gate_pauses();
    worker.wait_log("fault hold at gate_paused", Duration::from_secs(30));
    within(30, "user 2's entry persisted once", async || {
        let log = worker.log_text();
        log.contains("dead-lettered") || log.contains(KEPT)
    })
    .await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let dead: u64 = redis.xlen(keys.dead()).await.unwrap();
    assert_eq!(
        dead,
        0,
        "a buyer told success was dead-lettered:\n{}",
        worker.log_text()
    );
    std::fs::write(dir.join("release"), b"").unwrap();
    worker.wait_log("cancelled again 1 order(s)", Duration::from_secs(30));
    within(60, "user 2's order in MySQL", async || {
        orders_held(&env, V).await.iter().any(|o| o.1 == 2)
    })
    .await;
    // User 2's payment deadline (from its admission) may have passed by
    // the retry: its order is then cancelled for want of payment.
    let orders = orders_held(&env, V).await;
    assert_eq!(order_of(&orders, 1).2, -1, "{orders:?}");
    let dead: u64 = redis.xlen(keys.dead()).await.unwrap();
    assert_eq!(dead, 0, "{}", worker.log_text());
    worker.wait_count(REOPENED, 1, Duration::from_secs(30));
    env.wait_drained(V, Duration::from_secs(30)).await;
    stopped_and_checked(env, worker, V, &dir).await;
}

/// The checked model's finding M5: MySQL lost a payment while its payer
/// stood between MySQL and the gate; the order, pending again, passes its
/// deadline, and a worker cancels it in MySQL and dies before giving the
/// unit back; the payer then records the payment at the gate, which drops
/// the order's deadline (claimed by the dead worker). Before: nothing gave
/// the unit back (MySQL's stock had it, the gate never again) until an
/// operator ran `seckill reconcile`. Now the sweep sees MySQL with more
/// cancellations than the gate released on two sweeps, schedules the
/// unreleased one's deadline again, and the canceller gives its unit back
/// (the gate saw it paid, but MySQL has it cancelled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancellation_whose_deadline_a_lost_payment_dropped_still_gives_its_unit_back() {
    const V: u64 = 94;
    let env = TestEnv::new().await;
    // Long enough for the dump and the payment to come before the deadline.
    env.live_voucher_paying_within(V, 1, 10_000).await;
    let mut first = env.spawn_worker_with(
        &fast_worker(&["--gate-check", "0s"]),
        &[("SECKILL_TEST_FAULT", "after_cancel@1=abort")],
    );
    buy_users(&env, V, 1..=1);
    env.wait_orders(V, 1, Duration::from_secs(30)).await;
    let dump = env.dump_mysql();
    let order = order_of(&orders_held(&env, V).await, 1).0.to_string();
    let dir = std::env::temp_dir().join(format!("seckill-payer-{}", env.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let payer_log = dir.join("payer.log");
    let mut payer = std::process::Command::new(assert_cmd::cargo::cargo_bin("seckill"))
        .args(["pay", "--order", &order])
        .envs(env.store_env())
        .env("SECKILL_TEST_FAULT", "after_pay@1=hold")
        .env("SECKILL_TEST_FAULT_DIR", &dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&payer_log).unwrap())
        .spawn()
        .unwrap();
    within(
        30,
        "the payment made in MySQL, not yet at the gate",
        async || {
            std::fs::read_to_string(&payer_log).is_ok_and(|l| l.contains("fault hold at after_pay"))
        },
    )
    .await;
    // MySQL loses the payment: the order is pending again, its deadline
    // passes, the worker cancels it and dies before the release.
    env.restore_mysql(&dump);
    assert!(
        first.wait_for(Duration::from_secs(30)).is_some(),
        "the worker did not die after the cancellation:\n{}",
        first.log_text()
    );
    assert!(first.log_text().contains("fault abort at after_cancel"));
    std::fs::write(dir.join("release"), b"").unwrap();
    assert!(
        payer.wait().unwrap().success(),
        "{:?}",
        std::fs::read_to_string(&payer_log)
    );
    let orders = orders_held(&env, V).await;
    assert_eq!(order_of(&orders, 1).2, -1, "{orders:?}");
    assert_eq!(gate_stock(&env, V).await, 0);
    // The payer's step took the deadline (claimed by the dead worker) and
    // recorded the payment: nothing names the order for a release.
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let deadline: Option<f64> = redis.zscore(keys.timeouts(), &order).await.unwrap();
    let paid: bool = redis.sismember(keys.paid(), &order).await.unwrap();
    let released: bool = redis.sismember(keys.released(), &order).await.unwrap();
    assert_eq!((deadline, paid, released), (None, true, false));

    let worker = env.spawn_worker(&fast_worker(&[
        "--gate-check",
        "1s",
        "--sweep-every",
        "200ms",
        "--sweep-grace",
        "0s",
    ]));
    within(
        30,
        "the cancelled order's unit back at the gate",
        async || gate_stock(&env, V).await == 1,
    )
    .await;
    env.wait_drained(V, Duration::from_secs(30)).await;
    std::fs::remove_dir_all(&dir).ok();
    stopped_and_checked(env, worker, V, &dir).await;
}

/// What a worker logs of an order it keeps for a retry because MySQL lacks
/// cancellations the gates released.
const KEPT: &str = "kept pending for a retry";

/// A worker with `args` (its guard every `--gate-check`), its passes
/// counted on its metrics page (the port returned), held at `fault`
/// (`SECKILL_TEST_FAULT`) until a file `release` appears in the folder
/// returned.
fn worker_held_at(env: &TestEnv, args: &[&str], fault: &str) -> (WorkerProc, PathBuf, u16) {
    let dir = std::env::temp_dir().join(format!("seckill-held-{}", env.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_text = dir.to_string_lossy().to_string();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = args.to_vec();
    args.extend(["--metrics-addr", &addr]);
    let worker = env.spawn_worker_with(
        &fast_worker(&args),
        &[
            ("SECKILL_TEST_FAULT", fault),
            ("SECKILL_TEST_FAULT_DIR", dir_text.as_str()),
        ],
    );
    (worker, dir, port)
}

/// Waits for three more passes of the gate guard of the worker whose
/// metrics page is on `port`.
async fn three_guard_passes(port: u16, what: &str) {
    let passes = async || {
        let page = scrape_metrics(port).await;
        gauge(&page, "seckill_gate_guard_passes_total").unwrap_or(0.0)
    };
    let from = passes().await;
    within(30, &format!("three guard passes {what}"), async || {
        passes().await >= from + 3.0
    })
    .await;
}

/// The gate's witness of commits is `n`, and the worker never saw MySQL
/// lose commits.
async fn witness_at_with_no_loss(env: &TestEnv, worker: &WorkerProc, v: u64, n: i64) {
    let keys = VoucherKeys::new(&env.prefix, v).unwrap();
    let mut redis = env.redis().await;
    let committed: Option<i64> = redis.hget(keys.meta(), "committed").await.unwrap();
    assert_eq!(committed, Some(n), "the witness of MySQL's {n} orders");
    assert_eq!(worker.count(LOST), Some(0), "{}", worker.log_text());
}

/// Stops the worker (it must end well), checks the invariants and cleans
/// up the test's fault folder and keys.
async fn stopped_and_checked(env: TestEnv, worker: WorkerProc, v: u64, dir: &std::path::Path) {
    worker.signal("TERM");
    worker.expect_success(Duration::from_secs(30));
    assert_invariants(&env, v).await;
    std::fs::remove_dir_all(dir).ok();
    env.cleanup().await;
}
