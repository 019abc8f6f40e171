//! Output into a pipe whose reader has already gone (`seckill status | head
//! -0`): every command ends quietly — its usual exit code (or death by
//! SIGPIPE), nothing on stderr — never a panic with a backtrace, even with
//! RUST_BACKTRACE=1 in the environment.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::TestEnv;

const V: u64 = 1;
/// SIGPIPE's number on Linux.
const SIGPIPE: i32 = 13;

/// Runs the binary with stdout into a pipe whose read end is closed before
/// the process starts, so its first write meets a gone reader.
fn into_closed_pipe(env: &TestEnv, args: &[&str]) -> (Option<i32>, Option<i32>, String) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(args)
        .env("SECKILL_REDIS_URL", &env.cfg.redis_url)
        .env("SECKILL_MYSQL_URL", &env.cfg.mysql_url)
        .env("SECKILL_PREFIX", &env.prefix)
        .env("RUST_BACKTRACE", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("the binary runs");
    (
        out.status.code(),
        out.status.signal(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_ends_quietly_when_its_reader_has_gone() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(V, 3, 60_000).await;
    env.admit_users(V, 5, 0).await;
    let drained = into_closed_pipe(&env, &["worker", "--until-idle", "--block", "100ms"]);
    assert_eq!(drained.0, Some(0), "{}", drained.2);
    let orders = env.orders(V).await;
    let (paid, paid_too, shown) = (
        orders[0].0.to_string(),
        orders[1].0.to_string(),
        orders[2].0.to_string(),
    );
    // A buyer, whoever of the five won a unit (they race for three).
    let buyer = orders[0].1.to_string();
    // A voucher that requires tokens, for `token issue`.
    env.live_voucher_paying_within(2, 3, 60_000).await;
    env.cmd()
        .args(["voucher", "update", "--id", "2", "--require-token"])
        .assert()
        .success();
    // Help and version have one form.
    let mut all: Vec<(Vec<&str>, i32)> = vec![
        (vec!["--help"], 0),
        (vec!["status", "--help"], 0),
        (vec!["worker", "--help"], 0),
        (vec!["--version"], 0),
    ];
    // Every command that prints data, as a table and as JSON.
    let data: Vec<(Vec<&str>, i32)> = vec![
        (vec!["status"], 0),
        (vec!["voucher", "list"], 0),
        (
            vec!["voucher", "update", "--id", "1", "--user-rate", "0"],
            0,
        ),
        (vec!["pending"], 0),
        (vec!["pending", "--voucher", "1"], 0),
        (vec!["pending", "--voucher", "1", "--requeue", "--yes"], 0),
        (vec!["waitlist", "--voucher", "1"], 0),
        (vec!["reconcile", "--dry-run"], 0),
        (vec!["preload", "--voucher", "1"], 0),
        (vec!["init"], 0),
        (vec!["buy", "--voucher", "1", "--user", "77"], 11),
        (vec!["buy", "--voucher", "1", "--user", &buyer], 10),
        (vec!["bench", "--voucher", "1", "--attempts", "20"], 0),
        (vec!["token", "issue", "--voucher", "2", "--user", "5"], 0),
        (vec!["order", "show", &shown], 0),
        (vec!["worker", "--until-idle", "--block", "100ms"], 0),
    ];
    for (args, code) in data {
        let mut json = args.clone();
        json.extend(["--format", "json"]);
        all.push((args, code));
        all.push((json, code));
    }
    // Commands that change something, once per form.
    all.extend([
        (vec!["pay", "--order", &paid], 0),
        (vec!["pay", "--order", &paid_too, "--format", "json"], 0),
        (vec!["voucher", "add", "--id", "3", "--stock", "1"], 0),
        (
            vec![
                "voucher", "add", "--id", "4", "--stock", "1", "--format", "json",
            ],
            0,
        ),
    ]);
    for (args, code) in &all {
        let (exit, signal, stderr) = into_closed_pipe(&env, args);
        let stderr_lines: Vec<&str> = stderr
            .lines()
            // The worker logs its progress on stderr at info level; a
            // warning or an error would still count.
            .filter(|l| !(args[0] == "worker" && l.contains(" INFO ")))
            .collect();
        assert!(
            stderr_lines.is_empty(),
            "seckill {}: wrote to stderr:\n{stderr}",
            args.join(" ")
        );
        assert!(
            exit == Some(*code) || signal == Some(SIGPIPE),
            "seckill {}: exit {exit:?} signal {signal:?}, expected {code}",
            args.join(" ")
        );
    }
    // `status --watch` notices the gone reader and ends (instead of
    // refreshing into the void until Ctrl-C).
    let started = std::time::Instant::now();
    let (exit, signal, stderr) = into_closed_pipe(&env, &["status", "--watch", "100ms"]);
    assert!(exit == Some(0) || signal == Some(SIGPIPE), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(60));
    env.cleanup().await;
}
