//! A MariaDB of one test's own (scripts/services.sh with its own port, data
//! folder and options), for tests that stop the server or need settings the
//! shared server must not have.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::TestEnv;

pub struct OwnMysql {
    dir: PathBuf,
    pub port: u16,
    options: String,
}

impl OwnMysql {
    pub fn services(&self, action: &str) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/services.sh");
        let out = Command::new("bash")
            .arg(script)
            .args([action, "mysql"])
            .env("SECKILL_SERVICES_DIR", &self.dir)
            .env("SECKILL_MYSQL_PORT", self.port.to_string())
            .env("SECKILL_MYSQL_OPTIONS", &self.options)
            .output()
            .expect("run scripts/services.sh");
        assert!(
            out.status.success(),
            "services.sh {action} mysql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A fresh server with `options` (my.cnf lines, newline-separated) added.
    pub fn start(options: &str) -> OwnMysql {
        let port = super::free_port();
        // Under target/, not /tmp: CI's /tmp may be small or a tmpfs.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("seckill-mysql-{}-{port}", std::process::id()));
        // A test's server holds a few thousand rows: a small redo log and
        // pool keep several of them side by side cheap in disk and memory.
        let options = format!("innodb_log_file_size=16M\ninnodb_buffer_pool_size=64M\n{options}");
        let m = OwnMysql { dir, port, options };
        m.services("up");
        m
    }
}

impl OwnMysql {
    /// Runs `sql` as root (over the server's socket), failing with its error.
    pub fn root_sql(&self, sql: &str) {
        let out = Command::new("mariadb")
            .args(["--no-defaults", "--protocol=socket", "-uroot"])
            .arg(format!(
                "--socket={}",
                self.dir.join("mysql/mysqld.sock").display()
            ))
            .args(["-e", sql])
            .output()
            .expect("run mariadb");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The URL of database `db` on this server, as the test's user.
    pub fn url_for(&self, db: &str) -> String {
        format!("mysql://seckill:seckill@127.0.0.1:{}/{db}", self.port)
    }

    /// A test environment whose MySQL is this server (database migrated).
    pub async fn test_env(&self) -> TestEnv {
        let mut env = TestEnv::uninitialised().await;
        env.cfg.mysql_url = format!(
            "mysql://seckill:seckill@127.0.0.1:{}/{}",
            self.port, env.db_name
        );
        env.create_database().await;
        env
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
