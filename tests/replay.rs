//! Every script that writes is safe to run twice with the same arguments
//! (docs/src/concepts/rules.md): a client — the redis crate's cluster client among them —
//! resends a call whose reply it lost, after the script ran. Each test
//! records the real call with MONITOR on a Redis of its own (the `seckill`
//! command or the library function that makes it), sends exactly that
//! command again, and checks the stores are as one run left them.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::invariants::assert_invariants;
use common::own_redis::OwnRedis;
use common::{fast_worker, TestEnv};
use redis::{AsyncCommands, Script, Value};
use seckill::store::keys::VoucherKeys;
use seckill::store::scripts;
use seckill::worker::lock::LockOwner;

const V: u64 = 1;

/// A command as Redis received it: its name, then its arguments.
type Call = Vec<Vec<u8>>;

/// `redis-cli monitor` on the test's own Redis, its lines collected.
struct Monitor {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(redis: &OwnRedis) -> Monitor {
        let mut child = Command::new("redis-cli")
            .args(["-p", &redis.port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli monitor");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert_eq!(first.trim(), "OK", "MONITOR started");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        Monitor { child, lines }
    }

    /// The EVALSHA calls of `script` that clients sent (not the commands
    /// scripts ran), waiting until at least `at_least` arrived.
    fn calls(&self, script: &Script, at_least: usize) -> Vec<Call> {
        let start = Instant::now();
        loop {
            let calls: Vec<Call> = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .filter_map(|l| client_command(l))
                .filter(|c| {
                    c.len() > 1
                        && c[0].eq_ignore_ascii_case(b"EVALSHA")
                        && c[1] == script.get_hash().as_bytes()
                })
                .collect();
            if calls.len() >= at_least {
                return calls;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{} call(s) of the script seen, {at_least} expected",
                calls.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The one call of `script`.
    fn call(&self, script: &Script) -> Call {
        let calls = self.calls(script, 1);
        assert_eq!(calls.len(), 1, "one call of the script");
        calls.into_iter().next().unwrap()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// A MONITOR line's command, unless a script sent it: `<time> [<db> <client>]
/// "arg" "arg" ...`, each argument quoted as Redis's sdscatrepr does.
fn client_command(line: &str) -> Option<Call> {
    let open = line.find('[')?;
    let close = open + line[open..].find("] ")?;
    if line[open..close].ends_with(" lua") {
        return None;
    }
    let b = &line.as_bytes()[close + 2..];
    let mut args = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'"' {
            i += 1;
            continue;
        }
        i += 1;
        let mut arg = Vec::new();
        while b[i] != b'"' {
            if b[i] == b'\\' {
                i += 1;
                match b[i] {
                    b'n' => arg.push(b'\n'),
                    b'r' => arg.push(b'\r'),
                    b't' => arg.push(b'\t'),
                    b'a' => arg.push(7),
                    b'b' => arg.push(8),
                    b'x' => {
                        let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                        arg.push(u8::from_str_radix(hex, 16).unwrap());
                        i += 2;
                    }
                    c => arg.push(c),
                }
            } else {
                arg.push(b[i]);
            }
            i += 1;
        }
        i += 1;
        args.push(arg);
    }
    Some(args)
}

/// Sends `call` again, exactly.
async fn replay(env: &TestEnv, call: &Call) -> Value {
    let mut redis = env.redis().await;
    let mut cmd = redis::cmd(std::str::from_utf8(&call[0]).unwrap());
    for a in &call[1..] {
        cmd.arg(a.as_slice());
    }
    cmd.query_async(&mut redis).await.expect("the replay runs")
}

/// Fails naming the keys and tables that differ from `before`.
async fn assert_unchanged(env: &TestEnv, before: &common::Snapshot, what: &str) {
    let now = env.snapshot().await;
    if &now == before {
        return;
    }
    let differ: std::collections::BTreeSet<&String> = now
        .redis
        .keys()
        .chain(before.redis.keys())
        .filter(|k| now.redis.get(*k) != before.redis.get(*k))
        .collect();
    let tables: Vec<&String> = now
        .tables
        .keys()
        .filter(|t| now.tables.get(*t) != before.tables.get(*t))
        .collect();
    panic!("{what}: keys changed {differ:?}, tables changed {tables:?}");
}

/// The script's argument `n` (ARGV[n]) in a recorded EVALSHA.
fn argv_index(call: &Call, n: usize) -> usize {
    let keys: usize = std::str::from_utf8(&call[2]).unwrap().parse().unwrap();
    3 + keys + n - 1
}

fn int(v: &Value) -> i64 {
    redis::from_redis_value(v.clone()).unwrap()
}

fn ints(v: &Value) -> Vec<i64> {
    redis::from_redis_value(v.clone()).unwrap()
}

/// A test's stores on a Redis of its own, every script cached there first
/// (a first EVALSHA answered NOSCRIPT would be recorded as a call too).
async fn own_env(redis: &OwnRedis) -> TestEnv {
    let env = TestEnv::on_redis(&redis.url()).await;
    let mut conn = env.redis().await;
    for s in [
        &*scripts::ADMISSION,
        &*scripts::PRELOAD,
        &*scripts::LOCK_ACQUIRE,
        &*scripts::LOCK_RENEW,
        &*scripts::LOCK_RELEASE,
        &*scripts::FINISH,
        &*scripts::REQUEUE,
        &*scripts::FORGET_CONSUMER,
        &*scripts::CLAIM_DUE,
        &*scripts::RELEASE,
        &*scripts::RECONCILE,
        &*scripts::NODE_LEASE,
        &*scripts::POLICY,
        &*scripts::TOKEN,
        &*scripts::PAUSE,
    ] {
        s.load_async(&mut conn).await.unwrap();
    }
    env
}

/// A live voucher of `stock` units whose first `buyers` users hold orders
/// in MySQL (the worker drained), the gate consistent with it.
async fn sold(env: &TestEnv, stock: i64, buyers: u64) {
    env.live_voucher(V, stock).await;
    env.admit_users(V, buyers, 0).await;
    drain(env);
    assert_eq!(env.order_count(V).await, buyers);
}

fn drain(env: &TestEnv) {
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_preload_of_a_consistent_gate_keeps_every_buyer() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    sold(&env, 50, 30).await;

    let monitor = Monitor::start(&own);
    preload(&env, &[]);
    let call = monitor.call(&scripts::PRELOAD);
    let once = env.snapshot().await;

    // The staging sets are gone (swapped in) and the witness is as it was:
    // the replay must know itself, write nothing, and say it published.
    assert_eq!(int(&replay(&env, &call).await), 1);
    assert_unchanged(&env, &once, "the replay wrote nothing").await;

    // Staging sets gone under another run's tag: refused, nothing written.
    let mut other = call.clone();
    other[argv_index(&call, 12)] = b"1".to_vec();
    assert_eq!(int(&replay(&env, &other).await), 0);
    assert_unchanged(&env, &once, "the refusal wrote nothing").await;

    assert_every_buyer_kept(&env).await;
    env.cleanup().await;
}

/// `seckill preload --voucher 1`, with these variables set; it must
/// succeed.
fn preload(env: &TestEnv, vars: &[(&str, &str)]) -> std::process::Output {
    let out = env
        .cmd()
        .args(["preload", "--voucher", "1"])
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    out
}

/// The 30 buyers of `sold(.., 50, 30)` all still known to the gate: buyer
/// 1 is refused a second order, and the invariants hold.
async fn assert_every_buyer_kept(env: &TestEnv) {
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let buyers: u64 = env.redis().await.scard(keys.buyers()).await.unwrap();
    assert_eq!(buyers, 30, "every buyer kept");
    let buy = env
        .cmd()
        .args(["buy", "--voucher", "1", "--user", "1"])
        .output()
        .unwrap();
    assert_eq!(
        buy.status.code(),
        Some(i32::from(seckill::exit_code::ALREADY_BOUGHT)),
        "buyer 1 holds an order: {buy:?}"
    );
    assert_invariants(env, V).await;
}

/// The explorer's `script_resent` fault (support/fault.rs): the call goes
/// out twice, the same bytes, and the command answers as the second reply
/// says; on preload, a publish resent must keep every buyer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resend_fault_sends_a_script_call_twice_and_a_resent_preload_keeps_every_buyer() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    sold(&env, 50, 30).await;

    let monitor = Monitor::start(&own);
    let out = preload(&env, &[("SECKILL_TEST_FAULT", "resend_preload@1=resend")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("fault resend at resend_preload (hit 1)"),
        "{stderr}"
    );
    let calls = monitor.calls(&scripts::PRELOAD, 2);
    assert_eq!(calls.len(), 2, "the call and its resend");
    assert_eq!(calls[0], calls[1], "resent as it was sent");
    assert_every_buyer_kept(&env).await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_replayed_lock_acquisition_is_freed_by_the_one_release() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let lane = LockOwner {
        token: "host:1:0".into(),
        lease: Duration::from_secs(30),
    };
    let other = LockOwner {
        token: "host:1:1".into(),
        lease: Duration::from_secs(30),
    };

    let monitor = Monitor::start(&own);
    assert_eq!(
        lane.acquire(&mut redis, &keys, &[1, 2, 2]).await.unwrap(),
        vec![true, true, true]
    );
    let call = monitor.call(&scripts::LOCK_ACQUIRE);
    assert_eq!(ints(&replay(&env, &call).await), vec![1, 1, 1]);

    // The batch's one release (as the finish script gives them back).
    assert_eq!(
        lane.release(&mut redis, &keys, &[1, 2, 2]).await.unwrap(),
        3
    );
    let fields: Vec<String> = redis.hkeys(keys.locks()).await.unwrap();
    assert_eq!(
        fields,
        vec!["encoding".to_string()],
        "no lock is left after the one release"
    );
    assert_eq!(
        other.acquire(&mut redis, &keys, &[1, 2]).await.unwrap(),
        vec![true, true],
        "another lane takes them at once"
    );
    // The release resent: it finds none of its owner's locks, and leaves
    // the other lane's alone.
    let release = monitor.call(&scripts::LOCK_RELEASE);
    let once = env.snapshot().await;
    assert_eq!(int(&replay(&env, &release).await), 0);
    assert_unchanged(&env, &once, "the replayed release wrote nothing").await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_requeue_reports_what_it_did_and_takes_nothing_twice() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    sold(&env, 10, 2).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    // Still a buyer: requeued on the unit its admission took.
    let held = env
        .admit_and_dead_letter(V, 4, 9_000_004, "voucher 1 is not in MySQL")
        .await;
    // Freed by reconcile since: a unit is taken again.
    let freed = env
        .admit_and_dead_letter(V, 5, 9_000_005, "no stock in MySQL")
        .await;
    let changed: i64 = redis.srem(keys.buyers(), 5).await.unwrap();
    env.move_digest(V, "buyers_digest", &[5], -changed).await;
    let _: () = redis.incr(keys.stock(), 1).await.unwrap();
    let stock_before: i64 = redis.get(keys.stock()).await.unwrap();
    let entries_before: u64 = redis.xlen(keys.orders()).await.unwrap();

    let monitor = Monitor::start(&own);
    let out = env.requeue(V);
    assert!(out.status.success(), "{out:?}");
    let report = common::json(&out);
    assert_eq!(report["requeued"], 2, "{report}");
    let call = monitor.call(&scripts::REQUEUE);
    assert_eq!(call[argv_index(&call, 1)], held.as_bytes());
    assert_eq!(call[argv_index(&call, 4)], freed.as_bytes());
    let once = env.snapshot().await;

    assert_eq!(
        ints(&replay(&env, &call).await),
        vec![1, 2],
        "requeued, readmitted: as the first run answered"
    );
    assert_unchanged(&env, &once, "the replay wrote nothing").await;
    let stock: i64 = redis.get(keys.stock()).await.unwrap();
    assert_eq!(
        stock,
        stock_before - 1,
        "one unit taken, for the freed letter"
    );
    let entries: u64 = redis.xlen(keys.orders()).await.unwrap();
    assert_eq!(entries, entries_before + 2, "one stream entry per letter");

    drain(&env);
    assert_eq!(env.order_count(V).await, 4);
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

/// `voucher update` publishes with the policy's version: the replay writes
/// the same fields again; replayed after a later update, it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_policy_publish_never_brings_an_older_policy_back() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    env.live_voucher(V, 10).await;
    let update = |args: &[&str]| {
        let out = env
            .cmd()
            .args(["voucher", "update", "--id", "1"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };

    let monitor = Monitor::start(&own);
    update(&["--user-rate", "3", "--require-token"]);
    let call = monitor.call(&scripts::POLICY);
    let once = env.snapshot().await;
    assert_eq!(int(&replay(&env, &call).await), 1);
    assert_unchanged(&env, &once, "the replay wrote the same fields").await;

    update(&["--user-rate", "0", "--no-require-token"]);
    let newer = env.snapshot().await;
    assert_eq!(int(&replay(&env, &call).await), 2, "refused: older");
    assert_unchanged(&env, &newer, "the refusal wrote nothing").await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_finish_changes_nothing() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    env.live_voucher(V, 20).await;
    env.admit_users(V, 12, 0).await;

    let monitor = Monitor::start(&own);
    drain(&env);
    let calls = monitor.calls(&scripts::FINISH, 1);
    assert_eq!(env.order_count(V).await, 12);
    let once = env.snapshot().await;
    for call in &calls {
        // Everything was acknowledged by the first run.
        assert_eq!(int(&replay(&env, call).await), 0);
    }
    assert_unchanged(&env, &once, "the replays wrote nothing").await;
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_release_gives_no_unit_back_twice() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    env.live_voucher_paying_within(V, 2, 1_000).await;
    env.admit_users(V, 3, 0).await; // user 3 is waitlisted
    drain(&env);
    tokio::time::sleep(Duration::from_millis(1_300)).await;

    // The deadlines of users 1 and 2 are due: cancelled, one unit to user
    // 3 (a promotion), one back to the stock.
    let monitor = Monitor::start(&own);
    drain(&env);
    let calls = monitor.calls(&scripts::RELEASE, 1);
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let promotions: Option<i64> = redis.hget(keys.meta(), "promotions").await.unwrap();
    assert_eq!(promotions, Some(1));
    let once = env.snapshot().await;
    for call in &calls {
        assert_eq!(ints(&replay(&env, call).await), vec![0, 0, 0]);
    }
    assert_unchanged(&env, &once, "the replays wrote nothing").await;
    drain(&env);
    let s = assert_invariants(&env, V).await;
    assert!(s.buyers.contains(&3), "user 3 was promoted once");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_reconcile_repair_is_applied_once() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    sold(&env, 10, 3).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;

    // Units stuck at the gate and a buyer missing: the repair moves the
    // stock and the buyers count, so its witness no longer matches.
    let _: () = redis.decr(keys.stock(), 2).await.unwrap();
    let _: () = redis.srem(keys.buyers(), 1).await.unwrap();
    env.move_digest(V, "buyers_digest", &[1], -1).await;
    let monitor = Monitor::start(&own);
    let (code, report) = env.reconcile_json(&["--voucher", "1", "--yes"]);
    assert_eq!(
        report["vouchers"][0]["outcome"], "repaired",
        "{report} (exit {code})"
    );
    let call = monitor.call(&scripts::RECONCILE);
    let once = env.snapshot().await;
    assert_eq!(
        int(&replay(&env, &call).await),
        0,
        "refused: the gate moved"
    );
    assert_unchanged(&env, &once, "the replay wrote nothing").await;
    assert_invariants(&env, V).await;
    drop(monitor);

    // A buyer missing and one without an order: as many added as removed,
    // the stock untouched, so the witness matches again after the repair
    // and the replay runs; it must find its work done.
    let _: () = redis.srem(keys.buyers(), 2).await.unwrap();
    let _: () = redis.sadd(keys.buyers(), 99).await.unwrap();
    env.move_digest(V, "buyers_digest", &[2], -1).await;
    env.move_digest(V, "buyers_digest", &[99], 1).await;
    let monitor = Monitor::start(&own);
    let (code, report) = env.reconcile_json(&["--voucher", "1", "--yes"]);
    assert_eq!(
        report["vouchers"][0]["outcome"], "repaired",
        "{report} (exit {code})"
    );
    let call = monitor.call(&scripts::RECONCILE);
    let once = env.snapshot().await;
    assert_eq!(int(&replay(&env, &call).await), 1);
    assert_unchanged(&env, &once, "the replay wrote nothing").await;
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_admission_answers_already_bought_and_sells_one_unit() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    env.live_voucher(V, 5).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;

    let monitor = Monitor::start(&own);
    let buy = env
        .cmd()
        .args(["buy", "--voucher", "1", "--user", "7"])
        .output()
        .unwrap();
    assert!(buy.status.success(), "{buy:?}");
    let call = monitor.call(&scripts::ADMISSION);
    let once = env.snapshot().await;
    let reply: (i64, String, i64) = redis::from_redis_value(replay(&env, &call).await).unwrap();
    assert_eq!(reply, (1, "already bought".to_string(), 0));
    assert_unchanged(&env, &once, "the replay wrote nothing").await;
    let stock: i64 = redis.get(keys.stock()).await.unwrap();
    assert_eq!(stock, 4);
    drain(&env);
    assert_eq!(env.order_count(V).await, 1);
    assert_invariants(&env, V).await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_replayed_node_id_claim_keeps_the_lease_it_took() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    let monitor = Monitor::start(&own);
    // A pinned node id: a replay answered "leased by another process"
    // would make the process give up.
    let ids = seckill::store::node_lease::OrderIds::lease(&env.cfg, Some(17))
        .await
        .unwrap();
    let claim = monitor.call(&scripts::NODE_LEASE);
    assert_eq!(claim[argv_index(&claim, 1)], b"claim");
    let now_ms: i64 = std::str::from_utf8(&claim[argv_index(&claim, 5)])
        .unwrap()
        .parse()
        .unwrap();
    let once = env.snapshot().await;
    let floor = int(&replay(&env, &claim).await);
    assert!(
        floor >= now_ms,
        "the replay hands out a floor no holder used ids above: {floor}"
    );
    assert_unchanged(&env, &once, "the replay wrote nothing").await;
    ids.next_id().unwrap();
    ids.release().await;
    env.cleanup().await;
}

/// Quantities: a sold-out attempt that waits for 2 units, resent, keeps
/// its place and its want; the release of a 3-unit order that serves it
/// (and passes over a request of 3), resent, gives nothing back twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_calls_with_quantities_take_and_give_nothing_twice() {
    let own = OwnRedis::start();
    let env = own_env(&own).await;
    // Long enough that user 2's promoted order is not overdue when the
    // invariants are checked on a loaded machine.
    env.live_voucher_paying_within(V, 3, 3_000).await;
    let limit = ["voucher", "update", "--id", "1", "--per-user-limit", "3"];
    assert!(env.cmd().args(limit).output().unwrap().status.success());
    let buy = |user: &str, quantity: &str| {
        env.cmd()
            .args([
                "buy",
                "--voucher",
                "1",
                "--user",
                user,
                "--quantity",
                quantity,
            ])
            .output()
            .unwrap()
            .status
            .code()
    };
    assert_eq!(buy("1", "3"), Some(0));
    assert_eq!(buy("2", "3"), Some(11));
    let monitor = Monitor::start(&own);
    assert_eq!(buy("3", "2"), Some(11));
    let call = monitor.call(&scripts::ADMISSION);
    let once = env.snapshot().await;
    let reply: (i64, String, i64) = redis::from_redis_value(replay(&env, &call).await).unwrap();
    assert_eq!(reply, (2, "sold out".to_string(), 2));
    assert_unchanged(&env, &once, "the replayed wait wrote nothing").await;
    drop(monitor);
    drain(&env);
    tokio::time::sleep(Duration::from_millis(3_300)).await;
    // User 1's deadline: 3 units back, user 2 (3 units) served first.
    let monitor = Monitor::start(&own);
    drain(&env);
    let calls = monitor.calls(&scripts::RELEASE, 1);
    let once = env.snapshot().await;
    for call in &calls {
        assert_eq!(ints(&replay(&env, call).await), vec![0, 0, 0]);
    }
    assert_unchanged(&env, &once, "the replayed release wrote nothing").await;
    let s = assert_invariants(&env, V).await;
    assert!(s.buyers.contains(&2), "user 2 was served whole");
    assert_eq!(
        s.waitlist,
        [3],
        "user 3's 2 units did not fit what was left"
    );
    env.cleanup().await;
}
