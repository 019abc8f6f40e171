//! What ops teams watch, checked against the real thing: the alert rules
//! pass promtool (syntax and a unit test per alert), and a real Prometheus
//! scraping a real worker and a real `seckill serve` during a sale answers
//! every query of the Grafana dashboard with data.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{fast_worker, free_port, http_agent, within_seconds, TestEnv};
use serde_json::Value;

fn contrib(path: &str) -> String {
    format!("{}/contrib/{path}", env!("CARGO_MANIFEST_DIR"))
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("promtool (Debian's prometheus package; scripts/services.sh installs it)");
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    promtool(&["check", "rules", &contrib("prometheus/alerts.yml")]);
    promtool(&["check", "config", &contrib("prometheus/prometheus.yml")]);
    promtool(&["test", "rules", &contrib("prometheus/alerts.test.yml")]);
}

/// A process of the test's, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

fn get_json(url: &str) -> Option<Value> {
    let mut r = http_agent().get(url).call().ok()?;
    serde_json::from_str(&r.body_mut().read_to_string().ok()?).ok()
}

fn answers(url: &str) -> bool {
    http_agent()
        .get(url)
        .call()
        .is_ok_and(|r| r.status() == 200)
}

/// An instant query's result vector.
fn query(prometheus: u16, expr: &str) -> Vec<Value> {
    let mut url =
        url::Url::parse(&format!("http://127.0.0.1:{prometheus}/api/v1/query")).expect("a URL");
    url.query_pairs_mut().append_pair("query", expr);
    let answer = get_json(url.as_str()).unwrap_or_default();
    assert_eq!(answer["status"], "success", "{expr}: {answer}");
    answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn start_prometheus(dir: &Path, port: u16, worker: u16, serve: u16) -> Running {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: ['{rules}']\n\
             scrape_configs:\n\
             - job_name: seckill-worker\n  static_configs: [{{targets: ['127.0.0.1:{worker}']}}]\n\
             - job_name: seckill-serve\n  static_configs: [{{targets: ['127.0.0.1:{serve}']}}]\n",
            rules = contrib("prometheus/alerts.yml")
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    Running(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian's prometheus package)"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus_scraping_a_sale() {
    let env = TestEnv::new().await;
    // Unpaid orders are cancelled after a second: lateness, releases and
    // promotions from the waitlist happen during the test.
    env.add_voucher_paying_within(1, 10, -60_000, 3_600_000, 1_000)
        .await;
    env.preload(1).await;
    let (worker_port, serve_port, prometheus_port) = (free_port(), free_port(), free_port());
    let metrics_addr = format!("127.0.0.1:{worker_port}");
    let _worker = env.spawn_worker(&fast_worker(&["--metrics-addr", &metrics_addr]));
    let serve = Running(
        Command::new(assert_cmd::cargo::cargo_bin("seckill"))
            .args(["serve", "--listen", &format!("127.0.0.1:{serve_port}")])
            .envs(env.store_env())
            .env("NO_COLOR", "1")
            .env_remove("SECKILL_NODE_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let serve_url = format!("http://127.0.0.1:{serve_port}");
    within_seconds(20, "serve answers", || {
        answers(&format!("{serve_url}/healthz"))
    });
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("prometheus-{}", env.prefix));
    let _prometheus = start_prometheus(&dir, prometheus_port, worker_port, serve_port);
    within_seconds(30, "Prometheus scrapes both", || {
        answers(&format!("http://127.0.0.1:{prometheus_port}/-/ready"))
            && query(prometheus_port, "up == 1").len() == 2
    });

    // The sale: 30 buyers for 10 units, over HTTP, in a few waves so that
    // rates span several scrapes.
    for wave in 0..3u64 {
        for user in 1..=10u64 {
            let body = serde_json::json!({ "user": wave * 10 + user });
            let r = http_agent()
                .post(&format!("{serve_url}/v1/vouchers/1/purchases"))
                .header("content-type", "application/json")
                .send(body.to_string());
            assert!(r.is_ok(), "{r:?}");
        }
        std::thread::sleep(Duration::from_millis(1500));
    }
    // Deadlines pass (1 s) and units go to the waitlist; then give
    // Prometheus a few more scrapes.
    within_seconds(30, "orders cancelled at their deadline", || {
        !query(prometheus_port, "seckill_orders_cancelled_total > 0").is_empty()
    });
    std::thread::sleep(Duration::from_secs(3));

    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(contrib("grafana/seckill.json")).unwrap())
            .unwrap();
    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut empty = Vec::new();
    let mut asked = 0;
    for panel in &panels {
        for target in panel["targets"].as_array().cloned().unwrap_or_default() {
            // The dashboard's one variable, as Grafana fills it for "All".
            let expr = target["expr"]
                .as_str()
                .unwrap_or_default()
                .replace("$voucher", ".+");
            asked += 1;
            if query(prometheus_port, &expr).is_empty() {
                empty.push(format!("{}: {expr}", panel["title"]));
            }
        }
    }
    assert!(asked >= 20, "{asked} queries");
    assert_eq!(empty, Vec::<String>::new(), "queries without data");

    // The rules loaded and evaluate without error.
    let rules =
        get_json(&format!("http://127.0.0.1:{prometheus_port}/api/v1/rules")).unwrap_or_default();
    let all: Vec<&Value> = rules["data"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(all.len(), 16, "{rules}");
    for rule in &all {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    // The sale went as a sale goes: nothing fires.
    let firing: Vec<&&Value> = all.iter().filter(|r| r["state"] == "firing").collect();
    assert!(firing.is_empty(), "{firing:?}");
    drop(serve);
    std::fs::remove_dir_all(&dir).ok();
    env.cleanup().await;
}
