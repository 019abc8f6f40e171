//! Layers 2–4 with real `seckill worker` processes against real Redis and
//! MariaDB: concurrent workers, kill -9, duplicates, poison, SIGTERM, paused
//! lock holders. Invariants I1–I5 are checked after every scenario.

mod common;

use std::time::Duration;

use common::invariants::assert_invariants;
use common::{json, TestEnv};
use redis::AsyncCommands;
use seckill::store::keys::{VoucherKeys, WORKER_GROUP};
use seckill::store::registry;
use seckill::worker::lock::LockOwner;

const V: u64 = 1;
use common::fast_worker as args;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_drain_a_sale_of_ten_thousand_exactly_once() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10_000).await;
    let workers: Vec<_> = (0..3)
        .map(|_| env.spawn_worker(&args(&["--batch", "256"])))
        .collect();
    let report = env.admit_users(V, 10_000, 0).await;
    assert_eq!(report.outcomes.success, 10_000);
    env.wait_drained(V, Duration::from_secs(120)).await;
    for w in &workers {
        w.signal("TERM");
    }
    for w in workers {
        w.expect_success(Duration::from_secs(20));
    }
    assert_eq!(env.order_count(V).await, 10_000);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    assert_eq!(s.redis_stock, Some(0));
    // Every order got its payment deadline, once.
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let deadlines: u64 = redis.zcard(keys.timeouts()).await.unwrap();
    assert_eq!(deadlines, 10_000);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_voucher_preloaded_while_the_worker_runs_is_picked_up() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    let w = env.spawn_worker(&args(&[]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.live_voucher(2, 50).await;
    env.admit_users(2, 50, 0).await;
    env.wait_orders(2, 50, Duration::from_secs(30)).await;
    w.signal("TERM");
    w.expect_success(Duration::from_secs(20));
    assert_invariants(&env, 2).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_mysql_has_no_stock_for_are_dead_lettered_not_acked_away() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    // The gate believes in 15 units (a wrong preload); MySQL has 10.
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let _: () = redis.set(keys.stock(), 15).await.unwrap();
    assert_eq!(env.admit_users(V, 15, 0).await.outcomes.success, 15);
    env.spawn_worker(&args(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    assert_eq!(env.order_count(V).await, 10);
    assert_eq!(env.in_flight(V).await, 0);
    let dead: redis::streams::StreamRangeReply = redis.xrange_all(keys.dead()).await.unwrap();
    assert_eq!(dead.ids.len(), 5, "every unit MySQL refused is on record");
    for e in &dead.ids {
        assert_eq!(
            e.get::<String>("reason").as_deref(),
            Some("no stock in MySQL")
        );
        assert_eq!(
            e.get::<u64>("deliveries"),
            Some(1),
            "refused at once, not retried"
        );
    }
    // MySQL itself stays whole (I1, I3, I4); the gate's 5 extra buyers are
    // reconciliation's to repair, and the dead letters say which.
    let s = common::invariants::read_state(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    assert_eq!(s.orders.len(), 10);
    assert_eq!(s.buyers.len(), 15);
    assert_eq!(
        s.counters, s.counted,
        "the orders counted as the batch took them"
    );
    env.cleanup().await;
}

/// A tiny deterministic generator, so a failing run can be replayed.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_kill_nines_lose_nothing_and_double_nothing() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10_000).await;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill schedule seed {seed}");
    let mut rng = Lcg(seed);
    // Orders keep arriving while the worker dies and comes back.
    let sale = env.sale_in_background(V, 10_000, 0, 10_000, 4);
    let mut kills = 0;
    while kills < 20 {
        let w = env.spawn_worker(&args(&["--batch", "128"]));
        tokio::time::sleep(Duration::from_millis(150 + rng.next(350))).await;
        w.kill9();
        kills += 1;
    }
    let report = sale.await.unwrap();
    assert_eq!(report.outcomes.success, 10_000);
    let log = env
        .spawn_worker(&args(&["--until-idle"]))
        .expect_success(Duration::from_secs(120));
    // Said once for the process, not once per lane.
    assert_eq!(log.matches("no work left").count(), 1, "{log}");
    assert_eq!(env.in_flight(V).await, 0, "pending after the final drain");
    assert_eq!(
        env.order_count(V).await,
        10_000,
        "orders lost or doubled after {kills} kills"
    );
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}

/// Waits until the worker's log shows it paused at `step`.
async fn wait_for_pause(w: &common::process::WorkerProc, step: &str) {
    wait_for_log(w, &format!("test pause at {step}")).await;
}

async fn wait_for_log(w: &common::process::WorkerProc, line: &str) {
    w.wait_log(line, Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_nine_at_every_step_of_a_batch_loses_and_doubles_nothing() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 1_000).await;
    env.admit_users(V, 600, 0).await;
    // Each step of the batch sequence, with a crash right there.
    for step in ["after_lock", "before_commit", "after_commit", "after_ack"] {
        let pause = format!("{step}=20s");
        let w = env.spawn_worker_with(
            &args(&["--batch", "50"]),
            &[(seckill::support::fault::ENV, pause.as_str())],
        );
        wait_for_pause(&w, step).await;
        w.kill9();
        assert_invariants(&env, V).await;
    }
    env.spawn_worker(&args(&["--until-idle"]))
        .expect_success(Duration::from_secs(120));
    assert_eq!(env.order_count(V).await, 600);
    assert_eq!(env.in_flight(V).await, 0);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 400);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivered_or_repeated_order_is_stored_once() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 50).await;
    env.admit_users(V, 40, 0).await;
    env.spawn_worker(&args(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    assert_eq!(env.order_count(V).await, 40);

    // The same messages again, as a crash between commit and ack would
    // redeliver them: already stored, so no order and no unit is taken twice.
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let all: redis::streams::StreamRangeReply = redis.xrange_all(keys.orders()).await.unwrap();
    assert_eq!(all.ids.len(), 40);
    for e in &all.ids {
        for _ in 0..2 {
            let fields: Vec<(String, String)> = ["user", "order", "voucher", "kind"]
                .iter()
                .map(|f| (f.to_string(), e.get::<String>(f).unwrap()))
                .collect();
            let _: String = redis.xadd(keys.orders(), "*", &fields).await.unwrap();
        }
    }
    // A consumer that read the first 60 copies and died: they come to the
    // workers as redeliveries, the other 20 as first deliveries.
    env.read_as(V, "ghost", 60).await;
    // Two consumers race for the copies: both reclaim and read at once.
    // A copy finds its order stored as another entry inserted it, and is
    // acknowledged without counting into the gate's witness of commits
    // (whatever its deliveries), so no gate is paused for a loss of
    // MySQL's that did not happen.
    let a = env.spawn_worker(&args(&["--until-idle", "--batch", "16", "--consumer", "a"]));
    let b = env.spawn_worker(&args(&["--until-idle", "--batch", "16", "--consumer", "b"]));
    a.expect_success(Duration::from_secs(60));
    b.expect_success(Duration::from_secs(60));
    assert_eq!(env.order_count(V).await, 40);
    let dead: u64 = redis.xlen(keys.dead()).await.unwrap();
    assert_eq!(dead, 0, "a redelivery is not a dead letter");
    // Counted once each, by their own entries (had a copy counted, a gate
    // guard's pass would have paused the gate, or the witness says more).
    let committed: u64 = redis.hget(keys.meta(), "committed").await.unwrap();
    assert_eq!(committed, 40, "the gate's witness of MySQL's commits");
    // Each deadline is its order's own (the first entry's time plus the
    // payment time), not moved later by a copy's time.
    let deadlines: Vec<(u64, i64)> = redis
        .zrange_withscores(keys.timeouts(), 0, -1)
        .await
        .unwrap();
    assert_eq!(deadlines.len(), 40);
    for e in &all.ids {
        let order: u64 = e.get::<String>("order").unwrap().parse().unwrap();
        let created: i64 = e.id.split('-').next().unwrap().parse().unwrap();
        let own = (
            order,
            created + seckill::orders::voucher::DEFAULT_PAY_TIMEOUT_MS,
        );
        assert!(deadlines.contains(&own), "{own:?} not in {deadlines:?}");
    }
    // assert_invariants counts in-flight entries; the copies are all acked.
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 10);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_pending_entries_claimed_by_two_consumers_make_one_order_each() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 300).await;
    env.admit_users(V, 300, 0).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    // A consumer that read everything and died.
    seckill::worker::group::ensure_group(&mut redis, &keys)
        .await
        .unwrap();
    env.read_as(V, "ghost", 1000).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Two workers whose reclaim threshold is already passed: both go for them.
    let fast = [
        "--claim-idle",
        "20ms",
        "--block",
        "100ms",
        "--batch",
        "32",
        "--until-idle",
        "--format",
        "json",
    ];
    let a = env.spawn_worker(&fast);
    let b = env.spawn_worker(&fast);
    let (a, _) = a.expect_summary(Duration::from_secs(60));
    let (b, _) = b.expect_summary(Duration::from_secs(60));
    // Both took entries over from the dead consumer, and between them they
    // stored each order once.
    for s in [&a, &b] {
        assert!(
            s["reclaimed"].as_u64().unwrap() > 0,
            "consumer {} claimed nothing: {a} / {b}",
            s["consumer"]
        );
    }
    assert_eq!(
        a["persisted"].as_u64().unwrap() + b["persisted"].as_u64().unwrap(),
        300,
        "{a} / {b}"
    );
    assert_eq!(env.order_count(V).await, 300);
    assert_eq!(env.in_flight(V).await, 0);
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_messages_are_dead_lettered_with_the_reason_and_the_worker_goes_on() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    env.admit_users(V, 5, 0).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let poison: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![("order", "91"), ("voucher", "1")],
            "missing field 'user'",
        ),
        (
            vec![("user", "abc"), ("order", "92"), ("voucher", "1")],
            "field 'user' is not an id",
        ),
        (
            vec![("user", "7"), ("order", "-3"), ("voucher", "1")],
            "field 'order' is not an id",
        ),
        (
            vec![("user", "8"), ("order", "94"), ("voucher", "2")],
            "voucher 2 in the stream of voucher 1",
        ),
    ];
    for (fields, _) in &poison {
        let _: String = redis.xadd(keys.orders(), "*", fields).await.unwrap();
    }
    // A voucher that Redis knows and MySQL does not.
    let ghost = VoucherKeys::new(&env.prefix, 999).unwrap();
    let _: () = redis
        .sadd(registry::key(&env.prefix).unwrap(), 999)
        .await
        .unwrap();
    let _: String = redis
        .xadd(
            ghost.orders(),
            "*",
            &[
                ("user", "5"),
                ("order", "95"),
                ("voucher", "999"),
                ("kind", "admit"),
            ],
        )
        .await
        .unwrap();
    env.admit_users(V, 5, 100).await;

    let log = env
        .spawn_worker(&[
            "--claim-idle",
            "100ms",
            "--block",
            "100ms",
            "--max-deliveries",
            "2",
            "--until-idle",
        ])
        .expect_success(Duration::from_secs(60));
    assert!(log.contains("dead-lettered"), "{log}");
    assert_eq!(
        env.order_count(V).await,
        10,
        "the good orders around the poison are stored"
    );

    let dead: redis::streams::StreamRangeReply = redis.xrange_all(keys.dead()).await.unwrap();
    assert_eq!(dead.ids.len(), poison.len());
    for (entry, (_, reason)) in dead.ids.iter().zip(&poison) {
        let got: String = entry.get("reason").unwrap();
        assert!(got.contains(reason), "{got:?} lacks {reason:?}");
        let deliveries: u64 = entry.get("deliveries").unwrap();
        assert!(
            deliveries > 2,
            "dead-lettered after {deliveries} deliveries"
        );
    }
    let ghost_dead: redis::streams::StreamRangeReply =
        redis.xrange_all(ghost.dead()).await.unwrap();
    assert_eq!(ghost_dead.ids.len(), 1);
    assert_eq!(
        ghost_dead.ids[0].get::<String>("reason").as_deref(),
        Some("voucher 999 is not in MySQL")
    );
    assert_eq!(env.in_flight(V).await, 0);
    assert_eq!(env.in_flight(999).await, 0);

    // `seckill pending` shows them; requeue refuses without a terminal or --yes.
    let out = env
        .cmd()
        .args(["pending", "--voucher", "999", "--format", "json"])
        .output()
        .unwrap();
    let j = json(&out);
    assert_eq!(j["dead_letters"], 1);
    assert_eq!(j["dead"][0]["reason"], "voucher 999 is not in MySQL");
    assert_eq!(j["dead"][0]["user"], "5");
    let refused = env
        .cmd()
        .args(["pending", "--voucher", "999", "--requeue"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("pass --yes"));

    // Once the cause is fixed (the voucher in MySQL and open at the gate),
    // a requeue gets the order stored: its message never held a unit at the
    // gate, so requeueing takes one there (re-admits it).
    env.add_voucher(999, 3, -1_000, 3_600_000).await;
    env.preload(999).await;
    let requeued = env.requeue(999);
    let j = json(&requeued);
    assert_eq!(j["requeued"], 1, "{j}");
    assert_eq!(j["entries"][0]["outcome"], "readmitted", "{j}");
    env.spawn_worker(&args(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    assert_eq!(env.order_count(999).await, 1);
    assert_invariants(&env, 999).await;
    // The poison of voucher 1 was no order: it cannot be requeued.
    let r = env.requeue(1);
    let j = json(&r);
    assert_eq!(j["requeued"], 0);
    assert_eq!(j["skipped"], poison.len() as u64);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_during_a_busy_drain_exits_zero_and_leaves_nothing_pending() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 20_000).await;
    env.admit_users(V, 20_000, 0).await;
    let w = env.spawn_worker(&args(&["--batch", "64", "--consumer", "busy"]));
    // Let it get going, then ask it to stop mid-drain.
    env.wait_orders(V, 500, Duration::from_secs(60)).await;
    w.signal("TERM");
    let log = w.expect_success(Duration::from_secs(15));
    assert!(log.contains("SIGTERM"), "{log}");
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let mine: redis::streams::StreamPendingCountReply = redis
        .xpending_consumer_count(keys.orders(), WORKER_GROUP, "-", "+", 10, "busy")
        .await
        .unwrap();
    assert!(
        mine.ids.is_empty(),
        "left pending by the stopped worker: {:?}",
        mine.ids.len()
    );
    let stored = env.order_count(V).await;
    assert!(
        stored < 20_000,
        "the drain was not interrupted ({stored} stored)"
    );
    assert_invariants(&env, V).await;
    // Whatever it did not read, the next worker does.
    env.spawn_worker(&args(&["--until-idle"]))
        .expect_success(Duration::from_secs(120));
    assert_eq!(env.order_count(V).await, 20_000);
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_entry_whose_lock_is_held_elsewhere_stays_pending_until_it_can_be_persisted() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    env.admit_users(V, 10, 0).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    // Another owner holds user 5's lock (for longer than this test runs).
    let someone_else = LockOwner {
        token: "someone-else".into(),
        lease: Duration::from_secs(120),
    };
    let taken = someone_else.acquire(&mut redis, &keys, &[5]).await.unwrap();
    assert_eq!(taken, vec![true]);
    let w = env.spawn_worker(&["--claim-idle", "200ms", "--block", "100ms"]);
    env.wait_orders(V, 9, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Not persisted, not acked: still pending, and redelivered (not lost).
    assert_eq!(env.order_count(V).await, 9);
    assert_eq!(
        env.in_flight(V).await,
        1,
        "the locked user's entry was acked without an order"
    );
    assert_invariants(&env, V).await;
    // The other owner lets go: the entry comes back and is persisted.
    let released = someone_else.release(&mut redis, &keys, &[5]).await.unwrap();
    assert_eq!(released, 1);
    env.wait_drained(V, Duration::from_secs(30)).await;
    assert_eq!(env.order_count(V).await, 10);
    w.signal("TERM");
    w.expect_success(Duration::from_secs(20));
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

/// The users whose lock an owner whose token starts with `owner` holds now
/// (lease not run out by Redis's clock; lua/lib/lease.lua's layout).
async fn locks_held_by(env: &TestEnv, keys: &VoucherKeys, owner: &str) -> Vec<String> {
    let mut redis = env.redis().await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut redis).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let locks: Vec<(String, String)> = redis.hgetall(keys.locks()).await.unwrap();
    locks
        .into_iter()
        .filter(|(user, v)| {
            if user == "encoding" {
                return false; // keeps the hash's encoding, no lock
            }
            let mut parts = v.splitn(3, ' ');
            let expires: u64 = parts.next().unwrap().parse().unwrap();
            let _count = parts.next().unwrap();
            expires > now_ms && parts.next().unwrap().starts_with(owner)
        })
        .map(|(user, _)| user)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_lock_holder_whose_lease_expires_causes_no_duplicate() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 6_000).await;
    env.admit_users(V, 6_000, 0).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let lease = [
        "--lock-lease",
        "300ms",
        "--claim-idle",
        "300ms",
        "--block",
        "200ms",
    ];
    let mut a_args = lease.to_vec();
    a_args.extend([
        "--batch",
        "512",
        "--consumer",
        "sleeper",
        "--format",
        "json",
    ]);
    // The holder dwells 2 s on each batch with its locks taken (renewing
    // them), so it can be frozen with locks in hand.
    let a = env.spawn_worker_with(&a_args, &[(seckill::support::fault::ENV, "after_lock=2s")]);
    let mut b_args = lease.to_vec();
    b_args.extend(["--batch", "64", "--consumer", "other"]);
    wait_for_pause(&a, "after_lock").await;
    let held = locks_held_by(&env, &keys, "sleeper:").await;
    assert!(
        !held.is_empty(),
        "the holder holds no lock:\n{}",
        a.log_text()
    );
    // Freeze it past its lease (three times over) while another worker takes
    // over its entries.
    a.signal("STOP");
    let b = env.spawn_worker(&b_args);
    tokio::time::sleep(Duration::from_millis(900)).await;
    let still: Vec<String> = locks_held_by(&env, &keys, "sleeper:")
        .await
        .into_iter()
        .filter(|k| held.contains(k))
        .collect();
    assert!(
        still.is_empty(),
        "the frozen holder still holds {} of its {} locks: its lease was not lost",
        still.len(),
        held.len()
    );
    a.signal("CONT");
    // Then it wakes up and carries on; freeze it a few more times.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        a.signal("STOP");
        tokio::time::sleep(Duration::from_millis(900)).await;
        a.signal("CONT");
    }
    env.wait_drained(V, Duration::from_secs(120)).await;
    a.signal("TERM");
    b.signal("TERM");
    let (summary, log) = a.expect_summary(Duration::from_secs(20));
    b.expect_success(Duration::from_secs(20));
    // The holder noticed that its leases were gone (and stored nothing twice).
    assert!(
        summary["lock_lost"].as_u64().unwrap() > 0,
        "the holder reports no lost lease: {summary}\n{log}"
    );
    assert!(log.contains("lock lease(s) while persisting"), "{log}");
    assert_eq!(env.order_count(V).await, 6_000);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_recovers_when_redis_loses_the_stream_and_its_group() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 100).await;
    let w = env.spawn_worker(&args(&[]));
    env.admit_users(V, 10, 0).await;
    env.wait_orders(V, 10, Duration::from_secs(30)).await;
    // Acknowledged too: a batch in hand whose entries vanish holds the
    // gate paused until the guard checks it, and refuses the admissions
    // below (right, and not what this test is about).
    env.wait_drained(V, Duration::from_secs(30)).await;
    // A restart without persistence takes the stream and its group away;
    // admissions go on and create the stream again, without a group.
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let _: () = redis.del(keys.orders()).await.unwrap();
    env.admit_users(V, 10, 100).await;
    env.wait_orders(V, 20, Duration::from_secs(30)).await;
    w.signal("TERM");
    let log = w.expect_success(Duration::from_secs(20));
    assert!(log.contains("NOGROUP"), "{log}");
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_vouchers_vanish_from_the_registry_registers_them_again_and_consumes_on() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 100).await;
    let w = env.spawn_worker(&args(&[]));
    env.admit_users(V, 10, 0).await;
    env.wait_orders(V, 10, Duration::from_secs(30)).await;
    // Acknowledged too: see the test above.
    env.wait_drained(V, Duration::from_secs(30)).await;
    // Redis comes back without its last writes: the registry and the
    // stream with its group are gone; admissions go on.
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let registry = seckill::store::registry::key(&env.prefix).unwrap();
    let mut redis = env.redis().await;
    let _: () = redis.del(&[keys.orders(), registry.clone()]).await.unwrap();
    env.admit_users(V, 10, 100).await;
    env.wait_orders(V, 20, Duration::from_secs(30)).await;
    let registered: Vec<u64> = redis.smembers(&registry).await.unwrap();
    assert_eq!(registered, vec![V]);
    w.signal("TERM");
    let log = w.expect_success(Duration::from_secs(20));
    assert!(log.contains("missing from the registry"), "{log}");
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

/// CPU seconds (user + system) process `pid` has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn until_idle_waits_without_spinning_for_entries_pending_elsewhere_then_takes_them() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    env.admit_users(V, 10, 0).await;
    // A consumer that read everything and died: its entries stay pending
    // until --claim-idle has passed.
    assert_eq!(env.read_as(V, "gone", 100).await.len(), 10);
    let w = env.spawn_worker(&["--until-idle", "--claim-idle", "3s", "--block", "2s"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = cpu_seconds(w.pid());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let used = cpu_seconds(w.pid()) - before;
    assert!(
        used < 0.5,
        "the waiting worker used {used:.2} CPU s in 1.5 s (it spins)"
    );
    assert_eq!(env.order_count(V).await, 0, "nothing is reclaimed early");
    w.expect_success(Duration::from_secs(30));
    assert_eq!(env.order_count(V).await, 10);
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_is_read_in_batches_that_grow_up_to_max_batch() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10_000).await;
    env.admit_users(V, 10_000, 0).await;
    let growing = [
        "--until-idle",
        "--batch",
        "100",
        "--max-batch",
        "1600",
        "--format",
        "json",
    ];
    let (summary, log) = env
        .spawn_worker(&growing)
        .expect_summary(Duration::from_secs(120));
    assert_eq!(env.order_count(V).await, 10_000);
    // Per lane 100, 200, 400, 800, 1600, 1600...: about a dozen batches
    // where batches of 100 take a hundred.
    let batches = summary["batches"].as_u64().unwrap();
    assert!(batches <= 20, "{batches} batches: {summary}\n{log}");
    assert!(log.contains("batch 100 up to 1600"), "{log}");
    assert_invariants(&env, V).await;

    env.live_voucher(V + 1, 2_000).await;
    env.admit_users(V + 1, 2_000, 0).await;
    let fixed = [
        "--until-idle",
        "--batch",
        "100",
        "--max-batch",
        "100",
        "--format",
        "json",
    ];
    let (summary, _) = env
        .spawn_worker(&fixed)
        .expect_summary(Duration::from_secs(120));
    assert_eq!(summary["batches"].as_u64().unwrap(), 20, "{summary}");
    assert_invariants(&env, V + 1).await;
    env.cleanup().await;
}

#[test]
fn a_max_batch_out_of_range_is_one_line_and_starts_nothing() {
    for bad in ["0", "4097"] {
        let out = assert_cmd::Command::cargo_bin("seckill")
            .unwrap()
            .args(["worker", "--max-batch", bad])
            .env("SECKILL_REDIS_URL", "redis://127.0.0.1:1/")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}"); // as --batch 0
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("--max-batch must be between 1 and 4096"),
            "{err}"
        );
    }
}

/// Issue 19, item 3: a worker stopped (SIGSTOP) inside its batch's MySQL
/// transaction holds the voucher's row lock. Another worker must not wait
/// on it for longer than the stopped one's lease plus one lock wait: it
/// ends the stopped session, whose transaction rolls back, and persists
/// everything; the stopped one, woken, finds its work done.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_stopped_inside_its_transaction_holds_the_voucher_up_only_briefly() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 200).await;
    env.admit_users(V, 200, 0).await;
    let a = env.spawn_worker_with(
        &common::fast_worker(&["--batch", "500", "--consumer", "frozen"]),
        &[(seckill::support::fault::ENV, "before_commit=10s*1")],
    );
    wait_for_pause(&a, "before_commit").await;
    a.signal("STOP");
    let stopped = std::time::Instant::now();
    let b = env.spawn_worker(&common::fast_worker(&["--consumer", "taker"]));
    while env.order_count(V).await < 200 {
        assert!(
            stopped.elapsed() < Duration::from_secs(20),
            "{} of 200 orders persisted 20 s after the holder stopped:\n{}",
            env.order_count(V).await,
            b.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = stopped.elapsed();
    eprintln!("200 orders persisted by the taker {took:?} after the holder stopped");
    assert!(
        b.log_text().contains("ended MySQL session"),
        "{}",
        b.log_text()
    );
    a.signal("CONT");
    env.wait_drained(V, Duration::from_secs(30)).await;
    a.signal("TERM");
    b.signal("TERM");
    a.expect_success(Duration::from_secs(30));
    b.expect_success(Duration::from_secs(30));
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}

/// Found by review (helper 36, 2026-12-07): the batch's keep-alive heard
/// that the transaction was over only after the fence was left, and a
/// tick in between renewed the entry, which enters a gone one again
/// (lua/fence.lua). The entry then outlived its transaction: once it
/// lapsed, a worker whose lock wait timed out would end that pooled
/// session, idle or another batch's, for a holder that never stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_s_fence_entry_is_gone_once_its_transaction_is() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 20).await;
    env.admit_users(V, 20, 0).await;
    // Ticks every third of the 1 s lease: six of them while it waits
    // between the fence's leave and the rest of the batch.
    let w = env.spawn_worker_with(
        &common::fast_worker(&["--lanes", "1"]),
        &[(seckill::support::fault::ENV, "after_fence_left=2s*1")],
    );
    wait_for_pause(&w, "after_fence_left").await;
    env.wait_drained(V, Duration::from_secs(30)).await;
    let mut redis = env.redis().await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let entries: std::collections::HashMap<String, String> =
        redis.hgetall(keys.fence()).await.unwrap();
    assert!(
        entries.is_empty(),
        "fence entries left after the batch: {entries:?}\n{}",
        w.log_text()
    );
    w.signal("TERM");
    w.expect_success(Duration::from_secs(30));
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

/// A worker that takes the whole backlog in one batch on one lane, with a
/// short lock lease and `mysql_timeout`, and a long --claim-idle (30 s): it
/// must not take a batch it let go of back before the other worker does.
fn one_batch_holder<'a>(consumer: &'a str, mysql_timeout: &'a str) -> Vec<&'a str> {
    vec![
        "--block",
        "200ms",
        "--batch",
        "500",
        "--max-batch",
        "500",
        "--lanes",
        "1",
        "--gate-check",
        "0s",
        "--lock-lease",
        "1s",
        "--mysql-timeout",
        mysql_timeout,
        "--consumer",
        consumer,
    ]
}

/// Both workers drain the voucher and stop cleanly on SIGTERM.
async fn both_stop_cleanly(
    env: &TestEnv,
    a: common::process::WorkerProc,
    b: common::process::WorkerProc,
) {
    env.wait_drained(V, Duration::from_secs(30)).await;
    a.signal("TERM");
    b.signal("TERM");
    a.expect_success(Duration::from_secs(30));
    b.expect_success(Duration::from_secs(30));
}

/// Issue 32, item 1: a live worker whose transaction hangs (its task stalls
/// before COMMIT on every attempt while its keep-alive runs on) froze the
/// voucher: the keep-alive renewed its leases and kept its entries claimed,
/// so another worker persisted 0 of 200 orders in 45 s (seen failing).
/// Renewal must prove progress: past --mysql-timeout the holder abandons
/// the transaction (its session ended), lets go of the batch, and another
/// worker persists it after --claim-idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_worker_whose_transaction_hangs_lets_another_persist_its_batch() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 200).await;
    env.admit_users(V, 200, 0).await;
    let a = env.spawn_worker_with(
        &one_batch_holder("stalled", "2s"),
        &[(seckill::support::fault::ENV, "before_commit=120s")],
    );
    wait_for_pause(&a, "before_commit").await;
    let paused = std::time::Instant::now();
    let b = env.spawn_worker(&args(&["--consumer", "taker", "--gate-check", "0s"]));
    env.wait_orders(V, 200, Duration::from_secs(60)).await;
    eprintln!(
        "200 orders persisted by the taker {:?} after the holder's task stalled",
        paused.elapsed()
    );
    wait_for_log(&a, "its connection thrown away, its session").await;
    both_stop_cleanly(&env, a, b).await;
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}

/// Issue 32, item 1, the other way it fails: the worker's MySQL connection
/// goes silent mid-transaction (a proxy that stops forwarding: the COMMIT
/// never arrives, no answer comes, no error either). The worker abandons
/// the transaction at --mysql-timeout but cannot end its session (MySQL is
/// out of its reach); its fence lease lapses and another worker, whose
/// lock wait on the voucher's row times out, ends the session and persists
/// the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_whose_mysql_connection_goes_silent_mid_transaction_is_taken_over() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 200).await;
    env.admit_users(V, 200, 0).await;
    let mut url = url::Url::parse(&env.cfg.mysql_url).expect("MySQL URL");
    let upstream = format!(
        "{}:{}",
        url.host_str().expect("MySQL host"),
        url.port().unwrap_or(3306)
    );
    let proxy = common::fault_proxy::FaultProxy::start(upstream.parse().expect("address")).await;
    url.set_port(Some(proxy.port)).expect("port");
    // Through the proxy: the driver would move a local connection to the
    // server's unix socket.
    url.query_pairs_mut().append_pair("prefer_socket", "false");
    let a = env.spawn_worker_with(
        &one_batch_holder("cut-off", "3s"),
        &[
            (seckill::support::fault::ENV, "before_commit=1s*1"),
            ("SECKILL_MYSQL_URL", url.as_str()),
        ],
    );
    wait_for_pause(&a, "before_commit").await;
    proxy.set(common::fault_proxy::Mode::BlackHole);
    let silenced = std::time::Instant::now();
    let b = env.spawn_worker(&args(&["--consumer", "taker", "--gate-check", "0s"]));
    env.wait_orders(V, 200, Duration::from_secs(60)).await;
    eprintln!(
        "200 orders persisted by the taker {:?} after the holder's connection went silent",
        silenced.elapsed()
    );
    // It gives up ending its session only after trying (a checkout that
    // times out): the line may come after the taker's commit.
    wait_for_log(&a, "could not end its session").await;
    assert!(
        b.log_text().contains("ended MySQL session"),
        "{}",
        b.log_text()
    );
    both_stop_cleanly(&env, a, b).await;
    drop(proxy);
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}

/// The same for a cancellation: a worker stopped inside the transaction
/// that cancels unpaid orders holds the voucher's row; another worker's
/// deadlines go on after the stopped one's lease and one lock wait (I6).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_stopped_inside_a_cancellation_does_not_stop_the_deadlines() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 50, 1_000).await;
    env.admit_users(V, 50, 0).await;
    // It persists the orders, then stops in the cancellation a second later.
    let a = env.spawn_worker_with(
        &common::fast_worker(&["--consumer", "frozen"]),
        &[(seckill::support::fault::ENV, "before_cancel_commit=10s*1")],
    );
    wait_for_pause(&a, "before_cancel_commit").await;
    a.signal("STOP");
    let stopped = std::time::Instant::now();
    let b = env.spawn_worker(&common::fast_worker(&["--consumer", "taker"]));
    env.wait_settled(V, Duration::from_secs(20)).await;
    eprintln!(
        "50 orders cancelled by the taker {:?} after the holder stopped",
        stopped.elapsed()
    );
    assert!(
        b.log_text().contains("ended MySQL session"),
        "{}",
        b.log_text()
    );
    a.signal("CONT");
    a.signal("TERM");
    b.signal("TERM");
    a.expect_success(Duration::from_secs(30));
    b.expect_success(Duration::from_secs(30));
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 50, "every unit back: {s:?}");
    env.cleanup().await;
}

/// Review finding: a batch whose entries another worker took over and
/// acknowledged (its holder was frozen past `--claim-idle`) is not lost —
/// the keep-alive must not hold or pause the gate for it when the holder
/// wakes (the entries are still in the stream, their orders in MySQL).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_taken_over_while_its_holder_was_frozen_is_not_taken_for_lost() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 100).await;
    env.admit_users(V, 100, 0).await;
    let a = env.spawn_worker_with(
        &common::fast_worker(&["--batch", "200", "--consumer", "frozen"]),
        &[(seckill::support::fault::ENV, "after_lock=3s*1")],
    );
    wait_for_pause(&a, "after_lock").await;
    a.signal("STOP");
    let b = env.spawn_worker(&common::fast_worker(&["--consumer", "taker"]));
    env.wait_orders(V, 100, Duration::from_secs(30)).await;
    env.wait_drained(V, Duration::from_secs(30)).await;
    a.signal("CONT");
    // Its keep-alive ticks and its batch finishes (all already stored).
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    a.signal("TERM");
    b.signal("TERM");
    let log = a.expect_success(Duration::from_secs(30));
    b.expect_success(Duration::from_secs(30));
    assert!(
        !log.contains("no longer has every entry"),
        "entries another worker acknowledged were taken for lost:\n{log}"
    );
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}
