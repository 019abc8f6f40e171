//! A Redis Cluster of one test's own (scripts/services.sh up cluster with its
//! own ports and data folder), for tests that kill its nodes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub struct OwnCluster {
    dir: PathBuf,
    /// The first node's port; the six nodes take it and the five after it.
    pub port: u16,
    /// A folder with ca.pem, server.pem, server.key: the cluster speaks TLS
    /// only.
    tls: Option<PathBuf>,
}

impl OwnCluster {
    pub fn start() -> OwnCluster {
        Self::start_with(None)
    }

    /// A cluster that speaks TLS only (clients, replication, its bus).
    pub fn start_tls(certs: &Path) -> OwnCluster {
        Self::start_with(Some(certs.to_path_buf()))
    }

    fn start_with(tls: Option<PathBuf>) -> OwnCluster {
        let port = free_port_range();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("seckill-cluster-{}-{port}", std::process::id()));
        let c = OwnCluster { dir, port, tls };
        c.services("up");
        c
    }

    fn services_cmd(&self, action: &str) -> Command {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/services.sh");
        let mut cmd = Command::new("bash");
        cmd.arg(script)
            .args([action, "cluster"])
            .env("SECKILL_SERVICES_DIR", &self.dir)
            .env("SECKILL_CLUSTER_PORT", self.port.to_string());
        if let Some(tls) = &self.tls {
            cmd.env("SECKILL_CLUSTER_TLS_DIR", tls);
        }
        cmd
    }

    fn services(&self, action: &str) {
        let out = self
            .services_cmd(action)
            .output()
            .expect("run scripts/services.sh");
        assert!(
            out.status.success(),
            "services.sh {action} cluster: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Its three first nodes (the masters it was created with) as seeds.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        (0..3)
            .map(|i| format!("{scheme}://127.0.0.1:{}/", self.port + i))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn ports(&self) -> Vec<u16> {
        (0..6).map(|i| self.port + i).collect()
    }

    /// `redis-cli -p port args…`, its stdout.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let mut cmd = Command::new("redis-cli");
        if let Some(tls) = &self.tls {
            cmd.arg("--tls").arg("--cacert").arg(tls.join("ca.pem"));
        }
        let out = cmd
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The port of the master serving `key`'s slot now.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot: u16 = self
            .cli(self.port, &["cluster", "keyslot", key])
            .trim()
            .parse()
            .expect("a slot number");
        for line in self.alive_nodes() {
            let f: Vec<&str> = line.split(' ').collect();
            if !f[2].contains("master") {
                continue;
            }
            for range in &f[8..] {
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (lo.parse().unwrap_or(1), hi.parse().unwrap_or(0)),
                    None => (range.parse().unwrap_or(1), range.parse().unwrap_or(0)),
                };
                if (lo..=hi).contains(&slot) {
                    return node_port(f[1]);
                }
            }
        }
        panic!("no master serves slot {slot}");
    }

    /// The replica of the master on `port`. The node asked may not have
    /// heard of the replication yet (gossip): it is asked again for a while.
    pub fn replica_of(&self, port: u16) -> u16 {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let nodes = self.alive_nodes();
            let master_id = nodes
                .iter()
                .map(|l| l.split(' ').collect::<Vec<_>>())
                .find(|f| node_port(f[1]) == port)
                .map(|f| f[0].to_string())
                .expect("the master is known");
            let replica = nodes
                .iter()
                .map(|l| l.split(' ').collect::<Vec<_>>())
                .find(|f| f[3] == master_id)
                .map(|f| node_port(f[1]));
            match replica {
                Some(r) => return r,
                None if std::time::Instant::now() < until => {
                    std::thread::sleep(std::time::Duration::from_millis(100))
                }
                None => panic!(
                    "the master on port {port} has no replica:\n{}",
                    nodes.join("\n")
                ),
            }
        }
    }

    /// Waits until every seed's CLUSTER SLOTS lists the node on `port`, so
    /// that a client's slot map has it whichever seed it asks (right after
    /// the cluster is created, gossip may not have brought it there yet).
    pub fn wait_in_slot_maps(&self, port: u16) {
        let until = Instant::now() + Duration::from_secs(15);
        let wanted = format!("\n{port}\n");
        while !(0..3).all(|i| {
            self.cli(self.port + i, &["cluster", "slots"])
                .contains(&wanted)
        }) {
            assert!(
                Instant::now() < until,
                "the node on {port} is not in every slot map"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn alive_nodes(&self) -> Vec<String> {
        for p in self.ports() {
            let text = self.cli(p, &["cluster", "nodes"]);
            if !text.trim().is_empty() {
                return text
                    .lines()
                    .filter(|l| !l.contains("fail") && !l.contains("noaddr"))
                    .map(str::to_string)
                    .collect();
            }
        }
        panic!("no cluster node answers");
    }

    /// Waits until every node still alive sees the cluster ok and `port`
    /// is a master.
    pub fn wait_master(&self, port: u16, limit: Duration) {
        let start = Instant::now();
        loop {
            let role = self.cli(port, &["role"]);
            let ok = self
                .ports()
                .into_iter()
                .filter(|p| !self.cli(*p, &["ping"]).trim().is_empty())
                .all(|p| {
                    self.cli(p, &["cluster", "info"])
                        .contains("cluster_state:ok")
                });
            if role.starts_with("master") && ok {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "port {port} did not become a master within {limit:?}: {role}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends `signal` (`-STOP`, `-CONT`) to the node on `port`.
    pub fn signal(&self, port: u16, signal: &str) {
        let pidfile = self.dir.join(format!("cluster/{port}/redis.pid"));
        let pid = std::fs::read_to_string(&pidfile).expect("the node's pid file");
        let status = Command::new("kill")
            .args([signal, pid.trim()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// SIGKILL of the node on `port` (no shutdown, no last AOF write).
    pub fn kill9(&self, port: u16) {
        let pidfile = self.dir.join(format!("cluster/{port}/redis.pid"));
        let pid = std::fs::read_to_string(&pidfile).expect("the node's pid file");
        let status = Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

fn node_port(addr: &str) -> u16 {
    addr.split('@')
        .next()
        .and_then(|hp| hp.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .expect("a node address host:port@bus")
}

/// Six consecutive free ports whose cluster bus ports (+10000) are free too.
fn free_port_range() -> u16 {
    let mut seed = std::process::id() as u64 * 7919
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64)
            .unwrap_or(0);
    for _ in 0..200 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Nodes on 18000-21995, their buses 10000 above (28000-31995):
        // both below Linux's ephemeral range (32768-60999), where another
        // test's outgoing connection could take a port between this check
        // and the server's bind (seen: a bus port 40004 "already in use").
        let base = 18_000 + ((seed >> 33) % 400) as u16 * 10;
        let all_free = (0..6).all(|i| {
            [base + i, base + i + 10_000]
                .iter()
                .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        });
        if all_free {
            return base;
        }
    }
    panic!("no six free ports with free bus ports");
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        self.services_cmd("down").output().ok();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

impl OwnCluster {
    /// Cuts the replica on `port` off from its master for good (it can no
    /// longer authenticate): what the master writes from now on, the
    /// replica never gets — a failover then loses it.
    pub fn detach_replica(&self, port: u16) {
        assert_eq!(
            self.cli(port, &["config", "set", "masterauth", "not-the-password"])
                .trim(),
            "OK"
        );
        self.cli(port, &["client", "kill", "type", "master"]);
        let start = Instant::now();
        while !self
            .cli(port, &["info", "replication"])
            .contains("master_link_status:down")
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the replica stays linked"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
