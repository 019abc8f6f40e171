//! A `seckill serve` process for tests: started with the test's stores on
//! a free port, answering /healthz before the test goes on, its log kept
//! in a file; HTTP requests through ureq, answers as (status, JSON).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{free_port, http_agent, TestEnv};

/// A `seckill serve` of the test's own, killed when dropped.
pub struct Serve {
    pub child: Child,
    pub port: u16,
    pub log: std::path::PathBuf,
}

impl Serve {
    pub fn start(env: &TestEnv, extra: &[&str]) -> Serve {
        Self::start_logging(env, extra, "seckill=info")
    }

    /// With `RUST_LOG` set to `log` (access lines are debug).
    pub fn start_logging(env: &TestEnv, extra: &[&str], rust_log: &str) -> Serve {
        Self::start_with(env, extra, rust_log, &[])
    }

    /// With `vars` in its environment besides.
    pub fn start_with(
        env: &TestEnv,
        extra: &[&str],
        rust_log: &str,
        vars: &[(&str, &str)],
    ) -> Serve {
        Self::start_under(env, &[], extra, rust_log, vars)
    }

    /// Run by `wrapper` (e.g. `prlimit --nofile=256 --`), if not empty.
    pub fn start_under(
        env: &TestEnv,
        wrapper: &[&str],
        extra: &[&str],
        rust_log: &str,
        vars: &[(&str, &str)],
    ) -> Serve {
        Self::start_at(free_port(), env, wrapper, extra, rust_log, vars)
    }

    /// On `port` (a serve started again where its clients know it).
    pub fn start_at(
        port: u16,
        env: &TestEnv,
        wrapper: &[&str],
        extra: &[&str],
        rust_log: &str,
        vars: &[(&str, &str)],
    ) -> Serve {
        let log = std::env::temp_dir().join(format!("seckill-serve-{}-{port}.log", env.prefix));
        let file = std::fs::File::create(&log).unwrap();
        let bin = assert_cmd::cargo::cargo_bin("seckill");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .envs(env.store_env())
            .env("NO_COLOR", "1")
            .env("RUST_LOG", rust_log)
            .envs(vars.iter().copied())
            .env_remove("SECKILL_NODE_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        let serve = Serve { child, port, log };
        let start = Instant::now();
        while serve.get("/healthz", None).0 != 200 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "serve never answered:\n{}",
                serve.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        serve
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Status, Retry-After and body (JSON if it is, else a string).
    pub fn answer(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, Value) {
        match r {
            Ok(mut r) => {
                let status = r.status().as_u16();
                let header = |name: &str| {
                    r.headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                };
                let retry = header("retry-after");
                let request_id = header("x-request-id");
                let problem = header("content-type").as_deref() == Some("application/problem+json");
                let text = r.body_mut().read_to_string().unwrap_or_default();
                // Every answer carries its request's id, and every
                // problem names it and its code (src/http/error.rs).
                assert!(
                    request_id.is_some(),
                    "{status} without X-Request-Id: {text}"
                );
                let mut body = serde_json::from_str(&text).unwrap_or(Value::String(text));
                if problem {
                    assert_problem(status, &body, request_id.as_deref());
                } else if status >= 400 {
                    // Not a problem: an outcome (a purchase's, a
                    // payment's), /readyz's report, or /healthz's text.
                    let outcome = body.get("outcome").is_some() || body.get("ready").is_some();
                    let stuck = body.as_str().is_some_and(|t| t.starts_with("stuck"));
                    assert!(
                        outcome || stuck,
                        "{status} neither an outcome nor a problem: {body}"
                    );
                }
                if let (Some(retry), Value::Object(m)) = (retry, &mut body) {
                    m.insert("retry_after".into(), json!(retry));
                }
                (status, body)
            }
            Err(e) => (0, json!(e.to_string())),
        }
    }

    /// A GET with `headers` besides the key: status, X-Request-Id, body.
    pub fn get_with(
        &self,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, String, Value) {
        let mut req = http_agent().get(&self.url(path));
        if let Some(k) = key {
            req = req.header("authorization", &format!("Bearer {k}"));
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let r = req.call();
        let id = r
            .as_ref()
            .ok()
            .and_then(|r| r.headers().get("x-request-id"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let (status, body) = Self::answer(r);
        (status, id, body)
    }

    pub fn get(&self, path: &str, key: Option<&str>) -> (u16, Value) {
        let (status, _, body) = self.get_with(path, key, &[]);
        (status, body)
    }

    pub fn post(&self, path: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
        self.post_raw(path, "application/json", &body.to_string(), key)
    }

    pub fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: &str,
        key: Option<&str>,
    ) -> (u16, Value) {
        let mut req = http_agent()
            .post(&self.url(path))
            .header("content-type", content_type);
        if let Some(k) = key {
            req = req.header("authorization", &format!("Bearer {k}"));
        }
        Self::answer(req.send(body))
    }

    /// Where `user` stands (`GET .../purchases/{user}`): the 200's body.
    pub fn standing(&self, voucher: u64, user: u64) -> Value {
        let (status, body) = self.get(&format!("/v1/vouchers/{voucher}/purchases/{user}"), None);
        assert_eq!(status, 200, "{body}");
        body
    }

    pub fn buy(&self, voucher: u64, user: Value) -> (u16, Value) {
        self.post(
            &format!("/v1/vouchers/{voucher}/purchases"),
            &json!({ "user": user }),
            None,
        )
    }

    /// A POST whose body stops after its first 5 bytes: its status and
    /// body, as raw text.
    pub fn post_slowly(&self, path: &str, body: &Value, key: Option<&str>) -> (u16, String) {
        use std::io::{Read, Write};
        let body = body.to_string();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&body.as_bytes()[..5]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut answer = Vec::new();
        let mut chunk = [0u8; 4096];
        // Connection: close: the answer ends with the connection.
        while let Ok(n) = s.read(&mut chunk) {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status, text)
    }

    pub fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate();
        self.wait_for_exit()
    }

    /// SIGTERM, as systemd stops it.
    pub fn terminate(&self) {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
    }

    /// Its exit status, once it exited (within 30 s).
    pub fn wait_for_exit(&mut self) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "serve did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        std::fs::remove_file(&self.log).ok();
    }
}

/// An RFC 9457 problem as serve answers one: its code's fields, the
/// status, a bounded one-line detail, and the answer's request id.
pub fn assert_problem(status: u16, body: &Value, request_id: Option<&str>) {
    let code = body["code"].as_str().unwrap_or_default();
    assert!(
        !code.is_empty(),
        "{status}: a problem without a code: {body}"
    );
    assert_eq!(
        body["type"],
        format!("urn:seckill:problem:{code}"),
        "{body}"
    );
    assert_eq!(body["status"], status, "{body}");
    assert!(body["title"].is_string(), "{body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        !detail.is_empty() && detail.chars().count() <= 201 && !detail.contains('\n'),
        "{body}"
    );
    assert_eq!(body["request_id"].as_str(), request_id, "{body}");
}
