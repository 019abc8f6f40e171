//! A single Redis of one test's own that can lose its last writes: no AOF,
//! snapshots only when the test says (`SAVE`), so a kill -9 and a restart
//! bring back exactly the last snapshot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct OwnRedis {
    dir: PathBuf,
    pub port: u16,
    password: Option<String>,
}

impl OwnRedis {
    pub fn start() -> OwnRedis {
        let port = super::free_port();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("seckill-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the Redis folder");
        let r = OwnRedis {
            dir,
            port,
            password: None,
        };
        r.launch();
        r
    }

    fn launch(&self) {
        let status = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--appendonly", "no", "--save", "", "--daemonize", "yes"])
            .arg("--pidfile")
            .arg(self.dir.join("redis.pid"))
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .status()
            .expect("redis-server");
        assert!(status.success());
        for _ in 0..100 {
            if self.cli(&["ping"]).trim() == "PONG" {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("own Redis on port {} did not answer", self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Makes the server require `password` (the `default` user's).
    pub fn require_password(&mut self, password: &str) {
        assert_eq!(
            self.cli(&["config", "set", "requirepass", password]).trim(),
            "OK"
        );
        self.password = Some(password.to_string());
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let mut auth = Vec::new();
        if let Some(p) = &self.password {
            auth = vec!["--no-auth-warning".to_string(), "-a".to_string(), p.clone()];
        }
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(&auth)
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Writes the snapshot a restart will come back to.
    pub fn snapshot(&self) {
        assert_eq!(self.cli(&["save"]).trim(), "OK");
    }

    /// A clean SHUTDOWN (no save: the last snapshot stays); `start_again`
    /// starts it from that snapshot, as an operator's restart.
    pub fn shut_down(&self) {
        self.cli(&["shutdown", "nosave"]);
        for _ in 0..100 {
            if self.cli(&["ping"]).trim() != "PONG" {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn start_again(&self) {
        self.launch();
    }

    /// kill -9, then a start with no data at all, as a failover to a
    /// replica that had synced nothing: every key is lost.
    pub fn crash_and_restart_empty(&self) {
        self.kill9();
        let snapshot = self.dir.join("dump.rdb");
        if snapshot.exists() {
            std::fs::remove_file(&snapshot).expect("the snapshot removed");
        }
        self.launch();
    }

    /// kill -9, then a start from the last snapshot: every write since is lost.
    pub fn crash_and_restart(&self) {
        self.kill9();
        self.launch();
    }

    fn kill9(&self) {
        let pid = std::fs::read_to_string(self.dir.join("redis.pid")).expect("pid file");
        let status = Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .expect("kill");
        assert!(status.success());
        for _ in 0..100 {
            if self.cli(&["ping"]).trim() != "PONG" {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A replica of an [`OwnRedis`], of the test's own: it can be frozen
/// (SIGSTOP: still connected, acknowledging nothing) and thawed.
pub struct OwnReplica {
    dir: PathBuf,
    pub port: u16,
}

impl OwnRedis {
    /// Starts a replica of this server and waits until the server counts it
    /// as an online replica that has caught up.
    pub fn start_replica(&self) -> OwnReplica {
        let port = super::free_port();
        let dir = self.dir.join(format!("replica-{port}"));
        std::fs::create_dir_all(&dir).expect("the replica's folder");
        let status = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--replicaof", "127.0.0.1", &self.port.to_string()])
            .arg("--dir")
            .arg(&dir)
            .args(["--appendonly", "no", "--save", "", "--daemonize", "yes"])
            .arg("--pidfile")
            .arg(dir.join("redis.pid"))
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .status()
            .expect("redis-server");
        assert!(status.success());
        let replica = OwnReplica { dir, port };
        for _ in 0..200 {
            let info = self.cli(&["info", "replication"]);
            if info.contains("connected_slaves:1") && info.contains("state=online") {
                return replica;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the replica on port {port} never came online:\n{}",
            self.cli(&["info", "replication"])
        );
    }
}

impl OwnReplica {
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// SIGSTOP (`freeze(true)`) or SIGCONT of the replica's process.
    pub fn freeze(&self, frozen: bool) {
        assert!(self.signal(if frozen { "-STOP" } else { "-CONT" }));
    }

    fn signal(&self, signal: &str) -> bool {
        std::fs::read_to_string(self.dir.join("redis.pid")).is_ok_and(|pid| {
            Command::new("kill")
                .args([signal, pid.trim()])
                .status()
                .is_ok_and(|s| s.success())
        })
    }
}

impl Drop for OwnReplica {
    fn drop(&mut self) {
        // A frozen server cannot act on SHUTDOWN.
        self.signal("-CONT");
        self.cli(&["shutdown", "nosave"]);
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.cli(&["shutdown", "nosave"]);
        std::fs::remove_dir_all(&self.dir).ok();
    }
}
