//! MySQL stopped for a few seconds in the middle of a drain: the worker
//! waits, retries, resumes, and loses nothing. The outage is real — a MariaDB
//! instance of this test's own (scripts/services.sh with its own port and
//! data folder) is shut down and started again — so the shared server the
//! other tests use is never touched.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::invariants::assert_invariants;
use common::TestEnv;

struct OwnMysql {
    dir: PathBuf,
    port: u16,
}

impl OwnMysql {
    fn services(&self, action: &str) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/services.sh");
        let out = Command::new("bash")
            .arg(script)
            .args([action, "mysql"])
            .env("SECKILL_SERVICES_DIR", &self.dir)
            .env("SECKILL_MYSQL_PORT", self.port.to_string())
            .output()
            .expect("run scripts/services.sh");
        assert!(
            out.status.success(),
            "services.sh {action} mysql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start() -> OwnMysql {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let dir =
            std::env::temp_dir().join(format!("seckill-outage-{}-{port}", std::process::id()));
        let m = OwnMysql { dir, port };
        m.services("up");
        m
    }
}

impl Drop for OwnMysql {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/services.sh");
        Command::new("bash")
            .arg(script)
            .args(["down", "mysql"])
            .env("SECKILL_SERVICES_DIR", &self.dir)
            .env("SECKILL_MYSQL_PORT", self.port.to_string())
            .output()
            .ok();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_stopped_mid_drain_then_back_loses_nothing() {
    let mysql = OwnMysql::start();
    let mut env = TestEnv::uninitialised().await;
    env.cfg.mysql_url = format!(
        "mysql://seckill:seckill@127.0.0.1:{}/{}",
        mysql.port, env.db_name
    );
    {
        let db = seckill::store::db::Db::connect_for_init(&env.cfg)
            .await
            .unwrap();
        let mut conn = db.conn().await.unwrap();
        seckill::store::schema::migrate(&mut conn).await.unwrap();
        drop(conn);
        db.close().await;
    }
    let v = 1;
    env.live_voucher(v, 20_000).await;
    env.admit_users(v, 20_000, 0).await;
    let w = env.spawn_worker(&["--batch", "64", "--claim-idle", "1s", "--block", "200ms"]);
    env.wait_orders(v, 1_000, Duration::from_secs(60)).await;
    mysql.services("down");
    tokio::time::sleep(Duration::from_secs(3)).await;
    mysql.services("up");
    env.wait_drained(v, Duration::from_secs(120)).await;
    w.signal("TERM");
    let log = w.expect_success(Duration::from_secs(30));
    assert!(
        log.contains("retrying"),
        "the worker never noticed the outage:\n{log}"
    );
    assert_eq!(env.order_count(v).await, 20_000);
    let s = assert_invariants(&env, v).await;
    assert_eq!(s.mysql_stock, 0);
    env.cleanup().await;
}
