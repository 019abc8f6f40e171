//! Real `seckill worker` processes for tests: started with the test's stores,
//! signalled with kill(1) (SIGKILL, SIGTERM, SIGSTOP, SIGCONT), their stderr
//! kept in a file for the failure message and their stdout (the summary
//! printed at exit) in another.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::TestEnv;

pub struct WorkerProc {
    child: Child,
    log: PathBuf,
    out: PathBuf,
    /// Whether the test makes Redis lose writes: otherwise a gate the
    /// worker's guard pauses is a false alarm, and fails the test.
    pauses_expected: bool,
    /// The metrics page's port, once read from the log.
    metrics_port: std::cell::OnceCell<u16>,
}

/// What the gate guard logs when it pauses a gate.
pub const GATE_PAUSED: &str = "admission paused";

impl TestEnv {
    /// `seckill worker <args>` in the background.
    pub fn spawn_worker(&self, args: &[&str]) -> WorkerProc {
        self.spawn_worker_with(args, &[])
    }

    pub fn spawn_worker_with(&self, args: &[&str], env: &[(&str, &str)]) -> WorkerProc {
        let log = std::env::temp_dir().join(format!(
            "seckill-worker-{}-{}.log",
            self.prefix,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let file = std::fs::File::create(&log).expect("worker log file");
        let out = log.with_extension("out");
        let stdout = std::fs::File::create(&out).expect("worker stdout file");
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("seckill"));
        cmd.arg("worker").args(args);
        // A metrics page on a port the system picks, for wait_count.
        if !args.contains(&"--metrics-addr") {
            cmd.args(["--metrics-addr", "127.0.0.1:0"]);
        }
        cmd.envs(self.store_env())
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "seckill=info")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        WorkerProc {
            child: cmd.spawn().expect("spawn seckill worker"),
            log,
            out,
            pauses_expected: false,
            metrics_port: std::cell::OnceCell::new(),
        }
    }
}

impl WorkerProc {
    /// This test makes Redis lose writes: the guard pausing a gate is
    /// what it wants to see, not a false alarm.
    pub fn expect_gate_pauses(&mut self) {
        self.pauses_expected = true;
    }

    /// Fails on a gate paused in a test that loses no writes.
    fn check_no_false_pause(&self, log: &str) {
        assert!(
            self.pauses_expected || !log.contains(GATE_PAUSED),
            "the gate guard paused a gate although this test loses no writes:\n{log}"
        );
    }

    /// The port of the worker's metrics page, from the address it logs
    /// when it has bound it.
    pub fn metrics_port(&self) -> u16 {
        *self.metrics_port.get_or_init(|| self.read_metrics_port())
    }

    fn read_metrics_port(&self) -> u16 {
        const BOUND: &str = "metrics on http://127.0.0.1:";
        self.wait_log(BOUND, Duration::from_secs(30));
        let log = self.log_text();
        let rest = &log[log.find(BOUND).unwrap_or(0) + BOUND.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("no metrics port in the worker's log:\n{log}"))
    }

    /// The worker's counter `seckill_<name>_total` as its metrics page
    /// shows it now (None while the page does not answer).
    pub fn count(&self, name: &str) -> Option<u64> {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port());
        let page = super::http_agent()
            .get(&url)
            .call()
            .ok()?
            .body_mut()
            .read_to_string()
            .ok()?;
        let line = format!("seckill_{name}_total ");
        page.lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    }

    /// Waits until the worker's counter `seckill_<name>_total` reaches
    /// `at_least` (an event counted, whatever the log says of it).
    pub fn wait_count(&self, name: &str, at_least: u64, limit: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let now = self.count(name);
            if now.is_some_and(|n| n >= at_least) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "seckill_{name}_total still {now:?}, not {at_least}, after {limit:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} {} failed", self.pid());
    }

    /// kill -9, then reap.
    pub fn kill9(mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if start.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for a clean exit (status 0), failing with the worker's log.
    pub fn expect_success(mut self, limit: Duration) -> String {
        self.wait_success(limit)
    }

    /// Waits for a clean exit of a worker started with `--format json` and
    /// returns the summary it printed (its counters) and its log.
    pub fn expect_summary(mut self, limit: Duration) -> (serde_json::Value, String) {
        let log = self.wait_success(limit);
        let stdout = std::fs::read_to_string(&self.out).unwrap_or_default();
        let summary = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("worker summary is not JSON ({e}): {stdout:?}\n{log}"));
        (summary, log)
    }

    fn wait_success(&mut self, limit: Duration) -> String {
        let status = self.wait_for(limit);
        let log = self.log_text();
        self.check_no_false_pause(&log);
        match status {
            Some(s) if s.success() => log,
            Some(s) => panic!("worker exited with {s}:\n{log}"),
            None => {
                self.child.kill().ok();
                panic!("worker did not exit within {limit:?}:\n{log}")
            }
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for `needle` in the worker's log (the log shown if it never
    /// comes within `limit`); how long it took.
    pub fn wait_log(&self, needle: &str, limit: Duration) -> Duration {
        let start = std::time::Instant::now();
        while !self.log_text().contains(needle) {
            assert!(
                start.elapsed() < limit,
                "no {needle:?} in the worker's log within {limit:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        start.elapsed()
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        // Never leave a worker behind a failed test.
        if let Ok(None) = self.child.try_wait() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
        if !std::thread::panicking() {
            self.check_no_false_pause(&self.log_text());
        }
        std::fs::remove_file(&self.log).ok();
        std::fs::remove_file(&self.out).ok();
    }
}
