//! Order ids are unique across processes with no set-up: 200 `seckill buy`
//! processes at once, each the pid 1 of its own pid namespace (as in 200
//! containers), mint 200 distinct ids, and the worker persists every order.

mod common;

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::invariants::assert_invariants;
use common::{fast_worker, TestEnv};

const V: u64 = 1;
const BUYERS: u64 = 200;

/// The token of a lease held by a process other than the one under test.
const OTHER_HOLDER: &str = "another-host:1:token";

/// Leases node id `node` to another live process; returns its lease key.
async fn take_node_id(env: &TestEnv, node: u16) -> String {
    let lease = seckill::store::keys::node_lease(&env.prefix, node);
    let mut redis = env.redis().await;
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg(OTHER_HOLDER)
        .arg("PX")
        .arg(30_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    lease
}

/// Whether this machine lets us run a process as pid 1 of a new namespace.
fn pid_namespaces_work() -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buyers_that_are_all_pid_1_get_distinct_order_ids() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 1_000).await;
    let namespaces = pid_namespaces_work();
    if !namespaces {
        eprintln!("unshare --pid is not permitted here: the buyers run as ordinary processes");
    }
    let bin = env!("CARGO_BIN_EXE_seckill");
    let children: Vec<_> = (1..=BUYERS)
        .map(|user| {
            let user = user.to_string();
            let args = ["buy", "--voucher", "1", "--user", &user, "--format", "json"];
            let mut cmd = if namespaces {
                let mut c = Command::new("unshare");
                c.args(["--pid", "--fork", bin]).args(args);
                c
            } else {
                let mut c = Command::new(bin);
                c.args(args);
                c
            };
            cmd.env("SECKILL_REDIS_URL", &env.cfg.redis_url)
                .env("SECKILL_MYSQL_URL", &env.cfg.mysql_url)
                .env("SECKILL_PREFIX", &env.prefix)
                .env_remove("SECKILL_NODE_ID")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn seckill buy")
        })
        .collect();
    let mut ids = HashSet::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let j = common::json(&out);
        assert_eq!(j["outcome"], "success", "{j}");
        ids.insert(j["order_id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len() as u64, BUYERS, "distinct order ids");
    env.spawn_worker(&fast_worker(&["--until-idle"]))
        .expect_success(Duration::from_secs(60));
    assert_eq!(
        env.order_count(V).await,
        BUYERS,
        "every admitted order persisted"
    );
    let s = assert_invariants(&env, V).await;
    assert_eq!(s.orders.len() as u64, BUYERS);
    let keys = seckill::store::keys::VoucherKeys::new(&env.prefix, V).unwrap();
    let mut redis = env.redis().await;
    let dead: u64 = redis::AsyncCommands::xlen(&mut redis, keys.dead())
        .await
        .unwrap();
    assert_eq!(dead, 0, "no order dead-lettered as colliding");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_node_id_held_by_a_live_lease_is_refused() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    take_node_id(&env, 7).await;
    let out = env
        .cmd()
        .args(["buy", "--voucher", "1", "--user", "5", "--node-id", "7"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("node id 7 is leased by another live process"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(env.in_flight(V).await, 0, "nothing admitted");
    // Unset, a free node id is leased instead.
    let out = env
        .cmd()
        .args(["buy", "--voucher", "1", "--user", "5", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let id: u64 = common::json(&out)["order_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(seckill::support::snowflake::decode(id).1, 7);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_holder_mints_above_the_former_holders_time() {
    let env = TestEnv::new().await;
    env.live_voucher(V, 10).await;
    // A former holder of node 9 whose clock ran an hour ahead of ours.
    let ahead = seckill::support::timespec::now_ms() + 3_600_000;
    let mut redis = env.redis().await;
    let _: () = redis::AsyncCommands::hset(
        &mut redis,
        seckill::store::keys::node_clock(&env.prefix),
        9,
        ahead,
    )
    .await
    .unwrap();
    let out = env
        .cmd()
        .args(["buy", "--voucher", "1", "--user", "5", "--node-id", "9"])
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let id: u64 = common::json(&out)["order_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let (ms, node) = seckill::support::snowflake::decode(id);
    assert_eq!(node, 9);
    assert!(
        ms > ahead as u64,
        "id time {ms} is not above the former holder's {ahead}"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_connection_dropped_is_renewed_on_a_new_one() {
    let env = TestEnv::new().await;
    let ids = seckill::store::node_lease::OrderIds::lease(&env.cfg, None)
        .await
        .unwrap();
    let before = ids.next_id().unwrap();
    // The connection goes (a Redis restart, a failover, a network reset).
    let mut redis = env.redis().await;
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut redis)
        .await
        .unwrap();
    let name = ids.connection_name();
    let id = list
        .lines()
        .find(|l| l.contains(&format!("name={name} ")))
        .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .unwrap_or_else(|| panic!("no connection named {name}"))
        .to_string();
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&id)
        .query_async(&mut redis)
        .await
        .unwrap();
    // The renewal that meets the dead connection fails, as a lost
    // connection (or works, when the driver saw the close before it went
    // out); the next one works on a new connection either way, so minting
    // never stops for good.
    let first = ids.renew().await;
    if let Err(e) = &first {
        assert_eq!(
            e.store_fault(),
            Some(seckill::error::StoreFault::ConnectionLost),
            "{e}"
        );
    }
    let second = ids.renew().await;
    assert!(
        second.is_ok(),
        "renewal never recovered: {first:?} then {second:?}"
    );
    assert!(ids.next_id().unwrap() > before);
    ids.release().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_never_minted_with_again_and_another_node_id_is_claimed() {
    let env = TestEnv::new().await;
    let ids = seckill::store::node_lease::OrderIds::lease(&env.cfg, None)
        .await
        .unwrap();
    let node = ids.node();
    // The lease expired (a long pause) and another process took the node.
    let lease = take_node_id(&env, node).await;
    let mut redis = env.redis().await;
    ids.renew().await.unwrap();
    assert_ne!(ids.node(), node, "the taken node id is not used again");
    let id = ids.next_id().unwrap();
    assert_ne!(seckill::support::snowflake::decode(id).1, node);
    let holder: String = redis::AsyncCommands::get(&mut redis, &lease).await.unwrap();
    assert_eq!(holder, OTHER_HOLDER, "the other holder keeps it");
    ids.release().await;
    env.cleanup().await;
}

/// Leases node id `node` (any when None) for this process, with a floor
/// `ahead_ms` past this clock (as a former holder whose clock ran ahead
/// leaves), and mints `count` ids: all borrowed from the milliseconds just
/// above the floor.
async fn lease_ahead_and_mint(
    env: &TestEnv,
    node: Option<u16>,
    ahead_ms: u64,
    count: usize,
) -> (
    std::sync::Arc<seckill::store::node_lease::OrderIds>,
    Vec<u64>,
) {
    let floor = seckill::support::timespec::now_ms() as u64 + ahead_ms;
    let nodes: Vec<(u16, u64)> = match node {
        Some(n) => vec![(n, floor)],
        None => (0..=seckill::support::snowflake::MAX_NODE_ID)
            .map(|n| (n, floor))
            .collect(),
    };
    let mut redis = env.redis().await;
    let _: () = redis::AsyncCommands::hset_multiple(
        &mut redis,
        seckill::store::keys::node_clock(&env.prefix),
        &nodes,
    )
    .await
    .unwrap();
    let ids = seckill::store::node_lease::OrderIds::lease(&env.cfg, node)
        .await
        .unwrap();
    let minted = (0..count).map(|_| ids.next_id().unwrap()).collect();
    (ids, minted)
}

/// Deletes node `node`'s lease and every floor: what a failover to a
/// replica that had none of the `{nodes}` keys leaves.
async fn lose_leases_and_floors(env: &TestEnv, node: u16) {
    let mut redis = env.redis().await;
    let _: () = redis::AsyncCommands::del(
        &mut redis,
        &[
            seckill::store::keys::node_lease(&env.prefix, node),
            seckill::store::keys::node_clock(&env.prefix),
        ],
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_claimed_again_after_redis_lost_it_never_repeats_an_id() {
    use seckill::support::snowflake::decode;
    let env = TestEnv::new().await;
    // 16 ms of ids (4,096 a millisecond) from a second ahead of the clock:
    // minting them takes far less than that second, even on a slow machine.
    let (ids, before) = lease_ahead_and_mint(&env, Some(11), 1_000, 16 * 4_096).await;
    let first_ms = decode(*before.iter().min().unwrap()).0;
    let last_ms = decode(*before.iter().max().unwrap()).0;
    let mut seen: HashSet<u64> = before.into_iter().collect();
    lose_leases_and_floors(&env, 11).await;
    // The renewal finds the lease gone and claims node 11 again, at floor 0.
    ids.renew().await.unwrap();
    assert_eq!(ids.node(), 11);
    // Mint on until the clock has passed every millisecond used before: a
    // generator that started again from floor 0 would repeat the ids of
    // those milliseconds as the clock reaches them. Up to a few ms before
    // them, a pause between ids keeps the count of ids small.
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let id = ids.next_id().unwrap();
        assert!(seen.insert(id), "order id {id} minted twice");
        let ms = decode(id).0;
        if ms > last_ms {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the clock never passed {last_ms}"
        );
        if ms + 5 < first_ms {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    ids.release().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_claimed_again_under_another_node_id_keeps_its_id_time() {
    let env = TestEnv::new().await;
    let (ids, before) = lease_ahead_and_mint(&env, None, 60_000, 1_000).await;
    let node = ids.node();
    let last_ms = seckill::support::snowflake::decode(*before.iter().max().unwrap()).0;
    lose_leases_and_floors(&env, node).await;
    // Another process claimed the node meanwhile (on the empty replica).
    take_node_id(&env, node).await;
    ids.renew().await.unwrap();
    assert_ne!(ids.node(), node);
    let (ms, _) = seckill::support::snowflake::decode(ids.next_id().unwrap());
    assert!(
        ms >= last_ms,
        "ids went back from {last_ms} to {ms} under a new node id"
    );
    ids.release().await;
    env.cleanup().await;
}
