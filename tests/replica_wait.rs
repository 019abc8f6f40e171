//! `--wait-replicas` counts only replicas that have the admission: the
//! `WAIT` goes out with the admission script in one pipeline, on the one
//! connection that made the admission's write.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::own_cluster::OwnCluster;
use common::own_redis::OwnRedis;
use common::{json, TestEnv};
use seckill::store::keys::VoucherKeys;

const V: u64 = 5;

/// `buy --voucher 5 --user <user> --wait-replicas 1 <extra> --format json`.
fn buy(env: &TestEnv, user: &str, extra: &[&str]) -> std::process::Output {
    env.cmd()
        .args([
            "buy",
            "--voucher",
            "5",
            "--user",
            user,
            "--wait-replicas",
            "1",
        ])
        .args(extra)
        .args(["--format", "json"])
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buy_reports_the_replica_only_once_it_has_the_admission() {
    let master = OwnRedis::start();
    let replica = master.start_replica();
    let env = TestEnv::on_redis(&master.url()).await;
    env.live_voucher(V, 10).await;
    let out = buy(&env, "1", &["--wait-timeout", "10s"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let j = json(&out);
    assert_eq!(j["outcome"], "success", "{j}");
    assert_eq!(j["replicas_acked"], 1, "{j}");
    // What the count promises: the replica has the admission already.
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    assert_eq!(replica.cli(&["sismember", &keys.buyers(), "1"]).trim(), "1");
    // A refusal reports no count, and keeps its own exit code.
    let out = buy(&env, "1", &[]);
    assert_eq!(out.status.code(), Some(10), "{out:?}");
    let j = json(&out);
    assert_eq!(j["outcome"], "already_bought", "{j}");
    assert!(j.get("replicas_acked").is_none(), "{j}");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_acknowledges_nothing_is_reported_short_and_the_admission_stands() {
    let master = OwnRedis::start();
    let replica = master.start_replica();
    let env = TestEnv::on_redis(&master.url()).await;
    env.live_voucher(V, 10).await;
    // Still connected (the master counts it), but it acknowledges nothing.
    replica.freeze(true);
    let started = Instant::now();
    let out = buy(&env, "1", &["--wait-timeout", "300ms"]);
    assert!(started.elapsed() >= Duration::from_millis(300), "{out:?}");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let j = json(&out);
    assert_eq!(j["outcome"], "success", "{j}");
    assert_eq!(j["replicas_acked"], 0, "{j}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("only 0 of 1 replica(s)"),
        "{out:?}"
    );
    assert_eq!(env.in_flight(V).await, 1, "the admission stands");
    let bench = env
        .cmd()
        .args([
            "bench",
            "--voucher",
            "5",
            "--users",
            "3",
            "--user-offset",
            "100",
        ])
        .args([
            "--attempts",
            "3",
            "--wait-replicas",
            "1",
            "--wait-timeout",
            "100ms",
        ])
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(bench.status.success(), "{bench:?}");
    let b = json(&bench);
    assert_eq!(b["outcomes"]["success"], 3, "{b}");
    assert_eq!(b["replicas_short"], 3, "{b}");
    // Thawed, it catches up: the next admission is counted again.
    replica.freeze(false);
    let out = buy(&env, "2", &["--wait-timeout", "10s"]);
    assert_eq!(json(&out)["replicas_acked"], 1, "{out:?}");
    env.cleanup().await;
}

/// The client address and the command words of a `MONITOR` line, e.g.
/// `1764576000.123456 [0 127.0.0.1:50000] "WAIT" "1" "500"`.
fn monitor_line(line: &str) -> Option<(String, Vec<String>)> {
    let (_, rest) = line.split_once(" [")?;
    let (client, args) = rest.split_once("] ")?;
    let addr = client.split_whitespace().nth(1)?.to_string();
    let words = args
        .split("\" \"")
        .map(|w| w.trim_matches('"').to_string())
        .collect();
    Some((addr, words))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_follows_the_admission_on_its_connection() {
    let master = OwnRedis::start();
    let _replica = master.start_replica();
    let env = TestEnv::on_redis(&master.url()).await;
    env.live_voucher(V, 10).await;
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &master.port.to_string(), "monitor"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(monitor.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap().trim(), "OK");
    master.cli(&["script", "flush"]);
    let out = buy(&env, "1", &[]);
    assert_eq!(json(&out)["replicas_acked"], 1, "{out:?}");
    // A marker after which nothing of the buy can come.
    let marker = format!("{}:end-of-buy", env.prefix);
    master.cli(&["exists", &marker]);
    let mut seen = Vec::new();
    for line in lines {
        let line = line.unwrap();
        if line.contains(&marker) {
            break;
        }
        seen.extend(monitor_line(&line));
    }
    monitor.kill().ok();
    monitor.wait().ok();
    let sha = seckill::store::scripts::ADMISSION.get_hash().to_string();
    let text = || format!("{seen:#?}");
    let at = seen
        .iter()
        .position(|(_, w)| w[0].eq_ignore_ascii_case("evalsha") && w[1] == sha)
        .unwrap_or_else(|| panic!("no admission in {}", text()));
    let client = &seen[at].0;
    // Commands a script runs show as from "lua". The server had no script:
    // the first pipeline met NOSCRIPT, the script was loaded and the pipeline
    // sent again. Each EVALSHA is followed by its WAIT on the same client.
    let sent: Vec<String> = seen[at..]
        .iter()
        .filter(|(addr, _)| addr != "lua")
        .map(|(addr, w)| {
            assert_eq!(addr, client, "{}", text());
            w[..2].join(" ").to_uppercase()
        })
        .collect();
    let evalsha = format!("EVALSHA {}", sha.to_uppercase());
    assert_eq!(
        sent,
        [&evalsha, "WAIT 1", "SCRIPT LOAD", &evalsha, "WAIT 1"],
        "{}",
        text()
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_cut_off_by_a_reconnect_never_counts_a_replica_without_the_admission() {
    let cluster = OwnCluster::start();
    let env = TestEnv::on_redis(&cluster.url()).await;
    env.live_voucher(V, 10).await;
    let keys = VoucherKeys::new(&env.prefix, V).unwrap();
    let master = cluster.master_of(&keys.stock());
    let replica = cluster.replica_of(master);
    // Loaded beforehand, so the WAIT cut off below is the admission's.
    let mut redis = env.redis().await;
    seckill::store::scripts::ADMISSION
        .load_async(&mut redis)
        .await
        .unwrap();
    cluster.signal(replica, "-STOP");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_seckill"));
    cmd.envs(env.store_env())
        .env_remove("SECKILL_NODE_ID")
        .env_remove("RUST_LOG")
        .args([
            "buy",
            "--voucher",
            "5",
            "--user",
            "1",
            "--wait-replicas",
            "1",
        ])
        .args(["--wait-timeout", "3s", "--format", "json"]);
    let buy = std::thread::spawn(move || cmd.output().unwrap());
    // Its WAIT blocks (the replica acknowledges nothing): cut the
    // connection, as a network reset would. The cluster client reconnects
    // and sends the request again, on a connection that wrote nothing.
    let until = Instant::now() + Duration::from_secs(30);
    let id = loop {
        let list = cluster.cli(master, &["client", "list"]);
        let waiting = list
            .lines()
            .find(|l| l.contains(" flags=b ") && l.contains(" cmd=wait "))
            .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")));
        if let Some(id) = waiting {
            break id.to_string();
        }
        if buy.is_finished() {
            cluster.signal(replica, "-CONT");
            let out = buy.join().unwrap();
            panic!("buy ended before its WAIT was seen: {out:?}");
        }
        assert!(Instant::now() < until, "buy never waited:\n{list}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(
        cluster.cli(master, &["client", "kill", "id", &id]).trim(),
        "1"
    );
    let out = buy.join().unwrap();
    cluster.signal(replica, "-CONT");
    // Whatever it reports, it does not count the frozen replica. (The
    // cluster client resends the whole pipeline: the admission, run again,
    // finds the user a buyer already and the outcome is already_bought.)
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Ok(j) = serde_json::from_str::<serde_json::Value>(&stdout) {
        assert_ne!(
            j["replicas_acked"], 1,
            "a frozen replica was counted as having the admission: {out:?}"
        );
    }
    assert_eq!(env.in_flight(V).await, 1, "one admission, not two");
    env.cleanup().await;
}
