//! The operator's surface: `seckill status`, the metrics endpoint, JSON that
//! parses with the documented fields, no escape codes off a terminal, and
//! help text that stays what the book and man pages say.

mod common;

use std::time::Duration;

use common::{json, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_both_stores_side_by_side() {
    let env = TestEnv::new().await;
    env.live_voucher_paying_within(1, 10, 60_000).await;
    env.add_voucher(2, 5, 3_600_000, 7_200_000).await;
    env.admit_users(1, 12, 0).await;
    let out = env
        .cmd()
        .args(["status", "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let j = json(&out);
    let v1 = &j[0];
    assert_eq!(v1["id"], 1);
    assert_eq!(v1["redis_stock"], 0);
    assert_eq!(v1["stock"], 10, "MySQL has not seen the orders yet");
    assert_eq!(v1["undelivered"], 10);
    assert_eq!(v1["waitlist"], 2);
    assert_eq!(v1["gate_loaded"], true);
    assert_eq!(j[1]["gate_loaded"], false);
    // The worker's summary on stdout is JSON too.
    let worker = env
        .cmd()
        .args([
            "worker",
            "--until-idle",
            "--block",
            "100ms",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(worker.status.success());
    let w = json(&worker);
    assert_eq!(w["persisted"], 10);
    for field in [
        "consumer",
        "elapsed_ms",
        "duplicates",
        "dead_lettered",
        "batches",
        "reclaimed",
        "lock_denied",
        "lock_lost",
        "cancelled",
        "released",
        "promoted",
        "max_lateness_ms",
    ] {
        assert!(!w[field].is_null(), "worker summary lacks {field}");
    }
    let order = env.orders(1).await[0].0.to_string();
    let paid = json(
        &env.cmd()
            .args(["pay", "--order", &order, "--format", "json"])
            .output()
            .unwrap(),
    );
    assert_eq!(paid["outcome"], "paid");
    assert_eq!(paid["order_id"], order);
    let j = json(
        &env.cmd()
            .args(["status", "--format", "json", "--voucher", "1"])
            .output()
            .unwrap(),
    );
    assert_eq!(j.as_array().unwrap().len(), 1);
    assert_eq!(j[0]["stock"], 0);
    assert_eq!(j[0]["orders_pending"], 9);
    assert_eq!(j[0]["orders_paid"], 1);
    assert_eq!(j[0]["undelivered"], 0);
    assert!(j[0]["next_deadline_ms"].as_i64().unwrap() > seckill::support::timespec::now_ms());
    let table = env.cmd().args(["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    for column in [
        "redis stock",
        "mysql stock",
        "in flight",
        "waitlist",
        "next deadline",
        "upcoming",
        "live",
    ] {
        assert!(text.contains(column), "{column} missing:\n{text}");
    }
    env.cleanup().await;
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_worker_serves_prometheus_metrics_during_a_drain() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 20_000).await;
    env.admit_users(1, 20_000, 0).await;
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = env.spawn_worker(&["--batch", "64", "--block", "200ms", "--metrics-addr", &addr]);
    env.wait_orders(1, 1_000, Duration::from_secs(60)).await;
    let during = common::scrape_metrics(port).await;
    assert!(during.starts_with("HTTP/1.1 200 OK"), "{during}");
    assert!(during.contains("# TYPE seckill_batch_duration_seconds histogram"));
    assert!(
        metric(&during, "seckill_orders_persisted_total").unwrap() > 0.0,
        "{during}"
    );
    assert!(
        during.contains("seckill_stream_lag{voucher=\"1\"}"),
        "{during}"
    );
    assert!(during.contains("seckill_stream_pending{voucher=\"1\"}"));
    for name in [
        "seckill_dead_lettered_total",
        "seckill_units_released_total",
        "seckill_promotions_total",
        "seckill_lock_lost_total",
        "seckill_batch_duration_seconds_count",
    ] {
        assert!(metric(&during, name).is_some(), "{name} missing");
    }
    env.wait_drained(1, Duration::from_secs(120)).await;
    // The counters move just after a batch's finish acknowledged it.
    let counted = std::time::Instant::now();
    let mut after = common::scrape_metrics(port).await;
    while metric(&after, "seckill_orders_persisted_total") != Some(20_000.0)
        && counted.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
        after = common::scrape_metrics(port).await;
    }
    assert_eq!(
        metric(&after, "seckill_orders_persisted_total"),
        Some(20_000.0)
    );
    assert_eq!(
        metric(&after, "seckill_units_persisted_total"),
        Some(20_000.0),
        "one unit each"
    );
    assert!(after.contains("seckill_stream_lag{voucher=\"1\"} 0"));
    w.signal("TERM");
    w.expect_success(Duration::from_secs(20));
    env.cleanup().await;
}

/// Whether `text` holds a colour or style (SGR) sequence: ESC [ <digits;…> m.
/// Cursor movement (a refresh clearing the screen) is not colour.
fn has_colour(text: &str) -> bool {
    text.split('\x1b').skip(1).any(|rest| {
        rest.strip_prefix('[').is_some_and(|r| {
            let params = r
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == ';')
                .count();
            r[params..].starts_with('m')
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_prints_escape_codes_off_a_terminal_or_with_no_color() {
    let env = TestEnv::new().await;
    env.live_voucher(1, 5).await;
    env.admit_users(1, 3, 0).await;
    // Each command, and whether it must colour on a terminal without NO_COLOR
    // (help, and an error line): those show that the terminal runs below
    // would see colour if NO_COLOR were ignored.
    let cases: Vec<(Vec<&str>, bool)> = vec![
        (vec!["status"], false),
        (vec!["voucher", "list"], false),
        (vec!["pending"], false),
        (vec!["pending", "--voucher", "1"], false),
        (vec!["waitlist", "--voucher", "1"], false),
        (vec!["reconcile", "--dry-run"], false),
        (vec!["buy", "--voucher", "1", "--user", "99"], false),
        (vec!["buy", "--voucher", "x", "--user", "99"], false),
        (
            vec![
                "bench",
                "--voucher",
                "1",
                "--users",
                "10",
                "--attempts",
                "10",
            ],
            false,
        ),
        (vec!["worker", "--batch", "0"], true),
        (vec!["--help"], true),
    ];
    for (args, colours) in &cases {
        // Off a terminal: no escape code of any kind, NO_COLOR or not.
        for no_color in [true, false] {
            let mut cmd = env.cmd();
            if !no_color {
                cmd.env_remove("NO_COLOR");
            }
            let out = cmd.args(args).output().unwrap();
            for stream in [&out.stdout, &out.stderr] {
                assert!(
                    !stream.contains(&0x1b),
                    "{args:?} printed an escape code off a terminal (NO_COLOR {no_color}): {}",
                    String::from_utf8_lossy(stream)
                );
            }
        }
        // On a terminal: colour only without NO_COLOR.
        let (_, plain) = env.on_a_terminal(args, true, None);
        assert!(
            !has_colour(&plain),
            "{args:?} coloured a terminal although NO_COLOR is set: {plain:?}"
        );
        let (_, coloured) = env.on_a_terminal(args, false, None);
        if *colours {
            assert!(
                has_colour(&coloured),
                "{args:?} shows no colour on a terminal without NO_COLOR: {coloured:?}"
            );
        }
    }
    env.cleanup().await;
}

#[test]
fn help_text_matches_the_snapshots() {
    // Every command's --help, as a person reads it (non-terminal width 100).
    let commands: &[&[&str]] = &[
        &[],
        &["init"],
        &["status"],
        &["voucher", "add"],
        &["voucher", "list"],
        &["voucher", "update"],
        &["token", "issue"],
        &["preload"],
        &["buy"],
        &["bench"],
        &["worker"],
        &["serve"],
        &["pending"],
        &["pay"],
        &["order", "show"],
        &["waitlist"],
        &["reconcile"],
    ];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some();
    let mut stale = Vec::new();
    for args in commands {
        let mut cmd = assert_cmd::Command::cargo_bin("seckill").unwrap();
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SECKILL_")) {
            cmd.env_remove(k);
        }
        let out = cmd.args(*args).arg("--help").output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let name = if args.is_empty() {
            "seckill".to_string()
        } else {
            format!("seckill-{}", args.join("-"))
        };
        let path = dir.join(format!("{name}.help.txt"));
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &out.stdout).unwrap();
        } else if std::fs::read(&path).ok().as_deref() != Some(out.stdout.as_slice()) {
            stale.push(name);
        }
    }
    assert!(
        stale.is_empty(),
        "help changed for {stale:?}: review and run UPDATE_SNAPSHOTS=1 cargo test --test operator"
    );
}

#[test]
fn usage_errors_are_one_line_for_every_command() {
    for args in [
        vec!["--bogus"],
        vec!["status", "--voucher", "zero"],
        vec!["worker", "--batch", "many"],
        vec!["pending", "--limit", "-1"],
        vec!["pay"],
        vec!["order", "show"],
        vec!["waitlist"],
        vec!["reconcile", "--attempts", "x"],
    ] {
        let out = assert_cmd::Command::cargo_bin("seckill")
            .unwrap()
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
    }
}

/// Issue 33, item 1: `status --watch` rides out a restart of its Redis: it
/// says what failed and shows the table again once the server answers.
/// Seen failing: the first read on the broken connection ended the watch
/// with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_rides_out_a_redis_restart() {
    let redis = common::own_redis::OwnRedis::start();
    let env = TestEnv::on_redis(&redis.url()).await;
    env.live_voucher(1, 10).await;
    redis.snapshot();
    // A first read that fails is an error, watching or not: a typo does
    // not wait forever.
    let typo = std::process::Command::new("timeout")
        .arg("20")
        .arg(assert_cmd::cargo::cargo_bin("seckill"))
        .args(["status", "--watch", "200ms", "--voucher", "999"])
        .envs(env.store_env())
        .output()
        .expect("status --watch");
    assert_eq!(typo.status.code(), Some(1), "{typo:?}");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (out, err) = (
        dir.join(format!("status-watch-{}.out", env.prefix)),
        dir.join(format!("status-watch-{}.err", env.prefix)),
    );
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("seckill"))
        .args(["status", "--watch", "200ms", "--format", "json"])
        .envs(env.store_env())
        .stdout(std::fs::File::create(&out).expect("out"))
        .stderr(std::fs::File::create(&err).expect("err"))
        .spawn()
        .expect("status --watch");
    // Each refresh prints one JSON array, its last line "]".
    let shown = || {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == "]")
            .count()
    };
    let wait_for = |n: usize, child: &mut std::process::Child| {
        let start = std::time::Instant::now();
        while shown() < n {
            assert!(
                child.try_wait().expect("wait").is_none(),
                "the watch ended: {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
            assert!(start.elapsed() < Duration::from_secs(20), "{n} refreshes");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(1, &mut child);
    redis.crash_and_restart();
    let before = shown();
    wait_for(before + 2, &mut child);
    child.kill().ok();
    child.wait().ok();
    let said = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(said.contains("looking again in"), "{said}");
    std::fs::remove_file(&out).ok();
    std::fs::remove_file(&err).ok();
    env.cleanup().await;
}
